//! Cost model and cost-indifference point — LIBRA §II (summary: docs/src/design/papers.md).
//!
//! ```text
//! FaaS:  cost_faas(N) = N · (t_f(m) · C_faas(m) + fee_request) + G_faas
//! IaaS:  cost_iaas(N) = ceil(N / r_max) · C_vm
//! CIP:   the rate N at which both are equal (below it functions are cheaper)
//! ```
//!
//! Prices are in US dollars; rates in requests/s; durations billed at 1 ms granularity
//! as AWS Lambda does. The dated defaults (`DEFAULT_*`) are AWS us-east-1 list prices as
//! of 2025 and are overridable in the `pricing` config section.
//!
//! The same rules bill the simulator's runs and the live gateway: VM time by
//! [`VmBillingRule`] (EC2: per second with a 60 s minimum), function calls by
//! [`FunctionPricing`] (GB-seconds at 1 ms granularity plus the request fee). The live
//! gateway's running bill is [`CostMeter`], a sans-IO state machine the driver feeds with
//! `now` and events (VM running/terminated, arrivals, calls ended); it also prices the
//! counterfactual for the same arrivals: everything on functions, and everything on a VM
//! pool sized for the observed peak at r_max (the simulator's FAAS and MAX baselines).

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use super::{Time, VmId};

/// Lambda x86_64 compute price, USD per GB-second (AWS list price, 2025).
pub const DEFAULT_LAMBDA_X86_GB_SECOND_USD: f64 = 0.000_016_666_7;
/// Lambda arm64 compute price, USD per GB-second (AWS list price, 2025).
pub const DEFAULT_LAMBDA_ARM64_GB_SECOND_USD: f64 = 0.000_013_333_4;
/// Lambda request fee, USD per request ($0.20 per million, 2025).
pub const DEFAULT_LAMBDA_REQUEST_USD: f64 = 0.000_000_2;
/// API Gateway HTTP API fee, USD per request ($1.00 per million, 2025). Charged only when
/// the config says the functions sit behind an API gateway.
pub const DEFAULT_API_GATEWAY_REQUEST_USD: f64 = 0.000_001;
/// EC2 on-demand t3.medium, USD per hour (us-east-1, 2025).
pub const DEFAULT_T3_MEDIUM_HOURLY_USD: f64 = 0.0416;
/// EC2 on-demand m4.large, USD per hour (us-east-1, 2025).
pub const DEFAULT_M4_LARGE_HOURLY_USD: f64 = 0.10;
/// Lambda's billing granularity for duration.
pub const LAMBDA_BILLING_GRANULARITY: Duration = Duration::from_millis(1);

/// CPU architecture of a function, which sets its GB-second price.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Architecture {
    /// x86_64.
    X86_64,
    /// arm64 (Graviton).
    Arm64,
}

impl Architecture {
    /// The default GB-second price for this architecture.
    pub fn default_gb_second_usd(self) -> f64 {
        match self {
            Architecture::X86_64 => DEFAULT_LAMBDA_X86_GB_SECOND_USD,
            Architecture::Arm64 => DEFAULT_LAMBDA_ARM64_GB_SECOND_USD,
        }
    }
}

/// Function-tier prices.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FunctionPricing {
    /// USD per GB-second of billed duration.
    pub gb_second_usd: f64,
    /// USD per invocation.
    pub request_usd: f64,
    /// USD per request charged by an API gateway in front of the function; 0 when spillway
    /// invokes the function directly (the default).
    pub api_gateway_request_usd: f64,
}

impl FunctionPricing {
    /// AWS Lambda list prices for `arch`, no API gateway.
    pub fn lambda(arch: Architecture) -> Self {
        Self {
            gb_second_usd: arch.default_gb_second_usd(),
            request_usd: DEFAULT_LAMBDA_REQUEST_USD,
            api_gateway_request_usd: 0.0,
        }
    }

    /// Billed GB-seconds of one call of `duration` with `memory_mb` (duration rounded up
    /// to 1 ms; 1 GB = 1024 MB as AWS bills).
    pub fn gb_seconds(memory_mb: u32, duration: Duration) -> f64 {
        let ms = duration.as_nanos().div_ceil(1_000_000) as f64;
        f64::from(memory_mb) / 1024.0 * ms / 1000.0
    }

    /// Cost of one call, USD: compute + request fee + API-gateway fee.
    pub fn cost_per_request(&self, memory_mb: u32, duration: Duration) -> f64 {
        Self::gb_seconds(memory_mb, duration) * self.gb_second_usd
            + self.request_usd
            + self.api_gateway_request_usd
    }
}

/// FaaS cost per second of serving `rate_rps` requests/s entirely on functions, USD/s.
pub fn faas_cost_per_second(rate_rps: f64, cost_per_request: f64) -> f64 {
    rate_rps * cost_per_request
}

/// IaaS cost per second of serving `rate_rps` requests/s on VMs, USD/s:
/// `ceil(N / r_max) · C_vm`.
pub fn iaas_cost_per_second(rate_rps: f64, r_max_rps: f64, vm_hourly_usd: f64) -> f64 {
    (rate_rps / r_max_rps).ceil().max(0.0) * vm_hourly_usd / 3600.0
}

/// Hybrid cost per second (LIBRA's split): whole VMs for the part of the load that fills
/// them, functions for the remainder above the last full VM, USD/s.
pub fn hybrid_cost_per_second(
    rate_rps: f64,
    r_max_rps: f64,
    vm_hourly_usd: f64,
    cost_per_request: f64,
) -> f64 {
    let full_vms = (rate_rps / r_max_rps).floor().max(0.0);
    let rest = rate_rps - full_vms * r_max_rps;
    let vm = full_vms * vm_hourly_usd / 3600.0;
    vm + faas_cost_per_second(rest, cost_per_request).min(vm_hourly_usd / 3600.0)
}

/// The cost-indifference point, requests/s: the lowest rate at which serving on VMs
/// costs no more than serving on functions.
///
/// Within the first VM's capacity the IaaS cost is one VM's price, so
/// `CIP = C_vm / c_req` when that is at most `r_max`. If one VM costs more than
/// `r_max` requests' worth of function calls, functions are cheaper at every rate and
/// the result is `f64::INFINITY`.
pub fn cost_indifference_point_rps(
    cost_per_request: f64,
    r_max_rps: f64,
    vm_hourly_usd: f64,
) -> f64 {
    let cip = vm_hourly_usd / 3600.0 / cost_per_request;
    if cip <= r_max_rps { cip } else { f64::INFINITY }
}

/// Lambda provisioned concurrency, USD per GB-second it is configured (x86_64, AWS list
/// price, 2025).
pub const DEFAULT_PROVISIONED_CONCURRENCY_GB_SECOND_USD: f64 = 0.000_004_166_7;

/// How VM time is billed: whole `granularity`s, rounded up, and at least `minimum` per
/// VM (EC2 Linux on-demand: per second, 60 s minimum; per started hour: granularity and
/// minimum one hour).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct VmBillingRule {
    /// Billing unit (> 0; a zero unit bills the time up as it is).
    pub granularity: Duration,
    /// Least time billed per VM.
    pub minimum: Duration,
}

impl VmBillingRule {
    /// EC2 on-demand Linux: per second, 60 s minimum.
    pub const EC2_PER_SECOND: VmBillingRule = VmBillingRule {
        granularity: Duration::from_secs(1),
        minimum: Duration::from_secs(60),
    };

    /// Billed seconds of one VM up `up_seconds` (a measured amount; negative counts as
    /// 0): rounded up to the granularity, at least the minimum. Float noise below a
    /// microsecond is dropped first (100.000000001 s is 100 s).
    pub fn billed_seconds(&self, up_seconds: f64) -> f64 {
        let up = (up_seconds.max(0.0) * 1e6).round() / 1e6;
        let unit = self.granularity.as_secs_f64();
        let rounded = if unit > 0.0 {
            (up / unit).ceil() * unit
        } else {
            up
        };
        rounded.max(self.minimum.as_secs_f64())
    }
}

/// Prices the live meter bills with (the `pricing` config section).
#[derive(Clone, Debug, PartialEq)]
pub struct MeterPricing {
    /// USD per VM-hour of an instance type without its own price (and of the
    /// counterfactual all-VM pool).
    pub vm_hourly_usd: f64,
    /// USD per VM-hour by instance type.
    pub vm_hourly_usd_by_type: BTreeMap<String, f64>,
    /// How VM time is billed.
    pub vm_billing: VmBillingRule,
    /// Function prices (GB-second, request, API gateway).
    pub function: FunctionPricing,
    /// Memory of every function call, MB.
    pub function_memory_mb: u32,
    /// USD per GB-second of configured provisioned concurrency (pre-warmed instances).
    pub provisioned_gb_second_usd: f64,
    /// r_max: requests/s one VM serves, for the counterfactual all-VM pool.
    pub r_max_rps: f64,
}

impl MeterPricing {
    /// The hourly price of `instance_type`, USD.
    pub fn vm_hourly(&self, instance_type: &str) -> f64 {
        self.vm_hourly_usd_by_type
            .get(instance_type)
            .copied()
            .unwrap_or(self.vm_hourly_usd)
    }
}

/// A function zone as the meter bills it.
#[derive(Clone, Debug, PartialEq)]
pub struct MeterZone {
    /// Zone name (the `zone` label).
    pub name: String,
    /// Pre-warmed instances (provisioned concurrency), billed for every second of the run
    /// at [`MeterPricing::provisioned_gb_second_usd`].
    pub provisioned_instances: u32,
}

/// VM time of one instance type in a bill.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct VmLine {
    /// Instance type (`m4.large`; `process` for local VM processes).
    pub instance_type: String,
    /// Billed VM-seconds.
    pub vm_seconds: f64,
    /// USD.
    pub usd: f64,
}

/// Function calls of one zone in a bill.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct FunctionLine {
    /// Zone name.
    pub zone: String,
    /// Calls billed (request fees).
    pub requests: u64,
    /// Billed GB-seconds (1 ms granularity).
    pub gb_seconds: f64,
    /// USD: GB-seconds and request fees.
    pub usd: f64,
}

/// Provisioned concurrency of one zone in a bill.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ProvisionedLine {
    /// Zone name.
    pub zone: String,
    /// Configured GB-seconds (instances × memory × time).
    pub gb_seconds: f64,
    /// USD.
    pub usd: f64,
}

/// What the same arrivals would have cost on one tier only.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Counterfactual {
    /// Every finished call (on a VM or a function) billed as a function call of its
    /// duration, USD.
    pub all_functions_usd: f64,
    /// A pool of `all_vm_vms` VMs for the whole window, USD.
    pub all_vm_usd: f64,
    /// `ceil(peak_rps / r_max)`.
    pub all_vm_vms: u32,
    /// Most arrivals in one second of the window.
    pub peak_rps: u64,
}

/// The bill of one window, lines in a stable order (instance types and zones sorted by
/// name).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Bill {
    /// Window start, seconds since the meter started.
    pub from_seconds: f64,
    /// Window end, seconds since the meter started.
    pub to_seconds: f64,
    /// VM time by instance type.
    pub vm: Vec<VmLine>,
    /// Function calls by zone.
    pub functions: Vec<FunctionLine>,
    /// Provisioned concurrency by zone (zones with pre-warmed instances only).
    pub provisioned: Vec<ProvisionedLine>,
    /// Sum of every line, USD: the hybrid's cost.
    pub total_usd: f64,
    /// The same arrivals on one tier only.
    pub counterfactual: Counterfactual,
}

#[derive(Clone, Debug)]
struct VmRun {
    instance_type: String,
    start: Time,
    stop: Option<Time>,
}

/// Calls of one second: per zone (requests, GB-seconds), and for the all-functions
/// counterfactual.
#[derive(Clone, Debug)]
struct Second {
    index: u64,
    arrivals: u64,
    zones: Vec<(u64, f64)>,
    all_functions: (u64, f64),
}

/// The live gateway's running bill — a sans-IO state machine fed with `now` (time since
/// the gateway started) and events. See the [module docs](self).
///
/// Since start, everything is kept exactly. The last hour is computed from per-second
/// buckets of the calls and arrivals of the last [`Self::WINDOW`] (a call counts in the
/// second it ended) and from every VM that ran in the window: its billed time up to the
/// window's end minus its billed time up to the window's start (a VM's minimum is billed
/// in the window it started in).
#[derive(Clone, Debug)]
pub struct CostMeter {
    pricing: MeterPricing,
    zones: Vec<MeterZone>,
    vms: BTreeMap<VmId, VmRun>,
    /// Billed (seconds, USD) by instance type of VMs stopped before the last window.
    closed_vm: BTreeMap<String, (f64, f64)>,
    totals: Vec<(u64, f64)>,
    all_functions: (u64, f64),
    peak_rps: u64,
    recent: VecDeque<Second>,
}

impl CostMeter {
    /// The length of the recent window ([`Self::last_hour`]).
    pub const WINDOW: Duration = Duration::from_secs(3600);

    /// A meter started at time zero, billing `zones` (in zone order: the index is the
    /// zone of [`Self::on_function_call`]).
    pub fn new(pricing: MeterPricing, zones: Vec<MeterZone>) -> Self {
        Self {
            totals: vec![(0, 0.0); zones.len()],
            pricing,
            zones,
            vms: BTreeMap::new(),
            closed_vm: BTreeMap::new(),
            all_functions: (0, 0.0),
            peak_rps: 0,
            recent: VecDeque::new(),
        }
    }

    /// The prices in force.
    pub fn pricing(&self) -> &MeterPricing {
        &self.pricing
    }

    /// Use new prices from now on for calls; VM time and provisioned concurrency are
    /// billed at the new prices for the whole run (a configuration reload).
    pub fn set_pricing(&mut self, pricing: MeterPricing) {
        self.pricing = pricing;
    }

    /// `vm` is running from `now` (EC2 bills from `running`); `instance_type` picks its
    /// price. A second report for the same VM is ignored.
    pub fn on_vm_running(&mut self, now: Time, vm: VmId, instance_type: &str) {
        self.vms.entry(vm).or_insert_with(|| VmRun {
            instance_type: instance_type.to_string(),
            start: now,
            stop: None,
        });
        self.prune(now);
    }

    /// `vm` was terminated at `now` (its billing ends). Unknown or already stopped VMs
    /// are ignored.
    pub fn on_vm_stopped(&mut self, now: Time, vm: VmId) {
        if let Some(r) = self.vms.get_mut(&vm)
            && r.stop.is_none()
        {
            r.stop = Some(now.max(r.start));
        }
        self.prune(now);
    }

    /// A request arrived at `now` (for the peak rate of the all-VM counterfactual).
    pub fn on_arrival(&mut self, now: Time) {
        self.second(now).arrivals += 1;
        let n = self.recent.back().map_or(0, |s| s.arrivals);
        self.peak_rps = self.peak_rps.max(n);
    }

    /// A call served by a VM ended at `now` after `duration`: billed only in the
    /// all-functions counterfactual.
    pub fn on_vm_call(&mut self, now: Time, duration: Duration) {
        let gbs = FunctionPricing::gb_seconds(self.pricing.function_memory_mb, duration);
        self.all_functions.0 += 1;
        self.all_functions.1 += gbs;
        let s = self.second(now);
        s.all_functions.0 += 1;
        s.all_functions.1 += gbs;
    }

    /// A call on function zone `zone` ended at `now` after `duration`: its GB-seconds
    /// (1 ms granularity) and request fee, and the same in the all-functions
    /// counterfactual. An unknown zone is ignored.
    pub fn on_function_call(&mut self, now: Time, zone: usize, duration: Duration) {
        if zone >= self.zones.len() {
            return;
        }
        let gbs = FunctionPricing::gb_seconds(self.pricing.function_memory_mb, duration);
        self.totals[zone].0 += 1;
        self.totals[zone].1 += gbs;
        self.all_functions.0 += 1;
        self.all_functions.1 += gbs;
        let s = self.second(now);
        s.zones[zone].0 += 1;
        s.zones[zone].1 += gbs;
        s.all_functions.0 += 1;
        s.all_functions.1 += gbs;
    }

    /// The bill from the start to `now`.
    pub fn since_start(&self, now: Time) -> Bill {
        let mut vm: BTreeMap<String, (f64, f64)> = self.closed_vm.clone();
        for r in self.vms.values() {
            let (secs, usd) = self.vm_billed(r, now);
            let e = vm.entry(r.instance_type.clone()).or_default();
            e.0 += secs;
            e.1 += usd;
        }
        self.bill(
            Duration::ZERO,
            now,
            vm,
            self.totals.clone(),
            self.all_functions,
            self.peak_rps,
        )
    }

    /// The bill of the last [`Self::WINDOW`] up to `now` (from the start while the gateway
    /// has run less than that). Calls and arrivals are counted at one-second resolution:
    /// those of the second `now − WINDOW` falls in count.
    pub fn last_hour(&self, now: Time) -> Bill {
        let from = now.saturating_sub(Self::WINDOW);
        let first = from.as_secs();
        let mut totals = vec![(0, 0.0); self.zones.len()];
        let mut all = (0, 0.0);
        let mut peak = 0;
        for s in self.recent.iter().filter(|s| s.index >= first) {
            for (t, z) in totals.iter_mut().zip(&s.zones) {
                t.0 += z.0;
                t.1 += z.1;
            }
            all.0 += s.all_functions.0;
            all.1 += s.all_functions.1;
            peak = peak.max(s.arrivals);
        }
        let mut vm: BTreeMap<String, (f64, f64)> = BTreeMap::new();
        for r in self.vms.values() {
            if r.stop.is_some_and(|t| t < from) {
                continue;
            }
            let (s1, u1) = self.vm_billed(r, now);
            let (s0, u0) = if r.start < from {
                self.vm_billed(r, from)
            } else {
                (0.0, 0.0)
            };
            let e = vm.entry(r.instance_type.clone()).or_default();
            e.0 += s1 - s0;
            e.1 += u1 - u0;
        }
        self.bill(from, now, vm, totals, all, peak)
    }

    /// Billed (seconds, USD) of `r` up to `at`.
    fn vm_billed(&self, r: &VmRun, at: Time) -> (f64, f64) {
        if at < r.start {
            return (0.0, 0.0);
        }
        let end = r.stop.map_or(at, |s| s.min(at));
        let secs = self
            .pricing
            .vm_billing
            .billed_seconds(end.saturating_sub(r.start).as_secs_f64());
        (
            secs,
            secs / 3600.0 * self.pricing.vm_hourly(&r.instance_type),
        )
    }

    fn bill(
        &self,
        from: Time,
        to: Time,
        vm: BTreeMap<String, (f64, f64)>,
        totals: Vec<(u64, f64)>,
        all: (u64, f64),
        peak: u64,
    ) -> Bill {
        let p = &self.pricing;
        let fee = p.function.request_usd + p.function.api_gateway_request_usd;
        let span = to.saturating_sub(from).as_secs_f64();
        let vm: Vec<VmLine> = vm
            .into_iter()
            .map(|(instance_type, (vm_seconds, usd))| VmLine {
                instance_type,
                vm_seconds,
                usd,
            })
            .collect();
        let mut functions: Vec<FunctionLine> = self
            .zones
            .iter()
            .zip(&totals)
            .map(|(z, &(requests, gb_seconds))| FunctionLine {
                zone: z.name.clone(),
                requests,
                gb_seconds,
                usd: gb_seconds * p.function.gb_second_usd + requests as f64 * fee,
            })
            .collect();
        functions.sort_by(|a, b| a.zone.cmp(&b.zone));
        let mut provisioned: Vec<ProvisionedLine> = self
            .zones
            .iter()
            .filter(|z| z.provisioned_instances > 0)
            .map(|z| {
                let gb_seconds =
                    f64::from(z.provisioned_instances) * f64::from(p.function_memory_mb) / 1024.0
                        * span;
                ProvisionedLine {
                    zone: z.name.clone(),
                    gb_seconds,
                    usd: gb_seconds * p.provisioned_gb_second_usd,
                }
            })
            .collect();
        provisioned.sort_by(|a, b| a.zone.cmp(&b.zone));
        let total_usd = vm.iter().map(|l| l.usd).sum::<f64>()
            + functions.iter().map(|l| l.usd).sum::<f64>()
            + provisioned.iter().map(|l| l.usd).sum::<f64>();
        let all_vm_vms = if p.r_max_rps > 0.0 {
            (peak as f64 / p.r_max_rps).ceil() as u32
        } else {
            0
        };
        let all_vm_usd = if all_vm_vms == 0 {
            0.0
        } else {
            f64::from(all_vm_vms) * p.vm_billing.billed_seconds(span) / 3600.0 * p.vm_hourly_usd
        };
        Bill {
            from_seconds: from.as_secs_f64(),
            to_seconds: to.as_secs_f64(),
            vm,
            functions,
            provisioned,
            total_usd,
            counterfactual: Counterfactual {
                all_functions_usd: all.1 * p.function.gb_second_usd + all.0 as f64 * fee,
                all_vm_usd,
                all_vm_vms,
                peak_rps: peak,
            },
        }
    }

    /// The bucket of `now`'s second (a new one when `now` is in a later second).
    fn second(&mut self, now: Time) -> &mut Second {
        let index = now.as_secs();
        if self.recent.back().is_none_or(|s| s.index < index) {
            self.prune(now);
            self.recent.push_back(Second {
                index,
                arrivals: 0,
                zones: vec![(0, 0.0); self.zones.len()],
                all_functions: (0, 0.0),
            });
        }
        self.recent.back_mut().expect("pushed above")
    }

    /// Forget what no window can need any more: seconds before the last window, VMs
    /// stopped before it (folded into the since-start totals).
    fn prune(&mut self, now: Time) {
        let from = now.saturating_sub(Self::WINDOW);
        let first = from.as_secs();
        while self.recent.front().is_some_and(|s| s.index < first) {
            self.recent.pop_front();
        }
        let old: Vec<VmId> = self
            .vms
            .iter()
            .filter(|(_, r)| r.stop.is_some_and(|s| s < from))
            .map(|(id, _)| *id)
            .collect();
        for id in old {
            let r = self.vms.remove(&id).expect("listed above");
            let (secs, usd) = self.vm_billed(&r, now);
            let e = self.closed_vm.entry(r.instance_type).or_default();
            e.0 += secs;
            e.1 += usd;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn m4_large_vs_512mb_one_second_function_on_x86() {
        let p = FunctionPricing::lambda(Architecture::X86_64);
        let c = p.cost_per_request(512, Duration::from_secs(1));
        // 0.5 GB-s · 0.0000166667 + 0.0000002 = 0.00000853335 USD
        assert!((c - 0.000_008_533_35).abs() < 1e-15);
        let cip = cost_indifference_point_rps(c, 16.0, DEFAULT_M4_LARGE_HOURLY_USD);
        // 0.10 / 3600 / 0.00000853335 = 3.2552 req/s
        assert!((cip - 3.2552).abs() < 1e-3, "{cip}");
        // An API gateway fee makes each function call dearer, so the CIP drops.
        let gw = FunctionPricing {
            api_gateway_request_usd: DEFAULT_API_GATEWAY_REQUEST_USD,
            ..p
        };
        let cip_gw = cost_indifference_point_rps(
            gw.cost_per_request(512, Duration::from_secs(1)),
            16.0,
            DEFAULT_M4_LARGE_HOURLY_USD,
        );
        assert!((cip_gw - 2.9138).abs() < 1e-3, "{cip_gw}");
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    /// A bill computed by hand: an unpriced type at the default $0.36/h ($0.0001/s), a
    /// c5.large at $0.072/h ($0.00002/s), 1.5 GB functions at $0.00002/GB-s and
    /// $0.0000003 a request, 2 provisioned instances in `cloud` at $0.000005/GB-s, r_max
    /// 10 req/s; read after 1.5 hours.
    #[test]
    fn the_meter_bills_a_hand_computed_run_since_start_and_for_the_last_hour() {
        let pricing = MeterPricing {
            vm_hourly_usd: 0.36,
            vm_hourly_usd_by_type: BTreeMap::from([("c5.large".to_string(), 0.072)]),
            vm_billing: VmBillingRule::EC2_PER_SECOND,
            function: FunctionPricing {
                gb_second_usd: 0.000_02,
                request_usd: 0.000_000_3,
                api_gateway_request_usd: 0.0,
            },
            function_memory_mb: 1536,
            provisioned_gb_second_usd: 0.000_005,
            r_max_rps: 10.0,
        };
        let zones = vec![
            MeterZone {
                name: "edge".into(),
                provisioned_instances: 0,
            },
            MeterZone {
                name: "cloud".into(),
                provisioned_instances: 2,
            },
        ];
        let mut m = CostMeter::new(pricing, zones);
        let t = Duration::from_secs_f64;
        m.on_vm_running(t(0.0), VmId(1), "m5.large");
        // Under a minute up: billed 60 s.
        m.on_vm_running(t(100.5), VmId(2), "c5.large");
        m.on_vm_stopped(t(130.2), VmId(2));
        for _ in 0..25 {
            m.on_arrival(t(10.1));
        }
        m.on_function_call(t(10.5), 0, Duration::from_micros(250_400)); // 251 ms
        m.on_vm_call(t(11.0), Duration::from_secs(2));
        // Up 40 s across the window start (1800 s): its minimum is billed when it started.
        m.on_vm_running(t(1790.0), VmId(3), "c5.large");
        m.on_vm_stopped(t(1830.0), VmId(3));
        for _ in 0..7 {
            m.on_arrival(t(4000.1));
        }
        m.on_function_call(t(4000.2), 1, Duration::from_secs(1));
        m.on_function_call(t(4000.7), 1, Duration::from_micros(900)); // 1 ms
        let now = t(5400.0);

        let b = m.since_start(now);
        let vm: Vec<(&str, f64, f64)> =
            b.vm.iter()
                .map(|l| (l.instance_type.as_str(), l.vm_seconds, l.usd))
                .collect();
        assert_eq!(vm.len(), 2);
        assert_eq!((vm[0].0, vm[0].1), ("c5.large", 120.0));
        assert!(close(vm[0].2, 0.0024), "{vm:?}");
        assert_eq!((vm[1].0, vm[1].1), ("m5.large", 5400.0));
        assert!(close(vm[1].2, 0.54), "{vm:?}");
        let cloud = &b.functions[0];
        let edge = &b.functions[1];
        assert_eq!((cloud.zone.as_str(), cloud.requests), ("cloud", 2));
        assert!(close(cloud.gb_seconds, 1.5015));
        assert!(close(cloud.usd, 0.000_030_63), "{cloud:?}");
        assert_eq!((edge.zone.as_str(), edge.requests), ("edge", 1));
        assert!(close(edge.gb_seconds, 0.3765));
        assert!(close(edge.usd, 0.000_007_83), "{edge:?}");
        assert_eq!(b.provisioned.len(), 1);
        assert!(close(b.provisioned[0].gb_seconds, 16_200.0));
        assert!(close(b.provisioned[0].usd, 0.081));
        assert!(close(b.total_usd, 0.623_438_46), "{}", b.total_usd);
        let c = &b.counterfactual;
        // 4 calls, 0.3765 + 1.5015 + 3 GB-s.
        assert!(close(c.all_functions_usd, 0.000_098_76), "{c:?}");
        assert_eq!((c.peak_rps, c.all_vm_vms), (25, 3));
        assert!(close(c.all_vm_usd, 1.62), "{c:?}");

        let h = m.last_hour(now);
        assert_eq!((h.from_seconds, h.to_seconds), (1800.0, 5400.0));
        let vm: Vec<(&str, f64)> =
            h.vm.iter()
                .map(|l| (l.instance_type.as_str(), l.vm_seconds))
                .collect();
        assert_eq!(vm, [("c5.large", 0.0), ("m5.large", 3600.0)]);
        assert!(close(h.vm[1].usd, 0.36));
        assert_eq!((h.functions[0].requests, h.functions[1].requests), (2, 0));
        assert!(close(h.provisioned[0].usd, 0.054));
        assert!(close(h.total_usd, 0.414_030_63), "{}", h.total_usd);
        let c = &h.counterfactual;
        assert!(close(c.all_functions_usd, 0.000_030_63));
        assert_eq!((c.peak_rps, c.all_vm_vms), (7, 1));
        assert!(close(c.all_vm_usd, 0.36));

        // 50 s into another run: the running VM is billed its 60 s minimum, and the last
        // hour is the run so far.
        let mut m = CostMeter::new(m.pricing().clone(), Vec::new());
        m.on_vm_running(t(0.0), VmId(7), "m5.large");
        let early = m.last_hour(t(50.0));
        assert_eq!(early.from_seconds, 0.0);
        assert!(close(early.vm[0].usd, 0.006), "{early:?}");
        assert_eq!(
            early,
            Bill {
                to_seconds: 50.0,
                ..m.since_start(t(50.0))
            }
        );
    }

    #[test]
    fn vm_billing_rounds_up_to_the_granularity_and_bills_the_minimum() {
        let r = VmBillingRule::EC2_PER_SECOND;
        assert_eq!(r.billed_seconds(30.5), 60.0);
        assert_eq!(r.billed_seconds(130.2), 131.0);
        assert_eq!(r.billed_seconds(100.000_000_001), 100.0);
        let hourly = VmBillingRule {
            granularity: Duration::from_secs(3600),
            minimum: Duration::from_secs(3600),
        };
        assert_eq!(hourly.billed_seconds(3601.0), 7200.0);
        assert_eq!(hourly.billed_seconds(0.0), 3600.0);
        let coarse = VmBillingRule {
            granularity: Duration::from_secs(10),
            minimum: Duration::ZERO,
        };
        assert_eq!(coarse.billed_seconds(41.0), 50.0);
    }

    #[test]
    fn billing_rounds_duration_up_to_the_millisecond() {
        let gbs = FunctionPricing::gb_seconds(1024, Duration::from_micros(1_001));
        assert!((gbs - 0.002).abs() < 1e-12);
    }

    #[test]
    fn functions_always_cheaper_gives_infinite_cip() {
        let cip = cost_indifference_point_rps(1e-9, 16.0, 0.10);
        assert!(cip.is_infinite());
    }
}
