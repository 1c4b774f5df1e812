//! Which upstream addresses the gateway may connect to: an upstream URL the gateway did
//! not create itself (a `static` VM URL, an `http` function tier URL, an EC2 instance's
//! address) must not lead to cloud metadata or credential services, link-local
//! addresses, the gateway's own listeners, or (without `gateway.allow_loopback_upstreams:
//! true`) the gateway's own host. The rules are checked twice:
//!
//! * **at parse time** ([`check_host`], `spillway check` and start-up): a host must be a
//!   canonical IP literal (`10.0.0.5`, `[2001:db8::1]`) or a real host name. Spellings
//!   that the system resolver reads as an IPv4 address although no strict parser does
//!   (`2130706433`, `0x7f.1`, `127.1`, `0177.0.0.1`) are refused with what they read as,
//!   so that the checked text and the address connected to are the same thing;
//! * **at connect time** ([`AddressPolicy::check`], in the upstream connector
//!   [`crate::net::client`]): on every socket address a host name resolves to, and on
//!   the peer of every new connection, so that a name that resolves (or re-resolves:
//!   DNS rebinding) to a refused address is never connected to. Only the addresses
//!   allowed are tried; a name with none left fails to connect with the rule named.
//!
//! Always refused: cloud instance metadata and credential agents (`169.254.169.254`,
//! the ECS task and EKS Pod Identity agents `169.254.170.2` and `169.254.170.23`, AWS's
//! instance-local services `fd00:ec2::/64`: IMDS `fd00:ec2::254`, DNS, NTP, the Pod
//! Identity agent `fd00:ec2::23`), link-local addresses (`169.254.0.0/16`, `fe80::/10`),
//! and the gateway's own listeners (proxy, admin and TLS listen addresses; a listener
//! bound to `0.0.0.0`/`[::]` counts on every address of the host), even with
//! `allow_loopback_upstreams`. IPv4-mapped (`::ffff:a.b.c.d`) and NAT64 (`64:ff9b::/96`)
//! addresses are checked as the IPv4 address they carry. Upstreams spillway starts
//! itself (`process` pools and tiers) are loopback by design: their client allows
//! loopback but still refuses the rest.
//!
//! Own code rather than a crate: the rules are spillway's (which addresses are whose),
//! and the non-canonical IPv4 forms are the C library's `inet_aton` grammar, a few lines.

use parking_lot::RwLock;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

/// Why an upstream host or address is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AddressError {
    /// A cloud instance metadata address or a credential agent (ECS, EKS Pod Identity).
    #[error(
        "`{0}` is a cloud instance metadata or credential agent address; upstreams may not point there"
    )]
    Metadata(IpAddr),
    /// A link-local address (169.254.0.0/16, fe80::/10).
    #[error("`{0}` is a link-local address; upstreams may not point there")]
    LinkLocal(IpAddr),
    /// The gateway's own host, without the opt-in.
    #[error(
        "the upstream is on the gateway's own host (loopback); set gateway.allow_loopback_upstreams: true if that is intended"
    )]
    Loopback,
    /// One of the gateway's own listeners (proxy, admin, TLS): proxying to it would
    /// hand its admin API, or a request loop, to any client.
    #[error("`{0}` is one of this gateway's own listeners; upstreams may never point there")]
    GatewayListener(SocketAddr),
    /// A spelling of an IPv4 address other than the canonical dotted quad, which the
    /// system resolver would still read as an address.
    #[error(
        "`{host}` is not a canonical IP address{}; write IPv4 addresses as four decimal numbers (a.b.c.d) and IPv6 ones in brackets",
        reads_as.map(|ip| format!(" (the system resolver reads it as {ip})")).unwrap_or_default()
    )]
    NonCanonical {
        /// The host as written.
        host: String,
        /// The address it reads as, when it reads as one.
        reads_as: Option<Ipv4Addr>,
    },
    /// Not a host name: characters other than letters, digits, `-` and `_` in dot-
    /// separated labels of 1 to 63 characters (253 in all).
    #[error(
        "`{0}` is not a host name (letters, digits, `-` and `_` in dot-separated labels) or an IP address"
    )]
    NotAHostName(String),
    /// A host name that resolved to no address the policy allows.
    #[error("`{host}` resolves only to refused addresses: {reasons}")]
    NoAllowedAddress {
        /// The host name.
        host: String,
        /// Each refused address and its rule.
        reasons: String,
    },
}

const METADATA_V4: Ipv4Addr = Ipv4Addr::new(169, 254, 169, 254);
/// The ECS task metadata and credentials endpoint, and the EKS Pod Identity agent.
const CREDENTIAL_AGENTS_V4: [Ipv4Addr; 2] = [
    Ipv4Addr::new(169, 254, 170, 2),
    Ipv4Addr::new(169, 254, 170, 23),
];
/// `fd00:ec2::/64`: AWS's instance-local services (IMDS `::254`, DNS `::253`, NTP
/// `::123`, the EKS Pod Identity agent `::23`).
const AWS_LOCAL_V6_PREFIX: [u16; 4] = [0xfd00, 0x0ec2, 0, 0];

/// Check `host` (a URL's host: a name, an IPv4 address or a bracketed IPv6 address) at
/// parse time: IP literals must be canonical and pass [`check_ip`]; names must be host
/// names (`localhost` and `*.localhost` count as loopback). Other names are resolved and
/// checked at connect time ([`AddressPolicy`]).
///
/// # Errors
/// [`AddressError`] naming the rule.
pub fn check_host(host: &str, allow_loopback: bool) -> Result<(), AddressError> {
    if let Some(inner) = host.strip_prefix('[') {
        let inner = inner.strip_suffix(']').unwrap_or(inner);
        return match inner.parse::<Ipv6Addr>() {
            Ok(v6) => check_ip(IpAddr::V6(v6), allow_loopback),
            Err(_) => Err(AddressError::NonCanonical {
                host: host.to_string(),
                reads_as: None,
            }),
        };
    }
    if let Ok(v4) = host.parse::<Ipv4Addr>() {
        return check_ip(IpAddr::V4(v4), allow_loopback);
    }
    let name = host.to_ascii_lowercase();
    if ends_in_number(&name) {
        return Err(AddressError::NonCanonical {
            host: host.to_string(),
            reads_as: inet_aton(name.trim_end_matches('.')),
        });
    }
    if !is_host_name(&name) {
        return Err(AddressError::NotAHostName(host.to_string()));
    }
    let name = name.trim_end_matches('.');
    if name == "localhost" || name.ends_with(".localhost") {
        return if allow_loopback {
            Ok(())
        } else {
            Err(AddressError::Loopback)
        };
    }
    Ok(())
}

/// The rules on one address, without the gateway-listener rule (which needs the port):
/// metadata and credential agents, link-local, and loopback or unspecified unless
/// `allow_loopback`.
///
/// # Errors
/// [`AddressError`] naming the rule.
pub fn check_ip(ip: IpAddr, allow_loopback: bool) -> Result<(), AddressError> {
    let shown = ip;
    let ip = embedded_v4(ip).map_or(ip, IpAddr::V4);
    match ip {
        IpAddr::V4(v4) if v4 == METADATA_V4 || CREDENTIAL_AGENTS_V4.contains(&v4) => {
            Err(AddressError::Metadata(shown))
        }
        IpAddr::V6(v6) if v6.segments()[..4] == AWS_LOCAL_V6_PREFIX => {
            Err(AddressError::Metadata(shown))
        }
        IpAddr::V4(v4) if v4.is_link_local() => Err(AddressError::LinkLocal(shown)),
        IpAddr::V6(v6) if v6.is_unicast_link_local() => Err(AddressError::LinkLocal(shown)),
        _ if is_own_host_literal(ip) && !allow_loopback => Err(AddressError::Loopback),
        _ => Ok(()),
    }
}

/// The IPv4 address an IPv6 address carries for routing purposes: IPv4-mapped
/// (`::ffff:a.b.c.d`) and the NAT64 well-known prefix (`64:ff9b::/96`).
fn embedded_v4(ip: IpAddr) -> Option<Ipv4Addr> {
    let IpAddr::V6(v6) = ip else { return None };
    if let Some(v4) = v6.to_ipv4_mapped() {
        return Some(v4);
    }
    let s = v6.segments();
    (s[..6] == [0x64, 0xff9b, 0, 0, 0, 0])
        .then(|| Ipv4Addr::from(((u32::from(s[6])) << 16) | u32::from(s[7])))
}

/// Loopback or unspecified (connecting to `0.0.0.0` reaches the own host).
fn is_own_host_literal(ip: IpAddr) -> bool {
    ip.is_loopback() || ip.is_unspecified()
}

/// WHATWG URL "ends in a number": the last label (after an optional trailing dot) is
/// decimal digits or `0x` followed by hex digits, so resolvers read the host as IPv4.
fn ends_in_number(name: &str) -> bool {
    let name = name.strip_suffix('.').unwrap_or(name);
    let last = name.rsplit('.').next().unwrap_or(name);
    if !last.is_empty() && last.bytes().all(|b| b.is_ascii_digit()) {
        return true;
    }
    last.strip_prefix("0x")
        .is_some_and(|hex| hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The address `inet_aton` reads `text` as: one to four parts, each decimal, octal
/// (leading `0`) or hex (`0x`), the last filling the remaining bytes.
fn inet_aton(text: &str) -> Option<Ipv4Addr> {
    let parts: Vec<&str> = text.split('.').collect();
    if parts.is_empty() || parts.len() > 4 {
        return None;
    }
    let mut values = Vec::with_capacity(parts.len());
    for p in &parts {
        let (digits, radix) = if let Some(h) = p.strip_prefix("0x") {
            (h, 16)
        } else if p.len() > 1 && p.starts_with('0') {
            (&p[1..], 8)
        } else {
            (*p, 10)
        };
        let v = if digits.is_empty() && radix == 16 {
            0
        } else {
            u32::from_str_radix(digits, radix).ok()?
        };
        values.push(v);
    }
    let (last, head) = values.split_last()?;
    let mut addr: u32 = 0;
    for (i, v) in head.iter().enumerate() {
        if *v > 0xff {
            return None;
        }
        addr |= v << (24 - 8 * i);
    }
    let rest_bits = 32 - 8 * head.len() as u32;
    if rest_bits < 32 && *last >= (1u32 << rest_bits) {
        return None;
    }
    Some(Ipv4Addr::from(addr | last))
}

/// Letters, digits, `-` and `_` in dot-separated labels of 1–63 characters, 253 in all
/// (a trailing dot allowed).
fn is_host_name(name: &str) -> bool {
    let name = name.strip_suffix('.').unwrap_or(name);
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            (1..=63).contains(&label.len())
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

/// The connect-time address policy of one upstream client: the rules of [`check_ip`]
/// plus the gateway's own listeners, checked on every resolved address and on every
/// new connection's peer ([`crate::net::client`]). Cheap to clone (shared).
#[derive(Clone, Debug, Default)]
pub struct AddressPolicy {
    inner: Arc<PolicyInner>,
}

#[derive(Debug, Default)]
struct PolicyInner {
    allow_loopback: bool,
    listeners: RwLock<Vec<SocketAddr>>,
}

impl AddressPolicy {
    /// A policy that allows loopback upstreams when `allow_loopback`
    /// (`gateway.allow_loopback_upstreams`, or `true` for spillway's own processes).
    /// No listener is known until [`Self::set_gateway_listeners`].
    pub fn new(allow_loopback: bool) -> Self {
        Self {
            inner: Arc::new(PolicyInner {
                allow_loopback,
                listeners: RwLock::new(Vec::new()),
            }),
        }
    }

    /// Whether loopback upstreams are allowed.
    pub fn allows_loopback(&self) -> bool {
        self.inner.allow_loopback
    }

    /// Record the gateway's bound listen addresses (proxy, admin, TLS; the real ports
    /// when configured with port 0): never connected to afterwards.
    pub fn set_gateway_listeners(&self, listeners: &[SocketAddr]) {
        *self.inner.listeners.write() = listeners.to_vec();
    }

    /// The address rules of [`check_ip`] on `ip` (resolution: the port is not known).
    ///
    /// # Errors
    /// [`AddressError`] naming the rule.
    pub fn check_ip(&self, ip: IpAddr) -> Result<(), AddressError> {
        check_ip(ip, self.inner.allow_loopback)
    }

    /// Every rule on a socket address about to be (or just) connected to: [`check_ip`],
    /// then the gateway's own listeners (a listener on `0.0.0.0`/`[::]` matches every
    /// address of this host with its port).
    ///
    /// # Errors
    /// [`AddressError`] naming the rule.
    pub fn check(&self, addr: SocketAddr) -> Result<(), AddressError> {
        self.check_ip(addr.ip())?;
        self.check_listeners(addr, None)
    }

    /// [`Self::check`] on a connection's peer, with its local address: a peer equal to
    /// the local address is this host.
    ///
    /// # Errors
    /// [`AddressError`] naming the rule.
    pub fn check_peer(&self, peer: SocketAddr, local: SocketAddr) -> Result<(), AddressError> {
        self.check_ip(peer.ip())?;
        self.check_listeners(peer, Some(local))
    }

    fn check_listeners(
        &self,
        addr: SocketAddr,
        local: Option<SocketAddr>,
    ) -> Result<(), AddressError> {
        let listeners = self.inner.listeners.read();
        let ip = canonical(addr.ip());
        for l in listeners.iter().filter(|l| l.port() == addr.port()) {
            let lip = canonical(l.ip());
            let hit = if lip.is_unspecified() {
                is_own_host_literal(ip)
                    || local.is_some_and(|local| canonical(local.ip()) == ip)
                    || is_local_address(ip)
            } else {
                lip == ip || (ip.is_unspecified() && lip.is_loopback())
            };
            if hit {
                return Err(AddressError::GatewayListener(addr));
            }
        }
        Ok(())
    }
}

/// IPv4-mapped IPv6 addresses as IPv4.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// Whether `ip` is assigned to this host: binding a UDP socket to it succeeds only then.
/// Asked only for addresses whose port is a gateway listener's.
fn is_local_address(ip: IpAddr) -> bool {
    std::net::UdpSocket::bind(SocketAddr::new(ip, 0)).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_credential_agents_and_link_local_always_refused_loopback_only_with_opt_in() {
        for host in [
            "169.254.169.254",
            "[fd00:ec2::254]",
            "[::ffff:169.254.169.254]",
            "[64:ff9b::a9fe:a9fe]",
            "169.254.170.2",
            "169.254.170.23",
            "[fd00:ec2::23]",
            "[fd00:ec2::253]",
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
            "[::ffff:127.0.0.1]",
        ] {
            assert_eq!(
                check_host(host, false),
                Err(AddressError::Loopback),
                "{host}"
            );
            assert_eq!(check_host(host, true), Ok(()), "{host}");
        }
        for host in [
            "10.0.0.5",
            "api.example.com",
            "[2001:db8::1]",
            "[fd00:ec3::1]",
            "my_vm-3.internal.",
            "1.2.3.4.nip.io",
        ] {
            assert_eq!(check_host(host, false), Ok(()), "{host}");
        }
    }

    #[test]
    fn non_canonical_ipv4_spellings_are_refused_with_what_they_read_as() {
        for (host, reads_as) in [
            ("2130706433", Some([127, 0, 0, 1])),
            ("0x7f.1", Some([127, 0, 0, 1])),
            ("127.1", Some([127, 0, 0, 1])),
            ("0177.0.0.1", Some([127, 0, 0, 1])),
            ("0x7F000001", Some([127, 0, 0, 1])),
            ("169.254.43518", Some([169, 254, 169, 254])),
            ("127.0.0.1.", Some([127, 0, 0, 1])),
            ("10.0.0.010", Some([10, 0, 0, 8])),
            ("0", Some([0, 0, 0, 0])),
            ("256.1.1.1", None),
            ("example.123", None),
        ] {
            // The opt-in changes nothing: the text is refused, not the address.
            let err = check_host(host, true).unwrap_err();
            assert_eq!(
                err,
                AddressError::NonCanonical {
                    host: host.to_string(),
                    reads_as: reads_as.map(Ipv4Addr::from),
                },
                "{host}"
            );
            if let Some(ip) = reads_as {
                assert!(
                    err.to_string().contains(&Ipv4Addr::from(ip).to_string()),
                    "{err}"
                );
            }
        }
    }

    #[test]
    fn hosts_that_are_not_host_names_are_refused() {
        for host in ["a..b", "a b", "x!y", "", "[::1%25lo]", &"a".repeat(64)] {
            assert!(
                matches!(
                    check_host(host, true),
                    Err(AddressError::NotAHostName(_) | AddressError::NonCanonical { .. })
                ),
                "{host:?}"
            );
        }
    }

    #[test]
    fn listeners_are_refused_even_with_loopback_allowed_including_unspecified_binds() {
        let policy = AddressPolicy::new(true);
        let addr = |s: &str| s.parse::<SocketAddr>().unwrap();
        policy.set_gateway_listeners(&[addr("127.0.0.1:27300"), addr("0.0.0.0:27301")]);
        for refused in [
            "127.0.0.1:27300",
            "0.0.0.0:27300",
            "[::ffff:127.0.0.1]:27300",
            "127.0.0.1:27301",
            "127.0.0.2:27301",
            "[::1]:27301",
            "0.0.0.0:27301",
        ] {
            assert_eq!(
                policy.check(addr(refused)),
                Err(AddressError::GatewayListener(addr(refused))),
                "{refused}"
            );
        }
        // Other ports of the own host, other hosts on the listener's port: allowed.
        for allowed in ["127.0.0.1:27302", "127.0.0.2:27300", "192.0.2.5:27301"] {
            assert_eq!(policy.check(addr(allowed)), Ok(()), "{allowed}");
        }
        // A peer on this host seen from the connection: its local address.
        assert!(
            policy
                .check_peer(addr("10.9.8.7:27301"), addr("10.9.8.7:40000"))
                .is_err()
        );
        // Without the opt-in, loopback is refused first.
        let strict = AddressPolicy::new(false);
        assert_eq!(
            strict.check(addr("127.0.0.1:8080")),
            Err(AddressError::Loopback)
        );
        assert_eq!(strict.check(addr("10.0.0.5:8080")), Ok(()));
    }
}
