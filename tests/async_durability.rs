//! Durability of asynchronous calls (issue 10): 1,000 accepted calls, `kill -9` of the
//! gateway while they are being released, a restart on the same store — every call runs
//! (its id in the upstream's log), twice only when it was running at the kill
//! (at-least-once), and every status URL ends `done`.

// Real processes on loopback: deadlines are wall-clock time.
#![allow(clippy::disallowed_methods)]

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::stub::{Stub, ok_reply};
use common::{Gateway, function_http_config, header, http};

const CALLS: usize = 1000;

fn config(stub: &Stub, store: &std::path::Path) -> String {
    // A slow upstream (100 ms a call, at most 4 at once: ~40 calls/s) so that the kill
    // lands in the middle of the release.
    format!(
        "{}\nasync:\n  store_dir: \"{}\"\n  release_batch: 1000\n  sample_interval_seconds: 0.05\n",
        function_http_config(&stub.url(), "").replace("max_concurrency: 64", "max_concurrency: 4"),
        store.display()
    )
}

#[test]
fn every_accepted_call_runs_after_a_kill_and_a_restart() {
    let stub = Stub::start(|req| {
        std::thread::sleep(Duration::from_millis(100));
        ok_reply(req)
    });
    let store = tempfile::tempdir().unwrap();
    let yaml = config(&stub, store.path());
    let mut gw = Gateway::start(&yaml);
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

    let gw = Gateway::start(&yaml);
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
