//! A node's MQTT sessions, by client identifier: the one a connection holds, or the one kept
//! for a client that is away. What is done with them (parking, resuming, expiring) is
//! [`super::persist`]'s; this is the store it works on, and what a kept session is made of.
//!
//! Sessions live in the node's memory: another node of a cluster does not know them, and they
//! do not survive a restart (`docs/mqtt.md`).

use super::codec::{Kept, Outbound};
use super::delivery::{Gaps, Lost};
use super::extras::extras_of;
use super::packet::MessageProperties;
use super::retained::Retained;
use super::{QoS, Version};
use crate::config::Config;
use crate::connection::{Connection, Framing};
use herald_core::codec::{Encode, Frame};
use herald_core::engine::ConnId;
use herald_core::group::Group;
use herald_core::message::Message;
use herald_core::reply::{DropReason, GapReason, Reply};
use herald_core::request::Publish;
use parking_lot::{Mutex, MutexGuard};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// What the operator bounds sessions by (`mqtt_session_*` settings, `docs/mqtt.md`).
#[derive(Debug, Clone, Copy)]
pub struct SessionLimits {
    /// The longest a session outlives its connection, in seconds; a client asking for more
    /// (or for never, 0xFFFFFFFF, or a 3.1.1 persistent session) gets this.
    /// `u32::MAX`: sessions may never expire.
    pub expiry_max_secs: u32,
    /// Most messages kept for a client that is away: the newest are delivered.
    pub queue_messages: usize,
    /// Most bytes of messages kept for a client that is away (and as much again of those it
    /// had not been sent yet when it left).
    pub queue_bytes: usize,
}

impl SessionLimits {
    pub fn of(config: &Config) -> SessionLimits {
        SessionLimits {
            expiry_max_secs: config.mqtt_session_expiry_max_secs,
            queue_messages: config.mqtt_session_queue_messages,
            queue_bytes: config.mqtt_session_queue_bytes,
        }
    }

    /// The `lossless` window of a QoS 1 subscription of a client with `receive_maximum`: the
    /// messages in flight, and as many waiting as a session keeps for a client that is away.
    /// Past it, publishers wait for the client's acknowledgements. A `shared` subscription's
    /// membership has the messages in flight alone, so that a member whose client is slow to
    /// acknowledge is passed over rather than made to hold what other members could take.
    pub fn window(&self, receive_maximum: u16, shared: bool) -> u64 {
        let waiting = if shared { 0 } else { self.queue_messages };
        u64::from(receive_maximum) + waiting as u64
    }

    /// The session expiry a client asking for `asked` seconds gets.
    pub fn expiry(&self, asked: u32) -> u32 {
        asked.min(self.expiry_max_secs)
    }
}

/// A will message, checked against the client's grants when it connected, ready to publish.
#[derive(Debug, Clone)]
pub struct Will {
    /// Its publish, without extras until it is published.
    pub publish: Publish,
    /// Its retained message, when it is published with retain.
    pub retained: Option<Retained>,
    /// Its 5.0 properties, carried as the message's extras once it is published.
    pub properties: MessageProperties,
    /// The QoS it is published with.
    pub qos: QoS,
    /// Seconds after the connection ends before it is published (5.0).
    pub delay: u32,
}

impl Will {
    /// The will as published at `now_us`: its publish, and its retained message if it is
    /// published with retain, both carrying its properties and retain flag as extras (its
    /// expiry interval counts from now, §3.1.3.2.4).
    pub fn published(self, now_us: u64) -> (Publish, Option<Retained>) {
        let extras = extras_of(&self.properties, self.retained.is_some(), self.qos, now_us);
        let retained = self.retained.map(|retained| Retained {
            extras: extras.clone(),
            ..retained
        });
        let publish = Publish {
            extras,
            ..self.publish
        };
        (publish, retained)
    }
}

/// The session a connection holds.
pub struct Live {
    pub generation: u64,
    pub conn: Arc<Connection>,
    pub framing: Framing,
    pub version: Version,
    pub state: Arc<Mutex<Outbound>>,
    pub will: Option<Will>,
}

/// A session kept for a client that is away.
pub struct Parked {
    pub generation: u64,
    pub kept: Kept,
    /// What its last connection had queued and never sent, oldest first: sent before what
    /// [`Parked::queue`] kept (a message in both, the session sends once).
    pub unsent: Vec<Message>,
    /// What arrives for its QoS 1 subscriptions meanwhile (none without any).
    pub queue: Option<Queue>,
    /// The will, until it is published (after its delay, or when the session ends).
    pub will: Option<Will>,
}

/// The engine connection that holds a parked session's QoS 1 subscriptions: its queue keeps
/// what they receive, under `drop` (the oldest go first, counted).
pub struct Queue {
    pub id: ConnId,
    pub conn: Arc<Connection>,
    pub collector: Arc<Collector>,
}

/// A client identifier's session, boxed: the map then holds a pointer per client.
pub enum Slot {
    Live(Box<Live>),
    Parked(Box<Parked>),
}

impl Slot {
    pub fn generation(&self) -> u64 {
        match self {
            Slot::Live(live) => live.generation,
            Slot::Parked(parked) => parked.generation,
        }
    }
}

/// Every MQTT session of the node.
pub struct SessionStore {
    slots: Mutex<HashMap<Box<str>, Slot>>,
    generations: AtomicU64,
    pub limits: SessionLimits,
}

impl SessionStore {
    pub fn new(limits: SessionLimits) -> SessionStore {
        SessionStore {
            slots: Mutex::default(),
            generations: AtomicU64::new(0),
            limits,
        }
    }

    /// The sessions, locked. Taken before the engine's lock, never after it.
    pub fn lock(&self) -> MutexGuard<'_, HashMap<Box<str>, Slot>> {
        self.slots.lock()
    }

    /// A number no session of this node had: a timer or a connection that finds another in
    /// its slot knows its session has moved on.
    pub fn generation(&self) -> u64 {
        self.generations.fetch_add(1, Ordering::Relaxed) + 1
    }
}

/// The codec of a parked session's queue, or of what a connection that ends leaves queued:
/// nothing is written, so it encodes nothing. It keeps the gaps its recovery reports, and,
/// when the queue is drained, its messages and the losses its `drop` policy counted.
#[derive(Default)]
pub struct Collector {
    taken: Mutex<Collected>,
}

/// What a [`Collector`] kept.
#[derive(Default)]
pub struct Collected {
    /// Messages for the connection's own subscriptions, oldest first.
    pub messages: Vec<Message>,
    /// Messages for its shared subscriptions, with the group each came for.
    pub grouped: Vec<(Message, Arc<Group>)>,
    pub gaps: Gaps,
}

impl Collector {
    /// What was collected since the last call.
    pub fn take(&self) -> Collected {
        std::mem::take(&mut *self.taken.lock())
    }
}

impl Encode for Collector {
    fn message(&self, message: &Message, _: &mut Vec<Frame>) {
        self.taken.lock().messages.push(message.clone());
    }

    fn grouped(&self, message: &Message, group: &Arc<Group>, _: &mut Vec<Frame>) {
        let grouped = (message.clone(), group.clone());
        self.taken.lock().grouped.push(grouped);
    }

    fn reply(&self, reply: &Reply) -> Frame {
        if let Reply::Subscribed { gaps, .. } = reply {
            let mut taken = self.taken.lock();
            for gap in gaps {
                let lost = match gap.reason {
                    GapReason::HistoryTrimmed { from, to }
                    | GapReason::RecoveryLimit { from, to } => {
                        Lost::Count(to.saturating_sub(from) + 1)
                    }
                    GapReason::EpochChanged { .. } | GapReason::UnknownTopic => Lost::Unknown,
                };
                taken.gaps.add(&gap.topic, lost);
            }
        }
        Frame::default()
    }

    fn dropped(&self, topic: &str, count: u64, _: DropReason) -> Frame {
        self.taken.lock().gaps.add(topic, Lost::Count(count));
        Frame::default()
    }
}
