//! The configuration schema: serde structs with documented defaults and their semantic
//! validation. See `config/reference.yaml` for the annotated version.

use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::num::{NonZeroU32, NonZeroU64, NonZeroUsize};
use std::path::PathBuf;

use super::defaults::{
    DEFAULT_ADMIN_LISTEN, DEFAULT_ALPHA, DEFAULT_BETA, DEFAULT_BOOT_TIMEOUT_SECONDS,
    DEFAULT_CONNECT_TIMEOUT_SECONDS, DEFAULT_DECISION_EPOCHS, DEFAULT_DRAIN_TIMEOUT_SECONDS,
    DEFAULT_EPOCH_SECONDS, DEFAULT_HEADER_READ_TIMEOUT_SECONDS,
    DEFAULT_HTTP2_KEEPALIVE_INTERVAL_SECONDS, DEFAULT_HTTP2_KEEPALIVE_TIMEOUT_SECONDS,
    DEFAULT_IDLE_TIMEOUT_SECONDS, DEFAULT_KEEPALIVE_IDLE_TIMEOUT_SECONDS, DEFAULT_LISTEN,
    DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_CONCURRENT_STREAMS, DEFAULT_PHI,
    DEFAULT_REQUEST_BODY_IDLE_TIMEOUT_SECONDS, DEFAULT_RESPONSE_BODY_IDLE_TIMEOUT_SECONDS,
    DEFAULT_RHO, DEFAULT_TUNNEL_IDLE_TIMEOUT_SECONDS, DEFAULT_UPSTREAM_TIMEOUT_SECONDS,
    MAX_HEAD_LIMIT_BYTES,
};
use super::duration::{Millis, Seconds};
use super::function_tier::{
    FunctionTierConfig, ProviderContext, default_health_path, default_probe_interval,
};
use super::issues::{
    ConfigIssue, Issues, aws_feature_missing, check_command, check_path, check_upstream,
};
use super::url::HttpUrl;
use crate::net::validate::{
    self, EscapedSlashesAction, PathRules, RequestRules, UnderscoresAction,
};
use crate::policy::controller::ControllerParams;
use crate::policy::core::CoreParams;
use crate::policy::cost::{self, Architecture, FunctionPricing};
use crate::policy::monitor::MonitorParams;
use crate::policy::rmax::RMaxParams;
use crate::policy::scaling::LibraScalingParams;

/// The whole configuration file.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Schema version; only `1` exists.
    #[serde(default = "one")]
    pub version: u32,
    /// Listeners, timeouts, limits and forwarding rules of the data plane.
    #[serde(default)]
    pub gateway: GatewayConfig,
    /// LIBRA's traffic monitor, scaling manager and balancer parameters.
    #[serde(default)]
    pub libra: LibraConfig,
    /// Prices used for the cost-indifference point and the simulator's bill.
    #[serde(default)]
    pub pricing: PricingConfig,
    /// The VM pool provider. Required by `spillway serve`; the simulator models VMs in
    /// `sim:` instead.
    #[serde(default)]
    pub vm_pool: Option<VmPoolConfig>,
    /// The function tier provider. Required by `spillway serve`.
    #[serde(default)]
    pub function_tier: Option<FunctionTierConfig>,
    /// Function zones, edge and cloud (FaaSim two-tier placement; `super::zones`).
    /// `function_tier`, when set too, is one more cloud zone after these.
    #[serde(default)]
    pub function_zones: Vec<super::zones::FunctionZoneConfig>,
    /// FaaSim placement policy between edge and cloud zones: `edge_first` or
    /// `warm_first`.
    #[serde(default)]
    pub placement: super::zones::PlacementConfig,
    /// Simulator-only settings (ignored by `spillway serve`).
    #[serde(default)]
    pub sim: crate::config::sim::SimSection,
    /// The gateway queue (call scheduling §4); absent: no queue, 503 at once.
    #[serde(default)]
    pub queue: Option<super::queue::QueueConfig>,
    /// Named route keys (a call's "function" for the queue's per-key history).
    #[serde(default)]
    pub routes: Vec<super::routes::RouteConfig>,
    /// Asynchronous calls and their delay queue (ProFaaStinate §3).
    #[serde(default, rename = "async")]
    pub async_calls: crate::config::delay::AsyncConfig,
    /// Several gateway replicas, one decision (`crate::coord`): `type: none` (one
    /// gateway, the default) or `type: redis`.
    #[serde(default)]
    pub coordination: crate::config::coordination::CoordinationConfig,
    /// Span export (`telemetry.otlp`: OTLP/HTTP, the `otlp` cargo feature).
    #[serde(default)]
    pub telemetry: crate::config::telemetry::TelemetryConfig,
}

fn one() -> u32 {
    1
}

/// `gateway:` — the data plane.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GatewayConfig {
    /// Plain-HTTP listen address (HTTP/1.1 and h2c), `IP:PORT` or `HOST:PORT`
    /// ([`resolve_listen`]). Port 0 picks a free port.
    #[serde(deserialize_with = "listen_addr")]
    pub listen: SocketAddr,
    /// Admin listener (`/livez`, `/readyz`, `/healthz`, `/metrics`, `/status`,
    /// `/reload`).
    #[serde(deserialize_with = "listen_addr")]
    pub admin_listen: SocketAddr,
    /// File holding the admin bearer token (surrounding whitespace ignored). With a
    /// token, `/status`, `/metrics` and `/reload` need `Authorization: Bearer TOKEN`;
    /// the probes (`/livez`, `/readyz`, `/healthz`) stay open. A non-loopback
    /// `admin_listen` needs a token; without one, requests whose `Host` or `Origin` is
    /// not loopback are refused (403).
    pub admin_token_file: Option<std::path::PathBuf>,
    /// Name of an environment variable holding the admin bearer token (instead of
    /// `admin_token_file`).
    pub admin_token_env: Option<String>,
    /// Optional TLS listener (ALPN h2 and http/1.1).
    pub tls: Option<TlsConfig>,
    /// Peers (CIDRs) whose X-Forwarded-* headers are trusted and appended to.
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// Largest accepted request body; larger ones get 413.
    pub max_body_bytes: NonZeroU64,
    /// Time allowed to receive a request's head, from its first byte (slowloris guard);
    /// also the first-request deadline of every client connection, counted from accept
    /// (TLS handshake included) on every listener and protocol. Then the connection is
    /// closed.
    pub header_read_timeout_seconds: Seconds,
    /// TCP connect timeout to upstreams.
    pub connect_timeout_seconds: Seconds,
    /// Time to wait for an upstream's response head after the request body was sent;
    /// then 504 (a slow upload does not count).
    pub upstream_timeout_seconds: Seconds,
    /// Longest pause between two pieces of a client's request body; then 408 and the
    /// upstream request is aborted.
    pub request_body_idle_timeout_seconds: Seconds,
    /// Longest pause between two pieces of an upstream's response body; then the
    /// client's response is aborted and the VM slot or function lease freed.
    pub response_body_idle_timeout_seconds: Seconds,
    /// Longest time an `Upgrade` tunnel (WebSocket) may carry no byte either way; then
    /// it is closed and its VM slot freed.
    pub tunnel_idle_timeout_seconds: Seconds,
    /// Idle time before a pooled upstream connection is closed.
    pub idle_timeout_seconds: Seconds,
    /// Retries of failed VM attempts per first attempt in the retry window (0.2 = at
    /// most 20 % more requests upstream). `0` with
    /// `retry_budget_min_per_second: 0` turns retries off.
    pub retry_budget_ratio: f64,
    /// The retry budget's sliding window.
    pub retry_budget_window_seconds: Seconds,
    /// Retries per second of window allowed whatever the traffic (so a quiet gateway can
    /// still retry).
    pub retry_budget_min_per_second: f64,
    /// Interval between health probes of every ready VM (`health_path`) and of parked
    /// `static` members; a VM failing two in a row is replaced at once (a `static`
    /// member is parked and re-added when it answers again).
    /// `0` turns the probes off.
    pub health_check_interval_seconds: Seconds,
    /// Time in-flight requests get to finish after SIGTERM/SIGINT.
    pub drain_timeout_seconds: Seconds,
    /// Largest request header section, bytes: Σ (name + value + 4) over the fields, the
    /// same on HTTP/1.1 and h2; larger → 431 (http-cases C11 (b)).
    pub max_header_bytes: usize,
    /// Most request header fields (h1 and h2); more → 431 (http-cases C11 (c)).
    pub max_header_count: usize,
    /// Longest request target (path and query), bytes; longer → 414.
    pub max_uri_bytes: usize,
    /// Most concurrent streams per h2 client connection (http-cases C12).
    pub max_concurrent_streams: NonZeroU32,
    /// Normalize request paths per RFC 3986 (decode unreserved, resolve dot-segments)
    /// before routing; when off, paths with dot-segments are refused.
    pub normalize_path: bool,
    /// Merge runs of `/` in request paths.
    pub merge_slashes: bool,
    /// `%2F`, `%5C` and `\` in paths: `keep_unchanged`, `reject_request` (default),
    /// `unescape_and_redirect` or `unescape_and_forward` (Envoy's option of that name).
    pub path_with_escaped_slashes_action: EscapedSlashesAction,
    /// One log line per request at INFO, target `spillway::access` (also
    /// `spillway serve --access-log`).
    pub access_log: bool,
    /// A request header naming the caller's edge zone (function zones), honoured only
    /// when the peer is in `trusted_proxies`; otherwise `client_cidrs` decide.
    pub origin_zone_header: Option<String>,
    /// Whose `x-request-id` is kept (a valid one, [`crate::net::request_id`]): `any`
    /// client's (default), only `trusted_proxies`', or `none` (always a new one).
    pub request_id_trust: crate::net::request_id::RequestIdTrust,
    /// Allow user-given upstream addresses (static `urls`, the `http` function tier's
    /// `url`, EC2 tag addresses) on the gateway's own host (loopback, `localhost`).
    /// Checked at parse time and on every resolved address at connect time
    /// ([`crate::net::upstream`]). Refused either way: link-local addresses, cloud
    /// metadata and credential agents, the gateway's own listeners, and non-canonical
    /// IP spellings.
    pub allow_loopback_upstreams: bool,
    /// Longest time a client connection may wait for its next request (HTTP/1.1
    /// keep-alive; h2: no stream open); then it is closed (h2: GOAWAY). Must exceed the
    /// idle timeout of a load balancer in front of the gateway.
    pub keepalive_idle_timeout_seconds: Seconds,
    /// Interval of h2 keep-alive PINGs to clients; `0` turns them off.
    pub http2_keepalive_interval_seconds: Seconds,
    /// Wait for a PING's acknowledgement; then the h2 connection is closed.
    pub http2_keepalive_timeout_seconds: Seconds,
    /// Most client connections open at once over the plain and TLS listeners; one more
    /// is closed at accept. Absent: derived from the file-descriptor limit
    /// ([`GatewayConfig::connection_limits`]).
    pub max_connections: Option<NonZeroUsize>,
    /// Most client connections from one client IP address (peers in `trusted_proxies`
    /// only count towards `max_connections`). Absent: a quarter of `max_connections`.
    pub max_connections_per_client_ip: Option<NonZeroUsize>,
    /// Request header fields whose name holds `_` (`X_Forwarded_For`, which CGI/WSGI-style
    /// backends read as `X-Forwarded-For`): `drop_header` (default), `reject_request`
    /// (400) or `allow` (Envoy's option of that name).
    pub headers_with_underscores_action: UnderscoresAction,
    /// Most header fields in an upstream response head; more → 502, and the request is
    /// not sent again (its upstream processed it).
    pub max_response_header_count: usize,
    /// Largest upstream response head (status line and header fields), bytes; larger →
    /// 502, not sent again. At least 8192 is used.
    pub max_response_header_bytes: usize,
    /// `Upgrade` protocols forwarded to VMs (case-insensitive names, without version); a
    /// request asking for any other is forwarded without `Upgrade`. `h2c` is refused: it
    /// would carry h2 past the gateway's request rules.
    pub upgrade_protocols: Vec<String>,
    /// Trust and identity towards `https://` upstreams (absent: the system's root
    /// certificates, no client certificate).
    pub upstream_tls: Option<UpstreamTlsConfig>,
    /// Data-plane threads: each runs its own accept loop on its own `SO_REUSEPORT`
    /// listener (Linux; elsewhere one listener shared by all) with a current-thread
    /// runtime and its own upstream connection pool. Absent: one per core
    /// ([`GatewayConfig::worker_threads`]). At most [`MAX_WORKER_THREADS`].
    pub worker_threads: Option<NonZeroUsize>,
}

/// The most data-plane threads `gateway.worker_threads` may ask for.
pub const MAX_WORKER_THREADS: usize = 1024;

impl GatewayConfig {
    /// Data-plane threads in force: `worker_threads`, or the number of cores the
    /// process may run on (`std::thread::available_parallelism`; 1 when unknown).
    pub fn worker_threads(&self) -> usize {
        self.worker_threads.map_or_else(
            || std::thread::available_parallelism().map_or(1, NonZeroUsize::get),
            NonZeroUsize::get,
        )
    }

    /// The TLS configuration of `https://` upstreams: `None` when `upstream_tls` is
    /// absent (the upstream client then trusts the system roots, loaded on the first
    /// HTTPS connection).
    ///
    /// # Errors
    /// [`crate::net::tls::TlsError`] naming the file.
    pub fn upstream_tls_config(
        &self,
    ) -> Result<Option<std::sync::Arc<rustls::ClientConfig>>, crate::net::tls::TlsError> {
        self.upstream_tls
            .as_ref()
            .map(|t| {
                crate::net::tls::load_client_config(crate::net::tls::ClientTlsFiles {
                    ca_file: t.ca_file.as_deref(),
                    system_roots: t.system_roots,
                    client_cert_file: t.client_cert_file.as_deref(),
                    client_key_file: t.client_key_file.as_deref(),
                })
            })
            .transpose()
    }

    /// The admin bearer token, when one is configured.
    ///
    /// # Errors
    /// In words: an unreadable or empty token file, an unset or empty variable.
    pub fn admin_token(&self) -> Result<Option<String>, String> {
        let token = match (&self.admin_token_file, &self.admin_token_env) {
            (Some(path), _) => std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read {}: {e}", path.display()))?,
            (None, Some(var)) => {
                std::env::var(var).map_err(|_| format!("environment variable {var} is not set"))?
            }
            (None, None) => return Ok(None),
        };
        let token = token.trim().to_string();
        if token.is_empty() {
            return Err("the admin token is empty".into());
        }
        Ok(Some(token))
    }

    /// The problem with exposing the admin listener, if any: a non-loopback
    /// `admin_listen` without a token.
    pub fn admin_exposure_issue(&self) -> Option<String> {
        (!self.admin_listen.ip().is_loopback()
            && self.admin_token_file.is_none()
            && self.admin_token_env.is_none())
        .then(|| {
            format!(
                "{} is not a loopback address: set gateway.admin_token_file or gateway.admin_token_env (the admin API would be open to the network)",
                self.admin_listen
            )
        })
    }

    /// The policy core's retry budget ([`crate::policy::retry`]).
    pub fn retry_budget(&self) -> crate::policy::retry::RetryBudgetParams {
        crate::policy::retry::RetryBudgetParams {
            ratio: self.retry_budget_ratio,
            window: self.retry_budget_window_seconds.get(),
            min_per_second: self.retry_budget_min_per_second,
        }
    }

    /// `(max_connections, max_connections_per_client_ip)` in force: the configured values,
    /// or derived ones — `max_connections` = ([`open_files_limit`] − 64) / 2, within
    /// [16, 10000] (each client connection may hold one upstream connection; 64 file
    /// descriptors stay for listeners, the admin listener, files and child processes),
    /// and a quarter of it (at least 1) per client IP.
    pub fn connection_limits(&self) -> (usize, usize) {
        let total = self.max_connections.map_or_else(
            || {
                let fds = open_files_limit().unwrap_or(1024);
                usize::try_from(fds.saturating_sub(64) / 2)
                    .unwrap_or(usize::MAX)
                    .clamp(16, 10_000)
            },
            NonZeroUsize::get,
        );
        let per_ip = self
            .max_connections_per_client_ip
            .map_or((total / 4).max(1), NonZeroUsize::get);
        (total, per_ip)
    }

    /// The request validation settings of this gateway ([`crate::net::validate`]).
    pub fn request_rules(&self) -> RequestRules {
        RequestRules {
            max_header_bytes: self.max_header_bytes,
            max_header_count: self.max_header_count,
            max_uri_bytes: self.max_uri_bytes,
            path: PathRules {
                normalize: self.normalize_path,
                merge_slashes: self.merge_slashes,
                escaped_slashes: self.path_with_escaped_slashes_action,
            },
            underscores: self.headers_with_underscores_action,
        }
    }
}

impl Default for GatewayConfig {
    fn default() -> Self {
        Self {
            listen: DEFAULT_LISTEN.parse().expect("valid"),
            admin_listen: DEFAULT_ADMIN_LISTEN.parse().expect("valid"),
            admin_token_file: None,
            admin_token_env: None,
            tls: None,
            trusted_proxies: Vec::new(),
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            header_read_timeout_seconds: DEFAULT_HEADER_READ_TIMEOUT_SECONDS,
            keepalive_idle_timeout_seconds: DEFAULT_KEEPALIVE_IDLE_TIMEOUT_SECONDS,
            http2_keepalive_interval_seconds: DEFAULT_HTTP2_KEEPALIVE_INTERVAL_SECONDS,
            http2_keepalive_timeout_seconds: DEFAULT_HTTP2_KEEPALIVE_TIMEOUT_SECONDS,
            max_connections: None,
            max_connections_per_client_ip: None,
            headers_with_underscores_action: UnderscoresAction::DropHeader,
            max_response_header_count: 100,
            max_response_header_bytes: 64 * 1024,
            upgrade_protocols: vec!["websocket".to_string()],
            connect_timeout_seconds: DEFAULT_CONNECT_TIMEOUT_SECONDS,
            upstream_timeout_seconds: DEFAULT_UPSTREAM_TIMEOUT_SECONDS,
            request_body_idle_timeout_seconds: DEFAULT_REQUEST_BODY_IDLE_TIMEOUT_SECONDS,
            response_body_idle_timeout_seconds: DEFAULT_RESPONSE_BODY_IDLE_TIMEOUT_SECONDS,
            tunnel_idle_timeout_seconds: DEFAULT_TUNNEL_IDLE_TIMEOUT_SECONDS,
            idle_timeout_seconds: DEFAULT_IDLE_TIMEOUT_SECONDS,
            retry_budget_ratio: 0.2,
            retry_budget_window_seconds: Seconds::from_secs(10),
            retry_budget_min_per_second: 1.0,
            health_check_interval_seconds: Seconds::from_secs(5),
            drain_timeout_seconds: DEFAULT_DRAIN_TIMEOUT_SECONDS,
            max_header_bytes: validate::DEFAULT_MAX_HEADER_BYTES,
            max_header_count: validate::DEFAULT_MAX_HEADER_COUNT,
            max_uri_bytes: validate::DEFAULT_MAX_URI_BYTES,
            max_concurrent_streams: DEFAULT_MAX_CONCURRENT_STREAMS,
            normalize_path: true,
            merge_slashes: true,
            path_with_escaped_slashes_action: EscapedSlashesAction::RejectRequest,
            access_log: false,
            origin_zone_header: None,
            request_id_trust: crate::net::request_id::RequestIdTrust::Any,
            allow_loopback_upstreams: false,
            upstream_tls: None,
            worker_threads: None,
        }
    }
}

/// The process's soft `RLIMIT_NOFILE` (most open file descriptors), when known (Linux);
/// `None` elsewhere or when unlimited.
pub fn open_files_limit() -> Option<u64> {
    #[cfg(target_os = "linux")]
    {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes into the struct we pass and reads nothing else.
        #[allow(unsafe_code)]
        let ok = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0;
        (ok && lim.rlim_cur != libc::RLIM_INFINITY).then_some(lim.rlim_cur)
    }
    #[cfg(not(target_os = "linux"))]
    None
}

/// A listen address from `IP:PORT` (`127.0.0.1:8080`, `[::1]:8080`) or `HOST:PORT`
/// (`localhost:8080`, resolved now; the first IPv4 address wins, as `localhost` should
/// mean 127.0.0.1 where both families resolve).
///
/// # Errors
/// In words: a missing port, or a host that does not resolve.
pub fn resolve_listen(text: &str) -> Result<SocketAddr, String> {
    use std::net::ToSocketAddrs as _;
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok(addr);
    }
    let Some((host, port)) = text.rsplit_once(':') else {
        return Err(format!(
            "expected HOST:PORT or IP:PORT (like 127.0.0.1:8080 or localhost:8080), found `{text}`"
        ));
    };
    if host.is_empty() || port.parse::<u16>().is_err() {
        return Err(format!(
            "expected HOST:PORT or IP:PORT (like 127.0.0.1:8080 or localhost:8080), found `{text}`"
        ));
    }
    let addrs: Vec<SocketAddr> = text
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve `{text}`: {e}"))?
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .copied()
        .ok_or_else(|| format!("cannot resolve `{text}`: no address"))
}

fn listen_addr<'de, D: serde::Deserializer<'de>>(d: D) -> Result<SocketAddr, D::Error> {
    let text = String::deserialize(d)?;
    resolve_listen(&text).map_err(serde::de::Error::custom)
}

/// `gateway.tls:` — a TLS listener.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// TLS listen address (`IP:PORT` or `HOST:PORT`).
    #[serde(deserialize_with = "listen_addr")]
    pub listen: SocketAddr,
    /// PEM certificate chain.
    pub cert_file: PathBuf,
    /// PEM private key.
    pub key_file: PathBuf,
}

/// `gateway.upstream_tls:` — how the gateway verifies `https://` upstreams (static VM
/// URLs, `http` function tiers and zones, EC2 instances with `scheme: https`) and the
/// client certificate it presents to those that ask (mutual TLS).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UpstreamTlsConfig {
    /// PEM bundle of CA certificates trusted for upstreams (a private CA), in addition
    /// to the system's roots when `system_roots`.
    pub ca_file: Option<PathBuf>,
    /// Trust the system's root certificates (`SSL_CERT_FILE`/`SSL_CERT_DIR`, or the
    /// platform store). `false` with a `ca_file`: only that CA.
    pub system_roots: bool,
    /// PEM certificate chain presented to upstreams that ask for a client certificate.
    pub client_cert_file: Option<PathBuf>,
    /// PEM private key of `client_cert_file` (PKCS#8, PKCS#1 or SEC1).
    pub client_key_file: Option<PathBuf>,
}

impl Default for UpstreamTlsConfig {
    fn default() -> Self {
        Self {
            ca_file: None,
            system_roots: true,
            client_cert_file: None,
            client_key_file: None,
        }
    }
}

/// `libra:` — LIBRA §III parameters.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LibraConfig {
    /// Epoch length, seconds (LIBRA §III-A).
    pub epoch_seconds: Seconds,
    /// α: EWMA weight of the newest epoch count, 0–1.
    pub alpha: f64,
    /// β: EWMA weight of the newest deviation, 0–1.
    pub beta: f64,
    /// φ: VMs are provisioned for avg + φ·std.
    pub phi: f64,
    /// ρ: the balancer sends at most ρ·vm_reqs requests/s to VMs, (0, 1].
    pub rho: f64,
    /// K: the scaling manager runs every K epochs.
    pub decision_epochs: NonZeroU32,
    /// F: the first scaling decision after F epochs, then every K (absent: K). The LIBRA
    /// authors' simulator decides after epochs 1, K + 1, … (F = 1).
    pub first_decision_epoch: Option<NonZeroU32>,
    /// The balancer's budget rule (LIBRA §III-C): `quota` (the first ρ·vm_reqs·E requests
    /// of each epoch go to VMs) or `token_bucket` (ρ·vm_reqs tokens/s, one second deep).
    pub balancer: BalancerRule,
    /// `quota` only: truncate the quota to `⌊ρ·⌊vm_reqs·E⌋⌋` as the authors' simulator
    /// does (`int(ρ·int(avg+φ·std))`); false: the real value, fractions carried.
    pub quota_truncate: bool,
    /// r_max: requests/s one VM serves within the SLA.
    pub r_max_rps: f64,
    /// Fewest VMs while avg is above the CIP.
    pub min_vms: u32,
    /// Most VMs.
    pub max_vms: u32,
    /// Cost-indifference point, requests/s. When absent it is computed from `pricing`.
    pub cip_rps: Option<f64>,
    /// Deprecated alias of `vm_pool.slots_per_vm` (the simulator, which has no
    /// `vm_pool`, reads it as the per-VM cap): spill when the least-loaded ready VM
    /// already has this many requests in flight (absent: no cap, the paper's balancer).
    pub max_outstanding_per_vm: Option<NonZeroU32>,
    /// Adapt r_max with a PID controller on the measured VM latency percentile
    /// (LIBRA §III-B; `policy::rmax`). Absent: `r_max_rps` is fixed; present: it is the
    /// start value.
    pub r_max_adaptive: Option<RMaxAdaptiveConfig>,
}

/// `libra.balancer`: the VM budget rule of LIBRA's balancer (LIBRA §III-C).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BalancerRule {
    /// A bucket refilled at ρ·vm_reqs tokens/s holding one second's budget: smooth, but up
    /// to two seconds' budget in one second after a quiet one.
    #[default]
    TokenBucket,
    /// The first ρ·vm_reqs·E requests of each epoch go to VMs, the rest spill (the paper's
    /// rule and the authors' simulator).
    Quota,
}

/// `libra.r_max_adaptive:` — the adaptive r_max controller (LIBRA §III-B, Alg. 1
/// line 3). Defaults are derived in `policy::rmax` (tuning).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RMaxAdaptiveConfig {
    /// The VM latency percentile controlled, in (0, 100). Default 99.
    #[serde(default = "default_target_percentile")]
    pub target_percentile: f64,
    /// The latency that percentile should meet, ms (required; above the VMs' no-load
    /// latency at that percentile).
    pub target_ms: Millis,
    /// Proportional gain, per unit of `ln(target / measured)`. Default 0.1.
    #[serde(default = "default_kp")]
    pub kp: f64,
    /// Integral gain, per period (> 0). Default 0.5.
    #[serde(default = "default_ki")]
    pub ki: f64,
    /// Derivative gain, per period. Default 0.
    #[serde(default)]
    pub kd: f64,
    /// Lowest r_max, requests/s. Default `r_max_rps / 4`.
    #[serde(default)]
    pub min_rps: Option<f64>,
    /// Highest r_max, requests/s. Default `4 · r_max_rps`.
    #[serde(default)]
    pub max_rps: Option<f64>,
    /// Largest change of r_max per period, requests/s. Default `r_max_rps / 4`.
    #[serde(default)]
    pub max_step_rps: Option<f64>,
    /// Control period, epochs. Default `decision_epochs` (adjust right before each scaling
    /// decision).
    #[serde(default)]
    pub interval_epochs: Option<NonZeroU32>,
}

fn default_target_percentile() -> f64 {
    99.0
}

fn default_kp() -> f64 {
    0.1
}

fn default_ki() -> f64 {
    0.5
}

impl RMaxAdaptiveConfig {
    /// The controller's parameters for `libra` (start value, defaults resolved, the
    /// load hold at ρ/2).
    pub fn params(&self, libra: &LibraConfig) -> RMaxParams {
        let r = libra.r_max_rps;
        let epochs = self.interval_epochs.unwrap_or(libra.decision_epochs).get();
        RMaxParams {
            start_rps: r,
            target_quantile: self.target_percentile / 100.0,
            target: self.target_ms.get(),
            kp: self.kp,
            ki: self.ki,
            kd: self.kd,
            min_rps: self.min_rps.unwrap_or(r / 4.0),
            max_rps: self.max_rps.unwrap_or(r * 4.0),
            max_step_rps: self.max_step_rps.unwrap_or(r / 4.0),
            period: libra.epoch_seconds.get().saturating_mul(epochs),
            min_load_fraction: libra.rho / 2.0,
        }
    }

    fn validate(&self, libra: &LibraConfig, is: &mut Issues) {
        const P: &str = "libra.r_max_adaptive";
        let t = self.target_percentile;
        if !(t.is_finite() && t > 0.0 && t < 100.0) {
            is.push(
                format!("{P}.target_percentile"),
                format!("must be in (0, 100), got {t}"),
            );
        }
        is.nonzero_duration(&format!("{P}.target_ms"), self.target_ms);
        is.non_negative(&format!("{P}.kp"), self.kp);
        is.positive(&format!("{P}.ki"), self.ki);
        is.non_negative(&format!("{P}.kd"), self.kd);
        for (key, v) in [
            ("min_rps", self.min_rps),
            ("max_rps", self.max_rps),
            ("max_step_rps", self.max_step_rps),
        ] {
            if let Some(v) = v {
                is.positive(&format!("{P}.{key}"), v);
            }
        }
        let r = libra.r_max_rps;
        if let Some(min) = self.min_rps.filter(|m| m.is_finite() && *m > r) {
            is.push(
                format!("{P}.min_rps"),
                format!("must not exceed libra.r_max_rps, the start value ({min} > {r})"),
            );
        }
        if let Some(max) = self.max_rps.filter(|m| m.is_finite() && *m < r) {
            is.push(
                format!("{P}.max_rps"),
                format!("must not be below libra.r_max_rps, the start value ({max} < {r})"),
            );
        }
    }
}

impl Default for LibraConfig {
    fn default() -> Self {
        Self {
            epoch_seconds: DEFAULT_EPOCH_SECONDS,
            alpha: DEFAULT_ALPHA,
            beta: DEFAULT_BETA,
            phi: DEFAULT_PHI,
            rho: DEFAULT_RHO,
            decision_epochs: DEFAULT_DECISION_EPOCHS,
            first_decision_epoch: None,
            balancer: BalancerRule::TokenBucket,
            quota_truncate: false,
            r_max_rps: 16.0,
            min_vms: 0,
            max_vms: 10,
            cip_rps: None,
            max_outstanding_per_vm: None,
            r_max_adaptive: None,
        }
    }
}

/// `pricing:` — prices and the function profile used for the CIP, the simulator and the
/// live bill.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PricingConfig {
    /// On-demand price of one VM, USD per hour (default: m4.large).
    pub vm_hourly_usd: f64,
    /// Memory of the function, MB.
    pub function_memory_mb: u32,
    /// Typical execution time of one call on the function tier, milliseconds.
    pub function_duration_ms: Millis,
    /// Function architecture: `x86_64` or `arm64`.
    pub architecture: Architecture,
    /// Overrides the architecture's GB-second price, USD.
    pub gb_second_usd: Option<f64>,
    /// Per-invocation fee, USD.
    pub request_usd: f64,
    /// Whether the functions sit behind an API gateway (spillway invokes Lambda directly,
    /// so the default is `false`).
    pub api_gateway: bool,
    /// API gateway fee per request, USD, charged only when `api_gateway` is true.
    pub api_gateway_request_usd: f64,
    /// USD per VM-hour by instance type, for the live bill (`/status` `cost`); a type not
    /// listed costs `vm_hourly_usd`.
    pub vm_hourly_usd_by_instance_type: std::collections::BTreeMap<String, f64>,
    /// The live bill's VM billing unit, seconds: VM time is rounded up to it (EC2: 1).
    pub vm_billing_granularity_seconds: Seconds,
    /// The live bill's least billed time per VM, seconds (EC2: 60).
    pub vm_minimum_billed_seconds: Seconds,
    /// USD per GB-second of provisioned concurrency (pre-warmed instances, billed all the
    /// time they are configured; Lambda x86_64 list price, 2025).
    pub provisioned_concurrency_gb_second_usd: f64,
}

impl Default for PricingConfig {
    fn default() -> Self {
        Self {
            vm_hourly_usd: cost::DEFAULT_M4_LARGE_HOURLY_USD,
            function_memory_mb: 512,
            function_duration_ms: Millis::from_ms(1000),
            architecture: Architecture::X86_64,
            gb_second_usd: None,
            request_usd: cost::DEFAULT_LAMBDA_REQUEST_USD,
            api_gateway: false,
            api_gateway_request_usd: cost::DEFAULT_API_GATEWAY_REQUEST_USD,
            vm_hourly_usd_by_instance_type: std::collections::BTreeMap::new(),
            vm_billing_granularity_seconds: Seconds::new(
                cost::VmBillingRule::EC2_PER_SECOND.granularity,
            ),
            vm_minimum_billed_seconds: Seconds::new(cost::VmBillingRule::EC2_PER_SECOND.minimum),
            provisioned_concurrency_gb_second_usd:
                cost::DEFAULT_PROVISIONED_CONCURRENCY_GB_SECOND_USD,
        }
    }
}

impl PricingConfig {
    /// The function prices this section describes.
    pub fn function_pricing(&self) -> FunctionPricing {
        FunctionPricing {
            gb_second_usd: self
                .gb_second_usd
                .unwrap_or_else(|| self.architecture.default_gb_second_usd()),
            request_usd: self.request_usd,
            api_gateway_request_usd: if self.api_gateway {
                self.api_gateway_request_usd
            } else {
                0.0
            },
        }
    }

    /// The live bill's VM billing rule.
    pub fn vm_billing(&self) -> cost::VmBillingRule {
        cost::VmBillingRule {
            granularity: self.vm_billing_granularity_seconds.get(),
            minimum: self.vm_minimum_billed_seconds.get(),
        }
    }

    /// The live meter's prices, with `r_max_rps` for the all-VM counterfactual.
    pub fn meter_pricing(&self, r_max_rps: f64) -> cost::MeterPricing {
        cost::MeterPricing {
            vm_hourly_usd: self.vm_hourly_usd,
            vm_hourly_usd_by_type: self.vm_hourly_usd_by_instance_type.clone(),
            vm_billing: self.vm_billing(),
            function: self.function_pricing(),
            function_memory_mb: self.function_memory_mb,
            provisioned_gb_second_usd: self.provisioned_concurrency_gb_second_usd,
            r_max_rps,
        }
    }

    /// Cost of one function call of the configured memory and duration, USD.
    pub fn cost_per_request(&self) -> f64 {
        self.function_pricing()
            .cost_per_request(self.function_memory_mb, self.function_duration_ms.get())
    }
}

/// `vm_pool:` — where VMs come from. Written with `type:` (`process`, `static`, `ec2`)
/// and that variant's keys; read through [`VmPoolSection`] so that every key keeps its
/// place in error messages.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", from = "VmPoolSection")]
pub enum VmPoolConfig {
    /// Each VM is a local child process started from `command`.
    Process(ProcessVmPoolConfig),
    /// Fixed upstream URLs; scaling decisions are computed and reported, not executed.
    Static(StaticVmPoolConfig),
    /// EC2 instances launched and terminated through the EC2 API. Always
    /// parses; `spillway serve` needs a binary built with the `aws` cargo feature.
    Ec2(Box<Ec2VmPoolConfig>),
}

/// How `vm_pool` is read: an externally tagged enum whose serde name is the tag key. The
/// config reader (`src/config/de.rs`) takes the variant from the section's `type:` and
/// the variant's fields from its other keys, keeping every key's line and column (serde's
/// internally tagged enums buffer the section and lose them).
#[derive(Deserialize)]
#[serde(rename = "type", rename_all = "snake_case")]
#[doc(hidden)]
pub enum VmPoolSection {
    /// `type: process`.
    Process(ProcessVmPoolConfig),
    /// `type: static`.
    Static(StaticVmPoolConfig),
    /// `type: ec2`.
    Ec2(Box<Ec2VmPoolConfig>),
}

impl VmPoolConfig {
    /// `slots_per_vm` of whichever provider: calls one VM runs at once (absent:
    /// unlimited).
    pub fn slots_per_vm(&self) -> Option<u32> {
        match self {
            VmPoolConfig::Process(p) => p.slots_per_vm,
            VmPoolConfig::Static(p) => p.slots_per_vm,
            VmPoolConfig::Ec2(p) => p.slots_per_vm,
        }
        .map(NonZeroU32::get)
    }
}

impl From<VmPoolSection> for VmPoolConfig {
    fn from(s: VmPoolSection) -> Self {
        match s {
            VmPoolSection::Process(p) => VmPoolConfig::Process(p),
            VmPoolSection::Static(p) => VmPoolConfig::Static(p),
            VmPoolSection::Ec2(p) => VmPoolConfig::Ec2(p),
        }
    }
}

/// `vm_pool: {type: process}`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessVmPoolConfig {
    /// Program and arguments. `{port}` is replaced by the port the VM must listen on
    /// (127.0.0.1), `{spillway}` by the path of the running spillway binary.
    pub command: Vec<String>,
    /// Readiness probe path; ready when it answers 2xx.
    #[serde(default = "default_health_path")]
    pub health_path: String,
    /// A VM not ready after this long is stopped and replaced.
    #[serde(default = "default_boot_timeout")]
    pub boot_timeout_seconds: Seconds,
    /// Interval between readiness probes.
    #[serde(default = "default_probe_interval")]
    pub probe_interval_seconds: Seconds,
    /// Calls one VM runs at once (call scheduling §4: one call per core); absent:
    /// unlimited.
    #[serde(default)]
    pub slots_per_vm: Option<NonZeroU32>,
}

/// `vm_pool: {type: static}`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StaticVmPoolConfig {
    /// Base URLs (`http://host:port`, `https://…`) of the VMs, parsed where read.
    pub urls: Vec<HttpUrl>,
    /// Calls one VM runs at once; absent: unlimited.
    #[serde(default)]
    pub slots_per_vm: Option<NonZeroU32>,
}

/// Default EC2 boot/readiness timeout, seconds (instance boot plus application start).
pub const DEFAULT_EC2_BOOT_TIMEOUT_SECONDS: Seconds = Seconds::from_secs(300);
/// Default interval between EC2 address resolutions (DescribeInstances) and readiness
/// probes, seconds: slow enough to stay far from the EC2 API's request rate limits.
pub const DEFAULT_EC2_PROBE_INTERVAL_SECONDS: Seconds = Seconds::from_secs(2);
/// Default port the API listens on inside an EC2 instance.
pub const DEFAULT_EC2_UPSTREAM_PORT: u16 = 8080;
/// Default instance tag holding the upstream URL for `address: tag`.
pub const DEFAULT_EC2_UPSTREAM_TAG_KEY: &str = "spillway:upstream";
/// Tag key every instance of an EC2 pool carries, with the pool name as value.
pub const EC2_POOL_TAG_KEY: &str = "spillway:pool";
/// Default interval of the EC2 pool audit, seconds.
pub const DEFAULT_EC2_AUDIT_INTERVAL_SECONDS: Seconds = Seconds::from_secs(60);
/// Default time the EC2 pool audit leaves a stray instance of this gateway's pool alone
/// before terminating it, seconds: longer than a launch of another run takes to show up.
pub const DEFAULT_EC2_STRAY_GRACE_SECONDS: Seconds = Seconds::from_secs(600);
/// Longest EC2 user data, bytes, before base64 (EC2's limit).
pub const EC2_MAX_USER_DATA_BYTES: usize = 16 * 1024;

/// `vm_pool: {type: ec2}` — an EC2 VM pool.
///
/// Either `launch_template` or `image_id` + `instance_type` says what to launch; the
/// other launch fields override or complete the template. Credentials come only from
/// the AWS SDK's default chain (environment, profile, SSO, instance/container role).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ec2VmPoolConfig {
    /// Pool name: every instance is tagged `spillway:pool=<pool_name>`; adoption on start
    /// and TerminateInstances only touch instances with that tag. 1–128 characters.
    pub pool_name: String,
    /// AWS region (`us-east-1`). Absent: the default chain (`AWS_REGION`, profile).
    #[serde(default)]
    pub region: Option<String>,
    /// EC2 endpoint override (`http://127.0.0.1:5000` for moto, a VPC endpoint…).
    #[serde(default)]
    pub endpoint_url: Option<HttpUrl>,
    /// Launch template to launch from.
    #[serde(default)]
    pub launch_template: Option<Ec2LaunchTemplate>,
    /// AMI id (`ami-…`); required without `launch_template`.
    #[serde(default)]
    pub image_id: Option<String>,
    /// Instance type (`t3.medium`); required without `launch_template`.
    #[serde(default)]
    pub instance_type: Option<String>,
    /// Subnets to launch into, used round-robin; a capacity error moves the launch on to
    /// the next subnet. Empty: the template's or the default VPC's.
    #[serde(default)]
    pub subnet_ids: Vec<String>,
    /// Security groups of the instances. Empty: the template's or the VPC default.
    #[serde(default)]
    pub security_group_ids: Vec<String>,
    /// Instance profile, by name or ARN (`arn:aws:iam::…:instance-profile/…`).
    #[serde(default)]
    pub instance_profile: Option<String>,
    /// User data as plain text (spillway base64-encodes it); at most 16 KiB
    /// ([`EC2_MAX_USER_DATA_BYTES`]) before base64, EC2's limit.
    #[serde(default)]
    pub user_data: Option<String>,
    /// Extra tags on instances, volumes and network interfaces (keys must not start with
    /// `spillway:`, which spillway sets itself).
    #[serde(default)]
    pub tags: std::collections::BTreeMap<String, String>,
    /// Port the API listens on inside the instance (`private_ip`, `public_ip`).
    #[serde(default = "default_ec2_upstream_port")]
    pub upstream_port: u16,
    /// Scheme of the upstream URL built from the instance's address: `http` or `https`
    /// (verified with `gateway.upstream_tls`; the certificate must name the IP address).
    #[serde(default = "default_scheme")]
    pub scheme: String,
    /// Readiness probe path (GET, 2xx = ready).
    #[serde(default = "default_health_path")]
    pub health_path: String,
    /// How the gateway reaches an instance.
    #[serde(default)]
    pub address: Ec2Address,
    /// Tag holding the instance's upstream base URL (`http://host:port`) for
    /// `address: tag`: written by the instance's boot script, a port-mapping tool, or a
    /// test standing in for them. The instance is not resolved until the tag exists.
    #[serde(default = "default_upstream_tag_key")]
    pub upstream_tag_key: String,
    /// With `address: tag`: where else the tag's URL may point. By default only at one
    /// of the instance's own addresses as DescribeInstances reports them (private,
    /// public, IPv6, every network interface's); an IP in one of these CIDRs is accepted
    /// too (a port-mapping host, a sidecar). A host name in the tag is refused: it
    /// cannot be matched against addresses (write the IP).
    #[serde(default)]
    pub tag_address_allowed_cidrs: Vec<ipnet::IpNet>,
    /// An instance not ready (state `running`, address known, health check 2xx) this
    /// long after launch is terminated.
    #[serde(default = "default_ec2_boot_timeout")]
    pub boot_timeout_seconds: Seconds,
    /// Interval between address resolutions (DescribeInstances) and readiness probes.
    #[serde(default = "default_ec2_probe_interval")]
    pub probe_interval_seconds: Seconds,
    /// What happens to the pool's instances when the gateway stops.
    #[serde(default)]
    pub on_shutdown: Ec2ShutdownPolicy,
    /// This gateway's name within the pool (one writer per pool's
    /// instances): every instance it launches is tagged `spillway:gateway=<gateway_id>`,
    /// and it adopts, audits and terminates only instances with its own id (or one of
    /// `adopt_gateway_ids`); instances of other ids are left alone. Two gateways may share
    /// a `pool_name` only with different ids. Absent: under coordination the cluster
    /// name, else the `pool_name` — never the host name, which changes with every
    /// container restart (a restarted gateway would not adopt its own pool). Every
    /// replica of one gateway uses the same id. 1–128 characters.
    #[serde(default)]
    pub gateway_id: Option<String>,
    /// Ids of gateways whose instances this gateway takes over as its own at start (a
    /// retired or renamed gateway). Never list a gateway that still runs.
    #[serde(default)]
    pub adopt_gateway_ids: Vec<String>,
    /// Interval of the pool audit (one paginated DescribeInstances): it terminates the
    /// pool's stopped instances, retries terminations EC2 has not confirmed yet, and
    /// raises an alarm when another gateway launches into the pool with this gateway's
    /// id.
    #[serde(default = "default_ec2_audit_interval")]
    pub audit_interval_seconds: Seconds,
    /// How long the pool audit leaves a stray instance alone — one of this gateway's
    /// pool and id that it neither adopted at start nor launched (an earlier run's
    /// instance the start-up listing missed, a launch of another run still in flight)
    /// — before terminating it; the alarm `stray_instances` is raised from the first
    /// sighting. Seconds, ≥ 0. Not applied under coordination (the replicas share the id).
    #[serde(default = "default_ec2_stray_grace")]
    pub stray_grace_seconds: Seconds,
    /// Calls one VM runs at once; absent: unlimited.
    #[serde(default)]
    pub slots_per_vm: Option<NonZeroU32>,
}

/// `vm_pool.launch_template`: a launch template by id or by name.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ec2LaunchTemplate {
    /// Template id (`lt-…`); exactly one of `id` and `name`.
    #[serde(default)]
    pub id: Option<String>,
    /// Template name; exactly one of `id` and `name`.
    #[serde(default)]
    pub name: Option<String>,
    /// Version number, `$Latest` or `$Default` (absent: the template's default version).
    #[serde(default)]
    pub version: Option<String>,
}

/// `vm_pool.address`: where the upstream URL of an EC2 instance comes from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Ec2Address {
    /// `scheme://<private IPv4>:<upstream_port>` (the gateway runs in the VPC).
    #[default]
    PrivateIp,
    /// `scheme://<public IPv4>:<upstream_port>`.
    PublicIp,
    /// The URL in the `upstream_tag_key` tag (port mappings, dry runs against an
    /// emulator whose instance addresses are fake).
    Tag,
}

/// `vm_pool.on_shutdown`: what a stopping gateway does with its EC2 instances.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Ec2ShutdownPolicy {
    /// Leave them running; the next gateway run adopts them (by the pool tag).
    #[default]
    Keep,
    /// Terminate every instance of the pool.
    Terminate,
}

fn default_ec2_upstream_port() -> u16 {
    DEFAULT_EC2_UPSTREAM_PORT
}
fn default_scheme() -> String {
    "http".to_string()
}
fn default_upstream_tag_key() -> String {
    DEFAULT_EC2_UPSTREAM_TAG_KEY.to_string()
}
fn default_ec2_boot_timeout() -> Seconds {
    DEFAULT_EC2_BOOT_TIMEOUT_SECONDS
}
fn default_ec2_probe_interval() -> Seconds {
    DEFAULT_EC2_PROBE_INTERVAL_SECONDS
}
fn default_ec2_audit_interval() -> Seconds {
    DEFAULT_EC2_AUDIT_INTERVAL_SECONDS
}
fn default_ec2_stray_grace() -> Seconds {
    DEFAULT_EC2_STRAY_GRACE_SECONDS
}

fn default_boot_timeout() -> Seconds {
    DEFAULT_BOOT_TIMEOUT_SECONDS
}

impl Config {
    /// Semantic validation: every problem, each with its field path. Empty = valid.
    pub fn validate(&self) -> Vec<ConfigIssue> {
        let mut is = Issues(Vec::new());
        if self.version != 1 {
            is.push(
                "version",
                format!("only version 1 exists, got {}", self.version),
            );
        }
        let g = &self.gateway;
        if g.listen == g.admin_listen && g.listen.port() != 0 {
            is.push("gateway.admin_listen", "must differ from gateway.listen");
        }
        for (path, v, min) in [
            ("gateway.max_header_bytes", g.max_header_bytes, 1024),
            ("gateway.max_uri_bytes", g.max_uri_bytes, 16),
        ] {
            if !(min..=MAX_HEAD_LIMIT_BYTES).contains(&v) {
                is.push(
                    path,
                    format!("must be in [{min}, {MAX_HEAD_LIMIT_BYTES}], got {v}"),
                );
            }
        }
        if !(1..=10_000).contains(&g.max_header_count) {
            is.push(
                "gateway.max_header_count",
                format!("must be in [1, 10000], got {}", g.max_header_count),
            );
        }
        if let Some(n) = g.worker_threads.filter(|n| n.get() > MAX_WORKER_THREADS) {
            is.push(
                "gateway.worker_threads",
                format!("must be in [1, {MAX_WORKER_THREADS}], got {n}"),
            );
        }
        if !(1..=10_000).contains(&g.max_response_header_count) {
            is.push(
                "gateway.max_response_header_count",
                format!("must be in [1, 10000], got {}", g.max_response_header_count),
            );
        }
        if !(8192..=MAX_HEAD_LIMIT_BYTES).contains(&g.max_response_header_bytes) {
            is.push(
                "gateway.max_response_header_bytes",
                format!(
                    "must be in [8192, {MAX_HEAD_LIMIT_BYTES}], got {}",
                    g.max_response_header_bytes
                ),
            );
        }
        for (i, p) in g.upgrade_protocols.iter().enumerate() {
            let path = format!("gateway.upgrade_protocols[{i}]");
            if p.eq_ignore_ascii_case("h2c") {
                is.push(
                    &path,
                    "h2c is never forwarded: an h2c tunnel would carry requests past the gateway's request rules",
                );
            } else if p.is_empty()
                || !p
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
            {
                is.push(
                    &path,
                    format!("must be a protocol name token (like websocket), got `{p}`"),
                );
            }
        }
        is.nonzero_duration(
            "gateway.header_read_timeout_seconds",
            g.header_read_timeout_seconds,
        );
        is.nonzero_duration("gateway.connect_timeout_seconds", g.connect_timeout_seconds);
        is.nonzero_duration(
            "gateway.upstream_timeout_seconds",
            g.upstream_timeout_seconds,
        );
        is.nonzero_duration("gateway.idle_timeout_seconds", g.idle_timeout_seconds);
        is.nonzero_duration(
            "gateway.keepalive_idle_timeout_seconds",
            g.keepalive_idle_timeout_seconds,
        );
        is.nonzero_duration(
            "gateway.http2_keepalive_timeout_seconds",
            g.http2_keepalive_timeout_seconds,
        );
        if let Some(problem) = g.admin_exposure_issue() {
            is.push("gateway.admin_listen", problem);
        }
        if g.admin_token_file.is_some() && g.admin_token_env.is_some() {
            is.push(
                "gateway.admin_token_env",
                "set either admin_token_file or admin_token_env, not both",
            );
        }
        is.within("gateway.retry_budget_ratio", g.retry_budget_ratio, 0.0, 1.0);
        is.nonzero_duration(
            "gateway.retry_budget_window_seconds",
            g.retry_budget_window_seconds,
        );
        is.non_negative(
            "gateway.retry_budget_min_per_second",
            g.retry_budget_min_per_second,
        );
        for (field, v) in [
            (
                "gateway.request_body_idle_timeout_seconds",
                g.request_body_idle_timeout_seconds,
            ),
            (
                "gateway.response_body_idle_timeout_seconds",
                g.response_body_idle_timeout_seconds,
            ),
            (
                "gateway.tunnel_idle_timeout_seconds",
                g.tunnel_idle_timeout_seconds,
            ),
        ] {
            is.nonzero_duration(field, v);
        }

        let l = &self.libra;
        is.nonzero_duration("libra.epoch_seconds", l.epoch_seconds);
        is.within("libra.alpha", l.alpha, 0.0, 1.0);
        is.within("libra.beta", l.beta, 0.0, 1.0);
        is.non_negative("libra.phi", l.phi);
        if !(l.rho.is_finite() && l.rho > 0.0 && l.rho <= 1.0) {
            is.push("libra.rho", format!("must be in (0, 1], got {}", l.rho));
        }
        if l.quota_truncate && l.balancer != BalancerRule::Quota {
            is.push(
                "libra.quota_truncate",
                "applies only to `balancer: quota` (the token bucket has no quota)",
            );
        }
        is.positive("libra.r_max_rps", l.r_max_rps);
        if l.min_vms > l.max_vms {
            is.push(
                "libra.min_vms",
                format!(
                    "must not exceed libra.max_vms ({} > {})",
                    l.min_vms, l.max_vms
                ),
            );
        }
        if let Some(cip) = l.cip_rps {
            is.non_negative("libra.cip_rps", cip);
        }
        if let Some(a) = &l.r_max_adaptive {
            a.validate(l, &mut is);
        }

        let p = &self.pricing;
        is.positive("pricing.vm_hourly_usd", p.vm_hourly_usd);
        if p.function_memory_mb < 128 || p.function_memory_mb > 10_240 {
            is.push(
                "pricing.function_memory_mb",
                format!(
                    "must be in [128, 10240] (Lambda's range), got {}",
                    p.function_memory_mb
                ),
            );
        }
        is.nonzero_duration("pricing.function_duration_ms", p.function_duration_ms);
        if let Some(v) = p.gb_second_usd {
            is.non_negative("pricing.gb_second_usd", v);
        }
        is.non_negative("pricing.request_usd", p.request_usd);
        is.non_negative("pricing.api_gateway_request_usd", p.api_gateway_request_usd);
        for (t, usd) in &p.vm_hourly_usd_by_instance_type {
            is.non_negative(&format!("pricing.vm_hourly_usd_by_instance_type.{t}"), *usd);
        }
        is.nonzero_duration(
            "pricing.vm_billing_granularity_seconds",
            p.vm_billing_granularity_seconds,
        );
        is.non_negative(
            "pricing.provisioned_concurrency_gb_second_usd",
            p.provisioned_concurrency_gb_second_usd,
        );

        match &self.vm_pool {
            None => {}
            Some(VmPoolConfig::Process(v)) => {
                check_command(&mut is, "vm_pool.command", &v.command);
                check_path(&mut is, "vm_pool.health_path", &v.health_path);
                is.nonzero_duration("vm_pool.boot_timeout_seconds", v.boot_timeout_seconds);
                is.nonzero_duration("vm_pool.probe_interval_seconds", v.probe_interval_seconds);
            }
            Some(VmPoolConfig::Static(s)) => {
                for (i, u) in s.urls.iter().enumerate() {
                    let field = format!("vm_pool.urls[{i}]");
                    check_upstream(&mut is, &field, u, g.allow_loopback_upstreams);
                }
            }
            Some(VmPoolConfig::Ec2(e)) => e.validate(&mut is),
        }
        if let Some(ft) = &self.function_tier {
            ft.validate_at("function_tier", &self.provider_context(), &mut is);
        }
        self.validate_zones(&mut is);
        if let Some(pool) = &self.vm_pool {
            match (
                pool.slots_per_vm(),
                l.max_outstanding_per_vm.map(NonZeroU32::get),
            ) {
                (Some(a), Some(b)) if a != b => is.push(
                    "libra.max_outstanding_per_vm",
                    format!(
                        "deprecated alias of vm_pool.slots_per_vm, and they differ ({b} vs {a}): \
                         remove libra.max_outstanding_per_vm"
                    ),
                ),
                _ => {}
            }
        }
        if let Some(q) = &self.queue {
            q.validate(&mut is);
        }
        super::routes::validate_routes(&self.routes, &mut is);
        self.sim.validate(&mut is);
        self.async_calls.validate(&mut is);
        crate::config::delay::validate_routes(&self.routes, &self.async_calls, &mut is);
        self.coordination
            .validate(self.libra.epoch_seconds, &mut is);
        self.telemetry.validate(&mut is);
        self.validate_replicas(&mut is);
        is.0
    }

    /// Asynchronous calls across coordinated replicas: each call stays on the replica
    /// that accepted it and the others forward its status lookups there
    /// (`proxy::async_calls`), so that replica needs an address the others reach:
    /// `coordination.advertise_url`, or a `gateway.listen` on a specific IP address.
    fn validate_replicas(&self, is: &mut Issues) {
        let Some(r) = self.coordination.redis() else {
            return;
        };
        let asynchronous = self
            .routes
            .iter()
            .any(|route| route.async_mode != super::routes::AsyncMode::Off);
        if asynchronous && r.advertise_url.is_none() && self.gateway.listen.ip().is_unspecified() {
            is.push(
                "coordination.advertise_url",
                format!(
                    "required with asynchronous routes while gateway.listen is {} (every \
                     address): the other replicas forward the status lookups of this \
                     replica's calls to this URL (http://HOST:PORT), or listen on a specific \
                     IP address",
                    self.gateway.listen
                ),
            );
        }
        // The shared pool outlives every replica: one replica stopping (a rolling
        // deploy, a crash restart) must not terminate the VMs the others serve on.
        if let Some(VmPoolConfig::Ec2(e)) = &self.vm_pool
            && e.on_shutdown == Ec2ShutdownPolicy::Terminate
        {
            is.push(
                "vm_pool.on_shutdown",
                "`terminate` is refused with coordination: the pool is shared by every \
                 replica, and one replica stopping would terminate the VMs the others \
                 serve on; use `keep` (the next leader adopts the pool, and scales it in)",
            );
        }
    }

    /// The VM pool's one name, the same on every replica: `vm_pool.gateway_id` (EC2),
    /// else, under coordination, the cluster name; `None` alone without an EC2 id (the
    /// provider's own default then applies).
    pub fn pool_name(&self) -> Option<String> {
        let own = match &self.vm_pool {
            Some(VmPoolConfig::Ec2(e)) => e.gateway_id.clone(),
            _ => None,
        };
        own.or_else(|| self.coordination.redis().map(|r| r.cluster.clone()))
    }

    /// Calls one VM runs at once: `vm_pool.slots_per_vm`, else its deprecated alias
    /// `libra.max_outstanding_per_vm`; `None`: unlimited.
    pub fn slots_per_vm(&self) -> Option<u32> {
        self.vm_pool
            .as_ref()
            .and_then(VmPoolConfig::slots_per_vm)
            .or(self.libra.max_outstanding_per_vm.map(NonZeroU32::get))
    }

    /// The gateway queue's parameters (call scheduling §4), when `queue:` is present.
    pub fn queue_params(&self) -> Option<crate::policy::sched::SchedParams> {
        self.queue.as_ref().map(super::queue::QueueConfig::params)
    }

    /// Whether asynchronous calls are on: some `routes:` entry enables them
    /// (`async: prefer` or `always`). Off, the gateway opens no store and ignores
    /// `Prefer: respond-async`.
    pub fn async_enabled(&self) -> bool {
        self.routes
            .iter()
            .any(|r| r.async_mode != super::routes::AsyncMode::Off)
    }

    /// The configured route keys, in order.
    pub fn route_defs(&self) -> Vec<crate::policy::routes::RouteDef> {
        self.routes
            .iter()
            .map(super::routes::RouteConfig::def)
            .collect()
    }

    /// The bound on route keys (`queue.max_route_keys`, or its default).
    pub fn max_route_keys(&self) -> usize {
        self.queue
            .as_ref()
            .map_or(crate::policy::core::DEFAULT_MAX_ROUTE_KEYS, |q| {
                q.max_route_keys
            })
    }

    /// What the function providers' own checks need to know of this gateway.
    pub(crate) fn provider_context(&self) -> ProviderContext {
        ProviderContext {
            allow_loopback_upstreams: self.gateway.allow_loopback_upstreams,
            upstream_timeout_seconds: self.gateway.upstream_timeout_seconds,
        }
    }

    /// What `spillway serve` needs beyond [`Config::validate`]: both providers, a TLS
    /// certificate and key that load, and the `aws` feature for the `ec2` and `lambda`
    /// providers. `spillway check` (without `--sim`) runs the same checks.
    pub fn gateway_issues(&self) -> Vec<ConfigIssue> {
        let mut is = Issues(Vec::new());
        if self.vm_pool.is_none() {
            is.push(
                "vm_pool",
                "missing: `spillway serve` needs a VM pool (type: process, static or ec2)",
            );
        }
        if self.function_tier.is_none() && self.function_zones.is_empty() {
            is.push(
                "function_tier",
                "missing: `spillway serve` needs a function tier (type: process, http or lambda) or function_zones",
            );
        }
        self.zone_gateway_issues(&mut is);
        if let Err(e) = self.gateway.admin_token() {
            let field = if self.gateway.admin_token_file.is_some() {
                "gateway.admin_token_file"
            } else {
                "gateway.admin_token_env"
            };
            is.push(field, e);
        }
        if let Some(tls) = &self.gateway.tls
            && let Err(e) = crate::net::tls::load_server_config(&tls.cert_file, &tls.key_file)
        {
            is.push("gateway.tls", e.to_string());
        }
        if let Err(e) = self.gateway.upstream_tls_config() {
            is.push("gateway.upstream_tls", e.to_string());
        }
        if !cfg!(feature = "aws") && matches!(self.vm_pool, Some(VmPoolConfig::Ec2(_))) {
            is.push("vm_pool.type", aws_feature_missing("ec2"));
        }
        self.telemetry.gateway_issues(&mut is);
        is.0
    }

    /// The cost-indifference point in force, requests/s: `libra.cip_rps` when set, else
    /// computed from `pricing` and `libra.r_max_rps` (LIBRA §II).
    pub fn cip_rps(&self) -> f64 {
        self.libra.cip_rps.unwrap_or_else(|| {
            cost::cost_indifference_point_rps(
                self.pricing.cost_per_request(),
                self.libra.r_max_rps,
                self.pricing.vm_hourly_usd,
            )
        })
    }

    /// Traffic-monitor parameters (LIBRA §III-A).
    pub fn monitor_params(&self) -> MonitorParams {
        MonitorParams {
            epoch: self.libra.epoch_seconds.get(),
            alpha: self.libra.alpha,
            beta: self.libra.beta,
            decision_epochs: self.libra.decision_epochs.get(),
            first_decision_epoch: self.libra.first_decision_epoch.map(NonZeroU32::get),
        }
    }

    /// Scaling-manager parameters (LIBRA §III-B), with the CIP resolved.
    pub fn libra_scaling_params(&self) -> LibraScalingParams {
        LibraScalingParams {
            phi: self.libra.phi,
            r_max_rps: self.libra.r_max_rps,
            min_vms: self.libra.min_vms,
            max_vms: self.libra.max_vms,
            cip_rps: self.cip_rps(),
        }
    }

    /// LIBRA's parameters a running core can take on reload (`Core::retune`): α, β, K, F,
    /// φ, r_max, VM bounds, the CIP (from `pricing` when not set)
    /// and ρ.
    pub fn libra_tuning(&self) -> crate::policy::controller::LibraTuning {
        crate::policy::controller::LibraTuning {
            alpha: self.libra.alpha,
            beta: self.libra.beta,
            decision_epochs: self.libra.decision_epochs.get(),
            first_decision_epoch: self.libra.first_decision_epoch.map(NonZeroU32::get),
            scaling: self.libra_scaling_params(),
            rho: self.libra.rho,
        }
    }

    /// The adaptive r_max controller's parameters (LIBRA §III-B), when configured: pass
    /// them to `Core::with_adaptive_r_max`.
    pub fn r_max_adaptive_params(&self) -> Option<RMaxParams> {
        self.libra
            .r_max_adaptive
            .as_ref()
            .map(|a| a.params(&self.libra))
    }

    /// LIBRA's balancer (LIBRA §III-C) with this config's ρ and per-VM cap.
    pub fn libra_balancer(&self) -> crate::policy::balancer::VmFirst {
        crate::policy::balancer::VmFirst::new(self.libra.rho)
            .with_max_outstanding_per_vm(self.slots_per_vm())
            .with_budget_rule(self.budget_rule(), self.monitor_params().epoch)
    }

    /// The balancer's budget rule (`libra.balancer`, `libra.quota_truncate`).
    pub fn budget_rule(&self) -> crate::policy::balancer::BudgetRule {
        match self.libra.balancer {
            BalancerRule::TokenBucket => crate::policy::balancer::BudgetRule::TokenBucket,
            BalancerRule::Quota => crate::policy::balancer::BudgetRule::Quota {
                truncate: self.libra.quota_truncate,
            },
        }
    }

    /// Controller parameters; `static` pools only report their scaling decisions.
    pub fn controller_params(&self) -> ControllerParams {
        ControllerParams {
            monitor: self.monitor_params(),
            r_max_rps: self.libra.r_max_rps,
            execute_scaling: !matches!(self.vm_pool, Some(VmPoolConfig::Static(_))),
        }
    }

    /// The whole policy core's parameters for the live gateway.
    pub fn core_params(&self) -> CoreParams {
        let vm_boot_timeout = match &self.vm_pool {
            Some(VmPoolConfig::Process(p)) => Some(p.boot_timeout_seconds.get()),
            Some(VmPoolConfig::Ec2(p)) => Some(p.boot_timeout_seconds.get()),
            Some(VmPoolConfig::Static(_)) | None => None,
        };
        CoreParams {
            controller: self.controller_params(),
            placement: self.placement_params(),
            vm_boot_timeout,
        }
    }
}

impl Ec2VmPoolConfig {
    /// Semantic checks of `vm_pool` (type `ec2`), each problem with its field path.
    pub fn validate(&self, is: &mut Issues) {
        let n = self.pool_name.chars().count();
        if n == 0 || n > 128 || self.pool_name.trim() != self.pool_name {
            is.push(
                "vm_pool.pool_name",
                format!(
                    "must be 1-128 characters without surrounding spaces (a tag value), got {:?}",
                    self.pool_name
                ),
            );
        }
        if let Some(r) = &self.region
            && (r.is_empty() || !r.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'))
        {
            is.push("vm_pool.region", format!("not a region name: {r:?}"));
        }
        match &self.launch_template {
            Some(t) => {
                if t.id.is_some() == t.name.is_some() {
                    is.push(
                        "vm_pool.launch_template",
                        "set exactly one of `id` and `name`",
                    );
                }
                if let Some(v) = &t.version
                    && !(v == "$Latest"
                        || v == "$Default"
                        || v.parse::<u64>().is_ok_and(|n| n >= 1))
                {
                    is.push(
                        "vm_pool.launch_template.version",
                        format!("must be a version number, $Latest or $Default, got {v:?}"),
                    );
                }
            }
            None => {
                if self.image_id.is_none() {
                    is.push(
                        "vm_pool.image_id",
                        "required without vm_pool.launch_template",
                    );
                }
                if self.instance_type.is_none() {
                    is.push(
                        "vm_pool.instance_type",
                        "required without vm_pool.launch_template",
                    );
                }
            }
        }
        if let Some(ud) = &self.user_data
            && ud.len() > EC2_MAX_USER_DATA_BYTES
        {
            is.push(
                "vm_pool.user_data",
                format!(
                    "is {} bytes, over EC2's limit of {EC2_MAX_USER_DATA_BYTES} bytes (16 KiB before base64)",
                    ud.len()
                ),
            );
        }
        let id_ok = |id: &str| {
            let n = id.chars().count();
            (1..=128).contains(&n) && id.trim() == id
        };
        if let Some(id) = &self.gateway_id
            && !id_ok(id)
        {
            is.push(
                "vm_pool.gateway_id",
                format!(
                    "must be 1-128 characters without surrounding spaces (a tag value), got {id:?}"
                ),
            );
        }
        for (i, id) in self.adopt_gateway_ids.iter().enumerate() {
            if !id_ok(id) {
                is.push(
                    format!("vm_pool.adopt_gateway_ids[{i}]"),
                    format!(
                        "must be 1-128 characters without surrounding spaces (a tag value), got {id:?}"
                    ),
                );
            } else if self.gateway_id.as_deref() == Some(id.as_str()) {
                is.push(
                    format!("vm_pool.adopt_gateway_ids[{i}]"),
                    "is this gateway's own gateway_id",
                );
            }
        }
        for k in self.tags.keys() {
            if k.starts_with("spillway:") || k.starts_with("aws:") {
                is.push(
                    format!("vm_pool.tags.{k}"),
                    "keys starting with `spillway:` or `aws:` are reserved",
                );
            } else if k.is_empty() || k.chars().count() > 128 {
                is.push(
                    format!("vm_pool.tags.{k}"),
                    "tag keys have 1-128 characters",
                );
            }
        }
        if self.upstream_port == 0 {
            is.push("vm_pool.upstream_port", "must be 1-65535");
        }
        if self.scheme != "http" && self.scheme != "https" {
            is.push(
                "vm_pool.scheme",
                format!("must be `http` or `https`, got {:?}", self.scheme),
            );
        }
        check_path(is, "vm_pool.health_path", &self.health_path);
        if self.address == Ec2Address::Tag && self.upstream_tag_key.is_empty() {
            is.push(
                "vm_pool.upstream_tag_key",
                "must not be empty with address: tag",
            );
        }
        is.nonzero_duration("vm_pool.boot_timeout_seconds", self.boot_timeout_seconds);
        is.nonzero_duration(
            "vm_pool.probe_interval_seconds",
            self.probe_interval_seconds,
        );
        is.nonzero_duration(
            "vm_pool.audit_interval_seconds",
            self.audit_interval_seconds,
        );
    }
}
