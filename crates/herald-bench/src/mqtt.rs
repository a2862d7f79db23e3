//! The bench's side of MQTT 3.1.1 (OASIS, 2014): the five packets a publisher and a subscriber
//! send, and reading the ones a server sends back.
//!
//! Written by hand because it is the bench's hot path: one subscriber core reads hundreds of
//! thousands of PUBLISH packets a second, each parsed in place from the read buffer (a topic
//! and a payload slice, no allocation). A client crate brings its own event loop, buffers and
//! an owned packet per delivery, which is the cost [`crate::ws_client`] exists to avoid; the
//! bench needs none of its sessions, retries or keep-alive.
//!
//! What the bench asks of the server is plain: clean sessions, keep-alive 0 (none; a run is
//! bounded and both ends live on one host), QoS 0 or 1. Version 3.1.1 is what every server in
//! the comparison speaks (herald, Mosquitto), and its PUBLISH is the smallest.

use anyhow::{bail, Result};

/// The WebSocket subprotocol of MQTT over WebSocket (MQTT 3.1.1 §6).
pub const SUBPROTOCOL: &str = "mqtt";

const CONNECT: u8 = 0x10;
const CONNACK: u8 = 2;
const PUBLISH: u8 = 3;
const PUBACK: u8 = 4;
const SUBSCRIBE: u8 = 0x82;
const SUBACK: u8 = 9;

/// Appends the remaining length (a variable byte integer, 1–4 bytes).
fn put_remaining_length(mut n: usize, out: &mut Vec<u8>) {
    loop {
        let byte = (n % 128) as u8;
        n /= 128;
        if n == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

fn put_str(s: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(&(s.len() as u16).to_be_bytes());
    out.extend_from_slice(s);
}

/// CONNECT: protocol level 4 (3.1.1), clean session, keep-alive 0, no will, no credentials.
pub fn connect(client_id: &str, out: &mut Vec<u8>) {
    let id = client_id.as_bytes();
    out.push(CONNECT);
    put_remaining_length(10 + 2 + id.len(), out);
    put_str(b"MQTT", out);
    out.extend_from_slice(&[4, 0x02, 0, 0]);
    put_str(id, out);
}

/// SUBSCRIBE to one filter at `qos`.
pub fn subscribe(packet_id: u16, filter: &str, qos: u8, out: &mut Vec<u8>) {
    let f = filter.as_bytes();
    out.push(SUBSCRIBE);
    put_remaining_length(2 + 2 + f.len() + 1, out);
    out.extend_from_slice(&packet_id.to_be_bytes());
    put_str(f, out);
    out.push(qos);
}

/// PUBLISH `payload` on `topic`; `packet_id` is used (and needed) at QoS 1 only.
pub fn publish(topic: &str, qos: u8, packet_id: u16, payload: &[u8], out: &mut Vec<u8>) {
    let t = topic.as_bytes();
    let id_len = if qos > 0 { 2 } else { 0 };
    out.push(PUBLISH << 4 | qos << 1);
    put_remaining_length(2 + t.len() + id_len + payload.len(), out);
    put_str(t, out);
    if qos > 0 {
        out.extend_from_slice(&packet_id.to_be_bytes());
    }
    out.extend_from_slice(payload);
}

/// PUBACK: the subscriber's acknowledgement of a QoS 1 PUBLISH.
pub fn puback(packet_id: u16, out: &mut Vec<u8>) {
    out.extend_from_slice(&[PUBACK << 4, 2]);
    out.extend_from_slice(&packet_id.to_be_bytes());
}

/// A packet from the server, borrowed from the bytes it was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Packet<'a> {
    /// The CONNECT's answer: 0 accepted, anything else refused (3.1.1 §3.2.2.3).
    ConnAck(u8),
    Publish {
        topic: &'a [u8],
        /// Present at QoS 1 and 2: the PUBLISH awaits a PUBACK (PUBREC) with it.
        packet_id: Option<u16>,
        qos: u8,
        payload: &'a [u8],
    },
    PubAck(u16),
    /// The return code of each filter of a SUBSCRIBE: the QoS granted, or 0x80 refused.
    SubAck(&'a [u8]),
    /// Any other packet (PINGRESP, UNSUBACK, a 5.0 DISCONNECT …): its type.
    Other(u8),
}

/// Reads one packet from the front of `buf`: the packet and its length in bytes, or None when
/// `buf` holds only part of it. A packet longer than `max` bytes, or one that cannot be read,
/// is an error (the bench then closes the connection).
pub fn parse(buf: &[u8], max: usize) -> Result<Option<(Packet<'_>, usize)>> {
    let Some(&first) = buf.first() else {
        return Ok(None);
    };
    let mut len = 0usize;
    let mut at = 1;
    loop {
        let Some(&b) = buf.get(at) else {
            return Ok(None);
        };
        len |= ((b & 0x7F) as usize) << (7 * (at - 1));
        at += 1;
        if b & 0x80 == 0 {
            break;
        }
        if at > 4 {
            bail!("an MQTT remaining length longer than four bytes");
        }
    }
    if len > max {
        bail!("an MQTT packet of {len} bytes is over the bench's limit");
    }
    let Some(body) = buf.get(at..at + len) else {
        return Ok(None);
    };
    let kind = first >> 4;
    let packet = match kind {
        CONNACK if len >= 2 => Packet::ConnAck(body[1]),
        PUBLISH => {
            let qos = (first >> 1) & 3;
            let topic_len = u16::from_be_bytes(short(body, 0)?) as usize;
            let mut p = 2 + topic_len;
            let Some(topic) = body.get(2..p) else {
                bail!("an MQTT PUBLISH whose topic runs past the packet");
            };
            let packet_id = if qos > 0 {
                p += 2;
                Some(u16::from_be_bytes(short(body, p - 2)?))
            } else {
                None
            };
            Packet::Publish {
                topic,
                packet_id,
                qos,
                payload: &body[p.min(len)..],
            }
        }
        PUBACK => Packet::PubAck(u16::from_be_bytes(short(body, 0)?)),
        SUBACK if len >= 2 => Packet::SubAck(&body[2..]),
        CONNACK | SUBACK => bail!("an MQTT packet of type {kind} too short to read"),
        other => Packet::Other(other),
    };
    Ok(Some((packet, at + len)))
}

fn short(body: &[u8], at: usize) -> Result<[u8; 2]> {
    match body.get(at..at + 2) {
        Some(b) => Ok([b[0], b[1]]),
        None => bail!("an MQTT packet shorter than its fields"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_is_the_3_1_1_packet() {
        let mut out = vec![];
        connect("c1", &mut out);
        assert_eq!(
            out,
            [0x10, 14, 0, 4, b'M', b'Q', b'T', b'T', 4, 2, 0, 0, 0, 2, b'c', b'1']
        );
    }

    #[test]
    fn subscribe_and_puback_bytes() {
        let mut out = vec![];
        subscribe(7, "t/1", 1, &mut out);
        assert_eq!(out, [0x82, 8, 0, 7, 0, 3, b't', b'/', b'1', 1]);
        out.clear();
        puback(0x1234, &mut out);
        assert_eq!(out, [0x40, 2, 0x12, 0x34]);
    }

    #[test]
    fn a_publish_reads_back_at_both_qos_and_any_length() {
        for (qos, size) in [(0, 5), (1, 5), (0, 200), (1, 20_000), (0, 3_000_000)] {
            let payload = vec![b'x'; size];
            let mut out = vec![];
            publish("t/42", qos, 9, &payload, &mut out);
            let (p, n) = parse(&out, 1 << 24).unwrap().unwrap();
            assert_eq!(n, out.len());
            assert_eq!(
                p,
                Packet::Publish {
                    topic: b"t/42",
                    packet_id: (qos > 0).then_some(9),
                    qos,
                    payload: &payload,
                }
            );
            // Any prefix is incomplete, not an error.
            for cut in [0, 1, 2, out.len() / 2, out.len() - 1] {
                assert_eq!(parse(&out[..cut], 1 << 24).unwrap(), None, "cut {cut}");
            }
        }
    }

    #[test]
    fn server_packets() {
        assert_eq!(
            parse(&[0x20, 2, 0, 0], 100).unwrap(),
            Some((Packet::ConnAck(0), 4))
        );
        assert_eq!(
            parse(&[0x20, 2, 0, 5, 0xFF], 100).unwrap(),
            Some((Packet::ConnAck(5), 4))
        );
        assert_eq!(
            parse(&[0x90, 4, 0, 1, 0, 0x80], 100).unwrap(),
            Some((Packet::SubAck(&[0, 0x80]), 6))
        );
        assert_eq!(
            parse(&[0x40, 2, 1, 2], 100).unwrap(),
            Some((Packet::PubAck(0x0102), 4))
        );
        assert_eq!(
            parse(&[0xD0, 0], 100).unwrap(),
            Some((Packet::Other(13), 2))
        );
    }

    #[test]
    fn bad_packets_are_errors() {
        // Over the limit, a five-byte length, a topic past the end, a short PUBACK.
        assert!(parse(&[0x30, 101], 100).is_err());
        assert!(parse(&[0x30, 0x80, 0x80, 0x80, 0x80, 1], 1 << 30).is_err());
        assert!(parse(&[0x30, 3, 0, 9, b'a'], 100).is_err());
        assert!(parse(&[0x40, 1, 0], 100).is_err());
    }
}
