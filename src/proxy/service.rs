//! The per-request path: local checks, header hygiene, then the policy core's attempt
//! protocol (`policy::attempt`): a first decision, and for every failed attempt the next
//! one — retry after a connect failure, the next function zone, a fall-back to a VM after
//! throttling or an unreachable function tier — until one answers or the core gives up.
//!
//! Invariants (LIBRA §III-C, http-cases C7, C8, C17):
//! * every request gets exactly one final response;
//! * VM attempts — first, retry or spill-back — take a token from the balancer;
//! * only idempotent requests without a body are retried, once, after a connect failure
//!   or a failure before any response byte, over a new connection,
//!   within the core's retry budget; any other request that reached an upstream is never
//!   sent again;
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
use crate::policy::Time;
use crate::policy::attempt::{AttemptKind, Decision, Failure, NotSentReason, Ticket};
use crate::policy::balancer::{RequestMeta, RouteReason};
use crate::policy::placement::{Lease, Start, ZoneId, ZoneKind};
use crate::policy::routes::KeyId;

use super::driver::{Gateway, Intercepted, TicketGuard};
use super::error::ProxyError;
use super::vm_book::VmTarget;
use crate::net::body::{self, Body, GuardedBody, OnDrop};
use crate::net::client::UpstreamError;
use crate::net::headers::{self, TrustedProxies};
use crate::net::request_id::{self, REQUEST_ID, RequestIdTrust, TRACEPARENT, TraceId, TraceParent};
use crate::net::validate::{self, Checked, RequestRules};
use crate::telemetry as m;

/// Settings of the request path.
#[derive(Clone, Debug)]
pub struct ServiceSettings {
    /// Largest request body, bytes.
    pub max_body_bytes: u64,
    /// Wait for the upstream's response head, counted from the moment the request body
    /// was sent (`gateway.upstream_timeout_seconds`); then 504.
    pub upstream_timeout: Duration,
    /// Longest pause between two request body frames from the client
    /// (`gateway.request_body_idle_timeout_seconds`); then 408.
    pub request_body_idle_timeout: Duration,
    /// Longest pause between two response body frames from the upstream
    /// (`gateway.response_body_idle_timeout_seconds`); then the response is aborted.
    pub response_body_idle_timeout: Duration,
    /// Longest time an `Upgrade` tunnel may carry no byte either way
    /// (`gateway.tunnel_idle_timeout_seconds`); then it is closed.
    pub tunnel_idle_timeout: Duration,
    /// Peers whose forwarding headers are trusted.
    pub trusted_proxies: TrustedProxies,
    /// `Upgrade` protocols forwarded (lower case; `gateway.upgrade_protocols`).
    pub upgrade_protocols: Vec<String>,
    /// Request validation and path normalization.
    pub request_rules: RequestRules,
    /// How a request's origin edge zone is found (function zones, FaaSim).
    pub origins: OriginZones,
    /// Whose `x-request-id` is kept (`gateway.request_id_trust`).
    pub request_id_trust: RequestIdTrust,
}

/// A request's origin edge zone (FaaSim, "two-tier edge/cloud"): the zone named by the
/// configured header when the peer is a trusted proxy, else the first edge zone whose
/// `client_cidrs` hold the peer's address, else none (the call goes to the cloud).
#[derive(Clone, Debug, Default)]
pub struct OriginZones {
    /// `(network, zone)` in configuration order.
    cidrs: Vec<(ipnet::IpNet, ZoneId)>,
    /// Edge zone names, for the header.
    names: Vec<(String, ZoneId)>,
    /// The header, if configured.
    header: Option<http::HeaderName>,
}

impl OriginZones {
    /// The origin rules of `config`'s edge zones (zone ids in placement order).
    pub fn new(config: &crate::config::Config) -> Self {
        let mut out = Self {
            header: config
                .gateway
                .origin_zone_header
                .as_deref()
                .and_then(|h| http::HeaderName::from_bytes(h.as_bytes()).ok()),
            ..Self::default()
        };
        for (i, z) in config.zone_specs().into_iter().enumerate() {
            if z.kind != ZoneKind::Edge {
                continue;
            }
            let id = ZoneId(i as u16);
            out.cidrs.extend(z.client_cidrs.iter().map(|n| (*n, id)));
            out.names.push((z.name, id));
        }
        out
    }

    /// The origin zone of a request from `peer` with `headers`. The header is honoured
    /// only when `trusted` holds the peer; an unknown zone name in it is ignored.
    pub fn origin(
        &self,
        peer: std::net::IpAddr,
        headers: &http::HeaderMap,
        trusted: &TrustedProxies,
    ) -> Option<ZoneId> {
        if let Some(h) = &self.header
            && trusted.contains(peer)
            && let Some(v) = headers.get(h).and_then(|v| v.to_str().ok())
            && let Some((_, id)) = self.names.iter().find(|(n, _)| n == v.trim())
        {
            return Some(*id);
        }
        self.cidrs
            .iter()
            .find(|(net, _)| net.contains(&peer))
            .map(|(_, id)| *id)
    }
}

impl ServiceSettings {
    /// The request path's settings from `gateway:`.
    pub fn from_config(c: &crate::config::Config) -> Self {
        let g = &c.gateway;
        Self {
            max_body_bytes: g.max_body_bytes.get(),
            upstream_timeout: g.upstream_timeout_seconds.get(),
            request_body_idle_timeout: g.request_body_idle_timeout_seconds.get(),
            response_body_idle_timeout: g.response_body_idle_timeout_seconds.get(),
            tunnel_idle_timeout: g.tunnel_idle_timeout_seconds.get(),
            trusted_proxies: TrustedProxies::new(g.trusted_proxies.clone()),
            upgrade_protocols: g
                .upgrade_protocols
                .iter()
                .map(|p| p.to_ascii_lowercase())
                .collect(),
            request_rules: g.request_rules(),
            origins: OriginZones::new(c),
            request_id_trust: g.request_id_trust,
        }
    }
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
/// [`ProxyError::into_reply`], with a short reason and the request id.
///
/// The request gets its `x-request-id` first ([`request_id::assign`]): it goes upstream
/// with the request, back on the response, into the access log, and every log line of
/// the request runs in a span that names it. A failed request logs one warning
/// (`request failed`, rate-limited per status by [`crate::log_limit`]); its attempts
/// log at DEBUG.
pub async fn handle(
    gw: Arc<Gateway>,
    settings: Arc<ServiceSettings>,
    mut req: Request<Incoming>,
    peer: SocketAddr,
    scheme: &'static str,
) -> Response<Body> {
    // Chosen now, set on the request once its head passed the limits (which count the
    // client's header section, not the gateway's field).
    let id = request_id::choose(
        req.headers(),
        peer.ip(),
        settings.request_id_trust,
        &settings.trusted_proxies,
    );
    let id_text = id.to_str().unwrap_or("-");
    let trace = RequestTrace::begin(&gw, &mut req, id_text);
    let span = tracing::error_span!("request", request_id = %id_text, trace_id = %trace.trace_id);
    tracing::Instrument::instrument(
        handle_with_id(gw, settings, req, (peer, scheme), id, trace),
        span,
    )
    .await
}

/// A request's place in its W3C trace: the `traceparent` sent upstream and, with span
/// export on, the `request` span ([`crate::trace_export`]).
#[derive(Clone, Debug)]
struct RequestTrace {
    /// For the logs (32 hex digits when shown).
    trace_id: TraceId,
    /// The `traceparent` set on the request after its checks: the gateway's when it
    /// started the trace or exports spans; `None`: the client's goes on unchanged.
    header: Option<HeaderValue>,
    /// The `request` span (span export on).
    span: Option<crate::trace_export::RequestSpan>,
}

impl RequestTrace {
    /// The client's valid `traceparent` (an invalid one is removed), and what the
    /// gateway sends upstream instead: without span export, a new unsampled one only
    /// when the client sent none; with span export, the request span's.
    fn begin(gw: &Gateway, req: &mut Request<Incoming>, request_id: &str) -> Self {
        let client = request_id::trace_context(req.headers_mut());
        match gw.trace_exporter() {
            Some(e) => {
                let span = e.request(client.as_ref(), req.method().as_str(), request_id);
                let own = span.traceparent();
                Self {
                    trace_id: TraceId(own.trace_id),
                    header: Some(own.header_value()),
                    span: Some(span),
                }
            }
            None => match client {
                Some(tp) => Self {
                    trace_id: TraceId(tp.trace_id),
                    header: None,
                    span: None,
                },
                None => {
                    let tp = TraceParent::generate(false);
                    Self {
                        trace_id: TraceId(tp.trace_id),
                        header: Some(tp.header_value()),
                        span: None,
                    }
                }
            },
        }
    }
}

async fn handle_with_id(
    gw: Arc<Gateway>,
    settings: Arc<ServiceSettings>,
    req: Request<Incoming>,
    (peer, scheme): (SocketAddr, &'static str),
    id: HeaderValue,
    trace: RequestTrace,
) -> Response<Body> {
    let started = Instant::now();
    let id_text = id.to_str().unwrap_or("-");
    let mut observed = super::access_log::begin(&req, peer, id_text, trace.trace_id);
    if let Some(a) = gw.async_calls() {
        observed.hide_call_id(a.status_prefix());
    }
    // For the failure log line (a shared-buffer clone, not a copy).
    let method = req.method().clone();
    let uri = req.uri().clone();
    let problem_json = super::error::wants_problem_json(req.headers());
    let (tier, mut resp) = match dispatch(&gw, &settings, req, peer, scheme, &id, &trace).await {
        Ok((tier, resp)) => (tier, resp),
        Err((tier, e)) => {
            if matches!(e, ProxyError::RequestBodyTimeout(_)) {
                m::timeout("request_body");
            }
            if e.fault() == super::error::Fault::Upstream {
                let status = e.status().as_u16();
                if let Some(suppressed) =
                    crate::log_limit::warnings().admit(("request failed", status), Instant::now())
                {
                    tracing::warn!(status, error = %e, %method, path = %uri.path(), tier, suppressed, "request failed");
                }
            } else {
                tracing::debug!(error = %e, "local reply");
            }
            (tier, e.into_reply(problem_json, Some(id_text)))
        }
    };
    resp.headers_mut().insert(REQUEST_ID, id);
    if let Some(span) = &trace.span {
        span.finish(resp.status().as_u16(), tier, uri.path());
    }
    m::request(tier, resp.status().as_u16(), started.elapsed());
    observed.respond(tier, resp)
}

/// A request's final answer and the tier that gave it (`vm`, `function`, `local`), or
/// the error to answer instead with the tier it came from.
pub type Outcome = Result<(&'static str, Response<Body>), (&'static str, ProxyError)>;

async fn dispatch(
    gw: &Arc<Gateway>,
    settings: &ServiceSettings,
    req: Request<Incoming>,
    peer: SocketAddr,
    scheme: &'static str,
    request_id: &HeaderValue,
    trace: &RequestTrace,
) -> Outcome {
    // Host, target form, header limits, path normalization, cookies.
    let mut req = match validate::check(req, &settings.request_rules) {
        Checked::Forward(req) => req,
        Checked::Answer(resp) => return Ok(("local", resp)),
        Checked::Refuse(e) => return Err(("local", e.into())),
    };
    req.headers_mut().insert(REQUEST_ID, request_id.clone());
    if let Some(tp) = &trace.header {
        req.headers_mut().insert(TRACEPARENT, tp.clone());
    }
    // Asynchronous calls and their status URLs (ProFaaStinate §3).
    if let Some(a) = gw.async_calls() {
        req = match Arc::clone(a).intercept(gw, req, peer, scheme) {
            Intercepted::Answer(answer) => {
                return answer.await.map(|r| ("local", r)).map_err(|e| ("local", e));
            }
            Intercepted::Pass(req) => req,
        };
    }
    dispatch_sync(gw, settings, req, peer, scheme, trace.span.clone()).await
}

/// The synchronous request path after the local checks.
async fn dispatch_sync(
    gw: &Arc<Gateway>,
    settings: &ServiceSettings,
    mut req: Request<Incoming>,
    peer: SocketAddr,
    scheme: &'static str,
    span: Option<crate::trace_export::RequestSpan>,
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
    // Only the protocols the gateway carries (`upgrade_protocols`; never h2c, which would
    // tunnel h2 past its request rules); any other `Upgrade` request is forwarded as an
    // ordinary request, its `Upgrade` removed with the hop-by-hop headers.
    let upgrade_value = headers::allowed_upgrade(req.headers(), &settings.upgrade_protocols);
    let upgrade = upgrade_value.is_some();
    if !upgrade && headers::wants_upgrade(req.headers()) {
        tracing::debug!(upgrade = ?req.headers().get(header::UPGRADE), "upgrade to a protocol the gateway does not carry; forwarded without it");
    }
    let meta = RequestMeta {
        upgrade,
        idempotent: headers::is_idempotent(req.method()),
    };
    // Before hygiene: the origin header is the client's (or its trusted proxy's).
    let origin = settings
        .origins
        .origin(peer.ip(), req.headers(), &settings.trusted_proxies);
    let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut req));
    let client_closed = req
        .extensions_mut()
        .remove::<super::lifetime::ClientClosed>();

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
    if let Some(value) = &upgrade_value {
        h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        h.insert(header::UPGRADE, value.clone());
    }
    let bodiless = incoming.is_end_stream();
    *out.body_mut() = body::request_idle_timeout(
        settings.request_body_idle_timeout,
        body::boxed(http_body_util::Limited::new(incoming, limit as usize)),
    );
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
    // The route key (call scheduling §4: the call's "function") on the normalized path.
    let mut new_ticket = Ticket::new(meta, origin);
    if gw.has_queue() {
        new_ticket = new_ticket.with_key(gw.route_key(out.method().as_str(), out.uri().path()));
    }
    let mut ticket = TicketGuard::new(gw, new_ticket);
    let first = ticket.route();
    let path = Path {
        upgrade: upgrade_value,
        client_upgrade,
        client_closed,
        peer,
        scheme,
        span,
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
        upgrade: None,
        client_upgrade: None,
        client_closed: None,
        peer: SocketAddr::from(([127, 0, 0, 1], 0)),
        scheme: "http",
        span: None,
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
    /// The `Upgrade` protocols forwarded, for an upgrade request.
    upgrade: Option<HeaderValue>,
    client_upgrade: Option<hyper::upgrade::OnUpgrade>,
    /// The client's side of its connection ended (see `lifetime::ClientClosed`).
    client_closed: Option<super::lifetime::ClientClosed>,
    peer: SocketAddr,
    scheme: &'static str,
    /// The `request` span (span export on): each attempt is its child.
    span: Option<crate::trace_export::RequestSpan>,
}

/// Run the attempt protocol from the first decision: one attempt per decision
/// ([`try_queue`], [`try_vm`], [`try_function`]), each failed one asking the core for
/// the next, until one answers or the core gives up.
async fn attempts(
    gw: &Arc<Gateway>,
    settings: &ServiceSettings,
    mut ticket: TicketGuard,
    first: (Decision, Option<VmTarget>),
    out: Request<Body>,
    replay: Option<Replay>,
    path: Path,
) -> Outcome {
    let mut at = Attempt::with_path(&ticket, path, replay.is_some());
    let (mut decision, mut target) = first;
    let mut pending = Some(out);
    loop {
        record_decision(&decision);
        let request = pending
            .take()
            .or_else(|| replay.as_ref().map(Replay::rebuild))
            .expect("the core only retries a request the driver can send");
        let step = match decision {
            Decision::Queue { .. } => try_queue(&mut ticket, &mut at, request).await,
            Decision::Reject { reason } => Step::Done(Err((
                "local",
                ProxyError::NoCapacity {
                    reason: reason.as_str(),
                },
            ))),
            Decision::Vm { vm, kind, .. } => match target.take() {
                Some(vm_target) => {
                    try_vm(gw, settings, &mut ticket, &mut at, vm_target, kind, request).await
                }
                None => Step::Done(Err((
                    "vm",
                    ProxyError::Upstream(format!("{vm} has no address").into()),
                ))),
            },
            Decision::Function { lease, .. } => {
                try_function(gw, settings, &mut ticket, &at, lease, request).await
            }
        };
        match step {
            Step::Done(outcome) => return outcome,
            Step::Next {
                decision: d,
                target: t,
                request,
            } => (decision, target, pending) = (d, t, request.map(|r| *r)),
        }
    }
}

/// What one attempt left to do, shaped like the core's [`Decision`]: the request's
/// answer, or the next attempt the core chose after this one failed.
#[must_use]
pub enum Step {
    /// The request's one final response, or the error to answer instead.
    Done(Outcome),
    /// This attempt failed and the core chose another.
    Next {
        /// The core's next decision.
        decision: Decision,
        /// The VM's address, for a VM decision.
        target: Option<VmTarget>,
        /// The request, when the attempt gave it back unsent; `None` when it was sent
        /// (or consumed), and the next attempt sends the replayable copy.
        request: Option<Box<Request<Body>>>,
    },
}

/// What every attempt of one request shares: the client side and whether the request
/// can be sent again.
pub struct Attempt {
    path: Path,
    /// The request can be rebuilt and sent again (a bodiless idempotent request, a
    /// stored asynchronous call).
    replayable: bool,
    /// The call's route key and arrival, for its completion report (call scheduling).
    completion: Option<(KeyId, Time)>,
}

impl Attempt {
    /// The attempts of `ticket`'s request from `peer` over `scheme` (`http`, `https`):
    /// no upgrade, no client-close watch; `replayable` when it can be sent again.
    pub fn new(
        ticket: &TicketGuard,
        peer: SocketAddr,
        scheme: &'static str,
        replayable: bool,
    ) -> Self {
        let path = Path {
            upgrade: None,
            client_upgrade: None,
            client_closed: None,
            peer,
            scheme,
            span: None,
        };
        Self::with_path(ticket, path, replayable)
    }

    fn with_path(ticket: &TicketGuard, path: Path, replayable: bool) -> Self {
        let completion = ticket
            .ticket()
            .key()
            .zip(ticket.ticket().arrival())
            .map(|(k, a)| (k, a.at));
        Self {
            path,
            replayable,
            completion,
        }
    }
}

/// A [`Decision::Queue`]: wait in the gateway queue for a slot; at the queue timeout, or
/// once the client went away, 503.
async fn try_queue(ticket: &mut TicketGuard, at: &mut Attempt, request: Request<Body>) -> Step {
    let waiting = at.path.span.as_ref().map(|s| s.queue_wait());
    let served = wait_queued(ticket, at.path.client_closed.as_mut()).await;
    drop(waiting);
    match served {
        Some((decision, target)) => Step::Next {
            decision,
            target,
            request: Some(Box::new(request)),
        },
        None => Step::Done(Err((
            "local",
            ProxyError::NoCapacity {
                reason: RouteReason::QueueTimeout.as_str(),
            },
        ))),
    }
}

/// A [`Decision::Vm`]: forward `request` to `vm_target` (over a new connection for a
/// retry) within the upstream timeout; relay the response, a `101` tunnel the client
/// asked for, or report the failure to the core for the next decision.
async fn try_vm(
    gw: &Arc<Gateway>,
    settings: &ServiceSettings,
    ticket: &mut TicketGuard,
    at: &mut Attempt,
    vm_target: VmTarget,
    kind: AttemptKind,
    request: Request<Body>,
) -> Step {
    let limit = settings.max_body_bytes;
    let completion = at.completion;
    let vm = vm_target.vm;
    let attempt = at
        .path
        .span
        .as_ref()
        .map(|s| s.attempt("vm", vm.to_string()));
    let mut request = request;
    if let Some(a) = &attempt {
        request.headers_mut().insert(TRACEPARENT, a.header_value());
    }
    let sent_at = Instant::now();
    let (request, body_sent) = watch_body(request);
    // Boxed: the upstream call's future (connect, handshake, exchange: ≈ 3.5 KiB, and
    // twice that inside the head timeout's select) would otherwise be part of every
    // enclosing future of the request path, each copied whole when it is created, on
    // every request.
    let call = Box::pin(async {
        if kind == AttemptKind::Retry {
            gw.client().forward_fresh(&vm_target.base, request).await
        } else {
            gw.client().forward(&vm_target.base, request).await
        }
    });
    let sent = head_timeout(settings.upstream_timeout, body_sent, call).await;
    if let Some(a) = &attempt {
        a.outcome(match &sent {
            Err(_) => "timeout",
            Ok(Err(UpstreamError::Connect { .. })) => "connect_failed",
            Ok(Err(_)) => "failed",
            Ok(Ok(_)) => "response",
        });
    }
    match sent {
        Err(_) => {
            m::timeout("upstream_head");
            // The timeout is this attempt's response time (adaptive r_max).
            ticket.hand_over();
            gw.finish_vm_request_sent_at(vm, sent_at);
            Step::Done(Err((
                "vm",
                ProxyError::UpstreamTimeout(settings.upstream_timeout),
            )))
        }
        Ok(Err(UpstreamError::Connect { uri, source })) => {
            gw.suspect_vm(&vm_target);
            // DEBUG: the request's one warning is its failure, if it fails.
            tracing::debug!(%vm, %uri, error = %source, "connect failed");
            let failure = Failure::NotSent {
                reason: NotSentReason::ConnectFailed,
                request_available: at.replayable,
            };
            match ticket.attempt_failed(failure) {
                Some((decision, target)) => Step::Next {
                    decision,
                    target,
                    request: None,
                },
                None => Step::Done(Err((
                    "vm",
                    ProxyError::Upstream(Box::new(UpstreamError::Connect { uri, source })),
                ))),
            }
        }
        Ok(Err(e)) => {
            // Response bytes arrived but could not be parsed (malformed, over
            // the response header limits): the upstream processed the
            // request, so it is answered 502 and never sent again.
            let response_started = e.response_started();
            let err = ProxyError::from_upstream(e, limit);
            if err.fault() != super::error::Fault::Upstream {
                // The client's body (too large, malformed, idle): not retried.
                return Step::Done(Err(("vm", err)));
            }
            if response_started {
                tracing::debug!(%vm, error = %err, "upstream response refused; not sent again");
            } else {
                // Sent (or partly), no response byte: a bodiless idempotent
                // request may go once more elsewhere (C17). The VM may be
                // dead (a killed VM's pooled connections fail so): suspect.
                gw.suspect_vm(&vm_target);
                tracing::debug!(%vm, error = %err, "upstream failed before answering");
            }
            let failure = Failure::FailedAfterSend {
                response_started,
                request_available: at.replayable,
            };
            match ticket.attempt_failed(failure) {
                Some((decision, target)) => Step::Next {
                    decision,
                    target,
                    request: None,
                },
                None => Step::Done(Err(("vm", err))),
            }
        }
        Ok(Ok(mut resp)) => {
            if resp.status() == StatusCode::SWITCHING_PROTOCOLS
                && !at
                    .path
                    .upgrade
                    .as_ref()
                    .is_some_and(|asked| headers::upgrade_accepted(asked, resp.headers()))
            {
                // A 101 the client did not ask for (or to another protocol):
                // relayed, it would tunnel past the gateway's rules; over h2
                // it cannot be sent at all.
                tracing::debug!(%vm, upgrade = ?resp.headers().get(header::UPGRADE), "upstream switched protocols unasked; refused");
                ticket.hand_over();
                gw.finish_vm_request_sent_at(vm, sent_at);
                return Step::Done(Err((
                    "vm",
                    ProxyError::Upstream(
                        "the upstream switched protocols (101) to one the request did not ask for"
                            .into(),
                    ),
                )));
            }
            if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
                let upstream_io = hyper::upgrade::on(&mut resp);
                let client_io = at
                    .path
                    .client_upgrade
                    .take()
                    .expect("upgrade requests carry OnUpgrade");
                let gw2 = Arc::clone(gw);
                let idle = settings.tunnel_idle_timeout;
                ticket.hand_over();
                tokio::spawn(async move {
                    if let (Ok(up), Ok(down)) = (upstream_io.await, client_io.await)
                        && tunnel(TokioIo::new(down), TokioIo::new(up), idle).await
                    {
                        m::timeout("tunnel_idle");
                        tracing::info!(%vm, ?idle, "tunnel idle; closed");
                    }
                    gw2.finish_vm_request(vm);
                });
                let (parts, _) = resp.into_parts();
                let mut resp = Response::from_parts(parts, body::empty());
                note_served_by_vm(&mut resp, vm);
                return Step::Done(Ok(("vm", resp)));
            }
            let gw2 = Arc::clone(gw);
            ticket.hand_over();
            // Response end: a VM response-time sample (adaptive r_max) and the
            // call's processing time (call scheduling).
            let done = OnDrop::new(move || {
                if let Some((key, arrived)) = completion {
                    gw2.call_completed(key, arrived, sent_at);
                }
                gw2.finish_vm_request_sent_at(vm, sent_at)
            });
            let idle = settings.response_body_idle_timeout;
            let mut resp =
                resp.map(|b| body::boxed(GuardedBody::new(response_idle(idle, b), done)));
            note_served_by_vm(&mut resp, vm);
            Step::Done(Ok(("vm", clean_response(resp))))
        }
    }
}

/// A [`Decision::Function`]: start the lease's instance when it is cold (or wait for a
/// booting pre-warmed one), invoke it within the upstream timeout, and relay the response
/// or report the failure to the core for the next decision. The response body holds the
/// lease until it ends or is dropped.
pub async fn try_function(
    gw: &Arc<Gateway>,
    settings: &ServiceSettings,
    ticket: &mut TicketGuard,
    at: &Attempt,
    lease: Lease,
    mut request: Request<Body>,
) -> Step {
    let limit = settings.max_body_bytes;
    let completion = at.completion;
    let attempt = at.path.span.as_ref().map(|s| {
        let instance = lease
            .instance()
            .map_or_else(|| "-".to_string(), |i| format!("fn-{}", i.0));
        s.attempt(
            "function",
            format!("{}/{instance}", gw.zone_name(lease.zone)),
        )
    });
    if let Some(a) = &attempt {
        request.headers_mut().insert(TRACEPARENT, a.header_value());
    }
    let started = match lease.start {
        Start::Cold(instance) => {
            let _cold = attempt
                .as_ref()
                .map(|a| a.cold_start(gw.zone_name(lease.zone)));
            ticket
                .cold_start(lease.zone, instance)
                .await
                .map_err(body::BoxError::from)
        }
        // A pre-warmed instance still booting: wait for it (FaaSim).
        Start::Booting(instance) => {
            if ticket.await_booting(lease.zone, instance).await {
                Ok(())
            } else {
                Err("pre-warmed instance failed to start".into())
            }
        }
        Start::Warm(_) | Start::Untracked => Ok(()),
    };
    if let Err(e) = started {
        if let Some(a) = &attempt {
            a.outcome("not_sent");
        }
        let failure = Failure::NotSent {
            reason: NotSentReason::ColdStartFailed,
            request_available: true,
        };
        match ticket.attempt_failed(failure) {
            Some((decision, target)) => {
                return Step::Next {
                    decision,
                    target,
                    request: Some(Box::new(request)),
                };
            }
            None => {
                return Step::Done(Err(("function", ProxyError::ColdStart(e))));
            }
        }
    }
    request.extensions_mut().insert(ClientInfo {
        peer: at.path.peer,
        scheme: at.path.scheme,
    });
    let backend = gw.zone_backend(lease.zone);
    // After the cold start: p excludes it (call scheduling).
    let sent_at = Instant::now();
    let (request, body_sent) = watch_body(request);
    let called = head_timeout(
        settings.upstream_timeout,
        body_sent,
        backend.invoke(lease.instance(), request),
    )
    .await;
    if let Some(a) = &attempt {
        a.outcome(match &called {
            Err(_) => "timeout",
            Ok(Ok(_)) => "response",
            Ok(Err(FunctionError::NotSent { .. })) => "not_sent",
            Ok(Err(_)) => "failed",
        });
    }
    match called {
        Err(_) => {
            m::timeout("upstream_head");
            // Abandoned mid-request: an instance may still be busy with it,
            // so it is stopped rather than handed to the next call.
            // (A concurrency zone's slot is released by the guard.)
            ticket.lose_instance();
            Step::Done(Err((
                "function",
                ProxyError::UpstreamTimeout(settings.upstream_timeout),
            )))
        }
        Ok(Ok(resp)) => {
            let served = super::access_log::logging().then(|| crate::net::ServedBy {
                instance: lease
                    .instance()
                    .map_or_else(|| "-".to_string(), |i| format!("fn-{}", i.0)),
                zone: Some(gw.zone_name(lease.zone)),
            });
            let gw2 = Arc::clone(gw);
            ticket.hand_over();
            let done = OnDrop::new(move || {
                if let Some((key, arrived)) = completion {
                    gw2.call_completed(key, arrived, sent_at);
                }
                gw2.finish_function_sent_at(lease, sent_at)
            });
            let idle = settings.response_body_idle_timeout;
            let mut resp =
                resp.map(|b| body::boxed(GuardedBody::new(response_idle(idle, b), done)));
            if let Some(served) = served {
                resp.extensions_mut().insert(served);
            }
            Step::Done(Ok(("function", clean_response(resp))))
        }
        Ok(Err(FunctionError::NotSent { reason, request })) => {
            let failure = Failure::NotSent {
                reason,
                request_available: request.is_some() || at.replayable,
            };
            match ticket.attempt_failed(failure) {
                Some((decision, target)) => Step::Next {
                    decision,
                    target,
                    request,
                },
                None => Step::Done(Err(("function", ProxyError::not_sent(reason)))),
            }
        }
        Ok(Err(e)) => {
            let e = ProxyError::from_function(e, limit);
            if e.fault() == super::error::Fault::Upstream {
                // The tier's own failure: counted in /status.
                let failure = Failure::FailedAfterSend {
                    response_started: false,
                    request_available: false,
                };
                let _ = ticket.attempt_failed(failure);
            }
            Step::Done(Err(("function", e)))
        }
    }
}

/// Wait in the gateway queue; `None` (the call leaves the queue) at the queue timeout,
/// or once the client's side of its connection ended — a client that went away looks
/// the same as one that half-closed, and a queued call must not take a slot for nobody.
async fn wait_queued(
    ticket: &mut TicketGuard,
    client_closed: Option<&mut super::lifetime::ClientClosed>,
) -> Option<(Decision, Option<VmTarget>)> {
    match client_closed {
        Some(closed) => tokio::select! {
            served = ticket.wait_queued() => served,
            () = closed.wait() => None,
        },
        None => ticket.wait_queued().await,
    }
}

/// Wrap `req`'s body so that the returned receiver resolves once it has been sent.
fn watch_body(req: Request<Body>) -> (Request<Body>, tokio::sync::oneshot::Receiver<()>) {
    let (parts, b) = req.into_parts();
    let (b, sent) = body::EndSignal::new(b);
    (Request::from_parts(parts, body::boxed(b)), sent)
}

/// Run `call` (an upstream attempt) until it returns the response head; give up
/// `timeout` after the request body was sent (`body_sent`). A slow upload is covered by
/// the request body idle timeout instead, so it never counts against the head wait.
async fn head_timeout<T>(
    timeout: Duration,
    body_sent: tokio::sync::oneshot::Receiver<()>,
    call: impl Future<Output = T>,
) -> Result<T, ()> {
    let timer = async {
        // An error: the body was dropped unsent (the call failed); the call ends first.
        let _ = body_sent.await;
        tokio::time::sleep(timeout).await;
    };
    tokio::select! {
        biased;
        r = call => Ok(r),
        () = timer => Err(()),
    }
}

/// An upstream response body under the response body idle timeout.
fn response_idle<B>(idle: Duration, b: B) -> Body
where
    B: http_body::Body<Data = bytes::Bytes> + Send + Sync + 'static,
    B::Error: Into<body::BoxError>,
{
    // The body is polled by the connection, outside the request's span: keep it.
    let span = tracing::Span::current();
    body::response_idle_timeout(idle, b, move || {
        m::timeout("response_body");
        let _request = span.enter();
        tracing::warn!(?idle, "upstream response body idle; response aborted");
    })
}

/// Copy an `Upgrade` tunnel both ways until either side closes (`false`) or no byte
/// moved either way for `idle` (`true`: closed for idleness).
async fn tunnel<A, B>(down: A, up: B, idle: Duration) -> bool
where
    A: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    B: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let last = Arc::new(parking_lot::Mutex::new(Instant::now()));
    let mut down = Touch {
        io: down,
        last: Arc::clone(&last),
    };
    let mut up = Touch {
        io: up,
        last: Arc::clone(&last),
    };
    let copy = tokio::io::copy_bidirectional(&mut down, &mut up);
    tokio::pin!(copy);
    loop {
        let deadline = *last.lock() + idle;
        tokio::select! {
            _ = &mut copy => return false,
            () = tokio::time::sleep_until(deadline) => {
                if last.lock().elapsed() >= idle {
                    return true;
                }
            }
        }
    }
}

/// An I/O object that records the time of its last successful read (tunnel idleness;
/// every write follows a read of the other side).
struct Touch<T> {
    io: T,
    last: Arc<parking_lot::Mutex<Instant>>,
}

impl<T: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Touch<T> {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = std::pin::Pin::new(&mut this.io).poll_read(cx, buf);
        if buf.filled().len() > before {
            *this.last.lock() = Instant::now();
        }
        polled
    }
}

impl<T: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Touch<T> {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// The access log's instance name of a VM response.
/// Name `vm` on `resp` for the access log line (only when it is logged: an extension
/// costs an allocation).
fn note_served_by_vm<B>(resp: &mut Response<B>, vm: crate::policy::VmId) {
    if super::access_log::logging() {
        resp.extensions_mut().insert(crate::net::ServedBy {
            instance: vm.to_string(),
            zone: None,
        });
    }
}

/// Metrics for one decision: the tier and reason, and what kind of repeated attempt it
/// is (`spillway_retries_total{kind}`: `connect_failure` for a retry, `spill_back` for a
/// fall-back to a VM, `fall_through` for the next function zone).
fn record_decision(d: &Decision) {
    let tier = match d {
        Decision::Vm { .. } => "vm",
        Decision::Function { .. } => "function",
        Decision::Queue { .. } => "queued",
        Decision::Reject { .. } => "rejected",
    };
    m::routing(tier, d.reason().as_str());
    match d.kind() {
        Some(AttemptKind::Retry) => m::retry("connect_failure"),
        Some(AttemptKind::FallBack) => m::retry("spill_back"),
        Some(AttemptKind::FallThrough) => m::retry("fall_through"),
        Some(AttemptKind::First | AttemptKind::Dequeued) | None => {}
    }
    tracing::debug!(decision = ?d, reason = d.reason().as_str(), "routing decision");
}

/// Response hygiene ([`headers::sanitize_response`]): hop-by-hop headers stripped
/// (http-cases C7, "same rule on responses"), framing made consistent and the version
/// set to the gateway's; a response that cannot be forwarded
/// faithfully becomes a 502.
fn clean_response(resp: Response<Body>) -> Response<Body> {
    let (mut parts, body) = resp.into_parts();
    if parts.status == StatusCode::SWITCHING_PROTOCOLS {
        // Only a VM attempt of an upgrade request may switch protocols (handled before).
        tracing::warn!("upstream switched protocols unasked; refused");
        return ProxyError::Upstream("an unrequested 101 Switching Protocols".into())
            .into_response();
    }
    match headers::sanitize_response(parts.status, &mut parts.version, &mut parts.headers) {
        Ok(()) => Response::from_parts(parts, body),
        Err(e) => {
            tracing::warn!(error = %e, "upstream response refused");
            ProxyError::Upstream(Box::new(e)).into_response()
        }
    }
}
