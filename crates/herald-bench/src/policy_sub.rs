//! Policy subscribers: one connection each, on a thread of its own, subscribed to one pattern
//! with a slow-consumer policy (`policy`, `max_rate`), optionally reading slowly on purpose.
//!
//! Two scenarios need them: the images' *slow* subscriber (it takes `read_rate` images per
//! second, so herald must skip images for it while the fast pool gets every one) and the
//! conflation subscriber (a wildcard with `conflate` and `max_rate`). A thread of its own keeps
//! its reading — and its CPU — off the fast subscribers' event loop, and a deliberately slow
//! reader must block only itself.
//!
//! Per topic it checks what the policies promise: sequence numbers only go up (a value older
//! than one already delivered is *stale*), every gap is announced by a `dropped` notice
//! ([`TopicTrack`]), and, when a size is expected, every message arrives whole.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use tungstenite::Message;

use crate::integrity::{Counts, TopicTrack};
use crate::publish;
use crate::wire::{self, Incoming};

/// What one policy subscriber does.
#[derive(Debug, Clone)]
pub struct PolicySpec {
    pub url: String,
    /// The pattern subscribed to (a wildcard or one topic).
    pub pattern: String,
    /// `"disconnect"`, `"drop"`, `"conflate"` or `"lossless"`; empty: the topic's default.
    pub policy: String,
    /// `conflate`: at most this many messages per second per topic (0: no limit).
    pub max_rate: f64,
    /// Messages per second this subscriber takes at most (0: as fast as it can).
    pub read_rate: f64,
    /// Payload size every message must have (None: any), to tell whole messages from cut ones.
    pub expect_len: Option<usize>,
    pub max_message: usize,
}

impl PolicySpec {
    /// The subscribe request, with the policy fields of docs/protocol.md.
    pub fn subscribe_frame(&self) -> String {
        let mut req = serde_json::json!({"op": "sub", "topic": self.pattern});
        if !self.policy.is_empty() {
            req["policy"] = self.policy.clone().into();
        }
        if self.max_rate > 0.0 {
            req["max_rate"] = self.max_rate.into();
        }
        req.to_string()
    }
}

/// What a policy subscriber saw, over its whole life.
#[derive(Debug, Clone, Default)]
pub struct PolicyReport {
    /// Deliveries, drop notices and loss, as for the pool's subscribers.
    pub counts: Counts,
    /// Deliveries whose seq was not above the last one of their topic.
    pub stale: u64,
    /// Deliveries whose payload did not have the expected size.
    pub wrong_size: u64,
    /// Last seq received, per topic.
    pub last_seq: HashMap<String, u64>,
    /// How the connection ended, when it was not our doing.
    pub errors: Vec<String>,
    /// CPU seconds its thread used (what it cost the bench's cores), up to a drain.
    pub cpu_s: f64,
}

/// A running policy subscriber.
pub struct PolicySub {
    /// Deliveries so far (live, for rates over a window).
    pub received: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    /// Set by [`PolicySub::drain`]: read at full speed from now on.
    unpaced: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<PolicyReport>>,
}

impl PolicySub {
    /// Connects, subscribes, and returns once herald confirmed the subscription.
    pub fn start(spec: PolicySpec) -> Result<PolicySub> {
        let received = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready) = mpsc::channel();
        let unpaced = Arc::new(AtomicBool::new(false));
        let (r, s, u) = (received.clone(), stop.clone(), unpaced.clone());
        let thread = std::thread::Builder::new()
            .name("bench-policy-sub".into())
            .spawn(move || run(spec, r, s, u, ready_tx))?;
        match ready.recv_timeout(Duration::from_secs(10)) {
            Ok(Ok(())) => Ok(PolicySub {
                received,
                stop,
                unpaced,
                thread: Some(thread),
            }),
            Ok(Err(e)) => Err(e),
            Err(_) => bail!("the policy subscriber was not subscribed within 10 s"),
        }
    }

    /// Reads what herald still has queued for it at full speed, until nothing more arrives for
    /// `quiet` or `max` has passed, then stops: the `dropped` notices still queued behind a
    /// slow subscriber's backlog are read too, so its counts add up to what was published.
    pub fn drain(self, quiet: Duration, max: Duration) -> PolicyReport {
        self.unpaced.store(true, Relaxed);
        let t0 = Instant::now();
        let mut last = (self.received.load(Relaxed), Instant::now());
        while t0.elapsed() < max && last.1.elapsed() < quiet {
            std::thread::sleep(Duration::from_millis(20));
            let now = self.received.load(Relaxed);
            if now != last.0 {
                last = (now, Instant::now());
            }
        }
        self.stop()
    }

    /// Stops reading and returns what it saw.
    pub fn stop(mut self) -> PolicyReport {
        self.stop.store(true, Relaxed);
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for PolicySub {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn subscribe(spec: &PolicySpec) -> Result<tungstenite::WebSocket<std::net::TcpStream>> {
    let mut ws = publish::connect(&spec.url, spec.max_message)?;
    ws.send(Message::text(spec.subscribe_frame()))?;
    loop {
        let m = ws.read().context("waiting for the subscribe reply")?;
        if let Message::Text(t) = m {
            match wire::parse_text(t.as_bytes()) {
                Incoming::Subscribed => break,
                Incoming::Error(e) => bail!("subscribe {} refused: {e}", spec.pattern),
                _ => {}
            }
        }
    }
    // A short read timeout so a stop is noticed; tungstenite keeps a partial frame across it.
    ws.get_mut()
        .set_read_timeout(Some(Duration::from_millis(50)))?;
    Ok(ws)
}

fn run(
    spec: PolicySpec,
    received: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    unpaced: Arc<AtomicBool>,
    ready: mpsc::Sender<Result<()>>,
) -> PolicyReport {
    let mut report = PolicyReport::default();
    let mut ws = match subscribe(&spec) {
        Ok(ws) => {
            let _ = ready.send(Ok(()));
            ws
        }
        Err(e) => {
            let _ = ready.send(Err(e));
            return report;
        }
    };
    let mut tracks: HashMap<String, TopicTrack> = HashMap::new();
    let pace = (spec.read_rate > 0.0).then(|| Duration::from_secs_f64(1.0 / spec.read_rate));
    let mut next_read = Instant::now();
    let mut cpu_before_drain = None;
    while !stop.load(Relaxed) {
        if unpaced.load(Relaxed) && cpu_before_drain.is_none() {
            cpu_before_drain = Some(crate::sys::thread_cpu_seconds());
        }
        if let Some(pace) = pace.filter(|_| !unpaced.load(Relaxed)) {
            // Not reading is what makes this subscriber slow: its socket fills up, then its
            // queue in herald, and its policy acts.
            let now = Instant::now();
            if now < next_read {
                std::thread::sleep((next_read - now).min(Duration::from_millis(50)));
                continue;
            }
            next_read = now + pace;
        }
        // Read until one message arrives (a paced reader takes one per slot).
        loop {
            let m = match ws.read() {
                Ok(m) => m,
                Err(tungstenite::Error::Io(e))
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    if stop.load(Relaxed) {
                        break;
                    }
                    continue;
                }
                Err(e) => {
                    report.errors.push(format!("policy subscriber: {e}"));
                    stop.store(true, Relaxed);
                    break;
                }
            };
            let incoming = match &m {
                Message::Text(t) => wire::parse_text(t.as_bytes()),
                Message::Binary(b) => wire::parse_binary(b),
                Message::Close(f) => {
                    report.errors.push(format!("closed by herald: {f:?}"));
                    stop.store(true, Relaxed);
                    break;
                }
                _ => continue,
            };
            match incoming {
                Incoming::Msg(d) => {
                    let topic = String::from_utf8_lossy(d.topic).into_owned();
                    let last = report.last_seq.entry(topic.clone()).or_insert(0);
                    report.stale += u64::from(d.seq <= *last);
                    *last = (*last).max(d.seq);
                    if spec.expect_len.is_some_and(|n| n != d.len) {
                        report.wrong_size += 1;
                    }
                    tracks
                        .entry(topic)
                        .or_default()
                        .on_message(d.seq, &mut report.counts);
                    received.fetch_add(1, Relaxed);
                    break;
                }
                Incoming::Dropped { topic, count } => tracks
                    .entry(topic)
                    .or_default()
                    .on_dropped(count, &mut report.counts),
                Incoming::Error(e) => report.errors.push(format!("server error: {e}")),
                _ => {}
            }
        }
    }
    for t in tracks.values() {
        t.finish(&mut report.counts);
    }
    let _ = ws.close(None);
    let _ = ws.flush();
    report.cpu_s = cpu_before_drain.unwrap_or_else(crate::sys::thread_cpu_seconds);
    report
}
