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

/// `spillway sim --delay-queue on --json` on `config` and `events`: the run's JSON.
fn delay_run(config: &str, events: &str, policy: &str) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    let (c, t, json) = (
        dir.path().join("c.yaml"),
        dir.path().join("t.txt"),
        dir.path().join("r.json"),
    );
    std::fs::write(&c, config).unwrap();
    std::fs::write(&t, events).unwrap();
    let (ok, _, err) = sim(&[
        "--config",
        c.to_str().unwrap(),
        "--trace",
        t.to_str().unwrap(),
        "--format",
        "events",
        "--policy",
        policy,
        "--delay-queue",
        "on",
        "--quiet",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    v[0]["run"].clone()
}

fn releases(run: &serde_json::Value) -> Vec<f64> {
    run["releases_s"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

#[test]
fn idle_releases_come_in_batches_per_cpu_sample_at_the_calls_own_times() {
    // Functions only: no VM, so the CPU signal is 0 (idle) and idle releases go to the
    // function tier. Samples at 0, 1, 2 s refill a batch of 2: the calls at 0.203 s and
    // 0.417 s spend the batch of the 0 s sample at once, those at 0.61 s and 0.89 s wait
    // for the 1 s sample, the one at 1.3 s for the 2 s sample.
    let config = "version: 1
async:
  sample_interval_seconds: 1
  release_batch: 2
  deadline_margin_seconds: 5
  expected_processing_seconds: 1
";
    let events = "time_s kind deadline_s processing_ms
0.203 async 100 50
0.417 async 100 50
0.61 async 100 50
0.89 async 100 50
1.3 async 100 50
";
    let run = delay_run(config, events, "faas");
    assert_eq!(releases(&run), vec![0.203, 0.417, 1.0, 1.0, 2.0]);
    assert_eq!(run["async_finished"], 5);
    assert_eq!(run["async_on_functions"], 5);
    assert_eq!(run["deadline_misses"], 0);
}

#[test]
fn a_busy_cpu_holds_a_call_until_its_forced_release_time() {
    // One VM whose four cores the other load holds from 0 s: every sample reads 1.0, so
    // the scheduler is busy long before the call arrives at 12.25 s. Due at 32.25 s, the
    // call is forced to the function tier at deadline − (E[p] 1.5 s + margin 5 s) =
    // 25.75 s — the core's own deadline, between two samples — before its urgency
    // (deadline − 2 s = 30.25 s). It finishes after the cold start and its 400 ms.
    let config = "version: 1
libra:
  epoch_seconds: 1
  decision_epochs: 60
  r_max_rps: 2
  min_vms: 1
  max_vms: 1
async:
  busy_utilisation: 0.7
  sample_interval_seconds: 1
  window_seconds: 10
  switch_interval_seconds: 10
  urgency_window_seconds: 2
  release_batch: 4
  deadline_margin_seconds: 5
  expected_processing_seconds: 1.5
sim:
  vm:
    slots: 8
    cores: 4
    boot_seconds: 0
  function:
    cold_start_ms: 250
    warm_start_ms: 5
  cpu_load:
    cores: 4
    from_seconds: 0
    to_seconds: 1000
";
    let events = "time_s kind deadline_s processing_ms
12.25 async 20 400
";
    let run = delay_run(config, events, "max");
    assert_eq!(releases(&run), vec![25.75]);
    assert_eq!(run["async_on_functions"], 1);
    assert_eq!(run["deadline_misses"], 0);
    assert_eq!(run["last_finish_s"], 26.4);
}
