//! The `spillway` binary: parses the command line and runs the chosen subcommand.

use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use spillway::cli::{Cli, Command};
use spillway::config::{Config, ConfigError};

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing(&cli.command);
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", render(&e));
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

fn init_tracing(command: &Command) {
    use tracing_subscriber::EnvFilter;
    let default = match command {
        Command::SampleApi { .. } => "warn",
        _ => "info",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

/// Bad input (trace, config) is reported on stderr with exit code 1.
fn report(result: Result<ExitCode, spillway::sim::SimError>) -> ExitCode {
    result.unwrap_or_else(|e| {
        eprintln!("error: {e}");
        ExitCode::FAILURE
    })
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Check { config, sim } => match if sim {
            Config::load(&config)
        } else {
            Config::load_for_serve(&config)
        } {
            Ok(_) => {
                println!("{}: ok", config.display());
                Ok(ExitCode::SUCCESS)
            }
            Err(e) => {
                eprintln!("{e}");
                Ok(ExitCode::FAILURE)
            }
        },
        Command::Serve {
            config,
            listen,
            admin_listen,
        } => {
            let mut config = match config {
                Some(path) => match Config::load_for_serve(&path) {
                    Ok(c) => c,
                    Err(e @ (ConfigError::Parse { .. } | ConfigError::Invalid { .. })) => {
                        eprintln!("{e}");
                        return Ok(ExitCode::FAILURE);
                    }
                    Err(e) => return Err(e.into()),
                },
                None => Config::quickstart(),
            };
            if let Some(addr) = listen {
                config.gateway.listen = addr;
            }
            if let Some(addr) = admin_listen {
                config.gateway.admin_listen = addr;
            }
            let exe = std::env::current_exe().context("cannot locate the spillway binary")?;
            let rt = tokio::runtime::Runtime::new().context("cannot start the tokio runtime")?;
            rt.block_on(async move {
                let server = spillway::proxy::server::Server::bind(config, exe).await?;
                tracing::info!(
                    proxy = %server.proxy_addr(),
                    admin = %server.admin_addr(),
                    tls = %server.tls_addr().map_or("-".to_string(), |a| a.to_string()),
                    "spillway listening"
                );
                server.run(spillway::proxy::server::shutdown_signal()).await;
                anyhow::Ok(ExitCode::SUCCESS)
            })
        }
        Command::Sim(args) => Ok(report(spillway::sim::cli::run_sim(&args))),
        Command::Cost(args) => Ok(report(spillway::sim::cli::run_cost(&args))),
        Command::SampleApi { listen, name } => {
            let rt = tokio::runtime::Runtime::new().context("cannot start the tokio runtime")?;
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::bind(listen)
                    .await
                    .with_context(|| format!("cannot listen on {listen}"))?;
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
    }
}
