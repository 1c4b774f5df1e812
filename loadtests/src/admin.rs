//! Snapshots of the gateway's admin `GET /status` endpoint.
//!
//! Only the fields the report needs are read: the cumulative `routed.vm` and
//! `routed.function` counters (per-interval shares come from differences between
//! snapshots) and `scaling.ready_vms`. Other fields are ignored, so the endpoint
//! may grow without breaking the load test.

use std::time::Duration;

use anyhow::{Context, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Uri;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::Value;

/// How long one `/status` request may take before the snapshot counts as missing.
pub(crate) const STATUS_TIMEOUT: Duration = Duration::from_secs(2);

/// The parts of a `/status` response the report uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct AdminSnapshot {
    /// Cumulative attempts routed to VMs.
    pub routed_vm: u64,
    /// Cumulative attempts routed to the function tier.
    pub routed_function: u64,
    /// VMs ready at the time of the snapshot, if reported.
    pub ready_vms: Option<u64>,
    /// Asynchronous calls (`async` in `/status`, ProFaaStinate): calls queued so far,
    /// calls released so far, calls waiting now.
    pub async_calls: Option<(u64, u64, u64)>,
}

impl AdminSnapshot {
    /// Extract a snapshot from a `/status` JSON document.
    pub(crate) fn from_json(doc: &Value) -> anyhow::Result<Self> {
        let counter = |ptr: &str| {
            doc.pointer(ptr)
                .and_then(Value::as_u64)
                .with_context(|| format!("/status has no non-negative integer at {ptr}"))
        };
        Ok(Self {
            routed_vm: counter("/routed/vm")?,
            routed_function: counter("/routed/function")?,
            ready_vms: doc.pointer("/scaling/ready_vms").and_then(Value::as_u64),
            async_calls: doc.pointer("/async").filter(|a| !a.is_null()).map(|a| {
                let released = a
                    .pointer("/released")
                    .and_then(Value::as_array)
                    .map_or(0, |rows| {
                        rows.iter()
                            .filter_map(|r| r.pointer("/calls").and_then(Value::as_u64))
                            .sum()
                    });
                (
                    a.pointer("/queued_total")
                        .and_then(Value::as_u64)
                        .unwrap_or(0),
                    released,
                    a.pointer("/queued").and_then(Value::as_u64).unwrap_or(0),
                )
            }),
        })
    }
}

/// Routing shares between two snapshots, as fractions in `[0, 1]`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Shares {
    /// Share of attempts routed to VMs.
    pub vm: f64,
    /// Share of attempts routed to the function tier.
    pub function: f64,
}

/// Shares of the attempts routed between `before` and `after`; `None` when
/// nothing was routed or the counters went backwards (gateway restarted).
pub(crate) fn shares(before: &AdminSnapshot, after: &AdminSnapshot) -> Option<Shares> {
    let vm = after.routed_vm.checked_sub(before.routed_vm)?;
    let function = after.routed_function.checked_sub(before.routed_function)?;
    let total = vm + function;
    (total > 0).then(|| Shares {
        vm: vm as f64 / total as f64,
        function: function as f64 / total as f64,
    })
}

/// The HTTP client type shared by the load and the admin requests.
pub(crate) type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// Fetch one snapshot from `status_url`, bounded by [`STATUS_TIMEOUT`], with
/// `Authorization: Bearer TOKEN` when a token is given.
pub(crate) async fn fetch(
    client: &HttpClient,
    status_url: &Uri,
    token: Option<&str>,
) -> anyhow::Result<AdminSnapshot> {
    let mut request = hyper::Request::get(status_url.clone());
    if let Some(token) = token {
        request = request.header(hyper::header::AUTHORIZATION, format!("Bearer {token}"));
    }
    let request = request.body(Full::new(Bytes::new()))?;
    let body = tokio::time::timeout(STATUS_TIMEOUT, async {
        let response = client.request(request).await?;
        let status = response.status();
        let body = response.into_body().collect().await?.to_bytes();
        if !status.is_success() {
            bail!("{status_url} answered {status}");
        }
        anyhow::Ok(body)
    })
    .await
    .with_context(|| format!("{status_url} did not answer within {STATUS_TIMEOUT:?}"))??;
    let doc: Value = serde_json::from_slice(&body)
        .with_context(|| format!("{status_url} did not return JSON"))?;
    AdminSnapshot::from_json(&doc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn status(vm: u64, function: u64, ready: u64) -> Value {
        json!({
            "epoch": 3,
            "traffic": {"last_epoch_requests": 40, "avg_rps": 10.5, "mean_abs_deviation_rps": 1.25},
            "scaling": {"vm_reqs_rps": 8.0, "target_vms": 2, "ready_vms": ready},
            "routed": {"vm": vm, "function": function, "rejected": 0},
        })
    }

    #[test]
    fn parses_the_documented_shape() {
        let snap = AdminSnapshot::from_json(&status(30, 10, 2)).unwrap();
        assert_eq!(
            snap,
            AdminSnapshot {
                routed_vm: 30,
                routed_function: 10,
                ready_vms: Some(2),
                async_calls: None,
            }
        );
    }

    #[test]
    fn ready_vms_is_optional_but_routed_is_not() {
        let snap = AdminSnapshot::from_json(&json!({"routed": {"vm": 1, "function": 2}})).unwrap();
        assert_eq!(snap.ready_vms, None);
        let snap = AdminSnapshot::from_json(&json!({
            "routed": {"vm": 1, "function": 2},
            "async": {"queued": 4, "queued_total": 9, "released": [
                {"kind": "idle", "tier": "vm", "calls": 3},
                {"kind": "forced", "tier": "function", "calls": 2}]}
        }))
        .unwrap();
        assert_eq!(snap.async_calls, Some((9, 5, 4)));
        let err = AdminSnapshot::from_json(&json!({"routed": {"vm": 1}})).unwrap_err();
        assert!(err.to_string().contains("/routed/function"), "{err}");
    }

    #[test]
    fn shares_come_from_differences() {
        let a = AdminSnapshot::from_json(&status(100, 50, 1)).unwrap();
        let b = AdminSnapshot::from_json(&status(130, 60, 2)).unwrap();
        assert_eq!(
            shares(&a, &b),
            Some(Shares {
                vm: 0.75,
                function: 0.25
            })
        );
        assert_eq!(shares(&a, &a), None);
        assert_eq!(shares(&b, &a), None);
    }
}
