//! Several gateway replicas, one decision: the driver-side coordinator
//! (`coordination: {type: redis}`). The policy core stays sans-IO; it only gets the pure
//! inputs of `policy::shared` (an aggregate epoch count, the leader's decision, a budget
//! share, the EWMA state, VM-table updates). This module moves them between replicas
//! through a [`Store`]:
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | the [`Coordinator`]: per replica an epoch round (one round trip per epoch) and a publication watch between rounds; roles, lease, shares, outages |
//! | `store.rs` | the [`Store`] trait, what is written and read, [`StoreError`] |
//! | `redis.rs` | [`redis::RedisStore`]: Lua scripts over the `redis` crate's reconnecting connection manager |
//! | `memory.rs` | [`memory::MemoryStore`]: the same semantics in memory, on tokio's clock, with injected faults (tests) |
//!
//! **Every replica**, at the end of each epoch (epochs are aligned on multiples of
//! `epoch_seconds` of the store's clock, see [`align`]): in one round trip
//! ([`Store::exchange`]) it writes its count for that epoch (an absolute value: a retry
//! writes the same), its latest count and a heartbeat, and reads the lease holder, the
//! leader's publication (decision, EWMAs, shares, VM registry), the live replicas and
//! every replica's count of the epoch before.
//!
//! **The leader** holds a lease with a term (the fencing token). Each epoch it renews
//! the lease and, as soon as every live replica has written its count of the epoch that
//! ended (it reads them again every [`SUM_POLLS_PER_EPOCH`]th of an epoch, half an epoch
//! after the end at the latest), sums the replicas' counts ([`aggregate`]: a replica
//! that missed it is imputed from its last count), hands the sum to its core (the
//! monitor closes that epoch, Algorithm 1 runs every K epochs), computes every replica's
//! budget share ([`budget_shares`] of each one's mean count over the last 4 epochs,
//! `SHARE_WINDOW_EPOCHS`) and publishes all of it, fenced: a publication or a
//! pool-write intent ([`PoolFence`]) with an old term is refused by the store, and a
//! refused leader steps down at once. Only the leader's core writes the pool
//! (`Core::set_pool_writer`); before every launch or terminate the driver records the
//! intent through [`PoolFence::permit`] (a launch's intent carries its client-token
//! stem, [`Host::launch_token`]; the launch is made with the intent's term), and once
//! the write was made or failed for good it settles it ([`PoolFence::settle`]).
//!
//! **A new leader** first replays the intents of earlier terms that are still open
//! ([`Store::open_intents`]: a leader stopped or lost the store between the intent and
//! its outcome; a launch's intent is settled once its VM is ready or given up, so a
//! launch still booting is open), through [`Host::replay`]: a launch is looked up by
//! its token and adopted, as a ready VM when running and healthy, as a booting VM the
//! new leader waits for otherwise, never launched twice; a launch the provider never
//! saw is dropped, not re-issued (the new leader's own decision launches if the pool
//! still needs a VM: fewer surprises than an old decision coming back); a terminate is
//! recorded again under the new term, then made again (idempotent). Each answered one
//! is settled; the replay takes at most one lease, and only then the new leader brings
//! the pool to the target (`Core::set_pool_writer`), counting what it adopted, so it
//! launches nothing beside an earlier leader's booting launch. A new leader that finds no
//! publication (a new cluster, or a store restarted empty, intents lost with it)
//! rebuilds the registry from the provider at once ([`Host::rebuild_pool`]). The lease
//! is asked above the highest term this replica saw and above the highest one in the
//! provider's client tokens ([`Host::provider_term`]).
//!
//! **Followers** take the decision (`Core::apply_decision`), their share
//! (`Core::set_budget_share`), the EWMAs (`Core::restore_ewma`) and the registry (the
//! leader's ready VMs, adopted as ready VMs of their own table).
//!
//! **Between rounds** a watch runs every [`WATCHES_PER_EPOCH`]th of an epoch: the leader
//! publishes again as soon as its ready VMs changed (the next `revision` of its last
//! publication), and each follower reads the publication ([`Store::publication`]) and
//! takes one newer than the last it took (`(term, epoch, revision)`). So a follower
//! has the leader's decision and a newly ready VM within a tenth of an epoch, where
//! before it waited for its next round (up to an epoch, spilling meanwhile what one
//! gateway would send to the new VM). Polling rather than Redis pub/sub: one small
//! `GET` per follower and period, on the same reconnecting connection and deadline as
//! every other operation, and no second connection to keep subscribed.
//!
//! **Store down or cut off**: the request path never waits on the store (it reads the
//! core under the driver's lock; the coordinator writes it between round trips, and
//! `/status` reads an `arc-swap` snapshot). Every operation has its own deadline. A
//! replica that misses exchanges keeps its last share for `grace_epochs`, then runs on
//! local decisions ([`Role::Local`]): share 1/N of the last known replica count, its
//! own counts × N as the traffic estimate, the pool frozen (no launch, no terminate).
//! Counts are buffered and sent when the store answers again.
//!
//! A new leader that finds EWMAs resumes them; one that finds none makes no scale-in for
//! K epochs (`Core::hold_scale_in`). The leader's monitor closes epoch `e` once every
//! count of it is in (a few round trips after its end; half an epoch when a replica's
//! count is late) and the followers take the decision within a watch period after,
//! so shared decisions lag a single gateway's by a few round trips (leader) to a
//! tenth of an epoch more (followers).

pub mod memory;
pub mod redis;
pub mod store;

use parking_lot::Mutex;
use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use serde::Serialize;
use tokio::sync::Notify;
use tokio::time::Instant;

pub use store::{
    CallAddress, Exchange, Intent, LeaderKey, Published, PublishedDecision, RegistryVm, Report,
    Store, StoreError,
};

use crate::backends::BoxFuture;
use crate::policy::core::Core;
use crate::policy::scaling::{ScaleDecision, ScaleReason};
use crate::policy::shared::{
    CountSource, EwmaState, ReplicaCount, SHARE_WINDOW_EPOCHS, ShareDemands, aggregate,
    budget_shares,
};
use crate::policy::{Time, VmId};

/// Counts kept for the store while it cannot be reached, at most (older ones are
/// dropped: the leader imputes them).
pub const MAX_BUFFERED_COUNTS: usize = 600;

/// The publication watch runs this many times per epoch (`Coordinator::watch`): a
/// follower takes a new decision or newly ready VMs within a tenth of an epoch (50 ms
/// at 0.5 s epochs), at one small read per follower and period.
pub const WATCHES_PER_EPOCH: u32 = 10;

/// The leader reads the replicas' counts of the epoch that ended this many times per
/// epoch until every live replica has written its count (at most until half an epoch
/// after its end).
pub const SUM_POLLS_PER_EPOCH: u32 = 20;

/// A replica's part in the shared decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Holds the lease: sums the counts, decides, writes the pool.
    Leader,
    /// Takes the leader's decision and its share.
    Follower,
    /// Cut off from the store past the grace epochs: local decisions, share 1/N, the
    /// pool frozen.
    Local,
}

impl Role {
    /// Label value: `leader`, `follower`, `local`.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Leader => "leader",
            Role::Follower => "follower",
            Role::Local => "local",
        }
    }

    /// Every role, for the metric's labels.
    pub const ALL: [Role; 3] = [Role::Leader, Role::Follower, Role::Local];
}

/// The coordinator's settings.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// This replica's id (unique among the replicas).
    pub replica: String,
    /// The epoch (`libra.epoch_seconds`).
    pub epoch: Duration,
    /// The leader's lease.
    pub lease: Duration,
    /// Deadline of each store operation.
    pub op_timeout: Duration,
    /// Epochs of missed exchanges before local decisions; a replica silent longer loses
    /// its share.
    pub grace_epochs: u32,
    /// K (`libra.decision_epochs`): a new leader without state holds scale-in this long.
    pub decision_epochs: u32,
    /// The global index of the epoch that starts at the replica's policy time zero.
    pub base_epoch: u64,
}

/// What `/status` shows under `coordination` (an `arc-swap` snapshot).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CoordStatus {
    /// `redis` or `memory`.
    pub store: &'static str,
    /// This replica's id.
    pub replica: String,
    /// Its role.
    pub role: Role,
    /// The leader's term (this replica's own when leader); `None` before any is known.
    pub term: Option<u64>,
    /// The leader's id.
    pub leader: Option<String>,
    /// This replica's budget share, 0–1.
    pub share: f64,
    /// Replicas counted live.
    pub replicas: u32,
    /// Global index of the last epoch this replica reported.
    pub epoch: Option<u64>,
    /// Exchanges missed in a row.
    pub missed_epochs: u32,
    /// Counts waiting for the store.
    pub buffered_counts: usize,
    /// The last store error, if any.
    pub last_store_error: Option<String>,
    /// Store operations that failed since start.
    pub store_errors_total: u64,
    /// Pool writes and publications of this replica the store refused (an old term).
    pub refused_writes_total: u64,
}

/// The replica the coordinator drives: its core, its VM table and addresses. The live
/// gateway (`proxy::driver::Gateway`) implements it; tests use a core of their own.
pub trait Host: Send + Sync + 'static {
    /// Run `f` on the core at the policy clock's now (under the driver's lock; the
    /// driver executes the actions it produced afterwards).
    fn with_core(&self, f: &mut dyn FnMut(&mut Core, Time));

    /// The policy clock now.
    fn now(&self) -> Time;

    /// The ready VMs of this replica's table with their addresses (what a leader
    /// publishes as the registry).
    fn registry(&self) -> Vec<RegistryVm>;

    /// Make the VMs of this replica's table that it did not launch exactly `vms`:
    /// adopt the new ones as ready, drain the ones no longer listed.
    fn sync_registry(&self, vms: &[RegistryVm]);

    /// The last scaling decision this replica's core took or applied: `(epoch, decision)`.
    fn last_decision(&self) -> Option<(u64, ScaleDecision)>;

    /// The client-token stem a launch of `vm` in leader term `term` carries (EC2:
    /// `crate::backends::ec2`), recorded in its intent; `None`: the pool has no tokens.
    fn launch_token(&self, vm: VmId, term: u64) -> Option<String> {
        let _ = (vm, term);
        None
    }

    /// This replica just became the leader and `intent` (of an earlier term) has no
    /// recorded outcome: a launch is looked up by its token and adopted (a ready VM
    /// when running and healthy, a booting VM counted toward the pool otherwise), never
    /// launched a second time; a terminate is made again (the
    /// coordinator has recorded it under the new term first). Default: the pool has
    /// nothing to look up ([`Replayed::Dropped`]).
    fn replay<'a>(&'a self, intent: &'a Intent) -> BoxFuture<'a, Replayed> {
        let _ = intent;
        Box::pin(async { Replayed::Dropped })
    }

    /// The highest leader term the pool's provider has seen in its instances' launch
    /// tokens (0: none). A lease is granted above it, so that a cluster whose store
    /// and replicas all restarted never reuses a term (and so a client token).
    fn provider_term(&self) -> u64 {
        0
    }

    /// This replica just became the leader and the store had no publication (a new
    /// cluster, or a store restarted empty): list the pool now and adopt its running,
    /// healthy instances that no VM of this replica stands for (EC2: by tags; the
    /// client tokens name each one's term and VM), rather than at the next pool audit.
    /// Default: nothing.
    fn rebuild_pool(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

/// Where a call id's owner is found (asynchronous calls across replicas): the
/// coordinator's directory of live replicas, read without waiting on the store.
pub trait CallDirectory: Send + Sync + 'static {
    /// The base URL of the live replica whose call ids carry `tag`; `None` when no live
    /// replica has written it (the owner is down, or has not reported yet).
    fn call_owner(&self, tag: u32) -> Option<String>;
}

/// What the driver asks before every pool write (launch, terminate), and tells after.
pub trait PoolFence: Send + Sync + 'static {
    /// Record the intent of `op` (`launch` or `terminate`) on `vm` in the store, fenced
    /// by this replica's term (a launch's intent carries its client-token stem,
    /// [`Host::launch_token`]); `None`: do not make the write (not the leader, the
    /// store refused an old term, or it cannot be reached).
    fn permit<'a>(
        &'a self,
        op: &'static str,
        vm: VmId,
        instance: Option<&'a str>,
    ) -> BoxFuture<'a, Option<Permit>>;

    /// The write `permit` allowed was made (or failed for good): its intent is settled,
    /// no later leader replays it. A store that does not answer leaves it open.
    fn settle<'a>(&'a self, permit: &'a Permit) -> BoxFuture<'a, ()>;
}

/// A pool write the fence allowed: the intent recorded for it.
#[derive(Clone, Debug, PartialEq)]
pub struct Permit {
    /// The recorded intent (its term is the write's: a launch's client token carries it).
    pub intent: Intent,
}

impl Permit {
    /// The leader term the write is fenced by.
    pub fn term(&self) -> u64 {
        self.intent.term
    }
}

/// What a new leader's host did with an open intent of an earlier term
/// ([`Host::replay`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Replayed {
    /// The launch's instance (found by its client token) is running and healthy: it is
    /// a ready VM of the new leader now (or already was).
    Adopted(String),
    /// The launch's instance exists but is not ready yet: it is a booting VM of the new
    /// leader now (counted toward the pool, so nothing is launched beside it), ready
    /// once its health probe answers, given up and terminated at its boot deadline.
    Booting(String),
    /// The provider never saw the launch: it is dropped, not re-issued (the new
    /// leader's own decision launches if the pool still needs a VM).
    Dropped,
    /// The terminate was made again (idempotent) on this instance.
    Terminated(String),
    /// The provider could not be asked; the intent stays open for a later leader.
    Failed(String),
}

#[derive(Debug)]
struct Inner {
    role: Role,
    /// The lease, while this replica is the leader.
    key: Option<LeaderKey>,
    /// The highest term seen.
    max_term: u64,
    leader: Option<String>,
    pending: VecDeque<(u64, u64)>,
    misses: u32,
    share: f64,
    replicas: u32,
    /// The last decision applied from a publication: (term, epoch).
    applied: Option<(u64, u64)>,
    /// The last publication taken: `(term, epoch, revision)`; an older one is ignored
    /// (the epoch round and the publication watch read concurrently).
    followed: Option<(u64, u64, u64)>,
    epoch: Option<u64>,
    last_error: Option<String>,
    errors: u64,
    refused: u64,
}

/// One replica's coordinator. See the [module docs](self).
pub struct Coordinator {
    settings: Settings,
    store: Arc<dyn Store>,
    host: Arc<dyn Host>,
    inner: Mutex<Inner>,
    status: ArcSwap<CoordStatus>,
    stop: Notify,
    /// Stops the publication watch ([`Self::watch`]).
    stop_watch: Notify,
    /// Held by each epoch round ([`Self::tick`]); a follower's publication watch takes a
    /// publication only while no round runs (a round may change the role).
    round: tokio::sync::Mutex<()>,
    /// The leader's last publication of its term, held while it publishes: the
    /// per-epoch publication and the watch's registry updates go out one at a time, in
    /// revision order.
    publishing: tokio::sync::Mutex<Option<Published>>,
    /// This replica's asynchronous-call address, written with every heartbeat.
    address: Mutex<Option<CallAddress>>,
    /// The live replicas' call addresses: owner tag → base URL (as of the last
    /// exchange that answered).
    directory: ArcSwap<BTreeMap<u32, String>>,
    /// The leader's window of the replicas' counts for their budget shares.
    share_demands: Mutex<ShareDemands>,
}

/// Where policy time zero lies on the store's clock: `(origin, base_epoch)` — the
/// instant that is a multiple of `epoch` on the store's clock (TIME, ms since the Unix
/// epoch, read once; the round trip's midpoint is taken as its moment) and that
/// multiple's index. Without an answer within `deadline` the host's wall clock stands
/// in (replicas on synchronised clocks still agree within the clock skew).
pub async fn align(store: &dyn Store, epoch: Duration, deadline: Duration) -> (Instant, u64) {
    let t0 = Instant::now();
    let read = tokio::time::timeout(deadline, store.time_ms()).await;
    let t1 = Instant::now();
    let (ms, at) = match read {
        Ok(Ok(ms)) => (ms, t0 + (t1 - t0) / 2),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "cannot read the store's clock; aligning epochs on this host's clock");
            (wall_clock_ms(), t1)
        }
        Err(_) => {
            tracing::warn!(
                ?deadline,
                "the store's clock did not answer; aligning epochs on this host's clock"
            );
            (wall_clock_ms(), t1)
        }
    };
    split(ms, epoch, at)
}

/// `(origin, index)` of the epoch boundary at or before `ms` (ms since the Unix
/// epoch), `at` being the instant `ms` was read.
fn split(ms: u64, epoch: Duration, at: Instant) -> (Instant, u64) {
    let ns = u128::from(ms) * 1_000_000;
    let e = epoch.as_nanos().max(1);
    let index = ns / e;
    let into = Duration::from_nanos((ns - index * e) as u64);
    let origin = at.checked_sub(into).unwrap_or(at);
    (origin, index as u64)
}

/// This replica's id: the host name (a Kubernetes pod's name) and the process id, so
/// that replicas on one host differ and a restarted one is a new replica.
pub fn default_replica_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "spillway".into());
    format!("{host}-{}", std::process::id())
}

#[allow(clippy::disallowed_methods)] // The fallback really is the host's wall clock.
fn wall_clock_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn reason_named(name: &str) -> ScaleReason {
    [
        ScaleReason::BelowCostIndifferencePoint,
        ScaleReason::Provision,
        ScaleReason::ClampedToMin,
        ScaleReason::ClampedToMax,
        ScaleReason::Baseline,
        ScaleReason::AwaitingTraffic,
    ]
    .into_iter()
    .find(|r| r.as_str() == name)
    .unwrap_or(ScaleReason::Provision)
}

impl Coordinator {
    /// A coordinator for `host` over `store`; it puts the host's core under shared
    /// inputs at once (aggregate counts, not the pool writer), so that the host's own
    /// start launches nothing. Call [`Self::start`] once the host has started (its
    /// provider has listed the pool: [`Host::provider_term`] knows the terms of the
    /// pool's client tokens).
    pub fn new(settings: Settings, store: Arc<dyn Store>, host: Arc<dyn Host>) -> Arc<Self> {
        host.with_core(&mut |core, now| {
            core.set_count_source(now, CountSource::Aggregate);
            core.set_pool_writer(now, false);
        });
        let inner = Inner {
            role: Role::Follower,
            key: None,
            max_term: 0,
            leader: None,
            pending: VecDeque::new(),
            misses: 0,
            share: 1.0,
            replicas: 1,
            applied: None,
            followed: None,
            epoch: None,
            last_error: None,
            errors: 0,
            refused: 0,
        };
        let status = ArcSwap::from_pointee(Self::snapshot(&settings, store.kind(), &inner));
        Arc::new(Self {
            settings,
            store,
            host,
            inner: Mutex::new(inner),
            status,
            stop: Notify::new(),
            stop_watch: Notify::new(),
            round: tokio::sync::Mutex::new(()),
            publishing: tokio::sync::Mutex::new(None),
            address: Mutex::new(None),
            directory: ArcSwap::from_pointee(BTreeMap::new()),
            share_demands: Mutex::new(ShareDemands::new(SHARE_WINDOW_EPOCHS)),
        })
    }

    /// Write `address` with every heartbeat from now on: other replicas then forward
    /// lookups of call ids carrying its tag to its URL.
    pub fn advertise(&self, address: CallAddress) {
        *self.address.lock() = Some(address);
    }

    /// What [`Self::advertise`] set, if anything.
    pub fn call_address(&self) -> Option<CallAddress> {
        self.address.lock().clone()
    }

    /// The owner tags of live replicas this replica can forward lookups to (its own
    /// included once it has reported).
    pub fn call_owners(&self) -> usize {
        self.directory.load().len()
    }

    /// The live replicas' call addresses of `x`: owner tag → URL (the latest
    /// heartbeat wins when a restarted replica's old id is still live).
    fn directory_of(x: &Exchange) -> BTreeMap<u32, String> {
        let mut newest: BTreeMap<u32, (u64, String)> = BTreeMap::new();
        for (replica, a) in &x.addresses {
            let Some(&seen) = x.live.get(replica) else {
                continue;
            };
            let e = newest.entry(a.tag).or_insert((seen, a.url.clone()));
            if seen > e.0 {
                *e = (seen, a.url.clone());
            }
        }
        newest.into_iter().map(|(t, (_, url))| (t, url)).collect()
    }

    /// Start the per-epoch task and the publication watch. The first lease is asked
    /// above [`Host::provider_term`], so the host's provider must have listed its pool
    /// by now: a replica that leads before that could take a term the pool's client
    /// tokens already carry (Redis and every replica restarted) and send a token again.
    pub fn start(self: &Arc<Self>) {
        let me = Arc::clone(self);
        tokio::spawn(async move { me.run().await });
        let me = Arc::clone(self);
        tokio::spawn(async move { me.watch().await });
    }

    /// How long the leader keeps a scaled-in VM running after it left the registry:
    /// two epochs and one store deadline. Followers route to a registry VM until they
    /// read the publication without it (the watch: a tenth of an epoch; their next
    /// round when the watch's reads fail: at most one epoch and a deadline after it);
    /// the second epoch lets their requests on it finish. Stopping it at once would
    /// fail the followers' requests still sent to it.
    pub fn scale_in_handoff(&self) -> Duration {
        self.settings.epoch * 2 + self.settings.op_timeout
    }

    /// The latest snapshot for `/status`.
    pub fn status(&self) -> Arc<CoordStatus> {
        self.status.load_full()
    }

    /// Stop the task and give the lease up (a graceful shutdown: the next leader takes
    /// over within one epoch instead of a lease).
    pub async fn shutdown(&self) {
        self.stop.notify_one();
        self.stop_watch.notify_one();
        let key = {
            let mut i = self.lock();
            i.role = Role::Follower;
            i.key.take()
        };
        self.host
            .with_core(&mut |core, now| core.set_pool_writer(now, false));
        if let Some(key) = key {
            match self.op("release", self.store.release(&key)).await {
                Ok(true) => tracing::info!(term = key.term, "leader lease released"),
                Ok(false) => {}
                Err(e) => tracing::warn!(error = %e, "cannot release the leader lease"),
            }
        }
        self.refresh();
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, Inner> {
        self.inner.lock()
    }

    fn snapshot(settings: &Settings, store: &'static str, i: &Inner) -> CoordStatus {
        CoordStatus {
            store,
            replica: settings.replica.clone(),
            role: i.role,
            term: i
                .key
                .as_ref()
                .map(|k| k.term)
                .or((i.max_term > 0).then_some(i.max_term)),
            leader: i.leader.clone(),
            share: i.share,
            replicas: i.replicas,
            epoch: i.epoch,
            missed_epochs: i.misses,
            buffered_counts: i.pending.len(),
            last_store_error: i.last_error.clone(),
            store_errors_total: i.errors,
            refused_writes_total: i.refused,
        }
    }

    fn refresh(&self) {
        let s = {
            let i = self.lock();
            Self::snapshot(&self.settings, self.store.kind(), &i)
        };
        crate::telemetry::coordination(s.role.as_str(), s.term.unwrap_or(0), s.share, s.replicas);
        self.status.store(Arc::new(s));
    }

    /// One store operation under its deadline, timed for the latency metric; failures
    /// are counted and kept as the last store error.
    async fn op<T>(
        &self,
        name: &'static str,
        fut: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let t0 = Instant::now();
        let r = match tokio::time::timeout(self.settings.op_timeout, fut).await {
            Ok(r) => r,
            Err(_) => Err(StoreError::Timeout {
                op: name,
                after: self.settings.op_timeout,
            }),
        };
        crate::telemetry::coordination_store_op(
            name,
            t0.elapsed(),
            r.as_ref().err().map(StoreError::kind),
        );
        if let Err(e) = &r {
            let mut i = self.lock();
            i.errors += 1;
            i.last_error = Some(e.to_string());
        }
        r
    }

    async fn run(self: Arc<Self>) {
        let e = self.settings.epoch;
        // Act a little after each epoch's end, so that the local epoch has closed.
        let margin = (e / 50).min(Duration::from_millis(20));
        loop {
            let now = self.host.now();
            let ended = (now.as_nanos() / e.as_nanos().max(1)) as u64;
            let next = e.saturating_mul(u32::try_from(ended + 1).unwrap_or(u32::MAX)) + margin;
            let sleep = tokio::time::sleep(next.saturating_sub(now));
            tokio::select! {
                () = sleep => {}
                () = self.stop.notified() => return,
            }
            self.tick().await;
        }
    }

    /// One epoch's round: report, then lead, follow or run locally.
    pub async fn tick(&self) {
        let _round = self.round.lock().await;
        let base = self.settings.base_epoch;
        let mut fresh = Vec::new();
        let mut open = 0;
        self.host.with_core(&mut |core, now| {
            core.handle_timeout(now);
            while let Some(c) = core.poll_epoch_count() {
                fresh.push((base + c.epoch, c.requests));
            }
            open = base + core.controller().open_epoch().epoch;
        });
        let ended = open.saturating_sub(1);
        let report = {
            let mut i = self.lock();
            i.pending.extend(fresh.iter().copied());
            while i.pending.len() > MAX_BUFFERED_COUNTS {
                i.pending.pop_front();
            }
            i.epoch = Some(ended);
            Report {
                replica: self.settings.replica.clone(),
                counts: i.pending.iter().copied().collect(),
                sum_epoch: ended.saturating_sub(1),
                live_window: self.settings.epoch * (self.settings.grace_epochs + 1),
                counts_ttl: self.settings.epoch * 100,
                address: self.address.lock().clone(),
            }
        };
        match self.op("exchange", self.store.exchange(&report)).await {
            Ok(x) => {
                {
                    let mut i = self.lock();
                    i.pending.clear();
                    if i.role == Role::Local {
                        tracing::info!("store reachable again; back to shared decisions");
                        i.role = Role::Follower;
                        // Take the publication again even if it did not change: the
                        // local decisions replaced its share and EWMAs.
                        i.followed = None;
                    }
                    i.misses = 0;
                    let seen = [
                        x.term,
                        x.leader.as_ref().map_or(0, |k| k.term),
                        x.state.as_ref().map_or(0, |s| s.term),
                    ];
                    i.max_term = seen.into_iter().fold(i.max_term, u64::max);
                    i.leader = x.leader.as_ref().map(|k| k.replica.clone());
                    i.replicas = u32::try_from(x.live.len()).unwrap_or(u32::MAX).max(1);
                }
                self.directory.store(Arc::new(Self::directory_of(&x)));
                self.on_exchange(ended, x).await;
            }
            Err(e) => self.on_store_down(&e, &fresh),
        }
        self.refresh();
    }

    async fn on_exchange(&self, ended: u64, x: Exchange) {
        let key = self.lock().key.clone();
        match (&key, &x.leader) {
            (Some(mine), Some(holder)) if mine == holder => {
                match self
                    .op("renew", self.store.renew(mine, self.settings.lease))
                    .await
                {
                    Ok(true) => self.sum_and_lead(mine, ended).await,
                    Ok(false) => self.step_down("the lease was lost"),
                    Err(_) => self.freeze(),
                }
            }
            _ => {
                if key.is_some() {
                    self.step_down("another replica holds the lease, or it expired");
                }
                if x.leader.is_none() {
                    let floor = self.lock().max_term.max(self.host.provider_term());
                    let got = self
                        .op(
                            "acquire",
                            self.store
                                .acquire(&self.settings.replica, self.settings.lease, floor),
                        )
                        .await;
                    if let Ok(Some(term)) = got {
                        let mine = LeaderKey {
                            replica: self.settings.replica.clone(),
                            term,
                        };
                        self.take_over(&mine, &x);
                        self.replay_open_intents(&mine).await;
                        // Only now the pool is brought to the target: an earlier
                        // leader's launch still booting, adopted by the replay, counts.
                        if self.lock().key.as_ref() == Some(&mine) {
                            self.host
                                .with_core(&mut |core, now| core.set_pool_writer(now, true));
                        }
                        if x.state.is_none() {
                            let lease = self.settings.lease;
                            if tokio::time::timeout(lease, self.host.rebuild_pool())
                                .await
                                .is_err()
                            {
                                tracing::warn!(
                                    ?lease,
                                    "rebuilding the pool registry from the provider took longer than a lease; the pool audit finishes it"
                                );
                            }
                        }
                        if self.lock().key.as_ref() == Some(&mine) {
                            self.sum_and_lead(&mine, ended).await;
                        }
                        return;
                    }
                }
                self.follow(&x);
            }
        }
    }

    /// The lease was granted with `key`: resume the published state, adopt the
    /// registry. The caller turns pool writing on once the earlier terms' open intents
    /// are replayed ([`Self::replay_open_intents`]).
    fn take_over(&self, key: &LeaderKey, x: &Exchange) {
        {
            let mut i = self.lock();
            i.role = Role::Leader;
            i.key = Some(key.clone());
            i.max_term = i.max_term.max(key.term);
            i.leader = Some(key.replica.clone());
        }
        let base = self.settings.base_epoch;
        let state = x.state.as_ref();
        let ewma = state
            .and_then(|s| s.ewma)
            .filter(|e| e.epoch >= base)
            .map(|e| EwmaState {
                epoch: e.epoch - base,
                ..e
            });
        if let Some(s) = state {
            self.host.sync_registry(&s.registry);
        }
        let decision = state.and_then(|s| s.decision.clone());
        let hold = u64::from(self.settings.decision_epochs);
        self.host.with_core(&mut |core, now| {
            match &ewma {
                Some(e) => core.restore_ewma(e),
                None => core.hold_scale_in(hold),
            }
            if let Some(d) = &decision {
                core.apply_decision(now, d.epoch.saturating_sub(base), to_decision(d));
            }
        });
        tracing::info!(
            term = key.term,
            resumed = ewma.is_some(),
            avg_rps = ewma.map(|e| e.avg_per_epoch / self.settings.epoch.as_secs_f64()),
            "became the scaling leader"
        );
        self.refresh();
    }

    /// The new leader `key` replays the open intents of earlier terms (writes whose
    /// outcome no leader recorded) before it leads: launches are looked up by their
    /// client token and adopted, never launched twice; terminates are recorded under
    /// `key`'s term and made again. Each one answered is settled; one the provider
    /// could not answer stays open for a later leader. Bounded by one lease.
    async fn replay_open_intents(&self, key: &LeaderKey) {
        let Ok(open) = self.op("open_intents", self.store.open_intents()).await else {
            return;
        };
        let old: Vec<Intent> = open.into_iter().filter(|i| i.term < key.term).collect();
        if old.is_empty() {
            return;
        }
        let replay = async {
            for intent in &old {
                let again = (intent.op == "terminate").then(|| Intent {
                    term: key.term,
                    token: None,
                    ..intent.clone()
                });
                if let Some(again) = &again {
                    match self.op("intent", self.store.intent(key, again)).await {
                        Ok(true) => {}
                        Ok(false) => {
                            self.lock().refused += 1;
                            self.step_down("the store refused a pool write (an old term)");
                            return;
                        }
                        Err(_) => return,
                    }
                }
                let done = self.host.replay(intent).await;
                tracing::info!(term = intent.term, op = %intent.op, vm = %intent.vm, token = intent.token.as_deref().unwrap_or("-"), outcome = ?done, "replayed an earlier leader's pool write");
                if matches!(done, Replayed::Failed(_)) {
                    continue;
                }
                for settled in std::iter::once(intent).chain(again.as_ref()) {
                    let _ = self.op("settle", self.store.settle(settled)).await;
                }
            }
        };
        if tokio::time::timeout(self.settings.lease, replay)
            .await
            .is_err()
        {
            tracing::warn!(lease = ?self.settings.lease, "replaying earlier leaders' pool writes took longer than a lease; the rest stays open");
        }
    }

    fn step_down(&self, why: &'static str) {
        let term = {
            let mut i = self.lock();
            i.role = Role::Follower;
            i.key.take().map(|k| k.term)
        };
        self.host
            .with_core(&mut |core, now| core.set_pool_writer(now, false));
        if let Some(term) = term {
            tracing::warn!(term, "stepping down as the scaling leader: {why}");
        }
    }

    /// The store did not answer the leader: stop writing the pool until it does.
    fn freeze(&self) {
        self.host
            .with_core(&mut |core, now| core.set_pool_writer(now, false));
    }

    /// The leader, once every live replica has written its count of `ended` (read
    /// again every [`SUM_POLLS_PER_EPOCH`]th of an epoch from now on; half an epoch
    /// after `ended` ended at the latest, when a missing count is imputed): lead on
    /// their sum. The replicas write their counts just after the epoch's end, so the
    /// decision usually follows one gateway's by a few store round trips.
    async fn sum_and_lead(&self, key: &LeaderKey, ended: u64) {
        let latest = self.half_epoch_after(ended);
        let poll = self.settings.epoch / SUM_POLLS_PER_EPOCH;
        loop {
            let report = self.read_report(ended, None);
            let x = match self.op("exchange", self.store.exchange(&report)).await {
                Ok(x) if x.leader.as_ref() == Some(key) => x,
                Ok(_) => return self.step_down("the lease moved before the sum was read"),
                Err(_) => return self.freeze(),
            };
            let now = self.host.now();
            if now >= latest || x.live.keys().all(|r| x.counts.contains_key(r)) {
                return self.lead(key, ended, &x).await;
            }
            tokio::time::sleep(poll.min(latest.saturating_sub(now))).await;
        }
    }

    /// Half an epoch after epoch `ended` (store index) ended, on the policy clock: when
    /// the leader sums it (every replica has written its count by then).
    fn half_epoch_after(&self, ended: u64) -> Duration {
        let e = self.settings.epoch;
        let local_end = (ended + 1).saturating_sub(self.settings.base_epoch);
        e.saturating_mul(u32::try_from(local_end).unwrap_or(u32::MAX)) + e / 2
    }

    /// A report that writes no count: it reads `ended`'s counts and the publication
    /// (and renews the heartbeat, with `address` when given).
    fn read_report(&self, ended: u64, address: Option<CallAddress>) -> Report {
        let e = self.settings.epoch;
        Report {
            replica: self.settings.replica.clone(),
            counts: Vec::new(),
            sum_epoch: ended,
            live_window: e * (self.settings.grace_epochs + 1),
            counts_ttl: e * 100,
            address,
        }
    }

    async fn lead(&self, key: &LeaderKey, sum_epoch: u64, x: &Exchange) {
        let base = self.settings.base_epoch;
        let mut names: Vec<&String> = x.live.keys().chain(x.counts.keys()).collect();
        names.sort();
        names.dedup();
        let rows: Vec<ReplicaCount> = names
            .iter()
            .map(|r| ReplicaCount {
                count: x.counts.get(*r).copied(),
                last: x.last.get(*r).copied(),
            })
            .collect();
        let total = aggregate(sum_epoch, &rows, 1);
        // Demands for the shares: every live replica's count (or its last one).
        // Each one's mean over the last few epochs (`ShareDemands`): one epoch's count
        // alone moves a small replica's share against its jitter.
        let live: Vec<&String> = x.live.keys().collect();
        let counts: Vec<(String, u64)> = live
            .iter()
            .map(|r| {
                let n = x
                    .counts
                    .get(*r)
                    .copied()
                    .or_else(|| x.last.get(*r).map(|&(_, n)| n))
                    .unwrap_or(0);
                ((*r).clone(), n)
            })
            .collect();
        let demands = self.share_demands.lock().demands(sum_epoch, &counts);
        let mut published = None;
        let me = &self.settings.replica;
        self.host.with_core(&mut |core, now| {
            core.set_pool_writer(now, true);
            if sum_epoch >= base {
                core.on_aggregate_count(now, sum_epoch - base, total.requests);
            }
            let budget = core.shared_vm_budget();
            let shares: BTreeMap<String, f64> = live
                .iter()
                .map(|r| (*r).clone())
                .zip(budget_shares(budget, &demands))
                .collect();
            let own = shares.get(me).copied().unwrap_or(1.0);
            core.set_budget_share(now, own);
            published = Some((
                core.ewma_state().map(|e| EwmaState {
                    epoch: e.epoch + base,
                    ..e
                }),
                shares,
                own,
            ));
        });
        let Some((ewma, shares, own)) = published else {
            return;
        };
        let decision = self
            .host
            .last_decision()
            .map(|(epoch, d)| PublishedDecision {
                epoch: epoch + base,
                target_vms: d.target_vms,
                vm_reqs_rps: d.vm_reqs_rps.is_finite().then_some(d.vm_reqs_rps),
                reason: d.reason.as_str().to_string(),
            });
        {
            let mut i = self.lock();
            i.share = own;
        }
        let mut last = self.publishing.lock().await;
        let p = Published {
            term: key.term,
            leader: key.replica.clone(),
            epoch: sum_epoch,
            ewma,
            decision,
            replicas: u32::try_from(live.len()).unwrap_or(u32::MAX),
            shares,
            registry: sorted(self.host.registry()),
            revision: next_revision(last.as_ref(), key.term),
        };
        if self.publish_fenced(key, p, &mut last).await.is_err() {
            drop(last);
            self.freeze();
        }
    }

    /// Publish `p` as the leader `key`, fenced by its term, and keep it in `last` (the
    /// last publication, behind `publishing`) once the store took it. A store that
    /// refuses it (an old term) counts a refused write and steps this replica down
    /// (`Ok` too: the store answered). `Err`: the store did not answer; what to do is
    /// the caller's (the epoch round stops writing the pool, the watch leaves it to the
    /// next round).
    async fn publish_fenced(
        &self,
        key: &LeaderKey,
        p: Published,
        last: &mut Option<Published>,
    ) -> Result<(), StoreError> {
        if self.op("publish", self.store.publish(key, &p)).await? {
            *last = Some(p);
        } else {
            self.lock().refused += 1;
            self.step_down("the store refused the publication (an old term)");
        }
        Ok(())
    }

    /// Between epoch rounds, every [`WATCHES_PER_EPOCH`]th of an epoch: the leader
    /// publishes its ready VMs again as soon as they changed (a launched VM got ready,
    /// one was scaled in), and a follower reads the publication and takes a newer one at
    /// once. Without it a follower learns of a new leader decision or a newly ready VM
    /// only at its next epoch round, and for up to an epoch it spills what one gateway
    /// would send to the new VM. Nothing here runs while the epoch rounds miss the store
    /// (the round handles the outage) or on local decisions.
    async fn watch(self: Arc<Self>) {
        let mut every = tokio::time::interval(self.settings.epoch / WATCHES_PER_EPOCH);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = every.tick() => {}
                () = self.stop_watch.notified() => return,
            }
            let (role, misses, key, led) = {
                let i = self.lock();
                (i.role, i.misses, i.key.clone(), i.leader.is_some())
            };
            if misses > 0 {
                continue;
            }
            match (role, key) {
                (Role::Leader, Some(key)) => self.publish_registry(&key).await,
                (Role::Follower, None) if led => self.take_publication().await,
                _ => {}
            }
        }
    }

    /// The leader `key`: publish its last publication again with its ready VMs now,
    /// if they changed since (the next revision).
    async fn publish_registry(&self, key: &LeaderKey) {
        let mut last = self.publishing.lock().await;
        let registry = sorted(self.host.registry());
        let Some(p) = last
            .as_ref()
            .filter(|p| p.term == key.term && p.registry != registry)
            .map(|p| Published {
                registry,
                revision: p.revision + 1,
                ..p.clone()
            })
        else {
            return;
        };
        // The status shows a step-down at once; a store that does not answer is the next
        // epoch round's to find out.
        if self.publish_fenced(key, p, &mut last).await.is_ok() {
            self.refresh();
        }
    }

    /// A follower between its epoch rounds: read the publication and take it when it
    /// is newer than the last one taken. Skipped while a round runs (it may change the
    /// role and takes the publication itself).
    async fn take_publication(&self) {
        let Ok(_round) = self.round.try_lock() else {
            return;
        };
        let read = self.store.publication(&self.settings.replica);
        let Ok(Some(p)) = self.op("publication", read).await else {
            return;
        };
        let (role, key, replicas) = {
            let i = self.lock();
            (i.role, i.key.clone(), i.replicas)
        };
        if role == Role::Follower && key.is_none() {
            self.follow_published(Some(&p), replicas as usize);
            self.refresh();
        }
    }

    fn follow(&self, x: &Exchange) {
        self.follow_published(x.state.as_ref(), x.live.len());
    }

    /// Take the leader's publication `p` (`live` replicas counted live), unless it is
    /// not newer than the last one taken.
    fn follow_published(&self, p: Option<&Published>, live: usize) {
        let base = self.settings.base_epoch;
        let me = &self.settings.replica;
        {
            let mut i = self.lock();
            i.role = Role::Follower;
        }
        let Some(p) = p else {
            self.host
                .with_core(&mut |core, now| core.set_pool_writer(now, false));
            return;
        };
        let fresh = {
            let mut i = self.lock();
            let order = (p.term, p.epoch, p.revision);
            if i.followed.is_some_and(|taken| taken >= order) {
                return;
            }
            i.followed = Some(order);
            p.decision
                .as_ref()
                .map(|d| (p.term, d.epoch))
                .filter(|k| i.applied != Some(*k))
        };
        let replicas = live.max(1);
        let share = p.shares.get(me).copied().unwrap_or(1.0 / replicas as f64);
        let ewma = p.ewma.filter(|e| e.epoch >= base).map(|e| EwmaState {
            epoch: e.epoch - base,
            ..e
        });
        self.host.sync_registry(&p.registry);
        self.host.with_core(&mut |core, now| {
            core.set_pool_writer(now, false);
            if let Some(e) = &ewma {
                core.restore_ewma(e);
            }
            if let (Some(_), Some(d)) = (fresh, &p.decision) {
                core.apply_decision(now, d.epoch.saturating_sub(base), to_decision(d));
            }
            core.set_budget_share(now, share);
        });
        let mut i = self.lock();
        if fresh.is_some() {
            i.applied = fresh;
        }
        i.share = share;
    }

    /// An exchange failed: keep the last share for the grace epochs, then local
    /// decisions with share 1/N on this replica's counts × N; the pool stays frozen.
    fn on_store_down(&self, e: &StoreError, fresh: &[(u64, u64)]) {
        let (misses, was_leader, n) = {
            let mut i = self.lock();
            i.misses += 1;
            let was = i.role == Role::Leader;
            (i.misses, was, i.replicas.max(1))
        };
        if misses == 1 {
            tracing::warn!(error = %e, "the coordination store did not answer; the pool is frozen");
        }
        if was_leader {
            self.freeze();
        }
        if misses <= self.settings.grace_epochs {
            return;
        }
        let share = 1.0 / f64::from(n);
        let went_local = {
            let mut i = self.lock();
            let went = i.role != Role::Local;
            i.role = Role::Local;
            i.key = None;
            i.share = share;
            went
        };
        if went_local {
            tracing::warn!(
                replicas = n,
                "no coordination store for {misses} epochs: running on local decisions with share 1/{n}"
            );
        }
        let base = self.settings.base_epoch;
        self.host.with_core(&mut |core, now| {
            core.set_pool_writer(now, false);
            core.set_budget_share(now, share);
            for &(epoch, requests) in fresh {
                if epoch >= base {
                    core.on_aggregate_count(now, epoch - base, requests * u64::from(n));
                }
            }
        });
    }
}

/// The registry in instance order (the host lists its table's order): equal sets
/// compare equal.
fn sorted(mut registry: Vec<RegistryVm>) -> Vec<RegistryVm> {
    registry.sort();
    registry
}

/// The revision of a leader's next publication in `term` after `last`.
fn next_revision(last: Option<&Published>, term: u64) -> u64 {
    last.filter(|p| p.term == term)
        .map_or(0, |p| p.revision + 1)
}

fn to_decision(d: &PublishedDecision) -> ScaleDecision {
    ScaleDecision {
        target_vms: d.target_vms,
        vm_reqs_rps: d.vm_reqs_rps.unwrap_or(f64::INFINITY),
        reason: reason_named(&d.reason),
    }
}

impl CallDirectory for Coordinator {
    fn call_owner(&self, tag: u32) -> Option<String> {
        self.directory.load().get(&tag).cloned()
    }
}

impl PoolFence for Coordinator {
    fn permit<'a>(
        &'a self,
        op: &'static str,
        vm: VmId,
        instance: Option<&'a str>,
    ) -> BoxFuture<'a, Option<Permit>> {
        Box::pin(async move {
            let key = {
                let i = self.lock();
                match (&i.key, i.role) {
                    (Some(k), Role::Leader) => k.clone(),
                    _ => return None,
                }
            };
            let intent = Intent {
                term: key.term,
                op: op.to_string(),
                vm: vm.to_string(),
                instance: instance.map(str::to_string),
                token: (op == "launch")
                    .then(|| self.host.launch_token(vm, key.term))
                    .flatten(),
            };
            match self.op("intent", self.store.intent(&key, &intent)).await {
                Ok(true) => Some(Permit { intent }),
                Ok(false) => {
                    self.lock().refused += 1;
                    self.step_down("the store refused a pool write (an old term)");
                    self.refresh();
                    None
                }
                Err(_) => None,
            }
        })
    }

    fn settle<'a>(&'a self, permit: &'a Permit) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let _ = self.op("settle", self.store.settle(&permit.intent)).await;
        })
    }
}

#[cfg(test)]
mod tests;
