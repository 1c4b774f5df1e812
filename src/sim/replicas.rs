//! `sim.replicas`: N gateway replicas behind an L4 balancer sharing one decision, as
//! the live coordinator (`crate::coord`, `coordination: {type: redis}`) shares it, with
//! a store delay and outage windows — what stale counts and a lost store cost before a
//! deployment.
//!
//! One simulator engine ([`super::engine`]) per replica, each with its own policy core, driven on one virtual
//! clock; the arrivals go to the replicas by their `split` weights (smooth weighted
//! round robin: deterministic, no random draw, so the runs keep the single gateway's
//! arrivals and service times). The cores get the live coordinator's pure inputs
//! (`policy::shared`, `Core::set_count_source`, `on_aggregate_count`,
//! `apply_decision`, `set_budget_share`, `restore_ewma`, `hold_scale_in`,
//! `set_pool_writer`) at the times the live protocol gives them, for epoch `e` of
//! length `E` ending at `(e+1)·E`, and a store delay `D`:
//!
//! * **round** (every replica, just after the epoch's end, at the live margin of
//!   `min(E/50, 20 ms)`): each replica's local count of `e` goes to the store; the
//!   leader renews its lease; a replica that finds no lease takes it (the first one
//!   in index order: replica 0, so the pool is always replica 0's VM table); the
//!   followers take the latest publication they can see;
//! * **sum** (the leader, at `(e+1)·E + E/2 + D`): [`aggregate`] of the replicas' counts
//!   closes `e` in the leader's monitor (Algorithm 1 every K epochs), the budget
//!   `ρ · min(vm_reqs, ready · r_max) · E` is shared by [`budget_shares`] of each
//!   replica's mean count over [`SHARE_WINDOW_EPOCHS`] epochs ([`ShareDemands`]), and
//!   the decision, EWMAs, shares and ready VMs are published, visible `D` later;
//! * **follow** (each follower, `max(D, min(E/10, 50 ms))` after the sum): it takes the
//!   publication (decision once per term and epoch, share, EWMAs) and the registry:
//!   the leader's ready VMs, adopted as ready VMs of its own table (served by it, billed
//!   to the leader), the ones gone from it drained;
//! * **outage** (`[from, to)` of `sim.replicas.outages`): no store operation answers.
//!   The leader stops writing the pool at its first missed operation; after
//!   `grace_epochs` missed rounds every replica runs on local decisions: share `1/N`, its
//!   own count × `N` as the epoch's sum, the pool frozen (no launch, no terminate). A
//!   lease not renewed expires after `lease`; after the outage the first replica back
//!   takes it again and resumes the last published EWMAs.
//!
//! This is the coordinator's earlier schedule: the live leader now sums as soon as every
//! live replica's count is in, and the live followers take a publication (and the ready
//! VMs the leader publishes between rounds) within a tenth of an epoch
//! (`crate::coord::WATCHES_PER_EPOCH`), so the model's lag is an upper bound.
//!
//! The leader bills a scaled-in VM two epochs and a quarter epoch (the live store
//! deadline's default) after its stop: the live leader keeps it that long for the
//! followers' requests still sent to it.
//!
//! Model limits: each replica queues its VM requests on its own copy of a VM's slots
//! (a VM's slots are not shared between replicas in the model, so VM queueing is
//! optimistic; the budget shares keep the VM load one gateway's); the per-epoch series
//! and the function-instance usage are the leader's; `function_zones` and `queue` are
//! not modelled with replicas.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};
use std::time::Duration;

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::engine::{Engine, PolicyKind, PolicyRun, ReplicaParams, SimParams};
use super::trace::Trace;
use crate::policy::balancer::VmState;
use crate::policy::scaling::ScaleDecision;
use crate::policy::shared::{
    CountSource, EwmaState, ReplicaCount, SHARE_WINDOW_EPOCHS, ShareDemands, aggregate,
    budget_shares,
};
use crate::policy::{Time, VmId};

/// Run one policy over `trace` with `seed`, as [`super::engine::run_policy_with`] does
/// for one gateway, or over the replicas of `sim.replicas` when it has more than one.
pub fn run_policy_with(
    p: &SimParams,
    trace: &Trace,
    kind: PolicyKind,
    seed: u64,
    series_rows: Option<usize>,
    progress: &mut dyn FnMut(u64),
) -> PolicyRun {
    match &p.replicas {
        Some(r) if r.count > 1 => run(p, r, trace, kind, seed, series_rows, progress),
        _ => super::engine::run_policy_with(p, trace, kind, seed, series_rows, progress),
    }
}

/// A replica's part in the shared decision (the live coordinator's roles).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Leader,
    Follower,
    Local,
}

/// What the leader published for one summed epoch.
#[derive(Clone, Debug)]
struct Publication {
    term: u64,
    ewma: Option<EwmaState>,
    decision: Option<(u64, ScaleDecision)>,
    /// Each replica's budget share (`None`: not live when it was computed).
    shares: Vec<Option<f64>>,
    /// The leader's ready VMs (its ids).
    registry: Vec<VmId>,
    /// When followers can read it, ns.
    visible_ns: u64,
}

/// One replica: its engine and its coordinator's state.
struct Replica<'a> {
    engine: Engine<'a>,
    role: Role,
    /// The lease's term while this replica holds it.
    key: Option<u64>,
    misses: u32,
    /// Replicas counted live at the last round that answered.
    replicas_known: u32,
    /// The last publication's decision taken: (term, epoch).
    applied: Option<(u64, u64)>,
    /// The leader's VM → this replica's id for it.
    adopted: BTreeMap<VmId, VmId>,
    /// Last round that reached the store, ns.
    heartbeat_ns: Option<u64>,
    /// Counts in the store: epoch → requests (recent epochs only).
    counts: BTreeMap<u64, u64>,
    /// Its latest count in the store: (epoch, requests).
    last: Option<(u64, u64)>,
}

/// The coordinator's events, in this order at equal times.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Step {
    /// Every replica's round after epoch `e`.
    Round,
    /// The leader sums epoch `e`.
    Sum,
    /// A follower reads the publication of epoch `e`.
    Follow,
}

/// The store and the schedule of the coordinator's rounds.
struct Coordination<'p> {
    r: &'p ReplicaParams,
    epoch_ns: u64,
    /// `(holder, term, expires)`.
    lease: Option<(usize, u64, u64)>,
    max_term: u64,
    publications: VecDeque<Publication>,
    demands: ShareDemands,
    /// `(time, step, epoch, replica)`.
    events: BinaryHeap<Reverse<(u64, Step, u64, usize)>>,
    end_ns: u64,
}

impl Coordination<'_> {
    fn down(&self, t: u64) -> bool {
        self.r.outages.iter().any(|&(from, to)| from <= t && t < to)
    }

    fn schedule(&mut self, t: u64, step: Step, epoch: u64, replica: usize) {
        if t <= self.end_ns {
            self.events.push(Reverse((t, step, epoch, replica)));
        }
    }

    /// The latest publication readable at `t`.
    fn visible(&self, t: u64) -> Option<&Publication> {
        self.publications.iter().rev().find(|p| p.visible_ns <= t)
    }

    /// Replicas whose last round reached the store within the grace epochs.
    fn live(&self, reps: &[Replica<'_>], t: u64) -> Vec<usize> {
        let window = self.epoch_ns * (u64::from(self.r.grace_epochs) + 1);
        (0..reps.len())
            .filter(|&i| reps[i].heartbeat_ns.is_some_and(|h| h + window >= t))
            .collect()
    }
}

fn dur(ns: u64) -> Time {
    Duration::from_nanos(ns)
}

/// `sim.replicas` with `r.count` ≥ 2 replicas: see the [module docs](self).
fn run(
    p: &SimParams,
    r: &ReplicaParams,
    trace: &Trace,
    kind: PolicyKind,
    seed: u64,
    series_rows: Option<usize>,
    progress: &mut dyn FnMut(u64),
) -> PolicyRun {
    // Epochs close on the coordinator's sums, never in bulk.
    let p = &SimParams {
        skip_idle: false,
        ..p.clone()
    };
    let epoch_ns = p.controller.monitor.epoch.as_nanos() as u64;
    let n = r.count;
    let mut reps: Vec<Replica<'_>> = (0..n)
        .map(|i| {
            let rows = if i == 0 { series_rows } else { None };
            let mut engine = Engine::new(p, trace, kind, seed.wrapping_add(i as u64), rows);
            let core = engine.core_mut();
            core.set_count_source(Time::ZERO, CountSource::Aggregate);
            core.set_pool_writer(Time::ZERO, i == 0);
            if i == 0 {
                engine.set_stop_handoff(2 * epoch_ns + epoch_ns / 4);
            }
            engine.begin();
            Replica {
                engine,
                role: if i == 0 { Role::Leader } else { Role::Follower },
                key: (i == 0).then_some(1),
                misses: 0,
                replicas_known: n as u32,
                applied: None,
                adopted: BTreeMap::new(),
                heartbeat_ns: Some(0),
                counts: BTreeMap::new(),
                last: None,
            }
        })
        .collect();
    let end_ns = reps[0].engine.trace_end_ns();
    let mut c = Coordination {
        r,
        epoch_ns,
        lease: Some((0, 1, r.lease_ns)),
        max_term: 1,
        publications: VecDeque::new(),
        demands: ShareDemands::new(SHARE_WINDOW_EPOCHS),
        events: BinaryHeap::new(),
        end_ns,
    };
    // The replicas start with the leader's initial pool (as after a round before t = 0).
    let registry = ready_vms(&reps[0]);
    for rep in reps.iter_mut().skip(1) {
        sync_registry(rep, &registry, 0);
    }
    let round_margin = (epoch_ns / 50).min(20_000_000);
    c.schedule(epoch_ns + round_margin, Step::Round, 0, 0);

    let mut service_rng = ChaCha8Rng::seed_from_u64(seed);
    let mut arrival_rng = ChaCha8Rng::seed_from_u64(seed);
    arrival_rng.set_stream(1);
    let mut stream = trace.stream(arrival_rng);
    let mut next = stream.next_arrival();
    let mut arrived = 0u64;
    let total_weight: f64 = r.weights.iter().sum();
    let mut current = vec![0.0; n];
    loop {
        let coord_t = c.events.peek().map(|Reverse(ev)| ev.0);
        let mut heap = None;
        for (i, rep) in reps.iter_mut().enumerate() {
            if let Some(h) = rep.engine.next_event_ns()
                && heap.is_none_or(|(_, b)| h < b)
            {
                heap = Some((i, h));
            }
        }
        let t = [
            coord_t,
            heap.map(|(_, h)| h),
            next.as_ref().map(|a| a.at_ns),
        ]
        .into_iter()
        .flatten()
        .min();
        let Some(t) = t else { break };
        // At equal times: deadlines, the coordinator, scheduled events, arrivals.
        for rep in &mut reps {
            rep.engine.fire_timers_to(t);
        }
        if coord_t == Some(t) {
            let Some(Reverse((t, step, epoch, i))) = c.events.pop() else {
                unreachable!()
            };
            match step {
                Step::Round => {
                    for i in 0..n {
                        round(&mut c, &mut reps, i, epoch, t);
                    }
                    c.schedule(
                        (epoch + 2) * epoch_ns + round_margin,
                        Step::Round,
                        epoch + 1,
                        0,
                    );
                }
                Step::Sum => sum(&mut c, &mut reps, i, epoch, t),
                Step::Follow => {
                    if !c.down(t) && reps[i].role == Role::Follower {
                        follow(&c, &mut reps, i, t);
                    }
                }
            }
            continue;
        }
        if let Some((i, h)) = heap
            && h == t
        {
            reps[i].engine.handle_next();
            continue;
        }
        let a = next.take().expect("an arrival is next");
        // Smooth weighted round robin: the replica furthest behind its weight.
        let mut pick = 0;
        for i in 0..n {
            current[i] += r.weights[i];
            if current[i] > current[pick] {
                pick = i;
            }
        }
        current[pick] -= total_weight;
        let (service_ns, memory_mb) = super::engine::demand(p, trace, &a, &mut service_rng);
        reps[pick]
            .engine
            .arrive_at(a.at_ns, service_ns, memory_mb, a.class, a.zone);
        arrived += 1;
        if arrived & 0xFFFF == 0 {
            progress(arrived);
        }
        next = stream.next_arrival();
    }
    for rep in &mut reps {
        rep.engine.fire_timers_to(end_ns);
    }
    progress(arrived);
    let end = reps
        .iter()
        .map(|r| r.engine.last_done_ns())
        .fold(end_ns, u64::max);
    let mut reps = reps.into_iter();
    let mut leader = reps.next().expect("at least two replicas").engine;
    for rep in reps {
        leader.absorb(rep.engine);
    }
    leader.finish_run(kind, arrived, end)
}

/// The leader's ready VMs (its registry).
fn ready_vms(leader: &Replica<'_>) -> Vec<VmId> {
    leader
        .engine
        .core()
        .controller()
        .vms()
        .rows()
        .iter()
        .filter(|v| v.state == VmState::Ready)
        .map(|v| v.id)
        .collect()
}

/// Make `rep`'s adopted VMs exactly `registry` at `t`: adopt the new ones, drain the
/// ones no longer listed.
fn sync_registry(rep: &mut Replica<'_>, registry: &[VmId], t: u64) {
    let gone: Vec<(VmId, VmId)> = rep
        .adopted
        .iter()
        .filter(|(theirs, _)| !registry.contains(theirs))
        .map(|(&a, &b)| (a, b))
        .collect();
    for (theirs, mine) in gone {
        rep.engine.core_mut().drain_vm(dur(t), mine);
        rep.engine.act(t);
        rep.adopted.remove(&theirs);
    }
    for &vm in registry {
        if !rep.adopted.contains_key(&vm) {
            let mine = rep.engine.adopt_vm(t);
            rep.adopted.insert(vm, mine);
        }
    }
}

/// Replica `i`'s round after epoch `epoch`, at `t`.
fn round(c: &mut Coordination<'_>, reps: &mut [Replica<'_>], i: usize, epoch: u64, t: u64) {
    let mut fresh = Vec::new();
    {
        let core = reps[i].engine.core_mut();
        core.handle_timeout(dur(t));
        while let Some(count) = core.poll_epoch_count() {
            fresh.push((count.epoch, count.requests));
        }
    }
    reps[i].engine.act(t);
    if c.down(t) {
        store_down(reps, i, &fresh, t, c.r.grace_epochs);
        return;
    }
    {
        let rep = &mut reps[i];
        for &(e, n) in &fresh {
            rep.counts.insert(e, n);
            rep.last = Some((e, n));
        }
        let oldest = epoch.saturating_sub(8);
        rep.counts.retain(|&e, _| e >= oldest);
        rep.heartbeat_ns = Some(t);
        rep.misses = 0;
        if rep.role == Role::Local {
            rep.role = Role::Follower;
        }
    }
    reps[i].replicas_known = (c.live(reps, t).len() as u32).max(1);
    let holder = c.lease.filter(|&(_, _, expires)| expires > t);
    let e = c.epoch_ns;
    let sum_at = (epoch + 1) * e + e / 2 + c.r.store_delay_ns;
    match (reps[i].key, holder) {
        (Some(term), Some((h, held, _))) if h == i && held == term => {
            c.lease = Some((i, term, t + c.r.lease_ns));
            c.schedule(sum_at, Step::Sum, epoch, i);
        }
        _ => {
            if reps[i].key.is_some() {
                step_down(&mut reps[i], t);
            }
            if holder.is_none() {
                c.max_term += 1;
                let term = c.max_term;
                c.lease = Some((i, term, t + c.r.lease_ns));
                take_over(c, &mut reps[i], term, t);
                c.schedule(sum_at, Step::Sum, epoch, i);
                return;
            }
            follow(c, reps, i, t);
            let margin = (e / 10).min(50_000_000).max(c.r.store_delay_ns);
            c.schedule(sum_at + margin, Step::Follow, epoch, i);
        }
    }
}

/// Replica `i`'s round found no store: keep the last share for the grace epochs, then
/// local decisions on its own count × N with share 1/N; the pool stays frozen.
fn store_down(reps: &mut [Replica<'_>], i: usize, fresh: &[(u64, u64)], t: u64, grace: u32) {
    let rep = &mut reps[i];
    rep.misses += 1;
    if rep.role == Role::Leader {
        rep.engine.core_mut().set_pool_writer(dur(t), false);
        rep.engine.act(t);
    }
    if rep.misses <= grace {
        return;
    }
    let n = u64::from(rep.replicas_known.max(1));
    rep.role = Role::Local;
    rep.key = None;
    let core = rep.engine.core_mut();
    core.set_pool_writer(dur(t), false);
    core.set_budget_share(dur(t), 1.0 / n as f64);
    for &(epoch, requests) in fresh {
        core.on_aggregate_count(dur(t), epoch, requests * n);
    }
    rep.engine.act(t);
}

fn step_down(rep: &mut Replica<'_>, t: u64) {
    rep.role = Role::Follower;
    rep.key = None;
    rep.engine.core_mut().set_pool_writer(dur(t), false);
    rep.engine.act(t);
}

/// `rep` took the lease with `term`: resume the published EWMAs (or hold scale-in for
/// K epochs without them), take the published decision, write the pool.
fn take_over(c: &Coordination<'_>, rep: &mut Replica<'_>, term: u64, t: u64) {
    rep.role = Role::Leader;
    rep.key = Some(term);
    let published = c.visible(t).cloned();
    let core = rep.engine.core_mut();
    match published.as_ref().and_then(|p| p.ewma) {
        Some(e) => core.restore_ewma(&e),
        None => core.hold_scale_in(u64::from(c.r.decision_epochs)),
    }
    if let Some((epoch, d)) = published.and_then(|p| p.decision) {
        core.apply_decision(dur(t), epoch, d);
    }
    core.set_pool_writer(dur(t), true);
    rep.engine.act(t);
}

/// The leader `i` sums epoch `epoch` at `t` and publishes.
fn sum(c: &mut Coordination<'_>, reps: &mut [Replica<'_>], i: usize, epoch: u64, t: u64) {
    if c.down(t) {
        reps[i].engine.core_mut().set_pool_writer(dur(t), false);
        reps[i].engine.act(t);
        return;
    }
    let holds = matches!(
        (reps[i].key, c.lease),
        (Some(term), Some((h, held, expires))) if h == i && held == term && expires > t
    );
    if !holds {
        step_down(&mut reps[i], t);
        return;
    }
    let rows: Vec<ReplicaCount> = reps
        .iter()
        .filter(|r| r.heartbeat_ns.is_some())
        .map(|r| ReplicaCount {
            count: r.counts.get(&epoch).copied(),
            last: r.last,
        })
        .collect();
    let total = aggregate(epoch, &rows, 1);
    let live = c.live(reps, t);
    let counts: Vec<(String, u64)> = live
        .iter()
        .map(|&j| {
            let r = &reps[j];
            let n = r
                .counts
                .get(&epoch)
                .copied()
                .or(r.last.map(|(_, n)| n))
                .unwrap_or(0);
            (j.to_string(), n)
        })
        .collect();
    let demands = c.demands.demands(epoch, &counts);
    let core = reps[i].engine.core_mut();
    let now = dur(t);
    core.set_pool_writer(now, true);
    core.on_aggregate_count(now, epoch, total.requests);
    let budget = core.shared_vm_budget();
    let mut shares = vec![None; reps.len()];
    for (&j, s) in live.iter().zip(budget_shares(budget, &demands)) {
        shares[j] = Some(s);
    }
    let own = shares[i].unwrap_or(1.0);
    let core = reps[i].engine.core_mut();
    core.set_budget_share(now, own);
    let ewma = core.ewma_state();
    reps[i].engine.act(t);
    let publication = Publication {
        term: reps[i].key.unwrap_or(0),
        ewma,
        decision: reps[i].engine.last_decision(),
        shares,
        registry: ready_vms(&reps[i]),
        visible_ns: t + c.r.store_delay_ns,
    };
    c.publications.push_back(publication);
    while c.publications.len() > 4 {
        c.publications.pop_front();
    }
}

/// Follower `i` takes the latest publication it can read at `t`.
fn follow(c: &Coordination<'_>, reps: &mut [Replica<'_>], i: usize, t: u64) {
    let replicas = c.live(reps, t).len().max(1);
    let rep = &mut reps[i];
    rep.role = Role::Follower;
    let now = dur(t);
    let Some(p) = c.visible(t) else {
        rep.engine.core_mut().set_pool_writer(now, false);
        rep.engine.act(t);
        return;
    };
    let fresh = p
        .decision
        .map(|(epoch, _)| (p.term, epoch))
        .filter(|k| rep.applied != Some(*k));
    let share = p
        .shares
        .get(i)
        .copied()
        .flatten()
        .unwrap_or(1.0 / replicas as f64);
    sync_registry(rep, &p.registry, t);
    let core = rep.engine.core_mut();
    core.set_pool_writer(now, false);
    if let Some(e) = &p.ewma {
        core.restore_ewma(e);
    }
    if let (Some(_), Some((epoch, d))) = (fresh, p.decision) {
        core.apply_decision(now, epoch, d);
    }
    core.set_budget_share(now, share);
    rep.engine.act(t);
    if fresh.is_some() {
        rep.applied = fresh;
    }
}
