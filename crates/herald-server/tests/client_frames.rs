//! herald's own frame reader over a raw socket: frames cut at any byte, control frames, large
//! frames written a little at a time, and the protocol rules a client must keep (RFC 6455).

mod common;

use common::*;
use herald_core::wire::client_frames;
use herald_server::Config;
use serde_json::json;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;

const MASK: [u8; 4] = [0xa1, 0x07, 0x5c, 0xe3];

/// One masked client frame.
fn encode_client_frame(fin: bool, opcode: u8, mask: [u8; 4], payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    client_frames::encode_client_frame(fin, opcode, mask, payload, &mut out);
    out
}

/// A WebSocket connection made by hand: the handshake, then raw bytes.
async fn raw(server: &TestServer) -> TcpStream {
    let mut tcp = TcpStream::connect(server.addr).await.unwrap();
    let request = format!(
        "GET /ws HTTP/1.1\r\nHost: {}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
        server.addr
    );
    tcp.write_all(request.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        tcp.read_exact(&mut byte).await.unwrap();
        head.push(byte[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 101"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    tcp
}

/// The server's frames (opcode, payload) until it closes the connection.
async fn frames_until_closed(tcp: &mut TcpStream) -> Vec<(u8, Vec<u8>)> {
    let mut bytes = Vec::new();
    tokio::time::timeout(WAIT, tcp.read_to_end(&mut bytes))
        .await
        .expect("closed within the wait")
        .unwrap();
    let mut frames = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let (op, len) = (bytes[at] & 0x0F, (bytes[at + 1] & 0x7F) as usize);
        let (len, start) = match len {
            126 => (
                u16::from_be_bytes([bytes[at + 2], bytes[at + 3]]) as usize,
                at + 4,
            ),
            127 => (
                u64::from_be_bytes(bytes[at + 2..at + 10].try_into().unwrap()) as usize,
                at + 10,
            ),
            n => (n, at + 2),
        };
        frames.push((op, bytes[start..start + len].to_vec()));
        at = start + len;
    }
    frames
}

/// The close frame's code and reason.
fn close_of(frames: &[(u8, Vec<u8>)]) -> (u16, String) {
    let (_, payload) = frames
        .iter()
        .find(|(op, _)| *op == 0x8)
        .expect("a close frame");
    let code = u16::from_be_bytes([payload[0], payload[1]]);
    (code, String::from_utf8(payload[2..].to_vec()).unwrap())
}

#[tokio::test]
async fn frames_cut_at_every_byte_are_read_and_pings_answered() {
    let server = TestServer::start(Config::default()).await;
    let mut tcp = raw(&server).await;
    let mut stream = encode_client_frame(true, 0x9, MASK, b"are you there");
    let ping = json!({"op": "ping", "id": 9}).to_string();
    stream.extend(encode_client_frame(true, 0x1, MASK, ping.as_bytes()));
    stream.extend(encode_client_frame(
        true,
        0x8,
        MASK,
        &[0x03, 0xE8, b'b', b'y', b'e'],
    ));
    for byte in stream {
        tcp.write_all(&[byte]).await.unwrap();
        tcp.flush().await.unwrap();
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
    let frames = frames_until_closed(&mut tcp).await;
    assert_eq!(
        frames[0],
        (0xA, b"are you there".to_vec()),
        "the pong echoes the ping"
    );
    assert_eq!(frames[1], (0x1, br#"{"op":"pong","id":9}"#.to_vec()));
    assert_eq!(
        close_of(&frames),
        (1000, "bye".to_owned()),
        "the close is echoed"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_large_binary_publish_written_in_pieces_arrives_whole() {
    let server = TestServer::start(Config::default()).await;
    let mut subscriber = server.connect().await;
    subscribe(&mut subscriber, "big").await;
    let payload: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    let Message::Binary(publish) = binary_publish(json!({"op": "pub", "topic": "big"}), &payload)
    else {
        unreachable!()
    };
    let mut tcp = raw(&server).await;
    for piece in encode_client_frame(true, 0x2, MASK, &publish).chunks(50_001) {
        tcp.write_all(piece).await.unwrap();
    }
    let Message::Binary(delivered) = next(&mut subscriber).await else {
        panic!("the message, as one binary frame");
    };
    let (header, got) = split_binary(&delivered);
    assert_eq!(header["topic"], "big");
    assert!(got == payload, "the payload arrives byte for byte");
    server.stop().await;
}

#[tokio::test]
async fn protocol_violations_close_with_1002_and_are_counted() {
    let server = TestServer::start(Config::default()).await;
    let violations = [
        (
            encode_client_frame(true, 0x41, MASK, b"{}"),
            "reserved bits",
        ),
        (
            encode_client_frame(true, 0x3, MASK, b"{}"),
            "unknown opcode",
        ),
        (encode_client_frame(false, 0x9, MASK, b"x"), "control frame"),
        (encode_client_frame(true, 0x0, MASK, b"x"), "continuation"),
        (
            encode_client_frame(true, 0x8, MASK, &[0x03, 0xED]),
            "close code",
        ),
    ];
    for (frame, what) in &violations {
        let mut tcp = raw(&server).await;
        tcp.write_all(frame).await.unwrap();
        let (code, reason) = close_of(&frames_until_closed(&mut tcp).await);
        assert_eq!(code, 1002, "{what}: {reason}");
        assert!(
            reason.starts_with("protocol error") && reason.contains(what),
            "{reason}"
        );
    }
    let counted = server
        .metric("herald_disconnects_total{reason=\"protocol_error\"}")
        .await;
    assert_eq!(counted, violations.len() as f64);
    server.stop().await;
}

/// Each fragment counts against the frame rate, so a message that never ends cannot flood.
#[tokio::test]
async fn fragments_count_against_the_rate_limit() {
    let mut config = Config::default();
    config.limits.max_messages_per_sec = 50;
    let server = TestServer::start(config).await;
    let mut tcp = raw(&server).await;
    let mut flood = encode_client_frame(false, 0x1, MASK, b"{");
    for _ in 0..200 {
        flood.extend(encode_client_frame(false, 0x0, MASK, b" "));
    }
    tcp.write_all(&flood).await.unwrap();
    let (code, reason) = close_of(&frames_until_closed(&mut tcp).await);
    assert_eq!((code, reason.as_str()), (1008, "rate limit exceeded"));
    server.stop().await;
}
