//! The coordinator over the in-memory store under paused tokio time: three replicas
//! with their own cores, traffic spread unevenly, and the failures the shared decision
//! must survive — a leader cut off past its lease, the store down and hung, a leader
//! that shuts down. α = 0.3, β = 0.2, φ = 1.5, ρ = 0.6, epochs of 1 s, K = 2.

use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::time::Instant;

use super::memory::{Faults, MemoryStore};
use super::*;
use crate::policy::attempt::{Decision, Ticket};
use crate::policy::balancer::{BudgetRule, RequestMeta, VmFirst};
use crate::policy::controller::{self, ControllerParams};
use crate::policy::core::{Action, CoreParams};
use crate::policy::monitor::MonitorParams;
use crate::policy::placement::{
    PlacementParams, PlacementPolicy, ZoneCapacity, ZoneKind, ZoneParams,
};
use crate::policy::scaling::{LibraScaler, LibraScalingParams};

const EPOCH: Duration = Duration::from_secs(1);
/// The store's clock at the start: a multiple of the epoch.
const START_MS: u64 = 1_800_000_000_000;

fn core() -> Core {
    let mut c = Core::new(
        CoreParams {
            controller: ControllerParams {
                monitor: MonitorParams {
                    epoch: EPOCH,
                    alpha: 0.3,
                    beta: 0.2,
                    decision_epochs: 2,
                    first_decision_epoch: None,
                },
                r_max_rps: 10.0,
                execute_scaling: true,
            },
            placement: PlacementParams {
                zones: vec![ZoneParams {
                    name: "fn".into(),
                    kind: ZoneKind::Cloud,
                    capacity: ZoneCapacity::Concurrency {
                        max_concurrency: None,
                    },
                }],
                policy: PlacementPolicy::EdgeFirst,
            },
            vm_boot_timeout: None,
        },
        Box::new(LibraScaler::new(LibraScalingParams {
            phi: 1.5,
            r_max_rps: 10.0,
            min_vms: 0,
            max_vms: 20,
            cip_rps: 0.5,
        })),
        Box::new(VmFirst::new(0.6).with_budget_rule(BudgetRule::Quota { truncate: false }, EPOCH)),
    );
    c.start(Time::ZERO);
    c
}

#[derive(Default)]
struct HostState {
    /// Instance names of the VMs in the table; `true`: launched by this replica.
    names: BTreeMap<VmId, (String, bool)>,
    launched: Vec<(Instant, String)>,
    last_decision: Option<(u64, ScaleDecision)>,
    vm_admissions: u64,
    requests: u64,
    /// The intents this replica replayed as a new leader ([`Host::replay`]), in order.
    replayed: Vec<Intent>,
    /// Launches made from now on stay booting (their instance exists, never ready).
    hold_boot: bool,
}

/// The replicas' provider: launch token → instance name of every launch made.
type Cloud = Arc<Mutex<BTreeMap<String, String>>>;

/// The instances of [`Cloud`] that are still booting.
type Booting = Arc<Mutex<BTreeSet<String>>>;

/// A replica: a core, its VM names, launches that become ready at once once the
/// fence permits them.
struct TestHost {
    name: String,
    origin: Instant,
    core: Mutex<Core>,
    state: Mutex<HostState>,
    fence: OnceLock<Arc<Coordinator>>,
    cloud: Cloud,
    booting: Booting,
}

impl TestHost {
    fn new(name: &str, origin: Instant, cloud: Cloud, booting: Booting) -> Arc<Self> {
        Arc::new(Self {
            name: name.into(),
            origin,
            core: Mutex::new(core()),
            state: Mutex::new(HostState::default()),
            fence: OnceLock::new(),
            cloud,
            booting,
        })
    }

    /// Execute the core's actions like the driver: launches through the fence.
    fn pump(self: &Arc<Self>) {
        let actions: Vec<Action> = {
            let mut c = self.core.lock();
            std::iter::from_fn(|| c.poll_action()).collect()
        };
        for a in actions {
            match a {
                Action::Scaling(controller::Action::Launch { vm }) => {
                    let me = Arc::clone(self);
                    tokio::spawn(async move {
                        let permit = match me.fence.get() {
                            Some(f) => f.permit("launch", vm, None).await,
                            None => None,
                        };
                        let ok = permit.is_some() || me.fence.get().is_none();
                        let now = me.now();
                        let name = format!("{}-{vm}", me.name);
                        if let Some(token) = permit.and_then(|p| p.intent.token) {
                            me.cloud.lock().insert(token, name.clone());
                        }
                        let mut c = me.core.lock();
                        if ok {
                            let mut st = me.state.lock();
                            st.names.insert(vm, (name.clone(), true));
                            st.launched.push((Instant::now(), name.clone()));
                            if st.hold_boot {
                                me.booting.lock().insert(name);
                            } else {
                                c.on_vm_ready(now, vm);
                            }
                        } else {
                            c.on_vm_failed(now, vm);
                        }
                    });
                }
                Action::Scaling(controller::Action::Stop { vm }) => {
                    self.state.lock().names.remove(&vm);
                }
                Action::Scaling(controller::Action::Decided {
                    epoch, decision, ..
                }) => {
                    self.state.lock().last_decision = Some((epoch, decision));
                }
                _ => {}
            }
        }
    }

    /// `n` requests spread over the next epoch.
    async fn traffic(self: &Arc<Self>, n: u64) {
        let step = EPOCH / u32::try_from(n.max(1)).unwrap();
        for _ in 0..n {
            let now = self.now();
            let d = {
                let mut t = Ticket::new(RequestMeta::default(), None);
                let mut c = self.core.lock();
                let d = c.route(now, &mut t);
                c.finish(now, &mut t);
                d
            };
            {
                let mut st = self.state.lock();
                st.requests += 1;
                if matches!(d, Decision::Vm { .. }) {
                    st.vm_admissions += 1;
                }
            }
            self.pump();
            tokio::time::sleep(step).await;
        }
        if n == 0 {
            tokio::time::sleep(EPOCH).await;
        }
    }
}

impl Host for TestHost {
    fn with_core(&self, f: &mut dyn FnMut(&mut Core, Time)) {
        let now = self.now();
        f(&mut self.core.lock(), now);
        // The actions are executed by `pump`, which needs the Arc: the tests call it
        // after every round ([`Replicas::settle`]).
    }

    fn now(&self) -> Time {
        Instant::now().duration_since(self.origin)
    }

    fn registry(&self) -> Vec<RegistryVm> {
        let c = self.core.lock();
        let st = self.state.lock();
        c.controller()
            .vms()
            .rows()
            .iter()
            .filter(|r| r.state == crate::policy::balancer::VmState::Ready)
            .filter_map(|r| st.names.get(&r.id))
            .map(|(n, _)| RegistryVm {
                instance: n.clone(),
                base: format!("http://{n}/"),
            })
            .collect()
    }

    fn sync_registry(&self, vms: &[RegistryVm]) {
        let now = self.now();
        let listed: BTreeSet<&str> = vms.iter().map(|v| v.instance.as_str()).collect();
        let mut c = self.core.lock();
        let mut st = self.state.lock();
        let gone: Vec<VmId> = st
            .names
            .iter()
            .filter(|(_, (n, own))| !own && !listed.contains(n.as_str()))
            .map(|(vm, _)| *vm)
            .collect();
        for vm in gone {
            c.drain_vm(now, vm);
            st.names.remove(&vm);
        }
        let known: BTreeSet<String> = st.names.values().map(|(n, _)| n.clone()).collect();
        for v in vms {
            if !known.contains(&v.instance) {
                let vm = c.adopt_ready_vm(now);
                st.names.insert(vm, (v.instance.clone(), false));
            }
        }
    }

    fn last_decision(&self) -> Option<(u64, ScaleDecision)> {
        self.state.lock().last_decision
    }

    fn launch_token(&self, vm: VmId, term: u64) -> Option<String> {
        Some(format!("tok-{}-{term}-{vm}", self.name))
    }

    /// Like the driver over a provider: a launch found by its token is adopted (once),
    /// one the provider never saw is dropped; a terminate removes the instance.
    fn replay<'a>(&'a self, intent: &'a Intent) -> BoxFuture<'a, Replayed> {
        let now = self.now();
        let mut c = self.core.lock();
        let mut st = self.state.lock();
        st.replayed.push(intent.clone());
        let done = match (intent.op.as_str(), &intent.token, &intent.instance) {
            ("launch", Some(token), _) => match self.cloud.lock().get(token).cloned() {
                Some(name) if self.booting.lock().contains(&name) => {
                    if !st.names.values().any(|(n, _)| *n == name) {
                        let vm = c.adopt_booting_vm(now);
                        st.names.insert(vm, (name.clone(), true));
                    }
                    Replayed::Booting(name)
                }
                Some(name) => {
                    if !st.names.values().any(|(n, _)| *n == name) {
                        let vm = c.adopt_ready_vm(now);
                        st.names.insert(vm, (name.clone(), true));
                    }
                    Replayed::Adopted(name)
                }
                None => Replayed::Dropped,
            },
            ("terminate", _, Some(instance)) => {
                self.cloud.lock().retain(|_, n| n != instance);
                Replayed::Terminated(instance.clone())
            }
            _ => Replayed::Dropped,
        };
        Box::pin(async move { done })
    }
}

struct Replicas {
    store: Arc<MemoryStore>,
    hosts: Vec<Arc<TestHost>>,
    coords: Vec<Arc<Coordinator>>,
}

fn settings(name: &str) -> Settings {
    Settings {
        replica: name.into(),
        epoch: EPOCH,
        lease: Duration::from_millis(2500),
        op_timeout: Duration::from_millis(250),
        grace_epochs: 3,
        decision_epochs: 2,
        base_epoch: START_MS / 1000,
    }
}

impl Replicas {
    fn start(n: usize) -> Self {
        let store = Arc::new(MemoryStore::new(START_MS));
        let origin = Instant::now();
        let cloud = Cloud::default();
        let booting = Booting::default();
        let mut hosts = Vec::new();
        let mut coords = Vec::new();
        for i in 0..n {
            let name = format!("r{i}");
            let host = TestHost::new(&name, origin, Arc::clone(&cloud), Arc::clone(&booting));
            let c = Coordinator::new(
                settings(&name),
                Arc::clone(&store) as Arc<dyn Store>,
                Arc::clone(&host) as Arc<dyn Host>,
            );
            let _ = host.fence.set(Arc::clone(&c));
            c.start();
            hosts.push(host);
            coords.push(c);
        }
        Self {
            store,
            hosts,
            coords,
        }
    }

    /// `epochs` epochs with `loads[i]` requests per epoch on replica i.
    async fn run(&self, epochs: u32, loads: &[u64]) {
        for _ in 0..epochs {
            let mut tasks = Vec::new();
            for (h, &n) in self.hosts.iter().zip(loads) {
                let h = Arc::clone(h);
                tasks.push(tokio::spawn(async move { h.traffic(n).await }));
            }
            for t in tasks {
                t.await.unwrap();
            }
            for h in &self.hosts {
                h.pump();
            }
        }
    }

    fn roles(&self) -> Vec<Role> {
        self.coords.iter().map(|c| c.status().role).collect()
    }

    fn leader(&self) -> Option<usize> {
        self.coords
            .iter()
            .position(|c| c.status().role == Role::Leader)
    }

    fn targets(&self) -> Vec<u32> {
        self.hosts
            .iter()
            .map(|h| h.core.lock().controller().pool().target)
            .collect()
    }
}

#[tokio::test(start_paused = true)]
async fn three_replicas_elect_one_leader_and_share_its_decision() {
    let r = Replicas::start(3);
    // 70/20/10 of 60 requests per epoch.
    r.run(12, &[42, 12, 6]).await;
    let roles = r.roles();
    assert_eq!(
        roles.iter().filter(|&&x| x == Role::Leader).count(),
        1,
        "{roles:?}"
    );
    let leader = r.leader().unwrap();
    let st = r.coords[leader].status();
    assert_eq!(st.term, Some(1));
    assert_eq!(st.replicas, 3);
    // Everyone runs the leader's target.
    let targets = r.targets();
    assert!(targets.iter().all(|&t| t == targets[leader]), "{targets:?}");
    assert!(targets[leader] >= 5, "60 req/s at r_max 10: {targets:?}");
    // Only the leader launched, and every launch was recorded first.
    for (i, h) in r.hosts.iter().enumerate() {
        let n = h.state.lock().launched.len();
        if i == leader {
            assert_eq!(n, r.store.intents().len());
        } else {
            assert_eq!(n, 0, "replica {i} launched");
        }
    }
    // Shares follow the traffic and add up to one (once the followers took the
    // leader's last publication: within a watch period).
    tokio::time::sleep(EPOCH / WATCHES_PER_EPOCH * 2).await;
    let shares: Vec<f64> = r.coords.iter().map(|c| c.status().share).collect();
    let sum: f64 = shares.iter().sum();
    assert!((sum - 1.0).abs() < 1e-9, "{shares:?}");
    assert!(shares[0] > shares[1] && shares[1] > shares[2], "{shares:?}");
    // The monitor saw the sum: avg near 60 req/s on every replica (followers restore).
    for h in &r.hosts {
        let avg = h.core.lock().controller().status().avg_rps;
        assert!((avg - 60.0).abs() < 3.0, "{avg}");
    }
    // The followers use the leader's registry: every ready VM is known everywhere.
    let leader_ready = r.hosts[leader].core.lock().controller().pool().ready;
    for h in &r.hosts {
        assert_eq!(h.core.lock().controller().pool().ready, leader_ready);
    }
}

#[tokio::test(start_paused = true)]
async fn per_epoch_vm_admissions_stay_within_one_gateways_budget() {
    let r = Replicas::start(3);
    r.run(10, &[30, 20, 10]).await;
    let before: Vec<u64> = r
        .hosts
        .iter()
        .map(|h| h.state.lock().vm_admissions)
        .collect();
    let vm_reqs_rps = |r: &Replicas| {
        let leader = r.leader().unwrap();
        r.hosts[leader]
            .core
            .lock()
            .controller()
            .status()
            .vm_reqs_rps
    };
    // The decisions in force over the window: the one at its start and the one at its
    // end (the load is steady, so vm_reqs only falls as the deviation decays).
    let at_start = vm_reqs_rps(&r);
    let epochs = 6;
    r.run(epochs, &[30, 20, 10]).await;
    let admitted: u64 = r
        .hosts
        .iter()
        .zip(&before)
        .map(|(h, b)| h.state.lock().vm_admissions - b)
        .sum();
    let vm_reqs = vm_reqs_rps(&r).max(at_start);
    let bound = 0.6 * vm_reqs * f64::from(epochs) + 3.0 * f64::from(epochs);
    assert!(
        (admitted as f64) <= bound,
        "{admitted} VM admissions over {epochs} epochs, ρ·vm_reqs·E = {}",
        0.6 * vm_reqs
    );
    assert!(admitted > 0);
}

#[tokio::test(start_paused = true)]
async fn a_leader_cut_off_past_its_lease_is_replaced_and_writes_nothing_after() {
    let r = Replicas::start(3);
    r.run(6, &[20, 20, 20]).await;
    let old = r.leader().expect("a leader");
    let old_name = format!("r{old}");
    let cut_at = Instant::now();
    r.store.set_faults(Faults {
        cut: BTreeSet::from([old_name.clone()]),
        ..Faults::default()
    });
    r.run(5, &[20, 20, 20]).await;
    let new = r.leader().expect("a new leader");
    assert_ne!(new, old);
    assert_eq!(r.coords[new].status().term, Some(2), "term + 1");
    assert_ne!(
        r.coords[old].status().role,
        Role::Leader,
        "frozen while cut off"
    );
    let intents_before = r.store.intents().len();
    // Load up so that the new leader launches; the old one must not.
    r.store.set_faults(Faults::default());
    r.run(6, &[60, 60, 60]).await;
    assert_eq!(r.coords[old].status().role, Role::Follower);
    let intents = r.store.intents();
    assert!(intents.len() > intents_before, "the new leader scaled out");
    assert!(
        intents[intents_before..].iter().all(|i| i.term == 2),
        "{intents:?}"
    );
    assert!(
        r.hosts[old]
            .state
            .lock()
            .launched
            .iter()
            .all(|(at, _)| *at <= cut_at),
        "no launch by the old leader after it was cut off"
    );
}

#[tokio::test(start_paused = true)]
async fn without_the_store_replicas_go_local_after_the_grace_epochs_then_return() {
    let r = Replicas::start(3);
    r.run(8, &[20, 20, 20]).await;
    let launched_before: usize = r.hosts.iter().map(|h| h.state.lock().launched.len()).sum();
    r.store.set_faults(Faults {
        down: true,
        ..Faults::default()
    });
    r.run(2, &[20, 20, 20]).await;
    assert!(
        r.roles().iter().all(|&x| x != Role::Local),
        "within the grace epochs: {:?}",
        r.roles()
    );
    r.run(4, &[40, 40, 40]).await;
    assert_eq!(r.roles(), vec![Role::Local; 3]);
    for c in &r.coords {
        let s = c.status();
        assert!((s.share - 1.0 / 3.0).abs() < 1e-9);
        assert!(s.buffered_counts >= 5, "{s:?}");
        assert!(s.last_store_error.is_some());
    }
    let launched_during: usize = r.hosts.iter().map(|h| h.state.lock().launched.len()).sum();
    assert_eq!(launched_during, launched_before, "the pool is frozen");
    let outage_epoch = r.coords[0].status().epoch.unwrap();
    r.store.set_faults(Faults::default());
    r.run(3, &[20, 20, 20]).await;
    let roles = r.roles();
    assert!(roles.iter().all(|&x| x != Role::Local), "{roles:?}");
    assert_eq!(roles.iter().filter(|&&x| x == Role::Leader).count(), 1);
    // The counts of the outage arrived: no gap.
    let counts = r.store.counts(outage_epoch);
    assert_eq!(counts.len(), 3, "{counts:?}");
    assert!(counts.values().all(|&n| n == 40), "{counts:?}");
}

#[tokio::test(start_paused = true)]
async fn a_hung_store_costs_one_deadline_per_operation() {
    let r = Replicas::start(1);
    r.run(3, &[5]).await;
    r.store.set_faults(Faults {
        hung: true,
        ..Faults::default()
    });
    let t0 = Instant::now();
    r.coords[0].tick().await;
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_millis(300),
        "{took:?}"
    );
    assert!(
        r.coords[0]
            .status()
            .last_store_error
            .as_deref()
            .is_some_and(|e| e.contains("timed out")),
        "{:?}",
        r.coords[0].status()
    );
}

#[tokio::test(start_paused = true)]
async fn a_leader_that_shuts_down_hands_over_and_the_ewmas_resume() {
    let r = Replicas::start(2);
    r.run(10, &[30, 30]).await;
    let old = r.leader().unwrap();
    let avg_before = r.hosts[old].core.lock().controller().status().avg_rps;
    r.coords[old].shutdown().await;
    assert!(r.store.leader().is_none(), "the lease is released");
    let other = 1 - old;
    // The survivor takes the lease at its next round (within one epoch: test sleeps
    // round up to whole milliseconds, so the run takes a little longer than an epoch).
    r.run(1, &[0, 0]).await;
    let st = r.coords[other].status();
    assert_eq!(
        st.role,
        Role::Leader,
        "{st:?} {:?} {:?}",
        r.coords[old].status(),
        r.store.leader()
    );
    assert_eq!(st.term, Some(2));
    let avg_after = r.hosts[other].core.lock().controller().status().avg_rps;
    // One epoch of no traffic at α = 0.3 at most separates them.
    assert!(
        avg_after >= 0.6 * avg_before && avg_after <= avg_before * 1.01,
        "{avg_before} → {avg_after}"
    );
}

#[test]
fn epochs_align_on_the_stores_clock() {
    let at = Instant::now();
    let (origin, index) = split(1_800_000_000_250, Duration::from_millis(500), at);
    assert_eq!(index, 3_600_000_000);
    assert_eq!(at - origin, Duration::from_millis(250));
    let (origin, index) = split(1_000, Duration::from_secs(1), at);
    assert_eq!((index, at - origin), (1, Duration::ZERO));
}

#[test]
fn published_reasons_map_back() {
    for r in [
        ScaleReason::BelowCostIndifferencePoint,
        ScaleReason::Provision,
        ScaleReason::ClampedToMin,
        ScaleReason::ClampedToMax,
        ScaleReason::Baseline,
        ScaleReason::AwaitingTraffic,
    ] {
        assert_eq!(reason_named(r.as_str()), r);
    }
    assert_eq!(reason_named("?"), ScaleReason::Provision);
}

/// A slow store (every operation 100 ms, E/10, within the 250 ms deadline) changes
/// nothing a user sees: one leader, every replica on its target. A store slower than
/// the deadline (E/2 = 500 ms) is a store that does not answer: local decisions after
/// the grace epochs, the pool frozen; shared again once it is fast.
#[tokio::test(start_paused = true)]
async fn a_slow_store_is_shared_within_the_deadline_and_local_beyond_it() {
    let r = Replicas::start(3);
    r.store.set_faults(Faults {
        delay: Duration::from_millis(100),
        ..Faults::default()
    });
    r.run(12, &[42, 12, 6]).await;
    let roles = r.roles();
    assert_eq!(
        roles.iter().filter(|&&x| x == Role::Leader).count(),
        1,
        "{roles:?}"
    );
    assert!(!roles.contains(&Role::Local), "{roles:?}");
    let leader = r.leader().unwrap();
    let targets = r.targets();
    assert!(targets.iter().all(|&t| t == targets[leader]), "{targets:?}");
    assert!(targets[leader] >= 5, "60 req/s at r_max 10: {targets:?}");
    assert!(r.coords.iter().all(|c| c.status().store_errors_total == 0));

    let launched =
        |r: &Replicas| -> usize { r.hosts.iter().map(|h| h.state.lock().launched.len()).sum() };
    let before = launched(&r);
    r.store.set_faults(Faults {
        delay: Duration::from_millis(500),
        ..Faults::default()
    });
    r.run(6, &[90, 90, 90]).await;
    assert_eq!(r.roles(), vec![Role::Local; 3]);
    assert_eq!(
        launched(&r),
        before,
        "the pool is frozen while the store is slow"
    );
    r.store.set_faults(Faults::default());
    r.run(3, &[90, 90, 90]).await;
    let roles = r.roles();
    assert!(!roles.contains(&Role::Local), "{roles:?}");
    assert_eq!(roles.iter().filter(|&&x| x == Role::Leader).count(), 1);
}

/// A store restarted empty forgets the term counter; the replicas do not: the next
/// leader's term is above every term they saw (fencing stays monotonic).
#[tokio::test(start_paused = true)]
async fn a_store_restarted_empty_grants_a_higher_term_than_any_seen() {
    let r = Replicas::start(3);
    r.run(6, &[20, 20, 20]).await;
    let old = r.leader().unwrap();
    r.coords[old].shutdown().await;
    r.run(2, &[20, 20, 20]).await;
    let seen = r
        .coords
        .iter()
        .filter_map(|c| c.status().term)
        .max()
        .unwrap();
    assert_eq!(seen, 2, "one hand-over");
    r.store.wipe();
    r.run(3, &[20, 20, 20]).await;
    let leader = r.leader().expect("a leader after the wipe");
    let term = r.coords[leader].status().term.unwrap();
    assert!(term > seen, "term {term} after the wipe, {seen} before");
    assert!(
        r.store.intents().iter().all(|i| i.term > seen),
        "no intent of an old term after the wipe: {:?}",
        r.store.intents()
    );
}

/// The asynchronous-call directory: each replica's tag and URL as it heartbeats, only
/// the live ones; a cut-off replica's tag leaves once its heartbeat ages out.
#[tokio::test(start_paused = true)]
async fn the_call_directory_lists_the_live_replicas_tags() {
    let r = Replicas::start(3);
    for (i, c) in r.coords.iter().enumerate() {
        c.advertise(CallAddress {
            tag: 0x1000_0000 + i as u32,
            url: format!("http://10.0.0.{i}:8080"),
        });
    }
    r.run(3, &[5, 5, 5]).await;
    for c in &r.coords {
        for i in 0..3u32 {
            assert_eq!(
                c.call_owner(0x1000_0000 + i).as_deref(),
                Some(format!("http://10.0.0.{i}:8080").as_str())
            );
        }
        assert_eq!(c.call_owner(0x2000_0000), None);
    }
    r.store.set_faults(Faults {
        cut: BTreeSet::from(["r2".to_string()]),
        ..Faults::default()
    });
    // The live window is grace + 1 = 4 epochs.
    r.run(6, &[5, 5, 5]).await;
    assert_eq!(r.coords[0].call_owner(0x1000_0002), None, "r2 is not live");
    assert!(r.coords[0].call_owner(0x1000_0001).is_some());
    assert_eq!(
        r.coords[2].call_owner(0x1000_0000).as_deref(),
        Some("http://10.0.0.0:8080"),
        "a cut-off replica keeps its last directory"
    );
}

/// A new leader replays the intents of earlier terms that have no recorded outcome: a
/// launch the provider has (found by the client token its intent recorded) is adopted,
/// not launched again; one the provider never saw is dropped, not re-issued; a
/// terminate is recorded under the new term, then made again. Each is settled; the new
/// leader's own intents are not replayed.
#[tokio::test(start_paused = true)]
async fn a_new_leader_replays_the_open_intents_of_earlier_terms() {
    let r = Replicas::start(2);
    r.run(6, &[30, 30]).await;
    let old = r.leader().expect("a leader");
    let key = r.store.leader().unwrap();
    assert_eq!(key.term, 1);
    let launched_before = r.hosts[old].state.lock().launched.len();
    assert!(launched_before >= 2, "{launched_before} launches");
    let open = r.store.open();
    assert!(
        open.iter()
            .all(|i| i.token.as_deref() == Some(format!("tok-r{old}-1-{}", i.vm).as_str())),
        "every launch intent records its token: {open:?}"
    );
    // The old leader's writes whose outcome it never recorded: a launch EC2 saw (its
    // instance got ready after the leader stopped), one it never saw, a terminate.
    let late = Intent {
        term: 1,
        op: "launch".into(),
        vm: "vm-90".into(),
        instance: None,
        token: Some("tok-late".into()),
    };
    r.hosts[old]
        .cloud
        .lock()
        .insert("tok-late".into(), "late-instance".into());
    let unseen = Intent {
        vm: "vm-91".into(),
        token: Some("tok-unseen".into()),
        ..late.clone()
    };
    let doomed = r.hosts[old].state.lock().launched[0].1.clone();
    let terminate = Intent {
        term: 1,
        op: "terminate".into(),
        vm: "vm-1".into(),
        instance: Some(doomed.clone()),
        token: None,
    };
    for i in [&late, &unseen, &terminate] {
        assert!(r.store.intent(&key, i).await.unwrap());
    }
    let open_before: Vec<Intent> = r.store.open();
    // The old leader is cut off past its lease: the other one takes over.
    r.store.set_faults(Faults {
        cut: BTreeSet::from([format!("r{old}")]),
        ..Faults::default()
    });
    let new = 1 - old;
    r.run(6, &[30, 30]).await;
    assert_eq!(r.coords[new].status().role, Role::Leader);
    let term = r.coords[new].status().term.unwrap();
    assert!(term > 1, "term {term}");

    let replayed = r.hosts[new].state.lock().replayed.clone();
    let mut want = open_before.clone();
    want.sort_by_key(Intent::id);
    let mut got = replayed.clone();
    got.sort_by_key(Intent::id);
    assert_eq!(
        got, want,
        "every open intent of term 1, once, and nothing else"
    );
    assert!(
        r.store.open().iter().all(|i| i.term == term),
        "the earlier terms' intents are settled: {:?}",
        r.store.open()
    );
    let names: Vec<String> = r.hosts[new]
        .state
        .lock()
        .names
        .values()
        .map(|(n, _)| n.clone())
        .collect();
    assert!(names.contains(&"late-instance".to_string()), "{names:?}");
    assert_eq!(
        names.iter().filter(|n| *n == "late-instance").count(),
        1,
        "adopted once"
    );
    let cloud = r.hosts[new].cloud.lock().clone();
    assert!(
        !cloud.contains_key("tok-unseen") && !cloud.values().any(|n| *n == doomed),
        "the unseen launch is not re-issued, the terminate is made: {cloud:?}"
    );
    let again: Vec<Intent> = r
        .store
        .intents()
        .into_iter()
        .filter(|i| i.op == "terminate" && i.instance.as_deref() == Some(doomed.as_str()))
        .collect();
    assert_eq!(
        again.iter().map(|i| i.term).collect::<Vec<_>>(),
        [1, term],
        "the terminate is recorded again under the new term before it is made"
    );
}

/// A take-over while the earlier leader's launches still boot: their intents are still
/// open (a launch's intent is settled once its VM is ready), so the new leader finds
/// each instance by its token and adopts it as a booting VM before it writes the pool:
/// the pool is at the published target with them, and nothing is launched beside them.
#[tokio::test(start_paused = true)]
async fn a_new_leader_adopts_the_earlier_leaders_booting_launches_and_launches_none_beside_them() {
    let r = Replicas::start(2);
    for h in &r.hosts {
        h.state.lock().hold_boot = true;
    }
    // A steady load: the target settles (the EWMAs converge), every launch stays booting.
    r.run(16, &[30, 30]).await;
    let old = r.leader().expect("a leader");
    let new = 1 - old;
    let held = r.hosts[old].booting.lock().clone();
    let old_pool = r.hosts[old].core.lock().controller().pool();
    assert!(held.len() >= 6, "60 req/s at r_max 10: {held:?}");
    assert_eq!(
        (
            old_pool.booting as usize,
            old_pool.ready,
            old_pool.target as usize
        ),
        (held.len(), 0, held.len())
    );
    assert!(r.hosts[new].state.lock().launched.is_empty());
    r.store.set_faults(Faults {
        cut: BTreeSet::from([format!("r{old}")]),
        ..Faults::default()
    });
    for _ in 0..10 {
        r.run(1, &[30, 30]).await;
        if r.coords[new].status().role == Role::Leader {
            break;
        }
    }
    assert_eq!(r.coords[new].status().role, Role::Leader);
    let pool = r.hosts[new].core.lock().controller().pool();
    assert_eq!(
        (pool.booting as usize, pool.target as usize),
        (held.len(), held.len()),
        "every booting launch adopted, counted toward the target"
    );
    let st = r.hosts[new].state.lock();
    assert!(
        st.launched.is_empty(),
        "nothing launched beside them: {:?}",
        st.launched
    );
    let mut adopted: Vec<&String> = st.names.values().map(|(n, _)| n).collect();
    adopted.sort();
    assert_eq!(adopted, held.iter().collect::<Vec<_>>());
}

/// The instant `secs` seconds after the replicas' policy time zero.
fn at(r: &Replicas, secs: f64) -> Instant {
    r.hosts[0].origin + Duration::from_secs_f64(secs)
}

#[tokio::test(start_paused = true)]
async fn the_leader_sums_an_epoch_once_every_count_is_in_not_half_an_epoch_later() {
    let r = Replicas::start(3);
    r.run(8, &[20, 20, 20]).await;
    let base = START_MS / 1000;
    // No traffic from here: every replica still writes its (zero) count of each epoch.
    // Epoch 9 ends at 10 s; every count is in a few round trips later.
    tokio::time::sleep_until(at(&r, 10.2)).await;
    let p = r.store.published().expect("a publication");
    assert_eq!(p.epoch, base + 9, "a fifth of an epoch after the end");
    // A follower's decision, share and EWMAs come from that publication already.
    for (i, h) in r.hosts.iter().enumerate() {
        let ewma = h.core.lock().ewma_state().expect("EWMAs");
        assert_eq!(ewma.epoch, 9, "replica {i}");
    }

    // A follower cut off writes no count: the leader waits for it until half an epoch
    // after the end, then imputes it.
    let leader = r.leader().unwrap();
    let cut = (leader + 1) % 3;
    r.store.set_faults(Faults {
        cut: BTreeSet::from([format!("r{cut}")]),
        ..Faults::default()
    });
    tokio::time::sleep_until(at(&r, 11.2)).await;
    let p = r.store.published().unwrap();
    assert_eq!(p.epoch, base + 9, "waiting for the missing count");
    tokio::time::sleep_until(at(&r, 11.55)).await;
    let p = r.store.published().unwrap();
    assert_eq!(p.epoch, base + 10, "summed half an epoch after the end");
}

#[tokio::test(start_paused = true)]
async fn a_vm_the_leader_gets_ready_between_rounds_reaches_the_followers_within_a_watch_period() {
    let r = Replicas::start(3);
    r.run(8, &[20, 20, 20]).await;
    let leader = r.leader().unwrap();
    let ready = |i: usize| r.hosts[i].core.lock().controller().pool().ready;
    let before = ready(leader);
    assert!((0..3).all(|i| ready(i) == before), "settled");
    // Mid-epoch, a VM of the leader gets ready (a launch finished booting).
    tokio::time::sleep_until(at(&r, 8.4)).await;
    {
        let h = &r.hosts[leader];
        let now = h.now();
        let mut c = h.core.lock();
        let vm = c.adopt_ready_vm(now);
        h.state
            .lock()
            .names
            .insert(vm, ("booted-late".into(), true));
    }
    assert_eq!(ready(leader), before + 1);
    // Two watch periods: the leader's one publishes it, the followers' one reads it;
    // the next epoch round is 0.4 s away.
    tokio::time::sleep(EPOCH / WATCHES_PER_EPOCH * 2 + Duration::from_millis(1)).await;
    for i in 0..3 {
        assert_eq!(ready(i), before + 1, "replica {i} before its next round");
    }
    let p = r.store.published().unwrap();
    assert!(p.registry.iter().any(|v| v.instance == "booted-late"));
    assert!(p.revision > 0, "a publication between rounds: {p:?}");
}

#[tokio::test(start_paused = true)]
async fn a_follower_never_takes_a_publication_older_than_the_last_it_took() {
    let r = Replicas::start(3);
    r.run(6, &[20, 20, 20]).await;
    let leader = r.leader().unwrap();
    let follower = (leader + 1) % 3;
    let newest = r.store.published().unwrap();
    let vm = |name: &str| RegistryVm {
        instance: name.into(),
        base: format!("http://{name}/"),
    };
    let newer = Published {
        revision: newest.revision + 10,
        registry: vec![vm("a"), vm("b")],
        ..newest.clone()
    };
    let older = Published {
        revision: newest.revision + 5,
        registry: vec![vm("a")],
        ..newest.clone()
    };
    let ready = || r.hosts[follower].core.lock().controller().pool().ready;
    r.coords[follower].follow_published(Some(&newer), 3);
    assert_eq!(ready(), 2);
    // A round's read that raced the watch's returns the older one: ignored.
    r.coords[follower].follow_published(Some(&older), 3);
    assert_eq!(ready(), 2, "the VM of the newer publication stays");
}
