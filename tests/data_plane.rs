//! Data-plane behaviour of the real gateway binary: TLS with ALPN h2, h2c, streaming
//! bodies both ways, the body limit (413), the header-read timeout (hyper's timer is
//! installed), and `Upgrade` pinning.

// Real processes on loopback: deadlines are wall-clock time.
#![allow(clippy::disallowed_methods)]

mod common;

use std::io::{Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
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
