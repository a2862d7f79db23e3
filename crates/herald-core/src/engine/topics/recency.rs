//! The topics in the order they were last published: a recovery from a cursor walks back from
//! the newest while they were published after it, so that it costs the topics it finds, never
//! every topic its pattern matches.
//!
//! A circular doubly linked list over slots, one per topic, given when the topic is made and
//! taken back when it is forgotten, with slot 0 standing for both ends: stamping a publish moves
//! its topic's slot to the newest end, a few writes whatever the number of topics, with no case
//! for a slot at either end or out of the list (such a slot links to itself, so taking it out
//! changes nothing). The links live here, by slot, rather than in the topics' boxed states, so
//! that the list is safe code: a link into another state would be a pointer the topic table
//! hands out again as a unique reference.

use super::TopicState;
use std::sync::Arc;

/// The slot before the oldest and after the newest.
const ENDS: u32 = 0;

struct Node {
    /// The topic published before this one was, or [`ENDS`].
    older: u32,
    /// The topic published after this one was, or [`ENDS`].
    newer: u32,
    /// The topic's name, to find its state by; `None` for a free slot, and for [`ENDS`].
    name: Option<Arc<str>>,
}

impl Node {
    /// Slot `slot`, out of the list.
    fn alone(slot: u32, name: Option<Arc<str>>) -> Self {
        Node {
            older: slot,
            newer: slot,
            name,
        }
    }
}

pub(in crate::engine) struct Recency {
    nodes: Vec<Node>,
    /// Slots of forgotten topics, given to the next topics made.
    free: Vec<u32>,
}

impl Recency {
    pub fn new() -> Self {
        Recency {
            nodes: vec![Node::alone(ENDS, None)],
            free: Vec::new(),
        }
    }

    /// A slot for the new topic `name`, out of the list until its first [`Recency::stamp`].
    pub fn add(&mut self, name: Arc<str>) -> u32 {
        if let Some(slot) = self.free.pop() {
            self.nodes[slot as usize] = Node::alone(slot, Some(name));
            return slot;
        }
        let slot = u32::try_from(self.nodes.len())
            .expect("fewer topics than slots: each takes hundreds of bytes");
        self.nodes.push(Node::alone(slot, Some(name)));
        slot
    }

    /// Takes back the slot of a topic that is forgotten.
    pub fn remove(&mut self, slot: u32) {
        self.unlink(slot);
        self.nodes[slot as usize] = Node::alone(slot, None);
        self.free.push(slot);
    }

    /// Notes that a message was recorded on `state` at publish count `at`, the newest there is
    /// (no topic was stamped later): it becomes the topic's `last_at`, and the topic the newest.
    #[inline(always)]
    pub fn stamp(&mut self, state: &mut TopicState, at: u64) {
        state.last_at = at;
        let slot = state.slot;
        let newest = self.nodes[ENDS as usize].older;
        if newest == slot {
            return;
        }
        self.unlink(slot);
        self.nodes[newest as usize].newer = slot;
        let node = &mut self.nodes[slot as usize];
        node.older = newest;
        node.newer = ENDS;
        self.nodes[ENDS as usize].older = slot;
    }

    /// The names of the topics published so far, the most recently published first.
    pub fn newest_first(&self) -> impl Iterator<Item = &Arc<str>> + '_ {
        let mut slot = self.nodes[ENDS as usize].older;
        std::iter::from_fn(move || {
            let node = &self.nodes[slot as usize];
            slot = node.older;
            node.name.as_ref()
        })
    }

    /// Takes `slot` out of the list, its neighbours linked to each other (its own links are
    /// left as they were, for the caller to set).
    #[inline(always)]
    fn unlink(&mut self, slot: u32) {
        let Node { older, newer, .. } = self.nodes[slot as usize];
        self.nodes[older as usize].newer = newer;
        self.nodes[newer as usize].older = older;
    }
}

#[cfg(test)]
mod tests {
    use crate::engine::topics::{Numbering, Topics};
    use crate::engine::EngineConfig;
    use crate::mix::splitmix64;

    /// Through topics made, published (stamped) and forgotten at random, the list holds exactly
    /// the topics published and still held, the most recently published first.
    #[test]
    fn the_list_follows_the_publishes_through_removals() {
        let config = EngineConfig::default();
        let mut topics = Topics::new(1);
        // The names in the order they were last published, the newest last.
        let mut order: Vec<String> = Vec::new();
        let mut random = 1u64;
        for at in 1..20_000 {
            random = splitmix64(random);
            let name = format!("t/{}", (random >> 32) % 300);
            if random.is_multiple_of(5) {
                topics.remove(&name);
                order.retain(|n| *n != name);
            } else {
                let (state, recency) = topics.recording(&config, &name, Numbering::Local);
                recency.stamp(state, at);
                order.retain(|n| *n != name);
                order.push(name);
            }
            let listed: Vec<&str> = topics
                .recency
                .newest_first()
                .take(order.len() + 1)
                .map(|n| &**n)
                .collect();
            assert!(listed.iter().eq(order.iter().rev()), "after {at} steps");
        }
    }
}
