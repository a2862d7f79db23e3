//! Prometheus metrics, served as text at `GET /metrics`.
//!
//! Counters on the hot path are resolved once (label lookups cost a lock and a hash) and kept as
//! plain handles; gauges that mirror engine state are filled in at scrape time.

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Source {
    pub source: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Reason {
    pub reason: &'static str,
}

/// A slow-consumer policy's action, and the configured `[[policy]]` pattern of the topic it
/// acted on (`none` when no rule matched the topic).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PolicyLabels {
    pub reason: &'static str,
    pub pattern: String,
}

/// What a slow-consumer policy did. Each has one counter per configured rule (plus one for
/// topics no rule matches), resolved at startup so counting costs one atomic add.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PolicyAction {
    /// `drop`: a whole message dropped.
    Drop,
    /// `conflate`: a message superseded by a newer one of its topic.
    Conflate,
    /// `disconnect` (or a `lossless` window larger than the queue): connection closed, 4008.
    Disconnect,
    /// `lossless`: a publisher made to wait for a subscriber's credit.
    Hold,
    /// `lossless`: a subscriber closed because it granted no credit within the hold timeout.
    LosslessTimeout,
}

impl PolicyAction {
    const ALL: [PolicyAction; 5] = [
        PolicyAction::Drop,
        PolicyAction::Conflate,
        PolicyAction::Disconnect,
        PolicyAction::Hold,
        PolicyAction::LosslessTimeout,
    ];

    fn label(self) -> &'static str {
        match self {
            PolicyAction::Drop => "drop",
            PolicyAction::Conflate => "conflate",
            PolicyAction::Disconnect => "slow_consumer",
            PolicyAction::Hold => "lossless_hold",
            PolicyAction::LosslessTimeout => "lossless_timeout",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Code {
    pub code: &'static str,
}

/// Why a connection ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Disconnect {
    ClientClosed,
    SlowConsumer,
    FrameTooLarge,
    InvalidUtf8,
    ProtocolError,
    IoError,
    Shutdown,
    /// No valid token (4003).
    Unauthorized,
    /// The token lapsed without a refresh (4001).
    TokenExpired,
    /// Sent more frames or bytes per second than allowed (1008).
    RateLimited,
    /// Nothing arrived, not even a pong, for the idle timeout (1001).
    Idle,
    /// Shed, unauthenticated, to make room for a newer connection (1013).
    Shed,
    /// Its partly received message would exceed `limits.max_partial_bytes` (1013).
    Busy,
    /// Another connection took its MQTT session over (the same client identifier).
    TakenOver,
}

impl Disconnect {
    pub fn label(self) -> &'static str {
        match self {
            Disconnect::ClientClosed => "client_closed",
            Disconnect::SlowConsumer => "slow_consumer",
            Disconnect::FrameTooLarge => "frame_too_large",
            Disconnect::InvalidUtf8 => "invalid_utf8",
            Disconnect::ProtocolError => "protocol_error",
            Disconnect::IoError => "io_error",
            Disconnect::Shutdown => "shutdown",
            Disconnect::Unauthorized => "unauthorized",
            Disconnect::TokenExpired => "token_expired",
            Disconnect::RateLimited => "rate_limited",
            Disconnect::Idle => "idle",
            Disconnect::Shed => "shed",
            Disconnect::Busy => "server_busy",
            Disconnect::TakenOver => "taken_over",
        }
    }
}

pub struct Metrics {
    registry: Registry,
    pub connections: Gauge,
    pub connections_total: Counter,
    pub connections_refused: Family<Reason, Counter>,
    /// Accepted sockets open (HTTP and WebSocket), as counted against `max_connections`.
    pub sockets: Gauge,
    /// Unauthenticated sockets closed to make room, by the limit that was reached.
    pub connections_shed: Family<Reason, Counter>,
    pub subscriptions: Gauge,
    pub topics: Gauge,
    /// Topics forgotten for being idle with no subscriber (see `Engine::sweep`).
    pub topics_forgotten: Counter,
    pub messages_in_ws: Counter,
    pub messages_in_http: Counter,
    pub bytes_in_ws: Counter,
    pub bytes_in_http: Counter,
    pub deliveries: Counter,
    pub frames_out: Counter,
    pub bytes_out: Counter,
    pub disconnects: Family<Reason, Counter>,
    /// `[action][rule]`, the last rule slot standing for "no rule".
    policy: Vec<Vec<Counter>>,
    pub request_errors: Family<Code, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new(&[])
    }
}

impl Metrics {
    /// Metrics for a server whose `[[policy]]` rules have these patterns.
    pub fn new(policy_patterns: &[String]) -> Self {
        let mut registry = Registry::with_prefix("herald");
        let messages_in = Family::<Source, Counter>::default();
        let bytes_in = Family::<Source, Counter>::default();
        // One statement each: `get_or_create` returns a read guard, and a second call while a
        // guard from the same statement is alive would wait for it forever.
        let messages_in_ws = messages_in.get_or_create(&Source { source: "ws" }).clone();
        let messages_in_http = messages_in
            .get_or_create(&Source { source: "http" })
            .clone();
        let bytes_in_ws = bytes_in.get_or_create(&Source { source: "ws" }).clone();
        let bytes_in_http = bytes_in.get_or_create(&Source { source: "http" }).clone();
        let m = Metrics {
            connections: Gauge::default(),
            connections_total: Counter::default(),
            connections_refused: Family::default(),
            sockets: Gauge::default(),
            connections_shed: Family::default(),
            subscriptions: Gauge::default(),
            topics: Gauge::default(),
            topics_forgotten: Counter::default(),
            messages_in_ws,
            messages_in_http,
            bytes_in_ws,
            bytes_in_http,
            deliveries: Counter::default(),
            frames_out: Counter::default(),
            bytes_out: Counter::default(),
            disconnects: Family::default(),
            policy: Vec::new(),
            request_errors: Family::default(),
            registry: Registry::default(),
        };
        registry.register(
            "connections",
            "Open WebSocket connections",
            m.connections.clone(),
        );
        registry.register(
            "connections_accepted",
            "WebSocket connections accepted",
            m.connections_total.clone(),
        );
        registry.register(
            "connections_refused",
            "Connections refused, by reason",
            m.connections_refused.clone(),
        );
        registry.register(
            "sockets",
            "Accepted sockets open, HTTP and WebSocket (counted against max_connections)",
            m.sockets.clone(),
        );
        registry.register(
            "connections_shed",
            "Unauthenticated connections closed to make room for newer ones, by the limit reached",
            m.connections_shed.clone(),
        );
        registry.register(
            "subscriptions",
            "Active subscriptions",
            m.subscriptions.clone(),
        );
        registry.register(
            "topics",
            "Topics with state (sequence, history, last value)",
            m.topics.clone(),
        );
        registry.register(
            "topics_forgotten",
            "Topics forgotten after topic_idle_secs with nothing published and no subscriber",
            m.topics_forgotten.clone(),
        );
        registry.register("messages_in", "Messages published, by source", messages_in);
        registry.register("bytes_in", "Payload bytes published, by source", bytes_in);
        registry.register(
            "deliveries",
            "Messages handed to subscriber connections",
            m.deliveries.clone(),
        );
        registry.register(
            "frames_out",
            "WebSocket frames written to clients",
            m.frames_out.clone(),
        );
        registry.register(
            "bytes_out",
            "Bytes written to WebSocket clients",
            m.bytes_out.clone(),
        );
        registry.register(
            "disconnects",
            "Connections ended, by reason",
            m.disconnects.clone(),
        );
        let dropped = Family::<PolicyLabels, Counter>::default();
        let actions = Family::<PolicyLabels, Counter>::default();
        let patterns: Vec<String> = policy_patterns
            .iter()
            .cloned()
            .chain(["none".to_owned()])
            .collect();
        let policy = PolicyAction::ALL
            .iter()
            .map(|action| {
                let family = match action {
                    PolicyAction::Drop | PolicyAction::Conflate => &dropped,
                    _ => &actions,
                };
                patterns
                    .iter()
                    .map(|pattern| {
                        let labels = PolicyLabels {
                            reason: action.label(),
                            pattern: pattern.clone(),
                        };
                        let counter = family.get_or_create(&labels).clone();
                        counter
                    })
                    .collect()
            })
            .collect();
        registry.register(
            "dropped_messages",
            "Messages a slow-consumer policy did not deliver (drop, conflate), by reason and configured topic pattern",
            dropped,
        );
        registry.register(
            "policy_actions",
            "Other slow-consumer policy actions (slow_consumer disconnects, lossless_hold of a publisher, lossless_timeout disconnects), by reason and configured topic pattern",
            actions,
        );
        registry.register(
            "request_errors",
            "Requests refused, by error code",
            m.request_errors.clone(),
        );
        Metrics {
            registry,
            policy,
            ..m
        }
    }

    /// Counts `n` policy actions on a topic of configured rule `rule` (`None`: no rule).
    pub fn policy(&self, action: PolicyAction, rule: Option<usize>, n: u64) {
        let counters = &self.policy[action as usize];
        let slot = rule.unwrap_or(counters.len() - 1).min(counters.len() - 1);
        counters[slot].inc_by(n);
    }

    pub fn disconnected(&self, why: Disconnect) {
        self.connections.dec();
        self.disconnects
            .get_or_create(&Reason {
                reason: why.label(),
            })
            .inc();
    }

    /// Registers more metrics (e.g. the cluster's) beside these, at construction.
    pub fn with(mut self, register: impl FnOnce(&mut Registry)) -> Self {
        register(&mut self.registry);
        self
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}
