//! The gateway's running bill: a [`CostMeter`] fed with every arrival, VM call and
//! function call and every VM's running time (LIBRA §II cost model: VM-seconds at the
//! instance type's price, function GB-seconds and request fees), read by `/status`
//! `cost` and the `spillway_cost_*` metrics.
//!
//! Its own lock, apart from the policy core's: billing never decides anything.

use parking_lot::Mutex;

use crate::policy::Time;
use crate::policy::cost::{Bill, CostMeter, MeterPricing};

/// The running bill and the instance type of the pool's VMs, once a meter is set.
#[derive(Debug, Default)]
pub struct Billing {
    meter: Mutex<Option<(CostMeter, String)>>,
}

impl Billing {
    /// Bill with `meter` from now on, pricing the VMs as `instance_type`. Replaces a
    /// meter set before.
    pub fn set_meter(&self, meter: CostMeter, instance_type: String) {
        *self.meter.lock() = Some((meter, instance_type));
    }

    /// New prices for the running bill (a configuration reload); nothing without a meter.
    pub fn set_pricing(&self, pricing: MeterPricing) {
        if let Some((m, _)) = self.meter.lock().as_mut() {
            m.set_pricing(pricing);
        }
    }

    /// Feed the meter (when set) at policy time `now`: `f` gets the meter, the VMs'
    /// instance type and `now`.
    pub(super) fn bill(&self, now: Time, f: impl FnOnce(&mut CostMeter, &str, Time)) {
        if let Some((m, t)) = self.meter.lock().as_mut() {
            f(m, t, now);
        }
    }

    /// The bills since start and of the last hour at policy time `now`; `None` without a
    /// meter.
    pub fn bills(&self, now: Time) -> Option<(Bill, Bill)> {
        self.meter
            .lock()
            .as_ref()
            .map(|(m, _)| (m.since_start(now), m.last_hour(now)))
    }
}
