//! `routes:` — named route keys (call scheduling §4: a call's "function" f(i)), shared by
//! the gateway queue and, later, the delay queue. A request's key is the first route whose
//! `path_prefix` matches its normalized path (at a segment boundary) and whose `methods`
//! (empty: all) name its method; otherwise its path's first segment
//! (`crate::policy::routes`).

use serde::{Deserialize, Serialize};

use super::duration::Seconds;
use super::issues::Issues;
use crate::policy::routes::RouteDef;

/// One `routes:` entry.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    /// The key's name (metrics label `route`, `/status`); unique, not `other`.
    pub name: String,
    /// Path prefix starting with `/`: matches the path itself and everything below it.
    pub path_prefix: String,
    /// HTTP methods (upper case); empty: every method.
    #[serde(default)]
    pub methods: Vec<String>,
    /// Whether the route's requests may be asynchronous calls (ProFaaStinate §3):
    /// `off` (default: `Prefer: respond-async` is ignored), `prefer` (those with
    /// `Prefer: respond-async`) or `always` (every one). Asynchronous calls are off
    /// unless a route enables them.
    #[serde(default, rename = "async")]
    pub async_mode: AsyncMode,
    /// The deadline of the route's asynchronous calls without a deadline header,
    /// seconds; absent: `async.default_deadline_seconds`.
    #[serde(default)]
    pub default_deadline_seconds: Option<Seconds>,
}

/// A route's `async:` setting: `off`, `prefer` or `always`; `true` and `false` are read
/// as `always` and `off` (the setting was a boolean before `prefer`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AsyncMode {
    /// Synchronous only: `Prefer: respond-async` is ignored.
    #[default]
    Off,
    /// Asynchronous when the request says `Prefer: respond-async` (RFC 7240).
    Prefer,
    /// Every request is an asynchronous call, with or without `Prefer`.
    Always,
}

impl<'de> Deserialize<'de> for AsyncMode {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = AsyncMode;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("off, prefer or always (or true/false)")
            }
            fn visit_bool<E: serde::de::Error>(self, b: bool) -> Result<AsyncMode, E> {
                Ok(if b { AsyncMode::Always } else { AsyncMode::Off })
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<AsyncMode, E> {
                match s {
                    "off" | "false" => Ok(AsyncMode::Off),
                    "prefer" => Ok(AsyncMode::Prefer),
                    "always" | "true" => Ok(AsyncMode::Always),
                    _ => Err(E::custom(format!(
                        "expected off, prefer or always (or true/false), found `{s}`"
                    ))),
                }
            }
        }
        d.deserialize_any(V)
    }
}

impl RouteConfig {
    /// The policy's route definition.
    pub fn def(&self) -> RouteDef {
        RouteDef {
            name: self.name.clone(),
            path_prefix: self.path_prefix.clone(),
            methods: self.methods.clone(),
        }
    }
}

/// Semantic checks of `routes`, each problem with its field path.
pub fn validate_routes(routes: &[RouteConfig], is: &mut Issues) {
    for (i, r) in routes.iter().enumerate() {
        let at = |f: &str| format!("routes[{i}].{f}");
        let valid_name = !r.name.is_empty()
            && r.name.len() <= 64
            && r.name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_-./".contains(c));
        if !valid_name {
            is.push(
                at("name"),
                format!(
                    "must be 1-64 characters of [A-Za-z0-9_./-], got {:?}",
                    r.name
                ),
            );
        } else if r.name == "other" {
            is.push(at("name"), "`other` is reserved for the overflow key");
        } else if routes[..i].iter().any(|o| o.name == r.name) {
            is.push(at("name"), format!("duplicate route name {:?}", r.name));
        }
        if !r.path_prefix.starts_with('/') {
            is.push(
                at("path_prefix"),
                format!("must start with '/', got {:?}", r.path_prefix),
            );
        }
        for (j, m) in r.methods.iter().enumerate() {
            if m.is_empty() || !m.chars().all(|c| c.is_ascii_uppercase()) {
                is.push(
                    format!("routes[{i}].methods[{j}]"),
                    format!("must be an upper-case method name like GET, got {m:?}"),
                );
            }
        }
    }
}
