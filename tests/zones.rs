//! Function zones end to end (FaaSim "two-tier edge/cloud"): the real gateway
//! binary with two `process` zones of sample-API instances on 127.0.0.1 and no VM, so
//! every request is placed in a zone. Instance names say the zone (`edge-<port>`,
//! `cloud-<port>`). Polling with deadlines; no fixed sleeps before assertions.

// Real processes on loopback: deadlines are wall-clock time.
#![allow(clippy::disallowed_methods)]

mod common;

use common::*;

/// A gateway with no VM (an empty static pool) and two zones: `edge-a` (at most 2
/// instances, `edge_command`, `edge_keys` added) and the cloud (at most 4).
fn zones_config(edge_command: &str, edge_keys: &str, extra_gateway: &str) -> String {
    let exe = exe();
    format!(
        r#"
gateway:
  listen: 127.0.0.1:0
  admin_listen: 127.0.0.1:0
  drain_timeout_seconds: 10
{extra_gateway}
libra:
  decision_epochs: 1000
  min_vms: 0
  max_vms: 0
  cip_rps: 0
vm_pool:
  type: static
  urls: []
placement: edge_first
function_zones:
  - name: edge-a
    kind: edge
    type: process
    command: {edge_command}
    max_instances: 2
    keep_alive_seconds: 30
    boot_timeout_seconds: 5
    probe_interval_seconds: 0.02
{edge_keys}
  - name: cloud
    kind: cloud
    type: process
    command: ["{exe}", "sample-api", "--listen", "127.0.0.1:{{port}}", "--name", "cloud-{{port}}"]
    max_instances: 4
    keep_alive_seconds: 30
    probe_interval_seconds: 0.02
"#
    )
}

fn edge_command() -> String {
    format!(
        r#"["{}", "sample-api", "--listen", "127.0.0.1:{{port}}", "--name", "edge-{{port}}"]"#,
        exe()
    )
}

/// `n` concurrent GETs of `path` with `headers`: (status, instance) each.
fn concurrent(
    gw: &Gateway,
    n: usize,
    path: &str,
    headers: &[(&'static str, &'static str)],
) -> Vec<(u16, String)> {
    let threads: Vec<_> = (0..n)
        .map(|_| {
            let (addr, path, headers) = (gw.proxy, path.to_string(), headers.to_vec());
            std::thread::spawn(move || {
                let (code, h, _) = http(addr, "GET", &path, &headers, b"");
                let instance = header(&h, "x-spillway-instance").unwrap_or("-").to_string();
                (code, instance)
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

fn zone_stat(s: &serde_json::Value, zone: usize, key: &str) -> u64 {
    s.pointer(&format!("/functions/zones/{zone}/stats/{key}"))
        .and_then(|v| v.as_u64())
        .unwrap_or_else(|| panic!("{key} of zone {zone} in {s:#}"))
}

#[test]
fn a_client_of_the_edge_fills_the_edge_then_the_cloud() {
    let gw = Gateway::start(&zones_config(
        &edge_command(),
        "    client_cidrs: [127.0.0.0/8]",
        "",
    ));
    // Origin by client_cidrs (the test client is 127.0.0.1): the edge.
    let (code, h, _) = http(gw.proxy, "GET", "/", &[], b"");
    assert_eq!(code, 200);
    let first = header(&h, "x-spillway-instance").unwrap().to_string();
    assert!(first.starts_with("edge-"), "{first}");

    // Three calls at once, each longer than the others take to be placed: the edge's
    // warm instance and one new edge instance (its cap of 2), then the cloud.
    let got = concurrent(&gw, 3, "/sleep?ms=1500", &[]);
    assert!(got.iter().all(|(c, _)| *c == 200), "{got:?}");
    let edge = got.iter().filter(|(_, i)| i.starts_with("edge-")).count();
    let cloud = got.iter().filter(|(_, i)| i.starts_with("cloud-")).count();
    assert_eq!((edge, cloud), (2, 1), "{got:?}");

    let s = gw.status();
    assert_eq!(
        s.pointer("/functions/zones/0/name").unwrap(),
        "edge-a",
        "{s:#}"
    );
    assert_eq!(s.pointer("/functions/zones/0/zone_kind").unwrap(), "edge");
    assert_eq!(s.pointer("/functions/zones/1/zone_kind").unwrap(), "cloud");
    // Edge: the first call and one of the three cold-started, one warm start.
    assert_eq!(
        (
            zone_stat(&s, 0, "cold_starts"),
            zone_stat(&s, 0, "warm_starts")
        ),
        (2, 1)
    );
    assert_eq!(
        (
            zone_stat(&s, 1, "cold_starts"),
            zone_stat(&s, 1, "warm_starts")
        ),
        (1, 0)
    );
    // FaaSim usage: the edge's instances were busy at least the 1.5 s calls (two of
    // them) — accounted when each call ended.
    let busy = s
        .pointer("/functions/zones/0/usage/busy_seconds")
        .and_then(|v| v.as_f64())
        .unwrap();
    assert!(busy >= 2.0 * 1.5, "{s:#}");
    let (_, _, metrics) = http(gw.admin, "GET", "/metrics", &[], b"");
    let metrics = String::from_utf8_lossy(&metrics);
    assert!(
        metrics.contains(r#"spillway_function_starts{zone="edge-a",start="cold"} 2"#),
        "{metrics}"
    );
}

#[test]
fn an_unreachable_edge_falls_through_to_the_cloud() {
    // The edge's program does not exist: every cold start there fails at once.
    let gw = Gateway::start(&zones_config(
        r#"["/nonexistent/spillway-edge", "{port}"]"#,
        "    client_cidrs: [127.0.0.1/32]",
        "",
    ));
    let got = concurrent(&gw, 2, "/", &[]);
    assert!(
        got.iter()
            .all(|(c, i)| *c == 200 && i.starts_with("cloud-")),
        "{got:?}"
    );
    let s = gw.status();
    assert_eq!(
        zone_stat(&s, 0, "instances"),
        0,
        "failed starts are forgotten"
    );
    assert_eq!(
        zone_stat(&s, 1, "cold_starts") + zone_stat(&s, 1, "warm_starts"),
        2
    );
}

#[test]
fn the_origin_header_counts_only_from_a_trusted_proxy() {
    // The edge's clients are elsewhere (10.9.0.0/16): only the header can send a call
    // there, and only from a trusted peer.
    let cidrs = "    client_cidrs: [10.9.0.0/16]";
    let header_keys = |trusted: &str| {
        format!("  trusted_proxies: [{trusted}]\n  origin_zone_header: x-spillway-zone")
    };
    let gw = Gateway::start(&zones_config(
        &edge_command(),
        cidrs,
        &header_keys("127.0.0.1/32"),
    ));
    let to = |headers: &[(&'static str, &'static str)]| {
        let (code, h, _) = http(gw.proxy, "GET", "/", headers, b"");
        assert_eq!(code, 200);
        header(&h, "x-spillway-instance").unwrap().to_string()
    };
    assert!(to(&[]).starts_with("cloud-"), "no edge origin: the cloud");
    assert!(to(&[("x-spillway-zone", "edge-a")]).starts_with("edge-"));
    assert!(
        to(&[("x-spillway-zone", "edge-b")]).starts_with("cloud-"),
        "an unknown zone name is ignored"
    );
    drop(gw);

    let untrusted = Gateway::start(&zones_config(
        &edge_command(),
        cidrs,
        &header_keys("127.0.0.2/32"),
    ));
    let (code, h, _) = http(
        untrusted.proxy,
        "GET",
        "/",
        &[("x-spillway-zone", "edge-a")],
        b"",
    );
    assert_eq!(code, 200);
    assert!(
        header(&h, "x-spillway-instance")
            .unwrap()
            .starts_with("cloud-"),
        "the header of an untrusted peer is ignored"
    );
}

/// FaaSim: a call that finds no idle instance takes a pre-warmed instance still booting
/// and waits for it, rather than cold-starting another. The edge's one pre-warmed
/// instance takes 3 s to boot (a shell sleeps first); the call made meanwhile is served
/// by it: no cold start anywhere, one warm start and one pre-warm wait on the edge.
#[test]
fn a_call_waits_for_the_booting_prewarmed_edge_instance() {
    let slow_edge = format!(
        r#"["sh", "-c", "sleep 3; exec {} sample-api --listen 127.0.0.1:{{port}} --name edge-{{port}}"]"#,
        exe()
    );
    let yaml = zones_config(
        &slow_edge,
        "    client_cidrs: [127.0.0.0/8]\n    prewarmed_instances: 1",
        "",
    )
    .replacen("boot_timeout_seconds: 5", "boot_timeout_seconds: 20", 1);
    let gw = Gateway::start(&yaml);
    let s = gw.status();
    assert_eq!(zone_stat(&s, 0, "starting"), 1, "still booting: {s:#}");
    let (code, h, _) = http(gw.proxy, "GET", "/", &[], b"");
    assert_eq!(code, 200);
    assert!(
        header(&h, "x-spillway-instance")
            .unwrap()
            .starts_with("edge-")
    );
    let s = gw.status();
    let starts = |z| {
        (
            zone_stat(&s, z, "cold_starts"),
            zone_stat(&s, z, "warm_starts"),
        )
    };
    assert_eq!((starts(0), starts(1)), ((0, 1), (0, 0)), "{s:#}");
    assert_eq!(
        s.pointer("/functions/zones/0/usage/prewarm_waits"),
        Some(&serde_json::json!(1))
    );
    let inst = s.pointer("/functions/zones/0/usage/instances/0").unwrap();
    assert_eq!(inst["prewarmed"], true, "{inst}");
    assert_eq!(
        inst["startup_seconds"], 0.0,
        "a pre-warm's boot is not start-up time"
    );
}

/// Keep-alive expiry stops an idle instance; the time from the expiry until its process
/// exited is its shutdown time (FaaSim usage = start-up + busy + idle + shutdown), shown
/// per zone in `/status` and `/metrics`, and per instance while it lives.
#[test]
fn an_expired_instance_reports_its_shutdown_time_and_per_instance_usage() {
    let keep_alive = 1.0;
    let yaml = zones_config(&edge_command(), "    client_cidrs: [127.0.0.0/8]", "").replacen(
        "keep_alive_seconds: 30",
        &format!("keep_alive_seconds: {keep_alive}"),
        1,
    );
    let gw = Gateway::start(&yaml);
    let (code, _, _) = http(gw.proxy, "GET", "/sleep?ms=200", &[], b"");
    assert_eq!(code, 200);
    let s = gw.status();
    let inst = s.pointer("/functions/zones/0/usage/instances").unwrap();
    assert_eq!(inst.as_array().unwrap().len(), 1, "{s:#}");
    assert_eq!(
        (
            inst[0]["cold_starts"].as_u64(),
            inst[0]["prewarmed"].as_bool()
        ),
        (Some(1), Some(false))
    );
    assert!(inst[0]["busy_seconds"].as_f64().unwrap() >= 0.2, "{inst}");
    let (_, _, metrics) = http(gw.admin, "GET", "/metrics", &[], b"");
    let metrics = String::from_utf8_lossy(&metrics);
    assert!(
        metrics.contains(
            r#"spillway_function_instance_starts{zone="edge-a",instance="0",start="cold"} 1"#
        ),
        "{metrics}"
    );
    let s = gw.wait_status(
        "the instance expired and stopped",
        std::time::Duration::from_secs(20),
        |s: &serde_json::Value| {
            s.pointer("/functions/zones/0/usage/instances_expired") == Some(&serde_json::json!(1))
                && s.pointer("/functions/zones/0/usage/instances_stopping")
                    == Some(&serde_json::json!(0))
        },
    );
    let u = s.pointer("/functions/zones/0/usage").unwrap();
    let f = |k: &str| u[k].as_f64().unwrap();
    assert!(f("shutdown_seconds") > 0.0, "{u}");
    assert!(
        (f("idle_seconds") - keep_alive).abs() < 1e-6,
        "idle until the expiry: {u}"
    );
    let sum = f("startup_seconds") + f("busy_seconds") + f("idle_seconds") + f("shutdown_seconds");
    assert!((f("instance_hours") - sum / 3600.0).abs() < 1e-9, "{u}");
    assert_eq!(
        u["instances"],
        serde_json::json!([]),
        "stopped instances leave the list"
    );
    let (_, _, metrics) = http(gw.admin, "GET", "/metrics", &[], b"");
    let metrics = String::from_utf8_lossy(&metrics);
    assert!(
        metrics.contains(r#"spillway_function_usage_seconds{zone="edge-a",phase="shutdown"}"#),
        "{metrics}"
    );
}

/// Warm-first (FaaSim): a call from the edge takes a warm cloud instance rather than
/// cold-starting on the edge; edge-first cold-starts on the edge. The first call has no
/// edge origin (the edge's clients are 10.9.0.0/16) and cold-starts in the cloud; the
/// second names the edge by the trusted origin header.
#[test]
fn warm_first_takes_a_warm_cloud_instance_over_a_cold_edge_start() {
    let keys = "  trusted_proxies: [127.0.0.1/32]\n  origin_zone_header: x-spillway-zone";
    for (placement, second_on_edge) in [("warm_first", false), ("edge_first", true)] {
        let yaml = zones_config(&edge_command(), "    client_cidrs: [10.9.0.0/16]", keys)
            .replace("placement: edge_first", &format!("placement: {placement}"));
        let gw = Gateway::start(&yaml);
        let call = |headers: &[(&'static str, &'static str)]| {
            let (code, h, _) = http(gw.proxy, "GET", "/", headers, b"");
            assert_eq!(code, 200);
            header(&h, "x-spillway-instance").unwrap().to_string()
        };
        let first = call(&[]);
        assert!(first.starts_with("cloud-"), "{first}");
        let second = call(&[("x-spillway-zone", "edge-a")]);
        if second_on_edge {
            assert!(second.starts_with("edge-"), "{placement}: {second}");
        } else {
            assert_eq!(second, first, "{placement}: the warm cloud instance");
        }
        let s = gw.status();
        let starts = |z| {
            (
                zone_stat(&s, z, "cold_starts"),
                zone_stat(&s, z, "warm_starts"),
            )
        };
        let want = if second_on_edge {
            ((1, 0), (1, 0))
        } else {
            ((0, 0), (1, 1))
        };
        assert_eq!((starts(0), starts(1)), want, "{placement}: {s:#}");
    }
}

/// Pre-warmed instances never expire, each of them, in the live gateway too: one
/// pre-warmed edge instance, a 0.5 s keep-alive and two calls at once (just above the
/// pre-warm count). The pre-warmed instance ends its call first and idles longest, yet
/// the cold-started one is the one that expires; the next call is a warm start on the
/// pre-warmed instance.
#[test]
fn the_prewarmed_instance_outlives_a_cold_started_one_under_load_above_its_count() {
    let yaml = zones_config(
        &edge_command(),
        "    client_cidrs: [127.0.0.0/8]\n    prewarmed_instances: 1",
        "",
    )
    .replacen("keep_alive_seconds: 30", "keep_alive_seconds: 0.5", 1);
    let gw = Gateway::start(&yaml);
    gw.wait_status(
        "the pre-warmed instance is ready",
        std::time::Duration::from_secs(20),
        |s| zone_stat(s, 0, "idle") == 1,
    );
    let served = concurrent(&gw, 2, "/sleep?ms=400", &[]);
    assert!(served.iter().all(|(code, _)| *code == 200), "{served:?}");
    let s = gw.status();
    assert_eq!(
        (
            zone_stat(&s, 0, "cold_starts"),
            zone_stat(&s, 0, "warm_starts")
        ),
        (1, 1),
        "{s:#}"
    );
    let s = gw.wait_status(
        "one instance expired and stopped",
        std::time::Duration::from_secs(20),
        |s: &serde_json::Value| {
            s.pointer("/functions/zones/0/usage/instances_expired") == Some(&serde_json::json!(1))
                && s.pointer("/functions/zones/0/usage/instances_stopping")
                    == Some(&serde_json::json!(0))
        },
    );
    let inst = s
        .pointer("/functions/zones/0/usage/instances")
        .and_then(|v| v.as_array())
        .unwrap();
    assert_eq!(inst.len(), 1, "{s:#}");
    assert_eq!(
        inst[0]["prewarmed"], true,
        "the pre-warmed one stays: {s:#}"
    );
    let (code, _, _) = http(gw.proxy, "GET", "/", &[], b"");
    assert_eq!(code, 200);
    let s = gw.status();
    assert_eq!(
        (
            zone_stat(&s, 0, "cold_starts"),
            zone_stat(&s, 0, "warm_starts")
        ),
        (1, 2),
        "{s:#}"
    );
}
