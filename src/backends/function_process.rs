//! `function_tier: {type: process}`: on-demand local function instances (child
//! processes) with real cold starts, driven by the sans-IO [`FunctionPool`] (FaaSim §3).
//!
//! * A call asks the pool for an instance: a **warm** one is reused, a **cold** one is
//!   spawned on a fresh loopback port and probed until ready (`boot_timeout_seconds`), and
//!   at `max_instances` the call is **throttled** and the untouched request handed back.
//! * One call at a time per instance: the instance is released only when the response
//!   body has been fully streamed or dropped ([`GuardedBody`](crate::net::body::GuardedBody)).
//! * A keep-alive task sleeps until [`FunctionPool::poll_timeout`], expires idle instances
//!   with [`FunctionPool::handle_timeout`] and kills their processes. It is woken whenever
//!   the pool changes and ends at [`FunctionTier::shutdown`] (or when the tier is dropped).
//!
//! The pool and the instance map sit behind one `std::sync::Mutex` that is never held
//! across an `.await`. Pool time is `tokio::time::Instant` elapsed since construction.

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use http::{Request, Response, Uri};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::ReadinessSettings;
use super::process::{ChildProcess, free_port, wait_ready};
use super::{BackendError, BoxFuture, FunctionError, FunctionTier, FunctionTierStats};
use crate::config::ProcessFunctionTierConfig;
use crate::net::body::GuardedBody;
use crate::net::body::{Body, boxed};
use crate::net::client::{UpstreamClient, UpstreamError};
use crate::policy::Time;
use crate::policy::functions::{Acquire, FunctionPool, InstanceId};

/// Name of the Prometheus counter incremented on every cold start.
pub const COLD_STARTS_METRIC: &str = "spillway_function_cold_starts_total";

/// A function tier of local child processes. See the [module docs](self).
pub struct ProcessFunctionTier {
    shared: Arc<Shared>,
}

struct Shared {
    command: Vec<String>,
    spillway_exe: PathBuf,
    client: UpstreamClient,
    readiness: ReadinessSettings,
    origin: Instant,
    state: Mutex<State>,
    /// Wakes the keep-alive task; shared with it so it can wait without a strong ref.
    wake: Arc<Notify>,
    started: AtomicBool,
}

struct State {
    pool: FunctionPool,
    /// Ready instances (busy or idle). Starting ones are owned by their cold start.
    instances: HashMap<InstanceId, ChildProcess>,
    shut_down: bool,
}

impl ProcessFunctionTier {
    /// A tier running `cfg.command` (`{spillway}` → `spillway_exe`, `{port}` → each
    /// instance's port), calling instances through `client`. Nothing runs until
    /// [`Self::start`].
    pub fn new(
        cfg: &ProcessFunctionTierConfig,
        spillway_exe: PathBuf,
        client: UpstreamClient,
    ) -> Arc<Self> {
        Arc::new(Self {
            shared: Arc::new(Shared {
                command: cfg.command.clone(),
                spillway_exe,
                client,
                readiness: ReadinessSettings::from_secs(
                    &cfg.health_path,
                    cfg.boot_timeout_seconds,
                    cfg.probe_interval_seconds,
                ),
                origin: Instant::now(),
                state: Mutex::new(State {
                    pool: FunctionPool::new(cfg.pool_params()),
                    instances: HashMap::new(),
                    shut_down: false,
                }),
                wake: Arc::new(Notify::new()),
                started: AtomicBool::new(false),
            }),
        })
    }

    /// Start the `prewarmed_instances` in the background (they become idle when ready; a
    /// failed one is logged and not retried) and spawn the keep-alive task. Must be called
    /// inside a tokio runtime; later calls do nothing.
    pub fn start(self: &Arc<Self>) {
        let sh = &self.shared;
        if sh.started.swap(true, Ordering::SeqCst) {
            return;
        }
        let ids = {
            let mut st = sh.lock();
            if st.shut_down {
                return;
            }
            let now = sh.now();
            st.pool.prewarm(now)
        };
        for id in ids {
            let sh = Arc::clone(sh);
            tokio::spawn(async move { sh.prewarm_one(id).await });
        }
        tokio::spawn(keep_alive(
            Arc::downgrade(sh),
            Arc::clone(&sh.wake),
            sh.origin,
        ));
    }

    /// Readiness settings used for cold starts (`function_tier.health_path`,
    /// `boot_timeout_seconds`, `probe_interval_seconds`).
    pub fn readiness(&self) -> &ReadinessSettings {
        &self.shared.readiness
    }

    #[cfg(test)]
    fn pids(&self) -> Vec<u32> {
        self.shared
            .lock()
            .instances
            .values()
            .map(ChildProcess::pid)
            .collect()
    }
}

impl fmt::Debug for ProcessFunctionTier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProcessFunctionTier")
            .field("command", &self.shared.command)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl Shared {
    fn now(&self) -> Time {
        Instant::now().saturating_duration_since(self.origin)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is updated in small steps that leave it consistent: survive a poison.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Spawn one instance and wait until it is ready; on failure the child is stopped.
    /// Spawn an instance on a free port and wait until it is ready. The port is picked by
    /// binding port 0 and releasing it, so another process can take it before the child
    /// binds; a child that exits during start-up is therefore retried on a new port, up
    /// to [`START_ATTEMPTS`] times. A readiness timeout is not retried.
    async fn start_instance(&self) -> Result<ChildProcess, BackendError> {
        let mut attempt = 1;
        loop {
            let port = free_port()?;
            let mut child = ChildProcess::spawn(&self.command, port, &self.spillway_exe)?;
            let base = child.base().clone();
            let r = &self.readiness;
            let ready = wait_ready(
                &self.client,
                &base,
                &r.health_path,
                r.boot_timeout,
                r.probe_interval,
                &mut child,
            )
            .await;
            match ready {
                Ok(()) => return Ok(child),
                Err(e) => {
                    let exited = child.exited().is_some();
                    child.stop().await;
                    if !exited || attempt >= START_ATTEMPTS {
                        return Err(e);
                    }
                    tracing::warn!(attempt, error = %e, "function instance exited during start-up; retrying on another port");
                    attempt += 1;
                }
            }
        }
    }

    /// A started instance joins the pool (idle if pre-warmed, busy with its call if cold),
    /// unless the tier shut down meanwhile: then it is returned for the caller to stop.
    fn register_started(
        &self,
        guard: &mut StartGuard,
        id: InstanceId,
        child: ChildProcess,
    ) -> Option<ChildProcess> {
        let mut st = self.lock();
        guard.disarm();
        let now = self.now();
        if st.shut_down {
            st.pool.on_failed(now, id);
            Some(child)
        } else {
            st.pool.on_started(now, id);
            st.instances.insert(id, child);
            None
        }
    }

    async fn prewarm_one(self: Arc<Self>, id: InstanceId) {
        let mut guard = StartGuard::new(&self, id);
        match self.start_instance().await {
            Ok(child) => {
                tracing::info!(instance = %child.instance_name(), "pre-warmed function instance ready");
                let late = self.register_started(&mut guard, id, child);
                self.wake.notify_one();
                if let Some(child) = late {
                    child.stop().await;
                }
            }
            Err(e) => tracing::warn!(error = %e, "pre-warmed function instance failed to start"),
        }
    }

    async fn invoke(self: &Arc<Self>, req: Request<Body>) -> Result<Response<Body>, FunctionError> {
        let (id, base) = loop {
            let acquired = {
                let mut st = self.lock();
                if st.shut_down {
                    return Err(FunctionError::Throttled(Box::new(req)));
                }
                let now = self.now();
                match st.pool.acquire(now) {
                    Acquire::Throttled => return Err(FunctionError::Throttled(Box::new(req))),
                    Acquire::Cold(id) => Err(id),
                    Acquire::Warm(id) => match st
                        .instances
                        .get_mut(&id)
                        .map(|c| (c.exited(), c.base().clone()))
                    {
                        Some((None, base)) => Ok((id, base)),
                        _ => {
                            // Died while idle (already reaped by `exited`): forget it, retry.
                            tracing::warn!(?id, "idle function instance had exited");
                            st.pool.on_failed(now, id);
                            st.instances.remove(&id);
                            continue;
                        }
                    },
                }
            };
            match acquired {
                Ok(warm) => break warm,
                Err(id) => break (id, self.cold_start(id).await?),
            }
        };
        self.wake.notify_one();

        let mut call = InFlight(Some(Lease {
            shared: Some(Arc::clone(self)),
            id,
        }));
        let forwarded = self.client.forward(&base, req).await;
        let lease = call.0.take().expect("the lease is taken once");
        match forwarded {
            Ok(resp) => Ok(resp.map(|b| boxed(GuardedBody::new(boxed(b), lease)))),
            Err(e @ UpstreamError::Connect { .. }) => {
                tracing::warn!(?id, error = %e, "function instance unreachable: stopping it");
                if let Some(child) = lease.fail() {
                    child.stop().await;
                }
                Err(e.into())
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Start instance `id` for a call; it is busy on success. Returns its base URL.
    async fn cold_start(self: &Arc<Self>, id: InstanceId) -> Result<Uri, FunctionError> {
        metrics::counter!(COLD_STARTS_METRIC).increment(1);
        let mut guard = StartGuard::new(self, id);
        let child = self.start_instance().await.map_err(|e| {
            tracing::warn!(error = %e, "function cold start failed");
            FunctionError::ColdStart(e)
        })?;
        let base = child.base().clone();
        let late = self.register_started(&mut guard, id, child);
        if let Some(child) = late {
            self.wake.notify_one();
            child.stop().await;
            return Err(FunctionError::ColdStart(BackendError::Provider(
                "function tier is shutting down".to_string(),
            )));
        }
        Ok(base)
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Let the keep-alive task see that the tier is gone. Children die on drop.
        self.wake.notify_one();
    }
}

/// Reports a starting instance as failed unless disarmed (cold start cancelled or failed).
struct StartGuard {
    shared: Arc<Shared>,
    id: InstanceId,
    armed: bool,
}

impl StartGuard {
    fn new(shared: &Arc<Shared>, id: InstanceId) -> Self {
        Self {
            shared: Arc::clone(shared),
            id,
            armed: true,
        }
    }

    fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for StartGuard {
    fn drop(&mut self) {
        if self.armed {
            let now = self.shared.now();
            self.shared.lock().pool.on_failed(now, self.id);
            self.shared.wake.notify_one();
        }
    }
}

/// One call's hold on a busy instance: released to the pool when dropped.
struct Lease {
    shared: Option<Arc<Shared>>,
    id: InstanceId,
}

impl Lease {
    /// The instance is dead: forget it instead of releasing it; returns its process.
    fn fail(mut self) -> Option<ChildProcess> {
        let sh = self.shared.take()?;
        let child = {
            let mut st = sh.lock();
            let now = sh.now();
            st.pool.on_failed(now, self.id);
            st.instances.remove(&self.id)
        };
        sh.wake.notify_one();
        child
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(sh) = self.shared.take() {
            let now = sh.now();
            sh.lock().pool.release(now, self.id);
            sh.wake.notify_one();
        }
    }
}

/// Start-up attempts of one instance whose process exits before it is ready.
pub const START_ATTEMPTS: u32 = 3;

/// A call waiting for its instance's response. If the caller gives up (the gateway's
/// upstream timeout drops the future), the instance may still be working on the abandoned
/// request: it is stopped rather than handed to the next call, which keeps "one request
/// at a time per instance" true.
struct InFlight(Option<Lease>);

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(lease) = self.0.take() {
            tracing::warn!(id = ?lease.id, "function call abandoned mid-request: stopping its instance");
            if let Some(mut child) = lease.fail() {
                child.start_kill();
            }
        }
    }
}

/// The keep-alive task: expire idle instances when their keep-alive runs out.
async fn keep_alive(shared: Weak<Shared>, wake: Arc<Notify>, origin: Instant) {
    loop {
        let deadline = {
            let Some(sh) = shared.upgrade() else { return };
            let st = sh.lock();
            if st.shut_down {
                return;
            }
            st.pool.poll_timeout()
        };
        match deadline {
            Some(at) => {
                tokio::select! {
                    () = tokio::time::sleep_until(origin + at) => {}
                    () = wake.notified() => {}
                }
            }
            None => wake.notified().await,
        }
        let expired: Vec<ChildProcess> = {
            let Some(sh) = shared.upgrade() else { return };
            let mut st = sh.lock();
            let now = sh.now();
            let ids = st.pool.handle_timeout(now);
            ids.into_iter()
                .filter_map(|id| st.instances.remove(&id))
                .collect()
        };
        for child in expired {
            tracing::debug!(instance = %child.instance_name(), "function instance expired (keep-alive)");
            child.stop().await;
        }
    }
}

impl FunctionTier for ProcessFunctionTier {
    fn kind(&self) -> &'static str {
        "process"
    }

    /// Run `req` on a warm or cold-started instance.
    ///
    /// # Errors
    /// [`FunctionError::Throttled`] (request untouched) at `max_instances` or after
    /// shutdown, [`FunctionError::ColdStart`] when the new instance fails to spawn or to
    /// become ready, [`FunctionError::Upstream`] when the call fails (a connect failure
    /// also stops the instance).
    fn invoke(&self, req: Request<Body>) -> BoxFuture<'_, Result<Response<Body>, FunctionError>> {
        Box::pin(self.shared.invoke(req))
    }

    fn stats(&self) -> FunctionTierStats {
        let st = self.shared.lock();
        let usage = st.pool.usage();
        FunctionTierStats {
            instances: st.pool.alive(),
            idle: st.pool.idle(),
            cold_starts: usage.cold_starts,
            warm_starts: usage.warm_starts,
            throttled: usage.throttled,
        }
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let sh = &self.shared;
            let mut children: Vec<ChildProcess> = {
                let mut st = sh.lock();
                st.shut_down = true;
                let now = sh.now();
                let ids: Vec<InstanceId> = st.instances.keys().copied().collect();
                for id in ids {
                    st.pool.on_failed(now, id);
                }
                st.instances.drain().map(|(_, c)| c).collect()
            };
            sh.wake.notify_one();
            for child in &mut children {
                child.start_kill();
            }
            for child in children {
                child.stop().await;
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::Duration;

    use bytes::Bytes;
    use http_body_util::BodyExt;

    use super::*;
    use crate::net::body::full;
    use crate::net::client::ClientSettings;

    /// A tiny HTTP server on `{port}`, its request log silenced.
    const PY: &[&str] = &[
        "sh",
        "-c",
        "exec python3 -m http.server --bind 127.0.0.1 {port} 2>/dev/null",
    ];

    fn cfg(
        command: &[&str],
        max_instances: u32,
        keep_alive: f64,
        prewarmed: u32,
        boot: f64,
    ) -> ProcessFunctionTierConfig {
        ProcessFunctionTierConfig {
            command: command.iter().map(|s| s.to_string()).collect(),
            health_path: "/".into(),
            keep_alive_seconds: keep_alive,
            max_instances,
            prewarmed_instances: prewarmed,
            boot_timeout_seconds: boot,
            probe_interval_seconds: 0.05,
        }
    }

    fn tier(cfg: &ProcessFunctionTierConfig) -> Arc<ProcessFunctionTier> {
        let client = UpstreamClient::new(ClientSettings {
            connect_timeout: Duration::from_secs(1),
            idle_timeout: Duration::from_secs(5),
        });
        let t = ProcessFunctionTier::new(cfg, PathBuf::from("spillway"), client);
        t.start();
        t
    }

    fn get() -> Request<Body> {
        Request::get("/").body(crate::net::body::empty()).unwrap()
    }

    fn gone(pid: u32) -> bool {
        !Path::new(&format!("/proc/{pid}")).exists()
    }

    /// Poll `cond` every 20 ms until it holds, failing after 15 s.
    async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(15);
        while !cond() {
            assert!(Instant::now() < deadline, "timed out waiting for: {what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn ok_body(t: &ProcessFunctionTier) -> Bytes {
        let resp = t.invoke(get()).await.unwrap();
        assert!(resp.status().is_success(), "{}", resp.status());
        resp.into_body().collect().await.unwrap().to_bytes()
    }

    #[test]
    fn cold_start_then_warm_reuse_and_cold_start_metric() {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        metrics::with_local_recorder(&recorder, || {
            rt.block_on(async {
                let t = tier(&cfg(PY, 4, 60.0, 0, 20.0));
                assert_eq!(t.kind(), "process");
                assert!(!ok_body(&t).await.is_empty());
                let s = t.stats();
                assert_eq!(
                    (s.instances, s.idle, s.cold_starts, s.warm_starts),
                    (1, 1, 1, 0)
                );
                let pids = t.pids();
                assert!(!ok_body(&t).await.is_empty());
                let s = t.stats();
                assert_eq!(
                    (s.instances, s.idle, s.cold_starts, s.warm_starts),
                    (1, 1, 1, 1),
                    "no second spawn"
                );
                assert_eq!(t.pids(), pids);
                t.shutdown().await;
            })
        });
        let text = handle.render();
        assert!(
            text.contains("spillway_function_cold_starts_total 1"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn one_call_per_instance_and_throttling_returns_the_request() {
        let t = tier(&cfg(PY, 2, 60.0, 0, 20.0));
        // Two concurrent calls whose bodies are still unread: two instances.
        let (a, b) = tokio::join!(t.invoke(get()), t.invoke(get()));
        let (a, b) = (a.unwrap(), b.unwrap());
        let s = t.stats();
        assert_eq!((s.instances, s.idle, s.cold_starts), (2, 0, 2));

        let req = Request::post("/upload?x=1")
            .header("x-test", "kept")
            .body(full("payload"))
            .unwrap();
        let Err(FunctionError::Throttled(back)) = t.invoke(req).await else {
            panic!("expected throttling at max_instances")
        };
        assert_eq!(back.method(), http::Method::POST);
        assert_eq!(back.uri(), "/upload?x=1");
        assert_eq!(back.headers()["x-test"], "kept");
        let body = back.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"payload");
        assert_eq!(t.stats().throttled, 1);

        // Dropping an unread body releases its instance; the next call reuses it.
        drop(a);
        assert_eq!(t.stats().idle, 1);
        let c = t.invoke(get()).await.unwrap();
        let s = t.stats();
        assert_eq!((s.instances, s.cold_starts, s.warm_starts), (2, 2, 1));
        drop((b, c));
        t.shutdown().await;
    }

    #[tokio::test]
    async fn keep_alive_expiry_kills_the_child() {
        let t = tier(&cfg(PY, 4, 0.3, 0, 20.0));
        ok_body(&t).await;
        let pids = t.pids();
        assert_eq!(pids.len(), 1);
        eventually("idle instance expired", || t.stats().instances == 0).await;
        eventually("expired child reaped", || gone(pids[0])).await;
        // The next call is a cold start again.
        ok_body(&t).await;
        assert_eq!(t.stats().cold_starts, 2);
        t.shutdown().await;
    }

    #[tokio::test]
    async fn prewarmed_instances_serve_warm_and_are_kept() {
        let t = tier(&cfg(PY, 4, 0.2, 1, 20.0));
        eventually("pre-warmed instance ready", || t.stats().idle == 1).await;
        let (a, b) = tokio::join!(t.invoke(get()), t.invoke(get()));
        drop((a.unwrap(), b.unwrap()));
        let s = t.stats();
        assert_eq!((s.instances, s.warm_starts, s.cold_starts), (2, 1, 1));
        eventually("extra instance expired", || t.stats().instances == 1).await;
        assert_eq!(t.stats().idle, 1, "the pre-warmed count is kept");
        t.shutdown().await;
    }

    #[tokio::test]
    async fn readiness_timeout_fails_the_cold_start() {
        let t = tier(&cfg(
            &["sh", "-c", "exec sleep 30 # {port}"],
            2,
            60.0,
            0,
            0.4,
        ));
        match t.invoke(get()).await {
            Err(FunctionError::ColdStart(BackendError::NotReady { reason, .. })) => {
                assert!(reason.contains("within"), "{reason}")
            }
            other => panic!("unexpected {other:?}"),
        }
        let s = t.stats();
        assert_eq!(
            (s.instances, s.cold_starts),
            (0, 1),
            "the failed instance is forgotten"
        );
        t.shutdown().await;
    }

    #[tokio::test]
    async fn child_exiting_early_fails_fast() {
        let t = tier(&cfg(&["sh", "-c", "exit 1 # {port}"], 2, 60.0, 0, 30.0));
        let started = Instant::now();
        match t.invoke(get()).await {
            Err(FunctionError::ColdStart(BackendError::NotReady { reason, .. })) => {
                assert!(reason.contains("exited"), "{reason}")
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(started.elapsed() < Duration::from_secs(10));
        assert_eq!(t.stats().instances, 0);

        let t = tier(&cfg(&["/nonexistent/fn", "{port}"], 2, 60.0, 0, 30.0));
        let r = t.invoke(get()).await;
        assert!(
            matches!(r, Err(FunctionError::ColdStart(BackendError::Spawn { .. }))),
            "{r:?}"
        );
        assert_eq!(t.stats().instances, 0);
    }

    #[tokio::test]
    async fn an_idle_instance_that_died_is_replaced() {
        let t = tier(&cfg(PY, 2, 60.0, 0, 20.0));
        ok_body(&t).await;
        let pid = t.pids()[0];
        let status = tokio::process::Command::new("kill")
            .arg("-9")
            .arg(pid.to_string())
            .status()
            .await
            .unwrap();
        assert!(status.success());
        // Wait until it is a zombie (dead, not reaped yet), without touching the tier.
        let zombie = || {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
                stat.rsplit(')')
                    .next()
                    .is_some_and(|rest| rest.trim_start().starts_with('Z'))
            })
        };
        eventually("killed child is a zombie", zombie).await;
        // The death is noticed at the next acquire, which then cold-starts a new instance.
        ok_body(&t).await;
        assert_ne!(t.pids(), [pid]);
        let s = t.stats();
        assert_eq!((s.cold_starts, s.warm_starts), (2, 1));
        assert_eq!(t.stats().instances, 1);
        assert!(gone(pid));
        t.shutdown().await;
    }

    #[tokio::test]
    async fn shutdown_kills_every_child_and_throttles_later_calls() {
        let t = tier(&cfg(PY, 4, 60.0, 1, 20.0));
        eventually("pre-warmed instance ready", || t.stats().idle == 1).await;
        let held = t.invoke(get()).await.unwrap();
        let (a, b) = tokio::join!(t.invoke(get()), t.invoke(get()));
        let pids = t.pids();
        assert_eq!(pids.len(), 3);
        t.shutdown().await;
        for pid in pids {
            assert!(gone(pid), "{pid} killed and reaped");
        }
        assert_eq!(t.stats().instances, 0);
        drop((held, a, b));
        assert!(matches!(
            t.invoke(get()).await,
            Err(FunctionError::Throttled(_))
        ));
    }
}
