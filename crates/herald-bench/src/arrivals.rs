//! Where herald → subscriber waited: in herald or in the bench (`--samples` runs).
//!
//! herald stamps a message when it takes it in; the bench reads it later. In between the
//! message waits in herald (queued, held, written) and then in the bench (its socket's queue,
//! until its loop comes to that socket). With `--samples` every read of the bench's
//! subscribers asks the kernel when its bytes arrived (`SO_TIMESTAMPNS`; on loopback that is
//! during herald's write), which splits the leg in two. TCP reports the arrival of the last
//! segment a read takes: a message that came earlier in the same read looks written later than
//! it was, so herald's part here is an upper bound and the bench's a lower bound. The kernel
//! turns its stamps on from a work queue a moment after the first socket asks, so the first
//! reads of a run may come unstamped (`arrived` 0): they are left out, and the warm-up covers
//! them.

use crate::load::RawSample;
use crate::stats::Summary;
use serde::{Deserialize, Serialize};

/// herald → subscriber split at the bench's kernel, µs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ArrivalLegs {
    /// herald's stamp → the bytes reached the bench's socket: herald's queue, hold and write.
    pub herald_to_kernel_us: Summary,
    /// The bytes reached the socket → the bench read them: the bench's own lag.
    pub kernel_to_bench_us: Summary,
    /// The same legs for the slowest 0.1% of the deliveries (the p99.9's own).
    pub slowest: SlowestLegs,
}

/// Medians of each leg over the deliveries at or above the p99.9 latency, µs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SlowestLegs {
    /// How many deliveries: those whose latency was at least `latency_from_us`.
    pub deliveries: u64,
    pub latency_from_us: f64,
    pub publish_to_herald_us: f64,
    pub herald_to_kernel_us: f64,
    pub kernel_to_bench_us: f64,
}

/// The split over the samples that carry both herald's stamp and an arrival stamp; `None`
/// when none do (herald was not asked to stamp, or the kernel gave no stamps).
pub fn split(raw: &[RawSample]) -> Option<ArrivalLegs> {
    let stamped: Vec<RawSample> = raw
        .iter()
        .copied()
        .filter(|&(_, ts, _, arrived)| ts > 0 && arrived > 0)
        .collect();
    if stamped.is_empty() {
        return None;
    }
    let leg =
        |f: fn(&RawSample) -> i64, of: &[RawSample]| -> Vec<i64> { of.iter().map(f).collect() };
    let latency = |s: &RawSample| s.2 as i64 - s.0 as i64;
    let publish_to_herald = |s: &RawSample| s.1 as i64 - s.0 as i64;
    let herald_to_kernel = |s: &RawSample| s.3 as i64 - s.1 as i64;
    let kernel_to_bench = |s: &RawSample| s.2 as i64 - s.3 as i64;

    let threshold = Summary::from_values(&leg(latency, &stamped)).p999;
    let slowest: Vec<RawSample> = stamped
        .iter()
        .copied()
        .filter(|s| latency(s) as f64 >= threshold)
        .collect();
    let median = |f: fn(&RawSample) -> i64| Summary::from_values(&leg(f, &slowest)).p50;
    Some(ArrivalLegs {
        herald_to_kernel_us: Summary::from_values(&leg(herald_to_kernel, &stamped)),
        kernel_to_bench_us: Summary::from_values(&leg(kernel_to_bench, &stamped)),
        slowest: SlowestLegs {
            deliveries: slowest.len() as u64,
            latency_from_us: threshold,
            publish_to_herald_us: median(publish_to_herald),
            herald_to_kernel_us: median(herald_to_kernel),
            kernel_to_bench_us: median(kernel_to_bench),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slowest_are_split_where_they_waited() {
        // 1,997 quick deliveries (10 µs to herald, 20 in herald, 5 in the bench), and three
        // slow ones (the p99.9 of 2,000 is the 1,998th) that waited 5 ms in the bench after
        // herald wrote them at once.
        let mut raw: Vec<RawSample> = (0..1997u64)
            .map(|i| (i * 100, i * 100 + 10, i * 100 + 35, i * 100 + 30))
            .collect();
        raw.push((500_000, 500_010, 505_040, 500_040));
        raw.push((600_000, 600_010, 605_040, 600_040));
        raw.push((650_000, 650_010, 655_040, 650_040));
        // Unstamped samples are left out, not counted as zero legs.
        raw.push((700_000, 0, 700_100, 0));
        raw.push((800_000, 800_010, 800_100, 0));

        let legs = split(&raw).expect("stamped samples");
        assert_eq!(legs.herald_to_kernel_us.count, 2000);
        assert_eq!(legs.herald_to_kernel_us.p50, 20.0);
        assert_eq!(legs.kernel_to_bench_us.p50, 5.0);
        assert_eq!(legs.kernel_to_bench_us.max, 5000.0);
        assert_eq!(legs.slowest.deliveries, 3);
        assert_eq!(legs.slowest.latency_from_us, 5040.0);
        assert_eq!(legs.slowest.publish_to_herald_us, 10.0);
        assert_eq!(legs.slowest.herald_to_kernel_us, 30.0);
        assert_eq!(legs.slowest.kernel_to_bench_us, 5000.0);
    }

    #[test]
    fn nothing_stamped_gives_no_split() {
        assert_eq!(split(&[(1, 0, 5, 0), (1, 2, 5, 0)]), None);
        assert_eq!(split(&[]), None);
    }
}
