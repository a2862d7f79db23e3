//! The engine: topics (sequence numbers, epochs, history, last value), subscriptions, and
//! fan-out. Pure and deterministic: time comes in as an argument and what a connection is sent
//! goes out through its [`Outbox`], so it is tested without sockets or clocks.
//!
//! The engine speaks no protocol: it takes [`Request`]s and sends typed [`Reply`]s, notices and
//! [`Message`]s. A message is made once and the same refcounted [`Message`] is handed to every
//! matching connection (a connection holding overlapping patterns gets it once); each
//! connection's protocol encodes it when it leaves the connection's queue (see
//! [`crate::message`]).

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

    /// A message for this connection is coming: start loading what [`Outbox::deliver`] will
    /// touch (see [`crate::prefetch`]).
    fn prefetch(&self) {}

    /// How many bytes of recovery ([`Message::size`]) this connection may still queue; a
    /// recovery larger than this leaves out its oldest messages and says so in its reply.
    fn recovery_room(&self) -> usize {
        usize::MAX
    }
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

    fn prefetch(&self) {
        (**self).prefetch()
    }

    fn recovery_room(&self) -> usize {
        (**self).recovery_room()
    }
}

/// Messages a `lossless` subscription grants when its request names no `window`.
pub const DEFAULT_WINDOW: u64 = 16;

/// How much history topics keep: the first rule whose pattern matches a topic applies to it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HistoryRule {
    pub pattern: String,
    #[serde(default = "HistoryRule::default_messages")]
    pub max_messages: usize,
    #[serde(default = "HistoryRule::default_bytes")]
    pub max_bytes: usize,
    #[serde(default = "HistoryRule::default_age")]
    pub max_age_secs: u64,
}

impl HistoryRule {
    /// A rule under which the topics `pattern` matches keep only their last value.
    pub fn last_value_only(pattern: &str) -> Self {
        HistoryRule {
            pattern: pattern.into(),
            max_messages: 0,
            ..HistoryRule::default()
        }
    }

    /// Whether topics under this rule keep messages for recovery, not only the last value.
    pub fn keeps_messages(&self) -> bool {
        self.max_messages > 0
    }

    fn default_messages() -> usize {
        32
    }
    fn default_bytes() -> usize {
        1 << 20
    }
    fn default_age() -> u64 {
        300
    }
}

impl Default for HistoryRule {
    /// Every topic keeps its last 32 messages, up to 1 MiB and 5 minutes.
    fn default() -> Self {
        HistoryRule {
            pattern: ">".into(),
            max_messages: Self::default_messages(),
            max_bytes: Self::default_bytes(),
            max_age_secs: Self::default_age(),
        }
    }
}

#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// History rules, most specific first; topics no rule matches keep only their last value.
    pub history: Vec<HistoryRule>,
    pub max_subscriptions_per_connection: usize,
    pub max_message_bytes: usize,
    /// Default slow-consumer policies per topic, first match wins; else `disconnect`.
    pub policy: Vec<PolicyRule>,
    /// Patterns within which a subscription may be `lossless`: a lossless subscriber makes
    /// publishers wait for its credit, so the operator says where that is allowed.
    pub lossless_topics: Vec<String>,
    /// Most topics held at once; a publish that would create another is refused.
    pub max_topics: usize,
    /// A topic nothing was published on for this long (µs) and that no subscription matches
    /// is forgotten by [`Engine::sweep`]; 0 keeps topics for ever.
    pub topic_idle_us: u64,
    /// Topics one [`Origin`] may have created and herald still hold.
    pub max_topics_per_origin: usize,
    /// Bytes the topics one [`Origin`] created may keep; past it, it may create no more.
    pub max_retained_bytes_per_origin: usize,
}

impl EngineConfig {
    /// Whether `pattern` lies wholly within `lossless_topics`.
    pub fn allows_lossless(&self, pattern: &str) -> bool {
        self.lossless_topics
            .iter()
            .any(|g| crate::grant::covers(g, pattern))
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            policy: Vec::new(),
            lossless_topics: vec![">".into()],
            max_topics: 1_000_000,
            topic_idle_us: 3_600_000_000,
            max_topics_per_origin: 10_000,
            max_retained_bytes_per_origin: 128 << 20,
            history: vec![HistoryRule::default()],
            max_subscriptions_per_connection: 1000,
            max_message_bytes: 64 << 20,
        }
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
    /// `lossless`: messages (and bytes) the subscriber still grants.
    credit: Credit,
}

impl Sub {
    fn new(s: &Subscribe, subscribed_at: u64) -> Self {
        let explicit = s.policy.is_some() || s.max_rate.is_some();
        let options = explicit.then(|| {
            Box::new(SubOptions {
                policy: s.policy,
                max_rate: s.max_rate,
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

    fn policy(&self) -> Option<Policy> {
        self.options.as_ref().and_then(|o| o.policy)
    }

    fn max_rate(&self) -> Option<f64> {
        self.options.as_ref().and_then(|o| o.max_rate)
    }

    /// What a `lossless` subscription still grants (nothing, for any other).
    fn credit(&self) -> Credit {
        self.options
            .as_ref()
            .map_or_else(Credit::default, |o| o.credit)
    }

    fn credit_mut(&mut self) -> Option<&mut Credit> {
        self.options.as_mut().map(|o| &mut o.credit)
    }

    fn is_explicit(&self) -> bool {
        self.options.is_some()
    }

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
}

impl<O> Conn<O> {
    /// The policy for `topic` on this connection, its rate, and the subscription whose credit a
    /// `lossless` message spends. Among overlapping subscriptions the highest
    /// [`Policy::rank`] wins, then the earliest subscribed.
    fn policy_for(&self, topic: &str, default: (Policy, Option<f64>)) -> Chosen {
        let mut chosen = Chosen {
            policy: default.0,
            max_rate: default.1,
            sub: None,
        };
        if self.explicit == 0 {
            return chosen;
        }
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
        if let Some(b) = best {
            chosen = b;
        }
        chosen
    }
}

#[derive(Clone, Copy)]
struct Chosen {
    policy: Policy,
    max_rate: Option<f64>,
    sub: Option<usize>,
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
    /// What each [`Origin`]'s topics hold, indexed by origin.
    usage: Vec<Usage>,
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
            usage: Vec::new(),
        }
    }

    /// Publishes from connection `conn` are charged to `origin` (its token's subject).
    pub fn set_origin(&mut self, conn: ConnId, origin: Origin) {
        if let Some(c) = self.conns.get_mut(conn as usize).and_then(Option::as_mut) {
            c.origin = origin;
        }
    }

    /// What `origin`'s topics hold.
    pub fn usage(&self, origin: Origin) -> Usage {
        self.usage.get(origin as usize).copied().unwrap_or_default()
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

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

    fn interest_up(&mut self, pattern: &str) {
        if let Some(counts) = self.interest.as_mut() {
            let n = counts.entry(pattern.into()).or_default();
            *n += 1;
            if *n == 1 {
                self.interest_changes
                    .push(Interest::Added(pattern.to_owned()));
            }
        }
    }

    fn interest_down(&mut self, pattern: &str) {
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

    /// The epoch of topic `name`, if it has state.
    pub fn epoch_of(&self, name: &str) -> Option<&str> {
        self.topics.get(name).map(|t| t.head.epoch())
    }

    pub fn connect(&mut self, outbox: O) -> ConnId {
        let conn = Some(Conn {
            outbox,
            subs: Vec::new(),
            explicit: 0,
            seen: 0,
            origin: 0,
        });
        match self.free.pop() {
            Some(id) => {
                self.conns[id as usize] = conn;
                id
            }
            None => {
                self.conns.push(conn);
                (self.conns.len() - 1) as ConnId
            }
        }
    }

    /// Removes a connection and all its subscriptions, returning its outbox.
    pub fn disconnect(&mut self, id: ConnId) -> Option<O> {
        self.detach(id);
        let conn = self.conns.get_mut(id as usize)?.take()?;
        self.free.push(id);
        Some(conn.outbox)
    }

    /// Removes every subscription of a connection that is being closed, so that nothing more
    /// is delivered to it and no publisher waits for it, while its id stays taken until
    /// [`Engine::disconnect`].
    pub fn detach(&mut self, id: ConnId) {
        let Some(conn) = self.conns.get_mut(id as usize).and_then(Option::as_mut) else {
            return;
        };
        let subs = std::mem::take(&mut conn.subs);
        conn.explicit = 0;
        for sub in subs {
            self.index.remove(&sub.pattern, id);
            self.interest_down(&sub.pattern);
            self.subscriptions -= 1;
            self.lossless -= usize::from(sub.is_lossless());
        }
    }

    /// A connection's outbox, if it is connected.
    pub fn outbox(&self, id: ConnId) -> Option<&O> {
        self.conn(id).map(|c| &c.outbox)
    }

    /// Gives back the spare room of a connection's subscription list, once a burst of
    /// subscribes is over: grown by doubling, 100 subscriptions would keep room for 128, about
    /// a kilobyte per connection held for its whole life.
    pub fn trim(&mut self, id: ConnId) {
        let Some(conn) = self.conns.get_mut(id as usize).and_then(Option::as_mut) else {
            return;
        };
        if conn.subs.capacity() > conn.subs.len() {
            // Moved to a list of the exact size rather than `shrink_to_fit`: mimalloc keeps a
            // block shrunk by less than half where it is, whole.
            let mut exact = Vec::with_capacity(conn.subs.len());
            exact.append(&mut conn.subs);
            conn.subs = exact;
        }
    }

    pub fn connections(&self) -> impl Iterator<Item = &O> {
        self.conns.iter().flatten().map(|c| &c.outbox)
    }

    pub fn connection_count(&self) -> usize {
        self.conns.len() - self.free.len()
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
            Request::Unsubscribe { id, topic } => self.unsubscribe(conn, id, topic).map(|()| None),
            Request::Ping { id } => {
                self.reply(conn, &Reply::Pong { id });
                Ok(None)
            }
            Request::Credit {
                id,
                topic,
                n,
                bytes,
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
        match self.publish_by(p, origin, now_us) {
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

    /// Sends `reply` to one connection.
    pub fn reply(&self, conn: ConnId, reply: &Reply) {
        if let Some(c) = self.conn(conn) {
            c.outbox.reply(reply);
        }
    }

    fn conn(&self, id: ConnId) -> Option<&Conn<O>> {
        self.conns.get(id as usize).and_then(Option::as_ref)
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
        Ok(self.append(p, now_us, Numbering::Local, origin))
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
        let published = self.append(p, now_us, Numbering::Origin, 0);
        let at = self.publish_count;
        if let Some(state) = self.topics.get_mut(p.topic.as_str()) {
            state.remote_at = at;
        }
        Ok(RemotePublished { published, missed })
    }

    /// Tells the subscribers of `name` that were already listening when its previous remote
    /// message arrived (publish count `before`) that `missed` messages never came. Those who
    /// subscribed later did not miss them: this node was not following the topic meanwhile.
    fn notify_hole(&mut self, name: &str, missed: u64, before: u64) {
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
    fn check(&self, p: &Publish, origin: Origin) -> Result<(), ProtocolError> {
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
    /// each connection's slow-consumer policy.
    fn append(
        &mut self,
        p: &Publish,
        now_us: u64,
        numbering: Numbering,
        origin: Origin,
    ) -> Published {
        let config = &self.config;
        let state = self.topics.entry(config, &p.topic, numbering);
        if origin != 0 && state.owner == 0 && state.last_at == 0 {
            state.owner = origin;
            usage_of(&mut self.usage, origin).topics += 1;
        }
        state.prefetch_oldest();
        state.seq += 1;
        let seq = state.seq;
        self.publish_count += 1;
        let generation = self.publish_count;
        let mut matched = std::mem::take(&mut self.matched);
        self.index.for_each_match(&p.topic, |id| matched.push(id));
        let history = state.history_rule(config);
        if matched.is_empty() && !history.is_some_and(HistoryRule::keeps_messages) {
            // Nobody to send it to, no history to keep it in: a discard, whose message would be
            // needed only if someone asked for the last value. Kept as published instead.
            state.last = Some(Last::Unmade(Unmade::of(p, seq, now_us)));
            state.last_at = generation;
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
        matched.clear();
        self.matched = matched;
        for &id in &cut {
            self.detach(id);
        }
        Published {
            seq,
            deliveries,
            cut,
        }
    }

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
        if self.lossless == 0 || topic::validate_topic(topic_name).is_err() {
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

    fn policy_rule_for(&self, topic_name: &str) -> Option<usize> {
        topics::policy_rule(&self.config, topic_name)
    }

    /// `{"op":"credit"}`: the subscription `pattern` grants `n` more messages and `bytes` more
    /// payload bytes.
    fn credit(
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

    #[cfg(test)]
    fn topic_state(&mut self, name: &str) -> &mut topics::TopicState {
        self.topics.entry(&self.config, name, Numbering::Origin)
    }

    fn subscribe(&mut self, conn: ConnId, s: Subscribe, now_us: u64) -> Result<(), ProtocolError> {
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
        let Some(c) = self.conn(conn) else {
            return Ok(());
        };
        let already = c.subs.iter().any(|sub| *sub.pattern == *s.topic);
        let max = self.config.max_subscriptions_per_connection;
        if !already && c.subs.len() >= max {
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

        let recovery = self
            .recover(&s, now_us)
            .fit(|| self.conn(conn).map_or(0, |c| c.outbox.recovery_room()));

        let sub = Sub::new(&s, self.publish_count);
        self.lossless += usize::from(sub.is_lossless());
        let c = self.conns[conn as usize].as_mut().expect("checked above");
        c.explicit += usize::from(sub.is_explicit());
        match c.subs.iter_mut().find(|old| old.pattern == sub.pattern) {
            // Subscribing again to the same pattern replaces its options (but it has been
            // listening since the first time).
            Some(old) => {
                c.explicit -= usize::from(old.is_explicit());
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
            replayed: recovery.messages.len(),
            gaps: recovery.gaps,
            cursor: self.cursor(),
        };
        self.reply(conn, &reply);
        if let Some(c) = self.conn(conn) {
            recovery.messages.iter().for_each(|m| c.outbox.recovered(m));
        }
        Ok(())
    }

    fn unsubscribe(
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
        self.lossless -= usize::from(sub.is_lossless());
        self.index.remove(&pattern, conn);
        self.interest_down(&pattern);
        self.subscriptions -= 1;
        self.reply(conn, &Reply::Unsubscribed { id, topic: pattern });
        Ok(())
    }
}

/// Message `seq` of the numbering `head`, made of publish `p`, stamped `stamp_us` if asked.
/// A text payload is a slice of the frame that brought it, and is copied: keeping the slice
/// would keep the whole read buffer alive. A binary one is already a buffer of its own (the
/// frame reader copies small ones out, see `wire::client_frames::detached`), and is shared.
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
}

/// `origin`'s usage, made when first needed.
fn usage_of(usage: &mut Vec<Usage>, origin: Origin) -> &mut Usage {
    let at = origin as usize;
    if usage.len() <= at {
        usage.resize(at + 1, Usage::default());
    }
    &mut usage[at]
}

/// Brings what `state`'s owner is charged for it up to date with what it keeps now.
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
mod recovery;
mod sweep;
mod topics;

use topics::{Last, Numbering, Stored, TopicState, Topics, Unmade};
#[cfg(test)]
mod tests;
