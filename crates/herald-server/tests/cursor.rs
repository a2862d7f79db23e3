//! A recovery from a cursor among very many topics, over real sockets: it looks at the topics
//! published after the cursor, not at every topic its pattern matches, so a resubscription to
//! `>` after a few changes is answered at once, another client's publishes are acknowledged
//! meanwhile, and exactly what changed is replayed.

mod common;

use common::stall::{populated, Pinger};
use common::*;
use herald_server::Config;
use serde_json::json;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// Topics `>` matches: enough that one walk of them all under the engine's lock takes over
/// half a second in a debug build.
const TOPICS: usize = 400_000;

/// Topics published after the cursor, besides the pinger's.
const CHANGED: usize = 10;

/// Clients that come back with the cursor, one after another.
const RESUBSCRIBES: u64 = 10;

/// The longest all of them may take to connect, resubscribe and receive their replay:
/// connections and scheduling delays on a busy 2-core machine, never a walk of every topic
/// each (many times this for `TOPICS` in a debug build).
const ALL_ANSWERED_WITHIN: Duration = Duration::from_secs(1);

/// The longest a client publishing every 2 ms may go without an ack meanwhile: scheduling
/// delays, never a walk of every topic.
const ROUND_TRIP_BOUND: Duration = Duration::from_millis(500);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cursor_recovery_over_many_topics_costs_what_changed_and_stalls_nobody() {
    let server = populated(Config::default(), TOPICS).await;

    // A subscriber to everything takes its cursor and goes; a few topics change meanwhile.
    let mut gone = server.connect().await;
    send(&mut gone, json!({"op": "sub", "id": 0, "topic": ">"})).await;
    let cursor = recv_json(&mut gone).await["cursor"]
        .as_str()
        .expect("a cursor")
        .to_owned();
    drop(gone);
    let mut publisher = server.connect().await;
    let changed: BTreeSet<String> = (0..CHANGED)
        .map(|i| format!("feed/{:06}", i * (TOPICS / CHANGED)))
        .collect();
    for (id, topic) in changed.iter().enumerate() {
        let p = json!({"op": "pub", "id": id, "topic": topic, "data": "new"});
        send(&mut publisher, p).await;
        assert_eq!(recv_json(&mut publisher).await["op"], "ack");
    }

    // Clients come back with the cursor while another one publishes (on topics `>` matches,
    // published after the cursor too: replayed as well).
    let pinger = Pinger::start(&server).await;
    let asked = Instant::now();
    let mut slowest = Duration::ZERO;
    for id in 0..RESUBSCRIBES {
        let mut back = server.connect().await;
        let sent = Instant::now();
        let sub = json!({"op": "sub", "id": id, "topic": ">", "cursor": cursor});
        send(&mut back, sub).await;
        let reply = recv_json(&mut back).await;
        slowest = slowest.max(sent.elapsed());
        assert_eq!(
            (&reply["op"], &reply["recovered"]),
            (&json!("subscribed"), &json!(true))
        );
        let mut replayed = BTreeSet::new();
        for _ in 0..reply["replayed"].as_u64().expect("a count") {
            let m = recv_json(&mut back).await;
            let topic = m["topic"].as_str().expect("a message").to_owned();
            if !topic.starts_with("feed/~live/") {
                assert_eq!(m["data"], "new", "{m}");
                replayed.insert(topic);
            }
        }
        assert_eq!(replayed, changed);
    }
    let took = asked.elapsed();
    let (worst, pings) = pinger.stop().await;
    eprintln!(
        "{RESUBSCRIBES} resubscriptions in {took:?}, the slowest answered in {slowest:?}; \
         {pings} publishes meanwhile, longest between acks {worst:?}"
    );
    assert!(
        took < ALL_ANSWERED_WITHIN,
        "{RESUBSCRIBES} resubscriptions took {took:?}"
    );
    assert!(worst < ROUND_TRIP_BOUND, "{worst:?} between two acks");
    server.stop().await;
}
