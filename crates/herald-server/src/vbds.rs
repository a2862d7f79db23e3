//! The VBDS API (TMT's Visualization Bulk Data Service, `docs/vbds.md`), so existing VBDS
//! publishers, clients and displays work unchanged against herald.
//!
//! A VBDS stream `NAME` is the herald topic `vbds/NAME`: native herald subscribers see the same
//! images. VBDS's wire format and semantics are the default: every image reaches every
//! subscriber, one at a time, the next only after its acknowledgement (the subscriber is
//! `lossless` with a window of one image, granted again by each acknowledgement), so publishes
//! wait for it — bounded by `lossless_hold_timeout_ms`, after which a subscriber that stopped
//! acknowledging is closed (4008) and the camera goes on. A stream created with
//! `?lossless=false` fixes VBDS's flaw instead: a subscriber still busy with an image skips the
//! images published meanwhile and, when it acknowledges, gets the newest complete one (it
//! subscribes with the `conflate` policy).

use crate::limits::SocketHandle;
use crate::node::Node;
use crate::protocol::native::Native;
use crate::protocol::vbds::{Progress, Subscriber};
use crate::session::Protocol;
use crate::ws;
use axum::extract::{DefaultBodyLimit, Multipart, Path, Query, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use herald_core::request::{PayloadKind, Publish};
use parking_lot::Mutex;
use serde::Deserialize;
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::sync::watch;

/// The herald topic of VBDS stream `name`.
pub fn topic(name: &str) -> String {
    format!("vbds/{name}")
}

/// The VBDS streams this server knows, with their live subscribers' progress; the routes
/// share them ([`router`]).
#[derive(Default)]
struct Streams {
    streams: Mutex<BTreeMap<String, Stream>>,
}

struct Stream {
    content_type: String,
    lossless: bool,
    /// How far each connected VBDS subscriber is (see [`Progress`]).
    subscribers: Vec<watch::Receiver<Progress>>,
}

/// The `/vbds/...` routes, sharing the streams they create; `max_message_bytes` bounds an
/// upload (plus room for the form).
pub fn router(max_message_bytes: usize) -> Router<Arc<Node>> {
    let limit = max_message_bytes + (1 << 20);
    Router::new()
        .route("/vbds/admin/streams", get(list))
        .route("/vbds/admin/streams/{name}", post(create).delete(delete))
        .route(
            "/vbds/transfer/streams/{name}",
            post(transfer).layer(DefaultBodyLimit::max(limit)),
        )
        .route("/vbds/access/streams/{name}", get(access))
        .layer(Extension(Arc::new(Streams::default())))
}

async fn list(Extension(streams): Extension<Arc<Streams>>) -> Response {
    let streams = streams.streams.lock();
    let list: Vec<_> = streams.iter().map(|(name, s)| s.info(name)).collect();
    Json(list).into_response()
}

impl Stream {
    /// The stream as VBDS describes it (its `StreamInfo`).
    fn info(&self, name: &str) -> serde_json::Value {
        json!({"name": name, "contentType": self.content_type})
    }
}

#[derive(Deserialize)]
struct CreateOptions {
    #[serde(rename = "contentType", default)]
    content_type: Option<String>,
    /// VBDS's semantics (every image, acknowledged) unless `false`.
    #[serde(default = "lossless_by_default")]
    lossless: bool,
}

fn lossless_by_default() -> bool {
    true
}

async fn create(
    State(node): State<Arc<Node>>,
    Extension(streams): Extension<Arc<Streams>>,
    Path(name): Path<String>,
    Query(options): Query<CreateOptions>,
) -> Response {
    if let Err(e) = herald_core::topic::validate_topic(&topic(&name)) {
        return (StatusCode::BAD_REQUEST, format!("bad stream name: {e}\n")).into_response();
    }
    let mut streams = streams.streams.lock();
    if streams.contains_key(&name) {
        return (
            StatusCode::CONFLICT,
            format!("stream {name} already exists\n"),
        )
            .into_response();
    }
    let content_type = options
        .content_type
        .unwrap_or_else(|| "application/octet-stream".into());
    // Holding the camera is a privilege: where lossless_topics does not allow it, the stream's
    // subscribers skip images instead.
    let lossless = options.lossless && node.engine.lock().config().allows_lossless(&topic(&name));
    if options.lossless && !lossless {
        tracing::warn!(stream = %name, "lossless_topics does not cover {}: its subscribers skip images", topic(&name));
    }
    let stream = Stream {
        content_type,
        lossless,
        subscribers: Vec::new(),
    };
    let info = stream.info(&name);
    streams.insert(name, stream);
    Json(info).into_response()
}

/// Deletes a stream, answering with it as VBDS does. Its subscribers stay connected, as with
/// VBDS (whose clients take a closed socket for an error): they receive nothing more until a
/// stream of that name is created again.
async fn delete(Extension(streams): Extension<Arc<Streams>>, Path(name): Path<String>) -> Response {
    match streams.streams.lock().remove(&name) {
        Some(stream) => Json(stream.info(&name)).into_response(),
        None => missing(StatusCode::NOT_FOUND, &name),
    }
}

/// An unknown stream: 404 for the admin and access routes, 400 for a transfer (what VBDS
/// answers each with).
fn missing(status: StatusCode, name: &str) -> Response {
    (status, format!("no stream named {name}\n")).into_response()
}

/// `POST /vbds/transfer/streams/{name}`, the image in multipart field `data`: publishes it on the
/// stream's topic and replies 202 once every VBDS subscriber has it or skipped it.
async fn transfer(
    State(node): State<Arc<Node>>,
    Extension(streams): Extension<Arc<Streams>>,
    Path(name): Path<String>,
    mut form: Multipart,
) -> Response {
    let Some((content_type, lossless)) = streams
        .streams
        .lock()
        .get(&name)
        .map(|s| (s.content_type.clone(), s.lossless))
    else {
        return missing(StatusCode::BAD_REQUEST, &name);
    };
    let mut data = None;
    loop {
        match form.next_field().await {
            Ok(Some(field)) if field.name() == Some("data") => match field.bytes().await {
                Ok(bytes) => data = Some(bytes),
                Err(e) => return (e.status(), format!("{}\n", e.body_text())).into_response(),
            },
            Ok(Some(_)) => {}
            Ok(None) => break,
            Err(e) => return (e.status(), format!("{}\n", e.body_text())).into_response(),
        }
    }
    let Some(payload) = data else {
        return (StatusCode::BAD_REQUEST, "no multipart field named `data`\n").into_response();
    };
    let request = Publish {
        id: None,
        topic: topic(&name).into(),
        payload,
        kind: PayloadKind::Binary,
        content_type: Some(content_type),
        stamp: false,
        extras: None,
    };
    let seq = match node.publish_http(&request, 0).await {
        Ok(published) => published.seq,
        Err(e) => return (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response(),
    };
    let waiting: Vec<_> = {
        let mut streams = streams.streams.lock();
        let Some(stream) = streams.get_mut(&name) else {
            return StatusCode::ACCEPTED.into_response();
        };
        stream
            .subscribers
            .retain(|progress| progress.has_changed().is_ok());
        stream.subscribers.clone()
    };
    // A subscriber that stops reading in the middle of an image must not hold the publisher for
    // ever: the wait is bounded like a lossless hold.
    let deadline = tokio::time::Instant::now()
        + std::time::Duration::from_millis(node.config.lossless_hold_timeout_ms);
    for mut rx in waiting {
        // Err: the subscriber went away, which settles it too.
        let settled = rx.wait_for(|p| p.settled(seq, lossless));
        let _ = tokio::time::timeout_at(deadline, settled).await;
    }
    StatusCode::ACCEPTED.into_response()
}

/// `GET /vbds/access/streams/{name}`: a WebSocket on which the client is sent the stream's
/// images (see [`crate::protocol::vbds`]), kept alive like a native client's. With auth on,
/// its token must allow subscribing to the stream's topic.
async fn access(
    State(node): State<Arc<Node>>,
    Extension(streams): Extension<Arc<Streams>>,
    Path(name): Path<String>,
    request: Request,
) -> Response {
    let Some(lossless) = streams.streams.lock().get(&name).map(|s| s.lossless) else {
        return missing(StatusCode::NOT_FOUND, &name);
    };
    let socket = request.extensions().get::<SocketHandle>().cloned();
    ws::accept(node, request, move |node, read, write, token| {
        let keepalive = Native::new(&node.config).keepalive();
        let (subscriber, progress) = Subscriber::new(topic(&name), lossless, keepalive);
        if let Some(stream) = streams.streams.lock().get_mut(&name) {
            stream.subscribers.push(progress);
        }
        ws::over_websocket(node, read, write, socket, token, subscriber)
    })
}
