//! The configuration reader under generated input: ≥ 10,000 documents per run — YAML
//! built from the schema's own keys (block and flow style, anchors, aliases, merge keys,
//! tags, quoting) and then damaged (bytes inserted, cut, repeated, bytes that are not
//! UTF-8) — read as `spillway check` and a reload read a file. Every document must be
//! accepted or refused with a place: no panic, no stack overflow (a test binary that
//! aborts fails the run), no document that takes longer than [`HANG`], and every
//! refusal names `file:line:column`.

use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

use super::{Config, ConfigError};

/// Documents generated per run (CI runs this test on every push).
const CASES: u32 = 10_000;

/// A document still being read after this long counts as a hang (a timeout of the
/// run), not as slow: every generated document is under a few KB.
const HANG: Duration = Duration::from_secs(10);

/// Keys of the schema, so that the generated documents get past the parser into the
/// schema's sections, with a few that are not keys at all.
const KEYS: &[&str] = &[
    "version",
    "gateway",
    "listen",
    "admin_listen",
    "trusted_proxies",
    "max_body_bytes",
    "libra",
    "alpha",
    "beta",
    "phi",
    "rho",
    "min_vms",
    "max_vms",
    "r_max_rps",
    "cip_rps",
    "epoch_seconds",
    "vm_pool",
    "type",
    "process",
    "static",
    "urls",
    "command",
    "function_tier",
    "http",
    "url",
    "function_zones",
    "name",
    "routes",
    "path_prefix",
    "methods",
    "async",
    "default_deadline_seconds",
    "queue",
    "placement",
    "pricing",
    "sim",
    "prometheus",
    "cpu_signal",
    "tls",
    "cert_file",
    "<<",
    "x",
    "ключ",
    "",
];

/// Scalars: numbers of every YAML spelling, booleans, nulls, text, addresses.
const SCALARS: &[&str] = &[
    "0",
    "1",
    "-1",
    "0.5",
    "1e3",
    ".inf",
    "-.inf",
    ".nan",
    "0x1f",
    "0o17",
    "99999999999999999999",
    "true",
    "false",
    "~",
    "null",
    "",
    "127.0.0.1:0",
    "http://127.0.0.1:1/",
    "process",
    "static",
    "edge_first",
    "[]",
    "{}",
    "'quoted'",
    "\"esc\\n\\u00e9\"",
    "|\n  block\n",
    ">-\n  folded\n",
    "!!str 5",
    "!custom x",
    "*a",
    "&a v",
    "&b [1, 2]",
    "*b",
    "\"\\xff\"",
    "é",
    "\t",
];

/// A generated value: scalar, list or mapping, to a small depth.
fn value() -> impl Strategy<Value = String> {
    let leaf = proptest::sample::select(SCALARS).prop_map(str::to_string);
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            // Flow list and flow mapping.
            proptest::collection::vec(inner.clone(), 0..5)
                .prop_map(|v| format!("[{}]", v.join(", "))),
            proptest::collection::vec((proptest::sample::select(KEYS), inner.clone()), 0..5)
                .prop_map(|v| {
                    let e: Vec<String> = v.iter().map(|(k, x)| format!("{k}: {x}")).collect();
                    format!("{{{}}}", e.join(", "))
                }),
            // Anchored block mapping (indented under its key by `block`).
            (
                proptest::option::of("[ab]"),
                proptest::collection::vec((proptest::sample::select(KEYS), inner), 1..5)
            )
                .prop_map(|(anchor, v)| {
                    let mut s = anchor.map_or(String::new(), |a| format!("&{a}"));
                    for (k, x) in v {
                        s += &format!("\n  {k}: {}", x.replace('\n', "\n  "));
                    }
                    s
                }),
        ]
    })
}

/// A document: top-level keys with values, sometimes with an anchor set up front.
fn document() -> impl Strategy<Value = String> {
    (
        any::<bool>(),
        proptest::collection::vec((proptest::sample::select(KEYS), value()), 0..8),
    )
        .prop_map(|(anchors, entries)| {
            let mut s = if anchors {
                "base: &a {x: 1}\nlist: &b [1, 2]\n".to_string()
            } else {
                String::new()
            };
            for (k, v) in entries {
                s += &format!("{k}: {v}\n");
            }
            s
        })
}

/// What is done to a document's bytes before it is read.
#[derive(Clone, Debug)]
enum Damage {
    /// Insert these bytes at this offset (modulo the length).
    Insert(usize, Vec<u8>),
    /// Cut from this offset, this many bytes.
    Cut(usize, usize),
    /// Repeat the slice [at, at + len) this many times.
    Repeat(usize, usize, usize),
}

fn damage() -> impl Strategy<Value = Damage> {
    let bytes = proptest::collection::vec(
        prop_oneof![
            proptest::sample::select(b"[]{}:,-&*!|>'\"#%@` \t\n\r?".to_vec()),
            0x80u8..=0xff,
            Just(0u8),
            b'a'..=b'z',
        ],
        1..6,
    );
    prop_oneof![
        (any::<usize>(), bytes).prop_map(|(at, b)| Damage::Insert(at, b)),
        (any::<usize>(), 1usize..20).prop_map(|(at, n)| Damage::Cut(at, n)),
        (any::<usize>(), 1usize..12, 2usize..40).prop_map(|(at, n, k)| Damage::Repeat(at, n, k)),
    ]
}

fn apply(mut doc: Vec<u8>, damages: &[Damage]) -> Vec<u8> {
    for d in damages {
        let len = doc.len().max(1);
        match d {
            Damage::Insert(at, b) => {
                let at = at % len;
                let at = at.min(doc.len());
                doc.splice(at..at, b.iter().copied());
            }
            Damage::Cut(at, n) => {
                let at = (at % len).min(doc.len());
                let end = (at + n).min(doc.len());
                doc.drain(at..end);
            }
            Damage::Repeat(at, n, k) => {
                let at = (at % len).min(doc.len());
                let end = (at + n).min(doc.len());
                let piece = doc[at..end].to_vec();
                for _ in 1..*k {
                    doc.splice(end..end, piece.iter().copied());
                }
            }
        }
    }
    doc
}

/// Why a refusal does not name its place, if it does not.
fn unlocated(e: &ConfigError, file: &str) -> Option<String> {
    match e {
        ConfigError::Parse { line, column, .. } => {
            let prefix = format!("{file}:{line}:{column}: ");
            (*line == 0 || *column == 0 || !e.to_string().starts_with(&prefix))
                .then(|| format!("parse error without a place: {e}"))
        }
        ConfigError::Invalid { issues, .. } => issues
            .iter()
            .find(|i| i.location.is_none_or(|l| l.line == 0 || l.column == 0))
            .map(|i| format!("problem without a place: {i} (in {e})")),
        ConfigError::Read { .. } => Some(format!("read error from bytes: {e}")),
    }
}

/// Read one damaged document; `Err` when it was not read or refused at a place in time.
fn read_one(bytes: &[u8], tally: &mut [usize; 3]) -> Result<(), TestCaseError> {
    // The reader's own wall time, for the hang criterion: no clock is injected here.
    #[allow(clippy::disallowed_methods)]
    let started = Instant::now();
    let read = Config::from_bytes(bytes, "fuzz.yaml");
    let took = started.elapsed();
    let shown = || String::from_utf8_lossy(bytes).into_owned();
    prop_assert!(took < HANG, "a hang: {took:?} reading {:?}", shown());
    match &read {
        Ok(_) => tally[0] += 1,
        Err(e) => {
            tally[if matches!(e, ConfigError::Parse { .. }) {
                1
            } else {
                2
            }] += 1;
            if let Some(why) = unlocated(e, "fuzz.yaml") {
                prop_assert!(false, "{why}\ndocument: {:?}", shown());
            }
        }
    }
    Ok(())
}

#[test]
fn every_generated_document_is_read_or_refused_at_a_place() {
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: CASES,
        // Shrinking a failure is worth its time; a passing run is ~10,000 reads.
        max_shrink_iters: 2_000,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let tally = std::cell::RefCell::new([0usize; 3]);
    let strategy = (document(), proptest::collection::vec(damage(), 0..3));
    let result = runner.run(&strategy, |(doc, damages)| {
        let bytes = apply(doc.into_bytes(), &damages);
        read_one(&bytes, &mut tally.borrow_mut())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    let [accepted, syntax, invalid] = *tally.borrow();
    eprintln!("{accepted} accepted, {syntax} syntax errors, {invalid} schema/semantic refusals");
    // The generator reaches every stage of the reader, not only the parser.
    let total = accepted + syntax + invalid;
    assert!(total >= CASES as usize, "{total}");
    for (what, n) in [
        ("accepted", accepted),
        ("syntax", syntax),
        ("invalid", invalid),
    ] {
        assert!(n * 50 >= total, "only {n} of {total} documents {what}");
    }
}
