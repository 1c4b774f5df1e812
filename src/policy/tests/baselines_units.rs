//! Unit tests of LIBRA §IV's baselines (src/policy/baselines.rs: AUTO/Spock's
//! `AutoScaler`, the `VmOnly`, `FunctionOnly` and `SpockRouter` balancers), written
//! against the mutants cargo-mutants found uncaught. Through the public API
//! only; every expectation is derived here from the rule in the module's docs (window
//! mean, thresholds, `step_vms`, grace period, least-outstanding ready VM).
//!
//! `AutoScaler::idle_outlook` is the simulator's fast path over idle stretches:
//! `Settled(None)` lets it close many idle epochs at once, so it is tested
//! directly, each condition on both sides of its boundary, and every `Settled` answer is
//! checked against what `on_epoch` does on the same idle epochs.

use std::time::Duration;

use spillway_policy::VmId;
use spillway_policy::balancer::{
    Attempt, RequestMeta, Route, RouteReason, RoutingPolicy, VmFirst, VmState, VmTable,
};
use spillway_policy::baselines::{
    AutoParams, AutoScaler, FixedScaler, FunctionOnly, PolicyKind, PolicyParams, SpockRouter,
    VmOnly,
};
use spillway_policy::controller::{Controller, ControllerParams};
use spillway_policy::monitor::{EpochClosed, MonitorParams};
use spillway_policy::scaling::{
    EpochObservation, IdleOutlook, IdleView, LibraScalingParams, PoolSnapshot, ScalingPolicy,
};

fn s(secs: u64) -> Duration {
    Duration::from_secs(secs)
}

/// AUTO's parameters: asymmetric thresholds (0.7 / 0.3), a 3-epoch window, steps of 2
/// between 1 and 6 VMs, 5 s of grace.
fn auto_params() -> AutoParams {
    AutoParams {
        scale_out_utilisation: 0.7,
        scale_in_utilisation: 0.3,
        window_epochs: 3,
        step_vms: 2,
        grace: Duration::from_secs(5),
        min_vms: 1,
        max_vms: 6,
        r_max_rps: 10.0,
    }
}

/// One closed epoch with a measured utilisation `u` and no request.
fn obs(u: f64) -> EpochObservation {
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
            ready: 1,
            ..PoolSnapshot::default()
        },
    }
}

/// An idle stretch whose first epoch ends at `first_end`, each epoch reporting `u`.
fn idle(first_end: Duration, u: Option<f64>) -> IdleView {
    IdleView {
        first_end,
        avg_rps: 0.0,
        std_rps: 0.0,
        traffic_settled: true,
        vm_utilisation: u,
        pool: PoolSnapshot {
            ready: 1,
            ..PoolSnapshot::default()
        },
    }
}

/// Feed one epoch per second from `from` on, one per utilisation; the targets decided.
fn feed(a: &mut AutoScaler, from: u64, us: &[f64]) -> Vec<Option<u32>> {
    us.iter()
        .zip(from..)
        .map(|(&u, t)| a.on_epoch(s(t), &obs(u)).map(|d| d.target_vms))
        .collect()
}

/// A `Settled(None)` answer must be true: the next idle epochs (one per second from
/// `first_end`) change nothing and the answer stays the same after them.
fn assert_idle_epochs_change_nothing(a: &AutoScaler, first_end: Duration) {
    let mut b = a.clone();
    let target = b.initial().target_vms;
    for k in 0..4 {
        let t = first_end + s(k);
        assert_eq!(b.on_epoch(t, &obs(0.0)), None, "idle epoch ending at {t:?}");
        assert_eq!(
            b.idle_outlook(&idle(t + s(1), Some(0.0))),
            IdleOutlook::Settled(None)
        );
    }
    assert_eq!(b.initial().target_vms, target);
}

/// AUTO settles on an idle stretch only once its window is full of zero utilisation
/// and the idle epochs report zero (or nothing): at `min_vms` a zero mean asks for no
/// change. One epoch short of a full window, or a non-zero idle utilisation, and the
/// simulator must close the epochs one by one.
#[test]
fn auto_settles_only_on_a_full_window_of_zero_utilisation() {
    let p = auto_params();
    let mut a = AutoScaler::auto(p.clone());
    let w = u64::from(p.window_epochs);
    assert_eq!(
        a.idle_outlook(&idle(s(1), Some(0.0))),
        IdleOutlook::Unsettled,
        "empty window"
    );
    let short = vec![0.0; p.window_epochs as usize - 1];
    assert!(feed(&mut a, 1, &short).iter().all(Option::is_none));
    assert_eq!(
        a.idle_outlook(&idle(s(w), Some(0.0))),
        IdleOutlook::Unsettled,
        "one epoch short of a full window: the next idle epoch fills it"
    );
    assert_eq!(feed(&mut a, w, &[0.0]), [None]);
    for u in [None, Some(0.0)] {
        assert_eq!(
            a.idle_outlook(&idle(s(w + 1), u)),
            IdleOutlook::Settled(None),
            "full zero window at min_vms, idle utilisation {u:?}"
        );
    }
    assert_idle_epochs_change_nothing(&a, s(w + 1));
    // Busy-but-idle VMs (requests from before the stretch still running): 0.2 enters
    // the window.
    assert_eq!(
        a.idle_outlook(&idle(s(w + 1), Some(0.2))),
        IdleOutlook::Unsettled
    );
}

/// A non-zero utilisation still in the window keeps AUTO unsettled even when its mean
/// asks for no change (at `min_vms`): the next idle epochs push it out and change the
/// window. Once it has left, AUTO settles.
#[test]
fn auto_is_unsettled_while_a_non_zero_utilisation_is_in_the_window() {
    let p = auto_params();
    let mut a = AutoScaler::auto(p.clone());
    // Mean 0.2 / 3 < 0.3, but 1 VM is min_vms: no decision.
    assert_eq!(feed(&mut a, 1, &[0.2, 0.0, 0.0]), [None, None, None]);
    assert_eq!(
        a.idle_outlook(&idle(s(4), Some(0.0))),
        IdleOutlook::Unsettled
    );
    assert_eq!(feed(&mut a, 4, &[0.0]), [None], "0.2 leaves the window");
    assert_eq!(
        a.idle_outlook(&idle(s(5), None)),
        IdleOutlook::Settled(None)
    );
    assert_idle_epochs_change_nothing(&a, s(5));
}

/// After an action AUTO waits out its grace period: with a full zero window at
/// `min_vms` it is unsettled while the stretch starts inside the grace period and
/// settled from the grace period's end on (an epoch ending exactly then may act).
#[test]
fn auto_settles_only_from_the_end_of_its_grace_period() {
    let p = auto_params();
    let mut a = AutoScaler::auto(p.clone());
    let grace = p.grace.as_secs();
    // Overload fills the window at 3 s: out by step_vms, grace until 3 s + grace.
    let out = p.min_vms + p.step_vms;
    assert_eq!(feed(&mut a, 1, &[0.9, 0.9, 0.9]), [None, None, Some(out)]);
    // Idle: the window refills with zeros during the grace period and, at its end,
    // mean 0 < 0.3 scales in by step_vms back to min_vms; a new grace period.
    let back_in = 3 + grace;
    let zeros = vec![0.0; grace as usize];
    let mut decided = feed(&mut a, 4, &zeros);
    assert_eq!(decided.pop(), Some(Some(out - p.step_vms)));
    assert!(decided.iter().all(Option::is_none));
    assert_eq!(out - p.step_vms, p.min_vms);
    // The window refills with zeros, all inside the new grace period.
    let w = u64::from(p.window_epochs);
    assert!(w < grace);
    let zeros = vec![0.0; p.window_epochs as usize];
    assert!(
        feed(&mut a, back_in + 1, &zeros)
            .iter()
            .all(Option::is_none)
    );
    let grace_until = back_in + grace;
    assert_eq!(
        a.idle_outlook(&idle(s(grace_until) - Duration::from_nanos(1), Some(0.0))),
        IdleOutlook::Unsettled,
        "a stretch starting 1 ns before the grace period ends"
    );
    assert_eq!(
        a.idle_outlook(&idle(s(grace_until - 1), Some(0.0))),
        IdleOutlook::Unsettled
    );
    for first_end in [s(grace_until), s(grace_until + 1)] {
        assert_eq!(
            a.idle_outlook(&idle(first_end, Some(0.0))),
            IdleOutlook::Settled(None),
            "stretch from {first_end:?}, grace over at {grace_until} s"
        );
    }
    assert_idle_epochs_change_nothing(&a, s(grace_until));
}

/// Above `min_vms` a zero window (mean 0 < scale_in) scales in at the first idle epoch
/// past the grace period: not settled, and `on_epoch` does scale in.
#[test]
fn auto_above_min_vms_is_unsettled_because_the_zero_window_scales_in() {
    let p = auto_params();
    let mut a = AutoScaler::auto(p.clone());
    let out = p.min_vms + p.step_vms;
    assert_eq!(feed(&mut a, 1, &[0.9, 0.9, 0.9]), [None, None, Some(out)]);
    let grace_until = 3 + p.grace.as_secs();
    let zeros = vec![0.0; (grace_until - 4) as usize];
    assert!(zeros.len() >= p.window_epochs as usize);
    assert!(feed(&mut a, 4, &zeros).iter().all(Option::is_none));
    assert_eq!(
        a.idle_outlook(&idle(s(grace_until), Some(0.0))),
        IdleOutlook::Unsettled
    );
    let d = a.on_epoch(s(grace_until), &obs(0.0)).expect("mean 0 < 0.3");
    assert_eq!(d.target_vms, out - p.step_vms);
}

/// Thresholds of exactly zero: a zero mean is neither above scale_out nor below
/// scale_in, so AUTO above `min_vms` and below `max_vms` holds and settles.
#[test]
fn auto_with_zero_thresholds_holds_on_a_zero_window() {
    let p = AutoParams {
        scale_out_utilisation: 0.0,
        scale_in_utilisation: 0.0,
        ..auto_params()
    };
    let mut a = AutoScaler::auto(p.clone());
    let out = p.min_vms + p.step_vms;
    assert_eq!(feed(&mut a, 1, &[0.5, 0.25, 0.5]), [None, None, Some(out)]);
    assert!(p.min_vms < out && out < p.max_vms, "room both ways");
    let grace_until = 3 + p.grace.as_secs();
    let zeros = vec![0.0; (grace_until - 4) as usize];
    assert!(feed(&mut a, 4, &zeros).iter().all(Option::is_none));
    assert_eq!(
        a.idle_outlook(&idle(s(grace_until), None)),
        IdleOutlook::Settled(None)
    );
    assert_idle_epochs_change_nothing(&a, s(grace_until));
}

/// The idle fast path compares the window's mean (sum ÷ entries), as `on_epoch` does,
/// not the sum: the sliding sum of 0.1 and 0.2 pushed out by zeros keeps a rounding
/// residue r > 0 (mean r/2). With scale_in = r, the mean is below it, so AUTO above
/// `min_vms` scales in at the next idle epoch — the fast path must say unsettled.
#[test]
fn auto_idle_outlook_uses_the_window_mean_like_on_epoch() {
    let residue = 0.1_f64 + 0.2 - 0.1 - 0.2;
    assert!(residue > 0.0, "{residue}");
    let p = AutoParams {
        window_epochs: 2,
        scale_in_utilisation: residue,
        ..auto_params()
    };
    let mut a = AutoScaler::auto(p.clone());
    let out = p.min_vms + p.step_vms;
    assert_eq!(feed(&mut a, 1, &[0.9, 0.9]), [None, Some(out)]);
    // Inside the grace period (until 7 s): 0.1, 0.2, then zeros push both out.
    let grace_until = 2 + p.grace.as_secs();
    assert_eq!(feed(&mut a, 3, &[0.1, 0.2, 0.0, 0.0]), [None; 4]);
    assert!(residue / 2.0 < p.scale_in_utilisation);
    assert_eq!(
        a.idle_outlook(&idle(s(grace_until), Some(0.0))),
        IdleOutlook::Unsettled
    );
    let d = a
        .on_epoch(s(grace_until), &obs(0.0))
        .expect("mean r/2 < r scales in");
    assert_eq!(d.target_vms, out - p.step_vms);
}

/// A window mean exactly at scale_in holds (only below it scales in), also above
/// `min_vms` where scaling in would be possible; just below it scales in by step_vms.
#[test]
fn auto_holds_exactly_at_the_scale_in_threshold_above_min_vms() {
    let p = AutoParams {
        scale_out_utilisation: 0.75,
        scale_in_utilisation: 0.25,
        window_epochs: 2,
        step_vms: 2,
        grace: Duration::from_secs(3),
        min_vms: 1,
        max_vms: 6,
        r_max_rps: 10.0,
    };
    let mut a = AutoScaler::auto(p.clone());
    let out = p.min_vms + p.step_vms;
    assert_eq!(feed(&mut a, 1, &[0.875, 0.875]), [None, Some(out)]);
    // Grace until 5 s. Binary fractions: the sums are exact. At 5 s the window is
    // (0.375, 0.125): mean 0.25 = scale_in. At 6 s (0.125, 0.0625): mean 0.09375.
    assert_eq!(
        feed(&mut a, 3, &[0.125, 0.375, 0.125]),
        [None, None, None],
        "mean (0.375 + 0.125) / 2 = 0.25 is not below 0.25"
    );
    assert!(out > p.min_vms);
    assert_eq!(feed(&mut a, 6, &[0.0625]), [Some(out - p.step_vms)]);
}

/// The names the simulator's report and /status show for the baselines' balancers.
#[test]
fn baseline_routers_have_their_report_names() {
    assert_eq!(VmOnly.name(), "vm_only");
    assert_eq!(FunctionOnly.name(), "function_only");
    assert_eq!(SpockRouter::new(3).name(), "spock");
    let p = PolicyParams {
        libra: LibraScalingParams {
            phi: 1.5,
            r_max_rps: 4.0,
            min_vms: 0,
            max_vms: 9,
            cip_rps: 0.5,
        },
        balancer: VmFirst::new(0.8),
        auto: auto_params(),
        max_vms: 7,
        slots_per_vm: 3,
    };
    let routers: Vec<_> = [
        PolicyKind::Max,
        PolicyKind::Faas,
        PolicyKind::Auto,
        PolicyKind::Spock,
    ]
    .iter()
    .map(|k| k.build(&p).1.name())
    .collect();
    assert_eq!(routers, ["vm_only", "function_only", "vm_only", "spock"]);
}

/// A VM table built through the controller: `launched` VMs boot (ids 0, 1, …); then,
/// in order, each `(id, load)` becomes ready and receives `load` requests (a VM-only
/// balancer sends them to the least-loaded ready VM: list heavier loads first).
fn table(launched: u32, ready: &[(u64, u32)]) -> VmTable {
    let params = ControllerParams {
        monitor: MonitorParams {
            epoch: Duration::from_millis(700),
            alpha: 0.3,
            beta: 0.2,
            decision_epochs: 1,
            first_decision_epoch: None,
        },
        r_max_rps: 4.0,
        execute_scaling: true,
    };
    let mut c = Controller::new(
        params,
        Box::new(FixedScaler::max(launched)),
        Box::new(VmOnly),
    );
    c.start(Duration::ZERO);
    let req = RequestMeta::default();
    for &(id, load) in ready {
        c.on_vm_ready(Duration::ZERO, VmId(id));
        for _ in 0..load {
            c.route(Duration::ZERO, &req, Attempt::First);
        }
    }
    let t = c.vms().clone();
    for &(id, load) in ready {
        let row = t.get(VmId(id)).expect("launched");
        assert_eq!((row.state, row.outstanding), (VmState::Ready, load));
    }
    assert_eq!(
        t.count(VmState::Booting),
        launched - ready.len() as u32,
        "the others still boot"
    );
    t
}

/// MAX/AUTO retry a request whose connection VM 0 refused on another ready VM — the
/// more loaded VM 1 — and reject it when the failed VM was the only ready one.
#[test]
fn vm_only_retries_on_another_ready_vm() {
    let t = table(2, &[(1, 3), (0, 0)]);
    let req = RequestMeta {
        idempotent: true,
        ..RequestMeta::default()
    };
    let mut r = VmOnly;
    let vm_only = |vm| Route::Vm {
        vm,
        reason: RouteReason::VmOnly,
    };
    assert_eq!(r.route(s(1), &req, Attempt::First, &t), vm_only(VmId(0)));
    let retry = |failed| Attempt::RetryAfterConnectFailure { failed };
    assert_eq!(r.route(s(1), &req, retry(VmId(0)), &t), vm_only(VmId(1)));
    assert_eq!(r.route(s(1), &req, retry(VmId(1)), &t), vm_only(VmId(0)));
    let alone = table(2, &[(0, 1)]);
    assert_eq!(
        r.route(s(1), &req, retry(VmId(0)), &alone),
        Route::Reject {
            reason: RouteReason::NoReadyVm
        }
    );
}

/// Spock retries a refused connection on another ready VM too: with no VM booting it
/// queues on the other (full) VM; while a VM boots and the other ready VM is full,
/// the retry goes to the function tier — never back to the VM that refused.
#[test]
fn spock_retry_skips_the_failed_vm() {
    let slots = 2;
    let mut r = SpockRouter::new(slots);
    let req = RequestMeta {
        idempotent: true,
        ..RequestMeta::default()
    };
    let retry = Attempt::RetryAfterConnectFailure { failed: VmId(0) };
    // VM 1 full (2 of 2 slots), VM 0 empty.
    let settled = table(2, &[(1, slots), (0, 0)]);
    assert_eq!(
        r.route(s(1), &req, retry, &settled),
        Route::Vm {
            vm: VmId(1),
            reason: RouteReason::VmOnly
        }
    );
    // The same with VM 2 booting: a first attempt goes to the empty VM 0, the retry
    // spills to functions.
    let scaling = table(3, &[(1, slots), (0, 0)]);
    assert_eq!(
        r.route(s(1), &req, Attempt::First, &scaling),
        Route::Vm {
            vm: VmId(0),
            reason: RouteReason::VmOnly
        }
    );
    assert_eq!(
        r.route(s(1), &req, retry, &scaling),
        Route::Function {
            reason: RouteReason::ScalingOut
        }
    );
}

/// FAAS has no VM to fall back to: a request no function zone could take is rejected
/// (SpillBackRejected), not sent to the function tier again; first attempts and retries
/// go to functions.
#[test]
fn function_only_rejects_a_spill_back() {
    let t = table(1, &[(0, 0)]);
    let req = RequestMeta::default();
    let mut r = FunctionOnly;
    assert_eq!(
        r.route(s(1), &req, Attempt::SpillBack, &t),
        Route::Reject {
            reason: RouteReason::SpillBackRejected
        }
    );
    for attempt in [
        Attempt::First,
        Attempt::RetryAfterConnectFailure { failed: VmId(0) },
    ] {
        assert_eq!(
            r.route(s(1), &req, attempt, &t),
            Route::Function {
                reason: RouteReason::FunctionOnly
            }
        );
    }
}
