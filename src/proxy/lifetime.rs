//! Client connection lifetime: which connections are admitted, and when an admitted one
//! is closed.
//!
//! * **Admission** ([`ConnLimits`]): at most `gateway.max_connections` client
//!   connections at once over the plain and TLS listeners together, and at most
//!   `gateway.max_connections_per_client_ip` from one client address (a peer in
//!   `trusted_proxies`, a load balancer, counts only towards the total). A connection
//!   over a limit is closed as soon as it is accepted, counted in
//!   `spillway_connections_refused_total{listener, limit}` and logged at most once per
//!   [`REFUSED_LOG_INTERVAL`] per listener with the number left unlogged. The admin
//!   listener has its own budget ([`ADMIN_MAX_CONNECTIONS`]), so a flood of proxy
//!   connections never locks the operator out. A [`ConnPermit`] lives inside the
//!   connection's byte stream ([`Tracked`]), so a connection handed to an `Upgrade`
//!   tunnel stays counted until the tunnel closes; the count is also what a graceful
//!   shutdown waits for ([`ConnLimits::all_closed`]).
//! * **Deadlines** ([`Lifetime`]), the same on HTTP/1.1 and h2, plain and TLS:
//!   - *first request*: a connection that has sent no complete request head within
//!     `header_read_timeout_seconds` of being accepted (TLS handshake included) is
//!     closed;
//!   - *header read* (HTTP/1.1): once the first byte of a next request arrived, its
//!     head must be complete within `header_read_timeout_seconds`; then closed;
//!   - *keep-alive idle*: a connection with no request in flight (h2: no open stream)
//!     for `keepalive_idle_timeout_seconds` is closed gracefully (HTTP/1.1: closed while
//!     idle; h2: GOAWAY, then closed).
//!
//!   A request is in flight from its complete head until its response body ended, so
//!   slow bodies are left to the body idle timeouts (`net::body`).
//!
//! * **Half-close** (HTTP/1.1): a client may send its request and shut down its write
//!   side (`shutdown(SHUT_WR)`) while it waits for the answer. [`Tracked`] holds back
//!   the end of the stream from hyper while a request is in flight, so the request is
//!   served and answered (HAProxy does the same), and reports it ([`ClientClosed`]): a
//!   request still waiting in the gateway queue leaves it, since a client that went away
//!   looks the same (HAProxy's `abortonclose` for queued requests). hyper's own
//!   `half_close` would hide the end of the stream from the queue too. On h2 the end of
//!   the stream ends the connection as before.
//!
//! Why not hyper's own timers: hyper's HTTP/1 header-read timer starts whenever a
//! connection goes idle, so it also cuts keep-alive connections between requests at the
//! header timeout (behind a load balancer that reuses them, its clients get 502s), and
//! hyper has no idle or first-request deadline for h2. The rules above need the byte
//! stream (the first byte of a next request) and the request/response lifetimes together,
//! which no tower layer sees, hence this module.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, ReadBuf};
use tokio::sync::Notify;
use tokio::time::Instant;

/// At most one "connection refused" log line per listener per this interval.
pub const REFUSED_LOG_INTERVAL: Duration = Duration::from_secs(5);

/// Most connections open at once on the admin listener (its own budget, apart from
/// `gateway.max_connections`).
pub const ADMIN_MAX_CONNECTIONS: usize = 32;

/// Which limit refused a connection (the `limit` label of
/// `spillway_connections_refused_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    /// `gateway.max_connections` (or the admin listener's budget).
    Total,
    /// `gateway.max_connections_per_client_ip`.
    PerClientIp,
}

impl Limit {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Limit::Total => "max_connections",
            Limit::PerClientIp => "max_connections_per_client_ip",
        }
    }
}

/// Connection budgets of one or more listeners (see the module docs). Cheap to clone.
#[derive(Clone, Debug)]
pub struct ConnLimits {
    inner: Arc<LimitsInner>,
}

#[derive(Debug)]
struct LimitsInner {
    /// `budget` label of `spillway_client_connections` (`proxy`, `admin`).
    budget: &'static str,
    max_total: usize,
    max_per_ip: usize,
    counts: Mutex<Counts>,
    /// Notified when the last connection closes.
    emptied: Notify,
    log: Mutex<HashMap<&'static str, RefusedLog>>,
}

#[derive(Debug, Default)]
struct Counts {
    total: usize,
    per_ip: HashMap<IpAddr, usize>,
}

#[derive(Debug)]
struct RefusedLog {
    last: Instant,
    unlogged: u64,
}

impl ConnLimits {
    /// A budget named `budget` of `max_total` connections, `max_per_ip` per client IP.
    pub fn new(budget: &'static str, max_total: usize, max_per_ip: usize) -> Self {
        crate::telemetry::client_connections(budget, 0);
        Self {
            inner: Arc::new(LimitsInner {
                budget,
                max_total,
                max_per_ip,
                counts: Mutex::new(Counts::default()),
                emptied: Notify::new(),
                log: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// Admit a connection from `peer` accepted on `listener`, or refuse it (metric and
    /// rate-limited log line). `per_ip_exempt`: the peer is a trusted proxy, counted only
    /// in the total.
    pub fn admit(
        &self,
        listener: &'static str,
        peer: IpAddr,
        per_ip_exempt: bool,
    ) -> Result<ConnPermit, Limit> {
        let ip = peer.to_canonical();
        let refused = {
            let mut c = self.inner.counts.lock();
            let from_ip = c.per_ip.get(&ip).copied().unwrap_or(0);
            if c.total >= self.inner.max_total {
                Some(Limit::Total)
            } else if !per_ip_exempt && from_ip >= self.inner.max_per_ip {
                Some(Limit::PerClientIp)
            } else {
                c.total += 1;
                if !per_ip_exempt {
                    c.per_ip.insert(ip, from_ip + 1);
                }
                crate::telemetry::client_connections(self.inner.budget, c.total);
                None
            }
        };
        match refused {
            None => Ok(ConnPermit {
                inner: Arc::clone(&self.inner),
                ip: (!per_ip_exempt).then_some(ip),
            }),
            Some(limit) => {
                self.refused(listener, ip, limit);
                Err(limit)
            }
        }
    }

    fn refused(&self, listener: &'static str, ip: IpAddr, limit: Limit) {
        crate::telemetry::connection_refused(listener, limit.as_str());
        let now = Instant::now();
        let mut logs = self.inner.log.lock();
        let entry = logs.entry(listener).or_insert(RefusedLog {
            last: now,
            unlogged: 0,
        });
        entry.unlogged += 1;
        if entry.unlogged == 1 || now.duration_since(entry.last) >= REFUSED_LOG_INTERVAL {
            let max = match limit {
                Limit::Total => self.inner.max_total,
                Limit::PerClientIp => self.inner.max_per_ip,
            };
            tracing::warn!(
                listener,
                client = %ip,
                limit = limit.as_str(),
                max,
                refused = entry.unlogged,
                "connection limit reached: closing new connections"
            );
            entry.last = now;
            entry.unlogged = 0;
        }
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.inner.counts.lock().total
    }

    /// Resolves once no connection of this budget is open (tunnels included).
    pub async fn all_closed(&self) {
        loop {
            let emptied = self.inner.emptied.notified();
            tokio::pin!(emptied);
            emptied.as_mut().enable();
            if self.open() == 0 {
                return;
            }
            emptied.await;
        }
    }
}

/// One admitted connection; released when dropped.
#[derive(Debug)]
pub struct ConnPermit {
    inner: Arc<LimitsInner>,
    /// The client address counted per IP (none for a trusted proxy).
    ip: Option<IpAddr>,
}

impl Drop for ConnPermit {
    fn drop(&mut self) {
        let mut c = self.inner.counts.lock();
        c.total = c.total.saturating_sub(1);
        if let Some(ip) = self.ip
            && let Some(n) = c.per_ip.get_mut(&ip)
        {
            *n -= 1;
            if *n == 0 {
                c.per_ip.remove(&ip);
            }
        }
        crate::telemetry::client_connections(self.inner.budget, c.total);
        if c.total == 0 {
            self.inner.emptied.notify_waiters();
        }
    }
}

/// The deadlines of a client connection (see the module docs).
#[derive(Clone, Copy, Debug)]
pub struct Deadlines {
    /// `gateway.header_read_timeout_seconds`: first request, and a started head.
    pub header_read: Duration,
    /// `gateway.keepalive_idle_timeout_seconds`.
    pub keepalive_idle: Duration,
}

/// Which deadline closed a connection (the `kind` label of `spillway_timeouts_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expiry {
    /// No complete request head within the header read timeout of accept.
    FirstRequest,
    /// A next request's head started and was not complete in time (HTTP/1.1).
    HeaderRead,
    /// No request for the keep-alive idle timeout.
    KeepaliveIdle,
}

impl Expiry {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Expiry::FirstRequest => "first_request",
            Expiry::HeaderRead => "header_read",
            Expiry::KeepaliveIdle => "keepalive_idle",
        }
    }
}

/// The request lifetimes of one client connection, and the deadline they imply.
#[derive(Debug)]
pub struct Lifetime {
    accepted_at: Instant,
    deadlines: Deadlines,
    state: Mutex<LifeState>,
    /// The last request in flight ended (watched while a closing connection waits to
    /// be idle).
    changed: Notify,
    /// The client's side of the stream ended (half-close or gone).
    closed: tokio::sync::watch::Sender<bool>,
}

#[derive(Debug)]
struct LifeState {
    requests: u64,
    in_flight: usize,
    idle_since: Instant,
    /// The first byte read since the connection went idle (HTTP/1.1 after a request).
    head_started: Option<Instant>,
    http2: bool,
    /// The reader waiting for the end of the stream held back while a request is in
    /// flight.
    eof_waker: Option<std::task::Waker>,
}

impl Lifetime {
    /// A connection accepted at `accepted_at`.
    pub fn new(accepted_at: Instant, deadlines: Deadlines) -> Arc<Self> {
        Arc::new(Self {
            accepted_at,
            deadlines,
            state: Mutex::new(LifeState {
                requests: 0,
                in_flight: 0,
                idle_since: accepted_at,
                head_started: None,
                http2: false,
                eof_waker: None,
            }),
            changed: Notify::new(),
            closed: tokio::sync::watch::Sender::new(false),
        })
    }

    fn state(&self) -> parking_lot::MutexGuard<'_, LifeState> {
        self.state.lock()
    }

    /// A request's head is complete; it is in flight until the guard is dropped (with
    /// its response body, or when the client cancels it).
    pub fn request_started(self: &Arc<Self>, http2: bool) -> InFlight {
        let mut s = self.state();
        s.requests += 1;
        s.in_flight += 1;
        s.head_started = None;
        s.http2 = http2;
        InFlight(Arc::clone(self))
    }

    /// Bytes arrived from the client.
    fn bytes_read(&self) {
        let mut s = self.state();
        // No wake-up: `expired` checks at `now + soonest` at the latest, which is no later
        // than this head's deadline.
        if s.in_flight == 0 && s.requests > 0 && !s.http2 && s.head_started.is_none() {
            s.head_started = Some(Instant::now());
        }
    }

    /// The client's side of the stream ended: tell [`ClientClosed`] watchers; `true`
    /// when the end is to be held back from hyper (an HTTP/1 request is in flight), and
    /// then `waker` is woken once it is not.
    fn read_ended(&self, waker: &std::task::Waker) -> bool {
        self.closed.send_replace(true);
        let mut s = self.state();
        let hold = s.in_flight > 0 && !s.http2;
        if hold {
            s.eof_waker = Some(waker.clone());
        }
        hold
    }

    /// A watcher of the client's side of the stream, for the request path.
    pub fn client_closed(&self) -> ClientClosed {
        ClientClosed(self.closed.subscribe())
    }

    /// The deadline in force: none while a request is in flight.
    pub fn deadline(&self) -> Option<(Instant, Expiry)> {
        let s = self.state();
        if s.in_flight > 0 {
            None
        } else if s.requests == 0 {
            Some((
                self.accepted_at + self.deadlines.header_read,
                Expiry::FirstRequest,
            ))
        } else if let Some(at) = s.head_started {
            Some((at + self.deadlines.header_read, Expiry::HeaderRead))
        } else {
            Some((
                s.idle_since + self.deadlines.keepalive_idle,
                Expiry::KeepaliveIdle,
            ))
        }
    }

    /// Resolves when the deadline in force passes.
    ///
    /// Checked lazily, so that a request costs no timer and no wake-up of the
    /// connection's task: a deadline only ever moves to at least `now + soonest` (the
    /// shorter of the two timeouts) — a request ending moves the keep-alive deadline to
    /// `now + keepalive_idle`, a next head starting sets `now + header_read` — so a
    /// timer set to `min(deadline in force, now + soonest)` never fires after the
    /// deadline that will be in force then. When it fires, the deadline is read again.
    /// A busy connection's task wakes once per `soonest` for this, not twice per request.
    pub async fn expired(&self) -> Expiry {
        let soonest = self
            .deadlines
            .header_read
            .min(self.deadlines.keepalive_idle)
            .max(Duration::from_millis(1));
        loop {
            let now = Instant::now();
            let check = match self.deadline() {
                Some((at, why)) if at <= now => return why,
                Some((at, _)) => at.min(now + soonest),
                None => now + soonest,
            };
            tokio::time::sleep_until(check).await;
        }
    }
}

/// One request in flight on a [`Lifetime`].
#[derive(Debug)]
pub struct InFlight(Arc<Lifetime>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut s = self.0.state();
        s.in_flight = s.in_flight.saturating_sub(1);
        if s.in_flight == 0 {
            s.idle_since = Instant::now();
            s.head_started = None;
            let eof = s.eof_waker.take();
            drop(s);
            self.0.changed.notify_one();
            if let Some(w) = eof {
                w.wake();
            }
        }
    }
}

/// Resolves once the client's side of its connection has ended (a half-close, or the
/// client went away): a request extension set by the connection server.
#[derive(Clone, Debug)]
pub struct ClientClosed(tokio::sync::watch::Receiver<bool>);

impl ClientClosed {
    /// Resolves when the client's side ended (never if the connection is gone first).
    pub async fn wait(&mut self) {
        if self.0.wait_for(|c| *c).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// A client byte stream that tells its [`Lifetime`] when bytes arrive and holds the
/// connection's [`ConnPermit`] until it is dropped (after an `Upgrade`, with the tunnel).
#[derive(Debug)]
pub struct Tracked<I> {
    io: I,
    life: Arc<Lifetime>,
    _permit: Option<ConnPermit>,
    /// The inner stream has ended.
    ended: bool,
}

impl<I> Tracked<I> {
    /// Wrap `io`.
    pub fn new(io: I, life: Arc<Lifetime>, permit: Option<ConnPermit>) -> Self {
        Self {
            io,
            life,
            _permit: permit,
            ended: false,
        }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for Tracked<I> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if this.ended {
            return if this.life.read_ended(cx.waker()) {
                Poll::Pending
            } else {
                Poll::Ready(Ok(()))
            };
        }
        let (before, room) = (buf.filled().len(), buf.remaining());
        let polled = Pin::new(&mut this.io).poll_read(cx, buf);
        if buf.filled().len() > before {
            this.life.bytes_read();
        } else if room > 0 && matches!(polled, Poll::Ready(Ok(()))) {
            // The end of the stream: held back while an HTTP/1 request is in flight.
            this.ended = true;
            if this.life.read_ended(cx.waker()) {
                return Poll::Pending;
            }
        }
        polled
    }
}

forward_async_write!(Tracked, io);

/// Serve `conn` until it ends, under `life`'s deadlines: past the first-request or
/// header-read deadline it is dropped (closed at once); past the keep-alive idle
/// deadline, or once `drain` turns true (graceful shutdown), `close_gracefully` is
/// called (HTTP/1.1: close when idle; h2: GOAWAY) and it is served until it ends — or
/// dropped once it has had no request in flight for the header read timeout since (an
/// h2 client that never acknowledges the GOAWAY's PING keeps the h2 crate waiting).
/// `abort` resolving drops it too (a client that cancels most of its requests).
pub async fn supervise<C, E>(
    mut conn: Pin<&mut C>,
    close_gracefully: impl Fn(Pin<&mut C>),
    life: &Lifetime,
    mut drain: Option<tokio::sync::watch::Receiver<bool>>,
    abort: impl Future<Output = ()>,
    peer: std::net::SocketAddr,
) -> Result<(), E>
where
    C: Future<Output = Result<(), E>>,
{
    tokio::pin!(abort);
    let mut closing: Option<Instant> = None;
    loop {
        tokio::select! {
            ended = conn.as_mut() => return ended,
            () = &mut abort => return Ok(()),
            why = life.expired(), if closing.is_none() => {
                crate::telemetry::timeout(why.as_str());
                match why {
                    Expiry::KeepaliveIdle => {
                        tracing::debug!(%peer, "client connection idle; closing");
                        close_gracefully(conn.as_mut());
                        closing = Some(Instant::now());
                    }
                    Expiry::FirstRequest | Expiry::HeaderRead => {
                        tracing::debug!(%peer, deadline = why.as_str(), "client sent no complete request head in time; closed");
                        return Ok(());
                    }
                }
            }
            () = draining(&mut drain), if closing.is_none() => {
                close_gracefully(conn.as_mut());
                closing = Some(Instant::now());
            }
            () = idle_after(life, closing.map(|at| at + life.deadlines.header_read)), if closing.is_some() => {
                return Ok(());
            }
        }
    }
}

/// Resolves once `at` has passed and no request is in flight (never without `at`).
async fn idle_after(life: &Lifetime, at: Option<Instant>) {
    let Some(at) = at else {
        return std::future::pending().await;
    };
    tokio::time::sleep_until(at).await;
    loop {
        let changed = life.changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        if life.deadline().is_some() {
            return;
        }
        changed.await;
    }
}

/// Resolves once the drain signal is true; never without one (or once its sender is
/// gone).
async fn draining(drain: &mut Option<tokio::sync::watch::Receiver<bool>>) {
    match drain {
        Some(rx) => {
            if rx.wait_for(|d| *d).await.is_err() {
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deadlines() -> Deadlines {
        Deadlines {
            header_read: Duration::from_secs(3),
            keepalive_idle: Duration::from_secs(20),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_deadline_follows_requests_and_started_heads() {
        let t0 = Instant::now();
        let life = Lifetime::new(t0, deadlines());
        assert_eq!(
            life.deadline(),
            Some((t0 + Duration::from_secs(3), Expiry::FirstRequest))
        );
        // Bytes before the first request do not move the first-request deadline.
        life.bytes_read();
        assert_eq!(life.deadline().map(|d| d.1), Some(Expiry::FirstRequest));
        let req = life.request_started(false);
        assert_eq!(life.deadline(), None);
        tokio::time::advance(Duration::from_secs(7)).await;
        drop(req);
        let idle = t0 + Duration::from_secs(7);
        assert_eq!(
            life.deadline(),
            Some((idle + Duration::from_secs(20), Expiry::KeepaliveIdle))
        );
        tokio::time::advance(Duration::from_secs(5)).await;
        life.bytes_read();
        assert_eq!(
            life.deadline(),
            Some((idle + Duration::from_secs(8), Expiry::HeaderRead))
        );
        // h2: bytes on an idle connection (PING, SETTINGS) start no head.
        let h2 = Lifetime::new(t0, deadlines());
        drop(h2.request_started(true));
        h2.bytes_read();
        assert_eq!(h2.deadline().map(|d| d.1), Some(Expiry::KeepaliveIdle));
    }

    #[tokio::test(start_paused = true)]
    async fn expired_wakes_at_the_earlier_header_deadline() {
        let life = Lifetime::new(Instant::now(), deadlines());
        drop(life.request_started(false));
        let started = Instant::now();
        let l2 = Arc::clone(&life);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            l2.bytes_read();
        });
        assert_eq!(life.expired().await, Expiry::HeaderRead);
        assert_eq!(started.elapsed(), Duration::from_secs(4));
    }

    #[test]
    fn permits_count_per_ip_and_trusted_peers_only_in_the_total() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        rt.block_on(async {
            let limits = ConnLimits::new("test", 3, 2);
            let a: IpAddr = "10.0.0.1".parse().unwrap();
            let b: IpAddr = "::ffff:10.0.0.2".parse().unwrap();
            let a1 = limits.admit("proxy", a, false).unwrap();
            let _a2 = limits.admit("proxy", a, false).unwrap();
            assert_eq!(
                limits.admit("proxy", a, false).unwrap_err(),
                Limit::PerClientIp
            );
            let _lb = limits.admit("proxy", b, true).unwrap();
            assert_eq!(limits.admit("proxy", b, true).unwrap_err(), Limit::Total);
            drop(a1);
            assert_eq!(limits.open(), 2);
            let _a3 = limits.admit("proxy", a, false).unwrap();
        });
    }
}
