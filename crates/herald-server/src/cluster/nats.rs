//! The NATS broker: several herald nodes as one (see docs/cluster.md), behind [`Broker`].
//!
//! This bridge subscribes on NATS to exactly the patterns the engine says its clients hold
//! (one subscription per pattern, mapped by [`herald_core::subject`]) and drops a subscription
//! when its last local subscriber leaves. A message published on this node is queued for NATS
//! with its `(epoch, seq)` in headers; other nodes keep those numbers
//! (`Engine::publish_remote`), so a topic published from one node has the same numbers
//! everywhere and `since` works after a client moves to another node.
//!
//! The connection uses `no_echo`: NATS never hands a node its own publications back. Messages
//! larger than the server's `max_payload` travel as consecutive chunks of one subject and are
//! reassembled per origin and topic; an incomplete message is discarded, never delivered. The
//! outgoing queue is bounded in bytes (`max_pending_bytes`): past it, messages are not carried
//! (counted), and remote nodes see the hole in the sequence and tell their subscribers.
//!
//! A new pattern counts as followed once the NATS server has the node's subscription
//! ([`Broker::followed`]), and what memory cannot recover is read from JetStream when
//! configured ([`super::jetstream`]). After an outage, origins announce their topics'
//! positions ([`super::positions`]) so that quiet topics' holes are found too. The wire format
//! (headers, chunks, announcements) is in `carried.rs`; everything read from NATS passes
//! [`Gate`]. The connection authenticates and encrypts as `[nats]` says (user/password, token,
//! NKey, credentials file, TLS); secrets are read from files and never logged.

use super::carried::{body_limit, ClusterKey, Departure, Reassembly, Reject, CHUNK, HEADER_ROOM};
use super::gate::Gate;
use super::jetstream::DurableHistory;
use super::metrics::ClusterMetrics;
use super::positions::{announce_positions, Uncarried};
use super::{Broker, Events, TopicHistory};
use crate::clock::now_us;
use crate::config::NatsConfig;
use anyhow::{bail, Context};
use async_nats::connection::State;
use async_nats::{Client, ConnectErrorKind, ConnectOptions, Event, HeaderMap, Message};
use bytes::Bytes;
use futures_util::future::BoxFuture;
use futures_util::StreamExt;
use herald_core::engine::{HistoryRule, Interest, Unanswered};
use herald_core::request::Publish;
use herald_core::subject;
use prometheus_client::registry::Registry;
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinHandle;

/// How often a node announces itself on `<prefix>.nodes`; nodes unheard for three periods are
/// no longer counted.
const HEARTBEAT: Duration = Duration::from_secs(1);

/// `urls` with any `user:password@` replaced, for logs and errors.
pub fn redacted(urls: &str) -> String {
    urls.split(',')
        .map(|url| {
            let host_from = url.find("://").map_or(0, |i| i + 3);
            match url[host_from..].rfind('@') {
                Some(at) => format!("{}***@{}", &url[..host_from], &url[host_from + at + 1..]),
                None => url.to_owned(),
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Whether a connection failed in the TLS handshake (reported by the NATS client as an I/O
/// error around rustls's): a certificate not trusted, a client certificate refused…
fn tls_refused(e: &async_nats::ConnectError) -> bool {
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(error) = next {
        let inner = match error.downcast_ref::<std::io::Error>() {
            Some(io) => io
                .get_ref()
                .map(|e| e as &(dyn std::error::Error + 'static)),
            None => Some(error),
        };
        if inner.is_some_and(|e| e.is::<rustls::Error>()) {
            return true;
        }
        next = error.source();
    }
    false
}

/// A secret kept in a file: its text, a trailing newline ignored. The error names the file,
/// never its content.
fn secret_file(key: &str, path: &Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read [nats] {key} {}", path.display()))?;
    let secret = text.trim_end_matches(['\r', '\n']);
    if secret.is_empty() {
        bail!("[nats] {key} {} is empty", path.display());
    }
    Ok(secret.to_owned())
}

/// The NATS subscriptions this node holds, one per locally held pattern, and whether the server
/// has confirmed each.
#[derive(Default)]
struct Follows {
    map: parking_lot::Mutex<HashMap<String, Follow>>,
    /// Rings whenever a subscription is confirmed.
    ready: Notify,
}

struct Follow {
    task: JoinHandle<()>,
    ready: Arc<AtomicBool>,
}

/// How long a subscription to a new pattern waits for NATS to confirm its subscription before
/// it is answered anyway (NATS slow: a message published meanwhile may be missed).
const FOLLOW_TIMEOUT: Duration = Duration::from_secs(2);
/// This node's side of the NATS broker: what the engine's callers hand it, it carries.
pub struct NatsBroker {
    config: NatsConfig,
    /// Random per process: tells other nodes apart (metrics) and names reassembly streams.
    node_id: String,
    topics: String,
    metrics: Arc<ClusterMetrics>,
    pending: Arc<AtomicUsize>,
    out: mpsc::UnboundedSender<Departure>,
    interest: mpsc::UnboundedSender<Interest>,
    receivers: parking_lot::Mutex<
        Option<(
            mpsc::UnboundedReceiver<Departure>,
            mpsc::UnboundedReceiver<Interest>,
        )>,
    >,
    follows: Arc<Follows>,
    client: OnceLock<Client>,
    /// `[nats] jetstream`: the durable history stream.
    history: Option<Arc<DurableHistory>>,
    /// The largest message a node accepts, whole or reassembled.
    max_message_bytes: usize,
    /// Topics with a message not carried (past `max_pending_bytes`).
    uncarried: Arc<Uncarried>,
    /// Rings when the other nodes should hear this node's positions: a node (re)joined NATS.
    announce: Arc<Notify>,
    /// Checks (and with the cluster key, signs) what crosses NATS.
    gate: Arc<Gate>,
}

impl NatsBroker {
    /// The broker for `config`, its metrics registered in `registry`; `history` sizes the
    /// JetStream stream when `config.jetstream` is on. Nothing is connected until
    /// [`Broker::start`].
    pub fn new(
        config: NatsConfig,
        history: &[HistoryRule],
        max_message_bytes: usize,
        registry: &mut Registry,
    ) -> NatsBroker {
        let metrics = Arc::new(ClusterMetrics::default());
        metrics.register(registry);
        let (out, out_rx) = mpsc::unbounded_channel();
        let (interest, interest_rx) = mpsc::unbounded_channel();
        NatsBroker {
            topics: format!("{}.t", config.prefix),
            history: config
                .jetstream
                .then(|| Arc::new(DurableHistory::new(&config, history))),
            config,
            max_message_bytes,
            node_id: format!("{:016x}", rand::random::<u64>()),
            pending: Arc::default(),
            out,
            interest,
            receivers: parking_lot::Mutex::new(Some((out_rx, interest_rx))),
            follows: Arc::default(),
            client: OnceLock::new(),
            uncarried: Arc::default(),
            announce: Arc::default(),
            gate: Arc::new(Gate::new(metrics.clone())),
            metrics,
        }
    }

    /// How this node connects to NATS: its name, no echo, reconnecting for ever, the
    /// configured credentials and TLS, and the events that drive the metrics. `retry`: the
    /// first connection too is retried in the background.
    async fn options(&self, retry: bool) -> anyhow::Result<ConnectOptions> {
        let config = &self.config;
        let (metrics, announce, history) = (
            self.metrics.clone(),
            self.announce.clone(),
            self.history.clone(),
        );
        let mut options = ConnectOptions::new()
            .name(format!("herald {}", self.node_id))
            .no_echo()
            .max_reconnects(None)
            .reconnect_delay_callback(|attempt| {
                Duration::from_millis((100 * attempt as u64).min(2000))
            })
            .event_callback(move |event| {
                let (metrics, announce, history) =
                    (metrics.clone(), announce.clone(), history.clone());
                async move {
                    match event {
                        Event::Connected => {
                            tracing::info!("connected to NATS");
                            metrics.connected.set(1);
                            metrics.connects.inc();
                            if metrics.connects.get() > 1 {
                                // What went out just before the outage may be lost.
                                announce.notify_one();
                            }
                            if let Some(history) = history {
                                history.reconnected.notify_one();
                            }
                        }
                        Event::Disconnected => {
                            tracing::warn!("disconnected from NATS; reconnecting");
                            metrics.connected.set(0);
                        }
                        Event::ServerError(async_nats::ServerError::AuthorizationViolation) => {
                            tracing::error!("NATS refused herald's credentials; retrying");
                        }
                        other => tracing::warn!(event = %other, "NATS"),
                    }
                }
            });
        if retry {
            options = options.retry_on_initial_connect();
        }
        if let (Some(user), Some(path)) = (&config.user, &config.password_file) {
            options = options.user_and_password(user.clone(), secret_file("password_file", path)?);
        }
        if let Some(path) = &config.token_file {
            options = options.token(secret_file("token_file", path)?);
        }
        if let Some(path) = &config.nkey_seed_file {
            options = options.nkey(secret_file("nkey_seed_file", path)?);
        }
        if let Some(path) = &config.credentials_file {
            options = options.credentials_file(path).await.with_context(|| {
                format!("cannot read [nats] credentials_file {}", path.display())
            })?;
        }
        if let Some(path) = &config.tls_ca_file {
            options = options.add_root_certificates(path.clone());
        }
        if let (Some(cert), Some(key)) = (&config.tls_cert_file, &config.tls_key_file) {
            options = options.add_client_certificate(cert.clone(), key.clone());
        }
        Ok(options.require_tls(config.requires_tls()))
    }

    /// Connects (in the background: herald serves its own clients while NATS is away) and
    /// starts the tasks that carry messages both ways. They hold the node's `events` weakly
    /// and end with it.
    async fn run(&self, events: Weak<dyn Events>) -> anyhow::Result<()> {
        let Some((out_rx, interest_rx)) = self.receivers.lock().take() else {
            bail!("the NATS broker is already started");
        };
        let key = match &self.config.cluster_key_file {
            Some(path) => Some(ClusterKey::from_file(path)?),
            None => None,
        };
        self.gate.set_key(key);
        let url = redacted(&self.config.url);
        // One attempt first: credentials or TLS that NATS refuses are a configuration error,
        // reported at once; NATS not reachable yet is not (herald serves alone meanwhile).
        let client = match self.options(false).await?.connect(self.config.url.as_str()).await {
            Ok(client) => client,
            Err(e) if tls_refused(&e) => bail!(
                "cannot reach NATS at {url} over TLS ({e}); check [nats] tls_ca_file, tls_cert_file, tls_key_file and tls_required"
            ),
            Err(e) => match e.kind() {
                ConnectErrorKind::AuthorizationViolation | ConnectErrorKind::Authentication => {
                    bail!(
                        "NATS at {url} refused herald's credentials ({e}); check [nats] user and password_file, token_file, nkey_seed_file or credentials_file"
                    )
                }
                ConnectErrorKind::Tls => bail!(
                    "cannot reach NATS at {url} over TLS ({e}); check [nats] tls_ca_file, tls_cert_file, tls_key_file and tls_required"
                ),
                ConnectErrorKind::ServerParse => bail!("[nats] url {url:?} is not a NATS URL"),
                _ => {
                    tracing::warn!(%url, error = %e, "NATS is not reachable yet; retrying in the background");
                    self.options(true)
                        .await?
                        .connect(self.config.url.as_str())
                        .await
                        .with_context(|| format!("cannot use NATS at {url}"))?
                }
            },
        };
        let _ = self.client.set(client.clone());
        tokio::spawn(carry_out(
            client.clone(),
            out_rx,
            self.pending.clone(),
            self.metrics.clone(),
            Announce {
                origin: self.node_id.clone(),
                uncarried: self.uncarried.clone(),
                gate: self.gate.clone(),
            },
        ));
        let inbound = Arc::new(Arrivals {
            events: events.clone(),
            max_message_bytes: self.max_message_bytes,
            topics: self.topics.clone(),
            metrics: self.metrics.clone(),
            gate: self.gate.clone(),
            partial: parking_lot::Mutex::default(),
        });
        tokio::spawn(follow_interest(
            client.clone(),
            interest_rx,
            inbound,
            self.topics.clone(),
            self.follows.clone(),
            format!("{}.ping", self.config.prefix),
        ));
        let (out, origin, topics) = (self.out.clone(), self.node_id.clone(), self.topics.clone());
        tokio::spawn(announce_positions(
            events,
            self.announce.clone(),
            move |topic, epoch, seq| {
                let subject = subject::to_subject(&topics, topic);
                let _ = out.send(Departure::mark(&origin, subject, epoch, seq));
            },
        ));
        if let Some(history) = &self.history {
            let metrics = self.metrics.clone();
            tokio::spawn(history.clone().keep_declared(client.clone(), move |ok| {
                metrics.jetstream_available.set(i64::from(ok));
            }));
        }
        tokio::spawn(heartbeat(
            client,
            self.config.prefix.clone(),
            self.node_id.clone(),
            self.metrics.clone(),
            self.announce.clone(),
            self.gate.clone(),
        ));
        Ok(())
    }
}

impl Broker for NatsBroker {
    fn start(&self, events: Weak<dyn Events>) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(self.run(events))
    }

    /// Queues the message for NATS, unless `max_pending_bytes` are already waiting (then it is
    /// counted as not carried and its position announced later).
    fn publish(&self, p: &Publish, epoch: &str, seq: u64, now_us: u64) {
        let size = p.payload.len();
        let subject = subject::to_subject(&self.topics, &p.topic);
        if self.pending.load(Ordering::Relaxed) + size > self.config.max_pending_bytes {
            self.metrics.not_carried.inc();
            self.uncarried.note(subject, epoch, seq);
            return;
        }
        self.metrics
            .pending_bytes
            .set(self.pending.fetch_add(size, Ordering::Relaxed) as i64 + size as i64);
        let outgoing = Departure::message(&self.node_id, subject, p, epoch, seq, now_us);
        // The receiver lives as long as the process once started; before that, messages wait.
        let _ = self.out.send(outgoing);
    }

    /// Local interest changed: subscribe or unsubscribe on NATS.
    fn interest(&self, changes: Vec<Interest>) {
        for change in changes {
            let _ = self.interest.send(change);
        }
    }

    /// Waits until NATS has confirmed this node's subscription to `pattern`, at most
    /// [`FOLLOW_TIMEOUT`]; not at all while NATS is away (the client restores subscriptions
    /// when it is back).
    fn followed<'a>(&'a self, pattern: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let Some(client) = self.client.get() else {
                return;
            };
            let deadline = tokio::time::Instant::now() + FOLLOW_TIMEOUT;
            loop {
                if client.connection_state() != State::Connected {
                    return;
                }
                let notified = self.follows.ready.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                let ready = self
                    .follows
                    .map
                    .lock()
                    .get(pattern)
                    .is_some_and(|f| f.ready.load(Ordering::Acquire));
                if ready {
                    return;
                }
                if tokio::time::timeout_at(deadline, notified).await.is_err() {
                    tracing::warn!(%pattern, "NATS did not confirm the subscription in time");
                    return;
                }
            }
        })
    }

    fn has_history(&self) -> bool {
        self.history.is_some()
    }

    /// Reads JetStream ([`DurableHistory::recall`]), counting what it found or that it failed.
    fn recall<'a>(
        &'a self,
        pattern: &'a str,
        unanswered: &'a Unanswered,
    ) -> BoxFuture<'a, anyhow::Result<Vec<TopicHistory>>> {
        Box::pin(async move {
            let Some(history) = &self.history else {
                return Ok(Vec::new());
            };
            let recalled = history
                .recall(pattern, unanswered, self.max_message_bytes, &self.gate)
                .await;
            match &recalled {
                Ok(found) => {
                    for (_, _, messages) in found {
                        self.metrics.recalled.inc_by(messages.len() as u64);
                    }
                }
                Err(_) => {
                    self.metrics.recall_failures.inc();
                }
            }
            recalled
        })
    }

    /// Cluster state for `/api/stats`.
    fn stats(&self) -> serde_json::Value {
        let m = &self.metrics;
        serde_json::json!({
            "node_id": self.node_id,
            "nats_connected": m.connected.get() == 1,
            "nats_connects": m.connects.get(),
            "nodes_seen": m.nodes_seen.get(),
            "remote_interest": m.remote_interest.get(),
            "messages_in": m.messages_in.get(),
            "bytes_in": m.bytes_in.get(),
            "messages_out": m.messages_out.get(),
            "bytes_out": m.bytes_out.get(),
            "pending_bytes": m.pending_bytes.get(),
            "not_carried": m.not_carried.get(),
            "missed": m.missed.get(),
            "incomplete": m.incomplete.get(),
            "jetstream": self.history.is_some(),
            "jetstream_available": m.jetstream_available.get() == 1,
            "recalled": m.recalled.get(),
            "recall_failures": m.recall_failures.get(),
        })
    }
}

/// Bytes handed to the NATS client before a flush must confirm them.
const FLUSH_EVERY: usize = 1 << 20;

/// Announces the positions of topics with messages that were not carried, once the queue has
/// drained.
struct Announce {
    origin: String,
    uncarried: Arc<Uncarried>,
    gate: Arc<Gate>,
}

impl Announce {
    async fn uncarried(&self, client: &Client) {
        let positions = self.uncarried.take();
        for (subject, (epoch, seq)) in positions {
            let mut m = Departure::mark(&self.origin, subject, &epoch, seq);
            self.gate.seal(&m.subject, &mut m.headers, &m.payload);
            if let Err(e) = client
                .publish_with_headers(m.subject, m.headers, m.payload)
                .await
            {
                tracing::warn!(error = %e, "could not announce a position to NATS");
            }
        }
    }
}

/// Hands queued messages to NATS in order, each in chunks that fit the server's `max_payload`.
///
/// The NATS client buffers what it is handed (by count, not bytes) and keeps it while
/// disconnected, so a message counts as pending until a flush confirms it left (written to the
/// socket, which blocks while the server does not read). A flush runs whenever the queue is empty (abandoned if a message comes
/// first, so it never delays one) and is awaited after every [`FLUSH_EVERY`] bytes. While NATS
/// is away or stalled, flushes wait, pending bytes reach `max_pending_bytes`, and
/// [`NatsBroker::publish`] stops queueing: memory stays bounded. Once the queue has drained,
/// the positions of topics whose messages were not carried are announced.
async fn carry_out(
    client: Client,
    mut rx: mpsc::UnboundedReceiver<Departure>,
    pending: Arc<AtomicUsize>,
    metrics: Arc<ClusterMetrics>,
    announce: Announce,
) {
    let confirm = |unflushed: &mut usize| {
        let left = pending.fetch_sub(*unflushed, Ordering::Relaxed) - *unflushed;
        metrics.pending_bytes.set(left as i64);
        *unflushed = 0;
    };
    let mut unflushed = 0;
    let mut next = rx.recv().await;
    while let Some(m) = next.take() {
        let size = m.payload.len();
        let (leaving, body) = m.leaving(now_us());
        let max_payload = client.server_info().max_payload;
        let chunk = max_payload.saturating_sub(HEADER_ROOM).max(HEADER_ROOM);
        let count = body.len().div_ceil(chunk).max(1);
        for i in 0..count {
            let mut headers = leaving.clone().into_owned();
            if count > 1 {
                headers.insert(CHUNK, format!("{i}/{count}").as_str());
            }
            let part = body.slice(i * chunk..((i + 1) * chunk).min(body.len()));
            announce.gate.seal(&m.subject, &mut headers, &part);
            if let Err(e) = client
                .publish_with_headers(m.subject.clone(), headers, part)
                .await
            {
                tracing::warn!(error = %e, "could not hand a message to NATS");
            }
        }
        if !m.mark {
            metrics.messages_out.inc();
            metrics.bytes_out.inc_by(size as u64);
        }
        unflushed += size;
        if unflushed >= FLUSH_EVERY {
            flush(&client).await;
            confirm(&mut unflushed);
        }
        next = match rx.try_recv() {
            Ok(m) => Some(m),
            Err(mpsc::error::TryRecvError::Disconnected) => None,
            Err(mpsc::error::TryRecvError::Empty) if unflushed == 0 => {
                announce.uncarried(&client).await;
                rx.recv().await
            }
            Err(mpsc::error::TryRecvError::Empty) => tokio::select! {
                m = rx.recv() => m,
                () = flush(&client) => {
                    confirm(&mut unflushed);
                    announce.uncarried(&client).await;
                    rx.recv().await
                }
            },
        };
    }
}

/// Flushes until NATS confirms (retrying while it is away).
async fn flush(client: &Client) {
    while let Err(e) = client.flush().await {
        tracing::debug!(error = %e, "NATS flush failed; retrying");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Returns once the NATS server has processed everything this client sent before: a request
/// to `subject`, on which nobody listens, is answered by the server itself ("no responders")
/// after it handled the commands ahead of it. (The client's `flush` only writes its buffer to
/// the socket.) Bounded by [`FOLLOW_TIMEOUT`].
async fn round_trip(client: &Client, subject: &str) {
    let request = client.request(subject.to_owned(), Bytes::new());
    match tokio::time::timeout(FOLLOW_TIMEOUT, request).await {
        Ok(Err(e)) if e.kind() == async_nats::RequestErrorKind::NoResponders => {}
        Ok(Ok(_)) => tracing::warn!(%subject, "something answers herald's round-trip subject"),
        Ok(Err(e)) => tracing::debug!(%subject, error = %e, "NATS round trip failed"),
        Err(_) => tracing::debug!(%subject, "NATS round trip timed out"),
    }
}

/// Keeps one NATS subscription per pattern local clients hold.
async fn follow_interest(
    client: Client,
    mut rx: mpsc::UnboundedReceiver<Interest>,
    inbound: Arc<Arrivals>,
    topics: String,
    follows: Arc<Follows>,
    ping: String,
) {
    while let Some(change) = rx.recv().await {
        match change {
            Interest::Added(pattern) => {
                let subject = subject::to_subject(&topics, &pattern);
                let ready = Arc::new(AtomicBool::new(false));
                let (client, inbound, confirmed, follows_, ping) = (
                    client.clone(),
                    inbound.clone(),
                    ready.clone(),
                    follows.clone(),
                    ping.clone(),
                );
                let task = tokio::spawn(async move {
                    let mut sub = match client.subscribe(subject.clone()).await {
                        Ok(sub) => sub,
                        Err(e) => {
                            tracing::error!(%subject, error = %e, "cannot subscribe on NATS");
                            return;
                        }
                    };
                    // Once the server has the subscription, say so: subscriptions waiting on
                    // it are answered, and tests wait on the gauge.
                    round_trip(&client, &ping).await;
                    tracing::debug!(%subject, "NATS has the subscription");
                    confirmed.store(true, Ordering::Release);
                    follows_.ready.notify_waiters();
                    inbound.metrics.remote_interest.inc();
                    let _counted = InterestGuard(inbound.metrics.clone());
                    while let Some(message) = sub.next().await {
                        inbound.receive(message);
                    }
                });
                if let Some(old) = follows.map.lock().insert(pattern, Follow { task, ready }) {
                    old.task.abort();
                }
                // The task may have confirmed before it was in the map.
                follows.ready.notify_waiters();
            }
            Interest::Removed(pattern) => {
                // Aborting drops the subscriber, which unsubscribes on NATS.
                if let Some(old) = follows.map.lock().remove(&pattern) {
                    old.task.abort();
                }
            }
        }
    }
}

/// Decrements the remote-interest gauge when a subscription task ends, however it ends.
struct InterestGuard(Arc<ClusterMetrics>);

impl Drop for InterestGuard {
    fn drop(&mut self) {
        self.0.remote_interest.dec();
    }
}

/// Receives other nodes' messages: checks them ([`Gate::open`]), reassembles chunks, hands
/// whole messages to the node.
struct Arrivals {
    events: Weak<dyn Events>,
    max_message_bytes: usize,
    topics: String,
    metrics: Arc<ClusterMetrics>,
    gate: Arc<Gate>,
    partial: parking_lot::Mutex<Reassembly>,
}

impl Arrivals {
    fn receive(&self, message: Message) {
        let Some(events) = self.events.upgrade() else {
            return;
        };
        let subject = message.subject.as_str();
        let Some(carried) = self
            .gate
            .open(subject, message.headers.as_ref(), &message.payload)
        else {
            return;
        };
        let Some(topic) = subject::to_topic(&self.topics, subject) else {
            self.gate.reject(Reject::Malformed, subject);
            return;
        };
        if carried.mark {
            let missed = events.remote_position(&topic, &carried.epoch, carried.seq);
            self.metrics.missed.inc_by(missed);
            return;
        }
        let payload = match carried.chunk {
            None => message.payload,
            Some(chunk) => {
                let added = self.partial.lock().add(
                    &carried.origin,
                    subject,
                    carried.seq,
                    chunk,
                    &message.payload,
                    body_limit(self.max_message_bytes),
                );
                self.metrics.incomplete.inc_by(added.discarded);
                if let Some(reason) = added.rejected {
                    self.gate.reject(reason, subject);
                }
                let Some(whole) = added.whole else {
                    return;
                };
                whole
            }
        };
        self.metrics.messages_in.inc();
        self.metrics.bytes_in.inc_by(payload.len() as u64);
        let arrived = now_us();
        let p = match carried.publish(topic, payload, arrived) {
            Ok(p) => p,
            Err(reason) => {
                self.gate.reject(reason, subject);
                return;
            }
        };
        let at = carried.stamp.unwrap_or(arrived);
        if let Some(missed) = events.remote_message(&p, &carried.epoch, carried.seq, at) {
            self.metrics.missed.inc_by(missed);
        }
    }
}

/// Nodes a heartbeat listener keeps track of at most (forged heartbeats cannot grow it).
const MAX_NODES: usize = 1024;

/// Announces this node every [`HEARTBEAT`] (its id and how many times it connected) and counts
/// the nodes heard recently. A node heard after it reconnected rings `announce`: it may have
/// missed this node's messages. (Announcements are kept in the JetStream stream like messages,
/// so they are made only when needed.)
async fn heartbeat(
    client: Client,
    prefix: String,
    node_id: String,
    metrics: Arc<ClusterMetrics>,
    announce: Arc<Notify>,
    gate: Arc<Gate>,
) {
    let subject = format!("{prefix}.nodes");
    let mut sub = loop {
        match client.subscribe(subject.clone()).await {
            Ok(sub) => break sub,
            Err(_) => tokio::time::sleep(HEARTBEAT).await,
        }
    };
    let mut seen: HashMap<String, (String, Instant)> = HashMap::new();
    let mut tick = tokio::time::interval(HEARTBEAT);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let me = Bytes::from(format!("{node_id} {}", metrics.connects.get()));
                let mut headers = HeaderMap::new();
                gate.seal(&subject, &mut headers, &me);
                let _ = if headers.is_empty() {
                    client.publish(subject.clone(), me).await
                } else {
                    client.publish_with_headers(subject.clone(), headers, me).await
                };
                seen.retain(|_, (_, at)| at.elapsed() < HEARTBEAT * 3);
                metrics.nodes_seen.set(seen.len() as i64 + 1);
            }
            Some(message) = sub.next() => {
                if !gate.verify(&subject, message.headers.as_ref(), &message.payload) {
                    continue;
                }
                let text = String::from_utf8_lossy(&message.payload);
                let (id, connects) = text.split_once(' ').unwrap_or((&text, ""));
                if id.len() > 64 || connects.len() > 20 {
                    gate.reject(Reject::Malformed, &subject);
                    continue;
                }
                if !seen.contains_key(id) && seen.len() >= MAX_NODES {
                    continue;
                }
                let before = seen.insert(id.to_owned(), (connects.to_owned(), Instant::now()));
                // A node on its first connection holds nothing to fill in; a node that
                // reconnected may have missed what was published meanwhile.
                let rejoined = match before {
                    Some((c, _)) => c != connects,
                    None => connects != "1",
                };
                if rejoined {
                    announce.notify_one();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_shown_without_credentials() {
        assert_eq!(
            redacted("nats://herald:s3cret@10.0.0.5:4222,tls://tok@n2:4222,n3:4222"),
            "nats://***@10.0.0.5:4222,tls://***@n2:4222,n3:4222"
        );
    }
}
