//! Read-only JSON views of a running node, for the dashboard and for scripts:
//! `GET /api/stats` (counters and gauges), `GET /api/stats/history` (the same, sampled once a
//! second for the last five minutes) and `GET /api/topics` (every topic with its rate,
//! subscribers and a preview of its last value).
//!
//! Rates per second are left to the caller for counters (two samples of a monotonic counter give
//! a rate over any window the caller likes), but per-topic rates are computed here: a caller
//! would need every topic's sequence number twice, and topics come and go.

use crate::node::Node;
use crate::refusal::require_admin;
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Json, Router};
use herald_core::engine::TopicView;
use herald_core::message::Message;
use herald_core::request::PayloadKind;
use parking_lot::Mutex;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::time::MissedTickBehavior;

/// Per-topic rates are re-measured at most this often, however many dashboards poll.
const RATE_INTERVAL: Duration = Duration::from_secs(1);
/// Text previews are cut to this many characters.
const PREVIEW_CHARS: usize = 200;

/// `/api/stats/history` keeps one sample per interval, this many: five minutes.
const HISTORY_INTERVAL: Duration = Duration::from_secs(1);
const HISTORY_SAMPLES: usize = 300;

/// The routes, with what they remember between requests ([`Introspection`]), and the task
/// that samples `node` for `/api/stats/history` while it lives (so a dashboard opened after an
/// incident shows the minutes before it).
pub fn router(node: &Arc<Node>) -> Router<Arc<Node>> {
    let introspection = Arc::new(Introspection::default());
    let node = Arc::downgrade(node);
    let sampled = introspection.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(HISTORY_INTERVAL);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(node) = node.upgrade() else { return };
            let sample = Sample::take(&node);
            let mut history = sampled.history.lock();
            if history.len() == HISTORY_SAMPLES {
                history.pop_front();
            }
            history.push_back(sample);
        }
    });
    Router::new()
        .route("/api/stats", get(stats))
        .route("/api/stats/history", get(stats_history))
        .route("/api/topics", get(topics))
        .layer(Extension(introspection))
}

/// What introspection remembers between requests.
struct Introspection {
    started: Instant,
    rates: Mutex<TopicRates>,
    /// The recent samples, oldest first.
    history: Mutex<VecDeque<Sample>>,
}

/// The gauges and counters of `/api/stats` that the dashboard charts, at one moment.
struct Sample {
    now_us: u64,
    connections: usize,
    subscriptions: usize,
    topics: usize,
    messages_in: u64,
    bytes_in: u64,
    deliveries: u64,
    bytes_out: u64,
}

impl Sample {
    fn take(node: &Node) -> Sample {
        let (connections, subscriptions, topics) = {
            let engine = node.engine.lock();
            (
                engine.connection_count(),
                engine.subscription_count(),
                engine.topic_count(),
            )
        };
        let m = &node.metrics;
        Sample {
            now_us: crate::clock::now_us(),
            connections,
            subscriptions,
            topics,
            messages_in: m.messages_in_ws.get() + m.messages_in_http.get(),
            bytes_in: m.bytes_in_ws.get() + m.bytes_in_http.get(),
            deliveries: m.deliveries.get(),
            bytes_out: m.bytes_out.get(),
        }
    }

    fn json(&self) -> Value {
        json!({
            "now_us": self.now_us,
            "connections": self.connections,
            "subscriptions": self.subscriptions,
            "topics": self.topics,
            "messages_in": self.messages_in,
            "bytes_in": self.bytes_in,
            "deliveries": self.deliveries,
            "bytes_out": self.bytes_out,
        })
    }
}

impl Default for Introspection {
    fn default() -> Self {
        Introspection {
            started: Instant::now(),
            history: Mutex::new(VecDeque::with_capacity(HISTORY_SAMPLES)),
            rates: Mutex::new(TopicRates::default()),
        }
    }
}

/// Messages per second per topic, from the change of its sequence number between two looks at
/// it. Each topic is measured when a listing shows it (a page, not every topic).
#[derive(Default)]
struct TopicRates {
    seen: HashMap<Box<str>, Seen>,
}

/// A topic as last measured.
struct Seen {
    at: Instant,
    epoch: Box<str>,
    seq: u64,
    rate: f64,
}

/// Topics not shown for this long are forgotten once many are remembered.
const RATE_MEMORY: Duration = Duration::from_secs(60);

impl TopicRates {
    fn sample<'a>(&mut self, topics: impl Iterator<Item = &'a TopicView<'a>>, now: Instant) {
        if self.seen.len() > 100_000 {
            self.seen
                .retain(|_, s| now.duration_since(s.at) < RATE_MEMORY);
        }
        for t in topics {
            let Some(seen) = self.seen.get_mut(t.name) else {
                // First look: no rate until the next.
                let seen = Seen {
                    at: now,
                    epoch: t.epoch.into(),
                    seq: t.seq,
                    rate: 0.0,
                };
                self.seen.insert(t.name.into(), seen);
                continue;
            };
            let elapsed = now.duration_since(seen.at);
            if elapsed < RATE_INTERVAL {
                continue;
            }
            // In a new epoch, counted from 0.
            let before = if *seen.epoch == *t.epoch { seen.seq } else { 0 };
            seen.rate = t.seq.saturating_sub(before) as f64 / elapsed.as_secs_f64();
            seen.at = now;
            seen.seq = t.seq;
            if *seen.epoch != *t.epoch {
                seen.epoch = t.epoch.into();
            }
        }
    }

    fn rate(&self, topic: &str) -> f64 {
        self.seen.get(topic).map_or(0.0, |s| s.rate)
    }
}

/// `GET /api/stats`.
/// With auth on, both views need the admin API key, like `/metrics`: topic names and last
/// values are data a client token may not be granted.
async fn stats(
    State(node): State<Arc<Node>>,
    Extension(introspection): Extension<Arc<Introspection>>,
    headers: HeaderMap,
) -> Response {
    if let Err(refusal) = require_admin(&node, &headers) {
        return refusal;
    }
    let m = &node.metrics;
    // Labelled families are read back from the exposition, so that labels other modules add
    // (new drop reasons, error codes) show up here without a list to keep in step.
    let text = m.render();
    let s = Sample::take(&node);
    Json(json!({
        "now_us": s.now_us,
        "uptime_secs": introspection.started.elapsed().as_secs_f64(),
        "connections": s.connections,
        "subscriptions": s.subscriptions,
        "topics": s.topics,
        "messages_in": s.messages_in,
        "bytes_in": s.bytes_in,
        "deliveries": s.deliveries,
        "frames_out": m.frames_out.get(),
        "bytes_out": s.bytes_out,
        "connections_accepted": m.connections_total.get(),
        "dropped": family(&text, "herald_dropped_messages_total", "reason"),
        "disconnects": family(&text, "herald_disconnects_total", "reason"),
        "errors": family(&text, "herald_request_errors_total", "code"),
        // `null` for a node alone; see docs/cluster.md.
        "cluster": node.broker.as_ref().map(|b| b.stats()),
    }))
    .into_response()
}

/// `GET /api/stats/history`: the samples of the last five minutes, oldest first.
async fn stats_history(
    State(node): State<Arc<Node>>,
    Extension(introspection): Extension<Arc<Introspection>>,
    headers: HeaderMap,
) -> Response {
    if let Err(refusal) = require_admin(&node, &headers) {
        return refusal;
    }
    let samples: Vec<Value> = introspection
        .history
        .lock()
        .iter()
        .map(Sample::json)
        .collect();
    Json(json!({
        "interval_secs": HISTORY_INTERVAL.as_secs_f64(),
        "samples": samples,
    }))
    .into_response()
}

/// One labelled counter family from the text exposition, summed by the value of `label` (a
/// family may carry other labels too, e.g. the policy pattern); zero totals are left out.
fn family(text: &str, name: &str, label: &str) -> BTreeMap<String, u64> {
    let key = format!("{label}=\"");
    let mut totals = BTreeMap::new();
    for (value_of_label, count) in text.lines().filter_map(|l| sample(l, name, &key)) {
        *totals.entry(value_of_label).or_insert(0) += count;
    }
    totals.retain(|_, total| *total > 0);
    totals
}

/// `name{…key"V"…} N` → (V, N).
fn sample(line: &str, name: &str, key: &str) -> Option<(String, u64)> {
    let labels = line.strip_prefix(name)?.strip_prefix('{')?;
    let (labels, value) = labels.rsplit_once("} ")?;
    let start = labels.find(key)? + key.len();
    let end = labels[start..].find('"')? + start;
    Some((labels[start..end].to_owned(), value.trim().parse().ok()?))
}

#[derive(Deserialize)]
struct TopicsQuery {
    /// Only topics starting with this.
    #[serde(default)]
    prefix: String,
    /// Only topics after this one (by name): the `next` of the previous page.
    #[serde(default)]
    after: Option<String>,
    /// At most this many topics (by name); `truncated` says when more exist.
    #[serde(default = "default_limit")]
    limit: usize,
}

fn default_limit() -> usize {
    1000
}

/// The most topics one page lists, whatever `limit` asks: a page is built under the engine's
/// lock.
const MAX_PAGE: usize = 10_000;

/// `GET /api/topics?prefix=&after=&limit=`: one page of the topics, costing the page.
async fn topics(
    State(node): State<Arc<Node>>,
    Extension(introspection): Extension<Arc<Introspection>>,
    headers: HeaderMap,
    Query(q): Query<TopicsQuery>,
) -> Response {
    if let Err(refusal) = require_admin(&node, &headers) {
        return refusal;
    }
    let limit = q.limit.min(MAX_PAGE);
    let engine = node.engine.lock();
    // One more than the page, to know whether another follows.
    let mut views: Vec<TopicView> = engine
        .topics_page(&q.prefix, q.after.as_deref(), limit.saturating_add(1))
        .collect();
    let truncated = views.len() > limit;
    views.truncate(limit);
    let total = engine.topic_count_under(&q.prefix);
    let mut rates = introspection.rates.lock();
    rates.sample(views.iter(), Instant::now());
    let list: Vec<Value> = views
        .iter()
        .map(|t| {
            json!({
                "topic": t.name,
                "seq": t.seq,
                "epoch": t.epoch,
                "subscribers": t.subscribers,
                "history": t.history,
                "rate": rates.rate(t.name),
                "last": t.last().as_ref().map(preview),
            })
        })
        .collect();
    let next = truncated.then(|| views.last().map(|t| t.name)).flatten();
    Json(json!({"total": total, "truncated": truncated, "next": next, "topics": list}))
        .into_response()
}

/// A short description of a message: its content type, stamp, size, and the start of its text.
fn preview(message: &Message) -> Value {
    let mut out = Map::new();
    if let Some(ct) = message.content_type() {
        out.insert("ct".into(), ct.into());
    }
    if let Some(ts) = message.stamp_us() {
        out.insert("ts".into(), ts.into());
    }
    let payload = message.payload();
    out.insert("bytes".into(), payload.len().into());
    let binary = message.kind() == PayloadKind::Binary;
    out.insert("binary".into(), binary.into());
    if !binary {
        // Text payloads are checked UTF-8 when published.
        let text = String::from_utf8_lossy(payload);
        let cut: String = text.chars().take(PREVIEW_CHARS).collect();
        out.insert("truncated".into(), (cut.len() < text.len()).into());
        out.insert("text".into(), cut.into());
    }
    Value::Object(out)
}
