//! HTTPS upstreams for tests: a test CA (rcgen) that issues server and client
//! certificates (valid, expired, for another name), and a TLS upstream on 127.0.0.1:0
//! (hyper, HTTP/1.1 and h2 by ALPN, optionally asking for a client certificate) that
//! answers every request with `proto=<version> path=<target> client_cert=<yes|no>
//! host=<what it was addressed as> forwarded_host=<X-Forwarded-Host>`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, date_time_ymd,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// A certificate authority for tests; its PEM is written to `ca_file`.
pub(crate) struct TestCa {
    issuer: Issuer<'static, KeyPair>,
    pub ca_file: PathBuf,
    pub pem: String,
}

/// A certificate and key issued by a [`TestCa`], as PEM files.
pub(crate) struct Leaf {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    pub cert_pem: String,
    pub key_pem: String,
}

/// How long a leaf is valid.
#[derive(Clone, Copy)]
pub(crate) enum Validity {
    /// 2020 to 4000.
    Valid,
    /// 2000 to 2001.
    Expired,
}

impl TestCa {
    /// A new CA named `name`, its certificate written to `dir/<name>-ca.pem`.
    pub(crate) fn new(dir: &Path, name: &str) -> TestCa {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, format!("{name} test CA"));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let pem = cert.pem();
        let ca_file = dir.join(format!("{name}-ca.pem"));
        std::fs::write(&ca_file, &pem).unwrap();
        TestCa {
            issuer: Issuer::new(params, key),
            ca_file,
            pem,
        }
    }

    /// A leaf for `names` (DNS names or IP addresses), written to `dir/<stem>.{crt,key}`;
    /// `client`: for client authentication instead of server.
    pub(crate) fn leaf(
        &self,
        dir: &Path,
        stem: &str,
        names: &[&str],
        validity: Validity,
        client: bool,
    ) -> Leaf {
        let mut params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, stem.to_string());
        let (from, to) = match validity {
            Validity::Valid => (date_time_ymd(2020, 1, 1), date_time_ymd(4000, 1, 1)),
            Validity::Expired => (date_time_ymd(2000, 1, 1), date_time_ymd(2001, 1, 1)),
        };
        params.not_before = from;
        params.not_after = to;
        params.extended_key_usages = vec![if client {
            ExtendedKeyUsagePurpose::ClientAuth
        } else {
            ExtendedKeyUsagePurpose::ServerAuth
        }];
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let cert_file = dir.join(format!("{stem}.crt"));
        let key_file = dir.join(format!("{stem}.key"));
        // The chain: the leaf, then the CA (as servers usually send it).
        let cert_pem = format!("{}{}", cert.pem(), self.pem);
        let key_pem = key.serialize_pem();
        std::fs::write(&cert_file, &cert_pem).unwrap();
        std::fs::write(&key_file, &key_pem).unwrap();
        Leaf {
            cert_file,
            key_file,
            cert_pem,
            key_pem,
        }
    }
}

/// A self-signed CA certificate for `names` used as a server's own (what `openssl req
/// -x509` makes), written to `dir/<stem>.{crt,key}`: trust it with `cert_file`.
pub(crate) fn ca_as_leaf(dir: &Path, stem: &str, names: &[&str]) -> Leaf {
    let mut params =
        CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let key = KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    let (cert_file, key_file) = (
        dir.join(format!("{stem}.crt")),
        dir.join(format!("{stem}.key")),
    );
    let (cert_pem, key_pem) = (cert.pem(), key.serialize_pem());
    std::fs::write(&cert_file, &cert_pem).unwrap();
    std::fs::write(&key_file, &key_pem).unwrap();
    Leaf {
        cert_file,
        key_file,
        cert_pem,
        key_pem,
    }
}

/// A TLS upstream on 127.0.0.1:0 serving `leaf`; with `client_ca`, it requires a client
/// certificate issued by that CA. Runs until the test process ends.
pub(crate) fn start_upstream(leaf: &Leaf, client_ca: Option<&TestCa>) -> SocketAddr {
    let acceptor = acceptor(leaf, client_ca);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || serve(listener, acceptor));
    addr
}

/// A TLS h2 upstream on 127.0.0.1:0 (the h2 crate's server) that resets every other
/// stream, the first one included, with `REFUSED_STREAM` (not processed, RFC 9113
/// §8.7) and answers the others `200 served`. Returns its address and the count of
/// streams it received.
pub(crate) fn start_refusing_h2_upstream(leaf: &Leaf) -> (SocketAddr, Arc<AtomicUsize>) {
    let acceptor = acceptor(leaf, None);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    let streams = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&streams);
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, count) = (acceptor.clone(), Arc::clone(&count));
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let Ok(mut conn) = h2::server::handshake(tls).await else {
                        return;
                    };
                    while let Some(Ok((_req, mut respond))) = conn.accept().await {
                        if count.fetch_add(1, Ordering::SeqCst) % 2 == 0 {
                            respond.send_reset(h2::Reason::REFUSED_STREAM);
                            continue;
                        }
                        let Ok(mut body) = respond.send_response(http::Response::new(()), false)
                        else {
                            continue;
                        };
                        let _ = body.send_data(Bytes::from_static(b"served"), true);
                    }
                });
            }
        });
    });
    (addr, streams)
}

/// A TLS acceptor serving `leaf` (ALPN h2, then http/1.1); with `client_ca`, it requires a
/// client certificate issued by that CA.
pub(crate) fn acceptor(leaf: &Leaf, client_ca: Option<&TestCa>) -> tokio_rustls::TlsAcceptor {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(leaf.cert_pem.as_bytes())
            .collect::<Result<_, _>>()
            .unwrap();
    let key = PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes()).unwrap();
    let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .unwrap();
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            roots
                .add(CertificateDer::from_pem_slice(ca.pem.as_bytes()).unwrap())
                .unwrap();
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .unwrap();
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_single_cert(chain, key).unwrap();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    tokio_rustls::TlsAcceptor::from(Arc::new(config))
}

fn serve(listener: std::net::TcpListener, acceptor: tokio_rustls::TlsAcceptor) {
    {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let client_cert = tls.get_ref().1.peer_certificates().is_some();
                    let svc = service_fn(
                        move |req: hyper::Request<hyper::body::Incoming>| async move {
                            // h2: `:authority`, then `+<host>` per `host` field sent.
                            let host = req
                                .uri()
                                .authority()
                                .map(|a| a.to_string())
                                .into_iter()
                                .chain(
                                    req.headers()
                                        .get_all("host")
                                        .iter()
                                        .map(|v| format!("+{}", v.to_str().unwrap_or("?"))),
                                )
                                .collect::<String>();
                            let text = format!(
                                "proto={:?} path={} client_cert={} host={host} forwarded_host={}",
                                req.version(),
                                req.uri().path_and_query().map_or("/", |p| p.as_str()),
                                if client_cert { "yes" } else { "no" },
                                req.headers()
                                    .get("x-forwarded-host")
                                    .and_then(|v| v.to_str().ok())
                                    .unwrap_or("-"),
                            );
                            Ok::<_, std::convert::Infallible>(hyper::Response::new(Full::new(
                                Bytes::from(text),
                            )))
                        },
                    );
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tls), svc)
                        .await;
                });
            }
        });
    }
}
