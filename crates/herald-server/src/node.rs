//! The state one herald process shares between its connections: the engine behind its lock,
//! the metrics, the live sessions.

use crate::auth::Authenticator;
use crate::config::Config;
use crate::connection::Connection;
use crate::limits::IpLimits;
use crate::introspect::Introspection;
use crate::metrics::{Disconnect, Metrics};
use crate::tls::Tls;
use herald_core::engine::{Engine, Published};
use herald_core::wire::{ProtocolError, Publish};
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};
use tokio_util::task::TaskTracker;

pub struct Node {
    pub config: Config,
    pub engine: Mutex<Engine<Arc<Connection>>>,
    pub metrics: Arc<Metrics>,
    /// Every WebSocket session, so shutdown can wait for their close frames to go out.
    pub sessions: TaskTracker,
    /// Token verification; `None` when auth is off.
    pub auth: Option<Arc<Authenticator>>,
    /// Connections and connection attempts per source IP.
    pub ip_limits: Arc<IpLimits>,
    /// TLS on the listener; `None` for plain HTTP.
    pub tls: Option<Arc<Tls>>,
    /// What `/api/stats` and `/api/topics` remember between requests.
    pub introspection: Introspection,
}

impl Node {
    /// Fails when the configured auth keys cannot be loaded.
    pub fn new(config: Config) -> anyhow::Result<Arc<Node>> {
        let engine = Engine::new(config.engine(), rand::random());
        Ok(Arc::new(Node {
            engine: Mutex::new(engine),
            metrics: Arc::new(Metrics::default()),
            sessions: TaskTracker::new(),
            auth: Authenticator::from_config(&config.auth)?.map(Arc::new),
            ip_limits: IpLimits::new(config.limits.clone()),
            tls: Tls::from_config(&config.tls)?,
            introspection: Introspection::default(),
            config,
        }))
    }

    /// Publishes from HTTP (WebSocket publishes go through `Engine::handle`).
    pub fn publish_http(&self, p: &Publish) -> Result<Published, ProtocolError> {
        let result = self.engine.lock().publish(p, now_us());
        match &result {
            Ok(published) => {
                self.metrics.messages_in_http.inc();
                self.metrics.bytes_in_http.inc_by(p.payload.len() as u64);
                self.metrics.deliveries.inc_by(published.deliveries as u64);
            }
            Err(e) => self.count_error(e.code),
        }
        result
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
