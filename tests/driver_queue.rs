//! The live driver's gateway queue on paused tokio time: a call that finds no
//! capacity waits; the longest wait is a deadline of the core's timer table that wakes
//! the driver (503 then); a released lease serves the queue's head; a waiting request
//! that is dropped leaves the queue.
// The shared harness (tests/common) has wall-clock helpers for real-process tests.
#![allow(clippy::disallowed_methods)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use spillway::backends::{BackendError, BoxFuture, FunctionError, FunctionTier};
use spillway::net::body::{self, Body};
use spillway::policy::attempt::{AttemptKind, Decision, Ticket};
use spillway::policy::balancer::RequestMeta;
use spillway::policy::functions::{FunctionPoolParams, InstanceId, WarmOrder};
use spillway::policy::placement::Start;
use spillway::policy::sched::{Order, SchedParams};
use spillway::proxy::driver::TicketGuard;
use tokio::time::Instant;

use common::inproc::{NoVms, faas_core, gateway};

/// A function tier whose instances start at once; no call is sent (the tickets only take
/// and give back capacity).
struct Idle;

impl FunctionTier for Idle {
    fn kind(&self) -> &'static str {
        "idle"
    }
    fn start_instance(&self, _instance: InstanceId) -> BoxFuture<'_, Result<(), BackendError>> {
        Box::pin(async { Ok(()) })
    }
    fn stop_instance(&self, _instance: InstanceId) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
    fn invoke(
        &self,
        _instance: Option<InstanceId>,
        _req: Request<Body>,
    ) -> BoxFuture<'_, Result<Response<Body>, FunctionError>> {
        Box::pin(async { Ok(Response::new(body::empty())) })
    }
    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

#[tokio::test(start_paused = true)]
async fn queued_calls_time_out_are_served_on_release_and_leave_when_dropped() {
    let wait = Duration::from_millis(2_500);
    let pool = FunctionPoolParams {
        keep_alive: Duration::from_secs(600),
        max_instances: Some(1),
        prewarmed: 0,
        warm_order: WarmOrder::Newest,
    };
    let core = faas_core(Duration::from_secs(60), pool).with_queue(
        Some(SchedParams {
            order: Order::Fifo,
            max_queue_length: 4,
            max_queue_wait: wait,
            default_processing: Duration::from_millis(100),
            fair_choice_window: Duration::from_secs(60),
        }),
        Vec::new(),
        8,
    );
    let gw = gateway(core, Arc::new(NoVms), Arc::new(Idle)).await;
    let ticket = || TicketGuard::new(&gw, Ticket::new(RequestMeta::default(), None));
    let queue_len = || gw.status().core.queue.unwrap().length;
    // A takes the one instance; B waits and times out at its deadline (the epoch is a
    // minute: only the queue's timer row can wake the driver).
    let mut a = ticket();
    let Decision::Function { lease, .. } = a.route().0 else {
        panic!("the function tier has room")
    };
    a.cold_start(lease.zone, lease.instance().unwrap())
        .await
        .unwrap();
    let mut b = ticket();
    assert!(matches!(b.route().0, Decision::Queue { .. }));
    let t0 = Instant::now();
    assert!(b.wait_queued().await.is_none(), "timed out");
    assert_eq!(t0.elapsed(), wait);
    assert_eq!(queue_len(), 0);
    // C waits; D waits and is dropped (its client went away): it leaves the queue.
    let mut c = ticket();
    assert!(matches!(c.route().0, Decision::Queue { .. }));
    let mut d = ticket();
    assert!(matches!(d.route().0, Decision::Queue { .. }));
    assert_eq!(queue_len(), 2);
    drop(d);
    assert_eq!(queue_len(), 1);
    // A ends 1 s later: its instance goes to C at once.
    let waiter = tokio::spawn(async move {
        let served = c.wait_queued().await;
        (served.map(|(d, _)| d), Instant::now(), c)
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    let released = Instant::now();
    drop(a);
    let (served, at, c) = waiter.await.unwrap();
    assert!(
        matches!(
            served,
            Some(Decision::Function {
                kind: AttemptKind::Dequeued,
                lease,
                ..
            }) if matches!(lease.start, Start::Warm(_))
        ),
        "{served:?}"
    );
    assert_eq!(at, released);
    assert_eq!(gw.status().core.zones[0].busy, 1);
    // C's guard gives the instance back when dropped: nothing leaks.
    drop(c);
    let z = &gw.status().core.zones[0];
    assert_eq!((z.busy, z.starting, queue_len()), (0, 0, 0));
}
