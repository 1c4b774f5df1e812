//! Configuration reload: `SIGHUP` or `POST /reload` on the admin
//! listener re-reads the file the gateway was started with, validates it like `serve`
//! does, and applies what can change while serving — all of it or nothing. In-flight
//! requests keep the settings they started with; new requests get the new ones.
//!
//! | applied live | restart needed (reported, not applied) |
//! |---|---|
//! | a `static` pool's `urls`, `gateway.upstream_timeout_seconds`, the body and tunnel idle timeouts, `drain_timeout_seconds`, `trusted_proxies`, body/header/URI limits, path rules, `headers_with_underscores_action`, `upgrade_protocols`, `request_id_trust`, the admin token, the TLS certificate and key, `pricing` (the CIP), `libra.alpha`, `beta`, `phi`, `rho`, `decision_epochs`, `first_decision_epoch`, `min_vms`, `max_vms`, `cip_rps` and `r_max_rps` (without `r_max_adaptive`) | everything else: `gateway.listen`, `admin_listen`, `tls.listen`, `header_read_timeout_seconds`, `keepalive_idle_timeout_seconds`, `http2_keepalive_*`, `max_connections*`, `worker_threads`, `connect_timeout_seconds`, `idle_timeout_seconds`, `max_concurrent_streams`, `health_check_interval_seconds`, `retry_budget_*`, `access_log`, `allow_loopback_upstreams`, `upstream_tls`, `origin_zone_header`, `libra.epoch_seconds`, `balancer`, `quota_truncate`, `max_outstanding_per_vm`, `r_max_adaptive`, any other `vm_pool` change, `function_tier`, `function_zones`, `placement`, `queue`, `routes`, `async`, `telemetry`, `sim` |
//!
//! LIBRA's parameters go to the running policy core (`Core::retune`): the traffic
//! monitor's EWMAs, the VM table, the balancer's tokens, function leases and queues are
//! kept; the budget is republished at once and the next scaling decision uses the new
//! φ, r_max, VM bounds and CIP.

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use std::path::PathBuf;
use std::sync::Arc;

use serde_json::Value;

use super::admin_token::AdminToken;
use super::service::ServiceSettings;
use crate::config::Config;
use crate::net::tls;

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
    pub settings: Arc<ArcSwap<ServiceSettings>>,
    /// The admin token.
    pub admin_token: AdminToken,
    /// The TLS acceptor for new connections, when TLS is on.
    pub tls: Option<Arc<ArcSwap<tokio_rustls::TlsAcceptor>>>,
    /// Serialises reloads (SIGHUP and POST /reload at once).
    busy: tokio::sync::Mutex<()>,
    /// The running gateway (static pool members are replaced on reload).
    gateway: Option<Arc<super::driver::Gateway>>,
}

impl Reloader {
    /// A reloader for a gateway started from `config` (read from `path`, if any).
    pub fn new(
        config: Config,
        settings: Arc<ArcSwap<ServiceSettings>>,
        admin_token: AdminToken,
        tls: Option<Arc<ArcSwap<tokio_rustls::TlsAcceptor>>>,
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
    /// The configuration that runs afterwards is the running one with the live keys of
    /// the new file copied in (`live_part`); it is validated as a whole before
    /// anything is swapped. The report is derived from it, so it cannot claim more than
    /// was applied: `applied` = what differs between the old and the running
    /// configuration, `restart_required` = what still differs between the running
    /// configuration and the file (any section or key this reloader does not apply —
    /// zones, queue, async, routes, listen addresses… — lands there).
    ///
    /// # Errors
    /// [`ReloadError`]: nothing was applied.
    pub async fn reload(&self) -> Result<ReloadReport, ReloadError> {
        let _one = self.busy.lock().await;
        let path = self.path.clone().ok_or(ReloadError::NoFile)?;
        // Reading is bounded (size, nesting, aliases: `crate::config::MAX_*`) but may take
        // a moment on a large file: off the runtime's worker threads.
        let mut new = tokio::task::spawn_blocking(move || Config::load_for_serve(&path))
            .await
            .map_err(|e| ReloadError::Invalid(format!("the configuration reader failed: {e}")))?
            .map_err(|e| ReloadError::Invalid(e.to_string()))?;
        if let Some(a) = self.overrides.0 {
            new.gateway.listen = a;
        }
        if let Some(a) = self.overrides.1 {
            new.gateway.admin_listen = a;
        }
        let old = self.current.lock().clone();
        let running = self.live_part(&old, &new);
        // Everything that can fail is prepared before anything is swapped.
        for c in [&new, &running] {
            if let Some(problem) = c.gateway.admin_exposure_issue() {
                return Err(ReloadError::Invalid(format!(
                    "gateway.admin_listen: {problem}"
                )));
            }
        }
        if let Some(issue) = running.validate().first() {
            // The new file is valid on its own, but its live keys do not fit the keys
            // that stay until a restart.
            return Err(ReloadError::Invalid(format!(
                "{}: {} (with the settings that need a restart kept; restart instead)",
                issue.path, issue.message
            )));
        }
        let token = running
            .gateway
            .admin_token()
            .map_err(ReloadError::Invalid)?;
        let mut applied = changed_keys(&old, &running);
        applied.retain(|k| !is_simulator_only(k));
        let report = ReloadReport {
            restart_required: changed_keys(&running, &new)
                .into_iter()
                .filter(|k| !is_simulator_only(k))
                .collect(),
            applied: applied.clone(),
        };
        let tls_changed = applied.iter().any(|k| k.starts_with("gateway.tls."));
        let acceptor = match (&running.gateway.tls, &self.tls) {
            (Some(t), Some(_)) if tls_changed => Some(
                tls::load_server_config(&t.cert_file, &t.key_file)
                    .map(tokio_rustls::TlsAcceptor::from)
                    .map_err(|e| ReloadError::Invalid(e.to_string()))?,
            ),
            _ => None,
        };
        let static_members = match &running.vm_pool {
            Some(crate::config::VmPoolConfig::Static(n))
                if applied.iter().any(|k| k == "vm_pool.urls") =>
            {
                Some(crate::backends::vm_static::StaticVmPool::new(n).members())
            }
            _ => None,
        };
        let tuning = running.libra_tuning();
        let retune = tuning != old.libra_tuning();
        // Apply: settings for new requests, the admin token, the static members, LIBRA's
        // parameters, the TLS acceptor.
        let settings = Arc::new(ServiceSettings::from_config(&running));
        self.settings.store(settings);
        self.admin_token.set(token);
        if let Some(gw) = &self.gateway {
            if let Some(members) = &static_members {
                let (added, removed) = gw.set_static_members(members);
                tracing::info!(added, removed, "static VM pool changed");
            }
            if running.pricing != old.pricing || running.libra.r_max_rps != old.libra.r_max_rps {
                gw.billing()
                    .set_pricing(running.pricing.meter_pricing(running.libra.r_max_rps));
            }
            if retune && !gw.retune(&tuning) {
                // Not reachable with the gateway's LIBRA policies; said, not hidden.
                tracing::warn!("the policy core has no LIBRA parameters; libra unchanged");
            }
        }
        if let (Some(slot), Some(acceptor)) = (&self.tls, acceptor) {
            slot.store(Arc::new(acceptor));
        }
        // The running configuration keeps the restart-only values of the running
        // gateway, so the next reload reports them again until a restart.
        *self.current.lock() = running;
        tracing::info!(
            applied = ?report.applied,
            restart_required = ?report.restart_required,
            "configuration reloaded"
        );
        if !report.restart_required.is_empty() {
            tracing::warn!(
                keys = ?report.restart_required,
                "changed keys need a restart and were not applied"
            );
        }
        Ok(report)
    }

    /// The configuration to run after a reload: `old` with the keys that apply live
    /// taken from `new` — the request-path settings (timeouts, trusted proxies, limits,
    /// path rules), the admin token's source, the TLS certificate and key (when TLS
    /// runs), and, with a running gateway, a `static` pool's `urls`, `pricing` and the
    /// LIBRA parameters [`crate::policy::controller::LibraTuning`] holds (r_max only
    /// without adaptive r_max; the epoch length, the budget rule, the per-VM cap and the
    /// adaptive controller need a restart).
    fn live_part(&self, old: &Config, new: &Config) -> Config {
        let mut run = old.clone();
        let (g, n) = (&mut run.gateway, &new.gateway);
        g.trusted_proxies.clone_from(&n.trusted_proxies);
        g.max_body_bytes = n.max_body_bytes;
        g.upstream_timeout_seconds = n.upstream_timeout_seconds;
        g.request_body_idle_timeout_seconds = n.request_body_idle_timeout_seconds;
        g.response_body_idle_timeout_seconds = n.response_body_idle_timeout_seconds;
        g.tunnel_idle_timeout_seconds = n.tunnel_idle_timeout_seconds;
        g.drain_timeout_seconds = n.drain_timeout_seconds;
        g.max_header_bytes = n.max_header_bytes;
        g.max_header_count = n.max_header_count;
        g.max_uri_bytes = n.max_uri_bytes;
        g.normalize_path = n.normalize_path;
        g.merge_slashes = n.merge_slashes;
        g.path_with_escaped_slashes_action = n.path_with_escaped_slashes_action;
        g.headers_with_underscores_action = n.headers_with_underscores_action;
        g.upgrade_protocols.clone_from(&n.upgrade_protocols);
        g.request_id_trust = n.request_id_trust;
        g.admin_token_file.clone_from(&n.admin_token_file);
        g.admin_token_env.clone_from(&n.admin_token_env);
        if let (Some(t), Some(nt), Some(_)) = (&mut g.tls, &n.tls, &self.tls) {
            t.cert_file.clone_from(&nt.cert_file);
            t.key_file.clone_from(&nt.key_file);
        }
        // The simulator's section has no effect on `serve`: neither applied nor reported.
        run.sim = new.sim.clone();
        if self.gateway.is_none() {
            return run;
        }
        if let (
            Some(crate::config::VmPoolConfig::Static(s)),
            Some(crate::config::VmPoolConfig::Static(ns)),
        ) = (&mut run.vm_pool, &new.vm_pool)
        {
            s.urls.clone_from(&ns.urls);
        }
        run.pricing = new.pricing.clone();
        let (l, nl) = (&mut run.libra, &new.libra);
        l.alpha = nl.alpha;
        l.beta = nl.beta;
        l.phi = nl.phi;
        l.rho = nl.rho;
        l.decision_epochs = nl.decision_epochs;
        l.first_decision_epoch = nl.first_decision_epoch;
        l.min_vms = nl.min_vms;
        l.max_vms = nl.max_vms;
        l.cip_rps = nl.cip_rps;
        if l.r_max_adaptive.is_none() && nl.r_max_adaptive.is_none() {
            l.r_max_rps = nl.r_max_rps;
        }
        run
    }
}

impl Reloader {
    /// `gateway.drain_timeout_seconds` in force.
    pub fn drain_timeout(&self) -> std::time::Duration {
        let g = &self.current.lock().gateway;
        g.drain_timeout_seconds.get()
    }
}

/// `sim.*`: read by the simulator only.
fn is_simulator_only(key: &str) -> bool {
    key == "sim" || key.starts_with("sim.")
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
