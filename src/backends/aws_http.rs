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
//! Errors are classified for the SDK's retry and error machinery the way its default
//! client does: connect and I/O failures are `io` (retryable, and for Invoke reported as
//! unreachable), a request the client refused to send is `user`, an incomplete reply is a
//! transient error, anything else is `other`.

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
    SharedHttpClient::new(KeepAliveClient { client })
}

/// [`keepalive_client`]'s client: one connection pool shared by every operation.
#[derive(Clone, Debug)]
struct KeepAliveClient {
    client: Client<HttpsConnector<TcpConnector>, SdkBody>,
}

impl HttpClient for KeepAliveClient {
    fn http_connector(
        &self,
        _settings: &HttpConnectorSettings,
        _components: &RuntimeComponents,
    ) -> SharedHttpConnector {
        SharedHttpConnector::new(self.clone())
    }
}

impl HttpConnector for KeepAliveClient {
    fn call(&self, request: HttpRequest) -> HttpConnectorFuture {
        let request = match request.try_into_http1x() {
            Ok(r) => r,
            Err(e) => return HttpConnectorFuture::ready(Err(ConnectorError::user(e.into()))),
        };
        let sent = self.client.request(request);
        HttpConnectorFuture::new(async move {
            match sent.await {
                Ok(response) => HttpResponse::try_from(response.map(SdkBody::from_body_1_x))
                    .map_err(|e| ConnectorError::other(e.into(), None)),
                Err(e) => Err(connector_error(e)),
            }
        })
    }
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
