//! Span export over OTLP/HTTP (`telemetry.otlp`, the `otlp` cargo feature): the
//! gateway's part of a request's trace, sent in batches to an OpenTelemetry collector.
//!
//! | span | kind | parent | attributes |
//! |---|---|---|---|
//! | `request` | server | the client's `traceparent` span id (none: a root span) | `http.request.method`, `url.path` (the route: the path, without the query), `http.response.status_code`, `spillway.tier` (vm, function, local), `spillway.request_id` |
//! | `attempt` | client | `request` | `spillway.tier` (vm, function), `spillway.upstream` (the VM, or `zone/fn-N`), `spillway.outcome` |
//! | `cold_start` | internal | the function `attempt` that started an instance | `spillway.zone` |
//! | `queue_wait` | internal | `request` | — (from entering the gateway queue to leaving it) |
//!
//! `spillway.outcome` is `response` (a response head came back), `connect_failed`,
//! `not_sent` (the attempt never reached the upstream: a cold start failed, throttled,
//! …), `failed` (sent, no usable response) or `timeout` (no response head in
//! `gateway.upstream_timeout_seconds`).
//!
//! Every attempt sends its own span id upstream as the `traceparent` parent id, with the
//! trace's sampling decision (`telemetry.otlp.sample_ratio` for the traces the gateway
//! starts, the client's sampled flag for the others); `tracestate` goes on unchanged.
//!
//! An `https://` endpoint is reached over TLS (HTTP/1.1, rustls): the collector's
//! certificate must chain to the system's root certificates (`SSL_CERT_FILE` /
//! `SSL_CERT_DIR` when set, else the platform store, as for upstreams without
//! `gateway.upstream_tls`) and carry the endpoint's host name. A failed handshake is a
//! failed export (logged).
//!
//! Spans are ended on the request path and handed to the SDK's batch processor (a
//! bounded queue and its own thread): exporting never blocks a request, and a full queue
//! drops spans rather than waiting. A failed export is logged as a warning, rate-limited
//! by [`crate::log_limit`]; it never fails a request. [`Exporter::shutdown`] flushes
//! what is queued. Without `telemetry.otlp` no span object is made at all.
//!
//! Without the `otlp` feature the types exist but no [`Exporter`] can be made
//! ([`Exporter::start`] fails; the config check refuses `telemetry.otlp` before).

use crate::config::telemetry::OtlpConfig;
use crate::net::request_id::TraceParent;

/// The exporter could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// The OTLP exporter refused its settings.
    #[error("telemetry.otlp: {0}")]
    Build(String),
    /// An `https://` endpoint, but no TLS client configuration could be built (no
    /// system root certificate could be read).
    #[error("telemetry.otlp.endpoint: cannot verify an https:// collector: {0}")]
    Tls(#[source] crate::net::tls::TlsError),
    /// This binary was built without the `otlp` feature.
    #[error("telemetry.otlp: {}", crate::config::telemetry::otlp_feature_missing())]
    FeatureMissing,
}

pub use imp::{AttemptSpan, ChildSpan, Exporter, RequestSpan};

#[cfg(feature = "otlp")]
mod imp {
    use std::collections::HashMap;
    use std::time::Duration;

    use bytes::Bytes;
    use http::{HeaderValue, Request, Response};
    use hyper_util::client::legacy::connect::HttpConnector;
    use opentelemetry::trace::{
        SpanContext, SpanId, SpanKind, TraceContextExt as _, TraceFlags, TraceId, TraceState,
        Tracer as _, TracerProvider as _,
    };
    use opentelemetry::{Context, KeyValue};
    use opentelemetry_http::hyper::HyperClient;
    use opentelemetry_http::{HttpClient, HttpError};
    use opentelemetry_otlp::{Protocol, WithExportConfig as _, WithHttpConfig as _};
    use opentelemetry_sdk::error::OTelSdkResult;
    use opentelemetry_sdk::trace::{
        BatchSpanProcessor, Sampler, SdkTracer, SdkTracerProvider, SpanData, SpanExporter,
    };

    use super::{ExportError, OtlpConfig, TraceParent};

    /// The running exporter: the tracer provider and its batch processor.
    #[derive(Debug)]
    pub struct Exporter {
        provider: SdkTracerProvider,
        tracer: SdkTracer,
    }

    impl Exporter {
        /// Start exporting to `config.endpoint`. Must run inside the gateway's tokio
        /// runtime: export requests are sent on it.
        ///
        /// # Errors
        /// [`ExportError::Build`] when the OTLP exporter refuses the settings;
        /// [`ExportError::Tls`] for an `https://` endpoint without usable root
        /// certificates.
        pub fn start(config: &OtlpConfig) -> Result<Self, ExportError> {
            let timeout = Duration::from_millis(config.timeout_ms);
            let client = if config.endpoint.uri().scheme_str() == Some("https") {
                let tls = crate::net::tls::load_client_config(crate::net::tls::ClientTlsFiles {
                    system_roots: true,
                    ..Default::default()
                })
                .map_err(ExportError::Tls)?;
                // HTTP/1.1 only: hyper-rustls sets the ALPN list itself.
                let mut tls = rustls::ClientConfig::clone(&tls);
                tls.alpn_protocols.clear();
                let https = hyper_rustls::HttpsConnectorBuilder::new()
                    .with_tls_config(tls)
                    .https_only()
                    .enable_http1()
                    .build();
                Client::Tls(HyperClient::new(https, timeout, None))
            } else {
                Client::Plain(HyperClient::with_default_connector(timeout, None))
            };
            let client = OnRuntime {
                client,
                runtime: tokio::runtime::Handle::current(),
            };
            let exporter = opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_http_client(client)
                .with_protocol(Protocol::HttpBinary)
                .with_endpoint(config.endpoint.as_str())
                .with_timeout(timeout)
                .with_headers(
                    config
                        .headers
                        .iter()
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect::<HashMap<_, _>>(),
                )
                .build()
                .map_err(|e| ExportError::Build(e.to_string()))?;
            let resource = opentelemetry_sdk::Resource::builder_empty()
                .with_service_name(config.service_name.clone())
                .build();
            let provider = SdkTracerProvider::builder()
                .with_span_processor(BatchSpanProcessor::builder(Logged(exporter)).build())
                .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                    config.sample_ratio,
                ))))
                .with_resource(resource)
                .build();
            let tracer = provider.tracer("spillway");
            Ok(Self { provider, tracer })
        }

        /// Export what is queued and stop. Blocks until the batch processor finished
        /// (at most about `timeout_ms`): call it off the runtime's worker threads.
        pub fn shutdown(&self) {
            if let Err(e) = self.provider.shutdown() {
                tracing::warn!(error = %e, "span export: shutdown did not flush every span");
            }
        }

        /// The `request` span of a request that arrived with `client`'s `traceparent`
        /// (none: the gateway starts the trace).
        pub fn request(
            &self,
            client: Option<&TraceParent>,
            method: &str,
            request_id: &str,
        ) -> RequestSpan {
            let parent = match client {
                Some(tp) => Context::new().with_remote_span_context(SpanContext::new(
                    TraceId::from_bytes(tp.trace_id.to_be_bytes()),
                    SpanId::from_bytes(tp.parent_id.to_be_bytes()),
                    TraceFlags::new(tp.flags),
                    true,
                    TraceState::default(),
                )),
                None => Context::new(),
            };
            let span = self
                .tracer
                .span_builder("request")
                .with_kind(SpanKind::Server)
                .with_attributes([
                    KeyValue::new("http.request.method", method.to_owned()),
                    KeyValue::new("spillway.request_id", request_id.to_owned()),
                ])
                .start_with_context(&self.tracer, &parent);
            RequestSpan {
                cx: parent.with_span(span),
                tracer: self.tracer.clone(),
            }
        }
    }

    /// A request's span; its children are made from it. Ended by [`Self::finish`] or
    /// when the last clone is dropped.
    #[derive(Clone, Debug)]
    pub struct RequestSpan {
        cx: Context,
        tracer: SdkTracer,
    }

    impl RequestSpan {
        /// The request span's own context as a `traceparent` (its span id as the
        /// parent id).
        pub fn traceparent(&self) -> TraceParent {
            traceparent_of(&self.cx)
        }

        /// A new `attempt` child on `tier` (`vm`, `function`) to `upstream`.
        pub fn attempt(&self, tier: &'static str, upstream: String) -> AttemptSpan {
            let span = self
                .tracer
                .span_builder("attempt")
                .with_kind(SpanKind::Client)
                .with_attributes([
                    KeyValue::new("spillway.tier", tier),
                    KeyValue::new("spillway.upstream", upstream),
                ])
                .start_with_context(&self.tracer, &self.cx);
            AttemptSpan {
                cx: self.cx.with_span(span),
                tracer: self.tracer.clone(),
            }
        }

        /// A `queue_wait` child, from now until it is dropped.
        pub fn queue_wait(&self) -> ChildSpan {
            let span = self
                .tracer
                .span_builder("queue_wait")
                .with_kind(SpanKind::Internal)
                .start_with_context(&self.tracer, &self.cx);
            ChildSpan {
                cx: self.cx.with_span(span),
            }
        }

        /// The response head is ready: its status, the tier that answered and the
        /// path (`url.path`, no query); the span ends.
        pub fn finish(&self, status: u16, tier: &'static str, path: &str) {
            let span = self.cx.span();
            span.set_attribute(KeyValue::new(
                "http.response.status_code",
                i64::from(status),
            ));
            span.set_attribute(KeyValue::new("spillway.tier", tier));
            span.set_attribute(KeyValue::new("url.path", path.to_owned()));
            if status >= 500 {
                span.set_status(opentelemetry::trace::Status::error(""));
            }
            span.end();
        }
    }

    /// One attempt's span: ended (with its outcome) when dropped.
    #[derive(Debug)]
    pub struct AttemptSpan {
        cx: Context,
        tracer: SdkTracer,
    }

    impl AttemptSpan {
        /// The `traceparent` the attempt sends upstream: its span id as the parent id.
        pub fn header_value(&self) -> HeaderValue {
            traceparent_of(&self.cx).header_value()
        }

        /// How the attempt ended (`spillway.outcome`; see the module docs).
        pub fn outcome(&self, outcome: &'static str) {
            self.cx
                .span()
                .set_attribute(KeyValue::new("spillway.outcome", outcome));
        }

        /// A `cold_start` child in function zone `zone`, from now until dropped.
        pub fn cold_start(&self, zone: String) -> ChildSpan {
            let span = self
                .tracer
                .span_builder("cold_start")
                .with_kind(SpanKind::Internal)
                .with_attributes([KeyValue::new("spillway.zone", zone)])
                .start_with_context(&self.tracer, &self.cx);
            ChildSpan {
                cx: self.cx.with_span(span),
            }
        }
    }

    impl Drop for AttemptSpan {
        fn drop(&mut self) {
            self.cx.span().end();
        }
    }

    /// A `queue_wait` or `cold_start` span: ended when dropped.
    #[derive(Debug)]
    pub struct ChildSpan {
        cx: Context,
    }

    impl Drop for ChildSpan {
        fn drop(&mut self) {
            self.cx.span().end();
        }
    }

    fn traceparent_of(cx: &Context) -> TraceParent {
        let sc = cx.span().span_context().clone();
        TraceParent {
            trace_id: u128::from_be_bytes(sc.trace_id().to_bytes()),
            parent_id: u64::from_be_bytes(sc.span_id().to_bytes()),
            flags: sc.trace_flags().to_u8(),
        }
    }

    /// The OTLP exporter, its failures logged (rate-limited) instead of dropped.
    #[derive(Debug)]
    struct Logged<E>(E);

    impl<E: SpanExporter> SpanExporter for Logged<E> {
        async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
            let spans = batch.len();
            let result = self.0.export(batch).await;
            if let Err(e) = &result
                && let Some(suppressed) = crate::log_limit::warnings()
                    .admit(("span export failed", 0), tokio::time::Instant::now())
            {
                tracing::warn!(error = %e, spans, suppressed, "span export failed; spans dropped");
            }
            result
        }

        fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
            self.0.shutdown_with_timeout(timeout)
        }

        fn force_flush(&self) -> OTelSdkResult {
            self.0.force_flush()
        }

        fn set_resource(&mut self, resource: &opentelemetry_sdk::Resource) {
            self.0.set_resource(resource);
        }
    }

    /// opentelemetry-http's hyper client for the endpoint's scheme.
    #[derive(Clone, Debug)]
    enum Client {
        /// `http://`: plain TCP.
        Plain(HyperClient),
        /// `https://`: TLS (rustls) over TCP.
        Tls(HyperClient<hyper_rustls::HttpsConnector<HttpConnector>>),
    }

    /// The export client, its requests run on the gateway's runtime: the batch
    /// processor's own thread has no tokio runtime.
    #[derive(Debug)]
    struct OnRuntime {
        client: Client,
        runtime: tokio::runtime::Handle,
    }

    #[async_trait::async_trait]
    impl HttpClient for OnRuntime {
        async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
            let client = self.client.clone();
            self.runtime
                .spawn(async move {
                    match client {
                        Client::Plain(c) => c.send_bytes(request).await,
                        Client::Tls(c) => c.send_bytes(request).await,
                    }
                })
                .await?
        }
    }
}

#[cfg(not(feature = "otlp"))]
mod imp {
    //! Without the `otlp` feature: no value of these types can exist.

    use std::convert::Infallible;

    use http::HeaderValue;

    use super::{ExportError, OtlpConfig, TraceParent};

    /// The running exporter (never made without the `otlp` feature).
    #[derive(Debug)]
    pub struct Exporter(Infallible);

    impl Exporter {
        /// Always [`ExportError::FeatureMissing`] in this build.
        ///
        /// # Errors
        /// Always.
        pub fn start(_config: &OtlpConfig) -> Result<Self, ExportError> {
            Err(ExportError::FeatureMissing)
        }

        /// Nothing to flush.
        pub fn shutdown(&self) {
            match self.0 {}
        }

        /// Unreachable: no exporter exists.
        pub fn request(
            &self,
            _client: Option<&TraceParent>,
            _method: &str,
            _request_id: &str,
        ) -> RequestSpan {
            match self.0 {}
        }
    }

    /// A request's span (never made without the `otlp` feature).
    #[derive(Clone, Debug)]
    pub struct RequestSpan(Infallible);

    impl RequestSpan {
        /// Unreachable.
        pub fn traceparent(&self) -> TraceParent {
            match self.0 {}
        }

        /// Unreachable.
        pub fn attempt(&self, _tier: &'static str, _upstream: String) -> AttemptSpan {
            match self.0 {}
        }

        /// Unreachable.
        pub fn queue_wait(&self) -> ChildSpan {
            match self.0 {}
        }

        /// Unreachable.
        pub fn finish(&self, _status: u16, _tier: &'static str, _path: &str) {
            match self.0 {}
        }
    }

    /// An attempt's span (never made without the `otlp` feature).
    #[derive(Debug)]
    pub struct AttemptSpan(Infallible);

    impl AttemptSpan {
        /// Unreachable.
        pub fn header_value(&self) -> HeaderValue {
            match self.0 {}
        }

        /// Unreachable.
        pub fn outcome(&self, _outcome: &'static str) {
            match self.0 {}
        }

        /// Unreachable.
        pub fn cold_start(&self, _zone: String) -> ChildSpan {
            match self.0 {}
        }
    }

    /// A child span (never made without the `otlp` feature).
    #[derive(Debug)]
    pub struct ChildSpan(Infallible);
}
