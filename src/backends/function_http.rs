//! `function_tier: {type: http}`: an existing function endpoint (OpenFaaS, Knative, a
//! FaaS gateway…) reached over HTTP. Spillway limits the calls in flight to
//! `max_concurrency` with a semaphore: a call that finds no permit is throttled and its
//! untouched request handed back, and a permit is held until the response body has been
//! fully streamed or dropped ([`GuardedBody`](crate::net::body::GuardedBody)).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use http::{Request, Response, Uri};
use tokio::sync::Semaphore;

use super::{BackendError, BoxFuture, FunctionError, FunctionTier, FunctionTierStats};
use crate::config::HttpFunctionTierConfig;
use crate::net::body::GuardedBody;
use crate::net::body::{Body, boxed};
use crate::net::client::UpstreamClient;

/// A function tier behind one HTTP endpoint. See the [module docs](self).
#[derive(Debug)]
pub struct HttpFunctionTier {
    base: Uri,
    client: UpstreamClient,
    permits: Arc<Semaphore>,
    max_concurrency: u32,
    throttled: AtomicU64,
}

impl HttpFunctionTier {
    /// A tier calling `cfg.url` (the request path and query are appended to it) with at
    /// most `cfg.max_concurrency` calls in flight.
    ///
    /// # Errors
    /// [`BackendError::Provider`] when the URL is not `http://host[:port][/path]` or
    /// `max_concurrency` is 0.
    pub fn new(cfg: &HttpFunctionTierConfig, client: UpstreamClient) -> Result<Self, BackendError> {
        let base: Uri = cfg.url.parse().map_err(|e| {
            BackendError::Provider(format!("function_tier.url: not a URL ({e}): {:?}", cfg.url))
        })?;
        if base.scheme_str() != Some("http") || base.authority().is_none() {
            return Err(BackendError::Provider(format!(
                "function_tier.url: must be an http:// URL with a host, got {:?}",
                cfg.url
            )));
        }
        if cfg.max_concurrency == 0 {
            return Err(BackendError::Provider(
                "function_tier.max_concurrency: must be at least 1".to_string(),
            ));
        }
        Ok(Self {
            base,
            client,
            permits: Arc::new(Semaphore::new(cfg.max_concurrency as usize)),
            max_concurrency: cfg.max_concurrency,
            throttled: AtomicU64::new(0),
        })
    }

    /// The endpoint's base URL.
    pub fn base(&self) -> &Uri {
        &self.base
    }
}

impl FunctionTier for HttpFunctionTier {
    fn kind(&self) -> &'static str {
        "http"
    }

    /// Forward `req` to the endpoint.
    ///
    /// # Errors
    /// [`FunctionError::Throttled`] (request untouched) when `max_concurrency` calls are
    /// in flight or after shutdown, [`FunctionError::Upstream`] when the call fails.
    fn invoke(&self, req: Request<Body>) -> BoxFuture<'_, Result<Response<Body>, FunctionError>> {
        Box::pin(async move {
            let Ok(permit) = Arc::clone(&self.permits).try_acquire_owned() else {
                self.throttled.fetch_add(1, Ordering::Relaxed);
                return Err(FunctionError::Throttled(Box::new(req)));
            };
            let resp = self.client.forward(&self.base, req).await?;
            Ok(resp.map(|b| boxed(GuardedBody::new(boxed(b), permit))))
        })
    }

    /// `instances` = calls in flight; `idle`, `cold_starts` and `warm_starts` are unknown
    /// behind an HTTP endpoint and stay 0.
    fn stats(&self) -> FunctionTierStats {
        let in_flight =
            (self.max_concurrency as usize).saturating_sub(self.permits.available_permits());
        FunctionTierStats {
            instances: u32::try_from(in_flight).unwrap_or(u32::MAX),
            throttled: self.throttled.load(Ordering::Relaxed),
            ..FunctionTierStats::default()
        }
    }

    /// Closes the semaphore: later calls are throttled (the request comes back).
    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move { self.permits.close() })
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::net::SocketAddr;
    use std::time::Duration;

    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};
    use hyper::service::service_fn;
    use hyper_util::rt::TokioIo;

    use super::*;
    use crate::net::body::{empty, full};
    use crate::net::client::{ClientSettings, UpstreamError};

    /// An in-process upstream on 127.0.0.1:0 answering `path=<uri>`.
    async fn upstream() -> SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let svc = service_fn(|req: Request<hyper::body::Incoming>| async move {
                        let text = format!("path={}", req.uri());
                        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(text))))
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        addr
    }

    fn client() -> UpstreamClient {
        UpstreamClient::new(ClientSettings {
            connect_timeout: Duration::from_secs(1),
            idle_timeout: Duration::from_secs(5),
        })
    }

    fn tier(url: String, max_concurrency: u32) -> Result<HttpFunctionTier, BackendError> {
        HttpFunctionTier::new(
            &HttpFunctionTierConfig {
                url,
                max_concurrency,
            },
            client(),
        )
    }

    fn get(path: &str) -> Request<Body> {
        Request::get(path).body(empty()).unwrap()
    }

    #[tokio::test]
    async fn semaphore_throttles_and_permit_is_released_at_body_end() {
        let addr = upstream().await;
        let t = tier(format!("http://{addr}/fn"), 1).unwrap();
        assert_eq!(t.kind(), "http");

        let first = t.invoke(get("/a?x=1")).await.unwrap();
        assert_eq!(
            t.stats().instances,
            1,
            "permit held while the body is unread"
        );

        let req = Request::put("/b")
            .header("x-test", "kept")
            .body(full("data"))
            .unwrap();
        let Err(FunctionError::Throttled(back)) = t.invoke(req).await else {
            panic!("expected throttling")
        };
        assert_eq!(
            (back.method(), back.uri().path()),
            (&http::Method::PUT, "/b")
        );
        assert_eq!(back.headers()["x-test"], "kept");
        assert_eq!(
            &back.into_body().collect().await.unwrap().to_bytes()[..],
            b"data"
        );
        assert_eq!(t.stats().throttled, 1);

        // Streaming the body to its end releases the permit (before the body is dropped).
        let mut body = first.into_body();
        let mut text = Vec::new();
        while let Some(frame) = body.frame().await {
            if let Ok(data) = frame.unwrap().into_data() {
                text.extend_from_slice(&data);
            }
        }
        assert_eq!(text, b"path=/fn/a?x=1");
        assert_eq!(t.stats().instances, 0);

        // Dropping an unread body releases it too.
        let second = t.invoke(get("/c")).await.unwrap();
        assert_eq!(t.stats().instances, 1);
        drop(second);
        assert_eq!(t.stats().instances, 0);
        let third = t.invoke(get("/d")).await.unwrap();
        assert_eq!(
            &third.into_body().collect().await.unwrap().to_bytes()[..],
            b"path=/fn/d"
        );

        t.shutdown().await;
        assert!(matches!(
            t.invoke(get("/e")).await,
            Err(FunctionError::Throttled(_))
        ));
    }

    #[tokio::test]
    async fn a_failed_call_releases_its_permit() {
        // A port nothing listens on: bind, read, drop.
        let port = crate::backends::process::free_port().unwrap();
        let t = tier(format!("http://127.0.0.1:{port}"), 1).unwrap();
        let r = t.invoke(get("/")).await;
        assert!(
            matches!(
                r,
                Err(FunctionError::Upstream(UpstreamError::Connect { .. }))
            ),
            "{r:?}"
        );
        assert_eq!(t.stats().instances, 0);
    }

    #[test]
    fn rejects_bad_configuration() {
        assert!(tier("not a url".into(), 1).is_err());
        assert!(tier("https://example.com".into(), 1).is_err());
        assert!(tier("http://127.0.0.1:9".into(), 0).is_err());
    }
}
