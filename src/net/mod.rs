//! HTTP and network primitives shared by the data plane ([`crate::proxy`]) and the
//! backends ([`crate::backends`]): the boxed body type, the pooled upstream client and its
//! address policy, header hygiene, TLS configuration and [`ClientInfo`]. A leaf module: it imports no
//! other spillway module, so that the proxy and the backends both depend on it and never
//! on each other's internals (`scripts/check-module-deps.sh`).
//!
//! | module | role |
//! |---|---|
//! | [`body`] | the boxed body type and the end-of-body hook |
//! | [`client`] | pooled upstream client; its connector enforces the address policy and speaks TLS to `https://` upstreams |
//! | [`headers`] | hop-by-hop stripping, forwarding headers, response framing |
//! | [`pool`] | the upstream connection pool (per-thread shards on hyper's connection API) and the response body that returns a connection |
//! | [`request_id`] | the `x-request-id` of every request: kept or made |
//! | [`tls`] | rustls configuration: the TLS listener, and HTTPS upstreams (roots, CA bundle, client certificate) |
//! | [`upstream`] | the upstream address policy, at parse time and at connect time |
//! | [`validate`] | request validation and path normalization before routing |

pub mod body;
pub mod client;
pub mod headers;
pub mod pool;
pub mod request_id;
pub mod tls;
pub mod upstream;
pub mod validate;

use std::net::SocketAddr;

/// Who sent a request, as the gateway saw it: put into the request's extensions before
/// every function-tier call, so that tiers which must report the client themselves (the
/// Lambda tier's `requestContext.http.sourceIp`, http-cases C8 and C19) read the real
/// peer instead of a client-supplied `X-Forwarded-For`. VM requests carry the peer in the
/// gateway's own `X-Forwarded-For` instead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClientInfo {
    /// The TCP peer of the client connection.
    pub peer: SocketAddr,
    /// `"http"` or `"https"`: the listener the request came in on.
    pub scheme: &'static str,
}

/// Which instance answered a request: a response extension that the request path (for
/// VMs) and the function tiers set, read by the access log. Absent: `-` in the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServedBy {
    /// The VM (`vm-3`) or function instance (`fn-7`) that produced the response.
    pub instance: String,
    /// The function zone it ran in (edge/cloud placement), when the tier has zones.
    pub zone: Option<String>,
}
