//! An MQTT client's side of a connection: its packets as herald requests, and the MQTT
//! answers herald leaves to the protocol ([`crate::session::Protocol`]).
//!
//! The session decodes packets, answers what MQTT answers by itself (CONNACK, PINGRESP, the
//! QoS 2 handshake, refusals) and turns the rest into herald requests: a PUBLISH is a herald
//! publish, a SUBSCRIBE one herald subscribe per pattern of each filter, a PUBACK for a QoS 1
//! message returned credit. What herald answers comes back through the connection's
//! [`Encoder`], which the session shares its [`Outbound`] state with: a PUBACK goes out once
//! herald accepted the message, a SUBACK once every herald subscribe of it is answered.
//!
//! A shared subscription (`$share/{group}/{filter}`) is a herald group subscription per
//! pattern, the group named after the whole subscription, so that the connections holding the
//! same one share its messages ([`herald_core::group`]). A PUBLISH's 5.0 properties and retain
//! flag travel with the message as its extras ([`super::extras`]).
//!
//! A session that outlives its connection (clean session 0, session expiry), a client
//! identifier taken over and a delayed will are [`super::persist`]'s. What the session does not
//! do, and why, is in `docs/mqtt.md`.

use super::codec::{framed, Encoder, Outbound, Sub, Tag};
use super::delivery::Seen;
use super::encode::{self, AckKind, ConnackProperties, ProblemInfo};
use super::extras::extras_of;
use super::packet::{self, Connect, Decoder, Limits, Packet, Reply as Refusal, RetainHandling};
use super::persist::{self, Joining};
use super::retained::{Retained, RetainedStore};
use super::sessions::Will;
use super::topic::{parse_subscription, to_herald_patterns, to_herald_topic};
use super::{QoS, ReasonCode, Version};
use crate::connection::Codec;
use crate::connection::Framing;
use crate::metrics::Disconnect;
use crate::node::Node;
use crate::session::{Context, Input, Keepalive, Protocol};
use bytes::{Bytes, BytesMut};
use herald_core::policy::Policy;
use herald_core::request::{PayloadKind, Publish, Request, Subscribe};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// How long a connection may take to send its CONNECT.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// QoS 2 messages a 5.0 client may have awaiting their PUBREL at once (its CONNACK says so,
/// §3.2.2.3.3); QoS 1 messages are acknowledged as herald accepts them, one at a time.
pub const RECEIVE_MAXIMUM: u16 = 1024;

/// Topic aliases a client may set on its PUBLISH packets (5.0).
pub const TOPIC_ALIAS_MAXIMUM: u16 = 64;

/// Room in a packet for what is not payload (topic, properties), over `max_message_bytes`.
const PACKET_OVERHEAD: u32 = 64 * 1024;

/// One MQTT connection's protocol state.
pub struct Mqtt {
    node: Arc<Node>,
    framing: Framing,
    decoder: Decoder,
    /// Received bytes not yet a whole packet.
    buf: BytesMut,
    state: Arc<Mutex<Outbound>>,
    encoder: Arc<Encoder>,
    retained: Arc<RetainedStore>,
    maximum_packet_size: u32,
    /// `None` until CONNECT.
    connect: Option<Connected>,
}

/// What a CONNECT settled.
struct Connected {
    version: Version,
    /// The session's client identifier (assigned by herald when the client gave none).
    client_id: String,
    /// This connection's hold on the session ([`persist::join`]).
    generation: u64,
    /// The session expiry the CONNECT asked for, and the one granted (seconds; 0: the session
    /// ends with the connection).
    expiry_asked: u32,
    expiry: u32,
    will: Option<Will>,
    /// The client said DISCONNECT (without asking for its will): the will is not published.
    clean_end: bool,
    receive_maximum: u16,
    aliases: HashMap<u16, String>,
    /// How many of the connection's MQTT subscriptions use each herald pattern (`a/#` and
    /// `a` share `a`): a herald subscription goes only with the last.
    pattern_users: HashMap<String, usize>,
}

impl Mqtt {
    pub fn new(node: &Arc<Node>, framing: Framing) -> Mqtt {
        let maximum_packet_size = u32::try_from(node.config.max_message_bytes)
            .unwrap_or(u32::MAX)
            .saturating_add(PACKET_OVERHEAD)
            .min(super::wire::MAX_VARINT + 5);
        let state = Arc::new(Mutex::new(Outbound::default()));
        let retained = node.mqtt_retained.clone();
        let encoder = Arc::new(Encoder::new(framing, retained.clone(), state.clone()));
        Mqtt {
            node: node.clone(),
            framing,
            decoder: Decoder::new(Limits {
                maximum_packet_size,
                topic_alias_maximum: TOPIC_ALIAS_MAXIMUM,
            }),
            buf: BytesMut::new(),
            state,
            encoder,
            retained,
            maximum_packet_size,
            connect: None,
        }
    }

    fn send(&self, cx: &Context<'_>, packet: Bytes) {
        cx.send(framed(self.framing, packet));
    }

    /// Sends what the decoder's refusal calls for; the caller closes.
    fn refuse(&self, cx: &Context<'_>, reply: Refusal) {
        let packet = match reply {
            Refusal::Close => return,
            Refusal::Connack311(code) => {
                // A bare 3.1.1 CONNACK with this return code.
                Bytes::from(vec![0x20, 0x02, 0x00, code])
            }
            Refusal::Connack5(reason) => {
                encode::connack(Version::V5, false, reason, &ConnackProperties::default())
            }
            Refusal::Disconnect5(reason) => {
                encode::disconnect(reason, ProblemInfo::default(), None)
            }
        };
        self.send(cx, packet);
    }

    /// Refuses the connection after CONNECT with `reason` in the client's version.
    fn refuse_connect(&self, cx: &Context<'_>, version: Version, reason: ReasonCode, why: &str) {
        let props = ConnackProperties {
            reason_string: Some(why.to_owned()),
            ..ConnackProperties::default()
        };
        self.send(cx, encode::connack(version, false, reason, &props));
    }

    /// Closes a 5.0 connection with DISCONNECT `reason` (3.1.1: closes without a word).
    fn disconnect(&self, cx: &Context<'_>, reason: ReasonCode, why: &'static str) -> Disconnect {
        if self.connect.as_ref().map(|c| c.version) == Some(Version::V5) {
            let info = ProblemInfo {
                reason_string: Some(why),
                user_properties: &[],
            };
            self.send(cx, encode::disconnect(reason, info, None));
        }
        Disconnect::ProtocolError
    }

    fn on_connect(&mut self, cx: &mut Context<'_>, c: Connect) -> Result<(), Disconnect> {
        let version = c.version;
        if c.authentication_method.is_some() {
            self.refuse_connect(
                cx,
                version,
                ReasonCode::BadAuthenticationMethod,
                "herald takes a token as the password; it has no enhanced authentication",
            );
            return Err(Disconnect::Unauthorized);
        }
        if cx.node.auth.is_some() {
            let token = c
                .password
                .as_deref()
                .map(std::str::from_utf8)
                .transpose()
                .ok()
                .flatten();
            let Some(token) = token else {
                self.refuse_connect(
                    cx,
                    version,
                    ReasonCode::NotAuthorized,
                    "herald needs a token as the password",
                );
                return Err(Disconnect::Unauthorized);
            };
            if let Err(refused) = cx.authenticate(token) {
                self.refuse_connect(
                    cx,
                    version,
                    ReasonCode::BadUserNameOrPassword,
                    &refused.to_string(),
                );
                return Err(Disconnect::Unauthorized);
            }
        }
        let client_id = match c.client_id.is_empty() {
            true => format!("herald-{:016x}", rand::random::<u64>()),
            false => c.client_id.clone(),
        };
        // 3.1.1's persistent session never expires (§3.1.2.4): herald's maximum applies.
        let expiry_asked = match version {
            Version::V311 if c.clean_start => 0,
            Version::V311 => u32::MAX,
            Version::V5 => c.session_expiry_interval,
        };
        let expiry = self.node.mqtt_sessions.limits.expiry(expiry_asked);
        let receive_maximum = c.receive_maximum.max(1);
        {
            let mut s = self.state.lock();
            s.version = version;
            s.maximum_packet_size = c.maximum_packet_size.unwrap_or(u32::MAX);
            s.problem_info = c.request_problem_information;
            s.flow.set_receive_maximum(receive_maximum);
            s.seen = (expiry > 0).then(Seen::default);
        }
        let will = prepare_will(cx, c.will);
        self.encoder
            .on_unspent_credit(persist::credit_return(&self.node, cx.id, cx.conn));
        let mut props = ConnackProperties {
            receive_maximum: Some(RECEIVE_MAXIMUM),
            maximum_packet_size: Some(self.maximum_packet_size),
            topic_alias_maximum: Some(TOPIC_ALIAS_MAXIMUM),
            subscription_identifiers_available: Some(true),
            shared_subscription_available: Some(true),
            ..ConnackProperties::default()
        };
        if expiry != expiry_asked {
            props.session_expiry_interval = Some(expiry);
        }
        if c.client_id.is_empty() && version == Version::V5 {
            props.assigned_client_identifier = Some(client_id.clone());
        }
        let framing = self.framing;
        let joining = Joining {
            client_id: &client_id,
            clean_start: c.clean_start,
            version,
            framing,
            state: &self.state,
            encoder: &self.encoder,
            will: will.clone(),
            receive_maximum,
        };
        let connack = |session_present| {
            let packet = encode::connack(version, session_present, ReasonCode::Success, &props);
            framed(framing, packet)
        };
        let generation = persist::join(&self.node, cx, joining, connack);
        // §3.1.2.10: one and a half times the keep-alive with nothing received ends it.
        cx.set_keepalive(Keepalive {
            ping: None,
            idle: Duration::from_millis(u64::from(c.keep_alive) * 1500),
        });
        self.connect = Some(Connected {
            version,
            client_id,
            generation,
            expiry_asked,
            expiry,
            will,
            clean_end: false,
            receive_maximum,
            aliases: HashMap::new(),
            pattern_users: persist::pattern_users(&self.state),
        });
        Ok(())
    }

    fn on_publish(&mut self, cx: &mut Context<'_>, p: packet::Publish) -> Result<(), Disconnect> {
        let connected = self.connect.as_mut().expect("CONNECT came first");
        let version = connected.version;
        let name = match (p.topic_alias, p.topic.is_empty()) {
            (Some(alias), false) => {
                connected.aliases.insert(alias, p.topic.clone());
                p.topic
            }
            (Some(alias), true) => match connected.aliases.get(&alias) {
                Some(name) => name.clone(),
                None => {
                    return Err(self.disconnect(
                        cx,
                        ReasonCode::ProtocolError,
                        "a topic alias that was never set",
                    ))
                }
            },
            (None, _) => p.topic,
        };
        let answer = |s: &Self, reason: ReasonCode| {
            let kind = match p.qos {
                QoS::AtMostOnce => return,
                QoS::AtLeastOnce => AckKind::PubAck,
                QoS::ExactlyOnce => AckKind::PubRec,
            };
            let id = p.packet_id.unwrap_or_default();
            s.send(
                cx,
                encode::ack(version, kind, id, reason, ProblemInfo::default()),
            );
        };
        let topic = match to_herald_topic(&name) {
            Ok(topic) => topic.into_owned(),
            Err(_) => {
                answer(self, ReasonCode::TopicNameInvalid);
                return Ok(());
            }
        };
        let packet_id = p.packet_id.unwrap_or_default();
        if p.qos == QoS::ExactlyOnce && version == Version::V5 {
            let over = {
                let awaiting = &self.state.lock().awaiting_release;
                awaiting.len() >= usize::from(RECEIVE_MAXIMUM) && !awaiting.contains(&packet_id)
            };
            if over {
                self.disconnect(
                    cx,
                    ReasonCode::ReceiveMaximumExceeded,
                    "more QoS 2 messages awaiting PUBREL than the receive maximum",
                );
                // A flow the client overran, not a broken stream: herald reads on until the
                // client closes, so that it reads the DISCONNECT rather than a reset.
                return Err(Disconnect::RateLimited);
            }
        }
        if p.qos == QoS::ExactlyOnce && !self.state.lock().awaiting_release.insert(packet_id) {
            // A duplicate of a message already published: acknowledged again, not published.
            answer(self, ReasonCode::Success);
            return Ok(());
        }
        let kind = if p.message.payload_utf8 {
            PayloadKind::Text
        } else {
            PayloadKind::Binary
        };
        let extras = extras_of(&p.message, p.retain, p.qos, cx.now_us);
        let retain = p.retain.then(|| {
            let message = Retained {
                payload: p.payload.clone(),
                kind,
                content_type: p.message.content_type.clone(),
                qos: p.qos.min(QoS::AtLeastOnce),
                extras: extras.clone(),
            };
            self.state.lock().retain(topic.clone(), message)
        });
        let id = (p.qos != QoS::AtMostOnce || retain.is_some()).then(|| {
            Tag::Publish {
                qos: p.qos,
                packet_id,
                retain,
            }
            .id()
        });
        cx.request(Request::Publish(Publish {
            id,
            topic: topic.into(),
            payload: p.payload,
            kind,
            content_type: p.message.content_type,
            stamp: false,
            extras,
        }));
        Ok(())
    }

    fn on_subscribe(
        &mut self,
        cx: &mut Context<'_>,
        sub: packet::Subscribe,
    ) -> Result<(), Disconnect> {
        let connected = self.connect.as_mut().expect("CONNECT came first");
        let limits = self.node.mqtt_sessions.limits;
        let mut codes = Vec::with_capacity(sub.filters.len());
        // Per filter, the subscription asked for and whether its retained messages follow.
        let mut send_retained = Vec::with_capacity(sub.filters.len());
        let mut requests = Vec::new();
        for (i, f) in sub.filters.iter().enumerate() {
            let Ok(parsed) = parse_subscription(&f.filter) else {
                codes.push(ReasonCode::TopicFilterInvalid);
                send_retained.push(None);
                continue;
            };
            let Ok(filter) = to_herald_patterns(parsed.filter) else {
                codes.push(ReasonCode::TopicFilterInvalid);
                send_retained.push(None);
                continue;
            };
            // A shared subscription is a herald group named after it (docs/mqtt.md).
            let group = parsed.share_group.map(|_| f.filter.clone());
            // QoS 2 is granted as 1; 1 is herald's `lossless` where it may be, else 0.
            let wants_qos1 = f.qos != QoS::AtMostOnce;
            let lossless = wants_qos1 && {
                let allowed = {
                    let engine = cx.node.engine.lock();
                    filter
                        .patterns
                        .iter()
                        .all(|p| engine.config().allows_lossless(p))
                };
                allowed
                    && filter.patterns.iter().all(|p| {
                        let probe = Request::Subscribe(Subscribe {
                            topic: p.clone(),
                            policy: Some(Policy::Lossless),
                            ..Subscribe::default()
                        });
                        cx.admits(&probe)
                    })
            };
            let qos = if lossless {
                QoS::AtLeastOnce
            } else {
                QoS::AtMostOnce
            };
            let mut s = self.state.lock();
            let entry = Sub {
                name: f.filter.clone(),
                filter: parsed.filter.to_owned(),
                shared: group.is_some(),
                patterns: filter.patterns.clone(),
                qos,
                lossless,
                retain_as_published: f.retain_as_published,
                id: sub.subscription_identifier,
                no_local: f.no_local,
            };
            let existed = s.subs.insert(entry.clone());
            drop(s);
            codes.push(match qos {
                QoS::AtMostOnce => ReasonCode::Success,
                _ => ReasonCode::GrantedQoS1,
            });
            // §4.8.2: a shared subscription is not sent retained messages.
            let wants_retained = group.is_none()
                && match f.retain_handling {
                    RetainHandling::OnSubscribe => true,
                    RetainHandling::OnNewSubscription => !existed,
                    RetainHandling::Never => false,
                };
            send_retained.push(Some((entry, wants_retained)));
            for pattern in filter.patterns {
                if !existed && group.is_none() {
                    *connected.pattern_users.entry(pattern.clone()).or_default() += 1;
                }
                requests.push(Request::Subscribe(Subscribe {
                    id: Some(
                        Tag::Subscribe {
                            packet_id: sub.packet_id,
                            filter: i as u16,
                        }
                        .id(),
                    ),
                    topic: pattern,
                    policy: lossless.then_some(Policy::Lossless),
                    window: lossless
                        .then(|| limits.window(connected.receive_maximum, group.is_some())),
                    group: group.clone(),
                    no_local: f.no_local,
                    ..Subscribe::default()
                }));
            }
        }
        let mut s = self.state.lock();
        if requests.is_empty() {
            let frame = self.encoder.suback_now(&mut s, sub.packet_id, codes);
            drop(s);
            cx.send(frame);
            return Ok(());
        }
        s.expect_suback(sub.packet_id, codes, send_retained, requests.len());
        drop(s);
        for request in requests {
            cx.request(request);
        }
        Ok(())
    }

    fn on_unsubscribe(&mut self, cx: &mut Context<'_>, u: packet::Unsubscribe) {
        let connected = self.connect.as_mut().expect("CONNECT came first");
        let mut codes = Vec::with_capacity(u.filters.len());
        let mut requests = Vec::new();
        let mut s = self.state.lock();
        for filter in &u.filters {
            let Some(sub) = s.subs.remove(filter) else {
                codes.push(ReasonCode::NoSubscriptionExisted);
                continue;
            };
            codes.push(ReasonCode::Success);
            let tag = Tag::Unsubscribe {
                packet_id: u.packet_id,
            };
            if sub.shared {
                requests.extend(sub.patterns.into_iter().map(|topic| Request::Unsubscribe {
                    id: Some(tag.id()),
                    topic,
                    group: Some(sub.name.clone()),
                }));
                continue;
            }
            for pattern in sub.patterns {
                let users = connected.pattern_users.entry(pattern.clone()).or_default();
                *users = users.saturating_sub(1);
                if *users > 0 {
                    continue;
                }
                connected.pattern_users.remove(&pattern);
                if let Some(seen) = s.seen.as_mut() {
                    seen.unsubscribed(&pattern);
                }
                requests.push(Request::Unsubscribe {
                    id: Some(tag.id()),
                    topic: pattern,
                    group: None,
                });
            }
        }
        if requests.is_empty() {
            let version = s.version;
            drop(s);
            let packet = encode::unsuback(version, u.packet_id, &codes, ProblemInfo::default());
            self.send(cx, packet);
            return;
        }
        s.expect_unsuback(u.packet_id, codes, requests.len());
        drop(s);
        for request in requests {
            cx.request(request);
        }
    }

    fn on_packet(&mut self, cx: &mut Context<'_>, packet: Packet) -> Result<(), Disconnect> {
        let version = self.connect.as_ref().map_or(Version::V311, |c| c.version);
        match packet {
            Packet::Connect(c) => self.on_connect(cx, *c),
            Packet::Publish(p) => self.on_publish(cx, p),
            Packet::PubAck(ack) => {
                let (credit, released) = {
                    let mut s = self.state.lock();
                    let credit = s.flow.acknowledged(ack.packet_id);
                    (credit, self.encoder.release(&mut s))
                };
                for frame in released {
                    cx.send(frame);
                }
                if let Some(credit) = credit {
                    cx.request(credit.request());
                }
                Ok(())
            }
            Packet::PubRel(rel) => {
                let known = self.state.lock().awaiting_release.remove(&rel.packet_id);
                let reason = if known {
                    ReasonCode::Success
                } else {
                    ReasonCode::PacketIdentifierNotFound
                };
                let packet = encode::ack(
                    version,
                    AckKind::PubComp,
                    rel.packet_id,
                    reason,
                    ProblemInfo::default(),
                );
                self.send(cx, packet);
                Ok(())
            }
            // herald sends no QoS 2 message, so none is received or completed.
            Packet::PubRec(_) | Packet::PubComp(_) => Err(self.disconnect(
                cx,
                ReasonCode::ProtocolError,
                "herald sends no QoS 2 messages to acknowledge",
            )),
            Packet::Subscribe(sub) => self.on_subscribe(cx, sub),
            Packet::Unsubscribe(u) => {
                self.on_unsubscribe(cx, u);
                Ok(())
            }
            Packet::PingReq => {
                self.send(cx, encode::pingresp());
                Ok(())
            }
            Packet::Disconnect(d) => {
                let limits = self.node.mqtt_sessions.limits;
                let Some(c) = self.connect.as_mut() else {
                    return Err(Disconnect::ClientClosed);
                };
                match d.session_expiry_interval {
                    // §3.14.2.2.2: a session the CONNECT let end may not be kept now.
                    Some(asked) if asked != 0 && c.expiry_asked == 0 => {
                        return Err(self.disconnect(
                            cx,
                            ReasonCode::ProtocolError,
                            "a session expiry interval at DISCONNECT after 0 at CONNECT",
                        ));
                    }
                    Some(asked) => c.expiry = limits.expiry(asked),
                    None => {}
                }
                c.clean_end = d.reason != ReasonCode::DisconnectWithWill;
                Err(Disconnect::ClientClosed)
            }
            Packet::Auth(_) => Err(self.disconnect(
                cx,
                ReasonCode::BadAuthenticationMethod,
                "herald has no enhanced authentication",
            )),
        }
    }
}

impl Protocol for Mqtt {
    fn codec(&self) -> Codec {
        self.encoder.clone()
    }

    /// Until CONNECT: the time the client has to send it (the CONNECT sets the client's own
    /// keep-alive).
    fn renegotiates_keepalive(&self) -> bool {
        true
    }

    fn keepalive(&self) -> Keepalive {
        Keepalive {
            ping: None,
            idle: CONNECT_TIMEOUT,
        }
    }

    fn input(&mut self, cx: &mut Context<'_>, input: Input) -> Result<(), Disconnect> {
        match input {
            Input::Message { binary: false, .. } => {
                // MQTT over WebSocket is carried in binary messages only (§6.0).
                return Err(Disconnect::ProtocolError);
            }
            Input::Message { payload, .. } | Input::Bytes(payload) => {
                self.buf.extend_from_slice(&payload)
            }
        }
        loop {
            match self.decoder.decode(&mut self.buf) {
                Ok(None) => return Ok(()),
                Ok(Some(packet)) => self.on_packet(cx, packet)?,
                Err(e) => {
                    tracing::debug!(error = %e, "refused an MQTT packet");
                    self.refuse(cx, e.reply);
                    return Err(match e.reason {
                        ReasonCode::PacketTooLarge => Disconnect::FrameTooLarge,
                        _ => Disconnect::ProtocolError,
                    });
                }
            }
        }
    }

    fn ended(&mut self, cx: &mut Context<'_>, _why: Disconnect) {
        let Some(c) = self.connect.take() else {
            return;
        };
        let will = c.will.filter(|_| !c.clean_end);
        let now = persist::leave(
            &self.node,
            cx.conn,
            &c.client_id,
            c.generation,
            &self.state,
            will,
            c.expiry,
        );
        if let Some(will) = now {
            let (publish, retained) = will.published(cx.now_us);
            if let Some(retained) = retained {
                // A full store keeps the will from being retained; it is still published.
                let _ = self.retained.publish(&publish.topic, retained);
            }
            cx.request(Request::Publish(publish));
        }
    }
}

/// The will of a CONNECT as herald publishes it, if its topic is one herald can name and the
/// client's grants allow publishing to it.
fn prepare_will(cx: &mut Context<'_>, will: Option<packet::Will>) -> Option<Will> {
    let will = will?;
    let topic = to_herald_topic(&will.topic).ok()?;
    let kind = if will.message.payload_utf8 {
        PayloadKind::Text
    } else {
        PayloadKind::Binary
    };
    let publish = Publish {
        id: None,
        topic: topic.as_ref().into(),
        payload: will.payload.clone(),
        kind,
        content_type: will.message.content_type.clone(),
        stamp: false,
        extras: None,
    };
    if !cx.admits(&Request::Publish(publish.clone())) {
        return None;
    }
    let retained = will.retain.then(|| Retained {
        payload: will.payload,
        kind,
        content_type: will.message.content_type.clone(),
        qos: will.qos.min(QoS::AtLeastOnce),
        extras: None,
    });
    Some(Will {
        publish,
        retained,
        properties: will.message,
        qos: will.qos,
        delay: will.delay_interval,
    })
}

#[cfg(test)]
mod tests {
    //! The session and its encoder on herald's MQTT listener, over real sockets: packets are
    //! written by hand, so that each test says exactly what the client sends.
    use super::*;
    use crate::config::Config;
    use crate::listener;
    use crate::protocol::mqtt::wire::read_varint;
    use herald_core::engine::HistoryRule;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    struct Client {
        io: TcpStream,
        got: BytesMut,
    }

    impl Client {
        async fn new(node: &Arc<Node>) -> Client {
            let addr = node.config.mqtt_listen.expect("the test node listens");
            Client {
                io: TcpStream::connect(addr).await.unwrap(),
                got: BytesMut::new(),
            }
        }

        async fn send(&mut self, bytes: &[u8]) {
            self.io.write_all(bytes).await.unwrap();
        }

        /// A client whose socket receives into a buffer of a few KiB: the server can write no
        /// more ahead of what it reads than its own send buffer holds.
        async fn with_small_window(node: &Arc<Node>) -> Client {
            let addr = node.config.mqtt_listen.expect("the test node listens");
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket.set_recv_buffer_size(4096).unwrap();
            Client {
                io: socket.connect(addr).await.unwrap(),
                got: BytesMut::new(),
            }
        }

        /// Ends the connection without DISCONNECT.
        fn end(self) {}

        async fn read_more(&mut self) -> usize {
            let mut chunk = [0u8; 4096];
            let n = tokio::time::timeout(Duration::from_secs(2), self.io.read(&mut chunk))
                .await
                .expect("an answer within 2 s")
                .unwrap_or(0);
            self.got.extend_from_slice(&chunk[..n]);
            n
        }

        /// The next packet the server sent: its first byte and the rest after the length.
        async fn packet(&mut self) -> (u8, Vec<u8>) {
            loop {
                if self.got.len() >= 2 {
                    if let Ok(Some((len, n))) = read_varint(&self.got[1..], false) {
                        let total = 1 + n + len as usize;
                        if self.got.len() >= total {
                            let p = self.got.split_to(total);
                            return (p[0], p[1 + n..].to_vec());
                        }
                    }
                }
                assert!(self.read_more().await > 0, "the connection ended");
            }
        }

        /// The server closes the connection, after what it sent (left in `got`).
        async fn closed(&mut self) {
            while self.read_more().await > 0 {}
        }

        /// Nothing more arrives for a moment.
        async fn quiet(&mut self) {
            let mut chunk = [0u8; 64];
            let read = tokio::time::timeout(Duration::from_millis(200), self.io.read(&mut chunk));
            assert!(
                read.await.is_err() && self.got.is_empty(),
                "unexpected bytes"
            );
        }
    }

    /// A node serving MQTT on a port of its own, until the test ends.
    async fn node() -> Arc<Node> {
        node_with(Config::default()).await
    }

    async fn node_with(config: Config) -> Arc<Node> {
        let tcp = listener::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let config = Config {
            mqtt_listen: Some(tcp.local_addr().unwrap()),
            ..config
        };
        let node = Node::new(config).unwrap();
        let serving = node.clone();
        tokio::spawn(async move {
            let mqtt = |node: &Arc<Node>| Mqtt::new(node, Framing::Stream);
            listener::serve_stream(tcp, serving, mqtt, std::future::pending()).await
        });
        node
    }

    fn string(s: &str) -> Vec<u8> {
        let mut v = (s.len() as u16).to_be_bytes().to_vec();
        v.extend_from_slice(s.as_bytes());
        v
    }

    fn packet(first: u8, body: &[u8]) -> Vec<u8> {
        let mut v = BytesMut::from(&[first][..]);
        crate::protocol::mqtt::wire::put_varint(&mut v, body.len());
        v.extend_from_slice(body);
        v.to_vec()
    }

    /// CONNECT at `level` (4 or 5) with a clean session and keep-alive 30 s.
    fn connect(level: u8, id: &str) -> Vec<u8> {
        let mut body = string("MQTT");
        body.extend([level, 0x02, 0, 30]);
        if level == 5 {
            body.push(0);
        }
        body.extend(string(id));
        packet(0x10, &body)
    }

    /// A 5.0 CONNECT with keep-alive 30 s and these properties.
    fn connect5(id: &str, clean_start: bool, properties: &[u8]) -> Vec<u8> {
        let mut body = string("MQTT");
        let flags = if clean_start { 0x02 } else { 0 };
        body.extend([5, flags, 0, 30, properties.len() as u8]);
        body.extend_from_slice(properties);
        body.extend(string(id));
        packet(0x10, &body)
    }

    /// A 3.1.1 CONNECT with clean session 0.
    fn connect_persistent(id: &str) -> Vec<u8> {
        let mut body = string("MQTT");
        body.extend([4, 0x00, 0, 30]);
        body.extend(string(id));
        packet(0x10, &body)
    }

    /// The packet identifier of a QoS 1 PUBLISH (its first byte and body) from the server to
    /// a client of `level`, checked to be QoS 1 with DUP as `dup`, and its payload.
    fn qos1_of(level: u8, (first, body): (u8, Vec<u8>), dup: bool) -> (u16, Vec<u8>) {
        assert_eq!(first & 0xF6, 0x32, "a QoS 1 PUBLISH, not {first:#x}");
        assert_eq!(first & 0x08 != 0, dup, "DUP flag");
        let topic_len = usize::from(u16::from_be_bytes([body[0], body[1]]));
        let at = 2 + topic_len;
        let id = u16::from_be_bytes([body[at], body[at + 1]]);
        let mut payload = at + 2;
        if level == 5 {
            // Properties this short have a one-byte length.
            payload += 1 + usize::from(body[payload]);
        }
        (id, body[payload..].to_vec())
    }

    fn subscribe(level: u8, packet_id: u16, filter: &str, options: u8) -> Vec<u8> {
        let mut body = packet_id.to_be_bytes().to_vec();
        if level == 5 {
            body.push(0);
        }
        body.extend(string(filter));
        body.push(options);
        packet(0x82, &body)
    }

    fn publish(level: u8, qos: u8, retain: bool, topic: &str, id: u16, payload: &[u8]) -> Vec<u8> {
        let mut body = string(topic);
        if qos > 0 {
            body.extend(id.to_be_bytes());
        }
        if level == 5 {
            body.push(0);
        }
        body.extend_from_slice(payload);
        packet(0x30 | qos << 1 | u8::from(retain), &body)
    }

    /// A client connected at `level` with a client identifier of its own.
    async fn connected(node: &Arc<Node>, level: u8) -> Client {
        static IDS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let id = IDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut c = Client::new(node).await;
        c.send(&connect(level, &format!("c{id}"))).await;
        let (first, body) = c.packet().await;
        assert_eq!(first, 0x20);
        assert_eq!(body[1], 0, "accepted");
        c
    }

    #[tokio::test]
    async fn qos1_both_ways_with_the_puback_after_herald_accepted() {
        let node = node().await;
        let mut sub = connected(&node, 4).await;
        sub.send(&subscribe(4, 7, "a/#", 1)).await;
        assert_eq!(sub.packet().await, (0x90, vec![0, 7, 1]), "granted QoS 1");
        let mut publisher = connected(&node, 5).await;
        publisher
            .send(&publish(5, 1, false, "a/b", 3, b"\x00\xffbin"))
            .await;
        assert_eq!(publisher.packet().await, (0x40, vec![0, 3]), "PUBACK");
        let (first, body) = sub.packet().await;
        assert_eq!(first, 0x32, "QoS 1, no retain");
        assert_eq!(&body[..5], &[0, 3, b'a', b'/', b'b']);
        let packet_id = u16::from_be_bytes([body[5], body[6]]);
        assert_eq!(&body[7..], b"\x00\xffbin");
        sub.send(&packet(0x40, &packet_id.to_be_bytes())).await;
        // `a/#` also matches `a`; a QoS 0 message goes at QoS 0, the lower of the two (§3.8.4).
        publisher.send(&publish(5, 0, false, "a", 0, b"x")).await;
        assert_eq!(sub.packet().await, (0x30, vec![0, 1, b'a', b'x']));
    }

    #[tokio::test]
    async fn qos2_from_a_publisher_is_published_exactly_once() {
        let node = node().await;
        let mut sub = connected(&node, 4).await;
        sub.send(&subscribe(4, 1, "t", 0)).await;
        assert_eq!(sub.packet().await, (0x90, vec![0, 1, 0]));
        let mut publisher = connected(&node, 4).await;
        let once = publish(4, 2, false, "t", 9, b"m");
        publisher.send(&once).await;
        assert_eq!(publisher.packet().await, (0x50, vec![0, 9]), "PUBREC");
        let mut dup = once.clone();
        dup[0] |= 0x08;
        publisher.send(&dup).await;
        assert_eq!(publisher.packet().await, (0x50, vec![0, 9]), "PUBREC again");
        publisher.send(&packet(0x62, &[0, 9])).await;
        assert_eq!(publisher.packet().await, (0x70, vec![0, 9]), "PUBCOMP");
        assert_eq!(sub.packet().await, (0x30, vec![0, 1, b't', b'm']));
        sub.quiet().await;
    }

    #[tokio::test]
    async fn retained_messages_follow_the_suback_and_an_empty_one_clears() {
        let node = node().await;
        let mut publisher = connected(&node, 5).await;
        publisher
            .send(&publish(5, 1, true, "r/1", 1, b"kept"))
            .await;
        assert_eq!(publisher.packet().await.0, 0x40);
        publisher
            .send(&publish(5, 0, false, "r/1", 0, b"not"))
            .await;
        let mut sub = connected(&node, 4).await;
        sub.send(&subscribe(4, 2, "r/+", 0)).await;
        assert_eq!(sub.packet().await, (0x90, vec![0, 2, 0]));
        let (first, body) = sub.packet().await;
        assert_eq!(first, 0x31, "retain flag set");
        assert_eq!(
            &body[5..],
            b"kept",
            "the retained message, not the last one"
        );
        publisher.send(&publish(5, 1, true, "r/1", 2, b"")).await;
        assert_eq!(publisher.packet().await.0, 0x40);
        assert_eq!(sub.packet().await, (0x30, vec![0, 3, b'r', b'/', b'1']));
        let mut late = connected(&node, 4).await;
        late.send(&subscribe(4, 3, "r/#", 0)).await;
        assert_eq!(late.packet().await, (0x90, vec![0, 3, 0]));
        late.quiet().await;
    }

    #[tokio::test]
    async fn the_will_is_published_unless_the_client_disconnects_cleanly() {
        let node = node().await;
        let mut sub = connected(&node, 4).await;
        sub.send(&subscribe(4, 1, "will/#", 0)).await;
        sub.packet().await;
        let with_will = |id: &str| {
            let mut body = string("MQTT");
            body.extend([4, 0x06, 0, 30]);
            body.extend(string(id));
            body.extend(string(&format!("will/{id}")));
            body.extend(string("gone"));
            packet(0x10, &body)
        };
        let mut dies = Client::new(&node).await;
        dies.send(&with_will("x")).await;
        dies.packet().await;
        dies.end();
        let (_, body) = sub.packet().await;
        assert_eq!(&body[2..8], b"will/x");
        let mut leaves = Client::new(&node).await;
        leaves.send(&with_will("y")).await;
        leaves.packet().await;
        leaves.send(&[0xE0, 0]).await;
        leaves.closed().await;
        sub.quiet().await;
    }

    #[tokio::test]
    async fn bad_input_and_refusals() {
        let node = node().await;
        let mut early = Client::new(&node).await;
        early.send(&[0xC0, 0]).await;
        early.closed().await;
        assert!(
            early.got.is_empty(),
            "PINGREQ before CONNECT: closed without a word"
        );
        let mut old = Client::new(&node).await;
        let mut body = string("MQIsdp");
        body.extend([3, 0x02, 0, 30]);
        body.extend(string("c"));
        old.send(&packet(0x10, &body)).await;
        assert_eq!(
            old.packet().await,
            (0x20, vec![0, 1]),
            "3.1: unacceptable version"
        );
        old.closed().await;
        let mut bad = connected(&node, 4).await;
        bad.send(&[0x30, 0xFF, 0xFF, 0xFF, 0xFF, 0x7F]).await;
        bad.closed().await;
        let mut v5 = connected(&node, 5).await;
        v5.send(&subscribe(5, 4, "$share/g", 1)).await;
        assert_eq!(v5.packet().await, (0x90, vec![0, 4, 0, 0x8F]));
        v5.send(&subscribe(5, 5, "a/#/b", 1)).await;
        assert_eq!(v5.packet().await, (0x90, vec![0, 5, 0, 0x8F]));
        v5.send(&[0xC0, 0]).await;
        assert_eq!(v5.packet().await, (0xD0, vec![]));
    }

    #[tokio::test]
    async fn a_shared_subscription_gives_each_message_to_one_member_and_no_retained() {
        let node = node().await;
        let mut publisher = connected(&node, 5).await;
        publisher
            .send(&publish(5, 0, true, "s/r", 0, b"kept"))
            .await;
        let mut members = Vec::new();
        for level in [5, 4] {
            let mut m = connected(&node, level).await;
            m.send(&subscribe(level, 1, "$share/g/s/+", 0)).await;
            let granted = if level == 5 {
                vec![0, 1, 0, 0]
            } else {
                vec![0, 1, 0]
            };
            assert_eq!(m.packet().await, (0x90, granted));
            members.push(m);
        }
        // Its own subscription to the same filter is another: it gets every message.
        let mut own = connected(&node, 4).await;
        own.send(&subscribe(4, 1, "s/+", 0)).await;
        own.packet().await;
        assert_eq!(own.packet().await.0, 0x31, "the retained message");
        for i in 0..4u8 {
            publisher
                .send(&publish(5, 0, false, "s/x", 0, &[b'0' + i]))
                .await;
        }
        let payload = |p: (u8, Vec<u8>)| *p.1.last().unwrap();
        for (k, m) in members.iter_mut().enumerate() {
            let got = [payload(m.packet().await), payload(m.packet().await)];
            let k = k as u8;
            assert_eq!(got, [b'0' + k, b'2' + k], "member {k}");
            m.quiet().await;
        }
        for i in 0..4u8 {
            assert_eq!(payload(own.packet().await), b'0' + i);
        }
    }

    #[tokio::test]
    async fn a_leading_wildcard_does_not_match_dollar_topics() {
        let node = node().await;
        let mut sub = connected(&node, 4).await;
        sub.send(&subscribe(4, 1, "#", 0)).await;
        sub.packet().await;
        let mut publisher = connected(&node, 4).await;
        publisher.send(&publish(4, 0, false, "$x/y", 0, b"1")).await;
        publisher.send(&publish(4, 0, false, "x", 0, b"2")).await;
        assert_eq!(sub.packet().await, (0x30, vec![0, 1, b'x', b'2']));
    }

    #[tokio::test]
    async fn a_message_not_sent_gives_its_lossless_credit_back() {
        let node = node_with(Config {
            mqtt_session_queue_messages: 0,
            ..Config::default()
        })
        .await;
        let mut sub = Client::new(&node).await;
        // Receive maximum 2: its `lossless` window is 2 messages.
        sub.send(&connect5("s", true, &[0x21, 0, 2])).await;
        assert_eq!(sub.packet().await.0, 0x20);
        sub.send(&subscribe(5, 1, "#", 1)).await;
        assert_eq!(sub.packet().await, (0x90, vec![0, 1, 0, 1]));
        let mut publisher = connected(&node, 5).await;
        // `#` matches no `$` topic: herald's `>` does, and spends the credit.
        for id in 1..=4 {
            publisher
                .send(&publish(5, 1, false, "$x/y", id, b"d"))
                .await;
            let (first, body) = publisher.packet().await;
            assert_eq!(
                (first, &body[..2]),
                (0x40, &id.to_be_bytes()[..]),
                "accepted at once"
            );
        }
        publisher.send(&publish(5, 1, false, "t", 9, b"m")).await;
        assert_eq!(publisher.packet().await.0, 0x40);
        let (_, payload) = qos1_of(5, sub.packet().await, false);
        assert_eq!(payload, b"m");
        sub.quiet().await;
    }

    #[tokio::test]
    async fn the_receive_maximum_bounds_the_connection_not_each_subscription() {
        let node = node().await;
        let mut sub = Client::new(&node).await;
        sub.send(&connect5("s", true, &[0x21, 0, 2])).await;
        assert_eq!(sub.packet().await.0, 0x20);
        for (id, filter) in [(1, "r/1"), (2, "r/2")] {
            sub.send(&subscribe(5, id, filter, 1)).await;
            assert_eq!(sub.packet().await.0, 0x90);
        }
        let mut publisher = connected(&node, 4).await;
        for (id, topic, payload) in [
            (1, "r/1", b"a"),
            (2, "r/2", b"b"),
            (3, "r/1", b"c"),
            (4, "r/2", b"d"),
        ] {
            publisher
                .send(&publish(4, 1, false, topic, id, payload))
                .await;
        }
        let (first, a) = qos1_of(5, sub.packet().await, false);
        let (_, b) = qos1_of(5, sub.packet().await, false);
        assert_eq!((a.as_slice(), b.as_slice()), (&b"a"[..], &b"b"[..]));
        sub.quiet().await;
        sub.send(&packet(0x40, &first.to_be_bytes())).await;
        let (_, c) = qos1_of(5, sub.packet().await, false);
        assert_eq!(c, b"c", "one acknowledgement, room for one more");
        sub.quiet().await;
    }

    #[tokio::test]
    async fn a_resumed_session_resends_what_was_in_flight_then_what_came_while_away() {
        let node = node().await;
        let mut sub = Client::new(&node).await;
        sub.send(&connect_persistent("p")).await;
        assert_eq!(sub.packet().await, (0x20, vec![0, 0]), "no session yet");
        sub.send(&subscribe(4, 1, "k/#", 1)).await;
        assert_eq!(sub.packet().await, (0x90, vec![0, 1, 1]));
        let mut publisher = connected(&node, 4).await;
        for (id, payload) in [(1, b"1"), (2, b"2")] {
            publisher
                .send(&publish(4, 1, false, "k/a", id, payload))
                .await;
        }
        let first = qos1_of(4, sub.packet().await, false);
        let second = qos1_of(4, sub.packet().await, false);
        sub.end();
        tokio::time::sleep(Duration::from_millis(100)).await;
        publisher.send(&publish(4, 1, false, "k/b", 3, b"3")).await;
        publisher.send(&publish(4, 1, false, "k/a", 4, b"4")).await;
        let mut back = Client::new(&node).await;
        back.send(&connect_persistent("p")).await;
        assert_eq!(back.packet().await, (0x20, vec![1, 0]), "session present");
        assert_eq!(
            qos1_of(4, back.packet().await, true),
            first,
            "sent again, DUP"
        );
        assert_eq!(qos1_of(4, back.packet().await, true), second);
        let (id, third) = qos1_of(4, back.packet().await, false);
        let (_, fourth) = qos1_of(4, back.packet().await, false);
        assert_eq!(
            (third.as_slice(), fourth.as_slice()),
            (&b"3"[..], &b"4"[..])
        );
        back.quiet().await;
        // The subscription is there without a SUBSCRIBE.
        back.send(&packet(0x40, &id.to_be_bytes())).await;
        publisher.send(&publish(4, 1, false, "k/c", 5, b"5")).await;
        assert_eq!(qos1_of(4, back.packet().await, false).1, b"5");
    }

    #[tokio::test]
    async fn a_second_connection_with_the_client_identifier_takes_the_session_over() {
        let node = node().await;
        let mut first = Client::new(&node).await;
        first
            .send(&connect5("same", true, &[0x11, 0, 0, 0, 60]))
            .await;
        assert_eq!(first.packet().await.0, 0x20);
        first.send(&subscribe(5, 1, "o/#", 1)).await;
        assert_eq!(first.packet().await.0, 0x90);
        let mut second = Client::new(&node).await;
        second.send(&connect5("same", false, &[])).await;
        let (first_byte, body) = second.packet().await;
        assert_eq!((first_byte, body[0]), (0x20, 1), "CONNACK, session present");
        let (kind, body) = first.packet().await;
        assert_eq!(
            (kind, body[0]),
            (0xE0, 0x8E),
            "DISCONNECT, session taken over"
        );
        first.closed().await;
        let mut publisher = connected(&node, 4).await;
        publisher.send(&publish(4, 1, false, "o/x", 1, b"z")).await;
        assert_eq!(qos1_of(5, second.packet().await, false).1, b"z");
    }

    #[tokio::test]
    async fn a_session_taken_over_from_a_client_that_stopped_reading_loses_nothing() {
        let node = node().await;
        let mut stuck = Client::new(&node).await;
        stuck.send(&connect_persistent("stuck")).await;
        assert_eq!(stuck.packet().await.0, 0x20);
        stuck.send(&subscribe(4, 1, "big", 1)).await;
        assert_eq!(stuck.packet().await.0, 0x90);
        // More than a client that does not read takes in: herald holds the rest. QoS 1
        // messages, so that they go at QoS 1 (a QoS 0 one goes at QoS 0). With a receive
        // maximum of 65,535 they are all taken for writing before the takeover, as a rule;
        // what a connection still queues then is the next two tests' subject.
        let mut publisher = connected(&node, 4).await;
        for i in 0..100u8 {
            let payload = vec![i; 64 << 10];
            publisher
                .send(&publish(4, 1, false, "big", u16::from(i) + 1, &payload))
                .await;
        }
        for _ in 0..100 {
            assert_eq!(publisher.packet().await.0, 0x40, "all published");
        }
        let mut taker = Client::new(&node).await;
        taker.send(&connect_persistent("stuck")).await;
        assert_eq!(taker.packet().await, (0x20, vec![1, 0]), "session present");
        let (mut got, mut dup) = (Vec::new(), Vec::new());
        while got.len() < 100 {
            let (first, body) = taker.packet().await;
            assert_eq!(first & 0xF6, 0x32);
            dup.push(first & 0x08 != 0);
            got.push(body[7]);
        }
        assert_eq!(got, (0..100).collect::<Vec<u8>>(), "each once, in order");
        // Those taken for writing before the takeover, the oldest, are sent again (DUP); any
        // still queued then go for the first time, after them. How many were taken (often the
        // whole queue, in one direct write) is the scheduler's.
        let again = dup.iter().take_while(|d| **d).count();
        assert!(again > 0, "the first was sent before: DUP {dup:?}");
        assert!(
            dup[again..].iter().all(|d| !d),
            "DUP only on those sent before, the oldest: {dup:?}"
        );
        drop(stuck);
    }

    #[tokio::test]
    async fn a_session_taken_over_keeps_what_its_connection_queued_and_never_wrote() {
        // No history to recover from: what the connection queued is kept, or lost.
        let node = node_with(Config {
            history: vec![HistoryRule::last_value_only(">")],
            ..Config::default()
        })
        .await;
        let mut old = Client::with_small_window(&node).await;
        old.send(&connect_persistent("unwritten")).await;
        assert_eq!(old.packet().await.0, 0x20);
        old.send(&subscribe(4, 1, "u", 1)).await;
        assert_eq!(old.packet().await.0, 0x90);
        // The first message is larger than the socket buffers between herald and a client
        // that does not read (a few KiB here, at most 4 MiB on herald's side by Linux's
        // default) and within `max_outbound_bytes`: its write does not end, and the messages
        // after it stay in the connection's queue.
        let mut publisher = connected(&node, 4).await;
        let big = vec![7u8; 8 << 20];
        for (i, payload) in [&big[..], b"1", b"2", b"3", b"4", b"5"]
            .into_iter()
            .enumerate()
        {
            publisher
                .send(&publish(4, 1, false, "u", i as u16 + 1, payload))
                .await;
            assert_eq!(publisher.packet().await.0, 0x40, "accepted");
        }
        let mut taker = Client::new(&node).await;
        taker.send(&connect_persistent("unwritten")).await;
        assert_eq!(taker.packet().await, (0x20, vec![1, 0]), "session present");
        let (_, first) = qos1_of(4, taker.packet().await, true);
        assert!(first == big, "the one begun before, again with DUP");
        for i in b'1'..=b'5' {
            let (_, payload) = qos1_of(4, taker.packet().await, false);
            assert_eq!(
                payload,
                [i],
                "those never written, once, in order, without DUP"
            );
        }
        taker.quiet().await;
        drop(old);
    }

    #[tokio::test]
    async fn a_session_taken_over_keeps_the_messages_queued_under_the_receive_maximum() {
        let node = node().await;
        let mut old = Client::new(&node).await;
        // Session expiry 60 s, receive maximum 2.
        let properties = [0x11, 0, 0, 0, 60, 0x21, 0, 2];
        old.send(&connect5("queued", true, &properties)).await;
        assert_eq!(old.packet().await.0, 0x20);
        // Three subscriptions: each has 2 messages of `lossless` credit, the connection room
        // for 2 in flight, so 4 of 6 messages are handed to the connection and wait there.
        for (id, filter) in [(1, "w/0"), (2, "w/1"), (3, "w/2")] {
            old.send(&subscribe(5, id, filter, 1)).await;
            assert_eq!(old.packet().await, (0x90, vec![0, id as u8, 0, 1]));
        }
        let mut publisher = connected(&node, 4).await;
        for i in 0..6u8 {
            let topic = format!("w/{}", i % 3);
            publisher
                .send(&publish(4, 1, false, &topic, u16::from(i) + 1, &[i]))
                .await;
            assert_eq!(publisher.packet().await.0, 0x40, "accepted at once");
        }
        let sent = [
            qos1_of(5, old.packet().await, false),
            qos1_of(5, old.packet().await, false),
        ];
        assert_eq!(
            (sent[0].1.as_slice(), sent[1].1.as_slice()),
            (&[0][..], &[1][..])
        );
        // Not acknowledged: the other 4 stay queued, never written.
        old.quiet().await;
        let mut new = Client::new(&node).await;
        new.send(&connect5("queued", false, &properties[..5])).await;
        let (first, body) = new.packet().await;
        assert_eq!((first, body[0]), (0x20, 1), "CONNACK, session present");
        assert_eq!(old.packet().await.0, 0xE0, "DISCONNECT, taken over");
        // The 2 written before come again with DUP (§4.4), in order; then the 4 never written,
        // each once, in order, without DUP.
        for was in sent {
            assert_eq!(qos1_of(5, new.packet().await, true), was, "sent again, DUP");
        }
        for i in 2..6u8 {
            let (_, payload) = qos1_of(5, new.packet().await, false);
            assert_eq!(payload, [i], "the queued ones, once, in order");
        }
        new.quiet().await;
    }

    #[tokio::test]
    async fn a_kept_session_leaves_its_shared_subscription_while_away_and_rejoins_it() {
        let node = node().await;
        let mut away = Client::new(&node).await;
        away.send(&connect_persistent("member")).await;
        assert_eq!(away.packet().await.0, 0x20);
        away.send(&subscribe(4, 1, "$share/g/sh/#", 1)).await;
        assert_eq!(away.packet().await, (0x90, vec![0, 1, 1]));
        let mut other = connected(&node, 4).await;
        other.send(&subscribe(4, 1, "$share/g/sh/#", 0)).await;
        assert_eq!(other.packet().await, (0x90, vec![0, 1, 0]));
        away.end();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut publisher = connected(&node, 4).await;
        let payload = |p: (u8, Vec<u8>)| *p.1.last().unwrap();
        for i in b'0'..b'4' {
            publisher.send(&publish(4, 0, false, "sh/x", 0, &[i])).await;
        }
        for i in b'0'..b'4' {
            assert_eq!(payload(other.packet().await), i, "the member still there");
        }
        let mut back = Client::new(&node).await;
        back.send(&connect_persistent("member")).await;
        assert_eq!(back.packet().await, (0x20, vec![1, 0]), "session present");
        back.quiet().await;
        // Back in the group with no SUBSCRIBE, at QoS 1: one message each.
        for i in [b'4', b'5'] {
            publisher
                .send(&publish(4, 1, false, "sh/x", u16::from(i), &[i]))
                .await;
        }
        let (_, mine) = qos1_of(4, back.packet().await, false);
        let theirs = payload(other.packet().await);
        let mut both = [mine[0], theirs];
        both.sort();
        assert_eq!(both, [b'4', b'5']);
        back.quiet().await;
        other.quiet().await;
    }

    #[tokio::test]
    async fn a_shared_subscriptions_unacknowledged_message_goes_with_its_session() {
        let node = node().await;
        let expiry = [0x11, 0, 0, 0, 60];
        let mut first = Client::new(&node).await;
        first.send(&connect5("sh", true, &expiry)).await;
        assert_eq!(first.packet().await.0, 0x20);
        first.send(&subscribe(5, 1, "$share/g/q", 1)).await;
        assert_eq!(first.packet().await, (0x90, vec![0, 1, 0, 1]));
        let mut publisher = connected(&node, 4).await;
        publisher.send(&publish(4, 1, false, "q", 1, b"m")).await;
        let sent = qos1_of(5, first.packet().await, false);
        assert_eq!(sent.1, b"m");
        let mut second = Client::new(&node).await;
        second.send(&connect5("sh", false, &expiry)).await;
        let (kind, body) = second.packet().await;
        assert_eq!((kind, body[0]), (0x20, 1), "CONNACK, session present");
        assert_eq!(first.packet().await.0, 0xE0, "DISCONNECT, taken over");
        assert_eq!(
            qos1_of(5, second.packet().await, true),
            sent,
            "sent again, DUP"
        );
        // Acknowledged, it returns the credit of the membership the session rejoined.
        second.send(&packet(0x40, &sent.0.to_be_bytes())).await;
        publisher.send(&publish(4, 1, false, "q", 2, b"n")).await;
        assert_eq!(qos1_of(5, second.packet().await, false).1, b"n");
    }
}
