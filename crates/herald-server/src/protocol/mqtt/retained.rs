//! MQTT's retained messages: per topic, the last message published with the retain flag, sent
//! to each new matching subscription (§3.3.1.3).
//!
//! Kept beside the engine rather than taken from a topic's last value: herald keeps the last
//! message of every topic, whoever published it and however, while MQTT retains only messages
//! published with retain, and an empty retained payload removes the topic's entry rather than
//! becoming it. A native client's `snapshot` is the topic's last value, which is the retained
//! message only when nothing was published to the topic since without retain.
//!
//! A retained message whose expiry interval has passed is let go at the next lookup.
//!
//! Bounded by entries (the node's `max_topics`); a lookup for a filter goes through every
//! entry, as a broker without a retained-message index does.

use super::topic::{mqtt_matches, to_mqtt_topic};
use super::QoS;
use bytes::Bytes;
use herald_core::extras::Extras;
use herald_core::request::PayloadKind;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

/// One retained message, as it is sent again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retained {
    pub payload: Bytes,
    pub kind: PayloadKind,
    pub content_type: Option<String>,
    /// The QoS it was published with: a subscriber gets the lower of this and its own.
    pub qos: QoS,
    /// Its 5.0 properties and expiry ([`super::extras`]).
    pub extras: Option<Arc<Extras>>,
}

/// The store is full: a new topic cannot retain a message (PUBACK 0x97, quota exceeded).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("herald retains at most {0} MQTT messages (max_topics)")]
pub struct Full(pub usize);

/// Every retained message of a node, by herald topic.
#[derive(Debug)]
pub struct RetainedStore {
    entries: Mutex<HashMap<Box<str>, Retained>>,
    max_entries: usize,
}

impl RetainedStore {
    pub fn new(max_entries: usize) -> RetainedStore {
        RetainedStore {
            entries: Mutex::default(),
            max_entries,
        }
    }

    /// A message published with retain on herald topic `topic`: retained, or, with an empty
    /// payload, the topic's retained message removed.
    pub fn publish(&self, topic: &str, message: Retained) -> Result<(), Full> {
        let mut entries = self.entries.lock();
        if message.payload.is_empty() {
            entries.remove(topic);
            return Ok(());
        }
        if let Some(entry) = entries.get_mut(topic) {
            *entry = message;
            return Ok(());
        }
        if entries.len() >= self.max_entries {
            return Err(Full(self.max_entries));
        }
        entries.insert(topic.into(), message);
        Ok(())
    }

    /// The retained messages whose topics MQTT filter `filter` matches at `now_us`, with their
    /// MQTT topic names (herald topics without one are left out). Expired ones are let go.
    pub fn matching(&self, filter: &str, now_us: u64) -> Vec<(String, Retained)> {
        let mut entries = self.entries.lock();
        entries.retain(|_, m| !m.extras.as_ref().is_some_and(|e| e.expired(now_us)));
        entries
            .iter()
            .filter_map(|(topic, message)| {
                let name = to_mqtt_topic(topic)?;
                mqtt_matches(filter, &name).then(|| (name.into_owned(), message.clone()))
            })
            .collect()
    }

    pub fn len(&self) -> usize {
        self.entries.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(payload: &'static [u8]) -> Retained {
        Retained {
            payload: Bytes::from_static(payload),
            kind: PayloadKind::Binary,
            content_type: None,
            qos: QoS::AtLeastOnce,
            extras: None,
        }
    }

    #[test]
    fn only_the_last_retained_message_is_kept_and_an_empty_one_clears_it() {
        let store = RetainedStore::new(10);
        store.publish("a/b", msg(b"1")).unwrap();
        store.publish("a/b", msg(b"2")).unwrap();
        assert_eq!(store.matching("a/b", 0), vec![("a/b".into(), msg(b"2"))]);
        store.publish("a/b", msg(b"")).unwrap();
        assert!(store.matching("a/b", 0).is_empty());
        assert!(store.is_empty());
    }

    #[test]
    fn filters_match_as_mqtt_matches_them() {
        let store = RetainedStore::new(10);
        store.publish("a/b", msg(b"1")).unwrap();
        store.publish("a", msg(b"2")).unwrap();
        store.publish("$SYS/x", msg(b"3")).unwrap();
        // The empty MQTT level is the herald level `+`.
        store.publish("a/+", msg(b"4")).unwrap();
        let mut names: Vec<String> = store.matching("a/#", 0).into_iter().map(|m| m.0).collect();
        names.sort();
        assert_eq!(names, ["a", "a/", "a/b"]);
        assert_eq!(
            store.matching("#", 0).len(),
            3,
            "a leading wildcard skips $ topics"
        );
        assert_eq!(store.matching("$SYS/#", 0).len(), 1);
    }

    #[test]
    fn an_expired_message_is_no_longer_retained() {
        let store = RetainedStore::new(10);
        let expiring = Retained {
            extras: Some(Arc::new(Extras {
                expires_us: Some(100),
                ..Extras::default()
            })),
            ..msg(b"1")
        };
        store.publish("a", expiring).unwrap();
        assert_eq!(store.matching("a", 99).len(), 1);
        assert!(store.matching("a", 100).is_empty());
        assert!(store.is_empty());
    }

    #[test]
    fn a_full_store_refuses_new_topics_but_replaces_and_clears() {
        let store = RetainedStore::new(1);
        store.publish("a", msg(b"1")).unwrap();
        assert_eq!(store.publish("b", msg(b"1")), Err(Full(1)));
        store.publish("a", msg(b"2")).unwrap();
        store.publish("a", msg(b"")).unwrap();
        store.publish("b", msg(b"1")).unwrap();
    }
}
