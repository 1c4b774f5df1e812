//! The metrics spec: every Prometheus metric spillway exports, named
//! `spillway_<subsystem>_<name>_<unit>[_total]` with label values from fixed sets. The
//! policy core returns decision structs; only the drivers call these functions.
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `spillway_build_info` | gauge (always 1) | `version`, `commit`, `features` ([`crate::build_info`]) |
//! | `spillway_requests_total` | counter | `tier` = vm, function, local; `status` = 1xx…5xx |
//! | `spillway_requests_in_flight` | gauge | — (received, response not finished yet) |
//! | `spillway_request_duration_seconds` | histogram | `tier` (time to response headers) |
//! | `spillway_routing_decisions_total` | counter | `tier` = vm, function, rejected, queued (a call entering the gateway queue); `reason` = [`RouteReason::as_str`](crate::policy::balancer::RouteReason::as_str) |
//! | `spillway_retries_total` | counter | `kind` = connect_failure, spill_back, fall_through |
//! | `spillway_vms` | gauge | `state` = booting, ready, draining (`sum()` = VMs that exist) |
//! | `spillway_vms_target` | gauge | — (the last decided VM count) |
//! | `spillway_traffic_avg_rps` | gauge | — (EWMA of requests per epoch, per second) |
//! | `spillway_traffic_mean_abs_deviation_rps` | gauge | — (LIBRA's "std": an EWMA of absolute deviations) |
//! | `spillway_vm_budget_rps` | gauge | — (`min(vm_reqs, ready·r_max)`, before ρ) |
//! | `spillway_accept_errors_total` | counter | `listener` = proxy, tls, admin (failed `accept`, e.g. at the file-descriptor limit) |
//! | `spillway_worker_connections_total` | counter | `worker` = 0 … `gateway.worker_threads` − 1 (client connections the data-plane worker thread accepted, plain and TLS) |
//! | `spillway_timeouts_total` | counter | `kind` = upstream_head, request_body, response_body, tunnel_idle; first_request, header_read, keepalive_idle (client connections closed by `proxy::lifetime`) |
//! | `spillway_client_connections` | gauge | `budget` = proxy (plain and TLS listeners), admin |
//! | `spillway_connections_refused_total` | counter | `listener` = proxy, tls, admin; `limit` = max_connections, max_connections_per_client_ip (closed at accept) |
//! | `spillway_cip_rps` | gauge | — (the cost-indifference point in force, LIBRA §III-A: `libra.cip_rps` or computed from `pricing`; set at every scrape) |
//! | `spillway_cost_dollars_total` | counter | `tier` = vm (`zone`: the instance type), function, provisioned; `zone` — the running bill since start, USD ([`crate::policy::cost::CostMeter`]); written by the admin listener (float counter), not this module |
//! | `spillway_cost_counterfactual_dollars_total` | counter | `policy` = all_functions, all_vm — the same arrivals on one tier only, since start, USD; written by the admin listener |
//! | `spillway_cost_last_hour_dollars` | gauge | `policy` = hybrid (the bill), all_functions, all_vm — the last hour, as `/status` `cost.last_hour`; set at every scrape |
//! | `spillway_async_deadline_misses_total` | counter | — (asynchronous calls that finished after their deadline, ProFaaStinate §3; set at every scrape from the delay queue)
//! | `spillway_scale_decisions_total` | counter | `direction` = up, down, hold |
//! | `spillway_vm_failures_total` | counter | `stage` = launch, not_ready, unreachable, terminated |
//! | `spillway_vm_boot_seconds` | histogram | — |
//! | `spillway_function_cold_starts_total` | counter | — (incremented by the function tiers) |
//! | `spillway_r_max_rps` | gauge | — (r_max in force, LIBRA §III-B: static or adapted) |
//! | `spillway_r_max_error` | gauge | — (adaptive: `ln(target / measured)` of the last evaluated period) |
//! | `spillway_r_max_vm_latency_seconds` | gauge | — (adaptive: the measured VM latency percentile of that period) |
//! | `spillway_r_max_adjustment_rps` | gauge | — (adaptive: the last change of r_max, signed) |
//! | `spillway_r_max_adjustments_total` | counter | — (adaptive: periods that changed r_max) |
//! | `spillway_function_instances` | gauge | `zone` (function zone name), `state` = starting, busy (running a call, or calls in flight in a concurrency-limited zone), idle (warm); set at every scrape |
//! | `spillway_queue_length` | gauge | `route` (route key): calls waiting in the gateway queue (call scheduling §4); set at every scrape |
//! | `spillway_queue_expected_processing_seconds` | gauge | `route`: `E[p]`, the mean of the key's last 10 completed calls; set at every scrape |
//! | `spillway_queue_wait_seconds` | gauge | `route`, `stat` = mean, p50, p95: queue wait of served calls; set at every scrape |
//! | `spillway_route_response_seconds` | gauge | `route`, `stat`: response time R (arrival to end of the response body); set at every scrape |
//! | `spillway_route_stretch` | gauge | `route`, `stat`: stretch R / p; set at every scrape |
//! | `spillway_function_cold_start_seconds` | histogram | — (a call's cold start, excluded from its processing time p) |
//! | `spillway_queue_calls_total` | counter | `outcome` = queued, served, timeout, full, cancelled |
//! | `spillway_function_usage_seconds` | gauge | `zone`, `phase` = startup (cold starts), busy, idle (closed idle periods), shutdown (keep-alive expiry to stopped) — FaaSim usage time, set at every scrape |
//! | `spillway_function_starts` | gauge | `zone`, `start` = cold, warm — calls by start kind since startup, set at every scrape |
//! | `spillway_function_instance_usage_seconds` | gauge | `zone`, `instance` (the instance id, reused after it stopped), `phase` = startup, busy, idle, shutdown — FaaSim usage time of each instance not yet stopped, set at every scrape |
//! | `spillway_function_instance_starts` | gauge | `zone`, `instance`, `start` = cold, warm — that instance's calls by start kind |
//! | `spillway_provider_errors_total` | counter | `provider` = ec2, lambda; `operation` = the API call (ec2: run_instances, describe_instances, terminate_instances; lambda: invoke, function, put/get/delete_provisioned_concurrency_config); `kind` = [`ErrorKind::as_str`](crate::backends::provider_errors::ErrorKind::as_str) (capacity, quota, throttling, access_denied, unreachable, timeout, invalid_request, other) |
//! | `spillway_coordination_role` | gauge | `role` = leader, follower, local (1 for this replica's role, 0 for the others; several replicas, `crate::coord`) |
//! | `spillway_coordination_term` | gauge | — (the leader's term: the fencing token) |
//! | `spillway_coordination_share` | gauge | — (this replica's share of the VM budget, 0–1) |
//! | `spillway_coordination_replicas` | gauge | — (replicas counted live) |
//! | `spillway_coordination_store_errors_total` | counter | `operation` = exchange, acquire, renew, release, publish, intent; `kind` = timeout, redis, reply, unavailable |
//! | `spillway_coordination_store_seconds` | histogram | `operation` (one store round trip) |
//!
//! Every counter exists from startup at zero for the label values the running gateway can
//! produce (its provider's operations included), so that `rate()` and `increase()` work
//! from the first scrape; every metric has HELP text (`describe`).

use std::time::Duration;

use std::sync::OnceLock;

use metrics::{Counter, Gauge, Histogram, counter, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::policy::balancer::RouteReason;
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
            zero_counters();
            let _ = HOT.set(Hot::resolve());
            gauge!(
                "spillway_build_info",
                "version" => crate::build_info::VERSION,
                "commit" => crate::build_info::COMMIT,
                "features" => crate::build_info::FEATURES
            )
            .set(1.0);
            gauge!("spillway_requests_in_flight").set(0.0);
            // The driver and the admin scrape keep these current; zero until they do.
            for state in ["booting", "ready", "draining"] {
                gauge!("spillway_vms", "state" => state).set(0.0);
            }
            for name in [
                "spillway_vms_target",
                "spillway_traffic_avg_rps",
                "spillway_traffic_mean_abs_deviation_rps",
                "spillway_vm_budget_rps",
            ] {
                gauge!(name).set(0.0);
            }
            handle
        }
        Err(_) => builder().build_recorder().handle(),
    }
}

/// The tier a reason sends a request to in the gateway (LIBRA's balancer), or `None` for
/// reasons only the simulator's baselines give. Exhaustive: a new reason must be placed.
fn gateway_tier(reason: RouteReason) -> Option<&'static str> {
    match reason {
        RouteReason::WithinBudget
        | RouteReason::UpgradePinned
        | RouteReason::FallBackOverBudget => Some("vm"),
        RouteReason::BudgetExhausted
        | RouteReason::NoReadyVm
        | RouteReason::VmsSaturated
        | RouteReason::AsyncDeadline => Some("function"),
        RouteReason::UpgradeNoReadyVm
        | RouteReason::SpillBackRejected
        | RouteReason::QueueFull
        | RouteReason::QueueTimeout => Some("rejected"),
        RouteReason::VmOnly | RouteReason::FunctionOnly | RouteReason::ScalingOut => None,
    }
}

const ROUTE_REASONS: [RouteReason; 14] = [
    RouteReason::AsyncDeadline,
    RouteReason::WithinBudget,
    RouteReason::BudgetExhausted,
    RouteReason::NoReadyVm,
    RouteReason::UpgradePinned,
    RouteReason::UpgradeNoReadyVm,
    RouteReason::SpillBackRejected,
    RouteReason::FallBackOverBudget,
    RouteReason::VmOnly,
    RouteReason::FunctionOnly,
    RouteReason::ScalingOut,
    RouteReason::VmsSaturated,
    RouteReason::QueueFull,
    RouteReason::QueueTimeout,
];

/// Register every counter series the gateway can produce, at zero.
fn zero_counters() {
    for tier in REQUEST_TIERS {
        for status in STATUS_CLASSES {
            counter!("spillway_requests_total", "tier" => tier, "status" => status).increment(0);
        }
    }
    for reason in ROUTE_REASONS {
        if let Some(tier) = gateway_tier(reason) {
            counter!("spillway_routing_decisions_total", "tier" => tier, "reason" => reason.as_str())
                .increment(0);
        }
    }
    for kind in ["connect_failure", "spill_back", "fall_through"] {
        counter!("spillway_retries_total", "kind" => kind).increment(0);
    }
    for listener in ["proxy", "tls", "admin"] {
        counter!("spillway_accept_errors_total", "listener" => listener).increment(0);
        for limit in ["max_connections", "max_connections_per_client_ip"] {
            counter!("spillway_connections_refused_total", "listener" => listener, "limit" => limit)
                .increment(0);
        }
    }
    for kind in TIMEOUT_KINDS {
        counter!("spillway_timeouts_total", "kind" => kind).increment(0);
    }
    for direction in ["up", "down", "hold"] {
        counter!("spillway_scale_decisions_total", "direction" => direction).increment(0);
    }
    for stage in ["launch", "not_ready", "unreachable", "terminated"] {
        counter!("spillway_vm_failures_total", "stage" => stage).increment(0);
    }
    counter!("spillway_function_cold_starts_total").increment(0);
    for outcome in ["queued", "served", "timeout", "full", "cancelled"] {
        counter!("spillway_queue_calls_total", "outcome" => outcome).increment(0);
    }
}

/// Tiers of `spillway_requests_total` and `spillway_request_duration_seconds`.
const REQUEST_TIERS: [&str; 3] = ["vm", "function", "local"];
/// `status` labels of `spillway_requests_total`, by `status / 100 - 1` (5xx for above).
const STATUS_CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

/// Handles of the metrics every request touches, resolved once when the recorder is
/// installed: a `counter!` with labels builds its key, hashes it and looks
/// it up in the registry on every call; a handle is one atomic add.
struct Hot {
    in_flight: Gauge,
    /// By [`REQUEST_TIERS`] index, then [`STATUS_CLASSES`] index.
    requests: [[Counter; 5]; 3],
    /// By [`REQUEST_TIERS`] index.
    duration: [Histogram; 3],
    /// `(tier, reason)` of every decision the gateway can make.
    routing: Vec<(&'static str, &'static str, Counter)>,
}

static HOT: OnceLock<Hot> = OnceLock::new();

impl Hot {
    fn resolve() -> Self {
        Self {
            in_flight: gauge!("spillway_requests_in_flight"),
            requests: REQUEST_TIERS.map(|tier| {
                STATUS_CLASSES.map(
                    |status| counter!("spillway_requests_total", "tier" => tier, "status" => status),
                )
            }),
            duration: REQUEST_TIERS
                .map(|tier| histogram!("spillway_request_duration_seconds", "tier" => tier)),
            routing: ROUTE_REASONS
                .iter()
                .filter_map(|&reason| {
                    let tier = gateway_tier(reason)?;
                    let c = counter!("spillway_routing_decisions_total", "tier" => tier, "reason" => reason.as_str());
                    Some((tier, reason.as_str(), c))
                })
                .collect(),
        }
    }
}

/// Register `spillway_provider_errors_total` at zero for a provider's operations and
/// every error kind (the gateway calls it for the providers it runs).
pub fn zero_provider_errors(
    provider: &'static str,
    operations: &[&'static str],
    kinds: &[&'static str],
) {
    for &operation in operations {
        for &kind in kinds {
            counter!("spillway_provider_errors_total", "provider" => provider, "operation" => operation, "kind" => kind)
                .increment(0);
        }
    }
}

/// Describe every metric (the HELP lines).
fn describe() {
    metrics::describe_gauge!(
        "spillway_queue_length",
        "Calls waiting in the gateway queue, by route key."
    );
    metrics::describe_gauge!(
        "spillway_queue_expected_processing_seconds",
        metrics::Unit::Seconds,
        "E[p]: mean processing time of the route key's last 10 completed calls."
    );
    metrics::describe_gauge!(
        "spillway_queue_wait_seconds",
        metrics::Unit::Seconds,
        "Queue wait of served calls (mean, p50, p95), by route key."
    );
    metrics::describe_gauge!(
        "spillway_route_response_seconds",
        metrics::Unit::Seconds,
        "Response time from arrival to the end of the response body (mean, p50, p95), by route key."
    );
    metrics::describe_gauge!(
        "spillway_route_stretch",
        "Stretch: response time over processing time (mean, p50, p95), by route key."
    );
    metrics::describe_histogram!(
        "spillway_function_cold_start_seconds",
        metrics::Unit::Seconds,
        "Cold starts of function instances for a call (not part of the call's processing time)."
    );
    metrics::describe_counter!(
        "spillway_worker_connections_total",
        "Client connections accepted by each data-plane worker thread (gateway.worker_threads)."
    );
    metrics::describe_counter!(
        "spillway_queue_calls_total",
        "Calls through the gateway queue, by outcome."
    );
    metrics::describe_counter!(
        "spillway_async_accepted_total",
        "Asynchronous calls accepted (stored, 202; ProFaaStinate delay queue)."
    );
    metrics::describe_counter!(
        "spillway_async_released_total",
        "Asynchronous calls released from the delay queue, by kind (idle, urgent, forced) and tier of the first attempt."
    );
    metrics::describe_counter!(
        "spillway_async_finished_total",
        "Asynchronous calls finished: done (an upstream answered) or failed."
    );
    metrics::describe_gauge!(
        "spillway_async_queued",
        "Asynchronous calls waiting in the delay queue."
    );
    metrics::describe_gauge!(
        "spillway_async_oldest_wait_seconds",
        metrics::Unit::Seconds,
        "How long the longest-waiting asynchronous call has waited."
    );
    metrics::describe_gauge!(
        "spillway_async_busy",
        "Delay-queue scheduler mode: 1 busy, 0 idle."
    );
    metrics::describe_gauge!(
        "spillway_async_cpu_utilisation",
        "The delay-queue scheduler's CPU signal averaged over its window, 0-1."
    );
    metrics::describe_counter!(
        "spillway_async_deadline_misses_total",
        "Asynchronous calls that finished after their deadline."
    );
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
    metrics::describe_gauge!(
        "spillway_build_info",
        "Always 1; the labels say which spillway runs (version, git commit, cargo features)."
    );
    metrics::describe_gauge!(
        "spillway_requests_in_flight",
        "Requests received whose response has not finished yet."
    );
    metrics::describe_gauge!(
        "spillway_client_connections",
        "Client connections open now, per connection budget (proxy: plain and TLS listeners; admin)."
    );
    metrics::describe_counter!(
        "spillway_connections_refused_total",
        "Client connections closed at accept because a connection limit was reached."
    );
    metrics::describe_counter!(
        "spillway_accept_errors_total",
        "Failed accept calls per listener (e.g. the file-descriptor limit); the accept loop backs off."
    );
    metrics::describe_counter!(
        "spillway_timeouts_total",
        "Timeouts: upstream_head (no response head within upstream_timeout_seconds after the request body was sent), request_body (client body idle), response_body (upstream body idle: response aborted), tunnel_idle (Upgrade tunnel closed)."
    );
    metrics::describe_counter!(
        "spillway_retries_total",
        "Repeated attempts: connect_failure (a retry after a connect failure), spill_back (a fall-back to a VM after the function tier throttled or failed before sending), fall_through (the next function zone)."
    );
    metrics::describe_gauge!(
        "spillway_vms",
        "VMs per state (booting, ready, draining); the sum is every VM that exists."
    );
    metrics::describe_gauge!(
        "spillway_vms_target",
        "VM count of the last scaling decision (booting + ready wanted)."
    );
    metrics::describe_gauge!(
        "spillway_traffic_avg_rps",
        "Traffic monitor: EWMA of the requests per epoch, in requests/s."
    );
    metrics::describe_gauge!(
        "spillway_traffic_mean_abs_deviation_rps",
        "Traffic monitor: EWMA of the absolute deviation of the epoch count from the average (LIBRA's std), in requests/s."
    );
    metrics::describe_gauge!(
        "spillway_vm_budget_rps",
        "VM budget the balancer uses (before rho), requests/s."
    );
    metrics::describe_gauge!(
        "spillway_cost_last_hour_dollars",
        "The bill of the last hour, USD: hybrid (what ran), all_functions and all_vm (the same arrivals on one tier only)."
    );
    metrics::describe_gauge!(
        "spillway_cip_rps",
        "Cost-indifference point in force, requests/s: below it every VM is released (libra.cip_rps, or computed from pricing)."
    );
    metrics::describe_counter!(
        "spillway_scale_decisions_total",
        "Scaling decisions, by direction."
    );
    metrics::describe_counter!(
        "spillway_vm_failures_total",
        "VMs that failed, by stage: launch refused, not ready before the boot timeout, unreachable after a connect failure."
    );
    metrics::describe_histogram!(
        "spillway_vm_boot_seconds",
        metrics::Unit::Seconds,
        "Time from launch to ready (readiness probe passed) of each VM."
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
    metrics::describe_gauge!(
        "spillway_function_instances",
        "Function instances per zone and state: starting, busy (running a call, or calls in flight in a concurrency-limited zone), idle (warm)."
    );
    metrics::describe_gauge!(
        "spillway_function_usage_seconds",
        metrics::Unit::Seconds,
        "FaaSim usage time of a function zone's instances since startup: startup (cold starts), busy, idle (closed idle periods), shutdown (keep-alive expiry to stopped)."
    );
    metrics::describe_gauge!(
        "spillway_function_instance_usage_seconds",
        metrics::Unit::Seconds,
        "FaaSim usage time of one function instance not yet stopped (instance = its id, reused after it stopped): startup, busy, idle, shutdown."
    );
    metrics::describe_gauge!(
        "spillway_function_instance_starts",
        "Calls of one function instance not yet stopped by start kind (cold, warm)."
    );
    metrics::describe_gauge!(
        "spillway_function_starts",
        "Calls of a function zone by start kind (cold, warm) since startup."
    );
    metrics::describe_counter!(
        "spillway_provider_errors_total",
        "Failed cloud provider API calls, by provider, operation and error kind."
    );
    metrics::describe_gauge!(
        "spillway_coordination_role",
        "This replica's role among the coordinated replicas: 1 for leader, follower or local (cut off from the store: local decisions), 0 for the others."
    );
    metrics::describe_gauge!(
        "spillway_coordination_term",
        "The scaling leader's term (fencing token)."
    );
    metrics::describe_gauge!(
        "spillway_coordination_share",
        "This replica's share of the VM budget, 0-1."
    );
    metrics::describe_gauge!(
        "spillway_coordination_replicas",
        "Gateway replicas counted live by the coordination store."
    );
    metrics::describe_counter!(
        "spillway_coordination_store_errors_total",
        "Failed coordination store operations, by operation and kind (timeout, redis, reply, unavailable)."
    );
    metrics::describe_histogram!(
        "spillway_coordination_store_seconds",
        metrics::Unit::Seconds,
        "Duration of one coordination store round trip, by operation."
    );
}

/// Store operations of the coordinator (`crate::coord`), for the metrics' labels.
pub const COORDINATION_OPERATIONS: [&str; 6] = [
    "exchange", "acquire", "renew", "release", "publish", "intent",
];
/// Store error kinds (`crate::coord::StoreError::kind`).
pub const COORDINATION_ERROR_KINDS: [&str; 4] = ["timeout", "redis", "reply", "unavailable"];

/// Register the coordination metrics at zero (a coordinated gateway, at start).
pub fn zero_coordination() {
    for op in COORDINATION_OPERATIONS {
        for kind in COORDINATION_ERROR_KINDS {
            counter!("spillway_coordination_store_errors_total", "operation" => op, "kind" => kind)
                .increment(0);
        }
    }
}

/// Roles of a coordinated replica (`crate::coord::Role::as_str`).
pub const COORDINATION_ROLES: [&str; 3] = ["leader", "follower", "local"];

/// The coordinator's state after a round: this replica's `role` (one of
/// [`COORDINATION_ROLES`]), the leader's `term`, this replica's `share` and the live
/// `replicas`.
pub fn coordination(role: &str, term: u64, share: f64, replicas: u32) {
    for r in COORDINATION_ROLES {
        gauge!("spillway_coordination_role", "role" => r).set(if r == role { 1.0 } else { 0.0 });
    }
    gauge!("spillway_coordination_term").set(term as f64);
    gauge!("spillway_coordination_share").set(share);
    gauge!("spillway_coordination_replicas").set(f64::from(replicas));
}

/// One store operation took `elapsed`; `error` is its error kind when it failed.
pub fn coordination_store_op(
    operation: &'static str,
    elapsed: Duration,
    error: Option<&'static str>,
) {
    histogram!("spillway_coordination_store_seconds", "operation" => operation)
        .record(elapsed.as_secs_f64());
    if let Some(kind) = error {
        counter!("spillway_coordination_store_errors_total", "operation" => operation, "kind" => kind)
            .increment(1);
    }
}

/// A request finished on `tier` with `status` after `elapsed` (to response headers).
pub fn request(tier: &'static str, status: u16, elapsed: Duration) {
    let class_index = usize::from(status / 100).clamp(1, 5) - 1;
    if let Some(hot) = HOT.get()
        && let Some(t) = REQUEST_TIERS.iter().position(|&x| x == tier)
    {
        hot.requests[t][class_index].increment(1);
        hot.duration[t].record(elapsed.as_secs_f64());
        return;
    }
    let class = STATUS_CLASSES[class_index];
    counter!("spillway_requests_total", "tier" => tier, "status" => class).increment(1);
    histogram!("spillway_request_duration_seconds", "tier" => tier).record(elapsed.as_secs_f64());
}

/// One balancer decision.
pub fn routing(tier: &'static str, reason: &'static str) {
    if let Some((_, _, c)) = HOT.get().and_then(|hot| {
        hot.routing
            .iter()
            .find(|(t, r, _)| *t == tier && *r == reason)
    }) {
        return c.increment(1);
    }
    counter!("spillway_routing_decisions_total", "tier" => tier, "reason" => reason).increment(1);
}

/// A retry or spill-back attempt.
pub fn retry(kind: &'static str) {
    counter!("spillway_retries_total", "kind" => kind).increment(1);
}

/// `accept` failed on `listener` (proxy, tls, admin).
pub fn accept_error(listener: &'static str) {
    counter!("spillway_accept_errors_total", "listener" => listener).increment(1);
}

/// The counter of client connections accepted by data-plane worker `worker`
/// (`spillway_worker_connections_total{worker}`, 0-based), kept by the worker's accept
/// loop (one label lookup per worker, not per connection).
pub fn worker_connections(worker: usize) -> metrics::Counter {
    counter!("spillway_worker_connections_total", "worker" => worker.to_string())
}

/// Labels of `spillway_timeouts_total`.
pub const TIMEOUT_KINDS: [&str; 7] = [
    "upstream_head",
    "request_body",
    "response_body",
    "tunnel_idle",
    "first_request",
    "header_read",
    "keepalive_idle",
];

/// Client connections open now in `budget` (`proxy`: the plain and TLS listeners;
/// `admin`).
pub fn client_connections(budget: &'static str, open: usize) {
    gauge!("spillway_client_connections", "budget" => budget).set(open as f64);
}

/// A client connection on `listener` was closed at accept because `limit`
/// (`max_connections`, `max_connections_per_client_ip`) was reached.
pub fn connection_refused(listener: &'static str, limit: &'static str) {
    counter!("spillway_connections_refused_total", "listener" => listener, "limit" => limit)
        .increment(1);
}

/// A request or tunnel hit one of the gateway's timeouts (`kind`: one of
/// [`TIMEOUT_KINDS`]).
pub fn timeout(kind: &'static str) {
    counter!("spillway_timeouts_total", "kind" => kind).increment(1);
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

/// A function instance cold-started for a call in `elapsed` (call scheduling: reported
/// apart from the call's processing time).
pub fn cold_start_seconds(elapsed: Duration) {
    histogram!("spillway_function_cold_start_seconds").record(elapsed.as_secs_f64());
}

/// A call through the gateway queue: `queued`, `served`, `timeout`, `full`, `cancelled`.
pub fn queue_call(outcome: &'static str) {
    counter!("spillway_queue_calls_total", "outcome" => outcome).increment(1);
}

/// The gateway queue's per-key gauges (call scheduling §4), set at every scrape.
pub fn queue_gauges(q: &crate::policy::core::QueueStatus) {
    for (route, k) in &q.keys {
        let route = route.clone();
        gauge!("spillway_queue_length", "route" => route.clone()).set(k.queued as f64);
        gauge!("spillway_queue_expected_processing_seconds", "route" => route.clone())
            .set(k.expected_processing_ms / 1e3);
        for (name, sum, scale) in [
            ("spillway_queue_wait_seconds", k.wait_ms, 1e-3),
            ("spillway_route_response_seconds", k.response_ms, 1e-3),
            ("spillway_route_stretch", k.stretch, 1.0),
        ] {
            for (stat, v) in [("mean", sum.mean), ("p50", sum.p50), ("p95", sum.p95)] {
                gauge!(name, "route" => route.clone(), "stat" => stat).set(v * scale);
            }
        }
    }
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
    gauge!("spillway_vms_target").set(f64::from(s.pool.target));
    gauge!("spillway_traffic_avg_rps").set(s.avg_rps);
    gauge!("spillway_traffic_mean_abs_deviation_rps").set(s.std_rps);
    gauge!("spillway_vm_budget_rps").set(finite_or_zero(s.published_vm_reqs_rps));
    gauge!("spillway_r_max_rps").set(finite_or_zero(s.r_max_rps));
}

/// Export the cost-indifference point in force, requests/s (LIBRA §III-A: below it the
/// scaler releases every VM). The admin listener sets it at every scrape, so that alerts
/// can compare the traffic with it (deploy/observability/spillway-rules.yaml).
pub fn cip_gauge(cip_rps: f64) {
    gauge!("spillway_cip_rps").set(finite_or_zero(cip_rps));
}

/// Export the last hour's bill: `hybrid` (what ran), `all_functions` and `all_vm` (the
/// counterfactual), USD. The admin listener sets it at every scrape.
pub fn cost_last_hour(b: &crate::policy::cost::Bill) {
    gauge!("spillway_cost_last_hour_dollars", "policy" => "hybrid").set(b.total_usd);
    gauge!("spillway_cost_last_hour_dollars", "policy" => "all_functions")
        .set(b.counterfactual.all_functions_usd);
    gauge!("spillway_cost_last_hour_dollars", "policy" => "all_vm")
        .set(b.counterfactual.all_vm_usd);
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

/// A request arrived (`+1`) or its response finished (`-1`).
pub fn in_flight(delta: i8) {
    let apply = |g: &Gauge| {
        if delta >= 0 {
            g.increment(f64::from(delta));
        } else {
            g.decrement(f64::from(-delta));
        }
    };
    match HOT.get() {
        Some(hot) => apply(&hot.in_flight),
        None => apply(&gauge!("spillway_requests_in_flight")),
    }
}

/// Export one function zone's instances: `starting`, `busy` (running a call; calls in
/// flight for a concurrency-limited zone) and `idle` (warm).
pub fn function_instances(zone: &str, starting: u32, busy: u32, idle: u32) {
    let zone = zone.to_string();
    gauge!("spillway_function_instances", "zone" => zone.clone(), "state" => "starting")
        .set(f64::from(starting));
    gauge!("spillway_function_instances", "zone" => zone.clone(), "state" => "busy")
        .set(f64::from(busy));
    gauge!("spillway_function_instances", "zone" => zone, "state" => "idle").set(f64::from(idle));
}

/// Export one instance zone's FaaSim usage (FaaSim §3): start-up, busy, idle and shutdown
/// seconds, cold and warm starts.
pub fn function_usage(zone: &str, u: &crate::policy::functions::FunctionUsage) {
    for (phase, d) in [
        ("startup", u.startup),
        ("busy", u.busy),
        ("idle", u.idle),
        ("shutdown", u.shutdown),
    ] {
        gauge!("spillway_function_usage_seconds", "zone" => zone.to_string(), "phase" => phase)
            .set(d.as_secs_f64());
    }
    for (start, n) in [("cold", u.cold_starts), ("warm", u.warm_starts)] {
        gauge!("spillway_function_starts", "zone" => zone.to_string(), "start" => start)
            .set(n as f64);
    }
}

/// Export one function instance's FaaSim usage (papers.md §2, usage per instance):
/// start-up, busy, idle and shutdown seconds, cold and warm starts, labelled by its id.
pub fn function_instance_usage(zone: &str, i: &crate::policy::functions::InstanceUsage) {
    let instance = i.id.0.to_string();
    for (phase, d) in [
        ("startup", i.startup),
        ("busy", i.busy),
        ("idle", i.idle),
        ("shutdown", i.shutdown),
    ] {
        gauge!("spillway_function_instance_usage_seconds", "zone" => zone.to_string(), "instance" => instance.clone(), "phase" => phase)
            .set(d.as_secs_f64());
    }
    for (start, n) in [("cold", i.cold_starts), ("warm", i.warm_starts)] {
        gauge!("spillway_function_instance_starts", "zone" => zone.to_string(), "instance" => instance.clone(), "start" => start)
            .set(n as f64);
    }
}

/// Log a scaling decision: at INFO when the target changes, at DEBUG when it holds (the
/// quickstart decides every 5 s), rates rounded to 0.01 requests/s.
pub fn log_scale_decision(
    epoch: u64,
    decision: &crate::policy::scaling::ScaleDecision,
    direction: crate::policy::controller::ScaleDirection,
) {
    let vm_reqs_rps = round2(decision.vm_reqs_rps);
    let (target_vms, reason, dir) = (
        decision.target_vms,
        decision.reason.as_str(),
        direction.as_str(),
    );
    if direction == crate::policy::controller::ScaleDirection::Hold {
        tracing::debug!(
            epoch,
            target_vms,
            vm_reqs_rps,
            reason,
            direction = dir,
            "scaling decision"
        );
    } else {
        tracing::info!(
            epoch,
            target_vms,
            vm_reqs_rps,
            reason,
            direction = dir,
            "scaling decision"
        );
    }
}

/// `x` rounded to 2 decimals (rates in logs and `/status`).
pub fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

fn finite_or_zero(x: f64) -> f64 {
    if x.is_finite() { x } else { 0.0 }
}

/// An asynchronous call was accepted (stored, 202) — ProFaaStinate §3.
pub fn async_accepted() {
    counter!("spillway_async_accepted_total").increment(1);
}

/// An asynchronous call left the delay queue: `kind` (`idle`, `urgent`, `forced`) and the
/// tier of its first attempt (`vm`, `function`, `rejected`).
pub fn async_released(kind: &'static str, d: crate::policy::attempt::Decision) {
    use crate::policy::attempt::Decision;
    let tier = match d {
        Decision::Vm { .. } => "vm",
        Decision::Function { .. } => "function",
        Decision::Queue { .. } | Decision::Reject { .. } => "rejected",
    };
    counter!("spillway_async_released_total", "kind" => kind, "tier" => tier).increment(1);
}

/// An asynchronous call finished: `done` (an upstream answered) or `failed`.
pub fn async_finished(done: bool) {
    let state = if done { "done" } else { "failed" };
    counter!("spillway_async_finished_total", "state" => state).increment(1);
}

/// Delay-queue gauges: depth, oldest wait (s), mode (1 = busy), windowed CPU, deadline
/// misses.
pub fn delay_gauges(s: &crate::policy::delay::DelayStatus, now: crate::policy::Time) {
    gauge!("spillway_async_queued").set(s.queued as f64);
    gauge!("spillway_async_oldest_wait_seconds").set(
        s.oldest_accepted
            .map_or(0.0, |t| now.saturating_sub(t).as_secs_f64()),
    );
    gauge!("spillway_async_busy").set(f64::from(u8::from(
        s.mode == crate::policy::delay::Mode::Busy,
    )));
    gauge!("spillway_async_cpu_utilisation").set(s.cpu.unwrap_or(0.0));
    counter!("spillway_async_deadline_misses_total").absolute(s.deadline_misses);
}
