//! Reading a large request body (an image) into one buffer, once.
//!
//! `axum::body::to_bytes` collects the body's chunks and then copies them into one buffer, so
//! a 32 MiB image briefly costs twice that. Here each chunk is appended, as it arrives, to a
//! buffer sized from `Content-Length`, and then freed: the payload is held once, and the frame
//! every subscriber shares points into that same buffer.

use axum::body::Body;
use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;

/// Why a body could not be read.
#[derive(Debug, PartialEq, Eq)]
pub enum BodyError {
    /// It is larger than the limit.
    TooLarge,
    /// The client went away or sent a broken body.
    Broken,
}

/// Reads `body` whole, refusing it as soon as it exceeds `limit` bytes. `declared` is its
/// `Content-Length`, if given (a declared length over the limit is refused before reading).
pub async fn read_body(
    mut body: Body,
    limit: usize,
    declared: Option<usize>,
) -> Result<Bytes, BodyError> {
    if declared.is_some_and(|n| n > limit) {
        return Err(BodyError::TooLarge);
    }
    let mut buf = BytesMut::with_capacity(declared.unwrap_or(0));
    while let Some(frame) = body.frame().await {
        if let Ok(chunk) = frame.map_err(|_| BodyError::Broken)?.into_data() {
            if buf.len() + chunk.len() > limit {
                return Err(BodyError::TooLarge);
            }
            buf.extend_from_slice(&chunk);
        }
    }
    Ok(buf.freeze())
}
