//! A configuration that would kill the reader — nested too deep, an alias bomb, bytes
//! that are not UTF-8, a file far too long — sent to a running gateway by SIGHUP and by
//! `POST /reload`: each is refused with its `file:line:column`, the gateway keeps
//! serving with the configuration it had, and a good file still reloads afterwards.
// Real processes: wall-clock polling deadlines.
#![allow(clippy::disallowed_methods)]

mod common;

use std::time::Duration;

use common::stub::{Stub, StubRequest, ok_reply};
use common::{Gateway, http, static_config};

/// Bad files with what the refusal must say: `(name, bytes, line:column, words)`.
fn bad_files(good: &str) -> Vec<(&'static str, Vec<u8>, String, &'static str)> {
    let lines = good.lines().count();
    // "Billion laughs": 9^9 copies of a word from ~500 bytes.
    let mut bomb = format!("{good}l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n");
    for i in 1..10 {
        bomb += &format!(
            "l{i}: &l{i} [{}]\n",
            vec![format!("*l{}", i - 1); 9].join(",")
        );
    }
    let mut not_utf8 = good.as_bytes().to_vec();
    not_utf8.extend_from_slice(b"zz: \"caf\xe9\"\n");
    let long = format!("{good}{}", "# padding, padding, padding\n".repeat(40_000));
    let deep_block: String = (0..80)
        .map(|i| format!("{}k{i}:\n", " ".repeat(i)))
        .collect();
    vec![
        (
            "deep flow nesting",
            format!("{good}x: {}1{}\n", "[".repeat(5_000), "]".repeat(5_000)).into_bytes(),
            format!("{}:", lines + 1),
            "nest",
        ),
        (
            "deep block nesting",
            deep_block.into_bytes(),
            "65:65".into(),
            "deeper than 64 levels",
        ),
        (
            "an alias bomb",
            bomb.into_bytes(),
            String::new(),
            "more than 250000 values",
        ),
        (
            "bytes that are not UTF-8",
            not_utf8,
            format!("{}:9", lines + 1),
            "not UTF-8",
        ),
        (
            "a file over 1 MiB",
            long.into_bytes(),
            String::new(),
            "longer than 1048576 bytes",
        ),
    ]
}

/// Whether `text` names `file:line:column`, starting with `place` (`12:` or `12:5`).
fn located(text: &str, file: &str, place: &str) -> bool {
    text.match_indices(&format!("{file}:")).any(|(i, m)| {
        let rest = &text[i + m.len()..];
        let mut parts = rest.splitn(3, ':');
        let (Some(l), Some(c)) = (parts.next(), parts.next()) else {
            return false;
        };
        let numbers = !l.is_empty()
            && !c.is_empty()
            && l.bytes().all(|b| b.is_ascii_digit())
            && c.bytes().all(|b| b.is_ascii_digit());
        numbers && rest.starts_with(place)
    })
}

#[test]
fn a_reload_of_a_file_that_would_kill_the_reader_is_refused_and_changes_nothing() {
    let hold = Duration::from_millis(1200);
    let stub = Stub::start(move |req: &StubRequest| {
        if req.target == "/slow" {
            std::thread::sleep(hold);
        }
        ok_reply(req)
    });
    let with_timeout =
        |s: f64| static_config(&[stub.url()], &format!("  upstream_timeout_seconds: {s}"));
    let gw = Gateway::start(&with_timeout(0.4));
    let file = gw.config_path();
    let name = file.display().to_string();
    assert_eq!(
        http(gw.proxy, "GET", "/slow", &[], b"").0,
        504,
        "the 0.4 s timeout"
    );
    for (what, bytes, place, words) in bad_files(&with_timeout(5.0)) {
        std::fs::write(&file, &bytes).unwrap();
        // SIGHUP: one warning naming the file, line and column.
        gw.proc.signal("HUP");
        let line = gw.proc.wait_line("reload refused", Duration::from_secs(30));
        assert!(located(&line, &name, &place), "{what}: {line}");
        assert!(line.contains(words), "{what}: {line}");
        // POST /reload: 422 with the same place.
        let (code, _, body) = http(gw.admin, "POST", "/reload", &[], b"");
        let body = String::from_utf8_lossy(&body);
        assert_eq!(code, 422, "{what}: {body}");
        assert!(
            located(&body, &name, &place) && body.contains(words),
            "{what}: {body}"
        );
        // Still serving, with the running configuration untouched.
        assert!(gw.proc.child.id() > 0 && gw.status()["build"].is_object());
        assert_eq!(http(gw.proxy, "GET", "/", &[], b"").0, 200, "{what}");
        assert_eq!(
            http(gw.proxy, "GET", "/slow", &[], b"").0,
            504,
            "{what}: the 0.4 s timeout stays"
        );
    }
    // A good file reloads: the 5 s timeout lets the slow request through.
    std::fs::write(&file, with_timeout(5.0)).unwrap();
    let (code, _, body) = http(gw.admin, "POST", "/reload", &[], b"");
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(http(gw.proxy, "GET", "/slow", &[], b"").0, 200);
}
