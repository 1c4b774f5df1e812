//! The sample API that the gateway fronts in the quickstart and in tests. The same
//! binary runs as a VM instance and as a function, so it has a cheap endpoint, a slow
//! one, a CPU-bound one and a few that let tests observe what the gateway forwarded.
//!
//! Endpoints (every response carries `x-spillway-instance: <name>`):
//!
//! | path | method | reply |
//! | --- | --- | --- |
//! | `/` | GET, HEAD | 200 `text/plain` `spillway sample API\n` |
//! | `/echo` | any | 200, the request body streamed back with the same `content-type` |
//! | `/headers` | any | 200 JSON describing the request as received |
//! | `/sleep?ms=N` | any | waits N ms (default 100, at most 60000), 200 `{"slept_ms": N}` |
//! | `/resize?size=N&width=W&height=H` | any | resizes a generated N×N image to W×H, 200 `image/png` |
//! | `/stats` | GET, HEAD | 200 JSON request counters |
//! | anything else | | 404 |
//!
//! Bad query parameters give 400 with a short `text/plain` message; a method other than
//! GET/HEAD on `/` or `/stats` gives 405.

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use image::imageops::FilterType;
use image::{ImageBuffer, ImageEncoder, Rgb};
use serde_json::json;
use tokio::net::TcpListener;

/// Name of the response header that carries the instance name.
pub const INSTANCE_HEADER: &str = "x-spillway-instance";

/// Largest `ms` accepted by `/sleep`, in milliseconds.
pub const MAX_SLEEP_MS: u64 = 60_000;
/// Default `ms` for `/sleep`, in milliseconds.
pub const DEFAULT_SLEEP_MS: u64 = 100;
/// Largest source side (`size`) and target side (`width`, `height`) accepted by
/// `/resize`, in pixels.
pub const MAX_RESIZE_SIDE: u32 = 4096;
/// Default source side (`size`) for `/resize`, in pixels.
pub const DEFAULT_RESIZE_SIZE: u32 = 512;
/// Default target width and height for `/resize`, in pixels.
pub const DEFAULT_RESIZE_TARGET: u32 = 128;

/// Paths counted individually in `/stats`; everything else is counted under `"other"`
/// so that the counters stay bounded whatever clients request.
const KNOWN_PATHS: [&str; 5] = ["/", "/echo", "/headers", "/sleep", "/resize"];

/// Options for [`serve`].
#[derive(Debug, Clone)]
pub struct SampleApiOptions {
    /// Instance name, reported in every response header `x-spillway-instance`. Must be a
    /// valid HTTP header value (visible ASCII).
    pub name: String,
}

/// The response body type: either a buffered body or the streamed request body.
type Body = BoxBody<Bytes, hyper::Error>;

/// Request counters shared by all connections.
#[derive(Default)]
struct Stats {
    total: AtomicU64,
    by_path: Mutex<BTreeMap<&'static str, u64>>,
}

impl Stats {
    fn record(&self, path: &str) {
        self.total.fetch_add(1, Ordering::Relaxed);
        let key = KNOWN_PATHS
            .iter()
            .copied()
            .find(|p| *p == path)
            .unwrap_or("other");
        // A poisoned lock only means a panic elsewhere mid-increment; the map is still usable.
        let mut map = self.by_path.lock();
        *map.entry(key).or_insert(0) += 1;
    }

    fn to_json(&self) -> serde_json::Value {
        let map = self.by_path.lock();
        json!({
            "requests": self.total.load(Ordering::Relaxed),
            "by_path": &*map,
        })
    }
}

/// Per-server state handed to every request.
struct State {
    instance: HeaderValue,
    stats: Stats,
}

/// Serve the sample API on `listener` until `shutdown` completes.
///
/// Each accepted connection is served with hyper-util's auto builder (HTTP/1.1, or
/// cleartext HTTP/2 when the client starts with the h2 preface). When `shutdown`
/// completes the listener is closed, idle connections are closed, HTTP/2 connections get
/// a GOAWAY, and the function returns once every in-flight request has been answered
/// (wrap the call in `tokio::time::timeout` to bound that wait).
///
/// Transient accept errors (for example running out of file descriptors) are logged and
/// retried after 50 ms.
///
/// # Errors
/// `io::ErrorKind::InvalidInput` if `opts.name` is not a valid header value.
pub async fn serve(
    listener: TcpListener,
    opts: SampleApiOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let instance = HeaderValue::from_str(&opts.name).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "instance name {:?} is not a valid header value: {e}",
                opts.name
            ),
        )
    })?;
    let state = Arc::new(State {
        instance,
        stats: Stats::default(),
    });

    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new());
    builder.http2().timer(TokioTimer::new());

    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            biased;
            () = &mut shutdown => break,
            accepted = listener.accept() => accepted,
        };
        let (tcp, peer) = match accepted {
            Ok(pair) => pair,
            Err(e) => {
                tracing::warn!(error = %e, "sample API: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let state = Arc::clone(&state);
        let service = service_fn(move |req| {
            let state = Arc::clone(&state);
            async move { Ok::<_, Infallible>(handle(req, &state).await) }
        });
        let conn = builder
            .serve_connection(TokioIo::new(tcp), service)
            .into_owned();
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(%peer, error = %e, "sample API: connection ended with error");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// Route one request and stamp the instance header on the response.
async fn handle(req: Request<Incoming>, state: &State) -> Response<Body> {
    let path = req.uri().path().to_string();
    if path != "/stats" {
        state.stats.record(&path);
    }
    let mut resp = match path.as_str() {
        "/" => root(req).await,
        "/echo" => echo(req),
        "/headers" => headers(req).await,
        "/sleep" => sleep(req).await,
        "/resize" => resize(req).await,
        "/stats" => stats(req, state).await,
        _ => {
            drain(req.into_body()).await;
            text(StatusCode::NOT_FOUND, "not found\n")
        }
    };
    resp.headers_mut()
        .insert(INSTANCE_HEADER, state.instance.clone());
    resp
}

/// A buffered response body.
fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

/// A `text/plain` response.
fn text(status: StatusCode, msg: &'static str) -> Response<Body> {
    let mut resp = Response::new(full(msg));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

/// A 200 `application/json` response.
fn json_response(value: &serde_json::Value) -> Response<Body> {
    let mut resp = Response::new(full(value.to_string()));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// Read and discard the request body, returning its length in bytes. A body that fails
/// mid-way (client gone, framing error) is counted up to the failure.
async fn drain(mut body: Incoming) -> u64 {
    let mut n = 0u64;
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(frame) => {
                if let Some(data) = frame.data_ref() {
                    n += data.len() as u64;
                }
            }
            Err(_) => break,
        }
    }
    n
}

/// 405 for a method other than GET/HEAD.
fn get_only(method: &Method) -> Option<Response<Body>> {
    if method == Method::GET || method == Method::HEAD {
        return None;
    }
    let mut resp = text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
    resp.headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
    Some(resp)
}

async fn root(req: Request<Incoming>) -> Response<Body> {
    let refused = get_only(req.method());
    drain(req.into_body()).await;
    refused.unwrap_or_else(|| text(StatusCode::OK, "spillway sample API\n"))
}

fn echo(req: Request<Incoming>) -> Response<Body> {
    let (parts, body) = req.into_parts();
    let mut resp = Response::new(body.boxed());
    if let Some(ct) = parts.headers.get(header::CONTENT_TYPE) {
        resp.headers_mut().insert(header::CONTENT_TYPE, ct.clone());
    }
    resp
}

async fn headers(req: Request<Incoming>) -> Response<Body> {
    let (parts, body) = req.into_parts();
    let mut names: Vec<&str> = Vec::new();
    let mut map = serde_json::Map::new();
    for name in parts.headers.keys() {
        names.push(name.as_str());
    }
    for name in names {
        let values: Vec<serde_json::Value> = parts
            .headers
            .get_all(name)
            .iter()
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned().into())
            .collect();
        map.insert(name.to_string(), serde_json::Value::Array(values));
    }
    let body_bytes = drain(body).await;
    json_response(&json!({
        "method": parts.method.as_str(),
        "path": parts.uri.path(),
        "query": parts.uri.query(),
        "authority": parts.uri.authority().map(|a| a.as_str()),
        "version": format!("{:?}", parts.version),
        "headers": map,
        "body_bytes": body_bytes,
    }))
}

/// The first value of `key` in a raw query string (no percent-decoding: the sample API's
/// parameters are plain numbers).
fn query_param<'a>(query: Option<&'a str>, key: &str) -> Option<&'a str> {
    query?
        .split('&')
        .map(|pair| pair.split_once('=').unwrap_or((pair, "")))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v)
}

/// Parse a numeric query parameter: `Ok(default)` when absent, `Err(())` when not a
/// number within `min..=max`.
fn numeric_param<T>(query: Option<&str>, key: &str, default: T, min: T, max: T) -> Result<T, ()>
where
    T: std::str::FromStr + PartialOrd,
{
    match query_param(query, key) {
        None => Ok(default),
        Some(raw) => match raw.parse::<T>() {
            Ok(v) if v >= min && v <= max => Ok(v),
            _ => Err(()),
        },
    }
}

async fn sleep(req: Request<Incoming>) -> Response<Body> {
    let ms = numeric_param(req.uri().query(), "ms", DEFAULT_SLEEP_MS, 0, MAX_SLEEP_MS);
    drain(req.into_body()).await;
    let Ok(ms) = ms else {
        return text(
            StatusCode::BAD_REQUEST,
            "ms must be an integer between 0 and 60000\n",
        );
    };
    tokio::time::sleep(Duration::from_millis(ms)).await;
    json_response(&json!({ "slept_ms": ms }))
}

async fn resize(req: Request<Incoming>) -> Response<Body> {
    let q = req.uri().query();
    let params = (
        numeric_param(q, "size", DEFAULT_RESIZE_SIZE, 1, MAX_RESIZE_SIDE),
        numeric_param(q, "width", DEFAULT_RESIZE_TARGET, 1, MAX_RESIZE_SIDE),
        numeric_param(q, "height", DEFAULT_RESIZE_TARGET, 1, MAX_RESIZE_SIDE),
    );
    drain(req.into_body()).await;
    let (Ok(size), Ok(width), Ok(height)) = params else {
        return text(
            StatusCode::BAD_REQUEST,
            "size, width and height must be integers between 1 and 4096\n",
        );
    };
    match tokio::task::spawn_blocking(move || render_resized_png(size, width, height)).await {
        Ok(Ok(png)) => {
            let mut resp = Response::new(full(png));
            resp.headers_mut()
                .insert(header::CONTENT_TYPE, HeaderValue::from_static("image/png"));
            resp
        }
        Ok(Err(e)) => {
            tracing::error!(error = %e, "sample API: PNG encoding failed");
            text(StatusCode::INTERNAL_SERVER_ERROR, "encoding failed\n")
        }
        Err(e) => {
            tracing::error!(error = %e, "sample API: resize task failed");
            text(StatusCode::INTERNAL_SERVER_ERROR, "resize failed\n")
        }
    }
}

/// Generate a deterministic `size`×`size` RGB image, resize it to `width`×`height` with a
/// Lanczos3 filter and encode the result as PNG. CPU-bound: call from a blocking thread.
///
/// # Errors
/// The PNG encoder's error (not expected for in-memory output).
pub fn render_resized_png(size: u32, width: u32, height: u32) -> image::ImageResult<Vec<u8>> {
    let source = ImageBuffer::from_fn(size, size, |x, y| {
        // Gradients plus a checker pattern, so the filter has edges to work on.
        let checker = if ((x / 16) + (y / 16)) % 2 == 0 {
            255u8
        } else {
            0
        };
        Rgb([
            (x % 256) as u8,
            (y % 256) as u8,
            checker ^ ((x ^ y) % 256) as u8,
        ])
    });
    let resized = image::imageops::resize(&source, width, height, FilterType::Lanczos3);
    let mut png = Vec::new();
    image::codecs::png::PngEncoder::new(&mut png).write_image(
        resized.as_raw(),
        width,
        height,
        image::ExtendedColorType::Rgb8,
    )?;
    Ok(png)
}

async fn stats(req: Request<Incoming>, state: &State) -> Response<Body> {
    let refused = get_only(req.method());
    drain(req.into_body()).await;
    refused.unwrap_or_else(|| json_response(&state.stats.to_json()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper_util::client::legacy::Client;
    use hyper_util::client::legacy::connect::HttpConnector;
    use std::net::SocketAddr;
    use tokio::sync::oneshot;
    use tokio::task::JoinHandle;
    use tokio::time::Instant;

    type TestClient = Client<HttpConnector, Full<Bytes>>;

    struct Server {
        addr: SocketAddr,
        stop: Option<oneshot::Sender<()>>,
        task: JoinHandle<io::Result<()>>,
    }

    async fn start(name: &str) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (tx, rx) = oneshot::channel::<()>();
        let opts = SampleApiOptions {
            name: name.to_string(),
        };
        let task = tokio::spawn(serve(listener, opts, async move {
            let _ = rx.await;
        }));
        Server {
            addr,
            stop: Some(tx),
            task,
        }
    }

    fn client() -> TestClient {
        Client::builder(TokioExecutor::new()).build_http()
    }

    fn h2c_client() -> TestClient {
        Client::builder(TokioExecutor::new())
            .http2_only(true)
            .build_http()
    }

    async fn send(
        c: &TestClient,
        method: Method,
        url: String,
        body: &'static [u8],
        ct: Option<&'static str>,
    ) -> (StatusCode, http::HeaderMap, Bytes) {
        let mut b = Request::builder().method(method).uri(url);
        if let Some(ct) = ct {
            b = b.header(header::CONTENT_TYPE, ct);
        }
        let req = b
            .body(Full::new(Bytes::from_static(body)))
            .expect("request");
        let resp = c.request(req).await.expect("response");
        let (parts, body) = resp.into_parts();
        let bytes = body.collect().await.expect("body").to_bytes();
        (parts.status, parts.headers, bytes)
    }

    async fn get(c: &TestClient, url: String) -> (StatusCode, http::HeaderMap, Bytes) {
        send(c, Method::GET, url, b"", None).await
    }

    fn as_json(b: &Bytes) -> serde_json::Value {
        serde_json::from_slice(b).expect("json body")
    }

    #[tokio::test]
    async fn root_and_instance_header() {
        let s = start("vm-1").await;
        let c = client();
        let (st, h, b) = get(&c, format!("http://{}/", s.addr)).await;
        assert_eq!(st, StatusCode::OK);
        assert_eq!(&b[..], b"spillway sample API\n");
        assert_eq!(h[INSTANCE_HEADER], "vm-1");
        assert!(
            h[header::CONTENT_TYPE]
                .to_str()
                .expect("ascii")
                .starts_with("text/plain")
        );

        let (st, h, _) = send(&c, Method::POST, format!("http://{}/", s.addr), b"x", None).await;
        assert_eq!(st, StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(h[INSTANCE_HEADER], "vm-1");
    }

    #[tokio::test]
    async fn unknown_path_is_404_with_instance_header() {
        let s = start("fn-7").await;
        let c = client();
        let (st, h, _) = send(
            &c,
            Method::POST,
            format!("http://{}/no-such-route", s.addr),
            b"ignored body",
            None,
        )
        .await;
        assert_eq!(st, StatusCode::NOT_FOUND);
        assert_eq!(h[INSTANCE_HEADER], "fn-7");
    }

    #[tokio::test]
    async fn echo_streams_body_back_with_content_type() {
        let s = start("e").await;
        for c in [client(), h2c_client()] {
            let body: &'static [u8] = b"\x00\x01hello\xffworld";
            let (st, h, b) = send(
                &c,
                Method::PUT,
                format!("http://{}/echo", s.addr),
                body,
                Some("application/octet-stream"),
            )
            .await;
            assert_eq!(st, StatusCode::OK);
            assert_eq!(&b[..], body);
            assert_eq!(h[header::CONTENT_TYPE], "application/octet-stream");
            assert_eq!(h[INSTANCE_HEADER], "e");
        }
    }

    #[tokio::test]
    async fn headers_describes_request_as_received() {
        let s = start("h").await;
        let c = client();
        let req = Request::builder()
            .method(Method::PATCH)
            .uri(format!("http://{}/headers?a=1&a=2&x=%2F", s.addr))
            .header("X-Tag", "v1")
            .header("x-tag", "v2")
            .header("Cookie", "s=1")
            .body(Full::new(Bytes::from_static(b"12345")))
            .expect("request");
        let resp = c.request(req).await.expect("response");
        assert_eq!(resp.status(), StatusCode::OK);
        let b = resp.into_body().collect().await.expect("body").to_bytes();
        let v = as_json(&b);
        assert_eq!(v["method"], "PATCH");
        assert_eq!(v["path"], "/headers");
        assert_eq!(v["query"], "a=1&a=2&x=%2F");
        assert_eq!(v["headers"]["x-tag"], json!(["v1", "v2"]));
        assert_eq!(v["headers"]["cookie"], json!(["s=1"]));
        assert_eq!(v["headers"]["content-length"], json!(["5"]));
        assert_eq!(v["body_bytes"], 5);
        assert_eq!(v["version"], "HTTP/1.1");

        let (_, _, b) = get(&h2c_client(), format!("http://{}/headers", s.addr)).await;
        let v = as_json(&b);
        assert_eq!(v["query"], serde_json::Value::Null);
        assert_eq!(v["version"], "HTTP/2.0");
        assert_eq!(v["body_bytes"], 0);
    }

    #[tokio::test]
    async fn sleep_waits_and_validates() {
        let s = start("s").await;
        let c = client();
        let started = Instant::now();
        let (st, _, b) = get(&c, format!("http://{}/sleep?ms=30", s.addr)).await;
        assert_eq!(st, StatusCode::OK);
        assert!(started.elapsed() >= Duration::from_millis(30));
        assert_eq!(as_json(&b), json!({"slept_ms": 30}));

        let (st, _, b) = get(&c, format!("http://{}/sleep", s.addr)).await;
        assert_eq!(st, StatusCode::OK);
        assert_eq!(as_json(&b), json!({"slept_ms": DEFAULT_SLEEP_MS}));

        for bad in ["ms=60001", "ms=-1", "ms=abc", "ms="] {
            let (st, h, _) = get(&c, format!("http://{}/sleep?{bad}", s.addr)).await;
            assert_eq!(st, StatusCode::BAD_REQUEST, "{bad}");
            assert_eq!(h[INSTANCE_HEADER], "s");
        }
    }

    #[tokio::test]
    async fn resize_returns_png_of_requested_size() {
        let s = start("r").await;
        let c = client();
        let (st, h, b) = get(
            &c,
            format!("http://{}/resize?size=64&width=20&height=10", s.addr),
        )
        .await;
        assert_eq!(st, StatusCode::OK);
        assert_eq!(h[header::CONTENT_TYPE], "image/png");
        assert_eq!(&b[..8], b"\x89PNG\r\n\x1a\n");
        // IHDR: width and height as big-endian u32 at offsets 16 and 20.
        assert_eq!(&b[16..20], &20u32.to_be_bytes());
        assert_eq!(&b[20..24], &10u32.to_be_bytes());

        // Deterministic output.
        let (_, _, again) = get(
            &c,
            format!("http://{}/resize?size=64&width=20&height=10", s.addr),
        )
        .await;
        assert_eq!(b, again);

        for bad in [
            "size=4097",
            "size=0",
            "width=5000",
            "height=0",
            "width=x",
            "size=-5",
        ] {
            let (st, _, _) = get(&c, format!("http://{}/resize?{bad}", s.addr)).await;
            assert_eq!(st, StatusCode::BAD_REQUEST, "{bad}");
        }
    }

    #[test]
    fn render_defaults_produce_png() {
        let png = render_resized_png(DEFAULT_RESIZE_SIZE, 128, 128).expect("png");
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        assert_eq!(&png[16..20], &128u32.to_be_bytes());
    }

    #[tokio::test]
    async fn stats_counts_requests_excluding_stats() {
        let s = start("st").await;
        let c = client();
        let base = format!("http://{}", s.addr);
        send(
            &c,
            Method::POST,
            format!("{base}/sleep?ms=0"),
            b"side effect",
            None,
        )
        .await;
        get(&c, format!("{base}/")).await;
        get(&c, format!("{base}/nope")).await;
        get(&c, format!("{base}/stats")).await;
        let (st, _, b) = get(&c, format!("{base}/stats")).await;
        assert_eq!(st, StatusCode::OK);
        assert_eq!(
            as_json(&b),
            json!({"requests": 3, "by_path": {"/sleep": 1, "/": 1, "other": 1}})
        );
    }

    #[tokio::test]
    async fn invalid_instance_name_is_rejected() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let opts = SampleApiOptions {
            name: "bad\nname".to_string(),
        };
        let err = serve(listener, opts, std::future::pending())
            .await
            .expect_err("invalid name");
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    }

    #[tokio::test]
    async fn graceful_shutdown_finishes_in_flight_sleep() {
        let mut s = start("g").await;
        let base = format!("http://{}", s.addr);
        let in_flight = tokio::spawn({
            let c = client();
            let url = format!("{base}/sleep?ms=300");
            async move { get(&c, url).await }
        });

        // Wait (with a deadline) until the server has received the /sleep request.
        let stats_client = client();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let (_, _, b) = get(&stats_client, format!("{base}/stats")).await;
            if as_json(&b)["by_path"]["/sleep"] == 1 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "server never saw the /sleep request"
            );
            tokio::task::yield_now().await;
        }
        drop(stats_client);

        s.stop
            .take()
            .expect("stop sender")
            .send(())
            .expect("server alive");
        let (st, h, b) = tokio::time::timeout(Duration::from_secs(10), in_flight)
            .await
            .expect("in-flight request finished")
            .expect("join");
        assert_eq!(st, StatusCode::OK);
        assert_eq!(h[INSTANCE_HEADER], "g");
        assert_eq!(as_json(&b), json!({"slept_ms": 300}));

        tokio::time::timeout(Duration::from_secs(10), &mut s.task)
            .await
            .expect("serve returned after shutdown")
            .expect("join")
            .expect("serve ok");
        // The listener is closed: new connections are refused.
        assert!(tokio::net::TcpStream::connect(s.addr).await.is_err());
    }
}
