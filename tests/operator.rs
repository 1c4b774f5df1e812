//! An operator's gateway, tried against the real binary on loopback: credentials never
//! shown (status, logs, replies), health that tells the truth (`/livez`, `/readyz`, a
//! dead static member in `/status`), the admin listener's checks, and answers and logs
//! an operator can use (request ids, problem+json, one warning per failed request,
//! repeated warnings rate-limited, fatal errors in the JSON log format).
//! Real processes: wall-clock deadlines and polling, no sleeps before asserts.

// Real processes on loopback: deadlines are wall-clock time.
#![allow(clippy::disallowed_methods)]

mod common;

use std::time::{Duration, Instant};

use common::stub::{Reply, Stub, ok_reply};
use common::{Gateway, closed_url, header, http, poll, static_config};
use serde_json::Value;

const LONG: Duration = Duration::from_secs(30);

/// A static member `user:password@` on a closed port: the password is in no `/status`
/// field, no log line and no reply; the member stays in `/status` as `dead` with since
/// when and why.
#[test]
fn a_dead_static_member_with_a_password_is_shown_dead_and_redacted() {
    let url = closed_url("ops:hunter2-pw@");
    let gw = Gateway::start(&static_config(
        std::slice::from_ref(&url),
        "  health_check_interval_seconds: 0.1\n  retry_budget_ratio: 0\n  retry_budget_min_per_second: 0",
    ));
    // Whatever tier ends up answering, the failed VM attempt leaves the member dead.
    let (_, _, body) = http(gw.proxy, "GET", "/x?token=abc", &[], b"");
    let s = gw.wait_status("the member dead", LONG, |s| {
        s["vm_pool"]["vms"]
            .as_array()
            .is_some_and(|v| v.iter().any(|vm| vm["state"] == "dead"))
    });
    let vm = s["vm_pool"]["vms"]
        .as_array()
        .unwrap()
        .iter()
        .find(|vm| vm["state"] == "dead")
        .unwrap()
        .clone();
    assert!(
        vm["dead_since_unix_seconds"].as_u64().unwrap() > 1_700_000_000,
        "{vm:#}"
    );
    assert!(
        vm["last_error"].as_str().unwrap().contains("probe"),
        "{vm:#}"
    );
    assert!(
        vm["url"]
            .as_str()
            .unwrap()
            .starts_with("http://***@127.0.0.1:"),
        "{vm:#}"
    );
    assert!(
        vm["instance"]
            .as_str()
            .unwrap()
            .starts_with("http://***@127.0.0.1:"),
        "{vm:#}"
    );
    let status_text = s.to_string();
    assert!(!status_text.contains("hunter2"), "{s:#}");
    // The warning that the member left the pool names it, without the password.
    let line = gw.proc.wait_line("parked until healthy", LONG);
    assert!(line.contains("***@127.0.0.1"), "{line}");
    let log = gw.proc.log_text();
    assert!(!log.contains("hunter2"), "{log}");
    let body = String::from_utf8_lossy(&body);
    assert!(!body.contains("hunter2"), "{body}");
}

/// `/livez` answers while the process works; `/readyz` is 200 while a VM is ready or a
/// function zone has capacity, 503 with the reason when neither.
#[test]
fn readiness_follows_capacity_and_liveness_stays_up() {
    let held = Stub::start(|r| {
        if r.target == "/hold" {
            Reply::Hold
        } else {
            ok_reply(r)
        }
    });
    let dead = closed_url("");
    let yaml = format!(
        r#"
gateway:
  listen: 127.0.0.1:0
  admin_listen: 127.0.0.1:0
  allow_loopback_upstreams: true
  health_check_interval_seconds: 0.1
  upstream_timeout_seconds: 2
libra:
  decision_epochs: 1000
  r_max_rps: 1000
  rho: 1.0
vm_pool:
  type: static
  urls: ["{dead}"]
function_tier:
  type: http
  url: "{}"
  max_concurrency: 1
"#,
        held.url()
    );
    let gw = Gateway::start(&yaml);
    let get = |path: &str| {
        let (code, _, body) = http(gw.admin, "GET", path, &[], b"");
        (code, String::from_utf8_lossy(&body).into_owned())
    };
    assert_eq!(get("/livez"), (200, "ok\n".to_string()));
    gw.wait_status("the member dead", LONG, |s| {
        s["vm_pool"]["vms"][0]["state"] == "dead"
    });
    // No VM, but the function zone can take a call.
    assert_eq!(get("/readyz"), (200, "ready\n".to_string()));
    let proxy = gw.proxy;
    let call = std::thread::spawn(move || http(proxy, "GET", "/hold", &[], b"").0);
    let (_, body) = poll("/readyz 503", LONG, || {
        let r = get("/readyz");
        (r.0 == 503).then_some(r)
    });
    assert!(
        body.starts_with("not ready: no ready VM (0 booting, 1 dead)")
            && body.contains("at capacity"),
        "{body}"
    );
    assert_eq!(get("/livez").0, 200);
    // The held call times out (504); the zone has room again.
    assert_eq!(call.join().unwrap(), 504);
    poll("/readyz 200 again", LONG, || {
        (get("/readyz").0 == 200).then_some(())
    });
}

/// An `http` function zone whose endpoint refuses connections is no capacity: with the
/// only VM dead, `/readyz` answers 503 naming the zone unreachable — before any call,
/// and after a call that could not connect.
#[test]
fn readiness_does_not_count_an_unreachable_function_endpoint() {
    let dead_vm = closed_url("");
    let dead_fn = closed_url("");
    let yaml = format!(
        r#"
gateway:
  listen: 127.0.0.1:0
  admin_listen: 127.0.0.1:0
  allow_loopback_upstreams: true
  health_check_interval_seconds: 0.1
  connect_timeout_seconds: 3
vm_pool:
  type: static
  urls: ["{dead_vm}"]
function_tier:
  type: http
  url: "{dead_fn}"
  max_concurrency: 7
"#
    );
    let gw = Gateway::start(&yaml);
    let get = |path: &str| {
        let (code, _, body) = http(gw.admin, "GET", path, &[], b"");
        (code, String::from_utf8_lossy(&body).into_owned())
    };
    gw.wait_status("the member dead", LONG, |s| {
        s["vm_pool"]["vms"][0]["state"] == "dead"
    });
    let (code, body) = get("/readyz");
    assert_eq!(code, 503, "{body}");
    assert!(
        body.starts_with("not ready: no ready VM (0 booting, 1 dead)")
            && body.contains("cloud unreachable"),
        "{body}"
    );
    // A call finds nowhere to run; readiness still says so.
    assert!(http(gw.proxy, "GET", "/", &[], b"").0 >= 500);
    let (code, body) = get("/readyz");
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("cloud unreachable"), "{body}");
    assert_eq!(get("/livez").0, 200);
}

/// Without a token the admin listener refuses a foreign `Host` (DNS rebinding) and a
/// cross-site `Origin`; the probes stay open. With a token, the `Bearer` scheme matches
/// in any case.
#[test]
fn admin_checks_host_and_origin_without_a_token_and_bearer_in_any_case_with_one() {
    let stub = Stub::start(ok_reply);
    let gw = Gateway::start(&static_config(&[stub.url()], ""));
    let port = gw.admin.port();
    let get = |headers: &[(&str, &str)], path: &str| {
        let mut req = format!("GET {path} HTTP/1.1\r\nConnection: close\r\n");
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        common::raw(gw.admin, req.as_bytes()).0
    };
    let local = format!("localhost:{port}");
    let ip = format!("127.0.0.1:{port}");
    assert_eq!(get(&[("Host", &local)], "/status"), 200);
    assert_eq!(get(&[("Host", &ip)], "/status"), 200);
    assert_eq!(get(&[("Host", "[::1]")], "/metrics"), 200);
    assert_eq!(get(&[("Host", "rebind.example:80")], "/status"), 403);
    assert_eq!(get(&[("Host", "127.0.0.1.nip.io")], "/status"), 403);
    assert_eq!(
        get(
            &[("Host", &ip), ("Origin", "https://evil.example")],
            "/status"
        ),
        403
    );
    assert_eq!(
        get(
            &[("Host", &ip), ("Origin", &format!("http://{local}"))],
            "/status"
        ),
        200
    );
    for probe in ["/livez", "/readyz", "/healthz"] {
        assert_eq!(get(&[("Host", "rebind.example")], probe), 200, "{probe}");
    }
    // POST /reload from a cross-site form: refused before anything is read.
    let (code, _, _) = http(
        gw.admin,
        "POST",
        "/reload",
        &[("Origin", "http://evil.example")],
        b"",
    );
    assert_eq!(code, 403);

    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("admin.token");
    std::fs::write(&token_file, "Tok-7\n").unwrap();
    let gw = Gateway::start(&static_config(
        &[stub.url()],
        &format!("  admin_token_file: \"{}\"", token_file.display()),
    ));
    for auth in ["Bearer Tok-7", "bearer Tok-7", "BEARER  Tok-7"] {
        let (code, _, _) = http(gw.admin, "GET", "/status", &[("Authorization", auth)], b"");
        assert_eq!(code, 200, "{auth}");
    }
    let (code, _, _) = http(
        gw.admin,
        "GET",
        "/status",
        &[("Authorization", "Bearer tok-7")],
        b"",
    );
    assert_eq!(code, 401);
}

/// Every request has an `x-request-id`: made when the client sent none, kept when it
/// sent a valid one; it goes upstream, comes back on the response, and is in the access
/// log. A valid `traceparent` goes upstream unchanged, a malformed one does not.
#[test]
fn request_ids_go_upstream_come_back_and_are_logged() {
    let stub = Stub::start(ok_reply);
    let gw = Gateway::start(&static_config(&[stub.url()], "  access_log: true"));
    let (code, h, _) = http(gw.proxy, "GET", "/made", &[], b"");
    assert_eq!(code, 200);
    let made = header(&h, "x-request-id").unwrap().to_string();
    assert_eq!(made.len(), 32, "{made}");
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let (code, h, _) = http(
        gw.proxy,
        "GET",
        "/kept",
        &[
            ("X-Request-Id", "client-id.42"),
            ("traceparent", tp),
            ("tracestate", "v=1"),
        ],
        b"",
    );
    assert_eq!(code, 200);
    assert_eq!(header(&h, "x-request-id"), Some("client-id.42"));
    let (_, h, _) = http(
        gw.proxy,
        "GET",
        "/replaced",
        &[
            ("X-Request-Id", "bad id with spaces"),
            ("traceparent", "00-zz-01"),
            ("tracestate", "v=1"),
        ],
        b"",
    );
    let replaced = header(&h, "x-request-id").unwrap().to_string();
    assert_ne!(replaced, "bad id with spaces");
    assert_eq!(
        stub.requests_to("/made")[0].get("x-request-id"),
        Some(made.as_str())
    );
    let kept = &stub.requests_to("/kept")[0];
    assert_eq!(kept.get("x-request-id"), Some("client-id.42"));
    assert_eq!(kept.get("traceparent"), Some(tp));
    assert_eq!(kept.get("tracestate"), Some("v=1"));
    let bad = &stub.requests_to("/replaced")[0];
    assert_eq!(bad.get("x-request-id"), Some(replaced.as_str()));
    assert!(bad.get("traceparent").is_none() && bad.get("tracestate").is_none());
    // The access log, in request order.
    let line = gw.proc.wait_line("path=/made", LONG);
    assert!(line.contains(&format!("request_id={made}")), "{line}");
    let line = gw.proc.wait_line("path=/kept", LONG);
    assert!(line.contains("request_id=client-id.42"), "{line}");
}

/// A local 502 carries a short reason and the request id, as problem+json when the
/// client asks for JSON and as text otherwise; the failed request logs one warning,
/// and the same failure repeated is logged once per window with a count.
#[test]
fn a_failed_request_gets_a_reason_and_its_id_and_logs_one_warning() {
    // An upstream that answers garbage: every request is a 502 and the VM stays ready
    // (its answer started: not a dead VM, not sent again).
    let garbage = Stub::start(|_| Reply::Raw(b"NOT HTTP AT ALL\r\n\r\n".to_vec()));
    let gw = Gateway::start(&static_config(&[garbage.url()], ""));
    let (code, h, body) = http(
        gw.proxy,
        "GET",
        "/json",
        &[
            ("Accept", "application/json"),
            ("X-Request-Id", "rq-json-1"),
        ],
        b"",
    );
    assert_eq!(code, 502);
    assert_eq!(header(&h, "content-type"), Some("application/problem+json"));
    assert_eq!(header(&h, "x-request-id"), Some("rq-json-1"));
    let doc: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(doc["status"], 502);
    assert_eq!(doc["title"], "Bad Gateway");
    assert_eq!(doc["request_id"], "rq-json-1");
    assert_eq!(
        doc["detail"],
        "the upstream failed or its answer was unusable"
    );
    let (code, h, body) = http(gw.proxy, "GET", "/text", &[("Accept", "text/html")], b"");
    assert_eq!(code, 502);
    let id = header(&h, "x-request-id").unwrap();
    assert!(
        header(&h, "content-type")
            .unwrap()
            .starts_with("text/plain")
    );
    assert_eq!(
        String::from_utf8_lossy(&body),
        format!(
            "502 Bad Gateway: the upstream failed or its answer was unusable\nrequest id: {id}\n"
        )
    );
    // One warning for the first failed request, naming its id.
    let warning = gw.proc.wait_line("request failed", LONG);
    assert!(
        warning.contains("rq-json-1") && warning.contains("status=502"),
        "{warning}"
    );
    let about_it = gw
        .proc
        .log_text()
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("rq-json-1"))
        .count();
    assert_eq!(about_it, 1, "{}", gw.proc.log_text());
    // Repeated: at most one line per 10 s window (plus the first).
    let t = Instant::now();
    for i in 0..20 {
        let (code, _, _) = http(gw.proxy, "GET", &format!("/again{i}"), &[], b"");
        assert_eq!(code, 502);
    }
    let windows = t.elapsed().as_secs() / 10 + 2;
    let lines = gw
        .proc
        .log_text()
        .lines()
        .filter(|l| l.contains("request failed"))
        .count() as u64;
    assert!(lines <= windows, "{lines} lines:\n{}", gw.proc.log_text());
}

/// With `--log-format json`, a fatal start-up error (a bad config) is one JSON log
/// object at ERROR, with the credentials in it redacted.
#[test]
fn fatal_start_up_errors_follow_the_json_log_format() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "gateway:\n  listen: 127.0.0.1:0\n  admin_listen: 127.0.0.1:0\nvm_pool:\n  type: static\n  urls: [\"ftp://u:hunter2@h\"]\n  nope: 1\n",
    )
    .unwrap();
    let out = std::process::Command::new(common::exe())
        .args(["--log-format", "json", "serve", bad.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{err}");
    let v: Value = serde_json::from_str(lines[0]).unwrap_or_else(|e| panic!("{e}: {err}"));
    assert_eq!(v["level"], "ERROR", "{v}");
    let message = v["message"].as_str().unwrap();
    assert!(message.contains("bad.yaml"), "{message}");
    assert!(!err.contains("hunter2"), "{err}");
}

/// `spillway --help` describes the log lines as they are: the JSON object's flattened
/// fields (`message`, no `fields` object) and the request's span with its id.
#[test]
fn help_describes_the_log_fields_as_they_are() {
    let out = std::process::Command::new(common::exe())
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for needle in ["\"message\"", "request_id", "\"span\""] {
        assert!(help.contains(needle), "{needle} not in:\n{help}");
    }
    assert!(!help.contains("\"fields\""), "{help}");
}
