//! Target URL validation: load only ever goes to loopback.
//!
//! Both `--url` and `--admin` must be plain `http://` URLs whose host is a
//! loopback address: `localhost`, an IPv4 address in `127.0.0.0/8` or `[::1]`.
//! Anything else is refused before a single request is sent.

use std::net::IpAddr;

use anyhow::{Context, bail};
use hyper::Uri;

/// Whether `host` (as it appears in a URL authority, IPv6 in brackets) names a
/// loopback address. Host names other than `localhost` are not resolved.
pub(crate) fn is_loopback_host(host: &str) -> bool {
    if host.eq_ignore_ascii_case("localhost") || host.eq_ignore_ascii_case("localhost.") {
        return true;
    }
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    bare.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// Parse `text` as an `http://` URL on a loopback host. `flag` names the option
/// in error messages.
pub(crate) fn parse_loopback_url(text: &str, flag: &str) -> anyhow::Result<Uri> {
    parse_url(text, flag, false)
}

/// Parse `text` as an `http://` URL; unless `allow_remote` (the profiling mode's
/// explicit `--allow-remote`), its host must be loopback.
pub(crate) fn parse_url(text: &str, flag: &str, allow_remote: bool) -> anyhow::Result<Uri> {
    let uri: Uri = text
        .parse()
        .with_context(|| format!("{flag} {text:?} is not a valid URL"))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some(other) => bail!("{flag} {text:?}: scheme {other:?} is not supported, use http://"),
        None => bail!("{flag} {text:?} must be an absolute http:// URL"),
    }
    let Some(host) = uri.host() else {
        bail!("{flag} {text:?} has no host");
    };
    if !allow_remote && !is_loopback_host(host) {
        bail!(
            "{flag} {text:?}: host {host:?} is not a loopback address; load is only ever sent \
             to 127.0.0.0/8, localhost or [::1] (--profile-rmax accepts other hosts with \
             --allow-remote)"
        );
    }
    Ok(uri)
}

/// The `GET /status` URL of an admin endpoint given as its base URL (a trailing
/// slash or an explicit `/status` path are both accepted).
pub(crate) fn status_url(admin: &Uri) -> anyhow::Result<Uri> {
    let path = admin.path().trim_end_matches('/');
    let path = if path.ends_with("/status") {
        path.to_owned()
    } else {
        format!("{path}/status")
    };
    let authority = admin.authority().context("admin URL has no authority")?;
    Ok(Uri::builder()
        .scheme("http")
        .authority(authority.as_str())
        .path_and_query(path)
        .build()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_loopback_hosts() {
        for url in [
            "http://127.0.0.1:8080/sleep?ms=50",
            "http://127.1.2.3/",
            "http://127.255.255.254:1",
            "http://localhost:8080",
            "http://LOCALHOST/x",
            "http://[::1]:8080/",
        ] {
            parse_loopback_url(url, "--url").unwrap_or_else(|e| panic!("{url}: {e}"));
        }
    }

    #[test]
    fn rejects_other_hosts() {
        for url in [
            "http://10.0.0.1:8080/",
            "http://example.com/",
            "http://128.0.0.1/",
            "http://0.0.0.0:8080/",
            "http://[::2]/",
            "http://localhost.example.com/",
            "http://127.0.0.1.nip.io/",
        ] {
            let err = parse_loopback_url(url, "--url").unwrap_err().to_string();
            assert!(err.contains("not a loopback address"), "{url}: {err}");
        }
    }

    #[test]
    fn other_hosts_only_with_allow_remote() {
        let err = parse_url("http://10.0.0.1:8080/", "--url", false).unwrap_err();
        assert!(err.to_string().contains("--allow-remote"), "{err}");
        let uri = parse_url("http://10.0.0.1:8080/resize", "--url", true).unwrap();
        assert_eq!(uri.host(), Some("10.0.0.1"));
        assert!(parse_url("https://10.0.0.1/", "--url", true).is_err());
    }

    #[test]
    fn rejects_non_http_urls() {
        assert!(parse_loopback_url("https://127.0.0.1/", "--url").is_err());
        assert!(parse_loopback_url("127.0.0.1:8080", "--url").is_err());
        assert!(parse_loopback_url("/sleep", "--url").is_err());
        assert!(parse_loopback_url("not a url", "--url").is_err());
    }

    #[test]
    fn host_check_handles_brackets() {
        assert!(is_loopback_host("[::1]"));
        assert!(is_loopback_host("::1"));
        assert!(is_loopback_host("127.0.0.1"));
        assert!(!is_loopback_host("[::ffff:10.0.0.1]"));
        assert!(!is_loopback_host("10.0.0.1"));
        assert!(!is_loopback_host("example.com"));
    }

    #[test]
    fn status_url_appends_status() {
        let base = |s: &str| parse_loopback_url(s, "--admin").unwrap();
        let want = "http://127.0.0.1:9901/status";
        assert_eq!(status_url(&base("http://127.0.0.1:9901")).unwrap(), want);
        assert_eq!(status_url(&base("http://127.0.0.1:9901/")).unwrap(), want);
        assert_eq!(
            status_url(&base("http://127.0.0.1:9901/status")).unwrap(),
            want
        );
        assert_eq!(
            status_url(&base("http://[::1]:9901/admin/")).unwrap(),
            "http://[::1]:9901/admin/status"
        );
    }
}
