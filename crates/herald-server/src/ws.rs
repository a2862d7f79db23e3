//! A WebSocket session: the handshake, the reader (frames → requests → engine), and the
//! connection's writer, run side by side until either ends.
//!
//! fastwebsockets parses incoming frames. Fragments are reassembled here rather than by its
//! `FragmentCollector`, which puts no limit on a message's total size across continuation frames.
//! Outgoing frames never pass through the crate: they are pre-encoded and shared (see `wire`).

use crate::connection::Connection;
use crate::metrics::{Disconnect, Reason};
use crate::node::{now_us, Node};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use bytes::{Bytes, BytesMut};
use fastwebsockets::{OpCode, Payload, Role, WebSocketError};
use herald_core::engine::ConnId;
use herald_core::wire::{self, Reply};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};

/// Bytes a frame may carry beyond `max_message_bytes`: room for a binary frame's JSON header.
const HEADER_ALLOWANCE: usize = 64 << 10;

pub async fn upgrade(State(node): State<Arc<Node>>, request: Request) -> Response {
    accept(node, request, |node, read, write| {
        run_session(node, read, write)
    })
}

/// The two halves of an upgraded connection.
pub type ReadHalf = tokio::io::ReadHalf<hyper_util::rt::TokioIo<hyper::upgrade::Upgraded>>;
pub type WriteHalf = tokio::io::WriteHalf<hyper_util::rt::TokioIo<hyper::upgrade::Upgraded>>;

/// Answers a WebSocket handshake (or refuses it: not an upgrade, too many connections) and runs
/// `session` on the upgraded connection, tracked for shutdown and counted in the metrics.
pub fn accept<F, Fut>(node: Arc<Node>, mut request: Request, session: F) -> Response
where
    F: FnOnce(Arc<Node>, ReadHalf, WriteHalf) -> Fut + Send + 'static,
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
    let open = node.metrics.connections.get();
    if open >= node.config.max_connections as i64 {
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
                        let (read, write) = tokio::io::split(ws.into_inner());
                        session(session_node, read, write).await
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

async fn run_session<R, W>(node: Arc<Node>, read: R, write: W)
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let conn = Connection::new(node.config.max_outbound_bytes, node.metrics.clone());
    let id = node.engine.lock().connect(conn.clone());
    // fastwebsockets wants a write half to pair with its reader; ours writes elsewhere.
    let (mut reader, _) =
        fastwebsockets::after_handshake_split(read, tokio::io::sink(), Role::Server);
    reader.set_max_message_size(frame_limit(&node));
    let grace = Duration::from_secs(node.config.shutdown_grace_secs);
    let writer = conn.run_writer(write, grace);
    tokio::pin!(writer);
    let why = tokio::select! {
        why = read_requests(&node, id, &conn, &mut reader) => {
            let _ = writer.await;
            conn.close_reason().unwrap_or(why)
        }
        result = &mut writer => match (result, conn.close_reason()) {
            (_, Some(why)) => why,
            (Err(_), None) => Disconnect::IoError,
            (Ok(()), None) => Disconnect::ClientClosed,
        },
    };
    node.disconnect(id);
    node.metrics.disconnected(why);
    tracing::debug!(conn = id, reason = why.label(), "connection closed");
}

pub(crate) fn frame_limit(node: &Node) -> usize {
    node.config.max_message_bytes + HEADER_ALLOWANCE
}

/// Reads frames until the client closes or breaks the protocol; returns why it stopped.
async fn read_requests<R: AsyncRead + Unpin>(
    node: &Node,
    id: ConnId,
    conn: &Arc<Connection>,
    reader: &mut fastwebsockets::WebSocketRead<R>,
) -> Disconnect {
    let limit = frame_limit(node);
    // Pongs and the echo of a client's close, which the reader obliges us to send.
    let mut obliged = |frame: fastwebsockets::Frame| {
        match frame.opcode {
            OpCode::Pong => {
                conn.send_control(wire::encode_control(wire::OpCode::Pong, &frame.payload))
            }
            OpCode::Close => conn.close_with(
                Disconnect::ClientClosed,
                wire::encode_control(wire::OpCode::Close, &frame.payload),
            ),
            _ => {}
        }
        std::future::ready(Ok::<(), Infallible>(()))
    };
    let mut partial: Option<(OpCode, BytesMut)> = None;
    let mut handled = 0u32;
    loop {
        // A publisher whose frames are already buffered never has to wait on its socket, so
        // this loop would keep its worker thread: yield now and then, so that subscribers'
        // writers (and their throttle timers) run while herald is saturated.
        handled = handled.wrapping_add(1);
        if handled.is_multiple_of(64) {
            tokio::task::yield_now().await;
        }
        let mut frame = match reader.read_frame(&mut obliged).await {
            Ok(frame) => frame,
            Err(e) => return close_for_error(conn, &e, limit),
        };
        if !is_masked(&mut frame) {
            conn.close(
                Disconnect::ProtocolError,
                1002,
                "protocol error: client frames must be masked (RFC 6455 5.1)",
            );
            return Disconnect::ProtocolError;
        }
        let (fin, opcode) = (frame.fin, frame.opcode);
        let payload = into_bytes(frame.payload);
        let message = match (opcode, partial.as_mut()) {
            (OpCode::Close, _) => return Disconnect::ClientClosed,
            (OpCode::Ping | OpCode::Pong, _) => continue,
            (OpCode::Text | OpCode::Binary, None) if fin => (opcode, payload),
            (OpCode::Text | OpCode::Binary, None) => {
                partial = Some((opcode, BytesMut::from(&payload[..])));
                continue;
            }
            (OpCode::Continuation, Some((first, buf))) => {
                if buf.len() + payload.len() >= limit {
                    return close_for_error(conn, &WebSocketError::FrameTooLarge, limit);
                }
                buf.extend_from_slice(&payload);
                if !fin {
                    continue;
                }
                let first = *first;
                let (_, buf) = partial.take().expect("matched Some");
                (first, buf.freeze())
            }
            _ => return close_for_error(conn, &WebSocketError::InvalidFragment, limit),
        };
        let decoded = match message {
            (OpCode::Text, text) => match std::str::from_utf8(&text) {
                Ok(text) => wire::decode_text(text),
                Err(_) => return close_for_error(conn, &WebSocketError::InvalidUTF8, limit),
            },
            (_, binary) => wire::decode_binary(binary),
        };
        let request = match decoded {
            Ok(request) => request,
            Err(e) => {
                node.count_error(e.code);
                conn.send_control(wire::encode_reply(&Reply::from(e)));
                continue;
            }
        };
        let releases = matches!(
            request,
            wire::Request::Credit { .. } | wire::Request::Unsubscribe { .. }
        );
        let handled = match &request {
            wire::Request::Publish(p) => {
                node.metrics.messages_in_ws.inc();
                node.metrics.bytes_in_ws.inc_by(p.payload.len() as u64);
                // A lossless subscriber out of credit holds this reader (and only it).
                let topic = p.topic.clone();
                node.when_admitted(&topic, |engine| engine.handle(id, request, now_us()))
                    .await
            }
            _ => node.engine.lock().handle(id, request, now_us()),
        };
        match handled {
            Ok(Some(published)) => node.published(&published),
            Ok(None) => {}
            Err(code) => node.count_error(code),
        }
        if releases {
            node.released.notify_waiters();
        }
    }
}

/// Whether the client masked the frame. fastwebsockets unmasks without rejecting unmasked client
/// frames and keeps the mask private; the header it formats carries the mask bit.
pub(crate) fn is_masked(frame: &mut fastwebsockets::Frame) -> bool {
    let mut head = [0u8; 16];
    frame.fmt_head(&mut head);
    head[1] & 0x80 != 0
}

fn into_bytes(payload: Payload) -> Bytes {
    match payload {
        Payload::Bytes(b) => b.freeze(),
        Payload::Owned(v) => Bytes::from(v),
        other => Bytes::copy_from_slice(&other),
    }
}

/// Closes the connection with the code RFC 6455 gives for `error`.
fn close_for_error(conn: &Connection, error: &WebSocketError, limit: usize) -> Disconnect {
    let (why, code, reason) = match error {
        WebSocketError::FrameTooLarge => (
            Disconnect::FrameTooLarge,
            1009,
            format!("frame too large: the limit is {limit} bytes"),
        ),
        WebSocketError::InvalidUTF8 => (
            Disconnect::InvalidUtf8,
            1007,
            "invalid UTF-8 in a text frame".to_owned(),
        ),
        WebSocketError::UnexpectedEOF => (Disconnect::ClientClosed, 1000, String::new()),
        WebSocketError::IoError(_) => (Disconnect::IoError, 1011, String::new()),
        other => (
            Disconnect::ProtocolError,
            1002,
            format!("protocol error: {other}"),
        ),
    };
    conn.close(why, code, &reason);
    conn.close_reason().unwrap_or(why)
}
