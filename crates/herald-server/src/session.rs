//! What every connection needs, whatever protocol it speaks: the seam between a protocol and
//! the rest of the server.
//!
//! A protocol ([`Protocol`]) turns what a client sends into herald requests and its own
//! answers, and names the codec its connection's messages are encoded with. The session owns
//! everything else: the transport (WebSocket messages, or the bytes of a plain TCP or TLS
//! stream), keep-alive, the rate meter, the authentication deadline, carrying requests out
//! through [`Node`] (publishes held by a `lossless` subscriber wait there, subscriptions reach
//! the broker), the batching of direct writes, and the close. Adding a protocol is a file under
//! `protocol/` implementing [`Protocol`], and a route or listener that starts a session with it.

use crate::auth::{Access, Refused};
use crate::connection::{Codec, Connection};
use crate::limits::SocketHandle;
use crate::metrics::Disconnect;
use crate::node::Node;
use bytes::Bytes;
use herald_core::codec::Frame;
use herald_core::engine::ConnId;
use herald_core::outbox::Pushed;
use herald_core::request::Request;
use std::sync::Arc;
use std::time::Duration;

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
#[derive(Clone, Debug)]
pub struct Keepalive {
    /// Sent once the client has been quiet this long, and again as long as it stays quiet
    /// (herald's own protocol: a WebSocket ping; STOMP: a heart-beat). `None`: the protocol
    /// sends nothing of its own accord (MQTT: the client pings).
    pub ping: Option<(Duration, Frame)>,
    /// The connection is closed once nothing at all has arrived for this long; zero: never.
    pub idle: Duration,
}

/// One protocol's side of a connection. Called by the session's reader, one input at a time;
/// what it asks for through [`Context`] is carried out in order before the next input.
pub trait Protocol: Send + 'static {
    /// The codec the connection's messages, replies and notices are encoded with. Asked once,
    /// when the connection is made.
    fn codec(&self) -> Codec;

    /// How the session keeps this connection alive. Asked after every input, so a protocol
    /// may change it (MQTT and STOMP negotiate it when the client connects).
    fn keepalive(&self) -> Keepalive;

    /// Handles one input: decodes it, answers what the protocol answers itself
    /// ([`Context::send`]), and asks for herald requests ([`Context::request`]). An `Err`
    /// closes the connection for that reason (the protocol has queued its last words first).
    fn input(&mut self, cx: &mut Context<'_>, input: Input) -> Result<(), Disconnect>;

    /// The connection ended, for `why`, its subscriptions not yet removed: what the protocol
    /// does at the end (MQTT publishes its will unless the client disconnected cleanly).
    fn ended(&mut self, _cx: &mut Context<'_>, _why: Disconnect) {}
}

/// What a protocol acts through while it handles an input.
pub struct Context<'a> {
    pub node: &'a Node,
    pub id: ConnId,
    pub conn: &'a Arc<Connection>,
    pub(crate) access: &'a mut Access,
    pub(crate) socket: Option<&'a SocketHandle>,
    /// Requests asked for during this input, carried out after it in order.
    pub(crate) requests: Vec<Request>,
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

    /// Presents a token (a CONNECT's password or passcode, herald's `auth`): with auth on,
    /// verifies it, starts charging the connection's publishes to its subject and marks the
    /// socket authenticated. Returns when the token lapses (UNIX seconds), if it does.
    pub fn authenticate(&mut self, token: &str) -> Result<Option<u64>, Refused> {
        let exp = self.access.present(token)?;
        if let Some(socket) = self.socket {
            socket.authenticated();
        }
        let origin = self.node.origin_of(self.access.subject());
        self.node.engine.lock().set_origin(self.id, origin);
        Ok(exp)
    }

    /// Whether the connection has presented a valid token (always, with auth off).
    pub fn is_authenticated(&self) -> bool {
        self.access.is_authenticated()
    }

    /// Closes the connection for `why` after what is queued, with `code` and `reason` where
    /// the transport carries them (a WebSocket close frame).
    pub fn close(&self, why: Disconnect, code: u16, reason: &str) {
        self.conn.close(why, code, reason);
    }
}
