//! The simulator's call-scheduling preset (call scheduling §4): one VM of N
//! cores, no scaling, no function tier, calls in the gateway queue in the configured
//! order; `events` traces with function and processing-time columns.

use std::path::Path;

use spillway::config::Config;
use spillway::policy::sched::Order;
use spillway::sim::engine::{PolicyKind, SimParams, run_policy};
use spillway::sim::report::QueueReport;
use spillway::sim::trace::{Trace, TraceData, TraceFormat, TraceOptions};

const PRESET: &str = include_str!("../config/sim/callsched.yaml");

fn events(text: &str) -> Trace {
    Trace::parse(
        text,
        Path::new("t.txt"),
        &TraceOptions {
            format: TraceFormat::Events,
            ..TraceOptions::default()
        },
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

fn run(order: Order, trace: &Trace) -> QueueReport {
    let mut c = Config::from_yaml(PRESET, "callsched.yaml").unwrap_or_else(|e| panic!("{e}"));
    c.queue.as_mut().unwrap().order = order;
    let p = SimParams::from_config(&c).unwrap();
    let r = run_policy(&p, trace, PolicyKind::Libra, 1, false, &mut |_| {});
    assert_eq!(r.report.served, r.report.requests, "every call served");
    r.report.queue.expect("a queue report")
}

#[test]
fn events_carry_an_optional_zone_function_and_processing_time() {
    let t = events("0.5 fn=a p_ms=12.5\n1 2 fn=b\n1.25\n2 fn=a p_ms=3\n");
    let TraceData::Events(a) = &t.data else {
        panic!()
    };
    assert_eq!(
        a.iter()
            .map(|a| (a.class, a.zone, a.service_ns))
            .collect::<Vec<_>>(),
        [(1, 0, 12_500_000), (2, 2, 0), (0, 0, 0), (1, 0, 3_000_000)]
    );
    let names: Vec<_> = t.classes.iter().map(|c| c.name.clone()).collect();
    assert_eq!(names, [None, Some("a".into()), Some("b".into())]);
    for bad in ["1 fn=", "1 p_ms=0", "1 x=2", "1 fn=a 3"] {
        let err = Trace::parse(
            bad,
            Path::new("t.txt"),
            &TraceOptions {
                format: TraceFormat::Events,
                ..TraceOptions::default()
            },
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("t.txt:1"), "{bad}: {err}");
    }
}

/// Four cores, a burst of 40 long (400 ms) and 40 short (4 ms) calls arriving
/// interleaved every 5 ms after 10 of each have completed (E[p] known): FIFO makes the
/// short calls wait behind long ones, SEPT and fair choice serve them first.
#[test]
fn sept_and_fair_choice_cut_the_short_calls_response_time_against_fifo() {
    let mut text = String::new();
    let mut t = 0.0;
    for _ in 0..10 {
        text.push_str(&format!(
            "{t:.3} fn=long p_ms=400\n{:.3} fn=short p_ms=4\n",
            t + 0.001
        ));
        t += 0.5;
    }
    for i in 0..80 {
        let (f, p) = if i % 2 == 0 {
            ("long", 400)
        } else {
            ("short", 4)
        };
        text.push_str(&format!(
            "{:.3} fn={f} p_ms={p}\n",
            t + 0.005 * f64::from(i)
        ));
    }
    let trace = events(&text);
    let short = |r: &QueueReport| {
        r.functions
            .iter()
            .find(|(n, _)| n == "short")
            .map(|(_, f)| f.response_ms.mean)
            .unwrap()
    };
    let fifo = run(Order::Fifo, &trace);
    let sept = run(Order::Sept, &trace);
    let fc = run(Order::FairChoice, &trace);
    assert_eq!(fifo.order, "fifo");
    assert_eq!(fifo.response_ms.calls, 100);
    // FIFO: the 40 long calls of the burst take 40 · 400 / 4 = 4 s of the 4 cores; a
    // short call waits for about half of that on average. SEPT: the short calls wait at
    // most for the calls already running (400 ms).
    assert!(short(&fifo) > 1000.0, "fifo {}", short(&fifo));
    assert!(short(&sept) < 500.0, "sept {}", short(&sept));
    assert!(short(&fc) < 500.0, "fair choice {}", short(&fc));
    assert!(fifo.stretch.mean > 5.0 * sept.stretch.mean);
}
