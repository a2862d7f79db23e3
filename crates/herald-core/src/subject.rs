//! Herald topics and patterns as NATS subjects, for the cluster bridge.
//!
//! A herald level may hold anything but `/` and NUL — dots, spaces, `*` inside a word, any
//! UTF-8 — while a NATS token may not contain `.` or whitespace and treats `*`/`>` specially.
//! So every level is escaped: ASCII letters, digits and `-` stay as they are, and every other
//! byte becomes `_` followed by two upper-case hex digits (`_` itself is `_5F`). The escape is
//! injective (a `_` always starts exactly one escape, and nothing else produces `_`), so no two
//! herald topics share a subject, and an escaped level is never `*` or `>`. Whole-level
//! wildcards map to NATS wildcards: `*` to `*`, a trailing `>` to `>`, which match the same
//! topics because levels and tokens correspond one to one.

use std::fmt::Write;

/// The subject for topic or pattern `name` under `prefix` (e.g. `herald.t`). `name` must be
/// valid (see [`crate::topic`]).
pub fn to_subject(prefix: &str, name: &str) -> String {
    let mut out = String::with_capacity(prefix.len() + name.len() * 2 + 1);
    out.push_str(prefix);
    for level in name.split('/') {
        out.push('.');
        match level {
            // Only patterns have these levels: topics with them are rejected at the edge.
            "*" | ">" => out.push_str(level),
            _ => escape_level(level, &mut out),
        }
    }
    out
}

fn escape_level(level: &str, out: &mut String) {
    for &b in level.as_bytes() {
        if b.is_ascii_alphanumeric() || b == b'-' {
            out.push(b as char);
        } else {
            write!(out, "_{b:02X}").expect("writing to a String cannot fail");
        }
    }
}

/// The topic a subject names, or `None` if the subject is not one [`to_subject`] produces for
/// a topic under `prefix`.
pub fn to_topic(prefix: &str, subject: &str) -> Option<String> {
    let rest = subject.strip_prefix(prefix)?.strip_prefix('.')?;
    let mut topic = Vec::with_capacity(rest.len());
    for (i, token) in rest.split('.').enumerate() {
        if i > 0 {
            topic.push(b'/');
        }
        if token.is_empty() {
            return None;
        }
        let mut bytes = token.bytes();
        while let Some(b) = bytes.next() {
            match b {
                b'_' => {
                    let hex = [bytes.next()?, bytes.next()?];
                    let hex = std::str::from_utf8(&hex).ok()?;
                    if hex.bytes().any(|h| h.is_ascii_lowercase()) {
                        return None;
                    }
                    topic.push(u8::from_str_radix(hex, 16).ok()?);
                }
                b if b.is_ascii_alphanumeric() || b == b'-' => topic.push(b),
                _ => return None,
            }
        }
    }
    let topic = String::from_utf8(topic).ok()?;
    crate::topic::validate_topic(&topic).ok()?;
    Some(topic)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn examples() {
        assert_eq!(
            to_subject("herald.t", "quotes/fx/EURUSD"),
            "herald.t.quotes.fx.EURUSD"
        );
        assert_eq!(to_subject("h", "a.b/c d"), "h.a_2Eb.c_20d");
        assert_eq!(to_subject("h", "a/*/>"), "h.a.*.>");
        assert_eq!(to_subject("h", "a*/b>"), "h.a_2A.b_3E");
        assert_eq!(to_subject("h", "_5F"), "h._5F5F");
        assert_eq!(to_subject("h", "é"), "h._C3_A9");
        assert_eq!(to_topic("h", "h.a_2Eb.c_20d").as_deref(), Some("a.b/c d"));
        assert_eq!(to_topic("h", "h.a.*"), None);
        assert_eq!(
            to_topic("h", "h.a_2e"),
            None,
            "only the upper-case form is produced"
        );
        assert_eq!(to_topic("h", "hx.a"), None);
        assert_eq!(to_topic("h", "h..a"), None);
    }

    /// Levels drawn from the characters that make escaping hard.
    fn level() -> impl Strategy<Value = String> {
        proptest::string::string_regex("[a-zA-Z0-9._* >\\-é\u{1F600}\\\\%]{1,6}")
            .expect("valid regex")
            .prop_filter("wildcard levels are not topic levels", |l| {
                l != "*" && l != ">"
            })
    }

    fn topic() -> impl Strategy<Value = String> {
        proptest::collection::vec(level(), 1..5).prop_map(|levels| levels.join("/"))
    }

    fn pattern() -> impl Strategy<Value = String> {
        let level = prop_oneof![level(), Just("*".to_owned())];
        (proptest::collection::vec(level, 1..4), any::<bool>()).prop_map(|(mut levels, gt)| {
            if gt {
                levels.push(">".into());
            }
            levels.join("/")
        })
    }

    /// Whether NATS subject pattern `pattern` matches subject `subject` (the server's rule).
    fn nats_matches(pattern: &str, subject: &str) -> bool {
        let (p, s): (Vec<_>, Vec<_>) = (pattern.split('.').collect(), subject.split('.').collect());
        for (i, tok) in p.iter().enumerate() {
            match *tok {
                ">" => return s.len() > i,
                "*" if i < s.len() => {}
                t if s.get(i) == Some(&t) => {}
                _ => return false,
            }
        }
        p.len() == s.len()
    }

    proptest! {
        #[test]
        fn topics_round_trip_and_never_collide(a in topic(), b in topic()) {
            let (sa, sb) = (to_subject("herald.t", &a), to_subject("herald.t", &b));
            prop_assert_eq!(to_topic("herald.t", &sa), Some(a.clone()));
            prop_assert_eq!(a == b, sa == sb);
            prop_assert!(sa.split('.').skip(2).all(|t| !t.is_empty() && t != "*" && t != ">"
                && t.bytes().all(|c| c.is_ascii_graphic())));
        }

        #[test]
        fn wildcards_match_the_same_topics(p in pattern(), t in topic()) {
            prop_assert_eq!(
                crate::topic::matches(&p, &t),
                nats_matches(&to_subject("h", &p), &to_subject("h", &t))
            );
        }
    }
}
