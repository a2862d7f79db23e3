//! The topics an engine holds: each one's numbering (epoch, seq), history and last value, and
//! the map that finds them by name.
//!
//! Every publish looks its topic up here once, so the map hashes with foldhash (like the
//! subscription index) and finds-or-creates in a single probe (`raw_entry_mut`): std's `HashMap`
//! needs a second lookup to create on a miss without cloning the name on every hit.

use super::{EngineConfig, HistoryRule};
use crate::topic;
use crate::wire::{Frame, MessageHead};
use std::collections::VecDeque;
use std::sync::Arc;

pub(super) struct Stored {
    pub seq: u64,
    pub at_us: u64,
    pub frame: Frame,
}

pub(super) struct TopicState {
    /// The name, shared with every queued delivery of this topic.
    pub name: Arc<str>,
    /// Index into `EngineConfig::policy`: the topic's default slow-consumer policy.
    pub policy_rule: Option<usize>,
    pub seq: u64,
    pub epoch: String,
    /// The JSON its messages start with under this epoch.
    pub head: MessageHead,
    /// Index into `EngineConfig::history`, or `None` for last-value only.
    pub rule: Option<usize>,
    pub history: VecDeque<Stored>,
    pub history_bytes: usize,
    pub last: Option<Frame>,
    /// The epoch was adopted from another node's message (see `Engine::publish_remote`): a
    /// local publish must start an epoch of its own rather than reuse the origin's numbers.
    pub foreign: bool,
    /// The publish count when the last message from another node was recorded.
    pub remote_at: u64,
}

impl TopicState {
    /// Starts over under `epoch`: what is held belongs to another numbering.
    pub fn restart(&mut self, epoch: String, seq: u64, foreign: bool) {
        self.head = MessageHead::new(&self.name, &epoch);
        self.epoch = epoch;
        self.seq = seq;
        self.foreign = foreign;
        self.history.clear();
        self.history_bytes = 0;
    }

    pub fn trim_by_age(&mut self, rule: &HistoryRule, now_us: u64) {
        let max_age_us = rule.max_age_secs.saturating_mul(1_000_000);
        while let Some(oldest) = self.history.front() {
            if now_us.saturating_sub(oldest.at_us) <= max_age_us {
                break;
            }
            self.history_bytes -= oldest.frame.len();
            self.history.pop_front();
        }
    }

    pub fn record(&mut self, rule: Option<&HistoryRule>, stored: Stored) {
        self.last = Some(stored.frame.clone());
        let Some(rule) = rule.filter(|r| r.max_messages > 0) else {
            return;
        };
        self.history_bytes += stored.frame.len();
        self.history.push_back(stored);
        while self.history.len() > rule.max_messages
            || (self.history_bytes > rule.max_bytes && self.history.len() > 1)
        {
            let old = self.history.pop_front().expect("non-empty");
            self.history_bytes -= old.frame.len();
        }
    }
}

/// Who gives a message its sequence number.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Numbering {
    /// This node: it was published here.
    Local,
    /// The node it was published on, whose `(epoch, seq)` this node keeps.
    Origin,
}

type TopicMap = hashbrown::HashMap<Box<str>, TopicState, foldhash::fast::RandomState>;

/// Topic states by name, and what gives each new numbering its epoch.
pub(super) struct Topics {
    map: TopicMap,
    /// Makes epochs differ between runs (the server passes a random number; tests a fixed one).
    epoch_seed: u64,
    /// Epochs handed out so far.
    epochs: u64,
}

impl Topics {
    pub fn new(epoch_seed: u64) -> Self {
        Topics {
            map: TopicMap::default(),
            epoch_seed,
            epochs: 0,
        }
    }

    /// The state of topic `name`, created (with a fresh epoch) on first use. For a message this
    /// node numbers, a topic numbered by another node until now starts an epoch of its own.
    pub fn entry(
        &mut self,
        config: &EngineConfig,
        name: &str,
        numbering: Numbering,
    ) -> &mut TopicState {
        let Topics {
            map,
            epoch_seed,
            epochs,
        } = self;
        let mut next_epoch = || {
            *epochs += 1;
            new_epoch(*epoch_seed, *epochs)
        };
        let (_, state) = map.raw_entry_mut().from_key(name).or_insert_with(|| {
            let epoch = next_epoch();
            let state = TopicState {
                name: name.into(),
                policy_rule: policy_rule(config, name),
                seq: 0,
                head: MessageHead::new(name, &epoch),
                epoch,
                rule: config
                    .history
                    .iter()
                    .position(|r| topic::matches(&r.pattern, name)),
                history: VecDeque::new(),
                history_bytes: 0,
                last: None,
                foreign: false,
                remote_at: 0,
            };
            (name.into(), state)
        });
        if numbering == Numbering::Local && state.foreign {
            state.restart(next_epoch(), 0, false);
        }
        state
    }

    pub fn get(&self, name: &str) -> Option<&TopicState> {
        self.map.get(name)
    }

    pub fn get_mut(&mut self, name: &str) -> Option<&mut TopicState> {
        self.map.get_mut(name)
    }

    pub fn remove(&mut self, name: &str) {
        self.map.remove(name);
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&Box<str>, &TopicState)> {
        self.map.iter()
    }
}

/// The epoch of the `n`th numbering an engine started.
fn new_epoch(epoch_seed: u64, n: u64) -> String {
    format!("{:012x}", splitmix64(epoch_seed ^ n) >> 16)
}

/// The first configured policy rule that matches `name`.
pub(super) fn policy_rule(config: &EngineConfig, name: &str) -> Option<usize> {
    config
        .policy
        .iter()
        .position(|r| topic::matches(&r.pattern, name))
}

/// A fast, well-mixed 64-bit hash (Steele et al.), enough to make epochs unpredictable between
/// runs given a random seed.
fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}
