//! Positions: how nodes learn of holes in another node's numbering even when a topic goes
//! quiet. A node announces where its topics stand (topic, epoch, seq) after a node (re)joined
//! the cluster (messages in flight during the outage may be lost), and announces the topics
//! whose messages it could not carry once its queue has drained; a node that holds less of
//! that epoch tells its subscribers of the gap ([`Events::remote_position`]). How an
//! announcement travels is the broker's.

use super::Events;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::sync::Notify;

/// After a node (re)joins, how long the others wait before announcing their positions: its
/// subscriptions are being restored, and several joins are announced once.
pub const ANNOUNCE_DELAY: Duration = Duration::from_millis(300);

/// Each time `announce` rings, announces the position of every topic this node numbers with
/// `mark(topic, epoch, seq)`, under the engine lock, so in order with the messages already
/// handed to the broker. Ends with the node.
pub async fn announce_positions(
    events: Weak<dyn Events>,
    announce: Arc<Notify>,
    mut mark: impl FnMut(&str, &str, u64),
) {
    loop {
        announce.notified().await;
        tokio::time::sleep(ANNOUNCE_DELAY).await;
        let Some(events) = events.upgrade() else {
            return;
        };
        let positions = events.local_positions(&mut mark);
        tracing::debug!(topics = positions, "announced positions to the other nodes");
    }
}

/// Per subject, the last position of a topic with a message not carried: announced once the
/// queue has drained, so that other nodes learn the hole even if the topic goes quiet.
#[derive(Default)]
pub struct Uncarried(Mutex<HashMap<String, (String, u64)>>);

impl Uncarried {
    /// Message `seq` of `epoch` on `subject` was not carried.
    pub fn note(&self, subject: String, epoch: &str, seq: u64) {
        self.0.lock().insert(subject, (epoch.to_owned(), seq));
    }

    /// The positions to announce, forgotten here.
    pub fn take(&self) -> Vec<(String, (String, u64))> {
        self.0.lock().drain().collect()
    }
}
