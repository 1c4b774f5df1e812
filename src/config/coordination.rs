//! `coordination:` — several gateway replicas, one decision (`crate::coord`): `type:
//! none` (one gateway, the default) or `type: redis` (the replicas share epoch counts,
//! a fenced scaling leader and one VM-pool writer through a Redis server).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::duration::{Millis, Seconds};
use super::issues::Issues;
use super::url::HttpUrl;

/// Default lease of the scaling leader, milliseconds.
pub const DEFAULT_LEASE_MS: u64 = 3000;
/// Default epochs a replica keeps its last share after losing the store, before it runs
/// on local decisions.
pub const DEFAULT_GRACE_EPOCHS: u32 = 3;
/// Default cluster (pool) name.
pub const DEFAULT_CLUSTER: &str = "spillway";

/// `coordination:`. Written with `type:` (`none`, `redis`); read through
/// [`CoordinationSection`] so that every key keeps its place in error messages.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", from = "CoordinationSection")]
pub enum CoordinationConfig {
    /// One gateway: every decision is local (exactly the behaviour without the section).
    None(NoCoordinationConfig),
    /// Replicas coordinated through Redis.
    Redis(RedisCoordinationConfig),
}

impl Default for CoordinationConfig {
    fn default() -> Self {
        CoordinationConfig::None(NoCoordinationConfig {})
    }
}

/// How `coordination` is read (see `VmPoolSection`).
#[derive(Deserialize)]
#[serde(rename = "type", rename_all = "snake_case")]
#[doc(hidden)]
pub enum CoordinationSection {
    /// `type: none`.
    None(NoCoordinationConfig),
    /// `type: redis`.
    Redis(RedisCoordinationConfig),
}

impl From<CoordinationSection> for CoordinationConfig {
    fn from(s: CoordinationSection) -> Self {
        match s {
            CoordinationSection::None(n) => CoordinationConfig::None(n),
            CoordinationSection::Redis(r) => CoordinationConfig::Redis(r),
        }
    }
}

/// `coordination: {type: none}`: no keys.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoCoordinationConfig {}

/// `coordination: {type: redis}`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisCoordinationConfig {
    /// The Redis server: `redis://[user:password@]host:port[/db]` or
    /// `unix:///path/to/redis.sock` (no TLS: keep it on a private network).
    pub url: String,
    /// The pool's name, the same on every replica: every key in Redis starts with
    /// `spillway:{cluster}:`, and it names the VM pool when `vm_pool.gateway_id` is not
    /// set.
    #[serde(default = "default_cluster")]
    pub cluster: String,
    /// The scaling leader's lease, milliseconds: renewed every epoch; a leader that
    /// cannot renew it within this long is replaced.
    #[serde(default = "default_lease_ms")]
    pub lease_ms: u64,
    /// Deadline of each store operation (one round trip), milliseconds; absent: a
    /// quarter epoch. A blocked connection never stalls the coordinator longer.
    #[serde(default)]
    pub op_timeout_ms: Option<u64>,
    /// Epochs a replica without the store keeps its last share before it runs on local
    /// decisions (share 1/N); also how long the leader waits before it reassigns a
    /// silent replica's share.
    #[serde(default = "default_grace_epochs")]
    pub grace_epochs: u32,
    /// The URL other replicas reach this replica's proxy listener at
    /// (`http://10.0.0.5:8080`), where they forward the status lookups of asynchronous
    /// calls this replica accepted; absent: `http://` and the bound `gateway.listen`
    /// address, which must then be a specific IP address (not `0.0.0.0` or `[::]`).
    #[serde(default)]
    pub advertise_url: Option<HttpUrl>,
}

fn default_cluster() -> String {
    DEFAULT_CLUSTER.into()
}
fn default_lease_ms() -> u64 {
    DEFAULT_LEASE_MS
}
fn default_grace_epochs() -> u32 {
    DEFAULT_GRACE_EPOCHS
}

impl CoordinationConfig {
    /// The Redis settings, when coordinated.
    pub fn redis(&self) -> Option<&RedisCoordinationConfig> {
        match self {
            CoordinationConfig::None(_) => None,
            CoordinationConfig::Redis(r) => Some(r),
        }
    }

    /// Semantic checks (`epoch` is `libra.epoch_seconds`).
    pub fn validate(&self, epoch_seconds: Seconds, is: &mut Issues) {
        let Some(r) = self.redis() else {
            return;
        };
        if let Some(p) = redis_url_problem(&r.url) {
            is.push("coordination.url", p);
        }
        let n = r.cluster.chars().count();
        if !(1..=64).contains(&n)
            || !r
                .cluster
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            is.push(
                "coordination.cluster",
                format!(
                    "must be 1-64 characters of letters, digits, '-', '_' or '.', got {:?}",
                    r.cluster
                ),
            );
        }
        let epoch = epoch_seconds.get();
        let epoch_ms = Millis::<{ u64::MAX }>::new(epoch);
        if r.lease_ms < 100 || r.lease_ms > 600_000 {
            is.push(
                "coordination.lease_ms",
                format!("must be in [100, 600000] milliseconds, got {}", r.lease_ms),
            );
        } else if Duration::from_millis(r.lease_ms) <= epoch {
            is.push(
                "coordination.lease_ms",
                format!(
                    "must be longer than one epoch (libra.epoch_seconds = {epoch_seconds} s): \
                     the leader renews it once per epoch, got {} ms",
                    r.lease_ms
                ),
            );
        }
        if let Some(t) = r.op_timeout_ms
            && (t == 0 || Duration::from_millis(t) >= epoch)
        {
            is.push(
                "coordination.op_timeout_ms",
                format!("must be at least 1 and shorter than one epoch ({epoch_ms} ms), got {t}"),
            );
        }
        if let Some(u) = &r.advertise_url
            && let Some(p) = advertise_url_problem(u)
        {
            is.push("coordination.advertise_url", p);
        }
        if r.grace_epochs == 0 || r.grace_epochs > 1000 {
            is.push(
                "coordination.grace_epochs",
                format!("must be in [1, 1000], got {}", r.grace_epochs),
            );
        }
    }
}

impl RedisCoordinationConfig {
    /// The per-operation deadline: `op_timeout_ms`, else a quarter of `epoch`.
    pub fn op_timeout(&self, epoch: Duration) -> Duration {
        self.op_timeout_ms
            .map_or(epoch / 4, Duration::from_millis)
            .max(Duration::from_millis(1))
    }
}

/// What is wrong with an `advertise_url`, if anything: `http://HOST:PORT` with no path
/// beyond `/` (the replicas talk plain HTTP on their private network).
fn advertise_url_problem(advertise: &HttpUrl) -> Option<String> {
    let (u, url) = (advertise.uri(), advertise.as_str());
    if u.scheme_str() != Some("http") {
        return Some(format!(
            "must be an http:// URL (the replicas' plain listener), got {url:?}"
        ));
    }
    let Some(a) = u.authority() else {
        return Some(format!("has no host, got {url:?}"));
    };
    if a.port_u16().is_none() || a.as_str().contains('@') {
        return Some(format!(
            "must name a host and port and no user, got {url:?}"
        ));
    }
    if !matches!(u.path(), "" | "/") || u.query().is_some() {
        return Some(format!("must have no path or query, got {url:?}"));
    }
    None
}

/// What is wrong with a Redis URL, if anything (scheme and host; the redis crate parses
/// the rest when connecting).
fn redis_url_problem(url: &str) -> Option<String> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Some(format!(
            "must be a redis://host:port or unix:///path URL, got {url:?}"
        ));
    };
    match scheme {
        "rediss" | "valkeys" => Some(format!(
            "TLS to Redis is not built into this spillway: use redis:// on a private network \
             or a unix:/// socket, got {url:?}"
        )),
        "redis" | "valkey" => {
            let authority = rest.split('/').next().unwrap_or("");
            let host = authority.rsplit('@').next().unwrap_or("");
            if host.is_empty() {
                return Some(format!("has no host, got {url:?}"));
            }
            None
        }
        "unix" | "redis+unix" => {
            if rest.starts_with('/') {
                None
            } else {
                Some(format!(
                    "a unix URL needs an absolute socket path, got {url:?}"
                ))
            }
        }
        other => Some(format!(
            "unknown scheme {other:?} (redis or unix), got {url:?}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(yaml: &str) -> String {
        match crate::config::Config::from_yaml(yaml, "test.yaml") {
            Ok(_) => String::new(),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn the_default_is_one_gateway() {
        let c = crate::config::Config::default();
        assert!(c.coordination.redis().is_none());
    }

    #[test]
    fn a_redis_section_reads_with_its_defaults() {
        let c = crate::config::Config::from_yaml(
            "coordination:\n  type: redis\n  url: redis://127.0.0.1:6379/\n",
            "test.yaml",
        )
        .expect("valid");
        let r = c.coordination.redis().expect("redis");
        assert_eq!(r.cluster, DEFAULT_CLUSTER);
        assert_eq!(r.lease_ms, DEFAULT_LEASE_MS);
        assert_eq!(r.grace_epochs, DEFAULT_GRACE_EPOCHS);
        assert_eq!(
            r.op_timeout(Duration::from_millis(1000)),
            Duration::from_millis(250),
            "a quarter epoch"
        );
    }

    #[test]
    fn bad_values_are_reported_at_their_key() {
        let text = &check(
            "libra:\n  epoch_seconds: 2\ncoordination:\n  type: redis\n  url: http://x\n  cluster: 'a b'\n  lease_ms: 1500\n  op_timeout_ms: 2000\n  grace_epochs: 0\n",
        );
        for key in [
            "coordination.url",
            "coordination.cluster",
            "coordination.lease_ms",
            "coordination.op_timeout_ms",
            "coordination.grace_epochs",
        ] {
            assert!(text.contains(key), "{key} in {text}");
        }
        assert!(text.contains("longer than one epoch"), "{text}");
    }

    #[test]
    fn asynchronous_routes_with_coordination_need_an_address_other_replicas_reach() {
        let routes = "routes:\n  - name: jobs\n    path_prefix: /jobs\n    async: prefer\n";
        let redis = "coordination:\n  type: redis\n  url: redis://127.0.0.1:6379/\n";
        // Listening on every address: which one do the others use?
        let every = "gateway:\n  listen: 0.0.0.0:8080\n";
        let text = check(&format!("{every}{routes}{redis}"));
        assert!(text.contains("coordination.advertise_url"), "{text}");
        assert!(text.contains("0.0.0.0"), "{text}");
        // A specific listen address, or an advertised URL: accepted.
        let listen = "gateway:\n  listen: 10.0.0.5:8080\n";
        assert_eq!(check(&format!("{listen}{routes}{redis}")), "");
        assert_eq!(
            check(&format!(
                "{every}{routes}{redis}  advertise_url: http://10.0.0.5:8080\n"
            )),
            ""
        );
        assert_eq!(check(&format!("{every}{redis}")), "");
        // Without asynchronous routes nothing is looked up across replicas.
        assert_eq!(check(redis), "");
        assert_eq!(check(routes), "");
    }

    #[test]
    fn an_ec2_pool_under_coordination_is_never_terminated_by_a_stopping_replica() {
        let pool = "vm_pool:\n  type: ec2\n  pool_name: api\n  image_id: ami-1\n  instance_type: t3.micro\n";
        let redis = "coordination:\n  type: redis\n  url: redis://127.0.0.1:6379/\n";
        let text = check(&format!("{pool}  on_shutdown: terminate\n{redis}"));
        assert!(
            text.contains("vm_pool.on_shutdown") && text.contains("refused with coordination"),
            "{text}"
        );
        assert_eq!(check(&format!("{pool}  on_shutdown: keep\n{redis}")), "");
        // One gateway alone may terminate its own pool.
        assert_eq!(check(&format!("{pool}  on_shutdown: terminate\n")), "");
    }

    #[test]
    fn advertise_url_forms() {
        let problem = |text: &str| advertise_url_problem(&text.parse().unwrap());
        assert_eq!(problem("http://10.0.0.5:8080"), None);
        assert_eq!(problem("http://gw-0.gw:8080/"), None);
        for bad in [
            "https://10.0.0.5:8443",
            "http://10.0.0.5",
            "http://u:p@10.0.0.5:8080",
            "http://10.0.0.5:8080/api",
        ] {
            assert!(problem(bad).is_some(), "{bad}");
        }
        let text = check(
            "coordination:\n  type: redis\n  url: redis://127.0.0.1:6379/\n  advertise_url: https://x:1\n",
        );
        assert!(text.contains("coordination.advertise_url"), "{text}");
    }

    #[test]
    fn an_ec2_pool_without_an_id_is_named_by_the_cluster() {
        let pool = "vm_pool:\n  type: ec2\n  pool_name: api\n  image_id: ami-1\n  instance_type: t3.micro\n";
        let c = crate::config::Config::from_yaml(
            &format!("{pool}coordination:\n  type: redis\n  url: redis://127.0.0.1:6379/\n  cluster: prod-eu\n"),
            "test.yaml",
        )
        .expect("valid");
        let Some(crate::config::VmPoolConfig::Ec2(e)) = &c.vm_pool else {
            panic!("ec2")
        };
        assert_eq!(e.gateway_id.as_deref(), Some("prod-eu"));
        let c = crate::config::Config::from_yaml(
            &format!("{pool}  gateway_id: shared\ncoordination:\n  type: redis\n  url: redis://127.0.0.1:6379/\n"),
            "test.yaml",
        )
        .expect("valid");
        assert_eq!(c.pool_name().as_deref(), Some("shared"), "its own id wins");
        let alone = crate::config::Config::from_yaml(pool, "test.yaml").expect("valid");
        assert_eq!(
            alone.pool_name(),
            None,
            "one gateway: the provider's default"
        );
    }

    #[test]
    fn url_forms() {
        assert_eq!(redis_url_problem("redis://127.0.0.1:6379/0"), None);
        assert_eq!(
            redis_url_problem("redis://user:pw@redis.example:6380"),
            None
        );
        assert!(redis_url_problem("rediss://redis.example:6380").is_some());
        assert_eq!(redis_url_problem("unix:///run/redis.sock"), None);
        assert!(redis_url_problem("unix://run/redis.sock").is_some());
        assert!(redis_url_problem("redis://").is_some());
        assert!(redis_url_problem("127.0.0.1:6379").is_some());
    }
}
