//! The HTTP surface: the WebSocket endpoint, publish over HTTP, health, metrics, the dashboard.

use crate::auth::{Caller, Refused};
use crate::node::Node;
use crate::{dashboard, introspect, ws};
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use herald_core::wire::{PayloadKind, ProtocolError, Publish};
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
        .route("/api/publish", post(missing_topic))
        .route("/api/publish/", post(missing_topic))
        .route("/api/publish/{*topic}", post(publish))
        .merge(
            crate::vbds::router(node.config.max_message_bytes).route_layer(
                axum::middleware::from_fn_with_state(node.clone(), admin_only),
            ),
        )
        .fallback(not_found)
        .with_state(node)
}

/// VBDS had no authentication; with auth on, its API is for holders of the admin API key.
async fn admin_only(
    State(node): State<Arc<Node>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if let Err(refusal) = require_admin(&node, request.headers()) {
        return refusal;
    }
    next.run(request).await
}

async fn metrics(State(node): State<Arc<Node>>, headers: HeaderMap) -> Response {
    if let Err(refusal) = require_admin(&node, &headers) {
        return refusal;
    }
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
    headers: HeaderMap,
    body: Body,
) -> Response {
    if let Err(refusal) = authorize_publish(&node, &headers, &topic) {
        return refusal;
    }
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
        Err(crate::upload::BodyError::TooLarge) => return too_large(),
        Err(crate::upload::BodyError::Broken) => {
            return error(
                StatusCode::BAD_REQUEST,
                ProtocolError::new("bad_body", "the request body could not be read"),
            )
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
    };
    match node.publish_http(&request).await {
        Ok(p) => {
            Json(json!({"topic": request.topic.as_str(), "seq": p.seq, "deliveries": p.deliveries}))
                .into_response()
        }
        Err(e) if e.code == "message_too_large" => error(StatusCode::PAYLOAD_TOO_LARGE, e),
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
        "no such endpoint; herald serves /, /ws, /healthz, /metrics, /api/stats, /api/topics and POST /api/publish/{topic}",
    );
    error(StatusCode::NOT_FOUND, e)
}

/// With auth on, admin endpoints need the admin API key (`Authorization: Bearer <key>`).
#[allow(clippy::result_large_err)]
pub fn require_admin(node: &Node, headers: &HeaderMap) -> Result<(), Response> {
    let Some(auth) = &node.auth else {
        return Ok(());
    };
    match auth.http_caller(headers) {
        Ok(Caller::Admin) => Ok(()),
        Ok(Caller::Token(_)) => Err(refuse(
            node,
            StatusCode::FORBIDDEN,
            "forbidden",
            "this endpoint needs the admin API key, not a client token".into(),
        )),
        Err(Refused(why)) => Err(refuse(node, StatusCode::UNAUTHORIZED, "unauthorized", why)),
    }
}

/// With auth on, publishing over HTTP needs the admin API key or a token granting the topic.
#[allow(clippy::result_large_err)]
fn authorize_publish(node: &Node, headers: &HeaderMap, topic: &str) -> Result<(), Response> {
    let Some(auth) = &node.auth else {
        return Ok(());
    };
    match auth.http_caller(headers) {
        Ok(Caller::Admin) => Ok(()),
        Ok(Caller::Token(s)) if s.grants.may_publish(topic) => Ok(()),
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

fn refuse(node: &Node, status: StatusCode, code: &'static str, why: String) -> Response {
    node.count_error(code);
    error(status, ProtocolError::new(code, why))
}

fn error(status: StatusCode, e: ProtocolError) -> Response {
    (status, Json(json!({"code": e.code, "message": e.message}))).into_response()
}
