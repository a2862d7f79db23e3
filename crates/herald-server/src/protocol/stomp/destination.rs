//! STOMP destinations ↔ herald topics and patterns (the tables in `docs/stomp.md`).
//!
//! Every destination herald accepts is `/topic/<rest>`. How `<rest>` is read is one server-wide
//! [`Dialect`], because the two conventions clash on `.`: herald's topics may contain `.`
//! inside a level (`hosts/web1.example.com`), while RabbitMQ and ActiveMQ clients separate
//! levels with it. One reading per server keeps every destination meaning exactly one thing.
//!
//! - [`Dialect::Herald`]: `<rest>` is a herald topic or pattern as written: levels separated by
//!   `/`, `*` one level, a trailing `>` one or more levels; `.` and `#` are ordinary characters.
//! - [`Dialect::Dotted`]: `<rest>` separates levels with `.`, level for level: `*` is one level,
//!   a trailing `>` (ActiveMQ) one or more levels, a trailing `#` (RabbitMQ) zero or more, which
//!   takes two herald patterns (`a.#` is `a` and `a/>`; `#` alone is `>`, herald topics having
//!   at least one level). `#` elsewhere and `/` anywhere are refused: herald patterns cannot say
//!   the first, and a herald level cannot hold the second.
//!
//! MESSAGE frames carry [`destination_of`] the message's topic in the server's dialect (the
//! form a SEND to that topic uses), whatever form the subscription was written in: one form
//! for every subscriber keeps the MESSAGE head shared, and a topic published by a non-STOMP
//! client has no other form to echo. STOMP clients dispatch by `subscription`, not destination.

use herald_core::topic::{self, TopicError};

/// How `/topic/<rest>` is read: see the module doc. Configured as `stomp_dialect`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dialect {
    #[default]
    Herald,
    Dotted,
}

const TOPIC: &str = "/topic/";
/// Destinations of other brokers' queues and exchanges, refused by name.
const QUEUES: [&str; 5] = [
    "/queue/",
    "/amq/queue/",
    "/exchange/",
    "/temp-queue/",
    "/reply-queue/",
];

/// Why a destination names no herald topic or pattern; its text is for the client's ERROR.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DestinationError {
    #[error(
        "destination {0:?}: herald has topics only (no queues or exchanges); use /topic/<topic>"
    )]
    Queue(String),
    #[error("destination {0:?} is not /topic/<topic>")]
    NotTopic(String),
    #[error("destination {0:?} has '/'; this server writes levels with '.' (/topic/a.b.c)")]
    SlashInDotted(String),
    #[error("destination {0:?} has '#' before its last level; '#' may only end a destination")]
    HashNotLast(String),
    #[error("destination {0:?} ends in the wildcard '#'; publish to an exact destination")]
    PublishToHash(String),
    #[error("destination {destination:?}: {error}")]
    Topic {
        destination: String,
        error: TopicError,
    },
}

/// The herald topic a SEND to `destination` publishes on.
pub fn publish_topic(destination: &str, dialect: Dialect) -> Result<String, DestinationError> {
    let rest = rest(destination)?;
    let topic = match dialect {
        Dialect::Herald => rest.to_owned(),
        Dialect::Dotted => {
            let levels = dotted_levels(destination, rest)?;
            if levels.last() == Some(&"#") {
                return Err(DestinationError::PublishToHash(shown(destination)));
            }
            levels.join("/")
        }
    };
    topic::validate_topic(&topic).map_err(|error| topic_error(destination, error))?;
    Ok(topic)
}

/// The herald patterns a SUBSCRIBE to `destination` subscribes to: one, or two for a dotted
/// destination ending in `#` (they never match the same topic, so no message comes twice).
pub fn subscription_patterns(
    destination: &str,
    dialect: Dialect,
) -> Result<Vec<String>, DestinationError> {
    let rest = rest(destination)?;
    let patterns = match dialect {
        Dialect::Herald => vec![rest.to_owned()],
        Dialect::Dotted => {
            let mut levels = dotted_levels(destination, rest)?;
            if levels.last() == Some(&"#") {
                levels.pop();
                if levels.is_empty() {
                    vec![">".to_owned()]
                } else {
                    let exact = levels.join("/");
                    vec![format!("{exact}/>"), exact]
                }
            } else {
                vec![levels.join("/")]
            }
        }
    };
    for pattern in &patterns {
        topic::validate_pattern(pattern).map_err(|error| topic_error(destination, error))?;
    }
    Ok(patterns)
}

/// The destination of a MESSAGE on `topic` (a valid herald topic). In the dotted dialect a
/// topic whose levels cannot be written with `.` (a level holding `.` or being `#`, published
/// by a non-STOMP client) keeps its herald form: no dotted destination names it, and with two
/// or more levels its `/` tells it apart from every dotted one; a single level holding `.`
/// (`v1.2`) reads back as dotted levels, the one case where the destination only informs.
///
/// Built for every MESSAGE: the levels are looked at only when the topic holds a `#`, and the
/// destination is written into one allocation.
pub fn destination_of(topic: &str, dialect: Dialect) -> String {
    let dotted = dialect == Dialect::Dotted
        && !topic.contains('.')
        && !(topic.contains('#') && topic.split('/').any(|level| level == "#"));
    let mut destination = String::with_capacity(TOPIC.len() + topic.len());
    destination.push_str(TOPIC);
    match dotted {
        true => destination.extend(topic.chars().map(|c| if c == '/' { '.' } else { c })),
        false => destination.push_str(topic),
    }
    destination
}

fn rest(destination: &str) -> Result<&str, DestinationError> {
    if let Some(rest) = destination.strip_prefix(TOPIC) {
        return Ok(rest);
    }
    if QUEUES.iter().any(|q| destination.starts_with(q)) {
        return Err(DestinationError::Queue(shown(destination)));
    }
    Err(DestinationError::NotTopic(shown(destination)))
}

/// The levels of a dotted `<rest>`, `#` allowed only last.
fn dotted_levels<'a>(destination: &str, rest: &'a str) -> Result<Vec<&'a str>, DestinationError> {
    if rest.contains('/') {
        return Err(DestinationError::SlashInDotted(shown(destination)));
    }
    let levels: Vec<&str> = rest.split('.').collect();
    if levels.iter().rev().skip(1).any(|l| *l == "#") {
        return Err(DestinationError::HashNotLast(shown(destination)));
    }
    Ok(levels)
}

fn topic_error(destination: &str, error: TopicError) -> DestinationError {
    DestinationError::Topic {
        destination: shown(destination),
        error,
    }
}

/// A destination quoted in an error, cut to 80 characters.
fn shown(destination: &str) -> String {
    destination.chars().take(80).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use herald_core::topic::matches;

    fn subscribe(d: &str, dialect: Dialect) -> Vec<String> {
        subscription_patterns(d, dialect).unwrap_or_else(|e| panic!("{d}: {e}"))
    }

    #[test]
    fn herald_dialect_is_herald_syntax_verbatim() {
        let h = Dialect::Herald;
        assert_eq!(
            publish_topic("/topic/quotes/fx/EURUSD", h).unwrap(),
            "quotes/fx/EURUSD"
        );
        assert_eq!(
            publish_topic("/topic/hosts/web1.example.com", h).unwrap(),
            "hosts/web1.example.com"
        );
        assert_eq!(publish_topic("/topic/a.b.c", h).unwrap(), "a.b.c");
        assert_eq!(publish_topic("/topic/a/#", h).unwrap(), "a/#");
        assert_eq!(subscribe("/topic/quotes/*/EURUSD", h), ["quotes/*/EURUSD"]);
        assert_eq!(subscribe("/topic/quotes/>", h), ["quotes/>"]);
        assert_eq!(subscribe("/topic/>", h), [">"]);
        assert_eq!(subscribe("/topic/a.*", h), ["a.*"]);
    }

    #[test]
    fn dotted_dialect_maps_level_for_level() {
        let d = Dialect::Dotted;
        assert_eq!(
            publish_topic("/topic/quotes.fx.EURUSD", d).unwrap(),
            "quotes/fx/EURUSD"
        );
        assert_eq!(publish_topic("/topic/single", d).unwrap(), "single");
        assert_eq!(subscribe("/topic/quotes.*.EURUSD", d), ["quotes/*/EURUSD"]);
        assert_eq!(subscribe("/topic/quotes.>", d), ["quotes/>"]);
        assert_eq!(
            subscribe("/topic/quotes.fx.#", d),
            ["quotes/fx/>", "quotes/fx"]
        );
        assert_eq!(subscribe("/topic/*.#", d), ["*/>", "*"]);
        assert_eq!(subscribe("/topic/#", d), [">"]);
        assert_eq!(subscribe("/topic/>", d), [">"]);
    }

    #[test]
    fn rabbit_hash_matches_zero_or_more_levels_and_nothing_twice() {
        let patterns = subscribe("/topic/a.b.#", Dialect::Dotted);
        for (topic, want) in [
            ("a/b", true),
            ("a/b/c", true),
            ("a/b/c/d", true),
            ("a", false),
            ("a/bc", false),
            ("x/a/b", false),
        ] {
            let hits = patterns.iter().filter(|p| matches(p, topic)).count();
            assert_eq!(hits, usize::from(want), "{topic}");
        }
        // `*` is exactly one level and `>` one or more, in both dialects.
        let star = subscribe("/topic/a.*", Dialect::Dotted);
        assert!(matches(&star[0], "a/b") && !matches(&star[0], "a/b/c") && !matches(&star[0], "a"));
        let gt = subscribe("/topic/a.>", Dialect::Dotted);
        assert!(matches(&gt[0], "a/b/c") && !matches(&gt[0], "a"));
    }

    #[test]
    fn refuses_what_names_no_topic() {
        use DestinationError as E;
        for dialect in [Dialect::Herald, Dialect::Dotted] {
            for q in [
                "/queue/orders",
                "/amq/queue/x",
                "/exchange/amq.topic/a",
                "/temp-queue/r",
                "/reply-queue/r",
            ] {
                let err = publish_topic(q, dialect).unwrap_err();
                assert!(matches!(err, E::Queue(_)), "{q}: {err}");
                assert!(err.to_string().contains("topics only"), "{err}");
                assert!(matches!(
                    subscription_patterns(q, dialect),
                    Err(E::Queue(_))
                ));
            }
            for other in ["", "topic/a", "/topics/a", "/Topic/a", "a.b"] {
                assert!(
                    matches!(publish_topic(other, dialect), Err(E::NotTopic(_))),
                    "{other}"
                );
            }
            for bad in ["/topic/", "/topic/a\0b"] {
                assert!(
                    matches!(publish_topic(bad, dialect), Err(E::Topic { .. })),
                    "{bad}"
                );
            }
        }
        let h = Dialect::Herald;
        assert!(matches!(
            publish_topic("/topic/a//b", h),
            Err(E::Topic { .. })
        ));
        let err = publish_topic("/topic/a/*", h).unwrap_err();
        assert!(
            matches!(
                &err,
                E::Topic {
                    error: TopicError::Wildcard { .. },
                    ..
                }
            ),
            "{err}"
        );
        assert!(matches!(
            subscription_patterns("/topic/a/>/b", h),
            Err(E::Topic { .. })
        ));
        let d = Dialect::Dotted;
        assert!(matches!(
            publish_topic("/topic/a/b", d),
            Err(E::SlashInDotted(_))
        ));
        assert!(matches!(
            subscription_patterns("/topic/a.#.b", d),
            Err(E::HashNotLast(_))
        ));
        assert!(matches!(
            subscription_patterns("/topic/#.#", d),
            Err(E::HashNotLast(_))
        ));
        assert!(matches!(
            publish_topic("/topic/a.#", d),
            Err(E::PublishToHash(_))
        ));
        assert!(matches!(
            publish_topic("/topic/a.*", d),
            Err(E::Topic { .. })
        ));
        assert!(matches!(
            publish_topic("/topic/a..b", d),
            Err(E::Topic { .. })
        ));
        assert!(matches!(
            subscription_patterns("/topic/a.>.b", d),
            Err(E::Topic { .. })
        ));
        assert!(matches!(
            subscription_patterns("/topic/.a", d),
            Err(E::Topic { .. })
        ));
    }

    #[test]
    fn message_destinations_read_back_as_their_topic() {
        for topic in ["a", "quotes/fx/EURUSD", "x/y.z", "a/#", "ü/ñ"] {
            for dialect in [Dialect::Herald, Dialect::Dotted] {
                let dest = destination_of(topic, dialect);
                match publish_topic(&dest, dialect) {
                    Ok(back) => assert_eq!(back, topic, "{dest}"),
                    // A topic the dotted dialect cannot name keeps its `/` form, which no
                    // dotted destination has.
                    Err(DestinationError::SlashInDotted(_)) => {
                        assert_eq!(dest, format!("/topic/{topic}"))
                    }
                    Err(e) => panic!("{topic} → {dest}: {e}"),
                }
            }
        }
        assert_eq!(destination_of("a/b/c", Dialect::Dotted), "/topic/a.b.c");
        assert_eq!(destination_of("a/b/c", Dialect::Herald), "/topic/a/b/c");
        assert_eq!(destination_of("a/b.c", Dialect::Dotted), "/topic/a/b.c");
        assert_eq!(destination_of("v1.2", Dialect::Dotted), "/topic/v1.2");
    }
}
