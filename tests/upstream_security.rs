//! The upstream address policy and HTTPS upstreams, against the real gateway binary:
//! non-canonical IP spellings and credential agents refused by `spillway check` with
//! their location, the gateway's own listeners never connected to (loopback-bound and
//! `0.0.0.0`-bound), names that resolve to refused addresses filtered at connect time,
//! and `https://` upstreams (a private CA, h2 by ALPN, mutual TLS) whose certificate
//! errors are a 502 and one log line naming the upstream and why. Real processes on
//! 127.0.0.1, polling with deadlines.
#![allow(clippy::disallowed_methods)]

mod common;
#[path = "common/tls.rs"]
mod tls;

use std::time::Duration;

use common::{Gateway, exe, free_port, http};
use tls::{TestCa, Validity};

/// `spillway check` on `yaml`: exit code and stderr.
fn check(dir: &std::path::Path, yaml: &str) -> (Option<i32>, String) {
    let path = dir.join("check.yaml");
    std::fs::write(&path, yaml).unwrap();
    let out = std::process::Command::new(exe())
        .args(["check", path.to_str().unwrap()])
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn static_and_http(opt_in: bool, vm: &str, function: &str) -> String {
    format!(
        "gateway:\n  allow_loopback_upstreams: {opt_in}\nvm_pool:\n  type: static\n  urls: [\"{vm}\"]\nfunction_tier:\n  type: http\n  url: \"{function}\"\n  max_concurrency: 4\n"
    )
}

#[test]
fn check_refuses_non_canonical_ip_spellings_at_their_line_and_column_whatever_the_opt_in() {
    let dir = tempfile::tempdir().unwrap();
    for (host, reads_as) in [
        ("2130706433", "127.0.0.1"),
        ("0x7f.1", "127.0.0.1"),
        ("127.1", "127.0.0.1"),
        ("0177.0.0.1", "127.0.0.1"),
        ("169.254.43518", "169.254.169.254"),
    ] {
        for opt_in in [false, true] {
            let yaml = static_and_http(
                opt_in,
                &format!("http://{host}:27300"),
                "http://10.0.0.9:8081",
            );
            let (code, err) = check(dir.path(), &yaml);
            assert_eq!(code, Some(1), "{host}: {err}");
            // `urls` is on line 5, the list item at column 10.
            assert!(
                err.contains("check.yaml:5:10: vm_pool.urls[0]"),
                "{host}: the error names the place: {err}"
            );
            assert!(
                err.contains("not a canonical IP address") && err.contains(reads_as),
                "{host}: {err}"
            );
        }
    }
    // The canonical spelling of a public address passes.
    let (code, err) = check(
        dir.path(),
        &static_and_http(false, "http://10.0.0.5:27300", "http://10.0.0.9:8081"),
    );
    assert_eq!(code, Some(0), "{err}");
}

#[test]
fn check_refuses_ecs_and_eks_credential_agents_even_with_loopback_allowed() {
    let dir = tempfile::tempdir().unwrap();
    for url in [
        "http://169.254.170.2/v2/credentials",
        "http://169.254.170.23/v1/credentials",
        "http://[fd00:ec2::23]/v1/credentials",
    ] {
        let (code, err) = check(dir.path(), &static_and_http(true, "http://10.0.0.5:1", url));
        assert_eq!(code, Some(1), "{url}: {err}");
        assert!(
            err.contains("function_tier.url") && err.contains("credential agent"),
            "{url}: {err}"
        );
    }
}

/// A gateway whose only static VM is the gateway's own admin listener: a request
/// through the proxy must never reach `/status` there, even with loopback allowed.
#[test]
fn an_upstream_naming_the_gateways_own_admin_listener_is_never_connected_to() {
    let admin_port = free_port();
    let yaml = common::static_config(&[format!("http://127.0.0.1:{admin_port}")], NO_RETRY)
        .replace(
            "admin_listen: 127.0.0.1:0",
            &format!("admin_listen: 127.0.0.1:{admin_port}"),
        );
    let gw = Gateway::start(&yaml);
    assert_eq!(gw.admin.port(), admin_port);
    let (code, _, body) = http(gw.proxy, "GET", "/status", &[], b"");
    let body = String::from_utf8_lossy(&body);
    assert_eq!(
        code, 502,
        "the admin API must not answer through the proxy: {body}"
    );
    assert!(!body.contains("vm_pool"), "{body}");
    gw.proc.wait_line(
        "one of this gateway's own listeners",
        Duration::from_secs(10),
    );
}

/// A proxy listener bound to 0.0.0.0 is reachable on 127.0.0.1: an upstream there is a
/// request loop, refused like the listener's own address.
#[test]
fn an_upstream_reaching_a_listener_bound_to_all_addresses_through_loopback_is_refused() {
    let port = free_port();
    let yaml = common::static_config(&[format!("http://127.0.0.1:{port}")], NO_RETRY).replace(
        "listen: 127.0.0.1:0\n  admin",
        &format!("listen: 0.0.0.0:{port}\n  admin"),
    );
    assert!(yaml.contains(&format!("listen: 0.0.0.0:{port}")), "{yaml}");
    let gw = Gateway::start(&yaml);
    let proxy = std::net::SocketAddr::from(([127, 0, 0, 1], gw.proxy.port()));
    let (code, _, body) = http(proxy, "GET", "/loop", &[], b"");
    assert_eq!(code, 502, "{}", String::from_utf8_lossy(&body));
    gw.proc.wait_line(
        "one of this gateway's own listeners",
        Duration::from_secs(10),
    );
}

/// No retry after a failed VM attempt (the function tier would answer it instead): the
/// client sees that attempt's own error.
const NO_RETRY: &str = "  retry_budget_ratio: 0\n  retry_budget_min_per_second: 0\n  health_check_interval_seconds: 0\n";

/// Gateway YAML for one static upstream at `url` and no retries, with `upstream_tls`
/// (the lines below the key, indented by four).
fn https_static(url: &str, upstream_tls: &str) -> String {
    let extra = format!("{NO_RETRY}  upstream_tls:\n{upstream_tls}");
    common::static_config(&[url.to_string()], &extra)
}

fn ca_only(ca: &TestCa) -> String {
    format!(
        "    system_roots: false\n    ca_file: \"{}\"\n",
        ca.ca_file.display()
    )
}

#[test]
fn an_https_static_upstream_signed_by_the_configured_ca_is_proxied_over_h2() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path(), "upstreams");
    let leaf = ca.leaf(
        dir.path(),
        "vm",
        &["localhost", "127.0.0.1"],
        Validity::Valid,
        false,
    );
    let upstream = tls::start_upstream(&leaf, None);
    for url in [
        format!("https://localhost:{}", upstream.port()),
        format!("https://127.0.0.1:{}", upstream.port()),
    ] {
        let gw = Gateway::start(&https_static(&url, &ca_only(&ca)));
        let (code, _, body) = http(gw.proxy, "GET", "/a/b?x=1", &[], b"");
        let body = String::from_utf8_lossy(&body);
        assert_eq!(code, 200, "{url}: {body}\n{}", gw.proc.log_text());
        // Addressed by its own name (`:authority` only, no `Host` field), the client's
        // `Host` in X-Forwarded-Host.
        let authority = url.trim_start_matches("https://");
        assert_eq!(
            body,
            format!(
                "proto=HTTP/2.0 path=/a/b?x=1 client_cert=no host={authority} forwarded_host={}",
                gw.proxy
            ),
            "{url}"
        );
    }
}

#[test]
fn https_certificate_errors_are_a_502_and_a_log_line_naming_the_upstream_and_why() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path(), "upstreams");
    let other_ca = TestCa::new(dir.path(), "elsewhere");
    let cases = [
        (
            ca.leaf(
                dir.path(),
                "expired",
                &["localhost"],
                Validity::Expired,
                false,
            ),
            "certificate expired",
        ),
        (
            ca.leaf(
                dir.path(),
                "wrong-name",
                &["api.example.com"],
                Validity::Valid,
                false,
            ),
            "certificate not valid for this host name",
        ),
        (
            other_ca.leaf(
                dir.path(),
                "unknown",
                &["localhost"],
                Validity::Valid,
                false,
            ),
            "unknown issuer",
        ),
    ];
    // A self-signed CA certificate as the server's own, trusted as the CA bundle.
    let self_signed = tls::ca_as_leaf(dir.path(), "self-signed", &["localhost"]);
    let self_signed_trust = format!(
        "    system_roots: false\n    ca_file: \"{}\"\n",
        self_signed.cert_file.display()
    );
    let cases = cases
        .into_iter()
        .map(|(leaf, why)| (leaf, why, ca_only(&ca)))
        .chain([(
            self_signed,
            "presents a CA certificate as its own",
            self_signed_trust,
        )]);
    for (leaf, why, trust) in cases {
        let upstream = tls::start_upstream(&leaf, None);
        let url = format!("https://localhost:{}", upstream.port());
        let gw = Gateway::start(&https_static(&url, &trust));
        let (code, _, body) = http(gw.proxy, "GET", "/", &[], b"");
        assert_eq!(
            code,
            502,
            "{why}: {}\n{}",
            String::from_utf8_lossy(&body),
            gw.proc.log_text()
        );
        let line = gw.proc.wait_line(why, Duration::from_secs(10));
        assert!(
            line.contains(&format!("localhost:{}", upstream.port())),
            "the log line names the upstream: {line}"
        );
        // One failed request, one warning (with the reason), not one per attempt.
        let warnings = gw
            .proc
            .log_text()
            .lines()
            .filter(|l| l.contains("WARN") && l.contains(why))
            .count();
        assert_eq!(warnings, 1, "{}", gw.proc.log_text());
    }
}

#[test]
fn an_mtls_upstream_gets_the_configured_client_certificate_and_refuses_a_gateway_without_one() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path(), "upstreams");
    let clients = TestCa::new(dir.path(), "clients");
    let leaf = ca.leaf(dir.path(), "vm", &["localhost"], Validity::Valid, false);
    let client = clients.leaf(dir.path(), "gateway", &["gateway"], Validity::Valid, true);
    let upstream = tls::start_upstream(&leaf, Some(&clients));
    let url = format!("https://localhost:{}", upstream.port());

    let with_cert = format!(
        "{}    client_cert_file: \"{}\"\n    client_key_file: \"{}\"\n",
        ca_only(&ca),
        client.cert_file.display(),
        client.key_file.display()
    );
    let gw = Gateway::start(&https_static(&url, &with_cert));
    let (code, _, body) = http(gw.proxy, "GET", "/m", &[], b"");
    let body = String::from_utf8_lossy(&body);
    assert_eq!(code, 200, "{body}\n{}", gw.proc.log_text());
    assert!(body.contains("path=/m client_cert=yes"), "{body}");
    drop(gw);

    let gw = Gateway::start(&https_static(&url, &ca_only(&ca)));
    let (code, _, body) = http(gw.proxy, "GET", "/m", &[], b"");
    assert_eq!(code, 502, "{}", String::from_utf8_lossy(&body));
    // TLS 1.3 servers refuse a missing client certificate after the handshake, so the
    // reason (the alert) is in the log only when it arrived before the request left.
    let line = gw
        .proc
        .wait_line("request failed status=502", Duration::from_secs(10));
    assert!(
        line.contains(&url),
        "the log line names the upstream: {line}"
    );
}

#[test]
fn an_https_function_endpoint_is_called_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path(), "functions");
    let leaf = ca.leaf(dir.path(), "fn", &["localhost"], Validity::Valid, false);
    let upstream = tls::start_upstream(&leaf, None);
    let url = format!("https://localhost:{}/fn", upstream.port());
    let extra = format!("  upstream_tls:\n{}", ca_only(&ca));
    let gw = Gateway::start(&common::function_http_config(&url, &extra));
    let (code, _, body) = http(gw.proxy, "GET", "/x", &[], b"");
    let body = String::from_utf8_lossy(&body);
    assert_eq!(code, 200, "{body}\n{}", gw.proc.log_text());
    assert!(body.starts_with("proto=HTTP/2.0 path=/fn/x"), "{body}");
}

#[test]
fn check_names_an_unreadable_ca_bundle_and_a_client_certificate_without_its_key() {
    let dir = tempfile::tempdir().unwrap();
    let base = static_and_http(true, "https://127.0.0.1:8443", "https://10.0.0.9:8443");
    let (code, err) = check(
        dir.path(),
        &base.replace(
            "gateway:\n",
            "gateway:\n  upstream_tls:\n    ca_file: /nonexistent/ca.pem\n",
        ),
    );
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("gateway.upstream_tls") && err.contains("/nonexistent/ca.pem"),
        "{err}"
    );
    let ca = TestCa::new(dir.path(), "c");
    let client = ca.leaf(dir.path(), "gw", &["gw"], Validity::Valid, true);
    let (code, err) = check(
        dir.path(),
        &base.replace(
            "gateway:\n",
            &format!(
                "gateway:\n  upstream_tls:\n    client_cert_file: \"{}\"\n",
                client.cert_file.display()
            ),
        ),
    );
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("client_key_file"), "{err}");
    // https:// URLs themselves are accepted.
    let (code, err) = check(dir.path(), &base);
    assert_eq!(code, Some(0), "{err}");
}

/// The connector filters what a name resolves to (DNS rebinding included): `localhost`
/// resolves to loopback only, which a strict policy refuses, so nothing connects; with
/// loopback allowed, the gateway's own listener is still refused on the connection's
/// peer before a byte is sent.
#[tokio::test]
async fn a_name_resolving_only_to_refused_addresses_is_never_sent_a_byte() {
    use spillway::net::client::{ClientSettings, UpstreamClient, UpstreamError};
    use spillway::net::upstream::AddressPolicy;
    use std::io::Read as _;

    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    let settings = ClientSettings {
        connect_timeout: Duration::from_secs(2),
        idle_timeout: Duration::from_secs(5),
    };
    let base: http::Uri = format!("http://localhost:{}", addr.port()).parse().unwrap();
    let get = || {
        http::Request::get("/")
            .body(spillway::net::body::empty())
            .unwrap()
    };
    let reason = |e: UpstreamError| match e {
        UpstreamError::Connect { source, .. } => source.reason().to_string(),
        other => panic!("expected a connect failure, got {other}"),
    };

    let strict = UpstreamClient::for_upstreams(
        settings,
        Default::default(),
        AddressPolicy::new(false),
        None,
    );
    let why = reason(strict.forward(&base, get()).await.unwrap_err());
    assert!(
        why.contains("`localhost` resolves only to refused addresses")
            && why.contains("127.0.0.1")
            && why.contains("allow_loopback_upstreams"),
        "{why}"
    );
    assert_eq!(
        listener.accept().map(|_| ()).unwrap_err().kind(),
        std::io::ErrorKind::WouldBlock,
        "no connection was made"
    );

    let policy = AddressPolicy::new(true);
    policy.set_gateway_listeners(&[addr]);
    let own = UpstreamClient::for_upstreams(settings, Default::default(), policy, None);
    let why = reason(own.forward(&base, get()).await.unwrap_err());
    assert!(why.contains("own listeners"), "{why}");
    // The connection (if the kernel completed it) carried no byte.
    if let Ok((mut conn, _)) = listener.accept() {
        conn.set_nonblocking(false).unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = [0u8; 64];
        assert_eq!(conn.read(&mut buf).unwrap(), 0, "no request bytes");
    }
}

/// An h2 upstream may refuse a stream it did not process (`REFUSED_STREAM`, or a
/// graceful `GOAWAY` below it: nginx sends one every 1000 requests per connection): a
/// bodiless request goes out once more, so the client gets the answer, not a 502 — with
/// no gateway retry allowed.
#[test]
fn a_request_an_h2_upstream_refused_unprocessed_is_sent_again() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path(), "upstreams");
    let leaf = ca.leaf(dir.path(), "vm", &["localhost"], Validity::Valid, false);
    let (upstream, streams) = tls::start_refusing_h2_upstream(&leaf);
    let url = format!("https://localhost:{}", upstream.port());
    let gw = Gateway::start(&https_static(&url, &ca_only(&ca)));
    for i in 1..=3 {
        let (code, _, body) = http(gw.proxy, "GET", "/r", &[], b"");
        assert_eq!(
            (code, String::from_utf8_lossy(&body).as_ref()),
            (200, "served"),
            "request {i}\n{}",
            gw.proc.log_text()
        );
        assert_eq!(
            streams.load(std::sync::atomic::Ordering::SeqCst),
            2 * i,
            "refused once, then served"
        );
    }
}
