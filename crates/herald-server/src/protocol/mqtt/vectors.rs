//! The decoder and encoders against packets real clients sent (captured from Debian's
//! `mosquitto_pub`/`mosquitto_sub` 2.0 and Python's paho-mqtt 2 against a listener on
//! 127.0.0.1, one packet per string, in hex), the specifications' rules, and each other.

use super::encode::{
    self, AckKind, ConnackProperties, Delivery, Prepared, ProblemInfo, TopicAlias,
};
use super::packet::*;
use super::{QoS, ReasonCode, Version};
use bytes::{Bytes, BytesMut};

const MOSQUITTO_V311_PUB_QOS1: &[&str] = &[
    "102d00044d51545404ee003c0006707562333131000677696c6c2f7400036279650004757365720006736563726574",
    "3314000c73656e736f72732f74656d70000132312e35",
    "e000",
];
const MOSQUITTO_V311_SUB: &[&str] = &[
    "101200044d5154540400003c0006737562333131",
    "82170001000973656e736f72732f230100062b2f74656d7001",
    "e000",
];
const MOSQUITTO_V5_PUB: &[&str] = &[
    "102d00044d5154540502003c1c1100000e1021001427000186a022000a260003617070000474657374000470756235",
    "3445000c73656e736f72732f74656d7000012f03000a746578742f706c61696e020000003c010108000a7265706c792f68657265090004303130322600016b00017668656c6c6f",
    "62020001",
    "e000",
];
const MOSQUITTO_V5_SUB: &[&str] = &[
    "101400044d5154540502003c03210014000473756235",
    "821c0001020b070005612f2b2f6302000c2473686172652f672f782f2302",
    "e00104",
];
const PAHO_V5: &[&str] = &[
    "105700044d51545405ee001e0711ffffffff170000057061686f351203000a746578742f706c61696e180000001e0014636c69656e74732f7061686f352f7374617475730004676f6e650005616c6963650006746f6b00656e",
    "822600010c0bffffff7f260001750001310005612f2b2f632d000c2473686172652f672f782f2310",
    "328d020005612f622f63000203230003000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f202122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3f404142434445464748494a4b4c4d4e4f505152535455565758595a5b5c5d5e5f606162636465666768696a6b6c6d6e6f707172737475767778797a7b7c7d7e7f808182838485868788898a8b8c8d8e8f909192939495969798999a9b9c9d9e9fa0a1a2a3a4a5a6a7a8a9aaabacadaeafb0b1b2b3b4b5b6b7b8b9babbbcbdbebfc0c1c2c3c4c5c6c7c8c9cacbcccdcecfd0d1d2d3d4d5d6d7d8d9dadbdcdddedfe0e1e2e3e4e5e6e7e8e9eaebecedeeeff0f1f2f3f4f5f6f7f8f9fafbfcfdfeff",
    "300b000003230003616761696e",
    "a2180004000005612f2b2f63000c2473686172652f672f782f23",
    "e00d040b11000000001f0003627965",
];
const PAHO_V311: &[&str] = &[
    "100c00044d5154540402003c0000",
    "82110001000c2473686172652f672f782f2302",
    "35070003612f620002",
    "62020002",
    "a20700030003782f23",
    "e000",
];

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

const LIMITS: Limits = Limits {
    maximum_packet_size: 1 << 20,
    topic_alias_maximum: 10,
};

/// Decodes every packet of a session given all at once.
fn decode_all(session: &[&str]) -> Vec<Packet> {
    let mut buf = BytesMut::new();
    for packet in session {
        buf.extend_from_slice(&hex(packet));
    }
    let mut decoder = Decoder::new(LIMITS);
    let mut packets = Vec::new();
    while let Some(p) = decoder.decode(&mut buf).unwrap() {
        packets.push(p);
    }
    assert!(buf.is_empty());
    packets
}

/// The one packet `bytes` is, after a CONNECT of `version`.
fn decode_after_connect(version: Version, bytes: &[u8]) -> Result<Option<Packet>, DecodeError> {
    let mut decoder = Decoder::new(LIMITS);
    let connect: &[u8] = match version {
        Version::V311 => b"\x10\x0c\x00\x04MQTT\x04\x02\x00\x3c\x00\x00",
        Version::V5 => b"\x10\x0d\x00\x04MQTT\x05\x02\x00\x3c\x00\x00\x00",
    };
    let mut buf = BytesMut::from(connect);
    assert!(matches!(
        decoder.decode(&mut buf),
        Ok(Some(Packet::Connect(_)))
    ));
    buf.extend_from_slice(bytes);
    decoder.decode(&mut buf)
}

fn refused(version: Version, bytes: &[u8]) -> DecodeError {
    decode_after_connect(version, bytes).expect_err(&format!("{bytes:02x?}"))
}

#[test]
fn mosquitto_311_connect_with_will_and_publish() {
    let packets = decode_all(MOSQUITTO_V311_PUB_QOS1);
    let Packet::Connect(c) = &packets[0] else {
        panic!()
    };
    assert_eq!(c.version, Version::V311);
    assert!(c.clean_start);
    assert_eq!(c.keep_alive, 60);
    assert_eq!(c.client_id, "pub311");
    assert_eq!(c.username.as_deref(), Some("user"));
    assert_eq!(c.password.as_deref(), Some(&b"secret"[..]));
    let will = c.will.as_ref().unwrap();
    assert_eq!(
        (will.topic.as_str(), &will.payload[..]),
        ("will/t", &b"bye"[..])
    );
    assert_eq!((will.qos, will.retain), (QoS::AtLeastOnce, true));
    assert_eq!(
        packets[1],
        Packet::Publish(Publish {
            dup: false,
            qos: QoS::AtLeastOnce,
            retain: true,
            topic: "sensors/temp".into(),
            packet_id: Some(1),
            topic_alias: None,
            message: MessageProperties::default(),
            payload: Bytes::from_static(b"21.5"),
        })
    );
    assert!(matches!(&packets[2], Packet::Disconnect(d) if d.reason == ReasonCode::Success));
}

#[test]
fn mosquitto_311_persistent_subscribe() {
    let packets = decode_all(MOSQUITTO_V311_SUB);
    let Packet::Connect(c) = &packets[0] else {
        panic!()
    };
    assert!(!c.clean_start);
    let Packet::Subscribe(s) = &packets[1] else {
        panic!()
    };
    assert_eq!(s.packet_id, 1);
    let filters: Vec<_> = s
        .filters
        .iter()
        .map(|f| (f.filter.as_str(), f.qos))
        .collect();
    assert_eq!(
        filters,
        [
            ("sensors/#", QoS::AtLeastOnce),
            ("+/temp", QoS::AtLeastOnce)
        ]
    );
}

#[test]
fn mosquitto_5_properties() {
    let packets = decode_all(MOSQUITTO_V5_PUB);
    let Packet::Connect(c) = &packets[0] else {
        panic!()
    };
    assert_eq!(c.version, Version::V5);
    assert_eq!(c.session_expiry_interval, 3600);
    assert_eq!(c.receive_maximum, 20);
    assert_eq!(c.maximum_packet_size, Some(100_000));
    assert_eq!(c.topic_alias_maximum, 10);
    assert_eq!(c.user_properties, [("app".into(), "test".into())]);
    assert!(c.request_problem_information);
    let Packet::Publish(p) = &packets[1] else {
        panic!()
    };
    assert_eq!((p.qos, p.packet_id), (QoS::ExactlyOnce, Some(1)));
    assert_eq!(
        p.message,
        MessageProperties {
            payload_utf8: true,
            message_expiry_interval: Some(60),
            content_type: Some("text/plain".into()),
            response_topic: Some("reply/here".into()),
            correlation_data: Some(Bytes::from_static(b"0102")),
            user_properties: vec![("k".into(), "v".into())],
        }
    );
    assert_eq!(&p.payload[..], b"hello");
    assert!(matches!(&packets[2], Packet::PubRel(a) if a.packet_id == 1));

    let packets = decode_all(MOSQUITTO_V5_SUB);
    let Packet::Subscribe(s) = &packets[1] else {
        panic!()
    };
    assert_eq!(s.subscription_identifier, Some(7));
    assert_eq!(s.filters[1].filter, "$share/g/x/#");
    assert!(
        matches!(&packets[2], Packet::Disconnect(d) if d.reason == ReasonCode::DisconnectWithWill)
    );
}

#[test]
fn paho_5_session() {
    let packets = decode_all(PAHO_V5);
    let Packet::Connect(c) = &packets[0] else {
        panic!()
    };
    assert_eq!(c.session_expiry_interval, u32::MAX);
    assert!(!c.request_problem_information);
    assert_eq!(c.password.as_deref(), Some(&b"tok\0en"[..]));
    let will = c.will.as_ref().unwrap();
    assert_eq!(will.delay_interval, 30);
    assert_eq!(will.message.content_type.as_deref(), Some("text/plain"));
    assert_eq!(will.topic, "clients/paho5/status");

    let Packet::Subscribe(s) = &packets[1] else {
        panic!()
    };
    assert_eq!(s.subscription_identifier, Some(268_435_455));
    assert_eq!(s.user_properties, [("u".into(), "1".into())]);
    let f = &s.filters[0];
    assert_eq!(
        (f.qos, f.no_local, f.retain_as_published),
        (QoS::AtLeastOnce, true, true)
    );
    assert_eq!(f.retain_handling, RetainHandling::Never);
    assert_eq!(
        s.filters[1].retain_handling,
        RetainHandling::OnNewSubscription
    );

    let Packet::Publish(p) = &packets[2] else {
        panic!()
    };
    assert_eq!((p.topic.as_str(), p.topic_alias), ("a/b/c", Some(3)));
    assert_eq!(p.payload, (0..=255).collect::<Vec<u8>>());
    let Packet::Publish(p) = &packets[3] else {
        panic!()
    };
    assert_eq!((p.topic.as_str(), p.topic_alias), ("", Some(3)));

    let Packet::Unsubscribe(u) = &packets[4] else {
        panic!()
    };
    assert_eq!(u.filters, ["a/+/c", "$share/g/x/#"]);
    let Packet::Disconnect(d) = &packets[5] else {
        panic!()
    };
    assert_eq!(d.reason, ReasonCode::DisconnectWithWill);
    assert_eq!(d.session_expiry_interval, Some(0));
    assert_eq!(d.reason_string.as_deref(), Some("bye"));
}

#[test]
fn paho_311_session() {
    let packets = decode_all(PAHO_V311);
    let Packet::Connect(c) = &packets[0] else {
        panic!()
    };
    assert_eq!(c.client_id, "");
    let Packet::Publish(p) = &packets[2] else {
        panic!()
    };
    assert_eq!(
        (p.qos, p.retain, p.payload.len()),
        (QoS::ExactlyOnce, true, 0)
    );
    assert!(matches!(&packets[3], Packet::PubRel(a) if a.packet_id == 2));
}

#[test]
fn any_split_gives_the_same_packets() {
    for session in [MOSQUITTO_V5_PUB, PAHO_V5, PAHO_V311, MOSQUITTO_V311_SUB] {
        let whole = decode_all(session);
        let bytes: Vec<u8> = session.iter().flat_map(|p| hex(p)).collect();
        for step in [1, 2, 3, 7, 64] {
            let mut decoder = Decoder::new(LIMITS);
            let mut buf = BytesMut::new();
            let mut packets = Vec::new();
            for chunk in bytes.chunks(step) {
                buf.extend_from_slice(chunk);
                while let Some(p) = decoder.decode(&mut buf).unwrap() {
                    packets.push(p);
                }
            }
            assert_eq!(packets, whole, "step {step}");
        }
    }
}

#[test]
fn connect_refusals() {
    let connect = |bytes: &[u8]| Decoder::new(LIMITS).decode(&mut BytesMut::from(bytes));
    // MQTT 3.1 ("MQIsdp", level 3) and an unknown level: CONNACK 0x01.
    for bytes in [
        &b"\x10\x0e\x00\x06MQIsdp\x03\x02\x00\x3c\x00\x00"[..],
        b"\x10\x0c\x00\x04MQTT\x06\x02\x00\x3c\x00\x00",
        b"\x10\x0c\x00\x04MQTT\x03\x02\x00\x3c\x00\x00",
    ] {
        let e = connect(bytes).unwrap_err();
        assert_eq!(e.reason, ReasonCode::UnsupportedProtocolVersion);
        assert_eq!(e.reply, Reply::Connack311(0x01));
    }
    let e = connect(b"\x10\x0c\x00\x04MQTX\x04\x02\x00\x3c\x00\x00").unwrap_err();
    assert_eq!(e.reply, Reply::Close);
    // 3.1.1: an empty client identifier with a persistent session is rejected with 0x02.
    let e = connect(b"\x10\x0c\x00\x04MQTT\x04\x00\x00\x3c\x00\x00").unwrap_err();
    assert_eq!(e.reply, Reply::Connack311(0x02));
    // 5.0 accepts it (the server assigns one).
    assert!(connect(b"\x10\x0d\x00\x04MQTT\x05\x00\x00\x3c\x00\x00\x00").is_ok());
    // Malformed CONNECTs: 3.1.1 closes, 5.0 answers with a CONNACK.
    for (v311, v5, reason) in [
        // Reserved flag.
        (
            &b"\x10\x0c\x00\x04MQTT\x04\x03\x00\x3c\x00\x00"[..],
            &b"\x10\x0d\x00\x04MQTT\x05\x03\x00\x3c\x00\x00\x00"[..],
            ReasonCode::MalformedPacket,
        ),
        // Will QoS without a will.
        (
            b"\x10\x0c\x00\x04MQTT\x04\x0a\x00\x3c\x00\x00",
            b"\x10\x0d\x00\x04MQTT\x05\x0a\x00\x3c\x00\x00\x00",
            ReasonCode::MalformedPacket,
        ),
        // Bytes after the end.
        (
            b"\x10\x0d\x00\x04MQTT\x04\x02\x00\x3c\x00\x00\x00",
            b"\x10\x0e\x00\x04MQTT\x05\x02\x00\x3c\x00\x00\x00\x00",
            ReasonCode::MalformedPacket,
        ),
        // A client identifier with U+0000.
        (
            b"\x10\x0d\x00\x04MQTT\x04\x02\x00\x3c\x00\x01\x00",
            b"\x10\x0e\x00\x04MQTT\x05\x02\x00\x3c\x00\x00\x01\x00",
            ReasonCode::MalformedPacket,
        ),
        // A will topic with a wildcard.
        (
            b"\x10\x13\x00\x04MQTT\x04\x06\x00\x3c\x00\x00\x00\x03a/#\x00\x00",
            b"\x10\x15\x00\x04MQTT\x05\x06\x00\x3c\x00\x00\x00\x00\x00\x03a/#\x00\x00",
            ReasonCode::TopicNameInvalid,
        ),
    ] {
        let e = connect(v311).unwrap_err();
        assert_eq!((e.reason, e.reply), (reason, Reply::Close), "{v311:02x?}");
        let e = connect(v5).unwrap_err();
        assert_eq!(
            (e.reason, e.reply),
            (reason, Reply::Connack5(reason)),
            "{v5:02x?}"
        );
    }
    // 3.1.1: a password without a user name; 5.0 allows it.
    assert!(connect(b"\x10\x0e\x00\x04MQTT\x04\x42\x00\x3c\x00\x00\x00\x00").is_err());
    assert!(connect(b"\x10\x0f\x00\x04MQTT\x05\x42\x00\x3c\x00\x00\x00\x00\x00").is_ok());
    // Authentication data without a method.
    let e = connect(b"\x10\x12\x00\x04MQTT\x05\x02\x00\x3c\x05\x16\x00\x02ab\x00\x00").unwrap_err();
    assert_eq!(e.reply, Reply::Connack5(ReasonCode::ProtocolError));
    // Anything before CONNECT, refused from its first byte.
    let e = connect(b"\xc0").unwrap_err();
    assert_eq!(
        (e.reason, e.reply),
        (ReasonCode::ProtocolError, Reply::Close)
    );
}

#[test]
fn packet_refusals_after_connect() {
    use ReasonCode::*;
    use Version::{V311, V5};
    for (version, bytes, reason) in [
        (
            V311,
            &b"\x10\x0c\x00\x04MQTT\x04\x02\x00\x3c\x00\x00"[..],
            ProtocolError,
        ),
        (V5, b"\x20\x02\x00\x00", ProtocolError),
        (V5, b"\x00\x00", MalformedPacket),
        (V311, b"\xf0\x00", MalformedPacket),
        (V5, b"\xf1\x00", MalformedPacket),
        // Reserved flags.
        (V311, b"\x60\x02\x00\x01", MalformedPacket),
        (V311, b"\x80\x06\x00\x01\x00\x01a\x00", MalformedPacket),
        (V5, b"\xa0\x05\x00\x01\x00\x00\x01", MalformedPacket),
        (V311, b"\xc1\x00", MalformedPacket),
        (V311, b"\x41\x02\x00\x01", MalformedPacket),
        // PUBLISH: QoS 3, DUP at QoS 0, wildcards, packet identifier 0, empty topic.
        (V311, b"\x36\x05\x00\x01a\x00\x01", MalformedPacket),
        (V311, b"\x38\x03\x00\x01a", MalformedPacket),
        (V311, b"\x30\x05\x00\x03a/+", TopicNameInvalid),
        (V5, b"\x30\x04\x00\x01#\x00", TopicNameInvalid),
        (V311, b"\x32\x05\x00\x01a\x00\x00", ProtocolError),
        (V311, b"\x30\x02\x00\x00", MalformedPacket),
        (V5, b"\x30\x03\x00\x00\x00", ProtocolError),
        // Topic alias 0 or above the maximum; a subscription identifier from a client.
        (V5, b"\x30\x07\x00\x01a\x03\x23\x00\x00", TopicAliasInvalid),
        (V5, b"\x30\x07\x00\x01a\x03\x23\x00\x0b", TopicAliasInvalid),
        (V5, b"\x30\x06\x00\x01a\x02\x0b\x01", ProtocolError),
        // A property twice; an unknown property; a topic name not UTF-8.
        (V5, b"\x30\x08\x00\x01a\x04\x01\x00\x01\x00", ProtocolError),
        (V5, b"\x30\x06\x00\x01a\x02\x7f\x00", MalformedPacket),
        (V311, b"\x30\x03\x00\x01\xff", MalformedPacket),
        // SUBSCRIBE: no filters, reserved option bits, QoS 3, retain handling 3, empty filter,
        // no local on a shared subscription.
        (V311, b"\x82\x02\x00\x01", ProtocolError),
        (V5, b"\x82\x03\x00\x01\x00", ProtocolError),
        (V311, b"\x82\x06\x00\x01\x00\x01a\x04", MalformedPacket),
        (V5, b"\x82\x07\x00\x01\x00\x00\x01a\xc0", MalformedPacket),
        (V5, b"\x82\x07\x00\x01\x00\x00\x01a\x03", MalformedPacket),
        (V5, b"\x82\x07\x00\x01\x00\x00\x01a\x30", ProtocolError),
        (V311, b"\x82\x05\x00\x01\x00\x00\x00", MalformedPacket),
        (
            V5,
            b"\x82\x10\x00\x01\x00\x00\x0a$share/g/a\x04",
            ProtocolError,
        ),
        (
            V5,
            b"\x82\x09\x00\x01\x02\x0b\x00\x00\x01a\x00",
            ProtocolError,
        ),
        (V311, b"\x82\x06\x00\x00\x00\x01a\x00", ProtocolError),
        // UNSUBSCRIBE without filters; packet identifier 0 in an acknowledgement.
        (V311, b"\xa2\x02\x00\x01", ProtocolError),
        (V311, b"\x40\x02\x00\x00", ProtocolError),
        // Lengths that do not add up.
        (V311, b"\x40\x03\x00\x01\x00", MalformedPacket),
        (V311, b"\x40\x01\x00", MalformedPacket),
        (V311, b"\xc0\x01\x00", MalformedPacket),
        (V311, b"\xe0\x01\x00", MalformedPacket),
        (V5, b"\x40\x04\x00\x01\x00\x05", MalformedPacket),
        // Reason codes a packet cannot have.
        (V5, b"\x40\x03\x00\x01\x81", MalformedPacket),
        (V5, b"\x62\x03\x00\x01\x10", MalformedPacket),
        (V5, b"\xe0\x01\x03", MalformedPacket),
        (V5, b"\xf0\x01\x01", MalformedPacket),
        // A remaining length of five bytes, and one not in its shortest form (5.0).
        (V311, b"\x30\xff\xff\xff\xff\x01", MalformedPacket),
        (V5, b"\xc0\x80\x00", MalformedPacket),
    ] {
        let e = refused(version, bytes);
        assert_eq!(e.reason, reason, "{version:?} {bytes:02x?}: {e}");
        let reply = match version {
            V311 => Reply::Close,
            V5 => Reply::Disconnect5(reason),
        };
        assert_eq!(e.reply, reply, "{bytes:02x?}");
    }
    // 3.1.1 tolerates a remaining length not in its shortest form.
    assert!(matches!(
        decode_after_connect(V311, b"\xc0\x80\x00"),
        Ok(Some(Packet::PingReq))
    ));
}

#[test]
fn the_maximum_packet_size_is_enforced_from_the_fixed_header() {
    let mut decoder = Decoder::new(Limits {
        maximum_packet_size: 64,
        topic_alias_maximum: 0,
    });
    let mut buf = BytesMut::from(&b"\x10\x0d\x00\x04MQTT\x05\x02\x00\x3c\x00\x00\x00"[..]);
    decoder.decode(&mut buf).unwrap();
    // 2 + 62 bytes fit; 2 + 63 do not, refused before the body arrives.
    buf.extend_from_slice(b"\x30\x3e\x00\x01a\x00");
    assert_eq!(decoder.decode(&mut buf), Ok(None));
    buf.extend_from_slice(&[0; 58]);
    assert!(matches!(
        decoder.decode(&mut buf),
        Ok(Some(Packet::Publish(_)))
    ));
    buf.extend_from_slice(b"\x30\x3f");
    let e = decoder.decode(&mut buf).unwrap_err();
    assert_eq!(e.reply, Reply::Disconnect5(ReasonCode::PacketTooLarge));
    // A topic alias when the server allows none.
    buf.clear();
    buf.extend_from_slice(b"\x30\x07\x00\x01a\x03\x23\x00\x01");
    let mut decoder = Decoder::new(Limits {
        maximum_packet_size: 64,
        topic_alias_maximum: 0,
    });
    let mut connect = BytesMut::from(&b"\x10\x0d\x00\x04MQTT\x05\x02\x00\x3c\x00\x00\x00"[..]);
    decoder.decode(&mut connect).unwrap();
    let e = decoder.decode(&mut buf).unwrap_err();
    assert_eq!(e.reason, ReasonCode::TopicAliasInvalid);
    let mut decoder = Decoder::new(Limits {
        maximum_packet_size: 10,
        topic_alias_maximum: 0,
    });
    let e = decoder
        .decode(&mut BytesMut::from(&b"\x10\x7f"[..]))
        .unwrap_err();
    assert_eq!(
        (e.reason, e.reply),
        (ReasonCode::PacketTooLarge, Reply::Close)
    );
}

#[test]
fn short_forms_and_auth() {
    use Version::V5;
    let ack = |bytes: &[u8]| match decode_after_connect(V5, bytes).unwrap().unwrap() {
        Packet::PubAck(a) | Packet::PubRec(a) | Packet::PubRel(a) | Packet::PubComp(a) => a,
        p => panic!("{p:?}"),
    };
    assert_eq!(ack(b"\x40\x02\x00\x07").reason, ReasonCode::Success);
    assert_eq!(
        ack(b"\x50\x03\x00\x07\x10").reason,
        ReasonCode::NoMatchingSubscribers
    );
    let a = ack(b"\x70\x09\x00\x07\x92\x05\x1f\x00\x02no");
    assert_eq!(
        (a.reason, a.reason_string.as_deref()),
        (ReasonCode::PacketIdentifierNotFound, Some("no"))
    );
    let auth = |bytes: &[u8]| match decode_after_connect(V5, bytes).unwrap().unwrap() {
        Packet::Auth(a) => a,
        p => panic!("{p:?}"),
    };
    assert_eq!(auth(b"\xf0\x00").reason, ReasonCode::Success);
    let a = auth(b"\xf0\x0b\x18\x09\x15\x00\x02m1\x16\x00\x01x");
    assert_eq!(a.reason, ReasonCode::ContinueAuthentication);
    assert_eq!(a.authentication_method.as_deref(), Some("m1"));
    assert!(matches!(
        decode_after_connect(V5, b"\xe0\x00").unwrap().unwrap(),
        Packet::Disconnect(d) if d.reason == ReasonCode::Success
    ));
}

#[test]
fn server_packets_from_the_specification() {
    use Version::{V311, V5};
    let none = ConnackProperties::default();
    assert_eq!(
        &encode::connack(V311, false, ReasonCode::Success, &none)[..],
        b"\x20\x02\x00\x00"
    );
    assert_eq!(
        &encode::connack(V311, true, ReasonCode::NotAuthorized, &none)[..],
        b"\x20\x02\x01\x05"
    );
    assert_eq!(
        &encode::connack(V311, false, ReasonCode::UnsupportedProtocolVersion, &none)[..],
        b"\x20\x02\x00\x01"
    );
    assert_eq!(
        &encode::connack(V5, false, ReasonCode::Success, &none)[..],
        b"\x20\x03\x00\x00\x00"
    );
    let props = ConnackProperties {
        receive_maximum: Some(100),
        maximum_qos: Some(1),
        retain_available: Some(true),
        assigned_client_identifier: Some("herald-1".into()),
        topic_alias_maximum: Some(16),
        shared_subscription_available: Some(true),
        server_keep_alive: Some(30),
        ..Default::default()
    };
    assert_eq!(
        &encode::connack(V5, true, ReasonCode::Success, &props)[..],
        b"\x20\x1d\x01\x00\x1a\x21\x00\x64\x24\x01\x25\x01\x12\x00\x08herald-1\x22\x00\x10\x2a\x01\x13\x00\x1e"
    );
    let info = ProblemInfo::default();
    assert_eq!(
        &encode::ack(V311, AckKind::PubAck, 7, ReasonCode::Success, info)[..],
        b"\x40\x02\x00\x07"
    );
    assert_eq!(
        &encode::ack(V5, AckKind::PubRel, 7, ReasonCode::Success, info)[..],
        b"\x62\x02\x00\x07"
    );
    assert_eq!(
        &encode::ack(V5, AckKind::PubRec, 7, ReasonCode::NotAuthorized, info)[..],
        b"\x50\x03\x00\x07\x87"
    );
    let said = ProblemInfo {
        reason_string: Some("no"),
        user_properties: &[],
    };
    assert_eq!(
        &encode::ack(V5, AckKind::PubComp, 7, ReasonCode::Success, said)[..],
        b"\x70\x09\x00\x07\x00\x05\x1f\x00\x02no"
    );
    let codes = [
        ReasonCode::GrantedQoS1,
        ReasonCode::Success,
        ReasonCode::TopicFilterInvalid,
    ];
    assert_eq!(
        &encode::suback(V311, 1, &codes, info)[..],
        b"\x90\x05\x00\x01\x01\x00\x80"
    );
    assert_eq!(
        &encode::suback(V5, 1, &codes, info)[..],
        b"\x90\x06\x00\x01\x00\x01\x00\x8f"
    );
    assert_eq!(
        &encode::unsuback(V311, 9, &[ReasonCode::Success], info)[..],
        b"\xb0\x02\x00\x09"
    );
    assert_eq!(
        &encode::unsuback(
            V5,
            9,
            &[ReasonCode::Success, ReasonCode::NoSubscriptionExisted],
            info
        )[..],
        b"\xb0\x05\x00\x09\x00\x00\x11"
    );
    assert_eq!(&encode::pingresp()[..], b"\xd0\x00");
    assert_eq!(
        &encode::disconnect(ReasonCode::Success, info, None)[..],
        b"\xe0\x00"
    );
    assert_eq!(
        &encode::disconnect(ReasonCode::KeepAliveTimeout, info, None)[..],
        b"\xe0\x01\x8d"
    );
    assert_eq!(
        &encode::disconnect(ReasonCode::UseAnotherServer, info, Some("b:1883"))[..],
        b"\xe0\x0b\x9c\x09\x1c\x00\x06b:1883"
    );
}

/// A server PUBLISH has a client PUBLISH's layout, so the decoder reads back what
/// [`Prepared`] writes (subscription identifiers aside, which a client may not send).
fn round_trip(version: Version, publish: &Publish, delivery: &Delivery) -> Publish {
    let prepared = Prepared::new(
        version,
        &publish.topic,
        &publish.message,
        publish.payload.clone(),
    );
    let head = prepared.head(delivery).unwrap();
    let body = prepared.body();
    assert_eq!(
        body.as_ptr(),
        publish.payload.as_ptr(),
        "the payload is shared, not copied"
    );
    let mut bytes = head.to_vec();
    bytes.extend_from_slice(&body);
    match decode_after_connect(version, &bytes).unwrap().unwrap() {
        Packet::Publish(p) => p,
        p => panic!("{p:?}"),
    }
}

#[test]
fn prepared_publishes_decode_back() {
    for session in [
        PAHO_V5,
        MOSQUITTO_V5_PUB,
        PAHO_V311,
        MOSQUITTO_V311_PUB_QOS1,
    ] {
        let version = if session == PAHO_V5 || session == MOSQUITTO_V5_PUB {
            Version::V5
        } else {
            Version::V311
        };
        for packet in decode_all(session) {
            let Packet::Publish(publish) = packet else {
                continue;
            };
            if publish.topic.is_empty() {
                continue;
            }
            for (qos, alias) in [
                (QoS::AtMostOnce, TopicAlias::None),
                (QoS::AtLeastOnce, TopicAlias::Set(2)),
                (QoS::ExactlyOnce, TopicAlias::Use(2)),
            ] {
                let d = Delivery {
                    qos,
                    packet_id: 513,
                    dup: qos != QoS::AtMostOnce,
                    retain: publish.retain,
                    topic_alias: alias,
                    subscription_identifiers: &[],
                    message_expiry_interval: publish.message.message_expiry_interval,
                };
                let back = round_trip(version, &publish, &d);
                let v5 = version == Version::V5;
                let want_alias = match alias {
                    TopicAlias::Set(a) | TopicAlias::Use(a) if v5 => Some(a),
                    _ => None,
                };
                assert_eq!(back.topic_alias, want_alias);
                let want_topic = if v5 && matches!(alias, TopicAlias::Use(_)) {
                    ""
                } else {
                    &publish.topic
                };
                assert_eq!(back.topic, want_topic);
                assert_eq!((back.qos, back.dup, back.retain), (qos, d.dup, d.retain));
                assert_eq!(back.packet_id, (qos != QoS::AtMostOnce).then_some(513));
                assert_eq!(back.message, publish.message);
                assert_eq!(back.payload, publish.payload);
            }
        }
    }
}

#[test]
fn subscription_identifiers_and_expiry_in_the_head() {
    let message = MessageProperties {
        content_type: Some("ct".into()),
        ..Default::default()
    };
    let prepared = Prepared::new(Version::V5, "a/b", &message, Bytes::from_static(b"xy"));
    let shared = Delivery::default();
    assert!(shared.is_shared());
    assert_eq!(
        &prepared.head(&shared).unwrap()[..],
        b"\x30\x0d\x00\x03a/b\x05\x03\x00\x02ct"
    );
    let d = Delivery {
        subscription_identifiers: &[1, 200],
        message_expiry_interval: Some(9),
        ..Default::default()
    };
    assert!(!d.is_shared());
    assert_eq!(
        &prepared.head(&d).unwrap()[..],
        b"\x30\x17\x00\x03a/b\x0f\x02\x00\x00\x00\x09\x0b\x01\x0b\xc8\x01\x03\x00\x02ct"
    );
    // 3.1.1 has no properties.
    let prepared = Prepared::new(Version::V311, "a/b", &message, Bytes::from_static(b"xy"));
    let d = Delivery {
        qos: QoS::AtLeastOnce,
        packet_id: 1,
        retain: true,
        ..d
    };
    assert_eq!(
        &prepared.head(&d).unwrap()[..],
        b"\x33\x09\x00\x03a/b\x00\x01"
    );
}

/// Bytes from a fixed-seed generator, in random pieces, after each kind of CONNECT: the
/// decoder answers every time, and never panics. (The `mqtt` fuzz target does this without end.)
#[test]
fn random_bytes_never_panic() {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let prefixes: [&[u8]; 3] = [
        b"",
        b"\x10\x0c\x00\x04MQTT\x04\x02\x00\x3c\x00\x00",
        b"\x10\x0d\x00\x04MQTT\x05\x02\x00\x3c\x00\x00\x00",
    ];
    for round in 0..20_000 {
        let mut decoder = Decoder::new(LIMITS);
        let mut buf = BytesMut::from(prefixes[round % 3]);
        let len = (next() % 64) as usize;
        let mut bytes: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        // Often a plausible first byte and a small length, to get past the fixed header.
        if len > 2 && next() % 2 == 0 {
            bytes[1] = (len - 2) as u8;
        }
        buf.extend_from_slice(&bytes);
        while let Ok(Some(_)) = decoder.decode(&mut buf) {}
    }
}
