//! `lossless` subscriptions: who a publisher waits for, and the credit that releases it.

use super::*;

impl<O: Outbox> Engine<O> {
    /// Whether a message on `topic` with a payload of `len` bytes would exceed a `lossless`
    /// subscriber's window: its publisher should wait for credit (or for the subscriber to go)
    /// before publishing.
    pub fn is_held(&self, topic_name: &str, len: usize) -> bool {
        let mut held = false;
        self.holders(topic_name, len, |_| held = true);
        held
    }

    /// The `lossless` subscribers whose window a message on `topic` of `len` payload bytes
    /// would exceed: those a publisher of it waits for.
    pub fn holders(&self, topic_name: &str, len: usize, mut found: impl FnMut(ConnId)) {
        let none = self.lossless == 0 && !self.groups.has_lossless();
        if none || topic::validate_topic(topic_name).is_err() {
            return;
        }
        self.group_holders(topic_name, len, &mut found);
        if self.lossless == 0 {
            return;
        }
        let default = self
            .topics
            .get(topic_name)
            .and_then(|t| t.policy_rule())
            .or_else(|| self.policy_rule_for(topic_name))
            .map_or((Policy::Disconnect, None), |i| {
                (self.config.policy[i].policy, self.config.policy[i].max_rate)
            });
        self.index.for_each_match(topic_name, |id| {
            if let Some(c) = self.conns[id as usize].as_ref() {
                let chosen = c.policy_for(topic_name, default);
                if let (Policy::Lossless, Some(i)) = (chosen.policy, chosen.sub) {
                    if !c.subs[i].credit().covers(len) {
                        found(id);
                    }
                }
            }
        });
    }

    pub(super) fn policy_rule_for(&self, topic_name: &str) -> Option<usize> {
        topics::policy_rule(&self.config, topic_name)
    }

    /// `{"op":"credit"}`: the subscription `pattern` grants `n` more messages and `bytes` more
    /// payload bytes.
    pub(super) fn credit(
        &mut self,
        conn: ConnId,
        id: Option<RequestId>,
        pattern: &str,
        n: u64,
        bytes: u64,
    ) -> Result<(), ProtocolError> {
        let Some(c) = self.conns.get_mut(conn as usize).and_then(Option::as_mut) else {
            return Ok(());
        };
        match c.subs.iter_mut().find(|s| *s.pattern == *pattern) {
            Some(s) if s.is_lossless() => {
                if let Some(credit) = s.credit_mut() {
                    credit.grant(n, bytes);
                }
                Ok(())
            }
            Some(_) => Err(ProtocolError::new(
                "not_lossless",
                format!("the subscription to {pattern:?} is not lossless; only lossless subscriptions take credit"),
            )
            .with_id(id)),
            None => Err(ProtocolError::new(
                "not_subscribed",
                format!("this connection holds no subscription to {pattern:?}; subscribe with \"policy\":\"lossless\" first"),
            )
            .with_id(id)),
        }
    }
}
