//! Publishing: a message is checked, numbered, recorded and handed to every matching
//! connection once, under each one's slow-consumer policy; a message another node numbered
//! keeps its numbers, and a hole in them is announced.

use super::*;

impl<O: Outbox> Engine<O> {
    /// A publish from connection `conn`: acknowledged when it carries an `id`, refused with an
    /// error reply. Takes the request by reference, so that a server holding it while the
    /// publish waits for a `lossless` subscriber need not copy it.
    pub fn publish_from(
        &mut self,
        conn: ConnId,
        p: &Publish,
        now_us: u64,
    ) -> Result<Published, &'static str> {
        let origin = self.conn(conn).map_or(0, |c| c.origin);
        let published = self
            .check(p, origin)
            .map(|()| self.append(p, now_us, Numbering::Local, origin, Some(conn)));
        match published {
            Ok(published) => {
                if let Some(id) = &p.id {
                    let ack = Reply::Ack {
                        id: id.clone(),
                        topic: p.topic.to_string(),
                        seq: published.seq,
                    };
                    self.reply(conn, &ack);
                }
                Ok(published)
            }
            Err(e) => {
                let code = e.code;
                self.reply(conn, &e.into());
                Err(code)
            }
        }
    }

    /// Publishes a message: assigns the topic's next sequence number, makes the message once,
    /// records it, and hands it to every matching connection once.
    pub fn publish(&mut self, p: &Publish, now_us: u64) -> Result<Published, ProtocolError> {
        self.publish_by(p, 0, now_us)
    }

    /// [`Engine::publish`] charged to `origin`: a topic it creates counts against its quotas.
    pub fn publish_by(
        &mut self,
        p: &Publish,
        origin: Origin,
        now_us: u64,
    ) -> Result<Published, ProtocolError> {
        self.check(p, origin)?;
        Ok(self.append(p, now_us, Numbering::Local, origin, None))
    }

    /// Publishes a message another node published and numbered `(epoch, seq)`, keeping its
    /// numbers so that every node holds the same `(epoch, seq)` for it: a subscriber that moves
    /// to another node recovers with `since` as if it had stayed. A different epoch is adopted
    /// (what was held is dropped: it belongs to another numbering); a message not newer than
    /// the last is ignored (a duplicate); a jump in `seq` means messages were lost on the way,
    /// so history is dropped (recovery across the hole reports it) and matching subscribers
    /// are sent a `dropped` notice with the count before the message.
    pub fn publish_remote(
        &mut self,
        p: &Publish,
        epoch: &str,
        seq: u64,
        now_us: u64,
    ) -> Result<RemotePublished, ProtocolError> {
        self.check(p, 0)?;
        let state = self.topics.entry(&self.config, &p.topic, Numbering::Origin);
        let mut missed = 0;
        if state.head.epoch() != epoch {
            state.restart(epoch.to_owned(), seq.saturating_sub(1), true);
        } else if seq <= state.seq {
            let published = Published {
                seq,
                deliveries: 0,
                cut: Vec::new(),
            };
            return Ok(RemotePublished { published, missed });
        } else if seq > state.seq + 1 {
            missed = seq - state.seq - 1;
            let epoch = state.head.epoch().to_owned();
            state.restart(epoch, seq - 1, true);
        }
        let before = state.remote_at;
        if missed > 0 {
            self.notify_hole(&p.topic, missed, before);
        }
        let published = self.append(p, now_us, Numbering::Origin, 0, None);
        let at = self.publish_count;
        if let Some(state) = self.topics.get_mut(p.topic.as_str()) {
            state.remote_at = at;
        }
        Ok(RemotePublished { published, missed })
    }

    /// Tells the subscribers of `name` that were already listening when its previous remote
    /// message arrived (publish count `before`) that `missed` messages never came. Those who
    /// subscribed later did not miss them: this node was not following the topic meanwhile.
    pub(super) fn notify_hole(&mut self, name: &str, missed: u64, before: u64) {
        self.publish_count += 1;
        let generation = self.publish_count;
        let conns = &mut self.conns;
        self.index.for_each_match(name, |id| {
            if let Some(c) = conns[id as usize].as_mut() {
                let listening = c
                    .subs
                    .iter()
                    .any(|sub| sub.subscribed_at <= before && topic::matches(&sub.pattern, name));
                if c.seen != generation && listening {
                    c.seen = generation;
                    c.outbox.dropped(name, missed, DropReason::Remote);
                }
            }
        });
    }

    /// Refuses a message that may not be published: bad topic, too large, text not UTF-8, a
    /// new topic past `max_topics` or past `origin`'s quotas.
    pub(super) fn check(&self, p: &Publish, origin: Origin) -> Result<(), ProtocolError> {
        let fail = |e: ProtocolError| e.with_id(p.id.clone());
        topic::validate_topic(&p.topic)
            .map_err(|e| fail(ProtocolError::new(e.code(), e.to_string())))?;
        // Looked up only when full: every other publish finds its topic once, in `append`.
        if self.topics.len() >= self.config.max_topics && self.topics.get(&p.topic).is_none() {
            return Err(fail(ProtocolError::new(
                "too_many_topics",
                format!(
                    "herald holds its maximum of {} topics (max_topics); publish to an existing topic, or wait for idle topics to be forgotten",
                    self.config.max_topics
                ),
            )));
        }
        if origin != 0 {
            let usage = self.usage(origin);
            let (max_topics, max_bytes) = (
                self.config.max_topics_per_origin,
                self.config.max_retained_bytes_per_origin,
            );
            let full = usage.topics >= max_topics || usage.retained >= max_bytes;
            if full && self.topics.get(&p.topic).is_none() {
                let (code, what) = if usage.topics >= max_topics {
                    (
                        "too_many_topics",
                        format!(
                            "the {} topics you created are your maximum (max_topics_per_subject)",
                            usage.topics
                        ),
                    )
                } else {
                    ("retained_limit", format!("the topics you created keep {} bytes, your maximum of {max_bytes} (max_retained_bytes_per_subject)", usage.retained))
                };
                return Err(fail(ProtocolError::new(
                    code,
                    format!("{what}: publish to the topics you have, or wait for idle ones to be forgotten"),
                )));
            }
        }
        if p.payload.len() > self.config.max_message_bytes {
            return Err(fail(ProtocolError::new(
                "message_too_large",
                format!(
                    "payload of {} bytes exceeds max_message_bytes ({}); raise it in the config or send less",
                    p.payload.len(),
                    self.config.max_message_bytes
                ),
            )));
        }
        if p.kind == PayloadKind::Text && crate::request::utf8(&p.payload).is_err() {
            return Err(fail(ProtocolError::new(
                "bad_frame",
                "a text payload must be valid UTF-8",
            )));
        }
        Ok(())
    }

    /// Gives the message its topic's next sequence number, records it and fans it out under
    /// each connection's slow-consumer policy, and to each matching group. `from`: the
    /// connection that published it, if it is one of this engine's.
    pub(super) fn append(
        &mut self,
        p: &Publish,
        now_us: u64,
        numbering: Numbering,
        origin: Origin,
        from: Option<ConnId>,
    ) -> Published {
        let config = &self.config;
        let (state, recency) = self.topics.recording(config, &p.topic, numbering);
        if origin != 0 && state.owner == 0 && state.last_at() == 0 {
            state.owner = origin;
            usage_of(&mut self.usage, origin).topics += 1;
        }
        state.prefetch_history();
        state.seq += 1;
        let seq = state.seq;
        self.publish_count += 1;
        let generation = self.publish_count;
        recency.stamp(state, generation);
        let mut matched = std::mem::take(&mut self.matched);
        state.find_matches(&self.index, &mut matched);
        let grouped = self.groups.matching(&p.topic);
        let history = state.history_rule(config);
        if matched.is_empty() && !grouped && !history.is_some_and(HistoryRule::keeps_messages) {
            // Nobody to send it to, no history to keep it in: a discard, whose message would be
            // needed only if someone asked for the last value. Kept as published instead.
            state.last = Some(Last::Unmade(Unmade::of(p, seq, now_us)));
            state.last_us = now_us;
            state.dropped_at = generation;
            charge(&mut self.usage, state);
            self.matched = matched;
            return Published {
                seq,
                deliveries: 0,
                cut: Vec::new(),
            };
        }
        let rule = state.policy_rule();
        let default = rule.map_or((Policy::Disconnect, None), |i| {
            (config.policy[i].policy, config.policy[i].max_rate)
        });
        let message = message_of(&state.head, seq, p, p.stamp.then_some(now_us));
        if let Some(history) = history {
            state.trim_by_age(history, now_us);
        }
        state.record(
            history,
            Stored {
                seq,
                at_us: now_us,
                at: generation,
                message: message.clone(),
            },
        );
        charge(&mut self.usage, state);
        // Borrowed, not cloned: the fan-out below touches other fields only.
        let name = &state.name;

        let conns = &mut self.conns;
        let mut deliveries = 0;
        let mut cut = Vec::new();
        if let Some(c) = from.and_then(|id| conns[id as usize].as_mut()) {
            if c.only_no_local(&p.topic) {
                // Its own message: taken as already seen.
                c.seen = generation;
            }
        }
        // The matches first, then each connection's state asked for, then the deliveries: with
        // many connections each one's state is out of the cache, and a miss per subscriber,
        // one after the other, would cost more than the rest of the delivery. Asked for
        // together, the misses overlap.
        for &id in &matched {
            prefetch(&conns[id as usize], size_of::<Option<Conn<O>>>());
        }
        for &id in &matched {
            if let Some(c) = &conns[id as usize] {
                c.outbox.prefetch();
            }
        }
        for &id in &matched {
            let Some(c) = conns[id as usize].as_mut() else {
                continue;
            };
            if c.seen == generation {
                continue;
            }
            c.seen = generation;
            let chosen = c.policy_for(&p.topic, default);
            if let (Policy::Lossless, Some(i)) = (chosen.policy, chosen.sub) {
                match c.subs[i].credit_mut() {
                    Some(credit) if credit.covers(p.payload.len()) => credit.spend(p.payload.len()),
                    _ => {
                        cut.push(id);
                        continue;
                    }
                }
            }
            let delivery = Delivery {
                topic: name,
                policy: QueuePolicy::of(chosen.policy, chosen.max_rate),
                rule,
                now_us,
            };
            c.outbox.deliver(&message, &delivery);
            deliveries += 1;
        }
        self.matched = matched;
        if grouped {
            deliveries += self.deliver_to_groups(&message, default, rule, now_us, &mut cut);
        }
        for &id in &cut {
            self.detach(id);
        }
        Published {
            seq,
            deliveries,
            cut,
        }
    }
}
