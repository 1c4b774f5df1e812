//! Backend providers: where VMs and function instances come from.
//!
//! The live driver (`crate::proxy::driver`) executes the controller's actions through a
//! [`VmProvider`] and sends spilled requests to a [`FunctionTier`]. Both traits are
//! asynchronous and object-safe so that local providers and AWS providers
//! (EC2, Lambda) plug in the same way:
//!
//! * a VM goes through **launch** (the provider starts it and names it), **address
//!   resolution** ([`VmProvider::resolve`], polled until the VM has an address), and a
//!   **readiness probe** run by the driver (HTTP GET on the health path until 2xx or
//!   `boot_timeout_seconds`). A launch that fails or times out is terminated and reported
//!   to the controller, which replaces it at its next decision: partial launches are just
//!   some launches failing.
//! * a function call either returns a response, fails after the request was sent, or is
//!   **not sent** (throttled, instance gone, unreachable, never ran) — in which case the
//!   untouched request comes back, when the backend still has it, so that the policy core
//!   can place it in another zone or fall back to a VM. Function backends only execute:
//!   the instance pool, keep-alive and pre-warm live in the policy core's placement.
//!
//! | module | provider |
//! |---|---|
//! | [`vm_process`] | `vm_pool: {type: process}` — local child processes (the quickstart's VMs) |
//! | [`vm_static`] | `vm_pool: {type: static}` — a fixed list of upstream URLs |
//! | `ec2` | `vm_pool: {type: ec2}` — EC2 instances (feature `aws`) |
//! | [`function_process`] | `function_tier: {type: process}` — local function instances with real cold starts |
//! | [`function_http`] | `function_tier: {type: http}` — an existing function endpoint over HTTP(S) |
//! | `lambda`, `lambda_event` | `function_tier: {type: lambda}` — the Invoke API, and the pure HTTP ↔ Lambda event mapping (feature `aws`) |
//! | `aws_sdk`, `aws_http` | the AWS SDK configuration and the HTTP client every SDK call goes through (feature `aws`) |
//! | [`build`] | one factory per provider section: `build_vm_pool`, `build_zone` |
//! | [`process`] | child processes on loopback ports, shared by the local providers |
//! | [`provider_errors`] | cloud provider error accounting for logs, `/status` and metrics |

#[cfg(feature = "aws")]
pub mod aws_http;
#[cfg(feature = "aws")]
pub mod aws_sdk;
pub mod build;
#[cfg(feature = "aws")]
pub mod ec2;
pub mod function_http;
pub mod function_process;
#[cfg(feature = "aws")]
pub mod lambda;
#[cfg(feature = "aws")]
pub mod lambda_event;
pub mod process;
pub mod provider_errors;
pub mod vm_process;
pub mod vm_static;

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use http::{Request, Response, Uri};

use crate::net::body::Body;
use crate::net::client::UpstreamError;
use crate::policy::VmId;
use crate::policy::attempt::NotSentReason;
use crate::policy::functions::InstanceId;

/// How a newly started instance is checked for readiness: `GET health_path` every
/// `probe_interval` until a 2xx answer, giving up after `boot_timeout`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadinessSettings {
    /// Probe path, starting with `/`.
    pub health_path: String,
    /// Longest time from spawn to the first 2xx probe.
    pub boot_timeout: Duration,
    /// Pause between two probes.
    pub probe_interval: Duration,
}

impl ReadinessSettings {
    /// Settings for `health_path`, probed every `probe_interval` until `boot_timeout`.
    pub fn new(
        health_path: &str,
        boot_timeout: impl Into<Duration>,
        probe_interval: impl Into<Duration>,
    ) -> Self {
        Self {
            health_path: health_path.to_string(),
            boot_timeout: boot_timeout.into(),
            probe_interval: probe_interval.into(),
        }
    }
}

/// A boxed future, so the traits stay object-safe.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Why a backend operation failed.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// A process could not be spawned.
    #[error("cannot start {command:?}: {source}")]
    Spawn {
        /// The program.
        command: String,
        /// Cause.
        source: std::io::Error,
    },
    /// The instance exited or never became ready within its boot timeout.
    #[error("{instance} did not become ready: {reason}")]
    NotReady {
        /// Provider-side name.
        instance: String,
        /// What happened.
        reason: String,
    },
    /// The instance is unknown to the provider.
    #[error("unknown instance {0}")]
    UnknownInstance(String),
    /// Any other provider failure (API error, throttling, capacity…).
    #[error("{0}")]
    Provider(String),
    /// A launch whose outcome stayed unknown (EC2: every repetition of RunInstances
    /// was ambiguous and no instance carries its token yet): an instance may still
    /// turn up. Under coordination its intent stays open for a later leader's replay.
    #[error("{0}")]
    OutcomeUnknown(String),
}

/// What a provider found about its pool between two health-check ticks
/// ([`VmProvider::take_pool_changes`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolChanges {
    /// Instances of this pool to register as ready VMs, as `(instance, base URL)`: a
    /// launch whose outcome was unknown and whose instance turned up later (its client
    /// token is one this gateway sent), running and healthy.
    pub adopted: Vec<(String, Uri)>,
    /// Instances the provider says are gone (EC2: `shutting-down`, `terminated`,
    /// `stopping`, `stopped`, or no longer listed): their VMs leave the pool whatever
    /// still answers at their old address.
    pub gone: Vec<String>,
    /// Instances of a pool shared by coordinated replicas that no VM of this replica
    /// stands for and that are running and healthy, as `(instance, base URL)`: a launch
    /// of an earlier leader that became ready after it stopped. The replica that may
    /// write the pool (the leader) adopts them as ready VMs and hands them back with
    /// [`VmProvider::track`]; the others ignore them.
    pub unclaimed: Vec<(String, Uri)>,
}

impl PoolChanges {
    /// Nothing to do.
    pub fn is_empty(&self) -> bool {
        self.adopted.is_empty() && self.gone.is_empty() && self.unclaimed.is_empty()
    }
}

/// Where the instance of an earlier leader's launch stands
/// ([`VmProvider::recover_launch`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Recovered {
    /// Running, its address passes the policy and one health probe answered 2xx:
    /// `(instance, base URL)`.
    Ready(String, Uri),
    /// It exists (pending, or running and not healthy yet): the new leader adopts it
    /// as a booting VM and waits for it ([`VmProvider::resolve`], health probes).
    Booting(String),
    /// No live instance carries the token: the launch never reached the provider, or
    /// its instance is gone.
    Missing,
}

/// A VM pool provider. See the [module docs](self).
pub trait VmProvider: Send + Sync + 'static {
    /// Provider kind for logs and `/status` (`"process"`, `"static"`, `"ec2"`).
    fn kind(&self) -> &'static str;

    /// Whether the controller's launch/stop decisions are executed (`false` for `static`
    /// pools: decisions are computed and reported only).
    fn executes_scaling(&self) -> bool;

    /// VMs that already exist and belong to this pool, as `(instance, base URL)`: static
    /// upstreams, or (AWS) tagged instances left by an earlier gateway run. They are
    /// registered as ready without a launch.
    fn adopt(&self) -> BoxFuture<'_, Result<Vec<(String, Uri)>, BackendError>>;

    /// Start one VM for controller id `vm`; returns the provider's instance name once the
    /// launch was accepted (not when it is ready). `term`: the coordinated leader's term
    /// the launch is fenced by (`crate::coord`; `None` for one gateway), which its
    /// client token carries ([`Self::launch_token`]).
    fn launch(&self, vm: VmId, term: Option<u64>) -> BoxFuture<'_, Result<String, BackendError>>;

    /// The client-token stem of a launch of `vm` in leader term `term`, as
    /// [`Self::launch`] sends it (recorded in the launch's intent, so that a later
    /// leader finds the instance: [`Self::recover_launch`]). Default: `None`, the
    /// provider has no client tokens.
    fn launch_token(&self, vm: VmId, term: u64) -> Option<String> {
        let _ = (vm, term);
        None
    }

    /// Find the instance of an earlier leader's launch by its client-token stem
    /// ([`Self::launch_token`]). Default: [`Recovered::Missing`].
    ///
    /// # Errors
    /// The provider could not be asked (the caller keeps the intent open).
    fn recover_launch<'a>(
        &'a self,
        token: &'a str,
    ) -> BoxFuture<'a, Result<Recovered, BackendError>> {
        let _ = token;
        Box::pin(async { Ok(Recovered::Missing) })
    }

    /// Run the pool's audit now (EC2: one listing; what it finds is in the next
    /// [`Self::take_pool_changes`]). Default: nothing.
    fn audit_now(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }

    /// The highest leader term seen in the pool's launch tokens so far (0: none): a
    /// coordinated replica asks for a lease above it.
    fn highest_term(&self) -> u64 {
        0
    }

    /// Address resolution: the base URL of `instance`, or `None` while it has none yet.
    fn resolve<'a>(&'a self, instance: &'a str)
    -> BoxFuture<'a, Result<Option<Uri>, BackendError>>;

    /// Stop `instance` (no request is outstanding on it).
    fn terminate<'a>(&'a self, instance: &'a str) -> BoxFuture<'a, Result<(), BackendError>>;

    /// Gateway shutdown: stop (or, per provider policy, keep) every instance.
    fn shutdown(&self) -> BoxFuture<'_, ()>;

    /// Another gateway replica takes the pool over (`coordination`): the next
    /// [`Self::shutdown`] keeps what it would stop. Default: nothing changes (EC2 keeps or
    /// terminates by its own `on_shutdown`).
    fn hand_over(&self) {}

    /// What the provider found about its pool on its own since the last call (EC2's
    /// pool audit): instances to adopt as ready VMs, instances that are gone (terminated
    /// outside the gateway).
    /// The driver takes them on every health-check tick. Default: nothing.
    fn take_pool_changes(&self) -> PoolChanges {
        PoolChanges::default()
    }

    /// The driver adopted `instance` (at `base`) from [`PoolChanges::unclaimed`]: the
    /// provider manages it from now on (terminate, shutdown). Default: nothing.
    fn track(&self, instance: &str, base: &Uri) {
        let _ = (instance, base);
    }

    /// API errors so far, for `/status` (`vm_pool.errors`). Local providers have none.
    fn errors(&self) -> provider_errors::ProviderErrorStats {
        provider_errors::ProviderErrorStats::default()
    }

    /// Process ids of the pool's VMs on this host (the `process` pool), for the delay
    /// queue's `process` CPU signal (ProFaaStinate §3); pools of remote VMs have none.
    fn local_pids(&self) -> Vec<u32> {
        Vec::new()
    }
}

/// Why a function call did not produce a response.
///
/// Whose fault and what next: [`FunctionError::NotSent`] is the backend saying that the
/// function never saw the request (the core may place the call elsewhere — the
/// attempt protocol); every other variant happened after the request was handed over.
#[derive(Debug, thiserror::Error)]
pub enum FunctionError {
    /// Nothing reached the function. The untouched request comes back when the backend
    /// still had it (`None` when it was consumed, e.g. by a connect attempt), so that the
    /// core can place the call in another zone or on a VM (LIBRA §III-C; http-cases C20).
    #[error("function call not sent: {}", reason.as_str())]
    NotSent {
        /// Why (throttled, instance gone, unreachable, never ran, shutting down).
        reason: NotSentReason,
        /// The request, when the backend still has it.
        request: Option<Box<Request<Body>>>,
    },
    /// The call to the instance or endpoint failed after the request was sent.
    #[error(transparent)]
    Upstream(#[from] UpstreamError),
    /// The request is too large for the tier (Lambda: the JSON event would exceed the
    /// Invoke payload limit, `limit` bytes); nothing was sent. Answered 413.
    #[error("request too large for the function tier (limit {limit} bytes)")]
    PayloadTooLarge {
        /// The tier's limit, bytes.
        limit: u64,
    },
    /// Function tiers cannot tunnel an `Upgrade` request (http-cases C6): a clear 4xx.
    #[error("function tiers do not support Upgrade")]
    UpgradeNotSupported,
    /// The function ran and reported an error, its reply is not a valid HTTP response, or
    /// the provider refused the call (access denied, endpoint unreachable). Answered 502;
    /// the message is for the log only.
    #[error("{0}")]
    Failed(String),
    /// The call did not finish within the tier's own timeout. Answered 504.
    #[error("function call timed out after {0:?}")]
    TimedOut(std::time::Duration),
    /// The request body could not be read (client gone, or the gateway's body limit:
    /// a length-limit error is answered 413).
    #[error("cannot read the request body: {0}")]
    RequestBody(crate::net::body::BoxError),
}

impl FunctionError {
    /// A "not sent" error that hands `request` back.
    pub fn not_sent(reason: NotSentReason, request: Request<Body>) -> Self {
        FunctionError::NotSent {
            reason,
            request: Some(Box::new(request)),
        }
    }
}

/// A function tier (one zone's backend). See the [module docs](self).
///
/// Backends only execute: which instance runs a call, when instances start (cold start,
/// pre-warm) and stop (keep-alive expiry) is decided by the policy core's
/// [`Placement`](crate::policy::placement::Placement) and carried out by the driver.
/// Tiers whose instances spillway cannot see (`http`, `lambda`) are called with
/// `instance: None` and keep the default `start_instance`/`stop_instance`.
pub trait FunctionTier: Send + Sync + 'static {
    /// Tier kind for logs and `/status` (`"process"`, `"http"`, `"lambda"`).
    fn kind(&self) -> &'static str;

    /// Start instance `instance` and resolve once it is ready to take calls (its own
    /// readiness probe, bounded by the tier's boot timeout).
    ///
    /// # Errors
    /// [`BackendError`] when the instance cannot be started or never becomes ready (the
    /// default: the tier has no instances to start).
    fn start_instance(&self, instance: InstanceId) -> BoxFuture<'_, Result<(), BackendError>> {
        let _ = instance;
        Box::pin(async move {
            Err(BackendError::Provider(format!(
                "the {} function tier has no instances to start",
                self.kind()
            )))
        })
    }

    /// Stop instance `instance` (idle, expired, dead or abandoned). Unknown ids are
    /// ignored.
    fn stop_instance(&self, instance: InstanceId) -> BoxFuture<'_, ()> {
        let _ = instance;
        Box::pin(async {})
    }

    /// Run one request, on `instance` when the tier has instances. The response body
    /// streams; the driver holds the call's lease until it ends.
    fn invoke(
        &self,
        instance: Option<InstanceId>,
        req: Request<Body>,
    ) -> BoxFuture<'_, Result<Response<Body>, FunctionError>>;

    /// Gateway shutdown: stop every instance; later calls are not sent.
    fn shutdown(&self) -> BoxFuture<'_, ()>;

    /// Provider API errors so far, for `/status` (`functions.errors`). Local tiers have
    /// none.
    fn errors(&self) -> provider_errors::ProviderErrorStats {
        provider_errors::ProviderErrorStats::default()
    }

    /// Whether the tier's endpoint can be reached now, for `/readyz`: a tier that cannot
    /// take a call is no capacity. The default (tiers spillway starts itself, or reaches
    /// through a provider API whose faults [`errors`](Self::errors) reports) is `true`.
    fn reachable(&self) -> BoxFuture<'_, bool> {
        Box::pin(async { true })
    }
}
