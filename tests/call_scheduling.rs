//! Call scheduling on saturated capacity (call scheduling §4), on real
//! processes: one VM (a sample API) with 2 slots, a process function tier with
//! `max_instances: 1` held busy, so every further call waits in the gateway queue.
//! Real time (the gateway is another process): the harness measures with std's clock.
#![allow(clippy::disallowed_methods)]

mod common;

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::{Gateway, SampleApi, exe, header, http, u64_at};
use serde_json::Value;

/// Processing times (ms) of the two functions; asymmetric on purpose.
const SHORT_MS: u64 = 20;
const LONG_MS: u64 = 300;
/// Calls of each key in the burst; the queue holds exactly the burst.
const PER_KEY: usize = 4;

fn config(vm: SocketAddr, order: &str) -> String {
    let exe = exe();
    format!(
        r#"
gateway:
  listen: 127.0.0.1:0
  admin_listen: 127.0.0.1:0
  allow_loopback_upstreams: true
libra:
  decision_epochs: 1000
  r_max_rps: 1000
  rho: 1.0
vm_pool:
  type: static
  urls: ["http://{vm}"]
  slots_per_vm: 2
function_tier:
  type: process
  command: ["{exe}", "sample-api", "--listen", "127.0.0.1:{{port}}", "--name", "fn-{{port}}"]
  max_instances: 1
  probe_interval_seconds: 0.02
queue:
  order: {order}
  max_queue_length: {len}
  max_queue_wait_seconds: 30
routes:
  - {{name: short, path_prefix: /sleep, methods: [GET]}}
  - {{name: long, path_prefix: /sleep, methods: [POST]}}
  - {{name: hold, path_prefix: /sleep, methods: [PUT]}}
"#,
        len = 2 * PER_KEY
    )
}

/// One call on its own thread: (status, when its response ended).
fn spawn_call(addr: SocketAddr, method: &'static str, path: String) -> JoinHandle<(u16, Instant)> {
    std::thread::spawn(move || {
        let (code, _, _) = http(addr, method, &path, &[], b"");
        (code, Instant::now())
    })
}

fn queue_length(s: &Value) -> u64 {
    s.pointer("/queue/length")
        .and_then(Value::as_u64)
        .unwrap_or(0)
}

/// Warm up, saturate, queue a burst of alternating long and short calls (in a known
/// arrival order), check the 503 of a full queue and a disconnect; returns the short
/// calls' mean response time counted from when the VM's slots freed, ms.
///
/// Every call of the burst arrived before the slots freed (at T), so a call's response
/// time is (T − its arrival) + (its completion − T). The first term depends on how fast
/// the test sent the burst, not on the order; the second is what the order decides. T is
/// taken as the first completion in the burst (a short call's 20 ms after T, under
/// either order).
fn short_mean_ms(order: &str) -> f64 {
    let vm = SampleApi::start("vm");
    let gw = Gateway::start(&config(vm.addr, order));
    let wait = Duration::from_secs(20);
    // 10 warm-up calls per key, one at a time (free slots: nothing queues): E[p].
    for _ in 0..10 {
        assert_eq!(
            http(gw.proxy, "GET", &format!("/sleep?ms={SHORT_MS}"), &[], b"").0,
            200
        );
        assert_eq!(
            http(gw.proxy, "POST", &format!("/sleep?ms={LONG_MS}"), &[], b"").0,
            200
        );
    }
    let s = gw.status();
    for (key, p) in [("short", SHORT_MS), ("long", LONG_MS)] {
        let e = s["queue"]["routes"][key]["expected_processing_ms"]
            .as_f64()
            .unwrap();
        assert!(e >= p as f64 && e < p as f64 + 100.0, "{key}: E[p] {e} ms");
    }
    // Saturate: two calls fill the VM's slots, a third holds the one function instance.
    let mut holders: Vec<_> = (0..2)
        .map(|_| spawn_call(gw.proxy, "PUT", "/sleep?ms=5000".into()))
        .collect();
    gw.wait_status("VM slots full", wait, |s| {
        u64_at(s, "/vm_pool/vms/0/outstanding") == 2
    });
    holders.push(spawn_call(gw.proxy, "PUT", "/sleep?ms=8000".into()));
    gw.wait_status("function instance taken", wait, |s| {
        u64_at(s, "/functions/zones/0/stats/instances") == 1
    });
    // A client that disconnects while queued leaves the queue, never sent upstream.
    let mut gone = TcpStream::connect(gw.proxy).unwrap();
    write!(gone, "GET /headers HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    gw.wait_status("disconnecting call queued", wait, |s| queue_length(s) == 1);
    drop(gone);
    gw.wait_status("disconnected call left", wait, |s| queue_length(s) == 0);
    // The burst: long, short, long, short… each queued before the next is sent.
    let mut shorts = Vec::new();
    let mut longs = Vec::new();
    for i in 0..PER_KEY {
        longs.push(spawn_call(gw.proxy, "POST", format!("/sleep?ms={LONG_MS}")));
        gw.wait_status("long queued", wait, |s| queue_length(s) == 2 * i as u64 + 1);
        shorts.push(spawn_call(gw.proxy, "GET", format!("/sleep?ms={SHORT_MS}")));
        gw.wait_status("short queued", wait, |s| {
            queue_length(s) == 2 * i as u64 + 2
        });
    }
    // The queue is full: 503 with Retry-After at once.
    let (code, headers, _) = http(gw.proxy, "GET", &format!("/sleep?ms={SHORT_MS}"), &[], b"");
    assert_eq!(code, 503);
    assert!(header(&headers, "retry-after").is_some(), "{headers:?}");
    let done = |hs: Vec<JoinHandle<(u16, Instant)>>| -> Vec<Instant> {
        hs.into_iter()
            .map(|h| {
                let (code, at) = h.join().unwrap();
                assert_eq!(code, 200);
                at
            })
            .collect()
    };
    let (short, long) = (done(shorts), done(longs));
    let t = *short.iter().chain(&long).min().unwrap();
    let short: Vec<Duration> = short.iter().map(|s| *s - t).collect();
    eprintln!("{order}: short calls done after the first: {short:?}");
    for h in holders {
        assert_eq!(h.join().unwrap().0, 200);
    }
    let s = gw.status();
    assert_eq!(queue_length(&s), 0);
    assert_eq!(s["queue"]["order"], order);
    assert!(
        vm.stats()["by_path"].get("/headers").is_none(),
        "the disconnected call reached the VM: {}",
        vm.stats()
    );
    let (_, _, metrics) = http(gw.admin, "GET", "/metrics", &[], b"");
    let metrics = String::from_utf8_lossy(&metrics);
    assert!(
        metrics.contains("spillway_queue_wait_seconds{route=\"short\",stat=\"p95\"}"),
        "{metrics}"
    );
    short.iter().map(Duration::as_secs_f64).sum::<f64>() * 1e3 / short.len() as f64
}

#[test]
fn saturated_calls_queue_and_sept_serves_short_calls_sooner_than_fifo() {
    let fifo = short_mean_ms("fifo");
    let sept = short_mean_ms("sept");
    eprintln!("short calls' mean response after T: fifo {fifo:.0} ms, sept {sept:.0} ms");
    // Two slots free together at T. FIFO serves L S L S L S L S: the short calls end
    // S, L + S, L + 2S and 2L + 2S after T, i.e. 0, L, L + S, 2L + S after the first
    // completion: mean L + S/2 (310 ms). SEPT serves the four short calls first: 0, 0, S,
    // S, mean S/2 (10 ms). Half of the difference L is left as a margin for the machine.
    let (l, s) = (LONG_MS as f64, SHORT_MS as f64);
    assert!(
        fifo - sept > l / 2.0 && sept < s / 2.0 + l / 2.0,
        "short calls' mean response after T: fifo {fifo:.0} ms (expected {:.0}), sept \
         {sept:.0} ms (expected {:.0})",
        l + s / 2.0,
        s / 2.0
    );
}
