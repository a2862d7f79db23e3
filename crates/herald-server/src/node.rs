//! The state one herald process shares between its connections: the engine behind its lock,
//! the metrics, the live sessions.

use crate::auth::Authenticator;
use crate::config::Config;
use crate::connection::Connection;
use crate::introspect::Introspection;
use crate::limits::IpLimits;
use crate::metrics::{Disconnect, Metrics};
use crate::nats::NatsBroker;
use crate::tls::Tls;
use herald_core::engine::{ConnId, Engine, Published};
use herald_core::wire::{ProtocolError, Publish, Request};
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
    /// The broker to other nodes; `None`: this node is alone and the engine is the whole
    /// broker (in memory).
    pub broker: Option<NatsBroker>,
}

impl Node {
    /// Fails when the configured auth keys or TLS files cannot be loaded.
    pub fn new(config: Config) -> anyhow::Result<Arc<Node>> {
        let mut engine = Engine::new(config.engine(), rand::random());
        let mut broker = None;
        let metrics = Metrics::default().with(|registry| {
            broker = config
                .nats
                .clone()
                .map(|nats| NatsBroker::new(nats, registry));
        });
        if broker.is_some() {
            engine.track_interest();
        }
        Ok(Arc::new(Node {
            engine: Mutex::new(engine),
            metrics: Arc::new(metrics),
            broker,
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
        let now = now_us();
        let mut engine = self.engine.lock();
        let result = engine.publish(p, now);
        if let (Ok(published), Some(broker)) = (&result, &self.broker) {
            let epoch = engine.epoch_of(&p.topic).unwrap_or_default();
            broker.publish(p, epoch, published.seq, now);
        }
        drop(engine);
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

    /// Carries out a WebSocket client's request. With a broker, a publish is handed on to it
    /// and interest changes are reported to it, under the engine lock so that NATS sees a
    /// topic's messages in sequence order.
    pub fn handle(
        &self,
        conn: ConnId,
        request: Request,
    ) -> Result<Option<Published>, &'static str> {
        let now = now_us();
        let Some(broker) = &self.broker else {
            return self.engine.lock().handle(conn, request, now);
        };
        let publish = match &request {
            Request::Publish(p) => Some(p.clone()),
            _ => None,
        };
        let mut engine = self.engine.lock();
        let result = engine.handle(conn, request, now);
        if let (Ok(Some(published)), Some(p)) = (&result, &publish) {
            let epoch = engine.epoch_of(&p.topic).unwrap_or_default();
            broker.publish(p, epoch, published.seq, now);
        }
        broker.interest(engine.take_interest_changes());
        result
    }

    /// Ends a connection's subscriptions.
    pub fn disconnect(&self, conn: ConnId) {
        let mut engine = self.engine.lock();
        engine.disconnect(conn);
        if let Some(broker) = &self.broker {
            broker.interest(engine.take_interest_changes());
        }
    }

    /// Delivers a message another node published; returns how many of its messages were found
    /// missing before it, if any.
    pub fn publish_remote(&self, p: &Publish, epoch: &str, seq: u64, at_us: u64) -> Option<u64> {
        let result = self.engine.lock().publish_remote(p, epoch, seq, at_us);
        match result {
            Ok(r) => {
                self.metrics
                    .deliveries
                    .inc_by(r.published.deliveries as u64);
                (r.missed > 0).then_some(r.missed)
            }
            Err(e) => {
                tracing::warn!(topic = %p.topic, error = %e, "refused a message from another node");
                None
            }
        }
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
