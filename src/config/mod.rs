//! The YAML configuration shared by the gateway (`spillway serve`) and the simulator
//! (`spillway sim`, `spillway cost`).
//!
//! Loading happens in three steps, nothing half-applied:
//! 1. **parse** with serde-saphyr (serde_yaml is archived; serde-saphyr is maintained and
//!    reports locations): YAML syntax and type errors stop here with `file:line:column`;
//!    unknown keys are errors too (`deny_unknown_fields`).
//! 2. **validate**: semantic checks collect *every* problem at once, each with its field
//!    path (`libra.rho: must be in (0, 1], got 1.5`).
//! 3. **use**: the validated [`Config`] hands typed values (durations, policy parameters)
//!    to the drivers.
//!
//! Every option is documented, with its default, in `config/reference.yaml`; defaults live
//! once, as the `DEFAULT_*` constants of this module.

mod lambda;
mod schema;
pub mod sim;

pub use lambda::*;
pub use schema::*;

use std::fmt;
use std::path::{Path, PathBuf};

/// The embedded default configuration: `config/quickstart.yaml` (local backends running
/// the sample API, no cloud account needed).
pub const QUICKSTART_YAML: &str = include_str!("../../config/quickstart.yaml");

/// One semantic problem in a configuration, located by its field path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigIssue {
    /// Dotted field path, e.g. `vm_pool.command` or `gateway.trusted_proxies[2]`.
    pub path: String,
    /// What is wrong and what is expected.
    pub message: String,
}

impl fmt::Display for ConfigIssue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
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
    /// YAML syntax or type error, at a known place (`line` 0: location unknown; the
    /// message then starts with the field path).
    #[error("{}: {message}", if *line == 0 { file.clone() } else { format!("{file}:{line}:{column}") })]
    Parse {
        /// The file (or `<embedded quickstart>`).
        file: String,
        /// 1-based line.
        line: u64,
        /// 1-based column.
        column: u64,
        /// What the parser said.
        message: String,
    },
    /// Semantically invalid: every problem, each with its field path.
    #[error("{file}: {} problem(s):\n{}", issues.len(), issues.iter().map(|i| format!("  - {i}")).collect::<Vec<_>>().join("\n"))]
    Invalid {
        /// The file.
        file: String,
        /// All problems found.
        issues: Vec<ConfigIssue>,
    },
}

impl Config {
    /// Read, parse and validate a configuration file.
    ///
    /// # Errors
    /// [`ConfigError::Read`], [`ConfigError::Parse`] (with line and column) or
    /// [`ConfigError::Invalid`] (every semantic problem at once).
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::from_yaml(&text, &path.display().to_string())
    }

    /// [`Config::load`] plus the sections `spillway serve` needs ([`Config::gateway_issues`]).
    ///
    /// # Errors
    /// As [`Config::load`]; missing providers are [`ConfigError::Invalid`].
    pub fn load_for_serve(path: &Path) -> Result<Config, ConfigError> {
        let config = Self::load(path)?;
        let issues = config.gateway_issues();
        if issues.is_empty() {
            Ok(config)
        } else {
            Err(ConfigError::Invalid {
                file: path.display().to_string(),
                issues,
            })
        }
    }

    /// The embedded quickstart configuration.
    pub fn quickstart() -> Config {
        Self::from_yaml(QUICKSTART_YAML, "<embedded quickstart>")
            .expect("the embedded quickstart config is valid (tested)")
    }

    /// Parse and validate YAML text; `file` names it in errors.
    ///
    /// # Errors
    /// As [`Config::load`], minus `Read`.
    pub fn from_yaml(text: &str, file: &str) -> Result<Config, ConfigError> {
        let config: Config = serde_saphyr::from_str(text).map_err(|e| {
            let (line, column) = e.location().map_or((0, 0), |l| (l.line(), l.column()));
            // The library's message may embed a snippet and repeat the location; keep the
            // first line without the location, which we print once as file:line:column.
            let message = e.to_string();
            let first = message
                .lines()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("invalid YAML")
                .trim();
            let mut message = strip_location(first, line, column);
            if let Some(path) = failing_path(text) {
                message = format!("{path}: {message}");
            }
            ConfigError::Parse {
                file: file.to_string(),
                line,
                column,
                message,
            }
        })?;
        let issues = config.validate();
        if issues.is_empty() {
            Ok(config)
        } else {
            Err(ConfigError::Invalid {
                file: file.to_string(),
                issues,
            })
        }
    }
}

/// The field path of a type error (`function_tier.max_instances`), found by deserializing
/// the document again through `serde_path_to_error`. Some values (socket addresses,
/// CIDRs, the fields of `type:`-tagged sections) lose their YAML location inside serde;
/// the path still names the place. `None` for syntax errors.
fn failing_path(text: &str) -> Option<String> {
    let value: serde_json::Value = serde_saphyr::from_str(text).ok()?;
    let err = serde_path_to_error::deserialize::<_, Config>(value).err()?;
    let path = err.path().to_string();
    (path != ".").then_some(path)
}

/// Remove the location phrases serde-saphyr adds ("error: line L column C: …",
/// "… at line L, column C") so the location is printed once.
fn strip_location(message: &str, line: u64, column: u64) -> String {
    let mut m = message.trim_start_matches("error: ").to_string();
    for phrase in [
        format!("line {line} column {column}: "),
        format!(" at line {line}, column {column}"),
        format!(" at line {line} column {column}"),
    ] {
        m = m.replace(&phrase, "");
    }
    m.trim().to_string()
}

#[cfg(test)]
mod tests;
