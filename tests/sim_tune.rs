//! `spillway tune`: the recommendation is the optimum found by enumerating the grid with
//! `spillway sim --set`, the front is the Pareto front, the fragment is a valid config
//! that reproduces the result, and what the live gateway cannot honour is said.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Parser;
use spillway::sim::cli::{SimArgs, run_sim};
use spillway::sim::tune::{Candidate, TuneArgs, TuneResult, pareto_front, run_tune};

#[derive(Parser)]
enum Cmd {
    Sim(SimArgs),
    Tune(TuneArgs),
}

fn sim_args(args: &[&str]) -> SimArgs {
    match Cmd::try_parse_from(["spillway", "sim"].into_iter().chain(args.iter().copied())) {
        Ok(Cmd::Sim(a)) => a,
        Ok(_) => unreachable!(),
        Err(e) => panic!("{e}"),
    }
}

fn tune_args(args: &[&str]) -> TuneArgs {
    match Cmd::try_parse_from(["spillway", "tune"].into_iter().chain(args.iter().copied())) {
        Ok(Cmd::Tune(a)) => a,
        Ok(_) => unreachable!(),
        Err(e) => panic!("{e}"),
    }
}

fn root(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(p)
}

/// 30 minutes of a load that swings between 8 and 90 requests/s with one-minute spikes:
/// enough that φ, ρ and K change both cost and violations.
fn trace(dir: &Path) -> PathBuf {
    let mut text = String::new();
    for s in 0..1800u32 {
        let base = 8 + (s / 300 % 3) * 30;
        let spike = if s % 400 < 60 { 25 } else { 0 };
        text += &format!("{}\n", base + spike + (s * 7 % 11));
    }
    let p = dir.join("t.txt");
    std::fs::write(&p, text).unwrap();
    p
}

/// Cold starts of 500 ms break the 1 s SLA of 1 s requests: violations move with how
/// much of the load spills to functions.
const BASE: [&str; 2] = ["--set", "sim.function.cold_start_ms=500"];

const GRID: [&str; 6] = [
    "--search",
    "phi=0:2:1",
    "--search",
    "rho=0.6,1",
    "--search",
    "decision_epochs=60,300",
];

fn tuned(
    dir: &Path,
    trace: &Path,
    target: &str,
    threads: &str,
    extra: &[&str],
) -> (ExitCode, TuneResult) {
    let json = dir.join(format!("tune-{threads}.json"));
    let cfg = root("config/sim/libra-paper.yaml");
    let mut args = vec![
        "--config",
        cfg.to_str().unwrap(),
        "--trace",
        trace.to_str().unwrap(),
        "--max-violation-pct",
        target,
        "--threads",
        threads,
        "--json",
        json.to_str().unwrap(),
        "--out",
    ];
    let out = dir.join("tuned.yaml");
    args.push(out.to_str().unwrap());
    args.push("--quiet");
    args.extend(extra);
    args.extend(BASE);
    args.extend(GRID);
    let code = run_tune(&tune_args(&args)).unwrap_or_else(|e| panic!("{e}"));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let candidates: Vec<Candidate> = v["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| Candidate {
            values: c["values"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_str().unwrap().to_string())
                .collect(),
            cost_usd: c["cost_usd"].as_f64().unwrap(),
            vm_usd: c["vm_usd"].as_f64().unwrap(),
            function_usd: c["function_usd"].as_f64().unwrap(),
            sla_violations: c["sla_violations"].as_u64().unwrap(),
            sla_violation_pct: c["sla_violation_pct"].as_f64().unwrap(),
            function_share: c["function_share"].as_f64().unwrap(),
            stopped_at_s: c["stopped_at_s"].as_f64(),
        })
        .collect();
    let result = TuneResult {
        dimensions: Vec::new(),
        front: v["front"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i.as_u64().unwrap() as usize)
            .collect(),
        max_violation_pct: v["max_violation_pct"].as_f64().unwrap(),
        recommended: v["recommended"].as_u64().map(|i| i as usize),
        candidates,
    };
    (code, result)
}

/// `spillway sim --policy libra` with the grid point's `--set`s: (cost, violation %).
fn enumerate(dir: &Path, trace: &Path, phi: &str, rho: &str, k: &str) -> (f64, f64) {
    let json = dir.join("one.json");
    let cfg = root("config/sim/libra-paper.yaml");
    let sets = [
        format!("libra.phi={phi}"),
        format!("libra.rho={rho}"),
        format!("libra.decision_epochs={k}"),
    ];
    run_sim(&sim_args(&[
        "--config",
        cfg.to_str().unwrap(),
        "--trace",
        trace.to_str().unwrap(),
        "--policy",
        "libra",
        BASE[0],
        BASE[1],
        "--set",
        &sets[0],
        "--set",
        &sets[1],
        "--set",
        &sets[2],
        "--json",
        json.to_str().unwrap(),
        "--quiet",
    ]))
    .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let p = &v["policies"][0];
    (
        p["cost_usd"]["total"].as_f64().unwrap(),
        p["sla_violation_pct"].as_f64().unwrap(),
    )
}

#[test]
fn the_recommendation_is_the_enumerated_optimum_and_the_front_is_pareto() {
    let dir = tempfile::tempdir().unwrap();
    let t = trace(dir.path());
    // Every grid point by hand, through `spillway sim --set`.
    let mut all = Vec::new();
    for phi in ["0", "1", "2"] {
        for rho in ["0.6", "1"] {
            for k in ["60", "300"] {
                all.push(([phi, rho, k], enumerate(dir.path(), &t, phi, rho, k)));
            }
        }
    }
    // A target between the fewest and the most violations, so that the cheapest point
    // overall is out of bounds and the answer is not the trivial one.
    let (lo, hi) = all
        .iter()
        .fold((f64::MAX, 0.0_f64), |(lo, hi), (_, (_, v))| {
            (lo.min(*v), hi.max(*v))
        });
    assert!(hi > lo, "the grid must move the violations: {all:?}");
    let target = (lo + hi) / 2.0;
    let cheapest = all.iter().min_by(|a, b| a.1.0.total_cmp(&b.1.0)).unwrap();
    let expected = all
        .iter()
        .filter(|(_, (_, v))| *v <= target)
        .min_by(|a, b| a.1.0.total_cmp(&b.1.0).then(a.1.1.total_cmp(&b.1.1)))
        .unwrap();
    assert!(
        cheapest.1.1 > target,
        "the cheapest point should break the target: {all:?}"
    );

    let target_s = format!("{target}");
    let (code, r) = tuned(dir.path(), &t, &target_s, "3", &["--no-prune"]);
    assert_eq!(code, ExitCode::SUCCESS);
    assert_eq!(r.candidates.len(), 12);
    let best = &r.candidates[r.recommended.unwrap()];
    assert_eq!(best.values, expected.0);
    assert_eq!((best.cost_usd, best.sla_violation_pct), expected.1);
    // Each grid point's result is the one `spillway sim` gives it.
    for (values, (cost, viol)) in &all {
        let c = r.candidates.iter().find(|c| c.values == values).unwrap();
        assert_eq!(
            (c.cost_usd, c.sla_violation_pct),
            (*cost, *viol),
            "{values:?}"
        );
    }
    // The front: no point of it is dominated, every other point is.
    let dominated = |a: &Candidate, b: &Candidate| {
        b.cost_usd <= a.cost_usd
            && b.sla_violations <= a.sla_violations
            && (b.cost_usd < a.cost_usd || b.sla_violations < a.sla_violations)
    };
    for (i, c) in r.candidates.iter().enumerate() {
        let is_dominated = r.candidates.iter().any(|o| dominated(c, o));
        assert_eq!(r.front.contains(&i), !is_dominated, "{c:?}");
    }
    assert_eq!(pareto_front(&r.candidates), r.front);
    // One thread gives the same result.
    let (_, one) = tuned(dir.path(), &t, &target_s, "1", &["--no-prune"]);
    assert_eq!(one.candidates, r.candidates);
    assert!(r.candidates.iter().all(|c| c.stopped_at_s.is_none()));

    // The fragment is a valid simulator config (`spillway check --sim`) holding the
    // recommended values, and its `--set` line reproduces the result.
    let frag = dir.path().join("tuned.yaml");
    let text = std::fs::read_to_string(&frag).unwrap();
    let c = spillway::config::Config::load(&frag).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(c.libra.phi.to_string(), expected.0[0], "{text}");
    assert_eq!(c.libra.rho.to_string(), expected.0[1], "{text}");
    assert_eq!(c.libra.decision_epochs.to_string(), expected.0[2], "{text}");
    assert!(
        text.contains(&format!(
            "--set libra.phi={} --set libra.rho={} --set libra.decision_epochs={}",
            expected.0[0], expected.0[1], expected.0[2]
        )),
        "{text}"
    );
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_spillway"))
        .args(["check", "--sim"])
        .arg(&frag)
        .output()
        .unwrap();
    assert!(status.status.success(), "{status:?}");
}

#[test]
fn stopping_dominated_runs_early_keeps_the_exhaustive_front_and_recommendation() {
    let dir = tempfile::tempdir().unwrap();
    let t = trace(dir.path());
    for target in ["0", "1", "5", "100"] {
        let (code_all, all) = tuned(dir.path(), &t, target, "2", &["--no-prune"]);
        // One thread: the schedule, and so where runs stop, is deterministic.
        for threads in ["1", "3"] {
            let (code, pruned) = tuned(dir.path(), &t, target, threads, &[]);
            let ctx = format!("target {target} %, {threads} threads");
            assert_eq!(code, code_all, "{ctx}");
            assert_eq!(pruned.front, all.front, "{ctx}");
            assert_eq!(pruned.recommended, all.recommended, "{ctx}");
            let mut stopped = 0;
            for (p, a) in pruned.candidates.iter().zip(&all.candidates) {
                assert_eq!(p.values, a.values, "{ctx}");
                let Some(at) = p.stopped_at_s else {
                    assert_eq!(p, a, "{ctx}: a run to the end is the exhaustive one");
                    continue;
                };
                stopped += 1;
                // What a stopped run had accrued is a lower bound of its full run, and a
                // finished run beats it: cheaper, with no more violations.
                assert!(at > 0.0 && at <= 1800.0, "{ctx}: {p:?}");
                assert!(p.cost_usd <= a.cost_usd, "{ctx}: {p:?} against {a:?}");
                assert!(p.sla_violations <= a.sla_violations, "{ctx}: {p:?}");
                assert!(
                    pruned.candidates.iter().any(|f| f.stopped_at_s.is_none()
                        && f.cost_usd < p.cost_usd
                        && f.sla_violations <= p.sla_violations),
                    "{ctx}: {p:?} is stopped without a finished run that dominates it"
                );
            }
            if threads == "1" {
                assert!(stopped > 0, "{ctx}: nothing was stopped early");
            }
        }
    }
    // `--plot` shows every point: nothing stops early.
    let svg = dir.path().join("front.svg");
    let (_, plotted) = tuned(dir.path(), &t, "1", "1", &["--plot", svg.to_str().unwrap()]);
    assert!(plotted.candidates.iter().all(|c| c.stopped_at_s.is_none()));
}

#[test]
fn no_configuration_within_the_target_exits_1_and_writes_no_fragment() {
    let dir = tempfile::tempdir().unwrap();
    let t = trace(dir.path());
    // Service 1000 ms against an SLA of 500 ms: every request violates it, whatever the
    // grid point.
    let cfg = root("config/sim/libra-paper.yaml");
    let out = dir.path().join("none.yaml");
    let code = run_tune(&tune_args(&[
        "--config",
        cfg.to_str().unwrap(),
        "--trace",
        t.to_str().unwrap(),
        "--set",
        "sim.sla_ms=500",
        "--search",
        "rho=0.5,1",
        "--out",
        out.to_str().unwrap(),
        "--quiet",
    ]))
    .unwrap();
    assert_eq!(code, ExitCode::FAILURE);
    assert!(!out.exists());
}

#[test]
fn keep_alive_prewarm_and_a_per_vm_cap_say_what_the_live_gateway_honours() {
    let cfg = spillway::config::Config::from_yaml(
        include_str!("../config/sim/libra-paper.yaml"),
        "libra-paper.yaml",
    )
    .unwrap();
    let cfg = spillway::config::with_override(&cfg, "libra.max_outstanding_per_vm", "12").unwrap();
    let dims = [
        spillway::sim::tune::parse_dimension("keep_alive=60,600", &cfg).unwrap(),
        spillway::sim::tune::parse_dimension("prewarm=0:4:2", &cfg).unwrap(),
    ];
    assert_eq!(dims[0].path, "sim.function.keep_alive_seconds");
    assert_eq!(dims[1].values, ["0", "2", "4"]);
    let notes =
        spillway::sim::tune::honour_notes(&dims, &["60".into(), "2".into()], &cfg).join("\n");
    assert!(notes.contains("Lambda's keep-alive is AWS's"), "{notes}");
    assert!(
        notes.contains("function_tier.prewarmed_instances: 2"),
        "{notes}"
    );
    assert!(notes.contains("vm_pool.slots_per_vm: 12"), "{notes}");
    // Bad grids are one error naming --search, before any run.
    for (bad, says) in [
        ("decision_epochs=10.5", "whole numbers"),
        ("phi=2:1:0.5", "LO <= HI"),
        ("rho=0.5,0.5", "listed twice"),
        ("phi", "PATH=VALUE"),
    ] {
        let e = spillway::sim::tune::parse_dimension(bad, &cfg)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("--search: ") && e.contains(says),
            "{bad}: {e}"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let t = trace(dir.path());
    let e = run_tune(&tune_args(&[
        "--trace",
        t.to_str().unwrap(),
        "--search",
        "rho=0.5,1.5",
        "--quiet",
    ]))
    .unwrap_err()
    .to_string();
    assert!(e.starts_with("--search: libra.rho=1.5: "), "{e}");
}

#[test]
fn tune_help_shows_the_dimensions_and_a_whole_example() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_spillway"))
        .args(["tune", "--help"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let help = String::from_utf8(out.stdout).unwrap();
    for part in [
        "--search <NAME=VALUES>",
        "decision_epochs",
        "keep_alive",
        "prewarm",
        "--max-violation-pct",
        "Example, from an nginx access log to a recommended config:",
        "spillway check --sim tuned.yaml",
    ] {
        assert!(help.contains(part), "{part} missing:\n{help}");
    }
}
