//! What the server sends: the control packets, and PUBLISH in a form built for fan-out.
//!
//! A PUBLISH to subscribers is a `(head, body)` pair: the head is the fixed and variable
//! header, the body the payload, shared and never copied. [`Prepared`] encodes once per message
//! and version what every subscriber's head has in common (the topic and the message's
//! properties); [`Prepared::head`] then puts a subscriber's head together from those pieces with
//! one allocation. A head with nothing of a subscriber's own in it ([`Delivery::is_shared`]) is
//! the same for every subscriber and can be built once.

use super::packet::MessageProperties;
use super::properties::{self, id, Writer};
use super::wire::{put_string, put_varint, string_len, varint_len, MAX_VARINT};
use super::{QoS, ReasonCode, Version};
use bytes::{BufMut, Bytes, BytesMut};

/// The parts of a PUBLISH the same for every subscriber of one version.
#[derive(Debug, Clone)]
pub struct Prepared {
    version: Version,
    /// The topic name with its length.
    topic: Bytes,
    /// 5.0: the message's properties, without their length, besides the message expiry
    /// interval (which counts down while the message waits: [`Delivery`] gives it).
    properties: Bytes,
    payload: Bytes,
}

/// How a subscriber's PUBLISH uses a topic alias (5.0, §3.3.2.3.4).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TopicAlias {
    /// The topic in full, no alias.
    #[default]
    None,
    /// The topic in full, and this alias set to it.
    Set(u16),
    /// An empty topic and this alias, set earlier on the connection.
    Use(u16),
}

/// What one subscriber's PUBLISH has of its own.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Delivery<'a> {
    pub qos: QoS,
    /// Used when the QoS is 1 or 2, and must then not be 0.
    pub packet_id: u16,
    pub dup: bool,
    pub retain: bool,
    /// 5.0 only, as are the two below.
    pub topic_alias: TopicAlias,
    /// The identifiers of the subscriptions that matched (§3.3.4).
    pub subscription_identifiers: &'a [u32],
    /// What remains of the message's expiry interval (§3.3.2.3.3: the received value less the
    /// time the message waited in the server).
    pub message_expiry_interval: Option<u32>,
}

impl Delivery<'_> {
    /// Whether the head depends on nothing but the retain flag and the expiry interval, so
    /// that one head serves every subscriber given the same two.
    pub fn is_shared(&self) -> bool {
        self.qos == QoS::AtMostOnce
            && self.topic_alias == TopicAlias::None
            && self.subscription_identifiers.is_empty()
    }
}

/// The packet would be longer than a remaining length can say (256 MiB).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the packet is longer than MQTT's largest remaining length")]
pub struct TooLarge;

impl Prepared {
    /// Encodes what every subscriber's head shares. `topic` is an MQTT topic name (herald's are
    /// at most 250 bytes, well within a string's 65,535).
    pub fn new(
        version: Version,
        topic: &str,
        message: &MessageProperties,
        payload: Bytes,
    ) -> Prepared {
        let mut t = BytesMut::with_capacity(string_len(topic));
        put_string(&mut t, topic);
        let mut p = Writer::new();
        if version == Version::V5 {
            if message.payload_utf8 {
                p.u8(id::PAYLOAD_FORMAT_INDICATOR, 1);
            }
            if let Some(ct) = &message.content_type {
                p.string(id::CONTENT_TYPE, ct);
            }
            if let Some(rt) = &message.response_topic {
                p.string(id::RESPONSE_TOPIC, rt);
            }
            if let Some(cd) = &message.correlation_data {
                p.binary(id::CORRELATION_DATA, cd);
            }
            p.user_properties(&message.user_properties);
        }
        Prepared {
            version,
            topic: t.freeze(),
            properties: Bytes::copy_from_slice(p.bytes()),
            payload,
        }
    }

    /// The payload, to send after a head: shared, not copied.
    pub fn body(&self) -> Bytes {
        self.payload.clone()
    }

    /// A subscriber's head: fixed header, topic, packet identifier, properties.
    pub fn head(&self, d: &Delivery) -> Result<Bytes, TooLarge> {
        let mut out = BytesMut::new();
        self.head_into(d, &mut out)?;
        Ok(out.freeze())
    }

    /// The length of [`Prepared::head`] for `d`.
    pub fn head_len(&self, d: &Delivery) -> Result<usize, TooLarge> {
        let (_, variable, remaining) = self.lengths(d)?;
        Ok(1 + varint_len(remaining) + variable)
    }

    /// The topic name as `d`'s head carries it: empty (its length alone) under an alias set
    /// earlier (5.0).
    fn topic_of(&self, d: &Delivery) -> &[u8] {
        match d.topic_alias {
            TopicAlias::Use(_) if self.version == Version::V5 => &[0, 0],
            _ => &self.topic,
        }
    }

    /// The 5.0 properties' length, the variable header's and the remaining length of the
    /// packet `d` makes.
    fn lengths(&self, d: &Delivery) -> Result<(usize, usize, usize), TooLarge> {
        let v5 = self.version == Version::V5;
        let mut props_len = 0;
        if v5 {
            props_len = self.properties.len();
            if d.message_expiry_interval.is_some() {
                props_len += 5;
            }
            if d.topic_alias != TopicAlias::None {
                props_len += 3;
            }
            for &sid in d.subscription_identifiers {
                props_len += 1 + varint_len(sid as usize);
            }
        }
        let variable = self.topic_of(d).len()
            + if d.qos != QoS::AtMostOnce { 2 } else { 0 }
            + if v5 {
                varint_len(props_len) + props_len
            } else {
                0
            };
        let remaining = variable + self.payload.len();
        if remaining > MAX_VARINT as usize || props_len > MAX_VARINT as usize {
            return Err(TooLarge);
        }
        Ok((props_len, variable, remaining))
    }

    /// [`Prepared::head`] appended to `out` (nothing when it is too large), for a caller that
    /// puts several heads in one buffer.
    pub fn head_into(&self, d: &Delivery, out: &mut BytesMut) -> Result<(), TooLarge> {
        let v5 = self.version == Version::V5;
        let with_id = d.qos != QoS::AtMostOnce;
        let topic = self.topic_of(d);
        let (props_len, variable, remaining) = self.lengths(d)?;
        let first = 0x30 | u8::from(d.dup) << 3 | (d.qos as u8) << 1 | u8::from(d.retain);
        out.reserve(1 + varint_len(remaining) + variable);
        out.put_u8(first);
        put_varint(out, remaining);
        out.put_slice(topic);
        if with_id {
            out.put_u16(d.packet_id);
        }
        if v5 {
            put_varint(out, props_len);
            if let Some(expiry) = d.message_expiry_interval {
                out.put_u8(id::MESSAGE_EXPIRY_INTERVAL);
                out.put_u32(expiry);
            }
            match d.topic_alias {
                TopicAlias::Set(alias) | TopicAlias::Use(alias) => {
                    out.put_u8(id::TOPIC_ALIAS);
                    out.put_u16(alias);
                }
                TopicAlias::None => {}
            }
            for &sid in d.subscription_identifiers {
                out.put_u8(id::SUBSCRIPTION_IDENTIFIER);
                put_varint(out, sid as usize);
            }
            out.put_slice(&self.properties);
        }
        Ok(())
    }
}

/// The reason string and user properties a 5.0 response may carry (§3.1.2.11.7: only when the
/// client did not turn problem information off, which the caller checks).
#[derive(Debug, Clone, Copy, Default)]
pub struct ProblemInfo<'a> {
    pub reason_string: Option<&'a str>,
    pub user_properties: &'a [(String, String)],
}

impl ProblemInfo<'_> {
    fn is_empty(&self) -> bool {
        self.reason_string.is_none() && self.user_properties.is_empty()
    }

    fn write(&self, p: &mut Writer) {
        if let Some(reason) = self.reason_string {
            p.string(id::REASON_STRING, reason);
        }
        p.user_properties(self.user_properties);
    }
}

/// Fixed header, then `variable` as the rest of the packet.
fn packet(first: u8, variable: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(1 + varint_len(variable.len()) + variable.len());
    out.put_u8(first);
    put_varint(&mut out, variable.len());
    out.put_slice(variable);
    out.freeze()
}

/// The 3.1.1 CONNACK return code (§3.2.2.3) closest to a 5.0 reason code.
pub fn connack_return_code_311(reason: ReasonCode) -> u8 {
    match reason {
        ReasonCode::Success => 0x00,
        ReasonCode::UnsupportedProtocolVersion => 0x01,
        ReasonCode::ClientIdentifierNotValid => 0x02,
        ReasonCode::BadUserNameOrPassword | ReasonCode::BadAuthenticationMethod => 0x04,
        ReasonCode::NotAuthorized | ReasonCode::Banned => 0x05,
        _ => 0x03,
    }
}

/// The properties of a 5.0 CONNACK (§3.2.2.3); `None` leaves one out, which the client reads
/// as the specification's default.
#[derive(Debug, Clone, Default)]
pub struct ConnackProperties {
    pub session_expiry_interval: Option<u32>,
    pub receive_maximum: Option<u16>,
    /// 0 or 1 (a server that supports QoS 2 leaves it out).
    pub maximum_qos: Option<u8>,
    pub retain_available: Option<bool>,
    pub maximum_packet_size: Option<u32>,
    pub assigned_client_identifier: Option<String>,
    pub topic_alias_maximum: Option<u16>,
    pub reason_string: Option<String>,
    pub user_properties: Vec<(String, String)>,
    pub wildcard_subscription_available: Option<bool>,
    pub subscription_identifiers_available: Option<bool>,
    pub shared_subscription_available: Option<bool>,
    pub server_keep_alive: Option<u16>,
    pub response_information: Option<String>,
    pub server_reference: Option<String>,
}

/// CONNACK (§3.2). 3.1.1 gets [`connack_return_code_311`] of `reason` and no properties.
pub fn connack(
    version: Version,
    session_present: bool,
    reason: ReasonCode,
    props: &ConnackProperties,
) -> Bytes {
    let mut v = BytesMut::new();
    v.put_u8(u8::from(session_present));
    match version {
        Version::V311 => v.put_u8(connack_return_code_311(reason)),
        Version::V5 => {
            v.put_u8(reason as u8);
            let mut p = Writer::new();
            if let Some(x) = props.session_expiry_interval {
                p.u32(id::SESSION_EXPIRY_INTERVAL, x);
            }
            if let Some(x) = props.receive_maximum {
                p.u16(id::RECEIVE_MAXIMUM, x);
            }
            if let Some(x) = props.maximum_qos {
                p.u8(id::MAXIMUM_QOS, x);
            }
            if let Some(x) = props.retain_available {
                p.u8(id::RETAIN_AVAILABLE, u8::from(x));
            }
            if let Some(x) = props.maximum_packet_size {
                p.u32(id::MAXIMUM_PACKET_SIZE, x);
            }
            if let Some(x) = &props.assigned_client_identifier {
                p.string(id::ASSIGNED_CLIENT_IDENTIFIER, x);
            }
            if let Some(x) = props.topic_alias_maximum {
                p.u16(id::TOPIC_ALIAS_MAXIMUM, x);
            }
            if let Some(x) = &props.reason_string {
                p.string(id::REASON_STRING, x);
            }
            p.user_properties(&props.user_properties);
            if let Some(x) = props.wildcard_subscription_available {
                p.u8(id::WILDCARD_SUBSCRIPTION_AVAILABLE, u8::from(x));
            }
            if let Some(x) = props.subscription_identifiers_available {
                p.u8(id::SUBSCRIPTION_IDENTIFIER_AVAILABLE, u8::from(x));
            }
            if let Some(x) = props.shared_subscription_available {
                p.u8(id::SHARED_SUBSCRIPTION_AVAILABLE, u8::from(x));
            }
            if let Some(x) = props.server_keep_alive {
                p.u16(id::SERVER_KEEP_ALIVE, x);
            }
            if let Some(x) = &props.response_information {
                p.string(id::RESPONSE_INFORMATION, x);
            }
            if let Some(x) = &props.server_reference {
                p.string(id::SERVER_REFERENCE, x);
            }
            properties::finish(&mut v, &p);
        }
    }
    packet(0x20, &v)
}

/// Which acknowledgement of the QoS 1 and 2 flows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckKind {
    PubAck,
    PubRec,
    PubRel,
    PubComp,
}

/// PUBACK, PUBREC, PUBREL or PUBCOMP (§3.4 to §3.7). 5.0 leaves out what it may: the reason
/// code when it is Success without properties, the properties when there are none.
pub fn ack(
    version: Version,
    kind: AckKind,
    packet_id: u16,
    reason: ReasonCode,
    info: ProblemInfo,
) -> Bytes {
    let first = match kind {
        AckKind::PubAck => 0x40,
        AckKind::PubRec => 0x50,
        AckKind::PubRel => 0x62,
        AckKind::PubComp => 0x70,
    };
    let mut v = BytesMut::new();
    v.put_u16(packet_id);
    if version == Version::V5 && (reason != ReasonCode::Success || !info.is_empty()) {
        v.put_u8(reason as u8);
        if !info.is_empty() {
            let mut p = Writer::new();
            info.write(&mut p);
            properties::finish(&mut v, &p);
        }
    }
    packet(first, &v)
}

/// SUBACK (§3.9): one code per filter, in order. 3.1.1 knows granted QoS 0 to 2 and failure
/// (0x80), which every error becomes.
pub fn suback(version: Version, packet_id: u16, codes: &[ReasonCode], info: ProblemInfo) -> Bytes {
    let mut v = BytesMut::new();
    v.put_u16(packet_id);
    if version == Version::V5 {
        let mut p = Writer::new();
        info.write(&mut p);
        properties::finish(&mut v, &p);
    }
    for &code in codes {
        v.put_u8(match version {
            Version::V5 => code as u8,
            Version::V311 if code.is_error() => 0x80,
            Version::V311 => code as u8,
        });
    }
    packet(0x90, &v)
}

/// UNSUBACK (§3.11): 3.1.1 has only the packet identifier; 5.0 a code per filter.
pub fn unsuback(
    version: Version,
    packet_id: u16,
    codes: &[ReasonCode],
    info: ProblemInfo,
) -> Bytes {
    let mut v = BytesMut::new();
    v.put_u16(packet_id);
    if version == Version::V5 {
        let mut p = Writer::new();
        info.write(&mut p);
        properties::finish(&mut v, &p);
        v.extend(codes.iter().map(|&c| c as u8));
    }
    packet(0xB0, &v)
}

/// PINGRESP (§3.13).
pub fn pingresp() -> Bytes {
    Bytes::from_static(&[0xD0, 0x00])
}

/// A 5.0 DISCONNECT from the server (§3.14; 3.1.1 servers close without one). It never
/// carries a session expiry interval (§3.14.2.2.2).
pub fn disconnect(reason: ReasonCode, info: ProblemInfo, server_reference: Option<&str>) -> Bytes {
    let mut v = BytesMut::new();
    if reason != ReasonCode::Success || !info.is_empty() || server_reference.is_some() {
        v.put_u8(reason as u8);
        let mut p = Writer::new();
        info.write(&mut p);
        if let Some(reference) = server_reference {
            p.string(id::SERVER_REFERENCE, reference);
        }
        if !p.is_empty() {
            properties::finish(&mut v, &p);
        }
    }
    packet(0xE0, &v)
}
