//! A serde [`Deserializer`](serde::Deserializer) over the located YAML tree of
//! [`super::yaml`]: every error carries the line, column, field path and node it is
//! about, and says in words what was expected.
//!
//! * Scalars follow YAML 1.2's core schema: `~`/`null`/nothing is null; `true`/`false`;
//!   whole numbers (decimal, `0x…`, `0o…`); numbers (`1.5`, `1e3`, `.inf`, `.nan`).
//!   Quoted numbers are accepted where a number is expected; any scalar is accepted where
//!   text is expected (`qualifier: 7` is the text `7`).
//! * A section or list written with no value (`sim:`) is empty.
//! * `type:`-tagged sections: a schema enum whose serde name is a key (`#[serde(rename =
//!   "type")]` on an externally tagged enum) is read from a mapping holding that key: its
//!   value picks the variant, the other keys are the variant's fields. This is what keeps
//!   the fields of `vm_pool`/`function_tier` located, where serde's internally tagged
//!   enums would buffer them and lose their place.
//!
//! [`collect`] deserializes a whole document and keeps going after an error: it records
//! the error, removes the offending node from the tree and tries again, so that every
//! type error of a file is reported at once, like the semantic ones.

use std::fmt;

use serde::de::{self, DeserializeOwned, DeserializeSeed, Visitor};

use super::deprecated::DEPRECATED_KEYS;
use super::yaml::{Kind, Loc, Node, Style, is_null_text, scalar_text};

/// Where an error is: the node, its place and field path, and what to remove from the
/// tree to get past it.
#[derive(Clone, Debug)]
pub(crate) struct At {
    /// Node to remove before the next attempt (the node itself, or its section).
    pub prune: usize,
    /// Line and column.
    pub loc: Loc,
    /// Field path of the node.
    pub path: String,
}

/// A deserialization error of the config reader.
#[derive(Clone, Debug)]
pub(crate) struct DeError {
    /// What is wrong, in words.
    pub message: String,
    /// Set by the innermost node the error passed through.
    pub at: Option<At>,
    /// A required field that is absent (its path is `at.path` + the field).
    pub missing_field: Option<&'static str>,
    /// A free-form message from a value's own parser (socket address, CIDR, …).
    custom: bool,
    /// An unknown key's likely intended name: its absence is no second error.
    suggested: Option<&'static str>,
    /// A field set twice (its current and its deprecated spelling): placed at the key
    /// read last, the second one.
    duplicate: bool,
}

impl DeError {
    fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            at: None,
            missing_field: None,
            custom: false,
            suggested: None,
            duplicate: false,
        }
    }

    /// Attach `node` as the place, unless an inner node already did.
    fn located(mut self, node: &Node) -> Self {
        if self.at.is_none() {
            if self.custom
                && let Kind::Scalar(text, _) = &node.kind
                && !self.message.contains(text.as_str())
            {
                self.message = format!("{}, found `{text}`", self.message);
            }
            self.at = Some(At {
                prune: node.id,
                loc: node.report_loc(),
                path: node.path.clone(),
            });
        }
        self
    }

    /// The field path the error is about.
    pub(super) fn path(&self) -> String {
        let base = self.at.as_ref().map_or("", |a| a.path.as_str());
        match self.missing_field {
            Some(f) if base.is_empty() => f.to_string(),
            Some(f) => format!("{base}.{f}"),
            None => base.to_string(),
        }
    }
}

impl fmt::Display for DeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for DeError {}

/// Whether `key`, among a struct's `fields`, is a deprecated spelling of another of them
/// ([`DEPRECATED_KEYS`]).
fn is_deprecated_spelling(key: &str, fields: &[&str]) -> bool {
    let last = |p: &'static str| p.rsplit('.').next().unwrap_or(p);
    DEPRECATED_KEYS
        .iter()
        .any(|(old, new)| last(old) == key && fields.contains(&last(new)))
}

/// The near miss of `got` among `expected`, if one is close.
fn closest(got: &str, expected: &[&'static str]) -> Option<&'static str> {
    expected
        .iter()
        .map(|e| (strsim::jaro_winkler(got, e), *e))
        .filter(|(score, _)| *score > 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, e)| e)
}

/// ` (did you mean `x`?)` for a near miss among `expected`.
fn suggestion(got: &str, expected: &[&'static str]) -> String {
    closest(got, expected).map_or(String::new(), |e| format!(" (did you mean `{e}`?)"))
}

fn one_of(expected: &[&str]) -> String {
    match expected {
        [] => "nothing is accepted here".to_string(),
        [one] => format!("expected `{one}`"),
        _ => format!("expected one of: {}", expected.join(", ")),
    }
}

impl de::Error for DeError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        Self {
            custom: true,
            ..Self::new(msg.to_string())
        }
    }

    /// A key the YAML reader let through twice can only be two spellings of one option
    /// (the reader refuses a repeated key): say so, at the second one.
    fn duplicate_field(field: &'static str) -> Self {
        Self {
            duplicate: true,
            ..Self::new(format!(
                "sets `{field}` a second time (an old spelling of the same option): keep one"
            ))
        }
    }

    fn missing_field(field: &'static str) -> Self {
        Self {
            missing_field: Some(field),
            ..Self::new("required, but missing")
        }
    }

    fn unknown_field(field: &str, expected: &'static [&'static str]) -> Self {
        // The old spellings still read, but the keys to write are the current ones.
        let current: Vec<&'static str> = expected
            .iter()
            .copied()
            .filter(|k| !is_deprecated_spelling(k, expected))
            .collect();
        Self {
            suggested: closest(field, &current),
            ..Self::new(format!(
                "unknown key{}; {}",
                suggestion(field, &current),
                one_of(&current)
            ))
        }
    }

    fn unknown_variant(variant: &str, expected: &'static [&'static str]) -> Self {
        Self::new(format!(
            "`{variant}` is not a known value{}; {}",
            suggestion(variant, expected),
            one_of(expected)
        ))
    }

    fn invalid_type(unexp: de::Unexpected<'_>, exp: &dyn de::Expected) -> Self {
        Self::new(format!("expected {exp}, found {unexp}"))
    }

    fn invalid_value(unexp: de::Unexpected<'_>, exp: &dyn de::Expected) -> Self {
        // serde's `NonZero*` integers: a count where zero means nothing.
        if exp.to_string().starts_with("a nonzero u") {
            let found = match unexp {
                de::Unexpected::Unsigned(n) => n.to_string(),
                de::Unexpected::Signed(n) => n.to_string(),
                other => other.to_string(),
            };
            return Self::new(format!("expected a whole number ≥ 1, found {found}"));
        }
        Self::new(format!("expected {exp}, found {unexp}"))
    }

    fn invalid_length(len: usize, exp: &dyn de::Expected) -> Self {
        Self::new(format!("expected {exp}, found {len} item(s)"))
    }
}

/// A scalar's text, for numbers and booleans: plain or quoted (never null, never a
/// container).
fn scalar(node: &Node) -> Option<&str> {
    match &node.kind {
        Kind::Scalar(s, Style::Plain) if is_null_text(s) => None,
        Kind::Scalar(s, _) => Some(s.trim()),
        _ => None,
    }
}

/// A whole number in YAML 1.2 core syntax (`12`, `-3`, `+4`, `0x1f`, `0o17`).
fn parse_int(s: &str) -> Option<i128> {
    let (neg, digits) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let v = if let Some(hex) = digits.strip_prefix("0x") {
        i128::from_str_radix(hex, 16).ok()?
    } else if let Some(oct) = digits.strip_prefix("0o") {
        i128::from_str_radix(oct, 8).ok()?
    } else if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
        digits.parse().ok()?
    } else {
        return None;
    };
    Some(if neg { -v } else { v })
}

/// A number in YAML 1.2 core syntax (`1`, `-1.5`, `2e3`, `.5`, `.inf`, `-.inf`, `.nan`).
fn parse_float(s: &str) -> Option<f64> {
    if let Some(i) = parse_int(s) {
        return Some(i as f64);
    }
    let (sign, rest) = match s.as_bytes().first() {
        Some(b'-') => (-1.0, &s[1..]),
        Some(b'+') => (1.0, &s[1..]),
        _ => (1.0, s),
    };
    match rest {
        ".inf" | ".Inf" | ".INF" => return Some(sign * f64::INFINITY),
        ".nan" | ".NaN" | ".NAN" if rest.len() == s.len() => return Some(f64::NAN),
        _ => {}
    }
    let starts_ok = rest
        .as_bytes()
        .first()
        .is_some_and(|b| b.is_ascii_digit() || *b == b'.');
    let chars_ok = rest
        .bytes()
        .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'+' | b'-'));
    if starts_ok && chars_ok {
        rest.parse::<f64>().ok().map(|v| sign * v)
    } else {
        None
    }
}

fn parse_bool(s: &str) -> Option<bool> {
    match s {
        "true" | "True" | "TRUE" => Some(true),
        "false" | "False" | "FALSE" => Some(false),
        _ => None,
    }
}

/// What the schema asked the reader for, recorded while a test reads a document (see
/// `src/config/reference_tests.rs`): the field list of every struct and the variants of
/// every enum, by field path. Outside [`schema_log::during`] nothing is kept.
pub(crate) mod schema_log {
    use std::cell::RefCell;

    /// One request of the schema.
    #[derive(Clone, Debug)]
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) enum Asked {
        /// A struct (section, or a tagged section's variant) at `path` with these keys.
        Struct {
            path: String,
            fields: &'static [&'static str],
        },
        /// An enum at `path`: a tagged section (`tag` = its tag key) or a scalar.
        Enum {
            path: String,
            tag: Option<&'static str>,
            variants: &'static [&'static str],
        },
    }

    thread_local! {
        static LOG: RefCell<Option<Vec<Asked>>> = const { RefCell::new(None) };
    }

    pub(crate) fn record(a: Asked) {
        LOG.with(|l| {
            if let Some(v) = l.borrow_mut().as_mut() {
                v.push(a);
            }
        });
    }

    /// Run `f` and return what the schema asked for meanwhile.
    #[cfg(test)]
    pub(crate) fn during(f: impl FnOnce()) -> Vec<Asked> {
        LOG.with(|l| *l.borrow_mut() = Some(Vec::new()));
        f();
        LOG.with(|l| l.borrow_mut().take().unwrap_or_default())
    }
}

use schema_log::{Asked, record};

/// Deserializes one node.
pub(crate) struct NodeDe<'a>(pub &'a Node);

impl NodeDe<'_> {
    fn error(&self, message: impl Into<String>) -> DeError {
        DeError::new(message).located(self.0)
    }

    fn whole<T: TryFrom<i128>>(&self, min: i128, max: i128) -> Result<T, DeError> {
        let expected = if min == 0 && max <= 65_535 {
            format!("a whole number from 0 to {max}")
        } else if min == 0 {
            "a whole number ≥ 0".to_string()
        } else {
            "a whole number".to_string()
        };
        let Some(text) = scalar(self.0) else {
            return Err(self.error(format!("expected {expected}, found {}", self.0.describe())));
        };
        match parse_int(text) {
            Some(v) if v < min => Err(self.error(format!("expected {expected}, found {v}"))),
            Some(v) if v > max => {
                Err(self.error(format!("expected a whole number ≤ {max}, found {v}")))
            }
            Some(v) => T::try_from(v).map_err(|_| self.error(format!("expected {expected}"))),
            None if parse_float(text).is_some() => Err(self.error(format!(
                "expected {expected} (no fraction or exponent), found {text}"
            ))),
            None => Err(self.error(format!("expected {expected}, found `{text}`"))),
        }
    }

    fn float(&self) -> Result<f64, DeError> {
        match scalar(self.0).and_then(parse_float) {
            Some(v) => Ok(v),
            None => Err(self.error(format!("expected a number, found {}", self.0.describe()))),
        }
    }

    fn text(&self) -> Result<&str, DeError> {
        match &self.0.kind {
            Kind::Scalar(s, Style::Plain) if is_null_text(s) => {
                Err(self.error("expected text, found nothing (null)"))
            }
            Kind::Scalar(s, _) => Ok(s),
            _ => Err(self.error(format!("expected text, found {}", self.0.describe()))),
        }
    }

    fn entries(&self, what: &str) -> Result<&[(Node, Node)], DeError> {
        match &self.0.kind {
            Kind::Map(m) => Ok(m),
            _ if self.0.is_null() => Ok(&[]),
            _ => Err(self.error(format!(
                "expected {what} (`key: value` lines), found {}",
                self.0.describe()
            ))),
        }
    }

    fn items(&self) -> Result<&[Node], DeError> {
        match &self.0.kind {
            Kind::Seq(items) => Ok(items),
            _ if self.0.is_null() => Ok(&[]),
            _ => Err(self.error(format!(
                "expected a list (`[a, b]`, or one `- item` a line), found {}",
                self.0.describe()
            ))),
        }
    }
}

macro_rules! whole {
    ($($method:ident $visit:ident $t:ty),*) => {$(
        fn $method<V: Visitor<'de>>(self, v: V) -> Result<V::Value, DeError> {
            let x: $t = self.whole(<$t>::MIN as i128, <$t>::MAX as i128)?;
            v.$visit(x).map_err(|e: DeError| e.located(self.0))
        }
    )*};
}

impl<'de> de::Deserializer<'de> for NodeDe<'_> {
    type Error = DeError;

    fn deserialize_any<V: Visitor<'de>>(self, v: V) -> Result<V::Value, DeError> {
        let n = self.0;
        let r = match &n.kind {
            Kind::Scalar(s, Style::Plain) => {
                if is_null_text(s) {
                    v.visit_unit()
                } else if let Some(b) = parse_bool(s) {
                    v.visit_bool(b)
                } else if let Some(i) = parse_int(s) {
                    match (u64::try_from(i), i64::try_from(i)) {
                        (Ok(u), _) => v.visit_u64(u),
                        (_, Ok(i)) => v.visit_i64(i),
                        _ => v.visit_f64(i as f64),
                    }
                } else if let Some(f) = parse_float(s) {
                    v.visit_f64(f)
                } else {
                    v.visit_str(s)
                }
            }
            Kind::Scalar(s, Style::Text) => v.visit_str(s),
            Kind::Seq(items) => v.visit_seq(SeqAcc(items.iter())),
            Kind::Map(entries) => v.visit_map(MapAcc::new(entries, &[])),
        };
        r.map_err(|e: DeError| e.located(n))
    }

    fn deserialize_bool<V: Visitor<'de>>(self, v: V) -> Result<V::Value, DeError> {
        match scalar(self.0).and_then(parse_bool) {
            Some(b) => v.visit_bool(b).map_err(|e: DeError| e.located(self.0)),
            None => Err(self.error(format!(
                "expected true or false, found {}",
                self.0.describe()
            ))),
        }
    }

    whole!(deserialize_i8 visit_i8 i8, deserialize_i16 visit_i16 i16,
        deserialize_i32 visit_i32 i32, deserialize_i64 visit_i64 i64,
        deserialize_u8 visit_u8 u8, deserialize_u16 visit_u16 u16,
        deserialize_u32 visit_u32 u32, deserialize_u64 visit_u64 u64);

    fn deserialize_f32<V: Visitor<'de>>(self, v: V) -> Result<V::Value, DeError> {
        let x = self.float()?;
        v.visit_f32(x as f32)
            .map_err(|e: DeError| e.located(self.0))
    }

    fn deserialize_f64<V: Visitor<'de>>(self, v: V) -> Result<V::Value, DeError> {
        let x = self.float()?;
        v.visit_f64(x).map_err(|e: DeError| e.located(self.0))
    }

    fn deserialize_char<V: Visitor<'de>>(self, v: V) -> Result<V::Value, DeError> {
        let t = self.text()?;
        let mut chars = t.chars();
        match (chars.next(), chars.next()) {
            (Some(c), None) => v.visit_char(c).map_err(|e: DeError| e.located(self.0)),
            _ => Err(self.error(format!("expected one character, found `{t}`"))),
        }
    }

    fn deserialize_str<V: Visitor<'de>>(self, v: V) -> Result<V::Value, DeError> {
        let t = self.text()?;
        v.visit_str(t).map_err(|e: DeError| e.located(self.0))
    }

    fn deserialize_string<V: Visitor<'de>>(self, v: V) -> Result<V::Value, DeError> {
        self.deserialize_str(v)
    }

    fn deserialize_bytes<V: Visitor<'de>>(self, v: V) -> Result<V::Value, DeError> {
        self.deserialize_str(v)
    }

    fn deserialize_byte_buf<V: Visitor<'de>>(self, v: V) -> Result<V::Value, DeError> {
        self.deserialize_str(v)
    }

    fn deserialize_option<V: Visitor<'de>>(self, v: V) -> Result<V::Value, DeError> {
        let r = if self.0.is_null() {
            v.visit_none()
        } else {
            v.visit_some(NodeDe(self.0))
        };
        r.map_err(|e: DeError| e.located(self.0))
    }

    fn deserialize_unit<V: Visitor<'de>>(self, v: V) -> Result<V::Value, DeError> {
        if self.0.is_null() {
            v.visit_unit().map_err(|e: DeError| e.located(self.0))
        } else {
            Err(self.error(format!("expected nothing, found {}", self.0.describe())))
        }
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        v: V,
    ) -> Result<V::Value, DeError> {
        self.deserialize_unit(v)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        v: V,
    ) -> Result<V::Value, DeError> {
        v.visit_newtype_struct(NodeDe(self.0))
            .map_err(|e: DeError| e.located(self.0))
    }

    fn deserialize_seq<V: Visitor<'de>>(self, v: V) -> Result<V::Value, DeError> {
        let items = self.items()?;
        v.visit_seq(SeqAcc(items.iter()))
            .map_err(|e: DeError| e.located(self.0))
    }

    fn deserialize_tuple<V: Visitor<'de>>(self, len: usize, v: V) -> Result<V::Value, DeError> {
        let items = self.items()?;
        if items.len() != len {
            return Err(self.error(format!(
                "expected a list of {len} items, found {}",
                items.len()
            )));
        }
        v.visit_seq(SeqAcc(items.iter()))
            .map_err(|e: DeError| e.located(self.0))
    }

    fn deserialize_map<V: Visitor<'de>>(self, v: V) -> Result<V::Value, DeError> {
        let entries = self.entries("a mapping")?;
        MapAcc::new(entries, &[]).visit(v, self.0)
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, DeError> {
        record(Asked::Struct {
            path: self.0.path.clone(),
            fields,
        });
        let entries = self.entries("a section")?;
        MapAcc::new(entries, &[]).visit(v, self.0)
    }

    /// A scalar names a unit variant; a mapping holding the key `name` is a tagged
    /// section (see the module docs).
    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, DeError> {
        tagged_enum(self.0, name, variants, &[], v)
    }

    /// A [`SHARED_KEYS_SECTION`]: its two parts read from the one mapping.
    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        len: usize,
        v: V,
    ) -> Result<V::Value, DeError> {
        if name != SHARED_KEYS_SECTION {
            return self.deserialize_tuple(len, v);
        }
        let entries = self.entries("a section")?;
        v.visit_seq(SharedParts {
            map: self.0,
            entries,
            shared: None,
            next: 0,
        })
        .map_err(|e: DeError| e.located(self.0))
    }

    fn deserialize_identifier<V: Visitor<'de>>(self, v: V) -> Result<V::Value, DeError> {
        self.deserialize_str(v)
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, v: V) -> Result<V::Value, DeError> {
        v.visit_unit()
    }
}

/// `n` as an enum: a scalar names a unit variant; a mapping holding the key `name` is a
/// tagged section whose fields are its other keys, minus `shared`.
fn tagged_enum<'de, V: Visitor<'de>>(
    n: &Node,
    name: &'static str,
    variants: &'static [&'static str],
    shared: &[&'static str],
    v: V,
) -> Result<V::Value, DeError> {
    record(Asked::Enum {
        path: n.path.clone(),
        tag: matches!(n.kind, Kind::Map(_)).then_some(name),
        variants,
    });
    match &n.kind {
        Kind::Scalar(..) if !n.is_null() => {
            v.visit_enum(UnitEnum(n)).map_err(|e: DeError| e.located(n))
        }
        Kind::Map(entries) => {
            let Some((_, tag)) = entries.iter().find(|(k, _)| scalar_text(k) == name) else {
                return Err(NodeDe(n).error(format!(
                    "missing `{name}:` (one of: {})",
                    variants.join(", ")
                )));
            };
            let mut skip = vec![name];
            skip.extend_from_slice(shared);
            v.visit_enum(TaggedEnum {
                map: n,
                entries,
                skip,
                tag,
            })
            .map_err(|e: DeError| e.located(n))
        }
        _ => Err(NodeDe(n).error(format!(
            "expected a section with `{name}:` ({}), found {}",
            variants.join(", "),
            n.describe()
        ))),
    }
}

/// The serde name of a section read in two parts from one mapping: a tuple struct
/// `(Shared, Tagged)` whose `Shared` struct takes its own keys and whose `Tagged` enum
/// (a `type:`-tagged section) takes every other key. A function zone is one: `name`,
/// `kind` and `client_cidrs` beside a `function_tier` provider's keys. Each key keeps its
/// place, and an unknown key is reported by the tagged part (with its keys as the list).
pub(crate) const SHARED_KEYS_SECTION: &str = "spillway::shared_keys_section";

/// The two parts of a [`SHARED_KEYS_SECTION`], as a sequence.
struct SharedParts<'a> {
    map: &'a Node,
    entries: &'a [(Node, Node)],
    /// The shared part's keys, once it has been read.
    shared: Option<&'static [&'static str]>,
    next: u8,
}

impl<'de> de::SeqAccess<'de> for SharedParts<'_> {
    type Error = DeError;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, DeError> {
        self.next += 1;
        match self.next {
            1 => seed
                .deserialize(SharedPart {
                    map: self.map,
                    entries: self.entries,
                    fields: &mut self.shared,
                })
                .map(Some),
            2 => {
                let shared = self.shared.unwrap_or(&[]);
                seed.deserialize(TaggedPart {
                    map: self.map,
                    shared,
                })
                .map(Some)
            }
            _ => Ok(None),
        }
    }

    fn size_hint(&self) -> Option<usize> {
        Some(2usize.saturating_sub(usize::from(self.next)))
    }
}

/// The shared part of a [`SHARED_KEYS_SECTION`]: a struct reading only its own keys.
struct SharedPart<'a, 'b> {
    map: &'a Node,
    entries: &'a [(Node, Node)],
    fields: &'b mut Option<&'static [&'static str]>,
}

impl<'de> de::Deserializer<'de> for SharedPart<'_, '_> {
    type Error = DeError;

    fn deserialize_any<V: Visitor<'de>>(self, _v: V) -> Result<V::Value, DeError> {
        Err(NodeDe(self.map).error("the shared keys of a section must be a struct"))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, DeError> {
        record(Asked::Struct {
            path: self.map.path.clone(),
            fields,
        });
        *self.fields = Some(fields);
        MapAcc::only(self.entries, fields).visit(v, self.map)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf option unit unit_struct newtype_struct seq tuple
        tuple_struct map enum identifier ignored_any
    }
}

/// The tagged part of a [`SHARED_KEYS_SECTION`]: a `type:`-tagged enum over every key
/// but the shared ones.
struct TaggedPart<'a> {
    map: &'a Node,
    shared: &'static [&'static str],
}

impl<'de> de::Deserializer<'de> for TaggedPart<'_> {
    type Error = DeError;

    fn deserialize_any<V: Visitor<'de>>(self, _v: V) -> Result<V::Value, DeError> {
        Err(NodeDe(self.map).error("the rest of a shared-keys section must be a tagged enum"))
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, DeError> {
        tagged_enum(self.map, name, variants, self.shared, v)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf option unit unit_struct newtype_struct seq tuple
        tuple_struct map struct identifier ignored_any
    }
}

struct SeqAcc<'a>(std::slice::Iter<'a, Node>);

impl<'de> de::SeqAccess<'de> for SeqAcc<'_> {
    type Error = DeError;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, DeError> {
        match self.0.next() {
            Some(n) => seed
                .deserialize(NodeDe(n))
                .map(Some)
                .map_err(|e: DeError| e.located(n)),
            None => Ok(None),
        }
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.0.len())
    }
}

/// The entries of a mapping: without the keys in `skip` (a tagged section's tag, the
/// shared keys of a [`SHARED_KEYS_SECTION`]) and, with `keep`, only those keys.
struct MapAcc<'a> {
    entries: std::slice::Iter<'a, (Node, Node)>,
    skip: &'a [&'a str],
    keep: Option<&'a [&'static str]>,
    value: Option<&'a Node>,
    /// The key read last (where a field set twice is reported).
    key: Option<&'a Node>,
}

impl<'a> MapAcc<'a> {
    fn new(entries: &'a [(Node, Node)], skip: &'a [&'a str]) -> Self {
        Self {
            entries: entries.iter(),
            skip,
            keep: None,
            value: None,
            key: None,
        }
    }

    fn only(entries: &'a [(Node, Node)], keep: &'a [&'static str]) -> Self {
        Self {
            keep: Some(keep),
            ..Self::new(entries, &[])
        }
    }

    /// `v` visits these entries; an error is placed at the node it is about (a field set
    /// twice: the key read last), else at `section`.
    fn visit<'de, V: Visitor<'de>>(mut self, v: V, section: &Node) -> Result<V::Value, DeError> {
        v.visit_map(&mut self).map_err(|e: DeError| match self.key {
            Some(k) if e.duplicate => e.located(k).located(section),
            _ => e.located(section),
        })
    }
}

impl<'de> de::MapAccess<'de> for MapAcc<'_> {
    type Error = DeError;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, DeError> {
        for (k, v) in self.entries.by_ref() {
            let key = scalar_text(k);
            if self.skip.contains(&key) || self.keep.is_some_and(|keep| !keep.contains(&key)) {
                continue;
            }
            self.value = Some(v);
            self.key = Some(k);
            return seed
                .deserialize(NodeDe(k))
                .map(Some)
                .map_err(|e: DeError| e.located(k));
        }
        Ok(None)
    }

    fn next_value_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<T::Value, DeError> {
        let v = self
            .value
            .take()
            .expect("serde asks for a value after its key");
        seed.deserialize(NodeDe(v))
            .map_err(|e: DeError| e.located(v))
    }
}

/// A unit variant named by a scalar (`architecture: arm64`).
struct UnitEnum<'a>(&'a Node);

impl<'de> de::EnumAccess<'de> for UnitEnum<'_> {
    type Error = DeError;
    type Variant = Self;

    fn variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<(T::Value, Self), DeError> {
        let v = seed
            .deserialize(NodeDe(self.0))
            .map_err(|e: DeError| e.located(self.0))?;
        Ok((v, self))
    }
}

impl<'de> de::VariantAccess<'de> for UnitEnum<'_> {
    type Error = DeError;

    fn unit_variant(self) -> Result<(), DeError> {
        Ok(())
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, _seed: T) -> Result<T::Value, DeError> {
        Err(NodeDe(self.0).error(format!(
            "expected a section with its settings, found {}",
            self.0.describe()
        )))
    }

    fn tuple_variant<V: Visitor<'de>>(self, _len: usize, _v: V) -> Result<V::Value, DeError> {
        Err(NodeDe(self.0).error("expected a list"))
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        _fields: &'static [&'static str],
        _v: V,
    ) -> Result<V::Value, DeError> {
        Err(NodeDe(self.0).error(format!(
            "expected a section with its settings, found {}",
            self.0.describe()
        )))
    }
}

/// A `type:`-tagged section: the tag's value picks the variant, the other keys are its
/// fields.
struct TaggedEnum<'a> {
    map: &'a Node,
    entries: &'a [(Node, Node)],
    /// The tag key, then the shared keys read beside the section (if any).
    skip: Vec<&'a str>,
    tag: &'a Node,
}

impl<'de, 'a> de::EnumAccess<'de> for TaggedEnum<'a> {
    type Error = DeError;
    type Variant = Self;

    fn variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<(T::Value, Self), DeError> {
        match seed.deserialize(NodeDe(self.tag)) {
            Ok(v) => Ok((v, self)),
            Err(e) => {
                // Without a known variant nothing in the section can be read: drop it all.
                let mut e = e.located(self.tag);
                if let Some(at) = &mut e.at {
                    at.prune = self.map.id;
                }
                Err(e)
            }
        }
    }
}

impl<'de> de::VariantAccess<'de> for TaggedEnum<'_> {
    type Error = DeError;

    fn unit_variant(self) -> Result<(), DeError> {
        Ok(())
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, DeError> {
        seed.deserialize(Fields(self))
    }

    fn tuple_variant<V: Visitor<'de>>(self, _len: usize, _v: V) -> Result<V::Value, DeError> {
        Err(NodeDe(self.map).error("tuple variants are not supported"))
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, DeError> {
        record(Asked::Struct {
            path: self.map.path.clone(),
            fields,
        });
        MapAcc::new(self.entries, &self.skip).visit(v, self.map)
    }
}

/// A tagged section's fields (every key but the tag), as the variant's struct.
struct Fields<'a>(TaggedEnum<'a>);

impl<'de> de::Deserializer<'de> for Fields<'_> {
    type Error = DeError;

    fn deserialize_any<V: Visitor<'de>>(self, v: V) -> Result<V::Value, DeError> {
        MapAcc::new(self.0.entries, &self.0.skip).visit(v, self.0.map)
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, DeError> {
        record(Asked::Struct {
            path: self.0.map.path.clone(),
            fields,
        });
        self.deserialize_any(v)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf option unit unit_struct newtype_struct seq tuple
        tuple_struct map enum identifier ignored_any
    }
}

/// Keys that were removed from the schema, with what to write instead: an unknown key
/// at one of these paths is reported with the hint rather than the list of keys.
pub(crate) const REMOVED_KEYS: &[(&str, &str)] = &[
    (
        "async.enabled",
        "removed: asynchronous calls are off unless a route enables them \
         (`routes: [{name: jobs, path_prefix: /jobs, async: prefer}]`, or `async: always`)",
    ),
    (
        "async.store_dir",
        "removed: the store lives in the state directory, `spillway serve --state-dir DIR` \
         (or SPILLWAY_STATE_DIR; default $XDG_STATE_HOME/spillway, else \
         ~/.local/state/spillway, systemd's $STATE_DIRECTORY under the unit)",
    ),
    (
        "async.result_retention_seconds",
        "renamed: `async.result_ttl_seconds` (finished calls are deleted after it)",
    ),
];

/// One type error found by [`collect`].
#[derive(Clone, Debug)]
pub(crate) struct TypeError {
    /// Field path.
    pub path: String,
    /// Where.
    pub loc: Option<Loc>,
    /// What is wrong.
    pub message: String,
}

/// Deserialize `T` from `root`, collecting every type error: after each error the
/// offending node is removed and deserialization starts again (at most 100 times).
/// Returns the value read from what remained (`None` when nothing could be read), the
/// errors, and the paths removed (a semantic check of the result must not report what
/// was removed, nor what depends on it).
pub(crate) fn collect<T: DeserializeOwned>(
    mut root: Node,
) -> (Option<T>, Vec<TypeError>, Vec<String>) {
    let mut errors: Vec<TypeError> = Vec::new();
    let mut removed: Vec<String> = Vec::new();
    // Keys an unknown key probably meant (`commnd` → `command`): reported once, as the
    // unknown key.
    let mut meant: Vec<String> = Vec::new();
    for _ in 0..100 {
        let e = match T::deserialize(NodeDe(&root)) {
            Ok(v) => return (Some(v), errors, removed),
            Err(e) => e,
        };
        let path = e.path();
        if let Some(s) = e.suggested {
            let parent = path.rfind('.').map_or("", |i| &path[..i]);
            meant.push(if parent.is_empty() {
                s.to_string()
            } else {
                format!("{parent}.{s}")
            });
        }
        let consequence = removed.iter().any(|r| within(&path, r))
            || (e.missing_field.is_some() && meant.contains(&path));
        if !consequence {
            let hint = REMOVED_KEYS
                .iter()
                .find(|(p, _)| *p == path && e.message.starts_with("unknown key"))
                .map(|(_, h)| (*h).to_string());
            errors.push(TypeError {
                path: path.clone(),
                loc: e.at.as_ref().map(|a| a.loc),
                message: hint.unwrap_or_else(|| e.message.clone()),
            });
        }
        let Some(at) = e.at else { break };
        let Some(node_path) = root.find(at.prune).map(|n| n.path.clone()) else {
            break;
        };
        if at.prune == root.id || !root.remove(at.prune) {
            break;
        }
        removed.push(node_path);
    }
    (None, errors, removed)
}

/// Whether `path` is `base` or lies under it.
pub(crate) fn within(path: &str, base: &str) -> bool {
    path == base
        || (path.starts_with(base) && matches!(path.as_bytes().get(base.len()), Some(b'.' | b'[')))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::yaml;
    use serde::Deserialize;

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Doc {
        #[serde(default)]
        n: u32,
        #[serde(default)]
        x: f64,
        #[serde(default)]
        s: Option<String>,
        #[serde(default)]
        pair: Option<[f64; 2]>,
        #[serde(default)]
        kind: Option<Tagged>,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(rename = "type", rename_all = "snake_case")]
    enum Tagged {
        A(A),
        B { z: u16 },
    }

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct A {
        y: bool,
    }

    /// `(path, place, message)` of one error.
    type Found = (String, Option<Loc>, String);

    fn read(text: &str) -> (Option<Doc>, Vec<Found>) {
        let (v, errs, _) = collect::<Doc>(yaml::parse(text).unwrap());
        (
            v,
            errs.into_iter()
                .map(|e| (e.path, e.loc, e.message))
                .collect(),
        )
    }

    fn at(line: u64, column: u64) -> Option<Loc> {
        Some(Loc { line, column })
    }

    #[test]
    fn scalars_follow_the_core_schema() {
        let (v, e) = read("n: 0x10\nx: -1.5e1\ns: 7\npair: [1, .inf]\n");
        assert!(e.is_empty(), "{e:?}");
        let v = v.unwrap();
        assert_eq!((v.n, v.x, v.s.as_deref()), (16, -15.0, Some("7")));
        assert_eq!(v.pair, Some([1.0, f64::INFINITY]));
    }

    #[test]
    fn every_type_error_is_collected_with_its_place() {
        let (v, e) = read("n: -1\nx: abc\nzz: 1\npair: [1, 2, 3]\n");
        assert_eq!(
            e,
            [
                (
                    "n".into(),
                    at(1, 4),
                    "expected a whole number ≥ 0, found -1".into()
                ),
                (
                    "x".into(),
                    at(2, 4),
                    "expected a number, found `abc`".into()
                ),
                (
                    "zz".into(),
                    at(3, 1),
                    "unknown key; expected one of: n, x, s, pair, kind".into()
                ),
                (
                    "pair".into(),
                    at(4, 1),
                    "expected a list of 2 items, found 3".into()
                ),
            ]
        );
        assert_eq!(
            v,
            Some(Doc {
                n: 0,
                x: 0.0,
                s: None,
                pair: None,
                kind: None
            })
        );
    }

    #[test]
    fn fields_of_tagged_sections_keep_their_place() {
        let (v, e) = read("kind:\n  type: a\n  y: maybe\n");
        assert_eq!(
            e,
            [(
                "kind.y".into(),
                at(3, 6),
                "expected true or false, found `maybe`".into()
            )]
        );
        assert!(v.unwrap().kind.is_none(), "the bad section is dropped");
        let (v, e) = read("kind:\n  type: b\n  z: 70000\n");
        assert_eq!(e[0].0, "kind.z");
        assert_eq!(e[0].1, at(3, 6));
        assert_eq!(e[0].2, "expected a whole number ≤ 65535, found 70000");
        assert!(v.is_some());
        // A misspelt required key: one error, not a second "missing" one.
        let (_, e) = read("kind:\n  type: a\n  yy: true\n");
        assert_eq!(
            e,
            [(
                "kind.yy".into(),
                at(3, 3),
                "unknown key (did you mean `y`?); expected `y`".into()
            ),]
        );
        let (v, e) = read("kind:\n  type: a\n");
        assert_eq!(
            e,
            [("kind.y".into(), at(1, 1), "required, but missing".into())]
        );
        assert_eq!(v.unwrap().kind, None);
        assert_eq!(
            read("kind:\n  type: b\n  z: 1\n").0.unwrap().kind,
            Some(Tagged::B { z: 1 })
        );
    }

    #[test]
    fn an_unknown_variant_is_reported_once_and_drops_its_section() {
        let (v, e) = read("kind:\n  type: c\n  y: 1\nn: 2\n");
        assert_eq!(
            e,
            [(
                "kind.type".into(),
                at(2, 9),
                "`c` is not a known value; expected one of: a, b".into()
            )]
        );
        assert_eq!(v.unwrap().n, 2);
        let (_, e) = read("kind: {y: true}\n");
        assert_eq!(e[0].2, "missing `type:` (one of: a, b)");
    }

    #[test]
    fn values_parsed_by_their_own_type_name_the_text() {
        #[derive(Debug, Deserialize)]
        struct Addr {
            #[allow(dead_code)]
            a: std::net::SocketAddr,
        }
        let (_, e, _) = collect::<Addr>(yaml::parse("a: nope\n").unwrap());
        assert_eq!(e[0].path, "a");
        assert_eq!(e[0].loc, at(1, 4));
        assert!(e[0].message.contains("`nope`"), "{}", e[0].message);
    }
}
