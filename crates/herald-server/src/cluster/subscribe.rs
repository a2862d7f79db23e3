//! A subscription in a cluster, whatever the broker. Its pattern is followed *before* it is
//! answered ([`Broker::followed`]), so that a message published anywhere after the
//! `subscribed` reply reaches it. With durable history, what memory cannot answer of its
//! `since` and `snapshot` is recalled ([`Broker::recall`]) and joined with what arrived live
//! meanwhile ([`Engine::restore`]), then the engine answers and attaches it under one lock: no
//! gap, no duplicate. When the recall fails, the answer is memory's, gaps and all
//! (`unknown_topic`, `history_trimmed`).

use super::Broker;
use crate::clock::now_us;
use herald_core::engine::{ConnId, Engine, Outbox, Published, Unanswered};
use herald_core::request::{Request, Subscribe};
use herald_core::topic;
use parking_lot::Mutex;

/// Carries out subscription `s` of connection `conn` on `engine`, with `broker` following its
/// pattern and recalling its history.
pub async fn subscribe<O: Outbox>(
    broker: &dyn Broker,
    engine: &Mutex<Engine<O>>,
    conn: ConnId,
    s: Subscribe,
) -> Result<Option<Published>, &'static str> {
    let pattern = s.topic.clone();
    let valid = topic::validate_pattern(&pattern).is_ok();
    let mut unanswered = if valid {
        let mut engine = engine.lock();
        engine.hold_interest(&pattern);
        broker.interest(engine.take_interest_changes());
        if broker.has_history() {
            engine.unanswered(&s)
        } else {
            Unanswered::default()
        }
    } else {
        Unanswered::default()
    };
    if valid {
        broker.followed(&pattern).await;
    }
    // A message carried just before this node's subscription may not be stored yet when the
    // history is read, and then neither source has it: one more read closes that.
    let mut reads = 0;
    let mut engine = loop {
        let recalled = if broker.has_history() && !unanswered.is_empty() {
            reads += 1;
            broker.recall(&pattern, &unanswered).await
        } else {
            Ok(Vec::new())
        };
        let mut engine = engine.lock();
        match recalled {
            Ok(found) => {
                for (topic, epoch, messages) in found {
                    engine.restore(&topic, &epoch, messages);
                }
            }
            Err(e) => {
                tracing::warn!(%pattern, error = %e, "answering from memory alone");
                break engine;
            }
        }
        if reads != 1 {
            break engine;
        }
        unanswered = Unanswered {
            since: engine.unanswered(&s).since,
            snapshot: false,
        };
        if unanswered.is_empty() {
            break engine;
        }
    };
    let result = engine.handle(conn, Request::Subscribe(s), now_us());
    if valid {
        engine.release_interest(&pattern);
    }
    broker.interest(engine.take_interest_changes());
    result
}
