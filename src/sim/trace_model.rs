//! The trace's data types — its format, reading options, request classes, arrivals and
//! the parsed [`Trace`] — shared by the trace parsers ([`super::trace`], which re-exports
//! them) and the access-log readers ([`super::logs`]), so that neither of those files
//! imports the other's types back: `trace.rs` dispatches log formats to `logs.rs`, and
//! `logs.rs` builds these.

use std::path::PathBuf;

use super::model::ServiceModel;

/// Trace file format, see the [trace module](super::trace).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Default)]
pub enum TraceFormat {
    /// One integer a line: requests in that second.
    #[default]
    Counts,
    /// `<arrival seconds> [<zone>] [fn=<name>] [p_ms=<ms>]` a line.
    Events,
    /// Azure Functions 2019 per-minute invocation counts.
    Azure2019,
    /// Azure Functions 2021 invocations: `app,func,end_timestamp,duration`.
    Azure2021,
    /// spillway's own access log, text or JSON lines ([`super::logs`]).
    Spillway,
    /// nginx `combined` access log, optionally with `$request_time`.
    Nginx,
    /// AWS Application Load Balancer access logs (gzip too).
    Alb,
    /// API Gateway JSON access logs.
    Apigw,
}

/// How to read a trace.
#[derive(Clone, Debug)]
pub struct TraceOptions {
    /// File format.
    pub format: TraceFormat,
    /// Divide the load by this (≥ 1 shrinks it), carrying the remainder.
    pub rate_divisor: f64,
    /// Window start, trace seconds.
    pub from_s: Option<f64>,
    /// Window end (exclusive), trace seconds.
    pub to_s: Option<f64>,
    /// azure2019: the durations-percentiles file.
    pub durations: Option<PathBuf>,
    /// azure2019: the app-memory file.
    pub memory: Option<PathBuf>,
}

impl Default for TraceOptions {
    fn default() -> Self {
        Self {
            format: TraceFormat::Counts,
            rate_divisor: 1.0,
            from_s: None,
            to_s: None,
            durations: None,
            memory: None,
        }
    }
}

/// A class of requests with its own service-time model and memory (one Azure function).
/// Class 0 is the configured default request.
#[derive(Clone, Debug, Default)]
pub struct RequestClass {
    /// The function's name (`events` traces' `fn=` column; call scheduling's route key);
    /// `None`: the default class.
    pub name: Option<String>,
    /// Service time model; `None`: the configured `sim.request.service_time`.
    pub service: Option<ServiceModel>,
    /// Memory, MB; `None`: the configured memory.
    pub memory_mb: Option<u32>,
}

/// One request arrival.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Arrival {
    /// Arrival time, nanoseconds since the window start.
    pub at_ns: u64,
    /// Request class (index into [`Trace::classes`]).
    pub class: u32,
    /// Zone of origin (`events` traces; 0 otherwise).
    pub zone: u32,
    /// Service time from the trace, ns (`azure2021`); 0: sample from the class model.
    pub service_ns: u64,
}

/// The parsed, windowed and scaled trace data.
#[derive(Clone, Debug)]
pub enum TraceData {
    /// Requests per second, arrivals evenly spaced.
    Counts(Vec<u32>),
    /// Explicit arrivals, time-ordered.
    Events(Vec<Arrival>),
    /// Per minute: `(class, count)` cells; arrivals uniformly random in the minute.
    PerMinute(Vec<Vec<(u32, u32)>>),
}

/// A loaded trace: data plus request classes.
#[derive(Clone, Debug)]
pub struct Trace {
    /// Where it came from (for the report).
    pub path: String,
    /// The arrivals.
    pub data: TraceData,
    /// Request classes; index 0 is the default.
    pub classes: Vec<RequestClass>,
    /// Length of the trace, seconds (counts: lines, azure2019: minutes · 60, events: the
    /// last arrival).
    pub duration_s: f64,
    /// Trace time of the simulated clock's zero, seconds: the window start (`--from`), or
    /// for `events` traces without one the whole second of the first event (a trace of
    /// Unix timestamps starts at its first event, not at 1970).
    pub offset_s: f64,
    /// `events` traces with a header of named columns: every call with its kind,
    /// deadline and processing time, time-ordered (ProFaaStinate §3); empty otherwise.
    pub calls: Vec<CallEvent>,
}

/// One call of an `events` trace with named columns (`time_s kind deadline_s
/// processing_ms zone`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CallEvent {
    /// Arrival, ns since the window start.
    pub at_ns: u64,
    /// `async` (may wait in the delay queue) or `sync`.
    pub is_async: bool,
    /// Deadline, seconds after arrival (`async` only; absent: 180).
    pub deadline_s: f64,
    /// CPU time the call needs, ms (absent: 0 — the configured service-time model).
    pub processing_ms: f64,
    /// Zone of origin.
    pub zone: u32,
}

/// Deadline of an `async` event without a `deadline_s` column, seconds (ProFaaStinate
/// §3's default).
pub const DEFAULT_EVENT_DEADLINE_S: f64 = 180.0;
