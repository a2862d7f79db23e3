//! Direct writes: frames queued by a publish leave from the publishing task itself, once its
//! input is drained, instead of waking each subscriber's writer task.
//!
//! Waking a writer task per delivery cost more than the delivery (a scheduler round trip, the
//! session future polled, its timers and reader polled too, the waiter re-registered): at
//! 100,000 deliveries/s that was a third of a core. So while a task does synchronous engine work
//! inside [`Pending::collect`], a connection that receives its first queued frame is noted here
//! rather than woken, and [`Pending::flush`] later writes each noted connection's queue with one
//! non-blocking vectored write. A socket that does not take everything hands the rest to its
//! writer task, which waits for the socket; so does a connection that cannot be written
//! directly (TLS). This is uWebSockets' cork-and-flush, on tokio.

use crate::connection::Connection;
use crate::node::now_us;
use herald_core::prefetch::prefetch;
use herald_core::wire::Frame;
use std::cell::RefCell;
use std::sync::Arc;

thread_local! {
    /// The connections noted by the [`Pending::collect`] running on this thread, if one is.
    static COLLECTING: RefCell<Option<Vec<Arc<Connection>>>> = const { RefCell::new(None) };
    /// The frames of one connection on their way to its socket: scratch for every flush on
    /// this thread, rather than room kept by every session (512 bytes each).
    static FRAMES: RefCell<Vec<Frame>> = const { RefCell::new(Vec::new()) };
}

/// The most frames a thread's [`FRAMES`] keeps room for after a flush.
const FRAMES_KEPT: usize = 1024;

/// How many connections may wait before [`Pending::flush_if_full`] writes them.
const FLUSH_AT: usize = 32;

/// Connections with frames to write once the current batch of work is done.
#[derive(Default)]
pub struct Pending {
    conns: Vec<Arc<Connection>>,
    /// Where the next flush starts in its list, so that no subscriber of a topic is always
    /// written last (the seed 003 router randomised its fan-out order for the same reason).
    turn: usize,
}

impl Pending {
    /// Runs synchronous `work` (engine calls), noting the connections it gives a first frame.
    /// `work` must not block: the list is per thread. Nested calls note into the outer one.
    pub fn collect<R>(&mut self, work: impl FnOnce() -> R) -> R {
        let outer = COLLECTING.with(|c| c.borrow().is_some());
        if outer {
            return work();
        }
        COLLECTING.with(|c| *c.borrow_mut() = Some(std::mem::take(&mut self.conns)));
        // Restored even if `work` panics: a list left behind would swallow later wake-ups.
        let _restore = Restore(&mut self.conns);
        work()
    }

    /// Flushes once enough connections wait. Each costs a system call of several µs (on
    /// loopback the kernel charges the receiver's TCP work to the writer), so a long list would
    /// hold its first connection's frames back for milliseconds; a short one still lets a
    /// connection that gets several messages in a burst take them in one write.
    pub fn flush_if_full(&mut self) {
        if self.conns.len() >= FLUSH_AT {
            self.flush();
        }
    }

    /// Writes every noted connection's queue now, as far as its socket takes it. A long list
    /// on a runtime with several worker threads is shared out instead: past the first
    /// [`FLUSH_AT`], connections are handed to their writer tasks, which idle workers steal, so
    /// one publisher's large fan-out does not keep all its writes on one core.
    pub fn flush(&mut self) {
        if self.conns.is_empty() {
            return;
        }
        let direct = if self.conns.len() > FLUSH_AT && several_workers() {
            FLUSH_AT
        } else {
            usize::MAX
        };
        let start = self.turn % self.conns.len();
        self.turn = self.turn.wrapping_add(1);
        self.conns.rotate_left(start);
        let now = now_us();
        // Taken out of the thread's slot for the loop (a thread being torn down has none).
        let mut frames = FRAMES.try_with(|f| f.take()).unwrap_or_default();
        for i in 0..self.conns.len() {
            // The next connection's state is asked for while this one's write is under way.
            if let Some(next) = self.conns.get(i + 1) {
                prefetch(Arc::as_ptr(next), std::mem::size_of::<Connection>());
            }
            let conn = &self.conns[i];
            if i < direct {
                conn.write_now(&mut frames, now); // leaves it empty
            } else {
                conn.wake_writer();
            }
        }
        self.conns.clear();
        frames.shrink_to(FRAMES_KEPT);
        let _ = FRAMES.try_with(|f| f.replace(frames));
        // A session keeps its `Pending` for life: an idle one should not keep a burst's room.
        if self.conns.capacity() > 4 * FLUSH_AT {
            self.conns.shrink_to(FLUSH_AT);
        }
    }
}

/// Takes the thread's list back into the [`Pending`] that lent it.
struct Restore<'a>(&'a mut Vec<Arc<Connection>>);

impl Drop for Restore<'_> {
    fn drop(&mut self) {
        *self.0 = COLLECTING
            .with(|c| c.borrow_mut().take())
            .unwrap_or_default();
    }
}

impl Drop for Pending {
    /// A task that stops with work noted still writes it (or hands it to the writers).
    fn drop(&mut self) {
        self.flush();
    }
}

/// Notes `conn` for the collecting task on this thread; false when none is collecting (then
/// the caller wakes the connection's writer).
pub(crate) fn defer(conn: impl FnOnce() -> Option<Arc<Connection>>) -> bool {
    COLLECTING.with(|c| match c.borrow_mut().as_mut() {
        Some(list) => match conn() {
            Some(conn) => {
                list.push(conn);
                true
            }
            None => false,
        },
        None => false,
    })
}

fn several_workers() -> bool {
    tokio::runtime::Handle::try_current().is_ok_and(|rt| rt.metrics().num_workers() > 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;
    use bytes::Bytes;
    use herald_core::engine::Outbox;
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
                (Connection::direct(write, 1 << 20, metrics.clone()), peer)
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

    /// With several workers, a flush of more than [`FLUSH_AT`] connections writes the first
    /// `FLUSH_AT` in its order itself and hands the rest to their writer tasks (none runs
    /// here, so those peers receive nothing). Which connection that is must change from flush
    /// to flush: a fixed order would always leave the same subscriber of a topic for last.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_connection_written_last_changes_from_flush_to_flush() {
        let frame = Frame {
            head: Bytes::from_static(b"\x81\x02"),
            body: Bytes::from_static(b"hi"),
        };
        let mut pending = Pending::default();
        let mut last = vec![];
        for _ in 0..3 {
            // The same fan-out every time: connections queued in the same order.
            let conns = connections(FLUSH_AT + 1);
            pending.collect(|| {
                for (conn, _) in &conns {
                    conn.send(&frame);
                }
            });
            pending.flush();
            let left = unwritten(&conns, FLUSH_AT);
            assert_eq!(
                left.len(),
                1,
                "one connection past the direct writes: {left:?}"
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
