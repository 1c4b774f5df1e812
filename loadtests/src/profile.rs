//! `--profile-rmax`: measure r_max, the highest request rate one VM serves with its
//! latency percentile within the SLA — LIBRA §III-B (Alg. 1 line 3: "r_max … static from
//! profiling").
//!
//! Each **step** sends an open-loop constant rate (requests evenly spaced at `k / rate`,
//! each on its own task, latency measured from its scheduled time, so a saturated VM shows
//! up as latency rather than as a lower rate) for `warmup + measured` seconds. Only the
//! requests scheduled after the warm-up are measured; the step ends when all of them have
//! answered (or timed out), then the VM rests `cooldown` so a queue left by a failed step
//! does not leak into the next one.
//!
//! A step **passes** when at most `⌊(1 − q)·n⌋` of its `n` measured requests were slower
//! than the SLA or failed (an error counts as infinitely slow): the q-quantile over all
//! requests is within the SLA. The measured part lasts `step_seconds`, extended so that
//! it holds `min_samples` requests (default `10 / (1 − q)`: ten beyond the quantile, 1,000
//! for p99), but never longer than `max_step_seconds`.
//!
//! **Search** ([`Search`]): exponential, then bisection.
//! 1. Up: `start`, `2·start`, `4·start`, … until a step fails or `max_rps` passes.
//! 2. Down (only when `start` fails): `start/2`, `start/4`, … until one passes or the rate
//!    falls below `min_rps`.
//! 3. Bisection between the highest passing rate `lo` and the lowest failing rate `hi`
//!    until `hi − lo ≤ precision · lo`.
//!
//! r_max is `lo`. A bracket `[r, 2r]` needs ⌈log₂(1/precision)⌉ bisection steps (5 at
//! 5 %), so a search from 10 req/s to a VM that handles ~1,000 spends about 8 + 5 steps.
//! The whole search stops before a step that would end after `max_seconds`; r_max is then
//! the best `lo` so far, and the report says so.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Uri};
use serde_json::{Value, json};
use tokio::sync::{Semaphore, mpsc};
use tokio::time::Instant;

use crate::admin::HttpClient;
use crate::report::Format;
use crate::runner::send;
use crate::stats::{Outcome, Stats};

/// Everything a profiling run needs, validated.
#[derive(Clone, Debug)]
pub(crate) struct ProfileParams {
    /// The VM (or any single upstream) under test.
    pub url: Uri,
    /// HTTP method of every request.
    pub method: Method,
    /// Request body (empty for none).
    pub body: Bytes,
    /// The latency the quantile must meet.
    pub sla: Duration,
    /// The quantile, in (0, 1).
    pub quantile: f64,
    /// First rate, requests/s.
    pub start_rps: f64,
    /// Highest rate tried, requests/s.
    pub max_rps: f64,
    /// Lowest rate tried when even `start_rps` fails, requests/s.
    pub min_rps: f64,
    /// Measured part of a step (minimum).
    pub step: Duration,
    /// Longest measured part of a step.
    pub max_step: Duration,
    /// Requests a step's measured part should hold.
    pub min_samples: u64,
    /// Unmeasured start of every step.
    pub warmup: Duration,
    /// Idle pause after every step.
    pub cooldown: Duration,
    /// Bisection stops when `hi − lo ≤ precision · lo`.
    pub precision: f64,
    /// Total time budget of the search.
    pub budget: Duration,
    /// Per-request timeout (counted as an error).
    pub timeout: Duration,
    /// Most requests in flight; more count as `overload` errors.
    pub max_in_flight: usize,
}

impl ProfileParams {
    /// Length of the measured part of a step at `rate`.
    pub(crate) fn measured_for(&self, rate: f64) -> Duration {
        let for_samples = Duration::from_secs_f64(self.min_samples as f64 / rate.max(1e-9));
        self.step.max(for_samples).min(self.max_step.max(self.step))
    }
}

/// Which part of the search a step belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Doubling from the start rate.
    Up,
    /// Halving after the start rate failed.
    Down,
    /// Between the highest pass and the lowest fail.
    Bisect,
}

impl Phase {
    /// Label in the table: `up`, `down`, `bisect`.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Phase::Up => "up",
            Phase::Down => "down",
            Phase::Bisect => "bisect",
        }
    }
}

/// The search state: highest passing and lowest failing rate. Pure, so that the
/// strategy is tested without a network.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Search {
    /// Highest rate that passed.
    pub lo: Option<f64>,
    /// Lowest rate that failed.
    pub hi: Option<f64>,
    start: f64,
    min: f64,
    max: f64,
    precision: f64,
}

impl Search {
    /// A search from `start` within `[min, max]` to a relative `precision`.
    pub(crate) fn new(start: f64, min: f64, max: f64, precision: f64) -> Self {
        Self {
            lo: None,
            hi: None,
            start: start.clamp(min, max),
            min,
            max,
            precision,
        }
    }

    /// The next rate to try, or `None` when the search is done.
    pub(crate) fn next(&self) -> Option<(Phase, f64)> {
        match (self.lo, self.hi) {
            (None, None) => Some((Phase::Up, self.start)),
            (Some(lo), None) => (lo < self.max).then(|| (Phase::Up, (2.0 * lo).min(self.max))),
            (None, Some(hi)) => {
                let r = hi / 2.0;
                (r >= self.min).then_some((Phase::Down, r))
            }
            (Some(lo), Some(hi)) => {
                (hi - lo > self.precision * lo).then(|| (Phase::Bisect, (lo + hi) / 2.0))
            }
        }
    }

    /// Record a step's verdict.
    pub(crate) fn record(&mut self, rate: f64, pass: bool) {
        if pass {
            self.lo = Some(self.lo.map_or(rate, |lo| lo.max(rate)));
        } else {
            self.hi = Some(self.hi.map_or(rate, |hi| hi.min(rate)));
        }
    }
}

/// One step's result.
#[derive(Clone, Debug)]
pub(crate) struct Step {
    /// Search phase.
    pub phase: Phase,
    /// Offered rate, requests/s.
    pub rate: f64,
    /// Measured part, seconds.
    pub measured_seconds: f64,
    /// Outcomes of the measured requests.
    pub stats: Stats,
    /// Measured requests slower than the SLA or failed.
    pub over_sla: u64,
    /// Most such requests a passing step may have: `⌊(1 − q)·n⌋`.
    pub allowed: u64,
    /// Whether the step passed.
    pub pass: bool,
    /// Latest any request was sent after its scheduled time.
    pub max_lag: Duration,
}

impl Step {
    /// The step's quantile, ms (responses only).
    pub(crate) fn quantile_ms(&self, q: f64) -> Option<f64> {
        self.stats.quantile_ms(q)
    }
}

/// Why the search ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stop {
    /// The bracket is within the precision (or `max_rps` passed, or no rate down to
    /// `min_rps` passed).
    Done,
    /// The next step would have ended after the time budget.
    Budget,
}

/// The profiling result.
#[derive(Clone, Debug)]
pub(crate) struct Profile {
    /// Every step, in order.
    pub steps: Vec<Step>,
    /// The final bracket.
    pub search: Search,
    /// Why it ended.
    pub stop: Stop,
    /// Wall-clock length of the search.
    pub elapsed: Duration,
}

/// Run one step at `rate`: warm-up, then the measured part; returns once every request
/// ended.
async fn run_step(p: &ProfileParams, client: &HttpClient, phase: Phase, rate: f64) -> Step {
    let measured = p.measured_for(rate);
    let total = p.warmup + measured;
    let n = (rate * total.as_secs_f64()).floor() as u64;
    let gap = 1.0 / rate;
    let slots = Arc::new(Semaphore::new(p.max_in_flight));
    let (tx, mut rx) = mpsc::unbounded_channel::<(bool, Outcome)>();
    let start = Instant::now();
    let measure_from = start + p.warmup;
    let mut max_lag = Duration::ZERO;
    for k in 0..n {
        let due = start + Duration::from_secs_f64(k as f64 * gap);
        tokio::time::sleep_until(due).await;
        max_lag = max_lag.max(due.elapsed());
        let measured = due >= measure_from;
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            let _ = tx.send((measured, Outcome::Overload));
            continue;
        };
        let request = hyper::Request::builder()
            .method(p.method.clone())
            .uri(p.url.clone())
            .body(Full::new(p.body.clone()))
            .expect("method and URI were validated");
        let (client, tx, timeout) = (client.clone(), tx.clone(), p.timeout);
        tokio::spawn(async move {
            let outcome = send(client, request, due, timeout).await;
            drop(permit);
            let _ = tx.send((measured, outcome));
        });
    }
    drop(tx);
    let sla_us = u64::try_from(p.sla.as_micros()).unwrap_or(u64::MAX);
    let mut stats = Stats::default();
    let mut over_sla = 0;
    while let Some((measured, outcome)) = rx.recv().await {
        if !measured {
            continue;
        }
        match outcome {
            Outcome::Response { status, latency }
                if (200..400).contains(&status) && latency.as_micros() <= u128::from(sla_us) => {}
            _ => over_sla += 1,
        }
        stats.record(outcome);
    }
    let allowed = ((1.0 - p.quantile) * stats.requests as f64 + 1e-9).floor() as u64;
    let pass = stats.requests > 0 && over_sla <= allowed;
    tokio::time::sleep(p.cooldown).await;
    Step {
        phase,
        rate,
        measured_seconds: measured.as_secs_f64(),
        stats,
        over_sla,
        allowed,
        pass,
        max_lag,
    }
}

/// Run the search, calling `on_step` after each step.
pub(crate) async fn run(
    p: &ProfileParams,
    client: HttpClient,
    mut on_step: impl FnMut(&Step),
) -> Profile {
    let mut search = Search::new(p.start_rps, p.min_rps, p.max_rps, p.precision);
    let started = Instant::now();
    let mut steps = Vec::new();
    let mut stop = Stop::Done;
    while let Some((phase, rate)) = search.next() {
        let needs = p.warmup + p.measured_for(rate) + p.cooldown;
        if started.elapsed() + needs > p.budget {
            stop = Stop::Budget;
            break;
        }
        let step = run_step(p, &client, phase, rate).await;
        search.record(rate, step.pass);
        on_step(&step);
        steps.push(step);
    }
    Profile {
        steps,
        search,
        stop,
        elapsed: started.elapsed(),
    }
}

/// Column headers and minimum widths of the profile table.
const COLUMNS: [(&str, usize); 10] = [
    ("step", 4),
    ("phase", 6),
    ("rate (req/s)", 12),
    ("requests", 8),
    ("errors", 6),
    ("p50 ms", 8),
    ("p95 ms", 8),
    ("p99 ms", 8),
    ("over SLA", 8),
    ("result", 6),
];

fn fmt_ms(ms: Option<f64>) -> String {
    match ms {
        None => "-".to_owned(),
        Some(v) if v < 10.0 => format!("{v:.2}"),
        Some(v) => format!("{v:.1}"),
    }
}

/// A rate for humans and YAML: at most two decimals, rounded down (r_max never claims
/// more than the rate that passed), no trailing zeros.
pub(crate) fn fmt_rate(r: f64) -> String {
    let r = (r * 100.0 + 1e-9).floor() / 100.0;
    let s = format!("{r:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}

fn render(cells: &[String], format: Format) -> String {
    let padded: Vec<String> = cells
        .iter()
        .zip(COLUMNS)
        .map(|(cell, (_, width))| format!("{cell:>width$}"))
        .collect();
    match format {
        Format::Markdown => format!("| {} |", padded.join(" | ")),
        Format::Plain => padded.join("  "),
    }
}

/// The table header (two lines in markdown).
pub(crate) fn header(format: Format) -> String {
    let names: Vec<String> = COLUMNS.iter().map(|(n, _)| (*n).to_owned()).collect();
    let rule: Vec<String> = COLUMNS
        .iter()
        .map(|(_, w)| match format {
            Format::Markdown => format!("{}:", "-".repeat(w - 1)),
            Format::Plain => "-".repeat(*w),
        })
        .collect();
    format!("{}\n{}", render(&names, format), render(&rule, format))
}

/// One table line for step number `i` (1-based).
pub(crate) fn line(i: usize, s: &Step, format: Format) -> String {
    render(
        &[
            i.to_string(),
            s.phase.as_str().to_owned(),
            fmt_rate(s.rate),
            s.stats.requests.to_string(),
            s.stats.errors().to_string(),
            fmt_ms(s.quantile_ms(0.50)),
            fmt_ms(s.quantile_ms(0.95)),
            fmt_ms(s.quantile_ms(0.99)),
            format!("{}/{}", s.over_sla, s.allowed),
            if s.pass { "pass" } else { "fail" }.to_owned(),
        ],
        format,
    )
}

/// The closing lines: r_max, the bracket, and the YAML line to paste.
pub(crate) fn summary(p: &ProfileParams, prof: &Profile) -> String {
    let pct = fmt_rate(p.quantile * 100.0);
    let sla = fmt_rate(p.sla.as_secs_f64() * 1000.0);
    let mut out = String::new();
    let budget = match prof.stop {
        Stop::Budget => format!(
            " (stopped by --max-seconds {} before the bracket reached {} %)",
            fmt_rate(p.budget.as_secs_f64()),
            fmt_rate(p.precision * 100.0)
        ),
        Stop::Done => String::new(),
    };
    match (prof.search.lo, prof.search.hi) {
        (Some(lo), hi) => {
            let above = match hi {
                Some(hi) => format!("{} req/s failed", fmt_rate(hi)),
                None => format!("no failure up to --max-rps {}", fmt_rate(p.max_rps)),
            };
            out.push_str(&format!(
                "r_max = {} req/s: the highest rate whose p{pct} stayed within {sla} ms ({above}){budget}\n",
                fmt_rate(lo)
            ));
            out.push_str("paste under `libra:` in the gateway config:\n");
            out.push_str(&format!(
                "  r_max_rps: {}   # p{pct} <= {sla} ms, spillway-loadtest --profile-rmax\n",
                fmt_rate(lo)
            ));
        }
        (None, _) => out.push_str(&format!(
            "no rate down to {} req/s kept p{pct} within {sla} ms{budget}\n",
            fmt_rate(p.min_rps)
        )),
    }
    let lag = prof
        .steps
        .iter()
        .map(|s| s.max_lag)
        .max()
        .unwrap_or_default();
    if lag > p.sla / 10 {
        out.push_str(&format!(
            "note: the load generator sent up to {:.1} ms late (more than a tenth of the SLA); \
             latencies include that lag, so r_max may be underestimated: run the load tester \
             on another core or machine\n",
            lag.as_secs_f64() * 1000.0
        ));
    }
    out
}

/// The `--json` document.
pub(crate) fn to_json(p: &ProfileParams, prof: &Profile) -> Value {
    let steps: Vec<Value> = prof
        .steps
        .iter()
        .map(|s| {
            json!({
                "phase": s.phase.as_str(),
                "rate_rps": s.rate,
                "measured_seconds": s.measured_seconds,
                "requests": s.stats.requests,
                "errors": s.stats.errors(),
                "p50_ms": s.quantile_ms(0.50),
                "p95_ms": s.quantile_ms(0.95),
                "p99_ms": s.quantile_ms(0.99),
                "quantile_ms": s.quantile_ms(p.quantile),
                "over_sla": s.over_sla,
                "allowed_over_sla": s.allowed,
                "pass": s.pass,
                "max_dispatch_lag_ms": s.max_lag.as_secs_f64() * 1000.0,
            })
        })
        .collect();
    json!({
        "params": {
            "url": p.url.to_string(),
            "sla_ms": p.sla.as_secs_f64() * 1000.0,
            "percentile": p.quantile * 100.0,
            "start_rps": p.start_rps,
            "max_rps": p.max_rps,
            "precision": p.precision,
        },
        "steps": steps,
        "r_max_rps": prof.search.lo,
        "lowest_failing_rps": prof.search.hi,
        "stopped_by_budget": prof.stop == Stop::Budget,
        "elapsed_seconds": prof.elapsed.as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Drive the search against a VM that passes every rate up to `capacity`.
    fn search(capacity: f64, start: f64) -> (Vec<(Phase, f64)>, Search) {
        let mut s = Search::new(start, 0.5, 5000.0, 0.05);
        let mut tried = Vec::new();
        while let Some((phase, r)) = s.next() {
            tried.push((phase, r));
            s.record(r, r <= capacity);
            assert!(tried.len() < 40, "the search terminates");
        }
        (tried, s)
    }

    #[test]
    fn doubles_then_bisects_to_the_precision() {
        let (tried, s) = search(37.0, 10.0);
        let up: Vec<f64> = tried
            .iter()
            .filter(|(p, _)| *p == Phase::Up)
            .map(|(_, r)| *r)
            .collect();
        assert_eq!(up, [10.0, 20.0, 40.0]);
        let (lo, hi) = (s.lo.unwrap(), s.hi.unwrap());
        assert!(lo <= 37.0 && hi > 37.0);
        assert!(hi - lo <= 0.05 * lo, "{lo}..{hi}");
        // A [r, 2r] bracket needs at most ⌈log₂(1 / 0.05)⌉ = 5 halvings.
        assert!(tried.len() <= 3 + 5, "{tried:?}");
        assert!(lo >= 37.0 * 0.95);
    }

    #[test]
    fn halves_when_the_start_rate_already_fails() {
        let (tried, s) = search(3.0, 10.0);
        assert_eq!(
            &tried[..3],
            [(Phase::Up, 10.0), (Phase::Down, 5.0), (Phase::Down, 2.5)]
        );
        assert!(s.lo.unwrap() <= 3.0 && s.lo.unwrap() >= 3.0 * 0.95);
        assert!(tried[3..].iter().all(|(p, _)| *p == Phase::Bisect));
    }

    #[test]
    fn stops_at_the_bounds() {
        let (tried, s) = search(1e9, 1000.0);
        assert_eq!(tried.last(), Some(&(Phase::Up, 5000.0)));
        assert_eq!((s.lo, s.hi), (Some(5000.0), None));
        let (_, s) = search(0.1, 10.0);
        assert_eq!(s.lo, None, "nothing passes down to the minimum");
    }

    #[test]
    fn a_step_lasts_long_enough_for_its_samples_within_the_cap() {
        let p = ProfileParams {
            url: Uri::from_static("http://127.0.0.1/"),
            method: Method::GET,
            body: Bytes::new(),
            sla: Duration::from_millis(100),
            quantile: 0.99,
            start_rps: 10.0,
            max_rps: 100.0,
            min_rps: 1.0,
            step: Duration::from_secs(10),
            max_step: Duration::from_secs(60),
            min_samples: 1000,
            warmup: Duration::from_secs(2),
            cooldown: Duration::from_secs(1),
            precision: 0.05,
            budget: Duration::from_secs(600),
            timeout: Duration::from_secs(30),
            max_in_flight: 100,
        };
        assert_eq!(p.measured_for(400.0), Duration::from_secs(10));
        assert_eq!(p.measured_for(40.0), Duration::from_secs(25));
        assert_eq!(p.measured_for(4.0), Duration::from_secs(60));
    }

    #[test]
    fn rates_print_without_trailing_zeros() {
        assert_eq!(fmt_rate(37.5), "37.5");
        assert_eq!(fmt_rate(40.0), "40");
        assert_eq!(fmt_rate(43.129), "43.12", "rounded down");
        assert_eq!(fmt_rate(0.29), "0.29");
    }
}
