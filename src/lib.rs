//! spillway: a gateway reverse proxy that decides, per request, whether an HTTP API call
//! runs on a pool of VMs or on a function tier (LIBRA), and a trace-driven simulator that
//! runs the same decision code on a virtual clock.
//!
//! * [`policy`] — the sans-IO core (monitor, scaling manager, balancer, function
//!   instances, cost model). No I/O, no clock reads.
//! * [`config`] — the YAML schema shared by the gateway and the simulator.
//! * [`proxy`] — the hyper/tokio data plane, admin listener and the live driver.
//! * [`net`] — HTTP primitives shared by the proxy and the backends (body, upstream
//!   client, header hygiene, TLS, client info). A leaf: imports no other module.
//! * [`telemetry`] — the metrics spec.
//! * [`trace_export`] — span export over OTLP (`telemetry.otlp`, the `otlp` feature).
//! * [`backends`] — VM pool and function tier providers (local processes, static URLs,
//!   HTTP function endpoints).
//! * [`coord`] — several gateway replicas, one decision: the coordinator and its
//!   shared store (Redis).
//! * [`sim`] — the discrete-event simulator and cost reports.
//! * [`sample_api`] — the sample API the quickstart runs on both tiers.
//! * [`cli`] — the command line.
//! * [`build_info`] — version, git commit and features of this binary.
//! * [`log_limit`] — repeated warnings logged once per window, with a count.
//! * [`redact`] — credentials removed from every log line, `/status` and error reply.
//! * [`state_dir`] — where the gateway keeps what outlives it (the asynchronous-call
//!   store).

pub mod backends;
pub mod build_info;
pub mod cli;
pub mod config;
pub mod coord;
pub mod log_limit;
pub mod net;
pub use spillway_policy as policy;
pub mod proxy;
pub mod redact;
pub mod sample_api;
pub mod sim;
pub mod state_dir;
pub mod telemetry;
pub mod trace_export;
