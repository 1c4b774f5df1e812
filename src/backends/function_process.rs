//! `function_tier: {type: process}`: local function instances (child processes) with real
//! cold starts. The tier only executes — start an instance, call it, stop it; which
//! instance runs a call, and when instances start (cold start, pre-warm) or stop
//! (keep-alive expiry) is the policy core's [`Placement`](crate::policy::placement::Placement),
//! carried out by the live driver (FaaSim §3).
//!
//! * [`FunctionTier::start_instance`] spawns the instance on a fresh loopback port and
//!   probes it until ready (`boot_timeout_seconds`; a child that exits during start-up is
//!   retried on a new port up to [`START_ATTEMPTS`] times).
//! * [`FunctionTier::invoke`] forwards one call to its instance. An instance that died
//!   while idle is reported as not sent ([`NotSentReason::InstanceGone`], request handed
//!   back) so the core places the call again; a connect failure stops the instance and is
//!   reported as [`NotSentReason::Unreachable`].
//! * A call abandoned mid-request (the gateway's upstream timeout dropped the future)
//!   stops its instance rather than leaving a still-busy instance for the next call.
//!
//! The instance map sits behind one `parking_lot::Mutex` never held across an `.await`.

use parking_lot::{Mutex, MutexGuard};
use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use http::{Request, Response};

use super::ReadinessSettings;
use super::process::{ChildProcess, free_port, wait_ready};
use super::{BackendError, BoxFuture, FunctionError, FunctionTier};
use crate::config::ProcessFunctionTierConfig;
use crate::net::body::{Body, boxed};
use crate::net::client::{UpstreamClient, UpstreamError};
use crate::policy::attempt::NotSentReason;
use crate::policy::functions::InstanceId;

/// Name of the Prometheus counter incremented on every cold start (by the driver).
pub const COLD_STARTS_METRIC: &str = "spillway_function_cold_starts_total";

/// Start-up attempts of one instance whose process exits before it is ready.
pub const START_ATTEMPTS: u32 = 3;

/// A function tier of local child processes. See the [module docs](self).
pub struct ProcessFunctionTier {
    shared: Arc<Shared>,
}

struct Shared {
    command: Vec<String>,
    spillway_exe: PathBuf,
    client: UpstreamClient,
    readiness: ReadinessSettings,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Ready instances (busy or idle).
    instances: HashMap<InstanceId, ChildProcess>,
    shut_down: bool,
}

impl ProcessFunctionTier {
    /// A tier running `cfg.command` (`{spillway}` → `spillway_exe`, `{port}` → each
    /// instance's port), calling instances through `client`. Nothing runs until the driver
    /// starts instances.
    pub fn new(
        cfg: &ProcessFunctionTierConfig,
        spillway_exe: PathBuf,
        client: UpstreamClient,
    ) -> Arc<Self> {
        Arc::new(Self {
            shared: Arc::new(Shared {
                command: cfg.command.clone().unwrap_or_default(),
                spillway_exe,
                client,
                readiness: ReadinessSettings::new(
                    &cfg.health_path,
                    cfg.boot_timeout_seconds,
                    cfg.probe_interval_seconds,
                ),
                state: Mutex::new(State::default()),
            }),
        })
    }

    /// Readiness settings used for cold starts (`function_tier.health_path`,
    /// `boot_timeout_seconds`, `probe_interval_seconds`).
    pub fn readiness(&self) -> &ReadinessSettings {
        &self.shared.readiness
    }

    /// Process ids of the running instances (tests and diagnostics).
    pub fn pids(&self) -> Vec<u32> {
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
            .field("instances", &self.shared.lock().instances.len())
            .finish_non_exhaustive()
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is updated in small steps that leave it consistent: survive a poison.
        self.state.lock()
    }

    /// Spawn an instance on a free port and wait until it is ready. The port is picked by
    /// binding port 0 and releasing it, so another process can take it before the child
    /// binds; a child that exits during start-up is therefore retried on a new port, up
    /// to [`START_ATTEMPTS`] times. A readiness timeout is not retried.
    async fn spawn_ready(&self) -> Result<ChildProcess, BackendError> {
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

    async fn start(&self, id: InstanceId) -> Result<(), BackendError> {
        if self.lock().shut_down {
            return Err(BackendError::Provider(
                "function tier is shutting down".into(),
            ));
        }
        let child = self.spawn_ready().await?;
        let late = {
            let mut st = self.lock();
            if st.shut_down {
                Some(child)
            } else {
                tracing::debug!(instance = %child.instance_name(), ?id, "function instance ready");
                if let Some(old) = st.instances.insert(id, child) {
                    // The core never reuses a live id; stop a leftover defensively.
                    tokio::spawn(old.stop());
                }
                None
            }
        };
        match late {
            Some(child) => {
                child.stop().await;
                Err(BackendError::Provider(
                    "function tier is shutting down".into(),
                ))
            }
            None => Ok(()),
        }
    }

    async fn stop(&self, id: InstanceId) {
        let child = self.lock().instances.remove(&id);
        if let Some(child) = child {
            tracing::debug!(instance = %child.instance_name(), ?id, "stopping function instance");
            child.stop().await;
        }
    }

    async fn invoke(
        self: &Arc<Self>,
        id: Option<InstanceId>,
        req: Request<Body>,
    ) -> Result<Response<Body>, FunctionError> {
        let Some(id) = id else {
            return Err(FunctionError::Failed(
                "process function tier called without an instance".into(),
            ));
        };
        let base = {
            let mut st = self.lock();
            if st.shut_down {
                return Err(FunctionError::not_sent(NotSentReason::ShuttingDown, req));
            }
            match st
                .instances
                .get_mut(&id)
                .map(|c| (c.exited(), c.base().clone()))
            {
                Some((None, base)) => base,
                other => {
                    // Died while idle (reaped by `exited`), or already stopped: the core
                    // forgets it and places the call again.
                    if other.is_some() {
                        tracing::warn!(?id, "idle function instance had exited");
                        st.instances.remove(&id);
                    }
                    return Err(FunctionError::not_sent(NotSentReason::InstanceGone, req));
                }
            }
        };
        let mut call = InFlight {
            shared: Some(Arc::clone(self)),
            id,
        };
        let forwarded = self.client.forward(&base, req).await;
        call.shared = None;
        match forwarded {
            Ok(resp) => Ok(resp.map(boxed)),
            Err(e @ UpstreamError::Connect { .. }) => {
                tracing::warn!(?id, error = %e, "function instance unreachable: stopping it");
                self.stop(id).await;
                Err(FunctionError::NotSent {
                    reason: NotSentReason::Unreachable,
                    request: None,
                })
            }
            Err(e) => Err(e.into()),
        }
    }
}

/// A call waiting for its instance's response. If the caller gives up (the gateway's
/// upstream timeout drops the future), the instance may still be working on the abandoned
/// request: it is killed rather than handed to the next call, which keeps "one request at
/// a time per instance" true. The driver tells the core the instance is gone.
struct InFlight {
    shared: Option<Arc<Shared>>,
    id: InstanceId,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(sh) = self.shared.take() {
            tracing::warn!(id = ?self.id, "function call abandoned mid-request: stopping its instance");
            if let Some(mut child) = sh.lock().instances.remove(&self.id) {
                child.start_kill();
            }
        }
    }
}

impl FunctionTier for ProcessFunctionTier {
    fn kind(&self) -> &'static str {
        "process"
    }

    /// Spawn instance `instance` and wait until its readiness probe passes.
    ///
    /// # Errors
    /// [`BackendError::Spawn`], [`BackendError::NotReady`] (exited, or not ready within
    /// `boot_timeout_seconds`), or [`BackendError::Provider`] after shutdown.
    fn start_instance(&self, instance: InstanceId) -> BoxFuture<'_, Result<(), BackendError>> {
        Box::pin(self.shared.start(instance))
    }

    fn stop_instance(&self, instance: InstanceId) -> BoxFuture<'_, ()> {
        Box::pin(self.shared.stop(instance))
    }

    /// Forward `req` to instance `instance`.
    ///
    /// # Errors
    /// [`FunctionError::NotSent`] when the instance is gone (request handed back), after
    /// shutdown (request handed back) or unreachable (connect failure; the instance is
    /// stopped); [`FunctionError::Upstream`] when the call fails after it was sent.
    fn invoke(
        &self,
        instance: Option<InstanceId>,
        req: Request<Body>,
    ) -> BoxFuture<'_, Result<Response<Body>, FunctionError>> {
        Box::pin(self.shared.invoke(instance, req))
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let mut children: Vec<ChildProcess> = {
                let mut st = self.shared.lock();
                st.shut_down = true;
                st.instances.drain().map(|(_, c)| c).collect()
            };
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
    use tokio::time::Instant;

    use super::*;
    use crate::net::body::full;
    use crate::net::client::ClientSettings;

    /// A tiny HTTP server on `{port}`, its request log silenced.
    const PY: &[&str] = &[
        "sh",
        "-c",
        "exec python3 -m http.server --bind 127.0.0.1 {port} 2>/dev/null",
    ];

    fn cfg(command: &[&str], boot_ms: u64) -> ProcessFunctionTierConfig {
        ProcessFunctionTierConfig {
            command: Some(command.iter().map(|s| s.to_string()).collect()),
            health_path: "/".into(),
            keep_alive_seconds: crate::config::Seconds::from_secs(60),
            max_instances: std::num::NonZeroU32::new(4).unwrap(),
            prewarmed_instances: 0,
            warm_instance_order: Default::default(),
            boot_timeout_seconds: crate::config::Seconds::from_millis(boot_ms),
            probe_interval_seconds: crate::config::Seconds::from_millis(50),
        }
    }

    fn tier(cfg: &ProcessFunctionTierConfig) -> Arc<ProcessFunctionTier> {
        let client = UpstreamClient::new(ClientSettings {
            connect_timeout: Duration::from_secs(1),
            idle_timeout: Duration::from_secs(5),
        });
        ProcessFunctionTier::new(cfg, PathBuf::from("spillway"), client)
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

    async fn ok_body(t: &ProcessFunctionTier, id: InstanceId) -> Bytes {
        let resp = t.invoke(Some(id), get()).await.unwrap();
        assert!(resp.status().is_success(), "{}", resp.status());
        resp.into_body().collect().await.unwrap().to_bytes()
    }

    #[tokio::test]
    async fn started_instances_serve_calls_until_stopped() {
        let t = tier(&cfg(PY, 20000));
        assert_eq!(t.kind(), "process");
        t.start_instance(InstanceId(0)).await.unwrap();
        t.start_instance(InstanceId(1)).await.unwrap();
        let pids = t.pids();
        assert_eq!(pids.len(), 2);
        assert!(!ok_body(&t, InstanceId(0)).await.is_empty());
        assert!(!ok_body(&t, InstanceId(0)).await.is_empty());
        assert_eq!(t.pids().len(), 2, "calls never spawn");
        t.stop_instance(InstanceId(0)).await;
        assert_eq!(t.pids().len(), 1);
        eventually("stopped child reaped", || {
            pids.iter().filter(|p| gone(**p)).count() == 1
        })
        .await;
        t.shutdown().await;
    }

    #[tokio::test]
    async fn an_unknown_or_dead_instance_hands_the_request_back() {
        let t = tier(&cfg(PY, 20000));
        let req = Request::post("/upload?x=1")
            .header("x-test", "kept")
            .body(full("payload"))
            .unwrap();
        let Err(FunctionError::NotSent {
            reason: NotSentReason::InstanceGone,
            request: Some(back),
        }) = t.invoke(Some(InstanceId(7)), req).await
        else {
            panic!("expected the request back")
        };
        assert_eq!(back.method(), http::Method::POST);
        assert_eq!(back.uri(), "/upload?x=1");
        assert_eq!(back.headers()["x-test"], "kept");
        let body = back.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"payload");

        t.start_instance(InstanceId(0)).await.unwrap();
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
        let r = t.invoke(Some(InstanceId(0)), get()).await;
        assert!(
            matches!(
                r,
                Err(FunctionError::NotSent {
                    reason: NotSentReason::InstanceGone,
                    request: Some(_)
                })
            ),
            "{r:?}"
        );
        assert!(t.pids().is_empty(), "the dead instance is forgotten");
        assert!(gone(pid));
    }

    #[tokio::test]
    async fn readiness_timeout_and_early_exit_fail_the_start() {
        let t = tier(&cfg(&["sh", "-c", "exec sleep 30 # {port}"], 400));
        match t.start_instance(InstanceId(0)).await {
            Err(BackendError::NotReady { reason, .. }) => {
                assert!(reason.contains("within"), "{reason}")
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(t.pids().is_empty(), "the failed instance is not kept");

        let t = tier(&cfg(&["sh", "-c", "exit 1 # {port}"], 30000));
        let started = Instant::now();
        match t.start_instance(InstanceId(0)).await {
            Err(BackendError::NotReady { reason, .. }) => {
                assert!(reason.contains("exited"), "{reason}")
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(started.elapsed() < Duration::from_secs(10));

        let t = tier(&cfg(&["/nonexistent/fn", "{port}"], 30000));
        let r = t.start_instance(InstanceId(0)).await;
        assert!(matches!(r, Err(BackendError::Spawn { .. })), "{r:?}");
    }

    #[tokio::test]
    async fn shutdown_kills_every_child_and_later_calls_are_not_sent() {
        let t = tier(&cfg(PY, 20000));
        t.start_instance(InstanceId(0)).await.unwrap();
        t.start_instance(InstanceId(1)).await.unwrap();
        let held = t.invoke(Some(InstanceId(0)), get()).await.unwrap();
        let pids = t.pids();
        t.shutdown().await;
        for pid in pids {
            assert!(gone(pid), "{pid} killed and reaped");
        }
        drop(held);
        assert!(matches!(
            t.invoke(Some(InstanceId(1)), get()).await,
            Err(FunctionError::NotSent {
                reason: NotSentReason::ShuttingDown,
                request: Some(_)
            })
        ));
        assert!(t.start_instance(InstanceId(2)).await.is_err());
    }
}
