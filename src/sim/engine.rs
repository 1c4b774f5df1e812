//! The discrete-event engine: one policy over one trace on a virtual clock.
//!
//! Time is integer nanoseconds since the trace window's start. Three sources of events
//! are merged in time order, jumping from one event to the next (no tick loop):
//! 1. the trace's arrival stream (already time-ordered);
//! 2. a queue of scheduled events — VM request completions, function call
//!    completions, VM readiness — ordered by `(time, sequence number)`, so ties resolve in
//!    scheduling order and runs are deterministic (`EventQueue`: a few sorted runs and a
//!    binary heap, since most events are scheduled in time order);
//! 3. epoch ends (the policy core's [`Controller::poll_timeout`](crate::policy::controller::Controller::poll_timeout)), closed before any
//!    event at or after them.
//!
//! At equal times: epoch ends first, then scheduled events, then arrivals (a request
//! finishing at `t` frees its slot for one arriving at `t`).
//!
//! Every decision is the policy core's: [`Controller`](crate::policy::controller::Controller) (traffic monitor, scaling policy,
//! routing policy, VM table — LIBRA §III) and [`FunctionPool`](crate::policy::functions::FunctionPool) (FaaSim §3). The engine
//! only models the physics:
//! * **VM** (LIBRA §IV's simulator): `slots` parallel slots and one FIFO queue. A request
//!   starts at `max(arrival, earliest free slot)` — exact for a FIFO multi-server queue —
//!   and responds after queue wait + service time. A launched VM is ready after
//!   `boot_seconds`; the policy's initial pool is booted before t = 0.
//! * **Function** (FaaSim §3): response = cold or warm start + service time; over
//!   `max_instances` live instances a call is throttled (counted, not served).
//!   Billed per call: service time rounded up to 1 ms × memory (GB-s), plus the cold
//!   start as INIT when `bill_init`, plus the request fee (and the API-gateway fee when
//!   `pricing.api_gateway`).
//! * **Function zones** (FaaSim two-tier edge/cloud, with `function_zones`): the zone of
//!   an `events` line is the call's origin edge zone; the core's placement picks the
//!   zone. Start-up and execution times are the same in every zone; `sim.network` adds
//!   the round trip to the origin edge or the cloud to the client-side time only.
//! * **SLA**: a served response slower than `sla_ms` is a violation; a throttled or
//!   rejected request is one too (it got no answer in time).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::time::Duration;

use hdrhistogram::Histogram;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::error::SimError;
use super::model::{ServiceModel, vm_billed_seconds};
use super::report::{
    CostBreakdown, EpochRow, FunctionSpread, InstanceReport, PolicyReport, QueueReport, RMaxReport,
    ResponseMs, ResponseStats, SeriesBuffer, Spread, ZoneReport,
};
use super::trace::Trace;
use crate::config::Config;
use crate::config::sim::{FunctionModelConfig, NetworkModelConfig, VmModelConfig};
use crate::policy::attempt::{AttemptKind, Decision, Ticket};
use crate::policy::balancer::{RequestMeta, RouteReason, VmFirst};
pub use crate::policy::baselines::PolicyKind;
use crate::policy::baselines::{AutoParams, PolicyParams};
use crate::policy::controller::{self, ControllerParams};
use crate::policy::core::{Action, Core, CoreParams};
use crate::policy::cost::FunctionPricing;
use crate::policy::delay::{CallId, DelayParams};
use crate::policy::functions::{FunctionPoolParams, FunctionUsage, InstanceId};
use crate::policy::placement::{
    Lease, PlacementParams, Start, ZoneCapacity, ZoneId, ZoneKind, ZoneStatus,
};
use crate::policy::rmax::RMaxParams;
use crate::policy::routes::KeyId;
use crate::policy::scaling::{LibraScalingParams, ScaleDecision};
use crate::policy::sched::{QueueId, SchedParams};
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
    /// The gateway queue (`queue:`, call scheduling §4): calls finding no VM slot
    /// (`libra.max_outstanding_per_vm`, = `sim.vm.slots` for one call per core) and no
    /// function capacity wait, in this order, instead of being throttled.
    pub queue: Option<SchedParams>,
    /// `queue.max_route_keys`.
    pub max_route_keys: usize,
    /// Function zones and placement (`function_zones`, `placement`; FaaSim two-tier
    /// edge/cloud) when the configuration has zones; `None`: one cloud zone with the
    /// function model's keep-alive, pre-warm and cap.
    pub placement: Option<PlacementParams>,
    /// Zone `z` of an `events` trace is edge zone `edge_zones[z]` (the edge zones of
    /// `function_zones` in order); a trace zone without an edge zone has no origin and
    /// goes to the cloud.
    pub edge_zones: Vec<ZoneId>,
    /// FaaSim's network model (`sim.network`): client-side round trips.
    pub network: Option<NetworkModelConfig>,
    /// MAX's fixed fleet (`sim.max_fixed_vms`); `None`: sized for the trace's peak.
    pub max_fixed_vms: Option<u32>,
    /// Close idle stretches of epochs at once ([`Core::close_idle_epochs`]):
    /// `true` from [`SimParams::from_config`]. The results are those of closing every
    /// epoch one by one; `false` does that (tests compare the two).
    pub skip_idle: bool,
    /// `sim.replicas` with more than one replica (run by `super::replicas`); `None`:
    /// one gateway.
    pub replicas: Option<ReplicaParams>,
}

/// `sim.replicas`, resolved: several gateway replicas sharing one decision.
#[derive(Clone, Debug, PartialEq)]
pub struct ReplicaParams {
    /// Replicas, at least 2.
    pub count: usize,
    /// Each replica's weight of the arrivals (positive), one per replica.
    pub weights: Vec<f64>,
    /// How much later the shared inputs arrive than with an instant store, ns.
    pub store_delay_ns: u64,
    /// Windows `[from, to)` of trace time without the store, ns, in order.
    pub outages: Vec<(u64, u64)>,
    /// Epochs of missed exchanges before a replica runs on local decisions
    /// (`coordination.grace_epochs`, or its default without a `redis` coordination).
    pub grace_epochs: u32,
    /// The leader's lease (`coordination.lease_ms`, or its default), ns.
    pub lease_ns: u64,
    /// K (`libra.decision_epochs`): a new leader without state holds scale-in this long.
    pub decision_epochs: u32,
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
        if s.replicas.as_ref().is_some_and(|r| r.count.get() > 1)
            && (!c.function_zones.is_empty() || c.queue_params().is_some())
        {
            return Err(SimError::Invalid {
                field: "sim.replicas".into(),
                message: "several replicas are not modelled with function_zones or queue \
                          (one gateway's model only)"
                    .into(),
            });
        }
        let epoch = c.libra.epoch_seconds.get();
        let mut controller = c.controller_params();
        controller.execute_scaling = true;
        Ok(Self {
            controller,
            libra: c.libra_scaling_params(),
            balancer: c.libra_balancer(),
            auto: AutoParams {
                scale_out_utilisation: s.auto.scale_out_utilisation,
                scale_in_utilisation: s.auto.scale_in_utilisation,
                window_epochs: (s.auto.window_seconds.get().div_duration_f64(epoch).round() as u32)
                    .max(1),
                step_vms: s.auto.step_vms.get(),
                grace: s.auto.grace_seconds.get(),
                min_vms: s.auto.min_vms.get(),
                max_vms: s.auto.max_vms,
                r_max_rps: c.libra.r_max_rps,
            },
            vm: s.vm.clone(),
            function: s.function.clone(),
            service,
            memory_mb: s.request.memory_mb.unwrap_or(c.pricing.function_memory_mb),
            sla_ns: ns(s.sla_ms.get()),
            pricing: c.pricing.function_pricing(),
            vm_hourly_usd: c.pricing.vm_hourly_usd,
            r_max_adaptive: c.r_max_adaptive_params(),
            queue: c.queue_params(),
            max_route_keys: c.max_route_keys(),
            placement: (!c.function_zones.is_empty()).then(|| c.placement_params()),
            edge_zones: c
                .zone_specs()
                .iter()
                .enumerate()
                .filter(|(_, z)| z.kind == ZoneKind::Edge)
                .map(|(i, _)| ZoneId(i as u16))
                .collect(),
            network: s.network.clone(),
            max_fixed_vms: s.max_fixed_vms.map(std::num::NonZeroU32::get),
            skip_idle: true,
            replicas: s.replicas.as_ref().filter(|r| r.count.get() > 1).map(|r| {
                let count = r.count.get() as usize;
                let redis = c.coordination.redis();
                ReplicaParams {
                    count,
                    weights: if r.split.is_empty() {
                        vec![1.0; count]
                    } else {
                        r.split.clone()
                    },
                    store_delay_ns: ns(r.store_delay_ms.get()),
                    outages: r
                        .outages
                        .iter()
                        .map(|o| (ns(o.from_seconds.get()), ns(o.to_seconds.get())))
                        .collect(),
                    grace_epochs: redis
                        .map_or(crate::config::coordination::DEFAULT_GRACE_EPOCHS, |r| {
                            r.grace_epochs
                        }),
                    lease_ns: redis.map_or(crate::config::coordination::DEFAULT_LEASE_MS, |r| {
                        r.lease_ms
                    }) * 1_000_000,
                    decision_epochs: c.libra.decision_epochs.get(),
                }
            }),
        })
    }

    /// MAX's pool for `trace`: `sim.max_fixed_vms` when set, else `ceil(peak / r_max)`
    /// VMs.
    pub fn max_vms_for(&self, trace: &Trace) -> u32 {
        self.max_fixed_vms
            .unwrap_or_else(|| (trace.peak_rps() / self.libra.r_max_rps).ceil().max(0.0) as u32)
    }

    /// The policy parameters [`PolicyKind::build`] needs for `trace`.
    pub fn policy_params(&self, trace: &Trace) -> PolicyParams {
        PolicyParams {
            libra: self.libra.clone(),
            balancer: self.balancer.clone(),
            auto: self.auto.clone(),
            max_vms: self.max_vms_for(trace),
            slots_per_vm: self.vm.slots.get(),
        }
    }

    /// The core's parameters: the controller (always executing scaling), one cloud
    /// function zone with the function model's keep-alive, pre-warm and concurrency cap,
    /// no VM boot deadline (modelled VMs always boot).
    pub fn core_params(&self) -> CoreParams {
        let f = &self.function;
        let single = || {
            PlacementParams::single(
                crate::config::SINGLE_ZONE_NAME,
                ZoneCapacity::Instances(FunctionPoolParams {
                    keep_alive: f.keep_alive_seconds.get(),
                    max_instances: Some(f.max_instances),
                    prewarmed: f.prewarmed_instances,
                    warm_order: f.warm_instance_order,
                }),
            )
        };
        CoreParams {
            controller: self.controller.clone(),
            placement: self.placement.clone().unwrap_or_else(single),
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
    /// Epochs closed in bulk while the trace was idle ([`SimParams::skip_idle`]).
    pub epochs_skipped: u64,
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
    /// A cold-started (or pre-warmed) function instance is ready: zone, instance.
    InstanceReady(u16, u32),
    /// An expired function instance finished shutting down: zone, instance.
    InstanceStopped(u16, u32),
}

/// A scheduled event: time (ns), sequence number, what happens.
type Event = (u64, u64, EvKind);

/// Sorted runs an [`EventQueue`] keeps before it falls back to its heap.
const RUNS: usize = 4;

/// The scheduled events, popped in `(time, sequence)` order. Most events are scheduled in
/// time order (a fixed service time after the clock, which only moves forward), so an
/// event goes to the first of a few sorted runs (deques) whose last event is not later —
/// O(1) — and only an event earlier than every run's last one goes to a binary heap. The
/// next event is the least of the runs' fronts and the heap's top: the same order a single
/// heap gives, so results do not depend on where an event was kept.
/// The location of the next event is cached between a peek and the pop (and across
/// pushes of later events).
#[derive(Default)]
struct EventQueue {
    runs: [VecDeque<Event>; RUNS],
    heap: BinaryHeap<Reverse<Event>>,
    /// [`Self::next_source`]'s answer with the next event's sequence number, while valid.
    next: Option<Option<(usize, u64, u64)>>,
}

impl EventQueue {
    #[inline]
    fn push(&mut self, ev: Event) {
        // An event no earlier than the cached next one leaves it next.
        if let Some(next) = self.next
            && next.is_none_or(|(_, t, seq)| (ev.0, ev.1) < (t, seq))
        {
            self.next = None;
        }
        for run in &mut self.runs {
            if run.back().is_none_or(|b| (b.0, b.1) <= (ev.0, ev.1)) {
                run.push_back(ev);
                return;
            }
        }
        self.heap.push(Reverse(ev));
    }

    /// Where the next event is: a run (`0..RUNS`) or the heap (`RUNS`), its time and
    /// sequence number.
    #[inline]
    fn next_source(&mut self) -> Option<(usize, u64, u64)> {
        if let Some(next) = self.next {
            return next;
        }
        let mut best: Option<(usize, (u64, u64))> = None;
        for (i, run) in self.runs.iter().enumerate() {
            if let Some(f) = run.front()
                && best.is_none_or(|(_, b)| (f.0, f.1) < b)
            {
                best = Some((i, (f.0, f.1)));
            }
        }
        if let Some(Reverse(top)) = self.heap.peek()
            && best.is_none_or(|(_, b)| (top.0, top.1) < b)
        {
            best = Some((RUNS, (top.0, top.1)));
        }
        let next = best.map(|(i, (t, seq))| (i, t, seq));
        self.next = Some(next);
        next
    }

    /// The time of the next event.
    #[inline]
    fn peek_time(&mut self) -> Option<u64> {
        self.next_source().map(|(_, t, _)| t)
    }

    #[inline]
    fn pop(&mut self) -> Option<Event> {
        let (i, _, _) = self.next_source()?;
        self.next = None;
        if i == RUNS {
            self.heap.pop().map(|Reverse(ev)| ev)
        } else {
            self.runs[i].pop_front()
        }
    }
}

struct VmSim {
    /// A VM of another replica's pool, taken from the registry (`sim.replicas`): served
    /// here, billed there.
    adopted: bool,
    launch_ns: u64,
    ready_ns: Option<u64>,
    stop_ns: Option<u64>,
    /// Time each slot becomes free, ascending: a request takes the front (the earliest
    /// free slot) and its end goes back in order — at the back in O(1) when service times
    /// are equal (ends then come in order), else by a short scan (`slots` is small).
    slots: VecDeque<u64>,
}

impl VmSim {
    /// Take the earliest free slot for a request arriving (or dequeued) at `now` that
    /// runs `service_ns`: its `(start, end)`, ns.
    #[inline]
    fn take_slot(&mut self, now: u64, service_ns: u64) -> (u64, u64) {
        let free = self.slots.pop_front().expect("a VM has at least one slot");
        let start = free.max(now);
        let end = start + service_ns;
        if self.slots.back().is_none_or(|&b| b <= end) {
            self.slots.push_back(end);
        } else {
            let i = self.slots.partition_point(|&x| x <= end);
            self.slots.insert(i, end);
        }
        (start, end)
    }
}

const NS: u64 = 1_000_000_000;

/// The instance of a call in a concurrency-only zone (`http` in `function_zones`): the
/// model treats it as a warm start.
const UNTRACKED: u32 = u32::MAX;

fn dur(ns: u64) -> Time {
    Duration::from_nanos(ns)
}

pub(super) struct Engine<'a> {
    p: &'a SimParams,
    /// The last scaling decision the core took or applied: `(epoch, decision)` (what a
    /// leader of `sim.replicas` publishes).
    last_decision: Option<(u64, ScaleDecision)>,
    /// How long a stopped VM stays billed after its stop (the leader of `sim.replicas`
    /// keeps a scaled-in VM for the followers' requests), ns; 0 for one gateway.
    stop_handoff_ns: u64,
    core: Core,
    heap: EventQueue,
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
    /// Measure VM utilisation per epoch (AUTO and Spock need it; the series shows it).
    measure_util: bool,
    /// Pass it to the scaling policy (AUTO, Spock).
    feed_util: bool,
    /// Report VM response times to the core (adaptive r_max).
    measure_latency: bool,
    trace_end_ns: u64,
    stats: RunStats,
    // Accounting.
    served: u64,
    throttled: u64,
    violations: u64,
    delayed: u64,
    /// SLA violations and delayed requests of the open epoch (for the series).
    epoch_violations: u64,
    epoch_delayed: u64,
    sum_response_ns: u128,
    hist: RunHist,
    cold_starts: u64,
    /// Σ memory_mb · billed_ms over function calls.
    mb_ms: u128,
    last_done_ns: u64,
    series: Option<SeriesBuffer>,
    last_routed_fn: u64,
    /// Call scheduling (with `queue:`): waiting calls, route key per request class, the
    /// calls in service (by event sequence number) and per-key measures.
    calls: Option<Calls>,
    /// Client-side response times (platform + network), µs, and the extremes of both,
    /// ns: (platform min, platform max, client min, client max, Σ client).
    client_hist: RunHist,
    extremes: (u64, u64, u64, u64, u128),
    /// Function zones are configured: the client side and the extremes are reported.
    zoned: bool,
    rtt_rng: ChaCha8Rng,
    /// Draws of the start-up and execution jitter (`sim.function.*_jitter`).
    jitter_rng: ChaCha8Rng,
    /// Ready time (ns) of each pre-warmed instance still booting: zone, instance.
    prewarm_ready: HashMap<(u16, u32), u64>,
    /// Warm and cold start, ns, when they have no jitter (computed once, not per call).
    fixed_starts: (Option<u64>, Option<u64>),
}

/// A call in the simulation's gateway queue or in service.
#[derive(Clone, Copy, Debug)]
struct SimCall {
    arrival: u64,
    service_ns: u64,
    memory_mb: u32,
    key: KeyId,
    /// The client's edge zone (function zones), if any.
    origin: Option<ZoneId>,
}

/// Per-run call-scheduling state of the engine.
struct Calls {
    class_key: Vec<KeyId>,
    waiting: HashMap<QueueId, SimCall>,
    /// Running calls by the sequence number of their completion event.
    running: HashMap<u64, SimCall>,
    timed_out: u64,
    /// Response time (µs) and stretch (× 1000) per key, and over all keys.
    response: Vec<Histogram<u64>>,
    stretch: Vec<Histogram<u64>>,
    all_response: Histogram<u64>,
    all_stretch: Histogram<u64>,
}

impl Calls {
    fn record(&mut self, key: KeyId, response_ns: u64, service_ns: u64) {
        let i = key.0 as usize;
        while self.response.len() <= i {
            self.response.push(hist());
            self.stretch.push(hist());
        }
        let s = (response_ns as f64 / service_ns.max(1) as f64 * 1000.0).round() as u64;
        for (r, st) in [
            (&mut self.response[i], &mut self.stretch[i]),
            (&mut self.all_response, &mut self.all_stretch),
        ] {
            r.saturating_record(response_ns / 1000);
            st.saturating_record(s);
        }
    }
}

/// A response-time histogram that records runs of equal values at once (a fixed service
/// time gives millions of equal responses; one `record_n` per run instead of one
/// `record` per response). Read `hist` after [`RunHist::flush`].
struct RunHist {
    hist: Histogram<u64>,
    value: u64,
    count: u64,
}

impl RunHist {
    fn new() -> Self {
        Self {
            hist: hist(),
            value: 0,
            count: 0,
        }
    }

    #[inline]
    fn record(&mut self, value: u64) {
        if value != self.value {
            self.flush();
            self.value = value;
        }
        self.count += 1;
    }

    fn flush(&mut self) {
        if self.count > 0 {
            self.hist.saturating_record_n(self.value, self.count);
            self.count = 0;
        }
    }
}

fn hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 100_000_000_000, 3).expect("valid bounds")
}

impl<'a> Engine<'a> {
    /// A function call placed in `zone` for a client of edge zone `origin`: the network
    /// round trip of `sim.network`, ns (0 without one).
    fn rtt_ns(&mut self, zone: ZoneId, origin: Option<ZoneId>) -> u64 {
        use rand::Rng as _;
        let Some(n) = &self.p.network else {
            return 0;
        };
        let (rtt, jitter) = if Some(zone) == origin {
            (n.edge_rtt_ms.get(), n.edge_rtt_jitter)
        } else {
            (n.cloud_rtt_ms.get(), n.cloud_rtt_jitter)
        };
        let f = if jitter > 0.0 {
            1.0 + self.rtt_rng.random_range(-jitter..=jitter)
        } else {
            1.0
        };
        (ms(rtt) * f * 1e6).round().max(0.0) as u64
    }

    /// A served response: platform time `done - arrival`, client time plus `rtt` (kept
    /// only with function zones: the report shows the client side only then).
    #[inline]
    fn respond_client(&mut self, arrival: u64, start: u64, done: u64, rtt: u64) {
        if self.zoned {
            let r = done - arrival;
            let c = r + rtt;
            let x = &mut self.extremes;
            x.0 = x.0.min(r);
            x.1 = x.1.max(r);
            x.2 = x.2.min(c);
            x.3 = x.3.max(c);
            x.4 += u128::from(c);
            self.client_hist.record(c / 1000);
        }
        self.respond(arrival, start, done);
    }
    fn schedule(&mut self, t: u64, kind: EvKind) -> u64 {
        self.seq += 1;
        self.heap.push((t, self.seq, kind));
        self.seq
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
                        adopted: false,
                        launch_ns: now,
                        ready_ns: None,
                        stop_ns: None,
                        slots: (0..self.p.vm.slots.get()).map(|_| 0).collect(),
                    });
                    self.stats.vms_launched += 1;
                    self.alive_vms += 1;
                    self.stats.peak_vms = self.stats.peak_vms.max(self.alive_vms);
                    if initial {
                        // The initial pool is booted before t = 0.
                        self.vm_ready(now, i as u32);
                    } else {
                        let boot = ns(self.p.vm.boot_seconds.get());
                        self.schedule(now + boot, EvKind::VmReady(i as u32));
                    }
                }
                Action::Scaling(controller::Action::Stop { vm }) => {
                    let v = &mut self.vms[vm.0 as usize];
                    if v.stop_ns.is_none() {
                        v.stop_ns = Some(now);
                        v.slots = VecDeque::new();
                        self.alive_vms -= 1;
                        if v.ready_ns.is_some() {
                            self.integrate_cap(now);
                            self.cap_vms -= 1;
                        }
                    }
                }
                // Pre-warmed instances are ready at once, or after `prewarm_boot_ms`
                // (a call may claim one meanwhile and wait for it).
                Action::StartInstance { zone, instance } => {
                    let boot = ns(self.p.function.prewarm_boot_ms.get());
                    if boot == 0 {
                        self.core.on_instance_started(dur(now), zone, instance);
                    } else {
                        let id = instance.0 as u32;
                        self.prewarm_ready.insert((zone.0, id), now + boot);
                        self.schedule(now + boot, EvKind::InstanceReady(zone.0, id));
                    }
                }
                // An expired instance stops after `shutdown_ms` (its shutdown time).
                Action::StopInstance { zone, instance } => {
                    let stop = ns(self.p.function.shutdown_ms.get());
                    if stop == 0 {
                        self.core.on_instance_stopped(dur(now), zone, instance);
                    } else {
                        self.schedule(
                            now + stop,
                            EvKind::InstanceStopped(zone.0, instance.0 as u32),
                        );
                    }
                }
                Action::Scaling(controller::Action::Decided {
                    epoch, decision, ..
                }) => self.last_decision = Some((epoch, decision)),
                Action::Scaling(controller::Action::Drain { .. })
                | Action::VmBootTimedOut { .. } => {}
                Action::Dequeued { id, decision } => {
                    let call = self
                        .calls
                        .as_mut()
                        .and_then(|c| c.waiting.remove(&id))
                        .expect("a served call waited");
                    self.start(now, call, decision);
                }
                Action::QueueTimedOut { id } => {
                    if let Some(c) = self.calls.as_mut() {
                        c.waiting.remove(&id);
                        c.timed_out += 1;
                    }
                    self.throttled += 1;
                    self.violations += 1;
                    self.epoch_violations += 1;
                }
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
        let mut utilisation = None;
        if self.measure_util {
            self.integrate_cap(end);
            let busy = self.busy.pop_front().unwrap_or(0.0);
            let cap = self.cap_integral * f64::from(self.p.vm.slots.get());
            let u = if cap > 0.0 {
                busy / cap
            } else if busy > 0.0 {
                1.0
            } else {
                0.0
            };
            if self.feed_util {
                self.core.set_vm_utilisation(u);
            }
            utilisation = (cap > 0.0).then_some(u);
            self.cap_integral = 0.0;
        }
        self.core.handle_timeout(dur(end));
        self.open_epoch += 1;
        let (violations, delayed) = (
            std::mem::take(&mut self.epoch_violations),
            std::mem::take(&mut self.epoch_delayed),
        );
        self.drain_actions(end, false);
        let cost_usd = if self.series.is_some() {
            self.cost_so_far(end)
        } else {
            0.0
        };
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
                violations,
                delayed,
                vm_utilisation: utilisation,
                cost_usd,
            });
            self.last_routed_fn = st.routed.function;
        }
    }

    /// VM and function cost billed up to `now` (ns), USD: VMs as if stopped at `now`
    /// (still running ones included), function calls started so far.
    fn cost_so_far(&self, now: u64) -> f64 {
        let p = self.p;
        let vm_s: f64 = self
            .vms
            .iter()
            .filter(|v| !v.adopted)
            .map(|v| {
                vm_billed_seconds(
                    &p.vm,
                    v.launch_ns as f64 / 1e9,
                    v.ready_ns.map(|r| r as f64 / 1e9),
                    v.stop_ns.unwrap_or(now).min(now) as f64 / 1e9,
                )
            })
            .sum();
        vm_s / 3600.0 * p.vm_hourly_usd
            + (self.mb_ms as f64) / 1024.0 / 1000.0 * p.pricing.gb_second_usd
            + self.stats.function_served as f64
                * (p.pricing.request_usd + p.pricing.api_gateway_request_usd)
    }

    fn add_busy(&mut self, start: u64, end: u64) {
        let e = self.epoch_ns;
        // `x / e` without a division for the open epoch and the next (a request starts
        // in the open epoch and, with service times up to an epoch, ends by the next).
        let open = self.open_epoch * e;
        let epoch_of = |x: u64| match x.checked_sub(open) {
            Some(d) if d < e => self.open_epoch,
            Some(d) if d - e < e => self.open_epoch + 1,
            _ => x / e,
        };
        let mut idx = epoch_of(start);
        let last = epoch_of(end.saturating_sub(1));
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

    /// A request that arrived at `arrival` got its VM slot or function instance at
    /// `start` and responds at `done` (ns).
    #[inline]
    fn respond(&mut self, arrival: u64, start: u64, done: u64) {
        let r = done - arrival;
        self.served += 1;
        self.sum_response_ns += u128::from(r);
        if r > self.p.sla_ns {
            self.violations += 1;
            self.epoch_violations += 1;
        }
        if start / NS > arrival / NS {
            self.delayed += 1;
            self.epoch_delayed += 1;
        }
        self.hist.record(r / 1000);
    }

    fn handle(&mut self, t: u64, seq: u64, kind: EvKind) {
        // A call completes: its processing time feeds E[p] (call scheduling §4).
        if let Some(c) = self.calls.as_mut()
            && let Some(call) = c.running.remove(&seq)
        {
            self.core.on_call_completed(
                call.key,
                dur(call.service_ns),
                dur(t.saturating_sub(call.arrival)),
            );
        }
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
                let start = if id == UNTRACKED {
                    Start::Untracked
                } else {
                    Start::Warm(InstanceId(u64::from(id)))
                };
                let lease = Lease {
                    zone: ZoneId(zone),
                    start,
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
                self.prewarm_ready.remove(&(zone, id));
                self.core
                    .on_instance_started(dur(t), ZoneId(zone), InstanceId(u64::from(id)));
                self.drain_actions(t, false);
            }
            EvKind::InstanceStopped(zone, id) => {
                self.core
                    .on_instance_stopped(dur(t), ZoneId(zone), InstanceId(u64::from(id)));
                self.drain_actions(t, false);
            }
        }
    }

    #[inline]
    fn arrive(&mut self, t: u64, service_ns: u64, memory_mb: u32, class: u32, zone: u32) {
        let origin = self.p.edge_zones.get(zone as usize).copied();
        let mut ticket = Ticket::new(RequestMeta::default(), origin);
        let key = self.calls.as_ref().map(|c| {
            c.class_key
                .get(class as usize)
                .copied()
                .unwrap_or(crate::policy::routes::RouteKeys::OTHER)
        });
        if let Some(k) = key {
            ticket = ticket.with_key(k);
        }
        let call = SimCall {
            arrival: t,
            service_ns,
            memory_mb,
            key: key.unwrap_or(crate::policy::routes::RouteKeys::OTHER),
            origin,
        };
        let decision = self.core.route(dur(t), &mut ticket);
        match decision {
            Decision::Vm { .. } | Decision::Function { .. } => self.start(t, call, decision),
            Decision::Queue { .. } => {
                let id = ticket.queued().expect("a queued ticket has an id");
                if let Some(c) = self.calls.as_mut() {
                    c.waiting.insert(id, call);
                }
            }
            Decision::Reject { reason } => {
                self.throttled += 1;
                self.violations += 1;
                self.epoch_violations += 1;
                if reason != RouteReason::SpillBackRejected {
                    self.stats.rejected += 1;
                }
            }
        }
    }

    /// The warm start of one call, ns ([`Self::jittered_ns`] of the function model's).
    #[inline]
    fn warm_start_ns(&mut self) -> u64 {
        match self.fixed_starts.0 {
            Some(ns) => ns,
            None => {
                let f = &self.p.function;
                self.jittered_ns(ms(f.warm_start_ms.get()), f.warm_start_jitter)
            }
        }
    }

    /// The cold start of one call, ns ([`Self::jittered_ns`] of the function model's).
    #[inline]
    fn cold_start_ns(&mut self) -> u64 {
        match self.fixed_starts.1 {
            Some(ns) => ns,
            None => {
                let f = &self.p.function;
                self.jittered_ns(ms(f.cold_start_ms.get()), f.cold_start_jitter)
            }
        }
    }

    /// `ms` with a uniform jitter of ± `jitter` × `ms` (FaaSim's variances), in ns. No
    /// draw without jitter, so runs without it keep their random streams.
    fn jittered_ns(&mut self, ms: f64, jitter: f64) -> u64 {
        use rand::Rng as _;
        let f = if jitter > 0.0 {
            1.0 + self.jitter_rng.random_range(-jitter..=jitter)
        } else {
            1.0
        };
        (ms * f * 1e6).round().max(0.0) as u64
    }

    /// Start `call` at `now` (its arrival, or when it leaves the queue) as `decision`
    /// says: on a VM slot, or on a function instance.
    fn start(&mut self, now: u64, call: SimCall, decision: Decision) {
        let SimCall {
            arrival: t,
            service_ns,
            memory_mb,
            ..
        } = call;
        let (end, seq, rtt, start) = match decision {
            Decision::Vm { vm, kind, .. } => {
                if kind == AttemptKind::FallBack {
                    self.stats.fell_back += 1;
                }
                let (start, end) = self.vms[vm.0 as usize].take_slot(now, service_ns);
                if self.measure_util {
                    self.add_busy(start, end);
                }
                let latency_us = u32::try_from((end - t) / 1000).unwrap_or(u32::MAX);
                let seq = self.schedule(end, EvKind::VmDone(vm.0 as u32, latency_us));
                (end, seq, 0, start)
            }
            Decision::Function { lease, .. } => {
                let zone = lease.zone.0;
                let service_ns = if self.p.function.exec_jitter > 0.0 {
                    self.jittered_ns(service_ns as f64 / 1e6, self.p.function.exec_jitter)
                } else {
                    service_ns
                };
                let (id, start) = match lease.start {
                    Start::Warm(id) => (id, now + self.warm_start_ns()),
                    Start::Booting(id) => {
                        // A booting pre-warmed instance: the call waits for its boot, then
                        // pays a warm start (FaaSim: max(ready, arrival) + warm + exec).
                        let ready = self
                            .prewarm_ready
                            .get(&(zone, id.0 as u32))
                            .copied()
                            .unwrap_or(now);
                        (id, ready.max(now) + self.warm_start_ns())
                    }
                    Start::Cold(id) => {
                        let cold = self.cold_start_ns();
                        // Ready after its cold start; busy with this call meanwhile.
                        self.schedule(now + cold, EvKind::InstanceReady(zone, id.0 as u32));
                        self.cold_starts += 1;
                        if self.p.function.bill_init {
                            self.mb_ms +=
                                u128::from(memory_mb) * u128::from(cold.div_ceil(1_000_000));
                        }
                        (id, now + cold)
                    }
                    Start::Untracked => {
                        (InstanceId(u64::from(UNTRACKED)), t + self.warm_start_ns())
                    }
                };
                self.mb_ms += u128::from(memory_mb) * u128::from(service_ns.div_ceil(1_000_000));
                self.stats.function_served += 1;
                let end = start + service_ns;
                let seq = self.schedule(end, EvKind::FnDone(zone, id.0 as u32));
                // A function call is dispatched when it is placed (its start-up is
                // latency, not a queue): delayed only by a wait in the gateway queue.
                (end, seq, self.rtt_ns(lease.zone, call.origin), now)
            }
            Decision::Queue { .. } | Decision::Reject { .. } => {
                unreachable!("only Vm and Function decisions start a call")
            }
        };
        self.respond_client(t, start, end, rtt);
        if let Some(c) = self.calls.as_mut() {
            c.running.insert(seq, call);
            c.record(call.key, end - t, service_ns);
        }
    }

    /// Close the idle epochs from the one ending at `at` up to `t` (the next event) in
    /// bulk when nothing happens in them: no VM busy, no per-epoch series.
    /// `false`: nothing closed, close the epoch at `at` normally.
    fn skip_idle(&mut self, at: u64, t: u64) -> bool {
        let until = t.min(self.trace_end_ns);
        if !self.p.skip_idle
            || self.series.is_some()
            || until < at + self.epoch_ns
            || self.busy.iter().any(|&b| b != 0.0)
        {
            return false;
        }
        // An idle epoch's utilisation is 0 (no busy slot), measured or not.
        let u = self.feed_util.then_some(0.0);
        let Some(end) = self.core.close_idle_epochs(dur(until), u) else {
            return false;
        };
        let end = end.as_nanos() as u64;
        let n = self.core.controller().monitor().current_epoch() - self.open_epoch;
        if self.measure_util {
            self.integrate_cap(end);
            self.cap_integral = 0.0;
            let k = (n as usize).min(self.busy.len());
            self.busy.drain(..k);
        }
        self.open_epoch += n;
        self.epoch_violations = 0;
        self.epoch_delayed = 0;
        self.stats.epochs_skipped += n;
        self.drain_actions(end, false);
        true
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
                if !self.skip_idle(at, t) {
                    self.close_epoch(at);
                }
            } else {
                self.core.handle_timeout(dur(at));
                self.drain_actions(at, false);
            }
        }
    }
}

impl<'a> Engine<'a> {
    /// An engine for one policy (one gateway's core) over `trace`, not started
    /// ([`Self::begin`]). `series_rows` as in [`run_policy_with`].
    pub(super) fn new(
        p: &'a SimParams,
        trace: &Trace,
        kind: PolicyKind,
        seed: u64,
        series_rows: Option<usize>,
    ) -> Self {
        let (scaler, router) = kind.build(&p.policy_params(trace));
        let adaptive = if kind == PolicyKind::Libra {
            p.r_max_adaptive.clone()
        } else {
            None
        };
        let mut core = Core::new(p.core_params(), scaler, router)
            .with_adaptive_r_max(adaptive)
            .with_queue(p.queue.clone(), Vec::new(), p.max_route_keys);
        let calls = p.queue.as_ref().map(|_| Calls {
            class_key: trace
                .classes
                .iter()
                .map(|c| core.key_named(c.name.as_deref().unwrap_or("default")))
                .collect(),
            waiting: HashMap::new(),
            running: HashMap::new(),
            timed_out: 0,
            response: Vec::new(),
            stretch: Vec::new(),
            all_response: hist(),
            all_stretch: hist(),
        });
        let measure_latency = core.adapts_r_max();
        let epoch_ns = p.controller.monitor.epoch.as_nanos() as u64;
        let mut e = Engine {
            last_decision: None,
            stop_handoff_ns: 0,
            p,
            core,
            heap: EventQueue::default(),
            seq: 0,
            vms: Vec::new(),
            alive_vms: 0,
            cap_vms: 0,
            cap_since: 0,
            cap_integral: 0.0,
            busy: VecDeque::new(),
            epoch_ns,
            open_epoch: 0,
            measure_util: kind.uses_utilisation() || series_rows.is_some(),
            feed_util: kind.uses_utilisation(),
            measure_latency,
            trace_end_ns: (trace.duration_s * 1e9).round() as u64,
            stats: RunStats::default(),
            served: 0,
            throttled: 0,
            violations: 0,
            delayed: 0,
            epoch_violations: 0,
            epoch_delayed: 0,
            sum_response_ns: 0,
            // 1 µs to ~28 h, 3 significant digits; longer responses saturate.
            hist: RunHist::new(),
            cold_starts: 0,
            mb_ms: 0,
            last_done_ns: 0,
            series: series_rows.map(SeriesBuffer::new),
            last_routed_fn: 0,
            calls,
            client_hist: RunHist::new(),
            extremes: (u64::MAX, 0, u64::MAX, 0, 0),
            zoned: p.placement.is_some(),
            rtt_rng: {
                let mut r = ChaCha8Rng::seed_from_u64(seed);
                r.set_stream(2);
                r
            },
            jitter_rng: {
                let mut r = ChaCha8Rng::seed_from_u64(seed);
                r.set_stream(3);
                r
            },
            prewarm_ready: HashMap::new(),
            fixed_starts: {
                // What `jittered_ns` gives without jitter (no draw either way).
                let f = &p.function;
                let fixed = |d: Duration, jitter: f64| (jitter <= 0.0).then(|| ns(d));
                (
                    fixed(f.warm_start_ms.get(), f.warm_start_jitter),
                    fixed(f.cold_start_ms.get(), f.cold_start_jitter),
                )
            },
        };
        if p.placement.is_some() {
            e.core.keep_function_history();
        }
        e
    }

    /// Start the core at time zero: the initial pool is booted before it.
    pub(super) fn begin(&mut self) {
        self.core.start(Time::ZERO);
        self.drain_actions(0, true);
    }
}

/// What `sim.replicas` drives an engine with: one engine per replica
/// (`super::replicas`), its core fed the coordinator's inputs between events.
impl<'a> Engine<'a> {
    /// The replica's core, for the coordinator's inputs; call [`Self::act`] after.
    pub(super) fn core_mut(&mut self) -> &mut Core {
        &mut self.core
    }

    /// The replica's core.
    pub(super) fn core(&self) -> &Core {
        &self.core
    }

    /// Execute the actions the core queued at `now` (launch, stop, dequeue, ...).
    pub(super) fn act(&mut self, now: u64) {
        self.drain_actions(now, false);
    }

    /// The last scaling decision the core took or applied: `(epoch, decision)`.
    pub(super) fn last_decision(&self) -> Option<(u64, ScaleDecision)> {
        self.last_decision
    }

    /// Bill every stopped VM `ns` longer (a leader's scale-in handoff).
    pub(super) fn set_stop_handoff(&mut self, ns: u64) {
        self.stop_handoff_ns = ns;
    }

    /// The trace window's end, ns.
    pub(super) fn trace_end_ns(&self) -> u64 {
        self.trace_end_ns
    }

    /// When the last request finished, ns.
    pub(super) fn last_done_ns(&self) -> u64 {
        self.last_done_ns
    }

    /// The time of the next scheduled event, ns.
    pub(super) fn next_event_ns(&mut self) -> Option<u64> {
        self.heap.peek_time()
    }

    /// Fire every policy deadline at or before `t` (ns).
    pub(super) fn fire_timers_to(&mut self, t: u64) {
        self.fire_timers(t);
    }

    /// Handle the next scheduled event.
    pub(super) fn handle_next(&mut self) {
        if let Some((t, seq, kind)) = self.heap.pop() {
            self.handle(t, seq, kind);
        }
    }

    /// A request arrives at `t` (ns) as [`Self::arrive`].
    pub(super) fn arrive_at(
        &mut self,
        t: u64,
        service_ns: u64,
        memory_mb: u32,
        class: u32,
        zone: u32,
    ) {
        self.arrive(t, service_ns, memory_mb, class, zone);
    }

    /// Adopt another replica's ready VM at `now` (ns): served here, not billed here.
    pub(super) fn adopt_vm(&mut self, now: u64) -> VmId {
        let vm = self.core.adopt_ready_vm(dur(now));
        debug_assert_eq!(
            vm.0 as usize,
            self.vms.len(),
            "the controller allocates ids in order"
        );
        self.integrate_cap(now);
        self.vms.push(VmSim {
            adopted: true,
            launch_ns: now,
            ready_ns: Some(now),
            stop_ns: None,
            slots: (0..self.p.vm.slots.get()).map(|_| 0).collect(),
        });
        self.alive_vms += 1;
        self.cap_vms += 1;
        self.drain_actions(now, false);
        vm
    }

    /// Fold another replica's accounting into this one's (requests, responses, SLA,
    /// function usage and the VMs it launched), for one report over the replicas.
    pub(super) fn absorb(&mut self, mut o: Engine<'a>) {
        o.hist.flush();
        o.client_hist.flush();
        self.hist.flush();
        self.client_hist.flush();
        let _ = self.hist.hist.add(&o.hist.hist);
        let _ = self.client_hist.hist.add(&o.client_hist.hist);
        self.served += o.served;
        self.throttled += o.throttled;
        self.violations += o.violations;
        self.delayed += o.delayed;
        self.sum_response_ns += o.sum_response_ns;
        self.cold_starts += o.cold_starts;
        self.mb_ms += o.mb_ms;
        self.last_done_ns = self.last_done_ns.max(o.last_done_ns);
        let x = &mut self.extremes;
        x.0 = x.0.min(o.extremes.0);
        x.1 = x.1.max(o.extremes.1);
        x.2 = x.2.min(o.extremes.2);
        x.3 = x.3.max(o.extremes.3);
        x.4 += o.extremes.4;
        let st = &mut self.stats;
        st.function_served += o.stats.function_served;
        st.rejected += o.stats.rejected;
        st.fell_back += o.stats.fell_back;
        st.vms_launched += o.stats.vms_launched;
        self.vms.extend(o.vms.into_iter().filter(|v| !v.adopted));
    }

    /// The run's result once every replica was absorbed: ends the function instances at
    /// `end_ns` and bills.
    pub(super) fn finish_run(mut self, kind: PolicyKind, arrived: u64, end_ns: u64) -> PolicyRun {
        self.core.finish_functions(dur(end_ns));
        finish(self, kind, arrived, end_ns)
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
    run_policy_with(p, trace, kind, seed, series.then_some(usize::MAX), progress)
}

/// What arrival `a` asks of the system: its service time (ns; the trace's own, else drawn
/// from its class's model, else from the default model, with `service_rng`) and its
/// memory (MB; its class's, else `sim.request.memory_mb`, else
/// `pricing.function_memory_mb`). One gateway and each replica of
/// `sim.replicas` resolve arrivals the same way, so they draw the same service times.
pub(crate) fn demand(
    p: &SimParams,
    trace: &Trace,
    a: &super::trace::Arrival,
    service_rng: &mut ChaCha8Rng,
) -> (u64, u32) {
    let class = trace.classes.get(a.class as usize);
    let service_ns = if a.service_ns > 0 {
        a.service_ns
    } else {
        class
            .and_then(|c| c.service.as_ref())
            .unwrap_or(&p.service)
            .sample(service_rng)
    };
    (
        service_ns,
        class.and_then(|c| c.memory_mb).unwrap_or(p.memory_mb),
    )
}

/// [`run_policy`] recording at most `series_rows` per-epoch rows (`None`: no series);
/// longer runs merge neighbouring epochs ([`SeriesBuffer`]). The same as a [`Run`] run
/// until the end: `Run::new`, [`Run::run_until`]`(u64::MAX)`, [`Run::finish`].
pub fn run_policy_with(
    p: &SimParams,
    trace: &Trace,
    kind: PolicyKind,
    seed: u64,
    series_rows: Option<usize>,
    progress: &mut dyn FnMut(u64),
) -> PolicyRun {
    let mut run = Run::new(p, trace, kind, seed, series_rows);
    run.run_until(u64::MAX, progress);
    run.finish(progress)
}

/// One policy's run over a trace (one gateway), pausable: [`Run::run_until`] replays the
/// trace up to a simulated time and returns; [`Run::partial`] says what the run has
/// billed and violated so far; a later `run_until` resumes where it stopped, and
/// [`Run::finish`] completes the run and gives its report. Pausing changes nothing: the
/// report is the one [`run_policy_with`] gives, byte for byte, wherever the run was
/// paused.
///
/// What [`Run::partial`] gives never decreases as the run advances (cost: VMs billed up
/// to the run's clock, function calls started so far, with the report's arithmetic;
/// violations: a counter), so a partial cost above another run's final cost is proof
/// that this run ends dearer (`spillway tune` stops such runs early). `sim.replicas` with
/// more than one replica is not run by this type
/// ([`super::replicas::run_policy_with`]).
pub struct Run<'a> {
    engine: Engine<'a>,
    kind: PolicyKind,
    trace: &'a Trace,
    service_rng: ChaCha8Rng,
    stream: super::trace::ArrivalStream<'a>,
    next: Option<super::trace::Arrival>,
    arrived: u64,
    /// The time of the last event or deadline handled, ns.
    clock_ns: u64,
    /// Every arrival and scheduled event is handled.
    done: bool,
}

/// What a paused [`Run`] has accrued up to its clock.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Partial {
    /// The run's clock: the time of the last event or deadline handled, s.
    pub time_s: f64,
    /// Cost so far, USD: the VMs billed as if stopped at `time_s` (the ones already
    /// stopped as stopped), the function calls started so far (`vm_usd +
    /// function_usd`). Never more than the final report's `cost_usd.total`.
    pub cost_usd: f64,
    /// The VMs' part of `cost_usd`, USD.
    pub vm_usd: f64,
    /// The function calls' part of `cost_usd`, USD.
    pub function_usd: f64,
    /// SLA violations so far (never more than the final report's).
    pub sla_violations: u64,
    /// Arrivals so far.
    pub requests: u64,
    /// Requests served so far (VMs and functions).
    pub served: u64,
    /// Requests served by functions so far.
    pub function_served: u64,
}

impl<'a> Run<'a> {
    /// A run of `kind` over `trace` with `seed`, started at time zero (the initial pool
    /// booted) and paused before the first event. `series_rows` as in
    /// [`run_policy_with`].
    pub fn new(
        p: &'a SimParams,
        trace: &'a Trace,
        kind: PolicyKind,
        seed: u64,
        series_rows: Option<usize>,
    ) -> Self {
        let mut engine = Engine::new(p, trace, kind, seed, series_rows);
        engine.begin();
        // Service times and per-minute arrivals draw from two streams of one seeded ChaCha.
        let service_rng = ChaCha8Rng::seed_from_u64(seed);
        let mut arrival_rng = ChaCha8Rng::seed_from_u64(seed);
        arrival_rng.set_stream(1);
        let mut stream = trace.stream(arrival_rng);
        let next = stream.next_arrival();
        Self {
            engine,
            kind,
            trace,
            service_rng,
            stream,
            next,
            arrived: 0,
            clock_ns: 0,
            done: false,
        }
    }

    /// Handle every arrival, scheduled event and deadline up to `until_ns` (ns since the
    /// trace window's start, inclusive; `u64::MAX`: to the end). `progress` is called
    /// with the arrivals so far every 2¹⁶ arrivals. Returns `true` once nothing is left
    /// to handle (then only [`Self::finish`] remains).
    pub fn run_until(&mut self, until_ns: u64, progress: &mut dyn FnMut(u64)) -> bool {
        if self.done {
            return true;
        }
        // The loop works on locals (as the uninterrupted loop did) and stores them back
        // when it pauses: fields behind `&mut self` cost the per-request path ~8 %.
        let Run {
            engine,
            trace,
            service_rng,
            stream,
            ..
        } = self;
        let e = engine;
        let p = e.p;
        let trace: &Trace = trace;
        let mut next = self.next.take();
        let mut arrived = self.arrived;
        let mut clock = self.clock_ns;
        let mut done = false;
        loop {
            let heap_t = e.heap.peek_time();
            let t = match (heap_t, next.as_ref()) {
                (None, None) => {
                    done = true;
                    break;
                }
                (Some(h), None) => h,
                (None, Some(a)) => a.at_ns,
                (Some(h), Some(a)) => h.min(a.at_ns),
            };
            if t > until_ns {
                break;
            }
            clock = t;
            // At equal times: deadlines (epoch ends first), then scheduled events, then
            // arrivals.
            e.fire_timers(t);
            if heap_t == Some(t) {
                let Some((t, seq, kind)) = e.heap.pop() else {
                    unreachable!()
                };
                e.handle(t, seq, kind);
                continue;
            }
            let a = next.take().expect("an arrival is next");
            let (service_ns, memory_mb) = demand(p, trace, &a, service_rng);
            e.arrive(a.at_ns, service_ns, memory_mb, a.class, a.zone);
            arrived += 1;
            if arrived & 0xFFFF == 0 {
                progress(arrived);
            }
            next = stream.next_arrival();
        }
        self.next = next;
        self.arrived = arrived;
        self.clock_ns = clock;
        self.done = done;
        done
    }

    /// The run's clock: the time of the last event or deadline handled, ns.
    pub fn clock_ns(&self) -> u64 {
        self.clock_ns
    }

    /// The trace window's end, ns (a run's events may go on after it until the last
    /// request finishes).
    pub fn trace_end_ns(&self) -> u64 {
        self.engine.trace_end_ns
    }

    /// What the run has billed and violated up to its clock.
    pub fn partial(&self) -> Partial {
        let e = &self.engine;
        // Billed up to the clock, but never past the end the report bills to (the trace
        // end or the last completion so far, which only grows).
        let now = self.clock_ns.min(e.trace_end_ns.max(e.last_done_ns));
        let (_, vm, function) = bill(e, now, true);
        Partial {
            time_s: self.clock_ns as f64 / NS as f64,
            cost_usd: vm + function,
            vm_usd: vm,
            function_usd: function,
            sla_violations: e.violations,
            requests: self.arrived,
            served: e.served,
            function_served: e.stats.function_served,
        }
    }

    /// Run to the end (as [`Self::run_until`]`(u64::MAX)`), close the epochs up to the
    /// trace end, end the function instances and bill: the run's report.
    pub fn finish(mut self, progress: &mut dyn FnMut(u64)) -> PolicyRun {
        self.run_until(u64::MAX, progress);
        let mut e = self.engine;
        // Close the epochs up to the trace end (quiet tail).
        e.fire_timers(e.trace_end_ns);
        progress(self.arrived);
        let end_ns = e.trace_end_ns.max(e.last_done_ns);
        e.core.finish_functions(dur(end_ns));
        finish(e, self.kind, self.arrived, end_ns)
    }
}

/// The VM seconds billed, the VM cost and the function cost (USD) of `e`'s run up to
/// `end_ns`: every VM launched so far (not adopted) as if stopped at `end_ns` unless
/// stopped before (with `clamp`, a stop is also billed at most to `end_ns`), every
/// function call started so far. The report ([`finish`]) and a paused run's
/// [`Run::partial`] share this arithmetic: each VM's term only grows with `end_ns`, VMs
/// launched later add terms after the earlier ones, and rounding is monotone, so the
/// partial cost never exceeds the final one.
fn bill(e: &Engine<'_>, end_ns: u64, clamp: bool) -> (f64, f64, f64) {
    let p = e.p;
    let mut billed = 0.0;
    for v in e.vms.iter().filter(|v| !v.adopted) {
        let stop = match v.stop_ns {
            Some(s) if e.stop_handoff_ns > 0 => (s + e.stop_handoff_ns).min(end_ns),
            Some(s) if clamp => s.min(end_ns),
            Some(s) => s,
            None => end_ns,
        };
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
    (billed, vm_cost, fn_cost)
}

fn finish(mut e: Engine<'_>, kind: PolicyKind, arrived: u64, end_ns: u64) -> PolicyRun {
    let (billed, vm_cost, fn_cost) = bill(&e, end_ns, false);
    let vm_hours = billed / 3600.0;
    let gb_s = (e.mb_ms as f64) / 1024.0 / 1000.0;
    let zones = e.core.placement().status();
    let end_s = end_ns as f64 / NS as f64;
    let zone_reports: Vec<ZoneReport> = zones.iter().map(|z| zone_report(z, end_s)).collect();
    let usage = zones
        .iter()
        .filter_map(|z| z.usage)
        .fold(FunctionUsage::default(), |mut a, u| {
            a.warm_starts += u.warm_starts;
            a.startup += u.startup;
            a.busy += u.busy;
            a.idle += u.idle;
            a.shutdown += u.shutdown;
            a
        });
    e.stats.vm_billed_seconds = billed;
    e.stats.warm_starts = usage.warm_starts;
    e.stats.function_startup_s = usage.startup.as_secs_f64();
    e.stats.function_busy_s = usage.busy.as_secs_f64();
    e.stats.function_idle_s = usage.idle.as_secs_f64();
    e.stats.end_s = end_ns as f64 / NS as f64;
    e.hist.flush();
    e.client_hist.flush();
    let q = |x: f64| {
        if e.served == 0 {
            0.0
        } else {
            round_sig3(e.hist.hist.value_at_quantile(x) as f64 / 1000.0)
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
    let stats = |hist: &Histogram<u64>, sum_ns: f64, min: u64, max: u64| ResponseStats {
        mean: if e.served == 0 {
            0.0
        } else {
            sum_ns / e.served as f64 / 1e6
        },
        min: if e.served == 0 { 0.0 } else { min as f64 / 1e6 },
        max: max as f64 / 1e6,
        p50: round_sig3(hist.value_at_quantile(0.50) as f64 / 1000.0),
        p95: round_sig3(hist.value_at_quantile(0.95) as f64 / 1000.0),
        p99: round_sig3(hist.value_at_quantile(0.99) as f64 / 1000.0),
    };
    let zoned = e.p.placement.is_some();
    let x = e.extremes;
    let platform_response_ms =
        zoned.then(|| stats(&e.hist.hist, e.sum_response_ns as f64, x.0, x.1));
    let client_response_ms = zoned.then(|| stats(&e.client_hist.hist, x.4 as f64, x.2, x.3));
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
        delayed: e.delayed,
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
        instance_hours: e
            .p
            .placement
            .is_some()
            .then(|| zone_reports.iter().map(|z| z.instance_hours).sum()),
        mean_instances: e
            .p
            .placement
            .is_some()
            .then(|| zone_reports.iter().map(|z| z.mean_instances).sum()),
        zones: if e.p.placement.is_some() {
            zone_reports
        } else {
            Vec::new()
        },
        platform_response_ms,
        client_response_ms,
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
        queue: e.calls.as_ref().map(|c| queue_report(&e.core, c)),
    };
    PolicyRun {
        report,
        stats: e.stats,
        series: e.series.map(SeriesBuffer::finish).unwrap_or_default(),
    }
}

/// Per-function and overall response time and stretch of a run with the gateway queue
/// (call scheduling §4: means, medians and quartiles, also per function).
fn queue_report(core: &Core, c: &Calls) -> QueueReport {
    let spread = |h: &Histogram<u64>, scale: f64| Spread {
        calls: h.len(),
        mean: round_sig3(h.mean() / scale),
        p25: round_sig3(h.value_at_quantile(0.25) as f64 / scale),
        p50: round_sig3(h.value_at_quantile(0.50) as f64 / scale),
        p75: round_sig3(h.value_at_quantile(0.75) as f64 / scale),
        p95: round_sig3(h.value_at_quantile(0.95) as f64 / scale),
    };
    let n = c.response.len();
    let st = core.status();
    QueueReport {
        order: st.queue.as_ref().map_or("fifo", |q| q.order).to_string(),
        timed_out: c.timed_out,
        response_ms: spread(&c.all_response, 1e3),
        stretch: spread(&c.all_stretch, 1e3),
        functions: (0..n)
            .filter(|&i| !c.response[i].is_empty())
            .map(|i| {
                let name = core.key_name(KeyId(i as u32)).to_string();
                (
                    name,
                    FunctionSpread {
                        response_ms: spread(&c.response[i], 1e3),
                        stretch: spread(&c.stretch[i], 1e3),
                    },
                )
            })
            .collect(),
    }
}

/// One zone's FaaSim usage at the end of a run of `end_s` seconds.
fn zone_report(z: &ZoneStatus, end_s: f64) -> ZoneReport {
    let u = z.usage.unwrap_or_default();
    let instance_s = u.instance_hours() * 3600.0;
    ZoneReport {
        name: z.name.clone(),
        kind: z.kind.as_str(),
        cold_starts: u.cold_starts,
        warm_starts: u.warm_starts,
        throttled: u.throttled + z.calls.map_or(0, |c| c.throttled),
        startup_s: u.startup.as_secs_f64(),
        busy_s: u.busy.as_secs_f64(),
        idle_s: u.idle.as_secs_f64(),
        shutdown_s: u.shutdown.as_secs_f64(),
        prewarm_waits: u.prewarm_waits,
        instance_hours: instance_s / 3600.0,
        mean_instances: if end_s > 0.0 { instance_s / end_s } else { 0.0 },
        instances: z
            .instances
            .iter()
            .map(|i| InstanceReport {
                id: i.serial,
                prewarmed: i.prewarmed,
                started_s: i.started_at.as_secs_f64(),
                stopped_s: i.stopped_at.map(|t| t.as_secs_f64()),
                cold_starts: i.cold_starts,
                warm_starts: i.warm_starts,
                startup_s: i.startup.as_secs_f64(),
                busy_s: i.busy.as_secs_f64(),
                idle_s: i.idle.as_secs_f64(),
                shutdown_s: i.shutdown.as_secs_f64(),
                instance_hours: i.instance_hours(),
            })
            .collect(),
    }
}

/// Round to 3 significant digits: the response-time histogram's precision.
fn round_sig3(x: f64) -> f64 {
    if x <= 0.0 || !x.is_finite() {
        return 0.0;
    }
    format!("{x:.2e}").parse().unwrap_or(x)
}

// ---------------------------------------------------------------------------------------
// The delay-queue experiment (ProFaaStinate §3) on the same event queue.

/// Results of one delay-queue run ([`run_delay`]).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct DelayRun {
    /// Whether the delay queue was on.
    pub delay_queue: bool,
    /// Synchronous calls inside `[t1, t2)` (by arrival).
    pub sync_in_peak: u64,
    /// Their mean response time, ms.
    pub sync_peak_mean_ms: f64,
    /// Their 95th percentile, ms.
    pub sync_peak_p95_ms: f64,
    /// Mean synchronous response time over the whole trace, ms.
    pub sync_mean_ms: f64,
    /// Asynchronous calls finished.
    pub async_finished: u64,
    /// Asynchronous calls finished after their deadline.
    pub deadline_misses: u64,
    /// Asynchronous calls run on the function tier.
    pub async_on_functions: u64,
    /// Calls refused (no capacity).
    pub rejected: u64,
    /// Highest CPU utilisation sampled once a second (mean over ready VMs), 0–1.
    pub cpu_peak: f64,
    /// When the last call finished, s.
    pub last_finish_s: f64,
    /// When each asynchronous call was released from the delay queue (or routed, with
    /// the queue off), s, in call order of the trace; synchronous calls are left out.
    pub releases_s: Vec<f64>,
}

/// Work left (seconds of processing) below which a running call is done: absorbs the
/// rounding of completion times to whole nanoseconds.
const WORK_EPSILON_S: f64 = 1e-9;

/// One VM of the delay-queue experiment: processor sharing over its `cores`.
#[derive(Default)]
struct DelayVm {
    ready: bool,
    gone: bool,
    /// Running calls: call index, work left (s), start (ns).
    running: Vec<(usize, f64, u64)>,
    waiting: VecDeque<usize>,
    /// When `running`'s work was last brought up to date, ns.
    updated_ns: u64,
    /// Generation of the scheduled completion check; older checks are stale.
    generation: u32,
}

/// What happens at a scheduled time in the delay-queue experiment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum DelayEv {
    /// The earliest running call of a VM may be done: VM, generation.
    VmCheck(u32, u32),
    /// A function call ends: index into the function calls.
    FnDone(u32),
    /// A launched VM is ready.
    VmReady(u32),
    /// The other load starts or stops: every VM's rate changes.
    LoadChange,
    /// The once-a-second CPU peak probe.
    Probe,
}

struct DelayEngine<'a> {
    calls: &'a [super::trace::CallEvent],
    core: Core,
    queue: BinaryHeap<Reverse<(u64, u64, DelayEv)>>,
    seq: u64,
    vms: Vec<DelayVm>,
    /// Function calls: call and lease; `None` once finished.
    fns: Vec<Option<(usize, Lease)>>,
    /// When each function call started, ns.
    fn_started: Vec<u64>,
    slots: usize,
    cores: f64,
    load: (f64, u64, u64),
    boot_ns: u64,
    warm_ns: u64,
    cold_ns: u64,
    on: bool,
    initial: bool,
    deadline_of: Vec<Time>,
    finished: usize,
    peak: Histogram<u64>,
    peak_sum: f64,
    sync_sum: f64,
    sync_n: u64,
    out: DelayRun,
}

impl DelayEngine<'_> {
    fn schedule(&mut self, at_ns: u64, ev: DelayEv) {
        self.seq += 1;
        self.queue.push(Reverse((at_ns, self.seq, ev)));
    }

    fn load_at(&self, now: u64) -> f64 {
        let (c, t1, t2) = self.load;
        if now >= t1 && now < t2 { c } else { 0.0 }
    }

    fn rate(&self, vm: usize, now: u64) -> f64 {
        let n = self.vms[vm].running.len();
        if n == 0 {
            return 0.0;
        }
        ((self.cores - self.load_at(now)).max(0.0) / n as f64).min(1.0)
    }

    /// Bring VM `vm`'s running work up to `now` at the rate that held since its last
    /// update (rates only change at events, where this is called first).
    fn advance(&mut self, vm: usize, now: u64) {
        let last = self.vms[vm].updated_ns;
        if now > last {
            let rate = self.rate(vm, last);
            let dt = (now - last) as f64 / NS as f64;
            for r in &mut self.vms[vm].running {
                r.1 -= rate * dt;
            }
        }
        self.vms[vm].updated_ns = now;
    }

    /// Finish VM `vm`'s done calls, start waiting ones, and schedule its next completion
    /// check under the current rate.
    fn settle(&mut self, vm: usize, now: u64) {
        loop {
            let done = self.vms[vm]
                .running
                .iter()
                .position(|r| r.1 <= WORK_EPSILON_S);
            let Some(k) = done else { break };
            let (call, _, started) = self.vms[vm].running.swap_remove(k);
            self.finished += 1;
            self.core.on_vm_request_finished(dur(now), VmId(vm as u64));
            self.finish(call, now, now - started);
        }
        while self.vms[vm].running.len() < self.slots
            && let Some(call) = self.vms[vm].waiting.pop_front()
        {
            let work = self.calls[call].processing_ms / 1000.0;
            self.vms[vm].running.push((call, work, now));
        }
        self.vms[vm].generation = self.vms[vm].generation.wrapping_add(1);
        let rate = self.rate(vm, now);
        if rate > 0.0 {
            let least = self.vms[vm]
                .running
                .iter()
                .map(|r| r.1)
                .fold(f64::INFINITY, f64::min);
            let at = now + ((least.max(0.0) / rate) * NS as f64).ceil() as u64;
            let g = self.vms[vm].generation;
            self.schedule(at, DelayEv::VmCheck(vm as u32, g));
        }
    }

    /// Mean CPU utilisation over ready VMs: `(c + min(running, cores − c)) ÷ cores`.
    fn cpu(&self, now: u64) -> f64 {
        let c = self.load_at(now);
        let (mut sum, mut n) = (0.0, 0usize);
        for v in self.vms.iter().filter(|v| v.ready && !v.gone) {
            let busy = (v.running.len() as f64).min((self.cores - c).max(0.0));
            sum += ((c + busy) / self.cores).min(1.0);
            n += 1;
        }
        if n == 0 { 0.0 } else { sum / n as f64 }
    }

    /// The core's actions and releases until it has none.
    fn drain(&mut self, now: u64) {
        loop {
            let mut any = false;
            while let Some(a) = self.core.poll_action() {
                any = true;
                match a {
                    Action::Scaling(controller::Action::Launch { vm }) => {
                        let i = vm.0 as usize;
                        if self.vms.len() <= i {
                            self.vms.resize_with(i + 1, DelayVm::default);
                        }
                        if self.initial {
                            self.vms[i].ready = true;
                            self.core.on_vm_ready(dur(now), vm);
                        } else {
                            self.schedule(now + self.boot_ns, DelayEv::VmReady(vm.0 as u32));
                        }
                    }
                    Action::Scaling(controller::Action::Stop { vm }) => {
                        if let Some(v) = self.vms.get_mut(vm.0 as usize) {
                            v.gone = true;
                        }
                    }
                    Action::StartInstance { zone, instance } => {
                        self.core.on_instance_started(dur(now), zone, instance);
                    }
                    Action::StopInstance { zone, instance } => {
                        self.core.on_instance_stopped(dur(now), zone, instance);
                    }
                    Action::SampleCpu => {
                        let u = self.cpu(now);
                        self.core.on_cpu_sample(dur(now), u);
                    }
                    _ => {}
                }
            }
            while let Some(r) = self.core.poll_release() {
                any = true;
                let i = r.id.0 as usize;
                self.deadline_of[i] = r.deadline;
                if !matches!(r.decision, Decision::Vm { .. }) {
                    self.out.async_on_functions += 1;
                }
                self.out.releases_s.push(now as f64 / NS as f64);
                let mut ticket = r.ticket;
                self.start(now, i, r.decision, &mut ticket);
            }
            if !any {
                break;
            }
        }
    }

    fn start(&mut self, now: u64, i: usize, d: Decision, ticket: &mut Ticket) {
        let work_s = self.calls[i].processing_ms / 1000.0;
        match d {
            Decision::Vm { vm, .. } => {
                ticket.hand_over();
                let v = vm.0 as usize;
                self.advance(v, now);
                if self.vms[v].running.len() < self.slots {
                    self.vms[v].running.push((i, work_s, now));
                } else {
                    self.vms[v].waiting.push_back(i);
                }
                self.settle(v, now);
            }
            Decision::Function { lease, .. } => {
                ticket.hand_over();
                let extra = match lease.start {
                    Start::Cold(inst) => {
                        // Modelled: ready at once for the core; the call pays the cold start.
                        self.core.on_instance_started(dur(now), lease.zone, inst);
                        self.cold_ns
                    }
                    _ => self.warm_ns,
                };
                let k = self.fns.len();
                self.fns.push(Some((i, lease)));
                self.fn_started.push(now);
                let end = now + extra + (work_s * NS as f64).round() as u64;
                self.schedule(end, DelayEv::FnDone(k as u32));
            }
            Decision::Queue { .. } | Decision::Reject { .. } => {
                self.out.rejected += 1;
            }
        }
    }

    fn arrive(&mut self, now: u64, i: usize) {
        let e = self.calls[i];
        let at = dur(e.at_ns);
        // The trace reader refused negative and non-finite deadlines; a huge one waits
        // forever.
        let deadline =
            at.saturating_add(Duration::try_from_secs_f64(e.deadline_s).unwrap_or(Duration::MAX));
        if e.is_async && self.on {
            self.core
                .enqueue_async(dur(now), CallId(i as u128), deadline, at);
            return;
        }
        let mut ticket = Ticket::new(RequestMeta::default(), None);
        let d = self.core.route(dur(now), &mut ticket);
        if e.is_async {
            self.deadline_of[i] = deadline;
            self.out.releases_s.push(now as f64 / NS as f64);
            if !matches!(d, Decision::Vm { .. }) {
                self.out.async_on_functions += 1;
            }
        }
        self.start(now, i, d, &mut ticket);
    }

    fn finish(&mut self, i: usize, now: u64, processing_ns: u64) {
        let now_s = now as f64 / NS as f64;
        self.out.last_finish_s = self.out.last_finish_s.max(now_s);
        let e = self.calls[i];
        if e.is_async {
            self.out.async_finished += 1;
            if dur(now) > self.deadline_of[i] {
                self.out.deadline_misses += 1;
            }
            if self.on {
                self.core
                    .on_async_finished(dur(now), self.deadline_of[i], dur(processing_ns));
            }
            return;
        }
        let ms = (now - e.at_ns) as f64 / 1e6;
        self.sync_sum += ms;
        self.sync_n += 1;
        let (_, t1, t2) = self.load;
        if e.at_ns >= t1 && e.at_ns < t2 {
            self.out.sync_in_peak += 1;
            self.peak_sum += ms;
            let _ = self.peak.record(((ms * 1000.0).round() as u64).max(1));
        }
    }

    fn handle(&mut self, now: u64, ev: DelayEv) {
        match ev {
            DelayEv::VmCheck(vm, g) => {
                let v = vm as usize;
                if self.vms[v].generation == g {
                    self.advance(v, now);
                    self.settle(v, now);
                }
            }
            DelayEv::FnDone(k) => {
                if let Some((call, lease)) = self.fns[k as usize].take() {
                    self.finished += 1;
                    self.core.on_function_finished(dur(now), lease);
                    let started = self.fn_started[k as usize];
                    self.finish(call, now, now - started);
                }
            }
            DelayEv::VmReady(vm) => {
                if let Some(v) = self.vms.get_mut(vm as usize) {
                    v.ready = true;
                }
                self.core.on_vm_ready(dur(now), VmId(u64::from(vm)));
            }
            DelayEv::LoadChange => {
                // Every VM's work up to the change at the old rate, then its next
                // completion at the new one.
                for v in 0..self.vms.len() {
                    self.advance(v, now);
                    self.settle(v, now);
                }
            }
            DelayEv::Probe => {
                self.out.cpu_peak = self.out.cpu_peak.max(self.cpu(now));
                self.schedule(now + NS, DelayEv::Probe);
            }
        }
    }
}

/// The delay-queue experiment (ProFaaStinate §3): the synchronous and asynchronous calls
/// of an `events` trace with named columns under `kind`, with the core's delay queue
/// (`delay`) or without (asynchronous calls routed at arrival like synchronous ones).
///
/// Physics, beyond the slot model of [`run_policy`]:
/// * each VM has `cores` (`sim.vm.cores`, default `sim.vm.slots`) and `slots`; a call
///   takes one slot (further calls wait in the VM's FIFO queue);
/// * other load (`cpu_load`: `(c, t1, t2)`, s) holds `c` cores of every VM in
///   `[t1, t2)`; running calls progress at rate `min(1, (cores − c) ÷ running)` —
///   processor sharing, so a VM's next completion is rescheduled whenever a call starts
///   or ends there or the other load changes;
/// * the function tier runs a call in its processing time plus the warm or cold start;
/// * the CPU signal is `(c + min(running, cores − c)) ÷ cores`, averaged over ready VMs.
///
/// Events jump from one to the next as in [`run_policy`]: the core's timers fire at
/// their own deadlines ([`Core::poll_timeout`]), before scheduled events at the same
/// time, which come before arrivals.
///
/// # Errors
/// [`SimError::Invalid`] when the trace has no named columns (no call kinds).
pub fn run_delay(
    p: &SimParams,
    trace: &Trace,
    kind: PolicyKind,
    delay: Option<DelayParams>,
    cpu_load: Option<(f64, f64, f64)>,
) -> Result<DelayRun, SimError> {
    if trace.calls.is_empty() {
        return Err(SimError::Invalid {
            field: "--trace".into(),
            message: "--delay-queue needs an events trace with a header naming its columns (time_s kind deadline_s processing_ms zone)".into(),
        });
    }
    let calls = &trace.calls;
    let on = delay.is_some();
    let (scaler, router) = kind.build(&p.policy_params(trace));
    let core = Core::new(p.core_params(), scaler, router).with_delay_queue(delay);
    let (c, t1, t2) = cpu_load.unwrap_or((0.0, 0.0, 0.0));
    let secs_ns = |s: f64| (s * NS as f64).round().max(0.0) as u64;
    let mut e = DelayEngine {
        calls,
        core,
        queue: BinaryHeap::new(),
        seq: 0,
        vms: Vec::new(),
        fns: Vec::new(),
        fn_started: Vec::new(),
        slots: p.vm.slots.get() as usize,
        cores: f64::from(p.vm.cores.unwrap_or(p.vm.slots).get()),
        load: (c, secs_ns(t1), secs_ns(t2)),
        boot_ns: ns(p.vm.boot_seconds.get()),
        warm_ns: ns(p.function.warm_start_ms.get()),
        cold_ns: ns(p.function.cold_start_ms.get()),
        on,
        initial: true,
        deadline_of: vec![Time::ZERO; calls.len()],
        finished: 0,
        peak: hist(),
        peak_sum: 0.0,
        sync_sum: 0.0,
        sync_n: 0,
        out: DelayRun {
            delay_queue: on,
            sync_in_peak: 0,
            sync_peak_mean_ms: 0.0,
            sync_peak_p95_ms: 0.0,
            sync_mean_ms: 0.0,
            async_finished: 0,
            deadline_misses: 0,
            async_on_functions: 0,
            rejected: 0,
            cpu_peak: 0.0,
            last_finish_s: 0.0,
            releases_s: Vec::new(),
        },
    };
    if c > 0.0 && t2 > t1 {
        e.schedule(e.load.1, DelayEv::LoadChange);
        e.schedule(e.load.2, DelayEv::LoadChange);
    }
    e.schedule(NS, DelayEv::Probe);
    e.core.start(Time::ZERO);
    e.drain(0);
    e.initial = false;
    let limit_ns = secs_ns(trace.duration_s + 7.0 * 86_400.0);
    let mut next = 0usize;
    while next < calls.len() || e.finished + (e.out.rejected as usize) < calls.len() {
        let timer = e.core.poll_timeout().as_nanos().min(u128::from(u64::MAX)) as u64;
        let scheduled = e.queue.peek().map(|Reverse((t, _, _))| *t);
        let arrival = calls.get(next).map(|c| c.at_ns);
        let t = [Some(timer), scheduled, arrival]
            .into_iter()
            .flatten()
            .min()
            .expect("the core always has a deadline");
        if t > limit_ns {
            break;
        }
        if timer <= t {
            e.core.handle_timeout(dur(t));
        } else if scheduled == Some(t) {
            let Some(Reverse((t, _, ev))) = e.queue.pop() else {
                unreachable!()
            };
            e.handle(t, ev);
        } else {
            e.arrive(t, next);
            next += 1;
        }
        e.drain(t);
    }
    let mut out = e.out;
    out.sync_peak_mean_ms = if out.sync_in_peak > 0 {
        e.peak_sum / out.sync_in_peak as f64
    } else {
        0.0
    };
    out.sync_peak_p95_ms = e.peak.value_at_quantile(0.95) as f64 / 1000.0;
    out.sync_mean_ms = if e.sync_n > 0 {
        e.sync_sum / e.sync_n as f64
    } else {
        0.0
    };
    let round3 = |x: f64| (x * 1000.0).round() / 1000.0;
    out.sync_peak_mean_ms = round3(out.sync_peak_mean_ms);
    out.sync_mean_ms = round3(out.sync_mean_ms);
    out.cpu_peak = round3(out.cpu_peak);
    out.last_finish_s = round3(out.last_finish_s);
    Ok(out)
}

/// A configured duration in milliseconds, for the jittered model times (the number the
/// file gave, for durations of whole nanoseconds).
fn ms(d: Duration) -> f64 {
    d.as_nanos() as f64 / 1e6
}

/// A configured duration on the simulation clock, ns (at most a year: it fits).
fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}
