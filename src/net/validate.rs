//! Request validation and normalization (http-cases C11 (b)–(c)): the
//! checks every request passes before routing, in one pure function, [`check`], so that
//! the router, the VM pool and every function tier see the same, normalized request.
//!
//! What [`check`] does, in this order (each step names the rule it implements):
//!
//! 1. **Method and request-target form** (RFC 9112 §3.2): `CONNECT` →
//!    [`RequestError::Connect`] (405, no tunnel is offered); the asterisk-form (`*`) only
//!    with `OPTIONS`; the authority-form (`host:port`) only with `CONNECT`; an
//!    absolute-form target only with the `http` or `https` scheme and no userinfo.
//!    `OPTIONS *` is answered by the gateway itself (204 with `Allow`).
//! 2. **Request-target length**: path and query over [`RequestRules::max_uri_bytes`] → 414.
//! 3. **Header section size**: more than [`RequestRules::max_header_count`] fields, or
//!    more than [`RequestRules::max_header_bytes`] bytes counted as HTTP/1.1 writes them
//!    (`name: value\r\n`, i.e. name + value + 4 per field; pseudo-header fields and the
//!    request line excluded) → 431. The same numbers on HTTP/1.1 and h2.
//! 4. **Host and authority** (RFC 9112 §3.2, RFC 9113 §8.3.1): more than one `Host`, none
//!    in an HTTP/1.1 request, or an invalid one (not `host[:port]`, userinfo, empty) → 400.
//!    *Absolute-form* (`GET http://internal.example/x` with `Host: public.example`): the
//!    URI's authority wins, as RFC 9112 §3.2.2 requires of a server, so the upstream gets
//!    `Host` (and the gateway's `X-Forwarded-Host`) equal to the URI's authority.
//!    *h2*: `:authority` is the authority; a `Host` field that differs from it → 400
//!    (RFC 9113 §8.3.1); without `:authority` the `Host` field is used; neither → 400.
//!    The request leaves with exactly one `Host` field: the effective authority.
//! 5. **Path normalization** ([`normalize_path`], Envoy's `normalize_path`,
//!    `merge_slashes` and `path_with_escaped_slashes_action` are the model) before
//!    routing and before any upstream base path is joined, so that a request can never
//!    climb out of a function tier's configured URL path. The request URI becomes the
//!    origin-form `normalized-path[?query]` (the query is left as it was).
//! 6. **Cookies** (RFC 9113 §8.2.3): several `cookie` fields (h2 splits the cookie
//!    header into crumbs; some HTTP/1.1 clients send several lines) are joined into one
//!    with `"; "`, so every backend — HTTP/1.1 upstreams and the Lambda events alike — sees
//!    one cookie header.
//!
//! 7. **Header names with `_`** ([`RequestRules::underscores`], Envoy's
//!    `headers_with_underscores_action`, nginx's `underscores_in_headers off`): many
//!    backends (CGI, WSGI, Rack, PHP and the frameworks on them) map `_` and `-` to the
//!    same variable, so a client's `X_Forwarded_For` or `X_Real_IP` would reach them as
//!    the header the gateway controls. Such fields are dropped (default), the request is
//!    refused (400), or they pass unchanged (`allow`).
//!
//! The result is stored in the request's extensions as a [`RequestTarget`]: the
//! normalized path and the effective authority, for route keys and path prefixes.

use std::fmt::Write as _;

use http::header::{self, HeaderMap, HeaderValue};
use http::uri::{Authority, PathAndQuery, Uri};
use http::{Method, Request, Response, StatusCode, Version};
use serde::{Deserialize, Serialize};

use super::body::{self, Body};

/// Methods the gateway forwards, for the `Allow` field of its own 405 and `OPTIONS *`
/// replies (every method but `CONNECT`; extension methods are forwarded too).
pub const ALLOW: &str = "GET, HEAD, POST, PUT, DELETE, OPTIONS, TRACE, PATCH";

/// Default `gateway.max_header_bytes`: 16 KiB.
pub const DEFAULT_MAX_HEADER_BYTES: usize = 16 * 1024;
/// Default `gateway.max_header_count`.
pub const DEFAULT_MAX_HEADER_COUNT: usize = 100;
/// Default `gateway.max_uri_bytes`: 8 KiB (the size RFC 9112 §3 recommends at least
/// supporting).
pub const DEFAULT_MAX_URI_BYTES: usize = 8 * 1024;

/// Limits and path rules for [`check`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestRules {
    /// Largest header section, bytes: Σ (name + value + 4) over the header fields.
    pub max_header_bytes: usize,
    /// Most header fields (every line counts; `Host` included, pseudo-headers not).
    pub max_header_count: usize,
    /// Longest request target (path and query), bytes; longer → 414.
    pub max_uri_bytes: usize,
    /// How paths are normalized.
    pub path: PathRules,
    /// What happens to header fields whose name holds `_`.
    pub underscores: UnderscoresAction,
}

impl Default for RequestRules {
    fn default() -> Self {
        Self {
            max_header_bytes: DEFAULT_MAX_HEADER_BYTES,
            max_header_count: DEFAULT_MAX_HEADER_COUNT,
            max_uri_bytes: DEFAULT_MAX_URI_BYTES,
            path: PathRules::default(),
            underscores: UnderscoresAction::default(),
        }
    }
}

/// What to do with a request header field whose name contains `_` —
/// `gateway.headers_with_underscores_action`, Envoy's option of that name.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UnderscoresAction {
    /// Forward the field unchanged. Unsafe in front of a backend that folds `_` into `-`.
    Allow,
    /// Remove the field, forward the request (the default; nginx's behaviour).
    #[default]
    DropHeader,
    /// Refuse the request: 400.
    RejectRequest,
}

impl RequestRules {
    /// The largest request head (request line + header section) hyper's HTTP/1 parser
    /// buffers before it answers 431 by itself: room for the longest target, the
    /// largest header section, and 1 KiB for the method, version and optional
    /// whitespace. [`check`] applies the exact limits.
    pub fn max_h1_head_bytes(&self) -> usize {
        self.max_uri_bytes
            .saturating_add(self.max_header_bytes)
            .saturating_add(1024)
    }

    /// The h2 `SETTINGS_MAX_HEADER_LIST_SIZE` that admits every request [`check`] admits:
    /// h2 counts name + value + 32 per field, pseudo-header fields included (RFC 9113
    /// §6.5.2). Above it the h2 layer answers 431 itself.
    pub fn h2_max_header_list_size(&self) -> u32 {
        let fields = self.max_header_count.saturating_add(8); // + pseudo-headers
        let bytes = self
            .max_header_bytes
            .saturating_add(self.max_uri_bytes)
            .saturating_add(fields.saturating_mul(32))
            .saturating_add(1024);
        u32::try_from(bytes).unwrap_or(u32::MAX)
    }
}

/// What to do with `%2F`, `%5C` (either case) and raw `\` in a path — Envoy's
/// `path_with_escaped_slashes_action`, with the same values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EscapedSlashesAction {
    /// Forward them as they are. Unsafe when an upstream decodes `%2F` or treats `\` as
    /// `/` (IIS, some Java containers): `/a/..%2F..%2Fb` then climbs at the upstream.
    KeepUnchanged,
    /// 400 (the default: nothing ambiguous reaches an upstream).
    #[default]
    RejectRequest,
    /// Unescape them to `/` and answer 307 with the normalized path in `Location`.
    UnescapeAndRedirect,
    /// Unescape them to `/`, then normalize, and forward.
    UnescapeAndForward,
}

/// Path normalization settings ([`normalize_path`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PathRules {
    /// RFC 3986 §6.2.2 normalization: percent-encoded unreserved characters decoded
    /// (`%41` → `A`, `%2E` → `.`), other percent-encodings upper-cased (`%2f` → `%2F`),
    /// dot-segments removed (§5.2.4). When off, the path is forwarded as received but a
    /// path with a dot-segment (`.`/`..`, also percent-encoded) is refused (400), so a
    /// request still never climbs out of an upstream base path.
    pub normalize: bool,
    /// Merge runs of `/` into one (`/a//b` → `/a/b`).
    pub merge_slashes: bool,
    /// Escaped slashes and backslashes.
    pub escaped_slashes: EscapedSlashesAction,
}

impl Default for PathRules {
    fn default() -> Self {
        Self {
            normalize: true,
            merge_slashes: true,
            escaped_slashes: EscapedSlashesAction::RejectRequest,
        }
    }
}

/// Why a request path is refused (400).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// `%2F`, `%5C` or `\` with `path_with_escaped_slashes_action: reject_request`.
    #[error("escaped slash or backslash in the path")]
    EscapedSlash,
    /// `%` not followed by two hex digits.
    #[error("invalid percent-encoding in the path")]
    BadPercentEncoding,
    /// `%00`.
    #[error("encoded NUL in the path")]
    EncodedNul,
    /// A dot-segment while `normalize_path` is off.
    #[error("dot-segment in the path (normalize_path is off)")]
    DotSegment,
    /// A segment that some servers read as a dot-segment with parameters (`..;x`,
    /// `.;x`, as Tomcat does).
    #[error("ambiguous dot-segment with parameters in the path")]
    DotSegmentWithParameters,
}

/// Why a request is refused; [`crate::net`] is a leaf, so the status codes are given in
/// the one place that maps errors to responses (`proxy::error`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// `CONNECT` (no tunnel feature is offered) → 405.
    #[error("CONNECT is not supported")]
    Connect,
    /// A request-target form not allowed with the method (RFC 9112 §3.2) → 400.
    #[error("{form} request target is not allowed with {method}")]
    TargetForm {
        /// `asterisk-form`, `authority-form`, …
        form: &'static str,
        /// The request method.
        method: String,
    },
    /// An absolute-form target (or h2 `:scheme`) whose scheme is not http/https → 400.
    #[error("unsupported scheme in the request target")]
    Scheme,
    /// Request target longer than the limit → 414.
    #[error("request target over {limit} bytes")]
    UriTooLong {
        /// `gateway.max_uri_bytes`.
        limit: usize,
    },
    /// Header section over the byte limit → 431.
    #[error("header section over {limit} bytes")]
    HeaderBytes {
        /// `gateway.max_header_bytes`.
        limit: usize,
    },
    /// More header fields than the limit → 431.
    #[error("more than {limit} header fields")]
    HeaderCount {
        /// `gateway.max_header_count`.
        limit: usize,
    },
    /// An HTTP/1.1 request without `Host`, or an h2 request without `:authority` and
    /// `Host` → 400.
    #[error("missing Host")]
    MissingHost,
    /// More than one `Host` field → 400.
    #[error("more than one Host field")]
    DuplicateHost,
    /// A `Host` or URI authority that is not `host[:port]` → 400.
    #[error("invalid Host or authority {0:?}")]
    InvalidHost(String),
    /// h2 `Host` differs from `:authority` → 400.
    #[error("Host {host:?} differs from :authority {authority:?}")]
    HostMismatch {
        /// The `Host` field.
        host: String,
        /// The `:authority` pseudo-header.
        authority: String,
    },
    /// The path was refused → 400.
    #[error(transparent)]
    Path(#[from] PathError),
    /// A header name with `_` under `headers_with_underscores_action: reject_request`
    /// → 400.
    #[error("header name with an underscore: {0}")]
    UnderscoreHeader(String),
}

/// The normalized request target, stored in the request's extensions by [`check`]:
/// route keys and path prefixes match on `path`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestTarget {
    /// The normalized path (no query), starting with `/`.
    pub path: String,
    /// The effective authority (`host[:port]`, as sent): the absolute-form URI's,
    /// h2 `:authority`, or `Host`. `None` only for an HTTP/1.0 request without `Host`.
    pub authority: Option<String>,
}

/// The outcome of [`check`].
#[derive(Debug)]
pub enum Checked<B> {
    /// Valid: forward this (normalized) request.
    Forward(Request<B>),
    /// The gateway answers itself without an error: `OPTIONS *` (204 with `Allow`) or the
    /// redirect of `unescape_and_redirect` (307 with `Location`).
    Answer(Response<Body>),
    /// Refused; the caller turns the error into a response.
    Refuse(RequestError),
}

/// Validate and normalize a request head (see the module documentation for the rules
/// and their order).
pub fn check<B>(req: Request<B>, rules: &RequestRules) -> Checked<B> {
    match check_inner(req, rules) {
        Ok(c) => c,
        Err(e) => Checked::Refuse(e),
    }
}

fn check_inner<B>(mut req: Request<B>, rules: &RequestRules) -> Result<Checked<B>, RequestError> {
    let h2 = req.version() == Version::HTTP_2;
    let method = req.method().clone();
    if method == Method::CONNECT {
        return Err(RequestError::Connect);
    }
    // 1. Target form.
    let uri = req.uri().clone();
    let asterisk = uri.path() == "*" && uri.query().is_none();
    if asterisk && method != Method::OPTIONS {
        return Err(RequestError::TargetForm {
            form: "asterisk-form",
            method: method.to_string(),
        });
    }
    if uri.authority().is_some() && uri.scheme().is_none() {
        return Err(RequestError::TargetForm {
            form: "authority-form",
            method: method.to_string(),
        });
    }
    if let Some(scheme) = uri.scheme_str()
        && !scheme.eq_ignore_ascii_case("http")
        && !scheme.eq_ignore_ascii_case("https")
    {
        return Err(RequestError::Scheme);
    }

    // 2. Target length.
    let target_len = uri.path_and_query().map_or(0, |pq| pq.as_str().len());
    if target_len > rules.max_uri_bytes {
        return Err(RequestError::UriTooLong {
            limit: rules.max_uri_bytes,
        });
    }

    // 3. Header section.
    let headers = req.headers();
    if headers.len() > rules.max_header_count {
        return Err(RequestError::HeaderCount {
            limit: rules.max_header_count,
        });
    }
    if header_bytes(headers) > rules.max_header_bytes {
        return Err(RequestError::HeaderBytes {
            limit: rules.max_header_bytes,
        });
    }

    // 4. Host and authority.
    let authority = effective_authority(&req, h2)?;

    // `OPTIONS *`: about the server as a whole, answered here.
    if asterisk {
        let mut resp = Response::new(body::empty());
        *resp.status_mut() = StatusCode::NO_CONTENT;
        resp.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static(ALLOW));
        return Ok(Checked::Answer(resp));
    }

    // 5. Path.
    let normalized = normalize_path(uri.path(), &rules.path)?;
    let mut pq = normalized.path.clone();
    if let Some(q) = uri.query() {
        pq.push('?');
        pq.push_str(q);
    }
    if normalized.redirect {
        let mut resp = Response::new(body::empty());
        *resp.status_mut() = StatusCode::TEMPORARY_REDIRECT;
        // Built only from URI characters, so it is always a valid header value.
        if let Ok(v) = HeaderValue::from_str(&pq) {
            resp.headers_mut().insert(header::LOCATION, v);
        }
        return Ok(Checked::Answer(resp));
    }
    let pq: PathAndQuery = pq
        .parse()
        .map_err(|_| RequestError::Path(PathError::BadPercentEncoding))?;
    *req.uri_mut() = Uri::from(pq);

    let h = req.headers_mut();
    if let Some(a) = &authority {
        // Validated as an authority above, so it is a valid header value.
        if let Ok(v) = HeaderValue::from_str(a) {
            h.insert(header::HOST, v);
        }
    }
    // 6. One cookie field.
    join_cookies(h);
    // 7. Header names with `_`.
    if rules.underscores != UnderscoresAction::Allow
        && let Some(name) = h.keys().find(|n| n.as_str().contains('_'))
    {
        if rules.underscores == UnderscoresAction::RejectRequest {
            return Err(RequestError::UnderscoreHeader(name.as_str().to_string()));
        }
        let names: Vec<header::HeaderName> = h
            .keys()
            .filter(|n| n.as_str().contains('_'))
            .cloned()
            .collect();
        for n in names {
            h.remove(n);
        }
    }

    req.extensions_mut().insert(RequestTarget {
        path: normalized.path,
        authority,
    });
    Ok(Checked::Forward(req))
}

/// Bytes of a header section as HTTP/1.1 writes it: Σ (name + value + 4) for
/// `name: value\r\n` (http-cases C11 (b)).
pub fn header_bytes(headers: &HeaderMap) -> usize {
    headers
        .iter()
        .map(|(n, v)| n.as_str().len() + v.len() + 4)
        .sum()
}

/// The authority the request is for (step 4 of [`check`]).
fn effective_authority<B>(req: &Request<B>, h2: bool) -> Result<Option<String>, RequestError> {
    let mut hosts = req.headers().get_all(header::HOST).iter();
    let host = match (hosts.next(), hosts.next()) {
        (_, Some(_)) => return Err(RequestError::DuplicateHost),
        (Some(v), None) => Some(valid_authority(v.as_bytes())?),
        (None, None) => None,
    };
    let uri_authority = match req.uri().authority() {
        Some(a) => Some(valid_authority(a.as_str().as_bytes())?),
        None => None,
    };
    match (h2, uri_authority, host) {
        // h2: `:authority` and a differing `Host` is malformed (RFC 9113 §8.3.1).
        (true, Some(a), Some(h)) if !a.eq_ignore_ascii_case(&h) => {
            Err(RequestError::HostMismatch {
                host: h,
                authority: a,
            })
        }
        (true, Some(a), _) => Ok(Some(a)),
        (true, None, Some(h)) => Ok(Some(h)),
        (true, None, None) => Err(RequestError::MissingHost),
        // HTTP/1.1 needs Host even with an absolute-form target (RFC 9112 §3.2) ...
        (false, _, None) if req.version() != Version::HTTP_10 => Err(RequestError::MissingHost),
        // ... whose authority then wins over it (RFC 9112 §3.2.2).
        (false, Some(a), _) => Ok(Some(a)),
        (false, None, h) => Ok(h),
    }
}

/// `value` as an authority `host[:port]` (RFC 9110 §7.2: uri-host [":" port]): no
/// userinfo, a non-empty host, a numeric port. Returns it as a string.
fn valid_authority(value: &[u8]) -> Result<String, RequestError> {
    let invalid = || RequestError::InvalidHost(String::from_utf8_lossy(value).into_owned());
    let text = std::str::from_utf8(value).map_err(|_| invalid())?;
    let a: Authority = text.parse().map_err(|_| invalid())?;
    if a.as_str().contains('@') || a.host().is_empty() {
        return Err(invalid());
    }
    // `host()` keeps IPv6 brackets; what follows it is nothing or `:port`.
    match a.as_str()[a.host().len()..].strip_prefix(':') {
        None if a.as_str().len() == a.host().len() => {}
        Some(port) if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => {
            port.parse::<u16>().map_err(|_| invalid())?;
        }
        _ => return Err(invalid()),
    }
    Ok(a.as_str().to_owned())
}

/// Join several `cookie` fields into one, separated by `"; "` (RFC 9113 §8.2.3); one or
/// none is left as is.
pub fn join_cookies(headers: &mut HeaderMap) {
    let mut values = headers.get_all(header::COOKIE).iter();
    if values.next().is_none() || values.next().is_none() {
        return;
    }
    let mut joined: Vec<u8> = Vec::new();
    for v in headers.get_all(header::COOKIE) {
        let v = v.as_bytes().trim_ascii();
        if v.is_empty() {
            continue;
        }
        if !joined.is_empty() {
            joined.extend_from_slice(b"; ");
        }
        joined.extend_from_slice(v);
    }
    // Made of valid header-value bytes joined with "; ", so always valid.
    if let Ok(v) = HeaderValue::from_bytes(&joined) {
        headers.insert(header::COOKIE, v);
    }
}

/// A normalized path ([`normalize_path`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NormalizedPath {
    /// The path, starting with `/`.
    pub path: String,
    /// Escaped slashes were unescaped under `unescape_and_redirect`: answer with a
    /// redirect to `path` instead of forwarding.
    pub redirect: bool,
}

/// Normalize a request path (no query) under `rules` (step 5 of [`check`]).
///
/// In order: escaped slashes (`%2F`, `%5C`, either case) and raw `\` per
/// [`PathRules::escaped_slashes`]; with [`PathRules::normalize`], RFC 3986 §6.2.2
/// percent-encoding normalization (`%00` and malformed `%` refused); with
/// [`PathRules::merge_slashes`], runs of `/` merged; then dot-segments removed (§5.2.4;
/// `..` never climbs above `/`), or refused when `normalize` is off. A segment that is a
/// dot-segment followed by `;parameters` (`..;x`) is always refused.
///
/// # Errors
/// [`PathError`] naming the ambiguity.
pub fn normalize_path(path: &str, rules: &PathRules) -> Result<NormalizedPath, PathError> {
    let bytes = path.as_bytes();
    let mut out = String::with_capacity(path.len() + 1);
    let mut unescaped = false;
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'%' {
            let (Some(&h), Some(&l)) = (bytes.get(i + 1), bytes.get(i + 2)) else {
                return Err(PathError::BadPercentEncoding);
            };
            let (Some(hi), Some(lo)) = (hex(h), hex(l)) else {
                return Err(PathError::BadPercentEncoding);
            };
            let decoded = hi << 4 | lo;
            i += 3;
            if decoded == 0 {
                return Err(PathError::EncodedNul);
            }
            if decoded == b'/' || decoded == b'\\' {
                match rules.escaped_slashes {
                    EscapedSlashesAction::RejectRequest => return Err(PathError::EscapedSlash),
                    EscapedSlashesAction::UnescapeAndForward
                    | EscapedSlashesAction::UnescapeAndRedirect => {
                        out.push('/');
                        unescaped = true;
                        continue;
                    }
                    EscapedSlashesAction::KeepUnchanged => {}
                }
            }
            if rules.normalize && is_unreserved(decoded) {
                out.push(char::from(decoded));
            } else if rules.normalize {
                let _ = write!(out, "%{decoded:02X}");
            } else {
                out.push_str(&path[i - 3..i]);
            }
            continue;
        }
        if b == b'\\' {
            match rules.escaped_slashes {
                EscapedSlashesAction::RejectRequest => return Err(PathError::EscapedSlash),
                EscapedSlashesAction::UnescapeAndForward
                | EscapedSlashesAction::UnescapeAndRedirect => {
                    out.push('/');
                    unescaped = true;
                    i += 1;
                    continue;
                }
                EscapedSlashesAction::KeepUnchanged => {}
            }
        }
        // Copy the run of ordinary bytes up to the next `%` or `\` (keeps UTF-8 whole).
        let end = bytes[i..]
            .iter()
            .position(|&c| c == b'%' || c == b'\\')
            .map_or(bytes.len(), |p| i + p.max(1));
        out.push_str(&path[i..end]);
        i = end;
    }
    if !out.starts_with('/') {
        out.insert(0, '/');
    }
    if rules.merge_slashes {
        let mut merged = String::with_capacity(out.len());
        for c in out.chars() {
            if !(c == '/' && merged.ends_with('/')) {
                merged.push(c);
            }
        }
        out = merged;
    }
    let path = remove_dot_segments(&out, rules.normalize)?;
    Ok(NormalizedPath {
        path,
        redirect: unescaped && rules.escaped_slashes == EscapedSlashesAction::UnescapeAndRedirect,
    })
}

/// RFC 3986 §5.2.4 on an absolute path, segment by segment. With `resolve` off, any
/// dot-segment is an error instead. Segments are compared after decoding `%2E`, so
/// `%2e%2E` is `..` whether or not the path was normalized.
fn remove_dot_segments(path: &str, resolve: bool) -> Result<String, PathError> {
    let mut kept: Vec<&str> = Vec::new();
    let segments: Vec<&str> = path[1..].split('/').collect();
    let last = segments.len() - 1;
    for (n, seg) in segments.iter().enumerate() {
        let dots = dot_segment(seg);
        if dots.is_none() && dot_segment(param_free(seg)).is_some() {
            return Err(PathError::DotSegmentWithParameters);
        }
        match dots {
            Some(_) if !resolve => return Err(PathError::DotSegment),
            Some(d) => {
                if d == 2 {
                    kept.pop();
                }
                if n == last {
                    kept.push("");
                }
            }
            None => kept.push(seg),
        }
    }
    Ok(format!("/{}", kept.join("/")))
}

/// `Some(1)` for `.`, `Some(2)` for `..` (either possibly written `%2E`/`%2e`).
fn dot_segment(seg: &str) -> Option<u8> {
    let mut dots = 0u8;
    let mut rest = seg.as_bytes();
    while !rest.is_empty() {
        if rest[0] == b'.' {
            rest = &rest[1..];
        } else if rest.len() >= 3 && rest[0] == b'%' && rest[1] == b'2' && rest[2] | 0x20 == b'e' {
            rest = &rest[3..];
        } else {
            return None;
        }
        dots += 1;
        if dots > 2 {
            return None;
        }
    }
    (dots > 0).then_some(dots)
}

/// The part of a segment before its first `;` (or `%3B`): what Java servlet containers
/// treat as the segment.
fn param_free(seg: &str) -> &str {
    let semi = seg.find(';');
    let enc = seg
        .as_bytes()
        .windows(3)
        .position(|w| w[0] == b'%' && w[1] == b'3' && w[2] | 0x20 == b'b');
    match (semi, enc) {
        (Some(a), Some(b)) => &seg[..a.min(b)],
        (Some(a), None) | (None, Some(a)) => &seg[..a],
        (None, None) => seg,
    }
}

fn hex(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

/// RFC 3986 §2.3 unreserved characters.
fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn rules(normalize: bool, merge: bool, esc: EscapedSlashesAction) -> PathRules {
        PathRules {
            normalize,
            merge_slashes: merge,
            escaped_slashes: esc,
        }
    }

    fn norm(p: &str) -> Result<String, PathError> {
        normalize_path(p, &PathRules::default()).map(|n| n.path)
    }

    #[test]
    fn dot_segments_are_resolved_and_never_climb_above_root() {
        for (input, want) in [
            ("/public/../admin", "/admin"),
            ("/../other-function/x", "/other-function/x"),
            ("/a/b/c/./../../g", "/a/g"),
            ("/a/b/..", "/a/"),
            ("/a/b/.", "/a/b/"),
            ("/a/./b/", "/a/b/"),
            ("/..", "/"),
            ("/../../..", "/"),
            ("/.", "/"),
            ("/", "/"),
            ("/a/%2e%2E/b", "/b"),
            ("/a/.%2e/b", "/b"),
            ("/a/%2E/b", "/a/b"),
            ("/a/...", "/a/..."),
            ("/a/..b/c", "/a/..b/c"),
            ("/a/b..", "/a/b.."),
        ] {
            assert_eq!(norm(input).as_deref(), Ok(want), "{input}");
        }
    }

    #[test]
    fn percent_encodings_are_normalized_per_rfc3986() {
        assert_eq!(norm("/%41%62c%7e%2d").unwrap(), "/Abc~-");
        assert_eq!(norm("/caf%c3%a9").unwrap(), "/caf%C3%A9");
        assert_eq!(norm("/a%20b").unwrap(), "/a%20b");
        assert_eq!(norm("/a%3fb").unwrap(), "/a%3Fb");
        assert_eq!(norm("/x%zz"), Err(PathError::BadPercentEncoding));
        assert_eq!(norm("/x%4"), Err(PathError::BadPercentEncoding));
        assert_eq!(norm("/x%"), Err(PathError::BadPercentEncoding));
        assert_eq!(norm("/x%00y"), Err(PathError::EncodedNul));
        // Raw UTF-8 is left alone.
        assert_eq!(norm("/café/./x").unwrap(), "/café/x");
    }

    #[test]
    fn slashes_are_merged_by_default_and_kept_when_asked() {
        assert_eq!(norm("//a///b//").unwrap(), "/a/b/");
        // Merged before dot-segments are removed, as a slash-merging upstream reads it.
        assert_eq!(norm("/a//../b").unwrap(), "/b");
        let keep = rules(true, false, EscapedSlashesAction::RejectRequest);
        assert_eq!(normalize_path("/a//b", &keep).unwrap().path, "/a//b");
        // RFC 3986 §5.2.4 pops the empty segment.
        assert_eq!(normalize_path("/a//../b", &keep).unwrap().path, "/a/b");
    }

    #[test]
    fn escaped_slashes_follow_the_configured_action() {
        for p in ["/a%2Fb", "/a%2fb", "/a%5Cb", "/a%5cb", "/a\\b"] {
            assert_eq!(norm(p), Err(PathError::EscapedSlash), "{p}");
        }
        let fwd = rules(true, true, EscapedSlashesAction::UnescapeAndForward);
        let n = normalize_path("/a/..%2F..%5Cb\\c", &fwd).unwrap();
        assert_eq!(n.path, "/b/c");
        assert!(!n.redirect);
        let redirect = rules(true, true, EscapedSlashesAction::UnescapeAndRedirect);
        let n = normalize_path("/x/a%2Fb", &redirect).unwrap();
        assert_eq!((n.path.as_str(), n.redirect), ("/x/a/b", true));
        let n = normalize_path("/x/a/../b", &redirect).unwrap();
        assert_eq!((n.path.as_str(), n.redirect), ("/x/b", false));
        let keep = rules(true, true, EscapedSlashesAction::KeepUnchanged);
        // Kept, not a separator: the segment `..%2F..` is not a dot-segment.
        assert_eq!(
            normalize_path("/a/..%2f../b", &keep).unwrap().path,
            "/a/..%2F../b"
        );
        assert_eq!(normalize_path("/a\\b", &keep).unwrap().path, "/a\\b");
    }

    #[test]
    fn without_normalization_dot_segments_are_refused_not_forwarded() {
        let off = rules(false, false, EscapedSlashesAction::KeepUnchanged);
        for p in ["/a/../b", "/a/./b", "/a/%2e%2e/b", "/a/..", "/%2E"] {
            assert_eq!(normalize_path(p, &off), Err(PathError::DotSegment), "{p}");
        }
        // Otherwise the bytes are untouched, percent-encodings included.
        assert_eq!(
            normalize_path("/a//%7eb/%2f", &off).unwrap().path,
            "/a//%7eb/%2f"
        );
    }

    #[test]
    fn dot_segments_with_parameters_are_refused() {
        for p in [
            "/public/..;/admin",
            "/a/.;x/b",
            "/a/..%3b/b",
            "/a/%2e%2e;jsessionid=1/b",
        ] {
            assert_eq!(norm(p), Err(PathError::DotSegmentWithParameters), "{p}");
        }
        assert_eq!(norm("/a;b/c").unwrap(), "/a;b/c");
    }

    fn req(version: Version, target: &str, headers: &[(&str, &str)]) -> Request<()> {
        let mut b = Request::builder().version(version).uri(target);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(()).unwrap()
    }

    fn forwarded(r: Request<()>) -> Request<()> {
        match check(r, &RequestRules::default()) {
            Checked::Forward(r) => r,
            other => panic!("not forwarded: {other:?}"),
        }
    }

    fn refused(r: Request<()>) -> RequestError {
        match check(r, &RequestRules::default()) {
            Checked::Refuse(e) => e,
            other => panic!("not refused: {other:?}"),
        }
    }

    #[test]
    fn host_rules_http1() {
        let v11 = Version::HTTP_11;
        assert_eq!(refused(req(v11, "/", &[])), RequestError::MissingHost);
        assert_eq!(
            refused(req(v11, "/", &[("host", "a"), ("host", "b")])),
            RequestError::DuplicateHost
        );
        for bad in ["a b/c", "", "u@a", "a:x", "a:", "a:99999", "[::1"] {
            assert!(
                matches!(
                    refused(req(v11, "/", &[("host", bad)])),
                    RequestError::InvalidHost(_)
                ),
                "{bad}"
            );
        }
        for good in ["a", "a.example:8080", "[2001:db8::1]:443", "127.0.0.1"] {
            let r = forwarded(req(v11, "/", &[("host", good)]));
            assert_eq!(r.headers()[header::HOST], good);
        }
        // HTTP/1.0 may omit Host.
        let r = forwarded(req(Version::HTTP_10, "/x", &[]));
        assert!(r.headers().get(header::HOST).is_none());
        assert_eq!(
            r.extensions().get::<RequestTarget>().unwrap().authority,
            None
        );
    }

    #[test]
    fn absolute_form_authority_wins_over_host() {
        let r = forwarded(req(
            Version::HTTP_11,
            "http://internal.example/admin?x=1",
            &[("host", "public.example")],
        ));
        assert_eq!(r.headers()[header::HOST], "internal.example");
        assert_eq!(r.uri(), "/admin?x=1");
        assert_eq!(
            r.extensions().get::<RequestTarget>(),
            Some(&RequestTarget {
                path: "/admin".into(),
                authority: Some("internal.example".into())
            })
        );
        // Still needs a Host line in HTTP/1.1.
        assert_eq!(
            refused(req(Version::HTTP_11, "http://a/x", &[])),
            RequestError::MissingHost
        );
        assert_eq!(
            refused(req(Version::HTTP_11, "ftp://a/x", &[("host", "a")])),
            RequestError::Scheme
        );
    }

    #[test]
    fn h2_authority_and_host_must_agree() {
        let v2 = Version::HTTP_2;
        let r = forwarded(req(v2, "https://a.example/x", &[]));
        assert_eq!(r.headers()[header::HOST], "a.example");
        let r = forwarded(req(v2, "https://a.example/x", &[("host", "A.example")]));
        assert_eq!(r.headers()[header::HOST], "a.example");
        assert_eq!(
            refused(req(v2, "https://a.example/x", &[("host", "b.example")])),
            RequestError::HostMismatch {
                host: "b.example".into(),
                authority: "a.example".into()
            }
        );
        let r = forwarded(req(v2, "/x", &[("host", "c.example")]));
        assert_eq!(r.headers()[header::HOST], "c.example");
        assert_eq!(refused(req(v2, "/x", &[])), RequestError::MissingHost);
    }

    #[test]
    fn methods_and_target_forms() {
        let v11 = Version::HTTP_11;
        let h = [("host", "a")];
        let connect = Request::builder()
            .method(Method::CONNECT)
            .uri("a:443")
            .header("host", "a:443")
            .body(())
            .unwrap();
        assert_eq!(refused(connect), RequestError::Connect);
        let mut get_star = req(v11, "*", &h);
        *get_star.method_mut() = Method::GET;
        assert!(matches!(
            refused(get_star),
            RequestError::TargetForm {
                form: "asterisk-form",
                ..
            }
        ));
        assert!(matches!(
            refused(req(v11, "a:80", &h)),
            RequestError::TargetForm {
                form: "authority-form",
                ..
            }
        ));
        let mut options = req(v11, "*", &h);
        *options.method_mut() = Method::OPTIONS;
        match check(options, &RequestRules::default()) {
            Checked::Answer(r) => {
                assert_eq!(r.status(), 204);
                assert_eq!(r.headers()[header::ALLOW], ALLOW);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn header_and_uri_limits() {
        let rules = RequestRules {
            max_header_bytes: 100,
            max_header_count: 3,
            max_uri_bytes: 20,
            path: PathRules::default(),
            underscores: UnderscoresAction::Allow,
        };
        let run = |r| check(r, &rules);
        // host: a (4+1+4 = 9) + x: 85 bytes (1 + 85 + 4 = 90) = 99 ≤ 100.
        let v = "v".repeat(85);
        assert!(matches!(
            run(req(Version::HTTP_11, "/", &[("host", "a"), ("x", &v)])),
            Checked::Forward(_)
        ));
        let v = "v".repeat(87);
        assert!(matches!(
            run(req(Version::HTTP_11, "/", &[("host", "a"), ("x", &v)])),
            Checked::Refuse(RequestError::HeaderBytes { limit: 100 })
        ));
        assert!(matches!(
            run(req(
                Version::HTTP_11,
                "/",
                &[("host", "a"), ("x", "1"), ("x", "2"), ("y", "3")]
            )),
            Checked::Refuse(RequestError::HeaderCount { limit: 3 })
        ));
        // Path and query: 20 bytes pass, 21 do not.
        let twenty = format!("/{}?{}", "p".repeat(9), "q".repeat(9));
        assert_eq!(twenty.len(), 20);
        assert!(matches!(
            run(req(Version::HTTP_11, &twenty, &[("host", "a")])),
            Checked::Forward(_)
        ));
        assert!(matches!(
            run(req(
                Version::HTTP_11,
                &format!("{twenty}q"),
                &[("host", "a")]
            )),
            Checked::Refuse(RequestError::UriTooLong { limit: 20 })
        ));
    }

    #[test]
    fn cookies_are_joined_into_one_field() {
        let r = forwarded(req(
            Version::HTTP_2,
            "https://a/x",
            &[("cookie", "a=1"), ("cookie", "b=2; c=3"), ("cookie", " ")],
        ));
        let all: Vec<_> = r.headers().get_all(header::COOKIE).iter().collect();
        assert_eq!(all, ["a=1; b=2; c=3"]);
        let r = forwarded(req(
            Version::HTTP_11,
            "/",
            &[("host", "a"), ("cookie", "s=1")],
        ));
        assert_eq!(r.headers()[header::COOKIE], "s=1");
    }

    #[test]
    fn the_request_leaves_in_origin_form_with_the_normalized_path() {
        let r = forwarded(req(
            Version::HTTP_11,
            "/public/../admin/%7euser?next=%2F..%2F&a=/../",
            &[("host", "a")],
        ));
        assert_eq!(r.uri(), "/admin/~user?next=%2F..%2F&a=/../");
        assert_eq!(
            r.extensions().get::<RequestTarget>().unwrap().path,
            "/admin/~user"
        );
        match check(
            req(Version::HTTP_11, "/a%2Fb?q=1", &[("host", "a")]),
            &RequestRules {
                path: rules(true, true, EscapedSlashesAction::UnescapeAndRedirect),
                ..RequestRules::default()
            },
        ) {
            Checked::Answer(r) => {
                assert_eq!(r.status(), 307);
                assert_eq!(r.headers()[header::LOCATION], "/a/b?q=1");
            }
            other => panic!("{other:?}"),
        }
    }

    proptest! {
        /// Whatever the path, a normalized path starts with `/`, has no dot-segment,
        /// is stable under a second normalization, and (joined to a base path) stays
        /// under that base.
        #[test]
        fn normalized_paths_never_climb(
            segs in proptest::collection::vec(
                prop_oneof![
                    Just("..".to_string()), Just(".".to_string()), Just("%2e%2E".to_string()),
                    Just("".to_string()), Just("%2F".to_string()), Just("a\\..".to_string()),
                    "[a-z%0-9]{0,4}",
                ],
                0..8,
            ),
            esc in prop_oneof![
                Just(EscapedSlashesAction::KeepUnchanged),
                Just(EscapedSlashesAction::RejectRequest),
                Just(EscapedSlashesAction::UnescapeAndForward),
            ],
            merge in any::<bool>(),
        ) {
            let path = format!("/{}", segs.join("/"));
            let r = rules(true, merge, esc);
            if let Ok(n) = normalize_path(&path, &r) {
                prop_assert!(n.path.starts_with('/'));
                for seg in n.path.split('/') {
                    prop_assert!(dot_segment(seg).is_none(), "{} -> {}", path, n.path);
                }
                let again = normalize_path(&n.path, &r).expect("normalized path is valid");
                prop_assert_eq!(&again.path, &n.path);
                let joined = format!("/fn/api{}", n.path);
                let resolved = remove_dot_segments(&joined, true).expect("no parameters");
                prop_assert!(resolved.starts_with("/fn/api/"), "{}", resolved);
            }
        }
    }

    #[test]
    fn header_names_with_underscores_are_dropped_refused_or_kept() {
        let headers = [
            ("host", "a"),
            ("x_forwarded_for", "10.6.6.6"),
            ("x_real_ip", "10.6.6.6"),
            ("x-forwarded-for", "203.0.113.1"),
        ];
        let with = |underscores| RequestRules {
            underscores,
            ..RequestRules::default()
        };
        match check(
            req(Version::HTTP_11, "/", &headers),
            &with(UnderscoresAction::DropHeader),
        ) {
            Checked::Forward(r) => {
                let names: Vec<&str> = r.headers().keys().map(|n| n.as_str()).collect();
                assert_eq!(names, ["host", "x-forwarded-for"]);
            }
            other => panic!("{other:?}"),
        }
        match check(
            req(Version::HTTP_2, "/", &headers),
            &with(UnderscoresAction::RejectRequest),
        ) {
            Checked::Refuse(RequestError::UnderscoreHeader(name)) => {
                assert_eq!(name, "x_forwarded_for");
            }
            other => panic!("{other:?}"),
        }
        match check(
            req(Version::HTTP_11, "/", &headers),
            &with(UnderscoresAction::Allow),
        ) {
            Checked::Forward(r) => assert_eq!(r.headers().len(), 4),
            other => panic!("{other:?}"),
        }
    }
}
