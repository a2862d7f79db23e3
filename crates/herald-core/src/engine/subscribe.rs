//! Subscribing, with the recovery a subscription is owed first, and unsubscribing.

use super::*;

impl<O: Outbox> Engine<O> {
    pub(super) fn subscribe(
        &mut self,
        conn: ConnId,
        s: Subscribe,
        now_us: u64,
    ) -> Result<(), ProtocolError> {
        let fail = |code, msg: String| ProtocolError::new(code, msg).with_id(s.id.clone());
        topic::validate_pattern(&s.topic).map_err(|e| fail(e.code(), e.to_string()))?;
        if s.policy == Some(Policy::Lossless) && !self.config.allows_lossless(&s.topic) {
            return Err(fail(
                "forbidden",
                format!(
                    "lossless subscriptions (which hold publishers) are allowed only within the configured lossless_topics {:?}; subscribe to {:?} with another policy",
                    self.config.lossless_topics, s.topic
                ),
            ));
        }
        if s.group.is_some() {
            return self.join_group(conn, s);
        }
        let Some(c) = self.conn(conn) else {
            return Ok(());
        };
        let already = c.subs.iter().any(|sub| *sub.pattern == *s.topic);
        let max = self.config.max_subscriptions_per_connection;
        if !already && c.subs.len() + self.groups.count_of(conn) >= max {
            return Err(fail(
                "too_many_subscriptions",
                format!("this connection already holds the maximum of {max} subscriptions; unsubscribe first or raise max_subscriptions_per_connection"),
            ));
        }
        let mut since: Vec<_> = s.since.iter().collect();
        since.sort_by(|a, b| a.0.cmp(b.0));
        for (name, _) in &since {
            if topic::validate_topic(name).is_err() || !topic::matches(&s.topic, name) {
                return Err(fail(
                    "invalid_topic",
                    format!(
                        "`since` names {name:?}, which is not a topic that pattern {:?} matches",
                        s.topic
                    ),
                ));
            }
        }

        // The connection's recovery room, asked (under its queue's lock) only when there is
        // something to send, and once.
        let mut asked = None;
        let room = |e: &Self| e.conn(conn).map_or(0, |c| c.outbox.recovery_room());
        let recovery = self.recover(&s, now_us).fit(|| *asked.insert(room(self)));
        let snapshot = if s.snapshot {
            let room = asked.unwrap_or_else(|| room(self));
            let replayed: usize = recovery.messages.iter().map(Message::size).sum();
            let cursor = recovery.replayed_after;
            self.start_snapshot(conn, &s, cursor, room.saturating_sub(replayed), now_us)
        } else {
            Vec::new()
        };

        let sub = Sub::new(&s, self.publish_count);
        self.lossless += usize::from(sub.is_lossless());
        let c = self.conns[conn as usize].as_mut().expect("checked above");
        c.explicit += usize::from(sub.is_explicit());
        c.no_local += u32::from(sub.no_local());
        match c.subs.iter_mut().find(|old| old.pattern == sub.pattern) {
            // Subscribing again to the same pattern replaces its options (but it has been
            // listening since the first time).
            Some(old) => {
                c.explicit -= usize::from(old.is_explicit());
                c.no_local -= u32::from(old.no_local());
                self.lossless -= usize::from(old.is_lossless());
                *old = Sub {
                    subscribed_at: old.subscribed_at,
                    ..sub
                };
            }
            None => {
                c.subs.push(sub);
                self.index.insert(&s.topic, conn);
                self.interest_up(&s.topic);
                self.subscriptions += 1;
            }
        }
        let reply = Reply::Subscribed {
            id: s.id,
            topic: s.topic,
            recovered: recovery.gaps.is_empty(),
            replayed: recovery.messages.len() + snapshot.len(),
            gaps: recovery.gaps,
            cursor: self.cursor(),
        };
        self.reply(conn, &reply);
        if let Some(c) = self.conn(conn) {
            let recovered = recovery.messages.iter().chain(&snapshot);
            recovered.for_each(|m| c.outbox.recovered(m));
        }
        Ok(())
    }

    pub(super) fn unsubscribe(
        &mut self,
        conn: ConnId,
        id: Option<RequestId>,
        pattern: String,
    ) -> Result<(), ProtocolError> {
        let Some(c) = self.conns.get_mut(conn as usize).and_then(Option::as_mut) else {
            return Ok(());
        };
        let Some(at) = c.subs.iter().position(|s| *s.pattern == *pattern) else {
            return Err(ProtocolError::new(
                "not_subscribed",
                format!(
                    "this connection holds no subscription to {pattern:?}; nothing to unsubscribe"
                ),
            )
            .with_id(id));
        };
        let sub = c.subs.remove(at);
        c.explicit -= usize::from(sub.is_explicit());
        c.no_local -= u32::from(sub.no_local());
        self.lossless -= usize::from(sub.is_lossless());
        self.index.remove(&pattern, conn);
        self.interest_down(&pattern);
        self.subscriptions -= 1;
        self.snapshots.cancel(conn, Some(&pattern));
        self.reply(conn, &Reply::Unsubscribed { id, topic: pattern });
        Ok(())
    }
}
