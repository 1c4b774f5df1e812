//! The one place where errors become HTTP responses.
//!
//! Every reply the gateway makes itself goes through [`ProxyError::into_response`]: a
//! fixed status code per error kind, a short generic body, and no internal detail (the
//! details go to the log at the call site). Errors carry who is at fault (client,
//! upstream, capacity) in their variant.

use std::time::Duration;

use http::{HeaderValue, Response, StatusCode, header};

use crate::net::body::{self, Body};

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
    BadRequestBody(String),
    /// No tier can take the request now (no token and no function capacity, or an
    /// `Upgrade` with no ready VM).
    #[error("no capacity: {reason}")]
    NoCapacity {
        /// The balancer's reason label.
        reason: &'static str,
    },
    /// The upstream did not answer within `gateway.upstream_timeout_seconds`.
    #[error("upstream timed out after {0:?}")]
    UpstreamTimeout(Duration),
    /// The upstream (VM, function instance or endpoint) failed.
    #[error("upstream failed: {0}")]
    Upstream(String),
    /// The function tier could not run the call (cold start failed, bad reply).
    #[error("function tier failed: {0}")]
    Function(String),
    /// The gateway is shutting down.
    #[error("shutting down")]
    ShuttingDown,
    /// The request is too large for the function tier it was routed to (Lambda: the
    /// event would exceed the 6 MiB Invoke payload limit); nothing was sent (issue 4).
    #[error("request over the function tier's {limit}-byte payload limit")]
    FunctionPayloadTooLarge {
        /// The tier's limit, bytes.
        limit: u64,
    },
    /// An `Upgrade` request reached a function route, which cannot tunnel it
    /// (http-cases C6): 400, the client's request cannot be served as asked there.
    #[error("function routes do not support Upgrade")]
    UpgradeOnFunctionRoute,
}

impl ProxyError {
    /// The status code of this error.
    pub fn status(&self) -> StatusCode {
        match self {
            ProxyError::BodyTooLarge { .. } | ProxyError::FunctionPayloadTooLarge { .. } => {
                StatusCode::PAYLOAD_TOO_LARGE
            }
            ProxyError::BadRequestBody(_) | ProxyError::UpgradeOnFunctionRoute => {
                StatusCode::BAD_REQUEST
            }
            ProxyError::NoCapacity { .. } | ProxyError::ShuttingDown => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ProxyError::UpstreamTimeout(_) => StatusCode::GATEWAY_TIMEOUT,
            ProxyError::Upstream(_) | ProxyError::Function(_) => StatusCode::BAD_GATEWAY,
        }
    }

    /// The response sent to the client: status, generic text body, `Retry-After` on 503.
    pub fn into_response(self) -> Response<Body> {
        let status = self.status();
        let text = format!(
            "{} {}\n",
            status.as_u16(),
            status.canonical_reason().unwrap_or("Error")
        );
        let mut resp = Response::new(body::full(text));
        *resp.status_mut() = status;
        let h = resp.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        if status == StatusCode::SERVICE_UNAVAILABLE {
            h.insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECONDS));
        }
        resp
    }
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
}
