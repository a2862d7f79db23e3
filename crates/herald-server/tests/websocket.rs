//! herald over real sockets: fan-out, HTTP publish, limits, hostile input, shutdown.

mod common;

use common::*;
use futures_util::SinkExt;
use herald_server::Config;
use serde_json::json;
use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};
use tokio_tungstenite::tungstenite::protocol::frame::Frame;
use tokio_tungstenite::tungstenite::Message;

#[tokio::test]
async fn overlapping_wildcards_deliver_each_message_once_in_order() {
    let server = TestServer::start(Config::default()).await;
    let mut a = server.connect().await;
    let mut b = server.connect().await;
    subscribe(&mut a, "quotes/*/EURUSD").await;
    subscribe(&mut a, "quotes/>").await;
    subscribe(&mut b, "quotes/fx/*").await;
    let mut publisher = server.connect().await;
    for i in 0..200 {
        send(
            &mut publisher,
            json!({"op": "pub", "topic": "quotes/fx/EURUSD", "data": i.to_string()}),
        )
        .await;
    }
    send(
        &mut publisher,
        json!({"op": "pub", "id": "last", "topic": "quotes/eq/IBM", "data": "end"}),
    )
    .await;
    assert_eq!(recv_json(&mut publisher).await["op"], "ack");
    for (client, expect_ibm) in [(&mut a, true), (&mut b, false)] {
        for i in 0..200u64 {
            let m = recv_json(client).await;
            assert_eq!(
                (m["seq"].as_u64(), m["data"].as_str()),
                (Some(i + 1), Some(i.to_string().as_str()))
            );
        }
        if expect_ibm {
            assert_eq!(recv_json(client).await["data"], "end");
        }
        // Nothing else is pending: a ping is answered next.
        send(client, json!({"op": "ping", "id": 1})).await;
        assert_eq!(recv_json(client).await, json!({"op": "pong", "id": 1}));
    }
    server.stop().await;
}

#[tokio::test]
async fn http_publish_reaches_websocket_subscribers_byte_for_byte() {
    let server = TestServer::start(Config::default()).await;
    let mut sub = server.connect().await;
    subscribe(&mut sub, "camera/>").await;
    let image: Vec<u8> = (0..1_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let (status, body) = http(
        server.addr,
        "POST",
        "/api/publish/camera/1/raw",
        &[("Content-Type", "image/fits")],
        &image,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let reply: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (reply["seq"].as_u64(), reply["deliveries"].as_u64()),
        (Some(1), Some(1))
    );
    let Message::Binary(frame) = next(&mut sub).await else {
        panic!("binary expected")
    };
    let (header, payload) = split_binary(&frame);
    assert_eq!(
        header,
        json!({"op": "msg", "topic": "camera/1/raw", "seq": 1, "epoch": header["epoch"], "ct": "image/fits"})
    );
    assert!(payload == image, "payload differs");
    server.stop().await;
}

#[tokio::test]
async fn http_publish_errors_are_explained() {
    let config = Config {
        max_message_bytes: 1000,
        ..Config::default()
    };
    let server = TestServer::start(config).await;
    let (status, body) = http(server.addr, "POST", "/api/publish/a/b", &[], &[0; 1001]).await;
    assert_eq!(status, 413, "{body}");
    assert!(
        body.contains("message_too_large") && body.contains("1000"),
        "{body}"
    );
    let (status, body) = http(server.addr, "POST", "/api/publish/", &[], b"x").await;
    assert_eq!(status, 400);
    assert!(body.contains("no topic"), "{body}");
    let (status, body) = http(server.addr, "POST", "/api/publish/a/*/b", &[], b"x").await;
    assert_eq!(
        (status, body.contains("publish_to_pattern")),
        (400, true),
        "{body}"
    );
    let (status, _) = http(server.addr, "GET", "/nowhere", &[], b"").await;
    assert_eq!(status, 404);
    let (status, body) = http(server.addr, "GET", "/ws", &[], b"").await;
    assert_eq!(status, 426, "{body}");
    assert_eq!(
        server
            .metric("herald_request_errors_total{code=\"message_too_large\"}")
            .await,
        1.0
    );
    server.stop().await;
}

#[tokio::test]
async fn a_client_that_never_reads_is_cut_off_and_others_are_unaffected() {
    let config = Config {
        max_outbound_bytes: 256 << 10,
        ..Config::default()
    };
    let server = TestServer::start(config).await;
    let mut stalled = server.connect().await;
    subscribe(&mut stalled, "big").await;
    let mut healthy = server.connect().await;
    subscribe(&mut healthy, "big").await;
    let mut publisher = server.connect().await;
    let chunk = vec![1u8; 100_000];
    // In lockstep with the healthy reader, so it keeps up while the stalled one falls behind.
    for seq in 1..=300u64 {
        publisher
            .send(binary_publish(json!({"op": "pub", "topic": "big"}), &chunk))
            .await
            .unwrap();
        let Message::Binary(frame) = next(&mut healthy).await else {
            panic!("message {seq}: binary expected")
        };
        assert_eq!(split_binary(&frame).0["seq"], seq);
    }
    // The stalled client's server side was closed for being slow; its backlog was discarded.
    let deadline = tokio::time::Instant::now() + WAIT;
    while server
        .metric("herald_disconnects_total{reason=\"slow_consumer\"}")
        .await
        < 1.0
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "slow consumer was not disconnected"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    drop(stalled);
    server.stop().await;
}

#[tokio::test]
async fn oversized_frames_close_with_1009_even_when_fragmented() {
    let config = Config {
        max_message_bytes: 10_000,
        ..Config::default()
    };
    let server = TestServer::start(config).await;
    let mut bystander = server.connect().await;
    subscribe(&mut bystander, "t").await;

    let mut big = server.connect().await;
    big.send(Message::binary(vec![0u8; 200_000])).await.unwrap();
    assert_eq!(
        close_frame(&mut big).await.map(|f| u16::from(f.code)),
        Some(1009)
    );

    // Many small fragments that add up to more than the limit.
    let mut sly = server.connect().await;
    sly.send(Message::Frame(Frame::message(
        vec![b'{'; 30_000],
        OpCode::Data(Data::Text),
        false,
    )))
    .await
    .unwrap();
    for _ in 0..10 {
        let part = Frame::message(vec![b' '; 30_000], OpCode::Data(Data::Continue), false);
        if sly.send(Message::Frame(part)).await.is_err() {
            break;
        }
    }
    assert_eq!(
        close_frame(&mut sly).await.map(|f| u16::from(f.code)),
        Some(1009)
    );

    send(&mut bystander, json!({"op": "ping", "id": 2})).await;
    assert_eq!(recv_json(&mut bystander).await["op"], "pong");
    server.stop().await;
}

#[tokio::test]
async fn fragmented_messages_are_reassembled() {
    let server = TestServer::start(Config::default()).await;
    let mut c = server.connect().await;
    let text = json!({"op": "sub", "id": "frag", "topic": "a/é"}).to_string();
    let (first, rest) = text.as_bytes().split_at(text.find('é').unwrap() + 1); // splits 'é' across frames
    c.send(Message::Frame(Frame::message(
        first.to_vec(),
        OpCode::Data(Data::Text),
        false,
    )))
    .await
    .unwrap();
    c.send(Message::Frame(Frame::message(
        rest.to_vec(),
        OpCode::Data(Data::Continue),
        true,
    )))
    .await
    .unwrap();
    assert_eq!(recv_json(&mut c).await["id"], "frag");
    server.stop().await;
}

#[tokio::test]
async fn invalid_utf8_closes_with_1007() {
    let server = TestServer::start(Config::default()).await;
    let mut c = server.connect().await;
    c.send(Message::Frame(Frame::message(
        vec![b'"', 0xff, 0xfe, b'"'],
        OpCode::Data(Data::Text),
        true,
    )))
    .await
    .unwrap();
    assert_eq!(
        close_frame(&mut c).await.map(|f| u16::from(f.code)),
        Some(1007)
    );
    assert_eq!(
        server
            .metric("herald_disconnects_total{reason=\"invalid_utf8\"}")
            .await,
        1.0
    );
    server.stop().await;
}

#[tokio::test]
async fn garbage_gets_errors_and_the_connection_keeps_working() {
    let server = TestServer::start(Config::default()).await;
    let mut c = server.connect().await;
    let garbage: [&[u8]; 4] = [
        b"",
        b"\x00\x01",
        b"\xff\xff\xff\xff{}",
        b"\x00\x00\x00\x02\xc3\x28",
    ];
    for bytes in garbage {
        c.send(Message::binary(bytes.to_vec())).await.unwrap();
        assert_eq!(recv_json(&mut c).await["code"], "bad_frame");
    }
    for (text, code) in [
        ("{", "bad_json"),
        ("null", "bad_json"),
        (r#"{"op":"x"}"#, "unknown_op"),
        (r#"{"op":"sub"}"#, "missing_field"),
    ] {
        c.send(Message::text(text)).await.unwrap();
        assert_eq!(recv_json(&mut c).await["code"], code, "{text}");
    }
    send(&mut c, json!({"op": "ping", "id": 3})).await;
    assert_eq!(recv_json(&mut c).await, json!({"op": "pong", "id": 3}));
    server.stop().await;
}

#[tokio::test]
async fn subscription_and_connection_limits_are_enforced() {
    let config = Config {
        max_subscriptions_per_connection: 3,
        max_connections: 2,
        ..Config::default()
    };
    let server = TestServer::start(config).await;
    let mut c = server.connect().await;
    for t in ["a", "b", "c"] {
        subscribe(&mut c, t).await;
    }
    send(&mut c, json!({"op": "sub", "id": 4, "topic": "d"})).await;
    let reply = recv_json(&mut c).await;
    assert_eq!(
        (reply["code"].as_str(), reply["id"].as_u64()),
        (Some("too_many_subscriptions"), Some(4))
    );

    let second = server.connect().await;
    let refused = tokio_tungstenite::connect_async(server.url())
        .await
        .expect_err("third connection is refused");
    assert!(refused.to_string().contains("503"), "{refused}");
    // Every socket counts, /metrics's too: make room for it.
    drop(second);
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert_eq!(
        server
            .metric("herald_connections_refused_total{reason=\"max_connections\"}")
            .await,
        1.0
    );
    server.stop().await;
}

#[tokio::test]
async fn shutdown_sends_every_client_1001() {
    let server = TestServer::start(Config::default()).await;
    let mut clients = Vec::new();
    for _ in 0..5 {
        let mut c = server.connect().await;
        subscribe(&mut c, ">").await;
        clients.push(c);
    }
    let closes = tokio::spawn(async move {
        let mut codes = Vec::new();
        for c in &mut clients {
            codes.push(
                close_frame(c)
                    .await
                    .map(|f| (u16::from(f.code), f.reason.to_string())),
            );
        }
        codes
    });
    server.stop().await;
    for code in closes.await.unwrap() {
        assert_eq!(code, Some((1001, "server shutting down".to_owned())));
    }
}
