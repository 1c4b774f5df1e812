//! Pure mapping between HTTP and Lambda events (issue 4; http-cases C19, C20): request
//! → event JSON in payload format 2.0, 1.0 or ALB, and function reply → HTTP response.
//! No I/O, no clock, no randomness: the caller passes the request id, the time and the
//! peer address, so every function here is deterministic and fuzzable.
//!
//! Guarantees:
//! * no request that hyper accepts makes the mapper panic (non-UTF-8 header values and
//!   query bytes are decoded lossily, U+FFFD for invalid sequences; proptest below);
//! * header names in events are lower-case (hyper does not keep the client's case);
//! * the event is at most [`MAX_PAYLOAD_BYTES`] long, else [`EventError::TooLarge`];
//! * replies: a missing or out-of-range `statusCode` (1.0, ALB), invalid JSON, a header
//!   that HTTP cannot carry or a bad base64 body are a [`ReplyError`] (the caller
//!   answers 502 and logs the detail); `cookies` and multi-value `Set-Cookie` become
//!   separate `Set-Cookie` lines, never comma-joined.
//!
//! `aws_lambda_events` types are used where they express the case: the 2.0 request and
//! the three reply shapes. Where they cannot, the JSON goes through `serde_json::Value`;
//! each such place says why.

use std::collections::HashMap;
use std::net::IpAddr;

use aws_lambda_events::alb::AlbTargetGroupResponse;
use aws_lambda_events::apigw::{
    ApiGatewayProxyResponse, ApiGatewayV2httpRequest, ApiGatewayV2httpRequestContext,
    ApiGatewayV2httpRequestContextHttpDescription, ApiGatewayV2httpResponse,
};
use aws_lambda_events::encodings::Body as EventBody;
use aws_lambda_events::query_map::QueryMap;
use base64::Engine as _;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use bytes::Bytes;
use http::{
    HeaderMap, HeaderName, HeaderValue, Method, Response, StatusCode, Uri, Version, header,
};
use serde_json::{Map, Value, json};

use crate::config::LambdaPayloadFormat;

/// Largest synchronous Invoke payload, bytes: 6 MiB = 6,291,456, measured on the JSON
/// event after base64. Larger requests get 413 before any invoke (issue 4).
pub const MAX_PAYLOAD_BYTES: usize = 6 * 1024 * 1024;

/// The `routeKey` and `stage` of every event: spillway has a single catch-all route, as
/// an HTTP API's `$default` stage and route.
pub const DEFAULT_STAGE: &str = "$default";

/// The `requestContext.apiId` (and ALB target group name) events carry.
pub const API_ID: &str = "spillway";

const STANDARD_LENIENT: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// One request, as the mapper needs it.
#[derive(Clone, Copy, Debug)]
pub struct EventInput<'a> {
    /// Method.
    pub method: &'a Method,
    /// Request target; its raw path and query go into the event as received.
    pub uri: &'a Uri,
    /// HTTP version, for `requestContext.http.protocol`.
    pub version: Version,
    /// Headers after the gateway's hygiene (hop-by-hop removed, `X-Forwarded-*` set).
    pub headers: &'a HeaderMap,
    /// The whole request body.
    pub body: &'a [u8],
    /// The real peer (`requestContext.http.sourceIp`), never the client's XFF (http-cases
    /// C8). `None` when unknown: the field is then null.
    pub source_ip: Option<IpAddr>,
    /// `requestContext.requestId`.
    pub request_id: &'a str,
    /// Request time, milliseconds since the Unix epoch (`timeEpoch`).
    pub time_epoch_ms: i64,
}

/// Why a request cannot become an event.
#[derive(Debug, thiserror::Error)]
pub enum EventError {
    /// The JSON event is over [`MAX_PAYLOAD_BYTES`] (client's fault: 413).
    #[error("event payload is {bytes} bytes, over the {MAX_PAYLOAD_BYTES}-byte Invoke limit")]
    TooLarge {
        /// Size of the event, bytes.
        bytes: usize,
    },
    /// Serialisation failed (should not happen: every string is valid UTF-8).
    #[error("cannot encode the event: {0}")]
    Encode(#[from] serde_json::Error),
}

/// Why a function reply is not a valid HTTP response (the gateway answers 502).
#[derive(Debug, thiserror::Error)]
pub enum ReplyError {
    /// The payload is not JSON.
    #[error("reply is not JSON: {0}")]
    NotJson(serde_json::Error),
    /// The JSON does not have the reply shape (missing `statusCode` in 1.0/ALB, a header
    /// value that is not a string or not a valid HTTP header…).
    #[error("reply does not have the {format} shape: {source}")]
    Shape {
        /// Payload format.
        format: &'static str,
        /// Cause.
        source: serde_json::Error,
    },
    /// `statusCode` is outside 200–599 (1xx cannot be a final response).
    #[error("reply statusCode {0} is not a final HTTP status (200-599)")]
    Status(i64),
    /// A cookie cannot be a `Set-Cookie` header value.
    #[error("reply cookie is not a valid header value")]
    Cookie,
    /// `isBase64Encoded` is true but `body` is not base64.
    #[error("reply body is not base64: {0}")]
    Base64(#[from] base64::DecodeError),
}

/// Build the event for `input` in `format`.
///
/// # Errors
/// [`EventError::TooLarge`] when the JSON is over [`MAX_PAYLOAD_BYTES`].
pub fn build_event(
    format: LambdaPayloadFormat,
    input: &EventInput<'_>,
) -> Result<Vec<u8>, EventError> {
    // Cheap early exit: base64 grows a body by 4/3, so a body whose encoded size alone is
    // over the limit is rejected without building anything.
    if input.body.len().div_ceil(3) * 4 > MAX_PAYLOAD_BYTES && !is_text(input) {
        return Err(EventError::TooLarge {
            bytes: input.body.len().div_ceil(3) * 4,
        });
    }
    let json = match format {
        LambdaPayloadFormat::V2 => serde_json::to_vec(&v2_event(input)?)?,
        LambdaPayloadFormat::V1 => serde_json::to_vec(&v1_event(input))?,
        LambdaPayloadFormat::Alb => serde_json::to_vec(&alb_event(input))?,
    };
    if json.len() > MAX_PAYLOAD_BYTES {
        return Err(EventError::TooLarge { bytes: json.len() });
    }
    Ok(json)
}

fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn path_of(uri: &Uri) -> &str {
    // Authority-form (CONNECT) targets have no path.
    match uri.path() {
        "" => "/",
        p => p,
    }
}

fn protocol(v: Version) -> &'static str {
    match v {
        Version::HTTP_09 => "HTTP/0.9",
        Version::HTTP_10 => "HTTP/1.0",
        Version::HTTP_2 => "HTTP/2.0",
        Version::HTTP_3 => "HTTP/3.0",
        _ => "HTTP/1.1",
    }
}

/// `%XX` decoding (no `+` → space: that is form encoding, not URI encoding); an invalid
/// escape stays as it is; invalid UTF-8 becomes U+FFFD.
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2]))
        {
            out.push(h << 4 | l);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    lossy(&out)
}

fn hex(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

/// Query parameters in order of appearance as `(key, value)`, raw or decoded. Empty
/// segments (`a&&b`) are skipped; `k` without `=` has the value "".
fn query_pairs(query: &str, decode: bool) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|seg| !seg.is_empty())
        .map(|seg| {
            let (k, v) = seg.split_once('=').unwrap_or((seg, ""));
            if decode {
                (percent_decode(k), percent_decode(v))
            } else {
                (k.to_owned(), v.to_owned())
            }
        })
        .collect()
}

/// Values grouped per key, each key's values in order; keys in order of first appearance.
fn group<'a>(pairs: impl IntoIterator<Item = (&'a str, String)>) -> Vec<(&'a str, Vec<String>)> {
    let mut out: Vec<(&str, Vec<String>)> = Vec::new();
    let mut index: HashMap<&str, usize> = HashMap::new();
    for (k, v) in pairs {
        match index.get(k) {
            Some(&i) => out[i].1.push(v),
            None => {
                index.insert(k, out.len());
                out.push((k, vec![v]));
            }
        }
    }
    out
}

/// Header values per (lower-case) name, decoded lossily, optionally without `cookie`.
fn header_groups(headers: &HeaderMap, skip_cookie: bool) -> Vec<(&str, Vec<String>)> {
    group(
        headers
            .iter()
            .filter(|(n, _)| !(skip_cookie && *n == header::COOKIE))
            .map(|(n, v)| (n.as_str(), lossy(v.as_bytes()))),
    )
}

fn header_str(headers: &HeaderMap, name: HeaderName) -> Option<String> {
    headers.get(name).map(|v| lossy(v.as_bytes()))
}

/// Whether the body goes as text: `text/*`, JSON or XML (`+json`, `+xml` too) and valid
/// UTF-8 (http-cases C19). Everything else is base64.
fn is_text(input: &EventInput<'_>) -> bool {
    let Some(ct) = input.headers.get(header::CONTENT_TYPE) else {
        return false;
    };
    let ct = lossy(ct.as_bytes());
    let essence = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let textual = essence.starts_with("text/")
        || matches!(
            essence.as_str(),
            "application/json" | "application/xml" | "application/javascript"
        )
        || essence.ends_with("+json")
        || essence.ends_with("+xml");
    textual && std::str::from_utf8(input.body).is_ok()
}

/// `(body, isBase64Encoded)`; `None` for an empty body.
fn encode_body(input: &EventInput<'_>) -> (Option<String>, bool) {
    if input.body.is_empty() {
        (None, false)
    } else if is_text(input) {
        (Some(lossy(input.body)), false)
    } else {
        (
            Some(base64::engine::general_purpose::STANDARD.encode(input.body)),
            true,
        )
    }
}

/// Payload format 2.0 (http-cases C19), built with `ApiGatewayV2httpRequest`.
fn v2_event(input: &EventInput<'_>) -> Result<Value, EventError> {
    let path = path_of(input.uri);
    let raw_query = input.uri.query().unwrap_or("");

    // The type's header serializer writes only the first value of a name, so duplicates
    // are joined here, with "," as API Gateway does, into one value per name.
    let mut headers = HeaderMap::new();
    for (name, values) in header_groups(input.headers, true) {
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(&values.join(",")),
        ) {
            headers.insert(n, v);
        }
    }
    // Every Cookie line is split into its pairs: `cookies` holds them, `headers` no
    // `cookie` key.
    let cookies: Vec<String> = input
        .headers
        .get_all(header::COOKIE)
        .iter()
        .flat_map(|v| {
            lossy(v.as_bytes())
                .split(';')
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect();
    let pairs = query_pairs(raw_query, true);
    let query: HashMap<String, Vec<String>> =
        group(pairs.iter().map(|(k, v)| (k.as_str(), v.clone())))
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect();
    let (body, is_base64_encoded) = encode_body(input);
    let host = header_str(input.headers, header::HOST);

    let mut http = ApiGatewayV2httpRequestContextHttpDescription::default();
    http.method = input.method.clone();
    http.path = Some(path.to_owned());
    http.protocol = Some(protocol(input.version).to_owned());
    http.source_ip = input.source_ip.map(|ip| ip.to_string());
    http.user_agent = header_str(input.headers, header::USER_AGENT);

    let mut ctx = ApiGatewayV2httpRequestContext::default();
    ctx.route_key = Some(DEFAULT_STAGE.to_owned());
    ctx.account_id = Some("anonymous".to_owned());
    ctx.stage = Some(DEFAULT_STAGE.to_owned());
    ctx.request_id = Some(input.request_id.to_owned());
    ctx.apiid = Some(API_ID.to_owned());
    ctx.domain_prefix = host
        .as_deref()
        .map(|h| h.split('.').next().unwrap_or(h).to_owned());
    ctx.domain_name = host;
    ctx.time_epoch = input.time_epoch_ms;
    ctx.http = http;

    let mut ev = ApiGatewayV2httpRequest::default();
    ev.version = Some("2.0".to_owned());
    ev.route_key = Some(DEFAULT_STAGE.to_owned());
    ev.raw_path = Some(path.to_owned());
    ev.raw_query_string = Some(raw_query.to_owned());
    ev.cookies = (!cookies.is_empty()).then_some(cookies);
    ev.headers = headers;
    ev.query_string_parameters = QueryMap::from(query);
    ev.request_context = ctx;
    ev.body = body;
    ev.is_base64_encoded = is_base64_encoded;

    // Through `Value` to drop what the type always writes but a 2.0 event never has:
    // the deprecated custom-authorizer fields (`httpMethod` would say GET for a POST).
    let mut value = serde_json::to_value(&ev)?;
    if let Value::Object(map) = &mut value {
        for key in [
            "type",
            "methodArn",
            "httpMethod",
            "identitySource",
            "authorizationToken",
            "resource",
        ] {
            map.remove(key);
        }
    }
    Ok(value)
}

/// Payload format 1.0. Built as `Value`: `ApiGatewayProxyRequest` serialises the first
/// value of a repeated query parameter into `queryStringParameters`, where API Gateway
/// (and http-cases C19) has the last.
fn v1_event(input: &EventInput<'_>) -> Value {
    let path = path_of(input.uri);
    let pairs = query_pairs(input.uri.query().unwrap_or(""), true);
    let (single_q, multi_q) =
        single_and_multi(group(pairs.iter().map(|(k, v)| (k.as_str(), v.clone()))));
    let (single_h, multi_h) = single_and_multi(header_groups(input.headers, false));
    let (body, is_base64_encoded) = encode_body(input);
    let method = input.method.as_str();
    json!({
        "resource": "/{proxy+}",
        "path": path,
        "httpMethod": method,
        "headers": single_h,
        "multiValueHeaders": multi_h,
        "queryStringParameters": single_q,
        "multiValueQueryStringParameters": multi_q,
        "pathParameters": { "proxy": path.trim_start_matches('/') },
        "stageVariables": Value::Null,
        "requestContext": {
            "accountId": "anonymous",
            "apiId": API_ID,
            "domainName": header_str(input.headers, header::HOST),
            "httpMethod": method,
            "path": path,
            "protocol": protocol(input.version),
            "requestId": input.request_id,
            "requestTimeEpoch": input.time_epoch_ms,
            "resourcePath": "/{proxy+}",
            "stage": DEFAULT_STAGE,
            "identity": {
                "sourceIp": input.source_ip.map(|ip| ip.to_string()),
                "userAgent": header_str(input.headers, header::USER_AGENT),
            },
        },
        "body": body,
        "isBase64Encoded": is_base64_encoded,
    })
}

/// ALB target-group event with multi-value headers off: the last value of a repeated
/// header or query parameter, query strings not decoded (as the ALB sends them). Built
/// as `Value` for the same last-value reason as [`v1_event`].
fn alb_event(input: &EventInput<'_>) -> Value {
    let pairs = query_pairs(input.uri.query().unwrap_or(""), false);
    let (single_q, _) = single_and_multi(group(pairs.iter().map(|(k, v)| (k.as_str(), v.clone()))));
    let (single_h, _) = single_and_multi(header_groups(input.headers, false));
    let (body, is_base64_encoded) = encode_body(input);
    json!({
        "requestContext": {
            "elb": {
                "targetGroupArn": format!("arn:aws:elasticloadbalancing:::targetgroup/{API_ID}/0")
            }
        },
        "httpMethod": input.method.as_str(),
        "path": path_of(input.uri),
        "queryStringParameters": single_q.unwrap_or_default(),
        "headers": single_h.unwrap_or_default(),
        "body": body.unwrap_or_default(),
        "isBase64Encoded": is_base64_encoded,
    })
}

/// `(last value per key, all values per key)`, both `None` when there are no keys (API
/// Gateway sends null, not `{}`).
fn single_and_multi(groups: Vec<(&str, Vec<String>)>) -> (Option<JsonMap>, Option<JsonMap>) {
    if groups.is_empty() {
        return (None, None);
    }
    let mut single = Map::new();
    let mut multi = Map::new();
    for (k, values) in groups {
        if let Some(last) = values.last() {
            single.insert(k.to_owned(), Value::String(last.clone()));
        }
        multi.insert(
            k.to_owned(),
            Value::Array(values.into_iter().map(Value::String).collect()),
        );
    }
    (Some(single), Some(multi))
}

type JsonMap = Map<String, Value>;

/// The parts every reply shape shares.
struct ReplyParts {
    status: i64,
    headers: HeaderMap,
    multi_value_headers: HeaderMap,
    cookies: Vec<String>,
    body: Option<EventBody>,
    is_base64_encoded: bool,
}

/// Turn a function's reply into the HTTP response (http-cases C20).
///
/// Format 2.0: a JSON object without `statusCode` (or any other JSON value) is the body
/// of a 200 `application/json` response, byte for byte, as API Gateway does.
///
/// # Errors
/// [`ReplyError`] for invalid JSON, a missing `statusCode` (1.0, ALB), a status outside
/// 200–599, an invalid header or cookie, or a bad base64 body.
pub fn build_response(
    format: LambdaPayloadFormat,
    payload: &[u8],
) -> Result<Response<Bytes>, ReplyError> {
    let value: Value = serde_json::from_slice(payload).map_err(ReplyError::NotJson)?;
    let shape = |source| ReplyError::Shape {
        format: format.as_str(),
        source,
    };
    let parts = match format {
        LambdaPayloadFormat::V2 => {
            let Value::Object(mut map) = value else {
                return Ok(json_passthrough(payload));
            };
            if !map.contains_key("statusCode") {
                return Ok(json_passthrough(payload));
            }
            // Through `Value`: `ApiGatewayV2httpResponse` requires `cookies`, which a 2.0
            // reply may leave out (or set to null).
            if map.get("cookies").is_none_or(Value::is_null) {
                map.insert("cookies".into(), Value::Array(Vec::new()));
            }
            let r: ApiGatewayV2httpResponse =
                serde_json::from_value(Value::Object(map)).map_err(shape)?;
            ReplyParts {
                status: r.status_code,
                headers: r.headers,
                multi_value_headers: r.multi_value_headers,
                cookies: r.cookies,
                body: r.body,
                is_base64_encoded: r.is_base64_encoded,
            }
        }
        LambdaPayloadFormat::V1 => {
            let r: ApiGatewayProxyResponse = serde_json::from_value(value).map_err(shape)?;
            ReplyParts {
                status: r.status_code,
                headers: r.headers,
                multi_value_headers: r.multi_value_headers,
                cookies: Vec::new(),
                body: r.body,
                is_base64_encoded: r.is_base64_encoded,
            }
        }
        LambdaPayloadFormat::Alb => {
            let r: AlbTargetGroupResponse = serde_json::from_value(value).map_err(shape)?;
            ReplyParts {
                status: r.status_code,
                headers: r.headers,
                multi_value_headers: r.multi_value_headers,
                cookies: Vec::new(),
                body: r.body,
                is_base64_encoded: r.is_base64_encoded,
            }
        }
    };
    assemble(parts)
}

fn json_passthrough(payload: &[u8]) -> Response<Bytes> {
    let mut resp = Response::new(Bytes::copy_from_slice(payload));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

fn assemble(p: ReplyParts) -> Result<Response<Bytes>, ReplyError> {
    let status = u16::try_from(p.status)
        .ok()
        .filter(|s| (200..=599).contains(s))
        .and_then(|s| StatusCode::from_u16(s).ok())
        .ok_or(ReplyError::Status(p.status))?;
    // API Gateway merges `headers` and `multiValueHeaders`; for a name in both, the
    // multi-value list wins.
    let mut headers = p.multi_value_headers;
    for name in p.headers.keys() {
        if !headers.contains_key(name) {
            for v in p.headers.get_all(name) {
                headers.append(name.clone(), v.clone());
            }
        }
    }
    for c in &p.cookies {
        let v = HeaderValue::from_str(c).map_err(|_| ReplyError::Cookie)?;
        headers.append(header::SET_COOKIE, v);
    }
    // Framing is the gateway's: the length comes from the decoded body.
    headers.remove(header::CONTENT_LENGTH);
    headers.remove(header::TRANSFER_ENCODING);
    let body = match p.body {
        Some(EventBody::Text(s)) if p.is_base64_encoded => {
            Bytes::from(STANDARD_LENIENT.decode(s.trim())?)
        }
        Some(EventBody::Text(s)) => Bytes::from(s),
        Some(EventBody::Binary(b)) => Bytes::from(b),
        _ => Bytes::new(),
    };
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    *resp.headers_mut() = headers;
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn c19_request() -> http::Request<Vec<u8>> {
        http::Request::post("/authorize?scope=openid%20profile&next=%2Fhome&a=1&a=2")
            .header("host", "api.example.com")
            .header("cookie", "s=1")
            .header("cookie", "t=2")
            .header("x-tag", "v1")
            .header("x-tag", "v2")
            .header("content-type", "application/octet-stream")
            .body(vec![0x1f, 0x8b, 0x08, 0x00, 0xff])
            .unwrap()
    }

    fn event(format: LambdaPayloadFormat, req: &http::Request<Vec<u8>>) -> Value {
        let input = EventInput {
            method: req.method(),
            uri: req.uri(),
            version: req.version(),
            headers: req.headers(),
            body: req.body(),
            source_ip: Some("192.0.2.7".parse().unwrap()),
            request_id: "req-1",
            time_epoch_ms: 1_700_000_000_000,
        };
        serde_json::from_slice(&build_event(format, &input).unwrap()).unwrap()
    }

    #[test]
    fn c19_v2_event_has_the_exact_values() {
        let ev = event(LambdaPayloadFormat::V2, &c19_request());
        assert_eq!(ev["version"], "2.0");
        assert_eq!(ev["routeKey"], "$default");
        assert_eq!(ev["rawPath"], "/authorize");
        assert_eq!(
            ev["rawQueryString"],
            "scope=openid%20profile&next=%2Fhome&a=1&a=2"
        );
        assert_eq!(
            ev["queryStringParameters"],
            json!({"scope": "openid profile", "next": "/home", "a": "1,2"})
        );
        assert_eq!(ev["cookies"], json!(["s=1", "t=2"]));
        assert!(ev["headers"].get("cookie").is_none(), "{}", ev["headers"]);
        assert_eq!(ev["headers"]["x-tag"], "v1,v2");
        assert_eq!(ev["headers"]["content-type"], "application/octet-stream");
        assert_eq!(ev["requestContext"]["http"]["method"], "POST");
        assert_eq!(ev["requestContext"]["http"]["path"], "/authorize");
        assert_eq!(ev["requestContext"]["http"]["sourceIp"], "192.0.2.7");
        assert_eq!(ev["requestContext"]["stage"], "$default");
        assert_eq!(ev["requestContext"]["requestId"], "req-1");
        assert_eq!(ev["requestContext"]["timeEpoch"], 1_700_000_000_000_i64);
        assert_eq!(ev["isBase64Encoded"], true);
        assert_eq!(ev["body"], "H4sIAP8=");
        for deprecated in ["httpMethod", "type", "methodArn"] {
            assert!(ev.get(deprecated).is_none(), "{deprecated} in a 2.0 event");
        }
        // Header names are lower-case.
        for name in ev["headers"].as_object().unwrap().keys() {
            assert_eq!(name, &name.to_ascii_lowercase());
        }
    }

    #[test]
    fn c19_v1_event_has_multi_values_and_last_value_query() {
        let ev = event(LambdaPayloadFormat::V1, &c19_request());
        assert_eq!(ev["httpMethod"], "POST");
        assert_eq!(ev["path"], "/authorize");
        assert_eq!(
            ev["multiValueQueryStringParameters"]["a"],
            json!(["1", "2"])
        );
        assert_eq!(ev["queryStringParameters"]["a"], "2");
        assert_eq!(ev["queryStringParameters"]["scope"], "openid profile");
        assert_eq!(ev["multiValueHeaders"]["x-tag"], json!(["v1", "v2"]));
        assert_eq!(ev["multiValueHeaders"]["cookie"], json!(["s=1", "t=2"]));
        assert_eq!(ev["headers"]["x-tag"], "v2");
        assert_eq!(ev["requestContext"]["identity"]["sourceIp"], "192.0.2.7");
        assert_eq!(ev["isBase64Encoded"], true);
        assert_eq!(ev["body"], "H4sIAP8=");
    }

    #[test]
    fn alb_event_keeps_the_raw_query_and_last_values() {
        let ev = event(LambdaPayloadFormat::Alb, &c19_request());
        assert_eq!(ev["httpMethod"], "POST");
        assert_eq!(ev["queryStringParameters"]["scope"], "openid%20profile");
        assert_eq!(ev["queryStringParameters"]["a"], "2");
        assert_eq!(ev["headers"]["x-tag"], "v2");
        assert_eq!(ev["body"], "H4sIAP8=");
        assert!(ev["requestContext"]["elb"]["targetGroupArn"].is_string());
    }

    #[test]
    fn text_bodies_are_sent_as_text_and_empty_bodies_are_absent() {
        let req = http::Request::put("/x")
            .header("content-type", "application/json; charset=utf-8")
            .body(br#"{"k":"v"}"#.to_vec())
            .unwrap();
        let ev = event(LambdaPayloadFormat::V2, &req);
        assert_eq!(ev["body"], r#"{"k":"v"}"#);
        assert_eq!(ev["isBase64Encoded"], false);
        let req = http::Request::get("/").body(Vec::new()).unwrap();
        let ev = event(LambdaPayloadFormat::V2, &req);
        assert!(ev.get("body").is_none());
        assert_eq!(ev["rawQueryString"], "");
        assert_eq!(ev["isBase64Encoded"], false);
        // Text type but not UTF-8: base64.
        let req = http::Request::post("/")
            .header("content-type", "text/plain")
            .body(vec![0xff, 0xfe])
            .unwrap();
        assert_eq!(
            event(LambdaPayloadFormat::V2, &req)["isBase64Encoded"],
            true
        );
    }

    #[test]
    fn payload_limit_counts_the_json_after_base64() {
        let headers = HeaderMap::new();
        let uri: Uri = "/".parse().unwrap();
        let input = |body: &'static [u8]| EventInput {
            method: &Method::POST,
            uri: &uri,
            version: Version::HTTP_11,
            headers: &headers,
            body,
            source_ip: None,
            request_id: "r",
            time_epoch_ms: 0,
        };
        // 4.5 MiB of binary is 6 MiB of base64, plus the envelope: over.
        let big: &'static [u8] = Box::leak(vec![0u8; MAX_PAYLOAD_BYTES / 4 * 3].into_boxed_slice());
        for f in [
            LambdaPayloadFormat::V2,
            LambdaPayloadFormat::V1,
            LambdaPayloadFormat::Alb,
        ] {
            assert!(matches!(
                build_event(f, &input(big)),
                Err(EventError::TooLarge { .. })
            ));
        }
        let fits: &'static [u8] = &big[..MAX_PAYLOAD_BYTES / 4 * 3 - 3000];
        let json = build_event(LambdaPayloadFormat::V2, &input(fits)).unwrap();
        assert!(json.len() <= MAX_PAYLOAD_BYTES);
    }

    fn reply(format: LambdaPayloadFormat, payload: &str) -> Response<Bytes> {
        build_response(format, payload.as_bytes()).unwrap()
    }

    #[test]
    fn c20a_cookies_become_separate_set_cookie_lines() {
        let r = reply(
            LambdaPayloadFormat::V2,
            r#"{"statusCode":200,"cookies":["sid=abc; Path=/; HttpOnly","flag=on; Path=/"],"headers":{"content-type":"text/plain"},"body":"ok"}"#,
        );
        assert_eq!(r.status(), 200);
        let cookies: Vec<_> = r.headers().get_all(header::SET_COOKIE).iter().collect();
        assert_eq!(cookies, ["sid=abc; Path=/; HttpOnly", "flag=on; Path=/"]);
        assert_eq!(r.headers()[header::CONTENT_TYPE], "text/plain");
        assert_eq!(&r.body()[..], b"ok");
    }

    #[test]
    fn c20b_multi_value_set_cookie_is_two_lines() {
        let r = reply(
            LambdaPayloadFormat::V1,
            r#"{"statusCode":200,"multiValueHeaders":{"Set-Cookie":["a=1","b=2"]},"body":""}"#,
        );
        let cookies: Vec<_> = r.headers().get_all(header::SET_COOKIE).iter().collect();
        assert_eq!(cookies, ["a=1", "b=2"]);
        assert!(r.body().is_empty());
    }

    #[test]
    fn c20c_base64_body_is_decoded() {
        let r = reply(
            LambdaPayloadFormat::V2,
            r#"{"statusCode":200,"isBase64Encoded":true,"headers":{"content-type":"image/png","content-length":"999"},"body":"iVBORw0KGgo="}"#,
        );
        assert_eq!(
            &r.body()[..],
            [0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A]
        );
        assert!(
            r.headers().get(header::CONTENT_LENGTH).is_none(),
            "framing is ours"
        );
        assert_eq!(r.headers()[header::CONTENT_TYPE], "image/png");
    }

    #[test]
    fn c20d_bad_replies_are_errors_and_v2_without_status_is_a_json_body() {
        for (f, p) in [
            (LambdaPayloadFormat::V2, "not json"),
            (LambdaPayloadFormat::V1, "{\"body\":\"x\"}"),
            (LambdaPayloadFormat::Alb, "{\"body\":\"x\"}"),
            (LambdaPayloadFormat::V2, "{\"statusCode\":99}"),
            (LambdaPayloadFormat::V1, "{\"statusCode\":99}"),
            (LambdaPayloadFormat::V2, "{\"statusCode\":600}"),
            (LambdaPayloadFormat::V2, "{\"statusCode\":null}"),
            (
                LambdaPayloadFormat::V2,
                "{\"statusCode\":200,\"headers\":{\"bad name\":\"x\"}}",
            ),
            (
                LambdaPayloadFormat::V2,
                "{\"statusCode\":200,\"cookies\":[\"a\\r\\nb\"]}",
            ),
            (
                LambdaPayloadFormat::V2,
                "{\"statusCode\":200,\"isBase64Encoded\":true,\"body\":\"!!\"}",
            ),
        ] {
            assert!(build_response(f, p.as_bytes()).is_err(), "{f:?} {p}");
        }
        let raw = r#"{"message":"hi","n":[1,2]}"#;
        let r = reply(LambdaPayloadFormat::V2, raw);
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()[header::CONTENT_TYPE], "application/json");
        assert_eq!(&r.body()[..], raw.as_bytes());
        assert_eq!(
            &reply(LambdaPayloadFormat::V2, "\"text\"").body()[..],
            b"\"text\""
        );
        // A 2.0 reply without cookies is fine.
        let r = reply(
            LambdaPayloadFormat::V2,
            r#"{"statusCode":201,"body":"made"}"#,
        );
        assert_eq!(r.status(), 201);
        // headers + multiValueHeaders merge; the multi-value list wins for a shared name.
        let r = reply(
            LambdaPayloadFormat::V1,
            r#"{"statusCode":200,"headers":{"x-a":"1","x-b":"h"},"multiValueHeaders":{"x-b":["m1","m2"]}}"#,
        );
        assert_eq!(r.headers()["x-a"], "1");
        let xb: Vec<_> = r.headers().get_all("x-b").iter().collect();
        assert_eq!(xb, ["m1", "m2"]);
    }

    /// Cross-check with the official adapter: `lambda_http` parses our 2.0 events back
    /// into the same request (issue 4, "Cross-check with a peer").
    #[test]
    fn lambda_http_reconstructs_our_v2_events() {
        let mut cases = vec![c19_request()];
        cases.push(
            http::Request::put("/items/42?x=%C3%A9t%C3%A9&y=")
                .header("host", "h.test:8080")
                .header("content-type", "application/json")
                .header("accept", "a/b")
                .header("accept", "c/d")
                .header("cookie", "a=1; b=2")
                .body(br#"{"name":"\u00e9"}"#.to_vec())
                .unwrap(),
        );
        cases.push(http::Request::delete("/").body(Vec::new()).unwrap());
        for req in cases {
            let input = EventInput {
                method: req.method(),
                uri: req.uri(),
                version: req.version(),
                headers: req.headers(),
                body: req.body(),
                source_ip: Some("10.1.2.3".parse().unwrap()),
                request_id: "r",
                time_epoch_ms: 1,
            };
            let json = build_event(LambdaPayloadFormat::V2, &input).unwrap();
            let parsed = lambda_http::request::from_str(std::str::from_utf8(&json).unwrap())
                .unwrap_or_else(|e| {
                    panic!(
                        "lambda_http rejects our event: {e}\n{}",
                        String::from_utf8_lossy(&json)
                    )
                });
            assert_eq!(parsed.method(), req.method());
            assert_eq!(parsed.uri().path(), req.uri().path());
            assert_eq!(parsed.uri().query(), req.uri().query());
            let body: &[u8] = parsed.body().as_ref();
            assert_eq!(body, &req.body()[..]);
            for name in req.headers().keys() {
                if name == header::COOKIE {
                    continue;
                }
                let ours: Vec<_> = req
                    .headers()
                    .get_all(name)
                    .iter()
                    .map(|v| v.to_str().unwrap().to_owned())
                    .collect();
                assert_eq!(parsed.headers()[name], ours.join(","), "{name}");
            }
            let cookies: Vec<_> = req
                .headers()
                .get_all(header::COOKIE)
                .iter()
                .map(|v| v.to_str().unwrap().to_owned())
                .collect();
            if cookies.is_empty() {
                assert!(parsed.headers().get(header::COOKIE).is_none());
            } else {
                // One `cookie` header joined with "; ": compare by value.
                assert_eq!(parsed.headers()[header::COOKIE], cookies.join("; "));
            }
        }
    }

    fn arb_request() -> impl Strategy<Value = Option<http::Request<Vec<u8>>>> {
        let token = "[!#$%&'*+.^_`|~0-9A-Za-z-]{1,12}";
        let path = proptest::collection::vec(
            prop_oneof![
                Just(b'/'),
                Just(b'%'),
                Just(b'?'),
                Just(b'&'),
                Just(b'='),
                Just(b'+'),
                Just(b';'),
                0x21u8..0x7f,
            ],
            0..40,
        );
        let header_value = proptest::collection::vec(
            prop_oneof![Just(b' '), Just(b'\t'), 0x21u8..0x7f, 0x80u8..=0xff],
            0..24,
        );
        let headers = proptest::collection::vec(
            (
                prop_oneof![
                    Just("cookie".to_string()),
                    Just("content-type".to_string()),
                    Just("x-forwarded-for".to_string()),
                    // No `host`: lambda_http itself unwraps the URL it builds from it.
                    "[a-z0-9-]{1,10}".prop_filter("not host", |n| n != "host"),
                ],
                header_value,
            ),
            0..8,
        );
        let body = proptest::collection::vec(any::<u8>(), 0..64);
        (token, path, headers, body).prop_map(|(method, path, headers, body)| {
            let mut target = b"/".to_vec();
            target.extend_from_slice(&path);
            let mut b = http::Request::builder()
                .method(method.as_bytes())
                .uri(Uri::from_maybe_shared(Bytes::from(target)).ok()?);
            for (n, v) in headers {
                b = b.header(
                    HeaderName::from_bytes(n.as_bytes()).ok()?,
                    HeaderValue::from_bytes(&v).ok()?,
                );
            }
            b.body(body).ok()
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// No request the HTTP layer accepts makes the mapper panic; every event is JSON
        /// that `lambda_http` accepts (2.0).
        #[test]
        fn mapper_never_panics(req in arb_request()) {
            let Some(req) = req else { return Ok(()) };
            let input = EventInput {
                method: req.method(),
                uri: req.uri(),
                version: req.version(),
                headers: req.headers(),
                body: req.body(),
                source_ip: Some("::1".parse().unwrap()),
                request_id: "r",
                time_epoch_ms: 0,
            };
            for f in [LambdaPayloadFormat::V2, LambdaPayloadFormat::V1, LambdaPayloadFormat::Alb] {
                let json = build_event(f, &input).unwrap();
                let v: Value = serde_json::from_slice(&json).unwrap();
                prop_assert!(v.is_object());
                if f == LambdaPayloadFormat::V2 {
                    let parsed = lambda_http::request::from_str(std::str::from_utf8(&json).unwrap());
                    prop_assert!(parsed.is_ok(), "{:?}", parsed.err());
                }
            }
        }

        /// No reply payload makes the reply mapper panic.
        #[test]
        fn reply_mapper_never_panics(
            raw in proptest::collection::vec(any::<u8>(), 0..64),
            status in any::<i64>(),
            header in "[ -~]{0,8}",
            value in "\\PC{0,8}",
            b64 in any::<bool>(),
            body in "\\PC{0,16}",
        ) {
            for f in [LambdaPayloadFormat::V2, LambdaPayloadFormat::V1, LambdaPayloadFormat::Alb] {
                let _ = build_response(f, &raw);
                let structured = json!({
                    "statusCode": status,
                    "headers": { (header.clone()): value.clone() },
                    "multiValueHeaders": { (header.clone()): [value.clone()] },
                    "cookies": [value.clone()],
                    "isBase64Encoded": b64,
                    "body": body.clone(),
                });
                let _ = build_response(f, structured.to_string().as_bytes());
            }
        }
    }
}
