//! herald's pure core: everything about routing a message that does not touch a socket or a
//! clock. No I/O and no async runtime here, so it is tested and fuzzed directly.
//!
//! - [`topic`]: the topic and pattern grammar (`a/b`, `a/*/c`, `a/>`), validation, matching.
//! - [`index`]: the subscription index, a trie that finds who a topic's message goes to.
//! - [`request`], [`reply`]: what clients ask and what herald answers, whatever the protocol.
//! - [`message`]: a numbered message, shared by refcount, with each protocol's encoding of it
//!   cached beside it; [`codec`]: what a protocol implements to turn messages, replies and
//!   notices into the bytes a connection writes; [`extras`]: what a message may carry
//!   besides (an expiry, metadata a protocol carries through).
//! - [`wire`]: the native protocol codec (JSON over WebSocket).
//! - [`engine`]: topics (sequence, epoch, history, last value), subscriptions, fan-out; its
//!   recovery (what a subscription is sent before its live messages: `since`, its cursor,
//!   `snapshot`) and its sweep (aged history, idle topics forgotten) are modules of their own.
//! - [`outbox`]: a connection's bounded outbound queue, where slow-consumer policies act.
//! - [`group`]: group subscriptions, whose members share their messages, and whose turn it is.
//! - [`subject`]: topics and patterns as NATS subjects (injective escaping), for clusters.
//! - [`policy`]: the slow-consumer policies and their configured defaults.
//! - [`grant`]: permissions as topic patterns, what a token allows.
//! - [`prefetch`]: a hint to the CPU to load memory about to be used.
//! - [`mix`]: SplitMix64, numbers that look random (epochs; the bench's seeded draws).

pub mod codec;
pub mod engine;
pub mod extras;
pub mod grant;
pub mod group;
pub mod index;
pub mod message;
pub mod mix;
pub mod outbox;
pub mod policy;
pub mod prefetch;
pub mod reply;
pub mod request;
pub mod subject;
pub mod topic;
pub mod wire;

#[cfg(test)]
mod test_support;
