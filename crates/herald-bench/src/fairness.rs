//! Fairness: how evenly the server treats its subscribers (issue 4, target 11).
//!
//! A fan-out writes one subscriber's socket after another; a server that always went through a
//! topic's subscribers in the same order would make the last ones wait for every write ahead of
//! them, message after message. The pooled latency histogram hides that (a few slow subscribers
//! disappear among a thousand fast ones), so each subscriber also keeps a small histogram of its
//! own, and the report compares their p99s: best, median, worst, and worst ÷ best.
//!
//! Memory matters (thousands of subscribers per pool): the per-subscriber histogram has 2
//! significant digits (≤ 1% error, enough for a ratio), 32-bit counts and a 60 s ceiling, about
//! 10 KiB, allocated at the subscriber's first sample in the window (idle connections cost
//! nothing). Only each subscriber's p99 leaves the pool.

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// Fewest samples in the window for a subscriber's p99 to count: below that, "p99" would be
/// its one or two worst samples.
pub const MIN_SAMPLES: u64 = 100;

/// Highest latency a subscriber's histogram holds, µs; larger values are clamped to it.
const MAX_US: u64 = 60_000_000;

/// One subscriber's latencies since the last [`SubscriberLatency::take_p99`].
#[derive(Debug, Default)]
pub struct SubscriberLatency(Option<Histogram<u32>>);

impl SubscriberLatency {
    /// Records `us` (negative clock differences become 0, like the pooled histogram).
    pub fn record(&mut self, us: i64) {
        let h = self.0.get_or_insert_with(|| {
            Histogram::new_with_bounds(1, MAX_US, 2).expect("valid histogram bounds")
        });
        h.saturating_record(us.clamp(0, MAX_US as i64) as u64);
    }

    /// The p99 of what was recorded since the previous call, when there were at least
    /// [`MIN_SAMPLES`]; starts the next window empty either way.
    pub fn take_p99(&mut self) -> Option<u64> {
        let h = self.0.as_mut().filter(|h| !h.is_empty())?;
        let p99 = (h.len() >= MIN_SAMPLES).then(|| h.value_at_quantile(0.99));
        h.reset();
        p99
    }
}

/// The spread of the subscribers' p99 latencies over a step's window, µs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Fairness {
    /// Subscribers with at least [`MIN_SAMPLES`] samples in the window (the others are left out).
    pub subscribers: u64,
    /// The lowest subscriber p99.
    pub best_p99_us: f64,
    /// The median subscriber p99 (nearest rank: the ⌈n/2⌉-th lowest).
    pub median_p99_us: f64,
    /// The highest subscriber p99.
    pub worst_p99_us: f64,
    /// worst ÷ best (1.0 = every subscriber equally served; target 11 asks ≤ 1.5).
    pub spread: f64,
}

impl Fairness {
    /// The figures of a list of per-subscriber p99s (any order); `None` when it is empty.
    pub fn of(p99s: &[u64]) -> Option<Fairness> {
        let mut v = p99s.to_vec();
        v.sort_unstable();
        let (&best, &worst) = (v.first()?, v.last()?);
        let median = v[v.len().div_ceil(2) - 1];
        Some(Fairness {
            subscribers: v.len() as u64,
            best_p99_us: best as f64,
            median_p99_us: median as f64,
            worst_p99_us: worst as f64,
            // A p99 of 0 µs only happens with clocks apart; 1 µs keeps the ratio finite.
            spread: worst as f64 / best.max(1) as f64,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_of_a_known_list() {
        let f = Fairness::of(&[900, 400, 600, 500, 800]).unwrap();
        assert_eq!(f.subscribers, 5);
        assert_eq!(f.best_p99_us, 400.0);
        assert_eq!(f.median_p99_us, 600.0);
        assert_eq!(f.worst_p99_us, 900.0);
        assert_eq!(f.spread, 2.25);
        // Even count: the lower middle (nearest rank), like the pooled median.
        let f = Fairness::of(&[40, 10, 30, 20]).unwrap();
        assert_eq!((f.median_p99_us, f.spread), (20.0, 4.0));
        let one = Fairness::of(&[250]).unwrap();
        assert_eq!(
            (one.best_p99_us, one.worst_p99_us, one.spread),
            (250.0, 250.0, 1.0)
        );
        assert_eq!(Fairness::of(&[]), None);
        assert_eq!(Fairness::of(&[0, 7]).unwrap().spread, 7.0);
    }

    #[test]
    fn a_subscriber_p99_needs_enough_samples_and_each_window_starts_empty() {
        let mut s = SubscriberLatency::default();
        assert_eq!(s.take_p99(), None, "nothing recorded, nothing allocated");
        for _ in 0..MIN_SAMPLES - 1 {
            s.record(50);
        }
        assert_eq!(s.take_p99(), None, "too few samples");
        let counts = s.0.as_ref().unwrap().distinct_values();
        assert!(
            counts * 4 <= 10 * 1024,
            "{counts} counters: more than 10 KiB"
        );
        // 1..=1000 µs: the p99 is 990 within the histogram's 2 significant digits.
        for v in 1..=1000 {
            s.record(v);
        }
        let p99 = s.take_p99().unwrap();
        assert!((980..=1000).contains(&p99), "{p99}");
        assert_eq!(s.take_p99(), None, "the previous window's samples are gone");
        for _ in 0..MIN_SAMPLES {
            s.record(-3);
        }
        s.record(i64::MAX);
        assert_eq!(s.take_p99(), Some(0), "clamped, not lost");
    }
}
