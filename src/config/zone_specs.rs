//! What the gateway and the simulator get of the zones (`function_zones:` and
//! `function_tier:`): [`ZoneSpec`]s in placement order, FaaSim's placement parameters,
//! the live cost meter, and the checks of the zones against the rest of the file.

use super::function_tier::FunctionTierConfig;
use super::issues::{Issues, aws_feature_missing};
use super::schema::{Config, VmPoolConfig};
use super::zones::{SINGLE_ZONE_NAME, ZoneKindConfig, ZoneSpec};
use crate::policy::placement::{MAX_ZONES, PlacementParams, ZoneKind, ZoneParams};

impl Config {
    /// What `spillway serve` needs of every zone (`function_zones` and `function_tier`)
    /// beyond [`Config::validate`]: a command for a `process` provider, the `aws` feature
    /// for a `lambda` one.
    pub(crate) fn zone_gateway_issues(&self, is: &mut Issues) {
        for z in self.zone_specs() {
            if let FunctionTierConfig::Process(p) = &z.tier
                && p.command.is_none()
            {
                is.push(
                    format!("{}.command", z.at),
                    "missing: `spillway serve` runs a process zone's instances with it (only the simulator does without)",
                );
            }
            if matches!(z.tier, FunctionTierConfig::Lambda(_)) && !cfg!(feature = "aws") {
                is.push(format!("{}.type", z.at), aws_feature_missing("lambda"));
            }
        }
    }

    /// Every function zone in placement order: the `function_zones`, then `function_tier`
    /// as a cloud zone named [`SINGLE_ZONE_NAME`]. Empty: no function tier at all.
    pub fn zone_specs(&self) -> Vec<ZoneSpec> {
        let mut out: Vec<ZoneSpec> = self
            .function_zones
            .iter()
            .enumerate()
            .map(|(i, z)| ZoneSpec {
                name: z.name.clone(),
                kind: z.kind.into(),
                client_cidrs: z.client_cidrs.clone(),
                at: format!("function_zones[{i}]"),
                tier: z.provider.clone(),
            })
            .collect();
        if let Some(ft) = &self.function_tier {
            out.push(ZoneSpec {
                name: SINGLE_ZONE_NAME.to_string(),
                kind: ZoneKind::Cloud,
                client_cidrs: Vec::new(),
                at: "function_tier".to_string(),
                tier: ft.clone(),
            });
        }
        out
    }

    /// The live cost meter for this configuration: `pricing`'s prices, r_max for the
    /// all-VM counterfactual, and one zone per [`Self::zone_specs`] entry with its
    /// pre-warmed instances (process zones' `prewarmed_instances`, Lambda's provisioned
    /// concurrency) as provisioned concurrency.
    pub fn cost_meter(&self) -> crate::policy::cost::CostMeter {
        let zones = self
            .zone_specs()
            .into_iter()
            .map(|z| crate::policy::cost::MeterZone {
                provisioned_instances: z.tier.provisioned_instances(),
                name: z.name,
            })
            .collect();
        crate::policy::cost::CostMeter::new(self.pricing.meter_pricing(self.libra.r_max_rps), zones)
    }

    /// The instance type the live bill prices the pool's VMs at: the EC2 pool's
    /// `instance_type` (`launch_template` when the template sets it), `process` or
    /// `static` otherwise.
    pub fn vm_instance_type(&self) -> String {
        match &self.vm_pool {
            Some(VmPoolConfig::Ec2(e)) => e
                .instance_type
                .clone()
                .unwrap_or_else(|| "launch_template".to_string()),
            Some(VmPoolConfig::Static(_)) => "static".to_string(),
            Some(VmPoolConfig::Process(_)) | None => "process".to_string(),
        }
    }

    /// Function placement (FaaSim): one zone per [`Self::zone_specs`] entry, with
    /// `placement:`'s policy.
    pub fn placement_params(&self) -> PlacementParams {
        PlacementParams {
            zones: self
                .zone_specs()
                .into_iter()
                .map(|z| ZoneParams {
                    capacity: z.tier.capacity(),
                    name: z.name,
                    kind: z.kind,
                })
                .collect(),
            policy: self.placement.into(),
        }
    }

    /// Checks of `function_zones` and `gateway.origin_zone_header`: each provider's keys
    /// (as under `function_tier`), unique non-empty names, at most one cloud zone
    /// (counting `function_tier`), client networks only on edge zones, at most
    /// [`MAX_ZONES`] zones, and an origin header only with trusted proxies.
    pub(crate) fn validate_zones(&self, is: &mut Issues) {
        let mut cloud: Option<String> = self
            .function_tier
            .as_ref()
            .map(|_| "function_tier".to_string());
        for (i, z) in self.function_zones.iter().enumerate() {
            let at = format!("function_zones[{i}]");
            let name = z.name.as_str();
            if name.trim().is_empty() || name.trim() != name {
                is.push(
                    format!("{at}.name"),
                    format!("must be a non-empty name without surrounding spaces, got {name:?}"),
                );
            } else if name == SINGLE_ZONE_NAME && self.function_tier.is_some() {
                is.push(
                    format!("{at}.name"),
                    format!("`{SINGLE_ZONE_NAME}` is the name of the zone function_tier becomes"),
                );
            } else if let Some(j) = self.function_zones[..i].iter().position(|o| o.name == name) {
                is.push(
                    format!("{at}.name"),
                    format!("duplicate zone name {name:?} (also function_zones[{j}])"),
                );
            }
            match z.kind {
                ZoneKindConfig::Cloud => {
                    if let Some(first) = &cloud {
                        is.push(
                            format!("{at}.kind"),
                            format!("more than one cloud zone (the first is {first})"),
                        );
                    } else {
                        cloud = Some(at.clone());
                    }
                    if !z.client_cidrs.is_empty() {
                        is.push(
                            format!("{at}.client_cidrs"),
                            "only edge zones have clients of their own; a request with no edge zone goes to the cloud",
                        );
                    }
                }
                ZoneKindConfig::Edge => {}
            }
            z.provider.validate_at(&at, &self.provider_context(), is);
        }
        if !self.sim.placements.is_empty() && self.function_zones.is_empty() {
            is.push(
                "sim.placements",
                "needs function_zones (placement is between edge and cloud zones)",
            );
        }
        let n = self.function_zones.len() + usize::from(self.function_tier.is_some());
        if n > MAX_ZONES {
            is.push(
                "function_zones",
                format!("at most {MAX_ZONES} zones, got {n}"),
            );
        }
        if let Some(h) = &self.gateway.origin_zone_header {
            if http::HeaderName::from_bytes(h.as_bytes()).is_err() {
                is.push(
                    "gateway.origin_zone_header",
                    format!("not a header name: {h:?}"),
                );
            } else if self.gateway.trusted_proxies.is_empty() {
                is.push(
                    "gateway.origin_zone_header",
                    "is honoured only from gateway.trusted_proxies, which is empty",
                );
            }
        }
    }
}
