//! MQTT 5.0's message properties as herald carries them ([`Extras`]), and back.
//!
//! A PUBLISH's user properties, response topic and correlation data reach MQTT 5.0
//! subscribers unchanged, in the publisher's order; its message expiry interval becomes a
//! deadline, so that what a subscriber is sent is the interval less the time the message
//! waited in herald (§3.3.2.3.3); its retain flag is kept for subscriptions that ask for it
//! (retain as published); so is its QoS when it is 0, so that a subscriber is sent it at
//! QoS 0 whatever its subscription grants (§3.8.4: the lower of the two). The payload format
//! indicator and content type are herald's own fields (text, `ct`), not extras. A message
//! that has none of these carries no extras; a QoS 0 message with nothing else shares one
//! [`Extras`] with every other.

use super::packet::MessageProperties;
use super::QoS;
use herald_core::extras::Extras;
use herald_core::request::PayloadKind;
use std::sync::Arc;

/// What a PUBLISH (or will) at `qos` with properties `m` and retain flag `retain`, received
/// at `now_us`, carries through herald besides its payload, if anything.
pub fn extras_of(
    m: &MessageProperties,
    retain: bool,
    qos: QoS,
    now_us: u64,
) -> Option<Arc<Extras>> {
    let at_most_once = qos == QoS::AtMostOnce;
    let carried = retain
        || m.message_expiry_interval.is_some()
        || m.response_topic.is_some()
        || m.correlation_data.is_some()
        || !m.user_properties.is_empty();
    if !carried {
        return at_most_once.then(Extras::at_most_once_alone);
    }
    Some(Arc::new(Extras {
        expires_us: m
            .message_expiry_interval
            .map(|secs| now_us.saturating_add(u64::from(secs) * 1_000_000)),
        retain,
        at_most_once,
        response_topic: m.response_topic.as_deref().map(Box::from),
        correlation: m.correlation_data.clone(),
        user_properties: m.user_properties.clone(),
    }))
}

/// Whether a message's extras leave its QoS 0 PUBLISH as a message without any would have it
/// (none, or the QoS 0 mark alone).
pub fn plain(extras: Option<&Arc<Extras>>) -> bool {
    extras.is_none_or(Extras::is_at_most_once_alone)
}

/// Whether the message was published at QoS 0 (one from a native client, a STOMP client or
/// another node was not).
pub fn at_most_once(extras: Option<&Arc<Extras>>) -> bool {
    extras.is_some_and(|e| e.at_most_once)
}

/// The message expiry interval to send at `now_us` (whole seconds left, rounded up so that a
/// message still alive never says 0), if the message has one. Assumes it has not expired.
pub fn seconds_left(extras: Option<&Extras>, now_us: u64) -> Option<u32> {
    let at = extras?.expires_us?;
    let left = at.saturating_sub(now_us).div_ceil(1_000_000);
    Some(u32::try_from(left).unwrap_or(u32::MAX))
}

/// The properties every subscriber's PUBLISH of a message carries (all but the expiry
/// interval, which [`seconds_left`] gives each): herald's text is payload format indicator 1
/// and its content type is MQTT's.
pub fn properties(
    kind: PayloadKind,
    content_type: Option<&str>,
    extras: Option<&Extras>,
) -> MessageProperties {
    let mut m = MessageProperties {
        payload_utf8: kind == PayloadKind::Text,
        content_type: content_type.map(str::to_owned),
        ..MessageProperties::default()
    };
    if let Some(e) = extras {
        m.response_topic = e.response_topic.as_deref().map(str::to_owned);
        m.correlation_data = e.correlation.clone();
        m.user_properties = e.user_properties.clone();
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[test]
    fn properties_go_through_and_the_expiry_counts_down() {
        let m = MessageProperties {
            payload_utf8: true,
            message_expiry_interval: Some(10),
            content_type: Some("text/plain".into()),
            response_topic: Some("reply/here".into()),
            correlation_data: Some(Bytes::from_static(b"\x00id")),
            user_properties: vec![("b".into(), "1".into()), ("a".into(), "2".into())],
        };
        let e = extras_of(&m, true, QoS::AtLeastOnce, 1_000_000).unwrap();
        assert_eq!(e.expires_us, Some(11_000_000));
        assert!(e.retain);
        assert!(!at_most_once(Some(&e)));
        let back = properties(PayloadKind::Text, Some("text/plain"), Some(&e));
        assert_eq!(
            back,
            MessageProperties {
                message_expiry_interval: None,
                ..m
            }
        );
        assert_eq!(seconds_left(Some(&e), 1_000_000), Some(10));
        assert_eq!(seconds_left(Some(&e), 1_500_000), Some(10));
        assert_eq!(seconds_left(Some(&e), 10_000_001), Some(1));
        assert_eq!(seconds_left(None, 0), None);
    }

    #[test]
    fn a_plain_message_carries_nothing_but_its_qos_0() {
        let none = MessageProperties::default();
        assert!(extras_of(&none, false, QoS::AtLeastOnce, 0).is_none());
        assert!(extras_of(&none, false, QoS::ExactlyOnce, 0).is_none());
        let only_retain = extras_of(&none, true, QoS::AtLeastOnce, 0).unwrap();
        assert_eq!(only_retain.expires_us, None);
        assert!(!plain(Some(&only_retain)));
        // QoS 0 alone: the one shared mark, which changes nothing in a QoS 0 PUBLISH.
        let (a, b) = (
            extras_of(&none, false, QoS::AtMostOnce, 0),
            extras_of(&none, false, QoS::AtMostOnce, 0),
        );
        assert!(Arc::ptr_eq(a.as_ref().unwrap(), b.as_ref().unwrap()));
        assert!(plain(a.as_ref()) && at_most_once(a.as_ref()));
        assert_eq!(a.unwrap().size(), 0);
        let retained_qos0 = extras_of(&none, true, QoS::AtMostOnce, 0);
        assert!(at_most_once(retained_qos0.as_ref()) && !plain(retained_qos0.as_ref()));
    }
}
