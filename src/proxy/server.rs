//! Listeners and process lifetime: binds the proxy (plain and optional TLS) and admin
//! listeners, admits each accepted connection within its listener's connection budget,
//! serves HTTP/1.1 and h2 through hyper-util's auto builder under the connection
//! deadlines of [`super::lifetime`] (first request, header read, keep-alive idle), and
//! shuts down gracefully: stop accepting, close idle connections (h2: GOAWAY), let
//! in-flight requests and `Upgrade` tunnels finish within `drain_timeout_seconds`, stop
//! every child process.
//!
//! # Thread per core
//!
//! The data plane runs on `gateway.worker_threads` OS threads (default: one per core),
//! each a `DataPlane`: a current-thread tokio runtime with its own accept loops on
//! its own listeners — `bind_shared` binds one `SO_REUSEPORT` socket per worker on
//! the proxy (and TLS) address, so the kernel spreads new connections over the workers
//! — and its own shard of the upstream connection pool
//! ([`crate::net::client::set_pool_shard`]). A connection lives on the thread that
//! accepted it, with its requests, their upstream connections and their timers: no
//! thread wakes another on the request path (on one multi-thread runtime, threads
//! waking each other cost a fifth of the CPU). What the workers share: one connection
//! budget ([`ConnLimits`]: `max_connections` counts all of them), the request-path
//! settings (a reload replaces them for all), the drain signal (a graceful shutdown
//! waits for the connections of every worker) and the gateway state. The admin
//! listener, the driver, reloads and the backends stay on the control runtime, the one
//! [`Server::run`] is called on. A worker that cannot start fails [`Server::run`]
//! ([`ServeError::Worker`]). Without `SO_REUSEPORT` (other systems than Linux) one
//! worker serves.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;

use crate::backends::build::{BuildContext, BuildError, build_vm_pool, build_zone};
use crate::backends::{BackendError, FunctionTier};
use crate::config::Config;
use crate::coord::redis::RedisStore;
use crate::coord::{Coordinator, Host, Store as CoordStore};
use crate::policy::core::Core;
use crate::policy::scaling::LibraScaler;

use super::async_calls::front::AsyncCalls;
use super::async_calls::secrets::Sealer;
use super::async_calls::store::{CallStore, RedbStore};
use super::driver::Gateway;
use super::lifetime::{self, ConnLimits, ConnPermit, Deadlines, Lifetime, Tracked};
use super::protocol::{Builders, Protocol};
use super::service::{self, ServiceSettings};
use crate::net::client::{ClientSettings, UpstreamClient};
use crate::net::tls::{self, TlsError};

/// h2: most streams a client may reset before the gateway accepted them (the "rapid
/// reset" attack, CVE-2023-44487); then GOAWAY `ENHANCE_YOUR_CALM` (http-cases C12).
pub const MAX_PENDING_ACCEPT_RESET_STREAMS: usize = 100;
/// h2: most streams the gateway may be made to reset for a client's protocol errors
/// ("MadeYouReset", CVE-2025-8671); then GOAWAY `ENHANCE_YOUR_CALM` (http-cases C12).
pub const MAX_LOCAL_ERROR_RESET_STREAMS: usize = 100;

/// A client connection that has cancelled this many requests before their response
/// (h2 `RST_STREAM` after the stream was accepted: the paced form of rapid reset, which
/// h2's pending-accept limit does not see), when they are at least half of its
/// requests, is closed (Envoy's premature-reset heuristic; http-cases C12).
pub const MAX_CANCELLED_REQUESTS: u64 = 100;

/// The smallest HTTP/1 read buffer limit hyper accepts.
const MIN_HYPER_BUF_SIZE: usize = 8192;

/// Per-connection count of requests and of requests the client cancelled before their
/// response head (hyper drops the service future when an h2 stream is reset);
/// `tripped` fires once the cancellations pass [`MAX_CANCELLED_REQUESTS`] and half of
/// the requests.
#[derive(Debug, Default)]
struct CancelWatch {
    started: AtomicU64,
    cancelled: AtomicU64,
    tripped: tokio::sync::Notify,
}

impl CancelWatch {
    /// A request begins; the guard counts it as cancelled unless [`Pending::done`].
    fn begin(self: &Arc<Self>) -> Pending {
        self.started.fetch_add(1, Ordering::Relaxed);
        Pending(Some(Arc::clone(self)))
    }
}

/// One request in flight on a [`CancelWatch`]ed connection.
struct Pending(Option<Arc<CancelWatch>>);

impl Pending {
    /// The response head was produced: not a cancellation.
    fn done(mut self) {
        self.0 = None;
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(w) = self.0.take() {
            let cancelled = w.cancelled.fetch_add(1, Ordering::Relaxed) + 1;
            if cancelled >= MAX_CANCELLED_REQUESTS
                && 2 * cancelled >= w.started.load(Ordering::Relaxed)
            {
                w.tripped.notify_one();
            }
        }
    }
}

/// Why the gateway could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// A listener could not be bound.
    #[error("cannot listen on {addr} ({what}): {source}")]
    Bind {
        /// Which listener.
        what: &'static str,
        /// The address.
        addr: SocketAddr,
        /// Cause.
        source: std::io::Error,
    },
    /// The TLS certificate or key could not be loaded.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The configuration lacks a section the gateway needs.
    #[error("config: {0} is missing (required by `spillway serve`)")]
    MissingSection(&'static str),
    /// A backend could not be set up.
    #[error("backend: {0}")]
    Backend(#[from] BackendError),
    /// The configuration names an AWS provider but this binary lacks the `aws` feature.
    #[error(
        "config: {0} needs AWS support, but spillway was built without the `aws` feature (rebuild with `cargo build --release --features aws`)"
    )]
    AwsFeatureDisabled(&'static str),
    /// The admin listener cannot be served safely: a non-loopback address without a
    /// token, or a token that cannot be read.
    #[error("config: gateway.admin_listen: {0}")]
    Admin(String),
    /// The asynchronous-call store could not be opened or read (the file is named).
    #[error("{0}")]
    AsyncStore(String),
    /// A route enables asynchronous calls but no state directory could be chosen.
    #[error(transparent)]
    StateDir(#[from] crate::state_dir::NoStateDir),
    /// Span export (`telemetry.otlp`) could not be set up.
    #[error(transparent)]
    TraceExport(#[from] crate::trace_export::ExportError),
    /// A data-plane worker thread could not start (its thread, runtime or listeners).
    #[error("data-plane worker {index} (gateway.worker_threads) cannot start: {source}")]
    Worker {
        /// The worker, 0-based.
        index: usize,
        /// Cause.
        source: std::io::Error,
    },
    /// `coordination.url` cannot be used by the Redis client.
    #[error("config: coordination.url: {source}")]
    Coordination {
        /// Cause.
        #[source]
        source: redis::RedisError,
    },
}

impl From<BuildError> for ServeError {
    fn from(e: BuildError) -> Self {
        match e {
            BuildError::Backend(e) => ServeError::Backend(e),
            BuildError::AwsFeatureDisabled(what) => ServeError::AwsFeatureDisabled(what),
        }
    }
}

/// Where the asynchronous-call store comes from.
enum Store {
    /// The embedded store in this state directory (`None`: the default one).
    In(Option<PathBuf>),
    /// This store (tests).
    Given(Arc<dyn CallStore>),
}

/// Open the embedded store in the state directory `dir` (or the default one), bounded by
/// `cfg`, and the key that seals its credentials.
fn open_store(
    dir: Option<&std::path::Path>,
    cfg: &crate::config::delay::AsyncConfig,
) -> Result<(RedbStore, Sealer, u32), ServeError> {
    let state = crate::state_dir::from_env(dir)?;
    let store_dir = state.join("async");
    crate::state_dir::create(&store_dir).map_err(|e| {
        ServeError::AsyncStore(format!(
            "cannot create the state directory {}: {e}; choose a writable one with \
             --state-dir DIR (or SPILLWAY_STATE_DIR)",
            store_dir.display()
        ))
    })?;
    let limits = super::async_calls::store::StoreLimits {
        max_bytes: cfg.max_store_bytes,
        max_calls_per_client: cfg.max_calls_per_client.map(std::num::NonZeroU64::get),
        result_max_bytes: cfg.result_max_bytes.get(),
    };
    let store = RedbStore::open_with(&store_dir, limits).map_err(|e| match e {
        super::async_calls::store::StoreError::Locked { path } => ServeError::AsyncStore(format!(
            "the asynchronous-call store {} is in use by another process — another \
             spillway with the state directory {}? Each gateway needs its own: start this \
             one with --state-dir DIR (or SPILLWAY_STATE_DIR=DIR), or stop the other",
            path.display(),
            state.display()
        )),
        other => ServeError::AsyncStore(other.to_string()),
    })?;
    let sealer =
        Sealer::load_or_create(&store_dir).map_err(|e| ServeError::AsyncStore(e.to_string()))?;
    let tag = super::async_calls::front::load_or_create_owner_tag(&store_dir)
        .map_err(ServeError::AsyncStore)?;
    Ok((store, sealer, tag))
}

/// The bound address of `listener` (its configured one when it cannot say).
fn proxy_addr_of(listener: &std::net::TcpListener) -> SocketAddr {
    listener
        .local_addr()
        .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 0)))
}

/// Pending connections per listener (as `tokio::net::TcpListener::bind`).
const LISTEN_BACKLOG: u32 = 1024;

/// Bind `n` listeners (`what`: proxy, tls) on `addr`, one per data-plane worker, for
/// the worker runtimes to register (not registered with any runtime yet).
///
/// First a plain bind, which fails as with one listener when the address is in use —
/// also by another spillway's `SO_REUSEPORT` listeners, which would otherwise share
/// the port with this one — or not allowed. It resolves port 0. With `n` > 1 on Linux
/// it is closed and `n` sockets with `SO_REUSEADDR` and `SO_REUSEPORT` are bound to
/// the address it got; elsewhere, or with `n` = 1, it is the one listener.
///
/// # Errors
/// [`ServeError::Bind`] naming the listener and the address.
async fn bind_shared(
    what: &'static str,
    addr: SocketAddr,
    n: usize,
) -> Result<Vec<std::net::TcpListener>, ServeError> {
    let fail = |source| ServeError::Bind { what, addr, source };
    let probe = TcpListener::bind(addr).await.map_err(fail)?;
    if n <= 1 || !cfg!(target_os = "linux") {
        return Ok(vec![probe.into_std().map_err(fail)?]);
    }
    let bound = probe.local_addr().map_err(fail)?;
    drop(probe);
    (0..n)
        .map(|_| {
            let socket = if bound.is_ipv4() {
                TcpSocket::new_v4()
            } else {
                TcpSocket::new_v6()
            }
            .map_err(fail)?;
            socket.set_reuseaddr(true).map_err(fail)?;
            #[cfg(target_os = "linux")]
            socket.set_reuseport(true).map_err(fail)?;
            socket.bind(bound).map_err(fail)?;
            socket
                .listen(LISTEN_BACKLOG)
                .and_then(TcpListener::into_std)
                .map_err(fail)
        })
        .collect()
}

/// A gateway whose listeners are bound; [`Server::run`] serves until shutdown.
pub struct Server {
    config: Config,
    gateway: Arc<Gateway>,
    prometheus: metrics_exporter_prometheus::PrometheusHandle,
    /// One per data-plane worker ([`bind_shared`]).
    proxy: Vec<std::net::TcpListener>,
    admin: TcpListener,
    /// One per data-plane worker, as `proxy`.
    tls: Option<(Vec<std::net::TcpListener>, Arc<ArcSwap<TlsAcceptor>>)>,
    /// The admin bearer token in force (reloadable).
    admin_token: super::admin_token::AdminToken,
    /// Where a reload re-reads the configuration, and the CLI listen overrides.
    reload_source: (Option<PathBuf>, Option<SocketAddr>, Option<SocketAddr>),
}

impl Server {
    /// Build the backends and the controller, start the driver, bind every listener.
    /// `spillway_exe` replaces `{spillway}` in process commands.
    ///
    /// # Errors
    /// [`ServeError`] naming the listener, TLS file or backend.
    pub async fn bind(config: Config, spillway_exe: PathBuf) -> Result<Server, ServeError> {
        Self::bind_in(config, spillway_exe, None).await
    }

    /// [`Self::bind`] with the asynchronous-call store in `state_dir` (`--state-dir`;
    /// `None`: the default of [`crate::state_dir`]). The directory is chosen, created
    /// and locked only when a route enables asynchronous calls.
    ///
    /// # Errors
    /// As [`Self::bind`]; [`ServeError::AsyncStore`] when another process holds the
    /// store (the message names the directory and `--state-dir`).
    pub async fn bind_in(
        config: Config,
        spillway_exe: PathBuf,
        state_dir: Option<PathBuf>,
    ) -> Result<Server, ServeError> {
        Self::bind_with(config, spillway_exe, Store::In(state_dir), None).await
    }

    /// [`Self::bind`] with the asynchronous calls kept in `store` instead of the embedded
    /// redb file (tests put a failing store here).
    ///
    /// # Errors
    /// As [`Self::bind`].
    pub async fn bind_with_store(
        config: Config,
        spillway_exe: PathBuf,
        store: Option<Arc<dyn CallStore>>,
    ) -> Result<Server, ServeError> {
        let store = store.map_or(Store::In(None), Store::Given);
        Self::bind_with(config, spillway_exe, store, None).await
    }

    /// [`Self::bind`] with upstream connections made by `client` (the request-path bench
    /// passes [`UpstreamClient::in_memory`]).
    ///
    /// # Errors
    /// As [`Self::bind`].
    pub async fn bind_with_client(
        config: Config,
        spillway_exe: PathBuf,
        client: UpstreamClient,
    ) -> Result<Server, ServeError> {
        Self::bind_with(config, spillway_exe, Store::In(None), Some(client)).await
    }

    async fn bind_with(
        config: Config,
        spillway_exe: PathBuf,
        store: Store,
        client: Option<UpstreamClient>,
    ) -> Result<Server, ServeError> {
        let g = &config.gateway;
        if let Some(problem) = g.admin_exposure_issue() {
            return Err(ServeError::Admin(problem));
        }
        let admin_token =
            super::admin_token::AdminToken::new(g.admin_token().map_err(ServeError::Admin)?);
        let prometheus = crate::telemetry::install();
        // Two clients under the address policy (net::upstream): user-given upstreams
        // (static, http, EC2) per `allow_loopback_upstreams`, spillway's own processes
        // on loopback. Both never reach the gateway's listeners (recorded after bind).
        let (client, own_client) = match client {
            Some(c) => (c.clone(), c),
            None => {
                let settings = ClientSettings {
                    connect_timeout: g.connect_timeout_seconds.get(),
                    idle_timeout: g.idle_timeout_seconds.get(),
                };
                let limits = crate::net::client::ResponseLimits {
                    max_headers: g.max_response_header_count,
                    max_head_bytes: g.max_response_header_bytes,
                };
                let policy = crate::net::upstream::AddressPolicy::new(g.allow_loopback_upstreams);
                (
                    UpstreamClient::for_upstreams(
                        settings,
                        limits,
                        policy,
                        g.upstream_tls_config()?,
                    ),
                    UpstreamClient::for_upstreams(
                        settings,
                        limits,
                        crate::net::upstream::AddressPolicy::new(true),
                        None,
                    ),
                )
            }
        };
        let build = BuildContext {
            spillway_exe: spillway_exe.clone(),
            upstream_client: client.clone(),
            local_client: own_client.clone(),
            allow_loopback_upstreams: g.allow_loopback_upstreams,
            shared_pool: config.coordination.redis().is_some(),
            connect_timeout: g.connect_timeout_seconds.get(),
        };
        let vm_pool = build_vm_pool(
            config
                .vm_pool
                .as_ref()
                .ok_or(ServeError::MissingSection("vm_pool"))?,
            &build,
        )
        .await?;
        let specs = config.zone_specs();
        if specs.is_empty() {
            return Err(ServeError::MissingSection("function_tier"));
        }
        let mut zones: Vec<Arc<dyn FunctionTier>> = Vec::with_capacity(specs.len());
        for spec in &specs {
            zones.push(build_zone(&spec.tier, &build).await?);
        }
        let core = Core::new(
            config.core_params(),
            Box::new(LibraScaler::new(config.libra_scaling_params())),
            Box::new(config.libra_balancer()),
        )
        .with_adaptive_r_max(config.r_max_adaptive_params())
        .with_queue(
            config.queue_params(),
            config.route_defs(),
            config.max_route_keys(),
        )
        .with_retry_budget(config.gateway.retry_budget())
        .with_delay_queue(
            config
                .async_enabled()
                .then(|| config.async_calls.delay_params(config.slots_per_vm())),
        );
        // Several replicas (`coordination: {type: redis}`): epochs aligned on the
        // store's clock, the coordinator in place before the core starts (so that a
        // replica that is not the leader launches nothing at start).
        let coordination = match config.coordination.redis() {
            Some(r) => {
                let epoch = config.libra.epoch_seconds.get();
                let op_timeout = r.op_timeout(epoch);
                let store: Arc<dyn CoordStore> = Arc::new(
                    RedisStore::new(&r.url, &r.cluster, op_timeout)
                        .map_err(|source| ServeError::Coordination { source })?,
                );
                let (origin, base_epoch) = crate::coord::align(&*store, epoch, op_timeout).await;
                let settings = crate::coord::Settings {
                    replica: crate::coord::default_replica_id(),
                    epoch,
                    lease: Duration::from_millis(r.lease_ms),
                    op_timeout,
                    grace_epochs: r.grace_epochs,
                    decision_epochs: config.libra.decision_epochs.get(),
                    base_epoch,
                };
                Some((store, origin, settings))
            }
            None => None,
        };
        let gateway = Gateway::new_at(
            core,
            vm_pool.provider,
            zones,
            vm_pool.client,
            vm_pool.readiness,
            config.cip_rps(),
            coordination
                .as_ref()
                .map_or_else(tokio::time::Instant::now, |(_, origin, _)| *origin),
        );
        gateway
            .billing()
            .set_meter(config.cost_meter(), config.vm_instance_type());
        if let Some(otlp) = &config.telemetry.otlp {
            let e = crate::trace_export::Exporter::start(otlp)?;
            tracing::info!(endpoint = %otlp.endpoint, sample_ratio = otlp.sample_ratio, "exporting spans over OTLP/HTTP");
            gateway.set_trace_exporter(Arc::new(e));
        }
        if let Some((store, _, settings)) = coordination {
            crate::telemetry::zero_coordination();
            tracing::info!(replica = %settings.replica, base_epoch = settings.base_epoch, "coordinated replica");
            let c = Coordinator::new(settings, store, Arc::clone(&gateway) as Arc<dyn Host>);
            gateway.set_coordinator(Arc::clone(&c));
        }

        let workers = g.worker_threads();
        let proxy = bind_shared("proxy", g.listen, workers).await?;
        let admin = TcpListener::bind(g.admin_listen)
            .await
            .map_err(|source| ServeError::Bind {
                what: "admin",
                addr: g.admin_listen,
                source,
            })?;
        let tls = match &g.tls {
            Some(t) => {
                let acceptor =
                    TlsAcceptor::from(tls::load_server_config(&t.cert_file, &t.key_file)?);
                Some((
                    bind_shared("tls", t.listen, workers).await?,
                    Arc::new(ArcSwap::from_pointee(acceptor)),
                ))
            }
            None => None,
        };
        let mut listeners = vec![proxy[0].local_addr(), admin.local_addr()];
        listeners.extend(tls.as_ref().map(|(l, _)| l[0].local_addr()));
        let listeners: Vec<SocketAddr> = listeners.into_iter().filter_map(Result::ok).collect();
        for c in [&client, &own_client] {
            if let Some(policy) = c.address_policy() {
                policy.set_gateway_listeners(&listeners);
            }
        }
        if config.async_enabled() {
            let (store, sealer, tag): (Arc<dyn CallStore>, _, _) = match store {
                Store::Given(s) => (s, Sealer::ephemeral(), rand::random::<u32>()),
                Store::In(dir) => {
                    let (s, sealer, tag) = open_store(dir.as_deref(), &config.async_calls)?;
                    (Arc::new(s), sealer, tag)
                }
            };
            let a = AsyncCalls::new(
                config.async_calls.clone(),
                config.routes.clone(),
                store,
                sealer,
                Arc::new(ServiceSettings::from_config(&config)),
                config.slots_per_vm(),
            );
            if let (Some(c), Some(r)) = (gateway.coordinator(), config.coordination.redis()) {
                // Calls across replicas: ids carry this replica's tag, the others forward
                // their lookups to this address.
                let url = r.advertise_url.as_ref().map_or_else(
                    || format!("http://{}", proxy_addr_of(&proxy[0])),
                    |u| u.as_str().to_owned(),
                );
                tracing::info!(owner_tag = %format!("{tag:08x}"), %url, "asynchronous calls looked up across replicas");
                c.advertise(crate::coord::CallAddress { tag, url });
                a.set_replicas(tag, Arc::clone(c) as Arc<dyn crate::coord::CallDirectory>);
            }
            gateway.set_async_calls(Arc::<AsyncCalls>::clone(&a));
            gateway.start().await?;
            a.start(&gateway);
            let n = a
                .recover(&gateway)
                .map_err(|e| ServeError::AsyncStore(e.to_string()))?;
            if n > 0 {
                tracing::info!(calls = n, "asynchronous calls recovered from the store");
            }
        } else {
            gateway.start().await?;
        }
        // Only now: the pool is listed (adoption at start), so the first lease is asked
        // above every term in its client tokens.
        if let Some(c) = gateway.coordinator() {
            c.start();
        }
        if !config.gateway.health_check_interval_seconds.is_zero() {
            gateway.start_health_checks(config.gateway.health_check_interval_seconds.get());
        }
        gateway.start_pool_changes();
        Ok(Server {
            config,
            gateway,
            prometheus,
            proxy,
            admin,
            tls,
            admin_token,
            reload_source: (None, None, None),
        })
    }

    /// Enable reloads (SIGHUP, `POST /reload`) from `path`, keeping the command line's
    /// `--listen` / `--admin-listen` overrides.
    pub fn set_reload_source(
        &mut self,
        path: Option<PathBuf>,
        listen: Option<SocketAddr>,
        admin_listen: Option<SocketAddr>,
    ) {
        self.reload_source = (path, listen, admin_listen);
    }

    /// The bound proxy address (useful with port 0).
    pub fn proxy_addr(&self) -> SocketAddr {
        self.proxy[0]
            .local_addr()
            .expect("bound listener has an address")
    }

    /// The bound admin address.
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin
            .local_addr()
            .expect("bound listener has an address")
    }

    /// The bound TLS address, if any.
    pub fn tls_addr(&self) -> Option<SocketAddr> {
        self.tls.as_ref().and_then(|(l, _)| l[0].local_addr().ok())
    }

    /// The shared gateway state.
    pub fn gateway(&self) -> &Arc<Gateway> {
        &self.gateway
    }

    /// A server of client connections on any byte stream with this gateway and the
    /// configuration's settings (no reload): the request path without listeners.
    pub fn connections(&self) -> Connections {
        let settings = Arc::new(ArcSwap::from_pointee(ServiceSettings::from_config(
            &self.config,
        )));
        Connections::new(&self.config, Arc::clone(&self.gateway), settings)
    }

    /// Serve until `shutdown` resolves, then drain and stop the backends: the data plane
    /// on `gateway.worker_threads` threads of their own (see the [module docs](self)),
    /// the admin listener on the caller's runtime.
    ///
    /// # Errors
    /// [`ServeError::Worker`] when a data-plane worker cannot start (the workers
    /// already started are stopped and the backends shut down first).
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<(), ServeError> {
        let g = &self.config.gateway;
        let settings = Arc::new(ArcSwap::from_pointee(ServiceSettings::from_config(
            &self.config,
        )));
        let reloader = {
            let mut r = super::reload::Reloader::new(
                self.config.clone(),
                Arc::clone(&settings),
                self.admin_token.clone(),
                self.tls.as_ref().map(|(_, a)| Arc::clone(a)),
            );
            let (path, listen, admin_listen) = self.reload_source.clone();
            r.set_source(path, listen, admin_listen);
            r.set_gateway(Arc::clone(&self.gateway));
            Arc::new(r)
        };
        let draining = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let connections = Connections::new(&self.config, Arc::clone(&self.gateway), settings);
        let (max_total, max_per_ip) = g.connection_limits();
        warn_if_over_fd_limit(max_total);
        // One budget over every worker's listeners.
        let limits = ConnLimits::new("proxy", max_total, max_per_ip);
        // Turned true at shutdown: every connection closes gracefully once idle.
        let (drain_tx, drain_rx) = watch::channel(false);
        let (stop_accept_tx, stop_accept_rx) = watch::channel(false);
        let (exit_tx, exit_rx) = watch::channel(false);
        // Turned true once every worker runs: no worker accepts before all have their
        // runtime, so one worker's connections cannot take the descriptors that the
        // next one needs to start (at the file-descriptor limit it would fail `serve`).
        let (start_tx, start_rx) = watch::channel(false);

        let mut tls = self.tls.map(|(l, a)| (l.into_iter(), a));
        let mut workers = Vec::with_capacity(self.proxy.len());
        for (index, proxy) in self.proxy.into_iter().enumerate() {
            let plane = DataPlane {
                index,
                proxy,
                tls: tls
                    .as_mut()
                    .and_then(|(l, a)| Some((l.next()?, Arc::clone(a)))),
                connections: connections.clone(),
                limits: limits.clone(),
                drain: drain_rx.clone(),
                start: start_rx.clone(),
                stop_accept: stop_accept_rx.clone(),
                exit: exit_rx.clone(),
            };
            match plane.start().await {
                Ok(w) => workers.push(w),
                Err(e) => {
                    let _ = stop_accept_tx.send(true);
                    let _ = exit_tx.send(true);
                    join_workers(workers).await;
                    self.gateway.shutdown_backends().await;
                    return Err(e);
                }
            }
        }
        let _ = start_tx.send(true);
        tracing::info!(
            worker_threads = workers.len(),
            "data plane: one thread per worker, each with its own listener and upstream pool"
        );
        let sighup_task = tokio::spawn(reload_on_sighup(Arc::clone(&reloader)));

        let admin_task = {
            let gw = Arc::clone(&self.gateway);
            let prometheus = self.prometheus.clone();
            let admin = self.admin;
            let ctx = super::admin::AdminCtx {
                token: self.admin_token.clone(),
                reloader: Some(Arc::clone(&reloader)),
                draining: Arc::clone(&draining),
            };
            let deadlines = connections.deadlines;
            let admin_limits = ConnLimits::new(
                "admin",
                lifetime::ADMIN_MAX_CONNECTIONS,
                lifetime::ADMIN_MAX_CONNECTIONS,
            );
            tokio::spawn(async move {
                let mut backoff = AcceptBackoff::new("admin");
                loop {
                    let (stream, peer) = backoff.accept(|| admin.accept()).await;
                    let accepted_at = Instant::now();
                    let Ok(permit) = admin_limits.admit("admin", peer.ip(), false) else {
                        continue;
                    };
                    let gw = Arc::clone(&gw);
                    let prometheus = prometheus.clone();
                    let ctx = ctx.clone();
                    tokio::spawn(async move {
                        let life = Lifetime::new(accepted_at, deadlines);
                        let io = Tracked::new(stream, Arc::clone(&life), Some(permit));
                        let requests = Arc::clone(&life);
                        let svc = service_fn(move |req| {
                            let in_flight = requests.request_started(false);
                            let answer = super::admin::handle(
                                Arc::clone(&gw),
                                prometheus.clone(),
                                ctx.clone(),
                                req,
                            );
                            async move {
                                let resp = answer.await?;
                                Ok::<_, std::convert::Infallible>(resp.map(|b| {
                                    crate::net::body::boxed(crate::net::body::GuardedBody::new(
                                        b, in_flight,
                                    ))
                                }))
                            }
                        });
                        let conn = hyper::server::conn::http1::Builder::new()
                            .timer(TokioTimer::new())
                            .header_read_timeout(None)
                            .serve_connection(TokioIo::new(io), svc);
                        tokio::pin!(conn);
                        let _ = lifetime::supervise(
                            conn.as_mut(),
                            |c| c.graceful_shutdown(),
                            &life,
                            None,
                            std::future::pending(),
                            peer,
                        )
                        .await;
                    });
                }
            })
        };

        shutdown.await;
        // Every worker closes its listeners before the drain starts.
        let _ = stop_accept_tx.send(true);
        for w in &mut workers {
            let _ = (&mut w.stopped_accepting).await;
        }
        sighup_task.abort();
        draining.store(true, Ordering::Release);
        if let Some(c) = self.gateway.coordinator() {
            // Hand the lease over at once: the next leader need not wait for it to
            // expire. Other replicas live: they keep the pool.
            c.shutdown().await;
            if c.status().replicas > 1 {
                self.gateway.vm_provider().hand_over();
            }
        }
        let _ = drain_tx.send(true);
        let drain = reloader.drain_timeout();
        tracing::info!(
            open_connections = limits.open(),
            drain_timeout_seconds = drain.as_secs_f64(),
            "shutting down: draining"
        );
        tokio::select! {
            () = limits.all_closed() => {}
            () = tokio::time::sleep(drain) => {
                tracing::warn!(
                    open_connections = limits.open(),
                    "drain timeout reached; closing the remaining connections and tunnels"
                );
            }
            () = shutdown_signal() => {
                tracing::warn!("second signal: closing the remaining connections now");
            }
        }
        // The worker runtimes end; what is left on them (connections past the drain) is
        // dropped.
        let _ = exit_tx.send(true);
        join_workers(workers).await;
        admin_task.abort();
        self.gateway.shutdown_backends().await;
        if let Some(e) = self.gateway.trace_exporter() {
            // Flushes the queued spans; blocks on the batch processor's thread.
            let e = Arc::clone(e);
            let _ = tokio::task::spawn_blocking(move || e.shutdown()).await;
        }
        tracing::info!("stopped");
        Ok(())
    }
}

/// Longest wait, when a worker runtime ends, for its blocking tasks.
const WORKER_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(1);

/// One data-plane worker (see the [module docs](self)): its listeners, registered with
/// its own runtime once its thread runs, and what it shares with the other workers.
struct DataPlane {
    /// 0-based; its upstream pool shard is `index + 1`.
    index: usize,
    /// Its proxy listener.
    proxy: std::net::TcpListener,
    /// Its TLS listener and the certificate in force (shared, reloadable).
    tls: Option<(std::net::TcpListener, Arc<ArcSwap<TlsAcceptor>>)>,
    /// Serves the connections (settings shared by all workers).
    connections: Connections,
    /// The connection budget of all workers together.
    limits: ConnLimits,
    /// Turned true at shutdown: connections close gracefully once idle.
    drain: watch::Receiver<bool>,
    /// Turned true once every worker has started: only then does any accept.
    start: watch::Receiver<bool>,
    /// Turned true at shutdown: stop accepting, close the listeners.
    stop_accept: watch::Receiver<bool>,
    /// Turned true once the drain is over: the worker's runtime ends.
    exit: watch::Receiver<bool>,
}

/// A started data-plane worker.
struct Worker {
    /// Resolves once the worker has closed its listeners (or its thread ended).
    stopped_accepting: oneshot::Receiver<()>,
    thread: std::thread::JoinHandle<()>,
}

impl DataPlane {
    /// Start the worker's thread and runtime; returns once its listeners accept.
    ///
    /// # Errors
    /// [`ServeError::Worker`]: the thread, the runtime or a listener's registration
    /// failed, or the thread ended before it accepted.
    async fn start(self) -> Result<Worker, ServeError> {
        let index = self.index;
        let fail = move |source| ServeError::Worker { index, source };
        let (ready_tx, ready_rx) = oneshot::channel();
        let (stopped_tx, stopped_rx) = oneshot::channel();
        let thread = std::thread::Builder::new()
            .name(format!("spillway-data-{index}"))
            .spawn(move || self.thread_main(ready_tx, stopped_tx))
            .map_err(fail)?;
        match ready_rx.await {
            Ok(Ok(())) => Ok(Worker {
                stopped_accepting: stopped_rx,
                thread,
            }),
            // The thread ends right after reporting its error (not joined here: this
            // runtime must not block).
            Ok(Err(e)) => Err(fail(e)),
            Err(_) => Err(fail(std::io::Error::other(
                "its thread ended before it accepted connections",
            ))),
        }
    }

    /// The worker thread: pool shard, runtime, accept loops until the exit signal.
    fn thread_main(
        self,
        ready: oneshot::Sender<std::io::Result<()>>,
        stopped: oneshot::Sender<()>,
    ) {
        crate::net::client::set_pool_shard(self.index);
        let rt = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(rt) => rt,
            Err(e) => {
                let _ = ready.send(Err(e));
                return;
            }
        };
        rt.block_on(self.serve(ready, stopped));
        rt.shutdown_timeout(WORKER_SHUTDOWN_TIMEOUT);
    }

    /// Accept on this worker's listeners until `stop_accept`, then keep its connections
    /// running until `exit`.
    async fn serve(
        self,
        ready: oneshot::Sender<std::io::Result<()>>,
        stopped: oneshot::Sender<()>,
    ) {
        let DataPlane {
            index,
            proxy,
            tls,
            connections,
            limits,
            drain,
            mut start,
            mut stop_accept,
            mut exit,
        } = self;
        let registered = TcpListener::from_std(proxy).and_then(|proxy| {
            let tls = tls
                .map(|(l, a)| TcpListener::from_std(l).map(|l| (l, a)))
                .transpose()?;
            Ok((proxy, tls))
        });
        let (proxy, tls) = match registered {
            Ok(listeners) => listeners,
            Err(e) => {
                let _ = ready.send(Err(e));
                return;
            }
        };
        let _ = ready.send(Ok(()));
        let accepted_here = crate::telemetry::worker_connections(index);
        let first_request = connections.deadlines.header_read;
        let mut backoff = AcceptBackoff::new("proxy");
        let mut tls_backoff = AcceptBackoff::new("tls");
        // Accept only once every worker has its runtime (`Server::run` flips `start`);
        // a shutdown before that closes the listeners unused.
        let go = tokio::select! {
            started = start.wait_for(|go| *go) => started.is_ok(),
            _ = stop_accept.wait_for(|stop| *stop) => false,
        };
        if go {
            loop {
                tokio::select! {
                    _ = stop_accept.wait_for(|stop| *stop) => break,
                    (stream, peer) = backoff.accept(|| proxy.accept()) => {
                        let accepted_at = Instant::now();
                        accepted_here.increment(1);
                        let Some(permit) = connections.admit(&limits, "proxy", peer) else {
                            continue;
                        };
                        let _ = stream.set_nodelay(true);
                        let connections = connections.clone();
                        let drain = drain.clone();
                        tokio::spawn(async move {
                            if let Err(e) = connections
                                .serve_accepted(stream, peer, "http", None, accepted_at, Some(permit), Some(drain))
                                .await
                            {
                                tracing::debug!(error = %e, "client connection ended with an error");
                            }
                        });
                    }
                    (stream, peer, acceptor) = tls_backoff.accept(|| accept_tls(&tls)) => {
                        let accepted_at = Instant::now();
                        accepted_here.increment(1);
                        let Some(permit) = connections.admit(&limits, "tls", peer) else {
                            continue;
                        };
                        let connections = connections.clone();
                        let drain = drain.clone();
                        tokio::spawn(async move {
                            // The handshake counts against the first-request deadline.
                            let tls = match tokio::time::timeout_at(accepted_at + first_request, acceptor.accept(stream)).await {
                                Ok(Ok(tls)) => tls,
                                Ok(Err(e)) => return tracing::debug!(error = %e, %peer, "TLS handshake failed"),
                                Err(_) => {
                                    crate::telemetry::timeout(lifetime::Expiry::FirstRequest.as_str());
                                    return tracing::debug!(%peer, "TLS handshake timed out");
                                }
                            };
                            let alpn = Protocol::from_alpn(tls.get_ref().1.alpn_protocol());
                            if let Err(e) = connections
                                .serve_accepted(tls, peer, "https", alpn, accepted_at, Some(permit), Some(drain))
                                .await
                            {
                                tracing::debug!(error = %e, "TLS client connection ended with an error");
                            }
                        });
                    }
                }
            }
        }
        drop(proxy);
        drop(tls);
        let _ = stopped.send(());
        let _ = exit.wait_for(|exit| *exit).await;
    }
}

/// Wait (off the async threads) for the worker threads to end; a worker that panicked
/// is logged.
async fn join_workers(workers: Vec<Worker>) {
    let joined = tokio::task::spawn_blocking(move || {
        workers
            .into_iter()
            .enumerate()
            .filter_map(|(index, w)| w.thread.join().err().map(|_| index))
            .collect::<Vec<_>>()
    })
    .await;
    match joined {
        Ok(panicked) if panicked.is_empty() => {}
        Ok(panicked) => tracing::warn!(?panicked, "data-plane workers ended in a panic"),
        Err(e) => tracing::warn!(error = %e, "cannot wait for the data-plane workers"),
    }
}

/// Warn at start when `max_connections` client connections, each with an upstream
/// connection, could exhaust the file-descriptor limit.
fn warn_if_over_fd_limit(max_connections: usize) {
    if let Some(fds) = crate::config::open_files_limit()
        && (max_connections as u64)
            .saturating_mul(2)
            .saturating_add(64)
            > fds
    {
        tracing::warn!(
            max_connections,
            open_files_limit = fds,
            "gateway.max_connections × 2 + 64 exceeds the file-descriptor limit (RLIMIT_NOFILE): at the limit, accept and upstream connects fail; raise `ulimit -n` or lower max_connections"
        );
    }
}

/// Serves client connections, on TCP, TLS or any other byte stream (in-memory streams
/// in the request-path bench): HTTP/1.1 with upgrades and h2 (by ALPN, or prior
/// knowledge: see [`super::protocol`]), with the gateway's header limits, h2 keep-alive PINGs and
/// the connection deadlines of [`super::lifetime`], each request through
/// [`service::handle`]. Cheap to clone.
#[derive(Clone)]
pub struct Connections {
    builders: Arc<Builders>,
    gateway: Arc<Gateway>,
    /// The request path's settings in force (a reload replaces them).
    settings: Arc<ArcSwap<ServiceSettings>>,
    /// First-request, header-read and keep-alive idle deadlines.
    deadlines: Deadlines,
}

impl Connections {
    /// Connection settings from `config.gateway`; requests go through `gateway` with the
    /// request-path `settings` in force when each arrives.
    pub fn new(
        config: &Config,
        gateway: Arc<Gateway>,
        settings: Arc<ArcSwap<ServiceSettings>>,
    ) -> Self {
        let g = &config.gateway;
        let rules = g.request_rules();
        let mut http1 = hyper::server::conn::http1::Builder::new();
        http1
            .timer(TokioTimer::new())
            // The header-read deadline is `lifetime`'s: hyper's timer would also run
            // between keep-alive requests.
            .header_read_timeout(None)
            // Half-close (a client that shuts down its write side after its request) is
            // `lifetime::Tracked`'s: hyper's `half_close` would also keep a gone client's
            // call in the gateway queue.
            .keep_alive(true)
            // Header limits: hyper answers 431 itself past these outer
            // bounds (more fields than the limit; a head that does not fit its read
            // buffer); `validate::check` applies the exact ones, the same as on h2.
            .max_headers(g.max_header_count)
            .max_buf_size(rules.max_h1_head_bytes().max(MIN_HYPER_BUF_SIZE));
        // h2 limits, explicit (http-cases C12).
        let mut http2 = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
        http2
            .timer(TokioTimer::new())
            .max_concurrent_streams(g.max_concurrent_streams.get())
            .max_pending_accept_reset_streams(Some(MAX_PENDING_ACCEPT_RESET_STREAMS))
            .max_local_error_reset_streams(Some(MAX_LOCAL_ERROR_RESET_STREAMS))
            .max_header_list_size(rules.h2_max_header_list_size())
            .keep_alive_interval(
                (!g.http2_keepalive_interval_seconds.is_zero())
                    .then(|| g.http2_keepalive_interval_seconds.get()),
            )
            .keep_alive_timeout(g.http2_keepalive_timeout_seconds.get());
        Self {
            builders: Arc::new(Builders { http1, http2 }),
            gateway,
            settings,
            deadlines: Deadlines {
                header_read: g.header_read_timeout_seconds.get(),
                keepalive_idle: g.keepalive_idle_timeout_seconds.get(),
            },
        }
    }

    /// Admit a connection from `peer` on `listener` within `limits` (a trusted proxy is
    /// counted only in the total); `None`: refused, the caller drops the stream.
    fn admit(
        &self,
        limits: &ConnLimits,
        listener: &'static str,
        peer: SocketAddr,
    ) -> Option<ConnPermit> {
        let trusted = self.settings.load().trusted_proxies.contains(peer.ip());
        limits.admit(listener, peer.ip(), trusted).ok()
    }

    /// Serve one client connection from `peer`, accepted now, until it ends (or, once
    /// `drain` turns true, until a graceful shutdown has let its in-flight requests
    /// finish), under the connection deadlines, or until the client cancels too many
    /// requests (see [`MAX_CANCELLED_REQUESTS`]).
    ///
    /// # Errors
    /// The connection's protocol or I/O error (logged at debug level by the caller).
    pub async fn serve<I>(
        &self,
        io: I,
        peer: SocketAddr,
        scheme: &'static str,
        drain: Option<tokio::sync::watch::Receiver<bool>>,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>>
    where
        I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        self.serve_accepted(io, peer, scheme, None, Instant::now(), None, drain)
            .await
    }

    /// [`Self::serve`] for a connection accepted at `accepted_at` (its first-request
    /// deadline counts from then), in the protocol `alpn` chose on TLS (`None`: the
    /// client's first bytes choose), holding `permit` until the byte stream is dropped.
    #[allow(clippy::too_many_arguments)]
    async fn serve_accepted<I>(
        &self,
        io: I,
        peer: SocketAddr,
        scheme: &'static str,
        alpn: Option<Protocol>,
        accepted_at: Instant,
        permit: Option<ConnPermit>,
        drain: Option<tokio::sync::watch::Receiver<bool>>,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>>
    where
        I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let life = Lifetime::new(accepted_at, self.deadlines);
        let io = Tracked::new(io, Arc::clone(&life), permit);
        let gw = Arc::clone(&self.gateway);
        let settings = Arc::clone(&self.settings);
        let cancels = Arc::new(CancelWatch::default());
        let watch = Arc::clone(&cancels);
        let requests = Arc::clone(&life);
        let svc = service_fn(move |mut req: http::Request<hyper::body::Incoming>| {
            req.extensions_mut().insert(requests.client_closed());
            let gw = Arc::clone(&gw);
            // A request keeps the settings in force when it arrived (reload).
            let settings = settings.load_full();
            let pending = watch.begin();
            let in_flight = requests.request_started(req.version() == http::Version::HTTP_2);
            // Boxed: hyper keeps one slot of the service's future type per connection
            // for the connection's whole life, and the request path's future is large
            // (≈ 10 KiB); boxed per request, an idle connection holds a pointer.
            let answer = Box::pin(service::handle(gw, settings, req, peer, scheme));
            async move {
                let resp = answer.await;
                pending.done();
                // In flight until the response body ended (or was dropped).
                Ok::<_, std::convert::Infallible>(resp.map(|b| {
                    crate::net::body::boxed(crate::net::body::GuardedBody::new(b, in_flight))
                }))
            }
        });
        let conn = self.builders.serve(io, svc, alpn);
        tokio::pin!(conn);
        let flood = async {
            cancels.tripped.notified().await;
            tracing::warn!(
                %peer,
                cancelled = cancels.cancelled.load(Ordering::Relaxed),
                requests = cancels.started.load(Ordering::Relaxed),
                "closing a client connection that cancels most of its requests (rapid reset)"
            );
        };
        lifetime::supervise(
            conn.as_mut(),
            |c| c.graceful_shutdown(),
            &life,
            drain,
            flood,
            peer,
        )
        .await
    }
}

/// One `accept` on the TLS listener with the certificate in force now; never ready
/// without a TLS listener.
async fn accept_tls(
    tls: &Option<(TcpListener, Arc<ArcSwap<TlsAcceptor>>)>,
) -> std::io::Result<(TcpStream, SocketAddr, TlsAcceptor)> {
    match tls {
        Some((listener, acceptor)) => {
            let (stream, peer) = listener.accept().await?;
            let _ = stream.set_nodelay(true);
            // The certificate in force now (a reload may have replaced it).
            let acceptor = TlsAcceptor::clone(&acceptor.load());
            Ok((stream, peer, acceptor))
        }
        None => std::future::pending().await,
    }
}

/// First pause after a failed `accept`.
pub const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(5);
/// Longest pause after failed `accept`s in a row.
pub const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);
/// At most one log line per listener per this interval while `accept` keeps failing.
pub const ACCEPT_LOG_INTERVAL: Duration = Duration::from_secs(5);

/// Back-off of an accept loop ([`AcceptBackoff::accept`]): at the file-descriptor limit
/// `accept` fails at once (EMFILE), and retrying at once spins a core. Each failure in a row
/// doubles the pause from [`ACCEPT_BACKOFF_MIN`] to [`ACCEPT_BACKOFF_MAX`]; failures
/// are counted in `spillway_accept_errors_total{listener}` and logged once per
/// [`ACCEPT_LOG_INTERVAL`] with the number suppressed.
struct AcceptBackoff {
    listener: &'static str,
    pause: Duration,
    last_log: Option<tokio::time::Instant>,
    unlogged: u64,
}

impl AcceptBackoff {
    fn new(listener: &'static str) -> Self {
        Self {
            listener,
            pause: Duration::ZERO,
            last_log: None,
            unlogged: 0,
        }
    }

    /// Run `accept` until it succeeds, pausing after each failure ([`Self::failed`]):
    /// the one accept loop of the proxy, TLS and admin listeners. Cancel-safe when
    /// `accept` is (a listener's `accept` is): the accept loops `select!` it against
    /// their stop signal.
    async fn accept<T, F: Future<Output = std::io::Result<T>>>(
        &mut self,
        mut accept: impl FnMut() -> F,
    ) -> T {
        loop {
            match accept().await {
                Ok(accepted) => {
                    self.succeeded();
                    return accepted;
                }
                Err(e) => self.failed(&e).await,
            }
        }
    }

    fn succeeded(&mut self) {
        self.pause = Duration::ZERO;
    }

    async fn failed(&mut self, e: &std::io::Error) {
        crate::telemetry::accept_error(self.listener);
        self.unlogged += 1;
        let now = tokio::time::Instant::now();
        if self
            .last_log
            .is_none_or(|at| now.duration_since(at) >= ACCEPT_LOG_INTERVAL)
        {
            tracing::warn!(
                listener = self.listener,
                error = %e,
                failures = self.unlogged,
                "accept failed; backing off (file-descriptor limit?)"
            );
            self.last_log = Some(now);
            self.unlogged = 0;
        }
        self.pause = (self.pause * 2).clamp(ACCEPT_BACKOFF_MIN, ACCEPT_BACKOFF_MAX);
        tokio::time::sleep(self.pause).await;
    }
}

/// Reload the configuration on every SIGHUP; a failed reload is
/// logged and changes nothing.
async fn reload_on_sighup(reloader: Arc<super::reload::Reloader>) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let Ok(mut hup) = signal(SignalKind::hangup()) else {
            return tracing::warn!("cannot install a SIGHUP handler; reload with POST /reload");
        };
        while hup.recv().await.is_some() {
            if let Err(e) = reloader.reload().await {
                tracing::warn!(error = %e, "reload refused; the running configuration stays");
            }
        }
    }
    #[cfg(not(unix))]
    std::future::pending::<()>().await;
}

/// Resolves on SIGTERM or SIGINT (Ctrl-C).
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate()).expect("can install a SIGTERM handler");
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

impl From<super::async_calls::store::StoreError> for ServeError {
    fn from(e: super::async_calls::store::StoreError) -> Self {
        ServeError::AsyncStore(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An `accept` that fails with EMFILE `fails` times, then yields `n`; counts calls.
    fn flaky(
        fails: u32,
        calls: &std::cell::Cell<u32>,
    ) -> impl Future<Output = std::io::Result<u32>> {
        let n = calls.get();
        calls.set(n + 1);
        std::future::ready(if n < fails {
            // EMFILE (24 on Linux, macOS and the BSDs).
            Err(std::io::Error::from_raw_os_error(24))
        } else {
            Ok(n)
        })
    }

    /// At the descriptor limit an accept loop pauses 5, 10, 20 … ms (at most 1 s)
    /// between retries instead of spinning, and a success starts again at 5 ms: the
    /// back-off every listener (proxy, TLS, admin) uses.
    #[tokio::test(start_paused = true)]
    async fn accept_at_the_descriptor_limit_backs_off_doubling_up_to_its_cap() {
        let mut backoff = AcceptBackoff::new("admin");
        let calls = std::cell::Cell::new(0);
        let t0 = Instant::now();
        assert_eq!(backoff.accept(|| flaky(4, &calls)).await, 4);
        assert_eq!(calls.get(), 5);
        assert_eq!(t0.elapsed(), Duration::from_millis(5 + 10 + 20 + 40));

        calls.set(0);
        let t1 = Instant::now();
        assert_eq!(backoff.accept(|| flaky(1, &calls)).await, 1);
        assert_eq!(
            t1.elapsed(),
            ACCEPT_BACKOFF_MIN,
            "a success resets the pause"
        );

        calls.set(0);
        let t2 = Instant::now();
        backoff.accept(|| flaky(12, &calls)).await;
        let doubling: Duration = (0..8).map(|i| ACCEPT_BACKOFF_MIN * (1 << i)).sum();
        assert_eq!(
            t2.elapsed(),
            doubling + ACCEPT_BACKOFF_MAX * 4,
            "capped at 1 s"
        );
    }

    /// A stop signal ends an accept loop while it backs off.
    #[tokio::test(start_paused = true)]
    async fn a_stop_during_the_back_off_ends_the_accept_loop() {
        let mut backoff = AcceptBackoff::new("admin");
        let calls = std::cell::Cell::new(0);
        let stopped = tokio::select! {
            _ = backoff.accept(|| flaky(u32::MAX, &calls)) => false,
            _ = tokio::time::sleep(Duration::from_millis(100)) => true,
        };
        assert!(stopped);
        assert!((2..10).contains(&calls.get()), "{} accepts", calls.get());
    }
}
