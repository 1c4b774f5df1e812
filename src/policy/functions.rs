//! Function-instance life cycle: cold/warm starts, keep-alive, pre-warming and a cap on
//! instances — FaaSim §3.
//!
//! An instance goes `Cold-start → Busy → (Idle ↔ Warm-start → Busy)* → Shutdown →
//! Terminated`. One instance serves one call at a time. After a call it stays warm for the
//! keep-alive interval; a call in that window is a warm start on an idle instance — the
//! most recently idle one or the one idle longest, as [`WarmOrder`] says (FaaSim takes the
//! oldest). When no instance is idle the call takes a pre-warmed instance that is
//! still booting (it waits for the boot; FaaSim's "warming-up" resources) and otherwise a
//! new one cold-starts, unless `max_instances` are alive (booting + busy + idle), in which
//! case the call is throttled. Pre-warmed instances (AWS: provisioned concurrency) are
//! started up front and their boot is not start-up time; each of them is exempt from
//! keep-alive expiry, whatever the load: only instances started by a cold start expire. An expired
//! instance is shutting down until the driver reports [`FunctionPool::on_stopped`]: that
//! is its shutdown time; it no longer counts against `max_instances`, but its
//! [`InstanceId`] is not reused before then.
//!
//! [`FunctionPool`] is the sans-IO state machine of one zone's instances; it is owned by
//! [`Placement`](super::placement::Placement), which both drivers use (the simulator with
//! modelled start-up times, the gateway with real child processes). It accounts FaaSim's
//! usage time (papers.md §2: UT = start-up + busy + idle + shutdown) per pool
//! ([`FunctionUsage`]) and per instance ([`InstanceUsage`]).

use std::collections::VecDeque;
use std::time::Duration;

use super::Time;

/// Identifier of one function instance, unique within a pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InstanceId(pub u64);

/// Pool parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct FunctionPoolParams {
    /// How long an idle instance stays warm.
    pub keep_alive: Duration,
    /// Cap on simultaneous instances (starting + busy + idle); `None` = unlimited.
    pub max_instances: Option<u32>,
    /// Instances kept warm at all times (pre-warm / provisioned concurrency); each one is
    /// exempt from keep-alive expiry.
    pub prewarmed: u32,
    /// Which idle instance a warm start takes.
    pub warm_order: WarmOrder,
}

/// Which idle instance a warm start takes (`warm_instance_order` in the config).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum WarmOrder {
    /// The most recently idle instance (LIFO): the others stay idle and expire first, so
    /// fewer instances stay alive. spillway's default.
    #[default]
    Newest,
    /// The instance idle longest (FIFO), as FaaSim does: calls spread over the idle
    /// instances, which keeps more of them warm.
    Oldest,
}

impl WarmOrder {
    /// The config spelling: `newest` or `oldest`.
    pub fn as_str(self) -> &'static str {
        match self {
            WarmOrder::Newest => "newest",
            WarmOrder::Oldest => "oldest",
        }
    }
}

/// One idle instance: since when, and its place in the order instances became idle
/// (ties of `since` keep that order).
#[derive(Clone, Copy, Debug)]
struct IdleEntry {
    id: InstanceId,
    since: Time,
    seq: u64,
}

/// Outcome of asking the pool for an instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Acquire {
    /// A warm instance; it is busy from now on.
    Warm(InstanceId),
    /// A pre-warmed instance still booting: the call waits for
    /// [`FunctionPool::on_started`] (no cold start; its busy time starts then).
    Booting(InstanceId),
    /// A new instance must be started (cold start); call [`FunctionPool::on_started`]
    /// when it is ready, or [`FunctionPool::on_failed`].
    Cold(InstanceId),
    /// `max_instances` are alive and none is idle: the call is throttled.
    Throttled,
}

/// FaaSim's usage accounting for one pool.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FunctionUsage {
    /// Calls served by a new instance.
    pub cold_starts: u64,
    /// Calls served by a warm instance.
    pub warm_starts: u64,
    /// Calls refused because `max_instances` were alive.
    pub throttled: u64,
    /// Instances started (cold starts plus pre-warmed ones).
    pub instances_started: u64,
    /// Instances terminated by keep-alive expiry.
    pub instances_expired: u64,
    /// Total start-up time of cold starts.
    pub startup: Duration,
    /// Total time instances spent serving calls.
    pub busy: Duration,
    /// Total time instances spent idle (warm, waiting).
    pub idle: Duration,
    /// Total time expired instances took to stop (keep-alive expiry to
    /// [`FunctionPool::on_stopped`]).
    pub shutdown: Duration,
    /// Calls that took a pre-warmed instance still booting and waited for it (counted in
    /// `warm_starts` too: no cold start).
    pub prewarm_waits: u64,
}

impl FunctionUsage {
    /// Usage time (start-up + busy + idle + shutdown) in hours: FaaSim's instance-hours.
    pub fn instance_hours(&self) -> f64 {
        (self.startup + self.busy + self.idle + self.shutdown).as_secs_f64() / 3600.0
    }
}

/// FaaSim's usage accounting for one instance (papers.md §2: UT = start-up + busy + idle +
/// shutdown). Idle time is added when an idle period ends (warm start, expiry, or
/// [`FunctionPool::finish`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct InstanceUsage {
    /// The instance's id (a slot, reused after the instance stopped).
    pub id: InstanceId,
    /// Its number among the pool's instances, from 0 in start order (never reused).
    pub serial: u64,
    /// A pre-warmed instance (its boot is not start-up time; keep-alive never expires it).
    pub prewarmed: bool,
    /// When it was started (cold start or pre-warm).
    pub started_at: Duration,
    /// When it stopped (end of its shutdown), if it did.
    pub stopped_at: Option<Duration>,
    /// 1 when a call cold-started it, else 0.
    pub cold_starts: u64,
    /// Calls it served without a cold start.
    pub warm_starts: u64,
    /// Its start-up time (cold start to ready).
    pub startup: Duration,
    /// Time it spent serving calls.
    pub busy: Duration,
    /// Time it spent idle (closed idle periods).
    pub idle: Duration,
    /// Time it took to stop after its keep-alive ran out.
    pub shutdown: Duration,
}

impl InstanceUsage {
    /// Usage time (start-up + busy + idle + shutdown) in hours.
    pub fn instance_hours(&self) -> f64 {
        (self.startup + self.busy + self.idle + self.shutdown).as_secs_f64() / 3600.0
    }
}

#[derive(Clone, Copy, Debug)]
enum State {
    /// Booting: a cold start (`counted`) or a pre-warm, possibly `claimed` by a call.
    Starting {
        since: Time,
        counted: bool,
        claimed: bool,
    },
    Busy {
        since: Time,
    },
    Idle,
    Stopping {
        since: Time,
    },
    Free,
}

/// The instance pool state machine. See the [module docs](self).
#[derive(Clone, Debug)]
pub struct FunctionPool {
    params: FunctionPoolParams,
    slots: Vec<State>,
    free: Vec<usize>,
    /// Idle instances started by a cold start, oldest first (`since` ascending): the
    /// ones keep-alive expires.
    idle: VecDeque<IdleEntry>,
    /// Idle pre-warmed instances, oldest first: never expired.
    idle_prewarmed: VecDeque<IdleEntry>,
    /// Counter giving [`IdleEntry::seq`].
    idle_seq: u64,
    alive: u32,
    /// Pre-warmed instances still booting that no call claimed yet.
    unclaimed_booting: u32,
    usage: FunctionUsage,
    /// Per-slot usage of the instance in that slot.
    records: Vec<InstanceUsage>,
    /// Usage of stopped (and failed) instances, when kept ([`Self::keep_history`]).
    history: Option<Vec<InstanceUsage>>,
    serial: u64,
    /// [`Self::expiry`] as of the last change ([`Self::poll_timeout`] is asked after every
    /// event, the pool changes on function calls only).
    next_expiry: Option<Time>,
}

impl FunctionPool {
    /// An empty pool.
    pub fn new(params: FunctionPoolParams) -> Self {
        Self {
            params,
            slots: Vec::new(),
            free: Vec::new(),
            idle: VecDeque::new(),
            idle_prewarmed: VecDeque::new(),
            idle_seq: 0,
            alive: 0,
            unclaimed_booting: 0,
            usage: FunctionUsage::default(),
            records: Vec::new(),
            history: None,
            serial: 0,
            next_expiry: None,
        }
    }

    /// Keep the usage of every instance that stopped, for [`Self::instances`] (the
    /// simulator's per-instance report; the gateway keeps only live instances').
    pub fn keep_history(&mut self) {
        self.history.get_or_insert_with(Vec::new);
    }

    /// Start the pre-warmed instances: returns the ids the driver must start; report each
    /// with [`Self::on_started`] (they then become idle, not busy).
    pub fn prewarm(&mut self, now: Time) -> Vec<InstanceId> {
        (0..self.params.prewarmed)
            .map(|_| {
                self.usage.instances_started += 1;
                self.unclaimed_booting += 1;
                self.alloc(
                    now,
                    true,
                    State::Starting {
                        since: now,
                        counted: false,
                        claimed: false,
                    },
                )
            })
            .collect()
    }

    /// Ask for an instance for one call arriving at `now`: a warm one if any is idle
    /// ([`Self::acquire_warm`]), else a booting pre-warmed one ([`Self::acquire_booting`]),
    /// else a cold start ([`Self::acquire_cold`]), else [`Acquire::Throttled`] (counted in
    /// [`FunctionUsage::throttled`]).
    pub fn acquire(&mut self, now: Time) -> Acquire {
        if let Some(id) = self.acquire_warm(now) {
            return Acquire::Warm(id);
        }
        if let Some(id) = self.acquire_booting(now) {
            return Acquire::Booting(id);
        }
        match self.acquire_cold(now) {
            Some(id) => Acquire::Cold(id),
            None => {
                self.usage.throttled += 1;
                Acquire::Throttled
            }
        }
    }

    /// An idle instance, now busy with a call arriving at `now` (a warm start): the most
    /// recently idle one or the one idle longest ([`FunctionPoolParams::warm_order`]),
    /// pre-warmed or not; `None` when no instance is idle. FaaSim §3: instance reuse.
    pub fn acquire_warm(&mut self, now: Time) -> Option<InstanceId> {
        let key = |e: &IdleEntry| (e.since, e.seq);
        let take_prewarmed = match self.params.warm_order {
            WarmOrder::Newest => match (self.idle.back(), self.idle_prewarmed.back()) {
                (_, None) => false,
                (None, Some(_)) => true,
                (Some(a), Some(b)) => key(b) > key(a),
            },
            WarmOrder::Oldest => match (self.idle.front(), self.idle_prewarmed.front()) {
                (_, None) => false,
                (None, Some(_)) => true,
                (Some(a), Some(b)) => key(b) < key(a),
            },
        };
        let queue = if take_prewarmed {
            &mut self.idle_prewarmed
        } else {
            &mut self.idle
        };
        let IdleEntry { id, since, .. } = match self.params.warm_order {
            WarmOrder::Newest => queue.pop_back()?,
            WarmOrder::Oldest => queue.pop_front()?,
        };
        self.next_expiry = self.expiry();
        let idle = now.saturating_sub(since);
        self.usage.idle += idle;
        self.slots[id.0 as usize] = State::Busy { since: now };
        self.usage.warm_starts += 1;
        let r = &mut self.records[id.0 as usize];
        r.idle += idle;
        r.warm_starts += 1;
        Some(id)
    }

    /// The earliest-started pre-warmed instance that is still booting and that no call
    /// claimed yet, now claimed by a call arriving at `now` (FaaSim: a call that finds no
    /// warm instance takes a "warming-up" one before it starts a new one). The call
    /// waits for [`Self::on_started`], when the instance becomes busy with it; it counts
    /// as a warm start and in [`FunctionUsage::prewarm_waits`]. `None` when there is no
    /// such instance.
    pub fn acquire_booting(&mut self, _now: Time) -> Option<InstanceId> {
        // The counter is a shortcut for the scan below; a count that drifted would only
        // show as a slower scan, so debug builds check it.
        debug_assert_eq!(
            self.unclaimed_booting as usize,
            self.slots
                .iter()
                .filter(|s| matches!(
                    s,
                    State::Starting {
                        counted: false,
                        claimed: false,
                        ..
                    }
                ))
                .count()
        );
        if self.unclaimed_booting == 0 {
            return None;
        }
        let i = self
            .slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| match s {
                State::Starting {
                    since,
                    counted: false,
                    claimed: false,
                } => Some((*since, i)),
                _ => None,
            })
            .min()?
            .1;
        if let State::Starting { claimed, .. } = &mut self.slots[i] {
            *claimed = true;
        }
        self.unclaimed_booting -= 1;
        self.usage.warm_starts += 1;
        self.usage.prewarm_waits += 1;
        self.records[i].warm_starts += 1;
        Some(InstanceId(i as u64))
    }

    /// A new instance for a call arriving at `now` (a cold start: report
    /// [`Self::on_started`] or [`Self::on_failed`]), or `None` when `max_instances` are
    /// alive. Refusals are not counted here: the caller decides whether the call was
    /// throttled ([`Self::count_throttled`]) or went elsewhere.
    pub fn acquire_cold(&mut self, now: Time) -> Option<InstanceId> {
        if !self.has_room() {
            return None;
        }
        self.usage.cold_starts += 1;
        self.usage.instances_started += 1;
        let id = self.alloc(
            now,
            false,
            State::Starting {
                since: now,
                counted: true,
                claimed: false,
            },
        );
        self.records[id.0 as usize].cold_starts = 1;
        Some(id)
    }

    /// Whether a new instance may start (`alive < max_instances`).
    pub fn has_room(&self) -> bool {
        self.params.max_instances.is_none_or(|m| self.alive < m)
    }

    /// Count one call this pool refused (no idle instance, no room).
    pub fn count_throttled(&mut self) {
        self.usage.throttled += 1;
    }

    /// A starting instance is ready at `now`: a cold-started one becomes busy with its
    /// call, a pre-warmed one becomes idle — or busy, when a call claimed it while it
    /// booted ([`Self::acquire_booting`]).
    pub fn on_started(&mut self, now: Time, id: InstanceId) {
        let i = id.0 as usize;
        if let Some(State::Starting {
            since,
            counted,
            claimed,
        }) = self.slots.get(i).copied()
        {
            if counted {
                let startup = now.saturating_sub(since);
                self.usage.startup += startup;
                self.records[i].startup += startup;
                self.slots[i] = State::Busy { since: now };
            } else if claimed {
                self.slots[i] = State::Busy { since: now };
            } else {
                self.unclaimed_booting -= 1;
                self.slots[i] = State::Idle;
                self.push_idle(id, now);
            }
        }
    }

    /// Whether `id` is still booting (a cold start or a pre-warm not yet reported ready).
    pub fn is_starting(&self, id: InstanceId) -> bool {
        matches!(self.slots.get(id.0 as usize), Some(State::Starting { .. }))
    }

    /// Whether `id` is a pre-warmed instance, still booting, that a call claimed.
    pub fn is_claimed_booting(&self, id: InstanceId) -> bool {
        matches!(
            self.slots.get(id.0 as usize),
            Some(State::Starting { claimed: true, .. })
        )
    }

    /// The call on `id` finished at `now`: the instance stays warm for the keep-alive. A
    /// call that gave up waiting for a booting pre-warmed instance
    /// ([`Self::acquire_booting`]) leaves it to the next call.
    pub fn release(&mut self, now: Time, id: InstanceId) {
        if let Some(State::Starting { claimed, .. }) = self.slots.get_mut(id.0 as usize)
            && *claimed
        {
            *claimed = false;
            self.unclaimed_booting += 1;
            return;
        }
        if let Some(State::Busy { since }) = self.slots.get(id.0 as usize).copied() {
            let busy = now.saturating_sub(since);
            self.usage.busy += busy;
            self.records[id.0 as usize].busy += busy;
            self.slots[id.0 as usize] = State::Idle;
            self.push_idle(id, now);
        }
    }

    /// `id` became idle at `now`: queue it (a pre-warmed one where keep-alive does not
    /// expire it).
    fn push_idle(&mut self, id: InstanceId, now: Time) {
        let e = IdleEntry {
            id,
            since: now,
            seq: self.idle_seq,
        };
        self.idle_seq += 1;
        if self.records[id.0 as usize].prewarmed {
            self.idle_prewarmed.push_back(e);
        } else {
            self.idle.push_back(e);
        }
        self.next_expiry = self.expiry();
    }

    /// The instance failed (start-up failed, crashed) or, while shutting down, stopped
    /// abnormally: it is forgotten; its busy period so far counts as busy time.
    pub fn on_failed(&mut self, now: Time, id: InstanceId) {
        let i = id.0 as usize;
        match self.slots.get(i).copied() {
            None | Some(State::Free) => {}
            Some(State::Stopping { .. }) => self.on_stopped(now, id),
            Some(st) => {
                match st {
                    State::Idle => {
                        self.idle.retain(|e| e.id != id);
                        self.idle_prewarmed.retain(|e| e.id != id);
                    }
                    State::Busy { since } => {
                        let busy = now.saturating_sub(since);
                        self.usage.busy += busy;
                        self.records[i].busy += busy;
                    }
                    State::Starting {
                        counted: false,
                        claimed: false,
                        ..
                    } => self.unclaimed_booting -= 1,
                    _ => {}
                }
                self.alive -= 1;
                self.next_expiry = self.expiry();
                self.retire(now, i);
            }
        }
    }

    /// An expired instance ([`Self::handle_timeout`]) finished stopping at `now`: its
    /// shutdown time ends and its id may be reused.
    pub fn on_stopped(&mut self, now: Time, id: InstanceId) {
        let i = id.0 as usize;
        if let Some(State::Stopping { since }) = self.slots.get(i).copied() {
            let shutdown = now.saturating_sub(since);
            self.usage.shutdown += shutdown;
            self.records[i].shutdown += shutdown;
            self.retire(now, i);
        }
    }

    /// Instances shutting down.
    pub fn stopping(&self) -> u32 {
        self.slots
            .iter()
            .filter(|s| matches!(s, State::Stopping { .. }))
            .count() as u32
    }

    /// The usage of every instance not yet stopped (starting, busy, idle, shutting down),
    /// preceded by the stopped ones' when [`Self::keep_history`] is on, in start order.
    pub fn instances(&self) -> Vec<InstanceUsage> {
        let mut out: Vec<InstanceUsage> = self.history.clone().unwrap_or_default();
        out.extend(
            self.slots
                .iter()
                .zip(&self.records)
                .filter(|(s, _)| !matches!(s, State::Free))
                .map(|(_, r)| *r),
        );
        out.sort_by_key(|r| r.serial);
        out
    }

    fn retire(&mut self, now: Time, i: usize) {
        self.records[i].stopped_at = Some(now);
        if let Some(h) = &mut self.history {
            h.push(self.records[i]);
        }
        self.slots[i] = State::Free;
        self.free.push(i);
    }

    /// When the keep-alive of the oldest idle instance that a cold start started runs out
    /// (`None`: nothing to expire; pre-warmed instances never expire).
    #[inline]
    pub fn poll_timeout(&self) -> Option<Time> {
        debug_assert_eq!(self.next_expiry, self.expiry());
        self.next_expiry
    }

    /// The earliest keep-alive expiry, computed.
    fn expiry(&self) -> Option<Time> {
        self.idle.front().map(|e| e.since + self.params.keep_alive)
    }

    /// Expire the idle instances whose keep-alive ran out by `now`; returns them, the
    /// driver stops them and reports [`Self::on_stopped`] (their shutdown time runs from
    /// the expiry until then). Pre-warmed instances are never expired.
    pub fn handle_timeout(&mut self, now: Time) -> Vec<InstanceId> {
        let mut expired = Vec::new();
        while let Some(at) = self.expiry() {
            if at > now {
                break;
            }
            let IdleEntry { id, since, .. } =
                self.idle.pop_front().expect("poll_timeout saw an idle one");
            let idle = at.saturating_sub(since);
            self.usage.idle += idle;
            self.usage.instances_expired += 1;
            let i = id.0 as usize;
            self.records[i].idle += idle;
            // Shutting down from its expiry until the driver reports it stopped.
            self.slots[i] = State::Stopping { since: at };
            self.alive -= 1;
            self.next_expiry = self.expiry();
            expired.push(id);
        }
        expired
    }

    /// Account the idle time of instances still idle at `now` (end of a simulation).
    pub fn finish(&mut self, now: Time) {
        for e in self.idle.iter_mut().chain(self.idle_prewarmed.iter_mut()) {
            let idle = now.saturating_sub(e.since);
            self.usage.idle += idle;
            self.records[e.id.0 as usize].idle += idle;
            e.since = now;
        }
        self.next_expiry = self.expiry();
    }

    /// Instances alive (starting, busy or idle).
    pub fn alive(&self) -> u32 {
        self.alive
    }

    /// Idle (warm) instances.
    pub fn idle(&self) -> u32 {
        (self.idle.len() + self.idle_prewarmed.len()) as u32
    }

    /// Instances still starting (cold starts and pre-warms in progress).
    pub fn starting(&self) -> u32 {
        self.slots
            .iter()
            .filter(|s| matches!(s, State::Starting { .. }))
            .count() as u32
    }

    /// Instances serving a call.
    pub fn busy(&self) -> u32 {
        self.slots
            .iter()
            .filter(|s| matches!(s, State::Busy { .. }))
            .count() as u32
    }

    /// The pool's parameters.
    pub fn params(&self) -> &FunctionPoolParams {
        &self.params
    }

    /// Usage accounting so far.
    pub fn usage(&self) -> &FunctionUsage {
        &self.usage
    }

    fn alloc(&mut self, now: Time, prewarmed: bool, state: State) -> InstanceId {
        self.alive += 1;
        self.next_expiry = self.expiry();
        let i = if let Some(i) = self.free.pop() {
            self.slots[i] = state;
            i
        } else {
            self.slots.push(state);
            self.records.push(InstanceUsage {
                id: InstanceId(0),
                serial: 0,
                prewarmed: false,
                started_at: now,
                stopped_at: None,
                cold_starts: 0,
                warm_starts: 0,
                startup: Duration::ZERO,
                busy: Duration::ZERO,
                idle: Duration::ZERO,
                shutdown: Duration::ZERO,
            });
            self.slots.len() - 1
        };
        self.records[i] = InstanceUsage {
            id: InstanceId(i as u64),
            serial: self.serial,
            prewarmed,
            started_at: now,
            stopped_at: None,
            cold_starts: 0,
            warm_starts: 0,
            startup: Duration::ZERO,
            busy: Duration::ZERO,
            idle: Duration::ZERO,
            shutdown: Duration::ZERO,
        };
        self.serial += 1;
        InstanceId(i as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: f64) -> Time {
        Duration::from_secs_f64(s)
    }

    #[test]
    fn warm_reuse_within_keep_alive_and_cold_after_it() {
        let mut p = FunctionPool::new(FunctionPoolParams {
            keep_alive: Duration::from_secs(10),
            max_instances: None,
            prewarmed: 0,
            warm_order: WarmOrder::Newest,
        });
        let Acquire::Cold(a) = p.acquire(secs(0.0)) else {
            panic!()
        };
        p.on_started(secs(0.5), a);
        p.release(secs(1.5), a);
        assert_eq!(p.acquire(secs(5.0)), Acquire::Warm(a));
        p.release(secs(6.0), a);
        assert_eq!(p.poll_timeout(), Some(secs(16.0)));
        assert_eq!(p.handle_timeout(secs(16.0)), vec![a]);
        assert!(matches!(p.acquire(secs(20.0)), Acquire::Cold(_)));
        let u = p.usage();
        assert_eq!(
            (u.cold_starts, u.warm_starts, u.instances_expired),
            (2, 1, 1)
        );
        assert_eq!(u.startup, secs(0.5));
        assert_eq!(u.busy, secs(2.0));
        assert_eq!(u.idle, secs(3.5) + secs(10.0));
    }

    #[test]
    fn throttles_at_max_instances_and_keeps_prewarmed_ones() {
        let mut p = FunctionPool::new(FunctionPoolParams {
            keep_alive: Duration::from_secs(1),
            max_instances: Some(2),
            prewarmed: 1,
            warm_order: WarmOrder::Newest,
        });
        let warm = p.prewarm(secs(0.0));
        p.on_started(secs(3.0), warm[0]);
        assert_eq!(
            p.usage().startup,
            Duration::ZERO,
            "pre-warm boot is not start-up time"
        );
        assert_eq!(p.poll_timeout(), None, "pre-warmed instances never expire");
        assert_eq!(p.acquire(secs(4.0)), Acquire::Warm(warm[0]));
        let Acquire::Cold(b) = p.acquire(secs(4.0)) else {
            panic!()
        };
        assert_eq!(p.acquire(secs(4.0)), Acquire::Throttled);
        p.on_started(secs(4.2), b);
        p.release(secs(5.0), b);
        p.release(secs(6.0), warm[0]);
        // Only b expires: a pre-warmed instance never does.
        assert_eq!(p.handle_timeout(secs(100.0)), vec![b]);
        assert_eq!(p.alive(), 1);
        assert_eq!(p.usage().throttled, 1);
    }

    /// Load just above the pre-warm count: 3 pre-warmed instances, 4 calls at once, a
    /// 2 s keep-alive. The pre-warmed instances finish first and idle longest, yet only
    /// the cold-started one expires; the next 3 calls are all warm starts.
    #[test]
    fn prewarmed_instances_never_expire_under_load_above_their_count() {
        for order in [WarmOrder::Newest, WarmOrder::Oldest] {
            let mut p = FunctionPool::new(FunctionPoolParams {
                keep_alive: Duration::from_secs(2),
                max_instances: Some(10),
                prewarmed: 3,
                warm_order: order,
            });
            let pre = p.prewarm(secs(0.0));
            for &id in &pre {
                p.on_started(secs(0.0), id);
            }
            let mut served = Vec::new();
            for _ in 0..3 {
                let Acquire::Warm(id) = p.acquire(secs(1.0)) else {
                    panic!("{order:?}: a pre-warmed instance is idle")
                };
                served.push(id);
            }
            let Acquire::Cold(extra) = p.acquire(secs(1.0)) else {
                panic!("{order:?}: the fourth call cold-starts")
            };
            p.on_started(secs(1.5), extra);
            // The pre-warmed instances go idle at 2.0, 2.1, 2.2; the extra one at 3.0.
            for (k, &id) in served.iter().enumerate() {
                p.release(secs(2.0 + 0.1 * k as f64), id);
            }
            p.release(secs(3.0), extra);
            assert_eq!(p.poll_timeout(), Some(secs(5.0)), "{order:?}");
            assert_eq!(p.handle_timeout(secs(60.0)), vec![extra], "{order:?}");
            assert_eq!(p.poll_timeout(), None, "{order:?}");
            assert_eq!(p.alive(), 3);
            for _ in 0..3 {
                assert!(
                    matches!(p.acquire(secs(61.0)), Acquire::Warm(id) if pre.contains(&id)),
                    "{order:?}: a pre-warmed instance serves"
                );
            }
            assert_eq!(p.usage().cold_starts, 1, "{order:?}");
            assert!(
                p.instances()
                    .iter()
                    .filter(|r| r.prewarmed)
                    .all(|r| r.stopped_at.is_none())
            );
        }
    }

    /// A zero keep-alive with 2 pre-warmed instances and 3 calls at once: the pre-warmed
    /// instance that goes idle first is not stopped the moment it goes idle.
    #[test]
    fn a_zero_keep_alive_expires_only_cold_started_instances() {
        let mut p = FunctionPool::new(FunctionPoolParams {
            keep_alive: Duration::ZERO,
            max_instances: None,
            prewarmed: 2,
            warm_order: WarmOrder::Newest,
        });
        let pre = p.prewarm(secs(0.0));
        for &id in &pre {
            p.on_started(secs(0.0), id);
        }
        assert!(matches!(p.acquire(secs(1.0)), Acquire::Warm(_)));
        assert!(matches!(p.acquire(secs(1.0)), Acquire::Warm(_)));
        let Acquire::Cold(c) = p.acquire(secs(1.0)) else {
            panic!()
        };
        p.on_started(secs(1.25), c);
        p.release(secs(2.0), pre[0]);
        assert_eq!(p.handle_timeout(secs(2.0)), vec![]);
        p.release(secs(2.5), c);
        assert_eq!(p.handle_timeout(secs(2.5)), vec![c]);
        p.release(secs(3.0), pre[1]);
        assert_eq!(p.handle_timeout(secs(3.0)), vec![]);
        assert_eq!(p.idle(), 2);
    }

    /// Three idle instances (idle since 1, 2 and 3 s): `newest` reuses the one idle
    /// since 3 s, `oldest` the one since 1 s; the keep-alive then expires the oldest
    /// still idle.
    #[test]
    fn the_warm_order_picks_the_newest_or_the_oldest_idle_instance() {
        for (order, pick, first_expiry) in [
            (WarmOrder::Newest, 2usize, 11.0),
            (WarmOrder::Oldest, 0, 12.0),
        ] {
            let mut p = FunctionPool::new(FunctionPoolParams {
                keep_alive: Duration::from_secs(10),
                max_instances: None,
                prewarmed: 0,
                warm_order: order,
            });
            let ids: Vec<InstanceId> = (0..3)
                .map(|_| match p.acquire(secs(0.0)) {
                    Acquire::Cold(id) => id,
                    other => panic!("{other:?}"),
                })
                .collect();
            for (k, &id) in ids.iter().enumerate() {
                p.on_started(secs(0.5), id);
                p.release(secs(1.0 + k as f64), id);
            }
            assert_eq!(p.acquire(secs(4.0)), Acquire::Warm(ids[pick]), "{order:?}");
            assert_eq!(p.poll_timeout(), Some(secs(first_expiry)), "{order:?}");
        }
    }

    #[test]
    fn a_call_without_an_idle_instance_waits_for_a_booting_prewarmed_one() {
        // One pre-warmed instance booting from 0 to 4 s; calls at 1 s and 1.5 s.
        let mut p = FunctionPool::new(FunctionPoolParams {
            keep_alive: Duration::from_secs(10),
            max_instances: Some(3),
            prewarmed: 1,
            warm_order: WarmOrder::Newest,
        });
        let pre = p.prewarm(secs(0.0))[0];
        assert_eq!(
            p.acquire(secs(1.0)),
            Acquire::Booting(pre),
            "no idle instance: the booting pre-warm, not a cold start"
        );
        let Acquire::Cold(c) = p.acquire(secs(1.5)) else {
            panic!("the pre-warm is claimed: the second call cold-starts")
        };
        assert_ne!(c, pre);
        p.on_started(secs(4.0), pre);
        assert_eq!(p.busy(), 1, "busy with the waiting call once ready");
        p.release(secs(6.5), pre);
        let u = *p.usage();
        assert_eq!((u.cold_starts, u.warm_starts, u.prewarm_waits), (1, 1, 1));
        // Busy from ready (4 s) to the end (6.5 s); the 3 s wait is the pre-warm's boot,
        // which is neither start-up nor busy time (FaaSim §3).
        assert_eq!(u.busy, secs(6.5) - secs(4.0));
        assert_eq!(u.startup, Duration::ZERO, "c has not started yet");
        let inst = p.instances();
        assert_eq!(inst[0].warm_starts, 1);
        assert!(inst[0].prewarmed && !inst[1].prewarmed);
        assert_eq!(inst[1].cold_starts, 1);
    }

    #[test]
    fn a_call_that_gives_up_on_a_booting_prewarm_leaves_it_to_the_next() {
        let mut p = FunctionPool::new(FunctionPoolParams {
            keep_alive: Duration::from_secs(10),
            max_instances: Some(1),
            prewarmed: 1,
            warm_order: WarmOrder::Newest,
        });
        let pre = p.prewarm(secs(0.0))[0];
        assert_eq!(p.acquire(secs(1.0)), Acquire::Booting(pre));
        assert_eq!(p.acquire(secs(1.0)), Acquire::Throttled, "cap of 1");
        p.release(secs(2.0), pre);
        assert_eq!(p.acquire(secs(2.5)), Acquire::Booting(pre));
        p.on_started(secs(3.0), pre);
        p.release(secs(5.0), pre);
        assert_eq!(p.usage().busy, secs(2.0));
    }

    #[test]
    fn expired_instances_shut_down_until_stopped_and_usage_is_per_instance() {
        // Keep-alive 5 s, at most one instance: a is cold-started at 0, ready at 0.5,
        // busy until 2, expires at 7 and takes until 9 to stop.
        let mut p = FunctionPool::new(FunctionPoolParams {
            keep_alive: Duration::from_secs(5),
            max_instances: Some(1),
            prewarmed: 0,
            warm_order: WarmOrder::Newest,
        });
        p.keep_history();
        let Acquire::Cold(a) = p.acquire(secs(0.0)) else {
            panic!()
        };
        p.on_started(secs(0.5), a);
        p.release(secs(2.0), a);
        assert_eq!(p.handle_timeout(secs(7.2)), vec![a]);
        assert_eq!((p.alive(), p.stopping()), (0, 1));
        // A stopping instance does not count against max_instances (alive = booting +
        // busy + idle), but its id is not reused before it stopped.
        let Acquire::Cold(b) = p.acquire(secs(7.5)) else {
            panic!("room for a new instance while a shuts down")
        };
        assert_ne!(a, b);
        p.on_stopped(secs(9.0), a);
        assert_eq!(p.stopping(), 0);
        let u = *p.usage();
        assert_eq!(
            u.shutdown,
            secs(9.0) - secs(7.0),
            "from the expiry at 2 + 5 s"
        );
        let inst = p.instances();
        assert_eq!(inst.len(), 2);
        let ia = inst[0];
        assert_eq!(
            (ia.id, ia.serial, ia.cold_starts, ia.warm_starts),
            (a, 0, 1, 0)
        );
        assert_eq!(ia.startup, secs(0.5));
        assert_eq!(ia.busy, secs(1.5));
        assert_eq!(ia.idle, secs(5.0));
        assert_eq!(ia.shutdown, secs(2.0));
        assert_eq!(ia.stopped_at, Some(secs(9.0)));
        let hours = (0.5 + 1.5 + 5.0 + 2.0) / 3600.0;
        assert!((ia.instance_hours() - hours).abs() < 1e-12);
        assert_eq!((inst[1].serial, inst[1].stopped_at), (1, None));
        // Pool totals are the sums over instances.
        assert!(
            (u.instance_hours() - hours).abs() < 1e-12,
            "b has no usage yet"
        );
        // Without history the gateway lists only instances not yet stopped.
        let mut q = p.clone();
        q.history = None;
        assert_eq!(q.instances().len(), 1);
    }
}
