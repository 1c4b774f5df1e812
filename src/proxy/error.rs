//! The one place where errors become HTTP responses.
//!
//! Every reply the gateway makes itself goes through [`ProxyError::into_reply`]: a
//! fixed status code per error kind and a body with a short reason
//! ([`ProxyError::reason`]: what happened, in the client's terms, redacted and without
//! internal detail such as upstream addresses — those go to the log) and the request id,
//! as `application/problem+json` (RFC 9457) when the client's `Accept` asks for JSON,
//! else as text:
//!
//! ```text
//! 502 Bad Gateway: the upstream failed or its answer was unusable
//! request id: 4f1c2e0a9b7d4e6f8a0b1c2d3e4f5a6b
//! ```
//!
//! ```json
//! {"type": "about:blank", "title": "Bad Gateway", "status": 502,
//!  "detail": "the upstream failed or its answer was unusable",
//!  "request_id": "4f1c2e0a9b7d4e6f8a0b1c2d3e4f5a6b"}
//! ```
//!
//! Errors carry who is at fault (client, upstream, capacity) in their variant, which
//! also decides how a failed request is logged ([`ProxyError::fault`]), and the error
//! they came from as their source.

use std::time::Duration;

use http::{HeaderValue, Response, StatusCode, header};

use crate::backends::FunctionError;
use crate::net::body::{self, Body, is_length_limit};
use crate::net::client::UpstreamError;
use crate::net::validate::{self, RequestError};
use crate::policy::attempt::NotSentReason;

/// Whose fault an error is: decides the status class and what is logged as a failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fault {
    /// The client sent something the gateway will not forward (4xx).
    Client,
    /// An upstream (VM, function instance, endpoint) failed or was too slow (502/504).
    Upstream,
    /// The gateway has no capacity for the request now, or is shutting down (503).
    Capacity,
}

impl Fault {
    /// Label for logs and metrics: `client`, `upstream`, `capacity`.
    pub fn as_str(self) -> &'static str {
        match self {
            Fault::Client => "client",
            Fault::Upstream => "upstream",
            Fault::Capacity => "capacity",
        }
    }
}

/// Seconds a client is told to wait after a 503 (`Retry-After`).
pub const RETRY_AFTER_SECONDS: u64 = 1;

/// A request the gateway answers itself.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// The request body is larger than `gateway.max_body_bytes` (client's fault).
    #[error("request body over {limit} bytes")]
    BodyTooLarge {
        /// The configured limit, bytes.
        limit: u64,
    },
    /// The client's request body was malformed or cut off while it was being forwarded
    /// (client's fault).
    #[error("bad request body: {0}")]
    BadRequestBody(#[source] body::BoxError),
    /// No tier can take the request now (no token and no function capacity, or an
    /// `Upgrade` with no ready VM).
    #[error("no capacity: {reason}")]
    NoCapacity {
        /// The balancer's reason label.
        reason: &'static str,
    },
    /// The client paused its request body longer than
    /// `gateway.request_body_idle_timeout_seconds` (client's fault): 408.
    #[error("request body idle for {0:?}")]
    RequestBodyTimeout(Duration),
    /// The upstream did not send its response head within
    /// `gateway.upstream_timeout_seconds` after the request body was sent.
    #[error("upstream timed out after {0:?}")]
    UpstreamTimeout(Duration),
    /// The upstream (VM, function instance or endpoint) failed, or its answer cannot be
    /// forwarded; the source says how.
    #[error("upstream failed: {0}")]
    Upstream(#[source] body::BoxError),
    /// The function tier could not run the call (a bad reply, an unreadable request
    /// body); the source says how.
    #[error("function tier failed: {0}")]
    Function(#[source] body::BoxError),
    /// The function instance the call was placed on did not start (its cold start, or
    /// the boot of the pre-warmed instance it waited for, failed): 502.
    #[error("cold start failed: {0}")]
    ColdStart(#[source] body::BoxError),
    /// The gateway is shutting down.
    #[error("shutting down")]
    ShuttingDown,
    /// An asynchronous call was refused (ProFaaStinate §3): bad deadline header or an
    /// `Upgrade` request (client's fault, 400).
    #[error("asynchronous call refused: {0}")]
    AsyncRefused(#[source] AsyncRefusal),
    /// The delay queue is at `async.max_queued`, the store failed, or the replica that
    /// holds a looked-up call cannot be reached: 503 with `Retry-After: seconds`;
    /// synchronous traffic is unaffected.
    #[error("asynchronous call not accepted: {cause}")]
    AsyncUnavailable {
        /// Why.
        #[source]
        cause: AsyncUnavailable,
        /// `Retry-After`, seconds.
        retry_after: u64,
    },
    /// The asynchronous-call store is at `async.max_store_bytes` (the gateway's
    /// capacity): 507 Insufficient Storage with `Retry-After`.
    #[error("asynchronous call not accepted: {source}")]
    AsyncStoreFull {
        /// The store's refusal, with its numbers (bytes used, limit, needed).
        source: body::BoxError,
        /// `Retry-After`, seconds.
        retry_after: u64,
    },
    /// The client has `async.max_calls_per_client` calls stored (client's fault): 429
    /// with `Retry-After`.
    #[error("asynchronous call not accepted: {source}")]
    AsyncClientLimit {
        /// The store's refusal, naming the client and the limit.
        source: body::BoxError,
        /// `Retry-After`, seconds.
        retry_after: u64,
    },
    /// A released asynchronous call's response body is longer than
    /// `async.result_max_bytes` (the upstream's answer does not fit): the call fails,
    /// its stored result is this error's 502.
    #[error("asynchronous call result over {limit} bytes: not stored")]
    AsyncResultTooLarge {
        /// `async.result_max_bytes`.
        limit: u64,
    },
    /// No asynchronous call (or no result yet) under this status URL: 404.
    #[error("no such call or result")]
    CallNotFound,
    /// The call's result passed `async.result_ttl_seconds` (and is not purged yet): 410.
    #[error("result expired")]
    CallResultGone,
    /// The request is too large for the function tier it was routed to (Lambda: the
    /// event would exceed the 6 MiB Invoke payload limit); nothing was sent.
    #[error("request over the function tier's {limit}-byte payload limit")]
    FunctionPayloadTooLarge {
        /// The tier's limit, bytes.
        limit: u64,
    },
    /// An `Upgrade` request reached a function route, which cannot tunnel it
    /// (http-cases C6): 400, the client's request cannot be served as asked there.
    #[error("function routes do not support Upgrade")]
    UpgradeOnFunctionRoute,
    /// The request head was refused before routing ([`crate::net::validate`];
    /// client's fault): 400, 405 (`CONNECT`, with `Allow`), 414 or 431.
    #[error("invalid request: {0}")]
    Request(#[from] RequestError),
}

/// Why an asynchronous call was refused ([`ProxyError::AsyncRefused`], 400): the
/// client's request cannot be an asynchronous call as sent.
#[derive(Debug, thiserror::Error)]
pub enum AsyncRefusal {
    /// The deadline header is not a whole number of milliseconds.
    #[error("{header}: not a number of milliseconds: {text:?}")]
    DeadlineNotANumber {
        /// `async.deadline_header`.
        header: String,
        /// The header's value as sent.
        text: String,
    },
    /// The deadline is outside `[1, async.max_deadline_seconds]`.
    #[error("{header}: must be in [1, {max_ms}] ms, got {got}")]
    DeadlineOutOfRange {
        /// `async.deadline_header`.
        header: String,
        /// `async.max_deadline_seconds`, ms.
        max_ms: u64,
        /// The deadline sent, ms.
        got: i128,
    },
    /// An `Upgrade` request cannot wait in a queue.
    #[error("an Upgrade request cannot be asynchronous")]
    Upgrade,
}

/// Why an asynchronous call cannot be accepted or looked up now
/// ([`ProxyError::AsyncUnavailable`], 503 with `Retry-After`): the gateway's capacity or
/// state, never the client's request.
#[derive(Debug, thiserror::Error)]
pub enum AsyncUnavailable {
    /// The delay queue holds `async.max_queued` calls.
    #[error("queue full")]
    QueueFull,
    /// The call store failed to read or write (its source says how).
    #[error("the call store failed: {0}")]
    Store(#[source] body::BoxError),
    /// The blocking task running a store operation failed (panicked or was cancelled).
    #[error("the call store's task failed: {0}")]
    StoreTask(#[source] tokio::task::JoinError),
    /// The replica whose tag the call id carries is not live (coordinated replicas).
    #[error(
        "the replica that accepted this call (owner tag {tag:08x}) is not live; its calls answer when it is back"
    )]
    OwnerNotLive {
        /// The owner's tag, from the call id.
        tag: u32,
    },
    /// The owner's advertised URL or the forwarded lookup could not be built.
    #[error("cannot forward the lookup of call {id} to its owner at {url:?}: {source}")]
    OwnerRequest {
        /// The call id.
        id: String,
        /// The owner's advertised URL.
        url: String,
        /// What was wrong with it.
        source: http::Error,
    },
    /// The owner replica failed to answer the forwarded lookup.
    #[error("the replica that accepted this call ({url}) did not answer: {source}")]
    OwnerFailed {
        /// The owner's URL.
        url: String,
        /// The upstream error.
        source: UpstreamError,
    },
    /// The owner replica sent no answer within `gateway.upstream_timeout_seconds`.
    #[error("the replica that accepted this call ({url}) did not answer within {timeout:?}")]
    OwnerTimeout {
        /// The owner's URL.
        url: String,
        /// `gateway.upstream_timeout_seconds`.
        timeout: Duration,
    },
}

impl ProxyError {
    /// The one mapping from an upstream client error: a body over `limit` (413) or a
    /// malformed/cut-off client body (400) is the client's fault, the rest the upstream's.
    pub fn from_upstream(e: UpstreamError, limit: u64) -> Self {
        if is_length_limit(&e) {
            ProxyError::BodyTooLarge { limit }
        } else if let Some(idle) = request_idle(&e) {
            ProxyError::RequestBodyTimeout(idle)
        } else if is_client_body_error(&e) {
            ProxyError::BadRequestBody(Box::new(e))
        } else {
            ProxyError::Upstream(Box::new(e))
        }
    }

    /// The one mapping from a function-tier error (`limit`: the gateway's body limit).
    pub fn from_function(e: FunctionError, limit: u64) -> Self {
        match e {
            FunctionError::NotSent { reason, .. } => Self::not_sent(reason),
            FunctionError::Upstream(e) => Self::from_upstream(e, limit),
            FunctionError::PayloadTooLarge { limit } => {
                ProxyError::FunctionPayloadTooLarge { limit }
            }
            FunctionError::UpgradeNotSupported => ProxyError::UpgradeOnFunctionRoute,
            FunctionError::TimedOut(after) => ProxyError::UpstreamTimeout(after),
            FunctionError::RequestBody(e) => {
                if is_length_limit(&*e) {
                    ProxyError::BodyTooLarge { limit }
                } else if let Some(idle) = request_idle(&*e) {
                    ProxyError::RequestBodyTimeout(idle)
                } else {
                    ProxyError::Function(Box::new(FunctionError::RequestBody(e)))
                }
            }
            e @ FunctionError::Failed(_) => ProxyError::Function(Box::new(e)),
        }
    }

    /// An attempt that reached no upstream and may not go elsewhere: no capacity (503)
    /// for throttling and shutdown, an upstream failure (502) otherwise.
    pub fn not_sent(reason: NotSentReason) -> Self {
        match reason {
            NotSentReason::Throttled => ProxyError::NoCapacity {
                reason: "throttled",
            },
            NotSentReason::ShuttingDown => ProxyError::ShuttingDown,
            other => ProxyError::Upstream(format!("not sent: {}", other.as_str()).into()),
        }
    }

    /// Whose fault this is. It also decides how a failed request is logged: an
    /// upstream's failure is a warning, the client's own errors and the gateway's
    /// capacity answers are expected replies (debug; the metrics count them).
    pub fn fault(&self) -> Fault {
        match self {
            ProxyError::BodyTooLarge { .. }
            | ProxyError::BadRequestBody(_)
            | ProxyError::RequestBodyTimeout(_)
            | ProxyError::FunctionPayloadTooLarge { .. }
            | ProxyError::UpgradeOnFunctionRoute
            | ProxyError::AsyncRefused(_)
            | ProxyError::CallNotFound
            | ProxyError::CallResultGone
            | ProxyError::AsyncClientLimit { .. }
            | ProxyError::Request(_) => Fault::Client,
            ProxyError::NoCapacity { .. }
            | ProxyError::ShuttingDown
            | ProxyError::AsyncUnavailable { .. }
            | ProxyError::AsyncStoreFull { .. } => Fault::Capacity,
            ProxyError::UpstreamTimeout(_)
            | ProxyError::Upstream(_)
            | ProxyError::Function(_)
            | ProxyError::ColdStart(_)
            | ProxyError::AsyncResultTooLarge { .. } => Fault::Upstream,
        }
    }

    /// Whether the client may send the same request again unchanged and expect another
    /// outcome: capacity errors (after `Retry-After`) and upstream failures may clear;
    /// the client's own errors do not, except a client over its asynchronous-call limit
    /// (its calls finish and are purged).
    pub fn retryable(&self) -> bool {
        self.fault() != Fault::Client || matches!(self, ProxyError::AsyncClientLimit { .. })
    }

    /// The status code of this error.
    pub fn status(&self) -> StatusCode {
        match self {
            ProxyError::BodyTooLarge { .. } | ProxyError::FunctionPayloadTooLarge { .. } => {
                StatusCode::PAYLOAD_TOO_LARGE
            }
            ProxyError::BadRequestBody(_)
            | ProxyError::UpgradeOnFunctionRoute
            | ProxyError::AsyncRefused(_) => StatusCode::BAD_REQUEST,
            ProxyError::NoCapacity { .. }
            | ProxyError::ShuttingDown
            | ProxyError::AsyncUnavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
            ProxyError::AsyncStoreFull { .. } => StatusCode::INSUFFICIENT_STORAGE,
            ProxyError::AsyncClientLimit { .. } => StatusCode::TOO_MANY_REQUESTS,
            ProxyError::AsyncResultTooLarge { .. } => StatusCode::BAD_GATEWAY,
            ProxyError::CallNotFound => StatusCode::NOT_FOUND,
            ProxyError::CallResultGone => StatusCode::GONE,
            ProxyError::UpstreamTimeout(_) => StatusCode::GATEWAY_TIMEOUT,
            ProxyError::RequestBodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            ProxyError::Upstream(_) | ProxyError::Function(_) | ProxyError::ColdStart(_) => {
                StatusCode::BAD_GATEWAY
            }
            ProxyError::Request(e) => match e {
                RequestError::Connect => StatusCode::METHOD_NOT_ALLOWED,
                RequestError::UriTooLong { .. } => StatusCode::URI_TOO_LONG,
                RequestError::HeaderBytes { .. } | RequestError::HeaderCount { .. } => {
                    StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
                }
                RequestError::TargetForm { .. }
                | RequestError::Scheme
                | RequestError::MissingHost
                | RequestError::DuplicateHost
                | RequestError::InvalidHost(_)
                | RequestError::HostMismatch { .. }
                | RequestError::Path(_)
                | RequestError::UnderscoreHeader(_) => StatusCode::BAD_REQUEST,
            },
        }
    }

    /// The short reason a reply body gives: what happened in the client's terms, no
    /// upstream address or provider message (those are logged), redacted and at most
    /// [`crate::redact::MAX_REASON_CHARS`] characters.
    pub fn reason(&self) -> String {
        let secs = |d: &Duration| {
            format!("{:.3}", d.as_secs_f64())
                .trim_end_matches('0')
                .trim_end_matches('.')
                .to_string()
        };
        let text = match self {
            ProxyError::NoCapacity { reason } => {
                format!("no capacity for the request now ({reason}); retry later")
            }
            ProxyError::BadRequestBody(_) => "the request body was malformed or cut off".into(),
            ProxyError::RequestBodyTimeout(d) => {
                format!("the request body paused for more than {} s", secs(d))
            }
            ProxyError::UpstreamTimeout(d) => {
                format!("the upstream sent no response within {} s", secs(d))
            }
            ProxyError::Upstream(_) => "the upstream failed or its answer was unusable".into(),
            ProxyError::Function(_) | ProxyError::ColdStart(_) => {
                "the function tier could not run the call".into()
            }
            ProxyError::AsyncUnavailable { .. } => {
                "asynchronous calls cannot be accepted now; retry later".into()
            }
            other => other.to_string(),
        };
        crate::redact::redact_short(&text, crate::redact::MAX_REASON_CHARS)
    }

    /// [`Self::into_reply`] as text, without a request id.
    pub fn into_response(self) -> Response<Body> {
        self.into_reply(false, None)
    }

    /// The response sent to the client: status, a body with [`Self::reason`] and the
    /// request id (`application/problem+json` when `problem_json`, else text; see the
    /// [module docs](self)), `Retry-After` on 503,
    /// `Allow` on 405. A refused request head (400, 405, 414, 431) and a body over the
    /// limit (413) also get `Connection: close`: an HTTP/1 client that sent one bad
    /// message is not trusted with the framing of the next (http-cases C1, C5; hyper
    /// removes the field on h2).
    pub fn into_reply(self, problem_json: bool, request_id: Option<&str>) -> Response<Body> {
        let status = self.status();
        let title = status.canonical_reason().unwrap_or("Error");
        let reason = self.reason();
        let (text, content_type) = if problem_json {
            let mut doc = serde_json::json!({
                "type": "about:blank",
                "title": title,
                "status": status.as_u16(),
                "detail": reason,
            });
            if let Some(id) = request_id {
                doc["request_id"] = id.into();
            }
            (doc.to_string() + "\n", "application/problem+json")
        } else {
            let mut text = format!("{} {title}: {reason}\n", status.as_u16());
            if let Some(id) = request_id {
                text.push_str("request id: ");
                text.push_str(id);
                text.push('\n');
            }
            (text, "text/plain; charset=utf-8")
        };
        let mut resp = Response::new(body::full(text));
        *resp.status_mut() = status;
        let h = resp.headers_mut();
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
        let retry_after = match &self {
            ProxyError::AsyncUnavailable { retry_after, .. }
            | ProxyError::AsyncStoreFull { retry_after, .. }
            | ProxyError::AsyncClientLimit { retry_after, .. } => Some(*retry_after),
            _ if status == StatusCode::SERVICE_UNAVAILABLE => Some(RETRY_AFTER_SECONDS),
            _ => None,
        };
        if let Some(secs) = retry_after {
            h.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if status == StatusCode::METHOD_NOT_ALLOWED {
            h.insert(header::ALLOW, HeaderValue::from_static(validate::ALLOW));
        }
        if matches!(
            self,
            ProxyError::Request(_)
                | ProxyError::BodyTooLarge { .. }
                | ProxyError::RequestBodyTimeout(_)
        ) {
            h.insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        resp
    }
}

/// Whether a client whose request has these headers gets its error as
/// `application/problem+json`: its `Accept` names `application/problem+json` or
/// `application/json` (or any `+json` type) without naming `text/plain` first.
pub fn wants_problem_json(headers: &http::HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|item| {
            item.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        })
        .find(|t| t == "text/plain" || t == "application/json" || t.ends_with("+json"))
        .is_some_and(|t| t != "text/plain")
}

/// Whether hyper's client reported an error of the request body we streamed up (a
/// "user body" error: malformed chunking, client gone).
fn is_client_body_error(e: &(dyn std::error::Error + 'static)) -> bool {
    sources(e).any(|err| {
        err.downcast_ref::<hyper::Error>()
            .is_some_and(hyper::Error::is_user)
    })
}

/// The idle time of a [`body::RequestBodyIdle`] in `e`'s chain of sources.
fn request_idle(e: &(dyn std::error::Error + 'static)) -> Option<Duration> {
    sources(e).find_map(|err| err.downcast_ref::<body::RequestBodyIdle>().map(|r| r.0))
}

/// `e` and its chain of sources.
fn sources<'a>(
    e: &'a (dyn std::error::Error + 'static),
) -> impl Iterator<Item = &'a (dyn std::error::Error + 'static)> {
    std::iter::successors(Some(e), |err| err.source())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_codes_are_fixed_per_kind() {
        let r = ProxyError::NoCapacity { reason: "x" }.into_response();
        assert_eq!(r.status(), 503);
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
        assert_eq!(ProxyError::BodyTooLarge { limit: 1 }.status(), 413);
        assert_eq!(
            ProxyError::UpstreamTimeout(Duration::from_secs(1)).status(),
            504
        );
        assert_eq!(ProxyError::Upstream("secret detail".into()).status(), 502);
        assert_eq!(
            ProxyError::FunctionPayloadTooLarge { limit: 6_291_456 }.status(),
            413
        );
        assert_eq!(ProxyError::UpgradeOnFunctionRoute.status(), 400);
        assert_eq!(ProxyError::Function("x".into()).status(), 502);
    }

    #[test]
    fn a_full_store_is_507_a_client_over_its_limit_429_both_with_retry_after() {
        let full = ProxyError::AsyncStoreFull {
            source: "x".into(),
            retry_after: 9,
        };
        assert_eq!((full.fault(), full.retryable()), (Fault::Capacity, true));
        let r = full.into_response();
        assert_eq!(r.status(), 507);
        assert_eq!(r.headers()[header::RETRY_AFTER], "9");
        let over = ProxyError::AsyncClientLimit {
            source: "x".into(),
            retry_after: 4,
        };
        assert_eq!((over.fault(), over.retryable()), (Fault::Client, true));
        let r = over.into_response();
        assert_eq!(r.status(), 429);
        assert_eq!(r.headers()[header::RETRY_AFTER], "4");
        let big = ProxyError::AsyncResultTooLarge { limit: 10 };
        assert_eq!((big.fault(), big.status().as_u16()), (Fault::Upstream, 502));
        assert!(
            big.into_response()
                .headers()
                .get(header::RETRY_AFTER)
                .is_none()
        );
    }

    #[test]
    fn every_error_knows_whose_fault_it_is_and_whether_to_retry() {
        let client = ProxyError::BodyTooLarge { limit: 1 };
        assert_eq!((client.fault(), client.retryable()), (Fault::Client, false));
        let busy = ProxyError::not_sent(NotSentReason::Throttled);
        assert_eq!(
            (busy.fault(), busy.status().as_u16()),
            (Fault::Capacity, 503)
        );
        assert!(busy.retryable());
        let gone = ProxyError::not_sent(NotSentReason::Unreachable);
        assert_eq!(
            (gone.fault(), gone.status().as_u16()),
            (Fault::Upstream, 502)
        );
        let f = ProxyError::from_function(FunctionError::TimedOut(Duration::from_secs(3)), 10);
        assert_eq!((f.fault(), f.status().as_u16()), (Fault::Upstream, 504));
        let f = ProxyError::from_function(FunctionError::PayloadTooLarge { limit: 6 }, 10);
        assert_eq!((f.fault(), f.status().as_u16()), (Fault::Client, 413));
    }

    #[test]
    fn refused_requests_map_to_their_status_and_close() {
        let r = ProxyError::Request(RequestError::Connect).into_response();
        assert_eq!(r.status(), 405);
        assert_eq!(r.headers()[header::ALLOW], validate::ALLOW);
        assert_eq!(r.headers()[header::CONNECTION], "close");
        for (e, code) in [
            (RequestError::UriTooLong { limit: 1 }, 414),
            (RequestError::HeaderBytes { limit: 1 }, 431),
            (RequestError::HeaderCount { limit: 1 }, 431),
            (RequestError::MissingHost, 400),
            (RequestError::DuplicateHost, 400),
            (RequestError::InvalidHost("a b".into()), 400),
            (RequestError::Path(validate::PathError::EscapedSlash), 400),
        ] {
            let r = ProxyError::Request(e).into_response();
            assert_eq!(r.status(), code);
            assert_eq!(r.headers()[header::CONNECTION], "close");
            assert!(r.headers().get(header::ALLOW).is_none());
        }
        // A gateway-side failure keeps the connection.
        let r = ProxyError::Upstream("x".into()).into_response();
        assert!(r.headers().get(header::CONNECTION).is_none());
    }

    /// The asynchronous front end's errors keep what caused them: a log line or a
    /// tracing error chain reaches the store's or the owner replica's own error, while
    /// the client gets the fixed reason (no store path, no owner address).
    #[test]
    fn async_errors_keep_their_cause_and_the_client_sees_only_the_reason() {
        let store = std::io::Error::other("disk /var/lib/spillway/calls.redb: I/O error");
        let e = ProxyError::AsyncUnavailable {
            cause: AsyncUnavailable::Store(Box::new(store)),
            retry_after: 7,
        };
        let cause = std::error::Error::source(&e).expect("the cause");
        let root = cause.source().expect("the store's error");
        assert!(root.to_string().contains("I/O error"), "{root}");
        assert_eq!((e.fault(), e.retryable()), (Fault::Capacity, true));
        assert!(!e.reason().contains("redb"), "{}", e.reason());
        let r = e.into_response();
        assert_eq!(r.status(), 503);
        assert_eq!(r.headers()[header::RETRY_AFTER], "7");

        let refused = ProxyError::AsyncRefused(AsyncRefusal::DeadlineOutOfRange {
            header: "x-deadline-ms".into(),
            max_ms: 60_000,
            got: 0,
        });
        assert_eq!(
            (refused.fault(), refused.retryable()),
            (Fault::Client, false)
        );
        assert_eq!(refused.status(), 400);
        assert_eq!(
            refused.reason(),
            "asynchronous call refused: x-deadline-ms: must be in [1, 60000] ms, got 0"
        );
        assert!(std::error::Error::source(&refused).is_some());
    }
}
