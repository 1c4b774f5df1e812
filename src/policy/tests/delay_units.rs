//! Unit tests of the ProFaaStinate delay queue (`spillway_policy::delay`): tests
//! written against missed mutants of src/policy/delay.rs — the mode's name shown in
//! `/status`, the parameters a queue was built with, the queue's length and the
//! `queued_total` counter, the busy threshold's boundary (docs/src/guide/async-calls.md / module docs: busy when
//! the windowed CPU is *above* `busy_utilisation`) and the deadline-miss boundary (a miss
//! is a call that finished *after* its deadline). Expectations are derived from the
//! documented rules with asymmetric parameters.
//!
//! The modules are named `policy::<file>` so the mutation run's test filter (`policy::`)
//! picks them up.

mod policy {
    mod delay {
        use std::time::Duration;

        use spillway_policy::Tier;
        use spillway_policy::delay::{CallId, DelayParams, DelayQueue, Mode, ReleaseKind};

        fn s(x: f64) -> Duration {
            Duration::from_secs_f64(x)
        }

        /// Asymmetric parameters, all different from [`DelayParams::default`]; the busy
        /// threshold 0.625 and the samples below are exact in binary, so an average can
        /// land exactly on it.
        fn params() -> DelayParams {
            DelayParams {
                busy_utilisation: 0.625,
                sample_interval: s(1.0),
                window: s(5.0),
                min_switch: s(3.0),
                urgency_window: s(7.0),
                release_batch: 4,
                deadline_margin: s(2.0),
                expected_processing: s(1.5),
                vm_slots: Some(3),
            }
        }

        /// `/status` shows the scheduler's mode as `async.mode`; the documented labels
        /// (docs/src/guide/async-calls.md, `Mode::as_str` docs) are `idle` and `busy`, and the
        /// status snapshot carries the mode the queue is in.
        #[test]
        fn the_mode_is_shown_as_idle_or_busy() {
            assert_eq!(Mode::Idle.as_str(), "idle");
            assert_eq!(Mode::Busy.as_str(), "busy");
            let p = params();
            let mut q = DelayQueue::new(p.clone());
            assert_eq!(q.status().mode.as_str(), "idle", "a new queue is idle");
            // A sample well above the threshold switches at once (the first switch is free).
            q.on_cpu_sample(s(0.0), (p.busy_utilisation + 1.0) / 2.0);
            assert_eq!(q.status().mode.as_str(), "busy");
        }

        /// The queue keeps the parameters it was built with (the driver reads them back,
        /// e.g. `vm_slots` for the idle releases' capacity check), not the defaults.
        #[test]
        fn the_queue_reports_the_parameters_it_was_built_with() {
            let p = params();
            assert_ne!(p, DelayParams::default());
            let q = DelayQueue::new(p.clone());
            assert_eq!(q.params(), &p);
            assert_eq!(q.params().vm_slots, Some(3));
            assert_eq!(q.params().release_batch, 4);
        }

        /// `/status` `async.queued` (the queue's length) and `async.queued_total` (calls
        /// queued so far): pushes, a replaced id (counted once in the length), a release
        /// and a call queued again after its release found no capacity.
        #[test]
        fn length_and_queued_total_follow_pushes_and_releases() {
            let p = params();
            let mut q = DelayQueue::new(p.clone());
            assert!(q.is_empty());
            assert_eq!(q.len(), 0);
            assert_eq!(q.status().queued_total, 0);

            let deadlines = [40.0, 25.0, 90.0];
            for (i, d) in deadlines.into_iter().enumerate() {
                q.push(CallId(i as u128 + 7), s(d), s(0.0));
                assert_eq!(q.len(), i + 1);
                assert!(!q.is_empty());
                assert_eq!(q.status().queued_total, i as u64 + 1);
            }
            assert_eq!(q.status().queued, deadlines.len());

            // Release the earliest deadline (idle mode, batch budget left).
            assert!(q.sample_due(s(0.0)));
            let due = q.peek_due(s(0.0)).expect("idle release");
            assert_eq!(due.kind, ReleaseKind::Idle);
            assert_eq!(due.deadline, s(25.0));
            q.released(due.id, due.kind, Tier::Vm);
            assert_eq!(q.len(), deadlines.len() - 1);
            assert_eq!(q.status().queued_total, deadlines.len() as u64);

            // No capacity after all: queued again — one more queued, length back up.
            q.push(due.id, due.deadline, s(0.0));
            assert_eq!(q.len(), deadlines.len());
            assert_eq!(q.status().queued_total, deadlines.len() as u64 + 1);

            // Cancel everything: empty again.
            for i in 0..deadlines.len() {
                assert!(q.remove(CallId(i as u128 + 7)));
            }
            assert_eq!(q.len(), 0);
            assert!(q.is_empty());
            assert_eq!(q.status().queued, 0);
        }

        /// docs/src/guide/async-calls.md / module docs: the scheduler is busy when the windowed CPU average is
        /// *above* `busy_utilisation`; an average exactly at the threshold keeps (or
        /// makes) it idle, so deferred calls still run.
        #[test]
        fn an_average_exactly_at_the_busy_threshold_is_idle() {
            let p = params();
            let mut q = DelayQueue::new(p.clone());
            let th = p.busy_utilisation;
            // Two samples averaging exactly the threshold: 0.5 and 0.75 → 0.625.
            let (a, b) = (th - 0.125, th + 0.125);
            q.on_cpu_sample(s(0.0), a);
            assert_eq!(q.mode(), Mode::Idle);
            q.on_cpu_sample(s(1.0), b);
            assert_eq!(q.cpu(), Some((a + b) / 2.0));
            assert_eq!(q.cpu(), Some(th));
            assert_eq!(q.mode(), Mode::Idle, "at the threshold: not above it");
            assert_eq!(q.status().switches, 0);
            // An idle release is still possible.
            q.push(CallId(1), s(60.0), s(0.0));
            assert!(q.sample_due(s(1.0)));
            assert_eq!(q.peek_due(s(1.0)).map(|d| d.kind), Some(ReleaseKind::Idle));
            // A third sample lifts the average above it: busy.
            let c = th + 0.25;
            q.on_cpu_sample(s(2.0), c);
            assert!(q.cpu().unwrap() > th);
            assert_eq!(q.mode(), Mode::Busy);
            assert_eq!(q.status().switches, 1);

            // From busy: once the min_switch has passed, an average exactly at the
            // threshold switches back to idle. Window 5 s: at t = 5 the samples of t = 1..5
            // count; pick the last ones so the average is exactly the threshold.
            // Samples in the window at t=5: t=1 (b), t=2 (c), t=3, t=4, t=5.
            // Choose t=3, t=4 = th, and t=5 = 5·th − (b + c + 2·th).
            q.on_cpu_sample(s(3.0), th);
            q.on_cpu_sample(s(4.0), th);
            let last = 5.0 * th - (b + c + 2.0 * th);
            assert!((0.0..=1.0).contains(&last));
            q.on_cpu_sample(s(5.0), last);
            assert_eq!(q.cpu(), Some(th));
            assert!(s(5.0) >= s(2.0) + p.min_switch);
            assert_eq!(q.mode(), Mode::Idle, "at the threshold: idle again");
            assert_eq!(q.status().switches, 2);
        }

        /// `/status` `async.deadline_misses`: a call is a miss only when it finished
        /// *after* its deadline — before it or exactly at it is on time; `finished`
        /// counts them all.
        #[test]
        fn only_calls_finished_after_their_deadline_are_misses() {
            let p = params();
            let mut q = DelayQueue::new(p);
            let deadline = s(30.0);
            // Early.
            q.on_finished(deadline - s(4.0), deadline, s(2.5));
            assert_eq!((q.status().finished, q.status().deadline_misses), (1, 0));
            // Exactly at the deadline.
            q.on_finished(deadline, deadline, s(2.5));
            assert_eq!((q.status().finished, q.status().deadline_misses), (2, 0));
            // One millisecond late.
            q.on_finished(deadline + Duration::from_millis(1), deadline, s(2.5));
            assert_eq!((q.status().finished, q.status().deadline_misses), (3, 1));
            // Early again: still one miss.
            q.on_finished(s(10.0), deadline, s(2.5));
            assert_eq!((q.status().finished, q.status().deadline_misses), (4, 1));
        }
    }
}
