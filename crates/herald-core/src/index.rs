//! The subscription index: given a published topic, find every subscription whose pattern
//! matches it. This runs once per published message, so it is the router's hot path.
//!
//! It is a trie over levels, in the manner of uWebSockets' `TopicTree`. A lookup walks the topic
//! level by level and, at each node, follows at most two edges: the literal child named like the
//! level, and the `*` child. Keys subscribed with a trailing `>` are stored at the node *before*
//! the `>`, so they are emitted as soon as the walk passes that node with a level still to come.
//! The cost of a lookup therefore depends on the topic's depth and on how many `*` branches the
//! subscriptions create, not on the number of subscriptions, and a topic nobody subscribed to is
//! rejected after a hash lookup or two.
//!
//! Inputs are assumed valid (see [`crate::topic`]); validation happens once, at the edge.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::iter::Peekable;
use std::str::Split;

/// The hash map for literal children. foldhash rather than std's SipHash: lookups hash every
/// level of every published topic, and foldhash roughly halved the cost of a miss in the
/// bench. Its per-process random seed keeps it "minimally DoS-resistant", which matters
/// because both patterns and topics come from the network.
type LevelMap<V> = HashMap<Level, V, foldhash::fast::RandomState>;

/// A set of `(pattern, key)` subscriptions, searchable by topic.
///
/// `K` is whatever identifies a subscriber to the caller (a connection id, a slot index); it is
/// copied out on every match, so it should be small.
///
/// ```
/// use herald_core::index::SubscriptionIndex;
///
/// let mut ix = SubscriptionIndex::new();
/// ix.insert("quotes/fx/EURUSD", 1u32);
/// ix.insert("quotes/*/EURUSD", 2);
/// ix.insert("quotes/>", 3);
/// ix.insert("quotes/>", 1); // key 1 now holds two patterns that overlap
///
/// let mut keys = Vec::new();
/// ix.for_each_match("quotes/fx/EURUSD", |k| keys.push(k));
/// keys.sort();
/// assert_eq!(keys, [1, 1, 2, 3]); // the caller dedupes per key
///
/// assert!(ix.remove("quotes/>", 3));
/// assert_eq!(ix.len(), 3);
/// ```
#[derive(Debug, Clone)]
pub struct SubscriptionIndex<K> {
    root: Node<K>,
    len: usize,
    /// Changes with every entry added or removed (see [`SubscriptionIndex::version`]).
    version: u64,
}

/// One trie node: the path from the root to it is a pattern prefix.
#[derive(Debug, Clone)]
struct Node<K> {
    /// Children for literal levels, looked up with the bytes of the topic's level, so a lookup
    /// never allocates.
    literal: LevelMap<Node<K>>,
    /// The child for a `*` level. Boxed: most nodes have none, and a `Node` is ~100 bytes.
    star: Option<Box<Node<K>>>,
    /// Keys whose pattern ends exactly at this node.
    here: Vec<K>,
    /// Keys whose pattern is this node's path followed by `>`.
    rest: Vec<K>,
}

impl<K> Default for Node<K> {
    fn default() -> Self {
        Node {
            literal: LevelMap::default(),
            star: None,
            here: Vec::new(),
            rest: Vec::new(),
        }
    }
}

impl<K> Node<K> {
    /// A node that holds no key and leads to none can be dropped from its parent.
    fn is_empty(&self) -> bool {
        self.here.is_empty()
            && self.rest.is_empty()
            && self.star.is_none()
            && self.literal.is_empty()
    }
}

impl<K> Default for SubscriptionIndex<K> {
    fn default() -> Self {
        SubscriptionIndex {
            root: Node::default(),
            len: 0,
            version: 1,
        }
    }
}

impl<K: Copy + Eq> SubscriptionIndex<K> {
    /// An empty index. Allocates nothing until the first insert.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `key` under `pattern`. Returns false, changing nothing, if that exact pair is
    /// already present (the same key may hold any number of *different* patterns).
    ///
    /// Checking for the duplicate is linear in the number of keys on that one pattern.
    pub fn insert(&mut self, pattern: &str, key: K) -> bool {
        debug_assert!(
            crate::topic::validate_pattern(pattern).is_ok(),
            "invalid pattern {pattern:?}"
        );
        let mut levels = pattern.split('/').peekable();
        let mut node = &mut self.root;
        let keys = loop {
            match levels.next() {
                None => break &mut node.here,
                Some(">") if levels.peek().is_none() => break &mut node.rest,
                Some("*") => node = node.star.get_or_insert_with(Default::default),
                Some(level) => {
                    // Check first so that an existing level costs no allocation.
                    if !node.literal.contains_key(level.as_bytes()) {
                        node.literal.insert(Level::new(level), Node::default());
                    }
                    node = node
                        .literal
                        .get_mut(level.as_bytes())
                        .expect("just inserted");
                }
            }
        };
        if keys.contains(&key) {
            return false;
        }
        keys.push(key);
        self.len += 1;
        self.version += 1;
        true
    }

    /// Removes `key` from `pattern`. Returns false if that pair was not present.
    ///
    /// Nodes left holding nothing are dropped, and oversized tables shrink, so an index that
    /// sees endless subscribe/unsubscribe churn stays the size of what is subscribed now.
    pub fn remove(&mut self, pattern: &str, key: K) -> bool {
        debug_assert!(
            crate::topic::validate_pattern(pattern).is_ok(),
            "invalid pattern {pattern:?}"
        );
        let removed = remove_in(&mut self.root, pattern.split('/').peekable(), key);
        if removed {
            self.len -= 1;
            self.version += 1;
        }
        removed
    }

    /// Calls `f` once for every `(pattern, key)` entry whose pattern matches `topic`.
    ///
    /// A key that holds two patterns matching the same topic (`a/*` and `a/>`) is passed twice:
    /// deduplicating needs per-key state that only the caller has. The order is unspecified.
    /// Allocates nothing.
    pub fn for_each_match(&self, topic: &str, mut f: impl FnMut(K)) {
        debug_assert!(
            crate::topic::validate_topic(topic).is_ok(),
            "invalid topic {topic:?}"
        );
        walk(&self.root, levels(topic), &mut f);
    }

    /// The number of `(pattern, key)` entries.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if there are no entries.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A number that changes whenever an entry is added or removed, and never goes back to one
    /// it had (it starts at 1, so 0 can stand for "never"): what [`Self::for_each_match`]
    /// gave for a topic under one version holds for as long as the version stays the same,
    /// so a caller may keep the result instead of walking again.
    pub fn version(&self) -> u64 {
        self.version
    }
}

/// The lookup. Follows the literal edge in a loop and recurses only into `*` edges, so a topic
/// without wildcard subscriptions on its path costs no recursion at all.
/// A topic's levels as bytes, split by comparing bytes: std's `str::split('/')` searches with
/// `memchr` machinery that costs more than the few bytes of a level.
fn levels(topic: &str) -> Levels<'_> {
    Levels {
        rest: Some(topic.as_bytes()),
    }
}

#[derive(Clone)]
struct Levels<'a> {
    /// What is left to split; `None` once the last level was given.
    rest: Option<&'a [u8]>,
}

impl<'a> Iterator for Levels<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        let rest = self.rest?;
        match rest.iter().position(|&b| b == b'/') {
            Some(at) => {
                self.rest = Some(&rest[at + 1..]);
                Some(&rest[..at])
            }
            None => {
                self.rest = None;
                Some(rest)
            }
        }
    }
}

fn walk<K: Copy, F: FnMut(K)>(mut node: &Node<K>, mut levels: Levels<'_>, f: &mut F) {
    loop {
        let Some(level) = levels.next() else {
            node.here.iter().for_each(|&k| f(k));
            return;
        };
        // At least one level remains (this one), which is what `>` asks for.
        node.rest.iter().for_each(|&k| f(k));
        if let Some(star) = &node.star {
            walk(star, levels.clone(), f);
        }
        match node.literal.get(level) {
            Some(child) => node = child,
            None => return,
        }
    }
}

/// A literal level as a map key. Levels up to 22 bytes (nearly all of them in practice) are
/// stored inside the key itself, so confirming a hash hit reads no second allocation: on a
/// large index every level of a lookup would otherwise cost one more cache miss.
#[derive(Clone)]
enum Level {
    Inline { len: u8, bytes: [u8; Level::INLINE] },
    Heap(Box<[u8]>),
}

impl Level {
    /// 22 bytes keep the enum at 24 bytes, the size of the `Heap` variant plus its tag.
    const INLINE: usize = 22;

    fn new(level: &str) -> Self {
        let src = level.as_bytes();
        if src.len() <= Self::INLINE {
            let mut bytes = [0; Self::INLINE];
            bytes[..src.len()].copy_from_slice(src);
            Level::Inline {
                len: src.len() as u8,
                bytes,
            }
        } else {
            Level::Heap(src.into())
        }
    }

    fn as_bytes(&self) -> &[u8] {
        match self {
            Level::Inline { len, bytes } => &bytes[..usize::from(*len)],
            Level::Heap(b) => b,
        }
    }
}

// Hash, Eq and Borrow all go through `as_bytes`, as `Borrow` requires, so a map keyed by
// `Level` can be searched with a plain `&[u8]`.
impl Hash for Level {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_bytes().hash(state);
    }
}

impl PartialEq for Level {
    fn eq(&self, other: &Self) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for Level {}

impl Borrow<[u8]> for Level {
    fn borrow(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl std::fmt::Debug for Level {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", String::from_utf8_lossy(self.as_bytes()))
    }
}

/// Removes `key` from the pattern spelled by `levels` below `node`, pruning on the way back up.
/// Recursion depth is bounded by the pattern's level count (at most 128).
fn remove_in<K: Eq>(node: &mut Node<K>, mut levels: Peekable<Split<'_, char>>, key: K) -> bool {
    match levels.next() {
        None => remove_key(&mut node.here, key),
        Some(">") if levels.peek().is_none() => remove_key(&mut node.rest, key),
        Some("*") => {
            let Some(child) = node.star.as_deref_mut() else {
                return false;
            };
            let removed = remove_in(child, levels, key);
            if removed && child.is_empty() {
                node.star = None;
            }
            removed
        }
        Some(level) => {
            let Some(child) = node.literal.get_mut(level.as_bytes()) else {
                return false;
            };
            let removed = remove_in(child, levels, key);
            if removed && child.is_empty() {
                node.literal.remove(level.as_bytes());
                shrink_map(&mut node.literal);
            }
            removed
        }
    }
}

/// Removes one occurrence of `key`. Order within a key list does not matter, so `swap_remove`.
fn remove_key<K: Eq>(keys: &mut Vec<K>, key: K) -> bool {
    let Some(i) = keys.iter().position(|k| *k == key) else {
        return false;
    };
    keys.swap_remove(i);
    // A topic that once had 10,000 subscribers should not keep their slots forever. Shrinking
    // only at a quarter full keeps the cost amortised: a list never shrinks twice in a row
    // without losing three quarters of its keys in between.
    if keys.is_empty() {
        *keys = Vec::new();
    } else if keys.capacity() >= 16 && keys.len() * 4 <= keys.capacity() {
        keys.shrink_to(keys.len() * 2);
    }
    true
}

/// Same policy as [`remove_key`] for a node's literal children.
fn shrink_map<V>(map: &mut LevelMap<V>) {
    if map.is_empty() {
        *map = LevelMap::default();
    } else if map.capacity() >= 16 && map.len() * 4 <= map.capacity() {
        map.shrink_to(map.len() * 2);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matches_of(ix: &SubscriptionIndex<u32>, topic: &str) -> Vec<u32> {
        let mut v = Vec::new();
        ix.for_each_match(topic, |k| v.push(k));
        v.sort_unstable();
        v
    }

    /// Total nodes in the trie, root included.
    fn node_count<K>(node: &Node<K>) -> usize {
        1 + node.literal.values().map(node_count).sum::<usize>()
            + node.star.as_deref().map_or(0, node_count)
    }

    #[test]
    fn empty_index_matches_nothing() {
        let ix = SubscriptionIndex::<u32>::new();
        assert!(ix.is_empty());
        assert_eq!(ix.len(), 0);
        assert_eq!(matches_of(&ix, "a/b"), Vec::<u32>::new());
    }

    #[test]
    fn exact_star_and_gt() {
        let mut ix = SubscriptionIndex::new();
        assert!(ix.insert("quotes/fx/EURUSD", 1));
        assert!(ix.insert("quotes/*/EURUSD", 2));
        assert!(ix.insert("quotes/>", 3));
        assert!(ix.insert(">", 4));
        assert!(ix.insert("quotes/fx", 5));
        assert!(ix.insert("*/*/*", 6));
        assert!(ix.insert("quotes/fx/>", 7));
        assert_eq!(ix.len(), 7);

        assert_eq!(matches_of(&ix, "quotes/fx/EURUSD"), [1, 2, 3, 4, 6, 7]);
        assert_eq!(matches_of(&ix, "quotes/eq/EURUSD"), [2, 3, 4, 6]);
        assert_eq!(matches_of(&ix, "quotes/fx"), [3, 4, 5]);
        assert_eq!(matches_of(&ix, "quotes"), [4]);
        assert_eq!(matches_of(&ix, "other/fx/EURUSD"), [4, 6]);
        assert_eq!(matches_of(&ix, "quotes/fx/EURUSD/x"), [3, 4, 7]);
    }

    #[test]
    fn literal_wildcard_lookalikes_are_literal() {
        let mut ix = SubscriptionIndex::new();
        ix.insert("a*", 1);
        ix.insert("a/b>", 2);
        assert_eq!(matches_of(&ix, "a*"), [1]);
        assert_eq!(matches_of(&ix, "ab"), Vec::<u32>::new());
        assert_eq!(matches_of(&ix, "a/b>"), [2]);
        assert_eq!(matches_of(&ix, "a/b/c"), Vec::<u32>::new());
    }

    #[test]
    fn duplicates_and_overlaps() {
        let mut ix = SubscriptionIndex::new();
        assert!(ix.insert("a/*", 1));
        assert!(!ix.insert("a/*", 1));
        assert!(ix.insert("a/>", 1));
        assert!(ix.insert("a/b", 1));
        assert!(ix.insert("a/b", 2));
        assert_eq!(ix.len(), 4);
        // Key 1 holds three patterns that match: it is reported three times.
        assert_eq!(matches_of(&ix, "a/b"), [1, 1, 1, 2]);
    }

    #[test]
    fn remove_reports_presence() {
        let mut ix = SubscriptionIndex::new();
        ix.insert("a/b", 1);
        ix.insert("a/>", 1);
        assert!(!ix.remove("a/b", 2));
        assert!(!ix.remove("a/c", 1));
        assert!(!ix.remove("a/*", 1));
        assert!(!ix.remove("a", 1));
        assert!(!ix.remove("a/b/c", 1));
        assert_eq!(ix.len(), 2);
        assert!(ix.remove("a/b", 1));
        assert!(!ix.remove("a/b", 1));
        assert_eq!(matches_of(&ix, "a/b"), [1]);
        assert!(ix.remove("a/>", 1));
        assert!(ix.is_empty());
        assert_eq!(matches_of(&ix, "a/b"), Vec::<u32>::new());
    }

    #[test]
    fn remove_prunes_to_an_empty_root() {
        let mut ix = SubscriptionIndex::new();
        let patterns = ["a/b/c", "a/*/c", "a/>", "*/>", ">", "a/b", "x/y/z/*/>"];
        for round in 0..3 {
            for (i, p) in patterns.iter().enumerate() {
                assert!(ix.insert(p, i), "round {round}: {p}");
            }
            assert!(node_count(&ix.root) > 1);
            for (i, p) in patterns.iter().enumerate().rev() {
                assert!(ix.remove(p, i), "round {round}: {p}");
            }
            assert!(ix.is_empty());
            assert!(ix.root.is_empty());
            assert_eq!(node_count(&ix.root), 1);
            assert_eq!(ix.root.literal.capacity(), 0);
        }
    }

    #[test]
    fn remove_keeps_shared_prefixes() {
        let mut ix = SubscriptionIndex::new();
        ix.insert("a/b/c", 1);
        ix.insert("a/b", 2);
        ix.insert("a/b/*", 3);
        assert_eq!(node_count(&ix.root), 5); // root, a, b, c, *
        ix.remove("a/b/c", 1);
        assert_eq!(node_count(&ix.root), 4);
        assert_eq!(matches_of(&ix, "a/b"), [2]);
        assert_eq!(matches_of(&ix, "a/b/c"), [3]);
        ix.remove("a/b/*", 3);
        assert_eq!(node_count(&ix.root), 3);
        ix.remove("a/b", 2);
        assert_eq!(node_count(&ix.root), 1);
    }

    #[test]
    fn long_and_short_levels() {
        // 22 bytes is the longest level kept inline; 23 goes to the heap.
        let l22 = "x".repeat(Level::INLINE);
        let l23 = "x".repeat(Level::INLINE + 1);
        let l100 = "é".repeat(50);
        assert!(matches!(Level::new(&l22), Level::Inline { len: 22, .. }));
        assert!(matches!(Level::new(&l23), Level::Heap(_)));
        assert_eq!(Level::new(&l23).as_bytes(), l23.as_bytes());
        assert_ne!(Level::new(&l22), Level::new(&l23));

        let mut ix = SubscriptionIndex::new();
        ix.insert(&format!("{l22}/{l23}"), 1);
        ix.insert(&format!("{l23}/*"), 2);
        ix.insert(&format!("*/{l100}/>"), 3);
        assert_eq!(matches_of(&ix, &format!("{l22}/{l23}")), [1]);
        assert_eq!(matches_of(&ix, &format!("{l23}/{l23}")), [2]);
        assert_eq!(matches_of(&ix, &format!("{l22}/{l22}")), Vec::<u32>::new());
        assert_eq!(matches_of(&ix, &format!("a/{l100}/b")), [3]);
        assert!(ix.remove(&format!("{l22}/{l23}"), 1));
        assert!(ix.remove(&format!("{l23}/*"), 2));
        assert!(ix.remove(&format!("*/{l100}/>"), 3));
        assert!(ix.root.is_empty());
    }

    #[test]
    fn churn_does_not_grow_memory() {
        let mut ix = SubscriptionIndex::new();
        for i in 0..10_000u32 {
            ix.insert("hot", i);
            ix.insert(&format!("t/{i}"), i);
        }
        for i in 0..10_000u32 {
            assert!(ix.remove("hot", i));
            assert!(ix.remove(&format!("t/{i}"), i));
        }
        assert!(ix.root.is_empty());
        assert_eq!(ix.root.literal.capacity(), 0);

        // Shrinking partway: 10,000 keys down to 10 gives back most of the slots.
        for i in 0..10_000u32 {
            ix.insert("hot", i);
            ix.insert(&format!("t/{i}"), i);
        }
        for i in 10..10_000u32 {
            ix.remove("hot", i);
            ix.remove(&format!("t/{i}"), i);
        }
        let hot = &ix.root.literal[&b"hot"[..]];
        assert!(hot.here.capacity() < 64, "{}", hot.here.capacity());
        assert!(ix.root.literal[&b"t"[..]].literal.capacity() < 64);
        assert_eq!(matches_of(&ix, "hot"), (0..10).collect::<Vec<_>>());
    }
}
