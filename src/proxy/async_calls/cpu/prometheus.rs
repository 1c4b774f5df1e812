//! The `prometheus` CPU signal of the delay queue's scheduler (ProFaaStinate §3):
//! the VM pool's CPU utilisation read from a Prometheus server's HTTP API,
//! `GET <async.prometheus.url>/api/v1/query?query=<async.prometheus.query>`, by default
//! the non-idle share of node_exporter's `node_cpu_seconds_total` on every VM.
//!
//! A background task queries once per `async.sample_interval_seconds` and keeps the last
//! answer; the scheduler's sample reads it without waiting on the network. While the
//! query fails (no answer within `async.prometheus.timeout_ms`, a non-2xx status, a reply
//! that is not the API's JSON, `"status": "error"`, no sample, a value that is not a
//! number) the `outstanding` signal stands in, and the gateway logs **one** warning per
//! outage naming the URL and the reason (and one line when Prometheus answers again);
//! `/status` shows the source in use and the last error under `async.cpu_signal`.
//!
//! With `async.prometheus.node_exporter_port` instead of `url`, the same signal scrapes
//! each ready VM host's node_exporter itself (no Prometheus server): see
//! [`super::node_exporter`].

use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Uri};
use http_body_util::BodyExt as _;
use serde::Deserialize;

pub use super::error::PrometheusError;
use super::node_exporter::{CpuCounters, NodeExporters, exporter_urls, parse_cpu_counters};
use crate::config::delay::PrometheusSignalConfig;
use crate::net::body;
use crate::net::client::{ClientSettings, UpstreamClient};

/// The largest reply read, bytes (an instant query of one utilisation is a few hundred).
const MAX_REPLY_BYTES: usize = 1 << 20;

#[derive(Deserialize)]
struct Reply {
    status: String,
    #[serde(default)]
    data: Option<Data>,
    #[serde(default, rename = "errorType")]
    error_type: Option<String>,
    #[serde(default)]
    error: Option<String>,
}

#[derive(Deserialize)]
struct Data {
    #[serde(rename = "resultType")]
    result_type: String,
    result: serde_json::Value,
}

/// `[<unix seconds>, "<value>"]`.
#[derive(Deserialize)]
struct SampleValue(#[allow(dead_code)] f64, String);

#[derive(Deserialize)]
struct VectorSample {
    value: SampleValue,
}

/// The CPU utilisation in an `/api/v1/query` reply: a scalar's value, or the mean of a
/// vector's samples, clamped to [0, 1].
///
/// # Errors
/// [`PrometheusError::NotJson`], [`PrometheusError::Query`],
/// [`PrometheusError::ResultType`], [`PrometheusError::NoSample`],
/// [`PrometheusError::NotANumber`].
pub fn parse_utilisation(body: &[u8]) -> Result<f64, PrometheusError> {
    let not_json = |e: serde_json::Error| PrometheusError::NotJson(e.to_string());
    let reply: Reply = serde_json::from_slice(body).map_err(not_json)?;
    if reply.status != "success" {
        return Err(PrometheusError::Query {
            kind: reply.error_type.unwrap_or_else(|| reply.status.clone()),
            message: reply.error.unwrap_or_default(),
        });
    }
    let data = reply
        .data
        .ok_or_else(|| PrometheusError::NotJson("\"data\" missing".into()))?;
    let values: Vec<String> = match data.result_type.as_str() {
        "scalar" => vec![
            serde_json::from_value::<SampleValue>(data.result)
                .map_err(not_json)?
                .1,
        ],
        "vector" => serde_json::from_value::<Vec<VectorSample>>(data.result)
            .map_err(not_json)?
            .into_iter()
            .map(|s| s.value.1)
            .collect(),
        other => return Err(PrometheusError::ResultType(other.to_owned())),
    };
    if values.is_empty() {
        return Err(PrometheusError::NoSample);
    }
    let mut sum = 0.0;
    for v in &values {
        match v.parse::<f64>() {
            Ok(x) if x.is_finite() => sum += x,
            _ => return Err(PrometheusError::NotANumber(v.clone())),
        }
    }
    Ok((sum / values.len() as f64).clamp(0.0, 1.0))
}

/// The last query's outcome.
#[derive(Debug, Default)]
struct Last {
    /// The utilisation of the last successful query, if the last query succeeded.
    value: Option<f64>,
    /// The last failure (kept until the next success, for `/status`).
    error: Option<PrometheusError>,
    /// Queries so far.
    queries: u64,
}

/// Where the signal reads the CPU from.
enum Source {
    /// A Prometheus server's query API (`async.prometheus.url`).
    Server {
        base: Uri,
        /// `/api/v1/query?query=…` (encoded).
        target: Uri,
    },
    /// Each ready VM host's node_exporter (`async.prometheus.node_exporter_port`).
    NodeExporter {
        port: u16,
        hosts: Mutex<NodeExporters>,
    },
}

/// The ready VMs' base URLs, asked once per round of node_exporter scrapes; `None`
/// once the gateway is gone (the task ends).
pub type VmBases = Box<dyn Fn() -> Option<Vec<Uri>> + Send + Sync>;

/// The `prometheus` CPU signal: a client for one query (or one scrape per VM host) and
/// its last outcome. See the [module docs](self) and [`super::node_exporter`].
pub struct PrometheusCpu {
    client: UpstreamClient,
    source: Source,
    timeout: Duration,
    last: Mutex<Last>,
}

impl PrometheusCpu {
    /// The signal for `cfg`: node_exporter scrapes with `node_exporter_port`, else the
    /// server query at `url`; `None` with neither (or a `url` that is not a URL;
    /// `spillway check` refuses both for `cpu_signal: prometheus`).
    pub fn new(cfg: &PrometheusSignalConfig) -> Option<Self> {
        let source = match cfg.node_exporter_port {
            Some(port) => Source::NodeExporter {
                port,
                hosts: Mutex::new(NodeExporters::default()),
            },
            None => {
                let base: Uri = cfg.url.as_ref()?.uri().clone();
                let query: String = form_urlencoded::Serializer::new(String::new())
                    .append_pair("query", &cfg.query)
                    .finish();
                let target = format!("/api/v1/query?{query}").parse().ok()?;
                Source::Server { base, target }
            }
        };
        let timeout = Duration::from_millis(cfg.timeout_ms);
        Some(Self {
            client: UpstreamClient::new(ClientSettings {
                connect_timeout: timeout,
                idle_timeout: Duration::from_secs(60),
            }),
            source,
            timeout,
            last: Mutex::new(Last::default()),
        })
    }

    /// The query URL, or with node_exporter `http://<VM host>:<port>/metrics` (for
    /// messages and `/status`).
    pub fn url(&self) -> String {
        match &self.source {
            Source::Server { base, target } => crate::net::client::join(base, target)
                .map_or_else(|_| base.to_string(), |u| u.to_string()),
            Source::NodeExporter { port, .. } => format!("http://<VM host>:{port}/metrics"),
        }
    }

    /// `node_exporter` when scraping each VM host, else `server`.
    pub fn mode(&self) -> &'static str {
        match self.source {
            Source::Server { .. } => "server",
            Source::NodeExporter { .. } => "node_exporter",
        }
    }

    /// The utilisation of the last query, `None` when it failed (or none ran yet).
    pub fn latest(&self) -> Option<f64> {
        self.lock().value
    }

    /// The last failure, until a query succeeds.
    pub fn last_error(&self) -> Option<PrometheusError> {
        self.lock().error.clone()
    }

    /// Queries sent so far.
    pub fn queries(&self) -> u64 {
        self.lock().queries
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, Last> {
        self.last.lock()
    }

    /// One query: the pool's CPU utilisation in [0, 1].
    ///
    /// # Errors
    /// Every [`PrometheusError`].
    pub async fn query(&self) -> Result<f64, PrometheusError> {
        self.query_inner().await
    }

    /// GET `target` from `base` within the timeout: the status and the body.
    async fn get(
        &self,
        base: &Uri,
        target: &Uri,
        accept: &'static str,
    ) -> Result<(http::StatusCode, bytes::Bytes), PrometheusError> {
        let ms = self.timeout.as_millis() as u64;
        let exchange = async {
            let req = Request::get(target.clone())
                .header(http::header::ACCEPT, accept)
                .body(body::empty())
                .expect("static request parts are valid");
            let resp = self
                .client
                .forward(base, req)
                .await
                .map_err(|e| PrometheusError::Unreachable(e.to_string()))?;
            let status = resp.status();
            let bytes = http_body_util::Limited::new(resp.into_body(), MAX_REPLY_BYTES)
                .collect()
                .await
                .map_err(|e| PrometheusError::Unreachable(e.to_string()))?
                .to_bytes();
            Ok((status, bytes))
        };
        tokio::time::timeout(self.timeout, exchange)
            .await
            .unwrap_or(Err(PrometheusError::Timeout(ms)))
    }

    /// One node_exporter scrape: the host's CPU counters.
    async fn scrape(&self, url: &str) -> Result<CpuCounters, PrometheusError> {
        let uri: Uri = url
            .parse()
            .map_err(|e: http::uri::InvalidUri| PrometheusError::Unreachable(e.to_string()))?;
        let base: Uri = format!("http://{}", uri.authority().map_or("", |a| a.as_str()))
            .parse()
            .map_err(|e: http::uri::InvalidUri| PrometheusError::Unreachable(e.to_string()))?;
        let target = Uri::from_static("/metrics");
        let (status, bytes) = self.get(&base, &target, "text/plain").await?;
        if !status.is_success() {
            return Err(PrometheusError::Status(status.as_u16()));
        }
        parse_cpu_counters(&String::from_utf8_lossy(&bytes))
    }

    /// One round: scrape each distinct VM host's node_exporter at once and fold the
    /// outcomes into the pool's utilisation (`None` while no host has two scrapes).
    async fn scrape_round(
        self: &Arc<Self>,
        vm_bases: &[Uri],
    ) -> (Option<f64>, Option<PrometheusError>) {
        let Source::NodeExporter { port, hosts } = &self.source else {
            return (None, None);
        };
        let mut scrapes = tokio::task::JoinSet::new();
        for url in exporter_urls(vm_bases, *port) {
            let me = Arc::clone(self);
            scrapes.spawn(async move {
                let outcome = me.scrape(&url).await;
                (url, outcome)
            });
        }
        let mut outcomes = Vec::new();
        while let Some(done) = scrapes.join_next().await {
            if let Ok(o) = done {
                outcomes.push(o);
            }
        }
        outcomes.sort_by(|a, b| a.0.cmp(&b.0));
        let round = hosts.lock().record(outcomes);
        (round.value, round.error)
    }

    async fn query_inner(&self) -> Result<f64, PrometheusError> {
        let Source::Server { base, target } = &self.source else {
            return Err(PrometheusError::NoSample);
        };
        let (status, bytes) = self.get(base, target, "application/json").await?;
        match parse_utilisation(&bytes) {
            // The API answers errors with 4xx/5xx and its JSON error object: keep that
            // message, it says what is wrong with the query.
            Err(e @ PrometheusError::Query { .. }) => Err(e),
            _ if !status.is_success() => Err(PrometheusError::Status(status.as_u16())),
            r => r,
        }
    }

    /// Record one query's outcome; log a warning when an outage starts (not on every
    /// failed sample) and a line when it ends.
    fn record(&self, outcome: Result<f64, PrometheusError>) {
        let mut last = self.lock();
        last.queries += 1;
        match outcome {
            Ok(v) => {
                if last.error.take().is_some() {
                    tracing::info!(url = %self.url(), "prometheus CPU signal answers again");
                }
                last.value = Some(v);
            }
            Err(e) => {
                let first = last.error.is_none();
                if first {
                    tracing::warn!(
                        url = %self.url(),
                        error = %e,
                        "prometheus CPU signal failed; the outstanding signal stands in until it answers"
                    );
                }
                last.value = None;
                last.error = Some(e);
            }
        }
    }

    /// Record one node_exporter round: the pool's value and the first failing host
    /// (the hosts' own warnings are logged per host by [`NodeExporters::record`]).
    fn record_round(&self, value: Option<f64>, error: Option<PrometheusError>) {
        let mut last = self.lock();
        last.queries += 1;
        last.value = value;
        last.error = error;
    }

    /// Query (or scrape every ready VM host, whose base URLs `vms` gives) every `every`
    /// while the signal is in use (the task holds a weak reference and ends once the
    /// gateway's asynchronous front end dropped its signal, or `vms` says the gateway is
    /// gone).
    pub fn spawn(self: &Arc<Self>, every: Duration, vms: VmBases) {
        let me = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(p) = me.upgrade() else { return };
                if matches!(p.source, Source::NodeExporter { .. }) {
                    let Some(bases) = vms() else { return };
                    let (value, error) = p.scrape_round(&bases).await;
                    p.record_round(value, error);
                } else {
                    let outcome = p.query().await;
                    p.record(outcome);
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vector_is_averaged_and_a_scalar_read() {
        let v = br#"{"status":"success","data":{"resultType":"vector","result":[
            {"metric":{"instance":"vm-1:9100"},"value":[1700000000.5,"0.9"]},
            {"metric":{"instance":"vm-2:9100"},"value":[1700000000.5,"0.3"]}]}}"#;
        let got = parse_utilisation(v).unwrap();
        assert!((got - (0.9 + 0.3) / 2.0).abs() < 1e-12, "{got}");
        let s = br#"{"status":"success","data":{"resultType":"scalar","result":[1.5,"0.37"]}}"#;
        assert_eq!(parse_utilisation(s).unwrap(), 0.37);
        let over = br#"{"status":"success","data":{"resultType":"scalar","result":[1.5,"1.7"]}}"#;
        assert_eq!(parse_utilisation(over).unwrap(), 1.0, "clamped");
    }

    #[test]
    fn bad_replies_say_what_is_wrong() {
        let cases: [(&[u8], &str); 6] = [
            (b"<html>", "not Prometheus query JSON"),
            (
                br#"{"status":"error","errorType":"bad_data","error":"parse error at char 3"}"#,
                "query failed (bad_data): parse error at char 3",
            ),
            (
                br#"{"status":"success","data":{"resultType":"vector","result":[]}}"#,
                "no sample",
            ),
            (
                br#"{"status":"success","data":{"resultType":"matrix","result":[]}}"#,
                "result type \"matrix\"",
            ),
            (
                br#"{"status":"success","data":{"resultType":"scalar","result":[1,"NaN"]}}"#,
                "\"NaN\" is not a finite number",
            ),
            (br#"{"status":"success"}"#, "\"data\" missing"),
        ];
        for (body, want) in cases {
            let e = parse_utilisation(body).unwrap_err().to_string();
            assert!(e.contains(want), "{e:?} lacks {want:?}");
        }
    }

    #[test]
    fn the_query_is_url_encoded_under_the_api_path() {
        let cfg = PrometheusSignalConfig {
            url: Some("http://127.0.0.1:9/prom".parse().unwrap()),
            ..PrometheusSignalConfig::default()
        };
        let p = PrometheusCpu::new(&cfg).unwrap();
        let url = p.url();
        let (path, q) = url.split_once('?').unwrap();
        assert_eq!(path, "http://127.0.0.1:9/prom/api/v1/query");
        let decoded: Vec<(String, String)> =
            form_urlencoded::parse(q.as_bytes()).into_owned().collect();
        assert_eq!(decoded, vec![("query".to_owned(), cfg.query.clone())]);
        assert_eq!(p.latest(), None, "nothing before the first query");
    }

    #[test]
    fn an_outage_is_recorded_until_an_answer() {
        let cfg = PrometheusSignalConfig {
            url: Some("http://127.0.0.1:9".parse().unwrap()),
            ..PrometheusSignalConfig::default()
        };
        let p = PrometheusCpu::new(&cfg).unwrap();
        p.record(Ok(0.42));
        assert_eq!(p.latest(), Some(0.42));
        p.record(Err(PrometheusError::NoSample));
        p.record(Err(PrometheusError::Status(502)));
        assert_eq!(
            p.latest(),
            None,
            "a failure falls back, never a stale value"
        );
        assert_eq!(p.last_error(), Some(PrometheusError::Status(502)));
        p.record(Ok(0.61));
        assert_eq!((p.latest(), p.last_error()), (Some(0.61), None));
        assert_eq!(p.queries(), 4);
    }
}
