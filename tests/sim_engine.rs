//! Simulator engine: hand-computable traces with exact costs, VM counts and violations;
//! proptest invariants; determinism. No wall-clock asserts.

use std::path::Path;

use proptest::prelude::*;
use spillway::config::Config;
use spillway::sim::engine::{PolicyKind, PolicyRun, SimParams, run_policy};
use spillway::sim::simulate;
use spillway::sim::trace::{Trace, TraceOptions};

/// A config with LIBRA's paper parameters except K = `k`, `r_max`, and `sim` overrides.
fn config(k: u32, r_max: f64, sim: &str) -> Config {
    let yaml = format!(
        r#"
libra: {{epoch_seconds: 1, decision_epochs: {k}, phi: 1.0, rho: 0.8, alpha: 0.2, beta: 0.2,
         r_max_rps: {r_max}, min_vms: 0, max_vms: 100}}
pricing: {{vm_hourly_usd: 0.10, function_memory_mb: 512, function_duration_ms: 1000}}
sim:
{sim}
"#
    );
    Config::from_yaml(&yaml, "test.yaml").unwrap_or_else(|e| panic!("{e}"))
}

const BASE_SIM: &str = r#"
  sla_ms: 1000
  request: {service_time: {distribution: fixed, ms: 1000}}
  vm: {slots: 16, boot_seconds: 100, billing: per_second, minimum_billed_seconds: 60, bill_boot: true}
  function: {cold_start_ms: 0, warm_start_ms: 0, keep_alive_seconds: 600, max_instances: 1000, bill_init: false}
  auto: {min_vms: 1, max_vms: 10, step_vms: 1, window_seconds: 10, grace_seconds: 30}
"#;

fn counts(text: &str) -> Trace {
    Trace::parse(text, Path::new("mem.txt"), &TraceOptions::default()).unwrap()
}

fn run(c: &Config, t: &Trace, k: PolicyKind) -> PolicyRun {
    let p = SimParams::from_config(c).unwrap();
    run_policy(&p, t, k, 1, true, &mut |_| {})
}

/// Cost of one 512 MB × 1 s call on x86 without INIT or gateway, USD.
const CALL_USD: f64 = 0.5 * 0.000_016_666_7 + 0.000_000_2;

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-12 * b.abs().max(1.0)
}

#[test]
fn constant_10_rps_faas_costs_exactly_6000_calls() {
    let c = config(60, 16.0, BASE_SIM);
    let t = counts(&"10\n".repeat(600));
    let r = run(&c, &t, PolicyKind::Faas);
    let rep = &r.report;
    assert_eq!((rep.requests, rep.served, rep.throttled), (6000, 6000, 0));
    assert_eq!(
        rep.sla_violations, 0,
        "1000 ms is not slower than the 1000 ms SLA"
    );
    // Instance i finishes exactly when call i + 10 arrives: 10 cold starts, then warm.
    assert_eq!(rep.cold_starts, 10);
    assert_eq!(rep.function_gb_seconds, 3000.0);
    assert!(close(rep.cost_usd.function, 6000.0 * CALL_USD), "{rep:?}");
    assert_eq!((rep.cost_usd.vm, rep.vm_hours), (0.0, 0.0));
    assert_eq!(rep.function_share, 1.0);
    assert_eq!(rep.response_ms.mean, 1000.0);
    assert_eq!(rep.response_ms.p99, 1000.0);
}

#[test]
fn constant_10_rps_max_runs_one_vm_for_the_whole_trace() {
    let c = config(60, 16.0, BASE_SIM);
    let t = counts(&"10\n".repeat(600));
    let r = run(&c, &t, PolicyKind::Max);
    // peak 10 req/s, r_max 16 → 1 VM, booted before t = 0; the last call ends at 600.9 s.
    assert_eq!(r.stats.vms_launched, 1);
    assert_eq!(r.stats.vm_billed_seconds, 601.0);
    assert!(close(r.report.cost_usd.total, 601.0 / 3600.0 * 0.10));
    assert_eq!(r.report.sla_violations, 0);
    assert_eq!(r.report.function_share, 0.0);
}

#[test]
fn constant_10_rps_libra_launches_one_vm_at_the_first_decision() {
    let c = config(60, 16.0, BASE_SIM);
    let t = counts(&"10\n".repeat(600));
    let r = run(&c, &t, PolicyKind::Libra);
    // First report at 60 s: avg 10 ≥ CIP 3.26, std 0 → ceil(10/16) = 1 VM, ready at 160 s,
    // billed from launch (60 s) to the end (600.9 s → 541 s).
    assert_eq!(r.stats.vms_launched, 1);
    assert_eq!(r.stats.peak_vms, 1);
    assert_eq!(r.stats.vm_billed_seconds, 541.0);
    let ready: Vec<u32> = r.series.iter().map(|e| e.vms_ready).collect();
    // Row i is the epoch ending at i + 1 s; epoch ends are handled before events at the
    // same instant, so the VM that is ready at 160 s shows from the row ending at 161 s.
    assert_eq!(ready[159], 0, "epoch ending at 160 s");
    assert_eq!(ready[160], 1, "epoch ending at 161 s");
    // At most 2 · ρ · 10 = 16 calls in flight on 16 slots: no queue, no violation.
    assert_eq!(r.report.sla_violations, 0);
    assert_eq!(r.report.cold_starts, 10);
    let on_vm = r.report.served - r.stats.function_served;
    // The VM takes ρ·10 = 8 req/s from 160 s on, plus the bucket's initial 8 tokens.
    assert!((440 * 8..=440 * 8 + 8).contains(&on_vm), "{on_vm}");
    assert!(close(
        r.report.cost_usd.total,
        541.0 / 3600.0 * 0.10 + r.stats.function_served as f64 * CALL_USD
    ));
}

#[test]
fn one_burst_on_too_few_vms_queues_exactly_the_excess() {
    // 100 requests in second 10, none else. r_max 32 → MAX runs ceil(100/32) = 4 VMs,
    // 64 slots: requests 64..99 wait for request j − 64's slot: 1.36 s each.
    let c = config(60, 32.0, BASE_SIM);
    let t = counts(&format!("{}100\n{}", "0\n".repeat(10), "0\n".repeat(20)));
    let r = run(&c, &t, PolicyKind::Max);
    assert_eq!(r.stats.vms_launched, 4);
    assert_eq!(r.report.sla_violations, 36);
    // Request j arrives at 10 + j/100 s; the queued ones start at 11 + (j − 64)/100 s,
    // in second 11: all 36 are also "delayed" in the authors' whole-second sense.
    assert_eq!(r.report.delayed, 36);
    let row = &r.series[10];
    assert_eq!((row.load, row.violations, row.delayed), (100, 36, 36));
    assert!(r.series.iter().map(|e| e.delayed).sum::<u64>() == 36);
    assert_eq!(
        r.report.response_ms.mean,
        (64.0 * 1000.0 + 36.0 * 1360.0) / 100.0
    );
    // 31 s of trace (the last queued request ends at 10.99 + 1.36 = 12.35 s): each VM
    // is billed its 60 s minimum.
    assert_eq!(r.stats.vm_billed_seconds, 4.0 * 60.0);
    // r_max 16 → 7 VMs, 112 slots: no violation.
    let r = run(&config(60, 16.0, BASE_SIM), &t, PolicyKind::Max);
    assert_eq!((r.stats.vms_launched, r.report.sla_violations), (7, 0));
}

#[test]
fn one_burst_on_functions_cold_starts_throttles_and_bills_init() {
    let sim = BASE_SIM.replace(
        "function: {cold_start_ms: 0, warm_start_ms: 0, keep_alive_seconds: 600, max_instances: 1000, bill_init: false}",
        "function: {cold_start_ms: 250, warm_start_ms: 0, keep_alive_seconds: 600, max_instances: 60, bill_init: true}",
    );
    let c = config(60, 16.0, &sim);
    let t = counts(&format!("{}100\n", "0\n".repeat(10)));
    let r = run(&c, &t, PolicyKind::Faas);
    let rep = &r.report;
    // 60 instances start (cold), the other 40 calls find none idle and are throttled.
    assert_eq!((rep.served, rep.throttled, rep.cold_starts), (60, 40, 60));
    // Every served call takes 1.25 s > 1 s: all 100 requests violate the SLA.
    assert_eq!(rep.sla_violations, 100);
    assert_eq!(rep.sla_violation_pct, 100.0);
    // 60 · 0.5 GB · (1 s + 0.25 s INIT) = 37.5 GB-s.
    assert_eq!(rep.function_gb_seconds, 37.5);
    assert!(close(
        rep.cost_usd.total,
        37.5 * 0.000_016_666_7 + 60.0 * 0.000_000_2
    ));
}

#[test]
fn an_api_gateway_fee_is_charged_only_when_configured() {
    let t = counts("10\n");
    let plain = run(&config(60, 16.0, BASE_SIM), &t, PolicyKind::Faas);
    let yaml = r#"
pricing: {api_gateway: true}
sim:
  request: {service_time: {distribution: fixed, ms: 1000}}
  function: {cold_start_ms: 0, warm_start_ms: 0, bill_init: false}
"#;
    let c = Config::from_yaml(yaml, "gw.yaml").unwrap();
    let gw = run(&c, &t, PolicyKind::Faas);
    assert!(close(
        gw.report.cost_usd.function - plain.report.cost_usd.function,
        10.0 * 0.000_001
    ));
}

#[test]
fn auto_scales_out_under_overload_and_spock_spills_while_booting() {
    // 1 VM (16 slots) at first, 30 req/s of 1 s requests: utilisation 1 → scale out.
    let c = config(60, 16.0, BASE_SIM);
    let t = counts(&"30\n".repeat(300));
    let auto = run(&c, &t, PolicyKind::Auto);
    // +1 VM every 30 s grace while the first new one boots (100 s) and the backlog
    // keeps utilisation at 1, bounded by max_vms.
    assert!(
        (3..=10).contains(&auto.stats.vms_launched),
        "{:?}",
        auto.stats
    );
    assert!(
        auto.report.sla_violations > 0,
        "queues build while the VM boots"
    );
    assert_eq!(auto.report.function_share, 0.0);
    let spock = run(&c, &t, PolicyKind::Spock);
    assert!(spock.report.function_share > 0.0);
    assert!(spock.report.sla_violations < auto.report.sla_violations);
}

#[test]
fn same_seed_same_bytes_and_the_seed_matters_for_random_models() {
    let sim = BASE_SIM.replace(
        "{distribution: fixed, ms: 1000}",
        "{distribution: lognormal, mean_ms: 400, std_ms: 300}",
    );
    let c = config(30, 16.0, &sim);
    let t = counts(&"7\n13\n2\n40\n".repeat(60));
    let all = PolicyKind::ALL;
    let json = |seed| {
        let (rep, _) = simulate(&c, &t, &all, seed, false, &mut |_, _| {}).unwrap();
        serde_json::to_string(&rep).unwrap()
    };
    assert_eq!(json(5), json(5));
    assert_ne!(json(5), json(6));
}

#[test]
fn the_report_has_exactly_the_issue_fields() {
    let c = config(60, 16.0, BASE_SIM);
    let (rep, _) = simulate(
        &c,
        &counts("3\n"),
        &[PolicyKind::Libra],
        9,
        false,
        &mut |_, _| {},
    )
    .unwrap();
    let v = serde_json::to_value(&rep).unwrap();
    let keys = |v: &serde_json::Value| -> Vec<String> {
        let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        k.sort();
        k
    };
    assert_eq!(keys(&v), ["policies", "seed", "trace"]);
    let p = &v["policies"][0];
    assert_eq!(
        keys(p),
        [
            "cold_starts",
            "cost_usd",
            "delayed",
            "function_gb_seconds",
            "function_share",
            "name",
            "requests",
            "response_ms",
            "served",
            "sla_violation_pct",
            "sla_violations",
            "throttled",
            "vm_hours"
        ]
    );
    assert_eq!(keys(&p["cost_usd"]), ["function", "total", "vm"]);
    assert_eq!(keys(&p["response_ms"]), ["mean", "p50", "p95", "p99"]);
    assert_eq!(p["name"], "libra");
}

fn service_strategy() -> impl Strategy<Value = String> {
    prop_oneof![
        (1u32..2000).prop_map(|ms| format!("{{distribution: fixed, ms: {ms}}}")),
        (1u32..1000, 0u32..500)
            .prop_map(|(m, s)| format!("{{distribution: lognormal, mean_ms: {m}, std_ms: {s}}}")),
        (1u32..1000, 0u32..500)
            .prop_map(|(m, s)| format!("{{distribution: normal, mean_ms: {m}, std_ms: {s}}}")),
    ]
}

fn policy_strategy() -> impl Strategy<Value = PolicyKind> {
    prop::sample::select(PolicyKind::ALL.to_vec())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn invariants_hold_for_any_trace_and_policy(
        counts_in in prop::collection::vec(0u32..60, 1..90),
        service in service_strategy(),
        policy in policy_strategy(),
        max_conc in 1u32..200,
        k in 1u32..20,
        seed in any::<u64>(),
    ) {
        let sim = format!(r#"
  sla_ms: 1000
  request: {{service_time: {service}}}
  vm: {{slots: 4, boot_seconds: 5}}
  function: {{cold_start_ms: 100, warm_start_ms: 5, keep_alive_seconds: 3, max_instances: {max_conc}}}
  auto: {{min_vms: 1, max_vms: 6, step_vms: 2, window_seconds: 3, grace_seconds: 4}}
"#);
        let c = config(k, 4.0, &sim);
        let text: String = counts_in.iter().map(|c| format!("{c}\n")).collect();
        let t = counts(&text);
        let p = SimParams::from_config(&c).unwrap();
        let r = run_policy(&p, &t, policy, seed, false, &mut |_| {});
        let rep = &r.report;
        prop_assert_eq!(rep.requests, counts_in.iter().map(|&c| u64::from(c)).sum::<u64>());
        prop_assert_eq!(rep.served + rep.throttled, rep.requests);
        prop_assert!(rep.sla_violations <= rep.requests);
        prop_assert!(rep.cost_usd.vm >= 0.0 && rep.cost_usd.function >= 0.0);
        prop_assert!(close(rep.cost_usd.total, rep.cost_usd.vm + rep.cost_usd.function));
        prop_assert!(rep.vm_hours >= 0.0 && rep.function_gb_seconds >= 0.0);
        prop_assert!((0.0..=1.0).contains(&rep.function_share));
        if policy == PolicyKind::Faas {
            prop_assert_eq!(rep.cost_usd.vm, 0.0);
            prop_assert_eq!(r.stats.vms_launched, 0);
        }
        if matches!(policy, PolicyKind::Max | PolicyKind::Auto) {
            prop_assert_eq!(rep.function_share, 0.0);
        }
    }

    /// A run paused at any times and resumed gives the report of an uninterrupted run,
    /// byte for byte; what it had accrued at each pause never decreases and never
    /// exceeds the final report (the bound `spillway tune` stops runs on).
    #[test]
    fn a_paused_run_resumes_to_the_same_report_and_its_partials_only_grow(
        counts_in in prop::collection::vec(0u32..60, 1..90),
        service in service_strategy(),
        policy in policy_strategy(),
        minimum in 0u32..120,
        pauses in prop::collection::vec(0u64..100_000_000_000, 0..12),
        seed in any::<u64>(),
    ) {
        let sim = format!(r#"
  sla_ms: 1000
  request: {{service_time: {service}}}
  vm: {{slots: 4, boot_seconds: 5, minimum_billed_seconds: {minimum}}}
  function: {{cold_start_ms: 100, warm_start_ms: 5, keep_alive_seconds: 3, max_instances: 30, shutdown_ms: 50}}
  auto: {{min_vms: 1, max_vms: 6, step_vms: 2, window_seconds: 3, grace_seconds: 4}}
"#);
        let c = config(5, 4.0, &sim);
        let text: String = counts_in.iter().map(|c| format!("{c}\n")).collect();
        let t = counts(&text);
        let p = SimParams::from_config(&c).unwrap();
        let whole = run_policy(&p, &t, policy, seed, false, &mut |_| {});
        let mut pauses = pauses;
        pauses.sort_unstable();
        let mut paused = spillway::sim::engine::Run::new(&p, &t, policy, seed, None);
        let mut last: Option<spillway::sim::engine::Partial> = None;
        for at in pauses {
            paused.run_until(at, &mut |_| {});
            let now = paused.partial();
            prop_assert!(now.time_s <= at as f64 / 1e9 + 1e-9);
            if let Some(before) = last {
                prop_assert!(now.cost_usd >= before.cost_usd, "{:?} then {:?}", before, now);
                prop_assert!(now.sla_violations >= before.sla_violations);
                prop_assert!(now.requests >= before.requests);
            }
            last = Some(now);
        }
        let resumed = paused.finish(&mut |_| {});
        prop_assert_eq!(
            serde_json::to_string(&resumed.report).unwrap(),
            serde_json::to_string(&whole.report).unwrap()
        );
        prop_assert_eq!(&resumed.stats, &whole.stats);
        if let Some(l) = last {
            prop_assert!(l.cost_usd <= whole.report.cost_usd.total, "{:?} > {:?}", l, whole.report.cost_usd);
            prop_assert!(l.vm_usd <= whole.report.cost_usd.vm);
            prop_assert!(l.function_usd <= whole.report.cost_usd.function);
            prop_assert!(l.sla_violations <= whole.report.sla_violations);
        }
    }

    #[test]
    fn max_with_capacity_above_the_peak_never_violates(
        counts_in in prop::collection::vec(0u32..200, 1..60),
        service_ms in 1u32..3000,
        slots in 1u32..32,
    ) {
        // r_max = slots / (ceil(S) + 1): MAX's VMs hold every request of the last
        // ceil(S) + 1 seconds at once, so nobody waits.
        let s = f64::from(service_ms) / 1000.0;
        let r_max = f64::from(slots) / (s.ceil() + 1.0);
        let sim = format!(r#"
  sla_ms: {service_ms}
  request: {{service_time: {{distribution: fixed, ms: {service_ms}}}}}
  vm: {{slots: {slots}}}
"#);
        let c = config(10, r_max, &sim);
        let text: String = counts_in.iter().map(|c| format!("{c}\n")).collect();
        let r = run(&c, &counts(&text), PolicyKind::Max);
        prop_assert_eq!(r.report.sla_violations, 0);
        prop_assert_eq!(r.report.throttled, 0);
        prop_assert_eq!(r.report.response_ms.mean, f64::from(service_ms));
    }
}

/// Regression (WITS run, 2.97 % LIBRA violations): the token bucket banks one second's
/// budget, so a quiet second followed by a busy one admits up to 2·ρ·vm_reqs requests
/// to VMs within a second; 1 s requests on 16-slot VMs then queue past the SLA. The
/// optional per-VM cap (`libra.max_outstanding_per_vm = slots`) spills that excess.
#[test]
fn the_per_vm_cap_removes_the_queueing_a_banked_bucket_causes() {
    // 200 s steady at 40 req/s → 3 VMs (vm_reqs 40, budget 32/s), then alternate quiet
    // and busy seconds so the bucket banks tokens during each quiet one.
    let mut text = "40\n".repeat(200);
    for _ in 0..100 {
        text.push_str("0\n60\n");
    }
    let t = counts(&text);
    let uncapped = config(100, 16.0, BASE_SIM);
    let capped = Config::from_yaml(
        &format!(
            "libra: {{epoch_seconds: 1, decision_epochs: 100, phi: 1.0, rho: 0.8, alpha: 0.2, beta: 0.2, r_max_rps: 16, min_vms: 0, max_vms: 100, max_outstanding_per_vm: 16}}\npricing: {{vm_hourly_usd: 0.10, function_memory_mb: 512, function_duration_ms: 1000}}\nsim:\n{BASE_SIM}"
        ),
        "capped.yaml",
    )
    .unwrap();
    let without = run(&uncapped, &t, PolicyKind::Libra).report;
    let with = run(&capped, &t, PolicyKind::Libra).report;
    assert!(
        without.sla_violations > 0,
        "the banked bucket over-admits: {without:?}"
    );
    assert_eq!(with.sla_violations, 0, "{with:?}");
    assert_eq!(with.served, without.served);
    assert!(with.function_share > without.function_share);
}

/// A call no function instance can take falls back to a VM with a free slot and is
/// served there, as the gateway does after a 429 — not counted as throttled or as an SLA
/// violation. One ready VM (16 slots), ρ·budget = 0.225 · 16 = 3.6 tokens/s
/// (the bucket starts full), functions capped at 2 instances, 500 ms calls, 20 arrivals
/// 50 ms apart. An independent model of the bucket (tokens never within 0.02 of 1 at a
/// decision) gives: 7 calls on the VM within budget, 4 on functions, and 9 that find both
/// function instances busy and the bucket empty — those fall back to the VM.
#[test]
fn throttled_function_calls_fall_back_to_a_vm_slot_and_are_served() {
    let yaml = r#"
libra: {epoch_seconds: 1, decision_epochs: 1000, phi: 1.5, rho: 0.225, alpha: 0.3, beta: 0.2,
        r_max_rps: 16, min_vms: 1, max_vms: 4, cip_rps: 0, max_outstanding_per_vm: 16}
pricing: {vm_hourly_usd: 0.10, function_memory_mb: 512, function_duration_ms: 500}
sim:
  sla_ms: 1000
  request: {service_time: {distribution: fixed, ms: 500}}
  vm: {slots: 16, boot_seconds: 100, billing: per_second, minimum_billed_seconds: 60, bill_boot: true}
  function: {cold_start_ms: 0, warm_start_ms: 0, keep_alive_seconds: 600, max_instances: 2, bill_init: false}
"#;
    let c = Config::from_yaml(yaml, "test.yaml").unwrap_or_else(|e| panic!("{e}"));
    let r = run(&c, &counts("20\n"), PolicyKind::Libra);
    let rep = &r.report;
    assert_eq!((rep.requests, rep.served, rep.throttled), (20, 20, 0));
    assert_eq!(rep.sla_violations, 0);
    assert_eq!(r.stats.function_served, 4);
    assert_eq!(r.stats.fell_back, 9);
    assert_eq!(rep.response_ms.p99, 500.0);
}

/// One VM (min = max = 1, ρ = 1) of 4 slots × 100 ms = 40 req/s under 100 req/s, with
/// adaptive r_max (p99 ≤ 250 ms, periods of 30 epochs): the budget `1 · r_max` decides the
/// VM's load, so its modelled response times (queue wait + service) drive r_max.
fn one_vm_adaptive(start: f64) -> Config {
    let yaml = format!(
        r#"
libra: {{epoch_seconds: 1, decision_epochs: 30, phi: 0, rho: 1.0, r_max_rps: {start},
         min_vms: 1, max_vms: 1, cip_rps: 0,
         r_max_adaptive: {{target_percentile: 99, target_ms: 250, kp: 0.1, ki: 0.45, kd: 0.03,
                          min_rps: 5, max_rps: 200, max_step_rps: 20}}}}
sim:
  sla_ms: 1000
  request: {{service_time: {{distribution: fixed, ms: 100}}}}
  vm: {{slots: 4, boot_seconds: 10}}
  function: {{cold_start_ms: 0, warm_start_ms: 0, max_instances: 1000}}
"#
    );
    Config::from_yaml(&yaml, "adaptive.yaml").unwrap_or_else(|e| panic!("{e}"))
}

/// r_max at the end of each 30 s period.
fn r_max_per_period(r: &PolicyRun) -> Vec<f64> {
    r.series
        .iter()
        .filter(|e| (e.time_s as u64).is_multiple_of(30))
        .map(|e| e.r_max_rps)
        .collect()
}

#[test]
fn adaptive_r_max_follows_the_modelled_vm_response_times() {
    let t = counts(&"100\n".repeat(600));
    // Four times the VM's capacity: queues grow, r_max only falls (20 req/s per period at
    // most) until it is below the 40 req/s the VM serves; it never moves more than 20.
    let over = run(&one_vm_adaptive(160.0), &t, PolicyKind::Libra);
    let down = r_max_per_period(&over);
    assert_eq!(down.len(), 20);
    assert!(
        down.windows(2).all(|w| (w[1] - w[0]).abs() <= 20.0 + 1e-9),
        "{down:?}"
    );
    let below = down.iter().position(|r| *r < 40.0).expect("below capacity");
    assert!(below < 12, "{down:?}");
    assert!(down[..=below].windows(2).all(|w| w[1] < w[0]), "{down:?}");
    // Once the overloaded periods' backlog has drained, the latency is the 100 ms
    // service time again and r_max rises from where it is (the integrator follows the
    // rate-limited descent): it does not stay at min_rps.
    let lowest = down.iter().copied().fold(f64::MAX, f64::min);
    assert!(*down.last().unwrap() > 4.0 * lowest, "{down:?}");
    // A quarter of its capacity: no queue, latency = the 100 ms service time, r_max rises
    // every period until the VM is loaded to its capacity.
    let under = run(&one_vm_adaptive(10.0), &t, PolicyKind::Libra);
    let up = r_max_per_period(&under);
    let first_over = up.iter().position(|r| *r > 40.0).expect("reaches capacity");
    assert!(up[..first_over].windows(2).all(|w| w[1] > w[0]), "{up:?}");
    let rep = under
        .report
        .r_max
        .as_ref()
        .expect("LIBRA reports its r_max");
    assert_eq!(rep.start_rps, 10.0);
    assert_eq!(rep.end_rps, *up.last().unwrap());
    assert!(rep.adjustments >= 10);
    // The baselines keep the static r_max.
    let max = run(&one_vm_adaptive(10.0), &t, PolicyKind::Max);
    assert!(max.report.r_max.is_none());
    assert!(max.series.iter().all(|e| e.r_max_rps == 10.0));
}

/// Function zones in the simulator (FaaSim two-tier edge/cloud): an `events`
/// trace's zone is the call's origin edge zone; edge-first and warm-first place calls
/// differently when the edge's keep-alive (1 s) is shorter than the cloud's (10 s).
#[test]
fn events_zones_drive_edge_first_and_warm_first_placement() {
    let (cold, warm, service) = (1.0, 0.1, 2.0);
    let zones_yaml = |placement: &str| {
        format!(
            r#"
placement: {placement}
function_zones:
  - {{name: edge-0, kind: edge, type: process, max_instances: 1, keep_alive_seconds: 1}}
  - {{name: cloud, kind: cloud, type: process, max_instances: 10, keep_alive_seconds: 10}}
libra: {{epoch_seconds: 1, decision_epochs: 60, r_max_rps: 16, min_vms: 0, max_vms: 10}}
sim:
  sla_ms: 10000
  request: {{service_time: {{distribution: fixed, ms: {}}}}}
  function: {{cold_start_ms: {}, warm_start_ms: {}, keep_alive_seconds: 600, max_instances: 1000, bill_init: false}}
"#,
            service * 1e3,
            cold * 1e3,
            warm * 1e3
        )
    };
    // 0 s and 0.5 s from edge 0 (the edge takes the first, the cloud the second); 6 s
    // from edge 0, after the edge instance expired (3 + 1 s) but with the cloud one
    // warm (until 3.5 + 10 s); 7 s from zone 1, which has no edge zone: the cloud.
    let events = "0.0 0\n0.5 0\n6.0 0\n7.0 1\n";
    let opts = TraceOptions {
        format: spillway::sim::trace::TraceFormat::Events,
        ..TraceOptions::default()
    };
    let trace = Trace::parse(events, Path::new("ev.txt"), &opts).unwrap();
    let run_with = |placement: &str| {
        let c =
            Config::from_yaml(&zones_yaml(placement), "z.yaml").unwrap_or_else(|e| panic!("{e}"));
        run(&c, &trace, PolicyKind::Faas)
    };
    let (c, w, s) = (cold, warm, service);

    // edge-first: 6 s cold-starts on the (empty) edge; 7 s reuses the warm cloud one.
    let r = run_with("edge_first");
    let z = &r.report.zones;
    assert_eq!((z[0].name.as_str(), z[0].kind), ("edge-0", "edge"));
    assert_eq!((z[0].cold_starts, z[0].warm_starts), (2, 0));
    assert_eq!((z[1].cold_starts, z[1].warm_starts), (1, 1));
    let mean = (3.0 * (c + s) + (w + s)) / 4.0;
    assert!(
        close(r.report.response_ms.mean, mean * 1e3),
        "{:?}",
        r.report
    );
    // The run ends with the last call (7 + w + s); the edge's second instance (ready at
    // 6 + c, done at 6 + c + s) is idle from then to the end, its first one for its 1 s
    // keep-alive.
    let end = 7.0 + w + s;
    let edge_idle = 1.0 + (end - (6.0 + c + s));
    assert!(close(z[0].idle_s, edge_idle), "{z:?}");
    assert!(close(z[0].startup_s, 2.0 * c) && close(z[0].busy_s, 2.0 * s));
    // Cloud: one cold start; busy from ready (0.5 + c) for s, idle until 7 s, then busy
    // with the warm call (warm start included) to the end.
    assert!(close(z[1].busy_s, s + (w + s)), "{z:?}");
    assert!(close(z[1].idle_s, 7.0 - (0.5 + c + s)), "{z:?}");
    let hours: f64 = z
        .iter()
        .map(|z| (z.startup_s + z.busy_s + z.idle_s) / 3600.0)
        .sum();
    assert!(close(r.report.instance_hours.unwrap(), hours));
    assert!(close(
        z[0].mean_instances,
        (2.0 * c + 2.0 * s + edge_idle) / end
    ));

    // warm-first: 6 s takes the warm cloud instance; 7 s finds it busy: a new cloud one.
    let r = run_with("warm_first");
    let z = &r.report.zones;
    assert_eq!((z[0].cold_starts, z[0].warm_starts), (1, 0));
    assert_eq!((z[1].cold_starts, z[1].warm_starts), (2, 1));
    assert_eq!(r.report.cold_starts, 3);
    assert!(close(r.report.response_ms.mean, mean * 1e3));
}

/// The FaaSim preset on the burst excerpt (three bursts 30 s apart, zones 0–4): with its
/// 30 s keep-alive every instance of the first burst is still warm at the next, and no
/// zone overflows its 25 instances, so the cold starts are exactly the first burst's
/// calls, zone by zone, and the cloud is never used.
#[test]
fn the_faasim_preset_keeps_the_first_bursts_instances_warm() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let c = Config::load(&root.join("config/sim/faasim.yaml")).unwrap();
    let path = root.join("tests/data/faasim/burst_excerpt.txt");
    let text = std::fs::read_to_string(&path).unwrap();
    let opts = TraceOptions {
        format: spillway::sim::trace::TraceFormat::Events,
        ..TraceOptions::default()
    };
    let trace = Trace::parse(&text, &path, &opts).unwrap();
    let mut first_burst = [0u64; 5];
    for line in text.lines() {
        let mut it = line.split_whitespace();
        let t: f64 = it.next().unwrap().parse().unwrap();
        let z: usize = it.next().unwrap().parse().unwrap();
        if t < 15.0 {
            first_burst[z] += 1;
        }
    }
    assert!(first_burst.iter().all(|&n| n <= 25), "{first_burst:?}");
    let r = run(&c, &trace, PolicyKind::Faas);
    let z = &r.report.zones;
    assert_eq!(z.len(), 6);
    for (i, n) in first_burst.iter().enumerate() {
        assert_eq!(z[i].name, format!("edge-{i}"));
        assert_eq!(z[i].cold_starts, *n, "{z:?}");
    }
    assert_eq!(r.report.cold_starts, first_burst.iter().sum::<u64>());
    assert_eq!(
        (z[5].kind, z[5].cold_starts + z[5].warm_starts),
        ("cloud", 0)
    );
    assert_eq!(r.report.served, r.report.requests);
}

/// `sim.network` (FaaSim's RTT): a call run in its origin edge zone adds the edge round
/// trip to the client's time, any other the cloud's; the platform's time is unchanged.
/// One edge zone of one instance: the second simultaneous call from it overflows to the
/// cloud, and a call from trace zone 3 (no edge zone) goes to the cloud too.
#[test]
fn the_client_time_adds_the_edge_or_cloud_round_trip() {
    let (edge_rtt, cloud_rtt) = (62.0, 851.0);
    let yaml = format!(
        r#"
function_zones:
  - {{name: edge-0, kind: edge, type: process, max_instances: 1, keep_alive_seconds: 0}}
  - {{name: cloud, kind: cloud, type: process, max_instances: 10, keep_alive_seconds: 0}}
libra: {{epoch_seconds: 1, decision_epochs: 60, r_max_rps: 16, min_vms: 0, max_vms: 10}}
sim:
  sla_ms: 10000
  request: {{service_time: {{distribution: fixed, ms: 300}}}}
  function: {{cold_start_ms: 700, warm_start_ms: 0, keep_alive_seconds: 0, max_instances: 10, bill_init: false}}
  network: {{edge_rtt_ms: {edge_rtt}, cloud_rtt_ms: {cloud_rtt}}}
"#
    );
    let c = Config::from_yaml(&yaml, "n.yaml").unwrap_or_else(|e| panic!("{e}"));
    let opts = TraceOptions {
        format: spillway::sim::trace::TraceFormat::Events,
        ..TraceOptions::default()
    };
    let trace = Trace::parse("0.0 0\n0.0 0\n5.0 3\n", Path::new("n.txt"), &opts).unwrap();
    let r = run(&c, &trace, PolicyKind::Faas);
    let (p, cl) = (
        r.report.platform_response_ms.clone().unwrap(),
        r.report.client_response_ms.clone().unwrap(),
    );
    // Every call is a cold start: 700 + 300 ms on the platform.
    assert_eq!((p.min, p.max, p.mean), (1000.0, 1000.0, 1000.0));
    assert_eq!(cl.min, 1000.0 + edge_rtt);
    assert_eq!(cl.max, 1000.0 + cloud_rtt);
    assert!(
        close(cl.mean, 1000.0 + (edge_rtt + 2.0 * cloud_rtt) / 3.0),
        "{cl:?}"
    );
    assert_eq!(
        r.report.response_ms.mean, p.mean,
        "response_ms stays the platform's"
    );
}

/// `config` with extra `libra:` keys (flow-mapping entries, e.g. `balancer: quota`).
fn config_with(k: u32, libra_extra: &str) -> Config {
    Config::from_yaml(
        &format!(
            "libra: {{epoch_seconds: 1, decision_epochs: {k}, phi: 1.0, rho: 0.8, alpha: 0.2, beta: 0.2, r_max_rps: 16, min_vms: 0, max_vms: 100, {libra_extra}}}\npricing: {{vm_hourly_usd: 0.10, function_memory_mb: 512, function_duration_ms: 1000}}\nsim:\n{BASE_SIM}"
        ),
        "quota.yaml",
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

/// LIBRA §III-C's quota and the authors' decision phase on a steady 12 req/s for 600 s.
/// F = 1: the first decision closes epoch 0 (avg 12, std 0 → 1 VM, vm_reqs 12), the VM
/// launches at 1 s and is ready at 101 s; K = 60 keeps it. From second 101 to 599 (499
/// seconds) each second sends its first ρ·12 = 9.6 requests to the VM: truncated (the
/// authors' int(0.8·int(12)) = 9) 499 · 9; real (fraction carried) ⌊499 · 9.6⌋.
#[test]
fn the_quota_and_the_first_decision_epoch_match_a_hand_computation() {
    let t = counts(&"12\n".repeat(600));
    let on_vm = |r: &PolicyRun| r.report.served - r.stats.function_served;
    let trunc = run(
        &config_with(
            60,
            "balancer: quota, quota_truncate: true, first_decision_epoch: 1",
        ),
        &t,
        PolicyKind::Libra,
    );
    let ready_seconds = 600 - 101;
    assert_eq!(trunc.stats.vms_launched, 1);
    assert_eq!(on_vm(&trunc), ready_seconds * 9);
    // Billed from launch (1 s) to the last VM call's end (599 s + 8/12 s + 1 s → 600.67,
    // per second rounded up) = 600 s.
    assert_eq!(trunc.stats.vm_billed_seconds, 600.0);
    assert_eq!(trunc.report.sla_violations, 0);
    let ready: Vec<u32> = trunc.series.iter().map(|e| e.vms_ready).collect();
    assert_eq!((ready[99], ready[101]), (0, 1), "ready at 101 s");

    let real = run(
        &config_with(60, "balancer: quota, first_decision_epoch: 1"),
        &t,
        PolicyKind::Libra,
    );
    assert_eq!(on_vm(&real), (ready_seconds as f64 * 9.6).floor() as u64);

    // Without F the first decision waits for K = 60 epochs: the VM is ready at 160 s.
    let late = run(
        &config_with(60, "balancer: quota, quota_truncate: true"),
        &t,
        PolicyKind::Libra,
    );
    assert_eq!(on_vm(&late), (600 - 160) * 9);
    assert!(late.report.cost_usd.function > trunc.report.cost_usd.function);
}

#[test]
fn quota_truncate_without_the_quota_rule_is_one_clear_error() {
    let e = Config::from_yaml("libra: {quota_truncate: true}\n", "bad.yaml")
        .expect_err("the token bucket has no quota");
    let msg = e.to_string();
    assert!(msg.contains("libra.quota_truncate"), "{msg}");
    let e = Config::from_yaml("libra: {first_decision_epoch: 0}\n", "bad.yaml").expect_err("F ≥ 1");
    assert!(e.to_string().contains("libra.first_decision_epoch"), "{e}");
}

/// `sim.max_fixed_vms` replaces MAX's peak sizing (the authors' fleet of 292).
#[test]
fn max_fixed_vms_sets_the_max_fleet() {
    let t = counts(&"10\n".repeat(100));
    let sim = format!("{BASE_SIM}  max_fixed_vms: 3\n");
    let r = run(&config(60, 16.0, &sim), &t, PolicyKind::Max);
    assert_eq!(r.stats.vms_launched, 3);
    // Each VM is billed its 60 s minimum or the run, whichever is longer: 100.9 s → 101 s.
    assert_eq!(r.stats.vm_billed_seconds, 3.0 * 101.0);
    let peak = run(&config(60, 16.0, BASE_SIM), &t, PolicyKind::Max);
    assert_eq!(peak.stats.vms_launched, 1, "ceil(10 / 16)");
}

/// The LIBRA authors' hybrid policy re-stated on per-second counts (aliraza0337/LIBRA,
/// manager.py and vm_cloud.py; 1-based epochs): EWMAs with α = μ = 0.2; a decision at
/// epoch 1 and every 300 after, `share = int(avg + std)`, `n = ceil(share / 16)` VMs (no
/// CIP rule), starting from 10 VMs; a scale-out keeps the old `provision_for` until 100
/// epochs have passed, a scale-in applies at once; each epoch sends its first
/// `provision_for = int(0.8 · share)` requests to VMs and the rest to functions. VMs are
/// billed from launch to stop (a VM dropped at epoch e stops at e + 1; the rest at the
/// end + 1). Returns (VM-seconds, function calls, VMs run).
fn authors_hybrid(counts: &[u64]) -> (u64, u64, u64) {
    let (mut mean, mut std) = (None::<f64>, 0.0);
    let mut vms: Vec<u64> = vec![1; 10];
    let (mut prev, mut provision_for, mut share) = (0usize, 0u64, 0u64);
    let (mut wait, mut counter, mut next) = (false, 0, 0);
    let (mut vm_s, mut fn_calls, mut ran) = (0u64, 0u64, 10u64);
    for (i, &c) in counts.iter().enumerate() {
        let epoch = i as u64 + 1;
        let x = c as f64;
        match mean {
            None => mean = Some(x),
            Some(m) => {
                std = 0.8 * std + 0.2 * (m - x).abs();
                mean = Some(0.8 * m + 0.2 * x);
            }
        }
        if epoch == 1 || epoch == next {
            next = epoch + 300;
            share = (mean.unwrap() + std) as u64;
            let n = share.div_ceil(16) as usize;
            if n < vms.len() {
                vm_s += vms.drain(n..).map(|s| epoch + 1 - s).sum::<u64>();
            } else {
                ran += (n - vms.len()) as u64;
                vms.resize(n, epoch);
            }
            if n > prev {
                wait = true;
            } else {
                prev = n;
                provision_for = (share as f64 * 0.8) as u64;
            }
        }
        if wait {
            if counter == 100 {
                prev = vms.len();
                provision_for = (share as f64 * 0.8) as u64;
                wait = false;
                counter = 0;
            } else {
                counter += 1;
            }
        }
        fn_calls += c.saturating_sub(provision_for);
    }
    let end = counts.len() as u64 + 1;
    vm_s += vms.iter().map(|s| end - s).sum::<u64>();
    (vm_s, fn_calls, ran)
}

/// The paper preset against the authors' rules on a public per-second trace other than
/// WITS (the square wave: 0–50 req/s, 1,112 s): the same VM-seconds and the same function
/// calls; VM-seconds within one second per VM (the authors' epoch e is spillway's second
/// e − 1, and their VMs stop one epoch after their last use).
#[test]
#[ignore = "needs traces/ from scripts/fetch-traces.sh"]
fn the_paper_preset_follows_the_authors_rules_on_the_square_wave() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("traces/square_per_second.txt");
    let text = std::fs::read_to_string(&path).expect("run scripts/fetch-traces.sh");
    let counts: Vec<u64> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.trim().parse().unwrap())
        .collect();
    let (vm_s, fn_calls, ran) = authors_hybrid(&counts);
    let c =
        Config::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("config/sim/libra-paper.yaml"))
            .unwrap();
    let r = run(&c, &counts_of(&counts), PolicyKind::Libra);
    let diff = (r.stats.vm_billed_seconds - vm_s as f64).abs();
    assert!(
        diff <= ran as f64,
        "{} vs {vm_s} VM-seconds ({ran} VMs)",
        r.stats.vm_billed_seconds
    );
    assert_eq!(r.stats.function_served, fn_calls);
    assert_eq!((r.report.sla_violations, r.report.delayed), (0, 0));
}

fn counts_of(c: &[u64]) -> Trace {
    counts(&c.iter().map(|x| format!("{x}\n")).collect::<String>())
}

/// The per-epoch series carries the utilisation and the cost so far: MAX's one
/// VM at 10 req/s of 1 s calls on 16 slots is 10/16 busy; FAAS's running cost at the
/// trace end is every call started so far.
#[test]
fn the_series_has_utilisation_and_cost_so_far() {
    let c = config(60, 16.0, BASE_SIM);
    let t = counts(&"10\n".repeat(600));
    let max = run(&c, &t, PolicyKind::Max);
    let steady = &max.series[300];
    assert_eq!(steady.vm_utilisation, Some(10.0 / 16.0));
    // Billed from t = 0 to the epoch end at 301 s.
    assert!(close(steady.cost_usd, 301.0 / 3600.0 * 0.10), "{steady:?}");
    let faas = run(&c, &t, PolicyKind::Faas);
    let last = faas.series.last().unwrap();
    assert_eq!(last.vm_utilisation, None, "no VM");
    assert!(close(last.cost_usd, faas.report.cost_usd.total));
    let costs: Vec<f64> = faas.series.iter().map(|r| r.cost_usd).collect();
    assert!(costs.windows(2).all(|w| w[0] <= w[1]), "a running total");
}

/// Events trace text → trace.
fn events(text: &str) -> Trace {
    let opts = TraceOptions {
        format: spillway::sim::trace::TraceFormat::Events,
        ..TraceOptions::default()
    };
    Trace::parse(text, Path::new("e.txt"), &opts).unwrap()
}

/// One cloud zone (`zone` keys) and a fixed 300 ms service time, no network.
fn one_zone(zone: &str, function: &str) -> Config {
    let yaml = format!(
        r#"
function_zones:
  - {{name: cloud, kind: cloud, type: process, {zone}}}
libra: {{epoch_seconds: 1, decision_epochs: 60, r_max_rps: 16, min_vms: 0, max_vms: 0}}
sim:
  sla_ms: 100000
  request: {{service_time: {{distribution: fixed, ms: 300}}}}
  function: {{max_instances: 10, bill_init: false, {function}}}
"#
    );
    Config::from_yaml(&yaml, "z.yaml").unwrap_or_else(|e| panic!("{e}"))
}

/// FaaSim: a call that finds no idle instance takes a pre-warmed instance still booting
/// and waits for it (then pays a warm start) before it cold-starts one. One pre-warm
/// booting 0 → 2.5 s; two calls at 0.4 s: the first waits 2.1 s + 20 ms warm start +
/// 300 ms, the second cold-starts (700 + 300 ms).
#[test]
fn a_call_waits_for_a_booting_prewarmed_instance_instead_of_a_cold_start() {
    let (boot, warm, cold, exec) = (2500.0, 20.0, 700.0, 300.0);
    let c = one_zone(
        "max_instances: 3, prewarmed_instances: 1, keep_alive_seconds: 100",
        &format!("cold_start_ms: {cold}, warm_start_ms: {warm}, prewarm_boot_ms: {boot}"),
    );
    let r = run(&c, &events("0.4 0\n0.4 0\n"), PolicyKind::Faas);
    let p = r.report.platform_response_ms.clone().unwrap();
    let waited = boot - 400.0 + warm + exec;
    assert_eq!((p.max, p.min), (waited, cold + exec));
    assert_eq!(r.report.cold_starts, 1, "the first call took the pre-warm");
    let z = &r.report.zones[0];
    assert_eq!((z.cold_starts, z.warm_starts, z.prewarm_waits), (1, 1, 1));
    let pre = &z.instances[0];
    assert!(pre.prewarmed && pre.warm_starts == 1 && pre.cold_starts == 0);
    // Busy from its boot's end to the call's end; the boot is not start-up time.
    assert!(close(pre.busy_s, (warm + exec) / 1e3), "{pre:?}");
    assert_eq!(pre.startup_s, 0.0);
    let new = &z.instances[1];
    assert!(close(new.startup_s, cold / 1e3) && close(new.busy_s, exec / 1e3));
}

/// `sim.function.shutdown_ms`: an expired instance shuts down for that long, which is
/// usage time (FaaSim: UT = start-up + busy + idle + shutdown), per instance and zone.
#[test]
fn expired_instances_shut_down_and_usage_is_reported_per_instance() {
    let (cold, exec, keep_alive, shutdown) = (700.0, 300.0, 1.0, 400.0);
    let c = one_zone(
        &format!("max_instances: 3, keep_alive_seconds: {keep_alive}"),
        &format!("cold_start_ms: {cold}, warm_start_ms: 0, shutdown_ms: {shutdown}"),
    );
    // The call at 0 ends at 1 s, expires at 2 s, is gone at 2.4 s; the call at 5 s
    // cold-starts again.
    let r = run(&c, &events("0.0 0\n5.0 0\n"), PolicyKind::Faas);
    let z = &r.report.zones[0];
    assert_eq!(z.cold_starts, 2);
    assert!(close(z.shutdown_s, shutdown / 1e3), "{z:?}");
    let first = &z.instances[0];
    let ends = (cold + exec) / 1e3;
    assert!(close(first.idle_s, keep_alive), "{first:?}");
    assert!(close(first.shutdown_s, shutdown / 1e3));
    assert!(close(
        first.stopped_s.unwrap(),
        ends + keep_alive + shutdown / 1e3
    ));
    let used = (cold + exec + shutdown) / 1e3 + keep_alive;
    assert!(close(first.instance_hours, used / 3600.0));
    assert_eq!(z.instances.len(), 2);
    assert_eq!(z.instances[1].stopped_s, None, "alive at the end");
    let total: f64 = z.instances.iter().map(|i| i.instance_hours).sum();
    assert!(close(z.instance_hours, total));
    // Totals over zones: instance-hours and mean instances (instance time ÷ run length).
    assert!(close(r.report.instance_hours.unwrap(), total));
    let mean = total * 3600.0 / r.stats.end_s;
    assert!(
        close(r.report.mean_instances.unwrap(), mean),
        "{:?}",
        r.report.mean_instances
    );
}

/// FaaSim's uniform jitter on execution, cold and warm starts (`sim.function.*_jitter`):
/// every response lies within the jittered bounds, they vary, and a seed repeats its run.
#[test]
fn start_and_execution_jitter_is_uniform_bounded_and_seeded() {
    let (cold, warm, exec) = (1000.0, 100.0, 300.0);
    let (cj, wj, ej) = (0.1, 0.4, 0.05);
    let c = one_zone(
        "max_instances: 1, keep_alive_seconds: 100",
        &format!(
            "cold_start_ms: {cold}, warm_start_ms: {warm}, cold_start_jitter: {cj}, \
             warm_start_jitter: {wj}, exec_jitter: {ej}"
        ),
    );
    // One cold call, then 30 warm ones 10 s apart (each ends long before the next).
    let trace: String = (0..31).map(|i| format!("{}.0 0\n", i * 10)).collect();
    let trace = events(&trace);
    let p = SimParams::from_config(&c).unwrap();
    let go = |seed| run_policy(&p, &trace, PolicyKind::Faas, seed, false, &mut |_| {});
    let a = go(7);
    let rt = a.report.platform_response_ms.clone().unwrap();
    let warm_lo = warm * (1.0 - wj) + exec * (1.0 - ej);
    let cold_hi = cold * (1.0 + cj) + exec * (1.0 + ej);
    assert!(
        rt.min >= warm_lo - 1e-6 && rt.max <= cold_hi + 1e-6,
        "{rt:?}"
    );
    assert!(
        rt.max >= cold * (1.0 - cj) + exec * (1.0 - ej),
        "the cold call: {rt:?}"
    );
    // 30 warm calls: a spread far above the fixed 400 ms without jitter.
    let warm_hi = warm * (1.0 + wj) + exec * (1.0 + ej);
    assert!(rt.min < warm + exec && warm + exec < warm_hi, "{rt:?}");
    assert_eq!(a.report.cold_starts, 1);
    let json = |r: &PolicyRun| serde_json::to_string(&r.report).unwrap();
    assert_eq!(json(&a), json(&go(7)), "same seed, same report");
    assert_ne!(
        a.report.platform_response_ms.as_ref().unwrap().mean,
        go(8).report.platform_response_ms.unwrap().mean
    );
}

/// The `--sweep` summary has one row per value and placement, the value in the first
/// column under PATH: keep-alive 0 vs 100 s on two calls 10 s apart from no edge (one
/// cloud zone): every call cold at 0, the second warm at 100 s.
#[test]
fn the_sweep_summary_has_one_row_per_value_and_a_column_for_the_path() {
    let path = "function_zones[*].keep_alive_seconds";
    let trace = events("0.0 0\n10.0 0\n");
    let reports: Vec<(String, spillway::sim::report::SimReport)> = ["0", "100"]
        .iter()
        .map(|v| {
            let c = one_zone(
                "max_instances: 2, keep_alive_seconds: 1",
                "cold_start_ms: 700, warm_start_ms: 0",
            );
            let c = spillway::config::with_override(&c, path, v).unwrap();
            let (r, _) =
                spillway::sim::simulate(&c, &trace, &[PolicyKind::Faas], 1, false, &mut |_, _| {})
                    .unwrap();
            (v.to_string(), r)
        })
        .collect();
    let rows: Vec<(String, &spillway::sim::report::SimReport)> =
        reports.iter().map(|(v, r)| (v.clone(), r)).collect();
    let text = spillway::sim::report::sweep_table(path, &rows);
    let lines: Vec<Vec<&str>> = text
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(lines[0][..3], [path, "policy", "cold"], "{text}");
    assert_eq!(lines.len(), 1 + 2, "{text}");
    // value, policy, cold starts, mean platform ms (cold 1000 ms; cold + warm 650 ms).
    assert_eq!(lines[1][..4], ["0", "faas", "2", "1000.0"], "{text}");
    assert_eq!(lines[2][..4], ["100", "faas", "1", "650.0"], "{text}");
}

/// An `events` trace: 200 s of 20 req/s, `gap` idle seconds, 200 s of 20 req/s again.
fn burst_gap_burst(gap: u64) -> Trace {
    let mut text = String::new();
    for start in [0, 200 + gap] {
        for i in 0..4000u64 {
            text.push_str(&format!("{}\n", start as f64 + i as f64 / 20.0));
        }
    }
    let opts = TraceOptions {
        format: spillway::sim::trace::TraceFormat::Events,
        ..TraceOptions::default()
    };
    Trace::parse(&text, Path::new("gap.txt"), &opts).unwrap()
}

/// Idle stretches are closed in bulk (the monitor closes N empty epochs at
/// once once the policy settled) with the results of closing every epoch.
///
/// Expectation: once a policy has settled in the gap (decisions repeat, idle function
/// instances expired — well within 20,000 s), every further idle second changes nothing
/// but the bill of the VMs it keeps, k VMs × $0.10/h; the second burst meets the same
/// state (settled EWMAs, same decision phase: every gap is a multiple of K = 50). So the
/// cost is linear in the gap: the stepped runs at 20,000 and 40,000 s give the slope
/// (k·0.10/3600 per second, k a whole number of VMs: MAX's fleet of ⌈20/16⌉ = 2, AUTO's
/// `min_vms` 1, FAAS none), and the 10⁷-second gap must cost
/// cost(20,000) + (10⁷ − 20,000)·slope, with the same requests, violations and cold
/// starts — while stepping through at most a few thousand of its 10⁷ epochs.
#[test]
fn a_ten_million_second_gap_costs_what_the_stepped_runs_extrapolate() {
    let c = config(50, 16.0, BASE_SIM);
    let skipping = SimParams::from_config(&c).unwrap();
    let stepping = SimParams {
        skip_idle: false,
        ..skipping.clone()
    };
    let (g1, g2, g3) = (20_000u64, 40_000u64, 10_000_000u64);
    let (t1, t2, t3) = (
        burst_gap_burst(g1),
        burst_gap_burst(g2),
        burst_gap_burst(g3),
    );
    for kind in PolicyKind::ALL {
        let go = |p: &SimParams, t: &Trace| run_policy(p, t, kind, 1, false, &mut |_| {});
        let s1 = go(&stepping, &t1);
        let s2 = go(&stepping, &t2);
        // Bulk closing gives the stepped results exactly.
        let k1 = go(&skipping, &t1);
        assert_eq!(k1.report, s1.report, "{kind:?}");
        assert_eq!(
            spillway::sim::engine::RunStats {
                epochs_skipped: 0,
                ..k1.stats.clone()
            },
            s1.stats,
            "{kind:?}"
        );
        assert_eq!(s1.stats.epochs_skipped, 0);
        assert!(
            k1.stats.epochs_skipped > g1 * 9 / 10,
            "{kind:?}: {:?}",
            k1.stats
        );
        let slope = (s2.report.cost_usd.total - s1.report.cost_usd.total) / (g2 - g1) as f64;
        let idle_vms = slope * 3600.0 / 0.10;
        assert!(
            (idle_vms - idle_vms.round()).abs() < 1e-6,
            "{kind:?}: {idle_vms} VMs"
        );
        match kind {
            PolicyKind::Max => assert_eq!(idle_vms.round(), 2.0),
            PolicyKind::Auto | PolicyKind::Spock => assert_eq!(idle_vms.round(), 1.0),
            PolicyKind::Faas => assert_eq!(idle_vms.round(), 0.0),
            PolicyKind::Libra => {}
        }
        let big = go(&skipping, &t3);
        let expected = s1.report.cost_usd.total + (g3 - g1) as f64 * slope;
        assert!(
            (big.report.cost_usd.total - expected).abs() <= 1e-9 * expected.max(1.0),
            "{kind:?}: {} vs {expected}",
            big.report.cost_usd.total
        );
        let r = &big.report;
        assert_eq!(
            (
                r.requests,
                r.served,
                r.sla_violations,
                r.delayed,
                r.cold_starts
            ),
            (
                s1.report.requests,
                s1.report.served,
                s1.report.sla_violations,
                s1.report.delayed,
                s1.report.cold_starts
            ),
            "{kind:?}"
        );
        assert!(
            big.stats.epochs_skipped > g3 - 10_000,
            "{kind:?}: {:?}",
            big.stats
        );
    }
}

/// Pre-warmed instances never expire, each of them: 2 pre-warmed, a zero keep-alive and
/// batches of 3 calls (just above the pre-warm count) at 0.5, 1.5, 2.5 and 3.5 s. Every
/// batch takes both pre-warmed instances warm and cold-starts a third, which expires the
/// moment its call ends; the pre-warmed ones, idle first, stay (FaaSim: they never cool
/// down).
#[test]
fn prewarmed_instances_never_expire_under_load_just_above_their_count() {
    let c = one_zone(
        "max_instances: 10, prewarmed_instances: 2, keep_alive_seconds: 0",
        "cold_start_ms: 100, warm_start_ms: 20",
    );
    let batch =
        "0.5 0\n0.5 0\n0.5 0\n1.5 0\n1.5 0\n1.5 0\n2.5 0\n2.5 0\n2.5 0\n3.5 0\n3.5 0\n3.5 0\n";
    let r = run(&c, &events(batch), PolicyKind::Faas);
    let z = &r.report.zones[0];
    assert_eq!((z.cold_starts, z.warm_starts), (4, 8), "{z:?}");
    let (pre, cold): (Vec<_>, Vec<_>) = z.instances.iter().partition(|i| i.prewarmed);
    assert_eq!(pre.len(), 2);
    for i in &pre {
        assert_eq!(i.stopped_s, None, "a pre-warmed instance expired: {i:?}");
        assert_eq!((i.warm_starts, i.cold_starts), (4, 0), "{i:?}");
    }
    assert_eq!(cold.len(), 4);
    assert!(cold.iter().all(|i| i.cold_starts == 1));
    // Each expired when its call ended; the last one's call ends the run.
    for i in &cold[..3] {
        assert!(
            i.stopped_s.is_some(),
            "a cold-started instance expires: {i:?}"
        );
    }
}

/// `warm_instance_order`: two instances go idle at 1.0 and 1.2 s (calls at 0.4 and
/// 0.6 s); one call at 5 s reuses the newest idle (the 0.6 s one) or the oldest (the 0.4
/// s one), and with a 10 s keep-alive the other one is the one that expires first.
#[test]
fn the_warm_instance_order_setting_picks_the_newest_or_oldest_idle_instance() {
    for (order, reused_serial) in [("newest", 1usize), ("oldest", 0)] {
        let c = one_zone(
            &format!("max_instances: 10, keep_alive_seconds: 10, warm_instance_order: {order}"),
            "cold_start_ms: 300, warm_start_ms: 20",
        );
        let r = run(&c, &events("0.4 0\n0.6 0\n5 0\n"), PolicyKind::Faas);
        let z = &r.report.zones[0];
        assert_eq!((z.cold_starts, z.warm_starts), (2, 1), "{order}");
        assert_eq!(z.instances[reused_serial].warm_starts, 1, "{order}: {z:?}");
        assert_eq!(z.instances[1 - reused_serial].warm_starts, 0, "{order}");
    }
}

/// An `events` trace spanning 2³³ s (past the 2³² s a `u32` epoch index reaches with 1 s
/// epochs): every policy finishes and serves both ends, with the idle stretch closed in
/// bulk.
#[test]
fn an_events_trace_spanning_two_to_the_33_seconds_runs_to_its_end() {
    let c = config(60, 16.0, BASE_SIM);
    let far = (1u64 << 33) as f64;
    let t = events(&format!("0.5 0\n0.5 0\n{far} 0\n"));
    assert_eq!(t.duration_s, far);
    let p = SimParams::from_config(&c).unwrap();
    for k in [
        PolicyKind::Libra,
        PolicyKind::Max,
        PolicyKind::Faas,
        PolicyKind::Auto,
        PolicyKind::Spock,
    ] {
        let r = run_policy(&p, &t, k, 1, false, &mut |_| {});
        assert_eq!((r.report.requests, r.report.served), (3, 3), "{k:?}");
        assert!(r.stats.end_s >= far, "{k:?}: ended at {}", r.stats.end_s);
    }
}
