//! The admin listener: `GET /healthz`, `GET /metrics` (Prometheus text), `GET /status`
//! (JSON). Bind it to loopback: it has no authentication.

use std::convert::Infallible;
use std::sync::Arc;

use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use hyper::body::Incoming;
use metrics_exporter_prometheus::PrometheusHandle;
use serde_json::{Value, json};

use super::driver::Gateway;
use crate::net::body::{self, Body};
use crate::policy::placement::ZoneStatus;
use crate::policy::rmax::{PeriodReport, RMaxStatus};

/// Answer one admin request.
pub async fn handle(
    gw: Arc<Gateway>,
    prometheus: PrometheusHandle,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let resp = match (req.method(), req.uri().path()) {
        (&Method::GET, "/healthz") => text(StatusCode::OK, "ok\n".into(), "text/plain"),
        (&Method::GET, "/metrics") => text(
            StatusCode::OK,
            prometheus.render(),
            "text/plain; version=0.0.4",
        ),
        (&Method::GET, "/status") => text(
            StatusCode::OK,
            serde_json::to_string_pretty(&status_json(&gw)).unwrap_or_default() + "\n",
            "application/json",
        ),
        (_, "/healthz" | "/metrics" | "/status") => text(
            StatusCode::METHOD_NOT_ALLOWED,
            "method not allowed\n".into(),
            "text/plain",
        ),
        _ => text(StatusCode::NOT_FOUND, "not found\n".into(), "text/plain"),
    };
    Ok(resp)
}

fn text(status: StatusCode, s: String, content_type: &'static str) -> Response<Body> {
    let mut r = Response::new(body::full(s));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

fn num(x: f64) -> Value {
    if x.is_finite() { json!(x) } else { Value::Null }
}

/// The `/status` document. Rates in requests/s; `routed` counts are cumulative.
///
/// ```json
/// {"epoch": 12,
///  "traffic": {"avg": 41.2, "std": 3.1, "last_epoch_requests": 44},
///  "scaling": {"vm_reqs": 44.3, "budget_rps": 40.0, "target_vms": 3, "ready_vms": 2, ...},
///  "routed": {"vm": 1200, "function": 310, "rejected": 0},
///  "functions": {...}, "vms": [...]}
/// ```
pub fn status_json(gw: &Gateway) -> Value {
    let s = gw.status();
    let c = &s.core.controller;
    json!({
        "epoch": c.epoch,
        "traffic": {
            "avg": c.avg_rps,
            "std": c.std_rps,
            "last_epoch_requests": c.last_epoch_requests,
        },
        "scaling": {
            "vm_reqs": num(c.vm_reqs_rps),
            "budget_rps": num(c.published_vm_reqs_rps),
            "cip_rps": num(gw.cip_rps()),
            "target_vms": c.pool.target,
            "ready_vms": c.pool.ready,
            "booting_vms": c.pool.booting,
            "draining_vms": c.pool.draining,
            "executes_scaling": gw.vm_provider().executes_scaling(),
            "last_decision": s.last_decision.map(|(epoch, d)| json!({
                "epoch": epoch,
                "target_vms": d.target_vms,
                "vm_reqs": num(d.vm_reqs_rps),
                "reason": d.reason.as_str(),
            })),
        },
        "r_max": r_max_json(c.r_max_rps, s.core.r_max.as_ref()),
        "routed": {
            "vm": c.routed.vm,
            "function": c.routed.function,
            "rejected": c.routed.rejected,
        },
        "vm_pool": {
            "kind": gw.vm_provider().kind(),
            "vms": s.vms,
            "errors": gw.vm_provider().errors(),
        },
        "functions": functions_json(gw, &s.core.zones),
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
        return json!({"rps": num(r_max_rps), "adaptive": false});
    };
    let ms = |d: Option<std::time::Duration>| d.map(|d| num(d.as_secs_f64() * 1000.0));
    let period = |p: &PeriodReport| {
        json!({
            "at_s": p.at.as_secs_f64(),
            "samples": p.samples,
            "measured_ms": ms(p.measured),
            "per_vm_rps": p.per_vm_rps.map(num),
            "error": p.error.map(num),
            "adjustment_rps": num(p.adjustment_rps()),
            "limit": p.limit.map(|l| l.as_str()),
            "hold": p.hold.map(|h| h.as_str()),
        })
    };
    json!({
        "rps": num(r_max_rps),
        "adaptive": true,
        "target_percentile": num(a.target_quantile * 100.0),
        "target_ms": num(a.target.as_secs_f64() * 1000.0),
        "min_rps": num(a.min_rps),
        "max_rps": num(a.max_rps),
        "integral": num(a.integral),
        "adjustments": a.adjustments,
        "window_samples": a.window_samples,
        "next_adjustment_s": a.next_adjustment.as_secs_f64(),
        "error": a.last_evaluated.and_then(|p| p.error).map(num),
        "measured_ms": a.last_evaluated.and_then(|p| ms(p.measured)),
        "last_adjustment": a.last_adjusted.map(|p| json!({
            "at_s": p.at.as_secs_f64(),
            "from_rps": num(p.before_rps),
            "to_rps": num(p.after_rps),
            "adjustment_rps": num(p.adjustment_rps()),
        })),
        "last_period": a.last.as_ref().map(period),
    })
}

/// The function tier: the first zone's backend kind, its instance or call counts (FaaSim
/// usage), and provider errors; `zones` lists every zone the same way.
fn functions_json(gw: &Gateway, zones: &[ZoneStatus]) -> Value {
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
            "errors": backend.errors(),
        })
    };
    let all: Vec<Value> = zones
        .iter()
        .enumerate()
        .map(|(i, z)| zone_json(i, z))
        .collect();
    match all.first() {
        Some(first) => {
            let mut v = first.clone();
            v["zones"] = Value::Array(all);
            v
        }
        None => json!({"zones": []}),
    }
}
