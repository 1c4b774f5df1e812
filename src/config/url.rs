//! Configured URLs: [`HttpUrl`], an `http://` or `https://` URL with a host, parsed
//! once where it is read. A leaf: it imports no section.
//!
//! The reader refuses text that is not such a URL as a type error at the value's line
//! and column (``expected an http:// or https:// URL with a host, found `10.0.0.5:80` ``),
//! so the backends take the parsed [`http::Uri`] and never parse or check it again.
//! Sections with a narrower rule (plain `http://` only, a port, no path) check it on the
//! parsed value. Printed back, a URL is the text it was read from.

use std::fmt;
use std::str::FromStr;

use http::Uri;
use serde::de::{self, Deserializer};
use serde::ser::Serializer;
use serde::{Deserialize, Serialize};

/// An `http://` or `https://` URL with a host (`https://api.example.com/v1`), as written
/// and as parsed.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct HttpUrl {
    text: String,
    uri: Uri,
}

/// Why a text is not an [`HttpUrl`] (the message names what is expected).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("expected an http:// or https:// URL with a host{}", detail.as_deref().map_or(String::new(), |d| format!(" ({d})")))]
pub struct HttpUrlError {
    detail: Option<String>,
}

impl HttpUrl {
    /// The parsed URL.
    pub fn uri(&self) -> &Uri {
        &self.uri
    }

    /// The URL as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// `https://`?
    pub fn is_https(&self) -> bool {
        self.uri.scheme_str() == Some("https")
    }
}

impl FromStr for HttpUrl {
    type Err = HttpUrlError;

    /// # Errors
    /// [`HttpUrlError`] for text that does not parse as a URI, or whose scheme is not
    /// `http`/`https`, or that has no host.
    fn from_str(text: &str) -> Result<Self, HttpUrlError> {
        let uri: Uri = text
            .parse()
            .map_err(|e: http::uri::InvalidUri| HttpUrlError {
                detail: Some(e.to_string()),
            })?;
        let host = uri.authority().is_some_and(|a| !a.host().is_empty());
        if !matches!(uri.scheme_str(), Some("http" | "https")) || !host {
            return Err(HttpUrlError { detail: None });
        }
        Ok(Self {
            text: text.to_owned(),
            uri,
        })
    }
}

impl fmt::Display for HttpUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl<'de> Deserialize<'de> for HttpUrl {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(de::Error::custom)
    }
}

impl Serialize for HttpUrl {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_and_https_urls_with_a_host_read_and_print_as_written() {
        for text in [
            "http://10.0.0.5:8080",
            "https://api.example.com/v1?x=1",
            "http://[::1]:9",
        ] {
            let u: HttpUrl = text.parse().unwrap();
            assert_eq!(u.as_str(), text);
            assert_eq!(u.to_string(), text);
        }
        assert!("https://a.example".parse::<HttpUrl>().unwrap().is_https());
        assert!(!"http://a.example".parse::<HttpUrl>().unwrap().is_https());
    }

    #[test]
    fn other_text_is_refused_with_what_is_expected() {
        for text in [
            "10.0.0.5:80",
            "ftp://a.example/",
            "/relative",
            "",
            "http://",
            "not a url",
        ] {
            let e = text.parse::<HttpUrl>().unwrap_err().to_string();
            assert!(
                e.starts_with("expected an http:// or https:// URL with a host"),
                "{text:?}: {e}"
            );
        }
    }
}
