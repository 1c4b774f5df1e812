//! The local backends running the real sample API (`spillway sample-api`), as the
//! quickstart configures them. Everything listens on 127.0.0.1.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use http::Request;
use http_body_util::BodyExt;
use spillway::backends::function_process::ProcessFunctionTier;
use spillway::backends::vm_process::ProcessVmPool;
use spillway::backends::{FunctionTier, VmProvider};
use spillway::config::{ProcessFunctionTierConfig, ProcessVmPoolConfig};
use spillway::net::body::{Body, empty};
use spillway::net::client::{ClientSettings, UpstreamClient};
use spillway::policy::VmId;
use tokio::time::Instant;

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

async fn call(tier: &dyn FunctionTier, path: &str) -> String {
    let resp = tier.invoke(get(path)).await.unwrap();
    assert!(resp.status().is_success(), "{}", resp.status());
    let instance = resp.headers()["x-spillway-instance"]
        .to_str()
        .unwrap()
        .to_string();
    resp.into_body().collect().await.unwrap();
    instance
}

#[tokio::test]
async fn process_function_tier_runs_the_sample_api() {
    let cfg = ProcessFunctionTierConfig {
        command: command("fn"),
        health_path: "/".into(),
        keep_alive_seconds: 0.5,
        max_instances: 2,
        prewarmed_instances: 0,
        boot_timeout_seconds: 20.0,
        probe_interval_seconds: 0.05,
    };
    let tier: Arc<ProcessFunctionTier> = ProcessFunctionTier::new(&cfg, exe(), client());
    tier.start();

    // Two overlapping slow calls: one instance each.
    let (a, b) = tokio::join!(call(&*tier, "/sleep?ms=300"), call(&*tier, "/sleep?ms=300"));
    assert_ne!(a, b);
    let s = tier.stats();
    assert_eq!((s.instances, s.idle, s.cold_starts), (2, 2, 2));

    // The next call is warm, on one of them.
    let c = call(&*tier, "/").await;
    assert!(c == a || c == b, "{c} not in {a}, {b}");
    assert_eq!(tier.stats().warm_starts, 1);

    eventually("idle instances expired", || tier.stats().instances == 0).await;
    tier.shutdown().await;
}

#[tokio::test]
async fn process_vm_pool_runs_the_sample_api() {
    let cfg = ProcessVmPoolConfig {
        command: command("vm"),
        health_path: "/".into(),
        boot_timeout_seconds: 20.0,
        probe_interval_seconds: 0.05,
    };
    let pool = ProcessVmPool::new(&cfg, exe());
    let name = pool.launch(VmId(1)).await.unwrap();
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
        command: command("fn"),
        health_path: "/".into(),
        keep_alive_seconds: 60.0,
        max_instances: 4,
        prewarmed_instances: 0,
        boot_timeout_seconds: 20.0,
        probe_interval_seconds: 0.05,
    };
    let tier: Arc<ProcessFunctionTier> = ProcessFunctionTier::new(&cfg, exe(), client());
    tier.start();
    let first = call(&*tier, "/").await;
    // The gateway's upstream timeout drops the call while the instance still works on it.
    let abandoned = tokio::time::timeout(
        Duration::from_millis(300),
        tier.invoke(get("/sleep?ms=5000")),
    )
    .await;
    assert!(abandoned.is_err(), "the call should have been cut off");
    eventually("the abandoned instance is gone", || {
        tier.stats().instances == 0
    })
    .await;
    // The next call does not land on the busy instance: it cold-starts a new one.
    let next = call(&*tier, "/").await;
    assert_ne!(next, first);
    assert_eq!(tier.stats().cold_starts, 2);
    tier.shutdown().await;
}
