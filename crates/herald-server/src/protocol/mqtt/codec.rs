//! One MQTT connection's [`Encode`]: what herald sends it, as MQTT packets.
//!
//! Unlike herald's own encoding, an MQTT PUBLISH depends on the connection: its QoS is the
//! granted QoS of the subscriptions that match it, a QoS 1 PUBLISH carries the connection's
//! next packet identifier, and a subscription's SUBACK waits for the answers to all of its
//! herald subscribes. So each connection has its own [`Encoder`], sharing its [`Outbound`]
//! state with the connection's session ([`super::session`]), which records subscriptions and
//! the requests whose replies come back here.
//!
//! What is the same on every connection is still encoded once per message: a QoS 0 PUBLISH
//! (the common case) is cached in the message's [`SLOT`], in all four forms a subscriber may
//! need (3.1.1 or 5.0, each bare for a stream or behind a WebSocket header), one buffer that
//! each connection slices its form out of.
//!
//! Replies are matched to their MQTT packets by request id ([`Tag`]), a number that names the
//! packet to answer and its packet identifier.
//!
//! QoS 1 messages go through the session's [`Flow`]: at most the client's Receive Maximum in
//! flight on the connection, the rest waiting in order for acknowledgements. A message the
//! engine charged to a `lossless` subscription but that the connection does not send (a `$`
//! topic under a leading wildcard, too large for the client, already delivered) gives its
//! credit back at once, through the hook the session sets ([`Encoder::on_unspent_credit`]).

use super::delivery::{Flow, Gaps, Held, Lost, Seen, GAP_PROPERTY};
use super::encode::{self, AckKind, Delivery, Prepared, ProblemInfo};
use super::packet::MessageProperties;
use super::retained::{Retained, RetainedStore};
use super::topic::{mqtt_matches, to_mqtt_topic};
use super::wire::read_varint;
use super::{QoS, ReasonCode, Version};
use crate::connection::Framing;
use bytes::{BufMut, Bytes, BytesMut};
use herald_core::codec::{Encode, Frame};
use herald_core::message::Message;
use herald_core::reply::{DropReason, Reply};
use herald_core::request::{PayloadKind, RequestId};
use herald_core::topic::matches;
use herald_core::wire::{ws_header, OpCode};
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, OnceLock};

/// The message cache slot MQTT's QoS 0 PUBLISH takes (herald's JSON has slot 0).
pub const SLOT: usize = 1;

/// `packet` as a connection of `framing` sends it: back to back on a stream, each in a binary
/// WebSocket message of its own.
pub fn framed(framing: Framing, packet: Bytes) -> Frame {
    match framing {
        Framing::Stream => Frame {
            head: packet,
            body: Bytes::new(),
        },
        Framing::WebSocket => herald_core::wire::encode_binary(packet),
    }
}

/// What a request id says about the MQTT packet its reply answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tag {
    /// A PUBLISH: answered with PUBACK (QoS 1) or PUBREC (QoS 2), or not at all (QoS 0);
    /// `retain`: the key of its retained message, kept once herald accepts the publish.
    Publish {
        qos: QoS,
        packet_id: u16,
        retain: Option<u16>,
    },
    /// One herald subscribe of filter `filter` of a SUBSCRIBE.
    Subscribe { packet_id: u16, filter: u16 },
    /// One herald unsubscribe of an UNSUBSCRIBE.
    Unsubscribe { packet_id: u16 },
}

impl Tag {
    pub fn id(self) -> RequestId {
        let n: u64 = match self {
            Tag::Publish {
                qos,
                packet_id,
                retain,
            } => {
                let retain = retain.map_or(0, |k| u64::from(k) + 1);
                1 << 48 | (qos as u64) << 40 | retain << 16 | u64::from(packet_id)
            }
            Tag::Subscribe { packet_id, filter } => {
                2 << 48 | u64::from(filter) << 16 | u64::from(packet_id)
            }
            Tag::Unsubscribe { packet_id } => 3 << 48 | u64::from(packet_id),
        };
        RequestId::from(n)
    }

    pub fn of(id: &RequestId) -> Option<Tag> {
        let n = id.as_u64()?;
        let packet_id = n as u16;
        Some(match n >> 48 {
            1 => Tag::Publish {
                qos: QoS::from_bits((n >> 40) as u8 & 3)?,
                packet_id,
                retain: match (n >> 16) as u32 & 0x1_FFFF {
                    0 => None,
                    k => Some((k - 1) as u16),
                },
            },
            2 => Tag::Subscribe {
                packet_id,
                filter: (n >> 16) as u16,
            },
            3 => Tag::Unsubscribe { packet_id },
            _ => return None,
        })
    }
}

/// One MQTT subscription of the connection.
#[derive(Debug, Clone)]
pub struct Sub {
    /// The MQTT filter, as subscribed.
    pub filter: String,
    /// Its herald patterns.
    pub patterns: Vec<String>,
    /// The QoS granted (0 or 1).
    pub qos: QoS,
    /// Whether its herald subscriptions are `lossless` (a granted QoS 1), so that a message
    /// sent for it spends credit that its PUBACK returns.
    pub lossless: bool,
}

/// A SUBACK or UNSUBACK waiting for the replies to its herald requests.
#[derive(Debug)]
struct PendingAck {
    codes: Vec<ReasonCode>,
    outstanding: usize,
    /// SUBACK: per filter, the subscription it asks for and whether its retained messages go
    /// out once it is granted (`None`: refused before herald was asked).
    subs: Vec<Option<(Sub, bool)>>,
}

/// A connection's MQTT state the session and its encoder share.
#[derive(Debug)]
pub struct Outbound {
    pub version: Version,
    /// The largest packet the client accepts.
    pub maximum_packet_size: u32,
    /// Whether 5.0 reason strings may go with errors.
    pub problem_info: bool,
    pub subs: Vec<Sub>,
    /// QoS 1 messages in flight and waiting for room under the client's receive maximum.
    pub flow: Flow,
    /// Losses to announce on the next message of their topic (5.0).
    pub gaps: Gaps,
    /// For a session that may outlive its connection: what it has delivered.
    pub seen: Option<Seen>,
    /// Messages queued ahead of any live one that spent no `lossless` credit (handed over
    /// when a session resumes): the next this many messages encoded return none.
    pub uncredited: usize,
    subacks: HashMap<u16, PendingAck>,
    unsubacks: HashMap<u16, PendingAck>,
    /// Retained messages published and not yet accepted by herald, by key.
    retaining: HashMap<u16, (String, Retained)>,
    next_retain_key: u16,
    /// QoS 2 PUBLISH packets received whose PUBREL has not come (§4.3.3): a PUBLISH with one
    /// of these identifiers is a duplicate, not published again.
    pub awaiting_release: HashSet<u16>,
}

/// What a session keeps from one connection to the next (§4.1): its subscriptions, the QoS 1
/// messages it owes the client, the QoS 2 messages it received and awaits the release of, and
/// what it has delivered.
#[derive(Debug, Default)]
pub struct Kept {
    pub subs: Vec<Sub>,
    pub flow: Flow,
    pub gaps: Gaps,
    pub seen: Seen,
    pub awaiting_release: HashSet<u16>,
}

impl Default for Outbound {
    fn default() -> Self {
        Outbound {
            version: Version::V311,
            maximum_packet_size: u32::MAX,
            problem_info: true,
            subs: Vec::new(),
            flow: Flow::default(),
            gaps: Gaps::default(),
            seen: None,
            uncredited: 0,
            subacks: HashMap::new(),
            unsubacks: HashMap::new(),
            retaining: HashMap::new(),
            next_retain_key: 0,
            awaiting_release: Default::default(),
        }
    }
}

impl Outbound {
    /// The session state this connection holds, taken (its connection is ending, or another
    /// connection takes the session over): what is left encodes nothing more.
    pub fn take_session(&mut self) -> Kept {
        Kept {
            subs: std::mem::take(&mut self.subs),
            flow: std::mem::take(&mut self.flow),
            gaps: std::mem::take(&mut self.gaps),
            seen: self.seen.take().unwrap_or_default(),
            awaiting_release: std::mem::take(&mut self.awaiting_release),
        }
    }

    /// Takes up a session kept from an earlier connection, keeping this connection's receive
    /// maximum and whether its session may outlive it; nothing it owes has spent credit of
    /// this connection's subscriptions.
    pub fn resume(&mut self, kept: Kept, receive_maximum: u16) {
        let persistent = self.seen.is_some();
        self.subs = kept.subs;
        self.flow = kept.flow;
        self.flow.set_receive_maximum(receive_maximum);
        self.flow.forget_credit();
        self.gaps.merge(kept.gaps);
        self.seen = persistent.then_some(kept.seen);
        self.awaiting_release = kept.awaiting_release;
    }

    /// Keeps a retained message until herald accepts its publish; the key for its [`Tag`].
    pub fn retain(&mut self, topic: String, message: Retained) -> u16 {
        let key = self.next_retain_key;
        self.next_retain_key = self.next_retain_key.wrapping_add(1);
        self.retaining.insert(key, (topic, message));
        key
    }

    /// Waits for `outstanding` replies before sending SUBACK `packet_id`.
    pub fn expect_suback(
        &mut self,
        packet_id: u16,
        codes: Vec<ReasonCode>,
        subs: Vec<Option<(Sub, bool)>>,
        outstanding: usize,
    ) {
        let pending = PendingAck {
            codes,
            outstanding,
            subs,
        };
        self.subacks.insert(packet_id, pending);
    }

    /// Waits for `outstanding` replies before sending UNSUBACK `packet_id`.
    pub fn expect_unsuback(&mut self, packet_id: u16, codes: Vec<ReasonCode>, outstanding: usize) {
        let pending = PendingAck {
            codes,
            outstanding,
            subs: Vec::new(),
        };
        self.unsubacks.insert(packet_id, pending);
    }

    /// The highest QoS granted among the subscriptions MQTT topic `name` matches; `None`: no
    /// subscription matches in MQTT's terms (a leading wildcard and a `$` topic).
    fn route(&self, name: &str) -> Option<QoS> {
        self.subs
            .iter()
            .filter(|sub| mqtt_matches(&sub.filter, name))
            .map(|sub| sub.qos)
            .max()
    }

    /// Whether a subscription of the session still matches `held`.
    fn routes(&self, held: &Held) -> bool {
        match held {
            Held::Live(m) => {
                to_mqtt_topic(m.topic()).is_some_and(|name| self.route(&name).is_some())
            }
            Held::Retained { name, .. } => self.route(name).is_some(),
        }
    }

    /// The herald pattern whose `lossless` credit the engine spent on a message of herald
    /// topic `topic`: the first `lossless` subscription whose pattern matches it in herald's
    /// terms, as the engine chooses, whether or not MQTT's rules then send the message.
    fn charged(&self, topic: &str) -> Option<Arc<str>> {
        self.subs
            .iter()
            .filter(|sub| sub.lossless)
            .flat_map(|sub| &sub.patterns)
            .find(|p| matches(p, topic))
            .map(|p| Arc::from(p.as_str()))
    }

    fn problem(&self, reason: &'static str) -> ProblemInfo<'static> {
        ProblemInfo {
            reason_string: self.problem_info.then_some(reason),
            user_properties: &[],
        }
    }
}

/// The encoder of one MQTT connection.
pub struct Encoder {
    framing: Framing,
    retained: Arc<RetainedStore>,
    state: Arc<Mutex<Outbound>>,
    unspent: OnceLock<UnspentCredit>,
}

/// Gives a herald pattern's `lossless` credit back to the engine for a message the engine
/// charged to it and the connection did not send. Called while the connection's queue is
/// drained, under its locks: it must not wait for the engine (the session's hook hands the
/// credit to a task).
pub type UnspentCredit = Box<dyn Fn(Arc<str>) + Send + Sync>;

impl Encoder {
    pub fn new(
        framing: Framing,
        retained: Arc<RetainedStore>,
        state: Arc<Mutex<Outbound>>,
    ) -> Encoder {
        Encoder {
            framing,
            retained,
            state,
            unspent: OnceLock::new(),
        }
    }

    /// Sets how credit the connection did not spend goes back (once: later calls are
    /// ignored).
    pub fn on_unspent_credit(&self, give_back: UnspentCredit) {
        let _ = self.unspent.set(give_back);
    }

    fn give_back(&self, credit: Option<Arc<str>>) {
        if let (Some(pattern), Some(give_back)) = (credit, self.unspent.get()) {
            give_back(pattern);
        }
    }

    /// `packet` framed for the framing, or nothing when it is larger than the client
    /// accepts (§3.1.2.11.4: the server discards it).
    fn fits(&self, s: &Outbound, head: Bytes, body: Bytes) -> Frame {
        if head.len() + body.len() > s.maximum_packet_size as usize {
            return Frame::default();
        }
        match self.framing {
            Framing::Stream => Frame { head, body },
            Framing::WebSocket => {
                let mut h = BytesMut::with_capacity(10 + head.len());
                h.put_slice(&ws_header(OpCode::Binary, head.len() + body.len()));
                h.put_slice(&head);
                Frame {
                    head: h.freeze(),
                    body,
                }
            }
        }
    }

    /// A PUBLISH of `name` for this connection, `packet_id` set when `qos` is 1; 5.0: `lost`
    /// announces the messages of its topic lost before it ([`GAP_PROPERTY`]).
    #[allow(clippy::too_many_arguments)]
    fn publish(
        &self,
        s: &Outbound,
        name: &str,
        m: &Publishable,
        qos: QoS,
        packet_id: u16,
        retain: bool,
        dup: bool,
        lost: Option<Lost>,
    ) -> Frame {
        let mut properties = m.properties();
        if let Some(lost) = lost {
            properties
                .user_properties
                .push((GAP_PROPERTY.into(), lost.value()));
        }
        let prepared = Prepared::new(s.version, name, &properties, m.payload.clone());
        let delivery = Delivery {
            qos,
            packet_id,
            retain,
            dup,
            ..Delivery::default()
        };
        match prepared.head(&delivery) {
            Ok(head) => self.fits(s, head, prepared.body()),
            Err(_) => Frame::default(),
        }
    }

    /// SUBACK `packet_id`, then the retained messages of the filters it grants that asked for
    /// them.
    fn suback(&self, s: &mut Outbound, packet_id: u16, pending: PendingAck) -> Frame {
        let info = ProblemInfo::default();
        let mut out = BytesMut::new();
        out.put_slice(&self.frame_bytes(encode::suback(
            s.version,
            packet_id,
            &pending.codes,
            info,
        )));
        for (code, sub) in pending.codes.iter().zip(&pending.subs) {
            match sub {
                Some((sub, true)) if !code.is_error() => self.retained_for(s, sub, &mut out),
                _ => {}
            }
        }
        Frame {
            head: out.freeze(),
            body: Bytes::new(),
        }
    }

    /// Appends the retained messages `sub` matches, retain flag set, at the lower of their
    /// QoS and its own (QoS 1 ones as the receive maximum lets them go).
    fn retained_for(&self, s: &mut Outbound, sub: &Sub, out: &mut BytesMut) {
        for (name, message) in self.retained.matching(&sub.filter) {
            let frame = match message.qos.min(sub.qos) {
                QoS::AtMostOnce => {
                    let m = Publishable::from(&message);
                    let qos = QoS::AtMostOnce;
                    self.publish(s, &name, &m, qos, 0, true, false, None)
                }
                _ => self.send_qos1(s, Held::Retained { name, message }, None),
            };
            out.put_slice(&frame.head);
            out.put_slice(&frame.body);
        }
    }

    /// The QoS 1 PUBLISH of `held`, recorded in flight, if the client has room; else it waits
    /// behind the others. Not sent at all when larger than the client accepts: its credit goes
    /// back, and its topic's next message announces the loss.
    fn send_qos1(&self, s: &mut Outbound, held: Held, credit: Option<Arc<str>>) -> Frame {
        if !s.flow.has_room() {
            s.flow.wait(held, credit);
            return Frame::default();
        }
        self.send_now(s, held, credit)
    }

    /// [`Encoder::send_qos1`] with room for `held` (so fewer than 65,535 messages in flight,
    /// and an identifier free).
    fn send_now(&self, s: &mut Outbound, held: Held, credit: Option<Arc<str>>) -> Frame {
        let packet_id = s.flow.free_id();
        let frame = match packet_id {
            Some(id) => self.held_publish(s, &held, id, false),
            None => Frame::default(),
        };
        let (Some(packet_id), false) = (packet_id, frame.is_empty()) else {
            if let Some(topic) = held.topic() {
                s.gaps.add(topic, Lost::Count(1));
            }
            self.give_back(credit);
            return frame;
        };
        s.flow.sent(packet_id, held, credit);
        frame
    }

    /// The QoS 1 PUBLISH of `held` with `packet_id`, with the loss to announce on its topic.
    fn held_publish(&self, s: &mut Outbound, held: &Held, packet_id: u16, dup: bool) -> Frame {
        let topic = held.topic();
        let lost = topic.and_then(|t| s.gaps.take(t));
        let qos = QoS::AtLeastOnce;
        let frame = match held {
            Held::Live(m) => match to_mqtt_topic(m.topic()) {
                Some(name) => {
                    let p = Publishable::from(m);
                    self.publish(s, &name, &p, qos, packet_id, false, dup, lost)
                }
                None => Frame::default(),
            },
            Held::Retained { name, message } => {
                let p = Publishable::from(message);
                self.publish(s, name, &p, qos, packet_id, true, dup, lost)
            }
        };
        if let (true, Some(topic), Some(lost)) = (frame.is_empty(), topic, lost) {
            s.gaps.add(topic, lost);
        }
        frame
    }

    /// The QoS 1 messages that were waiting and the room an acknowledgement made lets go (but
    /// not those no subscription matches any more).
    pub fn release(&self, s: &mut Outbound) -> Vec<Frame> {
        let mut frames = Vec::new();
        while let Some((held, credit)) = s.flow.next_waiting() {
            if !s.routes(&held) {
                self.give_back(credit);
                continue;
            }
            let frame = self.send_now(s, held, credit);
            if !frame.is_empty() {
                frames.push(frame);
            }
        }
        frames
    }

    /// The QoS 1 PUBLISH packets in flight, sent again with DUP set and their packet
    /// identifiers, in the order first sent (§4.4: a resumed session), then what now has room.
    /// One no subscription of the session matches any more (one the new connection's token
    /// does not grant) is no longer in flight; nor is one too large for this connection's
    /// client, which counts as lost.
    pub fn resend(&self, s: &mut Outbound) -> Vec<Frame> {
        let unacknowledged: Vec<(u16, Held)> = s
            .flow
            .unacknowledged()
            .into_iter()
            .map(|(id, held)| (id, held.clone()))
            .collect();
        let mut frames = Vec::new();
        for (id, held) in unacknowledged {
            if !s.routes(&held) {
                s.flow.acknowledged(id);
                continue;
            }
            let frame = self.held_publish(s, &held, id, true);
            if !frame.is_empty() {
                frames.push(frame);
                continue;
            }
            s.flow.acknowledged(id);
            if let Some(topic) = held.topic() {
                s.gaps.add(topic, Lost::Count(1));
            }
        }
        frames.extend(self.release(s));
        frames
    }

    fn frame_bytes(&self, packet: Bytes) -> Bytes {
        let frame = framed(self.framing, packet);
        if frame.body.is_empty() {
            frame.head
        } else {
            Bytes::from(frame.to_vec())
        }
    }

    /// The reply to a publish: its acknowledgement, and its retained message kept or let go.
    fn published(&self, s: &mut Outbound, tag: Tag, outcome: Result<(), ReasonCode>) -> Frame {
        let Tag::Publish {
            qos,
            packet_id,
            retain,
        } = tag
        else {
            return Frame::default();
        };
        let mut reason = outcome.err().unwrap_or(ReasonCode::Success);
        if let Some((topic, message)) = retain.and_then(|k| s.retaining.remove(&k)) {
            if reason == ReasonCode::Success && self.retained.publish(&topic, message).is_err() {
                reason = ReasonCode::QuotaExceeded;
            }
        }
        let kind = match qos {
            QoS::AtMostOnce => return Frame::default(),
            QoS::AtLeastOnce => AckKind::PubAck,
            QoS::ExactlyOnce => {
                if reason.is_error() {
                    // A refused QoS 2 message ends its exchange here (§4.3.3).
                    s.awaiting_release.remove(&packet_id);
                }
                AckKind::PubRec
            }
        };
        let info = if reason.is_error() {
            s.problem("herald refused the message")
        } else {
            ProblemInfo::default()
        };
        framed(
            self.framing,
            encode::ack(s.version, kind, packet_id, reason, info),
        )
    }

    /// One reply to a SUBSCRIBE's or UNSUBSCRIBE's herald requests: the SUBACK or UNSUBACK
    /// once it is the last.
    fn answered(&self, s: &mut Outbound, tag: Tag, error: Option<ReasonCode>) -> Frame {
        match tag {
            Tag::Subscribe { packet_id, filter } => {
                let Some(pending) = s.subacks.get_mut(&packet_id) else {
                    return Frame::default();
                };
                let at = filter as usize;
                if let (Some(code), Some(slot)) = (error, pending.codes.get_mut(at)) {
                    *slot = code;
                    // Refused: not a subscription of the connection.
                    if let Some(Some((sub, _))) = pending.subs.get(at) {
                        let filter = sub.filter.clone();
                        s.subs.retain(|x| x.filter != filter);
                    }
                }
                pending.outstanding = pending.outstanding.saturating_sub(1);
                if pending.outstanding > 0 {
                    return Frame::default();
                }
                let pending = s.subacks.remove(&packet_id).expect("looked up above");
                self.suback(s, packet_id, pending)
            }
            Tag::Unsubscribe { packet_id } => {
                let Some(pending) = s.unsubacks.get_mut(&packet_id) else {
                    return Frame::default();
                };
                pending.outstanding = pending.outstanding.saturating_sub(1);
                if pending.outstanding > 0 {
                    return Frame::default();
                }
                let pending = s.unsubacks.remove(&packet_id).expect("looked up above");
                let packet =
                    encode::unsuback(s.version, packet_id, &pending.codes, ProblemInfo::default());
                framed(self.framing, packet)
            }
            Tag::Publish { .. } => self.published(s, tag, error.map_or(Ok(()), Err)),
        }
    }

    /// A SUBACK for subscriptions settled without herald (all refused, or none to ask for).
    pub fn suback_now(&self, s: &mut Outbound, packet_id: u16, codes: Vec<ReasonCode>) -> Frame {
        let pending = PendingAck {
            subs: vec![None; codes.len()],
            codes,
            outstanding: 0,
        };
        self.suback(s, packet_id, pending)
    }
}

/// What a PUBLISH is made of, from a herald message or a retained one.
struct Publishable<'a> {
    payload: &'a Bytes,
    kind: PayloadKind,
    content_type: Option<&'a str>,
}

impl<'a> From<&'a Message> for Publishable<'a> {
    fn from(m: &'a Message) -> Self {
        Publishable {
            payload: m.payload(),
            kind: m.kind(),
            content_type: m.content_type(),
        }
    }
}

impl<'a> From<&'a Retained> for Publishable<'a> {
    fn from(m: &'a Retained) -> Self {
        Publishable {
            payload: &m.payload,
            kind: m.kind,
            content_type: m.content_type.as_deref(),
        }
    }
}

impl Publishable<'_> {
    /// herald's text is MQTT's payload format indicator 1; its content type is MQTT's.
    fn properties(&self) -> MessageProperties {
        MessageProperties {
            payload_utf8: self.kind == PayloadKind::Text,
            content_type: self.content_type.map(str::to_owned),
            ..MessageProperties::default()
        }
    }
}

/// The reason code for a herald error code, in a PUBACK, PUBREC or SUBACK.
pub fn reason_for(code: &str) -> ReasonCode {
    match code {
        "forbidden" | "unauthorized" | "not_lossless" => ReasonCode::NotAuthorized,
        "bad_topic" | "topic_too_long" | "too_many_levels" | "empty_topic" | "bad_pattern" => {
            ReasonCode::TopicNameInvalid
        }
        "too_many_topics" | "retained_limit" | "too_many_subscriptions" => {
            ReasonCode::QuotaExceeded
        }
        "message_too_large" => ReasonCode::PacketTooLarge,
        "bad_frame" => ReasonCode::PayloadFormatInvalid,
        _ => ReasonCode::UnspecifiedError,
    }
}

/// The four forms of a message's QoS 0 PUBLISH in one buffer: for 3.1.1 then 5.0, each a
/// WebSocket binary header followed by the packet's head (the payload follows every head).
fn shared_heads(m: &Message) -> Frame {
    let Some(name) = to_mqtt_topic(m.topic()) else {
        return Frame::default();
    };
    let p = Publishable::from(m);
    let props = p.properties();
    let mut out = BytesMut::new();
    for version in [Version::V311, Version::V5] {
        let prepared = Prepared::new(version, &name, &props, m.payload().clone());
        let Ok(head) = prepared.head(&Delivery::default()) else {
            return Frame::default();
        };
        out.put_slice(&ws_header(OpCode::Binary, head.len() + m.payload().len()));
        out.put_slice(&head);
    }
    Frame {
        head: out.freeze(),
        body: m.payload().clone(),
    }
}

/// The form of [`shared_heads`] `version` over `framing` sends, sliced out (no copy), and
/// the length of the MQTT packet it heads.
fn shared_head(
    all: &Bytes,
    payload_len: usize,
    version: Version,
    framing: Framing,
) -> (Bytes, usize) {
    let mut at = 0;
    for v in [Version::V311, Version::V5] {
        let ws = match all[at + 1] {
            126 => 4,
            127 => 10,
            _ => 2,
        };
        let packet = &all[at + ws..];
        let (remaining, len_bytes) = read_varint(&packet[1..], false)
            .ok()
            .flatten()
            .expect("written by shared_heads");
        let head = 1 + len_bytes + remaining as usize - payload_len;
        if v == version {
            let slice = match framing {
                Framing::Stream => all.slice(at + ws..at + ws + head),
                Framing::WebSocket => all.slice(at..at + ws + head),
            };
            return (slice, head + payload_len);
        }
        at += ws + head;
    }
    unreachable!("both versions are written")
}

impl Encoder {
    /// The PUBLISH this connection is sent for `message`, or an empty frame when it is not
    /// sent one (a name MQTT cannot carry, a `$` topic under a leading wildcard, already
    /// delivered, larger than the client's maximum packet size) or not yet (QoS 1 waiting for
    /// room). Credit the engine charged for a message not sent goes back.
    fn publish_of(&self, message: &Message) -> Frame {
        let mut s = self.state.lock();
        let credit = match s.uncredited {
            0 => s.charged(message.topic()),
            _ => {
                s.uncredited -= 1;
                None
            }
        };
        let name = to_mqtt_topic(message.topic());
        let qos = name.as_deref().and_then(|name| s.route(name));
        let new = s.seen.as_mut().is_none_or(|seen| seen.delivered(message));
        let (Some(name), Some(qos), true) = (name, qos, new) else {
            self.give_back(credit);
            return Frame::default();
        };
        if qos != QoS::AtMostOnce {
            return self.send_qos1(&mut s, Held::Live(message.clone()), credit);
        }
        // QoS 0 (a lossless pattern may match it in herald's terms, a QoS 0 filter in MQTT's).
        self.give_back(credit);
        if let Some(lost) = s.gaps.take(message.topic()) {
            let p = Publishable::from(message);
            let frame = self.publish(&s, &name, &p, qos, 0, false, false, Some(lost));
            if frame.is_empty() {
                s.gaps.add(message.topic(), lost.and(Lost::Count(1)));
            }
            return frame;
        }
        let all = message.encoded(SLOT, shared_heads);
        if all.is_empty() {
            return Frame::default();
        }
        let (head, packet_len) = shared_head(&all.head, all.body.len(), s.version, self.framing);
        if packet_len > s.maximum_packet_size as usize {
            s.gaps.add(message.topic(), Lost::Count(1));
            return Frame::default();
        }
        Frame {
            head,
            body: all.body,
        }
    }
}

impl Encode for Encoder {
    fn message(&self, message: &Message, out: &mut Vec<Frame>) {
        let frame = self.publish_of(message);
        if !frame.is_empty() {
            out.push(frame);
        }
    }

    fn reply(&self, reply: &Reply) -> Frame {
        let mut s = self.state.lock();
        match reply {
            Reply::Ack { id, .. } => match Tag::of(id) {
                Some(tag) => self.published(&mut s, tag, Ok(())),
                None => Frame::default(),
            },
            Reply::Subscribed {
                id: Some(id),
                topic,
                cursor,
                ..
            } => {
                if let Some(seen) = s.seen.as_mut() {
                    seen.subscribed(topic, cursor);
                }
                match Tag::of(id) {
                    Some(tag) => self.answered(&mut s, tag, None),
                    None => Frame::default(),
                }
            }
            Reply::Unsubscribed { id: Some(id), .. } => match Tag::of(id) {
                Some(tag) => self.answered(&mut s, tag, None),
                None => Frame::default(),
            },
            Reply::Error {
                id: Some(id), code, ..
            } => match Tag::of(id) {
                Some(tag @ Tag::Subscribe { .. }) => {
                    let reason = match reason_for(code) {
                        ReasonCode::TopicNameInvalid => ReasonCode::TopicFilterInvalid,
                        other => other,
                    };
                    self.answered(&mut s, tag, Some(reason))
                }
                Some(tag) => self.answered(&mut s, tag, Some(reason_for(code))),
                None => Frame::default(),
            },
            _ => Frame::default(),
        }
    }

    /// MQTT has no notice of lost messages: 5.0 marks the topic's next message instead
    /// ([`GAP_PROPERTY`]); 3.1.1 loses them without a word (`docs/mqtt.md`).
    fn dropped(&self, topic: &str, count: u64, _: DropReason) -> Frame {
        self.state.lock().gaps.add(topic, Lost::Count(count));
        Frame::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use herald_core::message::TopicHead;

    /// Every form sliced out of the cached buffer is the packet [`Prepared`] makes, behind a
    /// WebSocket header where the framing needs one.
    #[test]
    fn each_cached_form_is_the_packet_for_its_version_and_transport() {
        for len in [0, 3, 200, 70_000] {
            let payload = Bytes::from(vec![7u8; len]);
            let head = TopicHead::new("a/b".into(), "e".into());
            let m = Message::new(
                head,
                1,
                PayloadKind::Text,
                payload.clone(),
                Some("t/x".into()),
                None,
            );
            let all = shared_heads(&m);
            for version in [Version::V311, Version::V5] {
                let p = Publishable::from(&m);
                let expected = Prepared::new(version, "a/b", &p.properties(), payload.clone())
                    .head(&Delivery::default())
                    .unwrap();
                let (bare, n) = shared_head(&all.head, len, version, Framing::Stream);
                assert_eq!((bare.clone(), n), (expected.clone(), expected.len() + len));
                let (ws, _) = shared_head(&all.head, len, version, Framing::WebSocket);
                let header = ws_header(OpCode::Binary, expected.len() + len);
                assert_eq!(ws, [&header[..], &expected[..]].concat());
            }
        }
    }

    #[test]
    fn tags_survive_the_round_trip_through_a_request_id() {
        let tags = [
            Tag::Publish {
                qos: QoS::ExactlyOnce,
                packet_id: 65_535,
                retain: Some(65_535),
            },
            Tag::Publish {
                qos: QoS::AtMostOnce,
                packet_id: 0,
                retain: None,
            },
            Tag::Subscribe {
                packet_id: 1,
                filter: 300,
            },
            Tag::Unsubscribe { packet_id: 2 },
        ];
        for tag in tags {
            assert_eq!(Tag::of(&tag.id()), Some(tag));
        }
        assert_eq!(Tag::of(&RequestId::from("client id")), None);
    }
}
