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
//! behind the gateway.

use std::path::{Path, PathBuf};

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
}

/// A stored result: the response (body cut at `async.result_max_bytes`).
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
    db: Database,
    path: PathBuf,
}

impl RedbStore {
    /// Open (or create) `<dir>/calls.redb`, creating `dir`.
    ///
    /// # Errors
    /// [`StoreError::Open`] naming the file (not creatable, corrupt), or
    /// [`StoreError::Locked`] when another process has it open.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        let path = dir.join("calls.redb");
        let fail = |message: String| StoreError::Open {
            path: path.clone(),
            message,
        };
        std::fs::create_dir_all(dir).map_err(|e| fail(e.to_string()))?;
        let db = Database::create(&path).map_err(|e| match e {
            redb::DatabaseError::DatabaseAlreadyOpen => StoreError::Locked { path: path.clone() },
            e => fail(e.to_string()),
        })?;
        let w = db.begin_write().map_err(|e| fail(e.to_string()))?;
        for t in [CALLS, BODIES, RESULTS] {
            w.open_table(t).map_err(|e| fail(e.to_string()))?;
        }
        w.commit().map_err(|e| fail(e.to_string()))?;
        Ok(Self { db, path })
    }
}

fn json<T: Serialize>(v: &T) -> Vec<u8> {
    serde_json::to_vec(v).expect("records serialize")
}

impl CallStore for RedbStore {
    fn insert(&self, call: &CallRecord, body: &[u8]) -> Result<(), StoreError> {
        let w = self.db.begin_write().map_err(io)?;
        {
            w.open_table(CALLS)
                .map_err(io)?
                .insert(call.id.as_str(), json(call).as_slice())
                .map_err(io)?;
            w.open_table(BODIES)
                .map_err(io)?
                .insert(call.id.as_str(), body)
                .map_err(io)?;
        }
        w.commit().map_err(io)
    }

    fn update(&self, call: &CallRecord) -> Result<(), StoreError> {
        let w = self.db.begin_write().map_err(io)?;
        w.open_table(CALLS)
            .map_err(io)?
            .insert(call.id.as_str(), json(call).as_slice())
            .map_err(io)?;
        w.commit().map_err(io)
    }

    fn finish(&self, call: &CallRecord, result: &CallResult) -> Result<(), StoreError> {
        let w = self.db.begin_write().map_err(io)?;
        {
            w.open_table(CALLS)
                .map_err(io)?
                .insert(call.id.as_str(), json(call).as_slice())
                .map_err(io)?;
            w.open_table(RESULTS)
                .map_err(io)?
                .insert(call.id.as_str(), json(result).as_slice())
                .map_err(io)?;
            w.open_table(BODIES)
                .map_err(io)?
                .remove(call.id.as_str())
                .map_err(io)?;
        }
        w.commit().map_err(io)
    }

    fn get(&self, id: &str) -> Result<Option<CallRecord>, StoreError> {
        let r = self.db.begin_read().map_err(io)?;
        let t = r.open_table(CALLS).map_err(io)?;
        match t.get(id).map_err(io)? {
            Some(v) => serde_json::from_slice(v.value()).map(Some).map_err(io),
            None => Ok(None),
        }
    }

    fn body(&self, id: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let r = self.db.begin_read().map_err(io)?;
        let t = r.open_table(BODIES).map_err(io)?;
        Ok(t.get(id).map_err(io)?.map(|v| v.value().to_vec()))
    }

    fn result(&self, id: &str) -> Result<Option<CallResult>, StoreError> {
        let r = self.db.begin_read().map_err(io)?;
        let t = r.open_table(RESULTS).map_err(io)?;
        match t.get(id).map_err(io)? {
            Some(v) => serde_json::from_slice(v.value()).map(Some).map_err(io),
            None => Ok(None),
        }
    }

    fn pending(&self) -> Result<Vec<CallRecord>, StoreError> {
        let r = self.db.begin_read().map_err(io)?;
        let t = r.open_table(CALLS).map_err(io)?;
        let mut out = Vec::new();
        for row in t.iter().map_err(io)? {
            let (_, v) = row.map_err(io)?;
            let c: CallRecord = serde_json::from_slice(v.value()).map_err(io)?;
            if c.state.pending() {
                out.push(c);
            }
        }
        Ok(out)
    }

    fn recover(&self) -> Result<Recovered, StoreError> {
        let r = self.db.begin_read().map_err(io)?;
        let calls = r.open_table(CALLS).map_err(io)?;
        let bodies = r.open_table(BODIES).map_err(io)?;
        let mut out = Recovered {
            file: Some(self.path.clone()),
            ..Recovered::default()
        };
        for row in calls.iter().map_err(io)? {
            let (k, v) = row.map_err(io)?;
            let id = k.value().to_owned();
            match serde_json::from_slice::<CallRecord>(v.value()) {
                Err(e) => out.unreadable.push(UnreadableCall {
                    id,
                    error: format!("record does not decode: {e}"),
                }),
                Ok(c) if !c.state.pending() => {}
                Ok(c) if bodies.get(c.id.as_str()).map_err(io)?.is_none() => {
                    out.unreadable.push(UnreadableCall {
                        id,
                        error: "request body missing".into(),
                    });
                }
                Ok(c) => out.calls.push(c),
            }
        }
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
        let w = s.db.begin_write().unwrap();
        {
            let whole = json(&call("b"));
            w.open_table(CALLS)
                .unwrap()
                .insert("b", &whole[..whole.len() / 2])
                .unwrap();
            w.open_table(BODIES).unwrap().remove("c").unwrap();
        }
        w.commit().unwrap();
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
}
