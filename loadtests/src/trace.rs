//! Per-second traces: parsing, `--from`/`--to` slicing and `--rate-divisor` scaling.
//!
//! A trace file holds one non-negative integer per line, the number of requests
//! arriving in that second (line 1 is second 0). Surrounding whitespace on a line,
//! a missing final newline and blank lines at the end of the file are accepted;
//! anything else is a [`ParseError`] naming the file, the line and the bad text.

use std::fmt;
use std::path::Path;

use anyhow::{Context, bail};

/// A malformed trace line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ParseError {
    /// The file (or other source) the text came from, as shown to the user.
    pub source_name: String,
    /// 1-based line number.
    pub line: usize,
    /// The offending line, trimmed.
    pub text: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}: expected a non-negative integer request count, found {:?}",
            self.source_name, self.line, self.text
        )
    }
}

impl std::error::Error for ParseError {}

/// Parse a trace's text. `source_name` is only used in error messages.
///
/// Blank lines are accepted only at the end of the text (after the last count);
/// a blank line between counts is an error, since reading it as zero would
/// silently shift every later second.
pub(crate) fn parse_trace(text: &str, source_name: &str) -> Result<Vec<u64>, ParseError> {
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    let used = lines
        .iter()
        .rposition(|l| !l.is_empty())
        .map_or(0, |i| i + 1);
    lines[..used]
        .iter()
        .enumerate()
        .map(|(i, line)| {
            line.parse::<u64>().map_err(|_| ParseError {
                source_name: source_name.to_owned(),
                line: i + 1,
                text: (*line).to_owned(),
            })
        })
        .collect()
}

/// Read and parse a trace file.
pub(crate) fn read_trace(path: &Path) -> anyhow::Result<Vec<u64>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read trace file {}", path.display()))?;
    Ok(parse_trace(&text, &path.display().to_string())?)
}

/// The half-open range `[from, to)` of trace seconds to replay. `to` defaults to
/// the trace length; an empty or out-of-range window is an error.
pub(crate) fn slice(trace: &[u64], from: Option<u64>, to: Option<u64>) -> anyhow::Result<&[u64]> {
    let len = trace.len() as u64;
    let from = from.unwrap_or(0);
    let to = to.unwrap_or(len);
    if to > len {
        bail!("--to {to} is past the end of the trace, which has {len} seconds");
    }
    if from >= to {
        bail!("empty window: --from {from} must be below --to {to} (trace has {len} seconds)");
    }
    Ok(&trace[from as usize..to as usize])
}

/// Divide every count by `divisor`, carrying fractions from second to second.
///
/// Second `i` gets `floor(S_i / D) - floor(S_{i-1} / D)` where `S_i` is the sum of
/// the counts up to and including second `i` — the same as accumulating `count / D`
/// and emitting the whole part each second, but without floating-point drift. The
/// last second is rounded instead of floored, so the scaled total is exactly
/// `(total / D).round()`.
pub(crate) fn scale(counts: &[u64], divisor: f64) -> Vec<u64> {
    assert!(
        divisor.is_finite() && divisor >= 1.0,
        "divisor must be >= 1"
    );
    let mut out = Vec::with_capacity(counts.len());
    let mut prefix: u64 = 0;
    let mut emitted: u64 = 0;
    for (i, &count) in counts.iter().enumerate() {
        prefix += count;
        let exact = prefix as f64 / divisor;
        let cumulative = if i + 1 == counts.len() {
            exact.round()
        } else {
            exact.floor()
        } as u64;
        // Both floor and round are monotone in the prefix, and round >= floor, so
        // `cumulative >= emitted`; `max` only guards against the impossible.
        let cumulative = cumulative.max(emitted);
        out.push(cumulative - emitted);
        emitted = cumulative;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_plain_lines() {
        assert_eq!(parse_trace("3\n0\n7\n", "t").unwrap(), vec![3, 0, 7]);
    }

    #[test]
    fn tolerates_trailing_spaces_and_crlf() {
        assert_eq!(
            parse_trace("50\n50 \n 7  \r\n1\t\n", "t").unwrap(),
            vec![50, 50, 7, 1]
        );
    }

    #[test]
    fn tolerates_missing_final_newline() {
        assert_eq!(parse_trace("1\n2\n119", "t").unwrap(), vec![1, 2, 119]);
    }

    #[test]
    fn tolerates_blank_final_lines() {
        assert_eq!(parse_trace("1\n2\n\n", "t").unwrap(), vec![1, 2]);
        assert_eq!(parse_trace("1\n2\n  \n\n", "t").unwrap(), vec![1, 2]);
        assert_eq!(parse_trace("", "t").unwrap(), Vec::<u64>::new());
    }

    #[test]
    fn malformed_line_names_file_line_and_text() {
        let err = parse_trace("1\n2\n3x \n4\n", "trace.txt").unwrap_err();
        assert_eq!(err.line, 3);
        assert_eq!(err.text, "3x");
        assert_eq!(
            err.to_string(),
            "trace.txt:3: expected a non-negative integer request count, found \"3x\""
        );
    }

    #[test]
    fn negative_and_fractional_counts_are_errors() {
        assert_eq!(parse_trace("1\n-2\n", "t").unwrap_err().line, 2);
        assert_eq!(parse_trace("1.5\n", "t").unwrap_err().line, 1);
    }

    #[test]
    fn blank_line_in_the_middle_is_an_error() {
        let err = parse_trace("1\n\n2\n", "t").unwrap_err();
        assert_eq!((err.line, err.text.as_str()), (2, ""));
    }

    /// The published traces the README replays, from `scripts/fetch-traces.sh` (run by
    /// `scripts/test.sh` when `traces/` holds them).
    #[test]
    #[ignore = "needs traces/ from scripts/fetch-traces.sh"]
    fn fetched_trace_files_parse() {
        for (name, len) in [
            ("wits_per_second.txt", 45_000),
            ("square_per_second.txt", 1_112),
        ] {
            let path = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../traces")
                .join(name);
            assert!(
                path.exists(),
                "{} is missing: run `scripts/fetch-traces.sh` (or `scripts/fetch-traces.sh \
                 --from DIR` with an offline copy)",
                path.display()
            );
            let trace = read_trace(&path).unwrap();
            assert_eq!(trace.len(), len, "{name}");
        }
    }

    #[test]
    fn slice_defaults_to_whole_trace() {
        let t = [3, 0, 7, 2, 5];
        assert_eq!(slice(&t, None, None).unwrap(), &t[..]);
        assert_eq!(slice(&t, Some(1), None).unwrap(), &[0, 7, 2, 5]);
        assert_eq!(slice(&t, None, Some(2)).unwrap(), &[3, 0]);
        assert_eq!(slice(&t, Some(2), Some(4)).unwrap(), &[7, 2]);
        assert_eq!(slice(&t, Some(4), Some(5)).unwrap(), &[5]);
    }

    #[test]
    fn slice_rejects_bad_windows() {
        let t = [3, 0, 7];
        assert!(
            slice(&t, None, Some(4))
                .unwrap_err()
                .to_string()
                .contains("past the end")
        );
        assert!(
            slice(&t, Some(2), Some(2))
                .unwrap_err()
                .to_string()
                .contains("empty window")
        );
        assert!(slice(&t, Some(3), None).is_err());
        assert!(slice(&[], None, None).is_err());
    }

    #[test]
    fn scale_by_one_is_identity() {
        assert_eq!(scale(&[3, 0, 7, 2, 5], 1.0), vec![3, 0, 7, 2, 5]);
    }

    #[test]
    fn scale_carries_fractions() {
        // prefix 3,6,9 / 2 = 1.5, 3, 4.5 -> floor 1, 3, round(4.5) = 5
        assert_eq!(scale(&[3, 3, 3], 2.0), vec![1, 2, 2]);
        // prefix 1..=4 / 3 -> floor 0,0,1, round(4/3)=1
        assert_eq!(scale(&[1, 1, 1, 1], 3.0), vec![0, 0, 1, 0]);
        // prefix 1..=5 / 3 -> 0,0,1,1, round(5/3)=2
        assert_eq!(scale(&[1, 1, 1, 1, 1], 3.0), vec![0, 0, 1, 0, 1]);
        // 10 / 4 = 2.5 rounds up to 3 in the last second
        assert_eq!(scale(&[10], 4.0), vec![3]);
        // prefix 5,10,15 / 2.5 = 2,4,6
        assert_eq!(scale(&[5, 5, 5], 2.5), vec![2, 2, 2]);
        assert_eq!(scale(&[], 2.0), Vec::<u64>::new());
        assert_eq!(scale(&[0, 0, 0], 7.0), vec![0, 0, 0]);
    }

    #[test]
    fn scale_sum_exhaustive_small() {
        // Every trace of length 1..=4 with counts 0..=5, several divisors.
        for divisor in [1.0, 1.5, 2.0, 3.0, 3.3, 7.0] {
            for len in 1..=4u32 {
                for code in 0..6u64.pow(len) {
                    let counts: Vec<u64> = (0..len).map(|k| code / 6u64.pow(k) % 6).collect();
                    let scaled = scale(&counts, divisor);
                    let total: u64 = counts.iter().sum();
                    assert_eq!(
                        scaled.iter().sum::<u64>(),
                        (total as f64 / divisor).round() as u64,
                        "{counts:?} / {divisor}"
                    );
                }
            }
        }
    }

    proptest! {
        #[test]
        fn scale_sum_is_rounded_total(
            counts in proptest::collection::vec(0u64..100_000, 0..300),
            divisor in 1.0f64..1000.0,
        ) {
            let scaled = scale(&counts, divisor);
            prop_assert_eq!(scaled.len(), counts.len());
            let total: u64 = counts.iter().sum();
            prop_assert_eq!(scaled.iter().sum::<u64>(), (total as f64 / divisor).round() as u64);
            // No second ever gets more than its own share plus one carried request
            // (plus the last second's rounding).
            for (c, s) in counts.iter().zip(&scaled) {
                prop_assert!((*s as f64) <= *c as f64 / divisor + 2.0);
            }
        }
    }
}
