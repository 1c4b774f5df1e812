//! The open-loop send schedule: when, relative to the start of the run, each
//! request is due.
//!
//! The `n` requests of replayed second `i` are spread evenly over that second,
//! at trace times `i + k/n` for `k = 0..n`; with time compression `C` a trace
//! second lasts `1/C` real seconds, so request `k` is due `(i + k/n) / C` real
//! seconds after the start.

use std::time::Duration;

/// Real-time offset from the start of the run at which trace time `trace_secs`
/// (seconds since the first replayed second, possibly fractional) falls.
pub(crate) fn trace_to_real(trace_secs: f64, compression: f64) -> Duration {
    Duration::from_secs_f64(trace_secs / compression)
}

/// Real-time offsets of the `n` requests of replayed second `second` (0 = the
/// first replayed second), in sending order.
pub(crate) fn send_offsets(
    second: u64,
    n: u64,
    compression: f64,
) -> impl Iterator<Item = Duration> {
    (0..n).map(move |k| trace_to_real(second as f64 + k as f64 / n as f64, compression))
}

/// Interval `[start, end)` of replayed seconds (relative to the first replayed
/// second) that relative second `second` belongs to, for intervals of `len`
/// seconds clipped to a replay of `total` seconds.
pub(crate) fn interval_of(second: u64, len: u64, total: u64) -> (u64, u64) {
    let start = second / len * len;
    (start, (start + len).min(total))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn millis(offsets: impl Iterator<Item = Duration>) -> Vec<f64> {
        offsets.map(|d| d.as_secs_f64() * 1000.0).collect()
    }

    fn assert_close(actual: &[f64], expected: &[f64]) {
        assert_eq!(actual.len(), expected.len(), "{actual:?} vs {expected:?}");
        for (a, e) in actual.iter().zip(expected) {
            assert!((a - e).abs() < 1e-6, "{actual:?} vs {expected:?}");
        }
    }

    #[test]
    fn uncompressed_second_is_evenly_spaced() {
        assert_close(
            &millis(send_offsets(0, 4, 1.0)),
            &[0.0, 250.0, 500.0, 750.0],
        );
        assert_close(&millis(send_offsets(2, 2, 1.0)), &[2000.0, 2500.0]);
        assert_close(&millis(send_offsets(0, 1, 1.0)), &[0.0]);
        assert_eq!(send_offsets(5, 0, 1.0).count(), 0);
    }

    #[test]
    fn compression_shrinks_the_second() {
        // Second 1 at 10x lasts 100 ms starting at 100 ms.
        assert_close(
            &millis(send_offsets(1, 5, 10.0)),
            &[100.0, 120.0, 140.0, 160.0, 180.0],
        );
        assert_close(
            &millis(send_offsets(3, 3, 2.0)),
            &[1500.0, 1_666.666_666_7, 1_833.333_333_3],
        );
    }

    #[test]
    fn offsets_stay_inside_their_second() {
        for n in [1, 7, 100, 9999] {
            let offs: Vec<Duration> = send_offsets(4, n, 3.0).collect();
            assert!(offs.windows(2).all(|w| w[0] < w[1]));
            assert!(offs[0] >= trace_to_real(4.0, 3.0));
            assert!(*offs.last().unwrap() < trace_to_real(5.0, 3.0));
        }
    }

    #[test]
    fn intervals_are_clipped_to_the_replay() {
        assert_eq!(interval_of(0, 60, 150), (0, 60));
        assert_eq!(interval_of(59, 60, 150), (0, 60));
        assert_eq!(interval_of(60, 60, 150), (60, 120));
        assert_eq!(interval_of(149, 60, 150), (120, 150));
        assert_eq!(interval_of(3, 1, 5), (3, 4));
    }
}
