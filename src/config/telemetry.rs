//! `telemetry:` — span export. `telemetry.otlp` sends the gateway's spans (a request,
//! its attempts, a cold start, the wait in the gateway queue) to an OpenTelemetry
//! collector over OTLP/HTTP (protobuf), in batches, off the request path
//! (`crate::trace_export`). It needs a binary built with the `otlp` cargo feature.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::defaults::{
    DEFAULT_OTLP_SAMPLE_RATIO, DEFAULT_OTLP_SERVICE_NAME, DEFAULT_OTLP_TIMEOUT_MS,
};
use super::issues::Issues;
use super::url::HttpUrl;

/// `telemetry:`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TelemetryConfig {
    /// Span export over OTLP/HTTP; absent: no spans are made (the gateway still passes
    /// on or starts a W3C `traceparent`).
    #[serde(default)]
    pub otlp: Option<OtlpConfig>,
}

/// `telemetry.otlp:` — where and how spans are exported.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OtlpConfig {
    /// The collector's OTLP/HTTP traces URL, used as given (the path included):
    /// `http://127.0.0.1:4318/v1/traces`; `https://` is verified against the system's
    /// root certificates (`SSL_CERT_FILE` / `SSL_CERT_DIR` honoured).
    pub endpoint: HttpUrl,
    /// Deadline of one export request (a batch of spans), milliseconds, 1–600000.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// Share of the traces the gateway starts that are sampled and exported, 0–1 (by
    /// trace id). A client's `traceparent` decides for its own trace: its sampled flag
    /// is followed.
    #[serde(default = "default_sample_ratio")]
    pub sample_ratio: f64,
    /// The `service.name` resource attribute of every span.
    #[serde(default = "default_service_name")]
    pub service_name: String,
    /// Extra HTTP headers on every export request (a collector's API key), name to
    /// value.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
}

impl OtlpConfig {
    /// The value that stands for a header's value in printed configurations.
    pub const REDACTED: &'static str = "***";

    /// Replace every `headers` value with [`Self::REDACTED`]: `spillway config print`
    /// shows which headers go to the collector, never their values (API keys).
    pub fn redact_headers(&mut self) {
        for value in self.headers.values_mut() {
            *value = Self::REDACTED.to_string();
        }
    }
}

fn default_timeout_ms() -> u64 {
    DEFAULT_OTLP_TIMEOUT_MS
}
fn default_sample_ratio() -> f64 {
    DEFAULT_OTLP_SAMPLE_RATIO
}
fn default_service_name() -> String {
    DEFAULT_OTLP_SERVICE_NAME.into()
}

/// The message of a `telemetry.otlp` section in a binary built without the `otlp`
/// feature.
pub fn otlp_feature_missing() -> String {
    "span export needs OTLP support, but this spillway was built without the `otlp` \
     feature; rebuild with `cargo build --release --features otlp` or remove \
     telemetry.otlp"
        .into()
}

impl TelemetryConfig {
    /// What `spillway serve` (and `spillway check`) needs beyond [`Self::validate`]:
    /// `telemetry.otlp` is refused in a binary without the `otlp` feature.
    pub fn gateway_issues(&self, is: &mut Issues) {
        if self.otlp.is_some() && !cfg!(feature = "otlp") {
            is.push("telemetry.otlp", otlp_feature_missing());
        }
    }

    /// Semantic checks: a usable endpoint URL, bounds of the timeout and ratio, header
    /// names and values that HTTP allows.
    pub fn validate(&self, is: &mut Issues) {
        let Some(o) = &self.otlp else {
            return;
        };
        if let Some(p) = endpoint_problem(&o.endpoint) {
            is.push("telemetry.otlp.endpoint", p);
        }
        if !(1..=600_000).contains(&o.timeout_ms) {
            is.push(
                "telemetry.otlp.timeout_ms",
                format!("must be in [1, 600000] milliseconds, got {}", o.timeout_ms),
            );
        }
        if !(0.0..=1.0).contains(&o.sample_ratio) {
            is.push(
                "telemetry.otlp.sample_ratio",
                format!("must be in [0, 1], got {}", o.sample_ratio),
            );
        }
        if o.service_name.trim().is_empty() {
            is.push("telemetry.otlp.service_name", "must not be empty");
        }
        for (name, value) in &o.headers {
            if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
                is.push(
                    format!("telemetry.otlp.headers.{name}"),
                    "is not a valid HTTP header name",
                );
            } else if http::HeaderValue::from_str(value).is_err() {
                is.push(
                    format!("telemetry.otlp.headers.{name}"),
                    "the value is not a valid HTTP header value (visible ASCII and spaces)",
                );
            }
        }
    }
}

/// What is wrong with an OTLP endpoint, if anything: an `http://` or `https://` URL
/// with a host and no user.
fn endpoint_problem(endpoint: &HttpUrl) -> Option<String> {
    let (u, url) = (endpoint.uri(), endpoint.as_str());
    if !matches!(u.scheme_str(), Some("http" | "https")) {
        return Some(format!("must be an http:// or https:// URL, got {url:?}"));
    }
    match u.authority() {
        None => Some(format!("has no host, got {url:?}")),
        Some(a) if a.as_str().contains('@') => Some(format!(
            "must not carry a user (use telemetry.otlp.headers), got {url:?}"
        )),
        Some(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn otlp(endpoint: &str) -> OtlpConfig {
        OtlpConfig {
            endpoint: endpoint.parse().unwrap(),
            timeout_ms: DEFAULT_OTLP_TIMEOUT_MS,
            sample_ratio: 1.0,
            service_name: "spillway".into(),
            headers: BTreeMap::new(),
        }
    }

    fn issues(c: OtlpConfig) -> Vec<String> {
        let mut is = Issues(Vec::new());
        TelemetryConfig { otlp: Some(c) }.validate(&mut is);
        is.0.into_iter().map(|i| i.to_string()).collect()
    }

    #[test]
    fn endpoint_ratio_timeout_and_headers_are_checked_by_field() {
        let ok = issues(otlp("http://127.0.0.1:4318/v1/traces"));
        assert!(ok.is_empty(), "{ok:?}");
        let mut is = Issues(Vec::new());
        TelemetryConfig {
            otlp: Some(otlp("http://127.0.0.1:4318/v1/traces")),
        }
        .gateway_issues(&mut is);
        assert_eq!(is.0.is_empty(), cfg!(feature = "otlp"));
        let mut bad = otlp("http://user@x/");
        bad.sample_ratio = 1.5;
        bad.timeout_ms = 0;
        bad.headers.insert("bad name".into(), "v".into());
        let text = issues(bad).join("\n");
        for field in [
            "telemetry.otlp.endpoint",
            "telemetry.otlp.sample_ratio",
            "telemetry.otlp.timeout_ms",
            "telemetry.otlp.headers.bad name",
        ] {
            assert!(text.contains(field), "{field} in {text}");
        }
        let problem = |text: &str| endpoint_problem(&text.parse().unwrap());
        assert!(problem("http://user@collector:4318/v1/traces").is_some());
        assert_eq!(problem("https://collector:4318/v1/traces"), None);
        assert_eq!(problem("http://collector:4318/v1/traces"), None);
    }
}
