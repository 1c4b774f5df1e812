//! Criterion benchmark of one function placement decision and its completion (goal:
//! ≤ 100 ns with 6 zones × 100 instances): `Placement::place` for a call from an
//! edge zone, then `Placement::release`, under edge-first and warm-first. Every zone
//! holds 100 idle pre-warmed instances, so each call is a warm start that keeps the
//! state steady; one call in ten comes from no edge zone (the cloud).

// `criterion_group!` defines an undocumented `pub fn`; a bench is not an API.
#![allow(missing_docs)]

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use spillway::policy::functions::{FunctionPoolParams, WarmOrder};
use spillway::policy::placement::{
    Placement, PlacementParams, PlacementPolicy, ZoneCapacity, ZoneId, ZoneKind, ZoneParams,
    ZoneSet,
};

fn placement(policy: PlacementPolicy) -> Placement {
    let zone = |i: usize| ZoneParams {
        name: if i < 5 {
            format!("edge-{i}")
        } else {
            "cloud".into()
        },
        kind: if i < 5 {
            ZoneKind::Edge
        } else {
            ZoneKind::Cloud
        },
        capacity: ZoneCapacity::Instances(FunctionPoolParams {
            keep_alive: Duration::from_secs(30),
            max_instances: Some(100),
            prewarmed: 100,
            warm_order: WarmOrder::Newest,
        }),
    };
    let mut p = Placement::new(PlacementParams {
        zones: (0..6).map(zone).collect(),
        policy,
    });
    for (z, i) in p.prewarm(Duration::ZERO) {
        p.on_started(Duration::ZERO, z, i);
    }
    p
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("placement");
    g.throughput(Throughput::Elements(1));
    for policy in [PlacementPolicy::EdgeFirst, PlacementPolicy::WarmFirst] {
        let mut p = placement(policy);
        let mut t = Duration::ZERO;
        let mut n = 0u32;
        g.bench_function(
            format!("place_and_release_6x100_{}", policy.as_str()),
            |b| {
                b.iter(|| {
                    n = n.wrapping_add(1);
                    t += Duration::from_micros(1);
                    let origin = (n % 10 != 9).then_some(ZoneId((n % 5) as u16));
                    let lease = p
                        .place(t, black_box(origin), ZoneSet::default())
                        .expect("a warm instance");
                    p.release(t, black_box(lease));
                })
            },
        );
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
