//! Subscriber connections: a pool of WebSocket clients on one event-loop thread.
//!
//! A [`Pool`] owns a thread running a current-thread tokio runtime; every client is a local task
//! (no locks, no cross-thread wake-ups). The orchestrator talks to it through commands: add
//! clients `from..to` (connected at a bounded rate), collect a snapshot, shut down. Live counters
//! (connected, received, …) are atomics in [`Shared`] for the progress line, and the measuring
//! window is two wall-clock instants there: a delivery counts towards latency and egress when it
//! is received inside the window. Integrity is counted over the whole run.
//!
//! Per delivery the client: reads the frame in its protocol ([`crate::protocol::Decoder`]),
//! finds the topic's slot in its block by subtraction ([`crate::schedule::Assignment`]), updates
//! the (subscriber, topic) [`TopicTrack`] (over MQTT, one per publisher too: see
//! [`crate::protocol`]), and records receive − send (and the two legs when herald stamped it),
//! into the pool's histograms and into the subscriber's own ([`crate::fairness`]).
//!
//! Stock-exchange clients can also trade: every `trader.every`-th client publishes an order on
//! its share every `trader.interval_us`.

use std::cell::RefCell;
use std::net::{Ipv4Addr, SocketAddr};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use crate::fairness::{SubscriberLatency, SubscriberP99};
use crate::integrity::{Counts, TopicTrack};
use crate::protocol::{self, Decoder, Endpoint, Protocol};
use crate::schedule::{Assignment, Schedule};
use crate::stats;
use crate::wire::{self, Incoming};
use crate::ws_client::{ServerMessage, WsClient, WsWriter};

/// What every client of a pool does. Serialisable: worker processes receive it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClientSpec {
    pub url: String,
    /// When not empty, subscriber `i` connects to `sub_urls[i % len]` instead of `url`
    /// (several herald nodes of one cluster; publishers stay on `url`).
    #[serde(default)]
    pub sub_urls: Vec<String>,
    pub topics: u64,
    pub subs_per_client: u64,
    pub topic_prefix: String,
    pub topic_names: Vec<String>,
    pub connect_rate: f64,
    pub max_message: usize,
    /// Bind each client to a source address in 127.1.0.0/16, 20,000 clients per address, so
    /// more connections than the ephemeral port range can be opened to one server.
    pub bind_sources: bool,
    /// Keep every delivery's (send, herald's stamp, receive, arrival) in the window, not only
    /// the histograms (the proxy scenario; a fan-out with `--samples`).
    pub record_raw: bool,
    /// Ask the kernel when each read's bytes arrived ([`WsClient::stamp_arrivals`]), kept in
    /// the raw samples: a diagnostic run's (`--samples`) split of herald → subscriber.
    #[serde(default)]
    pub stamp_arrivals: bool,
    /// Samples to reserve room for at a window's first: a list grown by doubling copies
    /// itself, a stall of milliseconds once it holds millions.
    pub raw_reserve: usize,
    pub trader: Option<TraderSpec>,
    /// The protocol the subscribers speak.
    #[serde(default)]
    pub protocol: Protocol,
    /// MQTT: the QoS subscribed at (0 or 1).
    #[serde(default)]
    pub qos: u8,
    /// The publishers whose own numbering a subscriber checks, when the server gives none
    /// (MQTT): a track per (topic, publisher).
    #[serde(default = "one")]
    pub publishers: u64,
}

fn one() -> u64 {
    1
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TraderSpec {
    /// Client `c` trades when `(c / block) % every == 0`: one block of `block` consecutive
    /// clients in every `every` blocks, so with `block` = the number of shares the traders are
    /// spread evenly over the shares.
    pub every: u64,
    pub block: u64,
    pub interval_us: u64,
    pub payload: usize,
    pub stamp: bool,
}

impl TraderSpec {
    pub fn is_trader(&self, id: u64) -> bool {
        self.every > 0 && (id / self.block.max(1)).is_multiple_of(self.every)
    }
}

impl ClientSpec {
    pub fn assignment(&self) -> Assignment {
        Assignment::new(self.topic_count(), self.subs_per_client)
    }

    pub fn topic_count(&self) -> u64 {
        if self.topic_names.is_empty() {
            self.topics.max(1)
        } else {
            self.topic_names.len() as u64
        }
    }

    pub fn topic(&self, n: u64) -> String {
        match self.topic_names.get(n as usize) {
            Some(name) => format!("{}/{}", self.topic_prefix, name),
            None => format!("{}/{}", self.topic_prefix, n),
        }
    }

    /// Tracks per subscribed topic: one per publisher when the deliveries carry their
    /// publisher's numbering, else one.
    fn lanes(&self) -> usize {
        match self.protocol {
            Protocol::Mqtt => self.publishers.max(1) as usize,
            Protocol::Native | Protocol::Stomp => 1,
        }
    }

    fn topic_index(&self, topic: &[u8]) -> Option<u64> {
        if self.topic_names.is_empty() {
            wire::topic_number(topic)
        } else {
            let i = memchr::memrchr(b'/', topic).map(|i| i + 1).unwrap_or(0);
            self.topic_names
                .iter()
                .position(|n| n.as_bytes() == &topic[i..])
                .map(|p| p as u64)
        }
    }
}

/// Live counters shared with the orchestrator (and mirrored from worker processes).
#[derive(Debug, Default)]
pub struct Shared {
    pub win_start_us: AtomicU64,
    pub win_end_us: AtomicU64,
    pub received: AtomicU64,
    pub connected: AtomicU64,
    /// Clients whose every subscription was confirmed.
    pub ready: AtomicU64,
    pub failed: AtomicU64,
    /// Connections that closed before the end.
    pub closed: AtomicU64,
    pub orders: AtomicU64,
    pub stop: AtomicBool,
}

impl Shared {
    pub fn new() -> Arc<Shared> {
        let s = Shared::default();
        s.win_end_us.store(u64::MAX, Relaxed);
        s.win_start_us.store(u64::MAX, Relaxed);
        Arc::new(s)
    }

    pub fn progress(&self) -> Progress {
        Progress {
            received: self.received.load(Relaxed),
            connected: self.connected.load(Relaxed),
            ready: self.ready.load(Relaxed),
            failed: self.failed.load(Relaxed),
            closed: self.closed.load(Relaxed),
            orders: self.orders.load(Relaxed),
        }
    }

    pub fn set_progress(&self, p: &Progress) {
        self.received.store(p.received, Relaxed);
        self.connected.store(p.connected, Relaxed);
        self.ready.store(p.ready, Relaxed);
        self.failed.store(p.failed, Relaxed);
        self.closed.store(p.closed, Relaxed);
        self.orders.store(p.orders, Relaxed);
    }
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct Progress {
    pub received: u64,
    pub connected: u64,
    pub ready: u64,
    pub failed: u64,
    pub closed: u64,
    pub orders: u64,
}

impl Progress {
    pub fn add(&mut self, o: &Progress) {
        self.received += o.received;
        self.connected += o.connected;
        self.ready += o.ready;
        self.failed += o.failed;
        self.closed += o.closed;
        self.orders += o.orders;
    }
}

/// One raw latency sample: (send µs, herald ts µs or 0, receive µs, the kernel's receive time
/// of the read that completed it µs or 0), µs since the UNIX epoch.
pub type RawSample = (u64, u64, u64, u64);

/// What a pool measured since the previous collect (histograms, window counts) and in total
/// (integrity, which also holds the loss counted so far).
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub counts: Counts,
    pub window_received: u64,
    pub window_bytes: u64,
    pub window_orders: u64,
    pub latency: Histogram<u64>,
    pub pub_to_server: Histogram<u64>,
    pub server_to_sub: Histogram<u64>,
    /// Each subscriber's p99 latency in the window, µs, for those with enough samples
    /// ([`crate::fairness::MIN_SAMPLES`]); in no particular order.
    pub sub_p99: Vec<SubscriberP99>,
    pub raw: Vec<RawSample>,
    pub errors: Vec<String>,
    /// CPU seconds of the process the pool ran in since its previous collect (workers only).
    pub cpu_s: f64,
}

impl Snapshot {
    pub fn empty() -> Snapshot {
        Snapshot {
            counts: Counts::default(),
            window_received: 0,
            window_bytes: 0,
            window_orders: 0,
            latency: stats::new_histogram(),
            pub_to_server: stats::new_histogram(),
            server_to_sub: stats::new_histogram(),
            sub_p99: vec![],
            raw: vec![],
            errors: vec![],
            cpu_s: 0.0,
        }
    }

    pub fn merge(&mut self, o: Snapshot) {
        self.counts.add(&o.counts);
        self.window_received += o.window_received;
        self.window_bytes += o.window_bytes;
        self.window_orders += o.window_orders;
        let _ = self.latency.add(&o.latency);
        let _ = self.pub_to_server.add(&o.pub_to_server);
        let _ = self.server_to_sub.add(&o.server_to_sub);
        self.sub_p99.extend(o.sub_p99);
        self.raw.extend(o.raw);
        for e in o.errors {
            push_error(&mut self.errors, e);
        }
        self.cpu_s += o.cpu_s;
    }

    pub fn to_wire(&self) -> SnapshotWire {
        SnapshotWire {
            counts: self.counts,
            window_received: self.window_received,
            window_bytes: self.window_bytes,
            window_orders: self.window_orders,
            latency: stats::encode_histogram(&self.latency),
            pub_to_server: stats::encode_histogram(&self.pub_to_server),
            server_to_sub: stats::encode_histogram(&self.server_to_sub),
            sub_p99: self.sub_p99.clone(),
            raw: self.raw.clone(),
            errors: self.errors.clone(),
            cpu_s: self.cpu_s,
        }
    }
}

/// [`Snapshot`] as worker processes send it (histograms base64-encoded).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SnapshotWire {
    pub counts: Counts,
    pub window_received: u64,
    pub window_bytes: u64,
    pub window_orders: u64,
    pub latency: String,
    pub pub_to_server: String,
    pub server_to_sub: String,
    #[serde(default)]
    pub sub_p99: Vec<SubscriberP99>,
    pub raw: Vec<RawSample>,
    pub errors: Vec<String>,
    pub cpu_s: f64,
}

impl SnapshotWire {
    pub fn into_snapshot(self) -> Result<Snapshot> {
        Ok(Snapshot {
            counts: self.counts,
            window_received: self.window_received,
            window_bytes: self.window_bytes,
            window_orders: self.window_orders,
            latency: stats::decode_histogram(&self.latency)?,
            pub_to_server: stats::decode_histogram(&self.pub_to_server)?,
            server_to_sub: stats::decode_histogram(&self.server_to_sub)?,
            sub_p99: self.sub_p99,
            raw: self.raw,
            errors: self.errors,
            cpu_s: self.cpu_s,
        })
    }
}

/// Keeps the first few distinct errors (and counts the rest in the last entry).
pub fn push_error(list: &mut Vec<String>, e: String) {
    const MAX: usize = 10;
    if list.len() < MAX {
        if !list.contains(&e) {
            list.push(e);
        }
    } else if list.len() == MAX {
        list.push("… more errors not shown".into());
    }
}

enum Cmd {
    Add(u64, u64),
    Collect(std::sync::mpsc::Sender<Snapshot>),
    Shutdown(std::sync::mpsc::Sender<Snapshot>),
}

/// A pool of subscriber clients on its own thread.
pub struct Pool {
    tx: tokio::sync::mpsc::UnboundedSender<Cmd>,
    pub shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Pool {
    pub fn start(spec: ClientSpec, shared: Arc<Shared>) -> Result<Pool> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let sh = shared.clone();
        let thread = std::thread::Builder::new()
            .name("bench-subscribers".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("tokio runtime");
                let local = tokio::task::LocalSet::new();
                local.block_on(&rt, pool_main(spec, sh, rx));
            })
            .context("cannot start the subscriber thread")?;
        Ok(Pool {
            tx,
            shared,
            thread: Some(thread),
        })
    }

    pub fn add(&self, from: u64, to: u64) {
        let _ = self.tx.send(Cmd::Add(from, to));
    }

    pub fn collect(&self) -> Result<Snapshot> {
        let (tx, rx) = std::sync::mpsc::channel();
        self.tx
            .send(Cmd::Collect(tx))
            .ok()
            .context("subscriber thread ended")?;
        rx.recv_timeout(Duration::from_secs(60))
            .context("subscriber thread did not answer")
    }

    /// Collects a last snapshot (with final loss accounting) and closes every connection.
    pub fn shutdown(mut self) -> Result<Snapshot> {
        self.shared.stop.store(true, Relaxed);
        let (tx, rx) = std::sync::mpsc::channel();
        self.tx
            .send(Cmd::Shutdown(tx))
            .ok()
            .context("subscriber thread ended")?;
        let snap = rx
            .recv_timeout(Duration::from_secs(60))
            .context("subscriber thread did not answer")?;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        Ok(snap)
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.stop.store(true, Relaxed);
        if let Some(t) = self.thread.take() {
            let (tx, _rx) = std::sync::mpsc::channel();
            let _ = self.tx.send(Cmd::Shutdown(tx));
            let _ = t.join();
        }
    }
}

/// State of the pool's thread shared by its client tasks.
struct Local {
    spec: ClientSpec,
    assignment: Assignment,
    shared: Arc<Shared>,
    counts: Counts,
    tracks: Vec<Rc<RefCell<Vec<TopicTrack>>>>,
    /// What the window measured since the last [`Local::snapshot`] (its `counts`, `sub_p99`
    /// and `cpu_s` are filled in there).
    window: Snapshot,
    /// Each connected subscriber's own latencies, indexed by [`Receiver::slot`].
    subscribers: Vec<SubscriberLatency>,
    stop: Rc<tokio::sync::Notify>,
}

impl Local {
    fn new(spec: ClientSpec, shared: Arc<Shared>) -> Local {
        Local {
            assignment: spec.assignment(),
            spec,
            shared,
            counts: Counts::default(),
            tracks: vec![],
            window: Snapshot::empty(),
            subscribers: vec![],
            stop: Rc::new(tokio::sync::Notify::new()),
        }
    }

    /// Counts a delivery to the subscriber in `slot` received at `recv_us` (its bytes reached
    /// the socket at `arrived_us`, 0 when reads are not stamped), and records its latencies
    /// when it was received inside the measuring window. The subscriber's own histogram is
    /// allocated at its first delivery, window or not (see [`crate::fairness`]).
    fn on_delivery(&mut self, slot: usize, d: &wire::Delivery, recv_us: u64, arrived_us: u64) {
        let ws = self.shared.win_start_us.load(Relaxed);
        let we = self.shared.win_end_us.load(Relaxed);
        self.subscribers[slot].allocate();
        if recv_us < ws || recv_us >= we {
            return;
        }
        let w = &mut self.window;
        w.window_received += 1;
        w.window_bytes += d.len as u64;
        if let Some(send) = d.send_us {
            let us = recv_us as i64 - send as i64;
            stats::record(&mut w.latency, us);
            self.subscribers[slot].record(us);
            if let Some(ts) = d.ts {
                stats::record(&mut w.pub_to_server, ts as i64 - send as i64);
                stats::record(&mut w.server_to_sub, recv_us as i64 - ts as i64);
            }
            if self.spec.record_raw {
                if w.raw.capacity() == 0 {
                    w.raw.reserve(self.spec.raw_reserve);
                }
                w.raw.push((send, d.ts.unwrap_or(0), recv_us, arrived_us));
            }
        }
    }

    fn snapshot(&mut self) -> Snapshot {
        let mut counts = self.counts;
        for t in &self.tracks {
            for track in t.borrow().iter() {
                track.finish(&mut counts);
            }
        }
        Snapshot {
            counts,
            sub_p99: self
                .subscribers
                .iter_mut()
                .filter_map(SubscriberLatency::take_p99)
                .collect(),
            ..std::mem::replace(&mut self.window, Snapshot::empty())
        }
    }
}

async fn pool_main(
    spec: ClientSpec,
    shared: Arc<Shared>,
    mut rx: tokio::sync::mpsc::UnboundedReceiver<Cmd>,
) {
    let local = Rc::new(RefCell::new(Local::new(spec, shared.clone())));
    while let Some(cmd) = rx.recv().await {
        match cmd {
            Cmd::Add(from, to) => {
                let l = local.clone();
                tokio::task::spawn_local(connect_range(l, from, to));
            }
            Cmd::Collect(reply) => {
                let _ = reply.send(local.borrow_mut().snapshot());
            }
            Cmd::Shutdown(reply) => {
                shared.stop.store(true, Relaxed);
                let snap = local.borrow_mut().snapshot();
                let stop = local.borrow().stop.clone();
                stop.notify_waiters();
                // Returning drops the LocalSet and with it every client task, which closes
                // the sockets (no close handshake: thousands of them would only add noise).
                let _ = reply.send(snap);
                return;
            }
        }
    }
}

async fn connect_range(local: Rc<RefCell<Local>>, from: u64, to: u64) {
    let rate = local.borrow().spec.connect_rate;
    let sched = Schedule::new(rate, Some(to.saturating_sub(from)));
    let start = tokio::time::Instant::now();
    let stop = local.borrow().stop.clone();
    for (i, c) in (from..to).enumerate() {
        let at = start + sched.due_at(i as u64);
        tokio::select! {
            _ = tokio::time::sleep_until(at) => {}
            _ = stop.notified() => return,
        }
        if local.borrow().shared.stop.load(Relaxed) {
            return;
        }
        tokio::task::spawn_local(client(local.clone(), c));
    }
}

fn source_addr(client: u64) -> Ipv4Addr {
    let idx = client / 20_000;
    Ipv4Addr::new(127, 1, (idx / 250) as u8, (idx % 250) as u8 + 1)
}

async fn open(spec: &ClientSpec, id: u64) -> Result<WsClient> {
    let target = match spec.sub_urls.len() {
        0 => &spec.url,
        n => &spec.sub_urls[(id % n as u64) as usize],
    };
    let endpoint = Endpoint::of(target, spec.protocol)?;
    let (host, port) = (endpoint.host.as_str(), endpoint.port);
    let addr: SocketAddr = tokio::net::lookup_host((host, port))
        .await?
        .next()
        .context("cannot resolve the server address")?;
    let sock = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    if spec.bind_sources && addr.ip().is_loopback() && addr.is_ipv4() {
        sock.bind(SocketAddr::new(source_addr(id).into(), 0))?;
    }
    let stream = sock.connect(addr).await?;
    stream.set_nodelay(true)?;
    let mut ws = match &endpoint.path {
        Some(path) => {
            let subprotocol = spec.protocol.subprotocol();
            let host = format!("{host}:{port}");
            WsClient::handshake(stream, &host, path, subprotocol, spec.max_message).await?
        }
        None => WsClient::raw(stream, spec.max_message)?,
    };
    if spec.stamp_arrivals {
        ws.stamp_arrivals()?;
    }
    Ok(ws)
}

async fn client(local: Rc<RefCell<Local>>, id: u64) {
    let (spec, shared, assignment, stop) = {
        let l = local.borrow();
        (
            l.spec.clone(),
            l.shared.clone(),
            l.assignment,
            l.stop.clone(),
        )
    };
    let ws = tokio::select! {
        r = open(&spec, id) => r,
        _ = stop.notified() => return,
    };
    let ws = match ws {
        Ok(ws) => ws,
        Err(e) => {
            shared.failed.fetch_add(1, Relaxed);
            push_error(
                &mut local.borrow_mut().window.errors,
                format!("connect: {e:#}"),
            );
            return;
        }
    };
    shared.connected.fetch_add(1, Relaxed);
    let topics: Vec<u64> = assignment.topics_of(id).collect();
    let names: Vec<String> = topics.iter().map(|&t| spec.topic(t)).collect();
    let mut hello = vec![];
    let writer = ws.writer();
    protocol::subscriber_hello(
        spec.protocol,
        writer.framing(),
        &protocol::client_id('s', id),
        &names,
        spec.qos,
        &mut hello,
    );
    if writer.write_all(&hello).await.is_err() {
        shared.closed.fetch_add(1, Relaxed);
        return;
    }
    let lanes = spec.lanes();
    let tracks = Rc::new(RefCell::new(vec![
        TopicTrack::default();
        topics.len() * lanes
    ]));
    let slot = {
        let mut l = local.borrow_mut();
        l.tracks.push(tracks.clone());
        l.subscribers.push(SubscriberLatency::default());
        l.subscribers.len() - 1
    };
    let rx = Receiver {
        local,
        shared,
        assignment,
        id,
        tracks,
        lanes,
        slot,
        pending_subs: topics.len(),
        spec,
    };
    // A trader publishes on its own share from a separate local task with the write handle.
    if let Some(t) = rx.spec.trader.clone().filter(|t| t.is_trader(id)) {
        let topic = rx.spec.topic(topics[0]);
        let trader = Trader {
            client: id,
            topic,
            spec: t,
        };
        tokio::task::spawn_local(trade(rx.local.clone(), ws.writer(), trader, stop));
    }
    rx.run(ws).await
}

/// The receiving side of one subscriber connection. The loop ends when the connection does;
/// at shutdown the pool's runtime is dropped with it, which closes the socket.
struct Receiver {
    local: Rc<RefCell<Local>>,
    shared: Arc<Shared>,
    spec: ClientSpec,
    assignment: Assignment,
    id: u64,
    /// Per subscribed topic (in slot order), `lanes` tracks: one per publisher numbering.
    tracks: Rc<RefCell<Vec<TopicTrack>>>,
    lanes: usize,
    /// This subscriber's place in [`Local::subscribers`].
    slot: usize,
    pending_subs: usize,
}

impl Receiver {
    async fn run(mut self, mut ws: WsClient) {
        let (shared, id) = (self.shared.clone(), self.id);
        let spec = &self.spec;
        let mut decoder = Decoder::new(spec.protocol, spec.max_message, spec.qos);
        loop {
            let (msg, arrived_us) = match ws.next().await {
                Ok(m) => m,
                Err(e) => {
                    if !shared.stop.load(Relaxed) {
                        shared.closed.fetch_add(1, Relaxed);
                        push_error(
                            &mut self.local.borrow_mut().window.errors,
                            format!("connection {id}: {e:#}"),
                        );
                    }
                    return;
                }
            };
            let recv_us = wire::now_us();
            let (text, bytes) = match msg {
                ServerMessage::Text(t) => (true, t),
                ServerMessage::Binary(b) => (false, b),
                ServerMessage::Close(code, reason) => {
                    if !shared.stop.load(Relaxed) {
                        shared.closed.fetch_add(1, Relaxed);
                        push_error(
                            &mut self.local.borrow_mut().window.errors,
                            format!("server closed a connection: {code} {reason}"),
                        );
                    }
                    return;
                }
            };
            let fed = decoder.feed(text, bytes, &mut |inc| {
                self.handle(inc, recv_us, arrived_us)
            });
            if let Err(e) = fed {
                shared.closed.fetch_add(1, Relaxed);
                push_error(
                    &mut self.local.borrow_mut().window.errors,
                    format!("connection {id}: {e:#}"),
                );
                return;
            }
            if !decoder.replies.is_empty() {
                let writer = ws.writer();
                let mut frame = Vec::with_capacity(decoder.replies.len() + 14);
                let op = decoder.protocol().opcode();
                writer.framing().put(op, &decoder.replies, &mut frame);
                decoder.replies.clear();
                if writer.write_all(&frame).await.is_err() && !shared.stop.load(Relaxed) {
                    shared.closed.fetch_add(1, Relaxed);
                    return;
                }
            }
        }
    }

    /// The track of (subscribed topic, publisher numbering) for a delivery or notice on
    /// `topic`, if this subscriber holds it.
    fn track(&self, topic: &[u8], publisher: Option<u32>) -> Option<usize> {
        let slot = self
            .spec
            .topic_index(topic)
            .and_then(|n| self.assignment.slot(self.id, n))?;
        let lane = publisher.map_or(0, |p| p as usize);
        (lane < self.lanes).then_some(slot * self.lanes + lane)
    }

    fn handle(&mut self, inc: Incoming<'_>, recv_us: u64, arrived_us: u64) {
        let shared = &self.shared;
        match inc {
            Incoming::Msg(d) => {
                shared.received.fetch_add(1, Relaxed);
                let mut l = self.local.borrow_mut();
                if let Some(s) = self.track(d.topic, d.publisher) {
                    self.tracks.borrow_mut()[s].on_message(d.seq, &mut l.counts);
                } else {
                    l.counts.received += 1;
                }
                l.on_delivery(self.slot, &d, recv_us, arrived_us);
            }
            Incoming::Dropped { topic, count } => {
                let mut l = self.local.borrow_mut();
                match self.track(topic.as_bytes(), None) {
                    Some(s) => self.tracks.borrow_mut()[s].on_dropped(count, &mut l.counts),
                    None => {
                        l.counts.discard_notices += 1;
                        l.counts.discarded += count;
                    }
                }
            }
            Incoming::Subscribed => {
                self.pending_subs = self.pending_subs.saturating_sub(1);
                if self.pending_subs == 0 {
                    shared.ready.fetch_add(1, Relaxed);
                }
            }
            Incoming::Error(e) => push_error(
                &mut self.local.borrow_mut().window.errors,
                format!("server error: {e}"),
            ),
            Incoming::Connected | Incoming::Acked | Incoming::Other => {}
        }
    }
}

/// A trading client: its number (the publisher in its orders' payload), its share's topic.
struct Trader {
    client: u64,
    topic: String,
    spec: TraderSpec,
}

async fn trade(
    local: Rc<RefCell<Local>>,
    sink: WsWriter,
    trader: Trader,
    stop: Rc<tokio::sync::Notify>,
) {
    let Trader {
        client,
        topic,
        spec: t,
    } = trader;
    let shared = local.borrow().shared.clone();
    // Start trading once the client is subscribed (a short fixed delay keeps it simple).
    let sched = Schedule::new(1e6 / t.interval_us.max(1) as f64, None);
    let start = tokio::time::Instant::now();
    let mut sent = 0u64;
    let mut buf = String::new();
    let mut frames = vec![];
    loop {
        let due = sched.due(start.elapsed());
        if sent >= due {
            let at = start + sched.due_at(sent);
            tokio::select! {
                _ = tokio::time::sleep_until(at) => {}
                _ = stop.notified() => return,
            }
            continue;
        }
        if shared.stop.load(Relaxed) {
            return;
        }
        // Never more than 16 catch-up orders at once: a trader that fell behind does not flood.
        let n = (due - sent).min(16);
        frames.clear();
        for _ in 0..n {
            let now = wire::now_us();
            let number = (client, sent + 1);
            wire::text_pub(&mut buf, &topic, now, number, t.payload, t.stamp, "order");
            sink.framing().put(0x1, buf.as_bytes(), &mut frames);
            sent += 1;
            shared.orders.fetch_add(1, Relaxed);
            let (ws, we) = (
                shared.win_start_us.load(Relaxed),
                shared.win_end_us.load(Relaxed),
            );
            if now >= ws && now < we {
                local.borrow_mut().window.window_orders += 1;
            }
        }
        if sink.write_all(&frames).await.is_err() {
            return;
        }
        if due - sent > 1000 {
            sent = due; // hopelessly behind: skip rather than burst
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_addresses_change_every_20000_clients() {
        assert_eq!(source_addr(0), Ipv4Addr::new(127, 1, 0, 1));
        assert_eq!(source_addr(19_999), Ipv4Addr::new(127, 1, 0, 1));
        assert_eq!(source_addr(20_000), Ipv4Addr::new(127, 1, 0, 2));
    }

    /// A subscriber's histogram is allocated at its first delivery, before the window opens
    /// (in the warm-up), so that no allocation falls inside the window; only deliveries
    /// inside the window are counted and recorded.
    #[test]
    fn a_subscriber_histogram_is_allocated_before_the_window() {
        let shared = Shared::new();
        let mut local = Local::new(spec(), shared.clone());
        local.subscribers.push(SubscriberLatency::default());
        let d = wire::Delivery {
            topic: b"shares/NFLX",
            seq: 1,
            ts: Some(1_050),
            send_us: Some(1_000),
            len: 50,
            publisher: None,
        };
        shared.win_start_us.store(2_000, Relaxed);
        shared.win_end_us.store(3_000, Relaxed);
        local.on_delivery(0, &d, 1_100, 0);
        assert!(
            local.subscribers[0].is_allocated(),
            "allocated in the warm-up"
        );
        assert_eq!(
            (local.window.window_received, local.window.latency.len()),
            (0, 0)
        );
        local.on_delivery(0, &d, 2_100, 0);
        let w = &local.window;
        assert_eq!((w.window_received, w.window_bytes), (1, 50));
        assert_eq!(w.latency.max(), 1_100);
        assert_eq!(w.pub_to_server.max(), 50);
        local.on_delivery(0, &d, 3_000, 0);
        assert_eq!(
            local.window.window_received, 1,
            "the window's end is outside it"
        );
    }

    /// Over MQTT a subscriber checks each publisher's numbering on a topic apart: two
    /// publishers' messages interleave without counting as duplicates or reordering, and a
    /// gap in one publisher's numbers is a loss.
    #[test]
    fn mqtt_deliveries_are_checked_per_publisher() {
        let spec = ClientSpec {
            topic_names: vec![],
            topic_prefix: "t".into(),
            protocol: Protocol::Mqtt,
            publishers: 2,
            ..spec()
        };
        let shared = Shared::new();
        let local = Rc::new(RefCell::new(Local::new(spec.clone(), shared.clone())));
        local
            .borrow_mut()
            .subscribers
            .push(SubscriberLatency::default());
        let tracks = Rc::new(RefCell::new(vec![TopicTrack::default(); 2]));
        local.borrow_mut().tracks.push(tracks.clone());
        let mut rx = Receiver {
            local: local.clone(),
            shared,
            assignment: spec.assignment(),
            spec,
            id: 0,
            tracks,
            lanes: 2,
            slot: 0,
            pending_subs: 0,
        };
        for (publisher, seq) in [(0, 1), (1, 1), (0, 2), (1, 2), (0, 4), (1, 3), (0, 5)] {
            let d = wire::Delivery {
                topic: b"t/0",
                seq,
                ts: None,
                send_us: Some(1),
                len: 10,
                publisher: Some(publisher),
            };
            rx.handle(Incoming::Msg(d), 2, 0);
        }
        let counts = local.borrow_mut().snapshot().counts;
        assert_eq!(
            (
                counts.received,
                counts.lost,
                counts.duplicates,
                counts.out_of_order
            ),
            (7, 1, 0, 0)
        );
    }

    fn spec() -> ClientSpec {
        ClientSpec {
            url: String::new(),
            sub_urls: Vec::new(),
            topics: 5,
            subs_per_client: 1,
            topic_prefix: "shares".into(),
            topic_names: vec!["NFLX".into(), "TSLA".into()],
            connect_rate: 1.0,
            max_message: 1,
            bind_sources: false,
            record_raw: false,
            stamp_arrivals: false,
            raw_reserve: 0,
            trader: None,
            protocol: Protocol::Native,
            qos: 0,
            publishers: 1,
        }
    }

    #[test]
    fn spec_topic_lookup() {
        let spec = spec();
        assert_eq!(spec.topic_index(b"shares/TSLA"), Some(1));
        assert_eq!(spec.topic(0), "shares/NFLX");
        assert_eq!(spec.topic_count(), 2);
    }

    #[test]
    fn snapshot_wire_roundtrip() {
        let mut s = Snapshot::empty();
        stats::record(&mut s.latency, 40);
        s.counts.lost = 2;
        let sub = |p99_us, samples| SubscriberP99 { p99_us, samples };
        s.sub_p99 = vec![sub(700, 2000), sub(300, 1999)];
        let back = s.to_wire();
        let json = serde_json::to_string(&back).unwrap();
        let s2 = serde_json::from_str::<SnapshotWire>(&json)
            .unwrap()
            .into_snapshot()
            .unwrap();
        assert_eq!(s2.latency.len(), 1);
        assert_eq!(s2.counts.lost, 2);
        assert_eq!(s2.sub_p99, [sub(700, 2000), sub(300, 1999)]);
    }
}
