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
