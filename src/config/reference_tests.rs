//! `config/reference.yaml` against the code: every key of the schema appears in it (every
//! variant of every `type:`-tagged section too), and every default it shows is the code's.
//!
//! The reference is read line by line: a line `key: value  # comment`, commented out or
//! not, is an option; commented-out lines are uncommented (`# ` removed), and a repeated
//! key among siblings (`vm_pool:` three times) starts an alternative. From that, one
//! complete document per alternative is rendered and read with the config reader, which
//! records the fields and variants the schema asks for. Then, for every option line, the
//! document without that line is read again:
//! * a comment starting with `required` → reading must fail: that key is missing;
//! * a comment containing `default: none` → the key must come out absent (null);
//! * a section (a key with keys below it) → nothing more (its keys are checked);
//! * otherwise the value shown must be what the code fills in.
//!
//! Scalar enums (`architecture`, `address`, …) must name every value in their comment.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::Deserialize as _;
use serde_json::Value;

use super::Config;
use super::de::schema_log::{self, Asked};
use super::de::{DeError, NodeDe};
use super::yaml::{self, Kind, Node, Style, is_null_text};

/// One option line of the reference (after uncommenting).
#[derive(Clone, Debug)]
struct Entry {
    /// 1-based line in reference.yaml.
    line: usize,
    indent: usize,
    key: String,
    /// The value as written (`[]`, `127.0.0.1:8080`, empty for a section).
    value: String,
    /// The comment on the line and on its continuation lines.
    comment: String,
    children: Vec<Entry>,
}

const REFERENCE: &str = include_str!("../../config/reference.yaml");

/// `(uncommented line, was it commented)` when `raw` is an option line.
fn option_line(raw: &str) -> Option<String> {
    let trimmed = raw.trim_start();
    let text = if let Some(rest) = trimmed.strip_prefix('#') {
        let hash = raw.len() - trimmed.len();
        let rest = rest.strip_prefix(' ').unwrap_or(rest);
        format!("{}{rest}", &raw[..hash])
    } else {
        raw.to_string()
    };
    // `- key: value` starts a list item: read as `key: value` two columns further in.
    let text = match text.trim_start().strip_prefix("- ") {
        Some(rest) => format!("{}{rest}", " ".repeat(text.len() - rest.len())),
        None => text,
    };
    let body = text.trim_start();
    let key_len = body
        .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
        .unwrap_or(body.len());
    let after = &body[key_len..];
    (key_len > 0
        && body.as_bytes()[0].is_ascii_lowercase()
        && after.starts_with(':')
        && (after.len() == 1 || after[1..].starts_with(' ')))
    .then_some(text)
}

/// A pure comment line far to the right (its `#` at column 21 or later, inside a
/// commented-out block too) continues the previous option's comment.
fn continuation(raw: &str) -> Option<&str> {
    let t = raw.trim_start();
    let after = t.strip_prefix('#')?;
    let inner = after.trim_start();
    let (column, text) = match inner.strip_prefix('#') {
        Some(text) => (raw.len() - inner.len(), text),
        None => (raw.len() - t.len(), after),
    };
    (column >= 20).then(|| text.trim())
}

/// Split `value  # comment` at the first `#` after a space, outside quotes.
fn split_comment(rest: &str) -> (&str, &str) {
    let mut quote: Option<char> = None;
    let mut prev = ' ';
    for (i, c) in rest.char_indices() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None if c == '"' || c == '\'' => quote = Some(c),
            None if c == '#' && prev.is_whitespace() => {
                return (rest[..i].trim(), rest[i + 1..].trim());
            }
            None => {}
        }
        prev = c;
    }
    (rest.trim(), "")
}

fn parse_reference() -> Vec<Entry> {
    let mut flat: Vec<Entry> = Vec::new();
    for (i, raw) in REFERENCE.lines().enumerate() {
        if let Some(text) = option_line(raw) {
            let body = text.trim_start();
            if raw
                .trim_start()
                .trim_start_matches(['#', ' '])
                .starts_with("- ")
            {
                // A list item: an entry `-` two columns out holds its keys. Several
                // items of one list are alternatives, like a repeated key.
                flat.push(Entry {
                    line: 0,
                    indent: text.len() - body.len() - 2,
                    key: "-".to_string(),
                    value: String::new(),
                    comment: String::new(),
                    children: Vec::new(),
                });
            }
            let (key, rest) = body.split_once(':').expect("option lines have a colon");
            let (value, comment) = split_comment(rest);
            flat.push(Entry {
                line: i + 1,
                indent: text.len() - body.len(),
                key: key.to_string(),
                value: value.to_string(),
                comment: comment.to_string(),
                children: Vec::new(),
            });
        } else if let Some(more) = continuation(raw)
            && let Some(last) = flat.last_mut()
        {
            if !last.comment.is_empty() {
                last.comment.push(' ');
            }
            last.comment.push_str(more);
        }
    }
    // Nest by indentation.
    fn nest(flat: &[Entry], i: &mut usize, indent: usize) -> Vec<Entry> {
        let mut out = Vec::new();
        while *i < flat.len() && flat[*i].indent >= indent {
            let mut e = flat[*i].clone();
            *i += 1;
            if *i < flat.len() && flat[*i].indent > e.indent {
                let child_indent = flat[*i].indent;
                e.children = nest(flat, i, child_indent);
            }
            out.push(e);
        }
        out
    }
    let mut i = 0;
    nest(&flat, &mut i, 0)
}

/// The number of alternatives anywhere in the tree (the most copies of one key).
fn alternatives(entries: &[Entry]) -> usize {
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for e in entries {
        *counts.entry(&e.key).or_default() += 1;
    }
    let here = counts.values().copied().max().unwrap_or(1);
    entries
        .iter()
        .map(|e| alternatives(&e.children))
        .chain([here])
        .max()
        .unwrap_or(1)
}

/// Document `alt`: for a key written several times among siblings, its copy number
/// `min(alt, copies − 1)`; `skip` (a line number) is left out with its keys.
fn render(entries: &[Entry], alt: usize, skip: Option<usize>, out: &mut String) {
    let mut seen: HashMap<&str, usize> = HashMap::new();
    let copies = |k: &str| entries.iter().filter(|e| e.key == k).count();
    for e in entries {
        let n = seen.entry(&e.key).or_default();
        let chosen = *n == alt.min(copies(&e.key) - 1);
        *n += 1;
        if !chosen || Some(e.line) == skip {
            continue;
        }
        if e.key == "-" {
            out.push_str(&format!("{}-\n", " ".repeat(e.indent)));
        } else {
            out.push_str(&format!("{}{}: {}\n", " ".repeat(e.indent), e.key, e.value));
        }
        render(&e.children, alt, skip, out);
    }
}

/// The entries of document `alt` with their field paths.
fn chosen<'a>(entries: &'a [Entry], alt: usize, prefix: &str, out: &mut Vec<(String, &'a Entry)>) {
    let mut seen: HashMap<&str, usize> = HashMap::new();
    let copies = |k: &str| entries.iter().filter(|e| e.key == k).count();
    for e in entries {
        let n = seen.entry(&e.key).or_default();
        let pick = *n == alt.min(copies(&e.key) - 1);
        *n += 1;
        if pick {
            let path = if e.key == "-" {
                format!("{prefix}[0]")
            } else if prefix.is_empty() {
                e.key.clone()
            } else {
                format!("{prefix}.{}", e.key)
            };
            out.push((path.clone(), e));
            chosen(&e.children, alt, &path, out);
        }
    }
}

fn read(text: &str) -> Result<Config, DeError> {
    let tree = yaml::parse(text).unwrap_or_else(|e| panic!("{e:?} in\n{text}"));
    Config::deserialize(NodeDe(&tree))
}

/// A reference value as JSON, by YAML 1.2's core schema.
fn to_json(n: &Node) -> Value {
    match &n.kind {
        Kind::Scalar(s, Style::Plain) if is_null_text(s) => Value::Null,
        Kind::Scalar(s, Style::Plain) => match s.as_str() {
            "true" => Value::Bool(true),
            "false" => Value::Bool(false),
            _ => s
                .parse::<f64>()
                .ok()
                .filter(|_| s.starts_with(|c: char| c.is_ascii_digit() || c == '-'))
                .and_then(serde_json::Number::from_f64)
                .map_or_else(|| Value::String(s.clone()), Value::Number),
        },
        Kind::Scalar(s, Style::Text) => Value::String(s.clone()),
        Kind::Seq(items) => Value::Array(items.iter().map(to_json).collect()),
        Kind::Map(entries) => Value::Object(
            entries
                .iter()
                .map(|(k, v)| (yaml::scalar_text(k).to_string(), to_json(v)))
                .collect(),
        ),
    }
}

fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
            (x - y).abs() <= 1e-12 * x.abs().max(y.abs())
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same(a, b))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
        }
        _ => a == b,
    }
}

fn lookup<'a>(json: &'a Value, path: &str) -> &'a Value {
    path.split('.')
        .try_fold(json, |v, k| match k.strip_suffix("[0]") {
            Some(list) => v.get(list)?.get(0),
            None => v.get(k),
        })
        .unwrap_or(&Value::Null)
}

#[test]
fn the_reference_shows_every_key_of_the_schema_with_the_codes_default() {
    let tree = parse_reference();
    let docs = alternatives(&tree);
    let mut problems: Vec<String> = Vec::new();
    let mut tags_seen: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut tag_variants: BTreeMap<String, &'static [&'static str]> = BTreeMap::new();
    for alt in 0..docs {
        let mut text = String::new();
        render(&tree, alt, None, &mut text);
        let mut entries = Vec::new();
        chosen(&tree, alt, "", &mut entries);
        let by_path: HashMap<&str, &Entry> =
            entries.iter().map(|(p, e)| (p.as_str(), *e)).collect();
        let mut result = None;
        let asked = schema_log::during(|| result = Some(read(&text)));
        if let Some(Err(e)) = result {
            panic!(
                "reference document {alt} does not read: {}: {e}\n{text}",
                e.path()
            );
        }
        for a in asked {
            match a {
                Asked::Struct { path, fields, .. } => {
                    for f in fields {
                        let p = if path.is_empty() {
                            f.to_string()
                        } else {
                            format!("{path}.{f}")
                        };
                        // A deprecated spelling is named in its option's comment, not as a key.
                        let deprecated = super::deprecated::DEPRECATED_KEYS
                            .iter()
                            .any(|(old, _)| *old == p);
                        if !deprecated && !by_path.contains_key(p.as_str()) {
                            problems.push(format!("{p}: missing from config/reference.yaml"));
                        }
                    }
                }
                Asked::Enum {
                    path,
                    tag: Some(tag),
                    variants,
                } => {
                    let chosen = by_path
                        .get(format!("{path}.{tag}").as_str())
                        .map_or(String::new(), |e| e.value.clone());
                    tags_seen.entry(path.clone()).or_default().insert(chosen);
                    tag_variants.insert(path, variants);
                }
                Asked::Enum {
                    path,
                    tag: None,
                    variants,
                } => {
                    let comment = by_path.get(path.as_str()).map_or("", |e| &e.comment);
                    for v in variants {
                        if !comment.contains(v) {
                            problems
                                .push(format!("{path}: the comment does not name the value `{v}`"));
                        }
                    }
                }
            }
        }
        // Every option: required, absent by default, or its default shown.
        for (path, e) in &entries {
            if e.key == "type" || e.key == "distribution" || e.key == "-" {
                continue;
            }
            let mut without = String::new();
            render(&tree, alt, Some(e.line), &mut without);
            let place = format!("reference.yaml:{}: {path}", e.line);
            let result = read(&without);
            if e.comment.starts_with("required") {
                match result {
                    Err(err) if err.path() == *path && err.missing_field.is_some() => {}
                    Err(err) => problems.push(format!(
                        "{place}: marked required, but leaving it out gives {}: {err}",
                        err.path()
                    )),
                    Ok(_) => problems.push(format!(
                        "{place}: marked required, but the code has a default"
                    )),
                }
                continue;
            }
            let config = match result {
                Ok(c) => c,
                Err(err) => {
                    problems.push(format!(
                        "{place}: leaving it out fails ({}: {err}): mark it `required`",
                        err.path()
                    ));
                    continue;
                }
            };
            let json = serde_json::to_value(&config).expect("configs serialise");
            let got = lookup(&json, path);
            if e.comment.contains("default: none") {
                if !got.is_null() {
                    problems.push(format!(
                        "{place}: says `default: none`, but the code's default is {got}"
                    ));
                }
            } else if e.children.is_empty() {
                let shown = yaml::parse(&format!("v: {}\n", e.value)).unwrap();
                let Kind::Map(m) = &shown.kind else {
                    unreachable!()
                };
                let shown = to_json(&m[0].1);
                if !same(&shown, got) {
                    problems.push(format!(
                        "{place}: shows {shown}, the code's default is {got}"
                    ));
                }
            }
        }
    }
    for (path, variants) in &tag_variants {
        let seen = &tags_seen[path];
        for v in *variants {
            if !seen.contains(*v) {
                problems.push(format!("{path}: the variant `{v}` is not shown"));
            }
        }
    }
    // Shared sections are checked once per document: report each problem once.
    let mut once = BTreeSet::new();
    problems.retain(|p| once.insert(p.clone()));
    assert!(
        problems.is_empty(),
        "config/reference.yaml disagrees with the code:\n  {}",
        problems.join("\n  ")
    );
}

/// The checker itself notices a wrong default, an undocumented key and a false `required`.
#[test]
fn the_reference_check_notices_mistakes() {
    let entries = |text: &str| -> Vec<String> {
        text.lines()
            .filter_map(option_line)
            .map(|l| l.trim().to_string())
            .collect()
    };
    assert_eq!(
        entries("a: 1 # x\n# b: 2  # y\n  # prose: no\n#   c: [1]\n# Note: prose\n"),
        ["a: 1 # x", "b: 2  # y", "prose: no", "c: [1]"]
    );
    assert_eq!(
        split_comment(" \"#!/bin/sh\"   # text # more"),
        ("\"#!/bin/sh\"", "text # more")
    );
    let v = |s: &str| {
        let n = yaml::parse(&format!("v: {s}\n")).unwrap();
        let Kind::Map(m) = n.kind else { unreachable!() };
        to_json(&m[0].1)
    };
    assert!(same(&v("0.10"), &serde_json::json!(0.1)));
    assert!(same(&v("10"), &serde_json::json!(10.0)));
    assert!(!same(&v("0.2"), &serde_json::json!(0.3)));
    assert!(same(&v("[]"), &serde_json::json!([])));
    assert!(same(
        &v("127.0.0.1:8080"),
        &serde_json::json!("127.0.0.1:8080")
    ));
    assert!(!same(&v("{}"), &serde_json::json!({"a": 1})));
}
