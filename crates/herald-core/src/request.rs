//! What a client asks of herald, whatever protocol carried it: subscribe, unsubscribe, publish,
//! ping, credit, auth. Each protocol's decoder makes these; the engine carries them out. So the
//! engine knows requests, never the bytes they came in.

use bytes::Bytes;
use compact_str::CompactString;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// A request id: any JSON number or string, echoed verbatim in the reply.
pub type RequestId = serde_json::Value;

/// How a payload was published, and so how it is delivered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PayloadKind {
    /// Valid UTF-8 (checked when published): herald's protocol delivers it as a JSON string.
    Text,
    /// Raw bytes: herald's protocol delivers them in a binary frame behind a JSON header.
    Binary,
}

/// A position in a topic's stream, as a client last saw it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Position {
    pub seq: u64,
    pub epoch: String,
}

/// A decoded client request.
#[derive(Clone, Debug, PartialEq)]
pub enum Request {
    Subscribe(Subscribe),
    Unsubscribe {
        id: Option<RequestId>,
        topic: String,
        /// Leaves this group's subscription to `topic` ([`Subscribe::group`]), rather than
        /// the connection's own.
        group: Option<String>,
    },
    Publish(Publish),
    Ping {
        id: Option<RequestId>,
    },
    /// Presents a token (the first message of a connection, or a refresh before it expires).
    /// The network layer answers it; the engine never sees it.
    Auth {
        id: Option<RequestId>,
        token: String,
    },
    /// Lossless flow control: `n` more messages and `bytes` more payload bytes granted to the
    /// subscription `topic` (either may be 0).
    Credit {
        id: Option<RequestId>,
        topic: String,
        /// The credit is the connection's as a member of this group ([`Subscribe::group`]).
        group: Option<String>,
        n: u64,
        bytes: u64,
    },
}

#[derive(Clone, Debug, PartialEq, Default)]
pub struct Subscribe {
    pub id: Option<RequestId>,
    pub topic: String,
    pub snapshot: bool,
    pub since: HashMap<String, Position>,
    /// The cursor of this subscription's first `subscribed` reply, sent back when it recovers:
    /// topics the pattern matches that `since` does not name are replayed from there.
    pub cursor: Option<String>,
    /// The slow-consumer policy asked for; `None` leaves it to the configured default.
    pub policy: Option<crate::policy::Policy>,
    /// `conflate`: at most this many messages per second per topic.
    pub max_rate: Option<f64>,
    /// `lossless`: messages granted up front.
    pub window: Option<u64>,
    /// `lossless`: payload bytes granted up front (a byte window besides, or instead of, the
    /// message window).
    pub window_bytes: Option<u64>,
    /// Join the group of this name and pattern instead ([`crate::group`]): each message goes
    /// to one of its members. A group subscription takes no recovery (`snapshot`, `since`,
    /// `cursor`).
    pub group: Option<String>,
    /// Messages this connection publishes itself do not come back through this subscription.
    pub no_local: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Publish {
    pub id: Option<RequestId>,
    /// Held inline up to 24 bytes, so that taking a topic out of a request allocates nothing.
    pub topic: CompactString,
    pub payload: Bytes,
    pub kind: PayloadKind,
    pub content_type: Option<String>,
    pub stamp: bool,
    /// What the message carries besides (see [`crate::extras`]); most carry nothing.
    pub extras: Option<std::sync::Arc<crate::extras::Extras>>,
}

/// A request that could not be decoded or carried out: a stable code and a message for people.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ProtocolError {
    pub id: Option<RequestId>,
    pub code: &'static str,
    pub message: String,
}

impl ProtocolError {
    pub fn new(code: &'static str, message: impl Into<String>) -> Self {
        ProtocolError {
            id: None,
            code,
            message: message.into(),
        }
    }

    pub fn with_id(mut self, id: Option<RequestId>) -> Self {
        self.id = id;
        self
    }
}

/// `bytes` as text, or why not. Most frames are ASCII, which `is_ascii` confirms a word at a
/// time; `std::str::from_utf8` checks the rest, at several times the ASCII test's cost.
pub fn utf8(bytes: &[u8]) -> Result<&str, std::str::Utf8Error> {
    if bytes.is_ascii() {
        // SAFETY: ASCII is UTF-8.
        Ok(unsafe { std::str::from_utf8_unchecked(bytes) })
    } else {
        std::str::from_utf8(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config::with_cases(5000))]
        /// The ASCII shortcut accepts and refuses exactly what std's UTF-8 check does.
        #[test]
        fn utf8_agrees_with_std(
            bytes in proptest::collection::vec(
                proptest::prop_oneof![8 => 0u8..0x80, 1 => 0x80u8..=0xff],
                0..40,
            )
        ) {
            proptest::prop_assert_eq!(utf8(&bytes), std::str::from_utf8(&bytes));
        }
    }
}
