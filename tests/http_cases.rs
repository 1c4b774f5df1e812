//! http-cases C1, C2, C5, C6, C7, C8, C11 (b)–(c), C17 and C21–C28
//! (docs/src/design/http-cases.md): request and response validation over HTTP/1.1,
//! connection lifetime and limits on every listener (h1, h2c, TLS), upgrades,
//! half-close and a dead VM's burst, against the real gateway with sample-API
//! upstreams that report what they received (`/headers`, `/stats`) and scripted stub
//! upstreams that log every byte (`common::stub`), over raw sockets where the bytes
//! matter. The h2 side of the same rules is in `data_plane.rs`.

// Real processes on loopback: deadlines are wall-clock time.
#![allow(clippy::disallowed_methods)]

mod common;

use std::time::Duration;

use common::h2raw::{self, RawH2};
use common::stub::{Client, RawResponse, Reply, Stub, StubRequest, ok_reply};
use common::*;
use serde_json::Value;

const LONG: Duration = Duration::from_secs(60);

/// A gateway in front of a static pool of the given upstreams (by URL).
fn static_gateway(urls: &[String], extra_gateway: &str) -> Gateway {
    Gateway::start(&static_config(urls, extra_gateway))
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
    let dead = common::closed_url("");
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
    let gw2_dead = common::closed_url("");
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

// ---------------------------------------------------------------------------------------
// Request and response validation, with scripted stubs that log every byte.
// ---------------------------------------------------------------------------------------

fn raw_reply(text: &str) -> Reply {
    Reply::Raw(text.as_bytes().to_vec())
}

/// The stub behind most tests below: per path, a scripted (sometimes malformed) answer;
/// anything else gets 200 `path=<target>`.
fn scripted(req: &StubRequest) -> Reply {
    let path = req.target.split('?').next().unwrap_or("");
    match path {
        "/framing/cl-te" => raw_reply(
            "HTTP/1.1 200 OK\r\nContent-Length: 100\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        ),
        "/framing/http10" => raw_reply("HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok"),
        "/framing/gzip-chunked" => raw_reply(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        ),
        "/framing/dup-cl" => {
            raw_reply("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nok")
        }
        "/framing/204" => raw_reply("HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n"),
        "/early-hints" => raw_reply(concat!(
            "HTTP/1.1 100 Continue\r\n\r\n",
            "HTTP/1.1 102 Processing\r\n\r\n",
            "HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n",
            "HTTP/1.1 103 Early Hints\r\nLink: </b.js>; rel=preload\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
        )),
        "/ws-404" => raw_reply("HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"),
        "/ws-101" => Reply::Upgrade(
            b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
                .to_vec(),
        ),
        "/hold" => Reply::Hold,
        "/ws-101-h2c" => Reply::Upgrade(
            b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n".to_vec(),
        ),
        "/many-headers" => {
            let fields: String = (0..101).map(|i| format!("X-R{i}: v\r\n")).collect();
            Reply::Raw(format!("HTTP/1.1 200 OK\r\n{fields}Content-Length: 2\r\n\r\nok").into_bytes())
        }
        "/big-head" => Reply::Raw(
            format!(
                "HTTP/1.1 200 OK\r\nX-Big: {}\r\nContent-Length: 2\r\n\r\nok",
                "b".repeat(10_000)
            )
            .into_bytes(),
        ),
        "/garbled" => raw_reply("HTTP/1.1 2x0 OK\r\nContent-Length: 2\r\n\r\nok"),
        _ => ok_reply(req),
    }
}

/// One request on a fresh raw connection; the first response (or None if the gateway
/// closed without one).
fn one(addr: std::net::SocketAddr, bytes: &str) -> Option<RawResponse> {
    Client::connect(addr).send(bytes.as_bytes()).response()
}

fn status_of(addr: std::net::SocketAddr, bytes: &str) -> u16 {
    one(addr, bytes).map_or(0, |r| r.status)
}

/// The requests the stub saw whose target is not a probe of the harness.
fn seen(stub: &Stub) -> Vec<String> {
    stub.requests().into_iter().map(|r| r.target).collect()
}

/// Host rules on HTTP/1.1 and the absolute-form policy (the URI's
/// authority wins, RFC 9112 §3.2.2).
#[test]
fn host_rules_and_absolute_form() {
    let stub = Stub::start(scripted);
    let gw = static_gateway(&[stub.url()], "");
    for (what, req) in [
        (
            "two Host lines",
            "GET /two HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
        ),
        ("no Host", "GET /none HTTP/1.1\r\n\r\n"),
        ("invalid Host", "GET /bad HTTP/1.1\r\nHost: a b/c\r\n\r\n"),
        ("userinfo", "GET /bad HTTP/1.1\r\nHost: u@a\r\n\r\n"),
        ("bad port", "GET /bad HTTP/1.1\r\nHost: a:99999\r\n\r\n"),
        ("empty Host", "GET /bad HTTP/1.1\r\nHost:\r\n\r\n"),
        (
            "absolute-form without Host",
            "GET http://a/x HTTP/1.1\r\n\r\n",
        ),
    ] {
        let mut c = Client::connect(gw.proxy);
        let r = c.send(req.as_bytes()).response().expect(what);
        assert_eq!(r.status, 400, "{what}");
        assert_eq!(r.get("connection"), Some("close"), "{what}");
        assert!(c.closed(), "{what}: connection left open");
    }
    assert!(stub.requests().is_empty(), "{:?}", seen(&stub));

    // Absolute-form: the upstream gets Host and X-Forwarded-Host = the URI's authority,
    // and an origin-form target.
    let r = one(
        gw.proxy,
        "GET http://internal.example/admin?x=1 HTTP/1.1\r\nHost: public.example\r\n\r\n",
    )
    .unwrap();
    assert_eq!(r.status, 200);
    let got = stub.requests_to("/admin?x=1");
    assert_eq!(got.len(), 1, "{:?}", seen(&stub));
    assert_eq!(got[0].all("host"), ["internal.example"]);
    assert_eq!(got[0].all("x-forwarded-host"), ["internal.example"]);

    // HTTP/1.0 may omit Host: the upstream then gets the upstream's own authority.
    let r = one(gw.proxy, "GET /ten HTTP/1.0\r\n\r\n").unwrap();
    assert_eq!(r.status, 200);
    let got = stub.requests_to("/ten");
    assert_eq!(got[0].all("host"), [stub.addr.to_string()]);
    assert!(got[0].get("x-forwarded-host").is_none());
}

/// Dot-segments are resolved before routing and before a function
/// tier's base path is joined, so no request leaves `/fn/api`; ambiguous forms are
/// refused.
#[test]
fn paths_are_normalized_and_never_leave_the_function_base_path() {
    let stub = Stub::start(scripted);
    let gw = Gateway::start(&function_http_config(&format!("{}/fn/api", stub.url()), ""));
    for (sent, upstream) in [
        ("/public/../admin", "/fn/api/admin"),
        ("/../other-function/x", "/fn/api/other-function/x"),
        (
            "/a/%2e%2E/%2E%2e/other-function/x?q=/../",
            "/fn/api/other-function/x?q=/../",
        ),
        ("/a/./b//c/", "/fn/api/a/b/c/"),
        ("/%7Euser/%41b%c3%a9", "/fn/api/~user/Ab%C3%A9"),
        ("/a/b/..", "/fn/api/a/"),
    ] {
        let r = one(gw.proxy, &format!("GET {sent} HTTP/1.1\r\nHost: a\r\n\r\n")).unwrap();
        assert_eq!(r.status, 200, "{sent}");
        assert_eq!(
            String::from_utf8_lossy(&r.body),
            format!("path={upstream}"),
            "{sent}"
        );
    }
    for refused in [
        "/a/..%2F..%2Fother-function",
        "/a/%5C..%5Cother",
        "/a\\..\\other",
        "/public/..;/admin",
        "/a/%2e%2e%3bx/b",
        "/a%00b",
        "/a%zz",
    ] {
        let r = one(
            gw.proxy,
            &format!("GET {refused} HTTP/1.1\r\nHost: a\r\n\r\n"),
        );
        assert_eq!(r.map(|r| r.status), Some(400), "{refused}");
    }
    let all = seen(&stub);
    assert_eq!(all.len(), 6, "{all:?}");
    assert!(all.iter().all(|t| t.starts_with("/fn/api/")), "{all:?}");
}

/// Path options: without normalization a dot-segment is refused (never
/// forwarded); `keep_unchanged` forwards escaped slashes as sent; `unescape_and_redirect`
/// answers 307 with the normalized path.
#[test]
fn path_options_change_what_is_forwarded_refused_or_redirected() {
    let stub = Stub::start(scripted);
    let raw = static_gateway(
        &[stub.url()],
        "  normalize_path: false\n  merge_slashes: false\n  path_with_escaped_slashes_action: keep_unchanged",
    );
    for path in ["/a/../b", "/a/./b", "/a/%2E%2e/b", "/x/.."] {
        let r = one(
            raw.proxy,
            &format!("GET {path} HTTP/1.1\r\nHost: a\r\n\r\n"),
        );
        assert_eq!(r.map(|r| r.status), Some(400), "{path}");
    }
    for path in ["/a%2fb//c%7e", "/a\\b"] {
        let r = one(
            raw.proxy,
            &format!("GET {path} HTTP/1.1\r\nHost: a\r\n\r\n"),
        )
        .unwrap();
        assert_eq!(String::from_utf8_lossy(&r.body), format!("path={path}"));
    }
    assert_eq!(seen(&stub), ["/a%2fb//c%7e", "/a\\b"]);

    let redirect = static_gateway(
        &[stub.url()],
        "  path_with_escaped_slashes_action: unescape_and_redirect",
    );
    let r = one(
        redirect.proxy,
        "GET /a%2F..%2Fb%5Cc?q=1 HTTP/1.1\r\nHost: a\r\n\r\n",
    )
    .unwrap();
    assert_eq!(r.status, 307);
    assert_eq!(r.get("location"), Some("/b/c?q=1"));
    let forward = static_gateway(
        &[stub.url()],
        "  path_with_escaped_slashes_action: unescape_and_forward",
    );
    let r = one(
        forward.proxy,
        "GET /x/a%2F..%2Fb HTTP/1.1\r\nHost: a\r\n\r\n",
    )
    .unwrap();
    assert_eq!(String::from_utf8_lossy(&r.body), "path=/x/b");
}

fn padded_request(target: &str, fields: &[(String, String)]) -> String {
    let mut req = format!("GET {target} HTTP/1.1\r\nHost: a\r\n");
    for (k, v) in fields {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req
}

/// Header limits and http-cases C11 (b), (c) on HTTP/1.1: `max_header_bytes`,
/// `max_header_count` and `max_uri_bytes`, exactly at and one past the limit, and the
/// literal cases against the defaults (16 KiB, 100).
#[test]
fn c11_header_and_target_limits_http1() {
    let stub = Stub::start(scripted);
    let gw = static_gateway(
        &[stub.url()],
        "  max_header_bytes: 2048\n  max_header_count: 20\n  max_uri_bytes: 1024",
    );
    // Host: a = 4 + 1 + 4 = 9 bytes; x-pad: V = 5 + |V| + 4.
    let pad = |n: usize| vec![("x-pad".to_string(), "v".repeat(n))];
    assert_eq!(
        status_of(gw.proxy, &padded_request("/h-at", &pad(2048 - 9 - 9))),
        200
    );
    assert_eq!(
        status_of(gw.proxy, &padded_request("/h-over", &pad(2049 - 9 - 9))),
        431
    );
    // 20 fields (Host + 19) pass, 21 do not.
    let many = |n: usize| {
        (0..n)
            .map(|i| (format!("x-{i}"), "1".to_string()))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        status_of(gw.proxy, &padded_request("/n-at", &many(19))),
        200
    );
    assert_eq!(
        status_of(gw.proxy, &padded_request("/n-over", &many(20))),
        431
    );
    // A 1024-byte target passes, 1025 bytes get 414; one far past the head buffer, 431.
    let target = |n: usize| format!("/u{}", "u".repeat(n - 2));
    assert_eq!(
        status_of(gw.proxy, &padded_request(&target(1024), &[])),
        200
    );
    assert_eq!(
        status_of(gw.proxy, &padded_request(&target(1025), &[])),
        414
    );
    assert_eq!(
        status_of(gw.proxy, &padded_request(&target(100_000), &[])),
        431
    );
    let got = seen(&stub);
    assert_eq!(got.len(), 3, "only the requests at the limits passed");
    assert!(got.contains(&"/h-at".to_string()) && got.contains(&"/n-at".to_string()));

    // C11 (b), (c) with the defaults.
    let defaults = static_gateway(&[stub.url()], "");
    let big = vec![("x-big".to_string(), "b".repeat(100 * 1024))];
    let mut c = Client::connect(defaults.proxy);
    let r = c.send(padded_request("/c11b", &big).as_bytes()).response();
    assert_eq!(r.map(|r| r.status), Some(431), "C11 (b)");
    assert!(c.closed());
    assert_eq!(
        status_of(defaults.proxy, &padded_request("/c11c", &many(199))),
        431,
        "C11 (c)"
    );
    // Just under the default: 16 KiB of header section passes.
    let r = status_of(
        defaults.proxy,
        &padded_request("/c11-ok", &pad(16 * 1024 - 18)),
    );
    assert_eq!(r, 200);
    assert!(stub.requests_to("/c11b").is_empty() && stub.requests_to("/c11c").is_empty());
}

/// CONNECT gets 405 with Allow (no tunnel is offered), request-target
/// forms are checked per method (RFC 9112 §3.2), `OPTIONS *` is answered locally.
#[test]
fn connect_and_request_target_forms() {
    let stub = Stub::start(scripted);
    let gw = static_gateway(&[stub.url()], "");
    let mut c = Client::connect(gw.proxy);
    let r = c
        .send(b"CONNECT internal.example:443 HTTP/1.1\r\nHost: internal.example:443\r\n\r\n\x16\x03\x01")
        .response()
        .expect("a response to CONNECT");
    assert_eq!(r.status, 405);
    assert_eq!(
        r.get("allow"),
        Some("GET, HEAD, POST, PUT, DELETE, OPTIONS, TRACE, PATCH")
    );
    assert!(
        c.closed(),
        "closed after the 405: no tunnel bytes are read as HTTP"
    );

    for (what, req) in [
        ("asterisk with GET", "GET * HTTP/1.1\r\nHost: a\r\n\r\n"),
        (
            "authority-form with GET",
            "GET a:80 HTTP/1.1\r\nHost: a\r\n\r\n",
        ),
        (
            "absolute-form, other scheme",
            "GET ftp://a/x HTTP/1.1\r\nHost: a\r\n\r\n",
        ),
    ] {
        assert_eq!(status_of(gw.proxy, req), 400, "{what}");
    }
    let r = one(gw.proxy, "OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
    assert_eq!(r.status, 204);
    assert_eq!(
        r.get("allow"),
        Some("GET, HEAD, POST, PUT, DELETE, OPTIONS, TRACE, PATCH")
    );
    // OPTIONS on a resource, and extension methods, are forwarded.
    assert_eq!(
        status_of(gw.proxy, "OPTIONS /res HTTP/1.1\r\nHost: a\r\n\r\n"),
        200
    );
    assert_eq!(
        status_of(gw.proxy, "PURGE /res HTTP/1.1\r\nHost: a\r\n\r\n"),
        200
    );
    let methods: Vec<String> = stub.requests().into_iter().map(|r| r.method).collect();
    assert_eq!(methods, ["OPTIONS", "PURGE"]);
}

/// On HTTP/1.1: several Cookie lines reach the upstream as one.
#[test]
fn cookie_lines_are_joined() {
    let stub = Stub::start(scripted);
    let gw = static_gateway(&[stub.url()], "");
    let r = one(
        gw.proxy,
        "GET /c HTTP/1.1\r\nHost: a\r\nCookie: s=1\r\nCookie: t=2; u=3\r\n\r\n",
    )
    .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(stub.requests_to("/c")[0].all("cookie"), ["s=1; t=2; u=3"]);
}

/// On HTTP/1.1: Transfer-Encoding wins over Content-Length, other
/// transfer codings are refused, the status line is the gateway's HTTP/1.1, upstream
/// 1xx responses never break the exchange (103 is dropped).
#[test]
fn response_framing_and_informational_responses() {
    let stub = Stub::start(scripted);
    let gw = static_gateway(&[stub.url()], "");
    let mut c = Client::connect(gw.proxy);
    let get = |c: &mut Client, path: &str| {
        c.send(format!("GET {path} HTTP/1.1\r\nHost: a\r\n\r\n").as_bytes())
            .response()
            .unwrap_or_else(|| panic!("no response to {path}"))
    };
    // The issue's example: Content-Length: 100 and a 5-byte chunked body.
    let r = get(&mut c, "/framing/cl-te");
    assert_eq!(r.status, 200);
    assert_eq!(r.get("content-length"), None);
    assert_eq!(r.get("transfer-encoding"), Some("chunked"));
    assert_eq!(r.body, b"hello");
    // An HTTP/1.0 upstream: the client still gets an HTTP/1.1 status line.
    let r = get(&mut c, "/framing/http10");
    assert_eq!(r.status_line, "HTTP/1.1 200 OK");
    assert_eq!(r.body, b"ok");
    // Repeated equal lengths become one; a 204 carries none.
    let r = get(&mut c, "/framing/dup-cl");
    let lengths: Vec<_> = r
        .headers
        .iter()
        .filter(|(k, _)| k == "content-length")
        .collect();
    assert_eq!(lengths.len(), 1, "{:?}", r.headers);
    assert_eq!(r.body, b"ok");
    let r = get(&mut c, "/framing/204");
    assert_eq!((r.status, r.get("content-length")), (204, None));
    // 100, 102 and two 103s before the 200: one response, no Link from the 103s.
    let r = get(&mut c, "/early-hints");
    assert_eq!((r.status, r.body.as_slice()), (200, &b"ok"[..]));
    assert_eq!(r.get("link"), None);
    // The connection is still good for the next exchange.
    let r = get(&mut c, "/after");
    assert_eq!(String::from_utf8_lossy(&r.body), "path=/after");
    // A transfer coding hyper does not remove (gzip) cannot be forwarded faithfully.
    let r = get(&mut c, "/framing/gzip-chunked");
    assert_eq!(r.status, 502);
}

/// Every client-supplied identity or origin header is replaced or
/// removed for an untrusted peer, kept for a trusted proxy; `Forwarded` carries the
/// gateway's own element.
#[test]
fn client_identity_headers_are_replaced_or_stripped_unless_trusted() {
    let stub = Stub::start(scripted);
    let spoofed = [
        "X-Forwarded-For",
        "X-Forwarded-Proto",
        "X-Forwarded-Host",
        "X-Forwarded-Port",
        "X-Forwarded-Prefix",
        "Forwarded",
        "X-Real-IP",
        "X-Client-IP",
        "True-Client-IP",
        "CF-Connecting-IP",
        "Fastly-Client-IP",
        "X-Cluster-Client-IP",
        "X-Original-Forwarded-For",
        "X-Forwarded-Server",
        "X-Forwarded-Ssl",
        "X-Forwarded-Scheme",
        "Front-End-Https",
        "X-Original-URL",
        "X-Rewrite-URL",
        "X-Original-Host",
        "Client-IP",
    ];
    let mut req = "GET /id HTTP/1.1\r\nHost: api.example\r\n".to_string();
    for name in spoofed {
        req.push_str(&format!("{name}: 10.6.6.6\r\n"));
    }
    req.push_str("\r\n");
    let gw = static_gateway(&[stub.url()], "");
    assert_eq!(status_of(gw.proxy, &req), 200);
    let got = &stub.requests_to("/id")[0];
    for name in spoofed {
        for v in got.all(&name.to_ascii_lowercase()) {
            assert!(!v.contains("10.6.6.6"), "{name}: {v} reached the upstream");
        }
    }
    assert_eq!(got.all("x-forwarded-for"), ["127.0.0.1"]);
    assert_eq!(got.all("x-forwarded-proto"), ["http"]);
    assert_eq!(got.all("x-forwarded-host"), ["api.example"]);
    assert_eq!(
        got.all("forwarded"),
        ["for=127.0.0.1;host=api.example;proto=http"]
    );
    assert!(got.get("x-real-ip").is_none() && got.get("x-original-url").is_none());

    let trusted = static_gateway(&[stub.url()], "  trusted_proxies: [127.0.0.0/8]");
    assert_eq!(
        status_of(trusted.proxy, &req.replace("/id", "/id-trusted")),
        200
    );
    let got = &stub.requests_to("/id-trusted")[0];
    assert_eq!(got.all("x-real-ip"), ["10.6.6.6"]);
    assert_eq!(got.all("x-forwarded-for"), ["10.6.6.6, 127.0.0.1"]);
    assert_eq!(
        got.all("forwarded"),
        ["10.6.6.6, for=127.0.0.1;host=api.example;proto=http"]
    );
}

/// http-cases C1 and C2: smuggling-shaped framing never gets a second request to the
/// upstream, and the upstream never sees both framing headers or `,chunked`.
#[test]
fn c1_c2_ambiguous_request_framing() {
    let stub = Stub::start(scripted);
    let gw = static_gateway(&[stub.url()], "");
    let smuggled = "GET /admin HTTP/1.1\r\nHost: a\r\n\r\n";
    // C1: hyper reads the body as chunked, drops Content-Length, closes after answering.
    let mut c = Client::connect(gw.proxy);
    c.send(
        format!("POST /c1 HTTP/1.1\r\nHost: a\r\nContent-Length: 37\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n{smuggled}")
            .as_bytes(),
    );
    let first = c.response().expect("C1 response");
    assert!(matches!(first.status, 200 | 400), "{first:?}");
    assert!(
        c.responses_until_close().is_empty(),
        "C1: a second response"
    );
    // C2 (a): chunked then gzip: the final coding is not chunked → 400.
    let mut c = Client::connect(gw.proxy);
    c.send(
        format!("POST /c2a HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: gzip\r\n\r\n0\r\n\r\n{smuggled}")
            .as_bytes(),
    );
    assert_eq!(c.response().map(|r| r.status), Some(400), "C2 (a)");
    assert!(c.responses_until_close().is_empty());
    // C2 (b): `,chunked` with Content-Length.
    let mut c = Client::connect(gw.proxy);
    c.send(
        format!("POST /c2b HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: ,chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n{smuggled}")
            .as_bytes(),
    );
    let first = c.response().expect("C2 (b) response");
    assert!(matches!(first.status, 200 | 400), "{first:?}");
    assert!(
        c.responses_until_close().is_empty(),
        "C2 (b): a second response"
    );
    // C2 (c): HTTP/1.0 POST without a length: empty body, answered, closed.
    let mut c = Client::connect(gw.proxy);
    c.send(b"POST /c2c HTTP/1.0\r\nHost: a\r\n\r\nGET /admin HTTP/1.0\r\n\r\n");
    let r = c.response().expect("C2 (c) response");
    assert_eq!(r.status, 200);
    assert!(
        c.responses_until_close().is_empty(),
        "C2 (c): a second response"
    );
    // Transfer-Encoding in HTTP/1.0 is faulty framing (RFC 9112 §6.1) → 400, closed.
    let mut c = Client::connect(gw.proxy);
    c.send(
        format!(
            "POST /c2d HTTP/1.0\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n{smuggled}"
        )
        .as_bytes(),
    );
    assert_eq!(c.response().map(|r| r.status), Some(400), "TE in HTTP/1.0");
    assert!(c.responses_until_close().is_empty());
    let c2c = stub.requests_to("/c2c");
    assert_eq!(c2c.len(), 1);
    assert!(c2c[0].body.is_empty());

    assert!(stub.requests_to("/admin").is_empty(), "{:?}", seen(&stub));
    for r in stub.requests() {
        let framing = r.get("content-length").is_some() && r.get("transfer-encoding").is_some();
        assert!(!framing, "both framing headers reached the upstream: {r:?}");
        assert!(
            r.headers.iter().all(|(_, v)| !v.contains(",chunked")),
            "{r:?}"
        );
    }
}

/// The C5 request: `target` with a 32-byte body that is itself a request.
fn c5_request(method: &str, target: &str, extra: &str, body: &str) -> String {
    format!(
        "{method} {target} HTTP/1.1\r\nHost: a\r\nContent-Length: {}\r\n{extra}\r\n{body}",
        body.len()
    )
}

const C5_BODY: &str = "GET /admin HTTP/1.1\r\nHost: a\r\n\r\n";

/// Send the C5 request, expect `status` first; then a probe on the same connection. The
/// body must have been drained (the probe is the only other response) or the
/// connection closed (no other response): the embedded GET never runs.
fn assert_c5(addr: std::net::SocketAddr, what: &str, req: &str, status: u16) {
    let mut c = Client::connect(addr);
    let first = c.send(req.as_bytes()).response();
    assert_eq!(
        first.as_ref().map(|r| r.status),
        Some(status),
        "{what}: {first:?}"
    );
    c.send(b"GET /probe HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
    let rest = c.responses_until_close();
    assert!(
        rest.len() <= 1,
        "{what}: {} more responses: {rest:?}",
        rest.len()
    );
}

/// http-cases C5 for every reply the gateway makes itself: 400, 405, 413, 414, 431, 204
/// (`OPTIONS *`), 307 (redirect), 502, 503, 504. Exactly one response to the request;
/// its body never runs as a request.
#[test]
fn c5_every_local_reply_drains_or_closes() {
    assert_eq!(C5_BODY.len(), 32);
    let stub = Stub::start(scripted);
    let gw = static_gateway(
        &[stub.url()],
        "  max_body_bytes: 36\n  max_uri_bytes: 64\n  max_header_count: 10\n  upstream_timeout_seconds: 0.5\n  path_with_escaped_slashes_action: unescape_and_redirect",
    );
    let cases: Vec<(&str, String, u16)> = vec![
        (
            "400 bad Host",
            c5_request("POST", "/x", "", C5_BODY).replacen("Host: a", "Host: a b", 1),
            400,
        ),
        ("400 path", c5_request("POST", "/..;/x", "", C5_BODY), 400),
        (
            "405 CONNECT",
            c5_request("CONNECT", "a:443", "", C5_BODY).replacen("Host: a", "Host: a:443", 1),
            405,
        ),
        (
            "413 body",
            c5_request("POST", "/x", "", &format!("{C5_BODY}12345")),
            413,
        ),
        (
            "414 target",
            c5_request("POST", &format!("/{}", "u".repeat(80)), "", C5_BODY),
            414,
        ),
        (
            "431 fields",
            c5_request("POST", "/x", &"X-N: 1\r\n".repeat(10), C5_BODY),
            431,
        ),
        (
            "204 OPTIONS *",
            c5_request("OPTIONS", "*", "", C5_BODY),
            204,
        ),
        (
            "307 redirect",
            c5_request("POST", "/a%2Fb", "", C5_BODY),
            307,
        ),
        ("504 timeout", c5_request("POST", "/hold", "", C5_BODY), 504),
    ];
    for (what, req, status) in &cases {
        assert_c5(gw.proxy, what, req, *status);
    }
    // The upstream saw only the 504's POST (its body read as a body) and probes.
    for r in stub.requests() {
        assert!(matches!(r.target.as_str(), "/hold" | "/probe"), "{r:?}");
    }
    assert_eq!(stub.requests_to("/hold")[0].body, C5_BODY.as_bytes());

    // 502: the only VM refuses connections; the POST is not retried.
    let dead = common::closed_url("");
    let gw = static_gateway(&[dead], "");
    assert_c5(gw.proxy, "502", &c5_request("POST", "/x", "", C5_BODY), 502);
    // 503: an Upgrade is pinned to VMs and there is none.
    let gw = Gateway::start(&process_config(
        "  decision_epochs: 1000\n  min_vms: 0\n  cip_rps: 0",
        "",
    ));
    let req = c5_request(
        "POST",
        "/ws",
        "Connection: Upgrade\r\nUpgrade: websocket\r\n",
        C5_BODY,
    );
    assert_c5(gw.proxy, "503", &req, 503);
}

/// http-cases C6: bytes after an Upgrade request are tunnelled only after an upstream
/// 101; after any other answer they are the next, ordinary, proxied request.
#[test]
fn c6_upgrade_tunnels_only_after_a_101() {
    let stub = Stub::start(scripted);
    let gw = static_gateway(&[stub.url()], "");
    let upgrade = |path: &str| {
        format!(
            "GET {path} HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
        )
    };
    let mut c = Client::connect(gw.proxy);
    c.send(
        format!(
            "{}GET /admin HTTP/1.1\r\nHost: a\r\n\r\n",
            upgrade("/ws-404")
        )
        .as_bytes(),
    );
    assert_eq!(c.response().map(|r| r.status), Some(404));
    let next = c.response().expect("the pipelined request is answered");
    assert_eq!(String::from_utf8_lossy(&next.body), "path=/admin");
    let admin = stub.requests_to("/admin");
    assert_eq!(admin.len(), 1);
    assert_eq!(
        admin[0].all("x-forwarded-for"),
        ["127.0.0.1"],
        "proxied, not tunnelled"
    );
    assert!(admin[0].get("upgrade").is_none());

    // After a 101 the same bytes are tunnelled: the stub echoes them back raw.
    let mut c = Client::connect(gw.proxy);
    c.send(format!("{}GET /tunnelled HTTP/1.1\r\n\r\n", upgrade("/ws-101")).as_bytes());
    let r = c.response_to(true).expect("101");
    assert_eq!(r.status, 101);
    let mut echoed = Vec::new();
    while echoed.len() < "GET /tunnelled HTTP/1.1\r\n\r\n".len() {
        let more = c.read_some();
        assert!(!more.is_empty(), "tunnel closed early: {echoed:?}");
        echoed.extend(more);
    }
    assert_eq!(echoed, b"GET /tunnelled HTTP/1.1\r\n\r\n");
    assert!(stub.requests_to("/tunnelled").is_empty());
}

// ---------------------------------------------------------------------------------------
// Connection lifetime: keep-alive idle timeout, first-request and header-read deadlines
// on every listener and protocol, connection limits.
// ---------------------------------------------------------------------------------------

fn get(path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: a\r\n\r\n")
}

/// A gateway with a TLS listener (self-signed `localhost`).
struct TlsGateway {
    gw: Gateway,
    tls: std::net::SocketAddr,
    cert: rustls::pki_types::CertificateDer<'static>,
    _dir: tempfile::TempDir,
}

impl TlsGateway {
    fn start(stub: &Stub, extra: &str) -> TlsGateway {
        let dir = tempfile::tempdir().unwrap();
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
        let cert_file = dir.path().join("cert.pem");
        let key_file = dir.path().join("key.pem");
        std::fs::write(&cert_file, cert.cert.pem()).unwrap();
        std::fs::write(&key_file, cert.signing_key.serialize_pem()).unwrap();
        let port = free_port();
        let gw = static_gateway(
            &[stub.url()],
            &format!(
                "{extra}\n  tls:\n    listen: 127.0.0.1:{port}\n    cert_file: {}\n    key_file: {}",
                cert_file.display(),
                key_file.display()
            ),
        );
        TlsGateway {
            gw,
            tls: format!("127.0.0.1:{port}").parse().unwrap(),
            cert: cert.cert.der().clone(),
            _dir: dir,
        }
    }

    /// A client configuration trusting the certificate and offering `alpn`.
    fn client(&self, alpn: &[&[u8]]) -> std::sync::Arc<rustls::ClientConfig> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.cert.clone()).unwrap();
        let mut c = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        c.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        std::sync::Arc::new(c)
    }
}

/// A completed TLS handshake to `addr` (blocking).
fn tls_connect(
    addr: std::net::SocketAddr,
    config: std::sync::Arc<rustls::ClientConfig>,
) -> rustls::StreamOwned<rustls::ClientConnection, std::net::TcpStream> {
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let conn = rustls::ClientConnection::new(config, name).unwrap();
    let tcp = std::net::TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while tls.conn.is_handshaking() {
        assert!(std::time::Instant::now() < deadline, "TLS handshake");
        match tls.conn.complete_io(&mut tls.sock) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(e) => panic!("TLS handshake: {e}"),
        }
    }
    tls
}

/// Whether the server closed `s` within `within` (reads and discards until EOF; the
/// stream has a short read timeout).
fn closed_within(s: &mut impl std::io::Read, within: Duration) -> bool {
    let deadline = std::time::Instant::now() + within;
    let mut chunk = [0u8; 4096];
    loop {
        match s.read(&mut chunk) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return true,
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
    }
}

/// HTTP/1.1 keep-alive: a connection idle between requests for longer than the header
/// read timeout (but less than `keepalive_idle_timeout_seconds`) is still served — a load
/// balancer reusing it gets an answer, not a reset — and is closed once idle past the
/// idle timeout; a next request whose head trickles in is cut at the header read timeout.
#[test]
fn keepalive_idle_connections_outlive_the_header_timeout_and_close_when_idle() {
    let stub = Stub::start(scripted);
    let gw = static_gateway(
        &[stub.url()],
        "  header_read_timeout_seconds: 0.5\n  keepalive_idle_timeout_seconds: 3",
    );
    let mut c = Client::connect(gw.proxy);
    let r = c.send(get("/first").as_bytes()).response().expect("first");
    assert_eq!(r.status, 200);
    // The client's own pause between requests (3× the header read timeout), not a wait
    // for the gateway.
    std::thread::sleep(Duration::from_millis(1500));
    let r = c
        .send(get("/after-a-pause").as_bytes())
        .response()
        .expect("the connection is still served after 1.5 s idle");
    assert_eq!(String::from_utf8_lossy(&r.body), "path=/after-a-pause");
    let idle_from = std::time::Instant::now();
    assert!(c.closed_within(LONG), "idle connection never closed");
    let idle = idle_from.elapsed();
    assert!(
        idle >= Duration::from_millis(2500),
        "closed after {idle:?} idle, before keepalive_idle_timeout_seconds (3 s)"
    );

    // A next request that starts and then trickles: the header read timeout applies
    // from its first byte, not the idle timeout.
    let mut c = Client::connect(gw.proxy);
    assert_eq!(
        c.send(get("/one").as_bytes()).response().unwrap().status,
        200
    );
    c.send(b"GET /slow HTTP/1.1\r\n");
    let started = std::time::Instant::now();
    let mut dripped = 0;
    while !c.closed_within(Duration::from_millis(100)) {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "dripping head held open"
        );
        c.send(b"X");
        dripped += 1;
    }
    assert!(
        started.elapsed() < Duration::from_millis(2500),
        "a trickling head was held {:?} ({dripped} bytes): the idle timeout applied, not the header read timeout",
        started.elapsed()
    );
    assert!(stub.requests_to("/slow").is_empty());
}

/// h2 (prior knowledge): idle = no open stream. A connection with no stream for less
/// than the idle timeout still takes a new stream; past it the gateway sends GOAWAY and
/// closes. A client that stops answering the gateway's keep-alive PINGs is closed while
/// a stream is still open.
#[test]
fn h2_idle_means_no_open_stream_and_unanswered_pings_close_the_connection() {
    let stub = Stub::start(scripted);
    let gw = static_gateway(
        &[stub.url()],
        "  header_read_timeout_seconds: 0.5\n  keepalive_idle_timeout_seconds: 3\n  http2_keepalive_interval_seconds: 0",
    );
    let mut h2 = RawH2::connect(gw.proxy);
    let get = |id: u32, path: &str| {
        h2raw::frame(
            h2raw::HEADERS,
            h2raw::END_STREAM | h2raw::END_HEADERS,
            id,
            &h2raw::request_block("GET", path, "a"),
        )
    };
    assert!(h2.send(&get(1, "/h2-first")));
    h2.wait("first answer", LONG, |s| s.answered.contains(&1));
    std::thread::sleep(Duration::from_millis(1500)); // the client's pause
    assert!(h2.send(&get(3, "/h2-again")));
    h2.wait("answer after 1.5 s idle", LONG, |s| s.answered.contains(&3));
    let idle_from = std::time::Instant::now();
    let s = h2.wait("GOAWAY and close when idle", LONG, |s| {
        s.goaway.is_some() && s.closed
    });
    assert_eq!(s.goaway.map(|g| g.1), Some(0), "GOAWAY NO_ERROR: {s:?}");
    assert!(idle_from.elapsed() >= Duration::from_millis(2500));
    assert_eq!(
        stub.requests_to("/h2-first").len() + stub.requests_to("/h2-again").len(),
        2
    );

    // PINGs every 0.3 s, unanswered within 0.5 s: closed though a stream is open.
    let pinging = static_gateway(
        &[stub.url()],
        "  keepalive_idle_timeout_seconds: 300\n  http2_keepalive_interval_seconds: 0.3\n  http2_keepalive_timeout_seconds: 0.5",
    );
    let mut h2 = RawH2::connect(pinging.proxy);
    assert!(h2.send(&get(1, "/hold")));
    let s = h2.wait("PING, then close", LONG, |s| s.closed);
    assert!(s.pings >= 1, "{s:?}");
}

/// The first-request deadline on every listener and protocol: a connection that sends
/// no complete request head within `header_read_timeout_seconds` of accept is closed —
/// plain HTTP/1.1 (nothing, or a partial head), h2c after the preface and SETTINGS, TLS
/// without a handshake, TLS after the handshake with ALPN http/1.1, and TLS h2 after the
/// preface. Nothing reaches the upstream.
#[test]
fn first_request_deadline_on_every_listener_and_protocol() {
    use std::io::Write;
    let stub = Stub::start(scripted);
    let t = TlsGateway::start(
        &stub,
        "  header_read_timeout_seconds: 0.5\n  keepalive_idle_timeout_seconds: 300",
    );
    let (gw, tls_addr) = (&t.gw, t.tls);
    let tls_config = |alpn: &[&[u8]]| t.client(alpn);
    let within = Duration::from_secs(20);
    let preface = {
        let mut p = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        p.extend(h2raw::frame(h2raw::SETTINGS, 0, 0, &[]));
        p
    };
    // Plain: silent, and a partial head.
    let mut silent = Client::connect(gw.proxy);
    let mut partial = Client::connect(gw.proxy);
    partial.send(b"GET /partial HTTP/1.1\r\nHost: a\r\n");
    let mut h2c = Client::connect(gw.proxy);
    h2c.send(&preface);
    // TLS: TCP only; handshake then nothing (http/1.1 and h2); h2 preface.
    let mut tcp_only = std::net::TcpStream::connect(tls_addr).unwrap();
    tcp_only
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let mut tls_h1 = tls_connect(tls_addr, tls_config(&[b"http/1.1"]));
    let mut tls_h2 = tls_connect(tls_addr, tls_config(&[b"h2"]));
    assert_eq!(tls_h2.conn.alpn_protocol(), Some(&b"h2"[..]));
    tls_h2.write_all(&preface).unwrap();
    tls_h2.flush().unwrap();

    assert!(silent.closed_within(within), "plain, silent");
    assert!(partial.closed_within(within), "plain, partial head");
    assert!(h2c.closed_within(within), "h2c after the preface");
    assert!(closed_within(&mut tcp_only, within), "TLS, no handshake");
    assert!(closed_within(&mut tls_h1, within), "TLS http/1.1, silent");
    assert!(
        closed_within(&mut tls_h2, within),
        "TLS h2 after the preface"
    );
    // (The gateway's own health probes ask for `/`.)
    assert!(seen(&stub).iter().all(|t| t == "/"), "{:?}", seen(&stub));

    // A TLS connection that does send a request is served, and kept past the header
    // read timeout while idle.
    let mut tls = tls_connect(tls_addr, tls_config(&[b"http/1.1"]));
    tls.write_all(get("/tls").as_bytes()).unwrap();
    tls.flush().unwrap();
    std::thread::sleep(Duration::from_millis(1500)); // the client's pause
    tls.write_all(get("/tls-again").as_bytes()).unwrap();
    tls.flush().unwrap();
    stub.wait("both TLS requests", LONG, |s| {
        s.requests_to("/tls-again").len() == 1
    });
    assert_eq!(stub.requests_to("/tls").len(), 1);
    let metrics =
        String::from_utf8_lossy(&http(gw.admin, "GET", "/metrics", &[], b"").2).to_string();
    let first_request = metric(
        &metrics,
        "spillway_timeouts_total",
        &[r#"kind="first_request""#],
    );
    assert!(first_request >= 6.0, "{first_request}");
}

/// The value of the first series of `name` whose labels contain every one of `labels`.
fn metric(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && labels.iter().all(|want| l.contains(want)))
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} {labels:?} in\n{text}"))
}

/// A connection to `addr` from the loopback source address `src` (127.0.0.0/8 is all
/// loopback: other client IPs without leaving the host).
fn connect_from(src: &str, addr: std::net::SocketAddr) -> Client {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .unwrap();
    let stream = rt.block_on(async {
        let s = tokio::net::TcpSocket::new_v4().unwrap();
        s.bind(format!("{src}:0").parse().unwrap()).unwrap();
        s.connect(addr).await.unwrap().into_std().unwrap()
    });
    stream.set_nonblocking(false).unwrap();
    Client::from_stream(stream)
}

/// `gateway.max_connections` and `max_connections_per_client_ip`, with connections held
/// idle for less than the keep-alive idle timeout: one connection over either limit is
/// closed at accept (metric, log line), other clients are still served while one client
/// is at its cap, the admin listener answers while the proxy is full, and a closed
/// connection frees its place.
#[test]
fn connection_limits_close_connections_over_the_total_and_per_client_ip() {
    let stub = Stub::start(scripted);
    let gw = static_gateway(
        &[stub.url()],
        "  max_connections: 5\n  max_connections_per_client_ip: 3\n  keepalive_idle_timeout_seconds: 300",
    );
    let served = |c: &mut Client, path: &str| {
        c.send(get(path).as_bytes())
            .response()
            .is_some_and(|r| r.status == 200)
    };
    let mut held: Vec<Client> = Vec::new();
    for i in 0..3 {
        let mut c = connect_from("127.0.0.1", gw.proxy);
        assert!(served(&mut c, &format!("/a{i}")), "connection {i} from .1");
        held.push(c);
    }
    // A fourth from the same client: closed at accept, never reaches the upstream.
    let mut over_ip = connect_from("127.0.0.1", gw.proxy);
    assert!(!served(&mut over_ip, "/a-over"), "over the per-IP cap");
    // Another client is served up to the total.
    for i in 0..2 {
        let mut c = connect_from("127.0.0.2", gw.proxy);
        assert!(served(&mut c, &format!("/b{i}")), "connection {i} from .2");
        held.push(c);
    }
    let mut over_total = connect_from("127.0.0.3", gw.proxy);
    assert!(!served(&mut over_total, "/c-over"), "over max_connections");
    // The admin listener has its own budget.
    assert!(gw.status()["scaling"].is_object());
    let metrics =
        String::from_utf8_lossy(&http(gw.admin, "GET", "/metrics", &[], b"").2).to_string();
    assert_eq!(
        metric(
            &metrics,
            "spillway_connections_refused_total",
            &[
                r#"limit="max_connections_per_client_ip""#,
                r#"listener="proxy""#
            ]
        ),
        1.0
    );
    assert_eq!(
        metric(
            &metrics,
            "spillway_connections_refused_total",
            &[r#"limit="max_connections""#, r#"listener="proxy""#]
        ),
        1.0
    );
    assert_eq!(
        metric(
            &metrics,
            "spillway_client_connections",
            &[r#"budget="proxy""#]
        ),
        5.0
    );
    gw.proc.wait_line("connection limit reached", LONG);
    // The held connections are still served (idle less than the idle timeout).
    for (i, c) in held.iter_mut().enumerate() {
        assert!(served(c, &format!("/again{i}")), "held connection {i}");
    }
    // Closing one frees a place for its client.
    drop(held.remove(0));
    let deadline = std::time::Instant::now() + LONG;
    loop {
        let mut c = connect_from("127.0.0.1", gw.proxy);
        if served(&mut c, "/a-after-close") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no place freed");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(stub.requests_to("/a-over").is_empty() && stub.requests_to("/c-over").is_empty());
}

/// TCP half-close: a client that sends a complete request and then shuts down its write
/// side (`shutdown(SHUT_WR)`, as some HTTP/1 clients and probes do) is served — a GET
/// and a POST with a body — and the upstream gets each request once.
#[test]
fn a_request_followed_by_a_write_shutdown_is_answered() {
    let stub = Stub::start(scripted);
    let gw = static_gateway(&[stub.url()], "");
    let mut c = Client::connect(gw.proxy);
    let r = c
        .send(get("/half-closed").as_bytes())
        .shutdown_write()
        .response()
        .expect("an answer after the client's write shutdown");
    assert_eq!(String::from_utf8_lossy(&r.body), "path=/half-closed");
    assert!(c.closed(), "closed after the answer");

    let mut c = Client::connect(gw.proxy);
    let r = c
        .send(b"POST /half-closed-post HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello")
        .shutdown_write()
        .response()
        .expect("an answer to the POST");
    assert_eq!(r.status, 200);
    // HTTP/1.0 without keep-alive, and a request split over two writes.
    let mut c = Client::connect(gw.proxy);
    c.send(b"GET /half-closed-10 HTTP/1.0\r\n");
    c.send(b"\r\n");
    let r = c.shutdown_write().response().expect("HTTP/1.0");
    assert_eq!(r.status, 200);
    assert_eq!(stub.requests_to("/half-closed").len(), 1);
    let post = stub.requests_to("/half-closed-post");
    assert_eq!(post.len(), 1);
    assert_eq!(post[0].body, b"hello");
    assert_eq!(stub.requests_to("/half-closed-10").len(), 1);
}

/// Header names with `_`: a backend that folds `_` into `-` (CGI, WSGI, many frameworks)
/// would read `X_Forwarded_For` or `X_Real_IP` as the headers the gateway controls. By
/// default such fields are dropped (the request is forwarded without them);
/// `reject_request` answers 400 and forwards nothing; `allow` passes them unchanged.
#[test]
fn header_names_with_underscores_are_dropped_by_default() {
    let stub = Stub::start(scripted);
    let forged = "GET /u HTTP/1.1\r\nHost: a\r\nX_Forwarded_For: 10.6.6.6\r\nX_Real_IP: 10.6.6.6\r\nX-Auth_User: admin\r\nX-Plain: kept\r\n\r\n";
    let gw = static_gateway(&[stub.url()], "");
    assert_eq!(status_of(gw.proxy, forged), 200);
    let got = &stub.requests_to("/u")[0];
    assert!(
        got.headers.iter().all(|(k, _)| !k.contains('_')),
        "{:?}",
        got.headers
    );
    assert!(
        got.headers
            .iter()
            .all(|(_, v)| !v.contains("10.6.6.6") && v != "admin"),
        "{:?}",
        got.headers
    );
    assert_eq!(got.all("x-forwarded-for"), ["127.0.0.1"]);
    assert_eq!(got.all("x-plain"), ["kept"]);

    let reject = static_gateway(
        &[stub.url()],
        "  headers_with_underscores_action: reject_request",
    );
    assert_eq!(
        status_of(reject.proxy, &forged.replace("/u", "/u-reject")),
        400
    );
    assert!(stub.requests_to("/u-reject").is_empty());

    let allow = static_gateway(&[stub.url()], "  headers_with_underscores_action: allow");
    assert_eq!(
        status_of(allow.proxy, &forged.replace("/u", "/u-allow")),
        200
    );
    let got = &stub.requests_to("/u-allow")[0];
    assert_eq!(got.all("x_real_ip"), ["10.6.6.6"]);
}

/// A response that arrived but cannot be parsed — more header fields than
/// `max_response_header_count`, a head over `max_response_header_bytes`, a garbled status
/// line — is answered 502 and the request (an idempotent GET, which a failure before any
/// response byte would re-send) is not sent again: not to the VM, not to the function
/// tier. The limits are settings.
#[test]
fn an_unparsable_response_is_a_502_and_never_sent_again() {
    let stub = Stub::start(scripted);
    let gw = static_gateway(&[stub.url()], "  max_response_header_bytes: 8192");
    for path in ["/many-headers", "/big-head", "/garbled"] {
        assert_eq!(status_of(gw.proxy, &get(path)), 502, "{path}");
        assert_eq!(stub.requests_to(path).len(), 1, "{path} sent again");
    }
    let s = gw.status();
    assert_eq!(
        u64_at(&s, "/routed/function"),
        0,
        "replayed on the function tier"
    );
    let metrics =
        String::from_utf8_lossy(&http(gw.admin, "GET", "/metrics", &[], b"").2).to_string();
    assert_eq!(
        metric(
            &metrics,
            "spillway_retries_total",
            &[r#"kind="connect_failure""#]
        ),
        0.0
    );

    // Raised limits: the same responses are forwarded.
    let roomy = static_gateway(
        &[stub.url()],
        "  max_response_header_count: 150\n  max_response_header_bytes: 20000",
    );
    for path in ["/many-headers", "/big-head"] {
        let r = one(roomy.proxy, &get(path)).expect(path);
        assert_eq!((r.status, r.body.as_slice()), (200, &b"ok"[..]), "{path}");
    }
}

fn ws_upgrade(path: &str) -> String {
    format!(
        "GET {path} HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    )
}

/// Upgrades the gateway cannot carry: `Upgrade: h2c` is never forwarded (the request
/// goes on as an ordinary one, so an h2c tunnel cannot smuggle requests past the
/// gateway's rules); a 101 is accepted only for a request that asked for that protocol —
/// an unasked 101, or a 101 to another protocol, is a 502 with nothing tunnelled, and
/// over h2 it is a 502 too (never a 1xx frame). Other protocols pass only when listed in
/// `upgrade_protocols`.
#[test]
fn only_supported_upgrades_are_forwarded_and_a_101_must_match_the_request() {
    let stub = Stub::start(scripted);
    let gw = static_gateway(&[stub.url()], "");
    let h2c = |path: &str| {
        format!(
            "GET {path} HTTP/1.1\r\nHost: a\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n\r\n"
        )
    };
    // h2c: forwarded as a plain request, without Upgrade.
    let r = one(gw.proxy, &h2c("/h2c-plain")).unwrap();
    assert_eq!(r.status, 200);
    let got = &stub.requests_to("/h2c-plain")[0];
    assert!(
        got.get("upgrade").is_none()
            && got.get("connection").is_none()
            && got.get("http2-settings").is_none(),
        "{got:?}"
    );
    // An upstream that switches to h2c anyway: 502, and the bytes after the request are
    // never tunnelled to it.
    let mut c = Client::connect(gw.proxy);
    c.send(format!("{}PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", h2c("/ws-101")).as_bytes());
    let r = c.response().expect("an answer");
    assert_eq!(r.status, 502);
    // An unasked 101 to a plain GET, and a 101 to another protocol than requested.
    assert_eq!(status_of(gw.proxy, &get("/ws-101")), 502);
    let mut c = Client::connect(gw.proxy);
    let r = c
        .send(ws_upgrade("/ws-101-h2c").as_bytes())
        .response_to(true)
        .expect("an answer");
    assert_eq!(r.status, 502);
    assert!(
        !stub.raw().windows(3).any(|w| w == b"PRI"),
        "h2 bytes reached the upstream"
    );
    // WebSocket still tunnels.
    let mut c = Client::connect(gw.proxy);
    let r = c
        .send(ws_upgrade("/ws-101").as_bytes())
        .response_to(true)
        .expect("101");
    assert_eq!(r.status, 101);
    c.send(b"ping");
    let mut echoed = Vec::new();
    while echoed.len() < 4 {
        let more = c.read_some();
        assert!(!more.is_empty(), "tunnel closed early");
        echoed.extend(more);
    }
    assert_eq!(echoed, b"ping");

    // Over h2 an upstream 101 becomes a 502.
    let addr = gw.proxy;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let status = rt.block_on(async move {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (mut send, conn) = hyper::client::conn::http2::handshake(
            hyper_util::rt::TokioExecutor::new(),
            hyper_util::rt::TokioIo::new(tcp),
        )
        .await
        .unwrap();
        tokio::spawn(conn);
        let req = http::Request::get("http://a/ws-101")
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .unwrap();
        send.send_request(req).await.unwrap().status()
    });
    assert_eq!(status, 502);

    // Another protocol only when configured.
    let listed = static_gateway(&[stub.url()], "  upgrade_protocols: [websocket, tcp]");
    let mut c = Client::connect(listed.proxy);
    c.send(b"GET /tcp-up HTTP/1.1\r\nHost: a\r\nConnection: upgrade\r\nUpgrade: TCP\r\n\r\n");
    let _ = c.response();
    assert_eq!(stub.requests_to("/tcp-up")[0].all("upgrade"), ["TCP"]);
}

/// A WebSocket tunnel open at SIGTERM gets the drain period: it keeps carrying bytes
/// after the gateway stopped accepting, and the gateway exits once it closes; one that
/// stays open is closed at `drain_timeout_seconds`.
#[test]
fn websocket_tunnels_get_the_drain_period_at_sigterm() {
    let stub = Stub::start(scripted);
    let mut gw = static_gateway(&[stub.url()], "  drain_timeout_seconds: 30");
    let mut c = Client::connect(gw.proxy);
    let r = c
        .send(ws_upgrade("/ws-101").as_bytes())
        .response_to(true)
        .expect("101");
    assert_eq!(r.status, 101);
    gw.proc.signal("TERM");
    gw.proc.wait_line("shutting down: draining", LONG);
    c.send(b"after-sigterm");
    let mut echoed = Vec::new();
    while echoed.len() < b"after-sigterm".len() {
        let more = c.read_some();
        assert!(!more.is_empty(), "the tunnel was cut at SIGTERM");
        echoed.extend(more);
    }
    assert_eq!(echoed, b"after-sigterm");
    drop(c);
    assert_eq!(gw.proc.wait_exit(LONG), Some(0));

    let mut gw = static_gateway(&[stub.url()], "  drain_timeout_seconds: 1");
    let mut c = Client::connect(gw.proxy);
    assert_eq!(
        c.send(ws_upgrade("/ws-101").as_bytes())
            .response_to(true)
            .map(|r| r.status),
        Some(101)
    );
    gw.proc.signal("TERM");
    assert_eq!(gw.proc.wait_exit(LONG), Some(0));
    assert!(
        c.closed_within(LONG),
        "the tunnel outlived the drain timeout"
    );
}

/// `n` GETs of `path` at once, each on its own connection; the statuses.
fn burst(addr: std::net::SocketAddr, path: &str, n: usize) -> Vec<u16> {
    let start = std::sync::Arc::new(std::sync::Barrier::new(n));
    let threads: Vec<_> = (0..n)
        .map(|_| {
            let (start, path) = (std::sync::Arc::clone(&start), path.to_string());
            std::thread::spawn(move || {
                start.wait();
                http(addr, "GET", &path, &[], b"").0
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

/// A dead VM's burst: after a VM is killed, a burst of GETs that would land on its
/// pooled keep-alive connections is served without one failure, with the default retry
/// budget — the first failure marks the VM suspect (so the rest of the burst is routed
/// elsewhere as first attempts) and attempts that were never written (connect refused)
/// are re-routed without spending the budget.
#[test]
fn a_dead_vms_burst_is_served_within_the_default_retry_budget() {
    let a = SampleApi::start("vm-a");
    let b = SampleApi::start("vm-b");
    let mut a = a;
    let gw = static_gateway(
        &[format!("http://{}", a.addr), format!("http://{}", b.addr)],
        "",
    );
    // Pooled connections to both VMs.
    let warm = burst(gw.proxy, "/sleep?ms=200", 16);
    assert!(warm.iter().all(|c| *c == 200), "{warm:?}");
    assert!(u64_at(&a.stats(), "/by_path/~1sleep") > 0, "A took part");
    a.proc.child.kill().unwrap();
    a.proc.child.wait().unwrap();
    // 128 GETs: without the suspect mark about half would try the dead VM first, more
    // retries than the default budget allows (0.2 × 144 + 10 = 38.8).
    let statuses = burst(gw.proxy, "/sleep?ms=20", 128);
    let failed = statuses.iter().filter(|c| **c != 200).count();
    let s = gw.status();
    assert_eq!(failed, 0, "{statuses:?}\n{:#}", s["retry_budget"]);
    assert_eq!(u64_at(&s, "/retry_budget/refused_total"), 0);
}

/// The retry budget still caps re-sends under overload: when every VM takes requests
/// and fails them before answering (a real re-send each time), at most
/// `ratio · requests + min_per_second · window` (the default budget) are sent again;
/// the rest answer with their own error.
#[test]
fn the_retry_budget_still_caps_re_sends_when_every_vm_fails_after_the_request() {
    // Probes pass; every request is read, held 50 ms, and its connection closed.
    let failing = |r: &StubRequest| {
        if r.target == "/" {
            return ok_reply(r);
        }
        std::thread::sleep(Duration::from_millis(50)); // the upstream's own work
        Reply::Close
    };
    let a = Stub::start(failing);
    let b = Stub::start(failing);
    let gw = static_gateway(&[a.url(), b.url()], "");
    let n = 80;
    for round in 0..2 {
        burst(gw.proxy, &format!("/fail-{round}"), n / 2);
    }
    let s = gw.status();
    let budget = &s["retry_budget"];
    let retried = u64_at(&s, "/retry_budget/retried_total");
    let allowed = f64_at(&s, "/retry_budget/window_allowed");
    assert!(allowed <= 0.2 * n as f64 + 10.0 + 1.0, "{budget:#}");
    assert!(retried as f64 <= allowed, "{budget:#}");
    assert!(
        u64_at(&s, "/retry_budget/refused_total") > 0,
        "the budget never capped: {budget:#}"
    );
    let sent = [&a, &b]
        .iter()
        .flat_map(|st| st.requests())
        .filter(|r| r.target != "/")
        .count();
    assert!(
        sent as u64 <= n as u64 + retried,
        "{sent} sent for {n} requests, {retried} retries granted"
    );
}

/// The derived default connection cap keeps a gateway with few file descriptors up: with
/// `ulimit -n 256` (cap (256 − 64) / 2 = 96, 24 per client IP), 300 connections from one
/// client that never send a request leave the admin listener answering and another
/// client served, and the gateway never fails an `accept`.
#[test]
fn silent_connections_cannot_exhaust_the_descriptors_with_the_default_caps() {
    let stub = Stub::start(scripted);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("g.yaml");
    std::fs::write(
        &path,
        static_config(&[stub.url()], "  header_read_timeout_seconds: 60"),
    )
    .unwrap();
    let mut cmd = std::process::Command::new("sh");
    cmd.args([
        "-c",
        "ulimit -n 256 && exec \"$0\" serve --config \"$1\"",
        exe(),
        path.to_str().unwrap(),
    ]);
    let proc = Proc::spawn_command(cmd);
    let line = proc.wait_line("spillway listening", LONG);
    let addr = |key: &str| -> std::net::SocketAddr {
        let rest = &line[line.find(&format!("{key}=")).unwrap() + key.len() + 1..];
        rest.split(' ').next().unwrap().parse().unwrap()
    };
    let (proxy, admin) = (addr("proxy"), addr("admin"));
    let held: Vec<Client> = (0..300).map(|_| connect_from("127.0.0.1", proxy)).collect();
    proc.wait_line("connection limit reached", LONG);
    let (code, _, _) = http(admin, "GET", "/status", &[], b"");
    assert_eq!(code, 200, "admin listener starved");
    let mut other = connect_from("127.0.0.2", proxy);
    let r = other.send(get("/other-client").as_bytes()).response();
    assert_eq!(
        r.map(|r| r.status),
        Some(200),
        "another client was not served"
    );
    let metrics = String::from_utf8_lossy(&http(admin, "GET", "/metrics", &[], b"").2).to_string();
    assert_eq!(
        metric(
            &metrics,
            "spillway_client_connections",
            &[r#"budget="proxy""#]
        ),
        25.0,
        "24 silent connections from one client, and the other client's"
    );
    assert!(
        !proc.log_text().contains("accept failed"),
        "{}",
        proc.log_text()
    );
    drop(held);
}
