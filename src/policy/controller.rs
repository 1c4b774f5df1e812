//! The controller: LIBRA's three components composed into one sans-IO state machine —
//! LIBRA §III (Fig. 2).
//!
//! The [`Controller`] owns the [`TrafficMonitor`], a [`ScalingPolicy`], a
//! [`RoutingPolicy`] and the [`VmTable`]. Drivers feed it events — requests
//! ([`Controller::route`]), finished VM requests, VM readiness and failures — and drain
//! [`Action`]s from [`Controller::poll_action`]: launch a VM, stop a VM, and an
//! informational record of every scaling decision. Epochs close lazily on any event at or
//! after [`Controller::poll_timeout`], or explicitly in [`Controller::handle_timeout`].
//!
//! Budget publication (LIBRA Alg. 1, line 6): the balancer's budget is always
//! `min(vm_reqs, ready_vms · r_max)`. A higher `vm_reqs` therefore reaches the balancer
//! only as the VMs that serve it become ready, and a lower one reaches it at once, before
//! any VM is drained.

use std::collections::VecDeque;

use super::balancer::{Attempt, RequestMeta, Route, RoutingPolicy, VmState, VmTable};
use super::monitor::{EpochClosed, MonitorParams, TrafficMonitor};
use super::scaling::{
    EpochObservation, IdleOutlook, IdleView, LibraScalingParams, PoolSnapshot, ScaleDecision,
    ScalingPolicy,
};
use super::shared::{CountSource, EpochCount, EwmaState};
use super::{Time, VmId};

/// Local epoch counts kept for the coordinator at most (older ones are dropped): an
/// hour of one-second epochs.
pub const MAX_PENDING_COUNTS: usize = 3600;

/// Parameters of the controller itself (the policies carry their own).
#[derive(Clone, Debug, PartialEq)]
pub struct ControllerParams {
    /// Traffic monitor parameters (epoch, α, β, K).
    pub monitor: MonitorParams,
    /// r_max, requests/s one VM serves within the SLA: caps the published budget at
    /// `ready_vms · r_max`. The start value when adaptive ([`Controller::set_r_max`]).
    pub r_max_rps: f64,
    /// `true`: scaling decisions launch and stop VMs. `false` (a `static` pool): decisions
    /// are computed and reported, the pool is what the driver adopted.
    pub execute_scaling: bool,
}

/// LIBRA's parameters a running controller can change without losing state (a
/// configuration reload): the monitor's smoothing and reporting
/// (LIBRA §III-A), the scaling manager's φ, r_max, VM bounds and CIP (§III-B) and the
/// balancer's ρ (§III-C). The epoch length and the budget rule are fixed for the
/// controller's life.
#[derive(Clone, Debug, PartialEq)]
pub struct LibraTuning {
    /// α: EWMA weight of the newest epoch count, 0–1.
    pub alpha: f64,
    /// β: EWMA weight of the newest deviation, 0–1.
    pub beta: f64,
    /// K: a scaling decision every K epochs (≥ 1).
    pub decision_epochs: u32,
    /// F: the first decision after F epochs (`None`: K).
    pub first_decision_epoch: Option<u32>,
    /// φ, r_max (requests/s), VM bounds and the CIP (requests/s).
    pub scaling: LibraScalingParams,
    /// ρ: the share of the VM budget sent to VMs, (0, 1].
    pub rho: f64,
}

/// Direction of a scaling decision relative to the previous target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScaleDirection {
    /// More VMs wanted.
    Up,
    /// Fewer VMs wanted.
    Down,
    /// Same target (the budget may still change).
    Hold,
}

impl ScaleDirection {
    /// Label value for metrics and logs: `"up"`, `"down"`, `"hold"`.
    pub fn as_str(self) -> &'static str {
        match self {
            ScaleDirection::Up => "up",
            ScaleDirection::Down => "down",
            ScaleDirection::Hold => "hold",
        }
    }
}

/// Work for the driver.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Action {
    /// Launch a VM; report [`Controller::on_vm_ready`] or [`Controller::on_vm_failed`].
    Launch {
        /// The id the controller allocated for it.
        vm: VmId,
    },
    /// The VM takes no new requests from now on; in-flight ones finish. Informational:
    /// the controller emits [`Action::Stop`] when its last request finished.
    Drain {
        /// The draining VM.
        vm: VmId,
    },
    /// Stop (terminate) the VM. It has no outstanding request. Report nothing back.
    Stop {
        /// The VM to stop.
        vm: VmId,
    },
    /// A scaling decision was taken (for logs and metrics).
    Decided {
        /// Index of the epoch whose end triggered it.
        epoch: u64,
        /// The decision.
        decision: ScaleDecision,
        /// Relative to the previous target.
        direction: ScaleDirection,
    },
}

/// Cumulative routing counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RoutedTotals {
    /// Attempts sent to VMs (first attempts, retries and spill-backs).
    pub vm: u64,
    /// Attempts sent to the function tier.
    pub function: u64,
    /// Requests answered 503 by the balancer.
    pub rejected: u64,
}

/// A snapshot for `/status`, logs and the simulator's per-epoch series. Rates in
/// requests/s.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ControllerStatus {
    /// Index of the last completed epoch (`None` before the first one closed).
    pub epoch: Option<u64>,
    /// EWMA request rate after the last completed epoch, requests/s.
    pub avg_rps: f64,
    /// EWMA absolute deviation after the last completed epoch, requests/s.
    pub std_rps: f64,
    /// Requests counted in the last completed epoch.
    pub last_epoch_requests: u64,
    /// The last decided `vm_reqs`, requests/s.
    pub vm_reqs_rps: f64,
    /// The budget the balancer uses now, `min(vm_reqs, ready · r_max)`, requests/s.
    pub published_vm_reqs_rps: f64,
    /// VM pool counts and target.
    pub pool: PoolSnapshot,
    /// Cumulative routing counters.
    pub routed: RoutedTotals,
    /// r_max in force, requests/s (static, or the adaptive controller's current value).
    pub r_max_rps: f64,
}

/// LIBRA's composition of monitor, scaling manager and balancer. See the
/// [module docs](self).
pub struct Controller {
    params: ControllerParams,
    monitor: TrafficMonitor,
    scaler: Box<dyn ScalingPolicy>,
    router: Box<dyn RoutingPolicy>,
    vms: VmTable,
    next_vm: u64,
    target: u32,
    vm_reqs: f64,
    published: f64,
    actions: VecDeque<Action>,
    routed: RoutedTotals,
    epoch_vm: u64,
    epoch_function: u64,
    epoch_utilisation: Option<f64>,
    /// Several replicas (`policy::shared`): where the monitor's counts come from.
    count_source: CountSource,
    /// [`CountSource::Aggregate`]: the local epoch being counted and the closed ones
    /// the coordinator has not taken yet.
    local: LocalEpochs,
    /// The budget share of this replica (1 alone), `policy::shared`.
    share: f64,
    /// Whether decisions launch and stop VMs here (only the leader of several replicas).
    pool_writer: bool,
    /// Decisions of epochs before this index never lower the target below the active
    /// VMs (a new leader without state).
    scale_in_hold_until: u64,
}

/// The local epoch grid under [`CountSource::Aggregate`].
#[derive(Clone, Debug, Default)]
struct LocalEpochs {
    epoch: u64,
    count: u64,
    ends_at: Time,
    counted: VecDeque<EpochCount>,
}

impl Controller {
    /// A controller at time zero with an empty pool. Call [`Self::start`] next.
    pub fn new(
        params: ControllerParams,
        scaler: Box<dyn ScalingPolicy>,
        router: Box<dyn RoutingPolicy>,
    ) -> Self {
        let monitor = TrafficMonitor::new(params.monitor.clone());
        Self {
            params,
            monitor,
            scaler,
            router,
            vms: VmTable::default(),
            next_vm: 0,
            target: 0,
            vm_reqs: 0.0,
            published: 0.0,
            actions: VecDeque::new(),
            routed: RoutedTotals::default(),
            epoch_vm: 0,
            epoch_function: 0,
            epoch_utilisation: None,
            count_source: CountSource::Local,
            local: LocalEpochs::default(),
            share: 1.0,
            pool_writer: true,
            scale_in_hold_until: 0,
        }
    }

    /// Apply the scaling policy's initial decision (e.g. launch `min_vms`). In a
    /// report-only (`static`) pool the initial budget is the adopted VMs' capacity.
    pub fn start(&mut self, now: Time) {
        let initial = self.scaler.initial();
        self.apply(now, 0, initial, false);
        if !self.params.execute_scaling {
            self.vm_reqs = f64::INFINITY;
            self.publish(now);
        }
    }

    /// Register a VM that is already ready (a `static` upstream, or an instance adopted
    /// after a restart). Returns its id.
    pub fn adopt_ready_vm(&mut self, now: Time) -> VmId {
        self.advance(now);
        let vm = self.alloc();
        self.vms.insert(vm, VmState::Ready);
        if self.writes_pool() {
            self.target = self.target.max(self.active());
        }
        self.publish(now);
        vm
    }

    /// Register a VM that is already booting and that this controller did not launch (a
    /// new leader of several replicas found an earlier leader's launch still booting).
    /// It counts toward the pool like a launch of its own, so that no VM is launched
    /// beside it; when this controller writes the pool the target is raised to the
    /// active VMs (as for [`Self::adopt_ready_vm`]). [`Self::on_vm_ready`] or
    /// [`Self::on_vm_failed`] follows as for a launch. Returns its id.
    pub fn adopt_booting_vm(&mut self, now: Time) -> VmId {
        self.advance(now);
        let vm = self.alloc();
        self.vms.insert(vm, VmState::Booting);
        if self.writes_pool() {
            self.target = self.target.max(self.active());
        }
        vm
    }

    /// Route one attempt of a request. First attempts are counted by the traffic monitor.
    /// A [`Route::Vm`] counts as outstanding on that VM until
    /// [`Self::on_vm_request_finished`].
    pub fn route(&mut self, now: Time, req: &RequestMeta, attempt: Attempt) -> Route {
        self.advance(now);
        if attempt == Attempt::First {
            self.count_request(now);
        }
        let route = self.router.route(now, req, attempt, &self.vms);
        match route {
            Route::Vm { vm, .. } => {
                self.vms.add_outstanding(vm, 1);
                self.routed.vm += 1;
                if attempt == Attempt::First {
                    self.epoch_vm += 1;
                }
            }
            Route::Function { .. } => {
                self.routed.function += 1;
                self.epoch_function += 1;
            }
            Route::Reject { .. } => self.routed.rejected += 1,
        }
        route
    }

    /// A VM slot for a call leaving the gateway queue (call scheduling): the routing
    /// policy's fall-back rule (a ready VM with a free slot, token or not). Counted like
    /// a routed VM attempt when granted; nothing is counted otherwise (the queue asks
    /// after every event).
    pub fn try_vm_slot(&mut self, now: Time, req: &RequestMeta) -> Option<VmId> {
        self.advance(now);
        match self.router.route(now, req, Attempt::SpillBack, &self.vms) {
            Route::Vm { vm, .. } => {
                self.vms.get_mut(vm)?.outstanding += 1;
                self.routed.vm += 1;
                Some(vm)
            }
            Route::Function { .. } | Route::Reject { .. } => None,
        }
    }

    /// An idle-mode release of a deferred asynchronous call (ProFaaStinate §3): the
    /// least-loaded ready VM if it has a free slot (below `slots`, when given) and the
    /// routing policy gives a token. Admitted calls are counted by the traffic monitor
    /// (async calls count at release: that is when they load the pool) and as outstanding
    /// on the VM like [`Self::route`]'s VM decisions. `None`: no VM may take it now.
    pub fn admit_deferred(&mut self, now: Time, slots: Option<u32>) -> Option<VmId> {
        self.advance(now);
        let row = self.vms.least_loaded_ready(None)?;
        let vm = row.id;
        if slots.is_some_and(|cap| row.outstanding >= cap) {
            return None;
        }
        if !self.router.take_deferred_token(now) {
            return None;
        }
        self.count_request(now);
        if let Some(mut row) = self.vms.get_mut(vm) {
            row.outstanding += 1;
        }
        self.routed.vm += 1;
        self.epoch_vm += 1;
        Some(vm)
    }

    /// A released asynchronous call goes to the function tier without a balancer
    /// decision (forced by its deadline, or no VM is ready): counted by the traffic
    /// monitor and as a function request.
    pub fn count_deferred_function(&mut self, now: Time) {
        self.advance(now);
        self.count_request(now);
        self.routed.function += 1;
        self.epoch_function += 1;
    }

    /// Count one more function attempt that did not come from [`Self::route`] (a call
    /// falling through to another function zone).
    pub fn count_function_attempt(&mut self) {
        self.routed.function += 1;
    }

    /// A request routed to `vm` finished (any outcome). Emits [`Action::Stop`] when a
    /// draining VM becomes idle.
    pub fn on_vm_request_finished(&mut self, now: Time, vm: VmId) {
        self.advance(now);
        let Some((state, outstanding)) = self.vms.add_outstanding(vm, -1) else {
            return;
        };
        if state == VmState::Draining && outstanding == 0 {
            self.vms.remove(vm);
            self.actions.push_back(Action::Stop { vm });
        }
    }

    /// A VM attempt failed (`suspect: true`): no new request goes to `vm` until a probe
    /// clears it (`false`) or it dies ([`Self::on_vm_died`]).
    pub fn set_vm_suspect(&mut self, now: Time, vm: VmId, suspect: bool) {
        self.advance(now);
        if let Some(mut row) = self.vms.get_mut(vm) {
            row.suspect = suspect;
        }
    }

    /// A launched VM passed its readiness check.
    pub fn on_vm_ready(&mut self, now: Time, vm: VmId) {
        self.advance(now);
        let became_ready = match self.vms.get_mut(vm) {
            Some(mut row) if row.state == VmState::Booting => {
                row.state = VmState::Ready;
                true
            }
            _ => false,
        };
        if became_ready {
            self.publish(now);
        }
    }

    /// A VM failed: its launch failed or timed out, or it died. It is forgotten; the next
    /// scaling decision replaces it. The driver cleans up whatever the provider left.
    pub fn on_vm_failed(&mut self, now: Time, vm: VmId) {
        self.advance(now);
        if self.vms.remove(vm).is_some() {
            self.publish(now);
        }
    }

    /// A ready VM died (failed its health probes, refused connections): it is forgotten
    /// and, when scaling is executed, replaced at once up to the target instead of
    /// waiting for the next scaling decision. A launch or boot failure
    /// is [`Self::on_vm_failed`] instead, so a failing image does not relaunch in a loop.
    pub fn on_vm_died(&mut self, now: Time, vm: VmId) {
        self.advance(now);
        if self.vms.remove(vm).is_none() {
            return;
        }
        if self.writes_pool() {
            for _ in self.active()..self.target {
                let vm = self.alloc();
                self.vms.insert(vm, VmState::Booting);
                self.actions.push_back(Action::Launch { vm });
            }
        }
        self.publish(now);
    }

    /// The driver measured the mean VM utilisation (0–1) of the epoch that is open; it is
    /// passed to the scaling policy when the epoch closes.
    pub fn set_vm_utilisation(&mut self, utilisation: f64) {
        self.epoch_utilisation = Some(utilisation);
    }

    /// When the open epoch ends (under [`CountSource::Aggregate`]: the local epoch
    /// whose count the coordinator takes next).
    pub fn poll_timeout(&self) -> Time {
        match self.count_source {
            CountSource::Local => self.monitor.poll_timeout(),
            CountSource::Aggregate => self.local.ends_at,
        }
    }

    /// Close every epoch that ended at or before `now` and run the scaling policy.
    pub fn handle_timeout(&mut self, now: Time) {
        self.advance(now);
    }

    /// Next action for the driver, in the order they were decided.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// The VM table (read-only).
    pub fn vms(&self) -> &VmTable {
        &self.vms
    }

    /// Counts per VM state plus the target.
    pub fn pool(&self) -> PoolSnapshot {
        PoolSnapshot {
            booting: self.vms.count(VmState::Booting),
            ready: self.vms.count(VmState::Ready),
            draining: self.vms.count(VmState::Draining),
            target: self.target,
        }
    }

    /// A snapshot of monitor, scaling and routing state.
    pub fn status(&self) -> ControllerStatus {
        let last = self.monitor.last_closed();
        ControllerStatus {
            epoch: last.map(|e| e.epoch),
            avg_rps: last.map_or(0.0, |e| e.avg_rps),
            std_rps: last.map_or(0.0, |e| e.std_rps),
            last_epoch_requests: last.map_or(0, |e| e.requests),
            vm_reqs_rps: self.vm_reqs,
            published_vm_reqs_rps: self.published,
            pool: self.pool(),
            routed: self.routed,
            r_max_rps: self.params.r_max_rps,
        }
    }

    /// r_max in force, requests/s.
    pub fn r_max(&self) -> f64 {
        self.params.r_max_rps
    }

    /// Use a new r_max (LIBRA §III-B, adapted by `policy::rmax`): the budget cap
    /// `ready · r_max` is republished at once (a lower r_max spills more before any VM is
    /// added), and the scaling policy sizes its next decision with it.
    pub fn set_r_max(&mut self, now: Time, r_max_rps: f64) {
        self.params.r_max_rps = r_max_rps;
        self.scaler.set_r_max(r_max_rps);
        self.publish(now);
    }

    /// LIBRA's parameters in force; `None` when the scaling or routing policy is a
    /// baseline without them.
    pub fn tuning(&self) -> Option<LibraTuning> {
        let m = self.monitor.params();
        Some(LibraTuning {
            alpha: m.alpha,
            beta: m.beta,
            decision_epochs: m.decision_epochs,
            first_decision_epoch: m.first_decision_epoch,
            scaling: self.scaler.libra_params()?,
            rho: self.router.rho()?,
        })
    }

    /// Use new LIBRA parameters from `now` on: epochs that ended
    /// before `now` close under the old ones; the EWMAs, the VM table, the target, the
    /// balancer's tokens and the routing counters are kept. The budget is republished at
    /// once with the new ρ and r_max; φ, the VM bounds and the CIP shape the next
    /// scaling decision. `false` (nothing changed): a baseline policy without these
    /// parameters.
    pub fn retune(&mut self, now: Time, tuning: &LibraTuning) -> bool {
        if self.scaler.libra_params().is_none() || self.router.rho().is_none() {
            return false;
        }
        self.advance(now);
        self.monitor.retune(MonitorParams {
            epoch: self.params.monitor.epoch,
            alpha: tuning.alpha,
            beta: tuning.beta,
            decision_epochs: tuning.decision_epochs,
            first_decision_epoch: tuning.first_decision_epoch,
        });
        self.params.monitor = self.monitor.params().clone();
        self.params.r_max_rps = tuning.scaling.r_max_rps;
        self.scaler.set_libra_params(&tuning.scaling);
        self.router.set_rho(tuning.rho);
        // Republish even when the budget before ρ is unchanged: ρ may have moved.
        self.published = f64::NAN;
        self.publish(now);
        true
    }

    /// Take the monitor's counts from `source` from `now` on (several replicas,
    /// `policy::shared`). To [`CountSource::Aggregate`]: the epochs ended by `now` close
    /// as before; the open epoch's count so far moves to the local count, which comes
    /// out per epoch from [`Self::poll_epoch_count`]; the monitor closes an epoch only in
    /// [`Self::on_aggregate_count`]. Back to [`CountSource::Local`]: the epochs that got
    /// no sum close with the last sum (0 before any), and the monitor counts and closes
    /// on its own again from the open epoch on (what was counted in it stays counted).
    pub fn set_count_source(&mut self, now: Time, source: CountSource) {
        self.advance(now);
        if source == self.count_source {
            return;
        }
        match source {
            CountSource::Aggregate => {
                let epoch = self.monitor.current_epoch();
                let count = self.monitor.current_epoch_requests();
                self.local = LocalEpochs {
                    epoch,
                    count,
                    ends_at: self.monitor.epoch_start(epoch + 1),
                    counted: VecDeque::new(),
                };
                // The monitor's own count is now the local one's.
                self.monitor.take_open_count();
            }
            CountSource::Local => {
                // Epochs no sum arrived for close with the last sum (as a gap does in
                // `on_aggregate_count`), so the monitor's grid is the clock's again.
                let last = self.monitor.last_closed().map_or(0, |e| e.requests);
                while self.monitor.current_epoch() < self.local.epoch {
                    let closed = self.monitor.close_with(last);
                    self.on_closed_at(closed, now);
                }
                for _ in 0..self.local.count {
                    self.monitor.on_request(now);
                }
                self.local = LocalEpochs::default();
            }
        }
        self.count_source = source;
        self.advance(now);
    }

    /// Where the monitor's counts come from.
    pub fn count_source(&self) -> CountSource {
        self.count_source
    }

    /// The next local epoch count for the coordinator, oldest first (only under
    /// [`CountSource::Aggregate`]; at most [`MAX_PENDING_COUNTS`] are kept).
    pub fn poll_epoch_count(&mut self) -> Option<EpochCount> {
        self.local.counted.pop_front()
    }

    /// Requests counted so far in the local epoch that is open, and its index (under
    /// [`CountSource::Local`]: the monitor's open epoch).
    pub fn open_epoch(&self) -> EpochCount {
        match self.count_source {
            CountSource::Local => EpochCount {
                epoch: self.monitor.current_epoch(),
                requests: self.monitor.current_epoch_requests(),
            },
            CountSource::Aggregate => EpochCount {
                epoch: self.local.epoch,
                requests: self.local.count,
            },
        }
    }

    /// The sum of every replica's count for `epoch` (LIBRA §III-A over several
    /// replicas): the monitor closes `epoch` with `requests` and the scaling policy
    /// decides on it as at a local epoch end, at `now`. Epochs between the monitor's
    /// open one and `epoch` that got no sum close with the same `requests` (imputed).
    /// `false`, nothing done: not [`CountSource::Aggregate`], `epoch` already closed,
    /// or not ended yet on the local clock.
    pub fn on_aggregate_count(&mut self, now: Time, epoch: u64, requests: u64) -> bool {
        self.advance(now);
        if self.count_source != CountSource::Aggregate
            || epoch < self.monitor.current_epoch()
            || epoch >= self.local.epoch
        {
            return false;
        }
        while self.monitor.current_epoch() <= epoch {
            let closed = self.monitor.close_with(requests);
            self.on_closed_at(closed, now);
        }
        true
    }

    /// A scaling decision taken elsewhere (the leader of several replicas,
    /// `policy::shared`), for epoch `epoch`: the target and `vm_reqs` in force from
    /// `now`, with an [`Action::Decided`] record. Launches and drains VMs only where
    /// [`Self::set_pool_writer`] is on.
    pub fn apply_decision(&mut self, now: Time, epoch: u64, decision: ScaleDecision) {
        self.advance(now);
        self.apply(now, epoch, decision, true);
    }

    /// Whether this replica's decisions launch and stop VMs (default on; off for a
    /// follower of several replicas and while cut off from them: the pool is frozen).
    /// Turned on, the pool is brought to the target at once (launches or drains);
    /// without a pool it executes (`static`), nothing changes.
    pub fn set_pool_writer(&mut self, now: Time, writer: bool) {
        self.advance(now);
        let was = self.writes_pool();
        self.pool_writer = writer;
        if !was && self.writes_pool() {
            self.reconcile(now);
        }
    }

    /// Whether decisions launch and stop VMs here.
    pub fn is_pool_writer(&self) -> bool {
        self.pool_writer
    }

    /// This replica's share of the VM budget, 0–1 (LIBRA §III-C over several replicas:
    /// the balancer admits `share · ρ · min(vm_reqs, ready · r_max)`). Republished at
    /// once. NaN or out of range is clamped (NaN: 1).
    pub fn set_budget_share(&mut self, now: Time, share: f64) {
        self.advance(now);
        self.share = if share.is_nan() {
            1.0
        } else {
            share.clamp(0.0, 1.0)
        };
        self.publish(now);
    }

    /// The budget share in force.
    pub fn budget_share(&self) -> f64 {
        self.share
    }

    /// Decisions of the next `epochs` epochs (after the monitor's open one) never
    /// lower the target below the VMs active (a new leader that found no state:
    /// its first EWMAs would release VMs the load still needs). `0` ends a hold.
    pub fn hold_scale_in(&mut self, epochs: u64) {
        self.scale_in_hold_until = self.monitor.current_epoch().saturating_add(epochs);
    }

    /// The monitor's EWMAs after the last closed epoch (for the next leader).
    pub fn ewma_state(&self) -> Option<EwmaState> {
        self.monitor.ewma_state()
    }

    /// Resume the monitor from `state` (see [`TrafficMonitor::restore`]); a local epoch
    /// count already counted stays.
    pub fn restore_ewma(&mut self, state: &EwmaState) {
        self.monitor.restore(state);
    }

    /// A VM of the registry left the pool (another replica drains it): it takes no new
    /// request; [`Action::Drain`] now and [`Action::Stop`] when its last request here
    /// finished (for a VM this replica did not launch, Stop means forget it).
    pub fn drain_vm(&mut self, now: Time, vm: VmId) {
        self.advance(now);
        let Some(mut row) = self.vms.get_mut(vm) else {
            return;
        };
        if row.state == VmState::Draining {
            return;
        }
        row.state = VmState::Draining;
        let outstanding = row.outstanding;
        drop(row);
        self.actions.push_back(Action::Drain { vm });
        if outstanding == 0 {
            self.vms.remove(vm);
            self.actions.push_back(Action::Stop { vm });
        }
        self.publish(now);
    }

    fn writes_pool(&self) -> bool {
        self.params.execute_scaling && self.pool_writer
    }

    #[inline]
    fn count_request(&mut self, now: Time) {
        match self.count_source {
            CountSource::Local => self.monitor.on_request(now),
            CountSource::Aggregate => self.local.count += 1,
        }
    }

    /// Close the local epochs ended by `now` into [`Self::poll_epoch_count`]'s queue.
    fn roll_local(&mut self, now: Time) {
        while now >= self.local.ends_at {
            if self.local.counted.len() == MAX_PENDING_COUNTS {
                self.local.counted.pop_front();
            }
            self.local.counted.push_back(EpochCount {
                epoch: self.local.epoch,
                requests: std::mem::take(&mut self.local.count),
            });
            self.local.epoch += 1;
            self.local.ends_at = self.monitor.epoch_start(self.local.epoch + 1);
        }
    }

    /// The traffic monitor (read-only).
    pub fn monitor(&self) -> &TrafficMonitor {
        &self.monitor
    }

    fn alloc(&mut self) -> VmId {
        let vm = VmId(self.next_vm);
        self.next_vm += 1;
        vm
    }

    fn active(&self) -> u32 {
        self.vms
            .rows()
            .iter()
            .filter(|r| r.state != VmState::Draining)
            .count() as u32
    }

    #[inline]
    fn advance(&mut self, now: Time) {
        if self.count_source == CountSource::Aggregate {
            self.roll_local(now);
            return;
        }
        while now >= self.monitor.poll_timeout() {
            let Some(closed) = self.monitor.handle_timeout(now) else {
                break;
            };
            self.on_closed(closed);
        }
    }

    /// The monitor closed `closed`: show it to the scaling policy and apply its decision
    /// at the epoch's end.
    fn on_closed(&mut self, closed: EpochClosed) {
        let end = self.monitor.epoch_start(closed.epoch + 1);
        self.on_closed_at(closed, end);
    }

    /// [`Self::on_closed`] with the decision applied at `at`.
    fn on_closed_at(&mut self, closed: EpochClosed, at: Time) {
        let obs = EpochObservation {
            traffic: closed,
            epoch: self.params.monitor.epoch,
            vm_requests: std::mem::take(&mut self.epoch_vm),
            function_requests: std::mem::take(&mut self.epoch_function),
            vm_utilisation: self.epoch_utilisation.take(),
            pool: self.pool(),
        };
        if let Some(decision) = self.scaler.on_epoch(at, &obs) {
            self.apply(at, closed.epoch, decision, true);
        }
    }

    /// Close the open epoch and every later one that ends at or before `until`, as if
    /// no further request arrived and the driver reported `utilisation` before each
    /// ([`Self::set_vm_utilisation`]; `None`: not measured) — the same state, decisions
    /// and launch/stop actions as [`Self::handle_timeout`] at each end (the
    /// simulator skips the idle stretches of a sparse trace). Returns the number of
    /// epochs closed.
    ///
    /// Epochs are closed one by one until the scaling policy's
    /// [`ScalingPolicy::idle_outlook`] is settled and its repeated decision changes
    /// nothing (same target and budget, the pool at its target); then all remaining ones
    /// at once ([`TrafficMonitor::close_empty_epochs`], O(1)), without the informational
    /// [`Action::Decided`] records of their no-op reports. Stops after an epoch whose
    /// decision launched, drained or stopped a VM, so the driver acts at that epoch's end
    /// ([`Self::poll_timeout`] tells which epoch is open).
    pub fn close_idle_epochs(&mut self, until: Time, utilisation: Option<f64>) -> u64 {
        if self.count_source == CountSource::Aggregate {
            // Epochs close on the coordinator's sums, not on the clock: none here.
            self.advance(until);
            return 0;
        }
        let mut closed = 0;
        while self.monitor.poll_timeout() <= until {
            if let Some(n) = self.fast_forward(until, utilisation) {
                return closed + n;
            }
            self.epoch_utilisation = utilisation;
            let queued = self.actions.len();
            let Some(epoch) = self.monitor.handle_timeout(until) else {
                break;
            };
            self.on_closed(epoch);
            closed += 1;
            if self
                .actions
                .iter()
                .skip(queued)
                .any(|a| !matches!(a, Action::Decided { .. }))
            {
                break;
            }
        }
        closed
    }

    /// All idle epochs ending by `until` at once, if the scaling policy is settled and its
    /// decision changes nothing.
    fn fast_forward(&mut self, until: Time, utilisation: Option<f64>) -> Option<u64> {
        if self.monitor.current_epoch_requests() > 0 || self.epoch_vm > 0 || self.epoch_function > 0
        {
            return None;
        }
        let last = *self.monitor.last_closed()?;
        let epoch = self.params.monitor.epoch.as_nanos();
        let ends = (until.as_nanos() / epoch) as u64;
        let n = ends.checked_sub(self.monitor.current_epoch())?;
        if n < 2 {
            return None;
        }
        let view = IdleView {
            first_end: self.monitor.poll_timeout(),
            avg_rps: last.avg_rps,
            std_rps: last.std_rps,
            traffic_settled: self.monitor.idle_settled(),
            vm_utilisation: utilisation,
            pool: self.pool(),
        };
        match self.scaler.idle_outlook(&view) {
            IdleOutlook::Unsettled => return None,
            IdleOutlook::Settled(None) => {}
            IdleOutlook::Settled(Some(d)) => {
                let same_budget = d.vm_reqs_rps == self.vm_reqs
                    || (d.vm_reqs_rps.is_nan() && self.vm_reqs.is_nan());
                let pool_at_target = !self.params.execute_scaling || self.active() == d.target_vms;
                if d.target_vms != self.target || !same_budget || !pool_at_target {
                    return None;
                }
            }
        }
        self.monitor.close_empty_epochs(n);
        self.epoch_utilisation = None;
        Some(n)
    }

    fn apply(&mut self, now: Time, epoch: u64, mut decision: ScaleDecision, record: bool) {
        if epoch < self.scale_in_hold_until {
            decision.target_vms = decision.target_vms.max(self.active());
        }
        let direction = match decision.target_vms.cmp(&self.target) {
            std::cmp::Ordering::Greater => ScaleDirection::Up,
            std::cmp::Ordering::Less => ScaleDirection::Down,
            std::cmp::Ordering::Equal => ScaleDirection::Hold,
        };
        self.target = decision.target_vms;
        self.vm_reqs = decision.vm_reqs_rps;
        // A lower budget reaches the balancer before any VM drains.
        self.publish(now);
        if record {
            self.actions.push_back(Action::Decided {
                epoch,
                decision,
                direction,
            });
        }
        if !self.writes_pool() {
            return;
        }
        self.reconcile(now);
    }

    /// Launch or drain VMs until the active ones match the target.
    fn reconcile(&mut self, now: Time) {
        let active = self.active();
        if self.target > active {
            for _ in active..self.target {
                let vm = self.alloc();
                self.vms.insert(vm, VmState::Booting);
                self.actions.push_back(Action::Launch { vm });
            }
        } else if self.target < active {
            let mut excess = active - self.target;
            // Cancel VMs that are still booting first (newest first): they serve nobody.
            let booting: Vec<VmId> = self
                .vms
                .rows()
                .iter()
                .rev()
                .filter(|r| r.state == VmState::Booting)
                .map(|r| r.id)
                .take(excess as usize)
                .collect();
            for vm in booting {
                self.vms.remove(vm);
                self.actions.push_back(Action::Stop { vm });
                excess -= 1;
            }
            // Then drain the ready VMs with the fewest outstanding requests.
            while excess > 0 {
                let Some(vm) = self.vms.least_outstanding_ready(None) else {
                    break;
                };
                let mut row = self.vms.get_mut(vm).expect("row exists");
                row.state = VmState::Draining;
                let outstanding = row.outstanding;
                drop(row);
                self.actions.push_back(Action::Drain { vm });
                if outstanding == 0 {
                    self.vms.remove(vm);
                    self.actions.push_back(Action::Stop { vm });
                }
                excess -= 1;
            }
            self.publish(now);
        }
    }

    /// Hand the balancer its VM budget: `min(vm_reqs, ready · r_max)` (LIBRA §III-C);
    /// in a report-only (`static`) pool the always-on VMs' whole capacity, whatever the
    /// decision — below the CIP too. Either times this replica's budget share (1 for
    /// one gateway).
    fn publish(&mut self, now: Time) {
        let capacity = f64::from(self.vms.count(VmState::Ready)) * self.params.r_max_rps;
        let budget = self.share
            * if self.params.execute_scaling {
                self.vm_reqs.min(capacity)
            } else {
                capacity
            };
        if budget != self.published {
            self.published = budget;
            self.router.set_vm_budget(now, budget);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::balancer::{RouteReason, VmFirst};
    use crate::scaling::{LibraScaler, LibraScalingParams};
    use std::time::Duration;

    fn controller(min_vms: u32, cip: f64) -> Controller {
        let params = ControllerParams {
            monitor: MonitorParams {
                epoch: Duration::from_secs(1),
                alpha: 0.5,
                beta: 0.5,
                decision_epochs: 2,
                first_decision_epoch: None,
            },
            r_max_rps: 10.0,
            execute_scaling: true,
        };
        let scaler = LibraScaler::new(LibraScalingParams {
            phi: 1.0,
            r_max_rps: 10.0,
            min_vms,
            max_vms: 8,
            cip_rps: cip,
        });
        let mut c = Controller::new(params, Box::new(scaler), Box::new(VmFirst::new(0.8)));
        c.start(Time::ZERO);
        c
    }

    fn actions(c: &mut Controller) -> Vec<Action> {
        std::iter::from_fn(|| c.poll_action()).collect()
    }

    fn send(c: &mut Controller, second: u64, n: u64) -> Vec<Route> {
        (0..n)
            .map(|i| {
                let now = Duration::from_secs(second) + Duration::from_millis(i * 1000 / n.max(1));
                c.route(now, &RequestMeta::default(), Attempt::First)
            })
            .collect()
    }

    #[test]
    fn scales_out_and_publishes_the_budget_only_when_vms_are_ready() {
        let mut c = controller(0, 1.0);
        assert!(actions(&mut c).is_empty(), "min_vms = 0 launches nothing");
        send(&mut c, 0, 30);
        send(&mut c, 1, 30);
        c.handle_timeout(Duration::from_secs(2));
        // avg = 30 req/s, std = 0.5·|30−30| = 0 → vm_reqs = 30 → 3 VMs.
        let a = actions(&mut c);
        let launched: Vec<VmId> = a
            .iter()
            .filter_map(|a| match a {
                Action::Launch { vm } => Some(*vm),
                _ => None,
            })
            .collect();
        assert_eq!(launched.len(), 3);
        assert!(matches!(
            a[0],
            Action::Decided {
                direction: ScaleDirection::Up,
                ..
            }
        ));
        let st = c.status();
        assert_eq!((st.vm_reqs_rps, st.published_vm_reqs_rps), (30.0, 0.0));
        // While VMs boot everything spills.
        assert!(
            send(&mut c, 2, 5)
                .iter()
                .all(|r| matches!(r, Route::Function { .. }))
        );
        c.on_vm_ready(Duration::from_millis(2500), launched[0]);
        assert_eq!(
            c.status().published_vm_reqs_rps,
            10.0,
            "one ready VM = 10 req/s"
        );
        c.on_vm_ready(Duration::from_millis(2600), launched[1]);
        c.on_vm_ready(Duration::from_millis(2700), launched[2]);
        assert_eq!(c.status().published_vm_reqs_rps, 30.0);
    }

    /// A reload's new φ, α, ρ and r_max: the EWMAs carry on from the
    /// old values, the next decision uses the new parameters, the budget is republished
    /// at once with the new r_max cap.
    #[test]
    fn retune_keeps_the_ewmas_and_the_next_decision_uses_the_new_parameters() {
        let mut c = controller(0, 1.0);
        let old = c.tuning().expect("LIBRA policies");
        send(&mut c, 0, 20);
        send(&mut c, 1, 40);
        c.handle_timeout(Duration::from_secs(2));
        let launched: Vec<VmId> = actions(&mut c)
            .iter()
            .filter_map(|a| match a {
                Action::Launch { vm } => Some(*vm),
                _ => None,
            })
            .collect();
        for &vm in &launched {
            c.on_vm_ready(Duration::from_millis(2100), vm);
        }
        let before = c.status();
        let new = LibraTuning {
            alpha: 0.25,
            scaling: LibraScalingParams {
                phi: 2.5,
                r_max_rps: 8.0,
                ..old.scaling.clone()
            },
            rho: 0.6,
            ..old.clone()
        };
        assert!(c.retune(Duration::from_millis(2500), &new));
        assert_eq!(c.tuning(), Some(new.clone()));
        let after = c.status();
        assert_eq!(
            (after.avg_rps, after.std_rps),
            (before.avg_rps, before.std_rps)
        );
        assert_eq!(after.pool, before.pool, "the VM table is kept");
        assert_eq!(
            after.published_vm_reqs_rps,
            before
                .vm_reqs_rps
                .min(launched.len() as f64 * new.scaling.r_max_rps),
            "the budget is capped by the new r_max at once"
        );
        // Epochs 2 and 3 close under the new α (β unchanged); epoch 3 decides (K = 2).
        send(&mut c, 2, 40);
        send(&mut c, 3, 40);
        c.handle_timeout(Duration::from_secs(4));
        let (mut avg, mut std) = (before.avg_rps, before.std_rps);
        for x in [40.0, 40.0] {
            let prev = avg;
            avg = (1.0 - new.alpha) * avg + new.alpha * x;
            std = (1.0 - new.beta) * std + new.beta * f64::abs(prev - x);
        }
        let vm_reqs = avg + new.scaling.phi * std;
        let d = actions(&mut c)
            .into_iter()
            .find_map(|a| match a {
                Action::Decided { decision, .. } => Some(decision),
                _ => None,
            })
            .expect("a decision at epoch 3");
        assert!((d.vm_reqs_rps - vm_reqs).abs() < 1e-9, "{d:?} vs {vm_reqs}");
        let n = (vm_reqs / new.scaling.r_max_rps).ceil() as u32;
        assert_eq!(d.target_vms, n.min(new.scaling.max_vms));
        let old_n = ((avg + old.scaling.phi * std) / old.scaling.r_max_rps).ceil() as u32;
        assert_ne!(
            d.target_vms, old_n,
            "the old parameters would decide otherwise"
        );
    }

    #[test]
    fn a_static_pool_below_the_cip_keeps_its_whole_capacity() {
        // Report-only pool of 2 adopted VMs, r_max 10, CIP 50 far above the 3 req/s sent.
        let (r_max, cip, rate) = (10.0, 50.0, 3);
        let params = ControllerParams {
            monitor: MonitorParams {
                epoch: Duration::from_secs(1),
                alpha: 0.5,
                beta: 0.5,
                decision_epochs: 2,
                first_decision_epoch: None,
            },
            r_max_rps: r_max,
            execute_scaling: false,
        };
        let scaler = LibraScaler::new(LibraScalingParams {
            phi: 1.0,
            r_max_rps: r_max,
            min_vms: 0,
            max_vms: 8,
            cip_rps: cip,
        });
        let mut c = Controller::new(params, Box::new(scaler), Box::new(VmFirst::new(0.8)));
        c.adopt_ready_vm(Time::ZERO);
        c.adopt_ready_vm(Time::ZERO);
        c.start(Time::ZERO);
        for second in 0..6 {
            let routes = send(&mut c, second, rate);
            if second >= 2 {
                assert!(
                    routes.iter().all(|r| matches!(r, Route::Vm { .. })),
                    "second {second}: {routes:?}"
                );
            }
        }
        let st = c.status();
        assert_eq!(st.pool.target, 0, "the decision is below the CIP");
        assert_eq!(st.published_vm_reqs_rps, 2.0 * r_max);
    }

    #[test]
    fn below_the_cip_all_vms_drain_then_stop() {
        let mut c = controller(2, 5.0);
        let launched: Vec<VmId> = actions(&mut c)
            .into_iter()
            .filter_map(|a| match a {
                Action::Launch { vm } => Some(vm),
                _ => None,
            })
            .collect();
        assert_eq!(launched.len(), 2, "min_vms launched at start");
        for vm in &launched {
            c.on_vm_ready(Time::ZERO, *vm);
        }
        let r = c.route(
            Duration::from_millis(10),
            &RequestMeta::default(),
            Attempt::First,
        );
        let Route::Vm {
            vm: busy,
            reason: RouteReason::WithinBudget,
        } = r
        else {
            panic!("{r:?}")
        };
        // Two quiet epochs: avg = 0.5 req/s < CIP 5 → target 0 although min_vms = 2.
        c.handle_timeout(Duration::from_secs(2));
        let a = actions(&mut c);
        assert!(a.contains(&Action::Drain { vm: busy }));
        let stopped: Vec<_> = a
            .iter()
            .filter(|a| matches!(a, Action::Stop { .. }))
            .collect();
        assert_eq!(
            stopped.len(),
            1,
            "the idle VM stops at once, the busy one drains"
        );
        assert_eq!(c.status().published_vm_reqs_rps, 0.0);
        c.on_vm_request_finished(Duration::from_secs(2), busy);
        assert_eq!(actions(&mut c), vec![Action::Stop { vm: busy }]);
        assert_eq!(c.pool(), PoolSnapshot::default());
    }
}
