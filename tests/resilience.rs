//! Issue 12, resilience, on real processes: the `spillway` binary in front of scripted
//! upstreams on 127.0.0.1 (port 0), short real timeouts, polling deadlines.

// Real processes on loopback: deadlines are wall-clock time.
#![allow(clippy::disallowed_methods)]

mod common;

use std::time::{Duration, Instant};

use common::stub::{Client, Reply, Stub, StubRequest, ok_reply};
use common::{Gateway, static_config, u64_at};

/// Poll `/status` until no VM has a request outstanding; returns how long it took.
fn wait_slots_free(gw: &Gateway, within: Duration) -> Duration {
    let t = Instant::now();
    gw.wait_status("every VM slot free", within, |s| {
        s["vm_pool"]["vms"]
            .as_array()
            .is_some_and(|vms| vms.iter().all(|v| v["outstanding"] == 0))
    });
    t.elapsed()
}

fn metric(gw: &Gateway, name_and_labels: &str) -> f64 {
    let (code, _, body) = common::http(gw.admin, "GET", "/metrics", &[], b"");
    assert_eq!(code, 200);
    let text = String::from_utf8(body).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(name_and_labels))
        .and_then(|rest| rest.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name_and_labels} in\n{text}"))
}

/// Item 1: an upstream that sends its head and part of the body, then stalls, has the
/// client's response aborted after `response_body_idle_timeout_seconds` (not the head
/// timeout, which is much longer) and its VM slot freed.
#[test]
fn item1_stalled_response_body_is_aborted_and_frees_the_slot() {
    const PROMISED: usize = 1000;
    const SENT: usize = 10;
    let stub = Stub::start(|req: &StubRequest| match req.target.as_str() {
        "/stall" => Reply::Raw(
            format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {PROMISED}\r\n\r\n{}",
                "x".repeat(SENT)
            )
            .into_bytes(),
        ),
        _ => ok_reply(req),
    });
    let idle = 0.4;
    let head = 20.0;
    let gw = Gateway::start(&static_config(
        &[stub.url()],
        &format!(
            "  upstream_timeout_seconds: {head}\n  response_body_idle_timeout_seconds: {idle}"
        ),
    ));
    let started = Instant::now();
    let mut c = Client::connect(gw.proxy);
    c.send(b"GET /stall HTTP/1.1\r\nHost: a\r\n\r\n");
    let got = c.rest_until_close();
    let took = started.elapsed();
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    let body_len = got.len() - (text.find("\r\n\r\n").unwrap() + 4);
    assert_eq!(
        body_len, SENT,
        "the client got what the upstream sent, then a cut"
    );
    assert!(
        took >= Duration::from_secs_f64(idle) && took < Duration::from_secs_f64(head),
        "aborted after the body idle timeout ({idle} s), not the head timeout: {took:?}"
    );
    wait_slots_free(&gw, Duration::from_secs(5));
    assert_eq!(
        metric(&gw, "spillway_timeouts_total{kind=\"response_body\"}"),
        1.0
    );
}

/// Item 2: a steady slow upload longer than every timeout reaches the upstream whole and
/// is answered; a body that pauses longer than `request_body_idle_timeout_seconds` gets
/// 408; a request whose body was sent and gets no head within
/// `upstream_timeout_seconds` gets 504, counted from the end of the body.
#[test]
fn item2_slow_upload_passes_idle_body_408_head_wait_counts_after_body() {
    let stub = Stub::start(|req: &StubRequest| match req.target.as_str() {
        "/hold" => Reply::Hold,
        _ => ok_reply(req),
    });
    let (head, idle) = (0.6, 0.5);
    let gw = Gateway::start(&static_config(
        &[stub.url()],
        &format!("  upstream_timeout_seconds: {head}\n  request_body_idle_timeout_seconds: {idle}"),
    ));
    // 12 chunks, one every 0.15 s: 1.8 s in all, three times either timeout, never
    // idle for longer than 0.15 s.
    let (chunks, size, gap) = (12, 1500, Duration::from_millis(150));
    let total = chunks * size;
    let mut c = Client::connect(gw.proxy);
    let started = Instant::now();
    c.send(
        format!("POST /upload HTTP/1.1\r\nHost: a\r\nContent-Length: {total}\r\n\r\n").as_bytes(),
    );
    for i in 0..chunks {
        std::thread::sleep(gap); // the upload's pace, not a wait for an assertion
        c.send(&vec![b'a' + (i % 26) as u8; size]);
    }
    let r = c.response().expect("a response");
    assert_eq!(r.status, 200, "{:?}", String::from_utf8_lossy(&r.body));
    assert!(started.elapsed() > Duration::from_secs_f64(head + idle));
    let got = stub.requests_to("/upload");
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].body.len(), total, "the upstream got the whole body");

    // Half a body, then silence: 408 after the idle timeout, the upstream request cut.
    let mut c = Client::connect(gw.proxy);
    let started = Instant::now();
    c.send(format!("POST /cut HTTP/1.1\r\nHost: a\r\nContent-Length: {total}\r\n\r\n").as_bytes());
    c.send(&vec![b'z'; total / 2]);
    let r = c.response().expect("a response");
    let took = started.elapsed();
    assert_eq!(r.status, 408);
    assert!(took >= Duration::from_secs_f64(idle), "{took:?}");
    assert!(
        stub.requests_to("/cut").is_empty(),
        "no complete body upstream"
    );
    assert_eq!(
        metric(&gw, "spillway_timeouts_total{kind=\"request_body\"}"),
        1.0
    );

    // A held request: 504 about `head` after the (small) body went.
    let mut c = Client::connect(gw.proxy);
    let started = Instant::now();
    c.send(b"POST /hold HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\nhi");
    let r = c.response().expect("a response");
    let took = started.elapsed();
    assert_eq!(r.status, 504);
    assert!(
        took >= Duration::from_secs_f64(head) && took < Duration::from_secs_f64(head * 5.0),
        "{took:?}"
    );
    wait_slots_free(&gw, Duration::from_secs(5));
    assert_eq!(
        metric(&gw, "spillway_timeouts_total{kind=\"upstream_head\"}"),
        1.0
    );
}

/// Item 1, tunnels: an `Upgrade` tunnel that carries no byte either way for
/// `tunnel_idle_timeout_seconds` is closed and its VM slot freed; one that keeps
/// talking stays open past it.
#[test]
fn item1_idle_tunnel_is_closed_and_frees_the_slot() {
    let stub = Stub::start(|req: &StubRequest| {
        match req.target.as_str() {
        "/ws" => Reply::Upgrade(
            b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
                .to_vec(),
        ),
        _ => ok_reply(req),
    }
    });
    let idle = 0.5;
    let gw = Gateway::start(&static_config(
        &[stub.url()],
        &format!("  tunnel_idle_timeout_seconds: {idle}"),
    ));
    let mut c = Client::connect(gw.proxy);
    c.send(b"GET /ws HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n");
    assert_eq!(c.response_to(true).expect("101").status, 101);
    // Talk for 3 × idle, a message every idle/3: the tunnel stays up.
    let talk = Instant::now();
    let mut last_byte = Instant::now();
    while talk.elapsed() < Duration::from_secs_f64(3.0 * idle) {
        c.send(b"ping");
        let mut echoed = Vec::new();
        while echoed.len() < 4 {
            let more = c.read_some();
            assert!(!more.is_empty(), "tunnel closed while in use");
            echoed.extend(more);
        }
        last_byte = Instant::now();
        std::thread::sleep(Duration::from_secs_f64(idle / 3.0)); // the talker's pace
    }
    // Then silence: closed about `idle` after the last byte.
    assert!(c.closed(), "the gateway closes an idle tunnel");
    let took = last_byte.elapsed();
    assert!(
        took >= Duration::from_secs_f64(idle * 0.9) && took < Duration::from_secs(5),
        "{took:?}"
    );
    wait_slots_free(&gw, Duration::from_secs(5));
    assert_eq!(
        metric(&gw, "spillway_timeouts_total{kind=\"tunnel_idle\"}"),
        1.0
    );
    let s = gw.status();
    assert!(u64_at(&s, "/routed/vm") >= 1);
}
