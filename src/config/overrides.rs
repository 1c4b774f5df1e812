//! `--set PATH=VALUE`: one configuration value replaced by a dotted path, for the
//! simulator's parameter studies (`spillway sim --set`, `--sweep`).
//!
//! `PATH` is dotted keys with list indexes: `placement`,
//! `function_zones[2].keep_alive_seconds`, or `function_zones[*].keep_alive_seconds` for
//! every item of a list. `VALUE` is read as YAML (`30`, `warm_first`, `[a, b]`,
//! `{ms: 5}`). The changed configuration is validated like a file; every problem is
//! reported under `PATH`.

use serde_json::Value;

use super::issues::ConfigError;
use super::schema::Config;
use super::yaml::{self, Kind, Node, Style, is_null_text};

/// `config` with `path` set to `value`.
///
/// # Errors
/// In words, naming `path`: a malformed path or value, a list index out of range, a key
/// the schema does not have, or a value the validation refuses.
pub fn with_override(config: &Config, path: &str, value: &str) -> Result<Config, String> {
    let fail = |m: String| format!("{path}: {m}");
    let new = parse_value(value).map_err(fail)?;
    // The printed config has the current spellings only: set the option an old one names.
    let steps = parse_path(&super::deprecated::canonical(path)).map_err(fail)?;
    let mut json = serde_json::to_value(config).expect("configs serialise");
    set(&mut json, &steps, &new).map_err(fail)?;
    let text = serde_json::to_string(&json).expect("JSON serialises");
    Config::from_yaml(&text, "--set").map_err(|e| match e {
        ConfigError::Invalid { issues, .. } => {
            let more = match issues.len() {
                0 | 1 => String::new(),
                n => format!(" (and {} more)", n - 1),
            };
            format!("{path}={value}: {}{more}", issues[0])
        }
        other => fail(other.to_string()),
    })
}

#[derive(Debug, PartialEq)]
enum Step {
    Key(String),
    Index(usize),
    All,
}

fn parse_path(path: &str) -> Result<Vec<Step>, String> {
    let mut steps = Vec::new();
    for part in path.split('.') {
        let (key, mut rest) = part.split_at(part.find('[').unwrap_or(part.len()));
        if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(format!("not a dotted path of keys: {path:?}"));
        }
        steps.push(Step::Key(key.to_string()));
        while let Some(inner) = rest.strip_prefix('[') {
            let end = inner
                .find(']')
                .ok_or_else(|| format!("unclosed `[` in {path:?}"))?;
            steps.push(match &inner[..end] {
                "*" => Step::All,
                n => Step::Index(
                    n.parse()
                        .map_err(|_| format!("`[{n}]` is neither an index nor `[*]`"))?,
                ),
            });
            rest = &inner[end + 1..];
        }
        if !rest.is_empty() {
            return Err(format!("unexpected {rest:?} in {path:?}"));
        }
    }
    Ok(steps)
}

fn set(at: &mut Value, steps: &[Step], new: &Value) -> Result<(), String> {
    let Some((step, rest)) = steps.split_first() else {
        *at = new.clone();
        return Ok(());
    };
    match step {
        Step::Key(k) => {
            let Value::Object(map) = at else {
                return Err(format!("`{k}` is inside something that is not a section"));
            };
            // An absent key is added: the schema then names it if it is unknown.
            set(map.entry(k.clone()).or_insert(Value::Null), rest, new)
        }
        Step::Index(i) => match at {
            Value::Array(items) => {
                let n = items.len();
                let item = items
                    .get_mut(*i)
                    .ok_or_else(|| format!("index [{i}] out of range ({n} items)"))?;
                set(item, rest, new)
            }
            _ => Err(format!("[{i}] on something that is not a list")),
        },
        Step::All => match at {
            Value::Array(items) if !items.is_empty() => {
                items.iter_mut().try_for_each(|item| set(item, rest, new))
            }
            Value::Array(_) => Err("[*] on an empty list".into()),
            _ => Err("[*] on something that is not a list".into()),
        },
    }
}

fn parse_value(text: &str) -> Result<Value, String> {
    let doc = yaml::parse(&format!("v: {text}\n")).map_err(|e| format!("value: {}", e.message))?;
    match &doc.kind {
        Kind::Map(m) if m.len() == 1 => Ok(to_json(&m[0].1)),
        _ => Err(format!("not one YAML value: {text:?}")),
    }
}

/// A YAML value as JSON by YAML 1.2's core schema (whole numbers stay whole).
fn to_json(n: &Node) -> Value {
    match &n.kind {
        Kind::Scalar(s, Style::Plain) if is_null_text(s) => Value::Null,
        Kind::Scalar(s, Style::Plain) => match s.as_str() {
            "true" => Value::Bool(true),
            "false" => Value::Bool(false),
            _ => s
                .parse::<i64>()
                .map(Value::from)
                .ok()
                .or_else(|| {
                    s.parse::<f64>()
                        .ok()
                        .filter(|v| v.is_finite())
                        .and_then(serde_json::Number::from_f64)
                        .map(Value::Number)
                })
                .unwrap_or_else(|| Value::String(s.clone())),
        },
        Kind::Scalar(s, _) => Value::String(s.clone()),
        Kind::Seq(items) => Value::Array(items.iter().map(to_json).collect()),
        Kind::Map(entries) => Value::Object(
            entries
                .iter()
                .map(|(k, v)| (yaml::scalar_text(k).to_string(), to_json(v)))
                .collect(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FAASIM: &str = include_str!("../../config/sim/faasim.yaml");

    fn faasim() -> Config {
        Config::from_yaml(FAASIM, "faasim.yaml").unwrap()
    }

    #[test]
    fn every_zones_keep_alive_and_the_placement_are_set() {
        let c = with_override(&faasim(), "function_zones[*].keep_alive_seconds", "12.5").unwrap();
        let p = c.placement_params();
        assert_eq!(p.zones.len(), 6);
        for z in &p.zones {
            let crate::policy::placement::ZoneCapacity::Instances(pool) = &z.capacity else {
                panic!()
            };
            assert_eq!(pool.keep_alive.as_secs_f64(), 12.5, "{}", z.name);
        }
        let c = with_override(&c, "function_zones[5].prewarmed_instances", "100").unwrap();
        let c = with_override(&c, "placement", "warm_first").unwrap();
        assert_eq!(
            c.placement_params().policy,
            crate::policy::placement::PlacementPolicy::WarmFirst
        );
        let crate::policy::placement::ZoneCapacity::Instances(cloud) =
            &c.placement_params().zones[5].capacity
        else {
            panic!()
        };
        assert_eq!(
            (cloud.prewarmed, cloud.keep_alive.as_secs_f64()),
            (100, 12.5)
        );
        // Untouched values survive the round trip.
        assert_eq!(c.sim.function.cold_start_ms.number(), 6090.0);
        let paper =
            Config::from_yaml(include_str!("../../config/sim/libra-paper.yaml"), "p.yaml").unwrap();
        let same = with_override(&paper, "libra.phi", "1.0").unwrap();
        assert_eq!(
            serde_json::to_value(&same).unwrap(),
            serde_json::to_value(&paper).unwrap()
        );
    }

    #[test]
    fn bad_paths_and_values_are_named() {
        let c = faasim();
        let e = with_override(&c, "function_zones[*].keep_alive_seconds", "-1").unwrap_err();
        assert!(
            e.starts_with("function_zones[*].keep_alive_seconds=-1: function_zones[0].keep_alive_seconds: expected a number of seconds from 0 to 31536000 (one year), found `-1`"),
            "{e}"
        );
        let e = with_override(&c, "function_zones[9].max_instances", "3").unwrap_err();
        assert_eq!(
            e,
            "function_zones[9].max_instances: index [9] out of range (6 items)"
        );
        let e = with_override(&c, "placement", "warmest").unwrap_err();
        assert!(
            e.starts_with("placement=warmest: placement: `warmest` is not a known value"),
            "{e}"
        );
        let e = with_override(&c, "function_zones[0].keep_alive_secs", "3").unwrap_err();
        assert!(
            e.contains("function_zones[0].keep_alive_secs: unknown key"),
            "{e}"
        );
        let e = with_override(&c, "libra..phi", "3").unwrap_err();
        assert!(e.starts_with("libra..phi: not a dotted path"), "{e}");
    }
}
