//! Durability of asynchronous calls: 1,000 accepted calls, `kill -9` of the
//! gateway while they are being released, a restart on the same store — every call runs
//! (its id in the upstream's log), twice only when it was running at the kill
//! (at-least-once), and every status URL ends `done`. And a `kill -9` while calls are
//! being accepted: every call answered `202` runs after the restart, a damaged record
//! costs only itself (one error naming the file and the call), and a damaged file stops
//! startup with an error naming it.

// Real processes on loopback: deadlines are wall-clock time.
#![allow(clippy::disallowed_methods)]

mod common;

use parking_lot::Mutex;
use redb::ReadableTable as _;
use std::collections::{HashMap, HashSet};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::stub::{Stub, ok_reply};
use common::{Gateway, Proc, function_http_config, header, http, parse_response};

const CALLS: usize = 1000;

/// Every path honours `Prefer: respond-async` (off unless a route enables it).
const PREFER_EVERYWHERE: &str = "routes:\n  - {name: api, path_prefix: /, async: prefer}\n";

/// Thousands of calls from one client (this test): no per-client bound, small results.
const MANY_CALLS: &str = "  max_calls_per_client: null\n  result_max_bytes: 4096\n";

fn config(stub: &Stub) -> String {
    // A slow upstream (100 ms a call, at most 4 at once: ~40 calls/s) so that the kill
    // lands in the middle of the release.
    format!(
        "{}\n{PREFER_EVERYWHERE}async:\n{MANY_CALLS}  release_batch: 1000\n  sample_interval_seconds: 0.05\n",
        function_http_config(&stub.url(), "").replace("max_concurrency: 64", "max_concurrency: 4"),
    )
}

#[test]
fn every_accepted_call_runs_after_a_kill_and_a_restart() {
    let stub = Stub::start(|req| {
        std::thread::sleep(Duration::from_millis(100));
        ok_reply(req)
    });
    let state = tempfile::tempdir().unwrap();
    let yaml = config(&stub);
    let mut gw = Gateway::start_in(&yaml, state.path());
    let mut locations = Vec::with_capacity(CALLS);
    for i in 0..CALLS {
        let (code, h, _) = http(
            gw.proxy,
            "POST",
            &format!("/job/{i}"),
            &[("Prefer", "respond-async")],
            b"work",
        );
        assert_eq!(code, 202, "call {i}");
        locations.push(header(&h, "location").unwrap().to_owned());
    }
    // Kill -9 while the release is under way.
    let deadline = Instant::now() + Duration::from_secs(60);
    while stub.requests().len() < 50 {
        assert!(Instant::now() < deadline, "releases never started");
        std::thread::sleep(Duration::from_millis(5));
    }
    gw.proc.child.kill().unwrap();
    gw.proc.wait_exit(Duration::from_secs(10));
    let seen_before = stub.requests().len();
    assert!(
        seen_before < CALLS,
        "the kill must land before every call ran ({seen_before})"
    );

    let gw = Gateway::start_in(&yaml, state.path());
    assert!(
        gw.proc.log_text().contains("recovered from the store"),
        "{}",
        gw.proc.log_text()
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut attempts = HashMap::new();
    let mut pending: Vec<&String> = locations.iter().collect();
    while !pending.is_empty() {
        pending.retain(|loc| {
            let (code, _, body) = http(gw.proxy, "GET", loc, &[], b"");
            assert_eq!(code, 200);
            let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
            if v["state"] == "done" {
                attempts.insert(
                    loc.rsplit('/').next().unwrap().to_owned(),
                    v["attempts"].as_u64().unwrap(),
                );
                false
            } else {
                true
            }
        });
        assert!(
            Instant::now() < deadline,
            "{} calls never done\n{}",
            pending.len(),
            gw.proc.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut runs: HashMap<String, usize> = HashMap::new();
    for r in stub.requests() {
        if let Some(id) = r.get("spillway-call-id") {
            *runs.entry(id.to_owned()).or_default() += 1;
        }
    }
    assert_eq!(runs.len(), CALLS, "every call id reached the upstream");
    let twice: Vec<_> = runs.iter().filter(|(_, n)| **n > 1).collect();
    for (id, n) in &twice {
        assert_eq!(**n, 2, "{id} ran more than twice");
        assert_eq!(
            attempts[*id], 2,
            "{id} ran twice, so it was running at the kill"
        );
    }
    assert!(
        twice.len() <= 4 * 2,
        "only calls running at the kill run again: {}",
        twice.len()
    );
}

/// `POST path` with `Prefer: respond-async`: the status URL when the gateway answered
/// 202, `None` when it did not (refused, reset, killed mid-request).
fn try_accept(addr: SocketAddr, path: &str) -> Option<String> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
         Prefer: respond-async\r\nContent-Length: 4\r\n\r\nwork"
    );
    s.write_all(req.as_bytes()).ok()?;
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    if !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        return None;
    }
    let (code, h, _) = parse_response(&buf);
    (code == 202).then(|| header(&h, "location").map(str::to_owned))?
}

#[test]
fn acknowledged_calls_survive_a_kill_mid_accept_and_damage_costs_only_what_is_damaged() {
    let stub = Stub::start(ok_reply);
    let state = tempfile::tempdir().unwrap();
    let base = format!(
        "{}\n{PREFER_EVERYWHERE}",
        function_http_config(&stub.url(), "")
    );
    // Accepting only: one release an hour, so the kill lands among store commits.
    let holding =
        format!("{base}async:\n{MANY_CALLS}  release_batch: 1\n  sample_interval_seconds: 3600\n");
    let mut gw = Gateway::start_in(&holding, state.path());
    let acked = Arc::new(Mutex::new(Vec::<String>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..6)
        .map(|t| {
            let (acked, stop, addr) = (Arc::clone(&acked), Arc::clone(&stop), gw.proxy);
            std::thread::spawn(move || {
                for k in 0.. {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    match try_accept(addr, &format!("/job/{t}-{k}")) {
                        Some(loc) => acked.lock().push(loc),
                        None => return,
                    }
                }
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    while acked.lock().len() < 300 {
        assert!(Instant::now() < deadline, "too few calls accepted");
        std::thread::sleep(Duration::from_millis(5));
    }
    // kill -9 while the clients are still sending.
    gw.proc.child.kill().unwrap();
    gw.proc.wait_exit(Duration::from_secs(10));
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().unwrap();
    }
    let acked: Vec<String> = acked.lock().clone();
    let id_of = |loc: &str| loc.rsplit('/').next().unwrap().to_owned();

    // Damage one acknowledged call's record: only its first half is left.
    let victim = id_of(&acked[acked.len() / 2]);
    let file = state.path().join("async/calls.redb");
    {
        let calls: redb::TableDefinition<&str, &[u8]> = redb::TableDefinition::new("calls");
        let db = redb::Database::create(&file).unwrap();
        let w = db.begin_write().unwrap();
        {
            let mut t = w.open_table(calls).unwrap();
            let whole = t
                .get(victim.as_str())
                .unwrap()
                .expect("acknowledged")
                .value()
                .to_vec();
            t.insert(victim.as_str(), &whole[..whole.len() / 2])
                .unwrap();
        }
        w.commit().unwrap();
    }

    // Restart, releasing: every other acknowledged call runs and ends `done`.
    let draining = format!(
        "{base}async:\n{MANY_CALLS}  release_batch: 1000\n  sample_interval_seconds: 0.05\n"
    );
    let mut gw = Gateway::start_in(&draining, state.path());
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut pending: Vec<&String> = acked.iter().filter(|l| id_of(l) != victim).collect();
    while !pending.is_empty() {
        pending.retain(|loc| {
            let (code, _, body) = http(gw.proxy, "GET", loc, &[], b"");
            assert_eq!(code, 200, "{loc}");
            let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
            v["state"] != "done"
        });
        assert!(
            Instant::now() < deadline,
            "{} acknowledged calls never done\n{}",
            pending.len(),
            gw.proc.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let ran: HashSet<String> = stub
        .requests()
        .iter()
        .filter_map(|r| r.get("spillway-call-id").map(str::to_owned))
        .collect();
    for loc in &acked {
        let id = id_of(loc);
        if id != victim {
            assert!(
                ran.contains(&id),
                "acknowledged call {id} never reached the upstream"
            );
        }
    }
    assert!(!ran.contains(&victim), "the damaged call cannot run");
    let log = gw.proc.log_text();
    let errors: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("cannot be run and were skipped"))
        .collect();
    assert_eq!(errors.len(), 1, "one error for the damaged part:\n{log}");
    assert!(
        errors[0].contains("calls.redb") && errors[0].contains(&victim),
        "the error names the file and the call: {}",
        errors[0]
    );
    assert!(
        errors[0].contains("record does not decode"),
        "{}",
        errors[0]
    );

    // A damaged file (its header overwritten) stops startup with an error naming it.
    gw.proc.child.kill().unwrap();
    gw.proc.wait_exit(Duration::from_secs(10));
    let mut bytes = std::fs::read(&file).unwrap();
    let n = bytes.len().min(4096);
    bytes[..n].fill(0x5a);
    std::fs::write(&file, bytes).unwrap();
    let cfg = state.path().join("gateway.yaml");
    std::fs::write(&cfg, &draining).unwrap();
    let mut p = Proc::spawn(&[
        "serve",
        "--config",
        cfg.to_str().unwrap(),
        "--state-dir",
        state.path().to_str().unwrap(),
    ]);
    let code = p.wait_exit(Duration::from_secs(30));
    assert!(code.is_some_and(|c| c != 0), "startup must fail: {code:?}");
    let line = p.wait_line("calls.redb", Duration::from_secs(5));
    assert!(line.contains(&file.display().to_string()), "{line}");
}
