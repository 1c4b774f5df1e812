//! One factory per provider section: [`build_vm_pool`] turns a `vm_pool:` section into
//! its provider, [`build_zone`] a function zone's provider (a `function_tier:` section)
//! into its tier. The gateway only wires what these return; a new provider adds its arm
//! here and nowhere in the gateway.

use std::path::PathBuf;
use std::sync::Arc;

use super::function_http::HttpFunctionTier;
use super::function_process::ProcessFunctionTier;
use super::vm_process::ProcessVmPool;
use super::vm_static::StaticVmPool;
use super::{BackendError, FunctionTier, ReadinessSettings, VmProvider};
use crate::config::{FunctionTierConfig, VmPoolConfig};
use crate::net::client::UpstreamClient;

/// What the factories need from the gateway.
#[derive(Clone)]
pub struct BuildContext {
    /// The running binary, for the `{spillway}` placeholder of local commands.
    pub spillway_exe: PathBuf,
    /// The client for user-given upstreams (static URLs, HTTP functions, EC2 VMs):
    /// `gateway.allow_loopback_upstreams` and `gateway.upstream_tls` apply.
    pub upstream_client: UpstreamClient,
    /// The client for the gateway's own child processes on loopback.
    pub local_client: UpstreamClient,
    /// `gateway.allow_loopback_upstreams`.
    pub allow_loopback_upstreams: bool,
    /// Coordinated replicas share one pool (`coordination: {type: redis}`).
    pub shared_pool: bool,
    /// `gateway.connect_timeout_seconds`: the bound of an `http` zone's `/readyz`
    /// connect probe.
    pub connect_timeout: std::time::Duration,
}

/// Why a provider could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The provider failed to set up.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// The section names an AWS provider but this binary lacks the `aws` feature; the
    /// text names the section (`vm_pool (type: ec2)`).
    #[error("{0} needs AWS support, but spillway was built without the `aws` feature")]
    AwsFeatureDisabled(&'static str),
}

/// A VM pool provider with the settings the driver needs beside it.
pub struct VmPool {
    /// The provider.
    pub provider: Arc<dyn VmProvider>,
    /// Readiness probe of a new VM.
    pub readiness: ReadinessSettings,
    /// The client the driver reaches the pool's VMs with.
    pub client: UpstreamClient,
}

/// The provider of a `vm_pool:` section.
///
/// # Errors
/// [`BuildError::Backend`] when the provider cannot be set up (a static URL that does not
/// parse, no AWS region), [`BuildError::AwsFeatureDisabled`] for `ec2` without the `aws`
/// feature.
pub async fn build_vm_pool(cfg: &VmPoolConfig, ctx: &BuildContext) -> Result<VmPool, BuildError> {
    Ok(match cfg {
        VmPoolConfig::Process(p) => {
            let pool = ProcessVmPool::new(p, ctx.spillway_exe.clone());
            let pool = if ctx.shared_pool { pool.shared() } else { pool };
            VmPool {
                readiness: pool.readiness().clone(),
                provider: Arc::new(pool),
                client: ctx.local_client.clone(),
            }
        }
        VmPoolConfig::Static(s) => VmPool {
            provider: Arc::new(StaticVmPool::new(s)),
            // Static upstreams are adopted as ready; these only apply to the probe
            // after a connect failure.
            readiness: ReadinessSettings::new(
                "/",
                std::time::Duration::from_secs(1),
                std::time::Duration::from_millis(100),
            ),
            client: ctx.upstream_client.clone(),
        },
        #[cfg(feature = "aws")]
        VmPoolConfig::Ec2(e) => VmPool {
            provider: Arc::new(
                super::ec2::Ec2VmPool::new(
                    e,
                    ctx.upstream_client.clone(),
                    ctx.allow_loopback_upstreams,
                    ctx.shared_pool,
                )
                .await?,
            ),
            readiness: ReadinessSettings::new(
                &e.health_path,
                e.boot_timeout_seconds,
                e.probe_interval_seconds,
            ),
            client: ctx.upstream_client.clone(),
        },
        #[cfg(not(feature = "aws"))]
        VmPoolConfig::Ec2(_) => return Err(BuildError::AwsFeatureDisabled("vm_pool (type: ec2)")),
    })
}

/// The tier of one function zone's provider (a `function_tier:` section, or a
/// `function_zones` entry's).
///
/// # Errors
/// [`BuildError::Backend`] when the provider cannot be set up (a URL that does not parse,
/// no AWS region), [`BuildError::AwsFeatureDisabled`] for `lambda` without the `aws`
/// feature.
pub async fn build_zone(
    cfg: &FunctionTierConfig,
    ctx: &BuildContext,
) -> Result<Arc<dyn FunctionTier>, BuildError> {
    Ok(match cfg {
        FunctionTierConfig::Process(f) => {
            ProcessFunctionTier::new(f, ctx.spillway_exe.clone(), ctx.local_client.clone())
        }
        FunctionTierConfig::Http(h) => Arc::new(
            HttpFunctionTier::new(h, ctx.upstream_client.clone())
                .with_probe_timeout(ctx.connect_timeout),
        ),
        #[cfg(feature = "aws")]
        FunctionTierConfig::Lambda(l) => {
            let tier = super::lambda::LambdaFunctionTier::new(l).await?;
            tier.start();
            tier
        }
        #[cfg(not(feature = "aws"))]
        FunctionTierConfig::Lambda(_) => {
            return Err(BuildError::AwsFeatureDisabled(
                "function_tier (type: lambda)",
            ));
        }
    })
}
