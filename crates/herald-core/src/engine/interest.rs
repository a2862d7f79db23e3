//! Interest: the patterns this engine's connections hold, counted so that a cluster broker
//! follows upstream only what local clients want.

use super::*;

impl<O: Outbox> Engine<O> {
    /// From now on, record [`Interest`] changes for [`Engine::take_interest_changes`]. Patterns
    /// already held are reported as added.
    pub fn track_interest(&mut self) {
        let mut counts: HashMap<Box<str>, usize> = HashMap::new();
        for c in self.conns.iter().flatten() {
            for sub in &c.subs {
                *counts.entry(sub.pattern.as_str().into()).or_default() += 1;
            }
        }
        self.interest_changes = counts
            .keys()
            .map(|p| Interest::Added(p.to_string()))
            .collect();
        self.interest = Some(counts);
    }

    /// The interest changes since the last call, in order.
    pub fn take_interest_changes(&mut self) -> Vec<Interest> {
        std::mem::take(&mut self.interest_changes)
    }

    pub(super) fn interest_up(&mut self, pattern: &str) {
        if let Some(counts) = self.interest.as_mut() {
            let n = counts.entry(pattern.into()).or_default();
            *n += 1;
            if *n == 1 {
                self.interest_changes
                    .push(Interest::Added(pattern.to_owned()));
            }
        }
    }

    pub(super) fn interest_down(&mut self, pattern: &str) {
        if let Some(counts) = self.interest.as_mut() {
            if let Some(n) = counts.get_mut(pattern) {
                *n -= 1;
                if *n == 0 {
                    counts.remove(pattern);
                    self.interest_changes
                        .push(Interest::Removed(pattern.to_owned()));
                    self.forget_unfollowed(pattern);
                }
            }
        }
    }
}
