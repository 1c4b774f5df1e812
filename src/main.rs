//! The `spillway` binary: parses the command line and runs the chosen subcommand.

use std::process::ExitCode;

use anyhow::Context;
use clap::{CommandFactory, Parser};
use spillway::build_info;
use spillway::cli::{Cli, Command, ConfigCommand, LogFormat};
use spillway::config::{Config, ConfigError};

/// jemalloc as the global allocator. Under the proxy's load
/// glibc malloc spent ~13 % of the gateway's CPU (fastbin consolidation, arena locks),
/// and it keeps the memory of closed connections until `malloc_trim`; jemalloc's
/// per-thread caches are cheaper, and its background thread returns unused pages to the
/// OS after `dirty_decay_ms` (see [`_rjem_malloc_conf`]).
#[cfg(all(unix, not(target_env = "musl")))]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's start-up options (read once, by name, by the prefixed jemalloc that
/// tikv-jemallocator builds): a background thread purges unused dirty pages after 5 s
/// straight to the OS (`muzzy_decay_ms:0`: `MADV_DONTNEED`, which lowers RSS at once,
/// rather than `MADV_FREE`, which leaves it counted until memory runs short), so that
/// RSS comes back down after many connections close even when the gateway is idle.
#[cfg(all(unix, not(target_env = "musl")))]
#[allow(non_upper_case_globals, unsafe_code)]
#[unsafe(export_name = "_rjem_malloc_conf")]
pub static _rjem_malloc_conf: &[u8; 60] =
    b"background_thread:true,dirty_decay_ms:5000,muzzy_decay_ms:0\0";

fn main() -> ExitCode {
    let cli = Cli::parse();
    let log_format = cli.log_format;
    // `serve` sets up logging once its config is read (the access-log switch is there).
    match &cli.command {
        Command::Serve { .. } => {}
        Command::SampleApi { .. } => init_tracing("warn", cli.log_format, false),
        _ => init_tracing("info", cli.log_format, false),
    }
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            fatal(log_format, &render(&e));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes, each cause added only if the message does not already say
/// it (our thiserror messages often include their source).
fn render(e: &anyhow::Error) -> String {
    let mut out = e.to_string();
    for cause in e.chain().skip(1) {
        let c = cause.to_string();
        if !out.contains(&c) {
            out.push_str(": ");
            out.push_str(&c);
        }
    }
    out
}

/// A fatal error on standard error, credentials redacted ([`spillway::redact`]): as
/// `error: TEXT` in the text format, as one JSON log object (`level: ERROR`, the text in
/// `message`) with `--log-format json`, so that a log collector reading JSON lines
/// sees why the process stopped.
fn fatal(format: LogFormat, text: &str) {
    let text = spillway::redact::redact(text);
    match format {
        LogFormat::Text => eprintln!("error: {text}"),
        LogFormat::Json => fatal_json(&text),
    }
}

/// A problem with the user's input (a config file) as it is (it names file:line:column),
/// or as one JSON log object with `--log-format json`.
fn input_error(format: LogFormat, text: &str) {
    let text = spillway::redact::redact(text);
    match format {
        LogFormat::Text => eprintln!("{text}"),
        LogFormat::Json => fatal_json(&text),
    }
}

/// One ERROR event in the JSON log format, whether or not logging is set up yet (a
/// config error comes before `serve` sets it up).
fn fatal_json(text: &str) {
    let subscriber = tracing_subscriber::fmt()
        .json()
        .flatten_event(true)
        .with_writer(spillway::redact::RedactingStderr)
        .finish();
    tracing::subscriber::with_default(subscriber, || tracing::error!("{text}"));
}

/// Log to standard error at `default` level (unless `RUST_LOG` says otherwise), as text
/// or JSON. The access log (target `spillway::access`) is on when `access_log`, or when
/// `RUST_LOG` names that target itself.
fn init_tracing(default: &str, format: LogFormat, access_log: bool) {
    use tracing_subscriber::EnvFilter;
    let from_env = std::env::var("RUST_LOG")
        .ok()
        .filter(|v| !v.trim().is_empty());
    let names_access = from_env
        .as_deref()
        .is_some_and(|v| v.contains("spillway::access"));
    let mut filter = from_env
        .as_deref()
        .and_then(|v| EnvFilter::try_new(v).ok())
        .unwrap_or_else(|| EnvFilter::new(default));
    if !names_access {
        let level = if access_log { "info" } else { "off" };
        filter = filter.add_directive(
            format!("spillway::access={level}")
                .parse()
                .expect("a valid directive"),
        );
    }
    // Every line through the one redaction (`spillway::redact`): no credential from a
    // URL, a header or a provider's error reaches the log.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(spillway::redact::RedactingStderr);
    match format {
        LogFormat::Json => builder.json().flatten_event(true).init(),
        LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
    }
}

/// Bad input (trace, config) is reported on stderr with exit code 1.
fn report(result: Result<ExitCode, spillway::sim::SimError>) -> ExitCode {
    result.unwrap_or_else(|e| {
        eprintln!("error: {e}");
        ExitCode::FAILURE
    })
}

/// A config problem is the user's input: printed as it is (a JSON log object with
/// `--log-format json`), exit 1.
fn config_or_exit(
    format: LogFormat,
    result: Result<Config, ConfigError>,
) -> Result<Config, ExitCode> {
    result.map_err(|e| {
        input_error(format, &e.to_string());
        ExitCode::FAILURE
    })
}

/// Where the CIP in force comes from, for logs and `config print`.
fn cip_source(config: &Config) -> String {
    let computed = spillway::policy::cost::cost_indifference_point_rps(
        config.pricing.cost_per_request(),
        config.libra.r_max_rps,
        config.pricing.vm_hourly_usd,
    );
    match config.libra.cip_rps {
        Some(_) => {
            format!("set by libra.cip_rps; computed from pricing it would be {computed:.3} req/s")
        }
        None => "computed from pricing".to_string(),
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let log_format = cli.log_format;
    match cli.command {
        Command::Check { config, sim } => {
            let Some(path) = config.path() else {
                Cli::command()
                    .error(
                        clap::error::ErrorKind::MissingRequiredArgument,
                        "spillway check needs a config file: spillway check FILE (or -c FILE)",
                    )
                    .exit();
            };
            let loaded = if sim {
                Config::load(path)
            } else {
                Config::load_for_serve(path)
            };
            match loaded {
                Ok(c) => {
                    let text = spillway::config::read_text(path);
                    let file = path.display().to_string();
                    // Through the one redaction, as `serve` prints them: a setting's
                    // value quoted in a warning may hold a credential.
                    for w in spillway::config::warnings(&c, text.as_deref()) {
                        let line = spillway::config::warning_line(&file, &w);
                        eprintln!("{}", spillway::redact::redact(&line));
                    }
                    println!("{file}: ok");
                    Ok(ExitCode::SUCCESS)
                }
                Err(e) => {
                    // A value quoted in an error (a Redis URL with its password) is
                    // redacted as `serve` redacts it.
                    eprintln!("{}", spillway::redact::redact(&e.to_string()));
                    Ok(ExitCode::FAILURE)
                }
            }
        }
        Command::Config(ConfigCommand::Print { config }) => {
            let (loaded, name) = match config.path() {
                Some(p) => (Config::load(p), p.display().to_string()),
                None => (
                    Ok(Config::quickstart()),
                    "the embedded quickstart (config/quickstart.yaml)".to_string(),
                ),
            };
            let config = match config_or_exit(log_format, loaded) {
                Ok(c) => c,
                Err(code) => return Ok(code),
            };
            // The collector's header values (API keys) are printed as `***`.
            let mut shown = config.clone();
            if let Some(otlp) = shown.telemetry.otlp.as_mut() {
                otlp.redact_headers();
            }
            let yaml = serde_saphyr::to_string(&shown).context("cannot print the config")?;
            // A password in a URL (`coordination.url: redis://:pw@host`) is printed as
            // `***`; key names with `token` in them are paths or variable names here.
            let yaml = spillway::redact::redact_url_credentials(&yaml);
            print!(
                "# effective configuration of {name}: every default filled in\n\
                 # cost-indifference point in force: {:.3} req/s ({})\n{yaml}",
                config.cip_rps(),
                cip_source(&config)
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Serve {
            config,
            listen,
            admin_listen,
            access_log,
            state_dir,
        } => {
            let reload_path = config.path().map(std::path::Path::to_path_buf);
            let (loaded, name) = match config.path() {
                Some(path) => (Config::load_for_serve(path), path.display().to_string()),
                None => (
                    Ok(Config::quickstart()),
                    "embedded quickstart (config/quickstart.yaml)".to_string(),
                ),
            };
            let mut config = match config_or_exit(log_format, loaded) {
                Ok(c) => c,
                Err(code) => return Ok(code),
            };
            if let Some(addr) = listen {
                config.gateway.listen = addr;
            }
            if let Some(addr) = admin_listen {
                config.gateway.admin_listen = addr;
            }
            if let Some(problem) = config.gateway.admin_exposure_issue() {
                input_error(log_format, &format!("gateway.admin_listen: {problem}"));
                return Ok(ExitCode::FAILURE);
            }
            config.gateway.access_log |= access_log;
            init_tracing("info", log_format, config.gateway.access_log);
            tracing::info!(
                version = build_info::VERSION,
                commit = build_info::COMMIT,
                features = build_info::FEATURES,
                config = %name,
                cip_rps = (config.cip_rps() * 1000.0).round() / 1000.0,
                cip_source = %cip_source(&config),
                access_log = config.gateway.access_log,
                "spillway starting"
            );
            let text = reload_path.as_deref().and_then(spillway::config::read_text);
            for w in spillway::config::warnings(&config, text.as_deref()) {
                tracing::warn!("{}", spillway::config::warning_line(&name, &w));
            }
            let exe = std::env::current_exe().context("cannot locate the spillway binary")?;
            let rt = tokio::runtime::Runtime::new().context("cannot start the tokio runtime")?;
            rt.block_on(async move {
                let bound = spillway::proxy::server::Server::bind_in(config, exe, state_dir).await;
                let mut server = match bound {
                    Ok(s) => s,
                    Err(e) => return Err(bind_hint(e)),
                };
                server.set_reload_source(reload_path, listen, admin_listen);
                tracing::info!(
                    proxy = %server.proxy_addr(),
                    admin = %server.admin_addr(),
                    tls = %server.tls_addr().map_or("-".to_string(), |a| a.to_string()),
                    "spillway listening"
                );
                server
                    .run(spillway::proxy::server::shutdown_signal())
                    .await
                    .map_err(bind_hint)?;
                anyhow::Ok(ExitCode::SUCCESS)
            })
        }
        Command::Sim(args) => Ok(report(spillway::sim::cli::run_sim(&args))),
        Command::Cost(args) => Ok(report(spillway::sim::cli::run_cost(&args))),
        Command::Tune(args) => Ok(report(spillway::sim::tune::run_tune(&args))),
        Command::SampleApi { listen, name } => {
            let rt = tokio::runtime::Runtime::new().context("cannot start the tokio runtime")?;
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::bind(listen)
                    .await
                    .with_context(|| format!("cannot listen on {listen}"))?;
                // With `--listen 127.0.0.1:0` this line is how a caller learns the port.
                if let Ok(addr) = listener.local_addr() {
                    tracing::info!(listen = %addr, "sample API listening");
                }
                spillway::sample_api::serve(
                    listener,
                    spillway::sample_api::SampleApiOptions { name },
                    spillway::proxy::server::shutdown_signal(),
                )
                .await
                .context("sample API failed")?;
                anyhow::Ok(ExitCode::SUCCESS)
            })
        }
        Command::Completions { shell } => {
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "spillway", &mut script);
            print_until_closed(&script).context("cannot write the completion script")?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Man { dir } => {
            let cmd = Cli::command();
            match dir {
                Some(dir) => {
                    std::fs::create_dir_all(&dir)
                        .with_context(|| format!("cannot create {}", dir.display()))?;
                    clap_mangen::generate_to(cmd, &dir).with_context(|| {
                        format!("cannot write man pages into {}", dir.display())
                    })?;
                }
                None => {
                    let mut page = Vec::new();
                    clap_mangen::Man::new(cmd)
                        .render(&mut page)
                        .context("cannot render the man page")?;
                    print_until_closed(&page).context("cannot write the man page")?;
                }
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Write `bytes` to standard output. A reader that goes away before the end
/// (`spillway man | head`) ends the output quietly, as command-line tools do: a broken
/// pipe is not an error (Rust ignores SIGPIPE, so the write reports `BrokenPipe`).
fn print_until_closed(bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        done => done,
    }
}

/// A listener address already in use gets a hint: which flag moves it.
fn bind_hint(e: spillway::proxy::server::ServeError) -> anyhow::Error {
    use spillway::proxy::server::ServeError;
    match &e {
        ServeError::Bind { what, addr, source }
            if source.kind() == std::io::ErrorKind::AddrInUse =>
        {
            let flag = match *what {
                "admin" => "--admin-listen",
                "tls" => "gateway.tls.listen in the config",
                _ => "--listen",
            };
            let example = std::net::SocketAddr::new(addr.ip(), addr.port().wrapping_add(1));
            anyhow::anyhow!(
                "{e}: another process (another spillway?) is listening on {addr}; choose another \
                 address with {flag} (e.g. {flag} {example})"
            )
        }
        _ => e.into(),
    }
}
