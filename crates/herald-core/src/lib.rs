//! herald's pure core: topic names and patterns, and the index that matches published topics
//! against subscriptions.
//!
//! Nothing in this crate does I/O or needs an async runtime, so every rule here can be tested
//! deterministically and reused by the server, the bench and the CLI alike.

pub mod index;
pub mod topic;
