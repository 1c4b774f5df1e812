//! The discrete-event engine: one policy over one trace on a virtual clock.
//!
//! Time is integer nanoseconds since the trace window's start. Three sources of events
//! are merged in time order, jumping from one event to the next (no tick loop):
//! 1. the trace's arrival stream (already time-ordered);
//! 2. a binary heap of scheduled events — VM request completions, function call
//!    completions, VM readiness — ordered by `(time, sequence number)`, so ties resolve in
//!    scheduling order and runs are deterministic;
//! 3. epoch ends (the policy core's [`Controller::poll_timeout`]), closed before any
//!    event at or after them.
//!
//! At equal times: epoch ends first, then scheduled events, then arrivals (a request
//! finishing at `t` frees its slot for one arriving at `t`).
//!
//! Every decision is the policy core's: [`Controller`] (traffic monitor, scaling policy,
//! routing policy, VM table — LIBRA §III) and [`FunctionPool`] (FaaSim §3). The engine
//! only models the physics:
//! * **VM** (LIBRA §IV's simulator): `slots` parallel slots and one FIFO queue. A request
//!   starts at `max(arrival, earliest free slot)` — exact for a FIFO multi-server queue —
//!   and responds after queue wait + service time. A launched VM is ready after
//!   `boot_seconds`; the policy's initial pool is booted before t = 0.
//! * **Function** (FaaSim §3): response = cold or warm start + service time; over
//!   `max_concurrency` live instances a call is throttled (counted, not served).
//!   Billed per call: service time rounded up to 1 ms × memory (GB-s), plus the cold
//!   start as INIT when `bill_init`, plus the request fee (and the API-gateway fee when
//!   `pricing.api_gateway`).
//! * **SLA**: a served response slower than `sla_ms` is a violation; a throttled or
//!   rejected request is one too (it got no answer in time).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::time::Duration;

use hdrhistogram::Histogram;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::SimError;
use super::model::{ServiceModel, vm_billed_seconds};
use super::report::{CostBreakdown, EpochRow, PolicyReport, RMaxReport, ResponseMs};
use super::trace::Trace;
use crate::config::Config;
use crate::config::sim::{FunctionModelConfig, VmModelConfig};
use crate::policy::attempt::{AttemptKind, Decision, Ticket};
use crate::policy::balancer::{RequestMeta, RouteReason, VmFirst};
pub use crate::policy::baselines::PolicyKind;
use crate::policy::baselines::{AutoParams, PolicyParams};
use crate::policy::controller::{self, ControllerParams};
use crate::policy::core::{Action, Core, CoreParams};
use crate::policy::cost::FunctionPricing;
use crate::policy::functions::{FunctionPoolParams, InstanceId};
use crate::policy::placement::{Lease, PlacementParams, Start, ZoneCapacity, ZoneId};
use crate::policy::rmax::RMaxParams;
use crate::policy::scaling::LibraScalingParams;
use crate::policy::timers::Timer;
use crate::policy::{Time, VmId};

/// Everything a run needs from the configuration, resolved and typed.
#[derive(Clone, Debug)]
pub struct SimParams {
    /// Monitor and controller parameters (always executing scaling).
    pub controller: ControllerParams,
    /// LIBRA's scaling-manager parameters, CIP resolved.
    pub libra: LibraScalingParams,
    /// LIBRA's balancer (ρ, optional per-VM cap), cloned for each run.
    pub balancer: VmFirst,
    /// AUTO/Spock parameters.
    pub auto: AutoParams,
    /// The VM model.
    pub vm: VmModelConfig,
    /// The function model.
    pub function: FunctionModelConfig,
    /// Default service-time model.
    pub service: ServiceModel,
    /// Default function memory, MB.
    pub memory_mb: u32,
    /// SLA threshold, ns.
    pub sla_ns: u64,
    /// Function prices (API-gateway fee included only when configured).
    pub pricing: FunctionPricing,
    /// VM price, USD per hour.
    pub vm_hourly_usd: f64,
    /// Adaptive r_max for LIBRA (`libra.r_max_adaptive`, LIBRA §III-B): fed with each
    /// VM request's modelled response time (queue wait + service). The baselines keep
    /// the static r_max.
    pub r_max_adaptive: Option<RMaxParams>,
}

impl SimParams {
    /// Resolve a validated configuration.
    ///
    /// # Errors
    /// [`SimError::Invalid`] naming the field if a model cannot be built.
    pub fn from_config(c: &Config) -> Result<Self, SimError> {
        let s = &c.sim;
        let service = ServiceModel::from_config(&s.request.service_time).map_err(|message| {
            SimError::Invalid {
                field: "sim.request.service_time".into(),
                message,
            }
        })?;
        let epoch = c.libra.epoch_seconds;
        let mut controller = c.controller_params();
        controller.execute_scaling = true;
        Ok(Self {
            controller,
            libra: c.libra_scaling_params(),
            balancer: c.libra_balancer(),
            auto: AutoParams {
                scale_out_utilisation: s.auto.scale_out_utilisation,
                scale_in_utilisation: s.auto.scale_in_utilisation,
                window_epochs: ((s.auto.window_seconds / epoch).round() as u32).max(1),
                step_vms: s.auto.step_vms,
                grace: Duration::from_secs_f64(s.auto.grace_seconds),
                min_vms: s.auto.min_vms,
                max_vms: s.auto.max_vms,
                r_max_rps: c.libra.r_max_rps,
            },
            vm: s.vm.clone(),
            function: s.function.clone(),
            service,
            memory_mb: s.request.memory_mb.unwrap_or(c.pricing.function_memory_mb),
            sla_ns: (s.sla_ms * 1e6).round() as u64,
            pricing: c.pricing.function_pricing(),
            vm_hourly_usd: c.pricing.vm_hourly_usd,
            r_max_adaptive: c.r_max_adaptive_params(),
        })
    }

    /// MAX's pool for `trace`: `ceil(peak / r_max)` VMs.
    pub fn max_vms_for(&self, trace: &Trace) -> u32 {
        (trace.peak_rps() / self.libra.r_max_rps).ceil().max(0.0) as u32
    }

    /// The policy parameters [`PolicyKind::build`] needs for `trace`.
    pub fn policy_params(&self, trace: &Trace) -> PolicyParams {
        PolicyParams {
            libra: self.libra.clone(),
            balancer: self.balancer.clone(),
            auto: self.auto.clone(),
            max_vms: self.max_vms_for(trace),
            slots_per_vm: self.vm.slots,
        }
    }

    /// The core's parameters: the controller (always executing scaling), one cloud
    /// function zone with the function model's keep-alive, pre-warm and concurrency cap,
    /// no VM boot deadline (modelled VMs always boot).
    pub fn core_params(&self) -> CoreParams {
        let f = &self.function;
        CoreParams {
            controller: self.controller.clone(),
            placement: PlacementParams::single(
                crate::config::SINGLE_ZONE_NAME,
                ZoneCapacity::Instances(FunctionPoolParams {
                    keep_alive: Duration::from_secs_f64(f.keep_alive_seconds),
                    max_instances: Some(f.max_concurrency),
                    prewarmed: f.prewarmed,
                }),
            ),
            vm_boot_timeout: None,
        }
    }
}

/// Details of a run beyond the report (for tests and plots).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RunStats {
    /// VMs launched (including the initial pool).
    pub vms_launched: u32,
    /// Most VMs alive (booting, ready or draining) at once.
    pub peak_vms: u32,
    /// Billed VM seconds, summed over VMs.
    pub vm_billed_seconds: f64,
    /// Requests served by functions.
    pub function_served: u64,
    /// Warm starts.
    pub warm_starts: u64,
    /// Requests the routing policy rejected (counted in `throttled`), other than calls
    /// no function zone and no VM could take.
    pub rejected: u64,
    /// Function calls no zone could take that fell back to a VM (LIBRA §III-C
    /// spill-back), served and not counted as throttled.
    pub fell_back: u64,
    /// FaaSim §3 usage: total start-up time of cold starts, s.
    pub function_startup_s: f64,
    /// FaaSim §3 usage: total busy time of instances, s.
    pub function_busy_s: f64,
    /// FaaSim §3 usage: total idle (kept-alive) time of instances, s.
    pub function_idle_s: f64,
    /// Simulated end time, s (the trace end or the last completion, whichever is later).
    pub end_s: f64,
}

/// Result of one policy's run.
#[derive(Clone, Debug)]
pub struct PolicyRun {
    /// The report object.
    pub report: PolicyReport,
    /// Extra details.
    pub stats: RunStats,
    /// Per-epoch series (empty unless requested).
    pub series: Vec<EpochRow>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum EvKind {
    /// A VM request ends: VM, its response time in µs (saturating; for adaptive r_max).
    VmDone(u32, u32),
    /// A function call ends: zone, instance.
    FnDone(u16, u32),
    VmReady(u32),
    /// A cold-started function instance is ready: zone, instance.
    InstanceReady(u16, u32),
}

struct VmSim {
    launch_ns: u64,
    ready_ns: Option<u64>,
    stop_ns: Option<u64>,
    /// Time each slot becomes free (min-heap).
    slots: BinaryHeap<Reverse<u64>>,
}

const NS: u64 = 1_000_000_000;

fn dur(ns: u64) -> Time {
    Duration::from_nanos(ns)
}

struct Engine<'a> {
    p: &'a SimParams,
    core: Core,
    heap: BinaryHeap<Reverse<(u64, u64, EvKind)>>,
    seq: u64,
    vms: Vec<VmSim>,
    alive_vms: u32,
    /// Ready (or draining) VMs, for utilisation.
    cap_vms: u32,
    cap_since: u64,
    cap_integral: f64,
    /// Busy slot-ns per epoch, from the open epoch on.
    busy: VecDeque<f64>,
    epoch_ns: u64,
    open_epoch: u64,
    measure_util: bool,
    /// Report VM response times to the core (adaptive r_max).
    measure_latency: bool,
    trace_end_ns: u64,
    stats: RunStats,
    // Accounting.
    served: u64,
    throttled: u64,
    violations: u64,
    sum_response_ns: u128,
    hist: Histogram<u64>,
    cold_starts: u64,
    /// Σ memory_mb · billed_ms over function calls.
    mb_ms: u128,
    last_done_ns: u64,
    series: Option<Vec<EpochRow>>,
    last_routed_fn: u64,
}

impl<'a> Engine<'a> {
    fn schedule(&mut self, t: u64, kind: EvKind) {
        self.seq += 1;
        self.heap.push(Reverse((t, self.seq, kind)));
    }

    fn integrate_cap(&mut self, now: u64) {
        if now > self.cap_since {
            self.cap_integral += f64::from(self.cap_vms) * (now - self.cap_since) as f64;
            self.cap_since = now;
        }
    }

    fn drain_actions(&mut self, now: u64, initial: bool) {
        while let Some(a) = self.core.poll_action() {
            match a {
                Action::Scaling(controller::Action::Launch { vm }) => {
                    let i = vm.0 as usize;
                    debug_assert_eq!(i, self.vms.len(), "the controller allocates ids in order");
                    self.vms.push(VmSim {
                        launch_ns: now,
                        ready_ns: None,
                        stop_ns: None,
                        slots: (0..self.p.vm.slots).map(|_| Reverse(0)).collect(),
                    });
                    self.stats.vms_launched += 1;
                    self.alive_vms += 1;
                    self.stats.peak_vms = self.stats.peak_vms.max(self.alive_vms);
                    if initial {
                        // The initial pool is booted before t = 0.
                        self.vm_ready(now, i as u32);
                    } else {
                        let boot = (self.p.vm.boot_seconds * 1e9).round() as u64;
                        self.schedule(now + boot, EvKind::VmReady(i as u32));
                    }
                }
                Action::Scaling(controller::Action::Stop { vm }) => {
                    let v = &mut self.vms[vm.0 as usize];
                    if v.stop_ns.is_none() {
                        v.stop_ns = Some(now);
                        v.slots = BinaryHeap::new();
                        self.alive_vms -= 1;
                        if v.ready_ns.is_some() {
                            self.integrate_cap(now);
                            self.cap_vms -= 1;
                        }
                    }
                }
                // Modelled pre-warmed instances are ready at once; idle ones that expire
                // need no physics (their usage is the core's accounting).
                Action::StartInstance { zone, instance } => {
                    self.core.on_instance_started(dur(now), zone, instance);
                }
                Action::Scaling(
                    controller::Action::Drain { .. } | controller::Action::Decided { .. },
                )
                | Action::StopInstance { .. }
                | Action::VmBootTimedOut { .. } => {}
                // No delay queue in this engine yet: nothing asks for CPU samples.
                Action::SampleCpu => self.core.on_cpu_sample(dur(now), 0.0),
            }
        }
    }

    fn vm_ready(&mut self, now: u64, vm: u32) {
        let v = &mut self.vms[vm as usize];
        if v.stop_ns.is_some() || v.ready_ns.is_some() {
            return;
        }
        v.ready_ns = Some(now);
        self.integrate_cap(now);
        self.cap_vms += 1;
        self.core.on_vm_ready(dur(now), VmId(u64::from(vm)));
    }

    /// Close the epoch ending at `end` (ns).
    fn close_epoch(&mut self, end: u64) {
        if self.measure_util {
            self.integrate_cap(end);
            let busy = self.busy.pop_front().unwrap_or(0.0);
            let cap = self.cap_integral * f64::from(self.p.vm.slots);
            let u = if cap > 0.0 {
                busy / cap
            } else if busy > 0.0 {
                1.0
            } else {
                0.0
            };
            self.core.set_vm_utilisation(u);
            self.cap_integral = 0.0;
        }
        self.core.handle_timeout(dur(end));
        self.open_epoch += 1;
        self.drain_actions(end, false);
        if let Some(series) = self.series.as_mut() {
            let st = self.core.controller().status();
            series.push(EpochRow {
                time_s: end as f64 / 1e9,
                load: st.last_epoch_requests,
                avg_rps: st.avg_rps,
                std_rps: st.std_rps,
                vm_reqs_rps: st.vm_reqs_rps,
                vms_ready: st.pool.ready,
                function_calls: st.routed.function - self.last_routed_fn,
                r_max_rps: st.r_max_rps,
            });
            self.last_routed_fn = st.routed.function;
        }
    }

    fn add_busy(&mut self, start: u64, end: u64) {
        let e = self.epoch_ns;
        let mut idx = start / e;
        let last = (end.saturating_sub(1)) / e;
        while idx <= last {
            let lo = start.max(idx * e);
            let hi = end.min((idx + 1) * e);
            let k = (idx - self.open_epoch) as usize;
            if self.busy.len() <= k {
                self.busy.resize(k + 1, 0.0);
            }
            self.busy[k] += (hi - lo) as f64;
            idx += 1;
        }
    }

    #[inline]
    fn respond(&mut self, arrival: u64, done: u64) {
        let r = done - arrival;
        self.served += 1;
        self.sum_response_ns += u128::from(r);
        if r > self.p.sla_ns {
            self.violations += 1;
        }
        self.hist.saturating_record(r / 1000);
    }

    fn handle(&mut self, t: u64, kind: EvKind) {
        match kind {
            EvKind::VmDone(vm, latency_us) => {
                self.last_done_ns = t;
                if self.measure_latency {
                    self.core
                        .on_vm_response_time(dur(t), Duration::from_micros(u64::from(latency_us)));
                }
                self.core
                    .on_vm_request_finished(dur(t), VmId(u64::from(vm)));
                self.drain_actions(t, false);
            }
            EvKind::FnDone(zone, id) => {
                self.last_done_ns = t;
                let lease = Lease {
                    zone: ZoneId(zone),
                    start: Start::Warm(InstanceId(u64::from(id))),
                };
                self.core.on_function_finished(dur(t), lease);
                self.drain_actions(t, false);
            }
            EvKind::VmReady(vm) => {
                if t <= self.trace_end_ns {
                    self.vm_ready(t, vm);
                    self.drain_actions(t, false);
                }
            }
            EvKind::InstanceReady(zone, id) => {
                self.core
                    .on_instance_started(dur(t), ZoneId(zone), InstanceId(u64::from(id)));
                self.drain_actions(t, false);
            }
        }
    }

    #[inline]
    fn arrive(&mut self, t: u64, service_ns: u64, memory_mb: u32) {
        let mut ticket = Ticket::new(RequestMeta::default(), None);
        let decision = self.core.route(dur(t), &mut ticket);
        match decision {
            Decision::Vm { vm, kind, .. } => {
                if kind == AttemptKind::FallBack {
                    self.stats.fell_back += 1;
                }
                let v = &mut self.vms[vm.0 as usize];
                let mut top = v.slots.peek_mut().expect("a VM has at least one slot");
                let start = top.0.max(t);
                let end = start + service_ns;
                *top = Reverse(end);
                drop(top);
                if self.measure_util {
                    self.add_busy(start, end);
                }
                let latency_us = u32::try_from((end - t) / 1000).unwrap_or(u32::MAX);
                self.schedule(end, EvKind::VmDone(vm.0 as u32, latency_us));
                self.respond(t, end);
            }
            Decision::Function { lease, .. } => {
                let zone = lease.zone.0;
                let (id, start) = match lease.start {
                    Start::Warm(id) => {
                        (id, t + (self.p.function.warm_start_ms * 1e6).round() as u64)
                    }
                    Start::Cold(id) => {
                        let cold = (self.p.function.cold_start_ms * 1e6).round() as u64;
                        // Ready after its cold start; busy with this call meanwhile.
                        self.schedule(t + cold, EvKind::InstanceReady(zone, id.0 as u32));
                        self.cold_starts += 1;
                        if self.p.function.bill_init {
                            self.mb_ms +=
                                u128::from(memory_mb) * u128::from(cold.div_ceil(1_000_000));
                        }
                        (id, t + cold)
                    }
                    Start::Untracked => unreachable!("simulated zones have instances"),
                };
                self.mb_ms += u128::from(memory_mb) * u128::from(service_ns.div_ceil(1_000_000));
                self.stats.function_served += 1;
                let end = start + service_ns;
                self.schedule(end, EvKind::FnDone(zone, id.0 as u32));
                self.respond(t, end);
            }
            Decision::Reject { reason } | Decision::Queue { reason } => {
                self.throttled += 1;
                self.violations += 1;
                if reason != RouteReason::SpillBackRejected {
                    self.stats.rejected += 1;
                }
            }
        }
    }

    /// Fire every policy deadline at or before `t`; epoch ends only up to the trace end
    /// (the report's epochs), with the VM utilisation measured before each closes.
    fn fire_timers(&mut self, t: u64) {
        loop {
            let (timer, at) = self.core.next_timer();
            let at = at.as_nanos() as u64;
            if at > t || (timer == Timer::EpochEnd && at > self.trace_end_ns) {
                break;
            }
            if timer == Timer::EpochEnd {
                self.close_epoch(at);
            } else {
                self.core.handle_timeout(dur(at));
                self.drain_actions(at, false);
            }
        }
    }
}

/// Run one policy over `trace` with `seed`. `progress` is called with the number of
/// arrivals processed every 2¹⁶ arrivals. `series` records the per-epoch rows.
pub fn run_policy(
    p: &SimParams,
    trace: &Trace,
    kind: PolicyKind,
    seed: u64,
    series: bool,
    progress: &mut dyn FnMut(u64),
) -> PolicyRun {
    let (scaler, router) = kind.build(&p.policy_params(trace));
    let adaptive = if kind == PolicyKind::Libra {
        p.r_max_adaptive.clone()
    } else {
        None
    };
    let core = Core::new(p.core_params(), scaler, router).with_adaptive_r_max(adaptive);
    let measure_latency = core.adapts_r_max();
    let epoch_ns = p.controller.monitor.epoch.as_nanos() as u64;
    let mut e = Engine {
        p,
        core,
        heap: BinaryHeap::new(),
        seq: 0,
        vms: Vec::new(),
        alive_vms: 0,
        cap_vms: 0,
        cap_since: 0,
        cap_integral: 0.0,
        busy: VecDeque::new(),
        epoch_ns,
        open_epoch: 0,
        measure_util: kind.uses_utilisation(),
        measure_latency,
        trace_end_ns: (trace.duration_s * 1e9).round() as u64,
        stats: RunStats::default(),
        served: 0,
        throttled: 0,
        violations: 0,
        sum_response_ns: 0,
        // 1 µs to ~28 h, 3 significant digits; longer responses saturate.
        hist: Histogram::new_with_bounds(1, 100_000_000_000, 3).expect("valid bounds"),
        cold_starts: 0,
        mb_ms: 0,
        last_done_ns: 0,
        series: series.then(Vec::new),
        last_routed_fn: 0,
    };
    // Service times and per-minute arrivals draw from two streams of one seeded ChaCha.
    let mut service_rng = ChaCha8Rng::seed_from_u64(seed);
    let mut arrival_rng = ChaCha8Rng::seed_from_u64(seed);
    arrival_rng.set_stream(1);
    e.core.start(Time::ZERO);
    e.drain_actions(0, true);

    let mut stream = trace.stream(arrival_rng);
    let mut next = stream.next_arrival();
    let mut arrived = 0u64;
    loop {
        let heap_t = e.heap.peek().map(|Reverse((t, _, _))| *t);
        let t = match (heap_t, next.as_ref()) {
            (None, None) => break,
            (Some(h), None) => h,
            (None, Some(a)) => a.at_ns,
            (Some(h), Some(a)) => h.min(a.at_ns),
        };
        // At equal times: deadlines (epoch ends first), then scheduled events, then
        // arrivals.
        e.fire_timers(t);
        if heap_t == Some(t) {
            let Some(Reverse((t, _, kind))) = e.heap.pop() else {
                unreachable!()
            };
            e.handle(t, kind);
            continue;
        }
        let a = next.take().expect("an arrival is next");
        let class = trace.classes.get(a.class as usize);
        let service_ns = if a.service_ns > 0 {
            a.service_ns
        } else {
            class
                .and_then(|c| c.service.as_ref())
                .unwrap_or(&p.service)
                .sample(&mut service_rng)
        };
        let memory_mb = class.and_then(|c| c.memory_mb).unwrap_or(p.memory_mb);
        e.arrive(a.at_ns, service_ns, memory_mb);
        arrived += 1;
        if arrived & 0xFFFF == 0 {
            progress(arrived);
        }
        next = stream.next_arrival();
    }
    // Close the epochs up to the trace end (quiet tail).
    e.fire_timers(e.trace_end_ns);
    progress(arrived);
    let end_ns = e.trace_end_ns.max(e.last_done_ns);
    e.core.finish_functions(dur(end_ns));
    finish(e, kind, arrived, end_ns)
}

fn finish(mut e: Engine<'_>, kind: PolicyKind, arrived: u64, end_ns: u64) -> PolicyRun {
    let p = e.p;
    let mut billed = 0.0;
    for v in &e.vms {
        let stop = v.stop_ns.unwrap_or(end_ns);
        billed += vm_billed_seconds(
            &p.vm,
            v.launch_ns as f64 / 1e9,
            v.ready_ns.map(|r| r as f64 / 1e9),
            stop as f64 / 1e9,
        );
    }
    let vm_hours = billed / 3600.0;
    let vm_cost = vm_hours * p.vm_hourly_usd;
    let gb_s = (e.mb_ms as f64) / 1024.0 / 1000.0;
    let fn_cost = gb_s * p.pricing.gb_second_usd
        + e.stats.function_served as f64
            * (p.pricing.request_usd + p.pricing.api_gateway_request_usd);
    let usage = e
        .core
        .placement()
        .usage(ZoneId(0))
        .copied()
        .unwrap_or_default();
    e.stats.vm_billed_seconds = billed;
    e.stats.warm_starts = usage.warm_starts;
    e.stats.function_startup_s = usage.startup.as_secs_f64();
    e.stats.function_busy_s = usage.busy.as_secs_f64();
    e.stats.function_idle_s = usage.idle.as_secs_f64();
    e.stats.end_s = end_ns as f64 / NS as f64;
    let q = |x: f64| {
        if e.served == 0 {
            0.0
        } else {
            round_sig3(e.hist.value_at_quantile(x) as f64 / 1000.0)
        }
    };
    let response_ms = ResponseMs {
        mean: if e.served == 0 {
            0.0
        } else {
            e.sum_response_ns as f64 / e.served as f64 / 1e6
        },
        p50: q(0.50),
        p95: q(0.95),
        p99: q(0.99),
    };
    let report = PolicyReport {
        name: kind.name().to_string(),
        requests: arrived,
        served: e.served,
        throttled: e.throttled,
        sla_violations: e.violations,
        sla_violation_pct: if arrived == 0 {
            0.0
        } else {
            e.violations as f64 * 100.0 / arrived as f64
        },
        cost_usd: CostBreakdown {
            total: vm_cost + fn_cost,
            vm: vm_cost,
            function: fn_cost,
        },
        vm_hours,
        function_gb_seconds: gb_s,
        function_share: if e.served == 0 {
            0.0
        } else {
            e.stats.function_served as f64 / e.served as f64
        },
        cold_starts: e.cold_starts,
        response_ms,
        r_max: e.core.status().r_max.map(|s| RMaxReport {
            start_rps: e.p.r_max_adaptive.as_ref().map_or(0.0, |a| a.start_rps),
            end_rps: s.r_max_rps,
            adjustments: s.adjustments,
            last_error: s.last_evaluated.and_then(|l| l.error),
            last_measured_ms: s
                .last_evaluated
                .and_then(|l| l.measured)
                .map(|d| d.as_secs_f64() * 1000.0),
        }),
    };
    PolicyRun {
        report,
        stats: e.stats,
        series: e.series.unwrap_or_default(),
    }
}

/// Round to 3 significant digits: the response-time histogram's precision.
fn round_sig3(x: f64) -> f64 {
    if x <= 0.0 || !x.is_finite() {
        return 0.0;
    }
    format!("{x:.2e}").parse().unwrap_or(x)
}
