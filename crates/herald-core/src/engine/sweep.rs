//! The sweep: what time does to topics while nobody publishes. History older than its rule's
//! `max_age_secs` goes (not only at the topic's next publish), and a topic that nothing was
//! published on for `topic_idle_us` and that no subscription matches is forgotten, its memory
//! given back. A forgotten topic published again starts a new epoch, so a client recovering
//! across it is told (`unknown_topic` or `epoch_changed`), never misled.
//!
//! The server calls it from a timer a slice at a time, walking topics in name order and
//! resuming where it stopped, so that one call holds the engine's lock for a bounded time
//! whatever the number of topics.

use super::{age, Engine, Outbox};
use std::sync::Arc;

/// What one slice of a sweep did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Swept {
    /// Topics looked at.
    pub visited: usize,
    /// Topics forgotten.
    pub forgotten: usize,
    /// Where the next slice starts (after this topic); `None`: the sweep went round, the next
    /// slice starts from the first topic.
    pub resume_after: Option<Arc<str>>,
}

impl<O: Outbox> Engine<O> {
    /// Sweeps at most `budget` topics after `after` (from the first when `None`).
    pub fn sweep(&mut self, now_us: u64, after: Option<&str>, budget: usize) -> Swept {
        let names: Vec<Arc<str>> = self
            .topics
            .page("", after, budget)
            .map(|t| t.name.clone())
            .collect();
        let mut swept = Swept {
            visited: names.len(),
            resume_after: (names.len() == budget)
                .then(|| names.last().cloned())
                .flatten(),
            ..Swept::default()
        };
        let idle_us = self.config.topic_idle_us;
        for name in names {
            let Some(state) = self.topics.get_mut(&name) else {
                continue;
            };
            age(&self.config, &mut self.usage, state, now_us);
            let idle = idle_us > 0 && now_us.saturating_sub(state.last_us) > idle_us;
            let mut subscribed = false;
            if idle {
                self.index.for_each_match(&name, |_| subscribed = true);
            }
            if idle && !subscribed {
                self.forget(&name);
                swept.forgotten += 1;
            }
        }
        swept
    }
}
