//! Direct writes: frames queued by a publish leave from the publishing task itself, once its
//! input is drained, instead of waking each subscriber's writer task.
//!
//! Waking a writer task per delivery costs more than the delivery (a scheduler round trip, the
//! session future polled, its timers and reader polled too, the waiter re-registered;
//! docs/performance.md). So while a task does synchronous engine work
//! inside [`Pending::collect`], a connection that receives its first queued frame is noted here
//! rather than woken, and [`Pending::flush`] later writes each noted connection's queue with one
//! non-blocking vectored write: when the input is drained, or, for a task that is behind, once
//! a hold of deliveries is full ([`Pending::flush_if_full`]). A socket that does not take
//! everything hands the rest to its writer task, which waits for the socket; so does a
//! connection that cannot be written directly (TLS). This is uWebSockets' cork-and-flush, on
//! tokio. A long list is written a chunk at a time, whether the input is drained
//! ([`Pending::flush_chunk`]) or a hold is full ([`Pending::flush_if_full`]), the reader
//! looking at its input between chunks, so what arrives meanwhile is read without waiting for
//! every write and joins the queues still waiting.

use crate::clock::now_us;
use crate::connection::{self, Connection};
use herald_core::codec::Frame;
use herald_core::prefetch::prefetch;
use std::cell::RefCell;
use std::sync::Arc;

thread_local! {
    /// The frames of one connection on their way to its socket: scratch for every flush on
    /// this thread, rather than room kept by every session (512 bytes each).
    static FRAMES: RefCell<Vec<Frame>> = const { RefCell::new(Vec::new()) };
}

/// The most frames a thread's [`FRAMES`] keeps room for after a flush.
const FRAMES_KEPT: usize = 1024;

/// How many deliveries (or connections) may wait before [`Pending::flush_if_full`] writes
/// them, at first: about 0.3 ms of engine work (0.2–0.5 µs each), held back from the first
/// connection. Each write costs several µs (on loopback the kernel charges the receiver's TCP
/// work to the writer), so when a backlog of publishes reaches the same subscribers again and
/// again (a share's price to its 40 subscribers, 25 orders in a row) they take them in one
/// write each rather than 25 (docs/performance.md).
const FLUSH_AFTER: usize = 1024;

/// How many times the hold may double while the input stays behind: up to 1,048,576
/// deliveries, so that up to 16,384 subscribers it is [`ENOUGH_PER_CONNECTION`] that ends the
/// growth, not this cap. Among 9,000 subscribers receiving alike, each gets one delivery in
/// 9,000: a hold of 1,024 gives most of them one message, nothing to share a write with; a
/// hold of 32,768 gives each about four, and a reader that far behind stays behind, its writes
/// costing more than its input brings. Growing until each write carries enough, the reader's
/// cost per delivery falls as its backlog grows, until it catches up (as a loop that reads all
/// its input before writing does). Only a reader already behind gets there.
const MAX_DOUBLINGS: u32 = 10;

/// Deliveries per noted connection past which holding saves no more writes: a write of 64
/// small frames already spreads its cost over them, and the first of them has waited for the
/// rest: without it, a burst to one subscriber would leave in one write at its end, and the
/// burst's first messages would wait for its last.
const ENOUGH_PER_CONNECTION: usize = 64;

/// With several worker threads, how many connections a flush writes itself; the rest go to
/// their writer tasks, which idle workers steal.
const DIRECT_AT_MOST: usize = 32;

/// Connections written between two looks at the input ([`Pending::flush_chunk`],
/// [`Pending::flush_if_full`]): about
/// 0.2 ms of writes here (6–7 µs each on loopback), against one `epoll_wait` and a task switch
/// per look.
const CHUNK: usize = 32;

/// Connections with frames to write once the current batch of work is done.
#[derive(Default)]
pub struct Pending {
    conns: Vec<Arc<Connection>>,
    /// Deliveries noted and not yet taken by a write (see [`Pending::delivered`]).
    held: usize,
    /// The hold is `FLUSH_AFTER << doublings`: one more each time a hold's worth has been
    /// written while the input stayed behind, none once it is drained (see
    /// [`Pending::drained`]).
    doublings: u32,
    /// Deliveries [`Pending::flush_if_full`] wrote since the hold last doubled or the input
    /// was last drained.
    written_behind: usize,
    /// Where the next flush starts in its list, so that no subscriber of a topic is always
    /// written last (the seed 003 router randomised its fan-out order for the same reason).
    turn: usize,
}

impl Pending {
    /// Runs synchronous `work` (engine calls), noting the connections it gives a first frame.
    /// `work` must not block: the list is per thread. Nested calls note into the outer one.
    pub fn collect<R>(&mut self, work: impl FnOnce() -> R) -> R {
        if connection::collecting() {
            return work();
        }
        connection::collect_into(&mut self.conns, work)
    }

    /// Counts `n` deliveries made under [`Pending::collect`] toward the hold.
    pub fn delivered(&mut self, n: usize) {
        self.held += n;
    }

    /// Called after each request while the input is behind: writes once the hold is full,
    /// [`FLUSH_AFTER`] deliveries or connections, doubled each time a hold's worth has been
    /// written before the input is drained ([`MAX_DOUBLINGS`] at most). Idle, a reader flushes
    /// after every message anyway (its input is drained); behind, the longer it stays behind,
    /// the more of what its subscribers receive leaves in one write each, and the fewer writes
    /// it spends per delivery to catch up. A hold also ends once its connections have
    /// [`ENOUGH_PER_CONNECTION`] deliveries each on average: then every write already carries
    /// many, and longer only delays the first.
    ///
    /// On a single-worker runtime it writes one [`CHUNK`] (the connections noted first) and
    /// returns true: the caller yields and calls again until it returns false, that is until
    /// less than a hold is left, and then reads on. So the reader takes its input in between
    /// rather than after every noted connection is written: with thousands of subscribers the
    /// whole list is milliseconds of writes without a look at the input, a wait that becomes
    /// the slowest deliveries' first leg (docs/performance.md). With several workers the list
    /// goes whole, as in [`Pending::flush`], and it returns false.
    pub fn flush_if_full(&mut self) -> bool {
        let hold = FLUSH_AFTER << self.doublings;
        let full = self.held.max(self.conns.len()) >= hold;
        let enough =
            !self.conns.is_empty() && self.held >= ENOUGH_PER_CONNECTION * self.conns.len();
        if !full && !enough {
            return false;
        }
        let Some(written) = self.write_chunk() else {
            if full {
                self.doublings = (self.doublings + 1).min(MAX_DOUBLINGS);
            }
            return false;
        };
        self.written_behind += written;
        if self.written_behind >= hold {
            self.doublings = (self.doublings + 1).min(MAX_DOUBLINGS);
            self.written_behind = 0;
        }
        true
    }

    /// The input is drained (the next read would wait): writes what is held and goes back to
    /// the shortest hold.
    pub fn drained(&mut self) {
        self.flush();
        self.caught_up();
        // A session keeps its `Pending` for life: an idle one should not keep a burst's room.
        if self.conns.capacity() > 4 * DIRECT_AT_MOST {
            self.conns.shrink_to(DIRECT_AT_MOST);
        }
    }

    /// Writes every noted connection's queue now, as far as its socket takes it. A long list
    /// on a runtime with several worker threads is shared out instead: past the first
    /// [`DIRECT_AT_MOST`], the connections go to one task of their own that writes them in
    /// turn, which an idle worker steals, so one publisher's large fan-out does not keep all
    /// its writes on one core. One task for the lot, not each connection's writer task woken:
    /// a wake-up per connection (the scheduler, the session's future polled) costs more than
    /// its write.
    pub fn flush(&mut self) {
        self.held = 0;
        let direct = if self.conns.len() > DIRECT_AT_MOST && several_workers() {
            DIRECT_AT_MOST
        } else {
            usize::MAX
        };
        self.write_first(self.conns.len(), direct);
    }

    /// Writes the [`CHUNK`] connections noted first and returns whether more wait: the reader
    /// looks at its input between chunks, so a publish arriving during a long flush is read
    /// within a chunk's writes rather than after all of them, and its frames join the queues
    /// still waiting, in the order they were noted. On a runtime with several workers the
    /// whole list goes at once, as in [`Pending::flush`] (the writers share it out).
    ///
    /// It is called only with the input drained, so the hold goes back to the shortest, as in
    /// [`Pending::drained`]: a hold kept until the whole list is written would grow while
    /// readers fall behind, and the tail latency with it.
    pub fn flush_chunk(&mut self) -> bool {
        self.caught_up();
        self.write_chunk().is_some() && !self.conns.is_empty()
    }

    /// The input was drained: the hold is back to the shortest, and what was written while
    /// behind starts over.
    fn caught_up(&mut self) {
        self.doublings = 0;
        self.written_behind = 0;
    }

    /// Writes the [`CHUNK`] connections noted first and counts what they took off the hold:
    /// the frames written. On a runtime with several workers it flushes the whole list
    /// instead and returns `None`. A short list is written whole either way; the runtime is
    /// asked only about a long one (as in `flush`: a handle's clone and drop per publish
    /// otherwise).
    fn write_chunk(&mut self) -> Option<usize> {
        if self.conns.len() > DIRECT_AT_MOST && several_workers() {
            self.flush();
            return None;
        }
        let written = self.write_first(CHUNK, usize::MAX);
        // Frames left to a writer task (its connection busy) are not counted, so the count
        // may overstate what is held, which only ends a hold sooner; an empty list holds
        // nothing whatever the count says.
        self.held = match self.conns.is_empty() {
            true => 0,
            false => self.held.saturating_sub(written),
        };
        Some(written)
    }

    /// Writes (the first `direct` of them; hands the others to a task that writes them) the
    /// first `n` noted connections and takes them off the list; the order within them starts at
    /// a different place each time, so that no subscriber of a topic is always written last.
    /// Returns the frames written (or left to a writer by a short write) directly.
    fn write_first(&mut self, n: usize, direct: usize) -> usize {
        let n = n.min(self.conns.len());
        if n == 0 {
            return 0;
        }
        let start = self.turn % n;
        self.turn = self.turn.wrapping_add(1);
        self.conns[..n].rotate_left(start);
        let now = now_us();
        // Taken out of the thread's slot for the loop (a thread being torn down has none).
        let mut frames = FRAMES.try_with(|f| f.take()).unwrap_or_default();
        let mut written = 0;
        let direct = direct.min(n);
        for i in 0..direct {
            // The next connection's state is asked for while this one's write is under way.
            if let Some(next) = self.conns.get(i + 1) {
                prefetch(Arc::as_ptr(next), std::mem::size_of::<Connection>());
            }
            written += self.conns[i].write_now(&mut frames, now); // leaves `frames` empty
        }
        if direct < n {
            tokio::spawn(write_each(self.conns.drain(direct..n).collect()));
        }
        self.conns.drain(..direct);
        frames.shrink_to(FRAMES_KEPT);
        let _ = FRAMES.try_with(|f| f.replace(frames));
        written
    }
}

/// Writes each connection's queue, as far as its socket takes it: the part of a flush handed
/// to another worker ([`Pending::flush`]).
async fn write_each(conns: Vec<Arc<Connection>>) {
    let now = now_us();
    let mut frames = Vec::new();
    for conn in &conns {
        conn.write_now(&mut frames, now);
    }
}

impl Drop for Pending {
    /// A task that stops with work noted still writes it (or hands it to the writers).
    fn drop(&mut self) {
        self.flush();
    }
}

fn several_workers() -> bool {
    tokio::runtime::Handle::try_current().is_ok_and(|rt| rt.metrics().num_workers() > 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connection::QueueLimits;
    use crate::metrics::Metrics;
    use herald_core::engine::Outbox;
    use herald_core::reply::Reply;
    use std::io::{ErrorKind, Read};
    use std::net::{TcpListener, TcpStream};
    use std::time::{Duration, Instant};

    /// `n` direct connections on real loopback sockets, each with its (non-blocking) peer.
    fn connections(n: usize) -> Vec<(Arc<Connection>, TcpStream)> {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let metrics = Arc::new(Metrics::default());
        (0..n)
            .map(|_| {
                let peer = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
                peer.set_nonblocking(true).unwrap();
                let (ours, _) = listener.accept().unwrap();
                ours.set_nonblocking(true).unwrap();
                let (_read, write) = tokio::net::TcpStream::from_std(ours).unwrap().into_split();
                (
                    Connection::direct(write, QueueLimits::both(1 << 20), metrics.clone()),
                    peer,
                )
            })
            .collect()
    }

    /// Which peers have received nothing, once the others have (the flush's writes are
    /// synchronous, but loopback may hand them over a moment later on a loaded machine).
    fn unwritten(conns: &[(Arc<Connection>, TcpStream)], written: usize) -> Vec<usize> {
        let mut got = vec![false; conns.len()];
        let deadline = Instant::now() + Duration::from_secs(10);
        while got.iter().filter(|&&g| g).count() < written && Instant::now() < deadline {
            for (i, (_, peer)) in conns.iter().enumerate() {
                match (&mut &*peer).read(&mut [0u8; 64]) {
                    Ok(n) => got[i] |= n > 0,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                    Err(e) => panic!("peer {i}: {e}"),
                }
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        (0..conns.len()).filter(|&i| !got[i]).collect()
    }

    /// Blocks `n` worker threads of the current runtime until the returned senders are dropped.
    fn occupy_workers(n: usize) -> Vec<std::sync::mpsc::Sender<()>> {
        let (started, running) = std::sync::mpsc::channel();
        let release = (0..n)
            .map(|_| {
                let (release, released) = std::sync::mpsc::channel::<()>();
                let started = started.clone();
                tokio::spawn(async move {
                    started.send(()).unwrap();
                    let _ = released.recv(); // until its sender is dropped
                });
                release
            })
            .collect();
        for _ in 0..n {
            running.recv_timeout(Duration::from_secs(10)).unwrap();
        }
        release
    }

    /// A small reply, `pong`.
    fn hi() -> Reply {
        Reply::Pong { id: None }
    }

    /// Its length on the wire.
    fn hi_len() -> usize {
        herald_core::wire::encode_reply(&hi()).len()
    }

    /// Nothing has reached any peer (the flush's writes are synchronous: had there been one,
    /// its bytes would be there after the pause).
    fn nothing_arrived(conns: &[(Arc<Connection>, TcpStream)], held: usize) {
        std::thread::sleep(Duration::from_millis(50));
        for (i, (_, peer)) in conns.iter().enumerate() {
            let read = (&mut &*peer).read(&mut [0u8; 64]);
            assert!(
                matches!(&read, Err(e) if e.kind() == ErrorKind::WouldBlock),
                "peer {i} received {read:?} while {held} deliveries were held"
            );
        }
    }

    /// Every peer receives exactly `bytes` more.
    fn each_receives(conns: &[(Arc<Connection>, TcpStream)], bytes: usize) {
        let deadline = Instant::now() + Duration::from_secs(10);
        for (i, (_, peer)) in conns.iter().enumerate() {
            let mut got = 0;
            while got < bytes && Instant::now() < deadline {
                match (&mut &*peer).read(&mut [0u8; 4096]) {
                    Ok(n) => got += n,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(1))
                    }
                    Err(e) => panic!("peer {i}: {e}"),
                }
            }
            assert_eq!(got, bytes, "peer {i} got every held frame");
        }
    }

    /// `times` publishes of [`hi`] to every connection, each counted toward the hold and
    /// followed by its check, as a reader that is behind makes them.
    fn publish_to_all(pending: &mut Pending, conns: &[(Arc<Connection>, TcpStream)], times: usize) {
        let frame = hi();
        for _ in 0..times {
            pending.collect(|| {
                for (conn, _) in conns {
                    conn.reply(&frame);
                }
            });
            pending.delivered(conns.len());
            while pending.flush_if_full() {}
        }
    }

    /// What a backlog of publishes gives the same subscribers waits until [`FLUSH_AFTER`]
    /// deliveries are held, then leaves (here a chunk's worth of connections: all of them).
    /// While the input stays behind the next hold is twice as long; once it is drained, the
    /// shortest again.
    #[tokio::test]
    async fn a_backlog_is_held_longer_while_the_input_stays_behind() {
        let conns = connections(CHUNK);
        let n = conns.len();
        let mut pending = Pending::default();
        // The first hold: one publish short of FLUSH_AFTER, then over it.
        let first = FLUSH_AFTER.div_ceil(n);
        publish_to_all(&mut pending, &conns, first - 1);
        nothing_arrived(&conns, (first - 1) * n);
        publish_to_all(&mut pending, &conns, 1);
        each_receives(&conns, first * hi_len());
        // Still behind: as many again stay held, the hold being twice as long now.
        publish_to_all(&mut pending, &conns, first);
        nothing_arrived(&conns, first * n);
        pending.drained();
        each_receives(&conns, first * hi_len());
        // Drained: back to the first hold.
        publish_to_all(&mut pending, &conns, first);
        each_receives(&conns, first * hi_len());
    }

    /// A backlog to one subscriber leaves every [`ENOUGH_PER_CONNECTION`] messages, not after
    /// a whole hold: its write already carries many, and holding longer only delays the first.
    #[tokio::test]
    async fn one_subscriber_takes_a_backlog_a_write_of_enough_at_a_time() {
        let frame = hi();
        let conns = connections(1);
        let mut pending = Pending::default();
        let mut publish = |times: usize| {
            for _ in 0..times {
                pending.collect(|| conns[0].0.reply(&frame));
                pending.delivered(1);
                while pending.flush_if_full() {}
            }
        };
        publish(ENOUGH_PER_CONNECTION - 1);
        nothing_arrived(&conns, ENOUGH_PER_CONNECTION - 1);
        publish(1);
        each_receives(&conns, ENOUGH_PER_CONNECTION * hi_len());
    }

    /// A full hold over more connections than a chunk leaves a chunk at a time, those noted
    /// first first, and only until less than a hold is left: the reader then reads on rather
    /// than write every connection first.
    #[tokio::test]
    async fn a_full_hold_leaves_a_chunk_at_a_time_until_less_than_a_hold_is_left() {
        let conns = connections(3 * CHUNK);
        let n = conns.len();
        let mut pending = Pending::default();
        let first = FLUSH_AFTER.div_ceil(n);
        publish_to_all(&mut pending, &conns, first - 1);
        nothing_arrived(&conns, (first - 1) * n);
        // The hold fills; the first chunk's deliveries take it back under.
        assert!(CHUNK * first > first * n - FLUSH_AFTER);
        publish_to_all(&mut pending, &conns, 1);
        each_receives(&conns[..CHUNK], first * hi_len());
        nothing_arrived(&conns[CHUNK..], (n - CHUNK) * first);
        // Drained, the rest leaves too.
        pending.drained();
        each_receives(&conns[CHUNK..], first * hi_len());
    }

    /// A backlog to many subscribers keeps growing while the input stays behind, until each
    /// noted connection has enough for a write; then it leaves, and nothing is lost on the
    /// way. 600 subscribers have [`ENOUGH_PER_CONNECTION`] each at 38,400 deliveries, past
    /// what five doublings of [`FLUSH_AFTER`] hold: a cap there would end the growth first.
    #[tokio::test]
    async fn a_backlog_to_many_subscribers_is_held_until_each_has_enough() {
        // Two files per connection: more than a default soft limit of 1,024.
        crate::process::raise_open_file_limit();
        let conns = connections(600);
        assert!(ENOUGH_PER_CONNECTION * conns.len() > FLUSH_AFTER << 5);
        let n = conns.len();
        let mut pending = Pending::default();
        let mut most_held = 0;
        let publishes = 5 * ENOUGH_PER_CONNECTION;
        for _ in 0..publishes {
            publish_to_all(&mut pending, &conns, 1);
            most_held = most_held.max(pending.held);
        }
        let enough = ENOUGH_PER_CONNECTION * n;
        assert!(
            most_held >= enough - n && most_held < enough + n,
            "held at most {most_held} deliveries, where {n} subscribers have enough at {enough}"
        );
        pending.drained();
        each_receives(&conns, publishes * hi_len());
    }

    /// A long flush goes [`CHUNK`] connections at a time, those noted first first. What is
    /// queued between chunks rides along to a connection still waiting, and a connection
    /// already written is noted again, behind the others.
    #[tokio::test]
    async fn a_long_flush_goes_a_chunk_at_a_time_in_the_order_noted() {
        let frame = hi();
        let conns = connections(2 * CHUNK + 5);
        let last = conns.len() - 1;
        let mut pending = Pending::default();
        pending.collect(|| {
            for (conn, _) in &conns {
                conn.reply(&frame);
            }
        });
        assert!(pending.flush_chunk(), "more than a chunk was noted");
        each_receives(&conns[..CHUNK], hi_len());
        nothing_arrived(&conns[CHUNK..], conns.len() - CHUNK);
        // Meanwhile a publish reaches the first connection (written) and the last (waiting).
        pending.collect(|| {
            conns[0].0.reply(&frame);
            conns[last].0.reply(&frame);
        });
        assert!(pending.flush_chunk());
        each_receives(&conns[CHUNK..2 * CHUNK], hi_len());
        nothing_arrived(&conns[..CHUNK], 1);
        nothing_arrived(&conns[2 * CHUNK..], conns.len() - 2 * CHUNK + 1);
        assert!(
            !pending.flush_chunk(),
            "the rest, the first connection again among them"
        );
        each_receives(&conns[2 * CHUNK..last], hi_len());
        each_receives(&conns[last..], 2 * hi_len());
        each_receives(&conns[..1], hi_len());
    }

    /// A chunked flush comes with the input drained, so it brings the hold back to the
    /// shortest, as [`Pending::drained`] does.
    #[tokio::test]
    async fn a_chunked_flush_brings_the_hold_back_to_the_shortest() {
        let conns = connections(CHUNK);
        let n = conns.len();
        let mut pending = Pending::default();
        // A hold filled before the input was drained: the next one is twice as long.
        let first = FLUSH_AFTER.div_ceil(n);
        publish_to_all(&mut pending, &conns, first);
        each_receives(&conns, first * hi_len());
        publish_to_all(&mut pending, &conns, 1);
        while pending.flush_chunk() {}
        each_receives(&conns, hi_len());
        // Back to the first hold: it leaves after `first` publishes, not `2 × first`.
        publish_to_all(&mut pending, &conns, first);
        each_receives(&conns, first * hi_len());
    }

    /// With several workers, a flush of more than [`DIRECT_AT_MOST`] connections writes the
    /// first `DIRECT_AT_MOST` in its order itself and hands the rest to a task of their own,
    /// which writes them once a worker runs it. Which connection is left to that task must
    /// change from flush to flush: a fixed order would always leave the same subscriber of a
    /// topic for last. Both workers are kept busy while the flush runs, so that the task waits
    /// and the connection it holds can be seen; let go, it writes it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_connection_written_last_changes_from_flush_to_flush() {
        let frame = hi();
        let mut pending = Pending::default();
        let mut last = vec![];
        for _ in 0..3 {
            // The same fan-out every time: connections queued in the same order.
            let conns = connections(DIRECT_AT_MOST + 1);
            let release = occupy_workers(2);
            pending.collect(|| {
                for (conn, _) in &conns {
                    conn.reply(&frame);
                }
            });
            pending.flush();
            let left = unwritten(&conns, DIRECT_AT_MOST);
            assert_eq!(
                left.len(),
                1,
                "one connection past the direct writes: {left:?}"
            );
            drop(release);
            let handed_off = &conns[left[0]..=left[0]];
            assert!(
                unwritten(handed_off, 1).is_empty(),
                "the connection handed off is written once a worker is free"
            );
            last.push(left[0]);
        }
        let mut distinct = last.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(
            distinct.len(),
            3,
            "a connection was left last twice: {last:?}"
        );
    }
}
