//! MQTT 5.0 properties (§2.2.2): a length, then identifier-value pairs.
//!
//! Reading checks what §2.2.2.2 and each packet's section require of what a client sends: an
//! identifier the specification does not define, or one not listed for the packet, is a
//! malformed packet; a property given twice, other than a user property or subscription
//! identifier, and a value out of its range are protocol errors.

use super::wire::{fault, malformed, put_binary, put_string, put_varint, Fault, Reader};
use super::ReasonCode;
use bytes::{BufMut, Bytes, BytesMut};

/// User properties, in the order they were given (a name may repeat: §3.1.2.11.8).
pub type UserProperties = Vec<(String, String)>;

/// The property identifiers (§2.2.2.2).
pub mod id {
    pub const PAYLOAD_FORMAT_INDICATOR: u8 = 0x01;
    pub const MESSAGE_EXPIRY_INTERVAL: u8 = 0x02;
    pub const CONTENT_TYPE: u8 = 0x03;
    pub const RESPONSE_TOPIC: u8 = 0x08;
    pub const CORRELATION_DATA: u8 = 0x09;
    pub const SUBSCRIPTION_IDENTIFIER: u8 = 0x0B;
    pub const SESSION_EXPIRY_INTERVAL: u8 = 0x11;
    pub const ASSIGNED_CLIENT_IDENTIFIER: u8 = 0x12;
    pub const SERVER_KEEP_ALIVE: u8 = 0x13;
    pub const AUTHENTICATION_METHOD: u8 = 0x15;
    pub const AUTHENTICATION_DATA: u8 = 0x16;
    pub const REQUEST_PROBLEM_INFORMATION: u8 = 0x17;
    pub const WILL_DELAY_INTERVAL: u8 = 0x18;
    pub const REQUEST_RESPONSE_INFORMATION: u8 = 0x19;
    pub const RESPONSE_INFORMATION: u8 = 0x1A;
    pub const SERVER_REFERENCE: u8 = 0x1C;
    pub const REASON_STRING: u8 = 0x1F;
    pub const RECEIVE_MAXIMUM: u8 = 0x21;
    pub const TOPIC_ALIAS_MAXIMUM: u8 = 0x22;
    pub const TOPIC_ALIAS: u8 = 0x23;
    pub const MAXIMUM_QOS: u8 = 0x24;
    pub const RETAIN_AVAILABLE: u8 = 0x25;
    pub const USER_PROPERTY: u8 = 0x26;
    pub const MAXIMUM_PACKET_SIZE: u8 = 0x27;
    pub const WILDCARD_SUBSCRIPTION_AVAILABLE: u8 = 0x28;
    pub const SUBSCRIPTION_IDENTIFIER_AVAILABLE: u8 = 0x29;
    pub const SHARED_SUBSCRIPTION_AVAILABLE: u8 = 0x2A;
}

/// Where a property list sits in what a client sends: each place allows its own properties.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    Connect,
    Will,
    Publish,
    /// PUBACK, PUBREC, PUBREL, PUBCOMP.
    Ack,
    Subscribe,
    Unsubscribe,
    Disconnect,
    Auth,
}

impl Place {
    /// Whether the specification lists property `id` for this place (client to server).
    fn allows(self, id: u8) -> bool {
        use id::*;
        id == USER_PROPERTY
            || match self {
                Place::Connect => matches!(
                    id,
                    SESSION_EXPIRY_INTERVAL
                        | AUTHENTICATION_METHOD
                        | AUTHENTICATION_DATA
                        | REQUEST_PROBLEM_INFORMATION
                        | REQUEST_RESPONSE_INFORMATION
                        | RECEIVE_MAXIMUM
                        | TOPIC_ALIAS_MAXIMUM
                        | MAXIMUM_PACKET_SIZE
                ),
                Place::Will => matches!(
                    id,
                    PAYLOAD_FORMAT_INDICATOR
                        | MESSAGE_EXPIRY_INTERVAL
                        | CONTENT_TYPE
                        | RESPONSE_TOPIC
                        | CORRELATION_DATA
                        | WILL_DELAY_INTERVAL
                ),
                Place::Publish => matches!(
                    id,
                    PAYLOAD_FORMAT_INDICATOR
                        | MESSAGE_EXPIRY_INTERVAL
                        | CONTENT_TYPE
                        | RESPONSE_TOPIC
                        | CORRELATION_DATA
                        | TOPIC_ALIAS
                ),
                Place::Ack => id == REASON_STRING,
                Place::Subscribe => id == SUBSCRIPTION_IDENTIFIER,
                Place::Unsubscribe => false,
                Place::Disconnect => {
                    matches!(
                        id,
                        SESSION_EXPIRY_INTERVAL | REASON_STRING | SERVER_REFERENCE
                    )
                }
                Place::Auth => matches!(
                    id,
                    AUTHENTICATION_METHOD | AUTHENTICATION_DATA | REASON_STRING
                ),
            }
    }
}

/// Every property a client may send, as read; each packet takes the ones its place allows
/// (the others are `None` or empty).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Properties {
    /// Payload format indicator: `true` for UTF-8 text (value 1).
    pub payload_utf8: Option<bool>,
    pub message_expiry_interval: Option<u32>,
    pub content_type: Option<String>,
    pub response_topic: Option<String>,
    pub correlation_data: Option<Bytes>,
    pub subscription_identifier: Option<u32>,
    pub session_expiry_interval: Option<u32>,
    pub authentication_method: Option<String>,
    pub authentication_data: Option<Bytes>,
    pub request_problem_information: Option<bool>,
    pub will_delay_interval: Option<u32>,
    pub request_response_information: Option<bool>,
    pub server_reference: Option<String>,
    pub reason_string: Option<String>,
    pub receive_maximum: Option<u16>,
    pub topic_alias_maximum: Option<u16>,
    pub topic_alias: Option<u16>,
    pub maximum_packet_size: Option<u32>,
    pub user_properties: UserProperties,
}

/// Stores `value` in `slot`, refusing a second one.
fn once<T>(slot: &mut Option<T>, value: T) -> Result<(), Fault> {
    if slot.is_some() {
        return fault(
            ReasonCode::ProtocolError,
            "a property that may appear once appears twice",
        );
    }
    *slot = Some(value);
    Ok(())
}

/// A byte that may only be 0 or 1.
fn flag(r: &mut Reader) -> Result<bool, Fault> {
    match r.u8()? {
        0 => Ok(false),
        1 => Ok(true),
        _ => fault(
            ReasonCode::ProtocolError,
            "a property that is 0 or 1 is neither",
        ),
    }
}

/// A topic name in a property (the response topic): no wildcards (§3.3.2.3.5).
fn topic_name(r: &mut Reader) -> Result<String, Fault> {
    let topic = r.string()?;
    if topic.is_empty() || topic.contains(['+', '#']) {
        return fault(
            ReasonCode::ProtocolError,
            "the response topic is empty or has a wildcard",
        );
    }
    Ok(topic)
}

/// Reads a property length and the properties it covers, as allowed at `place`.
pub fn read(r: &mut Reader, place: Place) -> Result<Properties, Fault> {
    use id::*;
    let len = r.varint()? as usize;
    let mut r = Reader::new(r.take(len)?);
    let mut p = Properties::default();
    while !r.is_empty() {
        let id = r.varint()?;
        let id = match u8::try_from(id) {
            Ok(id) if place.allows(id) => id,
            Ok(SUBSCRIPTION_IDENTIFIER) if place == Place::Publish => {
                // §3.3.4: a client's PUBLISH never carries one.
                return fault(
                    ReasonCode::ProtocolError,
                    "a PUBLISH from a client has a subscription identifier",
                );
            }
            _ => return malformed("a property is unknown or not allowed in this packet"),
        };
        match id {
            PAYLOAD_FORMAT_INDICATOR => once(&mut p.payload_utf8, flag(&mut r)?)?,
            MESSAGE_EXPIRY_INTERVAL => once(&mut p.message_expiry_interval, r.u32()?)?,
            CONTENT_TYPE => once(&mut p.content_type, r.string()?)?,
            RESPONSE_TOPIC => once(&mut p.response_topic, topic_name(&mut r)?)?,
            CORRELATION_DATA => once(&mut p.correlation_data, r.binary()?)?,
            SUBSCRIPTION_IDENTIFIER => {
                let value = r.varint()?;
                if value == 0 {
                    return fault(ReasonCode::ProtocolError, "a subscription identifier is 0");
                }
                once(&mut p.subscription_identifier, value)?
            }
            SESSION_EXPIRY_INTERVAL => once(&mut p.session_expiry_interval, r.u32()?)?,
            AUTHENTICATION_METHOD => once(&mut p.authentication_method, r.string()?)?,
            AUTHENTICATION_DATA => once(&mut p.authentication_data, r.binary()?)?,
            REQUEST_PROBLEM_INFORMATION => once(&mut p.request_problem_information, flag(&mut r)?)?,
            WILL_DELAY_INTERVAL => once(&mut p.will_delay_interval, r.u32()?)?,
            REQUEST_RESPONSE_INFORMATION => {
                once(&mut p.request_response_information, flag(&mut r)?)?
            }
            SERVER_REFERENCE => once(&mut p.server_reference, r.string()?)?,
            REASON_STRING => once(&mut p.reason_string, r.string()?)?,
            RECEIVE_MAXIMUM => {
                let value = r.u16()?;
                if value == 0 {
                    return fault(ReasonCode::ProtocolError, "the receive maximum is 0");
                }
                once(&mut p.receive_maximum, value)?
            }
            TOPIC_ALIAS_MAXIMUM => once(&mut p.topic_alias_maximum, r.u16()?)?,
            TOPIC_ALIAS => once(&mut p.topic_alias, r.u16()?)?,
            MAXIMUM_PACKET_SIZE => {
                let value = r.u32()?;
                if value == 0 {
                    return fault(ReasonCode::ProtocolError, "the maximum packet size is 0");
                }
                once(&mut p.maximum_packet_size, value)?
            }
            USER_PROPERTY => {
                let name = r.string()?;
                let value = r.string()?;
                p.user_properties.push((name, value));
            }
            _ => return malformed("a property is unknown or not allowed in this packet"),
        }
    }
    Ok(p)
}

/// Appends properties for the packets the server sends. Each `put_*` writes one property; the
/// caller writes the length of the whole list before it ([`finish`]).
pub struct Writer {
    out: BytesMut,
}

impl Default for Writer {
    fn default() -> Self {
        Writer::new()
    }
}

impl Writer {
    pub fn new() -> Writer {
        Writer {
            out: BytesMut::new(),
        }
    }

    pub fn u8(&mut self, id: u8, value: u8) -> &mut Self {
        self.out.put_u8(id);
        self.out.put_u8(value);
        self
    }

    pub fn u16(&mut self, id: u8, value: u16) -> &mut Self {
        self.out.put_u8(id);
        self.out.put_u16(value);
        self
    }

    pub fn u32(&mut self, id: u8, value: u32) -> &mut Self {
        self.out.put_u8(id);
        self.out.put_u32(value);
        self
    }

    pub fn varint(&mut self, id: u8, value: u32) -> &mut Self {
        self.out.put_u8(id);
        put_varint(&mut self.out, value as usize);
        self
    }

    pub fn string(&mut self, id: u8, value: &str) -> &mut Self {
        self.out.put_u8(id);
        put_string(&mut self.out, value);
        self
    }

    pub fn binary(&mut self, id: u8, value: &[u8]) -> &mut Self {
        self.out.put_u8(id);
        put_binary(&mut self.out, value);
        self
    }

    pub fn user_properties(&mut self, pairs: &[(String, String)]) -> &mut Self {
        for (name, value) in pairs {
            self.out.put_u8(id::USER_PROPERTY);
            put_string(&mut self.out, name);
            put_string(&mut self.out, value);
        }
        self
    }

    /// The properties without their length.
    pub fn bytes(&self) -> &[u8] {
        &self.out
    }

    pub fn is_empty(&self) -> bool {
        self.out.is_empty()
    }
}

/// Appends the property length, then the properties.
pub fn finish(out: &mut BytesMut, props: &Writer) {
    put_varint(out, props.out.len());
    out.put_slice(&props.out);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_at(bytes: &[u8], place: Place) -> Result<Properties, Fault> {
        let mut out = BytesMut::new();
        put_varint(&mut out, bytes.len());
        out.put_slice(bytes);
        let mut r = Reader::new(out.freeze());
        let p = read(&mut r, place)?;
        assert!(r.is_empty());
        Ok(p)
    }

    #[test]
    fn every_connect_property() {
        let mut w = Writer::new();
        w.u32(id::SESSION_EXPIRY_INTERVAL, 3600)
            .u16(id::RECEIVE_MAXIMUM, 20)
            .u32(id::MAXIMUM_PACKET_SIZE, 1 << 20)
            .u16(id::TOPIC_ALIAS_MAXIMUM, 10)
            .u8(id::REQUEST_RESPONSE_INFORMATION, 1)
            .u8(id::REQUEST_PROBLEM_INFORMATION, 0)
            .user_properties(&[("a".into(), "1".into()), ("a".into(), "2".into())])
            .string(id::AUTHENTICATION_METHOD, "SCRAM-SHA-1")
            .binary(id::AUTHENTICATION_DATA, b"\x00\x01");
        let p = read_at(w.bytes(), Place::Connect).unwrap();
        assert_eq!(p.session_expiry_interval, Some(3600));
        assert_eq!(p.receive_maximum, Some(20));
        assert_eq!(p.maximum_packet_size, Some(1 << 20));
        assert_eq!(p.topic_alias_maximum, Some(10));
        assert_eq!(p.request_response_information, Some(true));
        assert_eq!(p.request_problem_information, Some(false));
        assert_eq!(p.user_properties.len(), 2);
        assert_eq!(p.authentication_method.as_deref(), Some("SCRAM-SHA-1"));
        assert_eq!(p.authentication_data.as_deref(), Some(&b"\x00\x01"[..]));
    }

    #[test]
    fn faults() {
        let reason = |bytes: &[u8], place| read_at(bytes, place).unwrap_err().reason;
        use ReasonCode::{MalformedPacket as M, ProtocolError as P};
        // Twice.
        assert_eq!(reason(b"\x11\0\0\0\x01\x11\0\0\0\x02", Place::Connect), P);
        assert_eq!(reason(b"\x01\x01\x01\x00", Place::Publish), P);
        // Out of range.
        assert_eq!(reason(b"\x21\0\0", Place::Connect), P);
        assert_eq!(reason(b"\x27\0\0\0\0", Place::Connect), P);
        assert_eq!(reason(b"\x17\x02", Place::Connect), P);
        assert_eq!(reason(b"\x01\x02", Place::Will), P);
        assert_eq!(reason(b"\x0B\x00", Place::Subscribe), P);
        assert_eq!(reason(b"\x08\0\x03a/+", Place::Publish), P);
        // A client's PUBLISH with a subscription identifier.
        assert_eq!(reason(b"\x0B\x01", Place::Publish), P);
        // Unknown, or not for this packet.
        assert_eq!(reason(b"\x05\x00", Place::Publish), M);
        assert_eq!(reason(b"\x24\x01", Place::Connect), M);
        assert_eq!(reason(b"\x23\0\x01", Place::Will), M);
        assert_eq!(reason(b"\x18\0\0\0\x01", Place::Publish), M);
        assert_eq!(reason(b"\x11\0\0\0\x01", Place::Unsubscribe), M);
        // A property identifier of two bytes is none the specification defines.
        assert_eq!(reason(b"\x81\x01\x00", Place::Publish), M);
        // Cut short, or running past its length.
        assert_eq!(reason(b"\x02\0\0", Place::Publish), M);
        assert_eq!(reason(b"\x26\0\x01a", Place::Publish), M);
        let mut r = Reader::new(Bytes::from_static(b"\x05\x01\x01"));
        assert_eq!(read(&mut r, Place::Publish).unwrap_err().reason, M);
    }

    #[test]
    fn repeatable_ones_repeat() {
        let p = read_at(b"\x26\0\x01k\0\x01a\x26\0\x01k\0\x01b", Place::Ack).unwrap();
        assert_eq!(
            p.user_properties,
            vec![("k".into(), "a".into()), ("k".into(), "b".into())]
        );
        assert_eq!(
            read_at(b"", Place::Unsubscribe).unwrap(),
            Properties::default()
        );
    }
}
