//! `vm_pool: {type: process}`: each VM is a local child process started from a command
//! template on a fresh loopback port — the quickstart's stand-in for EC2.
//!
//! [`ProcessVmPool::launch`] spawns the child and returns at once; the driver then
//! resolves its address ([`VmProvider::resolve`], immediate for a process) and probes it
//! for readiness with the settings of [`ProcessVmPool::readiness`].

use parking_lot::{Mutex, MutexGuard};
use std::collections::HashMap;
use std::path::PathBuf;

use http::Uri;

use super::ReadinessSettings;
use super::process::{ChildProcess, free_port};
use super::{BackendError, BoxFuture, VmProvider};
use crate::config::ProcessVmPoolConfig;
use crate::policy::VmId;

/// A VM pool of local child processes. See the [module docs](self).
#[derive(Debug)]
pub struct ProcessVmPool {
    command: Vec<String>,
    spillway_exe: PathBuf,
    readiness: ReadinessSettings,
    children: Mutex<HashMap<String, ChildProcess>>,
    /// Several replicas share the pool (`coordination`): VMs outlive the replica that
    /// launched them, and any leader stops them by pid.
    shared: bool,
    /// Set when another replica takes the pool over: shutdown keeps the VMs.
    hand_over: std::sync::atomic::AtomicBool,
}

impl ProcessVmPool {
    /// A pool running `cfg.command`, where `{spillway}` expands to `spillway_exe` (the
    /// running binary, `std::env::current_exe()`) and `{port}` to each VM's port.
    pub fn new(cfg: &ProcessVmPoolConfig, spillway_exe: PathBuf) -> Self {
        Self {
            command: cfg.command.clone(),
            spillway_exe,
            readiness: ReadinessSettings::new(
                &cfg.health_path,
                cfg.boot_timeout_seconds,
                cfg.probe_interval_seconds,
            ),
            children: Mutex::new(HashMap::new()),
            shared: false,
            hand_over: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// A pool shared by coordinated replicas: VMs are started detached
    /// ([`ChildProcess::spawn_detached`]) so that a new leader adopts them when this
    /// replica dies, and [`VmProvider::terminate`] stops a VM another replica launched
    /// ([`super::process::stop_by_name`]).
    pub fn shared(mut self) -> Self {
        self.shared = true;
        self
    }

    /// The readiness probe settings the driver should use for this pool (health path,
    /// boot timeout, probe interval) — `vm_pool.health_path`, `boot_timeout_seconds`,
    /// `probe_interval_seconds`.
    pub fn readiness(&self) -> &ReadinessSettings {
        &self.readiness
    }

    /// Children currently owned (launched and not terminated), including exited ones not
    /// terminated yet.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// `true` when no child is owned.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, ChildProcess>> {
        // A panic while holding the lock leaves the map consistent: keep going.
        self.children.lock()
    }
}

impl VmProvider for ProcessVmPool {
    fn kind(&self) -> &'static str {
        "process"
    }

    fn executes_scaling(&self) -> bool {
        true
    }

    fn adopt(&self) -> BoxFuture<'_, Result<Vec<(String, Uri)>, BackendError>> {
        Box::pin(async { Ok(Vec::new()) })
    }

    fn launch(&self, vm: VmId, _term: Option<u64>) -> BoxFuture<'_, Result<String, BackendError>> {
        Box::pin(async move {
            let port = free_port()?;
            let child = if self.shared {
                ChildProcess::spawn_detached(&self.command, port, &self.spillway_exe)?
            } else {
                ChildProcess::spawn(&self.command, port, &self.spillway_exe)?
            };
            let name = child.instance_name();
            tracing::info!(%vm, instance = %name, "VM process launched");
            self.lock().insert(name.clone(), child);
            Ok(name)
        })
    }

    fn resolve<'a>(
        &'a self,
        instance: &'a str,
    ) -> BoxFuture<'a, Result<Option<Uri>, BackendError>> {
        Box::pin(async move {
            let mut children = self.lock();
            let child = children
                .get_mut(instance)
                .ok_or_else(|| BackendError::UnknownInstance(instance.to_string()))?;
            match child.exited() {
                None => Ok(Some(child.base().clone())),
                Some(status) => Err(BackendError::NotReady {
                    instance: instance.to_string(),
                    reason: format!("process exited ({status})"),
                }),
            }
        })
    }

    fn terminate<'a>(&'a self, instance: &'a str) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(async move {
            let Some(child) = self.lock().remove(instance) else {
                if self.shared && super::process::stop_by_name(instance) {
                    tracing::info!(%instance, "VM process of another replica terminated");
                    return Ok(());
                }
                return Err(BackendError::UnknownInstance(instance.to_string()));
            };
            child.stop().await;
            tracing::info!(%instance, "VM process terminated");
            Ok(())
        })
    }

    fn hand_over(&self) {
        self.hand_over
            .store(true, std::sync::atomic::Ordering::Release);
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let mut children: Vec<ChildProcess> = self.lock().drain().map(|(_, c)| c).collect();
            if self.shared && self.hand_over.load(std::sync::atomic::Ordering::Acquire) {
                tracing::info!(
                    vms = children.len(),
                    "VM processes kept for the replica that takes the pool over"
                );
                return;
            }
            // Signal all first so they die in parallel, then reap one by one.
            for child in &mut children {
                child.start_kill();
            }
            for child in children {
                child.stop().await;
            }
        })
    }

    fn local_pids(&self) -> Vec<u32> {
        self.lock().values().map(ChildProcess::pid).collect()
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::Duration;

    use super::*;
    use crate::net::client::{ClientSettings, UpstreamClient};

    fn cfg(command: &[&str]) -> ProcessVmPoolConfig {
        ProcessVmPoolConfig {
            command: command.iter().map(|s| s.to_string()).collect(),
            health_path: "/".into(),
            boot_timeout_seconds: crate::config::Seconds::from_secs(20),
            probe_interval_seconds: crate::config::Seconds::from_millis(50),
            slots_per_vm: None,
        }
    }

    fn client() -> UpstreamClient {
        UpstreamClient::new(ClientSettings {
            connect_timeout: Duration::from_secs(1),
            idle_timeout: Duration::from_secs(5),
        })
    }

    fn gone(pid: &str) -> bool {
        !Path::new(&format!("/proc/{pid}")).exists()
    }

    #[tokio::test]
    async fn launch_resolve_probe_terminate() {
        let pool = ProcessVmPool::new(
            &cfg(&[
                "sh",
                "-c",
                "exec python3 -m http.server --bind 127.0.0.1 {port} 2>/dev/null",
            ]),
            PathBuf::from("spillway"),
        );
        assert_eq!((pool.kind(), pool.executes_scaling()), ("process", true));
        assert_eq!(pool.readiness().boot_timeout, Duration::from_secs(20));
        assert_eq!(pool.readiness().probe_interval, Duration::from_millis(50));
        assert!(pool.adopt().await.unwrap().is_empty());

        let name = pool.launch(VmId(1), None).await.unwrap();
        let (pid, port) = name
            .strip_prefix("pid-")
            .and_then(|s| s.split_once("@127.0.0.1:"))
            .expect("pid-PID@127.0.0.1:PORT");
        let base = pool.resolve(&name).await.unwrap().unwrap();
        assert_eq!(base.to_string(), format!("http://127.0.0.1:{port}/"));

        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while !client().probe(&base, "/").await {
            assert!(tokio::time::Instant::now() < deadline, "never became ready");
            tokio::time::sleep(pool.readiness().probe_interval).await;
        }
        pool.terminate(&name).await.unwrap();
        assert!(gone(pid), "killed and reaped");
        assert!(pool.is_empty());
        assert!(matches!(
            pool.terminate(&name).await,
            Err(BackendError::UnknownInstance(_))
        ));
        assert!(matches!(
            pool.resolve(&name).await,
            Err(BackendError::UnknownInstance(_))
        ));
    }

    #[tokio::test]
    async fn resolve_fails_once_the_child_exited() {
        let pool = ProcessVmPool::new(&cfg(&["sh", "-c", "exit 0 # {port}"]), PathBuf::from("x"));
        let name = pool.launch(VmId(1), None).await.unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            match pool.resolve(&name).await {
                Err(BackendError::NotReady { reason, .. }) => {
                    assert!(reason.contains("exited"), "{reason}");
                    break;
                }
                Ok(Some(_)) => {
                    assert!(tokio::time::Instant::now() < deadline, "child never exited");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        pool.terminate(&name).await.unwrap();
    }

    #[tokio::test]
    async fn launch_of_a_missing_program_fails_and_shutdown_stops_all() {
        let pool = ProcessVmPool::new(&cfg(&["/nonexistent/vm", "{port}"]), PathBuf::from("x"));
        assert!(matches!(
            pool.launch(VmId(1), None).await,
            Err(BackendError::Spawn { .. })
        ));

        let pool = ProcessVmPool::new(
            &cfg(&["sh", "-c", "exec sleep 30 # {port}"]),
            PathBuf::from("x"),
        );
        let a = pool.launch(VmId(1), None).await.unwrap();
        let b = pool.launch(VmId(2), None).await.unwrap();
        assert_ne!(a, b);
        assert_eq!(pool.len(), 2);
        pool.shutdown().await;
        assert!(pool.is_empty());
        for name in [a, b] {
            let pid = name
                .strip_prefix("pid-")
                .and_then(|s| s.split_once('@'))
                .unwrap()
                .0;
            assert!(gone(pid), "{name} reaped");
        }
    }
}
