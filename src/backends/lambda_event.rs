//! Pure mapping between HTTP and Lambda events (http-cases C19, C20): request
//! → event JSON in payload format 2.0, 1.0 or ALB, and function reply → HTTP response.
//! No I/O, no clock, no randomness: the caller passes the request id, the time and the
//! peer address, so every function here is deterministic and fuzzable.
//!
//! Guarantees:
//! * no request that hyper accepts makes the mapper panic (non-UTF-8 header values and
//!   query bytes are decoded lossily, U+FFFD for invalid sequences; proptest below);
//! * header names in events are lower-case (hyper does not keep the client's case);
//! * the event is at most [`MAX_PAYLOAD_BYTES`] long, else [`EventError::TooLarge`];
//! * every event has the fields AWS Lambda Powertools' parser models require
//!   (`APIGatewayProxyEventV2Model`, `APIGatewayProxyEventModel`, `AlbModel`):
//!   the formatted request time (`requestContext.time` in 2.0,
//!   `requestContext.requestTime` in 1.0, `dd/Mon/yyyy:HH:mm:ss +0000`), a user agent
//!   that is `""` (never null) without a client `User-Agent`, a `domainName` (the `Host`
//!   header or the request target's authority without the port, else `localhost`), and
//!   `headers` objects that are `{}`, never null. `tests/aws_lambda.rs` validates a corpus
//!   of odd requests against those models with `scripts/validate_lambda_events.py`;
//! * replies ([`build_response`]): the shapes API Gateway and the ALB accept, see there.
//!
//! **Query decoding, per payload format** (as API Gateway and the ALB do it):
//!
//! | field | 2.0 (HTTP API) | 1.0 (REST API) | ALB |
//! |---|---|---|---|
//! | raw query | `rawQueryString`: exactly as received | — | — |
//! | `queryStringParameters` | `%XX` and `+` (space) decoded; a repeated key's values joined with `,` in order; absent when the query is empty | decoded the same way; the **last** value of a repeated key; `null` when the query is empty | **not decoded** (the ALB passes the bytes as received); the last value of a repeated key; `{}` when empty |
//! | `multiValueQueryStringParameters` | — | every value of each key, in order, decoded; `null` when empty | — (multi-value headers off) |
//!
//! In every format a key without `=` has the value `""`, empty segments (`a&&b`) are
//! skipped, an invalid `%` escape stays as it is, and decoded bytes that are not UTF-8
//! become U+FFFD. Keys are decoded like values. Paths (`rawPath`, `path`) are not decoded.
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
/// event after base64. Larger requests get 413 before any invoke.
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
    /// A header value is null, an object, or (in `headers`) a list: only strings,
    /// numbers and booleans are header values.
    #[error("reply header {0:?} has a value that is not a string, number or boolean")]
    HeaderValue(String),
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

/// Query parameters in order of appearance as `(key, value)`. `decode`: the
/// `application/x-www-form-urlencoded` parser API Gateway applies (`+` is a space, `%XX`
/// decoded, an invalid escape kept, invalid UTF-8 → U+FFFD; `form_urlencoded`); else the
/// bytes as received (the ALB). Either way empty segments (`a&&b`) are skipped and `k`
/// without `=` has the value "".
fn query_pairs(query: &str, decode: bool) -> Vec<(String, String)> {
    if decode {
        return form_urlencoded::parse(query.as_bytes())
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
    }
    query
        .split('&')
        .filter(|seg| !seg.is_empty())
        .map(|seg| {
            let (k, v) = seg.split_once('=').unwrap_or((seg, ""));
            (k.to_owned(), v.to_owned())
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

/// `requestContext.domainName`: the `Host` header, else the request target's authority
/// (HTTP/2 carries it there), without the port; `localhost` when neither names a host.
fn domain_name(input: &EventInput<'_>) -> String {
    header_str(input.headers, header::HOST)
        .or_else(|| input.uri.authority().map(|a| a.as_str().to_owned()))
        .and_then(|h| h.parse::<http::uri::Authority>().ok())
        .map(|a| a.host().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}

/// `requestContext.domainPrefix`: the first label of the domain name.
fn domain_prefix(domain: &str) -> String {
    domain.split('.').next().unwrap_or(domain).to_owned()
}

/// The request time as API Gateway formats it in `requestContext.time` (2.0) and
/// `requestContext.requestTime` (1.0): `dd/Mon/yyyy:HH:mm:ss +0000` in UTC, e.g.
/// `14/Nov/2023:22:13:20 +0000` for `epoch_ms` = 1,700,000,000,000 ms since the Unix
/// epoch. A value outside the years −9999..=9999 is shown as the epoch.
pub fn request_time(epoch_ms: i64) -> String {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let t = time::OffsetDateTime::from_unix_timestamp(epoch_ms.div_euclid(1000))
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    format!(
        "{:02}/{}/{:04}:{:02}:{:02}:{:02} +0000",
        t.day(),
        MONTHS[usize::from(u8::from(t.month())) - 1],
        t.year(),
        t.hour(),
        t.minute(),
        t.second()
    )
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
    let domain = domain_name(input);

    let mut http = ApiGatewayV2httpRequestContextHttpDescription::default();
    http.method = input.method.clone();
    http.path = Some(path.to_owned());
    http.protocol = Some(protocol(input.version).to_owned());
    http.source_ip = input.source_ip.map(|ip| ip.to_string());
    http.user_agent = Some(header_str(input.headers, header::USER_AGENT).unwrap_or_default());

    let mut ctx = ApiGatewayV2httpRequestContext::default();
    ctx.route_key = Some(DEFAULT_STAGE.to_owned());
    ctx.account_id = Some("anonymous".to_owned());
    ctx.stage = Some(DEFAULT_STAGE.to_owned());
    ctx.request_id = Some(input.request_id.to_owned());
    ctx.apiid = Some(API_ID.to_owned());
    ctx.domain_prefix = Some(domain_prefix(&domain));
    ctx.domain_name = Some(domain);
    ctx.time = Some(request_time(input.time_epoch_ms));
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
    // Also: no `queryStringParameters` without a query (API Gateway leaves it out), and
    // `headers` always an object.
    let mut value = serde_json::to_value(&ev)?;
    if let Value::Object(map) = &mut value {
        if pairs.is_empty() {
            map.remove("queryStringParameters");
        }
        if !map.get("headers").is_some_and(Value::is_object) {
            map.insert("headers".into(), Value::Object(Map::new()));
        }
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
    // `headers` and `multiValueHeaders` are objects even when empty (never null).
    let (single_h, multi_h) = single_and_multi(header_groups(input.headers, false));
    let (body, is_base64_encoded) = encode_body(input);
    let method = input.method.as_str();
    let domain = domain_name(input);
    json!({
        "resource": "/{proxy+}",
        "path": path,
        "httpMethod": method,
        "headers": single_h.unwrap_or_default(),
        "multiValueHeaders": multi_h.unwrap_or_default(),
        "queryStringParameters": single_q,
        "multiValueQueryStringParameters": multi_q,
        "pathParameters": { "proxy": path.trim_start_matches('/') },
        "stageVariables": Value::Null,
        "requestContext": {
            "accountId": "anonymous",
            "apiId": API_ID,
            "domainPrefix": domain_prefix(&domain),
            "domainName": domain,
            "httpMethod": method,
            "path": path,
            "protocol": protocol(input.version),
            "requestId": input.request_id,
            "requestTime": request_time(input.time_epoch_ms),
            "requestTimeEpoch": input.time_epoch_ms,
            "resourcePath": "/{proxy+}",
            "stage": DEFAULT_STAGE,
            "identity": {
                "sourceIp": input.source_ip.map(|ip| ip.to_string()),
                "userAgent": header_str(input.headers, header::USER_AGENT).unwrap_or_default(),
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
/// In every format the reply shapes API Gateway and the ALB accept are accepted (see
/// `normalize_reply`): `statusCode` as a decimal string (`"201"`), header
/// values that are numbers or booleans, a missing or null `body`, `headers`,
/// `multiValueHeaders` or `cookies`, and `multiValueHeaders` values that are a single
/// value or lists of numbers and booleans.
///
/// # Errors
/// [`ReplyError`] for invalid JSON, a missing `statusCode` (1.0, ALB), a status that is
/// not a number or a decimal string, a status outside 200–599, a header value that is
/// null, an object or (outside `multiValueHeaders`) a list, a header or cookie HTTP
/// cannot carry, or a bad base64 body.
pub fn build_response(
    format: LambdaPayloadFormat,
    payload: &[u8],
) -> Result<Response<Bytes>, ReplyError> {
    let mut value: Value = serde_json::from_slice(payload).map_err(ReplyError::NotJson)?;
    if let Value::Object(map) = &mut value
        && map.contains_key("statusCode")
    {
        normalize_reply(map)?;
    }
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

/// Bring the reply shapes API Gateway and the ALB accept into the form the
/// `aws_lambda_events` types read:
/// * `statusCode` that is a string of 1–18 ASCII digits → that number;
/// * `headers`, `multiValueHeaders`, `cookies` or `body` that is null → absent;
/// * a `headers` value that is a number or a boolean → its JSON text (`3` → `"3"`,
///   `true` → `"true"`);
/// * a `multiValueHeaders` value that is a string, number or boolean → a one-element
///   list of its text; numbers and booleans inside a list → their text.
///
/// # Errors
/// [`ReplyError::HeaderValue`] for a `headers` value that is null, a list or an object,
/// or a `multiValueHeaders` value (or list item) that is null or an object. Anything
/// else that does not fit is left as it is, for the typed parser to reject.
fn normalize_reply(map: &mut JsonMap) -> Result<(), ReplyError> {
    fn text(v: &Value) -> Option<String> {
        match v {
            Value::String(s) => Some(s.clone()),
            Value::Number(_) | Value::Bool(_) => Some(v.to_string()),
            _ => None,
        }
    }
    if let Some(Value::String(s)) = map.get("statusCode")
        && (1..=18).contains(&s.len())
        && s.bytes().all(|b| b.is_ascii_digit())
        && let Ok(n) = s.parse::<i64>()
    {
        map.insert("statusCode".into(), Value::from(n));
    }
    for key in ["headers", "multiValueHeaders", "cookies", "body"] {
        if map.get(key).is_some_and(Value::is_null) {
            map.remove(key);
        }
    }
    let bad = |name: &str| ReplyError::HeaderValue(name.to_owned());
    if let Some(Value::Object(headers)) = map.get_mut("headers") {
        for (name, v) in headers.iter_mut() {
            *v = Value::String(text(v).ok_or_else(|| bad(name))?);
        }
    }
    if let Some(Value::Object(headers)) = map.get_mut("multiValueHeaders") {
        for (name, v) in headers.iter_mut() {
            let items = match &*v {
                Value::Array(items) => items
                    .iter()
                    .map(|item| text(item).map(Value::String).ok_or_else(|| bad(name)))
                    .collect::<Result<Vec<_>, _>>()?,
                other => vec![Value::String(text(other).ok_or_else(|| bad(name))?)],
            };
            *v = Value::Array(items);
        }
    }
    Ok(())
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

    const FORMATS: [LambdaPayloadFormat; 3] = [
        LambdaPayloadFormat::V2,
        LambdaPayloadFormat::V1,
        LambdaPayloadFormat::Alb,
    ];

    /// The reply shapes API Gateway and the ALB accept, in every format.
    #[test]
    fn lenient_reply_shapes_are_accepted_in_every_format() {
        for f in FORMATS {
            let r = reply(f, r#"{"statusCode":"201","body":"made"}"#);
            assert_eq!(
                (r.status(), &r.body()[..]),
                (StatusCode::CREATED, &b"made"[..]),
                "{f:?}"
            );
            let r = reply(f, r#"{"statusCode":"0404"}"#);
            assert_eq!(r.status(), StatusCode::NOT_FOUND, "{f:?}");
            // Numbers and booleans as header values are their JSON text.
            let r = reply(
                f,
                r#"{"statusCode":200,"headers":{"x-count":3,"x-ratio":0.5,"x-ok":true},"body":"b"}"#,
            );
            assert_eq!(r.headers()["x-count"], "3", "{f:?}");
            assert_eq!(r.headers()["x-ratio"], "0.5", "{f:?}");
            assert_eq!(r.headers()["x-ok"], "true", "{f:?}");
            // No body, no headers: an empty body and no header.
            let r = reply(f, r#"{"statusCode":204}"#);
            assert_eq!(r.status(), StatusCode::NO_CONTENT, "{f:?}");
            assert!(r.body().is_empty() && r.headers().is_empty(), "{f:?}");
            let r = reply(
                f,
                r#"{"statusCode":200,"headers":null,"multiValueHeaders":null,"cookies":null,"body":null}"#,
            );
            assert_eq!(r.status(), StatusCode::OK, "{f:?}");
            assert!(r.body().is_empty() && r.headers().is_empty(), "{f:?}");
            // multiValueHeaders values that are not lists of strings.
            let r = reply(
                f,
                r#"{"statusCode":200,"multiValueHeaders":{"x-one":"v","x-n":7,"x-list":[1,false,"s"]}}"#,
            );
            let all = |n: &str| -> Vec<&str> {
                r.headers()
                    .get_all(n)
                    .iter()
                    .map(|v| v.to_str().unwrap())
                    .collect()
            };
            assert_eq!(all("x-one"), ["v"], "{f:?}");
            assert_eq!(all("x-n"), ["7"], "{f:?}");
            assert_eq!(all("x-list"), ["1", "false", "s"], "{f:?}");
        }
    }

    /// Everything outside those shapes stays a bad reply (502).
    #[test]
    fn other_reply_shapes_stay_errors_in_every_format() {
        for f in FORMATS {
            for p in [
                r#"{"statusCode":"20x","body":"b"}"#,
                r#"{"statusCode":" 201"}"#,
                r#"{"statusCode":"201.0"}"#,
                r#"{"statusCode":"-201"}"#,
                r#"{"statusCode":""}"#,
                r#"{"statusCode":"099"}"#,
                r#"{"statusCode":"600"}"#,
                r#"{"statusCode":"99999999999999999999"}"#,
                r#"{"statusCode":201.5}"#,
                r#"{"statusCode":true}"#,
                r#"{"statusCode":[200]}"#,
                r#"{"statusCode":200,"headers":{"x":null}}"#,
                r#"{"statusCode":200,"headers":{"x":["a","b"]}}"#,
                r#"{"statusCode":200,"headers":{"x":{"a":1}}}"#,
                r#"{"statusCode":200,"headers":"x: y"}"#,
                r#"{"statusCode":200,"multiValueHeaders":{"x":null}}"#,
                r#"{"statusCode":200,"multiValueHeaders":{"x":[null]}}"#,
                r#"{"statusCode":200,"multiValueHeaders":{"x":[["a"]]}}"#,
                r#"{"statusCode":200,"multiValueHeaders":{"x":{"a":"b"}}}"#,
                r#"{"statusCode":200,"isBase64Encoded":"true","body":"aGk="}"#,
                r#"{"statusCode":200,"body":{"json":"object"}}"#,
            ] {
                assert!(build_response(f, p.as_bytes()).is_err(), "{f:?} {p}");
            }
            if f != LambdaPayloadFormat::V2 {
                assert!(build_response(f, br#"{"body":"no status"}"#).is_err());
            }
        }
    }

    fn input_for<'a>(req: &'a http::Request<Vec<u8>>, source_ip: Option<IpAddr>) -> EventInput<'a> {
        EventInput {
            method: req.method(),
            uri: req.uri(),
            version: req.version(),
            headers: req.headers(),
            body: req.body(),
            source_ip,
            request_id: "req-1",
            time_epoch_ms: 1_700_000_000_123,
        }
    }

    fn event_of(format: LambdaPayloadFormat, req: &http::Request<Vec<u8>>) -> Value {
        let json =
            build_event(format, &input_for(req, Some("192.0.2.7".parse().unwrap()))).unwrap();
        serde_json::from_slice(&json).unwrap()
    }

    #[test]
    fn request_time_is_formatted_as_api_gateway_does() {
        assert_eq!(
            request_time(1_700_000_000_123),
            "14/Nov/2023:22:13:20 +0000"
        );
        assert_eq!(request_time(0), "01/Jan/1970:00:00:00 +0000");
        assert_eq!(request_time(-1), "31/Dec/1969:23:59:59 +0000");
        assert_eq!(request_time(951_782_400_000), "29/Feb/2000:00:00:00 +0000");
        assert_eq!(request_time(i64::MAX), "01/Jan/1970:00:00:00 +0000");
    }

    /// The formatted time, a user agent that is never null, a domain
    /// name and header objects in every event.
    #[test]
    fn events_have_time_user_agent_and_domain_without_client_headers() {
        let bare = http::Request::get("/p").body(Vec::new()).unwrap();
        let v2 = event_of(LambdaPayloadFormat::V2, &bare);
        assert_eq!(v2["requestContext"]["time"], "14/Nov/2023:22:13:20 +0000");
        assert_eq!(v2["requestContext"]["timeEpoch"], 1_700_000_000_123_i64);
        assert_eq!(v2["requestContext"]["http"]["userAgent"], "");
        assert_eq!(v2["requestContext"]["domainName"], "localhost");
        assert_eq!(v2["requestContext"]["domainPrefix"], "localhost");
        assert_eq!(v2["headers"], json!({}));
        assert!(v2.get("queryStringParameters").is_none(), "{v2}");
        let v1 = event_of(LambdaPayloadFormat::V1, &bare);
        assert_eq!(
            v1["requestContext"]["requestTime"],
            "14/Nov/2023:22:13:20 +0000"
        );
        assert_eq!(v1["requestContext"]["identity"]["userAgent"], "");
        assert_eq!(v1["requestContext"]["domainName"], "localhost");
        assert_eq!(v1["headers"], json!({}));
        assert_eq!(v1["multiValueHeaders"], json!({}));
        assert!(v1["queryStringParameters"].is_null());
        assert!(v1["multiValueQueryStringParameters"].is_null());
        let alb = event_of(LambdaPayloadFormat::Alb, &bare);
        assert_eq!(alb["headers"], json!({}));
        assert_eq!(alb["queryStringParameters"], json!({}));
        assert_eq!(alb["body"], "");

        let with = http::Request::get("/p")
            .header("user-agent", "curl/8.5")
            .header("host", "api.example.com:8443")
            .body(Vec::new())
            .unwrap();
        let v2 = event_of(LambdaPayloadFormat::V2, &with);
        assert_eq!(v2["requestContext"]["http"]["userAgent"], "curl/8.5");
        assert_eq!(v2["requestContext"]["domainName"], "api.example.com");
        assert_eq!(v2["requestContext"]["domainPrefix"], "api");
        let v1 = event_of(LambdaPayloadFormat::V1, &with);
        assert_eq!(v1["requestContext"]["identity"]["userAgent"], "curl/8.5");
        assert_eq!(v1["requestContext"]["domainPrefix"], "api");
        // HTTP/2 carries the authority in the target, not in a Host header.
        let h2 = http::Request::get("https://h2.example.org/p")
            .version(Version::HTTP_2)
            .body(Vec::new())
            .unwrap();
        let v2 = event_of(LambdaPayloadFormat::V2, &h2);
        assert_eq!(v2["requestContext"]["domainName"], "h2.example.org");
        assert_eq!(v2["requestContext"]["http"]["protocol"], "HTTP/2.0");
    }

    /// Query decoding per payload format (module docs' table).
    #[test]
    fn query_decoding_follows_api_gateway_per_format() {
        let q = "q=a+b%2Bc&flag&e=&a=1&a=2&pct=100%25&bad=%ZZ&bin=%FF&k%20ey=v&&x=%3D%26";
        let req = http::Request::get(format!("/s?{q}"))
            .body(Vec::new())
            .unwrap();
        let v2 = event_of(LambdaPayloadFormat::V2, &req);
        assert_eq!(v2["rawQueryString"], q);
        assert_eq!(
            v2["queryStringParameters"],
            json!({"q": "a b+c", "flag": "", "e": "", "a": "1,2", "pct": "100%",
                   "bad": "%ZZ", "bin": "\u{fffd}", "k ey": "v", "x": "=&"})
        );
        let v1 = event_of(LambdaPayloadFormat::V1, &req);
        assert_eq!(
            v1["queryStringParameters"],
            json!({"q": "a b+c", "flag": "", "e": "", "a": "2", "pct": "100%",
                   "bad": "%ZZ", "bin": "\u{fffd}", "k ey": "v", "x": "=&"})
        );
        assert_eq!(
            v1["multiValueQueryStringParameters"]["a"],
            json!(["1", "2"])
        );
        assert_eq!(v1["multiValueQueryStringParameters"]["q"], json!(["a b+c"]));
        let alb = event_of(LambdaPayloadFormat::Alb, &req);
        assert_eq!(
            alb["queryStringParameters"],
            json!({"q": "a+b%2Bc", "flag": "", "e": "", "a": "2", "pct": "100%25",
                   "bad": "%ZZ", "bin": "%FF", "k%20ey": "v", "x": "%3D%26"})
        );
    }

    /// Cross-check with the official adapter: `lambda_http` parses our 2.0 events back
    /// into the same request.
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
