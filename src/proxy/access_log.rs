//! Per-request observation: the `spillway_requests_in_flight` gauge and the access log.
//!
//! [`begin`] is called when a request arrives; [`Observation::respond`] wraps the
//! response body. When the body has been sent (or the client went away), the request
//! leaves the in-flight gauge and, when the access log is on, one line is logged at INFO
//! with target `spillway::access` (text or JSON, like every log line):
//!
//! ```text
//! INFO spillway::access: request request_id=4f1c2e0a9b7d4e6f8a0b1c2d3e4f5a6b
//!   trace_id=4bf92f3577b34da6a3ce929d0e0e4736 client=127.0.0.1:50412
//!   method=GET path=/sleep version=HTTP/1.1 status=200 tier=vm zone=- instance=vm-1
//!   headers_ms=20.6 total_ms=20.8 bytes_in=0 bytes_out=12 complete=true
//! ```
//!
//! * `request_id`: the request's `x-request-id` ([`crate::net::request_id`]), also on
//!   the response and in every warning about the request;
//! * `trace_id`: the request's W3C trace id, the client's or one the gateway started (32
//!   hex digits; the `traceparent` the upstream got carries it);
//! * `tier`: `vm`, `function` or `local` (the gateway answered itself: 413, 503, …);
//! * `zone`, `instance`: from the response's [`ServedBy`] (`-` when unknown);
//! * `headers_ms`: arrival to response headers; `total_ms`: arrival to the last body byte,
//!   both rounded to 0.1 ms;
//! * `bytes_in`: the request's declared `Content-Length` (`-` when streamed without one);
//!   `bytes_out`: response body bytes sent;
//! * `complete=false`: the body did not finish (client gone, upstream cut off);
//! * the query string is left out: it may hold credentials; so is the call id of an
//!   asynchronous call's status URL (`path=/_spillway/calls/<call id>/result`), which
//!   is the key to its result.
//!
//! The access log is switched by the log filter of that target: `spillway serve` turns it
//! on for `gateway.access_log: true` or `--access-log` (or `RUST_LOG=spillway::access=info`).

use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Method, Request, Response, Version, header};
use http_body::Body as _;
use tokio::time::Instant;

use crate::net::ServedBy;
use crate::net::body::{self, Body, BoxError};
use crate::telemetry as m;

/// What the access log says about the request itself.
#[derive(Debug)]
struct RequestInfo {
    start: Instant,
    client: SocketAddr,
    request_id: String,
    trace_id: String,
    method: Method,
    path: String,
    version: Version,
    bytes_in: Option<u64>,
    log: bool,
}

/// Whether the access log is on (the log filter enables target `spillway::access` at
/// INFO): what only its line reads is gathered only then.
pub fn logging() -> bool {
    tracing::enabled!(target: "spillway::access", tracing::Level::INFO)
}

/// A request being served. Leaves the in-flight gauge when its response finishes (or
/// when dropped without one).
#[derive(Debug)]
pub struct Observation(Option<RequestInfo>);

/// A request arrived from `client`; `request_id` is its `x-request-id`, `trace_id` its
/// W3C trace id.
pub fn begin<B>(
    req: &Request<B>,
    client: SocketAddr,
    request_id: &str,
    trace_id: impl std::fmt::Display,
) -> Observation {
    m::in_flight(1);
    let log = logging();
    Observation(Some(RequestInfo {
        start: Instant::now(),
        client,
        request_id: if log {
            request_id.to_owned()
        } else {
            String::new()
        },
        trace_id: if log {
            trace_id.to_string()
        } else {
            String::new()
        },
        method: req.method().clone(),
        // Only the log line reads it: no copy per request with the access log off.
        path: if log {
            req.uri().path().to_owned()
        } else {
            String::new()
        },
        version: req.version(),
        bytes_in: req
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse().ok()),
        log,
    }))
}

impl Observation {
    /// Log the path as `prefix/<call id>` when it lies under `prefix` (an asynchronous
    /// call's status URL): a call id is the key to the call's result, not for logs.
    pub fn hide_call_id(&mut self, prefix: &str) {
        if let Some(r) = &mut self.0
            && r.log
            && let Some(rest) = r.path.strip_prefix(prefix)
            && rest.starts_with('/')
        {
            let tail = if rest.ends_with("/result") {
                "/result"
            } else {
                ""
            };
            r.path = format!("{prefix}/<call id>{tail}");
        }
    }

    /// The response (headers) is ready: wrap its body so that the request is accounted
    /// for when the body ends or is dropped.
    pub fn respond(mut self, tier: &'static str, mut resp: Response<Body>) -> Response<Body> {
        let Some(req) = self.0.take() else {
            return resp;
        };
        let finished = Finished {
            headers_ms: ms(req.start.elapsed()),
            status: resp.status().as_u16(),
            tier,
            served: resp.extensions_mut().remove::<ServedBy>(),
            req,
        };
        resp.map(|inner| {
            body::boxed(ObservedBody {
                inner,
                bytes_out: 0,
                ended: false,
                finished: Some(finished),
            })
        })
    }
}

impl Drop for Observation {
    /// Dropped without a response (the connection went away mid-request).
    fn drop(&mut self) {
        if self.0.take().is_some() {
            m::in_flight(-1);
        }
    }
}

struct Finished {
    req: RequestInfo,
    headers_ms: f64,
    status: u16,
    tier: &'static str,
    served: Option<ServedBy>,
}

impl Finished {
    fn finish(self, bytes_out: u64, complete: bool) {
        m::in_flight(-1);
        let r = &self.req;
        if !r.log {
            return;
        }
        let (instance, zone) = match &self.served {
            Some(s) => (s.instance.as_str(), s.zone.as_deref().unwrap_or("-")),
            None => ("-", "-"),
        };
        tracing::info!(
            target: "spillway::access",
            request_id = %r.request_id,
            trace_id = %r.trace_id,
            client = %r.client,
            method = %r.method,
            path = %r.path,
            version = ?r.version,
            status = self.status,
            tier = %self.tier,
            zone = %zone,
            instance = %instance,
            headers_ms = self.headers_ms,
            total_ms = ms(r.start.elapsed()),
            bytes_in = %r.bytes_in.map_or("-".to_string(), |b| b.to_string()),
            bytes_out,
            complete,
            "request"
        );
    }
}

/// A duration in milliseconds, rounded to 0.1 ms.
fn ms(d: std::time::Duration) -> f64 {
    (d.as_secs_f64() * 10_000.0).round() / 10.0
}

/// The response body, counted; accounts for the request when it ends or is dropped.
struct ObservedBody {
    inner: Body,
    bytes_out: u64,
    ended: bool,
    finished: Option<Finished>,
}

impl ObservedBody {
    fn finish(&mut self, complete: bool) {
        if let Some(f) = self.finished.take() {
            f.finish(self.bytes_out, complete);
        }
    }
}

impl http_body::Body for ObservedBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.bytes_out += data.len() as u64;
                }
                if this.inner.is_end_stream() {
                    this.ended = true;
                    this.finish(true);
                }
            }
            Poll::Ready(None) => {
                this.ended = true;
                this.finish(true);
            }
            Poll::Ready(Some(Err(_))) => this.finish(false),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for ObservedBody {
    fn drop(&mut self) {
        // An empty body may never be polled (HEAD, 204, a 101 upgrade): ended is what
        // the body says; anything else dropped early was cut off.
        let complete = self.ended || self.inner.is_end_stream();
        self.finish(complete);
    }
}
