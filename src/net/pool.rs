//! The upstream connection pool of [`UpstreamClient`](super::client::UpstreamClient),
//! on hyper's connection API (`hyper::client::conn::{http1, http2}`), and the response
//! body that gives an HTTP/1.1 connection back when it ends ([`UpstreamBody`]).
//!
//! **Why home-made.** hyper-util's legacy client (its pool, `send_request`) was the
//! next named cost of the data plane's CPU per request: one pool for every thread
//! behind one mutex, so no per-thread affinity; a checkout that races a connect against
//! the idle list; and a task spawned per request to put the connection back once it is
//! ready again. spillway already runs one current-thread runtime per core, each with its
//! own pool shard: what it needs of a pool is small, and hyper's connection API gives the
//! rest (the idle-or-closed state of a connection, the request back when it was not
//! sent).
//!
//! **Shape.** A [`Pool`] is split in shards (one per data-plane worker, plus one for the
//! control threads; the client picks the calling thread's shard). A shard holds, per
//! upstream ([`Key`]: scheme and authority), its idle HTTP/1.1 connections with the
//! instant each became idle, and at most one HTTP/2 connection, shared by cloning its
//! sender for every request. A shard's lock is only ever taken by its own thread (or
//! threads, when there are more workers than cores), so it is uncontended; it is a
//! lock rather than a thread-local so that a response body ending on another thread
//! still finds its way back.
//!
//! * **Checkout** (`Pool::checkout`): the shared h2 connection if it is still open;
//!   else the most recently idle h1 connection that is open and ready. Entries idle for
//!   longer than the idle timeout are dropped on the way (closing them), as are
//!   connections the upstream closed.
//! * **Return**: an h1 connection goes back when its response body has ended
//!   ([`UpstreamBody`]: the last frame, or a body that had already ended when it was
//!   dropped). A body dropped before its end takes its connection with it (hyper closes
//!   it), and so does a `101 Switching Protocols` (the connection became a tunnel).
//! * **Bound**: at most [`MAX_IDLE_PER_UPSTREAM`] idle h1 connections per upstream and
//!   shard; past it the oldest is closed, so a burst cannot hold thousands open. Expired
//!   entries are also dropped when a connection comes back.
//! * **Sweep**: a shard's first connection starts one task on that thread's runtime that
//!   every half idle timeout (at least 50 ms) closes the shard's expired h1 connections,
//!   its h2 connections unused for the idle timeout, and forgets connections the
//!   upstream closed — so a connection to an upstream that gets no more requests (a VM
//!   scaled in, a function endpoint no longer used) is closed within 1.5 idle timeouts
//!   rather than held until the upstream closes it. The task ends with the pool (it holds
//!   it weakly) or its runtime (the next connection starts another).

use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::Uri;
use http_body::{Body as _, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::{http1, http2};
use parking_lot::Mutex;
use tokio::time::Instant;

use super::body::Body;

/// Most idle HTTP/1.1 connections a shard keeps per upstream; the oldest is closed
/// beyond it.
pub const MAX_IDLE_PER_UPSTREAM: usize = 256;

/// Which upstream a connection belongs to: the URL's scheme and authority (host and
/// port as written).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Key {
    scheme: http::uri::Scheme,
    authority: http::uri::Authority,
}

impl Key {
    /// The key of an absolute URL; `None` without a scheme or an authority.
    pub fn of(uri: &Uri) -> Option<Self> {
        Some(Self {
            scheme: uri.scheme()?.clone(),
            authority: uri.authority()?.clone(),
        })
    }
}

/// A connection ready for a request: an HTTP/1.1 one (one request at a time) or a
/// clone of an HTTP/2 one's sender.
pub(crate) enum Conn {
    /// HTTP/1.1: exclusively this request's until its response body ends.
    H1(http1::SendRequest<Body>),
    /// HTTP/2: shared.
    H2(http2::SendRequest<Body>),
}

/// Idle connections of one upstream in one shard.
#[derive(Default)]
struct Idle {
    /// Oldest first: (sender, idle since).
    h1: VecDeque<(http1::SendRequest<Body>, Instant)>,
    /// The shared h2 connection and when a request last checked it out.
    h2: Option<(http2::SendRequest<Body>, Instant)>,
}

impl Idle {
    /// Drop the h1 entries idle for `timeout` or longer at `now` (the oldest are first).
    fn expire(&mut self, now: Instant, timeout: Duration) {
        while self
            .h1
            .front()
            .is_some_and(|(_, since)| now.saturating_duration_since(*since) >= timeout)
        {
            self.h1.pop_front();
        }
    }

    /// [`Self::expire`], then drop what the upstream closed and an h2 connection unused
    /// for `timeout`; whether nothing is left.
    fn sweep(&mut self, now: Instant, timeout: Duration) -> bool {
        self.expire(now, timeout);
        self.h1.retain(|(tx, _)| !tx.is_closed());
        if self.h2.as_ref().is_some_and(|(tx, used)| {
            tx.is_closed() || now.saturating_duration_since(*used) >= timeout
        }) {
            self.h2 = None;
        }
        self.h1.is_empty() && self.h2.is_none()
    }
}

/// The pool: see the [module docs](self).
pub struct Pool {
    shards: Box<[Mutex<HashMap<Key, Idle>>]>,
    /// Per shard: whether its sweep task runs.
    sweeping: Box<[AtomicBool]>,
    idle_timeout: Duration,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("shards", &self.shards.len())
            .field("idle_timeout", &self.idle_timeout)
            .finish_non_exhaustive()
    }
}

impl Pool {
    /// A pool of `shards` shards (at least one) whose connections idle for
    /// `idle_timeout` are closed.
    pub fn new(shards: usize, idle_timeout: Duration) -> Arc<Self> {
        Arc::new(Self {
            shards: (0..shards.max(1)).map(|_| Mutex::default()).collect(),
            sweeping: (0..shards.max(1)).map(|_| AtomicBool::new(false)).collect(),
            idle_timeout,
        })
    }

    /// Number of shards.
    pub fn shards(&self) -> usize {
        self.shards.len()
    }

    /// A pooled connection to `key` from shard `shard`, if one is open and ready: the
    /// h2 connection, else the most recently idle h1 one. Expired and closed entries are
    /// dropped on the way; h1 connections not ready yet (their last exchange is still
    /// being finished by the connection task) stay.
    pub(crate) fn checkout(&self, shard: usize, key: &Key) -> Option<Conn> {
        let mut upstreams = self.shards[shard].lock();
        let idle = upstreams.get_mut(key)?;
        if let Some((h2, used)) = &mut idle.h2 {
            if !h2.is_closed() {
                *used = Instant::now();
                return Some(Conn::H2(h2.clone()));
            }
            idle.h2 = None;
        }
        idle.expire(Instant::now(), self.idle_timeout);
        let mut i = idle.h1.len();
        while i > 0 {
            i -= 1;
            let (tx, _) = &idle.h1[i];
            if tx.is_closed() {
                idle.h1.remove(i);
            } else if tx.is_ready() {
                return idle.h1.remove(i).map(|(tx, _)| Conn::H1(tx));
            }
        }
        None
    }

    /// Make `tx` the shared h2 connection of `key` in shard `shard`.
    pub(crate) fn put_h2(&self, shard: usize, key: Key, tx: http2::SendRequest<Body>) {
        self.shards[shard].lock().entry(key).or_default().h2 = Some((tx, Instant::now()));
    }

    /// Start shard `shard`'s sweep task on the calling thread's runtime unless it runs
    /// (see the [module docs](self)); called where a connection's task is spawned.
    pub(crate) fn ensure_sweep(self: &Arc<Self>, shard: usize) {
        if self.sweeping[shard].swap(true, Ordering::AcqRel) {
            return;
        }
        /// Marks the shard's sweep as stopped when its task ends or is dropped with its
        /// runtime, so that the next connection starts one again.
        struct Running(Weak<Pool>, usize);
        impl Drop for Running {
            fn drop(&mut self) {
                if let Some(pool) = self.0.upgrade() {
                    pool.sweeping[self.1].store(false, Ordering::Release);
                }
            }
        }
        let running = Running(Arc::downgrade(self), shard);
        let period = (self.idle_timeout / 2).max(Duration::from_millis(50));
        tokio::spawn(async move {
            let running = running;
            let mut tick = tokio::time::interval_at(Instant::now() + period, period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(pool) = running.0.upgrade() else {
                    return;
                };
                pool.sweep(shard, Instant::now());
            }
        });
    }

    /// Close shard `shard`'s expired connections and forget closed ones at `now`.
    fn sweep(&self, shard: usize, now: Instant) {
        self.shards[shard]
            .lock()
            .retain(|_, idle| !idle.sweep(now, self.idle_timeout));
    }

    /// An h1 connection back, idle from now.
    fn put_h1(&self, shard: usize, key: Key, tx: http1::SendRequest<Body>) {
        if tx.is_closed() {
            return;
        }
        let now = Instant::now();
        let mut upstreams = self.shards[shard].lock();
        let idle = upstreams.entry(key).or_default();
        idle.expire(now, self.idle_timeout);
        if idle.h1.len() >= MAX_IDLE_PER_UPSTREAM {
            idle.h1.pop_front();
        }
        idle.h1.push_back((tx, now));
    }

    /// Idle h1 connections of `key` in shard `shard` (tests).
    #[cfg(test)]
    pub(crate) fn idle_h1(&self, shard: usize, key: &Key) -> usize {
        self.shards[shard].lock().get(key).map_or(0, |i| i.h1.len())
    }

    /// Idle h1 connections of `key` in shard `shard` that are ready (tests).
    #[cfg(test)]
    pub(crate) fn ready_h1(&self, shard: usize, key: &Key) -> usize {
        self.shards[shard]
            .lock()
            .get(key)
            .map_or(0, |i| i.h1.iter().filter(|(tx, _)| tx.is_ready()).count())
    }
}

/// Where an h1 connection goes back when its response body ends.
pub(crate) struct Return {
    pub(crate) pool: Arc<Pool>,
    pub(crate) shard: usize,
    pub(crate) key: Key,
    pub(crate) tx: http1::SendRequest<Body>,
}

/// An upstream response body: hyper's [`Incoming`], which gives its HTTP/1.1
/// connection back to the pool when it ends (see the [module docs](self)). Frames,
/// errors and size hints are `Incoming`'s.
pub struct UpstreamBody {
    inner: Incoming,
    back: Option<Return>,
}

impl std::fmt::Debug for UpstreamBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamBody")
            .field("inner", &self.inner)
            .field("pooled", &self.back.is_some())
            .finish()
    }
}

impl UpstreamBody {
    /// `inner`, returning `back`'s connection when it ends (an already ended body
    /// returns it at once).
    pub(crate) fn new(inner: Incoming, back: Option<Return>) -> Self {
        let mut body = Self { inner, back };
        if body.inner.is_end_stream() {
            body.give_back();
        }
        body
    }

    fn give_back(&mut self) {
        if let Some(Return {
            pool,
            shard,
            key,
            tx,
        }) = self.back.take()
        {
            pool.put_h1(shard, key, tx);
        }
    }
}

impl http_body::Body for UpstreamBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(None) => this.give_back(),
            Poll::Ready(Some(Ok(_))) if this.inner.is_end_stream() => this.give_back(),
            // The connection failed with the body: hyper closes it.
            Poll::Ready(Some(Err(_))) => this.back = None,
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for UpstreamBody {
    fn drop(&mut self) {
        // Read to its end without the last poll (a reader that stops at the length):
        // the connection is idle and goes back; otherwise it closes with `tx`.
        if self.back.is_some() && self.inner.is_end_stream() {
            self.give_back();
        }
    }
}

#[cfg(test)]
mod tests {
    //! The pool on real loopback sockets (reuse, a dropped body, shard isolation) and on
    //! in-memory streams where the test must control the order of events (idle expiry
    //! under paused time, a connection that closes between checkout and send).
    use std::net::SocketAddr;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use http_body_util::{BodyExt, Full};
    use hyper_util::rt::TokioIo;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::net::client::{ClientSettings, UpstreamClient};

    const LONG: Duration = Duration::from_secs(10);

    fn settings(idle: Duration) -> ClientSettings {
        ClientSettings {
            connect_timeout: Duration::from_secs(2),
            idle_timeout: idle,
        }
    }

    fn get(path: &str, thread: &str) -> http::Request<Body> {
        http::Request::get(path)
            .header("x-thread", thread)
            .body(crate::net::body::empty())
            .unwrap()
    }

    /// A loopback HTTP/1.1 upstream on its own thread: answers every request with
    /// `body_bytes` bytes and records (connection number, `x-thread`) per request.
    struct Upstream {
        base: Uri,
        accepted: Arc<AtomicUsize>,
        closed: Arc<AtomicUsize>,
        seen: Arc<Mutex<Vec<(usize, String)>>>,
    }

    impl Upstream {
        fn start(body_bytes: usize) -> Self {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.set_nonblocking(true).unwrap();
            let addr: SocketAddr = listener.local_addr().unwrap();
            let accepted = Arc::new(AtomicUsize::new(0));
            let closed = Arc::new(AtomicUsize::new(0));
            let seen = Arc::new(Mutex::new(Vec::new()));
            let (a, c, s) = (accepted.clone(), closed.clone(), seen.clone());
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async move {
                    let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                    loop {
                        let (tcp, _) = listener.accept().await.unwrap();
                        let conn = a.fetch_add(1, Ordering::SeqCst);
                        let (c, s) = (c.clone(), s.clone());
                        tokio::spawn(async move {
                            let svc =
                                hyper::service::service_fn(move |req: http::Request<Incoming>| {
                                    let thread = req
                                        .headers()
                                        .get("x-thread")
                                        .and_then(|v| v.to_str().ok())
                                        .unwrap_or("-")
                                        .to_string();
                                    s.lock().push((conn, thread));
                                    async move {
                                        Ok::<_, std::convert::Infallible>(http::Response::new(
                                            Full::new(Bytes::from(vec![b'x'; body_bytes])),
                                        ))
                                    }
                                });
                            let _ = hyper::server::conn::http1::Builder::new()
                                .serve_connection(TokioIo::new(tcp), svc)
                                .await;
                            c.fetch_add(1, Ordering::SeqCst);
                        });
                    }
                });
            });
            Self {
                base: format!("http://{addr}").parse().unwrap(),
                accepted,
                closed,
                seen,
            }
        }

        fn accepted(&self) -> usize {
            self.accepted.load(Ordering::SeqCst)
        }
    }

    async fn read_all(client: &UpstreamClient, base: &Uri, path: &str, thread: &str) -> usize {
        let resp = client.forward(base, get(path, thread)).await.unwrap();
        assert_eq!(resp.status(), http::StatusCode::OK);
        resp.into_body().collect().await.unwrap().to_bytes().len()
    }

    #[tokio::test]
    async fn sequential_requests_share_one_connection() {
        let upstream = Upstream::start(100);
        let client = UpstreamClient::new(settings(LONG));
        for i in 0..10 {
            assert_eq!(
                read_all(&client, &upstream.base, &format!("/{i}"), "t").await,
                100
            );
        }
        assert_eq!(upstream.seen.lock().len(), 10);
        assert_eq!(upstream.accepted(), 1, "one TCP connection for 10 requests");
    }

    #[tokio::test]
    async fn a_response_body_dropped_unread_takes_its_connection_with_it() {
        let upstream = Upstream::start(256 * 1024);
        let client = UpstreamClient::new(settings(LONG));
        let resp = client
            .forward(&upstream.base, get("/a", "t"))
            .await
            .unwrap();
        assert_eq!(resp.status(), http::StatusCode::OK);
        drop(resp);
        let deadline = Instant::now() + LONG;
        while upstream.closed.load(Ordering::SeqCst) < 1 {
            assert!(
                Instant::now() < deadline,
                "the dropped body's connection was never closed"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(
            read_all(&client, &upstream.base, "/b", "t").await,
            256 * 1024
        );
        assert_eq!(
            upstream.accepted(),
            2,
            "the second request had to connect anew"
        );
        // A body read to its end does give its connection back.
        assert_eq!(
            read_all(&client, &upstream.base, "/c", "t").await,
            256 * 1024
        );
        assert_eq!(upstream.accepted(), 2);
    }

    /// Requests on two worker threads (each its own current-thread runtime and pool
    /// shard) through one client never share a connection.
    #[test]
    fn two_worker_threads_never_share_a_connection() {
        let upstream = Arc::new(Upstream::start(10));
        let mut client = UpstreamClient::new(settings(LONG));
        // Two worker shards whatever this machine's core count.
        client.pool = Pool::new(3, LONG);
        let threads: Vec<_> = (0..2)
            .map(|worker| {
                let (client, upstream) = (client.clone(), upstream.clone());
                std::thread::spawn(move || {
                    crate::net::client::set_pool_shard(worker);
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .unwrap();
                    rt.block_on(async {
                        for i in 0..5 {
                            let path = format!("/{worker}/{i}");
                            read_all(&client, &upstream.base, &path, &worker.to_string()).await;
                        }
                    });
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let seen = upstream.seen.lock().clone();
        assert_eq!(seen.len(), 10);
        for conn in 0..upstream.accepted() {
            let users: std::collections::BTreeSet<_> = seen
                .iter()
                .filter(|(c, _)| *c == conn)
                .map(|(_, t)| t)
                .collect();
            assert!(
                users.len() <= 1,
                "connection {conn} served threads {users:?}"
            );
        }
        assert_eq!(
            upstream.accepted(),
            2,
            "each thread reused its own connection"
        );
    }

    /// Serve every in-memory connection with hyper, counting them.
    fn serve_in_memory(
        mut accepted: tokio::sync::mpsc::UnboundedReceiver<tokio::io::DuplexStream>,
    ) -> Arc<AtomicUsize> {
        let count = Arc::new(AtomicUsize::new(0));
        let c = count.clone();
        tokio::spawn(async move {
            while let Some(io) = accepted.recv().await {
                c.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(serve_one(io, "served"));
            }
        });
        count
    }

    async fn serve_one(io: tokio::io::DuplexStream, answer: &'static str) {
        let svc = hyper::service::service_fn(move |_req: http::Request<Incoming>| async move {
            Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(Bytes::from(answer))))
        });
        let _ = hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(io), svc)
            .await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_idle_for_the_idle_timeout_is_not_reused() {
        let idle = Duration::from_secs(10);
        let (client, accepted) = UpstreamClient::in_memory(settings(idle), 64 * 1024);
        let connections = serve_in_memory(accepted);
        let base: Uri = "http://upstream.test".parse().unwrap();
        let key = Key::of(&base).unwrap();
        read_all(&client, &base, "/1", "t").await;
        tokio::time::advance(idle - Duration::from_millis(1)).await;
        read_all(&client, &base, "/2", "t").await;
        assert_eq!(
            connections.load(Ordering::SeqCst),
            1,
            "reused within the idle timeout"
        );
        tokio::time::advance(idle).await;
        read_all(&client, &base, "/3", "t").await;
        assert_eq!(
            connections.load(Ordering::SeqCst),
            2,
            "a new connection after it"
        );
        assert_eq!(
            client.pool.idle_h1(0, &key),
            1,
            "the expired one was dropped"
        );
    }

    /// A connection to an upstream that gets no more requests is closed by the shard's
    /// sweep within 1.5 idle timeouts, not held until the upstream closes it.
    #[tokio::test(start_paused = true)]
    async fn an_idle_connection_no_request_comes_for_is_closed_by_the_sweep() {
        let idle = Duration::from_secs(10);
        let (client, mut accepted) = UpstreamClient::in_memory(settings(idle), 64 * 1024);
        let closed = Arc::new(AtomicUsize::new(0));
        let c = closed.clone();
        tokio::spawn(async move {
            while let Some(io) = accepted.recv().await {
                let c = c.clone();
                tokio::spawn(async move {
                    serve_one(io, "served").await;
                    c.fetch_add(1, Ordering::SeqCst);
                });
            }
        });
        let base: Uri = "http://upstream.test".parse().unwrap();
        let key = Key::of(&base).unwrap();
        read_all(&client, &base, "/1", "t").await;
        tokio::time::sleep(idle - Duration::from_millis(1)).await;
        assert_eq!(
            client.pool.idle_h1(0, &key),
            1,
            "still pooled before the timeout"
        );
        assert_eq!(closed.load(Ordering::SeqCst), 0);
        tokio::time::sleep(idle / 2 + Duration::from_millis(2)).await;
        assert_eq!(client.pool.idle_h1(0, &key), 0, "swept");
        // The upstream sees the connection end (its serving task returns).
        for _ in 0..100 {
            if closed.load(Ordering::SeqCst) == 1 {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(
            closed.load(Ordering::SeqCst),
            1,
            "the upstream saw it closed"
        );
        // The sweep goes on: a later connection is swept too.
        read_all(&client, &base, "/2", "t").await;
        tokio::time::sleep(idle * 2).await;
        assert_eq!(client.pool.idle_h1(0, &key), 0);
    }

    /// The upstream closes an idle pooled connection just as a request checks it out:
    /// hyper hands the unsent request back and it goes out on a new connection.
    #[tokio::test]
    async fn a_pooled_connection_closed_before_the_request_went_out_sends_it_anew() {
        let (client, mut accepted) = UpstreamClient::in_memory(settings(LONG), 64 * 1024);
        let base: Uri = "http://upstream.test".parse().unwrap();
        let key = Key::of(&base).unwrap();
        let first = tokio::spawn({
            let (client, base) = (client.clone(), base.clone());
            async move { read_all(&client, &base, "/one", "t").await }
        });
        // The first connection is served by hand, so that the test closes it.
        let mut far = accepted.recv().await.unwrap();
        let mut head = Vec::new();
        let mut buf = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = far.read(&mut buf).await.unwrap();
            assert!(n > 0, "request head");
            head.extend_from_slice(&buf[..n]);
        }
        far.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\none")
            .await
            .unwrap();
        assert_eq!(first.await.unwrap(), 3);
        let mut polls = 0;
        while client.pool.ready_h1(0, &key) < 1 {
            polls += 1;
            assert!(polls < 1000, "the connection came back ready");
            tokio::task::yield_now().await;
        }
        // Closed by the upstream; its connection task has not run since, so the
        // checkout below still finds it open and ready.
        drop(far);
        tokio::spawn(async move {
            if let Some(io) = accepted.recv().await {
                serve_one(io, "two").await;
            }
        });
        let body = client
            .forward(&base, get("/two", "t"))
            .await
            .expect("sent again on a new connection")
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes();
        assert_eq!(&body[..], b"two");
    }

    #[tokio::test]
    async fn idle_connections_per_upstream_are_bounded() {
        let (client, accepted) = UpstreamClient::in_memory(settings(LONG), 1024);
        let connections = serve_in_memory(accepted);
        let base: Uri = "http://upstream.test".parse().unwrap();
        let key = Key::of(&base).unwrap();
        // A burst: every request in flight at once, each on its own connection.
        let burst = MAX_IDLE_PER_UPSTREAM + 20;
        let responses = futures_join_all(&client, &base, burst).await;
        assert_eq!(connections.load(Ordering::SeqCst), burst);
        for resp in responses {
            resp.into_body().collect().await.unwrap();
        }
        assert_eq!(client.pool.idle_h1(0, &key), MAX_IDLE_PER_UPSTREAM);
    }

    /// `n` requests started together; their responses (heads) once all arrived.
    async fn futures_join_all(
        client: &UpstreamClient,
        base: &Uri,
        n: usize,
    ) -> Vec<http::Response<UpstreamBody>> {
        let mut set = tokio::task::JoinSet::new();
        for i in 0..n {
            let (client, base) = (client.clone(), base.clone());
            set.spawn(async move { client.forward(&base, get(&format!("/{i}"), "t")).await });
        }
        let mut out = Vec::new();
        while let Some(r) = set.join_next().await {
            out.push(r.unwrap().unwrap());
        }
        out
    }
}
