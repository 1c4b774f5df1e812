//! Protocol selection for one client connection: HTTP/1.1 (with upgrades) or h2.
//!
//! On TLS the ALPN protocol decides (`h2` → h2, `http/1.1` → HTTP/1.1). On cleartext, and
//! on TLS without ALPN, the first bytes decide: the h2 connection preface (prior
//! knowledge, RFC 9113 §3.4) → h2, anything else → HTTP/1.1. The bytes read to decide are
//! replayed to the chosen connection ([`Replay`]).
//!
//! Own code rather than hyper-util's `server::conn::auto` builder, for memory. `auto`
//! reads the first bytes on their own and hands hyper a first read of at most 24 bytes,
//! so hyper parses a partial request head, reserves more room in its read buffer and
//! keeps the larger buffer for the connection's life. [`Replay`] returns the replayed
//! bytes together with what followed them in one read, so a head that arrived whole is
//! parsed whole. Measured with `loadtests/scenarios/idle_connections.py --connections
//! 4000` (release build, binaries interleaved in one run): 35.0 KiB per idle keep-alive
//! connection with `auto`, 26.6 KiB with `auto` and the request future boxed per request
//! (see `server::Connections`), 15.2 KiB with this module and the boxed future.

use std::error::Error as StdError;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http_body::Body;
use hyper::body::Incoming;
use hyper::server::conn::{http1, http2};
use hyper::service::HttpService;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The h2 client connection preface (RFC 9113 §3.4).
pub const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The protocol a client connection speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// HTTP/1.1 (and 1.0), with upgrades (WebSocket, `CONNECT`-style tunnels).
    Http1,
    /// HTTP/2.
    Http2,
}

impl Protocol {
    /// The protocol a TLS handshake chose by ALPN: `h2` or `http/1.1`; `None` when ALPN
    /// chose nothing (or something else), and the first bytes must decide.
    pub fn from_alpn(alpn: Option<&[u8]>) -> Option<Self> {
        match alpn {
            Some(b"h2") => Some(Self::Http2),
            Some(b"http/1.1") => Some(Self::Http1),
            _ => None,
        }
    }
}

/// A byte stream whose first bytes (at most the preface's 24) were read to choose the
/// protocol: reads return them first, then read on; writes go straight through.
#[derive(Debug)]
pub struct Replay<I> {
    head: [u8; H2_PREFACE.len()],
    /// `head[start..end]` is still to be replayed.
    start: u8,
    end: u8,
    /// A read error met right after the replayed bytes, returned by the next read.
    error: Option<std::io::Error>,
    io: I,
}

impl<I> Replay<I> {
    /// `io`, with `head[..len]` to be read first. `len` is at most 24.
    fn new(head: [u8; H2_PREFACE.len()], len: u8, io: I) -> Self {
        debug_assert!(usize::from(len) <= H2_PREFACE.len());
        Self {
            head,
            start: 0,
            end: len,
            error: None,
            io,
        }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for Replay<I> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if let Some(e) = this.error.take() {
            return Poll::Ready(Err(e));
        }
        if this.start < this.end {
            let rest = &this.head[usize::from(this.start)..usize::from(this.end)];
            let n = rest.len().min(buf.remaining());
            buf.put_slice(&rest[..n]);
            // n ≤ 24: fits a u8.
            this.start += n as u8;
            if this.start == this.end && buf.remaining() > 0 {
                // The rest of what the client sent, in the same read: hyper then
                // parses a request head whole instead of growing its read buffer for
                // a second read (measured: 10 KiB more per idle connection). An
                // error here is the next read's answer.
                if let Poll::Ready(Err(e)) = Pin::new(&mut this.io).poll_read(cx, buf) {
                    this.error = Some(e);
                }
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

forward_async_write!(Replay, io);

/// The two hyper connection builders, configured once for the gateway's limits.
#[derive(Debug)]
pub struct Builders {
    /// HTTP/1.1 connections.
    pub http1: http1::Builder,
    /// h2 connections.
    pub http2: http2::Builder<TokioExecutor>,
}

impl Builders {
    /// Serve `io` with `service` in the connection protocol chosen by ALPN (`alpn`, see
    /// [`Protocol::from_alpn`]) or, without one, by the first bytes the client sends.
    pub fn serve<I, S, B>(&self, io: I, service: S, alpn: Option<Protocol>) -> Connection<'_, I, S>
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
        S: HttpService<Incoming, ResBody = B> + Unpin,
        S::Error: Into<Box<dyn StdError + Send + Sync>>,
        S::Future: Send + 'static,
        B: Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<Box<dyn StdError + Send + Sync>>,
    {
        let state = match alpn {
            Some(protocol) => self.start(protocol, Replay::new([0; 24], 0, io), service),
            None => State::Choosing {
                io: Some(io),
                head: [0; H2_PREFACE.len()],
                filled: 0,
                service: Some(service),
            },
        };
        Connection {
            builders: self,
            state,
        }
    }

    fn start<I, S, B>(&self, protocol: Protocol, io: Replay<I>, service: S) -> State<I, S>
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
        S: HttpService<Incoming, ResBody = B> + Unpin,
        S::Error: Into<Box<dyn StdError + Send + Sync>>,
        S::Future: Send + 'static,
        B: Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<Box<dyn StdError + Send + Sync>>,
    {
        let io = TokioIo::new(io);
        match protocol {
            Protocol::Http1 => State::Http1(Box::pin(
                self.http1.serve_connection(io, service).with_upgrades(),
            )),
            Protocol::Http2 => State::Http2(Box::pin(self.http2.serve_connection(io, service))),
        }
    }
}

/// One client connection being served: first choosing its protocol, then the chosen
/// hyper connection. Resolves when the connection ends; the error is the connection's
/// protocol or I/O error.
pub struct Connection<'b, I, S: HttpService<Incoming>> {
    builders: &'b Builders,
    state: State<I, S>,
}

/// The byte stream a chosen hyper connection reads.
type Io<I> = TokioIo<Replay<I>>;

// Not `Debug`: hyper's connections are not, and the service is a closure.
enum State<I, S: HttpService<Incoming>> {
    /// Reading the first bytes (at most the h2 preface's 24) to choose the protocol.
    Choosing {
        io: Option<I>,
        head: [u8; H2_PREFACE.len()],
        filled: u8,
        service: Option<S>,
    },
    Http1(Pin<Box<http1::UpgradeableConnection<Io<I>, S>>>),
    Http2(Pin<Box<http2::Connection<Io<I>, S, TokioExecutor>>>),
    /// Closed before the protocol was chosen (graceful shutdown).
    Closed,
}

/// Reads into `head[filled..]` until the bytes are the whole h2 preface, differ from it,
/// or the stream ends (HTTP/1.1 then: hyper answers what it read or closes).
fn poll_choose<I: AsyncRead + Unpin>(
    io: &mut I,
    head: &mut [u8; H2_PREFACE.len()],
    filled: &mut u8,
    cx: &mut Context<'_>,
) -> Poll<std::io::Result<Protocol>> {
    loop {
        let n = usize::from(*filled);
        if n == H2_PREFACE.len() {
            return Poll::Ready(Ok(Protocol::Http2));
        }
        let mut buf = ReadBuf::new(&mut head[n..]);
        ready!(Pin::new(&mut *io).poll_read(cx, &mut buf))?;
        let got = buf.filled().len();
        if got == 0 {
            return Poll::Ready(Ok(Protocol::Http1));
        }
        // got ≤ 24 - n: fits a u8.
        *filled += got as u8;
        let n = usize::from(*filled);
        if head[..n] != H2_PREFACE[..n] {
            return Poll::Ready(Ok(Protocol::Http1));
        }
    }
}

impl<I, S, B> Connection<'_, I, S>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: HttpService<Incoming, ResBody = B> + Unpin,
    S::Error: Into<Box<dyn StdError + Send + Sync>>,
    S::Future: Send + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn StdError + Send + Sync>>,
{
    /// Start a graceful shutdown: HTTP/1.1 closes after the request in flight, h2 sends
    /// GOAWAY and lets its streams finish; a connection still choosing its protocol
    /// closes at once.
    pub fn graceful_shutdown(mut self: Pin<&mut Self>) {
        match &mut self.state {
            State::Choosing { .. } => self.state = State::Closed,
            State::Http1(c) => c.as_mut().graceful_shutdown(),
            State::Http2(c) => c.as_mut().graceful_shutdown(),
            State::Closed => {}
        }
    }
}

impl<I, S, B> Future for Connection<'_, I, S>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: HttpService<Incoming, ResBody = B> + Unpin,
    S::Error: Into<Box<dyn StdError + Send + Sync>>,
    S::Future: Send + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn StdError + Send + Sync>>,
{
    type Output = Result<(), Box<dyn StdError + Send + Sync>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        loop {
            match &mut this.state {
                State::Choosing {
                    io,
                    head,
                    filled,
                    service,
                } => {
                    let stream = io.as_mut().expect("a choosing connection has its stream");
                    let protocol = ready!(poll_choose(stream, head, filled, cx))?;
                    let (Some(io), Some(service)) = (io.take(), service.take()) else {
                        unreachable!("taken once, when the protocol is chosen")
                    };
                    let replay = Replay::new(*head, *filled, io);
                    this.state = this.builders.start(protocol, replay, service);
                }
                State::Http1(c) => return c.as_mut().poll(cx).map_err(Into::into),
                State::Http2(c) => return c.as_mut().poll(cx).map_err(Into::into),
                State::Closed => return Poll::Ready(Ok(())),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// What the chooser decides for `sent` (written in `chunks`), and the bytes the
    /// chosen connection then reads: exactly what the client sent.
    async fn choose(sent: &[u8], chunk: usize) -> (Protocol, Vec<u8>) {
        let (mut client, server) = tokio::io::duplex(64);
        let sent = sent.to_vec();
        let writer = tokio::spawn(async move {
            for c in sent.chunks(chunk) {
                client.write_all(c).await.unwrap();
                client.flush().await.unwrap();
                tokio::task::yield_now().await;
            }
            client.shutdown().await.unwrap();
        });
        let mut io = server;
        let mut head = [0; 24];
        let mut filled = 0;
        let protocol = std::future::poll_fn(|cx| poll_choose(&mut io, &mut head, &mut filled, cx))
            .await
            .unwrap();
        let mut replay = Replay::new(head, filled, io);
        let mut read = Vec::new();
        replay.read_to_end(&mut read).await.unwrap();
        writer.await.unwrap();
        (protocol, read)
    }

    #[tokio::test]
    async fn the_h2_preface_chooses_h2_and_is_replayed_whole_even_sent_a_byte_at_a_time() {
        let mut sent = H2_PREFACE.to_vec();
        sent.extend_from_slice(b"\x00\x00\x00\x04\x00\x00\x00\x00\x00");
        for chunk in [1, 5, 24, 64] {
            let (protocol, read) = choose(&sent, chunk).await;
            assert_eq!(protocol, Protocol::Http2, "chunks of {chunk}");
            assert_eq!(read, sent, "chunks of {chunk}");
        }
    }

    #[tokio::test]
    async fn an_http1_request_chooses_http1_at_its_first_byte_and_loses_nothing() {
        let sent = b"GET / HTTP/1.1\r\nhost: a\r\n\r\n".to_vec();
        for chunk in [1, 3, 64] {
            let (protocol, read) = choose(&sent, chunk).await;
            assert_eq!(protocol, Protocol::Http1, "chunks of {chunk}");
            assert_eq!(read, sent, "chunks of {chunk}");
        }
    }

    #[tokio::test]
    async fn a_request_that_starts_like_the_preface_but_differs_is_http1() {
        // `PRI` is a valid HTTP/1.1 method name; only the whole preface means h2.
        let sent = b"PRI * HTTP/1.1\r\nhost: a\r\n\r\n".to_vec();
        let (protocol, read) = choose(&sent, 4).await;
        assert_eq!(protocol, Protocol::Http1);
        assert_eq!(read, sent);
    }

    #[tokio::test]
    async fn a_stream_that_ends_inside_the_preface_is_http1_with_what_was_sent() {
        let sent = H2_PREFACE[..10].to_vec();
        let (protocol, read) = choose(&sent, 3).await;
        assert_eq!(protocol, Protocol::Http1);
        assert_eq!(read, sent);
    }

    #[tokio::test]
    async fn the_first_read_after_choosing_returns_the_replayed_bytes_and_what_followed_them() {
        // hyper parses a head that arrived whole in one read; split in two reads, it
        // grows its read buffer (the memory of every idle connection).
        let sent = b"GET /a/longer/path HTTP/1.1\r\nhost: a\r\n\r\n";
        let (mut client, mut io) = tokio::io::duplex(256);
        client.write_all(sent).await.unwrap();
        let mut head = [0; 24];
        let mut filled = 0;
        let protocol = std::future::poll_fn(|cx| poll_choose(&mut io, &mut head, &mut filled, cx))
            .await
            .unwrap();
        assert_eq!(protocol, Protocol::Http1);
        let mut replay = Replay::new(head, filled, io);
        let mut buf = [0; 256];
        let n = replay.read(&mut buf).await.unwrap();
        assert_eq!(&buf[..n], &sent[..]);
    }

    #[test]
    fn alpn_chooses_only_the_protocols_it_names() {
        assert_eq!(Protocol::from_alpn(Some(b"h2")), Some(Protocol::Http2));
        assert_eq!(
            Protocol::from_alpn(Some(b"http/1.1")),
            Some(Protocol::Http1)
        );
        assert_eq!(Protocol::from_alpn(Some(b"h3")), None);
        assert_eq!(Protocol::from_alpn(None), None);
    }
}
