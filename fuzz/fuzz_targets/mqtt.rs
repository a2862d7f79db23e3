//! Arbitrary bytes to the MQTT decoder, in arbitrary pieces, before any CONNECT and after a
//! 3.1.1 or a 5.0 one. Nothing may panic; the pieces a packet arrives in never change what is
//! decoded; every PUBLISH read is written back by the fan-out encoder and read again the same;
//! every topic and filter goes through the herald mapping, whose names round-trip.
#![no_main]

use bytes::BytesMut;
use herald_server::protocol::mqtt::encode::{Delivery, Prepared};
use herald_server::protocol::mqtt::packet::{Decoder, Limits, Packet, Publish};
use herald_server::protocol::mqtt::topic::{
    parse_subscription, to_herald_patterns, to_herald_topic, to_mqtt_topic,
};
use libfuzzer_sys::fuzz_target;

const CONNECTS: [&[u8]; 3] = [
    b"",
    b"\x10\x0c\x00\x04MQTT\x04\x02\x00\x3c\x00\x00",
    b"\x10\x0d\x00\x04MQTT\x05\x02\x00\x3c\x00\x00\x00",
];

/// Every packet of `bytes`, given `step` bytes at a time, and the error that ends them.
fn decode(limits: Limits, connect: &[u8], bytes: &[u8], step: usize) -> (Vec<Packet>, String) {
    let mut decoder = Decoder::new(limits);
    let mut buf = BytesMut::from(connect);
    let mut packets = Vec::new();
    for chunk in bytes.chunks(step) {
        buf.extend_from_slice(chunk);
        loop {
            match decoder.decode(&mut buf) {
                Ok(Some(packet)) => packets.push(packet),
                Ok(None) => break,
                Err(e) => return (packets, e.to_string()),
            }
        }
    }
    (packets, String::new())
}

fuzz_target!(|data: &[u8]| {
    let [flags, step, bytes @ ..] = data else { return };
    let connect = CONNECTS[usize::from(flags % 3)];
    let limits = Limits {
        maximum_packet_size: if flags & 4 == 0 { 1 << 16 } else { 40 },
        topic_alias_maximum: u16::from(flags >> 4),
    };
    let (packets, end) = decode(limits, connect, bytes, bytes.len().max(1));
    let (pieces, pieces_end) = decode(limits, connect, bytes, usize::from(*step).max(1));
    assert_eq!(packets, pieces);
    assert_eq!(end, pieces_end);
    let mut decoder = Decoder::new(Limits { maximum_packet_size: u32::MAX, ..limits });
    decoder.decode(&mut BytesMut::from(connect)).ok();
    for packet in &packets {
        match packet {
            Packet::Publish(p) => {
                if let Ok(topic) = to_herald_topic(&p.topic) {
                    assert_eq!(to_mqtt_topic(&topic).as_deref(), Some(p.topic.as_str()));
                }
                let Some(version) = decoder.version() else { continue };
                let prepared = Prepared::new(version, &p.topic, &p.message, p.payload.clone());
                let d = Delivery {
                    qos: p.qos,
                    packet_id: p.packet_id.unwrap_or(0),
                    dup: p.dup,
                    retain: p.retain,
                    message_expiry_interval: p.message.message_expiry_interval,
                    ..Default::default()
                };
                let mut buf = BytesMut::from(&prepared.head(&d).unwrap()[..]);
                buf.extend_from_slice(&prepared.body());
                match decoder.decode(&mut buf) {
                    Ok(Some(Packet::Publish(back))) => {
                        assert_eq!(back, Publish { topic_alias: None, ..p.clone() })
                    }
                    // Only an empty topic (an alias's) cannot be sent without its alias.
                    other => assert!(p.topic.is_empty(), "{other:?}"),
                }
            }
            Packet::Subscribe(s) => {
                for f in &s.filters {
                    if let Ok(sub) = parse_subscription(&f.filter) {
                        let _ = to_herald_patterns(sub.filter);
                    }
                }
            }
            _ => {}
        }
    }
});
