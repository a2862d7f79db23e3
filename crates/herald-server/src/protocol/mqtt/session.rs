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
//! What the session does not do, and why, is in `docs/mqtt.md`: no persistent sessions (a
//! session ends with its connection), and the will is published when the connection ends even
//! if it has a delay.

use super::codec::{framed, Encoder, Outbound, Sub, Tag};
use super::encode::{self, AckKind, ConnackProperties, ProblemInfo};
use super::extras::extras_of;
use super::packet::{self, Connect, Decoder, Limits, Packet, Reply as Refusal, RetainHandling};
use super::retained::{Retained, RetainedStore};
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

/// Topic aliases a client may set on its PUBLISH packets (5.0).
pub const TOPIC_ALIAS_MAXIMUM: u16 = 64;

/// Room in a packet for what is not payload (topic, properties), over `max_message_bytes`.
const PACKET_OVERHEAD: u32 = 64 * 1024;

/// One MQTT connection's protocol state.
pub struct Mqtt {
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
    will: Option<packet::Will>,
    /// The client said DISCONNECT (without asking for its will): the will is not published.
    clean_end: bool,
    receive_maximum: u16,
    aliases: HashMap<u16, String>,
    /// How many of the connection's MQTT subscriptions use each herald pattern (`a/#` and
    /// `a` share `a`): a herald subscription goes only with the last.
    pattern_users: HashMap<String, usize>,
}

impl Mqtt {
    pub fn new(node: &Node, framing: Framing) -> Mqtt {
        let maximum_packet_size = u32::try_from(node.config.max_message_bytes)
            .unwrap_or(u32::MAX)
            .saturating_add(PACKET_OVERHEAD)
            .min(super::wire::MAX_VARINT + 5);
        let state = Arc::new(Mutex::new(Outbound::default()));
        let retained = node.mqtt_retained.clone();
        let encoder = Arc::new(Encoder::new(framing, retained.clone(), state.clone()));
        Mqtt {
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
        {
            let mut s = self.state.lock();
            s.version = version;
            s.maximum_packet_size = c.maximum_packet_size.unwrap_or(u32::MAX);
            s.problem_info = c.request_problem_information;
        }
        let mut props = ConnackProperties {
            maximum_packet_size: Some(self.maximum_packet_size),
            topic_alias_maximum: Some(TOPIC_ALIAS_MAXIMUM),
            subscription_identifiers_available: Some(true),
            shared_subscription_available: Some(true),
            ..ConnackProperties::default()
        };
        if c.session_expiry_interval != 0 {
            // Sessions end with their connection (docs/mqtt.md).
            props.session_expiry_interval = Some(0);
        }
        if c.client_id.is_empty() && version == Version::V5 {
            props.assigned_client_identifier =
                Some(format!("herald-{:016x}", rand::random::<u64>()));
        }
        self.send(
            cx,
            encode::connack(version, false, ReasonCode::Success, &props),
        );
        // §3.1.2.10: one and a half times the keep-alive with nothing received ends it.
        cx.set_keepalive(Keepalive {
            ping: None,
            idle: Duration::from_millis(u64::from(c.keep_alive) * 1500),
        });
        self.connect = Some(Connected {
            version,
            will: c.will,
            clean_end: false,
            receive_maximum: c.receive_maximum.max(1),
            aliases: HashMap::new(),
            pattern_users: HashMap::new(),
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
        let extras = extras_of(&p.message, p.retain, cx.now_us);
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
        let window = u64::from(connected.receive_maximum);
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
                    window: lossless.then_some(window),
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
                let (credit, owed) = {
                    let mut s = self.state.lock();
                    (s.acknowledged(ack.packet_id), s.take_owed())
                };
                for credit in credit.into_iter().chain(owed) {
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
                let owed = self.state.lock().take_owed();
                owed.iter().for_each(|credit| cx.request(credit.request()));
                Ok(())
            }
            Packet::Disconnect(d) => {
                if let Some(c) = self.connect.as_mut() {
                    c.clean_end = d.reason != ReasonCode::DisconnectWithWill;
                }
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
        let Some(connected) = self.connect.take() else {
            return;
        };
        let Some(will) = connected.will.filter(|_| !connected.clean_end) else {
            return;
        };
        let Ok(topic) = to_herald_topic(&will.topic) else {
            return;
        };
        let kind = if will.message.payload_utf8 {
            PayloadKind::Text
        } else {
            PayloadKind::Binary
        };
        let extras = extras_of(&will.message, will.retain, cx.now_us);
        let publish = Publish {
            id: None,
            topic: topic.as_ref().into(),
            payload: will.payload.clone(),
            kind,
            content_type: will.message.content_type.clone(),
            stamp: false,
            extras: extras.clone(),
        };
        let request = Request::Publish(publish);
        if !cx.admits(&request) {
            return;
        }
        if will.retain {
            let message = Retained {
                payload: will.payload,
                kind,
                content_type: will.message.content_type,
                qos: will.qos.min(QoS::AtLeastOnce),
                extras,
            };
            // A full store keeps the will from being retained; it is still published.
            let _ = self.retained.publish(&topic, message);
        }
        cx.request(request);
    }
}

#[cfg(test)]
mod tests {
    //! The session and its encoder on herald's MQTT listener, over real sockets: packets are
    //! written by hand, so that each test says exactly what the client sends.
    use super::*;
    use crate::config::Config;
    use crate::listener;
    use crate::protocol::mqtt::wire::read_varint;
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
        let tcp = listener::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let config = Config {
            mqtt_listen: Some(tcp.local_addr().unwrap()),
            ..Config::default()
        };
        let node = Node::new(config).unwrap();
        let serving = node.clone();
        tokio::spawn(async move {
            let mqtt = |node: &Node| Mqtt::new(node, Framing::Stream);
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
        assert!(body.len() < 128);
        let mut v = vec![first, body.len() as u8];
        v.extend_from_slice(body);
        v
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

    async fn connected(node: &Arc<Node>, level: u8) -> Client {
        let mut c = Client::new(node).await;
        c.send(&connect(level, "c")).await;
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
        // `a/#` also matches `a`; the message goes at the subscription's QoS, as herald does
        // not record the publisher's.
        publisher.send(&publish(5, 0, false, "a", 0, b"x")).await;
        let (first, body) = sub.packet().await;
        assert_eq!((first, &body[..3]), (0x32, &[0, 1, b'a'][..]));
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
}
