//! What a cluster bridge needs of the engine besides [`Engine::publish_remote`]: holding a
//! pattern's interest while a subscription is being set up, knowing which part of a recovery
//! memory cannot answer, filling history in from a durable store (JetStream), and reporting
//! holes found after an outage of the link between nodes.
//!
//! None of this is on the publish path.

use super::{message_of, Engine, Numbering, Outbox, Stored};
use crate::request::{Publish, Subscribe};
use crate::topic;
use std::collections::BTreeMap;
use std::sync::Arc;

/// A message read back from a durable store, with the numbers its origin node gave it.
#[derive(Clone, Debug)]
pub struct Recalled {
    pub publish: Publish,
    pub seq: u64,
    /// When it was published (µs since the UNIX epoch): history age limits count from here, and
    /// it is the message's `ts` when the publisher asked for `stamp`.
    pub at_us: u64,
}

/// What of a subscription's recovery this engine cannot answer from memory.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Unanswered {
    /// Topics named in `since` that this engine holds nothing of, or not back to (or up to) the
    /// position asked, sorted.
    pub since: Vec<String>,
    /// The snapshot may name topics this engine does not hold: the pattern is a wildcard (only
    /// a store knows every topic it matches), or the one topic it names is unknown here.
    pub snapshot: bool,
}

impl Unanswered {
    pub fn is_empty(&self) -> bool {
        self.since.is_empty() && !self.snapshot
    }
}

impl<O: Outbox> Engine<O> {
    /// Counts `pattern` as held (as one more subscriber would) until [`Engine::release_interest`]:
    /// the bridge follows it upstream before the subscription that needs it is answered.
    pub fn hold_interest(&mut self, pattern: &str) {
        self.interest_up(pattern);
    }

    /// Ends a [`Engine::hold_interest`].
    pub fn release_interest(&mut self, pattern: &str) {
        self.interest_down(pattern);
    }

    /// Which part of subscription `s`'s `since` and `snapshot` memory cannot answer in full. A
    /// topic held in another epoch is not listed: the reply's `epoch_changed` is the answer.
    pub fn unanswered(&self, s: &Subscribe) -> Unanswered {
        let mut since: Vec<String> = s
            .since
            .iter()
            .filter(|(name, pos)| {
                if topic::validate_topic(name).is_err() || !topic::matches(&s.topic, name) {
                    return false;
                }
                let Some(t) = self.topics.get(name.as_str()) else {
                    return true;
                };
                if t.seq == 0 && !t.has_last() {
                    return true;
                }
                let oldest = t.history.front().map_or(t.seq + 1, |m| m.seq);
                t.head.epoch() == pos.epoch
                    && (pos.seq > t.seq || (pos.seq < t.seq && oldest > pos.seq + 1))
            })
            .map(|(name, _)| name.clone())
            .collect();
        since.sort();
        let snapshot = s.snapshot
            && (topic::is_pattern(&s.topic)
                || (!s.since.contains_key(&s.topic)
                    && self
                        .topics
                        .get(s.topic.as_str())
                        .is_none_or(|t| !t.has_last())));
        Unanswered { since, snapshot }
    }

    /// Fills in what this engine lacks of `topic` from a durable store: `recalled` are the
    /// store's messages of epoch `epoch`, consecutive and ascending. What is held is kept (it may
    /// be newer than the store, which is written asynchronously); the history becomes the
    /// consecutive run ending at the newest message either side knows, trimmed by the topic's
    /// history rule. A topic held in another epoch is left alone: what is held is newer (live
    /// messages, or this node's own numbering).
    pub fn restore(&mut self, topic_name: &str, epoch: &str, recalled: Vec<Recalled>) {
        let Some(newest) = recalled.last().map(|m| m.seq) else {
            return;
        };
        if topic::validate_topic(topic_name).is_err() {
            return;
        }
        let config = &self.config;
        let at = self.publish_count;
        let (state, recency) = self.topics.recording(config, topic_name, Numbering::Origin);
        if state.head.epoch() != epoch {
            if state.seq != 0 || state.has_last() {
                return;
            }
            state.restart(epoch.to_owned(), 0, true);
        }
        let mut by_seq: BTreeMap<u64, Stored> =
            state.history.drain(..).map(|m| (m.seq, m)).collect();
        state.history_bytes = 0;
        for m in recalled {
            by_seq.entry(m.seq).or_insert_with(|| {
                let p = &m.publish;
                Stored {
                    seq: m.seq,
                    at_us: m.at_us,
                    at,
                    message: message_of(&state.head, m.seq, p, p.stamp.then_some(m.at_us)),
                }
            });
        }
        // History is consecutive by construction (a hole restarts it): keep the run that ends at
        // the newest message. Held history, when there is any, always ends at `state.seq`.
        let top = state.seq.max(newest);
        let mut run = Vec::new();
        let mut seq = top;
        while let Some(m) = by_seq.remove(&seq) {
            run.push(m);
            seq -= 1;
        }
        // A message read back is recorded now, after every publish so far.
        if run.iter().any(|m| m.at > state.last_at()) {
            recency.stamp(state, at);
        }
        let rule = state.history_rule(config);
        for m in run.into_iter().rev() {
            state.record(rule, m);
        }
        state.seq = top;
        if state.foreign {
            state.remote_at = self.publish_count;
        }
    }

    /// Topics this engine numbers, with their epoch and last seq: after an outage of the link
    /// to the other nodes, this node announces them so that others find what never reached
    /// them ([`Engine::remote_reached`]).
    pub fn local_positions(&self) -> Vec<(String, String, u64)> {
        self.topics
            .iter()
            .filter(|t| !t.foreign && t.seq > 0)
            .map(|t| (t.name.to_string(), t.head.epoch().to_owned(), t.seq))
            .collect()
    }

    /// `topic`'s origin announced that it reached `seq` in `epoch` (after an outage of the link
    /// between nodes). If this engine holds less of that epoch, the messages in between never came:
    /// its subscribers are told the exact count now, as they would be by the next message, and
    /// history across the hole is dropped. Returns the count.
    pub fn remote_reached(&mut self, topic_name: &str, epoch: &str, seq: u64) -> u64 {
        let Some(state) = self.topics.get_mut(topic_name) else {
            return 0;
        };
        if state.head.epoch() != epoch || seq <= state.seq {
            return 0;
        }
        let missed = seq - state.seq;
        state.restart(epoch.to_owned(), seq, true);
        let before = state.remote_at;
        self.notify_hole(topic_name, missed, before);
        if let Some(state) = self.topics.get_mut(topic_name) {
            state.remote_at = self.publish_count;
        }
        missed
    }

    /// `pattern` lost its last local subscriber: topics numbered elsewhere that no held pattern
    /// matches any more are no longer followed, and what this engine holds of them would go
    /// stale (a `since` answered from it would miss what was published meanwhile), so they are
    /// forgotten. A later subscriber recovers from the durable store or is told it cannot.
    pub(super) fn forget_unfollowed(&mut self, pattern: &str) {
        let Some(counts) = self.interest.as_ref() else {
            return;
        };
        let stale: Vec<Arc<str>> = self
            .topics
            .matching(pattern)
            .into_iter()
            .filter(|t| t.foreign && !counts.keys().any(|p| topic::matches(p, &t.name)))
            .map(|t| t.name.clone())
            .collect();
        for name in stale {
            self.forget(&name);
        }
    }
}
