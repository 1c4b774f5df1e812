//! The baselines LIBRA is compared with — LIBRA §IV:
//! MAX (VMs for the peak), FAAS (functions only), AUTO (reactive VM autoscaling) and
//! Spock (AUTO, with functions absorbing load while new VMs boot).
//!
//! Each one is a sans-IO [`ScalingPolicy`] and/or [`RoutingPolicy`] beside LIBRA's
//! [`super::scaling::LibraScaler`] and [`super::balancer::VmFirst`],
//! so the live gateway could run them too; the simulator drives them through the same
//! [`Controller`](super::controller::Controller).
//!
//! | policy | scaling | routing |
//! |---|---|---|
//! | MAX | [`FixedScaler`] (peak VMs from the start) | [`VmOnly`] |
//! | FAAS | [`FixedScaler`] with 0 VMs | [`FunctionOnly`] |
//! | AUTO | [`AutoScaler`] | [`VmOnly`] |
//! | Spock | [`AutoScaler`] | [`SpockRouter`] |

use std::collections::VecDeque;
use std::time::Duration;

use super::Time;
use super::balancer::{
    Attempt, RequestMeta, Route, RouteReason, RoutingPolicy, VmFirst, VmState, VmTable,
};
use super::scaling::{
    EpochObservation, IdleOutlook, IdleView, LibraScaler, LibraScalingParams, ScaleDecision,
    ScaleReason, ScalingPolicy,
};

/// The five policies compared — LIBRA §IV. [`PolicyKind::build`] is the one place that
/// turns a kind into its scaling and routing policies, for the simulator and any driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PolicyKind {
    /// LIBRA: the scaling manager with the CIP rule and the VM-first balancer (§III).
    Libra,
    /// VMs for the load's peak from the start, every request to a VM.
    Max,
    /// Functions only.
    Faas,
    /// Reactive VM autoscaling on utilisation.
    Auto,
    /// AUTO, with functions absorbing load while VMs boot.
    Spock,
}

/// What [`PolicyKind::build`] needs.
#[derive(Clone, Debug)]
pub struct PolicyParams {
    /// LIBRA's scaling-manager parameters (CIP resolved).
    pub libra: LibraScalingParams,
    /// LIBRA's balancer (ρ, optional per-VM cap), cloned per build.
    pub balancer: VmFirst,
    /// AUTO and Spock parameters.
    pub auto: AutoParams,
    /// MAX's fixed pool (the load's peak at r_max).
    pub max_vms: u32,
    /// Requests one VM serves in parallel (Spock's "full VM").
    pub slots_per_vm: u32,
}

impl PolicyKind {
    /// All five, in report order.
    pub const ALL: [PolicyKind; 5] = [
        PolicyKind::Libra,
        PolicyKind::Max,
        PolicyKind::Faas,
        PolicyKind::Auto,
        PolicyKind::Spock,
    ];

    /// The report name: `libra`, `max`, `faas`, `auto`, `spock`.
    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::Libra => "libra",
            PolicyKind::Max => "max",
            PolicyKind::Faas => "faas",
            PolicyKind::Auto => "auto",
            PolicyKind::Spock => "spock",
        }
    }

    /// Whether the policy reads VM utilisation (the driver must measure it per epoch).
    pub fn uses_utilisation(self) -> bool {
        matches!(self, PolicyKind::Auto | PolicyKind::Spock)
    }

    /// The scaling and routing policies of this kind — LIBRA §IV's table.
    pub fn build(self, p: &PolicyParams) -> (Box<dyn ScalingPolicy>, Box<dyn RoutingPolicy>) {
        match self {
            PolicyKind::Libra => (
                Box::new(LibraScaler::new(p.libra.clone())),
                Box::new(p.balancer.clone()),
            ),
            PolicyKind::Max => (Box::new(FixedScaler::max(p.max_vms)), Box::new(VmOnly)),
            PolicyKind::Faas => (Box::new(FixedScaler::faas()), Box::new(FunctionOnly)),
            PolicyKind::Auto => (Box::new(AutoScaler::auto(p.auto.clone())), Box::new(VmOnly)),
            PolicyKind::Spock => (
                Box::new(AutoScaler::spock(p.auto.clone())),
                Box::new(SpockRouter::new(p.slots_per_vm)),
            ),
        }
    }
}

/// A constant pool: `vms` VMs from the start, never changed. MAX (LIBRA §IV: VMs
/// provisioned for the trace's peak) uses the peak's VM count, FAAS uses 0.
#[derive(Clone, Debug)]
pub struct FixedScaler {
    name: &'static str,
    vms: u32,
}

impl FixedScaler {
    /// MAX: `vms` VMs for the whole run (the driver computes `ceil(peak / r_max)`).
    pub fn max(vms: u32) -> Self {
        Self { name: "max", vms }
    }

    /// FAAS: no VM at all.
    pub fn faas() -> Self {
        Self {
            name: "faas",
            vms: 0,
        }
    }
}

impl ScalingPolicy for FixedScaler {
    fn name(&self) -> &'static str {
        self.name
    }

    fn initial(&self) -> ScaleDecision {
        ScaleDecision {
            target_vms: self.vms,
            vm_reqs_rps: if self.vms == 0 { 0.0 } else { f64::INFINITY },
            reason: ScaleReason::Baseline,
        }
    }

    fn on_epoch(&mut self, _now: Time, _obs: &EpochObservation) -> Option<ScaleDecision> {
        None
    }

    fn idle_outlook(&self, _view: &IdleView) -> IdleOutlook {
        IdleOutlook::Settled(None)
    }
}

/// Parameters of reactive VM autoscaling (AUTO, Spock) — LIBRA §IV.
#[derive(Clone, Debug, PartialEq)]
pub struct AutoParams {
    /// Scale out when the mean utilisation over the window is above this (0–1; paper 0.7).
    pub scale_out_utilisation: f64,
    /// Scale in when the mean utilisation over the window is below this (0–1; paper 0.3).
    pub scale_in_utilisation: f64,
    /// Length of the averaging window, in epochs (≥ 1).
    pub window_epochs: u32,
    /// VMs added or removed per action (the LIBRA authors' code: 10).
    pub step_vms: u32,
    /// After an action no other action is taken for this long (the authors' code: 120 s).
    pub grace: Duration,
    /// Fewest VMs; also the initial pool.
    pub min_vms: u32,
    /// Most VMs.
    pub max_vms: u32,
    /// r_max, requests/s per VM: used to estimate utilisation when the driver does not
    /// measure it (`vm_requests ÷ (ready · r_max · epoch)`).
    pub r_max_rps: f64,
}

/// Reactive autoscaling on VM utilisation (AUTO) — LIBRA §IV. Every epoch it records the
/// utilisation; once the window is full and the grace period is over it adds `step_vms`
/// above `scale_out_utilisation` or removes `step_vms` below `scale_in_utilisation`, then
/// clears the window and starts a new grace period. The budget is unlimited
/// (`vm_reqs = ∞`): routing decides.
#[derive(Clone, Debug)]
pub struct AutoScaler {
    name: &'static str,
    params: AutoParams,
    window: VecDeque<f64>,
    sum: f64,
    target: u32,
    grace_until: Time,
}

impl AutoScaler {
    /// AUTO.
    pub fn auto(params: AutoParams) -> Self {
        Self::named("auto", params)
    }

    /// Spock's scaling half (the same rule; pair it with [`SpockRouter`]).
    pub fn spock(params: AutoParams) -> Self {
        Self::named("spock", params)
    }

    fn named(name: &'static str, params: AutoParams) -> Self {
        let target = params.min_vms;
        Self {
            name,
            window: VecDeque::with_capacity(params.window_epochs as usize),
            sum: 0.0,
            target,
            grace_until: Time::ZERO,
            params,
        }
    }

    fn decision(&self) -> ScaleDecision {
        ScaleDecision {
            target_vms: self.target,
            vm_reqs_rps: f64::INFINITY,
            reason: ScaleReason::Baseline,
        }
    }
}

impl ScalingPolicy for AutoScaler {
    fn name(&self) -> &'static str {
        self.name
    }

    fn initial(&self) -> ScaleDecision {
        self.decision()
    }

    fn on_epoch(&mut self, now: Time, obs: &EpochObservation) -> Option<ScaleDecision> {
        let p = &self.params;
        let u = obs.vm_utilisation.unwrap_or_else(|| {
            let cap = f64::from(obs.pool.ready) * p.r_max_rps * obs.epoch.as_secs_f64();
            if cap > 0.0 {
                obs.vm_requests as f64 / cap
            } else {
                0.0
            }
        });
        self.window.push_back(u);
        self.sum += u;
        if self.window.len() > p.window_epochs as usize {
            self.sum -= self.window.pop_front().unwrap_or(0.0);
        }
        if self.window.len() < p.window_epochs as usize || now < self.grace_until {
            return None;
        }
        let mean = self.sum / self.window.len() as f64;
        let new = if mean > p.scale_out_utilisation {
            self.target.saturating_add(p.step_vms).min(p.max_vms)
        } else if mean < p.scale_in_utilisation {
            self.target.saturating_sub(p.step_vms).max(p.min_vms)
        } else {
            return None;
        };
        if new == self.target {
            return None;
        }
        self.target = new;
        self.window.clear();
        self.sum = 0.0;
        self.grace_until = now + p.grace;
        Some(self.decision())
    }

    /// Settled when the window is full of zero utilisation (an idle epoch pushes a zero
    /// and drops one: window and sum stay), the grace period is over and the window's
    /// mean asks for no change (between the thresholds, or at `min_vms`).
    fn idle_outlook(&self, view: &IdleView) -> IdleOutlook {
        let p = &self.params;
        let idle_u = view.vm_utilisation.unwrap_or(0.0);
        if idle_u != 0.0
            || self.window.len() != p.window_epochs as usize
            || self.window.iter().any(|&u| u != 0.0)
            || view.first_end < self.grace_until
        {
            return IdleOutlook::Unsettled;
        }
        let mean = self.sum / self.window.len() as f64;
        let new = if mean > p.scale_out_utilisation {
            self.target.saturating_add(p.step_vms).min(p.max_vms)
        } else if mean < p.scale_in_utilisation {
            self.target.saturating_sub(p.step_vms).max(p.min_vms)
        } else {
            self.target
        };
        if new == self.target {
            IdleOutlook::Settled(None)
        } else {
            IdleOutlook::Unsettled
        }
    }
}

/// Every request to the ready VM with the fewest outstanding requests; queues build on
/// the VMs when they are full (MAX, AUTO). No ready VM: rejected.
#[derive(Clone, Debug, Default)]
pub struct VmOnly;

impl RoutingPolicy for VmOnly {
    fn name(&self) -> &'static str {
        "vm_only"
    }

    fn set_vm_budget(&mut self, _now: Time, _vm_reqs_rps: f64) {}

    fn route(&mut self, _now: Time, _req: &RequestMeta, attempt: Attempt, vms: &VmTable) -> Route {
        let exclude = match attempt {
            Attempt::RetryAfterConnectFailure { failed } => Some(failed),
            _ => None,
        };
        match vms.least_outstanding_ready(exclude) {
            Some(vm) => Route::Vm {
                vm,
                reason: RouteReason::VmOnly,
            },
            None => Route::Reject {
                reason: RouteReason::NoReadyVm,
            },
        }
    }
}

/// Every request to the function tier (FAAS). Spill-backs are rejected.
#[derive(Clone, Debug, Default)]
pub struct FunctionOnly;

impl RoutingPolicy for FunctionOnly {
    fn name(&self) -> &'static str {
        "function_only"
    }

    fn set_vm_budget(&mut self, _now: Time, _vm_reqs_rps: f64) {}

    fn route(&mut self, _now: Time, _req: &RequestMeta, attempt: Attempt, _vms: &VmTable) -> Route {
        match attempt {
            Attempt::SpillBack => Route::Reject {
                reason: RouteReason::SpillBackRejected,
            },
            _ => Route::Function {
                reason: RouteReason::FunctionOnly,
            },
        }
    }
}

/// Spock's balancer — LIBRA §IV: VMs first; while a scale-out is in progress (some VM is
/// booting) and every ready VM has `slots_per_vm` requests outstanding, the excess goes
/// to the function tier. With no VM booting, requests queue on the VMs as in AUTO.
#[derive(Clone, Debug)]
pub struct SpockRouter {
    slots_per_vm: u32,
}

impl SpockRouter {
    /// `slots_per_vm`: requests one VM serves in parallel (a full VM has that many
    /// outstanding).
    pub fn new(slots_per_vm: u32) -> Self {
        Self { slots_per_vm }
    }
}

impl RoutingPolicy for SpockRouter {
    fn name(&self) -> &'static str {
        "spock"
    }

    fn set_vm_budget(&mut self, _now: Time, _vm_reqs_rps: f64) {}

    fn route(&mut self, _now: Time, _req: &RequestMeta, attempt: Attempt, vms: &VmTable) -> Route {
        let exclude = match attempt {
            Attempt::RetryAfterConnectFailure { failed } => Some(failed),
            _ => None,
        };
        let candidate = vms.least_outstanding_ready(exclude);
        let full = candidate
            .and_then(|vm| vms.get(vm))
            .is_none_or(|row| row.outstanding >= self.slots_per_vm);
        if full && attempt != Attempt::SpillBack && vms.count(VmState::Booting) > 0 {
            return Route::Function {
                reason: RouteReason::ScalingOut,
            };
        }
        match candidate {
            Some(vm) => Route::Vm {
                vm,
                reason: RouteReason::VmOnly,
            },
            None => Route::Reject {
                reason: RouteReason::NoReadyVm,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::VmId;
    use crate::monitor::EpochClosed;
    use crate::scaling::PoolSnapshot;

    fn obs(u: f64, ready: u32) -> EpochObservation {
        EpochObservation {
            traffic: EpochClosed {
                epoch: 0,
                requests: 0,
                avg_rps: 0.0,
                std_rps: 0.0,
                report: None,
            },
            epoch: Duration::from_secs(1),
            vm_requests: 0,
            function_requests: 0,
            vm_utilisation: Some(u),
            pool: PoolSnapshot {
                ready,
                ..PoolSnapshot::default()
            },
        }
    }

    fn params() -> AutoParams {
        AutoParams {
            scale_out_utilisation: 0.7,
            scale_in_utilisation: 0.3,
            window_epochs: 3,
            step_vms: 2,
            grace: Duration::from_secs(5),
            min_vms: 1,
            max_vms: 4,
            r_max_rps: 10.0,
        }
    }

    #[test]
    fn auto_scales_out_after_a_full_window_then_waits_for_the_grace_period() {
        let mut a = AutoScaler::auto(params());
        assert_eq!(a.initial().target_vms, 1);
        let s = Duration::from_secs;
        assert!(a.on_epoch(s(1), &obs(0.9, 1)).is_none());
        assert!(a.on_epoch(s(2), &obs(0.9, 1)).is_none());
        let d = a
            .on_epoch(s(3), &obs(0.9, 1))
            .expect("window full, mean 0.9 > 0.7");
        assert_eq!(d.target_vms, 3);
        // Grace until 8 s: a full window of overload at 4..6 s does nothing.
        for t in 4..=6 {
            assert!(a.on_epoch(s(t), &obs(1.0, 3)).is_none());
        }
        assert!(a.on_epoch(s(7), &obs(1.0, 3)).is_none());
        let d = a.on_epoch(s(8), &obs(1.0, 3)).expect("grace over");
        assert_eq!(d.target_vms, 4, "capped at max_vms");
    }

    #[test]
    fn auto_scales_in_down_to_min_and_holds_between_thresholds() {
        let mut p = params();
        p.min_vms = 3;
        p.step_vms = 10;
        let mut a = AutoScaler::auto(p);
        let s = Duration::from_secs;
        for t in 1..=3 {
            assert!(a.on_epoch(s(t), &obs(0.5, 3)).is_none(), "0.5 is between");
        }
        for t in 4..=6 {
            assert!(a.on_epoch(s(t), &obs(0.0, 3)).is_none(), "already at min");
        }
    }

    #[test]
    fn spock_spills_only_while_vms_boot_and_the_ready_ones_are_full() {
        let mut t = VmTable::default();
        t.insert(VmId(0), VmState::Ready);
        t.get_mut(VmId(0)).unwrap().outstanding = 2;
        let mut r = SpockRouter::new(2);
        let req = RequestMeta::default();
        assert!(matches!(
            r.route(Time::ZERO, &req, Attempt::First, &t),
            Route::Vm { .. }
        ));
        t.insert(VmId(1), VmState::Booting);
        assert_eq!(
            r.route(Time::ZERO, &req, Attempt::First, &t),
            Route::Function {
                reason: RouteReason::ScalingOut
            }
        );
        t.get_mut(VmId(0)).unwrap().outstanding = 1;
        assert!(matches!(
            r.route(Time::ZERO, &req, Attempt::First, &t),
            Route::Vm { .. }
        ));
        assert_eq!(
            FunctionOnly.route(Time::ZERO, &req, Attempt::First, &t),
            Route::Function {
                reason: RouteReason::FunctionOnly
            }
        );
        assert_eq!(
            VmOnly.route(Time::ZERO, &req, Attempt::First, &VmTable::default()),
            Route::Reject {
                reason: RouteReason::NoReadyVm
            }
        );
    }

    /// AUTO scales in: out to `max_vms`, then, past the grace period, below
    /// `scale_in_utilisation` it removes `step_vms` but never goes under `min_vms`.
    #[test]
    fn auto_scales_in_after_the_grace_period_and_stops_at_min_vms() {
        let p = AutoParams {
            scale_out_utilisation: 0.8,
            scale_in_utilisation: 0.35,
            window_epochs: 2,
            step_vms: 3,
            grace: Duration::from_secs(4),
            min_vms: 2,
            max_vms: 7,
            r_max_rps: 10.0,
        };
        let mut a = AutoScaler::auto(p.clone());
        assert_eq!(a.initial().target_vms, p.min_vms);
        let s = Duration::from_secs;
        assert!(a.on_epoch(s(1), &obs(0.95, 2)).is_none());
        let d = a.on_epoch(s(2), &obs(0.9, 2)).expect("mean 0.925 > 0.8");
        assert_eq!(d.target_vms, p.min_vms + p.step_vms);
        assert_eq!(
            (d.vm_reqs_rps, d.reason),
            (f64::INFINITY, ScaleReason::Baseline)
        );
        // Grace until 6 s.
        assert!(a.on_epoch(s(3), &obs(0.1, 5)).is_none());
        assert!(a.on_epoch(s(5), &obs(0.1, 5)).is_none(), "still in grace");
        let d = a.on_epoch(s(6), &obs(0.1, 5)).expect("mean 0.1 < 0.35");
        assert_eq!(d.target_vms, 5 - p.step_vms, "5 − 3 = 2 = min");
        // Out again (5), out again capped at 7, then in: 7 − 3 = 4, 4 − 3 → min 2.
        let mut t = 6;
        let mut step = |u: f64| {
            let mut last = None;
            for _ in 0..2 {
                t += 4;
                last = a.on_epoch(s(t), &obs(u, 0));
            }
            last.map(|d| d.target_vms)
        };
        assert_eq!(step(0.85), Some(5));
        assert_eq!(step(0.85), Some(7));
        assert_eq!(step(0.85), None, "at max_vms: no decision");
        assert_eq!(step(0.3), Some(4));
        assert_eq!(
            step(0.3),
            Some(p.min_vms),
            "4 − 3 = 1 is clamped to min_vms = 2"
        );
        // Exactly at the scale-in threshold (a fresh window, exact sums): hold.
        assert_eq!(step(0.35), None);
        assert_eq!(step(0.0), None, "at min_vms: no decision");
        // Exactly at the scale-out threshold: hold.
        let mut b = AutoScaler::auto(p);
        assert!(b.on_epoch(s(1), &obs(0.8, 2)).is_none());
        assert!(b.on_epoch(s(2), &obs(0.8, 2)).is_none());
    }

    /// Without a measured utilisation AUTO estimates it as VM requests ÷ (ready · r_max ·
    /// epoch) and the window mean is over the last `window_epochs` only.
    #[test]
    fn auto_estimates_utilisation_from_vm_requests_over_a_sliding_window() {
        let p = AutoParams {
            scale_out_utilisation: 0.75,
            scale_in_utilisation: 0.25,
            window_epochs: 2,
            step_vms: 1,
            grace: Duration::ZERO,
            min_vms: 1,
            max_vms: 4,
            r_max_rps: 8.0,
        };
        let mut a = AutoScaler::auto(p);
        let est = |vm_requests: u64, ready: u32, epoch_secs: u64| {
            let mut o = obs(0.0, ready);
            o.vm_utilisation = None;
            o.vm_requests = vm_requests;
            o.epoch = Duration::from_secs(epoch_secs);
            o
        };
        let s = Duration::from_secs;
        // 2 ready VMs, 2 s epochs: capacity 32 requests. 28 → 0.875, then 20 → 0.625:
        // mean 0.75 is not above 0.75 (binary fractions: the sums are exact).
        assert!(a.on_epoch(s(2), &est(28, 2, 2)).is_none());
        assert!(a.on_epoch(s(4), &est(20, 2, 2)).is_none());
        // The 0.875 leaves the window: 0.625 and 0.9375 → mean 0.78125 > 0.75.
        let d = a.on_epoch(s(6), &est(30, 2, 2)).expect("scale out");
        assert_eq!(d.target_vms, 2);
        // No ready VM: utilisation 0, not a division by zero.
        assert!(a.on_epoch(s(8), &est(5, 0, 2)).is_none());
        let d = a.on_epoch(s(10), &est(5, 0, 2)).expect("mean 0 < 0.25");
        assert_eq!(d.target_vms, 1);
    }
}
