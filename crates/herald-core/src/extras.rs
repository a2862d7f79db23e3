//! What a message may carry besides herald's own fields: an expiry, and metadata a protocol
//! carries from its publisher to its subscribers unchanged (MQTT 5.0's user properties,
//! response topic, correlation data and retain flag).
//!
//! Rare beside plain messages, so a message holds it behind one optional pointer
//! ([`crate::message::Message::extras`]): a message without any costs nothing more. Neutral in
//! form (names and values, not one protocol's bytes), so that any protocol may map it to its
//! own (STOMP headers, a reply-to); a protocol that has no place for a field ignores it.

use bytes::Bytes;
use std::sync::{Arc, LazyLock};

/// The extras of a message published at most once that carries nothing else: one for all of
/// them, so that such a message costs a reference count, not an allocation, and a protocol
/// can tell it from one that carries more by its address ([`Extras::is_at_most_once_alone`]).
static AT_MOST_ONCE: LazyLock<Arc<Extras>> = LazyLock::new(|| {
    Arc::new(Extras {
        at_most_once: true,
        ..Extras::default()
    })
});

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Extras {
    /// When the message expires (µs since the UNIX epoch): from then on it is not delivered,
    /// neither replayed from history nor sent from a queue by a protocol that knows expiry.
    pub expires_us: Option<u64>,
    /// The publisher asked for the message to be retained (MQTT's retain flag), which a
    /// subscriber may ask to see (MQTT's retain as published).
    pub retain: bool,
    /// The publisher sent it at most once (MQTT QoS 0): a subscriber that asked for more is
    /// sent it at most once too (MQTT sends the lower of the two).
    pub at_most_once: bool,
    /// Where the publisher expects a reply (MQTT's response topic), as it named it.
    pub response_topic: Option<Box<str>>,
    /// What ties a reply to its request (MQTT's correlation data).
    pub correlation: Option<Bytes>,
    /// Name and value pairs in the publisher's order, a name possibly repeated (MQTT's user
    /// properties).
    pub user_properties: Vec<(String, String)>,
}

impl Extras {
    /// The one shared [`Extras`] of a message published at most once that carries nothing
    /// else.
    pub fn at_most_once_alone() -> Arc<Extras> {
        AT_MOST_ONCE.clone()
    }

    /// Whether `extras` is the shared one of [`Extras::at_most_once_alone`].
    pub fn is_at_most_once_alone(extras: &Arc<Extras>) -> bool {
        Arc::ptr_eq(extras, &AT_MOST_ONCE)
    }

    /// Whether the message has expired at `now_us`.
    pub fn expired(&self, now_us: u64) -> bool {
        self.expires_us.is_some_and(|at| now_us >= at)
    }

    /// What it adds to a message's size ([`crate::message::Message::size`]): the bytes of its
    /// fields, as a queue or history holds them.
    pub fn size(&self) -> usize {
        self.response_topic.as_deref().map_or(0, str::len)
            + self.correlation.as_ref().map_or(0, Bytes::len)
            + self
                .user_properties
                .iter()
                .map(|(k, v)| k.len() + v.len())
                .sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiry_is_inclusive_and_optional() {
        let e = Extras {
            expires_us: Some(10),
            ..Extras::default()
        };
        assert!(!e.expired(9));
        assert!(e.expired(10));
        assert!(!Extras::default().expired(u64::MAX));
    }

    #[test]
    fn size_counts_the_carried_bytes() {
        let e = Extras {
            response_topic: Some("r/t".into()),
            correlation: Some(Bytes::from_static(b"12")),
            user_properties: vec![("a".into(), "bc".into()), ("a".into(), "".into())],
            ..Extras::default()
        };
        assert_eq!(e.size(), 3 + 2 + 3 + 1);
    }
}
