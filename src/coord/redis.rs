//! The Redis [`Store`]: the `redis` crate's reconnecting [`ConnectionManager`] (tokio),
//! one Lua script per operation so that each is one atomic round trip.
//!
//! Keys, all under `spillway:{CLUSTER}:` (one hash tag, so a Redis Cluster keeps them on
//! one node):
//!
//! | key | type | written by | what |
//! |---|---|---|---|
//! | `leader` | string `replica:term`, `PX lease_ms` | the lease holder | the lease (`SET NX PX`, compare-and-renew, compare-and-delete) |
//! | `term` | integer | `INCR` on every grant | the fencing token |
//! | `counts:EPOCH` | hash replica → requests, expires | every replica | absolute counts: a retry writes the same value |
//! | `last` | hash replica → `epoch:requests` | every replica | its latest count (imputation) |
//! | `heartbeats` | sorted set replica → ms | every replica | live replicas |
//! | `addresses` | hash replica → `TAG URL` | replicas with asynchronous calls | where a call id's owner tag is looked up (dropped with the heartbeat) |
//! | `state` | string (JSON [`Published`]) | the leader, fenced | decision, EWMAs, shares, registry; followers `GET` it between rounds |
//! | `intents` | list (JSON [`Intent`]), last 1000 | the leader, fenced | pool writes, recorded before they are made |
//! | `open_intents` | hash `term:op:vm` ([`Intent::id`]) → JSON [`Intent`] | the leader, fenced; `HDEL` once settled | pool writes whose outcome is not recorded yet (a new leader replays those of earlier terms) |
//! | `refused` | integer | the scripts | fenced writes refused for an old term |
//!
//! A fenced write checks in the same script that the `leader` key still holds the
//! writer's `replica:term`; a leader whose lease expired or was taken writes nothing.
//! Per-operation deadlines are the coordinator's (`tokio::time::timeout`); the
//! connection manager's own response and connect timeouts are set to the same value so
//! that a dead connection is dropped and re-made rather than waited on.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Client, Script};

use super::store::{
    CallAddress, Exchange, Intent, LeaderKey, Published, Report, Store, StoreError,
};
use crate::backends::BoxFuture;

const EXCHANGE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local replica = ARGV[1]
local window = tonumber(ARGV[2])
local n = #KEYS - 7
for i = 1, n do
  redis.call('HSET', KEYS[7 + i], replica, ARGV[3 + i])
  redis.call('PEXPIRE', KEYS[7 + i], ARGV[3])
end
local last = ARGV[4 + n]
local address = ARGV[5 + n]
if last ~= '' then
  local old = redis.call('HGET', KEYS[2], replica)
  local new_epoch = tonumber(string.match(last, '^(%d+):'))
  if (not old) or tonumber(string.match(old, '^(%d+):')) <= new_epoch then
    redis.call('HSET', KEYS[2], replica, last)
  end
end
redis.call('ZADD', KEYS[1], now, replica)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - 100 * window)
if address ~= '' then
  redis.call('HSET', KEYS[7], replica, address)
end
local addresses = redis.call('HGETALL', KEYS[7])
for i = 1, #addresses, 2 do
  if not redis.call('ZSCORE', KEYS[1], addresses[i]) then
    redis.call('HDEL', KEYS[7], addresses[i])
  end
end
local live = redis.call('ZRANGEBYSCORE', KEYS[1], now - window, '+inf', 'WITHSCORES')
local leader = redis.call('GET', KEYS[3]) or ''
local term = redis.call('GET', KEYS[4]) or '0'
local state = redis.call('GET', KEYS[5]) or ''
local counts = redis.call('HGETALL', KEYS[6])
local lasts = redis.call('HGETALL', KEYS[2])
addresses = redis.call('HGETALL', KEYS[7])
return {tostring(now), leader, term, state, live, counts, lasts, addresses}
";

const ACQUIRE: &str = r"
if not redis.call('SET', KEYS[1], 'pending', 'NX', 'PX', ARGV[2]) then return -1 end
local term = redis.call('INCR', KEYS[2])
local floor = tonumber(ARGV[3])
if term <= floor then
  term = floor + 1
  redis.call('SET', KEYS[2], term)
end
redis.call('SET', KEYS[1], ARGV[1] .. ':' .. term, 'PX', ARGV[2])
return term
";

const RENEW: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
";

const RELEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
";

const PUBLISH: &str = r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  redis.call('INCR', KEYS[3])
  return 0
end
redis.call('SET', KEYS[2], ARGV[2])
return 1
";

const INTENT: &str = r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  redis.call('INCR', KEYS[3])
  return 0
end
redis.call('RPUSH', KEYS[2], ARGV[2])
redis.call('LTRIM', KEYS[2], -1000, -1)
redis.call('HSET', KEYS[4], ARGV[3], ARGV[2])
return 1
";

/// The Redis store. See the [module docs](self).
pub struct RedisStore {
    conn: ConnectionManager,
    prefix: String,
    exchange: Script,
    acquire: Script,
    renew: Script,
    release: Script,
    publish: Script,
    intent: Script,
}

impl RedisStore {
    /// A store on `url` for `cluster`; connects lazily (a Redis that is down at start
    /// is an error of the first operation, not of the gateway's start).
    ///
    /// # Errors
    /// An unreadable URL.
    pub fn new(url: &str, cluster: &str, op_timeout: Duration) -> Result<Self, redis::RedisError> {
        let client = Client::open(url)?;
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(op_timeout))
            .set_connection_timeout(Some(op_timeout))
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(20))
            .set_max_delay(op_timeout);
        let conn = ConnectionManager::new_lazy_with_config(client, config)?;
        Ok(Self {
            conn,
            prefix: format!("spillway:{{{cluster}}}:"),
            exchange: Script::new(EXCHANGE),
            acquire: Script::new(ACQUIRE),
            renew: Script::new(RENEW),
            release: Script::new(RELEASE),
            publish: Script::new(PUBLISH),
            intent: Script::new(INTENT),
        })
    }

    fn key(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }
}

fn redis_err(op: &'static str) -> impl FnOnce(redis::RedisError) -> StoreError {
    move |source| StoreError::Redis { op, source }
}

fn reply(op: &'static str, what: impl Into<String>) -> StoreError {
    StoreError::Reply {
        op,
        what: what.into(),
    }
}

fn pairs<T>(
    op: &'static str,
    flat: Vec<String>,
    mut value: impl FnMut(&str) -> Option<T>,
) -> Result<Vec<(String, T)>, StoreError> {
    if !flat.len().is_multiple_of(2) {
        return Err(reply(op, "a field without a value"));
    }
    let mut out = Vec::with_capacity(flat.len() / 2);
    let mut it = flat.into_iter();
    while let (Some(k), Some(v)) = (it.next(), it.next()) {
        let parsed = value(&v).ok_or_else(|| reply(op, format!("{k}: {v:?}")))?;
        out.push((k, parsed));
    }
    Ok(out)
}

type ExchangeReply = (
    String,
    String,
    String,
    String,
    Vec<String>,
    Vec<String>,
    Vec<String>,
    Vec<String>,
);

impl Store for RedisStore {
    fn kind(&self) -> &'static str {
        "redis"
    }

    fn time_ms(&self) -> BoxFuture<'_, Result<u64, StoreError>> {
        Box::pin(async move {
            let mut c = self.conn.clone();
            let (s, us): (u64, u64) = redis::cmd("TIME")
                .query_async(&mut c)
                .await
                .map_err(redis_err("time"))?;
            Ok(s * 1000 + us / 1000)
        })
    }

    fn exchange<'a>(&'a self, report: &'a Report) -> BoxFuture<'a, Result<Exchange, StoreError>> {
        Box::pin(async move {
            const OP: &str = "exchange";
            let mut inv = self.exchange.prepare_invoke();
            inv.key(self.key("heartbeats"))
                .key(self.key("last"))
                .key(self.key("leader"))
                .key(self.key("term"))
                .key(self.key("state"))
                .key(self.key(&format!("counts:{}", report.sum_epoch)))
                .key(self.key("addresses"));
            for (epoch, _) in &report.counts {
                inv.key(self.key(&format!("counts:{epoch}")));
            }
            inv.arg(&report.replica)
                .arg(report.live_window.as_millis() as u64)
                .arg(report.counts_ttl.as_millis().max(1) as u64);
            for (_, n) in &report.counts {
                inv.arg(*n);
            }
            inv.arg(
                report
                    .counts
                    .last()
                    .map_or(String::new(), |(e, n)| format!("{e}:{n}")),
            );
            inv.arg(
                report
                    .address
                    .as_ref()
                    .map_or(String::new(), CallAddress::value),
            );
            let mut c = self.conn.clone();
            let (now, leader, term, state, live, counts, last, addresses): ExchangeReply =
                inv.invoke_async(&mut c).await.map_err(redis_err(OP))?;
            let state = if state.is_empty() {
                None
            } else {
                Some(
                    serde_json::from_str::<Published>(&state)
                        .map_err(|e| reply(OP, format!("state: {e}")))?,
                )
            };
            Ok(Exchange {
                now_ms: now
                    .parse()
                    .map_err(|_| reply(OP, format!("time {now:?}")))?,
                leader: LeaderKey::parse(&leader),
                term: term
                    .parse()
                    .map_err(|_| reply(OP, format!("term {term:?}")))?,
                state,
                live: pairs(OP, live, |v| v.parse::<f64>().ok().map(|ms| ms as u64))?
                    .into_iter()
                    .collect(),
                counts: pairs(OP, counts, |v| v.parse().ok())?.into_iter().collect(),
                last: pairs(OP, last, |v| {
                    let (e, n) = v.split_once(':')?;
                    Some((e.parse().ok()?, n.parse().ok()?))
                })?
                .into_iter()
                .collect(),
                addresses: pairs(OP, addresses, CallAddress::parse)?
                    .into_iter()
                    .collect(),
            })
        })
    }

    fn acquire<'a>(
        &'a self,
        replica: &'a str,
        lease: Duration,
        min_term: u64,
    ) -> BoxFuture<'a, Result<Option<u64>, StoreError>> {
        Box::pin(async move {
            let mut c = self.conn.clone();
            let term: i64 = self
                .acquire
                .key(self.key("leader"))
                .key(self.key("term"))
                .arg(replica)
                .arg(lease.as_millis().max(1) as u64)
                .arg(min_term)
                .invoke_async(&mut c)
                .await
                .map_err(redis_err("acquire"))?;
            Ok(u64::try_from(term).ok())
        })
    }

    fn renew<'a>(
        &'a self,
        key: &'a LeaderKey,
        lease: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let mut c = self.conn.clone();
            let ok: i64 = self
                .renew
                .key(self.key("leader"))
                .arg(key.value())
                .arg(lease.as_millis().max(1) as u64)
                .invoke_async(&mut c)
                .await
                .map_err(redis_err("renew"))?;
            Ok(ok == 1)
        })
    }

    fn release<'a>(&'a self, key: &'a LeaderKey) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let mut c = self.conn.clone();
            let ok: i64 = self
                .release
                .key(self.key("leader"))
                .arg(key.value())
                .invoke_async(&mut c)
                .await
                .map_err(redis_err("release"))?;
            Ok(ok == 1)
        })
    }

    fn publication<'a>(
        &'a self,
        replica: &'a str,
    ) -> BoxFuture<'a, Result<Option<Published>, StoreError>> {
        let _ = replica;
        Box::pin(async move {
            const OP: &str = "publication";
            let mut c = self.conn.clone();
            let state: Option<String> = redis::cmd("GET")
                .arg(self.key("state"))
                .query_async(&mut c)
                .await
                .map_err(redis_err(OP))?;
            state
                .filter(|s| !s.is_empty())
                .map(|s| {
                    serde_json::from_str::<Published>(&s)
                        .map_err(|e| reply(OP, format!("state: {e}")))
                })
                .transpose()
        })
    }

    fn publish<'a>(
        &'a self,
        key: &'a LeaderKey,
        published: &'a Published,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let json = serde_json::to_string(published)
                .map_err(|e| reply("publish", format!("cannot encode: {e}")))?;
            let mut c = self.conn.clone();
            let ok: i64 = self
                .publish
                .key(self.key("leader"))
                .key(self.key("state"))
                .key(self.key("refused"))
                .arg(key.value())
                .arg(json)
                .invoke_async(&mut c)
                .await
                .map_err(redis_err("publish"))?;
            Ok(ok == 1)
        })
    }

    fn intent<'a>(
        &'a self,
        key: &'a LeaderKey,
        intent: &'a Intent,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let json = serde_json::to_string(intent)
                .map_err(|e| reply("intent", format!("cannot encode: {e}")))?;
            let mut c = self.conn.clone();
            let ok: i64 = self
                .intent
                .key(self.key("leader"))
                .key(self.key("intents"))
                .key(self.key("refused"))
                .key(self.key("open_intents"))
                .arg(key.value())
                .arg(json)
                .arg(intent.id())
                .invoke_async(&mut c)
                .await
                .map_err(redis_err("intent"))?;
            Ok(ok == 1)
        })
    }

    fn settle<'a>(&'a self, intent: &'a Intent) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let mut c = self.conn.clone();
            let _: i64 = redis::cmd("HDEL")
                .arg(self.key("open_intents"))
                .arg(intent.id())
                .query_async(&mut c)
                .await
                .map_err(redis_err("settle"))?;
            Ok(())
        })
    }

    fn open_intents(&self) -> BoxFuture<'_, Result<Vec<Intent>, StoreError>> {
        Box::pin(async move {
            const OP: &str = "open_intents";
            let mut c = self.conn.clone();
            let values: Vec<String> = redis::cmd("HVALS")
                .arg(self.key("open_intents"))
                .query_async(&mut c)
                .await
                .map_err(redis_err(OP))?;
            let mut open = values
                .iter()
                .map(|v| {
                    serde_json::from_str::<Intent>(v).map_err(|e| reply(OP, format!("{v:?}: {e}")))
                })
                .collect::<Result<Vec<Intent>, StoreError>>()?;
            open.sort_by_key(|i| i.term);
            Ok(open)
        })
    }
}
