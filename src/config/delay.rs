//! `async:` and `routes:` — asynchronous calls and their delay queue (ProFaaStinate §3).
//!
//! A `routes:` entry (call scheduling's route keys, [`super::routes::RouteConfig`]) may
//! make its calls asynchronous: `async: true` and `default_deadline_seconds`.

use serde::{Deserialize, Serialize};
use std::num::{NonZeroU32, NonZeroU64, NonZeroUsize};

use super::duration::Seconds;
use super::issues::{ConfigIssue, Issues};
use super::url::HttpUrl;
use crate::policy::delay::DelayParams;

/// Where the CPU signal of the delay queue's scheduler comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum CpuSignal {
    /// Requests in flight on ready VMs ÷ their slots (`libra.max_outstanding_per_vm`,
    /// else 1 per VM).
    #[default]
    Outstanding,
    /// procfs: with the `process` VM pool, the local VM processes' share of the host's
    /// CPU time (their `utime + stime` from `/proc/<pid>/stat` over the host's total from
    /// `/proc/stat`; other load on the host does not count); without local VM
    /// processes, the host's non-idle share (`/proc/stat`).
    Process,
    /// The VM pool's CPU utilisation from node_exporter's `node_cpu_seconds_total`:
    /// through a Prometheus server's HTTP API (`async.prometheus.url` and `query`) or
    /// scraped from each ready VM's node_exporter (`async.prometheus.node_exporter_port`);
    /// while neither answers usefully, the `outstanding` signal stands in.
    Prometheus,
}

/// `async.prometheus:` — where the `prometheus` CPU signal comes from
/// (ProFaaStinate §3: the scheduler's CPU signal, here measured on the VM pool).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PrometheusSignalConfig {
    /// Base URL of the Prometheus HTTP API (`http://host:9090`, plain HTTP); the signal
    /// is `GET <url>/api/v1/query?query=<query>`. With `cpu_signal: prometheus`, exactly
    /// one of `url` and `node_exporter_port` is set.
    pub url: Option<HttpUrl>,
    /// TCP port of each VM's node_exporter: the gateway itself scrapes
    /// `http://<ready VM's host>:<port>/metrics` (plain HTTP, one scrape per distinct
    /// host) every sample and takes each host's utilisation as 1 − Δidle/Δtotal of
    /// `node_cpu_seconds_total` between two scrapes; the pool's signal is the mean over
    /// the hosts that answered. The alternative to `url` (no Prometheus server).
    pub node_exporter_port: Option<u16>,
    /// PromQL instant query giving the VM pool's CPU utilisation in [0, 1]; a vector
    /// result is averaged over its samples (one per VM, say).
    pub query: String,
    /// A query without an answer within this many milliseconds counts as failed.
    pub timeout_ms: u64,
}

/// The default `async.prometheus.query`: the non-idle share of every CPU that
/// node_exporter reports, over 30 s (at least two scrapes at the usual 15 s interval).
pub const DEFAULT_PROMETHEUS_QUERY: &str =
    "1 - avg(rate(node_cpu_seconds_total{mode=\"idle\"}[30s]))";

impl Default for PrometheusSignalConfig {
    fn default() -> Self {
        Self {
            url: None,
            node_exporter_port: None,
            query: DEFAULT_PROMETHEUS_QUERY.into(),
            timeout_ms: 1000,
        }
    }
}

/// `async:` — asynchronous calls held in a durable, deadline-ordered delay queue and
/// released by a CPU-aware scheduler (ProFaaStinate §3). Off unless a `routes:` entry
/// enables them ([`super::routes::AsyncMode`]); the store lives in the state directory
/// (`spillway serve --state-dir`).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AsyncConfig {
    /// Status URLs live under this path prefix on the proxy listener.
    pub status_prefix: String,
    /// Request header carrying the deadline, milliseconds from now.
    pub deadline_header: String,
    /// Deadline when neither the header nor the route gives one, seconds.
    pub default_deadline_seconds: Seconds,
    /// Largest deadline accepted, seconds (a larger header value is 400).
    pub max_deadline_seconds: Seconds,
    /// Largest asynchronous request body, bytes (over it: 413).
    pub max_body_bytes: NonZeroU64,
    /// Most calls waiting; more are refused with 503 + `Retry-After`.
    pub max_queued: NonZeroUsize,
    /// Largest stored response body, bytes: a longer one is not stored, the call
    /// `failed` with a 502 result saying so. A pending call counts this much against
    /// `max_store_bytes`.
    pub result_max_bytes: NonZeroU64,
    /// Most bytes the store holds (records, request bodies, results; a pending call's
    /// result at `result_max_bytes`): a call that does not fit is refused with
    /// 507 + `Retry-After` until finished calls are purged.
    pub max_store_bytes: u64,
    /// Most calls one client (its IP address) has stored, pending or finished within
    /// `result_ttl_seconds`; more are refused with 429 + `Retry-After`. `null`: no
    /// per-client bound (`spillway check` warns on a listener off loopback).
    pub max_calls_per_client: Option<NonZeroU64>,
    /// A finished call (its status and result) is kept this long after it finished,
    /// seconds; then it is deleted from the store (its status URL answers 404).
    pub result_ttl_seconds: Seconds,
    /// `Retry-After` of a 503 for a full queue or a failing store, seconds.
    pub retry_after_seconds: u64,
    /// Busy above this windowed CPU utilisation, 0–1.
    pub busy_utilisation: f64,
    /// CPU sample period, seconds (paper: 1).
    pub sample_interval_seconds: Seconds,
    /// CPU averaging window, seconds (paper: 10).
    pub window_seconds: Seconds,
    /// The mode switches at most once per this many seconds (paper: 10).
    pub switch_interval_seconds: Seconds,
    /// Busy mode releases calls due within this many seconds (paper: 10).
    pub urgency_window_seconds: Seconds,
    /// Most idle-mode releases per sample tick.
    pub release_batch: NonZeroU32,
    /// A call goes to the function tier at `deadline − (E[p] + this)`, seconds.
    pub deadline_margin_seconds: Seconds,
    /// `E[p]` before any call finished, seconds.
    pub expected_processing_seconds: Seconds,
    /// The CPU signal: `outstanding`, `process` or `prometheus`.
    pub cpu_signal: CpuSignal,
    /// The `prometheus` CPU signal's server and query.
    pub prometheus: PrometheusSignalConfig,
}

impl Default for AsyncConfig {
    fn default() -> Self {
        Self {
            status_prefix: "/_spillway/calls".into(),
            deadline_header: "Spillway-Deadline-Ms".into(),
            default_deadline_seconds: Seconds::from_secs(180),
            max_deadline_seconds: Seconds::from_secs(86400),
            max_body_bytes: NonZeroU64::new(1_048_576).unwrap(),
            max_queued: NonZeroUsize::new(10_000).unwrap(),
            result_max_bytes: NonZeroU64::new(1_048_576).unwrap(),
            max_store_bytes: 1 << 30,
            max_calls_per_client: NonZeroU64::new(100),
            result_ttl_seconds: Seconds::from_secs(3600),
            retry_after_seconds: 5,
            busy_utilisation: 0.8,
            sample_interval_seconds: Seconds::from_secs(1),
            window_seconds: Seconds::from_secs(10),
            switch_interval_seconds: Seconds::from_secs(10),
            urgency_window_seconds: Seconds::from_secs(10),
            release_batch: NonZeroU32::new(10).unwrap(),
            deadline_margin_seconds: Seconds::from_secs(5),
            expected_processing_seconds: Seconds::from_secs(1),
            cpu_signal: CpuSignal::Outstanding,
            prometheus: PrometheusSignalConfig::default(),
        }
    }
}

impl AsyncConfig {
    /// Semantic checks, each naming its field path.
    pub(crate) fn validate(&self, is: &mut Issues) {
        is.nonzero_duration(
            "async.default_deadline_seconds",
            self.default_deadline_seconds,
        );
        is.nonzero_duration("async.max_deadline_seconds", self.max_deadline_seconds);
        if self.default_deadline_seconds > self.max_deadline_seconds {
            is.push(
                "async.default_deadline_seconds",
                format!(
                    "must not exceed async.max_deadline_seconds ({} > {})",
                    self.default_deadline_seconds, self.max_deadline_seconds
                ),
            );
        }
        if !self.status_prefix.starts_with('/') || self.status_prefix.ends_with('/') {
            is.push(
                "async.status_prefix",
                format!(
                    "must start with / and not end with /, got {:?}",
                    self.status_prefix
                ),
            );
        }
        if http::HeaderName::from_bytes(self.deadline_header.as_bytes()).is_err() {
            is.push(
                "async.deadline_header",
                format!("not a header name: {:?}", self.deadline_header),
            );
        }
        let one_call = self
            .max_body_bytes
            .get()
            .saturating_add(self.result_max_bytes.get());
        if self.max_store_bytes < one_call {
            is.push(
                "async.max_store_bytes",
                format!(
                    "must hold at least one call, async.max_body_bytes + \
                     async.result_max_bytes = {one_call} bytes, got {}",
                    self.max_store_bytes
                ),
            );
        }
        is.nonzero_duration("async.result_ttl_seconds", self.result_ttl_seconds);
        is.within("async.busy_utilisation", self.busy_utilisation, 0.0, 1.0);
        is.nonzero_duration(
            "async.sample_interval_seconds",
            self.sample_interval_seconds,
        );
        is.nonzero_duration("async.window_seconds", self.window_seconds);
        self.validate_prometheus(is);
    }

    fn validate_prometheus(&self, is: &mut Issues) {
        let p = &self.prometheus;
        match (&p.url, p.node_exporter_port) {
            (None, None) if self.cpu_signal == CpuSignal::Prometheus => is.push(
                "async.prometheus.url",
                "required with async.cpu_signal: prometheus (e.g. http://127.0.0.1:9090), \
                 unless async.prometheus.node_exporter_port is set",
            ),
            (Some(_), Some(_)) => is.push(
                "async.prometheus.node_exporter_port",
                "set either async.prometheus.url (a Prometheus server) or \
                 async.prometheus.node_exporter_port (each VM's node_exporter), not both",
            ),
            (_, Some(0)) => is.push(
                "async.prometheus.node_exporter_port",
                "must be a TCP port, 1-65535 (node_exporter's default is 9100)",
            ),
            _ => {}
        }
        if let Some(url) = &p.url
            && url.is_https()
        {
            is.push(
                "async.prometheus.url",
                format!(
                    "must be an http:// URL (plain HTTP), got {:?}",
                    url.as_str()
                ),
            );
        }
        if p.query.trim().is_empty() {
            is.push("async.prometheus.query", "must not be empty");
        }
        if p.timeout_ms == 0 {
            is.push("async.prometheus.timeout_ms", "must be at least 1");
        }
    }

    /// The policy core's delay-queue parameters; `vm_slots` is
    /// `libra.max_outstanding_per_vm` (stand-in for the VM slot count of call scheduling).
    pub fn delay_params(&self, vm_slots: Option<u32>) -> DelayParams {
        DelayParams {
            busy_utilisation: self.busy_utilisation,
            sample_interval: self.sample_interval_seconds.get(),
            window: self.window_seconds.get(),
            min_switch: self.switch_interval_seconds.get(),
            urgency_window: self.urgency_window_seconds.get(),
            release_batch: self.release_batch.get(),
            deadline_margin: self.deadline_margin_seconds.get(),
            expected_processing: self.expected_processing_seconds.get(),
            vm_slots,
        }
    }
}

/// Risky but valid asynchronous-call settings: a route enables asynchronous calls on a
/// listener off loopback while `async.max_calls_per_client` is `null` (any client can
/// fill the store up to `async.max_store_bytes`, every other client then gets 507).
/// `listeners` are the gateway's client listeners, as `(field, address)`.
pub(crate) fn warnings(
    routes: &[super::routes::RouteConfig],
    a: &AsyncConfig,
    listeners: &[(&str, std::net::SocketAddr)],
) -> Vec<ConfigIssue> {
    let mut out = Vec::new();
    let Some(route) = routes
        .iter()
        .position(|r| r.async_mode != super::routes::AsyncMode::Off)
    else {
        return out;
    };
    let public: Vec<String> = listeners
        .iter()
        .filter(|(_, a)| !a.ip().is_loopback())
        .map(|(k, a)| format!("{k} {a}"))
        .collect();
    if a.max_calls_per_client.is_none() && !public.is_empty() {
        out.push(ConfigIssue::new(
            "async.max_calls_per_client",
            format!(
                "no per-client limit, while routes[{route}].async enables asynchronous calls \
                 on a listener off loopback ({}): any client can fill the store up to \
                 async.max_store_bytes ({} bytes) and every other one then gets 507; set a \
                 limit (the default is 100)",
                public.join(", "),
                a.max_store_bytes
            ),
        ));
    }
    out
}

/// The asynchronous-call checks of `routes:` (their deadlines); the route keys are
/// checked by [`super::routes::validate_routes`].
pub(crate) fn validate_routes(
    routes: &[super::routes::RouteConfig],
    a: &AsyncConfig,
    is: &mut Issues,
) {
    for (i, r) in routes.iter().enumerate() {
        if let Some(d) = r.default_deadline_seconds {
            let path = format!("routes[{i}].default_deadline_seconds");
            is.nonzero_duration(&path, d);
            if d > a.max_deadline_seconds {
                is.push(
                    path,
                    format!(
                        "must not exceed async.max_deadline_seconds ({d} > {})",
                        a.max_deadline_seconds
                    ),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::{Config, ConfigError};

    fn issues(yaml: &str) -> Vec<String> {
        match Config::from_yaml(yaml, "a.yaml") {
            Ok(_) => Vec::new(),
            Err(ConfigError::Invalid { issues, .. }) => issues
                .iter()
                .map(|i| {
                    let at = i.location.map_or("-".into(), |l| l.to_string());
                    format!("{at} {}: {}", i.path, i.message)
                })
                .collect(),
            Err(e) => vec![e.to_string()],
        }
    }

    #[test]
    fn the_prometheus_signal_needs_an_http_url_a_query_and_a_timeout() {
        let got = issues("async:\n  cpu_signal: prometheus\n");
        assert_eq!(got.len(), 1, "{got:#?}");
        assert!(
            got[0].contains("async.prometheus.url: required with async.cpu_signal: prometheus"),
            "{got:#?}"
        );
        let got = issues(
            "async:\n  cpu_signal: prometheus\n  prometheus:\n    url: https://prom:9090\n    query: ' '\n    timeout_ms: 0\n",
        );
        let want = [
            "4:10 async.prometheus.url: must be an http:// URL",
            "5:12 async.prometheus.query: must not be empty",
            "6:17 async.prometheus.timeout_ms: must be at least 1",
        ];
        assert_eq!(got.len(), want.len(), "{got:#?}");
        for w in want {
            assert!(got.iter().any(|g| g.starts_with(w)), "{w}\nin {got:#?}");
        }
        let c = Config::from_yaml(
            "async:\n  cpu_signal: prometheus\n  prometheus: {url: 'http://127.0.0.1:9090'}\n",
            "a.yaml",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            c.async_calls.prometheus.query,
            super::DEFAULT_PROMETHEUS_QUERY
        );
        assert_eq!(c.async_calls.prometheus.timeout_ms, 1000);
    }

    #[test]
    fn node_exporter_port_is_the_alternative_to_url_never_both() {
        let got = issues(
            "async:\n  cpu_signal: prometheus\n  prometheus:\n    url: 'http://127.0.0.1:9090'\n    node_exporter_port: 9100\n",
        );
        assert_eq!(got.len(), 1, "{got:#?}");
        assert!(
            got[0].starts_with("5:25 async.prometheus.node_exporter_port: set either"),
            "{got:#?}"
        );
        let got =
            issues("async:\n  cpu_signal: prometheus\n  prometheus:\n    node_exporter_port: 0\n");
        assert_eq!(got.len(), 1, "{got:#?}");
        assert!(
            got[0].starts_with("4:25 async.prometheus.node_exporter_port: must be a TCP port"),
            "{got:#?}"
        );
        let got = issues(
            "async:\n  cpu_signal: prometheus\n  prometheus:\n    node_exporter_port: 70000\n",
        );
        assert_eq!(got.len(), 1, "{got:#?}");
        assert!(got[0].contains("node_exporter_port"), "{got:#?}");
        let c = Config::from_yaml(
            "async:\n  cpu_signal: prometheus\n  prometheus: {node_exporter_port: 9137}\n",
            "a.yaml",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.async_calls.prometheus.node_exporter_port, Some(9137));
        assert_eq!(c.async_calls.prometheus.url, None);
    }

    #[test]
    fn removed_async_keys_say_what_replaces_them() {
        let got =
            issues("async:\n  enabled: true\n  store_dir: x\n  result_retention_seconds: 5\n");
        assert_eq!(got.len(), 3, "{got:#?}");
        assert!(
            got[0].starts_with(
                "2:3 async.enabled: removed: asynchronous calls are off unless a route"
            ),
            "{got:#?}"
        );
        assert!(got[1].starts_with("3:3 async.store_dir: removed: the store lives in the state directory, `spillway serve --state-dir DIR`"), "{got:#?}");
        assert!(
            got[2].starts_with(
                "4:3 async.result_retention_seconds: renamed: `async.result_ttl_seconds`"
            ),
            "{got:#?}"
        );
        // Other unknown keys still list what is accepted.
        let got = issues("async:\n  enable: true\n");
        assert!(got[0].contains("unknown key"), "{got:#?}");
    }

    #[test]
    fn a_route_enables_asynchronous_calls_off_prefer_or_always() {
        use crate::config::AsyncMode;
        let read = |modes: &str| {
            Config::from_yaml(&format!("routes:\n{modes}"), "r.yaml")
                .unwrap_or_else(|e| panic!("{e}"))
        };
        assert!(
            !Config::from_yaml("", "e.yaml").unwrap().async_enabled(),
            "off by default"
        );
        let c = read(
            "  - {name: a, path_prefix: /a}\n  - {name: b, path_prefix: /b, async: off}\n  - {name: c, path_prefix: /c, async: false}\n",
        );
        assert!(!c.async_enabled());
        let c = read(
            "  - {name: a, path_prefix: /a, async: prefer}\n  - {name: b, path_prefix: /b, async: true}\n  - {name: c, path_prefix: /c, async: always}\n",
        );
        let modes: Vec<AsyncMode> = c.routes.iter().map(|r| r.async_mode).collect();
        assert_eq!(
            modes,
            [AsyncMode::Prefer, AsyncMode::Always, AsyncMode::Always]
        );
        assert!(c.async_enabled());
        let got = issues("routes:\n  - {name: a, path_prefix: /a, async: sometimes}\n");
        assert_eq!(got.len(), 1, "{got:#?}");
        assert_eq!(
            got[0],
            "2:39 routes[0].async: expected off, prefer or always (or true/false), found `sometimes`"
        );
        let got = issues("routes:\n  - {name: a, path_prefix: /a, async: 1}\n");
        assert!(
            got[0].starts_with("2:39 routes[0].async: expected off, prefer or always"),
            "{got:#?}"
        );
    }

    #[test]
    fn check_warns_on_async_calls_off_loopback_without_a_per_client_limit() {
        let warn = |yaml: &str| {
            let c = Config::from_yaml(yaml, "w.yaml").unwrap_or_else(|e| panic!("{e}"));
            crate::config::warnings(&c, Some(yaml))
                .iter()
                .map(|w| crate::config::warning_line("w.yaml", w))
                .collect::<Vec<_>>()
        };
        let route = "routes:\n  - {name: jobs, path_prefix: /jobs, async: prefer}\n";
        let public = "gateway:\n  listen: 0.0.0.0:8080\n";
        let unbounded = "async:\n  max_calls_per_client: null\n";
        let got = warn(&format!("{public}{route}{unbounded}"));
        assert_eq!(got.len(), 1, "{got:#?}");
        assert!(
            got[0].starts_with("w.yaml:6:25: warning: async.max_calls_per_client: no per-client limit, while routes[0].async enables"),
            "{got:#?}"
        );
        assert!(got[0].contains("gateway.listen 0.0.0.0:8080"), "{got:#?}");
        // A limit, loopback, or no async route: nothing to warn about.
        assert!(warn(&format!("{public}{route}")).is_empty());
        assert!(warn(&format!("{route}{unbounded}")).is_empty());
        assert!(warn(&format!("{public}{unbounded}")).is_empty());
    }
}
