//! The NATS broker: several herald nodes as one (see docs/cluster.md).
//!
//! Each node keeps its own engine; NATS carries messages between them. The engine says which
//! patterns its clients hold ([`Interest`]); this bridge subscribes on NATS to exactly those
//! (one subscription per pattern, mapped by [`herald_core::subject`]) and drops a subscription
//! when its last local subscriber leaves. A message published on this node is numbered and
//! delivered locally first (local delivery never waits on NATS), then queued for NATS with its
//! `(epoch, seq)` in headers; other nodes keep those numbers (`Engine::publish_remote`), so a
//! topic published from one node has the same numbers everywhere and `since` works after a
//! client moves to another node.
//!
//! The connection uses `no_echo`: NATS never hands a node its own publications back. Messages
//! larger than the server's `max_payload` travel as consecutive chunks of one subject and are
//! reassembled per origin and topic; an incomplete message is discarded, never delivered. The
//! outgoing queue is bounded in bytes (`max_pending_bytes`): past it, messages are not carried
//! (counted), and remote nodes see the hole in the sequence and tell their subscribers.

use crate::node::{now_us, Node};
use anyhow::{bail, Context};
use async_nats::{Client, ConnectOptions, Event, HeaderMap, Message};
use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use herald_core::engine::Interest;
use herald_core::subject;
use herald_core::wire::{PayloadKind, Publish};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

const ORIGIN: &str = "Herald-Origin";
const EPOCH: &str = "Herald-Epoch";
const SEQ: &str = "Herald-Seq";
const KIND: &str = "Herald-Kind";
const CONTENT_TYPE: &str = "Herald-Content-Type";
const STAMP: &str = "Herald-Stamp";
const CHUNK: &str = "Herald-Chunk";
/// Room left in each NATS message for the headers above.
const HEADER_ROOM: usize = 4096;
/// How often a node announces itself on `<prefix>.nodes`; nodes unheard for three periods are
/// no longer counted.
const HEARTBEAT: Duration = Duration::from_secs(1);

/// `[nats]` in the configuration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NatsConfig {
    /// NATS server URL(s), comma-separated, e.g. `nats://127.0.0.1:4222`.
    pub url: String,
    /// Subject prefix: topics travel as `<prefix>.t.<escaped levels>`. Clusters sharing one NATS
    /// keep apart by using different prefixes.
    pub prefix: String,
    /// Bytes of published messages waiting to be handed to NATS before more are not carried.
    pub max_pending_bytes: usize,
}

impl Default for NatsConfig {
    fn default() -> Self {
        NatsConfig {
            url: String::new(),
            prefix: "herald".into(),
            max_pending_bytes: 64 << 20,
        }
    }
}

impl NatsConfig {
    pub fn validate(&self) -> anyhow::Result<()> {
        if self.url.is_empty() {
            bail!("[nats] needs a url, e.g. url = \"nats://127.0.0.1:4222\" (or --nats)");
        }
        let token_ok = |t: &str| {
            !t.is_empty()
                && t.bytes()
                    .all(|b| b.is_ascii_graphic() && !b"*>.".contains(&b))
        };
        if !self.prefix.split('.').all(token_ok) {
            bail!(
                "[nats] prefix {:?} is not a NATS subject prefix; use tokens of letters and digits separated by '.'",
                self.prefix
            );
        }
        if self.max_pending_bytes == 0 {
            bail!("[nats] max_pending_bytes must be greater than zero");
        }
        Ok(())
    }
}

/// Cluster metrics, registered beside the node's own.
#[derive(Default)]
struct ClusterMetrics {
    connected: Gauge,
    connects: Counter,
    nodes_seen: Gauge,
    remote_interest: Gauge,
    messages_out: Counter,
    bytes_out: Counter,
    messages_in: Counter,
    bytes_in: Counter,
    not_carried: Counter,
    pending_bytes: Gauge,
    missed: Counter,
    incomplete: Counter,
}

impl ClusterMetrics {
    fn register(&self, r: &mut Registry) {
        let r = r.sub_registry_with_prefix("cluster");
        r.register(
            "nats_connected",
            "1 while connected to NATS",
            self.connected.clone(),
        );
        r.register(
            "nats_connects",
            "Connections (and reconnections) to NATS",
            self.connects.clone(),
        );
        r.register(
            "nodes_seen",
            "herald nodes heard from in the last 3 s, this one included",
            self.nodes_seen.clone(),
        );
        r.register(
            "remote_interest",
            "Patterns this node subscribes to on NATS",
            self.remote_interest.clone(),
        );
        r.register(
            "messages_out",
            "Messages handed to NATS",
            self.messages_out.clone(),
        );
        r.register(
            "bytes_out",
            "Payload bytes handed to NATS",
            self.bytes_out.clone(),
        );
        r.register(
            "messages_in",
            "Messages received from other nodes",
            self.messages_in.clone(),
        );
        r.register(
            "bytes_in",
            "Payload bytes received from other nodes",
            self.bytes_in.clone(),
        );
        r.register(
            "not_carried",
            "Messages not handed to NATS because max_pending_bytes was reached",
            self.not_carried.clone(),
        );
        r.register(
            "pending_bytes",
            "Bytes waiting to be handed to NATS",
            self.pending_bytes.clone(),
        );
        r.register(
            "missed",
            "Messages from other nodes found missing (holes in their sequence)",
            self.missed.clone(),
        );
        r.register(
            "incomplete",
            "Chunked messages discarded because a chunk was missing",
            self.incomplete.clone(),
        );
    }
}

/// A message on its way to NATS.
struct Outgoing {
    subject: String,
    headers: HeaderMap,
    payload: Bytes,
}

/// This node's side of the NATS broker: what the engine's callers hand it, it carries.
pub struct NatsBroker {
    config: NatsConfig,
    /// Random per process: tells other nodes apart (metrics) and names reassembly streams.
    node_id: String,
    topics: String,
    metrics: Arc<ClusterMetrics>,
    pending: Arc<AtomicUsize>,
    out: mpsc::UnboundedSender<Outgoing>,
    interest: mpsc::UnboundedSender<Interest>,
    receivers: parking_lot::Mutex<
        Option<(
            mpsc::UnboundedReceiver<Outgoing>,
            mpsc::UnboundedReceiver<Interest>,
        )>,
    >,
}

impl NatsBroker {
    /// The broker for `config`, its metrics registered in `registry`. Nothing is connected until
    /// [`NatsBroker::start`].
    pub fn new(config: NatsConfig, registry: &mut Registry) -> NatsBroker {
        let metrics = Arc::new(ClusterMetrics::default());
        metrics.register(registry);
        let (out, out_rx) = mpsc::unbounded_channel();
        let (interest, interest_rx) = mpsc::unbounded_channel();
        NatsBroker {
            topics: format!("{}.t", config.prefix),
            config,
            node_id: format!("{:016x}", rand::random::<u64>()),
            metrics,
            pending: Arc::default(),
            out,
            interest,
            receivers: parking_lot::Mutex::new(Some((out_rx, interest_rx))),
        }
    }

    /// Hands a message this node published (numbered `(epoch, seq)`) to NATS, unless
    /// `max_pending_bytes` are already waiting. Never blocks.
    pub fn publish(&self, p: &Publish, epoch: &str, seq: u64, now_us: u64) {
        let size = p.payload.len();
        if self.pending.load(Ordering::Relaxed) + size > self.config.max_pending_bytes {
            self.metrics.not_carried.inc();
            return;
        }
        self.metrics
            .pending_bytes
            .set(self.pending.fetch_add(size, Ordering::Relaxed) as i64 + size as i64);
        let mut headers = HeaderMap::new();
        headers.insert(ORIGIN, self.node_id.as_str());
        headers.insert(EPOCH, epoch);
        headers.insert(SEQ, seq.to_string().as_str());
        if p.kind == PayloadKind::Text {
            headers.insert(KIND, "text");
        }
        if let Some(ct) = &p.content_type {
            headers.insert(CONTENT_TYPE, ct.as_str());
        }
        if p.stamp {
            headers.insert(STAMP, now_us.to_string().as_str());
        }
        let outgoing = Outgoing {
            subject: subject::to_subject(&self.topics, &p.topic),
            headers,
            payload: p.payload.clone(),
        };
        // The receiver lives as long as the process once started; before that, messages wait.
        let _ = self.out.send(outgoing);
    }

    /// Local interest changed: subscribe or unsubscribe on NATS.
    pub fn interest(&self, changes: Vec<Interest>) {
        for change in changes {
            let _ = self.interest.send(change);
        }
    }

    /// Connects (in the background: herald serves its own clients while NATS is away) and
    /// starts the tasks that carry messages both ways. They hold the node weakly and end with it.
    pub async fn start(&self, node: &Arc<Node>) -> anyhow::Result<()> {
        let Some((out_rx, interest_rx)) = self.receivers.lock().take() else {
            bail!("the NATS broker is already started");
        };
        let metrics = self.metrics.clone();
        let options = ConnectOptions::new()
            .name(format!("herald {}", self.node_id))
            .no_echo()
            .retry_on_initial_connect()
            .max_reconnects(None)
            .reconnect_delay_callback(|attempt| {
                Duration::from_millis((100 * attempt as u64).min(2000))
            })
            .event_callback(move |event| {
                let metrics = metrics.clone();
                async move {
                    match event {
                        Event::Connected => {
                            tracing::info!("connected to NATS");
                            metrics.connected.set(1);
                            metrics.connects.inc();
                        }
                        Event::Disconnected => {
                            tracing::warn!("disconnected from NATS; reconnecting");
                            metrics.connected.set(0);
                        }
                        other => tracing::warn!(event = %other, "NATS"),
                    }
                }
            });
        let client = options
            .connect(self.config.url.as_str())
            .await
            .with_context(|| format!("cannot use NATS at {}", self.config.url))?;
        let weak = Arc::downgrade(node);
        tokio::spawn(carry_out(
            client.clone(),
            out_rx,
            self.pending.clone(),
            self.metrics.clone(),
        ));
        let inbound = Arc::new(Inbound {
            node: weak,
            topics: self.topics.clone(),
            metrics: self.metrics.clone(),
            partial: parking_lot::Mutex::default(),
        });
        tokio::spawn(follow_interest(
            client.clone(),
            interest_rx,
            inbound,
            self.topics.clone(),
        ));
        tokio::spawn(heartbeat(
            client,
            self.config.prefix.clone(),
            self.node_id.clone(),
            self.metrics.clone(),
        ));
        Ok(())
    }
}

/// Bytes handed to the NATS client before a flush must confirm them.
const FLUSH_EVERY: usize = 1 << 20;

/// Hands queued messages to NATS in order, each in chunks that fit the server's `max_payload`.
///
/// The NATS client buffers what it is handed (by count, not bytes) and keeps it while
/// disconnected, so a message counts as pending until a flush — a round trip to the server —
/// confirms it left. A flush runs whenever the queue is empty (abandoned if a message comes
/// first, so it never delays one) and is awaited after every [`FLUSH_EVERY`] bytes. While NATS
/// is away or stalled, flushes wait, pending bytes reach `max_pending_bytes`, and
/// [`NatsBroker::publish`] stops queueing: memory stays bounded.
async fn carry_out(
    client: Client,
    mut rx: mpsc::UnboundedReceiver<Outgoing>,
    pending: Arc<AtomicUsize>,
    metrics: Arc<ClusterMetrics>,
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
        let max_payload = client.server_info().max_payload;
        let chunk = max_payload.saturating_sub(HEADER_ROOM).max(HEADER_ROOM);
        let count = size.div_ceil(chunk).max(1);
        for i in 0..count {
            let mut headers = m.headers.clone();
            if count > 1 {
                headers.insert(CHUNK, format!("{i}/{count}").as_str());
            }
            let part = m.payload.slice(i * chunk..((i + 1) * chunk).min(size));
            if let Err(e) = client
                .publish_with_headers(m.subject.clone(), headers, part)
                .await
            {
                tracing::warn!(error = %e, "could not hand a message to NATS");
            }
        }
        metrics.messages_out.inc();
        metrics.bytes_out.inc_by(size as u64);
        unflushed += size;
        if unflushed >= FLUSH_EVERY {
            flush(&client).await;
            confirm(&mut unflushed);
        }
        next = match rx.try_recv() {
            Ok(m) => Some(m),
            Err(mpsc::error::TryRecvError::Disconnected) => None,
            Err(mpsc::error::TryRecvError::Empty) if unflushed == 0 => rx.recv().await,
            Err(mpsc::error::TryRecvError::Empty) => tokio::select! {
                m = rx.recv() => m,
                () = flush(&client) => {
                    confirm(&mut unflushed);
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

/// Keeps one NATS subscription per pattern local clients hold.
async fn follow_interest(
    client: Client,
    mut rx: mpsc::UnboundedReceiver<Interest>,
    inbound: Arc<Inbound>,
    topics: String,
) {
    let mut subscriptions: HashMap<String, JoinHandle<()>> = HashMap::new();
    while let Some(change) = rx.recv().await {
        match change {
            Interest::Added(pattern) => {
                let subject = subject::to_subject(&topics, &pattern);
                let (client, inbound) = (client.clone(), inbound.clone());
                let task = tokio::spawn(async move {
                    let mut sub = match client.subscribe(subject.clone()).await {
                        Ok(sub) => sub,
                        Err(e) => {
                            tracing::error!(%subject, error = %e, "cannot subscribe on NATS");
                            return;
                        }
                    };
                    // Once the server has the subscription, say so (tests wait on this gauge).
                    let _ = client.flush().await;
                    inbound.metrics.remote_interest.inc();
                    let _counted = InterestGuard(inbound.metrics.clone());
                    while let Some(message) = sub.next().await {
                        inbound.receive(message);
                    }
                });
                if let Some(old) = subscriptions.insert(pattern, task) {
                    old.abort();
                }
            }
            Interest::Removed(pattern) => {
                // Aborting drops the subscriber, which unsubscribes on NATS.
                if let Some(task) = subscriptions.remove(&pattern) {
                    task.abort();
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

/// A chunked message being put back together.
struct Partial {
    seq: u64,
    next: usize,
    buf: BytesMut,
}

/// Receives other nodes' messages: reassembles chunks, hands whole messages to the engine.
struct Inbound {
    node: Weak<Node>,
    topics: String,
    metrics: Arc<ClusterMetrics>,
    /// Per (origin, subject): chunks of one message arrive in order on one subject.
    partial: parking_lot::Mutex<HashMap<(String, String), Partial>>,
}

impl Inbound {
    fn receive(&self, message: Message) {
        let Some(node) = self.node.upgrade() else {
            return;
        };
        let Some(headers) = message.headers.as_ref() else {
            return;
        };
        let header = |name: &str| headers.get(name).map(|v| v.as_str().to_owned());
        let (Some(origin), Some(epoch), Some(seq)) = (
            header(ORIGIN),
            header(EPOCH),
            header(SEQ).and_then(|s| s.parse::<u64>().ok()),
        ) else {
            tracing::debug!(subject = %message.subject, "ignoring a NATS message without herald headers");
            return;
        };
        let Some(topic) = subject::to_topic(&self.topics, &message.subject) else {
            return;
        };
        let payload = match header(CHUNK) {
            None => message.payload,
            Some(chunk) => {
                let Some(whole) = self.reassemble(
                    &origin,
                    &message.subject,
                    seq,
                    &chunk,
                    &message.payload,
                    node.config.max_message_bytes,
                ) else {
                    return;
                };
                whole
            }
        };
        self.metrics.messages_in.inc();
        self.metrics.bytes_in.inc_by(payload.len() as u64);
        let stamp = header(STAMP).and_then(|s| s.parse::<u64>().ok());
        let p = Publish {
            id: None,
            topic,
            payload,
            kind: match header(KIND).as_deref() {
                Some("text") => PayloadKind::Text,
                _ => PayloadKind::Binary,
            },
            content_type: header(CONTENT_TYPE),
            stamp: stamp.is_some(),
        };
        if let Some(missed) = node.publish_remote(&p, &epoch, seq, stamp.unwrap_or_else(now_us)) {
            self.metrics.missed.inc_by(missed);
        }
    }

    /// Adds chunk `i/n` (the `Herald-Chunk` header) and returns the message once whole. A chunk
    /// out of order means one was lost: the partial message is discarded and counted.
    fn reassemble(
        &self,
        origin: &str,
        subject: &str,
        seq: u64,
        chunk: &str,
        part: &Bytes,
        limit: usize,
    ) -> Option<Bytes> {
        let (i, n) = chunk.split_once('/')?;
        let (i, n): (usize, usize) = (i.parse().ok()?, n.parse().ok()?);
        let mut partials = self.partial.lock();
        let key = (origin.to_owned(), subject.to_owned());
        let current = partials.get_mut(&key).filter(|p| p.seq == seq);
        match current {
            Some(p) if i < p.next => return None, // a duplicate (overlapping subscriptions)
            Some(p) if i == p.next && p.buf.len() + part.len() <= limit => {
                p.buf.extend_from_slice(part);
                p.next += 1;
            }
            _ if i == 0 => {
                if partials.remove(&key).is_some() {
                    self.metrics.incomplete.inc();
                }
                let mut buf = BytesMut::with_capacity(part.len() * n);
                buf.extend_from_slice(part);
                partials.insert(key.clone(), Partial { seq, next: 1, buf });
            }
            _ => {
                if partials.remove(&key).is_some() {
                    self.metrics.incomplete.inc();
                }
                return None;
            }
        }
        if partials.get(&key).is_some_and(|p| p.next == n) {
            return partials.remove(&key).map(|p| p.buf.freeze());
        }
        None
    }
}

/// Announces this node every [`HEARTBEAT`] and counts the nodes heard recently.
async fn heartbeat(client: Client, prefix: String, node_id: String, metrics: Arc<ClusterMetrics>) {
    let subject = format!("{prefix}.nodes");
    let mut sub = loop {
        match client.subscribe(subject.clone()).await {
            Ok(sub) => break sub,
            Err(_) => tokio::time::sleep(HEARTBEAT).await,
        }
    };
    let mut seen: HashMap<Bytes, Instant> = HashMap::new();
    let mut tick = tokio::time::interval(HEARTBEAT);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let _ = client.publish(subject.clone(), Bytes::from(node_id.clone())).await;
                seen.retain(|_, at| at.elapsed() < HEARTBEAT * 3);
                metrics.nodes_seen.set(seen.len() as i64 + 1);
            }
            Some(message) = sub.next() => {
                seen.insert(message.payload, Instant::now());
            }
        }
    }
}
