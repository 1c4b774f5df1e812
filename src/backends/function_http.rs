//! `function_tier: {type: http}`: an existing function endpoint (OpenFaaS, Knative, a
//! FaaS gateway…) reached over HTTP or HTTPS. Its instances are invisible to spillway: the policy
//! core's placement tracks the calls in flight against `max_concurrency` (a concurrency
//! zone) and holds each call's slot until the response body has been fully streamed or
//! dropped. The tier only forwards; a call that cannot connect is reported as not sent
//! ([`NotSentReason::Unreachable`]) so the core can fall back to a VM.
//!
//! `/readyz` asks [`FunctionTier::reachable`]: the endpoint counts as capacity while the
//! last call reached it; untried, or after a call that could not connect, a TCP connect
//! bounded by the connect timeout decides (and is remembered like a call).

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::Duration;

use http::{Request, Response, Uri};

use super::{BoxFuture, FunctionError, FunctionTier};
use crate::config::HttpFunctionTierConfig;
use crate::net::body::{Body, boxed};
use crate::net::client::{UpstreamClient, UpstreamError};
use crate::policy::attempt::NotSentReason;
use crate::policy::functions::InstanceId;

/// A function tier behind one HTTP endpoint. See the [module docs](self).
#[derive(Debug)]
pub struct HttpFunctionTier {
    base: Uri,
    client: UpstreamClient,
    shut_down: AtomicBool,
    /// What the last call or probe learnt: [`UNTRIED`], [`REACHED`] or [`UNREACHABLE`].
    reach: AtomicU8,
    /// Bound of the `/readyz` connect probe.
    probe_timeout: Duration,
}

/// No call or probe yet.
const UNTRIED: u8 = 0;
/// The last call or probe connected.
const REACHED: u8 = 1;
/// The last call or probe could not connect.
const UNREACHABLE: u8 = 2;

impl HttpFunctionTier {
    /// A tier calling `cfg.url` (the request path and query are appended to it; the URL
    /// and the concurrency were checked where the config was read).
    pub fn new(cfg: &HttpFunctionTierConfig, client: UpstreamClient) -> Self {
        let base: Uri = cfg.url.uri().clone();
        Self {
            base,
            client,
            shut_down: AtomicBool::new(false),
            reach: AtomicU8::new(UNTRIED),
            probe_timeout: Duration::from_secs(5),
        }
    }

    /// The bound of the `/readyz` connect probe (the gateway's
    /// `connect_timeout_seconds`; 5 s without this).
    #[must_use]
    pub fn with_probe_timeout(mut self, timeout: Duration) -> Self {
        self.probe_timeout = timeout;
        self
    }

    /// Whether a TCP connection to the endpoint opens within the probe timeout.
    async fn connects(&self) -> bool {
        let Some(host) = self.base.host() else {
            return false;
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let port = self
            .base
            .port_u16()
            .unwrap_or(match self.base.scheme_str() {
                Some("https") => 443,
                _ => 80,
            });
        matches!(
            tokio::time::timeout(
                self.probe_timeout,
                tokio::net::TcpStream::connect((host, port))
            )
            .await,
            Ok(Ok(_))
        )
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

    /// Forward `req` to the endpoint (`instance` is ignored: there are none to see).
    ///
    /// # Errors
    /// [`FunctionError::NotSent`] after shutdown (request handed back) or when the
    /// endpoint refuses the connection; [`FunctionError::Upstream`] when the call fails
    /// after it was sent.
    fn invoke(
        &self,
        _instance: Option<InstanceId>,
        req: Request<Body>,
    ) -> BoxFuture<'_, Result<Response<Body>, FunctionError>> {
        Box::pin(async move {
            if self.shut_down.load(Ordering::Acquire) {
                return Err(FunctionError::not_sent(NotSentReason::ShuttingDown, req));
            }
            let result = self.client.forward(&self.base, req).await;
            let reached = !matches!(result, Err(UpstreamError::Connect { .. }));
            self.reach.store(
                if reached { REACHED } else { UNREACHABLE },
                Ordering::Release,
            );
            match result {
                Ok(resp) => Ok(resp.map(boxed)),
                Err(UpstreamError::Connect { uri, source }) => {
                    // The request's one warning is its failure (or none: a VM took it).
                    tracing::debug!(%uri, error = %source, "function endpoint unreachable");
                    Err(FunctionError::NotSent {
                        reason: NotSentReason::Unreachable,
                        request: None,
                    })
                }
                Err(e) => Err(e.into()),
            }
        })
    }

    /// Later calls are not sent (the request comes back).
    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move { self.shut_down.store(true, Ordering::Release) })
    }

    /// Reached by the last call, or (untried, or the last call could not connect) a
    /// connect probe within the probe timeout succeeds.
    fn reachable(&self) -> BoxFuture<'_, bool> {
        Box::pin(async move {
            if self.reach.load(Ordering::Acquire) == REACHED {
                return true;
            }
            let ok = self.connects().await;
            self.reach
                .store(if ok { REACHED } else { UNREACHABLE }, Ordering::Release);
            ok
        })
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
    use crate::net::body::empty;
    use crate::net::client::ClientSettings;

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

    fn tier(url: String, max_concurrency: u32) -> HttpFunctionTier {
        HttpFunctionTier::new(
            &HttpFunctionTierConfig {
                url: url.parse().unwrap(),
                max_concurrency: max_concurrency.try_into().unwrap(),
            },
            client(),
        )
    }

    fn get(path: &str) -> Request<Body> {
        Request::get(path).body(empty()).unwrap()
    }

    #[tokio::test]
    async fn forwards_under_the_base_path_and_stops_sending_after_shutdown() {
        let addr = upstream().await;
        let t = tier(format!("http://{addr}/fn"), 1);
        assert_eq!(t.kind(), "http");
        let a = t.invoke(None, get("/a?x=1")).await.unwrap();
        assert_eq!(
            &a.into_body().collect().await.unwrap().to_bytes()[..],
            b"path=/fn/a?x=1"
        );
        t.shutdown().await;
        assert!(matches!(
            t.invoke(None, get("/e")).await,
            Err(FunctionError::NotSent {
                reason: NotSentReason::ShuttingDown,
                request: Some(_)
            })
        ));
    }

    #[tokio::test]
    async fn an_unreachable_endpoint_is_reported_as_not_sent() {
        // A port nothing listens on: bind, read, drop.
        let port = crate::backends::process::free_port().unwrap();
        let t = tier(format!("http://127.0.0.1:{port}"), 1);
        let r = t.invoke(None, get("/")).await;
        assert!(
            matches!(
                r,
                Err(FunctionError::NotSent {
                    reason: NotSentReason::Unreachable,
                    request: None
                })
            ),
            "{r:?}"
        );
    }
}
