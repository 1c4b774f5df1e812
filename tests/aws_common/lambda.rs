//! Lambda parts of the AWS harness: moto's Lambda control API and a scripted
//! stub of the Lambda REST API for what moto cannot answer (`X-Amz-Function-Error`,
//! 429 TooManyRequestsException, access denied, delays, provisioned concurrency).
//!
//! Each test that uses moto's Lambda starts its own [`Moto`]: the simple backend's reply
//! queue is per moto process, so tests stay independent and can run in parallel.

use parking_lot::Mutex;
use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

pub(crate) use super::StubRequest;
use super::{Moto, REGION, poll, read_stub_request, write_stub_reply};

/// moto's default account.
pub(crate) const ACCOUNT: &str = "123456789012";

/// A zip holding `lambda_function.py` (`def handler(event, context): return event`);
/// moto without Docker stores it and never runs it.
pub(crate) const HANDLER_ZIP_BASE64: &str = "UEsDBBQAAAAAAAAAIVC0CHBpLgAAAC4AAAASAAAAbGFtYmRhX2Z1bmN0aW9uLnB5ZGVmIGhhbmRsZXIoZXZlbnQsIGNvbnRleHQpOgogICAgcmV0dXJuIGV2ZW50ClBLAQIUAxQAAAAAAAAAIVC0CHBpLgAAAC4AAAASAAAAAAAAAAAAAACAAQAAAABsYW1iZGFfZnVuY3Rpb24ucHlQSwUGAAAAAAEAAQBAAAAAXgAAAAAA";

/// One HTTP/1.1 request with extra headers to moto; `(status, body)`.
fn call(
    moto: &Moto,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, Vec<u8>) {
    let mut s = TcpStream::connect(moto.addr).expect("connect to moto");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nContent-Length: {}\r\n",
        moto.addr,
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    let end = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("moto reply head");
    let status = String::from_utf8_lossy(&buf[..end])
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("moto status");
    (status, buf[end + 4..].to_vec())
}

/// An AWS API call to moto, routed by the (unchecked) SigV4 credential scope.
pub(crate) fn api(
    moto: &Moto,
    service: &str,
    method: &str,
    path: &str,
    content_type: &str,
    body: &[u8],
) -> (u16, Vec<u8>) {
    let auth = format!(
        "AWS4-HMAC-SHA256 Credential=testing/20250101/{REGION}/{service}/aws4_request, SignedHeaders=host, Signature=0"
    );
    call(
        moto,
        method,
        path,
        &[("Authorization", &auth), ("Content-Type", content_type)],
        body,
    )
}

fn post_json(moto: &Moto, path: &str, doc: &Value) -> (u16, Vec<u8>) {
    call(
        moto,
        "POST",
        path,
        &[("Content-Type", "application/json")],
        doc.to_string().as_bytes(),
    )
}

/// Run moto's Lambda without Docker (`POST /moto-api/config`): Invoke then answers from
/// the simple-backend reply queue, or echoes the event when the queue is empty.
pub(crate) fn lambda_without_docker(moto: &Moto) {
    let (code, body) = post_json(
        moto,
        "/moto-api/config",
        &json!({"lambda": {"use_docker": false}}),
    );
    assert!(
        (200..300).contains(&code),
        "{code} {}",
        String::from_utf8_lossy(&body)
    );
}

/// Queue Invoke replies (`POST /moto-api/static/lambda-simple/response`), used in order.
pub(crate) fn queue_lambda_replies(moto: &Moto, replies: &[&str]) {
    let (code, body) = post_json(
        moto,
        "/moto-api/static/lambda-simple/response",
        &json!({"results": replies, "region": REGION}),
    );
    assert_eq!(code, 201, "{}", String::from_utf8_lossy(&body));
}

/// IAM CreateRole (Query API); returns the role ARN that CreateFunction needs.
pub(crate) fn create_role(moto: &Moto, name: &str) -> String {
    let policy = r#"{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":{"Service":"lambda.amazonaws.com"},"Action":"sts:AssumeRole"}]}"#;
    let form = format!(
        "Action=CreateRole&Version=2010-05-08&RoleName={name}&AssumeRolePolicyDocument={}",
        form_encode(policy)
    );
    let (code, body) = api(
        moto,
        "iam",
        "POST",
        "/",
        "application/x-www-form-urlencoded",
        form.as_bytes(),
    );
    assert_eq!(code, 200, "CreateRole: {}", String::from_utf8_lossy(&body));
    format!("arn:aws:iam::{ACCOUNT}:role/{name}")
}

/// Lambda CreateFunction (published as version 1).
pub(crate) fn create_function(moto: &Moto, name: &str, role_arn: &str) {
    let doc = json!({
        "FunctionName": name,
        "Runtime": "python3.12",
        "Role": role_arn,
        "Handler": "lambda_function.handler",
        "Code": { "ZipFile": HANDLER_ZIP_BASE64 },
        "Publish": true,
    });
    let (code, body) = api(
        moto,
        "lambda",
        "POST",
        "/2015-03-31/functions",
        "application/json",
        doc.to_string().as_bytes(),
    );
    assert_eq!(
        code,
        201,
        "CreateFunction: {}",
        String::from_utf8_lossy(&body)
    );
}

/// A moto with Lambda running without Docker, an IAM role and the function `name`.
pub(crate) fn moto_with_function(name: &str) -> Moto {
    let moto = Moto::start();
    lambda_without_docker(&moto);
    let role = create_role(&moto, "spillway-test-role");
    create_function(&moto, name, &role);
    moto
}

fn form_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// One scripted Invoke reply of an [`InvokeStub`].
#[derive(Clone, Debug)]
pub(crate) struct InvokeReply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
    /// Wait this long before answering (the stub's own pacing, not a test wait).
    pub delay: Duration,
}

impl InvokeReply {
    /// A successful Invoke returning `payload`.
    pub(crate) fn ok(payload: &str) -> InvokeReply {
        InvokeReply {
            status: 200,
            headers: vec![("X-Amz-Executed-Version".into(), "1".into())],
            body: payload.into(),
            delay: Duration::ZERO,
        }
    }

    /// The function failed (`X-Amz-Function-Error: Unhandled`).
    pub(crate) fn function_error(message: &str) -> InvokeReply {
        InvokeReply {
            status: 200,
            headers: vec![("X-Amz-Function-Error".into(), "Unhandled".into())],
            body: json!({"errorMessage": message, "errorType": "Exception"}).to_string(),
            delay: Duration::ZERO,
        }
    }

    /// An API error (`x-amzn-ErrorType: <code>`).
    pub(crate) fn api_error(status: u16, code: &str, message: &str) -> InvokeReply {
        InvokeReply {
            status,
            headers: vec![
                ("x-amzn-ErrorType".into(), code.into()),
                ("Content-Type".into(), "application/json".into()),
            ],
            body: json!({"Type": "User", "message": message}).to_string(),
            delay: Duration::ZERO,
        }
    }

    /// 429 TooManyRequestsException.
    pub(crate) fn throttled() -> InvokeReply {
        InvokeReply::api_error(
            429,
            "TooManyRequestsException",
            "Rate Exceeded. (Reason: ReservedFunctionConcurrentInvocationLimitExceeded)",
        )
    }

    /// The same reply, after `delay`.
    pub(crate) fn after(mut self, delay: Duration) -> InvokeReply {
        self.delay = delay;
        self
    }
}

#[derive(Default)]
struct StubState {
    script: VecDeque<InvokeReply>,
    /// GetProvisionedConcurrencyConfig answers: `(Status, StatusReason)`, in order; the
    /// last one repeats. Empty: `READY`.
    pc_statuses: VecDeque<(String, String)>,
    /// The requested executions of the last Put.
    pc_requested: u64,
    seen: Vec<StubRequest>,
}

/// A local stub of the Lambda REST API: Invoke
/// (`POST /2015-03-31/functions/{name}/invocations`) answers the scripted replies, then
/// `default`; Put/Get/DeleteProvisionedConcurrencyConfig
/// (`PUT`/`GET`/`DELETE /2019-09-30/functions/{name}/provisioned-concurrency`) succeed,
/// Put with `IN_PROGRESS`, Get with the scripted statuses ([`InvokeStub::pc_statuses`]);
/// anything else is a 404 ResourceNotFoundException. Every call is recorded.
pub(crate) struct InvokeStub {
    /// The listen address.
    pub addr: SocketAddr,
    state: Arc<Mutex<StubState>>,
}

impl InvokeStub {
    /// Start the stub on a free loopback port (a thread per connection, one request per
    /// connection, `Connection: close`).
    pub(crate) fn start(default: InvokeReply) -> InvokeStub {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(StubState::default()));
        let st = Arc::clone(&state);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let st = Arc::clone(&st);
                let default = default.clone();
                std::thread::spawn(move || serve_one(stream, &st, &default));
            }
        });
        InvokeStub { addr, state }
    }

    /// `http://ADDR`.
    pub(crate) fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Answer the next Invoke calls with `replies`, in order.
    pub(crate) fn script(&self, replies: impl IntoIterator<Item = InvokeReply>) {
        self.state.lock().script.extend(replies);
    }

    /// Answer GetProvisionedConcurrencyConfig with these `(Status, StatusReason)` in
    /// order, the last one repeating.
    pub(crate) fn pc_statuses(&self, statuses: &[(&str, &str)]) {
        self.state.lock().pc_statuses = statuses
            .iter()
            .map(|(s, r)| (s.to_string(), r.to_string()))
            .collect();
    }

    /// Every call so far (recorded once answered).
    pub(crate) fn calls(&self) -> Vec<StubRequest> {
        self.state.lock().seen.clone()
    }

    /// Invoke calls so far.
    pub(crate) fn invocations(&self) -> Vec<StubRequest> {
        self.calls()
            .into_iter()
            .filter(|c| {
                c.method == "POST"
                    && c.target
                        .split('?')
                        .next()
                        .unwrap_or("")
                        .ends_with("/invocations")
            })
            .collect()
    }

    /// Poll until a call matches `pred`; returns it.
    pub(crate) fn wait_call(
        &self,
        what: &str,
        within: Duration,
        pred: impl Fn(&StubRequest) -> bool,
    ) -> StubRequest {
        poll(what, within, || self.calls().into_iter().find(|c| pred(c)))
    }
}

/// The reply to one request (see [`InvokeStub`]).
fn reply_to(req: &StubRequest, st: &Mutex<StubState>, default: &InvokeReply) -> InvokeReply {
    let path = req.target.split('?').next().unwrap_or("");
    if req.method == "POST"
        && path.starts_with("/2015-03-31/functions/")
        && path.ends_with("/invocations")
    {
        return st
            .lock()
            .script
            .pop_front()
            .unwrap_or_else(|| default.clone());
    }
    if !(path.starts_with("/2019-09-30/functions/") && path.ends_with("/provisioned-concurrency")) {
        return InvokeReply::api_error(
            404,
            "ResourceNotFoundException",
            "no such route in the stub",
        );
    }
    match req.method.as_str() {
        "PUT" => {
            let n = serde_json::from_slice::<Value>(&req.body)
                .ok()
                .and_then(|v| v["ProvisionedConcurrentExecutions"].as_u64())
                .unwrap_or(0);
            st.lock().pc_requested = n;
            InvokeReply {
                status: 202,
                headers: vec![("Content-Type".into(), "application/json".into())],
                body: json!({
                    "RequestedProvisionedConcurrentExecutions": n,
                    "AvailableProvisionedConcurrentExecutions": 0,
                    "AllocatedProvisionedConcurrentExecutions": 0,
                    "Status": "IN_PROGRESS",
                    "LastModified": "2025-01-01T00:00:00+0000"
                })
                .to_string(),
                delay: Duration::ZERO,
            }
        }
        "GET" => {
            let mut st = st.lock();
            let (status, reason) = if st.pc_statuses.len() > 1 {
                st.pc_statuses.pop_front().unwrap()
            } else {
                st.pc_statuses
                    .front()
                    .cloned()
                    .unwrap_or(("READY".into(), String::new()))
            };
            let n = st.pc_requested;
            let allocated = if status == "READY" { n } else { 0 };
            let mut body = json!({
                "RequestedProvisionedConcurrentExecutions": n,
                "AvailableProvisionedConcurrentExecutions": allocated,
                "AllocatedProvisionedConcurrentExecutions": allocated,
                "Status": status,
                "LastModified": "2025-01-01T00:00:00+0000"
            });
            if !reason.is_empty() {
                body["StatusReason"] = Value::from(reason);
            }
            InvokeReply {
                status: 200,
                headers: vec![("Content-Type".into(), "application/json".into())],
                body: body.to_string(),
                delay: Duration::ZERO,
            }
        }
        "DELETE" => InvokeReply {
            status: 204,
            headers: vec![],
            body: String::new(),
            delay: Duration::ZERO,
        },
        _ => InvokeReply::api_error(405, "InvalidRequestContentException", "method"),
    }
}

fn serve_one(stream: TcpStream, st: &Mutex<StubState>, default: &InvokeReply) {
    let Some((req, reader)) = read_stub_request(stream) else {
        return;
    };
    let reply = reply_to(&req, st, default);
    if !reply.delay.is_zero() {
        std::thread::sleep(reply.delay);
    }
    // Recorded before the reply goes out: a caller that has the reply sees the call.
    st.lock().seen.push(req);
    write_stub_reply(reader, reply.status, &reply.headers, reply.body.as_bytes());
}
