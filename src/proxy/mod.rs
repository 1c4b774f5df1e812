//! The hyper/tokio data plane: the live driver of the policy core, the proxy service,
//! the admin listener.
//!
//! | module | role |
//! |---|---|
//! | [`server`] | listeners, connection serving, graceful shutdown |
//! | [`protocol`] | HTTP/1.1 or h2 per client connection: ALPN on TLS, the h2 preface on cleartext |
//! | [`lifetime`] | client connection budgets and deadlines (first request, header read, keep-alive idle) |
//! | [`service`] | the per-request path: hygiene, routing, dispatch, retry, spill-back |
//! | [`driver`] | runs the [`Controller`](crate::policy::controller::Controller) on tokio's clock, executes its actions |
//! | [`vm_book`] | the VM address book: instances, base URLs, parked `static` members, suspect probes and health marks |
//! | [`waiters`] | the calls waiting in the gateway queue (call scheduling §4) until dequeued or timed out |
//! | [`billing`] | the running bill (LIBRA §II cost model) behind `/status` `cost` and `spillway_cost_*` |
//! | [`status`] | the status snapshot `/status` renders: the core's, the last decision, every VM with its address |
//! | [`boots`] | instance boots: calls waiting for a booting pre-warmed function instance, a launched VM's resolution and readiness probe |
//! | [`admin`] | `/livez`, `/readyz`, `/healthz`, `/metrics`, `/status`, `/reload` |
//! | [`admin_token`] | the admin listener's bearer token, replaced on reload |
//! | [`access_log`] | the in-flight gauge and the per-request access log |
//! | [`error`] | the one mapping from errors to HTTP status codes |
//! | [`reload`] | `SIGHUP` / `POST /reload`: re-read, validate, swap — nothing half-applied |
//! | [`async_calls`] | asynchronous calls (ProFaaStinate §3): accept, store, status, release, and the CPU signal that paces release |
//!
//! HTTP primitives shared with the backends (body, upstream client, header hygiene, TLS)
//! live in [`crate::net`]; the metrics spec in [`crate::telemetry`].

/// `impl AsyncWrite for $ty<I>` that passes every call to its field `$io` unchanged:
/// the connection wrappers ([`lifetime::Tracked`], the protocol sniffer's replay of
/// the first bytes) change only how a connection is read.
macro_rules! forward_async_write {
    ($ty:ident, $io:ident) => {
        impl<I: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for $ty<I> {
            fn poll_write(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                buf: &[u8],
            ) -> std::task::Poll<std::io::Result<usize>> {
                std::pin::Pin::new(&mut self.get_mut().$io).poll_write(cx, buf)
            }

            fn poll_write_vectored(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                bufs: &[std::io::IoSlice<'_>],
            ) -> std::task::Poll<std::io::Result<usize>> {
                std::pin::Pin::new(&mut self.get_mut().$io).poll_write_vectored(cx, bufs)
            }

            fn is_write_vectored(&self) -> bool {
                self.$io.is_write_vectored()
            }

            fn poll_flush(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                std::pin::Pin::new(&mut self.get_mut().$io).poll_flush(cx)
            }

            fn poll_shutdown(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                std::pin::Pin::new(&mut self.get_mut().$io).poll_shutdown(cx)
            }
        }
    };
}

pub mod access_log;
pub mod admin;
pub mod admin_token;
pub mod async_calls;
pub mod billing;
pub mod boots;
pub mod driver;
pub mod error;
pub mod lifetime;
pub mod protocol;
pub mod reload;
pub mod server;
pub mod service;
pub mod status;
pub mod vm_book;
pub mod waiters;
