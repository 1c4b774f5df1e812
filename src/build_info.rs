//! What this binary is: version, git commit and cargo features, for `spillway --version`,
//! the startup log line and the `spillway_build_info` metric.
//!
//! The commit comes from `build.rs` (`unknown` when built outside a git checkout).

/// The crate version (`0.1.0`).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The git commit built (12 hex digits), or `unknown`.
pub const COMMIT: &str = env!("SPILLWAY_GIT_COMMIT");

#[cfg(all(feature = "aws", feature = "otlp"))]
macro_rules! features {
    () => {
        "aws,otlp"
    };
}
#[cfg(all(feature = "aws", not(feature = "otlp")))]
macro_rules! features {
    () => {
        "aws"
    };
}
#[cfg(all(not(feature = "aws"), feature = "otlp"))]
macro_rules! features {
    () => {
        "otlp"
    };
}
#[cfg(not(any(feature = "aws", feature = "otlp")))]
macro_rules! features {
    () => {
        "none"
    };
}

/// Optional cargo features compiled in, comma-separated: `aws`, `otlp`, `aws,otlp`, or
/// `none`.
pub const FEATURES: &str = features!();

/// `spillway -V`: `0.1.0 (commit 1a2b3c4d5e6f, features: none)`.
pub const SHORT_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("SPILLWAY_GIT_COMMIT"),
    ", features: ",
    features!(),
    ")"
);

/// `spillway --version`: the version, then `commit:` and `features:` lines.
pub const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    "\ncommit: ",
    env!("SPILLWAY_GIT_COMMIT"),
    "\nfeatures: ",
    features!()
);
