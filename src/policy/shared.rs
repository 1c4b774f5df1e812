//! One decision for several gateway replicas: the pure inputs and rules a coordinator
//! (the driver-side `spillway::coord`) needs so that N replicas behind an L4 balancer
//! make the decisions one gateway would make at the same total load (LIBRA §III).
//!
//! Nothing here talks to a store: the coordinator moves values between the replicas
//! and feeds them to each replica's [`Controller`](super::controller::Controller)
//! (through [`Core`](super::core::Core)) as plain inputs:
//!
//! * [`CountSource::Aggregate`]: the traffic monitor (LIBRA §III-A) no longer closes
//!   epochs on its own count; every epoch's **local** count comes out as an
//!   [`EpochCount`] for the coordinator to share, and the monitor closes an epoch only
//!   when the coordinator hands it the **sum over the replicas**
//!   (`Core::on_aggregate_count`). [`CountSource::Local`] (the default) is a single
//!   gateway: exactly the behaviour without coordination.
//! * an external scaling decision (`Core::apply_decision`): a follower takes the
//!   leader's Algorithm 1 output (LIBRA §III-B) instead of running its own;
//! * a budget share (`Core::set_budget_share`): the balancer (LIBRA §III-C) admits
//!   `share · ρ · vm_reqs`, so that the replicas together admit what one would;
//! * whether this replica writes the pool (`Core::set_pool_writer`): only the leader's
//!   decisions launch and stop VMs; the others' VM tables follow a registry
//!   (`Core::adopt_ready_vm`, `Core::drain_vm`, `Core::on_vm_failed`);
//! * the EWMA state ([`EwmaState`], `Core::ewma_state` / `Core::restore_ewma`), so that
//!   a new leader resumes the monitor where the old one stopped;
//! * a scale-in hold (`Core::hold_scale_in`): a new leader that found no state makes no
//!   scale-in until it has seen K epochs of its own.
//!
//! The two rules the leader applies are functions here: [`aggregate`] (sum the
//! replicas' counts, imputing a replica that missed an epoch from its last count) and
//! [`budget_shares`] (each replica's share of the VM budget: proportional to its own
//! traffic, a surplus divided max-min fairly), with each replica's traffic taken as its
//! mean over the last few epochs ([`ShareDemands`]).

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

/// Where the traffic monitor's epoch counts come from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CountSource {
    /// The requests this gateway counted (one gateway; the default).
    #[default]
    Local,
    /// The sum over every replica, handed in per epoch by the coordinator; the local
    /// counts come out as [`EpochCount`]s.
    Aggregate,
}

/// The requests one replica counted in one epoch (`[i·E, (i+1)·E)` on its policy clock).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochCount {
    /// Epoch index on the replica's policy clock.
    pub epoch: u64,
    /// First attempts (and admitted deferred calls) counted in it.
    pub requests: u64,
}

/// The traffic monitor's state after one closed epoch (LIBRA §III-A), in requests per
/// **epoch**: what a new leader needs to resume the EWMAs.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct EwmaState {
    /// Index of the last closed epoch.
    pub epoch: u64,
    /// `avg`, requests per epoch.
    pub avg_per_epoch: f64,
    /// `std` (the mean absolute deviation), requests per epoch.
    pub std_per_epoch: f64,
    /// Requests counted in that epoch.
    pub requests: u64,
}

/// One replica's contribution to an epoch, as the leader sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplicaCount {
    /// Its count for the epoch being summed, if it arrived.
    pub count: Option<u64>,
    /// Its latest count of an earlier epoch: `(epoch, requests)`.
    pub last: Option<(u64, u64)>,
}

/// An epoch's total over the replicas.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Aggregate {
    /// Sum of the counts (reported and imputed).
    pub requests: u64,
    /// Replicas whose count was imputed from their last one.
    pub imputed: u32,
    /// Replicas that contributed (reported or imputed).
    pub replicas: u32,
}

/// Sum the replicas' counts for `epoch`. A replica without a count for it is imputed
/// from its last count when that is at most `impute_epochs` epochs old (a replica that
/// missed one epoch's write still carries its load); an older one contributes nothing
/// (it is gone, or cut off: its traffic went elsewhere).
pub fn aggregate(epoch: u64, replicas: &[ReplicaCount], impute_epochs: u64) -> Aggregate {
    let mut out = Aggregate {
        requests: 0,
        imputed: 0,
        replicas: 0,
    };
    for r in replicas {
        match (r.count, r.last) {
            (Some(n), _) => {
                out.requests += n;
                out.replicas += 1;
            }
            (None, Some((at, n))) if at < epoch && epoch - at <= impute_epochs => {
                out.requests += n;
                out.imputed += 1;
                out.replicas += 1;
            }
            _ => {}
        }
    }
    out
}

/// Epochs over which the leader averages each replica's count for its budget share
/// ([`ShareDemands`]; the coordinator and the simulator's replicas use it): long enough
/// to smooth a small replica's one-request jitter, short enough that a load moving
/// between replicas moves its budget within 4 epochs.
pub const SHARE_WINDOW_EPOCHS: u64 = 4;

/// Each replica's demand for [`budget_shares`]: the mean of its counts over the last
/// `window_epochs` epochs it reported, requests per epoch.
///
/// A share proportional to one epoch's count alone follows a small replica's jitter
/// backwards: a replica with 0.8 requests per epoch counts 1, 1, 1, 1, 0, and after the
/// epoch of 0 its share is 0, so its next request spills although one gateway at the same
/// total load would have admitted it; after an epoch of 1 its share exceeds what it then
/// receives, and the budget is lost (only fractions carry in
/// [`EpochQuota`](super::balancer::EpochQuota)). The mean over a few epochs keeps the
/// small replica's share at its real part of the traffic. A load that moves between
/// replicas moves its budget within `window_epochs` epochs.
#[derive(Clone, Debug)]
pub struct ShareDemands {
    window_epochs: u64,
    /// Replica → its `(epoch, requests)` inside the window, oldest first.
    seen: BTreeMap<String, VecDeque<(u64, u64)>>,
}

impl ShareDemands {
    /// A window of `window_epochs` epochs (at least 1; 1 is the last count alone).
    pub fn new(window_epochs: u64) -> Self {
        Self {
            window_epochs: window_epochs.max(1),
            seen: BTreeMap::new(),
        }
    }

    /// Record each live replica's count for `epoch` (`(replica, requests)`; a second
    /// count for the same epoch replaces the first) and return each one's mean over the
    /// window, in the order of `live`. A replica not in `live` is forgotten; one new to
    /// the window is averaged over the epochs it has.
    pub fn demands(&mut self, epoch: u64, live: &[(String, u64)]) -> Vec<f64> {
        self.seen
            .retain(|name, _| live.iter().any(|(live_name, _)| live_name == name));
        let oldest = epoch.saturating_add(1).saturating_sub(self.window_epochs);
        live.iter()
            .map(|(name, requests)| {
                let counts = self.seen.entry(name.clone()).or_default();
                counts.retain(|&(e, _)| e >= oldest && e != epoch);
                let at = counts.partition_point(|&(e, _)| e < epoch);
                counts.insert(at, (epoch, *requests));
                let sum: u64 = counts.iter().map(|&(_, n)| n).sum();
                sum as f64 / counts.len() as f64
            })
            .collect()
    }
}

/// Each replica's share of the VM budget (the shares sum to 1; empty for no replica).
///
/// `budget` is what the VMs admit in an epoch (ρ·vm_reqs·E requests) and `demands` each
/// replica's requests per epoch (its recent mean: [`ShareDemands`]; negative or NaN
/// counts as 0). While the budget does not cover the demands (the usual
/// case: ρ < 1) the shares are proportional to the demands, so every replica spills the
/// same fraction of its traffic, as one gateway at the same total load would, and a
/// load that moves between replicas moves its budget along. A budget above the demands
/// leaves a surplus, divided max-min fairly: the smallest allocations are raised first
/// to a common level (water-filling with the demands as floors), so an idle replica gets
/// room for a burst before a busy one gets more than it asked. Equal shares when no
/// replica had traffic; proportional ones when the budget is zero or not finite.
pub fn budget_shares(budget: f64, demands: &[f64]) -> Vec<f64> {
    let n = demands.len();
    if n == 0 {
        return Vec::new();
    }
    // A negative or NaN demand is no demand.
    let demands: Vec<f64> = demands
        .iter()
        .map(|&d| if d > 0.0 { d } else { 0.0 })
        .collect();
    let total: f64 = demands.iter().sum();
    if total <= 0.0 || !total.is_finite() {
        return vec![1.0 / n as f64; n];
    }
    if !(budget.is_finite() && budget > total) {
        return demands.iter().map(|&d| d / total).collect();
    }
    // The level L with Σ max(d_i, L) = budget: the k smallest demands are raised to L.
    let mut sorted = demands.clone();
    sorted.sort_by(f64::total_cmp);
    let mut above: f64 = sorted.iter().sum();
    let mut level = budget / n as f64;
    for k in 1..=n {
        above -= sorted[k - 1];
        let l = (budget - above) / k as f64;
        if k == n || l <= sorted[k] {
            level = l;
            break;
        }
    }
    demands.iter().map(|&d| d.max(level) / budget).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn live(counts: &[(&str, u64)]) -> Vec<(String, u64)> {
        counts.iter().map(|&(n, c)| (n.to_string(), c)).collect()
    }

    #[test]
    fn a_small_replicas_share_follows_its_mean_not_its_last_epoch() {
        let mut w = ShareDemands::new(4);
        // Replica c's 0.75 requests per epoch arrive as 1, 1, 0, 1.
        let pattern = [1, 1, 0, 1];
        let mut last = Vec::new();
        for (e, &c) in pattern.iter().enumerate() {
            last = w.demands(e as u64 + 10, &live(&[("a", 7), ("b", 2), ("c", c)]));
        }
        assert_eq!(last, vec![7.0, 2.0, 0.75]);
        // The epoch of 0 does not take c's share away.
        let mut w = ShareDemands::new(4);
        w.demands(1, &live(&[("a", 7), ("c", 1)]));
        let d = w.demands(2, &live(&[("a", 9), ("c", 0)]));
        assert_eq!(d, vec![8.0, 0.5]);
        let s = budget_shares(6.0, &d);
        assert!(s[1] > 0.05, "{s:?}");
    }

    #[test]
    fn the_window_forgets_old_epochs_and_gone_replicas() {
        let mut w = ShareDemands::new(3);
        for e in 0..5 {
            w.demands(e, &live(&[("a", e * 10), ("b", 4)]));
        }
        // a: epochs 2, 3, 4 → 20, 30, 40.
        assert_eq!(w.demands(4, &live(&[("a", 40), ("b", 4)])), vec![30.0, 4.0]);
        // b left; when it comes back it starts afresh.
        w.demands(5, &live(&[("a", 50)]));
        assert_eq!(w.demands(6, &live(&[("a", 60), ("b", 9)])), vec![50.0, 9.0]);
        // A repeated epoch replaces its count; a window of 0 is a window of 1.
        let mut one = ShareDemands::new(0);
        one.demands(1, &live(&[("a", 5)]));
        assert_eq!(one.demands(1, &live(&[("a", 3)])), vec![3.0]);
        assert_eq!(one.demands(2, &live(&[("a", 8)])), vec![8.0]);
    }

    fn close(a: &[f64], b: &[f64]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-12)
    }

    #[test]
    fn a_replica_that_missed_an_epoch_carries_its_last_count() {
        let rs = [
            ReplicaCount {
                count: Some(70),
                last: Some((9, 60)),
            },
            ReplicaCount {
                count: None,
                last: Some((9, 20)),
            },
            // Silent for 3 epochs: gone, not imputed with a window of 2.
            ReplicaCount {
                count: None,
                last: Some((7, 10)),
            },
            ReplicaCount {
                count: None,
                last: None,
            },
        ];
        let a = aggregate(10, &rs, 2);
        assert_eq!(
            a,
            Aggregate {
                requests: 90,
                imputed: 1,
                replicas: 2
            }
        );
        // A window of 3 takes the third one too; of 0 none.
        assert_eq!(aggregate(10, &rs, 3).requests, 100);
        assert_eq!(aggregate(10, &rs, 3).imputed, 2);
        assert_eq!(aggregate(10, &rs, 0).requests, 70);
        // A "last" count of the same or a later epoch is not an older count.
        let same = [ReplicaCount {
            count: None,
            last: Some((10, 5)),
        }];
        assert_eq!(aggregate(10, &same, 2).requests, 0);
    }

    #[test]
    fn a_rationed_budget_is_shared_in_proportion_to_the_traffic() {
        // 70/20/10 under a budget of 80: each replica spills a fifth, like one gateway.
        let s = budget_shares(80.0, &[70.0, 20.0, 10.0]);
        assert!(close(&s, &[0.7, 0.2, 0.1]), "{s:?}");
        let s = budget_shares(100.0, &[10.0, 30.0, 60.0]);
        assert!(close(&s, &[0.1, 0.3, 0.6]), "{s:?}");
    }

    #[test]
    fn a_surplus_raises_the_smallest_allocations_first() {
        // Demands 30 + 10 under a budget of 60: the small one is raised to 30 first.
        let s = budget_shares(60.0, &[30.0, 10.0]);
        assert!(close(&s, &[0.5, 0.5]), "{s:?}");
        // 5, 100, 40 under 200: the two small ones rise to 50, the big one keeps 100.
        let s = budget_shares(200.0, &[5.0, 100.0, 40.0]);
        assert!(close(&s, &[0.25, 0.5, 0.25]), "{s:?}");
        // Order does not matter; a surplus over every demand is split level.
        let s = budget_shares(200.0, &[100.0, 40.0, 5.0]);
        assert!(close(&s, &[0.5, 0.25, 0.25]), "{s:?}");
        let s = budget_shares(400.0, &[100.0, 40.0, 5.0]);
        assert!(close(&s, &[1.0 / 3.0; 3]), "{s:?}");
        // Exactly the demands: no surplus, proportional.
        let s = budget_shares(40.0, &[30.0, 10.0]);
        assert!(close(&s, &[0.75, 0.25]), "{s:?}");
        // Just above: the small one takes the surplus.
        let s = budget_shares(41.0, &[30.0, 10.0]);
        assert!(close(&s, &[30.0 / 41.0, 11.0 / 41.0]), "{s:?}");
        let sum: f64 = budget_shares(123.0, &[7.0, 50.0, 1.0, 0.0]).iter().sum();
        assert!((sum - 1.0).abs() < 1e-12);
    }

    #[test]
    fn no_traffic_or_no_budget() {
        assert!(budget_shares(10.0, &[]).is_empty());
        assert!(close(
            &budget_shares(10.0, &[0.0, 0.0, 0.0, 0.0]),
            &[0.25; 4]
        ));
        assert!(close(&budget_shares(0.0, &[0.0, 0.0]), &[0.5, 0.5]));
        // A surplus over one idle replica and one busy one.
        assert!(close(&budget_shares(10.0, &[0.0, 4.0]), &[0.5, 0.5]));
        // No (or an unlimited) budget: shares follow the traffic.
        assert!(close(&budget_shares(0.0, &[30.0, 10.0]), &[0.75, 0.25]));
        assert!(close(
            &budget_shares(f64::INFINITY, &[10.0, 30.0]),
            &[0.25, 0.75]
        ));
        assert!(close(&budget_shares(-1.0, &[10.0, 30.0]), &[0.25, 0.75]));
    }
}
