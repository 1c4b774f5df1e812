//! Real access logs as traces: `spillway sim --format spillway|nginx|alb|apigw`.
//!
//! Each logged request becomes one arrival at the time the request arrived, with a
//! request class named by its route key and, where the log has it, its duration as the
//! call's processing time (otherwise the class's service-time model is sampled):
//!
//! | format | arrival | route key | processing time |
//! |---|---|---|---|
//! | `spillway` (the gateway's own access log, text or JSON lines, mixed with its other log lines) | the line's timestamp − `total_ms` (the line is written when the response ends) | `routes:` / first path segment, as the gateway | `total_ms` |
//! | `nginx` (`combined`, optionally followed by `$request_time` as a bare number or `rt=`/`request_time=`) | `$time_local` − `$request_time` | `routes:` / first path segment | `$request_time` |
//! | `alb` (AWS ALB access logs, the documented space-separated format) | `request_creation_time` | `routes:` / first path segment | `target_processing_time` (absent when `-1`: not dispatched) |
//! | `apigw` (API Gateway JSON access logs, one object a line) | `requestTimeEpoch` (ms), else `requestTime` | `routeKey` (HTTP APIs, `GET /items/{id}`), else method + `resourcePath` (REST), else `routes:` / first segment of `path` | `integrationLatency`, else `responseLatency` (ms) |
//!
//! Timestamps with whole seconds only (nginx's `$time_local`, API Gateway's
//! `requestTime`) are spread evenly within their second in file order — `c` consecutive
//! lines stamped second `s` get `s + j/c`, as the `counts` format does — so that one
//! second's requests do not arrive at one instant. Requests are then ordered by arrival
//! (logs are written in completion order).
//!
//! Files whose first bytes are the gzip magic (`.gz`, ALB's delivery) are decompressed
//! (flate2); a directory is read as all its files, in name order (ALB writes one file per
//! five minutes and node). Blank lines are skipped; so are lines that are not requests
//! (the gateway's other log lines, nginx's `"-"` request lines of connections that sent
//! none, ALB's `-` method of malformed requests), counted as *ignored*. Any other line
//! that does not parse is an error naming `file:line`, or, with `--skip-bad-lines`,
//! skipped and counted in the report ([`LogSummary`]).
//!
//! The parsers are small hand-written field splitters (quoted strings, `[...]` dates):
//! none of these formats has a maintained Rust parser; dates are chrono's.

use std::collections::HashMap;
use std::io::Read as _;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::error::SimError;
use super::trace_model::{Arrival, RequestClass, Trace, TraceData, TraceFormat, TraceOptions};
use crate::policy::routes::{RouteDef, RouteKeys};

const NS: u64 = 1_000_000_000;

/// The longest logged duration read, in seconds (one year, as the configuration's
/// `*_seconds` options): a larger one is a bad line, not a request that runs for ages.
const MAX_DURATION_S: f64 = 31_536_000.0;

/// `requestTimeEpoch` values from this one on (Unix ms of 10000-01-01) are bad lines: the
/// other formats' times cannot be later either (their calendar ends with the year 9999).
const MAX_EPOCH_MS: u64 = 253_402_300_800_000;

/// Whether `v_s` is a logged duration this reader takes: finite, from 0 to one year.
fn plausible_duration(v_s: f64) -> bool {
    v_s.is_finite() && (0.0..=MAX_DURATION_S).contains(&v_s)
}

/// The access-log formats (`--format`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    /// spillway's own access log (target `spillway::access`), text or JSON lines.
    Spillway,
    /// nginx `combined`, optionally with `$request_time`.
    Nginx,
    /// AWS Application Load Balancer access logs.
    Alb,
    /// API Gateway JSON access logs.
    Apigw,
}

impl LogFormat {
    /// The log format of a trace format, `None` for the non-log formats.
    pub fn of(format: TraceFormat) -> Option<LogFormat> {
        match format {
            TraceFormat::Spillway => Some(LogFormat::Spillway),
            TraceFormat::Nginx => Some(LogFormat::Nginx),
            TraceFormat::Alb => Some(LogFormat::Alb),
            TraceFormat::Apigw => Some(LogFormat::Apigw),
            TraceFormat::Counts
            | TraceFormat::Events
            | TraceFormat::Azure2019
            | TraceFormat::Azure2021 => None,
        }
    }
}

/// How to turn log lines into arrivals.
#[derive(Clone, Debug, Default)]
pub struct LogOptions {
    /// Skip lines that do not parse (counted in [`LogSummary::bad_lines`]) instead of
    /// failing at the first.
    pub skip_bad_lines: bool,
    /// The configured routes (`routes:`): a request's route key is the first matching
    /// one, else its path's first segment, as in the gateway.
    pub routes: Vec<RouteDef>,
    /// At most this many route keys (`queue.max_route_keys`); later paths fall into
    /// `other`. 0: the gateway's default bound.
    pub max_route_keys: usize,
}

/// What reading a log found: in the text report's header and the JSON report's `log`.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct LogSummary {
    /// The log format (`spillway`, `nginx`, `alb`, `apigw`).
    pub format: String,
    /// Lines read (blank lines included), over every file.
    pub lines: u64,
    /// Requests found (before `--from/--to` and `--rate-divisor`).
    pub requests: u64,
    /// Requests with a logged duration (used as their processing time).
    pub with_duration: u64,
    /// Lines that are not requests (other log lines, connections without a request).
    pub ignored_lines: u64,
    /// Lines that did not parse, skipped (`--skip-bad-lines`; 0 without it).
    pub bad_lines: u64,
    /// The first bad line's error, `file:line: message`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_bad_line: Option<String>,
    /// Route keys found (request classes), in order of first appearance.
    pub route_keys: Vec<String>,
}

/// One request read from a log: Unix time of arrival, ns; whether the stamp had whole
/// seconds only; its class; its duration, ns.
struct Entry {
    at_ns: i128,
    whole_second: bool,
    /// Subtracted from the stamp after the spread (the logged duration, for logs stamped
    /// at the response).
    back_ns: i128,
    class: u32,
    duration_ns: Option<u64>,
    /// Where the request was logged: an index into the inputs and the 1-based line.
    file: usize,
    line: usize,
}

/// What one line is: a request stamped `at_ns` (Unix ns) that arrived `back_ns` before
/// its stamp, or a line that is not a request.
enum Line {
    Request {
        at_ns: i128,
        back_ns: i128,
        whole_second: bool,
        key: Key,
        duration_s: Option<f64>,
    },
    Ignored,
}

/// How a line names its route.
enum Key {
    /// Method and path, resolved through the route table.
    Path(String, String),
    /// A name as logged (API Gateway's route key or resource path).
    Named(String),
}

/// Read a log file (or a directory of them) in `format` and make a trace of it.
///
/// # Errors
/// [`SimError::Io`] if a file cannot be read or decompressed, [`SimError::Parse`] naming
/// the file and line of the first bad line (unless `log.skip_bad_lines`),
/// [`SimError::Invalid`] for bad options.
pub fn load(
    path: &Path,
    format: LogFormat,
    opts: &TraceOptions,
    log: &LogOptions,
) -> Result<(Trace, LogSummary), SimError> {
    let files = if path.is_dir() {
        let mut files: Vec<PathBuf> = std::fs::read_dir(path)
            .and_then(|d| d.map(|e| e.map(|e| e.path())).collect())
            .map_err(|source| SimError::Io {
                path: path.to_owned(),
                source,
            })?;
        files.retain(|p| p.is_file());
        files.sort();
        files
    } else {
        vec![path.to_owned()]
    };
    let mut texts = Vec::with_capacity(files.len());
    for f in &files {
        texts.push((f.clone(), read_maybe_gzip(f)?));
    }
    let inputs: Vec<(&Path, &str)> = texts
        .iter()
        .map(|(p, t)| (p.as_path(), t.as_str()))
        .collect();
    let (mut trace, summary) = parse(&inputs, format, opts, log)?;
    trace.path = path.display().to_string();
    Ok((trace, summary))
}

/// The bytes of `path`, gunzipped when they start with the gzip magic, as text (bytes
/// that are not UTF-8 become U+FFFD: only the ASCII fields are read).
fn read_maybe_gzip(path: &Path) -> Result<String, SimError> {
    let io = |source| SimError::Io {
        path: path.to_owned(),
        source,
    };
    let bytes = std::fs::read(path).map_err(io)?;
    let bytes = if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        flate2::read::MultiGzDecoder::new(bytes.as_slice())
            .read_to_end(&mut out)
            .map_err(io)?;
        out
    } else {
        bytes
    };
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// Parse log texts (each with the file name used in errors), in order, into one trace.
///
/// # Errors
/// As [`load`].
pub fn parse(
    inputs: &[(&Path, &str)],
    format: LogFormat,
    opts: &TraceOptions,
    log: &LogOptions,
) -> Result<(Trace, LogSummary), SimError> {
    if !(opts.rate_divisor.is_finite() && opts.rate_divisor > 0.0) {
        return Err(SimError::Invalid {
            field: "--rate-divisor".into(),
            message: format!("must be a positive number, got {}", opts.rate_divisor),
        });
    }
    let max_keys = if log.max_route_keys == 0 {
        crate::config::Config::default().max_route_keys()
    } else {
        log.max_route_keys
    };
    let mut keys = RouteKeys::new(log.routes.clone(), max_keys);
    let mut classes = vec![RequestClass::default()];
    let mut by_name: HashMap<String, u32> = HashMap::new();
    let mut summary = LogSummary {
        format: match format {
            LogFormat::Spillway => "spillway",
            LogFormat::Nginx => "nginx",
            LogFormat::Alb => "alb",
            LogFormat::Apigw => "apigw",
        }
        .into(),
        ..LogSummary::default()
    };
    let mut entries: Vec<Entry> = Vec::new();
    for (file_index, &(file, text)) in inputs.iter().enumerate() {
        for (i, raw) in text.lines().enumerate() {
            summary.lines += 1;
            let line = raw.trim();
            if line.is_empty() {
                continue;
            }
            let parsed = match format {
                LogFormat::Spillway => spillway_line(line),
                LogFormat::Nginx => nginx_line(line),
                LogFormat::Alb => alb_line(line),
                LogFormat::Apigw => apigw_line(line),
            };
            match parsed {
                Ok(Line::Ignored) => summary.ignored_lines += 1,
                Ok(Line::Request {
                    at_ns,
                    back_ns,
                    whole_second,
                    key,
                    duration_s,
                }) => {
                    let name = match key {
                        Key::Path(method, path) => {
                            let id = keys.resolve(&method, &path);
                            keys.name(id).to_string()
                        }
                        Key::Named(n) => n,
                    };
                    let next = classes.len() as u32;
                    let class = *by_name.entry(name.clone()).or_insert_with(|| {
                        classes.push(RequestClass {
                            name: Some(name.clone()),
                            ..RequestClass::default()
                        });
                        summary.route_keys.push(name);
                        next
                    });
                    let duration_ns = duration_s.map(|d| ((d * 1e9).round() as u64).max(1));
                    summary.requests += 1;
                    summary.with_duration += u64::from(duration_ns.is_some());
                    entries.push(Entry {
                        at_ns,
                        whole_second,
                        back_ns,
                        class,
                        duration_ns,
                        file: file_index,
                        line: i + 1,
                    });
                }
                Err(message) => {
                    let err = SimError::Parse {
                        file: file.display().to_string(),
                        line: i + 1,
                        message,
                    };
                    if !log.skip_bad_lines {
                        return Err(err);
                    }
                    summary.bad_lines += 1;
                    summary
                        .first_bad_line
                        .get_or_insert_with(|| err.to_string());
                }
            }
        }
    }
    spread_whole_seconds(&mut entries);
    for e in &mut entries {
        e.at_ns -= e.back_ns;
    }
    // Stable: requests arriving at the same instant keep their file order.
    entries.sort_by_key(|e| e.at_ns);
    if let Some(e) = entries.first()
        && e.at_ns < 0
    {
        return Err(SimError::Parse {
            file: inputs[e.file].0.display().to_string(),
            line: e.line,
            message: "the request arrives before 1970-01-01 (Unix time 0): its logged time \
                      minus its duration"
                .into(),
        });
    }
    let secs = |ns: i128| ns as f64 / NS as f64;
    let in_window = |t: f64| opts.from_s.is_none_or(|f| t >= f) && opts.to_s.is_none_or(|e| t < e);
    let origin_ns: i128 = match opts.from_s {
        Some(f) => (f * NS as f64).round() as i128,
        None => entries
            .iter()
            .find(|e| in_window(secs(e.at_ns)))
            .map_or(0, |e| e.at_ns - e.at_ns % i128::from(NS)),
    };
    let mut k = 0u64;
    let d = opts.rate_divisor;
    let mut arrivals = Vec::with_capacity(entries.len());
    for e in entries.iter().filter(|e| in_window(secs(e.at_ns))) {
        // The engine's clock is u64 nanoseconds from the origin: a request more than
        // ~584 years after it is a bad line (a stray timestamp), never one at time 0.
        let Ok(at_ns) = u64::try_from(e.at_ns - origin_ns) else {
            let err = SimError::Parse {
                file: inputs[e.file].0.display().to_string(),
                line: e.line,
                message: format!(
                    "arrives {:.0} s after the trace's first second (Unix {:.0}); a trace \
                     spans at most 2^64 ns (about 584 years)",
                    secs(e.at_ns - origin_ns),
                    secs(origin_ns)
                ),
            };
            if !log.skip_bad_lines {
                return Err(err);
            }
            summary.requests -= 1;
            summary.with_duration -= u64::from(e.duration_ns.is_some());
            summary.bad_lines += 1;
            summary
                .first_bad_line
                .get_or_insert_with(|| err.to_string());
            continue;
        };
        k += 1;
        let copies = ((k as f64 / d).round() - ((k - 1) as f64 / d).round()) as usize;
        let a = Arrival {
            at_ns,
            class: e.class,
            zone: 0,
            service_ns: e.duration_ns.unwrap_or(0),
        };
        arrivals.extend(std::iter::repeat_n(a, copies));
    }
    let trace = Trace {
        path: inputs
            .first()
            .map(|(p, _)| p.display().to_string())
            .unwrap_or_default(),
        duration_s: arrivals.last().map_or(0.0, |a| a.at_ns as f64 / NS as f64),
        offset_s: secs(origin_ns),
        data: TraceData::Events(arrivals),
        classes,
        calls: Vec::new(),
    };
    Ok((trace, summary))
}

/// `c` consecutive entries stamped with the same whole second `s` get `s + j/c`.
fn spread_whole_seconds(entries: &mut [Entry]) {
    let mut i = 0;
    while i < entries.len() {
        if !entries[i].whole_second {
            i += 1;
            continue;
        }
        let at = entries[i].at_ns;
        let run = entries[i..]
            .iter()
            .take_while(|e| e.whole_second && e.at_ns == at)
            .count();
        for (j, e) in entries[i..i + run].iter_mut().enumerate() {
            e.at_ns += j as i128 * i128::from(NS) / run as i128;
        }
        i += run;
    }
}

/// Unix nanoseconds of a chrono time.
fn unix_ns(t: chrono::DateTime<chrono::FixedOffset>) -> i128 {
    i128::from(t.timestamp()) * i128::from(NS) + i128::from(t.timestamp_subsec_nanos())
}

fn rfc3339(s: &str, what: &str) -> Result<i128, String> {
    chrono::DateTime::parse_from_rfc3339(s)
        .map(unix_ns)
        .map_err(|e| format!("{what}: expected an RFC 3339 time, got {s:?} ({e})"))
}

/// The Common Log Format's time, `10/Oct/2000:13:55:36 -0700`.
fn clf_time(s: &str, what: &str) -> Result<i128, String> {
    chrono::DateTime::parse_from_str(s, "%d/%b/%Y:%H:%M:%S %z")
        .map(unix_ns)
        .map_err(|e| {
            format!("{what}: expected a time like 10/Oct/2000:13:55:36 -0700, got {s:?} ({e})")
        })
}

fn seconds_to_ns(s: f64) -> i128 {
    (s * NS as f64).round() as i128
}

/// A duration in seconds from a decimal string (`-` or empty: none).
fn duration(s: &str, unit_s: f64, what: &str) -> Result<Option<f64>, String> {
    if s == "-" || s.is_empty() {
        return Ok(None);
    }
    s.parse::<f64>()
        .ok()
        .map(|v| v * unit_s)
        .filter(|&v| plausible_duration(v))
        .map(Some)
        .ok_or_else(|| {
            format!(
                "{what}: expected a duration from 0 to {MAX_DURATION_S} s (one year), got {s:?}"
            )
        })
}

/// The path of a request target: absolute-form URLs lose scheme and authority, every
/// target loses its query string.
fn path_of(target: &str) -> String {
    let rest = match target.find("://") {
        Some(i) => {
            let after = &target[i + 3..];
            after.find('/').map_or("/", |j| &after[j..])
        }
        None => target,
    };
    let path = rest.split(['?', '#']).next().unwrap_or("/");
    if path.is_empty() {
        "/".into()
    } else {
        path.into()
    }
}

/// Remove ANSI colour sequences (`ESC [ … m`), which the gateway's text log has on a
/// terminal.
fn strip_ansi(line: &str) -> std::borrow::Cow<'_, str> {
    if !line.contains('\u{1b}') {
        return line.into();
    }
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out.into()
}

/// spillway's access log, text (`<time>  INFO spillway::access: request k=v …`) or JSON
/// (`{"timestamp":…,"target":"spillway::access",…}`); other log lines are ignored.
fn spillway_line(line: &str) -> Result<Line, String> {
    if line.starts_with('{') {
        let v: serde_json::Value =
            serde_json::from_str(line).map_err(|e| format!("not a JSON log line: {e}"))?;
        if v.get("target").and_then(|t| t.as_str()) != Some("spillway::access") {
            return Ok(Line::Ignored);
        }
        // `flatten_event(true)` puts the fields at the top; without it they sit in
        // `fields`.
        let fields = v.get("fields").filter(|f| f.is_object()).unwrap_or(&v);
        let text = |name: &str| -> Result<String, String> {
            fields
                .get(name)
                .and_then(|x| x.as_str())
                .map(str::to_owned)
                .ok_or_else(|| format!("access log line without a {name:?} string"))
        };
        let ts = v
            .get("timestamp")
            .and_then(|t| t.as_str())
            .ok_or("access log line without a \"timestamp\"")?;
        let end = rfc3339(ts, "timestamp")?;
        let total_ms = fields
            .get("total_ms")
            .and_then(serde_json::Value::as_f64)
            .filter(|v| plausible_duration(v / 1e3))
            .ok_or("access log line without a number total_ms from 0 to one year")?;
        return Ok(Line::Request {
            at_ns: end,
            back_ns: seconds_to_ns(total_ms / 1e3),
            whole_second: false,
            key: Key::Path(text("method")?, text("path")?),
            duration_s: Some(total_ms / 1e3),
        });
    }
    let line = strip_ansi(line);
    let Some((head, rest)) = line.split_once("spillway::access:") else {
        // Another log line of the gateway (it starts with its time); anything else is
        // not a log line at all.
        let first = line.split_whitespace().next().unwrap_or("");
        return match chrono::DateTime::parse_from_rfc3339(first) {
            Ok(_) => Ok(Line::Ignored),
            Err(_) => Err(format!(
                "not a spillway log line (expected `<RFC 3339 time> LEVEL target: …`), got {:?}",
                truncate(&line)
            )),
        };
    };
    let ts = head.split_whitespace().next().unwrap_or("");
    let end = rfc3339(ts, "time")?;
    let mut method = None;
    let mut path = None;
    let mut total_ms = None;
    for kv in rest.split_whitespace() {
        match kv.split_once('=') {
            Some(("method", m)) => method = Some(m.to_string()),
            Some(("path", p)) => path = Some(p.to_string()),
            Some(("total_ms", t)) => {
                total_ms = Some(
                    t.parse::<f64>()
                        .ok()
                        .filter(|v| plausible_duration(v / 1e3))
                        .ok_or_else(|| {
                            format!("total_ms: expected milliseconds from 0 to one year, got {t:?}")
                        })?,
                );
            }
            _ => {}
        }
    }
    let (Some(method), Some(path), Some(total_ms)) = (method, path, total_ms) else {
        return Err("access log line without method=, path= and total_ms=".into());
    };
    Ok(Line::Request {
        at_ns: end,
        back_ns: seconds_to_ns(total_ms / 1e3),
        whole_second: false,
        key: Key::Path(method, path),
        duration_s: Some(total_ms / 1e3),
    })
}

fn truncate(s: &str) -> String {
    let mut out: String = s.chars().take(80).collect();
    if out.len() < s.len() {
        out.push('…');
    }
    out
}

/// Split a log line into fields: runs of non-space characters, `"…"` strings (with `\`
/// escapes kept verbatim, quotes removed) and `[…]` brackets (brackets removed).
fn fields(line: &str) -> Result<Vec<&str>, String> {
    let mut out = Vec::new();
    let b = line.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b' ' | b'\t' => i += 1,
            b'"' => {
                let start = i + 1;
                let mut j = start;
                while j < b.len() && b[j] != b'"' {
                    j += if b[j] == b'\\' { 2 } else { 1 };
                }
                if j >= b.len() {
                    return Err(format!("unterminated quoted field at column {}", i + 1));
                }
                out.push(&line[start..j]);
                i = j + 1;
            }
            b'[' => {
                let start = i + 1;
                let j = line[start..]
                    .find(']')
                    .map(|k| start + k)
                    .ok_or_else(|| format!("unterminated [ at column {}", i + 1))?;
                out.push(&line[start..j]);
                i = j + 1;
            }
            _ => {
                let start = i;
                while i < b.len() && b[i] != b' ' && b[i] != b'\t' {
                    i += 1;
                }
                out.push(&line[start..i]);
            }
        }
    }
    Ok(out)
}

/// `METHOD target PROTOCOL` → method and path; `None` for `-` (no request).
fn request_line(r: &str) -> Result<Option<(String, String)>, String> {
    let mut parts = r.split(' ');
    let method = parts.next().unwrap_or("");
    if method == "-" || method.is_empty() {
        return Ok(None);
    }
    let target = parts
        .next()
        .filter(|t| !t.is_empty())
        .ok_or_else(|| format!("request {r:?}: expected `METHOD TARGET PROTOCOL`"))?;
    if !method.bytes().all(|c| c.is_ascii_alphabetic()) {
        return Err(format!("request {r:?}: {method:?} is not an HTTP method"));
    }
    Ok(Some((method.to_ascii_uppercase(), path_of(target))))
}

/// nginx `combined`: `$remote_addr - $remote_user [$time_local] "$request" $status
/// $body_bytes_sent "$http_referer" "$http_user_agent"`, then optionally
/// `$request_time` (a bare number, or `rt=`/`request_time=`).
fn nginx_line(line: &str) -> Result<Line, String> {
    const SHAPE: &str = "expected nginx `combined`: `addr - user [time] \"request\" status bytes \"referer\" \"user agent\"`";
    let f = fields(line)?;
    if f.len() < 9 || !f[5].bytes().all(|c| c.is_ascii_digit()) {
        return Err(format!("{SHAPE}, got {:?}", truncate(line)));
    }
    let end = clf_time(f[3], "$time_local")?;
    let Some((method, path)) = request_line(f[4])? else {
        return Ok(Line::Ignored);
    };
    let mut duration_s = None;
    for extra in &f[9..] {
        let value = extra
            .strip_prefix("rt=")
            .or_else(|| extra.strip_prefix("request_time="))
            .unwrap_or(extra);
        if value.parse::<f64>().is_ok() {
            duration_s = duration(value, 1.0, "$request_time")?;
            break;
        }
    }
    Ok(Line::Request {
        at_ns: end,
        back_ns: duration_s.map_or(0, seconds_to_ns),
        whole_second: true,
        key: Key::Path(method, path),
        duration_s,
    })
}

/// ALB: `type time elb client:port target:port request_processing_time
/// target_processing_time response_processing_time elb_status_code target_status_code
/// received_bytes sent_bytes "request" "user_agent" ssl_cipher ssl_protocol
/// target_group_arn "trace_id" "domain_name" "chosen_cert_arn" matched_rule_priority
/// request_creation_time …` (later fields are not read).
fn alb_line(line: &str) -> Result<Line, String> {
    let f = fields(line)?;
    if f.len() < 22 {
        return Err(format!(
            "expected an ALB access log entry (at least 22 fields, `type time elb …  \
             request_creation_time …`), got {} fields",
            f.len()
        ));
    }
    if !matches!(f[0], "http" | "https" | "h2" | "grpcs" | "ws" | "wss") {
        return Err(format!(
            "type: expected http, https, h2, grpcs, ws or wss, got {:?}",
            f[0]
        ));
    }
    let at_ns = rfc3339(f[21], "request_creation_time")?;
    let target = f[6];
    let duration_s = if target == "-1" {
        None
    } else {
        duration(target, 1.0, "target_processing_time")?
    };
    let Some((method, path)) = request_line(f[12])? else {
        return Ok(Line::Ignored);
    };
    Ok(Line::Request {
        at_ns,
        back_ns: 0,
        whole_second: false,
        key: Key::Path(method, path),
        duration_s,
    })
}

/// API Gateway JSON access logs: one object a line (anything before its first `{`, such
/// as a CloudWatch export's time and stream, is skipped).
fn apigw_line(line: &str) -> Result<Line, String> {
    let start = line
        .find('{')
        .ok_or_else(|| format!("expected a JSON object, got {:?}", truncate(line)))?;
    let v: serde_json::Value =
        serde_json::from_str(&line[start..]).map_err(|e| format!("not a JSON object: {e}"))?;
    let get = |name: &str| -> Option<String> {
        match v.get(name)? {
            serde_json::Value::String(s) if s != "-" && !s.is_empty() => Some(s.clone()),
            serde_json::Value::Number(n) => Some(n.to_string()),
            _ => None,
        }
    };
    let (at_ns, whole_second) = match (get("requestTimeEpoch"), get("requestTime")) {
        (Some(ms), _) => {
            // Whole milliseconds exactly; a fraction through f64.
            let bad = || {
                format!(
                    "requestTimeEpoch: expected Unix milliseconds before the year 10000 \
                     (below {MAX_EPOCH_MS}), got {ms:?}"
                )
            };
            let ns = match ms.parse::<u64>() {
                Ok(whole) if whole < MAX_EPOCH_MS => i128::from(whole) * 1_000_000,
                Ok(_) => return Err(bad()),
                Err(_) => ms
                    .parse::<f64>()
                    .ok()
                    .filter(|v| v.is_finite() && (0.0..MAX_EPOCH_MS as f64).contains(v))
                    .map(|v| (v * 1e6).round() as i128)
                    .ok_or_else(bad)?,
            };
            (ns, false)
        }
        (None, Some(t)) => (clf_time(&t, "requestTime")?, true),
        (None, None) => return Err("no requestTimeEpoch or requestTime field".into()),
    };
    let method = get("httpMethod").unwrap_or_else(|| "GET".into());
    let key = match (get("routeKey"), get("resourcePath"), get("path")) {
        (Some(rk), _, _) if rk != "$default" => Key::Named(rk),
        (_, Some(resource), _) => Key::Named(format!("{} {resource}", method.to_ascii_uppercase())),
        (_, _, Some(path)) => Key::Path(method.to_ascii_uppercase(), path_of(&path)),
        _ => Key::Path(method.to_ascii_uppercase(), "/".into()),
    };
    let latency = match get("integrationLatency") {
        Some(l) => Some(l),
        None => get("responseLatency"),
    };
    let duration_s = match latency {
        Some(l) => duration(&l, 1e-3, "integrationLatency")?,
        None => None,
    };
    Ok(Line::Request {
        at_ns,
        back_ns: 0,
        whole_second,
        key,
        duration_s,
    })
}
