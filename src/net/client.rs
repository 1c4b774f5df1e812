//! The upstream HTTP client: one keep-alive connection pool shared by the VM pool and the
//! function tier, with connect and idle timeouts, and [`forward`], which sends a request
//! to an upstream base URL and tells connect failures (nothing sent, safe to retry) apart
//! from failures after the request left.

use std::time::Duration;

use http::{Request, Response, Uri};
use hyper::body::Incoming;
use hyper_util::client::legacy::{Client, connect::HttpConnector};
use hyper_util::rt::{TokioExecutor, TokioTimer};

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
    inner: Client<HttpConnector, Body>,
    /// No pool: every request on a new connection (retries, issue 12 item 3).
    fresh: Client<HttpConnector, Body>,
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
        // A request hyper never wrote because its pooled connection closed first goes
        // out again on a new connection (nothing of it was sent; issue 12 item 3).
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
    /// meet another stale pooled connection (issue 12 item 3).
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
        client: &Client<HttpConnector, Body>,
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
