//! Configuration reload (issue 12 item 10): `SIGHUP` or `POST /reload` on the admin
//! listener re-reads the file the gateway was started with, validates it like `serve`
//! does, and applies what can change while serving — all of it or nothing. In-flight
//! requests keep the settings they started with; new requests get the new ones.
//!
//! | applied live | restart needed (reported, not applied) |
//! |---|---|
//! | a `static` pool's `urls`, `gateway.upstream_timeout_seconds`, the body and tunnel idle timeouts, `drain_timeout_seconds`, `trusted_proxies`, body/header/URI limits, path rules, the admin token, the TLS certificate and key | `gateway.listen`, `admin_listen`, `tls.listen`, `header_read_timeout_seconds`, `connect_timeout_seconds`, `idle_timeout_seconds`, `max_concurrent_streams`, `health_check_interval_seconds`, `retry_budget_*`, `access_log`, `allow_loopback_upstreams`, `libra`, `pricing`, `vm_pool`, `function_tier` |

use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};

use serde_json::Value;

use super::admin::AdminToken;
use super::service::ServiceSettings;
use crate::config::Config;
use crate::net::tls;

/// Gateway keys a reload applies (the rest of `gateway.*` needs a restart).
const LIVE_GATEWAY_KEYS: [&str; 14] = [
    "trusted_proxies",
    "max_body_bytes",
    "upstream_timeout_seconds",
    "request_body_idle_timeout_seconds",
    "response_body_idle_timeout_seconds",
    "tunnel_idle_timeout_seconds",
    "drain_timeout_seconds",
    "max_header_bytes",
    "max_header_count",
    "max_uri_bytes",
    "normalize_path",
    "merge_slashes",
    "path_with_escaped_slashes_action",
    "admin_token_file",
];

/// What a reload did.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct ReloadReport {
    /// Changed keys now in force (`gateway.upstream_timeout_seconds`, `gateway.tls`…).
    pub applied: Vec<String>,
    /// Changed keys that need a restart; not applied.
    pub restart_required: Vec<String>,
}

/// Why a reload applied nothing.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// The gateway runs the embedded quickstart: there is no file to re-read.
    #[error("no configuration file to reload (the gateway runs the embedded quickstart)")]
    NoFile,
    /// The new file is invalid; the running configuration stays.
    #[error("{0}")]
    Invalid(String),
}

/// The live pieces a reload swaps.
pub struct Reloader {
    path: Option<PathBuf>,
    /// `--listen` / `--admin-listen` given on the command line (kept across reloads).
    overrides: (Option<std::net::SocketAddr>, Option<std::net::SocketAddr>),
    current: Mutex<Config>,
    /// The request path's settings for new requests.
    pub settings: Arc<RwLock<Arc<ServiceSettings>>>,
    /// The admin token.
    pub admin_token: AdminToken,
    /// The TLS acceptor for new connections, when TLS is on.
    pub tls: Option<Arc<RwLock<tokio_rustls::TlsAcceptor>>>,
    /// Serialises reloads (SIGHUP and POST /reload at once).
    busy: tokio::sync::Mutex<()>,
    /// The running gateway (static pool members are replaced on reload).
    gateway: Option<Arc<super::driver::Gateway>>,
}

impl Reloader {
    /// A reloader for a gateway started from `config` (read from `path`, if any).
    pub fn new(
        config: Config,
        settings: Arc<RwLock<Arc<ServiceSettings>>>,
        admin_token: AdminToken,
        tls: Option<Arc<RwLock<tokio_rustls::TlsAcceptor>>>,
    ) -> Self {
        Self {
            path: None,
            overrides: (None, None),
            current: Mutex::new(config),
            settings,
            admin_token,
            tls,
            busy: tokio::sync::Mutex::new(()),
            gateway: None,
        }
    }

    /// The running gateway, whose `static` pool a reload may change.
    pub fn set_gateway(&mut self, gateway: Arc<super::driver::Gateway>) {
        self.gateway = Some(gateway);
    }

    /// Where to re-read the configuration from, and the command-line overrides of the
    /// listen addresses to keep.
    pub fn set_source(
        &mut self,
        path: Option<PathBuf>,
        listen: Option<std::net::SocketAddr>,
        admin_listen: Option<std::net::SocketAddr>,
    ) {
        self.path = path;
        self.overrides = (listen, admin_listen);
    }

    /// Re-read, validate, apply all or nothing; logs what changed.
    ///
    /// # Errors
    /// [`ReloadError`]: nothing was applied.
    pub async fn reload(&self) -> Result<ReloadReport, ReloadError> {
        let _one = self.busy.lock().await;
        let path = self.path.as_ref().ok_or(ReloadError::NoFile)?;
        let mut new =
            Config::load_for_serve(path).map_err(|e| ReloadError::Invalid(e.to_string()))?;
        if let Some(a) = self.overrides.0 {
            new.gateway.listen = a;
        }
        if let Some(a) = self.overrides.1 {
            new.gateway.admin_listen = a;
        }
        if let Some(problem) = new.gateway.admin_exposure_issue() {
            return Err(ReloadError::Invalid(format!(
                "gateway.admin_listen: {problem}"
            )));
        }
        // Everything that can fail is prepared before anything is swapped.
        let token = new.gateway.admin_token().map_err(ReloadError::Invalid)?;
        let old = self
            .current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let changed = changed_keys(&old, &new);
        let mut report = ReloadReport::default();
        let tls_changed = changed
            .iter()
            .any(|k| k.starts_with("gateway.tls.") && k != "gateway.tls.listen");
        let acceptor = match (&new.gateway.tls, &self.tls) {
            (Some(t), Some(_)) => Some(
                tls::load_server_config(&t.cert_file, &t.key_file)
                    .map(tokio_rustls::TlsAcceptor::from)
                    .map_err(|e| ReloadError::Invalid(e.to_string()))?,
            ),
            _ => None,
        };
        // A static pool's `urls` apply live (same pool type).
        let static_members = match (&old.vm_pool, &new.vm_pool) {
            (
                Some(crate::config::VmPoolConfig::Static(_)),
                Some(crate::config::VmPoolConfig::Static(n)),
            ) if changed.iter().any(|k| k == "vm_pool.urls") => Some(
                crate::backends::vm_static::StaticVmPool::new(n)
                    .map_err(|e| ReloadError::Invalid(e.to_string()))?
                    .members(),
            ),
            _ => None,
        };
        for key in changed {
            if key == "vm_pool.urls" && static_members.is_some() && self.gateway.is_some() {
                report.applied.push(key);
                continue;
            }
            let live = key
                .strip_prefix("gateway.")
                .is_some_and(|k| LIVE_GATEWAY_KEYS.contains(&k) || k == "admin_token_env")
                || (key.starts_with("gateway.tls.")
                    && key != "gateway.tls.listen"
                    && self.tls.is_some());
            if live {
                report.applied.push(key);
            } else {
                report.restart_required.push(key);
            }
        }
        // Apply: settings for new requests, the admin token, the TLS acceptor.
        let settings = Arc::new(ServiceSettings::from_config(&new));
        *self.settings.write().unwrap_or_else(|p| p.into_inner()) = settings;
        self.admin_token.set(token);
        if let (Some(members), Some(gw)) = (&static_members, &self.gateway) {
            let (added, removed) = gw.set_static_members(members);
            tracing::info!(added, removed, "static VM pool changed");
        }
        if tls_changed && let (Some(slot), Some(acceptor)) = (&self.tls, acceptor) {
            *slot.write().unwrap_or_else(|p| p.into_inner()) = acceptor;
        }
        // Keep the restart-only values of the running gateway in `current`, so the next
        // reload reports them again until a restart.
        let mut kept = new;
        kept.gateway.listen = old.gateway.listen;
        kept.gateway.admin_listen = old.gateway.admin_listen;
        kept.gateway.max_concurrent_streams = old.gateway.max_concurrent_streams;
        kept.gateway.header_read_timeout_seconds = old.gateway.header_read_timeout_seconds;
        kept.gateway.connect_timeout_seconds = old.gateway.connect_timeout_seconds;
        kept.gateway.idle_timeout_seconds = old.gateway.idle_timeout_seconds;
        kept.gateway.access_log = old.gateway.access_log;
        kept.gateway.allow_loopback_upstreams = old.gateway.allow_loopback_upstreams;
        kept.gateway.health_check_interval_seconds = old.gateway.health_check_interval_seconds;
        kept.gateway.retry_budget_ratio = old.gateway.retry_budget_ratio;
        kept.gateway.retry_budget_window_seconds = old.gateway.retry_budget_window_seconds;
        kept.gateway.retry_budget_min_per_second = old.gateway.retry_budget_min_per_second;
        if let (Some(k), Some(o)) = (&mut kept.gateway.tls, &old.gateway.tls) {
            k.listen = o.listen;
        }
        kept.libra = old.libra.clone();
        kept.pricing = old.pricing.clone();
        if static_members.is_none() || self.gateway.is_none() {
            kept.vm_pool = old.vm_pool.clone();
        }
        kept.function_tier = old.function_tier.clone();
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = kept;
        tracing::info!(
            applied = ?report.applied,
            restart_required = ?report.restart_required,
            "configuration reloaded"
        );
        Ok(report)
    }
}

impl Reloader {
    /// `gateway.drain_timeout_seconds` in force.
    pub fn drain_timeout(&self) -> std::time::Duration {
        let g = &self
            .current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .gateway;
        crate::backends::secs(g.drain_timeout_seconds)
    }
}

/// Dotted paths of the leaves that differ between `a` and `b` (a whole section when it
/// appears, disappears or changes `type`).
fn changed_keys(a: &Config, b: &Config) -> Vec<String> {
    let (a, b) = (
        serde_json::to_value(a).unwrap_or(Value::Null),
        serde_json::to_value(b).unwrap_or(Value::Null),
    );
    let mut out = Vec::new();
    diff("", &a, &b, &mut out);
    out
}

fn diff(prefix: &str, a: &Value, b: &Value, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) if x.get("type") == y.get("type") => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                let path = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                diff(
                    &path,
                    x.get(k).unwrap_or(&Value::Null),
                    y.get(k).unwrap_or(&Value::Null),
                    out,
                );
            }
        }
        (Value::Object(x), Value::Object(_)) if x.contains_key("type") => {
            out.push(format!("{prefix}.type"));
        }
        _ if a != b => out.push(prefix.to_string()),
        _ => {}
    }
}
