//! `function_tier: {type: lambda}`: spilled requests run on an AWS Lambda function called
//! through the Invoke API (http-cases C19, C20).
//!
//! One call = one synchronous Invoke (`RequestResponse`) of `function_name[:qualifier]`:
//! 1. an `Upgrade` request is refused ([`FunctionError::UpgradeNotSupported`], a 4xx:
//!    http-cases C6; the balancer pins upgrades to VMs, this is the defensive net);
//! 2. the request body is buffered, at most [`MAX_PAYLOAD_BYTES`]; the event is built by
//!    the pure mapper [`super::lambda_event`], `requestContext.http.sourceIp`
//!    from the [`ClientInfo`] the request path put into the request's extensions;
//!    an event over [`MAX_PAYLOAD_BYTES`] is [`FunctionError::PayloadTooLarge`] (413)
//!    before any invoke;
//! 3. Invoke runs with the SDK's retries **off** (a retry would re-run a non-idempotent
//!    request and hide the 429) and within the Invoke deadline `timeout_seconds +
//!    invoke_margin_seconds` ([`FunctionError::TimedOut`], 504);
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
//! **Tracing**: the Invoke request carries an `X-Amzn-Trace-Id`
//! header so that the function's X-Ray segment joins the caller's trace
//! ([`xray_trace_header`]: rebuilt from the request's own `X-Amzn-Trace-Id` — only its
//! `Root`, `Parent` and `Sampled` fields, each checked — else derived from a W3C
//! `traceparent`). A client's header is never passed on as it came: Lambda reads more
//! than the trace id from it (the `Lineage` field drives its recursive-loop detection,
//! which stops a function that seems to call itself), so every other field is dropped.
//! The event's `headers` carry the same rebuilt `x-amzn-trace-id` (none when the
//! client's was not valid) and the `traceparent` (the client's, or one the gateway started).
//!
//! **Errors where the function never ran** ([`never_ran`]): Lambda
//! rejects some Invoke calls before any code runs (the version is not ready, ENIs or
//! subnet addresses ran out, the KMS key is unusable, …). Like a 429, such a call is
//! reported as not sent (`NotSentReason::NeverRan`, the request handed back): the policy
//! core places it in the next zone or falls back to a VM with a free slot, else 502. The
//! error is still recorded under `functions.errors`.
//!
//! **Pre-warm = provisioned concurrency.** `prewarmed_instances: N > 0` puts N
//! provisioned concurrent executions on `qualifier` at start
//! (PutProvisionedConcurrencyConfig), then polls GetProvisionedConcurrencyConfig (every
//! [`PREWARM_POLL_FIRST`], doubling to [`PREWARM_POLL_MAX`]) until the status is `READY`
//! or `FAILED`; the status, its reason and the allocated count are shown in `/status` as
//! `functions.errors.conditions.provisioned_concurrency` (an alarm when `FAILED`).
//! `remove_prewarm_on_start: true` deletes it at start (DeleteProvisionedConcurrencyConfig);
//! `prewarmed_instances: 0` or absent leaves it alone (earlier versions deleted it on `0`).
//! On shutdown it is kept unless `remove_prewarm_on_shutdown: true` (a restart should
//! not lose warm capacity that takes minutes to allocate). A failed call is logged and
//! counted; the gateway keeps serving.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_sdk_lambda::Client;
use aws_sdk_lambda::config::retry::RetryConfig;
use aws_sdk_lambda::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_lambda::primitives::Blob;
use bytes::{Bytes, BytesMut};
use http::{Request, Response};
use http_body_util::BodyExt;

use super::ec2::classify;
use super::lambda_event::{self, EventError, EventInput, MAX_PAYLOAD_BYTES};
use super::provider_errors::{ErrorKind, ProviderErrorStats, ProviderErrors};
use super::{BackendError, BoxFuture, FunctionError, FunctionTier};
use crate::config::{HttpUrl, LambdaFunctionTierConfig, LambdaPayloadFormat};
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

/// First pause before polling a provisioned-concurrency config after Put; doubles up to
/// [`PREWARM_POLL_MAX`].
pub const PREWARM_POLL_FIRST: Duration = Duration::from_secs(1);

/// Longest pause between two polls of a provisioned-concurrency config.
pub const PREWARM_POLL_MAX: Duration = Duration::from_secs(30);

/// How long the gateway polls a provisioned-concurrency config that is still
/// `IN_PROGRESS` (allocation normally takes minutes); afterwards `/status` keeps the last
/// state seen.
pub const PREWARM_POLL_FOR: Duration = Duration::from_secs(30 * 60);

/// The `/status` condition name of the provisioned concurrency.
pub const PREWARM_CONDITION: &str = "provisioned_concurrency";

/// Invoke error codes that mean the function never ran: the call was
/// refused before any code of the function executed, so the request may be placed
/// elsewhere, as after a 429. From the Invoke API reference's error list.
pub const NEVER_RAN_ERROR_CODES: [&str; 11] = [
    "TooManyRequestsException",
    "ResourceNotReadyException",
    "ResourceConflictException",
    "EC2ThrottledException",
    "ENILimitReachedException",
    "SubnetIPAddressLimitReachedException",
    "EFSMountConnectivityException",
    "KMSAccessDeniedException",
    "KMSDisabledException",
    "KMSNotFoundException",
    "SnapStartNotReadyException",
];

/// Whether an Invoke error `code` (the `x-amzn-ErrorType` of the reply) means the
/// function never ran: one of [`NEVER_RAN_ERROR_CODES`]. Errors raised while or after
/// the function ran (`X-Amz-Function-Error`, `EC2UnexpectedException`,
/// `EFSIOException`, `RequestTooLargeException` …), and every unknown code, are not.
pub fn never_ran(code: &str) -> bool {
    NEVER_RAN_ERROR_CODES.contains(&code)
}

/// The `X-Amzn-Trace-Id` to send with the Invoke call for a request with `headers`:
/// * rebuilt from the request's own `X-Amzn-Trace-Id` when it holds a valid root
///   (`Root=1-<8 hex>-<24 hex>`, lower case): `Root=…[;Parent=<16 hex>][;Sampled=0|1]`,
///   each kept only when valid; every other field (`Lineage`, `Self`, custom ones) is
///   dropped, so a client cannot feed Lambda's recursive-loop detection or other
///   fields;
/// * else one derived from a valid W3C `traceparent`
///   (`00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>`, not all-zero ids) as X-Ray
///   does: `Root=1-<first 8 hex>-<last 24 hex>;Parent=<parent id>;Sampled=<flags & 1>`;
/// * else `None` (Lambda starts a trace of its own).
pub fn xray_trace_header(headers: &http::HeaderMap) -> Option<http::HeaderValue> {
    const XRAY: &str = "x-amzn-trace-id";
    let hex = |s: &str, n: usize| {
        s.len() == n && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    };
    if let Some(own) = headers
        .get(XRAY)
        .filter(|v| v.len() <= 512)
        .and_then(|v| v.to_str().ok())
    {
        let field = |name: &str| {
            own.split(';').find_map(|part| {
                let (k, v) = part.trim().split_once('=')?;
                (k.trim() == name).then(|| v.trim())
            })
        };
        let root = field("Root").filter(|r| {
            let mut p = r.split('-');
            p.next() == Some("1")
                && p.next().is_some_and(|t| hex(t, 8))
                && p.next().is_some_and(|u| hex(u, 24))
                && p.next().is_none()
        });
        if let Some(root) = root {
            let mut out = format!("Root={root}");
            if let Some(parent) = field("Parent").filter(|p| hex(p, 16)) {
                out.push_str(&format!(";Parent={parent}"));
            }
            if let Some(sampled) = field("Sampled").filter(|s| matches!(*s, "0" | "1")) {
                out.push_str(&format!(";Sampled={sampled}"));
            }
            return http::HeaderValue::from_str(&out).ok();
        }
    }
    let tp = headers.get("traceparent")?.to_str().ok()?.trim();
    let mut parts = tp.split('-');
    let (version, trace, parent, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let zero = |s: &str| s.bytes().all(|b| b == b'0');
    let valid = hex(version, 2)
        && version != "ff"
        && hex(trace, 32)
        && hex(parent, 16)
        && hex(flags, 2)
        && !zero(trace)
        && !zero(parent)
        && !(version == "00" && parts.next().is_some());
    if !valid {
        return None;
    }
    let sampled = u8::from_str_radix(flags, 16).ok()? & 1;
    http::HeaderValue::from_str(&format!(
        "Root=1-{}-{};Parent={parent};Sampled={sampled}",
        &trace[..8],
        &trace[8..]
    ))
    .ok()
}
/// A Lambda function tier. See the [module docs](self).
#[derive(Debug)]
pub struct LambdaFunctionTier {
    client: Client,
    function_name: String,
    qualifier: Option<String>,
    format: LambdaPayloadFormat,
    timeout: Duration,
    prewarmed: Option<u32>,
    remove_prewarm_on_start: bool,
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
            cfg.endpoint_url.as_ref().map(HttpUrl::as_str),
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
            timeout: cfg.invoke_deadline(),
            prewarmed: cfg.prewarmed_instances,
            remove_prewarm_on_start: cfg.remove_prewarm_on_start,
            remove_prewarm_on_shutdown: cfg.remove_prewarm_on_shutdown,
            closed: AtomicBool::new(false),
            errors: ProviderErrors::new(PROVIDER),
        }))
    }

    /// Apply `prewarmed_instances` and `remove_prewarm_on_start` in the background, and
    /// follow a Put until `READY` or `FAILED` (see the [module docs](self)).
    pub fn start(self: &Arc<Self>) {
        let wanted = match self.prewarmed {
            Some(n) if n > 0 => Some(n),
            _ if self.remove_prewarm_on_start => Some(0),
            _ => None,
        };
        if wanted.is_none() {
            return;
        }
        let me = Arc::clone(self);
        tokio::spawn(async move {
            if me.apply_prewarm(wanted).await.is_ok() && wanted.is_some_and(|n| n > 0) {
                me.follow_prewarm().await;
            }
        });
    }

    /// Set the provisioned concurrency on the qualifier: `Some(n > 0)` puts n, `Some(0)`
    /// deletes it (a missing config is fine), `None` does nothing. A Put records the
    /// status it returns in `/status`.
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
                    self.record_prewarm(
                        out.status().map(|s| s.as_str()),
                        out.status_reason(),
                        out.requested_provisioned_concurrent_executions(),
                        out.allocated_provisioned_concurrent_executions(),
                        out.available_provisioned_concurrent_executions(),
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
                    self.errors.clear_condition(PREWARM_CONDITION);
                    Ok(())
                }
                Ok(Err(e))
                    if e.as_service_error()
                        .is_some_and(|s| s.is_resource_not_found_exception()) =>
                {
                    self.errors.clear_condition(PREWARM_CONDITION);
                    Ok(())
                }
                Ok(Err(e)) => Err(self.api_error("delete_provisioned_concurrency_config", &e)),
                Err(_) => Err(self.timeout_error("delete_provisioned_concurrency_config")),
            }
        }
    }

    /// Poll GetProvisionedConcurrencyConfig until `READY` or `FAILED`, the gateway
    /// shuts down, or [`PREWARM_POLL_FOR`] has passed; every answer goes to `/status`.
    /// API errors are recorded and retried at the next poll.
    async fn follow_prewarm(&self) {
        let Some(qualifier) = self.qualifier.as_deref() else {
            return;
        };
        let started = tokio::time::Instant::now();
        let mut pause = PREWARM_POLL_FIRST;
        while started.elapsed() < PREWARM_POLL_FOR && !self.closed.load(Ordering::Relaxed) {
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(PREWARM_POLL_MAX);
            let call = self
                .client
                .get_provisioned_concurrency_config()
                .function_name(&self.function_name)
                .qualifier(qualifier)
                .send();
            match tokio::time::timeout(PREWARM_CALL_TIMEOUT, call).await {
                Ok(Ok(out)) => {
                    let state = out.status().map(|s| s.as_str().to_owned());
                    self.record_prewarm(
                        state.as_deref(),
                        out.status_reason(),
                        out.requested_provisioned_concurrent_executions(),
                        out.allocated_provisioned_concurrent_executions(),
                        out.available_provisioned_concurrent_executions(),
                    );
                    if matches!(state.as_deref(), Some("READY" | "FAILED")) {
                        return;
                    }
                }
                Ok(Err(e)) => {
                    let _ = self.api_error("get_provisioned_concurrency_config", &e);
                }
                Err(_) => {
                    let _ = self.timeout_error("get_provisioned_concurrency_config");
                }
            }
        }
    }

    /// The provisioned-concurrency status for `/status`: an alarm when `FAILED`.
    fn record_prewarm(
        &self,
        state: Option<&str>,
        reason: Option<&str>,
        requested: Option<i32>,
        allocated: Option<i32>,
        available: Option<i32>,
    ) {
        let state = state.unwrap_or("UNKNOWN");
        let mut detail = serde_json::Map::new();
        for (k, v) in [
            ("requested", requested),
            ("allocated", allocated),
            ("available", available),
        ] {
            if let Some(v) = v {
                detail.insert(k.into(), v.into());
            }
        }
        if let Some(q) = &self.qualifier {
            detail.insert("qualifier".into(), q.clone().into());
        }
        self.errors.set_condition(
            PREWARM_CONDITION,
            state,
            state == "FAILED",
            reason.filter(|r| !r.is_empty()).map(str::to_owned),
            detail,
        );
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
        let (mut parts, body) = req.into_parts();
        // The event shows the function the trace header the Invoke call carries.
        let trace = xray_trace_header(&parts.headers);
        match &trace {
            Some(v) => {
                parts.headers.insert("x-amzn-trace-id", v.clone());
            }
            None => {
                parts.headers.remove("x-amzn-trace-id");
            }
        }
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
        // The gateway's request id (`crate::net::request_id`, set on every request
        // before it is routed) is the event's `requestContext.requestId` too.
        let request_id = parts
            .headers
            .get(crate::net::request_id::REQUEST_ID)
            .and_then(|v| v.to_str().ok())
            .map_or_else(crate::net::request_id::generate, str::to_owned);
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

        let mut invoke = self
            .client
            .invoke()
            .function_name(&self.function_name)
            .set_qualifier(self.qualifier.clone())
            .payload(Blob::new(event))
            .customize()
            .config_override(
                aws_sdk_lambda::config::Builder::default().retry_config(RetryConfig::disabled()),
            );
        if let Some(trace) = trace.and_then(|v| v.to_str().ok().map(str::to_owned)) {
            invoke = invoke.mutate_request(move |r| {
                r.headers_mut().insert("x-amzn-trace-id", trace.clone());
            });
        }
        let invoke = invoke.send();
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
                let code = e.as_service_error().and_then(ProvideErrorMetadata::code);
                if code.is_some_and(never_ran) {
                    // The function never ran: hand the request back so
                    // the core places it elsewhere, as after a 429.
                    let back = Request::from_parts(parts, body::full(bytes));
                    return Err(FunctionError::not_sent(NotSentReason::NeverRan, back));
                }
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
            if self.remove_prewarm_on_shutdown && self.prewarmed.is_some_and(|n| n > 0) {
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
            timeout_seconds: crate::config::Seconds::from_secs(5),
            invoke_margin_seconds: crate::config::Seconds::from_secs(1),
            region: Some("us-east-1".into()),
            endpoint_url: Some(format!("http://127.0.0.1:{port}").parse().unwrap()),
            max_concurrency: None,
            prewarmed_instances: None,
            remove_prewarm_on_start: false,
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
        let t = tier(|c| c.max_concurrency = std::num::NonZeroU32::new(1)).await;
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

    #[test]
    fn never_ran_names_exactly_the_errors_before_any_code_ran() {
        for code in [
            "ResourceNotReadyException",
            "ResourceConflictException",
            "EC2ThrottledException",
            "ENILimitReachedException",
            "SubnetIPAddressLimitReachedException",
            "EFSMountConnectivityException",
            "KMSAccessDeniedException",
            "KMSDisabledException",
            "KMSNotFoundException",
            "SnapStartNotReadyException",
            "TooManyRequestsException",
        ] {
            assert!(never_ran(code), "{code}");
        }
        // The function ran (or may have), or the request itself is wrong.
        for code in [
            "EC2UnexpectedException",
            "EFSIOException",
            "EFSMountFailureException",
            "EFSMountTimeoutException",
            "InvalidRuntimeException",
            "RequestTooLargeException",
            "ResourceNotFoundException",
            "ServiceException",
            "AccessDeniedException",
            "Unhandled",
            "",
            "resourcenotreadyexception",
        ] {
            assert!(!never_ran(code), "{code}");
        }
    }

    fn headers(pairs: &[(&str, &str)]) -> http::HeaderMap {
        pairs
            .iter()
            .map(|(k, v)| {
                (
                    http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                    http::HeaderValue::from_str(v).unwrap(),
                )
            })
            .collect()
    }

    #[test]
    fn xray_header_is_passed_on_or_derived_from_traceparent() {
        let own = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1";
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        // Its own X-Ray header wins over a traceparent.
        assert_eq!(
            xray_trace_header(&headers(&[("x-amzn-trace-id", own), ("traceparent", tp)])).unwrap(),
            own
        );
        assert_eq!(
            xray_trace_header(&headers(&[("traceparent", tp)])).unwrap(),
            "Root=1-4bf92f35-77b34da6a3ce929d0e0e4736;Parent=00f067aa0ba902b7;Sampled=1"
        );
        assert_eq!(
            xray_trace_header(&headers(&[(
                "traceparent",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"
            )]))
            .unwrap(),
            "Root=1-4bf92f35-77b34da6a3ce929d0e0e4736;Parent=00f067aa0ba902b7;Sampled=0"
        );
        // Only Root, Parent and Sampled pass, each checked; Lineage (Lambda's
        // recursive-loop detection), Self and custom fields are dropped.
        assert_eq!(
            xray_trace_header(&headers(&[(
                "x-amzn-trace-id",
                "Self=1-67891234-12456789abcdef012345678;Root=1-5759e988-bd862e3fe1be46a994272793;Lineage=a87bd80c:16;Parent=53995c3f42cd8ad8;Sampled=1;Custom=x"
            )]))
            .unwrap(),
            "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1"
        );
        assert_eq!(
            xray_trace_header(&headers(&[(
                "x-amzn-trace-id",
                "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=nothex;Sampled=?"
            )]))
            .unwrap(),
            "Root=1-5759e988-bd862e3fe1be46a994272793"
        );
        // A root that is not an X-Ray trace id is not a root.
        for bad in [
            "Root=1-5759e988-bd862e3fe1be46a99427279",
            "Root=1-5759E988-bd862e3fe1be46a994272793",
            "Root=2-5759e988-bd862e3fe1be46a994272793",
            "Root=1-5759e988-bd862e3fe1be46a994272793-x",
        ] {
            assert!(
                xray_trace_header(&headers(&[("x-amzn-trace-id", bad)])).is_none(),
                "{bad}"
            );
        }
        // A bad X-Ray header falls back to the traceparent.
        assert_eq!(
            xray_trace_header(&headers(&[
                ("x-amzn-trace-id", "Self=1-abc"),
                ("traceparent", tp)
            ]))
            .unwrap(),
            "Root=1-4bf92f35-77b34da6a3ce929d0e0e4736;Parent=00f067aa0ba902b7;Sampled=1"
        );
        for bad in [
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f35-00f067aa0ba902b7-01",
            "garbage",
        ] {
            assert!(
                xray_trace_header(&headers(&[("traceparent", bad)])).is_none(),
                "{bad}"
            );
        }
        assert!(xray_trace_header(&headers(&[])).is_none());
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
