//! The cluster's metrics (`herald_cluster_*`), registered beside the node's own: the NATS
//! connection, what crosses it, JetStream's availability and recalls, and what is refused.

use super::carried::Reject;
use crate::metrics::Reason;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Default)]
pub struct ClusterMetrics {
    pub connected: Gauge,
    pub connects: Counter,
    pub nodes_seen: Gauge,
    pub remote_interest: Gauge,
    pub messages_out: Counter,
    pub bytes_out: Counter,
    pub messages_in: Counter,
    pub bytes_in: Counter,
    pub not_carried: Counter,
    pub pending_bytes: Gauge,
    pub missed: Counter,
    pub incomplete: Counter,
    pub jetstream_available: Gauge,
    pub recalled: Counter,
    pub recall_failures: Counter,
    pub rejected: Family<Reason, Counter>,
}

impl ClusterMetrics {
    /// Registers them in `r`, under `herald_cluster_`.
    pub fn register(&self, r: &mut Registry) {
        let r = r.sub_registry_with_prefix("cluster");
        r.register(
            "nats_connected",
            "1 while connected to NATS",
            self.connected.clone(),
        );
        r.register(
            "nats_connects",
            "Connections (and reconnections) to NATS",
            self.connects.clone(),
        );
        r.register(
            "nodes_seen",
            "herald nodes heard from in the last 3 s, this one included",
            self.nodes_seen.clone(),
        );
        r.register(
            "remote_interest",
            "Patterns this node subscribes to on NATS",
            self.remote_interest.clone(),
        );
        r.register(
            "messages_out",
            "Messages handed to NATS",
            self.messages_out.clone(),
        );
        r.register(
            "bytes_out",
            "Payload bytes handed to NATS",
            self.bytes_out.clone(),
        );
        r.register(
            "messages_in",
            "Messages received from other nodes",
            self.messages_in.clone(),
        );
        r.register(
            "bytes_in",
            "Payload bytes received from other nodes",
            self.bytes_in.clone(),
        );
        r.register(
            "not_carried",
            "Messages not handed to NATS because max_pending_bytes was reached",
            self.not_carried.clone(),
        );
        r.register(
            "pending_bytes",
            "Bytes waiting to be handed to NATS",
            self.pending_bytes.clone(),
        );
        r.register(
            "missed",
            "Messages from other nodes found missing (holes in their sequence)",
            self.missed.clone(),
        );
        r.register(
            "incomplete",
            "Chunked messages discarded because a chunk was missing",
            self.incomplete.clone(),
        );
        r.register(
            "jetstream_available",
            "1 while the durable history stream is usable ([nats] jetstream)",
            self.jetstream_available.clone(),
        );
        r.register(
            "recalled",
            "Messages read back from JetStream to answer a since or snapshot",
            self.recalled.clone(),
        );
        r.register(
            "recall_failures",
            "Recoveries answered from memory alone because JetStream failed or was unavailable",
            self.recall_failures.clone(),
        );
        for reason in Reject::ALL {
            // Listed at 0 from the start, so that a first refusal shows as a change.
            let _ = self.rejected.get_or_create(&Reason {
                reason: reason.label(),
            });
        }
        r.register(
            "rejected",
            "Messages read from NATS and dropped: not herald's, unsigned or badly signed, or sizes that do not add up",
            self.rejected.clone(),
        );
    }
}
