//! The wire protocols herald speaks, one module each: each decodes a client's requests and
//! encodes what herald sends. A protocol's session side implements
//! [`crate::session::Protocol`] (`native`, `vbds`); its codec knows nothing of sockets or
//! sessions (`mqtt`, `stomp`).

pub mod mqtt;
pub mod native;
pub mod stomp;
pub mod vbds;
