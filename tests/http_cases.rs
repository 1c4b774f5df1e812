//! http-cases C7, C8 and C17 (../shared/cases/http-cases.md) against the real gateway,
//! with sample-API upstreams that report what they received (`/headers`, `/stats`).

// Real processes on loopback: deadlines are wall-clock time.
#![allow(clippy::disallowed_methods)]

mod common;

use std::time::Duration;

use common::*;
use serde_json::Value;

const LONG: Duration = Duration::from_secs(60);

/// A gateway in front of a static pool of the given sample APIs (by URL), with a
/// process function tier.
fn static_gateway(urls: &[String], extra_gateway: &str) -> Gateway {
    let exe = exe();
    let urls = urls
        .iter()
        .map(|u| format!("\"{u}\""))
        .collect::<Vec<_>>()
        .join(", ");
    Gateway::start(&format!(
        r#"
gateway:
  listen: 127.0.0.1:0
  admin_listen: 127.0.0.1:0
{extra_gateway}
libra:
  decision_epochs: 1000
  r_max_rps: 1000
  rho: 1.0
vm_pool:
  type: static
  urls: [{urls}]
function_tier:
  type: process
  command: ["{exe}", "sample-api", "--listen", "127.0.0.1:{{port}}", "--name", "fn-{{port}}"]
  max_instances: 4
"#
    ))
}

fn received_headers(body: &[u8]) -> serde_json::Map<String, Value> {
    let v: Value = serde_json::from_slice(body)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(body)));
    v["headers"].as_object().expect("headers object").clone()
}

#[test]
fn c7_hop_by_hop_and_connection_named_headers_never_reach_the_upstream() {
    let api = SampleApi::start("vm-a");
    let gw = static_gateway(&[format!("http://{}", api.addr)], "");
    let req = "GET /headers HTTP/1.1\r\nHost: a\r\nConnection: keep-alive, X-Forwarded-For, X-Auth-User, HTTP2-Settings\r\nX-Auth-User: admin\r\nKeep-Alive: 5\r\nTE: gzip\r\nUpgrade: h2c\r\nHTTP2-Settings: AAA\r\nProxy-Connection: keep-alive\r\n\r\n";
    // The request is keep-alive; read one response then close.
    let mut s = std::net::TcpStream::connect(gw.proxy).unwrap();
    use std::io::{Read, Write};
    s.write_all(req.as_bytes()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let (code, headers, body) = loop {
        let n = s.read(&mut chunk).unwrap();
        assert!(n > 0, "connection closed early");
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map(|v| v.trim().parse().unwrap())
                .unwrap_or(0);
            if buf.len() >= end + 4 + len {
                break parse_response(&buf[..end + 4 + len]);
            }
        }
    };
    assert_eq!(code, 200);
    assert_eq!(header(&headers, "x-spillway-instance"), Some("vm-a"));
    let got = received_headers(&body);
    for name in [
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "upgrade",
        "http2-settings",
        "x-auth-user",
    ] {
        assert!(
            !got.contains_key(name),
            "{name} reached the upstream: {got:?}"
        );
    }
    assert_eq!(
        got["x-forwarded-for"],
        serde_json::json!(["127.0.0.1"]),
        "the gateway's own XFF survives"
    );
    assert_eq!(got["host"], serde_json::json!(["a"]));
}

#[test]
fn c8_spoofed_forwarding_headers_from_untrusted_peers_are_replaced() {
    let api = SampleApi::start("vm-a");
    let gw = static_gateway(&[format!("http://{}", api.addr)], "");
    let (code, _, body) = http(
        gw.proxy,
        "GET",
        "/headers",
        &[
            ("X-Forwarded-For", "10.0.0.1"),
            ("X-Forwarded-Proto", "https"),
            ("X-Forwarded-Host", "admin.internal"),
        ],
        b"",
    );
    assert_eq!(code, 200);
    let got = received_headers(&body);
    assert_eq!(got["x-forwarded-for"], serde_json::json!(["127.0.0.1"]));
    assert_eq!(got["x-forwarded-proto"], serde_json::json!(["http"]));
    assert_eq!(
        got["x-forwarded-host"],
        serde_json::json!([gw.proxy.to_string()])
    );

    // From a trusted proxy the chain is kept and the peer appended.
    let trusted = static_gateway(
        &[format!("http://{}", api.addr)],
        "  trusted_proxies: [127.0.0.0/8]",
    );
    let (_, _, body) = http(
        trusted.proxy,
        "GET",
        "/headers",
        &[
            ("X-Forwarded-For", "203.0.113.7"),
            ("X-Forwarded-Proto", "https"),
        ],
        b"",
    );
    let got = received_headers(&body);
    assert_eq!(
        got["x-forwarded-for"],
        serde_json::json!(["203.0.113.7, 127.0.0.1"])
    );
    assert_eq!(got["x-forwarded-proto"], serde_json::json!(["https"]));
}

#[test]
fn c17_a_stalled_post_gets_504_and_is_never_retried() {
    let a = SampleApi::start("vm-a");
    let b = SampleApi::start("vm-b");
    let gw = static_gateway(
        &[format!("http://{}", a.addr), format!("http://{}", b.addr)],
        "  upstream_timeout_seconds: 0.5",
    );
    // Both VMs idle: the oldest (A) gets the POST, which stalls past the timeout.
    let (code, _, _) = http(gw.proxy, "POST", "/sleep?ms=3000", &[], b"side-effect");
    assert_eq!(code, 504);
    assert_eq!(
        u64_at(&a.stats(), "/by_path/~1sleep"),
        1,
        "A recorded exactly one side effect"
    );
    assert!(
        b.stats().pointer("/by_path/~1sleep").is_none(),
        "B received nothing: {}",
        b.stats()
    );
    let s = gw.status();
    assert_eq!(u64_at(&s, "/routed/function"), 0, "not spilled either");
}

#[test]
fn c17_connect_failures_retry_idempotent_requests_once_and_never_non_idempotent_ones() {
    let b = SampleApi::start("vm-b");
    let dead = format!("http://127.0.0.1:{}", free_port());
    let gw = static_gateway(&[dead, format!("http://{}", b.addr)], "");
    // POST to the dead VM (oldest, idle): nothing was sent, but POST is not retried.
    let (code, _, _) = http(gw.proxy, "POST", "/sleep?ms=1", &[], b"x");
    assert_eq!(code, 502);
    assert!(
        b.stats().pointer("/by_path/~1sleep").is_none(),
        "{}",
        b.stats()
    );
    // GET: connect failure on the dead VM, retried once on B (which takes a token).
    let gw2_dead = format!("http://127.0.0.1:{}", free_port());
    let gw2 = static_gateway(&[gw2_dead, format!("http://{}", b.addr)], "");
    let (code, headers, _) = http(gw2.proxy, "GET", "/sleep?ms=1", &[], b"");
    assert_eq!(code, 200);
    assert_eq!(header(&headers, "x-spillway-instance"), Some("vm-b"));
    let metrics =
        String::from_utf8_lossy(&http(gw2.admin, "GET", "/metrics", &[], b"").2).to_string();
    assert!(
        metrics.contains(r#"spillway_retries_total{kind="connect_failure"} 1"#),
        "{metrics}"
    );
    // The dead VM fails its probe and leaves the pool.
    gw2.wait_status("dead VM removed", LONG, |s| {
        u64_at(s, "/scaling/ready_vms") == 1
    });
}
