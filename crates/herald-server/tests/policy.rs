//! Slow-consumer policies end to end over real sockets: `drop`, `conflate` (with and without
//! `max_rate`) and `lossless`.

mod common;

use common::*;
use futures_util::{SinkExt, StreamExt};
use herald_server::Config;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::Message;

/// Subscribes with extra fields (policy, max_rate, window) and waits for the reply.
async fn subscribe_with(client: &mut Client, pattern: &str, options: Value) {
    let mut request = json!({"op": "sub", "id": 0, "topic": pattern});
    request
        .as_object_mut()
        .unwrap()
        .extend(options.as_object().unwrap().clone());
    send(client, request).await;
    let reply = recv_json(client).await;
    assert_eq!(reply["op"], "subscribed", "{reply}");
}

/// Publishes `count` binary messages of `size` bytes round-robin over `topics`, each carrying
/// its index in its first 4 bytes, and waits for the last one's ack.
async fn publish_burst(publisher: &mut Client, topics: &[&str], count: u32, size: usize) {
    for i in 0..count {
        let topic = topics[i as usize % topics.len()];
        let mut payload = vec![0u8; size];
        payload[..4].copy_from_slice(&i.to_be_bytes());
        let header = if i + 1 == count {
            json!({"op": "pub", "topic": topic, "id": "last"})
        } else {
            json!({"op": "pub", "topic": topic})
        };
        publisher
            .send(binary_publish(header, &payload))
            .await
            .unwrap();
    }
    loop {
        let reply = recv_json(publisher).await;
        if reply["op"] == "ack" {
            break;
        }
    }
}

/// What a subscriber read: per topic, the delivered sequence numbers and the `dropped` counts.
#[derive(Default, Debug)]
struct Seen {
    seqs: HashMap<String, Vec<u64>>,
    dropped: HashMap<(String, String), u64>,
}

/// Reads until every topic in `last` has delivered its last sequence number, checking that
/// each `dropped` notice accounts exactly for the gap before the topic's next message.
async fn read_until(client: &mut Client, last: &HashMap<&str, u64>) -> Seen {
    let mut seen = Seen::default();
    let mut pending: HashMap<String, u64> = HashMap::new();
    let done = |seen: &Seen| {
        last.iter()
            .all(|(t, n)| seen.seqs.get(*t).and_then(|s| s.last()) == Some(n))
    };
    while !done(&seen) {
        match next(client).await {
            Message::Text(text) => {
                let v: Value = serde_json::from_str(&text).unwrap();
                assert_eq!(v["op"], "dropped", "{v}");
                let topic = v["topic"].as_str().unwrap().to_owned();
                let count = v["count"].as_u64().unwrap();
                *pending.entry(topic.clone()).or_default() += count;
                *seen
                    .dropped
                    .entry((topic, v["reason"].as_str().unwrap().to_owned()))
                    .or_default() += count;
            }
            Message::Binary(frame) => {
                let (head, _) = split_binary(&frame);
                let topic = head["topic"].as_str().unwrap().to_owned();
                let seq = head["seq"].as_u64().unwrap();
                let seqs = seen.seqs.entry(topic.clone()).or_default();
                let expected =
                    seqs.last().copied().unwrap_or(0) + 1 + pending.remove(&topic).unwrap_or(0);
                assert_eq!(
                    seq, expected,
                    "{topic}: the notices account exactly for the gap"
                );
                seqs.push(seq);
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(
        pending.is_empty(),
        "notices with no message after them: {pending:?}"
    );
    seen
}

#[tokio::test]
async fn drop_discards_oldest_whole_messages_and_counts_them_exactly() {
    let config = Config {
        max_outbound_bytes: 256 << 10,
        ..Config::default()
    };
    let server = TestServer::start(config).await;
    let mut slow = server.connect().await;
    subscribe_with(&mut slow, "cam/>", json!({"policy": "drop"})).await;
    let mut publisher = server.connect().await;
    // 20 MB: far more than the socket buffers and the 256 KiB queue hold.
    let (count, size) = (1000u32, 20_000);
    publish_burst(&mut publisher, &["cam/a", "cam/b"], count, size).await;
    let last = HashMap::from([("cam/a", count as u64 / 2), ("cam/b", count as u64 / 2)]);
    let seen = read_until(&mut slow, &last).await;
    let delivered: usize = seen.seqs.values().map(Vec::len).sum();
    let dropped: u64 = seen.dropped.values().sum();
    assert!(dropped > 0, "nothing was dropped: {seen:?}");
    assert_eq!(delivered as u64 + dropped, count as u64);
    assert!(seen.dropped.keys().all(|(_, reason)| reason == "drop"));
    assert_eq!(
        server
            .metric("herald_dropped_messages_total{reason=\"drop\",pattern=\"none\"}")
            .await,
        dropped as f64
    );
    server.stop().await;
}

#[tokio::test]
async fn conflate_keeps_the_newest_per_topic_and_never_goes_back() {
    let config = Config {
        max_outbound_bytes: 256 << 10,
        policy: vec![herald_core::policy::PolicyRule {
            pattern: "px/>".into(),
            policy: herald_core::policy::Policy::Conflate,
            max_rate: None,
        }],
        ..Config::default()
    };
    let server = TestServer::start(config).await;
    // No policy in the request: the configured default for px/> applies.
    let mut slow = server.connect().await;
    subscribe(&mut slow, "px/>").await;
    let mut publisher = server.connect().await;
    let topics = ["px/a", "px/b", "px/c", "px/d", "px/e"];
    let count = 2000u32;
    publish_burst(&mut publisher, &topics, count, 10_000).await;
    let per_topic = (count / topics.len() as u32) as u64;
    let last: HashMap<&str, u64> = topics.iter().map(|t| (*t, per_topic)).collect();
    let seen = read_until(&mut slow, &last).await;
    let delivered: usize = seen.seqs.values().map(Vec::len).sum();
    let conflated: u64 = seen.dropped.values().sum();
    assert!(conflated > 0, "nothing was conflated: {seen:?}");
    assert_eq!(delivered as u64 + conflated, count as u64);
    assert!(seen.dropped.keys().all(|(_, reason)| reason == "conflate"));
    assert_eq!(
        server
            .metric("herald_dropped_messages_total{reason=\"conflate\",pattern=\"px/>\"}")
            .await,
        conflated as f64
    );
    server.stop().await;
}

#[tokio::test]
async fn max_rate_throttles_a_fast_topic_and_flushes_the_last_update() {
    let server = TestServer::start(Config::default()).await;
    let mut sub = server.connect().await;
    subscribe_with(
        &mut sub,
        "q/>",
        json!({"policy": "conflate", "max_rate": 10}),
    )
    .await;
    let mut publisher = server.connect().await;
    // q/fast: 1,000 updates/s for one second; q/rare: one update in the middle.
    let started = Instant::now();
    for i in 0..1000u32 {
        if i == 500 {
            send(
                &mut publisher,
                json!({"op": "pub", "topic": "q/rare", "data": "once"}),
            )
            .await;
        }
        send(
            &mut publisher,
            json!({"op": "pub", "topic": "q/fast", "data": i.to_string()}),
        )
        .await;
        tokio::time::sleep_until((started + Duration::from_millis(i as u64 + 1)).into()).await;
    }
    let published_for = started.elapsed();
    let mut fast = Vec::new();
    let mut rare = 0;
    let mut last_fast_at = None;
    loop {
        let v = match tokio::time::timeout(Duration::from_millis(500), sub.next()).await {
            Ok(Some(Ok(Message::Text(t)))) => serde_json::from_str::<Value>(&t).unwrap(),
            Ok(other) => panic!("{other:?}"),
            Err(_) => break,
        };
        match (v["op"].as_str(), v["topic"].as_str()) {
            (Some("msg"), Some("q/fast")) => {
                fast.push(v["data"].as_str().unwrap().parse::<u32>().unwrap());
                last_fast_at = Some(started.elapsed());
            }
            (Some("msg"), Some("q/rare")) => rare += 1,
            (Some("dropped"), _) => assert_eq!(v["reason"], "conflate"),
            other => panic!("{other:?}: {v}"),
        }
    }
    assert_eq!(rare, 1, "the rare topic's update was delivered");
    assert!(
        fast.windows(2).all(|w| w[0] < w[1]),
        "never stale: {fast:?}"
    );
    assert_eq!(
        fast.last(),
        Some(&999),
        "the newest value is flushed: {fast:?}"
    );
    let secs = published_for.as_secs_f64();
    assert!(
        fast.len() as f64 <= 10.0 * secs + 3.0 && fast.len() >= 5,
        "{} messages in {secs:.2} s at max_rate 10",
        fast.len()
    );
    // The flush comes within one interval (0.1 s) of the end, plus scheduling slack.
    assert!(last_fast_at.unwrap() < published_for + Duration::from_millis(400));
    server.stop().await;
}

/// Asserts that nothing arrives on `client` for a while.
async fn assert_quiet(client: &mut Client, what: &str) {
    if let Ok(frame) = tokio::time::timeout(Duration::from_millis(300), client.next()).await {
        panic!("{what}: got {frame:?}");
    }
}

#[tokio::test]
async fn lossless_never_exceeds_the_window_and_loses_nothing() {
    let server = TestServer::start(Config::default()).await;
    let mut sub = server.connect().await;
    subscribe_with(
        &mut sub,
        "jobs/>",
        json!({"policy": "lossless", "window": 5}),
    )
    .await;
    let mut publisher = server.connect().await;
    let total = 23u64;
    let publishing = tokio::spawn(async move {
        for i in 0..total {
            send(
                &mut publisher,
                json!({"op": "pub", "topic": "jobs/x", "id": i, "data": i.to_string()}),
            )
            .await;
        }
        let mut acks = 0;
        while acks < total {
            if recv_json(&mut publisher).await["op"] == "ack" {
                acks += 1;
            }
        }
        publisher
    });
    let mut received = 0u64;
    while received < total {
        let batch = (total - received).min(5);
        for _ in 0..batch {
            let v = recv_json(&mut sub).await;
            received += 1;
            assert_eq!(v["seq"], received, "in order, nothing lost: {v}");
        }
        if received < total {
            assert_quiet(&mut sub, "a message beyond the granted window").await;
        }
        send(&mut sub, json!({"op": "credit", "topic": "jobs/>", "n": 5})).await;
    }
    let _publisher = tokio::time::timeout(WAIT, publishing)
        .await
        .unwrap()
        .unwrap();
    assert!(
        server
            .metric("herald_policy_actions_total{reason=\"lossless_hold\",pattern=\"none\"}")
            .await
            >= 1.0
    );
    server.stop().await;
}

/// A byte window (`window_bytes`, `credit` with `bytes`): messages of mixed sizes; the payload
/// bytes sent never exceed the bytes granted, herald sends every message that fits (it stops
/// only where the next one would not), and nothing is lost or reordered.
#[tokio::test]
async fn lossless_window_bytes_is_never_exceeded_and_nothing_is_lost() {
    let server = TestServer::start(Config::default()).await;
    let mut sub = server.connect().await;
    let mut granted = 2500u64;
    subscribe_with(
        &mut sub,
        "bw/>",
        json!({"policy": "lossless", "window_bytes": granted}),
    )
    .await;
    let sizes: Vec<usize> = (0..30).map(|i| [1000, 700, 300, 1200][i % 4]).collect();
    let mut publisher = server.connect().await;
    let payloads: Vec<String> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| format!("{i:04}{}", "é".repeat((n - 4) / 2)) + &"x".repeat((n - 4) % 2))
        .collect();
    assert!(payloads.iter().zip(&sizes).all(|(p, &n)| p.len() == n));
    let to_publish = payloads.clone();
    let publishing = tokio::spawn(async move {
        for (i, data) in to_publish.into_iter().enumerate() {
            let request = json!({"op": "pub", "topic": "bw/x", "id": i, "data": data});
            send(&mut publisher, request).await;
        }
        publisher
    });
    let (mut received, mut spent) = (0usize, 0u64);
    while received < sizes.len() {
        match tokio::time::timeout(Duration::from_millis(300), sub.next()).await {
            Ok(frame) => {
                let v: Value =
                    serde_json::from_str(frame.unwrap().unwrap().to_text().unwrap()).unwrap();
                assert_eq!(v["seq"], received as u64 + 1, "in order, nothing lost: {v}");
                assert_eq!(v["data"], payloads[received]);
                spent += v["data"].as_str().unwrap().len() as u64;
                received += 1;
                assert!(spent <= granted, "{spent} bytes sent, {granted} granted");
            }
            Err(_) => {
                // Quiet: only because the next message would not fit.
                assert!(
                    spent + sizes[received] as u64 > granted,
                    "held message {received} of {} bytes fits ({spent} of {granted} spent)",
                    sizes[received]
                );
                granted += 1500;
                send(
                    &mut sub,
                    json!({"op": "credit", "topic": "bw/>", "bytes": 1500}),
                )
                .await;
            }
        }
    }
    let _publisher = tokio::time::timeout(WAIT, publishing)
        .await
        .unwrap()
        .unwrap();
    assert_quiet(&mut sub, "a message beyond those published").await;
    server.stop().await;
}

#[tokio::test]
async fn a_vanishing_lossless_subscriber_releases_held_publishers_and_others_never_wait() {
    let config = Config {
        lossless_hold_timeout_ms: 30_000,
        ..Config::default()
    };
    let server = TestServer::start(config).await;
    let mut sub = server.connect().await;
    subscribe_with(&mut sub, "cmd", json!({"policy": "lossless", "window": 1})).await;
    let mut held = server.connect().await;
    for i in 0..2 {
        send(
            &mut held,
            json!({"op": "pub", "topic": "cmd", "id": i, "data": "x"}),
        )
        .await;
    }
    assert_eq!(recv_json(&mut held).await["id"], 0);
    // The second publish waits for credit; a publisher on another topic does not.
    let mut other = server.connect().await;
    send(
        &mut other,
        json!({"op": "pub", "topic": "elsewhere", "id": 9, "data": "y"}),
    )
    .await;
    assert_eq!(recv_json(&mut other).await["op"], "ack");
    assert_quiet(&mut held, "a held publish was acknowledged").await;
    let gone = Instant::now();
    drop(sub);
    let ack = recv_json(&mut held).await;
    assert_eq!(
        (ack["op"].as_str(), ack["id"].as_i64()),
        (Some("ack"), Some(1))
    );
    assert!(
        gone.elapsed() < Duration::from_secs(2),
        "released after {:?}",
        gone.elapsed()
    );
    server.stop().await;
}

#[tokio::test]
async fn a_lossless_subscriber_that_grants_nothing_is_cut_after_the_timeout() {
    let config = Config {
        lossless_hold_timeout_ms: 300,
        ..Config::default()
    };
    let server = TestServer::start(config).await;
    let mut sub = server.connect().await;
    subscribe_with(&mut sub, "cmd", json!({"policy": "lossless", "window": 1})).await;
    let mut publisher = server.connect().await;
    let started = Instant::now();
    for i in 0..2 {
        send(
            &mut publisher,
            json!({"op": "pub", "topic": "cmd", "id": i, "data": "x"}),
        )
        .await;
    }
    for i in 0..2 {
        assert_eq!(recv_json(&mut publisher).await["id"], i);
    }
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(250) && waited < Duration::from_secs(3),
        "{waited:?}"
    );
    assert_eq!(recv_json(&mut sub).await["seq"], 1);
    let close = close_frame(&mut sub).await.expect("a close frame");
    assert_eq!(u16::from(close.code), 4008);
    assert!(close.reason.contains("lossless"), "{}", close.reason);
    assert_eq!(
        server
            .metric("herald_policy_actions_total{reason=\"lossless_timeout\",pattern=\"none\"}")
            .await,
        1.0
    );
    server.stop().await;
}

#[tokio::test]
async fn overlapping_subscriptions_take_the_policy_that_promises_most() {
    let config = Config {
        max_outbound_bytes: 64 << 10,
        ..Config::default()
    };
    let server = TestServer::start(config).await;
    let mut sub = server.connect().await;
    subscribe_with(&mut sub, "a/>", json!({"policy": "conflate"})).await;
    subscribe_with(&mut sub, "a/keep", json!({"policy": "drop"})).await;
    let mut publisher = server.connect().await;
    publish_burst(&mut publisher, &["a/keep", "a/other"], 600, 10_000).await;
    let last = HashMap::from([("a/keep", 300), ("a/other", 300)]);
    let seen = read_until(&mut sub, &last).await;
    // a/keep is under drop (it outranks conflate): its losses are drops, a/other's conflations.
    for (topic, reason) in seen.dropped.keys() {
        let expected = if topic == "a/keep" {
            "drop"
        } else {
            "conflate"
        };
        assert_eq!(reason, expected, "{seen:?}");
    }
    server.stop().await;
}
