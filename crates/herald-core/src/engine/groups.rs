//! Group subscriptions (see [`crate::group`]): who belongs to which group, a group's share of
//! each publish, and the credit its `lossless` members grant.
//!
//! A group is kept apart from its members' own subscriptions, in an index of its own: a
//! connection that holds both a subscription and a group membership matching a message
//! receives it for the subscription, and may receive it again as the group's member (MQTT
//! §4.8.2 asks exactly this). A member's slot in the group is what a subscription is to a
//! connection: it counts against the connection's `max_subscriptions_per_connection` and
//! holds the pattern's interest for a broker, so in a cluster each node's group receives each
//! message once and gives it to one of its own members.

use super::*;
use crate::group::{Choice, Rotation};

/// A connection as a member of a group, with the options it joined with.
struct Member {
    conn: ConnId,
    policy: Option<Policy>,
    max_rate: Option<f64>,
    /// `lossless`: what it still grants.
    credit: Credit,
}

impl Member {
    fn of(conn: ConnId, s: &Subscribe) -> Member {
        Member {
            conn,
            policy: s.policy,
            max_rate: s.max_rate,
            credit: if s.policy == Some(Policy::Lossless) {
                Credit::new(s.window, s.window_bytes, DEFAULT_WINDOW)
            } else {
                Credit::default()
            },
        }
    }

    fn is_lossless(&self) -> bool {
        self.policy == Some(Policy::Lossless)
    }
}

struct GroupState {
    group: Arc<Group>,
    members: Rotation<Member>,
}

/// Every group of an engine.
#[derive(Default)]
pub(super) struct Groups {
    /// Group slots by pattern.
    index: SubscriptionIndex<u32>,
    by_key: HashMap<Arc<Group>, u32>,
    slots: Vec<Option<GroupState>>,
    free: Vec<u32>,
    /// The groups each member connection belongs to.
    memberships: HashMap<ConnId, Vec<u32>>,
    /// `lossless` members of every group: while there are none, publishing skips their check.
    lossless: usize,
    /// Scratch: the groups a message matched.
    matched: Vec<u32>,
}

impl Groups {
    /// Whether any member of any group is `lossless`.
    #[inline]
    pub fn has_lossless(&self) -> bool {
        self.lossless > 0
    }

    /// How many groups connection `conn` belongs to.
    pub fn count_of(&self, conn: ConnId) -> usize {
        self.memberships.get(&conn).map_or(0, Vec::len)
    }

    /// Notes the groups `topic` matches, for [`Engine::deliver_to_groups`]; whether there are
    /// any. Costs nothing while no group exists.
    #[inline]
    pub fn matching(&mut self, topic: &str) -> bool {
        if self.slots.is_empty() {
            return false;
        }
        let matched = &mut self.matched;
        matched.clear();
        self.index.for_each_match(topic, |g| matched.push(g));
        !matched.is_empty()
    }

    fn slot(&mut self, group: u32) -> &mut GroupState {
        self.slots[group as usize]
            .as_mut()
            .expect("indexed groups have state")
    }

    /// Removes `conn` from group slot `g`; the group goes with its last member. The member, if
    /// it was one.
    fn leave(&mut self, g: u32, conn: ConnId) -> Option<(Arc<Group>, Member)> {
        let state = self.slot(g);
        let member = state.members.leave(|m| m.conn == conn)?;
        let group = state.group.clone();
        if state.members.is_empty() {
            self.slots[g as usize] = None;
            self.free.push(g);
            self.by_key.remove(&group);
            self.index.remove(&group.pattern, g);
            if self.by_key.is_empty() {
                // No group left: publishing looks for none.
                self.slots.clear();
                self.free.clear();
            }
        }
        if let Some(groups) = self.memberships.get_mut(&conn) {
            groups.retain(|&x| x != g);
            if groups.is_empty() {
                self.memberships.remove(&conn);
            }
        }
        self.lossless -= usize::from(member.is_lossless());
        Some((group, member))
    }
}

impl<O: Outbox> Engine<O> {
    /// Subscription `s` joins its group (or changes its options in it), answered as any
    /// subscription, without recovery.
    pub(super) fn join_group(&mut self, conn: ConnId, s: Subscribe) -> Result<(), ProtocolError> {
        let Some(own) = self.conn(conn).map(|c| c.subs.len()) else {
            return Ok(());
        };
        let key = Group {
            name: s.group.as_deref().unwrap_or_default().into(),
            pattern: s.topic.as_str().into(),
        };
        let groups = &mut self.groups;
        let found = groups.by_key.get(&key).copied();
        let member_of = found.is_some_and(|g| {
            groups.slots[g as usize]
                .as_ref()
                .is_some_and(|st| st.members.members().iter().any(|m| m.conn == conn))
        });
        let max = self.config.max_subscriptions_per_connection;
        if !member_of && own + groups.count_of(conn) >= max {
            return Err(ProtocolError::new(
                "too_many_subscriptions",
                format!("this connection already holds the maximum of {max} subscriptions; unsubscribe first or raise max_subscriptions_per_connection"),
            )
            .with_id(s.id.clone()));
        }
        let member = Member::of(conn, &s);
        groups.lossless += usize::from(member.is_lossless());
        let g = match found {
            Some(g) => g,
            None => {
                let state = GroupState {
                    group: Arc::new(key),
                    members: Rotation::default(),
                };
                let g = match groups.free.pop() {
                    Some(g) => {
                        groups.slots[g as usize] = Some(state);
                        g
                    }
                    None => {
                        groups.slots.push(Some(state));
                        (groups.slots.len() - 1) as u32
                    }
                };
                let group = groups.slot(g).group.clone();
                groups.index.insert(&group.pattern, g);
                groups.by_key.insert(group, g);
                g
            }
        };
        let state = groups.slots[g as usize]
            .as_mut()
            .expect("indexed groups have state");
        match state
            .members
            .members_mut()
            .iter_mut()
            .find(|m| m.conn == conn)
        {
            // Joining again changes the options, not the turn.
            Some(old) => {
                groups.lossless -= usize::from(old.is_lossless());
                *old = member;
            }
            None => {
                state.members.join(member);
                groups.memberships.entry(conn).or_default().push(g);
                self.interest_up(&s.topic);
                self.subscriptions += 1;
            }
        }
        let reply = Reply::Subscribed {
            id: s.id,
            topic: s.topic,
            recovered: true,
            replayed: 0,
            gaps: Vec::new(),
            cursor: self.cursor(),
        };
        self.reply(conn, &reply);
        Ok(())
    }

    /// Connection `conn` leaves the group `name` of `pattern`.
    pub(super) fn leave_group(
        &mut self,
        conn: ConnId,
        id: Option<RequestId>,
        pattern: String,
        name: &str,
    ) -> Result<(), ProtocolError> {
        let key = Group {
            name: name.into(),
            pattern: pattern.as_str().into(),
        };
        let left = match self.groups.by_key.get(&key).copied() {
            Some(g) => self.groups.leave(g, conn).is_some(),
            None => false,
        };
        if !left {
            return Err(ProtocolError::new(
                "not_subscribed",
                format!("this connection is no member of group {name:?} of {pattern:?}; nothing to unsubscribe"),
            )
            .with_id(id));
        }
        self.interest_down(&pattern);
        self.subscriptions -= 1;
        self.reply(conn, &Reply::Unsubscribed { id, topic: pattern });
        Ok(())
    }

    /// Connection `conn` leaves every group it belongs to (it is being closed).
    pub(super) fn leave_groups(&mut self, conn: ConnId) {
        let Some(groups) = self.groups.memberships.get(&conn).cloned() else {
            return;
        };
        for g in groups {
            if let Some((group, _)) = self.groups.leave(g, conn) {
                self.interest_down(&group.pattern);
                self.subscriptions -= 1;
            }
        }
    }

    /// `credit` for connection `conn` as a member of group `name` of `pattern`.
    pub(super) fn credit_group(
        &mut self,
        conn: ConnId,
        id: Option<RequestId>,
        pattern: &str,
        name: &str,
        n: u64,
        bytes: u64,
    ) -> Result<(), ProtocolError> {
        let key = Group {
            name: name.into(),
            pattern: pattern.into(),
        };
        let member = self.groups.by_key.get(&key).copied().and_then(|g| {
            self.groups
                .slot(g)
                .members
                .members_mut()
                .iter_mut()
                .find(|m| m.conn == conn)
        });
        match member {
            Some(m) if m.is_lossless() => {
                m.credit.grant(n, bytes);
                Ok(())
            }
            Some(_) => Err(ProtocolError::new(
                "not_lossless",
                format!("this connection's membership of group {name:?} of {pattern:?} is not lossless; only lossless subscriptions take credit"),
            )
            .with_id(id)),
            None => Err(ProtocolError::new(
                "not_subscribed",
                format!("this connection is no member of group {name:?} of {pattern:?}"),
            )
            .with_id(id)),
        }
    }

    /// Gives `message` to one member of each group [`Groups::matching`] noted, as
    /// [`crate::group`] says; returns how many it was handed to. A `lossless` member out of
    /// credit whose turn it was when no member could take the message is added to `cut`.
    pub(super) fn deliver_to_groups(
        &mut self,
        message: &Message,
        default: (Policy, Option<f64>),
        rule: Option<usize>,
        now_us: u64,
        cut: &mut Vec<ConnId>,
    ) -> usize {
        let (len, size) = (message.payload().len(), message.size());
        let conns = &self.conns;
        let groups = &mut self.groups;
        let topic: Arc<str> = message.head().name().clone();
        let mut deliveries = 0;
        for &g in &groups.matched {
            let Some(state) = groups.slots[g as usize].as_mut() else {
                continue;
            };
            let outbox = |m: &Member| conns[m.conn as usize].as_ref().map(|c| &c.outbox);
            let ready = |m: &Member| {
                (!m.is_lossless() || m.credit.covers(len))
                    && outbox(m).is_some_and(|o| o.has_room(size))
            };
            let Some(choice) = state.members.choose(ready) else {
                continue;
            };
            let (Choice::Ready(i) | Choice::Behind(i)) = choice;
            let member = &mut state.members.members_mut()[i];
            if member.is_lossless() {
                if !member.credit.covers(len) {
                    cut.push(member.conn);
                    continue;
                }
                member.credit.spend(len);
            }
            let Some(outbox) = conns[member.conn as usize].as_ref().map(|c| &c.outbox) else {
                continue;
            };
            let delivery = Delivery {
                topic: &topic,
                policy: QueuePolicy::of(
                    member.policy.unwrap_or(default.0),
                    member.max_rate.or(default.1),
                ),
                rule,
                now_us,
            };
            outbox.deliver_grouped(message, &state.group, &delivery);
            deliveries += 1;
        }
        deliveries
    }

    /// Adds to `found` the members of each group whose message on `topic` of `len` payload
    /// bytes would wait: every member is `lossless` and none has the credit for it.
    pub(super) fn group_holders(
        &self,
        topic_name: &str,
        len: usize,
        found: &mut impl FnMut(ConnId),
    ) {
        if self.groups.lossless == 0 {
            return;
        }
        self.groups.index.for_each_match(topic_name, |g| {
            let Some(state) = self.groups.slots[g as usize].as_ref() else {
                return;
            };
            let members = state.members.members();
            if members
                .iter()
                .all(|m| m.is_lossless() && !m.credit.covers(len))
            {
                members.iter().for_each(|m| found(m.conn));
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::{Cell, RefCell};
    use std::rc::Rc;

    /// What one connection was sent: messages (by payload, marked `g` when for a group),
    /// notices; `room` says whether its queue has room.
    #[derive(Clone, Default)]
    struct Seen {
        got: Rc<RefCell<Vec<String>>>,
        full: Rc<Cell<bool>>,
    }

    impl Outbox for Seen {
        fn reply(&self, _: &Reply) {}
        fn dropped(&self, topic: &str, count: u64, _: DropReason) {
            self.got
                .borrow_mut()
                .push(format!("dropped {topic} {count}"));
        }
        fn deliver(&self, m: &Message, _: &Delivery) {
            let text = String::from_utf8_lossy(m.payload()).into_owned();
            self.got.borrow_mut().push(text);
        }
        fn deliver_grouped(&self, m: &Message, group: &Arc<Group>, d: &Delivery) {
            let text = String::from_utf8_lossy(m.payload());
            let how = match (self.full.get(), d.policy) {
                (false, _) => "",
                (true, QueuePolicy::Keep) => " overflow",
                (true, _) => " dropped",
            };
            self.got
                .borrow_mut()
                .push(format!("{}:{text}{how}", group.name));
        }
        fn recovered(&self, _: &Message) {}
        fn snapshot(&self, _: &str, _: usize) {}
        fn has_room(&self, _: usize) -> bool {
            !self.full.get()
        }
    }

    impl Seen {
        fn take(&self) -> Vec<String> {
            self.got.borrow_mut().drain(..).collect()
        }
    }

    fn sub(topic: &str, group: Option<&str>) -> Request {
        Request::Subscribe(Subscribe {
            topic: topic.into(),
            group: group.map(str::to_owned),
            ..Subscribe::default()
        })
    }

    fn publish(e: &mut Engine<Seen>, topic: &str, data: &str) -> Published {
        e.publish(&crate::engine::tests::text(topic, data), 1)
            .unwrap()
    }

    fn members(e: &mut Engine<Seen>, n: usize, pattern: &str, group: &str) -> Vec<(ConnId, Seen)> {
        (0..n)
            .map(|_| {
                let seen = Seen::default();
                let id = e.connect(seen.clone());
                e.handle(id, sub(pattern, Some(group)), 0).unwrap();
                (id, seen)
            })
            .collect()
    }

    #[test]
    fn each_message_goes_to_one_member_in_turn() {
        let mut e = Engine::new(EngineConfig::default(), 1);
        let m = members(&mut e, 3, "t/>", "g");
        for i in 0..6 {
            assert_eq!(publish(&mut e, "t/x", &i.to_string()).deliveries, 1);
        }
        assert_eq!(m[0].1.take(), ["g:0", "g:3"]);
        assert_eq!(m[1].1.take(), ["g:1", "g:4"]);
        assert_eq!(m[2].1.take(), ["g:2", "g:5"]);
        // Another group of the same pattern, and the same name with another pattern, each get
        // their own copy.
        let other = members(&mut e, 1, "t/>", "h");
        let narrower = members(&mut e, 1, "t/x", "g");
        assert_eq!(publish(&mut e, "t/x", "6").deliveries, 3);
        assert_eq!(other[0].1.take(), ["h:6"]);
        assert_eq!(narrower[0].1.take(), ["g:6"]);
        assert_eq!(m[0].1.take(), ["g:6"]);
    }

    #[test]
    fn a_member_with_its_own_subscription_gets_both_copies() {
        let mut e = Engine::new(EngineConfig::default(), 1);
        let m = members(&mut e, 1, "t", "g");
        e.handle(m[0].0, sub("t", None), 0).unwrap();
        assert_eq!(publish(&mut e, "t", "1").deliveries, 2);
        assert_eq!(m[0].1.take(), ["1", "g:1"]);
    }

    #[test]
    fn a_full_member_is_passed_over_and_the_policy_acts_only_when_all_are() {
        let mut e = Engine::new(EngineConfig::default(), 1);
        let m = members(&mut e, 2, "t", "g");
        m[0].1.full.set(true);
        for i in 0..3 {
            publish(&mut e, "t", &i.to_string());
        }
        assert_eq!(m[0].1.take(), Vec::<String>::new());
        assert_eq!(m[1].1.take(), ["g:0", "g:1", "g:2"]);
        m[1].1.full.set(true);
        publish(&mut e, "t", "3");
        publish(&mut e, "t", "4");
        // Both full: the member in turn, under its policy (here `disconnect`: overflow).
        assert_eq!(m[0].1.take(), ["g:3 overflow"]);
        assert_eq!(m[1].1.take(), ["g:4 overflow"]);
    }

    #[test]
    fn lossless_members_share_by_credit_and_hold_publishers_only_when_all_are_out() {
        let mut e = Engine::new(EngineConfig::default(), 1);
        let join = |e: &mut Engine<Seen>| {
            let seen = Seen::default();
            let id = e.connect(seen.clone());
            let s = Subscribe {
                topic: "t".into(),
                group: Some("g".into()),
                policy: Some(Policy::Lossless),
                window: Some(1),
                ..Subscribe::default()
            };
            e.handle(id, Request::Subscribe(s), 0).unwrap();
            (id, seen)
        };
        let (a, seen_a) = join(&mut e);
        let (b, seen_b) = join(&mut e);
        assert!(!e.is_held("t", 1));
        publish(&mut e, "t", "1");
        assert!(!e.is_held("t", 1), "b still has credit");
        publish(&mut e, "t", "2");
        let mut holders = Vec::new();
        e.holders("t", 1, |id| holders.push(id));
        assert_eq!(holders, [a, b], "both are out of credit");
        let credit = Request::Credit {
            id: None,
            topic: "t".into(),
            group: Some("g".into()),
            n: 1,
            bytes: 0,
        };
        e.handle(b, credit, 0).unwrap();
        assert!(!e.is_held("t", 1));
        publish(&mut e, "t", "3");
        assert_eq!(seen_a.take(), ["g:1"]);
        assert_eq!(seen_b.take(), ["g:2", "g:3"]);
        // Published anyway (a remote message, or the hold timed out): the member in turn is
        // cut, as a lossless subscriber out of credit is.
        let p = publish(&mut e, "t", "4");
        assert_eq!((p.deliveries, p.cut.as_slice()), (0, &[a][..]));
    }

    #[test]
    fn leaving_and_closing_take_members_out_and_the_last_takes_the_group() {
        let mut e = Engine::new(EngineConfig::default(), 1);
        e.track_interest();
        e.take_interest_changes();
        let m = members(&mut e, 2, "t", "g");
        assert_eq!(e.subscription_count(), 2);
        let leave = Request::Unsubscribe {
            id: None,
            topic: "t".into(),
            group: Some("g".into()),
        };
        e.handle(m[0].0, leave.clone(), 0).unwrap();
        assert_eq!(e.handle(m[0].0, leave, 0), Err("not_subscribed"));
        publish(&mut e, "t", "1");
        assert_eq!(m[1].1.take(), ["g:1"]);
        e.disconnect(m[1].0);
        assert_eq!(e.subscription_count(), 0);
        assert_eq!(publish(&mut e, "t", "2").deliveries, 0);
        assert_eq!(
            e.take_interest_changes(),
            [Interest::Added("t".into()), Interest::Removed("t".into())]
        );
        assert!(e.groups.slots.is_empty() && e.groups.memberships.is_empty());
    }

    #[test]
    fn memberships_count_against_the_subscription_limit() {
        let config = EngineConfig {
            max_subscriptions_per_connection: 2,
            ..EngineConfig::default()
        };
        let mut e = Engine::new(config, 1);
        let seen = Seen::default();
        let id = e.connect(seen);
        e.handle(id, sub("a", None), 0).unwrap();
        e.handle(id, sub("b", Some("g")), 0).unwrap();
        e.handle(id, sub("b", Some("g")), 0).unwrap();
        assert_eq!(
            e.handle(id, sub("c", Some("g")), 0),
            Err("too_many_subscriptions")
        );
    }
}
