//! `spillway cost`: LIBRA §II's cost equations over a range of request rates and the
//! cost-indifference point (CIP), from [`crate::policy::cost`] (summary: docs/src/design/papers.md).
//!
//! ```text
//! FaaS-only:  N · c_req                         (c_req = GB-s · price + request fee [+ API gateway fee])
//! IaaS-only:  ceil(N / r_max) · C_vm
//! hybrid:     floor(N / r_max) · C_vm + min(rest · c_req, C_vm)
//! CIP:        C_vm / c_req  (when ≤ r_max)
//! ```
//! Costs are reported per hour of sustained load, USD.

use serde::Serialize;

use crate::policy::cost::{self, FunctionPricing};

/// The function and VM a cost report compares.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CostInputs {
    /// VM price, USD per hour.
    pub vm_hourly_usd: f64,
    /// r_max: requests/s one VM serves within the SLA.
    pub r_max_rps: f64,
    /// Function memory, MB.
    pub memory_mb: u32,
    /// Function execution time, ms (billed at 1 ms granularity).
    pub duration_ms: crate::config::Millis,
    /// `x86_64` or `arm64` (informational; the price is in `gb_second_usd`).
    pub architecture: String,
    /// USD per GB-second.
    pub gb_second_usd: f64,
    /// USD per invocation.
    pub request_usd: f64,
    /// API-gateway fee per request, USD (0 without a gateway).
    pub api_gateway_request_usd: f64,
}

/// Costs of serving one rate for an hour, USD (LIBRA §II, Fig. 1b/1d).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CostRow {
    /// Sustained request rate, requests/s.
    pub rate_rps: f64,
    /// Everything on functions, USD per hour.
    pub faas_usd_per_hour: f64,
    /// Everything on VMs, USD per hour.
    pub iaas_usd_per_hour: f64,
    /// LIBRA's split: full VMs plus functions for the rest, USD per hour.
    pub hybrid_usd_per_hour: f64,
}

/// The `spillway cost` result; `--json` prints it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CostReport {
    /// The cost-indifference point, requests/s (`null` in JSON when functions are always
    /// cheaper).
    pub cip_rps: Option<f64>,
    /// Cost of one function call, USD.
    pub cost_per_request_usd: f64,
    /// The CIP a gateway with this configuration releases VMs at, requests/s: the config's
    /// `libra.cip_rps` when it sets one, else `cip_rps` (`null` when there is none).
    pub cip_in_force_rps: Option<f64>,
    /// Where `cip_in_force_rps` comes from: `"libra.cip_rps"` or `"computed"`.
    pub cip_source: &'static str,
    /// What was compared.
    pub inputs: CostInputs,
    /// Costs over the rate range.
    pub rows: Vec<CostRow>,
}

impl CostInputs {
    /// Cost of one call, USD.
    pub fn cost_per_request(&self) -> f64 {
        FunctionPricing {
            gb_second_usd: self.gb_second_usd,
            request_usd: self.request_usd,
            api_gateway_request_usd: self.api_gateway_request_usd,
        }
        .cost_per_request(self.memory_mb, self.duration_ms.get())
    }
}

impl CostReport {
    /// The configuration fixes the CIP (`libra.cip_rps`): that one is in force.
    pub fn with_configured_cip(mut self, cip_rps: Option<f64>) -> Self {
        if let Some(c) = cip_rps {
            self.cip_in_force_rps = Some(c);
            self.cip_source = "libra.cip_rps";
        }
        self
    }
}

/// Compute the CIP and the cost table for `rates` (requests/s).
pub fn cost_report(inputs: CostInputs, rates: impl IntoIterator<Item = f64>) -> CostReport {
    let c = inputs.cost_per_request();
    let cip = cost::cost_indifference_point_rps(c, inputs.r_max_rps, inputs.vm_hourly_usd);
    let rows = rates
        .into_iter()
        .map(|n| CostRow {
            rate_rps: n,
            faas_usd_per_hour: cost::faas_cost_per_second(n, c) * 3600.0,
            iaas_usd_per_hour: cost::iaas_cost_per_second(
                n,
                inputs.r_max_rps,
                inputs.vm_hourly_usd,
            ) * 3600.0,
            hybrid_usd_per_hour: cost::hybrid_cost_per_second(
                n,
                inputs.r_max_rps,
                inputs.vm_hourly_usd,
                c,
            ) * 3600.0,
        })
        .collect();
    CostReport {
        cip_rps: cip.is_finite().then_some(cip),
        cost_per_request_usd: c,
        cip_in_force_rps: cip.is_finite().then_some(cip),
        cip_source: "computed",
        inputs,
        rows,
    }
}

/// The report as text: the CIP line and the table.
pub fn cost_text(r: &CostReport) -> String {
    use std::fmt::Write as _;
    let i = &r.inputs;
    let mut out = String::new();
    let gw = if i.api_gateway_request_usd > 0.0 {
        format!(
            "API gateway ${:.2}/M requests",
            i.api_gateway_request_usd * 1e6
        )
    } else {
        "no API gateway".to_string()
    };
    let _ = writeln!(
        out,
        "function: {} MB x {} ms on {} = ${:.10} per request ({gw})",
        i.memory_mb, i.duration_ms, i.architecture, r.cost_per_request_usd
    );
    let _ = writeln!(
        out,
        "VM: ${}/h, r_max {} req/s",
        i.vm_hourly_usd, i.r_max_rps
    );
    match r.cip_rps {
        Some(cip) => {
            let _ = writeln!(
                out,
                "cost-indifference point: {cip:.3} req/s (functions are cheaper below it, a VM above it)"
            );
        }
        None => {
            let _ = writeln!(
                out,
                "cost-indifference point: none (one VM costs more than r_max requests/s on functions)"
            );
        }
    }
    if r.cip_source == "libra.cip_rps"
        && let Some(c) = r.cip_in_force_rps
    {
        let _ = writeln!(
            out,
            "CIP in force: {c} req/s, set by libra.cip_rps in the config (it replaces the computed one)"
        );
    }
    let _ = writeln!(
        out,
        "\n{:>10} {:>14} {:>14} {:>14}",
        "rate_rps", "faas_usd_h", "iaas_usd_h", "hybrid_usd_h"
    );
    for row in &r.rows {
        let _ = writeln!(
            out,
            "{:>10} {:>14.4} {:>14.4} {:>14.4}",
            row.rate_rps, row.faas_usd_per_hour, row.iaas_usd_per_hour, row.hybrid_usd_per_hour
        );
    }
    out
}
