//! Error accounting for cloud providers (issue 4: "failures are handled, logged and
//! visible in `/status` and metrics").
//!
//! A provider owns one [`ProviderErrors`] and calls [`ProviderErrors::record`] for every
//! failed API call. Each record is logged (`warn`), counted in
//! `spillway_provider_errors_total{provider, operation, kind}` (see
//! [`crate::telemetry`]) and kept for `/status` as per-`operation.kind` counters plus
//! the last error's message. Label values come from fixed sets: `operation` is a
//! provider-defined `&'static str` (`run_instances`, …) and `kind` an [`ErrorKind`].

use std::collections::BTreeMap;
use std::fmt::Display;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

/// What kind of failure an API call had; the `kind` label of
/// `spillway_provider_errors_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// No capacity for the request (EC2 `InsufficientInstanceCapacity`, instance or vCPU
    /// limits).
    Capacity,
    /// The API rate-limited the caller (EC2 `RequestLimitExceeded`, HTTP 429).
    Throttling,
    /// The credentials are missing, invalid or lack the permission.
    AccessDenied,
    /// The API endpoint could not be reached (connection refused, DNS, TLS).
    Unreachable,
    /// The call timed out.
    Timeout,
    /// The API rejected the request as invalid (bad id, parameter, configuration).
    InvalidRequest,
    /// Anything else (server errors, unparsable replies).
    Other,
}

impl ErrorKind {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Capacity => "capacity",
            Self::Throttling => "throttling",
            Self::AccessDenied => "access_denied",
            Self::Unreachable => "unreachable",
            Self::Timeout => "timeout",
            Self::InvalidRequest => "invalid_request",
            Self::Other => "other",
        }
    }

    /// Whether retrying the same call later may succeed (throttling, unreachable,
    /// timeout, other server-side trouble).
    pub fn is_transient(self) -> bool {
        matches!(
            self,
            Self::Throttling | Self::Unreachable | Self::Timeout | Self::Other
        )
    }
}

/// The most recent error of a provider, as `/status` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LastProviderError {
    /// API operation (`run_instances`).
    pub operation: &'static str,
    /// Error kind.
    pub kind: ErrorKind,
    /// Full error message (with the API's error code when there is one).
    pub message: String,
    /// When it happened, seconds since the Unix epoch.
    pub at_unix_seconds: u64,
}

/// Error counters of a provider for `/status` (`vm_pool.errors`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ProviderErrorStats {
    /// Errors so far.
    pub total: u64,
    /// Errors per `"<operation>.<kind>"`, e.g. `"run_instances.capacity": 2`.
    pub counts: BTreeMap<String, u64>,
    /// The most recent error.
    pub last: Option<LastProviderError>,
}

/// Thread-safe error recorder of one provider. See the [module docs](self).
#[derive(Debug)]
pub struct ProviderErrors {
    provider: &'static str,
    stats: Mutex<ProviderErrorStats>,
}

impl ProviderErrors {
    /// A recorder for `provider` (the `provider` label: `ec2`, `lambda`).
    pub fn new(provider: &'static str) -> Self {
        Self {
            provider,
            stats: Mutex::new(ProviderErrorStats::default()),
        }
    }

    /// Record one failed call: log it, count it in the metric and in the stats.
    pub fn record(&self, operation: &'static str, kind: ErrorKind, message: impl Display) {
        let message = message.to_string();
        tracing::warn!(
            provider = self.provider,
            operation,
            kind = kind.as_str(),
            error = %message,
            "provider API call failed"
        );
        crate::telemetry::provider_error(self.provider, operation, kind.as_str());
        // A wall-clock timestamp for `/status` readers, not a timer.
        #[allow(clippy::disallowed_methods)]
        let at_unix_seconds = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let mut s = self.stats.lock().unwrap_or_else(|p| p.into_inner());
        s.total += 1;
        *s.counts
            .entry(format!("{operation}.{}", kind.as_str()))
            .or_default() += 1;
        s.last = Some(LastProviderError {
            operation,
            kind,
            message,
            at_unix_seconds,
        });
    }

    /// A copy of the counters.
    pub fn snapshot(&self) -> ProviderErrorStats {
        self.stats.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_counts_and_last_error() {
        let e = ProviderErrors::new("ec2");
        assert_eq!(e.snapshot(), ProviderErrorStats::default());
        e.record("run_instances", ErrorKind::Capacity, "no capacity");
        e.record("run_instances", ErrorKind::Capacity, "still none");
        e.record("describe_instances", ErrorKind::Throttling, "slow down");
        let s = e.snapshot();
        assert_eq!(s.total, 3);
        assert_eq!(s.counts["run_instances.capacity"], 2);
        assert_eq!(s.counts["describe_instances.throttling"], 1);
        let last = s.last.unwrap();
        assert_eq!(
            (last.operation, last.kind, last.message.as_str()),
            ("describe_instances", ErrorKind::Throttling, "slow down")
        );
        let json = serde_json::to_value(e.snapshot()).unwrap();
        assert_eq!(json["last"]["kind"], "throttling");
    }

    #[test]
    fn transient_kinds() {
        assert!(ErrorKind::Throttling.is_transient());
        assert!(ErrorKind::Unreachable.is_transient());
        assert!(!ErrorKind::Capacity.is_transient());
        assert!(!ErrorKind::AccessDenied.is_transient());
        assert_eq!(ErrorKind::AccessDenied.as_str(), "access_denied");
    }
}
