//! Error accounting for cloud providers: failures are handled, logged and
//! visible in `/status` and metrics.
//!
//! A provider owns one [`ProviderErrors`] and calls [`ProviderErrors::record`] for every
//! failed API call. Each record is logged (`warn`), counted in
//! `spillway_provider_errors_total{provider, operation, kind}` (see
//! [`crate::telemetry`]) and kept for `/status` as per-`operation.kind` counters plus
//! the last error's message. Label values come from fixed sets: `operation` is a
//! provider-defined `&'static str` (`run_instances`, …) and `kind` an [`ErrorKind`].
//!
//! Besides single failures a provider has **standing conditions**: a state that lasts
//! until something changes, such as "every launch is denied by
//! IAM" or "provisioned concurrency is READY". [`ProviderErrors::set_condition`] records
//! one (logged once per state change, at `error` level when it is an alarm),
//! [`ProviderErrors::clear_condition`] ends it; `/status` shows them under
//! `<section>.errors.conditions.<name>` with `alarm: true` for those an operator must act
//! on.

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::fmt::Display;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

/// What kind of failure an API call had; the `kind` label of
/// `spillway_provider_errors_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// No capacity where the request asked for it (EC2 `InsufficientInstanceCapacity`,
    /// an instance type not offered in the subnet's zone, a subnet out of addresses):
    /// another subnet may have some.
    Capacity,
    /// An account quota is used up (EC2 `InstanceLimitExceeded`, `VcpuLimitExceeded`):
    /// no subnet helps until the quota is raised or instances end.
    Quota,
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
            Self::Quota => "quota",
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

/// A standing condition of a provider (see the [module docs](self)), as `/status` shows
/// it: `{"state": "denied", "alarm": true, "reason": "…", "since_unix_seconds": …,
/// "detail": {…}}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ProviderCondition {
    /// Short state name (`denied`, `IN_PROGRESS`, `READY`, `FAILED`, …).
    pub state: String,
    /// Whether an operator must act: the pool or tier cannot work as configured.
    pub alarm: bool,
    /// Why, in the provider's words (an API error message, a `StatusReason`).
    pub reason: Option<String>,
    /// When the condition entered this state, seconds since the Unix epoch.
    pub since_unix_seconds: u64,
    /// Provider-specific numbers and names (e.g. requested and allocated executions).
    #[serde(skip_serializing_if = "serde_json::Map::is_empty")]
    pub detail: serde_json::Map<String, serde_json::Value>,
}

/// Error counters of a provider for `/status` (`vm_pool.errors`, `functions.errors`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ProviderErrorStats {
    /// Errors so far.
    pub total: u64,
    /// Errors per `"<operation>.<kind>"`, e.g. `"run_instances.capacity": 2`.
    pub counts: BTreeMap<String, u64>,
    /// The most recent error.
    pub last: Option<LastProviderError>,
    /// Standing conditions by name (`launch`, `provisioned_concurrency`, …).
    pub conditions: BTreeMap<String, ProviderCondition>,
}

impl ProviderErrorStats {
    /// Names of the conditions that are alarms, sorted.
    pub fn alarms(&self) -> Vec<&str> {
        self.conditions
            .iter()
            .filter(|(_, c)| c.alarm)
            .map(|(n, _)| n.as_str())
            .collect()
    }
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
        let at_unix_seconds = unix_seconds();
        let mut s = self.lock();
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

    /// Set the standing condition `name` to `state` (see the [module docs](self)). A
    /// change of state or alarm is logged and restarts `since_unix_seconds`; the same
    /// state again only updates `reason` and `detail`.
    pub fn set_condition(
        &self,
        name: &str,
        state: &str,
        alarm: bool,
        reason: Option<String>,
        detail: serde_json::Map<String, serde_json::Value>,
    ) {
        let mut s = self.lock();
        let changed = s
            .conditions
            .get(name)
            .is_none_or(|c| c.state != state || c.alarm != alarm);
        if changed {
            let why = reason.as_deref().unwrap_or("-");
            if alarm {
                tracing::error!(
                    provider = self.provider,
                    condition = name,
                    state,
                    reason = why,
                    "provider alarm"
                );
            } else {
                tracing::info!(
                    provider = self.provider,
                    condition = name,
                    state,
                    reason = why,
                    "provider condition"
                );
            }
        }
        let since_unix_seconds = match s.conditions.get(name) {
            Some(c) if !changed => c.since_unix_seconds,
            _ => unix_seconds(),
        };
        s.conditions.insert(
            name.to_owned(),
            ProviderCondition {
                state: state.to_owned(),
                alarm,
                reason,
                since_unix_seconds,
                detail,
            },
        );
    }

    /// End the standing condition `name` (logged when it was an alarm).
    pub fn clear_condition(&self, name: &str) {
        if let Some(c) = self.lock().conditions.remove(name)
            && c.alarm
        {
            tracing::info!(provider = self.provider, condition = name, was = %c.state, "provider alarm cleared");
        }
    }

    /// A copy of the counters.
    pub fn snapshot(&self) -> ProviderErrorStats {
        self.lock().clone()
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, ProviderErrorStats> {
        self.stats.lock()
    }
}

/// Wall-clock seconds since the Unix epoch, for `/status` readers (not a timer).
fn unix_seconds() -> u64 {
    #[allow(clippy::disallowed_methods)]
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
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
    fn conditions_keep_their_start_until_the_state_changes() {
        let e = ProviderErrors::new("lambda");
        e.set_condition("pc", "IN_PROGRESS", false, None, serde_json::Map::new());
        let first = e.snapshot().conditions["pc"].since_unix_seconds;
        e.set_condition(
            "pc",
            "IN_PROGRESS",
            false,
            Some("allocating".into()),
            serde_json::Map::new(),
        );
        let s = e.snapshot();
        assert_eq!(s.conditions["pc"].since_unix_seconds, first);
        assert_eq!(s.conditions["pc"].reason.as_deref(), Some("allocating"));
        assert!(s.alarms().is_empty());
        e.set_condition(
            "launch",
            "denied",
            true,
            Some("no".into()),
            serde_json::Map::new(),
        );
        assert_eq!(e.snapshot().alarms(), ["launch"]);
        let json = serde_json::to_value(e.snapshot()).unwrap();
        assert_eq!(json["conditions"]["launch"]["alarm"], true);
        assert_eq!(json["conditions"]["launch"]["state"], "denied");
        assert!(json["conditions"]["pc"].get("detail").is_none());
        e.clear_condition("launch");
        assert!(e.snapshot().alarms().is_empty());
        assert_eq!(e.snapshot().total, 0, "conditions are not errors");
    }

    #[test]
    fn transient_kinds() {
        assert!(ErrorKind::Throttling.is_transient());
        assert!(ErrorKind::Unreachable.is_transient());
        assert!(!ErrorKind::Capacity.is_transient());
        assert!(!ErrorKind::Quota.is_transient());
        assert!(!ErrorKind::AccessDenied.is_transient());
        assert_eq!(ErrorKind::AccessDenied.as_str(), "access_denied");
    }
}
