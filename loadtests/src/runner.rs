//! The open-loop replay engine.
//!
//! A single scheduler task walks the schedule and, at each request's due time,
//! spawns one tokio task that sends it — it never waits for earlier responses.
//! Each request task reports its [`Outcome`] over a channel to the collector
//! (the caller's task), which keeps per-interval [`Stats`].
//!
//! Requests are attributed to the interval in which they were *scheduled*. At
//! each interval boundary the scheduler spawns an admin `/status` snapshot and
//! then tells the collector how many requests that interval dispatched; the
//! collector emits the interval's row once all of them have finished (each is
//! bounded by the request timeout), in interval order.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Uri};
use tokio::sync::{Semaphore, mpsc};
use tokio::time::Instant;

use crate::admin::{self, AdminSnapshot, HttpClient};
use crate::report::Row;
use crate::schedule::{interval_of, send_offsets, trace_to_real};
use crate::stats::{Outcome, Stats};

/// Everything the replay needs, already validated.
#[derive(Clone, Debug)]
pub(crate) struct Plan {
    /// Target of the load (loopback, checked).
    pub url: Uri,
    /// HTTP method of every request.
    pub method: Method,
    /// Request body, shared by all requests (empty for none).
    pub body: Bytes,
    /// Requests per replayed second, after slicing and scaling.
    pub counts: Vec<u64>,
    /// Absolute trace second of `counts[0]` (`--from`), for labelling rows.
    pub first_second: u64,
    /// Trace seconds per real second.
    pub compression: f64,
    /// Trace seconds per report interval.
    pub interval_seconds: u64,
    /// Per-request timeout.
    pub timeout: Duration,
    /// Most requests outstanding at once; more are counted as overload.
    pub max_in_flight: usize,
    /// Admin `/status` URL, if any.
    pub status_url: Option<Uri>,
    /// Bearer token for the admin endpoint (`--admin-token`).
    pub admin_token: Option<String>,
    /// Share of requests sent with `Prefer: respond-async` (asynchronous calls,
    /// ProFaaStinate), 0–1, spread evenly; 0: none.
    pub async_share: f64,
}

/// The result of a completed replay.
#[derive(Debug)]
pub(crate) struct Summary {
    /// The whole-run row.
    pub total: Row,
    /// The latest any request was sent after its scheduled time.
    pub max_dispatch_lag: Duration,
}

/// Messages from the scheduler and the request tasks to the collector.
enum Event {
    /// A request of interval `interval` finished.
    Done { interval: usize, outcome: Outcome },
    /// Interval `interval` dispatched its last request; `snapshot` was taken at
    /// its end boundary.
    Closed {
        interval: usize,
        dispatched: u64,
        snapshot: Option<AdminSnapshot>,
    },
}

/// Fetches admin snapshots, warning on standard error on the first failure only.
#[derive(Clone)]
struct Admin {
    client: HttpClient,
    url: Option<Uri>,
    token: Option<String>,
    warned: Arc<AtomicBool>,
}

impl Admin {
    async fn snapshot(&self) -> Option<AdminSnapshot> {
        let url = self.url.as_ref()?;
        // A pooled connection the admin listener closed while idle fails once; a second
        // attempt opens a fresh one.
        let token = self.token.as_deref();
        let fetched = match admin::fetch(&self.client, url, token).await {
            Ok(snapshot) => Ok(snapshot),
            Err(_) => admin::fetch(&self.client, url, token).await,
        };
        match fetched {
            Ok(snapshot) => Some(snapshot),
            Err(err) => {
                if !self.warned.swap(true, Ordering::Relaxed) {
                    eprintln!(
                        "warning: admin snapshot failed ({err:#}); showing \"-\" where needed"
                    );
                }
                None
            }
        }
    }
}

/// Per-interval collector state.
struct Slot {
    start: u64,
    end: u64,
    stats: Stats,
    closed: Option<(u64, Option<AdminSnapshot>)>,
}

/// Send one request and classify how it ended. `due` is its scheduled time.
pub(crate) async fn send(
    client: HttpClient,
    request: hyper::Request<Full<Bytes>>,
    due: Instant,
    timeout: Duration,
) -> Outcome {
    let exchange = async {
        let response = client.request(request).await.map_err(|err| {
            if err.is_connect() {
                Outcome::Connect
            } else {
                Outcome::Io
            }
        })?;
        let status = response.status().as_u16();
        let mut body = response.into_body();
        while let Some(frame) = body.frame().await {
            frame.map_err(|_| Outcome::Io)?;
        }
        Ok(status)
    };
    match tokio::time::timeout(timeout, exchange).await {
        Err(_) => Outcome::Timeout,
        Ok(Err(outcome)) => outcome,
        Ok(Ok(status)) => Outcome::Response {
            status,
            latency: due.elapsed(),
        },
    }
}

/// The scheduler: dispatches every request at its due time and closes intervals.
/// Returns the largest dispatch lag.
async fn schedule(
    plan: Arc<Plan>,
    client: HttpClient,
    admin: Admin,
    tx: mpsc::UnboundedSender<Event>,
) -> Duration {
    let slots = Arc::new(Semaphore::new(plan.max_in_flight));
    let start = Instant::now();
    let total_seconds = plan.counts.len() as u64;
    let mut dispatched = 0u64;
    let mut max_lag = Duration::ZERO;
    // Error-diffusion: every request adds the share; crossing 1 makes it asynchronous.
    let mut async_acc = 0.0f64;

    // Close interval `interval` at its end boundary `end` (relative trace second).
    let close = |interval: usize, end: u64, dispatched: u64| {
        let admin = admin.clone();
        let tx = tx.clone();
        let boundary = start + trace_to_real(end as f64, plan.compression);
        async move {
            tokio::time::sleep_until(boundary).await;
            tokio::spawn(async move {
                let snapshot = admin.snapshot().await;
                let _ = tx.send(Event::Closed {
                    interval,
                    dispatched,
                    snapshot,
                });
            });
        }
    };

    for (second, &n) in plan.counts.iter().enumerate() {
        let second = second as u64;
        let interval = (second / plan.interval_seconds) as usize;
        if second > 0 && second.is_multiple_of(plan.interval_seconds) {
            close(interval - 1, second, dispatched).await;
            dispatched = 0;
        }
        for offset in send_offsets(second, n, plan.compression) {
            let due = start + offset;
            tokio::time::sleep_until(due).await;
            max_lag = max_lag.max(due.elapsed());
            dispatched += 1;
            let Ok(permit) = slots.clone().try_acquire_owned() else {
                let _ = tx.send(Event::Done {
                    interval,
                    outcome: Outcome::Overload,
                });
                continue;
            };
            async_acc += plan.async_share;
            let is_async = async_acc >= 1.0 - 1e-9;
            if is_async {
                async_acc -= 1.0;
            }
            let mut builder = hyper::Request::builder();
            if is_async {
                builder = builder.header("prefer", "respond-async");
            }
            let request = builder
                .method(plan.method.clone())
                .uri(plan.url.clone())
                .body(Full::new(plan.body.clone()))
                .expect("method and URI were validated");
            let (client, tx, timeout) = (client.clone(), tx.clone(), plan.timeout);
            tokio::spawn(async move {
                let outcome = send(client, request, due, timeout).await;
                drop(permit);
                let _ = tx.send(Event::Done { interval, outcome });
            });
        }
    }
    let last = ((total_seconds - 1) / plan.interval_seconds) as usize;
    close(last, total_seconds, dispatched).await;
    max_lag
}

/// Replay `plan`, calling `on_row` for each interval row as soon as it is
/// complete, in order. Returns once every request has finished.
pub(crate) async fn run(
    plan: Plan,
    client: HttpClient,
    mut on_row: impl FnMut(&Row),
) -> anyhow::Result<Summary> {
    anyhow::ensure!(!plan.counts.is_empty(), "nothing to replay");
    anyhow::ensure!(
        plan.interval_seconds > 0,
        "interval must be at least one second"
    );
    let plan = Arc::new(plan);
    let admin = Admin {
        client: client.clone(),
        url: plan.status_url.clone(),
        token: plan.admin_token.clone(),
        warned: Arc::default(),
    };
    let initial = admin.snapshot().await;

    let total_seconds = plan.counts.len() as u64;
    let mut slots: Vec<Slot> = (0..total_seconds)
        .step_by(plan.interval_seconds as usize)
        .map(|s| {
            let (start, end) = interval_of(s, plan.interval_seconds, total_seconds);
            Slot {
                start: plan.first_second + start,
                end: plan.first_second + end,
                stats: Stats::default(),
                closed: None,
            }
        })
        .collect();

    let (tx, mut rx) = mpsc::unbounded_channel();
    let scheduler = tokio::spawn(schedule(plan.clone(), client, admin, tx));

    let mut total = Stats::default();
    let mut previous = initial;
    let mut latest = initial;
    let mut next = 0;
    while next < slots.len() {
        let Some(event) = rx.recv().await else {
            // Every sender is gone: only possible if the scheduler panicked.
            scheduler.await?;
            anyhow::bail!("the scheduler stopped before closing every interval");
        };
        match event {
            Event::Done { interval, outcome } => slots[interval].stats.record(outcome),
            Event::Closed {
                interval,
                dispatched,
                snapshot,
            } => {
                slots[interval].closed = Some((dispatched, snapshot));
            }
        }
        while let Some(slot) = slots.get_mut(next) {
            let Some((dispatched, snapshot)) = slot.closed else {
                break;
            };
            if slot.stats.requests < dispatched {
                break;
            }
            let row = Row {
                label: None,
                start: slot.start,
                end: slot.end,
                stats: std::mem::take(&mut slot.stats),
                shares: previous
                    .zip(snapshot)
                    .and_then(|(a, b)| admin::shares(&a, &b)),
                ready_vms: snapshot.and_then(|s| s.ready_vms),
                async_calls: async_delta(plan.async_share, previous, snapshot),
            };
            on_row(&row);
            total.merge(&row.stats);
            previous = snapshot;
            if snapshot.is_some() {
                latest = snapshot;
            }
            next += 1;
        }
    }
    let max_dispatch_lag = scheduler.await?;
    let last = slots.last().expect("at least one interval");
    let total = Row {
        label: Some("TOTAL"),
        start: plan.first_second,
        end: last.end,
        stats: total,
        shares: initial.zip(latest).and_then(|(a, b)| admin::shares(&a, &b)),
        ready_vms: last.closed.and_then(|(_, s)| s).and_then(|s| s.ready_vms),
        async_calls: async_delta(plan.async_share, initial, latest),
    };
    Ok(Summary {
        total,
        max_dispatch_lag,
    })
}

/// Asynchronous calls queued and released between two snapshots, and waiting at the
/// second (`--async-share` only; `None` without the admin endpoint's `async` section).
fn async_delta(
    share: f64,
    before: Option<AdminSnapshot>,
    after: Option<AdminSnapshot>,
) -> Option<(u64, u64, u64)> {
    if share <= 0.0 {
        return None;
    }
    let (q1, r1, _) = before?.async_calls?;
    let (q2, r2, waiting) = after?.async_calls?;
    Some((q2.saturating_sub(q1), r2.saturating_sub(r1), waiting))
}
