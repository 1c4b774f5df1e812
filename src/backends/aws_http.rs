//! The HTTP client every AWS SDK call of the gateway goes through (EC2 and Lambda): the
//! SDK's own stack — hyper-util's pooled client over hyper-rustls, HTTPS with the
//! platform's root certificates, plain HTTP for an `http://` endpoint override such as
//! moto on loopback — with **TCP keepalive** on every connection.
//!
//! A synchronous Invoke may run for up to 15 minutes without a byte on its connection;
//! NAT gateways drop idle TCP flows after 350 s, and the reply would then never arrive.
//! The SDK's default client exposes no keepalive setting, so this module builds the same
//! client with one: probes start after [`TCP_KEEPALIVE`] of silence, well below 350 s.
//!
//! **Read timeout**: the SDK's `TimeoutConfig::read_timeout` (how long to wait for the
//! first byte of the reply once the request is sent) reaches an HTTP client through the
//! connector settings of each operation; the SDK's own client applies it, and so does
//! this one ([`HttpConnectorSettings::read_timeout`]), answering a `timeout` error. The
//! connect timeout is the pool's (every operation of a provider sets the same one).
//!
//! Errors are classified for the SDK's retry and error machinery the way its default
//! client does: connect and I/O failures are `io` (retryable, and for Invoke reported as
//! unreachable), a request the client refused to send is `user`, an incomplete reply is a
//! transient error, anything else is `other`. [`never_sent`] tells a failure to connect
//! (the request never left) from one after the request was written (its effect is
//! unknown: EC2's RunInstances is then repeated with the same client token).

use std::error::Error as StdError;
use std::time::Duration;

use aws_smithy_runtime_api::client::http::{
    HttpClient, HttpConnector, HttpConnectorFuture, HttpConnectorSettings, SharedHttpClient,
    SharedHttpConnector,
};
use aws_smithy_runtime_api::client::orchestrator::{HttpRequest, HttpResponse};
use aws_smithy_runtime_api::client::result::ConnectorError;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::body::SdkBody;
use aws_smithy_types::retry::ErrorKind;
use hyper_rustls::{ConfigBuilderExt, HttpsConnector};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector as TcpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};

/// Idle time on an AWS API connection before the first TCP keepalive probe, and the
/// interval between probes: below the 350 s after which AWS NAT gateways forget an idle
/// flow.
pub const TCP_KEEPALIVE: Duration = Duration::from_secs(60);

/// Pooled connections to an AWS API idle longer than this are closed (the SDK's default).
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);

type BoxError = Box<dyn StdError + Send + Sync>;

/// The SDK HTTP client with TCP keepalive ([`TCP_KEEPALIVE`]) and `connect_timeout` on
/// every new connection; pass it to `aws_config::ConfigLoader::http_client`.
///
/// # Errors
/// None at build time; the platform's root certificates are loaded here, and a platform
/// without any only fails HTTPS calls later (plain-HTTP endpoints still work).
pub fn keepalive_client(connect_timeout: Duration) -> SharedHttpClient {
    SharedHttpClient::new(build(connect_timeout))
}

/// The client of [`keepalive_client`], without a read timeout until an operation's
/// settings give one.
fn build(connect_timeout: Duration) -> KeepAliveClient {
    let mut tcp = TcpConnector::new();
    tcp.enforce_http(false);
    tcp.set_nodelay(true);
    tcp.set_connect_timeout(Some(connect_timeout));
    tcp.set_keepalive(Some(TCP_KEEPALIVE));
    tcp.set_keepalive_interval(Some(TCP_KEEPALIVE));
    let tls = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("ring supports the default TLS versions")
    .with_native_roots()
    .unwrap_or_else(|e| {
        tracing::warn!(error = %e, "no platform root certificates: HTTPS AWS endpoints will fail");
        rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("ring supports the default TLS versions")
        .with_root_certificates(rustls::RootCertStore::empty())
    })
    .with_no_client_auth();
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(tcp);
    let client = Client::builder(TokioExecutor::new())
        .pool_idle_timeout(POOL_IDLE_TIMEOUT)
        .pool_timer(TokioTimer::new())
        .build(https);
    KeepAliveClient {
        client,
        read_timeout: None,
    }
}

/// [`keepalive_client`]'s client: one connection pool shared by every operation.
#[derive(Clone, Debug)]
struct KeepAliveClient {
    client: Client<HttpsConnector<TcpConnector>, SdkBody>,
    /// The operation's read timeout (first byte of the reply); `None`: none.
    read_timeout: Option<Duration>,
}

impl HttpClient for KeepAliveClient {
    fn http_connector(
        &self,
        settings: &HttpConnectorSettings,
        _components: &RuntimeComponents,
    ) -> SharedHttpConnector {
        SharedHttpConnector::new(KeepAliveClient {
            client: self.client.clone(),
            read_timeout: settings.read_timeout(),
        })
    }
}

/// The reply did not start within the read timeout.
#[derive(Debug, thiserror::Error)]
#[error("no reply from the AWS endpoint within the read timeout of {0:?}")]
struct ReadTimeout(Duration);

impl HttpConnector for KeepAliveClient {
    fn call(&self, request: HttpRequest) -> HttpConnectorFuture {
        let request = match request.try_into_http1x() {
            Ok(r) => r,
            Err(e) => return HttpConnectorFuture::ready(Err(ConnectorError::user(e.into()))),
        };
        let sent = self.client.request(request);
        let read_timeout = self.read_timeout;
        HttpConnectorFuture::new(async move {
            let replied = match read_timeout {
                Some(limit) => match tokio::time::timeout(limit, sent).await {
                    Ok(r) => r,
                    Err(_) => return Err(ConnectorError::timeout(Box::new(ReadTimeout(limit)))),
                },
                None => sent.await,
            };
            match replied {
                Ok(response) => HttpResponse::try_from(response.map(SdkBody::from_body_1_x))
                    .map_err(|e| ConnectorError::other(e.into(), None)),
                Err(e) => Err(connector_error(e)),
            }
        })
    }
}

/// Whether the failed call `e` (a `ConnectorError` of this client, or anything with
/// one in its source chain) never sent its request: no connection to the endpoint could
/// be made (refused, unreachable, name resolution, connect timeout, TLS handshake).
/// `false` for a failure after the request was written — a connection closed or reset
/// before the reply, a read timeout — whose effect on the service is unknown.
pub fn never_sent(e: &(dyn StdError + 'static)) -> bool {
    source_of::<hyper_util::client::legacy::Error>(e).is_some_and(|h| h.is_connect())
}

/// The SDK's view of a failed call (see the module docs).
fn connector_error(e: hyper_util::client::legacy::Error) -> ConnectorError {
    let make: fn(BoxError) -> ConnectorError = match source_of::<hyper::Error>(&e) {
        Some(h) if h.is_user() => ConnectorError::user,
        Some(h) if h.is_incomplete_message() => {
            |e| ConnectorError::other(e, Some(ErrorKind::TransientError))
        }
        Some(h) if h.is_closed() || h.is_canceled() => ConnectorError::io,
        _ if e.is_connect() || source_of::<std::io::Error>(&e).is_some() => ConnectorError::io,
        _ => |e| ConnectorError::other(e, None),
    };
    make(Box::new(e))
}

/// The first error of type `E` in `e`'s source chain (`e` included).
fn source_of<'a, E: StdError + 'static>(e: &'a (dyn StdError + 'static)) -> Option<&'a E> {
    let mut next = Some(e);
    while let Some(err) = next {
        if let Some(found) = err.downcast_ref::<E>() {
            return Some(found);
        }
        next = err.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    fn get(port: u16) -> HttpRequest {
        HttpRequest::try_from(
            http::Request::builder()
                .uri(format!("http://127.0.0.1:{port}/"))
                .body(SdkBody::empty())
                .unwrap(),
        )
        .unwrap()
    }

    /// A loopback server that reads the request and then `reply`s: `false` holds the
    /// connection open without a byte, `true` closes it without a reply.
    async fn server(close: bool) -> u16 {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((mut s, _)) = l.accept().await {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                if !close {
                    held.push(s);
                }
            }
        });
        port
    }

    /// The operation's read timeout (the SDK's `TimeoutConfig::read_timeout`) bounds
    /// the wait for a reply; it is a timeout error, and the request did leave.
    #[tokio::test]
    async fn the_read_timeout_of_the_operation_applies() {
        let port = server(false).await;
        let mut c = build(Duration::from_secs(5));
        c.read_timeout = Some(Duration::from_millis(300));
        // Without the read timeout the call would wait for ever: a deadline, not a bound.
        let e = tokio::time::timeout(Duration::from_secs(120), c.call(get(port)))
            .await
            .expect("the read timeout ends the call")
            .unwrap_err();
        assert!(e.is_timeout(), "{e:?}");
        assert!(!never_sent(&e), "{e:?}");
    }

    /// A reply lost after the request was written is not "never sent"; a refused
    /// connection is.
    #[tokio::test]
    async fn a_closed_connection_is_ambiguous_a_refused_one_is_not() {
        let port = server(true).await;
        let c = build(Duration::from_secs(5));
        let e = c.call(get(port)).await.unwrap_err();
        assert!(!never_sent(&e), "{e:?}");
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let e = c.call(get(closed)).await.unwrap_err();
        assert!(never_sent(&e), "{e:?}");
        assert!(e.is_io(), "{e:?}");
    }
}
