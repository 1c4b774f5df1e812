//! Reports: the per-policy result objects (`--json`), the comparison table, and the
//! per-epoch series (`--csv`).

use std::fmt::Write as _;

use serde::Serialize;

/// Cost of a run, USD.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CostBreakdown {
    /// `vm + function`, USD.
    pub total: f64,
    /// Billed VM time × hourly price, USD (LIBRA §II IaaS cost).
    pub vm: f64,
    /// GB-s × price + request fees (+ API-gateway fees when configured), USD (LIBRA §II
    /// FaaS cost).
    pub function: f64,
}

/// Response-time summary of served requests, milliseconds. Percentiles come from an HDR
/// histogram and are rounded to its precision (3 significant digits); the mean is exact.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ResponseMs {
    /// Mean, ms.
    pub mean: f64,
    /// Median, ms.
    pub p50: f64,
    /// 95th percentile, ms.
    pub p95: f64,
    /// 99th percentile, ms.
    pub p99: f64,
}

/// Response-time summary with its extremes (function-zone runs), ms;
/// percentiles to the histogram's 3 significant digits.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ResponseStats {
    /// Mean, ms.
    pub mean: f64,
    /// Fastest, ms.
    pub min: f64,
    /// Slowest, ms.
    pub max: f64,
    /// Median, ms.
    pub p50: f64,
    /// 95th percentile, ms.
    pub p95: f64,
    /// 99th percentile, ms.
    pub p99: f64,
}

/// One policy's result — the fields of the simulator's report.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PolicyReport {
    /// `libra`, `max`, `faas`, `auto` or `spock`.
    pub name: String,
    /// Requests that arrived.
    pub requests: u64,
    /// Requests answered (VM or function).
    pub served: u64,
    /// Requests not served: function calls over the concurrency limit, plus requests the
    /// routing policy rejected (no ready VM for a VM-only policy).
    pub throttled: u64,
    /// Served requests slower than the SLA, plus the throttled ones.
    pub sla_violations: u64,
    /// `sla_violations` as a percentage of `requests` (0–100).
    pub sla_violation_pct: f64,
    /// Served requests whose service started in a later second than they arrived (they
    /// waited in a VM queue across a second boundary): the LIBRA authors' simulator's
    /// count of "delayed" requests, which works in whole seconds. `sla_violations` is the
    /// continuous-time count (response slower than the SLA); a request can be one, both
    /// or neither.
    pub delayed: u64,
    /// Cost, USD.
    pub cost_usd: CostBreakdown,
    /// Billed VM time, hours (after the billing rule's rounding and minimum).
    pub vm_hours: f64,
    /// Billed function GB-seconds (1 ms granularity, INIT included when billed).
    pub function_gb_seconds: f64,
    /// Fraction of served requests served by functions, 0–1.
    pub function_share: f64,
    /// Function cold starts.
    pub cold_starts: u64,
    /// Response times of served requests.
    pub response_ms: ResponseMs,
    /// FaaSim usage over every function zone: instance time (start-up + busy + idle +
    /// shutdown), hours (configs with `function_zones` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instance_hours: Option<f64>,
    /// Mean instances alive over the run, all zones (instance time / run length; configs
    /// with `function_zones` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mean_instances: Option<f64>,
    /// Per function zone (configs with `function_zones` only; FaaSim two-tier).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub zones: Vec<ZoneReport>,
    /// The platform's response time (start + execution, queueing on VMs) with its
    /// extremes (configs with `function_zones` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub platform_response_ms: Option<ResponseStats>,
    /// The client's: the platform's plus the network round trip of `sim.network`
    /// (configs with `function_zones` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_response_ms: Option<ResponseStats>,
    /// Adaptive r_max (`libra.r_max_adaptive`, LIBRA only); absent when r_max is fixed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub r_max: Option<RMaxReport>,
    /// Call scheduling (`queue:`): response time and stretch, overall and per function;
    /// absent without a queue.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue: Option<QueueReport>,
}

/// Mean, quartiles and 95th percentile of one measure (3 significant digits).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Spread {
    /// Samples.
    pub calls: u64,
    /// Mean.
    pub mean: f64,
    /// First quartile.
    pub p25: f64,
    /// Median.
    pub p50: f64,
    /// Third quartile.
    pub p75: f64,
    /// 95th percentile.
    pub p95: f64,
}

/// One function's measures.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FunctionSpread {
    /// Response time R = completion − arrival, ms.
    pub response_ms: Spread,
    /// Stretch R / p.
    pub stretch: Spread,
}

/// The gateway queue's outcome in a run (call scheduling §4).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct QueueReport {
    /// The order (`fifo`, `sept`, `eect`, `rect`, `fair_choice`).
    pub order: String,
    /// Calls that waited `max_queue_wait_seconds` (counted as throttled).
    pub timed_out: u64,
    /// Response time of served calls, ms.
    pub response_ms: Spread,
    /// Stretch of served calls.
    pub stretch: Spread,
    /// Per function (route key), by name.
    pub functions: Vec<(String, FunctionSpread)>,
}

/// One function zone's FaaSim usage in a run (FaaSim §3: start-up, busy and idle time,
/// cold and warm starts).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ZoneReport {
    /// Zone name.
    pub name: String,
    /// `edge` or `cloud`.
    pub kind: &'static str,
    /// Calls that started a new instance.
    pub cold_starts: u64,
    /// Calls served by a warm instance.
    pub warm_starts: u64,
    /// Calls the zone could not take.
    pub throttled: u64,
    /// Start-up time of cold starts, s.
    pub startup_s: f64,
    /// Busy time, s.
    pub busy_s: f64,
    /// Idle (kept-alive) time, s.
    pub idle_s: f64,
    /// Shutdown time of expired instances (`sim.function.shutdown_ms` each), s.
    pub shutdown_s: f64,
    /// Calls that waited for a booting pre-warmed instance (counted as warm starts).
    pub prewarm_waits: u64,
    /// Instance time (start-up + busy + idle + shutdown), hours.
    pub instance_hours: f64,
    /// Mean instances alive over the run (instance time / run length).
    pub mean_instances: f64,
    /// Every instance of an instance zone, in start order (FaaSim's usage per instance).
    pub instances: Vec<InstanceReport>,
}

/// One function instance's usage (FaaSim, papers.md §2: UT = start-up + busy + idle +
/// shutdown).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct InstanceReport {
    /// Its number in the zone, from 0 in start order.
    pub id: u64,
    /// A pre-warmed instance.
    pub prewarmed: bool,
    /// Started (cold start or pre-warm), s.
    pub started_s: f64,
    /// Stopped (end of its shutdown), s; `null` when alive at the end of the run.
    pub stopped_s: Option<f64>,
    /// 1 when a call cold-started it.
    pub cold_starts: u64,
    /// Calls it served without a cold start.
    pub warm_starts: u64,
    /// Start-up time, s.
    pub startup_s: f64,
    /// Busy time, s.
    pub busy_s: f64,
    /// Idle time, s.
    pub idle_s: f64,
    /// Shutdown time, s.
    pub shutdown_s: f64,
    /// Usage time, hours.
    pub instance_hours: f64,
}

/// Where the adaptive r_max controller went during a run (LIBRA §III-B).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RMaxReport {
    /// The start value (`libra.r_max_rps`), requests/s.
    pub start_rps: f64,
    /// r_max at the end of the run, requests/s.
    pub end_rps: f64,
    /// Periods in which r_max changed.
    pub adjustments: u64,
    /// The error `ln(target / measured)` of the last evaluated period.
    pub last_error: Option<f64>,
    /// The VM latency percentile measured in the last evaluated period, ms.
    pub last_measured_ms: Option<f64>,
}

/// The `--json` document.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SimReport {
    /// One object per policy, in the order run.
    pub policies: Vec<PolicyReport>,
    /// The trace path as given.
    pub trace: String,
    /// The RNG seed.
    pub seed: u64,
    /// What reading an access log found (`--format spillway|nginx|alb|apigw` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log: Option<super::logs::LogSummary>,
}

/// One row of the per-epoch series (`--csv`, `--plot`).
#[derive(Clone, Debug, PartialEq)]
pub struct EpochRow {
    /// End of the epoch, seconds.
    pub time_s: f64,
    /// Requests that arrived in the epoch.
    pub load: u64,
    /// Traffic monitor EWMA after the epoch, requests/s (LIBRA §III-A).
    pub avg_rps: f64,
    /// Traffic monitor EWMA deviation, requests/s.
    pub std_rps: f64,
    /// The scaling policy's VM budget `vm_reqs`, requests/s (∞ for VM-only baselines).
    pub vm_reqs_rps: f64,
    /// Ready VMs at the end of the epoch.
    pub vms_ready: u32,
    /// Requests sent to functions during the epoch.
    pub function_calls: u64,
    /// r_max in force at the end of the epoch, requests/s (LIBRA §III-B; moves only with
    /// `libra.r_max_adaptive`).
    pub r_max_rps: f64,
    /// SLA violations among the requests that arrived in the epoch (served too slowly,
    /// throttled or rejected).
    pub violations: u64,
    /// Requests that arrived in the epoch and started in a later second
    /// ([`PolicyReport::delayed`]).
    pub delayed: u64,
    /// Busy VM slot-time ÷ ready slot-time over the epoch, 0–1 (above 1 when queues
    /// build); `None` without a ready VM.
    pub vm_utilisation: Option<f64>,
    /// Cost billed up to the epoch's end, USD (running VMs as if stopped then).
    pub cost_usd: f64,
}

impl EpochRow {
    /// This row followed by `later` as one row (a `--csv-max-rows` aggregate): the end
    /// time and levels (EWMAs, budget, VMs ready, r_max) of `later`, the counts (load,
    /// function calls, violations, delayed) summed.
    pub fn merged(&self, later: &EpochRow) -> EpochRow {
        EpochRow {
            time_s: later.time_s,
            load: self.load + later.load,
            function_calls: self.function_calls + later.function_calls,
            violations: self.violations + later.violations,
            delayed: self.delayed + later.delayed,
            // The utilisation of the merged epochs, weighted equally.
            vm_utilisation: match (self.vm_utilisation, later.vm_utilisation) {
                (Some(a), Some(b)) => Some((a + b) / 2.0),
                (a, b) => a.or(b),
            },
            ..later.clone()
        }
    }
}

/// A per-epoch series of at most `max_rows` rows: when full, neighbouring rows are merged
/// pairwise and every later row covers twice as many epochs, so memory stays bounded on
/// traces of any length (`--csv-max-rows`).
#[derive(Clone, Debug)]
pub struct SeriesBuffer {
    rows: Vec<EpochRow>,
    max_rows: usize,
    /// Epochs per row.
    group: u64,
    pending: Option<(EpochRow, u64)>,
}

impl SeriesBuffer {
    /// An empty series of at most `max_rows` (≥ 2 is used) rows.
    pub fn new(max_rows: usize) -> Self {
        Self {
            rows: Vec::new(),
            max_rows: max_rows.max(2),
            group: 1,
            pending: None,
        }
    }

    /// Append one epoch.
    pub fn push(&mut self, row: EpochRow) {
        let (merged, n) = match self.pending.take() {
            Some((p, n)) => (p.merged(&row), n + 1),
            None => (row, 1),
        };
        if n < self.group {
            self.pending = Some((merged, n));
            return;
        }
        if self.rows.len() == self.max_rows {
            let rows = std::mem::take(&mut self.rows);
            self.rows = rows
                .chunks(2)
                .map(|c| match c {
                    [a, b] => a.merged(b),
                    [a] => a.clone(),
                    _ => unreachable!("chunks of two"),
                })
                .collect();
            self.group *= 2;
            // The row just completed covers half a new group: keep it pending.
            if n < self.group {
                self.pending = Some((merged, n));
                return;
            }
        }
        self.rows.push(merged);
    }

    /// The rows, the last partial group included.
    pub fn finish(mut self) -> Vec<EpochRow> {
        if let Some((p, _)) = self.pending.take() {
            if self.rows.len() == self.max_rows {
                let last = self.rows.pop().expect("full");
                self.rows.push(last.merged(&p));
            } else {
                self.rows.push(p);
            }
        }
        self.rows
    }
}

fn fmt_f(x: f64) -> String {
    if x.is_finite() {
        format!("{x}")
    } else {
        String::new()
    }
}

/// The per-epoch series as CSV:
/// `policy,time,load,avg,std,vm_reqs,vms_ready,function_calls,r_max,violations,delayed,
/// utilisation,cost_usd` (`vm_reqs` empty when unlimited, `utilisation` without a ready
/// VM).
pub fn series_csv(series: &[(&str, &[EpochRow])]) -> String {
    let mut out = String::from(
        "policy,time,load,avg,std,vm_reqs,vms_ready,function_calls,r_max,violations,delayed,\
         utilisation,cost_usd\n",
    );
    for (name, rows) in series {
        for r in *rows {
            let _ = writeln!(
                out,
                "{name},{},{},{},{},{},{},{},{},{},{},{},{}",
                r.time_s,
                r.load,
                r.avg_rps,
                r.std_rps,
                fmt_f(r.vm_reqs_rps),
                r.vms_ready,
                r.function_calls,
                r.r_max_rps,
                r.violations,
                r.delayed,
                r.vm_utilisation.map_or(String::new(), fmt_f),
                r.cost_usd
            );
        }
    }
    out
}

/// The `--sweep` summary: one row per swept value and policy, the first column the value
/// of `path`, then cold starts, mean platform and client response times (ms; `-` without
/// function zones) and instance-hours (`-` without function zones) — the experiment tables of
/// docs/src/guide/zones.md.
pub fn sweep_table(path: &str, rows: &[(String, &SimReport)]) -> String {
    let width = rows
        .iter()
        .map(|(v, _)| v.len())
        .chain([path.len()])
        .max()
        .unwrap_or(0);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{path:<width$}  {:<10} {:>8} {:>10} {:>10} {:>10} {:>10}",
        "policy", "cold", "mean_ms", "client_ms", "inst_hours", "cost_usd"
    );
    let opt = |x: Option<f64>, prec: usize| x.map_or("-".to_string(), |x| format!("{x:.prec$}"));
    for (value, report) in rows {
        for p in &report.policies {
            let _ = writeln!(
                out,
                "{value:<width$}  {:<10} {:>8} {:>10.1} {:>10} {:>10} {:>10.2}",
                p.name,
                p.cold_starts,
                p.platform_response_ms
                    .as_ref()
                    .map_or(p.response_ms.mean, |r| r.mean),
                opt(p.client_response_ms.as_ref().map(|r| r.mean), 1),
                opt(p.instance_hours, 2),
                p.cost_usd.total,
            );
        }
    }
    out
}

/// The terminal comparison table.
pub fn table(reports: &[PolicyReport]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<6} {:>10} {:>10} {:>9} {:>10} {:>7} {:>9} {:>10} {:>9} {:>10} {:>9} {:>7} {:>8} {:>8} {:>8} {:>8}",
        "policy",
        "requests",
        "served",
        "throttled",
        "sla_viol",
        "viol_%",
        "delayed",
        "cost_usd",
        "vm_usd",
        "fn_usd",
        "vm_hours",
        "fn_%",
        "cold",
        "mean_ms",
        "p95_ms",
        "p99_ms"
    );
    for r in reports {
        let _ = writeln!(
            out,
            "{:<6} {:>10} {:>10} {:>9} {:>10} {:>7.3} {:>9} {:>10.2} {:>9.2} {:>10.2} {:>9.1} {:>7.2} {:>8} {:>8.1} {:>8.1} {:>8.1}",
            r.name,
            r.requests,
            r.served,
            r.throttled,
            r.sla_violations,
            r.sla_violation_pct,
            r.delayed,
            r.cost_usd.total,
            r.cost_usd.vm,
            r.cost_usd.function,
            r.vm_hours,
            r.function_share * 100.0,
            r.cold_starts,
            r.response_ms.mean,
            r.response_ms.p95,
            r.response_ms.p99
        );
    }
    for r in reports {
        if let Some(a) = &r.r_max {
            let _ = writeln!(
                out,
                "{}: adaptive r_max {} -> {:.2} req/s ({} adjustments; last period: {} ms, error {})",
                r.name,
                a.start_rps,
                a.end_rps,
                a.adjustments,
                a.last_measured_ms.map_or("-".into(), |m| format!("{m:.0}")),
                a.last_error.map_or("-".into(), |e| format!("{e:+.3}")),
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(i: u64) -> EpochRow {
        EpochRow {
            time_s: i as f64,
            load: i,
            avg_rps: i as f64 / 2.0,
            std_rps: 0.0,
            vm_reqs_rps: 0.0,
            vms_ready: i as u32,
            function_calls: 1,
            r_max_rps: 16.0,
            violations: i % 2,
            delayed: 0,
            vm_utilisation: None,
            cost_usd: i as f64,
        }
    }

    #[test]
    fn a_full_series_merges_neighbours_and_keeps_totals_and_the_last_levels() {
        // 11 epochs into 4 rows: groups of 1 → 2 → 4 epochs.
        let mut s = SeriesBuffer::new(4);
        for i in 1..=11 {
            s.push(row(i));
        }
        let rows = s.finish();
        assert!(rows.len() <= 4, "{rows:?}");
        assert_eq!(
            rows.iter().map(|r| r.load).sum::<u64>(),
            (1..=11).sum::<u64>()
        );
        assert_eq!(rows.iter().map(|r| r.function_calls).sum::<u64>(), 11);
        assert_eq!(rows.iter().map(|r| r.violations).sum::<u64>(), 6);
        let last = rows.last().unwrap();
        assert_eq!((last.time_s, last.vms_ready, last.avg_rps), (11.0, 11, 5.5));
        // Row boundaries are increasing times.
        assert!(rows.windows(2).all(|w| w[0].time_s < w[1].time_s));
        // Below the cap nothing merges.
        let mut s = SeriesBuffer::new(100);
        (1..=11).for_each(|i| s.push(row(i)));
        assert_eq!(s.finish(), (1..=11).map(row).collect::<Vec<_>>());
    }
}
