//! The VBDS API (TMT's Visualization Bulk Data Service, `docs/vbds.md`), so existing VBDS
//! publishers, clients and displays work unchanged against herald.
//!
//! A VBDS stream `NAME` is the herald topic `vbds/NAME`: native herald subscribers see the same
//! images. VBDS's wire format and one-acknowledgement-per-image flow control are kept; its flaw
//! is not: by default a subscriber still busy with an image (not yet acknowledged) skips the
//! images published meanwhile and, when it acknowledges, gets the newest complete one (it
//! subscribes with the `conflate` policy). A stream created with `?lossless=true` keeps VBDS's
//! exact semantics (the subscriber is `lossless` with a window of one image, granted again by
//! each acknowledgement, so publishes wait for it).

use crate::connection::{write_frames, Connection, QueueLimits};
use crate::frame_reader::FrameReader;
use crate::metrics::Disconnect;
use crate::node::{now_us, Node};
use crate::ws::{self, ReadHalf, WriteHalf};
use axum::extract::{DefaultBodyLimit, Multipart, Path, Query, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use herald_core::policy::Policy;
use herald_core::wire::client_frames::Inbound;
use herald_core::wire::{self, Frame, PayloadKind, Publish, Request as WireRequest, Subscribe};
use parking_lot::Mutex;
use serde::Deserialize;
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::sync::{watch, Notify};

/// Bytes per binary chunk of an image sent to a VBDS subscriber.
const CHUNK: usize = 256 << 10;

/// The herald topic of VBDS stream `name`.
pub fn topic(name: &str) -> String {
    format!("vbds/{name}")
}

/// The VBDS streams this server knows, with their live subscribers' progress.
#[derive(Default)]
pub struct Streams {
    streams: Mutex<BTreeMap<String, Stream>>,
}

struct Stream {
    content_type: String,
    lossless: bool,
    subscribers: Vec<Subscriber>,
}

/// What the stream knows of one connected VBDS subscriber.
struct Subscriber {
    progress: watch::Receiver<Progress>,
    /// Told when the stream is deleted: the subscriber is closed (1001) between images.
    deleted: Arc<Notify>,
}

/// Where a VBDS subscriber is: what a publish waits on before replying 202.
#[derive(Clone, Copy, Debug, Default)]
struct Progress {
    /// The newest image (seq) written to it whole.
    sent: u64,
    /// The image it is being sent or has not acknowledged yet.
    busy_with: Option<u64>,
}

impl Progress {
    /// Whether image `seq` has been delivered to this subscriber, or skipped for it (it is busy
    /// with an older image, and will get the newest when it acknowledges).
    fn settled(&self, seq: u64, lossless: bool) -> bool {
        self.sent >= seq || (!lossless && self.busy_with.is_some_and(|b| b < seq))
    }
}

/// The `/vbds/...` routes; `max_message_bytes` bounds an upload (plus room for the form).
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
}

async fn list(State(node): State<Arc<Node>>) -> Response {
    let streams = node.vbds.streams.lock();
    let list: Vec<_> = streams
        .iter()
        .map(|(name, s)| json!({"name": name, "contentType": s.content_type}))
        .collect();
    Json(list).into_response()
}

#[derive(Deserialize)]
struct CreateOptions {
    #[serde(rename = "contentType", default)]
    content_type: Option<String>,
    #[serde(default)]
    lossless: bool,
}

async fn create(
    State(node): State<Arc<Node>>,
    Path(name): Path<String>,
    Query(options): Query<CreateOptions>,
) -> Response {
    if let Err(e) = herald_core::topic::validate_topic(&topic(&name)) {
        return (StatusCode::BAD_REQUEST, format!("bad stream name: {e}\n")).into_response();
    }
    let mut streams = node.vbds.streams.lock();
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
    let stream = Stream {
        content_type,
        lossless: options.lossless,
        subscribers: Vec::new(),
    };
    streams.insert(name, stream);
    StatusCode::OK.into_response()
}

/// Deletes a stream and closes its VBDS subscribers (1001 `stream NAME deleted`) once the image
/// each is being sent, if any, is complete: a VBDS client has no other way to learn it, and
/// would otherwise wait on a stream that can no longer be published to.
async fn delete(State(node): State<Arc<Node>>, Path(name): Path<String>) -> Response {
    match node.vbds.streams.lock().remove(&name) {
        Some(stream) => {
            for s in stream.subscribers {
                // A stored permit: the writer sees it even if it is in the middle of a write.
                s.deleted.notify_one();
            }
            StatusCode::OK.into_response()
        }
        None => missing(&name),
    }
}

fn missing(name: &str) -> Response {
    (StatusCode::NOT_FOUND, format!("no stream named {name}\n")).into_response()
}

/// `POST /vbds/transfer/streams/{name}`, the image in multipart field `data`: publishes it on the
/// stream's topic and replies 202 once every VBDS subscriber has it or skipped it.
async fn transfer(
    State(node): State<Arc<Node>>,
    Path(name): Path<String>,
    mut form: Multipart,
) -> Response {
    let Some((content_type, lossless)) = node
        .vbds
        .streams
        .lock()
        .get(&name)
        .map(|s| (s.content_type.clone(), s.lossless))
    else {
        return missing(&name);
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
    };
    let seq = match node.publish_http(&request).await {
        Ok(published) => published.seq,
        Err(e) => return (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response(),
    };
    let waiting: Vec<_> = {
        let mut streams = node.vbds.streams.lock();
        let Some(stream) = streams.get_mut(&name) else {
            return StatusCode::ACCEPTED.into_response();
        };
        stream
            .subscribers
            .retain(|s| s.progress.has_changed().is_ok());
        stream
            .subscribers
            .iter()
            .map(|s| s.progress.clone())
            .collect()
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

async fn access(
    State(node): State<Arc<Node>>,
    Path(name): Path<String>,
    request: Request,
) -> Response {
    let Some(lossless) = node.vbds.streams.lock().get(&name).map(|s| s.lossless) else {
        return missing(&name);
    };
    ws::accept(node, request, move |node, read, write, _token| {
        run_subscriber(node, name, lossless, read, write)
    })
}

/// One VBDS subscriber: an engine connection on the stream's topic whose frames are re-framed
/// the VBDS way, one image at a time, the next only after the client's acknowledgement.
async fn run_subscriber(
    node: Arc<Node>,
    name: String,
    lossless: bool,
    read: ReadHalf,
    mut write: WriteHalf,
) {
    let conn = Connection::new(QueueLimits::of(&node.config), node.metrics.clone());
    let id = node.engine.lock().connect(conn.clone());
    let pattern = topic(&name);
    let subscribe = WireRequest::Subscribe(Subscribe {
        topic: pattern.clone(),
        policy: Some(if lossless {
            Policy::Lossless
        } else {
            Policy::Conflate
        }),
        window: Some(1),
        ..Subscribe::default()
    });
    let _ = node.engine.lock().handle(id, subscribe, now_us());
    let (progress, rx) = watch::channel(Progress::default());
    let deleted = Arc::new(Notify::new());
    match node.vbds.streams.lock().get_mut(&name) {
        Some(stream) => stream.subscribers.push(Subscriber {
            progress: rx,
            deleted: deleted.clone(),
        }),
        // Deleted since the handshake began.
        None => deleted.notify_one(),
    }
    let (acks_tx, mut acks) = tokio::sync::mpsc::unbounded_channel();
    let reader = read_acks(&node, &conn, read, acks_tx);
    let writer = async {
        let mut batch = Vec::new();
        loop {
            let closed = tokio::select! {
                closed = conn.next_frames(&mut batch) => closed,
                _ = deleted.notified() => return stream_deleted(&mut write, &name).await,
            };
            // Conflation leaves at most one image waiting; replies and notices are not VBDS's.
            let image = batch
                .drain(..)
                .filter_map(|f| wire::binary_message_seq(&f).map(|s| (s, f)))
                .last();
            if let Some((seq, frame)) = image {
                progress.send_modify(|p| p.busy_with = Some(seq));
                write_frames(&mut write, &mut chunks(frame.body)).await?;
                progress.send_modify(|p| p.sent = seq);
                tokio::select! {
                    ack = acks.recv() => if ack.is_none() {
                        break;
                    },
                    _ = deleted.notified() => return stream_deleted(&mut write, &name).await,
                }
                if lossless {
                    let credit = WireRequest::Credit {
                        id: None,
                        topic: pattern.clone(),
                        n: 1,
                        bytes: 0,
                    };
                    let _ = node.engine.lock().handle(id, credit, now_us());
                    node.released.notify_waiters();
                }
                progress.send_modify(|p| p.busy_with = None);
            }
            if closed {
                break;
            }
        }
        Ok::<(), std::io::Error>(())
    };
    tokio::select! {
        _ = reader => {}
        _ = writer => {}
    }
    node.disconnect(id);
    node.metrics
        .disconnected(conn.close_reason().unwrap_or(Disconnect::ClientClosed));
}

/// Tells a subscriber its stream is gone: close 1001 (going away), between two images.
async fn stream_deleted(write: &mut WriteHalf, name: &str) -> std::io::Result<()> {
    let close = wire::encode_close(1001, &format!("stream {name} deleted"));
    write_frames(write, &mut vec![close]).await
}

/// An image as VBDS sends it: binary chunks of at most [`CHUNK`] bytes, never one of exactly one
/// byte (a VBDS client takes a one-byte message for the end of the image), then the one-byte
/// message `\n`.
fn chunks(image: Bytes) -> Vec<Frame> {
    let mut frames = Vec::with_capacity(image.len() / CHUNK + 2);
    let mut at = 0;
    while at < image.len() {
        let left = image.len() - at;
        let mut take = left.min(CHUNK);
        if left - take == 1 || (take == 1 && at > 0) {
            take -= 1;
        }
        frames.push(wire::encode_binary(image.slice(at..at + take)));
        at += take;
    }
    frames.push(wire::encode_binary(Bytes::from_static(b"\n")));
    frames
}

/// Reads the client's messages: each one acknowledges an image.
async fn read_acks(
    node: &Node,
    conn: &Arc<Connection>,
    read: ReadHalf,
    acks: tokio::sync::mpsc::UnboundedSender<()>,
) {
    let mut reader = FrameReader::new(read, ws::frame_limit(node));
    loop {
        match reader.next().await {
            Ok(Inbound::Message { .. }) if acks.send(()).is_err() => return,
            Ok(Inbound::Close(_)) => return,
            Ok(_) => {}
            Err(e) => {
                ws::close_for_error(conn, &e);
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_chunk_is_one_byte_and_the_image_is_whole() {
        for len in [
            0,
            1,
            2,
            3,
            CHUNK - 1,
            CHUNK,
            CHUNK + 1,
            CHUNK + 2,
            3 * CHUNK + 1,
        ] {
            let image = Bytes::from((0..len).map(|i| i as u8).collect::<Vec<_>>());
            let frames = chunks(image.clone());
            let (last, data) = frames.split_last().unwrap();
            assert_eq!(&last.body[..], b"\n");
            let joined: Vec<u8> = data.iter().flat_map(|f| f.body.to_vec()).collect();
            assert_eq!(joined, image.to_vec(), "{len}");
            if len != 1 {
                assert!(data.iter().all(|f| f.body.len() > 1), "{len}");
            }
        }
    }
}
