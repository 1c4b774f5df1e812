//! The shared store the replicas coordinate through: the [`Store`] trait, what goes in
//! and out of it, and its errors. Two implementations: [`super::redis::RedisStore`] (the
//! real one) and [`super::memory::MemoryStore`] (tests under paused tokio time).
//!
//! Every operation is one round trip. The coordinator puts its own deadline around each
//! one (`tokio::time::timeout`, `coordination.op_timeout_ms`), so a store that hangs
//! costs at most that per operation.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::backends::BoxFuture;
use crate::policy::shared::EwmaState;

/// The lease holder: a replica and the term it was granted (the fencing token: terms only
/// grow).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaderKey {
    /// The replica's id.
    pub replica: String,
    /// Its term.
    pub term: u64,
}

impl LeaderKey {
    /// The value of the lease key: `replica:term`.
    pub fn value(&self) -> String {
        format!("{}:{}", self.replica, self.term)
    }

    /// Read a lease value `replica:term` (the replica id may contain `:`).
    pub fn parse(value: &str) -> Option<Self> {
        let (replica, term) = value.rsplit_once(':')?;
        Some(LeaderKey {
            replica: replica.to_string(),
            term: term.parse().ok()?,
        })
    }
}

/// What a replica writes once per epoch ([`Store::exchange`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    /// The replica's id.
    pub replica: String,
    /// Its counts per epoch (global epoch index, absolute values: writing one twice
    /// changes nothing), oldest first; buffered ones after an outage too.
    pub counts: Vec<(u64, u64)>,
    /// The epoch whose counts the reply carries ([`Exchange::counts`]).
    pub sum_epoch: u64,
    /// How long a heartbeat counts the replica as live.
    pub live_window: Duration,
    /// How long an epoch's counts are kept.
    pub counts_ttl: Duration,
    /// Where other replicas reach this one's asynchronous calls ([`CallAddress`]),
    /// when it accepts them; written with the heartbeat.
    pub address: Option<CallAddress>,
}

/// Where a replica's asynchronous calls are looked up: the owner tag its call ids carry
/// and the base URL of its proxy listener (`http://10.0.0.5:8080`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallAddress {
    /// The tag in the high 32 bits of every call id the replica accepts.
    pub tag: u32,
    /// The base URL other replicas forward a status lookup to.
    pub url: String,
}

impl CallAddress {
    /// The stored value: `TAG URL` (tag as 8 hexadecimal digits).
    pub fn value(&self) -> String {
        format!("{:08x} {}", self.tag, self.url)
    }

    /// Read a stored value `TAG URL`.
    pub fn parse(value: &str) -> Option<Self> {
        let (tag, url) = value.split_once(' ')?;
        if tag.len() != 8 || url.is_empty() {
            return None;
        }
        Some(CallAddress {
            tag: u32::from_str_radix(tag, 16).ok()?,
            url: url.to_string(),
        })
    }
}

/// The reply to a [`Report`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Exchange {
    /// The store's clock, ms since the Unix epoch.
    pub now_ms: u64,
    /// The lease holder, if any.
    pub leader: Option<LeaderKey>,
    /// The highest term granted so far.
    pub term: u64,
    /// What the leader published last.
    pub state: Option<Published>,
    /// Live replicas (heartbeat within the window) and their last heartbeat, ms.
    pub live: BTreeMap<String, u64>,
    /// Every replica's count for [`Report::sum_epoch`].
    pub counts: BTreeMap<String, u64>,
    /// Every replica's latest count: `(epoch, requests)`.
    pub last: BTreeMap<String, (u64, u64)>,
    /// The asynchronous-call addresses of the replicas that wrote one
    /// ([`Report::address`]), by replica.
    pub addresses: BTreeMap<String, CallAddress>,
}

/// The decision the leader published (LIBRA Alg. 1's output).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PublishedDecision {
    /// Global index of the epoch it was taken at.
    pub epoch: u64,
    /// VMs wanted.
    pub target_vms: u32,
    /// `vm_reqs`, requests/s (before ρ); `null` in JSON when not finite.
    pub vm_reqs_rps: Option<f64>,
    /// Why (`ScaleReason::as_str`: `provision`, `below_cip`, …).
    pub reason: String,
}

/// One VM of the shared pool.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RegistryVm {
    /// The provider's instance name.
    pub instance: String,
    /// Its base URL.
    pub base: String,
}

/// What the leader publishes every epoch (one JSON value in the store).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Published {
    /// The leader's term.
    pub term: u64,
    /// The leader.
    pub leader: String,
    /// Global index of the last summed epoch.
    pub epoch: u64,
    /// The monitor after it (global epoch index).
    pub ewma: Option<EwmaState>,
    /// The decision in force.
    pub decision: Option<PublishedDecision>,
    /// Each replica's budget share (sums to 1).
    pub shares: BTreeMap<String, f64>,
    /// The ready VMs of the pool.
    pub registry: Vec<RegistryVm>,
    /// Replicas counted live.
    pub replicas: u32,
    /// The leader's publication counter: it grows with every publication of its term,
    /// the per-epoch one and those made between epochs when its ready VMs changed.
    /// `(term, epoch, revision)` orders publications: a replica never takes one older
    /// than the last it took. 0 from a leader that does not count them.
    #[serde(default)]
    pub revision: u64,
}

/// A pool write the leader is about to make, recorded (fenced) before it makes it. It
/// stays open ([`Store::open_intents`]) until the leader records its outcome
/// ([`Store::settle`]); a new leader replays the open intents of earlier terms.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Intent {
    /// The leader's term.
    pub term: u64,
    /// `launch` or `terminate`.
    pub op: String,
    /// The controller's VM id (`vm-7`; the leader's own numbering).
    pub vm: String,
    /// The provider's instance, when known.
    pub instance: Option<String>,
    /// A launch's client token stem, when the provider has one (EC2: the pool, the term
    /// and the VM id, `crate::backends::ec2`): a later leader finds the instance by it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
}

impl Intent {
    /// Its key among the open intents: `term:op:vm` (a VM id is launched or
    /// terminated once per term: a term belongs to one replica).
    pub fn id(&self) -> String {
        format!("{}:{}:{}", self.term, self.op, self.vm)
    }
}

/// Why a store operation failed. Every one is the store's (or the network's) fault, and
/// every one may be retried at the next epoch.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// No answer within the per-operation deadline.
    #[error("store {op} timed out after {after:?}")]
    Timeout {
        /// The operation.
        op: &'static str,
        /// The deadline.
        after: Duration,
    },
    /// The Redis client failed (connection refused or lost, server error).
    #[error("store {op}: {source}")]
    Redis {
        /// The operation.
        op: &'static str,
        /// Cause.
        #[source]
        source: redis::RedisError,
    },
    /// The store answered something this version cannot read.
    #[error("store {op}: unexpected reply: {what}")]
    Reply {
        /// The operation.
        op: &'static str,
        /// What was wrong.
        what: String,
    },
    /// The store cannot be reached (the in-memory store's simulated outage).
    #[error("store {op}: unavailable")]
    Unavailable {
        /// The operation.
        op: &'static str,
    },
}

impl StoreError {
    /// Label for `spillway_coordination_store_errors_total{kind}`.
    pub fn kind(&self) -> &'static str {
        match self {
            StoreError::Timeout { .. } => "timeout",
            StoreError::Redis { .. } => "redis",
            StoreError::Reply { .. } => "reply",
            StoreError::Unavailable { .. } => "unavailable",
        }
    }
}

/// The shared store. See the [module docs](self).
pub trait Store: Send + Sync + 'static {
    /// `redis` or `memory`, for logs and `/status`.
    fn kind(&self) -> &'static str;

    /// The store's clock, ms since the Unix epoch (the replicas align their epochs on it).
    fn time_ms(&self) -> BoxFuture<'_, Result<u64, StoreError>>;

    /// Every replica, once per epoch: write `report`'s counts (idempotent), its
    /// latest count and a heartbeat; read the lease holder, the leader's publication,
    /// the live replicas and the counts of `report.sum_epoch`. One round trip.
    fn exchange<'a>(&'a self, report: &'a Report) -> BoxFuture<'a, Result<Exchange, StoreError>>;

    /// Take the lease if nobody holds it (`SET NX PX`) with a new term (`INCR`, at least
    /// `min_term + 1`); `None`: someone holds it.
    fn acquire<'a>(
        &'a self,
        replica: &'a str,
        lease: Duration,
        min_term: u64,
    ) -> BoxFuture<'a, Result<Option<u64>, StoreError>>;

    /// Extend the lease if `key` still holds it (compare-and-renew); `false`: lost.
    fn renew<'a>(
        &'a self,
        key: &'a LeaderKey,
        lease: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;

    /// Give the lease up if `key` holds it (compare-and-delete).
    fn release<'a>(&'a self, key: &'a LeaderKey) -> BoxFuture<'a, Result<bool, StoreError>>;

    /// The leader's last publication (`None`: none yet), read by `replica` between its
    /// epoch rounds to take a new one, or new ready VMs, at once.
    fn publication<'a>(
        &'a self,
        replica: &'a str,
    ) -> BoxFuture<'a, Result<Option<Published>, StoreError>>;

    /// Write the leader's publication if `key` holds the lease; `false`: refused (an old
    /// term).
    fn publish<'a>(
        &'a self,
        key: &'a LeaderKey,
        published: &'a Published,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;

    /// Record a pool write if `key` holds the lease; `false`: refused (an old term),
    /// and the write must not be made. The intent is open until [`Self::settle`].
    fn intent<'a>(
        &'a self,
        key: &'a LeaderKey,
        intent: &'a Intent,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;

    /// The write of `intent` was made (or its outcome is known): it is no longer open.
    /// Not fenced: an old leader that finishes a write may say so.
    fn settle<'a>(&'a self, intent: &'a Intent) -> BoxFuture<'a, Result<(), StoreError>>;

    /// The intents recorded and not settled, oldest term first: writes whose outcome
    /// was never recorded (their leader stopped, or lost the store, in between).
    fn open_intents(&self) -> BoxFuture<'_, Result<Vec<Intent>, StoreError>>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_values_round_trip() {
        let k = LeaderKey {
            replica: "host:a".into(),
            term: 17,
        };
        assert_eq!(k.value(), "host:a:17");
        assert_eq!(LeaderKey::parse(&k.value()), Some(k));
        assert_eq!(LeaderKey::parse("nope"), None);
        assert_eq!(LeaderKey::parse("a:x"), None);
    }

    #[test]
    fn call_addresses_round_trip() {
        let a = CallAddress {
            tag: 0x00ab_12cd,
            url: "http://10.0.0.5:8080".into(),
        };
        assert_eq!(a.value(), "00ab12cd http://10.0.0.5:8080");
        assert_eq!(CallAddress::parse(&a.value()), Some(a));
        assert_eq!(CallAddress::parse("ab12cd http://x"), None, "short tag");
        assert_eq!(CallAddress::parse("0000000g http://x"), None, "not hex");
        assert_eq!(CallAddress::parse("00ab12cd "), None, "no URL");
    }

    #[test]
    fn a_publication_round_trips_through_json() {
        let p = Published {
            term: 3,
            leader: "r1".into(),
            epoch: 99,
            ewma: Some(EwmaState {
                epoch: 99,
                avg_per_epoch: 12.5,
                std_per_epoch: 1.25,
                requests: 13,
            }),
            decision: Some(PublishedDecision {
                epoch: 98,
                target_vms: 2,
                vm_reqs_rps: Some(14.0),
                reason: "provision".into(),
            }),
            shares: BTreeMap::from([("r1".into(), 0.7), ("r2".into(), 0.3)]),
            registry: vec![RegistryVm {
                instance: "vm-1".into(),
                base: "http://127.0.0.1:4000/".into(),
            }],
            replicas: 2,
            revision: 7,
        };
        let json = serde_json::to_string(&p).unwrap();
        assert_eq!(serde_json::from_str::<Published>(&json).unwrap(), p);
        // A leader that does not count its publications writes no revision: 0.
        let old = json.replace(",\"revision\":7", "");
        assert_ne!(old, json);
        let read = serde_json::from_str::<Published>(&old).unwrap();
        assert_eq!(read.revision, 0);
    }
}
