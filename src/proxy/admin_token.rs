//! The admin listener's bearer token (`gateway.admin_token_file` or `admin_token_env`):
//! held once, read by every admin connection ([`super::admin`]) and replaced by a reload
//! ([`super::reload`]).

use std::sync::Arc;

use http::{Request, header};

/// The admin bearer token in force, shared by the admin connections and replaceable
/// on reload. Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct AdminToken(Arc<parking_lot::RwLock<Option<String>>>);

impl AdminToken {
    /// A token holder starting with `token` (`None`: no authentication).
    pub fn new(token: Option<String>) -> Self {
        Self(Arc::new(parking_lot::RwLock::new(token)))
    }

    /// Replace the token (reload).
    pub fn set(&self, token: Option<String>) {
        *self.0.write() = token;
    }

    /// Whether a token is configured.
    pub fn is_set(&self) -> bool {
        self.0.read().is_some()
    }

    /// Whether `req` may read protected paths: no token configured, or
    /// `Authorization: Bearer <token>` (compared in constant time).
    pub fn admits<B>(&self, req: &Request<B>) -> bool {
        let held = self.0.read();
        let Some(token) = held.as_deref() else {
            return true;
        };
        let Some(given) = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(bearer_credentials)
        else {
            return false;
        };
        let (a, b) = (given.trim().as_bytes(), token.as_bytes());
        a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
    }
}

/// The credentials of an `Authorization: Bearer …` value; the scheme is matched in any
/// case (RFC 9110 §11.1).
fn bearer_credentials(value: &str) -> Option<&str> {
    let (scheme, rest) = value.trim_start().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| rest.trim())
        .filter(|t| !t.is_empty())
}
