//! Proxy header hygiene: pure functions over [`http::HeaderMap`] that remove hop-by-hop
//! headers (RFC 9110 §7.6.1), set the forwarding headers without trusting what an
//! untrusted client sent (http-cases C8), and make an upstream
//! response's framing agree with what the client receives.
//!
//! Order matters: call [`strip_hop_by_hop`] first, then [`set_forwarded`], so that a
//! client naming `X-Forwarded-For` in its `Connection` header cannot delete the header the
//! gateway adds (http-cases C7).

use std::net::IpAddr;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, StatusCode, Version};
use ipnet::{IpNet, Ipv4Net};

/// `X-Forwarded-For`: the chain of client addresses.
pub static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
/// `X-Forwarded-Proto`: the scheme the client used towards the first proxy.
pub static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
/// `X-Forwarded-Host`: the `Host` (or `:authority`) the client asked for.
pub static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

/// Client-supplied identity and origin headers that the gateway does not set itself:
/// removed from a request unless the peer is a trusted proxy. Some
/// framework or upstream believes each of them about the client address (`X-Real-IP`,
/// `True-Client-IP`, `CF-Connecting-IP`, …), the scheme or port the client used
/// (`X-Forwarded-Port`, `-Ssl`, `-Scheme`, `Front-End-Https`, …), the host or the path
/// prefix it asked for (`X-Forwarded-Prefix`, `X-Original-Host`, …) or the URL to serve
/// instead of the request line (`X-Original-URL`, `X-Rewrite-URL`: IIS/Symfony).
/// The gateway sets `X-Forwarded-For`, `X-Forwarded-Proto`, `X-Forwarded-Host` and
/// `Forwarded` itself ([`set_forwarded`]).
pub const CLIENT_IDENTITY_HEADERS: [&str; 24] = [
    "x-real-ip",
    "x-client-ip",
    "client-ip",
    "true-client-ip",
    "cf-connecting-ip",
    "fastly-client-ip",
    "x-cluster-client-ip",
    "x-azure-clientip",
    "x-azure-socketip",
    "x-envoy-external-address",
    "x-original-forwarded-for",
    "x-forwarded",
    "forwarded-for",
    "x-forwarded-port",
    "x-forwarded-prefix",
    "x-forwarded-server",
    "x-forwarded-ssl",
    "x-forwarded-scheme",
    "x-url-scheme",
    "front-end-https",
    "x-original-host",
    "x-host",
    "x-original-url",
    "x-rewrite-url",
];

/// The fixed hop-by-hop headers, other than `TE` (handled separately) and the ones named
/// in `Connection`. Names, not strings: a lookup by a string parses the name first.
const HOP_BY_HOP_COUNT: usize = 9;
static HOP_BY_HOP: [HeaderName; HOP_BY_HOP_COUNT] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    HeaderName::from_static("http2-settings"),
];

/// Iterate over the comma-separated tokens of every `Connection` header value, trimmed of
/// spaces and tabs, skipping empty tokens. Works on raw bytes, so non-UTF-8 values are
/// tolerated.
fn connection_tokens(headers: &HeaderMap) -> impl Iterator<Item = &[u8]> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .flat_map(|v| v.as_bytes().split(|b| *b == b','))
        .map(|t| t.trim_ascii())
        .filter(|t| !t.is_empty())
}

/// Remove hop-by-hop headers from a request or response before forwarding it.
///
/// Removes, in this order:
/// 1. every header named in any `Connection` header value (comma-separated,
///    case-insensitive, surrounding whitespace ignored, invalid names ignored) — except
///    `TE`, which follows rule 3;
/// 2. `Connection`, `Keep-Alive`, `Proxy-Connection`, `Proxy-Authenticate`,
///    `Proxy-Authorization`, `Trailer`, `Transfer-Encoding`, `Upgrade`, `HTTP2-Settings`;
/// 3. `TE`, unless `keep_te_trailers` is set and there is exactly one `TE` value equal
///    (case-insensitively, after trimming) to `trailers`, the only value HTTP/2 allows.
///
/// Upgrade requests lose their `Upgrade`/`Connection` headers too: a caller that
/// tunnels upgrades must read them with [`wants_upgrade`] first and re-add them.
pub fn strip_hop_by_hop(headers: &mut HeaderMap, keep_te_trailers: bool) {
    // Most requests and responses carry few of these (a response often `Connection`):
    // one pass over the names present, then a removal of only those.
    let mut present = [false; HOP_BY_HOP_COUNT];
    let mut te = false;
    for n in headers.keys() {
        if *n == header::TE {
            te = true;
        } else if let Some(i) = HOP_BY_HOP.iter().position(|h| h == n) {
            present[i] = true;
        }
    }
    if present[0] {
        // `Connection` (index 0): the names it lists, other than `TE` and the fixed
        // ones (removed below when present).
        let named: Vec<HeaderName> = connection_tokens(headers)
            .filter(|t| {
                !t.eq_ignore_ascii_case(b"te")
                    && !HOP_BY_HOP
                        .iter()
                        .any(|h| t.eq_ignore_ascii_case(h.as_str().as_bytes()))
            })
            .filter_map(|t| HeaderName::from_bytes(t).ok())
            .collect();
        for name in named {
            headers.remove(name);
        }
    }
    for (name, present) in HOP_BY_HOP.iter().zip(present) {
        if present {
            headers.remove(name);
        }
    }
    if !te {
        return;
    }
    let keep_te = keep_te_trailers && {
        let mut values = headers.get_all(header::TE).iter();
        matches!(
            (values.next(), values.next()),
            (Some(v), None) if v.as_bytes().trim_ascii().eq_ignore_ascii_case(b"trailers")
        )
    };
    if keep_te {
        headers.insert(header::TE, HeaderValue::from_static("trailers"));
    } else {
        headers.remove(header::TE);
    }
}

/// The set of peer networks whose `X-Forwarded-*` headers the gateway believes (for
/// example a load balancer in front of it). Empty by default: nobody is trusted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustedProxies {
    nets: Vec<IpNet>,
}

impl TrustedProxies {
    /// Build the set from a list of networks. IPv4-mapped IPv6 networks
    /// (`::ffff:a.b.c.d/96+n`) are stored as the equivalent IPv4 network, so either
    /// spelling matches both IPv4 peers and IPv4-mapped IPv6 peers.
    pub fn new(nets: Vec<IpNet>) -> Self {
        let nets = nets.into_iter().map(canonical_net).collect();
        Self { nets }
    }

    /// Whether `peer` lies in one of the trusted networks. An IPv4-mapped IPv6 peer
    /// (`::ffff:a.b.c.d`, as seen on a dual-stack socket) is matched as its IPv4 address.
    pub fn contains(&self, peer: IpAddr) -> bool {
        let peer = peer.to_canonical();
        self.nets.iter().any(|n| n.contains(&peer))
    }

    /// Whether no network is trusted.
    pub fn is_empty(&self) -> bool {
        self.nets.is_empty()
    }
}

impl From<Vec<IpNet>> for TrustedProxies {
    fn from(nets: Vec<IpNet>) -> Self {
        Self::new(nets)
    }
}

/// Turn an IPv4-mapped IPv6 network with prefix ≥ 96 into its IPv4 equivalent; leave
/// anything else unchanged.
fn canonical_net(net: IpNet) -> IpNet {
    if let IpNet::V6(v6) = net
        && let Some(v4) = v6.addr().to_ipv4_mapped()
        && v6.prefix_len() >= 96
        && let Ok(n) = Ipv4Net::new(v4, v6.prefix_len() - 96)
    {
        return IpNet::V4(n.trunc());
    }
    net
}

/// Set `X-Forwarded-For`, `X-Forwarded-Proto`, `X-Forwarded-Host` and `Forwarded`
/// (RFC 7239) on a request about to be forwarded upstream. Call it after
/// [`strip_hop_by_hop`].
///
/// * `peer` is the TCP peer address; an IPv4-mapped IPv6 peer is written as plain IPv4,
///   IPv6 peers without brackets in `X-Forwarded-For` and as `for="[v6]"` in `Forwarded`.
/// * `proto` is the scheme the client used (`"http"` or `"https"`).
/// * `host` is the host the client asked for (the effective authority), if any.
///
/// If `trusted` contains the peer, the peer is appended to the existing
/// `X-Forwarded-For` chain (all existing lines joined with `", "` into one line), the
/// gateway's `for=…;host=…;proto=…` element is appended to the existing `Forwarded`
/// list, and the existing `X-Forwarded-Proto` / `X-Forwarded-Host` and every header of
/// [`CLIENT_IDENTITY_HEADERS`] are kept (the `X-Forwarded-*` ones are set from
/// `proto`/`host` only when absent).
///
/// Otherwise every client-supplied value is discarded: `X-Forwarded-For` becomes the
/// peer alone, `X-Forwarded-Proto` becomes `proto`, `X-Forwarded-Host` becomes `host`
/// (removed when `host` is `None`), `Forwarded` becomes the gateway's one element, and
/// every header of [`CLIENT_IDENTITY_HEADERS`] is removed (http-cases C8).
///
/// A `proto` or `host` that is not a valid header value is treated as absent (the header
/// is removed, or left as is for a trusted peer); this function never panics.
pub fn set_forwarded(
    headers: &mut HeaderMap,
    peer: IpAddr,
    proto: &str,
    host: Option<&str>,
    trusted: &TrustedProxies,
) {
    let peer = peer.to_canonical();
    let mut peer_str = String::with_capacity(15);
    push_ip(&mut peer_str, peer);
    let proto_value = HeaderValue::from_str(proto).ok();
    let host_value = host.and_then(|h| HeaderValue::from_str(h).ok());
    let element = forwarded_element(peer, proto, host);

    if trusted.contains(peer) {
        let xff = append_list(headers, &X_FORWARDED_FOR, &peer_str);
        headers.insert(X_FORWARDED_FOR.clone(), xff);
        let fwd = append_list(headers, &header::FORWARDED, &element);
        headers.insert(header::FORWARDED, fwd);
        if !headers.contains_key(&X_FORWARDED_PROTO)
            && let Some(v) = proto_value
        {
            headers.insert(X_FORWARDED_PROTO.clone(), v);
        }
        if !headers.contains_key(&X_FORWARDED_HOST)
            && let Some(v) = host_value
        {
            headers.insert(X_FORWARDED_HOST.clone(), v);
        }
    } else {
        // The strings become the values' bytes (no copy).
        set_or_remove(headers, &X_FORWARDED_FOR, owned_value(peer_str));
        set_or_remove(headers, &X_FORWARDED_PROTO, proto_value);
        set_or_remove(headers, &X_FORWARDED_HOST, host_value);
        set_or_remove(headers, &header::FORWARDED, owned_value(element));
        // Usually none is present: one pass over the names present instead of 24
        // lookups by name, each parsing the name first.
        if headers
            .keys()
            .any(|n| CLIENT_IDENTITY_HEADERS.contains(&n.as_str()))
        {
            for name in CLIENT_IDENTITY_HEADERS {
                headers.remove(name);
            }
        }
    }
}

/// Every existing value of a comma-list header `name` joined with `", "`, then `item`.
fn append_list(headers: &HeaderMap, name: &HeaderName, item: &str) -> HeaderValue {
    let mut chain: Vec<u8> = Vec::new();
    for v in headers.get_all(name) {
        let v = v.as_bytes().trim_ascii();
        if v.is_empty() {
            continue;
        }
        chain.extend_from_slice(v);
        chain.extend_from_slice(b", ");
    }
    chain.extend_from_slice(item.as_bytes());
    HeaderValue::from_bytes(&chain).unwrap_or_else(|_| {
        HeaderValue::from_str(item).unwrap_or(HeaderValue::from_static("unknown"))
    })
}

/// The gateway's RFC 7239 element: `for=…;host=…;proto=…`, values quoted where they are
/// not tokens (IPv6 `for="[2001:db8::1]"`, `host="a:8080"`). A host or proto that cannot
/// be written is left out.
fn forwarded_element(peer: IpAddr, proto: &str, host: Option<&str>) -> String {
    let mut out = String::with_capacity(64);
    match peer {
        IpAddr::V4(_) => {
            out.push_str("for=");
            push_ip(&mut out, peer);
        }
        IpAddr::V6(_) => {
            out.push_str("for=\"[");
            push_ip(&mut out, peer);
            out.push_str("]\"");
        }
    }
    let mut pair = |key: &str, value: &str| {
        let printable = value.bytes().all(|b| (0x20..0x7f).contains(&b));
        if value.is_empty() || !printable {
            return;
        }
        out.push(';');
        out.push_str(key);
        out.push('=');
        if value.bytes().all(is_tchar) {
            out.push_str(value);
        } else {
            out.push('"');
            for c in value.chars() {
                if c == '"' || c == '\\' {
                    out.push('\\');
                }
                out.push(c);
            }
            out.push('"');
        }
    };
    if let Some(h) = host {
        pair("host", h);
    }
    pair("proto", proto);
    out
}

/// Append `ip` as text (`Display`'s spelling). IPv4, every request's peer on most
/// networks, is written digit by digit: the formatting machinery costs several times
/// more per request.
fn push_ip(out: &mut String, ip: IpAddr) {
    match ip {
        IpAddr::V4(v4) => {
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    out.push('.');
                }
                if octet >= 100 {
                    out.push(char::from(b'0' + octet / 100));
                }
                if octet >= 10 {
                    out.push(char::from(b'0' + octet / 10 % 10));
                }
                out.push(char::from(b'0' + octet % 10));
            }
        }
        IpAddr::V6(v6) => {
            use std::fmt::Write as _;
            let _ = write!(out, "{v6}");
        }
    }
}

/// `text` as a header value that owns its bytes (no copy); `None` when it is not a
/// valid value.
fn owned_value(text: String) -> Option<HeaderValue> {
    HeaderValue::from_maybe_shared(bytes::Bytes::from(text)).ok()
}

/// RFC 9110 §5.6.2 token characters.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Why an upstream response cannot be forwarded (502, the upstream's fault).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResponseFramingError {
    /// A transfer coding other than one `chunked`: hyper's client only removes the
    /// chunked coding, so the bytes would reach the client still encoded (e.g. gzip)
    /// with nothing saying so.
    #[error("upstream response uses transfer coding {0:?}")]
    TransferCoding(String),
    /// `Content-Length` values that disagree or do not parse.
    #[error("upstream response has conflicting Content-Length {0:?}")]
    ContentLength(String),
}

/// Response hygiene before an upstream response goes to the client (http-cases C7 on
/// responses):
///
/// * `Transfer-Encoding` wins over `Content-Length` (RFC 9112 §6.3): with `chunked`, the
///   body the gateway forwards is the decoded one, so a `Content-Length` next to it is
///   removed (hyper then frames the body itself: chunked on HTTP/1.1, DATA frames on
///   h2); any other transfer coding is refused;
/// * repeated equal `Content-Length` values (`5, 5`, or two lines) become one;
/// * 1xx and 204 responses lose `Content-Length` and `Transfer-Encoding`, which they must
///   not carry (RFC 9110 §8.6);
/// * hop-by-hop headers are stripped ([`strip_hop_by_hop`]);
/// * the version becomes HTTP/1.1, so an HTTP/1.0 upstream's answer goes out with a
///   status line of the gateway's own version (hyper writes the response's version on
///   HTTP/1 and ignores it on h2).
///
/// # Errors
/// [`ResponseFramingError`] when the response cannot be forwarded faithfully.
pub fn sanitize_response(
    status: StatusCode,
    version: &mut Version,
    headers: &mut HeaderMap,
) -> Result<(), ResponseFramingError> {
    let codings: Vec<String> = headers
        .get_all(header::TRANSFER_ENCODING)
        .iter()
        .flat_map(|v| v.as_bytes().split(|b| *b == b','))
        .map(|c| String::from_utf8_lossy(c.trim_ascii()).to_ascii_lowercase())
        .filter(|c| !c.is_empty())
        .collect();
    if headers.contains_key(header::TRANSFER_ENCODING) {
        if codings != ["chunked"] {
            return Err(ResponseFramingError::TransferCoding(codings.join(", ")));
        }
        headers.remove(header::CONTENT_LENGTH);
    }
    if headers
        .get_all(header::CONTENT_LENGTH)
        .iter()
        .nth(1)
        .is_some()
        || headers
            .get(header::CONTENT_LENGTH)
            .is_some_and(|v| v.as_bytes().contains(&b','))
    {
        let lengths: Vec<&[u8]> = headers
            .get_all(header::CONTENT_LENGTH)
            .iter()
            .flat_map(|v| v.as_bytes().split(|b| *b == b','))
            .map(<[u8]>::trim_ascii)
            .collect();
        let first = lengths[0];
        if first.is_empty()
            || !first.iter().all(u8::is_ascii_digit)
            || lengths.iter().any(|l| *l != first)
        {
            let all = headers
                .get_all(header::CONTENT_LENGTH)
                .iter()
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                .collect::<Vec<_>>()
                .join(", ");
            return Err(ResponseFramingError::ContentLength(all));
        }
        let one = HeaderValue::from_bytes(first).expect("digits are a valid header value");
        headers.insert(header::CONTENT_LENGTH, one);
    }
    if status.is_informational() || status == StatusCode::NO_CONTENT {
        headers.remove(header::CONTENT_LENGTH);
        headers.remove(header::TRANSFER_ENCODING);
    }
    strip_hop_by_hop(headers, false);
    *version = Version::HTTP_11;
    Ok(())
}

/// Replace every value of `name` with `value`, or remove the header when `value` is
/// `None`.
fn set_or_remove(headers: &mut HeaderMap, name: &HeaderName, value: Option<HeaderValue>) {
    match value {
        Some(v) => {
            headers.insert(name.clone(), v);
        }
        None => {
            headers.remove(name);
        }
    }
}

/// Whether `method` is idempotent per RFC 9110 §9.2.2 (GET, HEAD, OPTIONS, TRACE, PUT,
/// DELETE) and so may be retried after a failure that might have reached the upstream.
pub fn is_idempotent(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    )
}

/// Whether the message asks for a protocol upgrade: an `Upgrade` header is present and
/// some `Connection` header lists the `upgrade` token (case-insensitive).
pub fn wants_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
        && connection_tokens(headers).any(|t| t.eq_ignore_ascii_case(b"upgrade"))
}

/// The part of a request's `Upgrade` field the gateway forwards: the protocols whose
/// name (before any `/version`, case-insensitive) is in `allowed` (lower case), in the
/// client's order, joined with `", "`. `None` when the request asks for no upgrade
/// ([`wants_upgrade`]) or for none of those protocols — it is then forwarded as an
/// ordinary request (RFC 9110 §7.8 lets a server ignore `Upgrade`).
pub fn allowed_upgrade(headers: &HeaderMap, allowed: &[String]) -> Option<HeaderValue> {
    if !wants_upgrade(headers) {
        return None;
    }
    let kept: Vec<&str> = headers
        .get_all(header::UPGRADE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|p| {
            let name = p.split('/').next().unwrap_or("");
            allowed.iter().any(|a| a.eq_ignore_ascii_case(name))
        })
        .collect();
    if kept.is_empty() {
        return None;
    }
    HeaderValue::from_str(&kept.join(", ")).ok()
}

/// Whether an upstream's `101 Switching Protocols` with `response` headers switches to a
/// protocol the request asked for (`requested`: what [`allowed_upgrade`] forwarded).
pub fn upgrade_accepted(requested: &HeaderValue, response: &HeaderMap) -> bool {
    let names = |v: &str| {
        v.split(',')
            .map(|p| {
                p.trim()
                    .split('/')
                    .next()
                    .unwrap_or("")
                    .to_ascii_lowercase()
            })
            .collect::<Vec<_>>()
    };
    let asked = names(requested.to_str().unwrap_or(""));
    let mut switched = response
        .get_all(header::UPGRADE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(names)
        .peekable();
    switched.peek().is_some() && switched.all(|p| asked.contains(&p))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn only_allowed_upgrade_protocols_are_forwarded_and_accepted() {
        let allowed = vec!["websocket".to_string()];
        let ask = |conn: &str, up: &str| {
            allowed_upgrade(&map(&[("connection", conn), ("upgrade", up)]), &allowed)
        };
        assert_eq!(ask("Upgrade", "WebSocket").unwrap(), "WebSocket");
        assert_eq!(
            ask("keep-alive, Upgrade", "h2c, websocket/13").unwrap(),
            "websocket/13"
        );
        assert_eq!(ask("Upgrade, HTTP2-Settings", "h2c"), None);
        assert_eq!(ask("keep-alive", "websocket"), None, "no upgrade token");
        let requested = HeaderValue::from_static("websocket");
        assert!(upgrade_accepted(
            &requested,
            &map(&[("upgrade", "WebSocket")])
        ));
        assert!(!upgrade_accepted(&requested, &map(&[("upgrade", "h2c")])));
        assert!(!upgrade_accepted(&requested, &map(&[])));
    }
    use std::net::{Ipv4Addr, Ipv6Addr};

    fn map(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).expect("test header name"),
                HeaderValue::from_str(v).expect("test header value"),
            );
        }
        h
    }

    fn values(h: &HeaderMap, name: &str) -> Vec<String> {
        h.get_all(name)
            .iter()
            .map(|v| v.to_str().expect("ascii").to_string())
            .collect()
    }

    fn nets(list: &[&str]) -> TrustedProxies {
        TrustedProxies::new(list.iter().map(|s| s.parse().expect("net")).collect())
    }

    const UNTRUSTED_PEER: IpAddr = IpAddr::V4(Ipv4Addr::new(203, 0, 113, 7));

    /// C7: the request headers exactly as in http-cases.md, stripped and then forwarded.
    #[test]
    fn c7_hop_by_hop_and_connection_named_headers() {
        let mut h = map(&[
            ("host", "a"),
            (
                "connection",
                "keep-alive, X-Forwarded-For, X-Auth-User, HTTP2-Settings",
            ),
            ("x-auth-user", "admin"),
            ("keep-alive", "5"),
            ("te", "gzip"),
            ("upgrade", "h2c"),
            ("http2-settings", "AAA"),
            ("proxy-connection", "keep-alive"),
        ]);
        strip_hop_by_hop(&mut h, true);
        for gone in [
            "connection",
            "keep-alive",
            "proxy-connection",
            "te",
            "trailer",
            "upgrade",
            "http2-settings",
            "x-auth-user",
        ] {
            assert!(!h.contains_key(gone), "{gone} survived: {h:?}");
        }
        assert_eq!(values(&h, "host"), ["a"]);
        set_forwarded(
            &mut h,
            UNTRUSTED_PEER,
            "http",
            Some("a"),
            &TrustedProxies::default(),
        );
        // The gateway's own X-Forwarded-For survives the client naming it in Connection.
        assert_eq!(values(&h, "x-forwarded-for"), ["203.0.113.7"]);
        assert_eq!(values(&h, "x-forwarded-proto"), ["http"]);
        assert_eq!(values(&h, "x-forwarded-host"), ["a"]);
        assert_eq!(
            values(&h, "forwarded"),
            ["for=203.0.113.7;host=a;proto=http"]
        );
        assert_eq!(h.len(), 5, "{h:?}");
    }

    /// C7, "same rule on responses".
    #[test]
    fn c7_same_rule_on_responses() {
        let mut h = map(&[
            ("content-type", "text/plain"),
            ("connection", "close, X-Internal"),
            ("x-internal", "secret"),
            ("keep-alive", "timeout=5"),
            ("transfer-encoding", "chunked"),
            ("trailer", "grpc-status"),
            ("proxy-authenticate", "Basic"),
        ]);
        strip_hop_by_hop(&mut h, false);
        assert_eq!(h.len(), 1, "{h:?}");
        assert_eq!(values(&h, "content-type"), ["text/plain"]);
    }

    #[test]
    fn te_trailers_kept_only_when_asked_and_exact() {
        let mut h = map(&[("te", "trailers")]);
        strip_hop_by_hop(&mut h, true);
        assert_eq!(values(&h, "te"), ["trailers"]);

        // Compliant HTTP/1.1 clients also list TE in Connection; the TE rule still governs.
        let mut h = map(&[("te", " Trailers "), ("connection", "TE")]);
        strip_hop_by_hop(&mut h, true);
        assert_eq!(values(&h, "te"), ["trailers"]);

        let mut h = map(&[("te", "trailers")]);
        strip_hop_by_hop(&mut h, false);
        assert!(!h.contains_key("te"));

        for other in [
            vec!["trailers, gzip"],
            vec!["gzip"],
            vec!["trailers", "trailers"],
        ] {
            let mut h = HeaderMap::new();
            for v in &other {
                h.append(header::TE, HeaderValue::from_static(v));
            }
            strip_hop_by_hop(&mut h, true);
            assert!(!h.contains_key("te"), "{other:?} kept");
        }
    }

    #[test]
    fn multiple_connection_headers_odd_whitespace_and_case() {
        let mut h = map(&[
            ("connection", "  X-One ,\tx-TWO,,"),
            ("connection", "X-Three"),
            ("connection", ", ,bad name, bäd"),
            ("x-one", "1"),
            ("x-two", "2"),
            ("x-three", "3"),
            ("x-four", "4"),
        ]);
        strip_hop_by_hop(&mut h, false);
        assert_eq!(h.len(), 1, "{h:?}");
        assert_eq!(values(&h, "x-four"), ["4"]);
    }

    #[test]
    fn non_utf8_connection_value_is_tolerated() {
        let mut h = HeaderMap::new();
        h.append(
            header::CONNECTION,
            HeaderValue::from_bytes(b"x-gone, \xff\xfe, x-also").expect("obs-text allowed"),
        );
        h.append("x-gone", HeaderValue::from_static("1"));
        h.append("x-also", HeaderValue::from_static("1"));
        h.append("x-stay", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h, false);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key("x-stay"));
    }

    /// C8: spoofed forwarding headers from a peer that is not a trusted proxy.
    #[test]
    fn c8_spoofed_forwarding_headers_from_untrusted_peer() {
        let mut h = map(&[
            ("host", "api.example"),
            ("x-forwarded-for", "10.0.0.1"),
            ("x-forwarded-proto", "https"),
            ("x-forwarded-host", "admin.internal"),
            ("forwarded", "for=10.0.0.1;proto=https"),
        ]);
        let trusted = nets(&["192.0.2.0/24"]);
        strip_hop_by_hop(&mut h, false);
        set_forwarded(
            &mut h,
            UNTRUSTED_PEER,
            "http",
            Some("api.example"),
            &trusted,
        );
        assert_eq!(values(&h, "x-forwarded-for"), ["203.0.113.7"]);
        assert_eq!(values(&h, "x-forwarded-proto"), ["http"]);
        assert_eq!(values(&h, "x-forwarded-host"), ["api.example"]);
        assert_eq!(
            values(&h, "forwarded"),
            ["for=203.0.113.7;host=api.example;proto=http"]
        );

        // No host: a spoofed X-Forwarded-Host is dropped, not kept.
        let mut h = map(&[
            ("x-forwarded-for", "10.0.0.1"),
            ("x-forwarded-for", "10.0.0.2"),
            ("x-forwarded-host", "admin.internal"),
        ]);
        set_forwarded(&mut h, UNTRUSTED_PEER, "https", None, &trusted);
        assert_eq!(values(&h, "x-forwarded-for"), ["203.0.113.7"]);
        assert_eq!(values(&h, "x-forwarded-proto"), ["https"]);
        assert!(!h.contains_key("x-forwarded-host"));
    }

    #[test]
    fn trusted_peer_appends_and_keeps_existing() {
        let trusted = nets(&["192.0.2.0/24", "2001:db8::/32"]);
        let lb = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 10));
        let mut h = map(&[
            ("x-forwarded-for", "198.51.100.1"),
            ("x-forwarded-for", "198.51.100.2"),
            ("x-forwarded-proto", "https"),
            ("x-forwarded-host", "public.example"),
            ("forwarded", "for=198.51.100.1"),
        ]);
        set_forwarded(&mut h, lb, "http", Some("internal"), &trusted);
        assert_eq!(
            values(&h, "x-forwarded-for"),
            ["198.51.100.1, 198.51.100.2, 192.0.2.10"]
        );
        assert_eq!(values(&h, "x-forwarded-proto"), ["https"]);
        assert_eq!(values(&h, "x-forwarded-host"), ["public.example"]);
        assert_eq!(
            values(&h, "forwarded"),
            ["for=198.51.100.1, for=192.0.2.10;host=internal;proto=http"]
        );

        // Trusted but nothing present yet: set from proto/host.
        let mut h = HeaderMap::new();
        let v6 = IpAddr::V6("2001:db8::1".parse().expect("v6"));
        set_forwarded(&mut h, v6, "https", Some("h.example"), &trusted);
        assert_eq!(values(&h, "x-forwarded-for"), ["2001:db8::1"]);
        assert_eq!(values(&h, "x-forwarded-proto"), ["https"]);
        assert_eq!(values(&h, "x-forwarded-host"), ["h.example"]);
    }

    #[test]
    fn ipv6_and_ipv4_mapped_peers() {
        let v4_trust = nets(&["10.1.0.0/16"]);
        let mapped: IpAddr = IpAddr::V6(Ipv4Addr::new(10, 1, 2, 3).to_ipv6_mapped());
        assert!(v4_trust.contains(mapped));
        assert!(v4_trust.contains(IpAddr::V4(Ipv4Addr::new(10, 1, 2, 3))));
        assert!(!v4_trust.contains(IpAddr::V6(Ipv4Addr::new(10, 2, 0, 1).to_ipv6_mapped())));

        // A mapped-IPv6 network matches plain IPv4 peers too.
        let mapped_trust = nets(&["::ffff:10.1.0.0/112"]);
        assert!(mapped_trust.contains(IpAddr::V4(Ipv4Addr::new(10, 1, 9, 9))));
        assert!(mapped_trust.contains(mapped));
        assert!(!mapped_trust.contains(IpAddr::V4(Ipv4Addr::new(10, 2, 0, 1))));

        let v6_trust = nets(&["fd00::/8"]);
        assert!(v6_trust.contains(IpAddr::V6("fd12::1".parse().expect("v6"))));
        assert!(!v6_trust.contains(IpAddr::V6(Ipv6Addr::LOCALHOST)));
        assert!(!TrustedProxies::default().contains(IpAddr::V4(Ipv4Addr::LOCALHOST)));

        // An untrusted mapped peer is written as plain IPv4.
        let mut h = map(&[("x-forwarded-for", "1.2.3.4")]);
        let peer = IpAddr::V6(Ipv4Addr::new(198, 51, 100, 9).to_ipv6_mapped());
        set_forwarded(&mut h, peer, "http", None, &v4_trust);
        assert_eq!(values(&h, "x-forwarded-for"), ["198.51.100.9"]);
        // A trusted mapped peer appends plain IPv4.
        set_forwarded(&mut h, mapped, "http", None, &v4_trust);
        assert_eq!(values(&h, "x-forwarded-for"), ["198.51.100.9, 10.1.2.3"]);
        // An untrusted IPv6 peer, no brackets.
        let mut h = HeaderMap::new();
        set_forwarded(
            &mut h,
            IpAddr::V6(Ipv6Addr::LOCALHOST),
            "http",
            None,
            &v4_trust,
        );
        assert_eq!(values(&h, "x-forwarded-for"), ["::1"]);
    }

    #[test]
    fn invalid_host_or_proto_never_panics() {
        let mut h = map(&[("x-forwarded-host", "spoof")]);
        set_forwarded(
            &mut h,
            UNTRUSTED_PEER,
            "ht\ntp",
            Some("bad\r\nhost"),
            &TrustedProxies::default(),
        );
        assert!(!h.contains_key("x-forwarded-host"));
        assert!(!h.contains_key("x-forwarded-proto"));
        assert_eq!(values(&h, "x-forwarded-for"), ["203.0.113.7"]);
    }

    /// Every client identity alias is removed from an untrusted peer's
    /// request and kept from a trusted one.
    #[test]
    fn identity_aliases_are_stripped_unless_the_peer_is_trusted() {
        let spoofed: Vec<(&str, &str)> = CLIENT_IDENTITY_HEADERS
            .iter()
            .map(|n| (*n, "10.0.0.1"))
            .chain([("x-request-id", "keep-me")])
            .collect();
        let mut h = map(&spoofed);
        set_forwarded(
            &mut h,
            UNTRUSTED_PEER,
            "http",
            Some("a"),
            &nets(&["192.0.2.0/24"]),
        );
        for name in CLIENT_IDENTITY_HEADERS {
            assert!(!h.contains_key(name), "{name} survived");
        }
        assert_eq!(values(&h, "x-request-id"), ["keep-me"]);
        let lb = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 10));
        let mut h = map(&spoofed);
        set_forwarded(&mut h, lb, "http", Some("a"), &nets(&["192.0.2.0/24"]));
        for name in CLIENT_IDENTITY_HEADERS {
            assert_eq!(values(&h, name), ["10.0.0.1"], "{name}");
        }
    }

    #[test]
    fn an_address_is_written_as_display_writes_it() {
        for ip in [
            "0.0.0.0",
            "9.10.99.100",
            "127.0.0.1",
            "203.0.113.7",
            "255.255.255.255",
            "2001:db8::1",
            "::ffff:192.0.2.1",
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            let mut out = String::new();
            push_ip(&mut out, ip);
            assert_eq!(out, ip.to_string());
        }
    }

    #[test]
    fn forwarded_element_quotes_what_is_not_a_token() {
        let v6: IpAddr = "2001:db8::1".parse().unwrap();
        assert_eq!(
            forwarded_element(v6, "https", Some("a.example:8443")),
            r#"for="[2001:db8::1]";host="a.example:8443";proto=https"#
        );
        assert_eq!(
            forwarded_element(UNTRUSTED_PEER, "http", None),
            "for=203.0.113.7;proto=http"
        );
        assert_eq!(
            forwarded_element(UNTRUSTED_PEER, "http", Some("a\"b")),
            r#"for=203.0.113.7;host="a\"b";proto=http"#
        );
    }

    fn sanitized(status: u16, pairs: &[(&str, &str)]) -> Result<HeaderMap, ResponseFramingError> {
        let mut h = map(pairs);
        let mut version = Version::HTTP_10;
        sanitize_response(StatusCode::from_u16(status).unwrap(), &mut version, &mut h)?;
        assert_eq!(version, Version::HTTP_11);
        Ok(h)
    }

    /// Framing headers agree with the body the client receives.
    #[test]
    fn response_framing_transfer_encoding_wins() {
        let h = sanitized(
            200,
            &[("content-length", "100"), ("transfer-encoding", "chunked")],
        )
        .unwrap();
        assert!(h.is_empty(), "{h:?}");
        let h = sanitized(200, &[("transfer-encoding", " Chunked ")]).unwrap();
        assert!(h.is_empty());
        for bad in [
            vec![("transfer-encoding", "gzip, chunked")],
            vec![
                ("transfer-encoding", "gzip"),
                ("transfer-encoding", "chunked"),
            ],
            vec![("transfer-encoding", "chunked, chunked")],
            vec![("transfer-encoding", "identity")],
            vec![("transfer-encoding", "")],
        ] {
            assert!(
                matches!(
                    sanitized(200, &bad),
                    Err(ResponseFramingError::TransferCoding(_))
                ),
                "{bad:?}"
            );
        }
        let h = sanitized(200, &[("content-length", "5, 5")]).unwrap();
        assert_eq!(values(&h, "content-length"), ["5"]);
        let h = sanitized(200, &[("content-length", "5"), ("content-length", "5")]).unwrap();
        assert_eq!(values(&h, "content-length"), ["5"]);
        assert!(sanitized(200, &[("content-length", "5, 6")]).is_err());
        let h = sanitized(204, &[("content-length", "0"), ("x", "1")]).unwrap();
        assert_eq!(h.len(), 1);
        // HEAD and 304 answers keep the length of the body they describe.
        let h = sanitized(304, &[("content-length", "42")]).unwrap();
        assert_eq!(values(&h, "content-length"), ["42"]);
    }

    #[test]
    fn idempotent_methods() {
        for m in [
            Method::GET,
            Method::HEAD,
            Method::OPTIONS,
            Method::TRACE,
            Method::PUT,
            Method::DELETE,
        ] {
            assert!(is_idempotent(&m), "{m}");
        }
        for m in [Method::POST, Method::PATCH, Method::CONNECT] {
            assert!(!is_idempotent(&m), "{m}");
        }
        let custom = Method::from_bytes(b"PURGE").expect("method");
        assert!(!is_idempotent(&custom));
    }

    #[test]
    fn upgrade_detection() {
        assert!(wants_upgrade(&map(&[
            ("connection", "keep-alive, Upgrade"),
            ("upgrade", "websocket"),
        ])));
        assert!(wants_upgrade(&map(&[
            ("connection", "keep-alive"),
            ("connection", " UPGRADE "),
            ("upgrade", "websocket"),
        ])));
        assert!(!wants_upgrade(&map(&[("upgrade", "websocket")])));
        assert!(!wants_upgrade(&map(&[("connection", "upgrade")])));
        assert!(!wants_upgrade(&map(&[
            ("connection", "upgraded, x-upgrade"),
            ("upgrade", "websocket"),
        ])));
    }

    const FIXED: [&str; 10] = [
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "http2-settings",
    ];

    fn header_name() -> impl Strategy<Value = String> {
        prop_oneof![
            proptest::sample::select(FIXED.to_vec()).prop_map(str::to_string),
            "[xX]-[a-zA-Z]{1,3}",
            "[a-z]{1,6}",
        ]
    }

    fn header_value() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            // Comma lists of plausible names with messy separators.
            proptest::collection::vec((header_name(), "[ \t]{0,2}", "[ \t]{0,2}"), 0..5).prop_map(
                |parts| {
                    parts
                        .into_iter()
                        .map(|(n, a, b)| format!("{a}{n}{b}"))
                        .collect::<Vec<_>>()
                        .join(",")
                        .into_bytes()
                }
            ),
            Just(b"trailers".to_vec()),
            // Arbitrary bytes allowed in a header value (visible ASCII, SP, HTAB, obs-text).
            proptest::collection::vec(prop_oneof![Just(b'\t'), 0x20u8..0x7f, 0x80u8..=0xff], 0..24),
        ]
    }

    proptest! {
        #[test]
        fn every_ipv4_address_is_written_as_display_writes_it(v4 in any::<u32>()) {
            let ip = IpAddr::V4(std::net::Ipv4Addr::from(v4));
            let mut out = String::new();
            push_ip(&mut out, ip);
            prop_assert_eq!(out, ip.to_string());
        }

        #[test]
        fn strip_leaves_no_hop_by_hop_or_named_header(
            pairs in proptest::collection::vec((header_name(), header_value()), 0..16),
            keep_te in any::<bool>(),
        ) {
            let mut h = HeaderMap::new();
            for (n, v) in &pairs {
                let name = HeaderName::from_bytes(n.as_bytes()).expect("generated name");
                if let Ok(value) = HeaderValue::from_bytes(v) {
                    h.append(name, value);
                }
            }
            let named: Vec<HeaderName> = connection_tokens(&h)
                .filter_map(|t| HeaderName::from_bytes(t).ok())
                .collect();
            let before = h.clone();
            strip_hop_by_hop(&mut h, keep_te);
            for f in FIXED {
                if f == "te" && keep_te {
                    // Only the exact `trailers` value may survive.
                    for v in h.get_all("te") {
                        prop_assert_eq!(v.as_bytes(), b"trailers");
                    }
                    prop_assert!(h.get_all("te").iter().count() <= 1);
                } else {
                    prop_assert!(!h.contains_key(f), "{} survived", f);
                }
            }
            for n in &named {
                if *n != header::TE {
                    prop_assert!(!h.contains_key(n), "{} survived", n);
                }
            }
            // Nothing else was touched.
            for (k, v) in &before {
                let hop = FIXED.contains(&k.as_str()) || named.contains(k);
                if !hop {
                    prop_assert!(h.get_all(k).iter().any(|x| x == v));
                }
            }
            // And set_forwarded never panics on what remains.
            set_forwarded(&mut h, UNTRUSTED_PEER, "http", Some("a"), &TrustedProxies::default());
            prop_assert_eq!(h.get_all(&X_FORWARDED_FOR).iter().count(), 1);
        }

        #[test]
        fn set_forwarded_never_panics(
            xff in proptest::collection::vec(header_value(), 0..4),
            host in proptest::option::of(".{0,12}"),
            v6 in any::<[u8; 16]>(),
            trust_all in any::<bool>(),
        ) {
            let mut h = HeaderMap::new();
            for v in &xff {
                if let Ok(value) = HeaderValue::from_bytes(v) {
                    h.append(X_FORWARDED_FOR.clone(), value);
                }
            }
            let trusted = if trust_all { nets(&["::/0", "0.0.0.0/0"]) } else { TrustedProxies::default() };
            set_forwarded(&mut h, IpAddr::V6(Ipv6Addr::from(v6)), "https", host.as_deref(), &trusted);
            prop_assert_eq!(h.get_all(&X_FORWARDED_FOR).iter().count(), 1);
            let _ = wants_upgrade(&h);
        }
    }
}
