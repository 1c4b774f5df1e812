//! Rate-limited warnings: a warning that repeats (every request failing the same way
//! during an outage, an endpoint that stays unreachable) is logged at most once per
//! [`WINDOW`] per kind; the next line that is logged says how many were left out in
//! its `suppressed` field.
//!
//! ```text
//! WARN request{request_id=…}: spillway::proxy::service: request failed status=502 error=… suppressed=41
//! ```
//!
//! Home-made rather than a crate: what is needed is a map from a kind to (time of the
//! last line, lines left out since), a few lines on a mutex, and the crates that exist
//! (`tracing-throttle` and the like) drop lines without counting them in the next one.
//! The clock (tokio's) is passed in, so that the rule is tested without waiting.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::Duration;

use tokio::time::Instant;

/// At most one line per kind in this long.
pub const WINDOW: Duration = Duration::from_secs(10);

/// Admits one line per kind per window and counts the rest. See the [module docs](self).
#[derive(Debug)]
pub struct LogLimiter<K> {
    window: Duration,
    kinds: parking_lot::Mutex<HashMap<K, Kind>>,
}

#[derive(Debug)]
struct Kind {
    logged_at: Instant,
    suppressed: u64,
}

impl<K: Eq + Hash> LogLimiter<K> {
    /// A limiter that admits one line per kind per `window`.
    pub fn new(window: Duration) -> Self {
        Self {
            window,
            kinds: parking_lot::Mutex::new(HashMap::new()),
        }
    }

    /// Whether a line of `kind` at `now` is logged: `Some(n)` with the `n` lines of that
    /// kind left out since the last one logged, `None` when this one is left out (and
    /// counted).
    pub fn admit(&self, kind: K, now: Instant) -> Option<u64> {
        let mut kinds = self.kinds.lock();
        match kinds.get_mut(&kind) {
            Some(k) if now.saturating_duration_since(k.logged_at) < self.window => {
                k.suppressed += 1;
                None
            }
            Some(k) => {
                let n = std::mem::take(&mut k.suppressed);
                k.logged_at = now;
                Some(n)
            }
            None => {
                kinds.insert(
                    kind,
                    Kind {
                        logged_at: now,
                        suppressed: 0,
                    },
                );
                Some(0)
            }
        }
    }
}

/// The process's limiter for warnings about requests and calls, keyed by a fixed name
/// and a status code (0 when there is none).
pub fn warnings() -> &'static LogLimiter<(&'static str, u16)> {
    static LIMITER: std::sync::OnceLock<LogLimiter<(&'static str, u16)>> =
        std::sync::OnceLock::new();
    LIMITER.get_or_init(|| LogLimiter::new(WINDOW))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_kind_per_window_and_the_next_counts_the_rest() {
        let l = LogLimiter::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert_eq!(l.admit("a", t0), Some(0));
        for i in 1..=7 {
            assert_eq!(l.admit("a", t0 + Duration::from_secs(i)), None);
        }
        // Another kind has its own window.
        assert_eq!(l.admit("b", t0 + Duration::from_secs(3)), Some(0));
        // After the window: logged, with the 7 left out.
        assert_eq!(l.admit("a", t0 + Duration::from_secs(10)), Some(7));
        assert_eq!(l.admit("a", t0 + Duration::from_secs(11)), None);
        assert_eq!(l.admit("a", t0 + Duration::from_secs(25)), Some(1));
        assert_eq!(l.admit("b", t0 + Duration::from_secs(25)), Some(0));
    }
}
