//! The delay-queue model (ProFaaStinate §3): synchronous and asynchronous calls of an
//! `events` trace with named columns, on VMs with CPU cores shared by their running calls
//! and by other load, driven by the policy [`Core`] with or without its delay queue.
//!
//! Physics (ours, beyond the slot model of `sim::engine`):
//! * each VM has `cores` (`sim.vm.cores`, default `sim.vm.slots`) and `slots`; a call
//!   takes one slot (no oversubscription; further calls wait in the VM's FIFO queue);
//! * other load (`sim.cpu_load`) holds `c` cores of every VM from `t1` to `t2`; running
//!   calls progress at rate `min(1, (cores − c) ÷ running)` of their processing time;
//! * the function tier runs a call in its processing time plus the warm or cold start;
//! * the CPU signal is `(c + min(running, cores − c)) ÷ cores`, averaged over ready VMs.
//!
//! Time advances in fixed steps of [`STEP`] (the rates change with every start and end,
//! so completions are integrated rather than scheduled); the policy core's timers fire
//! at the first step at or after their deadline.
//!
//! Without the queue (`--delay-queue off`) asynchronous calls are routed at arrival like
//! synchronous ones. Reported: synchronous mean and p95 response time inside `[t1, t2]`
//! and overall, asynchronous deadline misses, the CPU peak.

use std::collections::VecDeque;
use std::time::Duration;

use hdrhistogram::Histogram;

use super::engine::{PolicyKind, SimParams};
use super::error::SimError;
use super::trace::Trace;
use crate::policy::attempt::{Decision, Ticket};
use crate::policy::balancer::RequestMeta;
use crate::policy::controller;
use crate::policy::core::{Action, Core, Release};
use crate::policy::delay::{CallId, DelayParams};
use crate::policy::placement::{Lease, Start};
use crate::policy::{Time, VmId};

/// The model's time step.
pub const STEP: Duration = Duration::from_millis(5);

/// Results of one run.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct DelayRun {
    /// Whether the delay queue was on.
    pub delay_queue: bool,
    /// Synchronous calls inside `[t1, t2]` (by arrival).
    pub sync_in_peak: u64,
    /// Their mean response time, ms.
    pub sync_peak_mean_ms: f64,
    /// Their 95th percentile, ms.
    pub sync_peak_p95_ms: f64,
    /// Mean synchronous response time over the whole trace, ms.
    pub sync_mean_ms: f64,
    /// Asynchronous calls finished.
    pub async_finished: u64,
    /// Asynchronous calls finished after their deadline.
    pub deadline_misses: u64,
    /// Asynchronous calls run on the function tier.
    pub async_on_functions: u64,
    /// Calls refused (no capacity).
    pub rejected: u64,
    /// Highest CPU utilisation sampled (mean over ready VMs), 0–1.
    pub cpu_peak: f64,
    /// When the last call finished, s.
    pub last_finish_s: f64,
}

struct Running {
    call: usize,
    left_s: f64,
    started: Time,
}

#[derive(Default)]
struct VmM {
    ready: bool,
    gone: bool,
    running: Vec<Running>,
    waiting: VecDeque<(usize, Time)>,
}

struct FnCall {
    call: usize,
    done: Time,
    lease: Lease,
    started: Time,
}

/// Run `trace` under `kind` with the delay queue on or off.
///
/// # Errors
/// [`SimError::Invalid`] when the trace has no named columns (no call kinds).
pub fn run(
    p: &SimParams,
    trace: &Trace,
    kind: PolicyKind,
    delay: Option<DelayParams>,
    cpu_load: Option<(f64, f64, f64)>,
) -> Result<DelayRun, SimError> {
    if trace.calls.is_empty() {
        return Err(SimError::Invalid {
            field: "--trace".into(),
            message: "--delay-queue needs an events trace with a header naming its columns (time_s kind deadline_s processing_ms zone)".into(),
        });
    }
    let calls = &trace.calls;
    let on = delay.is_some();
    let (scaler, router) = kind.build(&p.policy_params(trace));
    let mut core = Core::new(p.core_params(), scaler, router).with_delay_queue(delay);
    let slots = p.vm.slots as usize;
    let cores = f64::from(p.vm.cores.unwrap_or(p.vm.slots));
    let (load_c, t1, t2) = cpu_load.unwrap_or((0.0, 0.0, 0.0));
    let boot = Duration::from_secs_f64(p.vm.boot_seconds);
    let warm = Duration::from_secs_f64(p.function.warm_start_ms / 1000.0);
    let cold = Duration::from_secs_f64(p.function.cold_start_ms / 1000.0);
    let mut vms: Vec<VmM> = Vec::new();
    let mut booting: Vec<(VmId, Time)> = Vec::new();
    let mut fns: Vec<FnCall> = Vec::new();
    let mut deadline_of: Vec<Time> = vec![Time::ZERO; calls.len()];
    let mut peak = Histogram::<u64>::new_with_bounds(1, 100_000_000, 3).expect("bounds");
    let (mut sync_sum, mut sync_n) = (0.0, 0u64);
    let mut out = DelayRun {
        delay_queue: on,
        sync_in_peak: 0,
        sync_peak_mean_ms: 0.0,
        sync_peak_p95_ms: 0.0,
        sync_mean_ms: 0.0,
        async_finished: 0,
        deadline_misses: 0,
        async_on_functions: 0,
        rejected: 0,
        cpu_peak: 0.0,
        last_finish_s: 0.0,
    };
    let mut peak_sum = 0.0;
    let at = |i: usize| Duration::from_nanos(calls[i].at_ns);
    let work = |i: usize| calls[i].processing_ms / 1000.0;

    let load_at = |t: Time| {
        let s = t.as_secs_f64();
        if s >= t1 && s < t2 { load_c } else { 0.0 }
    };

    core.start(Time::ZERO);
    let mut next = 0usize;
    let mut now = Time::ZERO;
    let mut finished_calls = 0usize;
    let mut initial = true;
    let mut next_probe = Time::ZERO;
    loop {
        // Actions and releases of the core.
        loop {
            let mut any = false;
            while let Some(a) = core.poll_action() {
                any = true;
                match a {
                    Action::Scaling(controller::Action::Launch { vm }) => {
                        let i = vm.0 as usize;
                        if vms.len() <= i {
                            vms.resize_with(i + 1, VmM::default);
                        }
                        if initial {
                            vms[i].ready = true;
                            core.on_vm_ready(now, vm);
                        } else {
                            booting.push((vm, now + boot));
                        }
                    }
                    Action::Scaling(controller::Action::Stop { vm }) => {
                        if let Some(v) = vms.get_mut(vm.0 as usize) {
                            v.gone = true;
                        }
                    }
                    Action::StartInstance { zone, instance } => {
                        core.on_instance_started(now, zone, instance);
                    }
                    Action::StopInstance { zone, instance } => {
                        core.on_instance_stopped(now, zone, instance);
                    }
                    Action::SampleCpu => {
                        let u = cpu(&vms, cores, load_at(now));
                        core.on_cpu_sample(now, u);
                    }
                    _ => {}
                }
            }
            while let Some(Release {
                id,
                mut ticket,
                decision,
                deadline,
                ..
            }) = core.poll_release()
            {
                any = true;
                let i = id.0 as usize;
                deadline_of[i] = deadline;
                if !matches!(decision, Decision::Vm { .. }) {
                    out.async_on_functions += 1;
                }
                start(
                    &mut core,
                    &mut vms,
                    &mut fns,
                    &mut out,
                    slots,
                    warm,
                    cold,
                    now,
                    i,
                    decision,
                    &mut ticket,
                    work(i),
                );
            }
            if !any {
                break;
            }
        }
        initial = false;
        if next >= calls.len() && finished_calls + out.rejected as usize >= calls.len() {
            break;
        }
        now += STEP;
        // VM boots.
        booting.retain(|&(vm, t)| {
            if t <= now {
                if let Some(v) = vms.get_mut(vm.0 as usize) {
                    v.ready = true;
                }
                core.on_vm_ready(now, vm);
                false
            } else {
                true
            }
        });
        // Progress of running VM calls.
        let c = load_at(now);
        let dt = STEP.as_secs_f64();
        let mut done: Vec<(usize, VmId, Time)> = Vec::new();
        for (vi, v) in vms.iter_mut().enumerate() {
            if v.running.is_empty() {
                continue;
            }
            let rate = ((cores - c).max(0.0) / v.running.len() as f64).min(1.0);
            v.running.retain_mut(|r| {
                r.left_s -= rate * dt;
                if r.left_s <= 1e-12 {
                    done.push((r.call, VmId(vi as u64), r.started));
                    false
                } else {
                    true
                }
            });
            while v.running.len() < slots
                && let Some((call, _)) = v.waiting.pop_front()
            {
                v.running.push(Running {
                    call,
                    left_s: work(call),
                    started: now,
                });
            }
        }
        for (i, vm, started) in done {
            finished_calls += 1;
            core.on_vm_request_finished(now, vm);
            finish(
                &mut core,
                &mut out,
                &mut peak,
                &mut sync_sum,
                &mut sync_n,
                &mut peak_sum,
                calls,
                &deadline_of,
                on,
                t1,
                t2,
                i,
                now,
                now - started,
                at(i),
            );
        }
        // The CPU peak is measured every second, queue or not.
        if now >= next_probe {
            next_probe += Duration::from_secs(1);
            out.cpu_peak = out.cpu_peak.max(cpu(&vms, cores, load_at(now)));
        }
        // Function calls.
        let mut k = 0;
        while k < fns.len() {
            if fns[k].done <= now {
                let f = fns.swap_remove(k);
                finished_calls += 1;
                core.on_function_finished(now, f.lease);
                finish(
                    &mut core,
                    &mut out,
                    &mut peak,
                    &mut sync_sum,
                    &mut sync_n,
                    &mut peak_sum,
                    calls,
                    &deadline_of,
                    on,
                    t1,
                    t2,
                    f.call,
                    now,
                    now - f.started,
                    at(f.call),
                );
            } else {
                k += 1;
            }
        }
        // Timers.
        if core.poll_timeout() <= now {
            core.handle_timeout(now);
        }
        // Arrivals.
        while next < calls.len() && at(next) <= now {
            let i = next;
            next += 1;
            let e = calls[i];
            if e.is_async && on {
                let deadline = at(i) + Duration::from_secs_f64(e.deadline_s);
                core.enqueue_async(now, CallId(i as u128), deadline, at(i));
            } else {
                let mut ticket = Ticket::new(RequestMeta::default(), None);
                let d = core.route(now, &mut ticket);
                if e.is_async {
                    deadline_of[i] = at(i) + Duration::from_secs_f64(e.deadline_s);
                    if !matches!(d, Decision::Vm { .. }) {
                        out.async_on_functions += 1;
                    }
                }
                start(
                    &mut core,
                    &mut vms,
                    &mut fns,
                    &mut out,
                    slots,
                    warm,
                    cold,
                    now,
                    i,
                    d,
                    &mut ticket,
                    work(i),
                );
            }
        }
        if now > Duration::from_secs_f64(trace.duration_s + 7.0 * 86_400.0) {
            break;
        }
    }
    out.sync_peak_mean_ms = if out.sync_in_peak > 0 {
        peak_sum / out.sync_in_peak as f64
    } else {
        0.0
    };
    out.sync_peak_p95_ms = peak.value_at_quantile(0.95) as f64 / 1000.0;
    out.sync_mean_ms = if sync_n > 0 {
        sync_sum / sync_n as f64
    } else {
        0.0
    };
    out.sync_peak_mean_ms = round3(out.sync_peak_mean_ms);
    out.sync_mean_ms = round3(out.sync_mean_ms);
    out.cpu_peak = round3(out.cpu_peak);
    out.last_finish_s = round3(out.last_finish_s);
    Ok(out)
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// Mean CPU utilisation over ready VMs: `(c + min(running, cores − c)) ÷ cores`.
fn cpu(vms: &[VmM], cores: f64, c: f64) -> f64 {
    let ready: Vec<&VmM> = vms.iter().filter(|v| v.ready && !v.gone).collect();
    if ready.is_empty() {
        return 0.0;
    }
    let sum: f64 = ready
        .iter()
        .map(|v| ((c + (v.running.len() as f64).min((cores - c).max(0.0))) / cores).min(1.0))
        .sum();
    sum / ready.len() as f64
}

#[allow(clippy::too_many_arguments)]
fn start(
    core: &mut Core,
    vms: &mut [VmM],
    fns: &mut Vec<FnCall>,
    out: &mut DelayRun,
    slots: usize,
    warm: Duration,
    cold: Duration,
    now: Time,
    i: usize,
    d: Decision,
    ticket: &mut Ticket,
    work_s: f64,
) {
    match d {
        Decision::Vm { vm, .. } => {
            ticket.hand_over();
            let v = &mut vms[vm.0 as usize];
            if v.running.len() < slots {
                v.running.push(Running {
                    call: i,
                    left_s: work_s,
                    started: now,
                });
            } else {
                v.waiting.push_back((i, now));
            }
        }
        Decision::Function { lease, .. } => {
            ticket.hand_over();
            let extra = match lease.start {
                Start::Cold(inst) => {
                    // Modelled: ready at once for the core; the call pays the cold start.
                    core.on_instance_started(now, lease.zone, inst);
                    cold
                }
                _ => warm,
            };
            fns.push(FnCall {
                call: i,
                done: now + extra + Duration::from_secs_f64(work_s),
                lease,
                started: now,
            });
        }
        Decision::Queue { .. } | Decision::Reject { .. } => {
            out.rejected += 1;
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn finish(
    core: &mut Core,
    out: &mut DelayRun,
    peak: &mut Histogram<u64>,
    sync_sum: &mut f64,
    sync_n: &mut u64,
    peak_sum: &mut f64,
    calls: &[super::trace::CallEvent],
    deadline_of: &[Time],
    on: bool,
    t1: f64,
    t2: f64,
    i: usize,
    now: Time,
    processing: Duration,
    arrival: Time,
) {
    out.last_finish_s = out.last_finish_s.max(now.as_secs_f64());
    let e = calls[i];
    if e.is_async {
        out.async_finished += 1;
        if now > deadline_of[i] {
            out.deadline_misses += 1;
        }
        if on {
            core.on_async_finished(now, deadline_of[i], processing);
        }
        return;
    }
    let ms = (now - arrival).as_secs_f64() * 1000.0;
    *sync_sum += ms;
    *sync_n += 1;
    let a = arrival.as_secs_f64();
    if a >= t1 && a < t2 {
        out.sync_in_peak += 1;
        *peak_sum += ms;
        let _ = peak.record(((ms * 1000.0).round() as u64).max(1));
    }
}
