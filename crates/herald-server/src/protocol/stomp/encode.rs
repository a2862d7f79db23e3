//! The frames herald sends: CONNECTED, RECEIPT, ERROR, and MESSAGE built for fan-out.
//!
//! A MESSAGE differs per subscriber only in its `subscription` header (and, for subscriptions
//! with client acknowledgement, its `ack` header), so it goes out as four chunks for one
//! vectored write, none of them built per delivery:
//!
//! 1. the subscriber's prefix, built once per subscription ([`Subscriber`]):
//!    `MESSAGE`, `subscription:<id>` and, on 1.2 with client acknowledgement, the start of
//!    `ack:<id>:` (the value is `<subscription id>:<message-id>`, finished by chunk 2);
//! 2. the headers every subscriber shares, built once per message ([`MessageHead`]): the rest
//!    of the `ack` value when chunk 1 started one, `message-id`, `destination`, `content-type`,
//!    `content-length`, herald's [`SEQ`] and [`EPOCH`] (and [`TS`] when the publisher asked
//!    for herald's receive time), the blank line; subscribers without an
//!    `ack` header get a slice of the same buffer that starts at `message-id`;
//! 3. the payload, shared with every subscriber and every protocol, never copied;
//! 4. the NUL that ends the frame.

use super::escape;
use super::version::Version;
use bytes::{BufMut, Bytes, BytesMut};

/// MESSAGE header with the message's sequence number on its topic.
pub const SEQ: &str = "seq";
/// MESSAGE header with the epoch of that numbering.
pub const EPOCH: &str = "epoch";
/// MESSAGE header with herald's receive time of the message, µs since the UNIX epoch, when
/// its SEND asked with `stamp:true` (the native protocol's `ts`).
pub const TS: &str = "ts";
/// MESSAGE header counting the messages of its topic that did not reach the subscriber
/// before this one (its slow-consumer policy let them go).
pub const DROPPED: &str = "dropped";
/// Why they did not: `drop`, `conflate` or `remote`.
pub const DROPPED_REASON: &str = "dropped-reason";
/// The NUL that ends every frame (the last chunk of a [`MessageFrame`]).
pub const END: Bytes = Bytes::from_static(b"\0");

/// A header named by herald (its names hold nothing to escape), its value escaped.
fn header(out: &mut BytesMut, name: &str, value: &str, version: Option<Version>) {
    out.put_slice(name.as_bytes());
    out.put_u8(b':');
    escape::write(out, value, version);
    out.put_u8(b'\n');
}

/// A header whose value is a number, which holds nothing to escape either.
fn number_header(out: &mut BytesMut, name: &str, value: u64) {
    out.put_slice(name.as_bytes());
    out.put_u8(b':');
    out.put_slice(itoa::Buffer::new().format(value).as_bytes());
    out.put_u8(b'\n');
}

/// A frame with headers and an optional text body, content-length given.
fn frame(command: &str, headers: &[(&str, &str)], body: &str, version: Option<Version>) -> Bytes {
    let size = command.len() + body.len() + 32;
    let mut out = BytesMut::with_capacity(
        size + headers
            .iter()
            .map(|(n, v)| n.len() + v.len() + 8)
            .sum::<usize>(),
    );
    out.put_slice(command.as_bytes());
    out.put_u8(b'\n');
    for (name, value) in headers {
        header(&mut out, name, value, version);
    }
    if !body.is_empty() {
        header(
            &mut out,
            "content-type",
            "text/plain;charset=utf-8",
            version,
        );
        header(&mut out, "content-length", &body.len().to_string(), version);
    }
    out.put_u8(b'\n');
    out.put_slice(body.as_bytes());
    out.put_u8(0);
    out.freeze()
}

/// CONNECTED, the answer to CONNECT (never escaped; see [`escape`]). `heart_beat` is herald's
/// `(sx, sy)` in milliseconds, the value [`super::heartbeat::negotiate`] was given.
pub fn connected(version: Version, heart_beat: (u64, u64), server: &str, session: &str) -> Bytes {
    let hb = format!("{},{}", heart_beat.0, heart_beat.1);
    let mut headers = vec![
        ("version", version.as_str()),
        ("server", server),
        ("session", session),
    ];
    if version > Version::V1_0 {
        headers.insert(1, ("heart-beat", &hb));
    }
    frame("CONNECTED", &headers, "", None)
}

/// RECEIPT for a frame whose `receipt` header was `receipt_id`, with herald's `extra` headers
/// (what a SUBSCRIBE recovered).
pub fn receipt(receipt_id: &str, extra: &[(&str, &str)], version: Version) -> Bytes {
    let mut headers = vec![("receipt-id", receipt_id)];
    headers.extend_from_slice(extra);
    frame("RECEIPT", &headers, "", Some(version))
}

/// A heart-beat: one EOL.
pub const HEART_BEAT: Bytes = Bytes::from_static(b"\n");

/// An ERROR frame, after which herald closes the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorFrame<'a> {
    /// A short description (the `message` header).
    pub message: &'a str,
    /// The offending frame's `receipt`, if it had one.
    pub receipt_id: Option<&'a str>,
    /// Longer detail for the text/plain body; empty for none.
    pub detail: &'a str,
    /// Add `version` with the versions herald speaks (the answer to a CONNECT without one).
    pub list_versions: bool,
}

impl ErrorFrame<'_> {
    /// The frame, escaped for `version` (`None` before one is negotiated).
    pub fn encode(&self, version: Option<Version>) -> Bytes {
        let mut headers = vec![("message", self.message)];
        if self.list_versions {
            headers.push(("version", super::version::SUPPORTED));
        }
        if let Some(id) = self.receipt_id {
            headers.push(("receipt-id", id));
        }
        frame("ERROR", &headers, self.detail, version)
    }
}

/// The MESSAGE prefix of one subscription (chunk 1), built when the client subscribes.
#[derive(Debug, Clone)]
pub struct Subscriber {
    prefix: Bytes,
    acked: bool,
}

impl Subscriber {
    /// For subscription `id` of a client speaking `version`; `client_ack`: its `ack` mode is
    /// `client` or `client-individual`, so its MESSAGE frames carry an `ack` header on 1.2
    /// (1.0 and 1.1 acknowledge by `message-id` and `subscription` instead).
    pub fn new(id: &str, version: Version, client_ack: bool) -> Subscriber {
        let acked = client_ack && version == Version::V1_2;
        let mut prefix = BytesMut::with_capacity(2 * id.len() + 32);
        prefix.put_slice(b"MESSAGE\n");
        header(&mut prefix, "subscription", id, Some(version));
        if acked {
            prefix.put_slice(b"ack:");
            escape::write(&mut prefix, id, Some(version));
            // The `:` between subscription id and message-id, escaped as 1.2 requires.
            prefix.put_slice(b"\\c");
        }
        Subscriber {
            prefix: prefix.freeze(),
            acked,
        }
    }
}

/// What a MESSAGE says about the message, the same for every subscriber.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessageParts<'a> {
    /// Unique among the messages a connection may acknowledge: the delivery's number on the
    /// connection (a number has no `:`, so [`parse_ack`] can split an `ack` value at its last).
    pub message_id: u64,
    pub destination: &'a str,
    pub content_type: Option<&'a str>,
    pub body_len: usize,
    pub seq: u64,
    pub epoch: &'a str,
    /// herald's receive time ([`TS`]), when the publisher asked for it.
    pub ts: Option<u64>,
    /// Messages of this topic that did not reach the subscriber before this one, and why
    /// (the [`DROPPED`] and [`DROPPED_REASON`] headers).
    pub dropped: Option<(u64, &'a str)>,
}

/// The shared headers of one message for subscribers speaking one version (chunk 2).
#[derive(Debug, Clone)]
pub struct MessageHead {
    /// The rest of an `ack` value (`<message-id>` and its LF), then the headers.
    with_ack: Bytes,
    /// Where the headers start in `with_ack`.
    headers_at: usize,
}

impl MessageHead {
    pub fn new(parts: &MessageParts<'_>, version: Version) -> MessageHead {
        let v = Some(version);
        // The message-id twice (a u64 has at most 20 digits), the values, and room for names.
        let mut out = BytesMut::with_capacity(
            2 * 20
                + parts.destination.len()
                + parts.epoch.len()
                + parts.content_type.map_or(0, str::len)
                + 128,
        );
        out.put_slice(itoa::Buffer::new().format(parts.message_id).as_bytes());
        out.put_u8(b'\n');
        let headers_at = out.len();
        number_header(&mut out, "message-id", parts.message_id);
        header(&mut out, "destination", parts.destination, v);
        if let Some(ct) = parts.content_type {
            header(&mut out, "content-type", ct, v);
        }
        number_header(&mut out, "content-length", parts.body_len as u64);
        number_header(&mut out, SEQ, parts.seq);
        header(&mut out, EPOCH, parts.epoch, v);
        if let Some(ts) = parts.ts {
            number_header(&mut out, TS, ts);
        }
        if let Some((count, reason)) = parts.dropped {
            number_header(&mut out, DROPPED, count);
            header(&mut out, DROPPED_REASON, reason, v);
        }
        out.put_u8(b'\n');
        MessageHead {
            with_ack: out.freeze(),
            headers_at,
        }
    }

    /// The frame for `subscriber`, whose client speaks the version this head was built for,
    /// with `body` (of the length given in [`MessageParts`]). Only reference counts change.
    pub fn frame(&self, subscriber: &Subscriber, body: &Bytes) -> MessageFrame {
        let shared = if subscriber.acked {
            self.with_ack.clone()
        } else {
            self.with_ack.slice(self.headers_at..)
        };
        MessageFrame([subscriber.prefix.clone(), shared, body.clone(), END])
    }
}

/// A whole MESSAGE frame as the chunks of one vectored write (see the module doc).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageFrame(pub [Bytes; 4]);

impl MessageFrame {
    /// Bytes in all chunks: what a WebSocket frame carrying it announces.
    pub fn len(&self) -> usize {
        self.0.iter().map(Bytes::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The subscription id and message-id an ACK or NACK `id` names, for an `ack` header written
/// by [`MessageHead::frame`] (`<subscription id>:<message-id>`, unescaped).
pub fn parse_ack(id: &str) -> Option<(&str, &str)> {
    id.rsplit_once(':')
}
