use super::*;

#[test]
fn the_embedded_quickstart_is_valid() {
    let c = Config::quickstart();
    assert_eq!(c.gateway.listen.to_string(), "127.0.0.1:8080");
    assert_eq!(c.gateway.admin_listen.to_string(), "127.0.0.1:9901");
    assert!(matches!(c.vm_pool, Some(VmPoolConfig::Process(_))));
    assert!(matches!(
        c.function_tier,
        Some(FunctionTierConfig::Process(_))
    ));
    assert!(c.gateway_issues().is_empty());
}

#[test]
fn the_shipped_reference_config_is_valid() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/config/reference.yaml");
    Config::load(Path::new(path)).unwrap_or_else(|e| panic!("{e}"));
}

/// `(line:column, path, message)` of every problem in `err`.
fn problems(err: &ConfigError) -> Vec<(String, String, String)> {
    match err {
        ConfigError::Invalid { issues, .. } => issues
            .iter()
            .map(|i| {
                (
                    i.location.map_or("-".into(), |l| l.to_string()),
                    i.path.clone(),
                    i.message.clone(),
                )
            })
            .collect(),
        ConfigError::Parse {
            line,
            column,
            message,
            ..
        } => vec![(format!("{line}:{column}"), String::new(), message.clone())],
        other => panic!("{other}"),
    }
}

/// Every fixture in tests/data/config lists the problems it must produce, in file order,
/// as `# expect L:C path: message` comment lines (the message may be cut short: it is a
/// prefix). One fixture per section, syntax errors included.
#[test]
fn every_fixture_reports_its_problems_at_their_line_and_column() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/config");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        seen += 1;
        let text = std::fs::read_to_string(&path).unwrap();
        let expected: Vec<(String, String, String)> = text
            .lines()
            .filter_map(|l| {
                let l = l.trim();
                l.strip_prefix("# expect ").or(if cfg!(feature = "aws") {
                    None
                } else {
                    l.strip_prefix("# expect-without-aws ")
                })
            })
            .map(|e| {
                let (place, rest) = e.split_once(' ').unwrap();
                // `path: message`; a syntax error has no path (and its message may
                // hold ": ", but a path never holds a space).
                let (path, message) = match rest.split_once(": ") {
                    Some((p, m)) if !p.contains(' ') => (p, m),
                    _ => ("", rest),
                };
                (place.to_string(), path.to_string(), message.to_string())
            })
            .collect();
        assert!(
            !expected.is_empty(),
            "{}: no `# expect` line",
            path.display()
        );
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let err = Config::from_yaml_for_serve(&text, &name).unwrap_err();
        let got = problems(&err);
        assert_eq!(got.len(), expected.len(), "{name}:\n{err}");
        for (g, e) in got.iter().zip(&expected) {
            assert_eq!((&g.0, &g.1), (&e.0, &e.1), "{name}:\n{err}");
            assert!(
                g.2.starts_with(&e.2),
                "{name}: {:?} does not start with {:?}",
                g.2,
                e.2
            );
        }
    }
    assert!(seen >= 10, "fixtures: {seen}");
}

#[test]
fn a_single_problem_is_one_line_file_line_column_path_message() {
    let yaml = "version: 1\nlibra:\n  alpha: 0.2\n  rho: lots\n";
    let err = Config::from_yaml(yaml, "x.yaml").unwrap_err();
    assert_eq!(
        err.to_string(),
        "x.yaml:4:8: libra.rho: expected a number, found `lots`"
    );
}

#[test]
fn several_problems_are_listed_in_file_order_each_with_its_place() {
    let yaml = "libra:\n  rho: 2\n  alpha: x\n";
    let err = Config::from_yaml(yaml, "m.yaml").unwrap_err();
    assert_eq!(
        err.to_string(),
        "m.yaml: 2 problems:\n  m.yaml:2:8: libra.rho: must be in (0, 1], got 2\n  \
         m.yaml:3:10: libra.alpha: expected a number, found `x`"
    );
}

#[test]
fn a_value_replaced_after_a_type_error_is_not_checked_again() {
    // max_vms is unreadable: min_vms must not be compared with max_vms's default.
    let err = Config::from_yaml("libra:\n  min_vms: 12\n  max_vms: ten\n", "r.yaml").unwrap_err();
    let p = problems(&err);
    assert_eq!(p.len(), 1, "{err}");
    assert_eq!(p[0].1, "libra.max_vms");
}

#[test]
fn every_semantic_problem_is_reported_at_once_with_its_path() {
    let yaml = r#"
libra:
  alpha: 1.5
  rho: 0
  min_vms: 5
  max_vms: 2
vm_pool:
  type: process
  command: ["sample-api"]
function_tier:
  type: http
  url: "ftp://nowhere"
  max_concurrency: 0
"#;
    let err = Config::from_yaml(yaml, "bad.yaml").unwrap_err();
    let ConfigError::Invalid { issues, .. } = &err else {
        panic!("{err}")
    };
    let paths: Vec<&str> = issues.iter().map(|i| i.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "libra.alpha",
            "libra.rho",
            "libra.min_vms",
            "vm_pool.command",
            "function_tier.url",
            "function_tier.max_concurrency"
        ],
        "{err}"
    );
}

#[test]
fn cip_is_computed_from_pricing_when_not_set() {
    let c = Config::from_yaml("libra: {r_max_rps: 16}\n", "p.yaml").unwrap();
    // m4.large vs 512 MB × 1 s on x86 without an API gateway: 3.255 req/s.
    assert!((c.cip_rps() - 3.2552).abs() < 1e-3, "{}", c.cip_rps());
}

#[test]
fn serve_needs_both_providers_the_simulator_does_not() {
    let c = Config::from_yaml("libra: {r_max_rps: 16}\n", "s.yaml").unwrap();
    let paths: Vec<String> = c.gateway_issues().into_iter().map(|i| i.path).collect();
    assert_eq!(paths, ["vm_pool", "function_tier"]);
}

#[test]
fn durations_too_large_for_a_timer_are_rejected_not_crashed_on() {
    let yaml = "gateway: {drain_timeout_seconds: 1e20}\nlibra: {epoch_seconds: 1e300}\n";
    let err = Config::from_yaml(yaml, "d.yaml").unwrap_err();
    let ConfigError::Invalid { issues, .. } = &err else {
        panic!("{err}")
    };
    let paths: Vec<&str> = issues.iter().map(|i| i.path.as_str()).collect();
    assert_eq!(
        paths,
        ["gateway.drain_timeout_seconds", "libra.epoch_seconds"],
        "{err}"
    );
}

#[test]
fn an_ec2_pool_parses_with_documented_defaults() {
    let yaml = "vm_pool:\n  type: ec2\n  pool_name: api\n  launch_template: {name: api-lt, version: $Latest}\n";
    let c = Config::from_yaml(yaml, "ec2.yaml").unwrap_or_else(|e| panic!("{e}"));
    let Some(VmPoolConfig::Ec2(e)) = &c.vm_pool else {
        panic!("{:?}", c.vm_pool)
    };
    assert_eq!(e.address, Ec2Address::PrivateIp);
    assert_eq!(e.on_shutdown, Ec2ShutdownPolicy::Keep);
    assert_eq!(e.upstream_port, DEFAULT_EC2_UPSTREAM_PORT);
    assert_eq!(e.upstream_tag_key, DEFAULT_EC2_UPSTREAM_TAG_KEY);
    assert_eq!(e.boot_timeout_seconds, DEFAULT_EC2_BOOT_TIMEOUT_SECONDS);
    assert_eq!(e.probe_interval_seconds, DEFAULT_EC2_PROBE_INTERVAL_SECONDS);
    assert_eq!((e.scheme.as_str(), e.health_path.as_str()), ("http", "/"));
    assert!(c.controller_params().execute_scaling);
}

#[test]
fn ec2_pool_problems_are_reported_with_their_paths() {
    let yaml = r#"
vm_pool:
  type: ec2
  pool_name: ""
  endpoint_url: "ftp://x"
  launch_template: {id: lt-1, name: both, version: latest}
  tags: {"spillway:pool": x}
  upstream_port: 0
  scheme: ftp
  health_path: health
  boot_timeout_seconds: 0
  probe_interval_seconds: -1
"#;
    let err = Config::from_yaml(yaml, "ec2.yaml").unwrap_err();
    let ConfigError::Invalid { issues, .. } = &err else {
        panic!("{err}")
    };
    let paths: Vec<&str> = issues.iter().map(|i| i.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "vm_pool.pool_name",
            "vm_pool.endpoint_url",
            "vm_pool.launch_template",
            "vm_pool.launch_template.version",
            "vm_pool.tags.spillway:pool",
            "vm_pool.upstream_port",
            "vm_pool.scheme",
            "vm_pool.health_path",
            "vm_pool.boot_timeout_seconds",
            "vm_pool.probe_interval_seconds",
        ],
        "{err}"
    );
    let err = Config::from_yaml("vm_pool: {type: ec2, pool_name: p}\n", "e.yaml").unwrap_err();
    let ConfigError::Invalid { issues, .. } = &err else {
        panic!("{err}")
    };
    let paths: Vec<&str> = issues.iter().map(|i| i.path.as_str()).collect();
    assert_eq!(paths, ["vm_pool.image_id", "vm_pool.instance_type"]);
}

/// `config/aws.yaml` is valid; `serve` and `check` accept it only in a binary with the
/// `aws` feature, and refuse it otherwise with the same message.
#[test]
fn the_shipped_aws_config_needs_the_aws_feature_for_serve() {
    let path = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/config/aws.yaml"));
    Config::load(path).unwrap_or_else(|e| panic!("{e}"));
    let serve = Config::load_for_serve(path);
    if cfg!(feature = "aws") {
        serve.unwrap_or_else(|e| panic!("{e}"));
    } else {
        let err = serve.unwrap_err();
        let p = problems(&err);
        let paths: Vec<&str> = p.iter().map(|x| x.1.as_str()).collect();
        assert_eq!(paths, ["vm_pool.type", "function_tier.type"], "{err}");
        assert_eq!(p[0].2, aws_feature_missing("ec2"));
        assert_eq!(p[1].2, aws_feature_missing("lambda"));
    }
}

#[test]
fn request_limits_and_path_options_are_checked_and_mapped() {
    let yaml = "gateway: {max_header_bytes: 100, max_header_count: 0, max_uri_bytes: 2000000, max_concurrent_streams: 0}\n";
    let err = Config::from_yaml(yaml, "h.yaml").unwrap_err();
    let ConfigError::Invalid { issues, .. } = &err else {
        panic!("{err}")
    };
    // In file order, each at its value.
    let found: Vec<(&str, u64)> = issues
        .iter()
        .map(|i| (i.path.as_str(), i.location.unwrap().column))
        .collect();
    assert_eq!(
        found,
        [
            ("gateway.max_header_bytes", 29),
            ("gateway.max_header_count", 52),
            ("gateway.max_uri_bytes", 70),
            ("gateway.max_concurrent_streams", 103)
        ],
        "{err}"
    );
    let err = Config::from_yaml(
        "gateway: {path_with_escaped_slashes_action: decode}\n",
        "e.yaml",
    )
    .unwrap_err();
    assert!(err.to_string().starts_with("e.yaml:1:"), "{err}");

    let yaml = "gateway: {max_header_bytes: 4096, max_header_count: 7, max_uri_bytes: 512, normalize_path: false, merge_slashes: false, path_with_escaped_slashes_action: unescape_and_redirect}\n";
    let rules = Config::from_yaml(yaml, "ok.yaml")
        .unwrap()
        .gateway
        .request_rules();
    assert_eq!(
        rules,
        crate::net::validate::RequestRules {
            max_header_bytes: 4096,
            max_header_count: 7,
            max_uri_bytes: 512,
            path: crate::net::validate::PathRules {
                normalize: false,
                merge_slashes: false,
                escaped_slashes: crate::net::validate::EscapedSlashesAction::UnescapeAndRedirect,
            },
            underscores: crate::net::validate::UnderscoresAction::DropHeader,
        }
    );
    // Defaults: 16 KiB, 100 fields, 8 KiB targets, normalize + merge, reject escaped
    // slashes.
    assert_eq!(
        Config::default().gateway.request_rules(),
        crate::net::validate::RequestRules::default()
    );
}

#[test]
fn adaptive_r_max_defaults_follow_the_start_value_and_the_decision_period() {
    let yaml = "libra:\n  r_max_rps: 20\n  epoch_seconds: 2\n  decision_epochs: 7\n  rho: 0.6\n  r_max_adaptive: {target_ms: 250}\n";
    let c = Config::from_yaml(yaml, "a.yaml").unwrap();
    let p = c.r_max_adaptive_params().expect("configured");
    assert_eq!(p.start_rps, 20.0);
    assert_eq!(p.target_quantile, 0.99);
    assert_eq!(p.target, std::time::Duration::from_millis(250));
    assert_eq!((p.kp, p.ki, p.kd), (0.1, 0.5, 0.0));
    assert_eq!((p.min_rps, p.max_rps, p.max_step_rps), (5.0, 80.0, 5.0));
    assert_eq!(
        p.period,
        std::time::Duration::from_secs(14),
        "7 epochs of 2 s"
    );
    assert_eq!(p.min_load_fraction, 0.3, "rho / 2");
    assert!(
        Config::from_yaml("libra: {r_max_rps: 16}\n", "b.yaml")
            .unwrap()
            .r_max_adaptive_params()
            .is_none()
    );
}

#[test]
fn bad_adaptive_r_max_settings_are_reported_with_their_paths() {
    // A negative duration is refused where it is read, at its place.
    let err =
        Config::from_yaml("libra:\n  r_max_adaptive:\n    target_ms: -5\n", "r.yaml").unwrap_err();
    assert!(
        err.to_string().starts_with(
            "r.yaml:3:16: libra.r_max_adaptive.target_ms: expected a number of milliseconds from 0"
        ),
        "{err}"
    );
    let yaml = r#"
libra:
  r_max_rps: 16
  r_max_adaptive:
    target_percentile: 100
    target_ms: 0
    kp: -0.1
    ki: 0
    min_rps: 20
    max_rps: 8
    max_step_rps: 0
    interval_epochs: 0
"#;
    let err = Config::from_yaml(yaml, "r.yaml").unwrap_err();
    let ConfigError::Invalid { issues, .. } = &err else {
        panic!("{err}")
    };
    let paths: Vec<&str> = issues.iter().map(|i| i.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "libra.r_max_adaptive.target_percentile",
            "libra.r_max_adaptive.target_ms",
            "libra.r_max_adaptive.kp",
            "libra.r_max_adaptive.ki",
            "libra.r_max_adaptive.min_rps",
            "libra.r_max_adaptive.max_rps",
            "libra.r_max_adaptive.max_step_rps",
            "libra.r_max_adaptive.interval_epochs",
        ],
        "{err}"
    );
    let missing = Config::from_yaml("libra:\n  r_max_adaptive: {kp: 0.2}\n", "m.yaml")
        .unwrap_err()
        .to_string();
    assert!(
        missing.starts_with("m.yaml:2:") && missing.contains("target_ms"),
        "{missing}"
    );
}

/// On a Lambda tier the gateway waits `timeout_seconds +
/// invoke_margin_seconds`; `check` refuses a `gateway.upstream_timeout_seconds` that would
/// cut a call before that deadline, and accepts one equal to it.
#[test]
fn a_gateway_timeout_shorter_than_the_invoke_deadline_is_refused() {
    let cfg = |upstream: f64, function: f64, margin: Option<f64>| {
        let margin = margin.map_or(String::new(), |m| format!(", invoke_margin_seconds: {m}"));
        format!(
            "gateway: {{upstream_timeout_seconds: {upstream}}}\n\
             function_tier: {{type: lambda, function_name: f, timeout_seconds: {function}{margin}}}\n"
        )
    };
    // The issue's example: 30 s at the gateway, a 120 s function.
    let err = Config::from_yaml(&cfg(30.0, 120.0, None), "l.yaml").unwrap_err();
    let p = problems(&err);
    assert_eq!(p.len(), 1, "{err}");
    assert_eq!(p[0].1, "gateway.upstream_timeout_seconds");
    let deadline = 120.0 + DEFAULT_INVOKE_MARGIN_SECONDS.number();
    assert!(p[0].2.contains(&format!("= {deadline} s")), "{}", p[0].2);
    // The margin counts: 27.5 + 2.5 = 30 fits exactly, 27.5 + 2.75 does not.
    Config::from_yaml(&cfg(30.0, 27.5, Some(2.5)), "l.yaml").unwrap_or_else(|e| panic!("{e}"));
    let err = Config::from_yaml(&cfg(30.0, 27.5, Some(2.75)), "l.yaml").unwrap_err();
    assert_eq!(problems(&err)[0].1, "gateway.upstream_timeout_seconds");
    // The defaults fit each other.
    let c = Config::from_yaml(
        "function_tier: {type: lambda, function_name: f}\n",
        "l.yaml",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let Some(FunctionTierConfig::Lambda(l)) = &c.function_tier else {
        panic!("not a lambda tier")
    };
    assert!(l.invoke_deadline() <= c.gateway.upstream_timeout_seconds.get());
    // A negative margin is its own error.
    let err = Config::from_yaml(&cfg(30.0, 10.0, Some(-1.0)), "l.yaml").unwrap_err();
    assert_eq!(
        problems(&err)[0].1,
        "function_tier.invoke_margin_seconds",
        "{err}"
    );
}

#[test]
fn faasim_jitter_and_times_are_validated_with_their_paths() {
    let yaml = "sim:\n  function:\n    warm_start_jitter: 1.5\n    shutdown_ms: -1\n";
    let err = Config::from_yaml(yaml, "j.yaml").unwrap_err();
    let paths: Vec<String> = problems(&err).into_iter().map(|p| p.1).collect();
    assert_eq!(
        paths,
        ["sim.function.warm_start_jitter", "sim.function.shutdown_ms"],
        "{err}"
    );
    assert!(err.to_string().contains("j.yaml:3:24"), "{err}");
    let ok = "sim:\n  function:\n    exec_jitter: 0.01\n    cold_start_jitter: 0.01\n    \
              warm_start_jitter: 0.04\n    prewarm_boot_ms: 6019\n    shutdown_ms: 0\n";
    let c = Config::from_yaml(ok, "ok.yaml").unwrap();
    assert_eq!(c.sim.function.prewarm_boot_ms.number(), 6019.0);
}

/// The live bill's `pricing` keys are checked where they stand; a valid set reaches the
/// meter's prices, and a bad warm order names its key.
#[test]
fn live_bill_pricing_and_the_warm_order_are_validated_with_their_paths() {
    let yaml = "pricing:\n  vm_billing_granularity_seconds: 0\n  vm_minimum_billed_seconds: -1\n  \
                vm_hourly_usd_by_instance_type: {c5.large: -0.1}\n  \
                provisioned_concurrency_gb_second_usd: -1\n";
    let err = Config::from_yaml(yaml, "p.yaml").unwrap_err();
    let paths: Vec<String> = problems(&err).into_iter().map(|p| p.1).collect();
    assert_eq!(
        paths,
        [
            "pricing.vm_billing_granularity_seconds",
            "pricing.vm_minimum_billed_seconds",
            "pricing.vm_hourly_usd_by_instance_type.c5.large",
            "pricing.provisioned_concurrency_gb_second_usd",
        ],
        "{err}"
    );
    let ok = "pricing:\n  vm_hourly_usd: 0.2\n  vm_hourly_usd_by_instance_type: {c5.large: 0.085}\n  \
              vm_billing_granularity_seconds: 10\n  vm_minimum_billed_seconds: 0\n";
    let c = Config::from_yaml(ok, "ok.yaml").unwrap();
    let m = c.pricing.meter_pricing(16.0);
    assert_eq!(
        (m.vm_hourly("c5.large"), m.vm_hourly("t3.micro")),
        (0.085, 0.2)
    );
    assert_eq!(m.vm_billing.billed_seconds(41.0), 50.0);
    let bad = "sim:\n  function:\n    warm_instance_order: lifo\n";
    let err = Config::from_yaml(bad, "w.yaml").unwrap_err().to_string();
    assert!(
        err.contains("w.yaml:3:26") && err.contains("newest") && err.contains("oldest"),
        "{err}"
    );
}

#[test]
fn connection_and_response_limits_are_checked_at_their_place() {
    let yaml = "gateway: {max_connections: 0, max_connections_per_client_ip: 0, keepalive_idle_timeout_seconds: 0, max_response_header_count: 0, max_response_header_bytes: 100, headers_with_underscores_action: keep}\n";
    let err = Config::from_yaml(yaml, "c.yaml").unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("gateway.headers_with_underscores_action"),
        "{text}"
    );
    let yaml = "gateway: {max_connections: 0, max_connections_per_client_ip: 0, keepalive_idle_timeout_seconds: 0, max_response_header_count: 0, max_response_header_bytes: 100}\n";
    let err = Config::from_yaml(yaml, "c.yaml").unwrap_err();
    let ConfigError::Invalid { issues, .. } = &err else {
        panic!("{err}")
    };
    let mut found: Vec<&str> = issues.iter().map(|i| i.path.as_str()).collect();
    found.sort_unstable();
    assert_eq!(
        found,
        [
            "gateway.keepalive_idle_timeout_seconds",
            "gateway.max_connections",
            "gateway.max_connections_per_client_ip",
            "gateway.max_response_header_bytes",
            "gateway.max_response_header_count",
        ],
        "{err}"
    );
    assert!(issues.iter().all(|i| i.location.is_some()), "{err}");
    // Derived connection limits: a quarter per client IP, at least 1.
    let g = Config::from_yaml("gateway: {max_connections: 6}\n", "d.yaml")
        .unwrap()
        .gateway;
    assert_eq!(g.connection_limits(), (6, 1));
    let (total, per_ip) = Config::default().gateway.connection_limits();
    assert!((16..=10_000).contains(&total) && per_ip == (total / 4).max(1));
}

#[test]
fn request_ids_trusted_from_proxies_without_any_is_a_located_warning() {
    let text = "gateway:\n  request_id_trust: trusted_proxies\n";
    let c = Config::from_yaml(text, "g.yaml").unwrap();
    let w = warnings(&c, Some(text));
    assert_eq!(w.len(), 1, "{w:?}");
    assert_eq!(w[0].path, "gateway.request_id_trust");
    assert_eq!(w[0].location.map(|l| l.line), Some(2));
    let text = "gateway:\n  request_id_trust: trusted_proxies\n  trusted_proxies: [10.0.0.0/8]\n";
    let c = Config::from_yaml(text, "g.yaml").unwrap();
    assert!(warnings(&c, Some(text)).is_empty());
    let bad = Config::from_yaml("gateway:\n  request_id_trust: some\n", "g.yaml").unwrap_err();
    assert!(bad.to_string().contains("g.yaml:2:"), "{bad}");
}

/// `spillway check` warns about the old spelling of the per-VM slot count beside a VM pool
/// (which has its own `slots_per_vm`), at its place; the simulator, without a pool, reads
/// it silently.
#[test]
fn the_old_per_vm_cap_spelling_is_a_located_deprecation_warning() {
    let text = "vm_pool: {type: static, urls: [\"http://192.0.2.1:3000\"]}\n\
                libra:\n  max_outstanding_per_vm: 4\n";
    let c = Config::from_yaml(text, "a.yaml").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.slots_per_vm(), Some(4));
    let w = warnings(&c, Some(text));
    assert_eq!(w.len(), 1, "{w:?}");
    assert_eq!(w[0].path, "libra.max_outstanding_per_vm");
    assert!(
        w[0].message
            .starts_with("deprecated alias of vm_pool.slots_per_vm"),
        "{}",
        w[0].message
    );
    assert_eq!(w[0].location.map(|l| l.line), Some(3));
    let sim = "libra:\n  max_outstanding_per_vm: 4\n";
    let c = Config::from_yaml(sim, "s.yaml").unwrap();
    assert!(warnings(&c, Some(sim)).is_empty());
}

/// The simulator's function model once spelled its counts as FaaSim does
/// (`max_concurrency`, `prewarmed`): such a file still reads the same values, `spillway
/// check` names each old spelling at its line and column, `--set` takes either spelling,
/// and writing both spellings of one option is an error, not a silent choice.
#[test]
fn old_spellings_of_the_function_model_read_with_located_deprecation_warnings() {
    let old = "sim:\n  function:\n    max_concurrency: 7\n    prewarmed: 3\n";
    let c = Config::from_yaml(old, "old.yaml").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.sim.function.max_instances, 7);
    assert_eq!(c.sim.function.prewarmed_instances, 3);
    let w = warnings(&c, Some(old));
    let got: Vec<_> = w
        .iter()
        .map(|i| {
            (
                i.path.clone(),
                i.location.map(|l| (l.line, l.column)),
                i.message.clone(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (
                "sim.function.max_concurrency".to_string(),
                Some((3, 22)),
                "deprecated spelling of sim.function.max_instances: write `max_instances`"
                    .to_string()
            ),
            (
                "sim.function.prewarmed".to_string(),
                Some((4, 16)),
                "deprecated spelling of sim.function.prewarmed_instances: write \
                 `prewarmed_instances`"
                    .to_string()
            ),
        ]
    );
    // The current spellings read the same config, with no warning.
    let new = "sim:\n  function:\n    max_instances: 7\n    prewarmed_instances: 3\n";
    let n = Config::from_yaml(new, "new.yaml").unwrap();
    assert!(warnings(&n, Some(new)).is_empty());
    assert_eq!(
        serde_json::to_value(&n.sim.function).unwrap(),
        serde_json::to_value(&c.sim.function).unwrap()
    );
    // `--set` with the old spelling sets the option it names.
    let set = with_override(&n, "sim.function.prewarmed", "5").unwrap();
    assert_eq!(set.sim.function.prewarmed_instances, 5);
    let err = with_override(&n, "sim.function.prewarmed", "9").unwrap_err();
    assert!(
        err.contains("sim.function.prewarmed_instances: must not exceed"),
        "{err}"
    );
    // Both spellings of one option: refused at the second one's place.
    let both = "sim:\n  function:\n    max_instances: 7\n    max_concurrency: 8\n";
    let e = Config::from_yaml(both, "both.yaml").unwrap_err();
    let p = problems(&e);
    assert_eq!(p.len(), 1, "{p:?}");
    assert!(p[0].0.starts_with("4:"), "{p:?}");
    assert!(
        p[0].2.contains("sets `max_instances` a second time"),
        "{p:?}"
    );
}

#[test]
fn worker_threads_zero_or_beyond_the_maximum_is_an_error_at_its_place() {
    for (yaml, says) in [
        ("gateway: {worker_threads: 0}\n", "≥ 1"),
        ("gateway: {worker_threads: 5000}\n", "[1, 1024]"),
    ] {
        let err = Config::from_yaml(yaml, "w.yaml").unwrap_err();
        let found = problems(&err);
        assert_eq!(found.len(), 1, "{err}");
        let (at, path, message) = &found[0];
        assert_eq!(path, "gateway.worker_threads", "{err}");
        assert!(message.contains(says) && at != "-", "{err}");
    }
    let g = Config::from_yaml("gateway: {worker_threads: 3}\n", "w.yaml")
        .unwrap()
        .gateway;
    assert_eq!(g.worker_threads(), 3);
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    assert_eq!(Config::default().gateway.worker_threads(), cores);
}
