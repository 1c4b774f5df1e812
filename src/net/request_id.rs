//! Request ids: every request the gateway serves has one, in the `x-request-id` header
//! that goes to the VM or the function (Lambda events included, as a header and as
//! `requestContext.requestId`), comes back on the response, and is named by the access
//! log line and by every warning about the request (the request's log span).
//!
//! A client's own `x-request-id` is kept when it is valid — 1 to
//! [`MAX_REQUEST_ID_BYTES`] characters of `A-Z a-z 0-9 - _ . : + / = @` — and its sender
//! is trusted (`gateway.request_id_trust`: `any` client, only `trusted_proxies`, or
//! `none`); otherwise the gateway makes a new one (32 hex digits, random), so that a
//! log line never carries a client's control characters or an unbounded value.
//!
//! **W3C trace context** ([`trace_context`], [`TraceParent`]): a valid `traceparent`
//! (and its `tracestate`) is kept; an invalid one is removed with its `tracestate`
//! (W3C Trace Context §3.2: a malformed header is not passed on). A request without a
//! valid one starts a trace at the gateway: a new `traceparent` (random trace id, the
//! gateway's span id) goes upstream. Without span export (`telemetry.otlp`) a client's
//! `traceparent` goes upstream unchanged — the gateway is a pass-through hop — and a
//! started trace is not sampled (flags `00`: the gateway recorded nothing); with span
//! export every attempt sends its own span id as the parent id, with the sampling
//! decision (`crate::trace_export`). The trace id is logged with the request id, in the
//! request's log span and the access log line.

use std::net::IpAddr;

use http::{HeaderMap, HeaderName, HeaderValue};
use serde::{Deserialize, Serialize};

use super::headers::TrustedProxies;

/// The header: `x-request-id`.
pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Longest client request id kept, bytes.
pub const MAX_REQUEST_ID_BYTES: usize = 128;

/// Whose `x-request-id` the gateway keeps — `gateway.request_id_trust`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RequestIdTrust {
    /// Any client's valid id (the default: a caller can find its own request in the logs).
    #[default]
    Any,
    /// Only an id from a peer in `gateway.trusted_proxies` (a load balancer that sets it).
    TrustedProxies,
    /// Never: the gateway always makes a new one.
    None,
}

/// `traceparent`.
pub const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
/// `tracestate`.
pub const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

/// A W3C `traceparent` (Trace Context §3.2), its version-00 fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceParent {
    /// The trace id (32 hex digits on the wire; never zero).
    pub trace_id: u128,
    /// The caller's span id, the parent of the receiver's span (16 hex digits; never
    /// zero).
    pub parent_id: u64,
    /// The trace flags; bit 0 is `sampled` (the caller may have recorded its span).
    pub flags: u8,
}

impl TraceParent {
    /// A value `version-traceid-parentid-flags` (version `00` exactly; a higher
    /// version's first four fields), or `None` when malformed or all-zero.
    pub fn parse(v: &str) -> Option<Self> {
        let v = v.trim();
        let mut parts = v.split('-');
        let (version, trace, parent, flags) =
            (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        let hex = |s: &str, n: usize| {
            s.len() == n
                && s.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        };
        let version_ok =
            hex(version, 2) && version != "ff" && (version != "00" || parts.next().is_none());
        if !(version_ok && hex(trace, 32) && hex(parent, 16) && hex(flags, 2)) {
            return None;
        }
        let parsed = Self {
            trace_id: u128::from_str_radix(trace, 16).ok()?,
            parent_id: u64::from_str_radix(parent, 16).ok()?,
            flags: u8::from_str_radix(flags, 16).ok()?,
        };
        (parsed.trace_id != 0 && parsed.parent_id != 0).then_some(parsed)
    }

    /// A new trace started by the gateway: random trace id and span id (never zero),
    /// the sampled flag as given.
    pub fn generate(sampled: bool) -> Self {
        Self {
            trace_id: rand::random::<u128>().max(1),
            parent_id: rand::random::<u64>().max(1),
            flags: u8::from(sampled),
        }
    }

    /// The trace id as logged and sent: 32 lower-case hex digits.
    pub fn trace_id_hex(&self) -> String {
        TraceId(self.trace_id).to_string()
    }

    /// Whether the sampled flag is set.
    pub fn sampled(&self) -> bool {
        self.flags & 1 == 1
    }

    /// The header value, version `00`: `00-<trace id>-<parent id>-<flags>`.
    pub fn header_value(&self) -> HeaderValue {
        let mut out = *b"00-________________________________-________________-__";
        write_hex(&mut out[3..35], self.trace_id);
        write_hex(&mut out[36..52], u128::from(self.parent_id));
        write_hex(&mut out[53..55], u128::from(self.flags));
        HeaderValue::from_bytes(&out).expect("hex digits and dashes are a valid header value")
    }
}

/// A trace id that shows as its 32 lower-case hex digits (`Display`), written only when
/// shown: a request's log span and access log line name it, and with logging off
/// nothing formats it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceId(pub u128);

impl std::fmt::Display for TraceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut out = [0u8; 32];
        write_hex(&mut out, self.0);
        f.write_str(std::str::from_utf8(&out).expect("hex digits are ASCII"))
    }
}

/// `out` filled with the last `out.len()` lower-case hex digits of `n`, zero-padded
/// (`{:0width$x}` without the formatting machinery, which costs several times more on
/// every request).
fn write_hex(out: &mut [u8], mut n: u128) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for b in out.iter_mut().rev() {
        *b = DIGITS[(n & 0xf) as usize];
        n >>= 4;
    }
}

/// The request's W3C `traceparent` when it has exactly one valid one; else `None`, and
/// `traceparent` and `tracestate` are removed from `headers`.
pub fn trace_context(headers: &mut HeaderMap) -> Option<TraceParent> {
    let mut values = headers.get_all(&TRACEPARENT).iter();
    let parsed = match (values.next(), values.next()) {
        (Some(v), None) => v.to_str().ok().and_then(TraceParent::parse),
        (None, _) => return None,
        _ => None,
    };
    if parsed.is_none() {
        headers.remove(&TRACEPARENT);
        headers.remove(&TRACESTATE);
    }
    parsed
}

/// Whether `v` is a request id the gateway keeps (see the [module docs](self)).
pub fn is_valid(v: &[u8]) -> bool {
    !v.is_empty()
        && v.len() <= MAX_REQUEST_ID_BYTES
        && v.iter().all(|b| {
            b.is_ascii_alphanumeric()
                || matches!(b, b'-' | b'_' | b'.' | b':' | b'+' | b'/' | b'=' | b'@')
        })
}

/// A new request id: 32 lower-case hex digits.
pub fn generate() -> String {
    TraceId(rand::random::<u128>()).to_string()
}

/// [`generate`] as a header value.
fn generate_value() -> HeaderValue {
    let mut out = [0u8; 32];
    write_hex(&mut out, rand::random::<u128>());
    HeaderValue::from_bytes(&out).expect("hex digits are a valid header value")
}

/// [`choose`], and the header set to it (replacing every value the client sent).
pub fn assign(
    headers: &mut HeaderMap,
    peer: IpAddr,
    trust: RequestIdTrust,
    trusted: &TrustedProxies,
) -> HeaderValue {
    let id = choose(headers, peer, trust, trusted);
    headers.insert(REQUEST_ID, id.clone());
    id
}

/// The request id of a request from `peer` with `headers`: the client's when it is valid
/// (one field) and `trust` allows it, else a new one.
pub fn choose(
    headers: &HeaderMap,
    peer: IpAddr,
    trust: RequestIdTrust,
    trusted: &TrustedProxies,
) -> HeaderValue {
    let trusted_peer = match trust {
        RequestIdTrust::Any => true,
        RequestIdTrust::TrustedProxies => trusted.contains(peer),
        RequestIdTrust::None => false,
    };
    let mut values = headers.get_all(&REQUEST_ID).iter();
    let kept = match (values.next(), values.next()) {
        (Some(v), None) if trusted_peer && is_valid(v.as_bytes()) => Some(v.clone()),
        _ => None,
    };
    kept.unwrap_or_else(generate_value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_valid_client_id_is_kept_when_trusted_else_replaced() {
        let proxies = TrustedProxies::new(vec!["10.0.0.0/8".parse().unwrap()]);
        let mut h = HeaderMap::new();
        h.insert(REQUEST_ID, HeaderValue::from_static("abc-123:x"));
        assert_eq!(
            assign(&mut h, ip("192.0.2.1"), RequestIdTrust::Any, &proxies),
            "abc-123:x"
        );
        // Only trusted proxies: a direct client's id is replaced, a proxy's kept.
        let id = assign(
            &mut h,
            ip("192.0.2.1"),
            RequestIdTrust::TrustedProxies,
            &proxies,
        );
        assert_ne!(id, "abc-123:x");
        assert_eq!(id.len(), 32);
        assert_eq!(h[&REQUEST_ID], id);
        h.insert(REQUEST_ID, HeaderValue::from_static("from-lb"));
        assert_eq!(
            assign(
                &mut h,
                ip("10.1.2.3"),
                RequestIdTrust::TrustedProxies,
                &proxies
            ),
            "from-lb"
        );
        assert_ne!(
            assign(&mut h, ip("10.1.2.3"), RequestIdTrust::None, &proxies),
            "from-lb"
        );
    }

    #[test]
    fn a_valid_traceparent_is_kept_an_invalid_one_removed_with_its_tracestate() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let mut h = HeaderMap::new();
        h.insert(TRACEPARENT, HeaderValue::from_static(tp));
        h.insert(TRACESTATE, HeaderValue::from_static("vendor=x"));
        let parsed = trace_context(&mut h).unwrap();
        assert_eq!(parsed.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(parsed.header_value(), tp);
        assert!(parsed.sampled());
        assert_eq!(h[&TRACEPARENT], tp);
        assert_eq!(h[&TRACESTATE], "vendor=x");
        for bad in [
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "garbage",
        ] {
            let mut h = HeaderMap::new();
            h.insert(TRACEPARENT, HeaderValue::from_static(bad));
            h.insert(TRACESTATE, HeaderValue::from_static("vendor=x"));
            assert_eq!(trace_context(&mut h), None, "{bad}");
            assert!(h.get(&TRACEPARENT).is_none() && h.get(&TRACESTATE).is_none());
        }
        // A later version may carry more fields.
        let mut h = HeaderMap::new();
        h.insert(
            TRACEPARENT,
            HeaderValue::from_static("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-zz"),
        );
        assert!(trace_context(&mut h).is_some());
        assert!(trace_context(&mut HeaderMap::new()).is_none());
    }

    #[test]
    fn hex_is_written_as_the_formatter_writes_it() {
        for n in [
            0u128,
            1,
            0xabc,
            u128::from(u64::MAX),
            u128::MAX,
            0x4bf9_2f35_77b3_4da6,
        ] {
            assert_eq!(TraceId(n).to_string(), format!("{n:032x}"));
            let tp = TraceParent {
                trace_id: n.max(1),
                parent_id: (n as u64).max(1),
                flags: n as u8,
            };
            assert_eq!(
                tp.header_value(),
                format!(
                    "00-{:032x}-{:016x}-{:02x}",
                    tp.trace_id, tp.parent_id, tp.flags
                )
                .as_str()
            );
        }
        let id = generate_value();
        assert_eq!(id.len(), 32);
        assert!(
            id.as_bytes()
                .iter()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        );
    }

    #[test]
    fn a_started_trace_has_a_valid_traceparent() {
        for sampled in [false, true] {
            let tp = TraceParent::generate(sampled);
            let v = tp.header_value();
            let text = v.to_str().unwrap();
            assert_eq!(text.len(), 55, "{text}");
            assert_eq!(TraceParent::parse(text), Some(tp));
            assert_eq!(tp.sampled(), sampled);
            assert!(text.ends_with(if sampled { "-01" } else { "-00" }));
        }
    }

    #[test]
    fn invalid_or_repeated_ids_are_replaced() {
        let none = TrustedProxies::new(Vec::new());
        for bad in [
            "",
            "has space",
            "quote\"",
            &"x".repeat(MAX_REQUEST_ID_BYTES + 1),
        ] {
            let mut h = HeaderMap::new();
            h.insert(REQUEST_ID, HeaderValue::from_str(bad).unwrap());
            let id = assign(&mut h, ip("127.0.0.1"), RequestIdTrust::Any, &none);
            assert_ne!(id.as_bytes(), bad.as_bytes(), "{bad:?}");
            assert_eq!(h.get_all(&REQUEST_ID).iter().count(), 1);
        }
        let mut h = HeaderMap::new();
        h.append(REQUEST_ID, HeaderValue::from_static("a"));
        h.append(REQUEST_ID, HeaderValue::from_static("b"));
        let id = assign(&mut h, ip("127.0.0.1"), RequestIdTrust::Any, &none);
        assert!(id != "a" && id != "b");
        assert_eq!(h.get_all(&REQUEST_ID).iter().count(), 1);
        assert!(is_valid(&[b'x'; MAX_REQUEST_ID_BYTES]));
    }
}
