//! The Grafana dashboard and the Prometheus rules in deploy/observability/ use only
//! metrics the real gateway exports: every `spillway_*` name they mention is in
//! `/metrics` right after startup (histogram series once the histogram has a value), and
//! every label value they select on (`tier="function"`, `state="ready"`, `le="1"`, each
//! word of `tier=~"vm|function"`) is one the gateway produces. Real binary and sample-API
//! processes on 127.0.0.1 (docs/src/guide/observability.md).

// Real processes on loopback: deadlines are wall-clock time.
#![allow(clippy::disallowed_methods)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::*;

const DASHBOARD: &str = include_str!("../deploy/observability/dashboard.json");
const RULES: &str = include_str!("../deploy/observability/spillway-rules.yaml");
const TELEMETRY: &str = include_str!("../src/telemetry.rs");

/// Names the files may use although a quickstart gateway does not export them, and why.
const EXEMPT: &[(&str, &str)] = &[
    (
        "spillway_provider_errors_total",
        "EC2 and Lambda gateways only (tests/aws_ec2.rs and tests/aws_lambda.rs check its series)",
    ),
    (
        "spillway_coordination_role",
        "coordinated replicas only (tests/replicas.rs checks its series)",
    ),
    (
        "spillway_coordination_term",
        "coordinated replicas only (tests/replicas.rs checks its series)",
    ),
    (
        "spillway_coordination_replicas",
        "coordinated replicas only (tests/replicas.rs checks its series)",
    ),
    (
        "spillway_coordination_store_errors_total",
        "coordinated replicas only (tests/replicas.rs checks its series)",
    ),
];

/// A histogram label whose values a counter shows from startup: (histogram family,
/// label, counter). `telemetry::request` records `spillway_request_duration_seconds` and
/// counts `spillway_requests_total` with the same `tier`, but the histogram has a tier's
/// series only once a request went there.
const SAME_LABELS: &[(&str, &str, &str)] = &[(
    "spillway_request_duration_seconds",
    "tier",
    "spillway_requests_total",
)];

/// Labels Prometheus adds to every scraped series (and dashboard variables).
const TARGET_LABELS: &[&str] = &["job", "instance"];

/// One `name{matchers}` mention: (label, op, value) per matcher.
#[derive(Debug)]
struct Mention {
    name: String,
    matchers: Vec<(String, String, String)>,
    file: &'static str,
}

/// Every `spillway_*` identifier in `text`, with the matchers of a `{...}` right after it.
fn mentions(text: &str, file: &'static str) -> Vec<Mention> {
    let bytes = text.as_bytes();
    let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b == b':';
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(off) = text[i..].find("spillway_") {
        let start = i + off;
        let mut end = start;
        while end < bytes.len() && ident(bytes[end]) {
            end += 1;
        }
        i = end;
        if start > 0 && ident(bytes[start - 1]) {
            continue;
        }
        let name = text[start..end].to_string();
        let mut matchers = Vec::new();
        if bytes.get(end) == Some(&b'{') {
            let close = text[end..].find('}').expect("a closing brace") + end;
            matchers = parse_matchers(&text[end + 1..close]);
            i = close;
        }
        out.push(Mention {
            name,
            matchers,
            file,
        });
    }
    out
}

/// `a="x",b=~"y|z"` → [(a, =, x), (b, =~, y|z)]. JSON-escaped quotes (`\"`) count as quotes.
fn parse_matchers(s: &str) -> Vec<(String, String, String)> {
    let s = s.replace("\\\"", "\"");
    let mut out = Vec::new();
    let mut rest = s.trim();
    while !rest.is_empty() {
        let op_at = rest.find(['=', '!']).expect("a matcher operator");
        let label = rest[..op_at].trim().to_string();
        let after = &rest[op_at..];
        let op_len = ["=~", "!~", "!=", "="]
            .iter()
            .find(|op| after.starts_with(**op))
            .expect("a matcher operator")
            .len();
        let op = after[..op_len].to_string();
        let v = after[op_len..].trim_start();
        assert!(v.starts_with('"'), "quoted matcher value in {{{s}}}");
        let close = v[1..].find('"').expect("closing quote") + 1;
        out.push((label, op, v[1..close].to_string()));
        rest = v[close + 1..]
            .trim_start()
            .trim_start_matches(',')
            .trim_start();
    }
    out
}

/// A scrape: every series name with the label sets it has, and the `# TYPE` families.
struct Scrape {
    series: BTreeMap<String, Vec<BTreeMap<String, String>>>,
    types: BTreeMap<String, String>,
}

fn scrape(gw: &Gateway) -> Scrape {
    let (code, _, body) = http(gw.admin, "GET", "/metrics", &[], b"");
    assert_eq!(code, 200);
    let text = String::from_utf8(body).unwrap();
    let mut s = Scrape {
        series: BTreeMap::new(),
        types: BTreeMap::new(),
    };
    for line in text.lines() {
        if let Some(t) = line.strip_prefix("# TYPE ") {
            let mut it = t.split(' ');
            let (name, kind) = (it.next().unwrap(), it.next().unwrap_or(""));
            s.types.insert(name.to_string(), kind.to_string());
            continue;
        }
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        let name = line[..name_end].to_string();
        let labels = if line[name_end..].starts_with('{') {
            let close = line.rfind('}').unwrap();
            parse_matchers(&line[name_end + 1..close])
                .into_iter()
                .map(|(k, _, v)| (k, v))
                .collect()
        } else {
            BTreeMap::new()
        };
        s.series.entry(name).or_default().push(labels);
    }
    s
}

/// The histogram family of a `_bucket`/`_sum`/`_count` series name, when it is one.
fn histogram_family<'a>(name: &'a str, s: &Scrape) -> Option<&'a str> {
    ["_bucket", "_sum", "_count"]
        .iter()
        .find_map(|suffix| name.strip_suffix(suffix))
        .or(Some(name))
        .filter(|family| s.types.get(*family).is_some_and(|t| t == "histogram"))
}

/// Decisions every 0.5 s, one VM from the start (its boot fills the boot-time histogram).
/// A gateway with every feature the dashboard and rules chart, asynchronous calls
/// included (off unless a route enables them).
fn config() -> String {
    process_config(
        "  epoch_seconds: 0.1\n  decision_epochs: 5\n  r_max_rps: 20\n  min_vms: 1\n  max_vms: 2\n  cip_rps: 3.5",
        "",
    ) + "routes:\n  - {name: api, path_prefix: /, async: prefer}\n"
}

#[test]
fn dashboard_and_rules_use_only_metrics_the_gateway_exports() {
    let dashboard: serde_json::Value = serde_json::from_str(DASHBOARD).expect("dashboard JSON");
    let exprs: Vec<String> = dashboard["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .map(|t| {
            t["expr"]
                .as_str()
                .expect("every target has an expr")
                .to_string()
        })
        .collect();
    assert!(exprs.len() >= 10, "{exprs:?}");
    let mut all = mentions(DASHBOARD, "dashboard.json");
    all.extend(mentions(RULES, "spillway-rules.yaml"));
    let used: BTreeSet<&str> = all.iter().map(|m| m.name.as_str()).collect();
    for (name, why) in EXEMPT {
        assert!(
            used.contains(name),
            "{name} is exempt ({why}) but no longer used: drop it from EXEMPT"
        );
    }

    // Right after startup: every counter and gauge.
    let gw = Gateway::start(&config());
    let first = scrape(&gw);
    // Then one request through the proxy and a ready VM: the histograms have values.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if http(gw.proxy, "GET", "/", &[], b"").0 == 200
            && scrape(&gw)
                .series
                .contains_key("spillway_vm_boot_seconds_bucket")
        {
            break;
        }
        assert!(Instant::now() < deadline, "{}", gw.proc.log_text());
        std::thread::sleep(Duration::from_millis(50));
    }
    let later = scrape(&gw);

    let none = Vec::new();
    let mut missing = Vec::new();
    for m in &all {
        let exempt = EXEMPT.iter().any(|(n, _)| *n == m.name);
        let (scrape, when) = match histogram_family(&m.name, &later) {
            Some(_) => (&later, "after the first request"),
            None => (&first, "right after startup"),
        };
        let Some(series) = scrape
            .series
            .get(&m.name)
            .or_else(|| scrape.types.contains_key(&m.name).then_some(&none))
        else {
            if !exempt {
                missing.push(format!("{}: {} is not in /metrics {when}", m.file, m.name));
            }
            continue;
        };
        for (label, op, value) in &m.matchers {
            if TARGET_LABELS.contains(&label.as_str()) || value.starts_with('$') {
                continue;
            }
            let wanted: Vec<&str> = match op.as_str() {
                "=" => vec![value.as_str()],
                // A plain alternation of words: each must exist.
                "=~" if value
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_|".contains(c)) =>
                {
                    value.split('|').collect()
                }
                _ => vec![],
            };
            if !series.iter().any(|l| l.contains_key(label)) {
                missing.push(format!("{}: {} has no label {label}", m.file, m.name));
            }
            let family = histogram_family(&m.name, &later).unwrap_or(&m.name);
            let counter = SAME_LABELS
                .iter()
                .find(|(f, l, _)| *f == family && l == label)
                .map(|(_, _, c)| &first.series[*c]);
            for v in wanted {
                let has = |series: &Vec<BTreeMap<String, String>>| {
                    series
                        .iter()
                        .any(|l| l.get(label).map(String::as_str) == Some(v))
                };
                if !has(series) && !counter.is_some_and(has) {
                    missing.push(format!(
                        "{}: {}{{{label}=\"{v}\"}} is not in /metrics {when}",
                        m.file, m.name
                    ));
                }
            }
        }
    }
    assert!(
        missing.is_empty(),
        "names or label values that the gateway does not export:\n{}",
        missing.join("\n")
    );

    // The CIP gauge the alert compares the load with is the configured one (3.5 req/s).
    let cip = &first.series["spillway_cip_rps"];
    assert_eq!(cip.len(), 1);
    let (_, _, body) = http(gw.admin, "GET", "/metrics", &[], b"");
    let text = String::from_utf8(body).unwrap();
    let value: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("spillway_cip_rps "))
        .expect("spillway_cip_rps")
        .trim()
        .parse()
        .unwrap();
    let configured = gw.status()["scaling"]["cip_rps"].as_f64().unwrap();
    assert_eq!(value, configured);
    assert!(value > 3.0 && value < 4.0, "{value}");

    // Every name used is documented in the metrics spec (src/telemetry.rs), or exempt.
    for name in &used {
        let documented = TELEMETRY.contains(&format!("`{name}`"))
            || ["_bucket", "_sum", "_count"]
                .iter()
                .filter_map(|s| name.strip_suffix(s))
                .any(|family| TELEMETRY.contains(&format!("`{family}`")));
        let exempt = EXEMPT.iter().any(|(n, _)| n == name);
        assert!(
            documented || exempt,
            "{name} is not in the src/telemetry.rs table"
        );
    }
}

#[test]
fn mentions_read_names_and_matchers() {
    let m = mentions(
        r#"rate(spillway_requests_total{tier="function",status=~"5xx|4xx"}[5m]) spillway:x_y spillway-rules spillway_vms"#,
        "t",
    );
    let names: Vec<&str> = m.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names, ["spillway_requests_total", "spillway_vms"]);
    assert_eq!(
        m[0].matchers,
        [
            ("tier".into(), "=".into(), "function".into()),
            ("status".into(), "=~".into(), "5xx|4xx".into())
        ]
    );
    // JSON-escaped quotes, as in dashboard.json.
    let m = mentions(
        r#"spillway_vms{instance=~\"$instance\",state=\"ready\"}"#,
        "t",
    );
    assert_eq!(
        m[0].matchers[1],
        ("state".into(), "=".into(), "ready".into())
    );
}

/// The value of the `/metrics` line starting with `series` (name and labels as printed).
fn metric_value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .map(|l| l[series.len() + 1..].trim().parse().expect("a number"))
}

/// The live bill of a real gateway, with asymmetric prices: one `process` VM at
/// $0.36/h billed per 1 s with a 60 s minimum, and 2048 MB function calls at
/// $0.00002/GB-s and $0.000001 a call (`cloud`, the only zone). Seven requests: every
/// priced line is consistent with its quantities, the function calls are billed at 1 ms
/// granularity, the counterfactuals see the same arrivals, and `/metrics` carries the
/// same dollars as `/status`.
#[test]
fn the_live_bill_prices_the_running_vm_and_every_call() {
    let yaml = process_config(
        "  epoch_seconds: 0.1\n  decision_epochs: 5\n  r_max_rps: 20\n  min_vms: 1\n  max_vms: 1",
        "",
    ) + "pricing:\n  vm_hourly_usd: 0.36\n  function_memory_mb: 2048\n  gb_second_usd: 0.00002\n  request_usd: 0.000001\n";
    let gw = Gateway::start(&yaml);
    for _ in 0..7 {
        assert_eq!(http(gw.proxy, "GET", "/", &[], b"").0, 200);
    }
    // A call is billed when its response body ends, just after the client has it.
    let s = gw.wait_status("the bill of 7 calls", Duration::from_secs(60), |s| {
        let b = &s["cost"]["since_start"];
        let fn_calls = b["functions"][0]["requests"].as_u64().unwrap_or(0);
        let vm_calls = s["routed"]["vm"].as_u64().unwrap_or(0);
        fn_calls + vm_calls >= 7 && b["vm"][0]["vm_seconds"].as_f64().is_some()
    });
    let b = &s["cost"]["since_start"];
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-12 * b.abs().max(1e-6);
    let vm = &b["vm"][0];
    assert_eq!(vm["instance_type"], "process");
    let vm_s = vm["vm_seconds"].as_f64().unwrap();
    assert!(vm_s >= 60.0 && vm_s.fract() == 0.0, "{vm}");
    assert!(
        close(vm["usd"].as_f64().unwrap(), vm_s / 3600.0 * 0.36),
        "{vm}"
    );
    let f = &b["functions"][0];
    assert_eq!(f["zone"], "cloud");
    let (n, gbs) = (
        f["requests"].as_u64().unwrap(),
        f["gb_seconds"].as_f64().unwrap(),
    );
    // 2 GB × whole milliseconds, at least 1 ms a call.
    assert!(gbs >= n as f64 * 0.002, "{f}");
    assert!(((gbs / 0.002).round() - gbs / 0.002).abs() < 1e-6, "{f}");
    let fn_usd = f["usd"].as_f64().unwrap();
    assert!(close(fn_usd, gbs * 0.000_02 + n as f64 * 0.000_001), "{f}");
    assert!(close(
        b["total_usd"].as_f64().unwrap(),
        vm["usd"].as_f64().unwrap() + fn_usd
    ));
    let c = &b["counterfactual"];
    // Every call on functions: the 7 request fees and at least their function time.
    let all_fn = c["all_functions_usd"].as_f64().unwrap();
    assert!(
        all_fn >= fn_usd && all_fn >= 7.0 * (0.000_001 + 0.002 * 0.000_02),
        "{c}"
    );
    // A pool for the busiest second at r_max 20: one VM for the whole run.
    assert_eq!(c["all_vm_vms"], 1, "{c}");
    let up = b["to_seconds"].as_f64().unwrap();
    let billed = ((up * 1e6).round() / 1e6).ceil().max(60.0);
    assert!(
        close(c["all_vm_usd"].as_f64().unwrap(), billed / 3600.0 * 0.36),
        "{c}"
    );
    assert!(s["cost"]["last_hour"]["total_usd"].as_f64().unwrap() > 0.0);

    let (_, _, body) = http(gw.admin, "GET", "/metrics", &[], b"");
    let text = String::from_utf8(body).unwrap();
    assert!(text.contains("# TYPE spillway_cost_dollars_total counter"));
    let metric_fn = metric_value(
        &text,
        r#"spillway_cost_dollars_total{tier="function",zone="cloud"}"#,
    )
    .expect("the function line");
    // Read after /status: later calls only add.
    assert!(metric_fn >= fn_usd, "{text}");
    let metric_vm = metric_value(
        &text,
        r#"spillway_cost_dollars_total{tier="vm",zone="process"}"#,
    )
    .expect("the VM line");
    assert!(metric_vm >= vm["usd"].as_f64().unwrap());
    for policy in ["all_functions", "all_vm"] {
        let series = format!(r#"spillway_cost_counterfactual_dollars_total{{policy="{policy}"}}"#);
        assert!(metric_value(&text, &series).is_some(), "{series}: {text}");
    }
}
