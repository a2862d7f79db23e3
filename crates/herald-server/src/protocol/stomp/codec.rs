//! What herald sends one STOMP connection: its [`Encode`], and the state it shares with the
//! connection's session (which subscriptions exist, which replies a RECEIPT waits for).
//!
//! herald hands a connection each message once, however many of its subscriptions match;
//! STOMP clients dispatch MESSAGE frames by their `subscription` header, and brokers send one
//! MESSAGE per matching subscription, so the codec does too: it finds the connection's STOMP
//! subscriptions whose patterns match the message's topic and writes a MESSAGE for each. The
//! shared headers are built once per message and connection (the `message-id` names the
//! delivery on this connection, so no slot of the message caches them across connections);
//! each MESSAGE is the subscription's prefix and those headers in one small head, the payload
//! as it is, and the NUL as a frame of its own, so the payload is never copied.
//!
//! Replies come back by request id: the session gives a request an id when a RECEIPT (or the
//! close of a DISCONNECT) waits for its reply, and the codec turns the last awaited reply into
//! the RECEIPT. Every error reply becomes an ERROR, after which the connection closes.
//! `dropped` notices become headers on the next MESSAGE of their topic ([`encode::DROPPED`]).

use super::destination::{destination_of, Dialect};
use super::encode::{self, ErrorFrame, MessageHead, MessageParts, Subscriber};
use super::version::Version;
use crate::connection::Framing;
use bytes::{BufMut, Bytes, BytesMut};
use herald_core::codec::{Encode, Frame};
use herald_core::message::Message;
use herald_core::reply::{DropReason, Gap, GapReason, Reply};
use herald_core::request::{PayloadKind, RequestId};
use herald_core::topic;
use herald_core::wire::{ws_header, OpCode};
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};

/// A subscription's `ack` mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AckMode {
    Auto,
    /// An ACK acknowledges its message and every earlier one of the subscription.
    Client,
    /// An ACK acknowledges its message only.
    ClientIndividual,
}

impl AckMode {
    pub fn parse(value: Option<&str>) -> Option<AckMode> {
        match value {
            None | Some("auto") => Some(AckMode::Auto),
            Some("client") => Some(AckMode::Client),
            Some("client-individual") => Some(AckMode::ClientIndividual),
            Some(_) => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            AckMode::Auto => "auto",
            AckMode::Client => "client",
            AckMode::ClientIndividual => "client-individual",
        }
    }
}

/// One STOMP subscription of the connection.
#[derive(Debug)]
pub struct Subscription {
    pub id: String,
    /// The herald patterns its destination maps to; fixed once made, as `exact` describes them.
    patterns: Vec<String>,
    /// None of them has a wildcard ([`topic::is_exact`]): a message's topic is compared with
    /// each, rather than each scanned for wildcards on every delivery.
    exact: bool,
    pub ack: AckMode,
    prefix: Subscriber,
    /// Delivered and not yet acknowledged (client acks only): message number → the index in
    /// `patterns` of the pattern that matched, whose subscription the ACK gives credit back to.
    unacked: BTreeMap<u64, usize>,
}

impl Subscription {
    pub fn new(id: String, patterns: Vec<String>, ack: AckMode, version: Version) -> Self {
        let prefix = Subscriber::new(&id, version, ack != AckMode::Auto);
        Subscription {
            id,
            exact: patterns.iter().all(|p| topic::is_exact(p)),
            patterns,
            ack,
            prefix,
            unacked: BTreeMap::new(),
        }
    }

    /// The index in `patterns` of the first that matches `topic`, if any.
    fn matching(&self, topic: &str) -> Option<usize> {
        let mut patterns = self.patterns.iter();
        match self.exact {
            true => patterns.position(|p| p == topic),
            false => patterns.position(|p| topic::matches(p, topic)),
        }
    }
}

/// What an ACK or NACK names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AckTarget<'a> {
    /// The subscription, when the frame names it (1.1's `subscription`, 1.2's `id`).
    pub subscription: Option<&'a str>,
    pub message: u64,
}

/// The shared state and the encoder of one STOMP connection.
pub struct StompCodec {
    framing: Framing,
    dialect: Dialect,
    state: Mutex<State>,
}

struct State {
    version: Version,
    subscriptions: Vec<Subscription>,
    /// The number the next delivered message gets: its `message-id`.
    next_message: u64,
    next_request: u64,
    awaiting: HashMap<u64, Awaiting>,
    /// Messages per topic that did not arrive, told on the topic's next MESSAGE.
    dropped: HashMap<String, (u64, DropReason)>,
}

/// What a frame with `receipt` (or a DISCONNECT) waits for.
struct Awaiting {
    receipt: Option<String>,
    /// Replies still to come.
    replies: usize,
    /// The connection ends after the RECEIPT (DISCONNECT).
    close: bool,
    /// What the replies of a SUBSCRIBE said about recovery, for the RECEIPT.
    replayed: usize,
    gaps: Vec<String>,
    cursor: Option<String>,
}

impl StompCodec {
    pub fn new(framing: Framing, dialect: Dialect) -> StompCodec {
        StompCodec {
            framing,
            dialect,
            state: Mutex::new(State {
                version: Version::V1_2,
                subscriptions: Vec::new(),
                next_message: 1,
                next_request: 1,
                awaiting: HashMap::new(),
                dropped: HashMap::new(),
            }),
        }
    }

    pub fn dialect(&self) -> Dialect {
        self.dialect
    }

    /// The version CONNECT negotiated, which decides header escaping from now on.
    pub fn set_version(&self, version: Version) {
        self.state.lock().version = version;
    }

    /// Bytes the session encoded itself (CONNECTED, ERROR, a RECEIPT, a heart-beat), framed
    /// for the transport.
    pub fn control(&self, bytes: Bytes) -> Frame {
        self.framed(bytes, OpCode::Text)
    }

    fn framed(&self, bytes: Bytes, op: OpCode) -> Frame {
        match self.framing {
            Framing::Stream => Frame {
                head: bytes,
                body: Bytes::new(),
            },
            Framing::WebSocket => Frame {
                head: Bytes::from(ws_header(op, bytes.len())),
                body: bytes,
            },
        }
    }

    /// The subscription with `id`, if any: its ack mode.
    pub fn subscription(&self, id: &str) -> Option<AckMode> {
        let state = self.state.lock();
        state
            .subscriptions
            .iter()
            .find(|s| s.id == id)
            .map(|s| s.ack)
    }

    /// Another subscription already holding herald pattern `pattern`: its id and ack mode.
    pub fn holder(&self, pattern: &str) -> Option<(String, AckMode)> {
        let state = self.state.lock();
        state
            .subscriptions
            .iter()
            .find(|s| s.patterns.iter().any(|p| p == pattern))
            .map(|s| (s.id.clone(), s.ack))
    }

    pub fn add(&self, subscription: Subscription) {
        self.state.lock().subscriptions.push(subscription);
    }

    /// Removes subscription `id`; returns its patterns that no other subscription holds (the
    /// herald subscriptions to end), or `None` if there is no such subscription.
    pub fn remove(&self, id: &str) -> Option<Vec<String>> {
        let mut state = self.state.lock();
        let at = state.subscriptions.iter().position(|s| s.id == id)?;
        let gone = state.subscriptions.remove(at);
        Some(
            gone.patterns
                .into_iter()
                .filter(|p| {
                    !state
                        .subscriptions
                        .iter()
                        .any(|s| s.patterns.iter().any(|q| q == p))
                })
                .collect(),
        )
    }

    /// Acknowledges (or NACKs: the same, as herald never redelivers) what `target` names:
    /// returns the credit to give back, per herald pattern. Messages not awaiting an ACK (already
    /// acknowledged, or of an `auto` subscription) give none.
    pub fn ack(&self, target: AckTarget<'_>) -> Vec<(String, u64)> {
        let mut state = self.state.lock();
        let mut credit: Vec<(String, u64)> = Vec::new();
        for sub in state.subscriptions.iter_mut() {
            if target.subscription.is_some_and(|id| id != sub.id) {
                continue;
            }
            let acked: Vec<u64> = match sub.ack {
                AckMode::Auto => continue,
                AckMode::Client => sub
                    .unacked
                    .range(..=target.message)
                    .map(|(n, _)| *n)
                    .collect(),
                AckMode::ClientIndividual => sub
                    .unacked
                    .get_key_value(&target.message)
                    .map(|(n, _)| *n)
                    .into_iter()
                    .collect(),
            };
            for n in acked {
                let Some(at) = sub.unacked.remove(&n) else {
                    continue;
                };
                let pattern = &sub.patterns[at];
                match credit.iter_mut().find(|(p, _)| p == pattern) {
                    Some((_, count)) => *count += 1,
                    None => credit.push((pattern.clone(), 1)),
                }
            }
        }
        credit
    }

    /// A request id whose reply (the last of `replies`) brings the RECEIPT for `receipt` and,
    /// with `close`, ends the connection.
    pub fn await_replies(&self, receipt: Option<&str>, replies: usize, close: bool) -> RequestId {
        let mut state = self.state.lock();
        let n = state.next_request;
        state.next_request += 1;
        state.awaiting.insert(
            n,
            Awaiting {
                receipt: receipt.map(str::to_owned),
                replies: replies.max(1),
                close,
                replayed: 0,
                gaps: Vec::new(),
                cursor: None,
            },
        );
        RequestId::from(n)
    }

    fn encode_message(&self, m: &Message, out: &mut Vec<Frame>) {
        let mut state = self.state.lock();
        let state = &mut *state;
        let mut head: Option<MessageHead> = None;
        let mut n = 0;
        let op = match m.kind() {
            PayloadKind::Text => OpCode::Text,
            PayloadKind::Binary => OpCode::Binary,
        };
        for sub in state.subscriptions.iter_mut() {
            let Some(at) = sub.matching(m.topic()) else {
                continue;
            };
            let head = head.get_or_insert_with(|| {
                n = state.next_message;
                state.next_message += 1;
                // Hashing the topic is skipped while nothing was dropped, as almost always.
                let dropped = match state.dropped.is_empty() {
                    true => None,
                    false => state.dropped.remove(m.topic()),
                };
                let destination = destination_of(m.topic(), self.dialect);
                MessageHead::new(
                    &MessageParts {
                        message_id: n,
                        destination: &destination,
                        content_type: m.content_type(),
                        body_len: m.payload().len(),
                        seq: m.seq(),
                        epoch: m.epoch(),
                        ts: m.stamp_us(),
                        dropped: dropped.map(|(count, why)| (count, why.as_str())),
                    },
                    state.version,
                )
            });
            if sub.ack != AckMode::Auto {
                sub.unacked.insert(n, at);
            }
            let [prefix, shared, body, end] = head.frame(&sub.prefix, m.payload()).0;
            let mut bytes = BytesMut::with_capacity(prefix.len() + shared.len() + 10);
            if self.framing == Framing::WebSocket {
                let len = prefix.len() + shared.len() + body.len() + end.len();
                bytes.put_slice(&ws_header(op, len));
            }
            bytes.put_slice(&prefix);
            bytes.put_slice(&shared);
            out.push(Frame {
                head: bytes.freeze(),
                body,
            });
            out.push(Frame {
                head: end,
                body: Bytes::new(),
            });
        }
    }
}

/// How a gap reads in a RECEIPT's `gap` header.
fn describe(gap: &Gap, dialect: Dialect) -> String {
    let destination = destination_of(&gap.topic, dialect);
    match &gap.reason {
        GapReason::HistoryTrimmed { from, to } => {
            format!("{destination} {from}-{to} no longer held")
        }
        GapReason::EpochChanged { epoch } => {
            format!("{destination} history lost, numbering restarted in epoch {epoch}")
        }
        GapReason::UnknownTopic => format!("{destination} nothing held"),
        GapReason::RecoveryLimit { from, to } => {
            format!("{destination} {from}-{to} beyond the recovery limit")
        }
    }
}

impl Encode for StompCodec {
    fn message(&self, message: &Message, out: &mut Vec<Frame>) {
        self.encode_message(message, out);
    }

    fn reply(&self, reply: &Reply) -> Frame {
        let mut state = self.state.lock();
        let version = state.version;
        let id = |id: Option<&RequestId>| id.and_then(RequestId::as_u64);
        match reply {
            Reply::Error {
                id: rid,
                code,
                message,
            } => {
                let awaiting = id(rid.as_ref()).and_then(|n| state.awaiting.remove(&n));
                let text = format!("{code}: {message}");
                let receipt = awaiting.as_ref().and_then(|a| a.receipt.as_deref());
                let error = ErrorFrame {
                    message: &text,
                    receipt_id: receipt,
                    detail: "",
                    list_versions: false,
                };
                drop(state);
                self.control(error.encode(Some(version)))
            }
            Reply::Ack { id: rid, .. } => self.answered(&mut state, id(Some(rid)), |_| {}),
            Reply::Pong { id: rid } | Reply::Unsubscribed { id: rid, .. } => {
                self.answered(&mut state, id(rid.as_ref()), |_| {})
            }
            Reply::Subscribed {
                id: rid,
                replayed,
                gaps,
                cursor,
                ..
            } => self.answered(&mut state, id(rid.as_ref()), |a| {
                a.replayed += replayed;
                a.gaps
                    .extend(gaps.iter().map(|g| describe(g, self.dialect)));
                a.cursor = Some(cursor.clone());
            }),
            Reply::Authed { .. } => Frame::default(),
        }
    }

    fn closes_after(&self, reply: &Reply) -> bool {
        let rid = match reply {
            Reply::Error { .. } => return true,
            Reply::Ack { id, .. } => Some(id),
            Reply::Pong { id } | Reply::Unsubscribed { id, .. } | Reply::Subscribed { id, .. } => {
                id.as_ref()
            }
            Reply::Authed { .. } => None,
        };
        let state = self.state.lock();
        rid.and_then(RequestId::as_u64)
            .and_then(|n| state.awaiting.get(&n))
            .is_some_and(|a| a.close && a.replies == 1)
    }

    fn dropped(&self, topic: &str, count: u64, reason: DropReason) -> Frame {
        let mut state = self.state.lock();
        let entry = state.dropped.entry(topic.to_owned()).or_insert((0, reason));
        entry.0 += count;
        entry.1 = reason;
        Frame::default()
    }
}

impl StompCodec {
    /// One awaited reply arrived (`note` records what it said): the RECEIPT once it was the
    /// last, else nothing.
    fn answered(
        &self,
        state: &mut State,
        id: Option<u64>,
        note: impl FnOnce(&mut Awaiting),
    ) -> Frame {
        let Some(n) = id else {
            return Frame::default();
        };
        let Some(awaiting) = state.awaiting.get_mut(&n) else {
            return Frame::default();
        };
        note(awaiting);
        awaiting.replies -= 1;
        if awaiting.replies > 0 {
            return Frame::default();
        }
        let done = state.awaiting.remove(&n).expect("looked up above");
        let Some(receipt) = &done.receipt else {
            return Frame::default();
        };
        let replayed = done.replayed.to_string();
        let gaps = done.gaps.join("; ");
        let mut extra: Vec<(&str, &str)> = Vec::new();
        if let Some(cursor) = &done.cursor {
            extra.push(("cursor", cursor));
            extra.push(("replayed", &replayed));
            if !gaps.is_empty() {
                extra.push(("gap", &gaps));
            }
        }
        self.control(encode::receipt(receipt, &extra, state.version))
    }
}

/// `since`'s value on SUBSCRIBE: `<seq>@<epoch>`, as a MESSAGE's `seq` and `epoch` headers
/// give them.
pub fn parse_since(value: &str) -> Option<(u64, String)> {
    let (seq, epoch) = value.split_once('@')?;
    let seq = seq.trim();
    let seq = (!seq.is_empty() && seq.bytes().all(|b| b.is_ascii_digit()))
        .then(|| seq.parse().ok())
        .flatten()?;
    let epoch = epoch.trim();
    (!epoch.is_empty()).then(|| (seq, epoch.to_owned()))
}
