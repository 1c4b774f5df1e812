//! [`SimError`]: why a simulation or cost report failed.

use std::path::PathBuf;

/// Why a simulation or cost report failed. Every variant names the file (and line) or
/// the field at fault.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// A file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A malformed line in a trace (or side) file.
    #[error("{file}:{line}: {message}")]
    Parse {
        /// The file.
        file: String,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// The configuration could not be loaded.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// An option or a field is invalid.
    #[error("{field}: {message}")]
    Invalid {
        /// The option (`--rate-divisor`) or config field (`sim.vm.slots`).
        field: String,
        /// What is wrong.
        message: String,
    },
    /// A plot could not be drawn.
    #[error("{}: cannot draw the plot: {message}", path.display())]
    Plot {
        /// The output file.
        path: PathBuf,
        /// The drawing error.
        message: String,
    },
}
