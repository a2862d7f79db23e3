//! What an engine is configured with: history rules, limits, default policies, where
//! `lossless` is allowed.

use super::*;

/// Messages a `lossless` subscription grants when its request names no `window`.
pub const DEFAULT_WINDOW: u64 = 16;

/// How much history topics keep: the first rule whose pattern matches a topic applies to it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HistoryRule {
    pub pattern: String,
    #[serde(default = "HistoryRule::default_messages")]
    pub max_messages: usize,
    #[serde(default = "HistoryRule::default_bytes")]
    pub max_bytes: usize,
    #[serde(default = "HistoryRule::default_age")]
    pub max_age_secs: u64,
}

impl HistoryRule {
    /// A rule under which the topics `pattern` matches keep only their last value.
    pub fn last_value_only(pattern: &str) -> Self {
        HistoryRule {
            pattern: pattern.into(),
            max_messages: 0,
            ..HistoryRule::default()
        }
    }

    /// Whether topics under this rule keep messages for recovery, not only the last value.
    pub fn keeps_messages(&self) -> bool {
        self.max_messages > 0
    }

    fn default_messages() -> usize {
        32
    }
    fn default_bytes() -> usize {
        1 << 20
    }
    fn default_age() -> u64 {
        300
    }
}

impl Default for HistoryRule {
    /// Every topic keeps its last 32 messages, up to 1 MiB and 5 minutes.
    fn default() -> Self {
        HistoryRule {
            pattern: ">".into(),
            max_messages: Self::default_messages(),
            max_bytes: Self::default_bytes(),
            max_age_secs: Self::default_age(),
        }
    }
}

#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// History rules, most specific first; topics no rule matches keep only their last value.
    pub history: Vec<HistoryRule>,
    pub max_subscriptions_per_connection: usize,
    pub max_message_bytes: usize,
    /// Default slow-consumer policies per topic, first match wins; else `disconnect`.
    pub policy: Vec<PolicyRule>,
    /// Patterns within which a subscription may be `lossless`: a lossless subscriber makes
    /// publishers wait for its credit, so the operator says where that is allowed.
    pub lossless_topics: Vec<String>,
    /// Most topics held at once; a publish that would create another is refused.
    pub max_topics: usize,
    /// A topic nothing was published on for this long (µs) and that no subscription matches
    /// is forgotten by [`Engine::sweep`]; 0 keeps topics for ever.
    pub topic_idle_us: u64,
    /// Topics one [`Origin`] may have created and herald still hold.
    pub max_topics_per_origin: usize,
    /// Bytes the topics one [`Origin`] created may keep; past it, it may create no more.
    pub max_retained_bytes_per_origin: usize,
}

impl EngineConfig {
    /// Whether `pattern` lies wholly within `lossless_topics`.
    pub fn allows_lossless(&self, pattern: &str) -> bool {
        self.lossless_topics
            .iter()
            .any(|g| crate::grant::covers(g, pattern))
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            policy: Vec::new(),
            lossless_topics: vec![">".into()],
            max_topics: 1_000_000,
            topic_idle_us: 3_600_000_000,
            max_topics_per_origin: 10_000,
            max_retained_bytes_per_origin: 128 << 20,
            history: vec![HistoryRule::default()],
            max_subscriptions_per_connection: 1000,
            max_message_bytes: 64 << 20,
        }
    }
}
