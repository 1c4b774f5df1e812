//! Several gateway replicas, one decision (`coordination: {type: redis}`): real
//! `spillway serve` processes on loopback coordinated through a `redis-server` the test
//! starts, a process pool of sample APIs, one shared sample API as the function tier.
//! 0.5 s epochs and decisions every 2 s keep each run to seconds (`common/replicas.rs`).
//!
//! The soak's length is `SPILLWAY_SOAK_SECONDS` (default 120 s in CI; the requirement's
//! full run is 600).
// Real processes on the real clock: deadlines and wall-clock epochs.
#![allow(clippy::disallowed_methods)]

mod common;
#[path = "common/replicas.rs"]
mod replicas;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use std::sync::Arc;

use common::{Gateway, SampleApi};
use replicas::{
    Background, EPOCH, RHO, Reaper, Redis, Sampler, Sent, cluster_vms, config, decisions, drive,
    drive_on_grid, epoch_origin, intent_terms, next_decision_cycle, percentile, role, term,
    try_status, unique_cluster, until, vm_children, wait_one_leader,
};
use serde_json::Value;

/// The replica tests run one at a time: each starts several gateways and a pool of VM
/// processes, and the timing assertions need the machine's cores.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> parking_lot::MutexGuard<'static, ()> {
    SERIAL.lock()
}

/// The lease of [`replicas::config`].
const LEASE: Duration = Duration::from_millis(1500);

/// A step load: 16 req/s, 48 req/s, 16 req/s.
fn step_load() -> Vec<(f64, f64)> {
    vec![(16.0, 6.0), (48.0, 8.0), (16.0, 6.0)]
}

/// A WITS-shaped slice (per-second counts ÷ 16: a swell and a fall with second-to-
/// second jitter), generated here: the real trace is never read by the tests.
fn wits_slice() -> Vec<(f64, f64)> {
    (0..16u32)
        .map(|s| {
            let swell = 28.0 + 14.0 * (f64::from(s) / 16.0 * std::f64::consts::TAU).sin();
            let jitter = f64::from((s * 7919) % 11) - 5.0;
            (swell + jitter, 1.0)
        })
        .collect()
}

/// What one run through some replicas showed.
struct Run {
    start: Instant,
    decisions: Vec<(Duration, u64)>,
    sent: Vec<Sent>,
    /// Largest `vm_reqs_rps` any leader showed in each wall-clock epoch.
    vm_reqs: BTreeMap<u64, f64>,
}

/// Wait until the deciding gateway (the leader, or the one gateway) shows a new scaling
/// decision; returns its admin address and the epoch that decision closed (in that
/// gateway's own epoch numbering).
fn next_decision(gws: &[&Gateway]) -> (SocketAddr, u64) {
    let deciding = |s: &Value| {
        s.pointer("/coordination/type").and_then(Value::as_str) != Some("redis")
            || role(s) == "leader"
    };
    let last = |gws: &[&Gateway]| {
        gws.iter().find_map(|g| {
            try_status(g.admin).filter(|s| deciding(s)).map(|s| {
                (
                    g.admin,
                    s.pointer("/scaling/last_decision/epoch")
                        .and_then(Value::as_u64),
                )
            })
        })
    };
    let before = last(gws).and_then(|(_, e)| e);
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Some((admin, Some(now))) = last(gws)
            && Some(now) != before
        {
            return (admin, now);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("no scaling decision within 10 s");
}

/// Where a run's load starts: on the epoch boundary at which the deciding gateway takes
/// its next decision but one or two (at least 1 s ahead). Every run meets the load
/// steps at the same phase of the epoch grid and of the K-epoch decision cycle: with
/// the load started at an arbitrary instant, one gateway alone moved its spill share
/// by 2 points between runs (22.8–24.8 %), up to K·E = 2 s of decision lag at a step.
fn load_start(gws: &[&Gateway]) -> Instant {
    let (admin, decided) = next_decision(gws);
    let origin = epoch_origin(admin).expect("the deciding gateway answers /status");
    next_decision_cycle(origin, decided, Duration::from_secs(1))
}

fn run(gws: &[&Gateway], weights: &[f64], load: &[(f64, f64)]) -> Run {
    let start = load_start(gws);
    let sampler = Sampler::start(gws.iter().map(|g| g.admin).collect());
    let targets: Vec<(SocketAddr, f64)> = gws
        .iter()
        .map(|g| g.proxy)
        .zip(weights.iter().copied())
        .collect();
    let sent = drive_on_grid(&targets, load, "/", start);
    let samples = sampler.finish();
    let mut vm_reqs = BTreeMap::new();
    for x in &samples {
        let s = &x.status;
        let shared = s.pointer("/coordination/type").and_then(Value::as_str) == Some("redis");
        if shared && role(s) != "leader" {
            continue;
        }
        let v = s
            .pointer("/scaling/vm_reqs_rps")
            .and_then(Value::as_f64)
            .unwrap_or(0.0);
        let e = vm_reqs.entry(x.epoch).or_insert(0.0_f64);
        *e = e.max(v);
    }
    Run {
        start,
        decisions: decisions(&samples)
            .into_iter()
            .filter(|(at, _, _)| *at >= start)
            .map(|(at, _, t)| (at - start, t))
            .collect(),
        sent,
        vm_reqs,
    }
}

fn spill_share(sent: &[Sent]) -> f64 {
    let spilled = sent.iter().filter(|s| !s.on_vm()).count();
    spilled as f64 / sent.len().max(1) as f64
}

/// Every decision of `shared` after the first 2 s has a decision of `single` within
/// ±3 s (K·E plus the phase and the shared lag of one epoch) whose target is within ±1.
fn assert_targets_agree(single: &Run, shared: &Run, what: &str) {
    let window = Duration::from_secs(3);
    let mut checked = 0;
    for &(at, target) in &shared.decisions {
        if at < Duration::from_secs(2) {
            continue;
        }
        let near: Vec<u64> = single
            .decisions
            .iter()
            .filter(|(t, _)| t.abs_diff(at) <= window)
            .map(|&(_, n)| n)
            .collect();
        if near.is_empty() {
            continue;
        }
        checked += 1;
        assert!(
            near.iter().any(|&n| n.abs_diff(target) <= 1),
            "{what}: at {at:?} the replicas decided {target} VMs, one gateway {near:?} \
             (single {:?}, shared {:?})",
            single.decisions,
            shared.decisions
        );
    }
    assert!(checked >= 5, "{what}: only {checked} decisions compared");
}

/// Per wall-clock epoch, the replicas' VM admissions together stay within
/// ρ·vm_reqs·E + 3 (the quota's fractions, one per replica).
fn assert_admissions_bounded(r: &Run, what: &str) {
    let mut per_epoch: BTreeMap<u64, u64> = BTreeMap::new();
    for s in r.sent.iter().filter(|s| s.on_vm()) {
        *per_epoch.entry(s.epoch).or_default() += 1;
    }
    for (&e, &n) in &per_epoch {
        let vm_reqs = (e.saturating_sub(1)..=e + 1)
            .filter_map(|x| r.vm_reqs.get(&x))
            .fold(0.0_f64, |a, &b| a.max(b));
        let bound = RHO * vm_reqs * EPOCH.as_secs_f64() + 3.0;
        assert!(
            n as f64 <= bound,
            "{what}: epoch {e} admitted {n} to VMs, bound {bound:.1} (vm_reqs {vm_reqs:.1})"
        );
    }
}

/// No replica sent a request to a VM that was gone: a follower routes to a registry VM
/// until its next round, so a VM stopped as soon as the leader scaled it in failed
/// their requests (connect refused, reset before an answer) — answered 502 once the
/// retry budget or the single retry ran out.
fn assert_no_request_met_a_stopped_vm(gws: &[Gateway], what: &str) {
    for (i, g) in gws.iter().enumerate() {
        let log = g.proc.log_text();
        let met: Vec<&str> = log
            .lines()
            .filter(|l| {
                l.contains("connect failed") || l.contains("upstream failed before answering")
            })
            .collect();
        assert!(
            met.is_empty(),
            "{what}: replica {i} sent {} requests to a stopped VM: {:?}",
            met.len(),
            &met[..met.len().min(3)]
        );
    }
}

/// How far (percentage points) three replicas' spill share may lie from one gateway's
/// on the same load: the goal. With every run's load on the same phase of the epoch
/// grid and the decision cycle ([`load_start`]) one gateway's share repeats within a few
/// tenths of a point, so the bound measures the replicas' policy, not the start.
const SPILL_SHARE_POINTS: f64 = 2.0;

fn assert_all_ok(r: &Run, what: &str) {
    let bad: Vec<&Sent> = r.sent.iter().filter(|s| s.status != 200).collect();
    assert!(
        bad.is_empty(),
        "{what}: {} failed: {:?}",
        bad.len(),
        &bad[..bad.len().min(5)]
    );
}

/// The Redis fixture never hands a test another test's server: a server started on a
/// port another one holds is refused (it exits, or the one answering is not it), and the
/// holder keeps serving.
#[test]
fn the_redis_fixture_refuses_a_port_another_server_holds() {
    let holder = Redis::start();
    let second = Redis::try_start_on(holder.port);
    assert!(
        second.is_err(),
        "a second redis-server on {} was taken for the holder",
        holder.port
    );
    assert!(holder.ping(), "the holder stopped answering");
}

/// Done when 1: the same step load and WITS slice through one gateway and through three
/// replicas (spread evenly, then 70/20/10) give VM targets within ±1 at every decision,
/// per-epoch VM admissions within ρ·vm_reqs·E + 3, and spill shares within 2 points
/// ([`SPILL_SHARE_POINTS`]); the per-replica shares are printed to show where a gap
/// comes from.
#[test]
fn three_replicas_decide_like_one_gateway_under_a_step_load_and_a_wits_slice() {
    let _serial = serial();
    let functions = SampleApi::start("fn-shared");
    let redis = Redis::start();
    let load: Vec<(f64, f64)> = step_load().into_iter().chain(wits_slice()).collect();

    let single = Gateway::start(&config(functions.addr, None, &unique_cluster("one"), ""));
    let one = run(&[&single], &[1.0], &load);
    drop(single);
    assert_all_ok(&one, "one gateway");

    let cluster = unique_cluster("even");
    let reaper = Reaper(cluster.clone());
    let yaml = config(functions.addr, Some(&redis.url()), &cluster, "");
    let gws = replicas::start(3, &yaml);
    let refs: Vec<&Gateway> = gws.iter().collect();
    wait_one_leader(&refs, Duration::from_secs(10));
    let even = run(&refs, &[1.0, 1.0, 1.0], &load);
    assert_no_request_met_a_stopped_vm(&gws, "1/3 each");
    drop(gws);
    reaper.reap();
    assert_all_ok(&even, "three replicas, 1/3 each");
    assert_targets_agree(&one, &even, "1/3 each");
    assert_admissions_bounded(&even, "1/3 each");

    let cluster = unique_cluster("uneven");
    let reaper = Reaper(cluster.clone());
    let yaml = config(functions.addr, Some(&redis.url()), &cluster, "");
    let gws = replicas::start(3, &yaml);
    let refs: Vec<&Gateway> = gws.iter().collect();
    wait_one_leader(&refs, Duration::from_secs(10));
    let uneven = run(&refs, &[0.7, 0.2, 0.1], &load);
    assert_no_request_met_a_stopped_vm(&gws, "70/20/10");
    drop(gws);
    reaper.reap();
    assert_all_ok(&uneven, "three replicas, 70/20/10");
    assert_targets_agree(&one, &uneven, "70/20/10");
    assert_admissions_bounded(&uneven, "70/20/10");

    let (s1, s3, s7) = (
        spill_share(&one.sent),
        spill_share(&even.sent),
        spill_share(&uneven.sent),
    );
    eprintln!(
        "spill share: one gateway {:.1} %, 1/3 each {:.1} %, 70/20/10 {:.1} %; decisions {} / {} / {}",
        s1 * 100.0,
        s3 * 100.0,
        s7 * 100.0,
        one.decisions.len(),
        even.decisions.len(),
        uneven.decisions.len()
    );
    for (r, what) in [(&even, "1/3 each"), (&uneven, "70/20/10")] {
        let per: Vec<String> = (0..3)
            .map(|i| {
                let mine: Vec<Sent> = r.sent.iter().filter(|s| s.to == i).cloned().collect();
                format!("{:.1} % of {}", spill_share(&mine) * 100.0, mine.len())
            })
            .collect();
        eprintln!("{what}: spill share per replica {per:?}");
    }
    for (s, what) in [(s3, "1/3 each"), (s7, "70/20/10")] {
        assert!(
            (s - s1).abs() <= SPILL_SHARE_POINTS / 100.0,
            "{what}: spill share {:.1} % vs one gateway {:.1} %",
            s * 100.0,
            s1 * 100.0
        );
    }
    let _ = (one.start, try_status);
}

fn admins(gws: &[Gateway]) -> Vec<SocketAddr> {
    gws.iter().map(|g| g.admin).collect()
}

fn leaders(st: &[Option<Value>]) -> Vec<usize> {
    (0..st.len())
        .filter(|&i| st[i].as_ref().is_some_and(|s| role(s) == "leader"))
        .collect()
}

fn all_ok(results: &[(u16, Duration)], what: &str) {
    let bad: Vec<u16> = results
        .iter()
        .map(|(c, _)| *c)
        .filter(|&c| !(200..300).contains(&c))
        .collect();
    assert!(
        results.len() > 50,
        "{what}: only {} requests",
        results.len()
    );
    assert!(
        bad.is_empty(),
        "{what}: {} of {} failed: {bad:?}",
        bad.len(),
        results.len()
    );
}

/// Done when 2: the leader is SIGKILLed under load. A new leader with the next term
/// takes over once the lease ran out (within 2 epochs after it), no client request
/// fails (those routed to the dead leader's VMs are retried elsewhere), the pool never
/// holds more than target + 1 VMs, and the new leader resumes the EWMAs (≤ 1 %).
#[test]
fn a_killed_leader_is_replaced_with_the_next_term_and_no_request_fails() {
    let _serial = serial();
    let functions = SampleApi::start("fn-shared");
    let redis = Redis::start();
    let cluster = unique_cluster("kill");
    let _reaper = Reaper(cluster.clone());
    let gws = replicas::start(3, &config(functions.addr, Some(&redis.url()), &cluster, ""));
    let refs: Vec<&Gateway> = gws.iter().collect();
    let leader = wait_one_leader(&refs, Duration::from_secs(10));
    // Clients reach the followers only (the balancer in front would drop the dead one).
    let weights = Arc::new(Mutex::new(
        (0..3)
            .map(|i| if i == leader { 0.0 } else { 1.0 })
            .collect::<Vec<f64>>(),
    ));
    let proxies: Vec<SocketAddr> = gws.iter().map(|g| g.proxy).collect();
    let load = Background::start(proxies, Arc::clone(&weights), 30.0, "/");
    let admins = admins(&gws);
    // Steady state: VMs up, the EWMAs settled.
    until("VMs ready", &admins, Duration::from_secs(20), |st| {
        st[leader]
            .as_ref()
            .is_some_and(|s| s["scaling"]["ready_vms"].as_u64().unwrap_or(0) >= 3)
    });
    std::thread::sleep(Duration::from_secs(4)); // let the EWMAs settle before the kill
    let before = try_status(admins[leader]).expect("leader status");
    let (old_term, avg_before) = (
        term(&before),
        before["traffic"]["avg_rps"].as_f64().unwrap(),
    );
    let killed_at = std::time::Instant::now();
    gws[leader].proc.signal("KILL");
    let others: Vec<SocketAddr> = (0..3).filter(|&i| i != leader).map(|i| admins[i]).collect();
    let mut max_over = 0i64;
    let took = until("a new leader", &others, Duration::from_secs(15), |st| {
        let l = leaders(st);
        l.len() == 1 && st[l[0]].as_ref().is_some_and(|s| term(s) > old_term)
    });
    let new = (0..3)
        .filter(|&i| i != leader)
        .find(|&i| try_status(admins[i]).is_some_and(|s| role(&s) == "leader"))
        .expect("the new leader");
    let after = try_status(admins[new]).unwrap();
    assert_eq!(term(&after), old_term + 1, "term + 1");
    assert!(
        took <= LEASE + 2 * EPOCH + Duration::from_millis(300),
        "new leader {took:?} after the kill (lease {LEASE:?})"
    );
    // The pool is rebuilt by the new leader; never more VMs than its target + 1.
    let rebuild = std::time::Instant::now();
    while rebuild.elapsed() < Duration::from_secs(6) {
        if let Some(s) = try_status(admins[new]) {
            let target = s["scaling"]["target_vms"].as_i64().unwrap_or(0);
            let vms = cluster_vms(&cluster).len() as i64;
            max_over = max_over.max(vms - target);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        max_over <= 1,
        "the pool held {max_over} VMs more than the target"
    );
    let results = load.finish();
    all_ok(&results, "load on the followers");
    let log = gws[new].proc.log_text();
    let line = log
        .lines()
        .rfind(|l| l.contains("became the scaling leader"))
        .expect("takeover logged");
    assert!(line.contains("resumed=true"), "{line}");
    let resumed: f64 = line
        .split("avg_rps=")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("avg_rps in the takeover line");
    assert!(
        (resumed - avg_before).abs() <= 0.01 * avg_before,
        "EWMA before {avg_before}, resumed at {resumed}"
    );
    eprintln!(
        "leader SIGKILL: new leader after {took:?} (term {old_term} → {}), {} requests ok, \
         at most {max_over} VM over the target, avg {avg_before:.2} → resumed {resumed:.2}",
        old_term + 1,
        results.len()
    );
    let _ = killed_at;
}

/// Done when 3: a leader stopped (SIGSTOP) for three leases is replaced; when it resumes
/// it steps down within one epoch, the store accepts no write of its old term, and it
/// makes no pool write. Then SIGTERM on the leader releases the lease: a new leader
/// within one epoch.
#[test]
fn a_paused_leader_steps_down_when_it_resumes_and_a_terminated_one_hands_over() {
    let _serial = serial();
    let functions = SampleApi::start("fn-shared");
    let redis = Redis::start();
    let cluster = &unique_cluster("pause");
    let _reaper = Reaper(cluster.clone());
    let gws = replicas::start(3, &config(functions.addr, Some(&redis.url()), cluster, ""));
    let refs: Vec<&Gateway> = gws.iter().collect();
    let leader = wait_one_leader(&refs, Duration::from_secs(10));
    let weights = Arc::new(Mutex::new(
        (0..3)
            .map(|i| if i == leader { 0.0 } else { 1.0 })
            .collect::<Vec<f64>>(),
    ));
    let proxies: Vec<SocketAddr> = gws.iter().map(|g| g.proxy).collect();
    let load = Background::start(proxies, Arc::clone(&weights), 30.0, "/");
    let admins = admins(&gws);
    until("VMs ready", &admins, Duration::from_secs(20), |st| {
        st[leader]
            .as_ref()
            .is_some_and(|s| s["scaling"]["ready_vms"].as_u64().unwrap_or(0) >= 3)
    });
    let old_term = term(&try_status(admins[leader]).unwrap());
    // The coordination series the dashboard and the alert read.
    let metrics =
        String::from_utf8_lossy(&common::http(admins[leader], "GET", "/metrics", &[], b"").2)
            .into_owned();
    for series in [
        "spillway_coordination_role{role=\"leader\"} 1",
        "spillway_coordination_role{role=\"local\"} 0",
        &format!("spillway_coordination_term {old_term}"),
        "spillway_coordination_replicas 3",
        "spillway_coordination_store_errors_total{operation=\"exchange\",kind=\"timeout\"}",
    ] {
        assert!(
            metrics.contains(series),
            "{series} not in /metrics:\n{metrics}"
        );
    }
    let old_pid = gws[leader].proc.child.id();
    gws[leader].proc.signal("STOP");
    std::thread::sleep(3 * LEASE); // three leases while it is stopped
    let others: Vec<SocketAddr> = (0..3).filter(|&i| i != leader).map(|i| admins[i]).collect();
    until("a new leader", &others, Duration::from_secs(10), |st| {
        let l = leaders(st);
        l.len() == 1 && st[l[0]].as_ref().is_some_and(|s| term(s) > old_term)
    });
    let old_term_intents = intent_terms(redis.port, cluster)
        .iter()
        .filter(|&&t| t == old_term)
        .count();
    let children_before = vm_children(&[old_pid]);
    gws[leader].proc.signal("CONT");
    let stepped = until(
        "the old leader steps down",
        &[admins[leader]],
        Duration::from_secs(5),
        |st| st[0].as_ref().is_some_and(|s| role(s) == "follower"),
    );
    assert!(
        stepped <= EPOCH + Duration::from_millis(300),
        "stepped down {stepped:?} after SIGCONT"
    );
    // Give it a few epochs to do anything stale.
    std::thread::sleep(4 * EPOCH);
    let after = intent_terms(redis.port, cluster)
        .iter()
        .filter(|&&t| t == old_term)
        .count();
    assert_eq!(
        after, old_term_intents,
        "a pool write of the old term was accepted"
    );
    let new_children: Vec<u32> = vm_children(&[old_pid])
        .difference(&children_before)
        .copied()
        .collect();
    assert!(
        new_children.is_empty(),
        "the old leader launched {new_children:?} after resuming"
    );
    // SIGTERM on the current leader: the lease is released, the next leader within an
    // epoch of it.
    let current = until("one leader", &admins, Duration::from_secs(5), |st| {
        leaders(st).len() == 1
    });
    let _ = current;
    let st: Vec<Option<Value>> = admins.iter().map(|a| try_status(*a)).collect();
    let cur = leaders(&st)[0];
    let cur_term = term(st[cur].as_ref().unwrap());
    weights.lock()[cur] = 0.0;
    if cur != leader {
        weights.lock()[leader] = 1.0;
    }
    gws[cur].proc.signal("TERM");
    let rest: Vec<SocketAddr> = (0..3).filter(|&i| i != cur).map(|i| admins[i]).collect();
    let handed = until(
        "a leader after SIGTERM",
        &rest,
        Duration::from_secs(10),
        |st| {
            let l = leaders(st);
            l.len() == 1 && st[l[0]].as_ref().is_some_and(|s| term(s) > cur_term)
        },
    );
    assert!(
        handed <= EPOCH + Duration::from_millis(400),
        "a new leader {handed:?} after SIGTERM (lease {LEASE:?} not waited for)"
    );
    let results = load.finish();
    all_ok(&results, "load on the followers");
    eprintln!(
        "leader SIGSTOP: stepped down {stepped:?} after SIGCONT, {old_term_intents} intents of term {old_term}, none after; SIGTERM: new leader after {handed:?}"
    );
}

/// Done when 4: Redis SIGKILLed for 30 epochs under load, then restarted empty: every
/// request answers 2xx, every replica reports local decisions within a few epochs, no
/// VM is launched or stopped during the outage, shared mode and a leader are back within
/// 2 epochs of the restart, and the outage's counts reach the store. Then Redis hung
/// (SIGSTOP): every request answers and the median stays within 3 × the slower of two
/// baselines (before and after; waiting on Redis would cost 10 ×).
#[test]
fn redis_down_then_back_and_hung_costs_no_request() {
    let _serial = serial();
    let functions = SampleApi::start("fn-shared");
    let redis = Redis::start();
    let port = redis.port;
    let cluster = &unique_cluster("outage");
    let _reaper = Reaper(cluster.clone());
    let gws = replicas::start(3, &config(functions.addr, Some(&redis.url()), cluster, ""));
    let refs: Vec<&Gateway> = gws.iter().collect();
    wait_one_leader(&refs, Duration::from_secs(10));
    let admins = admins(&gws);
    let weights = Arc::new(Mutex::new(vec![1.0; 3]));
    let proxies: Vec<SocketAddr> = gws.iter().map(|g| g.proxy).collect();
    let load = Background::start(proxies.clone(), Arc::clone(&weights), 30.0, "/");
    until("VMs ready", &admins, Duration::from_secs(20), |st| {
        st.iter()
            .flatten()
            .any(|s| s["scaling"]["ready_vms"].as_u64().unwrap_or(0) >= 3)
    });
    std::thread::sleep(4 * EPOCH); // the pool settles at its target
    let vms_before = cluster_vms(cluster);
    let first_outage_epoch = replicas::wall_epoch() + 1;
    drop(redis);
    let local = until(
        "every replica local",
        &admins,
        Duration::from_secs(10),
        |st| {
            st.iter()
                .all(|s| s.as_ref().is_some_and(|s| role(s) == "local"))
        },
    );
    assert!(local <= 6 * EPOCH, "local after {local:?}");
    std::thread::sleep(30 * EPOCH - local);
    assert_eq!(
        cluster_vms(cluster),
        vms_before,
        "the pool changed while Redis was down"
    );
    let last_outage_epoch = replicas::wall_epoch() - 1;
    let redis = Redis::start_on(port);
    let back = until(
        "shared mode and one leader",
        &admins,
        Duration::from_secs(10),
        |st| {
            leaders(st).len() == 1
                && st.iter().all(|s| {
                    s.as_ref()
                        .is_some_and(|s| matches!(role(s), "leader" | "follower"))
                })
        },
    );
    assert!(
        back <= 2 * EPOCH + Duration::from_millis(300),
        "back after {back:?}"
    );
    let results = load.finish();
    all_ok(&results, "load during the outage");
    // No gap: every replica's count of the outage epochs reached the store.
    std::thread::sleep(2 * EPOCH);
    let mut gaps = Vec::new();
    for e in first_outage_epoch..=last_outage_epoch {
        let n = replicas::redis_cli(
            port,
            &["HLEN", &format!("spillway:{{{cluster}}}:counts:{e}")],
        );
        if n.first().map(String::as_str) != Some("3") {
            gaps.push((e, n));
        }
    }
    assert!(gaps.is_empty(), "epochs without three counts: {gaps:?}");

    // Hung, not dead: requests keep being served. A request path that waited on the
    // store would take at least one store deadline (200 ms) on top of the 20 ms the
    // sample API sleeps, ten times the baseline; so the median with Redis stopped is
    // compared with the slower of two baselines (before, after) as a ratio bounded at 3:
    // far from what the machine's load does to a median of hundreds of requests, far
    // below what waiting on Redis would cost.
    let median = |path: &str| {
        let l = Background::start(proxies.clone(), Arc::clone(&weights), 40.0, path);
        std::thread::sleep(Duration::from_secs(8));
        let r = l.finish();
        all_ok(&r, path);
        let mut d: Vec<Duration> = r.iter().map(|x| x.1).collect();
        (percentile(&mut d, 50.0), percentile(&mut d, 99.0), r.len())
    };
    let before = median("/sleep?ms=20");
    redis.signal("STOP");
    let hung = median("/sleep?ms=20");
    redis.signal("CONT");
    let after = median("/sleep?ms=20");
    eprintln!(
        "Redis SIGKILL: local after {local:?}, back {back:?} after the restart, {} requests ok; \
         SIGSTOP: median / p99 {:?} / {:?} before, {:?} / {:?} hung ({} requests ok), {:?} / {:?} after",
        results.len(),
        before.0,
        before.1,
        hung.0,
        hung.1,
        hung.2,
        after.0,
        after.1
    );
    let ratio = hung.0.as_secs_f64() / before.0.max(after.0).as_secs_f64();
    assert!(
        ratio <= 3.0,
        "median {:?} with Redis hung, {:?} before and {:?} after",
        hung.0,
        before.0,
        after.0
    );
}

/// The leader's published shares (`spillway:{CLUSTER}:state`), by replica id.
fn published_shares(port: u16, cluster: &str) -> Option<BTreeMap<String, f64>> {
    let out = replicas::redis_cli(port, &["GET", &format!("spillway:{{{cluster}}}:state")]);
    let v: Value = serde_json::from_str(out.first()?).ok()?;
    let m = v["shares"].as_object()?;
    Some(
        m.iter()
            .filter_map(|(k, x)| Some((k.clone(), x.as_f64()?)))
            .collect(),
    )
}

/// Done when 5: a follower cut off from Redis by a fault proxy goes local (share 1/N,
/// pool frozen) after the grace epochs; the replicas together admit at most
/// (1 + 1/N)·ρ·vm_reqs·E (+ rounding) per epoch, and the leader reassigns the cut
/// replica's share only once the grace epochs have passed.
#[test]
fn a_follower_cut_off_goes_local_and_its_share_moves_only_after_the_grace_epochs() {
    let _serial = serial();
    let functions = SampleApi::start("fn-shared");
    let redis = Redis::start();
    let proxy = replicas::FaultProxy::start(format!("127.0.0.1:{}", redis.port).parse().unwrap());
    let cluster = &unique_cluster("cut");
    let _reaper = Reaper(cluster.clone());
    let direct = config(functions.addr, Some(&redis.url()), cluster, "");
    let proxied = config(functions.addr, Some(&proxy.url()), cluster, "");
    let mut gws = replicas::start(2, &direct);
    wait_one_leader(&gws.iter().collect::<Vec<_>>(), Duration::from_secs(10));
    gws.push(Gateway::start(&proxied));
    let refs: Vec<&Gateway> = gws.iter().collect();
    let leader = wait_one_leader(&refs, Duration::from_secs(10));
    assert_ne!(leader, 2, "the proxied replica started last: a follower");
    let cut_id = try_status(gws[2].admin).unwrap()["coordination"]["replica"]
        .as_str()
        .unwrap()
        .to_string();
    let sampler = Sampler::start(gws.iter().map(|g| g.admin).collect());
    // Shares as the leader publishes them, every 100 ms.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (stop2, port, cut_cluster) = (Arc::clone(&stop), redis.port, cluster.clone());
    let shares = std::thread::spawn(move || {
        let mut out = Vec::new();
        while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
            if let Some(s) = published_shares(port, &cut_cluster) {
                out.push((std::time::Instant::now(), s));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        out
    });
    let targets: Vec<(SocketAddr, f64)> = gws.iter().map(|g| (g.proxy, 1.0)).collect();
    let cut_at = Arc::new(Mutex::new(None));
    let cutter = {
        let cut_at = Arc::clone(&cut_at);
        let proxy = Arc::new(proxy);
        let p2 = Arc::clone(&proxy);
        let h = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs(6));
            *cut_at.lock() = Some(std::time::Instant::now());
            p2.cut();
        });
        (h, proxy)
    };
    let sent = drive(&targets, &[(36.0, 16.0)], "/");
    cutter.0.join().unwrap();
    let samples = sampler.finish();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let shares = shares.join().unwrap();
    cutter.1.heal();
    let cut_at = cut_at.lock().expect("cut");
    let bad: Vec<&Sent> = sent.iter().filter(|s| s.status != 200).collect();
    assert!(bad.is_empty(), "{} requests failed", bad.len());
    // The cut replica goes local after the grace epochs (3) and its op deadlines.
    let local_at = samples
        .iter()
        .find(|x| x.replica == 2 && x.at > cut_at && role(&x.status) == "local")
        .map(|x| x.at - cut_at)
        .expect("the cut replica went local");
    assert!(local_at <= 6 * EPOCH, "local {local_at:?} after the cut");
    let local_share = samples
        .iter()
        .rfind(|x| x.replica == 2 && role(&x.status) == "local")
        .and_then(|x| {
            x.status
                .pointer("/coordination/share")
                .and_then(Value::as_f64)
        })
        .unwrap();
    assert!((local_share - 1.0 / 3.0).abs() < 1e-9, "{local_share}");
    // Its share stays published through the grace epochs, then moves to the others.
    let moved = shares
        .iter()
        .find(|(at, s)| *at > cut_at && !s.contains_key(&cut_id))
        .map(|(at, s)| (*at - cut_at, s.values().sum::<f64>()))
        .expect("the share was reassigned");
    assert!(
        moved.0 >= 3 * EPOCH,
        "the cut replica's share moved {:?} after the cut, before the grace epochs",
        moved.0
    );
    assert!(moved.0 <= 7 * EPOCH, "share moved only after {:?}", moved.0);
    assert!(
        (moved.1 - 1.0).abs() < 1e-9,
        "the others' shares sum to {}",
        moved.1
    );
    // Admissions per epoch within (1 + 1/N)·ρ·vm_reqs·E + 3.
    let mut vm_reqs: BTreeMap<u64, f64> = BTreeMap::new();
    for x in samples.iter().filter(|x| role(&x.status) == "leader") {
        let v = x.status["scaling"]["vm_reqs_rps"].as_f64().unwrap_or(0.0);
        let e = vm_reqs.entry(x.epoch).or_insert(0.0_f64);
        *e = e.max(v);
    }
    let mut per_epoch: BTreeMap<u64, u64> = BTreeMap::new();
    for s in sent.iter().filter(|s| s.on_vm()) {
        *per_epoch.entry(s.epoch).or_default() += 1;
    }
    for (&e, &n) in &per_epoch {
        let v = (e.saturating_sub(1)..=e + 1)
            .filter_map(|x| vm_reqs.get(&x))
            .fold(0.0_f64, |a, &b| a.max(b));
        let bound = (1.0 + 1.0 / 3.0) * RHO * v * EPOCH.as_secs_f64() + 3.0;
        assert!(
            n as f64 <= bound,
            "epoch {e}: {n} VM admissions, bound {bound:.1}"
        );
    }
    eprintln!(
        "follower cut off: local after {local_at:?}, share moved after {:?}, {} requests ok",
        moved.0,
        sent.len()
    );
}

/// Done when 7, bounded: a soak with the leader killed every ~20 s (a fresh replica
/// joins each time) — no failed request, every decision within ±1 of one gateway's at
/// the same steady load, terms strictly increasing. Its length is
/// `SPILLWAY_SOAK_SECONDS` (default 120 s, as CI runs it; the requirement's full soak
/// is 600 s).
#[test]
fn a_soak_with_the_leader_killed_every_twenty_seconds() {
    let _serial = serial();
    let seconds: u64 = std::env::var("SPILLWAY_SOAK_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(120);
    let functions = SampleApi::start("fn-shared");
    let rate = 30.0;
    // One gateway's decisions at this steady load.
    let single = Gateway::start(&config(functions.addr, None, "soak1", ""));
    let one = run(&[&single], &[1.0], &[(rate, 14.0)]);
    drop(single);
    let steady: Vec<u64> = one
        .decisions
        .iter()
        .filter(|(at, _)| *at >= Duration::from_secs(6))
        .map(|&(_, t)| t)
        .collect();
    assert!(!steady.is_empty(), "{:?}", one.decisions);
    let (lo, hi) = (*steady.iter().min().unwrap(), *steady.iter().max().unwrap());

    let redis = Redis::start();
    let cluster = &unique_cluster("soak");
    let _reaper = Reaper(cluster.clone());
    let yaml = config(functions.addr, Some(&redis.url()), cluster, "");
    let mut gws: Vec<Option<Gateway>> = replicas::start(3, &yaml).into_iter().map(Some).collect();
    let refs: Vec<&Gateway> = gws.iter().flatten().collect();
    wait_one_leader(&refs, Duration::from_secs(10));
    let weights = Arc::new(Mutex::new(vec![1.0; 3]));
    let proxies: Vec<SocketAddr> = gws.iter().flatten().map(|g| g.proxy).collect();
    // Slots that get a fresh replica are new targets: keep proxies per slot.
    let proxies = Arc::new(Mutex::new(proxies));
    let _ = &proxies;
    let started = std::time::Instant::now();
    let mut results: Vec<(u16, Duration)> = Vec::new();
    let mut terms: Vec<u64> = Vec::new();
    let mut decided: Vec<u64> = Vec::new();
    let mut kills = 0;
    while started.elapsed() < Duration::from_secs(seconds) {
        let targets: Vec<SocketAddr> = gws.iter().flatten().map(|g| g.proxy).collect();
        let load = Background::start(targets, Arc::clone(&weights), rate, "/");
        // ~20 s of this leader: watch its decisions and term.
        let t0 = std::time::Instant::now();
        let mut leader_slot = None;
        while t0.elapsed() < Duration::from_secs(20) {
            for (i, g) in gws.iter().enumerate() {
                let Some(g) = g else { continue };
                let Some(s) = try_status(g.admin) else {
                    continue;
                };
                if role(&s) != "leader" {
                    continue;
                }
                leader_slot = Some(i);
                let t = term(&s);
                if terms.last() != Some(&t) {
                    terms.push(t);
                }
                if let Some(n) = s
                    .pointer("/scaling/last_decision/target_vms")
                    .and_then(Value::as_u64)
                    && t0.elapsed() > Duration::from_secs(8)
                {
                    decided.push(n);
                }
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        let Some(victim) = leader_slot else {
            panic!("no leader: terms {terms:?}")
        };
        // The balancer stops sending to it, then it dies hard.
        weights.lock()[victim] = 0.0;
        std::thread::sleep(Duration::from_millis(700));
        results.extend(load.finish());
        if let Some(g) = gws[victim].take() {
            g.proc.signal("KILL");
        }
        kills += 1;
        gws[victim] = Some(Gateway::start(&yaml));
        weights.lock()[victim] = 1.0;
    }
    all_ok(&results, "soak");
    assert!(kills >= 2, "{kills} kills in {seconds} s");
    assert!(
        terms.windows(2).all(|w| w[1] > w[0]),
        "terms not strictly increasing: {terms:?}"
    );
    assert!(terms.len() >= kills, "{terms:?} for {kills} kills");
    let off: Vec<u64> = decided
        .iter()
        .copied()
        .filter(|&n| n + 1 < lo || n > hi + 1)
        .collect();
    assert!(
        off.is_empty(),
        "decisions {off:?} outside one gateway's {lo}..={hi} ± 1"
    );
    eprintln!(
        "soak {seconds} s: {kills} leader kills, terms {terms:?}, {} requests ok, targets {lo}..={hi} alone",
        results.len()
    );
}

/// A replica's owner tag and advertised URL (`/status` `coordination.calls`).
fn owner_tag_of(gw: &Gateway) -> (String, String) {
    let s = try_status(gw.admin).expect("status");
    let calls = &s["coordination"]["calls"];
    (
        calls["owner_tag"].as_str().expect("owner_tag").to_string(),
        calls["url"].as_str().expect("url").to_string(),
    )
}

/// Poll `path` through `via` until it answers `want`: 503 (the owner not in this
/// replica's directory yet) only before the first other answer.
fn poll_until(via: &Gateway, path: &str, want: impl Fn(u16, &[u8]) -> bool) -> (u16, Vec<u8>) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (code, _, body) = common::http(via.proxy, "GET", path, &[], b"");
        if want(code, &body) {
            return (code, body);
        }
        assert!(
            code == 503 || code == 200,
            "{path} through another replica: {code} {}",
            String::from_utf8_lossy(&body)
        );
        assert!(
            Instant::now() < deadline,
            "{path} never answered as wanted: last {code} {}",
            String::from_utf8_lossy(&body)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Asynchronous calls across replicas: a call accepted by one replica carries its owner
/// tag, its status and result are fetched through the other replicas (forwarded to the
/// owner, never forwarded twice), and once the owner is gone a lookup elsewhere says so
/// (503 with `Retry-After`) instead of answering "no such call".
#[test]
fn an_async_call_accepted_by_one_replica_is_fetched_through_another() {
    let _serial = serial();
    let functions = SampleApi::start("fn-shared");
    let redis = Redis::start();
    let cluster = &unique_cluster("calls");
    let _reaper = Reaper(cluster.clone());
    let routes = "routes:\n  - {name: api, path_prefix: /, async: prefer}\n";
    let gws = replicas::start(
        3,
        &config(functions.addr, Some(&redis.url()), cluster, routes),
    );
    wait_one_leader(&gws.iter().collect::<Vec<_>>(), Duration::from_secs(10));
    let tags: Vec<String> = gws
        .iter()
        .map(|g| {
            let (tag, url) = owner_tag_of(g);
            assert_eq!(url, format!("http://{}", g.proxy), "the bound listener");
            tag
        })
        .collect();
    // Every replica knows every owner once each has reported.
    until(
        "every owner known",
        &admins(&gws),
        Duration::from_secs(10),
        |st| {
            st.iter().all(|s| {
                s.as_ref()
                    .is_some_and(|s| s["coordination"]["calls"]["owners_known"] == 3)
            })
        },
    );
    assert!(
        tags[0] != tags[1] && tags[1] != tags[2] && tags[0] != tags[2],
        "{tags:?}"
    );
    let prefer = ("Prefer", "respond-async");
    let mut locations = Vec::new();
    for (i, gw) in gws.iter().enumerate() {
        let payload = format!("call accepted by replica {i}");
        let (code, h, _) = common::http(gw.proxy, "POST", "/echo", &[prefer], payload.as_bytes());
        assert_eq!(code, 202, "replica {i}");
        let location = common::header(&h, "location")
            .expect("Location")
            .to_string();
        let id = location.rsplit('/').next().unwrap().to_string();
        assert_eq!(id.len(), 32);
        assert_eq!(&id[..8], tags[i], "the id carries its owner's tag");
        locations.push((location, payload));
    }
    // Every call through every other replica: its status, then its result.
    for (owner, (location, payload)) in locations.iter().enumerate() {
        for via in (0..3).filter(|&v| v != owner) {
            let (_, status) = poll_until(&gws[via], location, |code, body| {
                code == 200
                    && serde_json::from_slice::<Value>(body).is_ok_and(|v| v["state"] == "done")
            });
            let v: Value = serde_json::from_slice(&status).unwrap();
            assert_eq!(v["attempts"], 1, "{v}");
            let (code, _, body) = common::http(
                gws[via].proxy,
                "GET",
                &format!("{location}/result"),
                &[],
                b"",
            );
            assert_eq!(code, 200, "result of {location} through replica {via}");
            assert_eq!(String::from_utf8_lossy(&body), *payload);
        }
    }
    // A forwarded lookup is answered where it arrives, never forwarded again.
    let (first, _) = &locations[0];
    let (code, _, _) = common::http(
        gws[1].proxy,
        "GET",
        first,
        &[("Spillway-Call-Lookup", &tags[2])],
        b"",
    );
    assert_eq!(code, 404, "a forwarded lookup of another replica's call");
    // An id no live replica carries: the owner is not live.
    let unknown_tag = (0..u32::MAX)
        .map(|t| format!("{t:08x}"))
        .find(|t| !tags.contains(t))
        .unwrap();
    let unknown = format!("/_spillway/calls/{unknown_tag}{}", "1".repeat(24));
    let (code, h, _) = common::http(gws[1].proxy, "GET", &unknown, &[], b"");
    assert_eq!(code, 503, "an id whose owner is not live");
    assert!(common::header(&h, "retry-after").is_some());
    // The owner killed: once its heartbeat ages out the others say so.
    gws[0].proc.signal("KILL");
    let (code, _) = poll_until(&gws[2], first, |code, _| code == 503);
    assert_eq!(code, 503);
    let (code, h, body) = common::http(gws[2].proxy, "GET", first, &[], b"");
    assert_eq!(code, 503, "{}", String::from_utf8_lossy(&body));
    assert!(common::header(&h, "retry-after").is_some());
    eprintln!(
        "async calls across replicas: owner tags {tags:?}; every call fetched through both other replicas"
    );
}
