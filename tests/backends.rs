//! The local backends running the real sample API (`spillway sample-api`), as the
//! quickstart configures them, driven by the live driver where the policy core decides
//! (function instances: cold/warm starts, keep-alive). Everything listens on 127.0.0.1.
// The shared harness (tests/common) measures real processes with wall-clock deadlines.
#![allow(clippy::disallowed_methods)]

mod common;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use http::Request;
use http_body_util::BodyExt;
use spillway::backends::VmProvider;
use spillway::backends::function_process::ProcessFunctionTier;
use spillway::backends::vm_process::ProcessVmPool;
use spillway::config::{ProcessFunctionTierConfig, ProcessVmPoolConfig};
use spillway::net::body::{Body, empty};
use spillway::net::client::{ClientSettings, UpstreamClient};
use spillway::policy::VmId;
use spillway::proxy::driver::Gateway;
use tokio::time::Instant;

use common::inproc::{NoVms, call_function, faas_core, gateway};

fn exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_spillway"))
}

fn command(name: &str) -> Vec<String> {
    [
        "{spillway}",
        "sample-api",
        "--listen",
        "127.0.0.1:{port}",
        "--name",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([format!("{name}-{{port}}")])
    .collect()
}

fn client() -> UpstreamClient {
    UpstreamClient::new(ClientSettings {
        connect_timeout: Duration::from_secs(1),
        idle_timeout: Duration::from_secs(5),
    })
}

fn get(path: &str) -> Request<Body> {
    Request::get(path).body(empty()).unwrap()
}

/// Poll `cond` every 20 ms until it holds, failing after 20 s.
async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn call(gw: &Arc<Gateway>, path: &str) -> String {
    let resp = call_function(gw, get(path)).await.unwrap();
    assert!(resp.status().is_success(), "{}", resp.status());
    let instance = resp.headers()["x-spillway-instance"]
        .to_str()
        .unwrap()
        .to_string();
    resp.into_body().collect().await.unwrap();
    instance
}

/// (instances alive, idle, cold starts, warm starts) of the one zone.
fn zone(gw: &Gateway) -> (u32, u32, u64, u64) {
    let z = &gw.status().core.zones[0];
    let u = z.usage.unwrap();
    (
        z.starting + z.busy + z.idle,
        z.idle,
        u.cold_starts,
        u.warm_starts,
    )
}

async fn function_gateway(
    cfg: &ProcessFunctionTierConfig,
) -> (Arc<Gateway>, Arc<ProcessFunctionTier>) {
    let tier: Arc<ProcessFunctionTier> = ProcessFunctionTier::new(cfg, exe(), client());
    let core = faas_core(Duration::from_secs(3600), cfg.pool_params());
    let gw = gateway(core, Arc::new(NoVms), tier.clone()).await;
    (gw, tier)
}

#[tokio::test]
async fn process_function_tier_runs_the_sample_api() {
    let cfg = ProcessFunctionTierConfig {
        command: Some(command("fn")),
        health_path: "/".into(),
        // Generous: the two instances must still be idle when the zone is read
        // and the third call must find one warm, on a loaded 2-core machine; the expiry
        // itself is awaited with a polling deadline (`eventually`, 20 s).
        keep_alive_seconds: spillway::config::Seconds::from_secs(4),
        max_instances: std::num::NonZeroU32::new(2).unwrap(),
        prewarmed_instances: 0,
        warm_instance_order: Default::default(),
        boot_timeout_seconds: spillway::config::Seconds::from_secs(20),
        probe_interval_seconds: spillway::config::Seconds::from_millis(50),
    };
    let (gw, tier) = function_gateway(&cfg).await;

    // Two overlapping slow calls: one instance each.
    let (a, b) = tokio::join!(call(&gw, "/sleep?ms=300"), call(&gw, "/sleep?ms=300"));
    assert_ne!(a, b);
    assert_eq!(zone(&gw), (2, 2, 2, 0));
    assert_eq!(tier.pids().len(), 2);

    // The next call is warm, on one of them.
    let c = call(&gw, "/").await;
    assert!(c == a || c == b, "{c} not in {a}, {b}");
    assert_eq!(zone(&gw).3, 1);

    // Keep-alive expiry (the core's timer; the epoch is an hour) stops both processes.
    eventually("idle instances expired", || zone(&gw).0 == 0).await;
    eventually("their processes stopped", || tier.pids().is_empty()).await;
    gw.shutdown_backends().await;
}

#[tokio::test]
async fn process_vm_pool_runs_the_sample_api() {
    let cfg = ProcessVmPoolConfig {
        command: command("vm"),
        health_path: "/".into(),
        boot_timeout_seconds: spillway::config::Seconds::from_secs(20),
        probe_interval_seconds: spillway::config::Seconds::from_millis(50),
        slots_per_vm: None,
    };
    let pool = ProcessVmPool::new(&cfg, exe());
    let name = pool.launch(VmId(1), None).await.unwrap();
    let base = pool
        .resolve(&name)
        .await
        .unwrap()
        .expect("a process has an address at once");
    let client = client();
    let deadline = Instant::now() + pool.readiness().boot_timeout;
    while !client.probe(&base, &pool.readiness().health_path).await {
        assert!(Instant::now() < deadline, "{name} never became ready");
        tokio::time::sleep(pool.readiness().probe_interval).await;
    }
    let resp = client.forward(&base, get("/")).await.unwrap();
    let port = base.port_u16().unwrap();
    assert_eq!(
        resp.headers()["x-spillway-instance"],
        format!("vm-{port}").as_str()
    );
    drop(resp);
    pool.terminate(&name).await.unwrap();
    assert!(pool.is_empty());
    assert!(!client.probe(&base, "/").await, "stopped");
}

#[tokio::test]
async fn an_abandoned_function_call_stops_its_instance_instead_of_reusing_it() {
    let cfg = ProcessFunctionTierConfig {
        command: Some(command("fn")),
        health_path: "/".into(),
        keep_alive_seconds: spillway::config::Seconds::from_secs(60),
        max_instances: std::num::NonZeroU32::new(4).unwrap(),
        prewarmed_instances: 0,
        warm_instance_order: Default::default(),
        boot_timeout_seconds: spillway::config::Seconds::from_secs(20),
        probe_interval_seconds: spillway::config::Seconds::from_millis(50),
    };
    let (gw, tier) = function_gateway(&cfg).await;
    let first = call(&gw, "/").await;
    // The gateway's upstream timeout drops the call while the instance still works on it;
    // the request path then tells the driver the instance is lost.
    let mut ticket = spillway::policy::attempt::Ticket::new(Default::default(), None);
    let (decision, _) = gw.route(&mut ticket);
    let spillway::policy::attempt::Decision::Function { lease, .. } = decision else {
        panic!("{decision:?}")
    };
    let instance = lease.instance().unwrap();
    let abandoned = tokio::time::timeout(
        Duration::from_millis(300),
        spillway::backends::FunctionTier::invoke(&*tier, Some(instance), get("/sleep?ms=5000")),
    )
    .await;
    assert!(abandoned.is_err(), "the call should have been cut off");
    gw.instance_lost(lease.zone, instance);
    eventually("the abandoned instance is gone", || {
        zone(&gw).0 == 0 && tier.pids().is_empty()
    })
    .await;
    // The next call does not land on the busy instance: it cold-starts a new one.
    let next = call(&gw, "/").await;
    assert_ne!(next, first);
    assert_eq!(zone(&gw).2, 2);
    gw.shutdown_backends().await;
}
