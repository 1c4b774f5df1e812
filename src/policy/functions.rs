//! Function-instance life cycle: cold/warm starts, keep-alive, pre-warming and a cap on
//! instances — FaaSim §3.
//!
//! An instance goes `Cold-start → Busy → (Idle ↔ Warm-start → Busy)* → Terminated`. One
//! instance serves one call at a time. After a call it stays warm for the keep-alive
//! interval; a call in that window is a warm start on the most recently used idle
//! instance. When no instance is idle a new one cold-starts, unless `max_instances` are
//! alive, in which case the call is throttled. Pre-warmed instances (AWS: provisioned
//! concurrency) are started up front, never expire, and their boot is not start-up time.
//!
//! [`FunctionPool`] is the sans-IO state machine of one zone's instances; it is owned by
//! [`Placement`](super::placement::Placement), which both drivers use (the simulator with
//! modelled start-up times, the gateway with real child processes). It accounts FaaSim's
//! usage time per pool: start-up, busy, idle, cold starts.

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
    /// Instances kept warm at all times (pre-warm / provisioned concurrency).
    pub prewarmed: u32,
}

/// Outcome of asking the pool for an instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Acquire {
    /// A warm instance; it is busy from now on.
    Warm(InstanceId),
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
}

#[derive(Clone, Copy, Debug)]
enum State {
    Starting { since: Time, counted: bool },
    Busy { since: Time },
    Idle,
    Free,
}

/// The instance pool state machine. See the [module docs](self).
#[derive(Clone, Debug)]
pub struct FunctionPool {
    params: FunctionPoolParams,
    slots: Vec<State>,
    free: Vec<usize>,
    /// Idle instances, oldest first (`since` ascending).
    idle: VecDeque<(InstanceId, Time)>,
    alive: u32,
    usage: FunctionUsage,
}

impl FunctionPool {
    /// An empty pool.
    pub fn new(params: FunctionPoolParams) -> Self {
        Self {
            params,
            slots: Vec::new(),
            free: Vec::new(),
            idle: VecDeque::new(),
            alive: 0,
            usage: FunctionUsage::default(),
        }
    }

    /// Start the pre-warmed instances: returns the ids the driver must start; report each
    /// with [`Self::on_started`] (they then become idle, not busy).
    pub fn prewarm(&mut self, now: Time) -> Vec<InstanceId> {
        (0..self.params.prewarmed)
            .map(|_| {
                self.usage.instances_started += 1;
                self.alloc(State::Starting {
                    since: now,
                    counted: false,
                })
            })
            .collect()
    }

    /// Ask for an instance for one call arriving at `now`: a warm one if any is idle
    /// ([`Self::acquire_warm`]), else a cold start ([`Self::acquire_cold`]), else
    /// [`Acquire::Throttled`] (counted in [`FunctionUsage::throttled`]).
    pub fn acquire(&mut self, now: Time) -> Acquire {
        if let Some(id) = self.acquire_warm(now) {
            return Acquire::Warm(id);
        }
        match self.acquire_cold(now) {
            Some(id) => Acquire::Cold(id),
            None => {
                self.usage.throttled += 1;
                Acquire::Throttled
            }
        }
    }

    /// The most recently used idle instance, now busy with a call arriving at `now` (a
    /// warm start), or `None` when no instance is idle. FaaSim §3: instance reuse.
    pub fn acquire_warm(&mut self, now: Time) -> Option<InstanceId> {
        let (id, since) = self.idle.pop_back()?;
        self.usage.idle += now.saturating_sub(since);
        self.slots[id.0 as usize] = State::Busy { since: now };
        self.usage.warm_starts += 1;
        Some(id)
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
        Some(self.alloc(State::Starting {
            since: now,
            counted: true,
        }))
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
    /// call, a pre-warmed one becomes idle.
    pub fn on_started(&mut self, now: Time, id: InstanceId) {
        if let Some(State::Starting { since, counted }) = self.slots.get(id.0 as usize).copied() {
            if counted {
                self.usage.startup += now.saturating_sub(since);
                self.slots[id.0 as usize] = State::Busy { since: now };
            } else {
                self.slots[id.0 as usize] = State::Idle;
                self.idle.push_back((id, now));
            }
        }
    }

    /// The call on `id` finished at `now`: the instance stays warm for the keep-alive.
    pub fn release(&mut self, now: Time, id: InstanceId) {
        if let Some(State::Busy { since }) = self.slots.get(id.0 as usize).copied() {
            self.usage.busy += now.saturating_sub(since);
            self.slots[id.0 as usize] = State::Idle;
            self.idle.push_back((id, now));
        }
    }

    /// The instance failed (start-up failed, crashed): it is forgotten.
    pub fn on_failed(&mut self, _now: Time, id: InstanceId) {
        let i = id.0 as usize;
        if matches!(self.slots.get(i), Some(State::Idle)) {
            self.idle.retain(|(x, _)| *x != id);
        }
        if !matches!(self.slots.get(i), None | Some(State::Free)) {
            self.slots[i] = State::Free;
            self.free.push(i);
            self.alive -= 1;
        }
    }

    /// When the oldest idle instance's keep-alive runs out (`None`: nothing to expire).
    pub fn poll_timeout(&self) -> Option<Time> {
        if self.alive <= self.params.prewarmed {
            return None;
        }
        self.idle
            .front()
            .map(|(_, since)| *since + self.params.keep_alive)
    }

    /// Expire the idle instances whose keep-alive ran out by `now`; returns them, the
    /// driver stops them. Never shrinks the pool below the pre-warmed count.
    pub fn handle_timeout(&mut self, now: Time) -> Vec<InstanceId> {
        let mut expired = Vec::new();
        while let Some(at) = self.poll_timeout() {
            if at > now {
                break;
            }
            let (id, since) = self.idle.pop_front().expect("poll_timeout saw an idle one");
            self.usage.idle += at.saturating_sub(since);
            self.usage.instances_expired += 1;
            let i = id.0 as usize;
            self.slots[i] = State::Free;
            self.free.push(i);
            self.alive -= 1;
            expired.push(id);
        }
        expired
    }

    /// Account the idle time of instances still idle at `now` (end of a simulation).
    pub fn finish(&mut self, now: Time) {
        for (_, since) in self.idle.iter_mut() {
            self.usage.idle += now.saturating_sub(*since);
            *since = now;
        }
    }

    /// Instances alive (starting, busy or idle).
    pub fn alive(&self) -> u32 {
        self.alive
    }

    /// Idle (warm) instances.
    pub fn idle(&self) -> u32 {
        self.idle.len() as u32
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

    fn alloc(&mut self, state: State) -> InstanceId {
        self.alive += 1;
        if let Some(i) = self.free.pop() {
            self.slots[i] = state;
            InstanceId(i as u64)
        } else {
            self.slots.push(state);
            InstanceId(self.slots.len() as u64 - 1)
        }
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
        // Only one may expire: the pool keeps the pre-warmed count.
        assert_eq!(p.handle_timeout(secs(100.0)), vec![b]);
        assert_eq!(p.alive(), 1);
        assert_eq!(p.usage().throttled, 1);
    }
}
