//! The state one herald process shares between its connections: the engine behind its lock,
//! the metrics, the live sessions.

use crate::auth::Authenticator;
use crate::clock::now_us;
use crate::cluster::{self, Broker, Events};
use crate::config::Config;
use crate::connection::Connection;
use crate::flush::Pending;
use crate::limits::{IpLimits, Sockets};
use crate::metrics::{Disconnect, Metrics, PolicyAction};
use crate::protocol::mqtt::retained::RetainedStore;
use crate::protocol::mqtt::sessions::{SessionLimits, SessionStore};
use crate::tls::Tls;
use herald_core::engine::{ConnId, Engine, Origin, Published, Served};
use herald_core::request::{ProtocolError, Publish, Request};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::task::TaskTracker;

/// What a client's request came to: the publish it made, if any, or an error code.
pub type Outcome = Result<Option<Published>, &'static str>;

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
    /// Every socket herald's listeners accepted (the HTTP port's and any protocol's own),
    /// counted together against `max_connections`.
    pub sockets: Arc<Sockets>,
    /// TLS on the listener; `None` for plain HTTP.
    pub tls: Option<Arc<Tls>>,
    /// The broker to other nodes; `None`: this node is alone and the engine is the whole
    /// broker (in memory).
    pub broker: Option<Arc<dyn Broker>>,
    /// Wakes publishers held by a `lossless` subscriber: credit was granted, or a subscription
    /// or connection went away.
    pub released: Notify,
    /// Wakes [`Node::serve_snapshots`]: a snapshot is under way.
    snapshots: Arc<Notify>,
    /// How long each `lossless` subscriber has kept publishers waiting lately.
    holds: Mutex<HashMap<ConnId, HoldMeter>>,
    /// Token subjects by the [`Origin`] their publishes are charged to.
    origins: Mutex<HashMap<Box<str>, Origin>>,
    /// MQTT's retained messages (see [`RetainedStore`] for why they are kept apart).
    pub mqtt_retained: Arc<RetainedStore>,
    /// MQTT's sessions, by client identifier.
    pub mqtt_sessions: SessionStore,
}

/// The sweep ([`Node::sweep`]) goes through every topic once per cycle, a slice of at most
/// [`SWEEP_SLICE`] topics at a time, the slices spread over the cycle and at least
/// [`SWEEP_MIN_GAP`] apart: each slice holds the engine's lock briefly, and a few topics cost
/// a few sweeps a minute, not ten a second.
const SWEEP_SLICE: usize = 2_000;
const SWEEP_MIN_GAP: Duration = Duration::from_millis(100);

/// How long [`Node::serve_snapshots`] waits before looking again when every snapshot under way
/// waits for its client to read.
const SNAPSHOT_WAIT: Duration = Duration::from_millis(5);

/// The window over which a `lossless` subscriber's share of holding publishers is counted.
pub const LOSSLESS_HOLD_WINDOW: Duration = Duration::from_secs(10);

/// Publisher time a `lossless` subscriber has held in the current window: one that grants
/// just enough credit, just before each hold times out, would otherwise slow a publisher to a
/// crawl for ever without ever being cut.
struct HoldMeter {
    since: Instant,
    held: Duration,
}

impl Node {
    /// Fails when the configured auth keys or TLS files cannot be loaded.
    pub fn new(config: Config) -> anyhow::Result<Arc<Node>> {
        let mut engine = Engine::new(config.engine(), rand::random());
        let mut broker = None;
        let patterns: Vec<String> = config.policy.iter().map(|r| r.pattern.clone()).collect();
        let metrics = Metrics::new(&patterns).with(|registry| {
            broker = cluster::brokers::from_config(&config, registry);
        });
        if broker.is_some() {
            engine.track_interest();
        }
        let metrics = Arc::new(metrics);
        let auth = Authenticator::from_config(&config.auth)?.map(Arc::new);
        let sockets = Sockets::new(
            config.max_connections,
            &config.limits,
            auth.is_some(),
            metrics.clone(),
        );
        Ok(Arc::new(Node {
            engine: Mutex::new(engine),
            metrics,
            broker,
            released: Notify::new(),
            snapshots: Arc::default(),
            sessions: TaskTracker::new(),
            auth,
            ip_limits: IpLimits::new(config.limits.clone()),
            sockets,
            tls: Tls::from_config(&config.tls)?,
            holds: Mutex::default(),
            origins: Mutex::default(),
            mqtt_retained: Arc::new(RetainedStore::new(config.max_topics)),
            mqtt_sessions: SessionStore::new(SessionLimits::of(&config)),
            config,
        }))
    }

    /// The [`Origin`] a token subject's publishes are charged to (topic quotas): one per
    /// subject, a token without `sub` counted as the subject "". With auth off, nobody's.
    pub fn origin_of(&self, subject: Option<&str>) -> Origin {
        if self.auth.is_none() {
            return 0;
        }
        let mut origins = self.origins.lock();
        let next = origins.len() as Origin + 1;
        *origins.entry(subject.unwrap_or("").into()).or_insert(next)
    }

    /// Publishes from HTTP (WebSocket publishes go through `Engine::handle`), charged to
    /// `origin`.
    pub async fn publish_http(
        &self,
        p: &Publish,
        origin: Origin,
    ) -> Result<Published, ProtocolError> {
        let result = self.publish(p, origin).await;
        if result.is_ok() {
            self.metrics.messages_in_http.inc();
            self.metrics.bytes_in_http.inc_by(p.payload.len() as u64);
        }
        result
    }

    /// Publishes on behalf of no connection (HTTP, an MQTT will whose connection is gone),
    /// charged to `origin`: waits while a `lossless` subscriber is out of credit, hands the
    /// message to the broker, and accounts for it.
    pub async fn publish(&self, p: &Publish, origin: Origin) -> Result<Published, ProtocolError> {
        let mut pending = Pending::default();
        let result = self
            .when_admitted(
                &p.topic,
                p.payload.len(),
                &mut pending,
                |engine, pending| {
                    let now = now_us();
                    let result = pending.collect(|| engine.publish_by(p, origin, now));
                    if let Ok(published) = &result {
                        self.hand_to_broker(engine, p, published, now);
                    }
                    result
                },
            )
            .await;
        pending.flush();
        match &result {
            Ok(published) => self.published(published),
            Err(e) => self.count_error(e.code),
        }
        result
    }

    /// Carries out a WebSocket client's request, unless it must wait: then it is handed back,
    /// for [`Node::handle_waiting`]. With a broker, a publish is handed on to it and interest
    /// changes are reported to it, under the engine lock so that the broker gets a topic's
    /// messages in sequence order. What it queues for connections is written when the caller
    /// flushes `pending`.
    // The request comes back by value, as it came: boxing it would cost every publish an
    // allocation for the sake of the rare one that waits.
    #[allow(clippy::result_large_err)]
    pub fn handle_now(
        &self,
        conn: ConnId,
        request: Request,
        pending: &mut Pending,
        now_us: u64,
    ) -> Result<Outcome, Request> {
        let mut engine = self.engine.lock();
        let must_wait = match &request {
            Request::Publish(p) => engine.is_held(&p.topic, p.payload.len()),
            Request::Subscribe(_) => self.broker.is_some(),
            _ => false,
        };
        if must_wait {
            return Err(request);
        }
        if let Request::Publish(p) = &request {
            return Ok(self.publish_ws(&mut engine, conn, p, pending, now_us));
        }
        let result = pending.collect(|| engine.handle(conn, request, now_us));
        if let Some(broker) = &self.broker {
            broker.interest(engine.take_interest_changes());
        }
        self.wake_snapshots(&engine);
        Ok(result)
    }

    /// Wakes [`Node::serve_snapshots`] if a snapshot is under way (a subscribe may have
    /// started one).
    fn wake_snapshots(&self, engine: &Engine<Arc<Connection>>) {
        if engine.snapshots_pending() {
            self.snapshots.notify_one();
        }
    }

    /// Serves the snapshots under way a slice at a time ([`Engine::serve_snapshots`]) until
    /// the node is dropped, the engine's lock taken for one slice at a time: a snapshot of
    /// millions of topics stalls the other clients for a slice, not for its whole walk. Sleeps
    /// while none is under way, and for [`SNAPSHOT_WAIT`] when every one waits for its client
    /// to read.
    pub async fn serve_snapshots(node: Weak<Node>) {
        let Some(wake) = node.upgrade().map(|n| n.snapshots.clone()) else {
            return;
        };
        loop {
            let Some(served) = node
                .upgrade()
                .map(|n| n.engine.lock().serve_snapshots(now_us()))
            else {
                return;
            };
            match served {
                Served::Idle => wake.notified().await,
                Served::More => tokio::task::yield_now().await,
                Served::Waiting => tokio::time::sleep(SNAPSHOT_WAIT).await,
            }
        }
    }

    /// What [`Node::handle_now`] handed back: a publish that waits while a `lossless`
    /// subscriber of its topic is out of credit ([`Node::when_admitted`]), or a subscribe that
    /// waits for the broker to follow its pattern. Rare, and its future is large: the caller
    /// boxes it, so that it is not part of every connection's session task for the
    /// connection's whole life.
    pub async fn handle_waiting(
        &self,
        conn: ConnId,
        request: Request,
        pending: &mut Pending,
    ) -> Outcome {
        match (request, &self.broker) {
            (Request::Publish(p), _) => {
                // Received now, as far as the message's time goes: it waited in herald.
                let publish = |engine: &mut Engine<_>, pending: &mut Pending| {
                    self.publish_ws(engine, conn, &p, pending, now_us())
                };
                self.when_admitted(&p.topic, p.payload.len(), pending, publish)
                    .await
            }
            (Request::Subscribe(s), Some(broker)) => {
                pending.flush();
                let outcome =
                    cluster::subscribe::subscribe(broker.as_ref(), &self.engine, conn, s).await;
                self.wake_snapshots(&self.engine.lock());
                outcome
            }
            (request, _) => match self.handle_now(conn, request, pending, now_us()) {
                Ok(outcome) => outcome,
                Err(_) => unreachable!("only a publish or a clustered subscribe waits"),
            },
        }
    }

    /// A WebSocket publish received at `now` (µs since the UNIX epoch), under the engine lock.
    fn publish_ws(
        &self,
        engine: &mut Engine<Arc<Connection>>,
        conn: ConnId,
        p: &Publish,
        pending: &mut Pending,
        now: u64,
    ) -> Outcome {
        let result = pending.collect(|| engine.publish_from(conn, p, now));
        if let Ok(published) = &result {
            pending.delivered(published.deliveries);
            self.hand_to_broker(engine, p, published, now);
        }
        result.map(Some)
    }

    /// Hands a message published here to the other nodes, numbered as the engine numbered it.
    fn hand_to_broker(
        &self,
        engine: &Engine<Arc<Connection>>,
        p: &Publish,
        published: &Published,
        now: u64,
    ) {
        if let Some(broker) = &self.broker {
            let epoch = engine.epoch_of(&p.topic).unwrap_or_default();
            broker.publish(p, epoch, published.seq, now);
        }
    }

    /// A connection ended: its subscriptions go (and with them, maybe, this node's interest
    /// in some patterns), and publishers it held may go on.
    pub fn disconnect(&self, conn: ConnId) {
        self.holds.lock().remove(&conn);
        {
            let mut engine = self.engine.lock();
            engine.disconnect(conn);
            if let Some(broker) = &self.broker {
                broker.interest(engine.take_interest_changes());
            }
        }
        self.released.notify_waiters();
    }

    /// Starts the broker, if any, its events coming back to this node.
    pub async fn start_broker(self: &Arc<Node>) -> anyhow::Result<()> {
        if let Some(broker) = &self.broker {
            let events: Weak<dyn Events> = Arc::downgrade(self) as Weak<dyn Events>;
            broker.start(events).await?;
        }
        Ok(())
    }

    /// Delivers a message another node published; returns how many of its messages were found
    /// missing before it, if any.
    pub fn publish_remote(&self, p: &Publish, epoch: &str, seq: u64, at_us: u64) -> Option<u64> {
        let mut pending = Pending::default();
        let result = pending.collect(|| self.engine.lock().publish_remote(p, epoch, seq, at_us));
        pending.flush();
        match result {
            Ok(r) => {
                // A remote message cannot be held: a lossless subscriber out of credit is cut.
                self.published(&r.published);
                (r.missed > 0).then_some(r.missed)
            }
            Err(e) => {
                tracing::warn!(topic = %p.topic, error = %e, "refused a message from another node");
                None
            }
        }
    }

    /// Runs `publish` (of a `len`-byte payload) under the engine lock once no `lossless`
    /// subscriber of `topic` is out of credit for it, or once `lossless_hold_timeout_ms` has passed (then the publish cuts those
    /// subscribers, see [`Node::published`]). Only this publisher waits: its WebSocket reader or
    /// HTTP request, never the other publishers. `pending` is flushed before waiting: what
    /// this publisher already queued may be what the subscriber needs to grant credit.
    pub async fn when_admitted<R>(
        &self,
        topic: &str,
        len: usize,
        pending: &mut Pending,
        publish: impl FnOnce(&mut Engine<Arc<Connection>>, &mut Pending) -> R,
    ) -> R {
        // Every publish comes through here and almost none is held: that case reads no clock
        // and registers no waiter on `released` (which takes its lock twice).
        {
            let mut engine = self.engine.lock();
            if !engine.is_held(topic, len) {
                return publish(&mut engine, pending);
            }
        }
        pending.flush();
        self.metrics.policy(PolicyAction::Hold, None, 1);
        let start = Instant::now();
        let mut holders = Vec::new();
        self.engine
            .lock()
            .holders(topic, len, |id| holders.push(id));
        let deadline = start + Duration::from_millis(self.config.lossless_hold_timeout_ms);
        loop {
            // Registered before the check, so a release between the two is not missed.
            let released = self.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            {
                let mut engine = self.engine.lock();
                if !engine.is_held(topic, len) || Instant::now() >= deadline {
                    let result = publish(&mut engine, pending);
                    drop(engine);
                    self.charge_hold(&holders, start.elapsed());
                    return result;
                }
            }
            let _ = tokio::time::timeout_at(deadline, released).await;
        }
    }

    /// Charges the `lossless` subscribers that held a publisher for `held`; one that has held
    /// publishers for more than `lossless_max_hold_share` of [`LOSSLESS_HOLD_WINDOW`] is
    /// closed as a slow consumer (4008).
    fn charge_hold(&self, holders: &[ConnId], held: Duration) {
        let now = Instant::now();
        let limit = LOSSLESS_HOLD_WINDOW.mul_f64(self.config.lossless_max_hold_share);
        let mut over = Vec::new();
        {
            let mut holds = self.holds.lock();
            for &id in holders {
                let meter = holds.entry(id).or_insert(HoldMeter {
                    since: now,
                    held: Duration::ZERO,
                });
                if now.duration_since(meter.since) > LOSSLESS_HOLD_WINDOW {
                    *meter = HoldMeter {
                        since: now,
                        held: Duration::ZERO,
                    };
                }
                meter.held += held;
                if meter.held > limit {
                    holds.remove(&id);
                    over.push(id);
                }
            }
        }
        if over.is_empty() {
            return;
        }
        let reason = format!(
            "slow consumer: lossless subscriber kept publishers waiting more than {:.0}% of {} s",
            self.config.lossless_max_hold_share * 100.0,
            LOSSLESS_HOLD_WINDOW.as_secs()
        );
        {
            let mut engine = self.engine.lock();
            for id in over {
                if let Some(conn) = engine.outbox(id).cloned() {
                    engine.detach(id);
                    self.metrics.policy(PolicyAction::LosslessTimeout, None, 1);
                    conn.close(Disconnect::SlowConsumer, 4008, &reason);
                }
            }
            if let Some(broker) = &self.broker {
                broker.interest(engine.take_interest_changes());
            }
        }
        self.released.notify_waiters();
    }

    /// Trims aged history and forgets idle topics (`Engine::sweep`), a slice at a time, until
    /// the node is dropped. A cycle takes a quarter of the shortest time it enforces
    /// (`topic_idle_secs`, a history rule's `max_age_secs`), between 1 s and 60 s.
    pub async fn sweep(node: std::sync::Weak<Node>) {
        let Some(cycle) = node.upgrade().map(|n| n.sweep_cycle()) else {
            return;
        };
        let mut after: Option<Arc<str>> = None;
        loop {
            let Some(slices) = node.upgrade().map(|n| n.engine.lock().topic_count()) else {
                return;
            };
            let slices = slices.div_ceil(SWEEP_SLICE).max(1) as u32;
            tokio::time::sleep((cycle / slices).max(SWEEP_MIN_GAP)).await;
            let Some(node) = node.upgrade() else {
                return;
            };
            let swept = node
                .engine
                .lock()
                .sweep(now_us(), after.as_deref(), SWEEP_SLICE);
            node.metrics.topics_forgotten.inc_by(swept.forgotten as u64);
            after = swept.resume_after;
        }
    }

    /// How long one sweep of every topic takes (see [`Node::sweep`]).
    fn sweep_cycle(&self) -> Duration {
        let ages = self.config.history.iter().map(|r| r.max_age_secs);
        let idle = (self.config.topic_idle_secs > 0).then_some(self.config.topic_idle_secs);
        let shortest = ages.chain(idle).min().unwrap_or(u64::MAX);
        Duration::from_secs((shortest / 4).clamp(1, 60))
    }

    /// Accounts for what a client's request came to: its publish, or its error.
    pub fn account(&self, outcome: Outcome) {
        match outcome {
            Ok(Some(published)) => self.published(&published),
            Ok(None) => {}
            Err(code) => self.count_error(code),
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

impl Events for Node {
    fn remote_message(&self, p: &Publish, epoch: &str, seq: u64, at_us: u64) -> Option<u64> {
        self.publish_remote(p, epoch, seq, at_us)
    }

    fn remote_position(&self, topic: &str, epoch: &str, seq: u64) -> u64 {
        self.engine.lock().remote_reached(topic, epoch, seq)
    }

    fn local_positions(&self, each: &mut dyn FnMut(&str, &str, u64)) -> usize {
        let engine = self.engine.lock();
        let positions = engine.local_positions();
        for (topic, epoch, seq) in &positions {
            each(topic, epoch, *seq);
        }
        positions.len()
    }
}
