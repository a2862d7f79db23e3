//! The HTTP surface: the WebSocket endpoint, publish over HTTP, health, metrics, the dashboard.

use crate::auth::{Caller, Refused};
use crate::limits::SocketHandle;
use crate::node::Node;
use crate::refusal::{error, refuse, require_admin};
use crate::upload::{BodyError, LimitedBody};
use crate::{dashboard, introspect, ws};
use axum::body::{Body, HttpBody};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use herald_core::engine::Origin;
use herald_core::request::{PayloadKind, ProtocolError, Publish};
use serde::Deserialize;
use serde_json::json;
use std::sync::Arc;

pub fn router(node: Arc<Node>) -> Router {
    Router::new()
        .merge(dashboard::router())
        .merge(introspect::router(&node))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/metrics", get(metrics))
        .route("/ws", get(ws::upgrade))
        .route("/mqtt", get(ws::upgrade_mqtt))
        .route("/stomp", get(ws::upgrade_stomp))
        .route("/api/publish", post(missing_topic))
        .route("/api/publish/", post(missing_topic))
        .route("/api/publish/{*topic}", post(publish))
        .merge(
            crate::vbds::router(node.config.max_message_bytes).route_layer(
                axum::middleware::from_fn_with_state(node.clone(), admin_only),
            ),
        )
        .fallback(not_found)
        .layer(axum::middleware::from_fn_with_state(
            node.clone(),
            limit_body,
        ))
        .with_state(node)
}

/// Puts every request body under the body deadline and the partly received bytes budget.
async fn limit_body(
    State(node): State<Arc<Node>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if request.body().is_end_stream() {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    let budget = parts
        .extensions
        .get::<SocketHandle>()
        .map(|s| s.sockets().clone());
    let body = Body::new(LimitedBody::new(body, &node.config.limits, budget));
    next.run(axum::extract::Request::from_parts(parts, body))
        .await
}

/// VBDS had no authentication; with auth on, its API is for holders of the admin API key.
/// Its writes, like HTTP publish, are refused to browser pages from other origins.
async fn admin_only(
    State(node): State<Arc<Node>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if !matches!(*request.method(), Method::GET | Method::HEAD) {
        if let Err(refusal) = check_origin(&node, request.headers()) {
            return refusal;
        }
    }
    if let Err(refusal) = require_admin(&node, request.headers()) {
        return refusal;
    }
    authenticated(&node, request.extensions().get::<SocketHandle>());
    next.run(request).await
}

/// The request's socket proved itself (a token or the admin key): it is no longer shed as
/// unauthenticated.
fn authenticated(node: &Node, socket: Option<&SocketHandle>) {
    if node.auth.is_some() {
        if let Some(socket) = socket {
            socket.authenticated();
        }
    }
}

async fn metrics(
    State(node): State<Arc<Node>>,
    socket: Option<axum::Extension<SocketHandle>>,
    headers: HeaderMap,
) -> Response {
    if let Err(refusal) = require_admin(&node, &headers) {
        return refusal;
    }
    authenticated(&node, socket.as_deref());
    node.refresh_gauges();
    let content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8";
    (
        [(header::CONTENT_TYPE, content_type)],
        node.metrics.render(),
    )
        .into_response()
}

#[derive(Deserialize)]
struct PublishOptions {
    #[serde(default)]
    stamp: bool,
}

/// `POST /api/publish/{topic}`: the body, unchanged, is the payload.
async fn publish(
    State(node): State<Arc<Node>>,
    Path(topic): Path<String>,
    Query(options): Query<PublishOptions>,
    socket: Option<axum::Extension<SocketHandle>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    if let Err(refusal) = check_origin(&node, &headers) {
        return refusal;
    }
    if let Some(socket) = &socket {
        if !node
            .ip_limits
            .may_publish(socket.peer(), std::time::Instant::now())
        {
            node.count_error("rate_limited");
            let e = ProtocolError::new(
                "rate_limited",
                format!(
                    "too fast: more than {} HTTP publishes per second from your address (limits.http_publish_rate_per_ip)",
                    node.config.limits.http_publish_rate_per_ip
                ),
            );
            let mut response = error(StatusCode::TOO_MANY_REQUESTS, e);
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
            return response;
        }
    }
    let origin = match authorize_publish(&node, &headers, &topic) {
        Ok(origin) => origin,
        Err(refusal) => return refusal,
    };
    authenticated(&node, socket.as_deref());
    let limit = node.config.max_message_bytes;
    let too_large = || {
        node.count_error("message_too_large");
        error(
            StatusCode::PAYLOAD_TOO_LARGE,
            ProtocolError::new(
                "message_too_large",
                format!("the body exceeds max_message_bytes ({limit} bytes); raise it in the config or send less"),
            ),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
    let payload = match crate::upload::read_body(body, limit, declared).await {
        Ok(payload) => payload,
        Err(BodyError::TooLarge) => return too_large(),
        Err(BodyError::Broken) => {
            return error(
                StatusCode::BAD_REQUEST,
                ProtocolError::new("bad_body", "the request body could not be read"),
            )
        }
        Err(BodyError::TooSlow) => {
            let limits = &node.config.limits;
            let why = format!(
                "the request body arrived too slowly: it may take {} s plus one second per {} bytes (limits.body_timeout_secs, limits.body_min_bytes_per_sec)",
                limits.body_timeout_secs, limits.body_min_bytes_per_sec
            );
            return closing(refuse(
                &node,
                StatusCode::REQUEST_TIMEOUT,
                "body_timeout",
                why,
            ));
        }
        Err(BodyError::Busy) => {
            let why = "try again later: the server holds its limit of partly received messages (limits.max_partial_bytes)".into();
            let mut response = closing(refuse(
                &node,
                StatusCode::SERVICE_UNAVAILABLE,
                "server_busy",
                why,
            ));
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
            return response;
        }
    };
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let kind = match &content_type {
        Some(ct) if is_textual(ct) && std::str::from_utf8(&payload).is_ok() => PayloadKind::Text,
        _ => PayloadKind::Binary,
    };
    let request = Publish {
        id: None,
        topic: topic.into(),
        payload,
        kind,
        content_type,
        stamp: options.stamp,
        extras: None,
    };
    match node.publish_http(&request, origin).await {
        Ok(p) => {
            Json(json!({"topic": request.topic.as_str(), "seq": p.seq, "deliveries": p.deliveries}))
                .into_response()
        }
        Err(e) if e.code == "message_too_large" => error(StatusCode::PAYLOAD_TOO_LARGE, e),
        Err(e) if e.code == "too_many_topics" || e.code == "retained_limit" => {
            error(StatusCode::SERVICE_UNAVAILABLE, e)
        }
        Err(e) => error(StatusCode::BAD_REQUEST, e),
    }
}

/// Content types whose UTF-8 bodies are delivered as text frames.
fn is_textual(content_type: &str) -> bool {
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence.starts_with("text/") || essence == "application/json"
}

async fn missing_topic(State(node): State<Arc<Node>>) -> Response {
    node.count_error("invalid_topic");
    let e = ProtocolError::new(
        "invalid_topic",
        "no topic: publish to /api/publish/{topic}, e.g. /api/publish/camera/1/raw",
    );
    error(StatusCode::BAD_REQUEST, e)
}

async fn not_found() -> Response {
    let e = ProtocolError::new(
        "not_found",
        "no such endpoint; herald serves /, /ws, /stomp, /healthz, /metrics, /api/stats, /api/topics and POST /api/publish/{topic}",
    );
    error(StatusCode::NOT_FOUND, e)
}

/// With auth on, publishing over HTTP needs the admin API key or a token granting the topic.
/// Returns who the publish is charged to (a token's subject; the admin key and auth off:
/// nobody).
#[allow(clippy::result_large_err)]
fn authorize_publish(node: &Node, headers: &HeaderMap, topic: &str) -> Result<Origin, Response> {
    let Some(auth) = &node.auth else {
        return Ok(0);
    };
    match auth.http_caller(headers) {
        Ok(Caller::Admin) => Ok(0),
        Ok(Caller::Token(s)) if s.grants.may_publish(topic) => {
            Ok(node.origin_of(s.subject.as_deref()))
        }
        Ok(Caller::Token(s)) => Err(refuse(
            node,
            StatusCode::FORBIDDEN,
            "forbidden",
            format!(
                "your token does not grant publishing to {topic:?}; it grants {:?}",
                s.grants.publish
            ),
        )),
        Err(Refused(why)) => Err(refuse(node, StatusCode::UNAUTHORIZED, "unauthorized", why)),
    }
}

/// Refuses a browser page from an origin not in `auth.allowed_origins` (403): with auth off,
/// any web page could otherwise publish through its visitors' browsers with a simple
/// cross-site POST. The rule is the WebSocket upgrade's with auth on: an empty list means the
/// page's own origin only. Clients that send no `Origin` (not browsers) pass.
#[allow(clippy::result_large_err)]
fn check_origin(node: &Node, headers: &HeaderMap) -> Result<(), Response> {
    let Some(origin) = headers.get(header::ORIGIN) else {
        return Ok(());
    };
    let origin = origin.to_str().unwrap_or("");
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    if crate::auth::origin_allowed(&node.config.auth.allowed_origins, origin, host, false) {
        return Ok(());
    }
    let why =
        format!("origin {origin:?} may not publish over HTTP: list it in auth.allowed_origins");
    Err(refuse(
        node,
        StatusCode::FORBIDDEN,
        "origin_not_allowed",
        why,
    ))
}

/// Asks hyper to close the connection after this response (its body was not read whole).
fn closing(mut response: Response) -> Response {
    response.headers_mut().insert(
        header::CONNECTION,
        header::HeaderValue::from_static("close"),
    );
    response
}
