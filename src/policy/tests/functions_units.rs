//! Tests written against missed mutants of src/policy/functions.rs — one zone's
//! function instances (FaaSim §3). Each test drives `FunctionPool` through its public API
//! and asserts what the simulator's per-instance report or the gateway's driver sees: the
//! per-instance warm-start count, whether an instance is still booting or booting for a
//! claimed call, the busy time of an instance that crashed mid-call, and which booting
//! pre-warmed instance a call that finds no warm one takes after claims, boots and
//! failures.

use std::time::Duration;

use spillway_policy::functions::{
    Acquire, FunctionPool, FunctionPoolParams, InstanceId, WarmOrder,
};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn pool(keep_alive_ms: u64, max_instances: Option<u32>, prewarmed: u32) -> FunctionPool {
    FunctionPool::new(FunctionPoolParams {
        keep_alive: ms(keep_alive_ms),
        max_instances,
        prewarmed,
        warm_order: WarmOrder::Newest,
    })
}

/// The simulator's per-instance report: an instance that served one cold call and then
/// two warm ones shows 1 cold start and 2 warm starts (and its idle time between calls).
#[test]
fn the_instance_record_counts_each_warm_start() {
    let mut p = pool(5_000, None, 0);
    let Acquire::Cold(a) = p.acquire(ms(0)) else {
        panic!("an empty pool cold-starts")
    };
    let (ready, done1, call2, done2, call3) = (300, 700, 1_100, 1_500, 2_600);
    p.on_started(ms(ready), a);
    p.release(ms(done1), a);
    assert_eq!(p.acquire(ms(call2)), Acquire::Warm(a));
    p.release(ms(done2), a);
    assert_eq!(p.acquire(ms(call3)), Acquire::Warm(a));
    let recs = p.instances();
    assert_eq!(recs.len(), 1);
    let r = recs[0];
    assert_eq!(r.id, a);
    assert_eq!((r.cold_starts, r.warm_starts), (1, 2));
    assert_eq!(r.idle, ms((call2 - done1) + (call3 - done2)));
    assert_eq!(r.warm_starts, p.usage().warm_starts);
}

/// What the driver branches on while an instance boots: a cold start and a pre-warm are
/// starting until reported ready; only the pre-warm a call took is "claimed booting",
/// and neither is after it is ready.
#[test]
fn starting_and_claimed_booting_are_reported_until_ready() {
    let mut p = pool(4_000, None, 1);
    let pre = p.prewarm(ms(0));
    assert_eq!(pre.len(), 1);
    assert!(p.is_starting(pre[0]), "a pre-warm boots");
    assert!(!p.is_claimed_booting(pre[0]), "no call took it yet");

    // No warm instance: the call takes the booting pre-warm.
    assert_eq!(p.acquire(ms(150)), Acquire::Booting(pre[0]));
    assert!(p.is_starting(pre[0]));
    assert!(p.is_claimed_booting(pre[0]), "a call waits for this boot");

    // The next call cold-starts a new instance: starting, but claimed by no pre-warm wait.
    let Acquire::Cold(c) = p.acquire(ms(200)) else {
        panic!("no idle and no unclaimed booting instance: cold start")
    };
    assert_ne!(c, pre[0]);
    assert!(p.is_starting(c), "a cold start boots");
    assert!(
        !p.is_claimed_booting(c),
        "a cold start is not a claimed pre-warm"
    );

    p.on_started(ms(900), pre[0]);
    assert!(!p.is_starting(pre[0]), "ready");
    assert!(
        !p.is_claimed_booting(pre[0]),
        "ready and busy with its call"
    );
    assert_eq!(p.busy(), 1);
    p.on_started(ms(1_250), c);
    assert!(!p.is_starting(c));
    assert_eq!(p.busy(), 2);
    assert_eq!(
        p.usage().startup,
        ms(1_250 - 200),
        "only the cold start's boot"
    );
    // An id never handed out is neither.
    assert!(!p.is_starting(InstanceId(7)));
    assert!(!p.is_claimed_booting(InstanceId(7)));
}

/// FaaSim's usage time: an instance that crashes while serving a call is billed for its
/// busy time up to the crash, in the pool's totals and in its own (stopped) record.
#[test]
fn an_instance_failing_mid_call_counts_its_busy_time() {
    let mut p = pool(3_000, None, 0);
    p.keep_history();
    let Acquire::Cold(a) = p.acquire(ms(100)) else {
        panic!("an empty pool cold-starts")
    };
    let (ready, crash) = (350, 1_220);
    p.on_started(ms(ready), a);
    p.on_failed(ms(crash), a);
    assert_eq!(p.alive(), 0);
    assert_eq!(p.busy(), 0);
    assert_eq!(p.usage().busy, ms(crash - ready));
    let recs = p.instances();
    assert_eq!(recs.len(), 1);
    assert_eq!(recs[0].busy, ms(crash - ready));
    assert_eq!(recs[0].startup, ms(ready - 100));
    assert_eq!(recs[0].stopped_at, Some(ms(crash)));
    // The failure of a busy instance is no expiry, and the next call cold-starts.
    assert_eq!(p.usage().instances_expired, 0);
    assert!(matches!(p.acquire(ms(1_500)), Acquire::Cold(_)));
}

/// Calls that find no warm instance take the booting pre-warms one after another, the
/// earliest started first, and cold-start only when every pre-warm is claimed.
#[test]
fn successive_calls_claim_each_booting_prewarm_then_cold_start() {
    let mut p = pool(2_000, None, 2);
    let pre = p.prewarm(ms(0));
    assert_eq!(pre.len(), 2);
    assert_eq!(p.acquire(ms(100)), Acquire::Booting(pre[0]));
    assert_eq!(p.acquire(ms(180)), Acquire::Booting(pre[1]));
    let Acquire::Cold(c) = p.acquire(ms(260)) else {
        panic!("both pre-warms are claimed: cold start")
    };
    assert!(!pre.contains(&c));
    let u = p.usage();
    assert_eq!(
        (
            u.prewarm_waits,
            u.warm_starts,
            u.cold_starts,
            u.instances_started
        ),
        (2, 2, 1, 3)
    );
    // A call that gives up leaves its pre-warm to the next call.
    p.release(ms(300), pre[1]);
    assert!(!p.is_claimed_booting(pre[1]));
    assert_eq!(p.acquire(ms(340)), Acquire::Booting(pre[1]));
}

/// A pre-warm that booted unclaimed is idle: the first call takes it warm, the next one
/// (no idle, nothing booting) cold-starts — it does not wait for a boot that is over.
#[test]
fn a_prewarm_that_booted_unclaimed_is_not_waited_for() {
    let mut p = pool(2_000, None, 1);
    let pre = p.prewarm(ms(0));
    p.on_started(ms(450), pre[0]);
    assert_eq!(p.acquire(ms(600)), Acquire::Warm(pre[0]));
    let Acquire::Cold(c) = p.acquire(ms(650)) else {
        panic!("the pre-warm is busy and nothing boots: cold start")
    };
    assert_ne!(c, pre[0]);
    assert_eq!(p.usage().prewarm_waits, 0);
    assert_eq!((p.usage().warm_starts, p.usage().cold_starts), (1, 1));
}

/// A pre-warm that failed while booting is gone: the next call takes the other booting
/// pre-warm, and the one after that cold-starts.
#[test]
fn a_prewarm_failing_while_booting_is_not_claimed() {
    let mut p = pool(2_000, None, 2);
    let pre = p.prewarm(ms(0));
    p.on_failed(ms(300), pre[0]);
    assert_eq!(p.alive(), 1);
    assert_eq!(p.starting(), 1);
    assert!(!p.is_starting(pre[0]));
    assert_eq!(p.acquire(ms(400)), Acquire::Booting(pre[1]));
    assert!(matches!(p.acquire(ms(420)), Acquire::Cold(_)));
    assert_eq!(p.usage().prewarm_waits, 1);
}

/// An idle (warm) instance that crashes is gone: it is no longer idle or alive, its idle
/// time so far is its record's, and the next call cold-starts rather than being handed
/// the dead instance as a warm start.
#[test]
fn an_idle_instance_that_fails_is_not_reused() {
    let mut p = pool(6_000, None, 0);
    p.keep_history();
    let Acquire::Cold(a) = p.acquire(ms(0)) else {
        panic!("an empty pool cold-starts")
    };
    let (ready, done, crash) = (200, 900, 1_700);
    p.on_started(ms(ready), a);
    p.release(ms(done), a);
    assert_eq!(p.idle(), 1);
    p.on_failed(ms(crash), a);
    assert_eq!((p.alive(), p.idle(), p.busy()), (0, 0, 0));
    assert_eq!(p.poll_timeout(), None, "nothing idle is left to expire");
    let Acquire::Cold(b) = p.acquire(ms(2_000)) else {
        panic!("the failed instance is not warm")
    };
    assert_eq!(b, a, "its id is free again");
    assert_eq!((p.usage().cold_starts, p.usage().warm_starts), (2, 0));
    let recs = p.instances();
    assert_eq!(recs.len(), 2);
    assert_eq!(recs[0].busy, ms(done - ready));
    assert_eq!(recs[0].stopped_at, Some(ms(crash)));
    assert_eq!(recs[1].serial, recs[0].serial + 1);
}
