//! Span export over OTLP/HTTP (`telemetry.otlp`, the `otlp` feature): the real gateway
//! sends its spans to a small OTLP receiver on loopback (a hyper server in the test that
//! decodes the protobuf requests); the spans' ids and parents agree with the client's
//! `traceparent`, with the one the upstream saw and with the access log.
#![cfg(feature = "otlp")]
// Blocking test code: std's clock for the polling deadlines (no tokio time here).
#![allow(clippy::disallowed_methods)]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use parking_lot::Mutex;
use prost::Message as _;

use common::stub::{Stub, ok_reply};
use common::{Gateway, http, static_config};

const LONG: Duration = Duration::from_secs(30);

/// An OTLP/HTTP traces receiver on 127.0.0.1:0: every span it was sent, with the
/// `service.name` of its resource.
struct Receiver {
    url: String,
    spans: Arc<Mutex<Vec<(String, Span)>>>,
    _runtime: tokio::runtime::Runtime,
}

impl Receiver {
    fn start() -> Receiver {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let url = format!("http://{}/v1/traces", listener.local_addr().unwrap());
        let spans = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&spans);
        runtime.spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let sink = Arc::clone(&sink);
                tokio::spawn(async move {
                    let service = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                        let sink = Arc::clone(&sink);
                        async move {
                            assert_eq!(req.uri().path(), "/v1/traces");
                            let body = req.into_body().collect().await?.to_bytes();
                            let export = ExportTraceServiceRequest::decode(body).unwrap();
                            for rs in export.resource_spans {
                                let service = rs
                                    .resource
                                    .iter()
                                    .flat_map(|r| &r.attributes)
                                    .find(|a| a.key == "service.name")
                                    .and_then(|a| text(a.value.as_ref()?.value.as_ref()?))
                                    .unwrap_or_default();
                                for ss in rs.scope_spans {
                                    for span in ss.spans {
                                        sink.lock().push((service.clone(), span));
                                    }
                                }
                            }
                            Ok::<_, hyper::Error>(
                                hyper::Response::builder()
                                    .header("content-type", "application/x-protobuf")
                                    .body(Full::new(Bytes::new()))
                                    .unwrap(),
                            )
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Receiver {
            url,
            spans,
            _runtime: runtime,
        }
    }

    /// Poll until `pred` holds for the spans received so far.
    fn wait_for(&self, what: &str, pred: impl Fn(&[(String, Span)]) -> bool) -> Vec<Span> {
        let deadline = Instant::now() + LONG;
        loop {
            {
                let spans = self.spans.lock();
                if pred(&spans) {
                    return spans.iter().map(|(_, s)| s.clone()).collect();
                }
            }
            assert!(Instant::now() < deadline, "no {what} within {LONG:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn text(v: &AnyValue) -> Option<String> {
    match v {
        AnyValue::StringValue(s) => Some(s.clone()),
        AnyValue::IntValue(i) => Some(i.to_string()),
        _ => None,
    }
}

fn attr(span: &Span, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|a| a.key == key)
        .and_then(|a| text(a.value.as_ref()?.value.as_ref()?))
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The spans of `trace` named `name`.
fn named<'a>(spans: &'a [Span], trace: &str, name: &str) -> Vec<&'a Span> {
    spans
        .iter()
        .filter(|s| hex(&s.trace_id) == trace && s.name == name)
        .collect()
}

#[test]
fn spans_arrive_with_the_clients_and_the_upstreams_trace_ids_and_parents() {
    let receiver = Receiver::start();
    let stub = Stub::start(ok_reply);
    let yaml = format!(
        "{}\ntelemetry:\n  otlp:\n    endpoint: {}\n    timeout_ms: 2000\n    service_name: gw-test\n",
        static_config(&[stub.url()], "  access_log: true"),
        receiver.url
    );
    // A short batch delay (the SDK's standard variable), so that the test is quick.
    let gw = Gateway::start_env(&yaml, &[("OTEL_BSP_SCHEDULE_DELAY".into(), "100".into())]);

    // With the client's traceparent: the request span is its child.
    let client_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let client_span = "00f067aa0ba902b7";
    let tp = format!("00-{client_trace}-{client_span}-01");
    let (code, _, _) = http(
        gw.proxy,
        "GET",
        "/with",
        &[("traceparent", &tp), ("x-request-id", "req-with")],
        b"",
    );
    assert_eq!(code, 200);
    // Without: the gateway starts the trace.
    let (code, _, _) = http(gw.proxy, "GET", "/without", &[], b"");
    assert_eq!(code, 200);

    let upstream = |path: &str| -> (String, String, String) {
        let seen = stub.requests_to(path)[0]
            .get("traceparent")
            .unwrap_or_else(|| panic!("{path}: no traceparent upstream"))
            .to_string();
        let p: Vec<&str> = seen.split('-').collect();
        assert_eq!((p.len(), p[0]), (4, "00"), "{seen}");
        (p[1].to_string(), p[2].to_string(), p[3].to_string())
    };

    // /with: one trace, the client's.
    let (trace, parent, flags) = upstream("/with");
    assert_eq!(trace, client_trace);
    assert_eq!(flags, "01");
    let spans = receiver.wait_for("spans of /with", |s| {
        let s: Vec<Span> = s.iter().map(|(_, s)| s.clone()).collect();
        !named(&s, client_trace, "request").is_empty()
            && !named(&s, client_trace, "attempt").is_empty()
    });
    let request = named(&spans, client_trace, "request")[0];
    assert_eq!(hex(&request.parent_span_id), client_span);
    assert_eq!(attr(request, "http.request.method").as_deref(), Some("GET"));
    assert_eq!(attr(request, "url.path").as_deref(), Some("/with"));
    assert_eq!(
        attr(request, "http.response.status_code").as_deref(),
        Some("200")
    );
    assert_eq!(attr(request, "spillway.tier").as_deref(), Some("vm"));
    assert_eq!(
        attr(request, "spillway.request_id").as_deref(),
        Some("req-with")
    );
    let attempts = named(&spans, client_trace, "attempt");
    assert_eq!(attempts.len(), 1);
    let attempt = attempts[0];
    assert_eq!(attempt.parent_span_id, request.span_id);
    assert_eq!(attr(attempt, "spillway.tier").as_deref(), Some("vm"));
    assert_eq!(
        attr(attempt, "spillway.outcome").as_deref(),
        Some("response")
    );
    // The upstream's parent is the attempt span.
    assert_eq!(parent, hex(&attempt.span_id));
    assert!(
        receiver
            .spans
            .lock()
            .iter()
            .all(|(service, _)| service == "gw-test")
    );

    // /without: a root request span whose trace id the upstream and the access log have.
    let (trace, parent, flags) = upstream("/without");
    assert_eq!(flags, "01", "sample_ratio 1: sampled");
    let spans = receiver.wait_for("spans of /without", |s| {
        let s: Vec<Span> = s.iter().map(|(_, s)| s.clone()).collect();
        !named(&s, &trace, "request").is_empty() && !named(&s, &trace, "attempt").is_empty()
    });
    let request = named(&spans, &trace, "request")[0];
    assert!(request.parent_span_id.is_empty(), "a root span");
    let attempt = named(&spans, &trace, "attempt")[0];
    assert_eq!(attempt.parent_span_id, request.span_id);
    assert_eq!(parent, hex(&attempt.span_id));
    // The access log, in request order.
    let line = gw.proc.wait_line("path=/with ", LONG);
    assert!(line.contains(&format!("trace_id={client_trace}")), "{line}");
    let line = gw.proc.wait_line("path=/without", LONG);
    assert!(line.contains(&format!("trace_id={trace}")), "{line}");
}
