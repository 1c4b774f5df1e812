//! Scaling policies: how many VMs to run — LIBRA §III-B, Algorithm 1, and the baselines'
//! hook.
//!
//! A [`ScalingPolicy`] sees every completed epoch ([`EpochObservation`]) and may answer
//! with a [`ScaleDecision`]: the number of VMs wanted and the VM budget `vm_reqs`
//! (requests/s the balancer may send to VMs before ρ). The
//! [`Controller`](super::controller::Controller) turns the decision into launch and drain
//! actions. LIBRA's manager is [`LibraScaler`]; the simulator's baselines (MAX, FAAS, AUTO,
//! Spock) implement the same trait.

use std::time::Duration;

use super::Time;
use super::monitor::EpochClosed;

/// What a scaling policy sees at the end of each epoch.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EpochObservation {
    /// The traffic monitor's view of the epoch (count, EWMAs, report every K epochs).
    pub traffic: EpochClosed,
    /// Length of one epoch.
    pub epoch: Duration,
    /// First-attempt requests routed to VMs during the epoch.
    pub vm_requests: u64,
    /// Requests routed to the function tier during the epoch.
    pub function_requests: u64,
    /// Mean VM utilisation over the epoch (0–1, may exceed 1 when queues build), when the
    /// driver measures it (the simulator does: busy slots ÷ slots). `None` otherwise;
    /// policies then fall back to `vm_requests` ÷ (ready VMs · r_max).
    pub vm_utilisation: Option<f64>,
    /// The pool at the end of the epoch.
    pub pool: PoolSnapshot,
}

/// Number of VMs per state, as the controller tracks them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolSnapshot {
    /// Launched, not ready yet.
    pub booting: u32,
    /// Ready and taking requests.
    pub ready: u32,
    /// Taking no new requests, finishing in-flight ones before they stop.
    pub draining: u32,
    /// The last decided target.
    pub target: u32,
}

impl PoolSnapshot {
    /// VMs that count towards the target: booting + ready.
    pub fn active(&self) -> u32 {
        self.booting + self.ready
    }
}

/// Why a scaling policy chose its target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScaleReason {
    /// LIBRA Alg. 1 line 2: avg below the cost-indifference point → functions are cheaper.
    BelowCostIndifferencePoint,
    /// LIBRA Alg. 1 lines 4–5: n = ceil((avg + φ·std) / r_max).
    Provision,
    /// The computed n was raised to `min_vms`.
    ClampedToMin,
    /// The computed n was lowered to `max_vms`.
    ClampedToMax,
    /// A baseline's rule (utilisation threshold, peak provisioning, …).
    Baseline,
    /// No request seen since start: `min_vms` stay, the CIP rule waits for traffic (so
    /// that the first request after start finds a VM; see [`LibraScaler`]).
    AwaitingTraffic,
}

impl ScaleReason {
    /// Label value for metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            ScaleReason::BelowCostIndifferencePoint => "below_cip",
            ScaleReason::Provision => "provision",
            ScaleReason::ClampedToMin => "clamped_min",
            ScaleReason::ClampedToMax => "clamped_max",
            ScaleReason::Baseline => "baseline",
            ScaleReason::AwaitingTraffic => "awaiting_traffic",
        }
    }
}

/// A scaling decision: LIBRA Alg. 1's output.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ScaleDecision {
    /// VMs wanted (booting + ready).
    pub target_vms: u32,
    /// VM budget in requests/s before the balancer applies ρ (LIBRA's `vm_reqs`).
    /// `f64::INFINITY` means "no budget: send everything the VMs can take" (baselines).
    pub vm_reqs_rps: f64,
    /// Why.
    pub reason: ScaleReason,
}

/// What a scaling policy is asked before a driver closes a stretch of idle epochs at once
/// (the simulator skips the empty seconds of a sparse trace): every epoch of the
/// stretch has no request and the same VM utilisation, and the traffic EWMAs only decay.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct IdleView {
    /// End of the first idle epoch of the stretch.
    pub first_end: Time,
    /// avg after the last closed epoch, requests/s (it never grows while idle).
    pub avg_rps: f64,
    /// std after the last closed epoch, requests/s.
    pub std_rps: f64,
    /// Whether avg and std no longer change while idle (the monitor settled; see
    /// [`TrafficMonitor::idle_settled`](super::monitor::TrafficMonitor::idle_settled)).
    pub traffic_settled: bool,
    /// The utilisation the driver reports for each idle epoch (`None`: not measured).
    pub vm_utilisation: Option<f64>,
    /// The pool (it does not change during the stretch).
    pub pool: PoolSnapshot,
}

/// A scaling policy's answer to [`ScalingPolicy::idle_outlook`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum IdleOutlook {
    /// An idle epoch may still change the policy's state or decision: close the
    /// epochs one by one.
    Unsettled,
    /// Every further idle epoch leaves the policy's state as it is and returns `None`
    /// from [`ScalingPolicy::on_epoch`] or, on report epochs, this decision.
    Settled(Option<ScaleDecision>),
}

/// A scaling policy: a sans-IO state machine fed once per epoch.
pub trait ScalingPolicy: Send {
    /// Short name for reports (`"libra"`, `"auto"`, …).
    fn name(&self) -> &'static str;

    /// The decision in force before any epoch closed (initial pool and budget).
    fn initial(&self) -> ScaleDecision;

    /// Called at the end of every epoch; `Some` changes the target and/or budget.
    fn on_epoch(&mut self, now: Time, obs: &EpochObservation) -> Option<ScaleDecision>;

    /// The adaptive r_max controller (`policy::rmax`) moved r_max, requests/s: policies
    /// that size the pool by it use the new value from their next decision on. Default:
    /// ignored (the baselines keep their own r_max).
    fn set_r_max(&mut self, _r_max_rps: f64) {}

    /// LIBRA's scaling parameters in force, for a policy that has them (LIBRA §III-B);
    /// `None` for the baselines.
    fn libra_params(&self) -> Option<LibraScalingParams> {
        None
    }

    /// Use new LIBRA scaling parameters (φ, r_max, min/max VMs, CIP) from the next
    /// decision on, keeping every other state (a configuration reload).
    /// `false`: this policy has no such parameters and nothing changed.
    fn set_libra_params(&mut self, _params: &LibraScalingParams) -> bool {
        false
    }

    /// Whether idle epochs from `view.first_end` on can be closed many at once: see
    /// [`IdleOutlook`]. Default: [`IdleOutlook::Unsettled`] (always correct; the driver
    /// then closes them one by one).
    fn idle_outlook(&self, _view: &IdleView) -> IdleOutlook {
        IdleOutlook::Unsettled
    }
}

/// LIBRA's scaling-manager parameters — LIBRA §III-B.
#[derive(Clone, Debug, PartialEq)]
pub struct LibraScalingParams {
    /// φ: how many "std"s above avg the VMs are provisioned for.
    pub phi: f64,
    /// r_max: requests/s one VM serves within the SLA — the start value when adaptive
    /// ([`ScalingPolicy::set_r_max`]).
    pub r_max_rps: f64,
    /// Lower bound on the VM count (overridden by the CIP rule).
    pub min_vms: u32,
    /// Upper bound on the VM count.
    pub max_vms: u32,
    /// Cost-indifference point, requests/s: below it every VM is released.
    pub cip_rps: f64,
}

/// LIBRA's scaling manager — LIBRA §III-B, Algorithm 1. Acts on every monitor report
/// (every K epochs) and ignores the epochs in between.
///
/// One addition to Algorithm 1: until the first request is seen, every report keeps the
/// initial `min_vms` VMs ([`ScaleReason::AwaitingTraffic`]) instead of releasing them by
/// the CIP rule. An idle gateway has avg = 0 < CIP, so without it the `min_vms` a
/// freshly started gateway launches would be gone after K epochs, and the first request
/// would always pay a function cold start. From the first report after a request on,
/// Algorithm 1 applies unchanged (the CIP rule releases VMs whenever avg < CIP).
#[derive(Clone, Debug)]
pub struct LibraScaler {
    params: LibraScalingParams,
    seen_traffic: bool,
}

impl LibraScaler {
    /// A scaler with the given parameters.
    pub fn new(params: LibraScalingParams) -> Self {
        Self {
            params,
            seen_traffic: false,
        }
    }

    /// Algorithm 1 on one (avg, std) report, both in requests/s.
    ///
    /// Line 2: `avg < CIP` → release every VM (this overrides `min_vms`).
    /// Lines 4–5: `vm_reqs = avg + φ·std`, `n = ceil(vm_reqs / r_max)`, clamped to
    /// `[min_vms, max_vms]`.
    pub fn decide(&self, avg_rps: f64, std_rps: f64) -> ScaleDecision {
        let p = &self.params;
        if avg_rps < p.cip_rps {
            return ScaleDecision {
                target_vms: 0,
                vm_reqs_rps: 0.0,
                reason: ScaleReason::BelowCostIndifferencePoint,
            };
        }
        let vm_reqs = avg_rps + p.phi * std_rps;
        let n = (vm_reqs / p.r_max_rps).ceil().max(0.0);
        let n = if n > f64::from(u32::MAX) {
            u32::MAX
        } else {
            n as u32
        };
        let (target_vms, reason) = if n < p.min_vms {
            (p.min_vms, ScaleReason::ClampedToMin)
        } else if n > p.max_vms {
            (p.max_vms, ScaleReason::ClampedToMax)
        } else {
            (n, ScaleReason::Provision)
        };
        ScaleDecision {
            target_vms,
            vm_reqs_rps: vm_reqs,
            reason,
        }
    }
}

impl ScalingPolicy for LibraScaler {
    fn name(&self) -> &'static str {
        "libra"
    }

    /// Before the first report: `min_vms` VMs with a budget of their whole capacity.
    fn initial(&self) -> ScaleDecision {
        ScaleDecision {
            target_vms: self.params.min_vms,
            vm_reqs_rps: f64::from(self.params.min_vms) * self.params.r_max_rps,
            reason: ScaleReason::ClampedToMin,
        }
    }

    fn on_epoch(&mut self, _now: Time, obs: &EpochObservation) -> Option<ScaleDecision> {
        self.seen_traffic |= obs.traffic.requests > 0;
        let report = obs.traffic.report?;
        if !self.seen_traffic {
            return Some(ScaleDecision {
                reason: ScaleReason::AwaitingTraffic,
                ..self.initial()
            });
        }
        Some(self.decide(report.avg_rps, report.std_rps))
    }

    /// Alg. 1 line 3: the next decision divides by the adapted r_max.
    fn set_r_max(&mut self, r_max_rps: f64) {
        self.params.r_max_rps = r_max_rps;
    }

    fn libra_params(&self) -> Option<LibraScalingParams> {
        Some(self.params.clone())
    }

    /// Whether traffic was seen stays: a reload does not bring back the idle start rule.
    fn set_libra_params(&mut self, params: &LibraScalingParams) -> bool {
        self.params = params.clone();
        true
    }

    /// Idle reports repeat one decision when: no request was ever seen (the awaiting
    /// decision), avg is already below the CIP (it only decays: every report releases
    /// every VM), or the EWMAs settled (every report sees the same avg and std).
    fn idle_outlook(&self, view: &IdleView) -> IdleOutlook {
        if !self.seen_traffic {
            return IdleOutlook::Settled(Some(ScaleDecision {
                reason: ScaleReason::AwaitingTraffic,
                ..self.initial()
            }));
        }
        if view.avg_rps < self.params.cip_rps || view.traffic_settled {
            return IdleOutlook::Settled(Some(self.decide(view.avg_rps, view.std_rps)));
        }
        IdleOutlook::Unsettled
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scaler() -> LibraScaler {
        LibraScaler::new(LibraScalingParams {
            phi: 1.0,
            r_max_rps: 16.0,
            min_vms: 1,
            max_vms: 5,
            cip_rps: 3.3,
        })
    }

    #[test]
    fn algorithm_1_provisions_avg_plus_phi_std() {
        // vm_reqs = 40 + 1·9 = 49 → ceil(49/16) = 4 VMs.
        let d = scaler().decide(40.0, 9.0);
        assert_eq!(d.target_vms, 4);
        assert_eq!(d.vm_reqs_rps, 49.0);
        assert_eq!(d.reason, ScaleReason::Provision);
        // exactly 48 → 3 VMs (ceil of an integer).
        assert_eq!(scaler().decide(40.0, 8.0).target_vms, 3);
    }

    #[test]
    fn below_the_cip_every_vm_is_released_even_below_min_vms() {
        let d = scaler().decide(3.2, 50.0);
        assert_eq!(d.target_vms, 0);
        assert_eq!(d.vm_reqs_rps, 0.0);
        assert_eq!(d.reason, ScaleReason::BelowCostIndifferencePoint);
    }

    fn observe(requests: u64, report: Option<(f64, f64)>) -> EpochObservation {
        use super::super::monitor::TrafficReport;
        EpochObservation {
            traffic: EpochClosed {
                epoch: 0,
                requests,
                avg_rps: report.map_or(0.0, |r| r.0),
                std_rps: report.map_or(0.0, |r| r.1),
                report: report.map(|(avg_rps, std_rps)| TrafficReport {
                    epoch: 0,
                    avg_rps,
                    std_rps,
                }),
            },
            epoch: Duration::from_secs(1),
            vm_requests: 0,
            function_requests: requests,
            vm_utilisation: None,
            pool: PoolSnapshot::default(),
        }
    }

    #[test]
    fn min_vms_stay_until_the_first_request_then_the_cip_rule_applies() {
        let mut s = scaler(); // min_vms 1, r_max 16, CIP 3.3
        let t = Time::ZERO;
        // Idle reports (avg 0 < CIP): the initial VM stays.
        for _ in 0..3 {
            assert_eq!(
                s.on_epoch(t, &observe(0, None)),
                None,
                "no report, no decision"
            );
            let d = s.on_epoch(t, &observe(0, Some((0.0, 0.0)))).unwrap();
            assert_eq!(
                d,
                ScaleDecision {
                    target_vms: 1,
                    vm_reqs_rps: 16.0,
                    reason: ScaleReason::AwaitingTraffic
                }
            );
        }
        // One request in an epoch between reports: the next report decides by Alg. 1.
        assert_eq!(s.on_epoch(t, &observe(1, None)), None);
        let d = s.on_epoch(t, &observe(0, Some((0.2, 0.3)))).unwrap();
        assert_eq!(d.reason, ScaleReason::BelowCostIndifferencePoint);
        assert_eq!(d.target_vms, 0);
        // And it never waits again, even after a quiet spell.
        let d = s.on_epoch(t, &observe(0, Some((0.0, 0.0)))).unwrap();
        assert_eq!(d.reason, ScaleReason::BelowCostIndifferencePoint);
    }

    #[test]
    fn traffic_in_the_report_epoch_itself_counts() {
        let mut s = scaler();
        let d = s
            .on_epoch(Time::ZERO, &observe(40, Some((40.0, 9.0))))
            .unwrap();
        assert_eq!((d.target_vms, d.reason), (4, ScaleReason::Provision));
    }

    #[test]
    fn an_adapted_r_max_sizes_the_next_decision() {
        let mut s = scaler();
        s.set_r_max(12.5);
        // ceil(49 / 12.5) = 4 → 4; ceil(51 / 12.5) = 5 (16 would give 4).
        assert_eq!(s.decide(40.0, 9.0).target_vms, 4);
        assert_eq!(s.decide(42.0, 9.0).target_vms, 5);
        assert_eq!(scaler().decide(42.0, 9.0).target_vms, 4);
    }

    #[test]
    fn clamps_to_min_and_max() {
        assert_eq!(scaler().decide(4.0, 0.0).target_vms, 1);
        let d = scaler().decide(200.0, 0.0);
        assert_eq!((d.target_vms, d.reason), (5, ScaleReason::ClampedToMax));
        assert_eq!(
            d.vm_reqs_rps, 200.0,
            "the balancer caps the budget at ready capacity"
        );
    }

    /// φ ≠ 1: a scaler that ignored φ (49) or squared it (60.25) gives another
    /// `vm_reqs`; the expectation is Alg. 1's formula evaluated here, not by `decide`.
    #[test]
    fn phi_weights_the_deviation_once() {
        let (phi, r_max, avg, std) = (1.5, 16.0, 40.0, 9.0);
        let s = LibraScaler::new(LibraScalingParams {
            phi,
            r_max_rps: r_max,
            min_vms: 0,
            max_vms: 50,
            cip_rps: 3.3,
        });
        let d = s.decide(avg, std);
        let vm_reqs = avg + phi * std; // 53.5
        assert_eq!(d.vm_reqs_rps, vm_reqs);
        assert_eq!(d.target_vms, (vm_reqs / r_max).ceil() as u32);
        assert_eq!(d.reason, ScaleReason::Provision);
        // Points where the VM count itself tells the variants apart (φ ignored / φ²):
        // 40 + 1.5·16 = 64 → 4 (φ² → 76 → 5); 30 + 1.5·12 = 48 → 3 (φ² → 57 → 4);
        // 30 + 1.5·14 = 51 → 4 (φ ignored → 44 → 3).
        for (avg, std) in [(40.0, 16.0), (30.0, 12.0), (30.0, 14.0)] {
            let n = ((avg + phi * std) / r_max).ceil() as u32;
            assert_eq!(s.decide(avg, std).target_vms, n, "avg {avg}, std {std}");
        }
        assert_eq!(s.decide(30.0, 14.0).target_vms, 4);
    }

    /// `min_vms` binds: Alg. 1 asks for fewer VMs than the floor.
    #[test]
    fn a_binding_min_vms_raises_the_count_but_not_the_budget() {
        let (phi, r_max, min_vms) = (0.75, 16.0, 3);
        let s = LibraScaler::new(LibraScalingParams {
            phi,
            r_max_rps: r_max,
            min_vms,
            max_vms: 7,
            cip_rps: 3.3,
        });
        let (avg, std) = (20.0, 8.0);
        let vm_reqs = avg + phi * std; // 26 → ceil(26/16) = 2 < 3
        assert!(
            ((vm_reqs / r_max).ceil() as u32) < min_vms,
            "the floor binds"
        );
        let d = s.decide(avg, std);
        assert_eq!(
            (d.target_vms, d.vm_reqs_rps, d.reason),
            (min_vms, vm_reqs, ScaleReason::ClampedToMin)
        );
        // Exactly the floor's capacity (3 · 16 = 48): the floor itself, not a clamp.
        let d = s.decide(48.0 - phi * 8.0, 8.0);
        assert_eq!((d.target_vms, d.reason), (min_vms, ScaleReason::Provision));
        // One request/s above the floor's capacity: 4 VMs, not clamped.
        let d = s.decide(49.0 - phi * 8.0, 8.0);
        assert_eq!(
            (d.target_vms, d.reason),
            (min_vms + 1, ScaleReason::Provision)
        );
        // Exactly at max: Provision; above: ClampedToMax.
        let d = s.decide(7.0 * r_max, 0.0);
        assert_eq!((d.target_vms, d.reason), (7, ScaleReason::Provision));
        let d = s.decide(7.0 * r_max + 0.5, 0.0);
        assert_eq!((d.target_vms, d.reason), (7, ScaleReason::ClampedToMax));
        // Exactly at the CIP: VMs are kept (line 2 is a strict `<`).
        assert_eq!(s.decide(3.3, 0.0).reason, ScaleReason::ClampedToMin);
        // The initial pool is the floor, its budget the floor's capacity.
        assert_eq!(
            s.initial(),
            ScaleDecision {
                target_vms: min_vms,
                vm_reqs_rps: f64::from(min_vms) * r_max,
                reason: ScaleReason::ClampedToMin
            }
        );
    }

    /// The reason labels are the values `/status` and the metrics document (the manual's
    /// admin page, docs/src/guide/admin.md); the pool counts booting + ready VMs as active.
    #[test]
    fn reason_labels_and_the_active_pool() {
        let labels = [
            (ScaleReason::Provision, "provision"),
            (ScaleReason::ClampedToMin, "clamped_min"),
            (ScaleReason::ClampedToMax, "clamped_max"),
            (ScaleReason::BelowCostIndifferencePoint, "below_cip"),
            (ScaleReason::AwaitingTraffic, "awaiting_traffic"),
            (ScaleReason::Baseline, "baseline"),
        ];
        for (reason, label) in labels {
            assert_eq!(reason.as_str(), label);
        }
        let pool = PoolSnapshot {
            booting: 2,
            ready: 5,
            draining: 3,
            target: 9,
        };
        assert_eq!(pool.active(), 7, "booting + ready, not draining");
        assert_eq!(scaler().name(), "libra");
    }
}
