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
//!
//! **Bounds.** A configuration is read by `spillway check` and by a running gateway on
//! every reload, so no file may crash or exhaust the reader: each limit is an error at
//! the place where it is crossed (`file:line:column`), never a stack overflow or an
//! allocation that does not end.
//!
//! | limit | value | why |
//! |---|---|---|
//! | document size | [`MAX_DOCUMENT_BYTES`] (1 MiB) | a config is a few KB; the file is read no further |
//! | nesting depth | [`MAX_DEPTH`] (64 lists/mappings, aliases included) | the tree is walked recursively (building, reading, dropping) |
//! | values after expanding aliases and merges | [`MAX_NODES`] (250,000) | an alias repeats its anchor's whole content: a few hundred bytes of aliases of aliases ("billion laughs") would be billions of values |
//! | text after expanding aliases and merges | [`MAX_TEXT_BYTES`] (32 MiB of scalars and field paths) | the same, for long scalars or keys repeated by aliases |
//! | encoding | UTF-8 ([`decode`]) | the place of the first byte that is not UTF-8 is named |
//!
//! Duplicate keys are found with one hash set per mapping: reading is linear in the
//! document's size (50,000 keys in one mapping take milliseconds).

use std::collections::{HashMap, HashSet};
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
    pub(super) fn report_loc(&self) -> Loc {
        match self.kind {
            Kind::Scalar(..) => self.loc,
            _ => self.key_loc.unwrap_or(self.loc),
        }
    }

    /// A plain scalar that YAML resolves to null (`~`, `null`, nothing).
    pub(super) fn is_null(&self) -> bool {
        matches!(&self.kind, Kind::Scalar(s, Style::Plain) if is_null_text(s))
    }

    /// What the node is, for messages: `` `abc` ``, `a list`, `a mapping`, `nothing`.
    pub(super) fn describe(&self) -> String {
        match &self.kind {
            _ if self.is_null() => "nothing (null)".into(),
            Kind::Scalar(s, _) => format!("`{s}`"),
            Kind::Seq(_) => "a list".into(),
            Kind::Map(_) => "a mapping".into(),
        }
    }

    /// Every node's path with its location (value location; for containers the key's).
    pub(super) fn locations(&self) -> HashMap<String, Loc> {
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
    pub(super) fn remove(&mut self, id: usize) -> bool {
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
    pub(super) fn find(&self, id: usize) -> Option<&Node> {
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
pub(super) struct SyntaxError {
    /// Where.
    pub loc: Loc,
    /// What is wrong, in words.
    pub message: String,
}

/// Largest configuration document, bytes: a longer file is refused at the place where it
/// crosses the limit, and read no further.
pub const MAX_DOCUMENT_BYTES: usize = 1 << 20;

/// Deepest nesting of lists and mappings (the root mapping is level 1), aliases counted
/// where they are used.
pub const MAX_DEPTH: usize = 64;

/// Most values (scalars, lists, mappings, keys) in the tree after aliases and merge keys
/// are expanded.
pub const MAX_NODES: usize = 250_000;

/// Most bytes of scalar text and field paths in the tree after aliases and merge keys are
/// expanded.
pub const MAX_TEXT_BYTES: usize = 32 << 20;

/// The place of byte `offset` of `bytes`: 1-based line and column (in characters) of the
/// character that holds it, counting only what is valid UTF-8 before it.
fn loc_at(bytes: &[u8], offset: usize) -> Loc {
    let offset = offset.min(bytes.len());
    let before = &bytes[..offset];
    let line_start = before
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |i| i + 1);
    let line = before.iter().filter(|&&b| b == b'\n').count() as u64 + 1;
    let tail = &before[line_start..];
    let valid = match std::str::from_utf8(tail) {
        Ok(t) => t,
        Err(e) => std::str::from_utf8(&tail[..e.valid_up_to()]).unwrap_or(""),
    };
    Loc {
        line,
        column: valid.chars().count() as u64 + 1,
    }
}

/// A configuration file's bytes as text: at most [`MAX_DOCUMENT_BYTES`], UTF-8.
///
/// # Errors
/// The document is too long (located where it crosses the limit), or a byte sequence is
/// not UTF-8 (located at its first byte).
pub(crate) fn decode(bytes: &[u8]) -> Result<&str, SyntaxError> {
    check_size(bytes)?;
    std::str::from_utf8(bytes).map_err(|e| {
        let at = e.valid_up_to();
        SyntaxError {
            loc: loc_at(bytes, at),
            message: format!(
                "not UTF-8 text: byte 0x{:02x} cannot start or continue a character here \
                 (save the file as UTF-8)",
                bytes[at]
            ),
        }
    })
}

fn check_size(bytes: &[u8]) -> Result<(), SyntaxError> {
    if bytes.len() <= MAX_DOCUMENT_BYTES {
        return Ok(());
    }
    Err(SyntaxError {
        loc: loc_at(bytes, MAX_DOCUMENT_BYTES),
        message: format!(
            "the document is longer than {MAX_DOCUMENT_BYTES} bytes (1 MiB), the most a \
             configuration may be; it is read no further"
        ),
    })
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
/// The first syntax error, or the first bound crossed (see the [module docs](self)),
/// with its place.
pub(crate) fn parse(text: &str) -> Result<Node, SyntaxError> {
    check_size(text.as_bytes())?;
    let mut b = Builder {
        events: Parser::new_from_str(text.strip_prefix('\u{FEFF}').unwrap_or(text)),
        anchors: HashMap::new(),
        next_id: 0,
        last: Loc { line: 1, column: 1 },
        depth: 0,
        nodes: 0,
        text_bytes: 0,
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

/// An anchored node with what copying it costs.
struct Anchored {
    node: Node,
    /// Levels of lists and mappings in it (a scalar: 0).
    height: usize,
    /// Its values (nodes and keys).
    nodes: usize,
    /// Bytes of its scalars and keys.
    text_bytes: usize,
}

struct Builder<'a> {
    events: Parser<'a, saphyr_parser::StrInput<'a>>,
    anchors: HashMap<usize, Anchored>,
    next_id: usize,
    last: Loc,
    /// Lists and mappings open around the node being built.
    depth: usize,
    /// Values in the tree so far, aliases expanded ([`MAX_NODES`]).
    nodes: usize,
    /// Bytes of scalars and paths so far, aliases expanded ([`MAX_TEXT_BYTES`]).
    text_bytes: usize,
}

/// Height, values and text bytes of a subtree.
fn measure(n: &Node) -> (usize, usize, usize) {
    match &n.kind {
        Kind::Scalar(s, _) => (0, 1, s.len()),
        Kind::Seq(items) => items.iter().fold((1, 1, 0), |(h, c, b), i| {
            let (ih, ic, ib) = measure(i);
            (h.max(ih + 1), c + ic, b + ib)
        }),
        Kind::Map(entries) => entries.iter().fold((1, 1, 0), |(h, c, b), (k, v)| {
            let (vh, vc, vb) = measure(v);
            (h.max(vh + 1), c + 1 + vc, b + scalar_text(k).len() + vb)
        }),
    }
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

    /// Count `nodes` more values and `bytes` more text against the bounds.
    fn charge(&mut self, nodes: usize, bytes: usize, loc: Loc) -> Result<(), SyntaxError> {
        self.nodes = self.nodes.saturating_add(nodes);
        self.text_bytes = self.text_bytes.saturating_add(bytes);
        if self.nodes > MAX_NODES {
            return Err(SyntaxError {
                loc,
                message: format!(
                    "the document holds more than {MAX_NODES} values with what its aliases \
                     and merge keys repeat (an alias copies its anchor's whole content)"
                ),
            });
        }
        if self.text_bytes > MAX_TEXT_BYTES {
            return Err(SyntaxError {
                loc,
                message: format!(
                    "the document holds more than {} MiB of text and field paths with what \
                     its aliases and merge keys repeat (an alias copies its anchor's whole \
                     content)",
                    MAX_TEXT_BYTES >> 20
                ),
            });
        }
        Ok(())
    }

    /// Open one more level of lists and mappings at `loc`.
    fn enter(&mut self, loc: Loc, levels: usize) -> Result<(), SyntaxError> {
        if self.depth + levels > MAX_DEPTH {
            return Err(SyntaxError {
                loc,
                message: format!(
                    "lists and mappings nest deeper than {MAX_DEPTH} levels here (aliases \
                     counted where they are used)"
                ),
            });
        }
        Ok(())
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
                let Some(target) = self.anchors.get(&anchor) else {
                    return Err(SyntaxError {
                        loc,
                        message: "alias to an unknown anchor".into(),
                    });
                };
                let (height, nodes, bytes) = (target.height, target.nodes, target.text_bytes);
                // Checked before the copy is made: the copy is what would blow up.
                self.enter(loc, height)?;
                self.charge(nodes, bytes, loc)?;
                let mut n = self.anchors[&anchor].node.clone();
                self.rebase(&mut n, &path, loc)?;
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
                self.charge(1, value.len() + path.len(), loc)?;
                (anchor, Kind::Scalar(value.into_owned(), style))
            }
            Event::SequenceStart(anchor, tag) => {
                reject_tag(loc, tag.as_deref())?;
                self.enter(loc, 1)?;
                self.charge(1, path.len(), loc)?;
                self.depth += 1;
                let mut items = Vec::new();
                loop {
                    let (event, span) = self.next()?;
                    if matches!(event, Event::SequenceEnd) {
                        break;
                    }
                    let item_path = format!("{path}[{}]", items.len());
                    items.push(self.node(event, span, item_path, None)?);
                }
                self.depth -= 1;
                (anchor, Kind::Seq(items))
            }
            Event::MappingStart(anchor, tag) => {
                reject_tag(loc, tag.as_deref())?;
                self.enter(loc, 1)?;
                self.charge(1, path.len(), loc)?;
                self.depth += 1;
                let entries = self.mapping(&path)?;
                self.depth -= 1;
                (anchor, Kind::Map(entries))
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
            let (height, nodes, text_bytes) = measure(&node);
            self.anchors.insert(
                anchor,
                Anchored {
                    node: node.clone(),
                    height,
                    nodes,
                    text_bytes,
                },
            );
        }
        Ok(node)
    }

    fn mapping(&mut self, path: &str) -> Result<Vec<(Node, Node)>, SyntaxError> {
        let mut entries: Vec<(Node, Node)> = Vec::new();
        // Key → line of its first appearance: the duplicate check is one lookup a key.
        let mut seen: HashMap<String, u64> = HashMap::new();
        let mut merged: Vec<(Node, Node)> = Vec::new();
        let mut merged_keys: HashSet<String> = HashSet::new();
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
            self.charge(1, child_path.len(), key_loc)?;
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
                        if merged_keys.insert(name) {
                            k.path = p.clone();
                            self.rebase(&mut v, &p, key_loc)?;
                            merged.push((k, v));
                        }
                    }
                }
                continue;
            }
            if let Some(first) = seen.get(&key) {
                return Err(SyntaxError {
                    loc: key_loc,
                    message: format!("duplicate key `{key}` (first at line {first})"),
                });
            }
            seen.insert(key.clone(), key_loc.line);
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
            if !seen.contains_key(scalar_text(&k)) {
                entries.push((k, v));
            }
        }
        Ok(entries)
    }

    /// Give a copied subtree (alias, merge) fresh ids and paths under `path`; the new
    /// paths count against [`MAX_TEXT_BYTES`] (`loc`: where the copy is used).
    fn rebase(&mut self, n: &mut Node, path: &str, loc: Loc) -> Result<(), SyntaxError> {
        n.id = self.fresh();
        n.path = path.to_string();
        self.charge(0, path.len(), loc)?;
        match &mut n.kind {
            Kind::Scalar(..) => {}
            Kind::Seq(items) => {
                for (i, item) in items.iter_mut().enumerate() {
                    self.rebase(item, &format!("{path}[{i}]"), loc)?;
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
                    self.rebase(v, &p, loc)?;
                }
            }
        }
        Ok(())
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
    if m.contains("recursion limit exceeded") {
        return format!(
            "lists and mappings nest too deeply here (YAML parser: {m}; this reader allows \
             {MAX_DEPTH} levels)"
        );
    }
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

    fn err(text: &str) -> SyntaxError {
        parse(text).expect_err("must be refused")
    }

    #[test]
    fn nesting_deeper_than_the_bound_is_refused_where_it_crosses_it() {
        // The root mapping is level 1; `a:`'s list level 2: the 64th `[` is level 65.
        // Flow style: the parser's own limit (it scans ahead) or this reader's, named
        // as nesting, on the line.
        let deep = format!("a: {}", "[".repeat(100_000));
        let e = err(&deep);
        assert_eq!(e.loc.line, 1, "{e:?}");
        assert!(e.loc.column > 4 + 63 && e.loc.column < 1000, "{e:?}");
        assert!(e.message.contains("nest"), "{e:?}");
        let e = err(&format!("a: {}x{}", "[".repeat(100), "]".repeat(100)));
        assert_eq!(
            e.loc,
            Loc {
                line: 1,
                column: 4 + 63
            },
            "{e:?}"
        );
        assert!(e.message.contains("deeper than 64 levels"), "{e:?}");
        // Block style, mappings: the same bound.
        let mut block = String::new();
        for i in 0..70 {
            block += &format!("{}k{i}:\n", " ".repeat(i));
        }
        let e = err(&block);
        assert_eq!(e.loc.line, 65, "k63's mapping, level 65: {e:?}");
        // 64 levels are fine.
        let ok = format!("a: {}{}", "[".repeat(63), "]".repeat(63));
        parse(&ok).unwrap_or_else(|e| panic!("{e:?}"));
    }

    #[test]
    fn aliases_cannot_nest_past_the_bound_either() {
        // Each anchor nests 40 levels and holds the previous one: 40, 80, ... levels.
        let mut text = String::from("a0: &a0 x\n");
        for i in 1..4 {
            text += &format!(
                "a{i}: &a{i} {}*a{}{}\n",
                "[".repeat(40),
                i - 1,
                "]".repeat(40)
            );
        }
        let e = err(&text);
        assert_eq!(e.loc.line, 3, "the alias that would nest 80 deep: {e:?}");
        assert!(
            e.message.contains("aliases counted where they are used"),
            "{e:?}"
        );
    }

    #[test]
    fn an_alias_bomb_is_refused_before_it_expands() {
        // "Billion laughs": nine levels of nine aliases each, 9^9 copies of "lol".
        let mut text = String::from("l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n");
        for i in 1..10 {
            let p = i - 1;
            text += &format!("l{i}: &l{i} [{}]\n", vec![format!("*l{p}"); 9].join(", "));
        }
        assert!(text.len() < 600, "a few hundred bytes: {}", text.len());
        let e = err(&text);
        assert!(e.message.contains("more than 250000 values"), "{e:?}");
        assert!(
            e.loc.line >= 6 && e.loc.line <= 10,
            "at the alias that crosses: {e:?}"
        );
        // Long scalars repeated: the text bound.
        let text = format!(
            "s: &s \"{}\"\nt: [{}]\n",
            "x".repeat(500_000),
            vec!["*s"; 100].join(", ")
        );
        let e = err(&text);
        assert!(e.message.contains("MiB of text"), "{e:?}");
        assert_eq!(e.loc.line, 2, "{e:?}");
        // Merge keys copy too.
        let mut text = String::from("b0: &b0 {x: 1, y: 2, z: 3}\n");
        for i in 1..14 {
            let p = i - 1;
            text +=
                &format!("b{i}: &b{i} {{m: {{<<: *b{p}}}, n: {{<<: *b{p}}}, o: {{<<: *b{p}}}}}\n");
        }
        assert!(err(&text).message.contains("more than 250000 values"));
    }

    #[test]
    fn a_document_over_the_size_bound_is_refused_at_the_byte_that_crosses_it() {
        let line = "k: 0123456789abcdef\n"; // 20 bytes
        let text = line.repeat(MAX_DOCUMENT_BYTES / 20 + 1);
        let e = err(&text);
        let crossing = MAX_DOCUMENT_BYTES / 20;
        assert_eq!(
            e.loc,
            Loc {
                line: crossing as u64 + 1,
                column: (MAX_DOCUMENT_BYTES % 20) as u64 + 1
            },
            "{e:?}"
        );
        assert!(e.message.contains("longer than 1048576 bytes"), "{e:?}");
        assert!(decode(text.as_bytes()).is_err());
    }

    #[test]
    fn bytes_that_are_not_utf8_are_refused_at_their_place() {
        let e = decode(b"a: 1\nb: caf\xc3\xa9 \xff\n").unwrap_err();
        assert_eq!(e.loc, Loc { line: 2, column: 9 }, "{e:?}");
        assert!(e.message.contains("byte 0xff"), "{e:?}");
        let e = decode(b"\xc3").unwrap_err();
        assert_eq!(e.loc, Loc { line: 1, column: 1 });
        assert_eq!(decode("a: é\n".as_bytes()).unwrap(), "a: é\n");
    }

    #[test]
    fn duplicate_keys_among_fifty_thousand_are_found_with_the_first_line() {
        let n = 50_000;
        let mut text: String = (0..n).map(|i| format!("k{i}: {i}\n")).collect();
        let root = parse(&text).unwrap();
        assert!(matches!(&root.kind, Kind::Map(m) if m.len() == n));
        text += "k777: again\n";
        let e = err(&text);
        assert_eq!(
            e.loc,
            Loc {
                line: n as u64 + 1,
                column: 1
            }
        );
        assert_eq!(e.message, "duplicate key `k777` (first at line 778)");
        // Merged keys: explicit keys win, the first merged source wins among merges.
        let root =
            parse("a: &a {x: 1, y: 2}\nb: &b {y: 3, z: 4}\nc: {<<: [*a, *b], x: 9}\n").unwrap();
        let Kind::Map(m) = &root.kind else { panic!() };
        let Kind::Map(c) = &m[2].1.kind else { panic!() };
        let got: Vec<(&str, &str)> = c
            .iter()
            .map(|(k, v)| (scalar_text(k), scalar_text(v)))
            .collect();
        assert_eq!(got, [("x", "9"), ("y", "2"), ("z", "4")]);
    }
}
