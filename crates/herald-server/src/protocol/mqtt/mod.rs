//! MQTT 3.1.1 and 5.0: the packet codec, the mapping between MQTT topic names and filters
//! and herald's topics and patterns, and the MQTT session on herald's protocol seam. All but
//! [`session`], [`codec`], [`sessions`] and [`persist`] are pure: no sockets, no sessions, no
//! clock.
//!
//! The codec is written by hand because it is on herald's core path: one PUBLISH encoding
//! (a head and the shared payload) serves every subscriber of a version, and the server must
//! check each packet strictly and answer with the exact reason code, which general-purpose MQTT
//! crates do not offer together.
//!
//! - [`wire`]: the data types every packet is made of (integers, strings, binary data).
//! - [`properties`]: MQTT 5.0 properties, which may appear in which packet, and how often.
//! - [`packet`]: the packets a client sends, and the streaming [`packet::Decoder`].
//! - [`encode`]: what the server sends, with [`encode::Prepared`] for PUBLISH fan-out.
//! - [`extras`]: a message's 5.0 properties as herald carries them, and back.
//! - [`topic`]: MQTT names and filters to herald topics and patterns, and MQTT's own matching.
//! - [`retained`]: the retained messages of a node.
//! - [`delivery`]: what a session tracks of its deliveries: QoS 1 messages in flight under the
//!   client's receive maximum, losses to announce, positions delivered.
//! - [`codec`]: one connection's encoding of what herald sends it.
//! - [`sessions`]: the node's sessions by client identifier, and what a kept session holds.
//! - [`persist`]: sessions that outlive their connection: parked, resumed, taken over, expired.
//! - [`session`]: an MQTT connection as a [`crate::session::Protocol`].

pub mod codec;
pub mod delivery;
pub mod encode;
pub mod extras;
pub mod packet;
pub mod persist;
pub mod properties;
pub mod retained;
pub mod session;
pub mod sessions;
pub mod topic;
pub mod wire;

#[cfg(test)]
mod vectors;

/// The protocol version a connection speaks, from the protocol level byte of its CONNECT.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Version {
    /// MQTT 3.1.1, protocol level 4.
    V311,
    /// MQTT 5.0, protocol level 5.
    V5,
}

impl Version {
    /// The protocol level byte of CONNECT.
    pub fn level(self) -> u8 {
        match self {
            Version::V311 => 4,
            Version::V5 => 5,
        }
    }
}

/// A quality of service level.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum QoS {
    #[default]
    AtMostOnce = 0,
    AtLeastOnce = 1,
    ExactlyOnce = 2,
}

impl QoS {
    /// The level for the two-bit value of a header or option byte; 3 is no level.
    pub fn from_bits(bits: u8) -> Option<QoS> {
        match bits {
            0 => Some(QoS::AtMostOnce),
            1 => Some(QoS::AtLeastOnce),
            2 => Some(QoS::ExactlyOnce),
            _ => None,
        }
    }
}

/// The MQTT 5.0 reason codes (§2.4). One value has several names in the specification
/// (0x00 is Success, Normal disconnection and Granted QoS 0): the variant is named after the
/// first. MQTT 3.1.1 has no reason codes; its errors carry one too, for logs and metrics, and
/// [`packet::Reply`] says what a 3.1.1 client is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ReasonCode {
    /// Success, Normal disconnection, Granted QoS 0.
    Success = 0x00,
    GrantedQoS1 = 0x01,
    GrantedQoS2 = 0x02,
    DisconnectWithWill = 0x04,
    NoMatchingSubscribers = 0x10,
    NoSubscriptionExisted = 0x11,
    ContinueAuthentication = 0x18,
    ReAuthenticate = 0x19,
    UnspecifiedError = 0x80,
    MalformedPacket = 0x81,
    ProtocolError = 0x82,
    ImplementationSpecificError = 0x83,
    UnsupportedProtocolVersion = 0x84,
    ClientIdentifierNotValid = 0x85,
    BadUserNameOrPassword = 0x86,
    NotAuthorized = 0x87,
    ServerUnavailable = 0x88,
    ServerBusy = 0x89,
    Banned = 0x8A,
    ServerShuttingDown = 0x8B,
    BadAuthenticationMethod = 0x8C,
    KeepAliveTimeout = 0x8D,
    SessionTakenOver = 0x8E,
    TopicFilterInvalid = 0x8F,
    TopicNameInvalid = 0x90,
    PacketIdentifierInUse = 0x91,
    PacketIdentifierNotFound = 0x92,
    ReceiveMaximumExceeded = 0x93,
    TopicAliasInvalid = 0x94,
    PacketTooLarge = 0x95,
    MessageRateTooHigh = 0x96,
    QuotaExceeded = 0x97,
    AdministrativeAction = 0x98,
    PayloadFormatInvalid = 0x99,
    RetainNotSupported = 0x9A,
    QoSNotSupported = 0x9B,
    UseAnotherServer = 0x9C,
    ServerMoved = 0x9D,
    SharedSubscriptionsNotSupported = 0x9E,
    ConnectionRateExceeded = 0x9F,
    MaximumConnectTime = 0xA0,
    SubscriptionIdentifiersNotSupported = 0xA1,
    WildcardSubscriptionsNotSupported = 0xA2,
}

impl ReasonCode {
    /// The reason code with this value, if the specification defines one.
    pub fn from_u8(value: u8) -> Option<ReasonCode> {
        use ReasonCode::*;
        Some(match value {
            0x00 => Success,
            0x01 => GrantedQoS1,
            0x02 => GrantedQoS2,
            0x04 => DisconnectWithWill,
            0x10 => NoMatchingSubscribers,
            0x11 => NoSubscriptionExisted,
            0x18 => ContinueAuthentication,
            0x19 => ReAuthenticate,
            0x80 => UnspecifiedError,
            0x81 => MalformedPacket,
            0x82 => ProtocolError,
            0x83 => ImplementationSpecificError,
            0x84 => UnsupportedProtocolVersion,
            0x85 => ClientIdentifierNotValid,
            0x86 => BadUserNameOrPassword,
            0x87 => NotAuthorized,
            0x88 => ServerUnavailable,
            0x89 => ServerBusy,
            0x8A => Banned,
            0x8B => ServerShuttingDown,
            0x8C => BadAuthenticationMethod,
            0x8D => KeepAliveTimeout,
            0x8E => SessionTakenOver,
            0x8F => TopicFilterInvalid,
            0x90 => TopicNameInvalid,
            0x91 => PacketIdentifierInUse,
            0x92 => PacketIdentifierNotFound,
            0x93 => ReceiveMaximumExceeded,
            0x94 => TopicAliasInvalid,
            0x95 => PacketTooLarge,
            0x96 => MessageRateTooHigh,
            0x97 => QuotaExceeded,
            0x98 => AdministrativeAction,
            0x99 => PayloadFormatInvalid,
            0x9A => RetainNotSupported,
            0x9B => QoSNotSupported,
            0x9C => UseAnotherServer,
            0x9D => ServerMoved,
            0x9E => SharedSubscriptionsNotSupported,
            0x9F => ConnectionRateExceeded,
            0xA0 => MaximumConnectTime,
            0xA1 => SubscriptionIdentifiersNotSupported,
            0xA2 => WildcardSubscriptionsNotSupported,
            _ => return None,
        })
    }

    /// Whether the value is at least 0x80, the specification's line between success and error.
    pub fn is_error(self) -> bool {
        self as u8 >= 0x80
    }
}
