//! Results: latency histograms (microseconds), merging the per-client ones
//! at the end of a run, and rendering a run as the one-line text summary
//! that scripts grep, a small text histogram, or one JSON object.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

/// `--output`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Text,
    Json,
}

/// An empty latency histogram: microseconds, 1 us to 60 s, 3 significant
/// digits.
pub fn new_hist() -> Result<Histogram<u64>, String> {
    Histogram::new_with_bounds(1, 60_000_000, 3).map_err(|e| e.to_string())
}

/// Records one latency; values past the histogram's range are clamped to
/// its highest trackable value rather than dropped.
pub fn record(hist: &mut Histogram<u64>, latency: Duration) {
    let us = u64::try_from(latency.as_micros())
        .unwrap_or(u64::MAX)
        .max(1);
    let _ = hist.record(us.min(hist.high()));
}

/// The sum of per-client histograms.
pub fn merge<'a>(
    hists: impl IntoIterator<Item = &'a Histogram<u64>>,
) -> Result<Histogram<u64>, String> {
    let mut all = new_hist()?;
    for h in hists {
        all.add(h).map_err(|e| e.to_string())?;
    }
    Ok(all)
}

/// One reported series of a run: all of a `put`, or the reads of a
/// `txn-mixed`.
pub struct Report {
    pub name: String,
    /// Successful requests (each has a latency in `hist`).
    pub ops: u64,
    pub errors: u64,
    pub elapsed: Duration,
    pub hist: Histogram<u64>,
    /// Workload-specific counts: `succeeded`/`failed` of `txn-put`, `kvs`
    /// returned by ranges.
    pub counters: BTreeMap<String, u64>,
}

#[derive(Serialize)]
struct JsonReport<'a> {
    name: &'a str,
    ops: u64,
    errors: u64,
    seconds: f64,
    ops_per_sec: f64,
    p50_ms: f64,
    p90_ms: f64,
    p99_ms: f64,
    p999_ms: f64,
    max_ms: f64,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    counters: &'a BTreeMap<String, u64>,
}

impl Report {
    /// A report of `sent` requests. Every request sent ends as exactly one
    /// success or one error: a mismatch is a bug in the load loop.
    pub fn new(
        name: String,
        sent: u64,
        ops: u64,
        errors: u64,
        elapsed: Duration,
        hist: Histogram<u64>,
    ) -> Report {
        assert_eq!(
            sent,
            ops + errors,
            "{name}: {sent} requests sent but {ops} ok + {errors} errors"
        );
        Report {
            name,
            ops,
            errors,
            elapsed,
            hist,
            counters: BTreeMap::new(),
        }
    }

    fn ms(us: u64) -> f64 {
        us as f64 / 1000.0
    }

    pub fn quantile_ms(&self, q: f64) -> f64 {
        Self::ms(self.hist.value_at_quantile(q))
    }

    pub fn ops_per_sec(&self) -> f64 {
        let s = self.elapsed.as_secs_f64();
        if s > 0.0 {
            self.ops as f64 / s
        } else {
            0.0
        }
    }

    /// The one-line summary scripts grep:
    /// `<name>  N ops  E err  X ops/s  p50 .. ms  p90 .. ms  p99 .. ms  p99.9 .. ms  max .. ms`.
    pub fn summary_line(&self) -> String {
        format!(
            "{:<28} {:>9} ops {:>6} err {:>11.0} ops/s  p50 {:>8.3} ms  p90 {:>8.3} ms  p99 {:>8.3} ms  p99.9 {:>8.3} ms  max {:>8.3} ms",
            self.name,
            self.ops,
            self.errors,
            self.ops_per_sec(),
            self.quantile_ms(0.5),
            self.quantile_ms(0.9),
            self.quantile_ms(0.99),
            self.quantile_ms(0.999),
            Self::ms(self.hist.max()),
        )
    }

    /// Ten log-spaced latency buckets from the fastest to the slowest
    /// request, each with its count and a bar of `#` (40 for the fullest).
    pub fn text_histogram(&self) -> String {
        let mut out = String::new();
        if self.hist.is_empty() {
            return out;
        }
        const BUCKETS: usize = 10;
        const WIDTH: u64 = 40;
        let lo = self.hist.min().max(1) as f64;
        let hi = (self.hist.max().max(1) as f64).max(lo);
        // Upper bounds (us) of the buckets; the last is the max.
        let bounds: Vec<u64> = (1..=BUCKETS)
            .map(|i| {
                if i == BUCKETS {
                    self.hist.max()
                } else {
                    (lo * (hi / lo).powf(i as f64 / BUCKETS as f64)).ceil() as u64
                }
            })
            .collect();
        let mut counts = [0u64; BUCKETS];
        for v in self.hist.iter_recorded() {
            let value = self.hist.highest_equivalent(v.value_iterated_to());
            let b = bounds
                .iter()
                .position(|&ub| value <= ub)
                .unwrap_or(BUCKETS - 1);
            counts[b] += v.count_at_value();
        }
        let most = counts.iter().copied().max().unwrap_or(0).max(1);
        let _ = writeln!(out, "  latency histogram ({}):", self.name.trim());
        for (ub, n) in bounds.iter().zip(counts) {
            let bar = "#".repeat(((n * WIDTH).div_ceil(most)) as usize);
            let row = format!("    <= {:>10.3} ms [{n:>9}] {bar}", Self::ms(*ub));
            let _ = writeln!(out, "{}", row.trim_end());
        }
        out
    }

    /// One JSON object, no newline.
    pub fn to_json(&self) -> Result<String, String> {
        serde_json::to_string(&JsonReport {
            name: self.name.trim(),
            ops: self.ops,
            errors: self.errors,
            seconds: self.elapsed.as_secs_f64(),
            ops_per_sec: self.ops_per_sec(),
            p50_ms: self.quantile_ms(0.5),
            p90_ms: self.quantile_ms(0.9),
            p99_ms: self.quantile_ms(0.99),
            p999_ms: self.quantile_ms(0.999),
            max_ms: Self::ms(self.hist.max()),
            counters: &self.counters,
        })
        .map_err(|e| e.to_string())
    }

    /// Prints the report: summary line, counters and histogram in text mode,
    /// one JSON line in json mode.
    pub fn print(&self, output: Output) -> Result<(), String> {
        match output {
            Output::Json => println!("{}", self.to_json()?),
            Output::Text => {
                println!("{}", self.summary_line());
                if !self.counters.is_empty() {
                    let counters: Vec<String> = self
                        .counters
                        .iter()
                        .map(|(k, v)| format!("{k}={v}"))
                        .collect();
                    println!("  {}: {}", self.name.trim(), counters.join(" "));
                }
                print!("{}", self.text_histogram());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn hist_of(values: &[u64]) -> Histogram<u64> {
        let mut h = new_hist().unwrap();
        for v in values {
            h.record(*v).unwrap();
        }
        h
    }

    #[test]
    fn merge_sums_client_histograms() {
        let a = hist_of(&[100, 200, 300]);
        let b = hist_of(&[1000, 2000]);
        let c = new_hist().unwrap();
        let m = merge([&a, &b, &c]).unwrap();
        assert_eq!(m.len(), 5);
        assert_eq!(m.min(), 100);
        assert_eq!(m.max(), b.max());
        assert_eq!(m.count_at(200), 1);
        assert_eq!(m.value_at_quantile(0.5), a.highest_equivalent(300));
        let empty = merge(std::iter::empty()).unwrap();
        assert!(empty.is_empty());
    }

    #[test]
    fn record_clamps_instead_of_dropping() {
        let mut h = new_hist().unwrap();
        record(&mut h, Duration::from_secs(3600));
        record(&mut h, Duration::ZERO);
        assert_eq!(h.len(), 2);
        assert_eq!(h.min(), 1);
    }

    fn sample() -> Report {
        let values: Vec<u64> = (1..=1000).map(|i| i * 10).collect();
        let mut r = Report::new(
            "put conns=2 clients=10".into(),
            1003,
            1000,
            3,
            Duration::from_secs(2),
            hist_of(&values),
        );
        r.counters.insert("succeeded".into(), 990);
        r
    }

    #[test]
    fn json_report_parses_back() {
        let r = sample();
        let v: serde_json::Value = serde_json::from_str(&r.to_json().unwrap()).unwrap();
        assert_eq!(v["name"], "put conns=2 clients=10");
        assert_eq!(v["ops"], 1000);
        assert_eq!(v["errors"], 3);
        assert_eq!(v["seconds"], 2.0);
        assert_eq!(v["ops_per_sec"], 500.0);
        let p50 = v["p50_ms"].as_f64().unwrap();
        assert!((4.9..=5.1).contains(&p50), "{p50}");
        let p90 = v["p90_ms"].as_f64().unwrap();
        let p99 = v["p99_ms"].as_f64().unwrap();
        let p999 = v["p999_ms"].as_f64().unwrap();
        let max = v["max_ms"].as_f64().unwrap();
        assert!(p50 <= p90 && p90 <= p99 && p99 <= p999 && p999 <= max);
        assert!((9.99..=10.01).contains(&max), "{max}");
        assert_eq!(v["counters"]["succeeded"], 990);
    }

    #[test]
    fn summary_line_keeps_its_format() {
        let line = sample().summary_line();
        assert!(line.starts_with("put conns=2 clients=10 "), "{line}");
        for part in [
            " 1000 ops ",
            " 3 err ",
            " 500 ops/s  p50 ",
            " ms  p90 ",
            " ms  p99 ",
            " ms  p99.9 ",
            " ms  max ",
        ] {
            assert!(line.contains(part), "{part:?} not in {line}");
        }
        assert!(line.ends_with(" ms"));
    }

    #[test]
    fn text_histogram_has_ten_buckets_covering_all() {
        let r = sample();
        let text = r.text_histogram();
        let rows: Vec<&str> = text.lines().skip(1).collect();
        assert_eq!(rows.len(), 10, "{text}");
        let total: u64 = rows
            .iter()
            .map(|l| {
                let open = l.find('[').unwrap();
                let close = l.find(']').unwrap();
                l[open + 1..close].trim().parse::<u64>().unwrap()
            })
            .sum();
        assert_eq!(total, 1000);
        assert!(rows.iter().any(|l| l.ends_with(&"#".repeat(40))));
    }

    #[test]
    #[should_panic(expected = "requests sent")]
    fn sent_must_equal_ok_plus_errors() {
        let _ = Report::new(
            "x".into(),
            5,
            3,
            1,
            Duration::from_secs(1),
            new_hist().unwrap(),
        );
    }
}
