//! Fuzzes the topic grammar and the subscription index with arbitrary UTF-8.
//!
//! `cargo +nightly fuzz run topic -- -max_total_time=60` from the repository root.
#![no_main]

use herald_core::index::SubscriptionIndex;
use herald_core::topic::{
    is_pattern, matches, validate_pattern, validate_topic, TopicError, MAX_LEVELS, MAX_TOPIC_BYTES,
};
use libfuzzer_sys::fuzz_target;

/// Checks that hold for any string, valid or not.
fn check_grammar(s: &str) {
    let as_topic = validate_topic(s);
    let as_pattern = validate_pattern(s);

    for e in [&as_topic, &as_pattern]
        .into_iter()
        .flat_map(|r| r.as_ref().err())
    {
        // Messages are bounded (the topic is cut) and codes are the documented ones.
        let msg = e.to_string();
        assert!(msg.len() < 600, "message too long: {msg}");
        assert!(matches!(e.code(), "invalid_topic" | "publish_to_pattern"));
    }

    // A topic is exactly a valid pattern without wildcard levels.
    assert_eq!(
        as_topic.is_ok(),
        as_pattern.is_ok() && !is_pattern(s),
        "{s:?}: {as_topic:?} / {as_pattern:?}"
    );
    // Publishing to a valid pattern is refused as publish_to_pattern, nothing else.
    if as_pattern.is_ok() && is_pattern(s) {
        assert!(
            matches!(as_topic, Err(TopicError::Wildcard { .. })),
            "{s:?}"
        );
    }
    if as_pattern.is_ok() {
        assert!(s.len() <= MAX_TOPIC_BYTES);
        assert!(s.split('/').count() <= MAX_LEVELS);
        assert!(!s.contains('\0'));
        assert!(s.split('/').all(|l| !l.is_empty()));
        let levels: Vec<&str> = s.split('/').collect();
        assert!(!levels[..levels.len() - 1].contains(&">"), "{s:?}");
    }
    if as_topic.is_ok() {
        assert!(!is_pattern(s));
        assert!(matches(s, s), "{s:?} does not match itself");
        assert!(matches(">", s));
    }
}

fuzz_target!(|input: (Vec<&str>, &str)| {
    let (patterns, topic) = input;
    check_grammar(topic);
    for p in &patterns {
        check_grammar(p);
    }

    // The index against the reference matcher, for the valid patterns among the input.
    let valid: Vec<(&str, u16)> = patterns
        .iter()
        .take(64)
        .zip(0u16..)
        .filter(|(p, _)| validate_pattern(p).is_ok())
        .map(|(p, k)| (*p, k))
        .collect();
    let mut ix = SubscriptionIndex::new();
    for &(p, k) in &valid {
        assert!(ix.insert(p, k));
        assert!(!ix.insert(p, k));
    }
    assert_eq!(ix.len(), valid.len());

    // Probe the input topic, and each pattern's own text where that is a topic.
    let probes = std::iter::once(topic).chain(valid.iter().map(|(p, _)| *p));
    for t in probes.filter(|t| validate_topic(t).is_ok()) {
        let mut got = Vec::new();
        ix.for_each_match(t, |k| got.push(k));
        got.sort_unstable();
        let mut want: Vec<u16> = valid
            .iter()
            .filter(|(p, _)| matches(p, t))
            .map(|&(_, k)| k)
            .collect();
        want.sort_unstable();
        assert_eq!(got, want, "topic {t:?}");
    }

    for &(p, k) in &valid {
        assert!(ix.remove(p, k));
        assert!(!ix.remove(p, k));
    }
    assert!(ix.is_empty());
});
