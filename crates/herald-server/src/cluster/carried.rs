//! How a herald message travels on NATS between nodes (and is stored in JetStream): its
//! `Herald-*` headers, its extras section, the chunks of a message larger than NATS's
//! `max_payload`, position announcements, and the optional signature. See docs/cluster.md,
//! "Headers".
//!
//! What a node reads from NATS comes from whoever may publish on the NATS account, so it is
//! decoded by one pure function, [`open`], that checks everything before anything is
//! allocated or computed from it, and [`Reassembly`] bounds what chunks may make it hold.

use anyhow::{bail, Context};
use async_nats::HeaderMap;
use bytes::{Bytes, BytesMut};
use herald_core::engine::Recalled;
use herald_core::extras::Extras;
use herald_core::request::{PayloadKind, Publish};
use ring::hmac;
use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

pub const ORIGIN: &str = "Herald-Origin";
pub const EPOCH: &str = "Herald-Epoch";
pub const SEQ: &str = "Herald-Seq";
pub const KIND: &str = "Herald-Kind";
pub const CONTENT_TYPE: &str = "Herald-Content-Type";
pub const STAMP: &str = "Herald-Stamp";
pub const CHUNK: &str = "Herald-Chunk";
/// HMAC-SHA256 (hex) of the message under the cluster key (`[nats] cluster_key_file`).
pub const SIGNATURE: &str = "Herald-Signature";
/// The headers a signature covers, in the order they are fed to it: every one herald reads.
const SIGNED: [&str; 7] = [ORIGIN, EPOCH, SEQ, KIND, CONTENT_TYPE, STAMP, CHUNK];
/// Longest `Herald-Origin` and `Herald-Epoch` accepted (herald's own are 16 and 12 characters).
const MAX_ID: usize = 64;
/// `Herald-Kind` of a position announcement (see [`Departure::mark`]).
const MARK: &str = "mark";
/// What follows the kind (`binary` or `text`) in `Herald-Kind` when the message begins with an
/// extras section of that many bytes ([`extras`]); a node that does not know the section
/// refuses the unknown kind rather than taking the section for payload.
const WITH_EXTRAS: &str = ";extras=";
/// Room left in each NATS message for the headers above.
pub const HEADER_ROOM: usize = 4096;
/// A message (or announcement) on its way to NATS.
pub struct Departure {
    pub subject: String,
    pub headers: HeaderMap,
    pub payload: Bytes,
    /// What the message carries besides, sent as its extras section ([`Departure::leaving`]).
    extras: Option<Arc<Extras>>,
    /// A position announcement ([`Departure::mark`]), not counted as a message.
    pub mark: bool,
}

impl Departure {
    /// Message `p`, published on node `origin` and numbered `(epoch, seq)` there, received at
    /// `now_us`.
    pub fn message(
        origin: &str,
        subject: String,
        p: &Publish,
        epoch: &str,
        seq: u64,
        now_us: u64,
    ) -> Departure {
        let mut headers = numbered(origin, epoch, seq);
        if p.kind == PayloadKind::Text {
            headers.insert(KIND, "text");
        }
        if let Some(ct) = &p.content_type {
            headers.insert(CONTENT_TYPE, ct.as_str());
        }
        if p.stamp {
            headers.insert(STAMP, now_us.to_string().as_str());
        }
        Departure {
            subject,
            headers,
            payload: p.payload.clone(),
            extras: p.extras.clone(),
            mark: false,
        }
    }

    /// A position announcement: `subject`'s topic reached `seq` in `epoch` on node `origin`. It
    /// carries no message; a node that holds less of that epoch learns the exact hole
    /// ([`Engine::remote_reached`](herald_core::engine::Engine::remote_reached)).
    pub fn mark(origin: &str, subject: String, epoch: &str, seq: u64) -> Departure {
        let mut headers = numbered(origin, epoch, seq);
        headers.insert(KIND, MARK);
        Departure {
            subject,
            headers,
            payload: Bytes::new(),
            extras: None,
            mark: true,
        }
    }

    /// What goes on NATS for this message handed over at `now_us`: its headers and its body,
    /// the payload preceded by its extras section if it has extras (their expiry as the time
    /// left now, so that the time it waited here counts). Chunked, signed and sent as is. The
    /// headers are borrowed when the message has no extras: each chunk clones them anyway.
    pub fn leaving(&self, now_us: u64) -> (Cow<'_, HeaderMap>, Bytes) {
        let Some(e) = &self.extras else {
            return (Cow::Borrowed(&self.headers), self.payload.clone());
        };
        let section = extras::encode(e, now_us);
        let mut headers = self.headers.clone();
        let kind = headers.get(KIND).map_or("binary", |k| k.as_str());
        let kind = format!("{kind}{WITH_EXTRAS}{}", section.len());
        headers.insert(KIND, kind.as_str());
        let mut body = BytesMut::with_capacity(section.len() + self.payload.len());
        body.extend_from_slice(&section);
        body.extend_from_slice(&self.payload);
        (Cow::Owned(headers), body.freeze())
    }
}

/// The headers every carried message has: who numbered it, and how.
fn numbered(origin: &str, epoch: &str, seq: u64) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(ORIGIN, origin);
    headers.insert(EPOCH, epoch);
    headers.insert(SEQ, seq.to_string().as_str());
    headers
}

/// Why a message read from NATS was refused; the `reason` label of
/// `herald_cluster_rejected_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reject {
    /// Not herald's headers, or a value that no node writes (a seq that is no number, a
    /// position announcement with a payload, an unknown kind…).
    Malformed,
    /// A `Herald-Chunk` that is no `i/n` with `i < n` and `n ≥ 2`, or parts whose sizes do not
    /// add up to one message.
    Chunk,
    /// A chunked message announcing (or reaching) more than [`body_limit`].
    TooLarge,
    /// No `Herald-Signature` while the cluster key is set.
    Unsigned,
    /// A `Herald-Signature` that is not the cluster key's.
    BadSignature,
}

impl Reject {
    pub const ALL: [Reject; 5] = [
        Reject::Malformed,
        Reject::Chunk,
        Reject::TooLarge,
        Reject::Unsigned,
        Reject::BadSignature,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Reject::Malformed => "malformed",
            Reject::Chunk => "chunk",
            Reject::TooLarge => "too_large",
            Reject::Unsigned => "unsigned",
            Reject::BadSignature => "bad_signature",
        }
    }
}

/// The shared secret of `[nats] cluster_key_file`: nodes sign what they send to NATS with it
/// and refuse what is not signed with it.
#[derive(Clone)]
pub struct ClusterKey(hmac::Key);

impl std::fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterKey(..)")
    }
}

impl ClusterKey {
    /// Shortest secret accepted (bytes): 256 bits, HMAC-SHA256's own strength.
    pub const MIN_LEN: usize = 32;

    pub fn new(secret: &[u8]) -> ClusterKey {
        ClusterKey(hmac::Key::new(hmac::HMAC_SHA256, secret))
    }

    /// The key in `path` (its bytes, a trailing newline ignored). The error names the file,
    /// never its content.
    pub fn from_file(path: &Path) -> anyhow::Result<ClusterKey> {
        let bytes = std::fs::read(path)
            .with_context(|| format!("cannot read [nats] cluster_key_file {}", path.display()))?;
        let secret = bytes
            .strip_suffix(b"\n")
            .map(|s| s.strip_suffix(b"\r").unwrap_or(s))
            .unwrap_or(&bytes);
        if secret.len() < Self::MIN_LEN {
            bail!(
                "[nats] cluster_key_file {} holds {} bytes; it needs at least {} (e.g. head -c 32 /dev/urandom | base64)",
                path.display(),
                secret.len(),
                Self::MIN_LEN
            );
        }
        Ok(ClusterKey::new(secret))
    }

    /// The MAC of a message: the subject, each of [`SIGNED`] (its first value, or its
    /// absence) and the payload, each length-prefixed so that no two messages read alike.
    fn tag(&self, subject: &str, headers: Option<&HeaderMap>, payload: &[u8]) -> hmac::Tag {
        fn field(mac: &mut hmac::Context, value: Option<&[u8]>) {
            match value {
                None => mac.update(&[0]),
                Some(v) => {
                    mac.update(&[1]);
                    mac.update(&(v.len() as u64).to_be_bytes());
                    mac.update(v);
                }
            }
        }
        let mut mac = hmac::Context::with_key(&self.0);
        mac.update(b"herald-cluster-1");
        field(&mut mac, Some(subject.as_bytes()));
        for name in SIGNED {
            let value = headers.and_then(|h| h.get(name));
            field(&mut mac, value.map(|v| v.as_str().as_bytes()));
        }
        field(&mut mac, Some(payload));
        mac.sign()
    }

    /// Adds the `Herald-Signature` of a message about to be sent.
    pub fn sign(&self, subject: &str, headers: &mut HeaderMap, payload: &[u8]) {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let tag = self.tag(subject, Some(headers), payload);
        let mut hex = String::with_capacity(64);
        for b in tag.as_ref() {
            hex.push(char::from(DIGITS[usize::from(b >> 4)]));
            hex.push(char::from(DIGITS[usize::from(b & 15)]));
        }
        headers.insert(SIGNATURE, hex);
    }

    /// Whether a message received carries this key's signature (compared in constant time).
    pub fn verify(
        &self,
        subject: &str,
        headers: Option<&HeaderMap>,
        payload: &[u8],
    ) -> Result<(), Reject> {
        let signature = headers
            .and_then(|h| h.get(SIGNATURE))
            .ok_or(Reject::Unsigned)?;
        let hex = signature.as_str().as_bytes();
        if hex.len() != 64 {
            return Err(Reject::BadSignature);
        }
        let mut claimed = [0u8; 32];
        for (byte, pair) in claimed.iter_mut().zip(hex.chunks_exact(2)) {
            let digit = |c: u8| (c as char).to_digit(16).ok_or(Reject::BadSignature);
            *byte = (digit(pair[0])? * 16 + digit(pair[1])?) as u8;
        }
        let tag = self.tag(subject, headers, payload);
        // Compared in constant time: how much of a forged tag matches must not show.
        let differ = tag
            .as_ref()
            .iter()
            .zip(claimed)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b));
        if differ == 0 {
            Ok(())
        } else {
            Err(Reject::BadSignature)
        }
    }
}

/// `Herald-Chunk: i/n`: part `index` of `count` (at least 2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunk {
    pub index: usize,
    pub count: usize,
}

impl Chunk {
    fn parse(value: &str) -> Result<Chunk, Reject> {
        let (i, n) = value.split_once('/').ok_or(Reject::Chunk)?;
        let number = |s: &str| decimal(s).and_then(|v| usize::try_from(v).ok());
        match (number(i), number(n)) {
            (Some(index), Some(count)) if count >= 2 && index < count => Ok(Chunk { index, count }),
            _ => Err(Reject::Chunk),
        }
    }
}

/// A decimal number as herald writes them: ASCII digits only (no sign, no blank), fitting u64.
fn decimal(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// The herald headers of a message carried between nodes (or stored in JetStream), as checked
/// by [`open`].
#[derive(Debug)]
pub struct Carried {
    pub origin: String,
    pub epoch: String,
    /// At least 1 and below `u64::MAX` (the next seq always exists).
    pub seq: u64,
    /// `Herald-Chunk` of a message sent in parts.
    pub chunk: Option<Chunk>,
    /// A position announcement, not a message (no payload, no chunk).
    pub mark: bool,
    kind: PayloadKind,
    /// The size of the extras section the message (once whole) begins with, if any.
    extras: Option<usize>,
    content_type: Option<String>,
    /// The publisher's `stamp` time (µs).
    pub stamp: Option<u64>,
}

/// `Herald-Kind`: absent (binary), `text`, `mark`, or `binary` or `text` followed by
/// [`WITH_EXTRAS`] and the section's size (at least 1: its version). The size is checked
/// against the message's own size once the message is whole ([`Carried::publish`]).
fn kind(value: Option<&str>) -> Result<(bool, PayloadKind, Option<usize>), Reject> {
    let Some(value) = value else {
        return Ok((false, PayloadKind::Binary, None));
    };
    let (kind, extras) = match value.split_once(WITH_EXTRAS) {
        None => (value, None),
        Some((kind, size)) => {
            let size = decimal(size)
                .and_then(|s| usize::try_from(s).ok())
                .filter(|s| *s >= 1)
                .ok_or(Reject::Malformed)?;
            (kind, Some(size))
        }
    };
    match (kind, extras) {
        ("text", extras) => Ok((false, PayloadKind::Text, extras)),
        ("binary", Some(size)) => Ok((false, PayloadKind::Binary, Some(size))),
        (MARK, None) => Ok((true, PayloadKind::Binary, None)),
        _ => Err(Reject::Malformed),
    }
}

/// Decodes a message read from NATS on `subject`: with `key`, its signature first (nothing
/// unsigned is even parsed), then herald's headers, each checked against what a node writes.
/// Pure: the same input always gives the same answer, and nothing is allocated from a value a
/// header announces.
pub fn open(
    subject: &str,
    headers: Option<&HeaderMap>,
    payload: &[u8],
    key: Option<&ClusterKey>,
) -> Result<Carried, Reject> {
    if let Some(key) = key {
        key.verify(subject, headers, payload)?;
    }
    let headers = headers.ok_or(Reject::Malformed)?;
    let header = |name: &str| headers.get(name).map(|v| v.as_str());
    let id = |name: &str| {
        header(name)
            .filter(|v| (1..=MAX_ID).contains(&v.len()))
            .map(str::to_owned)
            .ok_or(Reject::Malformed)
    };
    let seq = header(SEQ)
        .and_then(decimal)
        .filter(|s| (1..u64::MAX).contains(s))
        .ok_or(Reject::Malformed)?;
    let (mark, kind, extras) = kind(header(KIND))?;
    let stamp = match header(STAMP) {
        None => None,
        Some(s) => Some(decimal(s).ok_or(Reject::Malformed)?),
    };
    let chunk = header(CHUNK).map(Chunk::parse).transpose()?;
    if mark && (!payload.is_empty() || chunk.is_some()) {
        return Err(Reject::Malformed);
    }
    // Whole, the message must hold its section; a chunk is checked once put back together.
    if chunk.is_none() && extras.is_some_and(|size| size > payload.len()) {
        return Err(Reject::Malformed);
    }
    Ok(Carried {
        origin: id(ORIGIN)?,
        epoch: id(EPOCH)?,
        seq,
        chunk,
        mark,
        kind,
        extras,
        content_type: header(CONTENT_TYPE).map(str::to_owned),
        stamp,
    })
}

impl Carried {
    /// The message whose whole body (its extras section, if any, then its payload) is `body`,
    /// received at `arrived_us`: its expiry counts from then. Refused when the body does not
    /// hold the section its `Herald-Kind` announces, or the section is malformed.
    pub fn publish(&self, topic: String, body: Bytes, arrived_us: u64) -> Result<Publish, Reject> {
        let (extras, payload) = match self.extras {
            None => (None, body),
            Some(size) if size <= body.len() => {
                let extras = extras::decode(&body[..size], arrived_us)?;
                (extras, body.slice(size..))
            }
            Some(_) => return Err(Reject::Malformed),
        };
        Ok(Publish {
            id: None,
            topic: topic.into(),
            payload,
            kind: self.kind,
            content_type: self.content_type.clone(),
            stamp: self.stamp.is_some(),
            extras,
        })
    }

    /// The message as read back from a store that received it at `stored_us` (its expiry
    /// counts from then).
    pub fn recalled(&self, topic: String, body: Bytes, stored_us: u64) -> Result<Recalled, Reject> {
        Ok(Recalled {
            publish: self.publish(topic, body, stored_us)?,
            seq: self.seq,
            at_us: self.stamp.unwrap_or(stored_us),
        })
    }
}

/// Most bytes a whole carried message may have: `max_message_bytes` of payload, and room for
/// an extras section as large as an MQTT packet's properties may be (64 KiB over the payload
/// limit) with its framing (at most 2 bytes more per 16 KiB of it).
pub fn body_limit(max_message_bytes: usize) -> usize {
    max_message_bytes
        .saturating_add(max_message_bytes / 4096)
        .saturating_add(EXTRAS_ROOM)
}

/// See [`body_limit`].
const EXTRAS_ROOM: usize = 128 << 10;

/// The extras section: what a message carries besides herald's own fields
/// ([`herald_core::extras`]), in front of its payload.
///
/// A version byte (1), then fields, each a tag byte, a length (LEB128, at most 5 bytes) and
/// that many bytes: 1 the expiry as µs left when the message left its node (8 bytes, big
/// endian), 2 retain and 3 at most once (empty: present means set), 4 the response topic
/// (UTF-8), 5 the correlation data, 6 a user property (its name's length as LEB128, the name,
/// the value; both UTF-8), repeated in order. A field of another tag is skipped, and a section
/// of another version is ignored whole, so that a later node may add to it; a field whose
/// length runs past the section, or a known field that no node writes so, is malformed.
/// Every length is checked against the bytes left before anything is taken.
pub mod extras {
    use crate::cluster::carried::Reject;
    use bytes::{BufMut, Bytes, BytesMut};
    use herald_core::extras::Extras;
    use std::sync::Arc;

    const VERSION: u8 = 1;
    const EXPIRY: u8 = 1;
    const RETAIN: u8 = 2;
    const AT_MOST_ONCE: u8 = 3;
    const RESPONSE_TOPIC: u8 = 4;
    const CORRELATION: u8 = 5;
    const USER_PROPERTY: u8 = 6;

    fn put_len(buf: &mut BytesMut, mut n: usize) {
        while n >= 0x80 {
            buf.put_u8((n as u8 & 0x7F) | 0x80);
            n >>= 7;
        }
        buf.put_u8(n as u8);
    }

    fn put_field(buf: &mut BytesMut, tag: u8, value: &[u8]) {
        buf.put_u8(tag);
        put_len(buf, value.len());
        buf.put_slice(value);
    }

    /// The section of `e` for a message leaving at `now_us`.
    pub fn encode(e: &Extras, now_us: u64) -> BytesMut {
        let mut buf = BytesMut::with_capacity(16 + e.size());
        buf.put_u8(VERSION);
        if let Some(at) = e.expires_us {
            put_field(&mut buf, EXPIRY, &at.saturating_sub(now_us).to_be_bytes());
        }
        if e.retain {
            put_field(&mut buf, RETAIN, &[]);
        }
        if e.at_most_once {
            put_field(&mut buf, AT_MOST_ONCE, &[]);
        }
        if let Some(topic) = &e.response_topic {
            put_field(&mut buf, RESPONSE_TOPIC, topic.as_bytes());
        }
        if let Some(data) = &e.correlation {
            put_field(&mut buf, CORRELATION, data);
        }
        for (name, value) in &e.user_properties {
            let mut property = BytesMut::with_capacity(5 + name.len() + value.len());
            put_len(&mut property, name.len());
            property.put_slice(name.as_bytes());
            property.put_slice(value.as_bytes());
            put_field(&mut buf, USER_PROPERTY, &property);
        }
        buf
    }

    /// Reads a length: at most 5 bytes, fitting u32.
    fn take_len(bytes: &mut &[u8]) -> Result<usize, Reject> {
        let mut n: u64 = 0;
        for i in 0..5 {
            let (&b, rest) = bytes.split_first().ok_or(Reject::Malformed)?;
            *bytes = rest;
            n |= u64::from(b & 0x7F) << (7 * i);
            if b & 0x80 == 0 {
                return u32::try_from(n)
                    .map(|n| n as usize)
                    .map_err(|_| Reject::Malformed);
            }
        }
        Err(Reject::Malformed)
    }

    /// Takes `n` bytes, if that many are left.
    fn take<'a>(bytes: &mut &'a [u8], n: usize) -> Result<&'a [u8], Reject> {
        if n > bytes.len() {
            return Err(Reject::Malformed);
        }
        let (taken, rest) = bytes.split_at(n);
        *bytes = rest;
        Ok(taken)
    }

    fn text(bytes: &[u8]) -> Result<&str, Reject> {
        std::str::from_utf8(bytes).map_err(|_| Reject::Malformed)
    }

    /// The extras of a section, for a message that arrived at `arrived_us`: none when it holds
    /// nothing this node knows.
    pub fn decode(section: &[u8], arrived_us: u64) -> Result<Option<Arc<Extras>>, Reject> {
        let Some((&version, mut fields)) = section.split_first() else {
            return Err(Reject::Malformed);
        };
        if version != VERSION {
            return Ok(None);
        }
        let mut e = Extras::default();
        while !fields.is_empty() {
            let tag = take(&mut fields, 1)?[0];
            let len = take_len(&mut fields)?;
            let value = take(&mut fields, len)?;
            let once = |present: bool| {
                if present {
                    Err(Reject::Malformed)
                } else {
                    Ok(())
                }
            };
            match tag {
                EXPIRY => {
                    once(e.expires_us.is_some())?;
                    let left = <[u8; 8]>::try_from(value).map_err(|_| Reject::Malformed)?;
                    e.expires_us = Some(arrived_us.saturating_add(u64::from_be_bytes(left)));
                }
                RETAIN | AT_MOST_ONCE => {
                    let flag = if tag == RETAIN {
                        &mut e.retain
                    } else {
                        &mut e.at_most_once
                    };
                    once(*flag || !value.is_empty())?;
                    *flag = true;
                }
                RESPONSE_TOPIC => {
                    once(e.response_topic.is_some())?;
                    e.response_topic = Some(text(value)?.into());
                }
                CORRELATION => {
                    once(e.correlation.is_some())?;
                    e.correlation = Some(Bytes::copy_from_slice(value));
                }
                USER_PROPERTY => {
                    let mut property = value;
                    let name_len = take_len(&mut property)?;
                    let name = text(take(&mut property, name_len)?)?;
                    let value = text(property)?;
                    e.user_properties.push((name.to_owned(), value.to_owned()));
                }
                _ => {}
            }
        }
        Ok(if e == Extras::default() {
            None
        } else if e == *Extras::at_most_once_alone() {
            Some(Extras::at_most_once_alone())
        } else {
            Some(Arc::new(e))
        })
    }
}

/// Smallest part of a chunked message but its last: a node sends parts of
/// `max_payload - HEADER_ROOM`, never less than `HEADER_ROOM`. With it, a message of
/// `max_message_bytes` has at most `max_message_bytes / 4096 + 1` parts.
pub const MIN_PART: usize = HEADER_ROOM;
/// Chunked messages being put back together at once, at most; past it the oldest is discarded.
pub const MAX_PARTIALS: usize = 256;
/// Bytes of parts held at once, at most, as a multiple of `max_message_bytes`; past it the
/// oldest partial message is discarded.
pub const PARTIAL_BUDGET: usize = 4;

/// A chunked message being put back together.
struct Partial {
    seq: u64,
    count: usize,
    next: usize,
    /// The size of every part but the last (the first part's size).
    part: usize,
    buf: BytesMut,
    /// When it started, in [`Reassembly`]'s own count: the smallest is discarded first.
    started: u64,
}

/// What [`Reassembly::add`] made of a chunk.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Added {
    /// The message, once whole.
    pub whole: Option<Bytes>,
    /// Incomplete messages discarded (a chunk was lost, or room was needed).
    pub discarded: u64,
    /// Why the chunk was refused, if it was.
    pub rejected: Option<Reject>,
}

/// Puts chunked messages back together, per (origin, subject): chunks of one message arrive in
/// order on one subject. Every size is checked before it is held: a first part announces the
/// message's size (`count` parts of its own size at most), which must fit `limit`; later parts
/// must be of the first one's size (the last one no larger, not empty). At most
/// [`MAX_PARTIALS`] messages and `PARTIAL_BUDGET × limit` bytes are held; past either, the
/// oldest is discarded.
#[derive(Default)]
pub struct Reassembly {
    partial: HashMap<(String, String), Partial>,
    /// Bytes held in `partial`.
    held: usize,
    started: u64,
}

impl Reassembly {
    /// Bytes of parts held now.
    pub fn held(&self) -> usize {
        self.held
    }

    /// Messages being put back together now.
    pub fn len(&self) -> usize {
        self.partial.len()
    }

    pub fn is_empty(&self) -> bool {
        self.partial.is_empty()
    }

    fn take(&mut self, key: &(String, String)) -> Option<Partial> {
        let p = self.partial.remove(key)?;
        self.held -= p.buf.len();
        Some(p)
    }

    /// Discards the oldest partial messages other than `keep` until `room` more bytes and one
    /// more message fit; returns how many were discarded.
    fn make_room(&mut self, keep: &(String, String), room: usize, budget: usize) -> u64 {
        let mut discarded = 0;
        while self.held + room > budget || self.partial.len() >= MAX_PARTIALS {
            let oldest = self
                .partial
                .iter()
                .filter(|(k, _)| *k != keep)
                .min_by_key(|(_, p)| p.started)
                .map(|(k, _)| k.clone());
            let Some(oldest) = oldest else {
                break;
            };
            self.take(&oldest);
            discarded += 1;
        }
        discarded
    }

    /// Adds `chunk` of message `seq` from `origin` on `subject`. A chunk out of order means one
    /// was lost: the partial message is discarded. A duplicate (overlapping subscriptions) is
    /// ignored.
    pub fn add(
        &mut self,
        origin: &str,
        subject: &str,
        seq: u64,
        chunk: Chunk,
        part: &[u8],
        limit: usize,
    ) -> Added {
        let key = (origin.to_owned(), subject.to_owned());
        let budget = limit.saturating_mul(PARTIAL_BUDGET);
        let current = self
            .partial
            .get(&key)
            .filter(|p| p.seq == seq && p.count == chunk.count);
        let mut added = Added::default();
        match current {
            Some(p) if chunk.index < p.next => return added,
            Some(p) if chunk.index == p.next => {
                let last = chunk.index + 1 == chunk.count;
                let fits = if last {
                    !part.is_empty() && part.len() <= p.part
                } else {
                    part.len() == p.part
                };
                let size = p.buf.len() + part.len();
                if !fits || size > limit {
                    self.take(&key);
                    added.discarded = 1;
                    added.rejected = Some(if fits {
                        Reject::TooLarge
                    } else {
                        Reject::Chunk
                    });
                    return added;
                }
                added.discarded = self.make_room(&key, part.len(), budget);
                let p = self.partial.get_mut(&key).expect("kept while making room");
                p.buf.extend_from_slice(part);
                p.next += 1;
                self.held += part.len();
                if last {
                    added.whole = self.take(&key).map(|p| p.buf.freeze());
                }
            }
            _ if chunk.index == 0 => {
                // The smallest the announced message can be: `count - 1` parts of this size and
                // a last one of at least a byte.
                let smallest = (chunk.count - 1)
                    .checked_mul(part.len())
                    .and_then(|s| s.checked_add(1));
                if part.len() < MIN_PART {
                    added.rejected = Some(Reject::Chunk);
                    return added;
                }
                if !matches!(smallest, Some(s) if s <= limit) {
                    added.rejected = Some(Reject::TooLarge);
                    return added;
                }
                added.discarded = u64::from(self.take(&key).is_some());
                added.discarded += self.make_room(&key, part.len(), budget);
                self.started += 1;
                self.partial.insert(
                    key,
                    Partial {
                        seq,
                        count: chunk.count,
                        next: 1,
                        part: part.len(),
                        buf: BytesMut::from(part),
                        started: self.started,
                    },
                );
                self.held += part.len();
            }
            _ => added.discarded = u64::from(self.take(&key).is_some()),
        }
        added
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMIT: usize = 1 << 20;

    fn message(seq: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(ORIGIN, "0123456789abcdef");
        h.insert(EPOCH, "0123456789ab");
        h.insert(SEQ, seq);
        h
    }

    fn add(r: &mut Reassembly, seq: u64, chunk: &str, part: &[u8]) -> Added {
        let chunk = Chunk::parse(chunk).unwrap();
        r.add("o", "s", seq, chunk, part, LIMIT)
    }

    #[test]
    fn open_accepts_what_a_node_writes_and_nothing_it_does_not() {
        let p = Publish {
            id: None,
            topic: "t".into(),
            payload: Bytes::from_static(b"x"),
            kind: PayloadKind::Text,
            content_type: Some("text/plain".into()),
            stamp: true,
            extras: None,
        };
        let m = Departure::message("0123456789abcdef", "h.t.t".into(), &p, "e", 7, 9);
        let c = open("h.t.t", Some(&m.headers), b"x", None).unwrap();
        assert_eq!((c.seq, c.stamp, c.mark, c.chunk), (7, Some(9), false, None));
        let mark = Departure::mark("o", "h.t.t".into(), "e", 3);
        assert!(open("h.t.t", Some(&mark.headers), b"", None).unwrap().mark);
        assert_eq!(
            open("s", Some(&mark.headers), b"x", None).unwrap_err(),
            Reject::Malformed
        );
        assert_eq!(open("s", None, b"x", None).unwrap_err(), Reject::Malformed);
        for seq in ["0", "-1", "+1", " 1", "18446744073709551615", "1e3", ""] {
            assert_eq!(
                open("s", Some(&message(seq)), b"", None).unwrap_err(),
                Reject::Malformed,
                "{seq}"
            );
        }
        for chunk in [
            "0/1",
            "2/2",
            "0/0",
            "a/2",
            "0/2/3",
            "-0/2",
            "0/99999999999999999999999",
        ] {
            let mut h = message("1");
            h.insert(CHUNK, chunk);
            assert_eq!(
                open("s", Some(&h), b"", None).unwrap_err(),
                Reject::Chunk,
                "{chunk}"
            );
        }
        let mut h = message("1");
        h.insert(ORIGIN, "o".repeat(65).as_str());
        assert_eq!(
            open("s", Some(&h), b"", None).unwrap_err(),
            Reject::Malformed
        );
        let mut h = message("1");
        h.insert(KIND, "video");
        assert_eq!(
            open("s", Some(&h), b"", None).unwrap_err(),
            Reject::Malformed
        );
    }

    fn publish(extras: Option<Extras>) -> Publish {
        Publish {
            id: None,
            topic: "t".into(),
            payload: Bytes::from_static(b"payload"),
            kind: PayloadKind::Text,
            content_type: Some("text/plain".into()),
            stamp: false,
            extras: extras.map(Arc::new),
        }
    }

    /// `p` sent at `sent_us` and received whole at `arrived_us`.
    fn carry(p: &Publish, sent_us: u64, arrived_us: u64) -> Result<Publish, Reject> {
        let d = Departure::message("0123456789abcdef", "h.t".into(), p, "e", 1, sent_us);
        let (headers, body) = d.leaving(sent_us);
        let c = open("h.t", Some(&headers), &body, None)?;
        c.publish("t".into(), body, arrived_us)
    }

    #[test]
    fn extras_travel_with_the_time_left_to_their_expiry() {
        let e = Extras {
            expires_us: Some(10_000_000),
            retain: true,
            at_most_once: true,
            response_topic: Some("reply/to".into()),
            correlation: Some(Bytes::from_static(b"\x00\xffid")),
            user_properties: vec![
                ("b".into(), "1".into()),
                ("a".into(), "".into()),
                ("b".into(), "é".repeat(100)),
            ],
        };
        let p = publish(Some(e.clone()));
        // Sent with 6 s left, received on a clock 1,000 s behind: 6 s left there too.
        let got = carry(&p, 4_000_000, 1_000).unwrap();
        assert_eq!(got.payload, p.payload);
        assert_eq!((got.kind, &got.content_type), (p.kind, &p.content_type));
        let want = Extras {
            expires_us: Some(6_001_000),
            ..e
        };
        assert_eq!(got.extras.as_deref(), Some(&want));
        // Expired before it left: expired when it arrives.
        let late = carry(&p, 20_000_000, 5).unwrap();
        assert!(late.extras.unwrap().expired(5));
        // None, and QoS 0 alone (the one shared mark), as they were.
        assert!(carry(&publish(None), 0, 0).unwrap().extras.is_none());
        let qos0 = publish(None);
        let qos0 = Publish {
            extras: Some(Extras::at_most_once_alone()),
            ..qos0
        };
        let got = carry(&qos0, 0, 0).unwrap();
        assert!(Extras::is_at_most_once_alone(got.extras.as_ref().unwrap()));
        assert_eq!(got.payload, qos0.payload);
    }

    #[test]
    fn a_message_without_extras_is_sent_as_before_and_an_unknown_section_is_skipped() {
        let p = publish(None);
        let d = Departure::message("0123456789abcdef", "h.t".into(), &p, "e", 1, 0);
        let (headers, body) = d.leaving(0);
        assert_eq!(headers.get(KIND).unwrap().as_str(), "text");
        assert_eq!(body, p.payload);
        // A later section version, or fields of tags this node does not know: the payload
        // arrives, with what the node knows of the extras.
        for (section, known) in [
            (&b"\x02anything"[..], None),
            (&b"\x01\x09\x02zz\x02\x00"[..], Some(true)),
            (&b"\x01\x09\x00"[..], None),
        ] {
            let mut h = message("1");
            h.insert(KIND, format!("binary;extras={}", section.len()).as_str());
            let body = [section, b"data"].concat();
            let c = open("s", Some(&h), &body, None).unwrap();
            let got = c.publish("t".into(), Bytes::from(body), 0).unwrap();
            assert_eq!(&got.payload[..], b"data");
            assert_eq!(got.extras.map(|e| e.retain), known);
        }
    }

    #[test]
    fn a_malformed_extras_section_is_refused() {
        let refused = |kind: &str, body: &[u8]| {
            let mut h = message("1");
            h.insert(KIND, kind);
            let body = Bytes::copy_from_slice(body);
            open("s", Some(&h), &body, None)
                .and_then(|c| c.publish("t".into(), body, 0))
                .unwrap_err()
        };
        for (kind, body) in [
            ("binary;extras=0", &b"x"[..]),
            ("binary;extras=", b"x"),
            ("binary;extras=-1", b"x"),
            ("mark;extras=1", b""),
            ("video;extras=1", b"\x01"),
            ("binary;extras=99999999999999999999", b"\x01"),
            // Larger than the message.
            ("binary;extras=5", b"\x01\x02"),
            // A length past the section, or longer than 5 bytes.
            ("text;extras=3", b"\x01\x04\x05"),
            ("text;extras=8", b"\x01\x04\xff\xff\xff\xff\xff\x01"),
            ("text;extras=7", b"\x01\x04\xff\xff\xff\xff\x7f"),
            // An expiry not of 8 bytes, a flag with a value, one field twice.
            ("text;extras=4", b"\x01\x01\x01\x00"),
            ("text;extras=4", b"\x01\x02\x01\x00"),
            ("text;extras=5", b"\x01\x02\x00\x02\x00"),
            // Not UTF-8, a name longer than its property.
            ("text;extras=4", b"\x01\x04\x01\xff"),
            ("text;extras=5", b"\x01\x06\x02\x05a"),
        ] {
            assert_eq!(refused(kind, body), Reject::Malformed, "{kind} {body:?}");
        }
    }

    #[test]
    fn signatures_cover_subject_headers_and_payload() {
        let key = ClusterKey::new(&[1; 32]);
        let mut h = message("5");
        h.insert(CHUNK, "0/2");
        key.sign("h.t.a", &mut h, b"payload");
        assert!(open("h.t.a", Some(&h), b"payload", Some(&key)).is_ok());
        assert_eq!(
            open("h.t.b", Some(&h), b"payload", Some(&key)).unwrap_err(),
            Reject::BadSignature
        );
        assert_eq!(
            open("h.t.a", Some(&h), b"payloaD", Some(&key)).unwrap_err(),
            Reject::BadSignature
        );
        let mut changed = h.clone();
        changed.insert(SEQ, "6");
        assert_eq!(
            open("h.t.a", Some(&changed), b"payload", Some(&key)).unwrap_err(),
            Reject::BadSignature
        );
        let other = ClusterKey::new(&[2; 32]);
        assert_eq!(
            open("h.t.a", Some(&h), b"payload", Some(&other)).unwrap_err(),
            Reject::BadSignature
        );
        assert_eq!(
            open("h.t.a", Some(&message("5")), b"payload", Some(&key)).unwrap_err(),
            Reject::Unsigned
        );
        assert_eq!(
            open("h.t.a", None, b"", Some(&key)).unwrap_err(),
            Reject::Unsigned
        );
        let mut garbled = h.clone();
        garbled.insert(SIGNATURE, "zz".repeat(32).as_str());
        assert_eq!(
            open("h.t.a", Some(&garbled), b"payload", Some(&key)).unwrap_err(),
            Reject::BadSignature
        );
    }

    #[test]
    fn chunks_are_bounded_before_they_are_held() {
        let mut r = Reassembly::default();
        let part = vec![7u8; MIN_PART];
        // A message announced far larger than the limit, or than memory: refused at once.
        let added = add(&mut r, 1, "0/1000000000000", &part);
        assert_eq!(added.rejected, Some(Reject::TooLarge));
        let added = add(&mut r, 1, &format!("0/{}", usize::MAX), &part);
        assert_eq!(added.rejected, Some(Reject::TooLarge));
        assert_eq!(
            add(&mut r, 1, "0/2", &part[..10]).rejected,
            Some(Reject::Chunk)
        );
        assert!(r.is_empty() && r.held() == 0);
        // Parts of another size than the first, a last part larger than the first.
        add(&mut r, 2, "0/3", &part);
        let added = add(&mut r, 2, "1/3", &part[1..]);
        assert_eq!((added.rejected, added.discarded), (Some(Reject::Chunk), 1));
        add(&mut r, 3, "0/2", &part);
        let big = vec![7u8; MIN_PART + 1];
        assert_eq!(add(&mut r, 3, "1/2", &big).rejected, Some(Reject::Chunk));
        assert!(r.is_empty() && r.held() == 0);
        // A message put back together, duplicates ignored.
        add(&mut r, 4, "0/3", &part);
        assert_eq!(add(&mut r, 4, "0/3", &part), Added::default());
        add(&mut r, 4, "1/3", &part);
        let whole = add(&mut r, 4, "2/3", b"end").whole.unwrap();
        assert_eq!(whole.len(), 2 * MIN_PART + 3);
        assert!(r.is_empty() && r.held() == 0);
    }

    #[test]
    fn partial_messages_held_are_bounded_in_count_and_bytes() {
        let mut r = Reassembly::default();
        let part = vec![7u8; MIN_PART];
        let mut discarded = 0;
        for origin in 0..MAX_PARTIALS + 10 {
            let chunk = Chunk { index: 0, count: 2 };
            discarded += r
                .add(&origin.to_string(), "s", 1, chunk, &part, LIMIT)
                .discarded;
        }
        assert_eq!((r.len(), discarded), (MAX_PARTIALS, 10));
        // Large parts: at most PARTIAL_BUDGET × the limit held.
        let mut r = Reassembly::default();
        let part = vec![7u8; LIMIT / 2];
        for origin in 0..20 {
            let chunk = Chunk { index: 0, count: 2 };
            r.add(&origin.to_string(), "s", 1, chunk, &part, LIMIT);
        }
        assert!(r.held() <= PARTIAL_BUDGET * LIMIT, "{}", r.held());
        assert_eq!(r.len(), 2 * PARTIAL_BUDGET);
    }

    #[test]
    fn a_cluster_key_file_needs_32_bytes() {
        let dir = std::env::temp_dir();
        let short = dir.join(format!("herald-short-key-{}", std::process::id()));
        std::fs::write(&short, "secret\n").unwrap();
        let err = format!("{:#}", ClusterKey::from_file(&short).unwrap_err());
        assert!(
            err.contains("at least 32") && !err.contains("secret\n"),
            "{err}"
        );
        let good = dir.join(format!("herald-good-key-{}", std::process::id()));
        std::fs::write(&good, format!("{}\n", "k".repeat(32))).unwrap();
        assert!(ClusterKey::from_file(&good).is_ok());
        let _ = (std::fs::remove_file(short), std::fs::remove_file(good));
    }
}

/// What signing costs: `cargo test -p herald-server --lib signing_cost -- --ignored --nocapture`.
#[cfg(test)]
#[test]
#[ignore]
fn signing_cost() {
    let key = ClusterKey::new(&[3; 32]);
    for size in [100, 64 << 10, 16 << 20] {
        let payload = vec![5u8; size];
        let rounds = (256 << 20) / size;
        let start = std::time::Instant::now();
        for _ in 0..rounds {
            let mut h = HeaderMap::new();
            key.sign("herald.t.a", &mut h, &payload);
        }
        let per = start.elapsed() / rounds as u32;
        println!(
            "{size} bytes: {per:?} per message, {:.2} ns/byte",
            per.as_nanos() as f64 / size as f64
        );
    }
}
