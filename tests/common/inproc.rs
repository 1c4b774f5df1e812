//! In-process drivers: the live [`Gateway`] driver built from parts, without listeners,
//! for tests of the driver itself (paused tokio time, fake or local backends).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response, Uri};
use spillway::backends::{BackendError, BoxFuture, FunctionTier, ReadinessSettings, VmProvider};
use spillway::config::Config;
use spillway::net::body::Body;
use spillway::net::client::{ClientSettings, UpstreamClient};
use spillway::policy::VmId;
use spillway::policy::attempt::{Decision, Ticket};
use spillway::policy::balancer::RequestMeta;
use spillway::policy::baselines::{FixedScaler, FunctionOnly};
use spillway::policy::controller::ControllerParams;
use spillway::policy::core::{Core, CoreParams};
use spillway::policy::functions::FunctionPoolParams;
use spillway::policy::monitor::MonitorParams;
use spillway::policy::placement::{PlacementParams, ZoneCapacity, ZoneId};
use spillway::proxy::driver::{Gateway, TicketGuard};
use spillway::proxy::service::{self, Attempt, ServiceSettings, Step};

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
    fn launch(&self, _vm: VmId, _term: Option<u64>) -> BoxFuture<'_, Result<String, BackendError>> {
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
/// runs it ([`service::try_function`] for every function decision): first decision, cold
/// start when the lease says so, invoke, a re-placement when the instance is gone. The
/// response body holds the call's lease until it ends or is dropped; the ticket's guard
/// gives everything back if the future is dropped.
pub(crate) async fn call_function(
    gw: &Arc<Gateway>,
    req: Request<Body>,
) -> Result<Response<Body>, String> {
    call_function_from(gw, req, None).await
}

/// [`call_function`] for a request whose origin is edge zone `origin` (function zones).
pub(crate) async fn call_function_from(
    gw: &Arc<Gateway>,
    req: Request<Body>,
    origin: Option<ZoneId>,
) -> Result<Response<Body>, String> {
    let mut settings = ServiceSettings::from_config(&Config::default());
    // The tests advance paused time by minutes while a call or its response body is
    // held: no upstream or body-idle timeout of the request path may end it first.
    settings.upstream_timeout = Duration::from_secs(86_400);
    settings.response_body_idle_timeout = Duration::from_secs(86_400);
    let mut ticket = TicketGuard::new(gw, Ticket::new(RequestMeta::default(), origin));
    let at = Attempt::new(
        &ticket,
        SocketAddr::from(([127, 0, 0, 1], 0)),
        "http",
        false,
    );
    let (mut decision, _) = ticket.route();
    let mut req = Some(req);
    loop {
        let Decision::Function { lease, .. } = decision else {
            return Err(format!("not a function decision: {decision:?}"));
        };
        let request = req
            .take()
            .ok_or("the request was sent and cannot be sent again")?;
        match service::try_function(gw, &settings, &mut ticket, &at, lease, request).await {
            Step::Done(Ok((_, resp))) => return Ok(resp),
            Step::Done(Err((_, e))) => return Err(e.to_string()),
            Step::Next {
                decision: next,
                request,
                ..
            } => {
                decision = next;
                req = request.map(|r| *r);
            }
        }
    }
}
