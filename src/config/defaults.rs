//! The defaults of the gateway, LIBRA and pool sections, once (`config/reference.yaml`
//! shows each; a test checks them). A leaf: it imports only [`super::duration`].

use std::num::{NonZeroU32, NonZeroU64};

use super::duration::Seconds;

/// Default proxy listen address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
/// Default admin listen address (loopback, so that it may run without an admin token).
/// Port 9901, the admin port Envoy uses by convention; it was 9090 before, Prometheus's
/// own port, so a Prometheus beside the gateway could not start (or scraped itself).
pub const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:9901";
/// Default maximum request body, bytes (10 MiB).
pub const DEFAULT_MAX_BODY_BYTES: NonZeroU64 = NonZeroU64::new(10 * 1024 * 1024).unwrap();
/// Default time to receive a request's headers, seconds.
pub const DEFAULT_HEADER_READ_TIMEOUT_SECONDS: Seconds = Seconds::from_secs(10);
/// Default TCP connect timeout to an upstream, seconds.
pub const DEFAULT_CONNECT_TIMEOUT_SECONDS: Seconds = Seconds::from_secs(2);
/// Default time to wait for an upstream's response headers, seconds.
pub const DEFAULT_UPSTREAM_TIMEOUT_SECONDS: Seconds = Seconds::from_secs(30);
/// Default longest pause in a client's request body, seconds.
pub const DEFAULT_REQUEST_BODY_IDLE_TIMEOUT_SECONDS: Seconds = Seconds::from_secs(30);
/// Default longest pause in an upstream's response body, seconds.
pub const DEFAULT_RESPONSE_BODY_IDLE_TIMEOUT_SECONDS: Seconds = Seconds::from_secs(60);
/// Default longest silence of an `Upgrade` tunnel, seconds.
pub const DEFAULT_TUNNEL_IDLE_TIMEOUT_SECONDS: Seconds = Seconds::from_secs(300);
/// Default idle time before a pooled upstream connection is closed, seconds.
pub const DEFAULT_IDLE_TIMEOUT_SECONDS: Seconds = Seconds::from_secs(60);
/// Default idle time of a client connection between requests, seconds: above the idle
/// timeouts of common load balancers (AWS ALB 60 s), as nginx's 75 s is.
pub const DEFAULT_KEEPALIVE_IDLE_TIMEOUT_SECONDS: Seconds = Seconds::from_secs(75);
/// Default interval of the h2 keep-alive PING to a client connection, seconds.
pub const DEFAULT_HTTP2_KEEPALIVE_INTERVAL_SECONDS: Seconds = Seconds::from_secs(30);
/// Default wait for the answer to an h2 keep-alive PING, seconds; then the connection is
/// closed.
pub const DEFAULT_HTTP2_KEEPALIVE_TIMEOUT_SECONDS: Seconds = Seconds::from_secs(20);
/// Default time in-flight requests get to finish on shutdown, seconds.
pub const DEFAULT_DRAIN_TIMEOUT_SECONDS: Seconds = Seconds::from_secs(30);
/// Default most concurrent streams per h2 client connection.
pub const DEFAULT_MAX_CONCURRENT_STREAMS: NonZeroU32 = NonZeroU32::new(256).unwrap();
/// Upper bound of `max_header_bytes` and `max_uri_bytes`: 1 MiB.
pub const MAX_HEAD_LIMIT_BYTES: usize = 1024 * 1024;
/// LIBRA authors' epoch, seconds.
pub const DEFAULT_EPOCH_SECONDS: Seconds = Seconds::from_secs(1);
/// LIBRA authors' α and β.
pub const DEFAULT_ALPHA: f64 = 0.2;
/// LIBRA authors' β.
pub const DEFAULT_BETA: f64 = 0.2;
/// LIBRA authors' φ.
pub const DEFAULT_PHI: f64 = 1.0;
/// LIBRA authors' ρ.
pub const DEFAULT_RHO: f64 = 0.8;
/// LIBRA authors' K (decisions every 300 one-second epochs).
pub const DEFAULT_DECISION_EPOCHS: NonZeroU32 = NonZeroU32::new(300).unwrap();
/// Default VM boot/readiness timeout, seconds.
pub const DEFAULT_BOOT_TIMEOUT_SECONDS: Seconds = Seconds::from_secs(120);
/// Default interval between readiness probes, seconds.
pub const DEFAULT_PROBE_INTERVAL_SECONDS: Seconds = Seconds::from_millis(100);
/// Default function keep-alive, seconds.
pub const DEFAULT_KEEP_ALIVE_SECONDS: Seconds = Seconds::from_secs(600);
/// Default deadline of one OTLP export request (a batch of spans), milliseconds.
pub const DEFAULT_OTLP_TIMEOUT_MS: u64 = 10_000;
/// Default share of the traces the gateway starts that are sampled (exported), 0–1.
pub const DEFAULT_OTLP_SAMPLE_RATIO: f64 = 1.0;
/// Default `service.name` resource attribute of exported spans.
pub const DEFAULT_OTLP_SERVICE_NAME: &str = "spillway";
