//! Snapshots: the last value of each topic a new subscription matches, sent in slices.
//!
//! A snapshot of `>` over a million topics is a million messages. Made under the engine's lock
//! in one piece, it would stall every other client for the whole walk. So a snapshot walks its
//! topics in name order (`Topics::walk`, resumable from a name) at most [`SLICE`] steps at a
//! time, and the lock is free between slices:
//!
//! - The first slice goes with the `subscribed` reply, its messages counted in the reply's
//!   `replayed` and following it at once: a snapshot of up to [`SLICE`] topics (nearly all of
//!   them) is whole there, as if it were not sliced.
//! - The rest is served by [`Engine::serve_snapshots`], which the server calls until none is
//!   left, each slice announced by a notice ([`Outbox::snapshot`]) that says how many messages
//!   of it follow the notice at once: what is replayed is told apart from what is live.
//!
//! The subscription is live from its reply, so a topic not walked yet may be published
//! meanwhile: that message reaches the subscriber live, before the walk gets there, and it is
//! newer than the value the snapshot would have sent. So the walk passes over every topic
//! published since the snapshot was asked for. Per topic, the subscriber gets either its last
//! value and then what follows it live, or, when it was published during the snapshot, what
//! follows live from the first message after the request (as a subscriber without snapshot
//! would): never a live message before the topic's snapshot, never one twice, and nothing left
//! out without its being newer.
//!
//! A snapshot is paced by the connection's recovery room ([`Outbox::recovery_room`],
//! `max_recovery_bytes`) rather than cut by it: a slice queues values while the connection has
//! room (the last one may pass the bound by its own size), and the snapshot waits for the
//! client to read when it has none. So a snapshot never reports a gap, and what it holds is
//! bounded per connection. It also waits while more than [`AHEAD`] bytes of it are queued and
//! not yet taken by the connection's writer ([`Outbox::recovery_queued`]): the writer takes
//! the whole queue at once, under the connection's lock, and a publish to that connection
//! waits for the lock while holding the engine's, so a long queue would stall every client
//! again, a drain at a time.

use super::{ConnId, Engine, Outbox};
use crate::message::Message;
use crate::request::Subscribe;
use crate::topic;
use std::collections::VecDeque;

/// Steps (a seek, or a topic found) one slice of a snapshot takes at most: a hold of the
/// engine's lock short beside a client's round trip.
pub const SLICE: usize = 1024;

/// Bytes of snapshot a connection may have queued, and its writer not taken yet, before the
/// next slice waits: a few slices' worth, little to encode for the writer that takes it at
/// once.
pub const AHEAD: usize = 1 << 20;

/// Snapshots under way [`Engine::serve_snapshots`] looks at in one call, at most: a client may
/// keep hundreds waiting (one per subscription) by not reading.
pub const LOOK: usize = 64;

/// A snapshot whose first slice did not reach its end.
pub(super) struct Pending {
    conn: ConnId,
    pattern: String,
    /// The publish count when it was asked for: a topic published since reached the
    /// subscription live, with a value newer than the snapshot's.
    asked_at: u64,
    /// Topics whose recovery the reply answered instead, by name: those named in `since`
    /// (sorted), and, from a cursor (publish count), those published after it.
    since: Vec<String>,
    replayed_after: Option<u64>,
    /// Where the walk goes on: every name before it was looked at.
    from: String,
}

/// What [`Engine::serve_snapshots`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Served {
    /// No snapshot is under way.
    Idle,
    /// A slice was served, or snapshots remain to be looked at: there may be more to serve now.
    More,
    /// Every snapshot under way waits for its connection to read what it was sent.
    Waiting,
}

/// The snapshots under way, served in turn.
#[derive(Default)]
pub(super) struct Snapshots {
    pending: VecDeque<Pending>,
    /// Snapshots looked at, one after another, that waited for their clients: once it reaches
    /// the number under way, every one waits.
    waited: usize,
}

impl Snapshots {
    /// Forgets connection `conn`'s snapshot of `pattern` (all of its snapshots, when `None`).
    pub fn cancel(&mut self, conn: ConnId, pattern: Option<&str>) {
        self.pending
            .retain(|p| p.conn != conn || pattern.is_some_and(|t| t != p.pattern));
    }
}

impl<O: Outbox> Engine<O> {
    /// Starts subscription `s`'s snapshot for connection `conn`, asked for now: returns its
    /// first slice, to be sent after the reply, and keeps the rest for
    /// [`Engine::serve_snapshots`]. `replayed_after`: the cursor the reply's recovery replayed
    /// from, if any; `room`: the bytes of recovery the connection may still queue.
    pub(super) fn start_snapshot(
        &mut self,
        conn: ConnId,
        s: &Subscribe,
        replayed_after: Option<u64>,
        room: usize,
        now_us: u64,
    ) -> Vec<Message> {
        self.snapshots.cancel(conn, Some(&s.topic));
        let mut since: Vec<String> = s.since.keys().cloned().collect();
        since.sort_unstable();
        let mut pending = Pending {
            conn,
            pattern: s.topic.clone(),
            asked_at: self.publish_count,
            since,
            replayed_after,
            from: String::new(),
        };
        let (first, rest) = self.slice(&pending, room, now_us);
        if let Some(from) = rest {
            pending.from = from;
            self.snapshots.pending.push_back(pending);
        }
        first
    }

    /// Whether a snapshot is under way.
    pub fn snapshots_pending(&self) -> bool {
        !self.snapshots.pending.is_empty()
    }

    /// Serves one slice of the next snapshot under way whose connection has recovery room and
    /// not more than [`AHEAD`] bytes of recovery queued, announced by its notice and queued on
    /// the connection. Looks at [`LOOK`] snapshots at most, so that a call costs little however
    /// many wait for their clients.
    pub fn serve_snapshots(&mut self, now_us: u64) -> Served {
        let looking = self.snapshots.pending.len().min(LOOK);
        for _ in 0..looking {
            let mut pending = self.snapshots.pending.pop_front().expect("counted");
            let Some(c) = self.conn(pending.conn) else {
                continue;
            };
            let room = c.outbox.recovery_room();
            if room == 0 || c.outbox.recovery_queued() > AHEAD {
                self.snapshots.pending.push_back(pending);
                self.snapshots.waited += 1;
                continue;
            }
            self.snapshots.waited = 0;
            let (messages, rest) = self.slice(&pending, room, now_us);
            let c = self.conn(pending.conn).expect("looked up above");
            if !messages.is_empty() {
                c.outbox.snapshot(&pending.pattern, messages.len());
                messages.iter().for_each(|m| c.outbox.recovered(m));
            }
            if let Some(from) = rest {
                pending.from = from;
                self.snapshots.pending.push_back(pending);
            }
            return Served::More;
        }
        if self.snapshots.pending.is_empty() {
            self.snapshots.waited = 0;
            Served::Idle
        } else if self.snapshots.waited >= self.snapshots.pending.len() {
            self.snapshots.waited = 0;
            Served::Waiting
        } else {
            Served::More
        }
    }

    /// The values of one slice of snapshot `p`, at most `room` bytes of them (and one more),
    /// and where the next slice starts, if the snapshot goes on.
    fn slice(&self, p: &Pending, room: usize, now_us: u64) -> (Vec<Message>, Option<String>) {
        let mut left = room;
        let mut values = Vec::new();
        let rest = self.topics.walk(&p.pattern, &p.from, SLICE, |t| {
            let answered = t.last_at() > p.asked_at
                || p.replayed_after.is_some_and(|cursor| t.last_at() > cursor)
                || p.since.binary_search_by(|n| (**n).cmp(&*t.name)).is_ok();
            if answered {
                return true;
            }
            if left == 0 {
                return false;
            }
            // An expired message is not delivered: its publisher said it would be of no use.
            if let Some(m) = t.last_message().filter(|m| !m.expired(now_us)) {
                left = left.saturating_sub(m.size());
                values.push(m);
            }
            true
        });
        debug_assert!(values.iter().all(|m| topic::matches(&p.pattern, m.topic())));
        (values, rest)
    }
}
