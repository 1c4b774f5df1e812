//! Resilience on real processes: the `spillway` binary in front of scripted
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

/// An upstream that sends its head and part of the body, then stalls, has the
/// client's response aborted after `response_body_idle_timeout_seconds` (not the head
/// timeout, which is much longer) and its VM slot freed.
#[test]
fn stalled_response_body_is_aborted_and_frees_the_slot() {
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

/// A steady slow upload longer than every timeout reaches the upstream whole and
/// is answered; a body that pauses longer than `request_body_idle_timeout_seconds` gets
/// 408; a request whose body was sent and gets no head within
/// `upstream_timeout_seconds` gets 504, counted from the end of the body.
#[test]
fn slow_upload_passes_idle_body_408_head_wait_counts_after_body() {
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

/// Tunnels: an `Upgrade` tunnel that carries no byte either way for
/// `tunnel_idle_timeout_seconds` is closed and its VM slot freed; one that keeps
/// talking stays open past it.
#[test]
fn idle_tunnel_is_closed_and_frees_the_slot() {
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

/// An upstream that closes a reused keep-alive connection as the next request
/// arrives (no response byte) costs no idempotent request: each GET that met it is sent
/// once more, on the other VM over a new connection. A POST that met it is never sent
/// twice: it gets 502, and no upstream saw it more than once.
#[test]
fn stale_connection_gets_are_retried_posts_are_not() {
    use parking_lot::Mutex;
    use std::collections::HashMap;
    // A: the first request of each connection is answered with keep-alive, the next one
    // on that connection finds it closed.
    let seen: Mutex<HashMap<usize, usize>> = Mutex::new(HashMap::new());
    let a = Stub::start(move |req: &StubRequest| {
        let mut seen = seen.lock();
        let n = seen.entry(req.conn).or_default();
        *n += 1;
        if *n == 1 { ok_reply(req) } else { Reply::Close }
    });
    let b = Stub::start(ok_reply);
    let gw = Gateway::start(&static_config(&[a.url(), b.url()], ""));
    let gets = 30;
    let mut codes = Vec::new();
    for i in 0..gets {
        let (code, _, _) = common::http(gw.proxy, "GET", &format!("/g{i}"), &[], b"");
        codes.push(code);
    }
    // A GET met a dropped connection when it was not its connection's first request.
    // Counted per connection, not as requests minus connections: the client's pool may
    // open a connection it then leaves idle (a checkout that raced an idle one back).
    let seen_by_a = a.requests();
    let closed_gets = seen_by_a
        .iter()
        .enumerate()
        .filter(|(i, r)| seen_by_a[..*i].iter().any(|x| x.conn == r.conn))
        .count();
    assert!(
        closed_gets >= 1,
        "the scenario happened: {} requests on {} connections",
        seen_by_a.len(),
        a.connections()
    );
    assert!(codes.iter().all(|&c| c == 200), "{codes:?}");
    // Every GET reached an upstream that answered it exactly once.
    for i in 0..gets {
        let t = format!("/g{i}");
        let answered_by_a = a
            .requests_to(&t)
            .iter()
            .filter(|r| {
                a.requests()
                    .iter()
                    .filter(|x| x.conn == r.conn)
                    .position(|x| x.target == t)
                    == Some(0)
            })
            .count();
        assert_eq!(answered_by_a + b.requests_to(&t).len(), 1, "{t}");
    }

    // POSTs: never sent twice.
    let posts = 20;
    let mut failed = 0;
    for i in 0..posts {
        let t = format!("/p{i}");
        let (code, _, _) = common::http(gw.proxy, "POST", &t, &[], b"once");
        let seen = a.requests_to(&t).len() + b.requests_to(&t).len();
        assert_eq!(seen, 1, "{t} reached the upstreams {seen} times");
        if code != 200 {
            assert_eq!(code, 502);
            failed += 1;
        }
    }
    let a_closed_posts = (0..posts)
        .filter(|i| {
            let t = format!("/p{i}");
            a.requests_to(&t).iter().any(|r| {
                a.requests()
                    .iter()
                    .filter(|x| x.conn == r.conn)
                    .position(|x| x.target == t)
                    != Some(0)
            })
        })
        .count();
    assert_eq!(
        failed, a_closed_posts,
        "exactly the POSTs that met a dropped connection failed"
    );
    let s = gw.status();
    assert_eq!(
        common::u64_at(&s, "/retry_budget/retried_total"),
        closed_gets as u64
    );
}

/// GETs in flight on a VM process that is killed are answered by the other VM;
/// so are the GETs sent after the kill.
#[test]
fn gets_in_flight_on_a_killed_vm_are_answered() {
    let mut a = common::SampleApi::start("a");
    let b = common::SampleApi::start("b");
    let urls = [format!("http://{}", a.addr), format!("http://{}", b.addr)];
    let gw = Gateway::start(&static_config(&urls, ""));
    let n = 8;
    let proxy = gw.proxy;
    let handles: Vec<_> = (0..n)
        .map(|_| {
            std::thread::spawn(move || common::http(proxy, "GET", "/sleep?ms=1500", &[], b"").0)
        })
        .collect();
    // Kill A once some of them are running on it.
    let deadline = Instant::now() + Duration::from_secs(10);
    while common::u64_at(&a.stats(), "/requests") == 0 {
        assert!(Instant::now() < deadline, "no request reached A");
        std::thread::sleep(Duration::from_millis(20));
    }
    let on_a = common::u64_at(&a.stats(), "/requests");
    a.proc.child.kill().unwrap();
    let codes: Vec<u16> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(
        codes.iter().all(|&c| c == 200),
        "{codes:?} ({on_a} were on A)"
    );
    let after: Vec<u16> = (0..10)
        .map(|_| common::http(proxy, "GET", "/", &[], b"").0)
        .collect();
    assert!(after.iter().all(|&c| c == 200), "{after:?}");
    let s = gw.status();
    assert!(common::u64_at(&s, "/retry_budget/retried_total") >= on_a);
}

/// The pid of the process whose command line contains `needle`.
fn pid_of(needle: &str) -> u32 {
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmd = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if cmd.contains(needle) && cmd.contains("sample-api") {
            return pid;
        }
    }
    panic!("no process with {needle:?}");
}

fn ready_vm_ids(s: &serde_json::Value) -> Vec<String> {
    s["vm_pool"]["vms"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| v["state"] == "ready")
        .map(|v| v["id"].as_str().unwrap().to_string())
        .collect()
}

/// A VM process killed while idle is found by the health probes and replaced at
/// once, long before the next scaling decision.
#[test]
fn a_vm_killed_while_idle_is_replaced_at_once() {
    let (epoch, k) = (1.0, 1000);
    let interval = 0.2;
    let gw = Gateway::start(&common::process_config(
        &format!(
            "  epoch_seconds: {epoch}\n  decision_epochs: {k}\n  min_vms: 1\n  max_vms: 1\n  cip_rps: 0"
        ),
        &format!("  health_check_interval_seconds: {interval}"),
    ));
    let s = gw.wait_status("one ready VM", Duration::from_secs(30), |s| {
        ready_vm_ids(s).len() == 1
    });
    let old = ready_vm_ids(&s)[0].clone();
    let url = s["vm_pool"]["vms"][0]["url"].as_str().unwrap().to_string();
    let port = url
        .trim_end_matches('/')
        .rsplit(':')
        .next()
        .unwrap()
        .to_string();
    let pid = pid_of(&format!("vm-{port}"));
    let killed = Instant::now();
    std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    let s = gw.wait_status("a replacement VM ready", Duration::from_secs(30), |s| {
        let ids = ready_vm_ids(s);
        ids.len() == 1 && ids[0] != old
    });
    let took = killed.elapsed();
    assert!(
        took < Duration::from_secs_f64(epoch * f64::from(k) / 10.0),
        "replaced in {took:?}, not at the next decision: {s:#}"
    );
    let (code, _, _) = common::http(gw.proxy, "GET", "/", &[], b"");
    assert_eq!(code, 200);
}

/// A `static` member that goes down leaves the pool and comes back when it
/// answers again, without a restart of the gateway.
#[test]
fn a_static_member_down_for_a_while_is_added_back() {
    let a = common::SampleApi::start("a");
    let b = common::SampleApi::start("b");
    let urls = [format!("http://{}", a.addr), format!("http://{}", b.addr)];
    let gw = Gateway::start(&static_config(
        &urls,
        "  health_check_interval_seconds: 0.2",
    ));
    gw.wait_status("two ready VMs", Duration::from_secs(10), |s| {
        ready_vm_ids(s).len() == 2
    });
    let addr = a.addr;
    drop(a); // SIGTERM: A is down
    gw.wait_status("A out of the pool", Duration::from_secs(10), |s| {
        ready_vm_ids(s).len() == 1
    });
    // Every request meanwhile is answered by B.
    for _ in 0..5 {
        let (code, headers, _) = common::http(gw.proxy, "GET", "/", &[], b"");
        assert_eq!(code, 200);
        assert_eq!(common::header(&headers, "x-spillway-instance"), Some("b"));
    }
    let a = common::Proc::spawn(&["sample-api", "--listen", &addr.to_string(), "--name", "a2"]);
    let s = gw.wait_status("A back in the pool", Duration::from_secs(10), |s| {
        ready_vm_ids(s).len() == 2
    });
    let urls: Vec<&str> = s["vm_pool"]["vms"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v["url"].as_str())
        .collect();
    assert!(urls.iter().any(|u| u.contains(&addr.to_string())), "{s:#}");
    // And it serves again: of two requests at once, the least-loaded rule gives it one.
    let proxy = gw.proxy;
    let served: Vec<String> = (0..2)
        .map(|_| {
            std::thread::spawn(move || {
                let (_, headers, _) = common::http(proxy, "GET", "/sleep?ms=400", &[], b"");
                common::header(&headers, "x-spillway-instance")
                    .unwrap_or("")
                    .to_string()
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap())
        .collect();
    assert!(served.iter().any(|i| i == "a2"), "{served:?}");
    drop(a);
}

/// With the function tier unreachable and an idle VM, every request is answered:
/// each call that cannot be placed on the tier falls back to the VM, and `/status`
/// counts the tier's failures and the fall-backs.
#[test]
fn unreachable_function_tier_falls_back_to_the_vm_and_is_counted() {
    let vm = Stub::start(ok_reply);
    let dead = common::closed_url("");
    let yaml = format!(
        r#"
gateway:
  listen: 127.0.0.1:0
  admin_listen: 127.0.0.1:0
  allow_loopback_upstreams: true
libra:
  decision_epochs: 1000
  r_max_rps: 1
  rho: 1.0
  cip_rps: 0
vm_pool:
  type: static
  urls: ["{}"]
function_tier:
  type: http
  url: "{dead}"
  max_concurrency: 8
"#,
        vm.url()
    );
    let gw = Gateway::start(&yaml);
    let n = 20;
    for i in 0..n {
        let (code, _, _) = common::http(gw.proxy, "GET", &format!("/r{i}"), &[], b"");
        assert_eq!(code, 200, "request {i}");
    }
    assert_eq!(vm.requests().len(), n, "every request reached the VM once");
    let s = gw.status();
    let spilled = common::u64_at(&s, "/routed/function");
    assert!(spilled >= 1, "the budget sent some to the tier: {s:#}");
    assert_eq!(
        common::u64_at(&s, "/functions/zones/0/call_failures/unreachable"),
        spilled,
        "{s:#}"
    );
    assert_eq!(common::u64_at(&s, "/functions/fall_backs_to_vm"), spilled);
}

/// A `static` pool below the cost-indifference point keeps serving on its
/// always-on VMs (up to ρ·r_max each) instead of sending everything to functions.
#[test]
fn a_static_pool_below_the_cip_serves_on_its_vms() {
    let a = common::SampleApi::start("a");
    let exe = common::exe();
    let yaml = format!(
        r#"
gateway:
  listen: 127.0.0.1:0
  admin_listen: 127.0.0.1:0
  allow_loopback_upstreams: true
libra:
  epoch_seconds: 0.2
  decision_epochs: 2
  r_max_rps: 10
  rho: 0.8
  cip_rps: 50
vm_pool:
  type: static
  urls: ["http://{}"]
function_tier:
  type: process
  command: ["{exe}", "sample-api", "--listen", "127.0.0.1:{{port}}", "--name", "fn-{{port}}"]
  max_instances: 4
"#,
        a.addr
    );
    let gw = Gateway::start(&yaml);
    // Traffic far below the CIP (50 req/s): about 2 req/s.
    let mut instances = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (code, headers, _) = common::http(gw.proxy, "GET", "/", &[], b"");
        assert_eq!(code, 200);
        instances.push(
            common::header(&headers, "x-spillway-instance")
                .unwrap_or("")
                .to_string(),
        );
        let s = gw.status();
        if s["scaling"]["last_decision"]["reason"] == "below_cip" && instances.len() >= 10 {
            break;
        }
        assert!(Instant::now() < deadline, "no below-CIP decision: {s:#}");
        std::thread::sleep(Duration::from_millis(500)); // the client's pace
    }
    // After the below-CIP decision too, every request ran on the static VM.
    for _ in 0..5 {
        let (_, headers, _) = common::http(gw.proxy, "GET", "/", &[], b"");
        instances.push(
            common::header(&headers, "x-spillway-instance")
                .unwrap_or("")
                .to_string(),
        );
    }
    assert!(instances.iter().all(|i| i == "a"), "{instances:?}");
    let s = gw.status();
    assert_eq!(common::u64_at(&s, "/routed/function"), 0, "{s:#}");
    assert_eq!(common::u64_at(&s, "/scaling/target_vms"), 0, "{s:#}");
}

/// With a bearer token, `/status` and `/metrics` need it and `/healthz` stays
/// open; `check` refuses a non-loopback admin listener without a token.
#[test]
fn admin_token_protects_status_and_metrics_healthz_stays_open() {
    let stub = Stub::start(ok_reply);
    let dir = tempfile::tempdir().unwrap();
    let token = "s3cret-Token_42";
    let token_file = dir.path().join("admin.token");
    std::fs::write(&token_file, format!("{token}\n")).unwrap();
    let gw = Gateway::start(&static_config(
        &[stub.url()],
        &format!("  admin_token_file: \"{}\"", token_file.display()),
    ));
    let get = |path: &str, auth: Option<&str>| {
        let h: Vec<(&str, String)> = auth
            .map(|a| vec![("Authorization", a.to_string())])
            .unwrap_or_default();
        let h: Vec<(&str, &str)> = h.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let (code, headers, _) = common::http(gw.admin, "GET", path, &h, b"");
        (
            code,
            common::header(&headers, "www-authenticate").map(str::to_string),
        )
    };
    assert_eq!(get("/healthz", None).0, 200);
    let bearer = format!("Bearer {token}");
    let wrong = format!("Bearer {token}x");
    for path in ["/status", "/metrics"] {
        assert_eq!(get(path, None), (401, Some("Bearer".to_string())), "{path}");
        assert_eq!(get(path, Some(&wrong)).0, 401, "{path}");
        assert_eq!(get(path, Some("Basic YTpi")).0, 401, "{path}");
        assert_eq!(get(path, Some(&bearer)).0, 200, "{path}");
    }

    // `check`: a non-loopback admin listener needs a token.
    let open = dir.path().join("open.yaml");
    std::fs::write(
        &open,
        static_config(&[stub.url()], "")
            .replace("admin_listen: 127.0.0.1:0", "admin_listen: 0.0.0.0:9901"),
    )
    .unwrap();
    let out = std::process::Command::new(common::exe())
        .args(["check", open.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("gateway.admin_listen") && err.contains("admin_token"),
        "{err}"
    );
    let with_token = dir.path().join("token.yaml");
    std::fs::write(
        &with_token,
        static_config(
            &[stub.url()],
            &format!("  admin_token_file: \"{}\"", token_file.display()),
        )
        .replace("admin_listen: 127.0.0.1:0", "admin_listen: 0.0.0.0:9901"),
    )
    .unwrap();
    let out = std::process::Command::new(common::exe())
        .args(["check", with_token.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `check` refuses metadata and link-local upstreams always, loopback ones
/// without `gateway.allow_loopback_upstreams`; `process` pools need no opt-in.
#[test]
fn upstream_address_policy() {
    let dir = tempfile::tempdir().unwrap();
    let check = |name: &str, yaml: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, yaml).unwrap();
        let out = std::process::Command::new(common::exe())
            .args(["check", path.to_str().unwrap()])
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let config = |opt_in: bool, vm: &str, function: &str| {
        format!(
            "gateway:\n  allow_loopback_upstreams: {opt_in}\nvm_pool:\n  type: static\n  urls: [\"{vm}\"]\nfunction_tier:\n  type: http\n  url: \"{function}\"\n  max_concurrency: 4\n"
        )
    };
    for (vm, rule) in [
        ("http://169.254.169.254/latest", "metadata"),
        ("http://[fd00:ec2::254]:80", "metadata"),
        ("http://169.254.10.1:8080", "link-local"),
        ("http://[fe80::1]:8080", "link-local"),
    ] {
        let (code, err) = check("m.yaml", &config(true, vm, "http://10.0.0.9:8081"));
        assert_eq!(code, Some(1), "{vm}: {err}");
        assert!(
            err.contains("vm_pool.urls[0]") && err.contains(rule),
            "{vm}: {err}"
        );
    }
    for host in ["127.0.0.1:3000", "[::1]:3000", "localhost:3000"] {
        let url = format!("http://{host}");
        let (code, err) = check("l.yaml", &config(false, &url, &url));
        assert_eq!(code, Some(1), "{host}: {err}");
        assert!(
            err.contains("vm_pool.urls[0]")
                && err.contains("function_tier.url")
                && err.contains("allow_loopback_upstreams"),
            "{host}: {err}"
        );
        let (code, err) = check("ok.yaml", &config(true, &url, &url));
        assert_eq!(code, Some(0), "{host} with the opt-in: {err}");
    }
    // Public addresses need nothing; a process pool (spillway's own children) neither.
    let (code, err) = check(
        "pub.yaml",
        &config(false, "http://10.0.0.5:8080", "http://fn.example.com/api"),
    );
    assert_eq!(code, Some(0), "{err}");
    let (code, err) = check("p.yaml", &common::process_config("  min_vms: 1", ""));
    assert_eq!(code, Some(0), "{err}");
}

/// SIGHUP reloads instead of killing: in-flight requests finish under the
/// settings they started with, new ones get the new values, listen changes are reported
/// as needing a restart; `POST /reload` needs the admin token, and an invalid file
/// changes nothing.
#[test]
fn reload_on_sighup_and_post_is_all_or_nothing_and_keeps_in_flight_requests() {
    let hold = Duration::from_millis(1500);
    let stub = Stub::start(move |req: &StubRequest| {
        if req.target == "/slow" {
            std::thread::sleep(hold); // the upstream's own slowness
        }
        ok_reply(req)
    });
    let dir = tempfile::tempdir().unwrap();
    let token = "reload-token-7";
    let token_file = dir.path().join("t");
    std::fs::write(&token_file, token).unwrap();
    let extra = |timeout: f64| {
        format!(
            "  upstream_timeout_seconds: {timeout}\n  admin_token_file: \"{}\"",
            token_file.display()
        )
    };
    let (long, short) = (5.0, 0.5);
    let gw = Gateway::start(&static_config(&[stub.url()], &extra(long)));
    let proxy = gw.proxy;
    let in_flight = std::thread::spawn(move || common::http(proxy, "GET", "/slow", &[], b"").0);
    stub.wait("the slow request upstream", Duration::from_secs(5), |s| {
        s.in_flight() == 1
    });
    // The new file: a shorter head timeout, and another listen port (restart only).
    std::fs::write(
        gw.config_path(),
        static_config(&[stub.url()], &extra(short)).replace(
            "listen: 127.0.0.1:0\n  admin",
            "listen: 127.0.0.1:1\n  admin",
        ),
    )
    .unwrap();
    gw.proc.signal("HUP");
    let line = gw
        .proc
        .wait_line("configuration reloaded", Duration::from_secs(10));
    assert!(line.contains("gateway.upstream_timeout_seconds"), "{line}");
    assert!(
        line.contains("restart_required=[\"gateway.listen\"]"),
        "{line}"
    );
    assert_eq!(
        in_flight.join().unwrap(),
        200,
        "the in-flight request kept its timeout"
    );
    let (code, _, _) = common::http(gw.proxy, "GET", "/slow", &[], b"");
    assert_eq!(
        code, 504,
        "a new request has the reloaded {short} s timeout"
    );

    // POST /reload: the token is needed; an invalid file applies nothing.
    let bearer = format!("Bearer {token}");
    let auth = [("Authorization", bearer.as_str())];
    let (code, _, _) = common::http(gw.admin, "POST", "/reload", &[], b"");
    assert_eq!(code, 401);
    std::fs::write(
        gw.config_path(),
        static_config(&[stub.url()], &extra(long)) + "bogus_key: 1\n",
    )
    .unwrap();
    let (code, _, body) = common::http(gw.admin, "POST", "/reload", &auth, b"");
    assert_eq!(code, 422, "{}", String::from_utf8_lossy(&body));
    assert!(String::from_utf8_lossy(&body).contains("bogus_key"));
    let (code, _, _) = common::http(gw.proxy, "GET", "/slow", &[], b"");
    assert_eq!(code, 504, "nothing of the invalid file was applied");
    std::fs::write(gw.config_path(), static_config(&[stub.url()], &extra(long))).unwrap();
    let (code, _, body) = common::http(gw.admin, "POST", "/reload", &auth, b"");
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
    let report: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        report["applied"],
        serde_json::json!(["gateway.upstream_timeout_seconds"]),
        "{report:#}"
    );
    let (code, _, _) = common::http(gw.proxy, "GET", "/slow", &[], b"");
    assert_eq!(code, 200, "the {long} s timeout is back");
    assert!(gw.proc.log_text().contains("spillway listening"));
}

/// CPU time of `pid` so far, in clock ticks (`/proc/PID/stat` utime + stime).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after.split(' ').collect();
    // Fields 14 and 15 of the whole line; `after` starts at field 3.
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

/// At the file-descriptor limit the accept loop backs off instead of spinning,
/// logs once per interval and counts the failures; it serves again once descriptors
/// are free.
#[test]
fn accept_at_the_descriptor_limit_backs_off() {
    let stub = Stub::start(ok_reply);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("g.yaml");
    // A connection cap above what 64 descriptors allow (the derived default stays
    // below the limit, so accept would never fail); two data-plane workers on any
    // machine: the first must not take the descriptors the second needs to start.
    std::fs::write(
        &path,
        static_config(
            &[stub.url()],
            "  max_connections: 1000
  worker_threads: 2",
        ),
    )
    .unwrap();
    let mut cmd = std::process::Command::new("sh");
    cmd.args([
        "-c",
        "ulimit -n 64 && exec \"$0\" serve --config \"$1\"",
        common::exe(),
        path.to_str().unwrap(),
    ]);
    let proc = common::Proc::spawn_command(cmd);
    let line = proc.wait_line("spillway listening", Duration::from_secs(30));
    let addr = |key: &str| -> std::net::SocketAddr {
        let rest = &line[line.find(&format!("{key}=")).unwrap() + key.len() + 1..];
        rest.split(' ').next().unwrap().parse().unwrap()
    };
    let (proxy, admin) = (addr("proxy"), addr("admin"));
    let pid = proc.child.id();
    // Hold more idle connections than the limit allows.
    let held: Vec<std::net::TcpStream> = (0..100)
        .filter_map(|_| std::net::TcpStream::connect(proxy).ok())
        .collect();
    proc.wait_line("accept failed", Duration::from_secs(10));
    let (t0, c0) = (Instant::now(), cpu_ticks(pid));
    std::thread::sleep(Duration::from_millis(1500)); // the window the CPU time is measured over
    let (secs, ticks) = (t0.elapsed().as_secs_f64(), cpu_ticks(pid) - c0);
    let share = ticks as f64 / 100.0 / secs; // CLK_TCK is 100 on Linux
    assert!(
        share < 0.25,
        "the accept loop used {:.0} % of a core",
        share * 100.0
    );
    let logged = proc.log_text().matches("accept failed").count();
    assert!(logged <= 2, "logged {logged} times in {secs:.1} s");
    drop(held);
    // Descriptors free again: served.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if std::net::TcpStream::connect(proxy).is_ok() {
            let (code, _, _) = common::http(proxy, "GET", "/after", &[], b"");
            if code == 200 {
                break;
            }
        }
        assert!(Instant::now() < deadline, "not serving again");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (code, _, body) = common::http(admin, "GET", "/metrics", &[], b"");
    assert_eq!(code, 200);
    let text = String::from_utf8(body).unwrap();
    let failures: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("spillway_accept_errors_total{listener=\"proxy\"} "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap();
    assert!(failures >= 1.0, "{text}");
}

/// During shutdown `/healthz` answers 503 `draining` while in-flight requests
/// finish.
#[test]
fn healthz_reports_draining_during_shutdown() {
    let hold = Duration::from_millis(1500);
    let stub = Stub::start(move |req: &StubRequest| {
        if req.target == "/slow" {
            std::thread::sleep(hold); // the upstream's own slowness
        }
        ok_reply(req)
    });
    let gw = Gateway::start(&static_config(&[stub.url()], "  drain_timeout_seconds: 10"));
    let (code, _, body) = common::http(gw.admin, "GET", "/healthz", &[], b"");
    assert_eq!((code, body.as_slice()), (200, b"ok\n".as_slice()));
    let proxy = gw.proxy;
    let in_flight = std::thread::spawn(move || common::http(proxy, "GET", "/slow", &[], b"").0);
    stub.wait("the slow request upstream", Duration::from_secs(5), |s| {
        s.in_flight() == 1
    });
    gw.proc.signal("TERM");
    gw.proc
        .wait_line("shutting down: draining", Duration::from_secs(5));
    let (code, _, body) = common::http(gw.admin, "GET", "/healthz", &[], b"");
    assert_eq!((code, body.as_slice()), (503, b"draining\n".as_slice()));
    assert_eq!(
        in_flight.join().unwrap(),
        200,
        "the in-flight request finished"
    );
}

/// A reload changes a `static` pool's members live: the old member leaves,
/// the new one serves, without a restart.
#[test]
fn reload_replaces_static_members() {
    let a = Stub::start(ok_reply);
    let b = Stub::start(ok_reply);
    let gw = Gateway::start(&static_config(&[a.url()], ""));
    let (code, _, _) = common::http(gw.proxy, "GET", "/before", &[], b"");
    assert_eq!(code, 200);
    std::fs::write(gw.config_path(), static_config(&[b.url()], "")).unwrap();
    let (code, _, body) = common::http(gw.admin, "POST", "/reload", &[], b"");
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
    let report: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        report["applied"],
        serde_json::json!(["vm_pool.urls"]),
        "{report:#}"
    );
    for i in 0..5 {
        let (code, _, _) = common::http(gw.proxy, "GET", &format!("/after{i}"), &[], b"");
        assert_eq!(code, 200);
    }
    assert_eq!(b.requests().len(), 5, "the new member serves");
    assert_eq!(a.requests_to("/before").len(), 1);
    assert!(a.requests().iter().all(|r| !r.target.starts_with("/after")));
    let s = gw.status();
    let vms = s["vm_pool"]["vms"].as_array().unwrap();
    assert_eq!(vms.len(), 1, "{s:#}");
    assert!(
        vms[0]["url"]
            .as_str()
            .unwrap()
            .contains(&b.addr.to_string())
    );
}

/// A static pool in front of `url` whose LIBRA decides every 0.5 s epoch (K = 1), with
/// `libra_extra` and `rest` (more top-level sections) appended.
fn libra_config(url: &str, libra_extra: &str, rest: &str) -> String {
    static_config(&[url.to_string()], "").replace(
        "libra:\n  decision_epochs: 1000\n  r_max_rps: 1000\n  rho: 1.0\n",
        &format!(
            "libra:\n  epoch_seconds: 0.5\n  decision_epochs: 1\n  r_max_rps: 1000\n  alpha: 0.4\n  beta: 0.3\n{libra_extra}\n"
        ),
    ) + rest
}

/// Uneven GET traffic (bursts of 2 and 8 every 100 ms) until `stop`, so that LIBRA's
/// deviation EWMA is well above zero.
fn uneven_traffic(
    proxy: std::net::SocketAddr,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut failed = 0;
        let mut i = 0u64;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            let n = if (i / 5).is_multiple_of(2) { 2 } else { 8 };
            for _ in 0..n {
                if common::http(proxy, "GET", "/load", &[], b"").0 != 200 {
                    failed += 1;
                }
            }
            i += 1;
            std::thread::sleep(Duration::from_millis(100)); // the traffic's own pacing
        }
        failed
    })
}

/// A reload changes φ, ρ, α and the pricing of the running policy core: the
/// reply lists them as applied, `/status` shows the new values, the CIP follows the
/// new VM price, and the next epoch's scaling decision is `avg + φ_new·std` — while
/// the EWMAs go on from their old values and no request fails.
#[test]
fn reload_applies_libra_and_pricing_to_the_running_core() {
    let stub = Stub::start(ok_reply);
    let (phi0, rho0, phi1, rho1, alpha1) = (1.0, 0.9, 2.5, 0.6, 0.15);
    let (hourly0, hourly1) = (0.0416, 0.0832);
    let file = |phi: f64, rho: f64, alpha: f64, hourly: f64| {
        libra_config(
            &stub.url(),
            &format!("  phi: {phi}\n  rho: {rho}"),
            &format!("pricing:\n  vm_hourly_usd: {hourly}\n"),
        )
        .replace("alpha: 0.4", &format!("alpha: {alpha}"))
    };
    let gw = Gateway::start(&file(phi0, rho0, 0.4, hourly0));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = uneven_traffic(gw.proxy, std::sync::Arc::clone(&stop));
    let before = gw.wait_status(
        "a few decisions under the first file",
        Duration::from_secs(20),
        |s| s["epoch"].as_u64().is_some_and(|e| e >= 3),
    );
    assert_eq!(before["libra"]["phi"], phi0, "{before:#}");
    assert_eq!(before["libra"]["rho"], rho0);
    let cip0 = before["scaling"]["cip_rps"].as_f64().unwrap();

    std::fs::write(gw.config_path(), file(phi1, rho1, alpha1, hourly1)).unwrap();
    let (code, _, body) = common::http(gw.admin, "POST", "/reload", &[], b"");
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
    let report: serde_json::Value = serde_json::from_slice(&body).unwrap();
    for key in [
        "libra.phi",
        "libra.rho",
        "libra.alpha",
        "pricing.vm_hourly_usd",
    ] {
        assert!(
            report["applied"].as_array().unwrap().contains(&key.into()),
            "{key} applied: {report:#}"
        );
    }
    assert_eq!(
        report["restart_required"],
        serde_json::json!([]),
        "{report:#}"
    );
    let at_reload = gw.status();
    assert_eq!(at_reload["libra"]["phi"], phi1, "{at_reload:#}");
    assert_eq!(at_reload["libra"]["rho"], rho1);
    assert_eq!(at_reload["libra"]["alpha"], alpha1);
    let cip1 = at_reload["scaling"]["cip_rps"].as_f64().unwrap();
    // CIP = C_vm / c_req (LIBRA §II): twice the VM price, twice the CIP.
    assert!(
        (cip1 - cip0 * hourly1 / hourly0).abs() < 0.02,
        "CIP {cip0} → {cip1}"
    );
    // The next decision (an epoch that closed after the reload) uses φ_new.
    let reload_epoch = at_reload["epoch"].as_u64().unwrap();
    let after = gw.wait_status(
        "a decision after the reload with a deviation well above zero",
        Duration::from_secs(20),
        |s| {
            let e = s["epoch"].as_u64().unwrap_or(0);
            e > reload_epoch
                && s["scaling"]["last_decision"]["epoch"] == e
                && s["traffic"]["mean_abs_deviation_rps"]
                    .as_f64()
                    .unwrap_or(0.0)
                    > 1.0
        },
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let avg = after["traffic"]["avg_rps"].as_f64().unwrap();
    let std = after["traffic"]["mean_abs_deviation_rps"].as_f64().unwrap();
    let vm_reqs = after["scaling"]["last_decision"]["vm_reqs_rps"]
        .as_f64()
        .unwrap();
    assert!(avg > cip1, "traffic above the CIP: {after:#}");
    assert!(
        (vm_reqs - (avg + phi1 * std)).abs() < 0.05,
        "vm_reqs = avg + φ_new·std: {after:#}"
    );
    assert!((vm_reqs - (avg + phi0 * std)).abs() > 0.5, "{after:#}");
    assert_eq!(
        load.join().unwrap(),
        0,
        "no request failed across the reload"
    );
}

/// Sections this gateway does not reload — function zones, the gateway queue,
/// the origin header — are reported as needing a restart and nothing of them applies
/// (the new edge zone's client networks would claim every loopback client); a second
/// reload reports them again.
#[test]
fn reload_reports_zones_and_queue_as_restart_required_and_applies_nothing() {
    let stub = Stub::start(ok_reply);
    let first = libra_config(&stub.url(), "", "");
    let gw = Gateway::start(&first);
    let zones = format!(
        r#"function_zones:
  - name: edge-a
    kind: edge
    type: process
    command: ["{exe}", "sample-api", "--listen", "127.0.0.1:{{port}}", "--name", "edge-{{port}}"]
    max_instances: 2
    client_cidrs: ["127.0.0.0/8"]
queue:
  order: fifo
  max_queue_length: 7
  max_queue_wait_seconds: 3
"#,
        exe = common::exe()
    );
    std::fs::write(gw.config_path(), libra_config(&stub.url(), "", &zones)).unwrap();
    for round in 0..2 {
        let (code, _, body) = common::http(gw.admin, "POST", "/reload", &[], b"");
        assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
        let report: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(report["applied"], serde_json::json!([]), "{report:#}");
        let restart = report["restart_required"].as_array().unwrap();
        for key in ["function_zones", "queue"] {
            assert!(restart.contains(&key.into()), "round {round}: {report:#}");
        }
    }
    assert!(
        gw.proc
            .log_text()
            .contains("changed keys need a restart and were not applied")
    );
    let s = gw.status();
    let zones: Vec<&str> = s["functions"]["zones"]
        .as_array()
        .unwrap()
        .iter()
        .map(|z| z["name"].as_str().unwrap())
        .collect();
    assert_eq!(zones, ["cloud"], "{s:#}");
    assert!(s["queue"].is_null(), "{s:#}");
    for i in 0..5 {
        let (code, _, _) = common::http(gw.proxy, "GET", &format!("/z{i}"), &[], b"");
        assert_eq!(code, 200);
    }
    assert_eq!(
        stub.requests().len(),
        5,
        "the VM still serves every request"
    );
}
