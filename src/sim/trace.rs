//! Trace parsers and the arrival stream they feed to the engine.
//!
//! Formats (`--format`):
//! * `counts` — one integer a line: requests in that second (line 1 = second 0);
//!   arrivals evenly spaced within the second, at `s + j/c` (LIBRA §IV's WITS trace).
//! * `events` — `<arrival seconds> [<zone>] [fn=<name>] [p_ms=<ms>]` a line,
//!   time-ordered (FaaSim §3's event lists). The zone is kept for edge/cloud placement;
//!   the optional `key=value` columns (extensible: unknown keys are errors) name the
//!   call's function (its route key, call scheduling §4; one request class each) and its
//!   processing time (otherwise sampled from the class's model).
//!   With a header line naming its columns (`time_s kind deadline_s processing_ms zone`,
//!   trailing ones may be omitted per row) each call also has a kind (`sync` | `async`), a
//!   deadline and a processing time (ProFaaStinate §3). `#` lines are comments.
//! * `azure2019` — an Azure Functions 2019 `invocations_per_function_md` file: one row per
//!   function, per-minute counts; arrivals uniformly random within the minute. Optional
//!   durations-percentiles (`--durations`) and app-memory (`--memory`) files give each
//!   function an empirical service time and a memory size.
//! * `azure2021` — `app,func,end_timestamp,duration` rows (seconds); each invocation
//!   arrives at `end − duration` (clamped at 0) with its own service time.
//!
//! * `spillway`, `nginx`, `alb`, `apigw` — access logs, one arrival per logged request
//!   (see [`super::logs`]).
//!
//! All parsers accept trailing spaces, `\r\n` and a missing final newline, ignore blank
//! lines at the end of the file, and reject anything else with the file and 1-based line.
//!
//! `--from/--to` select a window in trace seconds (counts: whole seconds, azure2019: whole
//! minutes, whose start lies in `[from, to)`); the clock restarts at the window's first
//! unit. `--rate-divisor d` then scales the load with a carried remainder: unit `i` keeps
//! `round(C_i / d) − round(C_{i−1} / d)` requests, `C_i` the cumulative count, so the scaled
//! total is exactly `round(total / d)`.

use std::collections::HashMap;
use std::path::Path;

use rand::Rng;
use rand_chacha::ChaCha8Rng;

use super::error::SimError;
use super::model::ServiceModel;

pub use super::trace_model::{
    Arrival, CallEvent, DEFAULT_EVENT_DEADLINE_S, RequestClass, Trace, TraceData, TraceFormat,
    TraceOptions,
};

const EVENT_COLUMNS: [&str; 5] = ["time_s", "kind", "deadline_s", "processing_ms", "zone"];

const NS: u64 = 1_000_000_000;

fn parse_err(file: &Path, line: usize, message: impl Into<String>) -> SimError {
    SimError::Parse {
        file: file.display().to_string(),
        line,
        message: message.into(),
    }
}

/// Read a text file (a trace or a side file): a UTF-8 byte-order mark is skipped; a byte
/// that is not UTF-8 is a [`SimError::Parse`] naming its line.
fn read(path: &Path) -> Result<String, SimError> {
    let bytes = std::fs::read(path).map_err(|source| SimError::Io {
        path: path.to_owned(),
        source,
    })?;
    let bytes = match bytes.strip_prefix(b"\xEF\xBB\xBF") {
        Some(rest) => rest.to_vec(),
        None => bytes,
    };
    String::from_utf8(bytes).map_err(|e| {
        let bytes = e.as_bytes();
        let at = e.utf8_error().valid_up_to();
        let line = 1 + bytes[..at].iter().filter(|&&b| b == b'\n').count();
        let col = at
            - bytes[..at]
                .iter()
                .rposition(|&b| b == b'\n')
                .map_or(0, |i| i + 1);
        parse_err(
            path,
            line,
            format!(
                "not UTF-8 text: byte 0x{:02X} at column {} (traces are plain text)",
                bytes[at],
                col + 1
            ),
        )
    })
}

/// The hint appended to a parse error when a line looks like another `--format`.
fn format_hint(line: &str, current: TraceFormat) -> &'static str {
    let l = line.trim();
    if l.contains(',') {
        return " (this looks like CSV: --format azure2019 or --format azure2021)";
    }
    let mut fields = l.split_whitespace();
    let looks_events = fields
        .next()
        .is_some_and(|t| t.starts_with(|c: char| c.is_ascii_digit()) && t.parse::<f64>().is_ok())
        && fields.next().is_none_or(|z| z.parse::<u32>().is_ok())
        && fields.next().is_none();
    match current {
        TraceFormat::Counts if looks_events => {
            " (this looks like an `events` trace, `<arrival seconds> [<zone>]` a line: \
             --format events)"
        }
        _ => "",
    }
}

/// The lines of `text`, 1-based numbers, right-trimmed, trailing blank lines dropped;
/// an interior blank line is an error.
fn lines<'a>(text: &'a str, file: &Path) -> Result<Vec<(usize, &'a str)>, SimError> {
    let mut out: Vec<(usize, &str)> = text
        .lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.trim_end()))
        .collect();
    while out.last().is_some_and(|(_, l)| l.is_empty()) {
        out.pop();
    }
    if let Some((n, _)) = out.iter().find(|(_, l)| l.is_empty()) {
        return Err(parse_err(file, *n, "empty line"));
    }
    Ok(out)
}

/// Scale a sequence of counts by `divisor`, carrying the remainder (see module docs).
pub fn scale_counts(counts: impl IntoIterator<Item = u64>, divisor: f64) -> Vec<u64> {
    let mut cum = 0u64;
    let mut prev_out = 0u64;
    counts
        .into_iter()
        .map(|c| {
            cum += c;
            let out = (cum as f64 / divisor).round() as u64;
            let n = out - prev_out;
            prev_out = out;
            n
        })
        .collect()
}

fn in_window(t: f64, o: &TraceOptions) -> bool {
    o.from_s.is_none_or(|f| t >= f) && o.to_s.is_none_or(|e| t < e)
}

impl Trace {
    /// Read and parse `path` in `opts.format`, apply the window and the rate divisor.
    ///
    /// # Errors
    /// [`SimError::Io`] if a file cannot be read, [`SimError::Parse`] (file and line) for
    /// a malformed line, [`SimError::Invalid`] for bad options.
    pub fn load(path: &Path, opts: &TraceOptions) -> Result<Trace, SimError> {
        if let Some(log) = super::logs::LogFormat::of(opts.format) {
            let (trace, _) =
                super::logs::load(path, log, opts, &super::logs::LogOptions::default())?;
            return Ok(trace);
        }
        let text = read(path)?;
        Self::parse(&text, path, opts)
    }

    /// Parse trace text (`file` names it in errors); azure2019's side files are read from
    /// `opts`.
    ///
    /// # Errors
    /// As [`Trace::load`].
    pub fn parse(text: &str, file: &Path, opts: &TraceOptions) -> Result<Trace, SimError> {
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        if !(opts.rate_divisor.is_finite() && opts.rate_divisor > 0.0) {
            return Err(SimError::Invalid {
                field: "--rate-divisor".into(),
                message: format!("must be a positive number, got {}", opts.rate_divisor),
            });
        }
        for (flag, v) in [("--from", opts.from_s), ("--to", opts.to_s)] {
            if let Some(v) = v
                && !(v.is_finite() && v >= 0.0)
            {
                return Err(SimError::Invalid {
                    field: flag.into(),
                    message: format!("must be a number of trace seconds >= 0, got {v}"),
                });
            }
        }
        if let (Some(f), Some(t)) = (opts.from_s, opts.to_s)
            && f >= t
        {
            return Err(SimError::Invalid {
                field: "--from/--to".into(),
                message: format!("--from ({f}) must be before --to ({t})"),
            });
        }
        let mut trace = match opts.format {
            TraceFormat::Counts => parse_counts(text, file, opts)?,
            TraceFormat::Events => parse_events(text, file, opts)?,
            TraceFormat::Azure2019 => parse_azure2019(text, file, opts)?,
            TraceFormat::Azure2021 => parse_azure2021(text, file, opts)?,
            TraceFormat::Spillway | TraceFormat::Nginx | TraceFormat::Alb | TraceFormat::Apigw => {
                let log = super::logs::LogFormat::of(opts.format).expect("a log format");
                super::logs::parse(
                    &[(file, text)],
                    log,
                    opts,
                    &super::logs::LogOptions::default(),
                )?
                .0
            }
        };
        trace.path = file.display().to_string();
        Ok(trace)
    }

    /// Total number of requests the stream will produce.
    pub fn total_requests(&self) -> u64 {
        match &self.data {
            TraceData::Counts(c) => c.iter().map(|&x| u64::from(x)).sum(),
            TraceData::Events(e) => e.len() as u64,
            TraceData::PerMinute(m) => m
                .iter()
                .flat_map(|cells| cells.iter().map(|&(_, n)| u64::from(n)))
                .sum(),
        }
    }

    /// The busiest second's request count (MAX provisions for it). Per-minute traces
    /// use the busiest minute's mean rate, rounded up.
    pub fn peak_rps(&self) -> f64 {
        match &self.data {
            TraceData::Counts(c) => f64::from(c.iter().copied().max().unwrap_or(0)),
            TraceData::Events(e) => {
                let mut peak = 0u64;
                let mut i = 0;
                while i < e.len() {
                    let sec = e[i].at_ns / NS;
                    let j = i + e[i..].partition_point(|a| a.at_ns / NS == sec);
                    peak = peak.max((j - i) as u64);
                    i = j;
                }
                peak as f64
            }
            TraceData::PerMinute(m) => m
                .iter()
                .map(|cells| cells.iter().map(|&(_, n)| u64::from(n)).sum::<u64>())
                .max()
                .map_or(0.0, |n| (n as f64 / 60.0).ceil()),
        }
    }

    /// The arrival stream; `rng` is used only by per-minute traces.
    pub fn stream(&self, rng: ChaCha8Rng) -> ArrivalStream<'_> {
        ArrivalStream {
            trace: self,
            rng,
            unit: 0,
            j: 0,
            buf: Vec::new(),
            spacing: (0, 0),
            offset: (0, 0),
        }
    }
}

fn parse_counts(text: &str, file: &Path, o: &TraceOptions) -> Result<Trace, SimError> {
    let mut counts = Vec::new();
    let mut lines_of = Vec::new();
    let mut first = None;
    for (n, l) in lines(text, file)? {
        let digits = l.trim_start();
        let c: u64 = digits
            .bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| digits.parse().ok())
            .flatten()
            .ok_or_else(|| {
                parse_err(
                    file,
                    n,
                    format!(
                        "expected a non-negative integer (requests in second {}), got {l:?}{}",
                        n - 1,
                        format_hint(l, TraceFormat::Counts)
                    ),
                )
            })?;
        let second = (n - 1) as f64;
        if in_window(second, o) {
            first.get_or_insert(n - 1);
            counts.push(c);
            lines_of.push(n);
        }
    }
    let scaled = scale_counts(counts, o.rate_divisor);
    let scaled = scaled
        .into_iter()
        .zip(&lines_of)
        .map(|(c, &n)| {
            u32::try_from(c).map_err(|_| {
                parse_err(
                    file,
                    n,
                    format!(
                        "{c} requests in one second (after --rate-divisor): the simulator \
                         takes at most {} (use --rate-divisor)",
                        u32::MAX
                    ),
                )
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Trace {
        path: String::new(),
        duration_s: scaled.len() as f64,
        offset_s: first.unwrap_or(0) as f64,
        data: TraceData::Counts(scaled),
        classes: vec![RequestClass::default()],
        calls: Vec::new(),
    })
}

/// Copies of the k-th item: `round(k/d) − round((k−1)/d)` (0 or 1 for d ≥ 1; d < 1
/// duplicates), so `round(N/d)` in total.
fn copies_of_next(divisor: f64) -> impl FnMut() -> usize {
    let mut k = 0u64;
    move || {
        k += 1;
        ((k as f64 / divisor).round() - ((k - 1) as f64 / divisor).round()) as usize
    }
}

fn secs_to_ns(s: f64) -> u64 {
    (s * NS as f64).round() as u64
}

/// The simulator's clock counts nanoseconds in a `u64`: about 584 years from the trace's
/// origin. Longer spans are refused, naming the line (a millisecond timestamp among Unix
/// seconds is the usual cause), rather than saturating the clock.
fn event_ns(t: f64, origin: f64, file: &Path, line: usize) -> Result<u64, SimError> {
    let ns = ((t - origin) * NS as f64).round();
    if ns >= u64::MAX as f64 {
        return Err(parse_err(
            file,
            line,
            format!(
                "arrival at {t} s is {:.3e} s after the trace's origin ({origin} s); the \
                 simulator's clock reaches {:.3e} s (584 years) — a millisecond timestamp \
                 in a trace of seconds?",
                t - origin,
                u64::MAX as f64 / NS as f64
            ),
        ));
    }
    Ok(ns as u64)
}

fn parse_events(text: &str, file: &Path, o: &TraceOptions) -> Result<Trace, SimError> {
    let all = lines(text, file)?;
    let body: Vec<(usize, &str)> = all
        .into_iter()
        .filter(|(_, l)| !l.trim_start().starts_with('#'))
        .collect();
    if let Some(&(n, head)) = body.first()
        && head
            .split_whitespace()
            .next()
            .is_some_and(|t| t.parse::<f64>().is_err())
    {
        return parse_named_events(&body[1..], head, n, file, o);
    }
    parse_plain_events(&body, file, o)
}

/// `events` with a header line naming its columns, among `time_s` (required), `kind`
/// (`sync` | `async`), `deadline_s`, `processing_ms`, `zone`; rows may omit trailing
/// columns (their defaults: `sync`, 180 s, 0 = the service-time model, zone 0).
fn parse_named_events(
    rows: &[(usize, &str)],
    head: &str,
    head_line: usize,
    file: &Path,
    o: &TraceOptions,
) -> Result<Trace, SimError> {
    let names: Vec<&str> = head.split_whitespace().collect();
    for name in &names {
        if !EVENT_COLUMNS.contains(name) {
            return Err(parse_err(
                file,
                head_line,
                format!(
                    "unknown column {name:?}; columns: {}",
                    EVENT_COLUMNS.join(" ")
                ),
            ));
        }
    }
    let col = |name: &str| names.iter().position(|n| *n == name);
    let Some(t_col) = col("time_s") else {
        return Err(parse_err(
            file,
            head_line,
            "the header needs a time_s column",
        ));
    };
    let origin = o.from_s.unwrap_or(0.0);
    let mut last = f64::NEG_INFINITY;
    let mut arrivals = Vec::new();
    let mut calls = Vec::new();
    let mut copies = copies_of_next(o.rate_divisor);
    for &(n, l) in rows {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() > names.len() {
            return Err(parse_err(
                file,
                n,
                format!("{} fields, the header names {}", f.len(), names.len()),
            ));
        }
        let num = |name: &str, default: f64| -> Result<f64, SimError> {
            match col(name).and_then(|i| f.get(i)) {
                None => Ok(default),
                Some(x) => x
                    .parse::<f64>()
                    .ok()
                    .filter(|v| v.is_finite() && *v >= 0.0)
                    .ok_or_else(|| {
                        parse_err(file, n, format!("{name} must be a number ≥ 0, got {x:?}"))
                    }),
            }
        };
        let Some(t) = f
            .get(t_col)
            .and_then(|x| x.parse::<f64>().ok())
            .filter(|t| t.is_finite() && *t >= 0.0)
        else {
            return Err(parse_err(
                file,
                n,
                format!("time_s must be a number ≥ 0 in {l:?}"),
            ));
        };
        let is_async = match col("kind").and_then(|i| f.get(i)) {
            None | Some(&"sync") => false,
            Some(&"async") => true,
            Some(k) => {
                return Err(parse_err(
                    file,
                    n,
                    format!("kind must be sync or async, got {k:?}"),
                ));
            }
        };
        let deadline_s = num("deadline_s", DEFAULT_EVENT_DEADLINE_S)?;
        let processing_ms = num("processing_ms", 0.0)?;
        let zone = num("zone", 0.0)? as u32;
        if t < last {
            return Err(parse_err(
                file,
                n,
                format!("arrivals must be time-ordered: {t} after {last}"),
            ));
        }
        last = t;
        if in_window(t, o) {
            let at_ns = event_ns(t, origin, file, n)?;
            for _ in 0..copies() {
                arrivals.push(Arrival {
                    at_ns,
                    class: 0,
                    zone,
                    service_ns: (processing_ms * 1e6).round() as u64,
                });
                calls.push(CallEvent {
                    at_ns,
                    is_async,
                    deadline_s,
                    processing_ms,
                    zone,
                });
            }
        }
    }
    Ok(Trace {
        path: String::new(),
        duration_s: arrivals.last().map_or(0.0, |a| a.at_ns as f64 / NS as f64),
        data: TraceData::Events(arrivals),
        classes: vec![RequestClass::default()],
        offset_s: origin,
        calls,
    })
}

fn parse_plain_events(
    lines: &[(usize, &str)],
    file: &Path,
    o: &TraceOptions,
) -> Result<Trace, SimError> {
    const SHAPE: &str = "`<arrival seconds> [<zone>] [fn=<name>] [p_ms=<ms>]`";
    let mut arrivals = Vec::new();
    let mut classes = vec![RequestClass::default()];
    let mut by_name: HashMap<String, u32> = HashMap::new();
    let mut last = f64::NEG_INFINITY;
    // The clock starts at the window start, or at the whole second of the first event:
    // a trace of Unix timestamps does not simulate 1.7·10⁹ idle seconds first.
    let origin = match o.from_s {
        Some(f) => f,
        None => lines
            .first()
            .and_then(|(_, l)| l.split_whitespace().next())
            .and_then(|t| t.parse::<f64>().ok())
            .filter(|t| t.is_finite() && *t >= 0.0)
            .map_or(0.0, f64::floor),
    };
    let mut all_integers = true;
    let mut copies = copies_of_next(o.rate_divisor);
    for &(n, l) in lines {
        let mut it = l.split_whitespace().peekable();
        let t: f64 = it
            .next()
            .and_then(|x| x.parse().ok())
            .filter(|t: &f64| t.is_finite() && *t >= 0.0)
            .ok_or_else(|| {
                parse_err(
                    file,
                    n,
                    format!(
                        "expected {SHAPE}, got {l:?}{}",
                        format_hint(l, TraceFormat::Events)
                    ),
                )
            })?;
        all_integers &= l.bytes().all(|b| b.is_ascii_digit());
        let zone = match it.next_if(|x| !x.contains('=')) {
            None => 0,
            Some(z) => z.parse::<u32>().map_err(|_| {
                parse_err(
                    file,
                    n,
                    format!("zone must be a non-negative integer, got {z:?}"),
                )
            })?,
        };
        let (mut class, mut service_ns) = (0u32, 0u64);
        for col in it {
            match col.split_once('=') {
                Some(("fn", name)) if !name.is_empty() => {
                    let next = classes.len() as u32;
                    class = *by_name.entry(name.to_string()).or_insert_with(|| {
                        classes.push(RequestClass {
                            name: Some(name.to_string()),
                            ..RequestClass::default()
                        });
                        next
                    });
                }
                Some(("p_ms", ms)) => {
                    let ms: f64 = ms
                        .parse()
                        .ok()
                        .filter(|v: &f64| v.is_finite() && *v > 0.0)
                        .ok_or_else(|| {
                            parse_err(
                                file,
                                n,
                                format!("p_ms must be a positive number, got {ms:?}"),
                            )
                        })?;
                    service_ns = ((ms * 1e6).round() as u64).max(1);
                }
                _ => {
                    return Err(parse_err(
                        file,
                        n,
                        format!("expected {SHAPE}, got column {col:?}"),
                    ));
                }
            }
        }
        if t < last {
            return Err(parse_err(
                file,
                n,
                format!(
                    "arrivals must be time-ordered: {t} after {last}{}",
                    if all_integers {
                        " (every line so far is one integer: this looks like a `counts` \
                         trace, requests per second — --format counts)"
                    } else {
                        ""
                    }
                ),
            ));
        }
        last = t;
        if in_window(t, o) {
            let a = Arrival {
                at_ns: event_ns(t, origin, file, n)?,
                class,
                zone,
                service_ns,
            };
            arrivals.extend(std::iter::repeat_n(a, copies()));
        }
    }
    Ok(Trace {
        path: String::new(),
        duration_s: arrivals.last().map_or(0.0, |a| a.at_ns as f64 / NS as f64),
        offset_s: origin,
        data: TraceData::Events(arrivals),
        classes,
        calls: Vec::new(),
    })
}

fn split_csv(l: &str) -> Vec<&str> {
    l.split(',').map(str::trim).collect()
}

fn column(header: &[&str], name: &str, file: &Path) -> Result<usize, SimError> {
    header
        .iter()
        .position(|h| h.eq_ignore_ascii_case(name))
        .ok_or_else(|| parse_err(file, 1, format!("header has no {name:?} column")))
}

fn parse_azure2019(text: &str, file: &Path, o: &TraceOptions) -> Result<Trace, SimError> {
    let lines = lines(text, file)?;
    let Some((_, head)) = lines.first() else {
        return Err(parse_err(file, 1, "empty file: expected a header row"));
    };
    let header = split_csv(head);
    let owner = column(&header, "HashOwner", file)?;
    let app = column(&header, "HashApp", file)?;
    let func = column(&header, "HashFunction", file)?;
    let first_minute = column(&header, "1", file)?;
    let minutes = header.len() - first_minute;
    // Side files: durations per (owner, app, function), memory per (owner, app).
    let durations = match &o.durations {
        Some(p) => parse_durations(&read(p)?, p)?,
        None => HashMap::new(),
    };
    let memory = match &o.memory {
        Some(p) => parse_memory(&read(p)?, p)?,
        None => HashMap::new(),
    };
    let mut classes = vec![RequestClass::default()];
    let mut rows: Vec<(u32, Vec<u64>)> = Vec::new();
    for &(n, l) in &lines[1..] {
        let f = split_csv(l);
        check_width(&f, &header, file, n)?;
        let counts = f[first_minute..]
            .iter()
            .map(|x| x.parse::<u64>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| parse_err(file, n, "per-minute counts must be non-negative integers"))?;
        let key = (
            f[owner].to_string(),
            f[app].to_string(),
            f[func].to_string(),
        );
        let class = RequestClass {
            name: None,
            service: durations.get(&key).cloned(),
            memory_mb: memory.get(&(key.0.clone(), key.1.clone())).copied(),
        };
        classes.push(class);
        rows.push(((classes.len() - 1) as u32, counts));
    }
    // Window on whole minutes, then scale minute-major.
    let selected: Vec<usize> = (0..minutes)
        .filter(|&m| in_window(m as f64 * 60.0, o))
        .collect();
    let cells = selected
        .iter()
        .flat_map(|&m| rows.iter().map(move |(_, c)| c[m]));
    let mut scaled = scale_counts(cells, o.rate_divisor).into_iter();
    let data: Vec<Vec<(u32, u32)>> = selected
        .iter()
        .map(|_| {
            rows.iter()
                .filter_map(|(class, _)| {
                    let n = scaled.next().unwrap_or(0);
                    (n > 0).then(|| (*class, u32::try_from(n).unwrap_or(u32::MAX)))
                })
                .collect()
        })
        .collect();
    Ok(Trace {
        path: String::new(),
        duration_s: data.len() as f64 * 60.0,
        offset_s: selected.first().map_or(0.0, |&m| m as f64 * 60.0),
        data: TraceData::PerMinute(data),
        classes,
        calls: Vec::new(),
    })
}

type FunctionKey = (String, String, String);

fn parse_durations(
    text: &str,
    file: &Path,
) -> Result<HashMap<FunctionKey, ServiceModel>, SimError> {
    let lines = lines(text, file)?;
    let Some((_, head)) = lines.first() else {
        return Err(parse_err(file, 1, "empty file: expected a header row"));
    };
    let header = split_csv(head);
    let owner = column(&header, "HashOwner", file)?;
    let app = column(&header, "HashApp", file)?;
    let func = column(&header, "HashFunction", file)?;
    let pct: Vec<(f64, usize)> = [0.0, 1.0, 25.0, 50.0, 75.0, 99.0, 100.0]
        .iter()
        .map(|&p| {
            Ok((
                p,
                column(&header, &format!("percentile_Average_{p}"), file)?,
            ))
        })
        .collect::<Result<_, SimError>>()?;
    let mut out = HashMap::new();
    for &(n, l) in &lines[1..] {
        let f = split_csv(l);
        check_width(&f, &header, file, n)?;
        let mut points = Vec::with_capacity(pct.len());
        for &(p, i) in &pct {
            let ms = non_negative(
                f[i],
                file,
                n,
                &format!("percentile {p}: expected milliseconds"),
            )?;
            points.push([p, ms]);
        }
        // Azure's percentiles are per-sample averages and may dip; keep them monotone.
        for i in 1..points.len() {
            points[i][1] = points[i][1].max(points[i - 1][1]);
        }
        let model = ServiceModel::empirical(&points).map_err(|m| parse_err(file, n, m))?;
        out.insert(
            (
                f[owner].to_string(),
                f[app].to_string(),
                f[func].to_string(),
            ),
            model,
        );
    }
    Ok(out)
}

/// A finite number ≥ 0 from one CSV field; `what` names it in the error.
fn non_negative(field: &str, file: &Path, line: usize, what: &str) -> Result<f64, SimError> {
    field
        .parse()
        .ok()
        .filter(|v: &f64| v.is_finite() && *v >= 0.0)
        .ok_or_else(|| parse_err(file, line, format!("{what} >= 0, got {field:?}")))
}

/// A CSV row must have as many fields as the header.
fn check_width(fields: &[&str], header: &[&str], file: &Path, line: usize) -> Result<(), SimError> {
    if fields.len() == header.len() {
        Ok(())
    } else {
        Err(parse_err(
            file,
            line,
            format!(
                "expected {} comma-separated fields, got {}",
                header.len(),
                fields.len()
            ),
        ))
    }
}

fn parse_memory(text: &str, file: &Path) -> Result<HashMap<(String, String), u32>, SimError> {
    let lines = lines(text, file)?;
    let Some((_, head)) = lines.first() else {
        return Err(parse_err(file, 1, "empty file: expected a header row"));
    };
    let header = split_csv(head);
    let owner = column(&header, "HashOwner", file)?;
    let app = column(&header, "HashApp", file)?;
    let avg = column(&header, "AverageAllocatedMb", file)?;
    let mut out = HashMap::new();
    for &(n, l) in &lines[1..] {
        let f = split_csv(l);
        check_width(&f, &header, file, n)?;
        let mb = non_negative(f[avg], file, n, "AverageAllocatedMb: expected MB")?;
        // Lambda bills configured memory in [128, 10240] MB.
        let mb = (mb.ceil() as u32).clamp(128, 10_240);
        out.insert((f[owner].to_string(), f[app].to_string()), mb);
    }
    Ok(out)
}

fn parse_azure2021(text: &str, file: &Path, o: &TraceOptions) -> Result<Trace, SimError> {
    let lines = lines(text, file)?;
    let Some((_, head)) = lines.first() else {
        return Err(parse_err(file, 1, "empty file: expected a header row"));
    };
    let header = split_csv(head);
    let app = column(&header, "app", file)?;
    let func = column(&header, "func", file)?;
    let end = column(&header, "end_timestamp", file)?;
    let dur = column(&header, "duration", file)?;
    let mut ids: HashMap<(String, String), u32> = HashMap::new();
    let mut classes = vec![RequestClass::default()];
    let mut rows: Vec<(f64, u64, u32)> = Vec::with_capacity(lines.len());
    for &(n, l) in &lines[1..] {
        let f = split_csv(l);
        check_width(&f, &header, file, n)?;
        let num = |i: usize, what: &str| {
            f[i].parse::<f64>()
                .ok()
                .filter(|v| v.is_finite() && *v >= 0.0)
                .ok_or_else(|| {
                    parse_err(
                        file,
                        n,
                        format!("{what}: expected seconds >= 0, got {:?}", f[i]),
                    )
                })
        };
        let e = num(end, "end_timestamp")?;
        let d = num(dur, "duration")?;
        let next = classes.len() as u32;
        let class = *ids
            .entry((f[app].to_string(), f[func].to_string()))
            .or_insert(next);
        if class == next {
            classes.push(RequestClass::default());
        }
        rows.push(((e - d).max(0.0), secs_to_ns(d).max(1), class));
    }
    // Rows are ordered by end time; arrivals are start times. Stable sort keeps ties in
    // file order.
    rows.sort_by(|a, b| a.0.total_cmp(&b.0));
    // As for `events`: the window start, or the whole second of the first arrival.
    let origin = o.from_s.unwrap_or_else(|| {
        rows.iter()
            .find(|r| in_window(r.0, o))
            .map_or(0.0, |r| r.0.floor())
    });
    let mut copies = copies_of_next(o.rate_divisor);
    let arrivals: Vec<Arrival> = rows
        .into_iter()
        .filter(|r| in_window(r.0, o))
        .flat_map(|(t, service_ns, class)| {
            let a = Arrival {
                at_ns: secs_to_ns(t - origin),
                class,
                zone: 0,
                service_ns,
            };
            std::iter::repeat_n(a, copies())
        })
        .collect();
    Ok(Trace {
        path: String::new(),
        duration_s: arrivals.last().map_or(0.0, |a| a.at_ns as f64 / NS as f64),
        offset_s: origin,
        data: TraceData::Events(arrivals),
        classes,
        calls: Vec::new(),
    })
}

/// The arrivals of a [`Trace`], in time order. See [`Trace::stream`].
pub struct ArrivalStream<'a> {
    trace: &'a Trace,
    rng: ChaCha8Rng,
    /// Second (counts), event index (events) or minute (per-minute).
    unit: usize,
    /// Index within the unit.
    j: u32,
    buf: Vec<Arrival>,
    /// Counts: `NS / n` and `NS % n` for the second's `n` arrivals.
    spacing: (u64, u64),
    /// Counts: `⌊j·NS / n⌋` and `j·NS mod n`, advanced by `spacing` per arrival (no
    /// division per arrival; the same instants as the formula).
    offset: (u64, u64),
}

impl ArrivalStream<'_> {
    /// The next arrival, `None` at the end.
    #[inline]
    pub fn next_arrival(&mut self) -> Option<Arrival> {
        match &self.trace.data {
            TraceData::Counts(c) => loop {
                let &n = c.get(self.unit)?;
                if self.j < n {
                    // at = unit·NS + ⌊j·NS / n⌋, kept incrementally.
                    let n = u64::from(n);
                    if self.j == 0 {
                        self.spacing = (NS / n, NS % n);
                        self.offset = (0, 0);
                    }
                    let at_ns = self.unit as u64 * NS + self.offset.0;
                    self.offset.0 += self.spacing.0;
                    self.offset.1 += self.spacing.1;
                    if self.offset.1 >= n {
                        self.offset.0 += 1;
                        self.offset.1 -= n;
                    }
                    self.j += 1;
                    return Some(Arrival {
                        at_ns,
                        class: 0,
                        zone: 0,
                        service_ns: 0,
                    });
                }
                self.unit += 1;
                self.j = 0;
            },
            TraceData::Events(e) => {
                let a = e.get(self.unit).copied();
                self.unit += 1;
                a
            }
            TraceData::PerMinute(m) => loop {
                if let Some(a) = self.buf.get(self.j as usize) {
                    self.j += 1;
                    return Some(*a);
                }
                let cells = m.get(self.unit)?;
                let base = self.unit as u64 * 60 * NS;
                self.buf.clear();
                for &(class, n) in cells {
                    for _ in 0..n {
                        let at_ns = base + self.rng.random_range(0..60 * NS);
                        self.buf.push(Arrival {
                            at_ns,
                            class,
                            zone: 0,
                            service_ns: 0,
                        });
                    }
                }
                self.buf.sort_by_key(|a| (a.at_ns, a.class));
                self.unit += 1;
                self.j = 0;
            },
        }
    }
}
