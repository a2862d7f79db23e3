//! A snapshot of very many topics, over real sockets: it goes in slices, so another client's
//! publish is acknowledged while it is being served, and the subscriber still gets every
//! topic's last value once, told apart from what is live, with no gap.

mod common;

use common::stall::{populated, Pinger};
use common::*;
use herald_server::Config;
use serde_json::{json, Value};
use std::collections::HashSet;
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::Message;

/// Topics the snapshot covers: enough that one walk of them all under the engine's lock takes
/// far longer (in a debug build) than the round trip bound below.
const TOPICS: usize = 400_000;

/// Fewer topics, for a subscriber with little recovery room.
const FEWER: usize = 50_000;

/// The longest a client publishing every 2 ms may go without an ack while the snapshot is
/// served: a slice and scheduling delays on a busy 2-core machine, never the whole walk (many
/// times this for `TOPICS` in a debug build).
const ROUND_TRIP_BOUND: Duration = Duration::from_millis(500);

/// At the default limits the snapshot's values all fit in the subscriber's recovery room, so
/// only its slices keep the other client's round trips short. With 1 MiB of room, the
/// snapshot also waits for the subscriber to read, and still arrives whole, with no gap. (One
/// test, the two in turn: run at once, on a 2-core machine, each would slow the other's acks.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_of_many_topics_does_not_stall_other_clients_and_arrives_whole() {
    snapshot_while_publishing(TOPICS, Config::default().max_recovery_bytes).await;
    snapshot_while_publishing(FEWER, 1 << 20).await;
}

/// Subscribes to a snapshot of `topics` topics (and `feed/x`) while another client publishes
/// and waits for each ack; checks that the snapshot arrives whole and no ack took longer than
/// [`ROUND_TRIP_BOUND`].
async fn snapshot_while_publishing(topics: usize, max_recovery_bytes: usize) {
    let config = Config {
        max_recovery_bytes,
        ..Config::default()
    };
    let server = populated(config, topics).await;

    // Another client publishes and waits for each ack, from before the subscription until
    // its snapshot is whole, on topics the subscription matches: each publish also waits for
    // the subscriber's connection.
    let pinger = Pinger::start(&server).await;

    // The subscriber reads everything: a message is recovered while a count (the reply's
    // `replayed`, then each `snapshot` notice's) is not used up. The live topics may have
    // been published before the subscription (then they have a value in the snapshot) or
    // after (then not), but never live before their value.
    let mut subscriber = server.connect().await;
    let sub = json!({"op": "sub", "id": 1, "topic": "feed/>", "snapshot": true});
    send(&mut subscriber, sub).await;
    let asked = Instant::now();
    let (mut to_come, mut recovered, mut live) = (0, HashSet::new(), HashSet::new());
    let mut values = 0;
    while values <= topics || live.len() < 10 {
        let Message::Text(t) = next(&mut subscriber).await else {
            panic!("text frames only");
        };
        let v: Value = serde_json::from_str(&t).unwrap();
        let topic = v["topic"].as_str().unwrap().to_owned();
        match v["op"].as_str().unwrap() {
            "subscribed" => {
                assert_eq!((&v["recovered"], to_come), (&json!(true), 0), "{v}");
                to_come = v["replayed"].as_u64().unwrap();
            }
            "snapshot" => {
                assert_eq!((to_come, topic.as_str()), (0, "feed/>"), "{v}");
                to_come = v["count"].as_u64().unwrap();
            }
            "msg" if to_come > 0 => {
                to_come -= 1;
                assert!(!live.contains(&topic), "{v} came after a live message");
                values += usize::from(!topic.starts_with("feed/~live/"));
                assert!(recovered.insert(topic), "{v} came twice");
            }
            "msg" => {
                assert!(topic.starts_with("feed/~live/"), "{v}");
                live.insert(topic);
            }
            _ => panic!("unexpected {v}"),
        }
    }
    let took = asked.elapsed();
    let (worst, pings) = pinger.stop().await;
    eprintln!(
        "snapshot of {} topics in {took:?}; {pings} publishes meanwhile, longest between acks {worst:?}",
        recovered.len()
    );
    assert!(
        worst < ROUND_TRIP_BOUND,
        "{worst:?} between two acks during the snapshot"
    );
    server.stop().await;
}
