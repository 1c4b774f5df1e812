//! Traffic Monitor — LIBRA §III-A.
//!
//! Counts the requests that arrive in each epoch (a fixed interval, `epoch_seconds`) and
//! keeps an exponentially weighted moving average of that count and of its deviation:
//!
//! ```text
//! first epoch:  avg = x₁, std = 0
//! afterwards:   avg ← (1−α)·avg + α·x
//!               std ← (1−β)·std + β·|avg_prev − x|
//! ```
//!
//! **"std" is not a standard deviation.** It is the EWMA of the absolute deviation of
//! each epoch's count from the *previous* average, exactly as the LIBRA authors' public
//! simulator computes it; we keep their name because the paper and its equations use it.
//!
//! Every `decision_epochs` (K) completed epochs the monitor produces a [`TrafficReport`]
//! for the scaling manager: after `first_decision_epoch` (F, default K) completed
//! epochs, then after F + K, F + 2K, … The LIBRA authors' simulator decides after
//! epochs 1, K + 1, 2K + 1, … (F = 1): its first VMs boot while the first K epochs run. Internally the EWMAs are in requests per epoch; everything the
//! monitor reports is converted to **requests per second**.
//!
//! Epoch `i` covers `[i·E, (i+1)·E)` on the driver's clock. Epochs with no request count as
//! zero. The driver calls [`TrafficMonitor::handle_timeout`] at or after
//! [`TrafficMonitor::poll_timeout`]; calling it late closes every epoch that ended.

use std::time::Duration;

use super::Time;
use super::shared::EwmaState;

/// Smoothing and reporting parameters of the traffic monitor.
#[derive(Clone, Debug, PartialEq)]
pub struct MonitorParams {
    /// Length of one epoch. Must be non-zero.
    pub epoch: Duration,
    /// EWMA weight of the newest epoch in `avg` (α, 0–1).
    pub alpha: f64,
    /// EWMA weight of the newest deviation in `std` (β, 0–1).
    pub beta: f64,
    /// K: a report is produced every K completed epochs (K ≥ 1).
    pub decision_epochs: u32,
    /// F: the first report after F completed epochs (F ≥ 1), then every K. `None`: K.
    pub first_decision_epoch: Option<u32>,
}

/// What the monitor tells the scaling manager every K epochs — LIBRA §III-A.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TrafficReport {
    /// Index of the epoch whose end produced this report (0-based).
    pub epoch: u64,
    /// EWMA of the request rate, requests/s.
    pub avg_rps: f64,
    /// EWMA absolute deviation of the request rate, requests/s (the paper's "std").
    pub std_rps: f64,
}

/// One completed epoch, as the monitor saw it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EpochClosed {
    /// Index of the epoch (0-based).
    pub epoch: u64,
    /// Requests counted in it.
    pub requests: u64,
    /// `avg` after this epoch, requests/s.
    pub avg_rps: f64,
    /// `std` after this epoch, requests/s.
    pub std_rps: f64,
    /// `Some` every K epochs: the report for the scaling manager.
    pub report: Option<TrafficReport>,
}

/// Empty epochs [`TrafficMonitor::close_empty_epochs`] computes one by one (bit-identical
/// to closing them separately) before it switches to the closed form: 2¹⁷, about 0.3 ms.
pub const EXACT_IDLE_STEPS: u64 = 1 << 17;

/// (avg, std) after `m` empty epochs from (`avg`, `std`), in closed form (see
/// [`TrafficMonitor::close_empty_epochs`]). Equal to `m` steps of the update rule within
/// rounding.
pub fn idle_ewma(avg: f64, std: f64, alpha: f64, beta: f64, m: u64) -> (f64, f64) {
    if m == 0 {
        return (avg, std);
    }
    let (q, r) = (1.0 - alpha, 1.0 - beta);
    let mf = m as f64;
    // Σⱼ₌₀^{m−1} r^{m−1−j}·qʲ = M^{m−1}·Σᵢ₌₀^{m−1} yⁱ with M = max(q, r), y = min/max ≤ 1,
    // and Σ yⁱ = (1 − yᵐ)/(1 − y) = expm1(m·ln y)/expm1(ln y) (no cancellation near 1).
    let (big, small) = if q >= r { (q, r) } else { (r, q) };
    let sum = if big <= 0.0 {
        if m == 1 { 1.0 } else { 0.0 }
    } else {
        let y = small / big;
        let geometric = if y >= 1.0 {
            mf
        } else if y <= 0.0 {
            1.0
        } else {
            let ln_y = ((small - big) / big).ln_1p();
            (mf * ln_y).exp_m1() / ln_y.exp_m1()
        };
        big.powf(mf - 1.0) * geometric
    };
    (avg * q.powf(mf), r.powf(mf) * std + beta * avg.abs() * sum)
}

/// The traffic monitor state machine. See the [module docs](self).
#[derive(Clone, Debug)]
pub struct TrafficMonitor {
    params: MonitorParams,
    /// Index of the epoch currently being counted.
    current: u64,
    count: u64,
    /// `None` until the first epoch closes.
    ewma: Option<(f64, f64)>,
    last_closed: Option<EpochClosed>,
    /// `epoch_start(current + 1)`, kept so that drivers asking after every event need
    /// no multiplication.
    ends_at: Time,
}

impl TrafficMonitor {
    /// A monitor whose epoch 0 starts at time zero.
    ///
    /// # Panics
    /// If `params.epoch` is zero or `params.decision_epochs` is zero (config validation
    /// rejects both before a monitor is built). A `first_decision_epoch` of 0 counts as 1.
    pub fn new(params: MonitorParams) -> Self {
        assert!(!params.epoch.is_zero(), "epoch must be non-zero");
        assert!(params.decision_epochs >= 1, "decision_epochs must be >= 1");
        let ends_at = params.epoch;
        Self {
            params,
            current: 0,
            count: 0,
            ewma: None,
            last_closed: None,
            ends_at,
        }
    }

    /// The parameters this monitor was built with.
    pub fn params(&self) -> &MonitorParams {
        &self.params
    }

    /// Use new smoothing and reporting parameters (α, β, K, F) from the next epoch that
    /// closes on; the EWMAs, the open epoch's count and the epoch grid are kept (a
    /// configuration reload). `params.epoch` is ignored: the epoch
    /// length is fixed for the monitor's life (the epoch grid starts at time zero).
    ///
    /// # Panics
    /// If `params.decision_epochs` is zero (config validation rejects it).
    pub fn retune(&mut self, params: MonitorParams) {
        assert!(params.decision_epochs >= 1, "decision_epochs must be >= 1");
        self.params = MonitorParams {
            epoch: self.params.epoch,
            ..params
        };
    }

    /// Count one request arriving at `now`.
    ///
    /// The caller must first close finished epochs with [`Self::handle_timeout`]; a request
    /// whose `now` lies past the current epoch is counted in the current one (drivers that
    /// process events in time order never do that).
    #[inline]
    pub fn on_request(&mut self, _now: Time) {
        self.count += 1;
    }

    /// When the current epoch ends: the next time [`Self::handle_timeout`] has work.
    #[inline]
    pub fn poll_timeout(&self) -> Time {
        self.ends_at
    }

    /// Start time of epoch `index`: `index · epoch`, exact for any `u64` index (computed
    /// in nanoseconds as `u128`), saturating at [`Duration::MAX`].
    pub fn epoch_start(&self, index: u64) -> Time {
        let ns = self
            .params
            .epoch
            .as_nanos()
            .saturating_mul(u128::from(index));
        let secs = ns / 1_000_000_000;
        match u64::try_from(secs) {
            Ok(s) => Duration::new(s, (ns % 1_000_000_000) as u32),
            Err(_) => Duration::MAX,
        }
    }

    /// Close the current epoch if it ended at or before `now`, returning its summary.
    ///
    /// Call repeatedly until it returns `None` to close several epochs after a gap.
    /// LIBRA §III-A, equations for avg and std.
    pub fn handle_timeout(&mut self, now: Time) -> Option<EpochClosed> {
        if now < self.poll_timeout() {
            return None;
        }
        Some(self.close())
    }

    /// Close the open epoch and the `n − 1` after it, exactly as `n` calls of
    /// [`Self::handle_timeout`] at their ends would with no request counted after this
    /// call (the open epoch keeps what it counted), in O(1) time for any `n` (the
    /// idle stretches of a trace). Returns the last epoch's summary, `None` for `n = 0`;
    /// the reports of the epochs in between are not returned (a driver skipping a
    /// stretch knows its scaling policy repeats them).
    ///
    /// An empty epoch maps (avg, std) to ((1−α)·avg, (1−β)·std + β·|avg|). Up to
    /// [`EXACT_IDLE_STEPS`] epochs are computed with that very rule, stopping early once
    /// the pair no longer changes (in floating point it settles on zero or on a tiny
    /// subnormal after about 1075 / −log₂(1−α) epochs: every further empty epoch leaves
    /// it there), so the result is bit-identical to closing the epochs one by one. Only
    /// past that (α or β below about 0.006) the rest uses the closed form, equal within
    /// rounding: with q = 1−α, r = 1−β after `m` more empty epochs
    /// avg·qᵐ and rᵐ·std + β·avg·Σⱼ₌₀^{m−1} r^{m−1−j}·qʲ.
    pub fn close_empty_epochs(&mut self, n: u64) -> Option<EpochClosed> {
        let mut last = None;
        let mut done = 0;
        let mut settled = false;
        while done < n && done < EXACT_IDLE_STEPS {
            let before = self.ewma;
            let counted = self.count;
            last = Some(self.close());
            done += 1;
            if counted == 0 && before.is_some() && before == self.ewma {
                settled = true;
                break;
            }
        }
        let rest = n - done;
        if rest == 0 {
            return last;
        }
        // Every remaining epoch is empty and starts from the state left above; a settled
        // state stays as it is.
        if !settled {
            let (avg, std) = self.ewma.expect("an epoch closed above");
            let p = &self.params;
            self.ewma = Some(idle_ewma(avg, std, p.alpha, p.beta, rest));
        }
        // Close the last one for real (its bookkeeping, report and summary) from the
        // state one epoch before it: only the counter needs moving, the EWMAs are set.
        self.current += rest - 1;
        let (avg, std) = self.ewma.expect("set above");
        Some(self.summarise(avg, std))
    }

    /// The body of [`Self::handle_timeout`]: close the open epoch.
    fn close(&mut self) -> EpochClosed {
        let x = self.count as f64;
        let (avg, std) = match self.ewma {
            None => (x, 0.0),
            Some((avg_prev, std_prev)) => {
                let p = &self.params;
                let avg = (1.0 - p.alpha) * avg_prev + p.alpha * x;
                let std = (1.0 - p.beta) * std_prev + p.beta * (avg_prev - x).abs();
                (avg, std)
            }
        };
        self.ewma = Some((avg, std));
        self.summarise(avg, std)
    }

    /// Record the open epoch as closed with the EWMAs (per epoch) `avg`, `std` and open
    /// the next one.
    fn summarise(&mut self, avg: f64, std: f64) -> EpochClosed {
        let secs = self.params.epoch.as_secs_f64();
        let index = self.current;
        let completed = index + 1;
        let first = u64::from(
            self.params
                .first_decision_epoch
                .unwrap_or(self.params.decision_epochs)
                .max(1),
        );
        let report = (completed >= first
            && (completed - first).is_multiple_of(u64::from(self.params.decision_epochs)))
        .then(|| TrafficReport {
            epoch: index,
            avg_rps: avg / secs,
            std_rps: std / secs,
        });
        let closed = EpochClosed {
            epoch: index,
            requests: self.count,
            avg_rps: avg / secs,
            std_rps: std / secs,
            report,
        };
        self.current += 1;
        self.ends_at = self.epoch_start(self.current + 1);
        self.count = 0;
        self.last_closed = Some(closed);
        closed
    }

    /// Whether closing one more empty epoch would leave the EWMAs exactly as they are
    /// (they settled while idle; see [`Self::close_empty_epochs`]): from then on every
    /// idle epoch reports the same avg and std.
    pub fn idle_settled(&self) -> bool {
        if self.count > 0 {
            return false;
        }
        match self.ewma {
            None => false,
            Some((avg, std)) => {
                let p = &self.params;
                let next = (
                    (1.0 - p.alpha) * avg + p.alpha * 0.0,
                    (1.0 - p.beta) * std + p.beta * (avg - 0.0).abs(),
                );
                next == (avg, std)
            }
        }
    }

    /// Close the open epoch as if `requests` had been counted in it, whatever was
    /// counted (several gateway replicas: the coordinator hands in the sum of every
    /// replica's count, `policy::shared`). The same update rule and reports as
    /// [`Self::handle_timeout`]; the clock is not consulted (the sum arrives after the
    /// epoch ended).
    pub fn close_with(&mut self, requests: u64) -> EpochClosed {
        self.count = requests;
        self.close()
    }

    /// The EWMAs after the last closed epoch, to hand to another replica (`None` before
    /// the first epoch closed).
    pub fn ewma_state(&self) -> Option<EwmaState> {
        let last = self.last_closed?;
        let (avg, std) = self.ewma?;
        Some(EwmaState {
            epoch: last.epoch,
            avg_per_epoch: avg,
            std_per_epoch: std,
            requests: last.requests,
        })
    }

    /// Resume from another monitor's `state` (a new leader takes over, `policy::shared`):
    /// its EWMAs become this monitor's, `state.epoch` the last closed epoch and
    /// `state.epoch + 1` the open one (empty). Nothing is reported for `state.epoch`.
    pub fn restore(&mut self, state: &EwmaState) {
        let secs = self.params.epoch.as_secs_f64();
        self.ewma = Some((state.avg_per_epoch, state.std_per_epoch));
        self.current = state.epoch + 1;
        self.count = 0;
        self.ends_at = self.epoch_start(self.current + 1);
        self.last_closed = Some(EpochClosed {
            epoch: state.epoch,
            requests: state.requests,
            avg_rps: state.avg_per_epoch / secs,
            std_rps: state.std_per_epoch / secs,
            report: None,
        });
    }

    /// Take the open epoch's count so far out of the monitor (it counts on from zero).
    pub fn take_open_count(&mut self) -> u64 {
        std::mem::take(&mut self.count)
    }

    /// Requests counted so far in the epoch that is still open.
    pub fn current_epoch_requests(&self) -> u64 {
        self.count
    }

    /// Index of the epoch that is still open.
    pub fn current_epoch(&self) -> u64 {
        self.current
    }

    /// The last completed epoch, if any.
    pub fn last_closed(&self) -> Option<&EpochClosed> {
        self.last_closed.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn monitor(k: u32) -> TrafficMonitor {
        TrafficMonitor::new(MonitorParams {
            epoch: Duration::from_secs(2),
            alpha: 0.5,
            beta: 0.25,
            decision_epochs: k,
            first_decision_epoch: None,
        })
    }

    fn feed(m: &mut TrafficMonitor, epoch: u64, n: u64) -> EpochClosed {
        let t = m.epoch_start(epoch);
        for _ in 0..n {
            m.on_request(t);
        }
        m.handle_timeout(m.epoch_start(epoch + 1))
            .expect("epoch closes")
    }

    /// A trace spanning 2³³ s: with 2 s epochs the epoch index passes 2³² (u32) and the
    /// epoch grid keeps advancing — each close moves the deadline one epoch on.
    #[test]
    fn epochs_past_two_to_the_33_seconds_keep_advancing() {
        let mut m = monitor(3);
        let far = (1u64 << 32) + 5;
        assert_eq!(m.epoch_start(far), Duration::from_secs((1 << 33) + 10));
        assert_eq!(m.epoch_start(u64::MAX), Duration::MAX, "saturates");
        m.on_request(Duration::from_millis(300));
        m.close_empty_epochs(far).expect("epochs closed");
        assert_eq!(m.current_epoch(), far);
        assert_eq!(m.poll_timeout(), Duration::from_secs((1 << 33) + 12));
        for _ in 0..7 {
            m.on_request(m.poll_timeout() - Duration::from_millis(700));
        }
        let e = m
            .handle_timeout(Duration::from_secs((1 << 33) + 12))
            .expect("the epoch at 2^33 s closes");
        assert_eq!(e.epoch, far);
        assert_eq!(m.poll_timeout(), Duration::from_secs((1 << 33) + 14));
        assert!(
            m.handle_timeout(Duration::from_secs((1 << 33) + 13))
                .is_none()
        );
    }

    #[test]
    fn equations_match_hand_computation() {
        let mut m = monitor(3);
        // Epoch length 2 s: counts 10, 20, 4 → per-epoch avg/std, reported per second.
        let e0 = feed(&mut m, 0, 10);
        assert_eq!((e0.avg_rps, e0.std_rps), (5.0, 0.0)); // avg = 10/epoch
        assert!(e0.report.is_none());
        let e1 = feed(&mut m, 1, 20);
        // avg = 0.5·10 + 0.5·20 = 15; std = 0.75·0 + 0.25·|10−20| = 2.5
        assert_eq!((e1.avg_rps, e1.std_rps), (7.5, 1.25));
        let e2 = feed(&mut m, 2, 4);
        // avg = 0.5·15 + 0.5·4 = 9.5; std = 0.75·2.5 + 0.25·|15−4| = 4.625
        assert_eq!((e2.avg_rps, e2.std_rps), (4.75, 2.3125));
        let r = e2.report.expect("third epoch reports with K = 3");
        assert_eq!(r.epoch, 2);
        assert_eq!((r.avg_rps, r.std_rps), (4.75, 2.3125));
    }

    #[test]
    fn a_late_call_closes_every_finished_epoch_with_zero_counts() {
        let mut m = monitor(1);
        feed(&mut m, 0, 8);
        let now = m.epoch_start(3);
        let closed: Vec<_> = std::iter::from_fn(|| m.handle_timeout(now)).collect();
        assert_eq!(closed.len(), 2, "epochs 1 and 2 ended by t = 6 s");
        assert_eq!(closed[0].requests, 0);
        // avg: 8 → 4 → 2 per epoch = 1 req/s after epoch 2.
        assert_eq!(closed[1].avg_rps, 1.0);
        assert!(m.handle_timeout(now).is_none());
        assert_eq!(m.poll_timeout(), Duration::from_secs(8));
    }

    #[test]
    fn the_first_report_comes_after_first_decision_epoch_then_every_k() {
        // K = 3, F = 1: reports after epochs 1, 4, 7 (indices 0, 3, 6) — the LIBRA
        // authors' phase. F absent: after 3, 6 (indices 2, 5).
        let mut m = monitor(3);
        m.params.first_decision_epoch = Some(1);
        let reported: Vec<u64> = (0..7)
            .filter_map(|e| feed(&mut m, e, e + 1).report.map(|r| r.epoch))
            .collect();
        assert_eq!(reported, vec![0, 3, 6]);
        let first = feed(&mut monitor(3), 0, 5);
        assert!(first.report.is_none(), "default F = K");
        let mut m = monitor(3);
        let reported: Vec<u64> = (0..7)
            .filter_map(|e| feed(&mut m, e, 1).report.map(|r| r.epoch))
            .collect();
        assert_eq!(reported, vec![2, 5]);
        // The first report carries the EWMA of what was seen so far: one epoch of 4
        // requests over 2 s.
        let mut m = monitor(3);
        m.params.first_decision_epoch = Some(1);
        let r = feed(&mut m, 0, 4).report.expect("F = 1 reports at once");
        assert_eq!((r.avg_rps, r.std_rps), (2.0, 0.0));
    }

    /// Several replicas (`policy::shared`): a sum handed in replaces the local count,
    /// and a state handed over resumes the EWMAs on the next epoch (2 s epochs: the
    /// per-second values are half the per-epoch ones).
    #[test]
    fn a_handed_in_sum_and_a_handed_over_state() {
        let mut m = monitor(2);
        m.on_request(Duration::ZERO);
        assert_eq!(m.take_open_count(), 1);
        assert_eq!(m.current_epoch_requests(), 0);
        let e0 = m.close_with(10);
        assert_eq!((e0.epoch, e0.requests, e0.avg_rps), (0, 10, 5.0));
        let e1 = m.close_with(30);
        // avg = 0.5·10 + 0.5·30 = 20/epoch; std = 0.25·|10−30| = 5/epoch; K = 2 reports.
        assert_eq!((e1.avg_rps, e1.std_rps), (10.0, 2.5));
        assert!(e1.report.is_some());
        let state = m.ewma_state().expect("closed");
        assert_eq!(
            (
                state.epoch,
                state.avg_per_epoch,
                state.std_per_epoch,
                state.requests
            ),
            (1, 20.0, 5.0, 30)
        );
        let mut n = monitor(2);
        assert!(n.ewma_state().is_none());
        n.on_request(Duration::ZERO);
        n.restore(&state);
        assert_eq!(n.current_epoch(), 2);
        assert_eq!(n.current_epoch_requests(), 0, "the open epoch starts empty");
        assert_eq!(
            n.poll_timeout(),
            Duration::from_secs(6),
            "epoch 2 ends at 6 s"
        );
        let last = n.last_closed().expect("restored");
        assert_eq!((last.epoch, last.requests), (1, 30));
        assert_eq!((last.avg_rps, last.std_rps), (10.0, 2.5));
        assert!(last.report.is_none());
        assert_eq!(n.ewma_state(), Some(state));
        // Both close epoch 2 alike.
        assert_eq!(m.close_with(4), n.close_with(4));
    }

    #[test]
    fn no_epoch_closes_before_its_end() {
        let mut m = monitor(1);
        m.on_request(Duration::ZERO);
        assert!(m.handle_timeout(Duration::from_millis(1999)).is_none());
        assert_eq!(m.current_epoch_requests(), 1);
    }

    /// α ≠ β ≠ 0.5: the expectation is an EWMA computed here, so swapping α
    /// and 1 − α, or α and β, or using the new average in the deviation, all fail.
    #[test]
    fn asymmetric_weights_match_an_independent_ewma() {
        let (alpha, beta, epoch_s, k) = (0.3, 0.15, 4.0, 2);
        let mut m = TrafficMonitor::new(MonitorParams {
            epoch: Duration::from_secs_f64(epoch_s),
            alpha,
            beta,
            decision_epochs: k,
            first_decision_epoch: None,
        });
        let counts = [12u64, 40, 0, 7, 33, 33];
        let mut reference: Option<(f64, f64)> = None;
        for (i, &n) in counts.iter().enumerate() {
            let x = n as f64;
            let (avg, std) = match reference {
                None => (x, 0.0),
                Some((a, d)) => (a + alpha * (x - a), d + beta * ((x - a).abs() - d)),
            };
            reference = Some((avg, std));
            let e = feed(&mut m, i as u64, n);
            assert_eq!(e.requests, n);
            assert!(
                (e.avg_rps - avg / epoch_s).abs() < 1e-12,
                "epoch {i}: {e:?}"
            );
            assert!(
                (e.std_rps - std / epoch_s).abs() < 1e-12,
                "epoch {i}: {e:?}"
            );
            assert_eq!(e.report.is_some(), (i + 1) % k as usize == 0, "epoch {i}");
            if let Some(r) = e.report {
                assert_eq!(
                    (r.epoch, r.avg_rps, r.std_rps),
                    (i as u64, e.avg_rps, e.std_rps)
                );
            }
            assert_eq!(m.last_closed(), Some(&e));
            assert_eq!(m.current_epoch(), i as u64 + 1);
        }
        // After epoch 1 by hand: avg = 0.7·12 + 0.3·40 = 20.4, std = 0.15·28 = 4.2.
        let mut m2 = TrafficMonitor::new(m.params().clone());
        feed(&mut m2, 0, 12);
        let e = feed(&mut m2, 1, 40);
        assert!((e.avg_rps * epoch_s - 20.4).abs() < 1e-12);
        assert!((e.std_rps * epoch_s - 4.2).abs() < 1e-12);
    }

    #[test]
    fn epochs_start_at_multiples_of_the_epoch_and_requests_count_in_the_open_one() {
        let mut m = monitor(1);
        assert_eq!(m.poll_timeout(), Duration::from_secs(2));
        assert_eq!(m.epoch_start(3), Duration::from_secs(6));
        m.on_request(Duration::ZERO);
        m.on_request(Duration::from_millis(1));
        assert_eq!(m.current_epoch_requests(), 2);
        assert!(m.last_closed().is_none());
        let e = m.handle_timeout(Duration::from_secs(2)).unwrap();
        assert_eq!((e.epoch, e.requests), (0, 2));
        assert_eq!(m.current_epoch_requests(), 0);
    }
}

#[cfg(test)]
mod props {
    use super::*;
    use proptest::prelude::*;

    fn close_enough(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * a.abs().max(b.abs()) + 1e-300
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(40))]

        /// One `close_empty_epochs(n)` equals `n` single closes — bit for bit
        /// when α, β ≥ 0.01 (the EWMAs settle within the exact steps), within rounding
        /// for smaller weights (the closed form).
        #[test]
        fn n_empty_epochs_at_once_equal_n_single_closes(
            alpha in prop_oneof![0.0005f64..0.01, 0.01f64..=1.0],
            beta in prop_oneof![0.0005f64..0.01, 0.01f64..=1.0],
            history in prop::collection::vec(0u64..5_000, 0..6),
            open in prop_oneof![Just(0u64), 1u64..50],
            n in prop_oneof![1u64..400, 400u64..300_000],
            k in 1u32..500,
            first in prop::option::of(1u32..10),
            epoch_ms in 1u64..5_000,
        ) {
            let mut stepped = TrafficMonitor::new(MonitorParams {
                epoch: Duration::from_millis(epoch_ms),
                alpha,
                beta,
                decision_epochs: k,
                first_decision_epoch: first,
            });
            for &c in &history {
                for _ in 0..c {
                    stepped.on_request(stepped.epoch_start(stepped.current_epoch()));
                }
                stepped.handle_timeout(stepped.poll_timeout()).expect("closes");
            }
            for _ in 0..open {
                stepped.on_request(stepped.epoch_start(stepped.current_epoch()));
            }
            let mut bulk = stepped.clone();
            let mut last = None;
            for _ in 0..n {
                last = stepped.handle_timeout(stepped.poll_timeout());
            }
            let once = bulk.close_empty_epochs(n);
            let (s, b) = (last.expect("n ≥ 1"), once.expect("n ≥ 1"));
            prop_assert_eq!(s.epoch, b.epoch);
            prop_assert_eq!(s.requests, b.requests);
            prop_assert_eq!(s.report.map(|r| r.epoch), b.report.map(|r| r.epoch));
            prop_assert_eq!(stepped.current_epoch(), bulk.current_epoch());
            prop_assert_eq!(stepped.poll_timeout(), bulk.poll_timeout());
            prop_assert_eq!(stepped.last_closed(), Some(&s));
            prop_assert_eq!(bulk.last_closed(), Some(&b));
            if alpha >= 0.01 && beta >= 0.01 {
                prop_assert_eq!(s, b);
            } else {
                prop_assert!(close_enough(s.avg_rps, b.avg_rps), "{:?} / {:?}", s, b);
                prop_assert!(close_enough(s.std_rps, b.std_rps), "{:?} / {:?}", s, b);
            }
            // Either way both go on alike: one more busy epoch.
            for m in [&mut stepped, &mut bulk] {
                for _ in 0..7 {
                    m.on_request(m.epoch_start(m.current_epoch()));
                }
            }
            let (s, b) = (
                stepped.handle_timeout(stepped.poll_timeout()).expect("closes"),
                bulk.handle_timeout(bulk.poll_timeout()).expect("closes"),
            );
            prop_assert!(close_enough(s.avg_rps, b.avg_rps) && close_enough(s.std_rps, b.std_rps));
        }
    }

    /// The closed form itself against the update rule, away from the exact steps: a small
    /// α, β pair (α ≠ β) and α = β (the geometric sum's `y = 1` case).
    #[test]
    fn the_closed_form_follows_the_update_rule() {
        for (alpha, beta) in [(0.003, 0.0007), (0.002, 0.002), (1.0, 0.3), (0.4, 1.0)] {
            let (mut a, mut s) = (812.5f64, 37.25f64);
            for m in 1..=20_000u64 {
                let prev = a;
                a = (1.0 - alpha) * a + alpha * 0.0;
                s = (1.0 - beta) * s + beta * (prev - 0.0).abs();
                if m % 997 == 0 || m <= 3 {
                    let (ca, cs) = idle_ewma(812.5, 37.25, alpha, beta, m);
                    assert!(close_enough(a, ca), "α {alpha} β {beta} m {m}: {a} vs {ca}");
                    assert!(close_enough(s, cs), "α {alpha} β {beta} m {m}: {s} vs {cs}");
                }
            }
        }
    }
}
