//! The command line: `spillway serve | check | sample-api | sim | cost`.
//!
//! Exit codes: 0 success, 1 invalid input (a bad config file, a bad trace), 2 usage errors
//! (clap's convention).

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// spillway: a gateway that runs each request of an HTTP API on VMs or on functions
/// (LIBRA), and a simulator for AWS cost experiments on traces.
#[derive(Debug, Parser)]
#[command(name = "spillway", version, about, long_about = None)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the gateway. Without --config it runs the embedded quickstart configuration
    /// (local VM pool and function tier running the sample API).
    Serve {
        /// Configuration file (YAML). Default: the embedded config/quickstart.yaml.
        #[arg(long, short)]
        config: Option<PathBuf>,
        /// Override `gateway.listen` (e.g. when 127.0.0.1:8080 is taken).
        #[arg(long, value_name = "ADDR")]
        listen: Option<SocketAddr>,
        /// Override `gateway.admin_listen`.
        #[arg(long, value_name = "ADDR")]
        admin_listen: Option<SocketAddr>,
    },
    /// Validate a configuration file: exit 0 if valid, 1 with every problem otherwise.
    Check {
        /// Configuration file (YAML).
        #[arg(long, short)]
        config: PathBuf,
        /// Check it as a simulator config (`vm_pool` and `function_tier` optional).
        #[arg(long)]
        sim: bool,
    },
    /// Run the bundled sample API (what the quickstart's VMs and functions run).
    SampleApi {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:8000")]
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
}
