//! A YAML document as a tree whose every node knows its line, column and field path.
//!
//! The configuration is read in two steps so that every error can name its place: the
//! YAML parser (`saphyr-parser`, the parser serde-saphyr is built on) turns the text into
//! this tree, then [`super::de`] deserializes the schema from the tree. serde's own
//! buffering of `type:`-tagged enums drops locations; walking a located tree keeps them.
//!
//! Supported YAML: one document of mappings, sequences and scalars (block or flow style),
//! anchors and aliases, merge keys (`<<: *base`), the `!!str` tag. Duplicate keys,
//! several documents and other tags are errors.

use std::collections::HashMap;
use std::fmt;

use saphyr_parser::{Event, Parser, ScalarStyle, Span};

/// A place in the file: 1-based line and column (in characters).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Loc {
    /// 1-based line.
    pub line: u64,
    /// 1-based column.
    pub column: u64,
}

impl fmt::Display for Loc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.column)
    }
}

/// How a scalar was written: plain scalars are resolved by YAML 1.2's core schema (null,
/// booleans, numbers); quoted and block scalars are always text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Style {
    /// Unquoted.
    Plain,
    /// Quoted, block (`|`, `>`), or tagged `!!str`.
    Text,
}

/// One node of the document.
#[derive(Clone, Debug)]
pub(crate) struct Node {
    /// Unique within the tree (aliases get fresh ids): errors name the node to prune.
    pub id: usize,
    /// Where the node starts.
    pub loc: Loc,
    /// Where the key naming this node starts (map values only).
    pub key_loc: Option<Loc>,
    /// Field path from the root: `gateway.trusted_proxies[1]`; empty for the root.
    pub path: String,
    /// The content.
    pub kind: Kind,
}

/// Node content.
#[derive(Clone, Debug)]
pub(crate) enum Kind {
    /// A scalar and how it was written.
    Scalar(String, Style),
    /// A sequence.
    Seq(Vec<Node>),
    /// A mapping: `(key, value)` in file order; keys are scalars.
    Map(Vec<(Node, Node)>),
}

impl Node {
    /// Where errors about this node point: the key that names it when it has one (a
    /// section, a list), else the node itself.
    pub fn report_loc(&self) -> Loc {
        match self.kind {
            Kind::Scalar(..) => self.loc,
            _ => self.key_loc.unwrap_or(self.loc),
        }
    }

    /// A plain scalar that YAML resolves to null (`~`, `null`, nothing).
    pub fn is_null(&self) -> bool {
        matches!(&self.kind, Kind::Scalar(s, Style::Plain) if is_null_text(s))
    }

    /// What the node is, for messages: `` `abc` ``, `a list`, `a mapping`, `nothing`.
    pub fn describe(&self) -> String {
        match &self.kind {
            _ if self.is_null() => "nothing (null)".into(),
            Kind::Scalar(s, _) => format!("`{s}`"),
            Kind::Seq(_) => "a list".into(),
            Kind::Map(_) => "a mapping".into(),
        }
    }

    /// Every node's path with its location (value location; for containers the key's).
    pub fn locations(&self) -> HashMap<String, Loc> {
        fn walk(n: &Node, out: &mut HashMap<String, Loc>) {
            out.entry(n.path.clone()).or_insert(n.report_loc());
            match &n.kind {
                Kind::Scalar(..) => {}
                Kind::Seq(items) => items.iter().for_each(|i| walk(i, out)),
                Kind::Map(entries) => entries.iter().for_each(|(_, v)| walk(v, out)),
            }
        }
        let mut out = HashMap::new();
        walk(self, &mut out);
        out
    }

    /// Remove the node with `id` (a map entry by its key or value, or a list item) from
    /// the tree. Returns whether it was found; the root cannot be removed.
    pub fn remove(&mut self, id: usize) -> bool {
        match &mut self.kind {
            Kind::Scalar(..) => false,
            Kind::Seq(items) => {
                if let Some(i) = items.iter().position(|n| n.id == id) {
                    items.remove(i);
                    return true;
                }
                items.iter_mut().any(|n| n.remove(id))
            }
            Kind::Map(entries) => {
                if let Some(i) = entries.iter().position(|(k, v)| k.id == id || v.id == id) {
                    entries.remove(i);
                    return true;
                }
                entries.iter_mut().any(|(_, v)| v.remove(id))
            }
        }
    }

    /// The node with `id`, if it is in the tree.
    pub fn find(&self, id: usize) -> Option<&Node> {
        if self.id == id {
            return Some(self);
        }
        match &self.kind {
            Kind::Scalar(..) => None,
            Kind::Seq(items) => items.iter().find_map(|n| n.find(id)),
            Kind::Map(entries) => entries
                .iter()
                .find_map(|(k, v)| if k.id == id { Some(k) } else { v.find(id) }),
        }
    }
}

/// YAML 1.2 core schema null: `~`, `null`, `Null`, `NULL` or nothing.
pub(crate) fn is_null_text(s: &str) -> bool {
    matches!(s, "" | "~" | "null" | "Null" | "NULL")
}

/// The document is not YAML (or uses something this reader does not accept).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyntaxError {
    /// Where.
    pub loc: Loc,
    /// What is wrong, in words.
    pub message: String,
}

fn loc_of(span: &Span) -> Loc {
    Loc {
        line: span.start.line() as u64,
        column: span.start.col() as u64 + 1,
    }
}

/// Parse `text` into a located tree. An empty document is an empty mapping.
///
/// # Errors
/// The first syntax error, with its place.
pub(crate) fn parse(text: &str) -> Result<Node, SyntaxError> {
    let mut b = Builder {
        events: Parser::new_from_str(text.strip_prefix('\u{FEFF}').unwrap_or(text)),
        anchors: HashMap::new(),
        next_id: 0,
        last: Loc { line: 1, column: 1 },
    };
    let mut root: Option<Node> = None;
    loop {
        let (event, span) = b.next()?;
        match event {
            Event::StreamStart | Event::DocumentEnd | Event::Nothing => {}
            Event::DocumentStart(_) if root.is_some() => {
                return Err(SyntaxError {
                    loc: loc_of(&span),
                    message: "a second YAML document (`---`): a config file holds one".into(),
                });
            }
            Event::DocumentStart(_) => {
                let (event, span) = b.next()?;
                if matches!(event, Event::DocumentEnd) {
                    continue;
                }
                root = Some(b.node(event, span, String::new(), None)?);
            }
            Event::StreamEnd => break,
            _ => {
                return Err(SyntaxError {
                    loc: loc_of(&span),
                    message: "unexpected content after the document".into(),
                });
            }
        }
    }
    Ok(root.unwrap_or_else(|| Node {
        id: b.fresh(),
        loc: Loc { line: 1, column: 1 },
        key_loc: None,
        path: String::new(),
        kind: Kind::Map(Vec::new()),
    }))
}

struct Builder<'a> {
    events: Parser<'a, saphyr_parser::StrInput<'a>>,
    anchors: HashMap<usize, Node>,
    next_id: usize,
    last: Loc,
}

impl<'a> Builder<'a> {
    fn next(&mut self) -> Result<(Event<'a>, Span), SyntaxError> {
        match self.events.next_event() {
            Some(Ok((event, span))) => {
                self.last = loc_of(&span);
                Ok((event, span))
            }
            Some(Err(e)) => Err(SyntaxError {
                loc: Loc {
                    line: e.marker().line() as u64,
                    column: e.marker().col() as u64 + 1,
                },
                message: syntax_message(e.info()),
            }),
            None => Err(SyntaxError {
                loc: self.last,
                message: "unexpected end of the file".into(),
            }),
        }
    }

    fn fresh(&mut self) -> usize {
        self.next_id += 1;
        self.next_id
    }

    fn node(
        &mut self,
        event: Event<'a>,
        span: Span,
        path: String,
        key_loc: Option<Loc>,
    ) -> Result<Node, SyntaxError> {
        let loc = loc_of(&span);
        let id = self.fresh();
        let (anchor, kind) = match event {
            Event::Alias(anchor) => {
                let Some(target) = self.anchors.get(&anchor).cloned() else {
                    return Err(SyntaxError {
                        loc,
                        message: "alias to an unknown anchor".into(),
                    });
                };
                let mut n = target;
                self.rebase(&mut n, &path);
                n.loc = loc;
                n.key_loc = key_loc;
                return Ok(n);
            }
            Event::Scalar(value, style, anchor, tag) => {
                let style = match (style, tag.as_deref()) {
                    (_, Some(t)) if t.handle == "tag:yaml.org,2002:" && t.suffix == "str" => {
                        Style::Text
                    }
                    (_, Some(t)) => {
                        return Err(SyntaxError {
                            loc,
                            message: format!(
                                "YAML tag `{}{}` is not supported here (only `!!str`)",
                                t.handle, t.suffix
                            ),
                        });
                    }
                    (ScalarStyle::Plain, None) => Style::Plain,
                    (_, None) => Style::Text,
                };
                (anchor, Kind::Scalar(value.into_owned(), style))
            }
            Event::SequenceStart(anchor, tag) => {
                reject_tag(loc, tag.as_deref())?;
                let mut items = Vec::new();
                loop {
                    let (event, span) = self.next()?;
                    if matches!(event, Event::SequenceEnd) {
                        break;
                    }
                    let item_path = format!("{path}[{}]", items.len());
                    items.push(self.node(event, span, item_path, None)?);
                }
                (anchor, Kind::Seq(items))
            }
            Event::MappingStart(anchor, tag) => {
                reject_tag(loc, tag.as_deref())?;
                (anchor, Kind::Map(self.mapping(&path)?))
            }
            _ => {
                return Err(SyntaxError {
                    loc,
                    message: "unexpected YAML event".into(),
                });
            }
        };
        let node = Node {
            id,
            loc,
            key_loc,
            path,
            kind,
        };
        if anchor != 0 {
            self.anchors.insert(anchor, node.clone());
        }
        Ok(node)
    }

    fn mapping(&mut self, path: &str) -> Result<Vec<(Node, Node)>, SyntaxError> {
        let mut entries: Vec<(Node, Node)> = Vec::new();
        let mut merged: Vec<(Node, Node)> = Vec::new();
        loop {
            let (event, span) = self.next()?;
            if matches!(event, Event::MappingEnd) {
                break;
            }
            let key_loc = loc_of(&span);
            let key = match event {
                Event::Scalar(value, ..) => value.into_owned(),
                Event::Alias(_) | Event::SequenceStart(..) | Event::MappingStart(..) => {
                    return Err(SyntaxError {
                        loc: key_loc,
                        message: "keys must be plain text (no lists, mappings or aliases as keys)"
                            .into(),
                    });
                }
                _ => {
                    return Err(SyntaxError {
                        loc: key_loc,
                        message: "unexpected YAML event".into(),
                    });
                }
            };
            let child_path = if path.is_empty() {
                key.clone()
            } else {
                format!("{path}.{key}")
            };
            let (event, span) = self.next()?;
            let value = self.node(event, span, child_path.clone(), Some(key_loc))?;
            if key == "<<" {
                // Merge key: the entries of the mapping (or list of mappings) are defaults
                // for this mapping; explicit keys win wherever they appear.
                let sources = match value.kind {
                    Kind::Map(m) => vec![m],
                    Kind::Seq(items) => {
                        let mut v = Vec::new();
                        for item in items {
                            match item.kind {
                                Kind::Map(m) => v.push(m),
                                _ => {
                                    return Err(SyntaxError {
                                        loc: item.loc,
                                        message: "`<<` merges mappings only".into(),
                                    });
                                }
                            }
                        }
                        v
                    }
                    _ => {
                        return Err(SyntaxError {
                            loc: value.loc,
                            message: "`<<` merges mappings only".into(),
                        });
                    }
                };
                for m in sources {
                    for (mut k, mut v) in m {
                        let name = scalar_text(&k).to_string();
                        let p = if path.is_empty() {
                            name.clone()
                        } else {
                            format!("{path}.{name}")
                        };
                        k.path = p.clone();
                        self.rebase(&mut v, &p);
                        if !merged.iter().any(|(mk, _)| scalar_text(mk) == name) {
                            merged.push((k, v));
                        }
                    }
                }
                continue;
            }
            if let Some((first, _)) = entries.iter().find(|(k, _)| scalar_text(k) == key) {
                return Err(SyntaxError {
                    loc: key_loc,
                    message: format!("duplicate key `{key}` (first at line {})", first.loc.line),
                });
            }
            let key_node = Node {
                id: self.fresh(),
                loc: key_loc,
                key_loc: None,
                path: child_path,
                kind: Kind::Scalar(key, Style::Text),
            };
            entries.push((key_node, value));
        }
        for (k, v) in merged {
            if !entries
                .iter()
                .any(|(ek, _)| scalar_text(ek) == scalar_text(&k))
            {
                entries.push((k, v));
            }
        }
        Ok(entries)
    }

    /// Give a copied subtree (alias, merge) fresh ids and paths under `path`.
    fn rebase(&mut self, n: &mut Node, path: &str) {
        n.id = self.fresh();
        n.path = path.to_string();
        match &mut n.kind {
            Kind::Scalar(..) => {}
            Kind::Seq(items) => {
                for (i, item) in items.iter_mut().enumerate() {
                    self.rebase(item, &format!("{path}[{i}]"));
                }
            }
            Kind::Map(entries) => {
                for (k, v) in entries.iter_mut() {
                    let name = scalar_text(k);
                    let p = if path.is_empty() {
                        name.to_string()
                    } else {
                        format!("{path}.{name}")
                    };
                    k.id = self.fresh();
                    k.path = p.clone();
                    self.rebase(v, &p);
                }
            }
        }
    }
}

fn reject_tag(loc: Loc, tag: Option<&saphyr_parser::Tag>) -> Result<(), SyntaxError> {
    match tag {
        None => Ok(()),
        Some(t) => Err(SyntaxError {
            loc,
            message: format!("YAML tag `{}{}` is not supported here", t.handle, t.suffix),
        }),
    }
}

/// The text of a scalar node (keys are always scalars).
pub(crate) fn scalar_text(n: &Node) -> &str {
    match &n.kind {
        Kind::Scalar(s, _) => s,
        _ => "",
    }
}

/// The parser's messages, completed into sentences where they are terse.
fn syntax_message(info: &str) -> String {
    let m = info.trim();
    let m = m
        .strip_prefix("while parsing ")
        .map_or(m.to_string(), |rest| {
            format!("YAML syntax error while parsing {rest}")
        });
    if m.starts_with("YAML") {
        m
    } else {
        format!("YAML syntax error: {m}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn locs(text: &str) -> HashMap<String, Loc> {
        parse(text).unwrap().locations()
    }

    #[test]
    fn every_node_knows_its_place_and_path() {
        let l = locs("a:\n  b: 1\n  c: [x, {d: 2}]\n");
        assert_eq!(
            l["a"],
            Loc { line: 1, column: 1 },
            "a section points at its key"
        );
        assert_eq!(l["a.b"], Loc { line: 2, column: 6 });
        assert_eq!(l["a.c"], Loc { line: 3, column: 3 });
        assert_eq!(l["a.c[0]"], Loc { line: 3, column: 7 });
        assert_eq!(
            l["a.c[1].d"],
            Loc {
                line: 3,
                column: 14
            }
        );
    }

    #[test]
    fn aliases_and_merges_get_the_paths_of_where_they_are_used() {
        let l = locs("base: &b {x: 1, y: 2}\nuse:\n  <<: *b\n  y: 3\n");
        assert!(l.contains_key("use.x") && l.contains_key("use.y"));
        let root = parse("base: &b {x: 1}\nuse: *b\n").unwrap();
        let Kind::Map(m) = &root.kind else { panic!() };
        assert_eq!(m[1].1.path, "use");
        assert_eq!(m[1].1.loc, Loc { line: 2, column: 6 });
    }

    #[test]
    fn syntax_errors_have_a_place() {
        let e = parse("a: [1, 2\n").unwrap_err();
        assert!(e.message.starts_with("YAML syntax error"), "{e:?}");
        let e = parse("a: 1\na: 2\n").unwrap_err();
        assert_eq!(e.loc, Loc { line: 2, column: 1 });
        assert_eq!(e.message, "duplicate key `a` (first at line 1)");
        let e = parse("a: 1\n---\nb: 2\n").unwrap_err();
        assert_eq!(e.loc.line, 2);
    }

    #[test]
    fn quoted_scalars_are_text_plain_ones_are_resolved_later() {
        let root = parse("a: \"1\"\nb: 1\nc: !!str 2\n").unwrap();
        let Kind::Map(m) = &root.kind else { panic!() };
        let styles: Vec<Style> = m
            .iter()
            .map(|(_, v)| match &v.kind {
                Kind::Scalar(_, s) => *s,
                _ => panic!(),
            })
            .collect();
        assert_eq!(styles, [Style::Text, Style::Plain, Style::Text]);
    }

    #[test]
    fn an_empty_document_is_an_empty_mapping() {
        assert!(matches!(parse("").unwrap().kind, Kind::Map(ref m) if m.is_empty()));
        assert!(
            matches!(parse("# just a comment\n").unwrap().kind, Kind::Map(ref m) if m.is_empty())
        );
    }
}
