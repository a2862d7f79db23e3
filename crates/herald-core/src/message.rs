//! A message as herald holds it, whatever protocol published it or will deliver it: its topic
//! and numbering, its payload, and beside it the bytes each protocol made of it.
//!
//! A [`Message`] is one `Arc`: history, the last value, recoveries and every subscriber's queue
//! share it, and handing it on costs a reference count. Protocols encode it when it leaves a
//! queue, not when it is published: a message that is conflated or dropped before it goes out
//! is never encoded, and one that goes out is encoded once per protocol that sends it, the
//! bytes cached in the message (one lock-free slot per protocol, [`Message::encoded`]), so every
//! subscriber of that protocol is handed the same bytes. A message a history keeps lets them go
//! once a newer one of its topic follows and no queue holds it ([`Message::forget_encodings`]).
//!
//! The core names no protocol: a slot is a number below [`ENCODING_SLOTS`] that a codec owns.
//! A codec whose bytes differ per subscriber (a subscription id in every message) takes no slot
//! and encodes for each.

use crate::codec::Frame;
use crate::extras::Extras;
use crate::request::PayloadKind;
use bytes::Bytes;
use std::num::NonZeroU64;
use std::sync::{Arc, OnceLock};

/// Protocols that may cache a message's encoding (herald's own, and one more). Slot 0, herald's
/// own protocol's (which most subscribers speak), is held in the message's block (72 bytes);
/// each other slot costs every message 16 bytes there and, once used, a block of its own:
/// raise it only for a protocol that caches.
pub const ENCODING_SLOTS: usize = 2;

/// What a message's size counts besides its payload, topic, epoch and content type: about what
/// a protocol's framing and fixed fields take (herald's JSON header with its sequence number
/// is 50–60 bytes). See [`Message::size`].
pub const MESSAGE_OVERHEAD: usize = 64;

/// What every message of a topic shares under one numbering (a topic's epoch): its name and
/// epoch, and, per codec slot, bytes the codec builds from them once (herald's JSON writes its
/// escaped topic and epoch there, rather than escaping them again for every message).
#[derive(Debug)]
pub struct TopicHead {
    name: Arc<str>,
    epoch: Box<str>,
    prefixes: [OnceLock<Prefix>; ENCODING_SLOTS],
}

/// A codec's bytes for a topic's numbering, and one place in them (herald's JSON: where the
/// sequence number goes).
#[derive(Debug)]
pub struct Prefix {
    pub bytes: Box<[u8]>,
    pub at: usize,
}

impl TopicHead {
    pub fn new(name: Arc<str>, epoch: String) -> Arc<Self> {
        Arc::new(TopicHead {
            name,
            epoch: epoch.into_boxed_str(),
            prefixes: Default::default(),
        })
    }

    pub fn name(&self) -> &Arc<str> {
        &self.name
    }

    pub fn epoch(&self) -> &str {
        &self.epoch
    }

    /// The prefix of codec slot `slot`, built by `build` the first time it is asked for.
    pub fn prefix(&self, slot: usize, build: impl FnOnce(&TopicHead) -> Prefix) -> &Prefix {
        self.prefixes[slot].get_or_init(|| build(self))
    }
}

/// A numbered message, shared (see the module's documentation).
///
/// Memory: one allocation of 192 bytes (a mimalloc size class) holding its numbering's
/// [`TopicHead`] (shared), seq, receive stamp, payload handle, content type, its [`Extras`]
/// if it has any (shared) and the [`ENCODING_SLOTS`] cached encodings (empty until a protocol
/// sends it); plus the payload's own bytes, and each cached encoding's bytes once made (in a
/// block of their own for a slot other than 0). A history keeps many messages, mostly small:
/// every byte here is a byte of each.
#[derive(Clone, Debug)]
pub struct Message(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    head: Arc<TopicHead>,
    seq: u64,
    /// The receive time, if asked for; a clock reading zero (1970) stamps nothing, so that the
    /// field takes 8 bytes rather than 16.
    stamp_us: Option<NonZeroU64>,
    payload: Bytes,
    content_type: Option<Box<str>>,
    kind: PayloadKind,
    /// [`Message::size`], counted once: every queue it joins asks for it. 32 bits, so that
    /// `extras` fits the block: a larger message counts as 4 GiB.
    size: u32,
    extras: Option<Arc<Extras>>,
    /// Slot 0's encoding.
    encoded: OnceLock<Frame>,
    /// The other slots' encodings, boxed: 16 bytes each rather than 72 keeps the block in the
    /// 192-byte size class.
    encoded_boxed: [OnceLock<Box<Frame>>; ENCODING_SLOTS - 1],
}

// What each message held costs (the block and `Arc`'s two counts); grows only on purpose (see
// [`Message`]).
const _: () = assert!(std::mem::size_of::<Inner>() + 16 <= 192);

impl Message {
    /// Message `seq` of `head`'s numbering. `payload` is kept as it is: the caller makes sure
    /// it is not a slice of a larger buffer that keeping it would keep alive.
    pub fn new(
        head: Arc<TopicHead>,
        seq: u64,
        kind: PayloadKind,
        payload: Bytes,
        content_type: Option<Box<str>>,
        stamp_us: Option<u64>,
    ) -> Self {
        let size = payload.len()
            + head.name.len()
            + head.epoch.len()
            + content_type.as_deref().map_or(0, str::len)
            + MESSAGE_OVERHEAD;
        Message(Arc::new(Inner {
            head,
            seq,
            stamp_us: stamp_us.and_then(NonZeroU64::new),
            payload,
            content_type,
            kind,
            size: u32::try_from(size).unwrap_or(u32::MAX),
            extras: None,
            encoded: OnceLock::new(),
            encoded_boxed: Default::default(),
        }))
    }

    /// The message with `extras`, counted in its size. Called on a message just made (not yet
    /// shared); a shared one is returned as it is.
    #[inline]
    pub fn with_extras(mut self, extras: Option<Arc<Extras>>) -> Self {
        let Some(extras) = extras else {
            return self;
        };
        if let Some(inner) = Arc::get_mut(&mut self.0) {
            let size = inner.size as usize + extras.size();
            inner.size = u32::try_from(size).unwrap_or(u32::MAX);
            inner.extras = Some(extras);
        }
        self
    }

    /// What it carries besides herald's own fields, if anything.
    pub fn extras(&self) -> Option<&Arc<Extras>> {
        self.0.extras.as_ref()
    }

    /// Whether it has expired at `now_us` (µs since the UNIX epoch); most messages never do.
    pub fn expired(&self, now_us: u64) -> bool {
        self.0.extras.as_ref().is_some_and(|e| e.expired(now_us))
    }

    /// Its topic's numbering.
    pub fn head(&self) -> &TopicHead {
        &self.0.head
    }

    pub fn topic(&self) -> &str {
        &self.0.head.name
    }

    pub fn epoch(&self) -> &str {
        &self.0.head.epoch
    }

    pub fn seq(&self) -> u64 {
        self.0.seq
    }

    pub fn kind(&self) -> PayloadKind {
        self.0.kind
    }

    pub fn payload(&self) -> &Bytes {
        &self.0.payload
    }

    pub fn content_type(&self) -> Option<&str> {
        self.0.content_type.as_deref()
    }

    /// herald's receive time (µs since the UNIX epoch), when the publisher asked for it.
    pub fn stamp_us(&self) -> Option<u64> {
        self.0.stamp_us.map(NonZeroU64::get)
    }

    /// The message as codec slot `slot` encodes it: `encode` runs the first time, and every
    /// later call (on any thread) shares its bytes. Borrowed, so that a codec that sends a
    /// slice of it pays for no clone of the whole.
    pub fn encoded(&self, slot: usize, encode: impl FnOnce(&Message) -> Frame) -> &Frame {
        match slot.checked_sub(1) {
            None => self.0.encoded.get_or_init(|| encode(self)),
            Some(boxed) => self.0.encoded_boxed[boxed].get_or_init(|| Box::new(encode(self))),
        }
    }

    /// Lets the cached encodings go, if nothing else holds the message (they would be freed
    /// for a holder that still sends them): a later [`Message::encoded`] makes them again.
    pub fn forget_encodings(&mut self) {
        if let Some(inner) = Arc::get_mut(&mut self.0) {
            inner.encoded.take();
            for slot in &mut inner.encoded_boxed {
                slot.take();
            }
        }
    }

    /// What holding this message for a connection counts against its bounds (queue, recovery)
    /// and what history counts it as: payload, topic, epoch, content type and extras plus
    /// [`MESSAGE_OVERHEAD`]. Known before any protocol encodes it, the same for every
    /// protocol, and close to herald's own encoding's length.
    pub fn size(&self) -> usize {
        self.0.size as usize
    }

    /// Starts loading the message's own block (see [`crate::prefetch`]).
    pub fn prefetch(&self) {
        crate::prefetch::prefetch(Arc::as_ptr(&self.0), size_of::<Inner>());
    }

    /// Whether `self` and `other` are the same message (not merely equal).
    pub fn same(&self, other: &Message) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn a_slot_is_encoded_once_and_shared() {
        let head = TopicHead::new("a/b".into(), "e1".into());
        let m = Message::new(
            head,
            7,
            PayloadKind::Binary,
            Bytes::from_static(b"xyz"),
            None,
            None,
        );
        let calls = Cell::new(0);
        let encode = |m: &Message| {
            calls.set(calls.get() + 1);
            Frame {
                head: Bytes::from(m.seq().to_be_bytes().to_vec()),
                body: m.payload().clone(),
            }
        };
        let copy = m.clone();
        let (a, b) = (
            m.encoded(0, encode).clone(),
            copy.encoded(0, encode).clone(),
        );
        assert_eq!(calls.get(), 1);
        assert_eq!(a.head.as_ptr(), b.head.as_ptr());
        m.encoded(1, encode);
        assert_eq!(calls.get(), 2, "another slot encodes for itself");
        assert_eq!(m.size(), 3 + 3 + 2 + MESSAGE_OVERHEAD);
    }

    #[test]
    fn extras_count_in_the_size_and_carry_the_expiry() {
        let extras = || {
            Some(Arc::new(Extras {
                expires_us: Some(5),
                user_properties: vec![("k".into(), "vv".into())],
                ..Extras::default()
            }))
        };
        let head = TopicHead::new("a".into(), "e".into());
        let plain = Message::new(head, 1, PayloadKind::Binary, Bytes::new(), None, None);
        let shared = plain.clone().with_extras(extras());
        assert!(
            shared.extras().is_none(),
            "a shared message is left as it is"
        );
        drop(plain);
        let m = shared.with_extras(extras());
        assert_eq!(m.size(), 1 + 1 + MESSAGE_OVERHEAD + 3);
        assert!(!m.expired(4) && m.expired(5));
    }
}
