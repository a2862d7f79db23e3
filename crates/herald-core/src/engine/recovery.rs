//! Recovery: what a subscription is sent before its live messages, and what it is told it
//! cannot be sent.
//!
//! - `since` names the last position the client saw of some topics: herald replays what it
//!   holds after each.
//! - The subscription's cursor (where its first reply took effect) covers every other topic the
//!   pattern matches: what was published after it was never seen by the client (it would
//!   otherwise name the topic in `since`), so it is replayed too. A topic that first appeared
//!   under a wildcard while the client was away is recovered like the others. Those topics
//!   are found at the cost of what was published since or of what the pattern matches,
//!   whichever is less ([`published_since`]).
//! - `snapshot` adds the last value of each remaining topic: [`super::snapshot`], after the
//!   rest.
//!
//! A message that has expired (see [`crate::extras`]) is left out, without a gap: its
//! publisher said it is of no use by then.
//!
//! Whatever cannot be sent is a gap in the reply, never a silence: history that is no longer
//! held, an epoch that changed, and the part of a recovery larger than the connection may queue
//! (`Outbox::recovery_room`): the oldest messages are left out first.

use super::topics::{Stored, Topics};
use super::{age, Engine, Outbox};
use crate::message::Message;
use crate::reply::{Gap, GapReason};
use crate::request::Subscribe;
use crate::topic;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Steps each of the two searches of [`published_since`] takes in its turn.
const STRIDE: usize = 1024;

/// The topics `pattern` matches that were published after publish count `cursor`, in name
/// order. Two searches find them, a [`STRIDE`] of each in turn until one ends: the topics
/// published after the cursor, newest first (see [`Topics::published_after`]), kept where the
/// pattern matches, which costs the topics published since; and the topics the pattern
/// matches, in name order (see [`Topics::walk`]), kept where published after the cursor, which
/// costs the pattern's topics. So a recovery costs at most about twice the cheaper of the two:
/// `>` over a million topics, few of them published since, looks at those few; `orders/42/>`
/// with a cursor older than a million publishes looks under `orders/42/` only.
fn published_since(topics: &Topics, pattern: &str, cursor: u64) -> Vec<Arc<str>> {
    let mut by_recency = topics.published_after(cursor);
    let (mut recent, mut named) = (Vec::new(), Vec::new());
    let mut from = String::new();
    loop {
        for _ in 0..STRIDE {
            let Some(t) = by_recency.next() else {
                recent.sort_unstable();
                return recent;
            };
            if topic::matches(pattern, &t.name) {
                recent.push(t.name.clone());
            }
        }
        let rest = topics.walk(pattern, &from, STRIDE, |t| {
            if t.last_at() > cursor {
                named.push(t.name.clone());
            }
            true
        });
        match rest {
            Some(rest) => from = rest,
            None => return named,
        }
    }
}

/// What a recovery sends (in order) and what it cannot.
pub(super) struct Recovery {
    pub messages: Vec<Message>,
    pub gaps: Vec<Gap>,
    /// The cursor (publish count) the topics not named in `since` were replayed from, if any.
    pub replayed_after: Option<u64>,
}

/// One message a recovery would send.
struct Item {
    /// Publish count when it was recorded: the oldest are left out first.
    at: u64,
    /// Index into the recovery's topic names.
    topic: usize,
    seq: u64,
    message: Message,
}

/// Collects the messages and gaps of one recovery, topic by topic.
#[derive(Default)]
pub(super) struct Plan {
    names: Vec<Arc<str>>,
    items: Vec<Item>,
    gaps: Vec<Gap>,
    replayed_after: Option<u64>,
}

impl Plan {
    fn topic(&mut self, name: &Arc<str>) -> usize {
        self.names.push(name.clone());
        self.names.len() - 1
    }

    /// Queues the held messages `held` of topic `t` (an index from [`Plan::topic`]).
    fn replay<'a>(&mut self, t: usize, held: impl Iterator<Item = &'a Stored>) {
        self.items.extend(held.map(|m| Item {
            at: m.at,
            topic: t,
            seq: m.seq,
            message: m.message.clone(),
        }));
    }

    fn gap(&mut self, name: &str, reason: GapReason) {
        self.gaps.push(Gap {
            topic: name.to_owned(),
            reason,
        });
    }

    /// Leaves out the oldest messages until the rest fit in `room()` bytes ([`Message::size`]; asked only when
    /// there is something to send), each topic's left-out run reported as a `recovery_limit`
    /// gap.
    pub(super) fn fit(mut self, room: impl FnOnce() -> usize) -> Recovery {
        let total: usize = self.items.iter().map(|i| i.message.size()).sum();
        let room = if total == 0 { 0 } else { room() };
        if total > room {
            let mut by_age: Vec<usize> = (0..self.items.len()).collect();
            by_age.sort_by_key(|&i| self.items[i].at);
            let mut left = total;
            let mut out = vec![false; self.items.len()];
            for i in by_age {
                if left <= room {
                    break;
                }
                out[i] = true;
                left -= self.items[i].message.size();
            }
            let mut runs: BTreeMap<usize, (u64, u64)> = BTreeMap::new();
            for (item, _) in self.items.iter().zip(&out).filter(|(_, out)| **out) {
                let run = runs.entry(item.topic).or_insert((item.seq, item.seq));
                run.0 = run.0.min(item.seq);
                run.1 = run.1.max(item.seq);
            }
            for (t, (from, to)) in runs {
                let name = self.names[t].clone();
                self.gap(&name, GapReason::RecoveryLimit { from, to });
            }
            let mut out = out.into_iter();
            self.items
                .retain(|_| !out.next().expect("one flag per item"));
        }
        Recovery {
            messages: self.items.into_iter().map(|i| i.message).collect(),
            gaps: self.gaps,
            replayed_after: self.replayed_after,
        }
    }
}

impl<O: Outbox> Engine<O> {
    /// Where a subscription made now takes effect: everything published after it reaches the
    /// subscription live. Opaque to clients: this engine's instance and its publish count.
    pub fn cursor(&self) -> String {
        format!("{}.{}", self.topics.instance(), self.publish_count)
    }

    /// The publish count a cursor names. A cursor of another instance (herald restarted, or
    /// another node), or one that does not parse, names the beginning: everything held is
    /// after it, so a recovery from it may repeat but never hides a loss.
    fn cursor_position(&self, cursor: Option<&str>) -> u64 {
        cursor
            .and_then(|c| c.split_once('.'))
            .filter(|(instance, _)| *instance == self.topics.instance())
            .and_then(|(_, count)| count.parse::<u64>().ok())
            .filter(|&count| count <= self.publish_count)
            .unwrap_or(0)
    }

    /// What subscription `s` is owed before its live messages, its snapshot aside;
    /// [`Plan::fit`] then keeps what the connection has room for.
    pub(super) fn recover(&mut self, s: &Subscribe, now_us: u64) -> Plan {
        let recovering = s.cursor.is_some() || !s.since.is_empty();
        let cursor = self.cursor_position(s.cursor.as_deref());
        let mut plan = Plan::default();

        let mut since: Vec<_> = s.since.iter().collect();
        since.sort_by(|a, b| a.0.cmp(b.0));
        for (name, pos) in since {
            let Some(state) = self.topics.get_mut(name.as_str()) else {
                plan.gap(name, GapReason::UnknownTopic);
                continue;
            };
            age(&self.config, &mut self.usage, state, now_us);
            let t = plan.topic(&state.name);
            if state.head.epoch() != pos.epoch {
                plan.gap(
                    name,
                    GapReason::EpochChanged {
                        epoch: state.head.epoch().to_owned(),
                    },
                );
                plan.replay(t, state.history.iter());
                continue;
            }
            // A position at or past the topic's last message has nothing after it (a `seq` of
            // u64::MAX included: no `seq + 1` to wrap).
            if pos.seq >= state.seq {
                continue;
            }
            let next = pos.seq + 1;
            let oldest = state.history.front().map_or(state.seq + 1, |m| m.seq);
            if oldest > next {
                plan.gap(
                    name,
                    GapReason::HistoryTrimmed {
                        from: next,
                        to: oldest - 1,
                    },
                );
            }
            plan.replay(t, state.history.iter().filter(|m| m.seq >= next));
        }

        if recovering {
            plan.replayed_after = Some(cursor);
            let others = published_since(&self.topics, &s.topic, cursor);
            for name in others {
                if s.since.contains_key(&*name) {
                    continue;
                }
                let Some(state) = self.topics.get_mut(&name) else {
                    continue;
                };
                age(&self.config, &mut self.usage, state, now_us);
                let t = plan.topic(&name);
                if state.dropped_at > cursor {
                    // Some of what came after the cursor is gone. Which of the messages
                    // before the oldest held one followed the cursor is not known: the gap
                    // runs from the first, none of which the client saw.
                    let to = state.history.front().map_or(state.seq, |m| m.seq - 1);
                    let reason = if to >= 1 {
                        GapReason::HistoryTrimmed { from: 1, to }
                    } else {
                        GapReason::EpochChanged {
                            epoch: state.head.epoch().to_owned(),
                        }
                    };
                    plan.gap(&name, reason);
                }
                plan.replay(t, state.history.iter().filter(|m| m.at > cursor));
            }
        }
        // An expired message is not delivered: its publisher said it would be of no use.
        plan.items.retain(|i| !i.message.expired(now_us));
        debug_assert!(plan.names.iter().all(|n| topic::matches(&s.topic, n)));
        plan
    }
}
