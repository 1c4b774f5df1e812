//! TLS listener configuration: loads a PEM certificate chain and private key into a
//! [`rustls::ServerConfig`] that uses the ring crypto provider and offers ALPN `h2` then
//! `http/1.1`.
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
