//! The delay queue for asynchronous calls and its CPU-aware release scheduler —
//! ProFaaStinate §3 (Schirmer et al., WoSC 2023; `docs/src/design/papers.md`).
//!
//! Asynchronous calls wait here ordered by deadline (earliest deadline first). A
//! scheduler watches a CPU utilisation signal, sampled by the driver every
//! `sample_interval` ([`DelayQueue::sample_due`] → the core emits
//! `Action::SampleCpu`; the answer comes back through [`DelayQueue::on_cpu_sample`]) and
//! averaged over `window`:
//! * **busy** (average above `busy_utilisation`): only calls whose deadline is within
//!   `urgency_window` are released ([`ReleaseKind::Urgent`]); they are routed like a
//!   synchronous request (LIBRA's balancer decides VM or function tier);
//! * **idle**: up to `release_batch` calls per sample tick, earliest deadline first, while
//!   a VM has a free slot and a balancer token ([`ReleaseKind::Idle`]; the policy core
//!   checks the capacity, a released call takes the slot and the token). With no ready
//!   VM at all, idle releases go to the function tier at once.
//!
//! Whatever the mode, a call is released to the function tier at
//! `deadline − (E[p] + deadline_margin)` rather than missed ([`ReleaseKind::Forced`]);
//! `E[p]` is an EWMA of the processing times the driver reports
//! ([`DelayQueue::on_finished`]), which also counts deadline misses.
//!
//! The mode switches at most once per `min_switch` (papers.md §3: sample every 1 s,
//! window 10 s, switch at most every 10 s, urgency window 10 s).
//!
//! Sans-IO: the queue holds ids and deadlines only; the call itself (method, target,
//! headers, body) lives in the driver's durable store.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::time::Duration;

use super::{Tier, Time};

/// Weight of the newest processing time in the `E[p]` EWMA.
const PROCESSING_EWMA_WEIGHT: f64 = 0.2;

/// Parameters of the delay queue and its scheduler (ProFaaStinate §3).
#[derive(Clone, Debug, PartialEq)]
pub struct DelayParams {
    /// Busy above this windowed CPU utilisation, 0–1.
    pub busy_utilisation: f64,
    /// How often the driver samples the CPU signal (paper: 1 s). Idle releases happen
    /// at most once per sample tick.
    pub sample_interval: Duration,
    /// The CPU signal is averaged over this window (paper: 10 s).
    pub window: Duration,
    /// The mode switches at most once per this interval (paper: 10 s).
    pub min_switch: Duration,
    /// When busy, calls whose deadline is this close are released (paper: 10 s).
    pub urgency_window: Duration,
    /// Most idle releases per sample tick.
    pub release_batch: u32,
    /// Safety margin before a deadline: a call goes to the function tier at
    /// `deadline − (E[p] + deadline_margin)`.
    pub deadline_margin: Duration,
    /// Initial expected processing time `E[p]` (before any call finished).
    pub expected_processing: Duration,
    /// Calls one VM runs at once (idle releases need a VM below this); `None`: no slot
    /// limit, the balancer's token alone decides.
    pub vm_slots: Option<u32>,
}

impl Default for DelayParams {
    /// The paper's scheduler timings, 80 % busy threshold, batches of 10.
    fn default() -> Self {
        Self {
            busy_utilisation: 0.8,
            sample_interval: Duration::from_secs(1),
            window: Duration::from_secs(10),
            min_switch: Duration::from_secs(10),
            urgency_window: Duration::from_secs(10),
            release_batch: 10,
            deadline_margin: Duration::from_secs(5),
            expected_processing: Duration::from_secs(1),
            vm_slots: None,
        }
    }
}

/// Identifier of an asynchronous call: 128 random bits chosen by the driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CallId(pub u128);

impl std::fmt::Display for CallId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

impl std::str::FromStr for CallId {
    type Err = std::num::ParseIntError;
    /// 32 hexadecimal digits (what [`Display`](std::fmt::Display) writes).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        u128::from_str_radix(s, 16).map(CallId)
    }
}

/// The scheduler's mode (ProFaaStinate §3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// CPU below the threshold: deferred calls fill the idle capacity.
    Idle,
    /// CPU above the threshold: only urgent calls run.
    Busy,
}

impl Mode {
    /// Label: `idle` or `busy`.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Idle => "idle",
            Mode::Busy => "busy",
        }
    }
}

/// Why a call left the queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReleaseKind {
    /// Idle mode: a VM had a free slot and a token (or no VM was ready at all).
    Idle,
    /// Its deadline is within the urgency window (either mode).
    Urgent,
    /// Its deadline minus `E[p]` and the margin passed: straight to the function tier.
    Forced,
}

impl ReleaseKind {
    /// Label: `idle`, `urgent`, `forced`.
    pub fn as_str(self) -> &'static str {
        match self {
            ReleaseKind::Idle => "idle",
            ReleaseKind::Urgent => "urgent",
            ReleaseKind::Forced => "forced",
        }
    }

    const ALL: [ReleaseKind; 3] = [ReleaseKind::Idle, ReleaseKind::Urgent, ReleaseKind::Forced];
}

/// One call due for release now (see [`DelayQueue::peek_due`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Due {
    /// The call.
    pub id: CallId,
    /// Its deadline.
    pub deadline: Time,
    /// Why it is due.
    pub kind: ReleaseKind,
}

/// Releases counted per kind and tier.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReleaseCount {
    /// Kind label (`idle`, `urgent`, `forced`).
    pub kind: &'static str,
    /// Tier label (`vm`, `function`).
    pub tier: &'static str,
    /// Calls.
    pub count: u64,
}

/// A snapshot for `/status`, `/metrics` and reports.
#[derive(Clone, Debug, PartialEq)]
pub struct DelayStatus {
    /// Calls waiting.
    pub queued: usize,
    /// When the longest-waiting call was accepted (wait = now − this).
    pub oldest_accepted: Option<Time>,
    /// Current mode.
    pub mode: Mode,
    /// Windowed CPU utilisation, 0–1 (`None` before the first sample).
    pub cpu: Option<f64>,
    /// Mode switches so far.
    pub switches: u64,
    /// Releases per kind and tier (every combination, zeros included).
    pub released: Vec<ReleaseCount>,
    /// Calls that finished after their deadline.
    pub deadline_misses: u64,
    /// Calls that finished.
    pub finished: u64,
    /// Calls queued so far (accepted, recovered after a restart, or queued again after
    /// a release found no capacity).
    pub queued_total: u64,
    /// Current `E[p]`.
    pub expected_processing: Duration,
}

/// The delay queue and scheduler. See the [module docs](self).
#[derive(Clone, Debug)]
pub struct DelayQueue {
    params: DelayParams,
    /// (deadline, id): earliest deadline first.
    by_deadline: BTreeSet<(Time, CallId)>,
    /// (accepted at, id): for the oldest wait.
    by_accept: BTreeSet<(Time, CallId)>,
    /// id → (deadline, accepted at).
    calls: HashMap<CallId, (Time, Time)>,
    samples: VecDeque<(Time, f64)>,
    mode: Mode,
    last_switch: Option<Time>,
    switches: u64,
    next_sample: Time,
    /// Idle releases left in this sample tick.
    idle_budget: u32,
    expected: Duration,
    released: [[u64; 2]; 3],
    misses: u64,
    finished: u64,
    pushed: u64,
}

impl DelayQueue {
    /// An empty queue in idle mode; the first sample is due at time zero.
    pub fn new(params: DelayParams) -> Self {
        Self {
            expected: params.expected_processing,
            idle_budget: params.release_batch,
            params,
            by_deadline: BTreeSet::new(),
            by_accept: BTreeSet::new(),
            calls: HashMap::new(),
            samples: VecDeque::new(),
            mode: Mode::Idle,
            last_switch: None,
            switches: 0,
            next_sample: Time::ZERO,
            released: [[0; 2]; 3],
            misses: 0,
            finished: 0,
            pushed: 0,
        }
    }

    /// The parameters.
    pub fn params(&self) -> &DelayParams {
        &self.params
    }

    /// Queue a call with its `deadline`, accepted at `accepted_at` (earlier than now for
    /// calls recovered from the store after a restart). A known id is replaced.
    pub fn push(&mut self, id: CallId, deadline: Time, accepted_at: Time) {
        self.remove(id);
        self.pushed += 1;
        self.calls.insert(id, (deadline, accepted_at));
        self.by_deadline.insert((deadline, id));
        self.by_accept.insert((accepted_at, id));
    }

    /// Take `id` out of the queue (released, or cancelled). Returns whether it was there.
    pub fn remove(&mut self, id: CallId) -> bool {
        match self.calls.remove(&id) {
            Some((deadline, accepted)) => {
                self.by_deadline.remove(&(deadline, id));
                self.by_accept.remove(&(accepted, id));
                true
            }
            None => false,
        }
    }

    /// Calls waiting.
    pub fn len(&self) -> usize {
        self.calls.len()
    }

    /// Whether no call waits.
    pub fn is_empty(&self) -> bool {
        self.calls.is_empty()
    }

    /// The current mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// When a call with `deadline` must go to the function tier:
    /// `deadline − (E[p] + deadline_margin)`.
    pub fn forced_at(&self, deadline: Time) -> Time {
        deadline.saturating_sub(self.expected + self.params.deadline_margin)
    }

    /// The earliest-deadline call if it is due at `now`, and why: forced, urgent, or
    /// (idle mode, batch budget left) idle. The caller either releases it
    /// ([`Self::released`]) or leaves it (no capacity) and stops asking until the next
    /// event.
    pub fn peek_due(&self, now: Time) -> Option<Due> {
        let &(deadline, id) = self.by_deadline.first()?;
        let kind = if self.forced_at(deadline) <= now {
            ReleaseKind::Forced
        } else if deadline <= now + self.params.urgency_window {
            ReleaseKind::Urgent
        } else if self.mode == Mode::Idle && self.idle_budget > 0 {
            ReleaseKind::Idle
        } else {
            return None;
        };
        Some(Due { id, deadline, kind })
    }

    /// `id` left the queue as `kind` on `tier` (counted; an idle release spends one of
    /// the tick's batch).
    pub fn released(&mut self, id: CallId, kind: ReleaseKind, tier: Tier) {
        if self.remove(id) {
            if kind == ReleaseKind::Idle {
                self.idle_budget = self.idle_budget.saturating_sub(1);
            }
            self.released[kind as usize][tier as usize] += 1;
        }
    }

    /// Whether the CPU sample is due at `now`; if so the next one is scheduled and the
    /// tick's idle batch refilled. The driver answers with [`Self::on_cpu_sample`].
    pub fn sample_due(&mut self, now: Time) -> bool {
        if now < self.next_sample {
            return false;
        }
        let step = self.params.sample_interval.max(Duration::from_millis(1));
        while self.next_sample <= now {
            self.next_sample += step;
        }
        self.idle_budget = self.params.release_batch;
        true
    }

    /// A CPU utilisation sample (0–1) taken at `now`: averaged over the window; the mode
    /// switches when the average is on the other side of `busy_utilisation` and the last
    /// switch is at least `min_switch` ago.
    pub fn on_cpu_sample(&mut self, now: Time, utilisation: f64) {
        let u = if utilisation.is_finite() {
            utilisation.clamp(0.0, 1.0)
        } else {
            0.0
        };
        self.samples.push_back((now, u));
        while let Some(&(t, _)) = self.samples.front() {
            if t + self.params.window <= now {
                self.samples.pop_front();
            } else {
                break;
            }
        }
        let Some(avg) = self.cpu() else { return };
        let want = if avg > self.params.busy_utilisation {
            Mode::Busy
        } else {
            Mode::Idle
        };
        let may = self
            .last_switch
            .is_none_or(|t| now >= t + self.params.min_switch);
        if want != self.mode && may {
            self.mode = want;
            self.last_switch = Some(now);
            self.switches += 1;
        }
    }

    /// The windowed CPU utilisation, `None` before the first sample.
    pub fn cpu(&self) -> Option<f64> {
        if self.samples.is_empty() {
            return None;
        }
        Some(self.samples.iter().map(|(_, u)| u).sum::<f64>() / self.samples.len() as f64)
    }

    /// A released call with `deadline` finished at `now` after `processing` (its run
    /// time, for `E[p]`): counted, and as a deadline miss when late.
    pub fn on_finished(&mut self, now: Time, deadline: Time, processing: Duration) {
        self.finished += 1;
        if now > deadline {
            self.misses += 1;
        }
        let e = self.expected.as_secs_f64();
        let p = processing.as_secs_f64();
        self.expected = Duration::from_secs_f64(e + PROCESSING_EWMA_WEIGHT * (p - e))
            .min(Duration::from_secs(3600));
    }

    /// The earliest of: the next CPU sample, the earliest call's forced release and (when
    /// it is not yet urgent) its urgency. Always `Some` (sampling never stops).
    pub fn poll_timeout(&self) -> Option<Time> {
        let mut t = self.next_sample;
        if let Some(&(deadline, _)) = self.by_deadline.first() {
            t = t.min(self.forced_at(deadline));
            t = t.min(deadline.saturating_sub(self.params.urgency_window));
        }
        Some(t)
    }

    /// A snapshot.
    pub fn status(&self) -> DelayStatus {
        let mut released = Vec::with_capacity(6);
        for k in ReleaseKind::ALL {
            for tier in [Tier::Vm, Tier::Function] {
                released.push(ReleaseCount {
                    kind: k.as_str(),
                    tier: tier.as_str(),
                    count: self.released[k as usize][tier as usize],
                });
            }
        }
        DelayStatus {
            queued: self.calls.len(),
            oldest_accepted: self.by_accept.first().map(|&(t, _)| t),
            mode: self.mode,
            cpu: self.cpu(),
            switches: self.switches,
            released,
            deadline_misses: self.misses,
            finished: self.finished,
            queued_total: self.pushed,
            expected_processing: self.expected,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(x: f64) -> Time {
        Duration::from_secs_f64(x)
    }

    fn params() -> DelayParams {
        DelayParams {
            busy_utilisation: 0.65,
            sample_interval: s(1.0),
            window: s(4.0),
            min_switch: s(6.0),
            urgency_window: s(7.0),
            release_batch: 3,
            deadline_margin: s(2.0),
            expected_processing: s(1.5),
            vm_slots: Some(2),
        }
    }

    #[test]
    fn earliest_deadline_first_with_the_idle_batch_per_tick() {
        let p = params();
        let mut q = DelayQueue::new(p.clone());
        for (i, d) in [50.0, 30.0, 90.0, 40.0, 70.0].into_iter().enumerate() {
            q.push(CallId(i as u128), s(d), s(0.0));
        }
        assert!(q.sample_due(s(0.0)));
        let mut order = Vec::new();
        while let Some(due) = q.peek_due(s(0.0)) {
            assert_eq!(due.kind, ReleaseKind::Idle);
            order.push(due.deadline);
            q.released(due.id, due.kind, Tier::Vm);
        }
        assert_eq!(
            order,
            [s(30.0), s(40.0), s(50.0)],
            "EDF, batch of {}",
            p.release_batch
        );
        assert!(!q.sample_due(s(0.5)), "next tick at 1 s");
        assert!(q.sample_due(s(1.0)));
        assert_eq!(q.peek_due(s(1.0)).map(|d| d.deadline), Some(s(70.0)));
        assert_eq!(q.status().queued, 2);
    }

    #[test]
    fn busy_releases_only_urgent_calls_and_forces_late_ones_to_functions() {
        let p = params();
        let mut q = DelayQueue::new(p.clone());
        q.sample_due(s(0.0));
        q.on_cpu_sample(s(0.0), 0.9);
        assert_eq!(q.mode(), Mode::Busy);
        q.push(CallId(1), s(100.0), s(0.0));
        assert_eq!(q.peek_due(s(0.0)), None, "busy: not urgent yet");
        // Urgent from deadline − urgency window; forced from deadline − (E[p] + margin).
        let urgent = s(100.0) - p.urgency_window;
        let forced = s(100.0) - p.expected_processing - p.deadline_margin;
        assert!(urgent < forced);
        assert_eq!(
            q.poll_timeout(),
            Some(s(1.0)),
            "the next sample comes first"
        );
        assert_eq!(
            q.peek_due(urgent).map(|d| d.kind),
            Some(ReleaseKind::Urgent)
        );
        assert_eq!(
            q.peek_due(forced).map(|d| d.kind),
            Some(ReleaseKind::Forced)
        );
        q.released(CallId(1), ReleaseKind::Forced, Tier::Function);
        let st = q.status();
        let forced_fn = st
            .released
            .iter()
            .find(|r| r.kind == "forced" && r.tier == "function")
            .unwrap();
        assert_eq!(forced_fn.count, 1);
        assert_eq!(st.queued, 0);
    }

    #[test]
    fn the_mode_follows_the_window_average_and_switches_at_most_every_min_switch() {
        let p = params();
        let mut q = DelayQueue::new(p.clone());
        // 0.9 at t=0 → busy at once (first switch is free).
        q.on_cpu_sample(s(0.0), 0.9);
        assert_eq!(q.mode(), Mode::Busy);
        // Low samples: the 4 s window average drops below 0.65 at t=2 (0.9+0.1+0.1)/3 =
        // 0.37, but the switch waits for min_switch (6 s).
        for t in 1..6 {
            q.on_cpu_sample(s(f64::from(t)), 0.1);
            assert_eq!(q.mode(), Mode::Busy, "t={t}");
        }
        q.on_cpu_sample(s(6.0), 0.1);
        assert_eq!(q.mode(), Mode::Idle);
        assert_eq!(q.status().switches, 2);
        // A single spike does not lift a 4-sample average of 0.1s above 0.65.
        q.on_cpu_sample(s(13.0), 0.1);
        q.on_cpu_sample(s(14.0), 0.1);
        q.on_cpu_sample(s(15.0), 0.1);
        q.on_cpu_sample(s(16.0), 1.0);
        assert!((q.cpu().unwrap() - 0.325).abs() < 1e-9);
        assert_eq!(q.mode(), Mode::Idle);
    }

    #[test]
    fn finished_calls_update_the_expected_time_and_count_misses() {
        let p = params();
        let mut q = DelayQueue::new(p.clone());
        q.on_finished(s(10.0), s(12.0), s(4.0));
        q.on_finished(s(13.0), s(12.0), s(4.0));
        let st = q.status();
        assert_eq!((st.finished, st.deadline_misses), (2, 1));
        let e1 = 1.5 + PROCESSING_EWMA_WEIGHT * (4.0 - 1.5);
        let e2 = e1 + PROCESSING_EWMA_WEIGHT * (4.0 - e1);
        assert!((st.expected_processing.as_secs_f64() - e2).abs() < 1e-6);
        // The forced time moves with E[p].
        assert_eq!(
            q.forced_at(s(100.0)),
            s(100.0) - st.expected_processing - p.deadline_margin
        );
    }

    #[test]
    fn ids_print_and_parse_as_32_hex_digits() {
        let id = CallId(0xdead_beef_0123_4567_89ab_cdef_0000_0001);
        let text = id.to_string();
        assert_eq!(text.len(), 32);
        assert_eq!(text.parse::<CallId>().unwrap(), id);
    }
}
