//! The policy core as one sans-IO state machine: LIBRA's [`Controller`] (traffic monitor,
//! scaling manager, balancer, VM table), the function [`Placement`] over zones (FaaSim),
//! the VM boot deadlines, the gateway queue ([`Scheduler`], call scheduling §4) and the
//! [`TimerTable`], driven through the request attempt protocol ([`super::attempt`]).
//!
//! Drivers (the live gateway, the simulator) call only this type:
//! * per request: [`Core::route`], then [`Core::on_attempt_failed`] for each failed
//!   attempt, and [`Core::on_vm_request_finished`] / [`Core::on_function_finished`] when
//!   the answering attempt ends; with adaptive r_max ([`Core::with_adaptive_r_max`],
//!   LIBRA §III-B) also [`Core::on_vm_response_time`] for every VM attempt that was sent;
//! * per backend event: VM ready/failed, function instance started/failed;
//! * with the gateway queue ([`Core::with_queue`], call scheduling §4): a
//!   [`Decision::Queue`] waits for [`Action::Dequeued`] (its attempt, already holding a
//!   slot) or [`Action::QueueTimedOut`] (503); a waiting client that goes away calls
//!   [`Core::cancel_queued`]; every completed call reports [`Core::on_call_completed`];
//! * per deadline: sleep until [`Core::poll_timeout`], then [`Core::handle_timeout`];
//! * after any call: drain [`Core::poll_action`] — launch/drain/stop VMs, scaling
//!   records, VM boot timeouts, pre-warm starts and keep-alive stops.
//!
//! Any call may move the next deadline earlier (a call that ends starts a keep-alive
//! window shorter than the open epoch): a driver that sleeps re-reads
//! [`Core::poll_timeout`] after every call and wakes its timer when it moved earlier.

use std::collections::VecDeque;
use std::time::Duration;

use super::attempt::{
    AttemptKind, Decision, Failure, Holding, MAX_INSTANCE_GONE, NotSentReason, Ticket,
};
use super::balancer::{Attempt, RequestMeta, Route, RouteReason, RoutingPolicy};
use super::controller::{self, Controller, ControllerParams, ControllerStatus, LibraTuning};
use super::delay::{CallId, DelayParams, DelayQueue, DelayStatus, ReleaseKind};
use super::functions::InstanceId;
use super::placement::{Lease, Placement, PlacementParams, PlacementPolicy, ZoneId, ZoneStatus};
use super::retry::{RetryBudget, RetryBudgetParams, RetryBudgetStatus};
use super::rmax::{RMaxController, RMaxParams, RMaxStatus};
use super::routes::{KeyId, RouteDef, RouteKeys};
use super::scaling::{ScaleDecision, ScalingPolicy};
use super::sched::{KeyStatus, QueueId, SchedParams, Scheduler};
use super::shared::{CountSource, EpochCount, EwmaState};
use super::timers::{Timer, TimerTable};
use super::{Tier, Time, VmId};

/// Default bound on the number of route keys (configured routes, derived keys and
/// `other`).
pub const DEFAULT_MAX_ROUTE_KEYS: usize = 64;

/// Parameters of the whole core.
#[derive(Clone, Debug, PartialEq)]
pub struct CoreParams {
    /// LIBRA's controller (monitor, r_max, whether scaling is executed).
    pub controller: ControllerParams,
    /// Function zones and the placement policy.
    pub placement: PlacementParams,
    /// A launched VM not ready within this is given up ([`Action::VmBootTimedOut`]);
    /// `None`: no deadline (the simulator's VMs always boot).
    pub vm_boot_timeout: Option<Duration>,
}

/// Work for the driver.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Action {
    /// A VM action or scaling record of the [`Controller`].
    Scaling(controller::Action),
    /// A booting VM missed its boot deadline: the controller forgot it (the next scaling
    /// decision replaces it); terminate whatever the provider started.
    VmBootTimedOut {
        /// The VM.
        vm: VmId,
    },
    /// Start a pre-warmed function instance; report [`Core::on_instance_started`] or
    /// [`Core::on_instance_failed`].
    StartInstance {
        /// The zone.
        zone: ZoneId,
        /// The instance.
        instance: InstanceId,
    },
    /// Stop an idle function instance whose keep-alive ran out (FaaSim §3); report
    /// [`Core::on_instance_stopped`] when it is gone (its shutdown time ends then).
    StopInstance {
        /// The zone.
        zone: ZoneId,
        /// The instance.
        instance: InstanceId,
    },
    /// A call waiting in the gateway queue is served (call scheduling §4): `decision`
    /// (a `Vm` or `Function` of kind [`AttemptKind::Dequeued`]) already holds its VM
    /// slot or lease. Hand it to the waiting request ([`Ticket::on_dequeued`]); if that
    /// request is gone, give it back with [`Core::abandon_dequeued`].
    Dequeued {
        /// The queued call.
        id: QueueId,
        /// Its attempt.
        decision: Decision,
    },
    /// A call waited `max_queue_wait_seconds` and left the queue: answer 503 with
    /// `Retry-After` (reason [`RouteReason::QueueTimeout`]).
    QueueTimedOut {
        /// The queued call.
        id: QueueId,
    },
    /// Measure the delay queue's CPU signal (0–1) and report it with
    /// [`Core::on_cpu_sample`] (ProFaaStinate §3; every `sample_interval`).
    SampleCpu,
}

/// What the core keeps of a queued call to decide its attempt when capacity frees.
#[derive(Clone, Copy, Debug, PartialEq)]
struct QueuedCall {
    meta: RequestMeta,
    origin: Option<ZoneId>,
    reason: RouteReason,
}

/// The gateway queue in `/status` (call scheduling §4).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct QueueStatus {
    /// The discipline (`fifo`, `sept`, `eect`, `rect`, `fair_choice`).
    pub order: &'static str,
    /// Calls waiting now.
    pub length: usize,
    /// `max_queue_length`.
    pub max_length: usize,
    /// Per route key: name and measures (keys seen so far).
    pub keys: Vec<(String, KeyStatus)>,
}

/// A deferred asynchronous call leaving the delay queue (ProFaaStinate §3), from
/// [`Core::poll_release`]: run it like a request whose first decision is `decision`
/// (failures go to [`Core::on_attempt_failed`] with `ticket`), then report
/// [`Core::on_async_finished`]. A [`Decision::Reject`] (no capacity anywhere) is the
/// driver's to queue again ([`Core::enqueue_async`]) a little later.
#[derive(Clone, Debug)]
pub struct Release {
    /// The call.
    pub id: CallId,
    /// Why it left the queue.
    pub kind: ReleaseKind,
    /// Its deadline.
    pub deadline: Time,
    /// The attempt protocol state of its first attempt.
    pub ticket: Ticket,
    /// The first attempt.
    pub decision: Decision,
}

/// A snapshot for `/status`, logs and reports.
#[derive(Clone, Debug, PartialEq)]
pub struct CoreStatus {
    /// LIBRA's state.
    pub controller: ControllerStatus,
    /// The placement policy.
    pub placement: PlacementPolicy,
    /// Every function zone.
    pub zones: Vec<ZoneStatus>,
    /// The adaptive r_max controller, when configured (the value in force is
    /// `controller.r_max_rps` either way).
    pub r_max: Option<RMaxStatus>,
    /// The gateway queue, when configured.
    pub queue: Option<QueueStatus>,
    /// The retry budget ([`super::retry`]).
    pub retry_budget: RetryBudgetStatus,
    /// Failed function attempts per zone and reason ([`NotSentReason::as_str`], or
    /// `failed_after_send`), since start.
    pub function_failures: Vec<(ZoneId, &'static str, u64)>,
    /// Requests that fell back to a VM because no function zone could run them.
    pub fall_backs_to_vm: u64,
    /// The delay queue for asynchronous calls, when configured (ProFaaStinate §3).
    pub delay: Option<DelayStatus>,
    /// LIBRA's parameters in force ([`Core::tuning`]); `None` with a baseline policy.
    pub tuning: Option<LibraTuning>,
}

/// The policy core. See the [module docs](self).
pub struct Core {
    controller: Controller,
    placement: Placement,
    boot_timeout: Option<Duration>,
    /// Booting VMs and their boot deadlines, in launch order.
    booting: Vec<(VmId, Time)>,
    actions: VecDeque<Action>,
    timers: TimerTable,
    /// Adaptive r_max (LIBRA §III-B), when configured.
    r_max: Option<RMaxController>,
    /// The gateway queue (call scheduling §4), when configured.
    sched: Option<Scheduler<QueuedCall>>,
    /// Route keys (the calls' "functions").
    keys: RouteKeys,
    /// Retries of failed VM attempts stay within this budget.
    retry_budget: RetryBudget,
    function_failures: Vec<(ZoneId, &'static str, u64)>,
    fall_backs_to_vm: u64,
    /// The delay queue for asynchronous calls (ProFaaStinate §3), when configured.
    delay: Option<DelayQueue>,
    releases: VecDeque<Release>,
}

impl Core {
    /// A core at time zero: call [`Self::start`] next (after adopting existing VMs).
    pub fn new(
        params: CoreParams,
        scaler: Box<dyn ScalingPolicy>,
        router: Box<dyn RoutingPolicy>,
    ) -> Self {
        let mut core = Self {
            controller: Controller::new(params.controller, scaler, router),
            placement: Placement::new(params.placement),
            boot_timeout: params.vm_boot_timeout,
            booting: Vec::new(),
            actions: VecDeque::new(),
            timers: TimerTable::new(),
            r_max: None,
            sched: None,
            keys: RouteKeys::new(Vec::new(), DEFAULT_MAX_ROUTE_KEYS),
            retry_budget: RetryBudget::new(RetryBudgetParams::default()),
            function_failures: Vec::new(),
            fall_backs_to_vm: 0,
            delay: None,
            releases: VecDeque::new(),
        };
        core.refresh();
        core
    }

    /// Let calls that find no VM slot and no function capacity wait in the gateway queue
    /// (call scheduling §4, [`super::sched`]) instead of getting 503; `None` keeps the
    /// 503. `routes` and `max_keys` define the route keys ([`super::routes`]). Call
    /// before [`Self::start`]. The queue's longest wait is the timer row
    /// [`Timer::QueueWait`]; served and timed-out calls come out as
    /// [`Action::Dequeued`] and [`Action::QueueTimedOut`].
    #[must_use]
    pub fn with_queue(
        mut self,
        params: Option<SchedParams>,
        routes: Vec<RouteDef>,
        max_keys: usize,
    ) -> Self {
        self.sched = params.map(Scheduler::new);
        self.keys = RouteKeys::new(routes, max_keys);
        self.refresh();
        self
    }

    /// Whether the gateway queue is configured.
    pub fn has_queue(&self) -> bool {
        self.sched.is_some()
    }

    /// The route key of a request (`method`, normalized `path`): see [`super::routes`].
    pub fn route_key(&mut self, method: &str, path: &str) -> KeyId {
        self.keys.resolve(method, path)
    }

    /// The route key named `name` (the simulator's function column).
    pub fn key_named(&mut self, name: &str) -> KeyId {
        self.keys.named(name)
    }

    /// The name of `key`.
    pub fn key_name(&self, key: KeyId) -> &str {
        self.keys.name(key)
    }

    /// A call of `key` completed: `processing` from sending it upstream to the end of
    /// its response body (a cold start excluded), `response` from its arrival. Feeds
    /// `E[p]` (the last [`super::sched::HISTORY`] calls of the key) and the per-key
    /// response-time and stretch measures. A no-op without a queue.
    pub fn on_call_completed(&mut self, key: KeyId, processing: Duration, response: Duration) {
        if let Some(s) = &mut self.sched {
            s.on_completed(key, processing, response);
        }
    }

    /// The client of a queued call went away: it leaves the queue (never sent). Returns
    /// whether it was still waiting.
    pub fn cancel_queued(&mut self, now: Time, ticket: &mut Ticket) -> bool {
        self.advance(now);
        let Some(id) = ticket.queued.take() else {
            return false;
        };
        let left = self.sched.as_mut().and_then(|s| s.cancel(id)).is_some();
        self.refresh();
        left
    }

    /// An [`Action::Dequeued`] whose request was gone: give back what `decision` holds.
    pub fn abandon_dequeued(&mut self, now: Time, decision: Decision) {
        let mut t = Ticket::new(RequestMeta::default(), None);
        t.on_dequeued(decision);
        self.finish(now, &mut t);
    }

    /// Adapt r_max with a PID controller on the VM latency percentile (`policy::rmax`,
    /// LIBRA §III-B) instead of keeping it fixed; `None` keeps it fixed. Call before
    /// [`Self::start`]. The controller starts at `params.start_rps` and owns a timer row
    /// ([`Timer::RMax`]); the driver reports every VM attempt's response time with
    /// [`Self::on_vm_response_time`].
    #[must_use]
    pub fn with_adaptive_r_max(mut self, params: Option<RMaxParams>) -> Self {
        self.r_max = params.map(RMaxController::new);
        if let Some(r) = &self.r_max {
            self.controller.set_r_max(Time::ZERO, r.r_max());
        }
        self.refresh();
        self
    }

    /// Bound retries of failed VM attempts by `params` instead of
    /// [`RetryBudgetParams::default`] (20 % of the last 10 s's requests plus one per
    /// second). Call before [`Self::start`].
    #[must_use]
    pub fn with_retry_budget(mut self, params: RetryBudgetParams) -> Self {
        self.retry_budget = RetryBudget::new(params);
        self
    }

    /// Hold asynchronous calls in a delay queue released by a CPU-aware scheduler
    /// (`policy::delay`, ProFaaStinate §3); `None`: no delay queue. Call before
    /// [`Self::start`]. The queue owns a timer row ([`Timer::DelayQueue`]) and asks for
    /// a CPU sample every `sample_interval` ([`Action::SampleCpu`]).
    #[must_use]
    pub fn with_delay_queue(mut self, params: Option<DelayParams>) -> Self {
        self.delay = params.map(DelayQueue::new);
        self.refresh();
        self
    }

    /// Queue asynchronous call `id` (accepted at `accepted_at`, due by `deadline`);
    /// calls may leave at once ([`Self::poll_release`]). `false`: no delay queue is
    /// configured.
    pub fn enqueue_async(
        &mut self,
        now: Time,
        id: CallId,
        deadline: Time,
        accepted_at: Time,
    ) -> bool {
        self.advance(now);
        let Some(q) = &mut self.delay else {
            return false;
        };
        q.push(id, deadline, accepted_at);
        self.release_delayed(now);
        self.pump(now);
        self.refresh();
        true
    }

    /// The CPU signal (0–1) measured after [`Action::SampleCpu`]: may switch the
    /// scheduler's mode and release calls.
    pub fn on_cpu_sample(&mut self, now: Time, utilisation: f64) {
        self.advance(now);
        if let Some(q) = &mut self.delay {
            q.on_cpu_sample(now, utilisation);
        }
        self.release_delayed(now);
        self.pump(now);
        self.refresh();
    }

    /// A released asynchronous call with `deadline` finished after running for
    /// `processing`: a deadline miss when `now > deadline`; updates `E[p]`.
    pub fn on_async_finished(&mut self, now: Time, deadline: Time, processing: Duration) {
        if let Some(q) = &mut self.delay {
            q.on_finished(now, deadline, processing);
        }
        self.refresh();
    }

    /// The next call released from the delay queue, in release order.
    pub fn poll_release(&mut self) -> Option<Release> {
        self.releases.pop_front()
    }

    /// The delay queue (read-only), when configured.
    pub fn delay_queue(&self) -> Option<&DelayQueue> {
        self.delay.as_ref()
    }

    /// Apply the scaling policy's initial decision and start the pre-warmed instances.
    pub fn start(&mut self, now: Time) {
        self.controller.start(now);
        self.track_ready(now);
        self.pump(now);
        for (zone, instance) in self.placement.prewarm(now) {
            self.actions
                .push_back(Action::StartInstance { zone, instance });
        }
        self.refresh();
    }

    /// Register a VM that is already ready (a `static` upstream, an adopted instance).
    pub fn adopt_ready_vm(&mut self, now: Time) -> VmId {
        let vm = self.controller.adopt_ready_vm(now);
        self.track_ready(now);
        self.serve_queue(now);
        self.pump(now);
        self.refresh();
        vm
    }

    /// Register a VM that is already booting and that this core did not launch (a new
    /// leader of several replicas found an earlier leader's launch still booting, see
    /// [`Controller::adopt_booting_vm`]): it counts toward the pool, and is given up
    /// ([`Action::VmBootTimedOut`]) unless [`Self::on_vm_ready`] comes within the boot
    /// timeout from now. Returns its id.
    pub fn adopt_booting_vm(&mut self, now: Time) -> VmId {
        let vm = self.controller.adopt_booting_vm(now);
        if let Some(t) = self.boot_timeout {
            self.booting.push((vm, now + t));
        }
        self.pump(now);
        self.refresh();
        vm
    }

    /// The first decision for a request (counted by the traffic monitor).
    pub fn route(&mut self, now: Time, ticket: &mut Ticket) -> Decision {
        self.advance(now);
        if let Some(s) = &mut self.sched {
            ticket.arrival = Some(s.on_arrival(now, ticket.key.unwrap_or(RouteKeys::OTHER)));
        }
        self.retry_budget.on_request(now);
        let d = self.route_first(now, ticket);
        let pumped = self.pump(now);
        // A first attempt on a VM changed only the controller's counts and the VM's row
        // (the epoch end moves in `advance`, which refreshes): no timer row moved unless
        // the queue or an action did.
        let vm_first = matches!(
            d,
            Decision::Vm {
                kind: AttemptKind::First,
                ..
            }
        );
        if pumped || !vm_first || self.sched.is_some() {
            self.refresh();
        } else {
            self.debug_assert_fresh();
        }
        d
    }

    fn route_first(&mut self, now: Time, ticket: &mut Ticket) -> Decision {
        match self.controller.route(now, &ticket.meta, Attempt::First) {
            Route::Vm { vm, reason } => {
                ticket.holding = Some(Holding::Vm(vm));
                Decision::Vm {
                    vm,
                    kind: AttemptKind::First,
                    reason,
                }
            }
            Route::Function { reason } => {
                ticket.reason = reason;
                self.place(now, ticket, AttemptKind::First, reason)
            }
            Route::Reject { reason } => Decision::Reject { reason },
        }
    }

    /// The current attempt of `ticket` failed: release what it held and decide the next
    /// attempt (see [`super::attempt`]). `None`: no further attempt — the driver answers
    /// with this attempt's own error.
    pub fn on_attempt_failed(
        &mut self,
        now: Time,
        ticket: &mut Ticket,
        failure: Failure,
    ) -> Option<Decision> {
        self.advance(now);
        let holding = ticket.holding.take();
        let not_sent = match failure {
            Failure::NotSent { reason, .. } => Some(reason),
            Failure::FailedAfterSend { .. } => None,
        };
        match holding {
            Some(Holding::Vm(vm)) => self.controller.on_vm_request_finished(now, vm),
            Some(Holding::Function(lease)) => {
                let label = not_sent.map_or("failed_after_send", NotSentReason::as_str);
                self.count_function_failure(lease.zone, label);
                self.release_failed(now, lease, not_sent);
            }
            None => {}
        }
        let next = match (holding, failure) {
            (
                _,
                Failure::NotSent {
                    request_available: false,
                    ..
                },
            ) => None,
            // Never written (connect refused or timed out): re-routed without the retry
            // budget — no upstream did any work for it, so sending it elsewhere adds no
            // load; only re-sends of a request that reached an upstream are capped. A
            // budget of zero turns this off too (retries off).
            (Some(Holding::Vm(vm)), Failure::NotSent { .. })
                if !ticket.retried && self.retry_budget.enabled() =>
            {
                Some(self.retry(now, ticket, vm))
            }
            (
                Some(Holding::Vm(vm)),
                Failure::FailedAfterSend {
                    response_started: false,
                    request_available: true,
                },
            ) if !ticket.retried
                && ticket.meta.idempotent
                && !ticket.meta.upgrade
                && self.retry_budget.try_retry(now) =>
            {
                Some(self.retry(now, ticket, vm))
            }
            (
                Some(Holding::Function(_)),
                Failure::NotSent {
                    reason: NotSentReason::InstanceGone,
                    ..
                },
            ) if ticket.gone < MAX_INSTANCE_GONE => {
                ticket.gone += 1;
                Some(self.place(now, ticket, AttemptKind::Retry, ticket.reason))
            }
            (Some(Holding::Function(lease)), Failure::NotSent { .. }) => {
                ticket.tried_zones.insert(lease.zone);
                Some(self.fall_through(now, ticket))
            }
            _ => None,
        };
        self.serve_queue(now);
        self.pump(now);
        self.refresh();
        next
    }

    /// A request sent to `vm` finished (response body done, or given up).
    pub fn on_vm_request_finished(&mut self, now: Time, vm: VmId) {
        self.advance(now);
        self.controller.on_vm_request_finished(now, vm);
        self.serve_queue(now);
        self.release_delayed(now);
        // Without the gateway queue and the delay queue, a VM request's end changes the
        // VM's row only, unless it stopped a draining VM (an action): no timer row moved.
        if self.pump(now) || self.sched.is_some() || self.delay.is_some() {
            self.refresh();
        } else {
            self.debug_assert_fresh();
        }
    }

    /// A VM attempt that was sent ended after `latency` (to the end of its response body,
    /// or its timeout): a sample for the adaptive r_max controller's latency percentile.
    /// Call it for every such attempt (not for tunnels after `Upgrade`); a no-op when
    /// r_max is fixed.
    #[inline]
    pub fn on_vm_response_time(&mut self, now: Time, latency: Duration) {
        if self.r_max.is_some() {
            // A period that ended before `now` is closed without this sample.
            self.advance(now);
            if let Some(r) = &mut self.r_max {
                r.record(latency);
            }
        }
    }

    /// Whether r_max is adapted (drivers measure VM response times only then).
    pub fn adapts_r_max(&self) -> bool {
        self.r_max.is_some()
    }

    /// The function call holding `lease` finished: its instance stays warm for the
    /// keep-alive (which may move the next deadline earlier).
    pub fn on_function_finished(&mut self, now: Time, lease: Lease) {
        self.advance(now);
        self.placement.release(now, lease);
        self.serve_queue(now);
        self.pump(now);
        self.refresh();
    }

    /// The answering attempt of `ticket` finished: release what it holds.
    pub fn finish(&mut self, now: Time, ticket: &mut Ticket) {
        match ticket.holding.take() {
            Some(Holding::Vm(vm)) => self.on_vm_request_finished(now, vm),
            Some(Holding::Function(lease)) => self.on_function_finished(now, lease),
            None => {}
        }
    }

    /// A function instance (cold-started for a call, or pre-warmed) is ready.
    pub fn on_instance_started(&mut self, now: Time, zone: ZoneId, instance: InstanceId) {
        self.advance(now);
        self.placement.on_started(now, zone, instance);
        self.refresh();
    }

    /// A function instance expired by its keep-alive ([`Action::StopInstance`]) finished
    /// stopping: its shutdown time ends (FaaSim usage, papers.md §2).
    pub fn on_instance_stopped(&mut self, now: Time, zone: ZoneId, instance: InstanceId) {
        self.advance(now);
        self.placement.on_stopped(now, zone, instance);
        self.refresh();
    }

    /// Keep the usage of every stopped function instance for [`Self::status`] (the
    /// simulator's per-instance report).
    pub fn keep_function_history(&mut self) {
        self.placement.keep_history();
    }

    /// A function instance failed to start or died while idle: forgotten.
    pub fn on_instance_failed(&mut self, now: Time, zone: ZoneId, instance: InstanceId) {
        self.advance(now);
        self.placement.on_failed(now, zone, instance);
        self.serve_queue(now);
        self.pump(now);
        self.refresh();
    }

    /// A launched VM passed its readiness check.
    pub fn on_vm_ready(&mut self, now: Time, vm: VmId) {
        self.advance(now);
        self.booting.retain(|(v, _)| *v != vm);
        self.controller.on_vm_ready(now, vm);
        self.track_ready(now);
        self.serve_queue(now);
        self.pump(now);
        self.refresh();
    }

    /// A VM failed (launch failed, died): forgotten; the next decision replaces it.
    pub fn on_vm_failed(&mut self, now: Time, vm: VmId) {
        self.advance(now);
        self.booting.retain(|(v, _)| *v != vm);
        self.controller.on_vm_failed(now, vm);
        self.track_ready(now);
        self.pump(now);
        self.refresh();
    }

    /// An attempt on `vm` failed (connect refused, connection reset before an answer):
    /// the rest of a burst is routed elsewhere, as first attempts, until a probe clears
    /// it ([`Self::on_vm_cleared`]) or shows it dead ([`Self::on_vm_died`]).
    pub fn on_vm_suspect(&mut self, now: Time, vm: VmId) {
        self.advance(now);
        self.controller.set_vm_suspect(now, vm, true);
        self.refresh();
    }

    /// A suspect VM answered its probe: it takes requests again.
    pub fn on_vm_cleared(&mut self, now: Time, vm: VmId) {
        self.advance(now);
        self.controller.set_vm_suspect(now, vm, false);
        self.serve_queue(now);
        self.pump(now);
        self.refresh();
    }

    /// A ready VM died (health probes, refused connections): forgotten and replaced at
    /// once up to the scaling target; the launch comes as an action.
    pub fn on_vm_died(&mut self, now: Time, vm: VmId) {
        self.advance(now);
        self.booting.retain(|(v, _)| *v != vm);
        self.controller.on_vm_died(now, vm);
        self.track_ready(now);
        self.pump(now);
        self.refresh();
    }

    /// The mean VM utilisation (0–1) of the open epoch, for AUTO and Spock.
    pub fn set_vm_utilisation(&mut self, utilisation: f64) {
        self.controller.set_vm_utilisation(utilisation);
    }

    /// The earliest deadline of any timed component (the open epoch always ends).
    #[must_use]
    pub fn poll_timeout(&self) -> Time {
        self.next_timer().1
    }

    /// The earliest deadline and the component that owns it.
    #[must_use]
    pub fn next_timer(&self) -> (Timer, Time) {
        self.timers
            .next()
            .unwrap_or((Timer::EpochEnd, self.controller.poll_timeout()))
    }

    /// Fire every deadline at or before `now`: adapt r_max (before the epoch that ends
    /// with the period closes, so its scaling decision divides by the new value), close
    /// epochs (and run the scaling policy), give up VMs past their boot deadline, expire
    /// idle function instances.
    pub fn handle_timeout(&mut self, now: Time) {
        self.adapt_r_max(now);
        self.controller.handle_timeout(now);
        self.pump(now);
        let mut timed_out = Vec::new();
        self.booting.retain(|&(vm, at)| {
            if at <= now {
                timed_out.push(vm);
                false
            } else {
                true
            }
        });
        for vm in timed_out {
            self.controller.on_vm_failed(now, vm);
            self.actions.push_back(Action::VmBootTimedOut { vm });
            self.pump(now);
        }
        for (zone, instance) in self.placement.handle_timeout(now) {
            self.actions
                .push_back(Action::StopInstance { zone, instance });
        }
        if let Some(s) = &mut self.sched {
            for w in s.expire(now) {
                self.actions.push_back(Action::QueueTimedOut { id: w.id });
            }
        }
        if let Some(q) = &mut self.delay
            && q.sample_due(now)
        {
            self.actions.push_back(Action::SampleCpu);
        }
        self.release_delayed(now);
        self.pump(now);
        self.track_ready(now);
        self.serve_queue(now);
        self.pump(now);
        self.refresh();
    }

    /// Close the epochs that end at or before `until` while nothing else happens — no
    /// request, no other deadline before them — as [`Self::handle_timeout`] at each end
    /// would, with `utilisation` reported before each ([`Self::set_vm_utilisation`];
    /// `None`: not measured), in O(1) once the scaling policy is settled (the
    /// simulator skips idle stretches; see [`Controller::close_idle_epochs`]). Stops
    /// before any other timer's deadline and after an epoch whose decision launched or
    /// stopped a VM; returns the end of the last epoch closed (the time of the actions it
    /// queued), `None` when it closed none. Closes none with the adaptive r_max
    /// controller, the asynchronous-call queue or waiting calls (their bookkeeping is
    /// per event).
    pub fn close_idle_epochs(&mut self, until: Time, utilisation: Option<f64>) -> Option<Time> {
        if self.r_max.is_some()
            || self.delay.is_some()
            || self.sched.as_ref().is_some_and(|s| !s.is_empty())
        {
            return None;
        }
        let other = Timer::ALL
            .iter()
            .filter(|&&t| t != Timer::EpochEnd)
            .filter_map(|&t| self.timers.get(t))
            .min();
        let until = match other {
            Some(at) if at <= until => at.checked_sub(Duration::from_nanos(1))?,
            _ => until,
        };
        if self.controller.poll_timeout() > until {
            return None;
        }
        let closed = self.controller.close_idle_epochs(until, utilisation);
        if closed == 0 {
            return None;
        }
        let now = self
            .controller
            .monitor()
            .epoch_start(self.controller.monitor().current_epoch());
        self.pump(now);
        self.serve_queue(now);
        self.pump(now);
        self.refresh();
        Some(now)
    }

    /// Take the traffic monitor's counts from `source` (several replicas,
    /// [`super::shared`]; [`Controller::set_count_source`]).
    pub fn set_count_source(&mut self, now: Time, source: CountSource) {
        self.controller.set_count_source(now, source);
        self.after_pool_change(now);
    }

    /// The next local epoch count for the coordinator ([`Controller::poll_epoch_count`]).
    pub fn poll_epoch_count(&mut self) -> Option<EpochCount> {
        self.controller.poll_epoch_count()
    }

    /// The sum of every replica's count for `epoch` ([`Controller::on_aggregate_count`]):
    /// the monitor closes it and the scaling policy decides; `false` when nothing was
    /// done.
    pub fn on_aggregate_count(&mut self, now: Time, epoch: u64, requests: u64) -> bool {
        self.advance(now);
        let done = self.controller.on_aggregate_count(now, epoch, requests);
        self.after_pool_change(now);
        done
    }

    /// A scaling decision taken by the leader ([`Controller::apply_decision`]).
    pub fn apply_decision(&mut self, now: Time, epoch: u64, decision: ScaleDecision) {
        self.advance(now);
        self.controller.apply_decision(now, epoch, decision);
        self.after_pool_change(now);
    }

    /// Whether this replica's decisions launch and stop VMs
    /// ([`Controller::set_pool_writer`]).
    pub fn set_pool_writer(&mut self, now: Time, writer: bool) {
        self.advance(now);
        self.controller.set_pool_writer(now, writer);
        self.after_pool_change(now);
    }

    /// This replica's share of the VM budget ([`Controller::set_budget_share`]).
    pub fn set_budget_share(&mut self, now: Time, share: f64) {
        self.advance(now);
        self.controller.set_budget_share(now, share);
        self.after_pool_change(now);
    }

    /// No scale-in for the next `epochs` epochs ([`Controller::hold_scale_in`]).
    pub fn hold_scale_in(&mut self, epochs: u64) {
        self.controller.hold_scale_in(epochs);
    }

    /// The monitor's EWMAs after the last closed epoch ([`Controller::ewma_state`]).
    pub fn ewma_state(&self) -> Option<EwmaState> {
        self.controller.ewma_state()
    }

    /// Resume the monitor from another replica's state ([`Controller::restore_ewma`]).
    pub fn restore_ewma(&mut self, state: &EwmaState) {
        self.controller.restore_ewma(state);
    }

    /// A registry VM left the pool ([`Controller::drain_vm`]).
    pub fn drain_vm(&mut self, now: Time, vm: VmId) {
        self.advance(now);
        self.controller.drain_vm(now, vm);
        self.after_pool_change(now);
    }

    /// After an input that may change the pool or the budget: boot deadlines, the queue,
    /// the timer table.
    fn after_pool_change(&mut self, now: Time) {
        self.pump(now);
        self.track_ready(now);
        self.serve_queue(now);
        self.pump(now);
        self.refresh();
    }

    /// The next action for the driver, in the order they were decided.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// LIBRA's controller (read-only): VM table, monitor, status.
    pub fn controller(&self) -> &Controller {
        &self.controller
    }

    /// The VM budget a leader of several replicas shares (`policy::shared`'s
    /// `budget_shares`): what the VMs admit in one epoch, `ρ · min(vm_reqs, ready ·
    /// r_max) · E`, requests per epoch (ρ = 1 with a baseline policy).
    pub fn shared_vm_budget(&self) -> f64 {
        let st = self.controller.status();
        let rho = self.tuning().map_or(1.0, |t| t.rho);
        let epoch_s = self.controller.monitor().params().epoch.as_secs_f64();
        rho * st.vm_reqs_rps.min(f64::from(st.pool.ready) * st.r_max_rps) * epoch_s
    }

    /// LIBRA's parameters in force (for `/status`); `None` with a baseline policy.
    pub fn tuning(&self) -> Option<LibraTuning> {
        self.controller.tuning()
    }

    /// Use new LIBRA parameters from `now` on, keeping every in-flight state — EWMAs,
    /// VM table and outstanding counts, balancer tokens, function leases, queues,
    /// timers (a configuration reload; [`Controller::retune`]). With
    /// adaptive r_max the adapted value stays in force and `tuning.scaling.r_max_rps`
    /// is ignored. `false` (nothing changed): a baseline policy without these
    /// parameters.
    pub fn retune(&mut self, now: Time, tuning: &LibraTuning) -> bool {
        self.advance(now);
        let mut tuning = tuning.clone();
        if self.r_max.is_some() {
            tuning.scaling.r_max_rps = self.controller.r_max();
        }
        let done = self.controller.retune(now, &tuning);
        self.pump(now);
        self.refresh();
        done
    }

    /// The function placement (read-only).
    pub fn placement(&self) -> &Placement {
        &self.placement
    }

    /// Account the idle time of instances still idle at `now` (end of a simulation).
    pub fn finish_functions(&mut self, now: Time) {
        self.placement.finish(now);
    }

    /// A snapshot of every component.
    pub fn status(&self) -> CoreStatus {
        CoreStatus {
            controller: self.controller.status(),
            placement: self.placement.policy(),
            zones: self.placement.status(),
            r_max: self.r_max.as_ref().map(RMaxController::status),
            queue: self.sched.as_ref().map(|s| QueueStatus {
                order: s.params().order.as_str(),
                length: s.len(),
                max_length: s.params().max_queue_length,
                keys: s
                    .status()
                    .into_iter()
                    .enumerate()
                    .map(|(i, k)| (self.keys.name(KeyId(i as u32)).to_string(), k))
                    .collect(),
            }),
            retry_budget: self.retry_budget.status(),
            function_failures: self.function_failures.clone(),
            fall_backs_to_vm: self.fall_backs_to_vm,
            delay: self.delay.as_ref().map(DelayQueue::status),
            tuning: self.controller.tuning(),
        }
    }

    /// Fire the deadlines that passed before an event at `now` (a driver that is late,
    /// or an event exactly at a deadline).
    #[inline]
    fn advance(&mut self, now: Time) {
        if self.timers.next().is_some_and(|(_, at)| at <= now) {
            self.handle_timeout(now);
        }
    }

    fn place(
        &mut self,
        now: Time,
        ticket: &mut Ticket,
        kind: AttemptKind,
        reason: RouteReason,
    ) -> Decision {
        match self.placement.place(now, ticket.origin, ticket.tried_zones) {
            Some(lease) => {
                ticket.holding = Some(Holding::Function(lease));
                Decision::Function {
                    lease,
                    kind,
                    reason,
                }
            }
            None => self.fall_back(now, ticket),
        }
    }

    /// After a zone could not run the call: the next zone, else a VM, else the queue,
    /// else 503.
    fn fall_through(&mut self, now: Time, ticket: &mut Ticket) -> Decision {
        match self.placement.place(now, ticket.origin, ticket.tried_zones) {
            Some(lease) => {
                self.controller.count_function_attempt();
                ticket.holding = Some(Holding::Function(lease));
                Decision::Function {
                    lease,
                    kind: AttemptKind::FallThrough,
                    reason: ticket.reason,
                }
            }
            None => self.fall_back(now, ticket),
        }
    }

    /// No zone can run the call: a ready VM if the balancer admits a fall-back, else the
    /// queue, else 503. At most one fall-back per request.
    fn fall_back(&mut self, now: Time, ticket: &mut Ticket) -> Decision {
        if ticket.fell_back {
            return self.queue_or_reject(now, ticket, RouteReason::SpillBackRejected);
        }
        ticket.fell_back = true;
        match self.controller.route(now, &ticket.meta, Attempt::SpillBack) {
            Route::Vm { vm, reason } => {
                ticket.holding = Some(Holding::Vm(vm));
                self.fall_backs_to_vm += 1;
                Decision::Vm {
                    vm,
                    kind: AttemptKind::FallBack,
                    reason,
                }
            }
            Route::Reject { reason } | Route::Function { reason } => {
                self.queue_or_reject(now, ticket, reason)
            }
        }
    }

    /// Once a retry: another VM (never the failed one) or the function tier.
    fn retry(&mut self, now: Time, ticket: &mut Ticket, failed: VmId) -> Decision {
        ticket.retried = true;
        let attempt = Attempt::RetryAfterConnectFailure { failed };
        match self.controller.route(now, &ticket.meta, attempt) {
            Route::Vm { vm, reason } => {
                ticket.holding = Some(Holding::Vm(vm));
                Decision::Vm {
                    vm,
                    kind: AttemptKind::Retry,
                    reason,
                }
            }
            Route::Function { reason } => {
                ticket.reason = reason;
                self.place(now, ticket, AttemptKind::Retry, reason)
            }
            Route::Reject { reason } => Decision::Reject { reason },
        }
    }

    /// Nothing is free: the gateway queue (call scheduling §4), else 503 — also when
    /// the queue is full ([`RouteReason::QueueFull`]).
    fn queue_or_reject(&mut self, now: Time, ticket: &mut Ticket, reason: RouteReason) -> Decision {
        let Some(s) = &mut self.sched else {
            return Decision::Reject { reason };
        };
        let arrival = match ticket.arrival {
            Some(a) => a,
            None => {
                let a = s.on_arrival(now, ticket.key.unwrap_or(RouteKeys::OTHER));
                ticket.arrival = Some(a);
                a
            }
        };
        let call = QueuedCall {
            meta: ticket.meta,
            origin: ticket.origin,
            reason,
        };
        match s.enqueue(now, arrival, call) {
            Ok(id) => {
                ticket.queued = Some(id);
                Decision::Queue { reason }
            }
            Err(_) => Decision::Reject {
                reason: RouteReason::QueueFull,
            },
        }
    }

    /// Hand freed capacity to the queue's head while there is some: a VM slot (the
    /// balancer's fall-back rule), else a function zone. Each served call becomes an
    /// [`Action::Dequeued`].
    fn serve_queue(&mut self, now: Time) {
        let Some(s) = &self.sched else { return };
        let mut head = s.peek().map(|w| w.payload);
        while let Some(call) = head {
            let decision = if let Some(vm) = self.controller.try_vm_slot(now, &call.meta) {
                Decision::Vm {
                    vm,
                    kind: AttemptKind::Dequeued,
                    reason: call.reason,
                }
            } else if let Some(lease) =
                self.placement
                    .try_place(now, call.origin, Default::default())
            {
                self.controller.count_function_attempt();
                Decision::Function {
                    lease,
                    kind: AttemptKind::Dequeued,
                    reason: call.reason,
                }
            } else {
                break;
            };
            let s = self.sched.as_mut().expect("checked above");
            let w = s.pop(now).expect("the head exists");
            self.actions
                .push_back(Action::Dequeued { id: w.id, decision });
            head = s.peek().map(|w| w.payload);
        }
    }

    fn count_function_failure(&mut self, zone: ZoneId, label: &'static str) {
        match self
            .function_failures
            .iter_mut()
            .find(|(z, l, _)| *z == zone && *l == label)
        {
            Some((_, _, n)) => *n += 1,
            None => self.function_failures.push((zone, label, 1)),
        }
    }

    /// Release every call the delay queue says is due (ProFaaStinate §3): forced ones to
    /// the function tier, urgent ones through the balancer, idle ones to a VM with a free
    /// slot and a token — or to the function tier when no VM is ready at all. Stops at the
    /// first idle call no VM can take.
    fn release_delayed(&mut self, now: Time) {
        loop {
            let Some(q) = &self.delay else { return };
            let Some(due) = q.peek_due(now) else { return };
            let slots = q.params().vm_slots;
            let meta = RequestMeta {
                upgrade: false,
                idempotent: false,
            };
            let mut ticket = Ticket::new(meta, None);
            let decision = match due.kind {
                ReleaseKind::Forced => {
                    self.controller.count_deferred_function(now);
                    ticket.reason = RouteReason::AsyncDeadline;
                    self.place(
                        now,
                        &mut ticket,
                        AttemptKind::First,
                        RouteReason::AsyncDeadline,
                    )
                }
                ReleaseKind::Urgent => self.route_first(now, &mut ticket),
                ReleaseKind::Idle => {
                    if let Some(vm) = self.controller.admit_deferred(now, slots) {
                        ticket.holding = Some(Holding::Vm(vm));
                        Decision::Vm {
                            vm,
                            kind: AttemptKind::First,
                            reason: RouteReason::WithinBudget,
                        }
                    } else if self.controller.pool().ready == 0 {
                        self.controller.count_deferred_function(now);
                        ticket.reason = RouteReason::NoReadyVm;
                        self.place(now, &mut ticket, AttemptKind::First, RouteReason::NoReadyVm)
                    } else {
                        return;
                    }
                }
            };
            // A released call never waits in the synchronous gateway queue (call
            // scheduling): no capacity anywhere is a Reject, which the driver queues
            // again in the delay queue.
            let decision = match decision {
                Decision::Queue { reason } => {
                    self.cancel_queued(now, &mut ticket);
                    Decision::Reject { reason }
                }
                d => d,
            };
            let tier = match decision {
                Decision::Vm { .. } => Tier::Vm,
                _ => Tier::Function,
            };
            if let Some(q) = &mut self.delay {
                q.released(due.id, due.kind, tier);
            }
            self.releases.push_back(Release {
                id: due.id,
                kind: due.kind,
                deadline: due.deadline,
                ticket,
                decision,
            });
        }
    }

    fn release_failed(&mut self, now: Time, lease: Lease, not_sent: Option<NotSentReason>) {
        match (not_sent, lease.instance()) {
            (Some(NotSentReason::Throttled), _) => self.placement.refuse(now, lease),
            (
                Some(
                    NotSentReason::ColdStartFailed
                    | NotSentReason::InstanceGone
                    | NotSentReason::Unreachable,
                ),
                Some(instance),
            ) => self.placement.on_failed(now, lease.zone, instance),
            _ => self.placement.release(now, lease),
        }
    }

    /// Move the controller's actions into the core's queue, tracking boot deadlines.
    /// Whether it moved any.
    fn pump(&mut self, now: Time) -> bool {
        let mut moved = false;
        while let Some(a) = self.controller.poll_action() {
            moved = true;
            match a {
                controller::Action::Launch { vm } => {
                    if let Some(t) = self.boot_timeout {
                        self.booting.push((vm, now + t));
                    }
                }
                controller::Action::Stop { vm } => self.booting.retain(|(v, _)| *v != vm),
                controller::Action::Drain { .. } | controller::Action::Decided { .. } => {}
            }
            self.actions.push_back(Action::Scaling(a));
        }
        moved
    }

    /// Close the adaptive r_max controller's period if it ended, and hand a changed r_max
    /// to the controller (budget cap) and the scaling policy (next `n`).
    fn adapt_r_max(&mut self, now: Time) {
        let Some(r) = &mut self.r_max else {
            return;
        };
        if let Some(r_max) = r.handle_timeout(now) {
            self.controller.set_r_max(now, r_max);
        }
    }

    /// Ready-VM seconds for the adaptive r_max controller's load hold: called wherever
    /// the number of ready VMs may change (readiness, failures, decisions).
    fn track_ready(&mut self, now: Time) {
        if let Some(r) = &mut self.r_max {
            r.set_ready_vms(now, self.controller.pool().ready);
        }
    }

    /// Every component's earliest deadline, in [`Timer::ALL`] order.
    #[inline]
    fn timer_rows(&self) -> [Option<Time>; Timer::ALL.len()] {
        let mut rows = [None; Timer::ALL.len()];
        rows[Timer::EpochEnd as usize] = Some(self.controller.poll_timeout());
        rows[Timer::VmBoot as usize] = self.booting.iter().map(|(_, at)| *at).min();
        rows[Timer::KeepAlive as usize] = self.placement.poll_timeout();
        rows[Timer::RMax as usize] = self.r_max.as_ref().map(RMaxController::poll_timeout);
        rows[Timer::QueueWait as usize] = self.sched.as_ref().and_then(Scheduler::poll_timeout);
        rows[Timer::DelayQueue as usize] = self.delay.as_ref().and_then(DelayQueue::poll_timeout);
        rows
    }

    /// Bring the timer table up to date after an input.
    #[inline]
    fn refresh(&mut self) {
        let rows = self.timer_rows();
        self.timers.set_all(rows);
    }

    /// Where an input skips [`Self::refresh`] because it moves no deadline: debug builds
    /// check that the table is indeed up to date.
    #[inline]
    fn debug_assert_fresh(&self) {
        debug_assert!(
            Timer::ALL
                .iter()
                .all(|&t| self.timers.get(t) == self.timer_rows()[t as usize]),
            "an input that skipped the timer refresh moved a deadline"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attempt::NotSentReason as N;
    use crate::balancer::{RequestMeta, VmFirst};
    use crate::baselines::{FixedScaler, FunctionOnly};
    use crate::functions::{FunctionPoolParams, WarmOrder};
    use crate::monitor::MonitorParams;
    use crate::placement::{Start, ZoneCapacity, ZoneKind, ZoneParams};
    use crate::scaling::{LibraScaler, LibraScalingParams};

    fn secs(s: f64) -> Time {
        Duration::from_secs_f64(s)
    }

    fn controller_params(epoch_s: u64) -> ControllerParams {
        ControllerParams {
            monitor: MonitorParams {
                epoch: Duration::from_secs(epoch_s),
                alpha: 0.3,
                beta: 0.2,
                decision_epochs: 1000,
                first_decision_epoch: None,
            },
            r_max_rps: 2.0,
            execute_scaling: true,
        }
    }

    fn libra(min_vms: u32) -> Box<LibraScaler> {
        Box::new(LibraScaler::new(LibraScalingParams {
            phi: 1.5,
            r_max_rps: 2.0,
            min_vms,
            max_vms: 4,
            cip_rps: 0.0,
        }))
    }

    /// One ready VM (cap 2 calls, ρ = 0.5 of r_max 2: one token, then 1 token/s) and
    /// the given zones.
    fn vm_and_zones(zones: Vec<ZoneParams>) -> (Core, VmId) {
        let params = CoreParams {
            controller: ControllerParams {
                execute_scaling: false,
                ..controller_params(60)
            },
            placement: PlacementParams {
                zones,
                policy: PlacementPolicy::EdgeFirst,
            },
            vm_boot_timeout: None,
        };
        let router = VmFirst::new(0.5).with_max_outstanding_per_vm(Some(2));
        let mut core = Core::new(params, libra(1), Box::new(router));
        let vm = core.adopt_ready_vm(Time::ZERO);
        core.start(Time::ZERO);
        while core.poll_action().is_some() {}
        (core, vm)
    }

    /// ProFaaStinate §3 through the core: a call too close to its deadline goes to the
    /// function tier at once; idle releases take a VM slot and a token each (counted by
    /// the traffic monitor at release) and stop when no token is left; busy mode holds
    /// calls until their urgency window.
    #[test]
    fn deferred_calls_are_released_by_deadline_capacity_and_mode() {
        use crate::delay::{CallId, DelayParams, Mode, ReleaseKind};
        let params = CoreParams {
            controller: ControllerParams {
                execute_scaling: false,
                ..controller_params(60)
            },
            placement: PlacementParams {
                zones: vec![concurrency("fn", ZoneKind::Cloud, 5)],
                policy: PlacementPolicy::EdgeFirst,
            },
            vm_boot_timeout: None,
        };
        let delay = DelayParams {
            busy_utilisation: 0.6,
            sample_interval: secs(1.0),
            window: secs(3.0),
            min_switch: secs(0.0),
            urgency_window: secs(8.0),
            release_batch: 3,
            deadline_margin: secs(2.0),
            expected_processing: secs(1.5),
            vm_slots: Some(2),
        };
        // ρ = 0.5 of r_max 2: one token, then one a second.
        let mut core = Core::new(params, libra(1), Box::new(VmFirst::new(0.5)))
            .with_delay_queue(Some(delay.clone()));
        let vm = core.adopt_ready_vm(Time::ZERO);
        core.start(Time::ZERO);
        while core.poll_action().is_some() {}
        let t0 = secs(0.01);
        let soon = t0 + delay.expected_processing + delay.deadline_margin - secs(0.5);
        core.enqueue_async(t0, CallId(9), soon, t0);
        for (i, d) in [100.0, 101.0, 102.0].into_iter().enumerate() {
            core.enqueue_async(t0, CallId(i as u128), secs(d), t0);
        }
        let r = core.poll_release().unwrap();
        assert_eq!((r.id, r.kind), (CallId(9), ReleaseKind::Forced));
        assert!(
            matches!(
                r.decision,
                Decision::Function {
                    reason: RouteReason::AsyncDeadline,
                    ..
                }
            ),
            "{:?}",
            r.decision
        );
        let r = core.poll_release().unwrap();
        assert_eq!((r.id, r.kind), (CallId(0), ReleaseKind::Idle));
        assert_eq!(r.decision.kind(), Some(AttemptKind::First));
        assert!(matches!(r.decision, Decision::Vm { vm: v, .. } if v == vm));
        assert!(core.poll_release().is_none(), "no token left");
        assert_eq!(core.controller().vms().get(vm).unwrap().outstanding, 1);
        // The next sample tick: a refilled token releases one more.
        assert_eq!(core.next_timer(), (Timer::DelayQueue, secs(1.0)));
        core.handle_timeout(secs(1.0));
        assert!(std::iter::from_fn(|| core.poll_action()).any(|a| a == Action::SampleCpu));
        assert!(
            core.poll_release().is_none(),
            "0.99 tokens: one a second since the token taken at 0.01 s"
        );
        core.handle_timeout(secs(2.0));
        let r = core.poll_release().unwrap();
        assert_eq!((r.id, r.kind), (CallId(1), ReleaseKind::Idle));
        // Busy: nothing until the last call's urgency window opens.
        core.on_cpu_sample(secs(2.0), 0.9);
        let st = core.status().delay.unwrap();
        assert_eq!((st.mode, st.queued), (Mode::Busy, 1));
        core.finish(secs(2.5), &mut r.ticket.clone());
        let urgent = secs(102.0) - delay.urgency_window;
        core.handle_timeout(urgent - secs(0.5));
        assert!(core.poll_release().is_none());
        core.handle_timeout(urgent);
        let r = core.poll_release().unwrap();
        assert_eq!((r.id, r.kind), (CallId(2), ReleaseKind::Urgent));
        let st = core.status();
        assert_eq!(st.delay.unwrap().queued, 0);
        assert_eq!(st.controller.routed.function, 1, "the forced call");
    }

    fn concurrency(name: &str, kind: ZoneKind, max: u32) -> ZoneParams {
        ZoneParams {
            name: name.into(),
            kind,
            capacity: ZoneCapacity::Concurrency {
                max_concurrency: Some(max),
            },
        }
    }

    fn ticket() -> Ticket {
        Ticket::new(
            RequestMeta {
                upgrade: false,
                idempotent: true,
            },
            None,
        )
    }

    fn not_sent(reason: N) -> Failure {
        Failure::NotSent {
            reason,
            request_available: true,
        }
    }

    #[test]
    fn a_call_no_zone_can_take_falls_back_to_a_vm_slot_then_is_rejected() {
        let (mut core, vm) = vm_and_zones(vec![concurrency("fn", ZoneKind::Cloud, 1)]);
        let t0 = secs(0.01);
        let mut a = ticket();
        assert!(matches!(
            core.route(t0, &mut a),
            Decision::Vm {
                kind: AttemptKind::First,
                reason: RouteReason::WithinBudget,
                ..
            }
        ));
        let mut b = ticket();
        let d = core.route(t0, &mut b);
        assert!(
            matches!(d, Decision::Function { kind: AttemptKind::First, lease, .. } if lease.start == Start::Untracked),
            "{d:?}"
        );
        let mut c = ticket();
        assert_eq!(
            core.route(t0, &mut c),
            Decision::Vm {
                vm,
                kind: AttemptKind::FallBack,
                reason: RouteReason::FallBackOverBudget
            },
            "the zone is at max_concurrency; the VM has a free slot but no token"
        );
        let mut d = ticket();
        assert_eq!(
            core.route(t0, &mut d),
            Decision::Reject {
                reason: RouteReason::SpillBackRejected
            },
            "zone full, the VM at its cap of 2"
        );
        let z = &core.status().zones[0];
        assert_eq!((z.busy, z.calls.unwrap().throttled), (1, 2));
    }

    /// Call scheduling §4 through the core: with the VM at its 2 slots and the zone at
    /// its 1 call, calls queue; each freed slot serves the queue's head in SEPT order
    /// (`E[p]` short 10 ms, long 300 ms); a full queue answers 503; a call past its longest
    /// wait leaves with `QueueTimedOut`; a cancelled one never gets a slot.
    #[test]
    fn saturated_calls_wait_and_are_served_shortest_expected_first() {
        use crate::sched::Order;
        let (core, vm) = vm_and_zones(vec![concurrency("fn", ZoneKind::Cloud, 1)]);
        let mut core = core.with_queue(
            Some(SchedParams {
                order: Order::Sept,
                max_queue_length: 3,
                max_queue_wait: Duration::from_secs(4),
                default_processing: Duration::from_millis(100),
                fair_choice_window: Duration::from_secs(60),
            }),
            Vec::new(),
            8,
        );
        let short = core.key_named("short");
        let long = core.key_named("long");
        for _ in 0..3 {
            core.on_call_completed(short, Duration::from_millis(10), Duration::from_millis(10));
            core.on_call_completed(long, Duration::from_millis(300), Duration::from_millis(300));
        }
        let t0 = secs(0.01);
        // VM (token), zone (its one call), VM fall-back (second slot): all busy.
        let mut busy: Vec<Ticket> = (0..3).map(|_| ticket().with_key(long)).collect();
        for t in &mut busy {
            assert!(!matches!(core.route(t0, t), Decision::Queue { .. }));
        }
        let mut l1 = ticket().with_key(long);
        let mut s1 = ticket().with_key(short);
        let mut s2 = ticket().with_key(short);
        for t in [&mut l1, &mut s1, &mut s2] {
            assert!(matches!(core.route(t0, t), Decision::Queue { .. }));
        }
        let mut extra = ticket().with_key(short);
        assert_eq!(
            core.route(t0, &mut extra),
            Decision::Reject {
                reason: RouteReason::QueueFull
            }
        );
        assert_eq!(core.next_timer(), (Timer::QueueWait, t0 + secs(4.0)));
        // s2 gives up while waiting: it leaves the queue.
        assert!(core.cancel_queued(t0, &mut s2));
        // The VM frees a slot: s1 (short) goes before l1, though l1 came first.
        core.finish(secs(0.5), &mut busy[0]);
        let served: Vec<_> = std::iter::from_fn(|| core.poll_action()).collect();
        assert_eq!(
            served,
            [Action::Dequeued {
                id: s1.queued().unwrap(),
                decision: Decision::Vm {
                    vm,
                    kind: AttemptKind::Dequeued,
                    reason: RouteReason::SpillBackRejected
                }
            }]
        );
        s1.on_dequeued(served_decision(&served[0]));
        assert_eq!(core.controller().vms().get(vm).unwrap().outstanding, 2);
        // The zone frees its call: l1 gets it.
        core.finish(secs(0.6), &mut busy[1]);
        let d = std::iter::from_fn(|| core.poll_action()).collect::<Vec<_>>();
        assert!(
            matches!(d.as_slice(), [Action::Dequeued { id, decision: Decision::Function { .. } }] if Some(*id) == l1.queued()),
            "{d:?}"
        );
        // A call left waiting times out at its deadline.
        let mut late = ticket().with_key(short);
        assert!(matches!(
            core.route(secs(1.0), &mut late),
            Decision::Queue { .. }
        ));
        core.handle_timeout(secs(4.99));
        assert_eq!(core.poll_action(), None);
        core.handle_timeout(secs(5.0));
        assert_eq!(
            core.poll_action(),
            Some(Action::QueueTimedOut {
                id: late.queued().unwrap()
            })
        );
        let q = core.status().queue.unwrap();
        assert_eq!((q.order, q.length), ("sept", 0));
    }

    fn served_decision(a: &Action) -> Decision {
        match a {
            Action::Dequeued { decision, .. } => *decision,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn failed_function_attempts_fall_through_the_zones_then_back_to_a_vm() {
        let (mut core, vm) = vm_and_zones(vec![
            concurrency("edge", ZoneKind::Edge, 5),
            concurrency("cloud", ZoneKind::Cloud, 5),
        ]);
        let t0 = secs(0.01);
        let mut first = ticket();
        let _ = core.route(t0, &mut first); // takes the only token
        let mut t = Ticket::new(RequestMeta::default(), Some(ZoneId(0)));
        let d = core.route(t0, &mut t);
        assert!(
            matches!(d, Decision::Function { lease, .. } if lease.zone == ZoneId(0)),
            "{d:?}"
        );
        let d = core.on_attempt_failed(t0, &mut t, not_sent(N::Throttled));
        assert!(
            matches!(d, Some(Decision::Function { lease, kind: AttemptKind::FallThrough, .. }) if lease.zone == ZoneId(1)),
            "a throttled edge falls through to the cloud: {d:?}"
        );
        let d = core.on_attempt_failed(t0, &mut t, not_sent(N::Unreachable));
        assert_eq!(
            d,
            Some(Decision::Vm {
                vm,
                kind: AttemptKind::FallBack,
                reason: RouteReason::FallBackOverBudget
            })
        );
        let st = core.status();
        assert_eq!(st.zones[0].calls.unwrap().throttled, 1, "the edge's 429");
        assert_eq!(
            (st.zones[0].busy, st.zones[1].busy),
            (0, 0),
            "slots released"
        );
        assert_eq!(st.controller.routed.function, 2, "two function attempts");
        // The fall-back VM refuses the connection: a retry, never on the failed VM; with
        // no other VM, every zone tried and the one fall-back spent, the answer is 503.
        let d = core.on_attempt_failed(t0, &mut t, not_sent(N::ConnectFailed));
        assert_eq!(
            d,
            Some(Decision::Reject {
                reason: RouteReason::SpillBackRejected
            })
        );
        // A fresh request: VM (a refilled token), connect failure → retry on the function
        // tier (no other VM), throttled there → back to a VM slot.
        let mut u = ticket();
        let t5 = secs(5.0);
        assert!(matches!(core.route(t5, &mut u), Decision::Vm { .. }));
        let kinds: Vec<_> = [N::ConnectFailed, N::Throttled]
            .into_iter()
            .map(|r| {
                core.on_attempt_failed(t5, &mut u, not_sent(r))
                    .and_then(|d| d.kind())
            })
            .collect();
        assert_eq!(
            kinds,
            [Some(AttemptKind::Retry), Some(AttemptKind::FallBack)]
        );
    }

    #[test]
    fn a_request_that_cannot_be_sent_again_gets_no_further_attempt() {
        let (mut core, vm) = vm_and_zones(vec![concurrency("fn", ZoneKind::Cloud, 1)]);
        let mut t = ticket();
        assert!(matches!(
            core.route(secs(0.01), &mut t),
            Decision::Vm { .. }
        ));
        let gone = Failure::NotSent {
            reason: N::ConnectFailed,
            request_available: false,
        };
        assert_eq!(core.on_attempt_failed(secs(0.02), &mut t, gone), None);
        assert_eq!(
            core.controller().vms().get(vm).unwrap().outstanding,
            0,
            "the failed attempt released its VM slot"
        );
    }

    #[test]
    fn after_send_only_idempotent_requests_without_a_response_byte_are_retried() {
        for (idempotent, response_started, available, retried) in [
            (true, false, true, true),
            (true, true, true, false),
            (false, false, true, false),
            (true, false, false, false),
        ] {
            let (mut core, _) = vm_and_zones(vec![concurrency("fn", ZoneKind::Cloud, 5)]);
            let mut t = Ticket::new(
                RequestMeta {
                    upgrade: false,
                    idempotent,
                },
                None,
            );
            assert!(matches!(
                core.route(secs(0.01), &mut t),
                Decision::Vm { .. }
            ));
            let failure = Failure::FailedAfterSend {
                response_started,
                request_available: available,
            };
            let next = core.on_attempt_failed(secs(0.02), &mut t, failure);
            assert_eq!(
                next.and_then(|d| d.kind()) == Some(AttemptKind::Retry),
                retried,
                "idempotent {idempotent}, response started {response_started}, available {available}: {next:?}"
            );
        }
    }

    #[test]
    fn retries_beyond_the_budget_get_no_further_attempt() {
        // Budget: 25 % of first attempts, no floor; every request fails after send.
        let (core, vm) = vm_and_zones(vec![concurrency("fn", ZoneKind::Cloud, 50)]);
        let ratio = 0.25;
        let mut core = core.with_retry_budget(crate::retry::RetryBudgetParams {
            ratio,
            window: Duration::from_secs(10_000),
            min_per_second: 0.0,
        });
        let failure = Failure::FailedAfterSend {
            response_started: false,
            request_available: true,
        };
        // One request after another, each failing on the VM: the model grants a retry
        // while retries + 1 ≤ ratio · first attempts.
        let (mut expected, mut retried, mut refused) = (0_u32, 0_u32, 0_u32);
        for i in 1..=12_u32 {
            let mut t = ticket();
            // One request per 60 s epoch: the VM has a token each time.
            let at = secs(60.0 * f64::from(i) + 0.5);
            if !matches!(core.route(at, &mut t), Decision::Vm { .. }) {
                continue;
            }
            if f64::from(expected + 1) <= ratio * f64::from(i) {
                expected += 1;
            }
            match core.on_attempt_failed(at, &mut t, failure) {
                Some(d) if d.kind() == Some(AttemptKind::Retry) => retried += 1,
                _ => refused += 1,
            }
            core.finish(at, &mut t);
        }
        assert_eq!(retried, expected);
        assert!(retried >= 1 && refused >= 1, "{retried} {refused}");
        assert_eq!(core.status().retry_budget.refused_total, u64::from(refused));
        let _ = vm;
    }

    fn faas(pool: FunctionPoolParams) -> Core {
        let params = CoreParams {
            controller: controller_params(60),
            placement: PlacementParams::single("fn", ZoneCapacity::Instances(pool)),
            vm_boot_timeout: None,
        };
        let mut core = Core::new(
            params,
            Box::new(FixedScaler::faas()),
            Box::new(FunctionOnly),
        );
        core.start(Time::ZERO);
        core
    }

    #[test]
    fn a_gone_instance_is_forgotten_and_the_call_placed_again_in_its_zone() {
        let mut core = faas(FunctionPoolParams {
            keep_alive: Duration::from_secs(30),
            max_instances: Some(3),
            prewarmed: 0,
            warm_order: WarmOrder::Newest,
        });
        let mut t = ticket();
        let Decision::Function { lease, .. } = core.route(secs(1.0), &mut t) else {
            panic!()
        };
        let Start::Cold(i0) = lease.start else {
            panic!()
        };
        core.on_instance_started(secs(1.5), lease.zone, i0);
        core.finish(secs(2.0), &mut t);
        let mut u = ticket();
        let d = core.route(secs(3.0), &mut u);
        assert!(matches!(d, Decision::Function { lease, .. } if lease.start == Start::Warm(i0)));
        let d = core.on_attempt_failed(secs(3.0), &mut u, not_sent(N::InstanceGone));
        let Some(Decision::Function {
            lease,
            kind: AttemptKind::Retry,
            ..
        }) = d
        else {
            panic!("{d:?}")
        };
        assert!(
            matches!(lease.start, Start::Cold(_)),
            "no warm instance left"
        );
        let z = &core.status().zones[0];
        assert_eq!(
            (z.starting, z.busy, z.idle),
            (1, 0, 0),
            "only the new instance is alive"
        );
    }

    #[test]
    fn keep_alive_expiries_move_the_deadline_earlier_than_the_epoch() {
        let mut core = faas(FunctionPoolParams {
            keep_alive: Duration::from_secs(2),
            max_instances: None,
            prewarmed: 0,
            warm_order: WarmOrder::Newest,
        });
        assert_eq!(core.next_timer(), (Timer::EpochEnd, secs(60.0)));
        let mut t = ticket();
        let Decision::Function { lease, .. } = core.route(secs(0.5), &mut t) else {
            panic!()
        };
        core.on_instance_started(secs(0.7), lease.zone, lease.instance().unwrap());
        core.on_function_finished(secs(1.25), lease);
        assert_eq!(core.next_timer(), (Timer::KeepAlive, secs(3.25)));
        core.handle_timeout(secs(3.25));
        assert_eq!(
            core.poll_action(),
            Some(Action::StopInstance {
                zone: lease.zone,
                instance: lease.instance().unwrap()
            })
        );
        assert_eq!(core.poll_timeout(), secs(60.0));
    }

    /// Adaptive r_max (LIBRA §III-B): VM response times at twice the target lower r_max
    /// at the period's end, before the scaling decision of the same boundary, which then
    /// divides by the new value; the budget cap is republished with it.
    #[test]
    fn an_adapted_r_max_sizes_the_pool_and_caps_the_budget() {
        use crate::rmax::RMaxParams;
        let params = CoreParams {
            controller: ControllerParams {
                monitor: MonitorParams {
                    epoch: Duration::from_secs(1),
                    alpha: 0.3,
                    beta: 0.2,
                    decision_epochs: 5,
                    first_decision_epoch: None,
                },
                r_max_rps: 10.0,
                execute_scaling: true,
            },
            placement: PlacementParams::single(
                "fn",
                ZoneCapacity::Concurrency {
                    max_concurrency: None,
                },
            ),
            vm_boot_timeout: None,
        };
        let scaler = LibraScaler::new(LibraScalingParams {
            phi: 1.5,
            r_max_rps: 10.0,
            min_vms: 1,
            max_vms: 20,
            cip_rps: 0.0,
        });
        let (kp, ki, kd) = (0.1, 0.45, 0.03);
        let adaptive = RMaxParams {
            start_rps: 10.0,
            target_quantile: 0.9,
            target: Duration::from_millis(100),
            kp,
            ki,
            kd,
            min_rps: 2.0,
            max_rps: 40.0,
            max_step_rps: 100.0,
            period: Duration::from_secs(5),
            min_load_fraction: 0.4,
        };
        let mut core = Core::new(params, Box::new(scaler), Box::new(VmFirst::new(0.8)))
            .with_adaptive_r_max(Some(adaptive));
        core.start(Time::ZERO);
        let Some(Action::Scaling(controller::Action::Launch { vm })) = core.poll_action() else {
            panic!("min_vms = 1 launches one VM")
        };
        core.on_vm_ready(Time::ZERO, vm);
        assert_eq!(core.next_timer(), (Timer::EpochEnd, secs(1.0)));
        // 30 requests/s for 5 s; every VM attempt answers in 200 ms (twice the target).
        let mut on_vm = 0;
        for i in 0..150 {
            let now = secs(f64::from(i) / 30.0);
            let mut t = ticket();
            if let Decision::Vm { .. } = core.route(now, &mut t) {
                on_vm += 1;
                core.on_vm_response_time(now, Duration::from_millis(200));
            }
            core.finish(now, &mut t);
        }
        assert!(on_vm >= 10, "enough samples for the p90: {on_vm}");
        while core.poll_action().is_some() {}
        core.handle_timeout(secs(5.0));
        // e = ln(100/200) (the histogram's 3 digits aside); first period, no derivative.
        let st = core.status();
        let last = st.r_max.unwrap().last.unwrap();
        let e = last.error.unwrap();
        assert!((e - 0.5f64.ln()).abs() < 1e-3, "{e}");
        let r = 10.0 * ((kp + ki) * e).exp();
        assert!((last.after_rps - r).abs() < 1e-9 && r < 7.0);
        assert_eq!(st.controller.r_max_rps, last.after_rps);
        // The decision at t = 5 s: avg 30, std 0 → vm_reqs 30, n = ceil(30 / 6.83) = 5
        // (with the static 10: 3).
        let decided: Vec<_> = std::iter::from_fn(|| core.poll_action())
            .filter_map(|a| match a {
                Action::Scaling(controller::Action::Decided { decision, .. }) => Some(decision),
                _ => None,
            })
            .collect();
        assert_eq!(decided.len(), 1);
        assert_eq!(decided[0].vm_reqs_rps, 30.0);
        assert_eq!(decided[0].target_vms, (30.0 / r).ceil() as u32);
        assert_eq!(decided[0].target_vms, 5);
        // One ready VM: budget min(30, 1 · r_max).
        assert_eq!(
            core.status().controller.published_vm_reqs_rps,
            last.after_rps
        );
        assert_eq!(core.next_timer(), (Timer::EpochEnd, secs(6.0)));
        assert_eq!(core.status().r_max.unwrap().next_adjustment, secs(10.0));
    }

    /// A core with `min_vms` 1, 60 s epochs and a 7 s boot timeout (not started).
    fn boot_timeout_core() -> Core {
        let params = CoreParams {
            controller: controller_params(60),
            placement: PlacementParams::single(
                "fn",
                ZoneCapacity::Concurrency {
                    max_concurrency: None,
                },
            ),
            vm_boot_timeout: Some(Duration::from_secs(7)),
        };
        Core::new(params, libra(1), Box::new(VmFirst::new(0.8)))
    }

    #[test]
    fn a_vm_past_its_boot_deadline_is_given_up() {
        let mut core = boot_timeout_core();
        core.start(secs(1.0));
        let Some(Action::Scaling(controller::Action::Launch { vm })) = core.poll_action() else {
            panic!("min_vms launches one VM")
        };
        assert_eq!(core.next_timer(), (Timer::VmBoot, secs(8.0)));
        core.handle_timeout(secs(7.9));
        assert_eq!(core.poll_action(), None, "not yet");
        core.handle_timeout(secs(8.0));
        assert_eq!(core.poll_action(), Some(Action::VmBootTimedOut { vm }));
        assert_eq!(core.controller().pool().booting, 0);
        assert_eq!(core.next_timer().0, Timer::EpochEnd);
        // A VM that becomes ready in time clears its deadline.
        let mut core2 = boot_timeout_core();
        core2.start(Time::ZERO);
        let Some(Action::Scaling(controller::Action::Launch { vm })) = core2.poll_action() else {
            panic!()
        };
        core2.on_vm_ready(secs(3.0), vm);
        assert_eq!(core2.next_timer(), (Timer::EpochEnd, secs(60.0)));
    }

    /// A new leader adopts an earlier leader's launch that is still booting before it
    /// writes the pool: the VM counts toward `min_vms`, so no VM is launched beside it;
    /// it gets the boot timeout from its adoption, and becomes ready like a launch.
    #[test]
    fn an_adopted_booting_vm_counts_toward_the_pool_and_has_a_boot_deadline() {
        let new = || {
            let mut core = boot_timeout_core();
            core.set_pool_writer(Time::ZERO, false);
            core.start(Time::ZERO);
            while core.poll_action().is_some() {}
            core
        };
        let mut core = new();
        let vm = core.adopt_booting_vm(secs(2.0));
        core.set_pool_writer(secs(2.0), true);
        assert_eq!(core.poll_action(), None, "no launch beside the adopted VM");
        let pool = core.controller().pool();
        assert_eq!((pool.booting, pool.ready, pool.target), (1, 0, 1));
        assert_eq!(core.next_timer(), (Timer::VmBoot, secs(9.0)));
        core.handle_timeout(secs(9.0));
        assert_eq!(core.poll_action(), Some(Action::VmBootTimedOut { vm }));
        assert_eq!(core.controller().pool().booting, 0);

        let mut core = new();
        let vm = core.adopt_booting_vm(secs(2.0));
        core.set_pool_writer(secs(2.0), true);
        core.on_vm_ready(secs(4.0), vm);
        assert_eq!(core.poll_action(), None);
        assert_eq!(core.controller().pool().ready, 1);
        assert_eq!(core.next_timer(), (Timer::EpochEnd, secs(60.0)));
        // Without it, the same core launches one VM as it starts writing the pool.
        let mut core = new();
        core.set_pool_writer(secs(2.0), true);
        assert!(matches!(
            core.poll_action(),
            Some(Action::Scaling(controller::Action::Launch { .. }))
        ));
    }
}
