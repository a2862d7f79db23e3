//! A session's incoming WebSocket frames: reads the socket and hands each frame the client sent
//! to the session, decoded by [`herald_core::wire::client_frames`].
//!
//! The read buffer exists only while there is something in it: it is released when a read is
//! used up, and a plain TCP socket is read into a new one only once it is readable. An idle
//! connection, most of the thousands a server holds, so costs no buffer at all (fastwebsockets
//! kept 8 KiB per connection for its whole life, the largest part of an idle connection).

use crate::limits::{Sockets, PARTIAL_FREE_BYTES};
use crate::socket::SocketRead;
use bytes::{Buf, BytesMut};
use herald_core::wire::client_frames::{Decoder, FrameError, Inbound};
use std::io;
use std::sync::Arc;

/// The least a read asks for: under load, one read takes in many frames.
const READ_CHUNK: usize = crate::socket::SCRATCH_BYTES;

/// Why a session can read no more frames.
#[derive(Debug)]
pub enum ReadError {
    /// The client broke the protocol.
    Frame(FrameError),
    /// The stream ended (in the middle of a frame, or before any).
    Ended,
    Io(io::Error),
    /// The partly received message would take the server past `limits.max_partial_bytes`.
    Busy,
}

impl From<FrameError> for ReadError {
    fn from(e: FrameError) -> Self {
        ReadError::Frame(e)
    }
}

impl From<io::Error> for ReadError {
    fn from(e: io::Error) -> Self {
        ReadError::Io(e)
    }
}

pub struct FrameReader {
    io: SocketRead,
    buf: BytesMut,
    decoder: Decoder,
    /// Bytes of the fragmented message the decoder holds.
    fragments: usize,
    /// The server-wide budget of partly received bytes, if this reader counts against it.
    budget: Option<Arc<Sockets>>,
    /// What this reader has counted against it.
    charged: u64,
}

impl FrameReader {
    /// Reads `io`, refusing frames and messages longer than `limit` bytes.
    pub fn new(mut io: SocketRead, limit: usize) -> Self {
        let buf = BytesMut::from(io.take_ahead());
        FrameReader {
            io,
            buf,
            decoder: Decoder::new(limit),
            fragments: 0,
            budget: None,
            charged: 0,
        }
    }

    /// Counts what this reader holds of messages not yet whole, beyond
    /// [`PARTIAL_FREE_BYTES`], against the server's `limits.max_partial_bytes`.
    pub fn with_budget(mut self, sockets: Option<Arc<Sockets>>) -> Self {
        self.budget = sockets;
        self
    }

    /// Brings what is counted against the budget up (or down) to what is held now.
    fn account(&mut self) -> Result<(), ReadError> {
        let Some(budget) = &self.budget else {
            return Ok(());
        };
        let held = self.buf.len() + self.fragments;
        let due = if held > PARTIAL_FREE_BYTES {
            held as u64
        } else {
            0
        };
        if due > self.charged {
            if !budget.charge_partial(due - self.charged) {
                return Err(ReadError::Busy);
            }
        } else if due < self.charged {
            budget.release_partial(self.charged - due);
        }
        self.charged = due;
        Ok(())
    }

    /// The next frame the client sent; reads the socket only when none is buffered.
    pub async fn next(&mut self) -> Result<Inbound, ReadError> {
        loop {
            if let Some(frame) = self.decoder.decode(&mut self.buf)? {
                match &frame {
                    Inbound::Fragment(length) => self.fragments += length,
                    Inbound::Message { .. } => self.fragments = 0,
                    _ => {}
                }
                if self.buf.is_empty() {
                    // Lets go of the read buffer (what was decoded keeps only its own part).
                    self.buf = BytesMut::new();
                }
                if self.charged > 0 {
                    self.account()?;
                }
                return Ok(frame);
            }
            // Room for the whole frame, so a large one is read into one buffer of its size
            // (committed only as it arrives), and for at least READ_CHUNK bytes in all: not
            // READ_CHUNK more, which under load would never fit the buffer already held and
            // would move every read to a new, cold one.
            let room = self.decoder.wanted(&self.buf).max(READ_CHUNK) - self.buf.len();
            if self.io.read_into(&mut self.buf, room).await? == 0 {
                return Err(ReadError::Ended);
            }
            if self.budget.is_some() && self.buf.len() + self.fragments > PARTIAL_FREE_BYTES {
                self.account()?;
            }
        }
    }

    /// After herald has sent its close frame: reads and discards what the client sends until
    /// its close frame (true), or the end of the stream or an error (false), as RFC 6455
    /// 7.1.1 asks, so that a client still writing receives herald's close instead of a reset.
    /// Only frame headers are read; payloads are skipped, never kept.
    pub async fn drain_until_close(&mut self) -> bool {
        // A message in progress is dropped, and the read buffer is consumed below as its frames
        // are skipped: nothing partly received is held any longer.
        self.decoder = Decoder::new(0);
        self.fragments = 0;
        if let Some(budget) = self.budget.take() {
            budget.release_partial(std::mem::take(&mut self.charged));
        }
        // Payload bytes of the current frame still to skip.
        let mut skip = 0u64;
        loop {
            let n = skip.min(self.buf.len() as u64) as usize;
            self.buf.advance(n);
            skip -= n as u64;
            if skip == 0 {
                if let Some((opcode, header, payload)) = frame_header(&self.buf) {
                    if opcode == 0x8 {
                        return true;
                    }
                    self.buf.advance(header);
                    skip = payload;
                    continue;
                }
            }
            if self.buf.is_empty() {
                self.buf = BytesMut::new();
            }
            match self.io.read_into(&mut self.buf, READ_CHUNK).await {
                Ok(0) | Err(_) => return false,
                Ok(_) => {}
            }
        }
    }
}

impl Drop for FrameReader {
    fn drop(&mut self) {
        if let Some(budget) = &self.budget {
            budget.release_partial(self.charged);
        }
    }
}

/// The opcode, header length and payload length of the frame at the front of `buf`, once
/// its whole header is there.
fn frame_header(buf: &[u8]) -> Option<(u8, usize, u64)> {
    let [b0, b1, ..] = *buf else {
        return None;
    };
    let extended = match b1 & 0x7F {
        126 => 2,
        127 => 8,
        _ => 0,
    };
    let mask = if b1 & 0x80 != 0 { 4 } else { 0 };
    let header = 2 + extended + mask;
    if buf.len() < header {
        return None;
    }
    let payload = match extended {
        2 => u64::from(u16::from_be_bytes([buf[2], buf[3]])),
        8 => u64::from_be_bytes(buf[2..10].try_into().expect("8 bytes")),
        _ => u64::from(b1 & 0x7F),
    };
    Some((b0 & 0x0F, header, payload))
}
