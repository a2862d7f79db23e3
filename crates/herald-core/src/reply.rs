//! What herald answers, whatever protocol carries it: replies to requests and the notices of
//! messages a connection did not receive. Each protocol's encoder writes these; the engine
//! only makes them.

use crate::request::{ProtocolError, RequestId};
use serde::Serialize;

/// Server replies (everything but messages). Not on the fan-out path: serde is fine here.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum Reply {
    Subscribed {
        #[serde(skip_serializing_if = "Option::is_none")]
        id: Option<RequestId>,
        topic: String,
        recovered: bool,
        replayed: usize,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        gaps: Vec<Gap>,
        /// Where this subscription took effect: sent back with `since` when it recovers.
        cursor: String,
    },
    Unsubscribed {
        #[serde(skip_serializing_if = "Option::is_none")]
        id: Option<RequestId>,
        topic: String,
    },
    Ack {
        id: RequestId,
        topic: String,
        seq: u64,
    },
    Pong {
        #[serde(skip_serializing_if = "Option::is_none")]
        id: Option<RequestId>,
    },
    /// A token was accepted; `exp` is when it lapses (UNIX seconds), absent if it never does.
    Authed {
        #[serde(skip_serializing_if = "Option::is_none")]
        id: Option<RequestId>,
        #[serde(skip_serializing_if = "Option::is_none")]
        exp: Option<u64>,
    },
    Error {
        #[serde(skip_serializing_if = "Option::is_none")]
        id: Option<RequestId>,
        code: &'static str,
        message: String,
    },
}

impl From<ProtocolError> for Reply {
    fn from(e: ProtocolError) -> Self {
        Reply::Error {
            id: e.id,
            code: e.code,
            message: e.message,
        }
    }
}

/// Why a subscriber's requested history could not be replayed in full.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum GapReason {
    /// Messages `from..=to` are no longer held.
    HistoryTrimmed { from: u64, to: u64 },
    /// The topic's history was lost; sequence numbers restarted under `epoch`.
    EpochChanged { epoch: String },
    /// Nothing is held of the topic.
    UnknownTopic,
    /// Messages `from..=to` are held but were not replayed: the recovery (replay and snapshot)
    /// was larger than the connection's `max_recovery_bytes`; the newest were sent.
    RecoveryLimit { from: u64, to: u64 },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Gap {
    pub topic: String,
    #[serde(flatten)]
    pub reason: GapReason,
}

/// Why messages of a topic did not reach a connection (a `dropped` notice's reason).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DropReason {
    /// The connection's `drop` policy let them go to make room.
    Drop,
    /// Its `conflate` policy replaced them with a newer value.
    Conflate,
    /// They never arrived from the node that numbered them.
    Remote,
}

impl DropReason {
    /// The reason as the protocol names it.
    pub fn as_str(self) -> &'static str {
        match self {
            DropReason::Drop => "drop",
            DropReason::Conflate => "conflate",
            DropReason::Remote => "remote",
        }
    }
}
