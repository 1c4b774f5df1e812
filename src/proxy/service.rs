//! The per-request path: local checks, header hygiene, then the policy core's attempt
//! protocol (`policy::attempt`): a first decision, and for every failed attempt the next
//! one — retry after a connect failure, the next function zone, a fall-back to a VM after
//! throttling or an unreachable function tier — until one answers or the core gives up.
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
use crate::policy::attempt::{AttemptKind, Decision, Failure, NotSentReason, Ticket};
use crate::policy::balancer::RequestMeta;
use crate::policy::placement::Start;

use super::async_calls::Kind;
use super::driver::{Gateway, TicketGuard};
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
    /// The whole body (empty for a bodiless request; a stored asynchronous call's body).
    body: bytes::Bytes,
}

impl Replay {
    fn rebuild(&self) -> Request<Body> {
        let mut req = Request::new(if self.body.is_empty() {
            body::empty()
        } else {
            body::full(self.body.clone())
        });
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
    let observed = super::access_log::begin(&req, peer);
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
    observed.respond(tier, resp)
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
    let req = match validate::check(req, &settings.request_rules) {
        Checked::Forward(req) => req,
        Checked::Answer(resp) => return Ok(("local", resp)),
        Checked::Refuse(e) => return Err(("local", e.into())),
    };
    // Asynchronous calls and their status URLs (ProFaaStinate §3).
    if let Some(a) = gw.async_calls() {
        let answered = match a.classify(&req) {
            Kind::Status => a.status(&req).await,
            Kind::Async => a.accept(gw, req, peer, scheme).await,
            Kind::Sync => return dispatch_sync(gw, settings, req, peer, scheme).await,
        };
        return answered.map(|r| ("local", r)).map_err(|e| ("local", e));
    }
    dispatch_sync(gw, settings, req, peer, scheme).await
}

/// The synchronous request path after the local checks.
async fn dispatch_sync(
    gw: &Arc<Gateway>,
    settings: &ServiceSettings,
    mut req: Request<Incoming>,
    peer: SocketAddr,
    scheme: &'static str,
) -> Outcome {
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
    // A bodiless idempotent request can be sent again exactly (http-cases C17).
    let replay = (meta.idempotent && bodiless && !upgrade).then(|| Replay {
        method: out.method().clone(),
        uri: out.uri().clone(),
        headers: out.headers().clone(),
        body: bytes::Bytes::new(),
    });

    // The attempt protocol (policy::attempt): route, then one decision per failed attempt.
    // The guard gives back whatever the current attempt holds if this future is dropped
    // (client gone) or returns an error; a response's body guard takes over on success.
    let mut ticket = TicketGuard::new(gw, Ticket::new(meta, None));
    let first = ticket.route();
    let path = Path {
        upgrade,
        client_upgrade,
        peer,
        scheme,
    };
    attempts(gw, settings, ticket, first, out, replay, path).await
}

/// A released asynchronous call (ProFaaStinate §3): its first decision came from the
/// delay queue; it runs the same attempt protocol as a synchronous request, with the
/// stored request (which can always be sent again: its body is kept).
pub(crate) async fn run_released(
    gw: &Arc<Gateway>,
    settings: &ServiceSettings,
    ticket: TicketGuard,
    decision: Decision,
    parts: http::request::Parts,
    body: bytes::Bytes,
) -> Outcome {
    let target = match decision {
        Decision::Vm { vm, .. } => gw.vm_target(vm),
        _ => None,
    };
    let replay = Replay {
        method: parts.method.clone(),
        uri: parts.uri.clone(),
        headers: parts.headers.clone(),
        body: body.clone(),
    };
    let out = replay.rebuild();
    let path = Path {
        upgrade: false,
        client_upgrade: None,
        peer: SocketAddr::from(([127, 0, 0, 1], 0)),
        scheme: "http",
    };
    attempts(
        gw,
        settings,
        ticket,
        (decision, target),
        out,
        Some(replay),
        path,
    )
    .await
}

/// Hygiene of a forwarded request (http-cases C7): hop-by-hop and `Connection`-named
/// headers removed, `X-Forwarded-*` added, `Host` kept. Used for stored asynchronous
/// calls; the synchronous path does the same inline.
pub(crate) fn forward_headers(
    parts: &mut http::request::Parts,
    peer: SocketAddr,
    scheme: &'static str,
    settings: &ServiceSettings,
) {
    let host = parts
        .headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_owned)
        .or_else(|| parts.uri.authority().map(|a| a.to_string()));
    let h = &mut parts.headers;
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
}

/// What the attempt loop needs to know about the client side.
struct Path {
    upgrade: bool,
    client_upgrade: Option<hyper::upgrade::OnUpgrade>,
    peer: SocketAddr,
    scheme: &'static str,
}

async fn attempts(
    gw: &Arc<Gateway>,
    settings: &ServiceSettings,
    mut ticket: TicketGuard,
    first: (Decision, Option<super::driver::VmTarget>),
    out: Request<Body>,
    replay: Option<Replay>,
    path: Path,
) -> Outcome {
    let Path {
        upgrade,
        mut client_upgrade,
        peer,
        scheme,
    } = path;
    let limit = settings.max_body_bytes;
    let (mut decision, mut target) = first;
    let mut pending = Some(out);
    loop {
        record_decision(&decision);
        let request = pending
            .take()
            .or_else(|| replay.as_ref().map(Replay::rebuild))
            .expect("the core only retries a request the driver can send");
        match decision {
            Decision::Reject { reason } | Decision::Queue { reason } => {
                return Err((
                    "local",
                    ProxyError::NoCapacity {
                        reason: reason.as_str(),
                    },
                ));
            }
            Decision::Vm { vm, .. } => {
                let Some(vm_target) = target.take() else {
                    return Err(("vm", ProxyError::Upstream(format!("{vm} has no address"))));
                };
                let sent_at = Instant::now();
                let sent = tokio::time::timeout(
                    settings.upstream_timeout,
                    gw.client().forward(&vm_target.base, request),
                )
                .await;
                match sent {
                    Err(_) => {
                        // The timeout is this attempt's response time (adaptive r_max).
                        ticket.hand_over();
                        gw.finish_vm_request_sent_at(vm, sent_at);
                        return Err(("vm", ProxyError::UpstreamTimeout(settings.upstream_timeout)));
                    }
                    Ok(Err(UpstreamError::Connect { uri, source })) => {
                        gw.suspect_vm(&vm_target);
                        tracing::warn!(%vm, %uri, error = %source, "connect failed");
                        let failure = Failure::NotSent {
                            reason: NotSentReason::ConnectFailed,
                            request_available: replay.is_some(),
                        };
                        match ticket.attempt_failed(failure) {
                            Some((d, t)) => (decision, target) = (d, t),
                            None => {
                                return Err((
                                    "vm",
                                    ProxyError::Upstream(format!("connect to {uri}: {source}")),
                                ));
                            }
                        }
                    }
                    Ok(Err(e)) => {
                        return Err(("vm", ProxyError::from_upstream(e, limit)));
                    }
                    Ok(Ok(mut resp)) => {
                        if upgrade && resp.status() == StatusCode::SWITCHING_PROTOCOLS {
                            let upstream_io = hyper::upgrade::on(&mut resp);
                            let client_io = client_upgrade
                                .take()
                                .expect("upgrade requests carry OnUpgrade");
                            let gw2 = Arc::clone(gw);
                            ticket.hand_over();
                            tokio::spawn(async move {
                                if let (Ok(up), Ok(down)) = (upstream_io.await, client_io.await) {
                                    let mut up = TokioIo::new(up);
                                    let mut down = TokioIo::new(down);
                                    let _ = tokio::io::copy_bidirectional(&mut down, &mut up).await;
                                }
                                gw2.finish_vm_request(vm);
                            });
                            let (parts, _) = resp.into_parts();
                            let mut resp = Response::from_parts(parts, body::empty());
                            resp.extensions_mut().insert(served_by_vm(vm));
                            return Ok(("vm", resp));
                        }
                        let gw2 = Arc::clone(gw);
                        ticket.hand_over();
                        // Response end: a VM response-time sample (adaptive r_max).
                        let done = OnDrop::new(move || gw2.finish_vm_request_sent_at(vm, sent_at));
                        let mut resp =
                            resp.map(|b| body::boxed(GuardedBody::new(body::boxed(b), done)));
                        resp.extensions_mut().insert(served_by_vm(vm));
                        return Ok(("vm", clean_response(resp)));
                    }
                }
            }
            Decision::Function { lease, .. } => {
                let mut request = request;
                if let Start::Cold(instance) = lease.start
                    && let Err(e) = ticket.cold_start(lease.zone, instance).await
                {
                    let failure = Failure::NotSent {
                        reason: NotSentReason::ColdStartFailed,
                        request_available: true,
                    };
                    match ticket.attempt_failed(failure) {
                        Some((d, t)) => {
                            (decision, target) = (d, t);
                            pending = Some(request);
                            continue;
                        }
                        None => {
                            return Err((
                                "function",
                                ProxyError::Function(format!("cold start failed: {e}")),
                            ));
                        }
                    }
                }
                request.extensions_mut().insert(ClientInfo { peer, scheme });
                let backend = gw.zone_backend(lease.zone);
                let called = tokio::time::timeout(
                    settings.upstream_timeout,
                    backend.invoke(lease.instance(), request),
                )
                .await;
                match called {
                    Err(_) => {
                        // Abandoned mid-request: an instance may still be busy with it,
                        // so it is stopped rather than handed to the next call.
                        // (A concurrency zone's slot is released by the guard.)
                        ticket.lose_instance();
                        return Err((
                            "function",
                            ProxyError::UpstreamTimeout(settings.upstream_timeout),
                        ));
                    }
                    Ok(Ok(resp)) => {
                        let served = crate::net::ServedBy {
                            instance: lease
                                .instance()
                                .map_or_else(|| "-".to_string(), |i| format!("fn-{}", i.0)),
                            zone: Some(gw.zone_name(lease.zone)),
                        };
                        let gw2 = Arc::clone(gw);
                        ticket.hand_over();
                        let done = OnDrop::new(move || gw2.finish_function(lease));
                        let mut resp =
                            resp.map(|b| body::boxed(GuardedBody::new(body::boxed(b), done)));
                        resp.extensions_mut().insert(served);
                        return Ok(("function", clean_response(resp)));
                    }
                    Ok(Err(FunctionError::NotSent { reason, request })) => {
                        pending = request.map(|r| *r);
                        let failure = Failure::NotSent {
                            reason,
                            request_available: pending.is_some() || replay.is_some(),
                        };
                        match ticket.attempt_failed(failure) {
                            Some((d, t)) => (decision, target) = (d, t),
                            None => return Err(("function", ProxyError::not_sent(reason))),
                        }
                    }
                    Ok(Err(e)) => {
                        return Err(("function", ProxyError::from_function(e, limit)));
                    }
                }
            }
        }
    }
}

/// The access log's instance name of a VM response.
fn served_by_vm(vm: crate::policy::VmId) -> crate::net::ServedBy {
    crate::net::ServedBy {
        instance: vm.to_string(),
        zone: None,
    }
}

/// Metrics for one decision: the tier and reason, and what kind of repeated attempt it
/// is (`spillway_retries_total{kind}`: `connect_failure` for a retry, `spill_back` for a
/// fall-back to a VM, `fall_through` for the next function zone).
fn record_decision(d: &Decision) {
    let tier = match d {
        Decision::Vm { .. } => "vm",
        Decision::Function { .. } => "function",
        Decision::Queue { .. } | Decision::Reject { .. } => "rejected",
    };
    m::routing(tier, d.reason().as_str());
    match d.kind() {
        Some(AttemptKind::Retry) => m::retry("connect_failure"),
        Some(AttemptKind::FallBack) => m::retry("spill_back"),
        Some(AttemptKind::FallThrough) => m::retry("fall_through"),
        Some(AttemptKind::First) | None => {}
    }
    tracing::debug!(decision = ?d, reason = d.reason().as_str(), "routing decision");
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
