//! An in-memory [`Store`] on tokio's clock, for tests of the coordinator under paused
//! time: the same semantics as the Redis store (lease expiry, terms, fenced writes,
//! idempotent counts) plus injected faults — the whole store down or hung, one replica
//! cut off, a delay per operation. Written here rather than taken from a library
//! because it must follow tokio's paused clock and fail on command.

use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tokio::time::Instant;

use super::store::{
    CallAddress, Exchange, Intent, LeaderKey, Published, Report, Store, StoreError,
};
use crate::backends::BoxFuture;

/// How the in-memory store misbehaves.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Faults {
    /// Every operation fails at once (a store that is down).
    pub down: bool,
    /// Every operation never answers (a hung store: only the caller's deadline ends it).
    pub hung: bool,
    /// Operations of these replicas fail (cut off by the network).
    pub cut: BTreeSet<String>,
    /// Every operation takes this long.
    pub delay: Duration,
}

#[derive(Debug, Default)]
struct Data {
    leader: Option<(LeaderKey, u64)>,
    term: u64,
    counts: BTreeMap<u64, BTreeMap<String, u64>>,
    last: BTreeMap<String, (u64, u64)>,
    heartbeats: BTreeMap<String, u64>,
    addresses: BTreeMap<String, CallAddress>,
    published: Option<Published>,
    intents: Vec<Intent>,
    open: BTreeMap<String, Intent>,
    refused: u64,
}

/// The in-memory store. See the [module docs](self).
pub struct MemoryStore {
    start: Instant,
    start_ms: u64,
    data: Mutex<Data>,
    faults: Mutex<Faults>,
}

impl MemoryStore {
    /// A store whose clock reads `start_ms` (ms since the Unix epoch) now.
    pub fn new(start_ms: u64) -> Self {
        Self {
            start: Instant::now(),
            start_ms,
            data: Mutex::new(Data::default()),
            faults: Mutex::new(Faults::default()),
        }
    }

    /// Replace the faults.
    pub fn set_faults(&self, faults: Faults) {
        *self.faults.lock() = faults;
    }

    /// Lose everything (a store restarted empty).
    pub fn wipe(&self) {
        *self.data.lock() = Data::default();
    }

    /// Pool-write intents accepted so far, in order.
    pub fn intents(&self) -> Vec<Intent> {
        self.data.lock().intents.clone()
    }

    /// Intents recorded and not settled ([`Store::open_intents`]).
    pub fn open(&self) -> Vec<Intent> {
        self.data.lock().open.values().cloned().collect()
    }

    /// Fenced writes (publications, intents) refused so far for an old term.
    pub fn refused_writes(&self) -> u64 {
        self.data.lock().refused
    }

    /// The last publication.
    pub fn published(&self) -> Option<Published> {
        self.data.lock().published.clone()
    }

    /// The lease holder now.
    pub fn leader(&self) -> Option<LeaderKey> {
        let now = self.now_ms();
        let mut d = self.data.lock();
        Self::expire(&mut d, now);
        d.leader.as_ref().map(|(k, _)| k.clone())
    }

    /// Every replica's count for `epoch`.
    pub fn counts(&self, epoch: u64) -> BTreeMap<String, u64> {
        self.data
            .lock()
            .counts
            .get(&epoch)
            .cloned()
            .unwrap_or_default()
    }

    fn now_ms(&self) -> u64 {
        self.start_ms + Instant::now().duration_since(self.start).as_millis() as u64
    }

    fn expire(d: &mut Data, now: u64) {
        if d.leader.as_ref().is_some_and(|(_, until)| *until <= now) {
            d.leader = None;
        }
    }

    /// Apply the faults for `replica`'s operation `op`, then run `f` on the data.
    fn op<'a, T: Send + 'a>(
        &'a self,
        op: &'static str,
        replica: &'a str,
        f: impl FnOnce(&mut Data, u64) -> T + Send + 'a,
    ) -> BoxFuture<'a, Result<T, StoreError>> {
        Box::pin(async move {
            let faults = self.faults.lock().clone();
            if !faults.delay.is_zero() {
                tokio::time::sleep(faults.delay).await;
            }
            if faults.hung {
                std::future::pending::<()>().await;
            }
            if faults.down || faults.cut.contains(replica) {
                return Err(StoreError::Unavailable { op });
            }
            let now = self.now_ms();
            let mut d = self.data.lock();
            Self::expire(&mut d, now);
            Ok(f(&mut d, now))
        })
    }

    fn holds(d: &Data, key: &LeaderKey) -> bool {
        d.leader.as_ref().is_some_and(|(k, _)| k == key)
    }
}

impl Store for MemoryStore {
    fn kind(&self) -> &'static str {
        "memory"
    }

    fn time_ms(&self) -> BoxFuture<'_, Result<u64, StoreError>> {
        self.op("time", "", |_, now| now)
    }

    fn exchange<'a>(&'a self, report: &'a Report) -> BoxFuture<'a, Result<Exchange, StoreError>> {
        self.op("exchange", &report.replica, move |d, now| {
            for &(epoch, n) in &report.counts {
                d.counts
                    .entry(epoch)
                    .or_default()
                    .insert(report.replica.clone(), n);
            }
            if let Some(&(epoch, n)) = report.counts.last() {
                let newer = d.last.get(&report.replica).is_none_or(|&(e, _)| e <= epoch);
                if newer {
                    d.last.insert(report.replica.clone(), (epoch, n));
                }
            }
            d.heartbeats.insert(report.replica.clone(), now);
            if let Some(a) = &report.address {
                d.addresses.insert(report.replica.clone(), a.clone());
            }
            let window = report.live_window.as_millis() as u64;
            let live = d
                .heartbeats
                .iter()
                .filter(|(_, at)| now.saturating_sub(**at) <= window)
                .map(|(r, at)| (r.clone(), *at))
                .collect();
            Exchange {
                now_ms: now,
                leader: d.leader.as_ref().map(|(k, _)| k.clone()),
                term: d.term,
                state: d.published.clone(),
                live,
                counts: d.counts.get(&report.sum_epoch).cloned().unwrap_or_default(),
                last: d.last.clone(),
                addresses: d.addresses.clone(),
            }
        })
    }

    fn acquire<'a>(
        &'a self,
        replica: &'a str,
        lease: Duration,
        min_term: u64,
    ) -> BoxFuture<'a, Result<Option<u64>, StoreError>> {
        self.op("acquire", replica, move |d, now| {
            if d.leader.is_some() {
                return None;
            }
            d.term = d.term.max(min_term) + 1;
            let key = LeaderKey {
                replica: replica.to_string(),
                term: d.term,
            };
            d.leader = Some((key, now + lease.as_millis() as u64));
            Some(d.term)
        })
    }

    fn renew<'a>(
        &'a self,
        key: &'a LeaderKey,
        lease: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        self.op("renew", &key.replica, move |d, now| {
            if !Self::holds(d, key) {
                return false;
            }
            d.leader = Some((key.clone(), now + lease.as_millis() as u64));
            true
        })
    }

    fn release<'a>(&'a self, key: &'a LeaderKey) -> BoxFuture<'a, Result<bool, StoreError>> {
        self.op("release", &key.replica, move |d, _| {
            let held = Self::holds(d, key);
            if held {
                d.leader = None;
            }
            held
        })
    }

    fn publication<'a>(
        &'a self,
        replica: &'a str,
    ) -> BoxFuture<'a, Result<Option<Published>, StoreError>> {
        self.op("publication", replica, |d, _| d.published.clone())
    }

    fn publish<'a>(
        &'a self,
        key: &'a LeaderKey,
        published: &'a Published,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        self.op("publish", &key.replica, move |d, _| {
            if !Self::holds(d, key) {
                d.refused += 1;
                return false;
            }
            d.published = Some(published.clone());
            true
        })
    }

    fn intent<'a>(
        &'a self,
        key: &'a LeaderKey,
        intent: &'a Intent,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        self.op("intent", &key.replica, move |d, _| {
            if !Self::holds(d, key) {
                d.refused += 1;
                return false;
            }
            d.intents.push(intent.clone());
            d.open.insert(intent.id(), intent.clone());
            true
        })
    }

    fn settle<'a>(&'a self, intent: &'a Intent) -> BoxFuture<'a, Result<(), StoreError>> {
        self.op("settle", "", move |d, _| {
            d.open.remove(&intent.id());
        })
    }

    fn open_intents(&self) -> BoxFuture<'_, Result<Vec<Intent>, StoreError>> {
        self.op("open_intents", "", |d, _| {
            let mut v: Vec<Intent> = d.open.values().cloned().collect();
            v.sort_by_key(|i| i.term);
            v
        })
    }
}
