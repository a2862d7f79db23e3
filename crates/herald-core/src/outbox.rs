//! A connection's outbound queue: what waits for its socket, bounded in bytes.
//!
//! Pure bookkeeping, no I/O: the network writer drains it, the engine fills it. It holds
//! messages as the engine made them, shared (a queued message costs a pointer here), and frames
//! already encoded (replies, notices, control frames); the connection's codec encodes each
//! message as it is drained ([`OutboundQueue::drain_into`]), so a message conflated or dropped
//! here is never encoded. The *bound* counts each message's [`Message::size`] and each frame's
//! length: what a slow reader makes the server hold on its behalf.

use crate::codec::{Encode, Frame};
use crate::group::Group;
use crate::message::Message;
use crate::policy::QueuePolicy;
use crate::reply::DropReason;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::Arc;

/// What became of a pushed message or frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pushed {
    /// Queued; the queue was empty before (or a throttled message now waits for its turn), so
    /// the writer may need waking.
    First,
    /// Queued behind others (or it replaced, or was dropped for, an older message).
    Queued,
    /// The queue is over its bound: the caller applies its slow-consumer policy.
    Overflow,
    /// The queue is closed (a close frame is queued or sent): what was pushed is discarded.
    Closed,
}

/// One message handed to the queue under a slow-consumer policy.
#[derive(Clone, Copy, Debug)]
pub struct Delivery<'a> {
    /// The message's topic: drops and conflation are counted and merged per topic.
    pub topic: &'a Arc<str>,
    pub policy: QueuePolicy,
    /// Index of the configured policy rule that matched the topic (its pattern labels the
    /// metrics), if any.
    pub rule: Option<usize>,
    pub now_us: u64,
}

/// What a delivery cost: messages of this connection dropped or superseded by it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Delivered {
    pub pushed: Pushed,
    pub dropped: u64,
    pub conflated: u64,
}

enum Entry {
    /// Encoded already: a reply, a notice, a control frame, the close. Boxed: these are rare
    /// beside messages, and every slot of the queue is as large as its largest entry.
    Frame(Box<Frame>),
    /// A message, encoded as it is drained; its topic is set under `drop` or `conflate`, whose
    /// messages the queue may discard or replace.
    Message(Message, Option<Arc<str>>),
    /// A message delivered for a group the connection is a member of. Boxed: one per group
    /// per message, rare beside the others.
    Grouped(Box<(Message, Arc<Group>)>),
}

impl Entry {
    /// What it counts against the bound.
    fn size(&self) -> usize {
        match self {
            Entry::Frame(frame) => frame.len(),
            Entry::Message(message, _) => message.size(),
            Entry::Grouped(grouped) => grouped.0.size(),
        }
    }
}

/// A conflated topic's state on this connection.
#[derive(Default)]
struct Conflation {
    /// Absolute position of its message still in the queue.
    queued: Option<u64>,
    /// Its newest message, waiting for the throttle interval to pass.
    held: Option<Message>,
    /// When its last message was queued (µs): the throttle counts from there.
    last_us: u64,
    /// Values superseded since its last message went: announced just before the next one, so
    /// a conflating subscriber gets one notice per message it receives, not one per topic at
    /// every write (hundreds of thousands a second on a busy feed).
    superseded: u64,
}

/// Queue slots an idle connection keeps (see [`OutboundQueue::shrink_idle`]).
pub const IDLE_CAPACITY: usize = 8;

/// Per-topic maps, hashed with foldhash as the subscription index is: they are touched on every
/// `drop` or `conflate` delivery, and std's SipHash of the topic cost more than the rest of it.
/// hashbrown's, for `raw_entry_mut`: found by `&str`, a key cloned only when it is new.
type TopicMap<K, V> = hashbrown::HashMap<K, V, foldhash::fast::RandomState>;

#[derive(Default)]
pub struct OutboundQueue {
    /// Queued entries in order; a `None` is a dropped message's hole.
    slots: VecDeque<Option<Entry>>,
    /// Absolute position of `slots[0]` (positions never repeat, so they can be remembered).
    base: u64,
    live: usize,
    /// Positions of the queued `drop` messages, oldest first.
    droppable: VecDeque<u64>,
    conflated: TopicMap<Arc<str>, Conflation>,
    /// Throttled topics by the time their held message may go.
    due: BinaryHeap<Reverse<(u64, Arc<str>)>>,
    /// Messages dropped under `drop`, by topic, announced before anything else queued.
    /// (Conflated values are counted per topic in [`Conflation`], announced with their message.)
    dropped: TopicMap<Arc<str>, u64>,
    bytes: usize,
    /// Bytes of replayed and snapshot messages queued: outside `bytes` and its bound (the
    /// caller bounds a recovery by its own limit before queueing it).
    recovered_bytes: usize,
    held_bytes: usize,
    limit: usize,
    closed: bool,
}

impl OutboundQueue {
    /// A queue that holds at most `limit` bytes. One entry larger than the limit is still
    /// accepted into an empty queue: the bound limits the backlog, not the message size.
    pub fn new(limit: usize) -> Self {
        OutboundQueue {
            limit,
            ..Default::default()
        }
    }

    /// Queues a frame that is never dropped (replies, notices, control frames).
    pub fn push(&mut self, frame: Frame) -> Pushed {
        self.push_entry(Entry::Frame(Box::new(frame)))
    }

    /// Queues an entry that is never dropped: a frame, or a `disconnect` or `lossless` message.
    /// Always inline: under the default policy it is every delivery's path, and whether the
    /// compiler inlines it otherwise changes with unrelated code (a call per delivery when not).
    #[inline(always)]
    fn push_entry(&mut self, entry: Entry) -> Pushed {
        if self.closed {
            return Pushed::Closed;
        }
        if !self.fits(entry.size()) {
            return Pushed::Overflow;
        }
        self.append(entry);
        self.pushed()
    }

    /// Queues a replayed or snapshot message: never dropped, and not counted against the bound
    /// on live messages, so a recovery larger than the bound reaches a healthy subscriber
    /// whole (the caller bounds recoveries by their own limit: [`OutboundQueue::recovered_bytes`]).
    pub fn push_recovered(&mut self, message: Message) -> Pushed {
        if self.closed {
            return Pushed::Closed;
        }
        self.recovered_bytes += message.size();
        self.live += 1;
        self.slots.push_back(Some(Entry::Message(message, None)));
        self.pushed()
    }

    /// Bytes of recovery queued and not yet taken by the writer.
    pub fn recovered_bytes(&self) -> usize {
        self.recovered_bytes
    }

    /// Queues a message under its policy: `drop` makes room by dropping the oldest droppable
    /// messages (or this one), `conflate` replaces the topic's queued or held message, and
    /// holds a message back until the topic's throttle interval has passed.
    pub fn deliver(&mut self, message: &Message, d: &Delivery) -> Delivered {
        let mut delivered = Delivered {
            pushed: Pushed::Queued,
            dropped: 0,
            conflated: 0,
        };
        if self.closed {
            delivered.pushed = Pushed::Closed;
            return delivered;
        }
        match d.policy {
            QueuePolicy::Keep => {
                delivered.pushed = self.push_entry(Entry::Message(message.clone(), None))
            }
            QueuePolicy::Drop => {
                let size = message.size();
                while !self.fits(size) {
                    let Some(pos) = self.droppable.pop_front() else {
                        break;
                    };
                    let slot = &mut self.slots[(pos - self.base) as usize];
                    let Some(Entry::Message(old, Some(topic))) = slot.take() else {
                        unreachable!("droppable positions hold messages with their topic");
                    };
                    self.live -= 1;
                    self.bytes -= old.size();
                    self.note_drop(topic);
                    delivered.dropped += 1;
                }
                if self.fits(size) {
                    self.droppable
                        .push_back(self.base + self.slots.len() as u64);
                    self.append(Entry::Message(message.clone(), Some(d.topic.clone())));
                    delivered.pushed = self.pushed();
                } else {
                    // Only undroppable entries are queued: this message is the oldest droppable.
                    self.note_drop(d.topic.clone());
                    delivered.dropped += 1;
                }
            }
            QueuePolicy::Conflate { min_interval_us } => {
                let size = message.size();
                let fits = self.fits(size);
                // Found by the name it points to: the topic's `Arc` is cloned only for a new
                // entry, not counted up and down again on every message.
                let (_, state) = self
                    .conflated
                    .raw_entry_mut()
                    .from_key::<str>(d.topic)
                    .or_insert_with(|| (d.topic.clone(), Conflation::default()));
                let replaced = if let Some(pos) = state.queued {
                    let slot = self.slots[(pos - self.base) as usize].as_mut();
                    let Some(Entry::Message(old, _)) = slot else {
                        unreachable!("a conflated position holds a message");
                    };
                    Some(old)
                } else {
                    state.held.as_mut()
                };
                if let Some(old) = replaced {
                    let grow = size as isize - old.size() as isize;
                    *old = message.clone();
                    if state.queued.is_some() {
                        self.bytes = self.bytes.saturating_add_signed(grow);
                    } else {
                        self.held_bytes = self.held_bytes.saturating_add_signed(grow);
                        // Overdue: wake the writer rather than rely on its timer alone (a
                        // saturated runtime can run timers late).
                        if d.now_us >= state.last_us.saturating_add(min_interval_us) {
                            delivered.pushed = Pushed::First;
                        }
                    }
                    state.superseded += 1;
                    delivered.conflated = 1;
                    return delivered;
                }
                let next_us = state.last_us.saturating_add(min_interval_us);
                if min_interval_us > 0 && state.last_us > 0 && d.now_us < next_us {
                    state.held = Some(message.clone());
                    self.held_bytes += size;
                    self.due.push(Reverse((next_us, d.topic.clone())));
                    delivered.pushed = Pushed::First;
                    return delivered;
                }
                if !fits {
                    delivered.pushed = Pushed::Overflow;
                    return delivered;
                }
                state.queued = Some(self.base + self.slots.len() as u64);
                state.last_us = d.now_us;
                self.append(Entry::Message(message.clone(), Some(d.topic.clone())));
                delivered.pushed = self.pushed();
            }
        }
        delivered
    }

    /// Queues a message delivered for `group`: when it fits, whatever the policy (a group's
    /// member is chosen among those with room: [`crate::group`]); when it does not, the
    /// policy decides as for any message that finds the queue full, except that a group's
    /// message is never merged with others: under `drop` and `conflate` it is dropped itself,
    /// and counted in the next `dropped` notice.
    pub fn deliver_grouped(
        &mut self,
        message: &Message,
        group: &Arc<Group>,
        d: &Delivery,
    ) -> Delivered {
        let mut delivered = Delivered {
            pushed: Pushed::Queued,
            dropped: 0,
            conflated: 0,
        };
        if self.closed {
            delivered.pushed = Pushed::Closed;
        } else if self.fits(message.size()) {
            self.append(Entry::Grouped(Box::new((message.clone(), group.clone()))));
            delivered.pushed = self.pushed();
        } else if d.policy == QueuePolicy::Keep {
            delivered.pushed = Pushed::Overflow;
        } else {
            self.note_drop(d.topic.clone());
            delivered.dropped = 1;
        }
        delivered
    }

    /// Whether a message of `size` bytes ([`Message::size`]) would be queued now without its
    /// policy acting.
    pub fn has_room(&self, size: usize) -> bool {
        !self.closed && self.fits(size)
    }

    /// Whether `size` more bytes may join the live backlog: always into an empty one (a message
    /// larger than the bound still goes whole), else within the bound.
    fn fits(&self, size: usize) -> bool {
        self.bytes == 0 || self.bytes + size <= self.limit
    }

    /// Always inline, as [`OutboundQueue::push_entry`].
    #[inline(always)]
    fn append(&mut self, entry: Entry) {
        self.bytes += entry.size();
        self.live += 1;
        self.slots.push_back(Some(entry));
    }

    fn pushed(&self) -> Pushed {
        if self.live == 1 {
            Pushed::First
        } else {
            Pushed::Queued
        }
    }

    fn note_drop(&mut self, topic: Arc<str>) {
        *self.dropped.entry(topic).or_default() += 1;
    }

    /// Queues a close frame after what is already queued and accepts nothing more.
    /// With `discard_backlog` the queued frames are dropped first (a slow consumer being
    /// cut off should not wait for its backlog). Returns false if already closed.
    pub fn close(&mut self, frame: Frame, discard_backlog: bool) -> bool {
        if self.closed {
            return false;
        }
        if discard_backlog {
            self.base += self.slots.len() as u64;
            self.slots.clear();
            self.droppable.clear();
            self.dropped.clear();
            self.live = 0;
            self.bytes = 0;
            self.recovered_bytes = 0;
        }
        self.conflated.clear();
        self.due.clear();
        self.held_bytes = 0;
        self.closed = true;
        self.append(Entry::Frame(Box::new(frame)));
        true
    }

    /// Moves everything that may go now into `out` as frames of `codec` (the writer sends them
    /// in one vectored write): throttled messages whose time has come join the queue, then a
    /// `dropped` notice per topic that lost messages to `drop`, then the queue in order, each
    /// conflated message preceded by the notice of the values it superseded.
    /// A caller that often finds the queue empty checks [`OutboundQueue::is_drained`] first,
    /// inline, rather than make the call.
    pub fn drain_into<E: Encode + ?Sized>(&mut self, out: &mut Vec<Frame>, codec: &E, now_us: u64) {
        while let Some(Reverse((due, _))) = self.due.peek() {
            if *due > now_us {
                break;
            }
            let Reverse((_, topic)) = self.due.pop().expect("peeked");
            let state = self
                .conflated
                .get_mut(&topic)
                .expect("held topics have state");
            let message = state.held.take().expect("a due topic holds a message");
            state.queued = Some(self.base + self.slots.len() as u64);
            state.last_us = now_us;
            self.held_bytes -= message.size();
            self.append(Entry::Message(message, Some(topic)));
        }
        // Checked first: draining a map that once held notices walks its whole table, and this
        // runs at every writer wake-up.
        if !self.dropped.is_empty() {
            out.extend(
                self.dropped
                    .drain()
                    .map(|(topic, count)| codec.dropped(&topic, count, DropReason::Drop)),
            );
        }
        self.base += self.slots.len() as u64;
        // Popped one by one: `drain(..).flatten()`'s adaptors cost more to set up and drop than
        // a short queue's entries, empty queue or not (a direct write drains twice).
        while let Some(slot) = self.slots.pop_front() {
            let (message, topic) = match slot {
                None => continue, // a dropped message's hole
                Some(Entry::Frame(frame)) => {
                    out.push(*frame);
                    continue;
                }
                Some(Entry::Message(message, topic)) => (message, topic),
                Some(Entry::Grouped(grouped)) => {
                    codec.grouped(&grouped.0, &grouped.1, out);
                    continue;
                }
            };
            if let Some(topic) = &topic {
                if let Some(state) = self.conflated.get_mut(topic) {
                    state.queued = None;
                    if state.superseded > 0 {
                        out.push(codec.dropped(topic, state.superseded, DropReason::Conflate));
                        state.superseded = 0;
                    }
                }
            }
            codec.message(&message, out);
        }
        self.droppable.clear();
        self.live = 0;
        self.bytes = 0;
        self.recovered_bytes = 0;
    }

    /// Whether [`OutboundQueue::drain_into`] would find nothing at all to move: no entry, no
    /// notice, no throttled message (even one not yet due).
    #[inline]
    pub fn is_drained(&self) -> bool {
        self.slots.is_empty() && self.due.is_empty() && self.dropped.is_empty()
    }

    /// Gives back the memory a burst left behind, once the queue is empty: an idle connection
    /// (most of them, most of the time) should not keep room for the hundred replies of its
    /// subscribe burst. Small capacities stay, so steady traffic never reallocates.
    #[inline]
    pub fn shrink_idle(&mut self) {
        if self.slots.capacity() > IDLE_CAPACITY || self.droppable.capacity() > IDLE_CAPACITY {
            self.shrink_emptied();
        }
    }

    fn shrink_emptied(&mut self) {
        if self.slots.is_empty() && self.slots.capacity() > IDLE_CAPACITY {
            self.slots.shrink_to(IDLE_CAPACITY);
        }
        if self.droppable.is_empty() && self.droppable.capacity() > IDLE_CAPACITY {
            self.droppable.shrink_to(IDLE_CAPACITY);
        }
    }

    /// When the earliest throttled message may go (µs), if one waits.
    pub fn next_due(&self) -> Option<u64> {
        self.due.peek().map(|Reverse((due, _))| *due)
    }

    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// Entries queued (throttled messages not counted).
    pub fn len(&self) -> usize {
        self.live
    }

    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// Bytes queued and not yet handed to the writer, and held back by throttling.
    pub fn bytes(&self) -> usize {
        self.bytes + self.held_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Native;
    use bytes::Bytes;

    fn frame(n: usize) -> Frame {
        Frame {
            head: Bytes::from(vec![0; n]),
            body: Bytes::new(),
        }
    }

    #[test]
    fn bounds_the_backlog_in_bytes() {
        let mut q = OutboundQueue::new(100);
        assert_eq!(q.push(frame(60)), Pushed::First);
        assert_eq!(q.push(frame(40)), Pushed::Queued);
        assert_eq!(q.push(frame(1)), Pushed::Overflow);
        assert_eq!((q.len(), q.bytes()), (2, 100));
        let mut out = Vec::new();
        q.drain_into(&mut out, &Native, 0);
        assert_eq!((out.len(), q.bytes()), (2, 0));
        assert_eq!(q.push(frame(1)), Pushed::First);
    }

    #[test]
    fn a_single_oversized_frame_still_goes_out() {
        let mut q = OutboundQueue::new(10);
        assert_eq!(q.push(frame(1000)), Pushed::First);
        assert_eq!(q.push(frame(1)), Pushed::Overflow);
    }

    #[test]
    fn close_discards_backlog_and_refuses_more() {
        let mut q = OutboundQueue::new(100);
        q.push(frame(50));
        assert!(q.close(frame(4), true));
        assert!(!q.close(frame(4), true));
        assert_eq!(q.push(frame(1)), Pushed::Closed);
        let mut out = Vec::new();
        q.drain_into(&mut out, &Native, 0);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].len(), 4);
        assert!(q.is_closed());
    }

    #[test]
    fn an_idle_queue_gives_back_what_a_burst_grew() {
        let mut q = OutboundQueue::new(1 << 20);
        for _ in 0..100 {
            q.push(frame(10));
        }
        let mut out = Vec::new();
        q.drain_into(&mut out, &Native, 0);
        assert_eq!(out.len(), 100);
        assert!(q.slots.capacity() >= 100);
        q.shrink_idle();
        assert!(
            q.slots.capacity() <= IDLE_CAPACITY,
            "{}",
            q.slots.capacity()
        );
        // A queue with frames waiting keeps its room.
        for _ in 0..100 {
            q.push(frame(10));
        }
        q.shrink_idle();
        assert!(q.slots.capacity() >= 100);
    }

    #[test]
    fn a_grouped_message_goes_to_its_group_and_a_full_queue_applies_the_policy() {
        use crate::message::TopicHead;
        use crate::request::PayloadKind;

        /// Marks what it encodes: `m` a message, `g:NAME` one for a group.
        struct Marks;
        impl Encode for Marks {
            fn message(&self, _: &Message, out: &mut Vec<Frame>) {
                out.push(frame_of("m"));
            }
            fn grouped(&self, _: &Message, group: &Arc<Group>, out: &mut Vec<Frame>) {
                out.push(frame_of(&format!("g:{}", group.name)));
            }
            fn reply(&self, _: &crate::reply::Reply) -> Frame {
                Frame::default()
            }
            fn dropped(&self, topic: &str, count: u64, _: DropReason) -> Frame {
                frame_of(&format!("dropped {topic} {count}"))
            }
        }
        fn frame_of(s: &str) -> Frame {
            Frame {
                head: Bytes::from(s.to_owned()),
                body: Bytes::new(),
            }
        }
        let topic: Arc<str> = "t".into();
        let head = TopicHead::new(topic.clone(), "e".into());
        let m = Message::new(head, 1, PayloadKind::Binary, Bytes::new(), None, None);
        let group = Arc::new(Group {
            name: "g".into(),
            pattern: "t".into(),
        });
        let d = |policy| Delivery {
            topic: &topic,
            policy,
            rule: None,
            now_us: 0,
        };
        let mut q = OutboundQueue::new(m.size() * 2);
        assert!(q.has_room(m.size()));
        q.deliver(&m, &d(QueuePolicy::Keep));
        q.deliver_grouped(&m, &group, &d(QueuePolicy::Keep));
        assert!(!q.has_room(m.size()));
        let dropped = q.deliver_grouped(&m, &group, &d(QueuePolicy::Drop));
        assert_eq!((dropped.pushed, dropped.dropped), (Pushed::Queued, 1));
        let kept = q.deliver_grouped(&m, &group, &d(QueuePolicy::Keep));
        assert_eq!(kept.pushed, Pushed::Overflow);
        let mut out = Vec::new();
        q.drain_into(&mut out, &Marks, 0);
        let got: Vec<_> = out
            .iter()
            .map(|f| String::from_utf8_lossy(&f.head).into_owned())
            .collect();
        assert_eq!(got, ["dropped t 1", "m", "g:g"]);
    }

    #[test]
    fn graceful_close_keeps_backlog() {
        let mut q = OutboundQueue::new(100);
        q.push(frame(50));
        q.close(frame(4), false);
        let mut out = Vec::new();
        q.drain_into(&mut out, &Native, 0);
        assert_eq!(out.iter().map(Frame::len).collect::<Vec<_>>(), vec![50, 4]);
    }
}

#[cfg(test)]
mod policy_tests {
    use super::*;
    use crate::message::TopicHead;
    use crate::policy::QueuePolicy;
    use crate::reply::Reply;
    use crate::request::PayloadKind;
    use bytes::Bytes;
    use std::cell::Cell;

    /// Message `n` of `topic`.
    fn msg(topic: &Arc<str>, n: u64) -> Message {
        let head = TopicHead::new(topic.clone(), "e".into());
        Message::new(head, n, PayloadKind::Binary, Bytes::new(), None, None)
    }

    /// Encodes a message as its seq (8 bytes), notices as herald does; counts its encodings.
    #[derive(Default)]
    struct Seqs {
        encoded: Cell<usize>,
    }

    impl Encode for Seqs {
        fn message(&self, m: &Message, out: &mut Vec<Frame>) {
            out.push(
                m.encoded(1, |m| {
                    self.encoded.set(self.encoded.get() + 1);
                    Frame {
                        head: Bytes::from(m.seq().to_be_bytes().to_vec()),
                        body: Bytes::new(),
                    }
                })
                .clone(),
            );
        }
        fn reply(&self, reply: &Reply) -> Frame {
            crate::wire::Native.reply(reply)
        }
        fn dropped(&self, topic: &str, count: u64, reason: DropReason) -> Frame {
            crate::wire::Native.dropped(topic, count, reason)
        }
    }

    fn value(f: &Frame) -> Option<u64> {
        (f.head.len() == 8).then(|| u64::from_be_bytes(f.head[..].try_into().unwrap()))
    }

    /// 100 topics updated every 200 µs each for 5 s, drained every ms, at max_rate 2: every
    /// topic gets about 2 messages a second, always newer, and its last value once the updates
    /// stop.
    #[test]
    fn max_rate_delivers_the_newest_every_interval_under_load() {
        let topics: Vec<Arc<str>> = (0..100).map(|t| Arc::from(format!("t/{t}"))).collect();
        let mut q = OutboundQueue::new(1 << 20);
        let policy = QueuePolicy::Conflate {
            min_interval_us: 500_000,
        };
        let mut last = vec![0u64; topics.len()];
        let mut got = vec![0u32; topics.len()];
        let mut out = Vec::new();
        let mut n = 0u64;
        let mut now = 1_000_000u64;
        let mut drain =
            |q: &mut OutboundQueue, now: u64, last: &mut Vec<u64>, got: &mut Vec<u32>| {
                q.drain_into(&mut out, &Seqs::default(), now);
                for f in out.drain(..) {
                    if let Some(v) = value(&f) {
                        let t = ((v - 1) % 100) as usize;
                        assert!(v > last[t], "stale");
                        last[t] = v;
                        got[t] += 1;
                    }
                }
            };
        while now < 6_000_000 {
            for topic in &topics {
                n += 1;
                let d = Delivery {
                    topic,
                    policy,
                    rule: None,
                    now_us: now,
                };
                q.deliver(&msg(topic, n), &d);
            }
            now += 200;
            if now.is_multiple_of(1000) {
                drain(&mut q, now, &mut last, &mut got);
            }
        }
        drain(&mut q, now + 1_000_000, &mut last, &mut got);
        assert!(got.iter().all(|g| (10..=12).contains(g)), "{got:?}");
        assert!(
            last.iter()
                .enumerate()
                .all(|(t, v)| *v == n - 99 + t as u64),
            "{last:?}"
        );
    }

    /// What a drain produced, readably: a message's value, or `dropped TOPIC COUNT`.
    fn shape(out: &[Frame]) -> Vec<String> {
        out.iter()
            .map(|f| match value(f) {
                Some(v) => v.to_string(),
                None => {
                    let (_, body) = crate::test_support::unframe(f);
                    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
                    format!(
                        "{} {} {}",
                        v["op"].as_str().unwrap(),
                        v["topic"].as_str().unwrap(),
                        v["count"]
                    )
                }
            })
            .collect()
    }

    /// Each conflated message comes right after one notice counting exactly the values it
    /// superseded, and no other notice is sent: a topic waiting for its slot does not announce
    /// itself at every write in between.
    #[test]
    fn a_conflated_message_carries_its_own_notice() {
        let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        let mut q = OutboundQueue::new(1 << 20);
        let policy = QueuePolicy::Conflate {
            min_interval_us: 1_000,
        };
        let at = |topic, now_us| Delivery {
            topic,
            policy,
            rule: None,
            now_us,
        };
        let codec = Seqs::default();
        q.deliver(&msg(&a, 1), &at(&a, 1));
        q.deliver(&msg(&b, 10), &at(&b, 1));
        q.deliver(&msg(&a, 2), &at(&a, 2));
        q.deliver(&msg(&a, 3), &at(&a, 3));
        let mut out = Vec::new();
        q.drain_into(&mut out, &codec, 4);
        assert_eq!(shape(&out), ["dropped a 2", "3", "10"]);

        // `a` went at 1: its next slot is at 1,001. 4 waits and 5 replaces it.
        q.deliver(&msg(&a, 4), &at(&a, 100));
        q.deliver(&msg(&a, 5), &at(&a, 200));
        out.clear();
        for now in [300, 600, 900] {
            q.drain_into(&mut out, &codec, now);
        }
        assert!(out.is_empty(), "{:?}", shape(&out));
        q.drain_into(&mut out, &codec, 1_001);
        assert_eq!(shape(&out), ["dropped a 1", "5"]);
        // The values conflated away never went out, and were never encoded.
        assert_eq!(codec.encoded.get(), 3);
    }

    /// One message delivered to many queues, live under each policy and replayed, is encoded
    /// once for the protocol they speak, and every queue sends the same bytes.
    #[test]
    fn a_message_is_encoded_once_for_every_queue_it_reaches() {
        let topic: Arc<str> = "t".into();
        let m = msg(&topic, 7);
        let codec = Seqs::default();
        let policies = [
            QueuePolicy::Keep,
            QueuePolicy::Drop,
            QueuePolicy::Conflate { min_interval_us: 0 },
        ];
        let mut sent = Vec::new();
        for policy in policies.into_iter().cycle().take(30) {
            let mut q = OutboundQueue::new(1 << 20);
            let d = Delivery {
                topic: &topic,
                policy,
                rule: None,
                now_us: 1,
            };
            q.deliver(&m, &d);
            q.push_recovered(m.clone());
            q.drain_into(&mut sent, &codec, 1);
        }
        assert_eq!(sent.len(), 60);
        assert_eq!(codec.encoded.get(), 1, "encoded once");
        assert!(sent
            .iter()
            .all(|f| f.head.as_ptr() == sent[0].head.as_ptr()));
    }
}
