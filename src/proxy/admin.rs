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
use crate::telemetry as m;

/// Answer one admin request.
pub async fn handle(
    gw: Arc<Gateway>,
    prometheus: PrometheusHandle,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let resp = match (req.method(), req.uri().path()) {
        (&Method::GET, "/healthz") => text(StatusCode::OK, "ok\n".into(), "text/plain"),
        (&Method::GET, "/metrics") => {
            scrape_gauges(&gw);
            text(
                StatusCode::OK,
                prometheus.render(),
                "text/plain; version=0.0.4",
            )
        }
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

/// Gauges read at scrape time (the CIP in force, function instances per zone and
/// state), and the provider-error series of the providers this gateway runs, registered
/// at zero on the first scrape.
fn scrape_gauges(gw: &Gateway) {
    m::cip_gauge(gw.cip_rps());
    for z in &gw.status().core.zones {
        m::function_instances(&z.name, z.starting, z.busy, z.idle);
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
///  "vm_pool": {"kind": "process", "vms": […], "errors": {…}},
///  "functions": {"kind": "process", "instances": {"busy": 1, "idle": 2}, …}}
/// ```
pub fn status_json(gw: &Gateway) -> Value {
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
