//! Route keys: which "function" a call belongs to, for the call-scheduling queue's
//! per-function history (call scheduling §4: `E[p]` is kept per function f(i)).
//!
//! A key is the first configured route (`routes:` — name, path prefix, methods) whose
//! prefix matches the request's normalized path at a segment boundary and whose method
//! list is empty or names the method; otherwise the path's first segment (`/thumb/7` →
//! `thumb`, `/` → `/`). Keys derived from paths are bounded in number: once
//! `max_keys` distinct keys exist, every new path falls into the one [`RouteKeys::OTHER`]
//! key, so a client cannot grow the gateway's memory by inventing paths.

use std::collections::HashMap;

/// One route key: an index into [`RouteKeys::names`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyId(pub u32);

/// One configured route (`routes:` entry).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteDef {
    /// The key name (metrics label, `/status`).
    pub name: String,
    /// Path prefix, starting with `/`; matches the path itself and anything below it
    /// (`/api/thumb` matches `/api/thumb` and `/api/thumb/7`, not `/api/thumbnail`).
    pub path_prefix: String,
    /// Upper-case method names; empty matches every method.
    pub methods: Vec<String>,
}

impl RouteDef {
    /// Whether this route matches `method` and the normalized `path`.
    pub fn matches(&self, method: &str, path: &str) -> bool {
        let p = self.path_prefix.trim_end_matches('/');
        let under = path
            .strip_prefix(p)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'));
        under && (self.methods.is_empty() || self.methods.iter().any(|m| m == method))
    }
}

/// The route-key table: configured routes first, then keys derived from paths (bounded).
#[derive(Clone, Debug)]
pub struct RouteKeys {
    routes: Vec<RouteDef>,
    names: Vec<String>,
    derived: HashMap<String, KeyId>,
    max_keys: usize,
}

impl RouteKeys {
    /// The overflow key (`other`): paths beyond the bound, and calls without a path.
    pub const OTHER: KeyId = KeyId(0);

    /// A table with the configured `routes` (each its own key, in order after
    /// [`Self::OTHER`]) and room for at most `max_keys` keys in all (configured ones
    /// included; at least the configured ones and `other`).
    pub fn new(routes: Vec<RouteDef>, max_keys: usize) -> Self {
        let mut names = vec!["other".to_string()];
        let mut derived = HashMap::new();
        for r in &routes {
            if !names.contains(&r.name) {
                names.push(r.name.clone());
            }
        }
        derived.insert("other".to_string(), Self::OTHER);
        let max_keys = max_keys.max(names.len());
        Self {
            routes,
            names,
            derived,
            max_keys,
        }
    }

    /// The key of a request: the first matching configured route, else the first path
    /// segment, else (bound reached) [`Self::OTHER`].
    pub fn resolve(&mut self, method: &str, path: &str) -> KeyId {
        if let Some(r) = self.routes.iter().find(|r| r.matches(method, path)) {
            let i = self.names.iter().position(|n| *n == r.name).unwrap_or(0);
            return KeyId(i as u32);
        }
        let seg = path.trim_start_matches('/').split('/').next().unwrap_or("");
        let seg = if seg.is_empty() { "/" } else { seg };
        self.named(seg)
    }

    /// The key called `name` (interned on first use, [`Self::OTHER`] beyond the bound).
    /// The simulator names functions directly.
    pub fn named(&mut self, name: &str) -> KeyId {
        if let Some(i) = self.names.iter().position(|n| n == name) {
            return KeyId(i as u32);
        }
        if let Some(k) = self.derived.get(name) {
            return *k;
        }
        if self.names.len() >= self.max_keys {
            return Self::OTHER;
        }
        let k = KeyId(self.names.len() as u32);
        self.names.push(name.to_string());
        self.derived.insert(name.to_string(), k);
        k
    }

    /// Every key's name, indexed by [`KeyId`].
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The name of `key`.
    pub fn name(&self, key: KeyId) -> &str {
        self.names
            .get(key.0 as usize)
            .map_or("other", String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(name: &str, prefix: &str, methods: &[&str]) -> RouteDef {
        RouteDef {
            name: name.into(),
            path_prefix: prefix.into(),
            methods: methods.iter().map(|m| m.to_string()).collect(),
        }
    }

    fn name(k: &mut RouteKeys, method: &str, path: &str) -> String {
        let key = k.resolve(method, path);
        k.name(key).to_string()
    }

    #[test]
    fn configured_routes_match_on_segment_boundaries_and_methods() {
        let mut k = RouteKeys::new(
            vec![
                route("thumb", "/api/thumb", &["GET"]),
                route("api", "/api/", &[]),
            ],
            8,
        );
        let thumb = k.resolve("GET", "/api/thumb/7");
        assert_eq!(name(&mut k, "GET", "/api/thumb/7"), "thumb");
        assert_eq!(k.resolve("GET", "/api/thumb"), thumb);
        assert_eq!(name(&mut k, "POST", "/api/thumb/7"), "api");
        assert_eq!(name(&mut k, "GET", "/api/thumbnail"), "api");
        assert_eq!(name(&mut k, "GET", "/video/1"), "video");
        assert_eq!(name(&mut k, "GET", "/"), "/");
    }

    #[test]
    fn derived_keys_are_bounded_and_overflow_into_other() {
        let mut k = RouteKeys::new(vec![route("a", "/a", &[])], 4);
        // other, a, then room for two derived keys.
        let b = k.resolve("GET", "/b");
        let c = k.resolve("GET", "/c/x");
        assert_ne!(b, c);
        assert_eq!(k.resolve("GET", "/d"), RouteKeys::OTHER);
        assert_eq!(k.resolve("GET", "/b/zz"), b, "known keys stay");
        assert_eq!(k.names().len(), 4);
    }
}
