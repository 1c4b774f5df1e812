//! Which upstream addresses a user may configure: an upstream URL
//! the gateway did not create itself (a `static` VM URL, an `http` function tier URL)
//! must not point at link-local or cloud metadata addresses (`169.254.169.254`,
//! `fd00:ec2::254`: the gateway would hand its instance credentials to a client), and
//! points at the gateway's own host (loopback, `localhost`, the unspecified address)
//! only with `gateway.allow_loopback_upstreams: true`. Upstreams spillway starts itself
//! (`process` pools and tiers) are loopback by design and not checked.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Why an upstream host is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AddressError {
    /// A cloud instance metadata address.
    #[error("`{0}` is a cloud instance metadata address; upstreams may not point there")]
    Metadata(IpAddr),
    /// A link-local address (169.254.0.0/16, fe80::/10).
    #[error("`{0}` is a link-local address; upstreams may not point there")]
    LinkLocal(IpAddr),
    /// The gateway's own host, without the opt-in.
    #[error(
        "the upstream is on the gateway's own host (loopback); set gateway.allow_loopback_upstreams: true if that is intended"
    )]
    Loopback,
}

const METADATA_V4: Ipv4Addr = Ipv4Addr::new(169, 254, 169, 254);
const METADATA_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254);

/// Check `host` (a URL's host: a name, an IPv4 address or a bracketed IPv6 address).
/// Names other than `localhost` (and `*.localhost`) are not resolved here.
///
/// # Errors
/// [`AddressError`] naming the rule.
pub fn check_host(host: &str, allow_loopback: bool) -> Result<(), AddressError> {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let name = bare.trim_end_matches('.').to_ascii_lowercase();
    if name == "localhost" || name.ends_with(".localhost") {
        return if allow_loopback {
            Ok(())
        } else {
            Err(AddressError::Loopback)
        };
    }
    let Ok(ip) = bare.parse::<IpAddr>() else {
        return Ok(());
    };
    check_ip(ip, allow_loopback)
}

/// [`check_host`] for an address already known.
///
/// # Errors
/// [`AddressError`] naming the rule.
pub fn check_ip(ip: IpAddr, allow_loopback: bool) -> Result<(), AddressError> {
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    };
    match ip {
        IpAddr::V4(v4) if v4 == METADATA_V4 => Err(AddressError::Metadata(ip)),
        IpAddr::V6(v6) if v6 == METADATA_V6 => Err(AddressError::Metadata(ip)),
        IpAddr::V4(v4) if v4.is_link_local() => Err(AddressError::LinkLocal(ip)),
        IpAddr::V6(v6) if v6.is_unicast_link_local() => Err(AddressError::LinkLocal(ip)),
        _ if (ip.is_loopback() || ip.is_unspecified()) && !allow_loopback => {
            Err(AddressError::Loopback)
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_and_link_local_always_refused_loopback_only_with_opt_in() {
        for host in [
            "169.254.169.254",
            "[fd00:ec2::254]",
            "[::ffff:169.254.169.254]",
        ] {
            assert!(
                matches!(check_host(host, true), Err(AddressError::Metadata(_))),
                "{host}"
            );
        }
        for host in ["169.254.1.1", "[fe80::1]"] {
            assert!(
                matches!(check_host(host, true), Err(AddressError::LinkLocal(_))),
                "{host}"
            );
        }
        for host in [
            "127.0.0.1",
            "127.1.2.3",
            "[::1]",
            "localhost",
            "LOCALHOST.",
            "a.localhost",
            "0.0.0.0",
            "[::]",
        ] {
            assert_eq!(
                check_host(host, false),
                Err(AddressError::Loopback),
                "{host}"
            );
            assert_eq!(check_host(host, true), Ok(()), "{host}");
        }
        for host in ["10.0.0.5", "api.example.com", "[2001:db8::1]"] {
            assert_eq!(check_host(host, false), Ok(()), "{host}");
        }
    }
}
