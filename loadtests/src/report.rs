//! Report rows and their rendering as a markdown or plain-text table and as JSON.
//!
//! Rows are printed as they complete, so columns have fixed minimum widths
//! instead of being fitted to the widest value; the markdown stays valid even
//! when a value is wider than its column.

use clap::ValueEnum;
use serde_json::{Value, json};

use crate::admin::Shares;
use crate::stats::Stats;

/// Table style for standard output.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Format {
    /// A GitHub-flavoured markdown table, ready to paste into a README.
    Markdown,
    /// Space-aligned columns.
    Plain,
}

/// One report row: an interval of trace seconds, or the whole run.
#[derive(Clone, Debug)]
pub(crate) struct Row {
    /// `None` for an interval row, `Some("TOTAL")` for the summary row.
    pub label: Option<&'static str>,
    /// First trace second covered (absolute, as in the trace file).
    pub start: u64,
    /// One past the last trace second covered.
    pub end: u64,
    /// Counters and latencies.
    pub stats: Stats,
    /// Routing shares from the admin endpoint, if available.
    pub shares: Option<Shares>,
    /// VMs ready at the end of the row's time span, if available.
    pub ready_vms: Option<u64>,
    /// With `--async-share`: asynchronous calls queued and released during the row's
    /// span and waiting at its end (ProFaaStinate delay queue), from the admin endpoint.
    pub async_calls: Option<(u64, u64, u64)>,
}

/// Column headers and minimum widths.
const COLUMNS: [(&str, usize); 13] = [
    ("interval (s)", 13),
    ("requests", 8),
    ("errors", 6),
    ("error kinds", 18),
    ("p50 ms", 8),
    ("p95 ms", 8),
    ("p99 ms", 8),
    ("to VMs", 6),
    ("to functions", 12),
    ("VMs ready", 9),
    ("async queued", 12),
    ("released", 8),
    ("waiting", 7),
];

/// Columns without the asynchronous-call ones.
const SYNC_COLUMNS: usize = 10;

fn fmt_ms(ms: Option<f64>) -> String {
    match ms {
        None => "-".to_owned(),
        Some(v) if v < 10.0 => format!("{v:.2}"),
        Some(v) => format!("{v:.1}"),
    }
}

fn fmt_share(share: Option<f64>) -> String {
    share.map_or_else(|| "-".to_owned(), |s| format!("{:.1}%", s * 100.0))
}

impl Row {
    /// The row's cells, in [`COLUMNS`] order.
    pub(crate) fn cells(&self) -> [String; 10] {
        let interval = match self.label {
            Some(label) => label.to_owned(),
            None => format!("{}-{}", self.start, self.end),
        };
        let kinds: Vec<String> = self
            .stats
            .error_kinds()
            .iter()
            .filter(|(_, n)| *n > 0)
            .map(|(name, n)| format!("{name} {n}"))
            .collect();
        [
            interval,
            self.stats.requests.to_string(),
            self.stats.errors().to_string(),
            if kinds.is_empty() {
                "-".to_owned()
            } else {
                kinds.join(", ")
            },
            fmt_ms(self.stats.quantile_ms(0.50)),
            fmt_ms(self.stats.quantile_ms(0.95)),
            fmt_ms(self.stats.quantile_ms(0.99)),
            fmt_share(self.shares.map(|s| s.vm)),
            fmt_share(self.shares.map(|s| s.function)),
            self.ready_vms
                .map_or_else(|| "-".to_owned(), |n| n.to_string()),
        ]
    }

    /// The row as a JSON object. Missing values are `null`; shares are fractions.
    pub(crate) fn to_json(&self) -> Value {
        let kinds: serde_json::Map<String, Value> = self
            .stats
            .error_kinds()
            .iter()
            .map(|(name, n)| ((*name).to_owned(), json!(n)))
            .collect();
        json!({
            "start": self.start,
            "end": self.end,
            "requests": self.stats.requests,
            "errors": self.stats.errors(),
            "error_kinds": kinds,
            "p50_ms": self.stats.quantile_ms(0.50),
            "p95_ms": self.stats.quantile_ms(0.95),
            "p99_ms": self.stats.quantile_ms(0.99),
            "vm_share": self.shares.map(|s| s.vm),
            "function_share": self.shares.map(|s| s.function),
            "ready_vms": self.ready_vms,
            "async_queued": self.async_calls.map(|a| a.0),
            "async_released": self.async_calls.map(|a| a.1),
            "async_waiting": self.async_calls.map(|a| a.2),
        })
    }
}

fn render(cells: &[String], format: Format) -> String {
    let padded = cells
        .iter()
        .zip(COLUMNS)
        .enumerate()
        .map(|(i, (cell, (_, width)))| {
            if i == 0 || i == 3 {
                format!("{cell:<width$}")
            } else {
                format!("{cell:>width$}")
            }
        });
    let padded: Vec<String> = padded.collect();
    match format {
        Format::Markdown => format!("| {} |", padded.join(" | ")),
        Format::Plain => padded.join("  ").trim_end().to_owned(),
    }
}

/// The header line(s) of the table.
pub(crate) fn header(format: Format) -> String {
    header_of(&COLUMNS[..SYNC_COLUMNS], format)
}

/// The header with the asynchronous-call columns (`--async-share`).
pub(crate) fn header_async(format: Format) -> String {
    header_of(&COLUMNS, format)
}

fn header_of(columns: &[(&str, usize)], format: Format) -> String {
    let names: Vec<String> = columns.iter().map(|(name, _)| (*name).to_owned()).collect();
    let rule: Vec<String> = columns
        .iter()
        .enumerate()
        .map(|(i, (_, width))| {
            if format == Format::Plain {
                "-".repeat(*width)
            } else if i == 0 || i == 3 {
                format!(":{}", "-".repeat(width - 1))
            } else {
                format!("{}:", "-".repeat(width - 1))
            }
        })
        .collect();
    format!("{}\n{}", render(&names, format), render(&rule, format))
}

/// One row of the table.
pub(crate) fn line(row: &Row, format: Format) -> String {
    let mut cells = row.cells().to_vec();
    if let Some((queued, released, waiting)) = row.async_calls {
        cells.extend([
            queued.to_string(),
            released.to_string(),
            waiting.to_string(),
        ]);
    }
    render(&cells, format)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::Outcome;
    use std::time::Duration;

    fn sample() -> Row {
        let mut stats = Stats::default();
        for ms in [10, 20, 30] {
            stats.record(Outcome::Response {
                status: 200,
                latency: Duration::from_millis(ms),
            });
        }
        stats.record(Outcome::Response {
            status: 503,
            latency: Duration::from_millis(5),
        });
        stats.record(Outcome::Timeout);
        Row {
            label: None,
            start: 60,
            end: 120,
            stats,
            shares: Some(Shares {
                vm: 0.75,
                function: 0.25,
            }),
            ready_vms: Some(3),
            async_calls: None,
        }
    }

    #[test]
    fn markdown_row_has_all_cells_aligned_with_header() {
        let head = header(Format::Markdown);
        let row = line(&sample(), Format::Markdown);
        let lines: Vec<&str> = head.lines().chain([row.as_str()]).collect();
        assert!(
            lines.iter().all(|l| l.len() == lines[0].len()),
            "{lines:#?}"
        );
        let cells: Vec<&str> = row.trim_matches('|').split('|').map(str::trim).collect();
        assert_eq!(
            cells,
            [
                "60-120",
                "5",
                "2",
                "5xx 1, timeout 1",
                "10.0",
                "30.0",
                "30.0",
                "75.0%",
                "25.0%",
                "3"
            ]
        );
    }

    #[test]
    fn missing_admin_data_prints_dashes() {
        let row = Row {
            label: Some("TOTAL"),
            shares: None,
            ready_vms: None,
            async_calls: None,
            ..sample()
        };
        let cells = row.cells();
        assert_eq!(cells[0], "TOTAL");
        assert_eq!(&cells[7..], ["-", "-", "-"]);
    }

    #[test]
    fn plain_format_has_no_pipes() {
        let text = format!(
            "{}\n{}",
            header(Format::Plain),
            line(&sample(), Format::Plain)
        );
        assert!(!text.contains('|'));
        assert!(text.lines().next().unwrap().starts_with("interval (s)"));
    }

    #[test]
    fn json_row_uses_nulls_and_fractions() {
        let v = Row {
            shares: None,
            ..sample()
        }
        .to_json();
        assert_eq!(v["requests"], 5);
        assert_eq!(v["errors"], 2);
        assert_eq!(v["error_kinds"]["timeout"], 1);
        assert_eq!(v["vm_share"], Value::Null);
        assert_eq!(v["ready_vms"], 3);
        assert!(v["p50_ms"].as_f64().unwrap() > 0.0);
    }
}
