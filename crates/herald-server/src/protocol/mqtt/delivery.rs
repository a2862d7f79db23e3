//! What an MQTT session keeps track of as it delivers to its client, whatever connection it
//! is on: the QoS 1 messages in flight and those waiting for room ([`Flow`]), the losses to
//! announce ([`Gaps`]), and, for a session that may outlive its connection, the position it
//! has delivered on each topic ([`Seen`]). Pure bookkeeping: no sockets, no engine.
//!
//! **Receive Maximum is per connection** (§3.3.4, §4.9): the client accepts at most that many
//! unacknowledged QoS 1 and 2 PUBLISH packets, whatever subscriptions they came through. So
//! [`Flow`] holds the packets in flight for the whole connection, and a QoS 1 message that
//! finds no room waits here, in order, until an acknowledgement makes some. herald's
//! `lossless` credit stays per subscription (the engine's unit): it bounds how much the
//! engine hands the connection for each pattern (or group membership) before publishers
//! wait, and a message's credit goes back where it was spent ([`CreditTo`]) when the client
//! acknowledges it (or when the message is not sent at all), never before.

use super::retained::Retained;
use herald_core::group::Group;
use herald_core::message::Message;
use herald_core::request::{Position, Request};
use herald_core::topic::matches;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

/// The name of the MQTT 5.0 user property that marks the first message after a loss on its
/// topic; its value is how many messages were lost, or `unknown` (`docs/mqtt.md`).
pub const GAP_PROPERTY: &str = "herald-gap";

/// Where the credit a QoS 1 message spent goes back when it is acknowledged (or was not sent).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CreditTo {
    /// The connection's own subscription to this herald pattern.
    Pattern(Arc<str>),
    /// Its membership of this group.
    Group(Arc<Group>),
}

impl CreditTo {
    /// The herald request that returns one message of credit.
    pub fn request(&self) -> Request {
        let (topic, group) = match self {
            CreditTo::Pattern(pattern) => (pattern.to_string(), None),
            CreditTo::Group(g) => (g.pattern.to_string(), Some(g.name.to_string())),
        };
        Request::Credit {
            id: None,
            topic,
            group,
            n: 1,
            bytes: 0,
        }
    }
}

/// A QoS 1 message owed to the client: kept until it is acknowledged, to be sent again (DUP)
/// when the session resumes on a new connection (§4.4).
#[derive(Debug, Clone)]
pub enum Held {
    /// A message herald delivered: for the connection's own subscriptions, or for its shared
    /// subscription named after `group`.
    Live {
        message: Message,
        group: Option<Arc<Group>>,
    },
    /// A retained message sent after a SUBACK, with its MQTT topic name.
    Retained { name: String, message: Retained },
}

impl Held {
    /// The herald topic of a live message, whose gaps it announces.
    pub fn topic(&self) -> Option<&str> {
        match self {
            Held::Live { message, .. } => Some(message.topic()),
            Held::Retained { .. } => None,
        }
    }
}

/// A QoS 1 PUBLISH sent and not yet acknowledged.
#[derive(Debug)]
struct Sent {
    /// When it was sent, among the others: they are sent again in this order.
    order: u64,
    held: Held,
    /// Where the `lossless` credit the message spent goes back, with its PUBACK.
    credit: Option<CreditTo>,
}

/// The QoS 1 messages of a session between herald and the client.
#[derive(Debug)]
pub struct Flow {
    receive_maximum: u16,
    next_packet_id: u16,
    sent_count: u64,
    in_flight: HashMap<u16, Sent>,
    /// Messages with no room under the receive maximum, oldest first, with their credit.
    waiting: VecDeque<(Held, Option<CreditTo>)>,
}

impl Default for Flow {
    fn default() -> Self {
        Flow {
            receive_maximum: u16::MAX,
            next_packet_id: 0,
            sent_count: 0,
            in_flight: HashMap::new(),
            waiting: VecDeque::new(),
        }
    }
}

impl Flow {
    /// The client's Receive Maximum (65,535 for 3.1.1, which has none); at least 1.
    pub fn set_receive_maximum(&mut self, n: u16) {
        self.receive_maximum = n.max(1);
    }

    /// Whether a new QoS 1 message may go now: nothing waits before it and the client has
    /// room.
    pub fn has_room(&self) -> bool {
        self.waiting.is_empty() && self.room()
    }

    fn room(&self) -> bool {
        self.in_flight.len() < usize::from(self.receive_maximum)
    }

    /// A packet identifier no message in flight uses; `None` only with all 65,535 in use.
    pub fn free_id(&mut self) -> Option<u16> {
        for _ in 0..u16::MAX {
            self.next_packet_id = self.next_packet_id.checked_add(1).unwrap_or(1);
            if !self.in_flight.contains_key(&self.next_packet_id) {
                return Some(self.next_packet_id);
            }
        }
        None
    }

    /// `held` went out as QoS 1 PUBLISH `packet_id` (from [`Flow::free_id`]).
    pub fn sent(&mut self, packet_id: u16, held: Held, credit: Option<CreditTo>) {
        self.sent_count += 1;
        let sent = Sent {
            order: self.sent_count,
            held,
            credit,
        };
        self.in_flight.insert(packet_id, sent);
    }

    /// `held` waits for room, behind those already waiting.
    pub fn wait(&mut self, held: Held, credit: Option<CreditTo>) {
        self.waiting.push_back((held, credit));
    }

    /// The oldest waiting message, once the client has room for it.
    pub fn next_waiting(&mut self) -> Option<(Held, Option<CreditTo>)> {
        if !self.room() {
            return None;
        }
        self.waiting.pop_front()
    }

    /// The client acknowledged PUBLISH `packet_id`: where to return a message of credit, if
    /// its message spent some.
    pub fn acknowledged(&mut self, packet_id: u16) -> Option<CreditTo> {
        self.in_flight.remove(&packet_id).and_then(|s| s.credit)
    }

    /// The messages sent and not acknowledged, in the order they were sent.
    pub fn unacknowledged(&self) -> Vec<(u16, &Held)> {
        let mut sent: Vec<(u16, &Sent)> = self.in_flight.iter().map(|(id, s)| (*id, s)).collect();
        sent.sort_by_key(|(_, s)| s.order);
        sent.into_iter().map(|(id, s)| (id, &s.held)).collect()
    }

    /// The session moved to a new connection: no message owes credit to the new connection's
    /// subscriptions, which start with their whole window.
    pub fn forget_credit(&mut self) {
        self.in_flight.values_mut().for_each(|s| s.credit = None);
        self.waiting
            .iter_mut()
            .for_each(|(_, credit)| *credit = None);
    }
}

/// How many messages of a topic were lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lost {
    Count(u64),
    /// herald cannot count them (the topic's numbering restarted, or it was forgotten).
    Unknown,
}

impl Lost {
    /// Both losses together.
    pub fn and(self, other: Lost) -> Lost {
        match (self, other) {
            (Lost::Count(a), Lost::Count(b)) => Lost::Count(a.saturating_add(b)),
            _ => Lost::Unknown,
        }
    }

    /// The value of [`GAP_PROPERTY`].
    pub fn value(self) -> String {
        match self {
            Lost::Count(n) => n.to_string(),
            Lost::Unknown => "unknown".into(),
        }
    }
}

/// Losses not yet announced, by herald topic: the next message of the topic carries them.
#[derive(Debug, Default)]
pub struct Gaps(HashMap<Box<str>, Lost>);

impl Gaps {
    pub fn add(&mut self, topic: &str, lost: Lost) {
        match self.0.get_mut(topic) {
            Some(known) => *known = known.and(lost),
            None => {
                self.0.insert(topic.into(), lost);
            }
        }
    }

    /// Whether no loss waits to be announced.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The loss to announce with the next message of `topic`, taken.
    pub fn take(&mut self, topic: &str) -> Option<Lost> {
        if self.0.is_empty() {
            return None;
        }
        self.0.remove(topic)
    }

    pub fn merge(&mut self, other: Gaps) {
        for (topic, lost) in other.0 {
            self.add(&topic, lost);
        }
    }
}

/// Where a session that may outlive its connection is in each topic, so that what it missed
/// can be recovered (herald's `since`) and nothing it already has is sent twice.
#[derive(Debug, Default)]
pub struct Seen {
    /// The last message delivered on each herald topic: its epoch and sequence number.
    positions: HashMap<Arc<str>, (Box<str>, u64)>,
    /// Per herald pattern, the cursor of its first subscription: topics with no position were
    /// delivered nothing since.
    cursors: HashMap<String, String>,
}

impl Seen {
    /// Records `m` as delivered; false when the session already has it (a message at or
    /// before the topic's position in the same epoch).
    pub fn delivered(&mut self, m: &Message) -> bool {
        let name = m.head().name();
        match self.positions.get_mut(name) {
            Some((epoch, seq)) if **epoch == *m.epoch() => {
                if m.seq() <= *seq {
                    return false;
                }
                *seq = m.seq();
            }
            Some(position) => *position = (m.epoch().into(), m.seq()),
            None => {
                self.positions
                    .insert(name.clone(), (m.epoch().into(), m.seq()));
            }
        }
        true
    }

    /// Pattern `pattern` was subscribed with `cursor`; a pattern subscribed again keeps its
    /// first.
    pub fn subscribed(&mut self, pattern: &str, cursor: &str) {
        if !self.cursors.contains_key(pattern) {
            self.cursors.insert(pattern.to_owned(), cursor.to_owned());
        }
    }

    /// The session no longer subscribes to `pattern`.
    pub fn unsubscribed(&mut self, pattern: &str) {
        self.cursors.remove(pattern);
    }

    /// What to recover `pattern` from: the positions of the topics it matches, and its cursor.
    pub fn recovery(&self, pattern: &str) -> (HashMap<String, Position>, Option<String>) {
        let since = self
            .positions
            .iter()
            .filter(|(topic, _)| matches(pattern, topic))
            .map(|(topic, (epoch, seq))| {
                let position = Position {
                    seq: *seq,
                    epoch: epoch.to_string(),
                };
                (topic.to_string(), position)
            })
            .collect();
        (since, self.cursors.get(pattern).cloned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use herald_core::message::TopicHead;
    use herald_core::request::PayloadKind;

    fn message(topic: &str, epoch: &str, seq: u64) -> Message {
        let head = TopicHead::new(topic.into(), epoch.into());
        Message::new(head, seq, PayloadKind::Binary, Bytes::new(), None, None)
    }

    #[test]
    fn the_receive_maximum_holds_for_the_connection_and_the_rest_waits_in_order() {
        let mut flow = Flow::default();
        flow.set_receive_maximum(2);
        let credit = |p: &str| Some(CreditTo::Pattern(Arc::from(p)));
        let mut ids = Vec::new();
        for (i, pattern) in ["a", "b", "a", "b"].into_iter().enumerate() {
            let held = Held::Live {
                message: message(pattern, "e", i as u64 + 1),
                group: None,
            };
            if flow.has_room() {
                let id = flow.free_id().unwrap();
                flow.sent(id, held, credit(pattern));
                ids.push(id);
            } else {
                flow.wait(held, credit(pattern));
            }
        }
        assert_eq!(ids.len(), 2, "two subscriptions, one window of 2");
        assert!(flow.next_waiting().is_none(), "no room yet");
        assert_eq!(flow.acknowledged(ids[0]), credit("a"));
        let (held, c) = flow.next_waiting().expect("room for one");
        assert_eq!((held.topic(), c.clone()), (Some("a"), credit("a")));
        let id = flow.free_id().unwrap();
        flow.sent(id, held, c);
        assert!(flow.next_waiting().is_none());
        let order: Vec<u64> = flow
            .unacknowledged()
            .iter()
            .map(|(_, h)| match h {
                Held::Live { message, .. } => message.seq(),
                Held::Retained { .. } => 0,
            })
            .collect();
        assert_eq!(order, [2, 3], "sent again in the order first sent");
        flow.forget_credit();
        assert_eq!(flow.acknowledged(id), None);
    }

    #[test]
    fn positions_skip_what_was_delivered_and_follow_a_new_epoch() {
        let mut seen = Seen::default();
        assert!(seen.delivered(&message("a/b", "e1", 5)));
        assert!(!seen.delivered(&message("a/b", "e1", 5)));
        assert!(!seen.delivered(&message("a/b", "e1", 4)));
        assert!(seen.delivered(&message("a/b", "e2", 1)));
        assert!(seen.delivered(&message("c", "e1", 1)));
        seen.subscribed("a/>", "x.1");
        seen.subscribed("a/>", "x.9");
        let (since, cursor) = seen.recovery("a/>");
        assert_eq!(
            cursor.as_deref(),
            Some("x.1"),
            "the first subscription's cursor"
        );
        assert_eq!(since.len(), 1);
        assert_eq!(
            since["a/b"],
            Position {
                seq: 1,
                epoch: "e2".into()
            }
        );
    }

    #[test]
    fn gaps_add_up_until_announced() {
        let mut gaps = Gaps::default();
        gaps.add("t", Lost::Count(2));
        gaps.add("t", Lost::Count(3));
        assert_eq!(gaps.take("t"), Some(Lost::Count(5)));
        assert_eq!(gaps.take("t"), None);
        gaps.add("t", Lost::Count(1));
        gaps.add("t", Lost::Unknown);
        assert_eq!(gaps.take("t").map(Lost::value).as_deref(), Some("unknown"));
    }
}
