//! Pacing and placement: when each message is due, which topic it goes to, and which topics
//! each subscriber holds. All pure arithmetic, so it is unit-tested without sockets or clocks.
//!
//! * [`Schedule`]: message `i` of a stream at rate `r` is due at `i / r` seconds after the start.
//!   A sender asks how many are due *now* and sends all of them, so a late wake-up is caught up
//!   at once and the average rate never drifts (unlike sleeping a fixed gap per message).
//! * [`Spread`]: the `n`-th message goes to topic `n·k mod T` with `k` coprime to `T`, so every
//!   topic is visited once per round and one client's (contiguous) topics are far apart in time.
//! * [`Assignment`]: client `c` holds topics `c·S … c·S + S − 1 (mod T)`, so every topic gets
//!   `C·S/T` subscribers (± 1) and the subscriber can find a topic's slot by subtraction.

use std::time::Duration;

/// A fixed-rate schedule. Rate `f64::INFINITY` (or 0) means "burst": everything is due at once.
#[derive(Debug, Clone, Copy)]
pub struct Schedule {
    rate: f64,
    /// Number of messages in the stream, if bounded.
    total: Option<u64>,
}

impl Schedule {
    pub fn new(rate_per_sec: f64, total: Option<u64>) -> Schedule {
        Schedule {
            rate: rate_per_sec,
            total,
        }
    }

    /// A schedule of one message every `interval` (the proxy scenario's "every 10 ms").
    pub fn every(interval: Duration, total: Option<u64>) -> Schedule {
        let s = interval.as_secs_f64();
        Schedule::new(if s > 0.0 { 1.0 / s } else { f64::INFINITY }, total)
    }

    pub fn is_burst(&self) -> bool {
        !(self.rate.is_finite() && self.rate > 0.0)
    }

    /// How many messages are due `elapsed` after the start (message 0 is due at 0).
    pub fn due(&self, elapsed: Duration) -> u64 {
        let n = if self.is_burst() {
            u64::MAX
        } else {
            // +1: message 0 is due at t = 0. The small epsilon absorbs float rounding at exact
            // boundaries (message i at exactly i/r is due).
            (elapsed.as_secs_f64() * self.rate + 1e-9).floor() as u64 + 1
        };
        match self.total {
            Some(t) => n.min(t),
            None => n,
        }
    }

    /// When message `i` is due, relative to the start.
    pub fn due_at(&self, i: u64) -> Duration {
        if self.is_burst() {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(i as f64 / self.rate)
        }
    }

    pub fn total(&self) -> Option<u64> {
        self.total
    }
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// The topic visiting order `n·k mod T`.
#[derive(Debug, Clone, Copy)]
pub struct Spread {
    topics: u64,
    step: u64,
}

impl Spread {
    /// Picks `k` coprime to `T` near `T·0.618` (the golden ratio spreads consecutive messages
    /// evenly over the ring of topics), and at least `min_gap` so a client's contiguous block
    /// of `min_gap` topics never gets two messages in a row.
    pub fn new(topics: u64, min_gap: u64) -> Spread {
        let t = topics.max(1);
        if t <= 2 {
            return Spread { topics: t, step: 1 };
        }
        let mut k = ((t as f64 * 0.618_033_988_7) as u64)
            .max(min_gap.min(t - 1))
            .max(1);
        while gcd(k, t) != 1 {
            k += 1;
            if k >= t {
                k = 1;
            }
        }
        Spread { topics: t, step: k }
    }

    pub fn step(&self) -> u64 {
        self.step
    }

    /// The topic of message `n`.
    pub fn topic(&self, n: u64) -> u64 {
        ((n % self.topics) as u128 * self.step as u128 % self.topics as u128) as u64
    }
}

/// Which topics each subscriber holds.
#[derive(Debug, Clone, Copy)]
pub struct Assignment {
    pub topics: u64,
    /// Subscriptions per client (capped at the number of topics).
    pub per_client: u64,
}

impl Assignment {
    pub fn new(topics: u64, per_client: u64) -> Assignment {
        let topics = topics.max(1);
        Assignment {
            topics,
            per_client: per_client.clamp(1, topics),
        }
    }

    /// The first topic of client `c`'s block.
    pub fn first(&self, client: u64) -> u64 {
        ((client as u128 * self.per_client as u128) % self.topics as u128) as u64
    }

    /// The topics of client `c`, in slot order.
    pub fn topics_of(&self, client: u64) -> impl Iterator<Item = u64> {
        let (first, t) = (self.first(client), self.topics);
        (0..self.per_client).map(move |j| (first + j) % t)
    }

    /// The slot (0..S) of `topic` in client `c`'s block, or None if it does not hold it.
    pub fn slot(&self, client: u64, topic: u64) -> Option<usize> {
        if topic >= self.topics {
            return None;
        }
        let d = (topic + self.topics - self.first(client)) % self.topics;
        (d < self.per_client).then_some(d as usize)
    }

    /// Total subscriptions over all topics divided by topics: the average fan-out of a message
    /// when every topic is published equally often.
    pub fn mean_fanout(&self, clients: u64) -> f64 {
        (clients * self.per_client) as f64 / self.topics as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_is_exact_and_catches_up() {
        let s = Schedule::new(1000.0, None);
        assert_eq!(s.due(Duration::ZERO), 1);
        assert_eq!(s.due(Duration::from_micros(999)), 1);
        assert_eq!(s.due(Duration::from_millis(1)), 2);
        // A sender that slept 50 ms too long finds 50 more due at once: no drift.
        assert_eq!(s.due(Duration::from_millis(100)), 101);
        assert_eq!(s.due(Duration::from_secs(10)), 10_001);
        assert_eq!(s.due_at(250), Duration::from_millis(250));
        // 20,000/s for 1 s: exactly 20,000 intervals.
        let s = Schedule::new(20_000.0, None);
        assert_eq!(s.due(Duration::from_secs(1)) - 1, 20_000);
        assert_eq!(s.due_at(20_000), Duration::from_secs(1));
    }

    #[test]
    fn schedule_bounded_and_burst() {
        let s = Schedule::every(Duration::from_millis(10), Some(1000));
        assert_eq!(s.due(Duration::from_millis(25)), 3);
        assert_eq!(s.due(Duration::from_secs(100)), 1000);
        assert_eq!(s.due_at(999), Duration::from_millis(9990));
        let b = Schedule::every(Duration::ZERO, Some(1000));
        assert!(b.is_burst());
        assert_eq!(b.due(Duration::ZERO), 1000);
        assert_eq!(b.due_at(500), Duration::ZERO);
    }

    #[test]
    fn spread_visits_every_topic_once_per_round_and_far_apart() {
        for (t, gap) in [
            (10_000u64, 100u64),
            (20_000, 100),
            (5, 1),
            (7, 3),
            (1, 1),
            (2, 1),
        ] {
            let sp = Spread::new(t, gap);
            assert_eq!(gcd(sp.step(), t), 1, "t={t} k={}", sp.step());
            let mut seen = vec![false; t as usize];
            for n in 0..t {
                seen[sp.topic(n) as usize] = true;
            }
            assert!(seen.iter().all(|&x| x), "t={t}");
            // the same order repeats every round
            assert_eq!(sp.topic(t + 3), sp.topic(3));
        }
        // A client's 100 contiguous topics never receive two consecutive messages.
        let sp = Spread::new(10_000, 100);
        let a = Assignment::new(10_000, 100);
        for n in 0..10_000 {
            let (x, y) = (sp.topic(n), sp.topic(n + 1));
            assert!(!(a.slot(7, x).is_some() && a.slot(7, y).is_some()));
        }
    }

    #[test]
    fn assignment_is_even_and_invertible() {
        let a = Assignment::new(10_000, 100);
        let mut count = vec![0u32; 10_000];
        for c in 0..1_000 {
            for (j, t) in a.topics_of(c).enumerate() {
                count[t as usize] += 1;
                assert_eq!(a.slot(c, t), Some(j));
            }
        }
        // 1,000 clients × 100 / 10,000 topics = 10 each, exactly.
        assert!(count.iter().all(|&n| n == 10));
        assert_eq!(a.mean_fanout(1_000), 10.0);
        assert_eq!(a.slot(0, 100), None);
        assert_eq!(a.slot(99, 9_999), Some(99)); // block 9,900..9,999
        assert_eq!(a.slot(100, 0), Some(0)); // wraps round
                                             // Stock exchange: 5 shares, one each.
        let s = Assignment::new(5, 1);
        assert_eq!(s.topics_of(7).collect::<Vec<_>>(), vec![2]);
        // More subscriptions than topics are capped.
        assert_eq!(Assignment::new(3, 10).per_client, 3);
    }
}
