use super::*;

#[test]
fn the_embedded_quickstart_is_valid() {
    let c = Config::quickstart();
    assert_eq!(c.gateway.listen.to_string(), "127.0.0.1:8080");
    assert_eq!(c.gateway.admin_listen.to_string(), "127.0.0.1:9090");
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

#[test]
fn type_errors_name_file_line_and_column() {
    let yaml = "version: 1\nlibra:\n  alpha: 0.2\n  rho: lots\n";
    let err = Config::from_yaml(yaml, "x.yaml").unwrap_err();
    let ConfigError::Parse { line, column, .. } = &err else {
        panic!("{err}")
    };
    assert_eq!((*line, *column), (4, 8), "{err}");
    assert!(err.to_string().starts_with("x.yaml:4:8: "), "{err}");
    assert!(
        !err.to_string().contains("line 4"),
        "location printed once: {err}"
    );
}

#[test]
fn unknown_keys_are_errors_with_their_location() {
    let yaml = "libra:\n  epoch_secs: 1\n";
    let err = Config::from_yaml(yaml, "y.yaml").unwrap_err();
    let msg = err.to_string();
    assert!(msg.starts_with("y.yaml:2:"), "{msg}");
    assert!(msg.contains("epoch_secs"), "{msg}");
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
fn errors_without_a_yaml_location_still_name_the_field() {
    let err = Config::from_yaml(
        "gateway:\n  trusted_proxies: [10.0.0.0/8, 10.0.0.1]\n",
        "t.yaml",
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.starts_with("t.yaml: gateway.trusted_proxies[1]: "),
        "{err}"
    );
    let err = Config::from_yaml(
        "function_tier:\n  type: process\n  command: [a, \"{port}\"]\n  max_instances: lots\n",
        "f.yaml",
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("function_tier: ") && err.contains("\"lots\""),
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
  scheme: https
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

#[test]
fn the_shipped_aws_config_is_valid_for_serve() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/config/aws.yaml");
    Config::load_for_serve(Path::new(path)).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn request_limits_and_path_options_are_checked_and_mapped() {
    let yaml = "gateway: {max_header_bytes: 100, max_header_count: 0, max_uri_bytes: 2000000, max_concurrent_streams: 0}\n";
    let err = Config::from_yaml(yaml, "h.yaml").unwrap_err();
    let ConfigError::Invalid { issues, .. } = &err else {
        panic!("{err}")
    };
    let paths: Vec<&str> = issues.iter().map(|i| i.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "gateway.max_header_bytes",
            "gateway.max_uri_bytes",
            "gateway.max_header_count",
            "gateway.max_concurrent_streams"
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
    let yaml = r#"
libra:
  r_max_rps: 16
  r_max_adaptive:
    target_percentile: 100
    target_ms: -5
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
            "libra.r_max_adaptive.max_step_rps",
            "libra.r_max_adaptive.min_rps",
            "libra.r_max_adaptive.max_rps",
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
