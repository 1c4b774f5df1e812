//! Loading the AWS SDK configuration, shared by the EC2 and Lambda providers: credentials
//! only from `aws-config`'s default chain, the region and endpoint URL from the provider's
//! config section (falling back to `AWS_REGION` / the profile), and per-provider timeouts
//! and retries. Every call goes through [`super::aws_http::keepalive_client`] (TCP
//! keepalive).

use super::BackendError;

/// TCP connect timeout to an AWS API when the provider sets none.
const DEFAULT_CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

/// The SDK configuration for `provider` (`"ec2"`, `"lambda"`, used in errors).
///
/// # Errors
/// [`BackendError::Provider`] when no region is configured anywhere (`section.region`,
/// `AWS_REGION`, the profile).
pub async fn load(
    provider: &str,
    section: &str,
    region: Option<&str>,
    endpoint_url: Option<&str>,
    timeouts: aws_config::timeout::TimeoutConfig,
    retries: aws_config::retry::RetryConfig,
) -> Result<aws_config::SdkConfig, BackendError> {
    let connect_timeout = timeouts
        .connect_timeout()
        .unwrap_or(DEFAULT_CONNECT_TIMEOUT);
    let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .http_client(super::aws_http::keepalive_client(connect_timeout))
        .timeout_config(timeouts)
        .retry_config(retries);
    if let Some(region) = region {
        loader = loader.region(aws_config::Region::new(region.to_string()));
    }
    if let Some(url) = endpoint_url {
        loader = loader.endpoint_url(url);
    }
    let sdk = loader.load().await;
    if sdk.region().is_none() {
        return Err(BackendError::Provider(format!(
            "{provider}: no AWS region: set {section}.region or AWS_REGION"
        )));
    }
    Ok(sdk)
}
