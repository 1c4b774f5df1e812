//! The admin listener: `GET /livez` (the process works), `GET /readyz` (the gateway can
//! serve now: a ready VM, or a function zone with capacity; 503 with the reason
//! otherwise), `GET /healthz` (liveness, 503 while draining; kept for old probes),
//! `GET /metrics` (Prometheus text), `GET /status` (JSON), `POST /reload`.
//!
//! With a bearer token configured (`gateway.admin_token_file` or `admin_token_env`) every
//! path but the three probes needs `Authorization: Bearer TOKEN` (the scheme in any
//! case; 401 otherwise). Without one the listener must be on loopback, and a request
//! whose `Host` is not a loopback name or address, or whose `Origin` is not a loopback
//! origin, is refused with 403: a web page cannot reach it through DNS rebinding or a
//! cross-site form.

use std::convert::Infallible;
use std::sync::Arc;

use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use hyper::body::Incoming;
use metrics_exporter_prometheus::PrometheusHandle;
use serde_json::{Value, json};

use super::admin_token::AdminToken;
use super::driver::Gateway;
use crate::net::body::{self, Body};
use crate::policy::placement::ZoneStatus;
use crate::policy::rmax::{PeriodReport, RMaxStatus};
use crate::telemetry as m;

/// Whether `host` (a `Host` value or an `Origin`'s host, port optional) names this
/// machine's loopback: `localhost` (and `*.localhost`), `127.0.0.0/8`, `[::1]`.
fn is_loopback_host(host: &str) -> bool {
    let host = host.trim();
    let name = if let Some(rest) = host.strip_prefix('[') {
        match rest.split_once(']') {
            Some((ip, _)) => ip,
            None => return false,
        }
    } else {
        host.rsplit_once(':')
            .filter(|(_, port)| port.bytes().all(|b| b.is_ascii_digit()))
            .map_or(host, |(h, _)| h)
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    name == "localhost"
        || name.ends_with(".localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Without a token: why `req` is refused (`None`: it may go on) — a `Host` that is not
/// a loopback name (DNS rebinding: a page on another name that resolves to 127.0.0.1),
/// or a cross-site `Origin` (a form or `fetch` from a web page).
fn loopback_refusal<B>(req: &Request<B>) -> Option<&'static str> {
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .or_else(|| req.uri().authority().map(|a| a.as_str().to_owned()));
    if !host.as_deref().is_some_and(is_loopback_host) {
        return Some("the admin listener has no token: Host must be a loopback name or address\n");
    }
    if let Some(origin) = req.headers().get(header::ORIGIN) {
        let ok = origin
            .to_str()
            .ok()
            .and_then(|o| o.split_once("://"))
            .is_some_and(|(_, host)| is_loopback_host(host));
        if !ok {
            return Some("the admin listener has no token: cross-origin requests are refused\n");
        }
    }
    None
}

/// What the admin listener shares with the rest of the gateway.
#[derive(Clone)]
pub struct AdminCtx {
    /// The bearer token in force.
    pub token: AdminToken,
    /// Reloads (`POST /reload`), when the gateway was started from a file.
    pub reloader: Option<Arc<super::reload::Reloader>>,
    /// Set once shutdown began: `/healthz` and `/readyz` answer 503 `draining`.
    pub draining: Arc<std::sync::atomic::AtomicBool>,
}

/// Answer one admin request.
pub async fn handle(
    gw: Arc<Gateway>,
    prometheus: PrometheusHandle,
    ctx: AdminCtx,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let path = req.uri().path();
    let probe = matches!(path, "/healthz" | "/livez" | "/readyz");
    if !probe
        && !ctx.token.is_set()
        && let Some(why) = loopback_refusal(&req)
    {
        return Ok(text(StatusCode::FORBIDDEN, why.into(), "text/plain"));
    }
    if !probe && !ctx.token.admits(&req) {
        let mut r = text(
            StatusCode::UNAUTHORIZED,
            "unauthorized\n".into(),
            "text/plain",
        );
        r.headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        return Ok(r);
    }
    let resp = match (req.method(), req.uri().path()) {
        (&Method::GET, "/healthz") if ctx.draining.load(std::sync::atomic::Ordering::Acquire) => {
            text(
                StatusCode::SERVICE_UNAVAILABLE,
                "draining\n".into(),
                "text/plain",
            )
        }
        (&Method::GET, "/healthz" | "/livez") => text(StatusCode::OK, "ok\n".into(), "text/plain"),
        (&Method::GET, "/readyz") => {
            let draining = ctx.draining.load(std::sync::atomic::Ordering::Acquire);
            match not_ready(&gw, draining).await {
                None => text(StatusCode::OK, "ready\n".into(), "text/plain"),
                Some(why) => {
                    let mut r = text(
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!("not ready: {why}\n"),
                        "text/plain",
                    );
                    r.headers_mut()
                        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                    r
                }
            }
        }
        (&Method::POST, "/reload") => match &ctx.reloader {
            None => text(
                StatusCode::CONFLICT,
                "no configuration file to reload\n".into(),
                "text/plain",
            ),
            Some(r) => match r.reload().await {
                Ok(report) => text(
                    StatusCode::OK,
                    serde_json::to_string_pretty(&report).unwrap_or_default() + "\n",
                    "application/json",
                ),
                Err(e) => text(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    serde_json::to_string_pretty(
                        &json!({"error": redact_text_long(&e.to_string())}),
                    )
                    .unwrap_or_default()
                        + "\n",
                    "application/json",
                ),
            },
        },
        (&Method::GET, "/metrics") => {
            scrape_gauges(&gw);
            let mut out = prometheus.render();
            if let Some((since_start, _)) = gw.billing().bills(gw.now()) {
                if !out.is_empty() && !out.ends_with('\n') {
                    out.push('\n');
                }
                out.push_str(&cost_metrics_text(&since_start));
            }
            text(StatusCode::OK, out, "text/plain; version=0.0.4")
        }
        (&Method::GET, "/status") => text(
            StatusCode::OK,
            serde_json::to_string_pretty(&status_json(&gw)).unwrap_or_default() + "\n",
            "application/json",
        ),
        (_, "/healthz" | "/livez" | "/readyz" | "/metrics" | "/status" | "/reload") => text(
            StatusCode::METHOD_NOT_ALLOWED,
            "method not allowed\n".into(),
            "text/plain",
        ),
        _ => text(StatusCode::NOT_FOUND, "not found\n".into(), "text/plain"),
    };
    Ok(resp)
}

/// Why the gateway cannot serve a request now (`None`: it can) — readiness, as a
/// Kubernetes readiness probe or a load balancer's health check reads it: draining, or
/// no ready VM and no function zone that could take a call (every zone at
/// `max_instances`/`max_concurrency`, its provider in alarm, such as Lambda access
/// denied, or its endpoint unreachable: an `http` zone whose last call or connect probe
/// failed).
pub async fn not_ready(gw: &Gateway, draining: bool) -> Option<String> {
    if draining {
        return Some("draining".into());
    }
    let st = gw.status();
    let pool = &st.core.controller.pool;
    if pool.ready > 0 {
        return None;
    }
    let backends = gw.zone_backends();
    let mut zones = Vec::new();
    for (i, z) in st.core.zones.iter().enumerate() {
        let alarms = backends
            .get(i)
            .map(|b| b.errors().alarms().join(","))
            .unwrap_or_default();
        // An endpoint that cannot be reached is no capacity, whatever its slots say.
        let reachable = match backends.get(i) {
            Some(b) if z.has_capacity && alarms.is_empty() => b.reachable().await,
            _ => true,
        };
        if z.has_capacity && alarms.is_empty() && reachable {
            return None;
        }
        zones.push(if !alarms.is_empty() {
            format!("{} in alarm ({alarms})", z.name)
        } else if !reachable {
            format!("{} unreachable", z.name)
        } else {
            format!("{} at capacity", z.name)
        });
    }
    let dead = st.vms.iter().filter(|v| v.state == "dead").count();
    let mut why = format!("no ready VM ({} booting, {dead} dead)", pool.booting);
    if zones.is_empty() {
        why.push_str(" and no function zone");
    } else {
        why.push_str(" and no function zone with capacity: ");
        why.push_str(&zones.join("; "));
    }
    Some(why)
}

fn text(status: StatusCode, s: String, content_type: &'static str) -> Response<Body> {
    let mut r = Response::new(body::full(s));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

/// Gauges read at scrape time (the CIP in force, function instances per zone and
/// state), and the provider-error series of the providers this gateway runs, registered
/// at zero on the first scrape.
fn scrape_gauges(gw: &Gateway) {
    m::cip_gauge(gw.cip_rps());
    if let Some((_, hour)) = gw.billing().bills(gw.now()) {
        m::cost_last_hour(&hour);
    }
    let st = gw.status();
    for z in &st.core.zones {
        m::function_instances(&z.name, z.starting, z.busy, z.idle);
        if let Some(u) = &z.usage {
            m::function_usage(&z.name, u);
        }
        for i in &z.instances {
            m::function_instance_usage(&z.name, i);
        }
    }
    if let Some(q) = &st.core.queue {
        m::queue_gauges(q);
    }
    // At every scrape too, not only at the driver's tick: the first scrape after start
    // shows the controller's series (`spillway_r_max_rps`, the pool, the EWMAs) and the
    // delay queue's (`spillway_async_deadline_misses_total` at 0), which the dashboard
    // and the alert rules read.
    m::controller_gauges(&st.core.controller);
    if let Some(d) = &st.core.delay {
        m::delay_gauges(d, gw.now());
    }
    static ZEROED: std::sync::Once = std::sync::Once::new();
    ZEROED.call_once(|| {
        let kinds = error_kinds();
        if gw.vm_provider().kind() == "ec2" {
            m::zero_provider_errors(
                "ec2",
                &["run_instances", "describe_instances", "terminate_instances"],
                &kinds,
            );
        }
        if gw.zone_backends().iter().any(|b| b.kind() == "lambda") {
            m::zero_provider_errors(
                "lambda",
                &[
                    "invoke",
                    "function",
                    "put_provisioned_concurrency_config",
                    "get_provisioned_concurrency_config",
                    "delete_provisioned_concurrency_config",
                ],
                &kinds,
            );
        }
    });
}

/// Every `kind` label value (exhaustive: a new kind must be listed).
fn error_kinds() -> Vec<&'static str> {
    use crate::backends::provider_errors::ErrorKind as K;
    let all = [
        K::Capacity,
        K::Quota,
        K::Throttling,
        K::AccessDenied,
        K::Unreachable,
        K::Timeout,
        K::InvalidRequest,
        K::Other,
    ];
    let _exhaustive = |k: K| match k {
        K::Capacity
        | K::Quota
        | K::Throttling
        | K::AccessDenied
        | K::Unreachable
        | K::Timeout
        | K::InvalidRequest
        | K::Other => (),
    };
    all.iter().map(|k| k.as_str()).collect()
}

/// A reload's error for the admin reply: credentials redacted, not shortened (it
/// lists every problem of the file).
fn redact_text_long(text: &str) -> String {
    crate::redact::redact(text).into_owned()
}

/// Longest error text `/status` shows, characters.
pub const MAX_STATUS_ERROR_CHARS: usize = crate::redact::MAX_REASON_CHARS;

/// `text` through the one redaction ([`crate::redact::redact`]), shortened to
/// [`MAX_STATUS_ERROR_CHARS`].
pub fn redact_text(text: &str) -> String {
    crate::redact::redact_short(text, MAX_STATUS_ERROR_CHARS)
}

/// A rate, requests/s, rounded to 2 decimals (`null` when not finite: no budget cap).
fn rate(x: f64) -> Value {
    if x.is_finite() {
        json!(m::round2(x))
    } else {
        Value::Null
    }
}

/// A dimensionless number (an error, an integral), `null` when not finite.
fn num(x: f64) -> Value {
    if x.is_finite() { json!(x) } else { Value::Null }
}

/// Milliseconds rounded to 0.1 ms.
fn millis(x: f64) -> Value {
    if x.is_finite() {
        json!((x * 10.0).round() / 10.0)
    } else {
        Value::Null
    }
}

/// A duration in seconds, rounded to 0.1 ms.
fn seconds(d: std::time::Duration) -> Value {
    json!((d.as_secs_f64() * 10_000.0).round() / 10_000.0)
}

/// The `/status` document. Rates in requests/s rounded to 2 decimals, durations in
/// seconds rounded to 0.1 ms; `routed` counts are cumulative attempts.
///
/// ```json
/// {"build": {"version": "0.1.0", "commit": "1a2b3c4d5e6f", "features": "none"},
///  "uptime_seconds": 73.4021,
///  "epoch": 72,
///  "traffic": {"last_epoch_requests": 44, "avg_rps": 41.2, "mean_abs_deviation_rps": 3.1},
///  "scaling": {"vm_reqs_rps": 44.3, "vm_budget_before_rho_rps": 40.0, "cip_rps": 2.0,
///              "target_vms": 3, "ready_vms": 2, "booting_vms": 1, "draining_vms": 0,
///              "executes_scaling": true, "last_decision": {…}},
///  "routed": {"vm": 1200, "function": 310, "rejected": 0},
///  "libra": {"alpha": 0.3, "beta": 0.3, "phi": 1.0, "rho": 0.9, "decision_epochs": 300,
///            "first_decision_epoch": null, "min_vms": 1, "max_vms": 10},
///  "retry_budget": {"window_requests": 412, "window_retries": 3, "window_allowed": 92.4,
///                   "retried_total": 17, "refused_total": 0},
///  "vm_pool": {"kind": "process", "vms": […], "errors": {…}},
///  "functions": {"kind": "process", "instances": {"busy": 1, "idle": 2}, …}}
/// ```
pub fn status_json(gw: &Gateway) -> Value {
    let mut v = status_document(gw);
    // Every string (condition reasons, last errors, instance names, URLs) through the
    // one redaction, cut to MAX_STATUS_ERROR_CHARS.
    crate::redact::redact_json(&mut v);
    v
}

fn status_document(gw: &Gateway) -> Value {
    let s = gw.status();
    let c = &s.core.controller;
    json!({
        "build": {
            "version": crate::build_info::VERSION,
            "commit": crate::build_info::COMMIT,
            "features": crate::build_info::FEATURES,
        },
        "uptime_seconds": seconds(gw.now()),
        "epoch": c.epoch,
        "traffic": {
            "last_epoch_requests": c.last_epoch_requests,
            "avg_rps": rate(c.avg_rps),
            "mean_abs_deviation_rps": rate(c.std_rps),
        },
        "scaling": {
            "vm_reqs_rps": rate(c.vm_reqs_rps),
            "vm_budget_before_rho_rps": rate(c.published_vm_reqs_rps),
            "cip_rps": rate(gw.cip_rps()),
            "target_vms": c.pool.target,
            "ready_vms": c.pool.ready,
            "booting_vms": c.pool.booting,
            "draining_vms": c.pool.draining,
            "executes_scaling": gw.vm_provider().executes_scaling(),
            "last_decision": s.last_decision.map(|(epoch, d)| json!({
                "epoch": epoch,
                "target_vms": d.target_vms,
                "vm_reqs_rps": rate(d.vm_reqs_rps),
                "reason": d.reason.as_str(),
            })),
        },
        "routed": {
            "vm": c.routed.vm,
            "function": c.routed.function,
            "rejected": c.routed.rejected,
        },
        "libra": s.core.tuning.as_ref().map(|t| json!({
            "alpha": t.alpha,
            "beta": t.beta,
            "phi": t.scaling.phi,
            "rho": t.rho,
            "decision_epochs": t.decision_epochs,
            "first_decision_epoch": t.first_decision_epoch,
            "min_vms": t.scaling.min_vms,
            "max_vms": t.scaling.max_vms,
        })),
        "r_max": r_max_json(c.r_max_rps, s.core.r_max.as_ref()),
        "retry_budget": {
            "window_requests": s.core.retry_budget.requests,
            "window_retries": s.core.retry_budget.retries,
            "window_allowed": num(s.core.retry_budget.allowed),
            "retried_total": s.core.retry_budget.retried_total,
            "refused_total": s.core.retry_budget.refused_total,
        },
        "vm_pool": {
            "kind": gw.vm_provider().kind(),
            "vms": s.vms,
            "errors": gw.vm_provider().errors(),
        },
        "functions": functions_json(
            gw,
            &s.core.zones,
            &s.core.function_failures,
            s.core.fall_backs_to_vm,
        ),
        "queue": queue_json(s.core.queue.as_ref()),
        "cost": cost_json(gw),
        "coordination": coordination_json(gw),
        "async": s.core.delay.as_ref().map(|d| json!({
            "queued": d.queued,
            "queued_total": d.queued_total,
            "oldest_wait_seconds": d.oldest_accepted.map(|t| seconds(gw.now().saturating_sub(t))),
            "mode": d.mode.as_str(),
            "cpu_utilisation": d.cpu.map(m::round2),
            "cpu_signal": gw.async_calls().map(|a| a.cpu_signal_status()),
            "store": gw.async_calls().map(|a| a.store_status()),
            "mode_switches": d.switches,
            "released": d.released.iter().map(|r| json!({
                "kind": r.kind, "tier": r.tier, "calls": r.count,
            })).collect::<Vec<_>>(),
            "finished": d.finished,
            "deadline_misses": d.deadline_misses,
            "expected_processing_seconds": seconds(d.expected_processing),
        })),
    })
}

/// `cost`: the running bill ([`CostMeter`](crate::policy::cost::CostMeter)) since start
/// and of the last hour, USD: VM time by instance type, function calls and provisioned
/// concurrency by zone, the total (the hybrid's cost) and the counterfactual for the same
/// arrivals (all on functions; all on a VM pool sized for the window's peak at r_max).
///
/// ```json
/// {"since_start": {"from_seconds": 0.0, "to_seconds": 5400.0, "total_usd": 0.62,
///   "vm": [{"instance_type": "m5.large", "vm_seconds": 5400.0, "usd": 0.54}],
///   "functions": [{"zone": "cloud", "requests": 2, "gb_seconds": 1.5, "usd": 0.00003}],
///   "provisioned": [{"zone": "cloud", "gb_seconds": 16200.0, "usd": 0.081}],
///   "counterfactual": {"all_functions_usd": 0.0001, "all_vm_usd": 1.62,
///                      "all_vm_vms": 3, "peak_rps": 25}},
///  "last_hour": {…}}
/// ```
fn cost_json(gw: &Gateway) -> Value {
    match gw.billing().bills(gw.now()) {
        Some((since_start, last_hour)) => json!({
            "since_start": since_start,
            "last_hour": last_hour,
        }),
        None => Value::Null,
    }
}

/// `spillway_cost_dollars_total{tier, zone}` and
/// `spillway_cost_counterfactual_dollars_total{policy}` as Prometheus text, from the bill
/// since start. Written here rather than through the `metrics` crate, whose counters
/// count whole numbers: dollars are fractions. `tier` is `vm` (with the instance type in
/// `zone`: VMs have no placement zone), `function` or `provisioned`; `policy` is
/// `all_functions` or `all_vm`.
pub fn cost_metrics_text(b: &crate::policy::cost::Bill) -> String {
    use std::fmt::Write as _;
    fn label(v: &str) -> String {
        v.replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('\n', "\\n")
    }
    let mut out = String::new();
    out.push_str(
        "# HELP spillway_cost_dollars_total The running bill since start, USD, by tier (vm: \
         the instance type in zone; function; provisioned) and zone.\n\
         # TYPE spillway_cost_dollars_total counter\n",
    );
    let lines =
        b.vm.iter()
            .map(|l| ("vm", l.instance_type.as_str(), l.usd))
            .chain(
                b.functions
                    .iter()
                    .map(|l| ("function", l.zone.as_str(), l.usd)),
            )
            .chain(
                b.provisioned
                    .iter()
                    .map(|l| ("provisioned", l.zone.as_str(), l.usd)),
            );
    for (tier, zone, usd) in lines {
        let _ = writeln!(
            out,
            "spillway_cost_dollars_total{{tier=\"{tier}\",zone=\"{}\"}} {usd}",
            label(zone)
        );
    }
    let c = &b.counterfactual;
    let _ = write!(
        out,
        "# HELP spillway_cost_counterfactual_dollars_total What the same arrivals would have \
         cost since start, USD: all_functions (every call on functions), all_vm (a VM pool \
         sized for the peak at r_max).\n\
         # TYPE spillway_cost_counterfactual_dollars_total counter\n\
         spillway_cost_counterfactual_dollars_total{{policy=\"all_functions\"}} {}\n\
         spillway_cost_counterfactual_dollars_total{{policy=\"all_vm\"}} {}\n",
        c.all_functions_usd, c.all_vm_usd
    );
    out
}

/// `coordination`: `{"type": "none"}` for one gateway; with `type: redis` this
/// replica's role (leader, follower, local), the leader's term, its budget share, the
/// live replicas and the last store error (`crate::coord::CoordStatus`).
///
/// ```json
/// {"type": "redis", "store": "redis", "replica": "gw-0-1", "role": "follower",
///  "term": 4, "leader": "gw-1-1", "share": 0.33, "replicas": 3, "epoch": 1764630000,
///  "missed_epochs": 0, "buffered_counts": 0, "last_store_error": null,
///  "store_errors_total": 2, "refused_writes_total": 0,
///  "calls": {"owner_tag": "20a0e7ac", "url": "http://10.0.0.5:8080", "owners_known": 3}}
/// ```
///
/// `calls` (with asynchronous routes): the owner tag this replica's call ids carry, the
/// URL it advertises, and how many live replicas' tags it can forward lookups to.
fn coordination_json(gw: &Gateway) -> Value {
    let Some(c) = gw.coordinator() else {
        return json!({"type": "none"});
    };
    let mut v = json!(*c.status());
    if let Value::Object(m) = &mut v {
        m.insert("type".into(), json!("redis"));
        if let Some(a) = c.call_address() {
            m.insert(
                "calls".into(),
                json!({
                    "owner_tag": format!("{:08x}", a.tag),
                    "url": a.url,
                    "owners_known": c.call_owners(),
                }),
            );
        }
    }
    v
}

/// `queue`: the gateway queue (call scheduling §4) — order, length and per route key
/// the calls waiting, `E[p]` and wait, response time and stretch (mean, p50, p95); `null`
/// without a queue.
///
/// ```json
/// {"order": "sept", "length": 3, "max_length": 100,
///  "routes": {"thumb": {"queued": 3, "expected_processing_ms": 12.5, "completed": 40,
///    "wait_ms": {"count": 9, "mean": 80.1, "p50": 75.0, "p95": 160.0},
///    "response_ms": {…}, "stretch": {…}}}}
/// ```
fn queue_json(q: Option<&crate::policy::core::QueueStatus>) -> Value {
    let Some(q) = q else { return Value::Null };
    let routes: serde_json::Map<String, Value> = q
        .keys
        .iter()
        .map(|(name, k)| (name.clone(), json!(k)))
        .collect();
    json!({
        "order": q.order,
        "length": q.length,
        "max_length": q.max_length,
        "routes": routes,
    })
}

/// `r_max`: the value in force (LIBRA §III-B) and, when adaptive, the controller's
/// target, error and last adjustment. Times are seconds since the gateway started.
///
/// ```json
/// {"rps": 14.2, "adaptive": true, "target_percentile": 99.0, "target_ms": 250.0,
///  "min_rps": 4.0, "max_rps": 64.0, "integral": -0.11, "adjustments": 3,
///  "window_samples": 812, "next_adjustment_s": 40.0,
///  "error": -0.093, "measured_ms": 274.4,
///  "last_adjustment": {"at_s": 30.0, "from_rps": 15.6, "to_rps": 14.2, "adjustment_rps": -1.4},
///  "last_period": {"at_s": 30.0, "samples": 1203, "measured_ms": 274.4, "per_vm_rps": 12.1,
///                  "error": -0.093, "adjustment_rps": -1.4, "limit": null, "hold": null}}
/// ```
fn r_max_json(r_max_rps: f64, adaptive: Option<&RMaxStatus>) -> Value {
    let Some(a) = adaptive else {
        return json!({"rps": rate(r_max_rps), "adaptive": false});
    };
    let ms = |d: Option<std::time::Duration>| d.map(|d| millis(d.as_secs_f64() * 1000.0));
    let period = |p: &PeriodReport| {
        json!({
            "at_s": seconds(p.at),
            "samples": p.samples,
            "measured_ms": ms(p.measured),
            "per_vm_rps": p.per_vm_rps.map(rate),
            "error": p.error.map(num),
            "adjustment_rps": rate(p.adjustment_rps()),
            "limit": p.limit.map(|l| l.as_str()),
            "hold": p.hold.map(|h| h.as_str()),
        })
    };
    json!({
        "rps": rate(r_max_rps),
        "adaptive": true,
        "target_percentile": num(a.target_quantile * 100.0),
        "target_ms": millis(a.target.as_secs_f64() * 1000.0),
        "min_rps": rate(a.min_rps),
        "max_rps": rate(a.max_rps),
        "integral": num(a.integral),
        "adjustments": a.adjustments,
        "window_samples": a.window_samples,
        "next_adjustment_s": seconds(a.next_adjustment),
        "error": a.last_evaluated.and_then(|p| p.error).map(num),
        "measured_ms": a.last_evaluated.and_then(|p| ms(p.measured)),
        "last_adjustment": a.last_adjusted.map(|p| json!({
            "at_s": seconds(p.at),
            "from_rps": rate(p.before_rps),
            "to_rps": rate(p.after_rps),
            "adjustment_rps": rate(p.adjustment_rps()),
        })),
        "last_period": a.last.as_ref().map(period),
    })
}

/// The function tier: the first zone's backend kind, its instance or call counts (FaaSim
/// usage), and provider errors; `zones` lists every zone the same way.
fn functions_json(
    gw: &Gateway,
    zones: &[ZoneStatus],
    gw_failures: &[(crate::policy::placement::ZoneId, &'static str, u64)],
    fall_backs_to_vm: u64,
) -> Value {
    let zone_json = |i: usize, z: &ZoneStatus| {
        let backend = &gw.zone_backends()[i];
        let (cold, warm, throttled) = match (&z.usage, &z.calls) {
            (Some(u), _) => (u.cold_starts, u.warm_starts, u.throttled),
            (None, Some(c)) => (0, 0, c.throttled),
            (None, None) => (0, 0, 0),
        };
        json!({
            "name": z.name,
            "zone_kind": z.kind.as_str(),
            "kind": backend.kind(),
            "stats": {
                "instances": z.starting + z.busy + z.idle,
                "starting": z.starting,
                "busy": z.busy,
                "idle": z.idle,
                "cold_starts": cold,
                "warm_starts": warm,
                "throttled": throttled,
            },
            "usage": z.usage.map(|u| {
                json!({
                    "startup_seconds": u.startup.as_secs_f64(),
                    "busy_seconds": u.busy.as_secs_f64(),
                    "idle_seconds": u.idle.as_secs_f64(),
                    "shutdown_seconds": u.shutdown.as_secs_f64(),
                    "instance_hours": u.instance_hours(),
                    "instances_started": u.instances_started,
                    "instances_expired": u.instances_expired,
                    "instances_stopping": z.stopping,
                    "prewarm_waits": u.prewarm_waits,
                    // FaaSim usage per instance (not yet stopped), in start order.
                    "instances": z.instances.iter().map(|i| json!({
                        "id": i.id.0,
                        "prewarmed": i.prewarmed,
                        "cold_starts": i.cold_starts,
                        "warm_starts": i.warm_starts,
                        "startup_seconds": i.startup.as_secs_f64(),
                        "busy_seconds": i.busy.as_secs_f64(),
                        "idle_seconds": i.idle.as_secs_f64(),
                        "shutdown_seconds": i.shutdown.as_secs_f64(),
                        "instance_hours": i.instance_hours(),
                    })).collect::<Vec<_>>(),
                })
            }),
            "errors": backend.errors(),
            // Failed calls by reason: unreachable, throttled,
            // cold_start_failed, instance_gone, never_ran, failed_after_send…
            "call_failures": gw_failures
                .iter()
                .filter(|(zone, _, _)| zone.0 as usize == i)
                .map(|(_, label, n)| ((*label).to_string(), json!(n)))
                .collect::<serde_json::Map<String, Value>>(),
        })
    };
    let all: Vec<Value> = zones
        .iter()
        .enumerate()
        .map(|(i, z)| zone_json(i, z))
        .collect();
    let mut v = match all.first() {
        Some(first) => {
            let mut v = first.clone();
            v["zones"] = Value::Array(all);
            v
        }
        None => json!({"zones": []}),
    };
    v["fall_backs_to_vm"] = json!(fall_backs_to_vm);
    v
}

#[cfg(test)]
mod redact_tests {
    use super::*;

    #[test]
    fn status_text_loses_credentials_and_length() {
        let t = redact_text("GET http://user:pa55@10.0.0.1/x failed token=abc123 done");
        assert_eq!(t, "GET http://***@10.0.0.1/x failed token=*** done");
        let long = "e".repeat(MAX_STATUS_ERROR_CHARS * 3);
        assert_eq!(
            redact_text(&long).chars().count(),
            MAX_STATUS_ERROR_CHARS + 1
        );
    }
}
