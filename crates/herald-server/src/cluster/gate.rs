//! What a node reads from NATS comes from whoever may publish on the NATS account, so it
//! passes [`Gate`]: checked by `carried::open` and dropped (counted, logged at most every
//! 10 s) when it is not what a node writes, or, with `[nats] cluster_key_file`, when it is not
//! signed with the cluster's key. Live messages and what JetStream stored pass the same gate.

use super::carried::{self, Carried, ClusterKey, Reject};
use super::metrics::ClusterMetrics;
use crate::metrics::Reason;
use async_nats::HeaderMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// How often a refused NATS message is logged at most; the others are counted, and the next
/// log line says how many there were.
const REJECT_LOG_EVERY: Duration = Duration::from_secs(10);

/// The checks on what a node reads from NATS ([`carried::open`]), with the cluster key once
/// loaded, counting and logging (at most every [`REJECT_LOG_EVERY`]) what they refuse.
pub struct Gate {
    key: OnceLock<Option<ClusterKey>>,
    metrics: Arc<ClusterMetrics>,
    logged: parking_lot::Mutex<Option<Instant>>,
    unlogged: AtomicU64,
}

impl Gate {
    pub fn new(metrics: Arc<ClusterMetrics>) -> Gate {
        Gate {
            key: OnceLock::new(),
            metrics,
            logged: parking_lot::Mutex::new(None),
            unlogged: AtomicU64::new(0),
        }
    }

    /// Sets the cluster key (`None`: messages are checked but not signed), once.
    pub fn set_key(&self, key: Option<ClusterKey>) {
        let _ = self.key.set(key);
    }

    fn key(&self) -> Option<&ClusterKey> {
        self.key.get().and_then(Option::as_ref)
    }

    /// Signs a message about to be sent, when the cluster key is set.
    pub fn seal(&self, subject: &str, headers: &mut HeaderMap, payload: &[u8]) {
        if let Some(key) = self.key() {
            key.sign(subject, headers, payload);
        }
    }

    /// Decodes a message read from NATS; `None` (counted, logged) when it is refused.
    pub fn open(
        &self,
        subject: &str,
        headers: Option<&HeaderMap>,
        payload: &[u8],
    ) -> Option<Carried> {
        carried::open(subject, headers, payload, self.key())
            .map_err(|reason| self.reject(reason, subject))
            .ok()
    }

    /// Checks a heartbeat's signature, when the cluster key is set.
    pub fn verify(&self, subject: &str, headers: Option<&HeaderMap>, payload: &[u8]) -> bool {
        match self.key().map(|k| k.verify(subject, headers, payload)) {
            Some(Err(reason)) => {
                self.reject(reason, subject);
                false
            }
            _ => true,
        }
    }

    /// Counts a refused message, and logs it unless one was logged in the last
    /// [`REJECT_LOG_EVERY`].
    pub fn reject(&self, reason: Reject, subject: &str) {
        self.metrics
            .rejected
            .get_or_create(&Reason {
                reason: reason.label(),
            })
            .inc();
        let mut logged = self.logged.lock();
        if logged.is_some_and(|at| at.elapsed() < REJECT_LOG_EVERY) {
            self.unlogged.fetch_add(1, Ordering::Relaxed);
            return;
        }
        *logged = Some(Instant::now());
        let unlogged = self.unlogged.swap(0, Ordering::Relaxed);
        tracing::warn!(
            reason = reason.label(),
            subject = %subject.chars().take(200).collect::<String>(),
            unlogged,
            "dropped a message from NATS that no herald node of this cluster sent \
             (herald_cluster_rejected_total; `unlogged` counts those since the last such line)"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_all_counted_and_logged_at_most_once_per_interval() {
        let gate = Gate::new(Arc::default());
        for _ in 0..100 {
            gate.reject(Reject::Chunk, "herald.t.x");
        }
        let counted = gate
            .metrics
            .rejected
            .get_or_create(&Reason { reason: "chunk" })
            .get();
        assert_eq!(counted, 100);
        // One line logged; the 99 others wait to be reported by the next one.
        assert_eq!(gate.unlogged.load(Ordering::Relaxed), 99);
    }
}
