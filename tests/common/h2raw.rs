//! A raw HTTP/2 client for flood tests (http-cases C12): writes hand-built frames (no
//! flow control, no stream limits, HPACK literals without Huffman or indexing) and
//! records what the server sends back (GOAWAY, RST_STREAM, HEADERS) on a reader thread,
//! which also acknowledges the server's SETTINGS.

use parking_lot::Mutex;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Frame types (RFC 9113 §6).
pub(crate) const DATA: u8 = 0x0;
/// HEADERS.
pub(crate) const HEADERS: u8 = 0x1;
/// RST_STREAM.
pub(crate) const RST_STREAM: u8 = 0x3;
/// SETTINGS.
pub(crate) const SETTINGS: u8 = 0x4;
/// PING.
pub(crate) const PING: u8 = 0x6;
/// GOAWAY.
pub(crate) const GOAWAY: u8 = 0x7;
/// CONTINUATION.
pub(crate) const CONTINUATION: u8 = 0x9;
/// Flags.
pub(crate) const END_STREAM: u8 = 0x1;
/// END_HEADERS.
pub(crate) const END_HEADERS: u8 = 0x4;
/// Error codes (RFC 9113 §7).
pub(crate) const REFUSED_STREAM: u32 = 0x7;
/// CANCEL.
pub(crate) const CANCEL: u32 = 0x8;
/// ENHANCE_YOUR_CALM.
pub(crate) const ENHANCE_YOUR_CALM: u32 = 0xb;

/// What the server sent.
#[derive(Debug, Default, Clone)]
pub(crate) struct Seen {
    /// GOAWAY: (last stream id, error code).
    pub goaway: Option<(u32, u32)>,
    /// RST_STREAM frames: (stream id, error code).
    pub resets: Vec<(u32, u32)>,
    /// Streams the server answered with HEADERS.
    pub answered: Vec<u32>,
    /// PINGs the server sent (never acknowledged by this client).
    pub pings: usize,
    /// The server closed the connection.
    pub closed: bool,
}

/// One raw h2 connection.
pub(crate) struct RawH2 {
    writer: Arc<Mutex<TcpStream>>,
    seen: Arc<Mutex<Seen>>,
    /// Bytes written so far.
    pub written: usize,
}

/// One frame: 9-byte header + payload.
pub(crate) fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len();
    let mut out = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    out.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// HPACK integer with an `n`-bit prefix (RFC 7541 §5.1), first byte ORed with `high`.
fn int(out: &mut Vec<u8>, high: u8, n: u32, mut v: usize) {
    let max = (1usize << n) - 1;
    if v < max {
        out.push(high | v as u8);
        return;
    }
    out.push(high | max as u8);
    v -= max;
    while v >= 128 {
        out.push((v % 128 + 128) as u8);
        v /= 128;
    }
    out.push(v as u8);
}

/// An HPACK "literal header field without indexing — new name" (RFC 7541 §6.2.2).
pub(crate) fn literal(name: &str, value: &str) -> Vec<u8> {
    let mut out = Vec::new();
    out.push(0x00);
    int(&mut out, 0, 7, name.len());
    out.extend_from_slice(name.as_bytes());
    int(&mut out, 0, 7, value.len());
    out.extend_from_slice(value.as_bytes());
    out
}

/// The header block of a request.
pub(crate) fn request_block(method: &str, path: &str, authority: &str) -> Vec<u8> {
    let mut b = literal(":method", method);
    b.extend(literal(":scheme", "http"));
    b.extend(literal(":path", path));
    b.extend(literal(":authority", authority));
    b
}

impl RawH2 {
    /// Connect, send the preface and an empty SETTINGS frame.
    pub(crate) fn connect(addr: SocketAddr) -> RawH2 {
        let stream = TcpStream::connect(addr).expect("connect");
        stream.set_nodelay(true).unwrap();
        let mut reader = stream.try_clone().unwrap();
        let writer = Arc::new(Mutex::new(stream));
        let seen = Arc::new(Mutex::new(Seen::default()));
        let (w, s) = (Arc::clone(&writer), Arc::clone(&seen));
        std::thread::spawn(move || {
            let mut head = [0u8; 9];
            loop {
                if reader.read_exact(&mut head).is_err() {
                    break;
                }
                let len = (head[0] as usize) << 16 | (head[1] as usize) << 8 | head[2] as usize;
                let (kind, flags) = (head[3], head[4]);
                let id = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
                let mut payload = vec![0u8; len];
                if reader.read_exact(&mut payload).is_err() {
                    break;
                }
                let word = |at: usize| {
                    u32::from_be_bytes([
                        payload[at],
                        payload[at + 1],
                        payload[at + 2],
                        payload[at + 3],
                    ])
                };
                match kind {
                    SETTINGS if flags & 0x1 == 0 => {
                        let _ = w.lock().write_all(&frame(SETTINGS, 0x1, 0, &[]));
                    }
                    GOAWAY if len >= 8 => {
                        s.lock().goaway = Some((word(0) & 0x7fff_ffff, word(4)));
                    }
                    RST_STREAM if len >= 4 => s.lock().resets.push((id, word(0))),
                    HEADERS => s.lock().answered.push(id),
                    PING if flags & 0x1 == 0 => s.lock().pings += 1,
                    _ => {}
                }
            }
            s.lock().closed = true;
        });
        let mut c = RawH2 {
            writer,
            seen,
            written: 0,
        };
        let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        hello.extend(frame(SETTINGS, 0, 0, &[]));
        assert!(c.send(&hello), "preface");
        c
    }

    /// Write bytes; false once the server has closed (write error).
    pub(crate) fn send(&mut self, bytes: &[u8]) -> bool {
        let ok = self.writer.lock().write_all(bytes).is_ok();
        if ok {
            self.written += bytes.len();
        }
        ok
    }

    /// What the server sent so far.
    pub(crate) fn seen(&self) -> Seen {
        self.seen.lock().clone()
    }

    /// Poll until `pred` holds on what the server sent, or panic after `within`.
    pub(crate) fn wait(&self, what: &str, within: Duration, pred: impl Fn(&Seen) -> bool) -> Seen {
        let deadline = Instant::now() + within;
        loop {
            let s = self.seen();
            if pred(&s) {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "h2: timed out waiting for {what}: {s:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}
