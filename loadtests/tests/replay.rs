//! End-to-end test of the `spillway-loadtest` binary against a stub gateway.
//!
//! The stub is a tiny hyper server on `127.0.0.1:0` that counts the load
//! requests it receives and answers `GET /status` with the admin JSON shape;
//! each `/status` call advances its cumulative `routed` counters by 3 VM and 1
//! function attempt, so every interval's share is exactly 75% / 25%.

use std::convert::Infallible;
use std::io::Write;
use std::net::SocketAddr;
use std::process::Output;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// Counters kept by the stub gateway.
#[derive(Default)]
struct Stub {
    /// Load requests received (anything but `/status`).
    load: AtomicU64,
    /// `/status` requests received.
    status: AtomicU64,
}

/// Answer one request of the stub gateway.
async fn handle(
    req: Request<Incoming>,
    stub: Arc<Stub>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    if req.uri().path() == "/status" {
        let n = stub.status.fetch_add(1, Ordering::SeqCst) + 1;
        let body = serde_json::json!({
            "epoch": n,
            "traffic": {"last_epoch_requests": 17, "avg_rps": 3.4, "mean_abs_deviation_rps": 1.0},
            "scaling": {"vm_reqs_rps": 2.5, "target_vms": 2, "ready_vms": 2},
            "routed": {"vm": 3 * n, "function": n},
        });
        return Ok(Response::new(Full::new(Bytes::from(body.to_string()))));
    }
    stub.load.fetch_add(1, Ordering::SeqCst);
    Ok(Response::new(Full::new(Bytes::from_static(b"ok"))))
}

/// Start the stub on an ephemeral loopback port.
async fn start_stub() -> (SocketAddr, Arc<Stub>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stub = Arc::new(Stub::default());
    let shared = stub.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let stub = shared.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req| handle(req, stub.clone()));
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, stub)
}

/// Write `text` to a fresh temporary file.
fn temp_file(text: &str) -> tempfile::NamedTempFile {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    file.write_all(text.as_bytes()).unwrap();
    file
}

/// Run the binary with `args`, failing the test if it takes over a minute.
async fn run(args: &[&str]) -> Output {
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_spillway-loadtest"))
        .args(args)
        .kill_on_drop(true)
        .output();
    tokio::time::timeout(Duration::from_secs(60), child)
        .await
        .expect("spillway-loadtest finished within 60 s")
        .unwrap()
}

/// The trimmed cells of the markdown row whose first cell is `first`.
fn row<'a>(stdout: &'a str, first: &str) -> Vec<&'a str> {
    stdout
        .lines()
        .map(|l| {
            l.trim()
                .trim_matches('|')
                .split('|')
                .map(str::trim)
                .collect::<Vec<_>>()
        })
        .find(|cells| cells[0] == first)
        .unwrap_or_else(|| panic!("no {first} row in:\n{stdout}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replays_trace_open_loop_against_stub() {
    let (addr, stub) = start_stub().await;
    let trace = temp_file("3\n0\n7 \n2\n5"); // trailing space, no final newline
    let json = tempfile::NamedTempFile::new().unwrap();
    let url = format!("http://{addr}/sleep?ms=1");
    let admin = format!("http://{addr}");
    let out = run(&[
        "--trace",
        trace.path().to_str().unwrap(),
        "--url",
        &url,
        "--admin",
        &admin,
        "--time-compression",
        "10",
        "--interval-seconds",
        "2",
        "--json",
        json.path().to_str().unwrap(),
    ])
    .await;
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        out.status.success(),
        "exit {:?}\n{stdout}\n{stderr}",
        out.status
    );

    assert_eq!(stub.load.load(Ordering::SeqCst), 17, "{stdout}");
    // One snapshot before the run and one per interval.
    assert_eq!(stub.status.load(Ordering::SeqCst), 4, "{stdout}");

    let total = row(&stdout, "TOTAL");
    assert_eq!((total[1], total[2], total[3]), ("17", "0", "-"), "{stdout}");
    assert_eq!(&total[7..], ["75.0%", "25.0%", "2"], "{stdout}");
    for (interval, requests) in [("0-2", "3"), ("2-4", "9"), ("4-5", "5")] {
        let cells = row(&stdout, interval);
        assert_eq!((cells[1], cells[2]), (requests, "0"), "{stdout}");
        assert_eq!(&cells[7..], ["75.0%", "25.0%", "2"], "{stdout}");
        assert_ne!(cells[4], "-", "latency measured: {stdout}");
    }

    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(json.path()).unwrap()).unwrap();
    assert_eq!(doc["intervals"].as_array().unwrap().len(), 3);
    assert_eq!(doc["total"]["requests"], 17);
    assert_eq!(doc["total"]["errors"], 0);
    assert_eq!(doc["total"]["vm_share"], 0.75);
}

#[tokio::test]
async fn slices_and_scales_without_admin() {
    let (addr, stub) = start_stub().await;
    let trace = temp_file("3\n0\n7\n2\n5\n");
    let url = format!("http://{addr}/");
    // Seconds 2..4 = [7, 2], halved with carry: 3 then round(4.5) - 3 = 2.
    let out = run(&[
        "--trace",
        trace.path().to_str().unwrap(),
        "--url",
        &url,
        "--from",
        "2",
        "--to",
        "4",
        "--rate-divisor",
        "2",
        "--time-compression",
        "20",
        "--format",
        "plain",
    ])
    .await;
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success(), "{stdout}");
    assert_eq!(stub.load.load(Ordering::SeqCst), 5);
    let total = stdout.lines().find(|l| l.starts_with("TOTAL")).unwrap();
    let cells: Vec<&str> = total.split_whitespace().collect();
    assert_eq!(&cells[..3], ["TOTAL", "5", "0"], "{stdout}");
    assert!(cells.ends_with(&["-", "-", "-"]), "{stdout}");
}

#[tokio::test]
async fn counts_connect_errors_and_exits_zero() {
    // Bind then drop a listener to get a loopback port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let trace = temp_file("2\n1\n");
    let url = format!("http://127.0.0.1:{port}/");
    let out = run(&[
        "--trace",
        trace.path().to_str().unwrap(),
        "--url",
        &url,
        "--time-compression",
        "20",
    ])
    .await;
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success(), "{stdout}");
    let total = row(&stdout, "TOTAL");
    assert_eq!(
        (total[1], total[2], total[3]),
        ("3", "3", "connect 3"),
        "{stdout}"
    );
}

#[tokio::test]
async fn bad_input_exits_non_zero_with_a_clear_error() {
    let bad = temp_file("1\n2\nthree\n");
    let good = temp_file("1\n");
    let path = bad.path().to_str().unwrap();
    let out = run(&["--trace", path, "--url", "http://127.0.0.1:9/"]).await;
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(!out.status.success());
    assert!(
        stderr.contains(&format!("{path}:3:")) && stderr.contains("\"three\""),
        "{stderr}"
    );

    let out = run(&[
        "--trace",
        good.path().to_str().unwrap(),
        "--url",
        "http://example.com/",
    ])
    .await;
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(!out.status.success());
    assert!(stderr.contains("not a loopback address"), "{stderr}");
}
