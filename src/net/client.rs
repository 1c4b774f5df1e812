//! The upstream HTTP client: one keep-alive connection pool shared by the VM pool and the
//! function tier, with connect and idle timeouts, and [`forward`], which sends a request
//! to an upstream base URL and tells connect failures (nothing sent, safe to retry) apart
//! from failures after the request left.
//!
//! The connector ([`TcpConnector`]) is hyper-util's [`HttpConnector`] (connect timeout,
//! `TCP_NODELAY`, happy eyeballs) with two layers of spillway's own around it:
//!
//! * **the address policy** ([`crate::net::upstream::AddressPolicy`]) at connect time: a
//!   resolver that drops every resolved address the policy refuses (so a host name that
//!   resolves, or later re-resolves, to a metadata or loopback address is never
//!   connected to), a check of IP-literal hosts before connecting, and a check of every
//!   new connection's peer (the gateway's own listeners, which need the port);
//! * **TLS** for `https://` upstreams (tokio-rustls over the TCP stream): the server
//!   name and SNI from the URL's host, the roots, CA bundle and client certificate of
//!   [`crate::net::tls::load_client_config`], and h2 when the upstream picks it by ALPN.
//!
//! A connection refused by the policy or a failed handshake is an
//! [`UpstreamError::Connect`] (nothing was sent) whose message says why.
//!
//! **The pool** is spillway's own ([`super::pool`], which says why), on hyper's
//! connection API: HTTP/1.1 connections one request at a time, returned when their
//! response body ends, and one shared h2 connection per upstream when the upstream picks
//! h2 by ALPN. It is split in shards, one per core plus one (shard 0) for the control
//! threads (driver, probes, admin). A data-plane worker thread picks its shard once with
//! [`set_pool_shard`]; its requests then reuse only connections that its own thread
//! opened and drives (a connection's task is spawned on the runtime that opened it), so
//! a request never wakes another thread for its upstream I/O.
//!
//! A pooled connection the upstream closed while idle is dropped at checkout; one that
//! closes as the request goes out, before hyper wrote any of it, sends the request once
//! more on a new connection (hyper hands the request back). A bodiless request whose h2
//! stream the upstream refused unprocessed is sent once more too (see
//! [`UpstreamClient::forward`]).
//!
//! [`forward`]: UpstreamClient::forward

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response, Uri};
use hyper::client::conn::{http1, http2};
// hyper-util's connector (not its client): connect timeout, happy eyeballs, resolver.
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::connect::dns::Name;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::DuplexStream;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use super::body::Body;
use super::pool::{Conn, Key, Pool, Return, UpstreamBody};
use super::upstream::{AddressError, AddressPolicy};

/// Client settings.
#[derive(Clone, Copy, Debug)]
pub struct ClientSettings {
    /// TCP connect timeout.
    pub connect_timeout: Duration,
    /// Pooled connections idle longer than this are closed.
    pub idle_timeout: Duration,
}

thread_local! {
    /// The pool shard of this thread ([`set_pool_shard`]); 0: a control thread.
    static POOL_SHARD: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Make this thread use pool shard `worker + 1` of every [`UpstreamClient`] (shard 0
/// stays the control threads'): called once by data-plane worker `worker` (0-based)
/// when its thread starts. With more workers than cores, workers share shards.
pub fn set_pool_shard(worker: usize) {
    POOL_SHARD.with(|s| s.set(worker.saturating_add(1)));
}

/// Pool shards of a client: one per core, plus shard 0 for the control threads.
fn pool_shards() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get) + 1
}

/// Pooled HTTP/1.1 client towards upstreams (VMs, function instances, HTTP function
/// endpoints); h2 towards HTTPS upstreams that choose it by ALPN. Cheap to clone.
#[derive(Clone, Debug)]
pub struct UpstreamClient {
    /// The pool, one shard per core plus the control threads' (see the [module
    /// docs](self)).
    pub(super) pool: Arc<Pool>,
    connector: Connector,
    /// HTTP/1.1 handshakes (the response head limits).
    h1: http1::Builder,
    /// h2 handshakes (upstreams that pick h2 by ALPN).
    h2: http2::Builder<TokioExecutor>,
    /// The connect-time address policy (absent for in-memory connections).
    policy: Option<AddressPolicy>,
}

/// How the client reaches an upstream: TCP (the gateway), or in-memory streams handed
/// to a local server task (benches and tests of the whole request path without sockets).
#[derive(Clone, Debug)]
pub enum Connector {
    /// TCP (and TLS for `https://`) under the address policy.
    Tcp(TcpConnector),
    /// Every connection is one end of a [`tokio::io::duplex`] pair; the other end goes
    /// to the receiver (whatever the URL's host and port).
    Memory(MemoryConnector),
}

/// TCP connections under the address policy, TLS on top for `https://` upstreams. See
/// the [module docs](self).
#[derive(Clone, Debug)]
pub struct TcpConnector {
    http: HttpConnector<PolicyResolver>,
    policy: AddressPolicy,
    /// The TLS configuration of `https://` upstreams; `None`: the system roots, loaded
    /// on the first HTTPS connection.
    tls: Option<Arc<rustls::ClientConfig>>,
}

/// In-memory connections: see [`Connector::Memory`].
#[derive(Clone, Debug)]
pub struct MemoryConnector {
    accept: tokio::sync::mpsc::UnboundedSender<DuplexStream>,
    buffer_bytes: usize,
}

/// One upstream connection, TCP, TLS or in-memory.
#[derive(Debug)]
pub enum UpstreamIo {
    /// A TCP connection.
    Tcp(TokioIo<TcpStream>),
    /// A TLS connection (`https://` upstreams).
    Tls(Box<TokioIo<TlsStream<TcpStream>>>),
    /// An in-memory connection.
    Memory(TokioIo<DuplexStream>),
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why the connector handed over no connection although TCP may have worked: in the
/// source chain of [`UpstreamError::Connect`].
#[derive(Debug, thiserror::Error)]
pub enum ConnectRefusal {
    /// The address policy refused the address ([`crate::net::upstream`]).
    #[error("refused by the upstream address policy: {0}")]
    Policy(AddressError),
    /// The TLS handshake failed (certificate expired, wrong name, unknown issuer, …).
    #[error("TLS handshake with {server_name} failed: {why}")]
    Tls {
        /// The server name the certificate was checked against (the URL's host).
        server_name: String,
        /// In words ([`crate::net::tls::describe_tls_failure`]).
        why: String,
        /// The handshake's error.
        #[source]
        source: std::io::Error,
    },
    /// The URL's host is not a valid TLS server name.
    #[error("`{0}` is not a valid TLS server name")]
    ServerName(String),
    /// The TLS configuration could not be built (no root certificates).
    #[error("no TLS configuration for HTTPS upstreams: {0}")]
    NoTlsConfig(String),
}

/// A resolver that drops the addresses the policy refuses (the port is set afterwards
/// by [`HttpConnector`]; the gateway-listener rule is checked on the connection).
#[derive(Clone, Debug)]
struct PolicyResolver {
    policy: AddressPolicy,
}

impl tower_service::Service<Name> for PolicyResolver {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, std::io::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), std::io::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: Name) -> Self::Future {
        let policy = self.policy.clone();
        Box::pin(async move {
            let host = name.as_str().to_string();
            let resolved: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let (allowed, refused): (Vec<_>, Vec<_>) = resolved
                .into_iter()
                .map(|a| (a, policy.check_ip(a.ip())))
                .partition(|(_, verdict)| verdict.is_ok());
            if allowed.is_empty() && !refused.is_empty() {
                let reasons = refused
                    .iter()
                    .filter_map(|(a, verdict)| {
                        verdict.as_ref().err().map(|e| format!("{}: {e}", a.ip()))
                    })
                    .collect::<Vec<_>>()
                    .join("; ");
                return Err(std::io::Error::new(
                    std::io::ErrorKind::PermissionDenied,
                    ConnectRefusal::Policy(AddressError::NoAllowedAddress { host, reasons }),
                ));
            }
            if !refused.is_empty() {
                tracing::debug!(%host, refused = refused.len(), "resolved upstream addresses dropped by the address policy");
            }
            Ok(allowed
                .into_iter()
                .map(|(a, _)| a)
                .collect::<Vec<_>>()
                .into_iter())
        })
    }
}

/// The TLS configuration of HTTPS upstreams when none is configured: the system roots.
fn default_tls() -> Result<Arc<rustls::ClientConfig>, ConnectRefusal> {
    static DEFAULT: OnceLock<Result<Arc<rustls::ClientConfig>, String>> = OnceLock::new();
    DEFAULT
        .get_or_init(|| {
            super::tls::load_client_config(super::tls::ClientTlsFiles {
                system_roots: true,
                ..Default::default()
            })
            .map_err(|e| e.to_string())
        })
        .clone()
        .map_err(ConnectRefusal::NoTlsConfig)
}

impl TcpConnector {
    /// A connector with the connect timeout, the address `policy`, and `tls` for
    /// `https://` upstreams (`None`: the system roots).
    pub fn new(
        connect_timeout: Duration,
        policy: AddressPolicy,
        tls: Option<Arc<rustls::ClientConfig>>,
    ) -> Self {
        let mut http = HttpConnector::new_with_resolver(PolicyResolver {
            policy: policy.clone(),
        });
        http.set_connect_timeout(Some(connect_timeout));
        http.set_nodelay(true);
        // `https://` is ours to handle (TLS on top of the TCP stream).
        http.enforce_http(false);
        Self { http, policy, tls }
    }

    async fn connect(mut self, uri: Uri) -> Result<UpstreamIo, BoxError> {
        let https = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            other => return Err(format!("unsupported upstream scheme {other:?}").into()),
        };
        let host = uri.host().ok_or("upstream URL without a host")?.to_string();
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        // IP literals skip the resolver: checked here, before any packet.
        if let Ok(ip) = bare.parse::<IpAddr>() {
            self.policy
                .check(SocketAddr::new(ip, port))
                .map_err(ConnectRefusal::Policy)?;
        }
        let tcp = tower_service::Service::call(&mut self.http, uri)
            .await?
            .into_inner();
        if let (Ok(peer), Ok(local)) = (tcp.peer_addr(), tcp.local_addr()) {
            self.policy
                .check_peer(peer, local)
                .map_err(ConnectRefusal::Policy)?;
        }
        if !https {
            return Ok(UpstreamIo::Tcp(TokioIo::new(tcp)));
        }
        let config = match self.tls {
            Some(c) => c,
            None => default_tls()?,
        };
        let server_name = rustls::pki_types::ServerName::try_from(bare.to_string())
            .map_err(|_| ConnectRefusal::ServerName(bare.to_string()))?;
        let tls = tokio_rustls::TlsConnector::from(config)
            .connect(server_name, tcp)
            .await
            .map_err(|source| ConnectRefusal::Tls {
                server_name: bare.to_string(),
                why: super::tls::describe_tls_failure(&source),
                source,
            })?;
        Ok(UpstreamIo::Tls(Box::new(TokioIo::new(tls))))
    }
}

impl tower_service::Service<Uri> for Connector {
    type Response = UpstreamIo;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<UpstreamIo, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        match self {
            Connector::Tcp(c) => Box::pin(c.clone().connect(uri)),
            Connector::Memory(m) => {
                let (near, far) = tokio::io::duplex(m.buffer_bytes);
                let sent = m.accept.send(far);
                Box::pin(async move {
                    sent.map_err(|_| "the in-memory upstream is gone")?;
                    Ok(UpstreamIo::Memory(TokioIo::new(near)))
                })
            }
        }
    }
}

impl UpstreamIo {
    /// Whether the upstream picked h2 by ALPN (TLS only).
    fn negotiated_h2(&self) -> bool {
        match self {
            UpstreamIo::Tls(t) => t.inner().get_ref().1.alpn_protocol() == Some(b"h2"),
            UpstreamIo::Tcp(_) | UpstreamIo::Memory(_) => false,
        }
    }
}

impl hyper::rt::Read for UpstreamIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            UpstreamIo::Tcp(t) => Pin::new(t).poll_read(cx, buf),
            UpstreamIo::Tls(t) => Pin::new(&mut **t).poll_read(cx, buf),
            UpstreamIo::Memory(m) => Pin::new(m).poll_read(cx, buf),
        }
    }
}

impl hyper::rt::Write for UpstreamIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            UpstreamIo::Tcp(t) => Pin::new(t).poll_write(cx, buf),
            UpstreamIo::Tls(t) => Pin::new(&mut **t).poll_write(cx, buf),
            UpstreamIo::Memory(m) => Pin::new(m).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            UpstreamIo::Tcp(t) => Pin::new(t).poll_flush(cx),
            UpstreamIo::Tls(t) => Pin::new(&mut **t).poll_flush(cx),
            UpstreamIo::Memory(m) => Pin::new(m).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            UpstreamIo::Tcp(t) => Pin::new(t).poll_shutdown(cx),
            UpstreamIo::Tls(t) => Pin::new(&mut **t).poll_shutdown(cx),
            UpstreamIo::Memory(m) => Pin::new(m).poll_shutdown(cx),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            UpstreamIo::Tcp(t) => t.is_write_vectored(),
            UpstreamIo::Tls(t) => t.is_write_vectored(),
            UpstreamIo::Memory(m) => m.is_write_vectored(),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            UpstreamIo::Tcp(t) => Pin::new(t).poll_write_vectored(cx, bufs),
            UpstreamIo::Tls(t) => Pin::new(&mut **t).poll_write_vectored(cx, bufs),
            UpstreamIo::Memory(m) => Pin::new(m).poll_write_vectored(cx, bufs),
        }
    }
}

/// Why an upstream call failed.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// The connection could not be made (TCP, the address policy, the TLS handshake);
    /// no byte of the request was sent.
    #[error("connect to {uri} failed: {source}")]
    Connect {
        /// Upstream URL.
        uri: String,
        /// Cause, with the reason in words.
        source: ConnectError,
    },
    /// The request was (possibly partly) sent and then failed.
    #[error("request to {uri} failed: {}", describe_chain(source))]
    Request {
        /// Upstream URL.
        uri: String,
        /// Cause: hyper's error (its sources say more).
        source: hyper::Error,
    },
    /// The target URL could not be built from the base and the request path.
    #[error("bad upstream URL {0}")]
    BadUrl(String),
}

impl UpstreamError {
    /// Whether bytes of a response had arrived when the call failed: the response head
    /// could not be parsed (malformed, more fields than [`ResponseLimits::max_headers`],
    /// larger than [`ResponseLimits::max_head_bytes`]). The upstream then processed the
    /// request, so it must not be sent again.
    pub fn response_started(&self) -> bool {
        let UpstreamError::Request { source, .. } = self else {
            return false;
        };
        std::iter::successors(Some(source as &(dyn std::error::Error + 'static)), |e| {
            e.source()
        })
        .filter_map(|e| e.downcast_ref::<hyper::Error>())
        .any(|e| e.is_parse() || e.is_parse_status() || e.is_parse_too_large())
    }
}

/// Limits on upstream response heads (`gateway.max_response_header_count`,
/// `gateway.max_response_header_bytes`); past them the response is refused (502).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResponseLimits {
    /// Most header fields in a response head.
    pub max_headers: usize,
    /// Largest response head (status line and header section), bytes; at least
    /// [`MIN_RESPONSE_HEAD_BYTES`] is used (hyper's smallest read buffer).
    pub max_head_bytes: usize,
}

/// The smallest response head limit hyper's HTTP/1 client accepts, bytes.
pub const MIN_RESPONSE_HEAD_BYTES: usize = 8192;

impl Default for ResponseLimits {
    /// 100 fields, 64 KiB (Envoy's default response header size limit is 60 KiB).
    fn default() -> Self {
        Self {
            max_headers: 100,
            max_head_bytes: 64 * 1024,
        }
    }
}

/// A failed connection attempt: the connector's (or the h2 handshake's) error, and why
/// in words (the address policy's rule, the TLS failure, or the TCP error) as its
/// `Display`.
#[derive(Debug)]
pub struct ConnectError {
    reason: String,
    source: BoxError,
}

impl ConnectError {
    fn new(source: BoxError) -> Self {
        Self {
            reason: describe_chain(&*source),
            source,
        }
    }

    /// Why the connection failed, in words.
    pub fn reason(&self) -> &str {
        &self.reason
    }

    /// The connector's refusal (address policy, TLS), when that is why.
    pub fn refusal(&self) -> Option<&ConnectRefusal> {
        find_in_chain(&*self.source)
    }
}

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.reason)
    }
}

impl std::error::Error for ConnectError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.source)
    }
}

/// The first `E` in `e`'s chain of sources (`e` included), looking inside I/O errors.
fn find_in_chain<'a, E: std::error::Error + 'static>(
    e: &'a (dyn std::error::Error + 'static),
) -> Option<&'a E> {
    std::iter::successors(Some(e), |err| err.source()).find_map(|err| {
        err.downcast_ref::<E>().or_else(|| {
            err.downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .and_then(|inner| inner.downcast_ref::<E>())
        })
    })
}

/// Whether `e` is an h2 stream the upstream did not process, so that sending the request
/// again is safe whatever its method (RFC 9113 §8.7): a graceful `GOAWAY` (`NO_ERROR`)
/// whose last stream id is below it — nginx sends one after `keepalive_requests`
/// (1000) requests on a connection — or a `RST_STREAM` with `REFUSED_STREAM`.
fn unprocessed_h2_stream(e: &hyper::Error) -> bool {
    find_in_chain::<h2::Error>(e).is_some_and(|h2e| {
        h2e.is_remote()
            && ((h2e.is_go_away() && h2e.reason() == Some(h2::Reason::NO_ERROR))
                || (h2e.is_reset() && h2e.reason() == Some(h2::Reason::REFUSED_STREAM)))
    })
}

/// `e` in words: the connector's [`ConnectRefusal`] when there is one, otherwise the
/// messages of `e` and its chain of sources, joined with `: ` (a message its
/// predecessor already holds is left out).
fn describe_chain(e: &(dyn std::error::Error + 'static)) -> String {
    if let Some(refusal) = find_in_chain::<ConnectRefusal>(e) {
        return refusal.to_string();
    }
    // A TLS alert after the handshake (TLS 1.3 servers refuse a missing client
    // certificate only then).
    if let Some(io) = std::iter::successors(Some(e), |err| err.source())
        .filter_map(|err| err.downcast_ref::<std::io::Error>())
        .find(|io| {
            io.get_ref()
                .is_some_and(|inner| inner.is::<rustls::Error>())
        })
    {
        return format!("TLS: {}", super::tls::describe_tls_failure(io));
    }
    let mut parts: Vec<String> = Vec::new();
    for err in std::iter::successors(Some(e), |err| err.source()) {
        let text = err.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
    }
    let text = parts.join(": ");
    // Over h2 the alert reaches here as text only (h2 keeps an I/O error's message).
    match super::tls::describe_alert_text(&text) {
        Some(why) => format!("TLS: {why} ({text})"),
        None => text,
    }
}

impl UpstreamClient {
    /// A client for upstreams spillway starts itself (`process` pools and tiers, on
    /// loopback): the address policy allows loopback; `https://` URLs trust the system
    /// roots.
    pub fn new(settings: ClientSettings) -> Self {
        Self::for_upstreams(
            settings,
            ResponseLimits::default(),
            AddressPolicy::new(true),
            None,
        )
    }

    /// A client for user-given upstreams (`static` VM URLs, `http` function tiers, EC2
    /// instances) under `policy`; `tls` for `https://` upstreams
    /// ([`crate::net::tls::load_client_config`]; `None`: the system roots).
    pub fn for_upstreams(
        settings: ClientSettings,
        limits: ResponseLimits,
        policy: AddressPolicy,
        tls: Option<Arc<rustls::ClientConfig>>,
    ) -> Self {
        let connector = TcpConnector::new(settings.connect_timeout, policy.clone(), tls);
        let mut client = Self::with_connector(settings, limits, Connector::Tcp(connector));
        client.policy = Some(policy);
        client
    }

    /// The connect-time address policy (`None` for in-memory connections): record the
    /// gateway's listeners in it once they are bound.
    pub fn address_policy(&self) -> Option<&AddressPolicy> {
        self.policy.as_ref()
    }

    /// A client whose every connection is an in-memory stream of `buffer_bytes` per
    /// direction; the upstream side of each arrives on the returned receiver (serve it
    /// with hyper). For benches and tests of the whole request path without sockets.
    pub fn in_memory(
        settings: ClientSettings,
        buffer_bytes: usize,
    ) -> (Self, tokio::sync::mpsc::UnboundedReceiver<DuplexStream>) {
        let (accept, accepted) = tokio::sync::mpsc::unbounded_channel();
        let connector = Connector::Memory(MemoryConnector {
            accept,
            buffer_bytes,
        });
        (
            Self::with_connector(settings, ResponseLimits::default(), connector),
            accepted,
        )
    }

    fn with_connector(
        settings: ClientSettings,
        limits: ResponseLimits,
        connector: Connector,
    ) -> Self {
        let mut h1 = http1::Builder::new();
        h1.max_headers(limits.max_headers)
            .max_buf_size(limits.max_head_bytes.max(MIN_RESPONSE_HEAD_BYTES));
        let mut h2 = http2::Builder::new(TokioExecutor::new());
        h2.timer(TokioTimer::new());
        Self {
            pool: Pool::new(pool_shards(), settings.idle_timeout),
            connector,
            h1,
            h2,
            policy: None,
        }
    }

    /// Send `req` to `base` (scheme + authority, optional path prefix), keeping the
    /// request's path and query, on a pooled connection of the calling thread's shard
    /// (a new one when none is idle). The caller has already applied header hygiene.
    ///
    /// A pooled connection that turns out closed before any of the request was written
    /// sends it once more on a new connection; a bodiless request whose h2 stream the
    /// upstream refused unprocessed (`REFUSED_STREAM`, a graceful `GOAWAY` below it) is
    /// sent once more. The response body gives an HTTP/1.1 connection back to the pool
    /// when it ends.
    ///
    /// # Errors
    /// [`UpstreamError::Connect`] when nothing was sent, [`UpstreamError::Request`]
    /// otherwise.
    pub async fn forward(
        &self,
        base: &Uri,
        req: Request<Body>,
    ) -> Result<Response<UpstreamBody>, UpstreamError> {
        self.send(Some(self.shard()), base, req).await
    }

    /// The pool shard of the calling thread.
    fn shard(&self) -> usize {
        let shard = POOL_SHARD.with(std::cell::Cell::get);
        let workers = self.pool.shards() - 1;
        // Workers beyond the cores share shards 1..; never the control threads' 0.
        if shard == 0 || workers == 0 {
            0
        } else {
            1 + (shard - 1) % workers
        }
    }

    /// [`Self::forward`] on a new connection that is closed afterwards: a retry must not
    /// meet another stale pooled connection.
    ///
    /// # Errors
    /// As [`Self::forward`].
    pub async fn forward_fresh(
        &self,
        base: &Uri,
        req: Request<Body>,
    ) -> Result<Response<UpstreamBody>, UpstreamError> {
        self.send(None, base, req).await
    }

    /// One request on shard `shard`'s pool (`None`: a new connection, not pooled).
    async fn send(
        &self,
        shard: Option<usize>,
        base: &Uri,
        mut req: Request<Body>,
    ) -> Result<Response<UpstreamBody>, UpstreamError> {
        let uri = join(base, req.uri())?;
        let key = Key::of(&uri)
            .ok_or_else(|| UpstreamError::BadUrl(format!("{uri} has no scheme or host")))?;
        // An HTTPS upstream is addressed by its own name: the `Host` (h1) or
        // `:authority` (h2) it gets is the URL's authority, which its certificate and
        // SNI name (servers answer 421 or 400 to another, and an h2 request must not
        // carry a `Host` that differs from `:authority`). The client's `Host` is in
        // `X-Forwarded-Host` and `Forwarded: host=`.
        if uri.scheme() == Some(&http::uri::Scheme::HTTPS) {
            req.headers_mut().remove(http::header::HOST);
        }
        *req.uri_mut() = uri.clone();
        *req.version_mut() = http::Version::HTTP_11;
        let sent = match self.exchange(shard, &key, &uri, req).await {
            Err(Failure::Request(e, Some(again))) if unprocessed_h2_stream(&e) => {
                tracing::debug!(%uri, error = %describe_chain(&e), "the upstream refused an h2 stream unprocessed; sending it again");
                self.exchange(shard, &key, &uri, *again).await
            }
            sent => sent,
        };
        sent.map_err(|failure| {
            let uri = uri.to_string();
            match failure {
                Failure::Connect(source) => UpstreamError::Connect {
                    uri,
                    source: ConnectError::new(source),
                },
                Failure::Request(source, _) => UpstreamError::Request { uri, source },
            }
        })
    }

    /// `req` (its URI absolute: `uri`) on a pooled connection of `shard` or a new one;
    /// once more on a new connection when a pooled one handed it back unsent.
    async fn exchange(
        &self,
        shard: Option<usize>,
        key: &Key,
        uri: &Uri,
        mut req: Request<Body>,
    ) -> Result<Response<UpstreamBody>, Failure> {
        let mut reuse = true;
        loop {
            let pooled = match shard {
                Some(s) if reuse => self.pool.checkout(s, key),
                _ => None,
            };
            let reused = pooled.is_some();
            let conn = match pooled {
                Some(conn) => conn,
                None => self
                    .connect(uri, shard, key)
                    .await
                    .map_err(Failure::Connect)?,
            };
            // A bodiless request sent on h2 is kept, to be sent again if the upstream
            // refuses its stream unprocessed (h1 hands an unsent request back itself).
            let mut again = None;
            let mut unsent = match conn {
                Conn::H1(mut tx) => {
                    h1_request_form(&mut req, uri);
                    match tx.try_send_request(req).await {
                        Ok(resp) => {
                            // A 101's connection is the tunnel's now: never pooled.
                            let back = shard
                                .filter(|_| resp.status() != http::StatusCode::SWITCHING_PROTOCOLS)
                                .map(|shard| Return {
                                    pool: Arc::clone(&self.pool),
                                    shard,
                                    key: key.clone(),
                                    tx,
                                });
                            return Ok(resp.map(|b| UpstreamBody::new(b, back)));
                        }
                        Err(e) => e,
                    }
                }
                Conn::H2(mut tx) => {
                    if http_body::Body::is_end_stream(req.body()) {
                        let mut copy = Request::new(super::body::empty());
                        *copy.method_mut() = req.method().clone();
                        *copy.uri_mut() = req.uri().clone();
                        *copy.version_mut() = req.version();
                        *copy.headers_mut() = req.headers().clone();
                        again = Some(Box::new(copy));
                    }
                    match tx.try_send_request(req).await {
                        Ok(resp) => return Ok(resp.map(|b| UpstreamBody::new(b, None))),
                        Err(e) => e,
                    }
                }
            };
            match unsent.take_message() {
                Some(back) if reused => {
                    tracing::debug!(%uri, error = %unsent.error(), "a pooled upstream connection closed before the request went out; sending it on a new connection");
                    req = back;
                    *req.uri_mut() = uri.clone();
                    reuse = false;
                }
                _ => return Err(Failure::Request(unsent.into_error(), again)),
            }
        }
    }

    /// A new connection to `uri` (the connector, then the h1 or h2 handshake); its task
    /// runs on the calling thread's runtime. An h2 connection becomes `key`'s shared one
    /// in `shard`.
    async fn connect(&self, uri: &Uri, shard: Option<usize>, key: &Key) -> Result<Conn, BoxError> {
        let io = tower_service::Service::call(&mut self.connector.clone(), uri.clone()).await?;
        if let Some(shard) = shard {
            self.pool.ensure_sweep(shard);
        }
        if io.negotiated_h2() {
            let (tx, conn) = self.h2.handshake(io).await?;
            tokio::spawn(async move {
                if let Err(e) = conn.await {
                    tracing::debug!(error = %e, "upstream h2 connection failed");
                }
            });
            if let Some(shard) = shard {
                self.pool.put_h2(shard, key.clone(), tx.clone());
            }
            Ok(Conn::H2(tx))
        } else {
            let (tx, conn) = self.h1.handshake(io).await?;
            tokio::spawn(async move {
                if let Err(e) = conn.with_upgrades().await {
                    tracing::debug!(error = %e, "upstream connection failed");
                }
            });
            Ok(Conn::H1(tx))
        }
    }

    /// `GET base+path`; `true` on any HTTP answer (a `static` upstream has no health
    /// path of its own: any status shows it is up). On a new connection.
    pub async fn answers(&self, base: &Uri, path: &str) -> bool {
        match Self::get(path) {
            Some(req) => self.send(None, base, req).await.is_ok(),
            None => false,
        }
    }

    /// `GET base+path`; `true` on a 2xx answer. Used by readiness probes.
    pub async fn probe(&self, base: &Uri, path: &str) -> bool {
        let Some(req) = Self::get(path) else {
            return false;
        };
        matches!(self.send(Some(self.shard()), base, req).await, Ok(r) if r.status().is_success())
    }

    /// A bodiless `GET path`; `None` when `path` is no valid request target.
    fn get(path: &str) -> Option<Request<Body>> {
        let uri = path.parse::<Uri>().ok()?;
        Request::get(uri).body(super::body::empty()).ok()
    }
}

/// Why [`UpstreamClient::exchange`] failed.
enum Failure {
    /// No connection (nothing sent).
    Connect(BoxError),
    /// The request was (possibly partly) sent; on h2, a copy of a bodiless one.
    Request(hyper::Error, Option<Box<Request<Body>>>),
}

/// `req` as an HTTP/1.1 request line and `Host` expect it (hyper-util's client did the
/// same): a `Host` from the URL when there is none (its port unless the scheme's
/// default), and the origin form of the target (`authority` form for `CONNECT`).
fn h1_request_form(req: &mut Request<Body>, uri: &Uri) {
    if !req.headers().contains_key(http::header::HOST)
        && let Some(host) = uri.host()
    {
        let default_port = if uri.scheme() == Some(&http::uri::Scheme::HTTPS) {
            443
        } else {
            80
        };
        let value = match uri.port_u16() {
            Some(port) if port != default_port => format!("{host}:{port}"),
            _ => host.to_string(),
        };
        if let Ok(value) = http::HeaderValue::from_str(&value) {
            req.headers_mut().insert(http::header::HOST, value);
        }
    }
    let mut parts = http::uri::Parts::default();
    if req.method() == http::Method::CONNECT {
        parts.authority = uri.authority().cloned();
    } else {
        parts.path_and_query = uri.path_and_query().cloned();
    }
    *req.uri_mut() = Uri::from_parts(parts).unwrap_or_else(|_| Uri::from_static("/"));
}

/// `base` (e.g. `http://127.0.0.1:4000/prefix`) joined with the path and query of `uri`.
pub fn join(base: &Uri, uri: &Uri) -> Result<Uri, UpstreamError> {
    let prefix = base.path().trim_end_matches('/');
    let pq = uri.path_and_query().map_or("/", |pq| pq.as_str());
    let mut parts = base.clone().into_parts();
    parts.path_and_query = Some(
        format!("{prefix}{pq}")
            .parse()
            .map_err(|e: http::uri::InvalidUri| UpstreamError::BadUrl(e.to_string()))?,
    );
    Uri::from_parts(parts).map_err(|e| UpstreamError::BadUrl(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn join_keeps_prefix_path_and_query() {
        let base: Uri = "http://127.0.0.1:9/fn/api/".parse().unwrap();
        let u = join(&base, &"/a/b?x=1&y=%20".parse().unwrap()).unwrap();
        assert_eq!(u.to_string(), "http://127.0.0.1:9/fn/api/a/b?x=1&y=%20");
        let plain: Uri = "http://127.0.0.1:9".parse().unwrap();
        assert_eq!(
            join(&plain, &"/".parse().unwrap()).unwrap().to_string(),
            "http://127.0.0.1:9/"
        );
    }
}
