//! A stock hyper reverse proxy: the reference row of `scripts/bench-proxy.sh`, so that
//! the limit of the stack spillway is built on (hyper 1, hyper-util's pooled legacy
//! client, tokio) is measured in the same run as nginx, HAProxy and spillway. No
//! routing, metrics, header hygiene or limits: every request goes to the one upstream.
//!
//! One current-thread tokio runtime per core, each with its own `SO_REUSEPORT`
//! listener on the same address (the kernel spreads connections over them) and its own
//! connection pool. Clients may speak HTTP/1.1 or h2c (prior knowledge); the upstream is
//! reached over HTTP/1.1 keep-alive.
//!
//! Usage: `cargo run --release --example hyper_proxy -- LISTEN UPSTREAM`, for example
//! `127.0.0.1:8080 http://127.0.0.1:9000` (the upstream's scheme and authority; the
//! request's path and query are kept).

use std::error::Error;
use std::net::SocketAddr;

use http::uri::{Authority, Scheme};
use http::{Request, Response, Uri, Version};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;

type BoxError = Box<dyn Error + Send + Sync>;

fn main() -> Result<(), BoxError> {
    let mut args = std::env::args().skip(1);
    let (Some(listen), Some(upstream)) = (args.next(), args.next()) else {
        return Err(
            "usage: hyper_proxy LISTEN UPSTREAM (127.0.0.1:8080 http://127.0.0.1:9000)".into(),
        );
    };
    let listen: SocketAddr = listen
        .parse()
        .map_err(|e| format!("LISTEN {listen:?}: {e}"))?;
    let upstream: Uri = upstream
        .parse()
        .map_err(|e| format!("UPSTREAM {upstream:?}: {e}"))?;
    let (Some(scheme), Some(authority)) =
        (upstream.scheme().cloned(), upstream.authority().cloned())
    else {
        return Err(format!("UPSTREAM {upstream}: needs a scheme and a host").into());
    };
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let threads: Vec<_> = (0..cores)
        .map(|_| {
            let (scheme, authority) = (scheme.clone(), authority.clone());
            std::thread::spawn(move || serve(listen, scheme, authority))
        })
        .collect();
    eprintln!("hyper_proxy listening on {listen} ({cores} runtimes), upstream {upstream}");
    for t in threads {
        t.join().map_err(|_| "a runtime thread panicked")??;
    }
    Ok(())
}

/// One runtime: accept on its own `SO_REUSEPORT` listener, forward every request.
fn serve(listen: SocketAddr, scheme: Scheme, authority: Authority) -> Result<(), BoxError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let socket = tokio::net::TcpSocket::new_v4()?;
        socket.set_reuseport(true)?;
        socket.bind(listen)?;
        let listener = socket.listen(1024)?;
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let client: Client<_, Incoming> = Client::builder(TokioExecutor::new()).build(connector);
        loop {
            let (stream, _) = listener.accept().await?;
            stream.set_nodelay(true)?;
            let (client, scheme, authority) = (client.clone(), scheme.clone(), authority.clone());
            let service = service_fn(move |req: Request<Incoming>| {
                forward(client.clone(), scheme.clone(), authority.clone(), req)
            });
            tokio::spawn(async move {
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    })
}

/// Send `req` to the upstream at `scheme://authority`, its path and query kept, over
/// HTTP/1.1 (h2c clients too; `Host` from the upstream's authority).
async fn forward(
    client: Client<HttpConnector, Incoming>,
    scheme: Scheme,
    authority: Authority,
    req: Request<Incoming>,
) -> Result<Response<Incoming>, BoxError> {
    let (mut parts, body) = req.into_parts();
    let mut uri = Uri::builder().scheme(scheme).authority(authority);
    if let Some(p) = parts.uri.path_and_query() {
        uri = uri.path_and_query(p.clone());
    }
    parts.uri = uri.build()?;
    parts.version = Version::HTTP_11;
    parts.headers.remove(http::header::HOST);
    Ok(client.request(Request::from_parts(parts, body)).await?)
}
