//! The metrics spec: every Prometheus metric spillway exports, named
//! `spillway_<subsystem>_<name>_<unit>[_total]` with label values from fixed sets. The
//! policy core returns decision structs; only the drivers call these functions.
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `spillway_requests_total` | counter | `tier` = vm, function, local; `status` = 1xx…5xx |
//! | `spillway_request_duration_seconds` | histogram | `tier` |
//! | `spillway_routing_decisions_total` | counter | `tier` = vm, function, rejected; `reason` = [`RouteReason::as_str`](crate::policy::balancer::RouteReason::as_str) |
//! | `spillway_retries_total` | counter | `kind` = connect_failure, spill_back |
//! | `spillway_vms` | gauge | `state` = booting, ready, draining, target |
//! | `spillway_traffic_avg_rps`, `spillway_traffic_std_rps` | gauge | — |
//! | `spillway_vm_budget_rps` | gauge | — (the budget the balancer uses, before ρ) |
//! | `spillway_scale_decisions_total` | counter | `direction` = up, down, hold |
//! | `spillway_vm_failures_total` | counter | `stage` = launch, not_ready, unreachable |
//! | `spillway_vm_boot_seconds` | histogram | — |
//! | `spillway_function_cold_starts_total` | counter | — (incremented by the function tiers) |
//! | `spillway_r_max_rps` | gauge | — (r_max in force, LIBRA §III-B: static or adapted) |
//! | `spillway_r_max_error` | gauge | — (adaptive: `ln(target / measured)` of the last evaluated period) |
//! | `spillway_r_max_vm_latency_seconds` | gauge | — (adaptive: the measured VM latency percentile of that period) |
//! | `spillway_r_max_adjustment_rps` | gauge | — (adaptive: the last change of r_max, signed) |
//! | `spillway_r_max_adjustments_total` | counter | — (adaptive: periods that changed r_max) |
//! | `spillway_provider_errors_total` | counter | `provider` = ec2, lambda; `operation` = the API call (ec2: run_instances, describe_instances, terminate_instances; lambda: invoke, function, put/get/delete_provisioned_concurrency_config); `kind` = [`ErrorKind::as_str`](crate::backends::provider_errors::ErrorKind::as_str) (capacity, quota, throttling, access_denied, unreachable, timeout, invalid_request, other) |

use std::time::Duration;

use metrics::{counter, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::policy::controller::ControllerStatus;
use crate::policy::rmax::RMaxStatus;

/// Install the Prometheus recorder (once per process) and return the render handle.
/// A second call in the same process (tests) returns a handle to a private recorder.
pub fn install() -> PrometheusHandle {
    let builder = || {
        PrometheusBuilder::new()
            .set_buckets_for_metric(
                Matcher::Suffix("_seconds".to_string()),
                &[
                    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                    30.0,
                ],
            )
            .expect("bucket list is non-empty")
    };
    match builder().install_recorder() {
        Ok(handle) => {
            describe();
            handle
        }
        Err(_) => builder().build_recorder().handle(),
    }
}

fn describe() {
    metrics::describe_counter!(
        "spillway_requests_total",
        "Requests answered, by tier and status class."
    );
    metrics::describe_histogram!(
        "spillway_request_duration_seconds",
        metrics::Unit::Seconds,
        "Time to response headers, by tier."
    );
    metrics::describe_counter!(
        "spillway_routing_decisions_total",
        "Balancer decisions, by tier and reason."
    );
    metrics::describe_gauge!("spillway_vms", "VMs per state, and the target.");
    metrics::describe_gauge!(
        "spillway_traffic_avg_rps",
        "Traffic monitor EWMA request rate, requests/s."
    );
    metrics::describe_gauge!(
        "spillway_traffic_std_rps",
        "Traffic monitor EWMA absolute deviation, requests/s."
    );
    metrics::describe_gauge!(
        "spillway_vm_budget_rps",
        "VM budget the balancer uses (before rho), requests/s."
    );
    metrics::describe_counter!(
        "spillway_scale_decisions_total",
        "Scaling decisions, by direction."
    );
    metrics::describe_counter!(
        "spillway_function_cold_starts_total",
        "Function cold starts."
    );
    metrics::describe_gauge!(
        "spillway_r_max_rps",
        "r_max in force (requests/s one VM serves within the SLA), static or adapted."
    );
    metrics::describe_gauge!(
        "spillway_r_max_error",
        "Adaptive r_max: ln(target / measured VM latency percentile) of the last evaluated period."
    );
    metrics::describe_gauge!(
        "spillway_r_max_vm_latency_seconds",
        metrics::Unit::Seconds,
        "Adaptive r_max: the VM latency percentile measured in the last evaluated period."
    );
    metrics::describe_gauge!(
        "spillway_r_max_adjustment_rps",
        "Adaptive r_max: the last change of r_max, requests/s (negative: lowered)."
    );
    metrics::describe_counter!(
        "spillway_r_max_adjustments_total",
        "Adaptive r_max: control periods that changed r_max."
    );
    metrics::describe_counter!(
        "spillway_provider_errors_total",
        "Failed cloud provider API calls, by provider, operation and error kind."
    );
}

/// A request finished on `tier` with `status` after `elapsed` (to response headers).
pub fn request(tier: &'static str, status: u16, elapsed: Duration) {
    let class = match status / 100 {
        1 => "1xx",
        2 => "2xx",
        3 => "3xx",
        4 => "4xx",
        _ => "5xx",
    };
    counter!("spillway_requests_total", "tier" => tier, "status" => class).increment(1);
    histogram!("spillway_request_duration_seconds", "tier" => tier).record(elapsed.as_secs_f64());
}

/// One balancer decision.
pub fn routing(tier: &'static str, reason: &'static str) {
    counter!("spillway_routing_decisions_total", "tier" => tier, "reason" => reason).increment(1);
}

/// A retry or spill-back attempt.
pub fn retry(kind: &'static str) {
    counter!("spillway_retries_total", "kind" => kind).increment(1);
}

/// A scaling decision.
pub fn scale_decision(direction: &'static str) {
    counter!("spillway_scale_decisions_total", "direction" => direction).increment(1);
}

/// A VM failed at `stage`.
pub fn vm_failures(stage: &'static str) {
    counter!("spillway_vm_failures_total", "stage" => stage).increment(1);
}

/// A cloud provider API call failed (labels from fixed sets, see the table above).
pub fn provider_error(provider: &'static str, operation: &'static str, kind: &'static str) {
    counter!("spillway_provider_errors_total", "provider" => provider, "operation" => operation, "kind" => kind)
        .increment(1);
}

/// A VM became ready after `elapsed`.
pub fn vm_boot_seconds(elapsed: Duration) {
    histogram!("spillway_vm_boot_seconds").record(elapsed.as_secs_f64());
}

/// Export the controller's gauges.
pub fn controller_gauges(s: &ControllerStatus) {
    gauge!("spillway_vms", "state" => "booting").set(f64::from(s.pool.booting));
    gauge!("spillway_vms", "state" => "ready").set(f64::from(s.pool.ready));
    gauge!("spillway_vms", "state" => "draining").set(f64::from(s.pool.draining));
    gauge!("spillway_vms", "state" => "target").set(f64::from(s.pool.target));
    gauge!("spillway_traffic_avg_rps").set(s.avg_rps);
    gauge!("spillway_traffic_std_rps").set(s.std_rps);
    gauge!("spillway_vm_budget_rps").set(finite_or_zero(s.published_vm_reqs_rps));
    gauge!("spillway_r_max_rps").set(finite_or_zero(s.r_max_rps));
}

/// Export the adaptive r_max controller's gauges (LIBRA §III-B).
pub fn r_max_gauges(s: &RMaxStatus) {
    if let Some(last) = &s.last_evaluated {
        gauge!("spillway_r_max_error").set(last.error.unwrap_or(0.0));
        if let Some(y) = last.measured {
            gauge!("spillway_r_max_vm_latency_seconds").set(y.as_secs_f64());
        }
        gauge!("spillway_r_max_adjustment_rps").set(last.adjustment_rps());
    }
    counter!("spillway_r_max_adjustments_total").absolute(s.adjustments);
}

fn finite_or_zero(x: f64) -> f64 {
    if x.is_finite() { x } else { 0.0 }
}
