//! The engine: topics (sequence numbers, epochs, history, last value), subscriptions, and
//! fan-out. Pure and deterministic: time comes in as an argument and what a connection is sent
//! goes out through its [`Outbox`], so it is tested without sockets or clocks.
//!
//! The engine speaks no protocol: it takes [`Request`]s and sends typed [`Reply`]s, notices and
//! [`Message`]s. A message is made once and the same refcounted [`Message`] is handed to every
//! matching connection (a connection holding overlapping patterns gets it once); each
//! connection's protocol encodes it when it leaves the connection's queue (see
//! [`crate::message`]).
//!
//! This file holds the engine's state and the request entry point; each idea has its file:
//! `config` (history rules, limits), `connections` (joining, leaving, quotas), `publish`
//! (numbering, recording, fan-out, remote numbering and holes), `groups` (group
//! subscriptions, whose members share their messages), `subscribe` (with recovery:
//! `recovery` plans and fits it, `snapshot` serves last values in slices), `lossless` (who
//! publishers wait for, credit), `interest` (the patterns held, for a broker), `cluster` (what
//! a broker asks of the engine), `sweep` (ageing history, forgetting idle topics), `topics`
//! (the topics' state).

use crate::group::Group;
use crate::index::SubscriptionIndex;
use crate::message::Message;
use crate::outbox::Delivery;
use crate::policy::{Credit, Policy, PolicyRule, QueuePolicy};
use crate::prefetch::prefetch;
use crate::reply::{DropReason, Reply};
use crate::request::{PayloadKind, ProtocolError, Publish, Request, RequestId, Subscribe};
use crate::topic;
use bytes::Bytes;
use compact_str::CompactString;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::Arc;

/// Where what the engine sends a connection goes. The server's implementation queues it for
/// the socket writer, to be encoded in the connection's protocol; tests collect it.
pub trait Outbox {
    /// A reply to one of the connection's requests: never dropped.
    fn reply(&self, reply: &Reply);

    /// `count` messages of `topic` never reached the connection, for `reason`: never dropped.
    fn dropped(&self, topic: &str, count: u64, reason: DropReason);

    /// A live message, under the slow-consumer policy that applies to it on this connection.
    fn deliver(&self, message: &Message, delivery: &Delivery);

    /// A replayed or snapshot message: never dropped, and not counted against the bound on
    /// live messages (a recovery larger than that bound must not cut a healthy subscriber).
    fn recovered(&self, message: &Message);

    /// A live message for `group`, of which the connection is a member (see
    /// [`crate::outbox::OutboundQueue::deliver_grouped`]).
    fn deliver_grouped(&self, message: &Message, _group: &Arc<Group>, delivery: &Delivery) {
        self.deliver(message, delivery)
    }

    /// Whether a live message of `size` bytes ([`Message::size`]) would be queued now without
    /// the connection's slow-consumer policy acting: a group passes over a member that says no.
    fn has_room(&self, _size: usize) -> bool {
        true
    }

    /// A message for this connection is coming: start loading what [`Outbox::deliver`] will
    /// touch (see [`crate::prefetch`]).
    fn prefetch(&self) {}

    /// How many bytes of recovery ([`Message::size`]) this connection may still queue; a
    /// recovery larger than this leaves out its oldest messages and says so in its reply, and
    /// a snapshot waits for room.
    fn recovery_room(&self) -> usize {
        usize::MAX
    }

    /// How many bytes of recovery this connection has queued that its writer has not taken
    /// yet.
    fn recovery_queued(&self) -> usize {
        0
    }

    /// The next `count` messages are more of subscription `pattern`'s snapshot (see
    /// [`snapshot`]), served after its reply: recovered, not live.
    fn snapshot(&self, pattern: &str, count: usize);
}

impl<T: Outbox + ?Sized> Outbox for std::sync::Arc<T> {
    fn reply(&self, reply: &Reply) {
        (**self).reply(reply)
    }

    fn dropped(&self, topic: &str, count: u64, reason: DropReason) {
        (**self).dropped(topic, count, reason)
    }

    fn deliver(&self, message: &Message, delivery: &Delivery) {
        (**self).deliver(message, delivery)
    }

    fn recovered(&self, message: &Message) {
        (**self).recovered(message)
    }

    fn deliver_grouped(&self, message: &Message, group: &Arc<Group>, delivery: &Delivery) {
        (**self).deliver_grouped(message, group, delivery)
    }

    fn has_room(&self, size: usize) -> bool {
        (**self).has_room(size)
    }

    fn prefetch(&self) {
        (**self).prefetch()
    }

    fn recovery_room(&self) -> usize {
        (**self).recovery_room()
    }

    fn recovery_queued(&self) -> usize {
        (**self).recovery_queued()
    }

    fn snapshot(&self, pattern: &str, count: usize) {
        (**self).snapshot(pattern, count)
    }
}

pub type ConnId = u32;

/// Who publishes, for per-publisher quotas: the server numbers each token subject from 1; 0 is
/// nobody in particular (auth off, the admin key, other nodes), bound only by the server-wide
/// limits.
pub type Origin = u32;

/// What one [`Origin`]'s topics hold.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Topics it created that herald still holds.
    pub topics: usize,
    /// Bytes those topics keep (history, or last value).
    pub retained: usize,
}

pub use cluster::{Recalled, Unanswered};
pub use config::{EngineConfig, HistoryRule, DEFAULT_WINDOW};
pub use snapshot::Served;
pub use sweep::Swept;

/// A change in the set of patterns this engine's connections hold: the first subscriber to a
/// pattern adds it, the last one to leave removes it. A cluster bridge subscribes upstream only
/// to what local clients want (see [`Engine::track_interest`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Interest {
    Added(String),
    Removed(String),
}

/// What publishing a message another node numbered did (see [`Engine::publish_remote`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemotePublished {
    pub published: Published,
    /// Messages of the origin's epoch that never arrived before this one; local subscribers of
    /// the topic were sent a `dropped` notice with this count.
    pub missed: u64,
}

/// What a publish did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Published {
    pub seq: u64,
    /// Connections the message was handed to.
    pub deliveries: usize,
    /// `lossless` subscribers that had granted no more credit: the message could not go to them
    /// without exceeding their window, so their subscriptions were removed ([`Engine::detach`]);
    /// the caller closes their connections.
    pub cut: Vec<ConnId>,
}

/// One topic as [`Engine::topics`] shows it.
#[derive(Clone, Copy)]
pub struct TopicView<'a> {
    pub name: &'a str,
    /// The last sequence number given out (0 before the first message of the epoch).
    pub seq: u64,
    pub epoch: &'a str,
    /// Connections holding at least one subscription that matches the topic.
    pub subscribers: usize,
    /// Messages held for `since` recovery.
    pub history: usize,
    state: &'a TopicState,
}

impl TopicView<'_> {
    /// The last message, as a snapshot delivers it (made now if it was kept as published:
    /// asked for only by those who show it).
    pub fn last(&self) -> Option<Message> {
        self.state.last_message()
    }
}

/// One subscription of a connection. Kept small: a connection may hold hundreds, and at 100
/// each this struct and its pattern's allocation were most of a connection's memory.
struct Sub {
    /// Inline up to 24 bytes (nearly every pattern), so a subscription allocates nothing.
    pattern: CompactString,
    /// The publish count when it was subscribed (see [`Engine::publish_remote`]: who was
    /// listening before a hole).
    subscribed_at: u64,
    /// A policy or rate asked for in the request; `None` (most subscriptions) leaves each
    /// topic to its configured default. Boxed: it is larger than the rest of the struct.
    options: Option<Box<SubOptions>>,
}

// What a subscription costs a connection; grows only on purpose.
const _: () = assert!(std::mem::size_of::<Sub>() <= 40);

struct SubOptions {
    policy: Option<Policy>,
    max_rate: Option<f64>,
    /// The connection's own messages do not come through it.
    no_local: bool,
    /// `lossless`: messages (and bytes) the subscriber still grants.
    credit: Credit,
}

impl Sub {
    #[inline]
    fn new(s: &Subscribe, subscribed_at: u64) -> Self {
        let explicit = s.policy.is_some() || s.max_rate.is_some() || s.no_local;
        let options = explicit.then(|| {
            Box::new(SubOptions {
                policy: s.policy,
                max_rate: s.max_rate,
                no_local: s.no_local,
                credit: if s.policy == Some(Policy::Lossless) {
                    Credit::new(s.window, s.window_bytes, DEFAULT_WINDOW)
                } else {
                    Credit::default()
                },
            })
        });
        Sub {
            pattern: CompactString::from(s.topic.as_str()),
            subscribed_at,
            options,
        }
    }

    #[inline]
    fn policy(&self) -> Option<Policy> {
        self.options.as_ref().and_then(|o| o.policy)
    }

    #[inline]
    fn max_rate(&self) -> Option<f64> {
        self.options.as_ref().and_then(|o| o.max_rate)
    }

    /// What a `lossless` subscription still grants (nothing, for any other).
    #[inline]
    fn credit(&self) -> Credit {
        self.options
            .as_ref()
            .map_or_else(Credit::default, |o| o.credit)
    }

    #[inline]
    fn credit_mut(&mut self) -> Option<&mut Credit> {
        self.options.as_mut().map(|o| &mut o.credit)
    }

    #[inline]
    fn no_local(&self) -> bool {
        self.options.as_ref().is_some_and(|o| o.no_local)
    }

    #[inline]
    fn is_explicit(&self) -> bool {
        self.options.is_some()
    }

    #[inline]
    fn is_lossless(&self) -> bool {
        self.policy() == Some(Policy::Lossless)
    }
}

struct Conn<O> {
    outbox: O,
    subs: Vec<Sub>,
    /// Subscriptions that chose a policy or rate: while none did, every topic takes its
    /// configured default without looking at the patterns.
    explicit: usize,
    /// The last publish that reached this connection: dedupes overlapping patterns in O(1).
    seen: u64,
    /// Who publishes through it, for quotas.
    origin: Origin,
    /// Its `no_local` subscriptions: while there are none, its own messages are not looked at.
    no_local: u32,
}

impl<O> Conn<O> {
    /// Whether the subscriptions that would bring this connection its own message on `topic`
    /// are all `no_local` (a subscription that matches and is not keeps the message coming,
    /// under whichever of its subscriptions [`Conn::policy_for`] chooses).
    #[inline]
    fn only_no_local(&self, topic: &str) -> bool {
        self.no_local > 0
            && self
                .subs
                .iter()
                .filter(|s| topic::matches(&s.pattern, topic))
                .all(Sub::no_local)
    }

    /// The policy for `topic` on this connection, its rate, and the subscription whose credit a
    /// `lossless` message spends. Among overlapping subscriptions the highest
    /// [`Policy::rank`] wins, then the earliest subscribed.
    ///
    /// Inline, for its common case: no subscription chose, and the default is taken without a
    /// call (this runs once per delivery).
    #[inline(always)]
    fn policy_for(&self, topic: &str, default: (Policy, Option<f64>)) -> Chosen {
        if self.explicit == 0 {
            return Chosen::by_default(default);
        }
        self.policy_among_subs(topic, default)
    }

    /// [`Conn::policy_for`] when some subscription chose a policy or rate.
    fn policy_among_subs(&self, topic: &str, default: (Policy, Option<f64>)) -> Chosen {
        // The index found this connection through a subscription that matches: with only one,
        // it is that one, and no pattern needs matching again.
        if let [only] = self.subs.as_slice() {
            return Chosen {
                policy: only.policy().unwrap_or(default.0),
                max_rate: only.max_rate().or(default.1),
                sub: Some(0),
            };
        }
        let mut best: Option<Chosen> = None;
        for (i, s) in self.subs.iter().enumerate() {
            if !topic::matches(&s.pattern, topic) {
                continue;
            }
            let policy = s.policy().unwrap_or(default.0);
            if best.is_some_and(|b| b.policy.rank() >= policy.rank()) {
                continue;
            }
            best = Some(Chosen {
                policy,
                max_rate: s.max_rate().or(default.1),
                sub: Some(i),
            });
        }
        best.unwrap_or(Chosen::by_default(default))
    }
}

#[derive(Clone, Copy)]
struct Chosen {
    policy: Policy,
    max_rate: Option<f64>,
    sub: Option<usize>,
}

impl Chosen {
    /// The topic's default policy and rate, no subscription's.
    #[inline(always)]
    fn by_default((policy, max_rate): (Policy, Option<f64>)) -> Chosen {
        Chosen {
            policy,
            max_rate,
            sub: None,
        }
    }
}

pub struct Engine<O> {
    config: EngineConfig,
    topics: Topics,
    index: SubscriptionIndex<ConnId>,
    conns: Vec<Option<Conn<O>>>,
    free: Vec<ConnId>,
    publish_count: u64,
    subscriptions: usize,
    /// `lossless` subscriptions held by all connections: while there are none, publishing
    /// skips the credit check.
    lossless: usize,
    /// Subscriber count per pattern, kept only once [`Engine::track_interest`] was called.
    interest: Option<HashMap<Box<str>, usize>>,
    interest_changes: Vec<Interest>,
    /// Scratch for [`Engine::append`]: the connections a message matched.
    matched: Vec<ConnId>,
    /// Group subscriptions (see [`crate::group`]).
    groups: groups::Groups,
    /// What each [`Origin`]'s topics hold, indexed by origin.
    usage: Vec<Usage>,
    /// Snapshots served a slice at a time (see [`snapshot`]).
    snapshots: snapshot::Snapshots,
}

impl<O: Outbox> Engine<O> {
    /// `epoch_seed` makes epochs differ between runs (the server passes a random number; tests a
    /// fixed one).
    pub fn new(config: EngineConfig, epoch_seed: u64) -> Self {
        Engine {
            config,
            topics: Topics::new(epoch_seed),
            index: SubscriptionIndex::new(),
            conns: Vec::new(),
            free: Vec::new(),
            publish_count: 0,
            subscriptions: 0,
            lossless: 0,
            interest: None,
            interest_changes: Vec::new(),
            matched: Vec::new(),
            groups: groups::Groups::default(),
            usage: Vec::new(),
            snapshots: snapshot::Snapshots::default(),
        }
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// The epoch of topic `name`, if it has state.
    pub fn epoch_of(&self, name: &str) -> Option<&str> {
        self.topics.get(name).map(|t| t.head.epoch())
    }

    pub fn subscription_count(&self) -> usize {
        self.subscriptions
    }

    pub fn topic_count(&self) -> usize {
        self.topics.len()
    }

    /// A page of topics, read-only, for introspection (the dashboard's topic explorer): those
    /// whose name starts with `prefix`, after `after`, in name order, at most `limit`. Costs
    /// the page, not every topic; counting a topic's subscribers walks the subscription index
    /// once per topic listed, so this is for an occasional request, not the publish path.
    pub fn topics_page<'a>(
        &'a self,
        prefix: &'a str,
        after: Option<&'a str>,
        limit: usize,
    ) -> impl Iterator<Item = TopicView<'a>> + 'a {
        let mut conns = Vec::new();
        self.topics.page(prefix, after, limit).map(move |t| {
            conns.clear();
            self.index.for_each_match(&t.name, |c| conns.push(c));
            conns.sort_unstable();
            conns.dedup();
            TopicView {
                name: &t.name,
                seq: t.seq,
                epoch: t.head.epoch(),
                subscribers: conns.len(),
                history: t.history.len(),
                state: t,
            }
        })
    }

    /// How many topics' names start with `prefix` (walks them, unless the prefix is empty).
    pub fn topic_count_under(&self, prefix: &str) -> usize {
        if prefix.is_empty() {
            return self.topics.len();
        }
        self.topics.page(prefix, None, usize::MAX).count()
    }

    /// Carries out one request from connection `conn`; replies and errors go to its outbox.
    /// Returns what a publish did (for metrics), or the error code of a failed request.
    pub fn handle(
        &mut self,
        conn: ConnId,
        request: Request,
        now_us: u64,
    ) -> Result<Option<Published>, &'static str> {
        let result = match request {
            Request::Publish(p) => return self.publish_from(conn, &p, now_us).map(Some),
            Request::Subscribe(s) => self.subscribe(conn, s, now_us).map(|()| None),
            Request::Unsubscribe {
                id,
                topic,
                group: Some(group),
            } => self.leave_group(conn, id, topic, &group).map(|()| None),
            Request::Unsubscribe { id, topic, .. } => {
                self.unsubscribe(conn, id, topic).map(|()| None)
            }
            Request::Ping { id } => {
                self.reply(conn, &Reply::Pong { id });
                Ok(None)
            }
            Request::Credit {
                id,
                topic,
                group: Some(group),
                n,
                bytes,
            } => self
                .credit_group(conn, id, &topic, &group, n, bytes)
                .map(|()| None),
            Request::Credit {
                id,
                topic,
                n,
                bytes,
                ..
            } => self.credit(conn, id, &topic, n, bytes).map(|()| None),
            Request::Auth { id, .. } => Err(ProtocolError::new(
                "unknown_op",
                "`auth` is answered by the server's network layer, not the engine",
            )
            .with_id(id)),
        };
        result.map_err(|e| {
            let code = e.code;
            self.reply(conn, &e.into());
            code
        })
    }

    /// Sends `reply` to one connection.
    pub fn reply(&self, conn: ConnId, reply: &Reply) {
        if let Some(c) = self.conn(conn) {
            c.outbox.reply(reply);
        }
    }

    #[cfg(test)]
    fn topic_state(&mut self, name: &str) -> &mut topics::TopicState {
        self.topics.entry(&self.config, name, Numbering::Origin)
    }
}

/// Message `seq` of the numbering `head`, made of publish `p`, stamped `stamp_us` if asked.
/// A text payload is a slice of the frame that brought it, and is copied: keeping the slice
/// would keep the whole read buffer alive. A binary one is already a buffer of its own (the
/// frame reader copies small ones out, see `wire::client_frames::detached`), and is shared.
#[inline]
fn message_of(
    head: &std::sync::Arc<crate::message::TopicHead>,
    seq: u64,
    p: &Publish,
    stamp_us: Option<u64>,
) -> Message {
    let payload = match p.kind {
        PayloadKind::Text => Bytes::copy_from_slice(&p.payload),
        PayloadKind::Binary => p.payload.clone(),
    };
    let content_type = p.content_type.as_deref().map(Box::from);
    Message::new(head.clone(), seq, p.kind, payload, content_type, stamp_us)
        .with_extras(p.extras.clone())
}

/// `origin`'s usage, made when first needed.
#[inline]
fn usage_of(usage: &mut Vec<Usage>, origin: Origin) -> &mut Usage {
    let at = origin as usize;
    if usage.len() <= at {
        usage.resize(at + 1, Usage::default());
    }
    &mut usage[at]
}

/// Brings what `state`'s owner is charged for it up to date with what it keeps now.
#[inline]
fn charge(usage: &mut Vec<Usage>, state: &mut TopicState) {
    if state.owner == 0 {
        return;
    }
    let now = u32::try_from(state.retained()).unwrap_or(u32::MAX);
    let owner = usage_of(usage, state.owner);
    owner.retained = owner.retained - state.charged as usize + now as usize;
    state.charged = now;
}

/// Drops `state`'s history older than its rule allows, and charges its owner for what is left.
fn age(config: &EngineConfig, usage: &mut Vec<Usage>, state: &mut TopicState, now_us: u64) {
    if let Some(rule) = state.history_rule(config) {
        state.trim_by_age(rule, now_us);
        charge(usage, state);
    }
}

impl<O> Engine<O> {
    /// Forgets topic `name` (its numbering, history and last value), giving its owner's share
    /// back: every topic that goes, goes through here.
    fn forget(&mut self, name: &str) {
        let Some(state) = self.topics.get(name) else {
            return;
        };
        if let Some(owner) = self
            .usage
            .get_mut(state.owner as usize)
            .filter(|_| state.owner != 0)
        {
            owner.retained -= state.charged as usize;
            owner.topics -= 1;
        }
        self.topics.remove(name);
    }
}

mod cluster;
mod config;
mod connections;
mod groups;
mod interest;
mod lossless;
mod publish;
mod recovery;
pub mod snapshot;
mod subscribe;
mod sweep;
mod topics;

use topics::{Last, Numbering, Stored, TopicState, Topics, Unmade};
#[cfg(test)]
mod tests;
