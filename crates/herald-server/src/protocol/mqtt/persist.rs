//! MQTT sessions that outlive their connection (§4.1): a 3.1.1 client connecting with clean
//! session 0, a 5.0 client with a session expiry interval. Their subscriptions stay, what
//! arrives for them while the client is away is kept, and a client that comes back with the
//! same identifier takes it all up again, with no new SUBSCRIBE.
//!
//! The design, in herald's own terms, adds no machinery to the engine:
//!
//! - **While the client is away**, its QoS 1 subscriptions are held by a *parked* engine
//!   connection: a [`Connection`] without a socket, subscribed to the same patterns under
//!   `drop`, whose queue keeps what arrives. The queue is bounded in bytes
//!   (`mqtt_session_queue_bytes`); past it the oldest messages go and are counted per topic,
//!   as for any `drop` subscriber. Publishers never wait for a client that is away: the
//!   parked subscriptions are not `lossless`. QoS 0 subscriptions are kept but nothing is
//!   queued for them (the specification lets a server choose).
//! - **Between the connection and the queue**, nothing may fall. What the ending connection
//!   had queued and never written is taken from its queue and kept, first. What its queue
//!   lost beyond that (a slow consumer's backlog is discarded when it is cut off) is recovered
//!   with herald's `since`: the session knows the position it delivered on every topic
//!   ([`super::delivery::Seen`]), and the parked connection subscribes from those positions
//!   (and, for topics it was sent nothing on, from its subscription's cursor), so that what
//!   the engine's history holds past them is replayed into the queue, and what it no longer
//!   holds is reported as a gap.
//! - **When the client comes back**, under the engine's lock (no message can slip between):
//!   the new connection subscribes to the session's patterns as its SUBSCRIBEs did, the QoS 1
//!   messages it had in flight are sent again with DUP set in their order (§4.4), the parked
//!   queue's messages follow (the newest `mqtt_session_queue_messages` of them), and the
//!   parked connection goes. A message the session already has is never sent twice (its
//!   position says so).
//! - **Shared subscriptions** are kept and resumed as the others are (the new connection
//!   rejoins their groups), but the parked connection joins no group: while the client is
//!   away, the members still connected take the group's messages rather than a queue no one
//!   reads. What the ending connection had queued for a QoS 1 shared subscription is owed to
//!   the client, waiting in the session's [`super::delivery::Flow`] until it comes back; for a
//!   QoS 0 one, it is a loss.
//! - **A session taken over** (a second CONNECT with the same identifier, §3.1.4) goes the
//!   same way at once: the old connection is closed (5.0: DISCONNECT 0x8E), its session
//!   parked and resumed on the new one.
//! - **Losses are not silent.** A topic that lost messages (queue overflow, history trimmed,
//!   an epoch that changed, a message too large for the client) is marked in the session's
//!   [`super::delivery::Gaps`]: the topic's next message to a 5.0 client carries the user
//!   property `herald-gap` (how many, or `unknown`). 3.1.1 has no way to say it.
//! - **Expiry** is a timer per parked session, which also publishes a delayed will (5.0)
//!   when its delay passes first; a client that comes back in time cancels both (the timer
//!   finds its session moved on: every connection and parked session has its own generation).
//!
//! Sessions are per node: the store is in the node's memory
//! ([`super::sessions::SessionStore`]).

use super::codec::{framed, Encoder, Kept, Outbound, Sub, UnspentCredit};
use super::delivery::{CreditTo, Held, Lost};
use super::encode::{self, ProblemInfo};
use super::extras;
use super::sessions::{Collected, Collector, Live, Parked, Queue, Slot, Will};
use super::{ReasonCode, Version};
use crate::clock::now_us;
use crate::connection::{Connection, Framing, QueueLimits};
use crate::metrics::Disconnect;
use crate::node::Node;
use crate::session::Context;
use herald_core::codec::Frame;
use herald_core::engine::{ConnId, Engine, Outbox};
use herald_core::group::Group;
use herald_core::message::Message;
use herald_core::policy::Policy;
use herald_core::request::{Request, Subscribe};
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// A connection that has just sent its CONNECT, joining its client identifier's session.
pub struct Joining<'a> {
    pub client_id: &'a str,
    pub clean_start: bool,
    pub version: Version,
    pub framing: Framing,
    pub state: &'a Arc<Mutex<Outbound>>,
    pub encoder: &'a Encoder,
    pub will: Option<Will>,
    pub receive_maximum: u16,
}

/// Joins the connection to its client identifier's session: takes it over from a connection
/// that holds it, discards it on a clean start, or resumes it. `connack` is the CONNACK for
/// whether a session is present, sent before anything the session resumes with. Returns the
/// connection's hold on the session (its generation, for [`leave`]).
pub fn join(
    node: &Arc<Node>,
    cx: &mut Context<'_>,
    joining: Joining<'_>,
    connack: impl FnOnce(bool) -> Frame,
) -> u64 {
    let store = &node.mqtt_sessions;
    let generation = store.generation();
    let mut slots = store.lock();
    let earlier = match slots.remove(joining.client_id) {
        Some(Slot::Live(old)) => Some(take_over(node, *old)),
        Some(Slot::Parked(parked)) => Some(*parked),
        None => None,
    };
    let resumed = match earlier {
        Some(parked) if joining.clean_start => {
            end(node, parked);
            None
        }
        parked => parked,
    };
    cx.send(connack(resumed.is_some()));
    if let Some(parked) = resumed {
        // Back before the will's delay passed: it is not published (§3.1.3.2.2).
        resume(node, cx, &joining, parked);
    }
    let live = Live {
        generation,
        conn: cx.conn.clone(),
        framing: joining.framing,
        version: joining.version,
        state: joining.state.clone(),
        will: joining.will,
    };
    slots.insert(joining.client_id.into(), Slot::Live(Box::new(live)));
    generation
}

/// The connection holding session `client_id` (as `generation`) ended: the session is parked
/// for `expiry` seconds, or ends. Returns the will to publish now, if any: at once when the
/// session ends or its will has no delay; the parked session keeps a delayed one. Nothing,
/// when another connection took the session over.
pub fn leave(
    node: &Arc<Node>,
    conn: &Connection,
    client_id: &str,
    generation: u64,
    state: &Mutex<Outbound>,
    will: Option<Will>,
    expiry: u32,
) -> Option<Will> {
    let store = &node.mqtt_sessions;
    let mut slots = store.lock();
    if slots.get(client_id).map(Slot::generation) != Some(generation) {
        return None;
    }
    slots.remove(client_id);
    if expiry == 0 {
        return will;
    }
    let (now, delayed) = match will {
        Some(will) if will.delay > 0 => (None, Some(will)),
        will => (will, None),
    };
    let delay = delayed.as_ref().map(|will| will.delay);
    let parked = {
        let mut engine = node.engine.lock();
        let unsent = unsent(conn);
        park(
            node,
            &mut engine,
            unsent,
            state,
            store.generation(),
            delayed,
        )
    };
    let watch = watch(
        Arc::downgrade(node),
        client_id.into(),
        parked.generation,
        delay,
        expiry,
    );
    slots.insert(client_id.into(), Slot::Parked(Box::new(parked)));
    tokio::spawn(watch);
    now
}

/// Closes the connection holding a session another connection takes over, and parks the
/// session for the new one. A will without delay is published now (the old connection ended
/// without DISCONNECT); a delayed one goes with the session.
fn take_over(node: &Arc<Node>, old: Live) -> Parked {
    // Under the engine's lock, so that nothing reaches the old connection between what is
    // taken of its queue and its close.
    let mut engine = node.engine.lock();
    let unsent = unsent(&old.conn);
    if old.version == Version::V5 {
        let info = ProblemInfo {
            reason_string: Some("another connection took this session over"),
            user_properties: &[],
        };
        let packet = encode::disconnect(ReasonCode::SessionTakenOver, info, None);
        old.conn.send_control(framed(old.framing, packet));
    }
    old.conn
        .close(Disconnect::TakenOver, 1000, "session taken over");
    let will = match old.will {
        Some(will) if will.delay == 0 => {
            tokio::spawn(publish_will(node.clone(), will));
            None
        }
        will => will,
    };
    park(node, &mut engine, unsent, &old.state, old.generation, will)
}

/// What `conn` queued and never sent (messages, and the losses its `drop` policy counted),
/// taken from its queue.
fn unsent(conn: &Connection) -> Collected {
    let unsent = Collector::default();
    conn.drain_with(&unsent);
    unsent.take()
}

/// Parks the session in `state`, whose connection has gone or is closing, with what that
/// connection queued and never sent (`unsent`): an engine connection without a socket takes
/// the session's own QoS 1 subscriptions, recovering from the positions the session delivered
/// what its connection lost beyond that (a slow consumer's discarded backlog). Its shared
/// subscriptions hold no membership while it is away.
fn park(
    node: &Node,
    engine: &mut Engine<Arc<Connection>>,
    unsent: Collected,
    state: &Mutex<Outbound>,
    generation: u64,
    will: Option<Will>,
) -> Parked {
    let mut kept = state.lock().take_session();
    kept.gaps.merge(unsent.gaps);
    owe_grouped(&mut kept, unsent.grouped);
    let patterns = lossless_patterns(&kept);
    let queue = (!patterns.is_empty()).then(|| {
        let collector = Arc::new(Collector::default());
        let bytes = node.mqtt_sessions.limits.queue_bytes;
        let limits = QueueLimits {
            outbound: bytes,
            recovery: bytes,
        };
        let conn = Connection::open(
            collector.clone(),
            Framing::Stream,
            None,
            limits,
            node.metrics.clone(),
        );
        let id = engine.connect(conn.clone());
        for pattern in patterns {
            let (since, cursor) = kept.seen.recovery(&pattern);
            let subscribe = Subscribe {
                topic: pattern,
                policy: Some(Policy::Drop),
                since,
                cursor,
                ..Subscribe::default()
            };
            // A refusal (a limit reached) leaves that pattern unqueued.
            let _ = engine.handle(id, Request::Subscribe(subscribe), now_us());
        }
        interest_changed(node, engine);
        Queue {
            id,
            conn,
            collector,
        }
    });
    Parked {
        generation,
        kept,
        unsent: unsent.messages,
        queue,
        will,
    }
}

/// The messages of a shared subscription that an ending connection had queued and never sent:
/// the session owes its client those of a QoS 1 subscription, waiting their turn (the credit
/// they spent was the membership's, which ends with the connection); one of a QoS 0
/// subscription (or of one the session no longer holds), or published at QoS 0, is lost.
fn owe_grouped(kept: &mut Kept, grouped: Vec<(Message, Arc<Group>)>) {
    for (message, group) in grouped {
        let owed = !extras::at_most_once(message.extras())
            && kept
                .subs
                .iter()
                .any(|sub| sub.shared && sub.lossless && *sub.name == *group.name);
        if !owed {
            kept.gaps.add(message.topic(), Lost::Count(1));
            continue;
        }
        let held = Held::Live {
            message,
            group: Some(group),
        };
        kept.flow.wait(held, None);
    }
}

/// The distinct herald patterns of a session's own QoS 1 subscriptions, in order.
fn lossless_patterns(kept: &Kept) -> Vec<String> {
    let mut seen = HashSet::new();
    kept.subs
        .iter()
        .filter(|sub| sub.lossless && !sub.shared)
        .flat_map(|sub| &sub.patterns)
        .filter(|p| seen.insert(p.as_str()))
        .cloned()
        .collect()
}

/// Resumes a parked session on the joining connection (see the module's doc for the order).
fn resume(node: &Node, cx: &mut Context<'_>, joining: &Joining<'_>, parked: Parked) {
    let Parked {
        mut kept,
        unsent,
        queue,
        ..
    } = parked;
    let limits = node.mqtt_sessions.limits;
    let subscribe = |sub: &Sub, pattern: &str| Subscribe {
        topic: pattern.to_owned(),
        policy: sub.lossless.then_some(Policy::Lossless),
        window: sub
            .lossless
            .then(|| limits.window(joining.receive_maximum, sub.shared)),
        group: sub.shared.then(|| sub.name.clone()),
        no_local: sub.no_local,
        ..Subscribe::default()
    };
    // A subscription the new connection's token does not grant as it was is not resumed.
    kept.subs.retain(|sub| {
        sub.patterns
            .iter()
            .all(|pattern| cx.admits(&Request::Subscribe(subscribe(sub, pattern))))
    });
    // One herald subscription per pattern of its own subscriptions (`lossless` if one of
    // those using it is, `no_local` if all are), one membership per pattern of each shared
    // one (which rejoins its group).
    let mut subscribes: Vec<Subscribe> = Vec::new();
    for sub in kept.subs.iter() {
        for pattern in &sub.patterns {
            let next = subscribe(sub, pattern);
            let same = subscribes
                .iter_mut()
                .find(|s| s.group.is_none() && next.group.is_none() && s.topic == next.topic);
            match same {
                Some(same) => {
                    if sub.lossless {
                        (same.policy, same.window) = (next.policy, next.window);
                    }
                    same.no_local &= next.no_local;
                }
                None => subscribes.push(next),
            }
        }
    }
    let mut engine = node.engine.lock();
    for subscribe in subscribes {
        // A refusal (a limit reached) leaves that pattern without messages.
        let _ = engine.handle(cx.id, Request::Subscribe(subscribe), now_us());
    }
    let kept_away = queue.map_or_else(Collected::default, |q| take_queue(&mut engine, q));
    let gaps = kept_away.gaps;
    let mut messages = unsent;
    messages.extend(kept_away.messages);
    interest_changed(node, &mut engine);
    let frames = {
        let mut s = joining.state.lock();
        s.resume(kept, joining.receive_maximum);
        s.gaps.merge(gaps);
        let keep = node.mqtt_sessions.limits.queue_messages;
        let over = messages.len().saturating_sub(keep);
        for m in messages.drain(..over) {
            s.gaps.add(m.topic(), Lost::Count(1));
        }
        s.uncredited = messages.len();
        joining.encoder.resend(&mut s)
    };
    for frame in frames {
        cx.send(frame);
    }
    for m in &messages {
        cx.conn.recovered(m);
    }
    drop(engine);
    node.released.notify_waiters();
}

/// The messages a parked session's queue kept, and the losses it counted; the parked
/// connection goes.
fn take_queue(engine: &mut Engine<Arc<Connection>>, q: Queue) -> Collected {
    q.conn.drain_with(&*q.collector);
    engine.disconnect(q.id);
    q.collector.take()
}

/// A parked session ends (it expired, or a clean start discarded it): its queue goes, and
/// its will, if not yet published, is.
fn end(node: &Arc<Node>, parked: Parked) {
    if let Some(q) = parked.queue {
        let mut engine = node.engine.lock();
        engine.disconnect(q.id);
        interest_changed(node, &mut engine);
        drop(engine);
        node.released.notify_waiters();
    }
    if let Some(will) = parked.will {
        tokio::spawn(publish_will(node.clone(), will));
    }
}

/// Hands the broker, if any, the patterns the node's connections started or stopped holding.
fn interest_changed(node: &Node, engine: &mut Engine<Arc<Connection>>) {
    if let Some(broker) = &node.broker {
        broker.interest(engine.take_interest_changes());
    }
}

/// The timer of parked session `client_id` (as `generation`): publishes its will once its
/// delay passes (when that is before the session ends), and ends it once it expires, unless
/// the session has moved on by then. `expiry` `u32::MAX`: it never expires.
async fn watch(
    node: Weak<Node>,
    client_id: Box<str>,
    generation: u64,
    will_delay: Option<u32>,
    expiry: u32,
) {
    let start = tokio::time::Instant::now();
    let seconds = |s: u32| Duration::from_secs(u64::from(s));
    if let Some(delay) = will_delay.filter(|&delay| delay < expiry) {
        tokio::time::sleep(seconds(delay)).await;
        let Some(node) = node.upgrade() else {
            return;
        };
        let will = match node.mqtt_sessions.lock().get_mut(&*client_id) {
            Some(Slot::Parked(parked)) if parked.generation == generation => parked.will.take(),
            _ => return,
        };
        if let Some(will) = will {
            publish_will(node, will).await;
        }
    }
    if expiry == u32::MAX {
        return;
    }
    tokio::time::sleep_until(start + seconds(expiry)).await;
    let Some(node) = node.upgrade() else {
        return;
    };
    let parked = {
        let mut slots = node.mqtt_sessions.lock();
        match slots.get(&*client_id) {
            Some(slot) if slot.generation() == generation => slots.remove(&*client_id),
            _ => None,
        }
    };
    if let Some(Slot::Parked(parked)) = parked {
        end(&node, *parked);
    }
}

/// Publishes a will on behalf of a client whose connection is gone (its grants were checked
/// when it connected).
async fn publish_will(node: Arc<Node>, will: Will) {
    let (publish, retained) = will.published(now_us());
    if let Some(retained) = retained {
        // A full store keeps the will from being retained; it is still published.
        let _ = node.mqtt_retained.publish(&publish.topic, retained);
    }
    if let Err(e) = node.publish(&publish, 0).await {
        tracing::debug!(topic = %publish.topic, error = %e, "an MQTT will was refused");
    }
}

/// How a connection gives back `lossless` credit the engine charged for a message it did not
/// send: a task grants it (the encoder calls this under the connection's locks, where the
/// engine's lock must not be waited for), if the connection is still the engine's (a
/// subscription or membership it no longer holds takes no credit).
pub fn credit_return(node: &Arc<Node>, id: ConnId, conn: &Arc<Connection>) -> UnspentCredit {
    let node = Arc::downgrade(node);
    let conn = Arc::downgrade(conn);
    Box::new(move |credit: CreditTo| {
        let (node, conn) = (node.clone(), conn.clone());
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            let (Some(node), Some(conn)) = (node.upgrade(), conn.upgrade()) else {
                return;
            };
            {
                let mut engine = node.engine.lock();
                if !engine.outbox(id).is_some_and(|c| Arc::ptr_eq(c, &conn)) {
                    return;
                }
                let _ = engine.handle(id, credit.request(), now_us());
            }
            node.released.notify_waiters();
        });
    })
}

/// Per herald pattern, how many of the connection's own (not shared) subscriptions use it
/// (`a/#` and `a` share `a`).
pub fn pattern_users(state: &Mutex<Outbound>) -> HashMap<String, usize> {
    let mut users = HashMap::new();
    for sub in state.lock().subs.iter().filter(|sub| !sub.shared) {
        for pattern in &sub.patterns {
            *users.entry(pattern.clone()).or_default() += 1;
        }
    }
    users
}
