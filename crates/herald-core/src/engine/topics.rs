//! The topics an engine holds: each one's numbering (epoch, seq), history and last value, and
//! the map that finds them by name.
//!
//! Every publish looks its topic up here once, so the table hashes with foldhash (like the
//! subscription index) and finds-or-creates in a single probe (`HashTable::entry`): std's
//! `HashMap` needs a second lookup to create on a miss without cloning the name on every hit.

use super::{ConnId, EngineConfig, HistoryRule};
use crate::extras::Extras;
use crate::index::SubscriptionIndex;
use crate::message::{Message, TopicHead};
use crate::mix::splitmix64;
use crate::prefetch::prefetch;
use crate::request::{PayloadKind, Publish};
use crate::topic;
use crate::wire::client_frames;
use bytes::Bytes;
use compact_str::CompactString;
use std::collections::{BTreeSet, VecDeque};
use std::hash::BuildHasher;
use std::ops::Bound;
use std::sync::Arc;

mod recency;
pub(super) use recency::Recency;

pub(super) struct Stored {
    pub seq: u64,
    pub at_us: u64,
    /// The engine's publish count when it was recorded: its place against a subscription's
    /// cursor.
    pub at: u64,
    pub message: Message,
}

/// A topic's last message, or, while nobody receives the topic and it keeps no history, the
/// message as it was published, in the topic's state: making a message nobody may ever ask for
/// (its allocation, its payload's copy) would be most of what the engine spends on such a
/// discard. It is made if a snapshot or the introspection asks.
pub(super) enum Last {
    Message(Message),
    Unmade(Unmade),
}

/// What making a message needs besides its topic's head (name and epoch).
pub(super) struct Unmade {
    pub seq: u64,
    pub stamp_us: Option<u64>,
    pub kind: PayloadKind,
    pub content_type: Option<Box<str>>,
    pub extras: Option<Arc<Extras>>,
    pub payload: KeptPayload,
}

impl Unmade {
    /// `p`, numbered `seq` and received at `now_us`, as the last value keeps it.
    pub fn of(p: &Publish, seq: u64, now_us: u64) -> Self {
        Unmade {
            seq,
            stamp_us: p.stamp.then_some(now_us),
            kind: p.kind,
            content_type: p.content_type.as_deref().map(Box::from),
            extras: p.extras.clone(),
            payload: KeptPayload::of(&p.payload),
        }
    }
}

/// Payloads up to this size are kept inside the topic's state: the Solace scenarios' 50 bytes
/// fit, and the state stays within mimalloc's 320-byte size class (asserted below).
const INLINE: usize = 54;

/// A payload kept after its request, never a slice of the read that brought it (a text
/// payload is a slice of its frame): one quiet topic would keep the whole read buffer alive.
/// A small one lives in the topic's state, so keeping it allocates nothing and letting the
/// previous one go frees nothing: a copy of its own would cost a discard an allocation and
/// the free of a previous copy that is cold by then.
pub(super) enum KeptPayload {
    Inline { len: u8, bytes: [u8; INLINE] },
    Detached(Bytes),
}

impl KeptPayload {
    fn of(payload: &Bytes) -> Self {
        match payload.len() {
            len @ ..=INLINE => {
                let mut bytes = [0; INLINE];
                bytes[..len].copy_from_slice(payload);
                KeptPayload::Inline {
                    len: len as u8,
                    bytes,
                }
            }
            _ => KeptPayload::Detached(client_frames::detached(payload)),
        }
    }

    pub fn len(&self) -> usize {
        match self {
            KeptPayload::Inline { len, .. } => *len as usize,
            KeptPayload::Detached(bytes) => bytes.len(),
        }
    }

    pub fn to_bytes(&self) -> Bytes {
        match self {
            KeptPayload::Inline { len, bytes } => Bytes::copy_from_slice(&bytes[..*len as usize]),
            KeptPayload::Detached(bytes) => bytes.clone(),
        }
    }
}

pub(super) struct TopicState {
    /// The name again, where a lookup compares it: inline up to 24 bytes, so that finding a
    /// topic reads its state and no other allocation.
    key: CompactString,
    /// The name, shared with every queued delivery of this topic.
    pub name: Arc<str>,
    /// Index into `EngineConfig::policy`: the topic's default slow-consumer policy (32 bits:
    /// the state stays in its size class).
    policy_rule: Option<u32>,
    /// Who created the topic, charged for it (see [`super::Origin`]); 0: nobody.
    pub owner: super::Origin,
    /// The bytes the owner is charged for the topic now (see [`TopicState::retained`]).
    pub charged: u32,
    pub seq: u64,
    /// Its name and epoch, shared by the messages of this numbering.
    pub head: Arc<TopicHead>,
    /// Index into `EngineConfig::history`, or `None` for last-value only (32 bits: the state
    /// stays in its size class).
    rule: Option<u32>,
    pub history: VecDeque<Stored>,
    pub history_bytes: usize,
    /// The last message while `history` does not hold it: a topic that keeps no history, or
    /// whose history emptied with age. While the history holds messages its newest is the last
    /// value and this is `None`: a second reference would cost every publish a count on the
    /// previous message, out of the cache by then, and keep that message shared, so that
    /// [`TopicState::record`] could not let its encodings go.
    pub last: Option<Last>,
    /// The epoch was adopted from another node's message (see `Engine::publish_remote`): a
    /// local publish must start an epoch of its own rather than reuse the origin's numbers.
    pub foreign: bool,
    /// The publish count when the last message from another node was recorded.
    pub remote_at: u64,
    /// The publish count of the newest message (0 before the first), set by [`Recency::stamp`]
    /// only, which keeps the topics in its order.
    last_at: u64,
    /// The topic's place in [`Recency`].
    slot: u32,
    /// When the newest message arrived (µs since the UNIX epoch; 0 before the first): a topic
    /// quiet for long with no subscriber is forgotten.
    pub last_us: u64,
    /// The publish count of the newest message that `history` no longer holds (or never
    /// held): a recovery from a cursor older than this cannot be answered in full.
    pub dropped_at: u64,
    /// Where the bytes of the oldest message in `history` start, noted when it became the
    /// oldest (0 when there is none): only ever prefetched, never read (see
    /// [`TopicState::prefetch_history`]).
    pub oldest_bytes: usize,
    /// The subscription index's matches for this topic as it last gave them, while there are
    /// at most [`MATCHES_KEPT`] (see [`TopicState::find_matches`]).
    matches: Vec<ConnId>,
    /// The index's version `matches` hold for; 0: none.
    matches_of: u64,
}

/// How many matches a topic keeps. Finding a topic's subscribers walks the index (a hash lookup
/// per level, then the matched node's key list): on a large index, several cache misses a
/// publish, paid again on every publish although subscriptions rarely change. Kept on the
/// topic, whose state the publish reads anyway, they cost a copy of a few words and no miss. A
/// topic with a larger fan-out walks every time: the walk is a small part of its deliveries,
/// and a list per topic of every subscriber of a broad pattern would grow with topics ×
/// subscribers.
const MATCHES_KEPT: usize = 16;

impl TopicState {
    /// Puts into `found` (emptied first) the entries of `index` whose pattern matches this
    /// topic, as [`SubscriptionIndex::for_each_match`] gives them: from the state, which keeps
    /// them (up to [`MATCHES_KEPT`]) until the index changes, or from a walk.
    pub fn find_matches(&mut self, index: &SubscriptionIndex<ConnId>, found: &mut Vec<ConnId>) {
        found.clear();
        if self.matches_of == index.version() {
            found.extend_from_slice(&self.matches);
            return;
        }
        index.for_each_match(&self.name, |id| found.push(id));
        self.matches.clear();
        if found.len() > MATCHES_KEPT {
            self.matches.shrink_to_fit();
            self.matches_of = 0;
        } else {
            self.matches.extend_from_slice(found);
            self.matches_of = index.version();
        }
    }

    /// The publish count of the newest message (0 before the first).
    #[inline]
    pub fn last_at(&self) -> u64 {
        self.last_at
    }

    /// The topic's default policy rule, if any.
    #[inline]
    pub fn policy_rule(&self) -> Option<usize> {
        self.policy_rule.map(|i| i as usize)
    }

    /// Whether the topic has a last value.
    pub fn has_last(&self) -> bool {
        self.last.is_some() || !self.history.is_empty()
    }

    /// The bytes the topic keeps: its history, or its last value when it keeps no history
    /// (the last value is the history's newest message otherwise).
    #[inline]
    pub fn retained(&self) -> usize {
        if !self.history.is_empty() {
            return self.history_bytes;
        }
        match &self.last {
            Some(Last::Message(m)) => m.size(),
            Some(Last::Unmade(m)) => m.payload.len(),
            None => 0,
        }
    }

    /// The history rule the topic is kept under, if any.
    #[inline]
    pub fn history_rule<'a>(&self, config: &'a EngineConfig) -> Option<&'a HistoryRule> {
        self.rule.map(|i| &config.history[i as usize])
    }

    /// Starts over under `epoch`: what is held belongs to another numbering.
    pub fn restart(&mut self, epoch: String, seq: u64, foreign: bool) {
        // The last message keeps the numbering it was published under.
        self.last = self.last_message().map(Last::Message);
        self.dropped_at = self.last_at;
        self.head = TopicHead::new(self.name.clone(), epoch);
        self.seq = seq;
        self.foreign = foreign;
        self.history.clear();
        self.history_bytes = 0;
        self.note_oldest();
    }

    /// Notes where the oldest message's bytes are, for [`TopicState::prefetch_history`].
    fn note_oldest(&mut self) {
        self.oldest_bytes = self
            .history
            .front()
            .map_or(0, |s| s.message.payload().as_ptr().addr());
    }

    /// Starts loading what recording the next message will touch, all of it last touched by
    /// earlier publishes of this topic and so out of the cache: the newest message (whose count
    /// [`TopicState::record`] checks, and whose encodings it lets go), the oldest entry (read
    /// to evict it), the one after it (the next oldest, whose bytes are noted), the oldest
    /// message (whose count releasing it writes to) and the first line of its payload, which
    /// freeing it writes to. (The payload's reference count, in a block of `Bytes`' own, cannot
    /// be reached from here.) Each is a cache miss otherwise, one waiting for the other; issued
    /// when the topic is found, they overlap with the rest of the publish.
    #[inline]
    pub fn prefetch_history(&self) {
        let (Some(oldest), Some(newest)) = (self.history.front(), self.history.back()) else {
            return;
        };
        // The entries first, from their addresses alone: the messages' addresses are in them,
        // and asked for together their misses overlap rather than follow each other.
        prefetch(oldest, size_of::<Stored>());
        prefetch(newest, size_of::<Stored>());
        if let Some(next) = self.history.get(1) {
            prefetch(next, size_of::<Stored>());
        }
        prefetch(self.oldest_bytes as *const u8, 1);
        newest.message.prefetch();
        oldest.message.prefetch();
    }

    /// The last message, made now if it was kept as published.
    pub fn last_message(&self) -> Option<Message> {
        if let Some(newest) = self.history.back() {
            return Some(newest.message.clone());
        }
        match self.last.as_ref()? {
            Last::Message(m) => Some(m.clone()),
            Last::Unmade(m) => Some(
                Message::new(
                    self.head.clone(),
                    m.seq,
                    m.kind,
                    m.payload.to_bytes(),
                    m.content_type.clone(),
                    m.stamp_us,
                )
                .with_extras(m.extras.clone()),
            ),
        }
    }

    pub fn trim_by_age(&mut self, rule: &HistoryRule, now_us: u64) {
        let max_age_us = rule.max_age_secs.saturating_mul(1_000_000);
        while let Some(oldest) = self.history.front() {
            if now_us.saturating_sub(oldest.at_us) <= max_age_us {
                break;
            }
            self.dropped_at = self.dropped_at.max(oldest.at);
            self.history_bytes -= oldest.message.size();
            let oldest = self.history.pop_front().expect("the front was just read");
            if self.history.is_empty() {
                // The newest goes from the history, not from the topic: it stays the last value.
                self.last = Some(Last::Message(oldest.message));
            }
        }
        self.note_oldest();
    }

    /// Records `stored`, the topic's newest message, whose publish was stamped first (see
    /// [`Recency::stamp`]).
    ///
    /// The message it follows lets its encodings go if nothing else holds it (every queue has
    /// sent it): they are about a third of a small message's memory, and only a recovery needs
    /// them again, which encodes anew. The next message's frame then reuses the block just
    /// freed rather than memory the process has yet to touch.
    pub fn record(&mut self, rule: Option<&HistoryRule>, stored: Stored) {
        self.last_us = self.last_us.max(stored.at_us);
        let Some(rule) = rule.filter(|r| r.keeps_messages()) else {
            self.dropped_at = self.last_at;
            self.last = Some(Last::Message(stored.message));
            return;
        };
        self.last = None;
        if let Some(newest) = self.history.back_mut() {
            newest.message.forget_encodings();
        }
        // The oldest go before the newest is added: it then takes the slot just freed, which
        // is in the cache, where adding first would write a slot untouched since it was last
        // used (`max_messages` publishes ago on this topic).
        let len = stored.message.size();
        while let Some(oldest) = self.history.front() {
            if self.history.len() < rule.max_messages && self.history_bytes + len <= rule.max_bytes
            {
                break;
            }
            self.dropped_at = self.dropped_at.max(oldest.at);
            self.history_bytes -= oldest.message.size();
            self.history.pop_front();
        }
        self.history_bytes += len;
        self.history.push_back(stored);
        self.note_oldest();
    }
}

/// Who gives a message its sequence number.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Numbering {
    /// This node: it was published here.
    Local,
    /// The node it was published on, whose `(epoch, seq)` this node keeps.
    Origin,
}

/// Each topic's state is boxed, out of the table, and holds the topic's name: a bucket is one
/// pointer, so the table for 100,000 topics is 1 MB (and 128 KB of control bytes). Inline, the
/// state would make every bucket 248 bytes (30 MB: two misses a lookup); with the name as a map
/// key beside the state's box a bucket is 24 bytes, and loading it is most of a discard's
/// lookup (perf, the filtering load). One pointer a bucket is the cheapest of the three.
type TopicMap = hashbrown::HashTable<Box<TopicState>>;
/// The size class the states are allocated in (see [`INLINE`]).
const _: () = assert!(std::mem::size_of::<TopicState>() <= 320);

/// Topic states by name, and what gives each new numbering its epoch.
pub(super) struct Topics {
    map: TopicMap,
    /// Every topic's name in order, so that a pattern's topics are found by walking the names
    /// under its literal prefix rather than every topic (snapshots, recovery, listing).
    names: BTreeSet<Arc<str>>,
    /// Every topic in the order it was last published (a recovery from a cursor).
    recency: Recency,
    hasher: foldhash::fast::RandomState,
    /// Makes epochs differ between runs (the server passes a random number; tests a fixed one).
    epoch_seed: u64,
    /// Names this engine among others (and its earlier runs) in a subscription cursor.
    instance: String,
    /// Epochs handed out so far.
    epochs: u64,
}

impl Topics {
    pub fn new(epoch_seed: u64) -> Self {
        Topics {
            map: TopicMap::new(),
            names: BTreeSet::new(),
            recency: Recency::new(),
            hasher: foldhash::fast::RandomState::default(),
            epoch_seed,
            instance: format!("{:08x}", splitmix64(!epoch_seed) >> 32),
            epochs: 0,
        }
    }

    /// The state of topic `name`, created (with a fresh epoch) on first use. For a message this
    /// node numbers, a topic numbered by another node until now starts an epoch of its own.
    pub fn entry(
        &mut self,
        config: &EngineConfig,
        name: &str,
        numbering: Numbering,
    ) -> &mut TopicState {
        self.recording(config, name, numbering).0
    }

    /// [`Topics::entry`], for recording a message: with the order its publish is stamped in
    /// ([`Recency::stamp`]).
    pub fn recording(
        &mut self,
        config: &EngineConfig,
        name: &str,
        numbering: Numbering,
    ) -> (&mut TopicState, &mut Recency) {
        let Topics {
            map,
            names,
            recency,
            hasher,
            epoch_seed,
            epochs,
            ..
        } = self;
        let mut next_epoch = || {
            *epochs += 1;
            new_epoch(*epoch_seed, *epochs)
        };
        let (hash, named) = probe(hasher, name);
        let entry = map.entry(hash, named, |s| hasher.hash_one(s.key.as_str()));
        let state = entry.or_insert_with(|| {
            let shared: Arc<str> = name.into();
            let state = TopicState {
                key: name.into(),
                head: TopicHead::new(shared.clone(), next_epoch()),
                slot: recency.add(shared.clone()),
                name: shared,
                policy_rule: policy_rule(config, name).map(|i| i as u32),
                owner: 0,
                charged: 0,
                seq: 0,
                rule: config
                    .history
                    .iter()
                    .position(|r| topic::matches(&r.pattern, name))
                    .map(|i| i as u32),
                history: VecDeque::new(),
                history_bytes: 0,
                last: None,
                foreign: false,
                remote_at: 0,
                last_at: 0,
                last_us: 0,
                dropped_at: 0,
                oldest_bytes: 0,
                matches: Vec::new(),
                matches_of: 0,
            };
            names.insert(state.name.clone());
            Box::new(state)
        });
        let state = state.into_mut();
        if numbering == Numbering::Local && state.foreign {
            state.restart(next_epoch(), 0, false);
        }
        (state, recency)
    }

    pub fn get(&self, name: &str) -> Option<&TopicState> {
        let (hash, named) = probe(&self.hasher, name);
        self.map.find(hash, named).map(|s| &**s)
    }

    pub fn get_mut(&mut self, name: &str) -> Option<&mut TopicState> {
        let (hash, named) = probe(&self.hasher, name);
        self.map.find_mut(hash, named).map(|s| &mut **s)
    }

    pub fn remove(&mut self, name: &str) {
        let (hash, named) = probe(&self.hasher, name);
        if let Ok(found) = self.map.find_entry(hash, named) {
            let (state, _) = found.remove();
            self.names.remove(name);
            self.recency.remove(state.slot);
        }
    }

    /// The topics published after publish count `cursor`, the most recently published first:
    /// what it costs is what it finds (and one topic more).
    pub fn published_after(&self, cursor: u64) -> impl Iterator<Item = &TopicState> + '_ {
        self.recency
            .newest_first()
            .filter_map(|name| self.get(name))
            .take_while(move |t| t.last_at > cursor)
    }

    /// The topics `pattern` matches, in name order (see [`Topics::walk`]).
    pub fn matching(&self, pattern: &str) -> Vec<&TopicState> {
        let mut found = Vec::new();
        self.walk(pattern, "", usize::MAX, |t| {
            found.push(t);
            true
        });
        found
    }

    /// Hands `visit` the topics `pattern` matches whose names are not before `from`, in name
    /// order, for at most `budget` steps (a seek or a topic found, each), or until `visit` says
    /// no (it is handed that topic again when the walk goes on); returns where to go on (every
    /// name before it was looked at) if the walk stopped before its end.
    ///
    /// Walks the ordered names level by level: a literal level narrows the range, a trailing
    /// `>` takes the rest of it, and `*` steps from one distinct level to the next, a seek
    /// each. So the cost is what it finds plus one seek per distinct level a `*` stands for:
    /// `a/b/>` looks only at `a/b/…`, and `*/x` at one name per first level, never at every
    /// topic. A `*` takes a level's own topic where the name `…/level` sorts and its subtree
    /// where `…/level/` sorts (between them may lie `…/level!…`), so that what it finds comes
    /// in name order and a walk can stop anywhere and go on later from a name.
    pub fn walk<'a>(
        &'a self,
        pattern: &str,
        from: &str,
        budget: usize,
        visit: impl FnMut(&'a TopicState) -> bool,
    ) -> Option<String> {
        let levels: Vec<&str> = pattern.split('/').collect();
        let mut walk = Walk {
            topics: self,
            from,
            budget,
            stopped: None,
            visit,
        };
        walk.levels(&mut String::new(), &levels);
        walk.stopped
    }

    /// Names after `after` (all, when `None`) that start with `prefix`, in order, at most
    /// `limit`: a page of the topic list.
    pub fn page<'a>(
        &'a self,
        prefix: &'a str,
        after: Option<&'a str>,
        limit: usize,
    ) -> impl Iterator<Item = &'a TopicState> + 'a {
        let from = match after {
            Some(after) if after >= prefix => Bound::Excluded(after),
            _ => Bound::Included(prefix),
        };
        self.names
            .range::<str, _>((from, Bound::Unbounded))
            .take_while(move |name| name.starts_with(prefix))
            .filter_map(|name| self.get(name))
            .take(limit)
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn instance(&self) -> &str {
        &self.instance
    }

    pub fn iter(&self) -> impl Iterator<Item = &TopicState> {
        self.map.iter().map(|state| &**state)
    }
}

/// One [`Topics::walk`] under way.
struct Walk<'a, 'f, F> {
    topics: &'a Topics,
    from: &'f str,
    budget: usize,
    /// Where the walk goes on, once the budget ran out.
    stopped: Option<String>,
    visit: F,
}

impl<'a, F: FnMut(&'a TopicState) -> bool> Walk<'a, '_, F> {
    /// Takes one step of the budget, or stops the walk at `at` (every name before it looked
    /// at) when none is left. Never where it started: each walk makes progress.
    fn step(&mut self, at: &str) -> bool {
        if self.budget == 0 && at > self.from {
            self.stopped = Some(at.to_owned());
            return false;
        }
        self.budget = self.budget.saturating_sub(1);
        true
    }

    /// Hands topic `name` (if held) to the visitor; false when the visitor stopped the walk.
    fn found(&mut self, name: &str) -> bool {
        let Some(t) = self.topics.get(name) else {
            return true;
        };
        if (self.visit)(t) {
            return true;
        }
        self.stopped = Some(name.to_owned());
        false
    }

    /// The first name a walk under `prefix` looks at: neither before the prefix nor before
    /// `from`.
    fn start(&self, prefix: &str) -> String {
        prefix.max(self.from).to_owned()
    }

    /// The first name at or after `at`, if it starts with `prefix`.
    fn next(&self, at: &str, prefix: &str) -> Option<&'a str> {
        let name = self
            .topics
            .names
            .range::<str, _>((Bound::Included(at), Bound::Unbounded))
            .next()?;
        name.starts_with(prefix).then_some(&**name)
    }

    /// The topics under `prefix` (empty, or ending in `/`) that the remaining `levels` match.
    fn levels(&mut self, prefix: &mut String, levels: &[&str]) {
        let Some((&level, rest)) = levels.split_first() else {
            return;
        };
        let at = prefix.len();
        match level {
            ">" if rest.is_empty() => {
                let start = self.start(prefix);
                let topics = self.topics;
                let under = topics
                    .names
                    .range::<str, _>((Bound::Included(start.as_str()), Bound::Unbounded))
                    .take_while(|name| name.starts_with(prefix.as_str()));
                for name in under {
                    if !self.step(name) || !self.found(name) {
                        return;
                    }
                }
            }
            "*" => {
                let mut cursor = self.start(prefix);
                loop {
                    if !self.step(&cursor) {
                        return;
                    }
                    let Some(name) = self.next(&cursor, prefix) else {
                        break;
                    };
                    let level = name[at..].split('/').next().unwrap_or_default();
                    let end = at + level.len();
                    cursor.clear();
                    if name.len() == end {
                        // The level's own topic.
                        if rest.is_empty() && !self.found(name) {
                            return;
                        }
                        // Next: the first name after it.
                        cursor.push_str(name);
                        cursor.push('\0');
                    } else {
                        // The level's subtree, `…/level/…`.
                        if !rest.is_empty() {
                            prefix.push_str(level);
                            self.descend(prefix, rest);
                            prefix.truncate(at);
                            if self.stopped.is_some() {
                                return;
                            }
                        }
                        // Next: the first name past the subtree (`…/level0`).
                        cursor.push_str(&name[..end]);
                        cursor.push('0');
                    }
                }
            }
            literal => {
                prefix.push_str(literal);
                self.descend(prefix, rest);
                prefix.truncate(at);
            }
        }
    }

    /// `prefix` names a level: the topic itself when no levels remain, else what lies below.
    fn descend(&mut self, prefix: &mut String, rest: &[&str]) {
        if rest.is_empty() {
            if prefix.as_str() >= self.from && self.step(prefix) {
                self.found(prefix);
            }
        } else {
            prefix.push('/');
            self.levels(prefix, rest);
            prefix.pop();
        }
    }
}

/// Where the table looks for topic `name`: its hash, and the test of a state found there.
fn probe<'a>(
    hasher: &foldhash::fast::RandomState,
    name: &'a str,
) -> (u64, impl Fn(&Box<TopicState>) -> bool + 'a) {
    (hasher.hash_one(name), move |s| s.key == name)
}

/// The epoch of the `n`th numbering an engine started.
fn new_epoch(epoch_seed: u64, n: u64) -> String {
    format!("{:012x}", splitmix64(epoch_seed ^ n) >> 16)
}

/// The first configured policy rule that matches `name`.
pub(super) fn policy_rule(config: &EngineConfig, name: &str) -> Option<usize> {
    config
        .policy
        .iter()
        .position(|r| topic::matches(&r.pattern, name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::MESSAGE_OVERHEAD;
    use bytes::Bytes;

    fn record(state: &mut TopicState, rule: &HistoryRule, seq: u64, payload_len: usize) {
        let message = Message::new(
            state.head.clone(),
            seq,
            PayloadKind::Binary,
            Bytes::from(vec![0; payload_len]),
            None,
            None,
        );
        state.record(
            Some(rule),
            Stored {
                seq,
                at_us: seq,
                at: seq,
                message,
            },
        );
    }

    fn held(state: &TopicState) -> Vec<u64> {
        state.history.iter().map(|s| s.seq).collect()
    }

    #[test]
    fn history_keeps_the_newest_that_fit_and_always_the_last() {
        let mut topics = Topics::new(1);
        let s = topics.entry(&EngineConfig::default(), "t", Numbering::Local);
        // What a message counts besides its payload: topic, epoch, overhead.
        let o = 1 + s.head.epoch().len() + MESSAGE_OVERHEAD;
        let rule = HistoryRule {
            pattern: ">".into(),
            max_messages: 3,
            max_bytes: 10 + 2 * 40 + 3 * o,
            max_age_secs: 300,
        };
        // Messages of 10 bytes of payload: the count binds.
        for seq in 1..=5 {
            record(s, &rule, seq, 10);
        }
        assert_eq!(held(s), [3, 4, 5]);
        assert_eq!(s.history_bytes, 3 * (10 + o));
        // Of 40 bytes, two fit beside each other, three do not: the oldest go until the new one fits.
        record(s, &rule, 6, 40);
        record(s, &rule, 7, 40);
        assert_eq!(held(s), [5, 6, 7]);
        record(s, &rule, 8, 40);
        assert_eq!(held(s), [7, 8]);
        assert_eq!(s.history_bytes, 2 * (40 + o));
        // A message larger than the whole budget stays alone: the last message is always kept.
        record(s, &rule, 9, 400);
        assert_eq!(held(s), [9]);
        assert_eq!(s.history_bytes, 400 + o);
        record(s, &rule, 10, 10);
        assert_eq!(held(s), [10]);
        assert_eq!(
            s.oldest_bytes,
            s.history[0].message.payload().as_ptr().addr()
        );
        assert_eq!(s.last_message().map(|m| m.seq()), Some(10));
    }

    /// The table is keyed by the name each state holds: every topic is found by its own name
    /// after the table has grown many times over, names longer than the inline 24 bytes
    /// included, and removing one leaves the others.
    #[test]
    fn topics_are_found_by_name_through_growth_and_removal() {
        let config = EngineConfig::default();
        let mut topics = Topics::new(1);
        let name = |i: usize| format!("t/{i}/{}", "x".repeat(i % 40));
        for i in 0..5_000 {
            topics.entry(&config, &name(i), Numbering::Local).seq = i as u64;
        }
        assert_eq!(topics.len(), 5_000);
        topics.remove(&name(7));
        topics.remove("never/made");
        assert_eq!(topics.len(), 4_999);
        assert!(topics.get(&name(7)).is_none());
        for i in (0..5_000).filter(|&i| i != 7) {
            let state = topics.get(&name(i)).expect("every other topic stays");
            assert_eq!((&*state.name, state.seq), (name(i).as_str(), i as u64));
        }
        // Found again, not made again: the numbering goes on.
        assert_eq!(topics.entry(&config, &name(9), Numbering::Local).seq, 9);
        assert_eq!(topics.len(), 4_999);
    }
}
