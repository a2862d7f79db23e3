//! Latency statistics: an HdrHistogram at microsecond resolution, and the summary the seeds
//! print (min, mean, median, mode, p99, p99.9, sample standard deviation, max).
//!
//! Two sources give the same [`Summary`]: a histogram (the fan-out scenarios record millions of
//! samples) and an exact list of values (the proxy scenario computes per-trial statistics over
//! 1,000 messages, like the seed did, then averages them over trials).

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// Highest latency a histogram records, in µs (one hour); larger values are clamped to it.
pub const MAX_US: u64 = 3_600_000_000;

/// A histogram with µs resolution: values below 2,048 µs are exact, above that 3 significant
/// digits (0.1% relative error).
pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_US, 3).expect("valid histogram bounds")
}

/// Records `v` µs, clamping into the histogram's range (negative clock differences become 0).
pub fn record(h: &mut Histogram<u64>, v: i64) {
    let v = v.clamp(0, MAX_US as i64) as u64;
    h.saturating_record(v);
}

/// The statistics of one latency distribution, in microseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Number of samples.
    pub count: u64,
    pub min: f64,
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// Most frequent value (lowest one on a tie).
    pub mode: f64,
    pub p99: f64,
    pub p999: f64,
    /// Sample standard deviation (divides by n − 1).
    pub stdev: f64,
    pub max: f64,
}

impl Summary {
    /// Exact statistics of a list of values. Percentiles use the nearest-rank method
    /// (the smallest value with at least q·n values at or below it), like HdrHistogram.
    pub fn from_values(values: &[i64]) -> Summary {
        if values.is_empty() {
            return Summary::default();
        }
        let mut v = values.to_vec();
        v.sort_unstable();
        let n = v.len();
        let sum: f64 = v.iter().map(|&x| x as f64).sum();
        let mean = sum / n as f64;
        let var = if n > 1 {
            v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / (n - 1) as f64
        } else {
            0.0
        };
        // Mode: the longest run in the sorted list; the first (lowest) wins ties.
        let (mut mode, mut best, mut i) = (v[0], 0usize, 0usize);
        while i < n {
            let mut j = i;
            while j < n && v[j] == v[i] {
                j += 1;
            }
            if j - i > best {
                best = j - i;
                mode = v[i];
            }
            i = j;
        }
        let rank = |q: f64| -> f64 {
            let r = ((q * n as f64).ceil() as usize).clamp(1, n);
            v[r - 1] as f64
        };
        Summary {
            count: n as u64,
            min: v[0] as f64,
            mean,
            p50: rank(0.5),
            mode: mode as f64,
            p99: rank(0.99),
            p999: rank(0.999),
            stdev: var.sqrt(),
            max: v[n - 1] as f64,
        }
    }

    /// Statistics of a histogram (values within its resolution; exact below 2,048 µs).
    pub fn from_histogram(h: &Histogram<u64>) -> Summary {
        let n = h.len();
        if n == 0 {
            return Summary::default();
        }
        let mut mode = 0u64;
        let mut best = 0u64;
        for it in h.iter_recorded() {
            if it.count_at_value() > best {
                best = it.count_at_value();
                mode = h.lowest_equivalent(it.value_iterated_to());
            }
        }
        // HdrHistogram's stdev divides by n; the seeds use the sample standard deviation.
        let pop = h.stdev();
        let stdev = if n > 1 {
            pop * (n as f64 / (n - 1) as f64).sqrt()
        } else {
            0.0
        };
        Summary {
            count: n,
            min: h.min() as f64,
            mean: h.mean(),
            p50: h.value_at_quantile(0.5) as f64,
            mode: mode as f64,
            p99: h.value_at_quantile(0.99) as f64,
            p999: h.value_at_quantile(0.999) as f64,
            stdev,
            max: h.max() as f64,
        }
    }

    /// The mean of each statistic over several summaries (how the seed's proxy tables are
    /// built: "each row is the mean over the 60 trials of the per-trial statistic").
    /// Empty summaries (a trial with no message) are skipped; `count` is the total.
    pub fn mean_of(list: &[Summary]) -> Summary {
        let xs: Vec<&Summary> = list.iter().filter(|s| s.count > 0).collect();
        if xs.is_empty() {
            return Summary::default();
        }
        let k = xs.len() as f64;
        let avg = |f: fn(&Summary) -> f64| xs.iter().map(|s| f(s)).sum::<f64>() / k;
        Summary {
            count: xs.iter().map(|s| s.count).sum(),
            min: avg(|s| s.min),
            mean: avg(|s| s.mean),
            p50: avg(|s| s.p50),
            mode: avg(|s| s.mode),
            p99: avg(|s| s.p99),
            p999: avg(|s| s.p999),
            stdev: avg(|s| s.stdev),
            max: avg(|s| s.max),
        }
    }
}

/// Serialises a histogram (V2 format, base64) so worker processes can hand theirs over.
pub fn encode_histogram(h: &Histogram<u64>) -> String {
    use base64::Engine;
    use hdrhistogram::serialization::Serializer;
    let mut buf = Vec::new();
    hdrhistogram::serialization::V2Serializer::new()
        .serialize(h, &mut buf)
        .expect("serialise histogram");
    base64::engine::general_purpose::STANDARD.encode(buf)
}

/// The inverse of [`encode_histogram`].
pub fn decode_histogram(s: &str) -> anyhow::Result<Histogram<u64>> {
    use base64::Engine;
    let bytes = base64::engine::general_purpose::STANDARD.decode(s)?;
    let h: Histogram<u64> = hdrhistogram::serialization::Deserializer::new()
        .deserialize(&mut &bytes[..])
        .map_err(|e| anyhow::anyhow!("bad histogram from worker: {e:?}"))?;
    Ok(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, eps: f64) -> bool {
        (a - b).abs() <= eps
    }

    // 2, 4, 4, 4, 5, 5, 7, 9: the textbook example (population σ = 2, sample s = 2.138).
    const DATA: [i64; 8] = [9, 4, 2, 4, 5, 4, 7, 5];

    #[test]
    fn exact_values_known_data() {
        let s = Summary::from_values(&DATA);
        assert_eq!(s.count, 8);
        assert_eq!(s.min, 2.0);
        assert_eq!(s.max, 9.0);
        assert_eq!(s.mean, 5.0);
        assert_eq!(s.mode, 4.0);
        assert_eq!(s.p50, 4.0); // nearest rank: 4th of 8
        assert_eq!(s.p99, 9.0);
        assert!(close(s.stdev, (32.0f64 / 7.0).sqrt(), 1e-12), "{}", s.stdev);
    }

    #[test]
    fn mode_tie_takes_lowest_and_single_value_has_zero_stdev() {
        let s = Summary::from_values(&[3, 1, 3, 1, 2]);
        assert_eq!(s.mode, 1.0);
        let one = Summary::from_values(&[42]);
        assert_eq!(one.stdev, 0.0);
        assert_eq!(one.p999, 42.0);
        assert_eq!(Summary::from_values(&[]), Summary::default());
    }

    #[test]
    fn percentiles_of_1_to_1000() {
        let v: Vec<i64> = (1..=1000).collect();
        let s = Summary::from_values(&v);
        assert_eq!(s.p50, 500.0);
        assert_eq!(s.p99, 990.0);
        assert_eq!(s.p999, 999.0);
        assert_eq!(s.mean, 500.5);
        // sample variance of 1..n is n(n+1)/12
        assert!(close(s.stdev, (1000.0f64 * 1001.0 / 12.0).sqrt(), 1e-9));
    }

    #[test]
    fn histogram_agrees_with_exact_values() {
        let mut h = new_histogram();
        for &x in &DATA {
            record(&mut h, x);
        }
        let s = Summary::from_histogram(&h);
        let e = Summary::from_values(&DATA);
        assert_eq!(s.count, e.count);
        assert_eq!(s.min, e.min);
        assert_eq!(s.max, e.max);
        assert_eq!(s.mode, e.mode);
        assert_eq!(s.p50, e.p50);
        assert!(close(s.mean, e.mean, 1e-9));
        assert!(close(s.stdev, e.stdev, 1e-9), "{} vs {}", s.stdev, e.stdev);

        let mut h = new_histogram();
        for x in 1..=1000 {
            record(&mut h, x);
        }
        let s = Summary::from_histogram(&h);
        assert_eq!((s.p50, s.p99, s.p999), (500.0, 990.0, 999.0));
    }

    #[test]
    fn histogram_clamps_and_roundtrips() {
        let mut h = new_histogram();
        record(&mut h, -5);
        record(&mut h, 10);
        record(&mut h, i64::MAX);
        assert_eq!(h.min(), 0);
        assert!(h.max() >= MAX_US);
        let back = decode_histogram(&encode_histogram(&h)).unwrap();
        assert_eq!(back.len(), 3);
        assert_eq!(back.max(), h.max());
    }

    #[test]
    fn mean_over_trials() {
        let a = Summary::from_values(&[1, 2, 3]);
        let b = Summary::from_values(&[3, 4, 5]);
        let m = Summary::mean_of(&[a, b, Summary::default()]);
        assert_eq!(m.mean, 3.0);
        assert_eq!(m.min, 2.0);
        assert_eq!(m.max, 4.0);
        assert_eq!(m.count, 6);
    }
}
