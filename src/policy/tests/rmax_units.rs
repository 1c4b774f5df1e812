//! Tests written against missed mutants of src/policy/rmax.rs — the adaptive
//! r_max PID controller. Each test drives `RMaxController` through its public API on the
//! injected clock and asserts what an operator sees: r_max after a period, the `/status`
//! report fields (measured quantile, per-VM load, hold and limit with their labels), and
//! the integrator. Inputs sit exactly on the boundaries the code compares against (a
//! window of exactly `min_samples` responses, a latency exactly on target, a per-VM load
//! of exactly `min_load_fraction · r_max`, no ready-VM time), and the anti-windup paths
//! (back-calculation after a rate-limited step, conditional integration at `min_rps` /
//! `max_rps` in both directions) are checked against values computed here by hand from
//! the module's formula `ln r = ln r₀ + kp·e + I + kd·(e − e_prev)`, `I ← I + ki·e`.
//!
//! Latencies are at most 2,047 µs or far beyond the target: an HDR histogram with 3
//! significant digits stores values below 2,048 exactly, so the measured quantile of
//! identical responses is their latency and `e = ln(target / y)` is known exactly here;
//! anything over e·target (or under target / e) is clamped to ∓1 (±1).

use std::time::Duration;

use spillway_policy::Time;
use spillway_policy::rmax::{Hold, Limit, RMaxController, RMaxParams};

/// Asymmetric gains (kp ≠ ki ≠ kd).
const KP: f64 = 0.1;
const KI: f64 = 0.45;
const KD: f64 = 0.03;
/// The load hold's fraction (the gateway uses ρ/2; ≠ 0.5 on purpose).
const LOAD: f64 = 0.375;

fn secs(s: f64) -> Time {
    Duration::from_secs_f64(s)
}

/// p90 against 1 ms (1,000 µs, exact in the histogram), 10 s periods, bounds 2–80 req/s,
/// a rate limit too wide to bind unless a test narrows it.
fn params(start: f64) -> RMaxParams {
    RMaxParams {
        start_rps: start,
        target_quantile: 0.9,
        target: Duration::from_millis(1),
        kp: KP,
        ki: KI,
        kd: KD,
        min_rps: 2.0,
        max_rps: 80.0,
        max_step_rps: 100.0,
        period: Duration::from_secs(10),
        min_load_fraction: LOAD,
    }
}

/// Period `k` (ending at 10·k s): `n` responses of `latency_us` each, then the timeout.
fn period(c: &mut RMaxController, k: u32, n: u32, latency_us: u64) -> Option<f64> {
    for _ in 0..n {
        c.record(Duration::from_micros(latency_us));
    }
    c.handle_timeout(secs(10.0 * f64::from(k)))
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * b.abs().max(1.0)
}

/// Error of a period whose responses all took `latency_us` against the 1 ms target.
fn err(latency_us: f64) -> f64 {
    (1000.0 / latency_us).ln().clamp(-1.0, 1.0)
}

#[test]
fn hold_and_limit_labels_are_the_status_strings() {
    assert_eq!(Hold::TooFewSamples.as_str(), "too_few_samples");
    assert_eq!(Hold::VmsBelowRMax.as_str(), "vms_below_r_max");
    assert_eq!(Limit::Step.as_str(), "max_step");
    assert_eq!(Limit::Min.as_str(), "min");
    assert_eq!(Limit::Max.as_str(), "max");
}

/// A period with no responses and no ready VM shows neither a measured quantile nor a
/// per-VM load on `/status` (not a 0 µs latency, not a NaN load).
#[test]
fn an_empty_period_reports_no_measurement_and_no_per_vm_load() {
    let mut c = RMaxController::new(params(20.0));
    assert_eq!(period(&mut c, 1, 0, 0), None);
    let last = c.status().last.expect("period closed");
    assert_eq!(last.at, secs(10.0));
    assert_eq!(last.samples, 0);
    assert_eq!(last.measured, None);
    assert_eq!(last.per_vm_rps, None);
    assert_eq!(last.error, None);
    assert_eq!(last.hold, Some(Hold::TooFewSamples));
    assert_eq!(last.hold.unwrap().as_str(), "too_few_samples");
    assert_eq!(c.r_max(), 20.0);
}

/// Responses but no ready-VM time (the VMs that served them are gone): the per-VM load
/// is unknown (`None`, not an infinite load), and a fast period raises r_max since the
/// load hold has nothing to say.
#[test]
fn responses_without_ready_vm_time_have_no_per_vm_load_and_still_raise() {
    let mut c = RMaxController::new(params(20.0));
    let r = period(&mut c, 1, 12, 500).expect("raised");
    let e = 2f64.ln();
    assert!(close(r, 20.0 * ((KP + KI) * e).exp()), "{r}");
    let last = c.status().last.unwrap();
    assert_eq!(last.per_vm_rps, None);
    assert_eq!(last.hold, None);
    assert_eq!(last.measured, Some(Duration::from_micros(500)));
}

/// p90 needs ⌈1 / (1 − 0.9)⌉ = 10 responses: nine extend the window, exactly ten are
/// evaluated.
#[test]
fn exactly_min_samples_responses_are_evaluated() {
    let mut c = RMaxController::new(params(20.0));
    c.set_ready_vms(Time::ZERO, 1);
    assert_eq!(period(&mut c, 1, 9, 2000), None);
    assert_eq!(c.status().last.unwrap().hold, Some(Hold::TooFewSamples));
    assert_eq!(c.status().window_samples, 9);

    let mut c = RMaxController::new(params(20.0));
    c.set_ready_vms(Time::ZERO, 1);
    let r = period(&mut c, 1, 10, 2000).expect("evaluated and lowered");
    // e = ln(1000 / 2000) = −ln 2; first period: no derivative.
    assert!(close(r, 20.0 * 2f64.powf(-(KP + KI))), "{r}");
    let last = c.status().last.unwrap();
    assert_eq!((last.samples, last.hold), (10, None));
    assert_eq!(c.status().window_samples, 0);
}

/// A latency exactly on target (e = 0) is not "below target": the load hold does not
/// apply even on a lightly loaded pool, and the derivative of the error change moves
/// r_max.
#[test]
fn latency_exactly_on_target_is_evaluated_even_on_a_light_pool() {
    let mut c = RMaxController::new(params(20.0));
    c.set_ready_vms(Time::ZERO, 1);
    // Period 1: twice the target, e₁ = −ln 2: r₁ = 20·2^−(kp + ki), I = −ki·ln 2.
    let e1 = err(2000.0);
    let r1 = period(&mut c, 1, 10, 2000).expect("lowered");
    assert!(close(r1, 20.0 * (KP * e1 + KI * e1).exp()));
    // Period 2: exactly on target with 1 req/s per VM, below 0.375·r₁ ≈ 5.1.
    assert!(1.0 < LOAD * r1);
    let r2 = period(&mut c, 2, 10, 1000).expect("the derivative moves r_max");
    let last = c.status().last.unwrap();
    assert_eq!(last.error, Some(0.0));
    assert_eq!(last.hold, None);
    // ln r₂ = ln 20 + 0 + I + kd·(0 − e₁).
    let want = 20.0 * (KI * e1 + KD * (0.0 - e1)).exp();
    assert!(close(r2, want), "{r2} vs {want}");
    assert!(r2 > r1);
    assert_eq!(c.status().adjustments, 2);
}

/// The first period exactly on target: r_max stays exactly at the start value and no
/// adjustment is counted, but the period counts as evaluated, not as a load hold. (The
/// command `e^(ln 20 + 0)` is 19.999999999999996 with this machine's libm; it used to
/// count as an adjustment and show in `/status`.)
#[test]
fn a_first_period_on_target_is_no_hold() {
    let mut c = RMaxController::new(params(20.0));
    c.set_ready_vms(Time::ZERO, 3);
    assert_eq!(period(&mut c, 1, 10, 1000), None, "not changed");
    let st = c.status();
    let last = st.last.unwrap();
    assert_eq!((last.error, last.hold, last.limit), (Some(0.0), None, None));
    assert_eq!(st.last_evaluated, Some(last));
    assert_eq!(st.last_adjusted, None);
    assert_eq!((st.integral, st.r_max_rps, st.adjustments), (0.0, 20.0, 0));
}

/// The hold applies to a per-VM load *below* `min_load_fraction · r_max`: at exactly
/// that load (0.375 · 16 = 6 req/s: 120 responses over 2 VMs · 10 s) a fast period raises
/// r_max; one response fewer (5.95 req/s) holds it.
#[test]
fn a_per_vm_load_exactly_at_the_fraction_of_r_max_raises_it() {
    let e = 2f64.ln();
    let mut c = RMaxController::new(params(16.0));
    c.set_ready_vms(Time::ZERO, 2);
    let r = period(&mut c, 1, 120, 500).expect("raised");
    assert!(close(r, 16.0 * ((KP + KI) * e).exp()), "{r}");
    let last = c.status().last.unwrap();
    assert_eq!(last.per_vm_rps, Some(LOAD * 16.0));
    assert_eq!(last.hold, None);

    let mut c = RMaxController::new(params(16.0));
    c.set_ready_vms(Time::ZERO, 2);
    assert_eq!(period(&mut c, 1, 119, 500), None);
    let st = c.status();
    assert_eq!(st.last.unwrap().hold, Some(Hold::VmsBelowRMax));
    assert_eq!(st.last.unwrap().hold.unwrap().as_str(), "vms_below_r_max");
    assert_eq!((st.r_max_rps, st.integral), (16.0, 0.0));
}

/// The threshold is the fraction *times* r_max: 7 req/s per VM is above 0.375 · 16 = 6
/// (raised) though far below 0.375 + 16.
#[test]
fn the_load_threshold_scales_with_r_max() {
    let mut c = RMaxController::new(params(16.0));
    c.set_ready_vms(Time::ZERO, 1);
    let r = period(&mut c, 1, 70, 500).expect("raised");
    assert_eq!(c.status().last.unwrap().per_vm_rps, Some(7.0));
    assert!(close(r, 16.0 * ((KP + KI) * 2f64.ln()).exp()), "{r}");
}

/// Back-calculation: after a rate-limited step the integrator is `ln(r_max / r₀)`, so the
/// next (unlimited) command starts from the r_max in force.
#[test]
fn after_a_rate_limited_step_the_integrator_is_the_applied_position() {
    let mut c = RMaxController::new(RMaxParams {
        max_step_rps: 3.0,
        ..params(20.0)
    });
    c.set_ready_vms(Time::ZERO, 1);
    // Period 1: 10 ms (e = −1): command 20·e^−(kp + ki) ≈ 11.5, cut to 20 − 3 = 17.
    assert!(20.0 * (-(KP + KI)).exp() < 17.0);
    assert_eq!(period(&mut c, 1, 10, 10_000), Some(17.0));
    let st = c.status();
    let last = st.last.unwrap();
    assert_eq!(last.error, Some(-1.0));
    assert_eq!(last.limit, Some(Limit::Step));
    assert_eq!(last.limit.unwrap().as_str(), "max_step");
    let i1 = (17.0f64 / 20.0).ln();
    assert!(close(st.integral, i1), "{} vs {i1}", st.integral);
    assert!(close(last.terms.1, i1));
    // Period 2: on target (e = 0): ln r = ln 20 + 0 + I + kd·(0 − (−1)) = ln 17 + kd.
    let r2 = period(&mut c, 2, 10, 1000).expect("derivative step");
    let want = 17.0 * KD.exp();
    assert!(close(r2, want), "{r2} vs {want}");
    let st = c.status();
    assert_eq!(st.last.unwrap().limit, None);
    assert!(close(st.integral, i1));
    assert_eq!(st.adjustments, 2);
}

/// Conditional integration at `min_rps`: while the error pushes further below the bound
/// `I` keeps its value, and r_max leaves the bound in the first period with a positive
/// error (a plain integrator would have moved I twice and stay near the bound).
#[test]
fn at_the_lower_bound_the_integrator_holds_while_pushed_and_r_max_leaves_at_once() {
    let mut c = RMaxController::new(params(4.0));
    c.set_ready_vms(Time::ZERO, 1);
    // Period 1: e = −1, unlimited: r₁ = 4·e^−0.55 ≈ 2.31, I = −ki.
    let r1 = period(&mut c, 1, 10, 10_000).expect("lowered");
    assert!(close(r1, 4.0 * (-(KP + KI)).exp()));
    assert_eq!(c.status().last.unwrap().limit, None);
    assert!(close(c.status().integral, -KI));
    // Period 2: e = −1 again: command 4·e^(−kp − 2·ki + 0) ≈ 1.47 < 2: at the bound, I
    // stays −ki.
    assert!(4.0 * (-KP - 2.0 * KI).exp() < 2.0);
    assert_eq!(period(&mut c, 2, 10, 10_000), Some(2.0));
    let st = c.status();
    assert_eq!(st.last.unwrap().limit, Some(Limit::Min));
    assert_eq!(st.last.unwrap().limit.unwrap().as_str(), "min");
    assert!(close(st.integral, -KI), "{}", st.integral);
    // Period 3: 500 µs (e = ln 2), 1 req/s ≥ 0.375·2: ln r = ln 4 + kp·e + (−ki + ki·e)
    // + kd·(e + 1).
    let e = 2f64.ln();
    let r3 = period(&mut c, 3, 10, 500).expect("leaves the bound");
    let want = 4.0 * (KP * e - KI + KI * e + KD * (e + 1.0)).exp();
    assert!(close(r3, want), "{r3} vs {want}");
    assert!(r3 > 3.9, "{r3}");
    assert_eq!(c.status().last.unwrap().limit, None);
}

/// Conditional integration at `min_rps`, other arm: a start value below the bound puts
/// r_max at the bound while the command (from r₀) is under it; a positive error pulls the
/// command back up, so `I` integrates although the bound cut the command.
#[test]
fn at_the_lower_bound_the_integrator_moves_when_the_error_pulls_out() {
    let mut c = RMaxController::new(params(1.0));
    assert_eq!(c.r_max(), 2.0, "start clamped to min_rps");
    c.set_ready_vms(Time::ZERO, 1);
    let e1 = 2f64.ln();
    // Period 1: e = ln 2: command 2^(kp + ki) ≈ 1.46 < 2: cut to 2 (no change).
    assert!(((KP + KI) * e1).exp() < 2.0);
    assert_eq!(period(&mut c, 1, 10, 500), None);
    let st = c.status();
    assert_eq!(st.last.unwrap().limit, Some(Limit::Min));
    assert!(close(st.integral, KI * e1), "{}", st.integral);
    assert_eq!(st.adjustments, 0);
    // Period 2: 100 µs (e = +1): ln r = 0 + kp + (ki·ln 2 + ki) + kd·(1 − ln 2) > ln 2.
    let r2 = period(&mut c, 2, 10, 100).expect("leaves the bound");
    let want = (KP + KI * e1 + KI + KD * (1.0 - e1)).exp();
    assert!(close(r2, want), "{r2} vs {want}");
    assert_eq!(c.status().last.unwrap().limit, None);
    assert_eq!(c.status().adjustments, 1);
}

/// Conditional integration at `max_rps`, both arms.
#[test]
fn at_the_upper_bound_the_integrator_holds_when_pushed_and_moves_when_pulled() {
    // Pushed: start 60, e = +1 with the VMs loaded (25 req/s ≥ 0.375·60): command
    // 60·e^(kp + ki) ≈ 104 > 80: cut to 80, I stays 0.
    let mut c = RMaxController::new(params(60.0));
    c.set_ready_vms(Time::ZERO, 1);
    assert!(60.0 * (KP + KI).exp() > 80.0);
    assert_eq!(period(&mut c, 1, 250, 100), Some(80.0));
    let st = c.status();
    assert_eq!(st.last.unwrap().limit, Some(Limit::Max));
    assert_eq!(st.last.unwrap().limit.unwrap().as_str(), "max");
    assert_eq!(st.integral, 0.0);
    // Then twice the target (e = −ln 2): ln r = ln 60 + kp·e + ki·e + kd·(e − 1).
    let e = -(2f64.ln());
    let r = period(&mut c, 2, 250, 2000).expect("leaves the bound");
    let want = 60.0 * (KP * e + KI * e + KD * (e - 1.0)).exp();
    assert!(close(r, want), "{r} vs {want}");

    // Pulled: a start value above the bound (r₀ = 100, r_max = 80) and a latency a little
    // over the target (1,024 µs): the command 100·(1000/1024)^(kp + ki) ≈ 98.7 is still
    // over the bound but the error points down, so I integrates.
    let mut c = RMaxController::new(params(100.0));
    assert_eq!(c.r_max(), 80.0, "start clamped to max_rps");
    c.set_ready_vms(Time::ZERO, 1);
    let e1 = (1000.0f64 / 1024.0).ln();
    assert!(100.0 * ((KP + KI) * e1).exp() > 80.0);
    assert_eq!(period(&mut c, 1, 10, 1024), None);
    let st = c.status();
    assert_eq!(st.last.unwrap().limit, Some(Limit::Max));
    assert!(
        close(st.integral, KI * e1),
        "{} vs {}",
        st.integral,
        KI * e1
    );
    // Period 2: e = −1: ln r = ln 100 − kp + (ki·e₁ − ki) + kd·(−1 − e₁).
    let r2 = period(&mut c, 2, 10, 10_000).expect("lowered");
    let want = 100.0 * (-KP + KI * e1 - KI + KD * (-1.0 - e1)).exp();
    assert!(close(r2, want), "{r2} vs {want}");
}

/// The "no adjustment within rounding" tolerance is relative to r_max: for large r_max
/// `exp(ln r)` misses r by several ulps (more than 1e-12 / r), and a period exactly on
/// target must still leave r_max exactly where it was. (In-diff mutant `* r` → `/ r`.)
#[test]
fn a_period_on_target_leaves_a_large_r_max_exactly_unchanged() {
    let starts: Vec<f64> = (100..20_000)
        .map(f64::from)
        .filter(|r| (r.ln().exp() - r).abs() > 1e-12 / r)
        .take(20)
        .collect();
    assert_eq!(starts.len(), 20, "{starts:?}");
    for start in starts {
        let mut c = RMaxController::new(RMaxParams {
            max_rps: 20_000.0,
            ..params(start)
        });
        c.set_ready_vms(Time::ZERO, 1);
        assert_eq!(period(&mut c, 1, 10, 1000), None, "start {start}");
        let st = c.status();
        assert_eq!((st.r_max_rps, st.adjustments), (start, 0), "start {start}");
        assert_eq!(st.last.unwrap().error, Some(0.0));
    }
}
