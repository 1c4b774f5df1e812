//! `queue:` — the gateway queue (call scheduling §4; `crate::policy::sched`): calls that
//! find no VM slot (`vm_pool.slots_per_vm`) and no function capacity wait here, in the
//! configured order, instead of getting 503 at once.

use serde::{Deserialize, Serialize};
use std::num::NonZeroUsize;

use super::duration::{Millis, Seconds};
use super::issues::Issues;
use crate::policy::core::DEFAULT_MAX_ROUTE_KEYS;
use crate::policy::sched::{Order, SchedParams};

/// Default most waiting calls.
pub const DEFAULT_MAX_QUEUE_LENGTH: NonZeroUsize = NonZeroUsize::new(1000).unwrap();
/// Default longest wait, seconds.
pub const DEFAULT_MAX_QUEUE_WAIT_SECONDS: Seconds = Seconds::from_secs(30);
/// Default `E[p]` before any call completed, ms.
pub const DEFAULT_PROCESSING_MS: Millis<MAX_PROCESSING_MS> = Millis::from_ms(100);
/// Upper bound of `default_processing_ms`: one hour, ms.
pub const MAX_PROCESSING_MS: u64 = 3_600_000;
/// Default fair-choice window T, seconds (call scheduling §4: "e.g. 60 s").
pub const DEFAULT_FAIR_CHOICE_WINDOW_SECONDS: Seconds = Seconds::from_secs(60);

/// `queue:` — present: calls wait; absent: 503 at once.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct QueueConfig {
    /// `fifo`, `sept`, `eect`, `rect` or `fair_choice` (call scheduling §4).
    pub order: Order,
    /// Most waiting calls; one more gets 503 with `Retry-After`.
    pub max_queue_length: NonZeroUsize,
    /// Longest wait, seconds; then 503 with `Retry-After`.
    pub max_queue_wait_seconds: Seconds,
    /// `E[p]` before any call completed, ms (at most [`MAX_PROCESSING_MS`]).
    pub default_processing_ms: Millis<MAX_PROCESSING_MS>,
    /// Fair choice's T: a key's arrivals counted over this window, seconds.
    pub fair_choice_window_seconds: Seconds,
    /// Most route keys (configured routes, keys from first path segments, `other`);
    /// further paths count as `other`.
    pub max_route_keys: usize,
}

impl Default for QueueConfig {
    fn default() -> Self {
        Self {
            order: Order::Fifo,
            max_queue_length: DEFAULT_MAX_QUEUE_LENGTH,
            max_queue_wait_seconds: DEFAULT_MAX_QUEUE_WAIT_SECONDS,
            default_processing_ms: DEFAULT_PROCESSING_MS,
            fair_choice_window_seconds: DEFAULT_FAIR_CHOICE_WINDOW_SECONDS,
            max_route_keys: DEFAULT_MAX_ROUTE_KEYS,
        }
    }
}

impl QueueConfig {
    /// Semantic checks, each problem with its field path.
    pub fn validate(&self, is: &mut Issues) {
        is.nonzero_duration("queue.max_queue_wait_seconds", self.max_queue_wait_seconds);
        is.nonzero_duration("queue.default_processing_ms", self.default_processing_ms);
        is.nonzero_duration(
            "queue.fair_choice_window_seconds",
            self.fair_choice_window_seconds,
        );
        if !(2..=10_000).contains(&self.max_route_keys) {
            is.push(
                "queue.max_route_keys",
                format!("must be in [2, 10000], got {}", self.max_route_keys),
            );
        }
    }

    /// The policy's parameters (call after validation).
    pub fn params(&self) -> SchedParams {
        SchedParams {
            order: self.order,
            max_queue_length: self.max_queue_length.get(),
            max_queue_wait: self.max_queue_wait_seconds.get(),
            default_processing: self.default_processing_ms.get(),
            fair_choice_window: self.fair_choice_window_seconds.get(),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::{Config, ConfigError};
    use crate::policy::sched::Order;
    use std::time::Duration;

    fn issues(yaml: &str) -> Vec<String> {
        match Config::from_yaml(yaml, "q.yaml") {
            Ok(_) => Vec::new(),
            Err(ConfigError::Invalid { issues, .. }) => issues
                .iter()
                .map(|i| {
                    let at = i.location.map_or("-".into(), |l| l.to_string());
                    format!("{at} {}: {}", i.path, i.message)
                })
                .collect(),
            Err(e) => vec![e.to_string()],
        }
    }

    #[test]
    fn queue_routes_and_slots_are_read_and_mapped() {
        let c = Config::from_yaml(
            "vm_pool: {type: static, urls: [\"http://192.0.2.1:1\"], slots_per_vm: 3}\n\
             queue: {order: fair_choice, max_queue_length: 7, max_queue_wait_seconds: 2.5,\n  \
             default_processing_ms: 40, fair_choice_window_seconds: 90}\n\
             routes:\n  - {name: thumb, path_prefix: /api/thumb, methods: [GET]}\n",
            "q.yaml",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.slots_per_vm(), Some(3));
        let p = c.queue_params().unwrap();
        assert_eq!(p.order, Order::FairChoice);
        assert_eq!(p.max_queue_length, 7);
        assert_eq!(p.max_queue_wait, Duration::from_millis(2500));
        assert_eq!(p.default_processing, Duration::from_millis(40));
        assert_eq!(p.fair_choice_window, Duration::from_secs(90));
        assert_eq!(c.route_defs()[0].methods, ["GET"]);
        // Absent queue: no queue; the deprecated alias still sets the slots.
        let c = Config::from_yaml("libra: {max_outstanding_per_vm: 5}\n", "q.yaml").unwrap();
        assert_eq!((c.queue_params(), c.slots_per_vm()), (None, Some(5)));
    }

    #[test]
    fn bad_queue_and_route_settings_are_reported_at_their_place() {
        let got = issues(
            "libra: {max_outstanding_per_vm: 4}\n\
             vm_pool: {type: static, urls: [], slots_per_vm: 2}\n\
             queue:\n  order: lifo\n  max_queue_length: 0\n  max_queue_wait_seconds: -1\n\
             routes:\n  - {name: other, path_prefix: api}\n  - {name: a, path_prefix: /a, methods: [get]}\n",
        );
        let want = [
            "1:33 libra.max_outstanding_per_vm: deprecated alias of vm_pool.slots_per_vm",
            "4:10 queue.order: `lifo` is not a known value",
            "5:21 queue.max_queue_length: expected a whole number ≥ 1, found 0",
            "6:27 queue.max_queue_wait_seconds: expected a number of seconds from 0 to 31536000 (one year), found `-1`",
            "8:12 routes[0].name: `other` is reserved",
            "8:32 routes[0].path_prefix: must start with '/'",
            "9:42 routes[1].methods[0]: must be an upper-case method name",
        ];
        assert_eq!(got.len(), want.len(), "{got:#?}");
        for w in want {
            assert!(got.iter().any(|g| g.starts_with(w)), "{w}\nin {got:#?}");
        }
    }
}
