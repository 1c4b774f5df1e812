//! `function_tier: {type: lambda}`: spilled requests run on an AWS Lambda function called
//! through the Invoke API (issue 4, "Lambda function tier provider"; http-cases C19, C20).
//!
//! One call = one synchronous Invoke (`RequestResponse`) of `function_name[:qualifier]`:
//! 1. an `Upgrade` request is refused ([`FunctionError::UpgradeNotSupported`], a 4xx:
//!    http-cases C6; the balancer pins upgrades to VMs, this is the defensive net);
//! 2. the request body is buffered, at most [`MAX_PAYLOAD_BYTES`]; the event is built by
//!    the pure mapper [`lambda_event`](super::lambda_event), `requestContext.http.sourceIp`
//!    from the [`ClientInfo`] the request path put into the request's extensions;
//!    an event over [`MAX_PAYLOAD_BYTES`] is [`FunctionError::PayloadTooLarge`] (413)
//!    before any invoke;
//! 3. Invoke runs with the SDK's retries **off** (a retry would re-run a non-idempotent
//!    request and hide the 429) and within `timeout_seconds`
//!    ([`FunctionError::TimedOut`], 504);
//! 4. 429 (`TooManyRequestsException`) → [`FunctionError::NotSent`] (throttled) carrying the
//!    original request rebuilt from the buffered body, so the balancer can spill it back
//!    to a VM (a throttled call never ran the function);
//! 5. `X-Amz-Function-Error`, a reply that is not a valid HTTP response, or any other API
//!    failure (access denied, endpoint unreachable) → [`FunctionError::Failed`] (502, the
//!    detail logged and counted in `/status` under `functions.errors`).
//!
//! Response trailers do not exist in the Lambda reply shapes: function routes drop them
//! (http-cases C15).
//!
//! **Pre-warm = provisioned concurrency.** `prewarmed_instances: N` puts N provisioned
//! concurrent executions on `qualifier` at start (PutProvisionedConcurrencyConfig), `0`
//! deletes them at start (DeleteProvisionedConcurrencyConfig), absent leaves them alone.
//! On shutdown they are kept unless `remove_prewarm_on_shutdown: true` (a restart should
//! not lose warm capacity that takes minutes to allocate). A failed call is logged and
//! counted; the gateway keeps serving.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_sdk_lambda::Client;
use aws_sdk_lambda::config::retry::RetryConfig;
use aws_sdk_lambda::error::{DisplayErrorContext, SdkError};
use aws_sdk_lambda::primitives::Blob;
use bytes::{Bytes, BytesMut};
use http::{Request, Response};
use http_body_util::BodyExt;

use super::ec2::classify;
use super::lambda_event::{self, EventError, EventInput, MAX_PAYLOAD_BYTES};
use super::provider_errors::{ErrorKind, ProviderErrorStats, ProviderErrors};
use super::{BackendError, BoxFuture, FunctionError, FunctionTier};
use crate::config::{LambdaFunctionTierConfig, LambdaPayloadFormat};
use crate::net::ClientInfo;
use crate::net::body::{self, Body, BoxError};
use crate::net::headers;
use crate::policy::attempt::NotSentReason;
use crate::policy::functions::InstanceId;

/// The `provider` label of this tier's errors.
pub const PROVIDER: &str = "lambda";

/// Connect timeout to the Lambda API endpoint.
pub const API_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// Longest the provisioned-concurrency calls (start, shutdown) may take.
pub const PREWARM_CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// A Lambda function tier. See the [module docs](self).
#[derive(Debug)]
pub struct LambdaFunctionTier {
    client: Client,
    function_name: String,
    qualifier: Option<String>,
    format: LambdaPayloadFormat,
    timeout: Duration,
    prewarmed: Option<u32>,
    remove_prewarm_on_shutdown: bool,
    closed: AtomicBool,
    errors: ProviderErrors,
}

impl LambdaFunctionTier {
    /// Load the AWS SDK configuration (credentials only from the default chain; region
    /// and endpoint from `cfg` when set) and build the tier. No API call is made here;
    /// call [`LambdaFunctionTier::start`] to apply the pre-warm setting.
    ///
    /// # Errors
    /// [`BackendError::Provider`] when no region is configured anywhere
    /// (`function_tier.region`, `AWS_REGION`, the profile).
    pub async fn new(cfg: &LambdaFunctionTierConfig) -> Result<Arc<Self>, BackendError> {
        // Invoke turns retries off per operation; the provisioned-concurrency calls keep
        // the SDK's standard retries.
        let sdk = super::aws_sdk::load(
            "lambda",
            "function_tier",
            cfg.region.as_deref(),
            cfg.endpoint_url.as_deref(),
            aws_config::timeout::TimeoutConfig::builder()
                .connect_timeout(API_CONNECT_TIMEOUT)
                .build(),
            aws_config::retry::RetryConfig::standard(),
        )
        .await?;
        Ok(Arc::new(Self {
            client: Client::new(&sdk),
            function_name: cfg.function_name.clone(),
            qualifier: cfg.qualifier.clone(),
            format: cfg.payload_format,
            timeout: Duration::from_secs_f64(cfg.timeout_seconds),
            prewarmed: cfg.prewarmed_instances,
            remove_prewarm_on_shutdown: cfg.remove_prewarm_on_shutdown,
            closed: AtomicBool::new(false),
            errors: ProviderErrors::new(PROVIDER),
        }))
    }

    /// Apply `prewarmed_instances` in the background (see the [module docs](self)).
    pub fn start(self: &Arc<Self>) {
        if self.prewarmed.is_none() {
            return;
        }
        let me = Arc::clone(self);
        tokio::spawn(async move {
            let _ = me.apply_prewarm(me.prewarmed).await;
        });
    }

    /// Set the provisioned concurrency on the qualifier: `Some(n > 0)` puts n, `Some(0)`
    /// deletes it (a missing config is fine), `None` does nothing.
    ///
    /// # Errors
    /// [`BackendError::Provider`] when the API call fails (also logged and counted).
    pub async fn apply_prewarm(&self, wanted: Option<u32>) -> Result<(), BackendError> {
        let (Some(n), Some(qualifier)) = (wanted, self.qualifier.as_deref()) else {
            return Ok(());
        };
        if n > 0 {
            let call = self
                .client
                .put_provisioned_concurrency_config()
                .function_name(&self.function_name)
                .qualifier(qualifier)
                .provisioned_concurrent_executions(i32::try_from(n).unwrap_or(i32::MAX))
                .send();
            match tokio::time::timeout(PREWARM_CALL_TIMEOUT, call).await {
                Ok(Ok(out)) => {
                    tracing::info!(
                        function = %self.function_name,
                        qualifier,
                        requested = n,
                        status = ?out.status(),
                        "provisioned concurrency requested"
                    );
                    Ok(())
                }
                Ok(Err(e)) => Err(self.api_error("put_provisioned_concurrency_config", &e)),
                Err(_) => Err(self.timeout_error("put_provisioned_concurrency_config")),
            }
        } else {
            let call = self
                .client
                .delete_provisioned_concurrency_config()
                .function_name(&self.function_name)
                .qualifier(qualifier)
                .send();
            match tokio::time::timeout(PREWARM_CALL_TIMEOUT, call).await {
                Ok(Ok(_)) => {
                    tracing::info!(function = %self.function_name, qualifier, "provisioned concurrency removed");
                    Ok(())
                }
                Ok(Err(e))
                    if e.as_service_error()
                        .is_some_and(|s| s.is_resource_not_found_exception()) =>
                {
                    Ok(())
                }
                Ok(Err(e)) => Err(self.api_error("delete_provisioned_concurrency_config", &e)),
                Err(_) => Err(self.timeout_error("delete_provisioned_concurrency_config")),
            }
        }
    }

    fn api_error<E>(&self, operation: &'static str, e: &SdkError<E>) -> BackendError
    where
        E: aws_sdk_lambda::error::ProvideErrorMetadata + std::error::Error + 'static,
    {
        let message = format!("{operation}: {}", DisplayErrorContext(e));
        self.errors.record(operation, classify(e), &message);
        BackendError::Provider(message)
    }

    fn timeout_error(&self, operation: &'static str) -> BackendError {
        let message = format!("{operation}: no answer within {PREWARM_CALL_TIMEOUT:?}");
        self.errors.record(operation, ErrorKind::Timeout, &message);
        BackendError::Provider(message)
    }

    async fn call(&self, req: Request<Body>) -> Result<Response<Body>, FunctionError> {
        if headers::wants_upgrade(req.headers()) {
            return Err(FunctionError::UpgradeNotSupported);
        }
        let (parts, body) = req.into_parts();
        let bytes = match read_body(body).await {
            Ok(bytes) => bytes,
            Err(ReadError::TooLarge) => {
                return Err(FunctionError::PayloadTooLarge {
                    limit: MAX_PAYLOAD_BYTES as u64,
                });
            }
            Err(ReadError::Body(e)) if is_length_limit(&*e) => {
                return Err(FunctionError::PayloadTooLarge {
                    limit: MAX_PAYLOAD_BYTES as u64,
                });
            }
            Err(ReadError::Body(e)) => {
                // The client went away or the gateway's own body limit tripped: the
                // request path maps a length-limit error to 413.
                return Err(FunctionError::RequestBody(e));
            }
        };
        let client = parts.extensions.get::<ClientInfo>().copied();
        let request_id = format!("{:032x}", rand::random::<u128>());
        // The event's wall-clock timestamp (`requestContext.timeEpoch`); not a timer.
        #[allow(clippy::disallowed_methods)]
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        let input = EventInput {
            method: &parts.method,
            uri: &parts.uri,
            version: parts.version,
            headers: &parts.headers,
            body: &bytes,
            source_ip: client.map(|c: ClientInfo| c.peer.ip()),
            request_id: &request_id,
            time_epoch_ms: now_ms,
        };
        let event = match lambda_event::build_event(self.format, &input) {
            Ok(ev) => ev,
            Err(EventError::TooLarge { .. }) => {
                return Err(FunctionError::PayloadTooLarge {
                    limit: MAX_PAYLOAD_BYTES as u64,
                });
            }
            Err(e @ EventError::Encode(_)) => return Err(FunctionError::Failed(e.to_string())),
        };

        let invoke = self
            .client
            .invoke()
            .function_name(&self.function_name)
            .set_qualifier(self.qualifier.clone())
            .payload(Blob::new(event))
            .customize()
            .config_override(
                aws_sdk_lambda::config::Builder::default().retry_config(RetryConfig::disabled()),
            )
            .send();
        let out = match tokio::time::timeout(self.timeout, invoke).await {
            Err(_) => {
                self.errors.record(
                    "invoke",
                    ErrorKind::Timeout,
                    format!("{}: no reply within {:?}", self.function_name, self.timeout),
                );
                return Err(FunctionError::TimedOut(self.timeout));
            }
            Ok(Ok(out)) => out,
            Ok(Err(e)) => {
                let throttled = e
                    .as_service_error()
                    .is_some_and(|s| s.is_too_many_requests_exception())
                    || e.raw_response().is_some_and(|r| r.status().as_u16() == 429);
                if throttled {
                    // The function did not run: hand the untouched request back.
                    let back = Request::from_parts(parts, body::full(bytes));
                    return Err(FunctionError::not_sent(NotSentReason::Throttled, back));
                }
                let message = format!("invoke {}: {}", self.function_name, DisplayErrorContext(&e));
                self.errors.record("invoke", classify(&e), &message);
                return Err(FunctionError::Failed(message));
            }
        };
        if let Some(kind) = out.function_error() {
            let detail = out
                .payload()
                .map(|p| {
                    String::from_utf8_lossy(&p.as_ref()[..p.as_ref().len().min(512)]).into_owned()
                })
                .unwrap_or_default();
            let message = format!("{}: function error {kind}: {detail}", self.function_name);
            self.errors.record("function", ErrorKind::Other, &message);
            return Err(FunctionError::Failed(message));
        }
        let payload = out.payload().map(|p| p.as_ref()).unwrap_or_default();
        match lambda_event::build_response(self.format, payload) {
            Ok(resp) => Ok(resp.map(body::full)),
            Err(e) => {
                let message = format!("{}: bad reply: {e}", self.function_name);
                self.errors.record("function", ErrorKind::Other, &message);
                Err(FunctionError::Failed(message))
            }
        }
    }
}

/// Why the request body could not be buffered.
enum ReadError {
    /// Over [`MAX_PAYLOAD_BYTES`].
    TooLarge,
    /// The body stream failed.
    Body(BoxError),
}

/// The whole body, at most [`MAX_PAYLOAD_BYTES`] (bounded buffering: reading stops at
/// the first chunk past the limit).
async fn read_body(mut body: Body) -> Result<Bytes, ReadError> {
    let mut buf = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(ReadError::Body)?;
        if let Ok(data) = frame.into_data() {
            if buf.len() + data.len() > MAX_PAYLOAD_BYTES {
                return Err(ReadError::TooLarge);
            }
            buf.extend_from_slice(&data);
        }
    }
    Ok(buf.freeze())
}

fn is_length_limit(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut source = Some(e);
    while let Some(err) = source {
        if err.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        source = err.source();
    }
    false
}

impl FunctionTier for LambdaFunctionTier {
    fn kind(&self) -> &'static str {
        "lambda"
    }

    /// One Invoke. See the [module docs](self) for every outcome.
    ///
    /// # Errors
    /// [`FunctionError::NotSent`] (429, or after shutdown: request handed back),
    /// [`FunctionError::PayloadTooLarge`], [`FunctionError::UpgradeNotSupported`],
    /// [`FunctionError::TimedOut`], [`FunctionError::Failed`],
    /// [`FunctionError::RequestBody`]. `max_concurrency` is the policy core's business
    /// (a concurrency zone), not this tier's.
    fn invoke(
        &self,
        _instance: Option<InstanceId>,
        req: Request<Body>,
    ) -> BoxFuture<'_, Result<Response<Body>, FunctionError>> {
        Box::pin(async move {
            if self.closed.load(Ordering::Relaxed) {
                return Err(FunctionError::not_sent(NotSentReason::ShuttingDown, req));
            }
            self.call(req).await
        })
    }

    fn errors(&self) -> ProviderErrorStats {
        self.errors.snapshot()
    }

    /// Later calls are not sent (handed back); with `remove_prewarm_on_shutdown` the
    /// provisioned concurrency is deleted (errors are logged and counted).
    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            self.closed.store(true, Ordering::Relaxed);
            if self.remove_prewarm_on_shutdown && self.prewarmed.is_some() {
                let _ = self.apply_prewarm(Some(0)).await;
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::body::{empty, full};

    /// A tier whose endpoint is a closed port: any call that reached the API would be a
    /// `Failed` (unreachable), so the other outcomes prove no invoke happened.
    async fn tier(extra: impl FnOnce(&mut LambdaFunctionTierConfig)) -> Arc<LambdaFunctionTier> {
        let port = crate::backends::process::free_port().unwrap();
        let mut cfg = LambdaFunctionTierConfig {
            function_name: "f".into(),
            qualifier: None,
            payload_format: LambdaPayloadFormat::V2,
            timeout_seconds: 5.0,
            region: Some("us-east-1".into()),
            endpoint_url: Some(format!("http://127.0.0.1:{port}")),
            max_concurrency: None,
            prewarmed_instances: None,
            remove_prewarm_on_shutdown: false,
        };
        extra(&mut cfg);
        LambdaFunctionTier::new(&cfg).await.unwrap()
    }

    #[tokio::test]
    async fn upgrade_requests_are_refused_before_any_call() {
        let t = tier(|_| {}).await;
        let req = Request::get("/ws")
            .header("connection", "upgrade")
            .header("upgrade", "websocket")
            .body(empty())
            .unwrap();
        assert!(matches!(
            t.invoke(None, req).await,
            Err(FunctionError::UpgradeNotSupported)
        ));
        assert_eq!(t.errors().total, 0);
    }

    #[tokio::test]
    async fn oversized_bodies_are_refused_before_any_call() {
        let t = tier(|_| {}).await;
        let req = Request::post("/")
            .body(full(vec![1u8; MAX_PAYLOAD_BYTES + 1]))
            .unwrap();
        assert!(matches!(
            t.invoke(None, req).await,
            Err(FunctionError::PayloadTooLarge { limit }) if limit == 6_291_456
        ));
        assert_eq!(t.errors().total, 0, "no API call was made");
    }

    #[tokio::test]
    async fn shutdown_hands_the_request_back() {
        let t = tier(|c| c.max_concurrency = Some(1)).await;
        t.shutdown().await;
        let req = Request::put("/b")
            .header("x-test", "kept")
            .body(full("data"))
            .unwrap();
        let Err(FunctionError::NotSent {
            reason: NotSentReason::ShuttingDown,
            request: Some(back),
        }) = t.invoke(None, req).await
        else {
            panic!("expected the request back")
        };
        assert_eq!(back.method(), http::Method::PUT);
        assert_eq!(back.headers()["x-test"], "kept");
        assert_eq!(
            &back.into_body().collect().await.unwrap().to_bytes()[..],
            b"data"
        );
        assert_eq!(t.errors().total, 0, "no API call was made");
    }

    /// Without credentials in the test environment the SDK fails before dispatch; with
    /// them the closed port fails the dispatch (`unreachable`, tests/aws_lambda.rs).
    /// Either way: a recorded 502-class failure, nothing left in flight.
    #[tokio::test]
    async fn a_failed_api_call_is_recorded() {
        let t = tier(|_| {}).await;
        let r = t
            .invoke(None, Request::get("/").body(empty()).unwrap())
            .await;
        assert!(matches!(r, Err(FunctionError::Failed(_))), "{r:?}");
        let e = t.errors();
        assert_eq!(e.total, 1);
        assert_eq!(e.last.unwrap().operation, "invoke");
    }
}
