//! A WebSocket session: the handshake, the reader (frames → requests → engine), and the
//! connection's writer, run side by side until either ends.
//!
//! fastwebsockets answers the handshake; frames are herald's own both ways: incoming ones are read
//! by [`FrameReader`], outgoing ones are pre-encoded and shared (see `wire`).

use crate::auth::{self, Access, Admit, Deadline, Refused};
use crate::clock::now_us;
use crate::connection::{Connection, QueueLimits};
use crate::flush::Pending;
use crate::frame_reader::{FrameReader, ReadError};
use crate::limits::{Meter, SocketHandle};
use crate::metrics::{Disconnect, Reason};
use crate::node::Node;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use herald_core::engine::ConnId;
use herald_core::outbox::Pushed;
use herald_core::reply::Reply;
use herald_core::request::{self, ProtocolError};
use herald_core::wire;
use herald_core::wire::client_frames::{FrameError, Inbound};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Bytes a frame may carry beyond `max_message_bytes`: room for a binary frame's JSON header.
const HEADER_ALLOWANCE: usize = 64 << 10;

pub async fn upgrade(State(node): State<Arc<Node>>, request: Request) -> Response {
    let socket = request.extensions().get::<SocketHandle>().cloned();
    accept(node, request, move |node, read, write, token| {
        run_session(node, read, write, token, socket)
    })
}

/// The two halves of an upgraded connection.
pub type ReadHalf = crate::socket::SocketRead;
pub type WriteHalf = crate::socket::SocketWrite;

/// Answers a WebSocket handshake (or refuses it: not an upgrade, an origin not allowed, too many
/// connections) and runs `session` on the upgraded connection with the token the request
/// presented, tracked for shutdown and counted in the metrics.
pub fn accept<F, Fut>(node: Arc<Node>, mut request: Request, session: F) -> Response
where
    F: FnOnce(Arc<Node>, ReadHalf, WriteHalf, Option<String>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    if !fastwebsockets::upgrade::is_upgrade_request(&request) {
        let msg = "this endpoint speaks WebSocket: connect with a WebSocket client (see docs/protocol.md)\n";
        return (
            StatusCode::UPGRADE_REQUIRED,
            [("upgrade", "websocket")],
            msg,
        )
            .into_response();
    }
    if let Err(refusal) = check_origin(&node, &request) {
        return refusal;
    }
    let token = presented_token(&request);
    // herald's listener counts every socket against `max_connections` (and sheds an
    // unauthenticated one to make room, whose session may not have ended yet); this count of
    // sessions is for connections from elsewhere.
    let counted = request.extensions().get::<SocketHandle>().is_some();
    let open = node.metrics.connections.get();
    if !counted && open >= node.config.max_connections as i64 {
        node.metrics
            .connections_refused
            .get_or_create(&Reason {
                reason: "max_connections",
            })
            .inc();
        let msg = format!(
            "herald is at its limit of {} connections; try again later\n",
            node.config.max_connections
        );
        return (StatusCode::SERVICE_UNAVAILABLE, msg).into_response();
    }
    match fastwebsockets::upgrade::upgrade(&mut request) {
        Ok((response, upgraded)) => {
            node.metrics.connections.inc();
            node.metrics.connections_total.inc();
            let session_node = node.clone();
            node.sessions.spawn(async move {
                match upgraded.await {
                    Ok(ws) => {
                        let (read, write) = crate::socket::split(ws.into_inner().into_inner());
                        session(session_node, read, write, token).await
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "WebSocket upgrade did not complete");
                        session_node.metrics.disconnected(Disconnect::IoError);
                    }
                }
            });
            response.map(Body::new)
        }
        Err(e) => (
            StatusCode::BAD_REQUEST,
            format!("bad WebSocket handshake: {e}\n"),
        )
            .into_response(),
    }
}

/// Refuses a browser page whose `Origin` is not allowed (403). Clients that send no `Origin`
/// (not browsers) pass: the rule protects users' browsers from other sites, not the server.
#[allow(clippy::result_large_err)]
fn check_origin(node: &Node, request: &Request) -> Result<(), Response> {
    let Some(origin) = request.headers().get(header::ORIGIN) else {
        return Ok(());
    };
    let origin = origin.to_str().unwrap_or("");
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok());
    let allowed = match &node.auth {
        Some(auth) => auth.origin_allowed(origin, host),
        None => auth::origin_allowed(&node.config.auth.allowed_origins, origin, host, true),
    };
    if allowed {
        return Ok(());
    }
    node.metrics
        .connections_refused
        .get_or_create(&Reason { reason: "origin" })
        .inc();
    let msg = format!("origin {origin:?} is not allowed to connect (auth.allowed_origins)\n");
    Err((StatusCode::FORBIDDEN, msg).into_response())
}

/// A token from `Authorization: Bearer …` or, for browsers that cannot set headers, `?token=`.
fn presented_token(request: &Request) -> Option<String> {
    let bearer = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(auth::bearer)
        .map(str::to_owned);
    bearer.or_else(|| {
        let query = request.uri().query()?;
        url_form_pairs(query).find_map(|(k, v)| (k == "token").then_some(v))
    })
}

/// `a=1&b=2` → pairs; `+` and `%XX` decoded (JWTs use neither, but a client may encode anyway).
fn url_form_pairs(query: &str) -> impl Iterator<Item = (String, String)> + '_ {
    query.split('&').filter_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        Some((percent_decode(k), percent_decode(v)))
    })
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Pongs herald may owe a client at once (queued, not yet written): a client that pings
/// without reading its pongs is cut off as the rate limit cuts a client off.
const MAX_PONGS_OWED: usize = 64;

async fn run_session(
    node: Arc<Node>,
    read: ReadHalf,
    write: WriteHalf,
    token: Option<String>,
    socket: Option<SocketHandle>,
) {
    let (max, metrics) = (QueueLimits::of(&node.config), node.metrics.clone());
    let (conn, write) = match write {
        WriteHalf::Tcp(socket) => (Connection::direct(socket, max, metrics), None),
        other => (Connection::new(max, metrics), Some(other)),
    };
    let id = node.engine.lock().connect(conn.clone());
    let mut access = Access::new(node.auth.clone(), node.config.limits.handshake_timeout());
    if let Some(token) = token {
        match access.present(&token) {
            Ok(_) => {
                if let Some(socket) = &socket {
                    socket.authenticated();
                }
                let origin = node.origin_of(access.subject());
                node.engine.lock().set_origin(id, origin);
            }
            Err(Refused(why)) => {
                node.count_error("unauthorized");
                let error = ProtocolError::new("unauthorized", why);
                conn.send_control(wire::encode_reply(&Reply::from(error)));
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
    let activity = Activity::default();
    let budget = socket.as_ref().map(|s| s.sockets().clone());
    let mut reader = FrameReader::new(read, frame_limit(&node)).with_budget(budget);
    let grace = Duration::from_secs(node.config.shutdown_grace_secs);
    let shed = async {
        match &socket {
            Some(socket) => socket.shed().await,
            None => std::future::pending().await,
        }
    };
    let writer = async {
        match write {
            Some(write) => conn.run_writer(write, grace).await,
            None => conn.run_direct_writer(grace).await,
        }
    };
    tokio::pin!(writer);
    let session = Session {
        node: &node,
        id,
        conn: &conn,
        access: &mut access,
        activity: &activity,
        socket: socket.as_ref(),
    };
    // `written`: herald's close frame went out.
    let (why, written) = tokio::select! {
        why = read_requests(session, &mut reader) => {
            let written = writer.await.is_ok();
            (conn.close_reason().unwrap_or(why), written)
        }
        result = &mut writer => match (result, conn.close_reason()) {
            (result, Some(why)) => (why, result.is_ok()),
            (Err(_), None) => (Disconnect::IoError, false),
            (Ok(()), None) => (Disconnect::ClientClosed, true),
        },
        why = keepalive(&node, &conn, &activity) => {
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
            match &socket {
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

/// When the client last sent anything, in ms since the session started.
#[derive(Default)]
struct Activity {
    started: OnceInstant,
    last_ms: AtomicU64,
}

/// `Instant::now()` at construction (a `Default` for [`Activity`]).
struct OnceInstant(Instant);

impl Default for OnceInstant {
    fn default() -> Self {
        OnceInstant(Instant::now())
    }
}

impl Activity {
    /// The client sent something at `now`.
    fn touch(&self, now: Instant) {
        let ms = now.saturating_duration_since(self.started.0).as_millis() as u64;
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

    fn quiet_for(&self) -> Duration {
        let ms = self.started.0.elapsed().as_millis() as u64;
        Duration::from_millis(ms.saturating_sub(self.last_ms.load(Ordering::Relaxed)))
    }
}

/// Pings a client once it has been quiet for `ping_interval`, and again every `ping_interval`
/// while it stays quiet; closes it (1001) once nothing, not even a pong, has arrived for
/// `idle_timeout`. A client that answers pings is thus never idle, even with `idle_timeout` as
/// short as `ping_interval` plus its round trip. Never completes when both are 0.
async fn keepalive(node: &Node, conn: &Connection, activity: &Activity) -> Disconnect {
    let limits = &node.config.limits;
    let idle = Duration::from_secs(limits.idle_timeout_secs);
    let every = Duration::from_secs(limits.ping_interval_secs);
    if idle.is_zero() && every.is_zero() {
        return std::future::pending().await;
    }
    let mut pinged: Option<Instant> = None;
    let sleep = tokio::time::sleep(Duration::ZERO);
    tokio::pin!(sleep);
    loop {
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
        if !every.is_zero() {
            let since_ping = pinged.map_or(Duration::MAX, |at| at.elapsed());
            if quiet >= every && since_ping >= every {
                conn.send_control(wire::encode_control(wire::OpCode::Ping, b"herald"));
                pinged = Some(Instant::now());
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
            None => return std::future::pending().await,
        }
        sleep.as_mut().await;
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

pub(crate) fn frame_limit(node: &Node) -> usize {
    node.config.max_message_bytes + HEADER_ALLOWANCE
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

/// Reads frames until the client closes or breaks the protocol; returns why it stopped.
async fn read_requests(session: Session<'_>, reader: &mut FrameReader) -> Disconnect {
    let Session {
        node,
        id,
        conn,
        access,
        activity,
        socket,
    } = session;
    let mut now = ReadAt::now();
    // The pongs queued and not yet written (each still shared with the queue), oldest first.
    let mut pongs_owed: std::collections::VecDeque<Bytes> = Default::default();
    let mut meter = Meter::new(&node.config.limits, now.instant);
    // What this reader's requests queued for other connections: written once the input read
    // so far is handled (see `flush`), so a burst of publishes leaves in few writes.
    let mut pending = Pending::default();
    let mut handled = 0u32;
    // Whether a subscribe came since the input was last drained (see `Engine::trim`).
    let mut subscribed = false;
    // The clocks (`ReadAt`) are read after every wait and not per frame: frames handled
    // between two waits were read together, at most 64 frames apart. One read of each per
    // frame was ~3% and ~2% of taking a small message in (callgrind, then perf).
    loop {
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
        let (binary, payload) = match frame {
            Inbound::Message { binary, payload } => (binary, payload),
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
        // In a block of its own: the request's slots end here, so that a wait keeps only
        // its box across the await (rustc keeps a moved-from local while it is in scope).
        let (waiting, releases) = {
            let request = match admitted(node, id, conn, access, socket, binary, payload) {
                Ok(request) => request,
                Err(None) => continue,
                Err(Some(why)) => return why,
            };
            if let request::Request::Publish(p) = &request {
                node.metrics.messages_in_ws.inc();
                node.metrics.bytes_in_ws.inc_by(p.payload.len() as u64);
            }
            subscribed |= matches!(request, request::Request::Subscribe(_));
            let releases = matches!(
                request,
                request::Request::Credit { .. } | request::Request::Unsubscribe { .. }
            );
            // A publish waits while a lossless subscriber of its topic is out of credit: only this
            // reader is held. Boxed, being rare: see `Node::handle_waiting`.
            let waiting = match node.handle_now(id, request, &mut pending, now.wall_us) {
                Ok(outcome) => {
                    node.account(outcome);
                    None
                }
                Err(request) => Some(Box::pin(node.handle_waiting(id, request, &mut pending))),
            };
            (waiting, releases)
        };
        // `{ waiting }` moves it whole (a `None` too), which frees `pending` for what follows.
        if let Some(waiting) = { waiting } {
            node.account(waiting.await);
            now = ReadAt::now();
        }
        if releases {
            node.released.notify_waiters();
        }
        // Behind, a full hold leaves a chunk at a time, the runtime polling for readiness in
        // between, until less than a hold is left; then this reader reads on.
        while pending.flush_if_full() {
            now = activity.yield_now().await;
        }
    }
}

/// A client's message as a request to carry out, decoded and checked against the connection's
/// access; or `Err` once it has been answered here (`None`: the connection stays) or the
/// connection closed for it (`Some`, why).
fn admitted(
    node: &Node,
    id: ConnId,
    conn: &Connection,
    access: &mut Access,
    socket: Option<&SocketHandle>,
    binary: bool,
    payload: Bytes,
) -> Result<request::Request, Option<Disconnect>> {
    let decoded = if binary {
        wire::decode_binary(payload)
    } else {
        match request::utf8(&payload) {
            Ok(text) => wire::decode_text_frame(text, &payload),
            Err(_) => {
                conn.close(
                    Disconnect::InvalidUtf8,
                    1007,
                    "invalid UTF-8 in a text frame",
                );
                return Err(Some(conn.close_reason().unwrap_or(Disconnect::InvalidUtf8)));
            }
        }
    };
    let request = match decoded {
        Ok(request) => request,
        Err(e) => {
            node.count_error(e.code);
            conn.send_control(wire::encode_reply(&Reply::from(e)));
            return Err(None);
        }
    };
    match access.admit(&request) {
        Admit::Pass => Ok(request),
        Admit::Reply(reply) => {
            match &reply {
                Reply::Error { code, .. } => node.count_error(code),
                Reply::Authed { .. } => {
                    if let Some(socket) = socket {
                        socket.authenticated();
                    }
                    // A refresh keeps the subject, so this is the same origin again.
                    let origin = node.origin_of(access.subject());
                    node.engine.lock().set_origin(id, origin);
                }
                _ => {}
            }
            conn.send_control(wire::encode_reply(&reply));
            Err(None)
        }
        Admit::Close(reply) => {
            node.count_error("unauthorized");
            conn.send_control(wire::encode_reply(&reply));
            conn.close(Disconnect::Unauthorized, 4003, "unauthorized");
            Err(Some(Disconnect::Unauthorized))
        }
    }
}

/// Tells the client it is too fast (`rate_limited`), closes it with 1008 and counts it.
fn rate_limited(node: &Node, conn: &Connection, why: &str) -> Disconnect {
    node.count_error("rate_limited");
    let error = ProtocolError::new("rate_limited", format!("too fast: {why}"));
    conn.send_control(wire::encode_reply(&Reply::from(error)));
    conn.close(Disconnect::RateLimited, 1008, "rate limit exceeded");
    Disconnect::RateLimited
}

/// Closes the connection for a read that failed, with the code RFC 6455 gives.
pub(crate) fn close_for_error(conn: &Connection, error: &ReadError) -> Disconnect {
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
