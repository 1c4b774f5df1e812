//! `sim:` — simulator-only configuration: the request, VM and function models, the SLA
//! and the AUTO/Spock baselines' parameters. Ignored by `spillway serve`.
//!
//! The policy parameters themselves (epoch, α, β, φ, ρ, K, r_max, VM bounds, prices) come
//! from the shared `libra:` and `pricing:` sections, so a simulated configuration is the
//! one the gateway would run. See `config/sim/libra-paper.yaml` for the LIBRA authors'
//! values.

use serde::{Deserialize, Serialize};
use std::num::NonZeroU32;

use super::duration::{Millis, Seconds};
use super::issues::Issues;
use crate::policy::functions::WarmOrder;

/// The `sim:` section.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SimSection {
    /// The request model (service time, memory).
    pub request: RequestModelConfig,
    /// The physical VM model (slots, boot time, billing).
    pub vm: VmModelConfig,
    /// The function model (start-up times, keep-alive, concurrency, billing).
    pub function: FunctionModelConfig,
    /// SLA: a response slower than this many milliseconds is a violation (LIBRA §IV: 1 s).
    pub sla_ms: Millis,
    /// AUTO and Spock parameters (LIBRA §IV).
    pub auto: AutoConfig,
    /// MAX runs this many VMs for the whole trace (the LIBRA authors' fixed fleet of
    /// `max_num_instance`); absent: `ceil(peak second / r_max)`.
    pub max_fixed_vms: Option<NonZeroU32>,
    /// Network round trip between a call's client and the zone that runs it (FaaSim
    /// two-tier edge/cloud): added to the client-side response time of function calls
    /// only. Absent: no network time.
    pub network: Option<NetworkModelConfig>,
    /// The trace format when `spillway sim` is given no `--format`; absent: `counts`.
    pub trace_format: Option<TraceFormatConfig>,
    /// With `function_zones`: one report row per placement policy listed here (the FAAS
    /// policy, the row named after the placement) instead of one per `--policy`.
    pub placements: Vec<super::zones::PlacementConfig>,
    /// Other load on every VM (ProFaaStinate §3's CPU peak): `cores` held from
    /// `from_seconds` to `to_seconds`; absent: none. Used by the delay-queue model.
    pub cpu_load: Option<CpuLoadConfig>,
    /// Several gateway replicas behind an L4 balancer sharing one decision through the
    /// coordination store, with a store delay and outage windows (what the live
    /// coordinator, `coordination: {type: redis}`, would do); absent: one gateway.
    pub replicas: Option<ReplicasConfig>,
}

/// `sim.replicas:` — `count` gateway replicas, each receiving its `split` weight of the
/// arrivals, coordinated as `coordination: {type: redis}` does: the leader sums the
/// epoch counts, decides and shares the VM budget; the followers take its decision.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ReplicasConfig {
    /// Replicas (at least 1; 1 is one gateway without a store: the delay and outages do
    /// not apply).
    pub count: NonZeroU32,
    /// How much later than an instant store the shared inputs arrive, milliseconds: the
    /// leader's monitor gets an epoch's summed count this much later (half an epoch
    /// after the epoch's end plus this), and the followers take the leader's
    /// publication this much after the leader (at least the live margin, a tenth of an
    /// epoch up to 50 ms). Default 0.
    #[serde(default)]
    pub store_delay_ms: Millis,
    /// Windows of trace time in which no replica reaches the store (ordered, not
    /// overlapping); default none.
    #[serde(default)]
    pub outages: Vec<OutageConfig>,
    /// Each replica's weight of the arrivals (the balancer's), one per replica, each
    /// above 0; default (empty) equal weights.
    #[serde(default)]
    pub split: Vec<f64>,
}

/// One `sim.replicas.outages` window: the store cannot be reached in `[from_seconds,
/// to_seconds)` of trace time.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct OutageConfig {
    /// Start, trace seconds.
    pub from_seconds: Seconds,
    /// End (exclusive), trace seconds; after `from_seconds`.
    pub to_seconds: Seconds,
}

/// `sim.trace_format` — the trace formats of `spillway sim --format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TraceFormatConfig {
    /// One integer a line: requests in that second.
    Counts,
    /// `<arrival seconds> [<zone>]` a line (FaaSim's event lists).
    Events,
    /// Azure Functions 2019 per-minute invocation counts.
    Azure2019,
    /// Azure Functions 2021 invocations.
    Azure2021,
    /// spillway's own access log (text or JSON lines).
    Spillway,
    /// nginx `combined` access log.
    Nginx,
    /// AWS ALB access logs.
    Alb,
    /// API Gateway JSON access logs.
    Apigw,
}

/// `sim.network:` — FaaSim's network model: a round trip of `edge_rtt_ms` when a call
/// runs in its origin edge zone, `cloud_rtt_ms` in the cloud, each with a uniform jitter
/// of ± that fraction.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NetworkModelConfig {
    /// Round trip to the origin edge zone, ms.
    pub edge_rtt_ms: Millis,
    /// Its uniform jitter, ± this fraction of it, [0, 1].
    #[serde(default)]
    pub edge_rtt_jitter: f64,
    /// Round trip to the cloud, ms.
    pub cloud_rtt_ms: Millis,
    /// Its uniform jitter, ± this fraction of it, [0, 1].
    #[serde(default)]
    pub cloud_rtt_jitter: f64,
}

/// `sim.cpu_load:` — other load holding `cores` of every VM in `[from_seconds,
/// to_seconds)`; running calls then progress at rate `min(1, (cores − c) ÷ running)`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CpuLoadConfig {
    /// Cores held (fractions allowed).
    pub cores: f64,
    /// Start, trace seconds.
    pub from_seconds: f64,
    /// End, trace seconds.
    pub to_seconds: f64,
}

impl Default for SimSection {
    fn default() -> Self {
        Self {
            request: RequestModelConfig::default(),
            vm: VmModelConfig::default(),
            function: FunctionModelConfig::default(),
            sla_ms: Millis::from_ms(1000),
            auto: AutoConfig::default(),
            network: None,
            trace_format: None,
            placements: Vec::new(),
            max_fixed_vms: None,
            cpu_load: None,
            replicas: None,
        }
    }
}

/// `sim.request:` — what one request costs to serve.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RequestModelConfig {
    /// Service (execution) time distribution, the same on a VM slot and on a function.
    pub service_time: ServiceTimeConfig,
    /// Memory of one request on the function tier, MB; absent: `pricing.function_memory_mb`.
    pub memory_mb: Option<u32>,
}

impl Default for RequestModelConfig {
    fn default() -> Self {
        Self {
            service_time: ServiceTimeConfig::Fixed { ms: 1000.0 },
            memory_mb: None,
        }
    }
}

/// `sim.request.service_time:` — a distribution of service times, milliseconds, picked
/// by `distribution:`. Read through [`ServiceTimeSection`] so that every key keeps its
/// place in error messages.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(
    tag = "distribution",
    rename_all = "snake_case",
    from = "ServiceTimeSection"
)]
pub enum ServiceTimeConfig {
    /// Always `ms`.
    Fixed {
        /// Service time, ms.
        ms: f64,
    },
    /// Normal, truncated at 1 µs.
    Normal {
        /// Mean, ms.
        mean_ms: f64,
        /// Standard deviation, ms.
        std_ms: f64,
    },
    /// Log-normal with this mean and standard deviation (of the service time itself).
    Lognormal {
        /// Mean, ms.
        mean_ms: f64,
        /// Standard deviation, ms.
        std_ms: f64,
    },
    /// Empirical: `[percentile, ms]` points (as in the Azure 2019 durations file:
    /// 0, 1, 25, 50, 75, 99, 100), interpolated linearly between them.
    Empirical {
        /// `[percentile 0–100, ms]` pairs, percentiles increasing, first 0, last 100.
        percentiles: Vec<[f64; 2]>,
    },
}

/// How `sim.request.service_time` is read: an externally tagged enum whose serde name is
/// the tag key (see `crate::config::VmPoolSection`).
#[derive(Deserialize)]
#[serde(
    rename = "distribution",
    rename_all = "snake_case",
    deny_unknown_fields
)]
#[doc(hidden)]
pub enum ServiceTimeSection {
    /// `distribution: fixed`.
    Fixed {
        /// Service time, ms.
        ms: f64,
    },
    /// `distribution: normal`.
    Normal {
        /// Mean, ms.
        mean_ms: f64,
        /// Standard deviation, ms.
        std_ms: f64,
    },
    /// `distribution: lognormal`.
    Lognormal {
        /// Mean, ms.
        mean_ms: f64,
        /// Standard deviation, ms.
        std_ms: f64,
    },
    /// `distribution: empirical`.
    Empirical {
        /// `[percentile, ms]` pairs.
        percentiles: Vec<[f64; 2]>,
    },
}

impl From<ServiceTimeSection> for ServiceTimeConfig {
    fn from(s: ServiceTimeSection) -> Self {
        match s {
            ServiceTimeSection::Fixed { ms } => ServiceTimeConfig::Fixed { ms },
            ServiceTimeSection::Normal { mean_ms, std_ms } => {
                ServiceTimeConfig::Normal { mean_ms, std_ms }
            }
            ServiceTimeSection::Lognormal { mean_ms, std_ms } => {
                ServiceTimeConfig::Lognormal { mean_ms, std_ms }
            }
            ServiceTimeSection::Empirical { percentiles } => {
                ServiceTimeConfig::Empirical { percentiles }
            }
        }
    }
}

/// How VM time is billed.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum VmBilling {
    /// Per second (EC2 Linux on-demand), with `minimum_billed_seconds` per VM.
    PerSecond,
    /// Per started hour.
    PerHour,
}

/// `sim.vm:` — the physical VM model (separate from the policy's planning figure
/// `libra.r_max_rps`).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct VmModelConfig {
    /// Parallel request slots per VM; further requests wait in the VM's FIFO queue.
    pub slots: NonZeroU32,
    /// Seconds from launch to ready (LIBRA's code: 100 s).
    pub boot_seconds: Seconds,
    /// `per_second` (default) or `per_hour`.
    pub billing: VmBilling,
    /// Per-second billing only: each VM is billed at least this many seconds (EC2: 60).
    pub minimum_billed_seconds: Seconds,
    /// Whether the boot time is billed (EC2 bills from launch: true). `false` bills from
    /// ready to stop.
    pub bill_boot: bool,
    /// CPU cores per VM for the delay-queue model (calls share them); absent: `slots`.
    pub cores: Option<NonZeroU32>,
}

impl Default for VmModelConfig {
    fn default() -> Self {
        Self {
            slots: NonZeroU32::new(16).unwrap(),
            boot_seconds: Seconds::from_secs(100),
            billing: VmBilling::PerSecond,
            minimum_billed_seconds: Seconds::from_secs(60),
            bill_boot: true,
            cores: None,
        }
    }
}

/// `sim.function:` — the function model, FaaSim §3.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FunctionModelConfig {
    /// Extra latency of a cold start (new instance, INIT phase), ms.
    pub cold_start_ms: Millis,
    /// Extra latency of a warm start, ms.
    pub warm_start_ms: Millis,
    /// An idle instance stays warm this long, seconds (FaaSim keep-alive).
    pub keep_alive_seconds: Seconds,
    /// Most instances at once (FaaSim's `max_concurrency`, still read as a deprecated
    /// spelling); calls beyond it are throttled (counted, not served). 0: no function tier
    /// (the call-scheduling preset's single VM).
    #[serde(alias = "max_concurrency")]
    pub max_instances: u32,
    /// Instances kept warm at all times (FaaSim pre-warming, AWS provisioned concurrency;
    /// `prewarmed` is the deprecated spelling); keep-alive never expires them.
    #[serde(alias = "prewarmed")]
    pub prewarmed_instances: u32,
    /// Which idle instance a warm start takes: `newest` (most recently idle) or `oldest`
    /// (idle longest, as FaaSim).
    pub warm_instance_order: WarmOrder,
    /// Bill the cold start as INIT duration (AWS does; the LIBRA preset does not).
    pub bill_init: bool,
    /// Uniform jitter of a function call's execution (service) time, ± this fraction of
    /// it, [0, 1] (FaaSim: 0.01). VM service times are not affected.
    pub exec_jitter: f64,
    /// Uniform jitter of `cold_start_ms`, ± this fraction, [0, 1] (FaaSim: 0.01).
    pub cold_start_jitter: f64,
    /// Uniform jitter of `warm_start_ms`, ± this fraction, [0, 1] (FaaSim: 0.04).
    pub warm_start_jitter: f64,
    /// Boot time of a pre-warmed instance from the start of the run, ms (0: ready at
    /// t = 0, as FaaSim's fixed pre-warming). A call that finds no idle instance takes one
    /// still booting and waits for it (FaaSim's warming-up resources).
    pub prewarm_boot_ms: Millis,
    /// Time an expired instance takes to stop (its shutdown time), ms (FaaSim: 0).
    pub shutdown_ms: Millis,
}

impl Default for FunctionModelConfig {
    fn default() -> Self {
        Self {
            cold_start_ms: Millis::from_ms(250),
            warm_start_ms: Millis::from_ms(5),
            keep_alive_seconds: Seconds::from_secs(600),
            max_instances: 1000,
            prewarmed_instances: 0,
            warm_instance_order: WarmOrder::Newest,
            bill_init: true,
            exec_jitter: 0.0,
            cold_start_jitter: 0.0,
            warm_start_jitter: 0.0,
            prewarm_boot_ms: Millis::ZERO,
            shutdown_ms: Millis::ZERO,
        }
    }
}

/// `sim.auto:` — reactive VM autoscaling for AUTO and Spock (LIBRA §IV).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AutoConfig {
    /// Scale out above this mean utilisation (busy slots ÷ slots), 0–1.
    pub scale_out_utilisation: f64,
    /// Scale in below this mean utilisation, 0–1.
    pub scale_in_utilisation: f64,
    /// Averaging window, seconds (a whole number of epochs).
    pub window_seconds: Seconds,
    /// VMs added or removed per action.
    pub step_vms: NonZeroU32,
    /// No action for this long after one, seconds.
    pub grace_seconds: Seconds,
    /// Fewest VMs; the initial pool (booted before t = 0).
    pub min_vms: NonZeroU32,
    /// Most VMs.
    pub max_vms: u32,
}

impl Default for AutoConfig {
    fn default() -> Self {
        Self {
            scale_out_utilisation: 0.7,
            scale_in_utilisation: 0.3,
            window_seconds: Seconds::from_secs(120),
            step_vms: NonZeroU32::new(10).unwrap(),
            grace_seconds: Seconds::from_secs(120),
            min_vms: NonZeroU32::MIN,
            max_vms: 100,
        }
    }
}

impl ReplicasConfig {
    /// Outages ordered and each non-empty; one split weight per replica, each above 0.
    fn validate(&self, is: &mut Issues) {
        let mut previous_end = None;
        for (i, o) in self.outages.iter().enumerate() {
            if o.to_seconds <= o.from_seconds {
                is.push(
                    format!("sim.replicas.outages[{i}].to_seconds"),
                    format!(
                        "must be after from_seconds ({} <= {})",
                        o.to_seconds.number(),
                        o.from_seconds.number()
                    ),
                );
            }
            if let Some(end) = previous_end
                && o.from_seconds < end
            {
                is.push(
                    format!("sim.replicas.outages[{i}].from_seconds"),
                    format!(
                        "outages must be in order and not overlap: starts at {} before the previous one ends ({})",
                        o.from_seconds.number(),
                        end.number()
                    ),
                );
            }
            previous_end =
                Some(previous_end.map_or(o.to_seconds, |e: Seconds| e.max(o.to_seconds)));
        }
        if !self.split.is_empty() && self.split.len() != self.count.get() as usize {
            is.push(
                "sim.replicas.split",
                format!(
                    "needs one weight per replica: {} weights for count {}",
                    self.split.len(),
                    self.count
                ),
            );
        }
        for (i, &w) in self.split.iter().enumerate() {
            if !(w.is_finite() && w > 0.0) {
                is.push(
                    format!("sim.replicas.split[{i}]"),
                    format!("must be a finite weight above 0, got {w}"),
                );
            }
        }
    }
}

impl ServiceTimeConfig {
    fn validate(&self, is: &mut Issues, path: &str) {
        match self {
            ServiceTimeConfig::Fixed { ms } => is.positive(&format!("{path}.ms"), *ms),
            ServiceTimeConfig::Normal { mean_ms, std_ms }
            | ServiceTimeConfig::Lognormal { mean_ms, std_ms } => {
                is.positive(&format!("{path}.mean_ms"), *mean_ms);
                is.non_negative(&format!("{path}.std_ms"), *std_ms);
            }
            ServiceTimeConfig::Empirical { percentiles } => {
                let p = format!("{path}.percentiles");
                if let Err(e) = check_percentiles(percentiles) {
                    is.push(p, e);
                }
            }
        }
    }
}

/// Checks `[percentile, ms]` points: at least two, percentiles strictly increasing from 0
/// to 100, times non-negative and non-decreasing.
pub(crate) fn check_percentiles(points: &[[f64; 2]]) -> Result<(), String> {
    if points.len() < 2 {
        return Err("needs at least two [percentile, ms] points".into());
    }
    if points[0][0] != 0.0 || points[points.len() - 1][0] != 100.0 {
        return Err("must start at percentile 0 and end at percentile 100".into());
    }
    for w in points.windows(2) {
        if w[1][0].partial_cmp(&w[0][0]) != Some(std::cmp::Ordering::Greater)
            || w[1][1]
                .partial_cmp(&w[0][1])
                .is_none_or(|o| o == std::cmp::Ordering::Less)
        {
            return Err(format!(
                "percentiles must increase and times must not decrease: {:?} then {:?}",
                w[0], w[1]
            ));
        }
    }
    if points.iter().any(|p| !(p[1].is_finite() && p[1] >= 0.0)) {
        return Err("times must be finite and >= 0".into());
    }
    Ok(())
}

impl SimSection {
    /// Semantic checks, reported with paths under `sim.`.
    pub(crate) fn validate(&self, is: &mut Issues) {
        if let Some(n) = &self.network {
            is.within("sim.network.edge_rtt_jitter", n.edge_rtt_jitter, 0.0, 1.0);
            is.within("sim.network.cloud_rtt_jitter", n.cloud_rtt_jitter, 0.0, 1.0);
        }
        self.request
            .service_time
            .validate(is, "sim.request.service_time");
        if let Some(m) = self.request.memory_mb
            && !(128..=10_240).contains(&m)
        {
            is.push(
                "sim.request.memory_mb",
                format!("must be in [128, 10240] (Lambda's range), got {m}"),
            );
        }
        if let Some(l) = &self.cpu_load {
            is.non_negative("sim.cpu_load.cores", l.cores);
            is.non_negative("sim.cpu_load.from_seconds", l.from_seconds);
            is.non_negative("sim.cpu_load.to_seconds", l.to_seconds);
            if l.to_seconds < l.from_seconds {
                is.push("sim.cpu_load.to_seconds", "must not be before from_seconds");
            }
        }
        if let Some(r) = &self.replicas {
            r.validate(is);
        }
        let f = &self.function;
        is.within("sim.function.exec_jitter", f.exec_jitter, 0.0, 1.0);
        is.within(
            "sim.function.cold_start_jitter",
            f.cold_start_jitter,
            0.0,
            1.0,
        );
        is.within(
            "sim.function.warm_start_jitter",
            f.warm_start_jitter,
            0.0,
            1.0,
        );
        if f.prewarmed_instances > f.max_instances {
            is.push(
                "sim.function.prewarmed_instances",
                format!(
                    "must not exceed sim.function.max_instances ({} > {})",
                    f.prewarmed_instances, f.max_instances
                ),
            );
        }
        is.nonzero_duration("sim.sla_ms", self.sla_ms);
        let a = &self.auto;
        is.within(
            "sim.auto.scale_out_utilisation",
            a.scale_out_utilisation,
            0.0,
            1.0,
        );
        is.within(
            "sim.auto.scale_in_utilisation",
            a.scale_in_utilisation,
            0.0,
            1.0,
        );
        if a.scale_in_utilisation >= a.scale_out_utilisation {
            is.push(
                "sim.auto.scale_in_utilisation",
                "must be below sim.auto.scale_out_utilisation",
            );
        }
        is.nonzero_duration("sim.auto.window_seconds", a.window_seconds);
        if a.min_vms.get() > a.max_vms {
            is.push(
                "sim.auto.min_vms",
                format!(
                    "must not exceed sim.auto.max_vms ({} > {})",
                    a.min_vms, a.max_vms
                ),
            );
        }
    }
}
