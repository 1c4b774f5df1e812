//! `function_tier:` — a function provider section (`type: process`, `http` or `lambda`
//! and that provider's keys). The same type is each `function_zones` entry's provider.

use serde::{Deserialize, Serialize};
use std::num::NonZeroU32;

use super::defaults::{DEFAULT_KEEP_ALIVE_SECONDS, DEFAULT_PROBE_INTERVAL_SECONDS};
use super::duration::Seconds;
use super::issues::{Issues, check_command, check_path, check_upstream};
use super::lambda::LambdaFunctionTierConfig;
use super::url::HttpUrl;
use crate::policy::functions::{FunctionPoolParams, WarmOrder};
use crate::policy::placement::ZoneCapacity;

/// `function_tier:` — where spilled requests run. Written with `type:` (`process`,
/// `http`, `lambda`); read through [`FunctionTierSection`] (see `VmPoolSection`).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", from = "FunctionTierSection")]
pub enum FunctionTierConfig {
    /// On-demand local instances (child processes) with real cold starts.
    Process(ProcessFunctionTierConfig),
    /// An existing function endpoint (OpenFaaS, Knative, …).
    Http(HttpFunctionTierConfig),
    /// An AWS Lambda function called through the Invoke API. Always parses;
    /// `spillway serve` needs a binary built with the `aws` cargo feature.
    Lambda(LambdaFunctionTierConfig),
}

/// How `function_tier` is read (see `VmPoolSection`).
#[derive(Deserialize)]
#[serde(rename = "type", rename_all = "snake_case")]
#[doc(hidden)]
pub enum FunctionTierSection {
    /// `type: process`.
    Process(ProcessFunctionTierConfig),
    /// `type: http`.
    Http(HttpFunctionTierConfig),
    /// `type: lambda`.
    Lambda(LambdaFunctionTierConfig),
}

impl From<FunctionTierSection> for FunctionTierConfig {
    fn from(s: FunctionTierSection) -> Self {
        match s {
            FunctionTierSection::Process(p) => FunctionTierConfig::Process(p),
            FunctionTierSection::Http(p) => FunctionTierConfig::Http(p),
            FunctionTierSection::Lambda(p) => FunctionTierConfig::Lambda(p),
        }
    }
}

/// `function_tier: {type: process}`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessFunctionTierConfig {
    /// Program and arguments, with `{port}` and `{spillway}` placeholders. Required by
    /// `spillway serve`; the simulator models instances and needs none.
    #[serde(default)]
    pub command: Option<Vec<String>>,
    /// Readiness probe path.
    #[serde(default = "default_health_path")]
    pub health_path: String,
    /// An idle instance is stopped after this long (FaaSim keep-alive).
    #[serde(default = "default_keep_alive")]
    pub keep_alive_seconds: Seconds,
    /// Cap on simultaneous instances; calls beyond it are throttled.
    pub max_instances: NonZeroU32,
    /// Instances started up front and kept warm (pre-warm); keep-alive never expires them.
    #[serde(default)]
    pub prewarmed_instances: u32,
    /// Which idle instance a warm start takes: `newest` (most recently idle, the default)
    /// or `oldest` (idle longest, as FaaSim).
    #[serde(default)]
    pub warm_instance_order: WarmOrder,
    /// A cold start not ready after this long fails the call (502).
    #[serde(default = "default_function_boot_timeout")]
    pub boot_timeout_seconds: Seconds,
    /// Interval between readiness probes during a cold start.
    #[serde(default = "default_probe_interval")]
    pub probe_interval_seconds: Seconds,
}

/// `function_tier: {type: http}`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpFunctionTierConfig {
    /// Base URL of the function endpoint (`http://` or `https://`, parsed where read);
    /// the request path is appended.
    pub url: HttpUrl,
    /// Most calls in flight; more are throttled.
    pub max_concurrency: NonZeroU32,
}

pub(crate) fn default_health_path() -> String {
    "/".to_string()
}
pub(crate) fn default_function_boot_timeout() -> Seconds {
    Seconds::from_secs(10)
}
pub(crate) fn default_probe_interval() -> Seconds {
    DEFAULT_PROBE_INTERVAL_SECONDS
}
pub(crate) fn default_keep_alive() -> Seconds {
    DEFAULT_KEEP_ALIVE_SECONDS
}

/// What a provider's own checks need to know of the gateway it serves (each provider
/// validates itself against it, so that a new provider is one struct with its checks).
pub(crate) struct ProviderContext {
    /// `gateway.allow_loopback_upstreams`: whether an `http` provider's `url` may point
    /// at the gateway's own host.
    pub allow_loopback_upstreams: bool,
    /// `gateway.upstream_timeout_seconds`: a `lambda` provider's Invoke deadline must
    /// not exceed it.
    pub upstream_timeout_seconds: Seconds,
}

impl FunctionTierConfig {
    /// Semantic checks of this provider section at `at` (`function_tier`,
    /// `function_zones[2]`) against the gateway's settings in `gateway`, each problem
    /// with its field path.
    pub(crate) fn validate_at(&self, at: &str, gateway: &ProviderContext, is: &mut Issues) {
        match self {
            FunctionTierConfig::Process(f) => {
                if let Some(command) = &f.command {
                    check_command(is, &format!("{at}.command"), command);
                }
                check_path(is, &format!("{at}.health_path"), &f.health_path);
                if f.prewarmed_instances > f.max_instances.get() {
                    is.push(
                        format!("{at}.prewarmed_instances"),
                        format!(
                            "must not exceed {at}.max_instances ({} > {})",
                            f.prewarmed_instances, f.max_instances
                        ),
                    );
                }
                is.nonzero_duration(
                    &format!("{at}.boot_timeout_seconds"),
                    f.boot_timeout_seconds,
                );
                is.nonzero_duration(
                    &format!("{at}.probe_interval_seconds"),
                    f.probe_interval_seconds,
                );
            }
            FunctionTierConfig::Http(h) => {
                check_upstream(
                    is,
                    &format!("{at}.url"),
                    &h.url,
                    gateway.allow_loopback_upstreams,
                );
            }
            FunctionTierConfig::Lambda(l) => {
                l.validate_at(at, is);
                l.check_invoke_deadline(at, gateway.upstream_timeout_seconds, is);
            }
        }
    }

    /// The zone capacity model: instances for `process` (keep-alive, pre-warm,
    /// `max_instances`), concurrency only for `http` and `lambda`.
    pub fn capacity(&self) -> ZoneCapacity {
        match self {
            FunctionTierConfig::Process(p) => ZoneCapacity::Instances(p.pool_params()),
            FunctionTierConfig::Http(h) => ZoneCapacity::Concurrency {
                max_concurrency: Some(h.max_concurrency.get()),
            },
            FunctionTierConfig::Lambda(l) => ZoneCapacity::Concurrency {
                max_concurrency: l.max_concurrency.map(NonZeroU32::get),
            },
        }
    }

    /// Instances this provider keeps warm and bills whether used or not (process
    /// `prewarmed_instances`, Lambda's provisioned concurrency; none for `http`): the live
    /// bill's provisioned concurrency.
    pub fn provisioned_instances(&self) -> u32 {
        match self {
            FunctionTierConfig::Process(p) => p.prewarmed_instances,
            FunctionTierConfig::Lambda(l) => l.prewarmed_instances.unwrap_or(0),
            FunctionTierConfig::Http(_) => 0,
        }
    }
}

impl ProcessFunctionTierConfig {
    /// The instance-pool parameters (FaaSim keep-alive, pre-warm, max instances).
    pub fn pool_params(&self) -> FunctionPoolParams {
        FunctionPoolParams {
            keep_alive: self.keep_alive_seconds.get(),
            max_instances: Some(self.max_instances.get()),
            prewarmed: self.prewarmed_instances,
            warm_order: self.warm_instance_order,
        }
    }
}
