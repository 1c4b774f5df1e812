//! The EC2 VM pool through the real gateway binary: against moto for
//! scaling 0 → 3 → 1 → 0, restart adoption, boot-timeout termination, stopped instances
//! and gateway ids sharing a pool; against the stateful local EC2 fake
//! (`aws_common::ec2::FakeEc2`) for capacity, quota, throttling and access-denied errors,
//! eventual consistency, ambiguous launches and batched describes; against a closed port
//! for an unreachable API. In every failure case the gateway keeps serving (the function
//! tier takes the load) and `/status` and `/metrics` show the error.
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
#[path = "common/replicas.rs"]
mod replicas;

use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use aws_common::ec2::{FakeEc2, FakeInstance};
use aws_common::{Moto, REGION, StubRequest, aws_env, poll};
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
    /// The RunInstances client token.
    token: String,
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
                token: i.client_token().unwrap_or_default().to_string(),
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

    /// RunInstances of one instance tagged `spillway:pool=<pool>` and, when given,
    /// `spillway:gateway=<gateway>`, as an earlier gateway run would have left it.
    fn launch(&self, pool: &str, gateway: Option<&str>) -> String {
        let mut tags = vec![
            aws_sdk_ec2::types::Tag::builder()
                .key("spillway:pool")
                .value(pool)
                .build(),
        ];
        if let Some(g) = gateway {
            tags.push(
                aws_sdk_ec2::types::Tag::builder()
                    .key("spillway:gateway")
                    .value(g)
                    .build(),
            );
        }
        let out = self
            .rt
            .block_on(
                self.client
                    .run_instances()
                    .image_id("ami-12c6146b")
                    .instance_type(aws_sdk_ec2::types::InstanceType::T3Micro)
                    .min_count(1)
                    .max_count(1)
                    .tag_specifications(
                        aws_sdk_ec2::types::TagSpecification::builder()
                            .resource_type(aws_sdk_ec2::types::ResourceType::Instance)
                            .set_tags(Some(tags))
                            .build(),
                    )
                    .send(),
            )
            .expect("RunInstances");
        out.instances()[0].instance_id().unwrap().to_string()
    }

    fn stop(&self, id: &str) {
        self.rt
            .block_on(self.client.stop_instances().instance_ids(id).send())
            .expect("StopInstances");
    }

    fn state(&self, id: &str) -> String {
        let out = self
            .rt
            .block_on(self.client.describe_instances().instance_ids(id).send())
            .expect("DescribeInstances");
        out.reservations()[0].instances()[0]
            .state()
            .and_then(|s| s.name())
            .map(|n| n.as_str().to_string())
            .unwrap_or_default()
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
        Agent::start_after(endpoint, pool, boot, Duration::ZERO)
    }

    /// Like [`Agent::start`], but an instance is tagged only once the agent has seen it
    /// for `boot_time` (a slow boot).
    fn start_after(endpoint: &str, pool: &str, boot: Boot, boot_time: Duration) -> Agent {
        let stop = Arc::new(AtomicBool::new(false));
        let apis: Arc<Mutex<HashMap<String, SampleApi>>> = Arc::default();
        let (endpoint, pool) = (endpoint.to_string(), pool.to_string());
        let (stop2, apis2) = (Arc::clone(&stop), Arc::clone(&apis));
        let thread = std::thread::spawn(move || {
            let ec2 = Ec2::new(&endpoint);
            let mut done = std::collections::HashSet::new();
            let mut first_seen: HashMap<String, Instant> = HashMap::new();
            while !stop2.load(Ordering::Relaxed) {
                for inst in ec2.running(&pool) {
                    if done.contains(&inst.id) || inst.tags.contains_key(UPSTREAM_TAG) {
                        continue;
                    }
                    let seen = *first_seen
                        .entry(inst.id.clone())
                        .or_insert_with(Instant::now);
                    if seen.elapsed() < boot_time {
                        continue;
                    }
                    let url = match boot {
                        Boot::SampleApi => {
                            let api = SampleApi::start(&format!("vm-{}", inst.id));
                            let url = format!("http://{}", api.addr);
                            apis2.lock().insert(inst.id.clone(), api);
                            url
                        }
                        Boot::Broken => common::closed_url(""),
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
        self.apis.lock().clear();
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
                    let (code, headers, body) = http(addr, "GET", "/", &[], b"");
                    // Who served it; for a failure, the gateway's reason, so that a
                    // failed run says why.
                    let who = if code == 200 {
                        header(&headers, "x-spillway-instance")
                            .unwrap_or("")
                            .to_string()
                    } else {
                        String::from_utf8_lossy(&body).chars().take(300).collect()
                    };
                    results.lock().push((code, who));
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
            let n = self.results.lock().len();
            if n == last || Instant::now() > deadline {
                return self.results.lock().clone();
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
/// The instances' tags point at loopback sample APIs: `allow_loopback_upstreams` is on,
/// and loopback is in `tag_address_allowed_cidrs` (moto's instance IPs are fake).
fn ec2_config(libra: &str, endpoint: &str, pool: &str, extra_pool: &str) -> String {
    let exe = common::exe();
    format!(
        r#"
gateway:
  listen: 127.0.0.1:0
  admin_listen: 127.0.0.1:0
  drain_timeout_seconds: 5
  allow_loopback_upstreams: true
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
  tag_address_allowed_cidrs: [127.0.0.0/8]
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

/// On moto: an instance tag is checked like a user-given upstream.
/// Without `allow_loopback_upstreams` the loopback URL the agent writes is refused: the
/// instance is never probed nor used, it is terminated, `/status` shows the alarm with
/// its id and the log names it; requests go to the function tier meanwhile.
#[test]
fn a_tag_address_the_upstream_policy_refuses_is_not_used() {
    let moto = Moto::start();
    let ec2 = Ec2::new(&moto.endpoint);
    let pool = "policy";
    let _agent = Agent::start(&moto.endpoint, pool, Boot::SampleApi);
    let yaml = ec2_config(
        "  decision_epochs: 100000
  r_max_rps: 10
  min_vms: 1
  max_vms: 1
  cip_rps: 0",
        &moto.endpoint,
        pool,
        "  boot_timeout_seconds: 30",
    )
    .replace(
        "  allow_loopback_upstreams: true
",
        "",
    );
    let gw = start(&yaml);
    let s = gw.wait_status("the upstream_address alarm", LONG, |s| {
        s["vm_pool"]["errors"]["conditions"]["upstream_address"]["state"] == "refused"
    });
    let cond = &s["vm_pool"]["errors"]["conditions"]["upstream_address"];
    assert_eq!(cond["alarm"], true, "{s:#}");
    let id = cond["detail"]["last_instance"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(id.starts_with("i-"), "{s:#}");
    assert!(
        cond["reason"]
            .as_str()
            .unwrap()
            .contains("allow_loopback_upstreams"),
        "{s:#}"
    );
    // The refused instance is terminated and never becomes a ready VM.
    poll("the refused instance terminated", LONG, || {
        ec2.pool(pool)
            .iter()
            .any(|i| i.id == id && (i.state == "terminated" || i.state == "shutting-down"))
            .then_some(())
    });
    let log = gw.proc.log_text();
    assert!(
        log.lines()
            .any(|l| l.contains("EC2 instance address refused") && l.contains(&id)),
        "{log}"
    );
    assert!(!log.contains("VM ready"), "{log}");
    assert_eq!(ready(&gw.status()), 0);
    let (code, headers, _) = http(gw.proxy, "GET", "/", &[], b"");
    assert_eq!(code, 200);
    assert!(
        header(&headers, "x-spillway-instance").is_some_and(|w| w.starts_with("fn-")),
        "served by the function tier: {headers:?}"
    );
}

/// On moto: with `address: tag`, a tag naming an address that is not the instance's
/// own (here loopback, allowed by `allow_loopback_upstreams` but not in
/// `tag_address_allowed_cidrs`) is refused: the instance is never used and is
/// terminated, and `/status` names the setting.
#[test]
fn a_tag_address_that_is_not_the_instances_own_ip_needs_the_allow_list() {
    let moto = Moto::start();
    let ec2 = Ec2::new(&moto.endpoint);
    let pool = "own-ip";
    let _agent = Agent::start(&moto.endpoint, pool, Boot::SampleApi);
    let yaml = ec2_config(
        "  decision_epochs: 100000\n  r_max_rps: 10\n  min_vms: 1\n  max_vms: 1\n  cip_rps: 0",
        &moto.endpoint,
        pool,
        "  boot_timeout_seconds: 30",
    )
    .replace("  tag_address_allowed_cidrs: [127.0.0.0/8]\n", "");
    let gw = start(&yaml);
    let s = gw.wait_status("the upstream_address alarm", LONG, |s| {
        s["vm_pool"]["errors"]["conditions"]["upstream_address"]["state"] == "refused"
    });
    let cond = &s["vm_pool"]["errors"]["conditions"]["upstream_address"];
    let reason = cond["reason"].as_str().unwrap();
    assert!(
        reason.contains("is neither one of the instance's own addresses")
            && reason.contains("tag_address_allowed_cidrs"),
        "{s:#}"
    );
    let id = cond["detail"]["last_instance"]
        .as_str()
        .unwrap()
        .to_string();
    poll("the refused instance terminated", LONG, || {
        ec2.pool(pool)
            .iter()
            .any(|i| i.id == id && (i.state == "terminated" || i.state == "shutting-down"))
            .then_some(())
    });
    assert_eq!(ready(&gw.status()), 0);
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

/// On moto: the pool's stopped instances are terminated at start
/// (another gateway's are left alone).
#[test]
fn stopped_instances_of_the_pool_are_terminated_at_start() {
    let moto = Moto::start();
    let ec2 = Ec2::new(&moto.endpoint);
    let pool = "stopped";
    let mine = ec2.launch(pool, Some("gw-test"));
    let legacy = ec2.launch(pool, None);
    let theirs = ec2.launch(pool, Some("gw-other"));
    for id in [&mine, &legacy, &theirs] {
        ec2.stop(id);
    }
    poll("stopped instances", LONG, || {
        [&mine, &legacy, &theirs]
            .iter()
            .all(|id| ec2.state(id) == "stopped")
            .then_some(())
    });
    let _gw = start(&ec2_config(
        "  epoch_seconds: 1\n  decision_epochs: 1000\n  r_max_rps: 10\n  min_vms: 0\n  max_vms: 1",
        &moto.endpoint,
        pool,
        "  gateway_id: gw-test",
    ));
    poll("this gateway's stopped instances terminated", LONG, || {
        (ec2.state(&mine) == "terminated" && ec2.state(&legacy) == "terminated").then_some(())
    });
    assert_eq!(ec2.state(&theirs), "stopped");
}

/// On moto: gateways with their own `gateway_id` share a `pool_name`
/// without adopting or terminating each other's instances (even booting ones), a second
/// gateway launching with the same id is an alarm, and `adopt_gateway_ids` takes a
/// retired gateway's instances over explicitly.
#[test]
fn one_writer_per_pool_instance() {
    let moto = Moto::start();
    let ec2 = Ec2::new(&moto.endpoint);
    let pool = "shared";
    // Instances boot for 3 s before their upstream tag appears.
    let _agent = Agent::start_after(
        &moto.endpoint,
        pool,
        Boot::SampleApi,
        Duration::from_secs(3),
    );
    let idle =
        "  epoch_seconds: 1\n  decision_epochs: 1000\n  r_max_rps: 10\n  min_vms: 0\n  max_vms: 1";
    let one = "  epoch_seconds: 1\n  decision_epochs: 1000\n  r_max_rps: 10\n  min_vms: 1\n  max_vms: 1\n  cip_rps: 0";
    // C has A's id and starts first: A's launches are a second writer with its id.
    let c = start(&ec2_config(
        idle,
        &moto.endpoint,
        pool,
        "  gateway_id: gw-a\n  audit_interval_seconds: 0.3",
    ));
    let a = start(&ec2_config(
        one,
        &moto.endpoint,
        pool,
        "  gateway_id: gw-a\n  boot_timeout_seconds: 60",
    ));
    let id = poll("A's instance", LONG, || {
        ec2.running(pool).first().map(|i| i.id.clone())
    });
    // B starts while A's instance boots.
    let b = start(&ec2_config(
        idle,
        &moto.endpoint,
        pool,
        "  gateway_id: gw-b\n  audit_interval_seconds: 0.3",
    ));
    a.wait_status("A's VM ready", LONG, |s| ready(s) == 1);
    let inst = ec2.pool(pool);
    assert_eq!(inst.len(), 1, "{inst:?}");
    assert_eq!(inst[0].state, "running");
    assert_eq!(inst[0].tags["spillway:gateway"], "gw-a");
    let s = b.status();
    assert_eq!(ready(&s), 0, "{s:#}");
    assert_eq!(
        s["vm_pool"]["errors"]["conditions"]["other_gateways"]["detail"]["gw-a"], 1,
        "{s:#}"
    );
    assert!(
        b.proc
            .log_text()
            .contains("instance of another gateway: left alone")
    );
    let s = c.wait_status("the pool_writers alarm", LONG, |s| {
        s["vm_pool"]["errors"]["conditions"]["pool_writers"]["alarm"] == true
    });
    assert_eq!(
        s["vm_pool"]["errors"]["conditions"]["pool_writers"]["detail"]["instances"],
        serde_json::json!([id])
    );
    assert_eq!(ready(&s), 0);
    // A retires and leaves its instance (on_shutdown: keep); B takes it over explicitly.
    drop(a);
    drop(b);
    drop(c);
    let b2 = start(&ec2_config(
        one,
        &moto.endpoint,
        pool,
        "  gateway_id: gw-b\n  adopt_gateway_ids: [gw-a]",
    ));
    let s = b2.wait_status("A's VM adopted", LONG, |s| ready(s) == 1);
    assert_eq!(s["vm_pool"]["vms"][0]["instance"], id.as_str());
}

/// A fake EC2 whose instances never get an upstream tag (never ready).
fn fake_without_boot() -> FakeEc2 {
    FakeEc2::start(|_| None)
}

/// A fake EC2 whose instances run a loopback sample API each (tagged at creation).
/// The sample APIs live as long as the returned list: the fake's server thread never
/// ends, so it holds the list weakly, or they would outlive the test process.
fn fake_with_apis() -> (FakeEc2, Arc<Mutex<Vec<SampleApi>>>) {
    let apis: Arc<Mutex<Vec<SampleApi>>> = Arc::default();
    let keep = Arc::downgrade(&apis);
    let fake = FakeEc2::start(move |id| {
        let api = SampleApi::start(&format!("vm-{id}"));
        let url = format!("http://{}", api.addr);
        keep.upgrade()?.lock().push(api);
        Some(url)
    });
    (fake, apis)
}

#[test]
fn capacity_errors_try_every_subnet_and_the_gateway_keeps_serving() {
    let fake = fake_without_boot();
    fake.set(|f| f.run_error = Some((500, "InsufficientInstanceCapacity".into())));
    let _gw = keeps_serving_and_reports(
        &fake.endpoint(),
        "capacity",
        "  subnet_ids: [subnet-aaa, subnet-bbb]",
    );
    let runs = fake.calls("RunInstances");
    for r in &runs {
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
    }
    // Every VM's launch tried both subnets.
    let mut per_vm: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for r in &runs {
        let vm = tag_of(r, "spillway:vm");
        per_vm
            .entry(vm)
            .or_default()
            .push(r.form("SubnetId").unwrap_or_default());
    }
    assert!(!per_vm.is_empty());
    for (vm, subnets) in &per_vm {
        let distinct: std::collections::BTreeSet<_> = subnets.iter().collect();
        assert_eq!(distinct.len(), 2, "{vm}: {subnets:?}");
    }
}

#[test]
fn throttling_is_reported_and_the_gateway_keeps_serving() {
    let fake = fake_without_boot();
    fake.set(|f| f.run_error = Some((503, "RequestLimitExceeded".into())));
    let _gw = keeps_serving_and_reports(&fake.endpoint(), "throttling", "");
}

/// Access denied on RunInstances (an IAM image condition that no longer matches the
/// template's AMI) is an alarm in `/status` until a launch succeeds.
#[test]
fn access_denied_is_a_pool_alarm_until_a_launch_succeeds() {
    let (fake, _apis) = fake_with_apis();
    fake.set(|f| f.run_error = Some((403, "UnauthorizedOperation".into())));
    let gw = keeps_serving_and_reports(&fake.endpoint(), "access_denied", "");
    let s = gw.status();
    let alarm = &s["vm_pool"]["errors"]["conditions"]["launch"];
    assert_eq!(alarm["alarm"], true, "{s:#}");
    assert_eq!(alarm["state"], "access_denied", "{s:#}");
    assert!(
        alarm["reason"]
            .as_str()
            .is_some_and(|r| r.contains("UnauthorizedOperation")),
        "{s:#}"
    );
    // The policy is fixed: the next decision's launch succeeds and the alarm ends.
    fake.set(|f| f.run_error = None);
    gw.wait_status("a ready VM and no launch alarm", LONG, |s| {
        ready(s) == 1 && s["vm_pool"]["errors"]["conditions"].get("launch").is_none()
    });
}

/// The `spillway:vm` tag value of a RunInstances request.
fn tag_of(r: &StubRequest, key: &str) -> String {
    r.instance_tags()
        .into_iter()
        .find_map(|(k, v)| (k == key).then_some(v))
        .unwrap_or_default()
}

/// Gateway YAML for the fake: pool `pool`, gateway id `gw-test`, `libra` and extra pool
/// lines as given.
fn fake_config(fake: &FakeEc2, pool: &str, libra: &str, extra_pool: &str) -> String {
    ec2_config(
        libra,
        &fake.endpoint(),
        pool,
        &format!("  gateway_id: gw-test\n{extra_pool}"),
    )
}

/// TerminateInstances answering NotFound right after RunInstances does
/// not drop the instance: the gateway confirms with DescribeInstances and terminates it
/// once EC2 finds it.
#[test]
fn a_not_yet_visible_instance_is_still_terminated() {
    let fake = fake_without_boot();
    fake.set(|f| f.terminate_not_found_first = 2);
    let _gw = start(&fake_config(
        &fake,
        "eventual",
        "  epoch_seconds: 1\n  decision_epochs: 1000\n  r_max_rps: 10\n  min_vms: 1\n  max_vms: 1\n  cip_rps: 0",
        "  boot_timeout_seconds: 1",
    ));
    // The instance never gets ready; after the boot timeout the driver terminates it.
    let id = poll("a launched instance", LONG, || {
        fake.instances().into_keys().next()
    });
    poll("the instance terminated", LONG, || {
        (fake.instances()[&id].state == "terminated").then_some(())
    });
    let terminates: Vec<StubRequest> = fake
        .calls("TerminateInstances")
        .into_iter()
        .filter(|r| r.form_list("InstanceId").contains(&id))
        .collect();
    assert_eq!(terminates.len(), 3, "two NotFound answers, then success");
    let describes = fake
        .calls("DescribeInstances")
        .into_iter()
        .filter(|r| {
            r.filters()
                .get("instance-id")
                .is_some_and(|v| v == std::slice::from_ref(&id))
        })
        .count();
    assert!(describes >= 1, "confirmed with DescribeInstances");
}

/// A batch TerminateInstances with one id EC2 does not know terminates
/// the others (here: the stale instances found at start).
#[test]
fn batch_terminate_skips_the_ids_ec2_does_not_know() {
    let fake = fake_without_boot();
    let tags = [("spillway:pool", "stale"), ("spillway:gateway", "gw-test")];
    let a = fake.insert("pending", &tags);
    let gone = fake.insert("pending", &tags);
    let c = fake.insert("stopped", &tags);
    let foreign = fake.insert(
        "pending",
        &[("spillway:pool", "stale"), ("spillway:gateway", "gw-other")],
    );
    fake.set(|f| {
        f.unknown_to_terminate.insert(gone.clone());
    });
    let gw = start(&fake_config(
        &fake,
        "stale",
        "  epoch_seconds: 1\n  decision_epochs: 1000\n  r_max_rps: 10\n  min_vms: 0\n  max_vms: 1",
        "",
    ));
    poll("the known stale instances terminated", LONG, || {
        let all = fake.instances();
        (all[&a].state == "terminated" && all[&c].state == "terminated").then_some(())
    });
    let batches: Vec<Vec<String>> = fake
        .calls("TerminateInstances")
        .iter()
        .map(|r| r.form_list("InstanceId"))
        .collect();
    assert_eq!(
        batches[0],
        [a.clone(), gone.clone(), c.clone()],
        "one batch first"
    );
    assert!(
        batches.contains(&vec![a.clone(), c.clone()]),
        "the rest without the unknown id: {batches:?}"
    );
    // Another gateway's instance is never touched.
    assert_eq!(fake.instances()[&foreign].state, "pending");
    assert!(batches.iter().all(|b| !b.contains(&foreign)), "{batches:?}");
    let s = gw.status();
    assert_eq!(
        s["vm_pool"]["errors"]["conditions"]["other_gateways"]["detail"]["gw-other"], 1,
        "{s:#}"
    );
}

/// An ambiguous RunInstances failure (5xx after the instance was
/// launched) is repeated with the same client token and subnet, and the VM gets the
/// instance the first call launched — no second instance, nothing terminated.
#[test]
fn an_ambiguous_launch_is_repeated_with_the_same_token_and_subnet() {
    let (fake, _apis) = fake_with_apis();
    fake.set(|f| f.run_ambiguous_first = 4);
    let gw = start(&fake_config(
        &fake,
        "ambiguous",
        "  epoch_seconds: 1\n  decision_epochs: 1000\n  r_max_rps: 10\n  min_vms: 1\n  max_vms: 1\n  cip_rps: 0",
        "  subnet_ids: [subnet-a, subnet-b]\n  boot_timeout_seconds: 60",
    ));
    gw.wait_status("a ready VM", LONG, |s| ready(s) == 1);
    let all = fake.instances();
    assert_eq!(all.len(), 1, "one instance: {all:?}");
    let runs = fake.calls("RunInstances");
    assert!(
        runs.len() >= 5,
        "4 ambiguous answers, then success: {}",
        runs.len()
    );
    let tokens: std::collections::BTreeSet<_> = runs
        .iter()
        .map(|r| r.form("ClientToken").unwrap())
        .collect();
    let subnets: std::collections::BTreeSet<_> =
        runs.iter().map(|r| r.form("SubnetId").unwrap()).collect();
    assert_eq!(tokens.len(), 1, "{tokens:?}");
    assert_eq!(subnets.len(), 1, "{subnets:?}");
    assert!(fake.calls("TerminateInstances").is_empty());
    let s = gw.status();
    let instance = s["vm_pool"]["vms"][0]["instance"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(all.contains_key(&instance), "{s:#}");
}

/// Booting instances are described together in one call, and a
/// throttled DescribeInstances backs off exponentially, starting at the probe interval.
#[test]
fn describes_are_batched_and_back_off_when_throttled() {
    let (fake, _apis) = fake_with_apis();
    // Booting: invisible to DescribeInstances for a long while.
    fake.set(|f| f.describe_hidden_first = 1_000_000);
    let gw = start(&fake_config(
        &fake,
        "batched",
        "  epoch_seconds: 1\n  decision_epochs: 1000\n  r_max_rps: 10\n  min_vms: 3\n  max_vms: 3\n  cip_rps: 0",
        "  boot_timeout_seconds: 120",
    ));
    let ids: Vec<String> = poll("3 launched instances", LONG, || {
        let v: Vec<String> = fake.instances().into_keys().collect();
        (v.len() == 3).then_some(v)
    });
    let all_three = |r: &StubRequest| {
        r.filters()
            .get("instance-id")
            .is_some_and(|v| ids.iter().all(|i| v.contains(i)))
    };
    poll("a DescribeInstances naming all three", LONG, || {
        fake.calls("DescribeInstances")
            .iter()
            .any(all_three)
            .then_some(())
    });
    fake.set(|f| f.describe_throttled = 4);
    let throttled = |fake: &FakeEc2| -> Vec<Instant> {
        fake.timed_requests()
            .into_iter()
            .filter(|(_, r, status)| r.action() == "DescribeInstances" && *status == 503)
            .map(|(t, _, _)| t)
            .collect()
    };
    let throttled_at = poll("four throttled describes", LONG, || {
        let t = throttled(&fake);
        (t.len() == 4).then_some(t)
    });
    let unhidden_at = poll("a describe after the throttling", LONG, || {
        fake.timed_requests()
            .into_iter()
            .find(|(t, r, _)| r.action() == "DescribeInstances" && *t > throttled_at[3])
            .map(|(t, _, _)| t)
    });
    fake.set(|f| f.describe_hidden_first = 0);
    gw.wait_status("3 ready VMs", LONG, |s| ready(s) == 3);
    // While all three booted, every resolution call named all three.
    let first_all = fake
        .timed_requests()
        .into_iter()
        .find(|(_, r, _)| r.action() == "DescribeInstances" && all_three(r))
        .map(|(t, _, _)| t)
        .unwrap();
    let booting: Vec<StubRequest> = fake
        .timed_requests()
        .into_iter()
        .filter(|(t, r, _)| {
            r.action() == "DescribeInstances"
                && r.filters().contains_key("instance-id")
                && *t >= first_all
                && *t <= unhidden_at
        })
        .map(|(_, r, _)| r)
        .collect();
    assert!(booting.len() >= 5, "{}", booting.len());
    for r in &booting {
        assert!(all_three(r), "{:?}", r.filters());
    }
    // The pauses after the throttled calls are at least the probe interval (0.1 s in
    // ec2_config), doubling: 0.1, 0.2, 0.4 and 0.8 s.
    let mut after = throttled_at.clone();
    after.push(unhidden_at);
    for (k, min) in [0.1, 0.2, 0.4, 0.8].into_iter().enumerate() {
        let gap = after[k + 1].duration_since(after[k]);
        assert!(
            gap >= Duration::from_secs_f64(min),
            "pause {k} after throttling: {gap:?} < {min} s"
        );
    }
    assert!(
        gw.status()["vm_pool"]["errors"]["counts"]["describe_instances.throttling"]
            .as_u64()
            .is_some_and(|n| n >= 4)
    );
}

/// `Unsupported` (the instance type is not offered in that subnet's
/// zone) moves the launch to the next subnet; the instance launches with shutdown
/// behaviour `terminate` and exactly the tag keys `deploy/aws/iam.yaml` allows.
#[test]
fn unsupported_moves_the_launch_to_the_next_subnet() {
    let (fake, _apis) = fake_with_apis();
    fake.set(|f| {
        f.subnet_errors
            .insert("subnet-a".into(), (400, "Unsupported".into()));
    });
    let gw = start(&fake_config(
        &fake,
        "subnets",
        "  epoch_seconds: 1\n  decision_epochs: 1000\n  r_max_rps: 10\n  min_vms: 1\n  max_vms: 1\n  cip_rps: 0",
        "  subnet_ids: [subnet-a, subnet-b]",
    ));
    gw.wait_status("a ready VM", LONG, |s| ready(s) == 1);
    let all: Vec<FakeInstance> = fake.instances().into_values().collect();
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].subnet, "subnet-b");
    assert_eq!(all[0].shutdown_behavior, "terminate");
    assert_eq!(all[0].tag("spillway:gateway"), Some("gw-test"));
    let s = gw.status();
    assert_eq!(
        s["vm_pool"]["errors"]["counts"]["run_instances.capacity"], 1,
        "{s:#}"
    );
    // The tag keys sent are the ones the IAM policy allows.
    let allowed = iam_tag_keys();
    let expected: std::collections::BTreeSet<String> = spillway::backends::ec2::SPILLWAY_TAG_KEYS
        .iter()
        .map(|k| k.to_string())
        .collect();
    assert_eq!(allowed, expected, "deploy/aws/iam.yaml aws:TagKeys");
    for r in fake.calls("RunInstances") {
        for (k, _) in r.instance_tags() {
            assert!(
                allowed.contains(&k) || k == "team",
                "{k} is neither a spillway key in iam.yaml nor a vm_pool.tags key"
            );
        }
        let sent: std::collections::BTreeSet<String> = r
            .instance_tags()
            .into_iter()
            .map(|(k, _)| k)
            .filter(|k| k != "team")
            .collect();
        assert_eq!(sent, expected);
    }
}

/// The literal tag keys of every `aws:TagKeys` list in `deploy/aws/iam.yaml` (block
/// sequences, one key per line); each list must also take the `ExtraTagKeys` parameter
/// (the `vm_pool.tags` keys).
fn iam_tag_keys() -> std::collections::BTreeSet<String> {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/aws/iam.yaml"))
        .unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let mut lists: Vec<std::collections::BTreeSet<String>> = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        if !line.trim_start().starts_with("aws:TagKeys:") {
            continue;
        }
        let indent = line.len() - line.trim_start().len();
        let mut keys = std::collections::BTreeSet::new();
        let mut extra = false;
        for l in &lines[i + 1..] {
            if l.trim().is_empty() || l.trim_start().starts_with('#') {
                continue;
            }
            if l.len() - l.trim_start().len() <= indent {
                break;
            }
            let item = l
                .trim_start()
                .trim_start_matches("- ")
                .trim_start_matches("- ");
            if item.starts_with("spillway:") {
                keys.insert(item.to_string());
            }
            extra |= item.contains("!Ref ExtraTagKeys");
        }
        assert!(
            extra,
            "iam.yaml:{}: aws:TagKeys without ExtraTagKeys",
            i + 1
        );
        lists.push(keys);
    }
    assert!(!lists.is_empty(), "no aws:TagKeys in iam.yaml");
    for l in &lists[1..] {
        assert_eq!(l, &lists[0], "every aws:TagKeys list is the same");
    }
    lists.swap_remove(0)
}

/// An account quota (`VcpuLimitExceeded`) is the same in every subnet:
/// one RunInstances per launch, and the pool alarm says so.
#[test]
fn a_quota_error_does_not_try_the_other_subnets() {
    let fake = fake_without_boot();
    fake.set(|f| f.run_error = Some((400, "VcpuLimitExceeded".into())));
    let gw = keeps_serving_and_reports(
        &fake.endpoint(),
        "quota",
        "  gateway_id: gw-test\n  subnet_ids: [subnet-a, subnet-b, subnet-c]",
    );
    let s = gw.status();
    assert_eq!(
        s["vm_pool"]["errors"]["conditions"]["launch"]["state"], "quota",
        "{s:#}"
    );
    let mut per_vm: BTreeMap<String, usize> = BTreeMap::new();
    for r in fake.calls("RunInstances") {
        *per_vm.entry(tag_of(&r, "spillway:vm")).or_default() += 1;
    }
    assert!(!per_vm.is_empty());
    assert!(per_vm.values().all(|&n| n == 1), "{per_vm:?}");
}

/// A stopped instance of the pool is terminated by the pool audit.
#[test]
fn the_audit_terminates_stopped_instances_of_the_pool() {
    let fake = fake_without_boot();
    let _gw = start(&fake_config(
        &fake,
        "audit",
        "  epoch_seconds: 1\n  decision_epochs: 1000\n  r_max_rps: 10\n  min_vms: 0\n  max_vms: 1",
        "  audit_interval_seconds: 0.3",
    ));
    let stopped = fake.insert(
        "stopped",
        &[("spillway:pool", "audit"), ("spillway:gateway", "gw-test")],
    );
    let other = fake.insert(
        "stopped",
        &[("spillway:pool", "audit"), ("spillway:gateway", "gw-b")],
    );
    poll("the stopped instance terminated", LONG, || {
        (fake.instances()[&stopped].state == "terminated").then_some(())
    });
    assert_eq!(
        fake.instances()[&other].state,
        "stopped",
        "another gateway's"
    );
}

/// User data is limited to 16 KiB before base64.
#[test]
fn user_data_is_limited_to_16_kib_before_base64() {
    let dir = tempfile::tempdir().unwrap();
    let check = |bytes: usize| {
        let path = dir.path().join(format!("ud-{bytes}.yaml"));
        let ud = "x".repeat(bytes);
        std::fs::write(
            &path,
            ec2_config(
                "  r_max_rps: 10",
                "http://127.0.0.1:1",
                "cfg",
                &format!("  user_data: \"{ud}\""),
            ),
        )
        .unwrap();
        std::process::Command::new(common::exe())
            .args(["check", "--config", path.to_str().unwrap()])
            .output()
            .unwrap()
    };
    // 13,000 bytes are 17,336 once base64-encoded: fine, the limit is on the raw bytes.
    for ok in [13_000, 16_384] {
        let out = check(ok);
        assert!(
            out.status.success(),
            "{ok}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let out = check(16_385);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("vm_pool.user_data") && err.contains("16385 bytes"),
        "{err}"
    );
}

#[test]
fn an_unreachable_api_is_reported_and_the_gateway_keeps_serving() {
    let closed = common::closed_url("");
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

/// Fixed LIBRA settings of the leak tests: one VM wanted, decisions rare.
const ONE_VM: &str = "  epoch_seconds: 1\n  decision_epochs: 1000\n  r_max_rps: 10\n  min_vms: 1\n  max_vms: 1\n  cip_rps: 0";

/// The instance ids `/status` lists for the pool's VMs.
fn status_instances(s: &Value) -> Vec<String> {
    s["vm_pool"]["vms"]
        .as_array()
        .map(|vms| {
            vms.iter()
                .filter_map(|v| v["instance"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Throttled listings at start are retried with back-off before anything is
/// launched: the earlier run's instance is adopted and no second pool starts.
#[test]
fn adoption_is_retried_before_the_first_launch() {
    let (fake, apis) = fake_with_apis();
    let api = SampleApi::start("vm-earlier-run");
    let url = format!("http://{}", api.addr);
    apis.lock().push(api);
    let earlier = fake.insert(
        "running",
        &[
            ("spillway:pool", "throttled"),
            ("spillway:gateway", "gw-test"),
            (UPSTREAM_TAG, &url),
        ],
    );
    // Two whole listings (three SDK attempts each) and one more attempt throttled.
    fake.set(|f| f.describe_throttled = 7);
    let gw = start(&fake_config(&fake, "throttled", ONE_VM, ""));
    gw.wait_status("the earlier run's instance adopted", LONG, |s| {
        ready(s) == 1 && status_instances(s) == [earlier.clone()]
    });
    assert!(
        fake.calls("RunInstances").is_empty(),
        "nothing launched beside the adopted pool"
    );
    let s = gw.status();
    assert!(
        s["vm_pool"]["errors"]["conditions"]
            .get("adoption")
            .is_none(),
        "{s:#}"
    );
}

/// A RunInstances whose reply is lost after it took effect (the connection closes) is
/// ambiguous: it is repeated with the same client token and gets the instance the
/// first call launched. No second instance, nothing leaks.
#[test]
fn a_launch_whose_reply_is_lost_is_repeated_with_the_same_token() {
    let (fake, _apis) = fake_with_apis();
    // More than the SDK's own three attempts: the gateway's recovery must repeat it.
    fake.set(|f| f.run_dropped_first = 4);
    let gw = start(&fake_config(
        &fake,
        "dropped",
        ONE_VM,
        "  boot_timeout_seconds: 60",
    ));
    gw.wait_status("a ready VM", LONG, |s| ready(s) == 1);
    let all = fake.instances();
    assert_eq!(all.len(), 1, "one instance: {all:?}");
    let runs = fake.calls("RunInstances");
    assert!(runs.len() >= 5, "4 lost replies, then one: {}", runs.len());
    let tokens: std::collections::BTreeSet<_> = runs
        .iter()
        .map(|r| r.form("ClientToken").unwrap())
        .collect();
    assert_eq!(tokens.len(), 1, "{tokens:?}");
    assert!(fake.calls("TerminateInstances").is_empty());
    let s = gw.status();
    assert_eq!(
        status_instances(&s),
        all.keys().cloned().collect::<Vec<_>>(),
        "{s:#}"
    );
}

/// A launch that gave up with its outcome unknown (every repetition ambiguous, the
/// token lookup finding nothing) leaves no leak: the pool audit finds the instance
/// by its recorded client token and adopts it once healthy; in the end every live
/// instance is a VM of the gateway.
#[test]
fn the_audit_adopts_the_instance_of_a_launch_that_gave_up() {
    let (fake, _apis) = fake_with_apis();
    fake.set(|f| {
        f.run_ambiguous_first = 1_000;
        f.token_lookup_blind = true;
    });
    let gw = start(&fake_config(
        &fake,
        "gaveup",
        ONE_VM,
        "  audit_interval_seconds: 0.3\n  boot_timeout_seconds: 120",
    ));
    let s = gw.wait_status("a VM adopted by the audit", Duration::from_secs(180), |s| {
        ready(s) == 1
    });
    let first = fake.calls("RunInstances")[0].form("ClientToken").unwrap();
    let adopted = status_instances(&s);
    assert_eq!(adopted.len(), 1, "{s:#}");
    assert_eq!(
        fake.instances()[&adopted[0]].token,
        first,
        "the instance of the first launch, which gave up"
    );
    // Every instance that is still live is one the gateway has as a VM (nothing
    // untracked), or the replacement launch's, still in flight or adopted later.
    gw.wait_status("no live instance outside the pool's VMs", LONG, |s| {
        let vms = status_instances(s);
        fake.instances().values().all(|i| {
            i.state == "terminated"
                || vms.contains(&i.id)
                || fake.calls("RunInstances").iter().any(|r| {
                    r.form("ClientToken").as_deref() == Some(i.token.as_str()) && i.token != first
                })
        })
    });
    let s = gw.status();
    assert!(
        s["vm_pool"]["errors"]["conditions"]
            .get("stray_instances")
            .is_none(),
        "a recorded launch is not a stray: {s:#}"
    );
}

/// An instance terminated outside the gateway leaves the pool although its old
/// address still answers: the audit reads EC2's state, the VM dies
/// (`spillway_vm_failures_total{stage="terminated"}`) and a replacement is launched.
#[test]
fn an_instance_terminated_outside_the_gateway_leaves_the_pool() {
    let (fake, _apis) = fake_with_apis();
    let gw = start(&fake_config(
        &fake,
        "outside",
        ONE_VM,
        "  audit_interval_seconds: 0.3",
    ));
    let s = gw.wait_status("a ready VM", LONG, |s| ready(s) == 1);
    let first = status_instances(&s)[0].clone();
    // The sample API at its address keeps answering 200.
    fake.set_state(&first, "terminated");
    let s = gw.wait_status("a replacement ready, the terminated one gone", LONG, |s| {
        let vms = status_instances(s);
        ready(s) == 1 && !vms.contains(&first)
    });
    let replacement = &status_instances(&s)[0];
    assert_eq!(fake.instances()[replacement].state, "running");
    let m = metrics(&gw);
    assert!(
        m.lines()
            .any(|l| l.starts_with("spillway_vm_failures_total{stage=\"terminated\"} 1")),
        "{m}"
    );
}

/// An untracked instance of the gateway's own pool and id (an earlier run's that the
/// start-up listing did not show) is the alarm `stray_instances` at once and is
/// terminated only after `stray_grace_seconds`; another gateway's is left alone.
#[test]
fn a_stray_instance_is_terminated_after_the_grace_period_with_an_alarm() {
    let fake = fake_without_boot();
    let gw = start(&fake_config(
        &fake,
        "strays",
        "  epoch_seconds: 1\n  decision_epochs: 1000\n  r_max_rps: 10\n  min_vms: 0\n  max_vms: 1",
        "  audit_interval_seconds: 0.3\n  stray_grace_seconds: 1.5",
    ));
    gw.wait_status("the gateway up", LONG, |_| true);
    let inserted = Instant::now();
    let stray = fake.insert(
        "running",
        &[("spillway:pool", "strays"), ("spillway:gateway", "gw-test")],
    );
    let other = fake.insert(
        "running",
        &[
            ("spillway:pool", "strays"),
            ("spillway:gateway", "gw-other"),
        ],
    );
    let s = gw.wait_status("the stray alarm", LONG, |s| {
        !s["vm_pool"]["errors"]["conditions"]["stray_instances"].is_null()
    });
    let alarm = &s["vm_pool"]["errors"]["conditions"]["stray_instances"];
    assert_eq!(alarm["alarm"], true, "{s:#}");
    assert_eq!(alarm["detail"]["instances"][0], stray.as_str(), "{s:#}");
    poll("the stray terminated", LONG, || {
        (fake.instances()[&stray].state == "terminated").then_some(())
    });
    let (at, _, _) = fake
        .timed_requests()
        .into_iter()
        .find(|(_, r, _)| {
            r.action() == "TerminateInstances" && r.form_list("InstanceId").contains(&stray)
        })
        .expect("a TerminateInstances call for the stray");
    assert!(
        at.duration_since(inserted) >= Duration::from_millis(1500),
        "terminated before the grace period: {:?}",
        at.duration_since(inserted)
    );
    gw.wait_status("the alarm over", LONG, |s| {
        s["vm_pool"]["errors"]["conditions"]
            .get("stray_instances")
            .is_none()
    });
    assert_eq!(
        fake.instances()[&other].state,
        "running",
        "another gateway's"
    );
}

/// `spillway check` warns, with the place in the file, about an allow-list that lets
/// an instance's tag name nearly any address and about plain `http://` to an AWS
/// endpoint off loopback — and still accepts the file (exit 0).
#[test]
fn check_warns_on_arbitrary_tag_addresses_and_plain_http_endpoints() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("risky.yaml");
    let yaml = ec2_config("  r_max_rps: 10", "http://10.1.2.3:4566", "cfg", "")
        .replace("[127.0.0.0/8]", "[127.0.0.0/8, 0.0.0.0/0]");
    std::fs::write(&path, &yaml).unwrap();
    let out = std::process::Command::new(common::exe())
        .args(["check", "--config", path.to_str().unwrap()])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "warnings, not errors: {stderr}");
    let line_of = |needle: &str| 1 + yaml.lines().position(|l| l.contains(needle)).unwrap();
    let file = path.display().to_string();
    let endpoint = format!("{file}:{}:", line_of("endpoint_url: http://10.1.2.3:4566"));
    assert!(
        stderr.lines().any(|l| l.starts_with(&endpoint)
            && l.contains("warning: vm_pool.endpoint_url: plain http://")),
        "{stderr}"
    );
    let cidrs = format!("{file}:{}:", line_of("tag_address_allowed_cidrs"));
    assert!(
        stderr.lines().any(|l| l.starts_with(&cidrs)
            && l.contains(
                "warning: vm_pool.tag_address_allowed_cidrs[1]: 0.0.0.0/0 is wider than a /8"
            )),
        "{stderr}"
    );
    // Loopback endpoints and narrow lists (the other tests' configs) are not warned about.
    std::fs::write(
        &path,
        ec2_config("  r_max_rps: 10", "http://127.0.0.1:1", "cfg", ""),
    )
    .unwrap();
    let out = std::process::Command::new(common::exe())
        .args(["check", "--config", path.to_str().unwrap()])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("warning:"), "{stderr}");
}

/// Without `gateway_id`, the pool's writer id is the `pool_name` (never the host
/// name), and instances an earlier version tagged with the host name (its default
/// id) are adopted too: an upgraded gateway keeps its pool instead of doubling it.
#[test]
fn without_a_gateway_id_the_pool_name_is_the_id_and_the_host_name_is_adopted() {
    let (fake, apis) = fake_with_apis();
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .expect("a Linux host name")
        .trim()
        .to_string();
    let api = SampleApi::start("vm-earlier-version");
    let url = format!("http://{}", api.addr);
    apis.lock().push(api);
    let earlier = fake.insert(
        "running",
        &[
            ("spillway:pool", "noid"),
            ("spillway:gateway", &host),
            (UPSTREAM_TAG, &url),
        ],
    );
    let gw = start(&ec2_config(
        "  epoch_seconds: 1\n  decision_epochs: 1000\n  r_max_rps: 10\n  min_vms: 2\n  max_vms: 2\n  cip_rps: 0",
        &fake.endpoint(),
        "noid",
        "",
    ));
    gw.wait_status("the earlier instance adopted and one launched", LONG, |s| {
        ready(s) == 2 && status_instances(s).contains(&earlier)
    });
    let runs = fake.calls("RunInstances");
    assert_eq!(runs.len(), 1, "one launch beside the adopted instance");
    assert_eq!(tag_of(&runs[0], "spillway:gateway"), "noid");
}

/// A pool shared by coordinated replicas: an instance of the pool's id (the cluster
/// name) that no replica has as a VM — an earlier leader's launch that got ready after
/// that leader stopped — is adopted by the leader once healthy, not left running
/// untracked (the stray rule does not apply: the replicas share the id).
#[test]
fn the_leader_adopts_an_earlier_leaders_late_instance() {
    let redis = replicas::Redis::start();
    let (fake, apis) = fake_with_apis();
    let yaml = ec2_config(
        "  epoch_seconds: 0.5\n  decision_epochs: 1000\n  r_max_rps: 10\n  min_vms: 0\n  max_vms: 2\n  cip_rps: 0",
        &fake.endpoint(),
        "shared",
        "  audit_interval_seconds: 0.3",
    ) + &format!(
        "coordination:\n  type: redis\n  url: {}\n  cluster: c-ec2\n  lease_ms: 1500\n  op_timeout_ms: 200\n  grace_epochs: 3\n",
        redis.url()
    );
    let gw = start(&yaml);
    gw.wait_status("this replica leads", LONG, |s| {
        replicas::role(s) == "leader"
    });
    let api = SampleApi::start("vm-earlier-leader");
    let url = format!("http://{}", api.addr);
    apis.lock().push(api);
    let late = fake.insert(
        "running",
        &[
            ("spillway:pool", "shared"),
            ("spillway:gateway", "c-ec2"),
            (UPSTREAM_TAG, &url),
        ],
    );
    gw.wait_status("the late instance adopted", LONG, |s| {
        ready(s) == 1 && status_instances(s) == [late.clone()]
    });
    let s = gw.status();
    let conditions = &s["vm_pool"]["errors"]["conditions"];
    assert!(
        conditions.get("stray_instances").is_none() && conditions.get("pool_writers").is_none(),
        "{s:#}"
    );
    assert!(fake.calls("TerminateInstances").is_empty());
}

/// A take-over while the earlier leader's launch still boots (two replicas on the
/// fake EC2, whose instances stay `pending` until the test moves them on): the launch's
/// intent is still open (it is settled once the VM is ready), so the new leader finds
/// the instance by its client token and adopts it as a booting VM at once — no second
/// RunInstances beside it, as the next pool audit would have let happen — and the VM
/// becomes ready once EC2 shows it running and it answers its health probe.
#[test]
fn a_new_leader_adopts_the_earlier_leaders_booting_launch_at_once() {
    let redis = replicas::Redis::start();
    let (fake, _apis) = fake_with_apis();
    fake.set(|f| f.launch_pending = true);
    let cluster = replicas::unique_cluster("c-boot");
    let yaml = ec2_config(
        "  epoch_seconds: 0.5\n  decision_epochs: 1000\n  r_max_rps: 10\n  min_vms: 1\n  max_vms: 2\n  cip_rps: 0",
        &fake.endpoint(),
        "shared-boot",
        "  audit_interval_seconds: 0.3\n  boot_timeout_seconds: 60",
    ) + &format!(
        "coordination:\n  type: redis\n  url: {}\n  cluster: {cluster}\n  lease_ms: 1500\n  op_timeout_ms: 200\n  grace_epochs: 3\n",
        redis.url()
    );
    let gws = [start(&yaml), start(&yaml)];
    let old = replicas::wait_one_leader(&gws.iter().collect::<Vec<_>>(), LONG);
    let new = 1 - old;
    let id = poll("the leader's launch, pending", LONG, || {
        let pending = fake.in_state("pending");
        (fake.calls("RunInstances").len() == 1 && pending.len() == 1).then(|| pending[0].clone())
    });
    gws[old].wait_status("the launch booting on the leader", LONG, |s| {
        vm_instances(s, "booting") == [id.as_str()]
    });
    gws[old].proc.signal("KILL");
    gws[new].wait_status(
        "the new leader has the earlier launch as a booting VM",
        LONG,
        |s| replicas::role(s) == "leader" && vm_instances(s, "booting") == [id.as_str()],
    );
    // The audit runs every 0.3 s: a few of them pass with the VM booting.
    let audits = Instant::now() + Duration::from_secs(2);
    gws[new].wait_status("two seconds more, still booting", LONG, |s| {
        assert_eq!(vm_instances(s, "booting"), [id.as_str()], "{s:#}");
        Instant::now() >= audits
    });
    assert_eq!(
        fake.calls("RunInstances").len(),
        1,
        "nothing launched beside the booting VM"
    );
    fake.set_state(&id, "running");
    gws[new].wait_status("the adopted VM ready", LONG, |s| {
        ready_instances(s) == [id.as_str()] && u64_at(s, "/scaling/booting_vms") == 0
    });
    assert_eq!(fake.calls("RunInstances").len(), 1);
    assert!(fake.calls("TerminateInstances").is_empty());
}

/// The instances of the VMs in `state` (`booting`, `ready`, …) in a `/status`, sorted.
fn vm_instances(s: &Value, state: &str) -> Vec<String> {
    let mut v: Vec<String> = s["vm_pool"]["vms"]
        .as_array()
        .map(|vms| {
            vms.iter()
                .filter(|v| v["state"] == state)
                .filter_map(|v| v["instance"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// The ready VMs' instances in a `/status`, sorted.
fn ready_instances(s: &Value) -> Vec<String> {
    vm_instances(s, "ready")
}

/// Redis restarted empty while a coordinated pool exists (two replicas on moto): a
/// leader again with a term above every term seen before, the registry rebuilt from
/// the provider — the leader's and the follower's ready VMs are exactly the pool's
/// running instances (ids as moto shows them), none orphaned —, no instance launched
/// twice for one VM (client tokens `spw-POOL-TERM-VM-N`, one per leader term and VM)
/// and no more running than the leader's target, every request 2xx throughout.
#[test]
fn redis_restarted_empty_rebuilds_the_registry_from_the_pool() {
    let t0 = Instant::now();
    let moto = Moto::start();
    let ec2 = Ec2::new(&moto.endpoint);
    let pool = "rebuilt";
    let _agent = Agent::start(&moto.endpoint, pool, Boot::SampleApi);
    let redis = replicas::Redis::start();
    let port = redis.port;
    // Epochs of 0.5 s, a decision every 1 s; 2 × 10 req/s at r_max 10: 2 or 3 VMs.
    let yaml = ec2_config(
        "  epoch_seconds: 0.5\n  decision_epochs: 2\n  alpha: 0.5\n  beta: 0.5\n  phi: 1.0\n  rho: 0.9\n  r_max_rps: 10\n  min_vms: 0\n  max_vms: 3\n  cip_rps: 1",
        &moto.endpoint,
        pool,
        "  boot_timeout_seconds: 30\n  audit_interval_seconds: 0.3",
    ) + &format!(
        "coordination:\n  type: redis\n  url: {}\n  cluster: c-rebuilt\n  lease_ms: 1500\n  op_timeout_ms: 200\n  grace_epochs: 3\n",
        redis.url()
    );
    let gws = [start(&yaml), start(&yaml)];
    let refs: Vec<&Gateway> = gws.iter().collect();
    replicas::wait_one_leader(&refs, LONG);
    let admins: Vec<std::net::SocketAddr> = gws.iter().map(|g| g.admin).collect();
    let loads: Vec<Loader> = gws.iter().map(|g| Loader::start(g.proxy)).collect();
    for l in &loads {
        l.set_rate(10);
    }
    // The pool settled: the leader's ready VMs are moto's running instances, ≥ 2.
    let settled = |st: &[Option<Value>]| {
        let Some(leader) = st.iter().flatten().find(|s| replicas::role(s) == "leader") else {
            return false;
        };
        let running: Vec<String> = ec2.running(pool).into_iter().map(|i| i.id).collect();
        running.len() >= 2
            && u64_at(leader, "/scaling/booting_vms") == 0
            && ready_instances(leader) == running
            && st
                .iter()
                .all(|s| s.as_ref().is_some_and(|s| ready_instances(s) == running))
    };
    replicas::until(
        "≥ 2 running instances, ready on both replicas",
        &admins,
        LONG,
        settled,
    );
    let before: Vec<String> = ec2.running(pool).into_iter().map(|i| i.id).collect();
    let seen = gws
        .iter()
        .map(|g| replicas::term(&g.status()))
        .max()
        .unwrap();
    assert!(seen >= 1);

    drop(redis); // SIGKILL
    replicas::until("both replicas miss the store", &admins, LONG, |st| {
        st.iter().all(|s| {
            s.as_ref()
                .is_some_and(|s| u64_at(s, "/coordination/missed_epochs") >= 1)
        })
    });
    let redis = replicas::Redis::start_on(port);
    assert_eq!(
        replicas::redis_cli(port, &["DBSIZE"]),
        ["0"],
        "the restarted Redis is empty"
    );
    let back = Instant::now();
    replicas::until(
        "a leader with a higher term, the pool rebuilt",
        &admins,
        LONG,
        |st| {
            let leaders: Vec<&Value> = st
                .iter()
                .flatten()
                .filter(|s| replicas::role(s) == "leader")
                .collect();
            leaders.len() == 1
                && replicas::term(leaders[0]) > seen
                && st.iter().flatten().all(|s| replicas::role(s) != "local")
                && settled(st)
        },
    );
    let rebuilt = back.elapsed();
    // Hold the load a little longer on the rebuilt pool, then check every request.
    let more = Instant::now() + Duration::from_secs(2);
    replicas::until("two more seconds of load", &admins, LONG, |_| {
        Instant::now() >= more
    });
    let statuses: Vec<Value> = gws.iter().map(Gateway::status).collect();
    let leader = statuses
        .iter()
        .find(|s| replicas::role(s) == "leader")
        .expect("a leader");
    let term = replicas::term(leader);
    assert!(term > seen, "term {term} after the restart, {seen} before");
    let all = ec2.pool(pool);
    let running: Vec<String> = ec2.running(pool).into_iter().map(|i| i.id).collect();
    // 0 orphaned: every running instance of the pool is a VM of the replicas.
    for s in &statuses {
        assert_eq!(ready_instances(s), running, "{s:#}");
    }
    // 0 duplicated: one instance per (term, VM) and no more than the target running.
    let mut stems: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for i in &all {
        assert!(i.token.starts_with("spw-"), "a leader-term token: {i:?}");
        let stem = i.token.rsplit_once('-').map_or("", |(s, _)| s).to_string();
        stems.entry(stem).or_default().push(i.id.clone());
    }
    assert!(
        stems.values().all(|ids| ids.len() == 1),
        "an instance launched twice for one VM: {stems:?}"
    );
    let target = u64_at(leader, "/scaling/target_vms");
    assert!(
        running.len() as u64 <= target.max(before.len() as u64),
        "{} running, target {target}: {all:?}",
        running.len()
    );
    let results: Vec<(u16, String)> = loads.into_iter().flat_map(Loader::finish).collect();
    let failed: Vec<&(u16, String)> = results.iter().filter(|(c, _)| *c != 200).collect();
    assert!(
        failed.is_empty(),
        "{} of {} failed: {failed:?}",
        failed.len(),
        results.len()
    );
    drop(redis);
    let took = t0.elapsed();
    eprintln!(
        "Redis restarted empty: term {seen} → {term}, pool rebuilt {rebuilt:?} after the restart, \
         {} running before and {} after ({} launched in all), {} requests 2xx; {took:?} in all",
        before.len(),
        running.len(),
        all.len(),
        results.len()
    );
    assert!(took < LONG, "took {took:?}");
}

/// The leader term a coordinated launch's client token carries (`spw-POOL-TERM-VM-N`).
fn token_term(token: &str) -> Option<u64> {
    token.strip_prefix("spw-")?.split('-').nth(1)?.parse().ok()
}

/// Redis restarted empty and every replica restarted too (two replicas on moto): no
/// replica remembers a term, so only the pool's client tokens carry the earlier
/// leader's. The new leader lists the pool (tags and client tokens), adopts its running
/// instances — both replicas' ready VMs are exactly moto's running instances, the
/// earlier ones among them — and takes a term above every token's term, so that no
/// token is sent again (one instance per leader term and VM). Both times the two
/// replicas start together: the one that starts while the leader's launches boot
/// leaves them alone (it used to terminate them as not ready at start).
#[test]
fn redis_and_every_replica_restarted_take_a_term_above_every_token_in_the_pool() {
    let moto = Moto::start();
    let ec2 = Ec2::new(&moto.endpoint);
    let pool = "reborn";
    let _agent = Agent::start(&moto.endpoint, pool, Boot::SampleApi);
    let cluster = replicas::unique_cluster("c-reborn");
    let redis = replicas::Redis::start();
    let port = redis.port;
    let yaml = ec2_config(
        "  epoch_seconds: 0.5\n  decision_epochs: 1000\n  r_max_rps: 10\n  min_vms: 2\n  max_vms: 2\n  cip_rps: 0",
        &moto.endpoint,
        pool,
        "  boot_timeout_seconds: 30\n  audit_interval_seconds: 0.3",
    ) + &format!(
        "coordination:\n  type: redis\n  url: {}\n  cluster: {cluster}\n  lease_ms: 1500\n  op_timeout_ms: 200\n  grace_epochs: 3\n",
        redis.url()
    );
    let settled = |admins: &[std::net::SocketAddr], what: &str| {
        replicas::until(what, admins, LONG, |st| {
            let running: Vec<String> = ec2.running(pool).into_iter().map(|i| i.id).collect();
            running.len() == 2
                && st.iter().flatten().any(|s| replicas::role(s) == "leader")
                && st
                    .iter()
                    .all(|s| s.as_ref().is_some_and(|s| ready_instances(s) == running))
        });
    };
    let gws = [start(&yaml), start(&yaml)];
    let admins: Vec<std::net::SocketAddr> = gws.iter().map(|g| g.admin).collect();
    settled(&admins, "two running instances, ready on both replicas");
    let before = ec2.running(pool);
    let token_terms: Vec<u64> = before
        .iter()
        .map(|i| token_term(&i.token).unwrap_or_else(|| panic!("a leader-term token: {i:?}")))
        .collect();
    let top = *token_terms.iter().max().unwrap();
    assert!(top >= 1, "{before:?}");

    for g in &gws {
        g.proc.signal("KILL");
    }
    drop(gws);
    drop(redis);
    let redis = replicas::Redis::start_on(port);
    assert_eq!(
        replicas::redis_cli(port, &["DBSIZE"]),
        ["0"],
        "an empty Redis"
    );
    let gws = [start(&yaml), start(&yaml)];
    let admins: Vec<std::net::SocketAddr> = gws.iter().map(|g| g.admin).collect();
    settled(
        &admins,
        "the restarted replicas adopt the running instances",
    );
    let statuses: Vec<Value> = gws.iter().map(Gateway::status).collect();
    let leader = statuses
        .iter()
        .find(|s| replicas::role(s) == "leader")
        .expect("a leader");
    let term = replicas::term(leader);
    assert!(
        term > top,
        "term {term} after the restart; the pool's tokens carry terms {token_terms:?}"
    );
    let running: Vec<String> = ec2.running(pool).into_iter().map(|i| i.id).collect();
    for i in &before {
        assert!(
            running.contains(&i.id),
            "{} adopted, not replaced: {running:?}",
            i.id
        );
    }
    let mut stems: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for i in ec2.pool(pool) {
        let stem = i.token.rsplit_once('-').map_or("", |(s, _)| s).to_string();
        stems.entry(stem).or_default().push(i.id);
    }
    assert!(
        stems.values().all(|ids| ids.len() == 1),
        "a token sent again: {stems:?}"
    );
    drop(redis);
    eprintln!(
        "Redis and replicas restarted: token terms {token_terms:?}, term {term} after; {} running",
        running.len()
    );
}
