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
//! A message for a shared subscription comes for the group it is named after
//! ([`Encode::grouped`]) and goes out for that subscription alone; a connection whose
//! subscriptions are all plain ([`Subs`]) sends every message the same shared packet without
//! looking at them.
//!
//! QoS 1 messages go through the session's [`Flow`]: at most the client's Receive Maximum in
//! flight on the connection, the rest waiting in order for acknowledgements. A message the
//! engine charged to a `lossless` subscription or group membership but that the connection
//! does not send (a `$` topic under a leading wildcard, expired, too large for the client,
//! already delivered, no longer subscribed to) gives its credit back at once, through the hook
//! the session sets ([`Encoder::on_unspent_credit`]), so that no publisher waits for an
//! acknowledgement that cannot come.

use super::delivery::{CreditTo, Flow, Gaps, Held, Lost, Seen, GAP_PROPERTY};
use super::encode::{self, AckKind, Delivery, Prepared, ProblemInfo};
use super::extras;
use super::packet::MessageProperties;
use super::retained::{Retained, RetainedStore};
use super::topic::{mqtt_matches, to_mqtt_topic};
use super::{QoS, ReasonCode, Version};
use crate::clock::now_us;
use crate::connection::Framing;
use bytes::{BufMut, Bytes, BytesMut};
use herald_core::codec::{Encode, Frame};
use herald_core::extras::Extras;
use herald_core::group::Group;
use herald_core::message::Message;
use herald_core::reply::{DropReason, Reply};
use herald_core::request::{PayloadKind, RequestId};
use herald_core::topic::matches;
use herald_core::wire::{ws_header, OpCode};
use parking_lot::Mutex;
use std::borrow::Cow;
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
    /// The subscription as SUBSCRIBE and UNSUBSCRIBE name it: its filter, behind
    /// `$share/{group}/` when shared.
    pub name: String,
    /// The MQTT filter it matches names with.
    pub filter: String,
    /// A shared subscription: its patterns are herald group subscriptions of the group named
    /// after it (`name`, so that each shared subscription is a group of its own).
    pub shared: bool,
    /// Its herald patterns.
    pub patterns: Vec<String>,
    /// The QoS granted (0 or 1).
    pub qos: QoS,
    /// Whether its herald subscriptions are `lossless` (a granted QoS 1), so that a message
    /// sent for it spends credit that its PUBACK returns.
    pub lossless: bool,
    /// 5.0: messages keep the retain flag they were published with.
    pub retain_as_published: bool,
    /// 5.0: the subscription identifier its PUBLISH packets carry.
    pub id: Option<u32>,
    /// 5.0: the connection's own messages do not come back through it (the engine's
    /// `no_local`; kept so that a resumed session subscribes as its SUBSCRIBE did).
    pub no_local: bool,
}

impl Sub {
    /// Whether a message for it is the same packet for every QoS 0 subscriber: QoS 0, not
    /// shared, no identifier, no retain as published.
    fn is_plain(&self) -> bool {
        self.qos == QoS::AtMostOnce
            && !self.lossless
            && !self.shared
            && !self.retain_as_published
            && self.id.is_none()
    }
}

/// A connection's subscriptions, one per name, counting those that are not plain
/// ([`Sub::is_plain`]): while none is, a message needs no look at them (a connection may hold
/// hundreds, and matching each filter for each message would cost more than the delivery).
#[derive(Debug, Default)]
pub struct Subs {
    list: Vec<Sub>,
    special: usize,
}

impl Subs {
    /// Adds `sub`, replacing the subscription of the same name; whether there was one.
    pub fn insert(&mut self, sub: Sub) -> bool {
        let existed = self.remove(&sub.name).is_some();
        self.special += usize::from(!sub.is_plain());
        self.list.push(sub);
        existed
    }

    /// Removes the subscription named `name`.
    pub fn remove(&mut self, name: &str) -> Option<Sub> {
        let at = self.list.iter().position(|x| x.name == name)?;
        let sub = self.list.remove(at);
        self.special -= usize::from(!sub.is_plain());
        Some(sub)
    }

    pub fn iter(&self) -> std::slice::Iter<'_, Sub> {
        self.list.iter()
    }

    /// Keeps only the subscriptions `keep` says yes to.
    pub fn retain(&mut self, keep: impl FnMut(&Sub) -> bool) {
        self.list.retain(keep);
        self.special = self.list.iter().filter(|sub| !sub.is_plain()).count();
    }

    /// Whether every subscription is plain (none at all included).
    fn plain(&self) -> bool {
        self.special == 0
    }
}

/// How a message goes to the connection: what the subscriptions it is sent for make of it.
#[derive(Debug, Default)]
struct Route {
    qos: QoS,
    /// 5.0: keep the message's retain flag.
    retain_as_published: bool,
    /// 5.0: the subscription identifiers of those subscriptions.
    ids: Vec<u32>,
}

/// Why a QoS 1 message owed to the client is not sent after all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unsent {
    /// No subscription of the session sends it any more, or its expiry interval passed: the
    /// client is owed nothing.
    Withdrawn,
    /// Larger than the client accepts (§3.1.2.11.4): a loss its topic's next message
    /// announces.
    Undeliverable,
}

/// The time a message's remaining expiry interval is counted at (0: it has none), or
/// [`Unsent::Withdrawn`] once the interval has passed (§3.3.2.3.3: it is not sent).
fn clock(extras: Option<&Extras>) -> Result<u64, Unsent> {
    match extras.and_then(|e| e.expires_us) {
        Some(at) => {
            let now = now_us();
            if now >= at {
                return Err(Unsent::Withdrawn);
            }
            Ok(now)
        }
        None => Ok(0),
    }
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
    pub subs: Subs,
    /// QoS 1 messages in flight and waiting for room under the client's receive maximum.
    pub flow: Flow,
    /// Losses to announce on the next message of their topic (5.0).
    pub gaps: Gaps,
    /// For a session that may outlive its connection: what it has delivered.
    pub seen: Option<Seen>,
    /// Messages queued ahead of any live one that spent no `lossless` credit (handed over
    /// when a session resumes): the next this many messages encoded for the connection's own
    /// subscriptions return none.
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
    pub subs: Subs,
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
            subs: Subs::default(),
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

    /// How a message of MQTT name `name` (`None`: one MQTT cannot name) goes to the connection
    /// for its own (not shared) subscriptions: at the highest QoS granted among those `name`
    /// matches, with all their identifiers (`None`: none matches in MQTT's terms, as for a `$`
    /// topic under a leading wildcard); and, for a message that spent credit, of herald topic
    /// `charged`, where it goes back: the first `lossless` subscription whose herald pattern
    /// matches, as the engine chooses, whether or not MQTT's rules then send the message.
    fn route(
        &self,
        name: Option<&str>,
        charged: Option<&str>,
    ) -> (Option<Route>, Option<CreditTo>) {
        let mut route: Option<Route> = None;
        let mut credit = None;
        for sub in self.subs.iter().filter(|s| !s.shared) {
            if let (None, true, Some(topic)) = (&credit, sub.lossless, charged) {
                credit = sub
                    .patterns
                    .iter()
                    .find(|p| matches(p, topic))
                    .map(|p| CreditTo::Pattern(Arc::from(p.as_str())));
            }
            if !name.is_some_and(|name| mqtt_matches(&sub.filter, name)) {
                continue;
            }
            let r = route.get_or_insert_with(Route::default);
            r.qos = r.qos.max(sub.qos);
            r.retain_as_published |= sub.retain_as_published;
            r.ids.extend(sub.id);
        }
        (route, credit)
    }

    /// How a message delivered for `group` goes to the connection: for the shared
    /// subscription the group is named after, if the connection still holds it and its filter
    /// matches `name` in MQTT's terms; and the credit it spent.
    fn route_grouped(
        &self,
        group: &Arc<Group>,
        name: Option<&str>,
    ) -> (Option<Route>, Option<CreditTo>) {
        let Some(sub) = self
            .subs
            .iter()
            .find(|s| s.shared && *s.name == *group.name)
        else {
            return (None, None);
        };
        let credit = sub.lossless.then(|| CreditTo::Group(group.clone()));
        let matched = name.is_some_and(|name| mqtt_matches(&sub.filter, name));
        let route = matched.then(|| Route {
            qos: sub.qos,
            retain_as_published: sub.retain_as_published,
            ids: sub.id.into_iter().collect(),
        });
        (route, credit)
    }

    /// How `held` goes to the client now, if a subscription of the session still sends it.
    fn route_held(&self, held: &Held) -> Option<Route> {
        match held {
            Held::Live { message, group } => {
                let name = to_mqtt_topic(message.topic());
                match group {
                    Some(g) => self.route_grouped(g, name.as_deref()).0,
                    None => self.route(name.as_deref(), None).0,
                }
            }
            Held::Retained { name, .. } => self.route(Some(name), None).0,
        }
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

/// Gives `lossless` credit back to the engine (to a herald pattern of the connection, or its
/// membership of a group) for a message the engine charged to it and the connection did not
/// send. Called while the connection's queue is drained, under its locks: it must not wait for
/// the engine (the session's hook hands the credit to a task).
pub type UnspentCredit = Box<dyn Fn(CreditTo) + Send + Sync>;

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

    fn give_back(&self, credit: Option<CreditTo>) {
        if let (Some(credit), Some(give_back)) = (credit, self.unspent.get()) {
            give_back(credit);
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

    /// A PUBLISH of `name` for this connection as `delivery` says (its expiry interval set
    /// from the message's at `now_us`); 5.0: `lost` announces the messages of its topic lost
    /// before it ([`GAP_PROPERTY`]).
    fn publish(
        &self,
        s: &Outbound,
        name: &str,
        m: &Publishable,
        delivery: Delivery,
        now_us: u64,
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
            message_expiry_interval: extras::seconds_left(m.extras, now_us),
            ..delivery
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
        let now = now_us();
        for (name, message) in self.retained.matching(&sub.filter, now) {
            let route = Route {
                qos: message.qos.min(sub.qos),
                retain_as_published: true,
                ids: sub.id.into_iter().collect(),
            };
            let frame = match route.qos {
                QoS::AtMostOnce => {
                    let m = Publishable::from(&message);
                    let delivery = Delivery {
                        retain: true,
                        subscription_identifiers: &route.ids,
                        ..Delivery::default()
                    };
                    self.publish(s, &name, &m, delivery, now, None)
                }
                _ => self.send_qos1(s, Held::Retained { name, message }, route, None),
            };
            out.put_slice(&frame.head);
            out.put_slice(&frame.body);
        }
    }

    /// The QoS 1 PUBLISH of `held`, recorded in flight, if the client has room; else it waits
    /// behind the others.
    fn send_qos1(
        &self,
        s: &mut Outbound,
        held: Held,
        route: Route,
        credit: Option<CreditTo>,
    ) -> Frame {
        if !s.flow.has_room() {
            s.flow.wait(held, credit);
            return Frame::default();
        }
        self.send_now(s, held, route, credit)
    }

    /// [`Encoder::send_qos1`] with room for `held` (so fewer than 65,535 messages in flight,
    /// and an identifier free).
    fn send_now(
        &self,
        s: &mut Outbound,
        held: Held,
        route: Route,
        credit: Option<CreditTo>,
    ) -> Frame {
        let sent = match s.flow.free_id() {
            Some(id) => self
                .held_frame(s, &held, &route, id, false)
                .map(|f| (id, f)),
            None => Err(Unsent::Undeliverable),
        };
        match sent {
            Ok((packet_id, frame)) => {
                s.flow.sent(packet_id, held, credit);
                frame
            }
            Err(why) => {
                self.not_sent(s, &held, credit, why);
                Frame::default()
            }
        }
    }

    /// The QoS 1 PUBLISH of `held` with `packet_id` as `route` sends it (at QoS 1 whatever the
    /// QoS its subscriptions now grant: it is owed as such), with the loss to announce on its
    /// topic.
    fn held_frame(
        &self,
        s: &mut Outbound,
        held: &Held,
        route: &Route,
        packet_id: u16,
        dup: bool,
    ) -> Result<Frame, Unsent> {
        let (name, p, retain) = match held {
            Held::Live { message, .. } => {
                let extras = message.extras();
                let retain = route.retain_as_published && extras.is_some_and(|e| e.retain);
                let name = to_mqtt_topic(message.topic()).ok_or(Unsent::Withdrawn)?;
                (name, Publishable::from(message), retain)
            }
            Held::Retained { name, message } => (
                Cow::Borrowed(name.as_str()),
                Publishable::from(message),
                true,
            ),
        };
        let now = clock(p.extras)?;
        let topic = held.topic();
        let lost = topic.and_then(|t| s.gaps.take(t));
        let delivery = Delivery {
            qos: QoS::AtLeastOnce,
            packet_id,
            dup,
            retain,
            subscription_identifiers: &route.ids,
            ..Delivery::default()
        };
        let frame = self.publish(s, &name, &p, delivery, now, lost);
        if frame.is_empty() {
            if let (Some(topic), Some(lost)) = (topic, lost) {
                s.gaps.add(topic, lost);
            }
            return Err(Unsent::Undeliverable);
        }
        Ok(frame)
    }

    /// A QoS 1 message not sent after all: its credit goes back, and a loss is counted on its
    /// topic unless the message was `Withdrawn`.
    fn not_sent(&self, s: &mut Outbound, held: &Held, credit: Option<CreditTo>, why: Unsent) {
        if let (Unsent::Undeliverable, Some(topic)) = (why, held.topic()) {
            s.gaps.add(topic, Lost::Count(1));
        }
        self.give_back(credit);
    }

    /// The QoS 1 messages that were waiting and the room an acknowledgement made lets go (but
    /// not those no subscription sends any more).
    pub fn release(&self, s: &mut Outbound) -> Vec<Frame> {
        let mut frames = Vec::new();
        while let Some((held, credit)) = s.flow.next_waiting() {
            let Some(route) = s.route_held(&held) else {
                self.not_sent(s, &held, credit, Unsent::Withdrawn);
                continue;
            };
            let frame = self.send_now(s, held, route, credit);
            if !frame.is_empty() {
                frames.push(frame);
            }
        }
        frames
    }

    /// The QoS 1 PUBLISH packets in flight, sent again with DUP set and their packet
    /// identifiers, in the order first sent (§4.4: a resumed session), then what now has room.
    /// One no subscription of the session sends any more (one the new connection's token does
    /// not grant) or that has expired is no longer in flight; nor is one too large for this
    /// connection's client, which counts as lost.
    pub fn resend(&self, s: &mut Outbound) -> Vec<Frame> {
        let unacknowledged: Vec<(u16, Held)> = s
            .flow
            .unacknowledged()
            .into_iter()
            .map(|(id, held)| (id, held.clone()))
            .collect();
        let mut frames = Vec::new();
        for (id, held) in unacknowledged {
            let sent = match s.route_held(&held) {
                Some(route) => self.held_frame(s, &held, &route, id, true),
                None => Err(Unsent::Withdrawn),
            };
            match sent {
                Ok(frame) => frames.push(frame),
                Err(why) => {
                    let credit = s.flow.acknowledged(id);
                    self.not_sent(s, &held, credit, why);
                }
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
                        let name = sub.name.clone();
                        s.subs.remove(&name);
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
    extras: Option<&'a Extras>,
}

impl<'a> From<&'a Message> for Publishable<'a> {
    fn from(m: &'a Message) -> Self {
        Publishable {
            payload: m.payload(),
            kind: m.kind(),
            content_type: m.content_type(),
            extras: m.extras().map(|e| &**e),
        }
    }
}

impl<'a> From<&'a Retained> for Publishable<'a> {
    fn from(m: &'a Retained) -> Self {
        Publishable {
            payload: &m.payload,
            kind: m.kind,
            content_type: m.content_type.as_deref(),
            extras: m.extras.as_deref(),
        }
    }
}

impl Publishable<'_> {
    /// The properties every subscriber's PUBLISH of it carries ([`extras::properties`]).
    fn properties(&self) -> MessageProperties {
        extras::properties(self.kind, self.content_type, self.extras)
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

/// The four forms of a message's QoS 0 PUBLISH in one buffer: an index ([`HEADS_INDEX`]
/// bytes: whether the message is [`AS_NAMED`], then where the 5.0 forms start), then for 3.1.1
/// and for 5.0 a WebSocket binary header followed by the packet's head (the payload follows
/// every head). Empty when MQTT cannot name the topic or the packet is too large for MQTT.
fn shared_heads(m: &Message) -> Frame {
    let topic = m.topic();
    let Some(name) = to_mqtt_topic(topic) else {
        return Frame::default();
    };
    // Borrowed: the name is the topic's own text.
    let as_named = !topic.starts_with('$') && matches!(name, Cow::Borrowed(_));
    let p = Publishable::from(m);
    let props = p.properties();
    let len = m.payload().len();
    // Two WebSocket headers of at most 10 bytes, two fixed headers of at most 5, the topic
    // twice: the 5.0 properties are the only part that may still grow the buffer.
    let mut out = BytesMut::with_capacity(HEADS_INDEX + 2 * (10 + 5 + 2 + name.len()) + 16);
    out.put_u8(u8::from(as_named));
    out.put_u32_le(0);
    for version in [Version::V311, Version::V5] {
        let at = out.len();
        if version == Version::V5 {
            out[1..HEADS_INDEX].copy_from_slice(&(at as u32).to_le_bytes());
        }
        let prepared = Prepared::new(version, &name, &props, m.payload().clone());
        let Ok(head) = prepared.head_len(&Delivery::default()) else {
            return Frame::default();
        };
        out.put_slice(&ws_header(OpCode::Binary, head + len));
        prepared
            .head_into(&Delivery::default(), &mut out)
            .expect("its length is known");
    }
    Frame {
        head: out.freeze(),
        body: m.payload().clone(),
    }
}

/// Bytes before the forms in [`shared_heads`]' buffer.
const HEADS_INDEX: usize = 5;

/// The first byte of [`shared_heads`]' index when the message's MQTT name is its herald topic
/// and does not start with `$`: every plain subscriber of such a message is sent the shared
/// packet without looking at its subscriptions (a leading wildcard never matches a `$` name,
/// and a topic MQTT names differently is matched again in MQTT's terms).
const AS_NAMED: u8 = 1;

/// Whether [`shared_heads`] made `all` and its message is [`AS_NAMED`].
fn as_named(all: &Frame) -> bool {
    all.head.first() == Some(&AS_NAMED)
}

/// The form of [`shared_heads`] `version` over `framing` sends, sliced out (no copy), and
/// the length of the MQTT packet it heads.
fn shared_head(all: &Frame, version: Version, framing: Framing) -> (Bytes, usize) {
    let heads = &all.head;
    let v5_at = u32::from_le_bytes(heads[1..HEADS_INDEX].try_into().expect("4 bytes")) as usize;
    let (at, end) = match version {
        Version::V5 => (v5_at, heads.len()),
        _ => (HEADS_INDEX, v5_at),
    };
    let ws = match heads[at + 1] {
        126 => 4,
        127 => 10,
        _ => 2,
    };
    let from = match framing {
        Framing::Stream => at + ws,
        Framing::WebSocket => at,
    };
    (heads.slice(from..end), end - at - ws + all.body.len())
}

impl Encoder {
    /// The PUBLISH this connection is sent for `message` for its own subscriptions (`group`:
    /// for its shared subscription named after the group), or an empty frame when it is not
    /// sent one (a name MQTT cannot carry, a `$` topic under a leading wildcard, already
    /// delivered, expired, larger than the client's maximum packet size) or not yet (QoS 1
    /// waiting for room). Credit the message spent that no acknowledgement will return goes
    /// back at once.
    fn publish_of(&self, message: &Message, group: Option<&Arc<Group>>) -> Frame {
        let mut s = self.state.lock();
        let topic = message.topic();
        // Most connections: every subscription QoS 0 and plain, a message with no MQTT 5.0
        // properties (a QoS 0 publisher's mark changes nothing here) on a topic MQTT names as
        // herald does (no `$`, no `+` or `#` in a level: [`AS_NAMED`], found once per
        // message), no loss to announce (3.1.1 cannot), so the packet is the one every such
        // subscriber shares.
        if group.is_none()
            && s.subs.plain()
            && s.uncredited == 0
            && (s.gaps.is_empty() || s.version == Version::V311)
            && extras::plain(message.extras())
        {
            let all = message.encoded(SLOT, shared_heads);
            if as_named(all) {
                if s.seen.as_mut().is_some_and(|seen| !seen.delivered(message)) {
                    return Frame::default();
                }
                return self.shared_publish(&mut s, message.topic(), all);
            }
        }
        let charged = match group {
            Some(_) => None,
            None if s.uncredited > 0 => {
                s.uncredited -= 1;
                None
            }
            None => Some(topic),
        };
        let name = to_mqtt_topic(topic);
        let (route, credit) = match group {
            Some(g) => s.route_grouped(g, name.as_deref()),
            None => s.route(name.as_deref(), charged),
        };
        let (Some(name), Some(mut route)) = (name, route) else {
            self.give_back(credit);
            return Frame::default();
        };
        // §3.8.4: sent at the lower of the QoS it was published with and the grant.
        if extras::at_most_once(message.extras()) {
            route.qos = QoS::AtMostOnce;
        }
        // The session's positions are for its own subscriptions: a shared subscription's
        // messages are not recovered for it, nor already delivered through it.
        if group.is_none() && s.seen.as_mut().is_some_and(|seen| !seen.delivered(message)) {
            self.give_back(credit);
            return Frame::default();
        }
        if route.qos != QoS::AtMostOnce {
            let held = Held::Live {
                message: message.clone(),
                group: group.cloned(),
            };
            return self.send_qos1(&mut s, held, route, credit);
        }
        // Sent at QoS 0 (its credit spent for a QoS 1 subscription that matches in herald's
        // terms only, or for a message published at QoS 0): no PUBACK will return the credit.
        self.give_back(credit);
        let extras = message.extras();
        let Ok(now) = clock(extras.map(|e| &**e)) else {
            return Frame::default();
        };
        let retain = route.retain_as_published && extras.is_some_and(|e| e.retain);
        let lost = s.gaps.take(topic);
        if route.ids.is_empty() && now == 0 && !retain && lost.is_none() {
            return self.shared_publish(&mut s, topic, message.encoded(SLOT, shared_heads));
        }
        let delivery = Delivery {
            retain,
            subscription_identifiers: &route.ids,
            ..Delivery::default()
        };
        let p = Publishable::from(message);
        let frame = self.publish(&s, &name, &p, delivery, now, lost);
        if frame.is_empty() {
            let lost = lost.map_or(Lost::Count(1), |lost| lost.and(Lost::Count(1)));
            s.gaps.add(topic, lost);
        }
        frame
    }

    /// The QoS 0 PUBLISH every plain subscriber of this version and transport is sent: cut
    /// from the bytes cached in the message (`all`, [`shared_heads`]); nothing if it exceeds
    /// the client's maximum packet size (a loss `topic`'s next message announces).
    fn shared_publish(&self, s: &mut Outbound, topic: &str, all: &Frame) -> Frame {
        if all.is_empty() {
            return Frame::default();
        }
        let (head, packet_len) = shared_head(all, s.version, self.framing);
        if packet_len > s.maximum_packet_size as usize {
            s.gaps.add(topic, Lost::Count(1));
            return Frame::default();
        }
        Frame {
            head,
            body: all.body.clone(),
        }
    }
}

impl Encode for Encoder {
    fn message(&self, message: &Message, out: &mut Vec<Frame>) {
        let frame = self.publish_of(message, None);
        if !frame.is_empty() {
            out.push(frame);
        }
    }

    fn grouped(&self, message: &Message, group: &Arc<Group>, out: &mut Vec<Frame>) {
        let frame = self.publish_of(message, Some(group));
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
                let tag = Tag::of(id);
                // The session recovers its own subscriptions, not its shared ones.
                let own = match tag {
                    Some(Tag::Subscribe { packet_id, filter }) => s
                        .subacks
                        .get(&packet_id)
                        .and_then(|pending| pending.subs.get(usize::from(filter)))
                        .is_some_and(|sub| sub.as_ref().is_some_and(|(sub, _)| !sub.shared)),
                    _ => false,
                };
                if let (Some(seen), true) = (s.seen.as_mut(), own) {
                    seen.subscribed(topic, cursor);
                }
                match tag {
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
            assert!(as_named(&all));
            for version in [Version::V311, Version::V5] {
                let p = Publishable::from(&m);
                let expected = Prepared::new(version, "a/b", &p.properties(), payload.clone())
                    .head(&Delivery::default())
                    .unwrap();
                let (bare, n) = shared_head(&all, version, Framing::Stream);
                assert_eq!((bare.clone(), n), (expected.clone(), expected.len() + len));
                let (ws, _) = shared_head(&all, version, Framing::WebSocket);
                let header = ws_header(OpCode::Binary, expected.len() + len);
                assert_eq!(ws, [&header[..], &expected[..]].concat());
            }
        }
    }

    /// Only a topic whose MQTT name is the same text, not starting with `$`, lets a plain
    /// subscriber skip its subscriptions; the others are still encoded, under their MQTT name.
    #[test]
    fn the_cached_forms_say_whether_the_topic_is_named_as_in_herald() {
        for (topic, named, name) in [
            ("a/b", true, "a/b"),
            ("$SYS/x", false, "$SYS/x"),
            ("a/+", false, "a/"),
            ("#>/x", false, ">/x"),
        ] {
            let head = TopicHead::new(topic.into(), "e".into());
            let m = Message::new(head, 1, PayloadKind::Text, Bytes::new(), None, None);
            let all = shared_heads(&m);
            assert_eq!(as_named(&all), named, "{topic}");
            let (bare, _) = shared_head(&all, Version::V311, Framing::Stream);
            assert_eq!(&bare[4..], name.as_bytes(), "{topic}");
        }
    }

    #[test]
    fn subs_count_those_that_are_not_plain_through_every_change() {
        let sub = |name: &str, qos| Sub {
            name: name.into(),
            filter: name.into(),
            shared: false,
            patterns: vec![name.into()],
            qos,
            lossless: qos == QoS::AtLeastOnce,
            retain_as_published: false,
            id: None,
            no_local: false,
        };
        let mut subs = Subs::default();
        subs.insert(sub("a", QoS::AtMostOnce));
        assert!(subs.plain());
        subs.insert(sub("b", QoS::AtLeastOnce));
        assert!(!subs.plain(), "a QoS 1 subscription is never plain");
        subs.insert(sub("b", QoS::AtMostOnce));
        assert!(subs.plain(), "replaced by a plain one");
        subs.insert(sub("c", QoS::AtLeastOnce));
        let mut kept = Outbound {
            subs,
            ..Outbound::default()
        }
        .take_session();
        let mut resumed = Outbound::default();
        kept.subs.retain(|sub| sub.name != "a");
        resumed.resume(kept, 10);
        assert!(!resumed.subs.plain(), "resumed with its QoS 1 subscription");
        resumed.subs.retain(|sub| sub.name != "c");
        assert!(resumed.subs.plain(), "a token no longer granting it");
        assert!(resumed.subs.remove("b").is_some());
        assert!(resumed.subs.plain());
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
