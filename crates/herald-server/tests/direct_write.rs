//! Direct writes (`flush`): frames written by the publishing task, handed to the writer task
//! when the socket is full, shared out to writer tasks on a multi-threaded runtime. Whoever
//! writes, every subscriber gets every message once, whole, in order.

mod common;

use common::*;
use herald_server::Config;
use serde_json::json;

/// A subscriber that stops reading until its socket is full (so direct writes meet a full
/// socket and hand their rest to the writer task), then reads everything.
#[tokio::test]
async fn a_full_socket_hands_over_without_losing_or_reordering() {
    let config = Config {
        max_outbound_bytes: 256 << 20,
        ..Config::default()
    };
    let server = TestServer::start(config).await;
    let mut sub = server.connect().await;
    subscribe(&mut sub, "bulk/>").await;
    let mut publisher = server.connect().await;
    let total = 3_000u64;
    let data = "x".repeat(8 << 10);
    for i in 0..total {
        send(
            &mut publisher,
            json!({"op": "pub", "topic": format!("bulk/{}", i % 3), "id": i, "data": data}),
        )
        .await;
    }
    let mut acks = 0;
    while acks < total {
        if recv_json(&mut publisher).await["op"] == "ack" {
            acks += 1;
        }
    }
    // 24 MB cannot sit in loopback socket buffers: with the publisher's acks all out, part of
    // the subscriber's frames still waited in herald when the last ack was read.
    let out = server.metric("herald_frames_out_total").await;
    assert!(
        out < (2 * total) as f64,
        "{out} frames out: the socket never filled"
    );
    let mut next_seq = [1u64; 3];
    for i in 0..total {
        let m = recv_json(&mut sub).await;
        let t = (i % 3) as usize;
        assert_eq!(
            m["topic"],
            format!("bulk/{t}"),
            "message {i} in publish order"
        );
        assert_eq!(m["seq"], next_seq[t], "message {i}");
        assert_eq!(m["data"].as_str().map(str::len), Some(data.len()));
        next_seq[t] += 1;
    }
    send(&mut sub, json!({"op": "ping", "id": 1})).await;
    assert_eq!(recv_json(&mut sub).await, json!({"op": "pong", "id": 1}));
    server.stop().await;
}

/// Two publishers on two worker threads, a fan-out larger than one direct flush: direct writes
/// from both threads and writer tasks meet on the same connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_publishers_and_writer_tasks_never_interleave() {
    let server = TestServer::start(Config::default()).await;
    let mut subs = Vec::new();
    for _ in 0..40 {
        let mut sub = server.connect().await;
        subscribe(&mut sub, "fan/>").await;
        subs.push(sub);
    }
    let per_publisher = 300u64;
    publish_at_once(
        &server,
        2,
        |p, i| json!({"op": "pub", "topic": format!("fan/{p}"), "data": i.to_string()}),
        per_publisher as usize,
    )
    .await;
    for sub in &mut subs {
        let mut next = [0u64; 2];
        for _ in 0..2 * per_publisher {
            let m = recv_json(sub).await;
            let p = if m["topic"] == "fan/0" { 0 } else { 1 };
            assert_eq!(
                m["data"],
                next[p].to_string(),
                "in order per publisher: {m}"
            );
            assert_eq!(m["seq"], next[p] + 1);
            next[p] += 1;
        }
    }
    server.stop().await;
}

/// Four publishers on two worker threads publish to the same eight topics at once: every
/// subscriber gets each topic's messages once each, numbered without a gap, and each
/// publisher's messages of a topic in the order it sent them. There are more subscribers than
/// a flush writes itself on several workers (32): the rest of each flush goes to a task of its
/// own, which the other worker may run while the publisher's next flush writes the same
/// connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishers_sharing_topics_on_two_workers_keep_numbering_and_order() {
    const TOPICS: usize = 8;
    const PUBLISHERS: usize = 4;
    const EACH: usize = 1_000;
    let server = TestServer::start(Config::default()).await;
    let mut subs = Vec::new();
    for s in 0..48 {
        let mut sub = server.connect().await;
        subscribe(&mut sub, if s % 2 == 0 { "shared/>" } else { "shared/*" }).await;
        subs.push(sub);
    }
    publish_at_once(
        &server,
        PUBLISHERS,
        |p, i| {
            let topic = format!("shared/{}", (i + p) % TOPICS);
            json!({"op": "pub", "topic": topic, "data": format!("{p}:{i}")})
        },
        EACH,
    )
    .await;
    for sub in &mut subs {
        let mut next_seq = [1u64; TOPICS];
        // Per publisher and topic, the last message number seen.
        let mut last = [[None::<usize>; TOPICS]; PUBLISHERS];
        for _ in 0..PUBLISHERS * EACH {
            let m = recv_json(sub).await;
            assert_eq!(m["op"], "msg", "{m}");
            let t: usize = m["topic"].as_str().unwrap()["shared/".len()..]
                .parse()
                .unwrap();
            assert_eq!(m["seq"], next_seq[t], "gapless, once each: {m}");
            next_seq[t] += 1;
            let (p, i) = m["data"].as_str().unwrap().split_once(':').unwrap();
            let (p, i): (usize, usize) = (p.parse().unwrap(), i.parse().unwrap());
            assert!(
                last[p][t].is_none_or(|before| before < i),
                "publisher {p}'s order on topic {t}: {m}"
            );
            last[p][t] = Some(i);
        }
        assert!(next_seq
            .iter()
            .all(|&n| n == 1 + (PUBLISHERS * EACH / TOPICS) as u64));
    }
    server.stop().await;
}

/// `publishers` connections each send `each` publishes (`publish(p, i)` makes publisher `p`'s
/// `i`th) from a task of their own, at once; returns when herald has read them all (each
/// publisher's ping answered).
async fn publish_at_once(
    server: &TestServer,
    publishers: usize,
    publish: impl Fn(usize, usize) -> serde_json::Value + Copy + Send + 'static,
    each: usize,
) {
    let mut tasks = Vec::new();
    for p in 0..publishers {
        let mut publisher = server.connect().await;
        tasks.push(tokio::spawn(async move {
            for i in 0..each {
                send(&mut publisher, publish(p, i)).await;
            }
            send(&mut publisher, json!({"op": "ping", "id": p})).await;
            while recv_json(&mut publisher).await["op"] != "pong" {}
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
}

/// A client may send its first frame in the same packet as its handshake: hyper has then read
/// it already, and the session must still see it (the socket is taken out of hyper).
#[tokio::test]
async fn a_frame_sent_with_the_handshake_is_not_lost() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = TestServer::start(Config::default()).await;
    let mut tcp = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let request = format!(
        "GET /ws HTTP/1.1\r\nHost: {}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
        server.addr
    );
    let ping = br#"{"op":"ping","id":7}"#;
    let mut bytes = request.into_bytes();
    // A masked text frame with an all-zero mask: the payload goes as it is.
    bytes.extend_from_slice(&[0x81, 0x80 | ping.len() as u8, 0, 0, 0, 0]);
    bytes.extend_from_slice(ping);
    tcp.write_all(&bytes).await.unwrap();
    let mut got = Vec::new();
    let reply = br#"{"op":"pong","id":7}"#;
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    while !got.windows(reply.len()).any(|w| w == reply) {
        let mut buf = [0u8; 1024];
        let n = tokio::time::timeout_at(deadline, tcp.read(&mut buf))
            .await
            .expect("the pong within 5 s")
            .unwrap();
        assert!(n > 0, "closed early: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    assert!(got.starts_with(b"HTTP/1.1 101"));
    server.stop().await;
}
