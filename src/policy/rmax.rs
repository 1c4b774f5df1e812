//! Adaptive r_max: a PID controller that moves r_max (requests/s one VM serves within the
//! SLA) so that the measured VM latency percentile meets a target — LIBRA §III-B,
//! Algorithm 1 line 3 ("r_max … static from profiling, or adapted by a PID controller from
//! the error between target and measured response time").
//!
//! # Signal, sign and units
//!
//! * **Measurement** `y`: the `target_quantile` (e.g. 0.99) of the response times of every
//!   VM attempt that ended in one control period (live gateway: time from sending the
//!   attempt to the end of its response body; simulator: queue wait + service time). The
//!   driver hands each VM attempt's response time to [`RMaxController::record`]; the
//!   controller keeps them in an HDR histogram (3 significant digits, µs).
//! * **Error** `e = ln(target / y)`, clamped to `[−1, 1]`: positive when the VMs are faster
//!   than the target (headroom: raise r_max), negative when slower (lower r_max). The
//!   logarithm makes "twice too slow" and "twice too fast" equally large errors and keeps
//!   the gains free of units; the clamp keeps an overloaded period (y → ∞) from producing
//!   an unbounded step.
//! * **Output** acts on `ln r_max` (position form, referenced to the start value `r₀`):
//!   `ln r = ln r₀ + kp·e + I + kd·(e − e_prev)` with `I ← I + ki·e`, gains per period and
//!   dimensionless: `ki = 0.5` moves r_max by `e^(0.5·e)`, ≈ +5 % for a latency 10 % below
//!   target. So for any positive gains the integral term pushes r_max down while the
//!   latency is above target; the proportional and derivative terms can still move it up
//!   a little in a period whose (negative) error is smaller than the last one's.
//! * **Limits**, in this order: the step from the current r_max is at most
//!   `max_step_rps` (rate limit), then the result is clamped to `[min_rps, max_rps]`.
//!
//! # Anti-windup: back-calculation at the rate limit, conditional integration at a bound
//!
//! * **Rate limit** (`max_step_rps` cut the step, whether or not a bound then cut it
//!   further): the integrator is set to the applied position, `I = ln(r_max / r₀)`, so
//!   the next command starts from the r_max in force (with this period's P and D terms
//!   kept in `I`: the textbook `ln(r_max / r₀) − p − d` cycled worse in the tests' plant).
//!   Holding `I` there instead would leave it at its value before a long rate-limited
//!   descent (from an overloaded start, `I` stays near 0, i.e. at `r₀`); once the error
//!   shrinks near the target, the command jumps back towards `r₀` and the rate limit
//!   sends r_max up one full step into overload again — a limit cycle of one step
//!   (seen: 20 ↔ 26 req/s from a start of 35).
//! * **Bound** (`min_rps` / `max_rps` cut a command the rate limit let through): `I` is
//!   only updated when the
//!   error pulls back out of the bound; while it pushes further in, `I` keeps its value
//!   (clamping), so it never runs ahead of what was applied and r_max leaves the bound in
//!   the first period whose error points the other way.
//!
//! Two more holds keep the loop from integrating on periods that carry no information
//! about r_max:
//! * fewer than `⌈1 / (1 − q)⌉` samples (a p99 needs 100 responses to exist): the window is
//!   extended into the next period instead of adjusting (`too_few_samples`);
//! * latency below target while the VMs ran below `min_load_fraction · r_max` requests/s
//!   each (ready-VM seconds of the period): r_max did not limit them, so their low latency
//!   says nothing about it and r_max is not raised (`vms_below_r_max`). A latency above
//!   target is never held (the safe direction).
//!
//! # Tuning (the defaults of `libra.r_max_adaptive`)
//!
//! Per period the plant is static with a one-period delay: r_max set at the start of
//! period k decides how many VMs there are (`n = ceil(vm_reqs / r_max)`) and their budget
//! (`ready · r_max`) during period k, whose latency percentile is measured at its end. Near
//! the target, `ln y ≈ ln target + E·ln(r_max / r*)`, where `E` (the *elasticity* of the
//! latency percentile) is `u/(1 − u)` for an M/M/1 queue at utilisation `u`: 1 at 50 %,
//! 2 at 67 %. The integral path alone then gives `x_{k+1} = (1 − E·ki)·x_k` for
//! `x = ln(r_max / r*)`: monotone for `E·ki ≤ 1`, oscillating but converging for
//! `1 < E·ki < 2`. Defaults:
//! * `ki = 0.5`: monotone up to `E = 2`, stable up to `E = 4`; at `E = 1.5` a 2× error
//!   shrinks to 5 % in 4 periods (the spillway simulator's WITS curve has `E` ≈ 1.2–1.8
//!   around r_max 16);
//! * `kp = 0.1`: with a one-period delay a proportional term adds a mode at `≈ −E·kp`
//!   (alternating); `E·kp ≤ 0.2` keeps it small while a fresh error still moves r_max at
//!   once;
//! * `kd = 0`: the derivative of two noisy percentiles amplifies their noise; it only
//!   pays when r_max changes take more than one period to show (VM boots longer than a
//!   period), and then a small `kd` (≤ `kp`) damps the overshoot.

use std::time::Duration;

use hdrhistogram::Histogram;

use super::Time;

/// Largest |error| the PID sees: `e = ln(target / y)` is clamped to `[−1, 1]`.
pub const ERROR_LIMIT: f64 = 1.0;

/// Parameters of the adaptive r_max controller (`libra.r_max_adaptive`).
#[derive(Clone, Debug, PartialEq)]
pub struct RMaxParams {
    /// Start value, requests/s (`libra.r_max_rps`), clamped to `[min_rps, max_rps]`.
    pub start_rps: f64,
    /// The latency quantile controlled, in (0, 1) (`target_percentile / 100`).
    pub target_quantile: f64,
    /// The latency the quantile should meet.
    pub target: Duration,
    /// Proportional gain (per unit of `ln` error).
    pub kp: f64,
    /// Integral gain, per period.
    pub ki: f64,
    /// Derivative gain, per period.
    pub kd: f64,
    /// Lowest r_max, requests/s (> 0).
    pub min_rps: f64,
    /// Highest r_max, requests/s.
    pub max_rps: f64,
    /// Largest change of r_max per period, requests/s (> 0).
    pub max_step_rps: f64,
    /// Control period (`interval_epochs` epochs); adjustments happen at its multiples
    /// since time zero, so they line up with epoch ends and scaling decisions.
    pub period: Duration,
    /// Raise r_max only if the VMs served at least this fraction of it per ready VM during
    /// the period (the gateway uses ρ/2). 0 disables the hold.
    pub min_load_fraction: f64,
}

impl RMaxParams {
    /// Responses a window needs before it is evaluated: `⌈1 / (1 − q)⌉` (100 for p99),
    /// so that at least one response lies beyond the quantile.
    pub fn min_samples(&self) -> u64 {
        let tail = (1.0 - self.target_quantile).max(1e-6);
        (1.0 / tail - 1e-9).ceil().max(1.0) as u64
    }
}

/// Why a period ended without adjusting r_max.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Hold {
    /// Fewer than [`RMaxParams::min_samples`] VM responses: the window is extended.
    TooFewSamples,
    /// Latency below target, but the VMs ran below `min_load_fraction · r_max` each.
    VmsBelowRMax,
}

impl Hold {
    /// Label for `/status` and logs: `too_few_samples`, `vms_below_r_max`.
    pub fn as_str(self) -> &'static str {
        match self {
            Hold::TooFewSamples => "too_few_samples",
            Hold::VmsBelowRMax => "vms_below_r_max",
        }
    }
}

/// Which limit cut the commanded r_max.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Limit {
    /// The rate limit (`max_step_rps`).
    Step,
    /// The lower bound (`min_rps`).
    Min,
    /// The upper bound (`max_rps`).
    Max,
}

impl Limit {
    /// Label for `/status` and logs: `max_step`, `min`, `max`.
    pub fn as_str(self) -> &'static str {
        match self {
            Limit::Step => "max_step",
            Limit::Min => "min",
            Limit::Max => "max",
        }
    }
}

/// What happened at the end of one control period.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PeriodReport {
    /// When the period ended.
    pub at: Time,
    /// VM responses in the evaluated window.
    pub samples: u64,
    /// The measured latency quantile (`None`: no response at all).
    pub measured: Option<Duration>,
    /// VM responses per ready-VM second in the window (`None`: no ready VM time).
    pub per_vm_rps: Option<f64>,
    /// `clamp(ln(target / measured), −1, 1)` (`None` when too few samples).
    pub error: Option<f64>,
    /// The proportional, integral and derivative parts of `ln r_max − ln r₀` (the integral
    /// after this period's update, or kept).
    pub terms: (f64, f64, f64),
    /// r_max before, requests/s.
    pub before_rps: f64,
    /// r_max after, requests/s.
    pub after_rps: f64,
    /// The limit that cut the commanded value, if any.
    pub limit: Option<Limit>,
    /// Why nothing was adjusted, if so.
    pub hold: Option<Hold>,
}

impl PeriodReport {
    /// The change of r_max in this period, requests/s (negative: lowered).
    pub fn adjustment_rps(&self) -> f64 {
        self.after_rps - self.before_rps
    }
}

/// A snapshot for `/status` and metrics.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RMaxStatus {
    /// Current r_max, requests/s.
    pub r_max_rps: f64,
    /// The controlled quantile, (0, 1).
    pub target_quantile: f64,
    /// The target latency.
    pub target: Duration,
    /// Bounds, requests/s.
    pub min_rps: f64,
    /// Upper bound, requests/s.
    pub max_rps: f64,
    /// The integrator (ln units).
    pub integral: f64,
    /// Responses collected in the open window.
    pub window_samples: u64,
    /// When the open period ends.
    pub next_adjustment: Time,
    /// Periods in which r_max changed.
    pub adjustments: u64,
    /// The last period that ended (adjusted or held).
    pub last: Option<PeriodReport>,
    /// The last period that computed an error (its `error`, `measured`, adjustment).
    pub last_evaluated: Option<PeriodReport>,
    /// The last period that changed r_max.
    pub last_adjusted: Option<PeriodReport>,
}

/// The adaptive r_max controller. See the [module docs](self).
#[derive(Clone, Debug)]
pub struct RMaxController {
    p: RMaxParams,
    r: f64,
    integral: f64,
    prev_error: Option<f64>,
    /// Response times of VM attempts in the open window, µs.
    window: Histogram<u64>,
    deadline: Time,
    ready: u32,
    ready_since: Time,
    vm_seconds: f64,
    adjustments: u64,
    last: Option<PeriodReport>,
    last_evaluated: Option<PeriodReport>,
    last_adjusted: Option<PeriodReport>,
}

impl RMaxController {
    /// A controller at time zero, r_max at the (clamped) start value. The first period
    /// ends at `params.period`.
    pub fn new(params: RMaxParams) -> Self {
        let r = params.start_rps.clamp(params.min_rps, params.max_rps);
        Self {
            deadline: params.period,
            p: params,
            r,
            integral: 0.0,
            prev_error: None,
            // 1 µs to 1 h, 3 significant digits; longer responses saturate (and are far
            // over any target anyway).
            window: Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid bounds"),
            ready: 0,
            ready_since: Time::ZERO,
            vm_seconds: 0.0,
            adjustments: 0,
            last: None,
            last_evaluated: None,
            last_adjusted: None,
        }
    }

    /// The parameters.
    pub fn params(&self) -> &RMaxParams {
        &self.p
    }

    /// Current r_max, requests/s.
    pub fn r_max(&self) -> f64 {
        self.r
    }

    /// When the open period ends.
    pub fn poll_timeout(&self) -> Time {
        self.deadline
    }

    /// One VM attempt ended after `latency` (queue + service + transfer).
    #[inline]
    pub fn record(&mut self, latency: Duration) {
        let us = u64::try_from(latency.as_micros())
            .unwrap_or(u64::MAX)
            .max(1);
        self.window.saturating_record(us);
    }

    /// The number of ready VMs changed (or may have) at `now`: integrates ready-VM
    /// seconds for the load hold.
    pub fn set_ready_vms(&mut self, now: Time, ready: u32) {
        self.integrate(now);
        self.ready = ready;
    }

    fn integrate(&mut self, now: Time) {
        if now > self.ready_since {
            self.vm_seconds += f64::from(self.ready) * (now - self.ready_since).as_secs_f64();
            self.ready_since = now;
        }
    }

    /// Close the period if it ended at or before `now`. Returns the new r_max when it
    /// changed. Periods that passed without any call are skipped (their responses, if
    /// any, all belong to the window closed here).
    pub fn handle_timeout(&mut self, now: Time) -> Option<f64> {
        if now < self.deadline {
            return None;
        }
        let at = self.deadline;
        self.integrate(at);
        let behind = (now - at).as_nanos() / self.p.period.as_nanos().max(1);
        let skip = u32::try_from(behind).unwrap_or(u32::MAX).saturating_add(1);
        self.deadline = at.saturating_add(self.p.period.saturating_mul(skip));
        let report = self.evaluate(at);
        self.last = Some(report);
        if report.error.is_some() {
            self.last_evaluated = Some(report);
        }
        let changed = report.after_rps != report.before_rps;
        if changed {
            self.last_adjusted = Some(report);
        }
        changed.then_some(report.after_rps)
    }

    fn evaluate(&mut self, at: Time) -> PeriodReport {
        let samples = self.window.len();
        let measured = (samples > 0)
            .then(|| Duration::from_micros(self.window.value_at_quantile(self.p.target_quantile)));
        let per_vm_rps = (self.vm_seconds > 0.0).then(|| samples as f64 / self.vm_seconds);
        let mut report = PeriodReport {
            at,
            samples,
            measured,
            per_vm_rps,
            error: None,
            terms: (0.0, self.integral, 0.0),
            before_rps: self.r,
            after_rps: self.r,
            limit: None,
            hold: None,
        };
        if samples < self.p.min_samples() {
            // Extend the window into the next period.
            report.hold = Some(Hold::TooFewSamples);
            return report;
        }
        self.window.reset();
        self.vm_seconds = 0.0;
        let y = measured.unwrap_or(Duration::from_micros(1)).as_secs_f64();
        let e = (self.p.target.as_secs_f64() / y.max(1e-6))
            .ln()
            .clamp(-ERROR_LIMIT, ERROR_LIMIT);
        report.error = Some(e);
        if e > 0.0 && per_vm_rps.is_some_and(|l| l < self.p.min_load_fraction * self.r) {
            report.hold = Some(Hold::VmsBelowRMax);
            return report;
        }
        let p = self.p.kp * e;
        let d = self.prev_error.map_or(0.0, |prev| self.p.kd * (e - prev));
        let integral = self.integral + self.p.ki * e;
        let command = (self.p.start_rps.ln() + p + integral + d).exp();
        // A NaN command, or one within rounding of the current r_max (`exp(ln r)` may
        // differ from r in the last bits), is no adjustment: no changed r_max, log line
        // or count.
        let command = if command.is_nan() || (command - self.r).abs() <= 1e-12 * self.r {
            self.r
        } else {
            command
        };
        let stepped = command.clamp(self.r - self.p.max_step_rps, self.r + self.p.max_step_rps);
        let next = stepped.clamp(self.p.min_rps, self.p.max_rps);
        let limit = if next != stepped {
            Some(if next > stepped {
                Limit::Min
            } else {
                Limit::Max
            })
        } else if stepped != command {
            Some(Limit::Step)
        } else {
            None
        };
        if stepped != command {
            // Back-calculation after a rate-limited step, also one a bound then cut
            // further: I takes the applied position (module docs, "Anti-windup").
            self.integral = (next / self.p.start_rps).ln();
        } else if limit.is_none() || (command - next) * e <= 0.0 {
            // Conditional integration: at a bound, keep I while the error pushes
            // further into it.
            self.integral = integral;
        }
        self.prev_error = Some(e);
        if next != self.r {
            self.adjustments += 1;
        }
        self.r = next;
        report.terms = (p, self.integral, d);
        report.after_rps = next;
        report.limit = limit;
        report
    }

    /// A snapshot for `/status` and metrics.
    pub fn status(&self) -> RMaxStatus {
        RMaxStatus {
            r_max_rps: self.r,
            target_quantile: self.p.target_quantile,
            target: self.p.target,
            min_rps: self.p.min_rps,
            max_rps: self.p.max_rps,
            integral: self.integral,
            window_samples: self.window.len(),
            next_adjustment: self.deadline,
            adjustments: self.adjustments,
            last: self.last,
            last_evaluated: self.last_evaluated,
            last_adjusted: self.last_adjusted,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: f64) -> Time {
        Duration::from_secs_f64(s)
    }

    const KP: f64 = 0.1;
    const KI: f64 = 0.45;
    const KD: f64 = 0.03;

    /// Asymmetric gains (kp ≠ ki ≠ kd), 10 s periods, p90 against 250 ms.
    fn params(start: f64) -> RMaxParams {
        RMaxParams {
            start_rps: start,
            target_quantile: 0.9,
            target: Duration::from_millis(250),
            kp: KP,
            ki: KI,
            kd: KD,
            min_rps: 2.0,
            max_rps: 80.0,
            max_step_rps: 6.0,
            period: Duration::from_secs(10),
            min_load_fraction: 0.4,
        }
    }

    /// A latency curve y(r) for an M/M/1-like VM whose response-time quantile is
    /// `s / (1 − r/c)`: with s = 100 ms and c = 20/0.6 req/s the target 250 ms is met at
    /// exactly r* = c·(1 − s/target) = 20 req/s (elasticity there: target/s − 1 = 1.5).
    /// Over capacity the quantile is a minute.
    fn mm1(r: f64) -> Duration {
        let (s, c) = (0.1, 20.0 / 0.6);
        if r < c {
            Duration::from_secs_f64(s / (1.0 - r / c))
        } else {
            Duration::from_secs(60)
        }
    }

    /// Run `periods` periods of a VM loaded at 0.8·r_max, each with 200 responses at
    /// `curve(r_max)` (the quantile of identical samples is that value). Returns r_max
    /// after each period, starting with the start value.
    fn run(
        c: &mut RMaxController,
        periods: u32,
        curve: impl Fn(f64) -> Duration,
        noise: impl Fn(u32) -> f64,
    ) -> Vec<f64> {
        let mut out = vec![c.r_max()];
        c.set_ready_vms(Time::ZERO, 1);
        for k in 1..=periods {
            let y = curve(c.r_max()).mul_f64(noise(k));
            let n = (0.8 * c.r_max() * 10.0).round().max(200.0) as u64;
            for _ in 0..n {
                c.record(y);
            }
            c.handle_timeout(secs(10.0 * f64::from(k)));
            out.push(c.r_max());
        }
        out
    }

    fn converges(start: f64) -> Vec<f64> {
        let mut c = RMaxController::new(params(start));
        let traj = run(&mut c, 12, mm1, |_| 1.0);
        let truth = 20.0;
        let first_inside = traj
            .iter()
            .position(|r| (r / truth - 1.0).abs() <= 0.05)
            .expect("reaches the 5 % band");
        assert!(
            first_inside <= 10
                && traj[first_inside..]
                    .iter()
                    .all(|r| (r / truth - 1.0).abs() <= 0.05),
            "within 5 % of 20 by period 10 and stays: {traj:?}"
        );
        let overshoot = if start < truth {
            traj.iter().copied().fold(0.0, f64::max) / truth - 1.0
        } else {
            1.0 - traj.iter().copied().fold(f64::MAX, f64::min) / truth
        };
        assert!(overshoot <= 0.10, "overshoot {overshoot}: {traj:?}");
        traj
    }

    fn steps(traj: &[f64]) -> Vec<f64> {
        traj.windows(2).map(|w| (w[1] - w[0]).abs()).collect()
    }

    #[test]
    fn from_half_the_true_r_max_it_converges_without_overshoot_and_shrinking_steps() {
        let traj = converges(10.0);
        let s = steps(&traj);
        assert!(
            s.windows(2).all(|w| w[1] <= w[0] + 1e-9),
            "every adjustment at most the previous one: {s:?} ({traj:?})"
        );
    }

    #[test]
    fn from_twice_the_true_r_max_it_converges_and_the_steps_shrink_once_unlimited() {
        let traj = converges(40.0);
        let s = steps(&traj);
        // Overloaded (y = 60 s, e = −1): rate-limited steps of max_step_rps, then the
        // error is measured on the curve and the steps shrink.
        // Steps below 1 % of r* (0.2 req/s) are the alternating proportional mode
        // around the settled value (see the module's tuning notes), not a trend.
        let free = s.iter().position(|d| *d < 6.0 - 1e-9).unwrap();
        assert!(s[..free].iter().all(|d| (d - 6.0).abs() < 1e-9), "{s:?}");
        let fine = s.iter().position(|d| *d < 0.2).unwrap();
        assert!(fine > free, "{s:?}");
        assert!(
            s[free..fine].windows(2).all(|w| w[1] <= w[0] + 1e-9),
            "shrinking after the rate limit: {s:?} ({traj:?})"
        );
        assert!(s[fine..].iter().all(|d| *d < 0.2), "stays settled: {s:?}");
    }

    /// The limit cycle the noisy property found at random (a 20 ↔ 26 req/s cycle from a
    /// high start): while the rate limit cut every step down from 35, conditional
    /// integration held `I` at 0, so once the latency neared the target the command
    /// jumped back towards the start value (`r₀·e^(kp·e + ki·e)`) and the rate limit
    /// sent r_max up by a full step into overload again. Back-calculating `I` to the
    /// applied r_max after a rate-limited step lets it settle.
    #[test]
    fn from_above_capacity_the_rate_limited_descent_settles_instead_of_cycling() {
        for start in [35.0, 38.0, 45.0, 60.0] {
            let mut c = RMaxController::new(params(start));
            let traj = run(&mut c, 30, mm1, |_| 1.0);
            let tail = &traj[15..];
            assert!(
                tail.iter().all(|r| (r / 20.0 - 1.0).abs() <= 0.05),
                "from {start}: settles within 5 % of 20 by period 15: {traj:?}"
            );
            let overload = 20.0 / 0.6;
            let first_under = traj.iter().position(|r| *r < overload).unwrap();
            assert!(
                traj[first_under..].iter().all(|r| *r < overload),
                "from {start}: never back into overload once below capacity: {traj:?}"
            );
        }
    }

    /// The rate limit and a bound cut the same step: a descent from 50 onto
    /// `min_rps` 14.8 just under the true r_max 15. The integrator takes the applied
    /// position there too; holding it (as for a bound alone) kept it one step above the
    /// bound, and the next period jumped back to 20.7 req/s, 2.3× the latency target.
    #[test]
    fn a_step_cut_again_by_a_bound_still_back_calculates() {
        // M/M/1-like: s = 100 ms, capacity 25 req/s: the 250 ms target at 15 req/s.
        let curve = |r: f64| {
            let (s, c) = (0.1, 25.0);
            if r < c {
                Duration::from_secs_f64(s / (1.0 - r / c))
            } else {
                Duration::from_secs(60)
            }
        };
        let mut c = RMaxController::new(RMaxParams {
            min_rps: 14.8,
            ..params(50.0)
        });
        let traj = run(&mut c, 14, curve, |_| 1.0);
        let at_min = traj
            .iter()
            .position(|r| *r == 14.8)
            .expect("reaches min_rps");
        assert!(
            traj[at_min..].iter().all(|r| *r <= 15.0 * 1.05),
            "stays within 5 % of 15 once at the bound: {traj:?}"
        );
    }

    #[test]
    fn latency_above_target_lowers_r_max_and_below_raises_it() {
        let mut c = RMaxController::new(RMaxParams {
            max_step_rps: 100.0,
            ..params(20.0)
        });
        c.set_ready_vms(Time::ZERO, 2);
        // 400 responses at 500 ms: p90 = 500 ms = 2× the target.
        for _ in 0..400 {
            c.record(Duration::from_millis(500));
        }
        let r = c.handle_timeout(secs(10.0)).expect("adjusted");
        let last = c.status().last.unwrap();
        // The quantile comes from the HDR histogram (3 significant digits).
        let y = last.measured.unwrap().as_secs_f64();
        assert!((y / 0.5 - 1.0).abs() < 1e-3, "{y}");
        // e = ln(250/500) ≈ −0.693; first period: no derivative.
        let e = (0.25 / y).ln();
        assert!((e - 0.5f64.ln()).abs() < 1e-3);
        let want = 20.0 * (KP * e + KI * e).exp();
        assert!((r - want).abs() < 1e-9, "{r} vs {want}");
        assert!((last.error.unwrap() - e).abs() < 1e-12);
        assert!((last.adjustment_rps() - (want - 20.0)).abs() < 1e-9);
        // 400 responses over 2 VMs · 10 s.
        assert!((last.per_vm_rps.unwrap() - 20.0).abs() < 1e-9);
        // Then 125 ms (twice as fast as the target), with the VMs loaded: raised, with
        // the derivative of the error change.
        for _ in 0..400 {
            c.record(Duration::from_millis(125));
        }
        let r2 = c.handle_timeout(secs(20.0)).expect("adjusted");
        let y2 = c.status().last.unwrap().measured.unwrap().as_secs_f64();
        let e2 = (0.25 / y2).ln();
        let want2 = 20.0 * (KP * e2 + KI * (e + e2) + KD * (e2 - e)).exp();
        assert!((r2 - want2).abs() < 1e-9, "{r2} vs {want2}");
        assert!(r2 > r);
    }

    #[test]
    fn too_few_samples_extend_the_window_instead_of_adjusting() {
        let mut c = RMaxController::new(params(20.0));
        assert_eq!(c.params().min_samples(), 10, "p90 needs 10 responses");
        c.set_ready_vms(Time::ZERO, 1);
        for _ in 0..6 {
            c.record(Duration::from_millis(900));
        }
        assert_eq!(c.handle_timeout(secs(10.0)), None);
        assert_eq!(c.status().last.unwrap().hold, Some(Hold::TooFewSamples));
        assert_eq!(c.status().window_samples, 6, "kept for the next period");
        for _ in 0..6 {
            c.record(Duration::from_millis(900));
        }
        assert!(c.handle_timeout(secs(20.0)).unwrap() < 20.0);
        assert_eq!(c.status().window_samples, 0);
        let last = c.status().last.unwrap();
        assert_eq!(last.samples, 12);
        assert!(
            (last.per_vm_rps.unwrap() - 0.6).abs() < 1e-9,
            "12 over 20 VM-seconds"
        );
    }

    #[test]
    fn a_fast_but_lightly_loaded_pool_does_not_raise_r_max() {
        let mut c = RMaxController::new(params(20.0));
        // 4 VMs for 10 s with 100 responses: 2.5 req/s per VM < 0.4 · 20.
        c.set_ready_vms(Time::ZERO, 4);
        for _ in 0..100 {
            c.record(Duration::from_millis(50));
        }
        assert_eq!(c.handle_timeout(secs(10.0)), None);
        let st = c.status();
        assert_eq!(st.last.unwrap().hold, Some(Hold::VmsBelowRMax));
        assert_eq!((st.r_max_rps, st.integral), (20.0, 0.0));
        // The same load with latency over the target still lowers it.
        for _ in 0..100 {
            c.record(Duration::from_millis(400));
        }
        assert!(c.handle_timeout(secs(20.0)).unwrap() < 20.0);
    }

    #[test]
    fn the_integrator_does_not_wind_up_against_the_upper_bound() {
        let mut p = params(70.0);
        p.max_step_rps = 100.0;
        let mut c = RMaxController::new(p);
        c.set_ready_vms(Time::ZERO, 1);
        // Ten periods far under the target with the VMs loaded: r_max sits at max_rps.
        for k in 1..=10 {
            for _ in 0..1000 {
                c.record(Duration::from_millis(25));
            }
            c.handle_timeout(secs(10.0 * f64::from(k)));
        }
        let st = c.status();
        assert_eq!(st.r_max_rps, 80.0);
        assert_eq!(st.last.unwrap().limit, Some(Limit::Max));
        // The command (70·e^(kp + ki) with e clamped to 1) was above the bound from the
        // first period on, so I never moved; a plain integrator would hold 10·ki = 4.5
        // and need ~10 periods above the target to come back.
        assert_eq!(st.integral, 0.0);
        // One period at twice the target: r_max leaves the bound at once.
        for _ in 0..1000 {
            c.record(Duration::from_millis(500));
        }
        let r = c.handle_timeout(secs(110.0)).unwrap();
        assert!(r < 70.0, "{r}");
    }

    #[test]
    fn late_calls_close_one_period_and_realign_to_the_period_grid() {
        let mut c = RMaxController::new(params(20.0));
        assert_eq!(c.poll_timeout(), secs(10.0));
        assert_eq!(c.handle_timeout(secs(9.999)), None);
        assert_eq!(c.status().last, None);
        c.handle_timeout(secs(35.0));
        assert_eq!(c.status().last.unwrap().at, secs(10.0));
        assert_eq!(c.poll_timeout(), secs(40.0));
    }

    mod props {
        use super::*;
        use proptest::prelude::*;

        /// One period: `n` responses at `latency_us`, `ready` VMs, and how many periods
        /// late the driver calls (0: on time).
        fn period() -> impl Strategy<Value = (u32, u64, u32, u32)> {
            (0u32..400, 1u64..100_000_000, 0u32..8, 0u32..3)
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(64))]

            /// Bounds, rate limit and a bounded integrator hold for arbitrary gains and
            /// arbitrary (noisy, overloaded, empty) measurements.
            #[test]
            fn bounds_rate_limit_and_integrator_hold_for_any_measurements(
                (kp, ki, kd) in (0.0f64..2.0, 0.01f64..2.0, 0.0f64..1.0),
                (min, span, start_frac, step) in (0.5f64..20.0, 1.0f64..50.0, 0.0f64..1.0, 0.1f64..30.0),
                q in 0.5f64..0.999,
                periods in proptest::collection::vec(period(), 1..60),
            ) {
                let max = min + span;
                let start = min + start_frac * span;
                let p = RMaxParams {
                    start_rps: start,
                    target_quantile: q,
                    target: Duration::from_millis(200),
                    kp, ki, kd,
                    min_rps: min,
                    max_rps: max,
                    max_step_rps: step,
                    period: Duration::from_secs(5),
                    min_load_fraction: 0.4,
                };
                let mut c = RMaxController::new(p);
                let mut now = Time::ZERO;
                let (lo, hi) = ((min / start).ln() - kp - 2.0 * kd, (max / start).ln() + kp + 2.0 * kd);
                for (n, us, ready, late) in periods {
                    c.set_ready_vms(now, ready);
                    for _ in 0..n {
                        c.record(Duration::from_micros(us));
                    }
                    let before = c.r_max();
                    now = c.poll_timeout() + Duration::from_secs(5) * late;
                    c.handle_timeout(now);
                    let r = c.r_max();
                    prop_assert!(r.is_finite() && (min..=max).contains(&r), "{r} outside [{min}, {max}]");
                    prop_assert!((r - before).abs() <= step + 1e-9, "step {} > {step}", r - before);
                    let i = c.status().integral;
                    prop_assert!((lo - 1e-9..=hi + 1e-9).contains(&i), "integral {i} outside [{lo}, {hi}]");
                    prop_assert!(c.poll_timeout() > now);
                }
            }

            /// Under multiplicative noise (±20 % on the latency quantile) around the M/M/1
            /// curve, r_max stays in its bounds and steps, and settles near the true 20
            /// req/s (mean of the last 10 of 40 periods within 10 %).
            #[test]
            fn noisy_measurements_stay_bounded_and_settle_near_the_true_r_max(
                noise in proptest::collection::vec(-0.2f64..0.2, 40),
                start in 10.0f64..40.0,
            ) {
                let mut c = RMaxController::new(params(start));
                let traj = run(&mut c, 40, mm1, |k| 1.0 + noise[k as usize - 1]);
                for w in traj.windows(2) {
                    prop_assert!((w[1] - w[0]).abs() <= 6.0 + 1e-9);
                    prop_assert!((2.0..=80.0).contains(&w[1]));
                }
                let tail = &traj[31..];
                let mean = tail.iter().sum::<f64>() / tail.len() as f64;
                prop_assert!((mean / 20.0 - 1.0).abs() <= 0.10, "mean {mean}: {traj:?}");
            }
        }
    }
}
