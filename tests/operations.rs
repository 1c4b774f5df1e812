//! What an operator reads from a running gateway: `/metrics` (HELP on every metric,
//! counters at zero from startup, the in-flight gauge, build info), `/status` (rounded,
//! clearly named), the access log, scaling decisions in the log, and the first request
//! after start finding a VM. Real binary and sample-API processes on 127.0.0.1.

// Real processes on loopback: deadlines are wall-clock time.
#![allow(clippy::disallowed_methods)]

mod common;

use std::time::{Duration, Instant};

use common::*;

const LONG: Duration = Duration::from_secs(60);

fn metrics(gw: &Gateway) -> String {
    let (code, _, body) = http(gw.admin, "GET", "/metrics", &[], b"");
    assert_eq!(code, 200);
    String::from_utf8(body).unwrap()
}

/// The value of the series `name{labels}` (exactly as rendered), if present.
fn series(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// Decisions every 0.5 s (epoch 0.1 s, K = 5), one VM from the start, CIP 2 req/s.
fn quick_config(extra_gateway: &str) -> String {
    process_config(
        "  epoch_seconds: 0.1\n  decision_epochs: 5\n  r_max_rps: 20\n  min_vms: 1\n  max_vms: 2\n  cip_rps: 2",
        extra_gateway,
    )
}

/// Every metric family has a HELP line besides its TYPE line. Returns the family count.
fn assert_help(text: &str) -> usize {
    let families: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| l.split(' ').next().unwrap())
        .collect();
    for f in &families {
        assert!(
            text.contains(&format!("# HELP {f} ")),
            "no HELP for {f}:\n{text}"
        );
    }
    families.len()
}

#[test]
fn metrics_have_help_and_counters_exist_at_zero_from_startup() {
    let gw = Gateway::start(&quick_config(""));
    let text = metrics(&gw);
    let families = assert_help(&text);
    assert!(families >= 14, "{text}");
    // Counters at zero before any request.
    for s in [
        r#"spillway_requests_total{tier="vm",status="2xx"}"#,
        r#"spillway_requests_total{tier="local",status="5xx"}"#,
        r#"spillway_routing_decisions_total{tier="function",reason="budget_exhausted"}"#,
        r#"spillway_routing_decisions_total{tier="rejected",reason="spill_back_rejected"}"#,
        r#"spillway_retries_total{kind="connect_failure"}"#,
        r#"spillway_retries_total{kind="spill_back"}"#,
        r#"spillway_scale_decisions_total{direction="up"}"#,
        r#"spillway_scale_decisions_total{direction="down"}"#,
        r#"spillway_vm_failures_total{stage="not_ready"}"#,
        "spillway_function_cold_starts_total",
        "spillway_requests_in_flight",
    ] {
        assert_eq!(series(&text, s), Some(0.0), "{s} at zero:\n{text}");
    }
    // Build info, with this binary's version and features.
    let features = match (cfg!(feature = "aws"), cfg!(feature = "otlp")) {
        (true, true) => "aws,otlp",
        (true, false) => "aws",
        (false, true) => "otlp",
        (false, false) => "none",
    };
    let info = text
        .lines()
        .find(|l| l.starts_with("spillway_build_info{"))
        .unwrap_or_else(|| panic!("no build info:\n{text}"));
    assert!(
        info.contains(&format!("version=\"{}\"", env!("CARGO_PKG_VERSION"))),
        "{info}"
    );
    assert!(info.contains(&format!("features=\"{features}\"")), "{info}");
    assert!(info.contains("commit=\""), "{info}");
    assert!(info.ends_with(" 1"), "{info}");
    // The target VM count is its own gauge: the `spillway_vms` family only counts VMs.
    assert!(!text.contains(r#"state="target""#), "{text}");
    gw.wait_status("one ready VM", LONG, |s| {
        u64_at(s, "/scaling/ready_vms") == 1
    });
    let text = metrics(&gw);
    let vms: f64 = ["booting", "ready", "draining"]
        .iter()
        .filter_map(|st| series(&text, &format!(r#"spillway_vms{{state="{st}"}}"#)))
        .sum();
    assert_eq!(vms, 1.0, "{text}");
    assert_eq!(series(&text, "spillway_vms_target"), Some(1.0), "{text}");
    assert_eq!(
        series(
            &text,
            r#"spillway_function_instances{zone="cloud",state="idle"}"#
        ),
        Some(0.0),
        "{text}"
    );
    // Histograms appear with their first value, with HELP too.
    assert_eq!(http(gw.proxy, "GET", "/", &[], b"").0, 200);
    let text = metrics(&gw);
    assert!(
        text.contains("# TYPE spillway_request_duration_seconds histogram"),
        "{text}"
    );
    assert!(
        text.contains("# TYPE spillway_vm_boot_seconds histogram"),
        "{text}"
    );
    assert_help(&text);
}

#[test]
fn in_flight_requests_and_function_instances_are_gauges_of_now() {
    let gw = Gateway::start(&quick_config(""));
    gw.wait_status("one ready VM", LONG, |s| {
        u64_at(s, "/scaling/ready_vms") == 1
    });
    let addr = gw.proxy;
    let slow = std::thread::spawn(move || http(addr, "GET", "/sleep?ms=1500", &[], b"").0);
    let deadline = Instant::now() + LONG;
    loop {
        if series(&metrics(&gw), "spillway_requests_in_flight") == Some(1.0) {
            break;
        }
        assert!(Instant::now() < deadline, "{}", metrics(&gw));
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(slow.join().unwrap(), 200);
    let deadline = Instant::now() + LONG;
    while series(&metrics(&gw), "spillway_requests_in_flight") != Some(0.0) {
        assert!(Instant::now() < deadline, "{}", metrics(&gw));
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn status_rounds_rates_and_durations_and_names_them() {
    let gw = Gateway::start(&quick_config(""));
    gw.wait_status("one ready VM", LONG, |s| {
        u64_at(s, "/scaling/ready_vms") == 1
    });
    let results = load(gw.proxy, "/", 30.0, 1.5);
    assert!(results.iter().all(|(c, _)| *c == 200));
    let s = gw.wait_status("a decision after traffic", LONG, |s| {
        s.pointer("/scaling/last_decision/reason")
            .is_some_and(|r| r != "awaiting_traffic")
    });
    let decimals = |v: f64| {
        let t = v.to_string();
        t.split_once('.').map_or(0, |(_, d)| d.len())
    };
    for ptr in [
        "/traffic/avg_rps",
        "/traffic/mean_abs_deviation_rps",
        "/scaling/vm_reqs_rps",
        "/scaling/vm_budget_before_rho_rps",
        "/scaling/cip_rps",
        "/scaling/last_decision/vm_reqs_rps",
    ] {
        let v = f64_at(&s, ptr);
        assert!(decimals(v) <= 2, "{ptr} = {v} not rounded to 0.01:\n{s:#}");
    }
    let up = f64_at(&s, "/uptime_seconds");
    assert!(up > 0.0 && decimals(up) <= 4, "uptime to 0.1 ms: {up}");
    assert_eq!(f64_at(&s, "/scaling/cip_rps"), 2.0);
    assert_eq!(s["build"]["version"], env!("CARGO_PKG_VERSION"));
    // The fields the load tester reads keep their names.
    u64_at(&s, "/routed/vm");
    u64_at(&s, "/routed/function");
    u64_at(&s, "/scaling/ready_vms");
    assert!(s.pointer("/traffic/std").is_none() && s.pointer("/scaling/budget_rps").is_none());
}

#[test]
fn the_access_log_has_one_line_per_request_when_switched_on() {
    let gw = Gateway::start(&quick_config("  access_log: true"));
    gw.wait_status("one ready VM", LONG, |s| {
        u64_at(s, "/scaling/ready_vms") == 1
    });
    let (code, _, body) = http(gw.proxy, "POST", "/echo?secret=1", &[], b"hello");
    assert_eq!((code, body.as_slice()), (200, b"hello".as_slice()));
    let line = gw.proc.wait_line("spillway::access", LONG);
    for field in [
        "client=127.0.0.1:",
        "method=POST",
        "path=/echo ",
        "version=HTTP/1.1",
        "status=200",
        "tier=vm",
        "zone=-",
        "instance=vm-",
        "headers_ms=",
        "total_ms=",
        "bytes_in=5",
        "bytes_out=5",
        "complete=true",
    ] {
        assert!(line.contains(field), "{field} missing: {line}");
    }
    assert!(
        !line.contains("secret"),
        "the query string stays out: {line}"
    );
    // A local reply is logged too (413 from the gateway itself).
    let (code, _, _) = raw(
        gw.proxy,
        b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 20000000\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(code, 413);
    let line = gw.proc.wait_line("status=413", LONG);
    assert!(
        line.contains("tier=local") && line.contains("instance=-"),
        "{line}"
    );
}

#[test]
fn without_the_switch_there_is_no_access_log_and_hold_decisions_stay_at_debug() {
    let gw = Gateway::start(&quick_config(""));
    gw.wait_status("one ready VM", LONG, |s| {
        u64_at(s, "/scaling/ready_vms") == 1
    });
    assert_eq!(http(gw.proxy, "GET", "/", &[], b"").0, 200);
    // Held decisions happen every 0.5 s (counted) but are not logged at INFO.
    let deadline = Instant::now() + LONG;
    while series(
        &metrics(&gw),
        r#"spillway_scale_decisions_total{direction="hold"}"#,
    )
    .unwrap_or(0.0)
        < 2.0
    {
        assert!(Instant::now() < deadline, "{}", metrics(&gw));
        std::thread::sleep(Duration::from_millis(50));
    }
    // A change (the CIP releasing the VM after the request) is logged at INFO.
    gw.proc.wait_line("direction=\"down\"", LONG);
    let log = gw.proc.log_text();
    assert!(!log.contains("spillway::access"), "{log}");
    assert!(
        !log.lines()
            .any(|l| l.contains("scaling decision") && l.contains("direction=\"hold\"")),
        "{log}"
    );
    let decision = log
        .lines()
        .find(|l| l.contains("scaling decision"))
        .unwrap();
    let vm_reqs = decision
        .split("vm_reqs_rps=")
        .nth(1)
        .unwrap()
        .split(' ')
        .next()
        .unwrap();
    assert!(
        vm_reqs.split_once('.').is_none_or(|(_, d)| d.len() <= 2),
        "rounded: {decision}"
    );
}

/// Quickstart behaviour: an idle gateway keeps its `min_vms` VM past many decisions, so
/// the first request after start is served by a VM; once traffic was seen, the CIP rule
/// releases the VM as LIBRA says.
#[test]
fn the_first_request_after_start_finds_a_vm_then_the_cip_rule_applies() {
    let gw = Gateway::start(&quick_config(""));
    let s = gw.wait_status("several idle decisions", LONG, |s| {
        s.pointer("/scaling/last_decision/epoch")
            .and_then(|e| e.as_u64())
            .is_some_and(|e| e >= 14)
    });
    assert_eq!(
        s["scaling"]["last_decision"]["reason"], "awaiting_traffic",
        "{s:#}"
    );
    assert_eq!(u64_at(&s, "/scaling/ready_vms"), 1, "{s:#}");
    let (code, headers, _) = http(gw.proxy, "GET", "/", &[], b"");
    assert_eq!(code, 200);
    let instance = header(&headers, "x-spillway-instance").unwrap_or("");
    assert!(instance.starts_with("vm-"), "first request on {instance}");
    let s = gw.wait_status("the VM released below the CIP", LONG, |s| {
        u64_at(s, "/scaling/target_vms") == 0
    });
    assert_eq!(
        s["scaling"]["last_decision"]["reason"], "below_cip",
        "{s:#}"
    );
}

#[test]
fn the_access_log_names_the_function_zone_and_instance() {
    // No VM at all: every request runs on the function tier (one zone, `cloud`).
    let gw = Gateway::start(&process_config(
        "  epoch_seconds: 1\n  decision_epochs: 1000\n  min_vms: 0\n  max_vms: 1",
        "  access_log: true",
    ));
    let (code, headers, _) = http(gw.proxy, "GET", "/", &[], b"");
    assert_eq!(code, 200);
    assert!(header(&headers, "x-spillway-instance").is_some_and(|i| i.starts_with("fn-")));
    let line = gw.proc.wait_line("spillway::access", LONG);
    for field in ["tier=function", "zone=cloud", "instance=fn-", "status=200"] {
        assert!(line.contains(field), "{field} missing: {line}");
    }
}
