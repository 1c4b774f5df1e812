//! Credentials never leave the process: [`redact`] is the one function that every log
//! line ([`RedactingStderr`], the writer of `spillway serve`'s logs), the `/status`
//! document ([`redact_json`]), the admin listener's error replies, the gateway's own
//! error bodies and `spillway check`'s errors and warnings pass their text through
//! (`spillway config print` applies the URL rule alone, [`redact_url_credentials`]).
//!
//! What it removes (the value becomes `***`, the rest of the text stays):
//!
//! * URL userinfo: `http://user:pass@host` → `http://***@host` (also `redis://:pw@h`);
//! * the value after a credential-looking key — a key containing `password`, `passwd`,
//!   `passphrase`, `secret`, `token`, `signature`, `credential`, `authorization`,
//!   `cookie`, `apikey`, `api_key`, `api-key` or `private_key` — in every spelling the
//!   gateway meets: `key=value` (query strings, log fields, AWS SigV4's
//!   `Credential=…, Signature=…`), `Header: value` (an `Authorization: Bearer x` keeps its
//!   scheme: `Authorization: Bearer ***`), `"key": "value"` (JSON, escaped or not) and
//!   `<Key>value</Key>` (AWS XML error bodies);
//! * `Bearer <token>` anywhere;
//! * AWS access key ids (`AKIA…`, `ASIA…`: the prefix stays).
//!
//! Hand-written rather than a regex set: the scan is one linear pass per rule over text
//! that is mostly short, the gateway has no regex dependency, and the key/value rules
//! (quotes, escapes, XML tags, header schemes) read more plainly as code than as one
//! pattern. An unquoted `key: value` is redacted only when the key ends with the word
//! (`X-Amz-Security-Token: …`), so that prose such as `credentials: set AWS_PROFILE`
//! keeps its words.

use std::borrow::Cow;
use std::io::Write;

/// What a removed secret is replaced with.
pub const REDACTED: &str = "***";

/// Longest error or reason text `/status` and a reply body show, characters (longer
/// text is cut and ends with `…`). Long enough for a provider error with its hint
/// (an EC2 tag address refusal names the instance, its addresses and the setting to
/// change in ~250 characters: the hint is the part an operator needs), short enough that
/// a provider's multi-kilobyte error body stays out of `/status`.
pub const MAX_REASON_CHARS: usize = 512;

/// Key words whose value is a secret (lower case).
const SECRET_WORDS: &[&str] = &[
    "password",
    "passwd",
    "passphrase",
    "secret",
    "token",
    "signature",
    "credential",
    "authorization",
    "cookie",
    "apikey",
    "api_key",
    "api-key",
    "private_key",
];

/// `text` with every credential removed (see the [module docs](self)); borrowed when
/// nothing had to go.
pub fn redact(text: &str) -> Cow<'_, str> {
    let mut out = Cow::Borrowed(text);
    if text.contains("://")
        && let Some(s) = redact_userinfo(&out)
    {
        out = Cow::Owned(s);
    }
    if let Some(s) = redact_keyed(&out) {
        out = Cow::Owned(s);
    }
    if let Some(s) = redact_access_key_ids(&out) {
        out = Cow::Owned(s);
    }
    out
}

/// `text` with only the URL userinfo rule applied (`redis://user:pw@host` →
/// `redis://***@host`): for text whose key names are not secrets although they contain
/// a secret word (`config print`'s YAML: `admin_token_file: /etc/token` is a path), but
/// whose URLs may carry a password.
pub fn redact_url_credentials(text: &str) -> Cow<'_, str> {
    if text.contains("://")
        && let Some(s) = redact_userinfo(text)
    {
        return Cow::Owned(s);
    }
    Cow::Borrowed(text)
}

/// [`redact`], then cut to `max_chars` characters (`…` marks a cut).
pub fn redact_short(text: &str, max_chars: usize) -> String {
    let out = redact(text);
    if out.chars().count() > max_chars {
        out.chars().take(max_chars).collect::<String>() + "…"
    } else {
        out.into_owned()
    }
}

/// Every string of `v` through [`redact_short`] with [`MAX_REASON_CHARS`] (the
/// `/status` document: condition reasons, last errors, instance names and URLs).
pub fn redact_json(v: &mut serde_json::Value) {
    use serde_json::Value;
    match v {
        Value::String(s) => {
            if redact(s).as_ref() != s.as_str() || s.chars().count() > MAX_REASON_CHARS {
                *s = redact_short(s, MAX_REASON_CHARS);
            }
        }
        Value::Array(a) => a.iter_mut().for_each(redact_json),
        Value::Object(m) => m.values_mut().for_each(redact_json),
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

/// Whether `b` ends a URL authority, a value or a word.
fn ends_authority(b: u8) -> bool {
    b.is_ascii_whitespace()
        || matches!(
            b,
            b'/' | b'?' | b'#' | b'"' | b'\'' | b'<' | b'>' | b'\\' | b'`' | b')'
        )
}

/// `scheme://userinfo@host` → `scheme://***@host`; `None` when there was none.
fn redact_userinfo(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = String::new();
    let mut copied = 0;
    let mut from = 0;
    while let Some(rel) = text[from..].find("://") {
        let start = from + rel + 3;
        let end = bytes[start..]
            .iter()
            .position(|&b| ends_authority(b))
            .map_or(bytes.len(), |p| start + p);
        if let Some(at) = text[start..end].rfind('@')
            && !text[start..start + at].is_empty()
            && &text[start..start + at] != REDACTED
        {
            out.push_str(&text[copied..start]);
            out.push_str(REDACTED);
            copied = start + at;
        }
        from = end.max(start);
    }
    (copied > 0).then(|| {
        out.push_str(&text[copied..]);
        out
    })
}

/// Whether `b` may be part of a key name (`X-Amz-Security-Token`, `client_secret`).
fn key_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.')
}

/// Whether `b` ends an unquoted value.
fn ends_value(b: u8) -> bool {
    b.is_ascii_whitespace()
        || matches!(
            b,
            b'&' | b',' | b';' | b'"' | b'\'' | b'<' | b'\\' | b')' | b'}' | b']' | b'`'
        )
}

/// The secret values after credential-looking keys, and `Bearer` tokens; `None` when
/// there were none.
fn redact_keyed(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let lower = text.to_ascii_lowercase();
    let lb = lower.as_bytes();
    // (start, end) of every value to replace, in order, not overlapping.
    let mut cuts: Vec<(usize, usize)> = Vec::new();
    let mut i = 0;
    while i < lb.len() {
        let found = SECRET_WORDS
            .iter()
            .filter_map(|w| lower[i..].find(w).map(|p| (i + p, w.len())))
            .chain(lower[i..].find("bearer ").map(|p| (i + p, 6)))
            .min();
        let Some((at, len)) = found else { break };
        let bearer = lb[at..].starts_with(b"bearer ");
        // The whole key around the word.
        let mut key_start = at;
        while key_start > 0 && key_byte(bytes[key_start - 1]) {
            key_start -= 1;
        }
        let mut key_end = at + len;
        while key_end < bytes.len() && key_byte(bytes[key_end]) {
            key_end += 1;
        }
        if bearer {
            if let Some((s, e)) = token_after(bytes, at + len) {
                cuts.push((s, e));
                i = e;
            } else {
                i = at + len;
            }
            continue;
        }
        let before = key_start.checked_sub(1).map(|k| bytes[k]);
        let quoted_key = matches!(before, Some(b'"' | b'\''));
        let xml = before == Some(b'<');
        let mut j = key_end;
        // A quoted key's closing quote (`"key"`, `\"key\"`).
        if j < bytes.len() && bytes[j] == b'\\' {
            j += 1;
        }
        if j < bytes.len() && matches!(bytes[j], b'"' | b'\'') {
            j += 1;
        }
        while j < bytes.len() && bytes[j] == b' ' {
            j += 1;
        }
        let sep = bytes.get(j).copied();
        let ends_with_word = key_end == at + len;
        let value = match sep {
            Some(b'=') => value_span(bytes, j + 1, false),
            Some(b':') if quoted_key || ends_with_word => value_span(bytes, j + 1, true),
            Some(b'>') if xml => {
                let s = j + 1;
                let e = bytes[s..]
                    .iter()
                    .position(|&b| b == b'<')
                    .map_or(bytes.len(), |p| s + p);
                (e > s).then_some((s, e))
            }
            _ => None,
        };
        match value {
            Some((s, e)) => {
                if &text[s..e] != REDACTED {
                    cuts.push((s, e));
                }
                i = e;
            }
            None => i = key_end,
        }
    }
    if cuts.is_empty() {
        return None;
    }
    let mut out = String::with_capacity(text.len());
    let mut copied = 0;
    for (s, e) in cuts {
        out.push_str(&text[copied..s]);
        out.push_str(REDACTED);
        copied = e;
    }
    out.push_str(&text[copied..]);
    Some(out)
}

/// The value that starts at `from` (after a separator): optional spaces and an
/// optional quote (escaped or not), then up to the closing quote or the end of the
/// word. A header value (`header`: after `:`) that starts with an authentication scheme
/// (`Bearer`, `Basic`, `AWS4-HMAC-SHA256`, …) keeps the scheme.
fn value_span(bytes: &[u8], from: usize, header: bool) -> Option<(usize, usize)> {
    let mut s = from;
    while s < bytes.len() && bytes[s] == b' ' {
        s += 1;
    }
    if s < bytes.len() && bytes[s] == b'\\' {
        s += 1;
    }
    if s < bytes.len() && matches!(bytes[s], b'"' | b'\'') {
        let q = bytes[s];
        let start = s + 1;
        let end = bytes[start..]
            .iter()
            .position(|&b| b == q || b == b'\\')
            .map_or(bytes.len(), |p| start + p);
        return (end > start).then_some((start, end));
    }
    let word_end = |s: usize| {
        bytes[s..]
            .iter()
            .position(|&b| ends_value(b))
            .map_or(bytes.len(), |p| s + p)
    };
    let e = word_end(s);
    if header
        && e < bytes.len()
        && bytes[e] == b' '
        && e > s
        && bytes[s..e]
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || *b == b'-')
        && let Some(span) = token_after(bytes, e)
    {
        return Some(span);
    }
    (e > s).then_some((s, e))
}

/// The word after the spaces at `from` (a scheme's credentials).
fn token_after(bytes: &[u8], from: usize) -> Option<(usize, usize)> {
    let mut s = from;
    while s < bytes.len() && bytes[s] == b' ' {
        s += 1;
    }
    let e = bytes[s..]
        .iter()
        .position(|&b| ends_value(b))
        .map_or(bytes.len(), |p| s + p);
    (e > s).then_some((s, e))
}

/// `AKIA…`/`ASIA…` access key ids (20 characters) → `AKIA***`; `None` when there were
/// none.
fn redact_access_key_ids(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = String::new();
    let mut copied = 0;
    let mut i = 0;
    while i + 20 <= bytes.len() {
        let prefix = &bytes[i..i + 4];
        if (prefix == b"AKIA" || prefix == b"ASIA")
            && (i == 0 || !bytes[i - 1].is_ascii_alphanumeric())
            && bytes[i + 4..i + 20]
                .iter()
                .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit())
            && bytes.get(i + 20).is_none_or(|b| !b.is_ascii_alphanumeric())
        {
            out.push_str(&text[copied..i + 4]);
            out.push_str(REDACTED);
            copied = i + 20;
            i += 20;
        } else {
            i += 1;
        }
    }
    (copied > 0).then(|| {
        out.push_str(&text[copied..]);
        out
    })
}

/// The log writer of the gateway: every formatted log line (text or JSON) goes through
/// [`redact`] before it reaches standard error. A `tracing_subscriber` writer: the fmt
/// layer formats one event, writes it, then drops the writer, which redacts and writes
/// the line in one call.
#[derive(Clone, Copy, Debug, Default)]
pub struct RedactingStderr;

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for RedactingStderr {
    type Writer = RedactedLine;

    fn make_writer(&'a self) -> Self::Writer {
        RedactedLine(Vec::with_capacity(256))
    }
}

/// One log line being written (see [`RedactingStderr`]).
#[derive(Debug)]
pub struct RedactedLine(Vec<u8>);

impl Write for RedactedLine {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for RedactedLine {
    fn drop(&mut self) {
        if self.0.is_empty() {
            return;
        }
        let line = redact_line(&self.0);
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }
}

/// A formatted log line, redacted. Colour codes (a terminal's text format) would split
/// `key=value`, so a line whose plain text needs redaction is written without them.
fn redact_line(bytes: &[u8]) -> Cow<'_, str> {
    let text = String::from_utf8_lossy(bytes);
    if !text.contains('\x1b') {
        return match text {
            Cow::Borrowed(t) => redact(t),
            Cow::Owned(t) => Cow::Owned(redact(&t).into_owned()),
        };
    }
    let plain = strip_ansi(&text);
    match redact(&plain) {
        Cow::Borrowed(_) => Cow::Owned(text.into_owned()),
        Cow::Owned(r) => Cow::Owned(r),
    }
}

/// `text` without ANSI escape sequences (`ESC [ … letter`).
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            if chars.next() == Some('[') {
                for d in chars.by_ref() {
                    if d.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(s: &str) -> String {
        redact(s).into_owned()
    }

    #[test]
    fn url_userinfo_goes_host_stays() {
        assert_eq!(
            r("GET http://user:pa55@10.0.0.1:8080/x failed"),
            "GET http://***@10.0.0.1:8080/x failed"
        );
        assert_eq!(
            r("redis://:hunter2@cache:6379/0"),
            "redis://***@cache:6379/0"
        );
        assert_eq!(
            r("\"url\":\"https://a:b@h/p\""),
            "\"url\":\"https://***@h/p\""
        );
        // No userinfo, or an @ in the path: unchanged.
        assert!(matches!(redact("http://h/a@b"), Cow::Borrowed(_)));
        assert_eq!(r("http://h:80/"), "http://h:80/");
    }

    #[test]
    fn values_of_credential_keys_go_in_every_spelling() {
        assert_eq!(
            r("failed token=abc123 password=p%40ss done"),
            "failed token=*** password=*** done"
        );
        assert_eq!(r("/x?a=1&api_key=K1&b=2"), "/x?a=1&api_key=***&b=2");
        assert_eq!(
            r("Authorization: Bearer eyJhbGciOi.x.y"),
            "Authorization: Bearer ***"
        );
        assert_eq!(
            r("authorization: Basic dXNlcjpwYXNz"),
            "authorization: Basic ***"
        );
        assert_eq!(
            r("X-Amz-Security-Token: FwoGZXIvYXdzEBYaDK"),
            "X-Amz-Security-Token: ***"
        );
        assert_eq!(r("Cookie: sid=abc; theme=dark"), "Cookie: ***; theme=dark");
        assert_eq!(
            r(r#"{"SecretAccessKey": "wJalrXUtnFEMI/K7MDENG", "Expiration": "x"}"#),
            r#"{"SecretAccessKey": "***", "Expiration": "x"}"#
        );
        // A JSON log line with an escaped JSON document inside a string.
        assert_eq!(
            r(r#"{"error":"{\"password\":\"hunter2\"}"}"#),
            r#"{"error":"{\"password\":\"***\"}"}"#
        );
        assert_eq!(r("see Bearer abc.def for"), "see Bearer *** for");
    }

    #[test]
    fn aws_error_bodies_lose_their_secrets() {
        let xml = "<Error><Code>AuthFailure</Code><Message>bad X-Amz-Credential=AKIAIOSFODNN7EXAMPLE/20250101/us-east-1/ec2/aws4_request, Signature=fe5f80f77d5fa3beca038a248ff027d0445342fe2855ddc963176630326f1024</Message><SessionToken>IQoJb3JpZ2luX2VjEN</SessionToken></Error>";
        let out = r(xml);
        for secret in [
            "AKIAIOSFODNN7EXAMPLE",
            "fe5f80f77d5fa3beca",
            "IQoJb3JpZ2luX2VjEN",
        ] {
            assert!(!out.contains(secret), "{secret} in {out}");
        }
        assert!(out.contains("<Code>AuthFailure</Code>"), "{out}");
        assert!(out.contains("<SessionToken>***</SessionToken>"), "{out}");
        assert_eq!(r("key AKIAIOSFODNN7EXAMPLE denied"), "key AKIA*** denied");
    }

    #[test]
    fn prose_keeps_its_words() {
        for s in [
            "no credentials: set AWS_PROFILE or AWS_ACCESS_KEY_ID",
            "the admin token file cannot be read",
            "retry budget: 3 tokens left",
            "connect to http://10.0.0.1:80/ failed: connection refused",
        ] {
            assert_eq!(r(s), s);
        }
        // Redacting twice changes nothing more.
        let once = r("token=abc http://u:p@h/");
        assert_eq!(r(&once), once);
    }

    #[test]
    fn long_reasons_are_cut_after_redaction() {
        let long = format!("password=hunter2 {}", "e".repeat(500));
        let out = redact_short(&long, MAX_REASON_CHARS);
        assert_eq!(out.chars().count(), MAX_REASON_CHARS + 1);
        assert!(
            out.starts_with("password=*** ") && out.ends_with('…'),
            "{out}"
        );
    }

    #[test]
    fn status_json_strings_are_redacted_and_cut() {
        let mut v = serde_json::json!({
            "vms": [{"instance": "http://u:pw@127.0.0.1:1/", "outstanding": 3}],
            "reason": format!("denied token=s3cr3t {}", "x".repeat(6800)),
        });
        redact_json(&mut v);
        assert_eq!(v["vms"][0]["instance"], "http://***@127.0.0.1:1/");
        assert_eq!(v["vms"][0]["outstanding"], 3);
        let reason = v["reason"].as_str().unwrap();
        assert!(reason.starts_with("denied token=*** x"), "{reason}");
        assert_eq!(reason.chars().count(), MAX_REASON_CHARS + 1);
    }

    #[test]
    fn a_coloured_log_line_is_redacted_through_its_colour_codes() {
        let line = "\x1b[3mtoken\x1b[0m\x1b[2m=\x1b[0ms3cr3t rest\n";
        assert_eq!(redact_line(line.as_bytes()), "token=*** rest\n");
        let plain = "\x1b[3mstatus\x1b[0m=200\n";
        assert_eq!(redact_line(plain.as_bytes()), plain);
    }
}
