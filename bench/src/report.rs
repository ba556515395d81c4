//! The one line a benchmark prints (`bench <name> ratio=<value> target=<value> <details>`,
//! [`Outcome`] and its [`Target`]) and the number formats and median its figures use.

use std::fmt;
use std::time::Duration;

/// Which way a ratio must go.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Target {
    /// ratio <= value.
    AtMost(f64),
    /// ratio >= value.
    AtLeast(f64),
}

impl Target {
    /// Whether `ratio` meets the target.
    pub fn met(self, ratio: f64) -> bool {
        match self {
            Target::AtMost(t) => ratio <= t,
            Target::AtLeast(t) => ratio >= t,
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::AtMost(t) => write!(f, "<={t}"),
            Target::AtLeast(t) => write!(f, ">={t}"),
        }
    }
}

/// What one benchmark produced.
#[derive(Clone, Debug)]
pub enum Outcome {
    /// A measurement.
    Measured {
        /// Benchmark name.
        name: String,
        /// The ratio the target applies to.
        ratio: f64,
        /// The target.
        target: Target,
        /// False when a side condition failed (e.g. writes during a no-change resync), even if
        /// the ratio is within the target.
        ok: bool,
        /// `key=value` details, units in the key (`_ms`, `_mb`, `_pct`).
        details: Vec<(String, String)>,
    },
    /// Not run, and why.
    Skipped {
        /// Benchmark name.
        name: String,
        /// Why.
        reason: String,
    },
    /// The benchmark could not run to the end.
    Failed {
        /// Benchmark name.
        name: String,
        /// The error.
        reason: String,
    },
}

impl Outcome {
    /// Whether the benchmark met its target (and its side conditions): `false` for a skipped
    /// or failed one, which has no figure to meet it with.
    #[must_use]
    pub fn met(&self) -> bool {
        match self {
            Outcome::Measured { ratio, target, ok, .. } => *ok && target.met(*ratio),
            Outcome::Skipped { .. } | Outcome::Failed { .. } => false,
        }
    }

    /// The benchmark's name.
    #[must_use]
    pub fn name(&self) -> &str {
        match self {
            Outcome::Measured { name, .. } | Outcome::Skipped { name, .. } | Outcome::Failed { name, .. } => name,
        }
    }
}

impl fmt::Display for Outcome {
    /// The one line a benchmark prints: `bench <name> ratio=<value> target=<value> <details>`
    /// (or `bench <name> skipped reason="..."` / `bench <name> failed reason="..."`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Measured { name, ratio, target, details, .. } => {
                write!(f, "bench {name} ratio={} target={target} met={}", fmt_ratio(*ratio), if self.met() { "yes" } else { "no" })?;
                for (k, v) in details {
                    write!(f, " {k}={v}")?;
                }
                Ok(())
            }
            Outcome::Skipped { name, reason } => write!(f, "bench {name} skipped reason={reason:?}"),
            Outcome::Failed { name, reason } => write!(f, "bench {name} failed reason={reason:?}"),
        }
    }
}

/// Three significant digits, at least three decimals below 1.
pub fn fmt_ratio(r: f64) -> String {
    if r.abs() >= 100.0 {
        format!("{r:.0}")
    } else if r.abs() >= 10.0 {
        format!("{r:.1}")
    } else if r.abs() >= 1.0 {
        format!("{r:.2}")
    } else {
        format!("{r:.4}")
    }
}

/// Milliseconds with two decimals.
pub fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1e3)
}

/// One `key=value` detail of a result line.
pub fn kv(k: &str, v: impl fmt::Display) -> (String, String) {
    (k.to_string(), v.to_string())
}

/// The median (upper median for an even count).
pub fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

/// The `q` quantile (0..=1) of `sorted` (nearest rank); zero for none.
pub fn quantile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// KiB as MiB with one decimal.
pub fn mb(kib: u64) -> String {
    format!("{:.1}", kib as f64 / 1024.0)
}

/// The median of `v` (the mean of the middle two for an even count; 0 for none): the
/// statistic of the round-based benchmarks (the median of the rounds' ratios).
pub fn median_f64(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => f64::midpoint(v[n / 2 - 1], v[n / 2]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn met_needs_the_ratio_the_side_conditions_and_a_figure() {
        let measured = |ratio, ok| Outcome::Measured { name: "x".into(), ratio, target: Target::AtMost(1.0), ok, details: vec![] };
        assert!(measured(0.9, true).met());
        assert!(!measured(1.1, true).met());
        assert!(!measured(0.9, false).met());
        assert_eq!(measured(0.9, false).to_string(), "bench x ratio=0.9000 target=<=1 met=no");
        assert!(!Outcome::Skipped { name: "y".into(), reason: "r".into() }.met());
        assert!(!Outcome::Failed { name: "z".into(), reason: "r".into() }.met());
        assert_eq!(Outcome::Failed { name: "z".into(), reason: "r".into() }.name(), "z");
    }
}
