//! The VBDS access socket's session (`docs/vbds.md`): a subscriber of one stream, sent each
//! image as VBDS sends it, one at a time, the next only after the client's acknowledgement.
//!
//! The session subscribes the stream's topic through the node like any client's subscribe (so
//! that, clustered, its interest reaches the broker at once), with the `lossless` policy and a
//! window of one image, granted again by each acknowledgement; or, for a stream that skips
//! images, `conflate`, so that an acknowledgement is answered with the newest complete image.
//! Its writer is its own ([`Protocol::writer`]): an image leaves in chunks, and waits for the
//! acknowledgement of the one before. The HTTP side (streams, transfers) is `crate::vbds`.

use crate::clock::now_us;
use crate::connection::{write_frames, Codec, Connection};
use crate::flush::Pending;
use crate::metrics::Disconnect;
use crate::node::Node;
use crate::session::{Context, Input, Keepalive, Protocol, Writer};
use crate::socket::SocketWrite;
use bytes::Bytes;
use herald_core::codec::{Encode, Frame};
use herald_core::engine::ConnId;
use herald_core::message::Message;
use herald_core::policy::Policy;
use herald_core::reply::{DropReason, Reply};
use herald_core::request::{Request, Subscribe};
use herald_core::wire;
use std::sync::Arc;
use tokio::sync::{mpsc, watch};

/// Bytes per binary chunk of an image sent to a VBDS subscriber.
pub const CHUNK: usize = 256 << 10;

/// Where a VBDS subscriber is: what a transfer waits on before replying 202.
#[derive(Clone, Copy, Debug, Default)]
pub struct Progress {
    /// The newest image (seq) written to it whole.
    pub sent: u64,
    /// The image it is being sent or has not acknowledged yet.
    pub busy_with: Option<u64>,
}

impl Progress {
    /// Whether image `seq` has been delivered to this subscriber, or skipped for it (it is busy
    /// with an older image, and will get the newest when it acknowledges).
    pub fn settled(&self, seq: u64, lossless: bool) -> bool {
        self.sent >= seq || (!lossless && self.busy_with.is_some_and(|b| b < seq))
    }
}

/// One VBDS subscriber of the stream whose herald topic is `topic`.
pub struct Subscriber {
    topic: String,
    lossless: bool,
    /// Each message the client sends acknowledges an image: told to the writer.
    acks: mpsc::UnboundedSender<()>,
    writer: Option<Writer>,
    keepalive: Keepalive,
}

impl Subscriber {
    /// A subscriber of `topic`, kept alive like a native client (`keepalive`); and its
    /// progress, for the transfers that wait on it.
    pub fn new(
        topic: String,
        lossless: bool,
        keepalive: Keepalive,
    ) -> (Subscriber, watch::Receiver<Progress>) {
        let (progress, watched) = watch::channel(Progress::default());
        let (acks, received) = mpsc::unbounded_channel();
        let grant = topic.clone();
        let writer: Writer = Box::new(move |node, conn, id, write| {
            Box::pin(write_images(
                node, conn, id, write, grant, lossless, progress, received,
            ))
        });
        let subscriber = Subscriber {
            topic,
            lossless,
            acks,
            writer: Some(writer),
            keepalive,
        };
        (subscriber, watched)
    }
}

impl Protocol for Subscriber {
    fn codec(&self) -> Codec {
        static IMAGES: std::sync::LazyLock<Codec> = std::sync::LazyLock::new(|| Arc::new(Images));
        IMAGES.clone()
    }

    fn keepalive(&self) -> Keepalive {
        self.keepalive.clone()
    }

    fn start(&mut self, cx: &mut Context<'_>) {
        cx.request(Request::Subscribe(Subscribe {
            topic: self.topic.clone(),
            policy: Some(if self.lossless {
                Policy::Lossless
            } else {
                Policy::Conflate
            }),
            window: Some(1),
            ..Subscribe::default()
        }));
    }

    fn input(&mut self, _cx: &mut Context<'_>, input: Input) -> Result<(), Disconnect> {
        // Any message acknowledges; the writer has gone once the connection is closing.
        if let Input::Message { .. } = input {
            let _ = self.acks.send(());
        }
        Ok(())
    }

    fn writer(&mut self) -> Option<Writer> {
        self.writer.take()
    }
}

/// VBDS's encoding of what a subscriber is sent. Its writer sends an image in chunks, one image
/// at a time (see [`write_images`]), so this codec's frame of a message is what the writer
/// needs rather than bytes to write: the image (`body`) and its seq (`head`, 8 bytes
/// big-endian). VBDS has no place for replies or notices: they are empty frames, which the
/// writer skips. Not cached in the message: it is a refcount and 8 bytes.
struct Images;

impl Encode for Images {
    fn message(&self, message: &Message, out: &mut Vec<Frame>) {
        out.push(Frame {
            head: Bytes::copy_from_slice(&message.seq().to_be_bytes()),
            body: message.payload().clone(),
        });
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

/// The subscriber's writer: an image at a time, in chunks, then waits for its
/// acknowledgement before the next (granting the `lossless` window again); the close frame
/// last.
#[allow(clippy::too_many_arguments)]
async fn write_images(
    node: Arc<Node>,
    conn: Arc<Connection>,
    id: ConnId,
    mut write: SocketWrite,
    topic: String,
    lossless: bool,
    progress: watch::Sender<Progress>,
    mut acks: mpsc::UnboundedReceiver<()>,
) -> std::io::Result<()> {
    let mut batch = Vec::new();
    loop {
        let closed = conn.next_frames(&mut batch).await;
        if closed {
            // Closed (a `lossless` subscriber that stopped acknowledging, the client's close,
            // shutdown): the close frame is the last thing queued.
            let close = batch.pop().into_iter().collect();
            return write_frames(&mut write, &mut { close }).await;
        }
        // Conflation leaves at most one image waiting; replies and notices are not VBDS's.
        let image = batch
            .drain(..)
            .filter_map(|f| image_seq(&f).map(|s| (s, f)))
            .last();
        let Some((seq, frame)) = image else {
            continue;
        };
        progress.send_modify(|p| p.busy_with = Some(seq));
        write_frames(&mut write, &mut chunks(frame.body)).await?;
        progress.send_modify(|p| p.sent = seq);
        tokio::select! {
            ack = acks.recv() => if ack.is_none() {
                return Ok(());
            },
            // Closing while waiting for the acknowledgement: the loop sends the close.
            () = conn.closed() => continue,
        }
        if lossless {
            let credit = Request::Credit {
                id: None,
                topic: topic.clone(),
                group: None,
                n: 1,
                bytes: 0,
            };
            let mut pending = Pending::default();
            if let Ok(outcome) = node.handle_now(id, credit, &mut pending, now_us()) {
                node.account(outcome);
            }
            node.released.notify_waiters();
        }
        progress.send_modify(|p| p.busy_with = None);
    }
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
