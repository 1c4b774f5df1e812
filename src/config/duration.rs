//! Configured durations: [`Seconds`] (an option named `*_seconds`) and [`Millis`] (an
//! option named `*_ms`), each a [`Duration`] read from a YAML number and checked where it
//! is read. A leaf: it imports no section.
//!
//! The reader refuses a negative number, NaN, an infinity and a value above the
//! option's bound (one year unless the option names a lower one: `Seconds<900>` is at
//! most 900 s) as a type error at the value's line and column, so no conversion to
//! [`Duration`] can panic later. Zero is accepted here; options that must be above zero
//! say so in their section's validation. Printed back (`spillway config print`, `--set`)
//! a duration is the number it was read from, as long as that number has at most nine
//! decimals in its unit's nanoseconds (every value a `Duration` holds exactly).

use std::fmt;
use std::time::Duration;

use serde::de::{self, Deserializer};
use serde::ser::Serializer;
use serde::{Deserialize, Serialize};

/// One year in seconds: the default bound of a [`Seconds`] option.
pub const ONE_YEAR_SECONDS: u64 = 365 * 24 * 3600;
/// One year in milliseconds: the default bound of a [`Millis`] option.
pub const ONE_YEAR_MS: u64 = ONE_YEAR_SECONDS * 1000;

/// The bound's name in an error: `31536000 (one year)` or just the number.
fn bound_text(max: u64, one_year: u64) -> String {
    if max == one_year {
        format!("{max} (one year)")
    } else {
        max.to_string()
    }
}

/// `value` in `unit_nanos` units as a [`Duration`]: finite, ≥ 0 and at most `max` units.
///
/// # Errors
/// In words (`expected a number of seconds from 0 to 900`), for the reader to place.
fn read(
    value: f64,
    unit_nanos: u64,
    unit: &str,
    max: u64,
    one_year: u64,
) -> Result<Duration, String> {
    let expected = || {
        format!(
            "expected a number of {unit} from 0 to {}",
            bound_text(max, one_year)
        )
    };
    if !value.is_finite() || value < 0.0 || value > max as f64 {
        return Err(expected());
    }
    Duration::try_from_secs_f64(value * unit_nanos as f64 / 1e9).map_err(|_| expected())
}

/// `d` in units of `unit_nanos` nanoseconds as the shortest decimal number that reads
/// back as the same `Duration` (`0.1` for 100 ms in seconds): the number the file had.
fn number(d: Duration, unit_nanos: u64) -> f64 {
    let nanos = d.as_nanos();
    let unit = u128::from(unit_nanos);
    let (whole, frac) = (nanos / unit, nanos % unit);
    let digits = unit_nanos.ilog10() as usize;
    format!("{whole}.{frac:0digits$}")
        .parse()
        .unwrap_or(d.as_secs_f64() * 1e9 / unit_nanos as f64)
}

macro_rules! duration_option {
    ($(#[$doc:meta])* $name:ident, $unit_nanos:expr, $unit:literal, $one_year:ident, $from:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name<const MAX: u64 = $one_year>(Duration);

        impl<const MAX: u64> $name<MAX> {
            /// The bound of this option, in its unit.
            pub const MAX: u64 = MAX;

            /// Zero.
            pub const ZERO: Self = Self(Duration::ZERO);

            /// A duration of `d` (a constant default; the bound is not checked here,
            /// `reference_tests` checks every default reads back).
            pub const fn new(d: Duration) -> Self {
                Self(d)
            }

            /// Whole milliseconds.
            pub const fn from_millis(ms: u64) -> Self {
                Self(Duration::from_millis(ms))
            }

            /// Whole units of this option.
            pub const fn $from(n: u64) -> Self {
                Self(Duration::from_nanos(n * $unit_nanos))
            }

            /// The duration.
            pub const fn get(self) -> Duration {
                self.0
            }

            /// Zero?
            pub const fn is_zero(self) -> bool {
                self.0.is_zero()
            }

            /// The number as written in the file, in this option's unit (for messages,
            /// printing and comparisons with other numbers in that unit; time
            /// arithmetic uses [`Self::get`]).
            pub fn number(self) -> f64 {
                number(self.0, $unit_nanos)
            }
        }

        impl<const MAX: u64> From<$name<MAX>> for Duration {
            fn from(v: $name<MAX>) -> Duration {
                v.0
            }
        }

        impl<const MAX: u64> fmt::Display for $name<MAX> {
            /// The number in the option's unit, as written (`0.1`, `30`).
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}", self.number())
            }
        }

        impl<const MAX: u64> std::str::FromStr for $name<MAX> {
            type Err = String;

            /// A number in this option's unit (`2.5`), checked as the reader checks it
            /// (command-line flags such as `spillway cost --duration-ms`).
            fn from_str(s: &str) -> Result<Self, String> {
                let value: f64 = s
                    .trim()
                    .parse()
                    .map_err(|_| format!("expected a number of {}, found `{s}`", $unit))?;
                read(value, $unit_nanos, $unit, MAX, $one_year)
                    .map(Self)
                    .map_err(|e| format!("{e}, found `{s}`"))
            }
        }

        impl<const MAX: u64> Serialize for $name<MAX> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_f64(self.number())
            }
        }

        impl<'de, const MAX: u64> Deserialize<'de> for $name<MAX> {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let value = f64::deserialize(d)?;
                read(value, $unit_nanos, $unit, MAX, $one_year)
                    .map(Self)
                    .map_err(de::Error::custom)
            }
        }
    };
}

duration_option!(
    /// A configured duration written in seconds (an option named `*_seconds`): a number
    /// from 0 to `MAX` seconds (default one year), fractions allowed (`0.1`).
    Seconds,
    1_000_000_000,
    "seconds",
    ONE_YEAR_SECONDS,
    from_secs
);

duration_option!(
    /// A configured duration written in milliseconds (an option named `*_ms`): a number
    /// from 0 to `MAX` milliseconds (default one year), fractions allowed (`0.5`).
    Millis,
    1_000_000,
    "milliseconds",
    ONE_YEAR_MS,
    from_ms
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[derive(Debug, Deserialize, Serialize)]
    struct Probe {
        a_seconds: Seconds,
        #[serde(default)]
        b_seconds: Option<Seconds<900>>,
        #[serde(default)]
        c_ms: Option<Millis>,
    }

    fn read_probe(text: &str) -> Result<Probe, Vec<(String, String, u64, u64)>> {
        let tree = super::super::yaml::parse(text).expect("yaml");
        let (v, errors, _) = super::super::de::collect::<Probe>(tree);
        if errors.is_empty() {
            Ok(v.expect("value"))
        } else {
            Err(errors
                .into_iter()
                .map(|e| {
                    let l = e.loc.expect("located");
                    (e.path, e.message, l.line, l.column)
                })
                .collect())
        }
    }

    #[test]
    fn reads_whole_and_fractional_numbers() {
        let p = read_probe("a_seconds: 0.1\nb_seconds: 900\nc_ms: 2.5\n").unwrap();
        assert_eq!(p.a_seconds.get(), Duration::from_millis(100));
        assert_eq!(p.b_seconds.unwrap().get(), Duration::from_secs(900));
        assert_eq!(p.c_ms.unwrap().get(), Duration::from_micros(2500));
        assert_eq!(
            read_probe("a_seconds: 0\n").unwrap().a_seconds,
            Seconds::ZERO
        );
    }

    #[test]
    fn refuses_negative_nan_infinite_and_too_large_at_the_value() {
        for (text, found) in [
            ("a_seconds: -1\n", "-1"),
            ("a_seconds: .nan\n", ".nan"),
            ("a_seconds: .inf\n", ".inf"),
            ("a_seconds: 31536001\n", "31536001"),
        ] {
            let errors = read_probe(text).unwrap_err();
            assert_eq!(
                errors,
                vec![(
                    "a_seconds".to_string(),
                    format!(
                        "expected a number of seconds from 0 to 31536000 (one year), found `{found}`"
                    ),
                    1,
                    12
                )],
                "{text}"
            );
        }
    }

    #[test]
    fn names_a_lower_bound_and_the_unit() {
        let errors = read_probe("a_seconds: 1\nb_seconds: 901\nc_ms: -0.5\n").unwrap_err();
        assert_eq!(
            errors,
            vec![
                (
                    "b_seconds".to_string(),
                    "expected a number of seconds from 0 to 900, found `901`".to_string(),
                    2,
                    12
                ),
                (
                    "c_ms".to_string(),
                    "expected a number of milliseconds from 0 to 31536000000 (one year), found `-0.5`"
                        .to_string(),
                    3,
                    7
                ),
            ]
        );
    }

    #[test]
    fn prints_the_number_it_read() {
        for n in [
            "0.1",
            "30",
            "2.5",
            "0.000000001",
            "1.3",
            "600",
            "0.25",
            "7.123456789",
        ] {
            let p = read_probe(&format!("a_seconds: {n}\n")).unwrap();
            let want: f64 = n.parse().unwrap();
            assert_eq!(p.a_seconds.number(), want, "{n}");
            let json = serde_json::to_value(&p).unwrap();
            assert_eq!(json["a_seconds"].as_f64(), Some(want), "{n}");
        }
        let p = read_probe("a_seconds: 1\nc_ms: 0.5\n").unwrap();
        assert_eq!(p.c_ms.unwrap().number(), 0.5);
    }

    #[test]
    fn a_config_error_names_the_file_place() {
        let e = Config::from_yaml("gateway:\n  connect_timeout_seconds: -2\n", "f.yaml")
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "f.yaml:2:28: gateway.connect_timeout_seconds: expected a number of seconds from 0 \
             to 31536000 (one year), found `-2`"
        );
    }
}
