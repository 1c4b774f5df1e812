//! Asynchronous calls in the gateway (ProFaaStinate §3): accept, store, status, release.
//!
//! * Asynchronous calls are off unless a `routes:` entry enables them: on a route with
//!   `async: prefer` a request is asynchronous when it carries `Prefer: respond-async`
//!   (RFC 7240), on one with `async: always` every request is; elsewhere `Prefer` is
//!   ignored (no `Preference-Applied`). Its deadline is the
//!   `async.deadline_header` (milliseconds from now), else the route's
//!   `default_deadline_seconds`, else `async.default_deadline_seconds`.
//! * Refusals: a bad deadline (0, negative, not a number, above
//!   `async.max_deadline_seconds`) or an `Upgrade` → 400; a body over
//!   `async.max_body_bytes` → 413; the client at `async.max_calls_per_client` → 429, the
//!   store at `async.max_store_bytes` → 507, the queue at `async.max_queued` or the store
//!   failing → 503, each with `Retry-After` (synchronous traffic is unaffected).
//! * The store keeps no credential in plain text: `Authorization`, `Proxy-Authorization`
//!   and `Cookie` are sealed ([`super::secrets`]), the upstream's `Set-Cookie` is
//!   not stored. A response body over `async.result_max_bytes` is not stored cut: the
//!   call `failed` with a 502 result saying so.
//! * Finished calls are deleted `async.result_ttl_seconds` after they finished (a
//!   background purge, at most a quarter of the TTL late, 60 s at the most): their status
//!   URL then answers 404, which frees their room in the store and their client's count.
//! * Otherwise the call (method, target, headers after hygiene, body) is committed to the
//!   [`CallStore`] and only then answered `202 Accepted` with
//!   `Preference-Applied: respond-async` and `Location: <status_prefix>/<id>` (128-bit
//!   random id).
//! * `GET <status URL>` → JSON `{id, state, deadline, accepted_at, started_at,
//!   finished_at, attempts}` (times in Unix milliseconds); `GET <status URL>/result` →
//!   the stored response once done or failed, 404 before, 410 after
//!   `async.result_ttl_seconds`.
//! * The policy core's delay queue decides when a call runs; a released call runs the
//!   attempt protocol like a synchronous request, with `Spillway-Call-Id: <id>` added so
//!   that upstreams can deduplicate: delivery is **at least once** — a call running when
//!   the gateway is killed runs again after the restart.
//!
//! **Several replicas** (`coordination: {type: redis}`): a call is stored, run and
//! answered by the replica that accepted it, behind a load balancer that may send its
//! status lookup to any replica. Every call id a coordinated replica accepts carries its
//! **owner tag** in the high 32 bits (8 hexadecimal digits, kept in
//! `<state dir>/async/owner.tag`, so that a replica restarted on the same disk keeps
//! answering its calls); the other 96 bits stay random. A replica that does not hold the
//! call looks the tag up in the coordinator's directory (each replica writes its tag and
//! `coordination.advertise_url` with its heartbeat) and forwards the `GET`/`HEAD` to
//! that replica, marked `Spillway-Call-Lookup` so that it is answered there and never
//! forwarded again. A tag no live replica carries is answered 503 with `Retry-After`
//! (the owner is down; its calls run and answer when it is back on its disk).
//!
//! The traffic monitor counts an asynchronous call at **release**, not at accept: it
//! loads the pool only when it runs, and counting a deferred burst at accept would make
//! LIBRA scale the pool for load the delay queue has just moved out of the peak.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Request, Response, StatusCode, header};
use http_body::Body as _;
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use tokio::time::Instant;

use super::cpu::prometheus::PrometheusCpu;
use super::secrets::{DROPPED_RESULT_HEADERS, SEALED_HEADERS, Sealer};
use super::store::{CallRecord, CallResult, CallState, CallStore, StoreError};
use crate::backends::BoxFuture;
use crate::config::delay::{AsyncConfig, CpuSignal};
use crate::config::{AsyncMode, RouteConfig};
use crate::coord::CallDirectory;
use crate::net::body::{self, Body};
use crate::net::headers;
use crate::policy::Time;
use crate::policy::attempt::Decision;
use crate::policy::core::Release;
use crate::policy::delay::CallId;
use crate::proxy::driver::{AsyncFrontEnd, Gateway, Intercepted, TicketGuard};
use crate::proxy::error::{AsyncRefusal, AsyncUnavailable, ProxyError};
use crate::proxy::service::{self, ServiceSettings};

/// Header carrying the call id to the upstream.
pub const CALL_ID_HEADER: &str = "spillway-call-id";

/// Header marking a status lookup one replica forwarded to the call's owner (its value:
/// the forwarding replica's owner tag): answered from the local store, never forwarded
/// again.
pub const LOOKUP_HEADER: &str = "spillway-call-lookup";

/// The owner-tag file in the store's directory.
pub const OWNER_TAG_FILE: &str = "owner.tag";

/// The owner tag of a call id (its high 32 bits), `None` for text that is not an id.
pub fn owner_tag(id: &str) -> Option<u32> {
    let id = id.parse::<CallId>().ok()?;
    Some((id.0 >> 96) as u32)
}

/// The owner tag kept in `<dir>/owner.tag` (8 hexadecimal digits), created at random
/// when absent, so that a replica restarted on the same store keeps its calls' tag.
///
/// # Errors
/// The file cannot be read or created, or does not hold a tag (naming the file).
pub fn load_or_create_owner_tag(dir: &std::path::Path) -> Result<u32, String> {
    let path = dir.join(OWNER_TAG_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let t = text.trim();
            if t.len() != 8 {
                return Err(format!(
                    "{}: holds {t:?}, an owner tag is 8 hexadecimal digits",
                    path.display()
                ));
            }
            u32::from_str_radix(t, 16).map_err(|_| {
                format!(
                    "{}: holds {t:?}, an owner tag is 8 hexadecimal digits",
                    path.display()
                )
            })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let tag = rand::random::<u32>();
            std::fs::write(&path, format!("{tag:08x}\n"))
                .map_err(|e| format!("{}: {e}", path.display()))?;
            Ok(tag)
        }
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

/// This replica's part in asynchronous calls across replicas.
struct Replicas {
    /// The owner tag of the ids it accepts.
    tag: u32,
    /// Where other tags' owners are.
    directory: Arc<dyn CallDirectory>,
}

/// The gateway's asynchronous-call front end and release runner. See the
/// [module docs](self).
pub struct AsyncCalls {
    cfg: AsyncConfig,
    routes: Vec<RouteConfig>,
    store: Arc<dyn CallStore>,
    /// Seals the credential headers of stored calls.
    sealer: Sealer,
    settings: Arc<ServiceSettings>,
    deadline_header: HeaderName,
    /// VM slots for the `outstanding` CPU signal.
    vm_slots: u32,
    /// Wall clock (Unix ms) at `origin`, the tokio instant the gateway's clock starts.
    unix_origin_ms: u64,
    origin: Instant,
    /// The previous `/proc/stat` reading (busy, total jiffies), `process` signal.
    last_stat: Mutex<Option<(u64, u64)>>,
    /// The previous reading of the VM processes' CPU, `process` signal.
    last_vm_ticks: Mutex<Option<VmTicks>>,
    /// The `prometheus` signal (with `cpu_signal: prometheus`).
    prometheus: Option<Arc<PrometheusCpu>>,
    /// Under coordination: the owner tag and the other replicas' directory.
    replicas: OnceLock<Replicas>,
}

/// A status URL request or an asynchronous request, as [`AsyncCalls::classify`] sees it.
pub enum Kind {
    /// `GET <prefix>/<id>[/result]`.
    Status,
    /// An asynchronous call to accept.
    Async,
    /// Neither.
    Sync,
}

impl AsyncCalls {
    /// The front end over `store`, sealing credentials with `sealer`. `vm_slots` is
    /// `libra.max_outstanding_per_vm` (the VM slot count stand-in).
    pub fn new(
        cfg: AsyncConfig,
        routes: Vec<RouteConfig>,
        store: Arc<dyn CallStore>,
        sealer: Sealer,
        settings: Arc<ServiceSettings>,
        vm_slots: Option<u32>,
    ) -> Arc<Self> {
        // Wall-clock time is needed once: stored timestamps outlive the process. Every
        // later timestamp is this plus the tokio clock's elapsed time.
        #[allow(clippy::disallowed_methods)]
        let unix_origin_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        Arc::new(Self {
            deadline_header: HeaderName::from_bytes(cfg.deadline_header.as_bytes())
                .unwrap_or_else(|_| HeaderName::from_static("spillway-deadline-ms")),
            routes,
            store,
            sealer,
            settings,
            vm_slots: vm_slots.unwrap_or(1).max(1),
            unix_origin_ms,
            origin: Instant::now(),
            last_stat: Mutex::new(None),
            last_vm_ticks: Mutex::new(None),
            prometheus: (cfg.cpu_signal == CpuSignal::Prometheus)
                .then(|| PrometheusCpu::new(&cfg.prometheus))
                .flatten()
                .map(Arc::new),
            replicas: OnceLock::new(),
            cfg,
        })
    }

    /// Run as one of several coordinated replicas: accepted ids carry `tag`, lookups
    /// of other tags go to their owner in `directory` (set once, before serving).
    pub fn set_replicas(&self, tag: u32, directory: Arc<dyn CallDirectory>) {
        let _ = self.replicas.set(Replicas { tag, directory });
    }

    /// A new call id: 128 random bits, or under coordination this replica's owner tag
    /// and 96 random bits.
    fn new_id(&self) -> CallId {
        let random = rand::random::<u128>();
        match self.replicas.get() {
            Some(r) => CallId((u128::from(r.tag) << 96) | (random >> 32)),
            None => CallId(random),
        }
    }

    /// Start the background work: the purge of finished calls after
    /// `async.result_ttl_seconds`, and with the `prometheus` CPU signal a query every
    /// `async.sample_interval_seconds`. Needs the tokio runtime.
    pub fn start(self: &Arc<Self>, gw: &Arc<Gateway>) {
        let me = Arc::downgrade(self);
        let every = (self.cfg.result_ttl_seconds.get() / 4)
            .clamp(Duration::from_millis(50), Duration::from_secs(60));
        tokio::spawn(async move {
            let mut failing = false;
            loop {
                tokio::time::sleep(every).await;
                let Some(me) = me.upgrade() else { return };
                let ttl_ms = millis(me.cfg.result_ttl_seconds.get());
                let cutoff = me.now_ms().saturating_sub(ttl_ms);
                let store = Arc::clone(&me.store);
                match tokio::task::spawn_blocking(move || store.purge(cutoff)).await {
                    Ok(Ok(n)) => {
                        if n > 0 {
                            tracing::debug!(calls = n, "finished asynchronous calls purged");
                        }
                        failing = false;
                    }
                    Ok(Err(e)) if !failing => {
                        failing = true;
                        tracing::warn!(error = %e, "purging finished asynchronous calls failed; retrying");
                    }
                    _ => {}
                }
            }
        });
        if let Some(p) = &self.prometheus {
            let gw = Arc::downgrade(gw);
            p.spawn(
                self.cfg.sample_interval_seconds.get(),
                Box::new(move || gw.upgrade().map(|g| g.ready_vm_bases())),
            );
        }
    }

    fn now_ms(&self) -> u64 {
        self.unix_origin_ms + self.origin.elapsed().as_millis() as u64
    }

    /// Policy time of Unix ms `t` on `gw`'s clock (clamped at zero).
    fn policy_time(&self, gw: &Gateway, t: u64) -> Time {
        let now = gw.now();
        let now_ms = self.now_ms();
        if t >= now_ms {
            now + Duration::from_millis(t - now_ms)
        } else {
            now.saturating_sub(Duration::from_millis(now_ms - t))
        }
    }

    /// The `routes:` entry of a request, as the gateway queue's route keys choose it:
    /// the first whose `path_prefix` matches at a segment boundary and whose `methods`
    /// (empty: all) name `method`.
    fn route_for(&self, method: &str, path: &str) -> Option<&RouteConfig> {
        self.routes.iter().find(|r| r.def().matches(method, path))
    }

    /// Whether `req` is a status URL request, an asynchronous call, or neither.
    pub fn classify<B>(&self, req: &Request<B>) -> Kind {
        let path = req.uri().path();
        if let Some(rest) = path.strip_prefix(self.cfg.status_prefix.as_str())
            && rest.starts_with('/')
            && (req.method() == http::Method::GET || req.method() == http::Method::HEAD)
        {
            return Kind::Status;
        }
        let prefer = req
            .headers()
            .get_all("prefer")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|p| {
                p.split(';')
                    .next()
                    .is_some_and(|t| t.trim().eq_ignore_ascii_case("respond-async"))
            });
        match self
            .route_for(req.method().as_str(), path)
            .map(|r| r.async_mode)
        {
            Some(AsyncMode::Always) => Kind::Async,
            Some(AsyncMode::Prefer) if prefer => Kind::Async,
            _ => Kind::Sync,
        }
    }

    /// The deadline of an asynchronous request, ms from now.
    fn deadline_ms<B>(&self, req: &Request<B>) -> Result<u64, ProxyError> {
        let max_ms = millis(self.cfg.max_deadline_seconds.get());
        if let Some(v) = req.headers().get(&self.deadline_header) {
            let text = v.to_str().unwrap_or("").trim();
            let ms: i128 = text.parse().map_err(|_| {
                ProxyError::AsyncRefused(AsyncRefusal::DeadlineNotANumber {
                    header: self.cfg.deadline_header.clone(),
                    text: text.to_owned(),
                })
            })?;
            if ms <= 0 || ms > i128::from(max_ms) {
                return Err(ProxyError::AsyncRefused(AsyncRefusal::DeadlineOutOfRange {
                    header: self.cfg.deadline_header.clone(),
                    max_ms,
                    got: ms,
                }));
            }
            return Ok(ms as u64);
        }
        let secs = self
            .route_for(req.method().as_str(), req.uri().path())
            .and_then(|r| r.default_deadline_seconds)
            .unwrap_or(self.cfg.default_deadline_seconds);
        Ok(millis(secs.get()))
    }

    /// Accept an asynchronous request: validate, store durably, queue, answer 202.
    ///
    /// # Errors
    /// 400 (deadline, `Upgrade`), 413 (body), 429 (the client's limit), 507 (the store's
    /// size limit), 503 (queue full, store failure).
    pub async fn accept(
        self: &Arc<Self>,
        gw: &Arc<Gateway>,
        req: Request<Incoming>,
        peer: std::net::SocketAddr,
        scheme: &'static str,
    ) -> Result<Response<Body>, ProxyError> {
        if headers::wants_upgrade(req.headers()) {
            return Err(ProxyError::AsyncRefused(AsyncRefusal::Upgrade));
        }
        let deadline_in = self.deadline_ms(&req)?;
        let limit = self.cfg.max_body_bytes;
        if req
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
            .is_some_and(|n| n > limit.get())
        {
            return Err(ProxyError::BodyTooLarge { limit: limit.get() });
        }
        if gw.async_queued() >= self.cfg.max_queued.get() {
            return Err(self.unavailable(AsyncUnavailable::QueueFull));
        }
        let client = client_address(peer, req.headers(), &self.settings.trusted_proxies);
        let (mut parts, incoming) = req.into_parts();
        service::forward_headers(&mut parts, peer, scheme, &self.settings);
        parts.headers.remove(&self.deadline_header);
        let body = match http_body_util::Limited::new(
            incoming,
            usize::try_from(limit.get()).unwrap_or(usize::MAX),
        )
        .collect()
        .await
        {
            Ok(c) => c.to_bytes(),
            Err(e) if e.is::<http_body_util::LengthLimitError>() => {
                return Err(ProxyError::BodyTooLarge { limit: limit.get() });
            }
            Err(e) => return Err(ProxyError::BadRequestBody(e)),
        };
        let id = self.new_id().to_string();
        let mut sealed_headers = Vec::new();
        for name in SEALED_HEADERS {
            for v in parts.headers.get_all(name) {
                sealed_headers.push((name.to_owned(), self.sealer.seal(&id, name, v.as_bytes())));
            }
            parts.headers.remove(name);
        }
        let now_ms = self.now_ms();
        let rec = CallRecord {
            id,
            state: CallState::Queued,
            method: parts.method.as_str().to_owned(),
            target: parts
                .uri
                .path_and_query()
                .map_or_else(|| "/".to_owned(), |p| p.as_str().to_owned()),
            headers: parts
                .headers
                .iter()
                .map(|(k, v)| (k.as_str().to_owned(), v.as_bytes().to_vec()))
                .collect(),
            deadline_ms: now_ms + deadline_in,
            accepted_at_ms: now_ms,
            started_at_ms: None,
            finished_at_ms: None,
            attempts: 0,
            client: Some(client),
            sealed_headers,
        };
        let store = Arc::clone(&self.store);
        let r2 = rec.clone();
        let stored = tokio::task::spawn_blocking(move || store.insert(&r2, &body))
            .await
            .map_err(|e| self.unavailable(AsyncUnavailable::StoreTask(e)))?;
        match stored {
            Ok(()) => {}
            Err(e @ StoreError::Full { .. }) => {
                tracing::debug!(error = %e, "async call refused");
                return Err(ProxyError::AsyncStoreFull {
                    source: e.into(),
                    retry_after: self.cfg.retry_after_seconds,
                });
            }
            Err(e @ StoreError::ClientLimit { .. }) => {
                tracing::debug!(error = %e, "async call refused");
                return Err(ProxyError::AsyncClientLimit {
                    source: e.into(),
                    retry_after: self.cfg.retry_after_seconds,
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, "async call not stored");
                return Err(self.unavailable(AsyncUnavailable::Store(e.into())));
            }
        }
        crate::telemetry::async_accepted();
        self.enqueue(gw, &rec);
        let mut resp = Response::new(body::full(format!(
            "{{\"id\":\"{}\",\"status\":\"{}/{}\"}}\n",
            rec.id, self.cfg.status_prefix, rec.id
        )));
        *resp.status_mut() = StatusCode::ACCEPTED;
        let h = resp.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        h.insert(
            "preference-applied",
            HeaderValue::from_static("respond-async"),
        );
        if let Ok(v) = HeaderValue::from_str(&format!("{}/{}", self.cfg.status_prefix, rec.id)) {
            h.insert(header::LOCATION, v);
        }
        Ok(resp)
    }

    fn unavailable(&self, cause: AsyncUnavailable) -> ProxyError {
        ProxyError::AsyncUnavailable {
            cause,
            retry_after: self.cfg.retry_after_seconds,
        }
    }

    fn owner_request(&self, id: &str, url: &str, source: http::Error) -> ProxyError {
        self.unavailable(AsyncUnavailable::OwnerRequest {
            id: id.to_owned(),
            url: url.to_owned(),
            source,
        })
    }

    fn enqueue(&self, gw: &Arc<Gateway>, rec: &CallRecord) {
        let Ok(id) = rec.id.parse::<CallId>() else {
            return;
        };
        let deadline = self.policy_time(gw, rec.deadline_ms);
        let accepted = self.policy_time(gw, rec.accepted_at_ms);
        gw.enqueue_async(id, deadline, accepted);
    }

    /// Queue every call the store still holds (queued, or running at a crash: run
    /// again, at least once). Records that cannot be read back are skipped with **one**
    /// error naming the store file, their number and ids, so that a damaged row does not
    /// hold back the other calls; they stay in the file for inspection.
    ///
    /// # Errors
    /// The store's read error (the store as a whole cannot be read).
    pub fn recover(self: &Arc<Self>, gw: &Arc<Gateway>) -> Result<usize, ProxyError> {
        let found = self
            .store
            .recover()
            .map_err(|e| self.unavailable(AsyncUnavailable::Store(e.into())))?;
        for rec in &found.calls {
            self.enqueue(gw, rec);
        }
        if !found.unreadable.is_empty() {
            const SHOWN: usize = 5;
            let file = found
                .file
                .as_ref()
                .map_or_else(|| "the store".to_owned(), |f| f.display().to_string());
            let mut which: Vec<String> = found
                .unreadable
                .iter()
                .take(SHOWN)
                .map(|u| format!("{}: {}", u.id, u.error))
                .collect();
            if found.unreadable.len() > SHOWN {
                which.push(format!("and {} more", found.unreadable.len() - SHOWN));
            }
            tracing::error!(
                store = %file,
                skipped = found.unreadable.len(),
                recovered = found.calls.len(),
                "asynchronous call records in {file} cannot be run and were skipped (left in the file): {}",
                which.join("; ")
            );
        }
        Ok(found.calls.len())
    }

    /// Answer `GET <prefix>/<id>` and `GET <prefix>/<id>/result`.
    ///
    /// # Errors
    /// 404 (unknown call, no result yet), 410 (result expired), 503 (store failure).
    pub async fn status<B>(
        &self,
        gw: &Gateway,
        req: &Request<B>,
    ) -> Result<Response<Body>, ProxyError> {
        let rest = req
            .uri()
            .path()
            .strip_prefix(self.cfg.status_prefix.as_str())
            .unwrap_or("")
            .trim_start_matches('/');
        let (id, want_result) = match rest.strip_suffix("/result") {
            Some(id) => (id.to_owned(), true),
            None => (rest.to_owned(), false),
        };
        if id.len() != 32 || id.parse::<CallId>().is_err() {
            return Err(ProxyError::CallNotFound);
        }
        let store = Arc::clone(&self.store);
        let id2 = id.clone();
        let found = tokio::task::spawn_blocking(move || -> Result<_, _> {
            let rec = store.get(&id2)?;
            let res = if want_result {
                store.result(&id2)?
            } else {
                None
            };
            Ok::<_, super::store::StoreError>((rec, res))
        })
        .await
        .map_err(|e| self.unavailable(AsyncUnavailable::StoreTask(e)))?
        .map_err(|e| self.unavailable(AsyncUnavailable::Store(e.into())))?;
        let (Some(rec), res) = found else {
            if let Some(url) = self.owner_elsewhere(&id, req)? {
                return self.forward_lookup(gw, &url, &id, req).await;
            }
            return Err(ProxyError::CallNotFound);
        };
        if !want_result {
            let v = serde_json::json!({
                "id": rec.id,
                "state": rec.state,
                "deadline": rec.deadline_ms,
                "accepted_at": rec.accepted_at_ms,
                "started_at": rec.started_at_ms,
                "finished_at": rec.finished_at_ms,
                "attempts": rec.attempts,
            });
            let mut resp = Response::new(body::full(format!("{v}\n")));
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            return Ok(resp);
        }
        let Some(res) = res else {
            return Err(ProxyError::CallNotFound);
        };
        let retention = millis(self.cfg.result_ttl_seconds.get());
        if rec
            .finished_at_ms
            .is_some_and(|f| self.now_ms() > f + retention)
        {
            return Err(ProxyError::CallResultGone);
        }
        let mut resp = Response::new(body::full(res.body));
        *resp.status_mut() = StatusCode::from_u16(res.status).unwrap_or(StatusCode::BAD_GATEWAY);
        for (k, v) in res.headers {
            if let (Ok(k), Ok(v)) = (
                HeaderName::from_bytes(k.as_bytes()),
                HeaderValue::from_bytes(&v),
            ) && k != header::CONTENT_LENGTH
                && k != header::TRANSFER_ENCODING
            {
                resp.headers_mut().append(k, v);
            }
        }
        Ok(resp)
    }

    /// The base URL of the replica that owns call `id` when it is not this one and the
    /// lookup was not forwarded already; `None`: answer here.
    ///
    /// # Errors
    /// 503 when no live replica carries the id's tag.
    fn owner_elsewhere<B>(&self, id: &str, req: &Request<B>) -> Result<Option<String>, ProxyError> {
        let Some(r) = self.replicas.get() else {
            return Ok(None);
        };
        let Some(tag) = owner_tag(id) else {
            return Ok(None);
        };
        if tag == r.tag || req.headers().contains_key(LOOKUP_HEADER) {
            return Ok(None);
        }
        match r.directory.call_owner(tag) {
            Some(url) => Ok(Some(url)),
            None => Err(self.unavailable(AsyncUnavailable::OwnerNotLive { tag })),
        }
    }

    /// Forward a status lookup of `id` to its owner at `url` and relay the answer.
    ///
    /// # Errors
    /// 503 when the owner does not answer within `gateway.upstream_timeout_seconds`.
    async fn forward_lookup<B>(
        &self,
        gw: &Gateway,
        url: &str,
        id: &str,
        req: &Request<B>,
    ) -> Result<Response<Body>, ProxyError> {
        let base: http::Uri = url
            .parse()
            .map_err(|e: http::uri::InvalidUri| self.owner_request(id, url, e.into()))?;
        let own = self.replicas.get().map_or(0, |r| r.tag);
        let target = req.uri().path_and_query().map_or("/", |p| p.as_str());
        let mut out = Request::builder()
            .method(req.method().clone())
            .uri(target)
            .header(LOOKUP_HEADER, format!("{own:08x}"));
        for name in [header::HOST, header::ACCEPT] {
            for v in req.headers().get_all(&name) {
                out = out.header(name.clone(), v.clone());
            }
        }
        let out = out
            .body(body::empty())
            .map_err(|e| self.owner_request(id, url, e))?;
        let timeout = self.settings.upstream_timeout;
        match tokio::time::timeout(timeout, gw.client().forward(&base, out)).await {
            Ok(Ok(resp)) => {
                let (mut parts, incoming) = resp.into_parts();
                headers::strip_hop_by_hop(&mut parts.headers, false);
                tracing::debug!(call = %id, owner = %url, status = parts.status.as_u16(), "status lookup answered by the owner");
                Ok(Response::from_parts(parts, body::boxed(incoming)))
            }
            Ok(Err(source)) => Err(self.unavailable(AsyncUnavailable::OwnerFailed {
                url: url.to_owned(),
                source,
            })),
            Err(_) => Err(self.unavailable(AsyncUnavailable::OwnerTimeout {
                url: url.to_owned(),
                timeout,
            })),
        }
    }

    /// The path prefix of status URLs (`async.status_prefix`).
    pub fn status_prefix(&self) -> &str {
        &self.cfg.status_prefix
    }

    /// `/status` `async.store`: what the store holds against its bounds.
    pub fn store_status(&self) -> serde_json::Value {
        let u = self.store.usage();
        serde_json::json!({
            "bytes": u.bytes,
            "max_bytes": self.cfg.max_store_bytes,
            "calls": u.calls,
            "max_calls_per_client": self.cfg.max_calls_per_client,
            "result_ttl_seconds": self.cfg.result_ttl_seconds,
        })
    }

    /// The CPU signal (0–1) for the delay queue's scheduler.
    pub fn cpu_signal(&self, gw: &Gateway) -> f64 {
        match self.cfg.cpu_signal {
            CpuSignal::Outstanding => gw.outstanding_share(self.vm_slots),
            CpuSignal::Process => {
                let pids = gw.vm_provider().local_pids();
                if pids.is_empty() {
                    // No local VM process (another pool, or none launched yet): the host.
                    self.proc_stat_share().unwrap_or(0.0)
                } else {
                    self.vm_process_share(&pids).unwrap_or(0.0)
                }
            }
            CpuSignal::Prometheus => match self.prometheus.as_ref().and_then(|p| p.latest()) {
                Some(u) => u,
                None => gw.outstanding_share(self.vm_slots),
            },
        }
    }

    /// `/status` `async.cpu_signal`: the configured source, the one in use (`outstanding`
    /// while Prometheus fails) and, for `prometheus`, its query URL and last error.
    pub fn cpu_signal_status(&self) -> serde_json::Value {
        let configured = match self.cfg.cpu_signal {
            CpuSignal::Outstanding => "outstanding",
            CpuSignal::Process => "process",
            CpuSignal::Prometheus => "prometheus",
        };
        match &self.prometheus {
            Some(p) => serde_json::json!({
                "configured": configured,
                "in_use": if p.latest().is_some() { "prometheus" } else { "outstanding" },
                "source": p.mode(),
                "url": p.url(),
                "queries": p.queries(),
                "last_error": p.last_error().map(|e| e.to_string()),
            }),
            None => serde_json::json!({ "configured": configured, "in_use": configured }),
        }
    }

    /// The local VM processes' share of the host's CPU time since the previous reading:
    /// the growth of their `utime + stime` (`/proc/<pid>/stat`) over the growth of the
    /// host's total CPU time (`/proc/stat`, every core), both in clock ticks. A process
    /// seen for the first time counts from this reading on; load outside the VMs does
    /// not count.
    fn vm_process_share(&self, pids: &[u32]) -> Option<f64> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let total = host_total_ticks(&stat)?;
        let per_pid: HashMap<u32, u64> = pids
            .iter()
            .filter_map(|&pid| {
                let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
                Some((pid, process_ticks(&s)?))
            })
            .collect();
        let now = VmTicks { total, per_pid };
        let mut last = self.last_vm_ticks.lock();
        let prev = last.replace(now);
        vm_share(prev.as_ref()?, last.as_ref()?)
    }

    /// Non-idle share of the host CPU since the previous reading (`/proc/stat`).
    fn proc_stat_share(&self) -> Option<f64> {
        let text = std::fs::read_to_string("/proc/stat").ok()?;
        let line = text.lines().next()?;
        let v: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .filter_map(|x| x.parse().ok())
            .collect();
        let total: u64 = v.iter().sum();
        let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
        let busy = total.saturating_sub(idle);
        let mut last = self.last_stat.lock();
        let prev = last.replace((busy, total));
        let (pb, pt) = prev?;
        let dt = total.saturating_sub(pt);
        (dt > 0).then(|| busy.saturating_sub(pb) as f64 / dt as f64)
    }

    /// Run one released call to its end and store the outcome.
    pub async fn run(self: Arc<Self>, gw: Arc<Gateway>, rel: Release) {
        let id = rel.id.to_string();
        let ticket = TicketGuard::new(&gw, rel.ticket);
        let store = Arc::clone(&self.store);
        let id2 = id.clone();
        let loaded = tokio::task::spawn_blocking(move || {
            Ok::<_, super::store::StoreError>((store.get(&id2)?, store.body(&id2)?))
        })
        .await;
        let (mut rec, body) = match loaded {
            Ok(Ok((Some(rec), Some(body)))) => (rec, body),
            other => {
                tracing::warn!(call = %id, outcome = ?other.map(|r| r.map(|_| ())), "released call not in the store");
                return;
            }
        };
        if let Decision::Reject { .. } = rel.decision {
            drop(ticket);
            if self.now_ms() > rec.deadline_ms {
                rec.state = CallState::Expired;
                rec.finished_at_ms = Some(self.now_ms());
                let result = CallResult {
                    status: 503,
                    headers: vec![],
                    body: b"deadline passed with no capacity\n".to_vec(),
                };
                self.persist_finish(rec, result).await;
            } else {
                // No capacity anywhere: queue it again after a sample period.
                tokio::time::sleep(self.cfg.sample_interval_seconds.get()).await;
                self.enqueue(&gw, &rec);
            }
            return;
        }
        rec.state = CallState::Running;
        rec.attempts += 1;
        rec.started_at_ms = Some(self.now_ms());
        let store = Arc::clone(&self.store);
        let r2 = rec.clone();
        if let Ok(Err(e)) = tokio::task::spawn_blocking(move || store.update(&r2)).await {
            tracing::warn!(call = %id, error = %e, "async call state not stored");
        }
        let mut parts = Request::new(()).into_parts().0;
        parts.method = rec.method.parse().unwrap_or(http::Method::POST);
        parts.uri = rec
            .target
            .parse()
            .unwrap_or_else(|_| http::Uri::from_static("/"));
        for (k, v) in &rec.headers {
            if let (Ok(k), Ok(v)) = (
                HeaderName::from_bytes(k.as_bytes()),
                HeaderValue::from_bytes(v),
            ) {
                parts.headers.append(k, v);
            }
        }
        for (name, sealed) in &rec.sealed_headers {
            match self
                .sealer
                .open(&id, name, sealed)
                .map(|v| HeaderValue::from_bytes(&v))
            {
                Some(Ok(v)) => {
                    if let Ok(n) = HeaderName::from_bytes(name.as_bytes()) {
                        parts.headers.append(n, v);
                    }
                }
                _ => {
                    tracing::warn!(call = %id, header = %name, "a sealed credential header does not open (another key?): sent without it")
                }
            }
        }
        if let Ok(v) = HeaderValue::from_str(&id) {
            parts.headers.insert(CALL_ID_HEADER, v);
        }
        let body = Bytes::from(body);
        let started = Instant::now();
        let outcome =
            service::run_released(&gw, &self.settings, ticket, rel.decision, parts, body).await;
        let (mut state, resp) = match outcome {
            Ok((_, resp)) => (CallState::Done, resp),
            Err((_, e)) => {
                tracing::warn!(call = %id, error = %e, "async call failed");
                (CallState::Failed, e.into_response())
            }
        };
        let (mut rp, rbody) = resp.into_parts();
        let mut bytes = Vec::new();
        let mut b = rbody;
        let max = usize::try_from(self.cfg.result_max_bytes.get()).unwrap_or(usize::MAX);
        let mut too_large = false;
        while !b.is_end_stream() {
            match b.frame().await {
                Some(Ok(f)) => {
                    if let Ok(d) = f.into_data() {
                        if bytes.len() + d.len() > max {
                            too_large = true;
                            break;
                        }
                        bytes.extend_from_slice(&d);
                    }
                }
                _ => break,
            }
        }
        drop(b);
        if too_large {
            // Not a silently cut 200: the call failed, and its result says why.
            let e = ProxyError::AsyncResultTooLarge {
                limit: self.cfg.result_max_bytes.get(),
            };
            tracing::warn!(call = %id, status = rp.status.as_u16(), error = %e, "async call result not stored");
            state = CallState::Failed;
            let (p, b) = e.into_response().into_parts();
            rp = p;
            bytes = b
                .collect()
                .await
                .map(|c| c.to_bytes().to_vec())
                .unwrap_or_default();
        }
        let processing = started.elapsed();
        let deadline = self.policy_time(&gw, rec.deadline_ms);
        gw.async_finished(deadline, processing);
        crate::telemetry::async_finished(state == CallState::Done);
        rec.state = state;
        rec.finished_at_ms = Some(self.now_ms());
        let result = CallResult {
            status: rp.status.as_u16(),
            headers: rp
                .headers
                .iter()
                .filter(|(k, _)| !DROPPED_RESULT_HEADERS.contains(&k.as_str()))
                .map(|(k, v)| (k.as_str().to_owned(), v.as_bytes().to_vec()))
                .collect(),
            body: bytes,
        };
        self.persist_finish(rec, result).await;
    }

    async fn persist_finish(&self, rec: CallRecord, result: CallResult) {
        let store = Arc::clone(&self.store);
        let id = rec.id.clone();
        if let Ok(Err(e)) = tokio::task::spawn_blocking(move || store.finish(&rec, &result)).await {
            tracing::warn!(call = %id, error = %e, "async call result not stored");
        }
    }
}

/// The gateway's view of the front end: the request path, the driver and `/status`
/// reach it through [`AsyncFrontEnd`] only.
impl AsyncFrontEnd for AsyncCalls {
    fn status_prefix(&self) -> &str {
        Self::status_prefix(self)
    }

    fn intercept<'a>(
        self: Arc<Self>,
        gw: &'a Arc<Gateway>,
        req: Request<Incoming>,
        peer: std::net::SocketAddr,
        scheme: &'static str,
    ) -> Intercepted<'a> {
        match self.classify(&req) {
            Kind::Status => {
                Intercepted::Answer(Box::pin(async move { self.status(gw, &req).await }))
            }
            Kind::Async => {
                Intercepted::Answer(Box::pin(
                    async move { self.accept(gw, req, peer, scheme).await },
                ))
            }
            Kind::Sync => Intercepted::Pass(req),
        }
    }

    fn cpu_signal(&self, gw: &Gateway) -> f64 {
        Self::cpu_signal(self, gw)
    }

    fn release(self: Arc<Self>, gw: Arc<Gateway>, rel: Release) -> BoxFuture<'static, ()> {
        Box::pin(self.run(gw, rel))
    }

    fn cpu_signal_status(&self) -> serde_json::Value {
        Self::cpu_signal_status(self)
    }

    fn store_status(&self) -> serde_json::Value {
        Self::store_status(self)
    }
}

/// The client a call counts against: the peer's IP address or, when the peer is one of
/// `gateway.trusted_proxies`, the rightmost `X-Forwarded-For` address that is not.
fn client_address(
    peer: std::net::SocketAddr,
    headers: &http::HeaderMap,
    trusted: &headers::TrustedProxies,
) -> String {
    if !trusted.contains(peer.ip()) {
        return peer.ip().to_string();
    }
    let forwarded: Vec<std::net::IpAddr> = headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|a| a.trim().parse().ok())
        .collect();
    forwarded
        .iter()
        .rev()
        .find(|a| !trusted.contains(**a))
        .or(forwarded.first())
        .unwrap_or(&peer.ip())
        .to_string()
}

/// A reading for the `process` CPU signal: the host's total CPU ticks (every core) and
/// each VM process's `utime + stime`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct VmTicks {
    total: u64,
    per_pid: HashMap<u32, u64>,
}

/// The host's total CPU time in clock ticks: the sum of `/proc/stat`'s `cpu` line.
fn host_total_ticks(proc_stat: &str) -> Option<u64> {
    let line = proc_stat.lines().next()?.strip_prefix("cpu ")?;
    Some(
        line.split_whitespace()
            .filter_map(|x| x.parse::<u64>().ok())
            .sum(),
    )
}

/// `utime + stime` of a `/proc/<pid>/stat` line, clock ticks (fields 14 and 15, counted
/// after the parenthesised command name, which may hold spaces).
fn process_ticks(pid_stat: &str) -> Option<u64> {
    let rest = &pid_stat[pid_stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state): utime is field 14, stime field 15.
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

/// The VM processes' share of the host CPU between two readings, in [0, 1]; processes
/// missing from the earlier reading count from the later one on.
fn vm_share(prev: &VmTicks, now: &VmTicks) -> Option<f64> {
    let dt = now.total.checked_sub(prev.total).filter(|&d| d > 0)?;
    let used: u64 = now
        .per_pid
        .iter()
        .filter_map(|(pid, t)| Some(t.saturating_sub(*prev.per_pid.get(pid)?)))
        .sum();
    Some((used as f64 / dt as f64).min(1.0))
}

/// `d` in whole milliseconds (a configured duration: at most a year, so it fits).
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_ticks_read_utime_and_stime_after_a_command_with_spaces() {
        // pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt
        // cmajflt utime stime cutime cstime ...
        let line = "4242 (sample api) S 1 4242 4242 0 -1 4194560 900 0 3 0 137 29 5 7 20 0 9 0";
        assert_eq!(process_ticks(line), Some(137 + 29));
        assert_eq!(process_ticks("4242 (x) S 1"), None);
        let stat = "cpu  100 5 50 800 20 0 5 0 0 0\ncpu0 50 2 25 400 10 0 3 0 0 0\n";
        assert_eq!(host_total_ticks(stat), Some(100 + 5 + 50 + 800 + 20 + 5));
    }

    #[test]
    fn the_vm_share_counts_only_vm_processes_over_all_host_ticks() {
        let prev = VmTicks {
            total: 10_000,
            per_pid: HashMap::from([(1, 300), (2, 50)]),
        };
        let now = VmTicks {
            total: 10_800,
            // VM 1 used 120 ticks, VM 2 used 60, VM 3 is new (counts from here on).
            per_pid: HashMap::from([(1, 420), (2, 110), (3, 9_999)]),
        };
        let got = vm_share(&prev, &now).unwrap();
        assert!((got - (120.0 + 60.0) / 800.0).abs() < 1e-12, "{got}");
        let same = VmTicks {
            total: 10_000,
            per_pid: HashMap::new(),
        };
        assert_eq!(vm_share(&prev, &same), None, "no time passed");
    }
}
