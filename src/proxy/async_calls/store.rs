//! The durable store of asynchronous calls (ProFaaStinate §3 in the gateway): every
//! accepted call is committed before its `202 Accepted`, so that a `kill -9` loses none.
//!
//! [`RedbStore`] is the embedded default: `redb` is a pure-Rust, single-file, ACID
//! key-value store with crash-safe commits (copy-on-write B-trees, fsync on commit) and
//! no C toolchain or server — it builds with the rest of spillway from a fresh clone,
//! where SQLite would add a C library for the same three tables. A corrupt file fails
//! [`RedbStore::open`] with an error naming the file.
//!
//! Everything goes through the [`CallStore`] trait so that tests can put a failing store
//! behind the gateway, and so that another store (shared between replicas) can replace
//! the embedded one.
//!
//! **Bounds** ([`StoreLimits`]): a new call is refused when the store would hold more
//! than `async.max_store_bytes` ([`StoreError::Full`]) or its client already has
//! `async.max_calls_per_client` calls stored ([`StoreError::ClientLimit`]). Bytes are
//! counted as the records, request bodies and results stored, and a pending call counts
//! its result as `async.result_max_bytes` until it has one (so finishing never needs
//! more room than was admitted). A call counts against its client from its acceptance
//! until [`CallStore::purge`] deletes it (`async.result_ttl_seconds` after it finished);
//! every purge makes room again.
//!
//! **I/O errors.** redb refuses every operation after a failed write (a full disk) until
//! the database is opened again; [`RedbStore`] reopens its file at the next operation, so
//! the store serves again once space returns, without a restart.

use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use serde::{Deserialize, Serialize};

use redb::{Database, ReadableTable, TableDefinition};

/// A call's life cycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallState {
    /// Waiting in the delay queue.
    Queued,
    /// Released; an attempt is in flight.
    Running,
    /// An upstream answered (any status); the result is stored.
    Done,
    /// No upstream answer (the gateway's own error is the stored result).
    Failed,
    /// Its deadline passed before any tier could take it.
    Expired,
}

impl CallState {
    /// Whether the call still has to run (queued, or running at a crash).
    pub fn pending(self) -> bool {
        matches!(self, CallState::Queued | CallState::Running)
    }
}

/// A stored call: the request after header hygiene and its bookkeeping. Times are Unix
/// milliseconds (they outlive the process).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallRecord {
    /// 32 hex digits.
    pub id: String,
    /// State.
    pub state: CallState,
    /// HTTP method.
    pub method: String,
    /// Request target (path and query).
    pub target: String,
    /// Headers after hygiene, values as bytes.
    pub headers: Vec<(String, Vec<u8>)>,
    /// Deadline, Unix ms.
    pub deadline_ms: u64,
    /// Accepted, Unix ms.
    pub accepted_at_ms: u64,
    /// Last release, Unix ms.
    pub started_at_ms: Option<u64>,
    /// Finished, Unix ms.
    pub finished_at_ms: Option<u64>,
    /// Attempts started (a call running at a crash is started again: at-least-once).
    pub attempts: u32,
    /// The client it counts against (`async.max_calls_per_client`): its IP address, the
    /// peer's or, behind `gateway.trusted_proxies`, the one they forwarded.
    #[serde(default)]
    pub client: Option<String>,
    /// Credential headers (`Authorization`, `Proxy-Authorization`, `Cookie`), sealed
    /// (ChaCha20-Poly1305, see `super::secrets`): never stored in plain text.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sealed_headers: Vec<(String, Vec<u8>)>,
}

/// A stored result: the response (a body longer than `async.result_max_bytes` is not
/// stored: the call fails instead), without `Set-Cookie`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallResult {
    /// Status code.
    pub status: u16,
    /// Headers.
    pub headers: Vec<(String, Vec<u8>)>,
    /// Body.
    pub body: Vec<u8>,
}

/// Store failures.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store could not be opened (corrupt, unreadable, locked).
    #[error("async store {path}: {message}")]
    Open {
        /// The file.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// Another process (or another open in this one) holds the store's file.
    #[error("async store {path}: in use by another process")]
    Locked {
        /// The file.
        path: PathBuf,
    },
    /// The new call does not fit under `async.max_store_bytes` (507 + `Retry-After`).
    #[error("async store full: {used} of {limit} bytes in use, the call needs {needed}")]
    Full {
        /// Bytes counted now.
        used: u64,
        /// `async.max_store_bytes`.
        limit: u64,
        /// What the call would count.
        needed: u64,
    },
    /// The client already has `async.max_calls_per_client` calls stored (429 +
    /// `Retry-After`).
    #[error("client {client} has {limit} asynchronous calls stored, the most it may")]
    ClientLimit {
        /// The client's address.
        client: String,
        /// `async.max_calls_per_client`.
        limit: u64,
    },
    /// A read or write failed.
    #[error("async store: {0}")]
    Io(String),
}

/// A stored call that a restart cannot run: its record does not decode (a damaged or
/// foreign row) or its request body is gone. It is left in the store for inspection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnreadableCall {
    /// The row's key (the call id, when the store wrote it).
    pub id: String,
    /// What is wrong with it.
    pub error: String,
}

/// What a restart finds: the calls to queue again and the ones it cannot run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recovered {
    /// Calls still to run (queued, or running at a crash), with their bodies present.
    pub calls: Vec<CallRecord>,
    /// Rows skipped, with why.
    pub unreadable: Vec<UnreadableCall>,
    /// The store's file (for messages), if it has one.
    pub file: Option<PathBuf>,
}

fn io(e: impl std::fmt::Display) -> StoreError {
    StoreError::Io(e.to_string())
}

/// Bounds of a store (see the [module docs](self)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreLimits {
    /// `async.max_store_bytes`.
    pub max_bytes: u64,
    /// `async.max_calls_per_client` (`None`: no per-client bound).
    pub max_calls_per_client: Option<u64>,
    /// `async.result_max_bytes`: what a pending call counts for its result.
    pub result_max_bytes: u64,
}

impl StoreLimits {
    /// No bounds (tests).
    pub const NONE: StoreLimits = StoreLimits {
        max_bytes: u64::MAX,
        max_calls_per_client: None,
        result_max_bytes: 0,
    };
}

/// What a store holds now, as its bounds count it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct StoreUsage {
    /// Bytes counted (records, bodies, results; a pending call's result at its most).
    pub bytes: u64,
    /// Calls stored (pending or finished and not yet purged).
    pub calls: u64,
}

/// Where calls are kept. All methods are blocking and short (one transaction).
pub trait CallStore: Send + Sync {
    /// Commit a new call with its body, durably.
    ///
    /// # Errors
    /// The store failed: the call is not accepted.
    fn insert(&self, call: &CallRecord, body: &[u8]) -> Result<(), StoreError>;
    /// Replace a call's record (state, times, attempts).
    ///
    /// # Errors
    /// The store failed.
    fn update(&self, call: &CallRecord) -> Result<(), StoreError>;
    /// Replace a call's record and store its result, in one transaction; the request
    /// body is dropped.
    ///
    /// # Errors
    /// The store failed.
    fn finish(&self, call: &CallRecord, result: &CallResult) -> Result<(), StoreError>;
    /// A call's record.
    ///
    /// # Errors
    /// The store failed.
    fn get(&self, id: &str) -> Result<Option<CallRecord>, StoreError>;
    /// A call's request body.
    ///
    /// # Errors
    /// The store failed.
    fn body(&self, id: &str) -> Result<Option<Vec<u8>>, StoreError>;
    /// A call's result.
    ///
    /// # Errors
    /// The store failed.
    fn result(&self, id: &str) -> Result<Option<CallResult>, StoreError>;
    /// Every call still to run (queued, or running at a crash).
    ///
    /// # Errors
    /// The store failed, or a record does not decode.
    fn pending(&self) -> Result<Vec<CallRecord>, StoreError>;
    /// Delete every finished call (done, failed, expired) that finished before Unix ms
    /// `finished_before_ms`: record, result and body. Returns how many were deleted.
    /// The default deletes nothing.
    ///
    /// # Errors
    /// The store failed.
    fn purge(&self, finished_before_ms: u64) -> Result<u64, StoreError> {
        let _ = finished_before_ms;
        Ok(0)
    }
    /// What the store holds, as its bounds count it. The default: nothing counted.
    fn usage(&self) -> StoreUsage {
        StoreUsage::default()
    }
    /// What a restart queues again: every pending call that can run, and the records
    /// that cannot (skipped, so that one damaged row does not hold back the others).
    /// The default is [`Self::pending`] with nothing skipped.
    ///
    /// # Errors
    /// The store failed as a whole.
    fn recover(&self) -> Result<Recovered, StoreError> {
        Ok(Recovered {
            calls: self.pending()?,
            ..Recovered::default()
        })
    }
}

const CALLS: TableDefinition<&str, &[u8]> = TableDefinition::new("calls");
const BODIES: TableDefinition<&str, &[u8]> = TableDefinition::new("bodies");
const RESULTS: TableDefinition<&str, &[u8]> = TableDefinition::new("results");

/// The embedded store: `<store_dir>/calls.redb`. See the [module docs](self).
pub struct RedbStore {
    /// `None` between a failed reopen and the next try.
    db: RwLock<Option<Database>>,
    /// An operation failed with an I/O error: reopen before the next one.
    broken: AtomicBool,
    path: PathBuf,
    limits: StoreLimits,
    /// What is counted against the limits; inserts hold it while they commit.
    counted: Mutex<Counted>,
}

/// The store's contents as its limits count them.
#[derive(Debug, Default)]
struct Counted {
    bytes: u64,
    /// Per call: bytes counted and its client.
    calls: HashMap<String, (u64, Option<String>)>,
    per_client: HashMap<String, u64>,
}

impl Counted {
    fn add(&mut self, id: &str, bytes: u64, client: Option<String>) {
        if let Some(c) = &client {
            *self.per_client.entry(c.clone()).or_default() += 1;
        }
        if let Some((old, old_client)) = self.calls.insert(id.to_owned(), (bytes, client)) {
            self.bytes = self.bytes.saturating_sub(old);
            self.forget_client(old_client.as_deref());
        }
        self.bytes += bytes;
    }

    fn recount(&mut self, id: &str, bytes: u64) {
        if let Some((old, _)) = self.calls.get_mut(id) {
            self.bytes = self.bytes.saturating_sub(*old) + bytes;
            *old = bytes;
        }
    }

    fn remove(&mut self, id: &str) {
        if let Some((old, client)) = self.calls.remove(id) {
            self.bytes = self.bytes.saturating_sub(old);
            self.forget_client(client.as_deref());
        }
    }

    fn forget_client(&mut self, client: Option<&str>) {
        if let Some(c) = client
            && let Some(n) = self.per_client.get_mut(c)
        {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.per_client.remove(c);
            }
        }
    }
}

fn open_db(path: &Path) -> Result<Database, StoreError> {
    let fail = |message: String| StoreError::Open {
        path: path.to_owned(),
        message,
    };
    let db = Database::create(path).map_err(|e| match e {
        redb::DatabaseError::DatabaseAlreadyOpen => StoreError::Locked {
            path: path.to_owned(),
        },
        e => fail(e.to_string()),
    })?;
    let w = db.begin_write().map_err(|e| fail(e.to_string()))?;
    for t in [CALLS, BODIES, RESULTS] {
        w.open_table(t).map_err(|e| fail(e.to_string()))?;
    }
    w.commit().map_err(|e| fail(e.to_string()))?;
    Ok(db)
}

impl RedbStore {
    /// Open (or create) `<dir>/calls.redb`, creating `dir`, with no bounds.
    ///
    /// # Errors
    /// [`StoreError::Open`] naming the file (not creatable, corrupt), or
    /// [`StoreError::Locked`] when another process has it open.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        Self::open_with(dir, StoreLimits::NONE)
    }

    /// [`Self::open`] with `limits`; what the file holds is counted against them.
    ///
    /// # Errors
    /// As [`Self::open`].
    pub fn open_with(dir: &Path, limits: StoreLimits) -> Result<Self, StoreError> {
        let path = dir.join("calls.redb");
        std::fs::create_dir_all(dir).map_err(|e| StoreError::Open {
            path: path.clone(),
            message: e.to_string(),
        })?;
        let db = open_db(&path)?;
        let store = Self {
            db: RwLock::new(Some(db)),
            broken: AtomicBool::new(false),
            path,
            limits,
            counted: Mutex::new(Counted::default()),
        };
        let counted = store.count().map_err(|e| StoreError::Open {
            path: store.path.clone(),
            message: e.to_string(),
        })?;
        *store.counted.lock() = counted;
        Ok(store)
    }

    /// Count what the file holds (at open).
    fn count(&self) -> Result<Counted, StoreError> {
        self.read(|r| {
            let calls = r.open_table(CALLS).map_err(io)?;
            let bodies = r.open_table(BODIES).map_err(io)?;
            let results = r.open_table(RESULTS).map_err(io)?;
            let mut c = Counted::default();
            for row in calls.iter().map_err(io)? {
                let (k, v) = row.map_err(io)?;
                let id = k.value();
                let rec = serde_json::from_slice::<CallRecord>(v.value()).ok();
                let body = bodies.get(id).map_err(io)?.map_or(0, |b| b.value().len());
                let result = match results.get(id).map_err(io)? {
                    Some(r) => r.value().len() as u64,
                    None if rec.as_ref().is_some_and(|r| r.state.pending()) => {
                        self.limits.result_max_bytes
                    }
                    None => 0,
                };
                let bytes = (v.value().len() + body) as u64 + result;
                c.add(id, bytes, rec.and_then(|r| r.client));
            }
            Ok(c)
        })
    }

    /// The database, reopened first when an earlier operation failed with an I/O error.
    fn db(&self) -> Result<parking_lot::RwLockReadGuard<'_, Option<Database>>, StoreError> {
        if self.broken.load(Ordering::Acquire) {
            let mut slot = self.db.write();
            if self.broken.load(Ordering::Acquire) {
                // The old handle holds the file's lock: drop it before opening again.
                *slot = None;
                *slot = Some(open_db(&self.path)?);
                self.broken.store(false, Ordering::Release);
                tracing::info!(store = %self.path.display(), "async store reopened after an I/O error");
            }
        }
        Ok(self.db.read())
    }

    /// `e` as a store error; an I/O error marks the database for reopening.
    fn db_err(&self, e: impl Into<redb::Error>) -> StoreError {
        let e: redb::Error = e.into();
        if matches!(e, redb::Error::Io(_) | redb::Error::PreviousIo) {
            self.broken.store(true, Ordering::Release);
        }
        io(e)
    }

    fn read<T>(
        &self,
        f: impl FnOnce(&redb::ReadTransaction) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let guard = self.db()?;
        let db = guard.as_ref().ok_or_else(|| io("store not open"))?;
        let r = db.begin_read().map_err(|e| self.db_err(e))?;
        f(&r)
    }

    /// One write transaction: `f` writes, then it commits. redb's errors inside `f` are
    /// mapped with [`Self::db_err`] by the caller's closure through `err`.
    fn write<T>(
        &self,
        f: impl FnOnce(
            &redb::WriteTransaction,
            &dyn Fn(redb::Error) -> StoreError,
        ) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let guard = self.db()?;
        let db = guard.as_ref().ok_or_else(|| io("store not open"))?;
        let w = db.begin_write().map_err(|e| self.db_err(e))?;
        let v = f(&w, &|e| self.db_err(e))?;
        w.commit().map_err(|e| self.db_err(e))?;
        Ok(v)
    }
}

fn json<T: Serialize>(v: &T) -> Vec<u8> {
    serde_json::to_vec(v).expect("records serialize")
}

impl CallStore for RedbStore {
    fn insert(&self, call: &CallRecord, body: &[u8]) -> Result<(), StoreError> {
        let record = json(call);
        let needed = (record.len() + body.len()) as u64 + self.limits.result_max_bytes;
        let mut counted = self.counted.lock();
        if let (Some(limit), Some(client)) = (self.limits.max_calls_per_client, &call.client)
            && counted.per_client.get(client).copied().unwrap_or(0) >= limit
        {
            return Err(StoreError::ClientLimit {
                client: client.clone(),
                limit,
            });
        }
        if counted.bytes.saturating_add(needed) > self.limits.max_bytes {
            return Err(StoreError::Full {
                used: counted.bytes,
                limit: self.limits.max_bytes,
                needed,
            });
        }
        self.write(|w, err| {
            w.open_table(CALLS)
                .map_err(|e| err(e.into()))?
                .insert(call.id.as_str(), record.as_slice())
                .map_err(|e| err(e.into()))?;
            w.open_table(BODIES)
                .map_err(|e| err(e.into()))?
                .insert(call.id.as_str(), body)
                .map_err(|e| err(e.into()))?;
            Ok(())
        })?;
        counted.add(&call.id, needed, call.client.clone());
        Ok(())
    }

    fn update(&self, call: &CallRecord) -> Result<(), StoreError> {
        self.write(|w, err| {
            w.open_table(CALLS)
                .map_err(|e| err(e.into()))?
                .insert(call.id.as_str(), json(call).as_slice())
                .map_err(|e| err(e.into()))?;
            Ok(())
        })
    }

    fn finish(&self, call: &CallRecord, result: &CallResult) -> Result<(), StoreError> {
        let (record, stored) = (json(call), json(result));
        self.write(|w, err| {
            w.open_table(CALLS)
                .map_err(|e| err(e.into()))?
                .insert(call.id.as_str(), record.as_slice())
                .map_err(|e| err(e.into()))?;
            w.open_table(RESULTS)
                .map_err(|e| err(e.into()))?
                .insert(call.id.as_str(), stored.as_slice())
                .map_err(|e| err(e.into()))?;
            w.open_table(BODIES)
                .map_err(|e| err(e.into()))?
                .remove(call.id.as_str())
                .map_err(|e| err(e.into()))?;
            Ok(())
        })?;
        self.counted
            .lock()
            .recount(&call.id, (record.len() + stored.len()) as u64);
        Ok(())
    }

    fn get(&self, id: &str) -> Result<Option<CallRecord>, StoreError> {
        self.read(|r| {
            let t = r.open_table(CALLS).map_err(|e| self.db_err(e))?;
            match t.get(id).map_err(|e| self.db_err(e))? {
                Some(v) => serde_json::from_slice(v.value()).map(Some).map_err(io),
                None => Ok(None),
            }
        })
    }

    fn body(&self, id: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.read(|r| {
            let t = r.open_table(BODIES).map_err(|e| self.db_err(e))?;
            Ok(t.get(id)
                .map_err(|e| self.db_err(e))?
                .map(|v| v.value().to_vec()))
        })
    }

    fn result(&self, id: &str) -> Result<Option<CallResult>, StoreError> {
        self.read(|r| {
            let t = r.open_table(RESULTS).map_err(|e| self.db_err(e))?;
            match t.get(id).map_err(|e| self.db_err(e))? {
                Some(v) => serde_json::from_slice(v.value()).map(Some).map_err(io),
                None => Ok(None),
            }
        })
    }

    fn pending(&self) -> Result<Vec<CallRecord>, StoreError> {
        self.read(|r| {
            let t = r.open_table(CALLS).map_err(|e| self.db_err(e))?;
            let mut out = Vec::new();
            for row in t.iter().map_err(|e| self.db_err(e))? {
                let (_, v) = row.map_err(|e| self.db_err(e))?;
                let c: CallRecord = serde_json::from_slice(v.value()).map_err(io)?;
                if c.state.pending() {
                    out.push(c);
                }
            }
            Ok(out)
        })
    }

    fn purge(&self, finished_before_ms: u64) -> Result<u64, StoreError> {
        let old: Vec<String> = self.read(|r| {
            let t = r.open_table(CALLS).map_err(|e| self.db_err(e))?;
            let mut old = Vec::new();
            for row in t.iter().map_err(|e| self.db_err(e))? {
                let (k, v) = row.map_err(|e| self.db_err(e))?;
                if let Ok(c) = serde_json::from_slice::<CallRecord>(v.value())
                    && !c.state.pending()
                    && c.finished_at_ms.is_some_and(|f| f < finished_before_ms)
                {
                    old.push(k.value().to_owned());
                }
            }
            Ok(old)
        })?;
        if old.is_empty() {
            return Ok(0);
        }
        self.write(|w, err| {
            for t in [CALLS, RESULTS, BODIES] {
                let mut t = w.open_table(t).map_err(|e| err(e.into()))?;
                for id in &old {
                    t.remove(id.as_str()).map_err(|e| err(e.into()))?;
                }
            }
            Ok(())
        })?;
        let mut counted = self.counted.lock();
        for id in &old {
            counted.remove(id);
        }
        Ok(old.len() as u64)
    }

    fn usage(&self) -> StoreUsage {
        let c = self.counted.lock();
        StoreUsage {
            bytes: c.bytes,
            calls: c.calls.len() as u64,
        }
    }

    fn recover(&self) -> Result<Recovered, StoreError> {
        let mut out = Recovered {
            file: Some(self.path.clone()),
            ..Recovered::default()
        };
        self.read(|r| {
            let calls = r.open_table(CALLS).map_err(|e| self.db_err(e))?;
            let bodies = r.open_table(BODIES).map_err(|e| self.db_err(e))?;
            for row in calls.iter().map_err(|e| self.db_err(e))? {
                let (k, v) = row.map_err(|e| self.db_err(e))?;
                let id = k.value().to_owned();
                match serde_json::from_slice::<CallRecord>(v.value()) {
                    Err(e) => out.unreadable.push(UnreadableCall {
                        id,
                        error: format!("record does not decode: {e}"),
                    }),
                    Ok(c) if !c.state.pending() => {}
                    Ok(c)
                        if bodies
                            .get(c.id.as_str())
                            .map_err(|e| self.db_err(e))?
                            .is_none() =>
                    {
                        out.unreadable.push(UnreadableCall {
                            id,
                            error: "request body missing".into(),
                        });
                    }
                    Ok(c) => out.calls.push(c),
                }
            }
            Ok(())
        })?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(id: &str) -> CallRecord {
        CallRecord {
            id: id.into(),
            state: CallState::Queued,
            method: "POST".into(),
            target: "/echo?x=1".into(),
            headers: vec![("content-type".into(), b"text/plain".to_vec())],
            deadline_ms: 9_000,
            accepted_at_ms: 1_000,
            started_at_ms: None,
            finished_at_ms: None,
            attempts: 0,
            client: None,
            sealed_headers: Vec::new(),
        }
    }

    #[test]
    fn calls_survive_reopening_and_finished_ones_are_not_pending() {
        let dir = tempfile::tempdir().unwrap();
        {
            let s = RedbStore::open(dir.path()).unwrap();
            s.insert(&call("a"), b"body-a").unwrap();
            s.insert(&call("b"), b"body-b").unwrap();
            let mut b = call("b");
            b.state = CallState::Done;
            let res = CallResult {
                status: 201,
                headers: vec![],
                body: b"ok".to_vec(),
            };
            s.finish(&b, &res).unwrap();
        }
        let s = RedbStore::open(dir.path()).unwrap();
        let p = s.pending().unwrap();
        assert_eq!(p, vec![call("a")]);
        assert_eq!(s.body("a").unwrap().unwrap(), b"body-a");
        assert_eq!(s.body("b").unwrap(), None, "dropped at finish");
        assert_eq!(s.result("b").unwrap().unwrap().status, 201);
        assert_eq!(s.get("b").unwrap().unwrap().state, CallState::Done);
    }

    #[test]
    fn recovery_skips_damaged_rows_and_keeps_every_other_pending_call() {
        let dir = tempfile::tempdir().unwrap();
        let s = RedbStore::open(dir.path()).unwrap();
        for id in ["a", "b", "c"] {
            s.insert(&call(id), b"body").unwrap();
        }
        // A half-written record and a call whose body is gone.
        let guard = s.db.read();
        let w = guard.as_ref().unwrap().begin_write().unwrap();
        {
            let whole = json(&call("b"));
            w.open_table(CALLS)
                .unwrap()
                .insert("b", &whole[..whole.len() / 2])
                .unwrap();
            w.open_table(BODIES).unwrap().remove("c").unwrap();
        }
        w.commit().unwrap();
        drop(guard);
        let r = s.recover().unwrap();
        assert_eq!(r.calls, vec![call("a")]);
        assert_eq!(
            r.file.as_deref(),
            Some(dir.path().join("calls.redb").as_path())
        );
        let why: Vec<(&str, &str)> = r
            .unreadable
            .iter()
            .map(|u| (u.id.as_str(), u.error.as_str()))
            .collect();
        assert_eq!(why.len(), 2, "{why:?}");
        assert_eq!(why[0].0, "b");
        assert!(
            why[0].1.starts_with("record does not decode: EOF"),
            "{why:?}"
        );
        assert_eq!(why[1], ("c", "request body missing"));
        assert!(s.pending().is_err(), "pending() reads strictly");
    }

    #[test]
    fn a_corrupt_file_is_named_in_the_error() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("calls.redb"), vec![0x5a; 8192]).unwrap();
        let e = RedbStore::open(dir.path()).err().expect("corrupt");
        assert!(e.to_string().contains("calls.redb"), "{e}");
    }

    fn finished(id: &str, at_ms: u64) -> CallRecord {
        CallRecord {
            state: CallState::Done,
            finished_at_ms: Some(at_ms),
            ..call(id)
        }
    }

    #[test]
    fn a_full_store_refuses_new_calls_until_a_purge_makes_room() {
        let dir = tempfile::tempdir().unwrap();
        let one = (json(&call("a")).len() + 100) as u64 + 300;
        let limits = StoreLimits {
            max_bytes: 2 * one + 10,
            max_calls_per_client: None,
            result_max_bytes: 300,
        };
        let s = RedbStore::open_with(dir.path(), limits).unwrap();
        let body = [b'x'; 100];
        s.insert(&call("a"), &body).unwrap();
        s.insert(&call("b"), &body).unwrap();
        assert_eq!(s.usage().calls, 2);
        let e = s.insert(&call("c"), &body).unwrap_err();
        assert!(
            matches!(e, StoreError::Full { limit, .. } if limit == 2 * one + 10),
            "{e}"
        );
        // A finished call counts its result, not result_max_bytes: still no room for
        // a whole new call's reservation, until the purge.
        let res = CallResult {
            status: 200,
            headers: vec![],
            body: b"ok".to_vec(),
        };
        s.finish(&finished("a", 5_000), &res).unwrap();
        assert!(s.usage().bytes < 2 * one, "{:?}", s.usage());
        assert_eq!(s.purge(5_000).unwrap(), 0, "finished at the cutoff: kept");
        assert_eq!(s.purge(5_001).unwrap(), 1);
        assert_eq!(s.get("a").unwrap(), None);
        assert_eq!(s.result("a").unwrap(), None);
        assert_eq!(s.usage().calls, 1);
        s.insert(&call("c"), &body).unwrap();
        // Pending calls are never purged, whatever their age.
        assert_eq!(s.purge(u64::MAX).unwrap(), 0);
        // Reopened, the file's contents are counted again.
        let usage = s.usage();
        drop(s);
        let again = RedbStore::open_with(dir.path(), limits).unwrap();
        assert_eq!(again.usage(), usage);
        assert!(matches!(
            again.insert(&call("d"), &body),
            Err(StoreError::Full { .. })
        ));
    }

    #[test]
    fn a_client_at_its_limit_is_refused_and_others_are_not() {
        let dir = tempfile::tempdir().unwrap();
        let limits = StoreLimits {
            max_bytes: u64::MAX,
            max_calls_per_client: Some(2),
            result_max_bytes: 10,
        };
        let s = RedbStore::open_with(dir.path(), limits).unwrap();
        let by = |id: &str, client: &str| CallRecord {
            client: Some(client.into()),
            ..call(id)
        };
        s.insert(&by("a1", "10.0.0.1"), b"").unwrap();
        s.insert(&by("a2", "10.0.0.1"), b"").unwrap();
        let e = s.insert(&by("a3", "10.0.0.1"), b"").unwrap_err();
        assert!(
            matches!(&e, StoreError::ClientLimit { client, limit: 2 } if client == "10.0.0.1"),
            "{e}"
        );
        s.insert(&by("b1", "10.0.0.2"), b"").unwrap();
        // A finished call still counts until it is purged.
        let res = CallResult {
            status: 200,
            headers: vec![],
            body: vec![],
        };
        let mut done = by("a1", "10.0.0.1");
        done.state = CallState::Done;
        done.finished_at_ms = Some(1);
        s.finish(&done, &res).unwrap();
        assert!(s.insert(&by("a3", "10.0.0.1"), b"").is_err());
        s.purge(2).unwrap();
        s.insert(&by("a3", "10.0.0.1"), b"").unwrap();
        // The count survives a restart.
        drop(s);
        let again = RedbStore::open_with(dir.path(), limits).unwrap();
        assert!(matches!(
            again.insert(&by("a4", "10.0.0.1"), b""),
            Err(StoreError::ClientLimit { .. })
        ));
    }
}
