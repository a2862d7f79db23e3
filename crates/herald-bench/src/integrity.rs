//! Integrity accounting per (subscriber, topic), from herald's per-topic sequence numbers.
//!
//! herald numbers each topic's messages 1, 2, 3, … and a subscriber holding a topic receives
//! every one of them, in order. So for each (subscriber, topic) pair:
//! * the first message seen sets the baseline (what came before the subscription is not ours);
//! * `seq = last + 1` is the normal case;
//! * `seq > last + 1` opens a gap: the missing numbers are remembered;
//! * `seq < last + 1` is *out of order* if it fills a remembered gap, else a *duplicate*;
//! * a drop notice (`{"op":"dropped","count":N}`) announces N messages the server discarded for
//!   this subscriber (sdkperf's "discard" flag): announced drops explain gaps and are not lost.
//!
//! At the end, *lost* = numbers still missing − announced drops (never below zero).

use serde::{Deserialize, Serialize};

/// Counts over any set of (subscriber, topic) pairs; they add up.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    pub received: u64,
    pub lost: u64,
    pub duplicates: u64,
    pub out_of_order: u64,
    /// Drop notices received.
    pub discard_notices: u64,
    /// Messages those notices said were dropped.
    pub discarded: u64,
}

impl Counts {
    pub fn add(&mut self, o: &Counts) {
        self.received += o.received;
        self.lost += o.lost;
        self.duplicates += o.duplicates;
        self.out_of_order += o.out_of_order;
        self.discard_notices += o.discard_notices;
        self.discarded += o.discarded;
    }
}

/// More remembered gaps than this on one topic are counted lost at once (bounds memory).
const MAX_GAPS: usize = 1024;

/// The state of one (subscriber, topic) pair.
#[derive(Debug, Clone, Default)]
pub struct TopicTrack {
    /// Highest sequence number seen; 0 before the first message.
    last: u64,
    /// Missing ranges, inclusive, ascending.
    gaps: Vec<(u64, u64)>,
    /// Numbers given up on (gap list overflow): already counted lost.
    overflow_lost: u64,
    /// Messages announced dropped by notices.
    announced: u64,
}

impl TopicTrack {
    pub fn on_message(&mut self, seq: u64, c: &mut Counts) {
        c.received += 1;
        if self.last == 0 {
            self.last = seq;
            return;
        }
        if seq == self.last + 1 {
            self.last = seq;
        } else if seq > self.last + 1 {
            if self.gaps.len() >= MAX_GAPS {
                let (a, b) = self.gaps.remove(0);
                self.overflow_lost += b - a + 1;
            }
            self.gaps.push((self.last + 1, seq - 1));
            self.last = seq;
        } else if let Some(i) = self.gaps.iter().position(|&(a, b)| a <= seq && seq <= b) {
            c.out_of_order += 1;
            let (a, b) = self.gaps[i];
            match (seq == a, seq == b) {
                (true, true) => {
                    self.gaps.remove(i);
                }
                (true, false) => self.gaps[i].0 = seq + 1,
                (false, true) => self.gaps[i].1 = seq - 1,
                (false, false) => {
                    self.gaps[i].1 = seq - 1;
                    self.gaps.insert(i + 1, (seq + 1, b));
                }
            }
        } else {
            c.duplicates += 1;
        }
    }

    pub fn on_dropped(&mut self, count: u64, c: &mut Counts) {
        c.discard_notices += 1;
        c.discarded += count;
        self.announced += count;
    }

    /// Numbers still missing, before announced drops are taken off.
    pub fn missing(&self) -> u64 {
        self.overflow_lost + self.gaps.iter().map(|&(a, b)| b - a + 1).sum::<u64>()
    }

    /// Adds this pair's final loss to `c` (call once, at the end).
    pub fn finish(&self, c: &mut Counts) {
        c.lost += self.missing().saturating_sub(self.announced);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(seqs: &[u64]) -> Counts {
        let mut t = TopicTrack::default();
        let mut c = Counts::default();
        for &s in seqs {
            t.on_message(s, &mut c);
        }
        t.finish(&mut c);
        c
    }

    #[test]
    fn clean_stream_from_any_baseline() {
        let c = run(&[41, 42, 43, 44]);
        assert_eq!(
            c,
            Counts {
                received: 4,
                ..Default::default()
            }
        );
    }

    #[test]
    fn injected_loss_duplicate_and_reorder_are_each_counted() {
        // 1 2 [3 lost] 4 5 5(dup) 7 6(late) 8
        let c = run(&[1, 2, 4, 5, 5, 7, 6, 8]);
        assert_eq!(c.received, 8);
        assert_eq!(c.lost, 1, "{c:?}");
        assert_eq!(c.duplicates, 1, "{c:?}");
        assert_eq!(c.out_of_order, 1, "{c:?}");
    }

    #[test]
    fn late_message_in_middle_of_a_gap_splits_it() {
        // 10, then 15: 11..14 missing; 12 arrives late; 12 again is a duplicate.
        let c = run(&[10, 15, 12, 12, 16]);
        assert_eq!(c.out_of_order, 1);
        assert_eq!(c.duplicates, 1);
        assert_eq!(c.lost, 3); // 11, 13, 14
        let c = run(&[10, 15, 11, 14, 13, 12]);
        assert_eq!((c.out_of_order, c.lost, c.duplicates), (4, 0, 0));
    }

    #[test]
    fn an_old_number_never_seen_before_the_baseline_is_a_duplicate() {
        let c = run(&[5, 6, 3]);
        assert_eq!((c.duplicates, c.out_of_order, c.lost), (1, 0, 0));
    }

    #[test]
    fn announced_drops_explain_gaps() {
        let mut t = TopicTrack::default();
        let mut c = Counts::default();
        t.on_message(1, &mut c);
        t.on_dropped(3, &mut c);
        t.on_message(5, &mut c); // 2,3,4 dropped, announced
        t.on_message(7, &mut c); // 6 lost silently
        t.finish(&mut c);
        assert_eq!(c.discard_notices, 1);
        assert_eq!(c.discarded, 3);
        assert_eq!(c.lost, 1);
    }

    #[test]
    fn gap_overflow_is_bounded_and_still_counted() {
        let seqs: Vec<u64> = (0..3000).map(|i| 1 + 2 * i).collect(); // every other one lost
        let c = run(&seqs);
        assert_eq!(c.lost, 2999);
    }

    #[test]
    fn counts_add() {
        let mut a = Counts {
            lost: 1,
            received: 2,
            ..Default::default()
        };
        a.add(&Counts {
            duplicates: 3,
            received: 1,
            ..Default::default()
        });
        assert_eq!((a.lost, a.received, a.duplicates), (1, 3, 3));
    }
}
