//! The trace-driven discrete-event simulator and the cost model: replays a trace through
//! the same [`crate::policy`] types the gateway runs, on a virtual clock, and compares
//! LIBRA with the paper's baselines (LIBRA §IV) on cost, SLA violations and latency.
//!
//! * the `sim:` config section (request, VM, function models; SLA; AUTO) is
//!   [`crate::config::sim`]: the config module owns the whole schema.
//! * [`trace`] — trace formats (`counts`, `events`, `azure2019`, `azure2021`), windowing
//!   and rate scaling.
//! * [`trace_model`] — the trace's data types (format, options, arrivals, [`Trace`]),
//!   shared by [`trace`] and [`logs`].
//! * [`logs`] — access logs (spillway, nginx, ALB, API Gateway) as traces.
//! * [`model`] — service-time distributions and VM billing.
//! * [`engine`] — the discrete-event engine driving [`crate::policy::controller::Controller`]
//!   and [`crate::policy::functions::FunctionPool`]; also the delay-queue experiment
//!   (ProFaaStinate §3, [`engine::run_delay`]): synchronous and asynchronous calls of an
//!   `events` trace on VMs with shared CPU cores.
//! * [`faasim`] — FaaSim's burst and stream workloads from a seeded generator.
//! * [`replicas`] — `sim.replicas`: several gateway replicas sharing one decision
//!   through the coordination store (its delay and outages), one engine per replica.
//! * [`report`] — result objects, the comparison table and the per-epoch CSV.
//! * [`costmodel`] — `spillway cost`: LIBRA §II's cost curves and the CIP.
//! * [`plot`] — SVG plots (no fonts needed).
//! * [`tune`] — `spillway tune`: grid search of LIBRA's settings, Pareto front.
//! * [`cli`] — `spillway sim` and `spillway cost` arguments and entry points.
//! * `error` — [`SimError`], which every file of the simulator returns (a leaf: it imports
//!   none of them).

pub mod cli;
pub mod costmodel;
pub mod engine;
mod error;
pub mod faasim;
pub mod logs;
pub mod model;
pub mod plot;
pub mod replicas;
pub mod report;
pub mod trace;
pub mod trace_model;
pub mod tune;

use crate::config::Config;
use engine::{PolicyKind, PolicyRun, SimParams};
pub use error::SimError;
use replicas::run_policy_with;
use report::SimReport;
use trace::Trace;

/// Run `policies` over `trace` with the configuration `config` and `seed`; each policy
/// starts from the same seed (common random numbers: the same arrivals and service times).
/// The policies run in parallel, one per core; the results do not depend on it.
/// `progress` receives `(policy index, arrivals processed)` on the calling thread.
///
/// # Errors
/// [`SimError::Invalid`] if the configuration's models cannot be built.
pub fn simulate(
    config: &Config,
    trace: &Trace,
    policies: &[PolicyKind],
    seed: u64,
    series: bool,
    progress: &mut dyn FnMut(usize, u64),
) -> Result<(SimReport, Vec<PolicyRun>), SimError> {
    simulate_with(
        config,
        trace,
        policies,
        seed,
        series.then_some(usize::MAX),
        progress,
    )
}

/// [`simulate`] with at most `series_rows` per-epoch rows per policy (`None`: no series).
///
/// # Errors
/// As [`simulate`].
pub fn simulate_with(
    config: &Config,
    trace: &Trace,
    policies: &[PolicyKind],
    seed: u64,
    series_rows: Option<usize>,
    progress: &mut dyn FnMut(usize, u64),
) -> Result<(SimReport, Vec<PolicyRun>), SimError> {
    let params = SimParams::from_config(config)?;
    // One worker per core, each taking the next policy; the runs share nothing, so the
    // results are those of a sequential run. Progress reaches `progress` on this thread.
    enum Msg {
        Progress(usize, u64),
        Done(usize, Box<PolicyRun>),
    }
    let workers = std::thread::available_parallelism()
        .map_or(1, std::num::NonZero::get)
        .min(policies.len())
        .max(1);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut runs: Vec<Option<PolicyRun>> = policies.iter().map(|_| None).collect();
    std::thread::scope(|scope| {
        let (tx, rx) = std::sync::mpsc::channel::<Msg>();
        for _ in 0..workers {
            let (tx, params, next) = (tx.clone(), &params, &next);
            scope.spawn(move || {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(&kind) = policies.get(i) else { break };
                    let run = run_policy_with(params, trace, kind, seed, series_rows, &mut |n| {
                        let _ = tx.send(Msg::Progress(i, n));
                    });
                    let _ = tx.send(Msg::Done(i, Box::new(run)));
                }
            });
        }
        drop(tx);
        for msg in rx {
            match msg {
                Msg::Progress(i, n) => progress(i, n),
                Msg::Done(i, run) => runs[i] = Some(*run),
            }
        }
    });
    let runs: Vec<PolicyRun> = runs
        .into_iter()
        .map(|r| r.expect("every policy ran (a worker panic propagates from the scope)"))
        .collect();
    let report = SimReport {
        policies: runs.iter().map(|r| r.report.clone()).collect(),
        trace: trace.path.clone(),
        seed,
        log: None,
    };
    Ok((report, runs))
}
