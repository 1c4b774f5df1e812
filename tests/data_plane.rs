//! Data-plane behaviour of the real gateway binary: TLS with ALPN h2, h2c, streaming
//! bodies both ways, the body limit (413), the header-read timeout (hyper's timer is
//! installed, http-cases C11 (a)), `Upgrade` pinning, the h2 side of the request
//! and response rules, h2 floods (C12) and trailers (C15), and the thread-per-core data
//! plane (`gateway.worker_threads`: connections spread over the workers, one drain and
//! one connection cap over all of them).

// Real processes on loopback: deadlines are wall-clock time.
#![allow(clippy::disallowed_methods)]

mod common;

use std::io::{Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::h2raw::{self, RawH2};
use common::stub::{Reply, Stub, StubRequest, ok_reply};
use common::*;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};

const LONG: Duration = Duration::from_secs(60);

fn gateway(extra: &str, libra: &str) -> Gateway {
    Gateway::start(&process_config(libra, extra))
}

fn one_vm() -> &'static str {
    "  decision_epochs: 1000\n  r_max_rps: 1000\n  rho: 1.0\n  min_vms: 1\n  cip_rps: 0"
}

#[test]
fn tls_listener_negotiates_h2_and_proxies() {
    let dir = tempfile::tempdir().unwrap();
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let cert_pem = cert.cert.pem();
    let cert_file = dir.path().join("cert.pem");
    let key_file = dir.path().join("key.pem");
    std::fs::write(&cert_file, &cert_pem).unwrap();
    std::fs::write(&key_file, cert.signing_key.serialize_pem()).unwrap();
    let port = free_port();
    let gw = gateway(
        &format!(
            "  tls:\n    listen: 127.0.0.1:{port}\n    cert_file: {}\n    key_file: {}",
            cert_file.display(),
            key_file.display()
        ),
        one_vm(),
    );
    gw.wait_status("VM ready", LONG, |s| u64_at(s, "/scaling/ready_vms") == 1);

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async move {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(cert.cert.der().clone()).unwrap();
        let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        config.alpn_protocols = vec![b"h2".to_vec()];
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let tls = connector.connect(name, tcp).await.unwrap();
        assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
        let (mut send, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
                .await
                .unwrap();
        tokio::spawn(conn);
        let req = http::Request::post("https://localhost/headers")
            .body(Full::new(Bytes::from_static(b"hello")))
            .unwrap();
        let resp = send.send_request(req).await.unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.version(), http::Version::HTTP_2);
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            v["headers"]["x-forwarded-proto"],
            serde_json::json!(["https"])
        );
        assert_eq!(v["headers"]["host"], serde_json::json!(["localhost"]));
        assert_eq!(v["body_bytes"], 5);
    });
}

#[test]
fn h2c_prior_knowledge_and_streaming_bodies_both_ways() {
    let gw = gateway("  max_body_bytes: 8000000", one_vm());
    gw.wait_status("VM ready", LONG, |s| u64_at(s, "/scaling/ready_vms") == 1);
    let addr = gw.proxy;
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async move {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (mut send, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
                .await
                .unwrap();
        tokio::spawn(conn);
        // 5 MB streamed up in 64 KiB chunks and echoed back.
        let chunks: std::collections::VecDeque<Bytes> = (0..80)
            .map(|i| Bytes::from(vec![(i % 251) as u8; 65_536]))
            .collect();
        let expected: Vec<u8> = (0..80)
            .flat_map(|i| vec![(i % 251) as u8; 65_536])
            .collect();
        let body = Chunks(chunks);
        let req = http::Request::post(format!("http://{addr}/echo"))
            .body(body)
            .unwrap();
        let resp = send.send_request(req).await.unwrap();
        assert_eq!(resp.status(), 200);
        let got = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(got.len(), expected.len());
        assert!(got[..] == expected[..], "echoed body differs");
    });
}

/// A request body delivered in separate frames, to exercise streaming.
struct Chunks(std::collections::VecDeque<Bytes>);

impl http_body::Body for Chunks {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        std::task::Poll::Ready(self.0.pop_front().map(|b| Ok(http_body::Frame::data(b))))
    }
}

#[test]
fn oversized_bodies_get_413_whether_declared_or_streamed() {
    let gw = gateway("  max_body_bytes: 1000", one_vm());
    gw.wait_status("VM ready", LONG, |s| u64_at(s, "/scaling/ready_vms") == 1);
    let (code, _, _) = http(gw.proxy, "POST", "/echo", &[], &[b'x'; 1001]);
    assert_eq!(code, 413);
    // Chunked, no Content-Length: the limit trips while streaming. (`/headers` reads the
    // whole body before answering; an upstream that starts its response first — `/echo` —
    // gets its response cut off instead, since the status line has already gone out.)
    let mut req = b"POST /headers HTTP/1.1\r\nHost: a\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    for _ in 0..4 {
        req.extend_from_slice(b"1f4\r\n");
        req.extend_from_slice(&[b'y'; 500]);
        req.extend_from_slice(b"\r\n");
    }
    req.extend_from_slice(b"0\r\n\r\n");
    let (code, _, _) = raw(gw.proxy, &req);
    assert_eq!(code, 413);
    let (code, _, body) = http(gw.proxy, "POST", "/echo", &[], &[b'z'; 1000]);
    assert_eq!(
        (code, body.len()),
        (200, 1000),
        "a body at the limit passes"
    );
}

#[test]
fn slow_headers_are_cut_off_by_the_header_read_timeout() {
    let gw = gateway("  header_read_timeout_seconds: 0.5", one_vm());
    let mut s = std::net::TcpStream::connect(gw.proxy).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: a\r\n").unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let started = Instant::now();
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf); // returns when the gateway closes the connection
    let waited = started.elapsed();
    assert!(
        waited < Duration::from_secs(5),
        "connection held open for {waited:?}"
    );
    let text = String::from_utf8_lossy(&buf);
    assert!(
        text.is_empty() || text.starts_with("HTTP/1.1 408"),
        "{text}"
    );

    // C11 (a): a client that drips one header byte at a time is cut off by the same
    // deadline (hyper's timer runs from the first byte, not per byte).
    let mut drip = std::net::TcpStream::connect(gw.proxy).unwrap();
    drip.write_all(b"GET / HTTP/1.1\r\n").unwrap();
    let started = Instant::now();
    let mut dripped = 0;
    while drip.write_all(b"X").is_ok() && started.elapsed() < Duration::from_secs(10) {
        dripped += 1;
        std::thread::sleep(Duration::from_millis(100)); // the client's pace, not a wait
    }
    let waited = started.elapsed();
    assert!(
        waited < Duration::from_secs(5),
        "dripping connection held for {waited:?} ({dripped} bytes)"
    );

    // A client that connects and sends nothing at all gets the same deadline (found by
    // a new-user trial: hyper's timer only starts at the first byte).
    let mut silent = std::net::TcpStream::connect(gw.proxy).unwrap();
    silent
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let started = Instant::now();
    let n = silent.read(&mut [0u8; 16]).unwrap_or(0);
    assert_eq!(n, 0, "closed without a response");
    let waited = started.elapsed();
    assert!(
        waited < Duration::from_secs(5),
        "silent connection held for {waited:?}"
    );
}

#[test]
fn upgrade_requests_are_pinned_to_vms_and_get_503_without_one() {
    // No VM at all (min_vms 0, no decision yet): an Upgrade cannot go to functions.
    let gw = gateway("", "  decision_epochs: 1000\n  min_vms: 0\n  cip_rps: 0");
    let (code, headers, _) = http(
        gw.proxy,
        "GET",
        "/ws",
        &[
            ("Connection", "Upgrade"),
            ("Upgrade", "websocket"),
            ("Sec-WebSocket-Version", "13"),
            ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
        ],
        b"",
    );
    assert_eq!(code, 503);
    assert_eq!(header(&headers, "retry-after"), Some("1"));
    // A plain request on the same gateway is served by a function.
    let (code, headers, _) = http(gw.proxy, "GET", "/", &[], b"");
    assert_eq!(code, 200);
    assert!(
        header(&headers, "x-spillway-instance")
            .unwrap()
            .starts_with("fn-")
    );
}

#[test]
fn a_malformed_chunked_body_is_the_clients_fault_400_not_502() {
    let gw = gateway("", one_vm());
    gw.wait_status("VM ready", LONG, |s| u64_at(s, "/scaling/ready_vms") == 1);
    let req = b"POST /headers HTTP/1.1\r\nHost: a\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\nbroken\r\n0\r\n\r\n";
    let (code, _, _) = raw(gw.proxy, req);
    assert_eq!(code, 400);
}

// ---------------------------------------------------------------------------------------
// Request and response rules over h2, http-cases C11 (a), C12, C15.
// ---------------------------------------------------------------------------------------

fn raw_reply(text: &str) -> Reply {
    Reply::Raw(text.as_bytes().to_vec())
}

/// Scripted upstream for the h2 tests: malformed framing, 1xx, trailers, held requests.
fn scripted(req: &StubRequest) -> Reply {
    match req.target.split('?').next().unwrap_or("") {
        "/framing/cl-te" => raw_reply(
            "HTTP/1.1 200 OK\r\nContent-Length: 100\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        ),
        "/early-hints" => raw_reply(
            "HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
        ),
        "/trailers" => raw_reply(
            "HTTP/1.1 200 OK\r\nContent-Type: application/grpc\r\nTrailer: grpc-status\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\ngrpc-status: 0\r\n\r\n",
        ),
        "/hold" => Reply::Hold,
        _ => ok_reply(req),
    }
}

/// An h2c (prior knowledge) client from the `h2` crate, which sends header fields as
/// given (a `host` next to `:authority`, split `cookie` fields).
async fn h2_client(addr: std::net::SocketAddr) -> h2::client::SendRequest<Bytes> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (client, conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client
}

struct H2Response {
    status: u16,
    headers: http::HeaderMap,
    body: Vec<u8>,
    trailers: Option<http::HeaderMap>,
}

async fn h2_send(
    client: &mut h2::client::SendRequest<Bytes>,
    req: http::Request<()>,
    body: &[u8],
) -> Result<H2Response, h2::Error> {
    let mut c = client.clone().ready().await?;
    let (resp, mut send) = c.send_request(req, body.is_empty())?;
    if !body.is_empty() {
        send.send_data(Bytes::copy_from_slice(body), true)?;
    }
    let resp = resp.await?;
    let (parts, mut recv) = resp.into_parts();
    let mut out = Vec::new();
    while let Some(chunk) = recv.data().await {
        let chunk = chunk?;
        let _ = recv.flow_control().release_capacity(chunk.len());
        out.extend_from_slice(&chunk);
    }
    let trailers = recv.trailers().await?;
    Ok(H2Response {
        status: parts.status.as_u16(),
        headers: parts.headers,
        body: out,
        trailers,
    })
}

fn h2_get(uri: &str, headers: &[(&str, &str)]) -> http::Request<()> {
    let mut b = http::Request::get(uri);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(()).unwrap()
}

/// Host, header limits, target forms and cookies over h2: `:authority` against `Host`,
/// the same header
/// and target limits as HTTP/1.1 (431/414, C11 (b)–(c)), CONNECT → 405, split cookie
/// fields joined with "; ".
#[test]
fn h2_authority_limits_connect_and_cookies() {
    let stub = Stub::start(scripted);
    let gw = Gateway::start(&static_config(
        &[stub.url()],
        "  max_header_bytes: 2048\n  max_header_count: 20\n  max_uri_bytes: 1024",
    ));
    let defaults = Gateway::start(&static_config(&[stub.url()], ""));
    let (addr, default_addr) = (gw.proxy, defaults.proxy);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async move {
        let mut c = h2_client(addr).await;
        // A Host that differs from :authority is malformed; :authority is the Host.
        let r = h2_send(
            &mut c,
            h2_get("http://a.example/mismatch", &[("host", "b.example")]),
            b"",
        )
        .await
        .unwrap();
        assert_eq!(r.status, 400);
        let r = h2_send(&mut c, h2_get("http://a.example/auth", &[]), b"")
            .await
            .unwrap();
        assert_eq!(r.status, 200);
        let r = h2_send(
            &mut c,
            h2_get("http://a.example/same", &[("host", "A.example")]),
            b"",
        )
        .await
        .unwrap();
        assert_eq!(r.status, 200);
        // Split cookie crumbs become one field.
        let r = h2_send(
            &mut c,
            h2_get(
                "http://a.example/cookies",
                &[("cookie", "a=1"), ("cookie", "b=2")],
            ),
            b"",
        )
        .await
        .unwrap();
        assert_eq!(r.status, 200);
        // Exactly at the limits passes; one past gets 431 / 414. Fields:
        // x-pad = 5 + |v| + 4 (the h2 request carries no other regular field).
        let pad = "v".repeat(2048 - 9);
        let r = h2_send(
            &mut c,
            h2_get("http://a.example/h-at", &[("x-pad", &pad)]),
            b"",
        )
        .await
        .unwrap();
        assert_eq!(r.status, 200);
        let pad = "v".repeat(2049 - 9);
        let r = h2_send(
            &mut c,
            h2_get("http://a.example/h-over", &[("x-pad", &pad)]),
            b"",
        )
        .await
        .unwrap();
        assert_eq!(r.status, 431);
        let names: Vec<String> = (0..21).map(|i| format!("x-{i}")).collect();
        let many: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "1")).collect();
        let r = h2_send(&mut c, h2_get("http://a.example/n-at", &many[..20]), b"")
            .await
            .unwrap();
        assert_eq!(r.status, 200);
        let r = h2_send(&mut c, h2_get("http://a.example/n-over", &many), b"")
            .await
            .unwrap();
        assert_eq!(r.status, 431);
        let target = |n: usize| format!("http://a.example/u{}", "u".repeat(n - 2));
        let r = h2_send(&mut c, h2_get(&target(1024), &[]), b"")
            .await
            .unwrap();
        assert_eq!(r.status, 200);
        let r = h2_send(&mut c, h2_get(&target(1025), &[]), b"")
            .await
            .unwrap();
        assert_eq!(r.status, 414);
        // CONNECT → 405 with Allow.
        let connect = http::Request::builder()
            .method(http::Method::CONNECT)
            .uri("internal.example:443")
            .body(())
            .unwrap();
        let r = h2_send(&mut c, connect, b"").await.unwrap();
        assert_eq!(r.status, 405);
        assert_eq!(
            r.headers["allow"],
            "GET, HEAD, POST, PUT, DELETE, OPTIONS, TRACE, PATCH"
        );
        // The connection survived every refusal.
        let r = h2_send(&mut c, h2_get("http://a.example/last", &[]), b"")
            .await
            .unwrap();
        assert_eq!(r.status, 200);

        // C11 (b) and (c) against the defaults (16 KiB, 100 fields).
        let mut d = h2_client(default_addr).await;
        let big = "b".repeat(100 * 1024);
        let r = h2_send(
            &mut d,
            h2_get("http://a.example/c11b", &[("x-big", &big)]),
            b"",
        )
        .await
        .unwrap();
        assert_eq!(r.status, 431, "C11 (b)");
        let names: Vec<String> = (0..200).map(|i| format!("x-{i}")).collect();
        let many: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "1")).collect();
        let mut d = h2_client(default_addr).await;
        let r = h2_send(&mut d, h2_get("http://a.example/c11c", &many), b"")
            .await
            .unwrap();
        assert_eq!(r.status, 431, "C11 (c)");
    });
    let seen: Vec<String> = stub.requests().into_iter().map(|r| r.target).collect();
    assert_eq!(
        seen,
        [
            "/auth",
            "/same",
            "/cookies",
            "/h-at",
            "/n-at",
            &format!("/u{}", "u".repeat(1022)),
            "/last"
        ]
    );
    assert_eq!(stub.requests_to("/auth")[0].all("host"), ["a.example"]);
    assert_eq!(
        stub.requests_to("/auth")[0].all("x-forwarded-host"),
        ["a.example"]
    );
    assert_eq!(stub.requests_to("/cookies")[0].all("cookie"), ["a=1; b=2"]);
}

/// Response framing, informational responses and http-cases C15 over h2: Content-Length
/// next to chunked is
/// dropped (an h2 client would reject the mismatch), a 103 does not break the exchange,
/// and the upstream's trailers reach the client (`te: trailers` reaches the upstream).
#[test]
fn h2_response_framing_early_hints_and_c15_trailers() {
    let stub = Stub::start(scripted);
    let gw = Gateway::start(&static_config(&[stub.url()], ""));
    let addr = gw.proxy;
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async move {
        let mut c = h2_client(addr).await;
        let r = h2_send(&mut c, h2_get("http://a/framing/cl-te", &[]), b"")
            .await
            .unwrap();
        assert_eq!((r.status, r.body.as_slice()), (200, &b"hello"[..]));
        assert!(r.headers.get("content-length").is_none());
        let r = h2_send(&mut c, h2_get("http://a/early-hints", &[]), b"")
            .await
            .unwrap();
        assert_eq!((r.status, r.body.as_slice()), (200, &b"ok"[..]));
        let req = http::Request::post("http://a/trailers")
            .header("te", "trailers")
            .header("content-type", "application/grpc")
            .body(())
            .unwrap();
        let r = h2_send(&mut c, req, b"\0\0\0\0\0").await.unwrap();
        assert_eq!((r.status, r.body.as_slice()), (200, &b"hello"[..]));
        let trailers = r.trailers.expect("C15: trailers reach the h2 client");
        assert_eq!(trailers["grpc-status"], "0");
    });
    let t = stub.requests_to("/trailers");
    assert_eq!(t[0].all("te"), ["trailers"]);
    assert_eq!(t[0].body, b"\0\0\0\0\0");
}

fn c12_gateway(stub: &Stub) -> Gateway {
    Gateway::start(&static_config(
        &[stub.url()],
        "  max_concurrent_streams: 8\n  upstream_timeout_seconds: 30",
    ))
}

/// http-cases C12: the upstream never sees more requests at once than the configured
/// `max_concurrent_streams`, even from a client that ignores the setting (the extra
/// streams are refused), and a cancelled stream cancels its upstream call.
#[test]
fn c12_streams_over_the_limit_are_refused_and_cancels_reach_the_upstream() {
    let stub = Stub::start(scripted);
    let gw = c12_gateway(&stub);
    let mut h2 = RawH2::connect(gw.proxy);
    let mut burst = Vec::new();
    for i in 0..24u32 {
        let block = h2raw::request_block("GET", "/hold", "a");
        burst.extend(h2raw::frame(
            h2raw::HEADERS,
            h2raw::END_STREAM | h2raw::END_HEADERS,
            2 * i + 1,
            &block,
        ));
    }
    assert!(h2.send(&burst));
    let seen = h2.wait("16 refused streams", LONG, |s| s.resets.len() >= 16);
    assert!(
        seen.resets
            .iter()
            .all(|&(_, code)| code == h2raw::REFUSED_STREAM),
        "{seen:?}"
    );
    stub.wait("8 held requests", LONG, |s| s.in_flight() == 8);
    assert_eq!(stub.peak_in_flight(), 8);
    assert_eq!(stub.requests().len(), 8);

    // Cancel every open stream: each upstream call is dropped (its connection closed).
    let open: Vec<u32> = (0..24u32)
        .map(|i| 2 * i + 1)
        .filter(|id| !seen.resets.iter().any(|(r, _)| r == id))
        .collect();
    assert_eq!(open.len(), 8);
    for id in open {
        assert!(h2.send(&h2raw::frame(
            h2raw::RST_STREAM,
            0,
            id,
            &h2raw::CANCEL.to_be_bytes()
        )));
    }
    stub.wait("upstream calls cancelled", LONG, |s| s.in_flight() == 0);
    assert_eq!(stub.peak_in_flight(), 8);
    assert!(
        h2.seen().goaway.is_none(),
        "a legitimate client keeps its connection"
    );
}

/// http-cases C12: 20,000 rounds of HEADERS(END_STREAM) + RST_STREAM(CANCEL) end in
/// GOAWAY(ENHANCE_YOUR_CALM) long before the last round, the upstream never sees more
/// than `max_concurrent_streams` requests at once, and the gateway's memory stays flat.
#[test]
fn c12_rapid_reset_flood_gets_goaway() {
    let stub = Stub::start(scripted);
    let gw = c12_gateway(&stub);
    let pid = gw.proc.child.id();
    let rss_before = rss_kib(pid);
    let mut h2 = RawH2::connect(gw.proxy);
    let block = h2raw::request_block("GET", "/hold", "a");
    let mut rounds = 0u32;
    'flood: while rounds < 20_000 {
        let mut batch = Vec::new();
        for _ in 0..50 {
            let id = 2 * rounds + 1;
            batch.extend(h2raw::frame(
                h2raw::HEADERS,
                h2raw::END_STREAM | h2raw::END_HEADERS,
                id,
                &block,
            ));
            batch.extend(h2raw::frame(
                h2raw::RST_STREAM,
                0,
                id,
                &h2raw::CANCEL.to_be_bytes(),
            ));
            rounds += 1;
        }
        if !h2.send(&batch) {
            break 'flood;
        }
        let s = h2.seen();
        if s.goaway.is_some() || s.closed {
            break;
        }
    }
    let seen = h2.wait("GOAWAY", LONG, |s| s.goaway.is_some() || s.closed);
    eprintln!(
        "rapid reset: GOAWAY {:?} after {rounds} rounds; upstream saw {} requests, peak {} in flight",
        seen.goaway,
        stub.requests().len(),
        stub.peak_in_flight()
    );
    let (last_stream, code) = seen.goaway.expect("GOAWAY, not a bare close");
    assert_eq!(code, h2raw::ENHANCE_YOUR_CALM, "{seen:?}");
    // The server processed at most ~MAX_PENDING_ACCEPT_RESET_STREAMS (100) streams plus
    // those it had accepted; the client's own count is only how far its socket buffers
    // let it run ahead.
    assert!(
        last_stream < 2 * 1000,
        "GOAWAY only after stream {last_stream}"
    );
    assert!(stub.peak_in_flight() <= 8, "peak {}", stub.peak_in_flight());
    stub.wait("upstream calls cancelled", LONG, |s| s.in_flight() == 0);
    let grown = rss_kib(pid).saturating_sub(rss_before);
    assert!(grown < 64 * 1024, "gateway RSS grew by {grown} KiB");
    // Only that connection was closed.
    let (code, _, body) = http(gw.proxy, "GET", "/after-flood", &[], b"");
    assert_eq!((code, body.as_slice()), (200, &b"path=/after-flood"[..]));
}

/// http-cases C12, the paced variant of rapid reset: the client lets every stream reach
/// the upstream before it cancels it, so h2's pending-accept limit never counts it. The
/// gateway closes a connection whose client cancelled `MAX_CANCELLED_REQUESTS` (100)
/// requests before their response, when they are at least half of its requests.
#[test]
fn c12_paced_rapid_reset_closes_the_connection() {
    let stub = Stub::start(scripted);
    let gw = c12_gateway(&stub);
    let mut h2 = RawH2::connect(gw.proxy);
    let block = h2raw::request_block("GET", "/hold", "a");
    let mut streams = 0u32;
    let mut ended = false;
    for _round in 0..250 {
        let ids: Vec<u32> = (0..8).map(|k| 2 * (streams + k) + 1).collect();
        let mut batch = Vec::new();
        for &id in &ids {
            batch.extend(h2raw::frame(
                h2raw::HEADERS,
                h2raw::END_STREAM | h2raw::END_HEADERS,
                id,
                &block,
            ));
        }
        if !h2.send(&batch) {
            ended = true;
            break;
        }
        // Pace: every stream of the round has reached the upstream (or the gateway
        // ended the connection).
        let want = (streams + 8) as usize;
        let deadline = Instant::now() + LONG;
        while stub.requests().len() < want && !h2.seen().closed && h2.seen().goaway.is_none() {
            assert!(Instant::now() < deadline, "round stalled: {:?}", h2.seen());
            std::thread::sleep(Duration::from_millis(2));
        }
        streams += 8;
        let mut resets = Vec::new();
        for &id in &ids {
            resets.extend(h2raw::frame(
                h2raw::RST_STREAM,
                0,
                id,
                &h2raw::CANCEL.to_be_bytes(),
            ));
        }
        let s = h2.seen();
        if !h2.send(&resets) || s.closed || s.goaway.is_some() {
            ended = true;
            break;
        }
    }
    let seen = h2.wait("the connection to end", LONG, |s| s.closed);
    eprintln!(
        "paced rapid reset: ended={ended} after {streams} streams; upstream saw {} requests; {seen:?}",
        stub.requests().len()
    );
    assert!(streams < 2000, "the gateway never ended the connection");
    assert!(
        stub.requests().len() <= 2 * 100 + 8,
        "{}",
        stub.requests().len()
    );
    stub.wait("upstream calls cancelled", LONG, |s| s.in_flight() == 0);
    let (code, _, _) = http(gw.proxy, "GET", "/after-flood", &[], b"");
    assert_eq!(code, 200);
}

/// http-cases C12: an endless CONTINUATION sequence is cut off with GOAWAY after a
/// bounded number of frames; no request reaches the upstream.
#[test]
fn c12_continuation_flood_gets_goaway() {
    let stub = Stub::start(scripted);
    let gw = c12_gateway(&stub);
    let mut h2 = RawH2::connect(gw.proxy);
    let start = h2raw::request_block("GET", "/never", "a");
    assert!(h2.send(&h2raw::frame(h2raw::HEADERS, 0, 1, &start)));
    let crumb: Vec<u8> = (0..16)
        .flat_map(|i| h2raw::literal(&format!("x-c{i}"), "continuation-flood-value"))
        .collect();
    let mut frames = 0;
    while frames < 100_000 {
        if !h2.send(&h2raw::frame(h2raw::CONTINUATION, 0, 1, &crumb)) {
            break;
        }
        frames += 1;
        let s = h2.seen();
        if s.goaway.is_some() || s.closed {
            break;
        }
    }
    let seen = h2.wait("GOAWAY", LONG, |s| s.goaway.is_some() || s.closed);
    eprintln!(
        "CONTINUATION flood: {seen:?} after {frames} frames ({} bytes)",
        h2.written
    );
    assert_eq!(
        seen.goaway.map(|(_, code)| code),
        Some(h2raw::ENHANCE_YOUR_CALM),
        "{seen:?}"
    );
    assert!(frames < 100_000, "the server never closed the connection");
    assert!(stub.requests().is_empty());
}

/// http-cases C12: 100,000 empty DATA frames on one stream get GOAWAY (h2 allows 100
/// empty frames per connection); the gateway's memory stays flat and the stream's
/// upstream call ends.
#[test]
fn c12_empty_data_frame_flood_gets_goaway() {
    let stub = Stub::start(scripted);
    let gw = c12_gateway(&stub);
    let pid = gw.proc.child.id();
    let rss_before = rss_kib(pid);
    let mut h2 = RawH2::connect(gw.proxy);
    let block = h2raw::request_block("POST", "/hold", "a");
    assert!(h2.send(&h2raw::frame(h2raw::HEADERS, h2raw::END_HEADERS, 1, &block)));
    let empty = h2raw::frame(h2raw::DATA, 0, 1, &[]);
    let batch: Vec<u8> = empty
        .iter()
        .copied()
        .cycle()
        .take(empty.len() * 1000)
        .collect();
    let mut sent = 0;
    while sent < 100_000 {
        if !h2.send(&batch) {
            break;
        }
        sent += 1000;
        let s = h2.seen();
        if s.goaway.is_some() || s.closed {
            break;
        }
    }
    let seen = h2.wait("GOAWAY", LONG, |s| s.goaway.is_some() || s.closed);
    eprintln!("empty DATA flood: {seen:?} after {sent} frames");
    assert_eq!(
        seen.goaway.map(|(_, code)| code),
        Some(h2raw::ENHANCE_YOUR_CALM),
        "{seen:?}"
    );
    // The stream's upstream call ends with the connection.
    stub.wait("upstream call cancelled", LONG, |s| s.in_flight() == 0);
    let grown = rss_kib(pid).saturating_sub(rss_before);
    assert!(grown < 64 * 1024, "gateway RSS grew by {grown} KiB");
}

// ---------------------------------------------------------------------------------------
// Thread per core: `gateway.worker_threads` data-plane threads, each with its own
// SO_REUSEPORT listener; one connection budget and one drain over all of them.
// ---------------------------------------------------------------------------------------

/// `(worker, connections accepted)` of every `spillway_worker_connections_total` series.
fn worker_connections(gw: &Gateway) -> Vec<(String, f64)> {
    let (code, _, body) = http(gw.admin, "GET", "/metrics", &[], b"");
    assert_eq!(code, 200);
    String::from_utf8_lossy(&body)
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("spillway_worker_connections_total{worker=\"")?;
            let (worker, value) = rest.split_once("\"} ")?;
            Some((worker.to_string(), value.trim().parse().ok()?))
        })
        .collect()
}

/// Workers that accepted at least one connection.
fn busy_workers(per_worker: &[(String, f64)]) -> usize {
    per_worker.iter().filter(|(_, n)| *n > 0.0).count()
}

#[test]
fn one_and_three_worker_threads_serve_concurrent_connections() {
    let stub = Stub::start(ok_reply);
    for workers in [1, 3] {
        let gw = Gateway::start(&static_config(
            &[stub.url()],
            &format!("  worker_threads: {workers}"),
        ));
        let clients: Vec<_> = (0..24)
            .map(|i| {
                let proxy = gw.proxy;
                std::thread::spawn(move || {
                    http(proxy, "GET", &format!("/w{workers}/{i}"), &[], b"").0
                })
            })
            .collect();
        let codes: Vec<u16> = clients.into_iter().map(|c| c.join().unwrap()).collect();
        assert!(
            codes.iter().all(|c| *c == 200),
            "{workers} workers: {codes:?}"
        );
        let per_worker = worker_connections(&gw);
        assert_eq!(
            per_worker.len(),
            workers,
            "one series per worker: {per_worker:?}"
        );
        let total: f64 = per_worker.iter().map(|(_, n)| n).sum();
        assert_eq!(total, 24.0, "{per_worker:?}");
        if workers > 1 {
            // The kernel spreads connections over the listeners (24 on one of 3 by
            // chance: 3 · 3⁻²⁴).
            assert!(busy_workers(&per_worker) >= 2, "{per_worker:?}");
        }
    }
}

/// SIGTERM while requests are in flight on several workers: the drain waits for all of
/// them (not only the first worker's), then the gateway exits 0.
#[test]
fn graceful_drain_waits_for_in_flight_requests_on_every_worker() {
    let release = Arc::new((parking_lot::Mutex::new(false), parking_lot::Condvar::new()));
    let held = Arc::clone(&release);
    let stub = Stub::start(move |req: &StubRequest| {
        if req.target.starts_with("/slow") {
            let (lock, cv) = &*held;
            let mut guard = lock.lock();
            let _ = cv.wait_while_for(&mut guard, |released| !*released, LONG);
        }
        ok_reply(req)
    });
    let gw = Gateway::start(&static_config(
        &[stub.url()],
        "  worker_threads: 3\n  drain_timeout_seconds: 60",
    ));
    let n = 12;
    let in_flight: Vec<_> = (0..n)
        .map(|i| {
            let proxy = gw.proxy;
            std::thread::spawn(move || http(proxy, "GET", &format!("/slow{i}"), &[], b"").0)
        })
        .collect();
    stub.wait("every slow request upstream", LONG, |s| s.in_flight() == n);
    let per_worker = worker_connections(&gw);
    assert!(
        busy_workers(&per_worker) >= 2,
        "requests in flight on more than the first worker: {per_worker:?}"
    );
    gw.proc.signal("TERM");
    gw.proc.wait_line("shutting down: draining", LONG);
    let (lock, cv) = &*release;
    *lock.lock() = true;
    cv.notify_all();
    let codes: Vec<u16> = in_flight.into_iter().map(|t| t.join().unwrap()).collect();
    assert!(codes.iter().all(|c| *c == 200), "{codes:?}");
    let mut proc = gw.proc;
    assert_eq!(proc.wait_exit(LONG), Some(0), "{}", proc.log_text());
}

/// `max_connections` is one budget over all workers: with the held connections spread
/// over several workers, one more on any worker is closed at accept.
#[test]
fn the_connection_cap_counts_the_connections_of_every_worker() {
    let stub = Stub::start(ok_reply);
    let gw = Gateway::start(&static_config(
        &[stub.url()],
        "  worker_threads: 4\n  max_connections: 8\n  max_connections_per_client_ip: 8\n  keepalive_idle_timeout_seconds: 300",
    ));
    let get = |path: &str| format!("GET {path} HTTP/1.1\r\nHost: a\r\n\r\n");
    let mut held = Vec::new();
    for i in 0..8 {
        let mut c = common::stub::Client::connect(gw.proxy);
        let r = c.send(get(&format!("/held{i}")).as_bytes()).response();
        assert_eq!(r.map(|r| r.status), Some(200), "connection {i}");
        held.push(c);
    }
    let per_worker = worker_connections(&gw);
    // 8 on one of 4 workers by chance: 4 · 4⁻⁸.
    assert!(busy_workers(&per_worker) >= 2, "{per_worker:?}");
    for i in 0..3 {
        let mut c = common::stub::Client::connect(gw.proxy);
        let r = c.send(get(&format!("/over{i}")).as_bytes()).response();
        assert!(r.is_none(), "connection {i} over the cap was served");
    }
    assert!(
        stub.requests()
            .iter()
            .all(|r| !r.target.starts_with("/over"))
    );
    let (_, _, body) = http(gw.admin, "GET", "/metrics", &[], b"");
    let text = String::from_utf8_lossy(&body);
    let refused = text
        .lines()
        .find(|l| {
            l.starts_with("spillway_connections_refused_total")
                && l.contains(r#"limit="max_connections""#)
                && l.contains(r#"listener="proxy""#)
        })
        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok());
    assert_eq!(refused, Some(3.0), "{text}");
    drop(held);
}
