//! The simulator's physical models: service-time distributions and VM billing.
//!
//! The VM and function *behaviour* (slots and FIFO queues, cold/warm starts) lives in the
//! [engine](super::engine); the function instance life cycle is the policy core's
//! [`FunctionPool`](crate::policy::functions::FunctionPool) (FaaSim §3).

use rand::Rng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, LogNormal, Normal};

use crate::config::sim::{ServiceTimeConfig, VmBilling, VmModelConfig, check_percentiles};
use crate::policy::cost::VmBillingRule;

/// A service-time distribution, sampled in nanoseconds (at least 1 µs).
#[derive(Clone, Debug)]
pub enum ServiceModel {
    /// Always this many ns.
    Fixed(u64),
    /// Normal (mean, std in ns), truncated at 1 µs.
    Normal(Normal<f64>),
    /// Log-normal parameterised by the service time's own mean and std.
    LogNormal(LogNormal<f64>),
    /// Piecewise-linear inverse CDF through `(quantile 0–1, ns)` points.
    Empirical(Vec<(f64, f64)>),
}

const MIN_NS: f64 = 1_000.0;

impl ServiceModel {
    /// The model a `sim.request.service_time` section describes.
    ///
    /// # Errors
    /// A message if the parameters are out of range (config validation catches these
    /// first).
    pub fn from_config(c: &ServiceTimeConfig) -> Result<Self, String> {
        match c {
            ServiceTimeConfig::Fixed { ms } => {
                Ok(Self::Fixed((ms * 1e6).round().max(MIN_NS) as u64))
            }
            ServiceTimeConfig::Normal { mean_ms, std_ms } => {
                Normal::new(mean_ms * 1e6, std_ms * 1e6)
                    .map(Self::Normal)
                    .map_err(|e| e.to_string())
            }
            ServiceTimeConfig::Lognormal { mean_ms, std_ms } => {
                // σ² = ln(1 + s²/m²), μ = ln m − σ²/2 (mean and std of the time itself).
                let m = mean_ms * 1e6;
                let s = std_ms * 1e6;
                let var = (1.0 + (s * s) / (m * m)).ln();
                LogNormal::new(m.ln() - var / 2.0, var.sqrt())
                    .map(Self::LogNormal)
                    .map_err(|e| e.to_string())
            }
            ServiceTimeConfig::Empirical { percentiles } => Self::empirical(percentiles),
        }
    }

    /// Empirical model through `[percentile 0–100, ms]` points.
    ///
    /// # Errors
    /// A message if the points are not valid (see `sim.request.service_time`).
    pub fn empirical(points: &[[f64; 2]]) -> Result<Self, String> {
        check_percentiles(points)?;
        Ok(Self::Empirical(
            points.iter().map(|p| (p[0] / 100.0, p[1] * 1e6)).collect(),
        ))
    }

    /// Whether sampling draws from the RNG.
    pub fn is_random(&self) -> bool {
        !matches!(self, Self::Fixed(_))
    }

    /// One service time, ns.
    #[inline]
    pub fn sample(&self, rng: &mut ChaCha8Rng) -> u64 {
        let ns = match self {
            Self::Fixed(ns) => return *ns,
            Self::Normal(d) => d.sample(rng),
            Self::LogNormal(d) => d.sample(rng),
            Self::Empirical(points) => {
                let u: f64 = rng.random();
                let i = points
                    .partition_point(|p| p.0 <= u)
                    .clamp(1, points.len() - 1);
                let (q0, t0) = points[i - 1];
                let (q1, t1) = points[i];
                if q1 > q0 {
                    t0 + (t1 - t0) * ((u - q0) / (q1 - q0)).clamp(0.0, 1.0)
                } else {
                    t1
                }
            }
        };
        ns.round().max(MIN_NS) as u64
    }
}

/// Billed seconds of one VM — EC2 on-demand rules as configured in `sim.vm`.
///
/// `launch_s`/`ready_s`/`stop_s` are seconds on the simulation clock; `ready_s` is `None`
/// when the VM was stopped while booting. Per second: whole seconds, rounded up, at least
/// `minimum_billed_seconds`; per hour: started hours. With `bill_boot = false` billing
/// starts when the VM is ready (a VM that never got ready costs nothing).
pub fn vm_billed_seconds(
    cfg: &VmModelConfig,
    launch_s: f64,
    ready_s: Option<f64>,
    stop_s: f64,
) -> f64 {
    let start = if cfg.bill_boot {
        launch_s
    } else {
        match ready_s {
            Some(r) => r,
            None => return 0.0,
        }
    };
    // The live gateway's rule ([`VmBillingRule`], which also drops float noise such as
    // 100.00000000001 s before rounding up).
    let rule = match cfg.billing {
        VmBilling::PerSecond => VmBillingRule {
            granularity: std::time::Duration::from_secs(1),
            minimum: cfg.minimum_billed_seconds.get(),
        },
        VmBilling::PerHour => VmBillingRule {
            granularity: std::time::Duration::from_secs(3600),
            minimum: std::time::Duration::from_secs(3600),
        },
    };
    rule.billed_seconds(stop_s - start)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn billing_rules() {
        let mut c = VmModelConfig::default();
        assert_eq!(
            vm_billed_seconds(&c, 0.0, Some(100.0), 30.5),
            60.0,
            "60 s minimum"
        );
        assert_eq!(vm_billed_seconds(&c, 0.0, Some(100.0), 130.2), 131.0);
        c.bill_boot = false;
        assert_eq!(vm_billed_seconds(&c, 0.0, Some(100.0), 230.0), 130.0);
        assert_eq!(vm_billed_seconds(&c, 0.0, None, 50.0), 0.0);
        c.billing = VmBilling::PerHour;
        assert_eq!(vm_billed_seconds(&c, 0.0, Some(100.0), 3700.0), 3600.0);
        assert_eq!(vm_billed_seconds(&c, 0.0, Some(100.0), 3701.0), 7200.0);
    }

    #[test]
    fn empirical_sampling_stays_within_the_points() {
        let m = ServiceModel::empirical(&[[0.0, 10.0], [50.0, 20.0], [100.0, 100.0]]).unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let xs: Vec<u64> = (0..10_000).map(|_| m.sample(&mut rng)).collect();
        assert!(xs.iter().all(|&x| (10_000_000..=100_000_000).contains(&x)));
        let below = xs.iter().filter(|&&x| x <= 20_000_000).count();
        assert!((4_500..5_500).contains(&below), "{below}");
    }

    #[test]
    fn lognormal_has_the_configured_mean() {
        let m = ServiceModel::from_config(&ServiceTimeConfig::Lognormal {
            mean_ms: 100.0,
            std_ms: 50.0,
        })
        .unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let mean = (0..100_000).map(|_| m.sample(&mut rng) as f64).sum::<f64>() / 1e5 / 1e6;
        assert!((mean - 100.0).abs() < 2.0, "{mean}");
    }
}
