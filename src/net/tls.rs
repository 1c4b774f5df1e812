//! TLS configuration, both sides, with the ring crypto provider:
//!
//! * the listener ([`load_server_config`]): a PEM certificate chain and private key into
//!   a [`rustls::ServerConfig`] that offers ALPN `h2` then `http/1.1`;
//! * HTTPS upstreams ([`load_client_config`], used by [`crate::net::client`]): the
//!   system's trust store (`rustls-native-certs`) and/or a PEM CA bundle file, an
//!   optional client certificate for mutual TLS, ALPN `h2` then `http/1.1`; and
//!   [`describe_tls_failure`], which says in words why a handshake failed (expired,
//!   wrong name, unknown issuer, client certificate required).
//!
//! PEM parsing uses rustls' own [`PemObject`] API (no `rustls-pemfile`). Every error
//! names the file it is about, so a misconfigured listener fails at start-up with a
//! message an operator can act on.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::{CertifiedKey, SingleCertAndKey};
use rustls::{InconsistentKeys, ServerConfig};

/// ALPN protocol identifiers offered by the TLS listener, in order of preference.
pub const ALPN_PROTOCOLS: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// Why a TLS server configuration could not be built. Every variant names the file(s)
/// involved.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The file could not be read (missing, unreadable, a directory, ...).
    #[error("cannot read TLS file {}: {source}", path.display())]
    Read {
        /// The file that could not be read.
        path: PathBuf,
        /// The underlying I/O error.
        source: std::io::Error,
    },
    /// The file is not well-formed PEM.
    #[error("malformed PEM in {}: {detail}", path.display())]
    Pem {
        /// The offending file.
        path: PathBuf,
        /// What the PEM parser reported.
        detail: String,
    },
    /// The certificate file holds no `CERTIFICATE` section.
    #[error("no certificate found in {}", path.display())]
    NoCertificate {
        /// The certificate file.
        path: PathBuf,
    },
    /// The key file holds no PKCS#8, PKCS#1 (RSA) or SEC1 (EC) private key section.
    #[error("no private key found in {}", path.display())]
    NoPrivateKey {
        /// The key file.
        path: PathBuf,
    },
    /// The private key was found but the crypto provider cannot use it (unsupported
    /// algorithm or corrupt key).
    #[error("unusable private key in {}: {source}", path.display())]
    InvalidKey {
        /// The key file.
        path: PathBuf,
        /// The error reported by rustls.
        source: rustls::Error,
    },
    /// The end-entity certificate could not be parsed.
    #[error("invalid certificate in {}: {source}", path.display())]
    InvalidCertificate {
        /// The certificate file.
        path: PathBuf,
        /// The error reported by rustls.
        source: rustls::Error,
    },
    /// The private key does not belong to the end-entity (first) certificate.
    #[error(
        "private key in {} does not match the certificate in {}",
        key_path.display(),
        cert_path.display()
    )]
    KeyMismatch {
        /// The certificate file.
        cert_path: PathBuf,
        /// The key file.
        key_path: PathBuf,
    },
    /// A certificate of a CA bundle file is not a usable trust anchor.
    #[error("unusable CA certificate in {}: {source}", path.display())]
    InvalidCa {
        /// The CA bundle file.
        path: PathBuf,
        /// The error reported by rustls.
        source: rustls::Error,
    },
    /// A client certificate was given without its key, or the other way round.
    #[error("{given} is set without {missing}: mutual TLS needs both")]
    ClientAuthIncomplete {
        /// The setting given.
        given: &'static str,
        /// The setting missing.
        missing: &'static str,
    },
    /// Neither the system trust store nor a CA bundle file gives a root certificate:
    /// no HTTPS upstream could be verified.
    #[error(
        "no root certificates: the system trust store is {} and no CA bundle file is set (gateway.upstream_tls.ca_file)",
        if *system_roots { "empty or unreadable" } else { "turned off" }
    )]
    NoRoots {
        /// Whether the system trust store was asked.
        system_roots: bool,
    },
    /// rustls rejected the protocol-version/provider combination (should not happen with
    /// the ring provider's defaults).
    #[error("cannot build TLS configuration: {0}")]
    Config(#[source] rustls::Error),
}

/// Map a PEM-layer error for `path` to a [`TlsError`]. `none_found` is the error to use
/// when the file holds no item of the wanted kind.
fn pem_error(path: &Path, err: pem::Error, none_found: TlsError) -> TlsError {
    match err {
        pem::Error::Io(source) => TlsError::Read {
            path: path.to_path_buf(),
            source,
        },
        pem::Error::NoItemsFound => none_found,
        other => TlsError::Pem {
            path: path.to_path_buf(),
            detail: other.to_string(),
        },
    }
}

/// Read every `CERTIFICATE` section of `path`, in file order (end-entity first).
///
/// # Errors
/// [`TlsError::Read`], [`TlsError::Pem`] or [`TlsError::NoCertificate`].
fn load_cert_chain(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let no_cert = || TlsError::NoCertificate {
        path: path.to_path_buf(),
    };
    let iter = CertificateDer::pem_file_iter(path).map_err(|e| pem_error(path, e, no_cert()))?;
    let chain = iter
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_error(path, e, no_cert()))?;
    if chain.is_empty() {
        return Err(no_cert());
    }
    Ok(chain)
}

/// Read the first private key section of `path`.
///
/// # Errors
/// [`TlsError::Read`], [`TlsError::Pem`] or [`TlsError::NoPrivateKey`].
fn load_private_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| {
        pem_error(
            path,
            e,
            TlsError::NoPrivateKey {
                path: path.to_path_buf(),
            },
        )
    })
}

/// Build the TLS server configuration for a listener from a PEM certificate chain file
/// (end-entity certificate first, then intermediates) and a PEM private key file
/// (PKCS#8, PKCS#1 or SEC1).
///
/// The configuration uses the ring crypto provider explicitly, rustls' safe default
/// protocol versions (TLS 1.2 and 1.3), no client authentication, and offers ALPN
/// [`ALPN_PROTOCOLS`] (`h2`, then `http/1.1`).
///
/// # Errors
/// A [`TlsError`] naming the file: unreadable or missing file, malformed PEM, no
/// certificate, no private key, a key the provider cannot use, an unparseable
/// certificate, or a key that does not match the end-entity certificate.
pub fn load_server_config(
    cert_file: &Path,
    key_file: &Path,
) -> Result<Arc<ServerConfig>, TlsError> {
    let chain = load_cert_chain(cert_file)?;
    let key = load_private_key(key_file)?;

    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certified = certified_key(chain, key, &provider, cert_file, key_file)?;

    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Config)?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(SingleCertAndKey::from(certified)));
    config.alpn_protocols = ALPN_PROTOCOLS.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}

/// Where the upstream client's TLS trust and identity come from (all paths optional).
#[derive(Clone, Copy, Debug, Default)]
pub struct ClientTlsFiles<'a> {
    /// A PEM bundle of CA certificates trusted for upstreams, in addition to the
    /// system's when `system_roots`.
    pub ca_file: Option<&'a Path>,
    /// Trust the system's root certificates (`SSL_CERT_FILE`/`SSL_CERT_DIR` or the
    /// platform store, read with `rustls-native-certs`).
    pub system_roots: bool,
    /// PEM certificate chain presented to upstreams that ask for one (mutual TLS).
    pub client_cert_file: Option<&'a Path>,
    /// PEM private key of `client_cert_file`.
    pub client_key_file: Option<&'a Path>,
}

/// Build the upstream client's TLS configuration: trust the system roots (when
/// `system_roots`) and every certificate of `ca_file`; present `client_cert_file` with
/// `client_key_file` when set; TLS 1.2 and 1.3; ALPN [`ALPN_PROTOCOLS`] (`h2`, then
/// `http/1.1`). The server name (SNI, and the name the certificate must carry) is the
/// upstream URL's host, set per connection.
///
/// # Errors
/// A [`TlsError`] naming the file: unreadable, malformed, no certificate, a CA the
/// verifier cannot use, a client key that does not match its certificate, only one of
/// the client certificate and key, or no root certificate at all.
pub fn load_client_config(
    files: ClientTlsFiles<'_>,
) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    if files.system_roots {
        let native = rustls_native_certs::load_native_certs();
        if !native.errors.is_empty() {
            tracing::debug!(errors = ?native.errors, "some system root certificates could not be read");
        }
        roots.add_parsable_certificates(native.certs);
    }
    if let Some(path) = files.ca_file {
        for cert in load_cert_chain(path)? {
            roots.add(cert).map_err(|source| TlsError::InvalidCa {
                path: path.to_path_buf(),
                source,
            })?;
        }
    }
    if roots.is_empty() {
        return Err(TlsError::NoRoots {
            system_roots: files.system_roots,
        });
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Config)?
        .with_root_certificates(roots);
    let mut config = match (files.client_cert_file, files.client_key_file) {
        (None, None) => builder.with_no_client_auth(),
        (Some(cert_file), Some(key_file)) => {
            let chain = load_cert_chain(cert_file)?;
            let key = load_private_key(key_file)?;
            let certified = certified_key(chain, key, &provider, cert_file, key_file)?;
            builder.with_client_cert_resolver(Arc::new(SingleCertAndKey::from(certified)))
        }
        (Some(_), None) => {
            return Err(TlsError::ClientAuthIncomplete {
                given: "gateway.upstream_tls.client_cert_file",
                missing: "client_key_file",
            });
        }
        (None, Some(_)) => {
            return Err(TlsError::ClientAuthIncomplete {
                given: "gateway.upstream_tls.client_key_file",
                missing: "client_cert_file",
            });
        }
    };
    config.alpn_protocols = ALPN_PROTOCOLS.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}

/// Why a TLS handshake with an upstream failed, in words an operator can act on:
/// `certificate expired`, `certificate not valid for this host name`, `certificate
/// signed by an unknown issuer`, `the upstream requires a client certificate`, …, then
/// rustls' own detail in parentheses. `err` is what the handshake returned (tokio-rustls wraps the
/// [`rustls::Error`] in an I/O error).
pub fn describe_tls_failure(err: &std::io::Error) -> String {
    let Some(tls) = err
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    else {
        return format!("connection failed during the TLS handshake: {err}");
    };
    format!("{} ({tls})", tls_failure_reason(tls))
}

/// What a TLS alert named in an error message means, when `text` holds one
/// (`received fatal alert: CertificateRequired`): for errors that kept only the text.
pub fn describe_alert_text(text: &str) -> Option<&'static str> {
    use rustls::AlertDescription as A;
    let name = text.split("received fatal alert: ").nth(1)?;
    let name = name.split(|c: char| !c.is_ascii_alphanumeric()).next()?;
    [
        A::CertificateRequired,
        A::BadCertificate,
        A::UnknownCA,
        A::CertificateUnknown,
        A::AccessDenied,
        A::HandshakeFailure,
    ]
    .into_iter()
    .find(|a| format!("{a:?}") == name)
    .map(|a| tls_failure_reason(&rustls::Error::AlertReceived(a)))
}

fn tls_failure_reason(tls: &rustls::Error) -> &'static str {
    use rustls::{AlertDescription, CertificateError};
    match tls {
        rustls::Error::InvalidCertificate(c) => match c {
            CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
                "certificate expired"
            }
            CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
                "certificate not valid yet"
            }
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
                "certificate not valid for this host name"
            }
            CertificateError::UnknownIssuer => {
                "certificate signed by an unknown issuer (not in gateway.upstream_tls.ca_file or the system roots)"
            }
            CertificateError::Revoked => "certificate revoked",
            CertificateError::BadSignature => "certificate has a bad signature",
            // webpki's error, wrapped: a self-signed `CA:TRUE` certificate (what
            // `openssl req -x509` makes) used as the server's own.
            CertificateError::Other(o) if format!("{o:?}").contains("CaUsedAsEndEntity") => {
                "the upstream presents a CA certificate as its own (issue a server certificate from that CA instead)"
            }
            _ => "invalid certificate",
        },
        rustls::Error::AlertReceived(AlertDescription::CertificateRequired) => {
            "the upstream requires a client certificate (gateway.upstream_tls.client_cert_file)"
        }
        rustls::Error::AlertReceived(
            AlertDescription::BadCertificate
            | AlertDescription::UnknownCA
            | AlertDescription::CertificateUnknown
            | AlertDescription::AccessDenied,
        ) => "the upstream refused the gateway's client certificate",
        rustls::Error::AlertReceived(_) => "the upstream aborted the handshake",
        rustls::Error::NoApplicationProtocol => "no common application protocol (ALPN)",
        _ => "TLS handshake failed",
    }
}

/// Pair the chain with its signing key, checking that the key matches the end-entity
/// certificate (a key whose public half cannot be extracted is accepted, as rustls does).
fn certified_key(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    provider: &CryptoProvider,
    cert_file: &Path,
    key_file: &Path,
) -> Result<CertifiedKey, TlsError> {
    let signing_key = provider
        .key_provider
        .load_private_key(key)
        .map_err(|source| TlsError::InvalidKey {
            path: key_file.to_path_buf(),
            source,
        })?;
    let certified = CertifiedKey::new(chain, signing_key);
    match certified.keys_match() {
        Ok(()) | Err(rustls::Error::InconsistentKeys(InconsistentKeys::Unknown)) => Ok(certified),
        Err(rustls::Error::InconsistentKeys(InconsistentKeys::KeyMismatch)) => {
            Err(TlsError::KeyMismatch {
                cert_path: cert_file.to_path_buf(),
                key_path: key_file.to_path_buf(),
            })
        }
        Err(source) => Err(TlsError::InvalidCertificate {
            path: cert_file.to_path_buf(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    struct Files {
        _dir: tempfile::TempDir,
        cert: PathBuf,
        key: PathBuf,
        cert_pem: String,
    }

    fn write_self_signed(dir: &Path, stem: &str) -> (PathBuf, PathBuf, String) {
        let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string()])
            .expect("rcgen generates a self-signed certificate");
        let cert_pem = ck.cert.pem();
        let cert = dir.join(format!("{stem}.crt"));
        let key = dir.join(format!("{stem}.key"));
        fs::write(&cert, &cert_pem).expect("write cert");
        fs::write(&key, ck.signing_key.serialize_pem()).expect("write key");
        (cert, key, cert_pem)
    }

    fn files() -> Files {
        let dir = tempfile::tempdir().expect("tempdir");
        let (cert, key, cert_pem) = write_self_signed(dir.path(), "server");
        Files {
            _dir: dir,
            cert,
            key,
            cert_pem,
        }
    }

    fn err_of(cert: &Path, key: &Path) -> TlsError {
        match load_server_config(cert, key) {
            Ok(_) => panic!("expected an error for {cert:?} / {key:?}"),
            Err(e) => e,
        }
    }

    #[test]
    fn loads_self_signed_and_offers_h2_then_http11() {
        let f = files();
        let config = load_server_config(&f.cert, &f.key).expect("valid cert and key load");
        assert_eq!(
            config.alpn_protocols,
            vec![b"h2".to_vec(), b"http/1.1".to_vec()]
        );
    }

    #[test]
    fn missing_cert_file_is_named() {
        let f = files();
        let missing = f.cert.with_file_name("nope.crt");
        let err = err_of(&missing, &f.key);
        assert!(matches!(err, TlsError::Read { .. }), "{err:?}");
        assert!(err.to_string().contains("nope.crt"), "{err}");
    }

    #[test]
    fn missing_key_file_is_named() {
        let f = files();
        let missing = f.key.with_file_name("nope.key");
        let err = err_of(&f.cert, &missing);
        assert!(matches!(err, TlsError::Read { .. }), "{err:?}");
        assert!(err.to_string().contains("nope.key"), "{err}");
    }

    #[test]
    fn cert_file_without_certificate_is_named() {
        let f = files();
        // A key file passed as the certificate: PEM, but no CERTIFICATE section.
        let err = err_of(&f.key, &f.key);
        assert!(matches!(err, TlsError::NoCertificate { .. }), "{err:?}");
        assert!(err.to_string().contains("server.key"), "{err}");

        let empty = f.cert.with_file_name("empty.crt");
        fs::write(&empty, "").expect("write");
        let err = err_of(&empty, &f.key);
        assert!(matches!(err, TlsError::NoCertificate { .. }), "{err:?}");
        assert!(err.to_string().contains("empty.crt"), "{err}");
    }

    #[test]
    fn key_file_without_key_is_named() {
        let f = files();
        let err = err_of(&f.cert, &f.cert);
        assert!(matches!(err, TlsError::NoPrivateKey { .. }), "{err:?}");
        assert!(err.to_string().contains("server.crt"), "{err}");
    }

    #[test]
    fn malformed_pem_is_named() {
        let f = files();
        let bad = f.cert.with_file_name("bad.crt");
        // Section start without an end marker.
        let truncated = &f.cert_pem[..f.cert_pem.len() / 2];
        fs::write(&bad, truncated).expect("write");
        let err = err_of(&bad, &f.key);
        assert!(matches!(err, TlsError::Pem { .. }), "{err:?}");
        assert!(err.to_string().contains("bad.crt"), "{err}");
    }

    #[test]
    fn key_cert_mismatch_names_both_files() {
        let f = files();
        let (_, other_key, _) = write_self_signed(f.cert.parent().expect("dir"), "other");
        let err = err_of(&f.cert, &other_key);
        assert!(matches!(err, TlsError::KeyMismatch { .. }), "{err:?}");
        let msg = err.to_string();
        assert!(
            msg.contains("other.key") && msg.contains("server.crt"),
            "{msg}"
        );
    }

    #[tokio::test]
    async fn handshake_on_loopback_negotiates_h2() {
        let f = files();
        let server_config = load_server_config(&f.cert, &f.key).expect("load");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let acceptor = tokio_rustls::TlsAcceptor::from(server_config);
        let server = tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.expect("accept");
            let mut tls = acceptor.accept(tcp).await.expect("server handshake");
            let alpn = tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
            tls.write_all(b"ok").await.expect("write");
            tls.shutdown().await.expect("shutdown");
            alpn
        });

        let mut roots = rustls::RootCertStore::empty();
        let cert = CertificateDer::from_pem_file(&f.cert).expect("cert");
        roots.add(cert).expect("add root");
        let mut client_config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
        client_config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let connector = tokio_rustls::TlsConnector::from(Arc::new(client_config));
        let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
        let mut tls = connector
            .connect(name, tcp)
            .await
            .expect("client handshake");
        assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
        let mut buf = Vec::new();
        tls.read_to_end(&mut buf).await.expect("read");
        assert_eq!(buf, b"ok");
        assert_eq!(server.await.expect("join"), Some(b"h2".to_vec()));
    }
}
