//! Shared harness of the AWS tests: a moto server on a free loopback
//! port and the dummy credentials every AWS client of a test uses. The local stubs for
//! what moto cannot answer: a stateful EC2 query-API fake in [`ec2`], the Lambda ones
//! (moto's Lambda control API, an Invoke stub) in [`lambda`].
//!
//! Loopback only: moto's EC2 instances have fake addresses (10.x, 172.x) that no test
//! ever connects to; instances are resolved to loopback sample APIs through their
//! `spillway:upstream` tag instead.
#![allow(dead_code)]

pub(crate) mod ec2;
pub(crate) mod lambda;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Region every AWS test uses.
pub(crate) const REGION: &str = "us-east-1";

/// Environment for a gateway (or any AWS client) talking to an emulator: dummy
/// credentials, a region, no instance-metadata probing, no profile files of the machine.
pub(crate) fn aws_env() -> Vec<(String, String)> {
    [
        ("AWS_ACCESS_KEY_ID", "testing"),
        ("AWS_SECRET_ACCESS_KEY", "testing"),
        ("AWS_REGION", REGION),
        ("AWS_EC2_METADATA_DISABLED", "true"),
        ("AWS_CONFIG_FILE", "/nonexistent/spillway-test-aws-config"),
        (
            "AWS_SHARED_CREDENTIALS_FILE",
            "/nonexistent/spillway-test-aws-credentials",
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// A free loopback TCP port (bound and released: nothing listens on it afterwards).
pub(crate) use crate::common::{free_port, poll};

/// A `moto_server` child process on a free loopback port; killed on drop.
pub(crate) struct Moto {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub endpoint: String,
    /// The listen address.
    pub addr: SocketAddr,
}

impl Moto {
    /// Start `moto_server -H 127.0.0.1 -p PORT` and wait (up to 60 s) until it answers.
    ///
    /// # Panics
    /// When `moto_server` is not on PATH (`scripts/test.sh` installs it into its virtual
    /// environment and runs the tests with that on PATH) or does not answer in time.
    pub(crate) fn start() -> Moto {
        for _ in 0..3 {
            let port = free_port();
            let child = Command::new("moto_server")
                .args(["-H", "127.0.0.1", "-p", &port.to_string()])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect(
                    "moto_server not found on PATH: run the tests with scripts/test.sh, which \
                     installs moto[server] into ${CARGO_TARGET_DIR:-target}/python-venv",
                );
            let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
            let mut moto = Moto {
                child,
                endpoint: format!("http://{addr}"),
                addr,
            };
            let deadline = Instant::now() + Duration::from_secs(60);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = moto.child.try_wait() {
                    break; // port taken meanwhile: try another one
                }
                if moto
                    .get("/moto-api/data.json")
                    .is_some_and(|(s, _)| s == 200)
                {
                    return moto;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        panic!("moto_server did not start");
    }

    /// One plain HTTP request to moto; `(status, body)`.
    pub(crate) fn request(&self, method: &str, path: &str, body: &[u8]) -> Option<(u16, Vec<u8>)> {
        let mut s = TcpStream::connect(self.addr).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
            self.addr,
            body.len()
        );
        s.write_all(head.as_bytes()).ok()?;
        s.write_all(body).ok()?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).ok()?;
        let end = buf.windows(4).position(|w| w == b"\r\n\r\n")?;
        let status = String::from_utf8_lossy(&buf[..end])
            .split(' ')
            .nth(1)?
            .parse()
            .ok()?;
        Some((status, buf[end + 4..].to_vec()))
    }

    /// `GET path`.
    pub(crate) fn get(&self, path: &str) -> Option<(u16, Vec<u8>)> {
        self.request("GET", path, b"")
    }

    /// Forget every emulated resource (`POST /moto-api/reset`).
    pub(crate) fn reset(&self) {
        let r = self.request("POST", "/moto-api/reset", b"");
        assert!(matches!(r, Some((200, _))), "moto reset failed: {r:?}");
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One request a local API stub received: method, path and query, lower-cased header
/// names with their values, body.
#[derive(Clone, Debug)]
pub(crate) struct StubRequest {
    /// Method.
    pub method: String,
    /// Path and query as received.
    pub target: String,
    /// Lower-cased header names with their values.
    pub headers: Vec<(String, String)>,
    /// Body.
    pub body: Vec<u8>,
}

/// Read one HTTP/1.1 request (Content-Length framing; the stubs' clients are the AWS SDK)
/// from `stream`. `None` when the peer went away first.
pub(crate) fn read_stub_request(
    stream: TcpStream,
) -> Option<(StubRequest, std::io::BufReader<TcpStream>)> {
    use std::io::BufRead;
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let mut reader = std::io::BufReader::new(stream);
    let mut line = String::new();
    if reader.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or("").to_string();
    let target = parts.next().unwrap_or("").to_string();
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).ok()? == 0 {
            return None;
        }
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    let len: usize = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; len];
    reader.read_exact(&mut body).ok()?;
    let req = StubRequest {
        method,
        target,
        headers,
        body,
    };
    Some((req, reader))
}

/// Write one `Connection: close` reply.
pub(crate) fn write_stub_reply(
    reader: std::io::BufReader<TcpStream>,
    status: u16,
    headers: &[(String, String)],
    body: &[u8],
) {
    let mut out = format!("HTTP/1.1 {status} Stub\r\nConnection: close\r\n");
    for (k, v) in headers {
        out.push_str(&format!("{k}: {v}\r\n"));
    }
    out.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
    let mut stream = reader.into_inner();
    let _ = stream.write_all(out.as_bytes());
    let _ = stream.write_all(body);
    let _ = stream.flush();
}
