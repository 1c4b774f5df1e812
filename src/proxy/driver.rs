//! The live driver: runs the sans-IO policy [`Core`] on tokio's clock and executes its
//! actions through the backend providers.
//!
//! * `now` is `tokio::time::Instant::now() - origin`, so `tokio::time::pause()` drives
//!   the policy in tests exactly as it drives timers.
//! * One timer task sleeps until [`Core::poll_timeout`] — the earliest deadline of the
//!   timer table (epoch end, VM boot deadline, keep-alive expiry) — calls
//!   [`Core::handle_timeout`] and executes the resulting actions. After every other call
//!   into the core the driver re-reads the deadline and wakes the timer task when it
//!   moved earlier (a call that ends opens a keep-alive window shorter than the epoch).
//! * Request handlers run the attempt protocol: [`Gateway::route`],
//!   [`Gateway::attempt_failed`], [`Gateway::finish_vm_request`] (or
//!   [`Gateway::finish_vm_request_sent_at`], which also hands the attempt's response time
//!   to the adaptive r_max controller) and [`Gateway::finish_function`]; a cold start runs
//!   through [`Gateway::cold_start`].
//! * A VM launch runs as its own task: provider launch → address resolution → readiness
//!   probe. Its deadline is the core's ([`Action::VmBootTimedOut`]); success reports
//!   `on_vm_ready`, failure terminates what was started and reports `on_vm_failed`.
//! * Function instances start for pre-warm ([`Action::StartInstance`]) or a cold start,
//!   and stop at keep-alive expiry ([`Action::StopInstance`]) or when they died.

use parking_lot::{Mutex, MutexGuard};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use http::{Request, Response, Uri};
use hyper::body::Incoming;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::billing::Billing;
use super::boots::{self, BootWaits};
use super::error::ProxyError;
use super::status::GatewayStatus;
use super::vm_book::{HealthMarks, VmBook, VmTarget};
use super::waiters::{QueueOutcome, QueueWait, Waiters};
use crate::backends::Recovered;
use crate::backends::function_process::COLD_STARTS_METRIC;
use crate::backends::{BackendError, BoxFuture, FunctionTier, ReadinessSettings, VmProvider};
use crate::coord::{Coordinator, Host, Intent, Permit, PoolFence, RegistryVm, Replayed};
use crate::net::body::Body;
use crate::net::client::UpstreamClient;
use crate::policy::attempt::{Decision, Failure, Ticket};
use crate::policy::balancer::{RouteReason, VmState};
use crate::policy::controller;
use crate::policy::core::{Action, Core, Release};
use crate::policy::delay::CallId;
use crate::policy::functions::InstanceId;
use crate::policy::placement::{Lease, ZoneId};
use crate::policy::routes::KeyId;
use crate::policy::scaling::ScaleDecision;
use crate::policy::{Time, VmId};
use crate::telemetry as m;

struct State {
    core: Core,
    /// Where each VM lives, the parked `static` members, the suspect probes.
    book: VmBook,
    last_decision: Option<(u64, ScaleDecision)>,
    /// End of the last adaptive r_max period logged.
    r_max_logged: Option<Time>,
    /// Requests waiting in the gateway queue (call scheduling §4), registered in the
    /// same lock as the decision that queued them.
    waiters: Waiters,
    /// Calls waiting for a booting pre-warmed instance they claimed; registered in the
    /// same lock as the core's state.
    boots: BootWaits,
}

/// How often the driver takes the provider's pool changes
/// ([`VmProvider::take_pool_changes`]: instances the EC2 audit adopted or found gone).
pub const POOL_CHANGES_INTERVAL: Duration = Duration::from_secs(1);

/// What the asynchronous-call front end does with one request
/// ([`AsyncFrontEnd::intercept`]).
#[expect(
    clippy::large_enum_variant,
    reason = "the request passes through once per request; boxing it would allocate on the synchronous path"
)]
pub enum Intercepted<'a> {
    /// Not a status URL and not an asynchronous call: the synchronous path serves it.
    Pass(Request<Incoming>),
    /// A status lookup or an asynchronous call: the front end's answer (the `202`, the
    /// status JSON, the stored result) or the error to answer instead.
    Answer(BoxFuture<'a, Result<Response<Body>, ProxyError>>),
}

/// The asynchronous-call front end (ProFaaStinate §3) as the gateway sees it: the
/// request path hands it every checked request, the driver its released calls and its
/// CPU samples, `/status` its two reports. Implemented by
/// `crate::proxy::async_calls::front::AsyncCalls`; held here as a trait object so that
/// the driver and the request path do not depend on the front end that depends on them.
pub trait AsyncFrontEnd: Send + Sync {
    /// The path prefix of status URLs (`async.status_prefix`), hidden from access logs.
    fn status_prefix(&self) -> &str;

    /// Classify `req` (after the local checks) and, for a status URL or an asynchronous
    /// call, answer it: the call is stored and queued before its `202`.
    fn intercept<'a>(
        self: Arc<Self>,
        gw: &'a Arc<Gateway>,
        req: Request<Incoming>,
        peer: std::net::SocketAddr,
        scheme: &'static str,
    ) -> Intercepted<'a>;

    /// The delay queue scheduler's CPU signal: the VM pool's utilisation in `[0, 1]`.
    fn cpu_signal(&self, gw: &Gateway) -> f64;

    /// Run one call the core released through the attempt protocol and store its
    /// outcome; the driver spawns the returned future.
    fn release(self: Arc<Self>, gw: Arc<Gateway>, rel: Release) -> BoxFuture<'static, ()>;

    /// `/status` `async.cpu_signal`: the configured source, the one in use, its errors.
    fn cpu_signal_status(&self) -> serde_json::Value;

    /// `/status` `async.store`: what the store holds against its bounds.
    fn store_status(&self) -> serde_json::Value;
}

/// Shared state of a running gateway: the policy core, the VM address book and the
/// backends. Cheap to share as `Arc<Gateway>`.
pub struct Gateway {
    me: Weak<Gateway>,
    state: Mutex<State>,
    origin: Instant,
    wake: Notify,
    /// The deadline the timer task sleeps until, ns since `origin` (`u64::MAX`: none).
    armed: AtomicU64,
    vm_provider: Arc<dyn VmProvider>,
    /// One backend per placement zone, in zone order.
    zones: Vec<Arc<dyn FunctionTier>>,
    client: UpstreamClient,
    readiness: ReadinessSettings,
    cip_rps: f64,
    /// Asynchronous calls (ProFaaStinate §3), when enabled.
    async_calls: std::sync::OnceLock<Arc<dyn AsyncFrontEnd>>,
    /// Several replicas (`crate::coord`): the coordinator, which fences every pool
    /// write and whose snapshot `/status` shows.
    coordinator: std::sync::OnceLock<Arc<Coordinator>>,
    /// Span export (`telemetry.otlp`), when on.
    trace_exporter: std::sync::OnceLock<Arc<crate::trace_export::Exporter>>,
    /// The running bill, once a meter is set.
    billing: Billing,
}

impl State {
    /// Adopt `instance` at `base` as a ready VM of the core and of the address book
    /// (`foreign`: another replica's, from the leader's registry). Returns its id.
    fn adopt_ready(&mut self, now: Time, instance: String, base: Uri, foreign: bool) -> VmId {
        self.book
            .adopt_ready(&mut self.core, now, instance, base, foreign)
    }
}

impl Gateway {
    /// A gateway around `core` (not started yet). `zones` are the function backends in
    /// the order of the core's placement zones.
    pub fn new(
        core: Core,
        vm_provider: Arc<dyn VmProvider>,
        zones: Vec<Arc<dyn FunctionTier>>,
        client: UpstreamClient,
        readiness: ReadinessSettings,
        cip_rps: f64,
    ) -> Arc<Self> {
        Self::new_at(
            core,
            vm_provider,
            zones,
            client,
            readiness,
            cip_rps,
            Instant::now(),
        )
    }

    /// [`Self::new`] with policy time zero at `origin` (several replicas align their
    /// epochs on the store's clock: `crate::coord::align`).
    pub fn new_at(
        core: Core,
        vm_provider: Arc<dyn VmProvider>,
        zones: Vec<Arc<dyn FunctionTier>>,
        client: UpstreamClient,
        readiness: ReadinessSettings,
        cip_rps: f64,
        origin: Instant,
    ) -> Arc<Self> {
        Arc::new_cyclic(|me| Self {
            me: me.clone(),
            state: Mutex::new(State {
                core,
                book: VmBook::default(),
                last_decision: None,
                r_max_logged: None,
                waiters: Waiters::default(),
                boots: BootWaits::default(),
            }),
            origin,
            wake: Notify::new(),
            armed: AtomicU64::new(u64::MAX),
            vm_provider,
            zones,
            client,
            readiness,
            cip_rps,
            async_calls: std::sync::OnceLock::new(),
            coordinator: std::sync::OnceLock::new(),
            trace_exporter: std::sync::OnceLock::new(),
            billing: Billing::default(),
        })
    }

    /// The running bill (`/status` `cost`, `spillway_cost_*` metrics); set its meter
    /// with [`Billing::set_meter`].
    pub fn billing(&self) -> &Billing {
        &self.billing
    }

    /// Run under `c` (set once, after [`Self::start`]): every pool write asks its
    /// fence first, `/status` shows its snapshot.
    pub fn set_coordinator(&self, c: Arc<Coordinator>) {
        let _ = self.coordinator.set(c);
    }

    /// The coordinator, under `coordination: {type: redis}`.
    pub fn coordinator(&self) -> Option<&Arc<Coordinator>> {
        self.coordinator.get()
    }

    /// Whether the pool write `op` on `vm` may be made: always for one gateway
    /// (`Some(None)`); under coordination only when the fenced intent was recorded
    /// ([`PoolFence::permit`]: `Some(Some(permit))`, to settle once the write is made,
    /// [`Self::pool_written`]). `None`: do not make it.
    async fn pool_write(
        &self,
        op: &'static str,
        vm: VmId,
        instance: Option<&str>,
    ) -> Option<Option<Permit>> {
        match self.coordinator.get() {
            None => Some(None),
            Some(c) => {
                let permit = c.permit(op, vm, instance).await;
                if permit.is_none() {
                    tracing::warn!(%vm, instance = instance.unwrap_or("-"), op, "pool write not made: this replica is not the fenced leader");
                }
                permit.map(Some)
            }
        }
    }

    /// The write a [`Self::pool_write`] allowed was made: its intent is settled.
    async fn pool_written(&self, permit: Option<Permit>) {
        if let (Some(c), Some(p)) = (self.coordinator.get(), permit) {
            c.settle(&p).await;
        }
    }

    /// Export spans through `e` (set once, before serving).
    pub fn set_trace_exporter(&self, e: Arc<crate::trace_export::Exporter>) {
        let _ = self.trace_exporter.set(e);
    }

    /// The span exporter, under `telemetry.otlp`.
    pub fn trace_exporter(&self) -> Option<&Arc<crate::trace_export::Exporter>> {
        self.trace_exporter.get()
    }

    /// Serve asynchronous calls through `a` (set once, before [`Self::start`]).
    pub fn set_async_calls(&self, a: Arc<dyn AsyncFrontEnd>) {
        let _ = self.async_calls.set(a);
    }

    /// The asynchronous-call front end, when enabled.
    pub fn async_calls(&self) -> Option<&Arc<dyn AsyncFrontEnd>> {
        self.async_calls.get()
    }

    /// Calls waiting in the delay queue.
    pub fn async_queued(&self) -> usize {
        self.lock().core.delay_queue().map_or(0, |q| q.len())
    }

    /// Queue an accepted asynchronous call in the core's delay queue.
    pub fn enqueue_async(&self, id: CallId, deadline: Time, accepted_at: Time) {
        self.with_core(|core, now| {
            core.enqueue_async(now, id, deadline, accepted_at);
        });
    }

    /// A released asynchronous call finished (deadline misses, `E[p]`).
    pub fn async_finished(&self, deadline: Time, processing: Duration) {
        self.with_core(|core, now| core.on_async_finished(now, deadline, processing));
    }

    /// Requests in flight on ready VMs ÷ (ready VMs × `slots`), 0–1: the `outstanding`
    /// CPU signal (0 with no ready VM).
    pub fn outstanding_share(&self, slots: u32) -> f64 {
        let st = self.lock();
        let (n, busy) = st
            .core
            .controller()
            .vms()
            .rows()
            .iter()
            .filter(|r| r.state == VmState::Ready)
            .fold((0u64, 0u64), |(n, b), r| {
                (n + 1, b + u64::from(r.outstanding))
            });
        if n == 0 {
            return 0.0;
        }
        (busy as f64 / (n * u64::from(slots.max(1))) as f64).min(1.0)
    }

    /// The base URLs of the ready VMs (the `prometheus` CPU signal scrapes each one's
    /// host's node_exporter).
    pub fn ready_vm_bases(&self) -> Vec<Uri> {
        let st = self.lock();
        st.book
            .ready_targets(&st.core)
            .into_iter()
            .map(|t| t.base)
            .collect()
    }

    /// The VM address of a released call's VM decision.
    pub fn vm_target(&self, vm: VmId) -> Option<VmTarget> {
        self.lock().book.target(vm)
    }

    /// [`Action::SampleCpu`]: measure and report the delay queue's CPU signal.
    fn sample_cpu(&self) {
        let u = match self.async_calls() {
            Some(a) => a.cpu_signal(self),
            None => self.outstanding_share(1),
        };
        self.with_core(|core, now| core.on_cpu_sample(now, u));
    }

    /// Time since the gateway's origin: the policy clock.
    pub fn now(&self) -> Time {
        Instant::now().saturating_duration_since(self.origin)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock must not take the data plane down with it.
        self.state.lock()
    }

    /// Run `f` on the core, then wake the timer task if the next deadline moved earlier
    /// and execute the actions the call produced.
    fn with_core<R>(&self, f: impl FnOnce(&mut Core, Time) -> R) -> R {
        let r = {
            let mut st = self.lock();
            let now = self.now();
            let r = f(&mut st.core, now);
            self.rearm(st.core.poll_timeout());
            r
        };
        self.pump();
        r
    }

    /// Wake the timer task when `deadline` is earlier than the one it sleeps until.
    fn rearm(&self, deadline: Time) {
        let ns = u64::try_from(deadline.as_nanos()).unwrap_or(u64::MAX);
        if self.armed.fetch_min(ns, Ordering::AcqRel) > ns {
            self.wake.notify_one();
        }
    }

    /// The name of `zone` (for the access log).
    pub fn zone_name(&self, zone: ZoneId) -> String {
        self.lock().core.placement().zone(zone).name.clone()
    }

    /// The backend of function zone `zone`.
    ///
    /// # Panics
    /// When `zone` is not one of the core's zones (the core only hands out its own).
    pub fn zone_backend(&self, zone: ZoneId) -> &Arc<dyn FunctionTier> {
        &self.zones[zone.0 as usize]
    }

    /// Every function backend, in zone order.
    pub fn zone_backends(&self) -> &[Arc<dyn FunctionTier>] {
        &self.zones
    }

    /// The upstream client.
    pub fn client(&self) -> &UpstreamClient {
        &self.client
    }

    /// The VM provider.
    pub fn vm_provider(&self) -> &Arc<dyn VmProvider> {
        &self.vm_provider
    }

    /// The cost-indifference point in force, requests/s (the one the scaling policy
    /// uses; a reload may change it).
    pub fn cip_rps(&self) -> f64 {
        self.lock()
            .core
            .tuning()
            .map_or(self.cip_rps, |t| t.scaling.cip_rps)
    }

    /// Use new LIBRA parameters from now on, keeping every in-flight state (a
    /// configuration reload; `Core::retune`). `false`: the core's
    /// policies have no such parameters and nothing changed.
    pub fn retune(&self, tuning: &controller::LibraTuning) -> bool {
        self.with_core(|core, now| core.retune(now, tuning))
    }

    /// Adopt existing VMs, apply the initial scaling decision, start pre-warmed instances
    /// and the timer task.
    ///
    /// # Errors
    /// The provider's adoption error (e.g. an unparsable static URL).
    pub async fn start(self: &Arc<Self>) -> Result<(), BackendError> {
        let adopted = self.vm_provider.adopt().await?;
        {
            let mut st = self.lock();
            let now = self.now();
            for (instance, base) in adopted {
                let vm = st.adopt_ready(now, instance.clone(), base.clone(), false);
                tracing::info!(%vm, %instance, %base, "adopted VM");
            }
            st.core.start(now);
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
                st.core.handle_timeout(self.now());
                let d = st.core.poll_timeout();
                self.armed.store(
                    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX),
                    Ordering::Release,
                );
                d
            };
            self.pump();
            self.export_gauges();
            tokio::select! {
                _ = tokio::time::sleep_until(self.origin + deadline) => {}
                _ = self.wake.notified() => {}
            }
        }
    }

    /// The first decision for a request; a VM decision comes with the VM's base URL.
    /// A [`Decision::Queue`] here is never served: use [`TicketGuard::route`].
    pub fn route(&self, ticket: &mut Ticket) -> (Decision, Option<VmTarget>) {
        self.billing.bill(self.now(), |m, _, now| m.on_arrival(now));
        let (d, _) = self
            .decide(ticket, |core, now, t| Some(core.route(now, t)))
            .expect("route always decides");
        self.with_target(d, ticket)
    }

    /// Run a decision on the core; a [`Decision::Queue`] registers a waiter for the
    /// call in the same lock (so that no [`Action::Dequeued`] can miss it).
    fn decide(
        &self,
        ticket: &mut Ticket,
        f: impl FnOnce(&mut Core, Time, &mut Ticket) -> Option<Decision>,
    ) -> Option<(Decision, Option<QueueWait>)> {
        self.with_core_state(|st, now| {
            let d = f(&mut st.core, now, ticket)?;
            let rx = match (d, ticket.queued()) {
                (Decision::Queue { .. }, Some(id)) => {
                    m::queue_call("queued");
                    Some(st.waiters.register(id))
                }
                (
                    Decision::Reject {
                        reason: RouteReason::QueueFull,
                    },
                    _,
                ) => {
                    m::queue_call("full");
                    None
                }
                _ => None,
            };
            Some((d, rx))
        })
    }

    /// Whether the gateway queue is configured (then requests carry a route key).
    pub fn has_queue(&self) -> bool {
        self.lock().core.has_queue()
    }

    /// The route key of a request ([`Core::route_key`]).
    pub fn route_key(&self, method: &str, path: &str) -> KeyId {
        self.lock().core.route_key(method, path)
    }

    /// A call of `key` that arrived at `arrived` (policy time) and was sent upstream at
    /// `sent` completed now (end of its response body): its processing time (a cold
    /// start excluded) feeds `E[p]`, its response time and stretch the per-key measures.
    pub fn call_completed(&self, key: KeyId, arrived: Time, sent: Instant) {
        let processing = sent.elapsed();
        let mut st = self.lock();
        let response = self.now().saturating_sub(arrived);
        st.core.on_call_completed(key, processing, response);
    }

    /// The current attempt failed: the next decision, or `None` (answer with this
    /// attempt's error).
    pub fn attempt_failed(
        &self,
        ticket: &mut Ticket,
        failure: Failure,
    ) -> Option<(Decision, Option<VmTarget>)> {
        let (d, _) = self.decide(ticket, |core, now, t| {
            core.on_attempt_failed(now, t, failure)
        })?;
        Some(self.with_target(d, ticket))
    }

    fn with_target(&self, d: Decision, ticket: &mut Ticket) -> (Decision, Option<VmTarget>) {
        let Decision::Vm { vm, .. } = d else {
            return (d, None);
        };
        let target = self.lock().book.target(vm);
        if target.is_none() {
            // Ready in the core but without an address: cannot happen (ready is reported
            // only after resolution); release the slot defensively.
            tracing::error!(%vm, "ready VM without an address");
            self.with_core(|core, now| core.finish(now, ticket));
        }
        (d, target)
    }

    /// A request sent to `vm` finished (response body done, or failed).
    pub fn finish_vm_request(&self, vm: VmId) {
        self.with_core(|core, now| core.on_vm_request_finished(now, vm));
    }

    /// A request sent to `vm` at `sent` ended: its response body is done (or was
    /// dropped), or it timed out. Like [`Self::finish_vm_request`], and the elapsed time
    /// is the VM response-time sample of the adaptive r_max controller (LIBRA §III-B), in
    /// the same lock.
    pub fn finish_vm_request_sent_at(&self, vm: VmId, sent: Instant) {
        let latency = sent.elapsed();
        self.billing
            .bill(self.now(), |m, _, now| m.on_vm_call(now, latency));
        self.with_core(|core, now| {
            core.on_vm_response_time(now, latency);
            core.on_vm_request_finished(now, vm);
        });
    }

    /// The function call holding `lease` finished (response body done or dropped).
    pub fn finish_function(&self, lease: Lease) {
        self.with_core(|core, now| core.on_function_finished(now, lease));
    }

    /// Like [`Self::finish_function`] for a call sent at `sent`: its duration so far is
    /// billed to the zone (GB-seconds at 1 ms granularity and a request fee).
    pub fn finish_function_sent_at(&self, lease: Lease, sent: Instant) {
        let duration = sent.elapsed();
        self.billing.bill(self.now(), |m, _, now| {
            m.on_function_call(now, usize::from(lease.zone.0), duration)
        });
        self.finish_function(lease);
    }

    /// A function instance died during a call (abandoned mid-request, unreachable): the
    /// core forgets it and its process is stopped.
    pub fn instance_lost(&self, zone: ZoneId, instance: InstanceId) {
        self.with_core(|core, now| core.on_instance_failed(now, zone, instance));
        let backend = Arc::clone(self.zone_backend(zone));
        tokio::spawn(async move { backend.stop_instance(instance).await });
    }

    /// Cold-start `instance` in `zone` for a call (FaaSim §3). On success the instance is
    /// busy with that call; on failure report
    /// [`NotSentReason::ColdStartFailed`](crate::policy::attempt::NotSentReason) to
    /// [`Self::attempt_failed`].
    ///
    /// # Errors
    /// The backend's start error.
    pub async fn cold_start(&self, zone: ZoneId, instance: InstanceId) -> Result<(), BackendError> {
        metrics::counter!(COLD_STARTS_METRIC).increment(1);
        let t0 = Instant::now();
        let started = self.zone_backend(zone).start_instance(instance).await;
        m::cold_start_seconds(t0.elapsed());
        match &started {
            Ok(()) => self.with_core(|core, now| core.on_instance_started(now, zone, instance)),
            Err(e) => tracing::warn!(error = %e, zone = zone.0, "function cold start failed"),
        }
        started
    }

    /// An attempt on a ready VM failed (connect refused, connection reset before an
    /// answer): mark it suspect at once, so the rest of a burst is routed to other VMs
    /// as first attempts, and probe it in the background — dead: dropped from the pool
    /// (its pooled connections are not used again and close with the pool's idle
    /// timeout); alive: it takes requests again. One probe per VM at a time.
    pub fn suspect_vm(self: &Arc<Self>, target: &VmTarget) {
        let vm = target.vm;
        let first = self.with_core_state(|st, now| {
            let first = st.book.mark_suspect(vm);
            if first {
                st.core.on_vm_suspect(now, vm);
            }
            first
        });
        if !first {
            return;
        }
        let me = Arc::clone(self);
        let target = target.clone();
        tokio::spawn(async move {
            let alive = me.probe(&target.base).await;
            me.with_core_state(|st, now| {
                st.book.probe_ended(vm);
                if alive {
                    st.core.on_vm_cleared(now, vm);
                }
            });
            if !alive {
                me.vm_died(
                    target.vm,
                    "VM failed its probe after a failed request",
                    "unreachable",
                )
                .await;
            }
        });
    }

    /// One health probe of `base`, bounded by the probe timeout: a 2xx from the
    /// health path, or for a pool the gateway does not scale (`static`, no health path
    /// of its own) any HTTP answer.
    async fn probe(&self, base: &Uri) -> bool {
        let bound = self.readiness.probe_interval.max(Duration::from_secs(1));
        let path = &self.readiness.health_path;
        let probe = async {
            if self.vm_provider.executes_scaling() {
                self.client.probe(base, path).await
            } else {
                self.client.answers(base, path).await
            }
        };
        tokio::time::timeout(bound, probe).await.unwrap_or(false)
    }

    /// A ready VM is dead: the core forgets it and launches a replacement at once; its
    /// instance is terminated, or, for a pool the gateway does not scale (`static`),
    /// parked to be re-adopted when healthy again. `stage` is the
    /// `spillway_vm_failures_total` label (`unreachable`, `terminated`).
    async fn vm_died(&self, vm: VmId, why: &'static str, stage: &'static str) {
        let scales = self.vm_provider.executes_scaling();
        let record = self.with_core_state(|st, now| {
            st.core.on_vm_died(now, vm);
            let record = st.book.remove(vm);
            if !scales && let Some(r) = &record {
                st.book.park(vm, r, why);
            }
            record
        });
        let Some(record) = record else {
            return; // Already gone (another probe, a scale-in).
        };
        m::vm_failures(stage);
        tracing::warn!(%vm, base = ?record.base.as_ref().map(ToString::to_string), "{why}; {}", if scales { "replacing it" } else { "parked until healthy" });
        let writer = self.lock().core.controller().is_pool_writer();
        if scales
            && (writer || !record.foreign)
            && let Some(instance) = record.instance
            && let Some(permit) = self.pool_write("terminate", vm, Some(&instance)).await
        {
            let _ = self.vm_provider.terminate(&instance).await;
            self.pool_written(permit).await;
        }
    }

    /// Probe every ready VM and every parked static member each `interval`: a ready VM
    /// that fails [`UNHEALTHY_AFTER`](super::vm_book::UNHEALTHY_AFTER) probes in a row
    /// dies (`vm_died`); a parked member that answers is adopted again.
    pub fn start_health_checks(self: &Arc<Self>, interval: Duration) {
        let me = Arc::clone(self);
        tokio::spawn(async move {
            let mut marks = HealthMarks::default();
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await; // the first tick is immediate; the VMs were just probed
            loop {
                tick.tick().await;
                let (ready, parked) = {
                    let st = me.lock();
                    let parked: Vec<Uri> =
                        st.book.parked().iter().map(|p| p.base.clone()).collect();
                    (st.book.ready_targets(&st.core), parked)
                };
                let mut probes = tokio::task::JoinSet::new();
                for VmTarget { vm, base } in ready {
                    let me = Arc::clone(&me);
                    probes.spawn(async move { (Some(vm), base.clone(), me.probe(&base).await) });
                }
                for base in parked {
                    let me = Arc::clone(&me);
                    probes.spawn(async move { (None, base.clone(), me.probe(&base).await) });
                }
                while let Some(Ok((vm, base, healthy))) = probes.join_next().await {
                    match (vm, healthy) {
                        (Some(vm), healthy) => {
                            if marks.probed(vm, healthy) {
                                me.vm_died(vm, "VM failed its health probes", "unreachable")
                                    .await;
                            }
                        }
                        (None, true) => me.readopt(&base),
                        (None, false) => {}
                    }
                }
            }
        });
    }

    /// Take what the provider found about its pool on its own
    /// (`apply_pool_changes`) every [`POOL_CHANGES_INTERVAL`], whatever the
    /// health-check setting (the gateway's own probes cannot tell that EC2 terminated an
    /// instance while something still answers at its address).
    pub fn start_pool_changes(self: &Arc<Self>) {
        let me = Arc::clone(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(POOL_CHANGES_INTERVAL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                me.apply_pool_changes().await;
            }
        });
    }

    /// What the provider found about its pool on its own
    /// ([`VmProvider::take_pool_changes`]): instances to adopt become ready VMs (as at
    /// start), and the VMs of instances that are gone die at once — EC2's state wins
    /// over whatever still answers at their old address.
    async fn apply_pool_changes(&self) {
        let changes = self.vm_provider.take_pool_changes();
        if changes.is_empty() {
            return;
        }
        let claimed: Vec<(String, Uri)> = self.with_core_state(|st, now| {
            // A shared pool's unclaimed instance (an earlier leader's late launch) is
            // adopted only by the replica that writes the pool.
            if changes.unclaimed.is_empty() || !st.core.controller().is_pool_writer() {
                return Vec::new();
            }
            let mut known = st.book.instances();
            let mut claimed = Vec::new();
            for (instance, base) in &changes.unclaimed {
                if !known.insert(instance.clone()) {
                    continue;
                }
                let vm = st.adopt_ready(now, instance.clone(), base.clone(), false);
                tracing::info!(%vm, %instance, %base, "adopted VM (launched by an earlier leader, found by the pool audit)");

                claimed.push((instance.clone(), base.clone()));
            }
            claimed
        });
        for (instance, base) in &claimed {
            self.vm_provider.track(instance, base);
        }
        let dead: Vec<VmId> = self.with_core_state(|st, now| {
            let mut known = st.book.instances();
            for (instance, base) in changes.adopted {
                if !known.insert(instance.clone()) {
                    continue;
                }
                let vm = st.adopt_ready(now, instance.clone(), base.clone(), false);
                tracing::info!(%vm, %instance, %base, "adopted VM (found by the pool audit)");
            }
            let gone: std::collections::HashSet<&str> =
                changes.gone.iter().map(String::as_str).collect();
            // A booting VM's instance fails its address resolution instead.
            st.book.ready_where(&st.core, |r| {
                r.instance.as_deref().is_some_and(|i| gone.contains(i))
            })
        });
        for vm in dead {
            self.vm_died(
                vm,
                "the provider reports the VM's instance gone",
                "terminated",
            )
            .await;
        }
    }

    /// Make the `static` pool exactly `members` (name = URL, base) on reload: members no
    /// longer listed leave the pool (their in-flight requests
    /// finish), new ones are adopted as ready VMs. Returns (added, removed).
    pub fn set_static_members(&self, members: &[(String, Uri)]) -> (usize, usize) {
        self.with_core_state(|st, now| st.book.set_static_members(&mut st.core, now, members))
    }

    /// A parked static member at `base` is healthy again: adopt it as a ready VM.
    fn readopt(&self, base: &Uri) {
        let vm = self.with_core_state(|st, now| st.book.unpark(&mut st.core, now, base));
        if let Some(vm) = vm {
            tracing::info!(%vm, %base, "static VM healthy again; back in the pool");
        }
    }

    /// Like [`Self::with_core`], with the address book too.
    fn with_core_state<R>(&self, f: impl FnOnce(&mut State, Time) -> R) -> R {
        let r = {
            let mut st = self.lock();
            let now = self.now();
            let r = f(&mut st, now);
            self.rearm(st.core.poll_timeout());
            r
        };
        self.pump();
        r
    }

    /// A snapshot for `/status`.
    pub fn status(&self) -> GatewayStatus {
        let st = self.lock();
        GatewayStatus::of(&st.core, &st.book, st.last_decision)
    }

    /// Drain the core's actions and execute them.
    fn pump(&self) {
        let actions: Vec<Action> = {
            let mut st = self.lock();
            std::iter::from_fn(|| st.core.poll_action()).collect()
        };
        for action in actions {
            self.execute(action);
        }
        let releases: Vec<Release> = {
            let mut st = self.lock();
            std::iter::from_fn(|| st.core.poll_release()).collect()
        };
        for rel in releases {
            crate::telemetry::async_released(rel.kind.as_str(), rel.decision);
            match self.async_calls() {
                Some(a) => {
                    let a = Arc::clone(a);
                    let gw = self.self_arc();
                    tokio::spawn(a.release(gw, rel));
                }
                None => {
                    let mut t = rel.ticket;
                    self.with_core(|core, now| core.finish(now, &mut t));
                }
            }
        }
    }

    fn execute(&self, action: Action) {
        match action {
            Action::Scaling(controller::Action::Decided {
                epoch,
                decision,
                direction,
            }) => {
                m::scale_decision(direction.as_str());
                m::log_scale_decision(epoch, &decision, direction);
                self.lock().last_decision = Some((epoch, decision));
            }
            Action::Scaling(controller::Action::Launch { vm }) => {
                tracing::info!(%vm, "launching VM");
                self.lock().book.launching(vm);
                let provider = Arc::clone(&self.vm_provider);
                let this = self.self_arc();
                tokio::spawn(async move { this.launch(provider, vm).await });
            }
            Action::Scaling(controller::Action::Drain { vm }) => {
                tracing::info!(%vm, "draining VM")
            }
            Action::Scaling(controller::Action::Stop { vm }) => {
                // Under coordination the followers route to this VM until their next
                // round drops it from their tables: stop it only after that hand-off.
                let handoff = self
                    .coordinator
                    .get()
                    .map_or(Duration::ZERO, |c| c.scale_in_handoff());
                self.terminate_after(vm, "stopping VM", handoff);
            }
            Action::VmBootTimedOut { vm } => {
                m::vm_failures("not_ready");
                self.terminate(vm, "VM not ready before its boot deadline; terminating it");
            }
            Action::StartInstance { zone, instance } => {
                let this = self.self_arc();
                tokio::spawn(async move { this.prewarm(zone, instance).await });
            }
            Action::Dequeued { id, decision } => {
                let sent = {
                    let mut st = self.lock();
                    let target = match decision {
                        Decision::Vm { vm, .. } => st.book.target(vm),
                        _ => None,
                    };
                    st.waiters.serve(id, decision, target)
                };
                if sent {
                    m::queue_call("served");
                } else {
                    // The request went away meanwhile: give the slot back.
                    m::queue_call("cancelled");
                    self.with_core(|core, now| core.abandon_dequeued(now, decision));
                }
            }
            Action::QueueTimedOut { id } => {
                m::queue_call("timeout");
                self.lock().waiters.time_out(id);
            }
            Action::SampleCpu => self.sample_cpu(),
            Action::StopInstance { zone, instance } => {
                tracing::debug!(
                    zone = zone.0,
                    ?instance,
                    "function instance expired (keep-alive)"
                );
                let this = self.self_arc();
                tokio::spawn(async move {
                    this.zone_backend(zone).stop_instance(instance).await;
                    // Its shutdown time ends (FaaSim usage); the id may be reused now.
                    this.with_core(|core, now| core.on_instance_stopped(now, zone, instance));
                });
            }
        }
    }

    /// Forget `vm`'s address; terminate its instance when it had one (a launch still in
    /// flight terminates its own instance when it sees the VM is gone).
    fn terminate(&self, vm: VmId, why: &'static str) {
        self.terminate_after(vm, why, Duration::ZERO);
    }

    /// [`Self::terminate`], the instance stopped `handoff` later: the VM leaves this
    /// replica's table (and the registry it publishes) at once, and the fenced intent
    /// and the provider call come after the hand-off, so that the replicas still
    /// routing to it have dropped it and finished their requests on it.
    fn terminate_after(&self, vm: VmId, why: &'static str, handoff: Duration) {
        let (record, writer) = {
            let mut st = self.lock();
            (st.book.remove(vm), st.core.controller().is_pool_writer())
        };
        if record.as_ref().is_some_and(|r| r.foreign) && !writer {
            tracing::info!(%vm, "registry VM left this replica's table");
            return;
        }
        let instance: Option<String> = record.and_then(|r| r.instance);
        tracing::info!(%vm, instance = instance.as_deref().unwrap_or("-"), handoff_ms = handoff.as_millis() as u64, "{why}");
        if let Some(instance) = instance {
            let provider = Arc::clone(&self.vm_provider);
            let this = self.self_arc();
            tokio::spawn(async move {
                if !handoff.is_zero() {
                    tokio::time::sleep(handoff).await;
                }
                let Some(permit) = this.pool_write("terminate", vm, Some(&instance)).await else {
                    return;
                };
                if let Err(e) = provider.terminate(&instance).await {
                    tracing::warn!(%instance, error = %e, "terminate failed");
                }
                this.pool_written(permit).await;
                this.billing
                    .bill(this.now(), |m, _, now| m.on_vm_stopped(now, vm));
            });
        }
    }

    async fn prewarm(self: Arc<Self>, zone: ZoneId, instance: InstanceId) {
        match self.zone_backend(zone).start_instance(instance).await {
            Ok(()) => {
                tracing::info!(
                    zone = zone.0,
                    ?instance,
                    "pre-warmed function instance ready"
                );
                self.with_core_state(|st, now| {
                    st.boots.started(&mut st.core, now, zone, instance);
                });
            }
            Err(e) => {
                tracing::warn!(zone = zone.0, error = %e, "pre-warmed function instance failed to start");
                self.with_core_state(|st, now| {
                    st.boots.failed(&mut st.core, now, zone, instance);
                });
            }
        }
    }

    /// Wait until the booting pre-warmed `instance` of `zone`, claimed by a call
    /// ([`Start::Booting`](crate::policy::placement::Start)), is ready: `true`, and the
    /// instance is busy with the call; `false` when its boot failed (report
    /// [`NotSentReason::ColdStartFailed`](crate::policy::attempt::NotSentReason)).
    pub async fn await_booting(&self, zone: ZoneId, instance: InstanceId) -> bool {
        let boot = {
            let mut st = self.lock();
            let st = &mut *st;
            st.boots.wait(&st.core, zone, instance)
        };
        boot.outcome().await
    }

    fn self_arc(&self) -> Arc<Self> {
        // Gateways only exist inside the Arc built by `new`, which outlives every call.
        self.me
            .upgrade()
            .expect("the gateway is alive while its methods run")
    }

    async fn launch(self: Arc<Self>, provider: Arc<dyn VmProvider>, vm: VmId) {
        let started = Instant::now();
        let Some(permit) = self.pool_write("launch", vm, None).await else {
            self.with_core_state(|st, now| {
                st.core.on_vm_failed(now, vm);
                st.book.remove(vm);
            });
            return;
        };
        let launched = provider.launch(vm, permit.as_ref().map(Permit::term)).await;
        let instance = match launched {
            Ok(instance) => {
                // Billed from here (EC2: from `running`) until it is terminated.
                self.billing
                    .bill(self.now(), |m, t, now| m.on_vm_running(now, vm, t));
                instance
            }
            Err(e) => {
                // A definite failure is settled; an unknown outcome stays open: a later
                // leader looks its token up.
                if !matches!(e, BackendError::OutcomeUnknown(_)) {
                    self.pool_written(permit).await;
                }
                tracing::warn!(%vm, error = %e, "VM launch failed");
                m::vm_failures("launch");
                self.with_core_state(|st, now| {
                    st.core.on_vm_failed(now, vm);
                    st.book.remove(vm);
                });
                return;
            }
        };
        self.boot(provider, vm, instance, started, permit, false)
            .await;
    }

    /// The launch of `vm` gave `instance` (its launch intent `permit`, when
    /// coordinated; `adopted`: an earlier leader's launch, which the provider tracks
    /// once ready): wait until it is ready, or terminate it when the core gave it up.
    /// The intent is settled only then, not when the launch was accepted: a leader that
    /// stops while its launch boots leaves it open, and the next leader finds the
    /// instance by its token and adopts it as booting ([`Host::replay`]) instead of
    /// launching beside it.
    async fn boot(
        self: Arc<Self>,
        provider: Arc<dyn VmProvider>,
        vm: VmId,
        instance: String,
        started: Instant,
        permit: Option<Permit>,
        adopted: bool,
    ) {
        let known = {
            let mut st = self.lock();
            let st = &mut *st;
            st.book.launched(&st.core, vm, &instance)
        };
        if !known {
            self.pool_written(permit).await;
            // Stopped by a scale-in or the boot deadline while the launch was in flight.
            if let Some(permit) = self.pool_write("terminate", vm, Some(&instance)).await {
                let _ = provider.terminate(&instance).await;
                self.pool_written(permit).await;
                self.billing
                    .bill(self.now(), |m, _, now| m.on_vm_stopped(now, vm));
            }
            return;
        }
        let outcome =
            boots::await_vm_ready(&*provider, &self.client, &self.readiness, &instance, || {
                boots::still_booting(&self.lock().core, vm)
            })
            .await;
        let ours = self.with_core_state(|st, now| {
            let booting = boots::still_booting(&st.core, vm);
            match &outcome {
                Ok(base) if booting => {
                    st.book.resolved(vm, base.clone());
                    st.core.on_vm_ready(now, vm);
                    None
                }
                _ => {
                    if booting {
                        st.core.on_vm_failed(now, vm);
                    }
                    // Whoever removes the record terminates the instance.
                    Some(st.book.remove(vm).is_some())
                }
            }
        });
        self.pool_written(permit).await;
        match (&outcome, ours) {
            (Ok(base), None) => {
                if adopted {
                    self.vm_provider.track(&instance, base);
                }
                m::vm_boot_seconds(started.elapsed());
                tracing::info!(%vm, %instance, %base, boot_ms = started.elapsed().as_millis() as u64, "VM ready");
            }
            (_, Some(terminate)) => {
                if let Err(e) = &outcome {
                    tracing::warn!(%vm, %instance, error = %e, "VM did not become ready; terminating it");
                    m::vm_failures("not_ready");
                }
                if terminate
                    && let Some(permit) = self.pool_write("terminate", vm, Some(&instance)).await
                {
                    let _ = provider.terminate(&instance).await;
                    self.pool_written(permit).await;
                    self.billing
                        .bill(self.now(), |m, _, now| m.on_vm_stopped(now, vm));
                }
            }
            (Err(_), None) => unreachable!("a failed boot is never reported ready"),
        }
    }

    fn export_gauges(&self) {
        let s = {
            let mut st = self.lock();
            let s = st.core.status();
            if let Some(last) = s.r_max.and_then(|r| r.last)
                && st.r_max_logged != Some(last.at)
            {
                st.r_max_logged = Some(last.at);
                log_r_max_period(&last);
            }
            s
        };
        m::controller_gauges(&s.controller);
        if let Some(r) = &s.r_max {
            m::r_max_gauges(r);
        }
        if let Some(d) = &s.delay {
            m::delay_gauges(d, self.now());
        }
    }

    /// Stop every VM and function instance (gateway shutdown).
    pub async fn shutdown_backends(&self) {
        for zone in &self.zones {
            zone.shutdown().await;
        }
        self.vm_provider.shutdown().await;
    }

    /// How long until the next policy deadline (tests and diagnostics).
    pub fn until_next_deadline(&self) -> Duration {
        self.lock().core.poll_timeout().saturating_sub(self.now())
    }
}

/// The live gateway as a coordinated replica (`crate::coord`).
impl Host for Gateway {
    fn with_core(&self, f: &mut dyn FnMut(&mut Core, Time)) {
        Gateway::with_core(self, |core, now| f(core, now));
    }

    fn now(&self) -> Time {
        Gateway::now(self)
    }

    fn registry(&self) -> Vec<RegistryVm> {
        let st = self.lock();
        st.book.registry(&st.core)
    }

    fn sync_registry(&self, vms: &[RegistryVm]) {
        let listed: std::collections::HashSet<&str> =
            vms.iter().map(|v| v.instance.as_str()).collect();
        self.with_core_state(|st, now| {
            // A follower's own ready VMs (launched while it led) belong to the leader's
            // registry too: one the leader no longer lists was scaled in.
            let writer = st.core.controller().is_pool_writer();
            let gone = st.book.ready_where(&st.core, |r| {
                (r.foreign || !writer)
                    && r.instance.as_deref().is_some_and(|i| !listed.contains(i))
            });
            for vm in gone {
                st.core.drain_vm(now, vm);
            }
            let known = st.book.instances();
            for v in vms {
                if known.contains(&v.instance) {
                    continue;
                }
                let Ok(base) = v.base.parse::<Uri>() else {
                    tracing::warn!(instance = %v.instance, base = %v.base, "registry VM with an unreadable address; ignored");
                    continue;
                };
                let vm = st.adopt_ready(now, v.instance.clone(), base.clone(), true);
                tracing::info!(%vm, instance = %v.instance, %base, "registry VM adopted");

            }
        });
    }

    fn last_decision(&self) -> Option<(u64, ScaleDecision)> {
        self.lock().last_decision
    }

    fn launch_token(&self, vm: VmId, term: u64) -> Option<String> {
        self.vm_provider.launch_token(vm, term)
    }

    fn provider_term(&self) -> u64 {
        self.vm_provider.highest_term()
    }

    fn rebuild_pool(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            self.vm_provider.audit_now().await;
            self.apply_pool_changes().await;
        })
    }

    fn replay<'a>(&'a self, intent: &'a Intent) -> BoxFuture<'a, Replayed> {
        Box::pin(async move {
            match (intent.op.as_str(), &intent.token, &intent.instance) {
                ("launch", Some(token), _) => match self.vm_provider.recover_launch(token).await {
                    Ok(Recovered::Ready(instance, base)) => {
                        let adopted = self.with_core_state(|st, now| {
                            if st.book.vm_of(&instance).is_some() {
                                return false;
                            }
                            let vm = st.adopt_ready(now, instance.clone(), base.clone(), false);
                            tracing::info!(%vm, %instance, %base, "adopted VM (an earlier leader's launch, found by its client token)");

                            true
                        });
                        if adopted {
                            self.vm_provider.track(&instance, &base);
                        }
                        Replayed::Adopted(instance)
                    }
                    Ok(Recovered::Booting(instance)) => {
                        // Counted toward the pool at once (the coordinator turns pool
                        // writing on after the replay), so no VM is launched beside it.
                        let vm = self.with_core_state(|st, now| {
                            if st.book.vm_of(&instance).is_some() {
                                return None;
                            }
                            let vm = st.book.adopt_booting(&mut st.core, now, instance.clone());
                            tracing::info!(%vm, %instance, "adopted booting VM (an earlier leader's launch, found by its client token)");
                            Some(vm)
                        });
                        if let Some(vm) = vm {
                            let this = self.self_arc();
                            let provider = Arc::clone(&self.vm_provider);
                            let booting = instance.clone();
                            tokio::spawn(async move {
                                this.boot(provider, vm, booting, Instant::now(), None, true)
                                    .await
                            });
                        }
                        Replayed::Booting(instance)
                    }
                    Ok(Recovered::Missing) => Replayed::Dropped,
                    Err(e) => Replayed::Failed(e.to_string()),
                },
                ("terminate", _, Some(instance)) => {
                    // Out of this replica's table first (a registry VM), so that its
                    // drain does not terminate it a second time.
                    self.with_core_state(|st, now| {
                        if let Some(vm) = st.book.vm_of(instance) {
                            st.book.remove(vm);
                            st.core.drain_vm(now, vm);
                        }
                    });
                    match self.vm_provider.terminate(instance).await {
                        Ok(()) => Replayed::Terminated(instance.clone()),
                        // Not this replica's provider's to stop (a `process` VM of the
                        // earlier leader's host): nothing to replay here.
                        Err(BackendError::UnknownInstance(_)) => Replayed::Dropped,
                        Err(e) => Replayed::Failed(e.to_string()),
                    }
                }
                _ => Replayed::Dropped,
            }
        })
    }
}

/// One log line per closed adaptive r_max period (LIBRA §III-B).
fn log_r_max_period(p: &crate::policy::rmax::PeriodReport) {
    tracing::info!(
        samples = p.samples,
        measured_ms = p.measured.map(|d| d.as_secs_f64() * 1000.0),
        per_vm_rps = p.per_vm_rps,
        error = p.error,
        r_max_before = p.before_rps,
        r_max = p.after_rps,
        limit = p.limit.map(|l| l.as_str()),
        hold = p.hold.map(|h| h.as_str()),
        "r_max period"
    );
}

/// A request's [`Ticket`] in the live driver, released when dropped: whatever its current
/// attempt still holds — a VM slot, a function lease, an instance still cold-starting —
/// goes back to the core. A request abandoned at any await point (the client went away,
/// hyper dropped the request future) therefore never leaks capacity. Once a response
/// carries the attempt's release (its body guard), [`Self::hand_over`] says so.
pub struct TicketGuard {
    gw: Arc<Gateway>,
    ticket: Ticket,
    starting: Option<(ZoneId, InstanceId)>,
    /// The call waits in the gateway queue.
    waiting: Option<QueueWait>,
}

impl TicketGuard {
    /// Guard `ticket` of a request handled by `gw`.
    pub fn new(gw: &Arc<Gateway>, ticket: Ticket) -> Self {
        Self {
            gw: Arc::clone(gw),
            ticket,
            starting: None,
            waiting: None,
        }
    }

    /// The ticket (its key and arrival, for the completion report).
    pub fn ticket(&self) -> &Ticket {
        &self.ticket
    }

    /// The first decision ([`Gateway::route`]); after a [`Decision::Queue`], await
    /// [`Self::wait_queued`].
    pub fn route(&mut self) -> (Decision, Option<VmTarget>) {
        self.gw
            .billing
            .bill(self.gw.now(), |m, _, now| m.on_arrival(now));
        let (d, rx) = self
            .gw
            .decide(&mut self.ticket, |core, now, t| Some(core.route(now, t)))
            .expect("route always decides");
        self.waiting = rx;
        self.gw.with_target(d, &mut self.ticket)
    }

    /// The current attempt failed ([`Gateway::attempt_failed`]); after a
    /// [`Decision::Queue`], await [`Self::wait_queued`].
    pub fn attempt_failed(&mut self, failure: Failure) -> Option<(Decision, Option<VmTarget>)> {
        let (d, rx) = self.gw.decide(&mut self.ticket, |core, now, t| {
            core.on_attempt_failed(now, t, failure)
        })?;
        self.waiting = rx;
        Some(self.gw.with_target(d, &mut self.ticket))
    }

    /// Wait in the gateway queue: the attempt once capacity frees (the ticket then holds
    /// its slot or lease), or `None` when the call waited its longest.
    pub async fn wait_queued(&mut self) -> Option<(Decision, Option<VmTarget>)> {
        let outcome = self.waiting.as_mut()?.outcome().await;
        self.waiting = None;
        match outcome {
            QueueOutcome::Served(d, target) => {
                self.ticket.on_dequeued(d);
                Some((d, target))
            }
            QueueOutcome::TimedOut => None,
        }
    }

    /// Cold-start the current lease's instance ([`Gateway::cold_start`]); if the request
    /// is dropped meanwhile, the instance is given up and stopped.
    ///
    /// # Errors
    /// The backend's start error.
    pub async fn cold_start(
        &mut self,
        zone: ZoneId,
        instance: InstanceId,
    ) -> Result<(), BackendError> {
        self.starting = Some((zone, instance));
        let started = self.gw.cold_start(zone, instance).await;
        self.starting = None;
        started
    }

    /// Wait for the booting pre-warmed instance the current lease claimed
    /// ([`Gateway::await_booting`]): `false` when its boot failed.
    pub async fn await_booting(&mut self, zone: ZoneId, instance: InstanceId) -> bool {
        self.gw.await_booting(zone, instance).await
    }

    /// The answering attempt's slot or lease is released elsewhere from now on.
    pub fn hand_over(&mut self) {
        self.ticket.hand_over();
    }

    /// The current attempt's function instance is lost (the call was abandoned while it
    /// may still be working): the core forgets it and its process is stopped.
    pub fn lose_instance(&mut self) {
        if let Some(lease) = self.ticket.lease()
            && let Some(instance) = lease.instance()
        {
            self.ticket.hand_over();
            self.gw.instance_lost(lease.zone, instance);
        }
    }
}

impl Drop for TicketGuard {
    fn drop(&mut self) {
        if let Some((zone, instance)) = self.starting.take() {
            // Dropped during the cold start: the instance never served; forget it.
            self.ticket.hand_over();
            self.gw.instance_lost(zone, instance);
        }
        if let Some(wait) = self.waiting.take() {
            // Gone while queued: leave the queue; a call served meanwhile gives its slot
            // back (a send after `close` fails and the sender gives it back).
            let ticket = &mut self.ticket;
            let left = self.gw.with_core_state(|st, now| {
                if let Some(id) = ticket.queued() {
                    st.waiters.leave(id);
                }
                st.core.cancel_queued(now, ticket)
            });
            if left {
                m::queue_call("cancelled");
            }
            if let Some(d) = wait.close() {
                self.gw.with_core(|core, now| core.abandon_dequeued(now, d));
            }
        }
        if self.ticket.holds() {
            let ticket = &mut self.ticket;
            self.gw.with_core(|core, now| core.finish(now, ticket));
        }
    }
}
