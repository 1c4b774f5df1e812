//! Unit tests of the policy core's public functions, written against the mutants
//! cargo-mutants found uncaught (`scripts/mutants.sh`). Every expectation is
//! computed here from the formula in the module's docs, with asymmetric parameters, so
//! a swapped operator or a constant body changes the answer.
//!
//! The modules are named `policy::<file>` so the mutation run's test filter (`policy::`)
//! picks them up.

mod policy {
    mod cost {
        use std::time::Duration;

        use spillway_policy::cost::{
            Architecture, DEFAULT_LAMBDA_ARM64_GB_SECOND_USD, DEFAULT_LAMBDA_REQUEST_USD,
            FunctionPricing, faas_cost_per_second, hybrid_cost_per_second, iaas_cost_per_second,
        };

        fn close(a: f64, b: f64) -> bool {
            (a - b).abs() <= 1e-12 * b.abs().max(1e-12)
        }

        /// LIBRA §II: billed GB-seconds are memory (GB, 1 GB = 1024 MB) times the duration
        /// rounded up to the millisecond.
        #[test]
        fn gb_seconds_are_memory_in_gb_times_billed_seconds() {
            // 1536 MB for 2.5004 s bills 2.501 s: 1.5 GB · 2.501 s.
            let gbs = FunctionPricing::gb_seconds(1536, Duration::from_micros(2_500_400));
            assert!(close(gbs, 1.5 * 2.501), "{gbs}");
            // 256 MB for exactly 40 ms: 0.25 GB · 0.040 s.
            let gbs = FunctionPricing::gb_seconds(256, Duration::from_millis(40));
            assert!(close(gbs, 0.25 * 0.040), "{gbs}");
        }

        /// The arm64 price is the arm64 list price; one call costs compute + request fee
        /// + API-gateway fee, each counted once.
        #[test]
        fn arm64_call_cost_adds_each_fee_once() {
            let p = FunctionPricing::lambda(Architecture::Arm64);
            assert_eq!(p.gb_second_usd, DEFAULT_LAMBDA_ARM64_GB_SECOND_USD);
            assert_eq!(p.request_usd, DEFAULT_LAMBDA_REQUEST_USD);
            assert_eq!(p.api_gateway_request_usd, 0.0);
            let p = FunctionPricing {
                gb_second_usd: 3e-5,
                request_usd: 7e-7,
                api_gateway_request_usd: 2e-6,
            };
            // 2048 MB for 300 ms: 2 GB · 0.3 s = 0.6 GB-s.
            let c = p.cost_per_request(2048, Duration::from_millis(300));
            assert!(close(c, 0.6 * 3e-5 + 7e-7 + 2e-6), "{c}");
        }

        /// FaaS cost per second: rate × cost per call.
        #[test]
        fn faas_cost_is_rate_times_call_cost() {
            let c = faas_cost_per_second(7.0, 3e-6);
            assert!(close(c, 2.1e-5), "{c}");
            assert_eq!(faas_cost_per_second(0.0, 3e-6), 0.0);
        }

        /// IaaS cost per second: ceil(N / r_max) whole VMs at the hourly price / 3600.
        #[test]
        fn iaas_cost_pays_for_whole_vms() {
            let hourly = 0.10;
            // 33 req/s at 16 per VM needs 3 VMs (2 are full, the third holds 1 req/s).
            let c = iaas_cost_per_second(33.0, 16.0, hourly);
            assert!(close(c, 3.0 * hourly / 3600.0), "{c}");
            // Exactly full: 32 req/s is 2 VMs.
            let c = iaas_cost_per_second(32.0, 16.0, hourly);
            assert!(close(c, 2.0 * hourly / 3600.0), "{c}");
            assert_eq!(iaas_cost_per_second(0.0, 16.0, hourly), 0.0);
        }

        /// Hybrid cost (LIBRA's split): the full VMs plus the remainder on functions, the
        /// remainder costing at most one more VM.
        #[test]
        fn hybrid_cost_is_full_vms_plus_the_cheaper_of_functions_and_one_vm() {
            let hourly = 0.10;
            let vm_s = hourly / 3600.0;
            // 37 req/s, r_max 16: 2 full VMs and 5 req/s left over.
            // Cheap calls: 5 · 2e-6 = 1e-5 USD/s < one VM (2.78e-5 USD/s).
            let c = hybrid_cost_per_second(37.0, 16.0, hourly, 2e-6);
            assert!(close(c, 2.0 * vm_s + 5.0 * 2e-6), "{c}");
            // Dear calls: 5 · 1e-5 = 5e-5 USD/s > one VM, so a third VM is cheaper.
            let c = hybrid_cost_per_second(37.0, 16.0, hourly, 1e-5);
            assert!(close(c, 3.0 * vm_s), "{c}");
            // Below one VM's capacity: all on functions.
            let c = hybrid_cost_per_second(3.0, 16.0, hourly, 2e-6);
            assert!(close(c, 3.0 * 2e-6), "{c}");
        }
    }

    mod controller {
        //! The controller's bookkeeping, observed through a scripted scaling policy and
        //! router that record what the controller hands them (LIBRA §III, Fig. 2).

        use parking_lot::Mutex;
        use std::collections::VecDeque;
        use std::sync::Arc;
        use std::time::Duration;

        use spillway_policy::VmId;
        use spillway_policy::balancer::{
            Attempt, RequestMeta, Route, RouteReason, RoutingPolicy, VmState, VmTable,
        };
        use spillway_policy::controller::{
            Action, Controller, ControllerParams, RoutedTotals, ScaleDirection,
        };
        use spillway_policy::monitor::MonitorParams;
        use spillway_policy::scaling::{
            EpochObservation, PoolSnapshot, ScaleDecision, ScaleReason, ScalingPolicy,
        };

        /// An asymmetric epoch (0.7 s) so that an epoch end is not a whole second.
        const EPOCH: Duration = Duration::from_millis(700);
        const R_MAX: f64 = 7.5;

        /// What the scripted policies saw, shared with the test.
        #[derive(Default)]
        struct Log {
            /// Every `set_vm_budget` call: (time, budget).
            budgets: Vec<(Duration, f64)>,
            /// Every `on_epoch` call: (time, observation).
            epochs: Vec<(Duration, EpochObservation)>,
            /// Every `set_r_max` the scaler received.
            r_max: Vec<f64>,
            /// What the router answers next (default: a function).
            route: Option<Route>,
            /// Whether the router gives a deferred call a token.
            deny_deferred: bool,
            /// The scaler's decisions, one per epoch (`None`: no decision).
            decisions: VecDeque<Option<ScaleDecision>>,
        }

        type Shared = Arc<Mutex<Log>>;

        struct Scaler(Shared, ScaleDecision);

        impl ScalingPolicy for Scaler {
            fn name(&self) -> &'static str {
                "scripted"
            }
            fn initial(&self) -> ScaleDecision {
                self.1
            }
            fn on_epoch(&mut self, now: Duration, obs: &EpochObservation) -> Option<ScaleDecision> {
                let mut log = self.0.lock();
                log.epochs.push((now, *obs));
                log.decisions.pop_front().flatten()
            }
            fn set_r_max(&mut self, r_max_rps: f64) {
                self.0.lock().r_max.push(r_max_rps);
            }
        }

        struct Router(Shared);

        impl RoutingPolicy for Router {
            fn name(&self) -> &'static str {
                "scripted"
            }
            fn set_vm_budget(&mut self, now: Duration, vm_reqs_rps: f64) {
                self.0.lock().budgets.push((now, vm_reqs_rps));
            }
            fn route(&mut self, _: Duration, _: &RequestMeta, _: Attempt, _: &VmTable) -> Route {
                self.0.lock().route.unwrap_or(Route::Function {
                    reason: RouteReason::BudgetExhausted,
                })
            }
            fn take_deferred_token(&mut self, _: Duration) -> bool {
                !self.0.lock().deny_deferred
            }
        }

        fn decision(target_vms: u32, vm_reqs_rps: f64) -> ScaleDecision {
            ScaleDecision {
                target_vms,
                vm_reqs_rps,
                reason: ScaleReason::Provision,
            }
        }

        /// A controller whose scaler starts with `initial` (not started yet).
        fn controller(initial: ScaleDecision, execute_scaling: bool) -> (Controller, Shared) {
            let log = Shared::default();
            let params = ControllerParams {
                monitor: MonitorParams {
                    epoch: EPOCH,
                    alpha: 0.3,
                    beta: 0.2,
                    decision_epochs: 1,
                    first_decision_epoch: None,
                },
                r_max_rps: R_MAX,
                execute_scaling,
            };
            let c = Controller::new(
                params,
                Box::new(Scaler(log.clone(), initial)),
                Box::new(Router(log.clone())),
            );
            (c, log)
        }

        fn actions(c: &mut Controller) -> Vec<Action> {
            std::iter::from_fn(|| c.poll_action()).collect()
        }

        fn launched(a: &[Action]) -> Vec<VmId> {
            a.iter()
                .filter_map(|a| match a {
                    Action::Launch { vm } => Some(*vm),
                    _ => None,
                })
                .collect()
        }

        fn set_route(log: &Shared, route: Route) {
            log.lock().route = Some(route);
        }

        fn last_budget(log: &Shared) -> Option<f64> {
            log.lock().budgets.last().map(|b| b.1)
        }

        const PLAIN: RequestMeta = RequestMeta {
            upgrade: false,
            idempotent: true,
        };

        #[test]
        fn direction_labels() {
            assert_eq!(ScaleDirection::Up.as_str(), "up");
            assert_eq!(ScaleDirection::Down.as_str(), "down");
            assert_eq!(ScaleDirection::Hold.as_str(), "hold");
        }

        /// Start launches the initial target and publishes min(vm_reqs, ready · r_max);
        /// a report-only pool publishes the adopted VMs' whole capacity instead.
        #[test]
        fn start_launches_the_initial_target_and_a_static_pool_publishes_its_capacity() {
            let (mut c, log) = controller(decision(3, 11.0), true);
            c.start(Duration::ZERO);
            let a = actions(&mut c);
            let ids = launched(&a);
            assert_eq!(ids.len(), 3, "{a:?}");
            assert_eq!(ids, vec![VmId(0), VmId(1), VmId(2)], "ids increase from 0");
            assert!(
                !a.iter().any(|a| matches!(a, Action::Decided { .. })),
                "start is not a recorded decision"
            );
            let st = c.status();
            assert_eq!(st.vm_reqs_rps, 11.0);
            assert_eq!(st.pool.target, 3);
            // Nothing ready: the budget stays 0 (no call, since it did not change).
            assert_eq!(st.published_vm_reqs_rps, 0.0);
            c.on_vm_ready(Duration::from_millis(10), ids[0]);
            assert_eq!(last_budget(&log), Some(R_MAX), "min(11, 1 · 7.5)");
            c.on_vm_ready(Duration::from_millis(20), ids[1]);
            assert_eq!(last_budget(&log), Some(11.0), "min(11, 2 · 7.5)");
            assert_eq!(c.status().published_vm_reqs_rps, 11.0);

            // Report-only: two adopted VMs, a decision of 0 VMs and 1 req/s.
            let (mut s, slog) = controller(decision(0, 1.0), false);
            let a = s.adopt_ready_vm(Duration::ZERO);
            let b = s.adopt_ready_vm(Duration::ZERO);
            assert_ne!(a, b, "each adopted VM gets its own id");
            s.start(Duration::ZERO);
            assert!(actions(&mut s).is_empty(), "a static pool launches nothing");
            assert_eq!(last_budget(&slog), Some(2.0 * R_MAX));
            assert_eq!(s.status().vm_reqs_rps, f64::INFINITY);
            assert_eq!(
                s.pool().target,
                0,
                "adopting does not raise a report-only target"
            );
        }

        /// Adopting ready VMs raises an executing pool's target to the active count.
        #[test]
        fn adopted_vms_raise_the_target_of_an_executing_pool() {
            let (mut c, log) = controller(decision(0, 100.0), true);
            c.start(Duration::ZERO);
            let a = c.adopt_ready_vm(Duration::ZERO);
            let b = c.adopt_ready_vm(Duration::ZERO);
            assert_eq!((a, b), (VmId(0), VmId(1)));
            assert_eq!(
                c.pool(),
                PoolSnapshot {
                    booting: 0,
                    ready: 2,
                    draining: 0,
                    target: 2
                }
            );
            assert_eq!(last_budget(&log), Some(2.0 * R_MAX), "min(100, 2 · 7.5)");
            assert_eq!(c.vms().rows().len(), 2);
            assert_eq!(c.r_max(), R_MAX);
        }

        /// Every route kind is counted once in the totals; only first attempts count in
        /// the traffic monitor and in the epoch's VM requests; the epoch observation
        /// carries the epoch length, the utilisation the driver set (for that epoch
        /// only) and is taken at the epoch's end, not at the late event that closed it.
        #[test]
        fn routes_are_counted_by_kind_and_attempt_in_totals_and_epoch_observations() {
            let (mut c, log) = controller(decision(0, 100.0), true);
            c.start(Duration::ZERO);
            let vm = c.adopt_ready_vm(Duration::ZERO);
            let t = Duration::from_millis(100);
            set_route(
                &log,
                Route::Vm {
                    vm,
                    reason: RouteReason::WithinBudget,
                },
            );
            for _ in 0..3 {
                c.route(t, &PLAIN, Attempt::First);
            }
            for _ in 0..2 {
                c.route(
                    t,
                    &PLAIN,
                    Attempt::RetryAfterConnectFailure { failed: VmId(9) },
                );
            }
            set_route(
                &log,
                Route::Function {
                    reason: RouteReason::BudgetExhausted,
                },
            );
            for _ in 0..4 {
                c.route(t, &PLAIN, Attempt::First);
            }
            set_route(
                &log,
                Route::Reject {
                    reason: RouteReason::SpillBackRejected,
                },
            );
            c.route(t, &PLAIN, Attempt::First);
            c.count_function_attempt();
            c.count_deferred_function(t);
            assert_eq!(c.vms().get(vm).unwrap().outstanding, 5);
            assert_eq!(
                c.status().routed,
                RoutedTotals {
                    vm: 5,
                    function: 4 + 1 + 1,
                    rejected: 1
                }
            );
            c.set_vm_utilisation(0.37);
            assert_eq!(c.poll_timeout(), EPOCH);
            // Closed late: the observation is still stamped with the epoch's end.
            c.handle_timeout(EPOCH + Duration::from_millis(150));
            {
                let log = log.lock();
                assert_eq!(log.epochs.len(), 1);
                let (at, obs) = log.epochs[0];
                assert_eq!(at, EPOCH);
                // 3 + 4 + 1 first attempts and one deferred function call.
                assert_eq!(obs.traffic.requests, 9);
                assert_eq!(obs.traffic.epoch, 0);
                assert_eq!(obs.vm_requests, 3);
                assert_eq!(obs.function_requests, 5);
                assert_eq!(obs.vm_utilisation, Some(0.37));
                assert_eq!(obs.epoch, EPOCH);
                assert_eq!(
                    obs.pool,
                    PoolSnapshot {
                        booting: 0,
                        ready: 1,
                        draining: 0,
                        target: 1
                    }
                );
            }
            let st = c.status();
            assert_eq!(st.epoch, Some(0));
            assert_eq!(st.last_epoch_requests, 9);
            // The first epoch sets avg to its rate (9 / 0.7 s) and std to 0.
            assert!(
                (st.avg_rps - 9.0 / EPOCH.as_secs_f64()).abs() < 1e-9,
                "{st:?}"
            );
            assert_eq!(st.std_rps, 0.0);
            assert_eq!(st.r_max_rps, R_MAX);
            assert_eq!(c.monitor().current_epoch(), 1);
            assert_eq!(c.poll_timeout(), EPOCH * 2);
            // The next epoch starts from zero and without a utilisation.
            c.handle_timeout(EPOCH * 2);
            let log = log.lock();
            let (at, obs) = log.epochs[1];
            assert_eq!(at, EPOCH * 2);
            assert_eq!(
                (obs.traffic.requests, obs.vm_requests, obs.function_requests),
                (0, 0, 0)
            );
            assert_eq!(obs.vm_utilisation, None);
        }

        /// A request arriving exactly at the epoch end belongs to the next epoch: the
        /// epoch closes first.
        #[test]
        fn an_event_at_the_epoch_end_closes_the_epoch_first() {
            let (mut c, log) = controller(decision(0, 0.0), true);
            c.start(Duration::ZERO);
            c.route(Duration::from_millis(1), &PLAIN, Attempt::First);
            c.route(EPOCH, &PLAIN, Attempt::First);
            let log = log.lock();
            assert_eq!(log.epochs.len(), 1);
            assert_eq!(log.epochs[0].1.traffic.requests, 1);
            assert_eq!(c.monitor().current_epoch_requests(), 1);
        }

        /// A slot for a queued call: granted like a VM route (outstanding and total), but
        /// it is no new request (monitor and epoch VM count unchanged); refused: nothing
        /// counted.
        #[test]
        fn a_granted_vm_slot_counts_as_outstanding_but_not_as_a_new_request() {
            let (mut c, log) = controller(decision(0, 100.0), true);
            c.start(Duration::ZERO);
            let vm = c.adopt_ready_vm(Duration::ZERO);
            let t = Duration::from_millis(50);
            assert_eq!(
                c.try_vm_slot(t, &PLAIN),
                None,
                "the router answers a function"
            );
            assert_eq!(c.status().routed, RoutedTotals::default());
            set_route(
                &log,
                Route::Vm {
                    vm,
                    reason: RouteReason::FallBackOverBudget,
                },
            );
            assert_eq!(c.try_vm_slot(t, &PLAIN), Some(vm));
            assert_eq!(c.try_vm_slot(t, &PLAIN), Some(vm));
            assert_eq!(c.vms().get(vm).unwrap().outstanding, 2);
            assert_eq!(
                c.status().routed,
                RoutedTotals {
                    vm: 2,
                    function: 0,
                    rejected: 0
                }
            );
            assert_eq!(c.monitor().current_epoch_requests(), 0);
            c.handle_timeout(EPOCH);
            assert_eq!(log.lock().epochs[0].1.vm_requests, 0);
        }

        /// An idle-mode release takes the least-loaded ready VM while it is below `slots`
        /// and the router gives a token; admitted calls count as requests and VM routes.
        #[test]
        fn deferred_calls_are_admitted_to_the_least_loaded_vm_below_its_slots() {
            let (mut c, log) = controller(decision(0, 100.0), true);
            c.start(Duration::ZERO);
            let a = c.adopt_ready_vm(Duration::ZERO);
            let b = c.adopt_ready_vm(Duration::ZERO);
            let t = Duration::from_millis(30);
            assert_eq!(c.admit_deferred(t, Some(2)), Some(a), "ties: the oldest");
            assert_eq!(c.admit_deferred(t, Some(2)), Some(b));
            assert_eq!(c.admit_deferred(t, Some(2)), Some(a));
            assert_eq!(c.admit_deferred(t, Some(2)), Some(b));
            // Both at 2 outstanding = slots: no admission.
            assert_eq!(c.admit_deferred(t, Some(2)), None);
            // Without a slot cap the least-loaded one still takes it.
            assert_eq!(c.admit_deferred(t, None), Some(a));
            log.lock().deny_deferred = true;
            assert_eq!(c.admit_deferred(t, None), None, "no token");
            let (oa, ob) = (
                c.vms().get(a).unwrap().outstanding,
                c.vms().get(b).unwrap().outstanding,
            );
            assert_eq!((oa, ob), (3, 2));
            assert_eq!(
                c.status().routed,
                RoutedTotals {
                    vm: 5,
                    function: 0,
                    rejected: 0
                }
            );
            assert_eq!(c.monitor().current_epoch_requests(), 5);
            c.handle_timeout(EPOCH);
            assert_eq!(log.lock().epochs[0].1.vm_requests, 5);
            // No ready VM: nothing to admit.
            let (mut e, _) = controller(decision(0, 100.0), true);
            e.start(Duration::ZERO);
            assert_eq!(e.admit_deferred(t, None), None);
        }

        /// Scaling in cancels booting VMs first (newest first), then drains the ready VMs
        /// with the fewest outstanding requests; an idle drained VM stops at once, a busy
        /// one when its last request finishes. Each decision is recorded with its
        /// direction, and the budget is republished.
        #[test]
        fn scaling_in_cancels_booting_vms_first_then_drains_the_least_loaded() {
            let (mut c, log) = controller(decision(5, 100.0), true);
            c.start(Duration::ZERO);
            let ids = launched(&actions(&mut c));
            assert_eq!(ids.len(), 5);
            // 0, 1, 2 ready; 3, 4 still booting. VM 0 gets 2 requests, VM 1 one.
            for vm in &ids[..3] {
                c.on_vm_ready(Duration::from_millis(5), *vm);
            }
            let t = Duration::from_millis(10);
            for (vm, n) in [(ids[0], 2), (ids[1], 1)] {
                set_route(
                    &log,
                    Route::Vm {
                        vm,
                        reason: RouteReason::WithinBudget,
                    },
                );
                for _ in 0..n {
                    c.route(t, &PLAIN, Attempt::First);
                }
            }
            assert_eq!(last_budget(&log), Some(3.0 * R_MAX));
            {
                let mut l = log.lock();
                l.decisions.push_back(Some(decision(4, 9.0))); // epoch 0: −1
                l.decisions.push_back(Some(decision(1, 6.0))); // epoch 1: −3
                l.decisions.push_back(Some(decision(1, 6.0))); // epoch 2: hold
                l.decisions.push_back(Some(decision(2, 6.0))); // epoch 3: +1
            }
            c.handle_timeout(EPOCH);
            // One too many: the newest booting VM is cancelled, no ready VM drains.
            assert_eq!(
                actions(&mut c),
                vec![
                    Action::Decided {
                        epoch: 0,
                        decision: decision(4, 9.0),
                        direction: ScaleDirection::Down
                    },
                    Action::Stop { vm: ids[4] },
                ]
            );
            assert_eq!(last_budget(&log), Some(9.0), "min(9, 3 · 7.5)");
            c.handle_timeout(EPOCH * 2);
            // Three too many: the last booting VM, then the idle ready VM 2 (stops at
            // once), then VM 1 (one outstanding: drains).
            assert_eq!(
                actions(&mut c),
                vec![
                    Action::Decided {
                        epoch: 1,
                        decision: decision(1, 6.0),
                        direction: ScaleDirection::Down
                    },
                    Action::Stop { vm: ids[3] },
                    Action::Drain { vm: ids[2] },
                    Action::Stop { vm: ids[2] },
                    Action::Drain { vm: ids[1] },
                ]
            );
            assert_eq!(
                c.pool(),
                PoolSnapshot {
                    booting: 0,
                    ready: 1,
                    draining: 1,
                    target: 1
                }
            );
            assert_eq!(last_budget(&log), Some(6.0), "min(6, 1 · 7.5)");
            // A draining VM does not become ready again.
            c.on_vm_ready(Duration::from_millis(1500), ids[1]);
            assert_eq!(c.vms().get(ids[1]).unwrap().state, VmState::Draining);
            c.handle_timeout(EPOCH * 3);
            assert_eq!(
                actions(&mut c),
                vec![Action::Decided {
                    epoch: 2,
                    decision: decision(1, 6.0),
                    direction: ScaleDirection::Hold
                }]
            );
            c.on_vm_request_finished(Duration::from_millis(2200), ids[1]);
            assert_eq!(actions(&mut c), vec![Action::Stop { vm: ids[1] }]);
            assert!(c.vms().get(ids[1]).is_none());
            c.handle_timeout(EPOCH * 4);
            let a = actions(&mut c);
            assert_eq!(
                a,
                vec![
                    Action::Decided {
                        epoch: 3,
                        decision: decision(2, 6.0),
                        direction: ScaleDirection::Up
                    },
                    Action::Launch { vm: VmId(5) },
                ]
            );
            // A finished request on a ready VM stops nothing.
            c.on_vm_request_finished(Duration::from_millis(2900), ids[0]);
            assert!(actions(&mut c).is_empty());
            assert_eq!(c.vms().get(ids[0]).unwrap().outstanding, 1);
        }

        /// A draining VM with two requests stops after the second finishes, not the first.
        #[test]
        fn a_draining_vm_stops_after_its_last_request() {
            let (mut c, log) = controller(decision(1, 100.0), true);
            c.start(Duration::ZERO);
            let vm = launched(&actions(&mut c))[0];
            c.on_vm_ready(Duration::ZERO, vm);
            set_route(
                &log,
                Route::Vm {
                    vm,
                    reason: RouteReason::WithinBudget,
                },
            );
            c.route(Duration::from_millis(1), &PLAIN, Attempt::First);
            c.route(Duration::from_millis(2), &PLAIN, Attempt::First);
            log.lock().decisions.push_back(Some(decision(0, 0.0)));
            c.handle_timeout(EPOCH);
            let a = actions(&mut c);
            assert_eq!(a.last(), Some(&Action::Drain { vm }), "{a:?}");
            c.on_vm_request_finished(EPOCH, vm);
            assert!(actions(&mut c).is_empty());
            c.on_vm_request_finished(EPOCH, vm);
            assert_eq!(actions(&mut c), vec![Action::Stop { vm }]);
        }

        /// A failed VM is forgotten and the budget drops with it; a ready VM that dies is
        /// replaced at once (new id) when scaling is executed, not in a report-only pool.
        #[test]
        fn failed_vms_lower_the_budget_and_dead_ones_are_replaced() {
            let (mut c, log) = controller(decision(3, 100.0), true);
            c.start(Duration::ZERO);
            let ids = launched(&actions(&mut c));
            for vm in &ids {
                c.on_vm_ready(Duration::ZERO, *vm);
            }
            assert_eq!(last_budget(&log), Some(3.0 * R_MAX));
            c.on_vm_failed(Duration::from_millis(1), ids[0]);
            assert_eq!(last_budget(&log), Some(2.0 * R_MAX));
            assert!(c.vms().get(ids[0]).is_none());
            assert!(
                actions(&mut c).is_empty(),
                "a failed VM waits for the next decision"
            );
            c.on_vm_died(Duration::from_millis(2), ids[1]);
            assert_eq!(
                actions(&mut c),
                vec![
                    Action::Launch { vm: VmId(3) },
                    Action::Launch { vm: VmId(4) }
                ]
            );
            assert_eq!(last_budget(&log), Some(R_MAX));
            assert_eq!(
                c.pool(),
                PoolSnapshot {
                    booting: 2,
                    ready: 1,
                    draining: 0,
                    target: 3
                }
            );
            // An unknown VM dying changes nothing.
            c.on_vm_died(Duration::from_millis(3), ids[1]);
            assert!(actions(&mut c).is_empty());

            let (mut s, slog) = controller(decision(0, 0.0), false);
            let a = s.adopt_ready_vm(Duration::ZERO);
            s.adopt_ready_vm(Duration::ZERO);
            s.start(Duration::ZERO);
            s.on_vm_died(Duration::from_millis(1), a);
            assert!(
                actions(&mut s).is_empty(),
                "a static pool is not relaunched"
            );
            assert_eq!(last_budget(&slog), Some(R_MAX));
        }

        /// A new r_max reaches the scaler and republishes the budget cap at once.
        #[test]
        fn a_new_r_max_republishes_the_budget_cap() {
            let (mut c, log) = controller(decision(2, 100.0), true);
            c.start(Duration::ZERO);
            for vm in launched(&actions(&mut c)) {
                c.on_vm_ready(Duration::ZERO, vm);
            }
            assert_eq!(last_budget(&log), Some(2.0 * R_MAX));
            c.set_r_max(Duration::from_millis(5), 4.25);
            assert_eq!(c.r_max(), 4.25);
            assert_eq!(c.status().r_max_rps, 4.25);
            let l = log.lock();
            assert_eq!(l.r_max, vec![4.25]);
            assert_eq!(
                l.budgets.last(),
                Some(&(Duration::from_millis(5), 2.0 * 4.25))
            );
        }
    }

    mod functions {
        //! The function-instance life cycle (FaaSim §3): every counter and every
        //! accounted duration checked against times chosen so that each differs.

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

        /// (alive, starting, busy, idle)
        fn counts(p: &FunctionPool) -> (u32, u32, u32, u32) {
            (p.alive(), p.starting(), p.busy(), p.idle())
        }

        /// Pre-warm, cold starts, warm reuse of the most recently used instance,
        /// throttling at the cap, expiry at exactly keep-alive, and the usage totals,
        /// each computed from the event times here.
        #[test]
        fn the_life_cycle_accounts_every_start_and_every_millisecond() {
            let mut p = pool(2_500, Some(3), 1);
            assert_eq!(p.params().keep_alive, ms(2_500));
            let pre = p.prewarm(ms(0));
            assert_eq!(pre, vec![InstanceId(0)]);
            assert_eq!(counts(&p), (1, 1, 0, 0));
            assert!(p.has_room());
            p.on_started(ms(400), pre[0]);
            assert_eq!(
                counts(&p),
                (1, 0, 0, 1),
                "a pre-warmed instance starts idle"
            );
            // Two cold starts at 1000 ms (the pre-warmed one is taken warm first).
            assert_eq!(p.acquire(ms(1_000)), Acquire::Warm(pre[0]));
            assert_eq!(p.acquire(ms(1_000)), Acquire::Cold(InstanceId(1)));
            assert!(p.has_room(), "2 alive < 3");
            assert_eq!(p.acquire(ms(1_000)), Acquire::Cold(InstanceId(2)));
            assert!(!p.has_room(), "3 alive = max_instances");
            assert_eq!(p.acquire(ms(1_000)), Acquire::Throttled);
            assert_eq!(p.acquire_cold(ms(1_000)), None, "not counted as throttled");
            p.count_throttled();
            assert_eq!(counts(&p), (3, 2, 1, 0));
            p.on_started(ms(1_300), InstanceId(1)); // 300 ms start-up
            p.on_started(ms(1_700), InstanceId(2)); // 700 ms start-up
            assert_eq!(counts(&p), (3, 0, 3, 0));
            // Releases: 0 at 2000 (busy 1000), 1 at 2100 (busy 800), 2 at 2200 (busy 500).
            p.release(ms(2_000), pre[0]);
            p.release(ms(2_100), InstanceId(1));
            p.release(ms(2_200), InstanceId(2));
            assert_eq!(counts(&p), (3, 0, 0, 3));
            // A release of an idle instance changes nothing.
            p.release(ms(2_300), InstanceId(1));
            // The most recently used idle instance (2) serves the next call.
            assert_eq!(p.acquire_warm(ms(3_000)), Some(InstanceId(2))); // idle 800
            p.release(ms(3_100), InstanceId(2)); // busy 100
            // The pre-warmed one (0, idle since 2000) never expires: the oldest idle
            // cold-started one (1, since 2100) expires first, at 2100 + 2500.
            assert_eq!(p.poll_timeout(), Some(ms(4_600)));
            assert_eq!(p.handle_timeout(ms(4_599)), vec![]);
            assert_eq!(p.handle_timeout(ms(4_600)), vec![InstanceId(1)]);
            // Then 2 (since 3100) at 5600, handled late at 9000; 0 stays.
            assert_eq!(p.poll_timeout(), Some(ms(5_600)));
            assert_eq!(p.handle_timeout(ms(9_000)), vec![InstanceId(2)]);
            assert_eq!(p.poll_timeout(), None);
            assert_eq!(counts(&p), (1, 0, 0, 1));
            // Expired instances shut down until the driver reports them stopped: they no
            // longer count as alive, but their slots are not free yet.
            assert_eq!(p.stopping(), 2);
            p.on_stopped(ms(4_650), InstanceId(1)); // 50 ms shutdown
            // 2 expired at 5600 (handled late, at 9000): its shutdown runs from 5600.
            p.on_stopped(ms(9_400), InstanceId(2)); // 3800 ms shutdown
            p.on_stopped(ms(9_500), InstanceId(2)); // twice: nothing more
            assert_eq!(p.stopping(), 0);
            p.finish(ms(10_000)); // 0 idle since 2000: 8000
            p.finish(ms(10_000)); // twice: nothing more
            // 0 idle 400–1000 after its pre-warm, then 2000–10000; 1 a full keep-alive;
            // 2 idle 2200–3000, then a full keep-alive.
            let idle = ms(600) + ms(8_000) + ms(2_500) + ms(800) + ms(2_500);
            // Field by field: a struct literal would break when the usage gains a field.
            let u = *p.usage();
            assert_eq!((u.cold_starts, u.warm_starts, u.throttled), (2, 2, 2));
            assert_eq!((u.instances_started, u.instances_expired), (3, 2));
            assert_eq!(u.startup, ms(300) + ms(700));
            assert_eq!(u.busy, ms(1_000) + ms(800) + ms(500) + ms(100));
            assert_eq!(u.idle, idle);
            assert_eq!(u.shutdown, ms(50) + ms(3_800));
            // The pre-warmed instance serves the next call; a freed slot (the last freed
            // first) is reused for the next instance.
            assert_eq!(p.acquire(ms(10_000)), Acquire::Warm(pre[0]));
            assert_eq!(p.acquire(ms(10_000)), Acquire::Cold(InstanceId(2)));
        }

        /// A failed instance is forgotten whatever its state (starting, busy, idle), once;
        /// its slot is reused and the cap counts only the living.
        #[test]
        fn failed_instances_free_their_slot_once() {
            let mut p = pool(1_000, Some(2), 0);
            let Acquire::Cold(a) = p.acquire(ms(0)) else {
                panic!()
            };
            let Acquire::Cold(b) = p.acquire(ms(0)) else {
                panic!()
            };
            assert_eq!(p.acquire(ms(0)), Acquire::Throttled);
            p.on_failed(ms(10), a); // while starting
            assert_eq!(counts(&p), (1, 1, 0, 0));
            p.on_failed(ms(11), a); // again: nothing
            assert_eq!(p.alive(), 1);
            assert!(p.has_room());
            let Acquire::Cold(c) = p.acquire(ms(20)) else {
                panic!()
            };
            assert_eq!(c, a, "the freed slot is reused");
            p.on_started(ms(30), b);
            p.on_started(ms(40), c);
            p.release(ms(50), b);
            assert_eq!(counts(&p), (2, 0, 1, 1));
            p.on_failed(ms(60), b); // while idle: it leaves the idle list too
            assert_eq!(counts(&p), (1, 0, 1, 0));
            assert_eq!(p.poll_timeout(), None);
            assert_eq!(p.acquire_warm(ms(70)), None);
            p.on_failed(ms(80), c); // while busy
            assert_eq!(counts(&p), (0, 0, 0, 0));
            // A started report for a failed instance does nothing.
            p.on_started(ms(90), c);
            assert_eq!(counts(&p), (0, 0, 0, 0));
            assert_eq!(p.usage().startup, ms(30) + ms(20));
            assert_eq!(p.usage().instances_started, 3);
        }

        /// Without a cap, instances start without limit; with no pre-warm every idle
        /// instance expires.
        #[test]
        fn an_uncapped_pool_never_throttles_and_expires_everything() {
            let mut p = pool(300, None, 0);
            let ids: Vec<_> = (0..5)
                .map(|_| match p.acquire(ms(0)) {
                    Acquire::Cold(id) => id,
                    other => panic!("{other:?}"),
                })
                .collect();
            for (i, id) in ids.iter().enumerate() {
                p.on_started(ms(100), *id);
                p.release(ms(200 + i as u64), *id);
            }
            assert_eq!(p.poll_timeout(), Some(ms(500)));
            assert_eq!(p.handle_timeout(ms(502)), ids[..3].to_vec());
            assert_eq!(p.handle_timeout(ms(600)), ids[3..].to_vec());
            assert_eq!(p.alive(), 0);
            assert_eq!(p.usage().idle, ms(300) * 5);
            assert_eq!(p.usage().throttled, 0);
        }
    }

    mod placement {
        //! Zone placement (FaaSim's two-tier edge/cloud): the accessors, the tried-zone
        //! set, throttle counting and edge selection for unusual origins.

        use std::time::Duration;

        use spillway_policy::functions::{FunctionPoolParams, InstanceId, WarmOrder};
        use spillway_policy::placement::{
            ConcurrencyUsage, Lease, Placement, PlacementParams, PlacementPolicy, Start,
            ZoneCapacity, ZoneId, ZoneKind, ZoneParams, ZoneSet,
        };

        fn ms(n: u64) -> Duration {
            Duration::from_millis(n)
        }

        fn instances(max: u32, keep_alive_ms: u64, prewarmed: u32) -> ZoneCapacity {
            ZoneCapacity::Instances(FunctionPoolParams {
                keep_alive: ms(keep_alive_ms),
                max_instances: Some(max),
                prewarmed,
                warm_order: WarmOrder::Newest,
            })
        }

        fn zone(name: &str, kind: ZoneKind, capacity: ZoneCapacity) -> ZoneParams {
            ZoneParams {
                name: name.into(),
                kind,
                capacity,
            }
        }

        const EDGE: ZoneId = ZoneId(0);
        const LAMBDA: ZoneId = ZoneId(1);
        const CLOUD: ZoneId = ZoneId(2);
        const CLOUD2: ZoneId = ZoneId(3);

        /// Edge (1 instance, 1.5 s keep-alive, 1 pre-warmed), a concurrency-only edge
        /// (2 in flight), the cloud (2 instances, 4 s, 2 pre-warmed) and a second cloud
        /// zone (which is not "the cloud": the first one is).
        fn four_zones(policy: PlacementPolicy) -> Placement {
            Placement::new(PlacementParams {
                zones: vec![
                    zone("edge", ZoneKind::Edge, instances(1, 1_500, 1)),
                    zone(
                        "lambda",
                        ZoneKind::Edge,
                        ZoneCapacity::Concurrency {
                            max_concurrency: Some(2),
                        },
                    ),
                    zone("cloud", ZoneKind::Cloud, instances(2, 4_000, 2)),
                    zone("cloud-b", ZoneKind::Cloud, instances(5, 4_000, 0)),
                ],
                policy,
            })
        }

        #[test]
        fn labels() {
            assert_eq!(ZoneKind::Edge.as_str(), "edge");
            assert_eq!(ZoneKind::Cloud.as_str(), "cloud");
            assert_eq!(PlacementPolicy::EdgeFirst.as_str(), "edge_first");
            assert_eq!(PlacementPolicy::WarmFirst.as_str(), "warm_first");
        }

        /// Bit `i` stands for zone `i` (mod 64), and only it.
        #[test]
        fn a_zone_set_holds_exactly_the_inserted_zones() {
            let mut s = ZoneSet::default();
            assert!(!s.contains(ZoneId(0)));
            s.insert(ZoneId(5));
            s.insert(ZoneId(63));
            for i in 0..64u16 {
                assert_eq!(s.contains(ZoneId(i)), i == 5 || i == 63, "zone {i}");
            }
            s.insert(ZoneId(5));
            assert!(s.contains(ZoneId(5)), "inserting twice keeps it");
            let mut w = ZoneSet::default();
            w.insert(ZoneId(64 + 2));
            assert!(w.contains(ZoneId(2)), "ids wrap at 64");
            assert!(!w.contains(ZoneId(0)));
        }

        #[test]
        fn accessors_describe_the_configured_zones() {
            let p = four_zones(PlacementPolicy::WarmFirst);
            assert_eq!((p.len(), p.is_empty()), (4, false));
            assert_eq!(p.zone(LAMBDA).name, "lambda");
            assert_eq!(p.zone(CLOUD2).kind, ZoneKind::Cloud);
            assert_eq!(p.zone_by_name("cloud"), Some(CLOUD));
            assert_eq!(p.zone_by_name("cloud-b"), Some(CLOUD2));
            assert_eq!(p.zone_by_name("nowhere"), None);
            assert_eq!(p.cloud(), Some(CLOUD), "the first cloud zone");
            assert_eq!(p.policy(), PlacementPolicy::WarmFirst);
            assert_eq!(p.keep_alive(EDGE), Some(ms(1_500)));
            assert_eq!(p.keep_alive(CLOUD), Some(ms(4_000)));
            assert_eq!(p.keep_alive(LAMBDA), None);
            assert_eq!(p.keep_alive(ZoneId(9)), None);
            assert!(p.usage(LAMBDA).is_none());
            assert!(p.usage(ZoneId(9)).is_none());
            let empty = Placement::new(PlacementParams {
                zones: vec![],
                policy: PlacementPolicy::EdgeFirst,
            });
            assert_eq!(
                (empty.len(), empty.is_empty(), empty.cloud()),
                (0, true, None)
            );
            let single = PlacementParams::single("fn", instances(3, 100, 0));
            assert_eq!(single.zones.len(), 1);
            assert_eq!(
                (single.zones[0].name.as_str(), single.zones[0].kind),
                ("fn", ZoneKind::Cloud)
            );
            assert_eq!(single.policy, PlacementPolicy::EdgeFirst);
        }

        /// Pre-warm starts each instance zone's count with its zone id; the status
        /// reports instance and concurrency zones each with their own fields.
        #[test]
        fn prewarm_and_status_cover_every_zone() {
            let mut p = four_zones(PlacementPolicy::EdgeFirst);
            let pre = p.prewarm(ms(0));
            assert_eq!(
                pre,
                vec![
                    (EDGE, InstanceId(0)),
                    (CLOUD, InstanceId(0)),
                    (CLOUD, InstanceId(1))
                ]
            );
            p.on_started(ms(200), EDGE, InstanceId(0));
            p.on_started(ms(300), CLOUD, InstanceId(0));
            // A call from the concurrency edge: untracked there.
            let l = p.place(ms(400), Some(LAMBDA), ZoneSet::default()).unwrap();
            assert_eq!(
                l,
                Lease {
                    zone: LAMBDA,
                    start: Start::Untracked
                }
            );
            assert_eq!(l.instance(), None);
            // A call from the instance edge takes its warm pre-warmed instance.
            let e = p.place(ms(500), Some(EDGE), ZoneSet::default()).unwrap();
            assert_eq!(
                e,
                Lease {
                    zone: EDGE,
                    start: Start::Warm(InstanceId(0))
                }
            );
            assert_eq!(e.instance(), Some(InstanceId(0)));
            let st = p.status();
            assert_eq!(st.len(), 4);
            assert_eq!((st[0].name.as_str(), st[0].kind), ("edge", ZoneKind::Edge));
            assert_eq!((st[0].starting, st[0].busy, st[0].idle), (0, 1, 0));
            assert_eq!(st[0].usage.unwrap().warm_starts, 1);
            assert_eq!(st[0].calls, None);
            assert_eq!(
                (st[1].name.as_str(), st[1].starting, st[1].busy, st[1].idle),
                ("lambda", 0, 1, 0)
            );
            assert_eq!(st[1].usage, None);
            assert_eq!(
                st[1].calls,
                Some(ConcurrencyUsage {
                    calls: 1,
                    throttled: 0
                })
            );
            assert_eq!((st[2].starting, st[2].busy, st[2].idle), (1, 0, 1));
            assert_eq!(st[2].kind, ZoneKind::Cloud);
            p.release(ms(600), l);
            assert_eq!(p.status()[1].busy, 0);
            // finish() accounts the cloud's idle pre-warmed instance: 300 → 1000 ms.
            p.finish(ms(1_000));
            assert_eq!(p.usage(CLOUD).unwrap().idle, ms(700));
            assert_eq!(p.usage(EDGE).unwrap().idle, ms(300), "idle 200 → 500 ms");
        }

        /// A call no candidate can take counts one throttle in the origin's edge and one
        /// in the cloud — not in a tried zone, and once when the origin is the cloud.
        #[test]
        fn a_full_placement_counts_one_throttle_per_untried_candidate() {
            let mut p = Placement::new(PlacementParams {
                zones: vec![
                    zone("edge", ZoneKind::Edge, instances(1, 1_000, 0)),
                    zone("cloud", ZoneKind::Cloud, instances(1, 1_000, 0)),
                ],
                policy: PlacementPolicy::EdgeFirst,
            });
            let (edge, cloud) = (ZoneId(0), ZoneId(1));
            let none = ZoneSet::default();
            assert_eq!(p.place(ms(0), Some(edge), none).unwrap().zone, edge);
            assert_eq!(p.place(ms(0), Some(edge), none).unwrap().zone, cloud);
            assert_eq!(
                p.try_place(ms(0), Some(edge), none),
                None,
                "try_place counts nothing"
            );
            let throttled = |p: &Placement| {
                (
                    p.usage(edge).unwrap().throttled,
                    p.usage(cloud).unwrap().throttled,
                )
            };
            assert_eq!(throttled(&p), (0, 0));
            assert_eq!(p.place(ms(0), Some(edge), none), None);
            assert_eq!(throttled(&p), (1, 1));
            let mut tried = ZoneSet::default();
            tried.insert(cloud);
            assert_eq!(p.place(ms(0), Some(edge), tried), None);
            assert_eq!(throttled(&p), (2, 1), "the tried cloud is no candidate");
            assert_eq!(p.place(ms(0), Some(cloud), none), None);
            assert_eq!(throttled(&p), (2, 2), "the cloud as origin is counted once");
            assert_eq!(p.place(ms(0), None, none), None);
            assert_eq!(throttled(&p), (2, 3));
        }

        /// Only an untried edge zone that exists is an origin edge: an origin that is a
        /// cloud zone, or past the zone list, goes to the cloud.
        #[test]
        fn origins_that_are_not_edges_go_to_the_cloud() {
            for policy in [PlacementPolicy::EdgeFirst, PlacementPolicy::WarmFirst] {
                let none = ZoneSet::default();
                for origin in [
                    Some(CLOUD2),
                    Some(ZoneId(4)),
                    Some(ZoneId(40)),
                    Some(CLOUD),
                    None,
                ] {
                    let mut fresh = four_zones(policy);
                    let l = fresh.place(ms(0), origin, none).unwrap();
                    assert_eq!(l.zone, CLOUD, "{policy:?} {origin:?}");
                }
                let mut p = four_zones(policy);
                p.place(ms(0), None, none).unwrap();
                p.place(ms(0), None, none).unwrap();
                // The cloud is full (2 instances): a call from the second cloud zone is
                // throttled, and only the cloud counts it.
                assert_eq!(p.place(ms(0), Some(CLOUD2), none), None);
                assert_eq!(p.usage(CLOUD).unwrap().throttled, 1);
                assert_eq!(p.usage(CLOUD2).unwrap().throttled, 0);
                assert_eq!(p.usage(CLOUD2).unwrap().cold_starts, 0);
            }
        }

        /// A 429 on an instance zone frees the instance (it stays warm) and counts a
        /// throttle; a concurrency zone without a cap never refuses.
        #[test]
        fn refusals_free_the_slot_and_count_a_throttle() {
            let mut p = Placement::new(PlacementParams {
                zones: vec![zone("local", ZoneKind::Cloud, instances(1, 800, 0))],
                policy: PlacementPolicy::EdgeFirst,
            });
            let a = p.place(ms(0), None, ZoneSet::default()).unwrap();
            p.on_started(ms(100), a.zone, a.instance().unwrap());
            p.refuse(ms(150), a);
            let u = *p.usage(a.zone).unwrap();
            assert_eq!((u.throttled, u.busy), (1, ms(50)));
            assert_eq!(p.poll_timeout(), Some(ms(950)));
            assert_eq!(p.handle_timeout(ms(949)), vec![]);
            assert_eq!(
                p.handle_timeout(ms(950)),
                vec![(a.zone, a.instance().unwrap())]
            );
            // A failed instance is forgotten: the zone has room again.
            let b = p.place(ms(1_000), None, ZoneSet::default()).unwrap();
            p.on_failed(ms(1_010), b.zone, b.instance().unwrap());
            assert!(matches!(
                p.place(ms(1_020), None, ZoneSet::default()).unwrap().start,
                Start::Cold(_)
            ));
            // Events for an unknown zone are ignored.
            p.on_started(ms(1_030), ZoneId(7), InstanceId(0));
            p.on_failed(ms(1_030), ZoneId(7), InstanceId(0));
            p.release(
                ms(1_030),
                Lease {
                    zone: ZoneId(7),
                    start: Start::Untracked,
                },
            );
            p.refuse(
                ms(1_030),
                Lease {
                    zone: ZoneId(7),
                    start: Start::Untracked,
                },
            );

            let mut u = Placement::new(PlacementParams::single(
                "lambda",
                ZoneCapacity::Concurrency {
                    max_concurrency: None,
                },
            ));
            for _ in 0..50 {
                assert!(u.place(ms(0), None, ZoneSet::default()).is_some());
            }
            assert_eq!(
                u.status()[0].calls,
                Some(ConcurrencyUsage {
                    calls: 50,
                    throttled: 0
                })
            );
            assert_eq!(u.status()[0].busy, 50);
        }
    }

    mod core {
        //! The core's wrappers around the controller and the placement: boot deadlines
        //! across failures, failure accounting per zone and reason, and the pass-through
        //! calls the module's own tests do not reach.

        use parking_lot::Mutex;
        use std::sync::Arc;
        use std::time::Duration;

        use spillway_policy::attempt::{AttemptKind, Decision, Failure, NotSentReason, Ticket};
        use spillway_policy::balancer::{RequestMeta, RouteReason, VmFirst};
        use spillway_policy::controller::{self, ControllerParams};
        use spillway_policy::core::{Action, Core, CoreParams};
        use spillway_policy::functions::{FunctionPoolParams, InstanceId, WarmOrder};
        use spillway_policy::monitor::MonitorParams;
        use spillway_policy::placement::{
            PlacementParams, PlacementPolicy, Start, ZoneCapacity, ZoneId, ZoneKind, ZoneParams,
        };
        use spillway_policy::scaling::{
            EpochObservation, LibraScaler, LibraScalingParams, ScaleDecision, ScaleReason,
            ScalingPolicy,
        };
        use spillway_policy::timers::Timer;
        use spillway_policy::{Time, VmId};

        fn ms(n: u64) -> Duration {
            Duration::from_millis(n)
        }

        fn controller_params(execute_scaling: bool) -> ControllerParams {
            ControllerParams {
                monitor: MonitorParams {
                    epoch: Duration::from_secs(60),
                    alpha: 0.3,
                    beta: 0.2,
                    decision_epochs: 1000,
                    first_decision_epoch: None,
                },
                r_max_rps: 2.0,
                execute_scaling,
            }
        }

        fn libra(min_vms: u32) -> Box<LibraScaler> {
            Box::new(LibraScaler::new(LibraScalingParams {
                phi: 1.5,
                r_max_rps: 2.0,
                min_vms,
                max_vms: 4,
                cip_rps: 0.0,
            }))
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

        fn core_with(zones: Vec<ZoneParams>, execute_scaling: bool, min_vms: u32) -> Core {
            Core::new(
                CoreParams {
                    controller: controller_params(execute_scaling),
                    placement: PlacementParams {
                        zones,
                        policy: PlacementPolicy::EdgeFirst,
                    },
                    vm_boot_timeout: Some(ms(7_000)),
                },
                libra(min_vms),
                Box::new(VmFirst::new(0.5).with_max_outstanding_per_vm(Some(2))),
            )
        }

        fn drain(core: &mut Core) -> Vec<Action> {
            std::iter::from_fn(|| core.poll_action()).collect()
        }

        fn launches(a: &[Action]) -> Vec<VmId> {
            a.iter()
                .filter_map(|a| match a {
                    Action::Scaling(controller::Action::Launch { vm }) => Some(*vm),
                    _ => None,
                })
                .collect()
        }

        fn ticket(origin: Option<ZoneId>) -> Ticket {
            Ticket::new(
                RequestMeta {
                    upgrade: false,
                    idempotent: true,
                },
                origin,
            )
        }

        fn not_sent(reason: NotSentReason) -> Failure {
            Failure::NotSent {
                reason,
                request_available: true,
            }
        }

        /// A VM that fails, dies or becomes ready loses its own boot deadline and only
        /// its own; the replacements of a dead VM get theirs.
        #[test]
        fn boot_deadlines_follow_each_vm() {
            let zones = vec![concurrency("fn", ZoneKind::Cloud, 9)];
            let mut core = core_with(zones, true, 2);
            core.start(ms(1_000));
            let first = launches(&drain(&mut core));
            assert_eq!(first.len(), 2);
            assert_eq!(core.next_timer(), (Timer::VmBoot, ms(8_000)));
            core.on_vm_failed(ms(2_000), first[0]);
            assert_eq!(
                core.next_timer(),
                (Timer::VmBoot, ms(8_000)),
                "the other one's"
            );
            // The second dies while booting: both are relaunched (target 2) at 3 s.
            core.on_vm_died(ms(3_000), first[1]);
            let again = launches(&drain(&mut core));
            assert_eq!(again.len(), 2, "replaced up to the target");
            assert_eq!(core.next_timer(), (Timer::VmBoot, ms(10_000)));
            core.on_vm_ready(ms(4_000), again[0]);
            assert_eq!(core.next_timer(), (Timer::VmBoot, ms(10_000)));
            core.handle_timeout(ms(10_000));
            assert_eq!(
                drain(&mut core),
                vec![Action::VmBootTimedOut { vm: again[1] }]
            );
            assert_eq!(core.next_timer().0, Timer::EpochEnd);
            assert_eq!(core.poll_timeout(), Duration::from_secs(60));
            assert_eq!(core.controller().pool().ready, 1);
        }

        /// Failed function attempts are counted per (zone, reason); fall-backs to a VM
        /// per request.
        #[test]
        fn function_failures_are_counted_per_zone_and_reason() {
            let zones = vec![
                concurrency("edge", ZoneKind::Edge, 5),
                concurrency("cloud", ZoneKind::Cloud, 5),
            ];
            let mut core = core_with(zones, false, 1);
            let vm = core.adopt_ready_vm(Time::ZERO);
            core.start(Time::ZERO);
            drain(&mut core);
            let (edge, cloud) = (ZoneId(0), ZoneId(1));
            let t0 = ms(10);
            let mut token = ticket(None);
            assert!(
                matches!(core.route(t0, &mut token), Decision::Vm { .. }),
                "the only token"
            );
            // Edge throttles, the cloud is unreachable: a fall-back to the VM.
            let mut a = ticket(Some(edge));
            assert!(
                matches!(core.route(t0, &mut a), Decision::Function { lease, .. } if lease.zone == edge)
            );
            let d = core.on_attempt_failed(t0, &mut a, not_sent(NotSentReason::Throttled));
            assert!(
                matches!(d, Some(Decision::Function { lease, kind: AttemptKind::FallThrough, .. }) if lease.zone == cloud),
                "{d:?}"
            );
            let d = core.on_attempt_failed(t0, &mut a, not_sent(NotSentReason::Unreachable));
            assert!(
                matches!(d, Some(Decision::Vm { vm: v, kind: AttemptKind::FallBack, .. }) if v == vm),
                "{d:?}"
            );
            let st = core.status();
            assert_eq!(
                st.function_failures,
                vec![(edge, "throttled", 1), (cloud, "unreachable", 1)]
            );
            assert_eq!(st.fall_backs_to_vm, 1);
            core.finish(t0, &mut a);
            core.finish(t0, &mut token);
            assert_eq!(core.controller().vms().get(vm).unwrap().outstanding, 0);
            // Both throttle: the same reason in the cloud is its own row; the edge's row
            // counts twice; a failure after send has its own label.
            let mut b = ticket(Some(edge));
            let _ = core.route(t0, &mut b);
            core.on_attempt_failed(t0, &mut b, not_sent(NotSentReason::Throttled));
            core.on_attempt_failed(t0, &mut b, not_sent(NotSentReason::Throttled));
            let mut c = ticket(None);
            assert!(
                matches!(core.route(t0, &mut c), Decision::Function { lease, .. } if lease.zone == cloud)
            );
            let after_send = Failure::FailedAfterSend {
                response_started: true,
                request_available: false,
            };
            assert_eq!(core.on_attempt_failed(t0, &mut c, after_send), None);
            let st = core.status();
            assert_eq!(
                st.function_failures,
                vec![
                    (edge, "throttled", 2),
                    (cloud, "unreachable", 1),
                    (cloud, "throttled", 1),
                    (cloud, "failed_after_send", 1),
                ]
            );
            assert_eq!(st.fall_backs_to_vm, 2);
            assert_eq!(st.zones[1].busy, 0, "every cloud slot released");
        }

        /// Records the utilisation each epoch observation carried.
        struct Recorder(Arc<Mutex<Vec<Option<f64>>>>);

        impl ScalingPolicy for Recorder {
            fn name(&self) -> &'static str {
                "recorder"
            }
            fn initial(&self) -> ScaleDecision {
                ScaleDecision {
                    target_vms: 0,
                    vm_reqs_rps: 0.0,
                    reason: ScaleReason::Baseline,
                }
            }
            fn on_epoch(&mut self, _: Time, obs: &EpochObservation) -> Option<ScaleDecision> {
                self.0.lock().push(obs.vm_utilisation);
                None
            }
        }

        /// The pass-through calls: route keys, the accessors, utilisation, instance
        /// failures, end-of-run idle accounting and a dequeued attempt given back.
        #[test]
        fn pass_through_calls_reach_their_component() {
            let seen = Arc::new(Mutex::new(Vec::new()));
            let mut core = Core::new(
                CoreParams {
                    controller: ControllerParams {
                        monitor: MonitorParams {
                            epoch: ms(700),
                            ..controller_params(false).monitor
                        },
                        ..controller_params(false)
                    },
                    placement: PlacementParams::single(
                        "local",
                        ZoneCapacity::Instances(FunctionPoolParams {
                            keep_alive: ms(5_000),
                            max_instances: Some(2),
                            prewarmed: 1,
                            warm_order: WarmOrder::Newest,
                        }),
                    ),
                    vm_boot_timeout: None,
                },
                Box::new(Recorder(seen.clone())),
                Box::new(VmFirst::new(0.5)),
            );
            assert!(!core.has_queue());
            assert!(!core.adapts_r_max());
            assert!(core.delay_queue().is_none());
            assert_eq!(core.placement().len(), 1);
            let k = core.route_key("GET", "/thumb/7");
            assert_eq!(core.key_name(k), "thumb");
            assert_eq!(core.key_named("thumb"), k);
            assert_ne!(core.key_named("video"), k);
            let vm = core.adopt_ready_vm(Time::ZERO);
            core.start(Time::ZERO);
            let zone = ZoneId(0);
            assert_eq!(
                drain(&mut core),
                vec![Action::StartInstance {
                    zone,
                    instance: InstanceId(0)
                }]
            );
            core.on_instance_started(ms(100), zone, InstanceId(0));
            core.set_vm_utilisation(0.42);
            core.handle_timeout(ms(700));
            core.handle_timeout(ms(1_400));
            assert_eq!(*seen.lock(), vec![Some(0.42), None]);
            // A report-only pool: the budget is the VM's capacity, 2 req/s · ρ 0.5, one
            // token. The first call takes it, the next ones go to the functions.
            let mut v = ticket(None);
            assert!(matches!(core.route(ms(1_500), &mut v), Decision::Vm { .. }));
            let mut a = ticket(None);
            let d = core.route(ms(1_500), &mut a);
            assert!(
                matches!(d, Decision::Function { lease, .. } if lease.start == Start::Warm(InstanceId(0))),
                "{d:?}"
            );
            let mut b = ticket(None);
            let Decision::Function { lease, .. } = core.route(ms(1_500), &mut b) else {
                panic!()
            };
            assert_eq!(lease.start, Start::Cold(InstanceId(1)));
            // The cold start fails: forgotten, so the zone has room for a new one.
            core.on_instance_failed(ms(1_600), zone, InstanceId(1));
            let mut c = ticket(None);
            let d = core.route(ms(1_700), &mut c);
            assert!(
                matches!(d, Decision::Function { lease, .. } if lease.start == Start::Cold(InstanceId(1))),
                "{d:?}"
            );
            core.on_instance_started(ms(1_900), zone, InstanceId(1));
            core.finish(ms(2_000), &mut a);
            core.finish(ms(2_500), &mut c);
            core.finish_functions(ms(3_000));
            let u = *core.placement().usage(zone).unwrap();
            // Instance 0: idle 100–1500 and 2000–3000; instance 1: 2500–3000.
            assert_eq!(u.idle, ms(1_400) + ms(1_000) + ms(500));
            // A dequeued VM attempt whose client left gives its slot back.
            assert_eq!(core.controller().vms().get(vm).unwrap().outstanding, 1);
            let d = Decision::Vm {
                vm,
                kind: AttemptKind::Dequeued,
                reason: RouteReason::WithinBudget,
            };
            core.abandon_dequeued(ms(3_000), d);
            assert_eq!(core.controller().vms().get(vm).unwrap().outstanding, 0);
        }

        /// With the gateway queue, the first decision notes each call's arrival on its
        /// ticket (the key, the time, the key's previous arrival, the arrivals within the
        /// Fair-Choice window): the proxy reads `key()` and `arrival()` to report the
        /// call's response time per route key.
        #[test]
        fn the_first_decision_notes_the_arrival_on_the_ticket() {
            use spillway_policy::sched::{Arrival, Order, SchedParams};
            let zones = vec![concurrency("fn", ZoneKind::Cloud, 4)];
            let mut core = core_with(zones, false, 0).with_queue(
                Some(SchedParams {
                    order: Order::FairChoice,
                    max_queue_length: 3,
                    max_queue_wait: ms(4_000),
                    default_processing: ms(100),
                    fair_choice_window: ms(10_000),
                }),
                Vec::new(),
                8,
            );
            core.start(ms(0));
            let thumb = core.key_named("thumb");
            let plain = ticket(None);
            assert_eq!((plain.key(), plain.arrival()), (None, None));
            let mut first = ticket(None).with_key(thumb);
            assert_eq!(first.key(), Some(thumb));
            let d = core.route(ms(1_500), &mut first);
            assert!(matches!(d, Decision::Function { .. }), "{d:?}");
            let mut second = ticket(None).with_key(thumb);
            let d = core.route(ms(2_300), &mut second);
            assert!(matches!(d, Decision::Function { .. }), "{d:?}");
            let mut late = ticket(None).with_key(thumb);
            let d = core.route(ms(12_000), &mut late);
            assert!(matches!(d, Decision::Function { .. }), "{d:?}");
            let arrival = |at: u64, previous: u64, recent: u32| Arrival {
                key: thumb,
                at: ms(at),
                previous: ms(previous),
                recent,
            };
            assert_eq!(first.arrival(), Some(arrival(1_500, 1_500, 1)));
            assert_eq!(second.arrival(), Some(arrival(2_300, 1_500, 2)));
            // 12 000 − 10 000: the call at 1500 has left the window, the one at 2300 not.
            assert_eq!(late.arrival(), Some(arrival(12_000, 2_300, 2)));
            assert_eq!(late.key(), Some(thumb));
        }

        /// Idle epochs (the simulator skips idle stretches), closed by the core:
        /// epochs of 2 s that never reach a decision (K = 1000), one VM booting from
        /// t = 1 s with a 7 s boot deadline.
        mod idle {
            use super::*;
            use spillway_policy::delay::DelayParams;
            use spillway_policy::rmax::RMaxParams;
            use spillway_policy::sched::{Order, SchedParams};

            fn core_2s(min_vms: u32, zone_calls: u32) -> Core {
                Core::new(
                    CoreParams {
                        controller: ControllerParams {
                            monitor: MonitorParams {
                                epoch: ms(2_000),
                                alpha: 0.3,
                                beta: 0.2,
                                decision_epochs: 1000,
                                first_decision_epoch: None,
                            },
                            r_max_rps: 2.0,
                            execute_scaling: true,
                        },
                        placement: PlacementParams {
                            zones: vec![concurrency("fn", ZoneKind::Cloud, zone_calls)],
                            policy: PlacementPolicy::EdgeFirst,
                        },
                        vm_boot_timeout: Some(ms(7_000)),
                    },
                    libra(min_vms),
                    Box::new(VmFirst::new(0.5).with_max_outstanding_per_vm(Some(2))),
                )
            }

            fn epoch(core: &Core) -> u64 {
                core.controller().monitor().current_epoch()
            }

            /// Up to `until` when no other deadline comes first; else up to the last epoch
            /// end before that deadline. The result is the end of the last epoch closed.
            #[test]
            fn epochs_close_up_to_until_and_stop_before_another_deadline() {
                let mut core = core_2s(1, 4);
                core.start(ms(1_000));
                assert_eq!(launches(&drain(&mut core)).len(), 1, "min_vms = 1");
                assert_eq!(core.next_timer(), (Timer::EpochEnd, ms(2_000)));
                // The boot deadline (1000 + 7000 = 8000) lies past 5000: not a limit.
                assert_eq!(core.close_idle_epochs(ms(5_000), None), Some(ms(4_000)));
                assert_eq!(epoch(&core), 2, "the epochs ending at 2000 and 4000 closed");
                // Past 8000 the boot deadline stops it: the epoch ending at 8000 is left
                // for the step that handles the deadline.
                assert_eq!(core.close_idle_epochs(ms(11_000), None), Some(ms(6_000)));
                assert_eq!(epoch(&core), 3);
                assert_eq!(core.close_idle_epochs(ms(11_000), None), None);
                assert_eq!(core.poll_timeout(), ms(8_000));
                // Nothing to close before the next epoch end.
                let mut fresh = core_2s(0, 4);
                fresh.start(ms(1_000));
                assert_eq!(fresh.close_idle_epochs(ms(1_999), None), None);
                assert_eq!(epoch(&fresh), 0);
            }

            /// The adaptive r_max controller and the asynchronous-call queue keep their
            /// books per event: with either, no epoch is closed at once (their own
            /// timers lie far past `until` here, so only that rule stops it).
            #[test]
            fn per_event_components_close_nothing() {
                let adaptive = RMaxParams {
                    start_rps: 2.0,
                    target_quantile: 0.9,
                    target: ms(100),
                    kp: 0.1,
                    ki: 0.45,
                    kd: 0.03,
                    min_rps: 1.0,
                    max_rps: 40.0,
                    max_step_rps: 100.0,
                    period: ms(600_000),
                    min_load_fraction: 0.4,
                };
                let mut core = core_2s(0, 4).with_adaptive_r_max(Some(adaptive));
                core.start(ms(1_000));
                assert_eq!(core.close_idle_epochs(ms(9_000), None), None);
                assert_eq!(epoch(&core), 0);
                let delay = DelayParams {
                    busy_utilisation: 0.6,
                    sample_interval: ms(600_000),
                    window: ms(900_000),
                    min_switch: ms(0),
                    urgency_window: ms(8_000),
                    release_batch: 3,
                    deadline_margin: ms(2_000),
                    expected_processing: ms(1_500),
                    vm_slots: Some(2),
                };
                let mut core = core_2s(0, 4).with_delay_queue(Some(delay));
                core.start(ms(1_000));
                assert_eq!(core.close_idle_epochs(ms(9_000), None), None);
                assert_eq!(epoch(&core), 0);
            }

            /// The gateway queue stops it only while a call waits in it.
            #[test]
            fn a_waiting_call_stops_it_an_empty_queue_does_not() {
                let queued = |core: Core| {
                    core.with_queue(
                        Some(SchedParams {
                            order: Order::Fifo,
                            max_queue_length: 4,
                            max_queue_wait: ms(600_000),
                            default_processing: ms(100),
                            fair_choice_window: ms(60_000),
                        }),
                        Vec::new(),
                        8,
                    )
                };
                let mut empty = queued(core_2s(0, 1));
                empty.start(ms(1_000));
                assert_eq!(empty.close_idle_epochs(ms(5_000), None), Some(ms(4_000)));
                let mut core = queued(core_2s(0, 1));
                core.start(ms(1_000));
                // No VM, one function call at a time: the second call waits.
                let mut first = ticket(None);
                assert!(matches!(
                    core.route(ms(1_100), &mut first),
                    Decision::Function { .. }
                ));
                let mut second = ticket(None);
                assert!(matches!(
                    core.route(ms(1_200), &mut second),
                    Decision::Queue { .. }
                ));
                assert_eq!(core.close_idle_epochs(ms(5_000), None), None);
                assert_eq!(epoch(&core), 0);
            }
        }
    }

    /// The names the gateway shows for VMs and tiers (`/status`, metric labels, logs).
    mod labels {
        use spillway_policy::{Tier, VmId};

        #[test]
        fn vm_ids_and_tiers_have_their_documented_names() {
            assert_eq!(VmId(12).to_string(), "vm-12");
            assert_eq!(
                (Tier::Vm.as_str(), Tier::Function.as_str()),
                ("vm", "function")
            );
        }
    }

    /// LIBRA §IV's baselines as the simulator builds them: each kind's report name, the
    /// scaler it builds (named like it), whether the driver must measure utilisation, and
    /// the fixed pools' first decision.
    mod baselines {
        use std::time::Duration;

        use spillway_policy::balancer::VmFirst;
        use spillway_policy::baselines::{AutoParams, FixedScaler, PolicyKind, PolicyParams};
        use spillway_policy::scaling::{
            LibraScalingParams, ScaleDecision, ScaleReason, ScalingPolicy,
        };

        fn params() -> PolicyParams {
            PolicyParams {
                libra: LibraScalingParams {
                    phi: 1.5,
                    r_max_rps: 4.0,
                    min_vms: 0,
                    max_vms: 9,
                    cip_rps: 0.5,
                },
                balancer: VmFirst::new(0.8),
                auto: AutoParams {
                    scale_out_utilisation: 0.7,
                    scale_in_utilisation: 0.3,
                    window_epochs: 3,
                    step_vms: 2,
                    grace: Duration::from_secs(5),
                    min_vms: 1,
                    max_vms: 4,
                    r_max_rps: 4.0,
                },
                max_vms: 7,
                slots_per_vm: 3,
            }
        }

        #[test]
        fn each_kind_builds_its_own_named_scaler() {
            let names: Vec<_> = PolicyKind::ALL.iter().map(|k| k.name()).collect();
            assert_eq!(names, ["libra", "max", "faas", "auto", "spock"]);
            let measured: Vec<_> = PolicyKind::ALL
                .iter()
                .map(|k| k.uses_utilisation())
                .collect();
            assert_eq!(measured, [false, false, false, true, true]);
            let p = params();
            for kind in PolicyKind::ALL {
                let (scaler, _) = kind.build(&p);
                assert_eq!(scaler.name(), kind.name());
            }
        }

        /// MAX runs its pool with no budget limit from the start; FAAS runs no VM and
        /// sends VMs nothing.
        #[test]
        fn the_fixed_pools_start_at_their_size() {
            assert_eq!(
                FixedScaler::max(7).initial(),
                ScaleDecision {
                    target_vms: 7,
                    vm_reqs_rps: f64::INFINITY,
                    reason: ScaleReason::Baseline,
                }
            );
            assert_eq!(
                FixedScaler::faas().initial(),
                ScaleDecision {
                    target_vms: 0,
                    vm_reqs_rps: 0.0,
                    reason: ScaleReason::Baseline,
                }
            );
            let (max, _) = PolicyKind::Max.build(&params());
            assert_eq!(max.initial().target_vms, 7);
        }
    }

    /// A reload retunes the traffic monitor's smoothing and reporting, never its epoch
    /// length: the epoch grid the running EWMAs were built on stays.
    mod monitor {
        use std::time::Duration;

        use spillway_policy::monitor::{MonitorParams, TrafficMonitor};

        #[test]
        fn a_retune_keeps_the_epoch_length() {
            let s = Duration::from_secs;
            let params = MonitorParams {
                epoch: s(60),
                alpha: 0.3,
                beta: 0.2,
                decision_epochs: 4,
                first_decision_epoch: None,
            };
            let mut m = TrafficMonitor::new(params.clone());
            m.retune(MonitorParams {
                epoch: s(15),
                alpha: 0.6,
                beta: 0.1,
                decision_epochs: 2,
                first_decision_epoch: Some(1),
            });
            assert_eq!(
                m.params(),
                &MonitorParams {
                    epoch: s(60),
                    alpha: 0.6,
                    beta: 0.1,
                    decision_epochs: 2,
                    first_decision_epoch: Some(1),
                }
            );
            assert_eq!(
                m.poll_timeout(),
                s(60),
                "the first epoch still ends at 60 s"
            );
        }
    }

    /// LIBRA's idle outlook (the simulator closes idle epochs at once when it
    /// is settled) once traffic was seen: settled below the CIP (every report releases
    /// every VM) or when the EWMAs settled, with the decision Algorithm 1 gives then;
    /// unsettled otherwise — at the CIP itself too (the CIP rule is `avg < CIP`).
    mod libra_idle {
        use std::time::Duration;

        use spillway_policy::monitor::EpochClosed;
        use spillway_policy::scaling::{
            EpochObservation, IdleOutlook, IdleView, LibraScaler, LibraScalingParams, PoolSnapshot,
            ScaleDecision, ScaleReason, ScalingPolicy,
        };

        fn view(avg_rps: f64, std_rps: f64, traffic_settled: bool) -> IdleView {
            IdleView {
                first_end: Duration::from_secs(120),
                avg_rps,
                std_rps,
                traffic_settled,
                vm_utilisation: None,
                pool: PoolSnapshot::default(),
            }
        }

        #[test]
        fn after_traffic_it_settles_below_the_cip_or_when_the_ewmas_settled() {
            let mut l = LibraScaler::new(LibraScalingParams {
                phi: 1.5,
                r_max_rps: 4.0,
                min_vms: 1,
                max_vms: 9,
                cip_rps: 2.5,
            });
            let _ = l.on_epoch(
                Duration::from_secs(60),
                &EpochObservation {
                    traffic: EpochClosed {
                        epoch: 0,
                        requests: 10,
                        avg_rps: 0.0,
                        std_rps: 0.0,
                        report: None,
                    },
                    epoch: Duration::from_secs(60),
                    vm_requests: 0,
                    function_requests: 10,
                    vm_utilisation: None,
                    pool: PoolSnapshot::default(),
                },
            );
            let below = ScaleDecision {
                target_vms: 0,
                vm_reqs_rps: 0.0,
                reason: ScaleReason::BelowCostIndifferencePoint,
            };
            assert_eq!(
                l.idle_outlook(&view(1.0, 0.5, false)),
                IdleOutlook::Settled(Some(below))
            );
            assert_eq!(
                l.idle_outlook(&view(1.0, 0.5, true)),
                IdleOutlook::Settled(Some(below))
            );
            // At the CIP (not below it) and not settled: the EWMAs still move.
            assert_eq!(
                l.idle_outlook(&view(2.5, 0.5, false)),
                IdleOutlook::Unsettled
            );
            assert_eq!(
                l.idle_outlook(&view(6.0, 1.0, false)),
                IdleOutlook::Unsettled
            );
            // Settled above the CIP: ceil((6 + 1.5 · 1) / 4) = 2 VMs for 7.5 req/s.
            assert_eq!(
                l.idle_outlook(&view(6.0, 1.0, true)),
                IdleOutlook::Settled(Some(ScaleDecision {
                    target_vms: 2,
                    vm_reqs_rps: 7.5,
                    reason: ScaleReason::Provision,
                }))
            );
        }
    }
}
