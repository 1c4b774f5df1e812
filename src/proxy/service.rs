//! The per-request path: local checks, header hygiene, one routing decision, dispatch to
//! a VM or the function tier, retry after a connect failure, spill-back after throttling.
//!
//! Invariants (LIBRA §III-C, http-cases C7, C8, C17):
//! * every request gets exactly one final response;
//! * VM attempts — first, retry or spill-back — take a token from the balancer;
//! * only idempotent requests without a body are retried, once per failed VM, and only
//!   after a connect failure (nothing was sent); a request that reached an upstream is
//!   never sent again;
//! * hop-by-hop headers and every header the client named in `Connection` are removed
//!   before the gateway adds its own `X-Forwarded-*`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderValue, Request, Response, StatusCode, header};
use http_body::Body as _;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::time::Instant;

use crate::backends::FunctionError;
use crate::net::ClientInfo;
use crate::policy::balancer::{Attempt, RequestMeta, Route};

use super::driver::Gateway;
use super::error::ProxyError;
use crate::net::body::{self, Body, GuardedBody, OnDrop};
use crate::net::client::UpstreamError;
use crate::net::headers::{self, TrustedProxies};
use crate::net::validate::{self, Checked, RequestRules};
use crate::telemetry as m;

/// Settings of the request path.
#[derive(Clone, Debug)]
pub struct ServiceSettings {
    /// Largest request body, bytes.
    pub max_body_bytes: u64,
    /// Time to the upstream's response headers.
    pub upstream_timeout: Duration,
    /// Peers whose forwarding headers are trusted.
    pub trusted_proxies: TrustedProxies,
    /// Request validation and path normalization (issue 11).
    pub request_rules: RequestRules,
}

/// What a request's parts look like before the body goes, so that a bodiless idempotent
/// request can be rebuilt for a retry.
struct Replay {
    method: http::Method,
    uri: http::Uri,
    headers: http::HeaderMap,
}

impl Replay {
    fn rebuild(&self) -> Request<Body> {
        let mut req = Request::new(body::empty());
        *req.method_mut() = self.method.clone();
        *req.uri_mut() = self.uri.clone();
        *req.headers_mut() = self.headers.clone();
        req
    }
}

/// Handle one client request. Never fails: errors become responses in
/// [`ProxyError::into_response`].
pub async fn handle(
    gw: Arc<Gateway>,
    settings: Arc<ServiceSettings>,
    req: Request<Incoming>,
    peer: SocketAddr,
    scheme: &'static str,
) -> Response<Body> {
    let started = Instant::now();
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let (tier, resp) = match dispatch(&gw, &settings, req, peer, scheme).await {
        Ok((tier, resp)) => (tier, resp),
        Err((tier, e)) => {
            match &e {
                ProxyError::BodyTooLarge { .. }
                | ProxyError::NoCapacity { .. }
                | ProxyError::BadRequestBody(_)
                | ProxyError::FunctionPayloadTooLarge { .. }
                | ProxyError::UpgradeOnFunctionRoute
                | ProxyError::Request(_) => {
                    tracing::debug!(error = %e, "local reply")
                }
                _ => tracing::warn!(error = %e, %method, %path, "request failed"),
            }
            (tier, e.into_response())
        }
    };
    m::request(tier, resp.status().as_u16(), started.elapsed());
    resp
}

type Outcome = Result<(&'static str, Response<Body>), (&'static str, ProxyError)>;

async fn dispatch(
    gw: &Arc<Gateway>,
    settings: &ServiceSettings,
    req: Request<Incoming>,
    peer: SocketAddr,
    scheme: &'static str,
) -> Outcome {
    // Host, target form, header limits, path normalization, cookies (issue 11).
    let mut req = match validate::check(req, &settings.request_rules) {
        Checked::Forward(req) => req,
        Checked::Answer(resp) => return Ok(("local", resp)),
        Checked::Refuse(e) => return Err(("local", e.into())),
    };
    let limit = settings.max_body_bytes;
    if req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
        .is_some_and(|n| n > limit)
    {
        return Err(("local", ProxyError::BodyTooLarge { limit }));
    }
    let upgrade = headers::wants_upgrade(req.headers());
    let meta = RequestMeta {
        upgrade,
        idempotent: headers::is_idempotent(req.method()),
    };
    let upgrade_value = req.headers().get(header::UPGRADE).cloned();
    let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut req));

    // Hygiene: strip hop-by-hop and Connection-named headers, then add our own.
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_owned)
        .or_else(|| req.uri().authority().map(|a| a.to_string()));
    let (parts, incoming) = req.into_parts();
    let mut out = Request::new(body::empty());
    *out.method_mut() = parts.method;
    *out.uri_mut() = parts.uri;
    *out.headers_mut() = parts.headers;
    let h = out.headers_mut();
    // `TE: trailers` survives from h2 clients (gRPC; http-cases C7, C15).
    headers::strip_hop_by_hop(h, parts.version == http::Version::HTTP_2);
    headers::set_forwarded(
        h,
        peer.ip(),
        scheme,
        host.as_deref(),
        &settings.trusted_proxies,
    );
    if let Some(host) = &host
        && !h.contains_key(header::HOST)
        && let Ok(v) = HeaderValue::from_str(host)
    {
        h.insert(header::HOST, v);
    }
    if let Some(value) = upgrade_value.filter(|_| upgrade) {
        h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        h.insert(header::UPGRADE, value);
    }
    let bodiless = incoming.is_end_stream();
    *out.body_mut() = body::boxed(http_body_util::Limited::new(incoming, limit as usize));
    let mut replay = (meta.idempotent && bodiless && !upgrade).then(|| Replay {
        method: out.method().clone(),
        uri: out.uri().clone(),
        headers: out.headers().clone(),
    });

    let mut attempt = Attempt::First;
    let mut pending = Some(out);
    loop {
        let (route, target) = gw.route(&meta, attempt);
        tracing::debug!(
            ?attempt,
            ?route,
            reason = route.reason().as_str(),
            "routing decision"
        );
        let request = pending.take().expect("one request per attempt");
        match route {
            Route::Reject { reason } => {
                m::routing("rejected", reason.as_str());
                return Err((
                    "local",
                    ProxyError::NoCapacity {
                        reason: reason.as_str(),
                    },
                ));
            }
            Route::Vm { vm, reason } => {
                m::routing("vm", reason.as_str());
                let Some(target) = target else {
                    return Err(("vm", ProxyError::Upstream(format!("{vm} has no address"))));
                };
                let sent = tokio::time::timeout(
                    settings.upstream_timeout,
                    gw.client().forward(&target.base, request),
                )
                .await;
                match sent {
                    Err(_) => {
                        gw.finish_vm_request(vm);
                        return Err(("vm", ProxyError::UpstreamTimeout(settings.upstream_timeout)));
                    }
                    Ok(Err(UpstreamError::Connect { uri, source })) => {
                        gw.finish_vm_request(vm);
                        gw.suspect_vm(&target);
                        tracing::warn!(%vm, %uri, error = %source, "connect failed");
                        match replay.take() {
                            Some(r) => {
                                m::retry("connect_failure");
                                pending = Some(r.rebuild());
                                attempt = Attempt::RetryAfterConnectFailure { failed: vm };
                                continue;
                            }
                            None => {
                                return Err((
                                    "vm",
                                    ProxyError::Upstream(format!("connect to {uri}: {source}")),
                                ));
                            }
                        }
                    }
                    Ok(Err(e)) => {
                        gw.finish_vm_request(vm);
                        return Err(("vm", upstream_error(e, limit)));
                    }
                    Ok(Ok(mut resp)) => {
                        if upgrade && resp.status() == StatusCode::SWITCHING_PROTOCOLS {
                            let upstream_io = hyper::upgrade::on(&mut resp);
                            let client_io =
                                client_upgrade.expect("upgrade requests carry OnUpgrade");
                            let gw2 = Arc::clone(gw);
                            tokio::spawn(async move {
                                if let (Ok(up), Ok(down)) = (upstream_io.await, client_io.await) {
                                    let mut up = TokioIo::new(up);
                                    let mut down = TokioIo::new(down);
                                    let _ = tokio::io::copy_bidirectional(&mut down, &mut up).await;
                                }
                                gw2.finish_vm_request(vm);
                            });
                            let (parts, _) = resp.into_parts();
                            return Ok(("vm", Response::from_parts(parts, body::empty())));
                        }
                        let gw2 = Arc::clone(gw);
                        let done = OnDrop::new(move || gw2.finish_vm_request(vm));
                        let resp =
                            resp.map(|b| body::boxed(GuardedBody::new(body::boxed(b), done)));
                        return Ok(("vm", clean_response(resp)));
                    }
                }
            }
            Route::Function { reason } => {
                m::routing("function", reason.as_str());
                let mut request = request;
                request.extensions_mut().insert(ClientInfo { peer, scheme });
                let called =
                    tokio::time::timeout(settings.upstream_timeout, gw.functions().invoke(request))
                        .await;
                match called {
                    Err(_) => {
                        return Err((
                            "function",
                            ProxyError::UpstreamTimeout(settings.upstream_timeout),
                        ));
                    }
                    Ok(Ok(resp)) => return Ok(("function", clean_response(resp))),
                    Ok(Err(FunctionError::Throttled(back))) => {
                        m::retry("spill_back");
                        pending = Some(*back);
                        attempt = Attempt::SpillBack;
                        // A spilled-back request is never replayed again after this.
                        replay = None;
                        continue;
                    }
                    Ok(Err(FunctionError::Upstream(e))) => {
                        return Err(("function", upstream_error(e, limit)));
                    }
                    Ok(Err(e @ (FunctionError::ColdStart(_) | FunctionError::Failed(_)))) => {
                        return Err(("function", ProxyError::Function(e.to_string())));
                    }
                    Ok(Err(FunctionError::PayloadTooLarge { limit })) => {
                        return Err(("function", ProxyError::FunctionPayloadTooLarge { limit }));
                    }
                    Ok(Err(FunctionError::UpgradeNotSupported)) => {
                        return Err(("function", ProxyError::UpgradeOnFunctionRoute));
                    }
                    Ok(Err(FunctionError::TimedOut(after))) => {
                        return Err(("function", ProxyError::UpstreamTimeout(after)));
                    }
                    Ok(Err(FunctionError::RequestBody(e))) => {
                        let err = if is_length_limit(&*e) {
                            ProxyError::BodyTooLarge { limit }
                        } else {
                            ProxyError::Function(format!("request body: {e}"))
                        };
                        return Err(("function", err));
                    }
                }
            }
        }
    }
}

/// Whose fault: the request body (over the limit → 413; malformed or cut off by the
/// client → 400) or the upstream (502).
fn upstream_error(e: UpstreamError, limit: u64) -> ProxyError {
    if is_length_limit(&e) {
        ProxyError::BodyTooLarge { limit }
    } else if is_client_body_error(&e) {
        ProxyError::BadRequestBody(e.to_string())
    } else {
        ProxyError::Upstream(e.to_string())
    }
}

/// Whether `e` or one of its sources is the body length limit.
pub(crate) fn is_length_limit(e: &(dyn std::error::Error + 'static)) -> bool {
    sources(e).any(|err| err.is::<http_body_util::LengthLimitError>())
}

/// Whether hyper's client reported an error of the request body we streamed up (a
/// "user body" error: malformed chunking, client gone).
fn is_client_body_error(e: &(dyn std::error::Error + 'static)) -> bool {
    sources(e).any(|err| {
        err.downcast_ref::<hyper::Error>()
            .is_some_and(hyper::Error::is_user)
    })
}

/// `e` and its chain of sources.
fn sources<'a>(
    e: &'a (dyn std::error::Error + 'static),
) -> impl Iterator<Item = &'a (dyn std::error::Error + 'static)> {
    std::iter::successors(Some(e), |err| err.source())
}

/// Response hygiene ([`headers::sanitize_response`]): hop-by-hop headers stripped
/// (http-cases C7, "same rule on responses"), framing made consistent and the version
/// set to the gateway's (issue 11 item 6); a response that cannot be forwarded
/// faithfully becomes a 502.
fn clean_response(resp: Response<Body>) -> Response<Body> {
    let (mut parts, body) = resp.into_parts();
    match headers::sanitize_response(parts.status, &mut parts.version, &mut parts.headers) {
        Ok(()) => Response::from_parts(parts, body),
        Err(e) => {
            tracing::warn!(error = %e, "upstream response refused");
            ProxyError::Upstream(e.to_string()).into_response()
        }
    }
}
