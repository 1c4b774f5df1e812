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
//! Exit status: 0 when the replay completed (whatever errors were counted),
//! 1 for bad input (trace, URL, JSON path), 2 for bad usage.

mod admin;
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
    #[arg(long, value_name = "FILE")]
    trace: PathBuf,

    /// Target URL; the host must be loopback (127.0.0.0/8, localhost or [::1]).
    #[arg(long, value_name = "URL")]
    url: String,

    /// Gateway admin base URL (loopback); `GET <ADMIN>/status` supplies the
    /// VM/function shares and ready VMs. Without it those columns show "-".
    #[arg(long, value_name = "URL")]
    admin: Option<String>,

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
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// Validate the options, replay the trace and print the report.
async fn run(cli: Cli) -> anyhow::Result<()> {
    let url = target::parse_loopback_url(&cli.url, "--url")?;
    let status_url = match &cli.admin {
        Some(admin) => Some(target::status_url(&target::parse_loopback_url(
            admin, "--admin",
        )?)?),
        None => None,
    };
    let method = Method::from_bytes(cli.method.to_ascii_uppercase().as_bytes())
        .with_context(|| format!("--method {:?} is not a valid HTTP method", cli.method))?;
    let full_trace = trace::read_trace(&cli.trace)?;
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
        cli.trace.display(),
        cli.rate_divisor,
        cli.time_compression,
        real.as_secs_f64(),
    );

    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client = Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(90))
        .build(connector);

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
    };

    println!("{}", report::header(cli.format));
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
                "trace": cli.trace.display().to_string(),
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
