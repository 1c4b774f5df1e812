//! The core's inputs for several gateway replicas (`policy::shared`), on the injected
//! clock: aggregate epoch counts in place of the local one, a decision taken by the
//! leader, a budget share, a frozen pool (not the pool writer), VMs leaving through the
//! registry, the EWMA hand-over to a new leader and a new leader's scale-in hold. Each
//! test compares against what one gateway does at the same total load, or against an
//! expectation computed here (α = 0.3, β = 0.2, φ = 1.5, ρ = 0.6).

use std::time::Duration;

use spillway_policy::attempt::{Decision, Ticket};
use spillway_policy::balancer::{BudgetRule, RequestMeta, VmFirst};
use spillway_policy::controller::{self, ControllerParams, MAX_PENDING_COUNTS};
use spillway_policy::core::{Action, Core, CoreParams};
use spillway_policy::monitor::MonitorParams;
use spillway_policy::placement::{
    PlacementParams, PlacementPolicy, ZoneCapacity, ZoneKind, ZoneParams,
};
use spillway_policy::scaling::{LibraScaler, LibraScalingParams, ScaleDecision, ScaleReason};
use spillway_policy::shared::{CountSource, EpochCount};
use spillway_policy::{Time, VmId};

const ALPHA: f64 = 0.3;
const BETA: f64 = 0.2;
const PHI: f64 = 1.5;
const RHO: f64 = 0.6;
const R_MAX: f64 = 10.0;
const K: u32 = 2;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// A LIBRA core with 1 s epochs, decisions every K = 2 epochs, the per-epoch quota
/// (exact admission counts), one unlimited function zone; `execute` = a pool it scales.
fn core(execute: bool) -> Core {
    let mut c = Core::new(
        CoreParams {
            controller: ControllerParams {
                monitor: MonitorParams {
                    epoch: secs(1),
                    alpha: ALPHA,
                    beta: BETA,
                    decision_epochs: K,
                    first_decision_epoch: None,
                },
                r_max_rps: R_MAX,
                execute_scaling: execute,
            },
            placement: PlacementParams {
                zones: vec![ZoneParams {
                    name: "fn".into(),
                    kind: ZoneKind::Cloud,
                    capacity: ZoneCapacity::Concurrency {
                        max_concurrency: None,
                    },
                }],
                policy: PlacementPolicy::EdgeFirst,
            },
            vm_boot_timeout: None,
        },
        Box::new(LibraScaler::new(LibraScalingParams {
            phi: PHI,
            r_max_rps: R_MAX,
            min_vms: 0,
            max_vms: 8,
            cip_rps: 0.5,
        })),
        Box::new(
            VmFirst::new(RHO).with_budget_rule(BudgetRule::Quota { truncate: false }, secs(1)),
        ),
    );
    c.start(Time::ZERO);
    drain(&mut c);
    c
}

fn drain(c: &mut Core) -> Vec<Action> {
    std::iter::from_fn(|| c.poll_action()).collect()
}

fn launches(actions: &[Action]) -> Vec<VmId> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Scaling(controller::Action::Launch { vm }) => Some(*vm),
            _ => None,
        })
        .collect()
}

fn decisions(actions: &[Action]) -> Vec<(u64, ScaleDecision)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Scaling(controller::Action::Decided {
                epoch, decision, ..
            }) => Some((*epoch, *decision)),
            _ => None,
        })
        .collect()
}

/// `n` first attempts spread over epoch `epoch`; returns how many went to VMs.
fn send(c: &mut Core, epoch: u64, n: u64) -> u64 {
    let mut to_vm = 0;
    for i in 0..n {
        let at = secs(epoch) + Duration::from_micros(i * 1_000_000 / n.max(1));
        let mut t = Ticket::new(RequestMeta::default(), None);
        if matches!(c.route(at, &mut t), Decision::Vm { .. }) {
            to_vm += 1;
        }
    }
    to_vm
}

fn counts(c: &mut Core) -> Vec<EpochCount> {
    std::iter::from_fn(|| c.poll_epoch_count()).collect()
}

/// The monitor's update rule computed here, per epoch (requests/s = per epoch at E = 1 s).
fn ewma(xs: &[f64]) -> (f64, f64) {
    let (mut avg, mut std) = (xs[0], 0.0);
    for &x in &xs[1..] {
        let prev = avg;
        avg = (1.0 - ALPHA) * avg + ALPHA * x;
        std = (1.0 - BETA) * std + BETA * (prev - x).abs();
    }
    (avg, std)
}

fn decision(target_vms: u32, vm_reqs_rps: f64) -> ScaleDecision {
    ScaleDecision {
        target_vms,
        vm_reqs_rps,
        reason: ScaleReason::Provision,
    }
}

#[test]
fn the_sum_of_the_replicas_counts_decides_as_one_gateway_would() {
    let mut one = core(true);
    let mut rep = core(true);
    rep.set_count_source(Time::ZERO, CountSource::Aggregate);
    assert_eq!(rep.controller().count_source(), CountSource::Aggregate);
    let totals = [30_u64, 50, 20, 70];
    for (e, &total) in totals.iter().enumerate() {
        let e = e as u64;
        send(&mut one, e, total);
        // This replica takes a third of the load (and its own count is what it reports).
        send(&mut rep, e, total / 3);
    }
    one.handle_timeout(secs(4));
    rep.handle_timeout(secs(4));
    assert_eq!(
        counts(&mut rep),
        (0..4)
            .map(|e| EpochCount {
                epoch: e,
                requests: totals[e as usize] / 3
            })
            .collect::<Vec<_>>(),
        "one local count per epoch, in order"
    );
    assert_eq!(
        rep.controller().status().epoch,
        None,
        "no epoch closes on the local count"
    );
    for (e, &total) in totals.iter().enumerate() {
        assert!(rep.on_aggregate_count(secs(4) + ms(10), e as u64, total));
    }
    let (a, b) = (one.controller().status(), rep.controller().status());
    let xs: Vec<f64> = totals.iter().map(|&n| n as f64).collect();
    let (avg, std) = ewma(&xs);
    assert!((b.avg_rps - avg).abs() < 1e-9 && (b.std_rps - std).abs() < 1e-9);
    assert_eq!((a.avg_rps, a.std_rps), (b.avg_rps, b.std_rps));
    assert_eq!(a.pool.target, b.pool.target);
    assert_eq!(a.vm_reqs_rps, b.vm_reqs_rps);
    let expected = ((avg + PHI * std) / R_MAX).ceil() as u32;
    assert_eq!(b.pool.target, expected);
    assert_eq!(
        launches(&drain(&mut rep)).len(),
        expected as usize,
        "the replica writes the pool"
    );
}

#[test]
fn an_aggregate_count_is_taken_once_and_only_for_an_ended_epoch() {
    let mut one = core(true);
    assert!(
        !one.on_aggregate_count(secs(2), 0, 40),
        "a single gateway counts locally"
    );
    assert_eq!(
        one.controller().status().epoch,
        Some(1),
        "its own epochs closed"
    );
    assert_eq!(one.controller().status().avg_rps, 0.0);

    let mut rep = core(true);
    rep.set_count_source(Time::ZERO, CountSource::Aggregate);
    assert!(
        !rep.on_aggregate_count(ms(900), 0, 40),
        "epoch 0 has not ended"
    );
    assert!(
        rep.on_aggregate_count(secs(1), 0, 40),
        "ends exactly at 1 s"
    );
    assert!(!rep.on_aggregate_count(secs(1), 0, 99), "already closed");
    assert_eq!(rep.controller().status().last_epoch_requests, 40);
    // Epoch 2 arrives without epoch 1: both close with 16 (the gap is imputed).
    assert!(
        !rep.on_aggregate_count(ms(2500), 3, 16),
        "epoch 3 has not ended"
    );
    assert!(rep.on_aggregate_count(ms(3500), 2, 16));
    let (avg, std) = ewma(&[40.0, 16.0, 16.0]);
    let st = rep.controller().status();
    assert_eq!(st.epoch, Some(2));
    assert!((st.avg_rps - avg).abs() < 1e-9 && (st.std_rps - std).abs() < 1e-9);
}

#[test]
fn the_local_epoch_clock_wakes_the_driver_and_keeps_the_open_count() {
    let mut c = core(true);
    send(&mut c, 0, 7);
    assert_eq!(c.controller().open_epoch().requests, 7);
    c.set_count_source(ms(990), CountSource::Aggregate);
    assert_eq!(c.poll_timeout(), secs(1));
    assert_eq!(
        c.controller().open_epoch(),
        EpochCount {
            epoch: 0,
            requests: 7
        },
        "the open epoch's requests move to the local count"
    );
    c.handle_timeout(secs(1));
    assert_eq!(c.poll_timeout(), secs(2));
    send(&mut c, 1, 3);
    assert_eq!(
        counts(&mut c),
        vec![EpochCount {
            epoch: 0,
            requests: 7
        }]
    );
    assert_eq!(c.controller().open_epoch().epoch, 1);
    assert!(c.on_aggregate_count(ms(1100), 0, 40));
    send(&mut c, 2, 5);
    // Back to local counting at 2.5 s: epoch 1 got no sum and closes with the last one
    // (40); the open epoch's 5 are the monitor's, which closes epoch 2 on its own.
    c.set_count_source(ms(2500), CountSource::Local);
    assert_eq!(c.controller().count_source(), CountSource::Local);
    let st = c.controller().status();
    assert_eq!((st.epoch, st.last_epoch_requests), (Some(1), 40));
    assert_eq!(
        c.controller().open_epoch(),
        EpochCount {
            epoch: 2,
            requests: 5
        }
    );
    assert!(
        c.poll_epoch_count().is_none(),
        "epoch 1's local count was dropped"
    );
    c.handle_timeout(secs(3));
    let st = c.controller().status();
    assert_eq!((st.epoch, st.last_epoch_requests), (Some(2), 5));
    let (avg, _) = ewma(&[40.0, 40.0, 5.0]);
    assert!((st.avg_rps - avg).abs() < 1e-9);
}

#[test]
fn local_counts_the_coordinator_never_takes_stay_bounded() {
    let mut c = core(true);
    c.set_count_source(Time::ZERO, CountSource::Aggregate);
    let extra = 5;
    let end = MAX_PENDING_COUNTS as u64 + extra;
    c.handle_timeout(secs(end));
    // An idle stretch closes nothing in the monitor under aggregate counts.
    assert_eq!(c.close_idle_epochs(secs(end + 10), None), None);
    let got = counts(&mut c);
    assert_eq!(got.len(), MAX_PENDING_COUNTS);
    assert_eq!(got[0].epoch, extra + 10, "the oldest are dropped");
    assert_eq!(got.last().unwrap().epoch, end + 9);
}

/// Two ready VMs under a leader's decision of 20 req/s: ρ·20 = 12 admissions per epoch;
/// a share s admits ⌊s·12⌋ (the quota carries fractions).
#[test]
fn the_budget_share_scales_the_admissions_of_each_epoch() {
    let mut c = core(true);
    c.set_pool_writer(Time::ZERO, false);
    c.adopt_ready_vm(Time::ZERO);
    c.adopt_ready_vm(Time::ZERO);
    c.apply_decision(Time::ZERO, 0, decision(2, 20.0));
    assert_eq!(send(&mut c, 0, 40), 12, "share 1");
    c.set_budget_share(secs(1), 0.25);
    assert_eq!(c.controller().budget_share(), 0.25);
    assert_eq!(send(&mut c, 1, 40), 3, "a quarter of ρ·vm_reqs");
    assert_eq!(c.controller().status().published_vm_reqs_rps, 5.0);
    c.set_budget_share(secs(2), f64::NAN);
    assert_eq!(c.controller().budget_share(), 1.0, "NaN: the whole budget");
    assert_eq!(send(&mut c, 2, 40), 12);
    c.set_budget_share(secs(3), 1.7);
    assert_eq!(c.controller().budget_share(), 1.0);
    assert_eq!(send(&mut c, 3, 40), 12);
    c.set_budget_share(secs(4), -0.5);
    assert_eq!(c.controller().budget_share(), 0.0);
    assert_eq!(send(&mut c, 4, 40), 0);
}

#[test]
fn a_follower_takes_the_leaders_decision_and_leaves_the_pool_alone() {
    let mut c = core(true);
    assert!(
        c.controller().is_pool_writer(),
        "a single gateway writes its pool"
    );
    c.set_pool_writer(Time::ZERO, false);
    assert!(!c.controller().is_pool_writer());
    c.apply_decision(ms(100), 7, decision(3, 25.0));
    let a = drain(&mut c);
    assert!(launches(&a).is_empty(), "{a:?}");
    assert_eq!(decisions(&a), vec![(7, decision(3, 25.0))]);
    let st = c.controller().status();
    assert_eq!((st.pool.target, st.vm_reqs_rps), (3, 25.0));
    assert_eq!(st.published_vm_reqs_rps, 0.0, "no VM ready yet");
    // Registry VMs: ready at once, the target stays the leader's.
    let vm = c.adopt_ready_vm(ms(200));
    c.adopt_ready_vm(ms(200));
    assert_eq!(c.controller().status().published_vm_reqs_rps, 20.0);
    c.apply_decision(ms(300), 8, decision(0, 0.0));
    c.adopt_ready_vm(ms(300));
    assert_eq!(
        c.controller().pool().target,
        0,
        "adopting does not raise it"
    );
    let a = drain(&mut c);
    assert!(
        !a.iter()
            .any(|a| matches!(a, Action::Scaling(controller::Action::Stop { .. }))),
        "a lower target drains nothing: {a:?}"
    );
    // A dead registry VM is not replaced by a follower.
    c.apply_decision(ms(400), 9, decision(3, 25.0));
    c.on_vm_died(ms(500), vm);
    assert!(launches(&drain(&mut c)).is_empty());
    // Becoming the writer brings the pool to the target at once: 2 active, 1 launch.
    c.set_pool_writer(ms(600), true);
    assert_eq!(launches(&drain(&mut c)).len(), 1);
    c.set_pool_writer(ms(700), true);
    assert!(drain(&mut c).is_empty(), "already the writer");
    // The writer replaces a dead VM and raises the target when adopting.
    let ready = c.controller().vms().rows()[0].id;
    c.on_vm_died(ms(800), ready);
    assert_eq!(launches(&drain(&mut c)).len(), 1);
    c.adopt_ready_vm(ms(900));
    c.adopt_ready_vm(ms(900));
    assert_eq!(c.controller().pool().target, 5, "3 active + 2 adopted");
}

#[test]
fn a_pool_spillway_does_not_scale_stays_untouched_by_the_writer_flag() {
    let mut c = core(false);
    c.adopt_ready_vm(Time::ZERO);
    c.set_pool_writer(Time::ZERO, false);
    c.apply_decision(ms(10), 0, decision(4, 40.0));
    c.set_pool_writer(ms(20), true);
    assert!(launches(&drain(&mut c)).is_empty());
    assert_eq!(c.controller().status().published_vm_reqs_rps, R_MAX);
}

#[test]
fn a_vm_leaving_the_registry_drains_then_is_forgotten() {
    let mut c = core(true);
    c.set_pool_writer(Time::ZERO, false);
    let idle = c.adopt_ready_vm(Time::ZERO);
    let busy = c.adopt_ready_vm(Time::ZERO);
    c.apply_decision(Time::ZERO, 0, decision(2, 20.0));
    drain(&mut c);
    // One request on each (least loaded first).
    let mut t1 = Ticket::new(RequestMeta::default(), None);
    let mut t2 = Ticket::new(RequestMeta::default(), None);
    let d1 = c.route(ms(10), &mut t1);
    let d2 = c.route(ms(10), &mut t2);
    let on = |d: Decision| match d {
        Decision::Vm { vm, .. } => vm,
        d => panic!("{d:?}"),
    };
    let (v1, v2) = (on(d1), on(d2));
    assert_ne!(v1, v2);
    let (mut t_idle, mut t_busy) = if v1 == idle { (t1, t2) } else { (t2, t1) };
    c.finish(ms(20), &mut t_idle);
    c.drain_vm(ms(30), idle);
    assert_eq!(
        drain(&mut c),
        vec![
            Action::Scaling(controller::Action::Drain { vm: idle }),
            Action::Scaling(controller::Action::Stop { vm: idle })
        ]
    );
    assert_eq!(
        c.controller().status().published_vm_reqs_rps,
        R_MAX,
        "the budget follows the ready VMs at once"
    );
    c.drain_vm(ms(40), busy);
    assert_eq!(
        drain(&mut c),
        vec![Action::Scaling(controller::Action::Drain { vm: busy })]
    );
    c.drain_vm(ms(50), busy);
    c.drain_vm(ms(50), idle);
    assert!(
        drain(&mut c).is_empty(),
        "drained once; unknown ids ignored"
    );
    assert_eq!(c.controller().pool().draining, 1);
    c.finish(ms(60), &mut t_busy);
    assert_eq!(
        drain(&mut c),
        vec![Action::Scaling(controller::Action::Stop { vm: busy })]
    );
}

#[test]
fn a_new_leader_resumes_the_ewmas_where_the_old_one_stopped() {
    let mut old = core(true);
    assert_eq!(old.ewma_state(), None, "nothing closed yet");
    let loads = [12_u64, 30, 18, 41, 25];
    for (e, &n) in loads.iter().enumerate() {
        send(&mut old, e as u64, n);
    }
    old.handle_timeout(secs(5));
    let state = old.ewma_state().expect("five epochs closed");
    let xs: Vec<f64> = loads.iter().map(|&n| n as f64).collect();
    let (avg, std) = ewma(&xs);
    assert_eq!(state.epoch, 4);
    assert_eq!(state.requests, 25);
    assert!((state.avg_per_epoch - avg).abs() < 1e-9);
    assert!((state.std_per_epoch - std).abs() < 1e-9);

    // The new leader started later, counts aggregates, and resumes from `state`.
    let mut new = core(true);
    new.set_count_source(Time::ZERO, CountSource::Aggregate);
    new.handle_timeout(ms(6500));
    new.restore_ewma(&state);
    let st = new.controller().status();
    assert_eq!(st.epoch, Some(4));
    assert_eq!(st.last_epoch_requests, 25);
    assert!((st.avg_rps - avg).abs() < 1e-9 && (st.std_rps - std).abs() < 1e-9);
    assert_eq!(new.ewma_state(), Some(state));
    // Epoch 5 closes from the old EWMAs: the same as the old leader at epoch 5.
    send(&mut old, 5, 33);
    old.handle_timeout(secs(6));
    assert!(new.on_aggregate_count(ms(6500), 5, 33));
    let (a, b) = (old.controller().status(), new.controller().status());
    assert_eq!((a.avg_rps, a.std_rps), (b.avg_rps, b.std_rps));
    assert_eq!(
        a.vm_reqs_rps, b.vm_reqs_rps,
        "epoch 5 is a decision epoch (K = 2)"
    );
}

#[test]
fn a_new_leader_without_state_holds_scale_in_for_the_given_epochs() {
    let mut c = core(true);
    c.set_count_source(Time::ZERO, CountSource::Aggregate);
    for _ in 0..4 {
        c.adopt_ready_vm(Time::ZERO);
    }
    drain(&mut c);
    c.hold_scale_in(4);
    // Decisions after epochs 1 and 3 (K = 2) are held at 4 VMs; the one after epoch 5
    // scales in. 10 req/s → vm_reqs 10 → 1 VM.
    let mut targets = Vec::new();
    for e in 0..6 {
        assert!(c.on_aggregate_count(secs(e + 1), e, 10));
        let a = drain(&mut c);
        if let Some((_, d)) = decisions(&a).last() {
            targets.push((e, d.target_vms, c.controller().pool().active()));
        }
    }
    assert_eq!(targets, vec![(1, 4, 4), (3, 4, 4), (5, 1, 1)]);
    // Load rises (epochs 6–7), then a hold that is ended at once (0) does not stop the
    // scale-in after two empty epochs.
    c.on_aggregate_count(secs(7), 6, 60);
    c.on_aggregate_count(secs(8), 7, 60);
    let high = c.controller().pool().target;
    c.hold_scale_in(10);
    c.hold_scale_in(0);
    c.on_aggregate_count(secs(9), 8, 0);
    c.on_aggregate_count(secs(10), 9, 0);
    assert!(c.controller().pool().target < high, "{high}");
}
