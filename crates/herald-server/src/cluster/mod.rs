//! The broker boundary: what a herald node needs from whatever joins it to other nodes, and
//! what it hears back (see docs/cluster.md and docs/architecture.md).
//!
//! Each node keeps its own engine and delivers its own publishes locally first; a [`Broker`]
//! carries them to the other nodes, numbered as the origin numbered them, and hands their
//! messages back through [`Events`], which [`Node`](crate::node::Node) implements. The node
//! holds the broker as `Arc<dyn Broker>`: nothing outside this folder names a transport.
//!
//! - [`brokers`]: the broker the configuration asks for (the one place a new broker is named).
//! - [`subscribe`]: a subscription in a cluster: follow its pattern first, recall what memory
//!   cannot answer, answer under one engine lock.
//! - [`positions`]: announcing topics' positions, so that other nodes learn of holes.
//! - [`nats`]: the NATS broker (`[nats]`), with [`gate`] (checks on what is read from NATS),
//!   [`metrics`] (its counters), [`jetstream`] (durable history) and [`carried`] (how a message
//!   travels on NATS).

pub mod brokers;
mod carried;
pub mod gate;
pub mod jetstream;
pub mod metrics;
pub mod nats;
pub mod positions;
pub mod subscribe;

use futures_util::future::BoxFuture;
use herald_core::engine::{Interest, Recalled, Unanswered};
use herald_core::request::Publish;
use std::sync::Weak;

/// The envelope of what nodes carry on NATS (see `carried.rs`), for the fuzz target and tests.
pub mod envelope {
    pub use crate::cluster::carried::{
        body_limit, extras, open, Added, Carried, Chunk, ClusterKey, Departure, Reassembly, Reject,
        MAX_PARTIALS, MIN_PART, PARTIAL_BUDGET,
    };
}

/// What a recall found for one topic: its name, its epoch and the whole messages of that
/// epoch, oldest first.
pub type TopicHistory = (String, String, Vec<Recalled>);

/// This node's side of a cluster transport. The node calls it under its engine lock where
/// order matters, so every method but the futures returns at once and never blocks.
pub trait Broker: Send + Sync {
    /// Connects (a transport that is away is retried in the background: the node serves its
    /// own clients meanwhile) and starts handing other nodes' messages to `events`, held
    /// weakly: the broker's tasks end with the node. Fails on a configuration the transport
    /// refuses (credentials, TLS), and when called twice.
    fn start(&self, events: Weak<dyn Events>) -> BoxFuture<'_, anyhow::Result<()>>;

    /// Carries a message published on this node, already delivered locally and numbered
    /// `(epoch, seq)` by the engine, received at `now_us`. Called under the engine lock, so
    /// a topic's messages are handed over in sequence order; other nodes keep those numbers.
    /// A message the broker cannot carry (its queue is full) is dropped, and the other nodes
    /// learn the hole from a later message or a position announcement.
    fn publish(&self, p: &Publish, epoch: &str, seq: u64, now_us: u64);

    /// Local interest changed: follow (`Interest::Added`) or stop following
    /// (`Interest::Removed`) other nodes' messages on a pattern. Called in the order the engine
    /// reported the changes.
    fn interest(&self, changes: Vec<Interest>);

    /// Completes once the transport confirms that `pattern` is followed (so a message
    /// published anywhere after this reaches this node), or at once when the transport is away
    /// or it does not confirm within a bound.
    fn followed<'a>(&'a self, pattern: &'a str) -> BoxFuture<'a, ()>;

    /// Whether [`Broker::recall`] can answer: the broker keeps durable history.
    fn has_history(&self) -> bool;

    /// Reads from durable history what memory cannot answer of a subscription to `pattern`
    /// (`unanswered`): each `since` topic's stored messages of its newest epoch, and for a
    /// snapshot the last message of each stored topic the pattern matches. Fails (within a
    /// bound) when the history is unavailable; the caller then answers from memory.
    fn recall<'a>(
        &'a self,
        pattern: &'a str,
        unanswered: &'a Unanswered,
    ) -> BoxFuture<'a, anyhow::Result<Vec<TopicHistory>>>;

    /// The broker's state for `/api/stats` (`cluster`); its metrics are registered with the
    /// node's when it is built.
    fn stats(&self) -> serde_json::Value;
}

/// What a broker hands to its node. Every method takes the engine lock briefly.
pub trait Events: Send + Sync {
    /// A message another node published and numbered `(epoch, seq)`, published there at
    /// `at_us`: delivered to local subscribers. Returns how many of that topic's messages were
    /// found missing before it (a hole), if any.
    fn remote_message(&self, p: &Publish, epoch: &str, seq: u64, at_us: u64) -> Option<u64>;

    /// Another node says its topic `topic` reached `seq` in `epoch` (a position
    /// announcement). Returns how many messages this node finds it missed; its subscribers are
    /// told of the hole.
    fn remote_position(&self, topic: &str, epoch: &str, seq: u64) -> u64;

    /// Calls `each(topic, epoch, seq)` for every topic this node numbers, under the engine
    /// lock (nothing this node publishes slips between two calls), and returns how many.
    fn local_positions(&self, each: &mut dyn FnMut(&str, &str, u64)) -> usize;
}
