//! In-process drivers: the live [`Gateway`] driver built from parts, without listeners,
//! for tests of the driver itself (paused tokio time, fake or local backends).

use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response, Uri};
use spillway::backends::{
    BackendError, BoxFuture, FunctionError, FunctionTier, ReadinessSettings, VmProvider,
};
use spillway::net::body::{self, Body, GuardedBody, OnDrop};
use spillway::net::client::{ClientSettings, UpstreamClient};
use spillway::policy::VmId;
use spillway::policy::attempt::{Decision, Failure, NotSentReason, Ticket};
use spillway::policy::balancer::RequestMeta;
use spillway::policy::baselines::{FixedScaler, FunctionOnly};
use spillway::policy::controller::ControllerParams;
use spillway::policy::core::{Core, CoreParams};
use spillway::policy::functions::FunctionPoolParams;
use spillway::policy::monitor::MonitorParams;
use spillway::policy::placement::{PlacementParams, Start, ZoneCapacity, ZoneId};
use spillway::proxy::driver::{Gateway, TicketGuard};

/// A VM pool with no VM (FAAS): launches fail, nothing to adopt.
pub(crate) struct NoVms;

impl VmProvider for NoVms {
    fn kind(&self) -> &'static str {
        "none"
    }
    fn executes_scaling(&self) -> bool {
        true
    }
    fn adopt(&self) -> BoxFuture<'_, Result<Vec<(String, Uri)>, BackendError>> {
        Box::pin(async { Ok(Vec::new()) })
    }
    fn launch(&self, _vm: VmId) -> BoxFuture<'_, Result<String, BackendError>> {
        Box::pin(async { Err(BackendError::Provider("no VMs here".into())) })
    }
    fn resolve<'a>(
        &'a self,
        _instance: &'a str,
    ) -> BoxFuture<'a, Result<Option<Uri>, BackendError>> {
        Box::pin(async { Ok(None) })
    }
    fn terminate<'a>(&'a self, _instance: &'a str) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(async { Ok(()) })
    }
    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

/// A FAAS core (no VM, every request to the one function zone) with an epoch of
/// `epoch`, and the zone's keep-alive, cap and pre-warm.
pub(crate) fn faas_core(epoch: Duration, pool: FunctionPoolParams) -> Core {
    let params = CoreParams {
        controller: ControllerParams {
            monitor: MonitorParams {
                epoch,
                alpha: 0.3,
                beta: 0.2,
                decision_epochs: 1,
                first_decision_epoch: None,
            },
            r_max_rps: 10.0,
            execute_scaling: true,
        },
        placement: PlacementParams::single("cloud", ZoneCapacity::Instances(pool)),
        vm_boot_timeout: None,
    };
    Core::new(
        params,
        Box::new(FixedScaler::faas()),
        Box::new(FunctionOnly),
    )
}

/// A loopback upstream client with short timeouts.
pub(crate) fn client() -> UpstreamClient {
    UpstreamClient::new(ClientSettings {
        connect_timeout: Duration::from_secs(1),
        idle_timeout: Duration::from_secs(5),
    })
}

/// A started gateway around `core`, `vms` and one function zone `zone`.
pub(crate) async fn gateway(
    core: Core,
    vms: Arc<dyn VmProvider>,
    zone: Arc<dyn FunctionTier>,
) -> Arc<Gateway> {
    let gw = Gateway::new(
        core,
        vms,
        vec![zone],
        client(),
        ReadinessSettings::new("/", Duration::from_secs(5), Duration::from_millis(50)),
        0.0,
    );
    gw.start().await.expect("gateway starts");
    gw
}

/// One request through the function path of the attempt protocol, as the request path
/// runs it: first decision, cold start when the lease says so, invoke, a re-placement
/// when the instance is gone. The response body holds the call's lease until it ends or
/// is dropped; the ticket's guard gives everything back if the future is dropped.
pub(crate) async fn call_function(
    gw: &Arc<Gateway>,
    req: Request<Body>,
) -> Result<Response<Body>, String> {
    call_function_from(gw, req, None).await
}

/// [`call_function`] for a request whose origin is edge zone `origin` (function zones).
pub(crate) async fn call_function_from(
    gw: &Arc<Gateway>,
    mut req: Request<Body>,
    origin: Option<ZoneId>,
) -> Result<Response<Body>, String> {
    let mut ticket = TicketGuard::new(gw, Ticket::new(RequestMeta::default(), origin));
    let (mut decision, _) = ticket.route();
    loop {
        let Decision::Function { lease, .. } = decision else {
            return Err(format!("not a function decision: {decision:?}"));
        };
        let started = match lease.start {
            Start::Cold(instance) => ticket
                .cold_start(lease.zone, instance)
                .await
                .map_err(|e| e.to_string()),
            // A booting pre-warmed instance: wait for it, as the service does.
            Start::Booting(instance) => {
                if ticket.await_booting(lease.zone, instance).await {
                    Ok(())
                } else {
                    Err("pre-warmed instance failed to start".to_string())
                }
            }
            Start::Warm(_) | Start::Untracked => Ok(()),
        };
        if let Err(e) = started {
            let failure = Failure::NotSent {
                reason: NotSentReason::ColdStartFailed,
                request_available: true,
            };
            match ticket.attempt_failed(failure) {
                Some((d, _)) => {
                    decision = d;
                    continue;
                }
                None => return Err(format!("cold start failed: {e}")),
            }
        }
        match gw
            .zone_backend(lease.zone)
            .invoke(lease.instance(), req)
            .await
        {
            Ok(resp) => {
                let gw2 = Arc::clone(gw);
                ticket.hand_over();
                let done = OnDrop::new(move || gw2.finish_function(lease));
                return Ok(resp.map(|b| body::boxed(GuardedBody::new(b, done))));
            }
            Err(FunctionError::NotSent {
                reason,
                request: Some(back),
            }) => {
                req = *back;
                let failure = Failure::NotSent {
                    reason,
                    request_available: true,
                };
                match ticket.attempt_failed(failure) {
                    Some((d, _)) => decision = d,
                    None => return Err(format!("not sent: {}", reason.as_str())),
                }
            }
            Err(e) => return Err(e.to_string()),
        }
    }
}
