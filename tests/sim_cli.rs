//! `spillway sim` / `spillway cost` through their library entry points ([`run_sim`],
//! [`run_cost`]), and the shipped preset.

use std::path::{Path, PathBuf};

use clap::Parser;
use spillway::config::Config;
use spillway::sim::cli::{CostArgs, SimArgs, run_cost, run_sim};

#[derive(Parser)]
enum Cmd {
    Sim(SimArgs),
    Cost(CostArgs),
}

fn sim_args(args: &[&str]) -> SimArgs {
    match Cmd::try_parse_from(
        std::iter::once("spillway")
            .chain(["sim"])
            .chain(args.iter().copied()),
    ) {
        Ok(Cmd::Sim(a)) => a,
        Ok(_) => unreachable!(),
        Err(e) => panic!("{e}"),
    }
}

fn cost_args(args: &[&str]) -> CostArgs {
    match Cmd::try_parse_from(
        std::iter::once("spillway")
            .chain(["cost"])
            .chain(args.iter().copied()),
    ) {
        Ok(Cmd::Cost(a)) => a,
        Ok(_) => unreachable!(),
        Err(e) => panic!("{e}"),
    }
}

fn root(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(p)
}

#[test]
fn the_libra_paper_preset_loads_with_the_issue_values() {
    let c = Config::load(&root("config/sim/libra-paper.yaml")).unwrap_or_else(|e| panic!("{e}"));
    let l = &c.libra;
    assert_eq!(
        (
            l.epoch_seconds.number(),
            l.decision_epochs.get(),
            l.phi,
            l.rho,
            l.alpha,
            l.beta,
            l.r_max_rps
        ),
        (1.0, 300, 1.0, 0.8, 0.2, 0.2, 16.0)
    );
    // The authors' balancer and phase: the first int(ρ·int(avg+φ·std)) requests
    // of each second to VMs, decisions after seconds 1, 301, …, no CIP rule.
    assert_eq!(l.balancer, spillway::config::BalancerRule::Quota);
    assert!(l.quota_truncate);
    assert_eq!(
        (l.first_decision_epoch.map(|e| e.get()), l.cip_rps),
        (Some(1), Some(0.0))
    );
    assert_eq!(c.pricing.vm_hourly_usd, 0.10);
    assert_eq!(
        (
            c.pricing.function_memory_mb,
            c.pricing.function_duration_ms.number()
        ),
        (512, 1000.0)
    );
    assert!(!c.pricing.api_gateway);
    let s = &c.sim;
    assert_eq!(
        (
            s.vm.slots.get(),
            s.vm.boot_seconds.number(),
            s.vm.minimum_billed_seconds.number()
        ),
        (16, 100.0, 0.0)
    );
    assert!(s.vm.bill_boot && !s.function.bill_init);
    assert_eq!(s.sla_ms.number(), 1000.0);
    let a = &s.auto;
    assert_eq!(
        (
            a.scale_out_utilisation,
            a.scale_in_utilisation,
            a.step_vms.get(),
            a.grace_seconds.number()
        ),
        (0.7, 0.3, 10, 120.0)
    );
}

#[test]
fn sim_errors_name_the_field() {
    let yaml = "sim:\n  vm: {slots: 0}\n  auto: {scale_in_utilisation: 0.9}\n";
    let err = Config::from_yaml(yaml, "s.yaml").unwrap_err().to_string();
    assert!(
        err.contains("sim.vm.slots: expected a whole number ≥ 1, found 0"),
        "{err}"
    );
    assert!(err.contains("sim.auto.scale_in_utilisation"), "{err}");
}

#[test]
fn run_sim_writes_json_csv_and_plot() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.txt");
    std::fs::write(&trace, "20\n40\n5\n".repeat(200)).unwrap();
    let json = dir.path().join("r.json");
    let csv = dir.path().join("r.csv");
    let svg = dir.path().join("r.svg");
    let cfg = root("config/sim/libra-paper.yaml");
    let args = [
        "--config",
        cfg.to_str().unwrap(),
        "--trace",
        trace.to_str().unwrap(),
        "--policy",
        "libra,faas",
        "--seed",
        "4",
        "--json",
        json.to_str().unwrap(),
        "--csv",
        csv.to_str().unwrap(),
        "--plot",
        svg.to_str().unwrap(),
        "--quiet",
    ];
    run_sim(&sim_args(&args)).unwrap();
    let first = std::fs::read(&json).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&first).unwrap();
    assert_eq!(v["seed"], 4);
    assert_eq!(v["trace"], trace.display().to_string());
    let names: Vec<&str> = v["policies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["libra", "faas"]);
    assert_eq!(v["policies"][1]["requests"], 13_000);
    let csv_text = std::fs::read_to_string(&csv).unwrap();
    assert!(csv_text.starts_with(
        "policy,time,load,avg,std,vm_reqs,vms_ready,function_calls,r_max,violations,delayed,utilisation,cost_usd\nlibra,1,20,"
    ));
    assert_eq!(csv_text.lines().count(), 1 + 2 * 600);
    let svg_text = std::fs::read_to_string(&svg).unwrap();
    assert!(
        svg_text.starts_with("<svg") && svg_text.contains("<text"),
        "text is drawn without fonts"
    );
    // Byte-identical on a second run.
    run_sim(&sim_args(&args)).unwrap();
    assert_eq!(first, std::fs::read(&json).unwrap());
}

#[test]
fn run_sim_reports_bad_trace_lines_and_options() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("bad.txt");
    std::fs::write(&trace, "1\n2\nthree\n").unwrap();
    let err = run_sim(&sim_args(&["--trace", trace.to_str().unwrap(), "--quiet"])).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "{}:3: expected a non-negative integer (requests in second 2), got \"three\"",
            trace.display()
        )
    );
    let err = run_sim(&sim_args(&[
        "--trace",
        trace.to_str().unwrap(),
        "--durations",
        "d.csv",
    ]))
    .unwrap_err();
    assert!(
        err.to_string().starts_with("--durations/--memory: "),
        "{err}"
    );
    let missing = run_sim(&sim_args(&["--trace", "/nonexistent/t.txt"])).unwrap_err();
    assert!(
        missing.to_string().starts_with("/nonexistent/t.txt: "),
        "{missing}"
    );
}

#[test]
fn cost_for_m4_large_and_512mb_1s_x86_is_between_3_and_4_rps() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("c.json");
    let svg = dir.path().join("c.svg");
    run_cost(&cost_args(&[
        "--json",
        json.to_str().unwrap(),
        "--plot",
        svg.to_str().unwrap(),
    ]))
    .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let cip = v["cip_rps"].as_f64().unwrap();
    assert!((3.0..4.0).contains(&cip), "{cip}");
    assert!((cip - 3.2552).abs() < 1e-3);
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 25, "0..=48 req/s in steps of 2");
    // At 16 req/s one VM ($0.10/h) beats 16 calls/s on functions.
    let r16 = rows.iter().find(|r| r["rate_rps"] == 16.0).unwrap();
    assert_eq!(r16["iaas_usd_per_hour"], 0.1);
    assert!(r16["faas_usd_per_hour"].as_f64().unwrap() > 0.49);
    assert!(std::fs::read_to_string(&svg).unwrap().contains("<text"));
    // An API gateway makes every call dearer: the CIP drops (2.91 req/s).
    run_cost(&cost_args(&[
        "--api-gateway",
        "--json",
        json.to_str().unwrap(),
    ]))
    .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert!((v["cip_rps"].as_f64().unwrap() - 2.9138).abs() < 1e-3);
    // Bad values name the option.
    let err = run_cost(&cost_args(&["--memory-mb", "64"])).unwrap_err();
    assert!(err.to_string().starts_with("--memory-mb: "), "{err}");
}

#[test]
fn the_binary_runs_sim_and_cost() {
    let bin = env!("CARGO_BIN_EXE_spillway");
    let out = std::process::Command::new(bin)
        .args(["cost", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!((3.0..4.0).contains(&v["cip_rps"].as_f64().unwrap()));

    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.txt");
    std::fs::write(&trace, "5\n9\n").unwrap();
    let cfg = root("config/sim/libra-paper.yaml");
    let out = std::process::Command::new(bin)
        .args(["sim", "--config", cfg.to_str().unwrap(), "--trace"])
        .arg(&trace)
        .args(["--policy", "all", "--seed", "1", "--json", "-"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["policies"].as_array().unwrap().len(), 5);
    assert!(String::from_utf8_lossy(&out.stderr).contains("policy   requests"));

    std::fs::write(&trace, "5\nfive\n").unwrap();
    let out = std::process::Command::new(bin)
        .args(["sim", "--trace"])
        .arg(&trace)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("{}:2: ", trace.display())), "{err}");
}

/// Found by a new-user trial: a negative or NaN window and an empty trace used to run
/// and report zeros with exit 0.
#[test]
fn bad_windows_and_empty_traces_are_errors() {
    let exe = env!("CARGO_BIN_EXE_spillway");
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.txt");
    std::fs::write(&trace, "3\n4\n").unwrap();
    let empty = dir.path().join("empty.txt");
    std::fs::write(&empty, "").unwrap();
    for (file, extra, needle) in [
        (&trace, vec!["--from=-5"], "--from"),
        (&trace, vec!["--to=nan"], "--to"),
        (&trace, vec!["--from", "10"], "no request in the window"),
        (&empty, vec![], "no request"),
    ] {
        let out = std::process::Command::new(exe)
            .args(["sim", "--quiet", "--trace", file.to_str().unwrap()])
            .args(&extra)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{extra:?}: {err}");
        assert!(err.contains(needle), "{extra:?}: {err}");
    }
}

/// The adaptive preset is the paper preset without the per-VM cap and with
/// `r_max_adaptive` (and the budget rule, phase and CIP its figures were measured with),
/// and `--r-max-rps` moves the start value, checked against the controller's bounds.
#[test]
fn the_adaptive_preset_is_the_paper_preset_with_r_max_adaptive_and_no_cap() {
    let paper = Config::load(&root("config/sim/libra-paper.yaml")).unwrap();
    let mut adaptive = Config::load(&root("config/sim/libra-adaptive.yaml")).unwrap();
    let a = adaptive.r_max_adaptive_params().expect("adaptive");
    assert_eq!((a.target_quantile, a.target.as_millis()), (0.99, 1200));
    assert_eq!((a.min_rps, a.max_rps, a.max_step_rps), (4.0, 64.0, 4.0));
    assert_eq!(a.period.as_secs(), 300, "one period per scaling decision");
    assert_eq!(
        paper.libra.max_outstanding_per_vm.map(|m| m.get()),
        Some(16)
    );
    adaptive.libra.r_max_adaptive = None;
    adaptive.libra.max_outstanding_per_vm = std::num::NonZeroU32::new(16);
    // The adaptive preset keeps the budget rule, decision phase and CIP rule its figures in
    // docs/src/guide/r-max.md were measured with (token bucket, first decision after K, CIP from
    // pricing); the paper preset follows the LIBRA authors' simulator on those.
    assert_eq!(
        adaptive.libra.balancer,
        spillway::config::BalancerRule::TokenBucket
    );
    adaptive.libra.balancer = paper.libra.balancer;
    adaptive.libra.quota_truncate = paper.libra.quota_truncate;
    adaptive.libra.first_decision_epoch = paper.libra.first_decision_epoch;
    adaptive.libra.cip_rps = paper.libra.cip_rps;
    assert_eq!(
        serde_json::to_value(&adaptive).unwrap(),
        serde_json::to_value(&paper).unwrap()
    );

    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.txt");
    std::fs::write(&trace, "30\n".repeat(900)).unwrap();
    let json = dir.path().join("r.json");
    let cfg = root("config/sim/libra-adaptive.yaml");
    let args = |r: &'static str| {
        vec![
            "--config".to_owned(),
            cfg.to_str().unwrap().to_owned(),
            "--trace".to_owned(),
            trace.to_str().unwrap().to_owned(),
            "--policy".to_owned(),
            "libra".to_owned(),
            "--r-max-rps".to_owned(),
            r.to_owned(),
            "--json".to_owned(),
            json.to_str().unwrap().to_owned(),
            "--quiet".to_owned(),
        ]
    };
    let a8 = args("8");
    run_sim(&sim_args(
        &a8.iter().map(String::as_str).collect::<Vec<_>>(),
    ))
    .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(v["policies"][0]["r_max"]["start_rps"], 8.0);
    let a2 = args("2");
    let err = run_sim(&sim_args(
        &a2.iter().map(String::as_str).collect::<Vec<_>>(),
    ))
    .unwrap_err()
    .to_string();
    assert!(
        err.starts_with("--r-max-rps: libra.r_max_adaptive.min_rps: must not exceed"),
        "{err}"
    );
}

/// The FaaSim preset with no other flag: events format, one row per placement;
/// with 100 pre-warmed cloud instances (`--set`) warm-first takes them (no cold start),
/// edge-first cold-starts the first burst on the edge. `--sweep` gives one report per
/// value: without keep-alive every call is cold. A bad path is one error naming it.
#[test]
fn the_faasim_preset_runs_one_row_per_placement_and_sweeps() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("r.json");
    let trace = root("tests/data/faasim/burst_excerpt.txt");
    let text = std::fs::read_to_string(&trace).unwrap();
    let first_burst = text
        .lines()
        .filter(|l| l.split_whitespace().next().unwrap().parse::<f64>().unwrap() < 15.0)
        .count() as u64;
    let calls = text.lines().count() as u64;
    let preset = root("config/sim/faasim.yaml");
    let base = [
        "--config",
        preset.to_str().unwrap(),
        "--trace",
        trace.to_str().unwrap(),
        "--quiet",
        "--json",
        json.to_str().unwrap(),
    ];
    let read = || -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap()
    };
    let rows = |v: &serde_json::Value| -> Vec<(String, u64)> {
        v["policies"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                (
                    p["name"].as_str().unwrap().to_string(),
                    p["cold_starts"].as_u64().unwrap(),
                )
            })
            .collect()
    };
    let mut args: Vec<&str> = base.to_vec();
    args.extend(["--set", "function_zones[5].prewarmed_instances=100"]);
    run_sim(&sim_args(&args)).unwrap();
    let r = read();
    assert_eq!(
        rows(&r),
        [
            ("edge_first".to_string(), first_burst),
            ("warm_first".to_string(), 0)
        ]
    );
    let cloud = &r["policies"][1]["zones"][5];
    assert_eq!(cloud["warm_starts"].as_u64(), Some(calls), "{cloud}");
    let client = &r["policies"][1]["client_response_ms"];
    assert!(
        client["min"].as_f64().unwrap() >= 2053.0 * 0.99 + 71.0 * 0.96 + 851.0 * 0.95,
        "{client}"
    );

    let mut args: Vec<&str> = base.to_vec();
    args.extend(["--sweep", "function_zones[*].keep_alive_seconds=0,30"]);
    run_sim(&sim_args(&args)).unwrap();
    let r = read();
    assert_eq!(r["sweep"], "function_zones[*].keep_alive_seconds");
    let cold: Vec<u64> = r["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| {
            row["report"]["policies"][0]["cold_starts"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(cold, [calls, first_burst]);

    let bad = sim_args(&[
        "--config",
        preset.to_str().unwrap(),
        "--trace",
        trace.to_str().unwrap(),
        "--set",
        "function_zones[*].keep_alive_secs=3",
    ]);
    let e = run_sim(&bad).unwrap_err().to_string();
    assert!(
        e.starts_with("--set: function_zones[*].keep_alive_secs=3: function_zones[0].keep_alive_secs: unknown key (did you mean `keep_alive_seconds`?)")
            && e.ends_with("(and 5 more)"),
        "{e}"
    );
}

/// An all-zero day is simulated (idle cost is a valid question), every report
/// starts with the effective model, a model that makes the SLA unreachable is warned
/// about, an events trace of Unix timestamps runs from its first event, and
/// `--csv-max-rows` bounds the series by merging epochs.
#[test]
fn idle_traces_model_line_sla_warning_offset_and_csv_rows() {
    let bin = env!("CARGO_BIN_EXE_spillway");
    let dir = tempfile::tempdir().unwrap();
    let zero = dir.path().join("zero.txt");
    std::fs::write(&zero, "0\n".repeat(3600)).unwrap();
    let csv = dir.path().join("s.csv");
    let cfg = root("config/sim/libra-paper.yaml");
    let out = std::process::Command::new(bin)
        .args(["sim", "--config", cfg.to_str().unwrap(), "--trace"])
        .arg(&zero)
        .args(["--policy", "auto", "--json", "-", "--csv"])
        .arg(&csv)
        .args(["--csv-max-rows", "100"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let auto = &v["policies"][0];
    assert_eq!(auto["requests"], 0);
    // AUTO keeps its 10 initial VMs for the hour: 10 VM-hours at $0.10.
    assert!(
        (auto["cost_usd"]["vm"].as_f64().unwrap() - 1.0).abs() < 1e-9,
        "{auto}"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("model: service fixed 1000 ms"), "{err}");
    assert!(
        !err.contains("warning"),
        "the paper preset can meet its SLA: {err}"
    );
    let rows: Vec<String> = std::fs::read_to_string(&csv)
        .unwrap()
        .lines()
        .skip(1)
        .map(str::to_string)
        .collect();
    assert!(rows.len() <= 100 && rows.len() >= 50, "{}", rows.len());
    assert!(rows.last().unwrap().starts_with("auto,3600,"), "{rows:?}");

    // No `sim:` section: 1000 ms service + 5 ms warm start > 1000 ms SLA.
    let events = dir.path().join("unix.txt");
    let text: String = (0..50)
        .map(|i| format!("{}\n", 1_700_000_000 + i))
        .collect();
    std::fs::write(&events, text).unwrap();
    let bare = dir.path().join("bare.yaml");
    std::fs::write(&bare, "version: 1\n").unwrap();
    let out = std::process::Command::new(bin)
        .args(["sim", "--format", "events", "--config"])
        .arg(&bare)
        .arg("--trace")
        .arg(&events)
        .args(["--policy", "faas"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("warning: every function call misses the SLA"),
        "{err}"
    );
    assert!(
        stdout.contains("clock 0 = trace second 1700000000"),
        "{stdout}"
    );
}

/// `--generate burst|stream` writes FaaSim's synthetic workload from the seeded generator
/// to the `--trace` file (an `events` trace), which the preset then replays: 100 calls a
/// burst, 20 per zone, every 30 s; the same seed writes the same bytes.
#[test]
fn generate_writes_the_seeded_faasim_traces_that_the_preset_replays() {
    let dir = tempfile::tempdir().unwrap();
    let path = |n: &str| dir.path().join(n);
    let gen_ = |pattern: &str, seed: &str, out: &Path| {
        let out = out.to_str().unwrap();
        run_sim(&sim_args(&[
            "--generate",
            pattern,
            "--seed",
            seed,
            "--trace",
            out,
            "--quiet",
        ]))
        .unwrap();
        std::fs::read_to_string(out).unwrap()
    };
    let burst = gen_("burst", "3", &path("b.txt"));
    assert_eq!(
        burst,
        spillway::sim::faasim::events_text(&spillway::sim::faasim::burst(3))
    );
    assert_eq!(burst, gen_("burst", "3", &path("b2.txt")), "seeded");
    assert_ne!(burst, gen_("burst", "4", &path("b3.txt")));
    let calls: Vec<(f64, usize)> = burst
        .lines()
        .map(|l| {
            let mut it = l.split_whitespace();
            (
                it.next().unwrap().parse().unwrap(),
                it.next().unwrap().parse().unwrap(),
            )
        })
        .collect();
    assert_eq!(calls.len(), 100 * 100);
    let first: Vec<_> = calls.iter().filter(|(t, _)| *t < 30.0).collect();
    assert_eq!(first.len(), 100);
    for z in 0..5 {
        assert_eq!(first.iter().filter(|(_, zz)| *zz == z).count(), 20);
    }
    let stream = gen_("stream", "3", &path("s.txt"));
    assert_eq!(stream.lines().count(), 100 * 100);

    // The preset replays it with no other flag: the first burst's 100 calls are cold
    // under edge-first (25 instances per edge zone hold a zone's 20).
    let json = path("r.json");
    let preset = root("config/sim/faasim.yaml");
    run_sim(&sim_args(&[
        "--config",
        preset.to_str().unwrap(),
        "--trace",
        path("b.txt").to_str().unwrap(),
        "--quiet",
        "--json",
        json.to_str().unwrap(),
    ]))
    .unwrap();
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(r["policies"][0]["name"], "edge_first");
    assert_eq!(r["policies"][0]["cold_starts"].as_u64(), Some(100));
}
