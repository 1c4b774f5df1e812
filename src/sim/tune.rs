//! `spillway tune`: search LIBRA's and the function tier's settings on a trace for the
//! lowest cost whose SLA violations stay within a target.
//!
//! The user picks the dimensions (`--search NAME=VALUES`, repeatable): `phi`, `rho`,
//! `decision_epochs`, `keep_alive`, `prewarm` (or any dotted config path), each with a
//! list (`0.5,1,2`) or an inclusive range (`0.5:2:0.25`, `LO:HI:STEP`). Every point of
//! the grid (their Cartesian product, at most `--max-configs`) is one LIBRA run of the
//! discrete-event engine on the same trace and seed (common random numbers), spread over
//! every core with std threads (the runs share nothing but the parsed trace; the front
//! and the recommendation do not depend on the thread count). The output:
//! * the Pareto front of cost against SLA violations (no other point is both cheaper and
//!   better on violations), as a table and optionally an SVG with every point;
//! * the recommended point: the cheapest with violations ≤ `--max-violation-pct`;
//! * the recommendation as a YAML fragment (`--out`), which `spillway check --sim`
//!   accepts, and as the `--set PATH=VALUE` options that apply it to the base config;
//! * what the live gateway can and cannot honour of it ([`honour_notes`]): keep-alive is
//!   the function platform's (Lambda's cannot be set), a simulated per-VM cap needs
//!   `vm_pool.slots_per_vm` live, and so on.
//!
//! A grid is searched exhaustively (no sampling or hill-climbing): its optimum is the
//! enumeration's. What is saved is only provably wasted work: the runs are pausable
//! ([`Run`]), at most 16 are alive (or one per thread), the cheapest so far advances
//! first, and a run stops once it is exactly dominated — its cost so far already
//! exceeds the final cost of a finished run with no more SLA violations than it has so
//! far. Both only grow as a run advances, so a stopped run would have ended off the
//! Pareto front: the front and the recommendation are the exhaustive search's
//! (`--no-prune` runs everything to the end; `--plot`, which shows every point, too).
//! Home-made rather than a search library's because the bound is the engine's own
//! (partial cost and violations) and the schedule is a few lines over `std` threads.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::{Condvar, Mutex};
use plotters::prelude::*;
use serde::Serialize;

use super::cli::{TraceArgs, invalid, load_config, load_trace, split_assignment, write_file};
use super::engine::{Partial, PolicyKind, Run, SimParams};
use super::error::SimError;
use super::replicas::run_policy_with;
use super::trace::Trace;
use crate::config::Config;

/// The example at the end of `spillway tune --help`: from an access log to a checked
/// config.
pub const TUNE_EXAMPLE: &str = "\
Example, from an nginx access log to a recommended config:
  spillway tune --config config/sim/libra-paper.yaml --format nginx --trace access.log \\
    --search phi=0:2:0.5 --search rho=0.6:1:0.2 --search decision_epochs=60,300 \\
    --max-violation-pct 0.5 --plot front.svg --out tuned.yaml
  spillway check --sim tuned.yaml
  spillway sim --config config/sim/libra-paper.yaml --format nginx --trace access.log \\
    --policy libra $(sed -n 's/^#   //p' tuned.yaml)

The front is every configuration no other beats on both cost and SLA violations; the
recommendation is the cheapest within --max-violation-pct. Settings the live gateway cannot
honour as simulated (Lambda's keep-alive, a per-VM cap) are named in the notes.";

/// `spillway tune`: search φ, ρ, decision_epochs, keep-alive and pre-warm on a trace for
/// the lowest cost with SLA violations ≤ a target.
#[derive(Clone, Debug, clap::Args)]
#[command(after_help = TUNE_EXAMPLE)]
pub struct TuneArgs {
    /// Base configuration (gateway schema + `sim:`); default: the built-in
    /// config/sim/libra-paper.yaml.
    #[arg(long, short, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Where the trace comes from and how to read it (as `spillway sim`).
    #[command(flatten)]
    pub input: TraceArgs,
    /// One dimension of the search, repeatable: NAME=V1,V2,... or NAME=LO:HI:STEP
    /// (inclusive). NAME: phi (libra.phi), rho (libra.rho), decision_epochs
    /// (libra.decision_epochs), keep_alive (sim.function.keep_alive_seconds, or every
    /// function zone's keep_alive_seconds), prewarm (sim.function.prewarmed_instances), or any
    /// dotted config path.
    #[arg(long = "search", value_name = "NAME=VALUES", required = true)]
    pub search: Vec<String>,
    /// The SLA target: the recommendation is the cheapest configuration with at most
    /// this percentage of requests violating the SLA (0-100).
    #[arg(long, default_value_t = 0.0, value_name = "PCT")]
    pub max_violation_pct: f64,
    /// Set one base configuration value before the search (as `spillway sim --set`).
    #[arg(long = "set", value_name = "PATH=VALUE")]
    pub set: Vec<String>,
    /// RNG seed, the same for every configuration.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Worker threads (default: every core).
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// Refuse grids with more configurations than this.
    #[arg(long, default_value_t = 10_000, value_name = "N")]
    pub max_configs: usize,
    /// Write the recommended settings here as a YAML fragment (`-`: stdout).
    #[arg(long, value_name = "FILE.yaml")]
    pub out: Option<PathBuf>,
    /// Draw cost against SLA violations for every configuration, the Pareto front and
    /// the recommendation into this SVG.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// Write every configuration's result, the front and the recommendation as JSON
    /// (`-`: stdout).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// No tables (the fragment still goes to `--out`).
    #[arg(long)]
    pub quiet: bool,
    /// Run every configuration to the end. By default a run stops early once a
    /// finished one is cheaper than its cost so far with no more SLA violations than it
    /// has so far (the front and the recommendation are the same either way; `--json`
    /// gives a stopped run's `stopped_at_s`). `--plot` implies it.
    #[arg(long)]
    pub no_prune: bool,
}

/// One dimension of the grid: a config path and its values.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Dimension {
    /// The name as given (`phi`, or a dotted path).
    pub name: String,
    /// The config path set (`libra.phi`).
    pub path: String,
    /// The values, as YAML scalars (`0.5`, `300`).
    pub values: Vec<String>,
}

/// The config path of a short name, for `config` (keep-alive lives in the function
/// zones when there are any).
pub fn path_of(name: &str, config: &Config) -> String {
    match name {
        "phi" => "libra.phi".into(),
        "rho" => "libra.rho".into(),
        "decision_epochs" => "libra.decision_epochs".into(),
        "keep_alive" if config.function_zones.is_empty() => {
            "sim.function.keep_alive_seconds".into()
        }
        "keep_alive" => "function_zones[*].keep_alive_seconds".into(),
        "prewarm" => "sim.function.prewarmed_instances".into(),
        other => other.into(),
    }
}

/// Whether a path takes whole numbers only.
fn integral(path: &str) -> bool {
    matches!(
        path,
        "libra.decision_epochs" | "sim.function.prewarmed_instances"
    )
}

/// Format a number as the shortest YAML scalar that reads back as it (`1`, `0.25`).
fn scalar(v: f64) -> String {
    let v = (v * 1e9).round() / 1e9;
    format!("{v}")
}

/// Parse one `--search NAME=VALUES`.
///
/// # Errors
/// [`SimError::Invalid`] naming `--search` for a malformed list or range, a non-integer
/// value of an integer setting, or more than 100 000 values.
pub fn parse_dimension(text: &str, config: &Config) -> Result<Dimension, SimError> {
    let (name, spec) = split_assignment("--search", text)?;
    let path = path_of(name, config);
    let bad = |m: String| invalid("--search", format!("{text}: {m}"));
    let values: Vec<String> = if spec.split(':').count() == 3 && !spec.contains(',') {
        let num = |s: &str| {
            s.parse::<f64>()
                .ok()
                .filter(|v| v.is_finite())
                .ok_or_else(|| bad(format!("{s:?} is not a number (LO:HI:STEP)")))
        };
        let parts: Vec<&str> = spec.split(':').collect();
        let (lo, hi, step) = (num(parts[0])?, num(parts[1])?, num(parts[2])?);
        if !(step > 0.0 && hi >= lo) {
            return Err(bad("a range needs LO <= HI and STEP > 0".into()));
        }
        let n = ((hi - lo) / step + 1e-9).floor();
        if n >= 100_000.0 {
            return Err(bad(format!("{} values; at most 100000", n + 1.0)));
        }
        (0..=n as u64)
            .map(|i| scalar(lo + i as f64 * step))
            .collect()
    } else {
        spec.split(',').map(|v| v.trim().to_string()).collect()
    };
    if values.iter().any(String::is_empty) {
        return Err(bad("an empty value".into()));
    }
    if integral(&path) {
        for v in &values {
            if v.parse::<u64>().is_err() {
                return Err(bad(format!("{path} takes whole numbers, got {v:?}")));
            }
        }
    }
    let mut seen = std::collections::HashSet::new();
    if let Some(v) = values.iter().find(|v| !seen.insert(v.as_str())) {
        return Err(bad(format!("{v} is listed twice")));
    }
    if seen.len() > 100_000 {
        return Err(bad("more than 100000 values".into()));
    }
    Ok(Dimension {
        name: name.to_string(),
        path,
        values,
    })
}

/// One configuration of the grid and its LIBRA run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Candidate {
    /// One value per dimension, in `--search` order.
    pub values: Vec<String>,
    /// Total cost, USD.
    pub cost_usd: f64,
    /// VM cost, USD.
    pub vm_usd: f64,
    /// Function cost, USD.
    pub function_usd: f64,
    /// SLA violations (slow, throttled or rejected requests).
    pub sla_violations: u64,
    /// `sla_violations` as a percentage of the requests (0–100).
    pub sla_violation_pct: f64,
    /// Fraction of served requests on functions, 0–1.
    pub function_share: f64,
    /// Simulated time (s) at which the search stopped this configuration's run because
    /// a finished one was cheaper with no more violations (its numbers are then what
    /// it had accrued by this time: lower bounds); `None` when it ran to the end.
    pub stopped_at_s: Option<f64>,
}

/// The search's result.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TuneResult {
    /// The dimensions searched.
    pub dimensions: Vec<Dimension>,
    /// Every configuration, in grid order (the last dimension varies fastest).
    pub candidates: Vec<Candidate>,
    /// Indices into `candidates` of the Pareto front, cheapest first.
    pub front: Vec<usize>,
    /// The SLA target, % of requests.
    pub max_violation_pct: f64,
    /// Index of the recommendation: the cheapest configuration within the target
    /// (ties: fewer violations, then grid order); `None` if none is.
    pub recommended: Option<usize>,
}

/// The grid point `i` (last dimension fastest): one value index per dimension.
fn grid_point(dims: &[Dimension], mut i: usize) -> Vec<usize> {
    let mut out = vec![0; dims.len()];
    for (d, slot) in dims.iter().zip(out.iter_mut()).rev() {
        *slot = i % d.values.len();
        i /= d.values.len();
    }
    out
}

/// The base config with one grid point's values applied.
///
/// # Errors
/// [`SimError::Invalid`] naming `--search` and the value when the result is not a valid
/// configuration (`sim.function.prewarmed_instances` above `max_instances`, ρ above 1, …).
pub fn configure(base: &Config, dims: &[Dimension], values: &[String]) -> Result<Config, SimError> {
    let mut c = base.clone();
    for (d, v) in dims.iter().zip(values) {
        c = crate::config::with_override(&c, &d.path, v).map_err(|m| invalid("--search", m))?;
    }
    Ok(c)
}

/// The Pareto front of `candidates` (minimising cost and violations): indices, cheapest
/// first; of equal points the first in grid order.
pub fn pareto_front(candidates: &[Candidate]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..candidates.len()).collect();
    order.sort_by(|&a, &b| {
        let (x, y) = (&candidates[a], &candidates[b]);
        x.cost_usd
            .total_cmp(&y.cost_usd)
            .then(x.sla_violations.cmp(&y.sla_violations))
            .then(a.cmp(&b))
    });
    let mut front = Vec::new();
    let mut best = u64::MAX;
    for i in order {
        if candidates[i].sla_violations < best {
            best = candidates[i].sla_violations;
            front.push(i);
        }
    }
    front
}

/// How to search: the seed of every run, the worker threads, the largest grid and the
/// SLA target.
#[derive(Clone, Copy, Debug)]
pub struct SearchOptions {
    /// RNG seed, the same for every configuration.
    pub seed: u64,
    /// Worker threads (≥ 1).
    pub threads: usize,
    /// Refuse grids with more configurations.
    pub max_configs: usize,
    /// SLA violations allowed, % of requests.
    pub max_violation_pct: f64,
    /// Stop a run early once it is exactly dominated (see [`search`]); `false`: every
    /// configuration runs to the end.
    pub prune: bool,
}

/// Run LIBRA on `trace` once per grid point of `dims` over `base`, on `o.threads`
/// threads. `progress` is called on this thread with the number of configurations done.
///
/// With `o.prune` (and one gateway: not with `sim.replicas`), a run is stopped once it
/// is exactly dominated — its cost so far exceeds the final cost of a finished run
/// with no more violations than it has so far. Cost and violations never decrease as a
/// run advances ([`Run::partial`]), so a stopped run would have ended off the Pareto
/// front: the front and the recommendation are the exhaustive search's, and a stopped
/// configuration's candidate holds what it had accrued ([`Candidate::stopped_at_s`]).
///
/// # Errors
/// [`SimError::Invalid`] when a grid point is not a valid configuration (checked for
/// every point before any run) or the grid is larger than `max_configs`.
pub fn search(
    base: &Config,
    trace: &Trace,
    dims: &[Dimension],
    o: SearchOptions,
    progress: &mut dyn FnMut(usize),
) -> Result<TuneResult, SimError> {
    let SearchOptions {
        seed,
        threads,
        max_configs,
        max_violation_pct,
        ..
    } = o;
    let total = dims
        .iter()
        .try_fold(1usize, |n, d| n.checked_mul(d.values.len()))
        .filter(|&n| n <= max_configs)
        .ok_or_else(|| {
            invalid(
                "--search",
                format!(
                    "the grid has {} configurations, more than --max-configs {max_configs}",
                    dims.iter()
                        .map(|d| d.values.len().to_string())
                        .collect::<Vec<_>>()
                        .join(" × ")
                ),
            )
        })?;
    // Every point is configured and its models built up front: a bad combination is one
    // error before any work, not a half-done search.
    let mut params = Vec::with_capacity(total);
    let mut values = Vec::with_capacity(total);
    for i in 0..total {
        let v: Vec<String> = grid_point(dims, i)
            .iter()
            .zip(dims)
            .map(|(&j, d)| d.values[j].clone())
            .collect();
        let c = configure(base, dims, &v)?;
        params.push(SimParams::from_config(&c)?);
        values.push(v);
    }
    let prune = o.prune && params.iter().all(|p| p.replicas.is_none());
    let results = if prune {
        search_pruned(trace, &params, &values, seed, threads, progress)
    } else {
        search_all(trace, &params, &values, seed, threads, progress)
    };
    let candidates: Vec<Candidate> = results
        .into_iter()
        .map(|c| c.expect("every configuration ran or was stopped (a worker panic propagates)"))
        .collect();
    let front = pareto_front(&candidates);
    let recommended = front
        .iter()
        .copied()
        .find(|&i| candidates[i].sla_violation_pct <= max_violation_pct + 1e-12);
    Ok(TuneResult {
        dimensions: dims.to_vec(),
        candidates,
        front,
        max_violation_pct,
        recommended,
    })
}

/// A finished run's candidate.
fn candidate(values: &[String], r: &super::report::PolicyReport) -> Candidate {
    Candidate {
        values: values.to_vec(),
        cost_usd: r.cost_usd.total,
        vm_usd: r.cost_usd.vm,
        function_usd: r.cost_usd.function,
        sla_violations: r.sla_violations,
        sla_violation_pct: r.sla_violation_pct,
        function_share: r.function_share,
        stopped_at_s: None,
    }
}

/// A run stopped at `p.time_s`: what it had accrued by then.
fn stopped(values: &[String], p: &Partial) -> Candidate {
    let share = |n: u64, d: u64| if d == 0 { 0.0 } else { n as f64 / d as f64 };
    Candidate {
        values: values.to_vec(),
        cost_usd: p.cost_usd,
        vm_usd: p.vm_usd,
        function_usd: p.function_usd,
        sla_violations: p.sla_violations,
        sla_violation_pct: 100.0 * share(p.sla_violations, p.requests),
        function_share: share(p.function_served, p.served),
        stopped_at_s: Some(p.time_s),
    }
}

/// Every configuration run to the end, `threads` at a time (each worker takes the next).
fn search_all(
    trace: &Trace,
    params: &[SimParams],
    values: &[Vec<String>],
    seed: u64,
    threads: usize,
    progress: &mut dyn FnMut(usize),
) -> Vec<Option<Candidate>> {
    let total = params.len();
    let next = AtomicUsize::new(0);
    let mut results: Vec<Option<Candidate>> = vec![None; total];
    std::thread::scope(|scope| {
        let (tx, rx) = std::sync::mpsc::channel::<(usize, Candidate)>();
        for _ in 0..threads.clamp(1, total.max(1)) {
            let (tx, next) = (tx.clone(), &next);
            scope.spawn(move || {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(p) = params.get(i) else { break };
                    let run = run_policy_with(p, trace, PolicyKind::Libra, seed, None, &mut |_| {});
                    if tx.send((i, candidate(&values[i], &run.report))).is_err() {
                        break;
                    }
                }
            });
        }
        drop(tx);
        let mut done = 0;
        for (i, c) in rx {
            results[i] = Some(c);
            done += 1;
            progress(done);
        }
    });
    results
}

/// Simulated time a run advances between two checks, as a share of the trace window.
const SLICES: u64 = 128;

/// The most runs alive at once (or one per thread, with more threads). Every live run
/// holds its engine's state (VM table, histograms, event queue, ~0.5 MB): 64 of them
/// made each run slower than the stops saved; on full WITS's 100-configuration grid 16
/// took 5 % less CPU than 4 (more runs alive, so the cheapest finishes sooner).
const MAX_LIVE: usize = 16;

/// One configuration's run between two slices: `None` while a worker advances it.
struct Live<'a> {
    index: usize,
    run: Option<Run<'a>>,
    partial: Option<Partial>,
    /// Simulated time the run has been advanced to, ns.
    until_ns: u64,
}

/// The pruned search's shared state.
struct Pool<'a> {
    live: Vec<Live<'a>>,
    /// The next configuration to start.
    next: usize,
    /// `(cost, violations)` of every finished run.
    finished: Vec<(f64, u64)>,
    results: Vec<Option<Candidate>>,
    done: usize,
    /// A worker panicked: the others stop (the scope then propagates the panic).
    failed: bool,
}

/// Marks the pool failed and wakes the other workers when a worker unwinds, so that
/// none waits for the run the panicking one held.
struct FailOnUnwind<'p, 'a>(&'p Mutex<Pool<'a>>, &'p Condvar);

impl Drop for FailOnUnwind<'_, '_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.lock().failed = true;
            self.1.notify_all();
        }
    }
}

impl Pool<'_> {
    /// Whether a run with `p` accrued is exactly dominated: its partial cost already
    /// exceeds the final cost of a finished run with no more violations than it has now.
    /// Partial cost and violations never decrease ([`Run::partial`]), so it ends dearer
    /// with at least as many violations: off the Pareto front, never the recommendation.
    fn dominated(&self, p: &Partial) -> bool {
        self.finished
            .iter()
            .any(|&(cost, v)| p.cost_usd > cost && v <= p.sla_violations)
    }
}

/// The search with early stops: at most 16 runs alive (or one per thread); a worker
/// advances the live run with the lowest partial cost (a configuration not yet started
/// costs 0) by 1/128 of the trace window, and stops a run once it is exactly dominated
/// ([`Pool::dominated`]), so the front and the recommendation are the exhaustive
/// search's. A stopped configuration's candidate is what it had accrued
/// ([`Candidate::stopped_at_s`]); where runs stop depends on the threads' timing, the
/// front and the recommendation do not.
fn search_pruned(
    trace: &Trace,
    params: &[SimParams],
    values: &[Vec<String>],
    seed: u64,
    threads: usize,
    progress: &mut dyn FnMut(usize),
) -> Vec<Option<Candidate>> {
    let total = params.len();
    let threads = threads.clamp(1, total.max(1));
    let max_live = MAX_LIVE.max(threads);
    let end_ns = (trace.duration_s * 1e9).round() as u64;
    // At least a simulated second: a run goes on after a short trace ends.
    let slice = (end_ns / SLICES).max(1_000_000_000);
    let pool = Mutex::new(Pool {
        live: Vec::new(),
        next: 0,
        finished: Vec::new(),
        results: vec![None; total],
        done: 0,
        failed: false,
    });
    let wake = Condvar::new();
    std::thread::scope(|scope| {
        let (tx, rx) = std::sync::mpsc::channel::<usize>();
        for _ in 0..threads {
            let (tx, pool, wake) = (tx.clone(), &pool, &wake);
            scope.spawn(move || {
                let _unwind = FailOnUnwind(pool, wake);
                loop {
                    // Take the cheapest idle run, or start the next configuration.
                    let (index, run, at_ns) = {
                        let mut g = pool.lock();
                        loop {
                            if g.failed {
                                return;
                            }
                            if g.live.len() < max_live && g.next < total {
                                let index = g.next;
                                g.next += 1;
                                g.live.push(Live {
                                    index,
                                    run: None,
                                    partial: None,
                                    until_ns: 0,
                                });
                                break (index, None, 0);
                            }
                            let cheapest = g
                                .live
                                .iter()
                                .enumerate()
                                .filter(|(_, l)| l.run.is_some())
                                .min_by(|(_, a), (_, b)| {
                                    let cost = |l: &Live| l.partial.map_or(0.0, |p| p.cost_usd);
                                    cost(a).total_cmp(&cost(b)).then(a.index.cmp(&b.index))
                                })
                                .map(|(j, _)| j);
                            if let Some(j) = cheapest {
                                let l = &mut g.live[j];
                                break (l.index, l.run.take(), l.until_ns);
                            }
                            if g.live.is_empty() && g.next >= total {
                                return;
                            }
                            wake.wait(&mut g);
                        }
                    };
                    let mut run = run.unwrap_or_else(|| {
                        Run::new(&params[index], trace, PolicyKind::Libra, seed, None)
                    });
                    let until = at_ns.saturating_add(slice);
                    let ended = run.run_until(until, &mut |_| {});
                    let outcome = if ended {
                        Ok(run.finish(&mut |_| {}))
                    } else {
                        Err((run.partial(), run))
                    };
                    let mut g = pool.lock();
                    let j = g
                        .live
                        .iter()
                        .position(|l| l.index == index)
                        .expect("a taken run keeps its place");
                    let mut newly_done = 0;
                    match outcome {
                        Ok(r) => {
                            g.live.swap_remove(j);
                            let c = candidate(&values[index], &r.report);
                            g.finished.push((c.cost_usd, c.sla_violations));
                            g.results[index] = Some(c);
                            newly_done += 1;
                            // Every idle run the new result dominates stops now.
                            let mut k = 0;
                            while k < g.live.len() {
                                let l = &g.live[k];
                                match l.partial {
                                    Some(p) if l.run.is_some() && g.dominated(&p) => {
                                        let i = l.index;
                                        g.live.swap_remove(k);
                                        g.results[i] = Some(stopped(&values[i], &p));
                                        newly_done += 1;
                                    }
                                    _ => k += 1,
                                }
                            }
                        }
                        Err((p, run)) => {
                            if g.dominated(&p) {
                                g.live.swap_remove(j);
                                g.results[index] = Some(stopped(&values[index], &p));
                                newly_done += 1;
                            } else {
                                let l = &mut g.live[j];
                                l.run = Some(run);
                                l.partial = Some(p);
                                l.until_ns = until;
                            }
                        }
                    }
                    g.done += newly_done;
                    let done = g.done;
                    drop(g);
                    wake.notify_all();
                    if newly_done > 0 && tx.send(done).is_err() {
                        return;
                    }
                }
            });
        }
        drop(tx);
        for done in rx {
            progress(done);
        }
    });
    pool.into_inner().results
}

/// What the live gateway makes of a recommended setting, and what the base config
/// assumes that it cannot honour as is: one line each.
pub fn honour_notes(dims: &[Dimension], values: &[String], base: &Config) -> Vec<String> {
    let mut notes = Vec::new();
    for (d, v) in dims.iter().zip(values) {
        let note = match d.path.as_str() {
            "libra.phi" | "libra.rho" | "libra.decision_epochs" => {
                format!("{} = {v}: the live gateway reads the same key", d.path)
            }
            "sim.function.keep_alive_seconds" => format!(
                "{} = {v}: the simulator's model of the function platform; the live gateway \
                 can set it only for `function_tier: {{type: process}}` \
                 (function_tier.keep_alive_seconds) — Lambda's keep-alive is AWS's and cannot \
                 be set",
                d.path
            ),
            "function_zones[*].keep_alive_seconds" => format!(
                "{} = {v}: honoured by `type: process` zones; a Lambda zone's keep-alive is \
                 AWS's and cannot be set",
                d.path
            ),
            "sim.function.prewarmed_instances" => format!(
                "{} = {v}: live as function_tier.prewarmed_instances: {v} (process: instances \
                 kept warm; Lambda: provisioned concurrency, which needs a published version \
                 or alias as the qualifier, not $LATEST, and is billed while it exists)",
                d.path
            ),
            other => format!("{other} = {v}: not checked against what the live gateway honours"),
        };
        notes.push(note);
    }
    if let Some(n) = base.libra.max_outstanding_per_vm {
        notes.push(format!(
            "the simulated balancer spills at {n} requests in flight per VM \
             (libra.max_outstanding_per_vm): the live gateway needs vm_pool.slots_per_vm: {n} \
             for the same result"
        ));
    }
    if base.libra.r_max_adaptive.is_some() {
        notes.push(
            "libra.r_max_adaptive: the result assumes r_max adapts as simulated; live, it \
             adapts to the VMs' measured latency"
                .into(),
        );
    }
    notes
}

/// The recommendation as a YAML fragment: `version: 1` and each searched key under its
/// section (a `[*]` path carries its whole list from the tuned config), with comments
/// naming the trace, the result, the `--set` options and the notes.
pub fn fragment_yaml(
    result: &TuneResult,
    tuned: &Config,
    base: &Config,
    trace: &str,
) -> Option<String> {
    let best = &result.candidates[result.recommended?];
    let mut root = serde_json::Map::new();
    root.insert("version".into(), serde_json::json!(1));
    let full = serde_json::to_value(tuned).expect("configs serialise");
    for d in &result.dimensions {
        let keys: Vec<&str> = d.path.split('.').collect();
        if let Some(at) = keys.iter().position(|k| k.contains('[')) {
            let top = keys[..=at].join(".");
            let top = top.split('[').next().unwrap_or_default();
            let mut src = &full;
            let mut dst = &mut root;
            let parts: Vec<&str> = top.split('.').collect();
            for (n, k) in parts.iter().enumerate() {
                src = &src[*k];
                if n + 1 == parts.len() {
                    dst.insert((*k).into(), src.clone());
                } else {
                    dst = dst
                        .entry(*k)
                        .or_insert_with(|| serde_json::json!({}))
                        .as_object_mut()
                        .expect("a mapping");
                }
            }
            continue;
        }
        let mut src = &full;
        let mut dst = &mut root;
        for (n, k) in keys.iter().enumerate() {
            src = &src[*k];
            if n + 1 == keys.len() {
                dst.insert((*k).into(), src.clone());
            } else {
                dst = dst
                    .entry(*k)
                    .or_insert_with(|| serde_json::json!({}))
                    .as_object_mut()
                    .expect("a mapping");
            }
        }
    }
    let yaml = serde_saphyr::to_string(&serde_json::Value::Object(root)).ok()?;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# spillway tune: the cheapest of {} configurations with SLA violations <= {} % on {trace}",
        result.candidates.len(),
        result.max_violation_pct
    );
    let _ = writeln!(
        out,
        "# LIBRA: cost {:.4} USD (VM {:.4}, functions {:.4}), SLA violations {} ({:.3} %)",
        best.cost_usd, best.vm_usd, best.function_usd, best.sla_violations, best.sla_violation_pct
    );
    let _ = writeln!(out, "# apply to the base config with:");
    let _ = writeln!(out, "#   {}", set_options(result).unwrap_or_default());
    for n in honour_notes(&result.dimensions, &best.values, base) {
        let _ = writeln!(out, "# note: {n}");
    }
    out.push_str(&yaml);
    if !out.ends_with('\n') {
        out.push('\n');
    }
    Some(out)
}

/// `--set PATH=VALUE …` for the recommendation.
pub fn set_options(result: &TuneResult) -> Option<String> {
    let best = &result.candidates[result.recommended?];
    Some(
        result
            .dimensions
            .iter()
            .zip(&best.values)
            .map(|(d, v)| format!("--set {}={v}", d.path))
            .collect::<Vec<_>>()
            .join(" "),
    )
}

/// The Pareto front as a table, the recommendation marked.
pub fn front_table(result: &TuneResult) -> String {
    let mut out = String::new();
    let widths: Vec<usize> = result
        .dimensions
        .iter()
        .map(|d| {
            d.values
                .iter()
                .map(String::len)
                .chain([d.name.len()])
                .max()
                .unwrap_or(1)
        })
        .collect();
    for (d, w) in result.dimensions.iter().zip(&widths) {
        let _ = write!(out, "{:>w$} ", d.name);
    }
    let _ = writeln!(
        out,
        "{:>10} {:>9} {:>9} {:>9} {:>8} {:>6}",
        "cost_usd", "vm_usd", "fn_usd", "sla_viol", "viol_%", "fn_%"
    );
    for &i in &result.front {
        let c = &result.candidates[i];
        for (v, w) in c.values.iter().zip(&widths) {
            let _ = write!(out, "{v:>w$} ");
        }
        let _ = write!(
            out,
            "{:>10.4} {:>9.4} {:>9.4} {:>9} {:>8.3} {:>6.2}",
            c.cost_usd,
            c.vm_usd,
            c.function_usd,
            c.sla_violations,
            c.sla_violation_pct,
            100.0 * c.function_share
        );
        if Some(i) == result.recommended {
            out.push_str("  <- recommended");
        }
        out.push('\n');
    }
    out
}

/// Draw every configuration (cost against SLA violations), the front and the
/// recommendation into an SVG.
///
/// # Errors
/// [`SimError::Plot`] if drawing or writing fails.
pub fn plot_front(result: &TuneResult, path: &Path) -> Result<(), SimError> {
    let err = |e: &dyn std::fmt::Display| SimError::Plot {
        path: path.to_owned(),
        message: e.to_string(),
    };
    let c = &result.candidates;
    let x_max = c
        .iter()
        .map(|c| c.sla_violation_pct)
        .fold(result.max_violation_pct, f64::max)
        .max(1e-3)
        * 1.1;
    let y_max = c.iter().map(|c| c.cost_usd).fold(1e-9, f64::max) * 1.15;
    let root = SVGBackend::new(path, (900, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "spillway tune: cost against SLA violations (LIBRA)",
            ("sans-serif", 20),
        )
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc("SLA violations, % of requests")
        .y_desc("cost, USD")
        .draw()
        .map_err(|e| err(&e))?;
    let grey = RGBColor(160, 160, 160);
    chart
        .draw_series(
            c.iter()
                .map(|c| Circle::new((c.sla_violation_pct, c.cost_usd), 3, grey.filled())),
        )
        .map_err(|e| err(&e))?
        .label("configuration")
        .legend(move |(x, y)| Circle::new((x, y), 3, grey.filled()));
    let blue = RGBColor(31, 119, 180);
    let front: Vec<(f64, f64)> = result
        .front
        .iter()
        .map(|&i| (c[i].sla_violation_pct, c[i].cost_usd))
        .collect();
    chart
        .draw_series(LineSeries::new(front.clone(), blue.stroke_width(2)))
        .map_err(|e| err(&e))?
        .label("Pareto front")
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], blue.stroke_width(2)));
    chart
        .draw_series(front.iter().map(|&p| Circle::new(p, 4, blue.filled())))
        .map_err(|e| err(&e))?;
    let red = RGBColor(214, 39, 40);
    chart
        .draw_series(LineSeries::new(
            [
                (result.max_violation_pct, 0.0),
                (result.max_violation_pct, y_max),
            ],
            red.stroke_width(1),
        ))
        .map_err(|e| err(&e))?
        .label("SLA target")
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], red.stroke_width(1)));
    if let Some(i) = result.recommended {
        chart
            .draw_series([Circle::new(
                (c[i].sla_violation_pct, c[i].cost_usd),
                7,
                red.stroke_width(2),
            )])
            .map_err(|e| err(&e))?
            .label("recommended")
            .legend(move |(x, y)| Circle::new((x, y), 6, red.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

/// Run `spillway tune`: print the front, the recommendation and what the live gateway
/// makes of it; write `--out`, `--plot`, `--json`. Exit code 1 when no configuration
/// meets the target (the front is still printed).
///
/// # Errors
/// Any [`SimError`]: unreadable or malformed files, invalid options or grid points.
pub fn run_tune(args: &TuneArgs) -> Result<ExitCode, SimError> {
    if !(args.max_violation_pct.is_finite() && (0.0..=100.0).contains(&args.max_violation_pct)) {
        return Err(invalid(
            "--max-violation-pct",
            format!(
                "must be a percentage in [0, 100], got {}",
                args.max_violation_pct
            ),
        ));
    }
    let mut base = load_config(args.config.as_deref())?;
    for text in &args.set {
        let (path, value) = split_assignment("--set", text)?;
        base = crate::config::with_override(&base, path, value).map_err(|m| invalid("--set", m))?;
    }
    let dims = args
        .search
        .iter()
        .map(|s| parse_dimension(s, &base))
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(d) = dims
        .iter()
        .enumerate()
        .find(|(i, d)| dims[..*i].iter().any(|e| e.path == d.path))
    {
        return Err(invalid(
            "--search",
            format!("{} is searched twice", d.1.path),
        ));
    }
    let (trace, log) = load_trace(&args.input, &base)?;
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, std::num::NonZero::get));
    if threads == 0 {
        return Err(invalid("--threads", "must be at least 1".into()));
    }
    // The search's wall-clock time is reported to the user; it never feeds a run.
    #[allow(clippy::disallowed_methods)]
    let wall = std::time::Instant::now();
    let mut last = 0u64;
    let total: usize = dims.iter().map(|d| d.values.len()).product();
    let quiet = args.quiet;
    let result = search(
        &base,
        &trace,
        &dims,
        SearchOptions {
            seed: args.seed,
            threads,
            max_configs: args.max_configs,
            max_violation_pct: args.max_violation_pct,
            // The plot shows every point: each runs to the end.
            prune: !args.no_prune && args.plot.is_none(),
        },
        &mut |done| {
            let s = wall.elapsed().as_secs();
            if !quiet && s >= last + 10 {
                last = s - s % 10;
                eprintln!("progress: {done} of {total} configurations after {s} s");
            }
        },
    )?;
    let secs = wall.elapsed().as_secs_f64();
    let tuned = result
        .recommended
        .map(|i| configure(&base, &dims, &result.candidates[i].values))
        .transpose()?;
    if !args.quiet {
        if let Some(s) = &log {
            print!("{}", super::cli::log_line(s));
        }
        println!(
            "trace {} ({} requests, {:.0} s), seed {}, LIBRA; SLA target: violations <= {} %",
            args.input.trace.display(),
            trace.total_requests(),
            trace.duration_s,
            args.seed,
            args.max_violation_pct
        );
        println!(
            "Pareto front (cost against SLA violations), {} of {} configurations:",
            result.front.len(),
            result.candidates.len()
        );
        print!("{}", front_table(&result));
        match (result.recommended, &tuned) {
            (Some(i), Some(_)) => {
                let c = &result.candidates[i];
                println!(
                    "recommended: {} (cost {:.4} USD, SLA violations {:.3} %)",
                    set_options(&result).unwrap_or_default(),
                    c.cost_usd,
                    c.sla_violation_pct
                );
                for n in honour_notes(&dims, &c.values, &base) {
                    println!("note: {n}");
                }
            }
            _ => println!(
                "no configuration keeps SLA violations within {} %; the fewest: {:.3} %",
                args.max_violation_pct,
                result
                    .front
                    .last()
                    .map_or(0.0, |&i| result.candidates[i].sla_violation_pct)
            ),
        }
        eprintln!(
            "tuned {} configurations in {secs:.2} s on {} threads",
            result.candidates.len(),
            threads.min(result.candidates.len()).max(1)
        );
    }
    if let (Some(path), Some(tuned)) = (&args.out, &tuned)
        && let Some(yaml) = fragment_yaml(
            &result,
            tuned,
            &base,
            &args.input.trace.display().to_string(),
        )
    {
        write_file(path, &yaml)?;
    }
    if let Some(path) = &args.plot {
        plot_front(&result, path)?;
    }
    if let Some(path) = &args.json {
        let mut text = serde_json::to_string_pretty(&result).expect("results serialise");
        text.push('\n');
        write_file(path, &text)?;
    }
    Ok(if result.recommended.is_some() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
