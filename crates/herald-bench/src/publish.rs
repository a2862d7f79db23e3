//! Publisher connections: one OS thread each, with a blocking WebSocket client.
//!
//! A thread of its own paces precisely: it sleeps (nanosleep, tens of µs) until the next
//! message is due by its [`Schedule`], then sends every message due, stamping each with the
//! wall clock just before it is written, and flushes them in one write. A late wake-up is caught
//! up at once; the long-run rate is exact.
//!
//! tungstenite makes the connection and reads what the server says; the frames are written by
//! hand ([`crate::ws_client::encode_client_frame`]) into one buffer per burst, written whole.
//! Through tungstenite each message would be copied twice more (an owned `Message`, its write
//! buffer) and, when the socket takes only part of a large burst, the write buffer moves the
//! rest down after every write: at millions of discards a second that makes the bench's own
//! core the limit.
//!
//! Publisher `p` of `P` sends the global message numbers `p, p + P, p + 2P, …`, and message `g`
//! goes to topic `spread.topic(g)`: the publishers together visit the topics in the spread order.
//!
//! With `wait_for`, message `i` is sent only once a counter reached `i × per_message` (the
//! images scenario: back to back, each after every subscriber has the previous one).

use std::io::{ErrorKind, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use tungstenite::protocol::WebSocketConfig;
use tungstenite::{Message, WebSocket};

use crate::load::push_error;
use crate::schedule::{Schedule, Spread};
use crate::wire;
use crate::ws_client::encode_client_frame;
use herald_core::wire::OpCode;

/// Wait, before each message, for a counter to reach `i × per_message`.
#[derive(Clone)]
pub struct WaitFor {
    pub counter: Arc<crate::load::Shared>,
    pub per_message: u64,
    pub timeout: Duration,
}

#[derive(Clone)]
pub struct PubSpec {
    pub url: String,
    /// Topic names, visited in `spread` order.
    pub topics: Arc<Vec<String>>,
    pub spread: Spread,
    pub index: u64,
    pub stride: u64,
    pub schedule: Schedule,
    pub payload: usize,
    pub binary: bool,
    pub stamp: bool,
    /// Text carried after the timestamp (`Hello World!`); the message number is appended.
    pub text: Option<String>,
    pub max_message: usize,
    pub wait_for: Option<WaitFor>,
}

/// Counters a publisher thread updates.
#[derive(Debug, Default)]
pub struct PubStats {
    pub sent: AtomicU64,
    /// Times a `wait_for` gave up waiting (an image not delivered in time).
    pub timeouts: AtomicU64,
    pub errors: std::sync::Mutex<Vec<String>>,
}

pub struct Publisher {
    pub stats: Arc<PubStats>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Result<()>>>,
}

type Ws = WebSocket<TcpStream>;

/// The shortest sleep of a publisher: its pacing resolution. At 20,000 msg/s it sends about
/// four messages per wake-up instead of waking for each.
pub const PACING_QUANTUM: Duration = Duration::from_micros(200);

pub fn connect(url: &str, max_message: usize) -> Result<Ws> {
    let uri: tungstenite::http::Uri = url.parse().with_context(|| format!("bad url {url:?}"))?;
    let host = uri.host().context("url has no host")?;
    let port = uri.port_u16().unwrap_or(80);
    let stream = TcpStream::connect((host, port))
        .with_context(|| format!("cannot connect to {host}:{port}"))?;
    stream.set_nodelay(true)?;
    let cfg = WebSocketConfig::default()
        .max_message_size(Some(max_message))
        .max_frame_size(Some(max_message))
        .write_buffer_size(64 * 1024);
    let (ws, _) = tungstenite::client::client_with_config(url, stream, Some(cfg))
        .map_err(|e| anyhow::anyhow!("WebSocket handshake with {url} failed: {e}"))?;
    Ok(ws)
}

impl Publisher {
    /// Connects (so a failure is reported at once) and starts the thread; it sends once `go`
    /// is set (all publishers start together).
    pub fn start(spec: PubSpec, go: Arc<AtomicBool>) -> Result<Publisher> {
        let ws = connect(&spec.url, spec.max_message)?;
        let stats = Arc::new(PubStats::default());
        let stop = Arc::new(AtomicBool::new(false));
        let (st, sp) = (stats.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name(format!("bench-pub-{}", spec.index))
            .spawn(move || run(ws, spec, st, sp, go))?;
        Ok(Publisher {
            stats,
            stop,
            thread: Some(thread),
        })
    }

    pub fn sent(&self) -> u64 {
        self.stats.sent.load(Relaxed)
    }

    pub fn is_finished(&self) -> bool {
        self.thread.as_ref().is_none_or(|t| t.is_finished())
    }

    /// Stops and joins; returns the errors seen.
    pub fn stop(mut self) -> Result<Vec<String>> {
        self.stop.store(true, Relaxed);
        if let Some(t) = self.thread.take() {
            match t.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => push_error(
                    &mut self.stats.errors.lock().unwrap(),
                    format!("publisher: {e:#}"),
                ),
                Err(_) => bail!("publisher thread panicked"),
            }
        }
        let errors = self.stats.errors.lock().unwrap().clone();
        Ok(errors)
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Reads whatever the server sent (errors) without blocking.
fn poll_incoming(ws: &mut Ws, stats: &PubStats) -> Result<()> {
    ws.get_mut().set_nonblocking(true)?;
    loop {
        match ws.read() {
            Ok(Message::Text(t)) => {
                if let wire::Incoming::Error(e) = wire::parse_text(t.as_bytes()) {
                    push_error(
                        &mut stats.errors.lock().unwrap(),
                        format!("server error to publisher: {e}"),
                    );
                }
            }
            Ok(Message::Close(f)) => {
                ws.get_mut().set_nonblocking(false)?;
                let why = f.map_or("no close code".into(), |f| {
                    format!("{} {}", u16::from(f.code), f.reason)
                });
                bail!("server closed the publisher connection: {why}");
            }
            Ok(_) => {}
            Err(tungstenite::Error::Io(e)) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) => {
                ws.get_mut().set_nonblocking(false)?;
                return Err(e.into());
            }
        }
    }
    ws.get_mut().set_nonblocking(false)?;
    Ok(())
}

/// A write failed: when herald closed the connection (a rate limit, say), the reason is in
/// its close frame, still readable after the write's broken pipe; otherwise the write's error.
fn why_it_failed(ws: &mut Ws, stats: &PubStats, e: std::io::Error) -> anyhow::Error {
    match poll_incoming(ws, stats) {
        Err(closed) => closed.context("publish failed"),
        Ok(()) => anyhow::Error::new(e).context("publish failed"),
    }
}

fn run(
    mut ws: Ws,
    spec: PubSpec,
    stats: Arc<PubStats>,
    stop: Arc<AtomicBool>,
    go: Arc<AtomicBool>,
) -> Result<()> {
    while !go.load(Relaxed) {
        if stop.load(Relaxed) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    let mut buf = String::new();
    // Binary frames: built once per topic lazily is overkill; build per message for small
    // payloads, and reuse one buffer (patched in place) for large ones.
    let mut big: Option<(String, Vec<u8>)> = None;
    // The frames of one burst, written together.
    let mut out: Vec<u8> = Vec::new();
    let start = Instant::now();
    let mut last_poll = Instant::now();
    let mut i: u64 = 0;
    let total = spec.schedule.total();
    loop {
        if stop.load(Relaxed) || total.is_some_and(|t| i >= t) {
            break;
        }
        let due = spec.schedule.due(start.elapsed());
        if i >= due {
            let at = spec.schedule.due_at(i);
            let now = start.elapsed();
            if at > now {
                // Sleep at least PACING_QUANTUM (fewer wake-ups at high rates: the messages due
                // meanwhile go out together, each stamped when written) and at most 50 ms so
                // a stop is noticed.
                std::thread::sleep((at - now).clamp(PACING_QUANTUM, Duration::from_millis(50)));
            }
            continue;
        }
        // Bound one burst so the flush and the stop check happen regularly.
        let n = (due - i).min(if spec.wait_for.is_some() { 1 } else { 4096 });
        for _ in 0..n {
            if let Some(w) = &spec.wait_for {
                let need = i * w.per_message;
                let t0 = Instant::now();
                while w.counter.received.load(Relaxed) < need {
                    if stop.load(Relaxed) {
                        return Ok(());
                    }
                    if t0.elapsed() > w.timeout {
                        stats.timeouts.fetch_add(1, Relaxed);
                        break;
                    }
                    std::thread::sleep(Duration::from_micros(20));
                }
            }
            let g = spec.index + i * spec.stride;
            let topic = &spec.topics[spec.spread.topic(g) as usize];
            let now = wire::now_us();
            if spec.binary {
                if spec.payload >= 64 * 1024 {
                    if big.as_ref().is_none_or(|(t, _)| t != topic) {
                        big = Some((
                            topic.clone(),
                            wire::binary_pub(topic, now, i, spec.payload, spec.stamp),
                        ));
                    }
                    // Copy first, stamp last: the copy is not part of the latency. The mask
                    // key is zero, so the frame's payload is the message's bytes as they are.
                    let message = &big.as_ref().unwrap().1;
                    encode_client_frame(OpCode::Binary as u8, message, &mut out);
                    let at = out.len() - message.len();
                    wire::patch_binary_stamp(&mut out[at..], wire::now_us(), i);
                } else {
                    let message = wire::binary_pub(topic, now, i, spec.payload, spec.stamp);
                    encode_client_frame(OpCode::Binary as u8, &message, &mut out);
                }
            } else {
                let text;
                let extra = match &spec.text {
                    Some(t) => {
                        text = format!("{t} #{i}");
                        text.as_str()
                    }
                    None => "",
                };
                wire::text_pub(&mut buf, topic, now, i, spec.payload, spec.stamp, extra);
                encode_client_frame(OpCode::Text as u8, buf.as_bytes(), &mut out);
            }
            i += 1;
        }
        if let Err(e) = ws.get_mut().write_all(&out) {
            return Err(why_it_failed(&mut ws, &stats, e));
        }
        out.clear();
        stats.sent.store(i, Relaxed);
        if last_poll.elapsed() > Duration::from_millis(250) {
            last_poll = Instant::now();
            poll_incoming(&mut ws, &stats)?;
        }
    }
    stats.sent.store(i, Relaxed);
    let _ = poll_incoming(&mut ws, &stats);
    let _ = ws.close(None);
    let _ = ws.flush();
    Ok(())
}
