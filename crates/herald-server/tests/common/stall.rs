//! Very many topics, and a client that tells whether herald stalls while a request about them
//! is served: the request must not hold the engine's lock for long.

use super::{recv_json, send, TestServer};
use futures_util::{SinkExt, StreamExt};
use herald_server::limits::LimitsConfig;
use herald_server::Config;
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::Message;

/// A server of `config` holding `topics` topics ([`populate`]), its per-client message rate
/// raised so that they can be published at once.
pub async fn populated(config: Config, topics: usize) -> TestServer {
    let server = TestServer::start(Config {
        limits: LimitsConfig {
            max_messages_per_sec: 10 * topics as u64,
            ..LimitsConfig::default()
        },
        ..config
    })
    .await;
    let started = Instant::now();
    populate(&server, topics).await;
    eprintln!("{} topics published in {:?}", topics + 1, started.elapsed());
    server
}

/// Publishes one message on each of `topics` topics (`feed/000000`…) and on `feed/x`, and
/// waits until herald has them all.
async fn populate(server: &TestServer, topics: usize) {
    let mut publisher = server.connect().await;
    let frames = (0..topics).map(|i| {
        let p = json!({"op": "pub", "topic": format!("feed/{i:06}"), "data": "v"});
        Ok(Message::text(p.to_string()))
    });
    publisher
        .send_all(&mut futures_util::stream::iter(frames))
        .await
        .unwrap();
    send(
        &mut publisher,
        json!({"op": "pub", "id": 1, "topic": "feed/x", "data": "v"}),
    )
    .await;
    loop {
        let ack = tokio::time::timeout(Duration::from_secs(60), publisher.next())
            .await
            .expect("the publishes are acknowledged")
            .unwrap()
            .unwrap();
        if let Message::Text(t) = ack {
            let v: Value = serde_json::from_str(&t).unwrap();
            if v["op"] == "ack" {
                break;
            }
        }
    }
}

/// A client that publishes on `feed/~live/0`…`feed/~live/9` in turn, every 2 ms, and waits for
/// each ack, until stopped: each publish takes the engine's lock, so the longest time between
/// two acks is the longest the lock was held meanwhile (and scheduling delays).
pub struct Pinger {
    stop: watch::Sender<bool>,
    task: JoinHandle<(Duration, u64)>,
}

impl Pinger {
    /// Connects and starts publishing; returns once it has been for 50 ms.
    pub async fn start(server: &TestServer) -> Pinger {
        let mut pinger = server.connect().await;
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(async move {
            let (mut worst, mut i, mut last) = (Duration::ZERO, 0, Instant::now());
            while !*stopped.borrow() {
                let topic = format!("feed/~live/{}", i % 10);
                let p = json!({"op": "pub", "id": i, "topic": topic, "data": "p"});
                send(&mut pinger, p).await;
                let ack = recv_json(&mut pinger).await;
                assert_eq!((&ack["op"], &ack["id"]), (&json!("ack"), &json!(i)));
                // From one ack to the next: a stall shows whether it began before the publish
                // was sent or after.
                worst = worst.max(last.elapsed());
                last = Instant::now();
                i += 1;
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            (worst, i)
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        Pinger { stop, task }
    }

    /// Stops publishing: the longest time between two acks, and how many publishes were made.
    pub async fn stop(self) -> (Duration, u64) {
        self.stop.send(true).unwrap();
        self.task.await.unwrap()
    }
}
