//! The delay-queue model (ProFaaStinate §3) through `spillway sim
//! --delay-queue`: the document-pipeline preset, and the named-column events format.

// Real processes: wall-clock deadlines in the shared helpers.
#![allow(clippy::disallowed_methods)]

mod common;

use std::process::Command;

fn sim(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(common::exe())
        .arg("sim")
        .args(args)
        .output()
        .expect("run spillway sim");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_delay_queue_cuts_synchronous_latency_inside_the_cpu_peak() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("r.json");
    let root = env!("CARGO_MANIFEST_DIR");
    let (ok, _, err) = sim(&[
        "--config",
        &format!("{root}/config/sim/profaastinate.yaml"),
        "--trace",
        &format!("{root}/config/sim/profaastinate-events.txt"),
        "--format",
        "events",
        "--policy",
        "max",
        "--delay-queue",
        "both",
        "--quiet",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let off = &v[0]["run"];
    let on = &v[1]["run"];
    assert_eq!(
        (off["delay_queue"].as_bool(), on["delay_queue"].as_bool()),
        (Some(false), Some(true))
    );
    // Every call of the trace finished in both runs (2,700 asynchronous ones: 3 a document).
    assert_eq!(off["async_finished"], 2700);
    assert_eq!(on["async_finished"], 2700);
    let (a, b) = (
        off["sync_peak_mean_ms"].as_f64().unwrap(),
        on["sync_peak_mean_ms"].as_f64().unwrap(),
    );
    assert!(
        b <= 0.6 * a,
        "goal: ≥ 40 % lower mean inside [t1, t2]: {b} vs {a}"
    );
    assert!(
        on["cpu_peak"].as_f64().unwrap() > 0.9,
        "the peak saturates the CPU"
    );
}

#[test]
fn named_event_columns_are_checked_with_their_line() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.txt");
    std::fs::write(
        &trace,
        "# comment\ntime_s kind deadline_s\n0.5 async 30\n1.0 later 30\n",
    )
    .unwrap();
    let (ok, _, err) = sim(&[
        "--trace",
        trace.to_str().unwrap(),
        "--format",
        "events",
        "--delay-queue",
        "on",
    ]);
    assert!(!ok);
    assert!(
        err.contains("t.txt") && err.contains("4") && err.contains("kind must be sync or async"),
        "{err}"
    );
    // Omitted trailing columns take their defaults; without a header the queue has nothing.
    std::fs::write(
        &trace,
        "time_s kind deadline_s processing_ms zone\n0.5 async\n1.0\n",
    )
    .unwrap();
    let (ok, out, err) = sim(&[
        "--trace",
        trace.to_str().unwrap(),
        "--format",
        "events",
        "--policy",
        "faas",
        "--delay-queue",
        "on",
    ]);
    assert!(ok, "{err}");
    assert!(out.contains("2 calls"), "{out}");
    std::fs::write(&trace, "0.5\n1.0\n").unwrap();
    let (ok, _, err) = sim(&[
        "--trace",
        trace.to_str().unwrap(),
        "--format",
        "events",
        "--delay-queue",
        "on",
    ]);
    assert!(!ok && err.contains("header naming its columns"), "{err}");
}
