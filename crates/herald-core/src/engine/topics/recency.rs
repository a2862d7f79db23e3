//! The topics in the order they were last published: a recovery from a cursor walks back from
//! the newest while they were published after it, so that it costs the topics it finds, never
//! every topic its pattern matches.
//!
//! A doubly linked list over slots, one per topic, given when the topic is made and taken back
//! when it is forgotten: stamping a publish moves its topic's slot to the newest end, a few
//! writes whatever the number of topics. The links live here, by slot, rather than in the
//! topics' boxed states, so that the list is safe code: a link into another state would be a
//! pointer the topic table hands out again as a unique reference.

use super::TopicState;
use std::sync::Arc;

/// No slot: the end of the list, or a topic never published.
const NONE: u32 = u32::MAX;

struct Node {
    /// The topic published before this one was, or [`NONE`].
    older: u32,
    /// The topic published after this one was, or [`NONE`].
    newer: u32,
    /// The topic's name, to find its state by; `None` for a free slot.
    name: Option<Arc<str>>,
}

pub(in crate::engine) struct Recency {
    nodes: Vec<Node>,
    /// Slots of forgotten topics, given to the next topics made.
    free: Vec<u32>,
    newest: u32,
    oldest: u32,
}

impl Recency {
    pub fn new() -> Self {
        Recency {
            nodes: Vec::new(),
            free: Vec::new(),
            newest: NONE,
            oldest: NONE,
        }
    }

    /// A slot for the new topic `name`, out of the list until its first [`Recency::stamp`].
    pub fn add(&mut self, name: Arc<str>) -> u32 {
        let node = Node {
            older: NONE,
            newer: NONE,
            name: Some(name),
        };
        match self.free.pop() {
            Some(slot) => {
                self.nodes[slot as usize] = node;
                slot
            }
            None => {
                let slot = u32::try_from(self.nodes.len())
                    .ok()
                    .filter(|&slot| slot != NONE)
                    .expect("fewer topics than slots: each takes hundreds of bytes");
                self.nodes.push(node);
                slot
            }
        }
    }

    /// Takes back the slot of a topic that is forgotten.
    pub fn remove(&mut self, slot: u32) {
        self.unlink(slot);
        let node = &mut self.nodes[slot as usize];
        *node = Node {
            older: NONE,
            newer: NONE,
            name: None,
        };
        self.free.push(slot);
    }

    /// Notes that a message was recorded on `state` at publish count `at`, the newest there is
    /// (no topic was stamped later): it becomes the topic's `last_at`, and the topic the newest.
    #[inline]
    pub fn stamp(&mut self, state: &mut TopicState, at: u64) {
        state.last_at = at;
        let slot = state.slot;
        if self.newest == slot {
            return;
        }
        self.unlink(slot);
        let node = &mut self.nodes[slot as usize];
        node.older = self.newest;
        node.newer = NONE;
        match self.newest {
            NONE => self.oldest = slot,
            newest => self.nodes[newest as usize].newer = slot,
        }
        self.newest = slot;
    }

    /// The names of the topics published so far, the most recently published first.
    pub fn newest_first(&self) -> impl Iterator<Item = &Arc<str>> + '_ {
        let mut slot = self.newest;
        std::iter::from_fn(move || {
            let node = self.nodes.get(slot as usize)?;
            slot = node.older;
            Some(node)
        })
        .filter_map(|node| node.name.as_ref())
    }

    /// Takes `slot` out of the list, if it is in it.
    #[inline]
    fn unlink(&mut self, slot: u32) {
        let Node { older, newer, .. } = self.nodes[slot as usize];
        if older == NONE && self.oldest != slot {
            return;
        }
        match older {
            NONE => self.oldest = newer,
            older => self.nodes[older as usize].newer = newer,
        }
        match newer {
            NONE => self.newest = older,
            newer => self.nodes[newer as usize].older = older,
        }
    }
}
