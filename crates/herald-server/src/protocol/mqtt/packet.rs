//! The packets a client sends, and [`Decoder`], which takes them one at a time from the bytes a
//! connection has received.
//!
//! A packet that breaks the specification ends in a [`DecodeError`]: the reason code, and the
//! [`Reply`] the server sends before it closes the connection (§4.13 of MQTT 5.0; 3.1.1 closes
//! without a word except for the two CONNACK return codes it defines for CONNECT). The decoder
//! checks what a packet alone shows; what needs the session (a topic alias's topic, a packet
//! identifier in use, the receive maximum) is the protocol layer's.

use super::properties::{self, Place, Properties, UserProperties};
use super::wire::{fault, malformed, read_varint, Fault, Reader};
use super::{QoS, ReasonCode, Version};
use bytes::{Buf, Bytes, BytesMut};

/// A packet from a client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Packet {
    Connect(Box<Connect>),
    Publish(Publish),
    PubAck(Ack),
    PubRec(Ack),
    PubRel(Ack),
    PubComp(Ack),
    Subscribe(Subscribe),
    Unsubscribe(Unsubscribe),
    PingReq,
    Disconnect(Disconnect),
    Auth(Auth),
}

/// CONNECT (§3.1). Absent 5.0 properties have their specified defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connect {
    pub version: Version,
    /// Clean start (5.0), clean session (3.1.1).
    pub clean_start: bool,
    /// Seconds; 0 turns keep-alive off.
    pub keep_alive: u16,
    /// May be empty: 5.0 has the server assign one; 3.1.1 only with a clean session.
    pub client_id: String,
    pub will: Option<Will>,
    pub username: Option<String>,
    pub password: Option<Bytes>,
    /// Seconds the session outlives the connection; `u32::MAX` never expires it.
    pub session_expiry_interval: u32,
    /// Unacknowledged QoS 1 and 2 PUBLISH packets the client accepts at once (default 65,535).
    pub receive_maximum: u16,
    /// The largest packet the client accepts, if it says.
    pub maximum_packet_size: Option<u32>,
    /// Topic aliases the client accepts from the server (default 0: none).
    pub topic_alias_maximum: u16,
    pub request_response_information: bool,
    /// Whether reason strings and user properties may go with errors (default true).
    pub request_problem_information: bool,
    pub user_properties: UserProperties,
    pub authentication_method: Option<String>,
    pub authentication_data: Option<Bytes>,
}

/// The will message of a CONNECT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Will {
    pub topic: String,
    pub payload: Bytes,
    pub qos: QoS,
    pub retain: bool,
    /// Seconds after the connection ends before the will is published (5.0).
    pub delay_interval: u32,
    pub message: MessageProperties,
}

/// The properties a message carries from its publisher to its subscribers (5.0), the same for
/// a PUBLISH and a will.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MessageProperties {
    /// Payload format indicator 1: the payload is UTF-8 text.
    pub payload_utf8: bool,
    /// Seconds the message lives.
    pub message_expiry_interval: Option<u32>,
    pub content_type: Option<String>,
    pub response_topic: Option<String>,
    pub correlation_data: Option<Bytes>,
    pub user_properties: UserProperties,
}

impl MessageProperties {
    fn take(p: &mut Properties) -> MessageProperties {
        MessageProperties {
            payload_utf8: p.payload_utf8 == Some(true),
            message_expiry_interval: p.message_expiry_interval,
            content_type: p.content_type.take(),
            response_topic: p.response_topic.take(),
            correlation_data: p.correlation_data.take(),
            user_properties: std::mem::take(&mut p.user_properties),
        }
    }
}

/// PUBLISH (§3.3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Publish {
    pub dup: bool,
    pub qos: QoS,
    pub retain: bool,
    /// Empty only in 5.0 with a topic alias, whose topic the session knows.
    pub topic: String,
    /// Present exactly when the QoS is 1 or 2; never 0.
    pub packet_id: Option<u16>,
    /// Between 1 and the decoder's topic alias maximum.
    pub topic_alias: Option<u16>,
    pub message: MessageProperties,
    pub payload: Bytes,
}

/// PUBACK, PUBREC, PUBREL or PUBCOMP (§3.4 to §3.7).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ack {
    pub packet_id: u16,
    /// Success when the packet has none (3.1.1, or 5.0's short form).
    pub reason: ReasonCode,
    pub reason_string: Option<String>,
    pub user_properties: UserProperties,
}

/// SUBSCRIBE (§3.8).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscribe {
    pub packet_id: u16,
    /// 1 to 268,435,455 (5.0).
    pub subscription_identifier: Option<u32>,
    pub user_properties: UserProperties,
    /// At least one.
    pub filters: Vec<SubscribeFilter>,
}

/// One topic filter of a SUBSCRIBE and its options. The filter is a well-formed, non-empty
/// string; [`super::topic`] judges its wildcards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscribeFilter {
    pub filter: String,
    pub qos: QoS,
    /// 5.0: do not send the subscriber what it publishes itself.
    pub no_local: bool,
    /// 5.0: keep the retain flag of forwarded messages.
    pub retain_as_published: bool,
    pub retain_handling: RetainHandling,
}

/// When retained messages are sent for a subscription (5.0 §3.8.3.1; 3.1.1 always sends them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetainHandling {
    /// At every subscribe (0).
    OnSubscribe,
    /// Only when the subscription did not exist (1).
    OnNewSubscription,
    /// Never (2).
    Never,
}

/// UNSUBSCRIBE (§3.10).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsubscribe {
    pub packet_id: u16,
    pub user_properties: UserProperties,
    /// At least one; well-formed, non-empty strings.
    pub filters: Vec<String>,
}

/// DISCONNECT (§3.14).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disconnect {
    /// Success (normal disconnection) when the packet has none.
    pub reason: ReasonCode,
    pub session_expiry_interval: Option<u32>,
    pub reason_string: Option<String>,
    pub user_properties: UserProperties,
    pub server_reference: Option<String>,
}

/// AUTH (§3.15, 5.0 only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Auth {
    pub reason: ReasonCode,
    pub authentication_method: Option<String>,
    pub authentication_data: Option<Bytes>,
    pub reason_string: Option<String>,
    pub user_properties: UserProperties,
}

/// What the server sends before it closes a connection whose packet it refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    /// Nothing: close at once.
    Close,
    /// A 3.1.1 CONNACK with this return code (0x01 unacceptable protocol version, 0x02
    /// identifier rejected), then close. A 3.1 client reads it the same way.
    Connack311(u8),
    /// A 5.0 CONNACK with this reason code, then close.
    Connack5(ReasonCode),
    /// A 5.0 DISCONNECT with this reason code, then close.
    Disconnect5(ReasonCode),
}

/// Why the decoder refused what it received. The connection cannot continue after one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{detail} (reason code {:#04x})", *reason as u8)]
pub struct DecodeError {
    pub reason: ReasonCode,
    pub reply: Reply,
    pub detail: &'static str,
}

/// What the decoder enforces beyond the grammar, set by the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The largest whole packet (fixed header included) accepted, in bytes.
    pub maximum_packet_size: u32,
    /// The topic aliases a client may use: 1 to this (the CONNACK's topic alias maximum).
    pub topic_alias_maximum: u16,
}

/// Takes packets off the front of a connection's receive buffer.
///
/// Until a CONNECT has been decoded only a CONNECT is accepted (§3.1); after one, another
/// CONNECT is a protocol error, and each packet is read by the version the CONNECT named.
#[derive(Debug)]
pub struct Decoder {
    limits: Limits,
    version: Option<Version>,
}

impl Decoder {
    pub fn new(limits: Limits) -> Decoder {
        Decoder {
            limits,
            version: None,
        }
    }

    /// The version of the CONNECT decoded, if one was.
    pub fn version(&self) -> Option<Version> {
        self.version
    }

    /// Removes one whole packet from the front of `buf`. `Ok(None)`: `buf` holds less than a
    /// packet and is left as it is; call again when more bytes arrive. A packet larger than the
    /// limit is refused as soon as its fixed header shows its size.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Packet>, DecodeError> {
        let Some(&first) = buf.first() else {
            return Ok(None);
        };
        let in_connect = self.version.is_none();
        let error = |version: Option<Version>, f: Fault, reply: Option<Reply>| DecodeError {
            reason: f.reason,
            reply: reply.unwrap_or_else(|| reply_for(version, in_connect, f.reason)),
            detail: f.detail,
        };
        if in_connect && first >> 4 != 1 {
            let f = Fault {
                reason: ReasonCode::ProtocolError,
                detail: "the first packet is not CONNECT",
            };
            return Err(error(None, f, Some(Reply::Close)));
        }
        let minimal = self.version == Some(Version::V5);
        let (remaining, len_bytes) = match read_varint(&buf[1..], minimal) {
            Ok(Some(found)) => found,
            Ok(None) => return Ok(None),
            Err(f) => return Err(error(self.version, f, None)),
        };
        let total = 1 + len_bytes + remaining as usize;
        if total > self.limits.maximum_packet_size as usize {
            let f = Fault {
                reason: ReasonCode::PacketTooLarge,
                detail: "the packet is larger than the maximum packet size",
            };
            return Err(error(self.version, f, None));
        }
        if buf.len() < total {
            return Ok(None);
        }
        let mut packet = buf.split_to(total).freeze();
        packet.advance(1 + len_bytes);
        let mut r = Reader::new(packet);
        match self.version {
            None => {
                let connect = read_connect(first, &mut r)
                    .map_err(|(version, f, reply)| error(version, f, reply))?;
                self.version = Some(connect.version);
                Ok(Some(Packet::Connect(Box::new(connect))))
            }
            Some(version) => read_packet(first, &mut r, version, &self.limits)
                .map(Some)
                .map_err(|f| error(Some(version), f, None)),
        }
    }
}

/// The reply §4.13 calls for when a packet is refused.
fn reply_for(version: Option<Version>, in_connect: bool, reason: ReasonCode) -> Reply {
    match (version, in_connect) {
        (Some(Version::V5), true) => Reply::Connack5(reason),
        (Some(Version::V5), false) => Reply::Disconnect5(reason),
        _ => Reply::Close,
    }
}

/// Reads a CONNECT. A fault carries the version, once the protocol level has shown it, so
/// that the reply can be in it, and any reply it needs other than [`reply_for`]'s.
fn read_connect(
    first: u8,
    r: &mut Reader,
) -> Result<Connect, (Option<Version>, Fault, Option<Reply>)> {
    let bare = |f: Fault| (None, f, None);
    if first & 0x0F != 0 {
        return Err(bare(reserved_flags()));
    }
    let name = r.binary().map_err(bare)?;
    let level = r.u8().map_err(bare)?;
    let version = match (&name[..], level) {
        (b"MQTT", 4) => Version::V311,
        (b"MQTT", 5) => Version::V5,
        // 3.1 ("MQIsdp", level 3), or a level this server does not speak: 3.1.1's answer,
        // which every version reads (§3.1.2.2 of both).
        (b"MQTT" | b"MQIsdp", _) => {
            let f = Fault {
                reason: ReasonCode::UnsupportedProtocolVersion,
                detail: "the protocol level is neither 4 (3.1.1) nor 5 (5.0)",
            };
            return Err((None, f, Some(Reply::Connack311(0x01))));
        }
        _ => {
            let f = Fault {
                reason: ReasonCode::UnsupportedProtocolVersion,
                detail: "the protocol name is not MQTT",
            };
            return Err((None, f, Some(Reply::Close)));
        }
    };
    let known = |f: Fault| {
        let reply = match (version, f.reason) {
            (Version::V311, ReasonCode::ClientIdentifierNotValid) => Some(Reply::Connack311(0x02)),
            _ => None,
        };
        (Some(version), f, reply)
    };
    read_connect_body(r, version).map_err(known)
}

fn read_connect_body(r: &mut Reader, version: Version) -> Result<Connect, Fault> {
    let v5 = version == Version::V5;
    let flags = r.u8()?;
    if flags & 0x01 != 0 {
        return malformed("the reserved CONNECT flag is set");
    }
    let clean_start = flags & 0x02 != 0;
    let has_will = flags & 0x04 != 0;
    let will_qos = (flags >> 3) & 0x03;
    let will_retain = flags & 0x20 != 0;
    let has_password = flags & 0x40 != 0;
    let has_username = flags & 0x80 != 0;
    if !has_will && (will_qos != 0 || will_retain) {
        return malformed("will QoS or will retain is set without a will");
    }
    let Some(will_qos) = QoS::from_bits(will_qos) else {
        return malformed("the will QoS is 3");
    };
    if !v5 && has_password && !has_username {
        return malformed("a password without a user name (3.1.1)");
    }
    let keep_alive = r.u16()?;
    let mut p = if v5 {
        properties::read(r, Place::Connect)?
    } else {
        Properties::default()
    };
    if p.authentication_data.is_some() && p.authentication_method.is_none() {
        return fault(
            ReasonCode::ProtocolError,
            "authentication data without an authentication method",
        );
    }
    let client_id = r.string()?;
    if !v5 && client_id.is_empty() && !clean_start {
        return fault(
            ReasonCode::ClientIdentifierNotValid,
            "an empty client identifier needs a clean session (3.1.1)",
        );
    }
    let will = if has_will {
        let mut wp = if v5 {
            properties::read(r, Place::Will)?
        } else {
            Properties::default()
        };
        let topic = topic_name(r)?;
        let payload = r.binary()?;
        Some(Will {
            topic,
            payload,
            qos: will_qos,
            retain: will_retain,
            delay_interval: wp.will_delay_interval.unwrap_or(0),
            message: MessageProperties::take(&mut wp),
        })
    } else {
        None
    };
    let username = if has_username {
        Some(r.string()?)
    } else {
        None
    };
    let password = if has_password {
        Some(r.binary()?)
    } else {
        None
    };
    if !r.is_empty() {
        return malformed("bytes follow the end of the CONNECT");
    }
    Ok(Connect {
        version,
        clean_start,
        keep_alive,
        client_id,
        will,
        username,
        password,
        session_expiry_interval: p.session_expiry_interval.unwrap_or(0),
        receive_maximum: p.receive_maximum.unwrap_or(u16::MAX),
        maximum_packet_size: p.maximum_packet_size,
        topic_alias_maximum: p.topic_alias_maximum.unwrap_or(0),
        request_response_information: p.request_response_information.unwrap_or(false),
        request_problem_information: p.request_problem_information.unwrap_or(true),
        user_properties: std::mem::take(&mut p.user_properties),
        authentication_method: p.authentication_method,
        authentication_data: p.authentication_data,
    })
}

fn reserved_flags() -> Fault {
    Fault {
        reason: ReasonCode::MalformedPacket,
        detail: "the reserved flags of the fixed header are wrong",
    }
}

/// Reads a non-empty topic name without wildcards (§4.7.3, §3.3.2.1).
fn topic_name(r: &mut Reader) -> Result<String, Fault> {
    let topic = r.string()?;
    if topic.is_empty() {
        return malformed("a topic name is empty");
    }
    if topic.contains(['+', '#']) {
        return fault(ReasonCode::TopicNameInvalid, "a topic name has a wildcard");
    }
    Ok(topic)
}

/// A packet identifier where one is required: never 0 (§2.2.1).
fn packet_id(r: &mut Reader) -> Result<u16, Fault> {
    match r.u16()? {
        0 => fault(ReasonCode::ProtocolError, "a packet identifier is 0"),
        id => Ok(id),
    }
}

/// Reads any packet but CONNECT, after the CONNECT.
fn read_packet(
    first: u8,
    r: &mut Reader,
    version: Version,
    limits: &Limits,
) -> Result<Packet, Fault> {
    let kind = first >> 4;
    let flags = first & 0x0F;
    // PUBLISH's flags are its own; PUBREL, SUBSCRIBE and UNSUBSCRIBE have 0b0010, the rest 0.
    let expected = match kind {
        3 => flags,
        6 | 8 | 10 => 0x02,
        _ => 0x00,
    };
    if flags != expected {
        return Err(reserved_flags());
    }
    let v5 = version == Version::V5;
    let packet = match kind {
        1 => return fault(ReasonCode::ProtocolError, "a second CONNECT"),
        3 => Packet::Publish(read_publish(flags, r, v5, limits)?),
        4 => Packet::PubAck(read_ack(r, v5, PUBLISH_ACK_CODES)?),
        5 => Packet::PubRec(read_ack(r, v5, PUBLISH_ACK_CODES)?),
        6 => Packet::PubRel(read_ack(r, v5, RELEASE_CODES)?),
        7 => Packet::PubComp(read_ack(r, v5, RELEASE_CODES)?),
        8 => Packet::Subscribe(read_subscribe(r, v5)?),
        10 => Packet::Unsubscribe(read_unsubscribe(r, v5)?),
        12 => Packet::PingReq,
        14 => Packet::Disconnect(read_disconnect(r, v5)?),
        15 if v5 => Packet::Auth(read_auth(r)?),
        2 | 9 | 11 | 13 => return fault(ReasonCode::ProtocolError, "a packet only a server sends"),
        _ => return malformed("a reserved packet type"),
    };
    if !r.is_empty() {
        return malformed("bytes follow the end of the packet");
    }
    Ok(packet)
}

fn read_publish(flags: u8, r: &mut Reader, v5: bool, limits: &Limits) -> Result<Publish, Fault> {
    let dup = flags & 0x08 != 0;
    let retain = flags & 0x01 != 0;
    let Some(qos) = QoS::from_bits((flags >> 1) & 0x03) else {
        return malformed("the PUBLISH QoS is 3");
    };
    if dup && qos == QoS::AtMostOnce {
        return malformed("DUP is set on a QoS 0 PUBLISH");
    }
    let topic = r.string()?;
    if topic.contains(['+', '#']) {
        return fault(ReasonCode::TopicNameInvalid, "a topic name has a wildcard");
    }
    let packet_id = match qos {
        QoS::AtMostOnce => None,
        _ => Some(packet_id(r)?),
    };
    let mut p = if v5 {
        properties::read(r, Place::Publish)?
    } else {
        Properties::default()
    };
    match p.topic_alias {
        Some(alias) if alias == 0 || alias > limits.topic_alias_maximum => {
            return fault(
                ReasonCode::TopicAliasInvalid,
                "the topic alias is 0 or above the topic alias maximum",
            )
        }
        None if topic.is_empty() => {
            return if v5 {
                fault(
                    ReasonCode::ProtocolError,
                    "an empty topic name without a topic alias",
                )
            } else {
                malformed("a topic name is empty")
            };
        }
        _ => {}
    }
    Ok(Publish {
        dup,
        qos,
        retain,
        topic,
        packet_id,
        topic_alias: p.topic_alias,
        message: MessageProperties::take(&mut p),
        payload: r.rest(),
    })
}

/// The reason codes a client may put in a PUBACK or PUBREC (§3.4.2.1, §3.5.2.1).
const PUBLISH_ACK_CODES: &[u8] = &[0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99];
/// The reason codes of a PUBREL or PUBCOMP (§3.6.2.1, §3.7.2.1).
const RELEASE_CODES: &[u8] = &[0x00, 0x92];
/// The reason codes of a DISCONNECT (§3.14.2.1): a client may only send some, but reading
/// any of the table keeps what a client means.
const DISCONNECT_CODES: &[u8] = &[
    0x00, 0x04, 0x80, 0x81, 0x82, 0x83, 0x87, 0x89, 0x8B, 0x8D, 0x8E, 0x8F, 0x90, 0x93, 0x94, 0x95,
    0x96, 0x97, 0x98, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9E, 0x9F, 0xA0, 0xA1, 0xA2,
];
/// The reason codes of an AUTH (§3.15.2.1).
const AUTH_CODES: &[u8] = &[0x00, 0x18, 0x19];

/// A reason code byte, if it is one `allowed` lists.
fn reason(r: &mut Reader, allowed: &[u8]) -> Result<ReasonCode, Fault> {
    let byte = r.u8()?;
    match ReasonCode::from_u8(byte) {
        Some(code) if allowed.contains(&byte) => Ok(code),
        _ => malformed("a reason code this packet cannot have"),
    }
}

fn read_ack(r: &mut Reader, v5: bool, codes: &[u8]) -> Result<Ack, Fault> {
    let packet_id = packet_id(r)?;
    let mut ack = Ack {
        packet_id,
        reason: ReasonCode::Success,
        reason_string: None,
        user_properties: Vec::new(),
    };
    // 5.0: the reason code and the properties may each be left out (§3.4.2.1).
    if v5 && !r.is_empty() {
        ack.reason = reason(r, codes)?;
        if !r.is_empty() {
            let p = properties::read(r, Place::Ack)?;
            ack.reason_string = p.reason_string;
            ack.user_properties = p.user_properties;
        }
    }
    Ok(ack)
}

fn read_subscribe(r: &mut Reader, v5: bool) -> Result<Subscribe, Fault> {
    let packet_id = packet_id(r)?;
    let p = if v5 {
        properties::read(r, Place::Subscribe)?
    } else {
        Properties::default()
    };
    let mut filters = Vec::new();
    while !r.is_empty() {
        let filter = r.string()?;
        if filter.is_empty() {
            return malformed("a topic filter is empty");
        }
        let options = r.u8()?;
        let reserved = if v5 { 0xC0 } else { 0xFC };
        if options & reserved != 0 {
            return malformed("reserved subscription option bits are set");
        }
        let Some(qos) = QoS::from_bits(options & 0x03) else {
            return malformed("a subscription's maximum QoS is 3");
        };
        let no_local = options & 0x04 != 0;
        let retain_handling = match (options >> 4) & 0x03 {
            0 => RetainHandling::OnSubscribe,
            1 => RetainHandling::OnNewSubscription,
            2 => RetainHandling::Never,
            _ => return fault(ReasonCode::ProtocolError, "retain handling is 3"),
        };
        if no_local && filter.starts_with("$share/") {
            return fault(
                ReasonCode::ProtocolError,
                "no local is set on a shared subscription",
            );
        }
        filters.push(SubscribeFilter {
            filter,
            qos,
            no_local,
            retain_as_published: options & 0x08 != 0,
            retain_handling,
        });
    }
    if filters.is_empty() {
        return fault(
            ReasonCode::ProtocolError,
            "a SUBSCRIBE without a topic filter",
        );
    }
    Ok(Subscribe {
        packet_id,
        subscription_identifier: p.subscription_identifier,
        user_properties: p.user_properties,
        filters,
    })
}

fn read_unsubscribe(r: &mut Reader, v5: bool) -> Result<Unsubscribe, Fault> {
    let packet_id = packet_id(r)?;
    let p = if v5 {
        properties::read(r, Place::Unsubscribe)?
    } else {
        Properties::default()
    };
    let mut filters = Vec::new();
    while !r.is_empty() {
        let filter = r.string()?;
        if filter.is_empty() {
            return malformed("a topic filter is empty");
        }
        filters.push(filter);
    }
    if filters.is_empty() {
        return fault(
            ReasonCode::ProtocolError,
            "an UNSUBSCRIBE without a topic filter",
        );
    }
    Ok(Unsubscribe {
        packet_id,
        user_properties: p.user_properties,
        filters,
    })
}

fn read_disconnect(r: &mut Reader, v5: bool) -> Result<Disconnect, Fault> {
    let mut d = Disconnect {
        reason: ReasonCode::Success,
        session_expiry_interval: None,
        reason_string: None,
        user_properties: Vec::new(),
        server_reference: None,
    };
    if v5 && !r.is_empty() {
        d.reason = reason(r, DISCONNECT_CODES)?;
        if !r.is_empty() {
            let p = properties::read(r, Place::Disconnect)?;
            d.session_expiry_interval = p.session_expiry_interval;
            d.reason_string = p.reason_string;
            d.user_properties = p.user_properties;
            d.server_reference = p.server_reference;
        }
    }
    Ok(d)
}

fn read_auth(r: &mut Reader) -> Result<Auth, Fault> {
    let mut a = Auth {
        reason: ReasonCode::Success,
        authentication_method: None,
        authentication_data: None,
        reason_string: None,
        user_properties: Vec::new(),
    };
    if !r.is_empty() {
        a.reason = reason(r, AUTH_CODES)?;
        if !r.is_empty() {
            let p = properties::read(r, Place::Auth)?;
            a.authentication_method = p.authentication_method;
            a.authentication_data = p.authentication_data;
            a.reason_string = p.reason_string;
            a.user_properties = p.user_properties;
        }
    }
    Ok(a)
}
