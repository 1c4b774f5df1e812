//! Tests written against missed mutants of src/policy/placement.rs
//! (`Placement::is_claimed_booting`, `Placement::is_starting`) and src/policy/scaling.rs
//! (the default `ScalingPolicy::set_libra_params`, `LibraScaler::idle_outlook` before
//! the first request).

use std::time::Duration;

use spillway_policy::Time;
use spillway_policy::baselines::FixedScaler;
use spillway_policy::functions::{FunctionPoolParams, WarmOrder};
use spillway_policy::placement::{
    Placement, PlacementParams, PlacementPolicy, Start, ZoneCapacity, ZoneId, ZoneKind, ZoneParams,
    ZoneSet,
};
use spillway_policy::scaling::{
    IdleOutlook, IdleView, LibraScaler, LibraScalingParams, PoolSnapshot, ScaleReason,
    ScalingPolicy,
};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

const EDGE: ZoneId = ZoneId(0);
const LAMBDA: ZoneId = ZoneId(1);

/// An edge pool (3 instances, 2 pre-warmed, 2.5 s keep-alive) and a concurrency-only
/// zone (no visible instances, so no instance of it is ever booting).
fn pool_and_lambda() -> Placement {
    Placement::new(PlacementParams {
        zones: vec![
            ZoneParams {
                name: "edge".into(),
                kind: ZoneKind::Edge,
                capacity: ZoneCapacity::Instances(FunctionPoolParams {
                    keep_alive: ms(2_500),
                    max_instances: Some(3),
                    prewarmed: 2,
                    warm_order: WarmOrder::Newest,
                }),
            },
            ZoneParams {
                name: "lambda".into(),
                kind: ZoneKind::Edge,
                capacity: ZoneCapacity::Concurrency {
                    max_concurrency: Some(4),
                },
            },
        ],
        policy: PlacementPolicy::EdgeFirst,
    })
}

/// What the driver asks before waiting for a boot (a call on a claimed pre-warm waits
/// for its `on_started`, not a cold start): pre-warms are starting and unclaimed, a
/// claimed one is a claimed boot, a cold start is starting but no claimed pre-warm, and
/// once started none of them is booting. A zone without instances never has one.
#[test]
fn booting_state_follows_prewarm_claim_cold_start_and_start() {
    let mut p = pool_and_lambda();
    let t0 = Time::ZERO;
    let pre = p.prewarm(t0);
    assert_eq!(pre.len(), 2, "two pre-warmed instances launched");
    for &(zone, id) in &pre {
        assert_eq!(zone, EDGE);
        assert!(p.is_starting(EDGE, id), "pre-warm {id:?} is booting");
        assert!(
            !p.is_claimed_booting(EDGE, id),
            "no call claimed pre-warm {id:?} yet"
        );
        // The same id in a zone that is not a pool: nothing boots there.
        assert!(!p.is_starting(LAMBDA, id));
        assert!(!p.is_claimed_booting(LAMBDA, id));
        // A zone that does not exist.
        assert!(!p.is_starting(ZoneId(7), id));
        assert!(!p.is_claimed_booting(ZoneId(7), id));
    }

    // A call placed while both pre-warms boot claims one of them.
    let first = p
        .place(t0 + ms(100), Some(EDGE), ZoneSet::default())
        .expect("the edge pool has room");
    assert_eq!(first.zone, EDGE);
    let Start::Booting(claimed) = first.start else {
        panic!("expected a claimed pre-warm, got {:?}", first.start)
    };
    assert!(pre.iter().any(|&(_, id)| id == claimed));
    let unclaimed = pre
        .iter()
        .map(|&(_, id)| id)
        .find(|&id| id != claimed)
        .unwrap();
    assert!(p.is_claimed_booting(EDGE, claimed));
    assert!(p.is_starting(EDGE, claimed));
    assert!(!p.is_claimed_booting(EDGE, unclaimed));
    assert!(!p.is_claimed_booting(LAMBDA, claimed));

    // The other pre-warm is claimed by the next call; the third call cold-starts.
    let second = p
        .place(t0 + ms(200), Some(EDGE), ZoneSet::default())
        .unwrap();
    assert_eq!(second.start, Start::Booting(unclaimed));
    let third = p
        .place(t0 + ms(300), Some(EDGE), ZoneSet::default())
        .unwrap();
    let Start::Cold(cold) = third.start else {
        panic!("expected a cold start, got {:?}", third.start)
    };
    assert_eq!(third.zone, EDGE);
    assert!(p.is_starting(EDGE, cold), "a cold start is booting");
    assert!(
        !p.is_claimed_booting(EDGE, cold),
        "a cold start is not a claimed pre-warm"
    );

    // Started: nothing boots any more.
    for id in [claimed, unclaimed, cold] {
        p.on_started(t0 + ms(900), EDGE, id);
        assert!(!p.is_starting(EDGE, id), "{id:?} started");
        assert!(!p.is_claimed_booting(EDGE, id), "{id:?} started");
    }
}

/// A configuration reload tells the operator whether the new LIBRA
/// parameters took effect: a baseline (MAX) has none, so the default answer is `false`
/// and its pool stays as it was.
#[test]
fn a_baseline_scaler_refuses_libra_params() {
    let mut s: Box<dyn ScalingPolicy> = Box::new(FixedScaler::max(3));
    let before = s.initial();
    let params = LibraScalingParams {
        phi: 1.7,
        r_max_rps: 12.5,
        min_vms: 2,
        max_vms: 9,
        cip_rps: 4.2,
    };
    assert!(!s.set_libra_params(&params));
    assert_eq!(s.libra_params(), None);
    assert_eq!(s.initial(), before);
}

fn libra() -> LibraScalingParams {
    LibraScalingParams {
        phi: 1.5,
        r_max_rps: 12.0,
        min_vms: 2,
        max_vms: 7,
        cip_rps: 3.3,
    }
}

/// An idle stretch with avg above the CIP that has not settled: only the no-traffic
/// rule can settle it.
fn idle_view(avg_rps: f64, std_rps: f64) -> IdleView {
    IdleView {
        first_end: Time::from_secs(6),
        avg_rps,
        std_rps,
        traffic_settled: false,
        vm_utilisation: None,
        pool: PoolSnapshot {
            booting: 0,
            ready: 2,
            draining: 0,
            target: 2,
        },
    }
}

/// A freshly started gateway (no request yet) skips its idle epochs at once, keeping
/// its `min_vms` VMs with budget `min_vms · r_max` (the awaiting-traffic decision the
/// simulator reports); after traffic, an unsettled idle stretch above the CIP must be
/// closed epoch by epoch.
#[test]
fn idle_outlook_awaits_traffic_only_before_the_first_request() {
    let params = libra();
    let view = idle_view(20.0, 6.0);
    assert!(view.avg_rps >= params.cip_rps);
    let mut s = LibraScaler::new(params.clone());
    let IdleOutlook::Settled(Some(d)) = s.idle_outlook(&view) else {
        panic!("a fresh scaler's idle stretch is settled")
    };
    assert_eq!(d.reason, ScaleReason::AwaitingTraffic);
    assert_eq!(d.target_vms, params.min_vms);
    assert_eq!(d.vm_reqs_rps, f64::from(params.min_vms) * params.r_max_rps);

    // One request seen (an epoch between reports): Alg. 1 applies from now on.
    let obs = spillway_policy::scaling::EpochObservation {
        traffic: spillway_policy::monitor::EpochClosed {
            epoch: 0,
            requests: 1,
            avg_rps: 20.0,
            std_rps: 6.0,
            report: None,
        },
        epoch: Duration::from_secs(1),
        vm_requests: 1,
        function_requests: 0,
        vm_utilisation: None,
        pool: view.pool,
    };
    assert_eq!(s.on_epoch(Time::from_secs(1), &obs), None);
    assert_eq!(s.idle_outlook(&view), IdleOutlook::Unsettled);
}
