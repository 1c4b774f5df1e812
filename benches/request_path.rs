//! Criterion benchmark of the whole request path, without sockets: a client
//! connection → the gateway's connection server (hyper, validation, header hygiene,
//! LIBRA routing, metrics) → the pooled upstream client → an upstream, every link an
//! in-memory `tokio::io::duplex` stream. One current-thread runtime runs all three, so
//! the figure is the CPU work per request of the gateway plus the two hyper peers. It
//! is measured as the thread's CPU time (Linux), not wall time, so that other processes
//! on a shared machine do not move it much; it guards the per-request cost against
//! regressions (the socket numbers come from `scripts/bench-proxy.sh`). The binary's
//! allocator (jemalloc) is used here too.

// `criterion_group!` defines an undocumented `pub fn`; a bench is not an API.
#![allow(missing_docs)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use http::{Request, Response};
use http_body_util::{BodyExt, Empty, Full};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use spillway::config::Config;
use spillway::net::client::{ClientSettings, UpstreamClient};
use spillway::proxy::server::{Connections, Server};

#[cfg(all(unix, not(target_env = "musl")))]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// CPU time of the calling thread (wall time where that clock is not available).
fn cpu_now() -> Duration {
    #[cfg(target_os = "linux")]
    {
        let mut t = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes the timespec it is given and nothing else.
        #[allow(unsafe_code)]
        let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
        assert_eq!(rc, 0, "CLOCK_THREAD_CPUTIME_ID is available on Linux");
        Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
    }
    #[cfg(not(target_os = "linux"))]
    {
        static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        START.get_or_init(std::time::Instant::now).elapsed()
    }
}

/// The bench-proxy.sh configuration: one static VM, routing on, no spill, access log off.
const CONFIG: &str = r#"version: 1
gateway:
  listen: 127.0.0.1:0
  admin_listen: 127.0.0.1:0
  access_log: false
  allow_loopback_upstreams: true
libra:
  decision_epochs: 100000
  r_max_rps: 100000000
  min_vms: 1
  max_vms: 1
vm_pool:
  type: static
  urls: ["http://127.0.0.1:9"]
function_tier:
  type: http
  url: http://127.0.0.1:9/
  max_concurrency: 64
"#;

/// Bytes buffered per direction of each in-memory stream (a socket buffer's order).
const PIPE_BYTES: usize = 64 * 1024;
const PEER: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 40000);

/// A gateway whose upstream connections are served in memory by a one-line origin.
async fn gateway() -> (Server, Connections) {
    let config = Config::from_yaml(CONFIG, "bench.yaml").expect("bench config is valid");
    let (client, mut accepted) = UpstreamClient::in_memory(
        ClientSettings {
            connect_timeout: Duration::from_secs(2),
            idle_timeout: Duration::from_secs(60),
        },
        PIPE_BYTES,
    );
    tokio::spawn(async move {
        while let Some(io) = accepted.recv().await {
            tokio::spawn(async move {
                let svc = service_fn(|_req| async {
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(
                        b"hello from origin\n",
                    ))))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(io), svc)
                    .await;
            });
        }
    });
    let server = Server::bind_with_client(config, PathBuf::from("spillway"), client)
        .await
        .expect("gateway binds");
    let connections = server.connections();
    (server, connections)
}

fn get() -> Request<Empty<Bytes>> {
    Request::get("/api/items?page=2")
        .header(http::header::HOST, "bench.example")
        .header(http::header::USER_AGENT, "criterion")
        .header(http::header::ACCEPT, "*/*")
        .body(Empty::new())
        .expect("static request is valid")
}

async fn expect_ok<B: hyper::body::Body>(resp: Response<B>)
where
    B::Error: std::fmt::Debug,
{
    assert_eq!(resp.status(), http::StatusCode::OK);
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    assert_eq!(&body[..], b"hello from origin\n");
}

fn bench_request_path(cr: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (_server, connections) = rt.block_on(gateway());
    let mut group = cr.benchmark_group("request_path");

    // HTTP/1.1 keep-alive: one GET at a time on one client connection.
    let mut h1 = rt.block_on(async {
        let (near, far) = tokio::io::duplex(PIPE_BYTES);
        let c = connections.clone();
        tokio::spawn(async move { c.serve(far, PEER, "http", None).await });
        let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(near))
            .await
            .expect("h1 handshake");
        tokio::spawn(conn);
        send
    });
    group.throughput(Throughput::Elements(1));
    group.bench_function("h1_keepalive_get", |b| {
        b.iter_custom(|iters| {
            let start = cpu_now();
            rt.block_on(async {
                for _ in 0..iters {
                    h1.ready().await.expect("h1 ready");
                    expect_ok(h1.send_request(get()).await.expect("h1 response")).await;
                }
            });
            cpu_now() - start
        })
    });

    // h2 prior knowledge: 16 concurrent streams on one client connection.
    const STREAMS: u64 = 16;
    let h2 = rt.block_on(async {
        let (near, far) = tokio::io::duplex(PIPE_BYTES);
        let c = connections.clone();
        tokio::spawn(async move { c.serve(far, PEER, "http", None).await });
        let (send, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(near))
                .await
                .expect("h2 handshake");
        tokio::spawn(conn);
        send
    });
    group.throughput(Throughput::Elements(STREAMS));
    group.bench_function("h2_16_streams_get", |b| {
        b.iter_custom(|iters| {
            let start = cpu_now();
            rt.block_on(async {
                for _ in 0..iters {
                    let mut streams = tokio::task::JoinSet::new();
                    for _ in 0..STREAMS {
                        let mut send = h2.clone();
                        streams.spawn(async move {
                            expect_ok(send.send_request(get()).await.expect("h2 response")).await;
                        });
                    }
                    while let Some(done) = streams.join_next().await {
                        done.expect("stream task");
                    }
                }
            });
            cpu_now() - start
        })
    });
    group.finish();
}

criterion_group!(benches, bench_request_path);
criterion_main!(benches);
