//! Property tests of the policy core's invariants (LIBRA §III), driven with an injected
//! clock: random arrivals, attempts, VM readiness and completions.

use std::collections::HashMap;
use std::time::Duration;

use proptest::prelude::*;
use spillway::policy::VmId;
use spillway::policy::balancer::VmFirst;
use spillway::policy::balancer::{Attempt, RequestMeta, Route, RouteReason, VmState};
use spillway::policy::controller::{Action, Controller, ControllerParams};
use spillway::policy::monitor::MonitorParams;
use spillway::policy::scaling::{LibraScaler, LibraScalingParams};

#[derive(Clone, Debug)]
enum Ev {
    Request {
        gap_us: u32,
        upgrade: bool,
        kind: u8,
    },
    Finish(u8),
    Ready(u8),
}

fn ev() -> impl Strategy<Value = Ev> {
    prop_oneof![
        6 => (0u32..200_000, proptest::bool::weighted(0.05), 0u8..10).prop_map(|(gap_us, upgrade, kind)| Ev::Request { gap_us, upgrade, kind }),
        2 => any::<u8>().prop_map(Ev::Finish),
        1 => any::<u8>().prop_map(Ev::Ready),
    ]
}

fn controller(rho: f64, r_max: f64, k: u32, min_vms: u32, max_vms: u32, cip: f64) -> Controller {
    let params = ControllerParams {
        monitor: MonitorParams {
            epoch: Duration::from_millis(500),
            alpha: 0.3,
            beta: 0.3,
            decision_epochs: k,
            first_decision_epoch: None,
        },
        r_max_rps: r_max,
        execute_scaling: true,
    };
    let scaler = LibraScaler::new(LibraScalingParams {
        phi: 1.0,
        r_max_rps: r_max,
        min_vms,
        max_vms,
        cip_rps: cip,
    });
    let mut c = Controller::new(params, Box::new(scaler), Box::new(VmFirst::new(rho)));
    c.start(Duration::ZERO);
    c
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Every attempt gets exactly one decision; VM attempts that take a token (first,
    /// retry, fall-back within budget, but not pinned upgrades) never exceed the bucket: in any prefix, VM routes
    /// ≤ one second's budget + ρ·budget·elapsed, where the budget is at most the
    /// ready capacity; routes only go to ready VMs; draining VMs stop only when idle.
    #[test]
    fn routing_respects_the_bucket_and_the_vm_states(
        events in proptest::collection::vec(ev(), 1..400),
        rho in 0.1f64..1.0,
        r_max in 1.0f64..50.0,
        k in 1u32..6,
        min_vms in 0u32..3,
        cip in 0.0f64..5.0,
    ) {
        let max_vms = 6;
        let mut c = controller(rho, r_max, k, min_vms, max_vms, cip);
        let mut now = Duration::ZERO;
        let mut booting: Vec<VmId> = Vec::new();
        let mut outstanding: HashMap<VmId, u32> = HashMap::new();
        let mut stopped: Vec<VmId> = Vec::new();
        let mut vm_attempts_by_second: HashMap<u64, f64> = HashMap::new();
        let max_budget_tokens = rho * r_max * f64::from(max_vms);
        let drain = |c: &mut Controller, booting: &mut Vec<VmId>, stopped: &mut Vec<VmId>, outstanding: &HashMap<VmId, u32>| {
            while let Some(a) = c.poll_action() {
                match a {
                    Action::Launch { vm } => booting.push(vm),
                    Action::Stop { vm } => {
                        prop_assert_eq!(outstanding.get(&vm).copied().unwrap_or(0), 0, "stopped {} with requests in flight", vm);
                        stopped.push(vm);
                        booting.retain(|b| *b != vm);
                    }
                    _ => {}
                }
            }
            Ok(())
        };
        drain(&mut c, &mut booting, &mut stopped, &outstanding)?;
        for e in events {
            match e {
                Ev::Request { gap_us, upgrade, kind } => {
                    now += Duration::from_micros(u64::from(gap_us));
                    let attempt = match kind {
                        0 => Attempt::SpillBack,
                        1 => match outstanding.keys().next() {
                            Some(&failed) => Attempt::RetryAfterConnectFailure { failed },
                            None => Attempt::First,
                        },
                        _ => Attempt::First,
                    };
                    let meta = RequestMeta { upgrade, idempotent: true };
                    let route = c.route(now, &meta, attempt);
                    match route {
                        Route::Vm { vm, reason } => {
                            let row = c.vms().get(vm).expect("routed VM exists");
                            prop_assert_eq!(row.state, VmState::Ready);
                            if let Attempt::RetryAfterConnectFailure { failed } = attempt {
                                prop_assert_ne!(vm, failed);
                            }
                            *outstanding.entry(vm).or_default() += 1;
                            // Fall-backs without a token are outside the bucket by design.
                            if !upgrade && reason != RouteReason::FallBackOverBudget {
                                *vm_attempts_by_second.entry(now.as_secs()).or_default() += 1.0;
                            }
                        }
                        Route::Function { .. } => {
                            prop_assert!(!upgrade, "upgrades never go to functions");
                            prop_assert!(attempt != Attempt::SpillBack, "a spill-back never returns to functions");
                        }
                        Route::Reject { .. } => {}
                    }
                }
                Ev::Finish(i) => {
                    let mut keys: Vec<VmId> = outstanding.iter().filter(|(_, n)| **n > 0).map(|(v, _)| *v).collect();
                    keys.sort();
                    if !keys.is_empty() {
                        let vm = keys[usize::from(i) % keys.len()];
                        *outstanding.get_mut(&vm).unwrap() -= 1;
                        c.on_vm_request_finished(now, vm);
                    }
                }
                Ev::Ready(i) => {
                    if !booting.is_empty() {
                        let vm = booting.remove(usize::from(i) % booting.len());
                        c.on_vm_ready(now, vm);
                    }
                }
            }
            drain(&mut c, &mut booting, &mut stopped, &outstanding)?;
            let pool = c.pool();
            prop_assert!(pool.target <= max_vms);
            prop_assert!(pool.booting + pool.ready <= pool.target.max(min_vms));
        }
        // Within any one-second window the bucket admits at most its capacity (one second
        // of budget) plus one second of refill.
        for (_, n) in vm_attempts_by_second {
            prop_assert!(n <= 2.0 * max_budget_tokens.max(1.0) + 1.0, "{} VM attempts in one second", n);
        }
    }

    /// Algorithm 1: after each report the target is 0 below the CIP, else
    /// clamp(ceil((avg + φ·std) / r_max), min, max).
    #[test]
    fn decisions_follow_algorithm_1(counts in proptest::collection::vec(0u32..200, 1..40), cip in 0.0f64..50.0) {
        let mut c = controller(0.8, 10.0, 2, 1, 12, cip);
        while c.poll_action().is_some() {}
        for (i, n) in counts.iter().enumerate() {
            let start = Duration::from_millis(500 * i as u64);
            for j in 0..*n {
                c.route(start + Duration::from_micros(u64::from(j)), &RequestMeta::default(), Attempt::First);
            }
            c.handle_timeout(start + Duration::from_millis(500));
            while let Some(a) = c.poll_action() {
                if let Action::Decided { decision, .. } = a {
                    let s = c.status();
                    let expected = if s.avg_rps < cip { 0 } else {
                        ((s.avg_rps + s.std_rps) / 10.0).ceil().clamp(1.0, 12.0) as u32
                    };
                    prop_assert_eq!(decision.target_vms, expected);
                    prop_assert_eq!(c.pool().target, expected);
                }
            }
        }
    }
}
