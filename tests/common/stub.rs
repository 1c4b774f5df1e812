//! A scripted HTTP/1.1 upstream on 127.0.0.1:0 that logs every byte it receives and
//! every request it parses, answers each request with what a handler returns (raw bytes,
//! so tests can send malformed framing, 1xx responses, trailers, HTTP/1.0 status lines),
//! and counts requests in flight; plus a raw client connection that reads responses one
//! at a time.

use parking_lot::Mutex;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One request the stub parsed.
#[derive(Clone, Debug)]
pub(crate) struct StubRequest {
    /// Method.
    pub method: String,
    /// Request target as received.
    pub target: String,
    /// `HTTP/1.1` or `HTTP/1.0`.
    pub version: String,
    /// Lower-cased names with their values, in order.
    pub headers: Vec<(String, String)>,
    /// The body (de-chunked).
    pub body: Vec<u8>,
    /// Chunked trailer fields.
    pub trailers: Vec<(String, String)>,
    /// Index of the upstream connection it came on.
    pub conn: usize,
}

impl StubRequest {
    /// Every value of header `name` (lower-case).
    pub(crate) fn all(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .collect()
    }

    /// The single value of `name`, if any.
    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.all(name).first().copied()
    }
}

/// What the stub does with a request.
pub(crate) enum Reply {
    /// Write these bytes (one or more responses, or anything else) and go on reading.
    Raw(Vec<u8>),
    /// Answer nothing; keep the connection until the gateway closes it.
    Hold,
    /// Write these bytes (a 101), then echo every byte back (a tunnel).
    Upgrade(Vec<u8>),
    /// Close the connection without answering (an upstream that drops a reused
    /// keep-alive connection as the request arrives, or dies mid-request).
    Close,
}

/// `HTTP/1.1 200` with body `path=<target>` and a Content-Length.
pub(crate) fn ok_reply(req: &StubRequest) -> Reply {
    let body = format!("path={}", req.target);
    Reply::Raw(
        format!(
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_bytes(),
    )
}

#[derive(Default)]
struct State {
    requests: Vec<StubRequest>,
    raw: Vec<u8>,
    connections: usize,
    open_connections: usize,
    in_flight: usize,
    peak_in_flight: usize,
}

type Handler = dyn Fn(&StubRequest) -> Reply + Send + Sync;

/// The running stub; its threads end with the test process.
pub(crate) struct Stub {
    /// Where it listens.
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
}

impl Stub {
    /// Start a stub that answers with `handler`.
    pub(crate) fn start(handler: impl Fn(&StubRequest) -> Reply + Send + Sync + 'static) -> Stub {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind stub");
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(State::default()));
        let handler: Arc<Handler> = Arc::new(handler);
        let st = Arc::clone(&state);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let conn = {
                    let mut s = st.lock();
                    s.connections += 1;
                    s.open_connections += 1;
                    s.connections - 1
                };
                let st = Arc::clone(&st);
                let handler = Arc::clone(&handler);
                std::thread::spawn(move || {
                    serve(stream, conn, &st, &*handler);
                    st.lock().open_connections -= 1;
                });
            }
        });
        Stub { addr, state }
    }

    /// `http://ADDR`.
    pub(crate) fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every request parsed so far.
    pub(crate) fn requests(&self) -> Vec<StubRequest> {
        self.state.lock().requests.clone()
    }

    /// Requests whose target is `target`.
    pub(crate) fn requests_to(&self, target: &str) -> Vec<StubRequest> {
        self.requests()
            .into_iter()
            .filter(|r| r.target == target)
            .collect()
    }

    /// Every byte received, all connections, in arrival order.
    pub(crate) fn raw(&self) -> Vec<u8> {
        self.state.lock().raw.clone()
    }

    /// Connections accepted so far.
    pub(crate) fn connections(&self) -> usize {
        self.state.lock().connections
    }

    /// Connections still open.
    pub(crate) fn open_connections(&self) -> usize {
        self.state.lock().open_connections
    }

    /// Requests read and not yet answered (held ones until their connection closes).
    pub(crate) fn in_flight(&self) -> usize {
        self.state.lock().in_flight
    }

    /// Most requests in flight at once.
    pub(crate) fn peak_in_flight(&self) -> usize {
        self.state.lock().peak_in_flight
    }

    /// Poll until `pred` holds on the stub, or panic after `within`.
    pub(crate) fn wait(&self, what: &str, within: Duration, pred: impl Fn(&Stub) -> bool) {
        let deadline = Instant::now() + within;
        while !pred(self) {
            assert!(
                Instant::now() < deadline,
                "stub: timed out waiting for {what}; requests: {:?}",
                self.requests()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Reads from a stream into a buffer, logging every byte into the stub's state.
struct Reader<'a> {
    stream: TcpStream,
    buf: Vec<u8>,
    state: &'a Mutex<State>,
}

impl Reader<'_> {
    /// Read more bytes; false on EOF or error.
    fn more(&mut self) -> bool {
        let mut chunk = [0u8; 16 * 1024];
        match self.stream.read(&mut chunk) {
            Ok(0) | Err(_) => false,
            Ok(n) => {
                self.state.lock().raw.extend_from_slice(&chunk[..n]);
                self.buf.extend_from_slice(&chunk[..n]);
                true
            }
        }
    }

    /// Take bytes up to and including `delim`.
    fn until(&mut self, delim: &[u8]) -> Option<Vec<u8>> {
        loop {
            if let Some(p) = find(&self.buf, delim) {
                return Some(self.buf.drain(..p + delim.len()).collect());
            }
            if !self.more() {
                return None;
            }
        }
    }

    fn exact(&mut self, n: usize) -> Option<Vec<u8>> {
        while self.buf.len() < n {
            if !self.more() {
                return None;
            }
        }
        Some(self.buf.drain(..n).collect())
    }
}

fn parse_fields(text: &str) -> Vec<(String, String)> {
    text.split("\r\n")
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect()
}

fn read_request(r: &mut Reader<'_>, conn: usize) -> Option<StubRequest> {
    let head = r.until(b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&head[..head.len() - 4]).into_owned();
    let (line, rest) = head.split_once("\r\n").unwrap_or((&head, ""));
    let mut parts = line.split(' ');
    let method = parts.next().unwrap_or("").to_string();
    let target = parts.next().unwrap_or("").to_string();
    let version = parts.next().unwrap_or("").to_string();
    let headers = parse_fields(rest);
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.to_ascii_lowercase().contains("chunked"));
    let mut body = Vec::new();
    let mut trailers = Vec::new();
    if chunked {
        loop {
            let line = r.until(b"\r\n")?;
            let size_text = String::from_utf8_lossy(&line[..line.len() - 2]).into_owned();
            let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
            if size == 0 {
                let tail = r.until(b"\r\n")?;
                if tail != b"\r\n" {
                    let more = r.until(b"\r\n\r\n")?;
                    let text = format!(
                        "{}{}",
                        String::from_utf8_lossy(&tail),
                        String::from_utf8_lossy(&more)
                    );
                    trailers = parse_fields(&text);
                }
                break;
            }
            body.extend(r.exact(size)?);
            r.exact(2)?;
        }
    } else if let Some(len) = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .and_then(|(_, v)| v.parse::<usize>().ok())
    {
        body = r.exact(len)?;
    }
    Some(StubRequest {
        method,
        target,
        version,
        headers,
        body,
        trailers,
        conn,
    })
}

fn serve(stream: TcpStream, conn: usize, state: &Mutex<State>, handler: &Handler) {
    let mut writer = stream.try_clone().expect("clone stub stream");
    let mut r = Reader {
        stream,
        buf: Vec::new(),
        state,
    };
    while let Some(req) = read_request(&mut r, conn) {
        {
            let mut s = state.lock();
            s.requests.push(req.clone());
            s.in_flight += 1;
            s.peak_in_flight = s.peak_in_flight.max(s.in_flight);
        }
        let done = |st: &Mutex<State>| st.lock().in_flight -= 1;
        match handler(&req) {
            Reply::Raw(bytes) => {
                let _ = writer.write_all(&bytes);
                done(state);
                let close = find(&bytes.to_ascii_lowercase(), b"connection: close").is_some()
                    || req
                        .get("connection")
                        .is_some_and(|v| v.eq_ignore_ascii_case("close"));
                if close {
                    let _ = writer.shutdown(Shutdown::Both);
                    return;
                }
            }
            Reply::Close => {
                done(state);
                let _ = writer.shutdown(Shutdown::Both);
                return;
            }
            Reply::Hold => {
                while r.more() {}
                done(state);
                return;
            }
            Reply::Upgrade(bytes) => {
                let _ = writer.write_all(&bytes);
                done(state);
                let pending = std::mem::take(&mut r.buf);
                let _ = writer.write_all(&pending);
                while r.more() {
                    let echo = std::mem::take(&mut r.buf);
                    if writer.write_all(&echo).is_err() {
                        break;
                    }
                }
                return;
            }
        }
    }
}

/// One response read by [`Client`].
#[derive(Clone, Debug)]
pub(crate) struct RawResponse {
    /// The status line as sent (`HTTP/1.1 200 OK`).
    pub status_line: String,
    /// Status code.
    pub status: u16,
    /// Lower-cased names with their values.
    pub headers: Vec<(String, String)>,
    /// Body (de-chunked).
    pub body: Vec<u8>,
    /// Chunked trailer fields.
    pub trailers: Vec<(String, String)>,
}

impl RawResponse {
    /// The first value of `name`.
    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A raw client connection: write bytes, read responses one at a time.
pub(crate) struct Client {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Client {
    /// Connect to `addr` with a 10 s read timeout.
    pub(crate) fn connect(addr: SocketAddr) -> Client {
        let stream = TcpStream::connect(addr).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        Client {
            stream,
            buf: Vec::new(),
        }
    }

    /// A client on an already connected stream (e.g. one bound to another loopback
    /// source address), with a 10 s read timeout.
    pub(crate) fn from_stream(stream: TcpStream) -> Client {
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        Client {
            stream,
            buf: Vec::new(),
        }
    }

    /// Close the write side (`shutdown(SHUT_WR)`): the request is complete, and the
    /// client still reads the answer.
    pub(crate) fn shutdown_write(&mut self) -> &mut Self {
        let _ = self.stream.shutdown(Shutdown::Write);
        self
    }

    /// Wait up to `within` for the server to close the connection, discarding what it
    /// sends; whether it closed.
    pub(crate) fn closed_within(&mut self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        let _ = self
            .stream
            .set_read_timeout(Some(Duration::from_millis(100)));
        let mut chunk = [0u8; 4096];
        let closed = loop {
            match self.stream.read(&mut chunk) {
                Ok(0) => break true,
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => break true,
            }
            if Instant::now() >= deadline {
                break false;
            }
        };
        let _ = self.stream.set_read_timeout(Some(Duration::from_secs(10)));
        closed
    }

    /// Write bytes (errors ignored: the server may have closed).
    pub(crate) fn send(&mut self, bytes: &[u8]) -> &mut Self {
        let _ = self.stream.write_all(bytes);
        self
    }

    fn more(&mut self) -> bool {
        let mut chunk = [0u8; 16 * 1024];
        match self.stream.read(&mut chunk) {
            Ok(0) | Err(_) => false,
            Ok(n) => {
                self.buf.extend_from_slice(&chunk[..n]);
                true
            }
        }
    }

    fn until(&mut self, delim: &[u8]) -> Option<Vec<u8>> {
        loop {
            if let Some(p) = find(&self.buf, delim) {
                return Some(self.buf.drain(..p + delim.len()).collect());
            }
            if !self.more() {
                return None;
            }
        }
    }

    fn exact(&mut self, n: usize) -> Option<Vec<u8>> {
        while self.buf.len() < n {
            if !self.more() {
                return None;
            }
        }
        Some(self.buf.drain(..n).collect())
    }

    /// The next response; `None` when the connection ended first. `head_request`: the
    /// request was HEAD (no body follows).
    pub(crate) fn response_to(&mut self, head_request: bool) -> Option<RawResponse> {
        let head = self.until(b"\r\n\r\n")?;
        let head = String::from_utf8_lossy(&head[..head.len() - 4]).into_owned();
        let (line, rest) = head.split_once("\r\n").unwrap_or((&head, ""));
        let status: u16 = line.split(' ').nth(1)?.parse().ok()?;
        let headers = parse_fields(rest);
        let get = |n: &str| {
            headers
                .iter()
                .find(|(k, _)| k == n)
                .map(|(_, v)| v.to_ascii_lowercase())
        };
        let mut body = Vec::new();
        let mut trailers = Vec::new();
        let bodiless = head_request || status < 200 || status == 204 || status == 304;
        if bodiless {
        } else if get("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
            loop {
                let line = self.until(b"\r\n")?;
                let text = String::from_utf8_lossy(&line[..line.len() - 2]).into_owned();
                let size = usize::from_str_radix(text.split(';').next()?.trim(), 16).ok()?;
                if size == 0 {
                    let tail = self.until(b"\r\n")?;
                    if tail != b"\r\n" {
                        let more = self.until(b"\r\n\r\n")?;
                        trailers = parse_fields(&format!(
                            "{}{}",
                            String::from_utf8_lossy(&tail),
                            String::from_utf8_lossy(&more)
                        ));
                    }
                    break;
                }
                body.extend(self.exact(size)?);
                self.exact(2)?;
            }
        } else if let Some(len) = get("content-length") {
            body = self.exact(len.parse().ok()?)?;
        } else {
            while self.more() {}
            body = std::mem::take(&mut self.buf);
        }
        Some(RawResponse {
            status_line: line.to_string(),
            status,
            headers,
            body,
            trailers,
        })
    }

    /// The next response to a non-HEAD request.
    pub(crate) fn response(&mut self) -> Option<RawResponse> {
        self.response_to(false)
    }

    /// Every response until the server closes the connection.
    pub(crate) fn responses_until_close(&mut self) -> Vec<RawResponse> {
        std::iter::from_fn(|| self.response()).collect()
    }

    /// Whether the server closed the connection (EOF within the read timeout, nothing
    /// more sent).
    pub(crate) fn closed(&mut self) -> bool {
        !self.more() && self.buf.is_empty()
    }

    /// Bytes already received and not consumed, or else the next read's bytes (empty on
    /// EOF or after the read timeout).
    pub(crate) fn read_some(&mut self) -> Vec<u8> {
        if self.buf.is_empty() {
            self.more();
        }
        std::mem::take(&mut self.buf)
    }

    /// Bytes received and not yet consumed by a parsed response, after reading until the
    /// server closes.
    pub(crate) fn rest_until_close(&mut self) -> Vec<u8> {
        while self.more() {}
        std::mem::take(&mut self.buf)
    }
}
