//! The live driver on paused tokio time with fake backends: every policy deadline comes
//! from the core's timer table, and the driver's timer wakes when a call moves the next
//! deadline earlier than the one it sleeps on. No real process, no wall clock.
// The shared harness (tests/common) has wall-clock helpers for real-process tests.
#![allow(clippy::disallowed_methods)]

mod common;

use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response, Uri};
use http_body_util::BodyExt;
use spillway::backends::{
    BackendError, BoxFuture, FunctionError, FunctionTier, ReadinessSettings, VmProvider,
};
use spillway::net::body::{self, Body};
use spillway::policy::VmId;
use spillway::policy::balancer::VmFirst;
use spillway::policy::controller::ControllerParams;
use spillway::policy::core::{Core, CoreParams};
use spillway::policy::functions::{FunctionPoolParams, InstanceId, WarmOrder};
use spillway::policy::monitor::MonitorParams;
use spillway::policy::placement::{PlacementParams, ZoneCapacity};
use spillway::policy::scaling::{LibraScaler, LibraScalingParams};
use spillway::proxy::driver::Gateway;
use tokio::time::Instant;

use common::inproc::{NoVms, call_function, client, faas_core, gateway};

/// A function tier whose instances start after `cold` (tokio time) and answer at once.
/// It records when instances started and stopped.
struct FakeTier {
    cold: Duration,
    origin: Instant,
    log: Mutex<Vec<(Duration, &'static str, InstanceId)>>,
}

impl FakeTier {
    fn new(cold: Duration) -> Arc<Self> {
        Arc::new(Self {
            cold,
            origin: Instant::now(),
            log: Mutex::new(Vec::new()),
        })
    }

    fn events(&self, what: &str) -> Vec<(Duration, InstanceId)> {
        self.log
            .lock()
            .iter()
            .filter(|(_, w, _)| *w == what)
            .map(|(t, _, i)| (*t, *i))
            .collect()
    }

    fn record(&self, what: &'static str, i: InstanceId) {
        self.log.lock().push((self.origin.elapsed(), what, i));
    }
}

impl FunctionTier for FakeTier {
    fn kind(&self) -> &'static str {
        "fake"
    }
    fn start_instance(&self, instance: InstanceId) -> BoxFuture<'_, Result<(), BackendError>> {
        Box::pin(async move {
            tokio::time::sleep(self.cold).await;
            self.record("start", instance);
            Ok(())
        })
    }
    fn stop_instance(&self, instance: InstanceId) -> BoxFuture<'_, ()> {
        Box::pin(async move { self.record("stop", instance) })
    }
    fn invoke(
        &self,
        instance: Option<InstanceId>,
        _req: Request<Body>,
    ) -> BoxFuture<'_, Result<Response<Body>, FunctionError>> {
        Box::pin(async move {
            self.record("call", instance.expect("an instance zone"));
            Ok(Response::new(body::full("ok")))
        })
    }
    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

fn get() -> Request<Body> {
    Request::get("/").body(body::empty()).unwrap()
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Cold start, warm reuse and keep-alive expiry, all on the core's timers: the epoch is
/// a minute long, so the stop at `end of call + keep-alive` can only happen if the
/// call's end woke the driver's timer task.
#[tokio::test(start_paused = true)]
async fn keep_alive_expiry_wakes_the_driver_before_the_epoch_ends() {
    let tier = FakeTier::new(ms(400));
    let pool = FunctionPoolParams {
        keep_alive: ms(2_500),
        max_instances: Some(2),
        prewarmed: 0,
        warm_order: WarmOrder::Newest,
    };
    let gw = gateway(
        faas_core(Duration::from_secs(60), pool),
        Arc::new(NoVms),
        tier.clone(),
    )
    .await;
    let started = Instant::now();
    // A cold start (400 ms), then the body is read to its end at once.
    let resp = call_function(&gw, get()).await.unwrap();
    assert_eq!(started.elapsed(), ms(400));
    resp.into_body().collect().await.unwrap();
    // 1 s later a second call is warm on the same instance.
    tokio::time::sleep(ms(1_000)).await;
    let resp = call_function(&gw, get()).await.unwrap();
    resp.into_body().collect().await.unwrap();
    assert_eq!(tier.events("start").len(), 1, "warm reuse: no second start");
    let calls = tier.events("call");
    assert_eq!(calls[0].1, calls[1].1, "the same instance");
    // Its keep-alive runs out 2.5 s after the second call ended (t = 1.4 + 2.5 s).
    tokio::time::sleep(Duration::from_secs(10)).await;
    let stops = tier.events("stop");
    assert_eq!(
        stops,
        vec![(ms(3_900), calls[0].1)],
        "{:?}",
        tier.log.lock()
    );
    let z = &gw.status().core.zones[0];
    assert_eq!((z.idle, z.usage.unwrap().instances_expired), (0, 1));
}

/// Pre-warmed instances start with the gateway, serve warm, and never expire.
#[tokio::test(start_paused = true)]
async fn prewarmed_instances_serve_warm_and_are_kept() {
    let tier = FakeTier::new(ms(300));
    let pool = FunctionPoolParams {
        keep_alive: ms(200),
        max_instances: Some(4),
        prewarmed: 1,
        warm_order: WarmOrder::Newest,
    };
    let gw = gateway(
        faas_core(Duration::from_secs(60), pool),
        Arc::new(NoVms),
        tier.clone(),
    )
    .await;
    tokio::time::sleep(ms(500)).await;
    assert_eq!(tier.events("start"), vec![(ms(300), InstanceId(0))]);
    let (a, b) = tokio::join!(call_function(&gw, get()), call_function(&gw, get()));
    drop((a.unwrap(), b.unwrap()));
    let u = gw.status().core.zones[0].usage.unwrap();
    assert_eq!((u.warm_starts, u.cold_starts), (1, 1));
    tokio::time::sleep(Duration::from_secs(5)).await;
    let z = &gw.status().core.zones[0];
    assert_eq!(
        (z.idle, z.busy, z.starting),
        (1, 0, 0),
        "the pre-warmed count is kept"
    );
    assert_eq!(
        tier.events("stop").len(),
        1,
        "only the extra instance expired"
    );
}

/// FaaSim: a call that finds no idle instance takes the pre-warmed instance still booting
/// and waits for it; only the next call cold-starts. The pre-warm boots 0 → 1 s; two
/// calls at 250 ms: one answers when the pre-warm is ready (after 750 ms), the other after
/// its own 1 s cold start.
#[tokio::test(start_paused = true)]
async fn a_call_waits_for_a_booting_prewarmed_instance() {
    let cold = ms(1_000);
    let tier = FakeTier::new(cold);
    let pool = FunctionPoolParams {
        keep_alive: Duration::from_secs(60),
        max_instances: Some(3),
        prewarmed: 1,
        warm_order: WarmOrder::Newest,
    };
    let gw = gateway(
        faas_core(Duration::from_secs(60), pool),
        Arc::new(NoVms),
        tier.clone(),
    )
    .await;
    let arrive = ms(250);
    tokio::time::sleep(arrive).await;
    let t0 = Instant::now();
    let timed = || async {
        let r = call_function(&gw, get()).await.unwrap();
        let took = t0.elapsed();
        r.into_body().collect().await.unwrap();
        took
    };
    let (a, b) = tokio::join!(timed(), timed());
    let mut took = [a, b];
    took.sort();
    assert_eq!(took, [cold - arrive, cold], "{:?}", tier.log.lock());
    let u = gw.status().core.zones[0].usage.unwrap();
    assert_eq!((u.cold_starts, u.warm_starts, u.prewarm_waits), (1, 1, 1));
    let calls = tier.events("call");
    assert_eq!(calls[0], (cold, InstanceId(0)), "the pre-warm, once booted");
}

/// A VM provider whose instances never get an address: only the core's boot deadline
/// ends their boot. It records terminations.
#[derive(Default)]
struct NeverReady {
    terminated: Mutex<Vec<(Duration, String)>>,
    origin: Mutex<Option<Instant>>,
}

impl VmProvider for NeverReady {
    fn kind(&self) -> &'static str {
        "never-ready"
    }
    fn executes_scaling(&self) -> bool {
        true
    }
    fn adopt(&self) -> BoxFuture<'_, Result<Vec<(String, Uri)>, BackendError>> {
        *self.origin.lock() = Some(Instant::now());
        Box::pin(async { Ok(Vec::new()) })
    }
    fn launch(&self, vm: VmId, _term: Option<u64>) -> BoxFuture<'_, Result<String, BackendError>> {
        Box::pin(async move { Ok(format!("i-{}", vm.0)) })
    }
    fn resolve<'a>(&'a self, _i: &'a str) -> BoxFuture<'a, Result<Option<Uri>, BackendError>> {
        Box::pin(async { Ok(None) })
    }
    fn terminate<'a>(&'a self, instance: &'a str) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(async move {
            let origin = self.origin.lock().expect("adopt ran first");
            self.terminated
                .lock()
                .push((origin.elapsed(), instance.to_string()));
            Ok(())
        })
    }
    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

#[tokio::test(start_paused = true)]
async fn a_vm_that_never_boots_is_terminated_at_its_boot_deadline() {
    let params = CoreParams {
        controller: ControllerParams {
            monitor: MonitorParams {
                epoch: Duration::from_secs(30),
                alpha: 0.3,
                beta: 0.2,
                decision_epochs: 100,
                first_decision_epoch: None,
            },
            r_max_rps: 10.0,
            execute_scaling: true,
        },
        placement: PlacementParams::single(
            "cloud",
            ZoneCapacity::Concurrency {
                max_concurrency: None,
            },
        ),
        vm_boot_timeout: Some(ms(4_500)),
    };
    let scaler = LibraScaler::new(LibraScalingParams {
        phi: 1.5,
        r_max_rps: 10.0,
        min_vms: 1,
        max_vms: 2,
        cip_rps: 0.0,
    });
    let core = Core::new(params, Box::new(scaler), Box::new(VmFirst::new(0.7)));
    let vms = Arc::new(NeverReady::default());
    let gw = Gateway::new(
        core,
        vms.clone(),
        vec![FakeTier::new(ms(10))],
        client(),
        ReadinessSettings::new("/", Duration::from_secs(3600), Duration::from_millis(100)),
        0.0,
    );
    gw.start().await.unwrap();
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(
        *vms.terminated.lock(),
        vec![(ms(4_500), "i-0".to_string())],
        "terminated exactly at the core's boot deadline, once"
    );
    let pool = gw.status().core.controller.pool;
    assert_eq!((pool.booting, pool.ready), (0, 0));
}

/// A request dropped at any await point — here in the middle of its cold start, as when
/// the client goes away — gives its capacity back: the starting instance is forgotten
/// and stopped, and the zone (capped at one instance) takes the next call.
#[tokio::test(start_paused = true)]
async fn a_request_dropped_during_its_cold_start_leaks_nothing() {
    let tier = FakeTier::new(ms(1_000));
    let pool = FunctionPoolParams {
        keep_alive: Duration::from_secs(30),
        max_instances: Some(1),
        prewarmed: 0,
        warm_order: WarmOrder::Newest,
    };
    let gw = gateway(
        faas_core(Duration::from_secs(60), pool),
        Arc::new(NoVms),
        tier.clone(),
    )
    .await;
    let gw2 = Arc::clone(&gw);
    let abandoned = tokio::spawn(async move { call_function(&gw2, get()).await.map(|_| ()) });
    tokio::time::sleep(ms(300)).await;
    assert_eq!(gw.status().core.zones[0].starting, 1);
    abandoned.abort();
    assert!(abandoned.await.unwrap_err().is_cancelled());
    let z = &gw.status().core.zones[0];
    assert_eq!((z.starting, z.busy, z.idle), (0, 0, 0), "nothing leaked");
    tokio::time::sleep(ms(10)).await;
    assert_eq!(tier.events("stop"), vec![(ms(300), InstanceId(0))]);
    // The zone's one instance slot is free again: the next call cold-starts and answers.
    let resp = call_function(&gw, get())
        .await
        .expect("the slot was given back");
    resp.into_body().collect().await.unwrap();
    assert_eq!(gw.status().core.zones[0].usage.unwrap().cold_starts, 2);
}

/// Two function zones on paused time (FaaSim two-tier edge/cloud): an edge with
/// one pre-warmed instance (cold start 400 ms, keep-alive 1 s, at most 2) and a cloud
/// (cold start 700 ms, keep-alive 5 s). A cloud instance is made warm, then two calls
/// from the edge arrive together: both placements give the first the pre-warmed edge
/// instance; warm-first gives the second the warm cloud instance, edge-first a cold start
/// on the edge. Keep-alive expiries stop only the extra instances, each at its zone's
/// keep-alive after its call.
#[tokio::test(start_paused = true)]
async fn two_zones_place_by_policy_prewarm_per_zone_and_expire_per_zone() {
    use common::inproc::call_function_from;
    use spillway::policy::baselines::{FixedScaler, FunctionOnly};
    use spillway::policy::placement::{PlacementPolicy, ZoneId, ZoneKind, ZoneParams};

    for policy in [PlacementPolicy::WarmFirst, PlacementPolicy::EdgeFirst] {
        let (edge_cold, cloud_cold) = (ms(400), ms(700));
        let (edge_ka, cloud_ka) = (ms(1_000), ms(5_000));
        let zone = |name: &str, kind, keep_alive, max, prewarmed| ZoneParams {
            name: name.into(),
            kind,
            capacity: ZoneCapacity::Instances(FunctionPoolParams {
                keep_alive,
                max_instances: Some(max),
                prewarmed,
                warm_order: WarmOrder::Newest,
            }),
        };
        let params = CoreParams {
            controller: ControllerParams {
                monitor: MonitorParams {
                    epoch: Duration::from_secs(60),
                    alpha: 0.3,
                    beta: 0.2,
                    decision_epochs: 1,
                    first_decision_epoch: None,
                },
                r_max_rps: 10.0,
                execute_scaling: true,
            },
            placement: PlacementParams {
                zones: vec![
                    zone("edge-a", ZoneKind::Edge, edge_ka, 2, 1),
                    zone("cloud", ZoneKind::Cloud, cloud_ka, 4, 0),
                ],
                policy,
            },
            vm_boot_timeout: None,
        };
        let core = Core::new(
            params,
            Box::new(FixedScaler::faas()),
            Box::new(FunctionOnly),
        );
        let (edge, cloud) = (FakeTier::new(edge_cold), FakeTier::new(cloud_cold));
        let gw = Gateway::new(
            core,
            Arc::new(NoVms),
            vec![edge.clone(), cloud.clone()],
            client(),
            ReadinessSettings::new("/", Duration::from_secs(5), Duration::from_millis(50)),
            0.0,
        );
        gw.start().await.unwrap();
        tokio::time::sleep(ms(500)).await;
        assert_eq!(
            edge.events("start"),
            vec![(edge_cold, InstanceId(0))],
            "pre-warm"
        );
        assert!(cloud.events("start").is_empty(), "no pre-warm in the cloud");

        // No origin: the cloud, cold; its instance is warm from 0.5 s + 700 ms on.
        let resp = call_function_from(&gw, get(), None).await.unwrap();
        resp.into_body().collect().await.unwrap();
        let warm_since = ms(500) + cloud_cold;
        // Two calls from the edge at once.
        let from_edge = || call_function_from(&gw, get(), Some(ZoneId(0)));
        let (a, b) = tokio::join!(from_edge(), from_edge());
        for r in [a, b] {
            r.unwrap().into_body().collect().await.unwrap();
        }
        let done = Instant::now() - edge.origin;
        let st = gw.status().core.zones;
        let (e, c) = (st[0].usage.unwrap(), st[1].usage.unwrap());
        match policy {
            PlacementPolicy::WarmFirst => {
                assert_eq!((e.warm_starts, e.cold_starts), (1, 0), "{policy:?}");
                assert_eq!((c.warm_starts, c.cold_starts), (1, 1), "{policy:?}");
                assert_eq!(done, warm_since, "nobody waited for a cold start");
            }
            PlacementPolicy::EdgeFirst => {
                assert_eq!((e.warm_starts, e.cold_starts), (1, 1), "{policy:?}");
                assert_eq!((c.warm_starts, c.cold_starts), (0, 1), "{policy:?}");
                assert_eq!(done, warm_since + edge_cold, "the edge cold start");
            }
        }
        tokio::time::sleep(Duration::from_secs(10)).await;
        // The cloud instance expires its keep-alive after its last call (at `warm_since`
        // either way: warm-first's call there took no time); on the edge only the
        // cold-started instance (edge-first) expires, the pre-warmed one is kept.
        let cloud_stops: Vec<_> = cloud.events("stop").into_iter().map(|(t, _)| t).collect();
        assert_eq!(cloud_stops, vec![warm_since + cloud_ka], "{policy:?}");
        let edge_stops: Vec<_> = edge.events("stop").into_iter().map(|(t, _)| t).collect();
        let want = match policy {
            PlacementPolicy::WarmFirst => vec![],
            PlacementPolicy::EdgeFirst => vec![done + edge_ka],
        };
        assert_eq!(edge_stops, want, "{policy:?}");
        assert_eq!(
            gw.status().core.zones[0].idle,
            1,
            "the pre-warmed count is kept"
        );
    }
}
