//! Old spellings that still read: each deprecated key with the key that replaced it. A
//! leaf: it imports no section.
//!
//! The schema reads an old spelling through `#[serde(alias = …)]` on the new field, so a
//! file written for an older release loads unchanged; [`warnings`] names every old
//! spelling a file uses, at its line and column (`spillway check` prints them, `serve`
//! logs them), and `--set` takes either spelling ([`canonical`]). Writing both spellings
//! of one option is an error (`duplicate field`).

use std::borrow::Cow;
use std::collections::HashMap;

use super::issues::ConfigIssue;
use super::yaml::Loc;

/// `(old path, new path)`: every deprecated spelling and the option it names. The
/// simulator's function model took its names from FaaSim (`max_concurrency`,
/// `prewarmed`); the live `function_tier: {type: process}` provider, which models the
/// same instances, says `max_instances` and `prewarmed_instances`.
pub(crate) const DEPRECATED_KEYS: &[(&str, &str)] = &[
    ("sim.function.max_concurrency", "sim.function.max_instances"),
    ("sim.function.prewarmed", "sim.function.prewarmed_instances"),
];

/// `path` with a deprecated spelling replaced by the key that replaced it
/// (`sim.function.prewarmed` → `sim.function.prewarmed_instances`); any other path as it is.
pub(crate) fn canonical(path: &str) -> Cow<'_, str> {
    for (old, new) in DEPRECATED_KEYS {
        if let Some(rest) = path.strip_prefix(old)
            && (rest.is_empty() || rest.starts_with(['.', '[']))
        {
            return Cow::Owned(format!("{new}{rest}"));
        }
    }
    Cow::Borrowed(path)
}

/// One warning per deprecated spelling present among `places` (the field paths of a
/// file and where they are), at the old key's place.
pub(crate) fn warnings(places: &HashMap<String, Loc>) -> Vec<ConfigIssue> {
    DEPRECATED_KEYS
        .iter()
        .filter_map(|(old, new)| {
            let loc = places.get(*old)?;
            let key = new.rsplit('.').next().unwrap_or(new);
            let mut w =
                ConfigIssue::new(*old, format!("deprecated spelling of {new}: write `{key}`"));
            w.location = Some(*loc);
            Some(w)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_replaces_only_a_whole_deprecated_key() {
        assert_eq!(
            canonical("sim.function.prewarmed"),
            "sim.function.prewarmed_instances"
        );
        assert_eq!(
            canonical("sim.function.max_concurrency"),
            "sim.function.max_instances"
        );
        // A key that merely starts like a deprecated one is a different key.
        assert_eq!(
            canonical("sim.function.prewarmed_x"),
            "sim.function.prewarmed_x"
        );
        assert_eq!(canonical("libra.phi"), "libra.phi");
    }
}
