//! Function placement: which zone, and which instance in it, runs a function call —
//! FaaSim §3 (instance life cycle: cold/warm starts, keep-alive, pre-warming, maximum
//! instances) and FaaSim's two-tier edge/cloud placement (edge-first, warm-first).
//!
//! A [`Placement`] owns one capacity model per zone:
//! * [`ZoneCapacity::Instances`] — instances spillway starts and sees (the local `process`
//!   tier, the simulator's function model): a [`FunctionPool`] with booting, busy, idle and
//!   pre-warmed instances, keep-alive and `max_instances`. A call takes a warm (idle)
//!   instance, else a pre-warmed instance still booting (and waits for it), else
//!   cold-starts a new one while `alive < max_instances`.
//! * [`ZoneCapacity::Concurrency`] — an endpoint whose instances spillway cannot see (an
//!   `http` FaaS gateway, AWS Lambda): only the calls in flight are tracked, against
//!   `max_concurrency`. Keep-alive and pre-warm do not apply (Lambda's pre-warm is
//!   provisioned concurrency, set up by the provider); a 429 from such an endpoint is a
//!   throttle ([`Placement::refuse`]).
//!
//! Placement order for a call whose origin is edge zone `e` (FaaSim, "two-tier
//! edge/cloud"), skipping zones already tried:
//! * [`PlacementPolicy::EdgeFirst`]: warm in `e`, new in `e`, warm in the cloud, new in the
//!   cloud;
//! * [`PlacementPolicy::WarmFirst`]: warm in `e`, warm in the cloud, new in `e`, new in the
//!   cloud.
//!
//! "New" takes a booting pre-warmed instance of the zone before it cold-starts one (FaaSim
//! allocates in the zone its policy chose: warm, else warming-up, else cold).
//!
//! A call without an edge origin goes to the cloud zone. With a single zone both policies
//! reduce to "warm, else new, else throttled" — the behaviour of the one function tier.
//! Keep-alive expiries are this module's timers: [`Placement::poll_timeout`] is the
//! earliest over all zones, [`Placement::handle_timeout`] returns the instances to stop.

use std::time::Duration;

use super::Time;
use super::functions::{
    FunctionPool, FunctionPoolParams, FunctionUsage, InstanceId, InstanceUsage,
};

/// Index of a zone in [`PlacementParams::zones`]; at most [`MAX_ZONES`] zones.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ZoneId(pub u16);

/// Most zones one placement holds (the tried-zone set is a 64-bit mask).
pub const MAX_ZONES: usize = 64;

/// Where a zone runs (FaaSim's two tiers).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ZoneKind {
    /// A small FaaS platform close to its clients, of limited capacity.
    Edge,
    /// The cloud: far, practically unlimited. At most one per placement.
    Cloud,
}

impl ZoneKind {
    /// `"edge"` or `"cloud"`.
    pub fn as_str(self) -> &'static str {
        match self {
            ZoneKind::Edge => "edge",
            ZoneKind::Cloud => "cloud",
        }
    }
}

/// How a zone's capacity is known.
#[derive(Clone, Debug, PartialEq)]
pub enum ZoneCapacity {
    /// Instances spillway starts and sees: FaaSim's instance life cycle.
    Instances(FunctionPoolParams),
    /// Only calls in flight are known; `None` = unlimited.
    Concurrency {
        /// Most calls in flight at once.
        max_concurrency: Option<u32>,
    },
}

/// One zone's parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct ZoneParams {
    /// Name for logs, metrics and `/status`.
    pub name: String,
    /// Edge or cloud.
    pub kind: ZoneKind,
    /// Capacity model.
    pub capacity: ZoneCapacity,
}

/// FaaSim's placement policies (see the [module docs](self)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum PlacementPolicy {
    /// Run on the origin's edge zone while it has capacity, else in the cloud.
    #[default]
    EdgeFirst,
    /// Run where a warm instance exists (edge preferred), else start one (edge first).
    WarmFirst,
}

impl PlacementPolicy {
    /// `"edge_first"` or `"warm_first"`.
    pub fn as_str(self) -> &'static str {
        match self {
            PlacementPolicy::EdgeFirst => "edge_first",
            PlacementPolicy::WarmFirst => "warm_first",
        }
    }
}

/// Placement parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct PlacementParams {
    /// The zones, in configuration order; [`ZoneId`] indexes this list.
    pub zones: Vec<ZoneParams>,
    /// The placement policy.
    pub policy: PlacementPolicy,
}

impl PlacementParams {
    /// One cloud zone named `name`: the classic single function tier.
    pub fn single(name: &str, capacity: ZoneCapacity) -> Self {
        Self {
            zones: vec![ZoneParams {
                name: name.to_string(),
                kind: ZoneKind::Cloud,
                capacity,
            }],
            policy: PlacementPolicy::EdgeFirst,
        }
    }
}

/// How a placed call starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Start {
    /// On an idle instance (warm start); it is busy from now on.
    Warm(InstanceId),
    /// On a new instance (cold start): the driver starts it and reports
    /// [`Placement::on_started`] or [`Placement::on_failed`].
    Cold(InstanceId),
    /// On a pre-warmed instance still booting: the call waits until the pre-warm's
    /// [`Placement::on_started`] (not a cold start; FaaSim's warming-up resources). If the
    /// boot fails, the call's attempt fails as a cold start does.
    Booting(InstanceId),
    /// In a concurrency-only zone: no instance is visible.
    Untracked,
}

/// A call's hold on a zone's capacity, from placement until
/// [`Placement::release`] (or [`Placement::refuse`], [`Placement::on_failed`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Lease {
    /// The zone.
    pub zone: ZoneId,
    /// The instance, and whether it was warm.
    pub start: Start,
}

impl Lease {
    /// The instance the call runs on, if the zone has visible instances.
    pub fn instance(&self) -> Option<InstanceId> {
        match self.start {
            Start::Warm(i) | Start::Cold(i) | Start::Booting(i) => Some(i),
            Start::Untracked => None,
        }
    }
}

/// A set of zones (bit `i` = zone `i`): the zones a request already tried.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ZoneSet(u64);

impl ZoneSet {
    /// Add `zone`.
    pub fn insert(&mut self, zone: ZoneId) {
        self.0 |= 1u64 << (zone.0 as u32 % 64);
    }

    /// Whether `zone` is in the set.
    pub fn contains(self, zone: ZoneId) -> bool {
        self.0 & (1u64 << (zone.0 as u32 % 64)) != 0
    }
}

/// Usage of a concurrency-only zone.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConcurrencyUsage {
    /// Calls placed in the zone (sent or refused by it).
    pub calls: u64,
    /// Calls the zone could not take (at `max_concurrency`, or refused with a 429).
    pub throttled: u64,
}

/// One zone's state for `/status`, metrics and reports.
#[derive(Clone, Debug, PartialEq)]
pub struct ZoneStatus {
    /// Zone name.
    pub name: String,
    /// Edge or cloud.
    pub kind: ZoneKind,
    /// Instances starting (instance zones; 0 otherwise).
    pub starting: u32,
    /// Instances busy, or calls in flight in a concurrency zone.
    pub busy: u32,
    /// Idle warm instances (instance zones; 0 otherwise).
    pub idle: u32,
    /// Expired instances still shutting down (instance zones; 0 otherwise).
    pub stopping: u32,
    /// Instance zones: FaaSim's usage accounting.
    pub usage: Option<FunctionUsage>,
    /// Instance zones: per-instance usage of the instances not yet stopped (and of the
    /// stopped ones when [`Placement::keep_history`] is on), in start order.
    pub instances: Vec<InstanceUsage>,
    /// Concurrency zones: calls and throttles.
    pub calls: Option<ConcurrencyUsage>,
    /// Whether the zone could take a call now: an idle instance or room for a new one
    /// (`max_instances`), or a concurrency zone below `max_concurrency` (the gateway's
    /// readiness).
    pub has_capacity: bool,
}

#[derive(Clone, Debug)]
// The pool is the variant every placement touches: boxing it would cost a pointer chase
// per decision (the ≤ 100 ns goal of `benches/placement.rs`); zones are few, so the size
// does not matter.
#[allow(clippy::large_enum_variant)]
enum ZoneState {
    Pool(FunctionPool),
    Concurrency {
        max: Option<u32>,
        in_flight: u32,
        usage: ConcurrencyUsage,
    },
}

#[derive(Clone, Debug)]
struct Zone {
    params: ZoneParams,
    state: ZoneState,
}

impl Zone {
    fn warm(&mut self, now: Time) -> Option<Start> {
        match &mut self.state {
            ZoneState::Pool(p) => p.acquire_warm(now).map(Start::Warm),
            ZoneState::Concurrency { .. } => None,
        }
    }

    fn new_call(&mut self, now: Time) -> Option<Start> {
        match &mut self.state {
            ZoneState::Pool(p) => p
                .acquire_booting(now)
                .map(Start::Booting)
                .or_else(|| p.acquire_cold(now).map(Start::Cold)),
            ZoneState::Concurrency {
                max,
                in_flight,
                usage,
            } => {
                if max.is_some_and(|m| *in_flight >= m) {
                    return None;
                }
                *in_flight += 1;
                usage.calls += 1;
                Some(Start::Untracked)
            }
        }
    }

    fn count_throttled(&mut self) {
        match &mut self.state {
            ZoneState::Pool(p) => p.count_throttled(),
            ZoneState::Concurrency { usage, .. } => usage.throttled += 1,
        }
    }
}

/// Function placement over zones. See the [module docs](self).
#[derive(Clone, Debug)]
pub struct Placement {
    zones: Vec<Zone>,
    policy: PlacementPolicy,
    cloud: Option<ZoneId>,
}

impl Placement {
    /// A placement over `params.zones` (at most [`MAX_ZONES`]; extra zones are ignored —
    /// configuration validation refuses them). The first cloud zone is "the cloud".
    pub fn new(params: PlacementParams) -> Self {
        let zones: Vec<Zone> = params
            .zones
            .into_iter()
            .take(MAX_ZONES)
            .map(|p| {
                let state = match &p.capacity {
                    ZoneCapacity::Instances(pool) => {
                        ZoneState::Pool(FunctionPool::new(pool.clone()))
                    }
                    ZoneCapacity::Concurrency { max_concurrency } => ZoneState::Concurrency {
                        max: *max_concurrency,
                        in_flight: 0,
                        usage: ConcurrencyUsage::default(),
                    },
                };
                Zone { params: p, state }
            })
            .collect();
        let cloud = zones
            .iter()
            .position(|z| z.params.kind == ZoneKind::Cloud)
            .map(|i| ZoneId(i as u16));
        Self {
            zones,
            policy: params.policy,
            cloud,
        }
    }

    /// Number of zones.
    pub fn len(&self) -> usize {
        self.zones.len()
    }

    /// Whether there is no zone at all (a VM-only deployment).
    pub fn is_empty(&self) -> bool {
        self.zones.is_empty()
    }

    /// The parameters of `zone`.
    ///
    /// # Panics
    /// When `zone` is not one of this placement's zones.
    pub fn zone(&self, zone: ZoneId) -> &ZoneParams {
        &self.zones[zone.0 as usize].params
    }

    /// The zone called `name`.
    pub fn zone_by_name(&self, name: &str) -> Option<ZoneId> {
        self.zones
            .iter()
            .position(|z| z.params.name == name)
            .map(|i| ZoneId(i as u16))
    }

    /// The cloud zone, if any.
    pub fn cloud(&self) -> Option<ZoneId> {
        self.cloud
    }

    /// The placement policy.
    pub fn policy(&self) -> PlacementPolicy {
        self.policy
    }

    /// Start every zone's pre-warmed instances (FaaSim §3; AWS provisioned concurrency is
    /// the provider's business and is not modelled here): the driver starts each and
    /// reports [`Self::on_started`] (they become idle) or [`Self::on_failed`].
    pub fn prewarm(&mut self, now: Time) -> Vec<(ZoneId, InstanceId)> {
        let mut out = Vec::new();
        for (i, z) in self.zones.iter_mut().enumerate() {
            if let ZoneState::Pool(p) = &mut z.state {
                out.extend(p.prewarm(now).into_iter().map(|id| (ZoneId(i as u16), id)));
            }
        }
        out
    }

    /// Place one call arriving at `now` from `origin` (an edge zone, or `None`), skipping
    /// the zones in `tried`. `None` when no candidate zone can take it; each candidate
    /// then counts the call as throttled.
    pub fn place(&mut self, now: Time, origin: Option<ZoneId>, tried: ZoneSet) -> Option<Lease> {
        let lease = self.try_place(now, origin, tried);
        if lease.is_none() {
            let edge = self.edge_of(origin, tried);
            let cloud = self.cloud.filter(|z| !tried.contains(*z));
            for zone in [edge, cloud].into_iter().flatten() {
                self.zones[zone.0 as usize].count_throttled();
            }
        }
        lease
    }

    fn edge_of(&self, origin: Option<ZoneId>, tried: ZoneSet) -> Option<ZoneId> {
        origin.filter(|z| {
            (z.0 as usize) < self.zones.len()
                && !tried.contains(*z)
                && Some(*z) != self.cloud
                && self.zones[z.0 as usize].params.kind == ZoneKind::Edge
        })
    }

    /// Like [`Self::place`] without counting a refusal as throttled: the gateway queue
    /// (call scheduling) asks whether capacity freed after every event.
    pub fn try_place(
        &mut self,
        now: Time,
        origin: Option<ZoneId>,
        tried: ZoneSet,
    ) -> Option<Lease> {
        let edge = self.edge_of(origin, tried);
        let cloud = self.cloud.filter(|z| !tried.contains(*z));
        let steps: [(Option<ZoneId>, bool); 4] = match self.policy {
            PlacementPolicy::EdgeFirst => {
                [(edge, true), (edge, false), (cloud, true), (cloud, false)]
            }
            PlacementPolicy::WarmFirst => {
                [(edge, true), (cloud, true), (edge, false), (cloud, false)]
            }
        };
        for (zone, warm) in steps {
            let Some(zone) = zone else { continue };
            let z = &mut self.zones[zone.0 as usize];
            let start = if warm { z.warm(now) } else { z.new_call(now) };
            if let Some(start) = start {
                return Some(Lease { zone, start });
            }
        }
        None
    }

    /// Instance `instance` of `zone` is ready at `now`: a cold-started one becomes busy
    /// with its call, a pre-warmed one idle.
    pub fn on_started(&mut self, now: Time, zone: ZoneId, instance: InstanceId) {
        if let Some(ZoneState::Pool(p)) = self.state_mut(zone) {
            p.on_started(now, instance);
        }
    }

    /// Instance `instance` of `zone` finished shutting down after its keep-alive expiry
    /// ([`Self::handle_timeout`]): its shutdown time ends, its id may be reused.
    pub fn on_stopped(&mut self, now: Time, zone: ZoneId, instance: InstanceId) {
        if let Some(ZoneState::Pool(p)) = self.state_mut(zone) {
            p.on_stopped(now, instance);
        }
    }

    /// Whether `instance` of `zone` is a pre-warmed instance, still booting, that a call
    /// claimed ([`Start::Booting`]).
    pub fn is_claimed_booting(&self, zone: ZoneId, instance: InstanceId) -> bool {
        match self.zones.get(zone.0 as usize).map(|z| &z.state) {
            Some(ZoneState::Pool(p)) => p.is_claimed_booting(instance),
            _ => false,
        }
    }

    /// Whether `instance` of `zone` is still booting.
    pub fn is_starting(&self, zone: ZoneId, instance: InstanceId) -> bool {
        match self.zones.get(zone.0 as usize).map(|z| &z.state) {
            Some(ZoneState::Pool(p)) => p.is_starting(instance),
            _ => false,
        }
    }

    /// Keep every stopped instance's usage for [`Self::status`] (the simulator's
    /// per-instance report; a gateway reports only the instances not yet stopped).
    pub fn keep_history(&mut self) {
        for z in &mut self.zones {
            if let ZoneState::Pool(p) = &mut z.state {
                p.keep_history();
            }
        }
    }

    /// Instance `instance` of `zone` failed to start or died: it is forgotten (the
    /// driver stops whatever is left of it).
    pub fn on_failed(&mut self, now: Time, zone: ZoneId, instance: InstanceId) {
        if let Some(ZoneState::Pool(p)) = self.state_mut(zone) {
            p.on_failed(now, instance);
        }
    }

    /// The call holding `lease` finished at `now`: its instance stays warm for the
    /// keep-alive, or its concurrency slot is freed.
    pub fn release(&mut self, now: Time, lease: Lease) {
        match self.state_mut(lease.zone) {
            Some(ZoneState::Pool(p)) => {
                if let Some(i) = lease.instance() {
                    p.release(now, i);
                }
            }
            Some(ZoneState::Concurrency { in_flight, .. }) => {
                *in_flight = in_flight.saturating_sub(1);
            }
            None => {}
        }
    }

    /// The zone refused the call holding `lease` (a 429 from the endpoint): the slot is
    /// freed and the call counted as throttled.
    pub fn refuse(&mut self, now: Time, lease: Lease) {
        self.release(now, lease);
        if let Some(z) = self.zones.get_mut(lease.zone.0 as usize) {
            z.count_throttled();
        }
    }

    /// The earliest keep-alive expiry over all zones (`None`: nothing to expire).
    pub fn poll_timeout(&self) -> Option<Time> {
        self.zones
            .iter()
            .filter_map(|z| match &z.state {
                ZoneState::Pool(p) => p.poll_timeout(),
                ZoneState::Concurrency { .. } => None,
            })
            .min()
    }

    /// Expire the idle instances whose keep-alive ran out by `now`; the driver stops
    /// them and reports [`Self::on_stopped`]. Pre-warmed instances are never expired.
    pub fn handle_timeout(&mut self, now: Time) -> Vec<(ZoneId, InstanceId)> {
        let mut out = Vec::new();
        for (i, z) in self.zones.iter_mut().enumerate() {
            if let ZoneState::Pool(p) = &mut z.state
                && p.poll_timeout().is_some_and(|at| at <= now)
            {
                out.extend(
                    p.handle_timeout(now)
                        .into_iter()
                        .map(|id| (ZoneId(i as u16), id)),
                );
            }
        }
        out
    }

    /// Account the idle time of instances still idle at `now` (end of a simulation).
    pub fn finish(&mut self, now: Time) {
        for z in &mut self.zones {
            if let ZoneState::Pool(p) = &mut z.state {
                p.finish(now);
            }
        }
    }

    /// Every zone's state, in zone order.
    pub fn status(&self) -> Vec<ZoneStatus> {
        self.zones
            .iter()
            .map(|z| match &z.state {
                ZoneState::Pool(p) => ZoneStatus {
                    name: z.params.name.clone(),
                    kind: z.params.kind,
                    starting: p.starting(),
                    busy: p.busy(),
                    idle: p.idle(),
                    stopping: p.stopping(),
                    usage: Some(*p.usage()),
                    instances: p.instances(),
                    calls: None,
                    has_capacity: p.idle() > 0 || p.has_room(),
                },
                ZoneState::Concurrency {
                    max,
                    in_flight,
                    usage,
                } => ZoneStatus {
                    name: z.params.name.clone(),
                    kind: z.params.kind,
                    starting: 0,
                    busy: *in_flight,
                    idle: 0,
                    stopping: 0,
                    usage: None,
                    instances: Vec::new(),
                    calls: Some(*usage),
                    has_capacity: max.is_none_or(|m| *in_flight < m),
                },
            })
            .collect()
    }

    /// FaaSim usage of `zone` (instance zones only).
    pub fn usage(&self, zone: ZoneId) -> Option<&FunctionUsage> {
        match &self.zones.get(zone.0 as usize)?.state {
            ZoneState::Pool(p) => Some(p.usage()),
            ZoneState::Concurrency { .. } => None,
        }
    }

    /// Keep-alive of `zone` (instance zones), for reports.
    pub fn keep_alive(&self, zone: ZoneId) -> Option<Duration> {
        match &self.zones.get(zone.0 as usize)?.state {
            ZoneState::Pool(p) => Some(p.params().keep_alive),
            ZoneState::Concurrency { .. } => None,
        }
    }

    fn state_mut(&mut self, zone: ZoneId) -> Option<&mut ZoneState> {
        self.zones.get_mut(zone.0 as usize).map(|z| &mut z.state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::functions::WarmOrder;

    fn secs(s: f64) -> Time {
        Duration::from_secs_f64(s)
    }

    fn pool(max: u32, keep_alive_s: u64) -> ZoneCapacity {
        ZoneCapacity::Instances(FunctionPoolParams {
            keep_alive: Duration::from_secs(keep_alive_s),
            max_instances: Some(max),
            prewarmed: 0,
            warm_order: WarmOrder::Newest,
        })
    }

    fn two_zones(policy: PlacementPolicy) -> Placement {
        Placement::new(PlacementParams {
            zones: vec![
                ZoneParams {
                    name: "edge".into(),
                    kind: ZoneKind::Edge,
                    capacity: pool(1, 10),
                },
                ZoneParams {
                    name: "cloud".into(),
                    kind: ZoneKind::Cloud,
                    capacity: pool(3, 10),
                },
            ],
            policy,
        })
    }

    const EDGE: ZoneId = ZoneId(0);
    const CLOUD: ZoneId = ZoneId(1);

    #[test]
    fn a_single_zone_is_warm_else_cold_else_throttled() {
        let mut p = Placement::new(PlacementParams::single("fn", pool(1, 5)));
        let a = p.place(secs(0.0), None, ZoneSet::default()).unwrap();
        assert_eq!(a.zone, ZoneId(0));
        let Start::Cold(i) = a.start else {
            panic!("{a:?}")
        };
        assert_eq!(
            p.place(secs(0.1), None, ZoneSet::default()),
            None,
            "at max_instances"
        );
        p.on_started(secs(0.5), a.zone, i);
        p.release(secs(1.0), a);
        let b = p.place(secs(2.0), None, ZoneSet::default()).unwrap();
        assert_eq!(b.start, Start::Warm(i));
        let u = p.usage(ZoneId(0)).unwrap();
        assert_eq!((u.cold_starts, u.warm_starts, u.throttled), (1, 1, 1));
    }

    #[test]
    fn edge_first_fills_the_origin_edge_then_the_cloud() {
        let mut p = two_zones(PlacementPolicy::EdgeFirst);
        let a = p.place(secs(0.0), Some(EDGE), ZoneSet::default()).unwrap();
        assert_eq!((a.zone, matches!(a.start, Start::Cold(_))), (EDGE, true));
        let b = p.place(secs(0.0), Some(EDGE), ZoneSet::default()).unwrap();
        assert_eq!(b.zone, CLOUD, "edge is at its cap of 1");
        // No origin: the cloud directly.
        assert_eq!(
            p.place(secs(0.0), None, ZoneSet::default()).unwrap().zone,
            CLOUD
        );
    }

    #[test]
    fn warm_first_takes_a_warm_cloud_instance_over_a_cold_edge_start() {
        for (policy, want) in [
            (PlacementPolicy::WarmFirst, CLOUD),
            (PlacementPolicy::EdgeFirst, EDGE),
        ] {
            let mut p = two_zones(policy);
            let c = p.place(secs(0.0), None, ZoneSet::default()).unwrap();
            p.on_started(secs(0.2), CLOUD, c.instance().unwrap());
            p.release(secs(1.0), c);
            let next = p.place(secs(2.0), Some(EDGE), ZoneSet::default()).unwrap();
            assert_eq!(next.zone, want, "{policy:?}");
            assert_eq!(
                matches!(next.start, Start::Warm(_)),
                want == CLOUD,
                "{policy:?}"
            );
        }
    }

    #[test]
    fn tried_zones_are_skipped_and_a_full_placement_counts_throttles() {
        let mut p = two_zones(PlacementPolicy::EdgeFirst);
        let mut tried = ZoneSet::default();
        tried.insert(EDGE);
        assert!(tried.contains(EDGE) && !tried.contains(CLOUD));
        let a = p.place(secs(0.0), Some(EDGE), tried).unwrap();
        assert_eq!(
            a.zone, CLOUD,
            "an unreachable edge falls through to the cloud"
        );
        tried.insert(CLOUD);
        assert_eq!(p.place(secs(0.0), Some(EDGE), tried), None);
        let st = p.status();
        assert_eq!(
            st[1].usage.unwrap().throttled,
            0,
            "tried zones are not candidates"
        );
    }

    #[test]
    fn concurrency_zones_count_calls_in_flight_and_refusals() {
        let mut p = Placement::new(PlacementParams::single(
            "lambda",
            ZoneCapacity::Concurrency {
                max_concurrency: Some(2),
            },
        ));
        let a = p.place(secs(0.0), None, ZoneSet::default()).unwrap();
        let b = p.place(secs(0.0), None, ZoneSet::default()).unwrap();
        assert_eq!((a.start, b.start), (Start::Untracked, Start::Untracked));
        assert_eq!(p.place(secs(0.0), None, ZoneSet::default()), None);
        p.refuse(secs(0.1), a);
        assert_eq!(p.status()[0].busy, 1);
        assert!(p.place(secs(0.2), None, ZoneSet::default()).is_some());
        assert_eq!(
            p.poll_timeout(),
            None,
            "no keep-alive in a concurrency zone"
        );
        let calls = p.status()[0].calls.unwrap();
        assert_eq!((calls.calls, calls.throttled), (3, 2));
    }

    #[test]
    fn keep_alive_expiries_are_reported_per_zone_earliest_first() {
        let mut p = two_zones(PlacementPolicy::EdgeFirst);
        let e = p.place(secs(0.0), Some(EDGE), ZoneSet::default()).unwrap();
        let c = p.place(secs(0.0), None, ZoneSet::default()).unwrap();
        p.on_started(secs(0.0), EDGE, e.instance().unwrap());
        p.on_started(secs(0.0), CLOUD, c.instance().unwrap());
        p.release(secs(3.0), c);
        p.release(secs(1.0), e);
        assert_eq!(p.poll_timeout(), Some(secs(11.0)));
        assert_eq!(
            p.handle_timeout(secs(12.0)),
            vec![(EDGE, e.instance().unwrap())]
        );
        assert_eq!(p.poll_timeout(), Some(secs(13.0)));
    }
}

#[cfg(test)]
mod keep_alive_tests {
    //! Edge-first vs warm-first with asymmetric keep-alives, computed by hand (FaaSim,
    //! "two-tier edge/cloud").
    use super::*;
    use crate::functions::WarmOrder;

    fn secs(s: f64) -> Time {
        Duration::from_secs_f64(s)
    }

    const EDGE: ZoneId = ZoneId(0);
    const CLOUD: ZoneId = ZoneId(1);

    /// Edge: at most 1 instance, keep-alive `edge_ka`; cloud: at most 4, keep-alive 9 s.
    fn zones(policy: PlacementPolicy, edge_ka: f64) -> Placement {
        let pool = |max, ka: f64| {
            ZoneCapacity::Instances(FunctionPoolParams {
                keep_alive: secs(ka),
                max_instances: Some(max),
                prewarmed: 0,
                warm_order: WarmOrder::Newest,
            })
        };
        Placement::new(PlacementParams {
            zones: vec![
                ZoneParams {
                    name: "edge-a".into(),
                    kind: ZoneKind::Edge,
                    capacity: pool(1, edge_ka),
                },
                ZoneParams {
                    name: "cloud".into(),
                    kind: ZoneKind::Cloud,
                    capacity: pool(4, 9.0),
                },
            ],
            policy,
        })
    }

    /// Two calls from the edge at t = 0 (the edge takes one, the cloud the other), both
    /// instances ready at 0.5 s and idle from 1 s; a third call from the edge at 6 s.
    /// Returns the third call's lease and the placement.
    fn third_call(policy: PlacementPolicy, edge_ka: f64) -> (Lease, Placement, Lease) {
        let mut p = zones(policy, edge_ka);
        let none = ZoneSet::default();
        let a = p.place(secs(0.0), Some(EDGE), none).unwrap();
        let b = p.place(secs(0.0), Some(EDGE), none).unwrap();
        assert_eq!((a.zone, b.zone), (EDGE, CLOUD), "{policy:?}: edge cap 1");
        assert!(matches!(
            (a.start, b.start),
            (Start::Cold(_), Start::Cold(_))
        ));
        for l in [a, b] {
            p.on_started(secs(0.5), l.zone, l.instance().unwrap());
        }
        p.release(secs(1.0), a);
        p.release(secs(1.0), b);
        // The edge instance expires at 1 + edge_ka, the cloud one at 1 + 9.
        let edge_expiry = 1.0 + edge_ka;
        assert_eq!(p.poll_timeout(), Some(secs(edge_expiry.min(10.0))));
        let expired = p.handle_timeout(secs(6.0));
        let want: Vec<_> = if edge_expiry <= 6.0 {
            vec![(EDGE, a.instance().unwrap())]
        } else {
            vec![]
        };
        assert_eq!(expired, want, "{policy:?}");
        let c = p.place(secs(6.0), Some(EDGE), none).unwrap();
        (c, p, b)
    }

    #[test]
    fn a_short_edge_keep_alive_makes_the_policies_differ() {
        // Edge keep-alive 4 s: the edge instance is gone at 5 s, the cloud one warm
        // until 10 s. At 6 s edge-first cold-starts on the edge, warm-first reuses the
        // warm cloud instance.
        let (c, p, _) = third_call(PlacementPolicy::EdgeFirst, 4.0);
        assert_eq!((c.zone, matches!(c.start, Start::Cold(_))), (EDGE, true));
        let (edge, cloud) = (p.usage(EDGE).unwrap(), p.usage(CLOUD).unwrap());
        assert_eq!((edge.cold_starts, edge.warm_starts), (2, 0));
        assert_eq!((cloud.cold_starts, cloud.warm_starts), (1, 0));
        assert_eq!(edge.instances_expired, 1);
        assert_eq!(edge.idle, secs(4.0), "idle from 1 s to its expiry at 5 s");
        assert_eq!(edge.startup, secs(0.5));

        let (c, mut p, b) = third_call(PlacementPolicy::WarmFirst, 4.0);
        assert_eq!(c.zone, CLOUD);
        assert_eq!(c.start, Start::Warm(b.instance().unwrap()));
        let (edge, cloud) = (*p.usage(EDGE).unwrap(), *p.usage(CLOUD).unwrap());
        assert_eq!((edge.cold_starts, edge.warm_starts), (1, 0));
        assert_eq!((cloud.cold_starts, cloud.warm_starts), (1, 1));
        assert_eq!(
            cloud.idle,
            secs(5.0),
            "idle from 1 s to the warm start at 6 s"
        );
        // The reused cloud instance runs 6 → 7 s and stays warm for its 9 s keep-alive.
        p.release(secs(7.0), c);
        assert_eq!(p.poll_timeout(), Some(secs(16.0)));
        assert_eq!(p.usage(CLOUD).unwrap().busy, secs(0.5) + secs(1.0));
    }

    #[test]
    fn with_the_edge_still_warm_both_policies_reuse_it() {
        // Edge keep-alive 7 s (≠ the cloud's 9 s): still warm at 6 s, so both policies
        // take the warm edge instance — warm-first prefers the edge when both are warm.
        for policy in [PlacementPolicy::EdgeFirst, PlacementPolicy::WarmFirst] {
            let (c, p, _) = third_call(policy, 7.0);
            assert_eq!(c.zone, EDGE, "{policy:?}");
            assert!(matches!(c.start, Start::Warm(_)), "{policy:?}");
            assert_eq!(p.usage(EDGE).unwrap().idle, secs(5.0), "{policy:?}");
            assert_eq!(p.usage(CLOUD).unwrap().warm_starts, 0, "{policy:?}");
        }
    }
}
