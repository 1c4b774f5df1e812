//! Asynchronous calls over HTTP (ProFaaStinate §3): `Prefer: respond-async` →
//! 202 + `Location` + `Preference-Applied`, the status URL through a call's life, the
//! stored result and its expiry, and every refusal (400, 413, 503 + `Retry-After`) —
//! against the real binary and a stub upstream on loopback.
// Real processes: wall-clock polling deadlines.
#![allow(clippy::disallowed_methods)]

mod common;

use std::time::{Duration, Instant};

use common::stub::{Stub, ok_reply};
use common::{Gateway, function_http_config, header, http};
use serde_json::Value;

/// A route on every path that honours `Prefer: respond-async` (asynchronous calls are
/// off unless a route enables them).
const PREFER_EVERYWHERE: &str = "routes:\n  - {name: api, path_prefix: /, async: prefer}\n";

fn gateway(stub: &Stub, async_yaml: &str) -> Gateway {
    let yaml = format!(
        "{}\n{PREFER_EVERYWHERE}async:\n{async_yaml}\n",
        function_http_config(&stub.url(), "")
    );
    Gateway::start(&yaml)
}

fn get_json(gw: &Gateway, path: &str) -> (u16, Value) {
    let (code, _, body) = http(gw.proxy, "GET", path, &[], b"");
    (code, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

/// Poll the status URL until `state`.
fn wait_state(gw: &Gateway, location: &str, state: &str, within: Duration) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let (code, v) = get_json(gw, location);
        assert_eq!(code, 200, "{v}");
        if v["state"] == state {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "{location} never reached {state}: {v}\n{}",
            gw.proc.log_text()
        );
        std::thread::sleep(Duration::from_millis(25));
    }
}

#[test]
fn an_async_call_is_accepted_runs_once_and_its_result_can_be_fetched() {
    let stub = Stub::start(ok_reply);
    let gw = gateway(&stub, "  deadline_header: X-Deadline-Ms");
    let (code, h, _) = http(
        gw.proxy,
        "POST",
        "/echo?n=7",
        &[("Prefer", "respond-async"), ("X-Deadline-Ms", "45000")],
        b"payload",
    );
    assert_eq!(code, 202);
    assert_eq!(header(&h, "preference-applied"), Some("respond-async"));
    let location = header(&h, "location").expect("Location").to_owned();
    let id = location.rsplit('/').next().unwrap().to_owned();
    assert!(location.starts_with("/_spillway/calls/"), "{location}");
    assert_eq!(id.len(), 32, "128-bit id as hex");
    let done = wait_state(&gw, &location, "done", Duration::from_secs(20));
    assert_eq!(done["attempts"], 1);
    let accepted = done["accepted_at"].as_u64().unwrap();
    let deadline = done["deadline"].as_u64().unwrap();
    assert_eq!(deadline - accepted, 45_000, "the header's deadline");
    assert!(done["finished_at"].as_u64().unwrap() >= done["started_at"].as_u64().unwrap());
    // The upstream got the call once, with its id and without the deadline header.
    let seen = stub.requests_to("/echo?n=7");
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].get("spillway-call-id"), Some(id.as_str()));
    assert_eq!(seen[0].get("x-deadline-ms"), None);
    assert_eq!(seen[0].body, b"payload");
    let (code, _, body) = http(gw.proxy, "GET", &format!("{location}/result"), &[], b"");
    assert_eq!(code, 200);
    assert_eq!(body, b"path=/echo?n=7");
    // Unknown ids are 404.
    let other = format!("/_spillway/calls/{}", "0".repeat(32));
    assert_eq!(get_json(&gw, &other).0, 404);
    assert_eq!(get_json(&gw, "/_spillway/calls/not-an-id").0, 404);
}

#[test]
fn refusals_are_400_413_and_503_and_sync_traffic_is_unaffected() {
    let stub = Stub::start(ok_reply);
    // One idle release per sample, one sample an hour: the first call runs, the
    // second waits, the third finds the queue full.
    let gw = gateway(
        &stub,
        "  max_queued: 1\n  release_batch: 1\n  sample_interval_seconds: 3600\n  max_deadline_seconds: 600\n  max_body_bytes: 64\n  retry_after_seconds: 7",
    );
    let prefer = ("Prefer", "respond-async");
    for bad in ["0", "-5", "soon", "600001"] {
        let (code, _, _) = http(
            gw.proxy,
            "POST",
            "/echo",
            &[prefer, ("Spillway-Deadline-Ms", bad)],
            b"x",
        );
        assert_eq!(code, 400, "deadline {bad:?}");
    }
    let (code, _, _) = http(
        gw.proxy,
        "GET",
        "/ws",
        &[prefer, ("Connection", "Upgrade"), ("Upgrade", "websocket")],
        b"",
    );
    assert_eq!(code, 400, "Upgrade cannot be asynchronous");
    let (code, _, _) = http(gw.proxy, "POST", "/echo", &[prefer], &[b'a'; 65]);
    assert_eq!(code, 413);

    let (code, h1, _) = http(gw.proxy, "POST", "/first", &[prefer], b"1");
    assert_eq!(code, 202);
    let first = header(&h1, "location").unwrap().to_owned();
    wait_state(&gw, &first, "done", Duration::from_secs(20));
    let (code, h2, _) = http(gw.proxy, "POST", "/second", &[prefer], b"2");
    assert_eq!(code, 202);
    let second = header(&h2, "location").unwrap().to_owned();
    let v = wait_state(&gw, &second, "queued", Duration::from_secs(5));
    assert!(v["started_at"].is_null());
    assert_eq!(
        http(gw.proxy, "GET", &format!("{second}/result"), &[], b"").0,
        404,
        "no result before the call ran"
    );
    let (code, h3, _) = http(gw.proxy, "POST", "/third", &[prefer], b"3");
    assert_eq!(code, 503, "queue at async.max_queued");
    assert_eq!(header(&h3, "retry-after"), Some("7"));
    let (code, _, body) = http(gw.proxy, "POST", "/sync", &[], b"s");
    assert_eq!((code, body.as_slice()), (200, b"path=/sync".as_slice()));
    let st = gw.status();
    assert_eq!(st["async"]["queued"], 1, "{st:#}");
}

#[test]
fn a_finished_call_is_deleted_after_its_result_ttl() {
    let stub = Stub::start(ok_reply);
    let gw = gateway(&stub, "  result_ttl_seconds: 0.3");
    let (code, h, _) = http(
        gw.proxy,
        "POST",
        "/echo",
        &[("Prefer", "wait=5, respond-async")],
        b"x",
    );
    assert_eq!(code, 202);
    let location = header(&h, "location").unwrap().to_owned();
    wait_state(&gw, &location, "done", Duration::from_secs(20));
    // 200 within the TTL, then 410 until the purge deletes the call: 404.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut seen = Vec::new();
    loop {
        let code = http(gw.proxy, "GET", &format!("{location}/result"), &[], b"").0;
        assert!(matches!(code, 200 | 410 | 404), "{code}");
        if seen.last() != Some(&code) {
            seen.push(code);
        }
        if code == 404 {
            break;
        }
        assert!(Instant::now() < deadline, "never purged: {seen:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        seen.starts_with(&[200]) && seen.ends_with(&[404]),
        "{seen:?}"
    );
    assert_eq!(get_json(&gw, &location).0, 404, "the call is gone too");
}

/// A store that fails every write (behind the store trait: CI runs as root, so file
/// permissions cannot make a real one fail).
struct FailingStore;

impl spillway::proxy::async_calls::store::CallStore for FailingStore {
    fn insert(
        &self,
        _: &spillway::proxy::async_calls::store::CallRecord,
        _: &[u8],
    ) -> Result<(), spillway::proxy::async_calls::store::StoreError> {
        Err(spillway::proxy::async_calls::store::StoreError::Io(
            "disk full".into(),
        ))
    }
    fn update(
        &self,
        _: &spillway::proxy::async_calls::store::CallRecord,
    ) -> Result<(), spillway::proxy::async_calls::store::StoreError> {
        Err(spillway::proxy::async_calls::store::StoreError::Io(
            "disk full".into(),
        ))
    }
    fn finish(
        &self,
        _: &spillway::proxy::async_calls::store::CallRecord,
        _: &spillway::proxy::async_calls::store::CallResult,
    ) -> Result<(), spillway::proxy::async_calls::store::StoreError> {
        Err(spillway::proxy::async_calls::store::StoreError::Io(
            "disk full".into(),
        ))
    }
    fn get(
        &self,
        _: &str,
    ) -> Result<
        Option<spillway::proxy::async_calls::store::CallRecord>,
        spillway::proxy::async_calls::store::StoreError,
    > {
        Ok(None)
    }
    fn body(
        &self,
        _: &str,
    ) -> Result<Option<Vec<u8>>, spillway::proxy::async_calls::store::StoreError> {
        Ok(None)
    }
    fn result(
        &self,
        _: &str,
    ) -> Result<
        Option<spillway::proxy::async_calls::store::CallResult>,
        spillway::proxy::async_calls::store::StoreError,
    > {
        Ok(None)
    }
    fn pending(
        &self,
    ) -> Result<
        Vec<spillway::proxy::async_calls::store::CallRecord>,
        spillway::proxy::async_calls::store::StoreError,
    > {
        Ok(vec![])
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_store_is_503_with_retry_after_and_sync_traffic_still_flows() {
    let stub = Stub::start(ok_reply);
    let yaml = format!(
        "{}\n{PREFER_EVERYWHERE}async:\n  retry_after_seconds: 11\n",
        function_http_config(&stub.url(), "")
    );
    let config = spillway::config::Config::from_yaml(&yaml, "t.yaml").unwrap();
    let server = spillway::proxy::server::Server::bind_with_store(
        config,
        common::exe().into(),
        Some(std::sync::Arc::new(FailingStore)),
    )
    .await
    .unwrap();
    let addr = server.proxy_addr();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(server.run(async {
        let _ = stopped.await;
    }));
    let (a, s) = tokio::task::spawn_blocking(move || {
        (
            http(addr, "POST", "/echo", &[("Prefer", "respond-async")], b"x"),
            http(addr, "POST", "/echo", &[], b"x"),
        )
    })
    .await
    .unwrap();
    assert_eq!(a.0, 503, "not stored, not accepted");
    assert_eq!(header(&a.1, "retry-after"), Some("11"));
    assert_eq!(s.0, 200, "synchronous traffic is unaffected");
    assert!(
        stub.requests_to("/echo").len() == 1,
        "only the synchronous call ran"
    );
    let _ = stop.send(());
    let _ = run.await;
}

/// A fake Prometheus on loopback: every request gets `reply`'s current status and JSON
/// body (the `/api/v1/query` API's shape).
fn fake_prometheus(reply: std::sync::Arc<parking_lot::Mutex<(u16, String)>>) -> Stub {
    Stub::start(move |_| {
        let (code, body) = reply.lock().clone();
        common::stub::Reply::Raw(
            format!(
                "HTTP/1.1 {code} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .into_bytes(),
        )
    })
}

/// An instant-query vector reply with one sample per VM.
fn vector(values: &[f64]) -> String {
    let samples: Vec<String> = values
        .iter()
        .enumerate()
        .map(|(i, v)| {
            format!(r#"{{"metric":{{"instance":"vm-{i}:9100"}},"value":[1764547200.25,"{v}"]}}"#)
        })
        .collect();
    format!(
        r#"{{"status":"success","data":{{"resultType":"vector","result":[{}]}}}}"#,
        samples.join(",")
    )
}

/// Wait until the fake Prometheus has answered `more` further queries.
fn wait_queries(gw: &Gateway, prom: &Stub, more: usize) {
    let target = prom.requests().len() + more;
    let deadline = Instant::now() + Duration::from_secs(20);
    while prom.requests().len() < target {
        assert!(
            Instant::now() < deadline,
            "the gateway stopped querying Prometheus\n{}",
            gw.proc.log_text()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn the_prometheus_cpu_signal_holds_calls_while_busy_and_falls_back_on_a_bad_reply() {
    let busy = [0.97, 0.81];
    let busy_mean = busy.iter().sum::<f64>() / busy.len() as f64;
    let reply = std::sync::Arc::new(parking_lot::Mutex::new((200, vector(&busy))));
    let prom = fake_prometheus(std::sync::Arc::clone(&reply));
    let stub = Stub::start(ok_reply);
    let gw = gateway(
        &stub,
        &format!(
            "  cpu_signal: prometheus\n  prometheus:\n    url: \"{}\"\n    timeout_ms: 500\n  \
             busy_utilisation: 0.65\n  sample_interval_seconds: 0.05\n  window_seconds: 0.15\n  \
             switch_interval_seconds: 0\n  urgency_window_seconds: 2",
            prom.url()
        ),
    );
    let mode = |s: &Value| s["async"]["mode"].as_str().map(str::to_owned);
    // Busy from Prometheus's answer (the mean of the VMs' samples), once the window
    // holds only answered samples (before the first answer, `outstanding` stands in).
    let st = gw.wait_status("busy at the VMs' mean", Duration::from_secs(20), |s| {
        mode(s).as_deref() == Some("busy")
            && s["async"]["cpu_utilisation"]
                .as_f64()
                .is_some_and(|c| (c - busy_mean).abs() < 0.01)
    });
    assert_eq!(st["async"]["cpu_signal"]["in_use"], "prometheus", "{st:#}");
    let q = prom.requests()[0].target.clone();
    let (path, query) = q.split_once('?').unwrap();
    assert_eq!(path, "/api/v1/query");
    let query: Vec<(String, String)> = form_urlencoded::parse(query.as_bytes())
        .into_owned()
        .collect();
    assert_eq!(query.len(), 1);
    assert_eq!(query[0].0, "query");
    assert!(
        query[0].1.contains("node_cpu_seconds_total{mode=\"idle\"}"),
        "{query:?}"
    );

    // Busy: a call far from its deadline waits.
    let (code, h, _) = http(
        gw.proxy,
        "POST",
        "/deferred",
        &[
            ("Prefer", "respond-async"),
            ("Spillway-Deadline-Ms", "60000"),
        ],
        b"d",
    );
    assert_eq!(code, 202);
    let location = header(&h, "location").unwrap().to_owned();
    wait_queries(&gw, &prom, 10);
    assert_eq!(get_json(&gw, &location).1["state"], "queued");
    assert!(stub.requests_to("/deferred").is_empty());

    // A bad reply: one clear warning, the outstanding signal (nothing in flight: 0)
    // stands in, the scheduler goes idle and releases the call.
    *reply.lock() = (
        400,
        r#"{"status":"error","errorType":"bad_data","error":"1:5: parse error: unexpected end of input"}"#
            .into(),
    );
    wait_state(&gw, &location, "done", Duration::from_secs(20));
    wait_queries(&gw, &prom, 10);
    let log = gw.proc.log_text();
    let warnings: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("prometheus CPU signal failed"))
        .collect();
    assert_eq!(warnings.len(), 1, "one warning per outage:\n{log}");
    assert!(
        warnings[0].contains("bad_data") && warnings[0].contains("unexpected end of input"),
        "{}",
        warnings[0]
    );
    assert!(warnings[0].contains(&prom.url()), "{}", warnings[0]);
    let st = gw.status();
    assert_eq!(st["async"]["cpu_signal"]["in_use"], "outstanding", "{st:#}");
    assert!(
        st["async"]["cpu_signal"]["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("bad_data")),
        "{st:#}"
    );

    // Prometheus answers again: back on its signal, busy again.
    *reply.lock() = (200, vector(&busy));
    gw.wait_status("busy again", Duration::from_secs(20), |s| {
        mode(s).as_deref() == Some("busy") && s["async"]["cpu_signal"]["in_use"] == "prometheus"
    });
    assert!(
        gw.proc
            .log_text()
            .contains("prometheus CPU signal answers again")
    );
}

/// The value of the sample `series` (name with its labels, as exposed) in a scrape.
fn metric(scrape: &str, series: &str) -> Option<f64> {
    scrape.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

#[test]
fn an_async_route_defers_without_prefer_with_its_own_deadline_and_metrics_count_calls() {
    let stub = Stub::start(ok_reply);
    let (route_s, default_s) = (42.0, 77.0);
    let yaml = format!(
        "{}\nroutes:\n  - {{name: jobs, path_prefix: /jobs, methods: [POST], async: always, \
         default_deadline_seconds: {route_s}}}\n  - {{name: api, path_prefix: /, async: prefer}}\n\
         async:\n  default_deadline_seconds: {default_s}\n",
        function_http_config(&stub.url(), "")
    );
    let gw = Gateway::start(&yaml);
    let deadline_ms = |loc: &str| {
        let v = wait_state(&gw, loc, "done", Duration::from_secs(20));
        v["deadline"].as_u64().unwrap() - v["accepted_at"].as_u64().unwrap()
    };
    // The route makes a POST asynchronous without `Prefer`, with the route's deadline.
    let (code, h, _) = http(gw.proxy, "POST", "/jobs/7", &[], b"j");
    assert_eq!(code, 202);
    let on_route = header(&h, "location").unwrap().to_owned();
    assert_eq!(deadline_ms(&on_route), (route_s * 1000.0) as u64);
    // `Prefer` on the `prefer` route: `async.default_deadline_seconds`.
    let (code, h, _) = http(
        gw.proxy,
        "POST",
        "/echo",
        &[("Prefer", "respond-async")],
        b"e",
    );
    assert_eq!(code, 202);
    let off_route = header(&h, "location").unwrap().to_owned();
    assert_eq!(deadline_ms(&off_route), (default_s * 1000.0) as u64);
    // Another method, or a path that only shares the prefix's characters: synchronous.
    for (method, path) in [("GET", "/jobs/7"), ("POST", "/jobsx")] {
        let (code, _, body) = http(gw.proxy, method, path, &[], b"");
        assert_eq!(code, 200, "{method} {path}");
        assert_eq!(body, format!("path={path}").into_bytes());
    }
    let accepted = 2.0;
    let scrape =
        String::from_utf8_lossy(&http(gw.admin, "GET", "/metrics", &[], b"").2).into_owned();
    assert_eq!(
        metric(&scrape, "spillway_async_accepted_total"),
        Some(accepted),
        "{scrape}"
    );
    // No VM is ready (min_vms: 0): idle releases go to the function tier at once.
    assert_eq!(
        metric(
            &scrape,
            "spillway_async_released_total{kind=\"idle\",tier=\"function\"}"
        ),
        Some(accepted),
        "{scrape}"
    );
    assert_eq!(
        metric(&scrape, "spillway_async_finished_total{state=\"done\"}"),
        Some(accepted),
        "{scrape}"
    );
    assert_eq!(
        metric(&scrape, "spillway_async_queued"),
        Some(0.0),
        "{scrape}"
    );
    assert_eq!(
        metric(&scrape, "spillway_async_busy"),
        Some(0.0),
        "{scrape}"
    );
    assert_eq!(
        metric(&scrape, "spillway_async_deadline_misses_total"),
        Some(0.0),
        "{scrape}"
    );
}

#[test]
fn on_the_quickstart_an_async_call_is_done_within_seconds() {
    // The shipped quickstart with nothing but its listeners moved to free ports.
    let quickstart = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/config/quickstart.yaml"
    ))
    .unwrap();
    let yaml = quickstart
        .replace("listen: 127.0.0.1:8080", "listen: 127.0.0.1:0")
        .replace("admin_listen: 127.0.0.1:9901", "admin_listen: 127.0.0.1:0");
    assert!(!yaml.contains(":8080") && !yaml.contains(":9901"), "{yaml}");
    let gw = Gateway::start(&yaml);
    let (code, h, _) = http(
        gw.proxy,
        "POST",
        "/echo",
        &[("Prefer", "respond-async")],
        b"hello",
    );
    assert_eq!(code, 202);
    assert_eq!(header(&h, "preference-applied"), Some("respond-async"));
    let location = header(&h, "location").expect("Location").to_owned();
    let done = wait_state(&gw, &location, "done", Duration::from_secs(10));
    assert_eq!(done["attempts"], 1);
    let (code, _, body) = http(gw.proxy, "GET", &format!("{location}/result"), &[], b"");
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(body, b"hello", "the sample API's /echo answer, stored");
}

#[test]
fn asynchronous_calls_are_off_unless_a_route_enables_them() {
    let stub = Stub::start(ok_reply);
    let prefer = [("Prefer", "respond-async")];
    // No route enables them: `Prefer` is ignored, nothing is stored, no state directory.
    let gw = Gateway::start(&function_http_config(&stub.url(), ""));
    let (code, h, body) = http(gw.proxy, "POST", "/echo", &prefer, b"now");
    assert_eq!((code, body.as_slice()), (200, b"path=/echo".as_slice()));
    assert_eq!(header(&h, "preference-applied"), None);
    let status_url = format!("/_spillway/calls/{}", "0".repeat(32));
    assert_eq!(
        http(gw.proxy, "GET", &status_url, &[], b"").0,
        200,
        "proxied, not a status URL"
    );
    assert!(gw.status()["async"].is_null(), "{:#}", gw.status());
    let state = gw.config_path().with_file_name("state");
    assert!(!state.exists(), "no store without asynchronous calls");
    drop(gw);
    // `async: prefer` on /jobs only: `Prefer` elsewhere is synchronous; `async: off`
    // (and `false`) on a more specific route overrides nothing but itself.
    let yaml = format!(
        "{}\nroutes:\n  - {{name: quick, path_prefix: /jobs/quick, async: false}}\n  \
         - {{name: jobs, path_prefix: /jobs, async: prefer}}\n",
        function_http_config(&stub.url(), "")
    );
    let gw = Gateway::start(&yaml);
    assert_eq!(http(gw.proxy, "POST", "/jobs/7", &prefer, b"j").0, 202);
    assert_eq!(
        http(gw.proxy, "POST", "/jobs/7", &[], b"j").0,
        200,
        "no Prefer"
    );
    assert_eq!(http(gw.proxy, "POST", "/jobs/quick", &prefer, b"q").0, 200);
    assert_eq!(http(gw.proxy, "POST", "/other", &prefer, b"o").0, 200);
    assert!(
        state_store(&gw).exists(),
        "the store is in the state directory"
    );
}

/// The store file of a gateway started by the harness (its `--state-dir`).
fn state_store(gw: &Gateway) -> std::path::PathBuf {
    gw.config_path()
        .with_file_name("state")
        .join("async/calls.redb")
}

#[test]
fn a_second_gateway_on_a_locked_store_says_which_directory_and_what_to_change() {
    let stub = Stub::start(ok_reply);
    let state = tempfile::tempdir().unwrap();
    let yaml = format!(
        "{}\n{PREFER_EVERYWHERE}",
        function_http_config(&stub.url(), "")
    );
    let first = Gateway::start_in(&yaml, state.path());
    assert_eq!(
        http(
            first.proxy,
            "POST",
            "/a",
            &[("Prefer", "respond-async")],
            b""
        )
        .0,
        202
    );
    let cfg = state.path().join("second.yaml");
    std::fs::write(&cfg, &yaml).unwrap();
    let mut second = common::Proc::spawn(&[
        "serve",
        cfg.to_str().unwrap(),
        "--state-dir",
        state.path().to_str().unwrap(),
    ]);
    let code = second.wait_exit(Duration::from_secs(30));
    assert_eq!(code, Some(1), "{}", second.log_text());
    // The exit can come before the reader thread has the last line: wait for it.
    let line = second.wait_line("error:", Duration::from_secs(5));
    assert!(line.contains(&state.path().display().to_string()), "{line}");
    assert!(line.contains("in use by another process"), "{line}");
    assert!(line.contains("--state-dir DIR"), "{line}");
    // The first one is unaffected.
    assert_eq!(
        http(
            first.proxy,
            "POST",
            "/b",
            &[("Prefer", "respond-async")],
            b""
        )
        .0,
        202
    );
}

#[test]
fn the_process_cpu_signal_counts_the_vm_processes_not_other_load_on_the_host() {
    let stub = Stub::start(ok_reply);
    let yaml = format!(
        "{}\n{PREFER_EVERYWHERE}async:\n  cpu_signal: process\n  sample_interval_seconds: 0.1\n  \
         window_seconds: 0.5\n  busy_utilisation: 0.9\n",
        function_http_config(&stub.url(), "").replace("min_vms: 0", "min_vms: 1")
    );
    let gw = Gateway::start(&yaml);
    let line = gw.proc.wait_line("VM ready", Duration::from_secs(30));
    let base = line
        .split_whitespace()
        .find_map(|f| f.strip_prefix("base=http://"))
        .unwrap()
        .trim_end_matches('/');
    let vm: std::net::SocketAddr = base.parse().unwrap();
    let cpu = |s: &Value| s["async"]["cpu_utilisation"].as_f64();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Load on the host, not in a VM: a core spinning in this test process.
    let spinner = burn(std::sync::Arc::clone(&stop), || {
        std::hint::black_box((0..10_000u64).sum::<u64>());
    });
    gw.wait_status("a CPU reading", Duration::from_secs(20), |s| {
        cpu(s).is_some()
    });
    for _ in 0..20 {
        let s = gw.status();
        let u = cpu(&s).unwrap();
        assert!(u < 0.05, "an idle VM is not busy, whatever else runs: {u}");
        std::thread::sleep(Duration::from_millis(100));
    }
    // Work in the VM shows up.
    let loaders: Vec<_> = (0..2)
        .map(|_| {
            burn(std::sync::Arc::clone(&stop), move || {
                let (code, _, _) = http(vm, "GET", "/resize", &[], b"");
                assert_eq!(code, 200);
            })
        })
        .collect();
    gw.wait_status("the VM's CPU in the signal", Duration::from_secs(30), |s| {
        cpu(s).is_some_and(|u| u >= 0.02)
    });
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    spinner.join().unwrap();
    for l in loaders {
        l.join().unwrap();
    }
}

/// Run `work` in a loop on a new thread until `stop`.
fn burn(
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    work: impl Fn() + Send + 'static,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            work();
        }
    })
}

/// Per scrape, how much each CPU's `node_cpu_seconds_total` grows: (idle, user, system)
/// seconds, for two CPUs.
type CpuStep = [(f64, f64, f64); 2];

/// The utilisation a node_exporter scraped twice across one `step` shows:
/// 1 − Δidle/Δtotal over both CPUs.
fn step_utilisation(step: &CpuStep) -> f64 {
    let idle: f64 = step.iter().map(|c| c.0).sum();
    let total: f64 = step.iter().map(|c| c.0 + c.1 + c.2).sum();
    1.0 - idle / total
}

/// What the fake node_exporter serves next.
#[derive(Clone, Copy)]
enum Exporter {
    /// Counters that grow by the step on every scrape.
    Counting(CpuStep),
    /// This status, no body.
    Failing(u16),
    /// Counters back near zero (a rebooted VM host), then growing by the step.
    Rebooted(CpuStep),
}

/// A fake node_exporter on loopback: `/metrics` in the Prometheus text format with two
/// CPUs' `node_cpu_seconds_total` counters, advanced by the current step per scrape.
fn fake_node_exporter(mode: std::sync::Arc<parking_lot::Mutex<Exporter>>) -> Stub {
    let counters = parking_lot::Mutex::new([(5000.25, 1200.5, 300.75), (4800.0, 1500.0, 410.5)]);
    Stub::start(move |_| {
        let mut mode = mode.lock();
        let mut c = counters.lock();
        let step = match *mode {
            Exporter::Failing(code) => {
                return common::stub::Reply::Raw(
                    format!("HTTP/1.1 {code} X\r\nContent-Length: 0\r\n\r\n").into_bytes(),
                );
            }
            Exporter::Rebooted(step) => {
                *c = [(1.5, 0.5, 0.25), (1.0, 0.75, 0.5)];
                *mode = Exporter::Counting(step);
                None
            }
            Exporter::Counting(step) => Some(step),
        };
        if let Some(step) = step {
            for (cpu, d) in c.iter_mut().zip(step) {
                cpu.0 += d.0;
                cpu.1 += d.1;
                cpu.2 += d.2;
            }
        }
        let mut body = String::from(
            "# HELP node_cpu_seconds_total Seconds the CPUs spent in each mode.\n\
             # TYPE node_cpu_seconds_total counter\n",
        );
        for (i, (idle, user, system)) in c.iter().enumerate() {
            body += &format!(
                "node_cpu_seconds_total{{cpu=\"{i}\",mode=\"idle\"}} {idle}\n\
                 node_cpu_seconds_total{{cpu=\"{i}\",mode=\"system\"}} {system}\n\
                 node_cpu_seconds_total{{cpu=\"{i}\",mode=\"user\"}} {user}\n"
            );
        }
        body += "# TYPE node_load1 gauge\nnode_load1 0.42\n";
        common::stub::Reply::Raw(
            format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .into_bytes(),
        )
    })
}

#[test]
fn the_node_exporter_cpu_signal_follows_each_vm_hosts_counters() {
    // Busy: 0.15 + 0.55 s idle of 2 s → 0.65 busy; idle: 0.85 + 0.6 s of 2 s → 0.275.
    let busy: CpuStep = [(0.15, 0.6, 0.25), (0.55, 0.3, 0.15)];
    let idle: CpuStep = [(0.85, 0.1, 0.05), (0.6, 0.3, 0.1)];
    let (busy_u, idle_u) = (step_utilisation(&busy), step_utilisation(&idle));
    let threshold = 0.55;
    assert!(busy_u > threshold && idle_u < threshold);
    let mode = std::sync::Arc::new(parking_lot::Mutex::new(Exporter::Counting(busy)));
    let exporter = fake_node_exporter(std::sync::Arc::clone(&mode));
    let stub = Stub::start(ok_reply);
    // The process VM pool runs its VMs on 127.0.0.1: the fake exporter on 127.0.0.1 is
    // every VM host's node_exporter.
    let yaml = format!(
        "{}\n{PREFER_EVERYWHERE}async:\n  cpu_signal: prometheus\n  prometheus:\n    node_exporter_port: {}\n    \
         timeout_ms: 500\n  busy_utilisation: {threshold}\n  sample_interval_seconds: 0.05\n  \
         window_seconds: 0.15\n  switch_interval_seconds: 0\n  urgency_window_seconds: 2\n",
        function_http_config(&stub.url(), "").replace("min_vms: 0", "min_vms: 1"),
        exporter.addr.port()
    );
    let gw = Gateway::start(&yaml);
    gw.proc.wait_line("VM ready", Duration::from_secs(30));
    let mode_of = |s: &Value| s["async"]["mode"].as_str().map(str::to_owned);
    let near = |s: &Value, u: f64| {
        s["async"]["cpu_utilisation"]
            .as_f64()
            .is_some_and(|c| (c - u).abs() < 0.01)
    };
    let st = gw.wait_status(
        "busy at the counters' share",
        Duration::from_secs(20),
        |s| mode_of(s).as_deref() == Some("busy") && near(s, busy_u),
    );
    let sig = &st["async"]["cpu_signal"];
    assert_eq!(sig["in_use"], "prometheus", "{st:#}");
    assert_eq!(sig["source"], "node_exporter", "{st:#}");
    let scrapes = exporter.requests();
    assert!(
        scrapes.iter().all(|r| r.target == "/metrics"),
        "{scrapes:?}"
    );

    // Busy: a call far from its deadline waits.
    let (code, h, _) = http(
        gw.proxy,
        "POST",
        "/echo",
        &[
            ("Prefer", "respond-async"),
            ("Spillway-Deadline-Ms", "60000"),
        ],
        b"d",
    );
    assert_eq!(code, 202);
    let location = header(&h, "location").unwrap().to_owned();
    wait_queries(&gw, &exporter, 10);
    assert_eq!(get_json(&gw, &location).1["state"], "queued");

    // The counters grow mostly idle: the scheduler goes idle and releases the call.
    *mode.lock() = Exporter::Counting(idle);
    gw.wait_status(
        "idle at the counters' share",
        Duration::from_secs(20),
        |s| mode_of(s).as_deref() == Some("idle") && near(s, idle_u),
    );
    wait_state(&gw, &location, "done", Duration::from_secs(20));

    // The exporter fails: one warning naming its URL and the reason; outstanding stands in.
    *mode.lock() = Exporter::Failing(503);
    let url = format!("http://127.0.0.1:{}/metrics", exporter.addr.port());
    let st = gw.wait_status("outstanding stands in", Duration::from_secs(20), |s| {
        s["async"]["cpu_signal"]["in_use"] == "outstanding"
    });
    wait_queries(&gw, &exporter, 10);
    let log = gw.proc.log_text();
    let warnings: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("node_exporter CPU signal failed"))
        .collect();
    assert_eq!(warnings.len(), 1, "one warning per outage:\n{log}");
    assert!(
        warnings[0].contains(&url) && warnings[0].contains("HTTP status 503"),
        "{}",
        warnings[0]
    );
    let err = st["async"]["cpu_signal"]["last_error"]
        .as_str()
        .unwrap_or("");
    assert!(err.contains(&url) && err.contains("503"), "{st:#}");

    // The host comes back rebooted (counters near zero): the reset is a new baseline,
    // and the busy share is back from the second scrape on.
    *mode.lock() = Exporter::Rebooted(busy);
    gw.wait_status("busy again", Duration::from_secs(20), |s| {
        mode_of(s).as_deref() == Some("busy")
            && near(s, busy_u)
            && s["async"]["cpu_signal"]["in_use"] == "prometheus"
    });
    assert!(
        gw.proc
            .log_text()
            .contains("node_exporter CPU signal answers again")
    );
}

/// POST an asynchronous call as client `client` (sent in `X-Forwarded-For` to a gateway
/// that trusts loopback as its proxy); returns the status, headers and body.
fn post_as(
    gw: &Gateway,
    client: &str,
    path: &str,
    extra: &[(&str, &str)],
) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let mut h = vec![("Prefer", "respond-async"), ("X-Forwarded-For", client)];
    h.extend_from_slice(extra);
    http(gw.proxy, "POST", path, &h, b"work")
}

#[test]
fn a_full_store_answers_507_with_retry_after_and_accepts_again_once_calls_are_purged() {
    let stub = Stub::start(ok_reply);
    // Room for a few calls (each counts its record, body and result_max_bytes), results
    // kept 1 s.
    let gw = gateway(
        &stub,
        "  max_body_bytes: 64\n  result_max_bytes: 512\n  max_store_bytes: 3000\n  \
         result_ttl_seconds: 1\n  retry_after_seconds: 3\n  max_calls_per_client: null",
    );
    let mut accepted = Vec::new();
    let full = loop {
        let (code, h, _) = http(
            gw.proxy,
            "POST",
            "/fill",
            &[("Prefer", "respond-async")],
            b"x",
        );
        match code {
            202 => accepted.push(header(&h, "location").unwrap().to_owned()),
            507 => break h,
            other => panic!("{other}"),
        }
        assert!(accepted.len() < 20, "the store never filled");
    };
    assert!(!accepted.is_empty(), "a call fits");
    assert_eq!(header(&full, "retry-after"), Some("3"));
    let st = gw.status();
    assert_eq!(st["async"]["store"]["max_bytes"], 3000, "{st:#}");
    assert!(
        st["async"]["store"]["bytes"].as_u64().unwrap() <= 3000,
        "{st:#}"
    );
    // Synchronous traffic is unaffected.
    assert_eq!(http(gw.proxy, "POST", "/sync", &[], b"s").0, 200);
    // The accepted calls run (a finished call counts its result, no longer the most it
    // may be), their results expire and are purged: room again.
    for loc in &accepted {
        wait_state(&gw, loc, "done", Duration::from_secs(20));
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    let again_call = loop {
        let (code, h, _) = http(
            gw.proxy,
            "POST",
            "/again",
            &[("Prefer", "respond-async")],
            b"x",
        );
        if code == 202 {
            break header(&h, "location").unwrap().to_owned();
        }
        assert_eq!(code, 507);
        assert!(
            Instant::now() < deadline,
            "never accepted again\n{}",
            gw.proc.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    // Every call finished at its own time (seconds apart on a loaded machine) and is
    // purged a TTL later: wait for all of them, the one accepted again included.
    let deadline = Instant::now() + Duration::from_secs(30);
    for loc in accepted.iter().chain([&again_call]) {
        while get_json(&gw, loc).0 != 404 {
            assert!(
                Instant::now() < deadline,
                "{loc} never purged after its TTL"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    // With every earlier call purged, a burst fills the store again, and is refused again.
    let mut again = 0;
    while http(
        gw.proxy,
        "POST",
        "/refill",
        &[("Prefer", "respond-async")],
        b"x",
    )
    .0 == 202
    {
        again += 1;
        assert!(again < 20, "the store never filled again");
    }
    assert!(
        again >= accepted.len().saturating_sub(1),
        "{again} < {}",
        accepted.len()
    );
}

#[test]
fn a_client_over_its_limit_gets_429_and_other_clients_do_not() {
    let stub = Stub::start(ok_reply);
    let yaml = format!(
        "{}\n{PREFER_EVERYWHERE}async:\n  max_calls_per_client: 2\n  retry_after_seconds: 4\n",
        function_http_config(&stub.url(), "  trusted_proxies: [127.0.0.1/32]")
    );
    let gw = Gateway::start(&yaml);
    let (a, b) = ("203.0.113.7", "198.51.100.23");
    assert_eq!(post_as(&gw, a, "/1", &[]).0, 202);
    let (_, h, _) = post_as(&gw, a, "/2", &[]);
    let second = header(&h, "location").unwrap().to_owned();
    // Finished calls count until they are purged (an hour here).
    wait_state(&gw, &second, "done", Duration::from_secs(20));
    let (code, h, _) = post_as(&gw, a, "/3", &[]);
    assert_eq!(code, 429, "the third call of the same client");
    assert_eq!(header(&h, "retry-after"), Some("4"));
    assert_eq!(post_as(&gw, b, "/1", &[]).0, 202, "another client");
    assert_eq!(stub.requests_to("/3").len(), 0);
}

#[test]
fn a_result_over_the_limit_fails_the_call_instead_of_a_cut_200() {
    let big = "y".repeat(5_000);
    let reply_body = big.clone();
    let stub = Stub::start(move |req| {
        if req.target == "/big" {
            common::stub::Reply::Raw(
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{reply_body}",
                    reply_body.len()
                )
                .into_bytes(),
            )
        } else {
            ok_reply(req)
        }
    });
    let gw = gateway(&stub, "  result_max_bytes: 4096");
    let prefer = [("Prefer", "respond-async")];
    let (_, h, _) = http(gw.proxy, "POST", "/big", &prefer, b"");
    let loc = header(&h, "location").unwrap().to_owned();
    wait_state(&gw, &loc, "failed", Duration::from_secs(20));
    let (code, _, body) = http(gw.proxy, "GET", &format!("{loc}/result"), &[], b"");
    assert_eq!(code, 502, "{}", String::from_utf8_lossy(&body));
    assert!(!body.starts_with(b"yyyy"), "no cut body");
    assert!(
        gw.proc.log_text().contains("result over 4096 bytes"),
        "{}",
        gw.proc.log_text()
    );
    // Within the limit: the upstream's answer.
    let (_, h, _) = http(gw.proxy, "POST", "/small", &prefer, b"");
    let loc = header(&h, "location").unwrap().to_owned();
    wait_state(&gw, &loc, "done", Duration::from_secs(20));
    assert_eq!(
        http(gw.proxy, "GET", &format!("{loc}/result"), &[], b"").0,
        200
    );
}

#[test]
fn credentials_are_not_stored_in_plain_text_and_call_ids_stay_out_of_the_access_log() {
    let stub = Stub::start(|req| {
        let body = format!("path={}", req.target);
        common::stub::Reply::Raw(
            format!(
                "HTTP/1.1 200 OK\r\nSet-Cookie: session=upstream-cookie-789\r\nX-Kept: yes\r\n\
                 Content-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .into_bytes(),
        )
    });
    let yaml = format!(
        "{}\n{PREFER_EVERYWHERE}",
        function_http_config(&stub.url(), "  access_log: true")
    );
    let gw = Gateway::start(&yaml);
    let (code, h, _) = http(
        gw.proxy,
        "POST",
        "/secret",
        &[
            ("Prefer", "respond-async"),
            ("Authorization", "Bearer bearer-token-123"),
            ("Cookie", "sid=client-cookie-456"),
        ],
        b"payload",
    );
    assert_eq!(code, 202);
    let loc = header(&h, "location").unwrap().to_owned();
    let id = loc.rsplit('/').next().unwrap().to_owned();
    wait_state(&gw, &loc, "done", Duration::from_secs(20));
    // The upstream got the caller's credentials when the call ran.
    let seen = stub.requests_to("/secret");
    assert_eq!(
        seen[0].get("authorization"),
        Some("Bearer bearer-token-123")
    );
    assert_eq!(seen[0].get("cookie"), Some("sid=client-cookie-456"));
    // The result keeps the upstream's headers but not its Set-Cookie.
    let (code, rh, _) = http(gw.proxy, "GET", &format!("{loc}/result"), &[], b"");
    assert_eq!(code, 200);
    assert_eq!(header(&rh, "x-kept"), Some("yes"));
    assert_eq!(header(&rh, "set-cookie"), None);
    // No credential in the store's file, in any form the gateway wrote it.
    let file = std::fs::read(state_store(&gw)).unwrap();
    for secret in [
        "bearer-token-123",
        "client-cookie-456",
        "upstream-cookie-789",
    ] {
        assert!(
            !file.windows(secret.len()).any(|w| w == secret.as_bytes()),
            "{secret} is in calls.redb"
        );
    }
    // The access log has the status URL's requests, without the id.
    let log = gw.proc.log_text();
    let access: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("spillway::access"))
        .collect();
    assert!(
        access
            .iter()
            .any(|l| l.contains("path=/_spillway/calls/<call id>/result")),
        "{log}"
    );
    assert!(!access.iter().any(|l| l.contains(&id)), "{log}");
}

#[test]
fn check_warns_on_async_calls_on_a_public_listener_without_a_per_client_limit() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("public.yaml");
    std::fs::write(
        &path,
        function_http_config("http://127.0.0.1:9", "").replacen(
            "listen: 127.0.0.1:0",
            "listen: 0.0.0.0:0",
            1,
        ) + PREFER_EVERYWHERE
            + "async:\n  max_calls_per_client: null\n",
    )
    .unwrap();
    let out = std::process::Command::new(common::exe())
        .args(["check", path.to_str().unwrap()])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "a warning, not an error: {stderr}");
    let file = path.display().to_string();
    assert!(
        stderr.contains(&format!("{file}:"))
            && stderr.contains(": warning: async.max_calls_per_client: no per-client limit"),
        "{stderr}"
    );
}
