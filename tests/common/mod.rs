//! Test harness: starts the real `spillway` binary and real upstream processes on
//! 127.0.0.1 with port 0, talks to them over loopback, polls with deadlines.
#![allow(dead_code)]

pub(crate) mod h2raw;
pub(crate) mod stub;

use parking_lot::Mutex;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use serde_json::Value;

pub(crate) mod inproc;

/// Path of the spillway binary under test.
pub(crate) fn exe() -> &'static str {
    env!("CARGO_BIN_EXE_spillway")
}

/// A running child process whose stderr is captured line by line.
pub(crate) struct Proc {
    pub child: Child,
    pub log: Arc<Mutex<Vec<String>>>,
    lines: mpsc::Receiver<String>,
}

impl Proc {
    pub(crate) fn spawn(args: &[&str]) -> Proc {
        Proc::spawn_env(args, &[])
    }

    /// [`Proc::spawn`] with extra environment variables (e.g. AWS credentials for the
    /// emulator).
    pub(crate) fn spawn_env(args: &[&str], env: &[(String, String)]) -> Proc {
        let mut cmd = Command::new(exe());
        cmd.args(args).envs(env.iter().map(|(k, v)| (k, v)));
        Proc::spawn_command(cmd)
    }

    /// Run `cmd` (e.g. the gateway under `sh -c 'ulimit …; exec …'`) with the same
    /// capture as [`Proc::spawn`].
    pub(crate) fn spawn_command(mut cmd: Command) -> Proc {
        let mut child = cmd
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn spillway");
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        let log2 = Arc::clone(&log);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                log2.lock().push(line.clone());
                let _ = tx.send(line);
            }
        });
        let mut stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            let mut sink = Vec::new();
            let _ = stdout.read_to_end(&mut sink);
        });
        Proc {
            child,
            log,
            lines: rx,
        }
    }

    /// Wait for a stderr line containing `needle`; returns it.
    pub(crate) fn wait_line(&self, needle: &str, within: Duration) -> String {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return line,
                Ok(_) => {}
                Err(_) => panic!(
                    "no line containing {needle:?} within {within:?}; log:\n{}",
                    self.log.lock().join("\n")
                ),
            }
        }
    }

    pub(crate) fn log_text(&self) -> String {
        self.log.lock().join("\n")
    }

    pub(crate) fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{sig}"), &self.child.id().to_string()])
            .status()
            .expect("kill")
            .success();
        assert!(ok, "kill -{sig} failed");
    }

    /// Wait for the process to exit; returns its exit code.
    pub(crate) fn wait_exit(&mut self, within: Duration) -> Option<i32> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status.code();
            }
            assert!(
                Instant::now() < deadline,
                "process did not exit within {within:?}:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Proc {
    /// SIGTERM first so the gateway stops its own children, SIGKILL if it lingers.
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = Command::new("kill")
                .args(["-TERM", &self.child.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(10);
            while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A gateway started from a YAML config (listen and admin on port 0).
pub(crate) struct Gateway {
    pub proc: Proc,
    pub proxy: SocketAddr,
    pub admin: SocketAddr,
    _dir: tempfile::TempDir,
}

fn field(line: &str, key: &str) -> SocketAddr {
    let start = line
        .find(&format!("{key}="))
        .unwrap_or_else(|| panic!("{key}= in {line}"))
        + key.len()
        + 1;
    let rest = &line[start..];
    let end = rest.find(' ').unwrap_or(rest.len());
    rest[..end]
        .parse()
        .unwrap_or_else(|e| panic!("{e}: {line}"))
}

impl Gateway {
    /// Start `spillway serve` with `yaml` (which must bind 127.0.0.1:0 listeners).
    pub(crate) fn start(yaml: &str) -> Gateway {
        Gateway::start_env(yaml, &[])
    }

    /// [`Gateway::start`] with extra environment variables.
    pub(crate) fn start_env(yaml: &str, env: &[(String, String)]) -> Gateway {
        Gateway::start_with(yaml, env, None)
    }

    /// [`Gateway::start`] with the state directory (`--state-dir`, the asynchronous-call
    /// store) at `state`, which outlives the gateway (restart tests).
    pub(crate) fn start_in(yaml: &str, state: &std::path::Path) -> Gateway {
        Gateway::start_with(yaml, &[], Some(state))
    }

    /// Start with `env`, and the state directory `state` (default: a fresh one beside
    /// the config file, so that gateways of parallel tests never share one).
    fn start_with(
        yaml: &str,
        env: &[(String, String)],
        state: Option<&std::path::Path>,
    ) -> Gateway {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gateway.yaml");
        std::fs::write(&path, yaml).unwrap();
        let own = dir.path().join("state");
        let state = state.unwrap_or(&own);
        let proc = Proc::spawn_env(
            &[
                "serve",
                "--config",
                path.to_str().unwrap(),
                "--state-dir",
                state.to_str().unwrap(),
            ],
            env,
        );
        let line = proc.wait_line("spillway listening", Duration::from_secs(30));
        Gateway {
            proxy: field(&line, "proxy"),
            admin: field(&line, "admin"),
            proc,
            _dir: dir,
        }
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.proxy, path)
    }

    /// The file the gateway was started from (rewrite it, then reload).
    pub(crate) fn config_path(&self) -> std::path::PathBuf {
        self._dir.path().join("gateway.yaml")
    }

    pub(crate) fn status(&self) -> Value {
        let (code, _, body) = http(self.admin, "GET", "/status", &[], b"");
        assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
        serde_json::from_slice(&body).expect("status JSON")
    }

    /// Poll `/status` until `pred` holds.
    pub(crate) fn wait_status(
        &self,
        what: &str,
        within: Duration,
        pred: impl Fn(&Value) -> bool,
    ) -> Value {
        let deadline = Instant::now() + within;
        loop {
            let s = self.status();
            if pred(&s) {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; last status:\n{s:#}\nlog:\n{}",
                self.proc.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A sample API process on a free port (`spillway sample-api`).
pub(crate) struct SampleApi {
    pub proc: Proc,
    pub addr: SocketAddr,
}

/// A port on 127.0.0.1 that was free a moment ago (bound to port 0, then released).
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// An `http://` URL on a closed loopback port, with `userinfo` (`""`, or `user:password@`)
/// before the host: a connection there is refused for as long as the test process runs.
///
/// The port stays bound (without `SO_REUSEADDR`, never listening) until the process exits,
/// so no server another test starts on port 0 (a moto server, a sample API) can be given
/// it: a port that was merely free a moment ago was once handed to a concurrent test's
/// moto server, and the "unreachable" EC2 API launched instances there.
pub(crate) fn closed_url(userinfo: &str) -> String {
    static HELD: parking_lot::Mutex<Vec<socket2::Socket>> = parking_lot::Mutex::new(Vec::new());
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
        .expect("a TCP socket");
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    socket.bind(&any.into()).expect("bind 127.0.0.1:0");
    let port = socket
        .local_addr()
        .ok()
        .and_then(|a| a.as_socket())
        .expect("a bound IPv4 address")
        .port();
    HELD.lock().push(socket);
    format!("http://{userinfo}127.0.0.1:{port}")
}

/// Poll `f` every 50 ms until it returns `Some`, or panic after `within` naming `what`.
pub(crate) fn poll<T>(what: &str, within: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

impl SampleApi {
    /// Start `spillway sample-api` on port 0 and learn its address from its listening
    /// line: a port chosen before the spawn could be taken by a concurrent test's server
    /// meanwhile, and a connection check would then find that other server.
    pub(crate) fn start(name: &str) -> SampleApi {
        let proc = Proc::spawn(&["sample-api", "--listen", "127.0.0.1:0", "--name", name]);
        let line = proc.wait_line("sample API listening", Duration::from_secs(20));
        let addr: SocketAddr = line
            .split("listen=")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("no address in the sample API's line {line:?}"));
        SampleApi { proc, addr }
    }

    pub(crate) fn stats(&self) -> Value {
        let (code, _, body) = http(self.addr, "GET", "/stats", &[], b"");
        assert_eq!(code, 200);
        serde_json::from_slice(&body).unwrap()
    }
}

/// One HTTP/1.1 request on a fresh connection (Connection: close). Returns status,
/// lower-cased headers and body.
pub(crate) fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if !body.is_empty() || method == "POST" || method == "PUT" {
        req.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    req.push_str("\r\n");
    let mut bytes = req.into_bytes();
    bytes.extend_from_slice(body);
    raw(addr, &bytes)
}

/// Send raw bytes, read until the server closes, parse one response.
pub(crate) fn raw(addr: SocketAddr, bytes: &[u8]) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(bytes).unwrap();
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    parse_response(&buf)
}

pub(crate) fn parse_response(buf: &[u8]) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let end = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no header end in {:?}", String::from_utf8_lossy(buf)));
    let head = String::from_utf8_lossy(&buf[..end]);
    let mut lines = head.split("\r\n");
    let status: u16 = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let mut body = buf[end + 4..].to_vec();
    if headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"))
    {
        body = dechunk(&body);
    }
    (status, headers, body)
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(pos) = b.windows(2).position(|w| w == b"\r\n") else {
            return out;
        };
        let size =
            usize::from_str_radix(String::from_utf8_lossy(&b[..pos]).trim(), 16).unwrap_or(0);
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&b[pos + 2..pos + 2 + size]);
        b = &b[pos + 2 + size + 2..];
    }
}

pub(crate) fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// Send `rate` requests/s to `path` for `seconds`, each on its own thread-pool worker,
/// open loop (bounded: rate·seconds requests). Returns (status, instance) per request.
pub(crate) fn load(addr: SocketAddr, path: &str, rate: f64, seconds: f64) -> Vec<(u16, String)> {
    let n = (rate * seconds).round() as usize;
    let gap = Duration::from_secs_f64(1.0 / rate);
    let start = Instant::now();
    let (tx, rx) = mpsc::channel();
    for i in 0..n {
        let due = start + gap * i as u32;
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait); // pacing the open-loop sender, not an assertion wait
        }
        let tx = tx.clone();
        let path = path.to_string();
        std::thread::spawn(move || {
            let (code, headers, _) = http(addr, "GET", &path, &[], b"");
            let instance = header(&headers, "x-spillway-instance")
                .unwrap_or("")
                .to_string();
            let _ = tx.send((code, instance));
        });
    }
    drop(tx);
    rx.iter().take(n).collect()
}

pub(crate) fn u64_at(v: &Value, path: &str) -> u64 {
    v.pointer(path)
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("{path} in {v:#}"))
}

pub(crate) fn f64_at(v: &Value, path: &str) -> f64 {
    v.pointer(path)
        .and_then(Value::as_f64)
        .unwrap_or_else(|| panic!("{path} in {v:#}"))
}

/// YAML for a gateway on port 0 running sample-API processes on both tiers.
pub(crate) fn process_config(libra: &str, extra_gateway: &str) -> String {
    let exe = exe();
    format!(
        r#"
gateway:
  listen: 127.0.0.1:0
  admin_listen: 127.0.0.1:0
  drain_timeout_seconds: 10
{extra_gateway}
libra:
{libra}
vm_pool:
  type: process
  command: ["{exe}", "sample-api", "--listen", "127.0.0.1:{{port}}", "--name", "vm-{{port}}"]
  boot_timeout_seconds: 20
  probe_interval_seconds: 0.05
function_tier:
  type: process
  command: ["{exe}", "sample-api", "--listen", "127.0.0.1:{{port}}", "--name", "fn-{{port}}"]
  keep_alive_seconds: 30
  max_instances: 160
  probe_interval_seconds: 0.02
"#
    )
}

/// YAML for a gateway on port 0 in front of a static VM pool of `urls` (every request
/// goes to a VM: one decision per 1000 epochs, r_max 1000, ρ = 1) with an unused
/// process function tier. `extra_gateway` holds more `gateway:` keys, indented by two.
pub(crate) fn static_config(urls: &[String], extra_gateway: &str) -> String {
    let exe = exe();
    let urls = urls
        .iter()
        .map(|u| format!("\"{u}\""))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        r#"
gateway:
  listen: 127.0.0.1:0
  admin_listen: 127.0.0.1:0
  allow_loopback_upstreams: true
{extra_gateway}
libra:
  decision_epochs: 1000
  r_max_rps: 1000
  rho: 1.0
vm_pool:
  type: static
  urls: [{urls}]
function_tier:
  type: process
  command: ["{exe}", "sample-api", "--listen", "127.0.0.1:{{port}}", "--name", "fn-{{port}}"]
  max_instances: 4
"#
    )
}

/// YAML for a gateway on port 0 whose requests all go to an `http` function tier at
/// `url` (which may carry a base path): no VM ever starts.
pub(crate) fn function_http_config(url: &str, extra_gateway: &str) -> String {
    let exe = exe();
    format!(
        r#"
gateway:
  listen: 127.0.0.1:0
  admin_listen: 127.0.0.1:0
  allow_loopback_upstreams: true
{extra_gateway}
libra:
  decision_epochs: 1000
  min_vms: 0
  cip_rps: 0
vm_pool:
  type: process
  command: ["{exe}", "sample-api", "--listen", "127.0.0.1:{{port}}", "--name", "vm-{{port}}"]
function_tier:
  type: http
  url: "{url}"
  max_concurrency: 64
"#
    )
}

/// Resident memory of a process, KiB (Linux `/proc/PID/status` `VmRSS`).
pub(crate) fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}
