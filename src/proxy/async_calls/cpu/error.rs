//! Why a CPU signal gave no utilisation: the one error type of the Prometheus query
//! ([`super::prometheus`]) and of the node_exporter scrapes ([`super::node_exporter`]),
//! so that `/status` and the outage warning show either the same way.

/// Why a Prometheus query or a node_exporter scrape gave no utilisation. Each message is one line naming what was
/// wrong with the reply.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PrometheusError {
    /// No connection, or the exchange broke off.
    #[error("no answer: {0}")]
    Unreachable(String),
    /// No reply within `async.prometheus.timeout_ms`.
    #[error("no answer within {0} ms")]
    Timeout(u64),
    /// A non-2xx status without the API's error object.
    #[error("HTTP status {0}")]
    Status(u16),
    /// The body is not the query API's JSON.
    #[error("reply is not Prometheus query JSON: {0}")]
    NotJson(String),
    /// `"status": "error"`.
    #[error("query failed ({kind}): {message}")]
    Query {
        /// `errorType` (`bad_data`, `timeout`, …).
        kind: String,
        /// `error`.
        message: String,
    },
    /// A result type other than `vector` or `scalar`.
    #[error("result type {0:?}, want vector or scalar")]
    ResultType(String),
    /// An empty vector (no VM's node_exporter scraped, or a query matching nothing).
    #[error("query returned no sample")]
    NoSample,
    /// A sample value that is not a finite number.
    #[error("sample value {0:?} is not a finite number")]
    NotANumber(String),
    /// A node_exporter body that is not the Prometheus text exposition format.
    #[error("reply is not the Prometheus text format: {0}")]
    NotExposition(String),
    /// A node_exporter body without `node_cpu_seconds_total` (not a node_exporter, or
    /// its `cpu` collector is off).
    #[error("no node_cpu_seconds_total sample in the reply")]
    NoCpuCounters,
    /// One VM host's node_exporter failed.
    #[error("{url}: {reason}")]
    At {
        /// The exporter's `/metrics` URL.
        url: String,
        /// Why it failed.
        reason: Box<PrometheusError>,
    },
}
