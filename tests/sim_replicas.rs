//! `sim.replicas`: several gateway replicas sharing one decision through the
//! coordination store, in the simulator. One replica is the single gateway's report
//! byte for byte; three replicas on an instant store cost about what one gateway does;
//! an outage freezes the pool; a store delay delays the leader's decision; an uneven
//! split still shares the budget by traffic; the section is checked with its field path
//! and place in the file.

use std::path::Path;

use spillway::config::Config;
use spillway::sim::engine::{PolicyKind, PolicyRun, SimParams};
use spillway::sim::replicas::run_policy_with;
use spillway::sim::simulate;
use spillway::sim::trace::{Trace, TraceOptions};

/// LIBRA with K = 10 epochs of 1 s, r_max 16 req/s; VMs boot in `boot` seconds.
fn config(boot: u32, replicas: &str) -> Config {
    let yaml = format!(
        r#"
libra: {{epoch_seconds: 1, decision_epochs: 10, phi: 1.0, rho: 0.8, alpha: 0.2, beta: 0.2,
         r_max_rps: 16, min_vms: 0, max_vms: 100, max_outstanding_per_vm: 16}}
pricing: {{vm_hourly_usd: 0.10, function_memory_mb: 512, function_duration_ms: 1000}}
sim:
  sla_ms: 1000
  request: {{service_time: {{distribution: fixed, ms: 1000}}}}
  vm: {{slots: 16, boot_seconds: {boot}, billing: per_second, minimum_billed_seconds: 0, bill_boot: true}}
  function: {{cold_start_ms: 0, warm_start_ms: 0, keep_alive_seconds: 600, max_instances: 10000, bill_init: false}}
{replicas}
"#
    );
    Config::from_yaml(&yaml, "test.yaml").unwrap_or_else(|e| panic!("{e}"))
}

/// Requests per second: `(seconds, rps)` steps.
fn steps(parts: &[(usize, u32)]) -> Trace {
    let text: String = parts
        .iter()
        .flat_map(|&(secs, rps)| std::iter::repeat_n(format!("{rps}\n"), secs))
        .collect();
    Trace::parse(&text, Path::new("steps.txt"), &TraceOptions::default()).unwrap()
}

fn run(c: &Config, t: &Trace) -> PolicyRun {
    let p = SimParams::from_config(c).unwrap_or_else(|e| panic!("{e}"));
    run_policy_with(&p, t, PolicyKind::Libra, 1, Some(usize::MAX), &mut |_| {})
}

fn within(a: f64, b: f64, fraction: f64) -> bool {
    (a - b).abs() <= fraction * b.abs()
}

#[test]
fn one_replica_is_the_single_gateways_report_byte_for_byte() {
    let trace = steps(&[(300, 40), (300, 200), (300, 60)]);
    let report = |c: &Config| {
        let (r, runs) = simulate(c, &trace, &PolicyKind::ALL, 1, true, &mut |_, _| {}).unwrap();
        let series: Vec<String> = runs.iter().map(|r| format!("{:?}", r.series)).collect();
        (serde_json::to_string(&r).unwrap(), series)
    };
    let alone = report(&config(100, ""));
    let one = report(&config(
        100,
        "  replicas: {count: 1, store_delay_ms: 500, outages: [{from_seconds: 100, to_seconds: 400}]}",
    ));
    assert_eq!(alone, one);
}

#[test]
fn three_replicas_on_an_instant_store_cost_what_one_gateway_does() {
    let trace = steps(&[(600, 40), (600, 300), (600, 80)]);
    let one = run(&config(100, ""), &trace).report;
    let three = run(&config(100, "  replicas: {count: 3}"), &trace).report;
    assert_eq!(three.requests, one.requests);
    assert_eq!(three.served + three.throttled, three.requests);
    // The same pool (the leader bills two epochs more per scale-in: the followers'
    // handoff) and about the same spill share.
    assert!(
        within(three.cost_usd.vm, one.cost_usd.vm, 0.03),
        "VM cost: 3 replicas {} vs 1 gateway {}",
        three.cost_usd.vm,
        one.cost_usd.vm
    );
    assert!(
        within(three.cost_usd.total, one.cost_usd.total, 0.05),
        "total: 3 replicas {} vs 1 gateway {}",
        three.cost_usd.total,
        one.cost_usd.total
    );
    assert!(
        (three.function_share - one.function_share).abs() < 0.03,
        "spill share: 3 replicas {} vs 1 gateway {}",
        three.function_share,
        one.function_share
    );
}

/// The ready VMs of the rows ending in `(from, to]` seconds.
fn ready_in(run: &PolicyRun, from: f64, to: f64) -> Vec<u32> {
    run.series
        .iter()
        .filter(|r| r.time_s > from && r.time_s <= to)
        .map(|r| r.vms_ready)
        .collect()
}

#[test]
fn an_outage_freezes_the_pool_no_launch_and_no_terminate() {
    // VMs are ready at once, so the ready count moves only with a launch or a stop.
    let trace = steps(&[(100, 50), (200, 300), (200, 30), (100, 30)]);
    let free = run(&config(0, "  replicas: {count: 3}"), &trace);
    let cut = run(
        &config(
            0,
            "  replicas: {count: 3, outages: [{from_seconds: 110, to_seconds: 200}, {from_seconds: 310, to_seconds: 400}]}",
        ),
        &trace,
    );
    for (from, to) in [(110.0, 200.0), (310.0, 400.0)] {
        let moving = ready_in(&free, from, to);
        assert!(
            moving.iter().any(|&n| n != moving[0]),
            "without the outage the pool changes in ({from}, {to}]: {moving:?}"
        );
        let frozen = ready_in(&cut, from, to);
        assert!(
            frozen.iter().all(|&n| n == frozen[0]),
            "the pool moved during the outage ({from}, {to}]: {frozen:?}"
        );
    }
    // Back on the store, the leader scales again: up after the first outage, down
    // after the second.
    let during = ready_in(&cut, 190.0, 200.0)[0];
    assert!(ready_in(&cut, 200.0, 300.0).iter().any(|&n| n > during));
    let during = ready_in(&cut, 390.0, 400.0)[0];
    assert!(ready_in(&cut, 400.0, 600.0).iter().any(|&n| n < during));
    // The frozen pool spills the rise to functions.
    assert!(cut.report.cost_usd.function > free.report.cost_usd.function);
    assert_eq!(cut.report.requests, free.report.requests);
}

#[test]
fn an_uneven_split_shares_the_budget_by_traffic() {
    let trace = steps(&[(600, 40), (600, 300), (600, 80)]);
    let one = run(&config(100, ""), &trace).report;
    let uneven = run(
        &config(100, "  replicas: {count: 3, split: [0.7, 0.2, 0.1]}"),
        &trace,
    )
    .report;
    assert_eq!(uneven.requests, one.requests);
    assert!(
        within(uneven.cost_usd.vm, one.cost_usd.vm, 0.03),
        "VM cost: 70/20/10 {} vs 1 gateway {}",
        uneven.cost_usd.vm,
        one.cost_usd.vm
    );
    assert!(
        (uneven.function_share - one.function_share).abs() < 0.03,
        "spill share: 70/20/10 {} vs 1 gateway {}",
        uneven.function_share,
        one.function_share
    );
}

fn error(replicas: &str) -> String {
    let yaml = format!("sim:\n  replicas: {replicas}\n");
    match Config::from_yaml(&yaml, "test.yaml") {
        Ok(_) => panic!("{replicas} was accepted"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn the_section_is_checked_at_its_field_and_place() {
    let e = error("{count: 0}");
    assert!(
        e.contains("test.yaml:2:") && e.contains("sim.replicas.count"),
        "{e}"
    );
    let e = error("{count: 2, store_delay_ms: -1}");
    assert!(e.contains("sim.replicas.store_delay_ms"), "{e}");
    let e = error(
        "{count: 2, outages: [{from_seconds: 50, to_seconds: 60}, {from_seconds: 55, to_seconds: 70}]}",
    );
    assert!(
        e.contains("test.yaml:2:") && e.contains("sim.replicas.outages[1].from_seconds"),
        "{e}"
    );
    let e = error("{count: 2, outages: [{from_seconds: 60, to_seconds: 60}]}");
    assert!(e.contains("sim.replicas.outages[0].to_seconds"), "{e}");
    let e = error("{count: 3, split: [1, 2]}");
    assert!(e.contains("sim.replicas.split"), "{e}");
    let e = error("{count: 2, split: [1, 0]}");
    assert!(e.contains("sim.replicas.split[1]"), "{e}");
}

/// End of the first epoch whose row shows a ready VM, s.
fn first_ready_s(run: &PolicyRun) -> f64 {
    run.series
        .iter()
        .find(|r| r.vms_ready > 0)
        .map_or(f64::INFINITY, |r| r.time_s)
}

#[test]
fn a_store_delay_makes_the_leaders_decision_that_much_later() {
    // VMs are ready at once: the first row with a VM is the one after the decision.
    let trace = steps(&[(120, 100)]);
    let instant = run(&config(0, "  replicas: {count: 3}"), &trace);
    let slow = run(
        &config(0, "  replicas: {count: 3, store_delay_ms: 600}"),
        &trace,
    );
    let alone = run(&config(0, ""), &trace);
    // The leader sums an epoch half an epoch after it ended: with an instant store its
    // first VM is ready within the same epoch as one gateway's; 600 ms more (past the
    // next epoch's end) shows it one epoch later.
    assert_eq!(first_ready_s(&instant), first_ready_s(&alone));
    assert!(first_ready_s(&alone).is_finite());
    assert_eq!(first_ready_s(&slow), first_ready_s(&instant) + 1.0);
}
