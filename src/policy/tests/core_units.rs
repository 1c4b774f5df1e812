//! Tests written against missed mutants of src/policy/core.rs — the one state
//! machine both drivers run. Each test drives `Core` through its public API and asserts a
//! decision, a count or a `/status` field the gateway or the simulator shows: the retry
//! guard and the instance-gone limit of the attempt protocol, the accessors drivers
//! branch on, the delay queue's accounting, a reload's LIBRA retune, function instance
//! shutdown accounting, boot deadlines of cancelled VMs, the adaptive r_max controller's
//! ready-VM seconds, and closing an idle epoch that ends exactly at `until`.

use std::time::Duration;

use spillway_policy::attempt::{
    AttemptKind, Decision, Failure, MAX_INSTANCE_GONE, NotSentReason, Ticket,
};
use spillway_policy::balancer::{RequestMeta, VmFirst};
use spillway_policy::baselines::{FixedScaler, FunctionOnly};
use spillway_policy::controller::{self, ControllerParams, LibraTuning};
use spillway_policy::core::{Action, Core, CoreParams};
use spillway_policy::delay::{CallId, DelayParams, DelayQueue, Mode, ReleaseKind};
use spillway_policy::functions::{FunctionPoolParams, WarmOrder};
use spillway_policy::monitor::MonitorParams;
use spillway_policy::placement::{
    PlacementParams, PlacementPolicy, ZoneCapacity, ZoneId, ZoneKind, ZoneParams,
};
use spillway_policy::retry::RetryBudgetParams;
use spillway_policy::rmax::{Hold, RMaxParams};
use spillway_policy::scaling::{
    EpochObservation, LibraScaler, LibraScalingParams, ScaleDecision, ScaleReason, ScalingPolicy,
};
use spillway_policy::sched::{Order, SchedParams};
use spillway_policy::timers::Timer;
use spillway_policy::{Time, VmId};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn monitor(epoch: Duration) -> MonitorParams {
    MonitorParams {
        epoch,
        alpha: 0.3,
        beta: 0.2,
        decision_epochs: 1000,
        first_decision_epoch: None,
    }
}

fn libra_params(r_max_rps: f64) -> LibraScalingParams {
    LibraScalingParams {
        phi: 1.5,
        r_max_rps,
        min_vms: 0,
        max_vms: 6,
        cip_rps: 0.0,
    }
}

fn concurrency(name: &str, kind: ZoneKind, max: u32) -> ZoneParams {
    ZoneParams {
        name: name.into(),
        kind,
        capacity: ZoneCapacity::Concurrency {
            max_concurrency: Some(max),
        },
    }
}

/// A report-only LIBRA core (scaling not executed) with `vms` adopted ready VMs, r_max
/// 10 req/s, ρ 0.8, and the given zones (edge first).
fn libra_core(vms: u32, zones: Vec<ZoneParams>, budget: Option<RetryBudgetParams>) -> Core {
    let mut core = Core::new(
        CoreParams {
            controller: ControllerParams {
                monitor: monitor(Duration::from_secs(60)),
                r_max_rps: 10.0,
                execute_scaling: false,
            },
            placement: PlacementParams {
                zones,
                policy: PlacementPolicy::EdgeFirst,
            },
            vm_boot_timeout: None,
        },
        Box::new(LibraScaler::new(libra_params(10.0))),
        Box::new(VmFirst::new(0.8)),
    );
    if let Some(b) = budget {
        core = core.with_retry_budget(b);
    }
    for _ in 0..vms {
        core.adopt_ready_vm(Time::ZERO);
    }
    core.start(Time::ZERO);
    drain(&mut core);
    core
}

fn drain(core: &mut Core) -> Vec<Action> {
    std::iter::from_fn(|| core.poll_action()).collect()
}

fn idempotent() -> Ticket {
    Ticket::new(
        RequestMeta {
            upgrade: false,
            idempotent: true,
        },
        None,
    )
}

fn not_sent(reason: NotSentReason) -> Failure {
    Failure::NotSent {
        reason,
        request_available: true,
    }
}

/// The adaptive r_max controller's parameters (a 5 s period, 10 req/s at the start).
fn rmax() -> RMaxParams {
    RMaxParams {
        start_rps: 10.0,
        target_quantile: 0.9,
        target: ms(100),
        kp: 0.1,
        ki: 0.45,
        kd: 0.03,
        min_rps: 2.0,
        max_rps: 40.0,
        max_step_rps: 100.0,
        period: Duration::from_secs(5),
        min_load_fraction: 0.4,
    }
}

mod retries {
    use super::*;

    /// http-cases C17: a request whose VM refused the connection is retried once, on
    /// another VM; when that VM refuses it too, the gateway answers with the error (no
    /// third attempt) and the budget counts a single retry.
    #[test]
    fn a_retried_request_that_fails_to_connect_again_is_not_retried_twice() {
        let mut core = libra_core(2, vec![concurrency("fn", ZoneKind::Cloud, 5)], None);
        let t0 = ms(10);
        let mut t = idempotent();
        let Decision::Vm { vm: first, .. } = core.route(t0, &mut t) else {
            panic!("two ready VMs with tokens")
        };
        let d = core.on_attempt_failed(t0, &mut t, not_sent(NotSentReason::ConnectFailed));
        let Some(Decision::Vm {
            vm: second,
            kind: AttemptKind::Retry,
            ..
        }) = d
        else {
            panic!("{d:?}")
        };
        assert_ne!(second, first, "never the VM that refused");
        let d = core.on_attempt_failed(t0, &mut t, not_sent(NotSentReason::ConnectFailed));
        assert_eq!(d, None, "one retry per request");
        let b = core.status().retry_budget;
        assert_eq!(
            (b.retried_total, b.refused_total),
            (0, 0),
            "a request never written does not spend the budget"
        );
        for vm in [first, second] {
            assert_eq!(core.controller().vms().get(vm).unwrap().outstanding, 0);
        }
    }

    /// Re-sends of a request that reached an upstream (an idempotent GET that failed
    /// before any response byte) are retried only while the retry budget has room
    /// (`retries + 1 ≤ ratio · requests`, no per-second floor); the others answer with
    /// their own error and are counted as refused in `/status`. A connect failure (never
    /// written) is re-routed whatever the budget, even when it is used up.
    #[test]
    fn re_sends_beyond_the_retry_budget_are_not_retried_connect_failures_are() {
        let ratio = 0.4;
        let mut core = libra_core(
            2,
            vec![concurrency("fn", ZoneKind::Cloud, 5)],
            Some(RetryBudgetParams {
                ratio,
                window: Duration::from_secs(10_000),
                min_per_second: 0.0,
            }),
        );
        let after_send = Failure::FailedAfterSend {
            response_started: false,
            request_available: true,
        };
        let (mut granted, mut refused) = (0_u64, 0_u64);
        let mut outcomes = Vec::new();
        let mut expected = Vec::new();
        for i in 1..=6_u32 {
            let at = Duration::from_secs(u64::from(i) * 60) + ms(500);
            let mut t = idempotent();
            assert!(
                matches!(core.route(at, &mut t), Decision::Vm { .. }),
                "one request per epoch: a token each time"
            );
            let fits = (granted + 1) as f64 <= ratio * f64::from(i);
            expected.push(fits);
            if fits {
                granted += 1;
            } else {
                refused += 1;
            }
            let d = core.on_attempt_failed(at, &mut t, after_send);
            outcomes.push(d.and_then(|d| d.kind()) == Some(AttemptKind::Retry));
            core.finish(at, &mut t);
        }
        assert_eq!(outcomes, expected);
        assert!(!expected[0], "0.4 · 1 request allows no retry");
        assert!(granted >= 2 && refused >= 2, "{granted} {refused}");
        let b = core.status().retry_budget;
        assert_eq!((b.retried_total, b.refused_total), (granted, refused));
        // The budget is used up now; a connect failure is still re-routed, uncharged.
        let at = Duration::from_secs(7 * 60) + ms(500);
        let mut t = idempotent();
        assert!(matches!(core.route(at, &mut t), Decision::Vm { .. }));
        let d = core.on_attempt_failed(at, &mut t, not_sent(NotSentReason::ConnectFailed));
        assert_eq!(d.and_then(|d| d.kind()), Some(AttemptKind::Retry), "{d:?}");
        let after = core.status().retry_budget;
        assert_eq!(
            (after.retried_total, after.refused_total),
            (granted, refused)
        );

        // A budget of zero turns retries off, re-routes of connect failures included.
        let mut off = libra_core(
            2,
            vec![concurrency("fn", ZoneKind::Cloud, 5)],
            Some(RetryBudgetParams {
                ratio: 0.0,
                window: Duration::from_secs(10),
                min_per_second: 0.0,
            }),
        );
        let mut t = idempotent();
        assert!(matches!(off.route(ms(10), &mut t), Decision::Vm { .. }));
        let d = off.on_attempt_failed(ms(10), &mut t, not_sent(NotSentReason::ConnectFailed));
        assert_eq!(d, None, "retries are off");
    }

    /// A suspect VM (an attempt on it failed, its probe has not answered) gets no new
    /// request; requests go to the other VM as first attempts until it is cleared.
    #[test]
    fn a_suspect_vm_gets_no_request_until_it_is_cleared() {
        let mut core = libra_core(2, vec![concurrency("fn", ZoneKind::Cloud, 5)], None);
        let t0 = ms(10);
        let mut t = idempotent();
        let Decision::Vm { vm: first, .. } = core.route(t0, &mut t) else {
            panic!("two ready VMs")
        };
        core.finish(t0, &mut t);
        core.on_vm_suspect(t0, first);
        for _ in 0..3 {
            let mut t = idempotent();
            let d = core.route(t0, &mut t);
            let Decision::Vm { vm, kind, .. } = d else {
                panic!("{d:?}")
            };
            assert_ne!(vm, first, "routed to the suspect VM");
            assert_eq!(kind, AttemptKind::First);
            core.finish(t0, &mut t);
        }
        core.on_vm_cleared(t0, first);
        let mut t = idempotent();
        let Decision::Vm { vm, .. } = core.route(t0, &mut t) else {
            panic!("a VM")
        };
        assert_eq!(vm, first, "the oldest idle VM again once cleared");
    }

    /// A warm instance that vanished (`InstanceGone`) is replaced in the same zone up to
    /// `MAX_INSTANCE_GONE` times; the next gone instance sends the call on to the next
    /// zone (a fall-through), as the proxy then does.
    #[test]
    fn the_same_zone_is_tried_again_up_to_the_instance_gone_limit() {
        let zones = vec![
            concurrency("edge", ZoneKind::Edge, 5),
            concurrency("cloud", ZoneKind::Cloud, 5),
        ];
        let (edge, cloud) = (ZoneId(0), ZoneId(1));
        let mut core = Core::new(
            CoreParams {
                controller: ControllerParams {
                    monitor: monitor(Duration::from_secs(60)),
                    r_max_rps: 10.0,
                    execute_scaling: true,
                },
                placement: PlacementParams {
                    zones,
                    policy: PlacementPolicy::EdgeFirst,
                },
                vm_boot_timeout: None,
            },
            Box::new(FixedScaler::faas()),
            Box::new(FunctionOnly),
        );
        core.start(Time::ZERO);
        let t0 = ms(10);
        let mut t = Ticket::new(RequestMeta::default(), Some(edge));
        let d = core.route(t0, &mut t);
        assert!(
            matches!(d, Decision::Function { lease, kind: AttemptKind::First, .. } if lease.zone == edge),
            "{d:?}"
        );
        let mut zones_tried = Vec::new();
        for _ in 0..=MAX_INSTANCE_GONE {
            let d = core.on_attempt_failed(t0, &mut t, not_sent(NotSentReason::InstanceGone));
            match d {
                Some(Decision::Function { lease, kind, .. }) => {
                    zones_tried.push((lease.zone, kind))
                }
                other => panic!("{other:?}"),
            }
        }
        let mut expected = vec![(edge, AttemptKind::Retry); usize::from(MAX_INSTANCE_GONE)];
        expected.push((cloud, AttemptKind::FallThrough));
        assert_eq!(zones_tried, expected);
        let st = core.status();
        assert_eq!(
            st.function_failures,
            vec![(edge, "instance_gone", u64::from(MAX_INSTANCE_GONE) + 1)]
        );
        assert_eq!((st.zones[0].busy, st.zones[1].busy), (0, 1));
    }
}

mod accessors {
    use super::*;

    fn sched() -> SchedParams {
        SchedParams {
            order: Order::Fifo,
            max_queue_length: 3,
            max_queue_wait: ms(4_000),
            default_processing: ms(100),
            fair_choice_window: ms(60_000),
        }
    }

    /// The gateway decides from these whether it measures VM response times, runs the
    /// queue's accounting and serves `/status` sections: each is on exactly when its
    /// component is configured.
    #[test]
    fn the_configured_components_are_reported() {
        let plain = libra_core(1, vec![], None);
        assert!(!plain.has_queue() && !plain.adapts_r_max() && plain.delay_queue().is_none());
        let queued = libra_core(1, vec![], None).with_queue(Some(sched()), Vec::new(), 8);
        assert!(queued.has_queue());
        assert!(!queued.adapts_r_max());
        let adaptive = libra_core(1, vec![], None).with_adaptive_r_max(Some(rmax()));
        assert!(adaptive.adapts_r_max());
        assert!(!adaptive.has_queue());
    }

    /// The delay queue's read-only view (the gateway's `/status` and its store) shows
    /// the calls waiting in it and its mode.
    #[test]
    fn the_delay_queue_view_shows_the_waiting_calls() {
        let params = DelayParams {
            busy_utilisation: 0.6,
            ..DelayParams::default()
        };
        let mut core = libra_core(0, vec![], None).with_delay_queue(Some(params.clone()));
        core.on_cpu_sample(ms(0), 0.9);
        assert_eq!(core.delay_queue().map(DelayQueue::mode), Some(Mode::Busy));
        // Busy, deadlines far past the urgency window: both wait.
        for id in [3_u128, 5] {
            assert!(core.enqueue_async(ms(10), CallId(id), Duration::from_secs(600), ms(10)));
        }
        assert!(core.poll_release().is_none());
        let q = core.delay_queue().expect("configured");
        assert_eq!((q.len(), q.params()), (2, &params));
    }
}

mod delayed {
    use super::*;

    fn delay() -> DelayParams {
        DelayParams {
            busy_utilisation: 0.6,
            sample_interval: Duration::from_secs(1),
            window: Duration::from_secs(3),
            min_switch: Duration::ZERO,
            urgency_window: Duration::from_secs(8),
            release_batch: 3,
            deadline_margin: Duration::from_secs(2),
            expected_processing: ms(1_500),
            vm_slots: Some(2),
        }
    }

    fn count(core: &Core, kind: &str, tier: &str) -> u64 {
        core.status()
            .delay
            .unwrap()
            .released
            .iter()
            .find(|c| c.kind == kind && c.tier == tier)
            .unwrap()
            .count
    }

    /// ProFaaStinate §3 in `/status`: releases are counted per kind and the tier their
    /// first attempt went to — an idle release that took a VM slot under `vm`, a forced
    /// one under `function`.
    #[test]
    fn releases_are_counted_under_the_tier_they_went_to() {
        let zones = vec![concurrency("fn", ZoneKind::Cloud, 4)];
        let mut core = libra_core(1, zones, None).with_delay_queue(Some(delay()));
        let t0 = ms(10);
        let p = delay();
        // Inside its forced window (deadline − E[p] − margin ≤ now): the function tier.
        let forced = t0 + p.expected_processing + p.deadline_margin - ms(300);
        assert!(core.enqueue_async(t0, CallId(1), forced, t0));
        assert!(core.enqueue_async(t0, CallId(2), Duration::from_secs(500), t0));
        let first = core.poll_release().unwrap();
        assert_eq!(first.kind, ReleaseKind::Forced);
        assert!(matches!(first.decision, Decision::Function { .. }));
        let second = core.poll_release().unwrap();
        assert_eq!(second.kind, ReleaseKind::Idle);
        assert!(matches!(second.decision, Decision::Vm { .. }));
        assert_eq!(
            [
                count(&core, "idle", "vm"),
                count(&core, "idle", "function"),
                count(&core, "forced", "function"),
                count(&core, "forced", "vm"),
            ],
            [1, 0, 1, 0]
        );
    }

    /// A released call's end is accounted (ProFaaStinate §3, `/status`): a call that
    /// finishes after its deadline is a miss, one before is not; `E[p]` moves towards the
    /// processing times seen (an EWMA: strictly between the old value and the sample).
    #[test]
    fn finished_calls_count_misses_and_move_the_expected_processing() {
        let mut core = libra_core(1, vec![], None).with_delay_queue(Some(delay()));
        let before = core.status().delay.unwrap().expected_processing;
        assert_eq!(before, delay().expected_processing);
        let deadline = Duration::from_secs(30);
        core.on_async_finished(deadline + ms(1), deadline, ms(4_000));
        let st = core.status().delay.unwrap();
        assert_eq!((st.finished, st.deadline_misses), (1, 1));
        assert!(
            st.expected_processing > before && st.expected_processing < ms(4_000),
            "{:?}",
            st.expected_processing
        );
        core.on_async_finished(deadline, deadline, ms(4_000));
        let st = core.status().delay.unwrap();
        assert_eq!(
            (st.finished, st.deadline_misses),
            (2, 1),
            "at the deadline is in time"
        );
    }
}

mod tuning {
    use super::*;

    fn tuning(alpha: f64, rho: f64, r_max_rps: f64) -> LibraTuning {
        LibraTuning {
            alpha,
            beta: 0.2,
            decision_epochs: 1000,
            first_decision_epoch: None,
            scaling: libra_params(r_max_rps),
            rho,
        }
    }

    /// `/status` shows LIBRA's parameters in force; a reload's retune applies new ones
    /// (and says so) to a LIBRA core, and is refused by a baseline, which has none.
    #[test]
    fn a_reload_retunes_libra_and_not_a_baseline() {
        let mut core = libra_core(1, vec![], None);
        assert_eq!(core.tuning(), Some(tuning(0.3, 0.8, 10.0)));
        let new = tuning(0.45, 0.6, 7.0);
        assert!(core.retune(ms(2_000), &new));
        assert_eq!(core.tuning(), Some(new.clone()));
        assert_eq!(core.status().controller.r_max_rps, 7.0);

        let mut baseline = Core::new(
            CoreParams {
                controller: ControllerParams {
                    monitor: monitor(Duration::from_secs(60)),
                    r_max_rps: 10.0,
                    execute_scaling: true,
                },
                placement: PlacementParams {
                    zones: vec![],
                    policy: PlacementPolicy::EdgeFirst,
                },
                vm_boot_timeout: None,
            },
            Box::new(FixedScaler::max(3)),
            Box::new(VmFirst::new(0.8)),
        );
        baseline.start(Time::ZERO);
        assert_eq!(baseline.tuning(), None);
        assert!(!baseline.retune(ms(2_000), &new));
        assert_eq!(baseline.tuning(), None);
    }
}

mod instances {
    use super::*;

    /// One pool zone, keep-alive 2 s; one call cold-starts an instance at 0.5 s (ready
    /// 0.7 s, done 1.25 s); it expires at 3.25 s and is reported stopped at 4 s.
    fn expired(history: bool) -> (Core, ZoneId, Duration) {
        let keep_alive = Duration::from_secs(2);
        let mut core = Core::new(
            CoreParams {
                controller: ControllerParams {
                    monitor: monitor(Duration::from_secs(60)),
                    r_max_rps: 10.0,
                    execute_scaling: true,
                },
                placement: PlacementParams::single(
                    "fn",
                    ZoneCapacity::Instances(FunctionPoolParams {
                        keep_alive,
                        max_instances: Some(3),
                        prewarmed: 0,
                        warm_order: WarmOrder::Newest,
                    }),
                ),
                vm_boot_timeout: None,
            },
            Box::new(FixedScaler::faas()),
            Box::new(FunctionOnly),
        );
        if history {
            core.keep_function_history();
        }
        core.start(Time::ZERO);
        let mut t = idempotent();
        let Decision::Function { lease, .. } = core.route(ms(500), &mut t) else {
            panic!()
        };
        let instance = lease.instance().unwrap();
        core.on_instance_started(ms(700), lease.zone, instance);
        core.on_function_finished(ms(1_250), lease);
        let expiry = ms(1_250) + keep_alive;
        core.handle_timeout(expiry);
        assert!(drain(&mut core).contains(&Action::StopInstance {
            zone: lease.zone,
            instance
        }));
        assert_eq!(core.status().zones[0].stopping, 1);
        let stopped = ms(4_000);
        core.on_instance_stopped(stopped, lease.zone, instance);
        (core, lease.zone, stopped - expiry)
    }

    /// FaaSim usage (papers.md §2): an expired instance's shutdown time runs from its
    /// expiry until the driver reports it stopped; it then no longer shows as stopping.
    #[test]
    fn a_stopped_instance_ends_its_shutdown_time() {
        let (core, zone, shutdown) = expired(false);
        let z = &core.status().zones[zone.0 as usize];
        assert_eq!(z.stopping, 0);
        assert_eq!(z.usage.unwrap().shutdown, shutdown);
        assert!(
            z.instances.is_empty(),
            "a gateway lists live instances only"
        );
    }

    /// The simulator's per-instance report keeps stopped instances when asked.
    #[test]
    fn kept_history_lists_the_stopped_instance() {
        let (core, zone, shutdown) = expired(true);
        let z = &core.status().zones[zone.0 as usize];
        assert_eq!(z.instances.len(), 1);
        let i = z.instances[0];
        assert_eq!((i.stopped_at, i.shutdown), (Some(ms(4_000)), shutdown));
    }
}

/// Initial target 1; at the end of epoch 1 target 2, of epoch 2 target 1 (budget 0).
struct Scripted;

impl ScalingPolicy for Scripted {
    fn name(&self) -> &'static str {
        "scripted"
    }
    fn initial(&self) -> ScaleDecision {
        ScaleDecision {
            target_vms: 1,
            vm_reqs_rps: 0.0,
            reason: ScaleReason::Baseline,
        }
    }
    fn on_epoch(&mut self, now: Time, _: &EpochObservation) -> Option<ScaleDecision> {
        let target_vms = match now.as_millis() {
            2_000 => 2,
            4_000 => 1,
            _ => return None,
        };
        Some(ScaleDecision {
            target_vms,
            vm_reqs_rps: 0.0,
            reason: ScaleReason::Baseline,
        })
    }
}

/// A scale-in that cancels a booting VM drops that VM's boot deadline and only its own:
/// the VM still booting keeps its deadline and is given up there.
#[test]
fn a_cancelled_boot_drops_only_its_own_deadline() {
    let boot = ms(7_000);
    let mut core = Core::new(
        CoreParams {
            controller: ControllerParams {
                monitor: monitor(ms(2_000)),
                r_max_rps: 10.0,
                execute_scaling: true,
            },
            placement: PlacementParams {
                zones: vec![],
                policy: PlacementPolicy::EdgeFirst,
            },
            vm_boot_timeout: Some(boot),
        },
        Box::new(Scripted),
        Box::new(VmFirst::new(0.8)),
    );
    let launches = |a: &[Action]| -> Vec<VmId> {
        a.iter()
            .filter_map(|a| match a {
                Action::Scaling(controller::Action::Launch { vm }) => Some(*vm),
                _ => None,
            })
            .collect()
    };
    let start = ms(1_500);
    core.start(start);
    let first = launches(&drain(&mut core));
    assert_eq!(first.len(), 1);
    core.handle_timeout(ms(2_000));
    let second = launches(&drain(&mut core));
    assert_eq!(second.len(), 1);
    assert_eq!(core.next_timer(), (Timer::EpochEnd, ms(4_000)));
    core.handle_timeout(ms(4_000));
    assert!(
        drain(&mut core).contains(&Action::Scaling(controller::Action::Stop { vm: second[0] })),
        "the newest booting VM is cancelled"
    );
    // Idle epochs until the first VM's deadline (the second's would be 2 s + 7 s).
    while core.next_timer().0 == Timer::EpochEnd {
        let at = core.poll_timeout();
        assert!(at < start + boot);
        core.handle_timeout(at);
    }
    drain(&mut core);
    assert_eq!(core.next_timer(), (Timer::VmBoot, start + boot));
    core.handle_timeout(start + boot);
    assert!(drain(&mut core).contains(&Action::VmBootTimedOut { vm: first[0] }));
    assert_eq!(core.controller().pool().booting, 0);
    assert_eq!(core.next_timer().0, Timer::EpochEnd);
}

/// LIBRA §III-B load hold: latency below target while two ready VMs served fewer than
/// `min_load_fraction · r_max` requests/s each says nothing about r_max, so r_max is not
/// raised; the report shows the requests per ready-VM second it judged by.
#[test]
fn adaptive_r_max_holds_when_the_ready_vms_ran_light() {
    let params = rmax();
    let period = params.period;
    let mut core = Core::new(
        CoreParams {
            controller: ControllerParams {
                monitor: monitor(Duration::from_secs(60)),
                r_max_rps: 10.0,
                execute_scaling: false,
            },
            placement: PlacementParams {
                zones: vec![],
                policy: PlacementPolicy::EdgeFirst,
            },
            vm_boot_timeout: None,
        },
        Box::new(LibraScaler::new(libra_params(10.0))),
        Box::new(VmFirst::new(0.8)),
    )
    .with_adaptive_r_max(Some(params.clone()));
    let ready = 2_u32;
    for _ in 0..ready {
        core.adopt_ready_vm(Time::ZERO);
    }
    core.start(Time::ZERO);
    let samples = 20_u32;
    for i in 0..samples {
        core.on_vm_response_time(ms(200) * i, ms(50));
    }
    core.handle_timeout(period);
    let st = core.status().r_max.unwrap();
    let last = st.last.unwrap();
    let per_vm = f64::from(samples) / (f64::from(ready) * period.as_secs_f64());
    assert!(per_vm < params.min_load_fraction * params.start_rps);
    assert_eq!(last.per_vm_rps, Some(per_vm));
    assert_eq!(last.hold, Some(Hold::VmsBelowRMax));
    assert_eq!(st.r_max_rps, params.start_rps, "not raised");
    assert_eq!(core.status().controller.r_max_rps, params.start_rps);
}

/// An idle epoch that ends exactly at `until` is closed (the simulator skips
/// to `until` and must find that epoch's scaling decision taken).
#[test]
fn an_idle_epoch_ending_exactly_at_until_is_closed() {
    let epoch = ms(2_000);
    let mut core = Core::new(
        CoreParams {
            controller: ControllerParams {
                monitor: monitor(epoch),
                r_max_rps: 10.0,
                execute_scaling: true,
            },
            placement: PlacementParams {
                zones: vec![concurrency("fn", ZoneKind::Cloud, 4)],
                policy: PlacementPolicy::EdgeFirst,
            },
            vm_boot_timeout: None,
        },
        Box::new(LibraScaler::new(libra_params(10.0))),
        Box::new(VmFirst::new(0.8)),
    );
    core.start(ms(500));
    assert_eq!(core.poll_timeout(), epoch);
    assert_eq!(core.close_idle_epochs(epoch, None), Some(epoch));
    assert_eq!(core.controller().monitor().current_epoch(), 1);
    assert_eq!(core.poll_timeout(), epoch * 2);
    // The next one likewise, and nothing before it.
    assert_eq!(core.close_idle_epochs(epoch * 2 - ms(1), None), None);
    assert_eq!(core.close_idle_epochs(epoch * 2, None), Some(epoch * 2));
    assert_eq!(core.controller().monitor().current_epoch(), 2);
}
