//! herald's native protocol (see `docs/protocol.md`): JSON requests and replies over WebSocket.
//! Pure: bytes in, values out; values in, bytes out.
//!
//! - [`client_frames`]: client → server WebSocket framing.
//! - `decode`: requests from text and binary messages ([`decode_text`], [`decode_binary`]),
//!   with `plain_pub`, the hand-written fast path for the plain `pub` that dominates ingest.
//! - `encode`: messages, replies and notices as frames: [`Native`], the native protocol's
//!   [`crate::codec::Encode`], caching each message's frame in its [`SLOT`].
//! - `frames`: server → client WebSocket frames (headers, control frames, close).
//! - `json`: the JSON string and number writing the encoders share.

pub mod client_frames;
mod decode;
mod encode;
mod frames;
mod json;
mod plain_pub;

pub use decode::{
    decode_binary, decode_text, decode_text_frame, decode_text_general, split_binary,
};
pub use encode::{encode_reply, Native, SLOT};
pub use frames::{encode_binary, encode_close, encode_control, ws_header, OpCode};
