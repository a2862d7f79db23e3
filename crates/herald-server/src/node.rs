//! The state one herald process shares between its connections: the engine behind its lock,
//! the metrics, the live sessions.

use crate::config::Config;
use crate::connection::Connection;
use crate::metrics::{Disconnect, Metrics, PolicyAction};
use herald_core::engine::{ConnId, Engine, Published};
use herald_core::wire::{ProtocolError, Publish};
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::task::TaskTracker;

pub struct Node {
    pub config: Config,
    pub engine: Mutex<Engine<Arc<Connection>>>,
    pub metrics: Arc<Metrics>,
    /// Every WebSocket session, so shutdown can wait for their close frames to go out.
    pub sessions: TaskTracker,
    /// Wakes publishers held by a `lossless` subscriber: credit was granted, or a subscription
    /// or connection went away.
    pub released: Notify,
    /// The VBDS streams (`/vbds/...`).
    pub vbds: crate::vbds::Streams,
}

impl Node {
    pub fn new(config: Config) -> Arc<Node> {
        let engine = Engine::new(config.engine(), rand::random());
        let patterns: Vec<String> = config.policy.iter().map(|r| r.pattern.clone()).collect();
        Arc::new(Node {
            engine: Mutex::new(engine),
            metrics: Arc::new(Metrics::new(&patterns)),
            released: Notify::new(),
            vbds: Default::default(),
            sessions: TaskTracker::new(),
            config,
        })
    }

    /// Publishes from HTTP (WebSocket publishes go through `Engine::handle`).
    pub async fn publish_http(&self, p: &Publish) -> Result<Published, ProtocolError> {
        let result = self
            .when_admitted(&p.topic, |engine| engine.publish(p, now_us()))
            .await;
        match &result {
            Ok(published) => {
                self.metrics.messages_in_http.inc();
                self.metrics.bytes_in_http.inc_by(p.payload.len() as u64);
                self.published(published);
            }
            Err(e) => self.count_error(e.code),
        }
        result
    }

    /// Runs `publish` under the engine lock once no `lossless` subscriber of `topic` is out of
    /// credit, or once `lossless_hold_timeout_ms` has passed (then the publish cuts those
    /// subscribers, see [`Node::published`]). Only this publisher waits: its WebSocket reader or
    /// HTTP request, never the other publishers.
    pub async fn when_admitted<R>(
        &self,
        topic: &str,
        publish: impl FnOnce(&mut Engine<Arc<Connection>>) -> R,
    ) -> R {
        let deadline = Instant::now() + Duration::from_millis(self.config.lossless_hold_timeout_ms);
        let mut held = false;
        loop {
            let released = self.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            {
                let mut engine = self.engine.lock();
                if !engine.is_held(topic) || Instant::now() >= deadline {
                    return publish(&mut engine);
                }
            }
            if !held {
                held = true;
                self.metrics.policy(PolicyAction::Hold, None, 1);
            }
            let _ = tokio::time::timeout_at(deadline, released).await;
        }
    }

    /// Accounts for a publish: deliveries, and the `lossless` subscribers it cut because they
    /// granted no credit within the hold timeout (closed with 4008).
    pub fn published(&self, published: &Published) {
        self.metrics.deliveries.inc_by(published.deliveries as u64);
        if published.cut.is_empty() {
            return;
        }
        let engine = self.engine.lock();
        let reason = format!(
            "slow consumer: lossless window not replenished within {} ms",
            self.config.lossless_hold_timeout_ms
        );
        for conn in published.cut.iter().filter_map(|&id| engine.outbox(id)) {
            self.metrics.policy(PolicyAction::LosslessTimeout, None, 1);
            conn.close(Disconnect::SlowConsumer, 4008, &reason);
        }
    }

    /// A connection ended: publishers it held may go on.
    pub fn disconnect(&self, id: ConnId) {
        self.engine.lock().disconnect(id);
        self.released.notify_waiters();
    }

    pub fn count_error(&self, code: &'static str) {
        self.metrics
            .request_errors
            .get_or_create(&crate::metrics::Code { code })
            .inc();
    }

    /// Sends every client a close frame (1001) and lets their writers finish.
    pub fn close_all(&self) {
        for conn in self.engine.lock().connections() {
            conn.close(Disconnect::Shutdown, 1001, "server shutting down");
        }
    }

    /// Mirrors engine state into the gauges before a scrape.
    pub fn refresh_gauges(&self) {
        let engine = self.engine.lock();
        self.metrics
            .subscriptions
            .set(engine.subscription_count() as i64);
        self.metrics.topics.set(engine.topic_count() as i64);
    }
}

/// Wall-clock microseconds since the UNIX epoch: publishers on the same host compare it with
/// their own clock to split latency into legs.
pub fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}
