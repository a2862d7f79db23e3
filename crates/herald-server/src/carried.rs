//! How a herald message travels on NATS between nodes (and is stored in JetStream): its
//! `Herald-*` headers, the chunks of a message larger than NATS's `max_payload`, and position
//! announcements. See docs/cluster.md, "Headers".

use async_nats::HeaderMap;
use bytes::{Bytes, BytesMut};
use herald_core::engine::Recalled;
use herald_core::wire::{PayloadKind, Publish};
use std::collections::HashMap;

pub const ORIGIN: &str = "Herald-Origin";
pub const EPOCH: &str = "Herald-Epoch";
pub const SEQ: &str = "Herald-Seq";
pub const KIND: &str = "Herald-Kind";
pub const CONTENT_TYPE: &str = "Herald-Content-Type";
pub const STAMP: &str = "Herald-Stamp";
pub const CHUNK: &str = "Herald-Chunk";
/// `Herald-Kind` of a position announcement (see [`Outgoing::mark`]).
const MARK: &str = "mark";
/// Room left in each NATS message for the headers above.
pub const HEADER_ROOM: usize = 4096;
/// A message (or announcement) on its way to NATS.
pub struct Outgoing {
    pub subject: String,
    pub headers: HeaderMap,
    pub payload: Bytes,
    /// A position announcement ([`Outgoing::mark`]), not counted as a message.
    pub mark: bool,
}

impl Outgoing {
    /// Message `p`, published on node `origin` and numbered `(epoch, seq)` there, received at
    /// `now_us`.
    pub fn message(
        origin: &str,
        subject: String,
        p: &Publish,
        epoch: &str,
        seq: u64,
        now_us: u64,
    ) -> Outgoing {
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
        Outgoing {
            subject,
            headers,
            payload: p.payload.clone(),
            mark: false,
        }
    }

    /// A position announcement: `subject`'s topic reached `seq` in `epoch` on node `origin`. It
    /// carries no message; a node that holds less of that epoch learns the exact hole
    /// ([`Engine::remote_reached`](herald_core::engine::Engine::remote_reached)).
    pub fn mark(origin: &str, subject: String, epoch: &str, seq: u64) -> Outgoing {
        let mut headers = numbered(origin, epoch, seq);
        headers.insert(KIND, MARK);
        Outgoing {
            subject,
            headers,
            payload: Bytes::new(),
            mark: true,
        }
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

/// The herald headers of a message carried between nodes (or stored in JetStream).
pub struct Carried {
    pub origin: String,
    pub epoch: String,
    pub seq: u64,
    /// `Herald-Chunk: i/n` of a message sent in parts.
    pub chunk: Option<String>,
    /// A position announcement, not a message.
    pub mark: bool,
    kind: PayloadKind,
    content_type: Option<String>,
    /// The publisher's `stamp` time (µs).
    pub stamp: Option<u64>,
}

impl Carried {
    /// `None` for a message without herald's headers (not one of ours).
    pub fn from_headers(headers: Option<&HeaderMap>) -> Option<Carried> {
        let headers = headers?;
        let header = |name: &str| headers.get(name).map(|v| v.as_str().to_owned());
        let kind = header(KIND);
        Some(Carried {
            origin: header(ORIGIN)?,
            epoch: header(EPOCH)?,
            seq: header(SEQ)?.parse().ok()?,
            chunk: header(CHUNK),
            mark: kind.as_deref() == Some(MARK),
            kind: match kind.as_deref() {
                Some("text") => PayloadKind::Text,
                _ => PayloadKind::Binary,
            },
            content_type: header(CONTENT_TYPE),
            stamp: header(STAMP).and_then(|s| s.parse().ok()),
        })
    }

    pub fn publish(&self, topic: String, payload: Bytes) -> Publish {
        Publish {
            id: None,
            topic: topic.into(),
            payload,
            kind: self.kind,
            content_type: self.content_type.clone(),
            stamp: self.stamp.is_some(),
        }
    }

    /// The message as read back from a store that received it at `stored_us`.
    pub fn recalled(&self, topic: String, payload: Bytes, stored_us: u64) -> Recalled {
        Recalled {
            publish: self.publish(topic, payload),
            seq: self.seq,
            at_us: self.stamp.unwrap_or(stored_us),
        }
    }
}

/// A chunked message being put back together.
struct Partial {
    seq: u64,
    next: usize,
    buf: BytesMut,
}

/// Puts chunked messages back together, per (origin, subject): chunks of one message arrive in
/// order on one subject.
#[derive(Default)]
pub struct Reassembly {
    partial: HashMap<(String, String), Partial>,
}

impl Reassembly {
    /// Adds chunk `i/n` (the `Herald-Chunk` header) of message `seq`; returns the message once
    /// whole, and whether an incomplete one was discarded. A chunk out of order means one was
    /// lost: the partial message is discarded.
    pub fn add(
        &mut self,
        origin: &str,
        subject: &str,
        seq: u64,
        chunk: &str,
        part: &Bytes,
        limit: usize,
    ) -> (Option<Bytes>, bool) {
        let Some((i, n)) = chunk.split_once('/') else {
            return (None, false);
        };
        let (Ok(i), Ok(n)) = (i.parse::<usize>(), n.parse::<usize>()) else {
            return (None, false);
        };
        let partials = &mut self.partial;
        let key = (origin.to_owned(), subject.to_owned());
        let current = partials.get_mut(&key).filter(|p| p.seq == seq);
        let mut discarded = false;
        match current {
            Some(p) if i < p.next => return (None, false), // a duplicate (overlapping subscriptions)
            Some(p) if i == p.next && p.buf.len() + part.len() <= limit => {
                p.buf.extend_from_slice(part);
                p.next += 1;
            }
            _ if i == 0 => {
                discarded = partials.remove(&key).is_some();
                let mut buf = BytesMut::with_capacity(part.len() * n);
                buf.extend_from_slice(part);
                partials.insert(key.clone(), Partial { seq, next: 1, buf });
            }
            _ => return (None, partials.remove(&key).is_some()),
        }
        if partials.get(&key).is_some_and(|p| p.next == n) {
            return (partials.remove(&key).map(|p| p.buf.freeze()), discarded);
        }
        (None, discarded)
    }
}
