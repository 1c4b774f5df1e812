//! `function_zones:` and `placement:` — several function tiers, edge and cloud, and
//! FaaSim's placement between them (FaaSim, "two-tier edge/cloud"; papers.md §2).
//!
//! Each zone is a function tier provider (`type: process`, `http` or `lambda`, with that
//! provider's keys, as under `function_tier:`) plus its `name`, its `kind` (`edge` or `cloud`) and,
//! for edge zones, the `client_cidrs` whose requests originate there. `function_tier:`
//! keeps working: it is one more cloud zone named [`SINGLE_ZONE_NAME`], after the
//! `function_zones`.

use serde::{Deserialize, Serialize};

use super::lambda::{LambdaFunctionTierConfig, LambdaPayloadFormat};
use super::schema::{
    Config, FunctionTierConfig, HttpFunctionTierConfig, Issues, ProcessFunctionTierConfig,
    SINGLE_ZONE_NAME, default_function_boot_timeout, default_health_path, default_keep_alive,
    default_probe_interval,
};
use crate::policy::functions::WarmOrder;
use crate::policy::placement::{MAX_ZONES, PlacementParams, PlacementPolicy, ZoneKind, ZoneParams};

/// `placement:` — FaaSim's placement policy between edge and cloud zones.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PlacementConfig {
    /// Run on the request's edge zone while it has capacity (warm, else new), else in
    /// the cloud (warm, else new).
    #[default]
    EdgeFirst,
    /// Run where a warm instance exists (edge preferred); if none, start one on the
    /// edge if it has room, else in the cloud.
    WarmFirst,
}

impl From<PlacementConfig> for PlacementPolicy {
    fn from(p: PlacementConfig) -> Self {
        match p {
            PlacementConfig::EdgeFirst => PlacementPolicy::EdgeFirst,
            PlacementConfig::WarmFirst => PlacementPolicy::WarmFirst,
        }
    }
}

/// `function_zones[].kind`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ZoneKindConfig {
    /// Close to its clients, limited capacity.
    Edge,
    /// Far, practically unlimited; at most one.
    Cloud,
}

impl From<ZoneKindConfig> for ZoneKind {
    fn from(k: ZoneKindConfig) -> Self {
        match k {
            ZoneKindConfig::Edge => ZoneKind::Edge,
            ZoneKindConfig::Cloud => ZoneKind::Cloud,
        }
    }
}

/// One entry of `function_zones:`, written with `type:` like `function_tier`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", from = "FunctionZoneSection")]
pub enum FunctionZoneConfig {
    /// Local on-demand instances (child processes): keep-alive, pre-warm, max instances.
    Process(ProcessZoneConfig),
    /// An existing function endpoint: calls in flight against `max_concurrency`.
    Http(HttpZoneConfig),
    /// An AWS Lambda function (needs the `aws` feature to serve): calls in flight against
    /// `max_concurrency`.
    Lambda(LambdaZoneConfig),
}

/// How a `function_zones` entry is read (see `VmPoolSection`).
#[derive(Deserialize)]
#[serde(rename = "type", rename_all = "snake_case")]
#[doc(hidden)]
pub enum FunctionZoneSection {
    /// `type: process`.
    Process(ProcessZoneConfig),
    /// `type: http`.
    Http(HttpZoneConfig),
    /// `type: lambda`.
    Lambda(LambdaZoneConfig),
}

impl From<FunctionZoneSection> for FunctionZoneConfig {
    fn from(s: FunctionZoneSection) -> Self {
        match s {
            FunctionZoneSection::Process(p) => FunctionZoneConfig::Process(p),
            FunctionZoneSection::Http(h) => FunctionZoneConfig::Http(h),
            FunctionZoneSection::Lambda(l) => FunctionZoneConfig::Lambda(l),
        }
    }
}

/// `function_zones: [{type: lambda, ...}]`: the zone keys and
/// [`LambdaFunctionTierConfig`]'s (see `function_tier: {type: lambda}`).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LambdaZoneConfig {
    /// Zone name.
    pub name: String,
    /// `edge` or `cloud`.
    pub kind: ZoneKindConfig,
    /// Edge zones: client networks whose requests originate in this zone.
    #[serde(default)]
    pub client_cidrs: Vec<ipnet::IpNet>,
    /// Function name or ARN.
    pub function_name: String,
    /// Version or alias; absent: `$LATEST`.
    #[serde(default)]
    pub qualifier: Option<String>,
    /// Event and reply shape: `v2` (default), `v1` or `alb`.
    #[serde(default)]
    pub payload_format: LambdaPayloadFormat,
    /// The function's own timeout, seconds (see `function_tier.timeout_seconds`).
    #[serde(default = "default_lambda_timeout")]
    pub timeout_seconds: f64,
    /// How long past `timeout_seconds` the gateway still waits for the reply, seconds
    /// (see `function_tier.invoke_margin_seconds`).
    #[serde(default = "default_invoke_margin")]
    pub invoke_margin_seconds: f64,
    /// AWS region; absent: the default chain.
    #[serde(default)]
    pub region: Option<String>,
    /// Lambda endpoint override.
    #[serde(default)]
    pub endpoint_url: Option<String>,
    /// Most Invoke calls in flight; absent: no local limit.
    #[serde(default)]
    pub max_concurrency: Option<u32>,
    /// Provisioned concurrency put on `qualifier` at start; absent: left alone.
    #[serde(default)]
    pub prewarmed_instances: Option<u32>,
    /// Remove the qualifier's provisioned concurrency at start.
    #[serde(default)]
    pub remove_prewarm_on_start: bool,
    /// Remove it on gateway shutdown.
    #[serde(default)]
    pub remove_prewarm_on_shutdown: bool,
}

fn default_lambda_timeout() -> f64 {
    super::lambda::DEFAULT_LAMBDA_TIMEOUT_SECONDS
}

fn default_invoke_margin() -> f64 {
    super::lambda::DEFAULT_INVOKE_MARGIN_SECONDS
}

/// `function_zones: [{type: process, ...}]`: the zone keys and
/// [`ProcessFunctionTierConfig`]'s.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessZoneConfig {
    /// Zone name (logs, metrics, `/status`, the origin header's value).
    pub name: String,
    /// `edge` or `cloud`.
    pub kind: ZoneKindConfig,
    /// Edge zones: client networks whose requests originate in this zone.
    #[serde(default)]
    pub client_cidrs: Vec<ipnet::IpNet>,
    /// Program and arguments, with `{port}` and `{spillway}` placeholders. Required by
    /// `spillway serve`; the simulator models instances and needs none.
    #[serde(default)]
    pub command: Option<Vec<String>>,
    /// Readiness probe path.
    #[serde(default = "default_health_path")]
    pub health_path: String,
    /// An idle instance is stopped after this long (FaaSim keep-alive), seconds.
    #[serde(default = "default_keep_alive")]
    pub keep_alive_seconds: f64,
    /// Cap on instances alive (booting + busy + idle).
    pub max_instances: u32,
    /// Instances started up front and kept warm (pre-warm); keep-alive never expires them.
    #[serde(default)]
    pub prewarmed_instances: u32,
    /// Which idle instance a warm start takes: `newest` (most recently idle, the default)
    /// or `oldest` (idle longest, as FaaSim).
    #[serde(default)]
    pub warm_instance_order: WarmOrder,
    /// A cold start not ready after this long fails the attempt, seconds.
    #[serde(default = "default_function_boot_timeout")]
    pub boot_timeout_seconds: f64,
    /// Interval between readiness probes during a cold start, seconds.
    #[serde(default = "default_probe_interval")]
    pub probe_interval_seconds: f64,
}

/// `function_zones: [{type: http, ...}]`: the zone keys and
/// [`HttpFunctionTierConfig`]'s.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpZoneConfig {
    /// Zone name.
    pub name: String,
    /// `edge` or `cloud`.
    pub kind: ZoneKindConfig,
    /// Edge zones: client networks whose requests originate in this zone.
    #[serde(default)]
    pub client_cidrs: Vec<ipnet::IpNet>,
    /// Base URL of the function endpoint; the request path is appended.
    pub url: String,
    /// Most calls in flight; more are throttled.
    pub max_concurrency: u32,
}

/// One zone as the gateway and the simulator see it: name, kind, client networks and
/// its provider.
#[derive(Clone, Debug)]
pub struct ZoneSpec {
    /// Zone name.
    pub name: String,
    /// Edge or cloud.
    pub kind: ZoneKind,
    /// Client networks of an edge zone.
    pub client_cidrs: Vec<ipnet::IpNet>,
    /// The provider, as a `function_tier` section.
    pub tier: FunctionTierConfig,
}

impl FunctionZoneConfig {
    /// The zone's name.
    pub fn name(&self) -> &str {
        match self {
            FunctionZoneConfig::Process(p) => &p.name,
            FunctionZoneConfig::Http(h) => &h.name,
            FunctionZoneConfig::Lambda(l) => &l.name,
        }
    }

    /// The zone's kind.
    pub fn kind(&self) -> ZoneKindConfig {
        match self {
            FunctionZoneConfig::Process(p) => p.kind,
            FunctionZoneConfig::Http(h) => h.kind,
            FunctionZoneConfig::Lambda(l) => l.kind,
        }
    }

    /// The zone's client networks.
    pub fn client_cidrs(&self) -> &[ipnet::IpNet] {
        match self {
            FunctionZoneConfig::Process(p) => &p.client_cidrs,
            FunctionZoneConfig::Http(h) => &h.client_cidrs,
            FunctionZoneConfig::Lambda(l) => &l.client_cidrs,
        }
    }

    /// The provider as a `function_tier` section (backends are built from it).
    pub fn tier(&self) -> FunctionTierConfig {
        match self {
            FunctionZoneConfig::Process(p) => {
                FunctionTierConfig::Process(ProcessFunctionTierConfig {
                    command: p.command.clone().unwrap_or_default(),
                    health_path: p.health_path.clone(),
                    keep_alive_seconds: p.keep_alive_seconds,
                    max_instances: p.max_instances,
                    prewarmed_instances: p.prewarmed_instances,
                    warm_instance_order: p.warm_instance_order,
                    boot_timeout_seconds: p.boot_timeout_seconds,
                    probe_interval_seconds: p.probe_interval_seconds,
                })
            }
            FunctionZoneConfig::Http(h) => FunctionTierConfig::Http(HttpFunctionTierConfig {
                url: h.url.clone(),
                max_concurrency: h.max_concurrency,
            }),
            FunctionZoneConfig::Lambda(l) => FunctionTierConfig::Lambda(LambdaFunctionTierConfig {
                function_name: l.function_name.clone(),
                qualifier: l.qualifier.clone(),
                payload_format: l.payload_format,
                timeout_seconds: l.timeout_seconds,
                invoke_margin_seconds: l.invoke_margin_seconds,
                region: l.region.clone(),
                endpoint_url: l.endpoint_url.clone(),
                max_concurrency: l.max_concurrency,
                prewarmed_instances: l.prewarmed_instances,
                remove_prewarm_on_start: l.remove_prewarm_on_start,
                remove_prewarm_on_shutdown: l.remove_prewarm_on_shutdown,
            }),
        }
    }
}

impl Config {
    /// What `spillway serve` needs of the zones beyond [`Config::validate`]: a command
    /// for every `process` zone.
    pub(crate) fn zone_gateway_issues(&self, is: &mut Issues) {
        for (i, z) in self.function_zones.iter().enumerate() {
            if let FunctionZoneConfig::Process(p) = z
                && p.command.is_none()
            {
                is.push(
                    format!("function_zones[{i}].command"),
                    "missing: `spillway serve` runs a process zone's instances with it (only the simulator does without)",
                );
            }
            if matches!(z, FunctionZoneConfig::Lambda(_)) && !cfg!(feature = "aws") {
                is.push(
                    format!("function_zones[{i}].type"),
                    super::schema::aws_feature_missing("lambda"),
                );
            }
        }
    }

    /// Every function zone in placement order: the `function_zones`, then `function_tier`
    /// as a cloud zone named [`SINGLE_ZONE_NAME`]. Empty: no function tier at all.
    pub fn zone_specs(&self) -> Vec<ZoneSpec> {
        let mut out: Vec<ZoneSpec> = self
            .function_zones
            .iter()
            .map(|z| ZoneSpec {
                name: z.name().to_string(),
                kind: z.kind().into(),
                client_cidrs: z.client_cidrs().to_vec(),
                tier: z.tier(),
            })
            .collect();
        if let Some(ft) = &self.function_tier {
            out.push(ZoneSpec {
                name: SINGLE_ZONE_NAME.to_string(),
                kind: ZoneKind::Cloud,
                client_cidrs: Vec::new(),
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
                provisioned_instances: match &z.tier {
                    FunctionTierConfig::Process(p) => p.prewarmed_instances,
                    FunctionTierConfig::Lambda(l) => l.prewarmed_instances.unwrap_or(0),
                    FunctionTierConfig::Http(_) => 0,
                },
                name: z.name,
            })
            .collect();
        crate::policy::cost::CostMeter::new(self.pricing.meter_pricing(self.libra.r_max_rps), zones)
    }

    /// The instance type the live bill prices the pool's VMs at: the EC2 pool's
    /// `instance_type` (`launch_template` when the template sets it), `process` or
    /// `static` otherwise.
    pub fn vm_instance_type(&self) -> String {
        use super::schema::VmPoolConfig;
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
            let name = z.name();
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
            } else if let Some(j) = self.function_zones[..i]
                .iter()
                .position(|o| o.name() == name)
            {
                is.push(
                    format!("{at}.name"),
                    format!("duplicate zone name {name:?} (also function_zones[{j}])"),
                );
            }
            match z.kind() {
                ZoneKindConfig::Cloud => {
                    if let Some(first) = &cloud {
                        is.push(
                            format!("{at}.kind"),
                            format!("more than one cloud zone (the first is {first})"),
                        );
                    } else {
                        cloud = Some(at.clone());
                    }
                    if !z.client_cidrs().is_empty() {
                        is.push(
                            format!("{at}.client_cidrs"),
                            "only edge zones have clients of their own; a request with no edge zone goes to the cloud",
                        );
                    }
                }
                ZoneKindConfig::Edge => {}
            }
            match z {
                // Without a command: only the simulator can use it (gateway_issues).
                FunctionZoneConfig::Process(p) if p.command.is_none() => {
                    let mut own = Issues(Vec::new());
                    z.tier().validate_at(&at, &mut own);
                    let skip = format!("{at}.command");
                    is.0.extend(own.0.into_iter().filter(|i| i.path != skip));
                }
                // The Lambda checks name `function_tier.*`: rename them to this zone.
                FunctionZoneConfig::Lambda(_) => {
                    let mut own = Issues(Vec::new());
                    z.tier().validate_at(&at, &mut own);
                    for mut i in own.0 {
                        i.path = i.path.replacen("function_tier", &at, 1);
                        i.message = i.message.replace("function_tier.", &format!("{at}."));
                        is.0.push(i);
                    }
                }
                _ => z.tier().validate_at(&at, is),
            }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ConfigError;

    const CMD: &str = r#"["{spillway}", "sample-api", "--listen", "127.0.0.1:{port}"]"#;

    fn problems(yaml: &str) -> Vec<(String, String)> {
        match Config::from_yaml(yaml, "z.yaml") {
            Ok(_) => Vec::new(),
            Err(ConfigError::Invalid { issues, .. }) => issues
                .into_iter()
                .map(|i| {
                    let loc = i.location.map_or(String::new(), |l| format!("{}", l.line));
                    (format!("{loc} {}", i.path), i.message)
                })
                .collect(),
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn zones_become_placement_zones_with_function_tier_as_the_cloud() {
        let yaml = format!(
            "placement: warm_first\nfunction_zones:\n  - name: edge-a\n    kind: edge\n    client_cidrs: [10.1.0.0/16]\n    type: process\n    command: {CMD}\n    max_instances: 2\n    keep_alive_seconds: 7.5\n    prewarmed_instances: 1\nfunction_tier:\n  type: http\n  url: http://192.0.2.1:9/fn\n  max_concurrency: 40\n"
        );
        let c = Config::from_yaml(&yaml, "z.yaml").unwrap();
        let p = c.placement_params();
        assert_eq!(p.policy, PlacementPolicy::WarmFirst);
        let names: Vec<_> = p.zones.iter().map(|z| (z.name.as_str(), z.kind)).collect();
        assert_eq!(
            names,
            [
                ("edge-a", ZoneKind::Edge),
                (SINGLE_ZONE_NAME, ZoneKind::Cloud)
            ]
        );
        let crate::policy::placement::ZoneCapacity::Instances(pool) = &p.zones[0].capacity else {
            panic!("{:?}", p.zones[0])
        };
        assert_eq!(
            (
                pool.keep_alive.as_secs_f64(),
                pool.max_instances,
                pool.prewarmed
            ),
            (7.5, Some(2), 1)
        );
        assert_eq!(
            p.zones[1].capacity,
            crate::policy::placement::ZoneCapacity::Concurrency {
                max_concurrency: Some(40)
            }
        );
        assert_eq!(
            c.zone_specs()[0].client_cidrs,
            ["10.1.0.0/16".parse().unwrap()]
        );
    }

    #[test]
    fn check_names_every_zone_problem_at_its_place() {
        let zone = |name: &str, kind: &str| {
            format!(
                "  - name: {name}\n    kind: {kind}\n    type: process\n    command: {CMD}\n    max_instances: 1\n"
            )
        };
        let yaml = format!(
            "function_zones:\n{}{}{}{}  - name: broken\n    kind: edge\n    url: http://x/\n",
            zone("a", "edge"),
            zone("a", "cloud"),
            zone("c2", "cloud"),
            "  - name: c3\n    kind: cloud\n    client_cidrs: [10.0.0.0/8]\n    type: http\n    url: http://192.0.2.1:9/\n    max_concurrency: 0\n",
        );
        let got = problems(&yaml);
        let want = [
            (
                "7 function_zones[1].name",
                "duplicate zone name \"a\" (also function_zones[0])",
            ),
            (
                "13 function_zones[2].kind",
                "more than one cloud zone (the first is function_zones[1])",
            ),
            (
                "18 function_zones[3].kind",
                "more than one cloud zone (the first is function_zones[1])",
            ),
            (
                "19 function_zones[3].client_cidrs",
                "only edge zones have clients of their own; a request with no edge zone goes to the cloud",
            ),
            ("22 function_zones[3].max_concurrency", "must be at least 1"),
            (
                "23 function_zones[4]",
                "missing `type:` (one of: process, http, lambda)",
            ),
        ];
        let want: Vec<(String, String)> = want
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn an_unknown_placement_and_an_untrusted_origin_header_are_refused() {
        let got = problems("placement: edge_frist\n");
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[0].0, "1 placement");
        assert!(
            got[0].1.contains("did you mean `edge_first`")
                && got[0].1.contains("edge_first, warm_first"),
            "{got:?}"
        );
        let got = problems("sim:\n  placements: [warm_first]\n");
        assert_eq!(
            got,
            [(
                "2 sim.placements".to_string(),
                "needs function_zones (placement is between edge and cloud zones)".to_string()
            )]
        );
        let got = problems("gateway:\n  origin_zone_header: x-zone\n");
        assert_eq!(
            got,
            [(
                "2 gateway.origin_zone_header".to_string(),
                "is honoured only from gateway.trusted_proxies, which is empty".to_string()
            )]
        );
        assert!(
            problems("gateway:\n  trusted_proxies: [127.0.0.1/32]\n  origin_zone_header: x-zone\n")
                .is_empty()
        );
    }

    #[test]
    fn a_process_zone_without_a_command_is_for_the_simulator_only() {
        let yaml = "function_zones:\n  - {name: e, kind: edge, type: process, max_instances: 1}\n";
        assert!(Config::from_yaml(yaml, "z.yaml").is_ok());
        let err = Config::from_yaml_for_serve(yaml, "z.yaml")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("z.yaml:2:5: function_zones[0].command: missing: `spillway serve`"),
            "{err}"
        );
        assert!(
            !err.contains("function_tier"),
            "zones are a function tier: {err}"
        );
    }

    #[test]
    fn a_lambda_zones_checks_name_the_zone() {
        let yaml = "function_zones:\n  - name: l\n    kind: cloud\n    type: lambda\n    function_name: api\n    prewarmed_instances: 2\n";
        let got = problems(yaml);
        assert_eq!(
            got,
            [(
                "6 function_zones[0].prewarmed_instances".to_string(),
                "needs function_zones[0].qualifier (a published version or an alias): provisioned concurrency cannot be set on $LATEST".to_string()
            )]
        );
        let ok = yaml.replace("prewarmed_instances: 2", "qualifier: live");
        let c = Config::from_yaml(&ok, "z.yaml").unwrap();
        assert_eq!(
            c.placement_params().zones[0].capacity,
            crate::policy::placement::ZoneCapacity::Concurrency {
                max_concurrency: None
            }
        );
        let serve = Config::from_yaml_for_serve(&ok, "z.yaml");
        assert_eq!(
            serve.is_err_and(|e| e.to_string().contains("function_zones[0].type")),
            !cfg!(feature = "aws")
        );
    }
}
