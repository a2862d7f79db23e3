//! herald's decoding of client requests: a text frame is one JSON object, a binary frame a
//! JSON header and the payload. Pure: bytes in, [`Request`]s out.

use super::plain_pub;
use crate::request::{
    PayloadKind, Position, ProtocolError, Publish, Request, RequestId, Subscribe,
};
use bytes::Bytes;
use compact_str::CompactString;
use serde::Deserialize;
use std::borrow::Cow;
use std::collections::HashMap;

/// Every field any request may carry; unknown fields are ignored, so newer clients can talk to
/// older servers. One flat struct decodes faster than an internally tagged enum (which buffers).
#[derive(Deserialize)]
struct RawRequest<'a> {
    #[serde(borrow, default)]
    op: Option<Cow<'a, str>>,
    #[serde(default)]
    id: Option<RequestId>,
    #[serde(borrow, default)]
    topic: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    data: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    ct: Option<Cow<'a, str>>,
    #[serde(default)]
    stamp: bool,
    #[serde(default)]
    snapshot: bool,
    #[serde(default)]
    since: HashMap<String, Position>,
    #[serde(borrow, default)]
    cursor: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    token: Option<Cow<'a, str>>,
    #[serde(default)]
    policy: Option<crate::policy::Policy>,
    #[serde(default)]
    max_rate: Option<f64>,
    #[serde(default)]
    window: Option<u64>,
    #[serde(default)]
    window_bytes: Option<u64>,
    #[serde(default)]
    n: Option<u64>,
    #[serde(default)]
    bytes: Option<u64>,
}

/// Decodes a text frame: one JSON object.
pub fn decode_text(text: &str) -> Result<Request, ProtocolError> {
    decode_text_sharing(text, |data| Bytes::copy_from_slice(data.as_bytes()))
}

/// Decodes a text frame held in `frame`, whose bytes `text` is (checked UTF-8): a publish's
/// payload is a slice of the frame rather than a copy.
pub fn decode_text_frame(text: &str, frame: &Bytes) -> Result<Request, ProtocolError> {
    debug_assert_eq!(text.as_bytes(), &frame[..]);
    decode_text_sharing(text, |data| frame.slice_ref(data.as_bytes()))
}

/// Decodes a text frame; `share` makes a payload of a part of `text`.
fn decode_text_sharing(
    text: &str,
    share: impl Fn(&str) -> Bytes,
) -> Result<Request, ProtocolError> {
    if let Some(p) = plain_pub::scan(text) {
        return Ok(Request::Publish(Publish {
            id: p.id,
            topic: CompactString::from(p.topic),
            payload: share(p.data),
            kind: PayloadKind::Text,
            content_type: p.ct.map(str::to_owned),
            stamp: p.stamp,
            extras: None,
        }));
    }
    decode_general(text, share)
}

/// The general decoder alone, without the plain-`pub` fast path: the definition the fast path
/// is held to (tests and the `wire` fuzz target compare the two).
pub fn decode_text_general(text: &str) -> Result<Request, ProtocolError> {
    decode_general(text, |data| Bytes::copy_from_slice(data.as_bytes()))
}

fn decode_general(text: &str, share: impl Fn(&str) -> Bytes) -> Result<Request, ProtocolError> {
    let raw = parse_object(text).map_err(|e| e.into_error("bad_json", "request"))?;
    let data = raw.data.as_ref().map(|d| match d {
        Cow::Borrowed(d) => share(d),
        Cow::Owned(d) => Bytes::copy_from_slice(d.as_bytes()),
    });
    into_request(raw, data.map(|d| (d, PayloadKind::Text)))
}

/// Decodes a binary frame: a 4-byte big-endian header length, a JSON header, the payload.
/// The payload is a zero-copy slice of `frame`.
pub fn decode_binary(frame: Bytes) -> Result<Request, ProtocolError> {
    let (head, payload_at) = split_binary(&frame)?;
    let raw = parse_object(head).map_err(|e| e.into_error("bad_frame", "binary frame header"))?;
    if raw.data.is_some() {
        return Err(ProtocolError::new(
            "bad_frame",
            "a binary frame's header must not carry `data`: the payload follows the header",
        )
        .with_id(raw.id));
    }
    let payload = frame.slice(payload_at..);
    into_request(raw, Some((payload, PayloadKind::Binary)))
}

/// Splits a binary frame (either direction) into its JSON header text and the offset where the
/// payload starts.
pub fn split_binary(frame: &[u8]) -> Result<(&str, usize), ProtocolError> {
    if frame.len() < 4 {
        return Err(ProtocolError::new(
            "bad_frame",
            format!(
                "binary frame of {} bytes is shorter than its 4-byte header length",
                frame.len()
            ),
        ));
    }
    let head_len = u32::from_be_bytes([frame[0], frame[1], frame[2], frame[3]]) as usize;
    let Some(head_end) = head_len.checked_add(4).filter(|end| *end <= frame.len()) else {
        return Err(ProtocolError::new(
            "bad_frame",
            format!(
                "binary frame says its header is {head_len} bytes but only {} follow the length",
                frame.len() - 4
            ),
        ));
    };
    let head = std::str::from_utf8(&frame[4..head_end])
        .map_err(|_| ProtocolError::new("bad_frame", "binary frame header is not valid UTF-8"))?;
    Ok((head, head_end))
}

/// Parses a request object. serde would also accept a JSON array for a struct; the protocol
/// does not.
fn parse_object(text: &str) -> Result<RawRequest<'_>, Unparsed> {
    if !text.trim_start().starts_with('{') {
        return Err(Unparsed {
            id: None,
            message: "is not a valid JSON object: expected `{` at the start".into(),
        });
    }
    serde_json::from_str(text).map_err(|e| Unparsed::explain(text, e))
}

/// Why a request did not parse, with its `id` when it has a usable one: a client waiting for
/// the answer to request 7 must hear that request 7 failed, even when another field of it was
/// of the wrong type.
struct Unparsed {
    id: Option<RequestId>,
    message: String,
}

impl Unparsed {
    /// Not on the hot path: only a request that failed to parse is read again, to find its
    /// `id` and the first field whose value has the wrong type.
    fn explain(text: &str, e: serde_json::Error) -> Self {
        #[derive(Deserialize)]
        struct IdOnly {
            #[serde(default)]
            id: Option<RequestId>,
        }
        let id = serde_json::from_str::<IdOnly>(text)
            .ok()
            .and_then(|o| o.id)
            .filter(|v| v.is_number() || v.is_string());
        let fields = serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(text);
        let Ok(fields) = fields else {
            return Unparsed {
                id,
                message: format!("is not a valid JSON object: {e}"),
            };
        };
        let wrong = fields.into_iter().find_map(|(field, value)| {
            let alone = serde_json::Value::Object([(field.clone(), value)].into_iter().collect());
            let alone = alone.to_string();
            let e = serde_json::from_str::<RawRequest>(&alone).err()?;
            // The position is in the field alone, not in the request: leave it out.
            let why = e.to_string();
            let why = why.split(" at line ").next().unwrap_or(&why).to_owned();
            Some(format!("has a wrong `{field}`: {why}"))
        });
        Unparsed {
            id,
            message: wrong.unwrap_or_else(|| format!("is not a valid request: {e}")),
        }
    }

    fn into_error(self, code: &'static str, what: &str) -> ProtocolError {
        ProtocolError::new(code, format!("{what} {}", self.message)).with_id(self.id)
    }
}

fn into_request(
    raw: RawRequest,
    payload: Option<(Bytes, PayloadKind)>,
) -> Result<Request, ProtocolError> {
    let id = raw.id;
    if let Some(bad) = id.as_ref().filter(|v| !(v.is_number() || v.is_string())) {
        return Err(ProtocolError::new(
            "bad_json",
            format!("`id` must be a number or a string, not {bad}"),
        ));
    }
    let missing = |field: &str, op: &str| {
        ProtocolError::new("missing_field", format!("`{op}` needs a `{field}` field"))
            .with_id(id.clone())
    };
    let op = raw.op.as_deref().ok_or_else(|| {
        ProtocolError::new(
            "unknown_op",
            "request has no `op` field; expected one of sub, unsub, pub, ping, credit, auth",
        )
        .with_id(id.clone())
    })?;
    match op {
        "sub" => {
            if raw.max_rate.is_some_and(|r| !(r > 0.0 && r.is_finite())) {
                return Err(ProtocolError::new(
                    "bad_json",
                    "`max_rate` must be a positive number of messages per second",
                )
                .with_id(id));
            }
            Ok(Request::Subscribe(Subscribe {
                topic: raw.topic.ok_or_else(|| missing("topic", op))?.into_owned(),
                snapshot: raw.snapshot,
                since: raw.since,
                cursor: raw.cursor.map(Cow::into_owned),
                policy: raw.policy,
                max_rate: raw.max_rate,
                window: raw.window,
                window_bytes: raw.window_bytes,
                group: None,
                no_local: false,
                id,
            }))
        }
        "credit" => {
            let topic = raw.topic.ok_or_else(|| missing("topic", op))?.into_owned();
            if raw.n.is_none() && raw.bytes.is_none() {
                return Err(missing("n", op));
            }
            Ok(Request::Credit {
                topic,
                group: None,
                n: raw.n.unwrap_or(0),
                bytes: raw.bytes.unwrap_or(0),
                id,
            })
        }
        "unsub" => Ok(Request::Unsubscribe {
            topic: raw.topic.ok_or_else(|| missing("topic", op))?.into_owned(),
            group: None,
            id,
        }),
        "pub" => {
            let topic = raw.topic.ok_or_else(|| missing("topic", op))?.into_owned();
            let (payload, kind) = payload.ok_or_else(|| missing("data", op))?;
            Ok(Request::Publish(Publish {
                topic: topic.into(),
                payload,
                kind,
                content_type: raw.ct.map(Cow::into_owned),
                stamp: raw.stamp,
                id,
                extras: None,
            }))
        }
        "ping" => Ok(Request::Ping { id }),
        "auth" => Ok(Request::Auth {
            token: raw.token.ok_or_else(|| missing("token", op))?.into_owned(),
            id,
        }),
        other => Err(ProtocolError::new(
            "unknown_op",
            format!("unknown op {other:?}; expected one of sub, unsub, pub, ping, credit, auth"),
        )
        .with_id(id)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    #[test]
    fn decodes_every_op() {
        let sub = decode_text(r#"{"op":"sub","id":1,"topic":"a/*","snapshot":true,"since":{"a/b":{"seq":3,"epoch":"x"}}}"#)
            .unwrap();
        let Request::Subscribe(s) = sub else {
            panic!("{sub:?}")
        };
        assert_eq!(
            (s.topic.as_str(), s.snapshot, s.id),
            ("a/*", true, Some(json!(1)))
        );
        assert_eq!(
            s.since["a/b"],
            Position {
                seq: 3,
                epoch: "x".into()
            }
        );

        let Request::Subscribe(s) = decode_text(
            r#"{"op":"sub","topic":"a/>","policy":"conflate","max_rate":2.5,"window":4}"#,
        )
        .unwrap() else {
            panic!()
        };
        assert_eq!(
            (s.policy, s.max_rate, s.window),
            (Some(crate::policy::Policy::Conflate), Some(2.5), Some(4))
        );
        assert_eq!(
            decode_text(r#"{"op":"credit","topic":"a/>","n":3}"#).unwrap(),
            Request::Credit {
                id: None,
                topic: "a/>".into(),
                group: None,
                n: 3,
                bytes: 0
            }
        );
        let Request::Subscribe(s) =
            decode_text(r#"{"op":"sub","topic":"a/>","policy":"lossless","window_bytes":65536}"#)
                .unwrap()
        else {
            panic!()
        };
        assert_eq!((s.window, s.window_bytes), (None, Some(65536)));
        assert_eq!(
            decode_text(r#"{"op":"credit","topic":"a/>","bytes":1000}"#).unwrap(),
            Request::Credit {
                id: None,
                topic: "a/>".into(),
                group: None,
                n: 0,
                bytes: 1000
            }
        );
        assert_eq!(
            decode_text(r#"{"op":"unsub","id":"u","topic":"a/>"}"#).unwrap(),
            Request::Unsubscribe {
                id: Some(json!("u")),
                topic: "a/>".into(),
                group: None,
            }
        );
        let Request::Publish(p) = decode_text(r#"{"op":"pub","topic":"a/b","data":"h\u00e9\n","stamp":true,"ct":"text/plain","extra":1}"#).unwrap() else {
            panic!()
        };
        assert_eq!(&p.payload[..], "hé\n".as_bytes());
        assert_eq!(
            (p.kind, p.stamp, p.content_type.as_deref()),
            (PayloadKind::Text, true, Some("text/plain"))
        );
        assert_eq!(
            decode_text(r#"{"op":"ping"}"#).unwrap(),
            Request::Ping { id: None }
        );
        assert_eq!(
            decode_text(r#"{"op":"auth","id":1,"token":"a.b.c"}"#).unwrap(),
            Request::Auth {
                id: Some(1.into()),
                token: "a.b.c".into()
            }
        );
    }

    #[test]
    fn decode_errors_have_codes_and_keep_the_id() {
        let cases = [
            ("not json", "bad_json"),
            ("[1,2]", "bad_json"),
            (r#"{"op":"sub","topic":5}"#, "bad_json"),
            (r#"{"op":"sub","id":{"a":1},"topic":"a"}"#, "bad_json"),
            (r#"{"topic":"a"}"#, "unknown_op"),
            (r#"{"op":"dance","id":7}"#, "unknown_op"),
            (r#"{"op":"sub","id":7}"#, "missing_field"),
            (r#"{"op":"pub","id":7,"topic":"a"}"#, "missing_field"),
            (r#"{"op":"sub","topic":"a","policy":"fast"}"#, "bad_json"),
            (r#"{"op":"sub","topic":"a","max_rate":0}"#, "bad_json"),
            (r#"{"op":"credit","topic":"a"}"#, "missing_field"),
        ];
        for (input, code) in cases {
            let err = decode_text(input).unwrap_err();
            assert_eq!(err.code, code, "{input}: {err}");
            assert!(!err.message.is_empty());
        }
        assert_eq!(
            decode_text(r#"{"op":"dance","id":7}"#).unwrap_err().id,
            Some(json!(7))
        );
        assert!(decode_text(r#"{"op":"dance"}"#)
            .unwrap_err()
            .message
            .contains("dance"));
    }

    /// A field of the wrong type fails the whole request, but the client waiting for its `id`
    /// still hears which request failed and which field was wrong.
    #[test]
    fn a_field_of_the_wrong_type_keeps_the_id_and_names_the_field() {
        let cases = [
            (r#"{"op":"sub","id":1,"topic":5}"#, "topic"),
            (
                r#"{"op":"pub","id":"p","topic":"a","data":{"x":1}}"#,
                "data",
            ),
            (
                r#"{"op":"sub","id":2,"topic":"a","snapshot":"yes"}"#,
                "snapshot",
            ),
            (
                r#"{"op":"sub","id":3,"topic":"a","window":"ten"}"#,
                "window",
            ),
            (
                r#"{"op":"sub","id":4,"topic":"a","policy":"fastest"}"#,
                "policy",
            ),
            (r#"{"op":"sub","id":5,"topic":"a","since":[1]}"#, "since"),
            (r#"{"op":"sub","id":6,"topic":"a","cursor":7}"#, "cursor"),
        ];
        for (input, field) in cases {
            let err = decode_text(input).unwrap_err();
            let id: Value = serde_json::from_str::<Value>(input).unwrap()["id"].clone();
            assert_eq!(
                (err.code, err.id.clone()),
                ("bad_json", Some(id)),
                "{input}"
            );
            assert!(
                err.message.contains(&format!("`{field}`")),
                "{input}: {err}"
            );
        }
        // The same for a binary frame's header.
        let head = br#"{"op":"pub","id":9,"topic":5}"#;
        let mut frame = (head.len() as u32).to_be_bytes().to_vec();
        frame.extend_from_slice(head);
        let err = decode_binary(Bytes::from(frame)).unwrap_err();
        assert_eq!((err.code, err.id), ("bad_frame", Some(json!(9))));
        // An `id` that is itself of the wrong type is not echoed.
        let err = decode_text(r#"{"op":"sub","id":[1],"topic":5}"#).unwrap_err();
        assert_eq!((err.code, err.id), ("bad_json", None));
    }

    #[test]
    fn binary_publish_round_trip_is_zero_copy() {
        let head = br#"{"op":"pub","topic":"cam/1","ct":"image/fits","id":9}"#;
        let mut frame = (head.len() as u32).to_be_bytes().to_vec();
        frame.extend_from_slice(head);
        frame.extend_from_slice(&[0, 1, 2, 255]);
        let frame = Bytes::from(frame);
        let Request::Publish(p) = decode_binary(frame.clone()).unwrap() else {
            panic!()
        };
        assert_eq!(&p.payload[..], &[0, 1, 2, 255]);
        assert_eq!(p.kind, PayloadKind::Binary);
        assert_eq!(
            p.payload.as_ptr(),
            frame[4 + head.len()..].as_ptr(),
            "payload borrows the frame"
        );
    }

    #[test]
    fn binary_garbage_is_rejected() {
        for bad in [
            &b""[..],
            b"\x00\x00",
            b"\x00\x00\x00\x09{}",
            b"\xff\xff\xff\xff{}",
            b"\x00\x00\x00\x02\xff\xfe",
            b"\x00\x00\x00\x02[]",
        ] {
            assert_eq!(
                decode_binary(Bytes::copy_from_slice(bad)).unwrap_err().code,
                "bad_frame",
                "{bad:?}"
            );
        }
        let with_data = br#"{"op":"pub","topic":"a","data":"x"}"#;
        let mut f = (with_data.len() as u32).to_be_bytes().to_vec();
        f.extend_from_slice(with_data);
        assert_eq!(decode_binary(f.into()).unwrap_err().code, "bad_frame");
    }

    /// A `pub` request's fields in any order, mostly plain and sometimes not: values the fast
    /// path takes, and values only serde may answer (escapes, nulls, floats, odd numbers,
    /// another op, an unknown field, a duplicate).
    fn publish_fields() -> impl proptest::strategy::Strategy<Value = Vec<String>> {
        use proptest::prelude::*;
        let string = prop_oneof![
            6 => prop::sample::select(vec![r#""a/b""#, r#""""#, r#""été ✓""#, r#""1:2:xx""#]),
            1 => prop::sample::select(vec![r#""x\"y""#, r#""\u00e9""#, "\"tab\there\"", "null", "1"]),
        ];
        let id = prop::sample::select(vec![
            "0",
            "7",
            "-3",
            "-0",
            "007",
            "1.5",
            "2e3",
            "18446744073709551615",
            "18446744073709551616",
            "-9223372036854775808",
            "-9223372036854775809",
            r#""req-1""#,
            "true",
            "-",
            "1x",
        ]);
        let boolean = prop::sample::select(vec!["true", "false", "null", "1", "tru"]);
        let op = prop_oneof![6 => Just(r#""pub""#), 1 => Just(r#""sub""#), 1 => Just(r#""pu""#)];
        let required = (op, string.clone(), string.clone()).prop_map(|(op, topic, data)| {
            vec![
                format!(r#""op":{op}"#),
                format!(r#""topic":{topic}"#),
                format!(r#""data":{data}"#),
            ]
        });
        let optional = prop_oneof![
            string.clone().prop_map(|v| format!(r#""ct":{v}"#)),
            id.prop_map(|v| format!(r#""id":{v}"#)),
            boolean.prop_map(|v| format!(r#""stamp":{v}"#)),
            string.prop_map(|v| format!(r#""topic":{v}"#)),
            Just(r#""extra":[1,{"a":2}]"#.to_owned()),
        ];
        (required, prop::collection::vec(optional, 0..3))
            .prop_flat_map(|(mut fields, optional)| {
                fields.extend(optional);
                Just(fields).prop_shuffle()
            })
            .prop_map(|mut fields| {
                // Now and then a required field goes missing.
                if fields.len() > 3 && fields[0].starts_with(r#""extra""#) {
                    fields.remove(1);
                }
                fields
            })
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config::with_cases(2000))]
        /// Whatever the plain-`pub` fast path accepts decodes exactly as serde decodes it, and
        /// what it declines is answered by serde: `decode_text` and the general decoder agree on
        /// every request, errors included.
        #[test]
        fn the_plain_pub_fast_path_agrees_with_serde(
            fields in publish_fields(),
            space in proptest::sample::select(vec!["", " ", "\n\t ", "\r"]),
            tail in proptest::sample::select(vec!["", "", "", " ", "x", ",", "}"]),
        ) {
            let text = format!("{space}{{{space}{}{space}}}{tail}", fields.join(&format!("{space},{space}")));
            proptest::prop_assert_eq!(decode_text(&text), decode_text_general(&text), "{}", text);
        }
    }

    #[test]
    fn the_fast_path_takes_plain_publishes_and_declines_the_rest() {
        let plain = [
            r#"{"op":"pub","topic":"a/b","stamp":true,"data":"1700000000:4:xxxx"}"#,
            r#" { "id" : 12 , "data":"", "op":"pub", "topic":"t", "ct":"text/plain" } "#,
            r#"{"op":"pub","id":"r1","topic":"a","data":"été","stamp":false}"#,
        ];
        for text in plain {
            assert!(plain_pub::scan(text).is_some(), "{text}");
            assert_eq!(decode_text(text), decode_text_general(text), "{text}");
        }
        let declined = [
            r#"{"op":"pub","topic":"a","data":"q\"q"}"#,
            r#"{"op":"pub","topic":"a","data":"x","ct":null}"#,
            r#"{"op":"pub","topic":"a","data":"x","id":1.0}"#,
            r#"{"op":"pub","topic":"a","data":"x","topic":"b"}"#,
            r#"{"op":"pub","topic":"a","data":"x","other":1}"#,
            r#"{"op":"sub","topic":"a"}"#,
            r#"{"op":"pub","topic":"a"}"#,
            r#"{"op":"pub","topic":"a","data":"x"} x"#,
            r#"{"op":"pub","topic":"a","data":"x""#,
            r#"{"op":"pub","topic":"a","data":"x","id":-"#,
        ];
        for text in declined {
            assert!(plain_pub::scan(text).is_none(), "{text}");
        }
    }

    #[test]
    fn publishes_in_the_bench_order_decode_as_serde_decodes_them() {
        // Matched by the fixed-order path itself.
        let taken = [
            r#"{"op":"pub","topic":"a/b","data":"hello"}"#,
            r#"{"op":"pub","topic":"a/b","stamp":true,"data":"1:2:xx"}"#,
            r#"{"op":"pub","topic":"","data":""}"#,
            r#"{"op":"pub","topic":"été/✓","data":"été ✓"}"#,
        ];
        // Each leaves the fixed order and is answered by the general scan or by serde: an
        // escape, a raw control character, a tab, a space, a tail, another field, `stamp`
        // false, a duplicate, a missing end.
        let declined = [
            r#"{"op":"pub","topic":"a\"b","data":"x"}"#,
            "{\"op\":\"pub\",\"topic\":\"a\",\"data\":\"x\ny\"}",
            "{\"op\":\"pub\",\"topic\":\"a\",\"data\":\"x\ty\"}",
            r#"{"op":"pub","topic":"a","data":"x"} "#,
            r#"{"op":"pub","topic":"a","data":"x"}}"#,
            r#"{"op":"pub","topic":"a","data":"x","id":1}"#,
            r#"{"op":"pub","topic":"a","stamp":false,"data":"x"}"#,
            r#"{"op":"pub","topic":"a","stamp":true,"data":"x","stamp":true}"#,
            r#"{"op":"pub","topic":"a","data":"x""#,
            r#"{"op":"pub","topic":"a"#,
        ];
        for text in taken {
            assert!(plain_pub::in_bench_order(text).is_some(), "{text}");
            assert_eq!(decode_text(text), decode_text_general(text), "{text}");
        }
        for text in declined {
            assert!(plain_pub::in_bench_order(text).is_none(), "{text}");
            assert_eq!(decode_text(text), decode_text_general(text), "{text}");
        }
        let Ok(Request::Publish(p)) = decode_text(taken[1]) else {
            panic!("a publish");
        };
        assert_eq!(
            (p.topic.as_str(), &p.payload[..], p.stamp),
            ("a/b", &b"1:2:xx"[..], true)
        );
    }

    #[test]
    fn a_text_frame_publish_shares_the_frame() {
        let frame = Bytes::from_static(br#"{"op":"pub","topic":"a","data":"hello"}"#);
        let text = std::str::from_utf8(&frame).unwrap();
        let Ok(Request::Publish(p)) = decode_text_frame(text, &frame) else {
            panic!("not a publish")
        };
        assert_eq!(&p.payload[..], b"hello");
        let inside = frame.as_ptr_range();
        assert!(
            inside.contains(&p.payload.as_ptr()),
            "the payload was copied"
        );
    }
}
