//! herald's encoding of what it sends: messages, replies and `dropped` notices, as complete
//! WebSocket frames (see [`super::frames`]). A server frame is unmasked, so the same bytes are
//! valid on every connection: a message is encoded once, in its [`SLOT`], and every native
//! subscriber is handed the same refcounted [`Frame`].
//!
//! Messages and notices are written by hand rather than with serde: this is the product's hot
//! path, and serde's general machinery costs many times what writing the few fields does.

use super::frames::{text_frame, ws_header, OpCode, MAX_HEADER};
use super::json::{write_json_str, write_json_utf8, write_u64};
use crate::codec::{Encode, Frame};
use crate::message::{Message, Prefix, TopicHead};
use crate::reply::{DropReason, Reply};
use crate::request::PayloadKind;
use bytes::{BufMut, BytesMut};

/// The message cache slot (and topic prefix slot) herald's own protocol uses.
pub const SLOT: usize = 0;

/// herald's native protocol as a connection's [`Encode`].
#[derive(Clone, Copy, Debug, Default)]
pub struct Native;

impl Native {
    /// A message's one frame, encoded once in its [`SLOT`] and shared.
    #[inline]
    pub fn frame(&self, message: &Message) -> Frame {
        message.encoded(SLOT, encode_message).clone()
    }
}

impl Encode for Native {
    /// Always inline: a drain calls it once per message it sends, and it is a refcounted copy.
    #[inline(always)]
    fn message(&self, message: &Message, out: &mut Vec<Frame>) {
        out.push(self.frame(message));
    }

    fn reply(&self, reply: &Reply) -> Frame {
        encode_reply(reply)
    }

    fn dropped(&self, topic: &str, count: u64, reason: DropReason) -> Frame {
        encode_notice("dropped", topic, count, Some(reason.as_str()))
    }

    fn snapshot(&self, pattern: &str, count: usize) -> Option<Frame> {
        Some(encode_notice("snapshot", pattern, count as u64, None))
    }
}

/// The JSON that every message of a topic shares under one numbering,
/// `{"op":"msg","topic":…,"seq":` and `,"epoch":…`, with the place of the sequence number:
/// written once per numbering, so that encoding a message copies it rather than escaping its
/// topic and epoch again (a large part of encoding a small message).
fn prefix(head: &TopicHead) -> &Prefix {
    head.prefix(SLOT, |head| {
        let mut json = BytesMut::with_capacity(head.name().len() + head.epoch().len() + 40);
        json.put_slice(b"{\"op\":\"msg\",\"topic\":");
        write_json_str(&mut json, head.name());
        json.put_slice(b",\"seq\":");
        let at = json.len();
        json.put_slice(b",\"epoch\":");
        write_json_str(&mut json, head.epoch());
        Prefix {
            bytes: json.to_vec().into_boxed_slice(),
            at,
        }
    })
}

/// Encodes a message: a text payload as the `data` string of a JSON text frame, a binary one
/// after a JSON header in a binary frame (the payload shared, not copied).
fn encode_message(m: &Message) -> Frame {
    let prefix = prefix(m.head());
    let payload = m.payload();
    match m.kind() {
        PayloadKind::Text => {
            // One buffer, one slice to write: the JSON goes after room for the longest
            // WebSocket header, and the header is put right before it once the length is known.
            // `,"data":""` is 10 bytes.
            let mut buf =
                BytesMut::with_capacity(MAX_HEADER + meta_len(prefix, m) + 10 + payload.len());
            buf.put_bytes(0, MAX_HEADER);
            write_meta_fields(&mut buf, prefix, m);
            buf.put_slice(b",\"data\":");
            write_json_utf8(&mut buf, payload);
            buf.put_u8(b'}');
            text_frame(buf)
        }
        PayloadKind::Binary => {
            let mut json = BytesMut::with_capacity(meta_len(prefix, m));
            write_meta_fields(&mut json, prefix, m);
            json.put_u8(b'}');
            let head = ws_header(OpCode::Binary, 4 + json.len() + payload.len());
            let mut buf = BytesMut::with_capacity(head.len() + 4 + json.len());
            buf.put_slice(&head);
            buf.put_u32(json.len() as u32);
            buf.put_slice(&json);
            Frame {
                head: buf.freeze(),
                body: payload.clone(),
            }
        }
    }
}

/// Room for [`write_meta_fields`] and a closing brace: the longest sequence number and time
/// are 20 digits, and a content type is plain unless it is hostile.
fn meta_len(prefix: &Prefix, m: &Message) -> usize {
    prefix.bytes.len() + 20 + m.content_type().map_or(0, |ct| 8 + ct.len()) + 27
}

/// `{"op":"msg","topic":…,"seq":…,"epoch":…[,"ct":…][,"ts":…]` (no closing brace).
fn write_meta_fields(out: &mut BytesMut, prefix: &Prefix, m: &Message) {
    let (before_seq, after_seq) = prefix.bytes.split_at(prefix.at);
    out.put_slice(before_seq);
    write_u64(out, m.seq());
    out.put_slice(after_seq);
    if let Some(ct) = m.content_type() {
        out.put_slice(b",\"ct\":");
        write_json_str(out, ct);
    }
    if let Some(ts) = m.stamp_us() {
        out.put_slice(b",\"ts\":");
        write_u64(out, ts);
    }
}

/// Encodes a reply as a text frame. Not on the fan-out path: serde is fine here.
pub fn encode_reply(reply: &Reply) -> Frame {
    let mut buf = BytesMut::with_capacity(MAX_HEADER + 128);
    buf.put_bytes(0, MAX_HEADER);
    serde_json::to_writer((&mut buf).writer(), reply).expect("replies always serialize");
    text_frame(buf)
}

/// `{"op":op,"topic":topic,"count":count}`, with `"reason":reason` if given: a notice about
/// `count` messages of `topic`. `dropped` (with its reason): that many were not delivered to
/// this connection, sent before the topic's next message (to a conflating subscriber, one per
/// topic per throttle interval). `snapshot`: that many of a subscription's snapshot follow.
fn encode_notice(op: &str, topic: &str, count: u64, reason: Option<&str>) -> Frame {
    let more = op.len() + topic.len() + reason.map_or(0, str::len);
    let mut buf = BytesMut::with_capacity(MAX_HEADER + more + 60);
    buf.put_bytes(0, MAX_HEADER);
    buf.put_slice(b"{\"op\":");
    write_json_str(&mut buf, op);
    buf.put_slice(b",\"topic\":");
    write_json_str(&mut buf, topic);
    buf.put_slice(b",\"count\":");
    write_u64(&mut buf, count);
    if let Some(reason) = reason {
        buf.put_slice(b",\"reason\":");
        write_json_str(&mut buf, reason);
    }
    buf.put_u8(b'}');
    text_frame(buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reply::{Gap, GapReason};
    use crate::test_support::unframe;
    use bytes::Bytes;
    use serde_json::{json, Value};
    use std::sync::Arc;

    /// Message 42 of `head`, with a content type and stamp if given.
    fn message(
        head: &Arc<TopicHead>,
        kind: PayloadKind,
        payload: Bytes,
        ct: Option<&str>,
        ts: Option<u64>,
    ) -> Message {
        Message::new(head.clone(), 42, kind, payload, ct.map(Box::from), ts)
    }

    fn head(topic: &str) -> Arc<TopicHead> {
        TopicHead::new(topic.into(), "e1".into())
    }

    #[test]
    fn text_message_frame_is_valid_json() {
        let payload = Bytes::from_static("quote \"1.08\" \u{1F600}".as_bytes());
        let frame = Native.frame(&message(
            &head("q/fx/EURUSD"),
            PayloadKind::Text,
            payload,
            Some("text/plain"),
            Some(7),
        ));
        let (op, body) = unframe(&frame);
        assert_eq!(op, 0x1);
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            v,
            json!({"op":"msg","topic":"q/fx/EURUSD","seq":42,"epoch":"e1","ct":"text/plain","ts":7,"data":"quote \"1.08\" \u{1F600}"})
        );
    }

    #[test]
    fn a_message_head_escapes_its_topic_and_epoch_once_for_every_message() {
        // An epoch adopted from another node is whatever that node sent.
        let head = TopicHead::new("caméra/ü".into(), "e\"1\\\n".into());
        for seq in [0, 7, u64::MAX] {
            let m = Message::new(
                head.clone(),
                seq,
                PayloadKind::Text,
                Bytes::from_static(b"x"),
                None,
                None,
            );
            let v: Value = serde_json::from_slice(&unframe(&Native.frame(&m)).1).unwrap();
            assert_eq!(
                v,
                json!({"op":"msg","topic":"caméra/ü","seq":seq,"epoch":"e\"1\\\n","data":"x"})
            );
        }
    }

    #[test]
    fn binary_message_frame_shares_the_payload() {
        for size in [0usize, 100, 70_000] {
            let payload = Bytes::from(vec![7u8; size]);
            let frame = Native.frame(&message(
                &head("cam/1"),
                PayloadKind::Binary,
                payload.clone(),
                None,
                None,
            ));
            assert_eq!(frame.body.as_ptr(), payload.as_ptr(), "payload not copied");
            let (op, body) = unframe(&frame);
            assert_eq!(op, 0x2);
            let n = u32::from_be_bytes(body[..4].try_into().unwrap()) as usize;
            let head: Value = serde_json::from_slice(&body[4..4 + n]).unwrap();
            assert_eq!(
                head,
                json!({"op":"msg","topic":"cam/1","seq":42,"epoch":"e1"})
            );
            assert_eq!(&body[4 + n..], &payload[..]);
        }
    }

    /// A message is encoded once, however many connections it is sent to: they share its bytes.
    #[test]
    fn a_message_is_encoded_once_for_every_native_connection() {
        let m = message(&head("t"), PayloadKind::Text, Bytes::from("x"), None, None);
        let (a, b) = (Native.frame(&m), Native.frame(&m.clone()));
        assert_eq!(a.head.as_ptr(), b.head.as_ptr());
    }

    #[test]
    fn replies_serialize_as_documented() {
        let r = Reply::Subscribed {
            id: Some(json!(1)),
            topic: "a/>".into(),
            recovered: false,
            replayed: 2,
            gaps: vec![
                Gap {
                    topic: "a/b".into(),
                    reason: GapReason::HistoryTrimmed { from: 3, to: 9 },
                },
                Gap {
                    topic: "a/c".into(),
                    reason: GapReason::EpochChanged { epoch: "z".into() },
                },
                Gap {
                    topic: "a/d".into(),
                    reason: GapReason::RecoveryLimit { from: 1, to: 4 },
                },
            ],
            cursor: "0a1b2c3d.17".into(),
        };
        let (_, body) = unframe(&encode_reply(&r));
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            v,
            json!({"op":"subscribed","id":1,"topic":"a/>","recovered":false,"replayed":2,"gaps":[
                {"topic":"a/b","reason":"history_trimmed","from":3,"to":9},
                {"topic":"a/c","reason":"epoch_changed","epoch":"z"},
                {"topic":"a/d","reason":"recovery_limit","from":1,"to":4}],
                "cursor":"0a1b2c3d.17"})
        );
        let (_, body) = unframe(&Native.dropped("a/\"é\"", 3, DropReason::Drop));
        assert_eq!(
            serde_json::from_slice::<Value>(&body).unwrap(),
            json!({"op":"dropped","topic":"a/\"é\"","count":3,"reason":"drop"})
        );
    }
}
