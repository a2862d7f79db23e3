//! The wire protocols herald speaks besides its native one, one module each: each decodes a
//! client's requests and encodes what herald sends, and knows nothing of sockets or sessions.

pub mod mqtt;
pub mod stomp;
