//! Instance boots: the calls that wait for a booting pre-warmed function instance
//! (FaaSim §3: pre-warm, a warm start on an instance still starting), and a VM's boot
//! after its launch — address resolution, then the readiness probe (LIBRA §III: a VM
//! takes requests, and adds to the budget, only once ready).
//!
//! `BootWaits` lives under the driver's one lock beside the policy core, so that a
//! call's claim of a booting instance (a core decision) and its wait are registered
//! together; `await_vm_ready` runs in the VM's launch task, outside the lock.

use std::collections::HashMap;

use http::Uri;
use tokio::sync::oneshot;

use crate::backends::{ReadinessSettings, VmProvider};
use crate::net::client::UpstreamClient;
use crate::policy::core::Core;
use crate::policy::functions::InstanceId;
use crate::policy::placement::ZoneId;
use crate::policy::{Time, VmId};

/// A claimed pre-warmed instance's boot, seen by the call that waits for it.
#[derive(Debug)]
enum BootWait {
    /// The call waits: `true` once the instance is ready, `false` if its boot failed.
    Waiting(oneshot::Sender<bool>),
    /// The boot failed before the call started waiting.
    Failed,
}

/// Calls waiting for a booting pre-warmed instance they claimed
/// ([`Start::Booting`](crate::policy::placement::Start)), or the failure of that boot
/// when it came first, per (zone, instance).
#[derive(Debug, Default)]
pub(super) struct BootWaits {
    waits: HashMap<(ZoneId, InstanceId), BootWait>,
}

/// Where a call's wait for a claimed booting instance stands ([`BootWaits::wait`]).
pub(super) enum Boot {
    /// Known now: `true` when the instance is ready (busy with the call), `false` when
    /// its boot failed.
    Done(bool),
    /// Still booting: the boot's outcome arrives here.
    Pending(oneshot::Receiver<bool>),
}

impl Boot {
    /// The boot's outcome: `true` ready, `false` failed (or the gateway went away).
    pub(super) async fn outcome(self) -> bool {
        match self {
            Boot::Done(ready) => ready,
            Boot::Pending(rx) => rx.await.unwrap_or(false),
        }
    }
}

impl BootWaits {
    /// A call that claimed `instance` of `zone` waits for its boot: settled at once when
    /// the boot already failed or the core no longer counts it as starting.
    pub(super) fn wait(&mut self, core: &Core, zone: ZoneId, instance: InstanceId) -> Boot {
        if let Some(BootWait::Failed) = self.waits.remove(&(zone, instance)) {
            return Boot::Done(false);
        }
        if !core.placement().is_starting(zone, instance) {
            return Boot::Done(true);
        }
        let (tx, rx) = oneshot::channel();
        self.waits.insert((zone, instance), BootWait::Waiting(tx));
        Boot::Pending(rx)
    }

    /// The pre-warmed `instance` of `zone` is ready: the core counts it started and the
    /// call waiting for it (if any) goes on.
    pub(super) fn started(
        &mut self,
        core: &mut Core,
        now: Time,
        zone: ZoneId,
        instance: InstanceId,
    ) {
        core.on_instance_started(now, zone, instance);
        if let Some(BootWait::Waiting(tx)) = self.waits.remove(&(zone, instance)) {
            let _ = tx.send(true);
        }
    }

    /// The pre-warmed `instance` of `zone` failed to start. A call that claimed it fails
    /// its attempt (the core forgets the instance then, once), now or when it starts
    /// waiting; otherwise the core forgets it now.
    pub(super) fn failed(
        &mut self,
        core: &mut Core,
        now: Time,
        zone: ZoneId,
        instance: InstanceId,
    ) {
        if core.placement().is_claimed_booting(zone, instance) {
            match self.waits.remove(&(zone, instance)) {
                Some(BootWait::Waiting(tx)) => {
                    let _ = tx.send(false);
                }
                _ => {
                    self.waits.insert((zone, instance), BootWait::Failed);
                }
            }
        } else {
            self.waits.remove(&(zone, instance));
            core.on_instance_failed(now, zone, instance);
        }
    }
}

/// A launched VM's boot: resolve `instance`'s address, then probe its health path every
/// `readiness.probe_interval` until it answers 2xx. Gives up as soon as `still_booting`
/// says the core no longer counts the VM as booting (its boot deadline passed, or a
/// scale-in cancelled it).
///
/// # Errors
/// Why the VM did not become ready (a resolution error, the instance went away, given up).
pub(super) async fn await_vm_ready(
    provider: &dyn VmProvider,
    client: &UpstreamClient,
    readiness: &ReadinessSettings,
    instance: &str,
    still_booting: impl Fn() -> bool,
) -> Result<Uri, String> {
    let cancelled = || "given up by the policy core (boot deadline or scale-in)".to_string();
    let base = loop {
        match provider.resolve(instance).await {
            Ok(Some(base)) => break base,
            Ok(None) => {}
            Err(e) => return Err(e.to_string()),
        }
        if !still_booting() {
            return Err(cancelled());
        }
        tokio::time::sleep(readiness.probe_interval).await;
    };
    loop {
        if client.probe(&base, &readiness.health_path).await {
            return Ok(base);
        }
        if let Ok(None) | Err(_) = provider.resolve(instance).await.map(|b| b.map(|_| ())) {
            return Err("instance went away during boot".into());
        }
        if !still_booting() {
            return Err(cancelled());
        }
        tokio::time::sleep(readiness.probe_interval).await;
    }
}

/// Whether `core` still counts `vm` as booting (not given up, not stopped).
pub(super) fn still_booting(core: &Core, vm: VmId) -> bool {
    core.controller()
        .vms()
        .get(vm)
        .is_some_and(|r| r.state == crate::policy::balancer::VmState::Booting)
}
