//! The gateway's status snapshot: the policy core's own snapshot (controller, scaling,
//! zones), the last scaling decision (LIBRA §III-B, Algorithm 1) and every VM with its
//! address — what `/status` renders ([`crate::proxy::admin`]).
//!
//! Taken under the driver's one lock, from the core and the VM address book at once,
//! so that a VM's state and its address belong to the same instant.

use http::Uri;

use super::vm_book::VmBook;
use crate::policy::balancer::VmState;
use crate::policy::core::{Core, CoreStatus};
use crate::policy::scaling::ScaleDecision;

/// One VM in `/status`.
#[derive(Clone, Debug, serde::Serialize)]
pub struct VmView {
    /// Controller id (`vm-3`).
    pub id: String,
    /// `booting`, `ready`, `draining`, or `dead`: a member of a `static` pool that failed
    /// its probes, probed on and back in the pool once it answers.
    pub state: &'static str,
    /// Requests in flight on it.
    pub outstanding: u32,
    /// Provider-side name.
    pub instance: Option<String>,
    /// Base URL once resolved.
    pub url: Option<String>,
    /// A `dead` member: since when, seconds since the Unix epoch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dead_since_unix_seconds: Option<u64>,
    /// A `dead` member: why it left the pool.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<&'static str>,
}

/// What `/status` shows.
#[derive(Clone, Debug)]
pub struct GatewayStatus {
    /// The policy core's snapshot (controller and zones).
    pub core: CoreStatus,
    /// The last scaling decision and the epoch that triggered it.
    pub last_decision: Option<(u64, ScaleDecision)>,
    /// Every VM.
    pub vms: Vec<VmView>,
}

impl GatewayStatus {
    /// The snapshot of `core`, its VMs' addresses in `book` (the parked `static` members
    /// as `dead`) and the last scaling decision.
    pub(super) fn of(
        core: &Core,
        book: &VmBook,
        last_decision: Option<(u64, ScaleDecision)>,
    ) -> Self {
        let vms = core
            .controller()
            .vms()
            .rows()
            .iter()
            .map(|r| VmView {
                id: r.id.to_string(),
                state: match r.state {
                    VmState::Booting => "booting",
                    VmState::Ready => "ready",
                    VmState::Draining => "draining",
                },
                outstanding: r.outstanding,
                instance: book.record(r.id).and_then(|x| x.instance.clone()),
                url: book
                    .record(r.id)
                    .and_then(|x| x.base.as_ref().map(redact_userinfo)),
                dead_since_unix_seconds: None,
                last_error: None,
            })
            .chain(book.parked().iter().map(|p| VmView {
                id: p.id.clone(),
                state: "dead",
                outstanding: 0,
                instance: Some(p.instance.clone()),
                url: Some(redact_userinfo(&p.base)),
                dead_since_unix_seconds: Some(p.since_unix_seconds),
                last_error: Some(p.last_error),
            }))
            .collect();
        GatewayStatus {
            core: core.status(),
            last_decision,
            vms,
        }
    }
}

/// `uri` as text without its userinfo (`http://user:pass@host` → `http://***@host`):
/// `/status` never shows credentials.
fn redact_userinfo(uri: &Uri) -> String {
    let text = uri.to_string();
    match uri.authority().map(|a| a.as_str()) {
        Some(auth) if auth.contains('@') => {
            let host = auth.rsplit_once('@').map_or(auth, |(_, h)| h);
            text.replacen(auth, &format!("***@{host}"), 1)
        }
        _ => text,
    }
}
