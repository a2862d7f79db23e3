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

use crate::clock::now_us;
use crate::connection::{write_frames, Connection, QueueLimits};
use crate::frame_reader::FrameReader;
use crate::limits::{SocketHandle, Sockets};
use crate::metrics::Disconnect;
use crate::node::Node;
use crate::ws::{self, ReadHalf, WriteHalf};
use axum::extract::{DefaultBodyLimit, Multipart, Path, Query, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use bytes::Bytes;
use herald_core::codec::{Encode, Frame};
use herald_core::message::Message;
use herald_core::policy::Policy;
use herald_core::reply::{DropReason, Reply};
use herald_core::request::{PayloadKind, Publish, Request as WireRequest, Subscribe};
use herald_core::wire::{self, client_frames::Inbound};
use parking_lot::Mutex;
use serde::Deserialize;
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::sync::watch;

/// Bytes per binary chunk of an image sent to a VBDS subscriber.
const CHUNK: usize = 256 << 10;

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
    subscribers: Vec<Subscriber>,
}

/// What the stream knows of one connected VBDS subscriber: how far it is.
struct Subscriber {
    progress: watch::Receiver<Progress>,
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
    Extension(streams): Extension<Arc<Streams>>,
    Path(name): Path<String>,
    request: Request,
) -> Response {
    let Some(lossless) = streams.streams.lock().get(&name).map(|s| s.lossless) else {
        return missing(StatusCode::NOT_FOUND, &name);
    };
    // Its partly received messages count against the server-wide budget like any session's.
    let budget = request
        .extensions()
        .get::<SocketHandle>()
        .map(|s| s.sockets().clone());
    ws::accept(node, request, move |node, read, write, _token| {
        run_subscriber(node, streams, name, lossless, read, write, budget)
    })
}

/// VBDS's encoding of what a subscriber is sent. Its writer sends an image in chunks, one image
/// at a time (see [`run_subscriber`]), so this codec's frame of a message is what the writer
/// needs rather than bytes to write: the image (`body`) and its seq (`head`, 8 bytes
/// big-endian). VBDS has no place for replies or notices: they are empty frames, which the
/// writer skips. Not cached in the message: it is a refcount and 8 bytes.
struct Images;

impl Encode for Images {
    fn message(&self, message: &Message) -> Frame {
        Frame {
            head: Bytes::copy_from_slice(&message.seq().to_be_bytes()),
            body: message.payload().clone(),
        }
    }

    fn reply(&self, _: &Reply) -> Frame {
        Frame::default()
    }

    fn dropped(&self, _: &str, _: u64, _: DropReason) -> Frame {
        Frame::default()
    }
}

/// The seq of an image [`Images`] encoded, or `None` for any other frame.
fn image_seq(frame: &Frame) -> Option<u64> {
    let seq = <[u8; 8]>::try_from(&frame.head[..]).ok()?;
    Some(u64::from_be_bytes(seq))
}

/// One VBDS subscriber: an engine connection on the stream's topic whose messages are sent
/// the VBDS way, one image at a time, the next only after the client's acknowledgement.
async fn run_subscriber(
    node: Arc<Node>,
    streams: Arc<Streams>,
    name: String,
    lossless: bool,
    read: ReadHalf,
    mut write: WriteHalf,
    budget: Option<Arc<Sockets>>,
) {
    let conn = Connection::speaking(
        Arc::new(Images),
        QueueLimits::of(&node.config),
        node.metrics.clone(),
    );
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
    if let Some(stream) = streams.streams.lock().get_mut(&name) {
        stream.subscribers.push(Subscriber { progress: rx });
    }
    let (acks_tx, mut acks) = tokio::sync::mpsc::unbounded_channel();
    let reader = read_acks(&node, &conn, read, budget, acks_tx);
    let writer = async {
        let mut batch = Vec::new();
        loop {
            let closed = conn.next_frames(&mut batch).await;
            if closed {
                // Cut off (a `lossless` subscriber that stopped acknowledging) or shut down:
                // the close frame is the last thing queued.
                let close = batch.pop().into_iter().collect();
                return write_frames(&mut write, &mut { close }).await;
            }
            // Conflation leaves at most one image waiting; replies and notices are not VBDS's.
            let image = batch
                .drain(..)
                .filter_map(|f| image_seq(&f).map(|s| (s, f)))
                .last();
            if let Some((seq, frame)) = image {
                progress.send_modify(|p| p.busy_with = Some(seq));
                write_frames(&mut write, &mut chunks(frame.body)).await?;
                progress.send_modify(|p| p.sent = seq);
                tokio::select! {
                    ack = acks.recv() => if ack.is_none() {
                        break;
                    },
                    // Cut while waiting for the acknowledgement: the loop sends the close.
                    () = conn.cut_off() => continue,
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
        }
        Ok::<(), std::io::Error>(())
    };
    tokio::select! {
        _ = reader => {}
        _ = writer => {}
    }
    // Closed by the reader (a bad frame, the partly received bytes budget): its close frame
    // is still queued.
    if conn.is_closing() {
        let grace = std::time::Duration::from_secs(node.config.shutdown_grace_secs);
        let mut batch = Vec::new();
        let _ = tokio::time::timeout(grace, async {
            if conn.next_frames(&mut batch).await {
                let close = batch.pop().into_iter().collect();
                let _ = write_frames(&mut write, &mut { close }).await;
            }
        })
        .await;
    }
    node.disconnect(id);
    node.metrics
        .disconnected(conn.close_reason().unwrap_or(Disconnect::ClientClosed));
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
    budget: Option<Arc<Sockets>>,
    acks: tokio::sync::mpsc::UnboundedSender<()>,
) {
    let mut reader = FrameReader::new(read, ws::frame_limit(node)).with_budget(budget);
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
