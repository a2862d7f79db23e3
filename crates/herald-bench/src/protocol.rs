//! Which protocol the bench's clients speak, and all that changes with it: where they connect,
//! what they send to open a session, subscribe and publish, and how what the server sends back
//! is read. Everything else (pacing, topics, the payload's send time, the clock, histograms,
//! integrity) is the same for every protocol, so their latencies compare.
//!
//! * `native`: herald's own protocol on `/ws` ([`crate::wire`]).
//! * `mqtt`: MQTT 3.1.1 ([`crate::mqtt`]) on herald's `/mqtt` (subprotocol `mqtt`), on any MQTT
//!   server over WebSocket (Mosquitto), or over plain TCP with an `mqtt://host:port` URL.
//! * `stomp`: STOMP 1.2 ([`crate::stomp`]) on herald's `/stomp` (subprotocol `v12.stomp`), or
//!   over plain TCP with `stomp://host:port`.
//!
//! herald numbers each topic's messages and says so in native deliveries (`seq`) and STOMP
//! MESSAGE frames (`seq` header); MQTT has no place for it, so over MQTT a subscriber checks
//! loss and order by the publisher's own numbering in the payload
//! ([`crate::wire::numbered_payload`]), which MQTT orders per publisher and topic.

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::wire::{self, Delivery, Incoming};
use crate::ws_client::Framing;
use crate::{mqtt, stomp};

/// A client protocol.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    #[default]
    Native,
    Mqtt,
    Stomp,
}

impl Protocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Native => "native",
            Protocol::Mqtt => "mqtt",
            Protocol::Stomp => "stomp",
        }
    }

    /// herald's WebSocket endpoint for the protocol.
    fn path(self) -> &'static str {
        match self {
            Protocol::Native => "/ws",
            Protocol::Mqtt => "/mqtt",
            Protocol::Stomp => "/stomp",
        }
    }

    /// The WebSocket subprotocol a client asks for.
    pub fn subprotocol(self) -> Option<&'static str> {
        match self {
            Protocol::Native => None,
            Protocol::Mqtt => Some(mqtt::SUBPROTOCOL),
            Protocol::Stomp => Some(stomp::SUBPROTOCOL),
        }
    }

    /// The URL scheme of the protocol over plain TCP, and its usual port.
    fn tcp(self) -> Option<(&'static str, u16)> {
        match self {
            Protocol::Native => None,
            Protocol::Mqtt => Some(("mqtt", 1883)),
            Protocol::Stomp => Some(("stomp", 61613)),
        }
    }

    /// The WebSocket opcode its frames travel in (MQTT is binary, STOMP text; native text
    /// unless the scenario publishes binary).
    pub fn opcode(self) -> u8 {
        match self {
            Protocol::Mqtt => 0x2,
            Protocol::Native | Protocol::Stomp => 0x1,
        }
    }
}

impl std::str::FromStr for Protocol {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<Protocol> {
        match s {
            "native" => Ok(Protocol::Native),
            "mqtt" => Ok(Protocol::Mqtt),
            "stomp" => Ok(Protocol::Stomp),
            other => bail!("unknown protocol {other:?}: native, mqtt or stomp"),
        }
    }
}

/// Where a client of one protocol connects: a server's WebSocket endpoint, or a plain TCP
/// listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub host: String,
    pub port: u16,
    /// The WebSocket path; None for plain TCP.
    pub path: Option<String>,
}

impl Endpoint {
    /// The endpoint for `protocol` at the server `url`. A `ws://` URL whose path is one of
    /// herald's endpoints (`/ws`, `/mqtt`, `/stomp`) or empty gets the protocol's endpoint, so
    /// one URL (`--url`, or the spawned server's) serves clients of every protocol; any other
    /// path is kept (another server's). `mqtt://host:port` and `stomp://host:port` are the
    /// protocol over plain TCP.
    pub fn of(url: &str, protocol: Protocol) -> Result<Endpoint> {
        let uri: tungstenite::http::Uri =
            url.parse().with_context(|| format!("bad URL {url:?}"))?;
        let host = uri
            .host()
            .with_context(|| format!("the URL {url:?} has no host"))?
            .to_string();
        let scheme = uri.scheme_str().unwrap_or("ws");
        match (scheme, protocol.tcp()) {
            ("ws", _) => {
                let path = match uri.path() {
                    "" | "/" | "/ws" | "/mqtt" | "/stomp" => protocol.path(),
                    other => other,
                };
                Ok(Endpoint {
                    host,
                    port: uri.port_u16().unwrap_or(80),
                    path: Some(path.to_string()),
                })
            }
            (s, Some((tcp, default_port))) if s == tcp => Ok(Endpoint {
                host,
                port: uri.port_u16().unwrap_or(default_port),
                path: None,
            }),
            ("wss", _) => bail!("the bench has no TLS: {url:?} needs ws://"),
            (s, _) => bail!(
                "a {} client cannot connect to a {s}:// URL ({url:?}): ws://{}",
                protocol.as_str(),
                match protocol.tcp() {
                    Some((tcp, _)) => format!(" or {tcp}://"),
                    None => String::new(),
                }
            ),
        }
    }

    pub fn framing(&self) -> Framing {
        match self.path {
            Some(_) => Framing::WebSocket,
            None => Framing::Raw,
        }
    }

    /// The URL a WebSocket handshake asks for.
    pub fn ws_url(&self) -> Option<String> {
        let path = self.path.as_ref()?;
        Some(format!("ws://{}:{}{path}", self.host, self.port))
    }
}

/// The MQTT client identifier of subscriber `id` or of publisher `index` (`p`): unique among
/// the clients of one bench process, and across processes by the process id (a server closes
/// an older connection with the same identifier).
pub fn client_id(role: char, n: u64) -> String {
    format!("hb{}{role}{n}", std::process::id())
}

/// What a subscriber sends first, each frame in `framing`: the session's opening (MQTT and
/// STOMP CONNECT; MQTT client identifier `client_id`) and one subscription per topic (MQTT at
/// `qos`). Each subscription is confirmed by one [`Incoming::Subscribed`].
pub fn subscriber_hello(
    protocol: Protocol,
    framing: Framing,
    client_id: &str,
    topics: &[String],
    qos: u8,
    out: &mut Vec<u8>,
) {
    let mut frame = Vec::with_capacity(64);
    let op = protocol.opcode();
    if let Some(open) = opening(protocol, client_id) {
        framing.put(op, &open, out);
    }
    for (i, topic) in topics.iter().enumerate() {
        frame.clear();
        match protocol {
            Protocol::Native => frame.extend_from_slice(wire::sub_frame(topic).as_bytes()),
            Protocol::Mqtt => mqtt::subscribe(packet_id(i as u64), topic, qos, &mut frame),
            Protocol::Stomp => stomp::subscribe(i as u64, topic, &mut frame),
        }
        framing.put(op, &frame, out);
    }
}

/// The frame that opens a session (answered by [`Incoming::Connected`]); native has none.
pub fn opening(protocol: Protocol, client_id: &str) -> Option<Vec<u8>> {
    let mut out = vec![];
    match protocol {
        Protocol::Native => return None,
        Protocol::Mqtt => mqtt::connect(client_id, &mut out),
        Protocol::Stomp => stomp::connect(&mut out),
    }
    Some(out)
}

/// MQTT packet identifier `n` (1 … 65535, then round again: 0 is not one).
pub fn packet_id(n: u64) -> u16 {
    (n % 65_535) as u16 + 1
}

/// Appends one publish of `payload` on `topic` in `framing` (`scratch` holds the protocol
/// frame meanwhile). `stamp` asks herald for its receive time (native, STOMP); `qos` and
/// `packet_id` are MQTT's. A native publish carries the payload as its text `data`, which
/// must then need no JSON escape (a [`wire::numbered_payload`] needs none); the native
/// publishers of the scenarios write theirs in place ([`wire::text_pub`], [`wire::binary_pub`]).
#[allow(clippy::too_many_arguments)]
pub fn publish(
    protocol: Protocol,
    framing: Framing,
    topic: &str,
    payload: &[u8],
    stamp: bool,
    qos: u8,
    packet_id: u16,
    scratch: &mut Vec<u8>,
    out: &mut Vec<u8>,
) {
    scratch.clear();
    match protocol {
        Protocol::Mqtt => mqtt::publish(topic, qos, packet_id, payload, scratch),
        Protocol::Stomp => stomp::send(topic, stamp, payload, scratch),
        Protocol::Native => {
            scratch.extend_from_slice(b"{\"op\":\"pub\",\"topic\":\"");
            scratch.extend_from_slice(topic.as_bytes());
            if stamp {
                scratch.extend_from_slice(b"\",\"stamp\":true");
            } else {
                scratch.push(b'"');
            }
            scratch.extend_from_slice(b",\"data\":\"");
            scratch.extend_from_slice(payload);
            scratch.extend_from_slice(b"\"}");
        }
    }
    framing.put(protocol.opcode(), scratch, out);
}

/// Reads what a server sends in one protocol, message by message (a WebSocket message, or
/// what one TCP read brought), and says what each frame in it is. MQTT packets and STOMP
/// frames may be split across messages or share one: the start of one whose rest has not
/// arrived waits in `carry`.
pub struct Decoder {
    protocol: Protocol,
    max_message: usize,
    /// MQTT: the QoS subscriptions asked for; a lower grant is reported.
    qos: u8,
    carry: Vec<u8>,
    /// What the client owes the server for what it read (MQTT PUBACKs of QoS 1 deliveries),
    /// unframed; the caller sends and clears it.
    pub replies: Vec<u8>,
}

impl Decoder {
    pub fn new(protocol: Protocol, max_message: usize, qos: u8) -> Decoder {
        Decoder {
            protocol,
            max_message,
            qos,
            carry: Vec::new(),
            replies: Vec::new(),
        }
    }

    pub fn protocol(&self) -> Protocol {
        self.protocol
    }

    /// Decodes one message from the server (`text`: a WebSocket text message) and calls `f`
    /// with each thing it says, in order. A frame that cannot be read is an error: the
    /// connection cannot be read further.
    pub fn feed(
        &mut self,
        text: bool,
        bytes: &[u8],
        f: &mut impl FnMut(Incoming<'_>),
    ) -> Result<()> {
        let Decoder {
            protocol,
            max_message,
            qos,
            carry,
            replies,
        } = self;
        let asked = *qos;
        let max = *max_message;
        match protocol {
            Protocol::Native => {
                f(if text {
                    wire::parse_text(bytes)
                } else {
                    wire::parse_binary(bytes)
                });
                Ok(())
            }
            Protocol::Mqtt => frames(carry, bytes, |b| {
                let Some((packet, n)) = mqtt::parse(b, max)? else {
                    return Ok(None);
                };
                mqtt_incoming(packet, asked, replies, f);
                Ok(Some(n))
            }),
            Protocol::Stomp => frames(carry, bytes, |b| {
                let Some((frame, n)) = stomp::parse(b, max)? else {
                    return Ok(None);
                };
                stomp_incoming(frame, f);
                Ok(Some(n))
            }),
        }
    }
}

/// Hands `take` each frame of `carry` + `chunk` in turn: it reads one from the front of the
/// bytes it is given and says its length, or None when only part of one is there, which is
/// kept in `carry` for the next chunk. Whole frames are read where they arrived, unmoved.
fn frames(
    carry: &mut Vec<u8>,
    chunk: &[u8],
    mut take: impl FnMut(&[u8]) -> Result<Option<usize>>,
) -> Result<()> {
    let mut all = |b: &[u8]| -> Result<usize> {
        let mut at = 0;
        while at < b.len() {
            match take(&b[at..])? {
                Some(n) => at += n,
                None => break,
            }
        }
        Ok(at)
    };
    if carry.is_empty() {
        let used = all(chunk)?;
        carry.extend_from_slice(&chunk[used..]);
    } else {
        carry.extend_from_slice(chunk);
        let used = all(carry)?;
        carry.drain(..used);
    }
    Ok(())
}

fn mqtt_incoming(
    packet: mqtt::Packet<'_>,
    asked: u8,
    replies: &mut Vec<u8>,
    f: &mut impl FnMut(Incoming<'_>),
) {
    match packet {
        mqtt::Packet::ConnAck(0) => f(Incoming::Connected),
        mqtt::Packet::ConnAck(code) => f(Incoming::Error(format!(
            "the server refused the MQTT connection (CONNACK return code {code})"
        ))),
        mqtt::Packet::Publish {
            topic,
            packet_id,
            qos,
            payload,
        } => {
            match (qos, packet_id) {
                (1, Some(id)) => mqtt::puback(id, replies),
                (0, _) => {}
                _ => {
                    return f(Incoming::Error(format!(
                        "a PUBLISH at QoS {qos}, which the bench does not subscribe at"
                    )))
                }
            }
            match wire::payload_number(payload) {
                Some((publisher, n)) => f(Incoming::Msg(Delivery {
                    topic,
                    seq: n,
                    ts: None,
                    send_us: wire::payload_send_us(payload),
                    len: payload.len(),
                    publisher: Some(publisher),
                })),
                None => f(Incoming::Other),
            }
        }
        mqtt::Packet::PubAck(_) => f(Incoming::Acked),
        mqtt::Packet::SubAck(codes) => {
            for &code in codes {
                if code < asked {
                    f(Incoming::Error(format!(
                        "the server granted MQTT subscriptions QoS {code} where the bench asked {asked}"
                    )));
                }
                f(match code {
                    0..=2 => Incoming::Subscribed,
                    _ => Incoming::Error(format!(
                        "the server refused an MQTT subscription (SUBACK return code {code:#04x})"
                    )),
                });
            }
        }
        mqtt::Packet::Other(_) => f(Incoming::Other),
    }
}

fn stomp_incoming(frame: stomp::Frame<'_>, f: &mut impl FnMut(Incoming<'_>)) {
    let incoming = match frame {
        stomp::Frame::Message {
            topic,
            seq,
            ts,
            dropped,
            body,
        } => {
            if let Some(count) = dropped {
                let topic = String::from_utf8_lossy(topic).into_owned();
                f(Incoming::Dropped { topic, count });
            }
            // herald's numbering when it gives one, else the publisher's from the payload.
            let (seq, publisher) = match (seq, wire::payload_number(body)) {
                (Some(seq), _) => (seq, None),
                (None, Some((p, n))) => (n, Some(p)),
                (None, None) => return f(Incoming::Other),
            };
            Incoming::Msg(Delivery {
                topic,
                seq,
                ts,
                send_us: wire::payload_send_us(body),
                len: body.len(),
                publisher,
            })
        }
        stomp::Frame::Connected => Incoming::Connected,
        stomp::Frame::Receipt => Incoming::Subscribed,
        stomp::Frame::Error(m) => {
            Incoming::Error(format!("STOMP ERROR: {}", String::from_utf8_lossy(m)))
        }
        stomp::Frame::HeartBeat | stomp::Frame::Other => Incoming::Other,
    };
    f(incoming)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_url_serves_every_protocol() {
        let e = |url, p| Endpoint::of(url, p).unwrap();
        let ws = |port, path: &str| Endpoint {
            host: "127.0.0.1".into(),
            port,
            path: Some(path.into()),
        };
        assert_eq!(
            e("ws://127.0.0.1:8080/ws", Protocol::Mqtt),
            ws(8080, "/mqtt")
        );
        assert_eq!(
            e("ws://127.0.0.1:8080/mqtt", Protocol::Native),
            ws(8080, "/ws")
        );
        assert_eq!(
            e("ws://127.0.0.1:8080", Protocol::Stomp),
            ws(8080, "/stomp")
        );
        assert_eq!(
            e("ws://127.0.0.1:9/broker", Protocol::Mqtt),
            ws(9, "/broker")
        );
        let tcp = e("mqtt://127.0.0.1", Protocol::Mqtt);
        assert_eq!((tcp.port, tcp.framing()), (1883, Framing::Raw));
        assert_eq!(tcp.path, None);
        assert_eq!(e("stomp://127.0.0.1:7", Protocol::Stomp).port, 7);
        assert!(Endpoint::of("mqtt://127.0.0.1", Protocol::Native).is_err());
        assert!(Endpoint::of("stomp://127.0.0.1", Protocol::Mqtt).is_err());
        assert!(Endpoint::of("wss://127.0.0.1", Protocol::Mqtt).is_err());
        assert_eq!(
            ws(1, "/mqtt").ws_url().as_deref(),
            Some("ws://127.0.0.1:1/mqtt")
        );
    }

    /// Collects what a decoder says about each of `chunks`.
    fn decode(d: &mut Decoder, chunks: &[&[u8]]) -> Vec<String> {
        let mut seen = vec![];
        for c in chunks {
            d.feed(false, c, &mut |i| seen.push(format!("{i:?}")))
                .unwrap();
        }
        seen
    }

    #[test]
    fn mqtt_packets_split_and_joined_across_messages() {
        let mut bytes = vec![0x20, 2, 0, 0, 0x90, 3, 0, 1, 0];
        let mut payload = vec![];
        wire::numbered_payload(&mut payload, 1_000, (2, 5), 20, "");
        mqtt::publish("t/3", 1, 77, &payload, &mut bytes);
        mqtt::publish("t/4", 0, 0, &payload, &mut bytes);
        let whole = {
            let mut d = Decoder::new(Protocol::Mqtt, 1 << 20, 0);
            let seen = decode(&mut d, &[&bytes]);
            assert_eq!(
                d.replies,
                [0x40, 2, 0, 77],
                "the QoS 1 delivery is acknowledged"
            );
            seen
        };
        assert_eq!(whole.len(), 4, "{whole:?}");
        assert_eq!(whole[0], "Connected");
        assert_eq!(whole[1], "Subscribed");
        assert!(
            whole[2].contains("topic: [116, 47, 51], seq: 5")
                && whole[2].contains("send_us: Some(1000)")
                && whole[2].contains("publisher: Some(2)"),
            "{}",
            whole[2]
        );
        for cut in 1..bytes.len() {
            let mut d = Decoder::new(Protocol::Mqtt, 1 << 20, 0);
            assert_eq!(
                decode(&mut d, &[&bytes[..cut], &bytes[cut..]]),
                whole,
                "cut {cut}"
            );
            assert!(d.carry.is_empty());
        }
        let mut d = Decoder::new(Protocol::Mqtt, 1 << 20, 1);
        let seen = decode(&mut d, &[&[0x20, 2, 0, 5], &[0x90, 4, 0, 1, 0x80, 0]]);
        assert!(seen[0].contains("CONNACK return code 5"), "{seen:?}");
        assert!(seen[1].contains("SUBACK return code 0x80"), "{seen:?}");
        assert!(
            seen[2].contains("granted MQTT subscriptions QoS 0 where the bench asked 1"),
            "{seen:?}"
        );
        assert_eq!(
            seen[3], "Subscribed",
            "a lower grant is still a subscription"
        );
    }

    #[test]
    fn stomp_frames_split_and_joined_across_messages() {
        let mut bytes = b"CONNECTED\nversion:1.2\n\n\0\nRECEIPT\nreceipt-id:0\n\n\0".to_vec();
        bytes.extend_from_slice(
            b"MESSAGE\nsubscription:0\nmessage-id:1\ndestination:/topic/t/9\ncontent-length:10\nseq:4\nepoch:e\nts:1200\n\n1000:0.1:x\0",
        );
        bytes.extend_from_slice(b"MESSAGE\ndestination:/topic/t/9\ndropped:2\n\n1000:3.8:x\0");
        let whole = decode(&mut Decoder::new(Protocol::Stomp, 1 << 20, 0), &[&bytes]);
        assert_eq!(whole.len(), 6, "{whole:?}");
        assert_eq!(&whole[..3], ["Connected", "Other", "Subscribed"]);
        assert!(
            whole[3].contains("seq: 4, ts: Some(1200), send_us: Some(1000)")
                && whole[3].contains("publisher: None"),
            "herald's numbering first: {}",
            whole[3]
        );
        assert!(
            whole[5].contains("seq: 8") && whole[5].contains("publisher: Some(3)"),
            "the publisher's without it: {}",
            whole[5]
        );
        assert_eq!(whole[4], r#"Dropped { topic: "t/9", count: 2 }"#);
        for cut in 1..bytes.len() {
            let mut d = Decoder::new(Protocol::Stomp, 1 << 20, 0);
            assert_eq!(
                decode(&mut d, &[&bytes[..cut], &bytes[cut..]]),
                whole,
                "cut {cut}"
            );
        }
    }

    #[test]
    fn a_subscriber_hello_opens_then_subscribes_each_topic() {
        let topics = ["t/1".to_string(), "t/2".to_string()];
        let mut out = vec![];
        subscriber_hello(Protocol::Mqtt, Framing::Raw, "c", &topics, 1, &mut out);
        // The client's packets read back (as a server would): CONNECT, then SUBSCRIBE ids 1, 2.
        let (mut at, mut kinds) = (0, vec![]);
        while at < out.len() {
            let (p, n) = mqtt::parse(&out[at..], 1 << 20).unwrap().unwrap();
            kinds.push(p);
            at += n;
        }
        assert_eq!(
            kinds,
            [
                mqtt::Packet::Other(1),
                mqtt::Packet::Other(8),
                mqtt::Packet::Other(8)
            ]
        );
        out.clear();
        subscriber_hello(
            Protocol::Stomp,
            Framing::WebSocket,
            "c",
            &topics,
            0,
            &mut out,
        );
        assert_eq!(out[0], 0x81, "STOMP travels in text frames");
        out.clear();
        subscriber_hello(
            Protocol::Native,
            Framing::WebSocket,
            "c",
            &topics,
            0,
            &mut out,
        );
        assert!(out.ends_with(br#"{"op":"sub","topic":"t/2"}"#));
        let mut scratch = vec![];
        out.clear();
        publish(
            Protocol::Native,
            Framing::Raw,
            "t/1",
            b"5:0.1:x",
            true,
            0,
            0,
            &mut scratch,
            &mut out,
        );
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"op": "pub", "topic": "t/1", "stamp": true, "data": "5:0.1:x"})
        );
        assert_eq!(packet_id(0), 1);
        assert_eq!(packet_id(65_534), 65_535);
        assert_eq!(packet_id(65_535), 1);
    }
}
