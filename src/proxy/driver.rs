//! The live driver: runs the sans-IO [`Controller`] on tokio's clock and executes its
//! actions through the backend providers.
//!
//! * `now` is `tokio::time::Instant::now() - origin`, so `tokio::time::pause()` drives
//!   the policy in tests exactly as it drives timers.
//! * The timer task sleeps until [`Controller::poll_timeout`] (the end of the epoch),
//!   calls [`Controller::handle_timeout`], and executes the resulting actions.
//! * Request handlers call [`Gateway::route`] / [`Gateway::finish_vm_request`]; actions
//!   those produce (a drained VM becoming idle → stop) run at once.
//! * A launch runs as its own task: provider launch → address resolution → readiness
//!   probe, bounded by the pool's boot timeout; success reports `on_vm_ready`, failure
//!   terminates what was started and reports `on_vm_failed`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use http::Uri;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::backends::{FunctionTier, ReadinessSettings, VmProvider};
use crate::policy::balancer::{Attempt, RequestMeta, Route, VmState};
use crate::policy::controller::{Action, Controller, ControllerStatus};
use crate::policy::scaling::ScaleDecision;
use crate::policy::{Time, VmId};

use crate::net::client::UpstreamClient;
use crate::telemetry as m;

/// Where a VM lives, once known.
#[derive(Clone, Debug, Default)]
struct VmRecord {
    instance: Option<String>,
    base: Option<Uri>,
}

struct State {
    controller: Controller,
    records: HashMap<VmId, VmRecord>,
    last_decision: Option<(u64, ScaleDecision)>,
}

/// Shared state of a running gateway: the controller, the VM address book and the
/// backends. Cheap to share as `Arc<Gateway>`.
pub struct Gateway {
    me: Weak<Gateway>,
    state: Mutex<State>,
    origin: Instant,
    wake: Notify,
    vm_provider: Arc<dyn VmProvider>,
    functions: Arc<dyn FunctionTier>,
    client: UpstreamClient,
    readiness: ReadinessSettings,
    cip_rps: f64,
}

/// A VM chosen for a request: its id and base URL.
#[derive(Clone, Debug)]
pub struct VmTarget {
    /// Controller id.
    pub vm: VmId,
    /// Base URL.
    pub base: Uri,
}

impl Gateway {
    /// A gateway around `controller` (not started yet).
    pub fn new(
        controller: Controller,
        vm_provider: Arc<dyn VmProvider>,
        functions: Arc<dyn FunctionTier>,
        client: UpstreamClient,
        readiness: ReadinessSettings,
        cip_rps: f64,
    ) -> Arc<Self> {
        Arc::new_cyclic(|me| Self {
            me: me.clone(),
            state: Mutex::new(State {
                controller,
                records: HashMap::new(),
                last_decision: None,
            }),
            origin: Instant::now(),
            wake: Notify::new(),
            vm_provider,
            functions,
            client,
            readiness,
            cip_rps,
        })
    }

    /// Time since the gateway's origin: the policy clock.
    pub fn now(&self) -> Time {
        Instant::now().saturating_duration_since(self.origin)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock must not take the data plane down with it.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The function tier.
    pub fn functions(&self) -> &Arc<dyn FunctionTier> {
        &self.functions
    }

    /// The upstream client.
    pub fn client(&self) -> &UpstreamClient {
        &self.client
    }

    /// The VM provider.
    pub fn vm_provider(&self) -> &Arc<dyn VmProvider> {
        &self.vm_provider
    }

    /// The cost-indifference point in force, requests/s.
    pub fn cip_rps(&self) -> f64 {
        self.cip_rps
    }

    /// Adopt existing VMs, apply the initial scaling decision and start the timer task.
    ///
    /// # Errors
    /// The provider's adoption error (e.g. an unparsable static URL).
    pub async fn start(self: &Arc<Self>) -> Result<(), crate::backends::BackendError> {
        let adopted = self.vm_provider.adopt().await?;
        {
            let mut st = self.lock();
            let now = self.now();
            for (instance, base) in adopted {
                let vm = st.controller.adopt_ready_vm(now);
                tracing::info!(%vm, %instance, %base, "adopted VM");
                st.records.insert(
                    vm,
                    VmRecord {
                        instance: Some(instance),
                        base: Some(base),
                    },
                );
            }
            st.controller.start(now);
        }
        self.pump();
        let me = Arc::clone(self);
        tokio::spawn(async move { me.timer_loop().await });
        Ok(())
    }

    async fn timer_loop(self: Arc<Self>) {
        loop {
            let deadline = {
                let mut st = self.lock();
                st.controller.handle_timeout(self.now());
                st.controller.poll_timeout()
            };
            self.pump();
            self.export_gauges();
            tokio::select! {
                _ = tokio::time::sleep_until(self.origin + deadline) => {}
                _ = self.wake.notified() => {}
            }
        }
    }

    /// Route one attempt; a VM route comes with the VM's base URL.
    pub fn route(&self, req: &RequestMeta, attempt: Attempt) -> (Route, Option<VmTarget>) {
        let (route, target) = {
            let mut st = self.lock();
            let route = st.controller.route(self.now(), req, attempt);
            let target = match route {
                Route::Vm { vm, .. } => st
                    .records
                    .get(&vm)
                    .and_then(|r| r.base.clone())
                    .map(|base| VmTarget { vm, base }),
                _ => None,
            };
            (route, target)
        };
        if let Route::Vm { vm, .. } = route
            && target.is_none()
        {
            // Ready in the controller but without an address: cannot happen (ready is
            // reported only after resolution); release the slot defensively.
            tracing::error!(%vm, "ready VM without an address");
            self.finish_vm_request(vm);
        }
        self.pump();
        (route, target)
    }

    /// A request sent to `vm` finished (response body done, or failed).
    pub fn finish_vm_request(&self, vm: VmId) {
        self.lock()
            .controller
            .on_vm_request_finished(self.now(), vm);
        self.pump();
    }

    /// A ready VM refused a connection: probe it in the background and drop it from the
    /// pool if the probe fails too.
    pub fn suspect_vm(self: &Arc<Self>, target: &VmTarget) {
        let me = Arc::clone(self);
        let target = target.clone();
        tokio::spawn(async move {
            if !me
                .client
                .probe(&target.base, &me.readiness.health_path)
                .await
            {
                tracing::warn!(vm = %target.vm, base = %target.base, "VM failed its probe after a connect failure; replacing it");
                m::vm_failures("unreachable");
                let instance: Option<String> = {
                    let mut st = me.lock();
                    st.controller.on_vm_failed(me.now(), target.vm);
                    st.records.remove(&target.vm).and_then(|r| r.instance)
                };
                if let Some(instance) = instance {
                    let _ = me.vm_provider.terminate(&instance).await;
                }
                me.pump();
            }
        });
    }

    /// A snapshot for `/status`.
    pub fn status(&self) -> GatewayStatus {
        let st = self.lock();
        let vms = st
            .controller
            .vms()
            .rows()
            .iter()
            .map(|r| VmView {
                id: r.id.to_string(),
                state: match r.state {
                    VmState::Booting => "booting",
                    VmState::Ready => "ready",
                    VmState::Draining => "draining",
                },
                outstanding: r.outstanding,
                instance: st.records.get(&r.id).and_then(|x| x.instance.clone()),
                url: st
                    .records
                    .get(&r.id)
                    .and_then(|x| x.base.as_ref().map(|b| b.to_string())),
            })
            .collect();
        GatewayStatus {
            controller: st.controller.status(),
            last_decision: st.last_decision,
            vms,
        }
    }

    /// Drain the controller's actions and execute them.
    fn pump(&self) {
        let actions: Vec<Action> = {
            let mut st = self.lock();
            std::iter::from_fn(|| st.controller.poll_action()).collect()
        };
        for action in actions {
            self.execute(action);
        }
    }

    fn execute(&self, action: Action) {
        match action {
            Action::Decided {
                epoch,
                decision,
                direction,
            } => {
                m::scale_decision(direction.as_str());
                tracing::info!(
                    epoch,
                    target_vms = decision.target_vms,
                    vm_reqs_rps = decision.vm_reqs_rps,
                    reason = decision.reason.as_str(),
                    direction = direction.as_str(),
                    "scaling decision"
                );
                self.lock().last_decision = Some((epoch, decision));
            }
            Action::Launch { vm } => {
                tracing::info!(%vm, "launching VM");
                let provider = Arc::clone(&self.vm_provider);
                let this = self.self_arc();
                tokio::spawn(async move { this.launch(provider, vm).await });
            }
            Action::Drain { vm } => tracing::info!(%vm, "draining VM"),
            Action::Stop { vm } => {
                let instance: Option<String> =
                    self.lock().records.remove(&vm).and_then(|r| r.instance);
                tracing::info!(%vm, instance = instance.as_deref().unwrap_or("-"), "stopping VM");
                if let Some(instance) = instance {
                    let provider = Arc::clone(&self.vm_provider);
                    tokio::spawn(async move {
                        if let Err(e) = provider.terminate(&instance).await {
                            tracing::warn!(%instance, error = %e, "terminate failed");
                        }
                    });
                }
            }
        }
    }

    fn self_arc(&self) -> Arc<Self> {
        // Gateways only exist inside the Arc built by `new`, which outlives every call.
        self.me
            .upgrade()
            .expect("the gateway is alive while its methods run")
    }

    async fn launch(self: Arc<Self>, provider: Arc<dyn VmProvider>, vm: VmId) {
        self.lock().records.insert(vm, VmRecord::default());
        let started = Instant::now();
        let deadline = started + self.readiness.boot_timeout;
        let instance = match provider.launch(vm).await {
            Ok(instance) => instance,
            Err(e) => {
                tracing::warn!(%vm, error = %e, "VM launch failed");
                m::vm_failures("launch");
                self.fail(vm);
                return;
            }
        };
        let cancelled = {
            let mut st = self.lock();
            let known = st.controller.vms().get(vm).is_some();
            if known {
                if let Some(r) = st.records.get_mut(&vm) {
                    r.instance = Some(instance.clone());
                }
            } else {
                st.records.remove(&vm);
            }
            !known
        };
        if cancelled {
            // Stopped by a scale-in while the launch was in flight.
            let _ = provider.terminate(&instance).await;
            return;
        }
        let outcome = self.await_ready(&*provider, &instance, deadline).await;
        let ready = {
            let mut st = self.lock();
            let known = st.controller.vms().get(vm).is_some();
            match &outcome {
                Ok(base) if known => {
                    if let Some(r) = st.records.get_mut(&vm) {
                        r.base = Some(base.clone());
                    }
                    st.controller.on_vm_ready(self.now(), vm);
                    true
                }
                _ => {
                    st.controller.on_vm_failed(self.now(), vm);
                    st.records.remove(&vm);
                    false
                }
            }
        };
        match (&outcome, ready) {
            (Ok(base), true) => {
                m::vm_boot_seconds(started.elapsed());
                tracing::info!(%vm, %instance, %base, boot_ms = started.elapsed().as_millis() as u64, "VM ready");
            }
            _ => {
                if let Err(e) = &outcome {
                    tracing::warn!(%vm, %instance, error = %e, "VM did not become ready; terminating it");
                    m::vm_failures("not_ready");
                }
                let _ = provider.terminate(&instance).await;
            }
        }
        self.pump();
    }

    async fn await_ready(
        &self,
        provider: &dyn VmProvider,
        instance: &str,
        deadline: Instant,
    ) -> Result<Uri, String> {
        let base = loop {
            match provider.resolve(instance).await {
                Ok(Some(base)) => break base,
                Ok(None) => {}
                Err(e) => return Err(e.to_string()),
            }
            if Instant::now() >= deadline {
                return Err("no address before the boot timeout".into());
            }
            tokio::time::sleep(self.readiness.probe_interval).await;
        };
        loop {
            if self.client.probe(&base, &self.readiness.health_path).await {
                return Ok(base);
            }
            if let Ok(None) | Err(_) = provider.resolve(instance).await.map(|b| b.map(|_| ())) {
                return Err("instance went away during boot".into());
            }
            if Instant::now() >= deadline {
                return Err("readiness probe did not pass before the boot timeout".into());
            }
            tokio::time::sleep(self.readiness.probe_interval).await;
        }
    }

    fn fail(&self, vm: VmId) {
        {
            let mut st = self.lock();
            st.controller.on_vm_failed(self.now(), vm);
            st.records.remove(&vm);
        }
        self.pump();
    }

    fn export_gauges(&self) {
        let s = self.lock().controller.status();
        m::controller_gauges(&s);
    }

    /// Stop every VM and function instance (gateway shutdown).
    pub async fn shutdown_backends(&self) {
        self.functions.shutdown().await;
        self.vm_provider.shutdown().await;
    }
}

/// One VM in `/status`.
#[derive(Clone, Debug, serde::Serialize)]
pub struct VmView {
    /// Controller id (`vm-3`).
    pub id: String,
    /// `booting`, `ready` or `draining`.
    pub state: &'static str,
    /// Requests in flight on it.
    pub outstanding: u32,
    /// Provider-side name.
    pub instance: Option<String>,
    /// Base URL once resolved.
    pub url: Option<String>,
}

/// What `/status` shows.
#[derive(Clone, Debug)]
pub struct GatewayStatus {
    /// The controller's snapshot.
    pub controller: ControllerStatus,
    /// The last scaling decision and the epoch that triggered it.
    pub last_decision: Option<(u64, ScaleDecision)>,
    /// Every VM.
    pub vms: Vec<VmView>,
}
