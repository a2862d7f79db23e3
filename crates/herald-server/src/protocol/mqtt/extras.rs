//! MQTT 5.0's message properties as herald carries them ([`Extras`]), and back.
//!
//! A PUBLISH's user properties, response topic and correlation data reach MQTT 5.0
//! subscribers unchanged, in the publisher's order; its message expiry interval becomes a
//! deadline, so that what a subscriber is sent is the interval less the time the message
//! waited in herald (§3.3.2.3.3); its retain flag is kept for subscriptions that ask for it
//! (retain as published). The payload format indicator and content type are herald's own
//! fields (text, `ct`), not extras. A message that has none of these carries no extras.

use super::packet::MessageProperties;
use herald_core::extras::Extras;
use herald_core::request::PayloadKind;
use std::sync::Arc;

/// What a PUBLISH (or will) with properties `m` and retain flag `retain`, received at
/// `now_us`, carries through herald besides its payload, if anything.
pub fn extras_of(m: &MessageProperties, retain: bool, now_us: u64) -> Option<Arc<Extras>> {
    let carried = retain
        || m.message_expiry_interval.is_some()
        || m.response_topic.is_some()
        || m.correlation_data.is_some()
        || !m.user_properties.is_empty();
    carried.then(|| {
        Arc::new(Extras {
            expires_us: m
                .message_expiry_interval
                .map(|secs| now_us.saturating_add(u64::from(secs) * 1_000_000)),
            retain,
            response_topic: m.response_topic.as_deref().map(Box::from),
            correlation: m.correlation_data.clone(),
            user_properties: m.user_properties.clone(),
        })
    })
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
        let e = extras_of(&m, true, 1_000_000).unwrap();
        assert_eq!(e.expires_us, Some(11_000_000));
        assert!(e.retain);
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
    fn a_plain_message_carries_nothing() {
        assert!(extras_of(&MessageProperties::default(), false, 0).is_none());
        let only_retain = extras_of(&MessageProperties::default(), true, 0).unwrap();
        assert_eq!(only_retain.expires_us, None);
    }
}
