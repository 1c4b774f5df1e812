//! The command line: `spillway serve | check | config print | sim | cost | sample-api |
//! completions | man`.
//!
//! Every subcommand that reads a configuration takes it as `-c FILE`/`--config FILE`;
//! `serve`, `check` and `config print` also take it as their one positional argument.
//!
//! Exit codes: 0 success, 1 invalid input (a bad config file, a bad trace) or a failure to
//! start, 2 usage errors (clap's convention).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::build_info;

/// spillway: a gateway that runs each request of an HTTP API on VMs or on functions
/// (LIBRA), and a simulator for AWS cost experiments on traces.
#[derive(Debug, Parser)]
#[command(
    name = "spillway",
    version = build_info::SHORT_VERSION,
    long_version = build_info::LONG_VERSION,
    about,
    long_about = None
)]
pub struct Cli {
    /// Log lines on standard error as `text` (default) or `json` (one object a line);
    /// fatal start-up errors too. Credentials in log lines are replaced by `***`.
    /// A request's lines carry its `request_id` (text: `request{request_id=…}:` before
    /// the target; JSON: in `span`).
    #[arg(long, global = true, value_enum, env = "SPILLWAY_LOG_FORMAT", default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// `--log-format` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines: `2025-01-01T00:00:00.000000Z  INFO spillway: message
    /// key=value …` (a request's: `WARN request{request_id=…}: spillway::proxy::service:
    /// request failed status=502 …`).
    Text,
    /// One JSON object a line: `{"timestamp":…,"level":"INFO","message":…, the event's
    /// fields…, "target":…}`, and for a request's lines `"span":{"request_id":…,
    /// "name":"request"}` and `"spans":[…]`.
    Json,
}

/// A configuration file, given positionally or with `-c`.
#[derive(Clone, Debug, Default, Args)]
pub struct ConfigFile {
    /// Configuration file (YAML); same as `-c FILE`.
    #[arg(value_name = "CONFIG", conflicts_with = "config")]
    pub file: Option<PathBuf>,
    /// Configuration file (YAML).
    #[arg(long, short, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

impl ConfigFile {
    /// The file, whichever way it was given.
    pub fn path(&self) -> Option<&Path> {
        self.file.as_deref().or(self.config.as_deref())
    }
}

/// Parse a listen address: `IP:PORT` or `HOST:PORT` (`localhost:8081`), see
/// [`crate::config::resolve_listen`].
///
/// # Errors
/// The address in words when it has no port or does not resolve.
pub fn parse_listen(s: &str) -> Result<SocketAddr, String> {
    crate::config::resolve_listen(s)
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the gateway. Without a config file it runs the embedded quickstart
    /// (config/quickstart.yaml: local VM pool and function tier running the sample API).
    Serve {
        /// The configuration.
        #[command(flatten)]
        config: ConfigFile,
        /// Override `gateway.listen`: IP:PORT or HOST:PORT (e.g. when 127.0.0.1:8080 is
        /// taken: `--listen localhost:8081`).
        #[arg(long, value_name = "ADDR", value_parser = parse_listen)]
        listen: Option<SocketAddr>,
        /// Override `gateway.admin_listen`.
        #[arg(long, value_name = "ADDR", value_parser = parse_listen)]
        admin_listen: Option<SocketAddr>,
        /// Log every request (overrides `gateway.access_log: false`).
        #[arg(long)]
        access_log: bool,
        /// Where the asynchronous-call store lives (`DIR/async/calls.redb`), used only
        /// when a route enables asynchronous calls; one gateway per directory. Default:
        /// systemd's $STATE_DIRECTORY, else $XDG_STATE_HOME/spillway, else
        /// ~/.local/state/spillway.
        #[arg(long, value_name = "DIR", env = "SPILLWAY_STATE_DIR")]
        state_dir: Option<std::path::PathBuf>,
    },
    /// Validate a configuration file: exit 0 if `serve` would accept it, 1 with every
    /// problem (file:line:column: field.path: what is wrong) otherwise.
    Check {
        /// The configuration (required).
        #[command(flatten)]
        config: ConfigFile,
        /// Check it as a simulator config (`vm_pool` and `function_tier` optional).
        #[arg(long)]
        sim: bool,
    },
    /// Configuration tools.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Run the bundled sample API (what the quickstart's VMs and functions run).
    SampleApi {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:8000", value_parser = parse_listen)]
        listen: SocketAddr,
        /// Instance name, sent back in the `x-spillway-instance` response header.
        #[arg(long, default_value = "sample-api")]
        name: String,
    },
    /// Replay a trace through LIBRA and the baselines (MAX, FAAS, AUTO, Spock) on a
    /// virtual clock and compare cost, SLA violations and latency.
    Sim(crate::sim::cli::SimArgs),
    /// Print the cost-indifference point and the FaaS / IaaS / hybrid cost curves.
    Cost(crate::sim::cli::CostArgs),
    /// Search φ, ρ, decision_epochs, keep-alive and pre-warm on a trace for the lowest
    /// cost with SLA violations within a target; print the Pareto front, write the
    /// recommended settings as a YAML fragment.
    Tune(crate::sim::tune::TuneArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell) to standard
    /// output, e.g. `spillway completions bash > /etc/bash_completion.d/spillway`.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff) to standard output, or write one page per subcommand into
    /// `--dir` (`spillway.1`, `spillway-serve.1`, …).
    Man {
        /// Write every page into this directory instead.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
}

/// `spillway config …`.
#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Print the effective configuration — the file with every default filled in (the
    /// embedded quickstart without a file) — as YAML, with the cost-indifference point in
    /// force.
    Print {
        /// The configuration.
        #[command(flatten)]
        config: ConfigFile,
    },
}
