//! Property tests: the index against a naive reference, and `topic::matches` against
//! definitions written independently of it.
//!
//! Levels come from a tiny alphabet so that random topics and patterns collide often; it
//! includes `ab*` and `a>`, which look like wildcards but are literal levels.

use herald_core::index::SubscriptionIndex;
use herald_core::topic::{is_pattern, matches, validate_pattern, validate_topic};
use proptest::prelude::*;

const LITERALS: &[&str] = &["a", "b", "c", "ab*", "a>"];

fn literal() -> impl Strategy<Value = String> {
    proptest::sample::select(LITERALS).prop_map(str::to_owned)
}

fn topic() -> impl Strategy<Value = String> {
    prop::collection::vec(literal(), 1..=5).prop_map(|v| v.join("/"))
}

/// A literal or `*`, with `*` about a third of the time.
fn pattern_level() -> impl Strategy<Value = String> {
    prop_oneof![2 => literal(), 1 => Just("*".to_owned())]
}

/// Zero to three levels of literals and `*`, then a last level that may also be `>`.
fn pattern() -> impl Strategy<Value = String> {
    (
        prop::collection::vec(pattern_level(), 0..=3),
        prop_oneof![3 => pattern_level(), 1 => Just(">".to_owned())],
    )
        .prop_map(|(mut v, last)| {
            v.push(last);
            v.join("/")
        })
}

#[derive(Debug, Clone)]
enum Op {
    Insert(usize, u8),
    Remove(usize, u8),
}

fn op() -> impl Strategy<Value = Op> {
    // Indexes into a pool of patterns, so removes often hit something inserted.
    prop_oneof![
        3 => (0..8usize, 0..4u8).prop_map(|(p, k)| Op::Insert(p, k)),
        2 => (0..8usize, 0..4u8).prop_map(|(p, k)| Op::Remove(p, k)),
    ]
}

fn index_matches(ix: &SubscriptionIndex<u8>, topic: &str) -> Vec<u8> {
    let mut v = Vec::new();
    ix.for_each_match(topic, |k| v.push(k));
    v.sort_unstable();
    v
}

fn reference_matches(entries: &[(String, u8)], topic: &str) -> Vec<u8> {
    let mut v: Vec<u8> = entries
        .iter()
        .filter(|(p, _)| matches(p, topic))
        .map(|&(_, k)| k)
        .collect();
    v.sort_unstable();
    v
}

/// `matches`, written again over slices of levels as a plain recursive definition.
fn matches_by_levels(pattern: &[&str], topic: &[&str]) -> bool {
    match (pattern, topic) {
        ([], []) => true,
        ([">"], [_, ..]) => true,
        (["*", p @ ..], [_, t @ ..]) => matches_by_levels(p, t),
        ([pl, p @ ..], [tl, t @ ..]) => pl == tl && matches_by_levels(p, t),
        _ => false,
    }
}

/// Every topic of 1..=`depth` levels over `alphabet`.
fn all_topics(alphabet: &[&str], depth: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut layer = vec![String::new()];
    for _ in 0..depth {
        layer = layer
            .iter()
            .flat_map(|prefix| {
                alphabet.iter().map(move |l| {
                    if prefix.is_empty() {
                        (*l).to_owned()
                    } else {
                        format!("{prefix}/{l}")
                    }
                })
            })
            .collect();
        out.extend(layer.iter().cloned());
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Any sequence of inserts and removes leaves the index agreeing with a plain list of
    /// `(pattern, key)` pairs filtered by `matches`: same return values, same `len`, and the
    /// same multiset of keys for every topic.
    #[test]
    fn index_agrees_with_reference(
        pool in prop::collection::vec(pattern(), 8),
        ops in prop::collection::vec(op(), 0..80),
        topics in prop::collection::vec(topic(), 1..12),
    ) {
        let mut ix = SubscriptionIndex::new();
        let mut reference: Vec<(String, u8)> = Vec::new();
        for (step, op) in ops.iter().enumerate() {
            match *op {
                Op::Insert(p, k) => {
                    let pat = &pool[p];
                    let fresh = !reference.iter().any(|(q, j)| q == pat && *j == k);
                    if fresh {
                        reference.push((pat.clone(), k));
                    }
                    prop_assert_eq!(ix.insert(pat, k), fresh, "step {}: insert {} {}", step, pat, k);
                }
                Op::Remove(p, k) => {
                    let pat = &pool[p];
                    let at = reference.iter().position(|(q, j)| q == pat && *j == k);
                    if let Some(i) = at {
                        reference.swap_remove(i);
                    }
                    prop_assert_eq!(ix.remove(pat, k), at.is_some(), "step {}: remove {} {}", step, pat, k);
                }
            }
            prop_assert_eq!(ix.len(), reference.len());
            prop_assert_eq!(ix.is_empty(), reference.is_empty());
            // Checking after every step catches a remove that breaks a sibling's entries.
            for t in &topics {
                prop_assert_eq!(index_matches(&ix, t), reference_matches(&reference, t), "step {}: topic {}", step, t);
            }
        }
        // Also probe topics that the pool's own patterns match.
        for p in &pool {
            let t = p
                .split('/')
                .map(|l| match l {
                    "*" => "a",
                    ">" => "b/c",
                    l => l,
                })
                .collect::<Vec<_>>()
                .join("/");
            prop_assert_eq!(index_matches(&ix, &t), reference_matches(&reference, &t), "topic {}", t);
        }
        // Draining everything leaves nothing behind.
        for (p, k) in reference.drain(..) {
            prop_assert!(ix.remove(&p, k));
        }
        prop_assert!(ix.is_empty());
        for t in &topics {
            prop_assert_eq!(index_matches(&ix, t), Vec::<u8>::new());
        }
    }

    /// `matches` agrees with the recursive definition over level slices.
    #[test]
    fn matches_agrees_with_recursive_definition(p in pattern(), t in topic()) {
        let pl: Vec<&str> = p.split('/').collect();
        let tl: Vec<&str> = t.split('/').collect();
        prop_assert_eq!(matches(&p, &t), matches_by_levels(&pl, &tl));
    }

    /// Filling a pattern's wildcards with levels gives a topic it matches, and the index
    /// finds it; changing one literal level of that topic breaks the match.
    #[test]
    fn instantiated_patterns_match(
        p in pattern(),
        fill in prop::collection::vec(literal(), 8),
        tail in 1..4usize,
        flip in any::<prop::sample::Index>(),
    ) {
        let mut fill = fill.into_iter().cycle();
        let mut levels = Vec::new();
        for l in p.split('/') {
            match l {
                "*" => levels.push(fill.next().unwrap()),
                ">" => levels.extend(fill.by_ref().take(tail)),
                _ => levels.push(l.to_owned()),
            }
        }
        let t = levels.join("/");
        prop_assert!(validate_topic(&t).is_ok(), "{}", t);
        prop_assert!(matches(&p, &t), "{} !~ {}", p, t);
        let mut ix = SubscriptionIndex::new();
        ix.insert(&p, 7u8);
        prop_assert_eq!(index_matches(&ix, &t), vec![7]);

        // Change a level that the pattern spells literally.
        let literal_positions: Vec<usize> = p
            .split('/')
            .enumerate()
            .filter(|(_, l)| *l != "*" && *l != ">")
            .map(|(i, _)| i)
            .collect();
        if !literal_positions.is_empty() {
            let i = literal_positions[flip.index(literal_positions.len())];
            levels[i] = "zz".to_owned();
            let t2 = levels.join("/");
            prop_assert!(!matches(&p, &t2), "{} ~ {}", p, t2);
            prop_assert_eq!(index_matches(&ix, &t2), Vec::<u8>::new());
        }
    }

    /// Counting, independent of any matcher: over an alphabet of k levels and topics of at
    /// most D levels, a pattern of n levels with s stars and no `>` matches exactly k^s topics
    /// (when n <= D); with a trailing `>` it matches sum over j in 1..=D-(n-1) of k^(s+j).
    #[test]
    fn match_counts_follow_combinatorics(
        levels in prop::collection::vec(prop_oneof![
            2 => proptest::sample::select(&["a", "b", "c"][..]).prop_map(str::to_owned),
            1 => Just("*".to_owned()),
        ], 1..=4),
        gt in any::<bool>(),
    ) {
        const ALPHABET: &[&str] = &["a", "b", "c"];
        const DEPTH: usize = 5;
        let k = ALPHABET.len() as u64;
        let stars = levels.iter().filter(|l| *l == "*").count() as u32;
        let mut p = levels.join("/");
        let n = levels.len() + usize::from(gt);
        if gt {
            p.push_str("/>");
        }
        let expected: u64 = if gt {
            (1..=DEPTH + 1 - n).map(|j| k.pow(stars + j as u32)).sum()
        } else {
            k.pow(stars)
        };
        let topics = all_topics(ALPHABET, DEPTH);
        let by_matches = topics.iter().filter(|t| matches(&p, t)).count() as u64;
        prop_assert_eq!(by_matches, expected, "pattern {}", p);

        let mut ix = SubscriptionIndex::new();
        ix.insert(&p, ());
        let mut by_index = 0u64;
        for t in &topics {
            ix.for_each_match(t, |()| by_index += 1);
        }
        prop_assert_eq!(by_index, expected, "pattern {}", p);
    }

    /// The generators make what they claim, and `is_pattern` tells the two apart.
    #[test]
    fn generators_are_valid(p in pattern(), t in topic()) {
        prop_assert!(validate_pattern(&p).is_ok(), "{}", p);
        prop_assert!(validate_topic(&t).is_ok(), "{}", t);
        prop_assert!(validate_pattern(&t).is_ok(), "{}", t);
        prop_assert!(!is_pattern(&t));
        prop_assert_eq!(is_pattern(&p), validate_topic(&p).is_err(), "{}", p);
        // A topic is a pattern that matches exactly itself.
        prop_assert!(matches(&t, &t));
    }
}
