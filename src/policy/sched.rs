//! The gateway queue: calls that find no VM slot and no function capacity wait here, in
//! the order chosen in config — call scheduling §4 (Żuk, Przybylski, Rzadca, Cluster
//! 2022; `docs/src/design/papers.md` §4).
//!
//! Each call i has an arrival r'(i) at the gateway, a route key f(i) (its "function",
//! [`super::routes`]) and, once served, a processing time p(i) (from sending the request
//! upstream to the end of the response body; a function cold start excluded). Waiting
//! calls sit in a priority queue whose priority is computed **once, at enqueue**; lower
//! is served first, ties in arrival order (r', even for a call that reached the queue
//! later, after failed attempts):
//!
//! | [`Order`] | priority |
//! |---|---|
//! | `fifo` | r'(i) |
//! | `sept` | E[p(i)] |
//! | `eect` | r'(i) + E[p(i)] |
//! | `rect` | r̄(i) + E[p(i)], r̄(i) = arrival of the previous call of f(i) (its own arrival for the key's first call) |
//! | `fair_choice` | #(f(i), last T) · E[p(i)], the key's arrivals in (r'(i) − T, r'(i)], this one included |
//!
//! E[p(i)] is the mean of the last [`HISTORY`] completed calls of f(i); a key without
//! history uses the mean of the other keys' `E[p]`, or `default_processing` before any call
//! completed.
//!
//! Bounds (papers.md §4: "EECT and RECT cannot starve a call; SEPT can"):
//! * **EECT**: a call enqueued at t with `E[p]` = L starts before every call with
//!   `E[p]` = s that arrived after t + (L − s) (its priority t + L is lower).
//! * **RECT**: a call i starts before every call j whose key's previous arrival r̄(j)
//!   is later than r̄(i) + E[p(i)] − E[p(j)]; as r̄(i) ≤ r'(i), before every call j with
//!   r̄(j) > r'(i) + (E[p(i)] − E[p(j)]). For short calls arriving every d, r̄(j) =
//!   r'(j) − d: the long call starts before every short call arriving after
//!   r'(i) + (L − s) + d.
//!
//! The queue is bounded: [`Scheduler::enqueue`] refuses a call when `max_queue_length`
//! calls wait, and a call waiting `max_queue_wait` leaves with [`Scheduler::expire`]
//! (the driver answers 503 with `Retry-After`). The next expiry is
//! [`Scheduler::poll_timeout`], a row of the core's timer table
//! ([`super::timers::Timer::QueueWait`]).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::Duration;

use hdrhistogram::Histogram;

use super::Time;
use super::routes::KeyId;

/// Completed calls per key whose mean is `E[p]` (call scheduling §4: "the last 10").
pub const HISTORY: usize = 10;

/// The queue discipline (call scheduling §4).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Order {
    /// Arrival order (the paper's baseline).
    #[default]
    Fifo,
    /// Shortest expected processing time first.
    Sept,
    /// Earliest expected completion time: arrival + `E[p]`.
    Eect,
    /// Arrival of the key's previous call + `E[p]`.
    Rect,
    /// Recent call count of the key × `E[p]`.
    FairChoice,
}

impl Order {
    /// Every discipline, in the paper's order.
    pub const ALL: [Order; 5] = [
        Order::Fifo,
        Order::Sept,
        Order::Eect,
        Order::Rect,
        Order::FairChoice,
    ];

    /// Config and label name: `fifo`, `sept`, `eect`, `rect`, `fair_choice`.
    pub fn as_str(self) -> &'static str {
        match self {
            Order::Fifo => "fifo",
            Order::Sept => "sept",
            Order::Eect => "eect",
            Order::Rect => "rect",
            Order::FairChoice => "fair_choice",
        }
    }
}

/// Parameters of the gateway queue.
#[derive(Clone, Debug, PartialEq)]
pub struct SchedParams {
    /// The discipline.
    pub order: Order,
    /// Most waiting calls; a call beyond it is refused (503).
    pub max_queue_length: usize,
    /// Longest wait; then the call leaves the queue (503).
    pub max_queue_wait: Duration,
    /// `E[p]` before any call completed.
    pub default_processing: Duration,
    /// T of fair choice: arrivals counted over this window.
    pub fair_choice_window: Duration,
}

/// What the scheduler noted about a call when it arrived ([`Scheduler::on_arrival`]):
/// kept by the call until it is enqueued (if ever), so that RECT and FC use the arrival,
/// not the enqueue time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Arrival {
    /// The route key.
    pub key: KeyId,
    /// r'(i).
    pub at: Time,
    /// r̄(i): the previous call of the key (its own arrival for the first).
    pub previous: Time,
    /// The key's arrivals in (at − T, at], this one included.
    pub recent: u32,
}

/// Identifier of one queued call (its arrival sequence number).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QueueId(pub u64);

/// The queue was full: the call is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueFull;

/// A waiting call, as handed back by [`Scheduler::pop`] or [`Scheduler::expire`].
#[derive(Clone, Debug, PartialEq)]
pub struct Waiting<T> {
    /// Its id.
    pub id: QueueId,
    /// Its arrival record.
    pub arrival: Arrival,
    /// When it was enqueued.
    pub enqueued: Time,
    /// Its priority (lower first), as a duration: a time for FIFO/EECT/RECT, `E[p]` for
    /// SEPT, count × `E[p]` for fair choice.
    pub priority: Duration,
    /// The driver's or core's data.
    pub payload: T,
}

/// Mean, median and 95th percentile of one measure.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct Summary {
    /// Samples.
    pub count: u64,
    /// Mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 95th percentile.
    pub p95: f64,
}

/// Per-key measures for `/status` and `/metrics`.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct KeyStatus {
    /// Calls of the key waiting now.
    pub queued: usize,
    /// `E[p]` now, ms (the value a call enqueued now would use).
    pub expected_processing_ms: f64,
    /// Completed calls recorded.
    pub completed: u64,
    /// Queue wait of served calls, ms.
    pub wait_ms: Summary,
    /// Response time R = completion − arrival, ms.
    pub response_ms: Summary,
    /// Stretch R / p.
    pub stretch: Summary,
}

#[derive(Clone, Debug)]
struct KeyState {
    history: VecDeque<Duration>,
    last_arrival: Option<Time>,
    recent: VecDeque<Time>,
    queued: usize,
    completed: u64,
    wait_us: Histogram<u64>,
    response_us: Histogram<u64>,
    /// Stretch × 1000.
    stretch_milli: Histogram<u64>,
}

impl KeyState {
    fn new() -> Self {
        let h = || Histogram::new(3).expect("3 significant digits is valid");
        Self {
            history: VecDeque::with_capacity(HISTORY),
            last_arrival: None,
            recent: VecDeque::new(),
            queued: 0,
            completed: 0,
            wait_us: h(),
            response_us: h(),
            stretch_milli: h(),
        }
    }

    fn mean(&self) -> Option<Duration> {
        let n = self.history.len() as u32;
        (n > 0).then(|| self.history.iter().sum::<Duration>() / n)
    }
}

fn summary(h: &Histogram<u64>, scale: f64) -> Summary {
    if h.is_empty() {
        return Summary::default();
    }
    Summary {
        count: h.len(),
        mean: h.mean() / scale,
        p50: h.value_at_quantile(0.5) as f64 / scale,
        p95: h.value_at_quantile(0.95) as f64 / scale,
    }
}

/// The gateway queue and the per-key history. See the [module docs](self).
#[derive(Clone, Debug)]
pub struct Scheduler<T> {
    params: SchedParams,
    keys: Vec<KeyState>,
    /// (priority, arrival, seq) → call: ties in arrival order, then enqueue order.
    queue: BTreeMap<(Duration, Time, u64), Waiting<T>>,
    /// seq → (priority, arrival).
    by_id: HashMap<u64, (Duration, Time)>,
    deadlines: BTreeSet<(Time, u64)>,
    seq: u64,
}

impl<T> Scheduler<T> {
    /// An empty queue.
    pub fn new(params: SchedParams) -> Self {
        Self {
            params,
            keys: Vec::new(),
            queue: BTreeMap::new(),
            by_id: HashMap::new(),
            deadlines: BTreeSet::new(),
            seq: 0,
        }
    }

    /// The parameters.
    pub fn params(&self) -> &SchedParams {
        &self.params
    }

    fn key(&mut self, key: KeyId) -> &mut KeyState {
        let i = key.0 as usize;
        if self.keys.len() <= i {
            self.keys.resize_with(i + 1, KeyState::new);
        }
        &mut self.keys[i]
    }

    /// A call of `key` arrived at `now` (every call, queued or not: RECT's r̄ and fair
    /// choice's count are over arrivals).
    pub fn on_arrival(&mut self, now: Time, key: KeyId) -> Arrival {
        let window = self.params.fair_choice_window;
        let k = self.key(key);
        let previous = k.last_arrival.unwrap_or(now);
        k.last_arrival = Some(now);
        while k.recent.front().is_some_and(|&t| t + window <= now) {
            k.recent.pop_front();
        }
        k.recent.push_back(now);
        Arrival {
            key,
            at: now,
            previous,
            recent: k.recent.len() as u32,
        }
    }

    /// `E[p]` of `key`: the mean of its last [`HISTORY`] completed calls; without history
    /// the mean of the other keys' `E[p]`; before any completion `default_processing`.
    pub fn expected(&self, key: KeyId) -> Duration {
        if let Some(m) = self.keys.get(key.0 as usize).and_then(KeyState::mean) {
            return m;
        }
        let means: Vec<Duration> = self.keys.iter().filter_map(KeyState::mean).collect();
        if means.is_empty() {
            self.params.default_processing
        } else {
            means.iter().sum::<Duration>() / means.len() as u32
        }
    }

    /// The priority of a call with `arrival` under the configured order, with `E[p]` as
    /// of now.
    pub fn priority(&self, arrival: &Arrival) -> Duration {
        let e = self.expected(arrival.key);
        match self.params.order {
            Order::Fifo => arrival.at,
            Order::Sept => e,
            Order::Eect => arrival.at.saturating_add(e),
            Order::Rect => arrival.previous.saturating_add(e),
            Order::FairChoice => e.checked_mul(arrival.recent).unwrap_or(Duration::MAX),
        }
    }

    /// Put a call in the queue at `now`, its priority computed now, once.
    ///
    /// # Errors
    /// [`QueueFull`] when `max_queue_length` calls already wait.
    pub fn enqueue(
        &mut self,
        now: Time,
        arrival: Arrival,
        payload: T,
    ) -> Result<QueueId, QueueFull> {
        if self.queue.len() >= self.params.max_queue_length {
            return Err(QueueFull);
        }
        let priority = self.priority(&arrival);
        let seq = self.seq;
        self.seq += 1;
        self.key(arrival.key).queued += 1;
        self.queue.insert(
            (priority, arrival.at, seq),
            Waiting {
                id: QueueId(seq),
                arrival,
                enqueued: now,
                priority,
                payload,
            },
        );
        self.by_id.insert(seq, (priority, arrival.at));
        self.deadlines
            .insert((now.saturating_add(self.params.max_queue_wait), seq));
        Ok(QueueId(seq))
    }

    /// The call served next, without removing it.
    pub fn peek(&self) -> Option<&Waiting<T>> {
        self.queue.values().next()
    }

    /// Remove and return the call served next; its wait is recorded.
    pub fn pop(&mut self, now: Time) -> Option<Waiting<T>> {
        let (&(p, at, seq), _) = self.queue.iter().next()?;
        let w = self.take((p, at), seq)?;
        let wait = now.saturating_sub(w.enqueued);
        let _ = self
            .key(w.arrival.key)
            .wait_us
            .record(wait.as_micros() as u64);
        Some(w)
    }

    fn take(&mut self, (priority, at): (Duration, Time), seq: u64) -> Option<Waiting<T>> {
        let w = self.queue.remove(&(priority, at, seq))?;
        self.by_id.remove(&seq);
        self.deadlines
            .remove(&(w.enqueued.saturating_add(self.params.max_queue_wait), seq));
        let k = self.key(w.arrival.key);
        k.queued = k.queued.saturating_sub(1);
        Some(w)
    }

    /// Remove call `id` (its client went away). `None` when it no longer waits.
    pub fn cancel(&mut self, id: QueueId) -> Option<Waiting<T>> {
        let p = *self.by_id.get(&id.0)?;
        self.take(p, id.0)
    }

    /// Remove every call that has waited `max_queue_wait` at `now`, oldest first.
    pub fn expire(&mut self, now: Time) -> Vec<Waiting<T>> {
        let mut out = Vec::new();
        while let Some(&(at, seq)) = self.deadlines.first() {
            if at > now {
                break;
            }
            let Some(&p) = self.by_id.get(&seq) else {
                self.deadlines.pop_first();
                continue;
            };
            out.extend(self.take(p, seq));
        }
        out
    }

    /// The earliest queue-wait deadline.
    pub fn poll_timeout(&self) -> Option<Time> {
        self.deadlines.first().map(|&(at, _)| at)
    }

    /// Calls waiting.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// Whether no call waits.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// A call of `key` completed: processing time `processing` (feeds `E[p]`) and
    /// response time `response` (arrival to completion; with `processing`, the
    /// stretch).
    pub fn on_completed(&mut self, key: KeyId, processing: Duration, response: Duration) {
        let k = self.key(key);
        if k.history.len() == HISTORY {
            k.history.pop_front();
        }
        k.history.push_back(processing);
        k.completed += 1;
        let _ = k.response_us.record(response.as_micros() as u64);
        if !processing.is_zero() {
            let s = response.as_secs_f64() / processing.as_secs_f64();
            let _ = k.stretch_milli.record((s * 1000.0).round() as u64);
        }
    }

    /// Per-key measures, indexed by [`KeyId`] (keys never seen are absent at the end).
    pub fn status(&self) -> Vec<KeyStatus> {
        (0..self.keys.len())
            .map(|i| {
                let k = &self.keys[i];
                KeyStatus {
                    queued: k.queued,
                    expected_processing_ms: self.expected(KeyId(i as u32)).as_secs_f64() * 1e3,
                    completed: k.completed,
                    wait_ms: summary(&k.wait_us, 1e3),
                    response_ms: summary(&k.response_us, 1e3),
                    stretch: summary(&k.stretch_milli, 1e3),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    fn params(order: Order) -> SchedParams {
        SchedParams {
            order,
            max_queue_length: 100,
            max_queue_wait: Duration::from_secs(30),
            default_processing: ms(50),
            fair_choice_window: Duration::from_secs(60),
        }
    }

    const A: KeyId = KeyId(1);
    const B: KeyId = KeyId(2);
    const C: KeyId = KeyId(3);

    /// History: A (long) 400 ms, B (short) 20 ms, C (medium) 100 ms — and C's mean
    /// comes from two unequal samples, 80 and 120 ms, to check the mean, not the last.
    fn warmed(order: Order) -> Scheduler<&'static str> {
        let mut s = Scheduler::new(params(order));
        s.on_completed(A, ms(400), ms(400));
        s.on_completed(B, ms(20), ms(20));
        s.on_completed(C, ms(80), ms(80));
        s.on_completed(C, ms(120), ms(120));
        s
    }

    /// Arrivals (t ms, key, name): a1 A@1000, b1 B@1010, c1 C@1020, b2 B@1030,
    /// a2 A@1040, b3 B@1500. All queue at arrival. Before this burst, calls that did not
    /// queue: A@0 and B every 100 ms from 100 to 900; C never arrived.
    fn burst(s: &mut Scheduler<&'static str>) -> Vec<&'static str> {
        s.on_arrival(ms(0), A);
        for t in (100..=900).step_by(100) {
            s.on_arrival(ms(t), B);
        }
        for (t, k, name) in [
            (1000, A, "a1"),
            (1010, B, "b1"),
            (1020, C, "c1"),
            (1030, B, "b2"),
            (1040, A, "a2"),
            (1500, B, "b3"),
        ] {
            let arr = s.on_arrival(ms(t), k);
            s.enqueue(ms(t), arr, name).unwrap();
        }
        std::iter::from_fn(|| s.pop(ms(2000)).map(|w| w.payload)).collect()
    }

    #[test]
    fn fifo_serves_in_arrival_order() {
        assert_eq!(
            burst(&mut warmed(Order::Fifo)),
            ["a1", "b1", "c1", "b2", "a2", "b3"]
        );
    }

    #[test]
    fn sept_serves_shortest_expected_first_ties_by_arrival() {
        // E: B 20, C 100 (mean of 80 and 120), A 400.
        assert_eq!(
            burst(&mut warmed(Order::Sept)),
            ["b1", "b2", "b3", "c1", "a1", "a2"]
        );
    }

    /// A call that arrived first but reached the queue later (after failed attempts)
    /// still wins a tie: ties go in arrival order.
    #[test]
    fn ties_go_in_arrival_order_not_enqueue_order() {
        let mut s = warmed(Order::Sept);
        let early = s.on_arrival(ms(100), B);
        let late = s.on_arrival(ms(300), B);
        s.enqueue(ms(300), late, "late").unwrap();
        s.enqueue(ms(900), early, "early").unwrap();
        assert_eq!(s.pop(ms(1000)).unwrap().payload, "early");
    }

    #[test]
    fn eect_orders_by_arrival_plus_expected() {
        // a1 1400, b1 1030, c1 1120, b2 1050, a2 1440, b3 1520.
        assert_eq!(
            burst(&mut warmed(Order::Eect)),
            ["b1", "b2", "c1", "a1", "a2", "b3"]
        );
    }

    #[test]
    fn rect_orders_by_previous_arrival_plus_expected() {
        // r̄: a1 0 (A@0), b1 900, c1 1020 (first C call: own arrival), b2 1010, a2 1000,
        // b3 1030. Priorities: a1 400, b1 920, c1 1120, b2 1030, a2 1400, b3 1050.
        assert_eq!(
            burst(&mut warmed(Order::Rect)),
            ["a1", "b1", "b2", "b3", "c1", "a2"]
        );
    }

    #[test]
    fn fair_choice_orders_by_recent_count_times_expected() {
        // Arrivals in the 60 s window at each arrival (this one included): a1 2 (A@0),
        // b1 10 (nine earlier B), c1 1, b2 11, a2 3, b3 12. Priorities: a1 800, b1 200,
        // c1 100, b2 220, a2 1200, b3 240: the frequent short key yields to C.
        assert_eq!(
            burst(&mut warmed(Order::FairChoice)),
            ["c1", "b1", "b2", "b3", "a1", "a2"]
        );
        // T = 0.5 s, window (r − 500, r]: a1 1 (A@0 gone) → 400; b1: B@600..900 and
        // itself, 5 → 100; c1 100 (ties with b1, arrived later); b2 6 → 120; a2 2 → 800;
        // b3: B@1010, 1030 and itself, 3 → 60.
        let mut s = warmed(Order::FairChoice);
        s.params.fair_choice_window = ms(500);
        assert_eq!(burst(&mut s), ["b3", "b1", "c1", "b2", "a1", "a2"]);
    }

    #[test]
    fn expected_processing_falls_back_to_the_other_keys_then_the_default() {
        let mut s: Scheduler<()> = Scheduler::new(params(Order::Sept));
        assert_eq!(s.expected(A), ms(50), "default before any completion");
        s.on_completed(B, ms(20), ms(20));
        s.on_completed(C, ms(80), ms(80));
        s.on_completed(C, ms(120), ms(120));
        assert_eq!(s.expected(A), ms(60), "mean of B's 20 and C's 100");
        // Only the last 10 count: 10 × 30 ms after a 1 s outlier.
        s.on_completed(A, ms(1000), ms(1000));
        for _ in 0..HISTORY {
            s.on_completed(A, ms(30), ms(30));
        }
        assert_eq!(s.expected(A), ms(30));
    }

    #[test]
    fn the_queue_is_bounded_and_waits_expire() {
        let mut p = params(Order::Fifo);
        p.max_queue_length = 2;
        p.max_queue_wait = ms(700);
        let mut s = Scheduler::new(p);
        let a = s.on_arrival(ms(10), A);
        let id_a = s.enqueue(ms(10), a, 1).unwrap();
        let b = s.on_arrival(ms(300), B);
        s.enqueue(ms(300), b, 2).unwrap();
        let c = s.on_arrival(ms(301), C);
        assert_eq!(s.enqueue(ms(301), c, 3), Err(QueueFull));
        assert_eq!(s.poll_timeout(), Some(ms(710)));
        assert!(s.expire(ms(709)).is_empty());
        let gone = s.expire(ms(710));
        assert_eq!(gone.iter().map(|w| w.id).collect::<Vec<_>>(), [id_a]);
        assert_eq!(s.poll_timeout(), Some(ms(1000)));
        let c = s.on_arrival(ms(800), C);
        let id_c = s.enqueue(ms(800), c, 3).unwrap();
        assert_eq!(s.cancel(id_c).map(|w| w.payload), Some(3));
        assert_eq!(s.cancel(id_c), None);
        assert_eq!(s.status()[B.0 as usize].queued, 1);
        assert_eq!(s.pop(ms(900)).map(|w| w.payload), Some(2));
        assert!(s.is_empty() && s.poll_timeout().is_none());
    }

    /// One server, non-preemptive: serve from the queue whenever it is free; returns the
    /// start time of each call by name.
    fn single_server(
        s: &mut Scheduler<(&'static str, Duration)>,
        arrivals: &[(Duration, KeyId, &'static str, Duration)],
    ) -> HashMap<&'static str, Duration> {
        let mut free_at = Duration::ZERO;
        let mut started = HashMap::new();
        let mut i = 0;
        loop {
            // Enqueue everything that arrived before the server frees.
            while i < arrivals.len() && (arrivals[i].0 <= free_at || s.is_empty()) {
                let (t, k, name, p) = arrivals[i];
                let arr = s.on_arrival(t, k);
                s.enqueue(t, arr, (name, p)).unwrap();
                i += 1;
            }
            let Some(w) = s.pop(free_at) else { break };
            let start = free_at.max(w.arrival.at);
            started.insert(w.payload.0, start);
            free_at = start + w.payload.1;
            s.on_completed(w.arrival.key, w.payload.1, free_at - w.arrival.at);
        }
        started
    }

    #[test]
    fn eect_bound_a_long_call_starts_before_short_calls_arriving_after_t_plus_l_minus_s() {
        let (s_ms, l_ms) = (30u64, 450u64);
        let mut sch = Scheduler::new(SchedParams {
            max_queue_length: 10_000,
            ..params(Order::Eect)
        });
        for _ in 0..HISTORY {
            sch.on_completed(A, ms(l_ms), ms(l_ms));
            sch.on_completed(B, ms(s_ms), ms(s_ms));
        }
        // Short calls every 20 ms (served in 30: arriving faster than served), the long
        // call at t = 200 ms.
        let mut arrivals: Vec<_> = (0..60u64)
            .map(|i| {
                let name: &'static str = Box::leak(format!("s{i}").into_boxed_str());
                (ms(20 * i), B, name, ms(s_ms))
            })
            .collect();
        let t = ms(200);
        arrivals.push((t, A, "long", ms(l_ms)));
        arrivals.sort_by_key(|a| a.0);
        let started = single_server(&mut sch, &arrivals);
        let long = started["long"];
        let bound = t + ms(l_ms) - ms(s_ms);
        for &(at, k, name, _) in &arrivals {
            if k == B && at > bound {
                assert!(
                    long < started[name],
                    "{name} arrived at {at:?} started first"
                );
            }
        }
        // And the bound is tight: some short call arriving at or before it went first.
        assert!(
            arrivals
                .iter()
                .any(|&(at, k, n, _)| k == B && at > t && at <= bound && started[n] < long)
        );
    }

    #[test]
    fn rect_bound_a_long_call_starts_before_short_calls_arriving_after_its_bound() {
        let (s_ms, l_ms, d_ms) = (30u64, 450u64, 20u64);
        let mut sch = Scheduler::new(SchedParams {
            max_queue_length: 10_000,
            ..params(Order::Rect)
        });
        for _ in 0..HISTORY {
            sch.on_completed(A, ms(l_ms), ms(l_ms));
            sch.on_completed(B, ms(s_ms), ms(s_ms));
        }
        let mut arrivals: Vec<_> = (0..60u64)
            .map(|i| {
                let name: &'static str = Box::leak(format!("s{i}").into_boxed_str());
                (ms(d_ms * i), B, name, ms(s_ms))
            })
            .collect();
        let t = ms(210);
        arrivals.push((t, A, "long", ms(l_ms)));
        arrivals.sort_by_key(|a| a.0);
        let started = single_server(&mut sch, &arrivals);
        let long = started["long"];
        // The key's first call: r̄ = its own arrival; short calls: r̄(j) = r'(j) − d.
        let bound = t + ms(l_ms) - ms(s_ms) + ms(d_ms);
        for &(at, k, name, _) in &arrivals {
            if k == B && at > bound {
                assert!(
                    long < started[name],
                    "{name} arrived at {at:?} started first"
                );
            }
        }
    }

    proptest! {
        /// Whatever the order and the interleaving of arrivals, pops, cancels and
        /// expiries: every call leaves exactly once; FIFO pops in arrival order.
        #[test]
        fn no_call_is_lost_or_served_twice(
            order in prop::sample::select(Order::ALL.to_vec()),
            ops in prop::collection::vec((0u8..4, 0u32..4, 1u64..400), 1..200),
        ) {
            let mut s = Scheduler::new(SchedParams {
                max_queue_length: 16,
                max_queue_wait: ms(900),
                ..params(order)
            });
            let mut now = Duration::ZERO;
            let mut admitted = Vec::new();
            let mut left: Vec<u64> = Vec::new();
            let mut popped = Vec::new();
            for (op, key, dt) in ops {
                now += ms(dt);
                left.extend(s.expire(now).into_iter().map(|w| w.payload));
                match op {
                    0 | 1 => {
                        let arr = s.on_arrival(now, KeyId(key));
                        let n = admitted.len() as u64;
                        if s.enqueue(now, arr, n).is_ok() {
                            admitted.push(n);
                        }
                    }
                    2 => if let Some(w) = s.pop(now) {
                        s.on_completed(w.arrival.key, ms(dt), ms(dt));
                        popped.push(w.payload);
                        left.push(w.payload);
                    },
                    _ => if let Some(&n) = admitted.get(dt as usize % admitted.len().max(1))
                        && let Some(w) = s.cancel(QueueId(n))
                    {
                        left.push(w.payload);
                    },
                }
            }
            while let Some(w) = s.pop(now) {
                popped.push(w.payload);
                left.push(w.payload);
            }
            left.sort_unstable();
            prop_assert_eq!(left, admitted.clone());
            if order == Order::Fifo {
                let mut sorted = popped.clone();
                sorted.sort_unstable();
                prop_assert_eq!(popped, sorted);
            }
        }
    }
}
