//! The Lambda function tier through the real gateway binary (http-cases C19,
//! C20): against moto for the reply shapes, and against a local Invoke stub for what moto
//! cannot answer (function errors, 429, access denied, provisioned concurrency), plus an
//! endpoint on a closed port. Loopback only; every wait polls with a deadline.

// Real processes (moto, the gateway) on loopback: deadlines are wall-clock time.
#![allow(clippy::disallowed_methods)]
#![cfg(feature = "aws")]

mod aws_common;
mod common;

use std::time::Duration;

use aws_common::aws_env;
use aws_common::lambda::{
    InvokeReply as StubReply, InvokeStub, StubRequest, moto_with_function, queue_lambda_replies,
};
use common::{Gateway, SampleApi, free_port, header, http, raw, u64_at};
use serde_json::Value;

/// A v2 reply the stub gives by default.
const OK_REPLY: &str = r#"{"statusCode":200,"headers":{"content-type":"text/plain"},"body":"ok"}"#;

/// A gateway whose function tier is the Lambda function `function` at `endpoint`;
/// `vm_urls` is a static VM pool (empty: every request goes to the function tier).
fn lambda_gateway(endpoint: &str, vm_urls: &[String], tier_extra: &str) -> Gateway {
    let urls = vm_urls
        .iter()
        .map(|u| format!("\"{u}\""))
        .collect::<Vec<_>>()
        .join(", ");
    Gateway::start_env(
        &format!(
            r#"
gateway:
  listen: 127.0.0.1:0
  admin_listen: 127.0.0.1:0
  drain_timeout_seconds: 5
  allow_loopback_upstreams: true
libra:
  decision_epochs: 1000
  r_max_rps: 2
  rho: 1.0
vm_pool:
  type: static
  urls: [{urls}]
function_tier:
  type: lambda
  function_name: spillway-test
  region: us-east-1
  endpoint_url: {endpoint}
{tier_extra}
"#
        ),
        &aws_env(),
    )
}

fn set_cookies(headers: &[(String, String)]) -> Vec<&str> {
    headers
        .iter()
        .filter(|(k, _)| k == "set-cookie")
        .map(|(_, v)| v.as_str())
        .collect()
}

/// http-cases C20 (a), (c), (d) in payload format 2.0, replies from moto's Lambda.
#[test]
fn c20_v2_replies_from_moto_reach_the_client() {
    let moto = moto_with_function("spillway-test");
    let gw = lambda_gateway(&moto.endpoint, &[], "");
    queue_lambda_replies(
        &moto,
        &[
            r#"{"statusCode":200,"cookies":["sid=abc; Path=/; HttpOnly","flag=on; Path=/"],"headers":{"content-type":"text/plain"},"body":"ok"}"#,
            r#"{"statusCode":200,"isBase64Encoded":true,"headers":{"content-type":"image/png"},"body":"iVBORw0KGgo="}"#,
            "this is not JSON {",
            r#"{"statusCode":99,"body":"secret-99"}"#,
            r#"{"message":"no status code","n":[1,2]}"#,
        ],
    );

    // (a) two Set-Cookie lines, never comma-joined.
    let (code, h, body) = http(gw.proxy, "GET", "/a", &[], b"");
    assert_eq!(code, 200, "{}", gw.proc.log_text());
    assert_eq!(
        set_cookies(&h),
        ["sid=abc; Path=/; HttpOnly", "flag=on; Path=/"]
    );
    assert_eq!(header(&h, "content-type"), Some("text/plain"));
    assert_eq!(body, b"ok");

    // (c) base64 body decoded, exact bytes and length.
    let (code, h, body) = http(gw.proxy, "GET", "/c", &[], b"");
    assert_eq!(code, 200);
    assert_eq!(body, [0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A]);
    assert_eq!(header(&h, "content-length"), Some("8"));
    assert_eq!(header(&h, "content-type"), Some("image/png"));

    // (d) invalid JSON and statusCode 99: 502 with a generic body.
    for _ in 0..2 {
        let (code, _, body) = http(gw.proxy, "GET", "/d", &[], b"");
        assert_eq!(code, 502);
        let text = String::from_utf8_lossy(&body);
        assert!(
            !text.contains("secret") && !text.contains("JSON"),
            "generic body: {text}"
        );
    }

    // 2.0 without statusCode: 200, application/json, the whole return as body.
    let (code, h, body) = http(gw.proxy, "GET", "/raw", &[], b"");
    assert_eq!(code, 200);
    assert_eq!(header(&h, "content-type"), Some("application/json"));
    assert_eq!(body, br#"{"message":"no status code","n":[1,2]}"#);
    let st = gw.status();
    assert_eq!(st["functions"]["kind"], "lambda");
    assert_eq!(u64_at(&st, "/functions/errors/total"), 2, "{st:#}");
}

/// http-cases C20 (b) and (d, missing statusCode) in payload format 1.0.
#[test]
fn c20_v1_replies_from_moto_reach_the_client() {
    let moto = moto_with_function("spillway-test");
    let gw = lambda_gateway(&moto.endpoint, &[], "  payload_format: v1");
    queue_lambda_replies(
        &moto,
        &[
            r#"{"statusCode":200,"multiValueHeaders":{"Set-Cookie":["a=1","b=2"]},"body":""}"#,
            r#"{"body":"no status"}"#,
        ],
    );
    let (code, h, body) = http(gw.proxy, "GET", "/b", &[], b"");
    assert_eq!(code, 200, "{}", gw.proc.log_text());
    assert_eq!(set_cookies(&h), ["a=1", "b=2"]);
    assert!(body.is_empty());
    let (code, _, _) = http(gw.proxy, "GET", "/d", &[], b"");
    assert_eq!(code, 502);
}

/// http-cases C19 and C8 end to end: moto's Lambda echoes the event when no reply is
/// queued, so the client sees the event the gateway built; its source IP is the real
/// peer, not the client's X-Forwarded-For.
#[test]
fn c19_event_built_by_the_gateway_reaches_the_function() {
    let moto = moto_with_function("spillway-test");
    let gw = lambda_gateway(&moto.endpoint, &[], "");
    let (code, _, body) = http(
        gw.proxy,
        "POST",
        "/authorize?scope=openid%20profile&next=%2Fhome&a=1&a=2",
        &[
            ("Cookie", "s=1"),
            ("Cookie", "t=2"),
            ("X-Tag", "v1"),
            ("X-Tag", "v2"),
            ("X-Forwarded-For", "10.0.0.1"),
            ("Content-Type", "application/octet-stream"),
        ],
        &[0x1f, 0x8b, 0x08, 0x00, 0xff],
    );
    assert_eq!(code, 200, "{}", gw.proc.log_text());
    let ev: Value = serde_json::from_slice(&body)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&body)));
    assert_eq!(ev["rawPath"], "/authorize");
    assert_eq!(
        ev["rawQueryString"],
        "scope=openid%20profile&next=%2Fhome&a=1&a=2"
    );
    assert_eq!(
        ev["queryStringParameters"],
        serde_json::json!({"scope": "openid profile", "next": "/home", "a": "1,2"})
    );
    assert_eq!(ev["cookies"], serde_json::json!(["s=1", "t=2"]));
    assert!(ev["headers"].get("cookie").is_none());
    assert_eq!(ev["headers"]["x-tag"], "v1,v2");
    assert_eq!(ev["requestContext"]["http"]["method"], "POST");
    assert_eq!(ev["requestContext"]["http"]["sourceIp"], "127.0.0.1");
    assert_eq!(ev["isBase64Encoded"], true);
    assert_eq!(ev["body"], "H4sIAP8=");
    // The client's XFF is not trusted: the gateway's own value names the real peer.
    assert_eq!(ev["headers"]["x-forwarded-for"], "127.0.0.1");
}

/// `X-Amz-Function-Error` → 502 with a generic body; the next call is served.
#[test]
fn function_error_is_502_and_the_gateway_keeps_serving() {
    let stub = InvokeStub::start(StubReply::ok(OK_REPLY));
    stub.script([StubReply::function_error("secret stack trace")]);
    let gw = lambda_gateway(&stub.endpoint(), &[], "");
    let (code, _, body) = http(gw.proxy, "GET", "/", &[], b"");
    assert_eq!(code, 502);
    assert!(!String::from_utf8_lossy(&body).contains("secret"));
    let (code, _, body) = http(gw.proxy, "GET", "/", &[], b"");
    assert_eq!((code, &body[..]), (200, &b"ok"[..]));
    let st = gw.status();
    assert_eq!(
        u64_at(&st, "/functions/errors/counts/function.other"),
        1,
        "{st:#}"
    );
    assert_eq!(stub.invocations().len(), 2);
    // Invoke goes to the function by name, as a synchronous call.
    let call = &stub.invocations()[0];
    assert_eq!(call.method, "POST");
    assert!(
        call.target
            .starts_with("/2015-03-31/functions/spillway-test/invocations"),
        "{}",
        call.target
    );
}

/// Access denied → 502, reported in `/status`; the gateway keeps serving.
#[test]
fn access_denied_is_502_and_reported() {
    let stub = InvokeStub::start(StubReply::ok(OK_REPLY));
    stub.script([StubReply::api_error(
        403,
        "AccessDeniedException",
        "not authorized to perform: lambda:InvokeFunction",
    )]);
    let gw = lambda_gateway(&stub.endpoint(), &[], "");
    let (code, _, _) = http(gw.proxy, "GET", "/", &[], b"");
    assert_eq!(code, 502);
    let (code, _, _) = http(gw.proxy, "GET", "/", &[], b"");
    assert_eq!(code, 200);
    let st = gw.status();
    assert_eq!(
        u64_at(&st, "/functions/errors/counts/invoke.access_denied"),
        1,
        "{st:#}"
    );
    assert_eq!(st["functions"]["errors"]["last"]["kind"], "access_denied");
    // Invoke is not retried by the SDK.
    assert_eq!(stub.invocations().len(), 2);
}

/// An endpoint on a closed port: 502, promptly, request after request; reported.
#[test]
fn closed_endpoint_is_502_and_the_gateway_keeps_serving() {
    let port = free_port();
    let gw = lambda_gateway(&format!("http://127.0.0.1:{port}"), &[], "");
    for _ in 0..2 {
        let (code, _, _) = http(gw.proxy, "GET", "/", &[], b"");
        assert_eq!(code, 502, "{}", gw.proc.log_text());
    }
    let st = gw.status();
    assert_eq!(u64_at(&st, "/functions/errors/total"), 2, "{st:#}");
    assert_eq!(st["functions"]["errors"]["last"]["operation"], "invoke");
    assert_eq!(st["functions"]["errors"]["last"]["kind"], "unreachable");
}

/// An Invoke slower than its deadline (`timeout_seconds + invoke_margin_seconds`) → 504;
/// the gateway keeps serving.
#[test]
fn slow_invoke_is_504() {
    let stub = InvokeStub::start(StubReply::ok(OK_REPLY));
    stub.script([StubReply::ok(OK_REPLY).after(Duration::from_secs(3))]);
    let gw = lambda_gateway(
        &stub.endpoint(),
        &[],
        "  timeout_seconds: 0.5\n  invoke_margin_seconds: 0.25",
    );
    let (code, _, _) = http(gw.proxy, "GET", "/", &[], b"");
    assert_eq!(code, 504);
    let (code, _, _) = http(gw.proxy, "GET", "/", &[], b"");
    assert_eq!(code, 200);
    let st = gw.status();
    assert_eq!(
        u64_at(&st, "/functions/errors/counts/invoke.timeout"),
        1,
        "{st:#}"
    );
}

/// A reply that arrives after the function's own timeout but within the invoke margin
/// reaches the client: the gateway's deadline is `timeout_seconds +
/// invoke_margin_seconds`, not `timeout_seconds`.
#[test]
fn a_reply_within_the_invoke_margin_reaches_the_client() {
    let stub = InvokeStub::start(StubReply::ok(OK_REPLY));
    stub.script([StubReply::ok(OK_REPLY).after(Duration::from_millis(900))]);
    let gw = lambda_gateway(
        &stub.endpoint(),
        &[],
        "  timeout_seconds: 0.4\n  invoke_margin_seconds: 3",
    );
    let (code, _, body) = http(gw.proxy, "GET", "/", &[], b"");
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(body, b"ok");
}

/// A JSON event over 6 MiB after base64 → 413 before any invoke (the stub records none);
/// a small request afterwards is invoked.
#[test]
fn payload_over_6_mib_is_413_before_any_invoke() {
    let stub = InvokeStub::start(StubReply::ok(OK_REPLY));
    let gw = lambda_gateway(&stub.endpoint(), &[], "");
    // 4.75 MiB of binary is 6.33 MiB of base64.
    let big = vec![0xA5u8; 4_980_000];
    let (code, _, _) = http(
        gw.proxy,
        "POST",
        "/upload",
        &[("Content-Type", "application/octet-stream")],
        &big,
    );
    assert_eq!(code, 413);
    assert!(stub.invocations().is_empty(), "{:?}", stub.calls());
    let (code, _, _) = http(
        gw.proxy,
        "POST",
        "/upload",
        &[("Content-Type", "application/octet-stream")],
        &big[..1000],
    );
    assert_eq!(code, 200);
    assert_eq!(stub.invocations().len(), 1);
}

/// http-cases C5 for a Lambda local reply: a 7 MiB body is cut off at the 6 MiB limit and
/// answered 413 without being drained; the request hidden in the rest of the body never
/// runs (no Invoke at all) and the connection is closed, not reused.
#[test]
fn c5_oversized_body_is_not_parsed_as_a_next_request() {
    use std::io::{Read, Write};
    let stub = InvokeStub::start(StubReply::ok(OK_REPLY));
    let gw = lambda_gateway(&stub.endpoint(), &[], "");
    let hidden = b"GET /admin HTTP/1.1\r\nHost: a\r\n\r\n";
    let mut body = vec![b'x'; 7 * 1024 * 1024 - hidden.len()];
    body.extend_from_slice(hidden);
    let mut s = std::net::TcpStream::connect(gw.proxy).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let head = format!(
        "POST /upload HTTP/1.1\r\nHost: a\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let mut writer = s.try_clone().unwrap();
    let sender = std::thread::spawn(move || {
        // The gateway may stop reading and close: write errors are expected.
        let _ = writer.write_all(head.as_bytes());
        let _ = writer.write_all(&body);
    });
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf); // returns when the gateway closes the connection
    let _ = sender.join();
    let text = String::from_utf8_lossy(&buf);
    assert!(text.starts_with("HTTP/1.1 413"), "{text}");
    assert_eq!(
        text.matches("HTTP/1.1 ").count(),
        1,
        "exactly one response: {text}"
    );
    assert!(stub.invocations().is_empty(), "{:?}", stub.calls());
}

/// 429 from Invoke → the original request (method, body) goes back to a VM when the
/// balancer has a token and a ready VM (http-cases C20; LIBRA §III-C).
#[test]
fn throttled_call_spills_back_to_a_ready_vm() {
    let vm = SampleApi::start("vm-a");
    let stub = InvokeStub::start(StubReply::ok(OK_REPLY));
    // The delay lets the token bucket (2 tokens/s) refill before the spill-back.
    stub.script([StubReply::throttled().after(Duration::from_millis(1200))]);
    let gw = lambda_gateway(&stub.endpoint(), &[format!("http://{}", vm.addr)], "");
    // Requests go to vm-a while the bucket has tokens; the first one that does not is
    // invoked, throttled and spilled back.
    for i in 0..20 {
        let payload = format!("payload-{i}");
        let (code, h, body) = http(
            gw.proxy,
            "POST",
            "/echo",
            &[("Content-Type", "text/plain")],
            payload.as_bytes(),
        );
        assert_eq!(code, 200, "{}", gw.proc.log_text());
        assert_eq!(header(&h, "x-spillway-instance"), Some("vm-a"));
        assert_eq!(body, payload.as_bytes());
        if !stub.invocations().is_empty() {
            assert_eq!(stub.invocations().len(), 1);
            let st = gw.status();
            assert_eq!(u64_at(&st, "/functions/stats/throttled"), 1, "{st:#}");
            return;
        }
    }
    panic!("no request reached the function tier");
}

/// 429 with no VM to take the request back → 503 with Retry-After.
#[test]
fn throttled_call_without_a_vm_is_503_with_retry_after() {
    let stub = InvokeStub::start(StubReply::ok(OK_REPLY));
    stub.script([StubReply::throttled()]);
    let gw = lambda_gateway(&stub.endpoint(), &[], "");
    let (code, h, _) = http(gw.proxy, "GET", "/", &[], b"");
    assert_eq!(code, 503);
    assert!(header(&h, "retry-after").is_some(), "{h:?}");
    assert_eq!(stub.invocations().len(), 1, "never retried by the SDK");
    let (code, _, _) = http(gw.proxy, "GET", "/", &[], b"");
    assert_eq!(code, 200);
}

/// Pre-warm: `prewarmed_instances: 3` puts provisioned concurrency on the qualifier at
/// start, follows it until `READY` (shown in `/status`) and, with
/// `remove_prewarm_on_shutdown`, deletes it on shutdown.
#[test]
fn prewarm_becomes_provisioned_concurrency() {
    let stub = InvokeStub::start(StubReply::ok(OK_REPLY));
    stub.pc_statuses(&[("IN_PROGRESS", ""), ("IN_PROGRESS", ""), ("READY", "")]);
    let mut gw = lambda_gateway(
        &stub.endpoint(),
        &[],
        "  qualifier: live\n  prewarmed_instances: 3\n  remove_prewarm_on_shutdown: true",
    );
    let put = stub.wait_call(
        "PutProvisionedConcurrencyConfig",
        Duration::from_secs(20),
        |c| c.method == "PUT",
    );
    assert_eq!(
        put.target,
        "/2019-09-30/functions/spillway-test/provisioned-concurrency?Qualifier=live"
    );
    let body: Value = serde_json::from_slice(&put.body).unwrap();
    assert_eq!(body["ProvisionedConcurrentExecutions"], 3);
    let st = gw.wait_status(
        "provisioned concurrency READY",
        Duration::from_secs(30),
        |s| s["functions"]["errors"]["conditions"]["provisioned_concurrency"]["state"] == "READY",
    );
    let pc = &st["functions"]["errors"]["conditions"]["provisioned_concurrency"];
    assert_eq!(pc["alarm"], false, "{st:#}");
    assert_eq!(pc["detail"]["allocated"], 3, "{st:#}");
    assert_eq!(pc["detail"]["qualifier"], "live", "{st:#}");
    let gets = stub.calls().iter().filter(|c| c.method == "GET").count();
    assert_eq!(gets, 3, "polled until READY, then no more");
    // Invokes go to the qualifier.
    let (code, _, _) = http(gw.proxy, "GET", "/", &[], b"");
    assert_eq!(code, 200);
    assert!(
        stub.invocations()[0]
            .target
            .ends_with("/invocations?Qualifier=live"),
        "{:?}",
        stub.invocations()
    );
    gw.proc.signal("TERM");
    assert_eq!(gw.proc.wait_exit(Duration::from_secs(20)), Some(0));
    let del = stub.wait_call(
        "DeleteProvisionedConcurrencyConfig",
        Duration::from_secs(5),
        |c| c.method == "DELETE",
    );
    assert_eq!(
        del.target,
        "/2019-09-30/functions/spillway-test/provisioned-concurrency?Qualifier=live"
    );
}

/// A provisioned-concurrency config that ends `FAILED` is an alarm in `/status`, with
/// Lambda's reason.
#[test]
fn failed_provisioned_concurrency_is_an_alarm_with_its_reason() {
    let stub = InvokeStub::start(StubReply::ok(OK_REPLY));
    stub.pc_statuses(&[
        ("IN_PROGRESS", ""),
        ("FAILED", "FUNCTION_ERROR_INIT_FAILURE: init crashed"),
    ]);
    let gw = lambda_gateway(
        &stub.endpoint(),
        &[],
        "  qualifier: live\n  prewarmed_instances: 2",
    );
    let st = gw.wait_status(
        "provisioned concurrency FAILED",
        Duration::from_secs(30),
        |s| s["functions"]["errors"]["conditions"]["provisioned_concurrency"]["state"] == "FAILED",
    );
    let pc = &st["functions"]["errors"]["conditions"]["provisioned_concurrency"];
    assert_eq!(pc["alarm"], true, "{st:#}");
    assert_eq!(
        pc["reason"], "FUNCTION_ERROR_INIT_FAILURE: init crashed",
        "{st:#}"
    );
    // Still serving.
    let (code, _, _) = http(gw.proxy, "GET", "/", &[], b"");
    assert_eq!(code, 200);
}

/// `prewarmed_instances: 0` no longer removes provisioned concurrency;
/// `remove_prewarm_on_start: true` does. A failing provisioned-concurrency call does not
/// stop the gateway from serving.
#[test]
fn prewarm_zero_keeps_and_remove_on_start_deletes() {
    let stub = InvokeStub::start(StubReply::ok(OK_REPLY));
    let gw = lambda_gateway(
        &stub.endpoint(),
        &[],
        "  qualifier: live\n  prewarmed_instances: 0",
    );
    let (code, _, _) = http(gw.proxy, "GET", "/", &[], b"");
    assert_eq!(code, 200);
    drop(gw);
    assert!(
        stub.calls()
            .iter()
            .all(|c| c.target.contains("/invocations")),
        "no provisioned-concurrency call: {:?}",
        stub.calls()
    );

    let gw = lambda_gateway(
        &stub.endpoint(),
        &[],
        "  qualifier: live\n  remove_prewarm_on_start: true",
    );
    let del = stub.wait_call(
        "DeleteProvisionedConcurrencyConfig",
        Duration::from_secs(20),
        |c| c.method == "DELETE",
    );
    assert!(
        del.target
            .ends_with("provisioned-concurrency?Qualifier=live")
    );
    assert!(stub.calls().iter().all(|c| c.method != "PUT"));
    drop(gw);

    // A closed API port: the Put fails, is reported, and requests are still answered.
    let port = free_port();
    let gw = lambda_gateway(
        &format!("http://127.0.0.1:{port}"),
        &[],
        "  qualifier: live\n  prewarmed_instances: 2",
    );
    let st = gw.wait_status("the failed Put in /status", Duration::from_secs(30), |s| {
        s["functions"]["errors"]["counts"]
            .as_object()
            .is_some_and(|c| {
                c.keys()
                    .any(|k| k.starts_with("put_provisioned_concurrency_config"))
            })
    });
    assert!(st["functions"]["errors"]["total"].as_u64() >= Some(1));
    let (code, _, _) = http(gw.proxy, "GET", "/", &[], b"");
    assert_eq!(code, 502);
}

/// An h2 client's split `cookie` fields reach the Lambda events joined
/// once, before any backend sees the request: one `cookie` value `"a=1; b=2"` in
/// payload 1.0 (`multiValueHeaders` and `headers`), the crumbs in 2.0's `cookies`.
#[test]
fn h2_split_cookies_reach_lambda_events_joined() {
    use http_body_util::{BodyExt, Empty};
    use hyper_util::rt::{TokioExecutor, TokioIo};
    let stub = InvokeStub::start(StubReply::ok(
        r#"{"statusCode":200,"headers":{"content-type":"text/plain"},"body":"ok"}"#,
    ));
    let v1 = lambda_gateway(&stub.endpoint(), &[], "  payload_format: v1");
    let v2 = lambda_gateway(&stub.endpoint(), &[], "");
    let rt = tokio::runtime::Runtime::new().unwrap();
    for addr in [v1.proxy, v2.proxy] {
        rt.block_on(async move {
            let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
            let (mut send, conn) =
                hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
                    .await
                    .unwrap();
            tokio::spawn(conn);
            let req = http::Request::get("http://api.example/c")
                .header("cookie", "a=1")
                .header("cookie", "b=2")
                .body(Empty::<bytes::Bytes>::new())
                .unwrap();
            let resp = send.send_request(req).await.unwrap();
            assert_eq!(resp.status(), 200);
            let _ = resp.into_body().collect().await.unwrap();
        });
    }
    let events: Vec<Value> = stub
        .invocations()
        .iter()
        .map(|c| serde_json::from_slice(&c.body).unwrap())
        .collect();
    assert_eq!(events.len(), 2);
    assert_eq!(
        events[0]["multiValueHeaders"]["cookie"],
        serde_json::json!(["a=1; b=2"])
    );
    assert_eq!(events[0]["headers"]["cookie"], "a=1; b=2");
    assert_eq!(events[1]["cookies"], serde_json::json!(["a=1", "b=2"]));
    assert!(events[1]["headers"].get("cookie").is_none());
}

/// The reply shapes API Gateway and the ALB accept reach the client in
/// every payload format; other shapes stay 502.
#[test]
fn lenient_replies_reach_the_client_in_every_format() {
    for format in ["v2", "v1", "alb"] {
        let stub = InvokeStub::start(StubReply::ok(OK_REPLY));
        stub.script([
            StubReply::ok(r#"{"statusCode":"201","body":"made"}"#),
            StubReply::ok(r#"{"statusCode":200,"headers":{"x-count":3,"x-ok":true}}"#),
            StubReply::ok(r#"{"statusCode":200,"multiValueHeaders":{"x-m":[1,"b"]},"body":null}"#),
            StubReply::ok(r#"{"statusCode":"2O1","body":"bad"}"#),
        ]);
        let gw = lambda_gateway(
            &stub.endpoint(),
            &[],
            &format!("  payload_format: {format}"),
        );
        let (code, _, body) = http(gw.proxy, "GET", "/", &[], b"");
        assert_eq!((code, &body[..]), (201, &b"made"[..]), "{format}");
        let (code, h, body) = http(gw.proxy, "GET", "/", &[], b"");
        assert_eq!(code, 200, "{format}");
        assert_eq!(header(&h, "x-count"), Some("3"), "{format}");
        assert_eq!(header(&h, "x-ok"), Some("true"), "{format}");
        assert!(body.is_empty(), "{format}");
        let (code, h, _) = http(gw.proxy, "GET", "/", &[], b"");
        assert_eq!(code, 200, "{format}");
        let xm: Vec<&str> = h
            .iter()
            .filter(|(k, _)| k == "x-m")
            .map(|(_, v)| v.as_str())
            .collect();
        assert_eq!(xm, ["1", "b"], "{format}");
        let (code, _, _) = http(gw.proxy, "GET", "/", &[], b"");
        assert_eq!(code, 502, "{format}");
    }
}

/// The Invoke call carries `X-Amzn-Trace-Id` (rebuilt from the client's, or
/// derived from its W3C `traceparent`, or from the one the gateway started), and the event's headers show the same; a
/// client's `Lineage` (Lambda's recursive-loop detection) and other fields never reach
/// Lambda.
#[test]
fn invoke_carries_the_trace_header() {
    let stub = InvokeStub::start(StubReply::ok(OK_REPLY));
    let gw = lambda_gateway(&stub.endpoint(), &[], "");
    let xray = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1";
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let (code, _, _) = http(
        gw.proxy,
        "GET",
        "/t",
        &[("X-Amzn-Trace-Id", xray), ("traceparent", tp)],
        b"",
    );
    assert_eq!(code, 200);
    let (code, _, _) = http(gw.proxy, "GET", "/t", &[("traceparent", tp)], b"");
    assert_eq!(code, 200);
    let (code, _, _) = http(gw.proxy, "GET", "/t", &[], b"");
    assert_eq!(code, 200);
    let forged = format!("Lineage=a87bd80c:16;{xray};Self=1-x;Custom=y");
    let (code, _, _) = http(
        gw.proxy,
        "GET",
        "/t",
        &[("X-Amzn-Trace-Id", forged.as_str())],
        b"",
    );
    assert_eq!(code, 200);
    let (code, _, _) = http(
        gw.proxy,
        "GET",
        "/t",
        &[("X-Amzn-Trace-Id", "Root=1-not-a-trace;Lineage=a87bd80c:16")],
        b"",
    );
    assert_eq!(code, 200);
    let calls = stub.invocations();
    assert_eq!(calls.len(), 5);
    let trace = |c: &StubRequest| {
        c.headers
            .iter()
            .find(|(k, _)| k == "x-amzn-trace-id")
            .map(|(_, v)| v.clone())
    };
    assert_eq!(trace(&calls[0]).as_deref(), Some(xray));
    assert_eq!(
        trace(&calls[1]).as_deref(),
        Some("Root=1-4bf92f35-77b34da6a3ce929d0e0e4736;Parent=00f067aa0ba902b7;Sampled=1")
    );
    // No trace header from the client: derived from the traceparent the gateway
    // started (not sampled: the gateway records nothing without span export).
    let started = |c: &StubRequest| {
        let ev: Value = serde_json::from_slice(&c.body).unwrap();
        let tp = ev["headers"]["traceparent"].as_str().unwrap().to_string();
        let root = format!(
            "Root=1-{}-{};Parent={};Sampled=0",
            &tp[3..11],
            &tp[11..35],
            &tp[36..52]
        );
        (trace(c), root)
    };
    let (got, want) = started(&calls[2]);
    assert_eq!(got.as_deref(), Some(want.as_str()));
    assert_eq!(trace(&calls[3]).as_deref(), Some(xray));
    let (got, want) = started(&calls[4]);
    assert_eq!(got.as_deref(), Some(want.as_str()));
    let ev: Value = serde_json::from_slice(&calls[0].body).unwrap();
    assert_eq!(ev["headers"]["x-amzn-trace-id"], xray);
    assert_eq!(ev["headers"]["traceparent"], tp);
    let ev: Value = serde_json::from_slice(&calls[3].body).unwrap();
    assert_eq!(ev["headers"]["x-amzn-trace-id"], xray);
    let ev: Value = serde_json::from_slice(&calls[4].body).unwrap();
    assert!(ev["headers"]["x-amzn-trace-id"].is_string(), "{ev}");
}

/// Every event the gateway sends, for a corpus of odd requests, in
/// every payload format, validates against AWS Lambda Powertools' parser models
/// (`APIGatewayProxyEventV2Model`, `APIGatewayProxyEventModel`, `AlbModel`), run by
/// `scripts/validate_lambda_events.py` (needs `aws-lambda-powertools[parser]`).
#[test]
fn events_validate_against_lambda_powertools_models() {
    let corpus = odd_requests();
    let dir = tempfile::tempdir().unwrap();
    for format in ["v2", "v1", "alb"] {
        let stub = InvokeStub::start(StubReply::ok(OK_REPLY));
        let gw = lambda_gateway(
            &stub.endpoint(),
            &[],
            &format!("  payload_format: {format}"),
        );
        for (i, req) in corpus.iter().enumerate() {
            let (code, _, _) = raw(gw.proxy, req);
            assert_eq!(
                code,
                200,
                "{format} request {i}: {}",
                String::from_utf8_lossy(req)
            );
        }
        let calls = stub.invocations();
        assert_eq!(calls.len(), corpus.len(), "{format}");
        for (i, call) in calls.iter().enumerate() {
            std::fs::write(dir.path().join(format!("{format}-{i:02}.json")), &call.body).unwrap();
        }
    }
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/scripts/validate_lambda_events.py"
    );
    let out = std::process::Command::new("python3")
        .arg(script)
        .arg(dir.path())
        .output()
        .expect("python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(
        out.status.code(),
        Some(2),
        "Powertools missing for python3 on PATH: run the tests with scripts/test.sh, which installs \
         aws-lambda-powertools[parser] into ${{CARGO_TARGET_DIR:-target}}/python-venv\n{stderr}"
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let summary: Value = serde_json::from_str(stdout.trim()).unwrap();
    let n = corpus.len() as u64;
    assert_eq!(
        summary,
        serde_json::json!({"validated": {"v2": n, "v1": n, "alb": n}, "failed": 0})
    );
}

/// Requests at the edges of what the events must carry: cookies, repeated and encoded
/// query keys, binary and Unicode bodies, no `Host`, no `User-Agent`, HTTP/1.0, repeated
/// and empty headers, non-UTF-8 header bytes, trace headers. Methods are those API
/// Gateway routes (the models accept no other).
fn odd_requests() -> Vec<Vec<u8>> {
    let mut v: Vec<Vec<u8>> = vec![
        b"GET / HTTP/1.1\r\nHost: api.example.com\r\n\r\n".to_vec(),
        b"GET /search?q=caf%C3%A9&q=th%C3%A9&sp=a+b&pct=100%25&empty=&flag&amp=%26&eq=a%3Db&bad=%ZZ&utf=%FF&&k%20ey=v HTTP/1.1\r\nHost: h.example\r\nUser-Agent: odd/1.0 (x; y)\r\n\r\n".to_vec(),
        b"GET /c HTTP/1.1\r\nHost: h\r\nCookie: a=1; b=2;\r\nCookie: c=3\r\nCookie: ;;\r\n\r\n".to_vec(),
        b"GET /a%20b/%F0%9F%98%80/%2e/x? HTTP/1.1\r\nHost: [::1]:8080\r\n\r\n".to_vec(),
        b"DELETE /old HTTP/1.0\r\n\r\n".to_vec(),
        b"PATCH /h HTTP/1.1\r\nHost: h:8443\r\nX-Tag: a\r\nX-Tag: b\r\nX-Empty:\r\nX-Latin: caf\xe9\r\nContent-Length: 0\r\n\r\n".to_vec(),
        b"OPTIONS /t HTTP/1.1\r\nHost: h\r\ntraceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\r\nX-Amzn-Trace-Id: Root=1-5759e988-bd862e3fe1be46a994272793\r\n\r\n".to_vec(),
        b"HEAD /head HTTP/1.1\r\nHost: h\r\n\r\n".to_vec(),
    ];
    let binary: Vec<u8> = (0..=255u8).collect();
    let mut post = format!(
        "POST /bin HTTP/1.1\r\nHost: h\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\n\r\n",
        binary.len()
    )
    .into_bytes();
    post.extend_from_slice(&binary);
    v.push(post);
    let json = "{\"name\":\"\u{e9}\u{20ac}\u{1f600}\"}";
    v.push(
        format!(
            "PUT /items/%E2%82%AC?x=1 HTTP/1.1\r\nHost: h\r\nContent-Type: application/json; charset=utf-8\r\nContent-Length: {}\r\n\r\n{json}",
            json.len()
        )
        .into_bytes(),
    );
    let form = "a=1&b=%20&c=x+y";
    v.push(
        format!(
            "POST /form HTTP/1.1\r\nHost: h\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{form}",
            form.len()
        )
        .into_bytes(),
    );
    // One request per connection (`raw` reads until the gateway closes).
    v.into_iter()
        .map(|r| {
            let line_end = r.windows(2).position(|w| w == b"\r\n").unwrap() + 2;
            if r[..line_end].ends_with(b"HTTP/1.1\r\n") {
                [&r[..line_end], b"Connection: close\r\n", &r[line_end..]].concat()
            } else {
                r
            }
        })
        .collect()
}

/// Errors where the function never ran: each of the documented codes
/// sends the request back to a VM with a free slot (token or not) instead of a 502; an
/// error raised while the function ran stays a 502 and is not sent anywhere else.
#[test]
fn never_ran_errors_fall_back_to_a_vm_and_other_errors_stay_502() {
    let vm = SampleApi::start("vm-a");
    let stub = InvokeStub::start(StubReply::ok(OK_REPLY));
    let codes = spillway::backends::lambda::NEVER_RAN_ERROR_CODES;
    stub.script(
        codes
            .iter()
            .map(|code| StubReply::api_error(502, code, "the function never ran"))
            .chain([StubReply::api_error(
                500,
                "ServiceException",
                "while running",
            )]),
    );
    let gw = lambda_gateway(&stub.endpoint(), &[format!("http://{}", vm.addr)], "");
    let mut answers = Vec::new();
    for i in 0..400 {
        if stub.invocations().len() > codes.len() {
            break;
        }
        let payload = format!("payload-{i}");
        let (code, h, body) = http(
            gw.proxy,
            "POST",
            "/echo",
            &[("Content-Type", "text/plain")],
            payload.as_bytes(),
        );
        let on_vm = header(&h, "x-spillway-instance") == Some("vm-a") && body == payload.as_bytes();
        answers.push((stub.invocations().len(), code, on_vm));
    }
    assert_eq!(
        stub.invocations().len(),
        codes.len() + 1,
        "{}",
        gw.proc.log_text()
    );
    // Every request answered before the last scripted error came from the VM: the
    // never-ran ones after their Invoke failed.
    let before_last: Vec<_> = answers
        .iter()
        .filter(|(n, _, _)| *n <= codes.len())
        .collect();
    assert!(
        before_last
            .iter()
            .all(|(_, code, on_vm)| *code == 200 && *on_vm),
        "{answers:?}"
    );
    let (_, last_code, last_on_vm) = answers.last().unwrap();
    assert_eq!((*last_code, *last_on_vm), (502, false), "{answers:?}");
    let (_, _, metrics) = http(gw.admin, "GET", "/metrics", &[], b"");
    let metrics = String::from_utf8_lossy(&metrics);
    assert!(
        metrics.contains(&format!(
            r#"spillway_retries_total{{kind="spill_back"}} {}"#,
            codes.len()
        )),
        "{metrics}"
    );
}

/// The gateway's connections to the Lambda API send TCP keepalives, so
/// that a long Invoke survives a NAT gateway's 350 s idle timeout. While an Invoke is in
/// flight (the stub answers after 3 s), `ss` shows the keepalive timer on the gateway's
/// connection to the stub.
#[test]
fn connections_to_the_lambda_api_send_tcp_keepalives() {
    let stub = InvokeStub::start(StubReply::ok(OK_REPLY));
    stub.script([StubReply::ok(OK_REPLY).after(Duration::from_secs(3))]);
    let gw = lambda_gateway(&stub.endpoint(), &[], "");
    let proxy = gw.proxy;
    let call = std::thread::spawn(move || http(proxy, "GET", "/", &[], b"").0);
    let port = stub
        .endpoint()
        .rsplit(':')
        .next()
        .and_then(|p| p.parse::<u16>().ok())
        .expect("the stub's endpoint ends with its port");
    // The client side of the connection: destination port = the stub's.
    let filter = format!("( dport = :{port} )");
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    let lines = loop {
        let out = std::process::Command::new("ss")
            .args(["-tnoH", "state", "established", &filter])
            .output()
            .expect("ss (iproute2) is needed by this test");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if !text.trim().is_empty() || std::time::Instant::now() > deadline {
            break text;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        !lines.trim().is_empty(),
        "no connection to the stub on port {port}"
    );
    for line in lines.lines() {
        assert!(
            line.contains("timer:(keepalive"),
            "no keepalive timer: {line}"
        );
    }
    assert_eq!(call.join().unwrap(), 200);
}

/// The gateway's request id reaches the function as the event's `x-request-id` header
/// and as its `requestContext.requestId`, and comes back on the reply.
#[test]
fn the_request_id_is_the_events_request_id() {
    let stub = InvokeStub::start(StubReply::ok(OK_REPLY));
    let gw = lambda_gateway(&stub.endpoint(), &[], "");
    let (code, h, _) = http(
        gw.proxy,
        "GET",
        "/t",
        &[("X-Request-Id", "rq-lambda-1")],
        b"",
    );
    assert_eq!(code, 200);
    assert_eq!(header(&h, "x-request-id"), Some("rq-lambda-1"));
    let (code, h, _) = http(gw.proxy, "GET", "/t", &[], b"");
    assert_eq!(code, 200);
    let made = header(&h, "x-request-id").unwrap().to_string();
    let calls = stub.invocations();
    assert_eq!(calls.len(), 2);
    for (call, id) in calls.iter().zip(["rq-lambda-1", made.as_str()]) {
        let ev: Value = serde_json::from_slice(&call.body).unwrap();
        assert_eq!(ev["headers"]["x-request-id"], id, "{ev:#}");
        assert_eq!(ev["requestContext"]["requestId"], id, "{ev:#}");
    }
}
