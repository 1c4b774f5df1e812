//! Risky but valid AWS settings that `spillway check` warns about (and `serve` logs at
//! start):
//!
//! * an `endpoint_url` with `http://` whose host is not loopback (`vm_pool`,
//!   `function_tier`, `function_zones[i]`): requests are signed (SigV4 does not send the
//!   secret key), but the session token, every request and reply — Lambda payloads, EC2
//!   instance data, user data — cross the network in plain text and can be changed on
//!   the way. Emulators on loopback (moto, LocalStack) are fine; anything else should
//!   be `https://`. A warning, not an error: an emulator in a private container network
//!   (`http://localstack:4566`) is a legitimate test setup;
//! * `vm_pool.tag_address_allowed_cidrs` (EC2 `address: tag`) holding a network wider
//!   than a `/8` (IPv4) or `/32` (IPv6): an instance's tag may then point the gateway at
//!   nearly any host, which is what the allow-list exists to prevent.

use super::function_tier::FunctionTierConfig;
use super::issues::ConfigIssue;
use super::schema::{Config, Ec2Address, VmPoolConfig};
use super::url::HttpUrl;

/// Narrowest IPv4 prefix length `tag_address_allowed_cidrs` may hold without a warning.
pub const TAG_CIDR_MIN_PREFIX_V4: u8 = 8;
/// Narrowest IPv6 prefix length `tag_address_allowed_cidrs` may hold without a warning.
pub const TAG_CIDR_MIN_PREFIX_V6: u8 = 32;

/// The warnings of the [module docs](self), each with its field path.
pub(crate) fn warnings(config: &Config) -> Vec<ConfigIssue> {
    let mut out = Vec::new();
    let mut endpoint = |path: String, url: Option<&HttpUrl>| {
        if let Some(url) = url
            && let Some(msg) = plain_http_off_loopback(url)
        {
            out.push(issue(path, msg));
        }
    };
    if let Some(VmPoolConfig::Ec2(e)) = &config.vm_pool {
        endpoint("vm_pool.endpoint_url".into(), e.endpoint_url.as_ref());
    }
    if let Some(FunctionTierConfig::Lambda(l)) = &config.function_tier {
        endpoint("function_tier.endpoint_url".into(), l.endpoint_url.as_ref());
    }
    for (i, z) in config.function_zones.iter().enumerate() {
        if let FunctionTierConfig::Lambda(l) = &z.provider {
            endpoint(
                format!("function_zones[{i}].endpoint_url"),
                l.endpoint_url.as_ref(),
            );
        }
    }
    if let Some(VmPoolConfig::Ec2(e)) = &config.vm_pool
        && e.address == Ec2Address::Tag
    {
        for (i, net) in e.tag_address_allowed_cidrs.iter().enumerate() {
            let (wide, min) = match net {
                ipnet::IpNet::V4(n) => (
                    n.prefix_len() < TAG_CIDR_MIN_PREFIX_V4,
                    TAG_CIDR_MIN_PREFIX_V4,
                ),
                ipnet::IpNet::V6(n) => (
                    n.prefix_len() < TAG_CIDR_MIN_PREFIX_V6,
                    TAG_CIDR_MIN_PREFIX_V6,
                ),
            };
            if wide {
                out.push(issue(
                    format!("vm_pool.tag_address_allowed_cidrs[{i}]"),
                    format!(
                        "{net} is wider than a /{min}: an instance's `{}` tag may then point the gateway at nearly any address; list only the networks of port-mapping hosts or sidecars",
                        e.upstream_tag_key
                    ),
                ));
            }
        }
    }
    out
}

fn issue(path: String, message: String) -> ConfigIssue {
    ConfigIssue {
        path,
        message,
        location: None,
    }
}

/// The warning for an `http://` endpoint whose host is not a loopback address or
/// `localhost`; `None` for `https://` and loopback.
fn plain_http_off_loopback(url: &HttpUrl) -> Option<String> {
    let uri = url.uri();
    if uri.scheme_str() != Some("http") {
        return None;
    }
    let host = uri.host()?;
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let loopback = bare.eq_ignore_ascii_case("localhost")
        || bare
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    (!loopback).then(|| {
        format!(
            "plain http:// to {host}, off loopback: the AWS session token and every request and reply (payloads included) cross the network unencrypted and can be changed on the way; use https:// (emulators belong on loopback)"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(yaml: &str) -> Config {
        Config::from_yaml(yaml, "t.yaml").unwrap()
    }

    const EC2: &str = "vm_pool:\n  type: ec2\n  pool_name: p\n  image_id: ami-12c6146b\n  instance_type: t3.micro\n";
    const LAMBDA: &str = "function_tier:\n  type: lambda\n  function_name: f\n";

    fn paths(c: &Config) -> Vec<String> {
        warnings(c).into_iter().map(|w| w.path).collect::<Vec<_>>()
    }

    #[test]
    fn plain_http_endpoints_off_loopback_are_warned_about() {
        for (url, warned) in [
            ("http://10.0.0.5:4566", true),
            ("http://localstack:4566", true),
            ("http://127.0.0.1:5000", false),
            ("http://[::1]:5000", false),
            ("http://localhost:5000", false),
            ("https://ec2.us-east-1.amazonaws.com", false),
            ("https://vpce-1.ec2.us-east-1.vpce.amazonaws.com", false),
        ] {
            let c = load(&format!(
                "{EC2}  endpoint_url: {url}\n{LAMBDA}  endpoint_url: {url}\n"
            ));
            let expected: Vec<String> = if warned {
                vec![
                    "vm_pool.endpoint_url".into(),
                    "function_tier.endpoint_url".into(),
                ]
            } else {
                vec![]
            };
            assert_eq!(paths(&c), expected, "{url}");
        }
        let w = warnings(&load(&format!(
            "{EC2}  endpoint_url: http://10.0.0.5:4566\n"
        )));
        assert!(
            w[0].message.contains("unencrypted") && w[0].message.contains("https://"),
            "{}",
            w[0].message
        );
    }

    #[test]
    fn wide_tag_address_allow_lists_are_warned_about() {
        let c = load(&format!(
            "{EC2}  address: tag\n  tag_address_allowed_cidrs: [10.0.0.0/8, 0.0.0.0/0, 192.168.0.0/16, '::/0', '2001:db8::/48']\n"
        ));
        assert_eq!(
            paths(&c),
            [
                "vm_pool.tag_address_allowed_cidrs[1]",
                "vm_pool.tag_address_allowed_cidrs[3]"
            ]
        );
        // Without address: tag the list is not used.
        let c = load(&format!("{EC2}  tag_address_allowed_cidrs: [0.0.0.0/0]\n"));
        assert!(paths(&c).is_empty());
    }
}
