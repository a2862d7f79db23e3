//! What a protocol turns the engine's neutral outcomes into: the bytes a connection writes.
//!
//! The engine and the outbound queue deal in messages, replies and notices ([`crate::message`],
//! [`crate::reply`]); each connection speaks one protocol, whose [`Encode`] makes them bytes
//! when they leave its queue. A codec whose bytes for a message are the same on every connection
//! caches them in the message ([`Message::encoded`]), so a message is encoded at most once per
//! such protocol, and only if it goes out.

use crate::group::Group;
use crate::message::Message;
use crate::reply::{DropReason, Reply};
use bytes::Bytes;
use std::sync::Arc;

/// Bytes a connection writes, in two parts shared by refcount: every connection sent the same
/// message is handed the same bytes.
///
/// `head` holds the protocol's framing and headers; `body` holds the payload where the
/// protocol carries it as it is, so that a large payload is never copied into the frame.
#[derive(Clone, Debug, Default)]
pub struct Frame {
    pub head: Bytes,
    pub body: Bytes,
}

impl Frame {
    /// Total bytes this frame occupies on the wire.
    pub fn len(&self) -> usize {
        self.head.len() + self.body.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The whole frame as one contiguous buffer (tests and small control frames).
    pub fn to_vec(&self) -> Vec<u8> {
        [&self.head[..], &self.body[..]].concat()
    }
}

/// One protocol's encoding of what herald sends a connection.
pub trait Encode {
    /// A message, live or recovered, appended to `out` as the frames it takes: one for most
    /// protocols; STOMP writes a MESSAGE per matching subscription, and ends each with a NUL
    /// after the payload, a frame of its own so that the payload is never copied. A codec
    /// whose bytes are the same for every connection builds them through
    /// [`Message::encoded`] with its own slot.
    fn message(&self, message: &Message, out: &mut Vec<Frame>);

    /// A message delivered to the connection as a member of `group` ([`crate::group`]): a
    /// protocol that tells its subscriptions apart sends it for that one alone. Others send it
    /// as any message.
    fn grouped(&self, message: &Message, _group: &Arc<Group>, out: &mut Vec<Frame>) {
        self.message(message, out)
    }

    /// A reply to one of the connection's requests.
    fn reply(&self, reply: &Reply) -> Frame;

    /// Whether the connection ends once `reply` has been sent (STOMP ends it after every
    /// ERROR, and after the RECEIPT of a DISCONNECT). Asked before [`Encode::reply`].
    fn closes_after(&self, _reply: &Reply) -> bool {
        false
    }

    /// `count` messages of `topic` did not reach the connection, for `reason`.
    fn dropped(&self, topic: &str, count: u64, reason: DropReason) -> Frame;

    /// The next `count` messages are more of subscription `pattern`'s snapshot, recovered and
    /// not live ([`crate::engine::snapshot`]); `None` for a protocol whose clients need not
    /// tell them apart.
    fn snapshot(&self, _pattern: &str, _count: usize) -> Option<Frame> {
        None
    }
}
