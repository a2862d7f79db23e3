//! MQTT topic names and filters as herald topics and patterns (the table in `docs/mqtt.md`).
//!
//! MQTT levels are herald levels, and a level's text is the same on both sides, so that MQTT
//! and native clients name the same topics the same way. Three MQTT levels cannot be herald
//! levels as they are: the empty level (`a//b`, `/a`, `a/`) and the levels `*` and `>`, which
//! are wildcards in herald. They are written with the two characters no MQTT topic name
//! contains, `+` and `#`: the empty level is the herald level `+`, `*` is `#*` and `>` is `#>`.
//! Every MQTT topic name within herald's length limits therefore has a herald topic, and back.
//! Herald topics with another level containing `+` or `#` have no MQTT name: MQTT subscribers
//! are not sent them (refusing them to native publishers would break native clients for the
//! sake of a protocol they may not use).
//!
//! Filters: `+` is `*`, and `#` is `>` (one or more levels) plus, unless it is the whole
//! filter, the parent (`a/#` also matches `a`), so a filter is one or two herald patterns.
//! Herald patterns match a little more than MQTT's filters in one case: a filter starting with
//! a wildcard does not match topics starting with `$` (§4.7.2); [`Filter::excludes_dollar`]
//! says when the protocol layer checks that, with [`mqtt_matches`] as the reference.

use herald_core::topic::{validate_pattern, validate_topic, TopicError};
use std::borrow::Cow;

/// Why an MQTT topic name has no herald topic.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// `+` or `#` in a topic name (the decoder refuses these before they get here).
    #[error("an MQTT topic name cannot contain the wildcards '+' or '#'")]
    Wildcard,
    /// Empty, or longer than herald allows once mapped.
    #[error(transparent)]
    Herald(#[from] TopicError),
}

/// Why an MQTT topic filter is refused (SUBACK 0x8F, topic filter invalid).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FilterError {
    #[error("the topic filter is empty")]
    Empty,
    #[error("'#' must be a whole level and the last one")]
    MultiLevel,
    #[error("'+' must be a whole level")]
    SingleLevel,
    #[error("a shared subscription is $share/{{group}}/{{filter}} with a group name of at least one character and no '/', '+' or '#'")]
    Share,
    /// Longer than herald allows once mapped.
    #[error(transparent)]
    Herald(#[from] TopicError),
}

/// The herald level an MQTT level is.
fn level_to_herald(level: &str) -> &str {
    match level {
        "" => "+",
        "*" => "#*",
        ">" => "#>",
        level => level,
    }
}

/// The MQTT level a herald level is, if it has one.
fn level_to_mqtt(level: &str) -> Option<&str> {
    match level {
        "+" => Some(""),
        "#*" => Some("*"),
        "#>" => Some(">"),
        level if level.contains(['+', '#']) => None,
        level => Some(level),
    }
}

/// The herald topic for an MQTT topic name: the same text unless a level needs writing
/// differently (see the module documentation).
pub fn to_herald_topic(name: &str) -> Result<Cow<'_, str>, NameError> {
    if name.contains(['+', '#']) {
        return Err(NameError::Wildcard);
    }
    if name.is_empty() {
        return Err(TopicError::Empty.into());
    }
    if validate_topic(name).is_ok() {
        return Ok(Cow::Borrowed(name));
    }
    let mapped = name
        .split('/')
        .map(level_to_herald)
        .collect::<Vec<_>>()
        .join("/");
    validate_topic(&mapped)?;
    Ok(Cow::Owned(mapped))
}

/// The MQTT topic name for a herald topic, or `None` when it has none (a level other than
/// `+`, `#*` and `#>` contains `+` or `#`). Borrowed exactly when the name is the topic's own
/// text.
pub fn to_mqtt_topic(topic: &str) -> Option<Cow<'_, str>> {
    if !topic.contains(['+', '#']) {
        return Some(Cow::Borrowed(topic));
    }
    let levels = topic
        .split('/')
        .map(level_to_mqtt)
        .collect::<Option<Vec<_>>>()?;
    let name = levels.join("/");
    // The herald topic `+` alone would be the empty name, which MQTT does not have.
    (!name.is_empty()).then_some(Cow::Owned(name))
}

/// A subscription's filter in herald's terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Filter {
    /// The herald patterns to subscribe: one, or two for `…/#` (the levels below and the
    /// parent). No topic matches both.
    pub patterns: Vec<String>,
    /// The filter starts with a wildcard, so it must not deliver topics whose MQTT name
    /// starts with `$`, which the patterns match.
    pub excludes_dollar: bool,
}

/// The herald patterns for an MQTT topic filter (without a `$share/{group}/` prefix: see
/// [`parse_subscription`]).
pub fn to_herald_patterns(filter: &str) -> Result<Filter, FilterError> {
    if filter.is_empty() {
        return Err(FilterError::Empty);
    }
    let levels: Vec<&str> = filter.split('/').collect();
    let last = levels.len() - 1;
    let mut mapped = Vec::with_capacity(levels.len());
    for (i, &level) in levels.iter().enumerate() {
        mapped.push(match level {
            "#" if i == last => ">",
            "+" => "*",
            _ if level.contains('#') => return Err(FilterError::MultiLevel),
            _ if level.contains('+') => return Err(FilterError::SingleLevel),
            _ => level_to_herald(level),
        });
    }
    let mut patterns = vec![mapped.join("/")];
    if levels.len() > 1 && levels[last] == "#" {
        patterns.push(mapped[..last].join("/"));
    }
    for pattern in &patterns {
        validate_pattern(pattern)?;
    }
    Ok(Filter {
        patterns,
        excludes_dollar: matches!(levels[0], "+" | "#"),
    })
}

/// A SUBSCRIBE or UNSUBSCRIBE filter: a plain filter, or a shared one (`$share/{group}/{filter}`,
/// §4.8.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Subscription<'a> {
    pub share_group: Option<&'a str>,
    pub filter: &'a str,
}

/// Splits off a `$share/{group}/` prefix, checking the group name; the filter after it is
/// checked by [`to_herald_patterns`].
pub fn parse_subscription(text: &str) -> Result<Subscription<'_>, FilterError> {
    let Some(shared) = text.strip_prefix("$share/") else {
        if text == "$share" {
            return Err(FilterError::Share);
        }
        return Ok(Subscription {
            share_group: None,
            filter: text,
        });
    };
    match shared.split_once('/') {
        Some((group, filter))
            if !group.is_empty() && !group.contains(['+', '#']) && !filter.is_empty() =>
        {
            Ok(Subscription {
                share_group: Some(group),
                filter,
            })
        }
        _ => Err(FilterError::Share),
    }
}

/// Whether an MQTT filter matches an MQTT topic name, by MQTT's rules (§4.7): `+` is one
/// level, `#` the levels below and the parent, and a filter starting with a wildcard does not
/// match a name starting with `$`. Assumes a valid filter (no `$share/` prefix) and name.
pub fn mqtt_matches(filter: &str, name: &str) -> bool {
    if name.starts_with('$') && filter.starts_with(['+', '#']) {
        return false;
    }
    let mut f = filter.split('/');
    let mut t = name.split('/');
    loop {
        match (f.next(), t.next()) {
            (Some("#"), _) => return true,
            (Some("+"), Some(_)) => {}
            (Some(fl), Some(tl)) if fl == tl => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use herald_core::topic::matches;

    #[test]
    fn names_map_to_themselves_unless_a_level_cannot() {
        for name in [
            "a",
            "a/b/c",
            "$SYS/broker",
            "sport/tennis",
            "ab*/c>",
            "é/日本",
        ] {
            assert!(matches!(to_herald_topic(name), Ok(Cow::Borrowed(n)) if n == name));
            assert!(matches!(to_mqtt_topic(name), Some(Cow::Borrowed(n)) if n == name));
        }
        for (name, herald) in [
            ("/a", "+/a"),
            ("a/", "a/+"),
            ("a//b", "a/+/b"),
            ("/", "+/+"),
            ("a/*/b", "a/#*/b"),
            (">", "#>"),
            ("*", "#*"),
            ("/finance", "+/finance"),
        ] {
            assert_eq!(to_herald_topic(name).unwrap(), herald);
            assert_eq!(to_mqtt_topic(herald).unwrap(), name);
        }
    }

    #[test]
    fn names_without_a_mapping() {
        assert_eq!(to_herald_topic("a/+"), Err(NameError::Wildcard));
        assert_eq!(to_herald_topic("#"), Err(NameError::Wildcard));
        assert_eq!(to_herald_topic(""), Err(TopicError::Empty.into()));
        // Too long once mapped: 125 empty levels become 249 bytes, 126 would be 251.
        assert!(to_herald_topic(&"/".repeat(124)).is_ok());
        assert!(matches!(
            to_herald_topic(&"/".repeat(125)),
            Err(NameError::Herald(TopicError::TooLong { .. }))
        ));
        assert!(to_herald_topic(&"a".repeat(251)).is_err());
        // Herald topics MQTT cannot name.
        for topic in ["a+b", "a/#", "#", "x/+a", "##*", "+"] {
            assert_eq!(to_mqtt_topic(topic), None, "{topic}");
        }
    }

    #[test]
    fn filters() {
        let patterns = |f: &str| to_herald_patterns(f).unwrap().patterns;
        assert_eq!(patterns("#"), [">"]);
        assert_eq!(patterns("+"), ["*"]);
        assert_eq!(patterns("a/b"), ["a/b"]);
        assert_eq!(patterns("a/+/c"), ["a/*/c"]);
        assert_eq!(patterns("a/#"), ["a/>", "a"]);
        assert_eq!(patterns("+/#"), ["*/>", "*"]);
        assert_eq!(patterns("/#"), ["+/>", "+"]);
        assert_eq!(patterns("a//+"), ["a/+/*"]);
        assert_eq!(patterns("a/*/>"), ["a/#*/#>"]);
        assert_eq!(patterns("$SYS/#"), ["$SYS/>", "$SYS"]);
        assert!(to_herald_patterns("+/a").unwrap().excludes_dollar);
        assert!(to_herald_patterns("#").unwrap().excludes_dollar);
        assert!(!to_herald_patterns("a/#").unwrap().excludes_dollar);
        assert!(!to_herald_patterns("/+").unwrap().excludes_dollar);
        // §4.7.1's invalid examples, and others.
        for (bad, error) in [
            ("sport/tennis#", FilterError::MultiLevel),
            ("sport/tennis/#/ranking", FilterError::MultiLevel),
            ("#/a", FilterError::MultiLevel),
            ("a/b#", FilterError::MultiLevel),
            ("sport+", FilterError::SingleLevel),
            ("a/+b/c", FilterError::SingleLevel),
            ("", FilterError::Empty),
        ] {
            assert_eq!(to_herald_patterns(bad), Err(error), "{bad}");
        }
        assert!(matches!(
            to_herald_patterns(&"a/".repeat(126)),
            Err(FilterError::Herald(_))
        ));
    }

    #[test]
    fn shared_subscriptions() {
        let shared = |text| parse_subscription(text).map(|s| (s.share_group, s.filter));
        assert_eq!(shared("$share/g/a/#"), Ok((Some("g"), "a/#")));
        assert_eq!(
            shared("$share/consumer1/sport/tennis/+"),
            Ok((Some("consumer1"), "sport/tennis/+"))
        );
        assert_eq!(shared("$share/g//a"), Ok((Some("g"), "/a")));
        assert_eq!(shared("a/b"), Ok((None, "a/b")));
        assert_eq!(shared("$SYS/#"), Ok((None, "$SYS/#")));
        assert_eq!(shared("$sharefoo/a"), Ok((None, "$sharefoo/a")));
        for bad in [
            "$share",
            "$share/",
            "$share/g",
            "$share/g/",
            "$share//a",
            "$share/+/a",
            "$share/a#/b",
        ] {
            assert_eq!(shared(bad), Err(FilterError::Share), "{bad}");
        }
    }

    #[test]
    fn matching_examples_from_the_specification() {
        for (filter, name, want) in [
            ("sport/tennis/player1/#", "sport/tennis/player1", true),
            (
                "sport/tennis/player1/#",
                "sport/tennis/player1/ranking",
                true,
            ),
            (
                "sport/tennis/player1/#",
                "sport/tennis/player1/score/wimbledon",
                true,
            ),
            ("sport/#", "sport", true),
            ("sport/tennis/+", "sport/tennis/player1", true),
            ("sport/tennis/+", "sport/tennis/player1/ranking", false),
            ("sport/+", "sport", false),
            ("sport/+", "sport/", true),
            ("+/+", "/finance", true),
            ("/+", "/finance", true),
            ("+", "/finance", false),
            ("#", "$SYS/monitor/Clients", false),
            ("+/monitor/Clients", "$SYS/monitor/Clients", false),
            ("$SYS/#", "$SYS/monitor/Clients", true),
            ("$SYS/monitor/+", "$SYS/monitor/Clients", true),
            ("#", "a/b", true),
        ] {
            assert_eq!(mqtt_matches(filter, name), want, "{filter} {name}");
        }
    }

    /// MQTT matching written independently of [`mqtt_matches`]: over level lists, recursively.
    fn brute(filter: &[&str], name: &[&str]) -> bool {
        match (filter.split_first(), name.split_first()) {
            (Some((&"#", rest)), _) => rest.is_empty(),
            (Some((&"+", f)), Some((_, n))) => brute(f, n),
            (Some((fl, f)), Some((nl, n))) => fl == nl && brute(f, n),
            (None, None) => true,
            _ => false,
        }
    }

    /// Every sequence of 1 to `max` levels from `alphabet`, joined with `/`.
    fn generate(alphabet: &[&str], max: usize) -> Vec<String> {
        let mut all: Vec<Vec<&str>> = alphabet.iter().map(|l| vec![*l]).collect();
        let mut last = all.clone();
        for _ in 1..max {
            last = last
                .iter()
                .flat_map(|p| alphabet.iter().map(move |l| [p.clone(), vec![*l]].concat()))
                .collect();
            all.extend(last.iter().cloned());
        }
        all.into_iter().map(|levels| levels.join("/")).collect()
    }

    #[test]
    fn the_mapping_agrees_with_brute_force_mqtt_matching() {
        // Names with their herald topics; the empty name is not a topic name.
        let names: Vec<(String, String)> = generate(&["a", "b", "", "$x", "*", ">", "a*"], 4)
            .into_iter()
            .filter(|name| !name.is_empty())
            .map(|name| {
                let topic = to_herald_topic(&name).unwrap().into_owned();
                assert_eq!(to_mqtt_topic(&topic).as_deref(), Some(name.as_str()));
                (name, topic)
            })
            .collect();
        let mut filters = generate(&["a", "", "$x", "*", ">", "+"], 3);
        filters.extend(
            generate(&["a", "", "$x", "+", "*"], 2)
                .iter()
                .map(|f| format!("{f}/#")),
        );
        filters.push("#".into());
        filters.retain(|f| !f.is_empty());
        let mut checked = 0;
        for filter in &filters {
            let f = to_herald_patterns(filter).unwrap_or_else(|e| panic!("{filter}: {e}"));
            let f_levels: Vec<&str> = filter.split('/').collect();
            for (name, topic) in &names {
                let dollar = name.starts_with('$') && matches!(f_levels[0], "+" | "#");
                let want = !dollar && brute(&f_levels, &name.split('/').collect::<Vec<_>>());
                assert_eq!(mqtt_matches(filter, name), want, "{filter} {name}");
                let hits = f.patterns.iter().filter(|p| matches(p, topic)).count();
                assert!(hits <= 1, "{filter} {name}: patterns overlap");
                let delivered = hits == 1 && !(f.excludes_dollar && name.starts_with('$'));
                assert_eq!(
                    delivered, want,
                    "{filter} {name} ({topic}, {:?})",
                    f.patterns
                );
                checked += 1;
            }
        }
        assert!(checked > 100_000, "{checked}");
    }

    #[test]
    fn herald_topics_mqtt_cannot_name_are_the_only_ones_skipped() {
        // Herald topics from levels that include ones MQTT has no name for.
        for topic in generate(&["a", "+", "#*", "#>", "a+", "#", "b#c"], 3) {
            let nameable = topic
                .split('/')
                .all(|l| !l.contains(['+', '#']) || matches!(l, "+" | "#*" | "#>"))
                && topic != "+";
            match to_mqtt_topic(&topic) {
                Some(name) => {
                    assert!(nameable, "{topic}");
                    assert_eq!(to_herald_topic(&name).unwrap(), topic);
                }
                None => assert!(!nameable, "{topic}"),
            }
        }
    }
}
