//! Tests written against missed mutants of src/policy/balancer.rs. They pin
//! what a user sees of the balancer: the `reason` label values of
//! `spillway_routing_decisions_total` and the logs ([`RouteReason::as_str`]), what the
//! baseline routers (MAX/AUTO, FAAS, Spock) inherit from [`RoutingPolicy`]'s default
//! methods — every deferred asynchronous call admitted, no ρ in `/status`, a reload's ρ
//! refused — and the token bucket's refill as [`TokenBucket::available`] reports it, each
//! against values computed here by hand.

use std::collections::HashSet;
use std::time::Duration;

use spillway_policy::balancer::{RouteReason, RoutingPolicy, TokenBucket};
use spillway_policy::baselines::{FunctionOnly, SpockRouter, VmOnly};
use spillway_policy::controller::{Controller, ControllerParams, LibraTuning};
use spillway_policy::monitor::MonitorParams;
use spillway_policy::scaling::{LibraScaler, LibraScalingParams};
use spillway_policy::{Time, VmId};

fn ms(n: u64) -> Time {
    Duration::from_millis(n)
}

/// Every variant once. The match has no wildcard arm, so a new variant fails to compile
/// here until it is given its label below.
fn every_reason() -> Vec<RouteReason> {
    use RouteReason as R;
    let all = vec![
        R::WithinBudget,
        R::BudgetExhausted,
        R::NoReadyVm,
        R::UpgradePinned,
        R::UpgradeNoReadyVm,
        R::SpillBackRejected,
        R::FallBackOverBudget,
        R::VmOnly,
        R::FunctionOnly,
        R::ScalingOut,
        R::VmsSaturated,
        R::QueueFull,
        R::QueueTimeout,
        R::AsyncDeadline,
    ];
    for r in &all {
        match r {
            R::WithinBudget
            | R::BudgetExhausted
            | R::NoReadyVm
            | R::UpgradePinned
            | R::UpgradeNoReadyVm
            | R::SpillBackRejected
            | R::FallBackOverBudget
            | R::VmOnly
            | R::FunctionOnly
            | R::ScalingOut
            | R::VmsSaturated
            | R::QueueFull
            | R::QueueTimeout
            | R::AsyncDeadline => {}
        }
    }
    all
}

/// `FallBackOverBudget` → `fall_back_over_budget`: the variant's name in snake case,
/// derived from its `Debug` name independently of `as_str`.
fn snake_case(camel: &str) -> String {
    let mut out = String::new();
    for (i, c) in camel.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// Missed mutants `RouteReason::as_str` → `""` and → `"xyzzy"`: the `reason` label of
/// `spillway_routing_decisions_total` and of the logs is a fixed, documented value per
/// variant (docs/src/guide/routing.md: a fall-back without a token is counted as `fall_back_over_budget`);
/// dashboards and alerts select on these strings, so every variant has its own
/// snake-case name and no two share one.
#[test]
fn every_route_reason_has_its_own_documented_snake_case_label() {
    use RouteReason as R;
    let documented = [
        (R::WithinBudget, "within_budget"),
        (R::BudgetExhausted, "budget_exhausted"),
        (R::NoReadyVm, "no_ready_vm"),
        (R::UpgradePinned, "upgrade_pinned"),
        (R::UpgradeNoReadyVm, "upgrade_no_ready_vm"),
        (R::SpillBackRejected, "spill_back_rejected"),
        (R::FallBackOverBudget, "fall_back_over_budget"),
        (R::VmOnly, "vm_only"),
        (R::FunctionOnly, "function_only"),
        (R::ScalingOut, "scaling_out"),
        (R::VmsSaturated, "vms_saturated"),
        (R::QueueFull, "queue_full"),
        (R::QueueTimeout, "queue_timeout"),
        (R::AsyncDeadline, "async_deadline"),
    ];
    let all = every_reason();
    assert_eq!(documented.len(), all.len(), "one label per variant");
    for (reason, label) in documented {
        assert!(all.contains(&reason));
        assert_eq!(reason.as_str(), label, "{reason:?}");
        assert_eq!(label, snake_case(&format!("{reason:?}")), "{reason:?}");
    }
    let labels: HashSet<&str> = all.iter().map(|r| r.as_str()).collect();
    assert_eq!(labels.len(), all.len(), "distinct labels: {labels:?}");
    for l in labels {
        assert!(
            !l.is_empty() && l.chars().all(|c| c.is_ascii_lowercase() || c == '_'),
            "{l:?} is not a snake-case label value"
        );
    }
}

/// Missed mutants of `RoutingPolicy`'s default methods (`take_deferred_token` → `false`,
/// `rho` → `Some(1.0)`, `set_rho` → `true`): the baseline routers have no VM budget and
/// no ρ, so they admit every deferred asynchronous call released in idle mode (however
/// many at one instant), report no ρ and refuse a new one.
#[test]
fn baseline_routers_admit_every_deferred_call_and_have_no_rho() {
    let routers: [Box<dyn RoutingPolicy>; 3] = [
        Box::new(VmOnly),
        Box::new(FunctionOnly),
        Box::new(SpockRouter::new(3)),
    ];
    for mut r in routers {
        let name = r.name();
        // A budget of 2 req/s would allow two: the baselines ignore it.
        r.set_vm_budget(ms(0), 2.0);
        let admitted = (0..25).filter(|_| r.take_deferred_token(ms(40))).count();
        assert_eq!(admitted, 25, "{name}");
        assert!(r.take_deferred_token(ms(5_000)), "{name}");
        assert_eq!(r.rho(), None, "{name}");
        assert!(!r.set_rho(0.35), "{name}: no ρ to change");
        assert_eq!(r.rho(), None, "{name}: still none after a reload");
    }
}

fn params() -> ControllerParams {
    ControllerParams {
        monitor: MonitorParams {
            epoch: Duration::from_secs(2),
            alpha: 0.3,
            beta: 0.2,
            decision_epochs: 4,
            first_decision_epoch: None,
        },
        r_max_rps: 3.0,
        execute_scaling: false,
    }
}

fn libra_scaling() -> LibraScalingParams {
    LibraScalingParams {
        phi: 1.5,
        r_max_rps: 3.0,
        min_vms: 0,
        max_vms: 5,
        cip_rps: 0.0,
    }
}

/// The same through the controller (a static pool of two adopted VMs routed by the
/// MAX/AUTO router): deferred calls released in idle mode all get a VM, alternating
/// between the two as their loads tie; `/status` shows no LIBRA tuning — the router has
/// no ρ even beside LIBRA's scaler — and a reload's tuning is refused, changing nothing.
#[test]
fn a_vm_only_controller_admits_deferred_calls_and_refuses_a_libra_reload() {
    let mut c = Controller::new(
        params(),
        Box::new(LibraScaler::new(libra_scaling())),
        Box::new(VmOnly),
    );
    c.start(ms(0));
    let a = c.adopt_ready_vm(ms(0));
    let b = c.adopt_ready_vm(ms(0));
    let t = ms(300);
    let got: Vec<Option<VmId>> = (0..6).map(|_| c.admit_deferred(t, None)).collect();
    let want: Vec<Option<VmId>> = [a, b, a, b, a, b].into_iter().map(Some).collect();
    assert_eq!(got, want);
    assert_eq!(c.vms().get(a).unwrap().outstanding, 3);
    assert_eq!(c.vms().get(b).unwrap().outstanding, 3);
    assert_eq!(c.tuning(), None, "no ρ: no LIBRA tuning in /status");
    let tuning = LibraTuning {
        alpha: 0.4,
        beta: 0.1,
        decision_epochs: 2,
        first_decision_epoch: None,
        scaling: libra_scaling(),
        rho: 0.6,
    };
    assert!(
        !c.retune(t, &tuning),
        "a baseline router takes no LIBRA reload"
    );
    assert_eq!(c.monitor().params().alpha, 0.3, "nothing changed");
}

fn assert_tokens(b: &mut TokenBucket, now: Time, want: f64) {
    let got = b.available(now);
    assert!(
        (got - want).abs() < 1e-9,
        "at {now:?}: {got} tokens, want {want}"
    );
}

/// Missed mutants `TokenBucket::available` → `0.0` and → `-1.0`: the tokens the bucket
/// holds at `now` after refilling at `rate`·dt, capped at one second's worth (at least
/// one token). Computed by hand; asking does not take a token.
#[test]
fn available_reports_the_tokens_refilled_since_the_last_take() {
    let mut b = TokenBucket::new();
    assert_tokens(&mut b, ms(0), 0.0);
    // A raise from rate 0 at 0.5 s starts full: capacity one second of 6/s = 6.
    b.set_rate(ms(500), 6.0);
    assert_tokens(&mut b, ms(500), 6.0);
    for _ in 0..4 {
        assert!(b.try_take(ms(500)));
    }
    assert_tokens(&mut b, ms(500), 2.0);
    // 250 ms later: 2 + 6·0.25 = 3.5, and asking twice takes nothing.
    assert_tokens(&mut b, ms(750), 3.5);
    assert_tokens(&mut b, ms(750), 3.5);
    // 500 ms after the takes: 2 + 6·0.5 = 5.
    assert_tokens(&mut b, ms(1_000), 5.0);
    // Long after: capped at the capacity, 6.
    assert_tokens(&mut b, ms(4_000), 6.0);
    // A lower rate of 2.5/s: capacity 2.5, the tokens above it dropped.
    b.set_rate(ms(4_000), 2.5);
    assert_tokens(&mut b, ms(4_000), 2.5);
    assert!(b.try_take(ms(4_000)));
    assert!(b.try_take(ms(4_000)));
    // 0.5 left; 200 ms at 2.5/s add 0.5.
    assert_tokens(&mut b, ms(4_200), 1.0);
    // Below one token per second the bucket still holds one: 0.4/s for 10 s caps at 1.
    b.set_rate(ms(4_200), 0.4);
    assert!(b.try_take(ms(4_200)));
    assert_tokens(&mut b, ms(5_450), 0.4 * 1.25);
    assert_tokens(&mut b, ms(14_200), 1.0);
}
