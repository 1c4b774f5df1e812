//! EC2 parts of the AWS harness: [`FakeEc2`], a stateful local stub of the
//! EC2 query API for what moto cannot be made to do — eventual consistency (an instance
//! EC2 does not show or find yet), throttling, capacity and quota errors per subnet,
//! ambiguous RunInstances failures (a 5xx, or the connection closed after the launch
//! took effect), ids unknown to TerminateInstances, instances terminated behind the
//! gateway's back — with every request it received recorded.
//!
//! It knows RunInstances, DescribeInstances (filters `instance-id`, `client-token`,
//! `instance-state-name`, `tag:<key>`) and TerminateInstances; any other action is an
//! `InvalidAction` error. Instances are `running` from their creation (`pending` under
//! [`Faults::launch_pending`]); their upstream tag
//! (`spillway:upstream`) is written at creation by the `boot` callback, standing in for
//! the instance's boot script. Loopback only.

use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Instant;

use super::{StubRequest, read_stub_request, write_stub_reply};

impl StubRequest {
    /// The first value of header `name` (lower case).
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The body as text.
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The value of `key` in a form-encoded body (AWS query protocol), decoded.
    pub(crate) fn form(&self, key: &str) -> Option<String> {
        self.form_pairs()
            .into_iter()
            .find_map(|(k, v)| (k == key).then_some(v))
    }

    /// Every `(key, value)` of a form-encoded body, decoded.
    pub(crate) fn form_pairs(&self) -> Vec<(String, String)> {
        form_urlencoded::parse(&self.body)
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect()
    }

    /// The `Action` of an EC2 query-API call.
    pub(crate) fn action(&self) -> String {
        self.form("Action").unwrap_or_default()
    }

    /// The values of every `<prefix>.N` key (`InstanceId.1`, `InstanceId.2`, …), in order.
    pub(crate) fn form_list(&self, prefix: &str) -> Vec<String> {
        let mut v: Vec<(u32, String)> = self
            .form_pairs()
            .into_iter()
            .filter_map(|(k, val)| {
                let n = k.strip_prefix(prefix)?.strip_prefix('.')?.parse().ok()?;
                Some((n, val))
            })
            .collect();
        v.sort();
        v.into_iter().map(|(_, val)| val).collect()
    }

    /// DescribeInstances filters: name → values.
    pub(crate) fn filters(&self) -> BTreeMap<String, Vec<String>> {
        let mut out = BTreeMap::new();
        for n in 1.. {
            let Some(name) = self.form(&format!("Filter.{n}.Name")) else {
                break;
            };
            out.insert(name, self.form_list(&format!("Filter.{n}.Value")));
        }
        out
    }

    /// The tags of the `instance` TagSpecification of a RunInstances call.
    pub(crate) fn instance_tags(&self) -> Vec<(String, String)> {
        for n in 1.. {
            let Some(rt) = self.form(&format!("TagSpecification.{n}.ResourceType")) else {
                break;
            };
            if rt == "instance" {
                let mut tags = Vec::new();
                for m in 1.. {
                    let Some(k) = self.form(&format!("TagSpecification.{n}.Tag.{m}.Key")) else {
                        break;
                    };
                    let v = self
                        .form(&format!("TagSpecification.{n}.Tag.{m}.Value"))
                        .unwrap_or_default();
                    tags.push((k, v));
                }
                return tags;
            }
        }
        Vec::new()
    }
}

/// One instance of the fake.
#[derive(Clone, Debug)]
pub(crate) struct FakeInstance {
    /// `i-` and 17 hex digits.
    pub id: String,
    /// `pending`, `running`, `shutting-down`, `terminated`, `stopping`, `stopped`.
    pub state: String,
    /// Subnet of the RunInstances call (empty without one).
    pub subnet: String,
    /// Client token of the RunInstances call.
    pub token: String,
    /// Tags.
    pub tags: Vec<(String, String)>,
    /// `InstanceInitiatedShutdownBehavior` of the RunInstances call.
    pub shutdown_behavior: String,
}

impl FakeInstance {
    /// The value of tag `key`.
    pub(crate) fn tag(&self, key: &str) -> Option<&str> {
        self.tags
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// Faults the fake injects; change them with [`FakeEc2::set`].
#[derive(Clone, Debug, Default)]
pub(crate) struct Faults {
    /// TerminateInstances answers `InvalidInstanceID.NotFound` for the first N calls that
    /// name a newly launched instance (per id), as EC2 may right after RunInstances.
    pub terminate_not_found_first: u32,
    /// DescribeInstances leaves a newly launched instance out of its first N answers.
    pub describe_hidden_first: u32,
    /// DescribeInstances answers `RequestLimitExceeded` (503) N more times.
    pub describe_throttled: u32,
    /// Ids TerminateInstances never finds: a call naming one fails whole, naming them.
    pub unknown_to_terminate: HashSet<String>,
    /// RunInstances into a subnet fails with (HTTP status, error code).
    pub subnet_errors: HashMap<String, (u16, String)>,
    /// Every RunInstances fails with (HTTP status, error code).
    pub run_error: Option<(u16, String)>,
    /// The first N RunInstances calls of each client token answer 500 `InternalError`
    /// although the first one launched the instance (an ambiguous failure); later calls
    /// with the token return that instance.
    pub run_ambiguous_first: u32,
    /// The first N RunInstances calls of each client token launch the instance (the
    /// first one) and then close the connection without a reply: the reply is lost.
    pub run_dropped_first: u32,
    /// DescribeInstances with a `client-token` filter finds nothing (EC2 not showing a
    /// new instance to that lookup yet).
    pub token_lookup_blind: bool,
    /// RunInstances creates its instance `pending` (still booting until
    /// [`FakeEc2::set_state`] moves it on), not `running`.
    pub launch_pending: bool,
}

#[derive(Default)]
struct State {
    instances: BTreeMap<String, FakeInstance>,
    by_token: HashMap<String, String>,
    token_calls: HashMap<String, u32>,
    terminate_misses: HashMap<String, u32>,
    describe_misses: HashMap<String, u32>,
    faults: Faults,
    seen: Vec<(Instant, StubRequest, u16)>,
    next: u64,
}

type Boot = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// A stateful EC2 query-API stub on a loopback port. See the [module docs](self).
pub(crate) struct FakeEc2 {
    /// The listen address.
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
}

const XMLNS: &str = "http://ec2.amazonaws.com/doc/2016-11-15/";

impl FakeEc2 {
    /// Start the fake; `boot(instance id)` gives the URL its `spillway:upstream` tag
    /// gets at creation (`None`: no tag).
    pub(crate) fn start(boot: impl Fn(&str) -> Option<String> + Send + Sync + 'static) -> FakeEc2 {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(State::default()));
        let st = Arc::clone(&state);
        let boot: Boot = Arc::new(boot);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let st = Arc::clone(&st);
                let boot = Arc::clone(&boot);
                std::thread::spawn(move || serve_one(stream, &st, &*boot));
            }
        });
        FakeEc2 { addr, state }
    }

    /// `http://ADDR`.
    pub(crate) fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Change the faults.
    pub(crate) fn set(&self, f: impl FnOnce(&mut Faults)) {
        f(&mut self.state.lock().faults);
    }

    /// Add an instance as if launched earlier (by another run or gateway).
    pub(crate) fn insert(&self, state: &str, tags: &[(&str, &str)]) -> String {
        let mut st = self.state.lock();
        st.next += 1;
        let id = format!("i-{:017x}", 0xa000 + st.next);
        st.instances.insert(
            id.clone(),
            FakeInstance {
                id: id.clone(),
                state: state.into(),
                subnet: String::new(),
                token: String::new(),
                tags: tags
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                shutdown_behavior: String::new(),
            },
        );
        id
    }

    /// Change an instance's state behind the gateway's back (terminated from the
    /// console, stopped by a spot interruption, …).
    pub(crate) fn set_state(&self, id: &str, state: &str) {
        let mut st = self.state.lock();
        st.instances.get_mut(id).expect("known instance").state = state.into();
    }

    /// Every instance, by id.
    pub(crate) fn instances(&self) -> BTreeMap<String, FakeInstance> {
        self.state.lock().instances.clone()
    }

    /// Ids of the instances in `state`.
    pub(crate) fn in_state(&self, state: &str) -> Vec<String> {
        self.instances()
            .into_values()
            .filter(|i| i.state == state)
            .map(|i| i.id)
            .collect()
    }

    /// Every request so far, in order.
    pub(crate) fn requests(&self) -> Vec<StubRequest> {
        self.timed_requests()
            .into_iter()
            .map(|(_, r, _)| r)
            .collect()
    }

    /// Every request so far with the time it arrived and the HTTP status of the reply.
    pub(crate) fn timed_requests(&self) -> Vec<(Instant, StubRequest, u16)> {
        self.state.lock().seen.clone()
    }

    /// The requests with `Action` = `action`.
    pub(crate) fn calls(&self, action: &str) -> Vec<StubRequest> {
        self.requests()
            .into_iter()
            .filter(|r| r.action() == action)
            .collect()
    }
}

fn xml_reply(body: String) -> (u16, Vec<u8>) {
    (200, body.into_bytes())
}

fn error_reply(status: u16, code: &str, message: &str) -> (u16, Vec<u8>) {
    (
        status,
        format!(
            r#"<?xml version="1.0" encoding="UTF-8"?>
<Response><Errors><Error><Code>{code}</Code><Message>{message}</Message></Error></Errors><RequestID>fake-err</RequestID></Response>"#
        )
        .into_bytes(),
    )
}

fn instance_xml(i: &FakeInstance) -> String {
    let code = match i.state.as_str() {
        "pending" => 0,
        "running" => 16,
        "shutting-down" => 32,
        "terminated" => 48,
        "stopping" => 64,
        _ => 80,
    };
    let tags: String = i
        .tags
        .iter()
        .map(|(k, v)| {
            format!(
                "<item><key>{}</key><value>{}</value></item>",
                esc(k),
                esc(v)
            )
        })
        .collect();
    format!(
        "<item><instanceId>{}</instanceId><imageId>ami-12c6146b</imageId><instanceState><code>{code}</code><name>{}</name></instanceState><privateIpAddress>10.9.9.9</privateIpAddress><subnetId>{}</subnetId><clientToken>{}</clientToken><launchTime>2020-01-01T00:00:00.000Z</launchTime><tagSet>{tags}</tagSet></item>",
        i.id,
        i.state,
        esc(&i.subnet),
        esc(&i.token)
    )
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn handle(
    req: &StubRequest,
    st: &mut State,
    boot: &(dyn Fn(&str) -> Option<String> + Send + Sync),
) -> (u16, Vec<u8>) {
    match req.action().as_str() {
        "RunInstances" => run_instances(req, st, boot),
        "DescribeInstances" => describe_instances(req, st),
        "TerminateInstances" => terminate_instances(req, st),
        other => error_reply(
            400,
            "InvalidAction",
            &format!("fake EC2 does not know {other}"),
        ),
    }
}

fn run_instances(
    req: &StubRequest,
    st: &mut State,
    boot: &(dyn Fn(&str) -> Option<String> + Send + Sync),
) -> (u16, Vec<u8>) {
    let subnet = req.form("SubnetId").unwrap_or_default();
    let token = req.form("ClientToken").unwrap_or_default();
    if let Some((status, code)) = st.faults.subnet_errors.get(&subnet).cloned() {
        return error_reply(status, &code, &format!("fake: {code} in {subnet}"));
    }
    if let Some((status, code)) = st.faults.run_error.clone() {
        return error_reply(status, &code, &format!("fake: {code}"));
    }
    let calls = {
        let n = st.token_calls.entry(token.clone()).or_default();
        *n += 1;
        *n
    };
    let id = match st.by_token.get(&token) {
        Some(id) if !token.is_empty() => id.clone(),
        _ => {
            st.next += 1;
            let id = format!("i-{:017x}", 0x1000 + st.next);
            let mut tags = req.instance_tags();
            if let Some(url) = boot(&id) {
                tags.push(("spillway:upstream".into(), url));
            }
            st.instances.insert(
                id.clone(),
                FakeInstance {
                    id: id.clone(),
                    state: if st.faults.launch_pending {
                        "pending"
                    } else {
                        "running"
                    }
                    .into(),
                    subnet: subnet.clone(),
                    token: token.clone(),
                    tags,
                    shutdown_behavior: req
                        .form("InstanceInitiatedShutdownBehavior")
                        .unwrap_or_default(),
                },
            );
            if !token.is_empty() {
                st.by_token.insert(token.clone(), id.clone());
            }
            id
        }
    };
    if calls <= st.faults.run_dropped_first {
        return (0, Vec::new());
    }
    if calls <= st.faults.run_ambiguous_first {
        return error_reply(500, "InternalError", "fake: an internal error occurred");
    }
    let inst = st.instances[&id].clone();
    xml_reply(format!(
        r#"<?xml version="1.0" encoding="UTF-8"?>
<RunInstancesResponse xmlns="{XMLNS}"><requestId>fake-run</requestId><reservationId>r-0{}</reservationId><ownerId>123456789012</ownerId><groupSet/><instancesSet>{}</instancesSet></RunInstancesResponse>"#,
        &id[2..],
        instance_xml(&inst)
    ))
}

fn describe_instances(req: &StubRequest, st: &mut State) -> (u16, Vec<u8>) {
    if st.faults.describe_throttled > 0 {
        st.faults.describe_throttled -= 1;
        return error_reply(503, "RequestLimitExceeded", "Request limit exceeded.");
    }
    let filters = req.filters();
    if st.faults.token_lookup_blind && filters.contains_key("client-token") {
        return xml_reply(format!(
            r#"<?xml version="1.0" encoding="UTF-8"?>
<DescribeInstancesResponse xmlns="{XMLNS}"><requestId>fake-describe</requestId><reservationSet/></DescribeInstancesResponse>"#
        ));
    }
    let hidden_first = st.faults.describe_hidden_first;
    let mut items = String::new();
    let ids: Vec<String> = st.instances.keys().cloned().collect();
    for id in ids {
        let inst = st.instances[&id].clone();
        let matches = filters.iter().all(|(name, values)| {
            let v: Option<&str> = match name.as_str() {
                "instance-id" => Some(&inst.id),
                "client-token" => Some(&inst.token),
                "instance-state-name" => Some(&inst.state),
                n => n.strip_prefix("tag:").and_then(|k| inst.tag(k)),
            };
            v.is_some_and(|v| values.iter().any(|x| x == v))
        });
        if !matches {
            continue;
        }
        // Eventual consistency: a launched instance is hidden from its first N answers.
        if !inst.token.is_empty() {
            let misses = st.describe_misses.entry(id.clone()).or_default();
            if *misses < hidden_first {
                *misses += 1;
                continue;
            }
        }
        items.push_str(&format!(
            "<item><reservationId>r-0{}</reservationId><ownerId>123456789012</ownerId><groupSet/><instancesSet>{}</instancesSet></item>",
            &id[2..],
            instance_xml(&inst)
        ));
    }
    xml_reply(format!(
        r#"<?xml version="1.0" encoding="UTF-8"?>
<DescribeInstancesResponse xmlns="{XMLNS}"><requestId>fake-describe</requestId><reservationSet>{items}</reservationSet></DescribeInstancesResponse>"#
    ))
}

fn terminate_instances(req: &StubRequest, st: &mut State) -> (u16, Vec<u8>) {
    let ids = req.form_list("InstanceId");
    // EC2 fails the whole call and names every id it does not find.
    let mut missing: Vec<String> = Vec::new();
    for id in &ids {
        let unknown = st.faults.unknown_to_terminate.contains(id) || !st.instances.contains_key(id);
        let launched = st.instances.get(id).is_some_and(|i| !i.token.is_empty());
        let young = launched && {
            let n = st.terminate_misses.entry(id.clone()).or_default();
            if *n < st.faults.terminate_not_found_first {
                *n += 1;
                true
            } else {
                false
            }
        };
        if unknown || young {
            missing.push(id.clone());
        }
    }
    if !missing.is_empty() {
        let message = if missing.len() == 1 {
            format!("The instance ID '{}' does not exist", missing[0])
        } else {
            format!("The instance IDs '{}' do not exist", missing.join(", "))
        };
        return error_reply(400, "InvalidInstanceID.NotFound", &message);
    }
    let mut items = String::new();
    for id in &ids {
        let inst = st.instances.get_mut(id).expect("checked above");
        let previous = std::mem::replace(&mut inst.state, "terminated".into());
        items.push_str(&format!(
            "<item><instanceId>{id}</instanceId><currentState><code>32</code><name>shutting-down</name></currentState><previousState><code>16</code><name>{previous}</name></previousState></item>"
        ));
    }
    xml_reply(format!(
        r#"<?xml version="1.0" encoding="UTF-8"?>
<TerminateInstancesResponse xmlns="{XMLNS}"><requestId>fake-terminate</requestId><instancesSet>{items}</instancesSet></TerminateInstancesResponse>"#
    ))
}

fn serve_one(
    stream: TcpStream,
    st: &Mutex<State>,
    boot: &(dyn Fn(&str) -> Option<String> + Send + Sync),
) {
    let Some((req, reader)) = read_stub_request(stream) else {
        return;
    };
    let arrived = Instant::now();
    let (status, body) = {
        let mut st = st.lock();
        let reply = handle(&req, &mut st, boot);
        st.seen.push((arrived, req, reply.0));
        reply
    };
    if status == 0 {
        return; // The reply is lost: the connection closes without one.
    }
    write_stub_reply(
        reader,
        status,
        &[("content-type".into(), "text/xml;charset=UTF-8".into())],
        &body,
    );
}
