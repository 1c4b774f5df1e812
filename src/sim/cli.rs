//! Command-line entry points: `spillway sim` ([`SimArgs`], [`run_sim`]) and
//! `spillway cost` ([`CostArgs`], [`run_cost`]). The binary's subcommands call these.

use std::io::{IsTerminal as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::costmodel::{CostInputs, cost_report, cost_text};
use super::engine::PolicyKind;
use super::error::SimError;
use super::plot::{plot_cost, plot_sim};
use super::report::{series_csv, table};
use super::trace::{Trace, TraceFormat, TraceOptions};
use crate::config::Config;
use crate::config::sim::TraceFormatConfig;
use crate::policy::cost::Architecture;

/// The LIBRA paper preset, used when `--config` is not given.
pub const LIBRA_PAPER_YAML: &str = include_str!("../../config/sim/libra-paper.yaml");

/// `--delay-queue` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DelayQueueArg {
    /// Asynchronous calls are routed at arrival.
    Off,
    /// Asynchronous calls wait in the delay queue.
    On,
    /// Both, side by side.
    Both,
}

/// `--policy` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PolicyArg {
    /// LIBRA (the policy core).
    Libra,
    /// VMs for the peak.
    Max,
    /// Functions only.
    Faas,
    /// Reactive VM autoscaling.
    Auto,
    /// AUTO with functions while VMs boot.
    Spock,
    /// All five.
    All,
}

/// `--generate` values: FaaSim's synthetic workloads ([`super::faasim`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum GenerateArg {
    /// 100 calls within ~2 s every 30 s, 100 bursts over 5 zones (10 000 calls).
    Burst,
    /// 100 calls/s for 100 s over 5 zones (10 000 calls).
    Stream,
}

/// `--queue-order` values (call scheduling §4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum QueueOrderArg {
    /// Arrival order.
    Fifo,
    /// Shortest expected processing time first.
    Sept,
    /// Earliest expected completion time.
    Eect,
    /// The key's previous arrival + `E[p]`.
    Rect,
    /// Recent calls of the key × `E[p]`.
    #[value(name = "fair_choice")]
    FairChoice,
}

impl QueueOrderArg {
    fn order(self) -> crate::policy::sched::Order {
        use crate::policy::sched::Order;
        match self {
            QueueOrderArg::Fifo => Order::Fifo,
            QueueOrderArg::Sept => Order::Sept,
            QueueOrderArg::Eect => Order::Eect,
            QueueOrderArg::Rect => Order::Rect,
            QueueOrderArg::FairChoice => Order::FairChoice,
        }
    }
}

/// `spillway sim`: replay a trace through LIBRA and the baselines (LIBRA §IV).
#[derive(Clone, Debug, clap::Args)]
pub struct SimArgs {
    /// Configuration (gateway schema + `sim:`); default: the built-in
    /// config/sim/libra-paper.yaml.
    #[arg(long, short, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Where the trace comes from and how to read it.
    #[command(flatten)]
    pub input: TraceArgs,
    /// Write FaaSim's synthetic `burst` or `stream` workload, made by the seeded
    /// generator (`--seed`), to the `--trace` file as an `events` trace
    /// (`<arrival seconds> <zone>` lines), and exit without simulating.
    #[arg(long, value_enum, value_name = "PATTERN")]
    pub generate: Option<GenerateArg>,
    /// Policies to run (comma-separated), or `all`.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "all")]
    pub policy: Vec<PolicyArg>,
    /// RNG seed; the same seed and inputs give a byte-identical JSON report.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Override `libra.r_max_rps`, requests/s (the start value when
    /// `libra.r_max_adaptive` is set).
    #[arg(long, value_name = "RPS")]
    pub r_max_rps: Option<f64>,
    /// Override `queue.order` (call scheduling §4; needs a `queue:` section).
    #[arg(long, value_enum, value_name = "ORDER")]
    pub queue_order: Option<QueueOrderArg>,
    /// Write the JSON report here (`-`: stdout).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Write the per-epoch series as CSV here.
    #[arg(long, value_name = "FILE")]
    pub csv: Option<PathBuf>,
    /// Draw load vs VM capacity, function share and costs into this SVG.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// Most rows per policy in the `--csv` series: longer runs merge consecutive epochs
    /// into one row (counts summed, levels at the row's last epoch).
    #[arg(long, default_value_t = 100_000, value_name = "ROWS")]
    pub csv_max_rows: usize,
    /// No table and no progress bar.
    #[arg(long)]
    pub quiet: bool,
    /// Set one configuration value: a dotted path (`placement`,
    /// `function_zones[*].keep_alive_seconds`) and a YAML value; repeatable, applied in
    /// order, validated like a file.
    #[arg(long = "set", value_name = "PATH=VALUE")]
    pub set: Vec<String>,
    /// Run once per value of a dotted path (`placement=edge_first,warm_first`): one table
    /// per value, then a summary with one row per value and policy and a column for
    /// PATH; with `--json`, `{"sweep": PATH, "rows": [{"value", "report"}]}`.
    #[arg(long, value_name = "PATH=V1,V2,...")]
    pub sweep: Option<String>,
    /// Run the delay-queue model (ProFaaStinate §3) instead of the cost report: an
    /// `events` trace with named columns, asynchronous calls queued (`on`), routed at
    /// arrival (`off`) or both; the `async:` section sets the scheduler.
    #[arg(long, value_enum, value_name = "MODE")]
    pub delay_queue: Option<DelayQueueArg>,
}

/// `PATH=VALUE` split at its first `=`.
pub(crate) fn split_assignment<'a>(
    option: &str,
    text: &'a str,
) -> Result<(&'a str, &'a str), SimError> {
    text.split_once('=')
        .filter(|(p, _)| !p.is_empty())
        .ok_or_else(|| invalid(option, format!("expected PATH=VALUE, got {text:?}")))
}

/// One line describing the models a run uses (printed above every report, so that a
/// config without `sim:` shows that it runs the defaults), and the warnings when they
/// make the SLA unreachable.
pub fn model_summary(config: &Config) -> (String, Vec<String>) {
    use crate::config::sim::{ServiceTimeConfig, VmBilling};
    let s = &config.sim;
    let (service, min_ms) = match &s.request.service_time {
        ServiceTimeConfig::Fixed { ms } => (format!("fixed {ms} ms"), *ms),
        ServiceTimeConfig::Normal { mean_ms, std_ms } => {
            (format!("normal {mean_ms} ± {std_ms} ms"), 0.0)
        }
        ServiceTimeConfig::Lognormal { mean_ms, std_ms } => {
            (format!("lognormal {mean_ms} ± {std_ms} ms"), 0.0)
        }
        ServiceTimeConfig::Empirical { percentiles } => (
            format!(
                "empirical {}–{} ms",
                percentiles.first().map_or(0.0, |p| p[1]),
                percentiles.last().map_or(0.0, |p| p[1])
            ),
            percentiles.first().map_or(0.0, |p| p[1]),
        ),
    };
    let memory = s
        .request
        .memory_mb
        .unwrap_or(config.pricing.function_memory_mb);
    let billing = match s.vm.billing {
        VmBilling::PerSecond => format!("per second, min {} s", s.vm.minimum_billed_seconds),
        VmBilling::PerHour => "per started hour".to_string(),
    };
    let f = &s.function;
    let pct = |j: f64| {
        if j > 0.0 {
            format!(" ±{}%", (j * 1e5).round() / 1e3)
        } else {
            String::new()
        }
    };
    // With function zones, keep-alive and instance caps are the zones' own.
    let instances = if config.function_zones.is_empty() {
        format!(
            "keep-alive {} s, max {} instances",
            f.keep_alive_seconds, f.max_instances
        )
    } else {
        format!(
            "{} function zones (keep-alive and max instances per zone){}",
            config.function_zones.len(),
            if f.exec_jitter > 0.0 {
                format!(", execution{}", pct(f.exec_jitter))
            } else {
                String::new()
            }
        )
    };
    let line = format!(
        "model: service {service}, {memory} MB; VM {} slots, boot {} s, billed {billing}{}; \
         function cold start {} ms{}, warm start {} ms{}, {instances}; SLA {} ms",
        s.vm.slots,
        s.vm.boot_seconds,
        if s.vm.bill_boot {
            " from launch"
        } else {
            " from ready"
        },
        f.cold_start_ms,
        pct(f.cold_start_jitter),
        f.warm_start_ms,
        pct(f.warm_start_jitter),
        s.sla_ms
    );
    let mut warnings = Vec::new();
    let sla_ms = s.sla_ms.number();
    if min_ms > sla_ms {
        warnings.push(format!(
            "warning: every request misses the SLA: the shortest service time ({min_ms} ms) \
             exceeds sim.sla_ms ({} ms)",
            s.sla_ms
        ));
    } else if min_ms + f.warm_start_ms.number() > sla_ms {
        warnings.push(format!(
            "warning: every function call misses the SLA: the shortest service time \
             ({min_ms} ms) + sim.function.warm_start_ms ({} ms) exceeds sim.sla_ms ({} ms); \
             set the `sim:` models for your workload (config/sim/libra-paper.yaml has the \
             LIBRA authors' values)",
            f.warm_start_ms, s.sla_ms
        ));
    }
    (line, warnings)
}

/// `--arch` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ArchArg {
    /// x86_64 ($0.0000166667/GB-s).
    #[value(name = "x86_64", alias = "x86")]
    X86_64,
    /// arm64 ($0.0000133334/GB-s).
    Arm64,
}

/// `spillway cost`: LIBRA §II's cost model and cost-indifference point.
#[derive(Clone, Debug, clap::Args)]
pub struct CostArgs {
    /// Take prices, function profile and r_max from this config (`pricing:`, `libra:`);
    /// its `libra.cip_rps`, when set, is reported as the CIP in force.
    #[arg(long, short, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// VM price, USD per hour (default m4.large, 0.10).
    #[arg(long, value_name = "USD")]
    pub vm_hourly_usd: Option<f64>,
    /// Requests/s one VM serves within the SLA (default 16).
    #[arg(long, value_name = "RPS")]
    pub r_max_rps: Option<f64>,
    /// Function memory, MB (default 512).
    #[arg(long, value_name = "MB")]
    pub memory_mb: Option<u32>,
    /// Function execution time, ms (default 1000).
    #[arg(long, value_name = "MS")]
    pub duration_ms: Option<crate::config::Millis>,
    /// Function architecture (default x86_64).
    #[arg(long, value_enum)]
    pub arch: Option<ArchArg>,
    /// Override the GB-second price, USD.
    #[arg(long, value_name = "USD")]
    pub gb_second_usd: Option<f64>,
    /// Per-invocation fee, USD (default 0.0000002).
    #[arg(long, value_name = "USD")]
    pub request_usd: Option<f64>,
    /// The functions sit behind an API gateway (adds its per-request fee).
    #[arg(long)]
    pub api_gateway: bool,
    /// API-gateway fee per request, USD (default 0.000001, HTTP API).
    #[arg(long, value_name = "USD")]
    pub api_gateway_request_usd: Option<f64>,
    /// Highest rate in the table, requests/s (default 3 · r_max).
    #[arg(long, value_name = "RPS")]
    pub max_rate: Option<f64>,
    /// Rate step of the table, requests/s (default max_rate / 24).
    #[arg(long, value_name = "RPS")]
    pub step: Option<f64>,
    /// Print (`-` or no value) or write the JSON report (`{"cip_rps": …, …}`).
    #[arg(long, value_name = "FILE", num_args = 0..=1, default_missing_value = "-")]
    pub json: Option<PathBuf>,
    /// Draw the cost curves into this SVG.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
}

pub(crate) fn write_file(path: &Path, text: &str) -> Result<(), SimError> {
    if path == Path::new("-") {
        let mut out = std::io::stdout().lock();
        return out
            .write_all(text.as_bytes())
            .and_then(|()| out.flush())
            .map_err(|source| SimError::Io {
                path: path.to_owned(),
                source,
            });
    }
    std::fs::write(path, text).map_err(|source| SimError::Io {
        path: path.to_owned(),
        source,
    })
}

pub(crate) fn load_config(path: Option<&Path>) -> Result<Config, SimError> {
    Ok(match path {
        Some(p) => Config::load(p)?,
        None => Config::from_yaml(LIBRA_PAPER_YAML, "<built-in config/sim/libra-paper.yaml>")?,
    })
}

/// The policies `--policy` selects, in report order, without duplicates.
pub fn selected_policies(args: &[PolicyArg]) -> Vec<PolicyKind> {
    let all = args.is_empty() || args.contains(&PolicyArg::All);
    PolicyKind::ALL
        .into_iter()
        .filter(|k| {
            all || args.iter().any(|a| {
                matches!(
                    (a, k),
                    (PolicyArg::Libra, PolicyKind::Libra)
                        | (PolicyArg::Max, PolicyKind::Max)
                        | (PolicyArg::Faas, PolicyKind::Faas)
                        | (PolicyArg::Auto, PolicyKind::Auto)
                        | (PolicyArg::Spock, PolicyKind::Spock)
                )
            })
        })
        .collect()
}

/// Run `spillway sim`: load the config and trace, run the policies, print the table and
/// write the requested outputs.
///
/// # Errors
/// Any [`SimError`]: unreadable or malformed files (with file and line), invalid
/// configuration (with field paths), invalid options, plot failures.
pub fn run_sim(args: &SimArgs) -> Result<ExitCode, SimError> {
    if let Some(pattern) = args.generate {
        let (name, calls) = match pattern {
            GenerateArg::Burst => ("burst", super::faasim::burst(args.seed)),
            GenerateArg::Stream => ("stream", super::faasim::stream(args.seed)),
        };
        write_file(&args.input.trace, &super::faasim::events_text(&calls))?;
        if !args.quiet && args.input.trace != Path::new("-") {
            eprintln!(
                "wrote {} calls (FaaSim {name}, seed {}) to {}",
                calls.len(),
                args.seed,
                args.input.trace.display()
            );
        }
        return Ok(ExitCode::SUCCESS);
    }
    let mut config = load_config(args.config.as_deref())?;
    for text in &args.set {
        let (path, value) = split_assignment("--set", text)?;
        config =
            crate::config::with_override(&config, path, value).map_err(|m| invalid("--set", m))?;
    }
    if let Some(sweep) = &args.sweep {
        let (path, values) = split_assignment("--sweep", sweep)?;
        let mut rows = Vec::new();
        let mut reports = Vec::new();
        for value in values.split(',') {
            let c = crate::config::with_override(&config, path, value)
                .map_err(|m| invalid("--sweep", m))?;
            let one = SimArgs {
                sweep: None,
                set: Vec::new(),
                json: None,
                ..args.clone()
            };
            if !args.quiet {
                println!("{path} = {value}");
            }
            let report = run_one(&one, c)?;
            rows.push(serde_json::json!({"value": value, "report": report}));
            reports.push((value.to_string(), report));
        }
        // One row per value and policy, a column for PATH.
        let summary: Vec<(String, &super::report::SimReport)> = reports
            .iter()
            .filter_map(|(v, r)| r.as_ref().map(|r| (v.clone(), r)))
            .collect();
        if !args.quiet && !summary.is_empty() {
            println!("sweep of {path}:");
            print!("{}", super::report::sweep_table(path, &summary));
        }
        if let Some(p) = &args.json {
            let mut text = serde_json::to_string_pretty(&serde_json::json!({
                "sweep": path,
                "rows": rows,
            }))
            .expect("reports serialise");
            text.push('\n');
            write_file(p, &text)?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    run_one(args, config)?;
    Ok(ExitCode::SUCCESS)
}

/// Where a trace comes from and how to read it: the trace options `spillway sim` and
/// `spillway tune` share (`#[command(flatten)]`).
#[derive(Clone, Debug, clap::Args)]
pub struct TraceArgs {
    /// The trace file (access logs: a file or a directory of them; `spillway sim
    /// --generate`: the file written, `-` for stdout).
    #[arg(long, value_name = "FILE")]
    pub trace: PathBuf,
    /// Trace format; default: the config's `sim.trace_format`, else `counts`.
    #[arg(long, value_enum)]
    pub format: Option<TraceFormat>,
    /// azure2019: durations-percentiles file (per-function empirical service times).
    #[arg(long, value_name = "FILE")]
    pub durations: Option<PathBuf>,
    /// azure2019: app-memory file (per-app memory, MB).
    #[arg(long, value_name = "FILE")]
    pub memory: Option<PathBuf>,
    /// Divide the load by this, carrying the remainder (total = round(total / d)).
    #[arg(long, default_value_t = 1.0, value_name = "D")]
    pub rate_divisor: f64,
    /// Window start, trace seconds.
    #[arg(long, value_name = "SECONDS")]
    pub from: Option<f64>,
    /// Window end (exclusive), trace seconds.
    #[arg(long, value_name = "SECONDS")]
    pub to: Option<f64>,
    /// Access logs (`--format spillway|nginx|alb|apigw`): skip lines that do not parse
    /// and count them in the report, instead of stopping at the first with its
    /// file:line.
    #[arg(long)]
    pub skip_bad_lines: bool,
}

/// Load the trace `input` names, with the config's routes for access logs; a trace or
/// window with no time in it is an error.
///
/// # Errors
/// As [`Trace::load`] and [`super::logs::load`]; [`SimError::Invalid`] for options that
/// do not apply to the format, and for an empty trace or window.
pub fn load_trace(
    input: &TraceArgs,
    config: &Config,
) -> Result<(Trace, Option<super::logs::LogSummary>), SimError> {
    let format = input.format.unwrap_or(match config.sim.trace_format {
        None | Some(TraceFormatConfig::Counts) => TraceFormat::Counts,
        Some(TraceFormatConfig::Events) => TraceFormat::Events,
        Some(TraceFormatConfig::Azure2019) => TraceFormat::Azure2019,
        Some(TraceFormatConfig::Azure2021) => TraceFormat::Azure2021,
        Some(TraceFormatConfig::Spillway) => TraceFormat::Spillway,
        Some(TraceFormatConfig::Nginx) => TraceFormat::Nginx,
        Some(TraceFormatConfig::Alb) => TraceFormat::Alb,
        Some(TraceFormatConfig::Apigw) => TraceFormat::Apigw,
    });
    let opts = TraceOptions {
        format,
        rate_divisor: input.rate_divisor,
        from_s: input.from,
        to_s: input.to,
        durations: input.durations.clone(),
        memory: input.memory.clone(),
    };
    if (input.durations.is_some() || input.memory.is_some()) && format != TraceFormat::Azure2019 {
        return Err(SimError::Invalid {
            field: "--durations/--memory".into(),
            message: "only apply to --format azure2019".into(),
        });
    }
    let log_format = super::logs::LogFormat::of(format);
    if input.skip_bad_lines && log_format.is_none() {
        return Err(invalid(
            "--skip-bad-lines",
            "only applies to the access-log formats (spillway, nginx, alb, apigw)".into(),
        ));
    }
    let (trace, log_summary) = match log_format {
        Some(f) => {
            let log = super::logs::LogOptions {
                skip_bad_lines: input.skip_bad_lines,
                routes: config.route_defs(),
                max_route_keys: config.max_route_keys(),
            };
            let (t, s) = super::logs::load(&input.trace, f, &opts, &log)?;
            (t, Some(s))
        }
        None => (Trace::load(&input.trace, &opts)?, None),
    };
    // An all-zero trace is a valid question (what does idling cost?); a trace or window
    // with no time in it is not.
    if trace.total_requests() == 0 && trace.duration_s <= 0.0 {
        let window = match (input.from, input.to) {
            (None, None) => String::new(),
            (f, t) => format!(
                " in the window [{}, {})",
                f.unwrap_or(0.0),
                t.map_or("end".to_string(), |t| t.to_string())
            ),
        };
        return Err(SimError::Invalid {
            field: "--trace".into(),
            message: format!("{}: no request{window}", input.trace.display()),
        });
    }
    Ok((trace, log_summary))
}

/// One run of `spillway sim` with `config`: returns the report after writing the
/// requested outputs.
fn run_one(
    args: &SimArgs,
    mut config: Config,
) -> Result<Option<super::report::SimReport>, SimError> {
    if let Some(o) = args.queue_order {
        match config.queue.as_mut() {
            Some(q) => q.order = o.order(),
            None => {
                return Err(SimError::Invalid {
                    field: "--queue-order".into(),
                    message: "the configuration has no `queue:` section".into(),
                });
            }
        }
    }
    if let Some(r) = args.r_max_rps {
        config.libra.r_max_rps = r;
        let issues = config.validate();
        if !issues.is_empty() {
            let message = issues
                .iter()
                .map(|i| format!("{}: {}", i.path, i.message))
                .collect::<Vec<_>>()
                .join("; ");
            return Err(SimError::Invalid {
                field: "--r-max-rps".into(),
                message,
            });
        }
    }
    let (trace, log_summary) = load_trace(&args.input, &config)?;
    // `sim.placements` (function zones): the FAAS policy once per placement.
    let placements = config.sim.placements.clone();
    let policies = if placements.is_empty() {
        selected_policies(&args.policy)
    } else {
        vec![PolicyKind::Faas; placements.len()]
    };
    if let Some(mode) = args.delay_queue {
        // The delay-queue model prints its own tables: no cost report.
        run_delay(args, &config, &trace, &policies, mode)?;
        return Ok(None);
    }
    let total = trace.total_requests();
    let (model, warnings) = model_summary(&config);
    // The warnings are about the service-time model, which a log with a duration on
    // every line does not use.
    let all_logged = log_summary
        .as_ref()
        .is_some_and(|s| s.requests > 0 && s.with_duration == s.requests);
    for w in warnings.iter().filter(|_| !all_logged) {
        eprintln!("{w}");
    }
    let bar = if !args.quiet && std::io::stderr().is_terminal() && total >= 1_000_000 {
        let bar = ProgressBar::with_draw_target(
            Some(total * policies.len() as u64),
            ProgressDrawTarget::stderr(),
        );
        bar.set_style(
            ProgressStyle::with_template(
                "{msg:>6} [{bar:40}] {human_pos}/{human_len} requests ({eta})",
            )
            .expect("valid template")
            .progress_chars("=> "),
        );
        bar
    } else {
        ProgressBar::hidden()
    };
    // The run's wall-clock time is reported to the user; it never feeds the simulation.
    #[allow(clippy::disallowed_methods)]
    let wall = std::time::Instant::now();
    // Without a terminal (CI logs, pipes): one progress line every 10 s instead of a bar.
    let lines = !args.quiet && !std::io::stderr().is_terminal();
    let mut last_line = 0u64;
    let runs_n = if placements.is_empty() {
        policies.len()
    } else {
        placements.len()
    };
    let mut done = vec![0u64; runs_n];
    let all = total * runs_n as u64;
    let series = (args.csv.is_some() || args.plot.is_some()).then_some(args.csv_max_rows.max(1));
    let mut progress = |i: usize, n: u64, name: &str| {
        done[i] = n;
        let sum: u64 = done.iter().sum();
        bar.set_message(name.to_string());
        bar.set_position(sum);
        let secs = wall.elapsed().as_secs();
        if lines && secs >= last_line + 10 {
            last_line = secs - secs % 10;
            eprintln!(
                "progress: {sum} of {all} requests ({:.0} %) after {secs} s",
                sum as f64 * 100.0 / all.max(1) as f64
            );
        }
    };
    let (report, runs) = if placements.is_empty() {
        super::simulate_with(
            &config,
            &trace,
            &policies,
            args.seed,
            series,
            &mut |i, n| progress(i, n, policies[i].name()),
        )?
    } else {
        let mut all: Option<(super::report::SimReport, Vec<super::engine::PolicyRun>)> = None;
        for (i, placement) in placements.iter().enumerate() {
            let mut c = config.clone();
            c.placement = *placement;
            let name = crate::policy::placement::PlacementPolicy::from(*placement).as_str();
            let (mut rep, mut runs) = super::simulate_with(
                &c,
                &trace,
                &[PolicyKind::Faas],
                args.seed,
                series,
                &mut |_, n| progress(i, n, name),
            )?;
            for r in rep.policies.iter_mut() {
                r.name = name.to_string();
            }
            for r in runs.iter_mut() {
                r.report.name = name.to_string();
            }
            match &mut all {
                None => all = Some((rep, runs)),
                Some((a, b)) => {
                    a.policies.append(&mut rep.policies);
                    b.append(&mut runs);
                }
            }
        }
        all.expect("at least one placement")
    };
    bar.finish_and_clear();
    let mut report = report;
    report.log = log_summary;
    let secs = wall.elapsed().as_secs_f64();
    if let Some(path) = &args.json {
        let mut text = serde_json::to_string_pretty(&report).expect("reports serialise");
        text.push('\n');
        write_file(path, &text)?;
    }
    if let Some(path) = &args.csv {
        let series: Vec<(&str, &[_])> = runs
            .iter()
            .map(|r| (r.report.name.as_str(), r.series.as_slice()))
            .collect();
        write_file(path, &series_csv(&series))?;
    }
    if let Some(path) = &args.plot {
        plot_sim(&runs, path)?;
    }
    if !args.quiet {
        let offset = if trace.offset_s > 0.0 {
            format!(", clock 0 = trace second {}", trace.offset_s)
        } else {
            String::new()
        };
        let log = report.log.as_ref().map_or(String::new(), log_line);
        let text = format!(
            "trace {} ({} requests, {:.0} s{offset}), seed {}\n{log}{model}\n{}",
            report.trace,
            total,
            trace.duration_s,
            args.seed,
            table(&report.policies)
        );
        if args.json.as_deref() == Some(Path::new("-")) {
            eprint!("{text}");
        } else {
            print!("{text}");
        }
        let simulated = total as f64 * policies.len() as f64;
        eprintln!(
            "simulated {} policies x {} requests in {:.2} s ({:.2} M requests/s)",
            policies.len(),
            total,
            secs,
            simulated / secs.max(1e-9) / 1e6
        );
    }
    Ok(Some(report))
}

/// The report's line about an access log: lines, requests, ignored and bad lines.
pub(crate) fn log_line(s: &super::logs::LogSummary) -> String {
    let bad = match (&s.first_bad_line, s.bad_lines) {
        (_, 0) => String::new(),
        (Some(first), n) => format!(", {n} bad lines skipped (first: {first})"),
        (None, n) => format!(", {n} bad lines skipped"),
    };
    format!(
        "log ({}): {} lines, {} requests ({} with a duration, their service time), {} route keys, {} lines ignored{bad}\n",
        s.format,
        s.lines,
        s.requests,
        s.with_duration,
        s.route_keys.len(),
        s.ignored_lines
    )
}

pub(crate) fn invalid(field: &str, message: String) -> SimError {
    SimError::Invalid {
        field: field.into(),
        message,
    }
}

/// The cost inputs from a config and the command-line overrides.
///
/// # Errors
/// [`SimError::Invalid`] naming the option for out-of-range values.
pub fn cost_inputs(args: &CostArgs, config: &Config) -> Result<CostInputs, SimError> {
    let p = &config.pricing;
    let arch = match args.arch {
        Some(ArchArg::X86_64) => Architecture::X86_64,
        Some(ArchArg::Arm64) => Architecture::Arm64,
        None => p.architecture,
    };
    let gateway = args.api_gateway || p.api_gateway;
    let inputs = CostInputs {
        vm_hourly_usd: args.vm_hourly_usd.unwrap_or(p.vm_hourly_usd),
        r_max_rps: args.r_max_rps.unwrap_or(config.libra.r_max_rps),
        memory_mb: args.memory_mb.unwrap_or(p.function_memory_mb),
        duration_ms: args.duration_ms.unwrap_or(p.function_duration_ms),
        architecture: match arch {
            Architecture::X86_64 => "x86_64".into(),
            Architecture::Arm64 => "arm64".into(),
        },
        gb_second_usd: args
            .gb_second_usd
            .or(p.gb_second_usd.filter(|_| args.arch.is_none()))
            .unwrap_or_else(|| arch.default_gb_second_usd()),
        request_usd: args.request_usd.unwrap_or(p.request_usd),
        api_gateway_request_usd: if gateway {
            args.api_gateway_request_usd
                .unwrap_or(p.api_gateway_request_usd)
        } else {
            0.0
        },
    };
    let positive = |field: &str, v: f64| {
        if v.is_finite() && v > 0.0 {
            Ok(())
        } else {
            Err(invalid(
                field,
                format!("must be a positive number, got {v}"),
            ))
        }
    };
    let non_negative = |field: &str, v: f64| {
        if v.is_finite() && v >= 0.0 {
            Ok(())
        } else {
            Err(invalid(field, format!("must be zero or positive, got {v}")))
        }
    };
    positive("--vm-hourly-usd", inputs.vm_hourly_usd)?;
    positive("--r-max-rps", inputs.r_max_rps)?;
    if inputs.duration_ms.is_zero() {
        return Err(invalid(
            "--duration-ms",
            "must be a positive number, got 0".into(),
        ));
    }
    non_negative("--gb-second-usd", inputs.gb_second_usd)?;
    non_negative("--request-usd", inputs.request_usd)?;
    non_negative("--api-gateway-request-usd", inputs.api_gateway_request_usd)?;
    if !(128..=10_240).contains(&inputs.memory_mb) {
        return Err(invalid(
            "--memory-mb",
            format!(
                "must be in [128, 10240] (Lambda's range), got {}",
                inputs.memory_mb
            ),
        ));
    }
    Ok(inputs)
}

/// Run `spillway cost`: print the CIP and the cost table, optionally JSON and a plot.
///
/// # Errors
/// [`SimError::Invalid`] for out-of-range options, config and I/O errors.
pub fn run_cost(args: &CostArgs) -> Result<ExitCode, SimError> {
    let config = match &args.config {
        Some(p) => Config::load(p)?,
        None => Config::default(),
    };
    let inputs = cost_inputs(args, &config)?;
    let max_rate = args.max_rate.unwrap_or(3.0 * inputs.r_max_rps);
    if !(max_rate.is_finite() && max_rate > 0.0) {
        return Err(invalid(
            "--max-rate",
            format!("must be a positive number, got {max_rate}"),
        ));
    }
    let step = args.step.unwrap_or(max_rate / 24.0);
    if !(step.is_finite() && step > 0.0 && max_rate / step <= 1_000_000.0) {
        return Err(invalid(
            "--step",
            format!("must be positive and give at most 10^6 rows, got {step}"),
        ));
    }
    let steps = (max_rate / step + 1e-9).floor() as u64;
    let rates = (0..=steps).map(|i| i as f64 * step);
    let report = cost_report(inputs, rates).with_configured_cip(config.libra.cip_rps);
    match args.json.as_deref() {
        Some(p) => {
            let mut text = serde_json::to_string_pretty(&report).expect("reports serialise");
            text.push('\n');
            write_file(p, &text)?;
            if p != Path::new("-") {
                print!("{}", cost_text(&report));
            }
        }
        None => print!("{}", cost_text(&report)),
    }
    if let Some(p) = &args.plot {
        plot_cost(&report, p)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `spillway sim --delay-queue`: the delay-queue experiment ([`super::engine::run_delay`]) per policy, with
/// and/or without the queue; one table (and `--json`).
fn run_delay(
    args: &SimArgs,
    config: &crate::config::Config,
    trace: &Trace,
    policies: &[PolicyKind],
    mode: DelayQueueArg,
) -> Result<ExitCode, SimError> {
    let p = super::engine::SimParams::from_config(config)?;
    let params = config
        .async_calls
        .delay_params(Some(config.sim.vm.slots.get()));
    let load = config
        .sim
        .cpu_load
        .as_ref()
        .map(|l| (l.cores, l.from_seconds, l.to_seconds));
    let modes: &[bool] = match mode {
        DelayQueueArg::Off => &[false],
        DelayQueueArg::On => &[true],
        DelayQueueArg::Both => &[false, true],
    };
    let mut rows = Vec::new();
    for &kind in policies {
        for &on in modes {
            let r = super::engine::run_delay(&p, trace, kind, on.then(|| params.clone()), load)?;
            rows.push((kind.name(), r));
        }
    }
    if let Some(path) = &args.json {
        let v: Vec<_> = rows
            .iter()
            .map(|(name, r)| serde_json::json!({"policy": name, "run": r}))
            .collect();
        let mut text = serde_json::to_string_pretty(&v).expect("reports serialise");
        text.push('\n');
        write_file(path, &text)?;
    }
    if !args.quiet {
        let (t1, t2) = load.map_or((0.0, 0.0), |(_, a, b)| (a, b));
        println!(
            "trace {} ({} calls, {:.0} s); CPU peak window [{t1}, {t2}) s",
            args.input.trace.display(),
            trace.calls.len(),
            trace.duration_s
        );
        println!(
            "{:<6} {:<6} {:>10} {:>14} {:>13} {:>12} {:>9} {:>10} {:>9} {:>10}",
            "policy",
            "queue",
            "sync_peak",
            "peak_mean_ms",
            "peak_p95_ms",
            "sync_mean_ms",
            "async",
            "misses",
            "async_fn",
            "cpu_peak"
        );
        for (name, r) in &rows {
            println!(
                "{:<6} {:<6} {:>10} {:>14.1} {:>13.1} {:>12.1} {:>9} {:>10} {:>9} {:>10.2}",
                name,
                if r.delay_queue { "on" } else { "off" },
                r.sync_in_peak,
                r.sync_peak_mean_ms,
                r.sync_peak_p95_ms,
                r.sync_mean_ms,
                r.async_finished,
                r.deadline_misses,
                r.async_on_functions,
                r.cpu_peak
            );
        }
        for pair in rows.chunks(2) {
            if let [(name, off), (_, on)] = pair
                && !off.delay_queue
                && on.delay_queue
                && off.sync_peak_mean_ms > 0.0
            {
                println!(
                    "{name}: mean synchronous response time inside the peak {:.1} % lower with the delay queue",
                    100.0 * (1.0 - on.sync_peak_mean_ms / off.sync_peak_mean_ms)
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
