//! `function_zones:` and `placement:` — several function tiers, edge and cloud, and
//! FaaSim's placement between them (FaaSim, "two-tier edge/cloud"; papers.md §2).
//!
//! Each zone is a function tier provider (`type: process`, `http` or `lambda`, with that
//! provider's keys, as under `function_tier:`) plus its `name`, its `kind` (`edge` or `cloud`) and,
//! for edge zones, the `client_cidrs` whose requests originate there. `function_tier:`
//! keeps working: it is one more cloud zone named [`SINGLE_ZONE_NAME`], after the
//! `function_zones`.

use serde::{Deserialize, Serialize};

use super::de::SHARED_KEYS_SECTION;
use super::function_tier::FunctionTierConfig;
use crate::policy::placement::{PlacementPolicy, ZoneKind};

/// Name of the zone `function_tier` becomes.
pub const SINGLE_ZONE_NAME: &str = "cloud";

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

/// One entry of `function_zones:`: its `name`, `kind` and `client_cidrs` beside a
/// provider written exactly as under `function_tier:` (`type:` and that provider's
/// keys, the same type, read and checked the same way).
#[derive(Clone, Debug, Serialize)]
pub struct FunctionZoneConfig {
    /// Zone name (logs, metrics, `/status`, the origin header's value).
    pub name: String,
    /// `edge` or `cloud`.
    pub kind: ZoneKindConfig,
    /// Edge zones: client networks whose requests originate in this zone.
    pub client_cidrs: Vec<ipnet::IpNet>,
    /// The zone's provider: a `function_tier` section.
    #[serde(flatten)]
    pub provider: FunctionTierConfig,
}

/// The keys a zone has beside its provider's.
#[derive(Deserialize)]
struct ZoneKeys {
    name: String,
    kind: ZoneKindConfig,
    #[serde(default)]
    client_cidrs: Vec<ipnet::IpNet>,
}

impl<'de> Deserialize<'de> for FunctionZoneConfig {
    /// Read as a shared-keys section (see `de`): the zone keys, then the provider from
    /// the other keys of the same mapping, every key at its place.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Parts;
        impl<'de> serde::de::Visitor<'de> for Parts {
            type Value = FunctionZoneConfig;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(
                    "a function zone: name, kind, client_cidrs and a provider's `type:` and keys",
                )
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Self::Value, A::Error> {
                use serde::de::Error;
                let keys: ZoneKeys = seq
                    .next_element()?
                    .ok_or_else(|| A::Error::invalid_length(0, &self))?;
                let provider: FunctionTierConfig = seq
                    .next_element()?
                    .ok_or_else(|| A::Error::invalid_length(1, &self))?;
                Ok(FunctionZoneConfig {
                    name: keys.name,
                    kind: keys.kind,
                    client_cidrs: keys.client_cidrs,
                    provider,
                })
            }
        }
        d.deserialize_tuple_struct(SHARED_KEYS_SECTION, 2, Parts)
    }
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
    /// Field path of the provider's section (`function_zones[2]`, `function_tier`).
    pub at: String,
    /// The provider, as a `function_tier` section.
    pub tier: FunctionTierConfig,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::config::ConfigError;
    use crate::policy::placement::PlacementPolicy;

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
            // A zone whose required count is not a count is not read, so its other
            // problems (a second cloud zone, client networks) wait for the next check.
            (
                "22 function_zones[3].max_concurrency",
                "expected a whole number ≥ 1, found 0",
            ),
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

    #[test]
    fn a_second_http_zone_is_read_and_checked_as_a_function_tier_at_its_own_place() {
        let yaml = "function_zones:\n  - name: edge-b\n    kind: edge\n    type: http\n    url: http://192.0.2.7:8/fn\n    max_concurrency: 3\n  - name: edge-c\n    kind: edge\n    client_cidrs: [10.9.0.0/16]\n    type: http\n    url: ftp://192.0.2.9/\n    max_concurrency: 0\n    timeout: 5\n";
        let err = Config::from_yaml(yaml, "z.yaml").unwrap_err().to_string();
        let lines: Vec<&str> = err.lines().skip(1).map(str::trim).collect();
        assert_eq!(
            lines,
            [
                "z.yaml:11:10: function_zones[1].url: expected an http:// or https:// URL with a host, found `ftp://192.0.2.9/`",
                "z.yaml:12:22: function_zones[1].max_concurrency: expected a whole number ≥ 1, found 0",
                "z.yaml:13:5: function_zones[1].timeout: unknown key; expected one of: url, max_concurrency",
            ],
            "{err}"
        );
        let good = yaml
            .replace("ftp://192.0.2.9/", "http://192.0.2.9:7/")
            .replace(
                "max_concurrency: 0\n    timeout: 5\n",
                "max_concurrency: 11\n",
            );
        let c = Config::from_yaml(&good, "z.yaml").unwrap();
        let zones: Vec<_> = c
            .zone_specs()
            .into_iter()
            .map(|z| match z.tier {
                FunctionTierConfig::Http(h) => {
                    (z.name, z.at, h.url.to_string(), h.max_concurrency.get())
                }
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(
            zones,
            [
                (
                    "edge-b".to_string(),
                    "function_zones[0]".to_string(),
                    "http://192.0.2.7:8/fn".to_string(),
                    3
                ),
                (
                    "edge-c".to_string(),
                    "function_zones[1]".to_string(),
                    "http://192.0.2.9:7/".to_string(),
                    11
                ),
            ]
        );
        assert_eq!(
            c.function_zones[1].client_cidrs,
            ["10.9.0.0/16".parse().unwrap()]
        );
    }
}
