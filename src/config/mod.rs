//! The YAML configuration shared by the gateway (`spillway serve`) and the simulator
//! (`spillway sim`, `spillway cost`).
//!
//! Loading happens in three steps, nothing half-applied:
//! 1. **parse** the YAML text into a located tree (`yaml`, with serde-saphyr's parser):
//!    a syntax error stops here with `file:line:column`;
//! 2. **read** the schema from the tree (`de`): every type error (a word where a number
//!    belongs, an unknown key, an unknown `type:`) is collected with its line, column and
//!    field path, fields of `type:`-tagged sections included;
//! 3. **validate**: semantic checks collect every remaining problem with its field path,
//!    located in the file too (`libra.rho: must be in (0, 1], got 1.5`).
//!
//! Type and semantic problems are reported together, in file order. The validated
//! [`Config`] then hands typed values (durations, policy parameters) to the drivers.
//!
//! | module | section |
//! |---|---|
//! | `schema` | the root [`Config`] (it imports the sections), `gateway:`, `libra:`, `pricing:`, `vm_pool:` and their validation |
//! | `function_tier` | `function_tier:` — a function provider (`process`, `http`, `lambda`), also each zone's provider |
//! | `lambda` | `function_tier: {type: lambda}` |
//! | `zones` | `function_zones:` entries (name, kind, client networks, provider) and `placement:` |
//! | `zone_specs` | the zones in placement order, placement parameters, the cost meter and the zone checks |
//! | `issues` | [`Issues`], [`ConfigIssue`], [`ConfigError`] and the shared checks (a leaf: every section imports it, it imports only `url`) |
//! | `defaults` | the `DEFAULT_*` constants (a leaf) |
//! | `deprecated` | old spellings that still read, their warnings and `--set` mapping (a leaf) |
//! | `duration` | [`Seconds`] and [`Millis`], the configured durations, bounds checked where read (a leaf) |
//! | `url` | [`HttpUrl`], the configured `http(s)://` URLs, parsed where read (a leaf) |
//! | `routes` | `routes:` (route keys) |
//! | `queue` | `queue:` (the gateway queue, call scheduling) |
//! | [`delay`] | `async:` (asynchronous calls and the delay queue) |
//! | [`coordination`] | `coordination:` (several replicas, one decision) |
//! | [`sim`] | `sim:` (simulator-only models) |
//! | [`telemetry`] | `telemetry:` (span export over OTLP) |
//! | `overrides` | `--set PATH=VALUE` |
//! | `aws_warnings` | `spillway check` warnings about risky AWS settings (plain-HTTP endpoints off loopback, wide tag allow-lists) |
//! | `yaml`, `de` | the located YAML tree and the serde deserializer over it |
//!
//! Every option is documented, with its default, in `config/reference.yaml` (a test
//! checks every key and default against this schema); defaults live once, as the
//! `DEFAULT_*` constants of `defaults`. The sections import only the leaves (`issues`,
//! `defaults`, `deprecated`, `duration`, `url`, `yaml`, `de`) and sections below them; `schema` and this module import
//! the sections (`scripts/check-module-deps.sh` refuses a cycle).

mod aws_warnings;
pub mod coordination;
mod de;
mod defaults;
pub mod delay;
mod deprecated;
mod duration;
mod function_tier;
mod issues;
mod lambda;
mod overrides;
mod queue;
mod routes;
mod schema;
pub mod sim;
pub mod telemetry;
mod url;
mod yaml;
mod zone_specs;
mod zones;

pub use aws_warnings::{TAG_CIDR_MIN_PREFIX_V4, TAG_CIDR_MIN_PREFIX_V6};
pub use defaults::{
    DEFAULT_ADMIN_LISTEN, DEFAULT_ALPHA, DEFAULT_BETA, DEFAULT_BOOT_TIMEOUT_SECONDS,
    DEFAULT_CONNECT_TIMEOUT_SECONDS, DEFAULT_DECISION_EPOCHS, DEFAULT_DRAIN_TIMEOUT_SECONDS,
    DEFAULT_EPOCH_SECONDS, DEFAULT_HEADER_READ_TIMEOUT_SECONDS,
    DEFAULT_HTTP2_KEEPALIVE_INTERVAL_SECONDS, DEFAULT_HTTP2_KEEPALIVE_TIMEOUT_SECONDS,
    DEFAULT_IDLE_TIMEOUT_SECONDS, DEFAULT_KEEP_ALIVE_SECONDS,
    DEFAULT_KEEPALIVE_IDLE_TIMEOUT_SECONDS, DEFAULT_LISTEN, DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_CONCURRENT_STREAMS, DEFAULT_OTLP_SAMPLE_RATIO, DEFAULT_OTLP_SERVICE_NAME,
    DEFAULT_OTLP_TIMEOUT_MS, DEFAULT_PHI, DEFAULT_PROBE_INTERVAL_SECONDS,
    DEFAULT_REQUEST_BODY_IDLE_TIMEOUT_SECONDS, DEFAULT_RESPONSE_BODY_IDLE_TIMEOUT_SECONDS,
    DEFAULT_RHO, DEFAULT_TUNNEL_IDLE_TIMEOUT_SECONDS, DEFAULT_UPSTREAM_TIMEOUT_SECONDS,
    MAX_HEAD_LIMIT_BYTES,
};
pub use duration::{Millis, ONE_YEAR_MS, ONE_YEAR_SECONDS, Seconds};
pub use function_tier::{
    FunctionTierConfig, FunctionTierSection, HttpFunctionTierConfig, ProcessFunctionTierConfig,
};
pub use issues::{ConfigError, ConfigIssue, Issues, aws_feature_missing};
pub use lambda::{
    DEFAULT_INVOKE_MARGIN_SECONDS, DEFAULT_LAMBDA_TIMEOUT_SECONDS, LambdaFunctionTierConfig,
    LambdaPayloadFormat, MAX_LAMBDA_TIMEOUT_SECONDS,
};
pub use overrides::with_override;
pub use queue::{
    DEFAULT_FAIR_CHOICE_WINDOW_SECONDS, DEFAULT_MAX_QUEUE_LENGTH, DEFAULT_MAX_QUEUE_WAIT_SECONDS,
    DEFAULT_PROCESSING_MS, MAX_PROCESSING_MS, QueueConfig,
};
pub use routes::{AsyncMode, RouteConfig, validate_routes};
pub use schema::{
    BalancerRule, Config, DEFAULT_EC2_AUDIT_INTERVAL_SECONDS, DEFAULT_EC2_BOOT_TIMEOUT_SECONDS,
    DEFAULT_EC2_PROBE_INTERVAL_SECONDS, DEFAULT_EC2_STRAY_GRACE_SECONDS, DEFAULT_EC2_UPSTREAM_PORT,
    DEFAULT_EC2_UPSTREAM_TAG_KEY, EC2_MAX_USER_DATA_BYTES, EC2_POOL_TAG_KEY, Ec2Address,
    Ec2LaunchTemplate, Ec2ShutdownPolicy, Ec2VmPoolConfig, GatewayConfig, LibraConfig,
    MAX_WORKER_THREADS, PricingConfig, ProcessVmPoolConfig, RMaxAdaptiveConfig, StaticVmPoolConfig,
    TlsConfig, UpstreamTlsConfig, VmPoolConfig, VmPoolSection, open_files_limit, resolve_listen,
};
pub use url::{HttpUrl, HttpUrlError};
pub use yaml::{Loc, MAX_DEPTH, MAX_DOCUMENT_BYTES, MAX_NODES, MAX_TEXT_BYTES};
pub use zones::{FunctionZoneConfig, PlacementConfig, SINGLE_ZONE_NAME, ZoneKindConfig, ZoneSpec};

use std::path::Path;

/// The embedded default configuration: `config/quickstart.yaml` (local backends running
/// the sample API, no cloud account needed).
pub const QUICKSTART_YAML: &str = include_str!("../../config/quickstart.yaml");

impl Config {
    /// Read, parse and validate a configuration file.
    ///
    /// # Errors
    /// [`ConfigError::Read`], [`ConfigError::Parse`] (a YAML syntax error, with line and
    /// column) or [`ConfigError::Invalid`] (every type and semantic problem at once).
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let bytes = read(path)?;
        Self::from_bytes(&bytes, &path.display().to_string())
    }

    /// [`Config::load`] plus what `spillway serve` needs ([`Config::gateway_issues`]:
    /// both providers, a loadable TLS key, AWS support for AWS providers).
    ///
    /// # Errors
    /// As [`Config::load`].
    pub fn load_for_serve(path: &Path) -> Result<Config, ConfigError> {
        let bytes = read(path)?;
        let file = path.display().to_string();
        let text = yaml::decode(&bytes).map_err(|e| parse_error(&file, e))?;
        Self::from_yaml_for_serve(text, &file)
    }

    /// The embedded quickstart configuration.
    pub fn quickstart() -> Config {
        Self::from_yaml(QUICKSTART_YAML, "<embedded quickstart>")
            .expect("the embedded quickstart config is valid (tested)")
    }

    /// Parse and validate a file's bytes: UTF-8 text of at most [`MAX_DOCUMENT_BYTES`];
    /// `file` names it in errors.
    ///
    /// # Errors
    /// As [`Config::load`], minus `Read`; bytes that are not UTF-8 are a
    /// [`ConfigError::Parse`] at the line and column of the first such byte.
    pub fn from_bytes(bytes: &[u8], file: &str) -> Result<Config, ConfigError> {
        let text = yaml::decode(bytes).map_err(|e| parse_error(file, e))?;
        Self::from_yaml(text, file)
    }

    /// Parse and validate YAML text; `file` names it in errors. The reader's bounds
    /// (document size, nesting depth, alias expansion: [`MAX_DOCUMENT_BYTES`],
    /// [`MAX_DEPTH`], [`MAX_NODES`], [`MAX_TEXT_BYTES`]) are [`ConfigError::Parse`]
    /// errors at the place where they are crossed.
    ///
    /// # Errors
    /// As [`Config::load`], minus `Read`.
    pub fn from_yaml(text: &str, file: &str) -> Result<Config, ConfigError> {
        Self::from_yaml_with(text, file, |_| Vec::new())
    }

    /// [`Config::from_yaml`] plus [`Config::gateway_issues`].
    ///
    /// # Errors
    /// As [`Config::from_yaml`].
    pub fn from_yaml_for_serve(text: &str, file: &str) -> Result<Config, ConfigError> {
        Self::from_yaml_with(text, file, Config::gateway_issues)
    }

    fn from_yaml_with(
        text: &str,
        file: &str,
        extra: impl Fn(&Config) -> Vec<ConfigIssue>,
    ) -> Result<Config, ConfigError> {
        let tree = yaml::parse(text).map_err(|e| parse_error(file, e))?;
        let places = tree.locations();
        let (config, type_errors, removed) = de::collect::<Config>(tree);
        let mut issues: Vec<ConfigIssue> = type_errors
            .into_iter()
            .map(|e| ConfigIssue {
                path: e.path,
                message: e.message,
                location: e.loc,
            })
            .collect();
        if let Some(config) = &config {
            let mut semantic = config.validate();
            semantic.extend(extra(config));
            // What was removed after a type error has its default now: checks of it, of
            // the section or list it was part of, or of anything compared with it, would
            // be about values the file never had.
            semantic.retain(|i| {
                !removed.iter().any(|r| {
                    de::within(&i.path, r)
                        || de::within(r, &i.path)
                        || i.message.contains(r.as_str())
                })
            });
            for mut issue in semantic {
                issue.location = locate(&places, &issue.path);
                issues.push(issue);
            }
        }
        match config {
            Some(config) if issues.is_empty() => Ok(config.with_pool_name()),
            _ => {
                // File order; problems without a place (sections absent) last.
                issues.sort_by_key(|i| (i.location.is_none(), i.location));
                Err(ConfigError::Invalid {
                    file: file.to_string(),
                    issues,
                })
            }
        }
    }
}

/// Warnings about a configuration that is valid but risky (asynchronous calls on a
/// public listener without a per-client limit, …), each with its field path and, when
/// `text` is the file it was read from, its place. `spillway check` prints them
/// (`file:line:column: warning: path: message`) and still exits 0; `serve` logs them.
pub fn warnings(config: &Config, text: Option<&str>) -> Vec<ConfigIssue> {
    let g = &config.gateway;
    let listeners: Vec<(&str, std::net::SocketAddr)> =
        std::iter::once(("gateway.listen", g.listen))
            .chain(g.tls.as_ref().map(|t| ("gateway.tls.listen", t.listen)))
            .collect();
    let mut out = delay::warnings(&config.routes, &config.async_calls, &listeners);
    out.extend(gateway_warnings(config));
    out.extend(aws_warnings::warnings(config));
    if let Some(places) = text
        .and_then(|t| yaml::parse(t).ok())
        .map(|t| t.locations())
    {
        for w in &mut out {
            w.location = locate(&places, &w.path).or_else(|| locate(&places, "routes"));
        }
        out.extend(deprecated::warnings(&places));
    }
    out
}

/// Risky `gateway:` settings that are valid: `request_id_trust: trusted_proxies` with no
/// trusted proxy (every client's request id would be replaced); an old spelling beside
/// the key that replaced it (`libra.max_outstanding_per_vm` with a `vm_pool`, which has
/// `slots_per_vm`; the simulator, without a `vm_pool`, still reads it). (An admin listener off
/// loopback without a token is an error, not a warning: see
/// [`GatewayConfig::admin_exposure_issue`].)
fn gateway_warnings(config: &Config) -> Vec<ConfigIssue> {
    let g = &config.gateway;
    let mut out = Vec::new();
    if g.request_id_trust == crate::net::request_id::RequestIdTrust::TrustedProxies
        && g.trusted_proxies.is_empty()
    {
        out.push(ConfigIssue::new(
            "gateway.request_id_trust",
            "trusted_proxies is empty: every client's x-request-id is replaced (use `none` to say so)",
        ));
    }
    if let (Some(n), Some(_)) = (config.libra.max_outstanding_per_vm, &config.vm_pool) {
        out.push(ConfigIssue::new(
            "libra.max_outstanding_per_vm",
            format!(
                "deprecated alias of vm_pool.slots_per_vm: write `slots_per_vm: {n}` in vm_pool"
            ),
        ));
    }
    out
}

/// `file:line:column: warning: path: message` (or `file: warning: …` without a place).
pub fn warning_line(file: &str, w: &ConfigIssue) -> String {
    match w.location {
        Some(l) => format!("{file}:{}:{}: warning: {w}", l.line, l.column),
        None => format!("{file}: warning: {w}"),
    }
}

/// The text of a configuration file, as [`Config::load`] reads it (`None` when it
/// cannot be read as one).
pub fn read_text(path: &Path) -> Option<String> {
    let bytes = read(path).ok()?;
    yaml::decode(&bytes).ok().map(str::to_owned)
}

impl Config {
    /// Under coordination an EC2 pool without `gateway_id` is named by the cluster:
    /// every replica tags, adopts and audits the same instances (not one id per host).
    fn with_pool_name(mut self) -> Self {
        let name = self.pool_name();
        if let Some(VmPoolConfig::Ec2(e)) = &mut self.vm_pool
            && e.gateway_id.is_none()
        {
            e.gateway_id = name;
        }
        self
    }
}

fn parse_error(file: &str, e: yaml::SyntaxError) -> ConfigError {
    ConfigError::Parse {
        file: file.to_string(),
        line: e.loc.line,
        column: e.loc.column,
        message: e.message,
    }
}

/// The file's bytes, at most one more than [`MAX_DOCUMENT_BYTES`] (enough to say it is
/// too long: a huge file, or a device that never ends, is not read to its end).
fn read(path: &Path) -> Result<Vec<u8>, ConfigError> {
    use std::io::Read as _;
    let fail = |source| ConfigError::Read {
        path: path.to_owned(),
        source,
    };
    let file = std::fs::File::open(path).map_err(fail)?;
    let mut bytes = Vec::new();
    file.take(MAX_DOCUMENT_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(fail)?;
    Ok(bytes)
}

/// The place of `path` in the file, or of its nearest ancestor that is there.
fn locate(places: &std::collections::HashMap<String, Loc>, path: &str) -> Option<Loc> {
    let mut p = path;
    loop {
        if let Some(l) = places.get(p) {
            return (!p.is_empty()).then_some(*l);
        }
        let cut = p.rfind(['.', '['])?;
        p = &p[..cut];
    }
}

#[cfg(test)]
mod reader_fuzz;
#[cfg(test)]
mod reference_tests;
#[cfg(test)]
mod tests;
