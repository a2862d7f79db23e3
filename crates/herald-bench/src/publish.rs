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
//!
//! Over MQTT and STOMP ([`crate::protocol`]) a publisher first opens its session (CONNECT,
//! answered before it starts), then sends each message as a PUBLISH or SEND whose payload
//! carries the same send time, and its own number on the topic ([`wire::numbered_payload`]).
//! Over plain TCP (an `mqtt://` or `stomp://` URL) the frames go as they are.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use tungstenite::client::IntoClientRequest;
use tungstenite::protocol::WebSocketConfig;
use tungstenite::{Message, WebSocket};

use crate::load::push_error;
use crate::protocol::{self, Decoder, Endpoint, Protocol};
use crate::schedule::{Schedule, Spread};
use crate::wire::{self, Incoming};
use crate::ws_client::{encode_client_frame, Framing};
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
    /// The server's URL; the protocol's endpoint there is [`Endpoint::of`] it.
    pub url: String,
    pub protocol: Protocol,
    /// MQTT: the QoS published at (0 or 1).
    pub qos: u8,
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
    /// MQTT and STOMP: the number the publisher's messages on each topic count on from (a
    /// trial's publisher continues the numbering of the trial before).
    pub numbered_from: u64,
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

/// MQTT QoS 1: PUBLISH packets awaiting their PUBACK at most (packet identifiers are 16 bits).
const MAX_IN_FLIGHT: u64 = 60_000;

/// How long a publisher waits for the server to open its session, or to acknowledge.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// A WebSocket connection to herald's native endpoint `url`.
pub fn connect(url: &str, max_message: usize) -> Result<Ws> {
    connect_ws(url, None, max_message)
}

fn connect_ws(url: &str, subprotocol: Option<&str>, max_message: usize) -> Result<Ws> {
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
    let mut request = url.into_client_request()?;
    if let Some(p) = subprotocol {
        request
            .headers_mut()
            .insert("Sec-WebSocket-Protocol", p.parse()?);
    }
    let (ws, _) = tungstenite::client::client_with_config(request, stream, Some(cfg))
        .map_err(|e| anyhow::anyhow!("WebSocket handshake with {url} failed: {e}"))?;
    Ok(ws)
}

/// A publisher's connection: a WebSocket (tungstenite made the handshake and reads what the
/// server says; the frames are written by hand), or plain TCP (MQTT, STOMP).
enum Conn {
    Ws(Box<Ws>),
    Tcp(TcpStream),
}

impl Conn {
    fn open(spec: &PubSpec) -> Result<Conn> {
        let endpoint = Endpoint::of(&spec.url, spec.protocol)?;
        match endpoint.ws_url() {
            Some(url) => Ok(Conn::Ws(Box::new(connect_ws(
                &url,
                spec.protocol.subprotocol(),
                spec.max_message,
            )?))),
            None => {
                let (host, port) = (endpoint.host.as_str(), endpoint.port);
                let stream = TcpStream::connect((host, port))
                    .with_context(|| format!("cannot connect to {host}:{port}"))?;
                stream.set_nodelay(true)?;
                Ok(Conn::Tcp(stream))
            }
        }
    }

    fn stream(&mut self) -> &mut TcpStream {
        match self {
            Conn::Ws(ws) => ws.get_mut(),
            Conn::Tcp(s) => s,
        }
    }

    fn framing(&self) -> Framing {
        match self {
            Conn::Ws(_) => Framing::WebSocket,
            Conn::Tcp(_) => Framing::Raw,
        }
    }

    /// Hands the decoder whatever the server sent, without waiting for more.
    fn read_available(
        &mut self,
        decoder: &mut Decoder,
        f: &mut impl FnMut(Incoming<'_>),
    ) -> Result<()> {
        self.stream().set_nonblocking(true)?;
        let read = self.read_until_blocked(decoder, f);
        self.stream().set_nonblocking(false)?;
        read
    }

    fn read_until_blocked(
        &mut self,
        decoder: &mut Decoder,
        f: &mut impl FnMut(Incoming<'_>),
    ) -> Result<()> {
        match self {
            Conn::Ws(ws) => loop {
                match ws.read() {
                    Ok(Message::Text(t)) => decoder.feed(true, t.as_bytes(), f)?,
                    Ok(Message::Binary(b)) => decoder.feed(false, &b, f)?,
                    Ok(Message::Close(frame)) => {
                        let why = frame.map_or("no close code".into(), |f| {
                            format!("{} {}", u16::from(f.code), f.reason)
                        });
                        bail!("server closed the publisher connection: {why}");
                    }
                    Ok(_) => {}
                    Err(tungstenite::Error::Io(e)) if e.kind() == ErrorKind::WouldBlock => {
                        return Ok(())
                    }
                    Err(e) => return Err(e.into()),
                }
            },
            Conn::Tcp(stream) => {
                let mut buf = [0u8; 16 * 1024];
                loop {
                    match stream.read(&mut buf) {
                        Ok(0) => bail!("server closed the publisher connection"),
                        Ok(n) => decoder.feed(false, &buf[..n], f)?,
                        Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
                        Err(e) if e.kind() == ErrorKind::Interrupted => {}
                        Err(e) => return Err(e.into()),
                    }
                }
            }
        }
    }

    fn close(&mut self) {
        match self {
            Conn::Ws(ws) => {
                let _ = ws.close(None);
                let _ = ws.flush();
            }
            Conn::Tcp(s) => {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
        }
    }
}

/// A publisher's connection and what it heard on it.
struct Session {
    conn: Conn,
    decoder: Decoder,
    /// The server opened the session (MQTT CONNACK, STOMP CONNECTED).
    connected: bool,
    /// MQTT QoS 1 publishes not acknowledged yet.
    in_flight: u64,
}

impl Session {
    /// Connects and, for MQTT and STOMP, opens the session (the server's answer awaited).
    fn open(spec: &PubSpec, stats: &PubStats) -> Result<Session> {
        let mut s = Session {
            conn: Conn::open(spec)?,
            decoder: Decoder::new(spec.protocol, spec.max_message, 0),
            // The native protocol has no session to open.
            connected: spec.protocol == Protocol::Native,
            in_flight: 0,
        };
        if let Some(open) = protocol::opening(spec.protocol, &publisher_client_id()) {
            let mut frame = vec![];
            s.conn
                .framing()
                .put(spec.protocol.opcode(), &open, &mut frame);
            s.conn.stream().write_all(&frame)?;
            s.wait(stats, "to open the session", |s| s.connected)?;
        }
        Ok(s)
    }

    /// Reads what the server sent since the last look: errors are recorded, acknowledgements
    /// counted.
    fn poll(&mut self, stats: &PubStats) -> Result<()> {
        let Session {
            conn,
            decoder,
            connected,
            in_flight,
        } = self;
        let mut refused = None;
        conn.read_available(decoder, &mut |inc| match inc {
            Incoming::Error(e) => {
                if !*connected {
                    refused.get_or_insert_with(|| e.clone());
                }
                push_error(
                    &mut stats.errors.lock().unwrap(),
                    format!("server error to publisher: {e}"),
                )
            }
            Incoming::Connected => *connected = true,
            Incoming::Acked => *in_flight = in_flight.saturating_sub(1),
            _ => {}
        })?;
        match refused {
            Some(e) => bail!("{e}"),
            None => Ok(()),
        }
    }

    /// Polls until `done` or [`ANSWER_TIMEOUT`].
    fn wait(
        &mut self,
        stats: &PubStats,
        what: &str,
        done: impl Fn(&Session) -> bool,
    ) -> Result<()> {
        let t0 = Instant::now();
        while !done(self) {
            self.poll(stats)?;
            if t0.elapsed() > ANSWER_TIMEOUT {
                bail!("the server did not answer within {ANSWER_TIMEOUT:?} {what}");
            }
            std::thread::sleep(Duration::from_micros(100));
        }
        Ok(())
    }
}

/// A distinct MQTT client identifier for each publisher connection of this process (a
/// server closes an older connection with the same identifier).
fn publisher_client_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    protocol::client_id('p', NEXT.fetch_add(1, Relaxed))
}

impl Publisher {
    /// Connects (so a failure is reported at once) and starts the thread; it sends once `go`
    /// is set (all publishers start together).
    pub fn start(spec: PubSpec, go: Arc<AtomicBool>) -> Result<Publisher> {
        let stats = Arc::new(PubStats::default());
        let session = Session::open(&spec, &stats)?;
        let stop = Arc::new(AtomicBool::new(false));
        let (st, sp) = (stats.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name(format!("bench-pub-{}", spec.index))
            .spawn(move || run(session, spec, st, sp, go))?;
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

/// A write failed: when herald closed the connection (a rate limit, say), the reason is in
/// its close frame, still readable after the write's broken pipe; otherwise the write's error.
fn why_it_failed(s: &mut Session, stats: &PubStats, e: std::io::Error) -> anyhow::Error {
    match s.poll(stats) {
        Err(closed) => closed.context("publish failed"),
        Ok(()) => anyhow::Error::new(e).context("publish failed"),
    }
}

fn run(
    mut s: Session,
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
    // MQTT and STOMP: the payload, the protocol frame, and each topic's count of this
    // publisher's messages.
    let (mut body, mut scratch) = (Vec::new(), Vec::new());
    let mut numbers = vec![0u64; spec.topics.len()];
    let framing = s.conn.framing();
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
            let k = spec.spread.topic(g) as usize;
            let topic = &spec.topics[k];
            numbers[k] += 1;
            let number = (spec.index, spec.numbered_from + numbers[k]);
            let text = spec.text.as_ref().map(|t| format!("{t} #{i}"));
            let extra = text.as_deref().unwrap_or("");
            if spec.protocol != Protocol::Native {
                if spec.qos > 0 && s.in_flight >= MAX_IN_FLIGHT {
                    if let Err(e) = s.conn.stream().write_all(&out) {
                        return Err(why_it_failed(&mut s, &stats, e));
                    }
                    out.clear();
                    s.wait(&stats, "with PUBACKs", |s| s.in_flight < MAX_IN_FLIGHT)?;
                }
                let now = wire::now_us();
                wire::numbered_payload(&mut body, now, number, spec.payload, extra);
                let id = protocol::packet_id(i);
                protocol::publish(
                    spec.protocol,
                    framing,
                    topic,
                    &body,
                    spec.stamp,
                    spec.qos,
                    id,
                    &mut scratch,
                    &mut out,
                );
                if spec.qos > 0 {
                    s.in_flight += 1;
                }
                i += 1;
                continue;
            }
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
                wire::text_pub(
                    &mut buf,
                    topic,
                    now,
                    number,
                    spec.payload,
                    spec.stamp,
                    extra,
                );
                encode_client_frame(OpCode::Text as u8, buf.as_bytes(), &mut out);
            }
            i += 1;
        }
        if let Err(e) = s.conn.stream().write_all(&out) {
            return Err(why_it_failed(&mut s, &stats, e));
        }
        out.clear();
        stats.sent.store(i, Relaxed);
        if last_poll.elapsed() > Duration::from_millis(250) {
            last_poll = Instant::now();
            s.poll(&stats)?;
        }
    }
    stats.sent.store(i, Relaxed);
    let _ = s.poll(&stats);
    s.conn.close();
    Ok(())
}
