//! Span export over OTLP/HTTP (`telemetry.otlp`, the `otlp` feature): the real gateway
//! sends its spans to a small OTLP receiver on loopback (a hyper server in the test that
//! decodes the protobuf requests); the spans' ids and parents agree with the client's
//! `traceparent`, with the one the upstream saw and with the access log; a request that
//! waits in the gateway queue has a `queue_wait` span and one that starts a function
//! instance a `cold_start` span, each under its own parent; an `https://` receiver
//! (a test CA's certificate) gets the spans over TLS.
#![cfg(feature = "otlp")]
// Blocking test code: std's clock for the polling deadlines (no tokio time here).
#![allow(clippy::disallowed_methods)]

mod common;
#[path = "common/tls.rs"]
#[allow(dead_code)] // The TLS upstreams of the module serve other test binaries.
mod tls;

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

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
use common::{Gateway, SampleApi, exe, http, static_config, u64_at};

const LONG: Duration = Duration::from_secs(30);

/// An OTLP/HTTP traces receiver on 127.0.0.1:0 (`https://` with a TLS acceptor): every
/// span it was sent, with the `service.name` of its resource.
struct Receiver {
    url: String,
    spans: Arc<Mutex<Vec<(String, Span)>>>,
    _runtime: tokio::runtime::Runtime,
}

impl Receiver {
    fn start() -> Receiver {
        Receiver::start_with(None)
    }

    fn start_with(tls: Option<tokio_rustls::TlsAcceptor>) -> Receiver {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let scheme = if tls.is_some() { "https" } else { "http" };
        let url = format!("{scheme}://{}/v1/traces", listener.local_addr().unwrap());
        let spans = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&spans);
        runtime.spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let sink = Arc::clone(&sink);
                let tls = tls.clone();
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
                    let http = hyper::server::conn::http1::Builder::new();
                    let _ = match tls {
                        None => http.serve_connection(TokioIo::new(stream), service).await,
                        Some(tls) => match tls.accept(stream).await {
                            Ok(stream) => {
                                http.serve_connection(TokioIo::new(stream), service).await
                            }
                            Err(_) => return,
                        },
                    };
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

/// Nanoseconds since the Unix epoch, as in a span's start and end times.
fn unix_nanos(t: SystemTime) -> u64 {
    u64::try_from(t.duration_since(UNIX_EPOCH).unwrap().as_nanos()).unwrap()
}

/// The one `request` span with `spillway.request_id` `id`.
fn request_span<'a>(spans: &'a [Span], id: &str) -> &'a Span {
    let found: Vec<&Span> = spans
        .iter()
        .filter(|s| s.name == "request" && attr(s, "spillway.request_id").as_deref() == Some(id))
        .collect();
    assert_eq!(found.len(), 1, "request spans of {id}: {found:#?}");
    found[0]
}

/// The spans named `name` whose parent is `parent`.
fn children<'a>(spans: &'a [Span], parent: &Span, name: &str) -> Vec<&'a Span> {
    spans
        .iter()
        .filter(|s| {
            s.trace_id == parent.trace_id && s.parent_span_id == parent.span_id && s.name == name
        })
        .collect()
}

#[test]
fn a_queued_request_has_a_queue_wait_span_and_a_cold_start_has_one_under_its_attempt() {
    let receiver = Receiver::start();
    // One VM slot and one function instance (a sample API started on its first call):
    // the first request holds the VM, the second cold-starts the instance and holds
    // it, the third waits in the gateway queue until one of them is done.
    let vm = SampleApi::start("vm");
    let yaml = format!(
        r#"
gateway:
  listen: 127.0.0.1:0
  admin_listen: 127.0.0.1:0
  allow_loopback_upstreams: true
libra:
  decision_epochs: 1000
  r_max_rps: 1000
  rho: 1.0
vm_pool:
  type: static
  urls: ["http://{vm}"]
  slots_per_vm: 1
function_tier:
  type: process
  command: ["{exe}", "sample-api", "--listen", "127.0.0.1:{{port}}", "--name", "fn-{{port}}"]
  max_instances: 1
  probe_interval_seconds: 0.02
queue:
  max_queue_length: 4
  max_queue_wait_seconds: 30
telemetry:
  otlp:
    endpoint: {url}
    timeout_ms: 2000
"#,
        vm = vm.addr,
        exe = exe(),
        url = receiver.url
    );
    let gw = Gateway::start_env(&yaml, &[("OTEL_BSP_SCHEDULE_DELAY".into(), "100".into())]);
    let call = |id: &'static str, ms: u64| {
        let addr = gw.proxy;
        std::thread::spawn(move || {
            let path = format!("/sleep?ms={ms}");
            http(addr, "GET", &path, &[("x-request-id", id)], b"").0
        })
    };
    let wait = Duration::from_secs(20);
    const HOLD_MS: u64 = 1500;
    let held_from = SystemTime::now();
    let vm_call = call("holds-the-vm", HOLD_MS);
    gw.wait_status("the VM slot taken", wait, |s| {
        u64_at(s, "/vm_pool/vms/0/outstanding") == 1
    });
    let cold_call = call("cold-starts", HOLD_MS);
    gw.wait_status("the function instance taken", wait, |s| {
        u64_at(s, "/functions/zones/0/stats/instances") == 1
    });
    let queued_call = call("queued", 1);
    gw.wait_status("the third request queued", wait, |s| {
        s.pointer("/queue/length").and_then(|v| v.as_u64()) == Some(1)
    });
    let seen_queued = SystemTime::now();
    for c in [vm_call, cold_call, queued_call] {
        assert_eq!(c.join().unwrap(), 200);
    }

    let spans = receiver.wait_for("the three requests' spans", |s| {
        let names = |n: &str| s.iter().filter(|(_, x)| x.name == n).count();
        names("request") >= 3
            && names("attempt") >= 3
            && names("queue_wait") >= 1
            && names("cold_start") >= 1
    });

    // The queued request: one queue_wait under its request span, from before the test
    // saw it queued until a slot freed (at least HOLD_MS after the VM was taken), and
    // its attempt only after it.
    let queued = request_span(&spans, "queued");
    let waits = children(&spans, queued, "queue_wait");
    assert_eq!(waits.len(), 1, "{spans:#?}");
    let qw = waits[0];
    assert!(qw.start_time_unix_nano >= queued.start_time_unix_nano);
    assert!(
        qw.start_time_unix_nano <= unix_nanos(seen_queued),
        "queue_wait starts after the request was seen queued"
    );
    let freed = unix_nanos(held_from + Duration::from_millis(HOLD_MS));
    assert!(
        qw.end_time_unix_nano >= freed,
        "queue_wait ends {} ms before the first slot could free",
        (freed - qw.end_time_unix_nano) / 1_000_000
    );
    let attempts = children(&spans, queued, "attempt");
    assert_eq!(attempts.len(), 1, "{spans:#?}");
    assert!(attempts[0].start_time_unix_nano >= qw.end_time_unix_nano);
    assert!(qw.end_time_unix_nano <= queued.end_time_unix_nano);

    // The cold start: a cold_start span under the function attempt, inside it, in the
    // attempt's zone; the request itself never waited in the queue.
    let cold = request_span(&spans, "cold-starts");
    let attempts = children(&spans, cold, "attempt");
    assert_eq!(attempts.len(), 1, "{spans:#?}");
    let attempt = attempts[0];
    assert_eq!(attr(attempt, "spillway.tier").as_deref(), Some("function"));
    let starts = children(&spans, attempt, "cold_start");
    assert_eq!(starts.len(), 1, "{spans:#?}");
    let cs = starts[0];
    let zone = attr(cs, "spillway.zone").expect("spillway.zone");
    let upstream = attr(attempt, "spillway.upstream").unwrap();
    assert!(
        upstream.starts_with(&format!("{zone}/")),
        "{upstream} in zone {zone}"
    );
    assert!(cs.start_time_unix_nano >= attempt.start_time_unix_nano);
    assert!(cs.end_time_unix_nano <= attempt.end_time_unix_nano);
    assert!(cs.end_time_unix_nano > cs.start_time_unix_nano);
    assert!(
        children(&spans, cold, "queue_wait").is_empty(),
        "{spans:#?}"
    );

    // The request on the VM: neither a queue wait nor a cold start.
    let warm = request_span(&spans, "holds-the-vm");
    assert!(
        children(&spans, warm, "queue_wait").is_empty(),
        "{spans:#?}"
    );
    let attempts = children(&spans, warm, "attempt");
    assert_eq!(attempts.len(), 1);
    assert_eq!(attr(attempts[0], "spillway.tier").as_deref(), Some("vm"));
    assert!(children(&spans, attempts[0], "cold_start").is_empty());
}

#[test]
fn spans_reach_an_https_collector_whose_certificate_the_system_roots_trust() {
    let dir = tempfile::tempdir().unwrap();
    let ca = tls::TestCa::new(dir.path(), "collector");
    let leaf = ca.leaf(
        dir.path(),
        "collector",
        &["localhost", "127.0.0.1"],
        tls::Validity::Valid,
        false,
    );
    let receiver = Receiver::start_with(Some(tls::acceptor(&leaf, None)));
    let stub = Stub::start(ok_reply);
    let url = receiver.url.replace("127.0.0.1", "localhost");
    assert!(url.starts_with("https://localhost:"), "{url}");
    let yaml = |url: &str| {
        format!(
            "{}\ntelemetry:\n  otlp:\n    endpoint: {url}\n    timeout_ms: 2000\n",
            static_config(&[stub.url()], "")
        )
    };
    let env = |roots: &std::path::Path| {
        vec![
            ("OTEL_BSP_SCHEDULE_DELAY".to_string(), "100".to_string()),
            // The system roots: the test CA only.
            ("SSL_CERT_FILE".to_string(), roots.display().to_string()),
            (
                "SSL_CERT_DIR".to_string(),
                dir.path().join("none").display().to_string(),
            ),
        ]
    };

    // Trusted: the request's spans arrive over TLS (by host name and by IP address).
    for url in [url.as_str(), receiver.url.as_str()] {
        let gw = Gateway::start_env(&yaml(url), &env(&ca.ca_file));
        let (code, _, _) = http(gw.proxy, "GET", "/over-tls", &[("x-request-id", url)], b"");
        assert_eq!(code, 200);
        receiver.wait_for("spans over TLS", |s| {
            s.iter().any(|(_, x)| {
                x.name == "request" && attr(x, "spillway.request_id").as_deref() == Some(url)
            })
        });
    }

    // Another CA's roots: the handshake fails, the export fails with a warning and the
    // request is served all the same.
    let other = tls::TestCa::new(dir.path(), "other");
    let gw = Gateway::start_env(&yaml(&url), &env(&other.ca_file));
    let (code, _, _) = http(gw.proxy, "GET", "/untrusted", &[], b"");
    assert_eq!(code, 200);
    let line = gw.proc.wait_line("span export failed", LONG);
    assert!(line.contains("WARN"), "{line}");
}
