//! A session's incoming WebSocket frames: reads the socket and hands each frame the client sent
//! to the session, decoded by [`herald_core::wire::client_frames`].
//!
//! The read buffer exists only while there is something in it: it is released when a read is
//! used up, and a plain TCP socket is read into a new one only once it is readable. An idle
//! connection, most of the thousands a server holds, so costs no buffer at all (fastwebsockets
//! kept 8 KiB per connection for its whole life, the largest part of an idle connection).

use crate::socket::SocketRead;
use bytes::BytesMut;
use herald_core::wire::client_frames::{Decoder, FrameError, Inbound};
use std::io;

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
}

impl FrameReader {
    /// Reads `io`, refusing frames and messages longer than `limit` bytes.
    pub fn new(mut io: SocketRead, limit: usize) -> Self {
        let buf = BytesMut::from(io.take_ahead());
        FrameReader {
            io,
            buf,
            decoder: Decoder::new(limit),
        }
    }

    /// The next frame the client sent; reads the socket only when none is buffered.
    pub async fn next(&mut self) -> Result<Inbound, ReadError> {
        loop {
            if let Some(frame) = self.decoder.decode(&mut self.buf)? {
                if self.buf.is_empty() {
                    // Lets go of the read buffer (what was decoded keeps only its own part).
                    self.buf = BytesMut::new();
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
        }
    }
}
