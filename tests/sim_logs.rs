//! Access logs as traces (`spillway sim --format spillway|nginx|alb|apigw`): small
//! hand-written logs whose arrivals per second, route keys and durations are known.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use clap::Parser;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use spillway::policy::routes::RouteDef;
use spillway::sim::SimError;
use spillway::sim::cli::{SimArgs, run_sim};
use spillway::sim::logs::{LogFormat, LogOptions, LogSummary, parse};
use spillway::sim::trace::{Arrival, Trace, TraceFormat, TraceOptions};

#[derive(Parser)]
enum Cmd {
    Sim(SimArgs),
}

fn sim_args(args: &[&str]) -> SimArgs {
    match Cmd::try_parse_from(["spillway", "sim"].into_iter().chain(args.iter().copied())) {
        Ok(Cmd::Sim(a)) => a,
        Err(e) => panic!("{e}"),
    }
}

fn root(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(p)
}

fn read(text: &str, format: LogFormat, log: &LogOptions) -> (Trace, LogSummary) {
    parse(
        &[(Path::new("access.log"), text)],
        format,
        &TraceOptions::default(),
        log,
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

fn arrivals(t: &Trace) -> Vec<Arrival> {
    let mut s = t.stream(ChaCha8Rng::seed_from_u64(1));
    std::iter::from_fn(|| s.next_arrival()).collect()
}

/// Arrivals per one-second epoch, from second 0 of the trace clock.
fn per_second(t: &Trace) -> Vec<u32> {
    let mut out = Vec::new();
    for a in arrivals(t) {
        let s = (a.at_ns / 1_000_000_000) as usize;
        if out.len() <= s {
            out.resize(s + 1, 0);
        }
        out[s] += 1;
    }
    out
}

fn class_names(t: &Trace, a: &[Arrival]) -> Vec<String> {
    a.iter()
        .map(|a| {
            t.classes[a.class as usize]
                .name
                .clone()
                .unwrap_or_else(|| "default".into())
        })
        .collect()
}

fn nginx(time: &str, request: &str, status: u16, extra: &str) -> String {
    format!("203.0.113.9 - - [{time}] \"{request}\" {status} 512 \"-\" \"curl/8.5.0\"{extra}\n")
}

#[test]
fn nginx_combined_lines_arrive_spread_within_their_second() {
    // 3 requests stamped second 100, 1 at 101, none at 102, 2 at 103 (+02:00 offset).
    let mut log = String::new();
    for (sec, path) in [
        (40, "/api/thumb/7?size=2"),
        (40, "/api/thumb/8"),
        (40, "/health"),
        (41, "/api/other"),
        (43, "/"),
        (43, "/health"),
    ] {
        log += &nginx(
            &format!("02/Dec/2026:08:01:{sec} +0200"),
            &format!("GET {path} HTTP/1.1"),
            200,
            "",
        );
    }
    // A connection that sent no request line: not a request.
    log += &nginx("02/Dec/2026:08:01:43 +0200", "-", 408, "");
    let (t, s) = read(&log, LogFormat::Nginx, &LogOptions::default());
    assert_eq!(per_second(&t), [3, 1, 0, 2]);
    let a = arrivals(&t);
    let ms: Vec<u64> = a.iter().map(|a| a.at_ns / 1_000_000).collect();
    assert_eq!(ms, [0, 333, 666, 1000, 3000, 3500]);
    // 2026-12-02T06:01:40Z.
    assert_eq!(t.offset_s, 1_796_191_300.0);
    assert_eq!(
        class_names(&t, &a),
        ["api", "api", "health", "api", "/", "health"]
    );
    assert!(a.iter().all(|a| a.service_ns == 0), "no $request_time");
    assert_eq!(
        (s.lines, s.requests, s.ignored_lines, s.bad_lines),
        (7, 6, 1, 0)
    );
}

#[test]
fn nginx_request_time_moves_the_arrival_back_and_is_the_processing_time() {
    let log = [
        nginx(
            "02/Dec/2026:06:00:10 +0000",
            "GET /a HTTP/1.1",
            200,
            " 0.250",
        ),
        // Logged later but arrived first: 3.5 s before its line.
        nginx(
            "02/Dec/2026:06:00:12 +0000",
            "POST /b HTTP/1.1",
            201,
            " rt=3.500",
        ),
        nginx(
            "02/Dec/2026:06:00:12 +0000",
            "GET /a HTTP/1.1",
            200,
            " request_time=0.000",
        ),
    ]
    .concat();
    let (t, s) = read(&log, LogFormat::Nginx, &LogOptions::default());
    let a = arrivals(&t);
    // Arrivals: 08.5 (b), 09.75 (a), 12.5 (a, the second of two lines stamped :12).
    assert_eq!(t.offset_s.rem_euclid(60.0), 8.0);
    let ms: Vec<u64> = a.iter().map(|a| a.at_ns / 1_000_000).collect();
    assert_eq!(ms, [500, 1750, 4500]);
    assert_eq!(class_names(&t, &a), ["b", "a", "a"]);
    // A zero duration stays a duration (1 ns), not "sample from the model".
    let service: Vec<u64> = a.iter().map(|a| a.service_ns).collect();
    assert_eq!(service, [3_500_000_000, 250_000_000, 1]);
    assert_eq!(s.with_duration, 3);
}

fn alb(created: &str, target_s: &str, request: &str) -> String {
    format!(
        "https 2026-12-02T06:00:30.000000Z app/my-alb/50dc6c495c0c9188 192.168.131.39:2817 \
         10.0.0.1:80 0.000 {target_s} 0.000 200 200 34 366 \"{request}\" \"curl/7.46.0\" \
         ECDHE-RSA-AES128-GCM-SHA256 TLSv1.2 \
         arn:aws:elasticloadbalancing:us-east-2:123456789012:targetgroup/my-targets/73e2d6bc24d8a067 \
         \"Root=1-58337262-36d228ad5d99923122bbe354\" \"www.example.com\" \
         \"arn:aws:acm:us-east-2:123456789012:certificate/12345678\" 1 {created} \
         \"forward\" \"-\" \"-\" \"10.0.0.1:80\" \"200\" \"-\" \"-\" TID_1234\n"
    )
}

#[test]
fn alb_logs_arrive_at_request_creation_time_gzip_and_directories_too() {
    let text = [
        alb(
            "2026-12-02T06:00:01.250000Z",
            "0.120",
            "GET https://www.example.com:443/orders/17?x=1 HTTP/1.1",
        ),
        alb(
            "2026-12-02T06:00:00.500000Z",
            "-1",
            "POST https://www.example.com:443/orders HTTP/2.0",
        ),
        alb(
            "2026-12-02T06:00:03.000000Z",
            "0.004",
            "GET https://www.example.com:443/ HTTP/1.1",
        ),
        // A malformed request ALB could not parse.
        alb(
            "2026-12-02T06:00:03.100000Z",
            "-1",
            "- https://www.example.com:443- -",
        ),
    ]
    .concat();
    let dir = tempfile::tempdir().unwrap();
    // One plain and one gzip file in a directory: both read, merged in time order.
    let (first, second) = text.split_at(text.find("\nhttps").unwrap() + 1);
    std::fs::write(dir.path().join("a.log"), first).unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(second.as_bytes()).unwrap();
    std::fs::write(dir.path().join("b.log.gz"), gz.finish().unwrap()).unwrap();
    let (t, s) = spillway::sim::logs::load(
        dir.path(),
        LogFormat::Alb,
        &TraceOptions::default(),
        &LogOptions::default(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(per_second(&t), [1, 1, 0, 1]);
    let a = arrivals(&t);
    let ms: Vec<u64> = a.iter().map(|a| a.at_ns / 1_000_000).collect();
    assert_eq!(ms, [500, 1250, 3000]);
    assert_eq!(class_names(&t, &a), ["orders", "orders", "/"]);
    let service: Vec<u64> = a.iter().map(|a| a.service_ns).collect();
    assert_eq!(service, [0, 120_000_000, 4_000_000], "-1: not dispatched");
    assert_eq!((s.requests, s.ignored_lines, s.with_duration), (3, 1, 2));
    // The same through Trace::load with --format alb.
    let t2 = Trace::load(
        dir.path(),
        &TraceOptions {
            format: TraceFormat::Alb,
            ..TraceOptions::default()
        },
    )
    .unwrap();
    assert_eq!(arrivals(&t2), a);
}

#[test]
fn api_gateway_json_lines_use_the_route_key_and_integration_latency() {
    let log = r#"{"requestId":"a1","ip":"198.51.100.7","requestTime":"02/Dec/2026:06:00:00 +0000","requestTimeEpoch":1796191200250,"httpMethod":"GET","routeKey":"GET /items/{id}","status":"200","protocol":"HTTP/1.1","responseLength":"12","integrationLatency":"42"}
{"requestId":"a2","requestTimeEpoch":"1796191201900","httpMethod":"POST","routeKey":"POST /items","status":"201","integrationLatency":"-","responseLatency":"310"}
2026-12-02T06:00:02.000Z abcd/stream {"requestId":"a3","requestTime":"02/Dec/2026:06:00:02 +0000","httpMethod":"GET","resourcePath":"/items/{id}","status":"200"}
{"requestId":"a4","requestTime":"02/Dec/2026:06:00:02 +0000","httpMethod":"DELETE","routeKey":"$default","path":"/admin/cache","status":"204","integrationLatency":7}
"#;
    let (t, s) = read(log, LogFormat::Apigw, &LogOptions::default());
    assert_eq!(per_second(&t), [1, 1, 2]);
    let a = arrivals(&t);
    let ms: Vec<u64> = a.iter().map(|a| a.at_ns / 1_000_000).collect();
    assert_eq!(ms, [250, 1900, 2000, 2500]);
    assert_eq!(
        class_names(&t, &a),
        ["GET /items/{id}", "POST /items", "GET /items/{id}", "admin"]
    );
    let service: Vec<u64> = a.iter().map(|a| a.service_ns).collect();
    assert_eq!(service, [42_000_000, 310_000_000, 0, 7_000_000]);
    assert_eq!(s.route_keys, ["GET /items/{id}", "POST /items", "admin"]);
}

#[test]
fn spillway_text_and_json_access_lines_arrive_total_ms_before_their_line() {
    let log = "\
2026-12-02T06:00:00.100000Z  INFO spillway: listening addr=127.0.0.1:8080
2026-12-02T06:00:01.520800Z  INFO spillway::access: request client=127.0.0.1:50412 method=GET path=/thumb/7 version=HTTP/1.1 status=200 tier=vm zone=- instance=vm-1 headers_ms=20.6 total_ms=20.8 bytes_in=0 bytes_out=12 complete=true
\u{1b}[2m2026-12-02T06:00:03.000000Z\u{1b}[0m \u{1b}[32m INFO\u{1b}[0m \u{1b}[2mspillway::access\u{1b}[0m\u{1b}[2m:\u{1b}[0m request client=127.0.0.1:50413 method=POST path=/upload version=HTTP/1.1 status=200 tier=function zone=cloud instance=fn-3 headers_ms=1500.0 total_ms=1500.0 bytes_in=10 bytes_out=2 complete=true
{\"timestamp\":\"2026-12-02T06:00:02.250000Z\",\"level\":\"INFO\",\"message\":\"request\",\"client\":\"127.0.0.1:50414\",\"method\":\"GET\",\"path\":\"/thumb/9\",\"version\":\"HTTP/1.1\",\"status\":200,\"tier\":\"vm\",\"zone\":\"-\",\"instance\":\"vm-2\",\"headers_ms\":200.0,\"total_ms\":250.0,\"bytes_in\":\"-\",\"bytes_out\":5,\"complete\":true,\"target\":\"spillway::access\"}
{\"timestamp\":\"2026-12-02T06:00:02.300000Z\",\"level\":\"INFO\",\"message\":\"scaling decision\",\"target\":\"spillway::driver\"}
";
    let routes = LogOptions {
        routes: vec![RouteDef {
            name: "uploads".into(),
            path_prefix: "/upload".into(),
            methods: vec!["POST".into()],
        }],
        ..LogOptions::default()
    };
    let (t, s) = read(log, LogFormat::Spillway, &routes);
    let a = arrivals(&t);
    let us: Vec<u64> = a.iter().map(|a| a.at_ns / 1_000).collect();
    // 1.5208 − 0.0208, 3.0 − 1.5, 2.25 − 0.25 s; the clock starts at second 1.
    assert_eq!(us, [500_000, 500_000, 1_000_000]);
    assert_eq!(class_names(&t, &a), ["thumb", "uploads", "thumb"]);
    let service: Vec<u64> = a.iter().map(|a| a.service_ns / 100_000).collect();
    assert_eq!(service, [208, 15_000, 2_500]);
    assert_eq!((s.requests, s.ignored_lines), (3, 2));
}

#[test]
fn a_bad_line_names_file_and_line_or_is_skipped_and_counted() {
    let log = [
        nginx("02/Dec/2026:06:00:10 +0000", "GET /a HTTP/1.1", 200, ""),
        "this is not nginx\n".to_string(),
        nginx("32/Dec/2026:06:00:11 +0000", "GET /a HTTP/1.1", 200, ""),
        nginx("02/Dec/2026:06:00:11 +0000", "GET /a HTTP/1.1", 200, ""),
    ]
    .concat();
    let err = parse(
        &[(Path::new("access.log"), &log)],
        LogFormat::Nginx,
        &TraceOptions::default(),
        &LogOptions::default(),
    )
    .unwrap_err();
    assert!(matches!(err, SimError::Parse { line: 2, .. }), "{err:?}");
    assert!(
        err.to_string()
            .starts_with("access.log:2: expected nginx `combined`"),
        "{err}"
    );
    let (t, s) = read(
        &log,
        LogFormat::Nginx,
        &LogOptions {
            skip_bad_lines: true,
            ..LogOptions::default()
        },
    );
    assert_eq!(per_second(&t), [1, 1]);
    assert_eq!((s.requests, s.bad_lines), (2, 2));
    assert!(
        s.first_bad_line
            .as_deref()
            .is_some_and(|l| l.starts_with("access.log:2: ")),
        "{s:?}"
    );

    // Through `spillway sim`: the error, then the count in the JSON report.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("access.log");
    std::fs::write(&file, &log).unwrap();
    let f = file.to_str().unwrap();
    let err = run_sim(&sim_args(&["--format", "nginx", "--trace", f, "--quiet"])).unwrap_err();
    assert!(err.to_string().starts_with(&format!("{f}:2: ")), "{err}");
    let json = dir.path().join("r.json");
    run_sim(&sim_args(&[
        "--format",
        "nginx",
        "--trace",
        f,
        "--skip-bad-lines",
        "--policy",
        "faas",
        "--json",
        json.to_str().unwrap(),
        "--quiet",
    ]))
    .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(v["log"]["bad_lines"], 2);
    assert_eq!(v["log"]["requests"], 2);
    assert_eq!(v["policies"][0]["requests"], 2);
    // --skip-bad-lines on a non-log format is refused.
    let counts = dir.path().join("c.txt");
    std::fs::write(&counts, "1\n").unwrap();
    let err = run_sim(&sim_args(&[
        "--trace",
        counts.to_str().unwrap(),
        "--skip-bad-lines",
    ]))
    .unwrap_err();
    assert!(err.to_string().starts_with("--skip-bad-lines: "), "{err}");
}

#[test]
fn logged_durations_are_what_the_function_tier_bills() {
    // Three requests of 250 ms, 0.5 s and 2.25 s on functions only (512 MB, no INIT
    // billing in the paper preset): 0.5 GB × 3 s = 1.5 GB-s.
    let log = [
        nginx(
            "02/Dec/2026:06:00:10 +0000",
            "GET /a HTTP/1.1",
            200,
            " 0.250",
        ),
        nginx(
            "02/Dec/2026:06:00:11 +0000",
            "GET /b HTTP/1.1",
            200,
            " 0.500",
        ),
        nginx(
            "02/Dec/2026:06:00:14 +0000",
            "GET /a HTTP/1.1",
            200,
            " 2.250",
        ),
    ]
    .concat();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("access.log");
    std::fs::write(&file, &log).unwrap();
    let json = dir.path().join("r.json");
    let cfg = root("config/sim/libra-paper.yaml");
    run_sim(&sim_args(&[
        "--config",
        cfg.to_str().unwrap(),
        "--format",
        "nginx",
        "--trace",
        file.to_str().unwrap(),
        "--policy",
        "faas",
        "--json",
        json.to_str().unwrap(),
        "--quiet",
    ]))
    .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let p = &v["policies"][0];
    assert_eq!(p["requests"], 3);
    let gbs = p["function_gb_seconds"].as_f64().unwrap();
    assert!((gbs - 1.5).abs() < 1e-9, "{gbs}");
    // The 2.25 s call breaks the 1 s SLA.
    assert_eq!(p["sla_violations"], 1);
    assert_eq!(v["log"]["route_keys"], serde_json::json!(["a", "b"]));
}

/// A stray timestamp or duration is a bad line at its place, never a request moved to
/// the trace's time 0 or a wrapped clock: API Gateway milliseconds past the year 9999,
/// durations above a year, and a request more than 2^64 ns (~584 years) after the first.
#[test]
fn out_of_range_times_and_durations_are_bad_lines_at_their_place() {
    let apigw = |ms: &str, latency: &str| {
        format!(
            "{{\"requestTimeEpoch\": {ms}, \"routeKey\": \"GET /x\", \"integrationLatency\": {latency}}}\n"
        )
    };
    let fails = |text: &str, format: LogFormat| {
        parse(
            &[(Path::new("access.log"), text)],
            format,
            &TraceOptions::default(),
            &LogOptions::default(),
        )
        .unwrap_err()
        .to_string()
    };
    // Past the calendar: refused at the line, both as an integer and as a float.
    for ms in ["18446744073709551615", "1e30", "253402300800000"] {
        let log = [apigw("1700000000000", "5"), apigw(ms, "5")].concat();
        let err = fails(&log, LogFormat::Apigw);
        assert!(
            err.starts_with("access.log:2: requestTimeEpoch: expected Unix milliseconds"),
            "{ms}: {err}"
        );
    }
    // The last millisecond of 9999 still reads, but spans more than 2^64 ns from 2023:
    // a bad line at its own place (line 1 is the later one: logs need not be in order).
    let log = [apigw("253402300799999", "5"), apigw("1700000000000", "5")].concat();
    let err = fails(&log, LogFormat::Apigw);
    assert!(
        err.starts_with("access.log:1: arrives ") && err.contains("584 years"),
        "{err}"
    );
    let (t, s) = read(
        &log,
        LogFormat::Apigw,
        &LogOptions {
            skip_bad_lines: true,
            ..LogOptions::default()
        },
    );
    assert_eq!(arrivals(&t).len(), 1);
    assert_eq!((s.requests, s.with_duration, s.bad_lines), (1, 1, 1));
    assert!(t.duration_s < 1.0, "{}", t.duration_s);
    // 2^33 s apart is a long trace, not an error.
    let log = [apigw("1000", "5"), apigw("8589934593000", "5")].concat();
    let (t, _) = read(&log, LogFormat::Apigw, &LogOptions::default());
    assert_eq!(t.duration_s, 8_589_934_592.0);
    // Durations above a year, in each format's unit.
    let err = fails(&apigw("1700000000000", "1e300"), LogFormat::Apigw);
    assert!(
        err.starts_with("access.log:1: integrationLatency: expected a duration from 0 to"),
        "{err}"
    );
    let line = nginx(
        "02/Dec/2026:06:00:10 +0000",
        "GET /a HTTP/1.1",
        200,
        " 1e300",
    );
    let err = fails(&line, LogFormat::Nginx);
    assert!(
        err.starts_with("access.log:1: $request_time: expected a duration from 0 to 31536000 s"),
        "{err}"
    );
    let line = nginx(
        "02/Dec/2026:06:00:10 +0000",
        "GET /a HTTP/1.1",
        200,
        " 31536000",
    );
    let (t, _) = read(&line, LogFormat::Nginx, &LogOptions::default());
    assert_eq!(arrivals(&t)[0].service_ns, 31_536_000 * 1_000_000_000);
    let json = "{\"timestamp\":\"2026-12-02T06:00:10Z\",\"target\":\"spillway::access\",\
                \"method\":\"GET\",\"path\":\"/a\",\"total_ms\":1e13}\n";
    let err = fails(json, LogFormat::Spillway);
    assert!(
        err.starts_with("access.log:1: access log line without a number total_ms"),
        "{err}"
    );
    // A request whose duration reaches back before 1970 names its line.
    let log = [
        nginx("01/Jan/1970:00:00:09 +0000", "GET /a HTTP/1.1", 200, " 1"),
        nginx("01/Jan/1970:00:00:01 +0000", "GET /a HTTP/1.1", 200, " 5"),
    ]
    .concat();
    let err = fails(&log, LogFormat::Nginx);
    assert!(
        err.starts_with("access.log:2: the request arrives before 1970-01-01"),
        "{err}"
    );
}
