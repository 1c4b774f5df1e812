//! Cost model and cost-indifference point — LIBRA §II (summary: docs/src/design/papers.md).
//!
//! ```text
//! FaaS:  cost_faas(N) = N · (t_f(m) · C_faas(m) + fee_request) + G_faas
//! IaaS:  cost_iaas(N) = ceil(N / r_max) · C_vm
//! CIP:   the rate N at which both are equal (below it functions are cheaper)
//! ```
//!
//! Prices are in US dollars; rates in requests/s; durations billed at 1 ms granularity
//! as AWS Lambda does. The dated defaults (`DEFAULT_*`) are AWS us-east-1 list prices as
//! of 2025 and are overridable in the `pricing` config section.

use std::time::Duration;

/// Lambda x86_64 compute price, USD per GB-second (AWS list price, 2025).
pub const DEFAULT_LAMBDA_X86_GB_SECOND_USD: f64 = 0.000_016_666_7;
/// Lambda arm64 compute price, USD per GB-second (AWS list price, 2025).
pub const DEFAULT_LAMBDA_ARM64_GB_SECOND_USD: f64 = 0.000_013_333_4;
/// Lambda request fee, USD per request ($0.20 per million, 2025).
pub const DEFAULT_LAMBDA_REQUEST_USD: f64 = 0.000_000_2;
/// API Gateway HTTP API fee, USD per request ($1.00 per million, 2025). Charged only when
/// the config says the functions sit behind an API gateway.
pub const DEFAULT_API_GATEWAY_REQUEST_USD: f64 = 0.000_001;
/// EC2 on-demand t3.medium, USD per hour (us-east-1, 2025).
pub const DEFAULT_T3_MEDIUM_HOURLY_USD: f64 = 0.0416;
/// EC2 on-demand m4.large, USD per hour (us-east-1, 2025).
pub const DEFAULT_M4_LARGE_HOURLY_USD: f64 = 0.10;
/// Lambda's billing granularity for duration.
pub const LAMBDA_BILLING_GRANULARITY: Duration = Duration::from_millis(1);

/// CPU architecture of a function, which sets its GB-second price.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Architecture {
    /// x86_64.
    X86_64,
    /// arm64 (Graviton).
    Arm64,
}

impl Architecture {
    /// The default GB-second price for this architecture.
    pub fn default_gb_second_usd(self) -> f64 {
        match self {
            Architecture::X86_64 => DEFAULT_LAMBDA_X86_GB_SECOND_USD,
            Architecture::Arm64 => DEFAULT_LAMBDA_ARM64_GB_SECOND_USD,
        }
    }
}

/// Function-tier prices.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FunctionPricing {
    /// USD per GB-second of billed duration.
    pub gb_second_usd: f64,
    /// USD per invocation.
    pub request_usd: f64,
    /// USD per request charged by an API gateway in front of the function; 0 when spillway
    /// invokes the function directly (the default).
    pub api_gateway_request_usd: f64,
}

impl FunctionPricing {
    /// AWS Lambda list prices for `arch`, no API gateway.
    pub fn lambda(arch: Architecture) -> Self {
        Self {
            gb_second_usd: arch.default_gb_second_usd(),
            request_usd: DEFAULT_LAMBDA_REQUEST_USD,
            api_gateway_request_usd: 0.0,
        }
    }

    /// Billed GB-seconds of one call of `duration` with `memory_mb` (duration rounded up
    /// to 1 ms; 1 GB = 1024 MB as AWS bills).
    pub fn gb_seconds(memory_mb: u32, duration: Duration) -> f64 {
        let ms = duration.as_nanos().div_ceil(1_000_000) as f64;
        f64::from(memory_mb) / 1024.0 * ms / 1000.0
    }

    /// Cost of one call, USD: compute + request fee + API-gateway fee.
    pub fn cost_per_request(&self, memory_mb: u32, duration: Duration) -> f64 {
        Self::gb_seconds(memory_mb, duration) * self.gb_second_usd
            + self.request_usd
            + self.api_gateway_request_usd
    }
}

/// FaaS cost per second of serving `rate_rps` requests/s entirely on functions, USD/s.
pub fn faas_cost_per_second(rate_rps: f64, cost_per_request: f64) -> f64 {
    rate_rps * cost_per_request
}

/// IaaS cost per second of serving `rate_rps` requests/s on VMs, USD/s:
/// `ceil(N / r_max) · C_vm`.
pub fn iaas_cost_per_second(rate_rps: f64, r_max_rps: f64, vm_hourly_usd: f64) -> f64 {
    (rate_rps / r_max_rps).ceil().max(0.0) * vm_hourly_usd / 3600.0
}

/// Hybrid cost per second (LIBRA's split): whole VMs for the part of the load that fills
/// them, functions for the remainder above the last full VM, USD/s.
pub fn hybrid_cost_per_second(
    rate_rps: f64,
    r_max_rps: f64,
    vm_hourly_usd: f64,
    cost_per_request: f64,
) -> f64 {
    let full_vms = (rate_rps / r_max_rps).floor().max(0.0);
    let rest = rate_rps - full_vms * r_max_rps;
    let vm = full_vms * vm_hourly_usd / 3600.0;
    vm + faas_cost_per_second(rest, cost_per_request).min(vm_hourly_usd / 3600.0)
}

/// The cost-indifference point, requests/s: the lowest rate at which serving on VMs
/// costs no more than serving on functions.
///
/// Within the first VM's capacity the IaaS cost is one VM's price, so
/// `CIP = C_vm / c_req` when that is at most `r_max`. If one VM costs more than
/// `r_max` requests' worth of function calls, functions are cheaper at every rate and
/// the result is `f64::INFINITY`.
pub fn cost_indifference_point_rps(
    cost_per_request: f64,
    r_max_rps: f64,
    vm_hourly_usd: f64,
) -> f64 {
    let cip = vm_hourly_usd / 3600.0 / cost_per_request;
    if cip <= r_max_rps { cip } else { f64::INFINITY }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn m4_large_vs_512mb_one_second_function_on_x86() {
        let p = FunctionPricing::lambda(Architecture::X86_64);
        let c = p.cost_per_request(512, Duration::from_secs(1));
        // 0.5 GB-s · 0.0000166667 + 0.0000002 = 0.00000853335 USD
        assert!((c - 0.000_008_533_35).abs() < 1e-15);
        let cip = cost_indifference_point_rps(c, 16.0, DEFAULT_M4_LARGE_HOURLY_USD);
        // 0.10 / 3600 / 0.00000853335 = 3.2552 req/s
        assert!((cip - 3.2552).abs() < 1e-3, "{cip}");
        // An API gateway fee makes each function call dearer, so the CIP drops.
        let gw = FunctionPricing {
            api_gateway_request_usd: DEFAULT_API_GATEWAY_REQUEST_USD,
            ..p
        };
        let cip_gw = cost_indifference_point_rps(
            gw.cost_per_request(512, Duration::from_secs(1)),
            16.0,
            DEFAULT_M4_LARGE_HOURLY_USD,
        );
        assert!((cip_gw - 2.9138).abs() < 1e-3, "{cip_gw}");
    }

    #[test]
    fn billing_rounds_duration_up_to_the_millisecond() {
        let gbs = FunctionPricing::gb_seconds(1024, Duration::from_micros(1_001));
        assert!((gbs - 0.002).abs() < 1e-12);
    }

    #[test]
    fn functions_always_cheaper_gives_infinite_cip() {
        let cip = cost_indifference_point_rps(1e-9, 16.0, 0.10);
        assert!(cip.is_infinite());
    }
}
