//! Per-interval request statistics: outcome counters and an HDR latency histogram.
//!
//! Latency is measured from a request's *scheduled* send time to the end of its
//! response body, so any delay in sending (a slow generator, a full connection
//! pool) shows up as latency instead of being hidden (no coordinated omission).
//! Every request that got a response is recorded, whatever its status; requests
//! that failed without a response (connect error, timeout, overload, I/O error)
//! are counted but have no latency.

use std::time::Duration;

use hdrhistogram::Histogram;

/// How one scheduled request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// A full response arrived; `latency` is measured from the scheduled time.
    Response {
        /// HTTP status code.
        status: u16,
        /// Scheduled send time to end of body.
        latency: Duration,
    },
    /// The connection could not be established.
    Connect,
    /// No full response within `--timeout-seconds`.
    Timeout,
    /// Not sent: `--max-in-flight` requests were already outstanding.
    Overload,
    /// Any other transport failure (connection reset, malformed response, ...).
    Io,
}

/// Counters and latencies of a set of requests (an interval or the whole run).
#[derive(Clone, Debug)]
pub(crate) struct Stats {
    /// Requests scheduled (sent, or refused as overload).
    pub requests: u64,
    /// Responses with a 5xx status.
    pub http_5xx: u64,
    /// Responses with a status other than 2xx, 3xx or 5xx.
    pub http_other: u64,
    /// Connect errors.
    pub connect: u64,
    /// Timeouts.
    pub timeout: u64,
    /// Requests refused because `--max-in-flight` was reached.
    pub overload: u64,
    /// Other transport errors.
    pub io: u64,
    /// Latencies of all responses, in microseconds.
    pub latency_us: Histogram<u64>,
}

impl Default for Stats {
    fn default() -> Self {
        Self {
            requests: 0,
            http_5xx: 0,
            http_other: 0,
            connect: 0,
            timeout: 0,
            overload: 0,
            io: 0,
            // 3 significant digits, auto-resizing: no upper bound on latency.
            latency_us: Histogram::new(3).expect("3 significant figures is valid"),
        }
    }
}

impl Stats {
    /// Count one request's outcome.
    pub(crate) fn record(&mut self, outcome: Outcome) {
        self.requests += 1;
        match outcome {
            Outcome::Response { status, latency } => {
                let micros = u64::try_from(latency.as_micros())
                    .unwrap_or(u64::MAX)
                    .max(1);
                if self.latency_us.record(micros).is_err() {
                    // Only beyond what auto-resizing can track (~u64::MAX / 2 µs).
                    self.latency_us.saturating_record(micros);
                }
                match status {
                    200..=399 => {}
                    500..=599 => self.http_5xx += 1,
                    _ => self.http_other += 1,
                }
            }
            Outcome::Connect => self.connect += 1,
            Outcome::Timeout => self.timeout += 1,
            Outcome::Overload => self.overload += 1,
            Outcome::Io => self.io += 1,
        }
    }

    /// All errors: non-2xx/3xx responses plus requests without a response.
    pub(crate) fn errors(&self) -> u64 {
        self.http_5xx + self.http_other + self.connect + self.timeout + self.overload + self.io
    }

    /// Error counts by kind, in report order, as `(name, count)`.
    pub(crate) fn error_kinds(&self) -> [(&'static str, u64); 6] {
        [
            ("5xx", self.http_5xx),
            ("other_status", self.http_other),
            ("timeout", self.timeout),
            ("connect", self.connect),
            ("overload", self.overload),
            ("io", self.io),
        ]
    }

    /// The latency at quantile `q` (0..=1) in milliseconds; `None` without responses.
    pub(crate) fn quantile_ms(&self, q: f64) -> Option<f64> {
        (!self.latency_us.is_empty()).then(|| self.latency_us.value_at_quantile(q) as f64 / 1000.0)
    }

    /// Add `other`'s requests to these.
    pub(crate) fn merge(&mut self, other: &Stats) {
        self.requests += other.requests;
        self.http_5xx += other.http_5xx;
        self.http_other += other.http_other;
        self.connect += other.connect;
        self.timeout += other.timeout;
        self.overload += other.overload;
        self.io += other.io;
        self.latency_us
            .add(&other.latency_us)
            .expect("auto-resizing histograms always merge");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(status: u16, ms: u64) -> Outcome {
        Outcome::Response {
            status,
            latency: Duration::from_millis(ms),
        }
    }

    #[test]
    fn classifies_outcomes() {
        let mut s = Stats::default();
        for o in [
            response(200, 10),
            response(302, 10),
            response(503, 10),
            response(500, 10),
            response(404, 10),
            Outcome::Connect,
            Outcome::Timeout,
            Outcome::Overload,
            Outcome::Io,
        ] {
            s.record(o);
        }
        assert_eq!(s.requests, 9);
        assert_eq!((s.http_5xx, s.http_other), (2, 1));
        assert_eq!((s.connect, s.timeout, s.overload, s.io), (1, 1, 1, 1));
        assert_eq!(s.errors(), 7);
        assert_eq!(s.latency_us.len(), 5);
    }

    #[test]
    fn quantiles_in_milliseconds() {
        let mut s = Stats::default();
        assert_eq!(s.quantile_ms(0.5), None);
        for ms in 1..=100 {
            s.record(response(200, ms));
        }
        let p50 = s.quantile_ms(0.5).unwrap();
        let p99 = s.quantile_ms(0.99).unwrap();
        assert!((p50 - 50.0).abs() < 0.1, "{p50}");
        assert!((p99 - 99.0).abs() < 0.1, "{p99}");
    }

    #[test]
    fn merge_adds_everything() {
        let mut a = Stats::default();
        a.record(response(200, 5));
        a.record(Outcome::Timeout);
        let mut b = Stats::default();
        b.record(response(500, 50));
        a.merge(&b);
        assert_eq!((a.requests, a.errors(), a.latency_us.len()), (3, 2, 2));
    }
}
