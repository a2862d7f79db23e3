//! STOMP 1.2 (and 1.0, 1.1) without I/O: the frame decoder, the server frames, version and
//! heart-beat negotiation, and the destination mapping (`docs/stomp.md`).
//!
//! Hand-written: the Rust STOMP crates are clients or parsers without a server side, and none
//! builds MESSAGE frames as shared chunks, which herald's fan-out needs (see [`encode`]).
//!
//! - [`decode`]: bytes in, [`Frame`]s and heart-beats out, within the caller's [`Limits`].
//! - [`frame`]: a client frame: [`Command`], headers, body.
//! - [`escape`]: header escaping per version.
//! - [`encode`]: CONNECTED, RECEIPT, ERROR, and MESSAGE as chunks shared by subscribers.
//! - [`version`], [`heartbeat`]: what CONNECT negotiates.
//! - [`destination`]: `/topic/…` destinations ↔ herald topics and patterns.
//! - [`codec`]: a connection's [`herald_core::codec::Encode`], with its subscriptions.
//! - [`session`]: a connection's [`crate::session::Protocol`]: frames in, requests out.

pub mod codec;
pub mod decode;
pub mod destination;
pub mod encode;
pub mod escape;
pub mod frame;
pub mod heartbeat;
pub mod session;
pub mod version;

pub use decode::{DecodeError, Decoded, Decoder, Limits, Reason};
pub use destination::{DestinationError, Dialect};
pub use frame::{Command, Frame};
pub use version::Version;

#[cfg(test)]
mod session_tests;
#[cfg(test)]
mod tests;
