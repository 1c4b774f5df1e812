#![allow(dead_code)]
//! Several gateway replicas on one Redis: a `redis-server` the test starts on a free
//! loopback port, N `spillway serve` processes coordinated through it, an open-loop load
//! spread over the replicas, `/status` sampling, and a small TCP fault proxy that can cut
//! one replica off from Redis.

use parking_lot::Mutex;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::{Gateway, exe, free_port, header, http};

/// A `redis-server` on 127.0.0.1 (no persistence), killed on drop.
pub(crate) struct Redis {
    pub child: Child,
    pub port: u16,
}

impl Redis {
    /// Start one. Fails with how to install it when `redis-server` is missing (CI
    /// installs it: `.ci/run`). The port is picked free and can be taken by a concurrent
    /// test's server before this one binds it: then another port is tried.
    pub(crate) fn start() -> Redis {
        let mut last = String::new();
        for _ in 0..5 {
            match Redis::try_start_on(free_port()) {
                Ok(r) => return r,
                Err(e) => last = e,
            }
        }
        panic!("redis-server did not start on a free port in 5 tries: {last}");
    }

    /// Start one on `port` (a restart keeps the replicas' URL).
    pub(crate) fn start_on(port: u16) -> Redis {
        Redis::try_start_on(port).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Start one on `port`; an error when it exits (the port is taken) or when the
    /// server answering there is not this child (another test's server).
    pub(crate) fn try_start_on(port: u16) -> Result<Redis, String> {
        let child = Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--protected-mode",
                "no",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "redis-server is required by the replica tests ({e}): \
                     apt-get install redis-server (.ci/run installs it)"
                )
            });
        let mut r = Redis { child, port };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(Some(status)) = r.child.try_wait() {
                return Err(format!(
                    "redis-server on {port} exited ({status}): port taken?"
                ));
            }
            if r.ping() {
                break;
            }
            if Instant::now() >= deadline {
                return Err(format!("redis-server did not answer on {port}"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        match r.process_id() {
            Some(pid) if pid == r.child.id() => Ok(r),
            other => Err(format!(
                "the redis-server answering on {port} is process {other:?}, not the one \
                 started ({}): another test's server took the port",
                r.child.id()
            )),
        }
    }

    /// The `process_id` of the server answering on the port (`INFO server`).
    fn process_id(&self) -> Option<u32> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        s.set_read_timeout(Some(Duration::from_millis(500))).ok()?;
        s.write_all(b"INFO server\r\n").ok()?;
        let mut reply = Vec::new();
        let mut buf = [0u8; 4096];
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            let text = String::from_utf8_lossy(&reply);
            if let Some(rest) = text.split("process_id:").nth(1)
                && let Some(end) = rest.find(['\r', '\n'])
            {
                return rest[..end].trim().parse().ok();
            }
            let n = s.read(&mut buf).ok()?;
            if n == 0 {
                break;
            }
            reply.extend_from_slice(&buf[..n]);
        }
        None
    }

    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// `PING` → `+PONG`.
    pub(crate) fn ping(&self) -> bool {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
        if s.write_all(b"PING\r\n").is_err() {
            return false;
        }
        let mut buf = [0u8; 16];
        matches!(s.read(&mut buf), Ok(n) if buf[..n].starts_with(b"+PONG"))
    }

    pub(crate) fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{sig}"), &self.child.id().to_string()])
            .status()
            .expect("kill")
            .success();
        assert!(ok, "kill -{sig} redis failed");
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-CONT", &self.child.id().to_string()])
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The LIBRA section of the replica tests: 0.5 s epochs, decisions every K = 4 epochs
/// (2 s), the per-epoch quota, α = 0.3, β = 0.2, φ = 1.5, ρ = 0.7, r_max 10 req/s.
pub(crate) const LIBRA: &str = "  epoch_seconds: 0.5
  decision_epochs: 4
  alpha: 0.3
  beta: 0.2
  phi: 1.5
  rho: 0.7
  balancer: quota
  r_max_rps: 10
  min_vms: 1
  max_vms: 12
  cip_rps: 1
";

/// Epoch length of [`LIBRA`].
pub(crate) const EPOCH: Duration = Duration::from_millis(500);
/// K of [`LIBRA`]: a scaling decision every this many epochs.
pub(crate) const DECISION_EPOCHS: u64 = 4;
/// ρ of [`LIBRA`].
pub(crate) const RHO: f64 = 0.7;

/// A replica's YAML: a `process` VM pool of sample APIs, an `http` function tier at
/// `functions` (one shared sample API), coordinated through `redis_url` when given.
pub(crate) fn config(
    functions: SocketAddr,
    redis_url: Option<&str>,
    cluster: &str,
    extra: &str,
) -> String {
    let exe = exe();
    let coordination = match redis_url {
        Some(url) => format!(
            "coordination:\n  type: redis\n  url: {url}\n  cluster: {cluster}\n  lease_ms: 1500\n  op_timeout_ms: 200\n  grace_epochs: 3\n"
        ),
        None => String::new(),
    };
    format!(
        r#"
gateway:
  listen: 127.0.0.1:0
  admin_listen: 127.0.0.1:0
  allow_loopback_upstreams: true
  drain_timeout_seconds: 5
  health_check_interval_seconds: 0.5
libra:
{LIBRA}
vm_pool:
  type: process
  command: ["{exe}", "sample-api", "--listen", "127.0.0.1:{{port}}", "--name", "vm-{cluster}-{{port}}"]
  boot_timeout_seconds: 20
  probe_interval_seconds: 0.05
function_tier:
  type: http
  url: "http://{functions}"
  max_concurrency: 256
{coordination}{extra}
"#
    )
}

/// Epoch index of the wall-clock instant now (the replicas' grid: multiples of
/// [`EPOCH`] on the store's clock, which is this host's clock).
pub(crate) fn wall_epoch() -> u64 {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    ms / EPOCH.as_millis() as u64
}

/// One response of [`drive`].
#[derive(Clone, Debug)]
pub(crate) struct Sent {
    /// Which target (replica index).
    pub to: usize,
    /// Wall-clock epoch it was sent in.
    pub epoch: u64,
    pub status: u16,
    /// `x-spillway-instance`.
    pub instance: String,
}

impl Sent {
    pub(crate) fn on_vm(&self) -> bool {
        self.instance.starts_with("vm-")
    }
}

/// An open-loop load: for each `(rate, seconds)` step, `rate` requests/s to `path`,
/// request i to the target whose weight share it falls in (a deterministic weighted
/// round robin); one thread per request (bounded: Σ rate·seconds).
pub(crate) fn drive(targets: &[(SocketAddr, f64)], steps: &[(f64, f64)], path: &str) -> Vec<Sent> {
    drive_on_grid(targets, steps, path, Instant::now())
}

/// [`drive`] with the first request sent at `start` (a future instant: an epoch
/// boundary from [`next_decision_cycle`]) and every later one at its offset from it.
pub(crate) fn drive_on_grid(
    targets: &[(SocketAddr, f64)],
    steps: &[(f64, f64)],
    path: &str,
    start: Instant,
) -> Vec<Sent> {
    let total_w: f64 = targets.iter().map(|(_, w)| w).sum();
    let mut credit = vec![0.0; targets.len()];
    let (tx, rx) = mpsc::channel();
    let mut n = 0;
    let mut at = Duration::ZERO;
    for &(rate, seconds) in steps {
        let count = (rate * seconds).round() as usize;
        let gap = Duration::from_secs_f64(1.0 / rate.max(1e-9));
        for i in 0..count {
            let due = start + at + gap * i as u32;
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait); // pacing the open-loop sender
            }
            // Weighted round robin: the target furthest below its share.
            for (c, (_, w)) in credit.iter_mut().zip(targets) {
                *c += w / total_w;
            }
            let to = (0..targets.len())
                .max_by(|&a, &b| credit[a].total_cmp(&credit[b]))
                .unwrap();
            credit[to] -= 1.0;
            let addr = targets[to].0;
            let tx = tx.clone();
            let path = path.to_string();
            let epoch = wall_epoch();
            std::thread::spawn(move || {
                let (status, headers, _) = http(addr, "GET", &path, &[], b"");
                let instance = header(&headers, "x-spillway-instance")
                    .unwrap_or("")
                    .to_string();
                let _ = tx.send(Sent {
                    to,
                    epoch,
                    status,
                    instance,
                });
            });
            n += 1;
        }
        at += Duration::from_secs_f64(seconds);
    }
    drop(tx);
    rx.iter().take(n).collect()
}

/// Policy time zero of the gateway behind `admin` on this process's clock: the instant
/// its epoch 0 began (its epochs are `[origin + i·E, origin + (i+1)·E)`). A coordinated
/// replica's origin lies on the wall-clock grid of multiples of [`EPOCH`]; one gateway's
/// is its start. Read from `/status`'s `uptime_seconds` (0.1 ms) at the midpoint of the
/// request; `None` when the gateway does not answer.
pub(crate) fn epoch_origin(admin: SocketAddr) -> Option<Instant> {
    let t0 = Instant::now();
    let s = try_status(admin)?;
    let t1 = Instant::now();
    let uptime = Duration::from_secs_f64(s["uptime_seconds"].as_f64()?);
    (t0 + (t1 - t0) / 2).checked_sub(uptime)
}

/// The next instant at least `ahead` from now at which a gateway whose policy time zero is
/// `origin` and whose last decision closed its epoch `decided` takes a scaling decision:
/// the end of epoch `decided + j·K` for the least such j. A load started there meets
/// the K-epoch decision cycle at the same phase on every run (one gateway or replicas),
/// so that runs compare their policies, not where their start fell in the cycle.
pub(crate) fn next_decision_cycle(origin: Instant, decided: u64, ahead: Duration) -> Instant {
    let earliest = Instant::now() + ahead;
    let mut end = decided + 1;
    while origin + EPOCH * u32::try_from(end).expect("epoch index") < earliest {
        end += DECISION_EPOCHS;
    }
    origin + EPOCH * u32::try_from(end).expect("epoch index")
}

/// One `/status` sample.
#[derive(Clone, Debug)]
pub(crate) struct Sample {
    pub at: Instant,
    /// Wall-clock epoch ([`wall_epoch`]) it was taken in.
    pub epoch: u64,
    pub replica: usize,
    pub status: Value,
}

/// `/status` of every replica every 100 ms while it runs, in a thread.
pub(crate) struct Sampler {
    stop: Arc<AtomicBool>,
    samples: Arc<Mutex<Vec<Sample>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Sampler {
    pub(crate) fn start(admins: Vec<SocketAddr>) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let samples = Arc::new(Mutex::new(Vec::new()));
        let (s2, st2) = (Arc::clone(&samples), Arc::clone(&stop));
        let thread = std::thread::spawn(move || {
            while !st2.load(Ordering::Relaxed) {
                for (i, a) in admins.iter().enumerate() {
                    if let Some(v) = try_status(*a) {
                        s2.lock().push(Sample {
                            at: Instant::now(),
                            epoch: wall_epoch(),
                            replica: i,
                            status: v,
                        });
                    }
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        Sampler {
            stop,
            samples,
            thread: Some(thread),
        }
    }

    /// Stop and return every sample.
    pub(crate) fn finish(mut self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        std::mem::take(&mut *self.samples.lock())
    }
}

/// `/status` of an admin listener, `None` when it does not answer (a killed replica).
pub(crate) fn try_status(admin: SocketAddr) -> Option<Value> {
    let mut s = TcpStream::connect_timeout(&admin, Duration::from_millis(500)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(
        format!("GET /status HTTP/1.1\r\nHost: {admin}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .ok()?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).ok()?;
    let (code, _, body) = crate::common::parse_response(&buf);
    (code == 200).then(|| serde_json::from_slice(&body).ok())?
}

/// The coordination role in a `/status`.
pub(crate) fn role(s: &Value) -> &str {
    s.pointer("/coordination/role")
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// The scaling decisions in `samples` (by the replicas that were leader when they
/// showed them): (when, epoch, target), one per epoch.
pub(crate) fn decisions(samples: &[Sample]) -> Vec<(Instant, u64, u64)> {
    let mut out: Vec<(Instant, u64, u64)> = Vec::new();
    for Sample { at, status: s, .. } in samples {
        let shared = s.pointer("/coordination/type").and_then(Value::as_str) == Some("redis");
        if shared && role(s) != "leader" {
            continue;
        }
        let Some(d) = s.pointer("/scaling/last_decision").filter(|d| !d.is_null()) else {
            continue;
        };
        let epoch = d["epoch"].as_u64().unwrap_or(0);
        let target = d["target_vms"].as_u64().unwrap_or(0);
        if out.last().is_none_or(|&(_, e, _)| e != epoch) {
            out.push((*at, epoch, target));
        }
    }
    out
}

/// Start `n` replicas of `yaml`.
pub(crate) fn start(n: usize, yaml: &str) -> Vec<Gateway> {
    (0..n).map(|_| Gateway::start(yaml)).collect()
}

/// Wait until exactly one replica reports `leader` and the others `follower`.
pub(crate) fn wait_one_leader(gws: &[&Gateway], within: Duration) -> usize {
    let deadline = Instant::now() + within;
    loop {
        let roles: Vec<String> = gws
            .iter()
            .map(|g| try_status(g.admin).map_or(String::new(), |s| role(&s).to_string()))
            .collect();
        let leaders: Vec<usize> = (0..roles.len()).filter(|&i| roles[i] == "leader").collect();
        if leaders.len() == 1 && roles.iter().all(|r| r == "leader" || r == "follower") {
            return leaders[0];
        }
        assert!(
            Instant::now() < deadline,
            "no single leader within {within:?}: {roles:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A TCP proxy on a free loopback port to `upstream`; [`FaultProxy::cut`] drops every
/// connection and refuses new ones until [`FaultProxy::heal`].
pub(crate) struct FaultProxy {
    pub port: u16,
    cut: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
}

impl FaultProxy {
    pub(crate) fn start(upstream: SocketAddr) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let cut = Arc::new(AtomicBool::new(false));
        let conns: Arc<Mutex<Vec<TcpStream>>> = Arc::new(Mutex::new(Vec::new()));
        let (c2, k2) = (Arc::clone(&cut), Arc::clone(&conns));
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                if c2.load(Ordering::Relaxed) {
                    drop(client);
                    continue;
                }
                let Ok(server) = TcpStream::connect(upstream) else {
                    continue;
                };
                k2.lock().push(client.try_clone().unwrap());
                k2.lock().push(server.try_clone().unwrap());
                for (mut from, mut to) in [
                    (client.try_clone().unwrap(), server.try_clone().unwrap()),
                    (server, client),
                ] {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    });
                }
            }
        });
        FaultProxy { port, cut, conns }
    }

    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub(crate) fn cut(&self) {
        self.cut.store(true, Ordering::Relaxed);
        for c in self.conns.lock().drain(..) {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
    }

    pub(crate) fn heal(&self) {
        self.cut.store(false, Ordering::Relaxed);
    }
}

/// Pids of the VM processes (`sample-api … --name vm-…`) whose parent is one of `parents`.
pub(crate) fn vm_children(parents: &[u32]) -> std::collections::BTreeSet<u32> {
    let mut out = std::collections::BTreeSet::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in dir.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // pid (comm) state ppid …: comm may hold spaces; split after the last ')'.
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        let ppid: u32 = rest
            .split_whitespace()
            .nth(1)
            .and_then(|p| p.parse().ok())
            .unwrap_or(0);
        if !parents.contains(&ppid) {
            continue;
        }
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let cmd = String::from_utf8_lossy(&cmd);
        if cmd.contains("sample-api") && cmd.contains("vm-") {
            out.insert(pid);
        }
    }
    out
}

/// `redis-cli -p PORT ARGS…`, its output lines.
pub(crate) fn redis_cli(port: u16, args: &[&str]) -> Vec<String> {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli (package redis-tools, installed with redis-server)");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

/// The terms of the pool-write intents recorded in `cluster`, in order.
pub(crate) fn intent_terms(port: u16, cluster: &str) -> Vec<u64> {
    redis_cli(
        port,
        &[
            "LRANGE",
            &format!("spillway:{{{cluster}}}:intents"),
            "0",
            "-1",
        ],
    )
    .iter()
    .filter_map(|l| serde_json::from_str::<Value>(l).ok())
    .filter_map(|v| v["term"].as_u64())
    .collect()
}

/// Poll every 20 ms until `pred` holds for the statuses of `admins` (a replica that
/// does not answer gives `None`); returns how long it took.
pub(crate) fn until(
    what: &str,
    admins: &[SocketAddr],
    within: Duration,
    pred: impl Fn(&[Option<Value>]) -> bool,
) -> Duration {
    let t0 = Instant::now();
    loop {
        let st: Vec<Option<Value>> = admins.iter().map(|a| try_status(*a)).collect();
        if pred(&st) {
            return t0.elapsed();
        }
        assert!(
            t0.elapsed() < within,
            "timed out after {within:?} waiting for {what}: roles {:?}",
            st.iter()
                .map(|s| s.as_ref().map(|s| role(s).to_string()))
                .collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The term in a `/status`.
pub(crate) fn term(s: &Value) -> u64 {
    s.pointer("/coordination/term")
        .and_then(Value::as_u64)
        .unwrap_or(0)
}

/// Latency percentile (0–100) of `samples`.
pub(crate) fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort();
    if samples.is_empty() {
        return Duration::ZERO;
    }
    let i = ((p / 100.0) * (samples.len() - 1) as f64).round() as usize;
    samples[i]
}

/// A closed-loop-free open load in a background thread: `rate` req/s to `path`, spread
/// over the targets whose weight is above zero in `weights` (shared, so the test can
/// move traffic away from a replica it kills). Returns (status, latency) per request on
/// [`Background::finish`].
pub(crate) struct Background {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Vec<(u16, Duration)>>>,
}

impl Background {
    pub(crate) fn start(
        targets: Vec<SocketAddr>,
        weights: Arc<Mutex<Vec<f64>>>,
        rate: f64,
        path: &str,
    ) -> Background {
        let stop = Arc::new(AtomicBool::new(false));
        let s2 = Arc::clone(&stop);
        let path = path.to_string();
        let thread = std::thread::spawn(move || {
            let (tx, rx) = mpsc::channel();
            let gap = Duration::from_secs_f64(1.0 / rate);
            let start = Instant::now();
            let mut credit = vec![0.0; targets.len()];
            let mut i: u32 = 0;
            while !s2.load(Ordering::Relaxed) {
                let due = start + gap * i;
                if let Some(wait) = due.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait); // pacing the open-loop sender
                }
                i += 1;
                let w = weights.lock().clone();
                let total: f64 = w.iter().sum();
                for (c, x) in credit.iter_mut().zip(&w) {
                    *c += x / total;
                }
                let to = (0..targets.len())
                    .filter(|&k| w[k] > 0.0)
                    .max_by(|&a, &b| credit[a].total_cmp(&credit[b]))
                    .unwrap();
                credit[to] -= 1.0;
                let addr = targets[to];
                let tx = tx.clone();
                let path = path.clone();
                std::thread::spawn(move || {
                    let t0 = Instant::now();
                    let (status, _, _) = http(addr, "GET", &path, &[], b"");
                    let _ = tx.send((status, t0.elapsed()));
                });
            }
            drop(tx);
            rx.iter().collect()
        });
        Background {
            stop,
            thread: Some(thread),
        }
    }

    pub(crate) fn finish(mut self) -> Vec<(u16, Duration)> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap()
    }
}

/// A cluster name for one test of this process: `base` with the test process's id and
/// a counter (`even-4711-0`). [`Reaper`] and [`cluster_vms`] find VM processes
/// machine-wide by cluster name, so two runs of a test file on one machine must not
/// share one: each would kill the other's VMs.
pub(crate) fn unique_cluster(base: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{base}-{}-{n}", std::process::id())
}

/// Pids of the VM processes of `cluster` (named `vm-CLUSTER-PORT` by [`config`]),
/// whoever their parent is now (a VM outlives a killed leader: the next one adopts it).
pub(crate) fn cluster_vms(cluster: &str) -> std::collections::BTreeSet<u32> {
    let marker = format!("vm-{cluster}-");
    let mut out = std::collections::BTreeSet::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        // A zombie has an empty command line: it is gone.
        if cmd.contains("sample-api") && cmd.contains(&marker) {
            out.insert(pid);
        }
    }
    out
}

/// Kills the VM processes of a cluster when dropped (coordinated replicas keep their
/// VMs for each other at shutdown). Declare it before the gateways so that it drops
/// after them.
pub(crate) struct Reaper(pub String);

impl Reaper {
    pub(crate) fn reap(&self) {
        for pid in cluster_vms(&self.0) {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        self.reap();
    }
}
