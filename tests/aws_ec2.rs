//! The EC2 VM pool through the real gateway binary (issue 4, "Tests"): against moto for
//! scaling 0 → 3 → 1 → 0, restart adoption and boot-timeout termination; against a local
//! EC2 query-API stub for capacity errors, throttling and access denied; against a closed
//! port for an unreachable API. In every failure case the gateway keeps serving (the
//! function tier takes the load) and `/status` and `/metrics` show the error.
//!
//! Loopback only: moto's instances have fake private addresses that are never contacted.
//! The pools use `address: tag`, and an [`Agent`] plays the instances' boot script: for
//! each new instance of its pool it starts a loopback sample API and writes its URL into
//! the instance's `spillway:upstream` tag with CreateTags.

#![cfg(feature = "aws")]
// Real processes and an emulator: deadlines are wall-clock time.
#![allow(clippy::disallowed_methods)]

mod aws_common;
mod common;

use std::collections::{BTreeMap, HashMap};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_common::{Moto, REGION, StubRequest, aws_env, poll, read_stub_request, write_stub_reply};
use aws_sdk_ec2::config::{BehaviorVersion, Credentials, Region};
use common::{Gateway, SampleApi, header, http, u64_at};
use serde_json::Value;

const LONG: Duration = Duration::from_secs(60);
const UPSTREAM_TAG: &str = "spillway:upstream";

/// A synchronous EC2 client for assertions and for the agent.
struct Ec2 {
    rt: tokio::runtime::Runtime,
    client: aws_sdk_ec2::Client,
}

/// One instance as DescribeInstances shows it.
#[derive(Clone, Debug)]
struct Inst {
    id: String,
    state: String,
    tags: BTreeMap<String, String>,
}

impl Ec2 {
    fn new(endpoint: &str) -> Ec2 {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let config = aws_sdk_ec2::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new(REGION))
            .credentials_provider(Credentials::new("testing", "testing", None, None, "test"))
            .endpoint_url(endpoint)
            .build();
        Ec2 {
            rt,
            client: aws_sdk_ec2::Client::from_conf(config),
        }
    }

    /// Every instance (any state) tagged `spillway:pool=<pool>`.
    fn pool(&self, pool: &str) -> Vec<Inst> {
        let out = self
            .rt
            .block_on(
                self.client
                    .describe_instances()
                    .filters(
                        aws_sdk_ec2::types::Filter::builder()
                            .name("tag:spillway:pool")
                            .values(pool)
                            .build(),
                    )
                    .send(),
            )
            .expect("DescribeInstances");
        let mut v: Vec<Inst> = out
            .reservations()
            .iter()
            .flat_map(|r| r.instances())
            .map(|i| Inst {
                id: i.instance_id().unwrap_or_default().to_string(),
                state: i
                    .state()
                    .and_then(|s| s.name())
                    .map(|n| n.as_str().to_string())
                    .unwrap_or_default(),
                tags: i
                    .tags()
                    .iter()
                    .map(|t| {
                        (
                            t.key().unwrap_or_default().to_string(),
                            t.value().unwrap_or_default().to_string(),
                        )
                    })
                    .collect(),
            })
            .collect();
        v.sort_by(|a, b| a.id.cmp(&b.id));
        v
    }

    fn running(&self, pool: &str) -> Vec<Inst> {
        self.pool(pool)
            .into_iter()
            .filter(|i| i.state == "running" || i.state == "pending")
            .collect()
    }

    fn tag(&self, id: &str, key: &str, value: &str) {
        self.rt
            .block_on(
                self.client
                    .create_tags()
                    .resources(id)
                    .tags(
                        aws_sdk_ec2::types::Tag::builder()
                            .key(key)
                            .value(value)
                            .build(),
                    )
                    .send(),
            )
            .expect("CreateTags");
    }
}

/// What the agent writes into a new instance's upstream tag.
#[derive(Clone, Copy)]
enum Boot {
    /// Start a loopback sample API named `vm-<instance id>` and tag its URL.
    SampleApi,
    /// Tag a URL on which nothing listens: the instance never passes its health check.
    Broken,
}

/// Plays the boot script of a pool's instances (see the module docs).
struct Agent {
    stop: Arc<AtomicBool>,
    apis: Arc<Mutex<HashMap<String, SampleApi>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Agent {
    fn start(endpoint: &str, pool: &str, boot: Boot) -> Agent {
        let stop = Arc::new(AtomicBool::new(false));
        let apis: Arc<Mutex<HashMap<String, SampleApi>>> = Arc::default();
        let (endpoint, pool) = (endpoint.to_string(), pool.to_string());
        let (stop2, apis2) = (Arc::clone(&stop), Arc::clone(&apis));
        let thread = std::thread::spawn(move || {
            let ec2 = Ec2::new(&endpoint);
            let mut done = std::collections::HashSet::new();
            while !stop2.load(Ordering::Relaxed) {
                for inst in ec2.running(&pool) {
                    if done.contains(&inst.id) || inst.tags.contains_key(UPSTREAM_TAG) {
                        continue;
                    }
                    let url = match boot {
                        Boot::SampleApi => {
                            let api = SampleApi::start(&format!("vm-{}", inst.id));
                            let url = format!("http://{}", api.addr);
                            apis2.lock().unwrap().insert(inst.id.clone(), api);
                            url
                        }
                        Boot::Broken => format!("http://127.0.0.1:{}", aws_common::free_port()),
                    };
                    ec2.tag(&inst.id, UPSTREAM_TAG, &url);
                    done.insert(inst.id);
                }
                std::thread::sleep(Duration::from_millis(50)); // the agent's poll period
            }
        });
        Agent {
            stop,
            apis,
            thread: Some(thread),
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.apis.lock().unwrap().clear();
    }
}

/// Open-loop load at an adjustable rate (requests/s, 0 = idle); records every status.
struct Loader {
    rate: Arc<AtomicU32>,
    stop: Arc<AtomicBool>,
    results: Arc<Mutex<Vec<(u16, String)>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Loader {
    fn start(addr: std::net::SocketAddr) -> Loader {
        let rate = Arc::new(AtomicU32::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let results: Arc<Mutex<Vec<(u16, String)>>> = Arc::default();
        let (rate2, stop2, results2) = (Arc::clone(&rate), Arc::clone(&stop), Arc::clone(&results));
        let thread = std::thread::spawn(move || {
            let mut next = Instant::now();
            while !stop2.load(Ordering::Relaxed) {
                let r = rate2.load(Ordering::Relaxed);
                if r == 0 {
                    std::thread::sleep(Duration::from_millis(20)); // idle pacing
                    next = Instant::now();
                    continue;
                }
                if let Some(wait) = next.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait); // open-loop pacing, not an assertion wait
                }
                next += Duration::from_secs_f64(1.0 / f64::from(r));
                let results = Arc::clone(&results2);
                std::thread::spawn(move || {
                    let (code, headers, _) = http(addr, "GET", "/", &[], b"");
                    let who = header(&headers, "x-spillway-instance")
                        .unwrap_or("")
                        .to_string();
                    results.lock().unwrap().push((code, who));
                });
            }
        });
        Loader {
            rate,
            stop,
            results,
            thread: Some(thread),
        }
    }

    fn set_rate(&self, rps: u32) {
        self.rate.store(rps, Ordering::Relaxed);
    }

    fn finish(mut self) -> Vec<(u16, String)> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // Requests still in flight finish within the client timeout.
        let deadline = Instant::now() + LONG;
        let mut last = usize::MAX;
        loop {
            std::thread::sleep(Duration::from_millis(200));
            let n = self.results.lock().unwrap().len();
            if n == last || Instant::now() > deadline {
                return self.results.lock().unwrap().clone();
            }
            last = n;
        }
    }
}

impl Drop for Loader {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Gateway YAML with an EC2 pool (`address: tag`) and a local process function tier.
fn ec2_config(libra: &str, endpoint: &str, pool: &str, extra_pool: &str) -> String {
    let exe = common::exe();
    format!(
        r#"
gateway:
  listen: 127.0.0.1:0
  admin_listen: 127.0.0.1:0
  drain_timeout_seconds: 5
libra:
{libra}
vm_pool:
  type: ec2
  pool_name: {pool}
  region: {REGION}
  endpoint_url: {endpoint}
  image_id: ami-12c6146b
  instance_type: t3.micro
  tags: {{team: spillway-tests}}
  address: tag
  health_path: /
  probe_interval_seconds: 0.1
{extra_pool}
function_tier:
  type: process
  command: ["{exe}", "sample-api", "--listen", "127.0.0.1:{{port}}", "--name", "fn-{{port}}"]
  keep_alive_seconds: 30
  max_instances: 64
  probe_interval_seconds: 0.02
"#
    )
}

fn start(yaml: &str) -> Gateway {
    Gateway::start_env(yaml, &aws_env())
}

fn metrics(gw: &Gateway) -> String {
    String::from_utf8_lossy(&http(gw.admin, "GET", "/metrics", &[], b"").2).into_owned()
}

fn ready(s: &Value) -> u64 {
    u64_at(s, "/scaling/ready_vms")
}

#[test]
fn scales_0_to_3_to_1_to_0_with_tagged_instances() {
    let moto = Moto::start();
    let ec2 = Ec2::new(&moto.endpoint);
    let pool = "scale";
    let _agent = Agent::start(&moto.endpoint, pool, Boot::SampleApi);
    // Epoch 0.25 s, K = 4: a decision every second. r_max = 10 req/s, at most 3 VMs.
    let gw = start(&ec2_config(
        "  epoch_seconds: 0.25\n  decision_epochs: 4\n  alpha: 0.5\n  beta: 0.5\n  phi: 1.0\n  rho: 0.9\n  r_max_rps: 10\n  min_vms: 0\n  max_vms: 3\n  cip_rps: 1",
        &moto.endpoint,
        pool,
        "  boot_timeout_seconds: 30\n  on_shutdown: terminate",
    ));
    assert_eq!(ready(&gw.status()), 0);
    assert!(ec2.pool(pool).is_empty(), "no instance before any load");

    let load = Loader::start(gw.proxy);
    load.set_rate(30);
    gw.wait_status("3 ready VMs", LONG, |s| {
        ready(s) == 3 && u64_at(s, "/scaling/target_vms") == 3
    });
    let up = poll("3 running instances", LONG, || {
        let v = ec2.running(pool);
        (v.len() == 3).then_some(v)
    });
    for inst in &up {
        assert_eq!(
            inst.tags.get("spillway:pool").map(String::as_str),
            Some(pool),
            "{inst:?}"
        );
        assert!(
            inst.tags
                .get("spillway:vm")
                .is_some_and(|v| v.starts_with("vm-")),
            "{inst:?}"
        );
        assert_eq!(
            inst.tags.get("team").map(String::as_str),
            Some("spillway-tests")
        );
        assert!(
            inst.tags[UPSTREAM_TAG].starts_with("http://127.0.0.1:"),
            "{inst:?}"
        );
    }
    let s = gw.status();
    assert_eq!(s.pointer("/vm_pool/kind"), Some(&Value::from("ec2")));
    let named: Vec<&str> = s["vm_pool"]["vms"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v["instance"].as_str())
        .collect();
    for inst in &up {
        assert!(
            named.contains(&inst.id.as_str()),
            "{named:?} lacks {}",
            inst.id
        );
    }

    load.set_rate(4);
    gw.wait_status("1 ready VM", LONG, |s| {
        ready(s) == 1
            && u64_at(s, "/scaling/target_vms") == 1
            && u64_at(s, "/scaling/draining_vms") == 0
    });
    let one = poll("1 running instance", LONG, || {
        let v = ec2.running(pool);
        (v.len() == 1).then_some(v)
    });
    let all = ec2.pool(pool);
    assert_eq!(
        all.len(),
        3,
        "scale-in terminates, it does not launch: {all:?}"
    );
    assert!(
        all.iter()
            .filter(|i| i.id != one[0].id)
            .all(|i| i.state == "terminated" || i.state == "shutting-down"),
        "{all:?}"
    );

    load.set_rate(0);
    gw.wait_status("no VM", LONG, |s| {
        ready(s) == 0
            && u64_at(s, "/scaling/target_vms") == 0
            && u64_at(s, "/scaling/draining_vms") == 0
    });
    poll("no running instance", LONG, || {
        ec2.running(pool).is_empty().then_some(())
    });
    let results = load.finish();
    assert!(results.len() > 20, "{}", results.len());
    assert!(
        results.iter().all(|(code, _)| *code == 200),
        "client errors: {:?}",
        results
            .iter()
            .filter(|(c, _)| *c != 200)
            .collect::<Vec<_>>()
    );
    assert!(
        results.iter().any(|(_, who)| who.starts_with("vm-i-")),
        "VMs served"
    );
    assert_eq!(gw.status()["vm_pool"]["errors"]["total"], 0);
}

#[test]
fn a_restarted_gateway_adopts_the_pool_instead_of_doubling_it() {
    let moto = Moto::start();
    let ec2 = Ec2::new(&moto.endpoint);
    let pool = "adopt";
    let _agent = Agent::start(&moto.endpoint, pool, Boot::SampleApi);
    // min_vms = 2 with cip 0: two VMs from the start; K large: no decision meanwhile.
    let libra = "  epoch_seconds: 1\n  decision_epochs: 1000\n  r_max_rps: 10\n  min_vms: 2\n  max_vms: 4\n  cip_rps: 0";
    let first = start(&ec2_config(
        libra,
        &moto.endpoint,
        pool,
        "  boot_timeout_seconds: 30",
    ));
    first.wait_status("2 ready VMs", LONG, |s| ready(s) == 2);
    let launched = ec2.running(pool);
    assert_eq!(launched.len(), 2, "{launched:?}");
    drop(first); // SIGTERM; on_shutdown: keep (the default)
    assert_eq!(ec2.running(pool).len(), 2, "kept for adoption");

    let second = start(&ec2_config(
        libra,
        &moto.endpoint,
        pool,
        "  boot_timeout_seconds: 30\n  on_shutdown: terminate",
    ));
    let s = second.wait_status("2 adopted VMs", LONG, |s| ready(s) == 2);
    assert_eq!(u64_at(&s, "/scaling/booting_vms"), 0);
    let all = ec2.pool(pool);
    assert_eq!(all.len(), 2, "no new launch: {all:?}");
    assert_eq!(
        second.proc.log_text().matches("adopted VM").count(),
        2,
        "{}",
        second.proc.log_text()
    );
    let (code, headers, _) = http(second.proxy, "GET", "/", &[], b"");
    assert_eq!(code, 200);
    assert!(header(&headers, "x-spillway-instance").is_some_and(|i| i.starts_with("vm-i-")));

    drop(second); // on_shutdown: terminate
    poll("the pool terminated on shutdown", LONG, || {
        ec2.running(pool).is_empty().then_some(())
    });
}

#[test]
fn an_instance_that_never_gets_ready_is_terminated_after_the_boot_timeout() {
    let moto = Moto::start();
    let ec2 = Ec2::new(&moto.endpoint);
    let pool = "boot-timeout";
    let _agent = Agent::start(&moto.endpoint, pool, Boot::Broken);
    let gw = start(&ec2_config(
        "  epoch_seconds: 1\n  decision_epochs: 1000\n  r_max_rps: 10\n  min_vms: 1\n  max_vms: 1\n  cip_rps: 0",
        &moto.endpoint,
        pool,
        "  boot_timeout_seconds: 1.5",
    ));
    let dead = poll("a terminated instance", LONG, || {
        ec2.pool(pool).into_iter().find(|i| i.state == "terminated")
    });
    assert!(dead.tags[UPSTREAM_TAG].starts_with("http://127.0.0.1:"));
    gw.proc.wait_line("did not become ready", LONG);
    poll("the not_ready failure metric", LONG, || {
        metrics(&gw)
            .contains(r#"spillway_vm_failures_total{stage="not_ready"}"#)
            .then_some(())
    });
    // Still serving, on the function tier.
    let (code, headers, _) = http(gw.proxy, "GET", "/", &[], b"");
    assert_eq!(code, 200);
    assert!(header(&headers, "x-spillway-instance").is_some_and(|i| i.starts_with("fn-")));
}

impl StubRequest {
    /// The first value of header `name` (lower case).
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The body as text.
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The value of `key` in a form-encoded body (AWS query protocol), percent-decoded.
    fn form(&self, key: &str) -> Option<String> {
        self.text().split('&').find_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            (k == key).then(|| percent_decode(v))
        })
    }
}

/// `%XX` and `+` decoding of a form value.
fn percent_decode(v: &str) -> String {
    let b = v.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => match u8::from_str_radix(&v[i + 1..i + 3], 16) {
                Ok(x) => {
                    out.push(x);
                    i += 2;
                }
                Err(_) => out.push(b'%'),
            },
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A stub reply: status, headers, body.
type StubReply = (u16, Vec<(String, String)>, Vec<u8>);

type Handler = Arc<dyn Fn(&StubRequest) -> StubReply + Send + Sync>;

/// A loopback HTTP/1.1 server answering every request with `handler` (one connection per
/// request, `Connection: close`) and recording what it received.
struct QueryStub {
    /// The listen address.
    addr: SocketAddr,
    /// Every request received, in order.
    seen: Arc<Mutex<Vec<StubRequest>>>,
}

impl QueryStub {
    /// Start the stub on a free loopback port.
    fn start(handler: impl Fn(&StubRequest) -> StubReply + Send + Sync + 'static) -> QueryStub {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let handler: Handler = Arc::new(handler);
        let seen2 = Arc::clone(&seen);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let handler = Arc::clone(&handler);
                let seen = Arc::clone(&seen2);
                std::thread::spawn(move || serve_one(stream, &*handler, &seen));
            }
        });
        QueryStub { addr, seen }
    }

    /// `http://ADDR`.
    fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A copy of the requests received so far.
    fn requests(&self) -> Vec<StubRequest> {
        self.seen.lock().unwrap().clone()
    }
}

fn serve_one(
    stream: TcpStream,
    handler: &(dyn Fn(&StubRequest) -> StubReply + Send + Sync),
    seen: &Mutex<Vec<StubRequest>>,
) {
    let Some((req, reader)) = read_stub_request(stream) else {
        return;
    };
    let (status, reply_headers, reply_body) = handler(&req);
    seen.lock().unwrap().push(req);
    write_stub_reply(reader, status, &reply_headers, &reply_body);
}

/// An EC2 query-API stub: DescribeInstances and TerminateInstances succeed (no
/// instance), RunInstances fails with `code` and HTTP `status`.
fn ec2_stub(status: u16, code: &'static str) -> QueryStub {
    QueryStub::start(move |req: &StubRequest| {
        let xml = |body: String| {
            (
                200,
                vec![(
                    "content-type".to_string(),
                    "text/xml;charset=UTF-8".to_string(),
                )],
                body.into_bytes(),
            )
        };
        match req.form("Action").as_deref() {
            Some("DescribeInstances") => xml(
                r#"<?xml version="1.0" encoding="UTF-8"?>
<DescribeInstancesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"><requestId>stub-1</requestId><reservationSet/></DescribeInstancesResponse>"#
                    .into(),
            ),
            Some("TerminateInstances") => xml(
                r#"<?xml version="1.0" encoding="UTF-8"?>
<TerminateInstancesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"><requestId>stub-2</requestId><instancesSet/></TerminateInstancesResponse>"#
                    .into(),
            ),
            _ => (
                status,
                vec![("content-type".to_string(), "text/xml;charset=UTF-8".to_string())],
                format!(
                    r#"<?xml version="1.0" encoding="UTF-8"?>
<Response><Errors><Error><Code>{code}</Code><Message>stub: {code}</Message></Error></Errors><RequestID>stub-3</RequestID></Response>"#
                )
                .into_bytes(),
            ),
        }
    })
}

/// Start a gateway whose EC2 endpoint is `endpoint`, wait until a launch failed with
/// `kind`, and check that the function tier serves and that `/status` and `/metrics`
/// report the error.
fn keeps_serving_and_reports(endpoint: &str, kind: &str, extra_pool: &str) -> Gateway {
    let gw = start(&ec2_config(
        "  epoch_seconds: 0.5\n  decision_epochs: 4\n  r_max_rps: 10\n  min_vms: 1\n  max_vms: 2\n  cip_rps: 0",
        endpoint,
        "errors",
        extra_pool,
    ));
    let key = format!("run_instances.{kind}");
    let s = gw.wait_status(&format!("a {key} error in /status"), LONG, |s| {
        s.pointer("/vm_pool/errors/counts")
            .and_then(|c| c.get(&key))
            .and_then(Value::as_u64)
            .is_some_and(|n| n >= 1)
    });
    let last = &s["vm_pool"]["errors"]["last"];
    assert!(
        last["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{s:#}"
    );
    assert_eq!(ready(&s), 0);
    let series = format!(
        r#"spillway_provider_errors_total{{provider="ec2",operation="run_instances",kind="{kind}"}}"#
    );
    poll(&series, LONG, || {
        metrics(&gw).contains(&series).then_some(())
    });
    for _ in 0..5 {
        let (code, headers, _) = http(gw.proxy, "GET", "/", &[], b"");
        assert_eq!(code, 200, "{}", gw.proc.log_text());
        assert!(header(&headers, "x-spillway-instance").is_some_and(|i| i.starts_with("fn-")));
    }
    assert!(gw.proc.log_text().contains("provider API call failed"));
    gw
}

#[test]
fn capacity_errors_try_every_subnet_and_the_gateway_keeps_serving() {
    let stub = ec2_stub(500, "InsufficientInstanceCapacity");
    let _gw = keeps_serving_and_reports(
        &stub.endpoint(),
        "capacity",
        "  subnet_ids: [subnet-aaa, subnet-bbb]",
    );
    let runs: Vec<String> = stub
        .requests()
        .iter()
        .filter(|r| r.form("Action").as_deref() == Some("RunInstances"))
        .map(|r| {
            assert_eq!((r.method.as_str(), r.target.as_str()), ("POST", "/"));
            assert!(
                r.header("content-type")
                    .is_some_and(|c| c.starts_with("application/x-www-form-urlencoded")),
                "{r:?}"
            );
            assert!(
                r.form("ClientToken")
                    .is_some_and(|t| t.starts_with("spillway-")),
                "{}",
                r.text()
            );
            assert_eq!(
                r.form("TagSpecification.1.Tag.1.Key").as_deref(),
                Some("spillway:pool")
            );
            assert_eq!(
                r.form("TagSpecification.1.Tag.1.Value").as_deref(),
                Some("errors")
            );
            r.form("SubnetId").unwrap_or_default()
        })
        .collect();
    assert!(runs.contains(&"subnet-aaa".to_string()), "{runs:?}");
    assert!(runs.contains(&"subnet-bbb".to_string()), "{runs:?}");
}

#[test]
fn throttling_is_reported_and_the_gateway_keeps_serving() {
    let stub = ec2_stub(503, "RequestLimitExceeded");
    let _gw = keeps_serving_and_reports(&stub.endpoint(), "throttling", "");
}

#[test]
fn access_denied_is_reported_and_the_gateway_keeps_serving() {
    let stub = ec2_stub(403, "UnauthorizedOperation");
    let _gw = keeps_serving_and_reports(&stub.endpoint(), "access_denied", "");
}

#[test]
fn an_unreachable_api_is_reported_and_the_gateway_keeps_serving() {
    let closed = format!("http://127.0.0.1:{}", aws_common::free_port());
    let gw = keeps_serving_and_reports(&closed, "unreachable", "");
    // The adoption listing failed too, and the gateway started anyway.
    let s = gw.status();
    assert!(
        s["vm_pool"]["errors"]["counts"]["describe_instances.unreachable"]
            .as_u64()
            .is_some_and(|n| n >= 1),
        "{s:#}"
    );
}

#[test]
fn an_ec2_pool_is_a_valid_config() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ec2.yaml");
    std::fs::write(
        &path,
        ec2_config(
            "  r_max_rps: 10",
            "http://127.0.0.1:1",
            "cfg",
            "  subnet_ids: [subnet-1]",
        ),
    )
    .unwrap();
    let out = std::process::Command::new(common::exe())
        .args(["check", "--config", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let aws_yaml = concat!(env!("CARGO_MANIFEST_DIR"), "/config/aws.yaml");
    let out = std::process::Command::new(common::exe())
        .args(["check", "--config", aws_yaml])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
