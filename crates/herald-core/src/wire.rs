//! The native protocol codec (see `docs/protocol.md`): decodes client requests and encodes
//! server frames. Pure: bytes in, values out.
//!
//! Server frames are encoded as *complete WebSocket frames* (header included). A server frame
//! is unmasked, so the same bytes are valid on every connection: a message is encoded once and
//! every subscriber's socket is handed the same refcounted [`Frame`]. This is the product's hot
//! path, which is why framing is written here by hand rather than left to the WebSocket crate
//! (which would copy and re-frame the payload for every subscriber).

use bytes::{Buf, BufMut, Bytes, BytesMut};
use compact_str::CompactString;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::collections::HashMap;

pub mod client_frames;
mod plain_pub;

/// A request id: any JSON number or string, echoed verbatim in the reply.
pub type RequestId = serde_json::Value;

/// An encoded server → client WebSocket frame, shared by every connection it is sent to.
///
/// `head` holds the WebSocket header and, for binary messages, the protocol header; `body` holds
/// the payload, so that a large binary payload is never copied into the frame.
#[derive(Clone, Debug, Default)]
pub struct Frame {
    pub head: Bytes,
    pub body: Bytes,
}

impl Frame {
    /// Total bytes this frame occupies on the wire.
    pub fn len(&self) -> usize {
        self.head.len() + self.body.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The whole frame as one contiguous buffer (tests and small control frames).
    pub fn to_vec(&self) -> Vec<u8> {
        [&self.head[..], &self.body[..]].concat()
    }
}

/// WebSocket opcodes used by the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpCode {
    Text = 0x1,
    Binary = 0x2,
    Close = 0x8,
    Ping = 0x9,
    Pong = 0xA,
}

/// How a payload was published, and so how it is delivered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PayloadKind {
    /// Valid UTF-8, delivered in a JSON text frame.
    Text,
    /// Raw bytes, delivered in a binary frame behind a JSON header.
    Binary,
}

/// A position in a topic's stream, as a client last saw it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Position {
    pub seq: u64,
    pub epoch: String,
}

/// A decoded client request.
#[derive(Clone, Debug, PartialEq)]
pub enum Request {
    Subscribe(Subscribe),
    Unsubscribe {
        id: Option<RequestId>,
        topic: String,
    },
    Publish(Publish),
    Ping {
        id: Option<RequestId>,
    },
    /// Presents a token (the first message of a connection, or a refresh before it expires).
    /// The network layer answers it; the engine never sees it.
    Auth {
        id: Option<RequestId>,
        token: String,
    },
    /// Lossless flow control: `n` more messages and `bytes` more payload bytes granted to the
    /// subscription `topic` (either may be 0).
    Credit {
        id: Option<RequestId>,
        topic: String,
        n: u64,
        bytes: u64,
    },
}

#[derive(Clone, Debug, PartialEq, Default)]
pub struct Subscribe {
    pub id: Option<RequestId>,
    pub topic: String,
    pub snapshot: bool,
    pub since: HashMap<String, Position>,
    /// The cursor of this subscription's first `subscribed` reply, sent back when it recovers:
    /// topics the pattern matches that `since` does not name are replayed from there.
    pub cursor: Option<String>,
    /// The slow-consumer policy asked for; `None` leaves it to the configured default.
    pub policy: Option<crate::policy::Policy>,
    /// `conflate`: at most this many messages per second per topic.
    pub max_rate: Option<f64>,
    /// `lossless`: messages granted up front.
    pub window: Option<u64>,
    /// `lossless`: payload bytes granted up front (a byte window besides, or instead of, the
    /// message window).
    pub window_bytes: Option<u64>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Publish {
    pub id: Option<RequestId>,
    /// Held inline up to 24 bytes: taking a topic out of a request allocated for every
    /// publish, ~100 instructions of malloc and free (callgrind).
    pub topic: CompactString,
    pub payload: Bytes,
    pub kind: PayloadKind,
    pub content_type: Option<String>,
    pub stamp: bool,
}

/// A request that could not be decoded or carried out: a stable code and a message for people.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ProtocolError {
    pub id: Option<RequestId>,
    pub code: &'static str,
    pub message: String,
}

impl ProtocolError {
    pub fn new(code: &'static str, message: impl Into<String>) -> Self {
        ProtocolError {
            id: None,
            code,
            message: message.into(),
        }
    }

    pub fn with_id(mut self, id: Option<RequestId>) -> Self {
        self.id = id;
        self
    }
}

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

/// `bytes` as text, or why not. Most frames are ASCII, which `is_ascii` confirms a word at a
/// time; `std::str::from_utf8` checks the rest. std's check alone cost ~140 instructions on a
/// 60-byte publish (callgrind), three times the ASCII test.
pub fn utf8(bytes: &[u8]) -> Result<&str, std::str::Utf8Error> {
    if bytes.is_ascii() {
        // SAFETY: ASCII is UTF-8.
        Ok(unsafe { std::str::from_utf8_unchecked(bytes) })
    } else {
        std::str::from_utf8(bytes)
    }
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
                n: raw.n.unwrap_or(0),
                bytes: raw.bytes.unwrap_or(0),
                id,
            })
        }
        "unsub" => Ok(Request::Unsubscribe {
            topic: raw.topic.ok_or_else(|| missing("topic", op))?.into_owned(),
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

/// The JSON that every message of a topic shares under one numbering,
/// `{"op":"msg","topic":…,"seq":` and `,"epoch":…`: written when the numbering starts, so
/// that encoding a message copies it rather than escaping its topic and epoch again (a third
/// of the cost of encoding a small message, callgrind).
#[derive(Clone, Debug)]
pub struct MessageHead {
    json: Box<[u8]>,
    /// Where the sequence number goes.
    seq_at: usize,
}

impl MessageHead {
    pub fn new(topic: &str, epoch: &str) -> Self {
        let mut json = BytesMut::with_capacity(topic.len() + epoch.len() + 40);
        json.put_slice(b"{\"op\":\"msg\",\"topic\":");
        write_json_str(&mut json, topic);
        json.put_slice(b",\"seq\":");
        let seq_at = json.len();
        json.put_slice(b",\"epoch\":");
        write_json_str(&mut json, epoch);
        MessageHead {
            json: json.to_vec().into_boxed_slice(),
            seq_at,
        }
    }
}

/// What a delivered message frame says about its message.
#[derive(Clone, Copy, Debug)]
pub struct MessageMeta<'a> {
    /// Its topic and epoch, as JSON.
    pub head: &'a MessageHead,
    pub seq: u64,
    pub content_type: Option<&'a str>,
    /// herald's receive time, µs since the UNIX epoch, when the publisher asked for it.
    pub timestamp_us: Option<u64>,
}

/// Encodes a message once for all its subscribers.
pub fn encode_message(meta: &MessageMeta, kind: PayloadKind, payload: &Bytes) -> Frame {
    match kind {
        PayloadKind::Text => {
            // One buffer, one slice to write: the JSON goes after room for the longest
            // WebSocket header, and the header is put right before it once the length is known.
            // `,"data":""` is 10 bytes.
            let mut buf = BytesMut::with_capacity(MAX_HEADER + meta_len(meta) + 10 + payload.len());
            buf.put_bytes(0, MAX_HEADER);
            write_meta_fields(&mut buf, meta);
            buf.put_slice(b",\"data\":");
            write_json_utf8(&mut buf, payload);
            buf.put_u8(b'}');
            text_frame(buf)
        }
        PayloadKind::Binary => {
            let mut json = BytesMut::with_capacity(meta_len(meta));
            write_meta_fields(&mut json, meta);
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

/// The longest WebSocket frame header a server sends (no mask): 1 + 1 + 8 bytes.
const MAX_HEADER: usize = 10;

/// Room for [`write_meta_fields`] and a closing brace: the longest sequence number and time
/// are 20 digits, and a content type is plain unless it is hostile.
fn meta_len(meta: &MessageMeta) -> usize {
    meta.head.json.len() + 20 + meta.content_type.map_or(0, |ct| 8 + ct.len()) + 27
}

/// `{"op":"msg","topic":…,"seq":…,"epoch":…[,"ct":…][,"ts":…]` (no closing brace).
fn write_meta_fields(out: &mut BytesMut, meta: &MessageMeta) {
    let (before_seq, after_seq) = meta.head.json.split_at(meta.head.seq_at);
    out.put_slice(before_seq);
    write_u64(out, meta.seq);
    out.put_slice(after_seq);
    if let Some(ct) = meta.content_type {
        out.put_slice(b",\"ct\":");
        write_json_str(out, ct);
    }
    if let Some(ts) = meta.timestamp_us {
        out.put_slice(b",\"ts\":");
        write_u64(out, ts);
    }
}

fn write_u64(out: &mut BytesMut, n: u64) {
    out.put_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// A JSON string. Most topics and payloads need no escape: they are copied as they are
/// (serde_json escapes exactly `"`, `\` and control characters, so the output is the same).
fn write_json_str(out: &mut BytesMut, s: &str) {
    write_json_utf8(out, s.as_bytes())
}

/// [`write_json_str`] for bytes known to be UTF-8 (a text payload, checked when published):
/// the common case, nothing to escape, needs no second check.
fn write_json_utf8(out: &mut BytesMut, utf8: &[u8]) {
    if unescaped_len(utf8) == utf8.len() {
        out.put_u8(b'"');
        out.put_slice(utf8);
        out.put_u8(b'"');
    } else {
        let s = std::str::from_utf8(utf8).expect("text payloads are checked UTF-8 when published");
        serde_json::to_writer(out.writer(), s).expect("writing JSON to memory cannot fail");
    }
}

/// The length of the leading run of `bytes` that a JSON string holds as it is: no `"`, no `\`,
/// no control character. Tested a word (8 bytes) at a time, by hand, because it runs over every
/// text payload twice (decoding the publish, encoding the message): a byte-wise loop was a
/// tenth of the cost of taking a message in.
fn unescaped_len(bytes: &[u8]) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    // The high bit of every byte of `w` below `n` (n <= 0x80; bytes >= 0x80 never count). A
    // borrow can also mark a byte above a marked one, never one below it: the lowest mark is
    // exact, and that is the only one read.
    let below = |w: u64, n: u8| w.wrapping_sub(ONES * u64::from(n)) & !w & HIGH;
    let equal = |w: u64, b: u8| below(w ^ (ONES * u64::from(b)), 1);
    // Whole words are read in place and the short tail byte by byte: padding a copy of the
    // tail cost a libc memcpy call per word (callgrind), more than the test itself.
    let mut words = bytes.chunks_exact(8);
    let mut at = 0;
    for word in &mut words {
        let w = u64::from_le_bytes(word.try_into().expect("chunks of 8 bytes"));
        let marks = below(w, 0x20) | equal(w, b'"') | equal(w, b'\\');
        if marks != 0 {
            return at + (marks.trailing_zeros() / 8) as usize;
        }
        at += 8;
    }
    let tail = words.remainder();
    at + tail
        .iter()
        .position(|&b| b < 0x20 || b == b'"' || b == b'\\')
        .unwrap_or(tail.len())
}

/// Server replies (everything but messages). Not on the fan-out path: serde is fine here.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum Reply {
    Subscribed {
        #[serde(skip_serializing_if = "Option::is_none")]
        id: Option<RequestId>,
        topic: String,
        recovered: bool,
        replayed: usize,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        gaps: Vec<Gap>,
        /// Where this subscription took effect: sent back with `since` when it recovers.
        cursor: String,
    },
    Unsubscribed {
        #[serde(skip_serializing_if = "Option::is_none")]
        id: Option<RequestId>,
        topic: String,
    },
    Ack {
        id: RequestId,
        topic: String,
        seq: u64,
    },
    Pong {
        #[serde(skip_serializing_if = "Option::is_none")]
        id: Option<RequestId>,
    },
    /// A token was accepted; `exp` is when it lapses (UNIX seconds), absent if it never does.
    Authed {
        #[serde(skip_serializing_if = "Option::is_none")]
        id: Option<RequestId>,
        #[serde(skip_serializing_if = "Option::is_none")]
        exp: Option<u64>,
    },
    Error {
        #[serde(skip_serializing_if = "Option::is_none")]
        id: Option<RequestId>,
        code: &'static str,
        message: String,
    },
}

impl From<ProtocolError> for Reply {
    fn from(e: ProtocolError) -> Self {
        Reply::Error {
            id: e.id,
            code: e.code,
            message: e.message,
        }
    }
}

/// Why a subscriber's requested history could not be replayed in full.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum GapReason {
    /// Messages `from..=to` are no longer held.
    HistoryTrimmed { from: u64, to: u64 },
    /// The topic's history was lost; sequence numbers restarted under `epoch`.
    EpochChanged { epoch: String },
    /// Nothing is held of the topic.
    UnknownTopic,
    /// Messages `from..=to` are held but were not replayed: the recovery (replay and snapshot)
    /// was larger than the connection's `max_recovery_bytes`; the newest were sent.
    RecoveryLimit { from: u64, to: u64 },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Gap {
    pub topic: String,
    #[serde(flatten)]
    pub reason: GapReason,
}

/// Encodes a reply as a text frame.
pub fn encode_reply(reply: &Reply) -> Frame {
    let mut buf = BytesMut::with_capacity(MAX_HEADER + 128);
    buf.put_bytes(0, MAX_HEADER);
    serde_json::to_writer((&mut buf).writer(), reply).expect("replies always serialize");
    text_frame(buf)
}

/// `{"op":"dropped","topic":…,"count":…,"reason":…}`: `count` messages of `topic` were not
/// delivered to this connection, for `reason` (`drop`, `conflate`, `remote`); sent before the
/// next message of that topic. Written by hand like [`encode_message`]: a conflating subscriber
/// is sent one per topic per throttle interval, and serde took ~2,400 instructions for each.
pub fn encode_dropped(topic: &str, count: u64, reason: &str) -> Frame {
    let mut buf = BytesMut::with_capacity(MAX_HEADER + topic.len() + reason.len() + 60);
    buf.put_bytes(0, MAX_HEADER);
    buf.put_slice(b"{\"op\":\"dropped\",\"topic\":");
    write_json_str(&mut buf, topic);
    buf.put_slice(b",\"count\":");
    write_u64(&mut buf, count);
    buf.put_slice(b",\"reason\":");
    write_json_str(&mut buf, reason);
    buf.put_u8(b'}');
    text_frame(buf)
}

/// Puts the WebSocket header of a text frame before `buf`'s JSON, which starts after
/// [`MAX_HEADER`] bytes of room.
fn text_frame(mut buf: BytesMut) -> Frame {
    let head = ws_header(OpCode::Text, buf.len() - MAX_HEADER);
    let start = MAX_HEADER - head.len();
    buf[start..MAX_HEADER].copy_from_slice(&head);
    let mut head = buf.freeze();
    head.advance(start);
    Frame {
        head,
        body: Bytes::new(),
    }
}

/// Encodes a close frame. The reason is cut to fit the 123 bytes a control frame allows.
pub fn encode_close(code: u16, reason: &str) -> Frame {
    let mut cut = reason.len().min(123);
    while !reason.is_char_boundary(cut) {
        cut -= 1;
    }
    let mut payload = Vec::with_capacity(2 + cut);
    payload.extend_from_slice(&code.to_be_bytes());
    payload.extend_from_slice(&reason.as_bytes()[..cut]);
    encode_control(OpCode::Close, &payload)
}

/// Encodes a control frame (close, pong) with the given payload (at most 125 bytes).
pub fn encode_control(op: OpCode, payload: &[u8]) -> Frame {
    debug_assert!(payload.len() <= 125);
    let mut buf = BytesMut::with_capacity(2 + payload.len());
    buf.put_slice(&ws_header(op, payload.len()));
    buf.put_slice(payload);
    Frame {
        head: buf.freeze(),
        body: Bytes::new(),
    }
}

/// A binary WebSocket message carrying `payload` as it is (shared, not copied): the raw
/// framing of protocols other than herald's own (VBDS image chunks).
pub fn encode_binary(payload: Bytes) -> Frame {
    Frame {
        head: Bytes::from(ws_header(OpCode::Binary, payload.len())),
        body: payload,
    }
}

/// The sequence number in the header of an encoded binary message frame (see
/// [`encode_message`]), or `None` for any other frame.
pub fn binary_message_seq(frame: &Frame) -> Option<u64> {
    let head = &frame.head[..];
    if head.first() != Some(&(0x80 | OpCode::Binary as u8)) {
        return None;
    }
    let at = match head.get(1)? & 0x7F {
        126 => 4,
        127 => 10,
        _ => 2,
    };
    let (json, _) = split_binary(head.get(at..)?).ok()?;
    #[derive(Deserialize)]
    struct Seq {
        seq: u64,
    }
    serde_json::from_str::<Seq>(json).ok().map(|s| s.seq)
}

/// The header of a final, unmasked WebSocket frame (RFC 6455 §5.2).
fn ws_header(op: OpCode, len: usize) -> Vec<u8> {
    let mut h = Vec::with_capacity(10);
    put_frame_head(&mut h, 0x80 | op as u8, 0, len);
    h
}

/// A WebSocket frame header up to its mask key: the first byte (FIN, opcode), then the length
/// in its 7-, 16- or 64-bit form with `mask_bit` (0, or 0x80 for a client's frame).
fn put_frame_head(out: &mut Vec<u8>, first: u8, mask_bit: u8, len: usize) {
    out.push(first);
    match len {
        0..=125 => out.push(mask_bit | len as u8),
        126..=0xFFFF => {
            out.push(mask_bit | 126);
            out.extend_from_slice(&(len as u16).to_be_bytes());
        }
        _ => {
            out.push(mask_bit | 127);
            out.extend_from_slice(&(len as u64).to_be_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::unframe;
    use serde_json::{json, Value};

    fn meta<'a>(head: &'a MessageHead, ct: Option<&'a str>, ts: Option<u64>) -> MessageMeta<'a> {
        MessageMeta {
            head,
            seq: 42,
            content_type: ct,
            timestamp_us: ts,
        }
    }

    fn head(topic: &str) -> MessageHead {
        MessageHead::new(topic, "e1")
    }

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
                n: 0,
                bytes: 1000
            }
        );
        assert_eq!(
            decode_text(r#"{"op":"unsub","id":"u","topic":"a/>"}"#).unwrap(),
            Request::Unsubscribe {
                id: Some(json!("u")),
                topic: "a/>".into()
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

    #[test]
    fn text_message_frame_is_valid_json() {
        let payload = Bytes::from_static("quote \"1.08\" \u{1F600}".as_bytes());
        let frame = encode_message(
            &meta(&head("q/fx/EURUSD"), Some("text/plain"), Some(7)),
            PayloadKind::Text,
            &payload,
        );
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
        let head = MessageHead::new("caméra/ü", "e\"1\\\n");
        for seq in [0, 7, u64::MAX] {
            let frame = encode_message(
                &MessageMeta {
                    head: &head,
                    seq,
                    content_type: None,
                    timestamp_us: None,
                },
                PayloadKind::Text,
                &Bytes::from_static(b"x"),
            );
            let v: Value = serde_json::from_slice(&unframe(&frame).1).unwrap();
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
            let frame = encode_message(
                &meta(&head("cam/1"), None, None),
                PayloadKind::Binary,
                &payload,
            );
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

    #[test]
    fn a_binary_message_frame_tells_its_seq() {
        for size in [0usize, 200, 70_000] {
            let payload = Bytes::from(vec![1u8; size]);
            let frame = encode_message(
                &meta(&head("v/a"), None, None),
                PayloadKind::Binary,
                &payload,
            );
            assert_eq!(binary_message_seq(&frame), Some(42));
        }
        let text = encode_message(
            &meta(&head("v/a"), None, None),
            PayloadKind::Text,
            &Bytes::from("x"),
        );
        assert_eq!(binary_message_seq(&text), None);
        let chunk = encode_binary(Bytes::from_static(b"\n"));
        assert_eq!(unframe(&chunk), (0x2, b"\n".to_vec()));
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
        let (_, body) = unframe(&encode_dropped("a/\"é\"", 3, "drop"));
        assert_eq!(
            serde_json::from_slice::<Value>(&body).unwrap(),
            json!({"op":"dropped","topic":"a/\"é\"","count":3,"reason":"drop"})
        );
    }

    #[test]
    fn close_frame_reason_is_cut_on_a_char_boundary() {
        let reason = "é".repeat(100);
        let (op, body) = unframe(&encode_close(4008, &reason));
        assert_eq!(op, 0x8);
        assert_eq!(u16::from_be_bytes([body[0], body[1]]), 4008);
        assert!(body.len() <= 125);
        assert!(std::str::from_utf8(&body[2..]).is_ok());
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

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config::with_cases(5000))]
        /// The word-at-a-time test finds the first byte to escape exactly where a byte-wise
        /// search does, wherever it falls in a word.
        #[test]
        fn unescaped_len_finds_the_first_byte_to_escape(
            bytes in proptest::collection::vec(
                proptest::prop_oneof![
                    8 => 0x20u8..0x7f,
                    1 => 0x80u8..=0xff,
                    1 => proptest::sample::select(vec![0u8, 0x1f, b'"', b'\\', 0x21, 0x5b, 0x5d, 0x7f]),
                ],
                0..40,
            )
        ) {
            let naive = bytes
                .iter()
                .position(|&b| b < 0x20 || b == b'"' || b == b'\\')
                .unwrap_or(bytes.len());
            proptest::prop_assert_eq!(unescaped_len(&bytes), naive);
        }

        /// The ASCII shortcut accepts and refuses exactly what std's UTF-8 check does.
        #[test]
        fn utf8_agrees_with_std(
            bytes in proptest::collection::vec(
                proptest::prop_oneof![8 => 0u8..0x80, 1 => 0x80u8..=0xff],
                0..40,
            )
        ) {
            proptest::prop_assert_eq!(utf8(&bytes), std::str::from_utf8(&bytes));
        }
    }
}
