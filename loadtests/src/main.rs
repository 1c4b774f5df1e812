//! `spillway-loadtest`: an open-loop trace replayer for the spillway gateway.
//!
//! It reads a per-second trace (one request count per line), optionally slices
//! (`--from`/`--to`), scales (`--rate-divisor`) and speeds it up
//! (`--time-compression`), then sends every request at its scheduled time on its
//! own task, whatever the earlier responses do. Latency is measured from the
//! scheduled time into an HDR histogram; errors are counted by kind. Every
//! `--interval-seconds` trace seconds it prints a table row, with the share of
//! traffic the gateway routed to VMs and functions and its ready VMs taken from
//! the admin `/status` endpoint when `--admin` is given, and a TOTAL row at the
//! end. Load only ever goes to loopback addresses.
//!
//! With `--profile-rmax --sla-ms M` it instead steps an open-loop constant rate
//! against one VM and reports r_max, the highest rate whose latency percentile stays
//! within M (LIBRA §III-B), with the YAML line to paste (see [`profile`]).
//!
//! Exit status: 0 when the replay completed (whatever errors were counted) or the
//! profile found r_max, 1 for bad input (trace, URL, JSON path) or a profile in which no
//! rate met the SLA, 2 for bad usage.

mod admin;
mod profile;
mod report;
mod runner;
mod schedule;
mod stats;
mod target;
mod trace;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use clap::Parser;
use hyper::Method;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::json;

use crate::report::{Format, Row};

/// Command-line options.
#[derive(Debug, Parser)]
#[command(
    version,
    about = "Open-loop trace replayer for the spillway gateway (loopback targets only)."
)]
struct Cli {
    /// Per-second trace file: one request count per line, line 1 = second 0.
    #[arg(long, value_name = "FILE", required_unless_present = "profile_rmax")]
    trace: Option<PathBuf>,

    /// Target URL; the host must be loopback (127.0.0.0/8, localhost or `[::1]`) unless
    /// --allow-remote is given with --profile-rmax.
    #[arg(long, value_name = "URL")]
    url: String,

    /// Gateway admin base URL (loopback); `GET <ADMIN>/status` supplies the
    /// VM/function shares and ready VMs. Without it those columns show "-".
    #[arg(long, value_name = "URL")]
    admin: Option<String>,

    /// Bearer token for the admin endpoint, when the gateway has one
    /// (`gateway.admin_token_file` / `admin_token_env`).
    #[arg(long, value_name = "TOKEN", requires = "admin")]
    admin_token: Option<String>,

    /// Profile one VM instead of replaying a trace: step an open-loop constant rate
    /// (exponential, then bisection) and report r_max, the highest rate whose
    /// --percentile stays within --sla-ms.
    #[arg(long, requires = "sla_ms", conflicts_with_all = ["trace", "admin"])]
    profile_rmax: bool,

    /// Profile: the latency the percentile must meet, ms.
    #[arg(long, value_name = "MS", value_parser = positive)]
    sla_ms: Option<f64>,

    /// Profile: the latency percentile, in (0, 100) [default: 99].
    #[arg(long, value_name = "P", value_parser = percentile)]
    percentile: Option<f64>,

    /// Profile: first rate, requests/s [default: 10].
    #[arg(long, value_name = "RPS", value_parser = positive)]
    start_rps: Option<f64>,

    /// Profile: highest rate tried, requests/s [default: 10000].
    #[arg(long, value_name = "RPS", value_parser = positive)]
    max_rps: Option<f64>,

    /// Profile: lowest rate tried when the start rate fails, requests/s [default: 0.5].
    #[arg(long, value_name = "RPS", value_parser = positive)]
    min_rps: Option<f64>,

    /// Profile: measured seconds per step (at least) [default: 10].
    #[arg(long, value_name = "SECONDS", value_parser = positive)]
    step_seconds: Option<f64>,

    /// Profile: a step is extended to hold --min-samples, up to this [default: 60].
    #[arg(long, value_name = "SECONDS", value_parser = positive)]
    max_step_seconds: Option<f64>,

    /// Profile: requests a step should measure [default: 10 / (1 − percentile/100),
    /// i.e. 1000 for p99: ten beyond the percentile].
    #[arg(long, value_name = "N")]
    min_samples: Option<u64>,

    /// Profile: unmeasured seconds at the start of each step [default: 2].
    #[arg(long, value_name = "SECONDS", value_parser = non_negative)]
    warmup_seconds: Option<f64>,

    /// Profile: idle seconds after each step [default: 1].
    #[arg(long, value_name = "SECONDS", value_parser = non_negative)]
    cooldown_seconds: Option<f64>,

    /// Profile: stop bisecting when (fail − pass) ≤ this × pass [default: 0.05].
    #[arg(long, value_name = "FRACTION", value_parser = positive)]
    precision: Option<f64>,

    /// Profile: total time budget; no step starts that would end after it [default: 900].
    #[arg(long, value_name = "SECONDS", value_parser = positive)]
    max_seconds: Option<f64>,

    /// Profile: allow a non-loopback --url (a VM on another host). Replays stay
    /// loopback-only.
    #[arg(long)]
    allow_remote: bool,

    /// Divide every second's count by D, carrying fractions across seconds.
    #[arg(long, value_name = "D", default_value_t = 1.0, value_parser = at_least_one)]
    rate_divisor: f64,

    /// Replay C trace seconds per real second.
    #[arg(long, value_name = "C", default_value_t = 1.0, value_parser = at_least_one)]
    time_compression: f64,

    /// First trace second to replay (inclusive).
    #[arg(long, value_name = "SECONDS")]
    from: Option<u64>,

    /// Trace second to stop at (exclusive); default: the end of the trace.
    #[arg(long, value_name = "SECONDS")]
    to: Option<u64>,

    /// Trace seconds per report row.
    #[arg(long, value_name = "SECONDS", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(1..))]
    interval_seconds: u64,

    /// Per-request timeout in real seconds, counted as a "timeout" error.
    #[arg(long, value_name = "SECONDS", default_value_t = 30.0, value_parser = positive)]
    timeout_seconds: f64,

    /// Most requests in flight at once; a request due beyond that is not sent
    /// and counts as an "overload" error.
    #[arg(long, value_name = "N", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    max_in_flight: u64,

    /// Share of requests sent as asynchronous calls (`Prefer: respond-async`), 0–1,
    /// spread evenly; with `--admin` the table adds the gateway's asynchronous calls
    /// queued and released per interval and waiting at its end.
    #[arg(long, value_name = "S", default_value_t = 0.0)]
    async_share: f64,

    /// HTTP method.
    #[arg(long, default_value = "GET")]
    method: String,

    /// Send a body of N bytes with every request.
    #[arg(long, value_name = "N", default_value_t = 0)]
    body_bytes: usize,

    /// Table format on standard output.
    #[arg(long, value_enum, default_value_t = Format::Markdown)]
    format: Format,

    /// Also write the rows as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

/// Parse a finite float that is at least 1.
fn at_least_one(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 1.0 => Ok(v),
        _ => Err(format!("expected a number >= 1, got {text:?}")),
    }
}

impl Cli {
    /// Whether any option of the profiling mode was given.
    fn profile_options_given(&self) -> bool {
        self.allow_remote
            || self.min_samples.is_some()
            || [
                self.sla_ms,
                self.percentile,
                self.start_rps,
                self.max_rps,
                self.min_rps,
                self.step_seconds,
                self.max_step_seconds,
                self.warmup_seconds,
                self.cooldown_seconds,
                self.precision,
                self.max_seconds,
            ]
            .iter()
            .any(Option::is_some)
    }
}

/// Parse a percentile in (0, 100).
fn percentile(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v < 100.0 => Ok(v),
        _ => Err(format!("expected a percentile in (0, 100), got {text:?}")),
    }
}

/// Parse a finite float of at least 0.
fn non_negative(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(v) if (0.0..=1e9).contains(&v) => Ok(v),
        _ => Err(format!("expected a number >= 0, got {text:?}")),
    }
}

/// Parse a finite float above 0.
fn positive(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("expected a number > 0, got {text:?}")),
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    if !cli.profile_rmax && cli.profile_options_given() {
        // Exit 2 with clap's usage message, like every other usage error.
        <Cli as clap::CommandFactory>::command()
            .error(
                clap::error::ErrorKind::ArgumentConflict,
                "--sla-ms, --percentile, --start-rps, --max-rps, --min-rps, --step-seconds, \
                 --max-step-seconds, --min-samples, --warmup-seconds, --cooldown-seconds, \
                 --precision, --max-seconds and --allow-remote only apply with --profile-rmax",
            )
            .exit();
    }
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// Validate the options, replay the trace (or profile) and print the report.
async fn run(cli: Cli) -> anyhow::Result<()> {
    if cli.profile_rmax {
        return run_profile(cli).await;
    }
    let trace_path = cli.trace.clone().context("--trace is required")?;
    anyhow::ensure!(
        (0.0..=1.0).contains(&cli.async_share),
        "--async-share must be in [0, 1], got {}",
        cli.async_share
    );
    let url = target::parse_loopback_url(&cli.url, "--url")?;
    let status_url = match &cli.admin {
        Some(admin) => Some(target::status_url(&target::parse_loopback_url(
            admin, "--admin",
        )?)?),
        None => None,
    };
    let method = Method::from_bytes(cli.method.to_ascii_uppercase().as_bytes())
        .with_context(|| format!("--method {:?} is not a valid HTTP method", cli.method))?;
    let full_trace = trace::read_trace(&trace_path)?;
    let window = trace::slice(&full_trace, cli.from, cli.to)?;
    let counts = trace::scale(window, cli.rate_divisor);
    // Create the JSON file up front so a bad path fails before a long run.
    let json_file = match &cli.json {
        Some(path) => Some(
            std::fs::File::create(path)
                .with_context(|| format!("cannot create --json file {}", path.display()))?,
        ),
        None => None,
    };

    let first_second = cli.from.unwrap_or(0);
    let requests: u64 = counts.iter().sum();
    let real = schedule::trace_to_real(counts.len() as f64, cli.time_compression);
    eprintln!(
        "replaying trace seconds {first_second}..{} of {} ({requests} requests after /{}) \
         at {}x: {:.1} s of real time, to {method} {url}",
        first_second + counts.len() as u64,
        trace_path.display(),
        cli.rate_divisor,
        cli.time_compression,
        real.as_secs_f64(),
    );

    let client = http_client();
    let plan = runner::Plan {
        url: url.clone(),
        method,
        body: Bytes::from(vec![b'x'; cli.body_bytes]),
        counts,
        first_second,
        compression: cli.time_compression,
        interval_seconds: cli.interval_seconds,
        timeout: Duration::from_secs_f64(cli.timeout_seconds),
        max_in_flight: usize::try_from(cli.max_in_flight).unwrap_or(usize::MAX),
        status_url,
        admin_token: cli.admin_token.clone(),
        async_share: cli.async_share,
    };

    if cli.async_share > 0.0 {
        println!("{}", report::header_async(cli.format));
    } else {
        println!("{}", report::header(cli.format));
    }
    let mut rows: Vec<Row> = Vec::new();
    let summary = runner::run(plan, client, |row| {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{}", report::line(row, cli.format));
        let _ = out.flush();
        rows.push(row.clone());
    })
    .await?;
    println!("{}", report::line(&summary.total, cli.format));
    eprintln!(
        "max dispatch lag behind schedule: {:.1} ms",
        summary.max_dispatch_lag.as_secs_f64() * 1000.0
    );

    if let (Some(file), Some(path)) = (json_file, &cli.json) {
        let mut total = summary.total.to_json();
        total["max_dispatch_lag_ms"] = json!(summary.max_dispatch_lag.as_secs_f64() * 1000.0);
        let doc = json!({
            "params": {
                "trace": trace_path.display().to_string(),
                "url": url.to_string(),
                "rate_divisor": cli.rate_divisor,
                "time_compression": cli.time_compression,
                "interval_seconds": cli.interval_seconds,
            },
            "intervals": rows.iter().map(Row::to_json).collect::<Vec<_>>(),
            "total": total,
        });
        serde_json::to_writer_pretty(std::io::BufWriter::new(file), &doc)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}

/// The keep-alive client every mode uses.
fn http_client() -> admin::HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(90))
        .build(connector)
}

/// `--profile-rmax`: find r_max of one VM and print the table, r_max and the YAML line.
async fn run_profile(cli: Cli) -> anyhow::Result<()> {
    let url = target::parse_url(&cli.url, "--url", cli.allow_remote)?;
    if url.host().is_some_and(|h| !target::is_loopback_host(h)) {
        eprintln!("warning: --allow-remote: sending load to {url}");
    }
    let method = Method::from_bytes(cli.method.to_ascii_uppercase().as_bytes())
        .with_context(|| format!("--method {:?} is not a valid HTTP method", cli.method))?;
    let sla_ms = cli.sla_ms.context("--profile-rmax needs --sla-ms")?;
    let quantile = cli.percentile.unwrap_or(99.0) / 100.0;
    let start_rps = cli.start_rps.unwrap_or(10.0);
    let max_rps = cli.max_rps.unwrap_or(10_000.0);
    let min_rps = cli.min_rps.unwrap_or(0.5);
    anyhow::ensure!(
        min_rps <= start_rps && start_rps <= max_rps,
        "need --min-rps <= --start-rps <= --max-rps, got {min_rps}, {start_rps}, {max_rps}"
    );
    let json_file = match &cli.json {
        Some(path) => Some(
            std::fs::File::create(path)
                .with_context(|| format!("cannot create --json file {}", path.display()))?,
        ),
        None => None,
    };
    let secs = Duration::from_secs_f64;
    let sla = secs(sla_ms / 1000.0);
    let params = profile::ProfileParams {
        url: url.clone(),
        method,
        body: Bytes::from(vec![b'x'; cli.body_bytes]),
        sla,
        quantile,
        start_rps,
        max_rps,
        min_rps,
        step: secs(cli.step_seconds.unwrap_or(10.0)),
        max_step: secs(cli.max_step_seconds.unwrap_or(60.0)),
        min_samples: cli
            .min_samples
            .unwrap_or_else(|| (10.0 / (1.0 - quantile)).round() as u64),
        warmup: secs(cli.warmup_seconds.unwrap_or(2.0)),
        cooldown: secs(cli.cooldown_seconds.unwrap_or(1.0)),
        precision: cli.precision.unwrap_or(0.05),
        budget: secs(cli.max_seconds.unwrap_or(900.0)),
        // A request slower than the SLA already fails its step: give up on it after ten
        // SLAs (plus a second) rather than the replay's long default.
        timeout: secs(cli.timeout_seconds).min(sla * 10 + Duration::from_secs(1)),
        max_in_flight: usize::try_from(cli.max_in_flight).unwrap_or(usize::MAX),
    };
    eprintln!(
        "profiling r_max of {} {url}: p{} within {} ms, from {} req/s, at most {} s",
        params.method,
        profile::fmt_rate(quantile * 100.0),
        profile::fmt_rate(sla_ms),
        profile::fmt_rate(start_rps),
        profile::fmt_rate(params.budget.as_secs_f64()),
    );
    println!("{}", profile::header(cli.format));
    let mut n = 0;
    let prof = profile::run(&params, http_client(), |step| {
        n += 1;
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{}", profile::line(n, step, cli.format));
        let _ = out.flush();
    })
    .await;
    print!("\n{}", profile::summary(&params, &prof));
    let lag = prof
        .steps
        .iter()
        .map(|s| s.max_lag)
        .max()
        .unwrap_or_default();
    eprintln!(
        "{} steps in {:.1} s; max dispatch lag behind schedule: {:.1} ms",
        prof.steps.len(),
        prof.elapsed.as_secs_f64(),
        lag.as_secs_f64() * 1000.0
    );
    if let (Some(file), Some(path)) = (json_file, &cli.json) {
        serde_json::to_writer_pretty(
            std::io::BufWriter::new(file),
            &profile::to_json(&params, &prof),
        )
        .with_context(|| format!("cannot write {}", path.display()))?;
    }
    anyhow::ensure!(
        prof.search.lo.is_some(),
        "no rate met the SLA (p{} <= {} ms)",
        profile::fmt_rate(quantile * 100.0),
        profile::fmt_rate(sla_ms)
    );
    Ok(())
}
