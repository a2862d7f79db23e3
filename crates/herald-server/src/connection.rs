//! One client connection's outbound side: the queue the engine fills, and who writes it to
//! the socket.
//!
//! Two writers take turns, never at once (frames must not interleave): the task that queued a
//! frame writes it directly when it can ([`Connection::write_now`], see [`crate::flush`]), and
//! the connection's writer task ([`Connection::run_writer`]) writes whatever must wait for the
//! socket, the close frame, throttled messages, and everything on a TLS connection. Each takes
//! everything queued at its turn and sends it with vectored writes, so under load many messages
//! leave in one system call, and when idle a message leaves at once.
//!
//! Each connection speaks one protocol, its codec: the queue holds messages as the engine made
//! them, and whoever writes encodes them with the codec as it takes them (the bytes cached in
//! each message, shared by every connection of that protocol). Replies and notices the engine
//! sends are encoded by the codec when they are queued, so the bound counts their real length.

use crate::clock::now_us;
use crate::metrics::{Disconnect, Metrics, PolicyAction};
use crate::socket::{DirectSocket, SharedWrite};
use bytes::Buf;
use herald_core::codec::{Encode, Frame};
use herald_core::engine::Outbox;
use herald_core::group::Group;
use herald_core::message::Message;
use herald_core::outbox::{Delivery, OutboundQueue, Pushed, IDLE_CAPACITY};
use herald_core::prefetch::prefetch;
use herald_core::reply::{DropReason, Reply};
use herald_core::wire;
use parking_lot::Mutex;
use std::cell::Cell;
use std::io::{self, IoSlice};
use std::mem::MaybeUninit;
use std::ptr;
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::Notify;

/// A connection's protocol: what encodes what it is sent. Shared, so that a codec may carry
/// per-connection state (MQTT's packet ids); the connection holds it for its life, so no
/// message pays for the sharing.
pub type Codec = Arc<dyn Encode + Send + Sync>;

/// herald's own codec, one for every connection that speaks it.
pub fn native() -> Codec {
    static NATIVE: std::sync::LazyLock<Codec> = std::sync::LazyLock::new(|| Arc::new(wire::Native));
    NATIVE.clone()
}

/// How a connection's transport frames its close: a WebSocket close frame, or, on a plain
/// byte stream (MQTT, STOMP over TCP), nothing: the writer just ends the stream (a protocol
/// that says goodbye queues its last words itself first).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    WebSocket,
    Stream,
}

pub struct Connection {
    out: Mutex<Outgoing>,
    codec: Codec,
    /// Whether `codec` is herald's own: its messages are then encoded through a direct call,
    /// which the drain inlines (most connections speak it, and the call is per delivery).
    native: bool,
    framing: Framing,
    /// The plain TCP socket, which queueing tasks may write to directly; `None` when only the
    /// writer task writes (TLS, VBDS).
    socket: Option<DirectSocket>,
    /// This connection, for the direct-write list (the engine hands out `&Connection`).
    me: Weak<Connection>,
    /// Wakes the writer when it has work: a first frame queued outside a direct-write batch, a
    /// direct write's leftovers, a close.
    wake: Notify,
    /// Tells a writer stuck on a full socket that the connection is being cut.
    cut: Notify,
    /// Why the connection is closing, once it is.
    closing: Mutex<Option<Disconnect>>,
    max_outbound_bytes: usize,
    /// Most bytes of replayed and snapshot messages queued at once (see
    /// [`Outbox::recovery_room`]).
    max_recovery_bytes: usize,
    metrics: Arc<Metrics>,
}

/// What waits to be written, and who is writing.
struct Outgoing {
    queue: OutboundQueue,
    writer: Turn,
    /// What a direct write could not send, handed to the writer task (first frame trimmed to
    /// its unsent bytes).
    carry: Vec<Frame>,
}

/// Who holds the socket's write side. Taken and given back under the `out` lock.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Turn {
    Nobody,
    /// A task writing directly; it never waits, and hands over to the writer task if it must.
    Direct,
    /// The connection's writer task.
    Task,
}

impl Outbox for Connection {
    fn reply(&self, reply: &Reply) {
        let closes = self.codec.closes_after(reply);
        self.send(self.codec.reply(reply));
        if closes {
            self.close_after(reply);
        }
    }

    fn dropped(&self, topic: &str, count: u64, reason: DropReason) {
        self.send(self.codec.dropped(topic, count, reason));
    }

    fn deliver(&self, message: &Message, d: &Delivery) {
        let delivered = self.out.lock().queue.deliver(message, d);
        if delivered.dropped > 0 {
            self.metrics
                .policy(PolicyAction::Drop, d.rule, delivered.dropped);
        }
        if delivered.conflated > 0 {
            self.metrics
                .policy(PolicyAction::Conflate, d.rule, delivered.conflated);
        }
        self.after_push(delivered.pushed, d.rule);
    }

    fn deliver_grouped(&self, message: &Message, group: &Arc<Group>, d: &Delivery) {
        let delivered = self.out.lock().queue.deliver_grouped(message, group, d);
        if delivered.dropped > 0 {
            self.metrics
                .policy(PolicyAction::Drop, d.rule, delivered.dropped);
        }
        self.after_push(delivered.pushed, d.rule);
    }

    fn has_room(&self, size: usize) -> bool {
        self.out.lock().queue.has_room(size)
    }

    fn prefetch(&self) {
        prefetch(self, std::mem::size_of::<Self>());
    }

    fn recovered(&self, message: &Message) {
        let pushed = self.out.lock().queue.push_recovered(message.clone());
        self.after_push(pushed, None);
    }

    fn recovery_room(&self) -> usize {
        self.max_recovery_bytes
            .saturating_sub(self.recovery_queued())
    }

    fn recovery_queued(&self) -> usize {
        self.out.lock().queue.recovered_bytes()
    }

    fn snapshot(&self, pattern: &str, count: usize) {
        if let Some(notice) = self.codec.snapshot(pattern, count) {
            self.send(notice);
        }
    }
}

/// What a connection may queue: the live backlog before its slow-consumer policy acts, and
/// replayed and snapshot messages, bounded apart (a recovery may be larger than the backlog a
/// healthy subscriber is allowed).
#[derive(Clone, Copy, Debug)]
pub struct QueueLimits {
    pub outbound: usize,
    pub recovery: usize,
}

impl QueueLimits {
    pub fn of(config: &crate::Config) -> Self {
        QueueLimits {
            outbound: config.max_outbound_bytes,
            recovery: config.max_recovery_bytes,
        }
    }

    /// The same bound on both (tests).
    pub fn both(bytes: usize) -> Self {
        QueueLimits {
            outbound: bytes,
            recovery: bytes,
        }
    }
}

impl Connection {
    /// A WebSocket connection of herald's protocol whose writer task does all the writing.
    pub fn new(limits: QueueLimits, metrics: Arc<Metrics>) -> Arc<Self> {
        Self::open(native(), Framing::WebSocket, None, limits, metrics)
    }

    /// A WebSocket connection of herald's protocol on a plain TCP socket that queueing tasks
    /// may also write to directly.
    pub fn direct(socket: OwnedWriteHalf, limits: QueueLimits, metrics: Arc<Metrics>) -> Arc<Self> {
        Self::open(native(), Framing::WebSocket, Some(socket), limits, metrics)
    }

    /// Moves what may go now from `queue` into `frames`, encoded by the connection's codec.
    /// An empty queue is seen here, inline: a direct write drains again after writing, to take
    /// what came meanwhile, and almost always finds nothing.
    #[inline(always)]
    fn drain(&self, queue: &mut OutboundQueue, frames: &mut Vec<Frame>, now_us: u64) {
        if !queue.is_drained() {
            self.drain_queued(queue, frames, now_us);
        }
    }

    /// [`Connection::drain`] past its check.
    fn drain_queued(&self, queue: &mut OutboundQueue, frames: &mut Vec<Frame>, now_us: u64) {
        if self.native {
            queue.drain_into(frames, &wire::Native, now_us);
        } else {
            queue.drain_into(frames, &*self.codec, now_us);
        }
    }

    /// Takes everything queued, encoded by `codec` rather than the connection's own: for a
    /// connection no writer drains (a parked MQTT session's, whose codec collects).
    pub fn drain_with<E: Encode + ?Sized>(&self, codec: &E) -> Vec<Frame> {
        let mut frames = Vec::new();
        self.out
            .lock()
            .queue
            .drain_into(&mut frames, codec, now_us());
        frames
    }

    /// A connection of `codec`'s protocol over a transport that closes as `framing` says;
    /// given `socket` (plain TCP), queueing tasks may write to it directly, else the writer
    /// task does all the writing.
    pub fn open(
        codec: Codec,
        framing: Framing,
        socket: Option<OwnedWriteHalf>,
        limits: QueueLimits,
        metrics: Arc<Metrics>,
    ) -> Arc<Self> {
        let socket = socket.map(DirectSocket::new);
        let native = Arc::ptr_eq(&codec, &native());
        Arc::new_cyclic(|me| Connection {
            codec,
            native,
            framing,
            out: Mutex::new(Outgoing {
                queue: OutboundQueue::new(limits.outbound),
                writer: Turn::Nobody,
                carry: Vec::new(),
            }),
            socket,
            me: me.clone(),
            wake: Notify::new(),
            cut: Notify::new(),
            closing: Mutex::new(None),
            max_outbound_bytes: limits.outbound,
            max_recovery_bytes: limits.recovery,
            metrics,
        })
    }

    /// Queues a frame encoded for this connection, never dropped (a reply, a notice).
    fn send(&self, frame: Frame) {
        let pushed = self.out.lock().queue.push(frame);
        self.after_push(pushed, None);
    }

    /// Arranges for a first frame to be written (directly after the current batch, or by the
    /// writer task), or cuts a slow consumer (`rule`: the configured policy rule of the
    /// message's topic, for the metrics).
    fn after_push(&self, pushed: Pushed, rule: Option<usize>) {
        match pushed {
            Pushed::First => {
                if self.socket.is_none() || !defer(|| self.me.upgrade()) {
                    self.wake.notify_one();
                }
            }
            Pushed::Queued | Pushed::Closed => {}
            Pushed::Overflow => {
                let reason = format!(
                    "slow consumer: more than {} bytes queued",
                    self.max_outbound_bytes
                );
                self.metrics.policy(PolicyAction::Disconnect, rule, 1);
                self.close(Disconnect::SlowConsumer, 4008, &reason);
            }
        }
    }

    /// Queues a close frame; the writer sends it and stops. A slow consumer's backlog is
    /// discarded first (it would never drain), and shutdown or an error closes after what is
    /// already queued. Only the first close counts.
    /// On a byte stream the close carries neither code nor reason: the stream just ends.
    pub fn close(&self, why: Disconnect, code: u16, reason: &str) {
        let frame = match self.framing {
            Framing::WebSocket => wire::encode_close(code, reason),
            Framing::Stream => Frame::default(),
        };
        self.close_with(why, frame);
    }

    /// Closes with a ready-made close frame (e.g. the echo of a client's close).
    pub fn close_with(&self, why: Disconnect, frame: Frame) {
        let discard = why == Disconnect::SlowConsumer;
        if !self.out.lock().queue.close(frame, discard) {
            return;
        }
        *self.closing.lock() = Some(why);
        if discard {
            self.cut.notify_one();
        } else {
            // Only a writer waiting on something besides its queue listens now (see
            // `Connection::closed`).
            self.cut.notify_waiters();
        }
        self.wake.notify_one();
    }

    /// Queues a control frame (a pong) that must not count against the consumer; says what
    /// became of it (`Overflow`: not queued, the queue is over its bound).
    pub fn send_control(&self, frame: Frame) -> Pushed {
        let pushed = self.out.lock().queue.push(frame);
        if pushed == Pushed::First {
            self.wake.notify_one();
        }
        pushed
    }

    /// Queues a reply the session or its protocol answers itself (a decoding error, a
    /// refusal), encoded by the codec; like [`Connection::send_control`], never counted
    /// against the consumer.
    pub fn answer(&self, reply: &Reply) -> Pushed {
        let closes = self.codec.closes_after(reply);
        let pushed = self.send_control(self.codec.reply(reply));
        if closes {
            self.close_after(reply);
        }
        pushed
    }

    /// Closes after `reply`, which the codec says ends the connection (a STOMP ERROR, or the
    /// RECEIPT of a DISCONNECT).
    fn close_after(&self, reply: &Reply) {
        match reply {
            Reply::Error { message, .. } => self.close(Disconnect::ProtocolError, 1002, message),
            _ => self.close(Disconnect::ClientClosed, 1000, "disconnected"),
        }
    }

    /// Resolves once the connection is closing: for a writer that waits on something besides
    /// its queue (the VBDS writer, waiting for an acknowledgement).
    pub async fn closed(&self) {
        loop {
            let notified = self.cut.notified();
            tokio::pin!(notified);
            // Registered before the check, so a close between the two is not missed.
            notified.as_mut().enable();
            if self.is_closing() {
                return;
            }
            notified.await;
        }
    }

    pub fn is_closing(&self) -> bool {
        self.out.lock().queue.is_closed()
    }

    /// Why the connection closed, if it did.
    pub fn close_reason(&self) -> Option<Disconnect> {
        *self.closing.lock()
    }

    /// Writes what is queued straight to the socket, from the calling task and without waiting,
    /// unless someone else is writing (they take it with theirs). What the socket does not take
    /// goes to the writer task, as do the close frame and throttled messages. `frames`: scratch
    /// space, left empty. Returns how many frames it took from the queue (written, or handed
    /// to the writer task with the rest of a short write).
    pub fn write_now(&self, frames: &mut Vec<Frame>, now_us: u64) -> usize {
        let Some(socket) = &self.socket else {
            return 0;
        };
        {
            let mut out = self.out.lock();
            if out.writer != Turn::Nobody || out.queue.is_closed() {
                return 0;
            }
            self.drain(&mut out.queue, frames, now_us);
            if frames.is_empty() {
                // Only throttled messages wait: the writer task keeps their time.
                let throttled = out.queue.next_due().is_some();
                drop(out);
                if throttled {
                    self.wake.notify_one();
                }
                return 0;
            }
            out.writer = Turn::Direct;
        }
        let mut taken = frames.len();
        loop {
            let queued = frames.len();
            let (bytes, result) = write_without_waiting(socket, frames);
            self.count_out(queued - frames.len(), bytes);
            let mut out = self.out.lock();
            if result.is_err() || !frames.is_empty() {
                // The writer task waits for the socket (or meets the error and ends the session).
                out.carry = std::mem::take(frames);
                out.writer = Turn::Task;
                drop(out);
                self.wake.notify_one();
                return taken;
            }
            if !out.queue.is_closed() {
                self.drain(&mut out.queue, frames, now_us);
                taken += frames.len();
            }
            if frames.is_empty() {
                out.writer = Turn::Nobody;
                // Written out: an idle connection keeps little memory.
                out.queue.shrink_idle();
                let task_has_work = !out.queue.is_empty() || out.queue.next_due().is_some();
                drop(out);
                if task_has_work {
                    self.wake.notify_one();
                }
                return taken;
            }
        }
    }

    fn count_out(&self, frames: usize, bytes: usize) {
        self.metrics.frames_out.inc_by(frames as u64);
        self.metrics.bytes_out.inc_by(bytes as u64);
    }

    /// Runs the writer task on the connection's own socket (see [`Connection::direct`]).
    pub async fn run_direct_writer(&self, grace: Duration) -> io::Result<()> {
        let socket = self
            .socket
            .as_ref()
            .expect("a direct connection has a socket");
        self.run_writer(SharedWrite(socket.stream()), grace).await
    }

    /// Writes queued frames to `io` until the close frame has gone out (or the socket fails).
    /// `grace` bounds how long a close may wait on a client that does not read.
    pub async fn run_writer<W: AsyncWrite + Unpin>(
        &self,
        mut io: W,
        grace: Duration,
    ) -> io::Result<()> {
        let mut batch = Vec::new();
        loop {
            let closed = self.next_frames(&mut batch).await;
            if batch.is_empty() {
                break;
            }
            let (count, bytes) = (batch.len(), bytes_of(&batch));
            {
                let write = write_frames(&mut io, &mut batch);
                tokio::pin!(write);
                if closed {
                    bounded(grace, &mut write).await?;
                } else {
                    tokio::select! {
                        r = &mut write => r?,
                        _ = self.cut.notified() => bounded(grace, &mut write).await?,
                    }
                }
            }
            self.count_out(count, bytes);
        }
        let _ = tokio::time::timeout(grace, io.shutdown()).await;
        Ok(())
    }
}

impl Connection {
    /// Waits until frames may go, moves them into `batch` (the writer task now holds the
    /// socket), and says whether the queue is closed (then nothing follows what was moved).
    /// Returns with an empty batch only once closed.
    pub async fn next_frames(&self, batch: &mut Vec<Frame>) -> bool {
        loop {
            let (closed, next_due) = {
                let mut out = self.out.lock();
                match out.writer {
                    // It hands over or finishes, and wakes us if anything is left for us.
                    Turn::Direct => (false, None),
                    Turn::Task if !out.carry.is_empty() => {
                        // A direct write's leftovers; the close frame is never among them.
                        std::mem::swap(batch, &mut out.carry);
                        return false;
                    }
                    Turn::Nobody | Turn::Task => {
                        self.drain(&mut out.queue, batch, now_us());
                        if batch.is_empty() {
                            // About to wait: an idle connection keeps little memory.
                            out.queue.shrink_idle();
                            out.writer = Turn::Nobody;
                        } else {
                            out.writer = Turn::Task;
                        }
                        (out.queue.is_closed(), out.queue.next_due())
                    }
                }
            };
            if !batch.is_empty() || closed {
                return closed;
            }
            if batch.capacity() > IDLE_CAPACITY {
                batch.shrink_to(IDLE_CAPACITY);
            }
            match next_due {
                // A throttled (`conflate` with `max_rate`) message waits for its time.
                Some(due) => {
                    let wait = Duration::from_micros(due.saturating_sub(now_us()));
                    let _ = tokio::time::timeout(wait, self.wake.notified()).await;
                }
                None => self.wake.notified().await,
            }
        }
    }
}

/// Slices per vectored write: IOV_MAX, the most Linux takes in one system call, so that a
/// subscribe burst's hundred replies, or a hold's 64 messages for one connection, leave in
/// one system call (on loopback, one TCP segment). The direct write's array of them is 16 KiB
/// of stack.
const MAX_SLICES: usize = 1024;

/// Writes as much of `frames` as the socket takes now, removing what was written (a partly
/// written frame keeps its unsent bytes). Stops without error when the socket is full.
/// Returns the bytes written, and the error if the socket failed.
fn write_without_waiting(
    socket: &DirectSocket,
    frames: &mut Vec<Frame>,
) -> (usize, io::Result<()>) {
    // The array's unused room is left uninitialised: filling it first would cost more than
    // the rest of this function, which usually writes one frame.
    let mut sent = 0;
    let mut bytes = 0;
    let result = loop {
        if sent == frames.len() {
            break Ok(());
        }
        let written = {
            let mut room = [MaybeUninit::<IoSlice>::uninit(); MAX_SLICES];
            let mut n = 0;
            for (slot, slice) in room.iter_mut().zip(io_slices(&frames[sent..])) {
                slot.write(slice);
                n += 1;
            }
            if n == 0 {
                // What is left is empty frames (a byte stream's close): nothing to send.
                sent = frames.len();
                break Ok(());
            }
            // SAFETY: the first `n` slots were written just above.
            let slices = unsafe { std::slice::from_raw_parts(room.as_ptr().cast::<IoSlice>(), n) };
            socket.send(slices)
        };
        match written {
            Ok(0) => break Err(io::ErrorKind::WriteZero.into()),
            Ok(written) => {
                bytes += written;
                sent += consume(&mut frames[sent..], written);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break Ok(()),
            Err(e) => break Err(e),
        }
    };
    // Each written frame is dropped once, here: a direct write usually sends them all.
    if sent == frames.len() {
        frames.clear();
    } else {
        frames.drain(..sent);
    }
    (bytes, result)
}

/// The non-empty parts of `frames`, in order, for a vectored write.
fn io_slices(frames: &[Frame]) -> impl Iterator<Item = IoSlice<'_>> {
    frames
        .iter()
        .flat_map(|f| [&f.head, &f.body])
        .filter(|part| !part.is_empty())
        .map(|part| IoSlice::new(part))
}

fn bytes_of(frames: &[Frame]) -> usize {
    frames.iter().map(Frame::len).sum()
}

/// Takes `written` bytes off the front of `frames`: counts the frames sent whole, and a partly
/// sent one keeps its unsent bytes. Returns the count, for the caller to remove them all at
/// once when it is done: removing them after every write would move the rest of a long batch
/// each time.
fn consume(frames: &mut [Frame], mut written: usize) -> usize {
    let mut done = 0;
    for frame in frames.iter_mut() {
        let len = frame.len();
        if written >= len {
            written -= len;
            done += 1;
            continue;
        }
        let from_head = written.min(frame.head.len());
        frame.head.advance(from_head);
        frame.body.advance(written - from_head);
        break;
    }
    done
}

async fn bounded(
    grace: Duration,
    write: impl std::future::Future<Output = io::Result<()>>,
) -> io::Result<()> {
    tokio::time::timeout(grace, write)
        .await
        .unwrap_or_else(|_| {
            Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "client did not read its close frame",
            ))
        })
}

/// Writes every frame with as few vectored writes as the socket allows, removing each from
/// `frames` as it goes.
pub(crate) async fn write_frames<W: AsyncWrite + Unpin>(
    io: &mut W,
    frames: &mut Vec<Frame>,
) -> io::Result<()> {
    let mut sent = 0;
    let result = loop {
        if sent == frames.len() {
            break Ok(());
        }
        let written = {
            let slices: Vec<IoSlice> = io_slices(&frames[sent..]).take(MAX_SLICES).collect();
            if slices.is_empty() {
                // What is left is empty frames (a byte stream's close): nothing to send.
                sent = frames.len();
                break Ok(());
            }
            io.write_vectored(&slices).await
        };
        match written {
            Ok(0) => break Err(io::ErrorKind::WriteZero.into()),
            Ok(written) => {
                let done = consume(&mut frames[sent..], written);
                // Released now rather than when the batch is done: the rest of a long batch
                // may wait on a slow reader, and what was written need not wait with it.
                frames[sent..sent + done].fill(Frame::default());
                sent += done;
            }
            Err(e) => break Err(e),
        }
    };
    frames.drain(..sent);
    result
}

thread_local! {
    /// The list of the [`Pending::collect`](crate::flush::Pending::collect) running on this
    /// thread, if one is: a connection given its first frame notes itself there rather than
    /// waking its writer. A bare pointer in a `Cell`, so that noting, once per delivery, reads
    /// the thread's slot with one load: a slot holding the list itself needs a destructor, and
    /// its every access checks the destructor's registration and borrows a `RefCell`.
    static COLLECTING: Cell<*mut Vec<Arc<Connection>>> = const { Cell::new(ptr::null_mut()) };
}

/// Whether a collecting task is running on this thread.
pub(crate) fn collecting() -> bool {
    !COLLECTING.get().is_null()
}

/// Runs `work` collecting on this thread, into `list`: the connections given a first frame
/// meanwhile are pushed onto it. `work` must be synchronous (the list is the thread's).
pub(crate) fn collect_into<R>(list: &mut Vec<Arc<Connection>>, work: impl FnOnce() -> R) -> R {
    /// Ends collecting when `work` returns, or panics: a list left behind would swallow later
    /// wake-ups, and outlive its owner.
    struct Done;
    impl Drop for Done {
        fn drop(&mut self) {
            COLLECTING.set(ptr::null_mut());
        }
    }
    COLLECTING.set(list);
    let _done = Done;
    work()
}

/// Notes `conn` for the collecting task on this thread; false when none is collecting (then
/// the caller wakes the connection's writer).
#[inline]
fn defer(conn: impl FnOnce() -> Option<Arc<Connection>>) -> bool {
    let list = COLLECTING.get();
    if list.is_null() {
        return false;
    }
    let Some(conn) = conn() else {
        return false;
    };
    // SAFETY: a pointer in the slot is the list lent to `collect_into`, which outlives the
    // `work` running on this thread, and is reset before `collect_into` returns or unwinds;
    // nothing else uses the list meanwhile (`collect_into` holds its only reference, unused
    // until `work` is done), and this use ends before anything else runs.
    unsafe { (*list).push(conn) };
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    /// A writer that accepts at most `step` bytes per call, to exercise partial writes, and
    /// fails once it holds `limit` bytes.
    struct Trickle {
        out: Vec<u8>,
        step: usize,
        limit: usize,
    }

    impl Trickle {
        fn new(step: usize) -> Self {
            Trickle {
                out: Vec::new(),
                step,
                limit: usize::MAX,
            }
        }
    }

    impl AsyncWrite for Trickle {
        fn poll_write(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &[u8],
        ) -> std::task::Poll<io::Result<usize>> {
            let room = self.limit - self.out.len();
            if room == 0 {
                return std::task::Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
            }
            let n = buf.len().min(self.step).min(room);
            self.out.extend_from_slice(&buf[..n]);
            std::task::Poll::Ready(Ok(n))
        }
        fn poll_flush(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
        fn poll_shutdown(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
    }

    /// `n` frames of different lengths, each numbered in its head; and all their bytes in order.
    fn numbered_frames(n: u32, longest_body: u32) -> (Vec<Frame>, Vec<u8>) {
        let frames: Vec<Frame> = (0..n)
            .map(|i| Frame {
                head: Bytes::from(i.to_be_bytes().to_vec()),
                body: Bytes::from(vec![i as u8; (i % (longest_body + 1)) as usize]),
            })
            .collect();
        let bytes = frames.iter().flat_map(|f| f.to_vec()).collect();
        (frames, bytes)
    }

    #[tokio::test]
    async fn partial_writes_deliver_every_byte_in_order() {
        let (frames, expected) = numbered_frames(3000, 4);
        for step in [1, 3, 7, 1000, usize::MAX] {
            let mut sink = Trickle::new(step);
            let mut queued = frames.clone();
            write_frames(&mut sink, &mut queued).await.unwrap();
            assert_eq!(sink.out, expected, "step {step}");
            assert!(
                queued.is_empty(),
                "step {step}: {} frames left",
                queued.len()
            );
        }
    }

    /// A direct socket on loopback (in the current runtime), and its blocking peer.
    fn direct_socket() -> (DirectSocket, std::net::TcpStream) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let peer = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (ours, _) = listener.accept().unwrap();
        ours.set_nonblocking(true).unwrap();
        let (_read, write) = tokio::net::TcpStream::from_std(ours).unwrap().into_split();
        (DirectSocket::new(write), peer)
    }

    /// A direct write of many frames (bodies empty and not, so some frames give one slice and
    /// some two) takes several system calls of at most `MAX_SLICES` slices each; a real socket
    /// receives every byte, in order, and the write counts them all.
    #[tokio::test]
    async fn a_direct_write_sends_every_frame_in_order() {
        let (socket, mut peer) = direct_socket();
        // 3,500 slices: four system calls.
        let (frames, expected) = numbered_frames(2000, 3);
        let mut queued = frames.clone();
        let (bytes, result) = write_without_waiting(&socket, &mut queued);
        result.unwrap();
        assert!(queued.is_empty(), "{} frames left", queued.len());
        assert_eq!(bytes, expected.len(), "the bytes written, as counted");
        let mut got = vec![0; expected.len()];
        std::io::Read::read_exact(&mut peer, &mut got).unwrap();
        assert_eq!(got, expected);
    }

    /// A direct write of several slices goes out gathered into one send while they come to at
    /// most `GATHERED` bytes, and by `sendmsg` beyond: either way the peer receives every byte,
    /// in order, and the write counts them all. One frame of one slice, too.
    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn a_direct_write_arrives_whole_gathered_or_not() {
        use crate::socket::GATHERED;
        // (frames, longest body, whether the bytes fit GATHERED)
        for (n, longest_body, gathered) in [
            (1, 0, true),
            (2, 40, true),
            (150, 80, true),
            (200, 200, false),
        ] {
            let (socket, mut peer) = direct_socket();
            let (frames, expected) = numbered_frames(n, longest_body);
            assert_eq!(
                expected.len() <= GATHERED,
                gathered,
                "{n} frames: {} bytes",
                expected.len()
            );
            let mut queued = frames.clone();
            let (bytes, result) = write_without_waiting(&socket, &mut queued);
            result.unwrap();
            assert!(queued.is_empty(), "{n} frames: {} left", queued.len());
            assert_eq!(
                bytes,
                expected.len(),
                "{n} frames: the bytes written, as counted"
            );
            let mut got = vec![0; expected.len()];
            std::io::Read::read_exact(&mut peer, &mut got).unwrap();
            assert_eq!(got, expected, "{n} frames");
        }
    }

    /// The TCP segments `socket` has sent with data.
    #[cfg(target_os = "linux")]
    fn data_segments_out(socket: &DirectSocket) -> u32 {
        use std::os::fd::AsRawFd;
        // SAFETY: `tcp_info` is plain data; the kernel fills at most `len` bytes of it.
        let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
        let fd = socket.stream().as_raw_fd();
        // SAFETY: `info` and `len` outlive the call and `len` is `info`'s size.
        let r = unsafe {
            libc::getsockopt(
                fd,
                libc::IPPROTO_TCP,
                libc::TCP_INFO,
                (&raw mut info).cast(),
                &mut len,
            )
        };
        assert_eq!(r, 0, "TCP_INFO: {}", io::Error::last_os_error());
        info.tcpi_data_segs_out
    }

    /// A burst of a few hundred small frames (a subscribe burst's replies) leaves in one
    /// system call: on loopback, one segment.
    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn a_burst_of_small_frames_leaves_in_one_segment() {
        let (socket, mut peer) = direct_socket();
        // 300 frames, 525 slices.
        let (frames, expected) = numbered_frames(300, 3);
        let before = data_segments_out(&socket);
        let mut queued = frames.clone();
        let (bytes, result) = write_without_waiting(&socket, &mut queued);
        result.unwrap();
        assert!(queued.is_empty(), "{} frames left", queued.len());
        assert_eq!(bytes, expected.len());
        let mut got = vec![0; expected.len()];
        std::io::Read::read_exact(&mut peer, &mut got).unwrap();
        assert_eq!(got, expected);
        assert_eq!(
            data_segments_out(&socket) - before,
            1,
            "segments for one burst"
        );
    }

    #[tokio::test]
    async fn a_failed_write_leaves_exactly_the_unsent_bytes() {
        let (frames, expected) = numbered_frames(2000, 2);
        for limit in [1, 4, 5, 4099, expected.len() - 1] {
            let mut sink = Trickle {
                limit,
                ..Trickle::new(1000)
            };
            let mut queued = frames.clone();
            let result = write_frames(&mut sink, &mut queued).await;
            assert_eq!(result.unwrap_err().kind(), io::ErrorKind::BrokenPipe);
            let left: Vec<u8> = queued.iter().flat_map(|f| f.to_vec()).collect();
            assert_eq!(sink.out, expected[..limit], "limit {limit}");
            assert_eq!(left, expected[limit..], "limit {limit}");
            assert!(
                queued.first().is_some_and(|f| !f.is_empty()),
                "limit {limit}"
            );
        }
    }

    #[tokio::test]
    async fn writer_sends_queue_then_close_and_stops() {
        let conn = Connection::new(QueueLimits::both(1 << 20), Arc::new(Metrics::default()));
        conn.reply(&Reply::Pong { id: None });
        conn.close(Disconnect::Shutdown, 1001, "server shutting down");
        conn.reply(&Reply::Pong { id: Some(1.into()) });
        let mut sink = Trickle::new(2);
        conn.run_writer(&mut sink, Duration::from_secs(1))
            .await
            .unwrap();
        let mut expected = wire::encode_reply(&Reply::Pong { id: None }).to_vec();
        expected.extend(wire::encode_close(1001, "server shutting down").to_vec());
        assert_eq!(sink.out, expected);
        assert_eq!(conn.close_reason(), Some(Disconnect::Shutdown));
    }

    #[tokio::test]
    async fn overflow_closes_as_slow_consumer_without_the_backlog() {
        let conn = Connection::new(QueueLimits::both(10), Arc::new(Metrics::default()));
        for _ in 0..3 {
            conn.reply(&Reply::Pong { id: None }); // 15 bytes: the second overflows
        }
        assert!(conn.is_closing());
        let mut sink = Trickle::new(usize::MAX);
        conn.run_writer(&mut sink, Duration::from_secs(1))
            .await
            .unwrap();
        assert_eq!(&sink.out[..2], &[0x88, sink.out.len() as u8 - 2]);
        assert_eq!(u16::from_be_bytes([sink.out[2], sink.out[3]]), 4008);
        assert!(String::from_utf8_lossy(&sink.out[4..]).starts_with("slow consumer"));
    }
}
