//! Simulator throughput: simulated requests per second, per policy (goal:
//! ≥ 3 M requests/s per policy on a 2-core machine, release build).
//!
//! `cargo bench --bench sim` replays `traces/wits_per_second.txt` (45,000 s, 6,432,107
//! requests; `scripts/fetch-traces.sh` puts it there) with `config/sim/libra-paper.yaml`,
//! else a synthetic WITS-like trace of the same shape (and says so).

// `criterion_group!` defines an undocumented `pub fn`; a bench is not an API.
#![allow(missing_docs)]

use std::path::Path;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use spillway::config::Config;
use spillway::sim::engine::{PolicyKind, SimParams, run_policy};
use spillway::sim::simulate;
use spillway::sim::trace::{Trace, TraceOptions};

fn trace() -> Trace {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let wits = root.join("traces/wits_per_second.txt");
    if wits.exists() {
        return Trace::load(&wits, &TraceOptions::default()).expect("WITS parses");
    }
    eprintln!(
        "{} is missing (scripts/fetch-traces.sh fetches it): using a synthetic WITS-like trace",
        wits.display()
    );
    // 45,000 s around 143 req/s with slow waves and bursts (deterministic).
    let text: String = (0..45_000u64)
        .map(|s| {
            let wave = 143.0 + 90.0 * ((s as f64) / 3000.0).sin();
            let burst = if s % 997 < 20 { 400.0 } else { 0.0 };
            format!("{}\n", (wave + burst) as u64)
        })
        .collect();
    Trace::parse(&text, Path::new("synthetic"), &TraceOptions::default()).expect("parses")
}

fn bench(c: &mut Criterion) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = Config::load(&root.join("config/sim/libra-paper.yaml")).expect("preset loads");
    let params = SimParams::from_config(&config).expect("models build");
    let trace = trace();
    let mut g = c.benchmark_group("sim");
    g.throughput(Throughput::Elements(trace.total_requests()));
    g.sample_size(10);
    g.measurement_time(Duration::from_secs(8));
    g.warm_up_time(Duration::from_secs(1));
    for kind in PolicyKind::ALL {
        g.bench_function(kind.name(), |b| {
            b.iter(|| run_policy(&params, &trace, kind, 1, false, &mut |_| {}))
        });
    }
    g.finish();
    // What `spillway sim --policy all` does: the five policies, one per core
    // (goal: full WITS in ≤ 2 s wall on 2 cores). Throughput counts every policy's
    // requests.
    let mut g = c.benchmark_group("sim_all");
    g.throughput(Throughput::Elements(
        trace.total_requests() * PolicyKind::ALL.len() as u64,
    ));
    g.sample_size(10);
    g.measurement_time(Duration::from_secs(15));
    g.warm_up_time(Duration::from_secs(1));
    g.bench_function("five_policies_parallel", |b| {
        b.iter(|| simulate(&config, &trace, &PolicyKind::ALL, 1, false, &mut |_, _| {}))
    });
    g.finish();
}

/// FaaSim's burst pattern from the seeded generator (`sim::faasim::burst`, whose
/// shape a test checks against FaaSim's original file). Events format; parsing is outside
/// the measurement.
fn burst_trace() -> Trace {
    let opts = TraceOptions {
        format: spillway::sim::trace::TraceFormat::Events,
        ..TraceOptions::default()
    };
    let text = spillway::sim::faasim::events_text(&spillway::sim::faasim::burst(1));
    Trace::parse(&text, Path::new("synthetic-burst"), &opts).expect("parses")
}

/// The FaaSim preset (5 edge zones and the cloud) over the burst pattern, per placement.
fn bench_zones(c: &mut Criterion) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let base = std::fs::read_to_string(root.join("config/sim/faasim.yaml")).expect("preset");
    let trace = burst_trace();
    let mut g = c.benchmark_group("sim_zones");
    g.throughput(Throughput::Elements(trace.total_requests()));
    g.sample_size(20);
    g.measurement_time(Duration::from_secs(4));
    g.warm_up_time(Duration::from_secs(1));
    for placement in ["edge_first", "warm_first"] {
        let yaml = base.replace("placement: edge_first", &format!("placement: {placement}"));
        let config = Config::from_yaml(&yaml, "faasim.yaml").expect("preset loads");
        let params = SimParams::from_config(&config).expect("models build");
        g.bench_function(format!("faasim_burst_{placement}"), |b| {
            b.iter(|| run_policy(&params, &trace, PolicyKind::Faas, 1, false, &mut |_| {}))
        });
    }
    g.finish();
}

criterion_group!(benches, bench, bench_zones);
criterion_main!(benches);
