//! The trace-driven discrete-event simulator and the cost model: replays a trace through
//! the same [`crate::policy`] types the gateway runs, on a virtual clock, and compares
//! LIBRA with the paper's baselines (LIBRA §IV) on cost, SLA violations and latency.
//!
//! * the `sim:` config section (request, VM, function models; SLA; AUTO) is
//!   [`crate::config::sim`]: the config module owns the whole schema.
//! * [`trace`] — trace formats (`counts`, `events`, `azure2019`, `azure2021`), windowing
//!   and rate scaling.
//! * [`model`] — service-time distributions and VM billing.
//! * [`engine`] — the discrete-event engine driving [`crate::policy::controller::Controller`]
//!   and [`crate::policy::functions::FunctionPool`].
//! * [`report`] — result objects, the comparison table and the per-epoch CSV.
//! * [`costmodel`] — `spillway cost`: LIBRA §II's cost curves and the CIP.
//! * [`plot`] — SVG plots (no fonts needed).
//! * [`cli`] — `spillway sim` and `spillway cost` arguments and entry points.

pub mod cli;
pub mod costmodel;
pub mod delay;
pub mod engine;
pub mod model;
pub mod plot;
pub mod report;
pub mod trace;

use std::path::PathBuf;

use crate::config::Config;
use engine::{PolicyKind, PolicyRun, SimParams, run_policy};
use report::SimReport;
use trace::Trace;

/// Why a simulation or cost report failed. Every variant names the file (and line) or
/// the field at fault.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// A file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A malformed line in a trace (or side) file.
    #[error("{file}:{line}: {message}")]
    Parse {
        /// The file.
        file: String,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// The configuration could not be loaded.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// An option or a field is invalid.
    #[error("{field}: {message}")]
    Invalid {
        /// The option (`--rate-divisor`) or config field (`sim.vm.slots`).
        field: String,
        /// What is wrong.
        message: String,
    },
    /// A plot could not be drawn.
    #[error("{}: cannot draw the plot: {message}", path.display())]
    Plot {
        /// The output file.
        path: PathBuf,
        /// The drawing error.
        message: String,
    },
}

/// Run `policies` over `trace` with the configuration `config` and `seed`; each policy
/// starts from the same seed (common random numbers: the same arrivals and service times).
/// `progress` receives `(policy index, arrivals processed)`.
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
    let params = SimParams::from_config(config)?;
    let runs: Vec<PolicyRun> = policies
        .iter()
        .enumerate()
        .map(|(i, &k)| run_policy(&params, trace, k, seed, series, &mut |n| progress(i, n)))
        .collect();
    let report = SimReport {
        policies: runs.iter().map(|r| r.report.clone()).collect(),
        trace: trace.path.clone(),
        seed,
    };
    Ok((report, runs))
}
