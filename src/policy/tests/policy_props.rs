//! Property tests of the policy core's invariants (LIBRA §III), driven with an injected
//! clock: random arrivals, attempts, VM readiness and completions.

use std::collections::HashMap;
use std::time::Duration;

use proptest::prelude::*;
use spillway_policy::VmId;
use spillway_policy::balancer::VmFirst;
use spillway_policy::balancer::{Attempt, RequestMeta, Route, RouteReason, VmState};
use spillway_policy::controller::{Action, Controller, ControllerParams};
use spillway_policy::monitor::MonitorParams;
use spillway_policy::scaling::{LibraScaler, LibraScalingParams};

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

    /// Algorithm 1: after each report the target is `min_vms` (1) until the first
    /// request, then 0 below the CIP, else clamp(ceil((avg + φ·std) / r_max), min, max).
    #[test]
    fn decisions_follow_algorithm_1(counts in proptest::collection::vec(0u32..200, 1..40), cip in 0.0f64..50.0) {
        let mut c = controller(0.8, 10.0, 2, 1, 12, cip);
        while c.poll_action().is_some() {}
        let mut seen = false;
        for (i, n) in counts.iter().enumerate() {
            let start = Duration::from_millis(500 * i as u64);
            for j in 0..*n {
                c.route(start + Duration::from_micros(u64::from(j)), &RequestMeta::default(), Attempt::First);
            }
            seen |= *n > 0;
            c.handle_timeout(start + Duration::from_millis(500));
            while let Some(a) = c.poll_action() {
                if let Action::Decided { decision, .. } = a {
                    let s = c.status();
                    let expected = if !seen { 1 } else if s.avg_rps < cip { 0 } else {
                        ((s.avg_rps + s.std_rps) / 10.0).ceil().clamp(1.0, 12.0) as u32
                    };
                    prop_assert_eq!(decision.target_vms, expected);
                    prop_assert_eq!(c.pool().target, expected);
                }
            }
        }
    }
}

/// A controller with every Algorithm 1 parameter drawn (φ ≠ 1, α ≠ β ≠ 0.5, a
/// `min_vms` that binds).
#[derive(Clone, Debug)]
struct Alg1 {
    alpha: f64,
    beta: f64,
    phi: f64,
    r_max: f64,
    k: u32,
    min_vms: u32,
    max_vms: u32,
    cip: f64,
}

fn alg1() -> impl Strategy<Value = Alg1> {
    (
        (0.05f64..0.95, 0.05f64..0.95, 0.0f64..3.0, 2.0f64..60.0),
        (1u32..4, 0u32..5, 0u32..10, 0.0f64..40.0),
    )
        .prop_map(
            |((alpha, beta, phi, r_max), (k, min_vms, extra, cip))| Alg1 {
                alpha,
                beta,
                phi,
                r_max,
                k,
                min_vms,
                max_vms: min_vms + extra,
                cip,
            },
        )
}

/// The expected target for one value that may sit on a rounding boundary: every answer
/// the reference allows within 1e-9 (the controller evaluates the same formula in another
/// order).
fn alg1_targets(p: &Alg1, avg_rps: f64, std_rps: f64) -> Vec<u32> {
    let mut out = Vec::new();
    for eps in [-1e-9, 0.0, 1e-9] {
        let t = if avg_rps + eps < p.cip {
            0
        } else {
            let n = ((avg_rps + p.phi * std_rps) / p.r_max + eps)
                .ceil()
                .max(0.0) as u32;
            n.clamp(p.min_vms, p.max_vms)
        };
        if !out.contains(&t) {
            out.push(t);
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Algorithm 1 against an EWMA and a ceil computed here, not read from the
    /// controller's status: after each report (every K epochs) the target is `min_vms`
    /// until the first request, then 0 below the CIP, else
    /// clamp(ceil((avg + φ·std) / r_max), min_vms, max_vms), and that many VMs boot.
    #[test]
    fn decisions_follow_algorithm_1_with_drawn_parameters(
        counts in proptest::collection::vec(prop_oneof![1 => Just(0u32), 4 => 0u32..150], 1..30),
        p in alg1(),
    ) {
        let epoch_s = 0.5;
        let params = ControllerParams {
            monitor: MonitorParams {
                epoch: Duration::from_secs_f64(epoch_s),
                alpha: p.alpha,
                beta: p.beta,
                decision_epochs: p.k,
                first_decision_epoch: None,
            },
            r_max_rps: p.r_max,
            execute_scaling: true,
        };
        let scaler = LibraScaler::new(LibraScalingParams {
            phi: p.phi,
            r_max_rps: p.r_max,
            min_vms: p.min_vms,
            max_vms: p.max_vms,
            cip_rps: p.cip,
        });
        let mut c = Controller::new(params, Box::new(scaler), Box::new(VmFirst::new(0.8)));
        c.start(Duration::ZERO);
        let launched = std::iter::from_fn(|| c.poll_action())
            .filter(|a| matches!(a, Action::Launch { .. }))
            .count();
        prop_assert_eq!(launched, p.min_vms as usize, "min_vms boot at start");
        let mut ewma: Option<(f64, f64)> = None;
        let mut seen = false;
        for (i, &n) in counts.iter().enumerate() {
            let start = Duration::from_millis(500 * i as u64);
            for j in 0..n {
                c.route(start + Duration::from_micros(u64::from(j)), &RequestMeta::default(), Attempt::First);
            }
            c.handle_timeout(start + Duration::from_millis(500));
            let x = f64::from(n);
            seen |= n > 0;
            ewma = Some(match ewma {
                None => (x, 0.0),
                Some((a, d)) => (a + p.alpha * (x - a), d + p.beta * ((x - a).abs() - d)),
            });
            let (avg, std) = ewma.unwrap();
            let (avg_rps, std_rps) = (avg / epoch_s, std / epoch_s);
            let decided: Vec<_> = std::iter::from_fn(|| c.poll_action())
                .filter_map(|a| match a {
                    Action::Decided { decision, epoch, .. } => Some((epoch, decision)),
                    _ => None,
                })
                .collect();
            let report = (i + 1) % p.k as usize == 0;
            prop_assert_eq!(decided.len(), usize::from(report), "epoch {}", i);
            let Some(&(epoch, decision)) = decided.first() else { continue };
            prop_assert_eq!(epoch, i as u64);
            let expected = if seen {
                alg1_targets(&p, avg_rps, std_rps)
            } else {
                vec![p.min_vms]
            };
            prop_assert!(
                expected.contains(&decision.target_vms),
                "epoch {}: avg {} std {} → {:?}, expected {:?}", i, avg_rps, std_rps, decision, expected
            );
            if seen && decision.target_vms > 0 {
                let vm_reqs = avg_rps + p.phi * std_rps;
                prop_assert!((decision.vm_reqs_rps - vm_reqs).abs() <= 1e-9 * vm_reqs.max(1.0), "{:?} vs {}", decision, vm_reqs);
            }
            let pool = c.pool();
            prop_assert_eq!(pool.target, decision.target_vms);
            prop_assert_eq!(pool.booting, decision.target_vms, "no VM became ready: all boot");
        }
    }
}
