//! The hyper/tokio data plane: the live driver of the policy core, the proxy service,
//! the admin listener, header hygiene, TLS and the upstream client.
//!
//! | module | role |
//! |---|---|
//! | [`server`] | listeners, connection serving, graceful shutdown |
//! | [`service`] | the per-request path: hygiene, routing, dispatch, retry, spill-back |
//! | [`driver`] | runs the [`Controller`](crate::policy::controller::Controller) on tokio's clock, executes its actions |
//! | [`admin`] | `/healthz`, `/metrics`, `/status` |
//! | [`error`] | the one mapping from errors to HTTP status codes |
//! | [`metrics`] | the metrics spec |
//! | [`headers`] | hop-by-hop stripping, `X-Forwarded-*` |
//! | [`client`] | pooled upstream client |
//! | [`body`] | the boxed body type and the end-of-body hook |
//! | [`tls`] | rustls server configuration |

pub mod admin;
pub mod body;
pub mod client;
pub mod driver;
pub mod error;
pub mod headers;
pub mod metrics;
pub mod server;
pub mod service;
pub mod tls;
