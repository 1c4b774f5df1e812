//! End-to-end test of `spillway-loadtest --profile-rmax` against a stub VM of known
//! capacity on `127.0.0.1:0`: `SLOTS` requests served in parallel, each for `SERVICE`, so
//! it serves `SLOTS / SERVICE` requests/s; above that its queue grows and latency with it.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::process::Output;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

const SLOTS: usize = 4;
const SERVICE: Duration = Duration::from_millis(20);

async fn handle(
    _req: Request<Incoming>,
    slots: Arc<Semaphore>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let _slot = slots.acquire().await.unwrap();
    tokio::time::sleep(SERVICE).await;
    Ok(Response::new(Full::new(Bytes::from_static(b"ok"))))
}

/// A VM with `SLOTS` parallel slots and a FIFO queue in front of them.
async fn start_vm() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let slots = Arc::new(Semaphore::new(SLOTS));
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let slots = slots.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req| handle(req, slots.clone()));
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

async fn run(args: &[&str]) -> Output {
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_spillway-loadtest"))
        .args(args)
        .kill_on_drop(true)
        .output();
    tokio::time::timeout(Duration::from_secs(90), child)
        .await
        .expect("spillway-loadtest finished within 90 s")
        .unwrap()
}

/// The cells of every markdown table row (header and rule excluded).
fn rows(stdout: &str) -> Vec<Vec<String>> {
    stdout
        .lines()
        .filter(|l| l.starts_with('|') && !l.contains("---") && !l.contains("rate (req/s)"))
        .map(|l| {
            l.trim_matches('|')
                .split('|')
                .map(|c| c.trim().to_owned())
                .collect()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn finds_the_rate_where_the_queue_starts_and_prints_the_yaml_line() {
    let vm = start_vm().await;
    let url = format!("http://{vm}/");
    let out = run(&[
        "--profile-rmax",
        "--url",
        &url,
        "--sla-ms",
        "100",
        "--start-rps",
        "50",
        "--step-seconds",
        "1",
        "--warmup-seconds",
        "0.3",
        "--cooldown-seconds",
        "0.2",
        "--min-samples",
        "0",
        "--precision",
        "0.1",
        "--max-seconds",
        "60",
    ])
    .await;
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let rows = rows(&stdout);
    // Exponential phase from 50 req/s, doubling until the first failure (4 slots ×
    // 20 ms serve at most 200 req/s, so 400 at the latest), then bisection.
    let up: Vec<&Vec<String>> = rows.iter().take_while(|r| r[1] == "up").collect();
    let failed = up.len() - 1;
    assert!((1..=3).contains(&failed), "{stdout}");
    for (i, r) in up.iter().enumerate() {
        assert_eq!(r[2], format!("{}", 50 << i), "{stdout}");
        assert_eq!(r[9], if i < failed { "pass" } else { "fail" }, "{stdout}");
    }
    assert!(
        rows[up.len()..].iter().all(|r| r[1] == "bisect"),
        "{stdout}"
    );
    // At 50 req/s nothing queues: p50 is the service time (plus loopback overhead).
    let p50: f64 = rows[0][5].parse().unwrap();
    assert!((20.0..40.0).contains(&p50), "{stdout}");
    // r_max: the highest passing rate, close to SLOTS / SERVICE = 200 req/s (a 1 s step
    // lets the queue of a slightly faster rate stay under the 80 ms of slack).
    let highest_pass = rows
        .iter()
        .filter(|r| r[9] == "pass")
        .map(|r| r[2].parse::<f64>().unwrap())
        .fold(0.0, f64::max);
    let capacity = SLOTS as f64 / SERVICE.as_secs_f64();
    assert!(
        (0.7 * capacity..=1.2 * capacity).contains(&highest_pass),
        "{highest_pass} vs {capacity}: {stdout}"
    );
    let highest_pass = (highest_pass * 100.0 + 1e-9).floor() / 100.0;
    let shown = format!("r_max = {highest_pass} req/s");
    assert!(stdout.contains(&shown), "{shown} in {stdout}");
    let yaml = format!("  r_max_rps: {highest_pass}   # p99 <= 100 ms");
    assert!(stdout.contains(&yaml), "{yaml} in {stdout}");
}

#[tokio::test]
async fn remote_targets_need_allow_remote_and_profile_flags_need_the_mode() {
    let out = run(&[
        "--profile-rmax",
        "--url",
        "http://10.1.2.3/",
        "--sla-ms",
        "50",
    ])
    .await;
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("not a loopback address") && stderr.contains("--allow-remote"),
        "{stderr}"
    );
    // --allow-remote belongs to the profile mode, and the mode needs --sla-ms.
    for args in [
        &[
            "--trace",
            "t.txt",
            "--url",
            "http://127.0.0.1:9/",
            "--allow-remote",
        ][..],
        &["--profile-rmax", "--url", "http://127.0.0.1:9/"][..],
        &[
            "--trace",
            "t.txt",
            "--url",
            "http://127.0.0.1:9/",
            "--sla-ms",
            "5",
        ][..],
    ] {
        let out = run(args).await;
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[tokio::test]
async fn no_rate_within_the_sla_exits_1() {
    let vm = start_vm().await;
    let url = format!("http://{vm}/");
    // 20 ms of service can never meet 5 ms.
    let out = run(&[
        "--profile-rmax",
        "--url",
        &url,
        "--sla-ms",
        "5",
        "--start-rps",
        "20",
        "--min-rps",
        "5",
        "--step-seconds",
        "0.5",
        "--warmup-seconds",
        "0",
        "--cooldown-seconds",
        "0",
        "--min-samples",
        "0",
    ])
    .await;
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    let rates: Vec<String> = rows(&stdout).into_iter().map(|r| r[2].clone()).collect();
    assert_eq!(
        rates,
        ["20", "10", "5"],
        "halving down to --min-rps: {stdout}"
    );
    assert!(
        stdout.contains("no rate down to 5 req/s kept p99 within 5 ms"),
        "{stdout}"
    );
    assert!(stderr.contains("no rate met the SLA"), "{stderr}");
}
