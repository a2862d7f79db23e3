//! Slow-consumer policies: what herald does for a subscriber that reads slower than its topics
//! are published (see `docs/semantics.md`).
//!
//! A policy is chosen per subscription (`"policy"` in the subscribe request) or, when the
//! subscription leaves it out, per topic by the first configured [`PolicyRule`] whose pattern
//! matches the topic (else `disconnect`). A connection receives each message once even when
//! several of its subscriptions match; the policy that promises most among them applies
//! ([`Policy::rank`]).

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// Past the outbound limit, close the connection (4008 `slow consumer`).
    #[default]
    Disconnect,
    /// Past the outbound limit, drop whole messages, oldest first, and say so (`dropped`).
    Drop,
    /// While behind, keep only the newest message per topic (optionally at most `max_rate`/s).
    Conflate,
    /// Credit-based flow control: never more than the subscriber granted; publishers wait.
    Lossless,
}

impl Policy {
    /// Which policy wins when several subscriptions of one connection match a topic: the one
    /// that promises most. `lossless` loses nothing; `disconnect` loses nothing without ending
    /// the connection (the client recovers with `since`); `drop` delivers whole messages with a
    /// count of the missing; `conflate` only the newest values.
    pub fn rank(self) -> u8 {
        match self {
            Policy::Lossless => 3,
            Policy::Disconnect => 2,
            Policy::Drop => 1,
            Policy::Conflate => 0,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Policy::Disconnect => "disconnect",
            Policy::Drop => "drop",
            Policy::Conflate => "conflate",
            Policy::Lossless => "lossless",
        }
    }
}

/// The default policy of the topics a pattern matches (`[[policy]]` in the configuration).
/// `lossless` cannot be a default: it needs a client that grants credit.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyRule {
    pub pattern: String,
    pub policy: Policy,
    /// `conflate`: at most this many messages per second per topic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_rate: Option<f64>,
}

impl PolicyRule {
    /// Why the rule cannot be used, if it cannot.
    pub fn problem(&self) -> Option<String> {
        if let Err(e) = crate::topic::validate_pattern(&self.pattern) {
            return Some(e.to_string());
        }
        if self.policy == Policy::Lossless {
            return Some("`lossless` cannot be a default policy: a subscriber must ask for it (and grant credit)".into());
        }
        if self.max_rate.is_some_and(|r| !(r > 0.0 && r.is_finite())) {
            return Some("`max_rate` must be a positive number of messages per second".into());
        }
        None
    }
}

/// What the outbound queue does with one delivered message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueuePolicy {
    /// Never dropped: past the bound the connection is closed (`disconnect`, `lossless`).
    Keep,
    /// Oldest first, past the bound.
    Drop,
    /// Replaced by a newer message of the same topic while still queued, and held back until
    /// `min_interval_us` after the topic's previous delivery (0: no throttle).
    Conflate { min_interval_us: u64 },
}

impl QueuePolicy {
    #[inline]
    pub fn of(policy: Policy, max_rate: Option<f64>) -> QueuePolicy {
        match policy {
            Policy::Disconnect | Policy::Lossless => QueuePolicy::Keep,
            Policy::Drop => QueuePolicy::Drop,
            Policy::Conflate => QueuePolicy::Conflate {
                min_interval_us: max_rate.map_or(0, |r| (1e6 / r) as u64),
            },
        }
    }
}

/// What a `lossless` subscription still grants: messages, and payload bytes when it asked for a
/// byte window (`window_bytes`). A message goes only if it fits both; herald never exceeds
/// either. Bytes count payloads as the subscriber receives them: the `data` string's UTF-8
/// bytes of a text message, the bytes after the header of a binary one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Credit {
    messages: u64,
    /// `None`: no byte window (only messages are counted).
    bytes: Option<u64>,
}

impl Credit {
    /// The grant of a new subscription: `window` messages (unlimited when only a byte window is
    /// asked for, else `default_window`) and `window_bytes` bytes.
    pub fn new(window: Option<u64>, window_bytes: Option<u64>, default_window: u64) -> Credit {
        let messages = match (window, window_bytes) {
            (Some(n), _) => n,
            (None, Some(_)) => u64::MAX,
            (None, None) => default_window,
        };
        Credit {
            messages,
            bytes: window_bytes,
        }
    }

    /// Whether a message with a payload of `len` bytes may go now.
    #[inline]
    pub fn covers(&self, len: usize) -> bool {
        self.messages > 0 && self.bytes.is_none_or(|b| b >= len as u64)
    }

    /// Spends one message of `len` payload bytes (call after [`Credit::covers`]).
    #[inline]
    pub fn spend(&mut self, len: usize) {
        self.messages = self.messages.saturating_sub(1);
        if let Some(b) = &mut self.bytes {
            *b = b.saturating_sub(len as u64);
        }
    }

    /// `{"op":"credit"}`: `n` more messages, `bytes` more bytes (ignored without a byte window:
    /// bytes are then not limited).
    pub fn grant(&mut self, n: u64, bytes: u64) {
        self.messages = self.messages.saturating_add(n);
        if let Some(b) = &mut self.bytes {
            *b = b.saturating_add(bytes);
        }
    }
}

#[cfg(test)]
mod credit_tests {
    use super::Credit;

    #[test]
    fn a_message_goes_only_within_both_windows() {
        let mut c = Credit::new(Some(2), Some(100), 16);
        assert!(c.covers(60));
        c.spend(60);
        assert!(!c.covers(41), "40 bytes left");
        assert!(c.covers(40));
        c.spend(40);
        assert!(!c.covers(0), "no message left");
        c.grant(1, 0);
        assert!(c.covers(0) && !c.covers(1));
        c.grant(0, 10);
        assert!(c.covers(10));

        let mut bytes_only = Credit::new(None, Some(10), 16);
        for _ in 0..1000 {
            bytes_only.spend(0);
        }
        assert!(bytes_only.covers(10) && !bytes_only.covers(11));

        let mut messages_only = Credit::new(None, None, 3);
        messages_only.grant(0, 1 << 40);
        assert!(messages_only.covers(usize::MAX));
        for _ in 0..3 {
            messages_only.spend(1 << 30);
        }
        assert!(!messages_only.covers(0));
    }
}
