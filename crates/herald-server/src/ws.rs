//! The WebSocket handshake: what `/ws` (and the VBDS access route) answer before a session
//! runs: the upgrade itself, the origin check, the token the request presents.
//!
//! fastwebsockets answers the handshake; the session that follows is [`crate::session`]'s,
//! with herald's own protocol ([`crate::protocol::native`]) on `/ws`, MQTT
//! ([`crate::protocol::mqtt::session`]) on `/mqtt`, and STOMP
//! ([`crate::protocol::stomp::session`]) on `/stomp`.

use crate::auth;
use crate::connection::Framing;
use crate::limits::SocketHandle;
use crate::metrics::{Disconnect, Reason};
use crate::node::Node;
use crate::protocol::mqtt::session::Mqtt;
use crate::protocol::native::Native;
use crate::protocol::stomp::session::{Settings as StompSettings, StompSession};
use crate::session::{self, Protocol, Transport};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

pub async fn upgrade(State(node): State<Arc<Node>>, request: Request) -> Response {
    let socket = request.extensions().get::<SocketHandle>().cloned();
    accept(node, request, move |node, read, write, token| {
        let native = Native::new(&node.config);
        over_websocket(node, read, write, socket, token, native)
    })
}

/// The subprotocols an MQTT client may ask for: `mqtt` (MQTT 3.1.1 and 5.0), and `mqttv3.1`,
/// which some clients offer.
const MQTT_SUBPROTOCOLS: [&str; 2] = ["mqtt", "mqttv3.1"];

/// MQTT over WebSocket (`/mqtt`): an MQTT session on the upgraded connection, its packets in
/// binary WebSocket messages (split across or several within one, as clients send them).
pub async fn upgrade_mqtt(State(node): State<Arc<Node>>, request: Request) -> Response {
    let Ok(chosen) = subprotocol(&request, &MQTT_SUBPROTOCOLS) else {
        let msg = "this endpoint speaks MQTT over WebSocket: ask for the subprotocol \"mqtt\"\n";
        return (StatusCode::BAD_REQUEST, msg).into_response();
    };
    let socket = request.extensions().get::<SocketHandle>().cloned();
    let response = accept(node, request, move |node, read, write, token| {
        let mqtt = Mqtt::new(&node, Framing::WebSocket);
        over_websocket(node, read, write, socket, token, mqtt)
    });
    with_subprotocol(response, chosen)
}

/// The subprotocols a STOMP client may ask for, most preferred first (STOMP 1.2 §
/// "Connecting"; stompjs and stomp.py offer these names).
const STOMP_SUBPROTOCOLS: [&str; 3] = ["v12.stomp", "v11.stomp", "v10.stomp"];

/// STOMP over WebSocket (`/stomp`): a STOMP session on the upgraded connection, its frames in
/// WebSocket messages (split across or several within one, as clients send them).
pub async fn upgrade_stomp(State(node): State<Arc<Node>>, request: Request) -> Response {
    let chosen = match subprotocol(&request, &STOMP_SUBPROTOCOLS) {
        Ok(chosen) => chosen,
        Err(()) => {
            let msg = format!(
                "this endpoint speaks STOMP over WebSocket: ask for one of the subprotocols {}\n",
                STOMP_SUBPROTOCOLS.join(", ")
            );
            return (StatusCode::BAD_REQUEST, msg).into_response();
        }
    };
    let socket = request.extensions().get::<SocketHandle>().cloned();
    let response = accept(node, request, move |node, read, write, token| {
        let stomp = StompSession::new(StompSettings::of(&node.config), Framing::WebSocket);
        over_websocket(node, read, write, socket, token, stomp)
    });
    with_subprotocol(response, chosen)
}

/// The first of `supported` the request's `Sec-WebSocket-Protocol` offers (compared without
/// regard to case); `Ok(None)` when it offers none at all; `Err` when it offers only others.
fn subprotocol(request: &Request, supported: &[&'static str]) -> Result<Option<&'static str>, ()> {
    let offered: Vec<&str> = request
        .headers()
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .collect();
    if offered.is_empty() {
        return Ok(None);
    }
    supported
        .iter()
        .find(|p| offered.iter().any(|o| o.eq_ignore_ascii_case(p)))
        .map(|p| Some(*p))
        .ok_or(())
}

/// Names the chosen subprotocol in a successful handshake's response, as RFC 6455 requires
/// (a browser fails the connection when it asked for one and none is named).
fn with_subprotocol(mut response: Response, chosen: Option<&'static str>) -> Response {
    if let (Some(chosen), StatusCode::SWITCHING_PROTOCOLS) = (chosen, response.status()) {
        response.headers_mut().insert(
            header::SEC_WEBSOCKET_PROTOCOL,
            header::HeaderValue::from_static(chosen),
        );
    }
    response
}

/// Runs `protocol`'s session on an upgraded WebSocket connection.
pub fn over_websocket<P: Protocol>(
    node: Arc<Node>,
    read: ReadHalf,
    write: WriteHalf,
    socket: Option<SocketHandle>,
    token: Option<String>,
    protocol: P,
) -> impl std::future::Future<Output = ()> {
    let transport = Transport {
        read,
        write,
        framing: Framing::WebSocket,
    };
    session::run(node, transport, socket, token, protocol)
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
