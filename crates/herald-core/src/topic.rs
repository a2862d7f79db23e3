//! Topic names and subscription patterns (the grammar in `docs/protocol.md`, "Topics and
//! patterns").
//!
//! A topic is a sequence of non-empty levels separated by `/`. A pattern may also use `*` as a
//! whole level (exactly one level) and `>` as the last level (one or more levels). A level that
//! merely *contains* `*` or `>` (`ab*`, `a>`) is an ordinary literal level.
//!
//! Validation happens once, at the edge (when a client publishes or subscribes); everything
//! downstream, such as [`crate::index::SubscriptionIndex`], assumes valid input.

use std::fmt;

/// Longest topic or pattern, in bytes of UTF-8.
pub const MAX_TOPIC_BYTES: usize = 250;

/// Most levels in a topic or pattern.
///
/// With one-byte levels, 128 levels need 255 bytes, so today [`MAX_TOPIC_BYTES`] is reached
/// first (the most levels a valid topic can have is 125). The level limit is still enforced on
/// its own so that raising the byte limit cannot silently lift it.
pub const MAX_LEVELS: usize = 128;

/// How many bytes of an offending topic an error message quotes. Long enough to recognise the
/// topic, short enough to keep a log line readable.
const SHOWN_BYTES: usize = 80;

/// Why a topic or pattern was rejected.
///
/// Each variant carries the offending text (cut to about 80 bytes) so that its `Display` says
/// what was wrong, where, and what to do; that message goes to the client unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopicError {
    /// The empty string.
    #[error("topic is empty; give at least one level, e.g. \"quotes/fx/EURUSD\"")]
    Empty,
    /// More than [`MAX_TOPIC_BYTES`] bytes.
    #[error(
        "topic {} is {len} bytes long; the limit is {MAX_TOPIC_BYTES} bytes, use a shorter topic",
        Shown(topic)
    )]
    TooLong { topic: String, len: usize },
    /// More than [`MAX_LEVELS`] levels.
    #[error(
        "topic {} has {levels} levels; the limit is {MAX_LEVELS} levels, use fewer levels",
        Shown(topic)
    )]
    TooManyLevels { topic: String, levels: usize },
    /// A level with nothing in it: `a//b`, `/a`, `a/`. `level` counts from 1.
    #[error(
        "topic {} has an empty level (level {level}); levels are separated by a single '/'",
        Shown(topic)
    )]
    EmptyLevel { topic: String, level: usize },
    /// A NUL byte somewhere in the text. `offset` is in bytes, from 0.
    #[error(
        "topic {} contains a NUL byte (at byte {offset}); topics may not contain NUL",
        Shown(topic)
    )]
    Nul { topic: String, offset: usize },
    /// A topic to publish to has a level that is exactly `*` or `>`. `level` counts from 1.
    #[error(
        "topic {} has the wildcard '{wildcard}' as level {level}; publish to an exact topic, \
         wildcards ('*', '>') are only allowed in subscriptions",
        Shown(topic)
    )]
    Wildcard {
        topic: String,
        level: usize,
        wildcard: char,
    },
    /// A pattern has `>` as a level other than the last one. `level` counts from 1.
    #[error(
        "pattern {} has '>' as level {level}, but '>' is only allowed as the last level; \
         use '*' to match exactly one level",
        Shown(topic)
    )]
    GtNotLast { topic: String, level: usize },
}

impl TopicError {
    /// The protocol's error code for this error (`docs/protocol.md`): publishing to a pattern
    /// is its own code, so that clients can tell "you meant to subscribe" from "bad name".
    pub fn code(&self) -> &'static str {
        match self {
            TopicError::Wildcard { .. } => "publish_to_pattern",
            _ => "invalid_topic",
        }
    }
}

/// Quotes a topic for an error message: Rust's string escaping makes NUL, control characters
/// and embedded quotes visible instead of corrupting the log line.
struct Shown<'a>(&'a str);

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

/// The text an error keeps: the whole topic, or as much of it as shows in ~80 bytes once
/// escaped, followed by `…`. Counted escaped because a control character shows as up to ten
/// (`\u{16}`): cutting the raw text let a line of them make a message of kilobytes (found by
/// the `topic` fuzz target).
fn shown(s: &str) -> String {
    let mut width = 0;
    for (at, c) in s.char_indices() {
        width += c.escape_debug().map(char::len_utf8).sum::<usize>();
        if width > SHOWN_BYTES {
            return format!("{}…", &s[..at]);
        }
    }
    s.to_owned()
}

/// Checks an exact topic, the kind a message is published to: `*` and `>` levels are refused.
pub fn validate_topic(topic: &str) -> Result<(), TopicError> {
    if is_plain_topic(topic.as_bytes()) {
        return Ok(());
    }
    check(topic, false, MAX_TOPIC_BYTES)
}

/// Whether `topic` is valid, in one pass over its bytes: every publish checks its topic, and
/// [`check`]'s level iterator, built to say what is wrong, cost ~400 instructions on a short
/// topic. Accepts exactly what `check` accepts (a property test holds them together); what it
/// refuses goes to `check` for the error.
fn is_plain_topic(topic: &[u8]) -> bool {
    let plain_level = |level: &[u8]| !matches!(level, b"" | b"*" | b">");
    if topic.is_empty() || topic.len() > MAX_TOPIC_BYTES {
        return false;
    }
    let (mut levels, mut start) = (1, 0);
    for (i, &b) in topic.iter().enumerate() {
        match b {
            0 => return false,
            b'/' => {
                if !plain_level(&topic[start..i]) {
                    return false;
                }
                levels += 1;
                start = i + 1;
            }
            _ => {}
        }
    }
    levels <= MAX_LEVELS && plain_level(&topic[start..])
}

/// Checks a subscription pattern: like [`validate_topic`], but `*` levels and a trailing `>`
/// level are allowed.
pub fn validate_pattern(pattern: &str) -> Result<(), TopicError> {
    check(pattern, true, MAX_TOPIC_BYTES)
}

/// The one validation routine. `max_bytes` is a parameter only so that tests can reach the
/// level limit, which the byte limit otherwise hides.
fn check(s: &str, wildcards: bool, max_bytes: usize) -> Result<(), TopicError> {
    if s.is_empty() {
        return Err(TopicError::Empty);
    }
    if s.len() > max_bytes {
        return Err(TopicError::TooLong {
            topic: shown(s),
            len: s.len(),
        });
    }
    if let Some(offset) = s.bytes().position(|b| b == 0) {
        return Err(TopicError::Nul {
            topic: shown(s),
            offset,
        });
    }
    let mut levels = s.split('/').enumerate().peekable();
    while let Some((i, level)) = levels.next() {
        let n = i + 1;
        if n > MAX_LEVELS {
            return Err(TopicError::TooManyLevels {
                topic: shown(s),
                levels: s.split('/').count(),
            });
        }
        match level {
            "" => {
                return Err(TopicError::EmptyLevel {
                    topic: shown(s),
                    level: n,
                })
            }
            "*" | ">" if !wildcards => {
                return Err(TopicError::Wildcard {
                    topic: shown(s),
                    level: n,
                    wildcard: if level == "*" { '*' } else { '>' },
                })
            }
            ">" if levels.peek().is_some() => {
                return Err(TopicError::GtNotLast {
                    topic: shown(s),
                    level: n,
                })
            }
            _ => {}
        }
    }
    Ok(())
}

/// True if any level is exactly `*` or `>`, i.e. the string is meant as a pattern.
pub fn is_pattern(s: &str) -> bool {
    s.split('/').any(|level| level == "*" || level == ">")
}

/// Does `pattern` match `topic`? The reference definition, written for clarity rather than
/// speed: tests check the index against it, and snapshot lookups use it on a handful of topics.
/// One shortcut: an [`is_exact`] pattern matches only the topic equal to it; callers that test
/// each of a connection's patterns on every delivery mostly hold such patterns.
///
/// Assumes both are valid. `>` is taken as a wildcard only as the last level (elsewhere it is
/// compared literally), so the answer is well defined for any input.
pub fn matches(pattern: &str, topic: &str) -> bool {
    if is_exact(pattern) {
        return pattern == topic;
    }
    matches_by_level(pattern, topic)
}

/// Whether `pattern` holds neither `*` nor `>`, so that no level of it is a wildcard: it
/// matches only the topic equal to it.
pub fn is_exact(pattern: &str) -> bool {
    !pattern.bytes().any(|b| b == b'*' || b == b'>')
}

/// [`matches`] without its shortcut: level by level.
fn matches_by_level(pattern: &str, topic: &str) -> bool {
    let mut p = pattern.split('/').peekable();
    let mut t = topic.split('/');
    loop {
        match (p.next(), t.next()) {
            // `>` stands for the remaining levels, of which there is at least one: this one.
            (Some(">"), Some(_)) if p.peek().is_none() => return true,
            (Some("*"), Some(_)) => {}
            (Some(pl), Some(tl)) if pl == tl => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err_topic(s: &str) -> TopicError {
        validate_topic(s).expect_err(s)
    }

    fn err_pattern(s: &str) -> TopicError {
        validate_pattern(s).expect_err(s)
    }

    /// `n` levels named `a`: `a/a/…/a`, `2n - 1` bytes.
    fn levels(n: usize) -> String {
        vec!["a"; n].join("/")
    }

    #[test]
    fn valid_topics() {
        for t in [
            "a",
            "quotes/fx/EURUSD",
            "camera/1/raw",
            "ab*",
            "a>",
            "*a/b>/>c",
            "**",
            ">>",
            "a b/ c",
            "Ünïcødé/日本/🦀",
            "a\\b",
            ".",
        ] {
            assert_eq!(validate_topic(t), Ok(()), "{t}");
            assert_eq!(validate_pattern(t), Ok(()), "{t}");
            assert!(!is_pattern(t), "{t}");
        }
    }

    #[test]
    fn valid_patterns() {
        for p in [
            "*",
            ">",
            "*/*",
            "*/>",
            "a/*",
            "a/>",
            "quotes/*/EURUSD",
            "quotes/>",
            "*/b/>",
            "a/*/c/*/>",
        ] {
            assert_eq!(validate_pattern(p), Ok(()), "{p}");
            assert!(is_pattern(p), "{p}");
        }
    }

    #[test]
    fn empty_is_invalid() {
        assert_eq!(err_topic(""), TopicError::Empty);
        assert_eq!(err_pattern(""), TopicError::Empty);
        assert_eq!(TopicError::Empty.code(), "invalid_topic");
        assert!(TopicError::Empty.to_string().contains("empty"));
    }

    #[test]
    fn empty_levels_are_invalid() {
        for (s, level) in [
            ("a//b", 2),
            ("/a", 1),
            ("a/", 2),
            ("/", 1),
            ("//", 1),
            ("a/b/c/", 4),
            ("a/b//", 3),
        ] {
            let want = TopicError::EmptyLevel {
                topic: s.into(),
                level,
            };
            assert_eq!(err_topic(s), want, "{s}");
            assert_eq!(err_pattern(s), want, "{s}");
        }
        // Patterns are held to the same rule.
        assert!(matches!(
            err_pattern("*//>"),
            TopicError::EmptyLevel { level: 2, .. }
        ));
        assert!(matches!(
            err_pattern("*/"),
            TopicError::EmptyLevel { level: 2, .. }
        ));
        // Left to right: `>` followed by anything is reported before the empty level after it.
        assert!(matches!(
            err_pattern(">/"),
            TopicError::GtNotLast { level: 1, .. }
        ));
    }

    #[test]
    fn empty_level_message_is_the_documented_one() {
        let e = err_topic("a//b");
        assert_eq!(e.code(), "invalid_topic");
        assert_eq!(
            e.to_string(),
            "topic \"a//b\" has an empty level (level 2); levels are separated by a single '/'"
        );
    }

    #[test]
    fn nul_is_invalid() {
        for (s, offset) in [("\0", 0), ("a\0b", 1), ("a/b\0", 3), ("a/\0/c", 2)] {
            let want = TopicError::Nul {
                topic: s.into(),
                offset,
            };
            assert_eq!(err_topic(s), want);
            assert_eq!(err_pattern(s), want);
        }
        let msg = err_topic("a\0b").to_string();
        assert!(msg.contains(r#""a\0b""#), "{msg}");
        assert!(msg.contains("NUL"), "{msg}");
    }

    #[test]
    fn byte_limit_is_250() {
        let ok = "x".repeat(MAX_TOPIC_BYTES);
        assert_eq!(validate_topic(&ok), Ok(()));
        assert_eq!(validate_pattern(&ok), Ok(()));

        let over = "x".repeat(MAX_TOPIC_BYTES + 1);
        let e = err_topic(&over);
        assert!(matches!(e, TopicError::TooLong { len: 251, .. }), "{e:?}");
        assert_eq!(err_pattern(&over), e);
        let msg = e.to_string();
        assert!(msg.contains("251 bytes"), "{msg}");
        assert!(msg.contains("250"), "{msg}");

        // Bytes, not characters: 125 two-byte characters fit, 126 do not.
        assert_eq!(validate_topic(&"é".repeat(125)), Ok(()));
        assert!(matches!(
            err_topic(&"é".repeat(126)),
            TopicError::TooLong { len: 252, .. }
        ));

        // A pattern with a trailing `>` at exactly the limit.
        let p = format!("{}/>", "x".repeat(MAX_TOPIC_BYTES - 2));
        assert_eq!(validate_pattern(&p), Ok(()));
        let p = format!("{}/>", "x".repeat(MAX_TOPIC_BYTES - 1));
        assert!(matches!(err_pattern(&p), TopicError::TooLong { .. }));
    }

    #[test]
    fn byte_limit_binds_before_level_limit() {
        // 125 one-byte levels are 249 bytes; 126 are 251, already too long.
        assert_eq!(validate_topic(&levels(125)), Ok(()));
        assert!(matches!(
            err_topic(&levels(126)),
            TopicError::TooLong { len: 251, .. }
        ));
        assert!(matches!(
            err_topic(&levels(MAX_LEVELS)),
            TopicError::TooLong { len: 255, .. }
        ));
    }

    #[test]
    fn level_limit_is_128() {
        // Lift the byte limit to reach the level limit on its own.
        let big = 10_000;
        assert_eq!(check(&levels(MAX_LEVELS), false, big), Ok(()));
        assert_eq!(check(&levels(MAX_LEVELS), true, big), Ok(()));
        let e = check(&levels(MAX_LEVELS + 1), false, big).unwrap_err();
        assert!(
            matches!(e, TopicError::TooManyLevels { levels: 129, .. }),
            "{e:?}"
        );
        let msg = e.to_string();
        assert!(msg.contains("129 levels"), "{msg}");
        assert!(msg.contains("128"), "{msg}");
        assert_eq!(e.code(), "invalid_topic");
        // A trailing `>` counts as a level.
        let p = format!("{}/>", levels(MAX_LEVELS));
        assert!(matches!(
            check(&p, true, big),
            Err(TopicError::TooManyLevels { levels: 129, .. })
        ));
    }

    #[test]
    fn wildcards_cannot_be_published_to() {
        for (s, level, wildcard) in [
            ("*", 1, '*'),
            (">", 1, '>'),
            ("a/*", 2, '*'),
            ("a/>", 2, '>'),
            ("*/b", 1, '*'),
            ("a/>/c", 2, '>'),
            ("a/b/*/>", 3, '*'),
        ] {
            let e = err_topic(s);
            assert_eq!(
                e,
                TopicError::Wildcard {
                    topic: s.into(),
                    level,
                    wildcard
                },
                "{s}"
            );
            assert_eq!(e.code(), "publish_to_pattern");
            let msg = e.to_string();
            assert!(msg.contains(&format!("{s:?}")), "{msg}");
            assert!(msg.contains(&format!("level {level}")), "{msg}");
            assert!(msg.contains("subscriptions"), "{msg}");
        }
    }

    #[test]
    fn gt_only_last() {
        for (s, level) in [
            (">/a", 1),
            ("a/>/b", 2),
            (">/>", 1),
            ("a/>/*", 2),
            ("*/>/>", 2),
        ] {
            let e = err_pattern(s);
            assert_eq!(
                e,
                TopicError::GtNotLast {
                    topic: s.into(),
                    level
                },
                "{s}"
            );
            assert_eq!(e.code(), "invalid_topic");
            let msg = e.to_string();
            assert!(msg.contains(&format!("{s:?}")), "{msg}");
            assert!(msg.contains(&format!("level {level}")), "{msg}");
        }
        // `>` inside a level is literal, so it may appear anywhere.
        assert_eq!(validate_pattern("a>/b/>"), Ok(()));
    }

    #[test]
    fn first_problem_is_reported() {
        // Scanning left to right: the wildcard at level 2 comes before the empty level 3.
        assert!(matches!(
            err_topic("a/*//"),
            TopicError::Wildcard { level: 2, .. }
        ));
        assert!(matches!(
            err_topic("a///*"),
            TopicError::EmptyLevel { level: 2, .. }
        ));
    }

    #[test]
    fn long_topics_are_cut_in_messages() {
        let long = "é".repeat(200); // 400 bytes; 80 is a char boundary here
        let e = err_topic(&long);
        let TopicError::TooLong { topic, len } = &e else {
            panic!("{e:?}")
        };
        assert_eq!(*len, 400);
        assert_eq!(topic, &format!("{}…", "é".repeat(40)));

        // A cut that would split a character backs off to the boundary before it.
        let odd = format!("x{}", "é".repeat(200));
        let shown_text = shown(&odd);
        assert_eq!(shown_text, format!("x{}…", "é".repeat(39)));
        assert!(e.to_string().len() < 250);

        // Control characters count as they show: the message stays short.
        let controls = "\u{16}".repeat(80);
        let e = err_topic(&format!(">{controls}/>"));
        assert!(e.to_string().len() < 300, "{e}");

        // Short topics are kept whole.
        assert_eq!(shown("a/b"), "a/b");
        assert_eq!(shown(&"x".repeat(80)), "x".repeat(80));
    }

    #[test]
    fn messages_escape_quotes() {
        let e = err_topic("say \"hi\"//x");
        assert!(e.to_string().contains(r#""say \"hi\"//x""#), "{e}");
    }

    #[test]
    fn is_pattern_cases() {
        assert!(is_pattern("*"));
        assert!(is_pattern(">"));
        assert!(is_pattern("a/*/b"));
        assert!(is_pattern("a/b/>"));
        assert!(is_pattern("a/>/b")); // invalid pattern, but still a pattern
        assert!(!is_pattern("a/b"));
        assert!(!is_pattern("ab*/a>/>b/*c"));
        assert!(!is_pattern(""));
    }

    #[test]
    fn matches_exact() {
        assert!(matches("a", "a"));
        assert!(matches("a/b/c", "a/b/c"));
        assert!(!matches("a", "b"));
        assert!(!matches("a/b", "a"));
        assert!(!matches("a", "a/b"));
        assert!(!matches("a/b/c", "a/b/d"));
        assert!(!matches("a/b", "A/b")); // case-sensitive
        assert!(!matches("ab", "a/b"));
    }

    #[test]
    fn matches_star() {
        assert!(matches("*", "a"));
        assert!(matches("*", "*"));
        assert!(!matches("*", "a/b"));
        assert!(matches("a/*", "a/b"));
        assert!(!matches("a/*", "a"));
        assert!(!matches("a/*", "a/b/c"));
        assert!(matches("*/b", "a/b"));
        assert!(!matches("*/b", "a/c"));
        assert!(matches("quotes/*/EURUSD", "quotes/fx/EURUSD"));
        assert!(!matches("quotes/*/EURUSD", "quotes/fx/spot/EURUSD"));
        assert!(matches("*/*/*", "x/y/z"));
        assert!(!matches("*/*/*", "x/y"));
    }

    #[test]
    fn matches_gt() {
        assert!(matches(">", "a"));
        assert!(matches(">", "a/b/c"));
        assert!(matches("a/>", "a/b"));
        assert!(matches("a/>", "a/b/c/d"));
        assert!(!matches("a/>", "a")); // `>` needs at least one level
        assert!(!matches("a/>", "b/c"));
        assert!(matches("*/>", "a/b"));
        assert!(!matches("*/>", "a"));
        assert!(matches("a/*/>", "a/b/c"));
        assert!(!matches("a/*/>", "a/b"));
        assert!(matches("quotes/>", "quotes/fx/EURUSD"));
    }

    #[test]
    fn matches_partial_wildcards_are_literal() {
        assert!(matches("ab*", "ab*"));
        assert!(!matches("ab*", "abc"));
        assert!(matches("a>", "a>"));
        assert!(!matches("a>", "a/b"));
        assert!(!matches("a>", "ab"));
        assert!(!matches("a/b*", "a/b/c"));
    }

    #[test]
    fn matches_gt_not_last_is_literal() {
        // Invalid pattern, but `matches` stays well defined.
        assert!(matches("a/>/c", "a/>/c"));
        assert!(!matches("a/>/c", "a/b/c"));
    }

    use proptest::strategy::Strategy;

    proptest::proptest! {
        /// The one-pass check accepts exactly the topics the full check accepts.
        #[test]
        fn the_fast_topic_check_agrees_with_the_full_one(
            parts in proptest::collection::vec(
                proptest::prop_oneof![
                    4 => "[a-z0-9]{1,3}",
                    1 => proptest::sample::select(vec!["", "*", ">", "a*", ">b", "\u{0}", "é"])
                        .prop_map(String::from),
                ],
                1..6,
            ),
            deep in proptest::bool::weighted(0.05),
        ) {
            let mut topic = parts.join("/");
            if deep {
                topic = format!("{}/{topic}", levels(MAX_LEVELS - 2));
            }
            proptest::prop_assert_eq!(
                is_plain_topic(topic.as_bytes()),
                check(&topic, false, MAX_TOPIC_BYTES).is_ok(),
                "{}", topic
            );
        }

        /// The shortcut for patterns without a wildcard answers as the levels do.
        #[test]
        fn a_pattern_without_wildcards_matches_as_its_levels_do(
            pattern in proptest::collection::vec(
                proptest::sample::select(vec!["a", "b", "*", ">", "a*", ">b", ""]), 1..4),
            topic in proptest::collection::vec(
                proptest::sample::select(vec!["a", "b", "a*", ">b", ""]), 1..4),
        ) {
            let (pattern, topic) = (pattern.join("/"), topic.join("/"));
            proptest::prop_assert_eq!(
                matches(&pattern, &topic),
                matches_by_level(&pattern, &topic),
                "{} against {}", pattern, topic
            );
        }
    }
}
