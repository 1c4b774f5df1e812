//! End-to-end LIBRA behaviour of the real gateway binary, with real sample-API processes
//! as VMs and functions, on 127.0.0.1 (port 0). Short real durations, polling with
//! deadlines; no fixed sleeps before assertions.

// Real processes on loopback: deadlines are wall-clock time.
#![allow(clippy::disallowed_methods)]

mod common;

use std::time::Duration;

use common::*;

const LONG: Duration = Duration::from_secs(60);

fn is_vm(instance: &str) -> bool {
    instance.starts_with("vm-")
}
fn is_fn(instance: &str) -> bool {
    instance.starts_with("fn-")
}

#[test]
fn steady_load_under_the_budget_goes_only_to_vms_and_a_burst_spills_without_errors() {
    // One VM from the start, budget = min_vms · r_max = 40 req/s, ρ = 1. Decisions are
    // far away (K = 1000), so the budget stays put during the test.
    let gw = Gateway::start(&process_config(
        "  epoch_seconds: 1\n  decision_epochs: 1000\n  rho: 1.0\n  r_max_rps: 40\n  min_vms: 1\n  max_vms: 1\n  cip_rps: 0",
        "",
    ));
    gw.wait_status("one ready VM", LONG, |s| {
        u64_at(s, "/scaling/ready_vms") == 1
    });
    let before = gw.status();

    let steady = load(gw.proxy, "/", 10.0, 2.0);
    assert!(steady.iter().all(|(code, _)| *code == 200), "{steady:?}");
    assert!(
        steady.iter().all(|(_, i)| is_vm(i)),
        "steady load must stay on the VM: {steady:?}"
    );
    let after = gw.status();
    assert_eq!(
        u64_at(&after, "/routed/function"),
        u64_at(&before, "/routed/function"),
        "no request spilled"
    );

    // A burst far above the bucket (40 tokens) overflows to the function tier, no errors.
    let burst_started = std::time::Instant::now();
    let burst: Vec<(u16, String)> = {
        let (tx, rx) = std::sync::mpsc::channel();
        for _ in 0..120 {
            let tx = tx.clone();
            let addr = gw.proxy;
            std::thread::spawn(move || {
                let (code, headers, _) = http(addr, "GET", "/sleep?ms=200", &[], b"");
                let _ = tx.send((
                    code,
                    header(&headers, "x-spillway-instance")
                        .unwrap_or("")
                        .to_string(),
                ));
            });
        }
        drop(tx);
        rx.iter().take(120).collect()
    };
    assert!(
        burst.iter().all(|(code, _)| *code == 200),
        "client errors in burst: {burst:?}"
    );
    let on_vm = burst.iter().filter(|(_, i)| is_vm(i)).count();
    let on_fn = burst.iter().filter(|(_, i)| is_fn(i)).count();
    assert_eq!(on_vm + on_fn, 120);
    assert!(on_fn > 0, "the burst must spill to functions");
    // The bucket holds one second's budget (40) and refills at 40/s while the burst runs.
    let allowed = 40.0 + 40.0 * burst_started.elapsed().as_secs_f64() + 1.0;
    assert!(
        (on_vm as f64) <= allowed,
        "VM first attempts exceed the bucket: {on_vm} > {allowed}"
    );
    let metrics = http(gw.admin, "GET", "/metrics", &[], b"").2;
    let metrics = String::from_utf8_lossy(&metrics);
    assert!(
        metrics.contains("spillway_function_cold_starts_total"),
        "{metrics}"
    );
    assert!(
        metrics.contains(
            r#"spillway_routing_decisions_total{tier="function",reason="budget_exhausted"}"#
        ),
        "{metrics}"
    );
}

#[test]
fn after_k_epochs_the_pool_is_resized_to_ceil_of_avg_plus_phi_std_over_r_max() {
    // Epoch 0.25 s, K = 4: a decision every second. r_max = 10 req/s, load 35 req/s:
    // avg ≈ 35, std small → 4 VMs.
    let gw = Gateway::start(&process_config(
        "  epoch_seconds: 0.25\n  decision_epochs: 4\n  alpha: 0.5\n  beta: 0.5\n  phi: 1.0\n  rho: 0.9\n  r_max_rps: 10\n  min_vms: 0\n  max_vms: 8\n  cip_rps: 1",
        "",
    ));
    let addr = gw.proxy;
    let loader = std::thread::spawn(move || load(addr, "/", 35.0, 8.0));
    let s = gw.wait_status("a decision with ready VMs", LONG, |s| {
        let Some(d) = s.pointer("/scaling/last_decision").filter(|d| !d.is_null()) else {
            return false;
        };
        let vm_reqs = f64_at(d, "/vm_reqs_rps");
        let target = u64_at(d, "/target_vms");
        target >= 3
            && u64_at(s, "/scaling/ready_vms") == target
            && target == (vm_reqs / 10.0).ceil() as u64
    });
    let budget = f64_at(&s, "/scaling/vm_budget_before_rho_rps");
    assert!(budget >= 30.0, "ready VMs raise the budget: {s:#}");
    let results = loader.join().unwrap();
    assert!(results.iter().all(|(c, _)| *c == 200), "{results:?}");
    // Once the VMs were ready, most of the remaining load ran on them.
    let tail = &results[results.len() - 70..];
    let vm_share = tail.iter().filter(|(_, i)| is_vm(i)).count() as f64 / tail.len() as f64;
    assert!(vm_share > 0.6, "VM share of the last 2 s: {vm_share}");
}

#[test]
fn load_below_the_cip_releases_every_vm_and_functions_serve_everything() {
    let gw = Gateway::start(&process_config(
        "  epoch_seconds: 0.25\n  decision_epochs: 4\n  r_max_rps: 10\n  min_vms: 2\n  max_vms: 4\n  cip_rps: 20",
        "",
    ));
    gw.wait_status("min_vms ready", LONG, |s| {
        u64_at(s, "/scaling/ready_vms") == 2
    });
    let addr = gw.proxy;
    let loader = std::thread::spawn(move || load(addr, "/", 4.0, 1.5));
    let s = gw.wait_status("all VMs released", LONG, |s| {
        u64_at(s, "/scaling/target_vms") == 0
            && u64_at(s, "/scaling/ready_vms") == 0
            && u64_at(s, "/scaling/draining_vms") == 0
    });
    assert_eq!(
        s.pointer("/scaling/last_decision/reason").unwrap(),
        "below_cip"
    );
    assert!(loader.join().unwrap().iter().all(|(c, _)| *c == 200));
    let later = load(gw.proxy, "/", 5.0, 1.0);
    assert!(
        later.iter().all(|(c, i)| *c == 200 && is_fn(i)),
        "{later:?}"
    );
    gw.wait_status("VM processes gone", LONG, |s| {
        s.pointer("/vm_pool/vms")
            .and_then(|v| v.as_array())
            .is_some_and(|v| v.is_empty())
    });
}

#[test]
fn sigterm_during_in_flight_requests_loses_none_and_exits_zero() {
    let mut gw = Gateway::start(&process_config(
        "  decision_epochs: 1000\n  r_max_rps: 100\n  min_vms: 1\n  cip_rps: 0",
        "",
    ));
    gw.wait_status("one ready VM", LONG, |s| {
        u64_at(s, "/scaling/ready_vms") == 1
    });
    let addr = gw.proxy;
    let (tx, rx) = std::sync::mpsc::channel();
    for _ in 0..10 {
        let tx = tx.clone();
        std::thread::spawn(move || {
            let _ = tx.send(http(addr, "GET", "/sleep?ms=1500", &[], b"").0);
        });
    }
    drop(tx);
    gw.wait_status("10 requests in flight", LONG, |s| {
        u64_at(s, "/routed/vm") + u64_at(s, "/routed/function") >= 10
    });
    gw.proc.signal("TERM");
    let codes: Vec<u16> = rx.iter().take(10).collect();
    assert_eq!(codes, vec![200; 10], "in-flight requests must complete");
    assert_eq!(gw.proc.wait_exit(Duration::from_secs(20)), Some(0));
    // New connections are refused after shutdown.
    assert!(std::net::TcpStream::connect(gw.proxy).is_err());
}

#[test]
fn check_reports_every_semantic_error_at_once_and_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.yaml");
    std::fs::write(
        &path,
        "libra:\n  rho: 2\n  alpha: -1\n  decision_epochs: 0\nvm_pool:\n  type: static\n  urls: [\"not a url\"]\nfunction_tier:\n  type: http\n  url: http://127.0.0.1:1\n  max_concurrency: 0\n",
    )
    .unwrap();
    let out = std::process::Command::new(exe())
        .args(["check", "--config", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    for p in [
        "libra.alpha",
        "libra.rho",
        "libra.decision_epochs",
        "vm_pool.urls[0]",
        "function_tier.max_concurrency",
    ] {
        assert!(err.contains(p), "{p} missing from:\n{err}");
    }
    // A type error names file:line:column.
    std::fs::write(&path, "libra:\n  rho: high\n").unwrap();
    let out = std::process::Command::new(exe())
        .args(["check", "--config", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("{}:2:8", path.display())), "{err}");
    // Usage errors keep clap's exit code 2.
    let out = std::process::Command::new(exe())
        .args(["check"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// Adaptive r_max (LIBRA §III-B): the gateway measures its VM attempts' response
/// times (to the end of the body), and a p90 above the target lowers r_max, which caps
/// the VM budget; `/status` and `/metrics` show the value, the error and the adjustment.
#[test]
fn vm_responses_slower_than_the_target_lower_r_max_and_the_budget() {
    // One VM (min = max = 1), periods of 4 epochs of 0.25 s; p90 target 100 ms; the VM
    // sleeps 150 ms per request.
    let gw = Gateway::start(&process_config(
        "  epoch_seconds: 0.25\n  decision_epochs: 4\n  rho: 1.0\n  r_max_rps: 20\n  min_vms: 1\n  max_vms: 1\n  cip_rps: 0\n  r_max_adaptive: {target_percentile: 90, target_ms: 100, kp: 0.1, ki: 0.45, kd: 0.03, min_rps: 2, max_rps: 40, max_step_rps: 100}",
        "",
    ));
    gw.wait_status("one ready VM", LONG, |s| {
        u64_at(s, "/scaling/ready_vms") == 1
    });
    let s = gw.status();
    assert_eq!(s.pointer("/r_max/adaptive"), Some(&serde_json::json!(true)));
    assert_eq!(f64_at(&s, "/r_max/rps"), 20.0);
    let addr = gw.proxy;
    let loader = std::thread::spawn(move || load(addr, "/sleep?ms=150", 12.0, 6.0));
    // One period at e = ln(100/150) moves r_max to at most 20·e^{(kp+ki)·e} ≈ 16.0.
    let s = gw.wait_status("r_max lowered by a full period", LONG, |s| {
        f64_at(s, "/r_max/rps") < 16.1
    });
    let results = loader.join().unwrap();
    assert!(results.iter().all(|(c, _)| *c == 200), "{results:?}");
    let measured = f64_at(&s, "/r_max/measured_ms");
    assert!(
        (150.0..1000.0).contains(&measured),
        "the VM's p90 is its 150 ms sleep plus overhead: {s:#}"
    );
    let error = f64_at(&s, "/r_max/error");
    assert!(
        // `measured_ms` is rounded to 0.1 ms: ln moves by at most 0.05 / measured.
        (error - (100.0 / measured).ln().max(-1.0)).abs() <= 0.05 / measured + 1e-9,
        "error = ln(target / measured): {s:#}"
    );
    let rps = f64_at(&s, "/r_max/rps");
    let last = s.pointer("/r_max/last_adjustment").unwrap();
    assert_eq!(f64_at(last, "/to_rps"), rps);
    assert!(f64_at(last, "/from_rps") > rps && f64_at(last, "/adjustment_rps") < 0.0);
    assert!(u64_at(&s, "/r_max/adjustments") >= 1);
    assert!(
        f64_at(&s, "/scaling/vm_budget_before_rho_rps") <= rps + 1e-9,
        "the budget is capped at ready · r_max: {s:#}"
    );
    let metrics = http(gw.admin, "GET", "/metrics", &[], b"").2;
    let metrics = String::from_utf8_lossy(&metrics);
    for name in [
        "spillway_r_max_rps ",
        "spillway_r_max_error ",
        "spillway_r_max_vm_latency_seconds ",
        "spillway_r_max_adjustment_rps ",
        "spillway_r_max_adjustments_total ",
    ] {
        assert!(metrics.contains(name), "{name} in\n{metrics}");
    }
}
