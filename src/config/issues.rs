//! The checks every section uses: [`Issues`] (semantic problems with their field paths,
//! and the checks shared by the sections), [`ConfigIssue`] and [`ConfigError`]. A leaf:
//! it imports no section.

use std::fmt;
use std::path::PathBuf;

use super::yaml::Loc;

/// One problem in a configuration (a type error or a semantic one), located by its
/// field path and, when the file has the key or one of its parents, its line and column.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigIssue {
    /// Dotted field path, e.g. `vm_pool.command` or `gateway.trusted_proxies[2]`.
    pub path: String,
    /// What is wrong and what is expected.
    pub message: String,
    /// Where in the file: the value, or the nearest key above it when the value is absent
    /// (a missing required key points at its section). `None` for the embedded defaults
    /// and for keys whose whole section is absent.
    pub location: Option<Loc>,
}

impl ConfigIssue {
    /// A problem at `path` (location filled in when the file is known).
    pub fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            message: message.into(),
            location: None,
        }
    }
}

impl fmt::Display for ConfigIssue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            write!(f, "{}", self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

/// `file:line:column: path: message` (or `file: path: message` without a location).
fn issue_line(file: &str, issue: &ConfigIssue) -> String {
    match issue.location {
        Some(l) => format!("{file}:{}:{}: {issue}", l.line, l.column),
        None => format!("{file}: {issue}"),
    }
}

fn invalid_text(file: &str, issues: &[ConfigIssue]) -> String {
    match issues {
        [one] => issue_line(file, one),
        _ => format!(
            "{file}: {} problems:\n{}",
            issues.len(),
            issues
                .iter()
                .map(|i| format!("  {}", issue_line(file, i)))
                .collect::<Vec<_>>()
                .join("\n")
        ),
    }
}

/// Why a configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{path}: cannot read: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not YAML: the first syntax error, at its place.
    #[error("{file}:{line}:{column}: {message}")]
    Parse {
        /// The file (or `<embedded quickstart>`).
        file: String,
        /// 1-based line.
        line: u64,
        /// 1-based column.
        column: u64,
        /// What is wrong.
        message: String,
    },
    /// Type or semantic problems: every one of them, in file order, each with its field
    /// path and place (`file:line:column: path: message`).
    #[error("{}", invalid_text(file, issues))]
    Invalid {
        /// The file.
        file: String,
        /// All problems found, in file order (unlocated ones last).
        issues: Vec<ConfigIssue>,
    },
}

/// Why `spillway serve` (and `spillway check`) refuse an AWS provider in a binary built
/// without the `aws` cargo feature.
pub fn aws_feature_missing(kind: &str) -> String {
    format!(
        "`{kind}` needs AWS support, but this spillway was built without the `aws` feature \
         (features: none); rebuild with `cargo build --release --features aws`"
    )
}

/// Collects semantic problems with their field paths during validation.
pub struct Issues(pub(crate) Vec<ConfigIssue>);

impl Issues {
    /// Record one problem at `path`.
    pub fn push(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.0.push(ConfigIssue::new(path, message));
    }

    /// `value` (a number that is not a duration: a price, a rate, a gain) must be finite
    /// and > 0.
    pub fn positive(&mut self, path: &str, value: f64) {
        if !(value.is_finite() && value > 0.0) {
            self.push(path, format!("must be a positive number, got {value}"));
        }
    }

    /// `value` (a number that is not a duration) must be finite and ≥ 0.
    pub fn non_negative(&mut self, path: &str, value: f64) {
        if !(value.is_finite() && value >= 0.0) {
            self.push(path, format!("must be zero or positive, got {value}"));
        }
    }

    /// A configured duration ([`super::duration::Seconds`], [`super::duration::Millis`];
    /// the reader already refused negative and too large ones) must be above zero.
    pub fn nonzero_duration<D>(&mut self, path: &str, value: D)
    where
        D: Into<std::time::Duration> + fmt::Display + Copy,
    {
        if value.into().is_zero() {
            self.push(path, format!("must be a positive number, got {value}"));
        }
    }

    /// `value` must lie in `[lo, hi]`.
    pub fn within(&mut self, path: &str, value: f64, lo: f64, hi: f64) {
        if !(value.is_finite() && (lo..=hi).contains(&value)) {
            self.push(path, format!("must be in [{lo}, {hi}], got {value}"));
        }
    }
}

pub(crate) fn check_command(issues: &mut Issues, path: &str, command: &[String]) {
    if command.is_empty() || command[0].trim().is_empty() {
        issues.push(path, "must name a program: a list like [\"{spillway}\", \"sample-api\", \"--listen\", \"127.0.0.1:{port}\"]");
    } else if !command.iter().any(|a| a.contains("{port}")) {
        issues.push(
            path,
            "must contain the {port} placeholder so each instance gets its own port",
        );
    }
}

pub(crate) fn check_path(issues: &mut Issues, path: &str, value: &str) {
    if !value.starts_with('/') {
        issues.push(path, format!("must start with '/', got {value:?}"));
    }
}

/// A user-given upstream URL must pass the address policy ([`crate::net::upstream`]).
pub(crate) fn check_upstream(
    issues: &mut Issues,
    path: &str,
    url: &super::url::HttpUrl,
    allow_loopback: bool,
) {
    if let Some(host) = url.uri().host()
        && let Err(e) = crate::net::upstream::check_host(host, allow_loopback)
    {
        issues.push(path, e.to_string());
    }
}
