//! Criterion benchmark of the per-request routing decision: one `Controller::route` call
//! (traffic-monitor count + token bucket + least-outstanding VM choice) and the matching
//! `on_vm_request_finished`, with 8 ready VMs. This is the policy work on the gateway's
//! hot path, without locking or I/O.

// `criterion_group!` defines an undocumented `pub fn`; a bench is not an API.
#![allow(missing_docs)]

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use spillway::policy::balancer::{Attempt, RequestMeta, Route, VmFirst};
use spillway::policy::controller::{Action, Controller, ControllerParams};
use spillway::policy::monitor::MonitorParams;
use spillway::policy::scaling::{LibraScaler, LibraScalingParams};

fn controller(vms: u32) -> Controller {
    let params = ControllerParams {
        monitor: MonitorParams {
            epoch: Duration::from_secs(1),
            alpha: 0.2,
            beta: 0.2,
            decision_epochs: 1_000_000,
            first_decision_epoch: None,
        },
        r_max_rps: 1000.0,
        execute_scaling: true,
    };
    let scaler = LibraScaler::new(LibraScalingParams {
        phi: 1.0,
        r_max_rps: 1000.0,
        min_vms: vms,
        max_vms: vms,
        cip_rps: 0.0,
    });
    let mut c = Controller::new(params, Box::new(scaler), Box::new(VmFirst::new(0.8)));
    c.start(Duration::ZERO);
    while let Some(a) = c.poll_action() {
        if let Action::Launch { vm } = a {
            c.on_vm_ready(Duration::ZERO, vm);
        }
    }
    c
}

fn bench_route(cr: &mut Criterion) {
    let mut group = cr.benchmark_group("routing");
    group.throughput(Throughput::Elements(1));
    let mut c = controller(8);
    let meta = RequestMeta {
        upgrade: false,
        idempotent: true,
    };
    let mut t = Duration::ZERO;
    // 8 VMs · 1000 req/s · ρ 0.8 = 6400 tokens/s; 10 µs apart = 100k req/s, so most
    // requests spill: both branches are exercised.
    group.bench_function("route_and_finish_8_vms", |b| {
        b.iter(|| {
            t += Duration::from_micros(10);
            let r = c.route(t, black_box(&meta), Attempt::First);
            if let Route::Vm { vm, .. } = r {
                c.on_vm_request_finished(t, vm);
            }
            black_box(r)
        })
    });
    group.finish();
}

criterion_group!(benches, bench_route);
criterion_main!(benches);
