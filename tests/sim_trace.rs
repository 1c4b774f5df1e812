//! Trace parsers: every format, malformed lines rejected with file and line, trailing
//! spaces and a missing final newline accepted, windowing and rate scaling.

use std::path::{Path, PathBuf};

use proptest::prelude::*;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use spillway::sim::SimError;
use spillway::sim::trace::{Arrival, Trace, TraceFormat, TraceOptions, scale_counts};

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

fn opts(format: TraceFormat) -> TraceOptions {
    TraceOptions {
        format,
        ..TraceOptions::default()
    }
}

fn arrivals(t: &Trace) -> Vec<Arrival> {
    let mut s = t.stream(ChaCha8Rng::seed_from_u64(3));
    std::iter::from_fn(|| s.next_arrival()).collect()
}

fn parse_error(text: &str, format: TraceFormat) -> (usize, String) {
    match Trace::parse(text, Path::new("bad.txt"), &opts(format)) {
        Err(e @ SimError::Parse { line, .. }) => {
            let msg = e.to_string();
            assert!(msg.starts_with(&format!("bad.txt:{line}: ")), "{msg}");
            (line, msg)
        }
        other => panic!("expected a parse error, got {other:?}"),
    }
}

#[test]
fn counts_accepts_trailing_spaces_and_no_final_newline() {
    let t = Trace::load(&data("sim_counts.txt"), &opts(TraceFormat::Counts)).unwrap();
    assert_eq!(t.total_requests(), 35);
    assert_eq!(t.duration_s, 5.0);
    assert_eq!(t.peak_rps(), 12.0);
    let a = arrivals(&t);
    assert_eq!(a.len(), 35);
    // Evenly spaced: second 0 has 10 → every 100 ms.
    assert_eq!(a[1].at_ns, 100_000_000);
    assert_eq!(a[10].at_ns, 1_000_000_000);
    assert!(a.windows(2).all(|w| w[0].at_ns <= w[1].at_ns));
}

/// Counts spread each second's `n` arrivals at `second + ⌊j·1 s / n⌋` (the stream keeps
/// the offset incrementally): the instants equal the formula for counts that do not
/// divide a second, for 1, for a large prime count, and after an empty
/// second.
#[test]
fn counts_arrivals_sit_at_the_evenly_spaced_instants() {
    let ns = 1_000_000_000u64;
    let counts = [7u64, 0, 1, 3, 999_983, 13];
    let text: String = counts.iter().map(|c| format!("{c}\n")).collect();
    let t = Trace::parse(&text, Path::new("spacing.txt"), &opts(TraceFormat::Counts)).unwrap();
    let expected: Vec<u64> = counts
        .iter()
        .enumerate()
        .flat_map(|(s, &n)| (0..n).map(move |j| s as u64 * ns + j * ns / n))
        .collect();
    let got: Vec<u64> = arrivals(&t).iter().map(|a| a.at_ns).collect();
    assert_eq!(got.len(), expected.len());
    assert!(got == expected, "arrival instants differ from the formula");
}

/// A FaaSim workload (an attributed excerpt, tests/data/faasim): three bursts of 100 calls
/// within ~2 s, 30 s apart, spread evenly over zones 0–4.
#[test]
fn the_faasim_burst_excerpt_parses_with_its_zones() {
    let t = Trace::load(
        &data("faasim/burst_excerpt.txt"),
        &opts(TraceFormat::Events),
    )
    .unwrap();
    assert_eq!(t.total_requests(), 300);
    let a = arrivals(&t);
    let mut per_zone = [0u32; 5];
    for x in &a {
        per_zone[x.zone as usize] += 1;
    }
    assert_eq!(per_zone, [60; 5]);
    // Burst k starts at 30·k s and lasts under 2 s.
    for (k, burst) in a.chunks(100).enumerate() {
        let start = 30_000_000_000 * k as u64;
        assert!(
            burst
                .iter()
                .all(|x| x.at_ns >= start && x.at_ns < start + 2_000_000_000)
        );
    }
}

/// A trace that is not in the repository (WITS, square: `scripts/fetch-traces.sh`): the
/// test fails and says how to get it.
fn fetched_trace(name: &str) -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("traces")
        .join(name);
    assert!(
        path.exists(),
        "{} is missing: run `scripts/fetch-traces.sh` (or `scripts/fetch-traces.sh --from DIR` \
         with an offline copy)",
        path.display()
    );
    path
}

/// The published per-second traces the README replays (run by `scripts/test.sh` when
/// `traces/` holds them; `cargo test -- --ignored` otherwise).
#[test]
#[ignore = "needs traces/ from scripts/fetch-traces.sh"]
fn the_fetched_traces_parse() {
    let wits = fetched_trace("wits_per_second.txt");
    let t = Trace::load(&wits, &opts(TraceFormat::Counts)).unwrap();
    assert_eq!((t.total_requests(), t.duration_s), (6_432_107, 45_000.0));
    let sq = Trace::load(
        &fetched_trace("square_per_second.txt"),
        &opts(TraceFormat::Counts),
    )
    .unwrap();
    assert_eq!(sq.duration_s, 1112.0);
    // The LIBRA AWS experiment: first 1800 s of WITS divided by 16.
    let o = TraceOptions {
        rate_divisor: 16.0,
        to_s: Some(1800.0),
        ..opts(TraceFormat::Counts)
    };
    let cut = Trace::load(&wits, &o).unwrap();
    let full = Trace::load(
        &wits,
        &TraceOptions {
            to_s: Some(1800.0),
            ..opts(TraceFormat::Counts)
        },
    )
    .unwrap();
    assert_eq!(cut.duration_s, 1800.0);
    assert_eq!(
        cut.total_requests(),
        (full.total_requests() as f64 / 16.0).round() as u64
    );
}

#[test]
fn counts_rejects_bad_lines_with_their_number() {
    assert_eq!(parse_error("1\n2\nx\n", TraceFormat::Counts).0, 3);
    assert_eq!(parse_error("1\n-4\n", TraceFormat::Counts).0, 2);
    assert_eq!(parse_error("1\n\n3\n", TraceFormat::Counts).0, 2);
    assert_eq!(parse_error("1.5", TraceFormat::Counts).0, 1);
    // Trailing blank lines are fine.
    Trace::parse("1\n2\n\n\n", Path::new("ok"), &opts(TraceFormat::Counts)).unwrap();
}

#[test]
fn events_keep_zones_and_reject_bad_or_unordered_lines() {
    let t = Trace::load(&data("sim_events.txt"), &opts(TraceFormat::Events)).unwrap();
    let a = arrivals(&t);
    assert_eq!(a.len(), 5);
    assert_eq!(
        a.iter().map(|x| x.zone).collect::<Vec<_>>(),
        [0, 1, 2, 0, 3]
    );
    assert_eq!(a[4].at_ns, 2_250_000_000);
    assert_eq!(t.peak_rps(), 3.0);
    assert_eq!(parse_error("0.1 0\n0.2 zz\n", TraceFormat::Events).0, 2);
    assert_eq!(parse_error("0.1 0\n0.2 1 9\n", TraceFormat::Events).0, 2);
    assert_eq!(parse_error("0.5\n0.4\n", TraceFormat::Events).0, 2);
    assert_eq!(parse_error("abc\n", TraceFormat::Events).0, 1);
    // Zone is optional.
    let t = Trace::parse("0.5\n0.7", Path::new("ok"), &opts(TraceFormat::Events)).unwrap();
    assert_eq!(t.total_requests(), 2);
}

#[test]
fn azure2019_spreads_each_minute_and_uses_durations_and_memory() {
    let o = TraceOptions {
        durations: Some(data("sim_azure2019_durations.csv")),
        memory: Some(data("sim_azure2019_memory.csv")),
        ..opts(TraceFormat::Azure2019)
    };
    let t = Trace::load(&data("sim_azure2019_invocations.csv"), &o).unwrap();
    assert_eq!(t.total_requests(), 60 + 120 + 30 + 5 + 600);
    assert_eq!(t.duration_s, 300.0);
    assert_eq!(t.peak_rps(), 11.0, "minute 2: 601 calls → ceil(601/60)");
    assert_eq!(t.classes.len(), 4, "default + 3 functions");
    assert_eq!(t.classes[1].memory_mb, Some(301));
    assert_eq!(
        t.classes[3].memory_mb,
        Some(128),
        "60 MB is raised to Lambda's 128 MB"
    );
    assert!(t.classes[2].service.is_some());
    let a = arrivals(&t);
    assert_eq!(a.len(), 815);
    assert!(a.windows(2).all(|w| w[0].at_ns <= w[1].at_ns));
    let minute1 = a
        .iter()
        .filter(|x| (60_000_000_000..120_000_000_000).contains(&x.at_ns));
    assert_eq!(minute1.clone().count(), 601);
    assert_eq!(minute1.filter(|x| x.class == 3).count(), 600);
    // The same seed gives the same arrivals.
    assert_eq!(a, arrivals(&t));
}

#[test]
fn azure2019_rejects_bad_rows() {
    let head = "HashOwner,HashApp,HashFunction,Trigger,1,2\n";
    let (line, msg) = parse_error(&format!("{head}o,a,f,http,1,x\n"), TraceFormat::Azure2019);
    assert_eq!(line, 2, "{msg}");
    let (line, _) = parse_error(
        &format!("{head}o,a,f,http,1,2\no,a,g,http,1\n"),
        TraceFormat::Azure2019,
    );
    assert_eq!(line, 3);
    let (line, _) = parse_error("HashOwner,HashApp,Trigger,1\n", TraceFormat::Azure2019);
    assert_eq!(line, 1, "missing HashFunction column");
    // A bad durations file names its own file and line.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("durations.csv");
    let good = std::fs::read_to_string(data("sim_azure2019_durations.csv")).unwrap();
    std::fs::write(
        &d,
        good.replace("o2,a2,f3,50,600,50,50,50", "o2,a2,f3,50,600,50,50,-1"),
    )
    .unwrap();
    let o = TraceOptions {
        durations: Some(d.clone()),
        ..opts(TraceFormat::Azure2019)
    };
    let err = Trace::load(&data("sim_azure2019_invocations.csv"), &o).unwrap_err();
    assert!(
        err.to_string().starts_with(&format!("{}:4: ", d.display())),
        "{err}"
    );
}

#[test]
fn azure2021_arrives_at_end_minus_duration_with_the_trace_duration() {
    let t = Trace::load(&data("sim_azure2021.csv"), &opts(TraceFormat::Azure2021)).unwrap();
    let a = arrivals(&t);
    let starts: Vec<u64> = a.iter().map(|x| x.at_ns).collect();
    assert_eq!(
        starts,
        [100_000_000, 1_000_000_000, 1_750_000_000, 2_990_000_000]
    );
    let services: Vec<u64> = a.iter().map(|x| x.service_ns).collect();
    assert_eq!(
        services,
        [1_100_000_000, 500_000_000, 250_000_000, 10_000_000]
    );
    assert_eq!(a[0].class, 2, "a1/f2 is the second function seen");
    assert_eq!(a[1].class, a[3].class);
    assert_eq!(t.classes.len(), 4);
    assert_eq!(
        parse_error(
            "app,func,end_timestamp,duration\na,f,1.0,x\n",
            TraceFormat::Azure2021
        )
        .0,
        2
    );
    assert_eq!(
        parse_error(
            "app,func,end_timestamp,duration\na,f,1.0,0.1\na,f,2\n",
            TraceFormat::Azure2021
        )
        .0,
        3
    );
}

#[test]
fn window_and_divisor_options() {
    let o = TraceOptions {
        from_s: Some(1.0),
        to_s: Some(3.0),
        ..opts(TraceFormat::Counts)
    };
    let t = Trace::load(&data("sim_counts.txt"), &o).unwrap();
    assert_eq!((t.total_requests(), t.duration_s), (20, 2.0));
    assert_eq!(arrivals(&t)[0].at_ns, 0, "the clock restarts at the window");
    let e = Trace::load(
        &data("sim_events.txt"),
        &TraceOptions {
            from_s: Some(0.1),
            rate_divisor: 2.0,
            ..opts(TraceFormat::Events)
        },
    )
    .unwrap();
    assert_eq!(e.total_requests(), 2, "4 events in the window, halved");
    for bad in [0.0, -1.0, f64::NAN] {
        let o = TraceOptions {
            rate_divisor: bad,
            ..opts(TraceFormat::Counts)
        };
        let err = Trace::parse("1\n", Path::new("x"), &o).unwrap_err();
        assert!(err.to_string().starts_with("--rate-divisor: "), "{err}");
    }
}

proptest! {
    #[test]
    fn scaled_total_is_the_rounded_quotient(
        counts in prop::collection::vec(0u64..5000, 0..300),
        divisor in 0.05f64..100.0,
    ) {
        let total: u64 = counts.iter().sum();
        let scaled = scale_counts(counts.clone(), divisor);
        prop_assert_eq!(scaled.len(), counts.len());
        prop_assert_eq!(scaled.iter().sum::<u64>(), (total as f64 / divisor).round() as u64);
    }

    #[test]
    fn event_lists_keep_the_rounded_quotient(n in 0usize..500, divisor in 0.5f64..20.0) {
        let text: String = (0..n).map(|i| format!("{}.0 1\n", i)).collect();
        let o = TraceOptions { rate_divisor: divisor, ..opts(TraceFormat::Events) };
        let t = Trace::parse(&text, Path::new("p"), &o).unwrap();
        prop_assert_eq!(t.total_requests(), (n as f64 / divisor).round() as u64);
    }
}

/// Trace robustness: a byte-order mark is accepted, a non-UTF-8 byte names its
/// line, `+5` is not a count, a count above u32 stops at its line, and the wrong
/// `--format` says which one the file looks like.
#[test]
fn bom_non_utf8_signs_huge_counts_and_the_wrong_format_are_handled() {
    let dir = tempfile::tempdir().unwrap();
    let bom = dir.path().join("bom.txt");
    std::fs::write(&bom, b"\xEF\xBB\xBF3\n4\n").unwrap();
    let t = Trace::load(&bom, &opts(TraceFormat::Counts)).unwrap();
    assert_eq!((t.total_requests(), t.duration_s), (7, 2.0));

    let latin1 = dir.path().join("latin1.txt");
    std::fs::write(&latin1, b"3\n4\n5\xE9\n").unwrap();
    let err = Trace::load(&latin1, &opts(TraceFormat::Counts)).unwrap_err();
    assert!(
        matches!(err, SimError::Parse { line: 3, .. }),
        "{err}: line 3 holds the byte"
    );
    assert!(err.to_string().contains("0xE9"), "{err}");

    let (line, msg) = parse_error("3\n+5\n", TraceFormat::Counts);
    assert_eq!(line, 2, "{msg}");
    assert!(
        !msg.contains("--format events"),
        "+5 is no event time: {msg}"
    );

    let huge = format!("1\n{}\n", u64::from(u32::MAX) + 1);
    let (line, msg) = parse_error(&huge, TraceFormat::Counts);
    assert_eq!(line, 2);
    assert!(msg.contains("--rate-divisor"), "{msg}");
    // Divided by 2 it fits.
    let o = TraceOptions {
        rate_divisor: 2.0,
        ..opts(TraceFormat::Counts)
    };
    assert!(Trace::parse(&huge, Path::new("x"), &o).is_ok());

    // A counts trace read as events fails at the first decrease, naming the format.
    let (line, msg) = parse_error("234\n325\n212\n", TraceFormat::Events);
    assert_eq!(line, 3);
    assert!(msg.contains("--format counts"), "{msg}");
    // An events trace read as counts.
    let (line, msg) = parse_error("0.25 1\n0.5 2\n", TraceFormat::Counts);
    assert_eq!(line, 1);
    assert!(msg.contains("--format events"), "{msg}");
    let (_, msg) = parse_error("app,func,end_timestamp,duration\n", TraceFormat::Counts);
    assert!(msg.contains("azure2021"), "{msg}");
}

/// An events trace of Unix timestamps starts its clock at the first event's whole
/// second (reported as the offset), not at 1970.
#[test]
fn an_events_trace_starts_at_its_first_event() {
    let text: String = (0..1000)
        .map(|i| format!("{:.1}\n", 1.7e9 + 0.5 + f64::from(i) * 0.1))
        .collect();
    let t = Trace::parse(&text, Path::new("unix.txt"), &opts(TraceFormat::Events)).unwrap();
    assert_eq!(t.offset_s, 1.7e9);
    let a = arrivals(&t);
    assert_eq!(a[0].at_ns, 500_000_000, "the sub-second phase is kept");
    assert!(
        (t.duration_s - (0.5 + 99.9)).abs() < 1e-6,
        "{}",
        t.duration_s
    );
    // With --from the window start is the origin, as before.
    let o = TraceOptions {
        from_s: Some(1.7e9 + 50.0),
        ..opts(TraceFormat::Events)
    };
    let w = Trace::parse(&text, Path::new("unix.txt"), &o).unwrap();
    assert_eq!(w.offset_s, 1.7e9 + 50.0);
    assert_eq!(arrivals(&w)[0].at_ns, 0, "the event at 1.7e9 + 50.0 s");
}

/// A millisecond timestamp among Unix seconds puts an arrival 1.7·10¹² s after the
/// first: past the simulator's clock (u64 nanoseconds, 584 years), so the trace is
/// refused at that line, in both `events` layouts; 2³³ s after the first is accepted.
#[test]
fn an_arrival_beyond_the_clock_is_refused_naming_its_line() {
    let text = "1700000000.5 0\n1700000001.5 0\n1700000002000 0\n";
    let (line, message) = parse_error(text, TraceFormat::Events);
    assert_eq!(line, 3);
    assert!(message.contains("millisecond timestamp"), "{message}");
    let named = "time_s zone\n1700000000.5 0\n1700000002000 1\n";
    assert_eq!(parse_error(named, TraceFormat::Events).0, 3);
    let far = format!("0.5 0\n{} 0\n", 1u64 << 33);
    let t = Trace::parse(&far, Path::new("far.txt"), &opts(TraceFormat::Events)).unwrap();
    assert_eq!(arrivals(&t)[1].at_ns, (1u64 << 33) * 1_000_000_000);
}
