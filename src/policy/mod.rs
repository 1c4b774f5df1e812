//! The sans-IO policy core: every decision spillway makes, as plain state machines.
//!
//! Nothing in this module performs I/O, spawns tasks or reads a clock. Time is passed in
//! as [`Time`] (a [`std::time::Duration`] since an origin the driver chooses), events are
//! method calls, and decisions are return values or queued [`core::Action`]s. The
//! live gateway (`crate::proxy::driver`, tokio) and the simulator (`crate::sim`, a virtual
//! clock) are two drivers of exactly these types, in the style of quinn-proto:
//! `handle_timeout(now)` / `poll_timeout()` / `poll_action()`.
//!
//! | module | paper | what it decides |
//! |---|---|---|
//! | [`monitor`] | LIBRA §III-A (Traffic Monitor) | EWMA of requests per epoch and of their deviation |
//! | [`scaling`] | LIBRA §III-B, Alg. 1 (Scaling Manager) | how many VMs to run and the VM budget `vm_reqs` |
//! | [`balancer`] | LIBRA §III-C (Load Balancer) | VM or function tier, per request |
//! | [`controller`] | LIBRA §III (composition) | glues the three, owns the VM table, emits launch/drain/stop actions |
//! | [`functions`] | FaaSim §3 (instance life cycle) | one zone's instances: cold/warm starts, keep-alive, pre-warm, max instances |
//! | [`placement`] | FaaSim (edge/cloud placement) | which zone and instance runs a function call (edge-first, warm-first) |
//! | [`attempt`] | LIBRA §III-C, http-cases C17 | the request attempt protocol: retry, fall-through, fall-back, queue, reject |
//! | [`retry`] | http-cases C17 | the retry budget: re-sends capped at a share of the window's requests plus a floor per second |
//! | [`timers`] | — | the timer table: one earliest deadline over every timed component |
//! | [`core`] | all of the above | the one state machine both drivers run: controller + placement + boot deadlines + timers |
//! | [`rmax`] | LIBRA §III-B, Alg. 1 line 3 | r_max adapted by a PID controller on the VM latency percentile |
//! | [`cost`] | LIBRA §II (cost model) | per-request and per-VM prices, cost-indifference point |
//! | [`baselines`] | LIBRA §IV (baselines) | MAX, FAAS, AUTO and Spock as scaling/routing policies |
//! | [`sched`] | call scheduling §4 | the gateway queue: FIFO, SEPT, EECT, RECT, fair choice; per-key `E[p]` |
//! | [`routes`] | call scheduling §4 (f(i)) | the route key ("function") of a call |
//! | [`delay`] | ProFaaStinate §3 | asynchronous calls: deadline-ordered queue, CPU-aware busy/idle release |
//! | [`shared`] | LIBRA §III, several replicas | aggregate epoch counts, external decisions, budget shares, EWMA hand-over |
//!
//! This is its own crate, `spillway-policy` (re-exported by the gateway as
//! `spillway::policy`): its dependency list (`src/policy/Cargo.toml`: hdrhistogram and
//! serde) proves it imports no I/O, and mutation testing rebuilds only it per mutant.
//! Purity is also checked by `scripts/check-policy-purity.sh` (run by `.ci/run`) and by
//! `clippy.toml`'s `disallowed-methods` (no `Instant::now`/`SystemTime::now`).

pub mod attempt;
pub mod balancer;
pub mod baselines;
pub mod controller;
pub mod core;
pub mod cost;
pub mod delay;
pub mod functions;
pub mod monitor;
pub mod placement;
pub mod retry;
pub mod rmax;
pub mod routes;
pub mod scaling;
pub mod sched;
pub mod shared;
pub mod timers;

/// A point in time, as the time elapsed since an origin chosen by the driver.
///
/// The live gateway uses the instant it started; the simulator uses trace second 0.
/// Policies only ever compare and subtract `Time`s, so the origin never matters.
pub type Time = std::time::Duration;

/// Identifier of one VM in the pool, allocated by the [`controller::Controller`].
///
/// Ids are never reused within one controller's lifetime.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VmId(pub u64);

impl std::fmt::Display for VmId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "vm-{}", self.0)
    }
}

/// The two tiers a request can run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Tier {
    /// The VM pool (IaaS).
    Vm,
    /// The function tier (FaaS: local processes, an edge FaaS gateway, or AWS Lambda).
    Function,
}

impl Tier {
    /// The label value used in metrics and logs: `"vm"` or `"function"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Vm => "vm",
            Tier::Function => "function",
        }
    }
}
