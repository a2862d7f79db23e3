//! The connection layer's limits over loopback sockets, each with the attack it answers
//! (docs/security.md, "Limits and their defaults"): sockets that count without authenticating,
//! slow bodies, partly received messages, ping floods, keepalive, the close handshake, and HTTP
//! publish from other origins or too fast. Kept apart from `hostile.rs`, whose latency
//! measurement must not share the machine with these floods.

mod common;

use common::*;
use futures_util::{SinkExt, StreamExt};
use herald_server::limits::LimitsConfig;
use herald_server::Config;
use serde_json::json;
use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio_tungstenite::tungstenite::Message;

/// Where "other" clients connect from: Linux routes all of 127/8 to loopback, and the per-IP
/// limits, which exempt 127.0.0.1 in these tests, apply to it.
const ATTACKER: [u8; 4] = [127, 0, 0, 2];

async fn connect_from(addr: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind((ATTACKER, 0).into())?;
    socket.connect(addr).await
}

/// A raw WebSocket handshake on `socket`; returns once the 101 has been read.
async fn raw_upgrade(socket: &mut TcpStream, query: &str) {
    raw_upgrade_at(socket, &format!("/ws{query}")).await
}

/// The WebSocket handshake on `path`, by hand.
async fn raw_upgrade_at(socket: &mut TcpStream, path: &str) {
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    );
    socket.write_all(request.as_bytes()).await.unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 512];
    while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = tokio::time::timeout(WAIT, socket.read(&mut buf))
            .await
            .expect("a handshake reply")
            .unwrap();
        assert!(n > 0, "closed during the handshake");
        seen.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&seen);
    assert!(text.starts_with("HTTP/1.1 101"), "{text}");
}

/// Whether the server closes `socket` (EOF or reset) within `within`; what it sent meanwhile.
async fn closed_within(socket: &mut TcpStream, within: Duration) -> (bool, Vec<u8>) {
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, socket.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (true, seen),
            Ok(Ok(n)) => seen.extend_from_slice(&buf[..n]),
            Err(_) => return (false, seen),
        }
    }
}

/// The close code in the first close frame among `bytes` (server frames are unmasked).
fn close_code(bytes: &[u8]) -> Option<u16> {
    let mut at = 0;
    while at + 2 <= bytes.len() {
        let (op, len) = (bytes[at] & 0x0F, (bytes[at + 1] & 0x7F) as usize);
        let (header, len) = match len {
            126 if at + 4 <= bytes.len() => (
                4,
                u16::from_be_bytes([bytes[at + 2], bytes[at + 3]]) as usize,
            ),
            127 if at + 10 <= bytes.len() => (
                10,
                u64::from_be_bytes(bytes[at + 2..at + 10].try_into().unwrap()) as usize,
            ),
            126 | 127 => return None,
            n => (2, n),
        };
        if op == 0x8 && len >= 2 && at + header + 2 <= bytes.len() {
            return Some(u16::from_be_bytes([
                bytes[at + header],
                bytes[at + header + 1],
            ]));
        }
        at += header + len;
    }
    None
}

/// A masked client frame (mask 0: the payload is sent as is).
fn client_frame(opcode: u8, fin: bool, payload_len: usize) -> Vec<u8> {
    let mut frame = vec![(if fin { 0x80 } else { 0 }) | opcode];
    match payload_len {
        n if n < 126 => frame.push(0x80 | n as u8),
        n if n <= u16::MAX as usize => {
            frame.push(0x80 | 126);
            frame.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            frame.push(0x80 | 127);
            frame.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    frame.extend_from_slice(&[0, 0, 0, 0]);
    frame
}

#[tokio::test]
async fn every_accepted_socket_counts_toward_max_connections() {
    let server = TestServer::start(Config {
        max_connections: 5,
        ..Config::default()
    })
    .await;
    // Plain sockets that never send a byte hold their places as WebSockets would.
    let mut held = Vec::new();
    for _ in 0..5 {
        held.push(TcpStream::connect(server.addr).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut sixth = TcpStream::connect(server.addr).await.unwrap();
    let (closed, said) = closed_within(&mut sixth, Duration::from_secs(2)).await;
    assert!(closed, "the sixth socket is closed at once");
    let said = String::from_utf8_lossy(&said);
    assert!(
        said.is_empty() || said.starts_with("HTTP/1.1 503"),
        "{said}"
    );
    drop(held);
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Room again: /metrics itself takes one of the five.
    assert!(
        server
            .metric("herald_connections_refused_total{reason=\"max_connections\"}")
            .await
            >= 1.0
    );
    let mut client = server.connect().await;
    subscribe(&mut client, "x").await;
    server.stop().await;
}

/// A scratch HS256 secret for a server with auth on.
struct Secret(std::path::PathBuf);

const SECRET: &str = "hostile-test-secret-at-least-32-bytes-long";
const ADMIN_KEY: &str = "hostile-test-admin-key";

impl Secret {
    fn new(name: &str) -> Secret {
        let dir =
            std::env::temp_dir().join(format!("herald-hostile-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("secret"), SECRET).unwrap();
        std::fs::write(dir.join("admin"), ADMIN_KEY).unwrap();
        Secret(dir)
    }

    fn auth(&self) -> herald_server::auth::AuthConfig {
        herald_server::auth::AuthConfig {
            hs256_secret_file: Some(self.0.join("secret")),
            admin_api_key_file: Some(self.0.join("admin")),
            ..Default::default()
        }
    }

    /// One metric series, read with the admin key (0 when absent).
    async fn metric(&self, server: &TestServer, series: &str) -> f64 {
        common::metric(server.addr, ADMIN_KEY, series).await
    }

    fn token(&self) -> String {
        let claims = json!({
            "exp": SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() + 600,
            "herald": {"sub": [">"], "pub": [">"]},
        });
        let key = jsonwebtoken::EncodingKey::from_secret(SECRET.as_bytes());
        jsonwebtoken::encode(&Default::default(), &claims, &key).unwrap()
    }
}

impl Drop for Secret {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[tokio::test]
async fn with_auth_on_the_dashboard_page_is_open_and_its_data_is_not() {
    let secret = Secret::new("open");
    let server = TestServer::start(Config {
        auth: secret.auth(),
        ..Config::default()
    })
    .await;
    // Static files: the page asks for a token itself (docs/security.md).
    let (status, page) = http(server.addr, "GET", "/", &[], &[]).await;
    assert_eq!(status, 200);
    assert!(
        page.contains("<html") || page.contains("<!doctype"),
        "{page}"
    );
    for path in ["/api/stats", "/api/topics", "/metrics"] {
        let (status, _) = http(server.addr, "GET", path, &[], &[]).await;
        assert_eq!(status, 401, "{path}");
    }
    server.stop().await;
}

#[tokio::test]
async fn unauthenticated_sockets_are_shed_oldest_first_so_real_clients_get_in() {
    let secret = Secret::new("shed");
    let server = TestServer::start(Config {
        max_connections: 8,
        auth: secret.auth(),
        limits: LimitsConfig {
            exempt_ips: vec![[127, 0, 0, 1].into()],
            max_unauthenticated_per_ip: 6,
            ..LimitsConfig::default()
        },
        ..Config::default()
    })
    .await;
    let addr = server.addr;
    // Eight WebSockets from one address that never authenticate fill max_connections.
    let mut silent = Vec::new();
    for _ in 0..8 {
        let mut s = connect_from(addr).await.unwrap();
        raw_upgrade(&mut s, "").await;
        silent.push(s);
    }
    // The per-IP cap on unauthenticated sockets (6) already shed the two oldest.
    for (i, s) in silent.iter_mut().take(2).enumerate() {
        let (closed, said) = closed_within(s, Duration::from_secs(2)).await;
        assert!(closed, "socket {i} shed");
        assert_eq!(close_code(&said), Some(1013), "socket {i}");
    }
    // Plain sockets from elsewhere take the two places left; now the server is full.
    let plain: Vec<_> = futures_util::future::join_all((0..2).map(|_| TcpStream::connect(addr)))
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    // A real client with a token still gets in: the oldest unauthenticated socket makes room.
    let url = format!("{}?token={}", server.url(), secret.token());
    let (mut real, _) = tokio_tungstenite::connect_async(url)
        .await
        .expect("admitted");
    subscribe(&mut real, "x").await;
    let (closed, said) = closed_within(&mut silent[2], Duration::from_secs(2)).await;
    assert!(
        closed,
        "the oldest remaining unauthenticated socket is shed"
    );
    assert_eq!(close_code(&said), Some(1013));
    let (closed, _) = closed_within(&mut silent[7], Duration::from_millis(300)).await;
    assert!(!closed, "the newest stays");
    drop(plain);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let shed = |reason: &str| format!("herald_connections_shed_total{{reason=\"{reason}\"}}");
    assert_eq!(
        secret
            .metric(&server, &shed("unauthenticated_per_ip"))
            .await,
        2.0
    );
    assert_eq!(secret.metric(&server, &shed("max_connections")).await, 1.0);
    drop(real);
    server.stop().await;
}

#[tokio::test]
async fn a_slow_http_body_is_cut_at_its_deadline() {
    let server = TestServer::start(Config {
        limits: LimitsConfig {
            body_timeout_secs: 1,
            body_min_bytes_per_sec: 1000,
            ..LimitsConfig::default()
        },
        ..Config::default()
    })
    .await;
    let mut slow = TcpStream::connect(server.addr).await.unwrap();
    slow.write_all(b"POST /api/publish/t HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n")
        .await
        .unwrap();
    // 1,000 bytes earn one more second: the deadline is 2 s after the headers.
    slow.write_all(&[b'a'; 1000]).await.unwrap();
    let started = Instant::now();
    let (closed, said) = closed_within(&mut slow, Duration::from_secs(5)).await;
    let took = started.elapsed();
    let said = String::from_utf8_lossy(&said);
    assert!(closed, "still open after 5 s: {said}");
    assert!(said.starts_with("HTTP/1.1 408"), "{said}");
    assert!(said.contains("body_timeout"), "{said}");
    assert!(took >= Duration::from_millis(1500), "{took:?}");
    // A body that keeps up is not cut.
    let body = vec![b'b'; 3000];
    let (status, _) = http(server.addr, "POST", "/api/publish/t", &[], &body).await;
    assert_eq!(status, 200);
    assert_eq!(
        server
            .metric("herald_request_errors_total{code=\"body_timeout\"}")
            .await,
        1.0
    );
    server.stop().await;
}

/// A server whose partly received bytes budget is 1 MiB, 700 KiB of it held by a WebSocket
/// (returned) in the middle of a 900 KiB frame: finishing the frame frees it.
async fn budget_mostly_held() -> (TestServer, TcpStream) {
    let server = TestServer::start(Config {
        limits: LimitsConfig {
            max_partial_bytes: 1 << 20,
            ..LimitsConfig::default()
        },
        ..Config::default()
    })
    .await;
    let mut a = TcpStream::connect(server.addr).await.unwrap();
    raw_upgrade(&mut a, "").await;
    a.write_all(&client_frame(0x2, true, 900 << 10))
        .await
        .unwrap();
    a.write_all(&vec![0u8; 700 << 10]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    (server, a)
}

#[tokio::test]
async fn partly_received_messages_and_bodies_share_a_server_wide_budget() {
    let (server, mut a) = budget_mostly_held().await;
    // B's 700 KiB would take the server past 1 MiB: closed 1013.
    let mut b = TcpStream::connect(server.addr).await.unwrap();
    raw_upgrade(&mut b, "").await;
    b.write_all(&client_frame(0x2, false, 400 << 10))
        .await
        .unwrap();
    b.write_all(&vec![0u8; 400 << 10]).await.unwrap();
    let _ = b.write_all(&client_frame(0x0, true, 300 << 10)).await;
    let _ = b.write_all(&vec![0u8; 300 << 10]).await;
    let (closed, said) = closed_within(&mut b, Duration::from_secs(3)).await;
    assert!(closed);
    assert_eq!(close_code(&said), Some(1013));
    // So is an HTTP body of that size: 503.
    let body = vec![b'c'; 700 << 10];
    let (status, reply) = http(server.addr, "POST", "/api/publish/t", &[], &body).await;
    assert_eq!(status, 503, "{reply}");
    assert!(reply.contains("server_busy"), "{reply}");
    // Once A's frame is whole, the budget is free again.
    a.write_all(&vec![0u8; 200 << 10]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, reply) = http(server.addr, "POST", "/api/publish/t", &[], &body).await;
    assert_eq!(status, 200, "{reply}");
    // Counted when B's session ends, after its close (it waits up to the grace for B's).
    let deadline = Instant::now() + Duration::from_secs(8);
    while server
        .metric("herald_disconnects_total{reason=\"server_busy\"}")
        .await
        < 1.0
    {
        assert!(Instant::now() < deadline, "not counted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        server
            .metric("herald_request_errors_total{code=\"server_busy\"}")
            .await,
        1.0
    );
    server.stop().await;
}

/// A VBDS subscriber's socket shares the budget: a message it never finishes cannot hold more
/// than the server allows.
#[tokio::test]
async fn a_vbds_subscriber_shares_the_partial_bytes_budget() {
    let (server, _a) = budget_mostly_held().await;
    let (status, reply) = http(server.addr, "POST", "/vbds/admin/streams/cam", &[], &[]).await;
    assert_eq!(status, 200, "{reply}");
    let mut vbds = TcpStream::connect(server.addr).await.unwrap();
    raw_upgrade_at(&mut vbds, "/vbds/access/streams/cam").await;
    vbds.write_all(&client_frame(0x2, true, 700 << 10))
        .await
        .unwrap();
    let _ = vbds.write_all(&vec![0u8; 700 << 10]).await;
    let (closed, said) = closed_within(&mut vbds, Duration::from_secs(3)).await;
    assert!(closed);
    assert_eq!(close_code(&said), Some(1013));
    server.stop().await;
}

#[tokio::test]
async fn a_ping_flood_that_reads_no_pongs_is_cut_like_a_rate_limit() {
    let server = TestServer::start(Config {
        limits: LimitsConfig {
            // Pings count toward the frame rate too; this test is about the pongs owed.
            max_messages_per_sec: 0,
            max_bytes_per_sec: 0,
            ..LimitsConfig::default()
        },
        ..Config::default()
    })
    .await;
    let mut flooder = TcpStream::connect(server.addr).await.unwrap();
    raw_upgrade(&mut flooder, "").await;
    // 125-byte pings, never reading a pong: once the socket's buffers are full, pongs queue.
    let mut ping = client_frame(0x9, true, 125);
    ping.extend_from_slice(&[7u8; 125]);
    let pings: Vec<u8> = ping
        .iter()
        .copied()
        .cycle()
        .take(ping.len() * 512)
        .collect();
    let (_read, mut write) = flooder.into_split();
    let writer = tokio::spawn(async move {
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(20) {
            match tokio::time::timeout(Duration::from_secs(1), write.write_all(&pings)).await {
                Ok(Ok(())) => {}
                _ => break, // the server stopped reading or closed
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    while server
        .metric("herald_disconnects_total{reason=\"rate_limited\"}")
        .await
        < 1.0
    {
        assert!(Instant::now() < deadline, "the ping flood was never cut");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    writer.abort();
    assert!(
        server
            .metric("herald_request_errors_total{code=\"rate_limited\"}")
            .await
            >= 1.0
    );
    server.stop().await;
}

#[tokio::test]
async fn pings_count_toward_the_frame_rate() {
    let server = TestServer::start(Config {
        limits: LimitsConfig {
            max_messages_per_sec: 50,
            ..LimitsConfig::default()
        },
        ..Config::default()
    })
    .await;
    let mut client = server.connect().await;
    for _ in 0..100 {
        if client.send(Message::Ping(vec![1].into())).await.is_err() {
            break;
        }
    }
    let frame = close_frame(&mut client).await.expect("a close frame");
    assert_eq!(u16::from(frame.code), 1008);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quiet_clients_that_answer_pings_stay_with_idle_at_twice_the_ping_interval() {
    let server = TestServer::start(Config {
        limits: LimitsConfig {
            ping_interval_secs: 1,
            idle_timeout_secs: 2,
            ..LimitsConfig::default()
        },
        ..Config::default()
    })
    .await;
    // Twenty clients that send nothing after subscribing and answer every ping (tungstenite
    // does while it is read).
    let mut readers = Vec::new();
    for _ in 0..20 {
        let mut client = server.connect().await;
        subscribe(&mut client, "quiet").await;
        readers.push(tokio::spawn(async move {
            let started = Instant::now();
            let mut pings = 0;
            while started.elapsed() < Duration::from_secs(7) {
                match tokio::time::timeout(Duration::from_millis(200), client.next()).await {
                    Err(_) => continue,
                    Ok(Some(Ok(Message::Ping(_)))) => pings += 1,
                    Ok(Some(Ok(Message::Close(frame)))) => {
                        return Err(format!("closed: {frame:?}"))
                    }
                    Ok(Some(Ok(_))) => {}
                    Ok(other) => return Err(format!("ended: {other:?}")),
                }
            }
            Ok(pings)
        }));
    }
    for reader in readers {
        let pings = reader
            .await
            .unwrap()
            .expect("a live quiet client is never closed");
        assert!(pings >= 4, "pinged every interval: {pings} pings in 7 s");
    }
    assert_eq!(
        server
            .metric("herald_disconnects_total{reason=\"idle\"}")
            .await,
        0.0
    );
    server.stop().await;
}

#[tokio::test]
async fn a_client_still_writing_gets_the_rate_limit_error_and_close_code() {
    let server = TestServer::start(Config {
        limits: LimitsConfig {
            max_messages_per_sec: 20,
            ..LimitsConfig::default()
        },
        ..Config::default()
    })
    .await;
    for round in 0..3 {
        let client = server.connect().await;
        let (mut sink, mut stream) = client.split();
        // Keeps writing publishes as fast as it can, whatever happens.
        let writer = tokio::spawn(async move {
            let frame = json!({"op": "pub", "topic": "t", "data": "x"}).to_string();
            for _ in 0..20_000 {
                if sink.send(Message::text(frame.clone())).await.is_err() {
                    return;
                }
            }
        });
        let (mut error, mut code) = (None, None);
        while let Ok(Some(frame)) = tokio::time::timeout(WAIT, stream.next()).await {
            match frame {
                Ok(Message::Text(t)) => {
                    let v: serde_json::Value = serde_json::from_str(&t).unwrap();
                    if v["op"] == "error" {
                        error = Some(v["code"].as_str().unwrap().to_owned());
                    }
                }
                Ok(Message::Close(frame)) => {
                    code = frame.map(|f| u16::from(f.code));
                    break;
                }
                Ok(_) => {}
                Err(e) => panic!("round {round}: the connection failed before its close: {e}"),
            }
        }
        writer.abort();
        assert_eq!(error.as_deref(), Some("rate_limited"), "round {round}");
        assert_eq!(code, Some(1008), "round {round}");
    }
    server.stop().await;
}

#[tokio::test]
async fn http_publish_refuses_other_origins_and_is_rate_limited_per_ip() {
    let server = TestServer::start(Config {
        limits: LimitsConfig {
            exempt_ips: vec![],
            http_publish_rate_per_ip: 0.1,
            http_publish_burst_per_ip: 5,
            ..LimitsConfig::default()
        },
        ..Config::default()
    })
    .await;
    let post = |origin: Option<&'static str>| {
        let addr = server.addr;
        async move {
            let headers: Vec<(&str, &str)> = origin.map(|o| ("Origin", o)).into_iter().collect();
            http(addr, "POST", "/api/publish/t", &headers, b"hi").await
        }
    };
    // A page on another site (auth is off, no allowed_origins): refused, without publishing.
    let (status, reply) = post(Some("https://evil.example")).await;
    assert_eq!(status, 403, "{reply}");
    assert!(reply.contains("origin_not_allowed"), "{reply}");
    // The server's own origin (Host: test), and clients that send no Origin, pass.
    for origin in [Some("http://test"), None, None] {
        let (status, reply) = post(origin).await;
        assert_eq!(status, 200, "{origin:?}: {reply}");
    }
    // Five publishes in a burst, one a second after: the rest are 429 `rate_limited`.
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(post(None).await.0);
    }
    assert_eq!(
        statuses.iter().filter(|&&s| s == 200).count(),
        2,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|&&s| s == 429).count(),
        2,
        "{statuses:?}"
    );
    assert_eq!(
        server
            .metric("herald_request_errors_total{code=\"origin_not_allowed\"}")
            .await,
        1.0
    );
    assert_eq!(
        server
            .metric("herald_request_errors_total{code=\"rate_limited\"}")
            .await,
        2.0
    );
    server.stop().await;
}

#[tokio::test]
async fn a_real_client_gets_in_when_unauthenticated_websockets_fill_every_place() {
    let secret = Secret::new("full");
    let server = TestServer::start(Config {
        max_connections: 6,
        auth: secret.auth(),
        limits: LimitsConfig {
            exempt_ips: vec![[127, 0, 0, 1].into()],
            ..LimitsConfig::default()
        },
        ..Config::default()
    })
    .await;
    let mut silent = Vec::new();
    for _ in 0..6 {
        let mut s = connect_from(server.addr).await.unwrap();
        raw_upgrade(&mut s, "").await;
        silent.push(s);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Each real client takes the place of the oldest silent socket, and keeps it.
    let mut real = Vec::new();
    for _ in 0..3 {
        let url = format!("{}?token={}", server.url(), secret.token());
        let (mut client, _) = tokio_tungstenite::connect_async(url)
            .await
            .expect("admitted");
        subscribe(&mut client, "x").await;
        real.push(client);
    }
    for (i, s) in silent.iter_mut().enumerate() {
        let (closed, said) = closed_within(s, Duration::from_millis(500)).await;
        assert_eq!(closed, i < 3, "socket {i}");
        if closed {
            assert_eq!(close_code(&said), Some(1013), "socket {i}");
        }
    }
    drop(real);
    server.stop().await;
}
