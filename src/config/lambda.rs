//! `function_tier: {type: lambda}` — an AWS Lambda function invoked through the Invoke
//! API.
//!
//! The section always parses and validates, so `spillway check` accepts it in any build;
//! `spillway serve` needs a binary built with the `aws` cargo feature.

use std::num::NonZeroU32;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::duration::Seconds;
use super::issues::Issues;
use super::url::HttpUrl;

/// Default of `timeout_seconds`, the function's own timeout, seconds. Below the default
/// `gateway.upstream_timeout_seconds` (30 s) by more than the default invoke margin, so
/// the default configuration never cuts a call the function may still finish.
pub const DEFAULT_LAMBDA_TIMEOUT_SECONDS: Seconds<MAX_LAMBDA_TIMEOUT_SECONDS> =
    Seconds::from_secs(25);
/// Default of `invoke_margin_seconds`: how long past the function's own timeout the
/// gateway still waits for the Invoke reply (network, Lambda's own queueing), seconds.
pub const DEFAULT_INVOKE_MARGIN_SECONDS: Seconds = Seconds::from_secs(2);
/// Longest a Lambda function can run (15 minutes), seconds: the upper bound of
/// `timeout_seconds`.
pub const MAX_LAMBDA_TIMEOUT_SECONDS: u64 = 900;

/// The event shape the function expects (and the reply shape it returns).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LambdaPayloadFormat {
    /// API Gateway HTTP API / function URL, payload format 2.0 (http-cases C19).
    #[default]
    V2,
    /// API Gateway REST API, payload format 1.0.
    V1,
    /// Application Load Balancer target group (multi-value headers off).
    Alb,
}

impl LambdaPayloadFormat {
    /// The name used in configuration files and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            LambdaPayloadFormat::V2 => "v2",
            LambdaPayloadFormat::V1 => "v1",
            LambdaPayloadFormat::Alb => "alb",
        }
    }
}

/// `function_tier: {type: lambda}`.
///
/// Credentials come only from the AWS SDK's default chain (environment, profile, SSO,
/// container or instance role). Invoke is never retried by the SDK: a throttled call
/// (429) is spilled back to a VM by the balancer instead.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LambdaFunctionTierConfig {
    /// Function name (`my-api`), partial ARN (`123456789012:function:my-api`) or full ARN.
    pub function_name: String,
    /// Version or alias to invoke (`live`, `7`). Absent: `$LATEST`. Required when
    /// `prewarmed_instances` is above 0 (provisioned concurrency needs one).
    #[serde(default)]
    pub qualifier: Option<String>,
    /// Event and reply shape: `v2` (default), `v1` or `alb`.
    #[serde(default)]
    pub payload_format: LambdaPayloadFormat,
    /// The function's own timeout (its Lambda `Timeout` setting), seconds. Default
    /// [`DEFAULT_LAMBDA_TIMEOUT_SECONDS`], at most [`MAX_LAMBDA_TIMEOUT_SECONDS`]. The
    /// gateway waits for an Invoke reply until [`Self::invoke_deadline`], then
    /// answers 504.
    #[serde(default = "default_lambda_timeout")]
    pub timeout_seconds: Seconds<MAX_LAMBDA_TIMEOUT_SECONDS>,
    /// How long past `timeout_seconds` the gateway still waits for the Invoke reply,
    /// seconds (default [`DEFAULT_INVOKE_MARGIN_SECONDS`], at least 0): a function that
    /// runs to its own timeout still gets its reply (Lambda's timeout error) through.
    #[serde(default = "default_invoke_margin")]
    pub invoke_margin_seconds: Seconds,
    /// AWS region (`us-east-1`). Absent: the default chain (`AWS_REGION`, profile).
    #[serde(default)]
    pub region: Option<String>,
    /// Lambda endpoint override (`http://127.0.0.1:5000` for moto, a VPC endpoint…).
    #[serde(default)]
    pub endpoint_url: Option<HttpUrl>,
    /// Most Invoke calls in flight from this gateway; more are throttled locally and
    /// spilled back like a 429. Absent: no local limit (Lambda's own concurrency limit
    /// applies). Set it to the function's reserved concurrency to save the 429 round trip.
    #[serde(default)]
    pub max_concurrency: Option<NonZeroU32>,
    /// Pre-warm as provisioned concurrency on `qualifier`: `N > 0` puts N at start
    /// (PutProvisionedConcurrencyConfig), then polls it until `READY` or `FAILED`
    /// (shown in `/status`). `0` or absent: the gateway does not touch it (`0` does not
    /// remove it; that is `remove_prewarm_on_start`).
    #[serde(default)]
    pub prewarmed_instances: Option<u32>,
    /// Remove the provisioned concurrency of `qualifier` at start
    /// (DeleteProvisionedConcurrencyConfig). Default `false`. Needs `qualifier`; not with
    /// `prewarmed_instances` above 0.
    #[serde(default)]
    pub remove_prewarm_on_start: bool,
    /// Remove the provisioned concurrency on gateway shutdown. Default `false`: it is
    /// kept, so a restart does not lose warm capacity (it is billed while it exists).
    /// Needs `prewarmed_instances` above 0.
    #[serde(default)]
    pub remove_prewarm_on_shutdown: bool,
}

fn default_lambda_timeout() -> Seconds<MAX_LAMBDA_TIMEOUT_SECONDS> {
    DEFAULT_LAMBDA_TIMEOUT_SECONDS
}

fn default_invoke_margin() -> Seconds {
    DEFAULT_INVOKE_MARGIN_SECONDS
}

impl LambdaFunctionTierConfig {
    /// The Invoke deadline after the call starts: `timeout_seconds +
    /// invoke_margin_seconds`. No gateway-wide timeout may end a call earlier
    /// ([`Self::validate_at`] rejects a `gateway.upstream_timeout_seconds` that would).
    pub fn invoke_deadline(&self) -> Duration {
        self.timeout_seconds.get() + self.invoke_margin_seconds.get()
    }

    /// A gateway-wide timeout must not cut an Invoke the function may still answer:
    /// `upstream_timeout` (`gateway.upstream_timeout_seconds`) must be at least
    /// `timeout_seconds + invoke_margin_seconds`; the problem is reported under
    /// `gateway.upstream_timeout_seconds`, naming this section at `at`.
    pub fn check_invoke_deadline(&self, at: &str, upstream_timeout: Seconds, is: &mut Issues) {
        let deadline = self.invoke_deadline();
        if upstream_timeout.get() < deadline {
            let deadline = Seconds::<{ u64::MAX }>::new(deadline);
            is.push(
                "gateway.upstream_timeout_seconds",
                format!(
                    "{upstream_timeout} s would cut Lambda calls before their deadline: \
                     {at}.timeout_seconds ({}) + {at}.invoke_margin_seconds ({}) = \
                     {deadline} s; raise it to at least {deadline} or lower the \
                     function's timeout",
                    self.timeout_seconds, self.invoke_margin_seconds
                ),
            );
        }
    }

    /// Semantic checks of this section at `at` (`function_tier`, `function_zones[1]`),
    /// each reported under `<at>.<field>`.
    pub fn validate_at(&self, at: &str, is: &mut Issues) {
        let name = self.function_name.trim();
        if name.is_empty() {
            is.push(
                format!("{at}.function_name"),
                "must name the function (name or ARN)",
            );
        } else if name.len() > 170 || name.chars().any(|c| c.is_whitespace() || c == '/') {
            is.push(
                format!("{at}.function_name"),
                format!(
                    "must be a function name or ARN (at most 170 characters, no spaces or '/'), got {:?}",
                    self.function_name
                ),
            );
        }
        if let Some(q) = &self.qualifier
            && (q.is_empty()
                || q.len() > 128
                || !q
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '$')))
        {
            is.push(
                format!("{at}.qualifier"),
                format!("must be a version or alias name, got {q:?}"),
            );
        }
        is.nonzero_duration(&format!("{at}.timeout_seconds"), self.timeout_seconds);
        if let Some(region) = &self.region
            && (region.is_empty()
                || !region
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'))
        {
            is.push(
                format!("{at}.region"),
                format!("must be a region name like us-east-1, got {region:?}"),
            );
        }
        if let Some(n) = self.prewarmed_instances.filter(|&n| n > 0) {
            if matches!(self.qualifier.as_deref(), None | Some("$LATEST")) {
                is.push(
                    format!("{at}.prewarmed_instances"),
                    format!(
                        "needs {at}.qualifier (a published version or an alias): \
                         provisioned concurrency cannot be set on $LATEST"
                    ),
                );
            }
            if let Some(max) = self.max_concurrency
                && n > max.get()
            {
                is.push(
                    format!("{at}.prewarmed_instances"),
                    format!("must not exceed {at}.max_concurrency ({n} > {max})"),
                );
            }
        }
        if self.remove_prewarm_on_shutdown && self.prewarmed_instances.unwrap_or(0) == 0 {
            is.push(
                format!("{at}.remove_prewarm_on_shutdown"),
                format!("only applies when {at}.prewarmed_instances is above 0"),
            );
        }
        if self.remove_prewarm_on_start {
            if matches!(self.qualifier.as_deref(), None | Some("$LATEST")) {
                is.push(
                    format!("{at}.remove_prewarm_on_start"),
                    format!(
                        "needs {at}.qualifier (provisioned concurrency lives on a \
                         published version or an alias)"
                    ),
                );
            }
            if self.prewarmed_instances.unwrap_or(0) > 0 {
                is.push(
                    format!("{at}.remove_prewarm_on_start"),
                    format!(
                        "contradicts {at}.prewarmed_instances above 0 (that puts \
                         provisioned concurrency at start)"
                    ),
                );
            }
        }
    }
}
