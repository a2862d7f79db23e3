//! Fairness: how evenly the server treats its subscribers.
//!
//! A fan-out writes one subscriber's socket after another; a server that always went through a
//! topic's subscribers in the same order would make the last ones wait for every write ahead of
//! them, message after message. The pooled latency histogram hides that (a few slow subscribers
//! disappear among a thousand fast ones), so each subscriber also keeps a small histogram of its
//! own, and the report compares their p99s: best, median, worst, and worst ÷ best.
//!
//! A spread is only unfair beyond what chance gives: each p99 rests on a subscriber's own few
//! thousand samples, and when the tail is a handful of stalls, which subscribers' messages they
//! catch is partly luck. So the report also gives the spread by chance alone
//! ([`spread_by_chance`]): every subscriber's sample count drawn from the pooled latencies, as
//! if all were served alike. A measured spread above it means some subscribers are served worse
//! than chance explains.
//!
//! Memory matters (thousands of subscribers per pool): the per-subscriber histogram has 2
//! significant digits (≤ 1% error, enough for a ratio), 32-bit counts and a 60 s ceiling, about
//! 10 KiB, allocated at the subscriber's first message (idle connections cost nothing). Not at
//! its first sample in the window: a thousand subscribers allocating at once stalled the bench's
//! core for 10–17 ms at the window's start, and that stall was the run's p99.9.
//! Only each subscriber's p99 leaves the pool.

use hdrhistogram::Histogram;
use herald_core::mix::{splitmix64, GOLDEN};
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
        self.allocate()
            .saturating_record(us.clamp(0, MAX_US as i64) as u64);
    }

    /// Allocates the histogram, when not yet done, without recording: called for every
    /// message, in the window or not, so that the allocation falls in the warm-up.
    pub fn allocate(&mut self) -> &mut Histogram<u32> {
        self.0.get_or_insert_with(|| {
            Histogram::new_with_bounds(1, MAX_US, 2).expect("valid histogram bounds")
        })
    }

    /// Whether the histogram exists (tests: when it is allocated matters, see the module).
    #[cfg(test)]
    pub fn is_allocated(&self) -> bool {
        self.0.is_some()
    }

    /// The p99 of what was recorded since the previous call, when there were at least
    /// [`MIN_SAMPLES`]; starts the next window empty either way.
    pub fn take_p99(&mut self) -> Option<SubscriberP99> {
        let h = self.0.as_mut().filter(|h| !h.is_empty())?;
        let p99 = (h.len() >= MIN_SAMPLES).then(|| SubscriberP99 {
            p99_us: h.value_at_quantile(0.99),
            samples: h.len(),
        });
        h.reset();
        p99
    }
}

/// One subscriber's p99 over a window, and how many samples it rests on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubscriberP99 {
    pub p99_us: u64,
    pub samples: u64,
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
    /// worst ÷ best (1.0 = every subscriber equally served; herald holds itself to 1.5).
    pub spread: f64,
    /// The spread chance alone gives these subscribers ([`spread_by_chance`]); absent when
    /// the pooled latencies hold no sample (and in reports older than the field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spread_by_chance: Option<f64>,
}

impl Fairness {
    /// The figures of a list of per-subscriber p99s (any order), with the spread by chance
    /// drawn from `pooled` (every sample of the window); `None` when the list is empty.
    pub fn of(subscribers: &[SubscriberP99], pooled: &Histogram<u64>) -> Option<Fairness> {
        let mut v: Vec<u64> = subscribers.iter().map(|s| s.p99_us).collect();
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
            spread_by_chance: spread_by_chance(subscribers.iter().map(|s| s.samples), pooled),
        })
    }
}

/// worst ÷ best p99 of subscribers that each drew their number of `samples` at random from the
/// `pooled` latencies: the spread a server serving everyone alike would show if each message's
/// latency were independent of the others'. Real samples are more even than that (the bench
/// sends each subscriber's messages at even intervals, so a stall every subscriber shares meets
/// each one's messages about equally), and a fair server measures at or below this figure.
/// Seeded: the same inputs give the same figure. `None` without samples. Cost: one draw per
/// sample (a binary search over the histogram's buckets), well under a second for 12 M; a
/// subscriber draws at most [`MAX_DRAWS`].
pub fn spread_by_chance(
    samples: impl IntoIterator<Item = u64>,
    pooled: &Histogram<u64>,
) -> Option<f64> {
    // (bucket's highest value, samples up to and including it) for every non-empty bucket.
    let mut cdf = Vec::new();
    let mut total = 0;
    for v in pooled.iter_recorded() {
        total += v.count_at_value();
        cdf.push((v.value_iterated_to(), total));
    }
    if total == 0 {
        return None;
    }
    let mut rng = SplitMix64(0x5eed_f00d);
    let mut drawn: Vec<u32> = Vec::new();
    let (mut best, mut worst) = (u64::MAX, 0);
    for n in samples
        .into_iter()
        .filter(|&n| n > 0)
        .map(|n| n.min(MAX_DRAWS))
    {
        drawn.clear();
        drawn.extend((0..n).map(|_| {
            let u = rng.below(total);
            cdf.partition_point(|&(_, below)| below <= u) as u32
        }));
        // The nearest rank, as `Histogram::value_at_quantile(0.99)` takes it.
        let rank = ((n as f64 * 0.99).ceil() as usize).max(1) - 1;
        let (_, &mut bucket, _) = drawn.select_nth_unstable(rank);
        let p99 = cdf[bucket as usize].0;
        best = best.min(p99);
        worst = worst.max(p99);
    }
    (best != u64::MAX).then(|| worst as f64 / best.max(1) as f64)
}

/// The most samples one subscriber draws in [`spread_by_chance`] (4 MB of scratch): a single
/// subscriber of a fast, long run could have hundreds of millions, and past a million the p99
/// of the draws hardly moves (its rank is the 10,000th-worst).
const MAX_DRAWS: u64 = 1_000_000;

/// Seeded draws: reproducible, not secret ([`herald_core::mix`]).
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        let out = splitmix64(self.0);
        self.0 = self.0.wrapping_add(GOLDEN);
        out
    }

    /// Uniform in `0..n` (Lemire's multiply-shift; the bias is below 2⁻³⁰ for the counts here).
    fn below(&mut self, n: u64) -> u64 {
        ((self.next() as u128 * n as u128) >> 64) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn subs(p99s: &[u64]) -> Vec<SubscriberP99> {
        p99s.iter()
            .map(|&p99_us| SubscriberP99 {
                p99_us,
                samples: 1000,
            })
            .collect()
    }

    #[test]
    fn figures_of_a_known_list() {
        let f = Fairness::of(&subs(&[900, 400, 600, 500, 800]), &none()).unwrap();
        assert_eq!(f.subscribers, 5);
        assert_eq!(f.best_p99_us, 400.0);
        assert_eq!(f.median_p99_us, 600.0);
        assert_eq!(f.worst_p99_us, 900.0);
        assert_eq!(f.spread, 2.25);
        // Even count: the lower middle (nearest rank), like the pooled median.
        let f = Fairness::of(&subs(&[40, 10, 30, 20]), &none()).unwrap();
        assert_eq!((f.median_p99_us, f.spread), (20.0, 4.0));
        let one = Fairness::of(&subs(&[250]), &none()).unwrap();
        assert_eq!(
            (one.best_p99_us, one.worst_p99_us, one.spread),
            (250.0, 250.0, 1.0)
        );
        assert_eq!(Fairness::of(&[], &none()), None);
        assert_eq!(Fairness::of(&subs(&[0, 7]), &none()).unwrap().spread, 7.0);
        assert_eq!(f.spread_by_chance, None, "no pooled latency to draw from");
    }

    /// Pooled latencies without a sample.
    fn none() -> Histogram<u64> {
        pooled(&[])
    }

    fn pooled(values: &[(u64, u64)]) -> Histogram<u64> {
        let mut h = Histogram::new_with_bounds(1, MAX_US, 3).unwrap();
        for &(v, n) in values {
            h.record_n(v, n).unwrap();
        }
        h
    }

    #[test]
    fn chance_alone_gives_no_spread_to_a_constant_latency() {
        let h = pooled(&[(500, 100_000)]);
        assert_eq!(spread_by_chance([1000; 100], &h), Some(1.0));
        assert_eq!(spread_by_chance([], &h), None);
        assert_eq!(spread_by_chance([0, 0], &h), None);
        assert_eq!(spread_by_chance([1000], &pooled(&[])), None);
    }

    #[test]
    fn chance_alone_spreads_a_rare_tail_and_narrows_with_more_samples() {
        // 1% of the samples are a 10 ms stall, the rest 100 µs. With 1,000 samples each, a
        // subscriber's p99 (its 990th-lowest) is a stall when 11 or more of its draws hit one
        // (≈ 42% of subscribers): among 1,000 subscribers both kinds occur, 100× apart.
        let h = pooled(&[(100, 990_000), (10_000, 10_000)]);
        let short = spread_by_chance([1000; 1000], &h).unwrap();
        assert!((95.0..=105.0).contains(&short), "{short}");
        // Same every time: the draws are seeded.
        assert_eq!(spread_by_chance([1000; 1000], &h), Some(short));
        // A tail of 0.5% with 20,000 samples each: every p99 (the 200th-worst) is 100 µs.
        let h = pooled(&[(100, 995_000), (10_000, 5_000)]);
        assert_eq!(spread_by_chance([20_000; 200], &h), Some(1.0));
        // A subscriber with more samples than it draws: bounded work, the same answer.
        assert_eq!(spread_by_chance([u64::MAX, 20_000], &h), Some(1.0));
    }

    #[test]
    fn the_spread_by_chance_rides_along_when_the_pooled_latencies_are_given() {
        let h = pooled(&[(100, 990_000), (10_000, 10_000)]);
        let f = Fairness::of(&subs(&[120, 9_000]), &h).unwrap();
        assert_eq!(f.spread, 75.0);
        assert_eq!(f.spread_by_chance, spread_by_chance([1000, 1000], &h));
        assert!(f.spread_by_chance.is_some());
    }

    #[test]
    fn a_subscriber_p99_needs_enough_samples_and_each_window_starts_empty() {
        let mut s = SubscriberLatency::default();
        assert_eq!(s.take_p99(), None, "nothing recorded, nothing allocated");
        assert!(s.0.is_none());
        s.allocate();
        assert_eq!(s.take_p99(), None, "allocated, nothing recorded");
        assert!(s.0.is_some(), "the allocation outlives a window");
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
        assert!((980..=1000).contains(&p99.p99_us), "{p99:?}");
        assert_eq!(p99.samples, 1000);
        assert_eq!(s.take_p99(), None, "the previous window's samples are gone");
        for _ in 0..MIN_SAMPLES {
            s.record(-3);
        }
        s.record(i64::MAX);
        assert_eq!(s.take_p99().map(|p| p.p99_us), Some(0), "clamped, not lost");
    }
}
