//! The retry budget: retries may add at most a fraction of the requests of a sliding
//! window (Finagle's `RetryBudget`: a share of the traffic plus a small floor per second
//! so that a quiet gateway can still retry). It keeps a VM failure from turning into a
//! retry storm: when many attempts fail at once, the ones over the budget answer with
//! their own error instead of being sent again.
//!
//! Sans-IO: time comes in as `now`; counts live in `BUCKETS` buckets of `window / BUCKETS`
//! each, so memory does not grow with the request rate.

use std::time::Duration;

use super::Time;

/// Buckets per window.
const BUCKETS: usize = 10;

/// Parameters of the [`RetryBudget`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RetryBudgetParams {
    /// Retries allowed per first attempt in the window (`gateway.retry_budget_ratio`,
    /// 0.2 = 20 %).
    pub ratio: f64,
    /// The sliding window (`gateway.retry_budget_window_seconds`).
    pub window: Duration,
    /// Retries allowed per second of window whatever the traffic
    /// (`gateway.retry_budget_min_per_second`).
    pub min_per_second: f64,
}

impl Default for RetryBudgetParams {
    /// 20 % of the requests of the last 10 s, plus one retry per second.
    fn default() -> Self {
        Self {
            ratio: 0.2,
            window: Duration::from_secs(10),
            min_per_second: 1.0,
        }
    }
}

/// What `/status` shows of the budget.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RetryBudgetStatus {
    /// First attempts in the window.
    pub requests: u64,
    /// Retries in the window.
    pub retries: u64,
    /// Retries the window allows (`ratio · requests + min_per_second · window`).
    pub allowed: f64,
    /// Retries refused for the budget since start.
    pub refused_total: u64,
    /// Retries granted since start.
    pub retried_total: u64,
}

/// A sliding-window retry budget. See the [module docs](self).
#[derive(Clone, Debug)]
pub struct RetryBudget {
    params: RetryBudgetParams,
    /// (first attempts, retries) per bucket; bucket `i` holds slot `i % BUCKETS`.
    buckets: [(u64, u64); BUCKETS],
    /// The slot number of the newest bucket.
    current: u128,
    /// `current % BUCKETS` (every request counts into it: no 128-bit division per call).
    newest: usize,
    /// When the slot after `current` starts, ns: earlier calls need no division.
    next_slot_ns: u128,
    refused_total: u64,
    retried_total: u64,
}

impl RetryBudget {
    /// Whether retries are on at all: `ratio` and `min_per_second` both zero turn them
    /// off, re-routes of requests never written included.
    pub fn enabled(&self) -> bool {
        self.params.ratio > 0.0 || self.params.min_per_second > 0.0
    }

    /// An empty budget.
    pub fn new(params: RetryBudgetParams) -> Self {
        Self {
            params,
            buckets: [(0, 0); BUCKETS],
            current: 0,
            newest: 0,
            next_slot_ns: 0,
            refused_total: 0,
            retried_total: 0,
        }
    }

    fn slot_len(&self) -> u128 {
        (self.params.window.as_nanos() / BUCKETS as u128).max(1)
    }

    /// Move the window to `now`, clearing buckets that fell out of it.
    fn roll(&mut self, now: Time) {
        let ns = now.as_nanos();
        if ns < self.next_slot_ns {
            return;
        }
        let len = self.slot_len();
        let slot = ns / len;
        self.next_slot_ns = slot.saturating_add(1).saturating_mul(len);
        if slot <= self.current {
            return;
        }
        if slot - self.current >= BUCKETS as u128 {
            self.buckets = [(0, 0); BUCKETS];
        } else {
            for s in self.current + 1..=slot {
                self.buckets[(s % BUCKETS as u128) as usize] = (0, 0);
            }
        }
        self.current = slot;
        self.newest = (slot % BUCKETS as u128) as usize;
    }

    fn newest(&mut self) -> &mut (u64, u64) {
        &mut self.buckets[self.newest]
    }

    /// A first attempt at `now`.
    pub fn on_request(&mut self, now: Time) {
        self.roll(now);
        self.newest().0 += 1;
    }

    /// Whether one more retry fits at `now`; if so it is counted.
    pub fn try_retry(&mut self, now: Time) -> bool {
        self.roll(now);
        let s = self.status_at();
        if s.retries as f64 + 1.0 <= s.allowed {
            self.newest().1 += 1;
            self.retried_total += 1;
            true
        } else {
            self.refused_total += 1;
            false
        }
    }

    fn status_at(&self) -> RetryBudgetStatus {
        let (requests, retries) = self
            .buckets
            .iter()
            .fold((0, 0), |(a, b), &(r, t)| (a + r, b + t));
        RetryBudgetStatus {
            requests,
            retries,
            allowed: self.params.ratio * requests as f64
                + self.params.min_per_second * self.params.window.as_secs_f64(),
            refused_total: self.refused_total,
            retried_total: self.retried_total,
        }
    }

    /// A snapshot (as of the last event).
    pub fn status(&self) -> RetryBudgetStatus {
        self.status_at()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: f64) -> Time {
        Duration::from_secs_f64(s)
    }

    #[test]
    fn retries_are_capped_at_the_ratio_plus_the_floor_and_recover_after_the_window() {
        let p = RetryBudgetParams {
            ratio: 0.15,
            window: Duration::from_secs(4),
            min_per_second: 0.5,
        };
        let mut b = RetryBudget::new(p);
        let n = 120;
        for i in 0..n {
            b.on_request(secs(1.0 + f64::from(i) / 100.0));
        }
        let allowed = p.ratio * f64::from(n) + p.min_per_second * p.window.as_secs_f64();
        let granted = (0..1000).filter(|_| b.try_retry(secs(2.5))).count();
        assert_eq!(granted, allowed.floor() as usize);
        assert_eq!(b.status().refused_total, 1000 - granted as u64);
        // A window later the requests and retries have left it: only the floor remains.
        let granted = (0..1000).filter(|_| b.try_retry(secs(2.5 + 4.0))).count();
        assert_eq!(
            granted,
            (p.min_per_second * p.window.as_secs_f64()).floor() as usize
        );
    }

    #[test]
    fn no_floor_and_no_traffic_means_no_retry() {
        let mut b = RetryBudget::new(RetryBudgetParams {
            ratio: 0.3,
            window: Duration::from_secs(10),
            min_per_second: 0.0,
        });
        assert!(!b.try_retry(secs(1.0)));
        for _ in 0..10 {
            b.on_request(secs(1.0));
        }
        assert_eq!((0..10).filter(|_| b.try_retry(secs(1.5))).count(), 3);
    }

    /// A budget over a 10 s window with no floor, its parameters and its slot length
    /// (seconds).
    fn sliding(ratio: f64) -> (RetryBudgetParams, f64, RetryBudget) {
        let p = RetryBudgetParams {
            ratio,
            window: Duration::from_secs(10),
            min_per_second: 0.0,
        };
        let slot = p.window.as_secs_f64() / BUCKETS as f64;
        (p, slot, RetryBudget::new(p))
    }

    /// Against the mutant `%` → `/` in `RetryBudget::roll`: requests count in the
    /// bucket of their own slot, so as the window slides by fewer than `BUCKETS` slots
    /// they leave it exactly one window after their slot began — not when another slot's
    /// bucket is cleared. The retries granted show it.
    #[test]
    fn requests_stay_in_the_budget_for_one_window_as_it_slides() {
        let (p, slot, mut b) = sliding(0.3);
        let n = 10u32;
        // All in slot 3 (not slot 0: its bucket index differs from slot / BUCKETS).
        let sent = 3.5 * slot;
        for _ in 0..n {
            b.on_request(secs(sent));
        }
        let allowed = (p.ratio * f64::from(n)).floor() as usize;
        // Slot 10: the window (slots 1..=10) slid by seven slots and still holds slot 3.
        let later = sent + 7.0 * slot;
        assert_eq!(
            (0..100).filter(|_| b.try_retry(secs(later))).count(),
            allowed
        );
        assert_eq!(b.status().requests, u64::from(n));
        assert_eq!(b.status().retries, allowed as u64);
        // Slot 13: slot 3 has left the window; the retries of slot 10 are still in it,
        // and with no first attempts left nothing more is allowed.
        let gone = sent + 10.0 * slot;
        assert!(!b.try_retry(secs(gone)));
        assert_eq!(b.status().requests, 0);
        assert_eq!(b.status().retries, allowed as u64);
    }

    /// An event exactly at the start of a slot belongs to that slot: the bucket it reuses
    /// (a window earlier) is cleared first, so the requests of that older slot no longer
    /// raise the retries allowed. (Against the mutant `<` → `<=` in the
    /// fast path of `RetryBudget::roll`.)
    #[test]
    fn an_event_at_a_slot_boundary_starts_the_new_slot() {
        let (p, slot, mut b) = sliding(0.4);
        let (old, recent) = (20u32, 5u32);
        for _ in 0..old {
            b.on_request(secs(0.5 * slot));
        }
        // The last slot of that window: the next event may fall on the boundary after it.
        for _ in 0..recent {
            b.on_request(secs((BUCKETS as f64 - 0.5) * slot));
        }
        // At exactly one window after slot 0 began, slot 0 has left the window.
        let boundary = BUCKETS as f64 * slot;
        let allowed = (p.ratio * f64::from(recent)).floor() as usize;
        assert_eq!(
            (0..100).filter(|_| b.try_retry(secs(boundary))).count(),
            allowed
        );
        assert_eq!(b.status().requests, u64::from(recent));
    }
}
