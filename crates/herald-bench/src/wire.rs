//! The bench's side of herald's native protocol (docs/protocol.md): building publish and
//! subscribe frames, and reading deliveries cheaply.
//!
//! Deliveries are the hot path (hundreds of thousands per second on one core), so a text
//! `{"op":"msg",…}` is read by locating `"seq":`, `"topic":"`, `"ts":` and `"data":"` with a
//! byte search rather than a full JSON parse; anything else falls back to serde_json.
//!
//! Payload layout (what the bench publishes):
//! * text, in every protocol ([`numbered_payload`]; a native publish's `data`):
//!   `"<send µs since UNIX epoch>:<publisher>.<n>:<text><padding to B bytes>"`, with `n` the
//!   message's number among its publisher's messages on its topic. MQTT carries no server
//!   sequence number, so an MQTT subscriber checks loss and order by these numbers instead;
//! * binary (native publishers and subscribers only): 8 bytes send µs (big-endian), 8 bytes
//!   counter, then padding to B bytes.
//!
//! The text payload is the same bytes whatever protocol carries it, and its send time is read
//! by one function ([`payload_send_us`]): latency is measured the same way for every protocol,
//! and any protocol's subscribers can read any protocol's publishers.

use memchr::memmem::Finder;
use std::sync::LazyLock;

/// The keys a delivery is read by, each searched with a finder built once: `memmem::find`
/// builds one per call, which was 5% of the bench's core receiving 180,000 messages/s.
static OP_MSG: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\"op\":\"msg\""));
static SEQ: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\"seq\":"));
static TOPIC: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\"topic\":\""));
static DATA: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\"data\":\""));
static TS: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\"ts\":"));

/// Wall-clock microseconds since the UNIX epoch: comparable with herald's `ts` on one host.
pub fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

pub fn sub_frame(topic: &str) -> String {
    format!("{{\"op\":\"sub\",\"topic\":\"{topic}\"}}")
}

/// Writes a text publish frame into `buf` (cleared first), its `data` the payload
/// [`numbered_payload`] writes for (publisher, n) `number`. `payload` is the total `data`
/// length; the timestamp and numbers always fit, even past it.
pub fn text_pub(
    buf: &mut String,
    topic: &str,
    send_us: u64,
    number: (u64, u64),
    payload: usize,
    stamp: bool,
    text: &str,
) {
    use std::fmt::Write;
    buf.clear();
    buf.push_str("{\"op\":\"pub\",\"topic\":\"");
    buf.push_str(topic);
    buf.push_str(if stamp {
        "\",\"stamp\":true,\"data\":\""
    } else {
        "\",\"data\":\""
    });
    let start = buf.len();
    let _ = write!(buf, "{send_us}:{}.{}:", number.0, number.1);
    buf.push_str(text);
    let used = buf.len() - start;
    for _ in used..payload {
        buf.push('x');
    }
    buf.push_str("\"}");
}

/// A binary publish frame: header length, JSON header, payload with the timestamp in front.
pub fn binary_pub(topic: &str, send_us: u64, counter: u64, payload: usize, stamp: bool) -> Vec<u8> {
    let header = if stamp {
        format!("{{\"op\":\"pub\",\"topic\":\"{topic}\",\"stamp\":true}}")
    } else {
        format!("{{\"op\":\"pub\",\"topic\":\"{topic}\"}}")
    };
    let n = payload.max(16);
    let mut f = Vec::with_capacity(4 + header.len() + n);
    f.extend_from_slice(&(header.len() as u32).to_be_bytes());
    f.extend_from_slice(header.as_bytes());
    f.extend_from_slice(&send_us.to_be_bytes());
    f.extend_from_slice(&counter.to_be_bytes());
    f.resize(4 + header.len() + n, b'x');
    f
}

/// Writes the text payload into `buf` (cleared first): `"<send µs>:<publisher>.<n>:<text>"`
/// for (publisher, n) `number`, padded with `x` to `payload` bytes (the stamp and the numbers
/// always fit, even past it).
pub fn numbered_payload(
    buf: &mut Vec<u8>,
    send_us: u64,
    number: (u64, u64),
    payload: usize,
    text: &str,
) {
    use std::io::Write;
    buf.clear();
    let _ = write!(buf, "{send_us}:{}.{}:{text}", number.0, number.1);
    if buf.len() < payload {
        buf.resize(payload, b'x');
    }
}

/// The publisher and number of a payload [`numbered_payload`] wrote.
pub fn payload_number(data: &[u8]) -> Option<(u32, u64)> {
    let rest = &data[memchr::memchr(b':', data)? + 1..];
    let field = &rest[..memchr::memchr(b':', rest)?];
    let dot = memchr::memchr(b'.', field)?;
    let (p, n) = (&field[..dot], &field[dot + 1..]);
    let digits = |s: &[u8]| !s.is_empty() && s.iter().all(u8::is_ascii_digit);
    if !digits(p) || !digits(n) {
        return None;
    }
    Some((u32::try_from(parse_u64(p)?).ok()?, parse_u64(n)?))
}

/// Rewrites the timestamp of a frame built by [`binary_pub`] (images reuse one buffer).
pub fn patch_binary_stamp(frame: &mut [u8], send_us: u64, counter: u64) {
    let hl = u32::from_be_bytes([frame[0], frame[1], frame[2], frame[3]]) as usize;
    let p = 4 + hl;
    frame[p..p + 8].copy_from_slice(&send_us.to_be_bytes());
    frame[p + 8..p + 16].copy_from_slice(&counter.to_be_bytes());
}

/// One delivered message, borrowed from its frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivery<'a> {
    pub topic: &'a [u8],
    pub seq: u64,
    /// herald's receive time (µs since the UNIX epoch), when the publisher asked for `stamp`.
    pub ts: Option<u64>,
    /// The publisher's send time, read from the payload (None if the payload is not ours).
    pub send_us: Option<u64>,
    /// Payload length in bytes (text: the JSON string's raw length).
    pub len: usize,
    /// Whose numbering `seq` is: None, herald's (per topic); Some(p), publisher `p`'s own
    /// (per publisher and topic, from the payload: MQTT).
    pub publisher: Option<u32>,
}

/// What a frame from the server is (in any protocol: [`crate::protocol::Decoder`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Incoming<'a> {
    Msg(Delivery<'a>),
    Dropped {
        topic: String,
        count: u64,
    },
    /// One subscription confirmed (native `subscribed`, an MQTT SUBACK's code, a STOMP RECEIPT).
    Subscribed,
    /// The session is open (MQTT CONNACK accepted, STOMP CONNECTED).
    Connected,
    /// A QoS 1 publish acknowledged (MQTT PUBACK).
    Acked,
    Error(String),
    Other,
}

fn find_u64(s: &[u8], key: &Finder) -> Option<u64> {
    let i = key.find(s)? + key.needle().len();
    parse_u64(&s[i..])
}

fn parse_u64(s: &[u8]) -> Option<u64> {
    let mut n: u64 = 0;
    let mut any = false;
    for &b in s {
        if b.is_ascii_digit() {
            n = n.checked_mul(10)?.checked_add((b - b'0') as u64)?;
            any = true;
        } else {
            break;
        }
    }
    any.then_some(n)
}

/// The raw bytes of a string field (up to the next quote; our topics and payloads carry no
/// escapes, and a value with a backslash is left to the slow path).
fn find_str<'a>(s: &'a [u8], key: &Finder) -> Option<&'a [u8]> {
    let i = key.find(s)? + key.needle().len();
    let rest = &s[i..];
    let end = memchr::memchr(b'"', rest)?;
    let v = &rest[..end];
    (!v.contains(&b'\\')).then_some(v)
}

/// Reads a text frame.
pub fn parse_text(s: &[u8]) -> Incoming<'_> {
    if OP_MSG.find(s).is_some() {
        if let (Some(seq), Some(topic), Some(data)) =
            (find_u64(s, &SEQ), find_str(s, &TOPIC), find_str(s, &DATA))
        {
            return Incoming::Msg(Delivery {
                topic,
                seq,
                ts: find_u64(s, &TS),
                send_us: payload_send_us(data),
                len: data.len(),
                publisher: None,
            });
        }
    }
    slow_path(s)
}

/// The send time a text payload starts with (`"<send µs>:…"`).
pub fn payload_send_us(data: &[u8]) -> Option<u64> {
    let colon = memchr::memchr(b':', data)?;
    parse_u64(&data[..colon]).filter(|_| colon > 0)
}

fn slow_path(s: &[u8]) -> Incoming<'_> {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(s) else {
        return Incoming::Other;
    };
    match v.get("op").and_then(|o| o.as_str()) {
        Some("dropped") => Incoming::Dropped {
            topic: v["topic"].as_str().unwrap_or_default().to_string(),
            count: v["count"].as_u64().unwrap_or(0),
        },
        Some("subscribed") => Incoming::Subscribed,
        Some("error") => Incoming::Error(format!(
            "{}: {}",
            v["code"].as_str().unwrap_or("?"),
            v["message"].as_str().unwrap_or("")
        )),
        _ => Incoming::Other,
    }
}

/// Reads a binary frame (4-byte header length, JSON header, payload).
pub fn parse_binary(b: &[u8]) -> Incoming<'_> {
    if b.len() < 4 {
        return Incoming::Other;
    }
    let hl = u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize;
    let Some(header) = b.get(4..4 + hl) else {
        return Incoming::Other;
    };
    let payload = &b[4 + hl..];
    if OP_MSG.find(header).is_none() {
        return slow_path(header);
    }
    let (Some(seq), Some(topic)) = (find_u64(header, &SEQ), find_str(header, &TOPIC)) else {
        return Incoming::Other;
    };
    // The text layout when it starts with a digit (published over MQTT, whose payloads herald
    // delivers as binary), else the binary one: its first byte, the top of a send time in µs,
    // is 0.
    let send_us = match payload.first() {
        Some(b) if b.is_ascii_digit() => payload_send_us(payload),
        _ => (payload.len() >= 16).then(|| u64::from_be_bytes(payload[..8].try_into().unwrap())),
    };
    Incoming::Msg(Delivery {
        topic,
        seq,
        ts: find_u64(header, &TS),
        send_us,
        len: payload.len(),
        publisher: None,
    })
}

/// The topic number: the digits after the last `/` (None for named topics like `shares/NFLX`).
pub fn topic_number(topic: &[u8]) -> Option<u64> {
    let i = memchr::memrchr(b'/', topic).map(|i| i + 1).unwrap_or(0);
    let tail = &topic[i..];
    if tail.is_empty() || !tail.iter().all(|b| b.is_ascii_digit()) {
        return None;
    }
    parse_u64(tail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_roundtrip() {
        let mut buf = String::new();
        text_pub(
            &mut buf,
            "t/12",
            1_763_888_000_123_456,
            (2, 7),
            50,
            true,
            "",
        );
        let v: serde_json::Value = serde_json::from_str(&buf).unwrap();
        assert_eq!(v["op"], "pub");
        assert_eq!(v["stamp"], true);
        let data = v["data"].as_str().unwrap();
        assert_eq!(data.len(), 50);
        assert!(data.starts_with("1763888000123456:2.7:x"));
        assert_eq!(payload_number(data.as_bytes()), Some((2, 7)));
        // what herald sends back
        let msg = format!(
            "{{\"op\":\"msg\",\"topic\":\"t/12\",\"seq\":42,\"epoch\":\"5c1e\",\"data\":\"{data}\",\"ts\":1763888000123470}}"
        );
        let Incoming::Msg(d) = parse_text(msg.as_bytes()) else {
            panic!()
        };
        assert_eq!(d.topic, b"t/12");
        assert_eq!(d.seq, 42);
        assert_eq!(d.ts, Some(1_763_888_000_123_470));
        assert_eq!(d.send_us, Some(1_763_888_000_123_456));
        assert_eq!(d.len, 50);
        assert_eq!(topic_number(d.topic), Some(12));
    }

    #[test]
    fn field_order_does_not_matter_and_ts_is_optional() {
        let msg = br#"{"data":"5:1:Hello World!","seq":3,"topic":"a/b","op":"msg","epoch":"e"}"#;
        let Incoming::Msg(d) = parse_text(msg) else {
            panic!()
        };
        assert_eq!((d.seq, d.ts, d.send_us), (3, None, Some(5)));
        assert_eq!(topic_number(d.topic), None);
    }

    #[test]
    fn control_frames() {
        assert_eq!(
            parse_text(br#"{"op":"dropped","topic":"t/1","count":17}"#),
            Incoming::Dropped {
                topic: "t/1".into(),
                count: 17
            }
        );
        assert_eq!(
            parse_text(br#"{"op":"subscribed","topic":"t/1"}"#),
            Incoming::Subscribed
        );
        assert!(matches!(
            parse_text(br#"{"op":"error","code":"invalid_topic","message":"x"}"#),
            Incoming::Error(e) if e.starts_with("invalid_topic")
        ));
        assert_eq!(parse_text(b"not json"), Incoming::Other);
    }

    #[test]
    fn binary_roundtrip() {
        let mut f = binary_pub("camera/1", 99, 5, 1000, true);
        patch_binary_stamp(&mut f, 123, 6);
        let hl = u32::from_be_bytes(f[..4].try_into().unwrap()) as usize;
        let h: serde_json::Value = serde_json::from_slice(&f[4..4 + hl]).unwrap();
        assert_eq!(h["topic"], "camera/1");
        assert_eq!(f.len(), 4 + hl + 1000);
        // delivery: same layout, msg header
        let header = br#"{"op":"msg","topic":"camera/1","seq":9,"epoch":"e","ts":130}"#;
        let mut d = (header.len() as u32).to_be_bytes().to_vec();
        d.extend_from_slice(header);
        d.extend_from_slice(&f[4 + hl..]);
        let Incoming::Msg(m) = parse_binary(&d) else {
            panic!()
        };
        assert_eq!(
            (m.seq, m.ts, m.send_us, m.len),
            (9, Some(130), Some(123), 1000)
        );
        assert_eq!(parse_binary(&[0, 0, 0, 50, b'{']), Incoming::Other);
        // A text payload delivered as binary (published over MQTT) is read as text.
        let mut d = (header.len() as u32).to_be_bytes().to_vec();
        d.extend_from_slice(header);
        d.extend_from_slice(b"1763888000123456:0.3:xxxxxxxxxx");
        let Incoming::Msg(m) = parse_binary(&d) else {
            panic!()
        };
        assert_eq!(m.send_us, Some(1_763_888_000_123_456));
    }

    #[test]
    fn numbered_payloads_carry_the_stamp_and_the_publishers_number() {
        let mut buf = vec![];
        numbered_payload(&mut buf, 1_763_888_000_123_456, (3, 17), 50, "");
        assert_eq!(buf.len(), 50);
        assert!(buf.starts_with(b"1763888000123456:3.17:xx"));
        assert_eq!(payload_send_us(&buf), Some(1_763_888_000_123_456));
        assert_eq!(payload_number(&buf), Some((3, 17)));
        // Longer than asked: nothing cut; the text follows the numbers.
        numbered_payload(&mut buf, 5, (0, 1), 4, "Hello World! #0");
        assert_eq!(buf, b"5:0.1:Hello World! #0");
        assert_eq!(payload_number(&buf), Some((0, 1)));
        // Anything else has no publisher number.
        assert_eq!(payload_number(b"5:1:xxxx"), None);
        assert_eq!(payload_number(b"5:.1:x"), None);
        assert_eq!(payload_number(b"5:1:x.2:"), None);
    }
}
