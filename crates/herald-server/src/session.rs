//! What every connection needs, whatever protocol it speaks: the seam between a protocol and
//! the rest of the server.
//!
//! A protocol ([`Protocol`]) turns what a client sends into herald requests and its own
//! answers, and names the codec its connection's messages are encoded with. The session owns
//! everything else: the transport (WebSocket messages, or the bytes of a plain TCP or TLS
//! stream), keep-alive, the rate meter, the authentication deadline, carrying requests out
//! through [`Node`] (publishes held by a `lossless` subscriber wait there, subscriptions reach
//! the broker), the batching of direct writes, and the close. Adding a protocol is a file under
//! `protocol/` implementing [`Protocol`], and a route or listener that starts a session with it
//! ([`run`]; [`crate::listener::serve_stream`] for a protocol on a TCP port of its own).
//!
//! [`run`] is generic over the protocol and the transport's reader, so the native protocol's
//! path from socket to engine makes no dynamic call.

use crate::auth::{Access, Admit, Deadline, Refused};
use crate::clock::now_us;
use crate::connection::{Codec, Connection, Framing, QueueLimits};
use crate::flush::Pending;
use crate::frame_reader::{FrameReader, ReadError};
use crate::limits::{Meter, SocketHandle};
use crate::metrics::Disconnect;
use crate::node::Node;
use crate::socket::{SocketRead, SocketWrite};
use bytes::{Bytes, BytesMut};
use herald_core::codec::Frame;
use herald_core::engine::ConnId;
use herald_core::outbox::Pushed;
use herald_core::reply::Reply;
use herald_core::request::{ProtocolError, Request};
use herald_core::wire::client_frames::{FrameError, Inbound};
use herald_core::wire::{self};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{watch, Notify};

/// What arrives from a client, as its transport delivers it.
#[derive(Debug)]
pub enum Input {
    /// One whole WebSocket message (its fragments reassembled, control frames answered by the
    /// session).
    Message { binary: bool, payload: Bytes },
    /// The next bytes of a stream transport (plain TCP or TLS), cut wherever the network cut
    /// them: the protocol keeps what does not yet make a whole packet.
    Bytes(Bytes),
}

/// How the session watches that the client is still there.
#[derive(Clone, Debug, Default)]
pub struct Keepalive {
    /// What herald sends of its own accord, and when. `None`: nothing (MQTT: the client
    /// pings).
    pub ping: Option<Ping>,
    /// The connection is closed once nothing at all has arrived for this long; zero: never.
    pub idle: Duration,
}

/// A frame herald sends to keep a connection alive.
#[derive(Clone, Debug)]
pub struct Ping {
    pub every: Duration,
    pub frame: Frame,
    /// `false`: sent once the client has been quiet for `every`, and again as long as it
    /// stays quiet (herald's own protocol: a WebSocket ping, which asks for a pong).
    /// `true`: sent every `every` whatever the client does (a STOMP heart-beat: herald
    /// promises the client to send something at least that often; a one-byte beat between
    /// frames costs less than noting the time of every write).
    pub steady: bool,
}

/// A protocol's own writer, for a protocol whose writes are not simply its queue's frames in
/// order (VBDS: an image at a time, each after the last one's acknowledgement). Given the
/// node, the connection, its id and the transport's write half; it writes until the
/// connection's close has gone out (or the socket fails).
pub type Writer = Box<
    dyn FnOnce(
            Arc<Node>,
            Arc<Connection>,
            ConnId,
            SocketWrite,
        ) -> Pin<Box<dyn Future<Output = io::Result<()>> + Send>>
        + Send,
>;

/// One protocol's side of a connection. Called by the session's reader, one input at a time;
/// what it asks for through [`Context`] is carried out in order before the next input.
pub trait Protocol: Send + 'static {
    /// The codec the connection's messages, replies and notices are encoded with. Asked once,
    /// when the connection is made.
    fn codec(&self) -> Codec;

    /// How the session keeps this connection alive, until the protocol changes it
    /// ([`Context::set_keepalive`]: MQTT and STOMP negotiate it when the client connects).
    /// Asked once, when the connection is made.
    fn keepalive(&self) -> Keepalive;

    /// Whether the protocol changes its keep-alive once connected ([`Context::set_keepalive`]).
    /// Only then does the session's keep-alive timer also wait for a change: a wait it would
    /// otherwise poll at every wake of the session, for nothing.
    fn renegotiates_keepalive(&self) -> bool {
        false
    }

    /// The connection is made and nothing has been read yet: what the protocol asks for
    /// before the client says anything (VBDS subscribes its stream).
    fn start(&mut self, _cx: &mut Context<'_>) {}

    /// Handles one input: decodes it, answers what the protocol answers itself
    /// ([`Context::send`], [`Context::reply`]), and asks for herald requests
    /// ([`Context::request`]). An `Err` closes the connection for that reason (the protocol
    /// has queued its last words first, or closed it itself with its own code); the requests
    /// it asked for before the `Err` are still carried out.
    fn input(&mut self, cx: &mut Context<'_>, input: Input) -> Result<(), Disconnect>;

    /// The connection ended, for `why`, its subscriptions not yet removed: what the protocol
    /// does at the end (MQTT publishes its will unless the client disconnected cleanly).
    /// Requests asked for here are carried out before the connection goes.
    fn ended(&mut self, _cx: &mut Context<'_>, _why: Disconnect) {}

    /// The protocol's own writer, if its writes are not its queue's frames in order. Asked
    /// once, when the connection is made; a connection with its own writer is never written
    /// to directly by publishing tasks.
    fn writer(&mut self) -> Option<Writer> {
        None
    }
}

/// What a protocol acts through while it handles an input.
pub struct Context<'a> {
    pub node: &'a Node,
    pub id: ConnId,
    pub conn: &'a Arc<Connection>,
    access: &'a mut Access,
    socket: Option<&'a SocketHandle>,
    activity: &'a Activity,
    /// Requests asked for during this input, carried out after it in order.
    requests: &'a mut Vec<Request>,
    /// Wall-clock µs when the input was read.
    pub now_us: u64,
}

impl Context<'_> {
    /// Asks for a herald request, as the client's: checked against its token's grants (a
    /// refusal reaches the client as an error reply, through the codec), then carried out
    /// through the node once this input is handled. Its replies come back through the codec.
    pub fn request(&mut self, request: Request) {
        self.requests.push(request);
    }

    /// Queues bytes the protocol encoded itself (a handshake answer, a pong), after what is
    /// already queued.
    pub fn send(&self, frame: Frame) -> Pushed {
        self.conn.send_control(frame)
    }

    /// Queues a reply of the protocol's own (a decoding error), encoded by the codec.
    pub fn reply(&self, reply: &Reply) -> Pushed {
        self.conn.answer(reply)
    }

    /// Presents a token (a CONNECT's password or passcode): with auth on, verifies it, starts
    /// charging the connection's publishes to its subject and marks the socket authenticated.
    /// Returns when the token lapses (UNIX seconds), if it does. (herald's own `auth` request
    /// goes through [`Context::request`], which does the same.)
    pub fn authenticate(&mut self, token: &str) -> Result<Option<u64>, Refused> {
        let exp = self.access.present(token)?;
        authenticated(self.node, self.id, self.access, self.socket);
        Ok(exp)
    }

    /// Whether the connection's token grants `request`, without asking for it: for a protocol
    /// that chooses between forms of a request (MQTT: a subscription `lossless` or not) or acts
    /// on one itself (MQTT: a will's retained message).
    pub fn admits(&mut self, request: &Request) -> bool {
        matches!(self.access.admit(request), Admit::Pass)
    }

    /// Whether the connection has presented a valid token (always, with auth off).
    pub fn is_authenticated(&self) -> bool {
        self.access.is_authenticated()
    }

    /// Changes how the session keeps the connection alive, from now on (at once for a protocol
    /// whose [`Protocol::renegotiates_keepalive`] says so; else from the timer's next wake).
    pub fn set_keepalive(&self, keepalive: Keepalive) {
        *self.activity.keepalive.lock() = keepalive;
        self.activity.changed.notify_one();
    }

    /// Closes the connection for `why` after what is queued, with `code` and `reason` where
    /// the transport carries them (a WebSocket close frame).
    pub fn close(&self, why: Disconnect, code: u16, reason: &str) {
        self.conn.close(why, code, reason);
    }
}

/// The transport a session runs on.
pub struct Transport {
    pub read: SocketRead,
    pub write: SocketWrite,
    pub framing: Framing,
}

/// Bytes a frame may carry beyond `max_message_bytes`: room for a binary frame's JSON header.
const HEADER_ALLOWANCE: usize = 64 << 10;

/// The longest WebSocket frame or message a session reads.
pub(crate) fn frame_limit(node: &Node) -> usize {
    node.config.max_message_bytes + HEADER_ALLOWANCE
}

/// Pongs herald may owe a client at once (queued, not yet written): a client that pings
/// without reading its pongs is cut off as the rate limit cuts a client off.
const MAX_PONGS_OWED: usize = 64;

/// Runs one connection speaking `protocol` on `transport` until it ends: `token`, the token
/// its opening request presented (WebSocket), if any; `socket`, its place among the
/// listener's sockets (shed, authenticated, the partly received bytes budget), if it came
/// through herald's listener. Counted in `connections` by whoever accepted it; counted out here.
pub async fn run<P: Protocol>(
    node: Arc<Node>,
    transport: Transport,
    socket: Option<SocketHandle>,
    token: Option<String>,
    mut protocol: P,
) {
    let Transport {
        read,
        write,
        framing,
    } = transport;
    let (limits, metrics) = (QueueLimits::of(&node.config), node.metrics.clone());
    let codec = protocol.codec();
    let (conn, write) = match (write, protocol.writer()) {
        (SocketWrite::Tcp(tcp), None) => (
            Connection::open(codec, framing, Some(tcp), limits, metrics),
            Write::Direct,
        ),
        (write, own) => (
            Connection::open(codec, framing, None, limits, metrics),
            match own {
                Some(writer) => Write::Own(writer, write),
                None => Write::Task(write),
            },
        ),
    };
    let id = node.engine.lock().connect(conn.clone());
    let mut access = Access::new(node.auth.clone(), node.config.limits.handshake_timeout());
    if let Some(token) = token {
        match access.present(&token) {
            Ok(_) => authenticated(&node, id, &access, socket.as_ref()),
            Err(Refused(why)) => {
                node.count_error("unauthorized");
                conn.answer(&Reply::from(ProtocolError::new("unauthorized", why)));
                conn.close(Disconnect::Unauthorized, 4003, "unauthorized");
            }
        }
    }
    // Boxed, and only with auth on: without it the future would never complete, yet take
    // its ~330 bytes in every session task.
    let lapsed: Pin<Box<dyn Future<Output = Deadline> + Send>> = match access.deadline() {
        Some(deadline) => Box::pin(lapsed(deadline)),
        None => Box::pin(std::future::pending()),
    };
    let activity = Activity::new(protocol.keepalive(), protocol.renegotiates_keepalive());
    let budget = socket.as_ref().map(|s| s.sockets().clone());
    let session = Session {
        node: &node,
        id,
        conn: &conn,
        access: &mut access,
        activity: &activity,
        socket: socket.as_ref(),
    };
    match framing {
        Framing::WebSocket => {
            let reader = FrameReader::new(read, frame_limit(&node)).with_budget(budget);
            drive(&node, session, protocol, reader, write, lapsed).await
        }
        Framing::Stream => {
            let reader = StreamReader {
                io: read,
                buf: BytesMut::new(),
            };
            drive(&node, session, protocol, reader, write, lapsed).await
        }
    }
}

/// Who writes the connection's queue to its transport.
enum Write {
    /// Publishing tasks directly, and the writer task on the shared plain TCP socket.
    Direct,
    /// The writer task alone (TLS).
    Task(SocketWrite),
    /// The protocol's own writer.
    Own(Writer, SocketWrite),
}

/// Runs the reader, the writer, keep-alive, the auth deadline and the watch for shedding side
/// by side until the connection ends; then ends it.
async fn drive<P: Protocol, S: InputSource>(
    owner: &Arc<Node>,
    mut session: Session<'_>,
    mut protocol: P,
    mut reader: S,
    write: Write,
    lapsed: Pin<Box<dyn Future<Output = Deadline> + Send>>,
) {
    let Session {
        node,
        id,
        conn,
        activity,
        socket,
        ..
    } = session;
    let grace = Duration::from_secs(node.config.shutdown_grace_secs);
    let shed = async {
        match socket {
            Some(socket) => socket.shed().await,
            None => std::future::pending().await,
        }
    };
    let writer = async {
        match write {
            Write::Direct => conn.run_direct_writer(grace).await,
            Write::Task(write) => conn.run_writer(write, grace).await,
            Write::Own(writer, write) => writer(owner.clone(), conn.clone(), id, write).await,
        }
    };
    tokio::pin!(writer);
    // `written`: herald's close went out.
    // `biased`: polled in this order, without drawing a random number at every wake (the
    // reader's and the writer's futures end only with the connection, so none starves).
    let (why, written) = tokio::select! {
        biased;
        why = read_requests(&mut session, &mut protocol, &mut reader) => {
            let written = writer.await.is_ok();
            (conn.close_reason().unwrap_or(why), written)
        }
        result = &mut writer => match (result, conn.close_reason()) {
            (result, Some(why)) => (why, result.is_ok()),
            (Err(_), None) => (Disconnect::IoError, false),
            (Ok(()), None) => (Disconnect::ClientClosed, true),
        },
        why = keepalive(conn, activity) => {
            let written = writer.await.is_ok();
            (conn.close_reason().unwrap_or(why), written)
        }
        deadline = lapsed => {
            let why = if deadline.code == 4001 { Disconnect::TokenExpired } else { Disconnect::Unauthorized };
            conn.close(why, deadline.code, deadline.reason);
            let written = writer.await.is_ok();
            (conn.close_reason().unwrap_or(why), written)
        }
        () = shed => {
            let reason = "try again later: shed, unauthenticated, to make room for newer connections";
            conn.close(Disconnect::Shed, 1013, reason);
            let written = writer.await.is_ok();
            (conn.close_reason().unwrap_or(Disconnect::Shed), written)
        }
    };
    // The protocol's last word (an MQTT will), carried out while the connection still is.
    let mut requests = Vec::new();
    protocol.ended(&mut session.context(&mut requests, now_us()), why);
    if !requests.is_empty() {
        let mut pending = Pending::default();
        for request in requests {
            if let Ok(true) = admit(node, id, conn, session.access, socket, &request) {
                let outcome = match node.handle_now(id, request, &mut pending, now_us()) {
                    Ok(outcome) => outcome,
                    Err(request) => Box::pin(node.handle_waiting(id, request, &mut pending)).await,
                };
                node.account(outcome);
            }
        }
    }
    // The session is over: its subscriptions go, nothing more is sent, no publisher waits on
    // it, and it is counted as closed.
    node.disconnect(id);
    node.metrics.disconnected(why);
    tracing::debug!(conn = id, reason = why.label(), "connection closed");
    if written && closed_by_herald(why) {
        // The client may still be writing: read on until its close, so that it gets ours
        // rather than a reset that would discard it (RFC 6455 7.1.1). The socket keeps its
        // place among `max_connections` meanwhile, unless it is shed for a newer one.
        let shed = async {
            match socket {
                Some(socket) => socket.shed().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = tokio::time::timeout(grace, reader.drain_until_close()) => {}
            () = shed => {}
        }
    }
}

/// Whether herald closed the connection on a stream still framed (not the client's close, the
/// end of the stream, or a protocol error), so that the client may still be writing. A shed
/// connection is not waited for (its place is wanted now), nor is one closed by shutdown
/// (which waits for the close frames to go out, and should not wait longer).
fn closed_by_herald(why: Disconnect) -> bool {
    !matches!(
        why,
        Disconnect::ClientClosed
            | Disconnect::IoError
            | Disconnect::ProtocolError
            | Disconnect::Shed
            | Disconnect::Shutdown
    )
}

/// What a session's reader works with.
struct Session<'a> {
    node: &'a Node,
    id: ConnId,
    conn: &'a Arc<Connection>,
    access: &'a mut Access,
    activity: &'a Activity,
    socket: Option<&'a SocketHandle>,
}

impl Session<'_> {
    /// What the protocol acts through for one call, its requests gathered in `requests`.
    fn context<'s>(&'s mut self, requests: &'s mut Vec<Request>, now_us: u64) -> Context<'s> {
        Context {
            node: self.node,
            id: self.id,
            conn: self.conn,
            access: &mut *self.access,
            socket: self.socket,
            activity: self.activity,
            requests,
            now_us,
        }
    }
}

/// What the reader reads: WebSocket frames ([`FrameReader`]) or a byte stream
/// ([`StreamReader`]). Static, so that the read loop is made for each.
trait InputSource: Send {
    /// The next frame; a byte stream's reads come as binary messages.
    fn next(&mut self) -> impl Future<Output = Result<Inbound, ReadError>> + Send;

    /// A whole message, as the protocol takes it.
    fn input(binary: bool, payload: Bytes) -> Input;

    /// After herald has closed: reads and discards what the client still sends until it
    /// closes too (see [`FrameReader::drain_until_close`]).
    fn drain_until_close(&mut self) -> impl Future<Output = ()> + Send;
}

impl InputSource for FrameReader {
    fn next(&mut self) -> impl Future<Output = Result<Inbound, ReadError>> + Send {
        FrameReader::next(self)
    }

    #[inline]
    fn input(binary: bool, payload: Bytes) -> Input {
        Input::Message { binary, payload }
    }

    async fn drain_until_close(&mut self) {
        FrameReader::drain_until_close(self).await;
    }
}

/// A plain byte stream's reader: each read is handed on as it came. It holds no buffer while
/// the client is quiet (see [`SocketRead::read_into`]); what does not yet make a whole packet
/// is the protocol's to keep.
struct StreamReader {
    io: SocketRead,
    buf: BytesMut,
}

impl InputSource for StreamReader {
    async fn next(&mut self) -> Result<Inbound, ReadError> {
        match self
            .io
            .read_into(&mut self.buf, crate::socket::SCRATCH_BYTES)
            .await
        {
            Ok(0) => Err(ReadError::Ended),
            Ok(_) => Ok(Inbound::Message {
                binary: true,
                payload: self.buf.split().freeze(),
            }),
            Err(e) => Err(ReadError::Io(e)),
        }
    }

    #[inline]
    fn input(_: bool, payload: Bytes) -> Input {
        Input::Bytes(payload)
    }

    async fn drain_until_close(&mut self) {
        while let Ok(inbound) = self.next().await {
            drop(inbound);
        }
    }
}

/// When the client last sent anything, in ms since the session started, and how the session
/// keeps it alive.
struct Activity {
    started: Instant,
    last_ms: AtomicU64,
    /// The reader waits for a held publish: herald, not the client, stopped reading, so the
    /// client is not quiet (for the idle timeout, and for a ping sent to a quiet client) until
    /// the reader resumes (what the client sent meanwhile, its heart-beats included, waits
    /// unread in the socket).
    held: AtomicBool,
    keepalive: Mutex<Keepalive>,
    /// Wakes the keep-alive timer when the protocol changes it.
    changed: Notify,
    /// Whether the protocol changes its keep-alive ([`Protocol::renegotiates_keepalive`]).
    renegotiates: bool,
}

impl Activity {
    fn new(keepalive: Keepalive, renegotiates: bool) -> Self {
        Activity {
            started: Instant::now(),
            last_ms: AtomicU64::new(0),
            held: AtomicBool::new(false),
            keepalive: Mutex::new(keepalive),
            changed: Notify::new(),
            renegotiates,
        }
    }

    /// Completes when the protocol changes its keep-alive; never, for a protocol that does not.
    async fn changes(&self) {
        if self.renegotiates {
            self.changed.notified().await
        } else {
            std::future::pending().await
        }
    }

    /// The client sent something at `now`.
    fn touch(&self, now: Instant) {
        let ms = now.saturating_duration_since(self.started).as_millis() as u64;
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    /// The reader resumes after a wait: both clocks read, and the client counted as active.
    fn resumed(&self) -> ReadAt {
        let now = ReadAt::now();
        self.touch(now.instant);
        now
    }

    /// Lets the runtime run other tasks and poll for readiness (tokio polls its driver before
    /// it runs a yielded task again), then resumes as after any wait.
    async fn yield_now(&self) -> ReadAt {
        tokio::task::yield_now().await;
        self.resumed()
    }

    /// The reader is held by (`true`), or released from, a publish waiting for credit.
    fn hold(&self, held: bool) {
        self.held.store(held, Ordering::Relaxed);
    }

    fn quiet_for(&self) -> Duration {
        if self.held.load(Ordering::Relaxed) {
            return Duration::ZERO;
        }
        let ms = self.started.elapsed().as_millis() as u64;
        Duration::from_millis(ms.saturating_sub(self.last_ms.load(Ordering::Relaxed)))
    }
}

/// Sends the protocol's ping once the client has been quiet for its interval, and again every
/// interval while it stays quiet (a steady ping: every interval regardless); closes the connection (1001) once nothing, not even a pong,
/// has arrived for the idle timeout. A client that answers pings is thus never idle, even with
/// the idle timeout as short as the ping interval plus its round trip. Follows the protocol's
/// changes ([`Context::set_keepalive`]); never completes while it asks for neither.
async fn keepalive(conn: &Connection, activity: &Activity) -> Disconnect {
    // When the last ping went, or the keep-alive last changed: an interval starts at either.
    let mut pinged = Instant::now();
    let sleep = tokio::time::sleep(Duration::ZERO);
    tokio::pin!(sleep);
    loop {
        let Keepalive { ping, idle } = activity.keepalive.lock().clone();
        let every = ping.as_ref().map_or(Duration::ZERO, |ping| ping.every);
        if idle.is_zero() && every.is_zero() {
            activity.changes().await;
            pinged = Instant::now();
            continue;
        }
        let quiet = activity.quiet_for();
        if !idle.is_zero() && quiet >= idle {
            let reason = format!("idle: nothing received for {} s", idle.as_secs());
            conn.close(Disconnect::Idle, 1001, &reason);
            return Disconnect::Idle;
        }
        let mut wait = if idle.is_zero() {
            Duration::MAX
        } else {
            idle - quiet
        };
        if let Some(ping) = ping.filter(|ping| !ping.every.is_zero()) {
            let every = ping.every;
            let since_ping = pinged.elapsed();
            // A steady beat does not wait for the client's silence.
            let quiet = if ping.steady { every } else { quiet };
            if quiet >= every && since_ping >= every {
                conn.send_control(ping.frame);
                pinged = Instant::now();
                wait = wait.min(every);
            } else {
                let due = every
                    .saturating_sub(quiet)
                    .max(every.saturating_sub(since_ping));
                wait = wait.min(due);
            }
        }
        let wait = wait.max(Duration::from_millis(1));
        match tokio::time::Instant::now().checked_add(wait) {
            Some(at) => sleep.as_mut().reset(at),
            None => {
                activity.changes().await;
                pinged = Instant::now();
                continue;
            }
        }
        tokio::select! {
            biased;
            () = sleep.as_mut() => {}
            () = activity.changes() => pinged = Instant::now(),
        }
    }
}

/// Completes when the connection's deadline (token expiry, or the time to authenticate) passes;
/// a refresh moves it.
async fn lapsed(mut deadline: watch::Receiver<Option<Deadline>>) -> Deadline {
    loop {
        let current = *deadline.borrow_and_update();
        match current {
            Some(d) => tokio::select! {
                _ = tokio::time::sleep_until(d.at) => return d,
                changed = deadline.changed() => if changed.is_err() { std::future::pending::<()>().await },
            },
            None => {
                if deadline.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        }
    }
}

/// When the reader last waited (for input, a held publish, a yield), by both clocks: the
/// monotonic one for the idle timer and the rate meter, the wall clock for the receive time a
/// message carries (`ts`, history's age).
#[derive(Clone, Copy)]
struct ReadAt {
    instant: Instant,
    wall_us: u64,
}

impl ReadAt {
    fn now() -> Self {
        ReadAt {
            instant: Instant::now(),
            wall_us: now_us(),
        }
    }
}

/// Reads the client's input until it closes or breaks the protocol, hands each to the
/// protocol and carries out what it asked for; returns why it stopped.
async fn read_requests<P: Protocol, S: InputSource>(
    session: &mut Session<'_>,
    protocol: &mut P,
    reader: &mut S,
) -> Disconnect {
    let Session {
        node,
        id,
        conn,
        activity,
        socket,
        ..
    } = *session;
    let mut now = ReadAt::now();
    // The pongs queued and not yet written (each still shared with the queue), oldest first.
    let mut pongs_owed: VecDeque<Bytes> = Default::default();
    let mut meter = Meter::new(&node.config.limits, now.instant);
    // What this reader's requests queued for other connections: written once the input read
    // so far is handled (see `flush`), so a burst of publishes leaves in few writes.
    let mut pending = Pending::default();
    let mut handled = 0u32;
    // Whether a subscribe came since the input was last drained (see `Engine::trim`).
    let mut subscribed = false;
    // What the protocol asked for with the last input (or at the start), kept for the next.
    let mut requests: Vec<Request> = Vec::new();
    // Set once an input ended the connection: why, returned once its requests are carried out.
    let mut ending: Option<Disconnect> = None;
    protocol.start(&mut session.context(&mut requests, now.wall_us));
    // The clocks (`ReadAt`) are read after every wait and not per frame: frames handled
    // between two waits were read together, at most 64 frames apart: reading both clocks per
    // frame is a visible part of taking a small message in.
    loop {
        for request in requests.drain(..) {
            // In a block of its own: the request's slots end here, so that a wait keeps only
            // its box across the await (rustc keeps a moved-from local while it is in scope).
            let (waiting, releases) = {
                match admit(node, id, conn, session.access, socket, &request) {
                    Ok(true) => {}
                    Ok(false) => continue,
                    Err(why) => return why,
                }
                if let Request::Publish(p) = &request {
                    node.metrics.messages_in_ws.inc();
                    node.metrics.bytes_in_ws.inc_by(p.payload.len() as u64);
                }
                subscribed |= matches!(request, Request::Subscribe(_));
                let releases = matches!(
                    request,
                    Request::Credit { .. } | Request::Unsubscribe { .. }
                );
                // A publish waits while a lossless subscriber of its topic is out of credit:
                // only this reader is held. Boxed, being rare: see `Node::handle_waiting`.
                let waiting = match node.handle_now(id, request, &mut pending, now.wall_us) {
                    Ok(outcome) => {
                        node.account(outcome);
                        None
                    }
                    Err(request) => Some(Box::pin(node.handle_waiting(id, request, &mut pending))),
                };
                (waiting, releases)
            };
            // `{ waiting }` moves it whole (a `None` too), which frees `pending` for what
            // follows.
            if let Some(waiting) = { waiting } {
                activity.hold(true);
                node.account(waiting.await);
                activity.hold(false);
                now = activity.resumed();
            }
            if releases {
                node.released.notify_waiters();
            }
        }
        if let Some(why) = ending {
            return why;
        }
        // Behind, a full hold leaves a chunk at a time, the runtime polling for readiness in
        // between, until less than a hold is left; then this reader reads on.
        while pending.flush_if_full() {
            now = activity.yield_now().await;
        }
        // A publisher whose frames are already buffered never has to wait on its socket, so
        // this loop would keep its worker thread: now and then yield, so that other tasks
        // (writers, throttle timers) run while herald is saturated. What is held stays held
        // (see `Pending::flush_if_full`): this reader is behind.
        handled = handled.wrapping_add(1);
        if handled.is_multiple_of(64) {
            now = activity.yield_now().await;
        }
        let next = {
            let read = reader.next();
            tokio::pin!(read);
            // Polled once first: only when the input is drained does the reader flush, a
            // chunk at a time with a look at the input between chunks (the yield lets the
            // runtime poll for readiness first).
            let mut polled = futures_util::poll!(read.as_mut());
            while polled.is_pending() && pending.flush_chunk() {
                now = activity.yield_now().await;
                polled = futures_util::poll!(read.as_mut());
            }
            match polled {
                std::task::Poll::Ready(next) => next,
                std::task::Poll::Pending => {
                    pending.drained();
                    if std::mem::take(&mut subscribed) {
                        // The burst of subscribes is over: keep no room for more.
                        node.engine.lock().trim(id);
                    }
                    let next = read.await;
                    now = activity.resumed();
                    next
                }
            }
        };
        let frame = match next {
            Ok(frame) => frame,
            Err(e) => return close_for_error(conn, &e),
        };
        let length = match &frame {
            Inbound::Message { payload, .. } | Inbound::Ping(payload) | Inbound::Close(payload) => {
                payload.len()
            }
            Inbound::Fragment(length) => *length,
            Inbound::Pong => 0,
        };
        if let Err(why) = meter.record(length, now.instant) {
            return rate_limited(node, conn, &why);
        }
        let input = match frame {
            Inbound::Message { binary, payload } => S::input(binary, payload),
            Inbound::Ping(payload) => {
                // Written pongs are no longer shared: they are no longer owed.
                while pongs_owed.front().is_some_and(Bytes::is_unique) {
                    pongs_owed.pop_front();
                }
                let pong = wire::encode_control(wire::OpCode::Pong, &payload);
                let head = pong.head.clone();
                if pongs_owed.len() >= MAX_PONGS_OWED || conn.send_control(pong) == Pushed::Overflow
                {
                    let why = format!(
                        "pings faster than their pongs are read (more than {MAX_PONGS_OWED} pongs unread)"
                    );
                    return rate_limited(node, conn, &why);
                }
                pongs_owed.push_back(head);
                continue;
            }
            Inbound::Close(payload) => {
                let echo = wire::encode_control(wire::OpCode::Close, &payload);
                conn.close_with(Disconnect::ClientClosed, echo);
                return Disconnect::ClientClosed;
            }
            Inbound::Pong | Inbound::Fragment(_) => continue,
        };
        if let Err(why) = protocol.input(&mut session.context(&mut requests, now.wall_us), input) {
            // What the client sent before what ended it still counts (MQTT PUBLISHes read
            // together with the DISCONNECT after them): its requests are carried out. The
            // close is queued first, so that nothing is sent after the protocol's last words;
            // their replies are dropped, what the codec does on them (a retained message
            // kept) is not.
            conn.close(why, 1008, why.label());
            ending = Some(conn.close_reason().unwrap_or(why));
        }
    }
}

/// Checks a request the protocol asked for against the connection's access: `true` to carry
/// it out; `false` once answered here (an `auth`, a refusal: the connection stays); `Err`
/// when the connection closed for it.
fn admit(
    node: &Node,
    id: ConnId,
    conn: &Connection,
    access: &mut Access,
    socket: Option<&SocketHandle>,
    request: &Request,
) -> Result<bool, Disconnect> {
    match access.admit(request) {
        Admit::Pass => Ok(true),
        Admit::Reply(reply) => {
            match &reply {
                Reply::Error { code, .. } => node.count_error(code),
                // A refresh keeps the subject, so this is the same origin again.
                Reply::Authed { .. } => authenticated(node, id, access, socket),
                _ => {}
            }
            conn.answer(&reply);
            Ok(false)
        }
        Admit::Close(reply) => {
            node.count_error("unauthorized");
            conn.answer(&reply);
            conn.close(Disconnect::Unauthorized, 4003, "unauthorized");
            Err(Disconnect::Unauthorized)
        }
    }
}

/// The connection presented a valid token: its socket is no longer shed for age, and its
/// publishes are charged to the token's subject.
fn authenticated(node: &Node, id: ConnId, access: &Access, socket: Option<&SocketHandle>) {
    if let Some(socket) = socket {
        socket.authenticated();
    }
    let origin = node.origin_of(access.subject());
    node.engine.lock().set_origin(id, origin);
}

/// Tells the client it is too fast (`rate_limited`), closes it with 1008 and counts it.
fn rate_limited(node: &Node, conn: &Connection, why: &str) -> Disconnect {
    node.count_error("rate_limited");
    let error = ProtocolError::new("rate_limited", format!("too fast: {why}"));
    conn.answer(&Reply::from(error));
    conn.close(Disconnect::RateLimited, 1008, "rate limit exceeded");
    Disconnect::RateLimited
}

/// Closes the connection for a read that failed, with the code RFC 6455 gives.
fn close_for_error(conn: &Connection, error: &ReadError) -> Disconnect {
    let (why, code, reason) = match error {
        ReadError::Frame(e @ FrameError::TooLarge { .. }) => {
            (Disconnect::FrameTooLarge, e.code(), e.to_string())
        }
        ReadError::Frame(e @ FrameError::BadCloseReason) => {
            (Disconnect::InvalidUtf8, e.code(), e.to_string())
        }
        ReadError::Frame(e) => (Disconnect::ProtocolError, e.code(), e.to_string()),
        ReadError::Ended => (Disconnect::ClientClosed, 1000, String::new()),
        ReadError::Io(_) => (Disconnect::IoError, 1011, String::new()),
        ReadError::Busy => (
            Disconnect::Busy,
            1013,
            "try again later: the server holds its limit of partly received messages".into(),
        ),
    };
    conn.close(why, code, &reason);
    conn.close_reason().unwrap_or(why)
}
