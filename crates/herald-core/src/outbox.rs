//! A connection's outbound queue: the frames waiting for its socket, bounded in bytes.
//!
//! Pure bookkeeping, no I/O: the network writer drains it, the engine fills it. Frames are
//! shared (refcounted), so a queued frame costs a pointer here, but the *bound* counts each
//! frame's full length: that is what a slow reader makes the server hold on its behalf.

use crate::wire::Frame;
use std::collections::VecDeque;

/// What became of a pushed frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pushed {
    /// Queued; the queue was empty before, so the writer may need waking.
    First,
    /// Queued behind others.
    Queued,
    /// The queue is over its bound: the caller applies its slow-consumer policy.
    Overflow,
    /// The queue is closed (a close frame is queued or sent): the frame was discarded.
    Closed,
}

#[derive(Debug)]
pub struct OutboundQueue {
    frames: VecDeque<Frame>,
    bytes: usize,
    limit: usize,
    closed: bool,
}

impl OutboundQueue {
    /// A queue that holds at most `limit` bytes. One frame larger than the limit is still
    /// accepted into an empty queue: the bound limits the backlog, not the message size.
    pub fn new(limit: usize) -> Self {
        OutboundQueue {
            frames: VecDeque::new(),
            bytes: 0,
            limit,
            closed: false,
        }
    }

    pub fn push(&mut self, frame: Frame) -> Pushed {
        if self.closed {
            return Pushed::Closed;
        }
        if !self.frames.is_empty() && self.bytes + frame.len() > self.limit {
            return Pushed::Overflow;
        }
        self.bytes += frame.len();
        self.frames.push_back(frame);
        if self.frames.len() == 1 {
            Pushed::First
        } else {
            Pushed::Queued
        }
    }

    /// Queues a close frame after what is already queued and accepts nothing more.
    /// With `discard_backlog` the queued frames are dropped first (a slow consumer being
    /// cut off should not wait for its backlog). Returns false if already closed.
    pub fn close(&mut self, frame: Frame, discard_backlog: bool) -> bool {
        if self.closed {
            return false;
        }
        if discard_backlog {
            self.frames.clear();
            self.bytes = 0;
        }
        self.closed = true;
        self.bytes += frame.len();
        self.frames.push_back(frame);
        true
    }

    /// Moves every queued frame into `out` (the writer sends them in one vectored write).
    pub fn drain_into(&mut self, out: &mut Vec<Frame>) {
        out.extend(self.frames.drain(..));
        self.bytes = 0;
    }

    pub fn is_closed(&self) -> bool {
        self.closed
    }

    pub fn len(&self) -> usize {
        self.frames.len()
    }

    pub fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    /// Bytes queued and not yet handed to the writer.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn frame(n: usize) -> Frame {
        Frame {
            head: Bytes::from(vec![0; n]),
            body: Bytes::new(),
        }
    }

    #[test]
    fn bounds_the_backlog_in_bytes() {
        let mut q = OutboundQueue::new(100);
        assert_eq!(q.push(frame(60)), Pushed::First);
        assert_eq!(q.push(frame(40)), Pushed::Queued);
        assert_eq!(q.push(frame(1)), Pushed::Overflow);
        assert_eq!((q.len(), q.bytes()), (2, 100));
        let mut out = Vec::new();
        q.drain_into(&mut out);
        assert_eq!((out.len(), q.bytes()), (2, 0));
        assert_eq!(q.push(frame(1)), Pushed::First);
    }

    #[test]
    fn a_single_oversized_frame_still_goes_out() {
        let mut q = OutboundQueue::new(10);
        assert_eq!(q.push(frame(1000)), Pushed::First);
        assert_eq!(q.push(frame(1)), Pushed::Overflow);
    }

    #[test]
    fn close_discards_backlog_and_refuses_more() {
        let mut q = OutboundQueue::new(100);
        q.push(frame(50));
        assert!(q.close(frame(4), true));
        assert!(!q.close(frame(4), true));
        assert_eq!(q.push(frame(1)), Pushed::Closed);
        let mut out = Vec::new();
        q.drain_into(&mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].len(), 4);
        assert!(q.is_closed());
    }

    #[test]
    fn graceful_close_keeps_backlog() {
        let mut q = OutboundQueue::new(100);
        q.push(frame(50));
        q.close(frame(4), false);
        let mut out = Vec::new();
        q.drain_into(&mut out);
        assert_eq!(out.iter().map(Frame::len).collect::<Vec<_>>(), vec![50, 4]);
    }
}
