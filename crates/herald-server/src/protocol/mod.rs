//! The wire protocols herald speaks besides its native one, each in its own module: decoding
//! what a client sends and encoding what herald sends back, with no I/O.

pub mod stomp;
