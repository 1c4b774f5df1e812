//! The upstream HTTP client: one keep-alive connection pool shared by the VM pool and the
//! function tier, with connect and idle timeouts, and [`forward`], which sends a request
//! to an upstream base URL and tells connect failures (nothing sent, safe to retry) apart
//! from failures after the request left.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response, Uri};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::DuplexStream;
use tokio::net::TcpStream;

use super::body::Body;

/// Client settings.
#[derive(Clone, Copy, Debug)]
pub struct ClientSettings {
    /// TCP connect timeout.
    pub connect_timeout: Duration,
    /// Pooled connections idle longer than this are closed.
    pub idle_timeout: Duration,
}

/// Pooled HTTP/1.1 client towards upstreams (VMs, function instances, HTTP function
/// endpoints). Cheap to clone.
#[derive(Clone, Debug)]
pub struct UpstreamClient {
    inner: Client<Connector, Body>,
    /// No pool: every request on a new connection (retries).
    fresh: Client<Connector, Body>,
}

/// How the client reaches an upstream: TCP (the gateway), or in-memory streams handed
/// to a local server task (benches and tests of the whole request path without sockets).
#[derive(Clone, Debug)]
pub enum Connector {
    /// TCP with `TCP_NODELAY` and the connect timeout.
    Tcp(HttpConnector),
    /// Every connection is one end of a [`tokio::io::duplex`] pair; the other end goes
    /// to the receiver (whatever the URL's host and port).
    Memory(MemoryConnector),
}

/// In-memory connections: see [`Connector::Memory`].
#[derive(Clone, Debug)]
pub struct MemoryConnector {
    accept: tokio::sync::mpsc::UnboundedSender<DuplexStream>,
    buffer_bytes: usize,
}

/// One upstream connection, TCP or in-memory.
#[derive(Debug)]
pub enum UpstreamIo {
    /// A TCP connection.
    Tcp(TokioIo<TcpStream>),
    /// An in-memory connection.
    Memory(TokioIo<DuplexStream>),
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl tower_service::Service<Uri> for Connector {
    type Response = UpstreamIo;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<UpstreamIo, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        match self {
            Connector::Tcp(c) => c.poll_ready(cx).map_err(Into::into),
            Connector::Memory(_) => Poll::Ready(Ok(())),
        }
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        match self {
            Connector::Tcp(c) => {
                let connecting = c.call(uri);
                Box::pin(async move { Ok(UpstreamIo::Tcp(connecting.await?)) })
            }
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

impl Connection for UpstreamIo {
    fn connected(&self) -> Connected {
        match self {
            UpstreamIo::Tcp(t) => t.connected(),
            UpstreamIo::Memory(_) => Connected::new(),
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
            UpstreamIo::Memory(m) => Pin::new(m).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            UpstreamIo::Tcp(t) => Pin::new(t).poll_flush(cx),
            UpstreamIo::Memory(m) => Pin::new(m).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            UpstreamIo::Tcp(t) => Pin::new(t).poll_shutdown(cx),
            UpstreamIo::Memory(m) => Pin::new(m).poll_shutdown(cx),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            UpstreamIo::Tcp(t) => t.is_write_vectored(),
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
            UpstreamIo::Memory(m) => Pin::new(m).poll_write_vectored(cx, bufs),
        }
    }
}

/// Why an upstream call failed.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// The TCP connection could not be made; no byte of the request was sent.
    #[error("connect to {uri} failed: {source}")]
    Connect {
        /// Upstream URL.
        uri: String,
        /// Cause.
        source: Box<hyper_util::client::legacy::Error>,
    },
    /// The request was (possibly partly) sent and then failed.
    #[error("request to {uri} failed: {source}")]
    Request {
        /// Upstream URL.
        uri: String,
        /// Cause.
        source: Box<hyper_util::client::legacy::Error>,
    },
    /// The target URL could not be built from the base and the request path.
    #[error("bad upstream URL {0}")]
    BadUrl(String),
}

impl UpstreamClient {
    /// A client with the given timeouts.
    pub fn new(settings: ClientSettings) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(settings.connect_timeout));
        connector.set_nodelay(true);
        Self::with_connector(settings, Connector::Tcp(connector))
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
        (Self::with_connector(settings, connector), accepted)
    }

    fn with_connector(settings: ClientSettings, connector: Connector) -> Self {
        // A request hyper never wrote because its pooled connection closed first goes
        // out again on a new connection (nothing of it was sent).
        let inner = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(settings.idle_timeout)
            .pool_timer(TokioTimer::new())
            .retry_canceled_requests(true)
            .build(connector.clone());
        let fresh = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(0)
            .retry_canceled_requests(false)
            .build(connector);
        Self { inner, fresh }
    }

    /// Send `req` to `base` (scheme + authority, optional path prefix), keeping the
    /// request's path and query. The caller has already applied header hygiene.
    ///
    /// # Errors
    /// [`UpstreamError::Connect`] when nothing was sent, [`UpstreamError::Request`]
    /// otherwise.
    pub async fn forward(
        &self,
        base: &Uri,
        req: Request<Body>,
    ) -> Result<Response<Incoming>, UpstreamError> {
        Self::send(&self.inner, base, req).await
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
    ) -> Result<Response<Incoming>, UpstreamError> {
        Self::send(&self.fresh, base, req).await
    }

    async fn send(
        client: &Client<Connector, Body>,
        base: &Uri,
        mut req: Request<Body>,
    ) -> Result<Response<Incoming>, UpstreamError> {
        let uri = join(base, req.uri())?;
        *req.uri_mut() = uri.clone();
        *req.version_mut() = http::Version::HTTP_11;
        client.request(req).await.map_err(|source| {
            let (uri, source) = (uri.to_string(), Box::new(source));
            if source.is_connect() {
                UpstreamError::Connect { uri, source }
            } else {
                UpstreamError::Request { uri, source }
            }
        })
    }

    /// `GET base+path`; `true` on any HTTP answer (a `static` upstream has no health
    /// path of its own: any status shows it is up).
    pub async fn answers(&self, base: &Uri, path: &str) -> bool {
        let Ok(uri) = path
            .parse::<Uri>()
            .map_err(|e| UpstreamError::BadUrl(e.to_string()))
            .and_then(|p| join(base, &p))
        else {
            return false;
        };
        let req = Request::get(uri)
            .body(super::body::empty())
            .expect("static request parts are valid");
        self.fresh.request(req).await.is_ok()
    }

    /// `GET base+path`; `true` on a 2xx answer. Used by readiness probes.
    pub async fn probe(&self, base: &Uri, path: &str) -> bool {
        let Ok(uri) = path
            .parse::<Uri>()
            .map_err(|e| UpstreamError::BadUrl(e.to_string()))
            .and_then(|p| join(base, &p))
        else {
            return false;
        };
        let req = Request::get(uri)
            .body(super::body::empty())
            .expect("static request parts are valid");
        matches!(self.inner.request(req).await, Ok(r) if r.status().is_success())
    }
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
