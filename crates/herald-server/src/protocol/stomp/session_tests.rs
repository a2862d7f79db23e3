//! The STOMP session and codec on a real node, over a real STOMP listener on 127.0.0.1: frames
//! in, requests carried out by the engine, and the bytes herald sends read back.

use super::session::{Settings, StompSession};
use crate::connection::Framing;
use crate::listener;
use crate::node::Node;
use crate::Config;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

struct Client {
    io: TcpStream,
    /// The server closed the connection.
    ended: bool,
}

impl Client {
    async fn new(addr: SocketAddr) -> Client {
        let io = TcpStream::connect(addr).await.unwrap();
        Client { io, ended: false }
    }

    async fn send(&mut self, bytes: &[u8]) {
        self.io.write_all(bytes).await.unwrap();
    }

    /// Everything the server sends until it is quiet for a moment or closes.
    async fn received(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            let read = tokio::time::timeout(Duration::from_millis(150), self.io.read(&mut chunk));
            match read.await {
                Ok(Ok(0)) | Ok(Err(_)) => {
                    self.ended = true;
                    return out;
                }
                Ok(Ok(n)) => out.extend_from_slice(&chunk[..n]),
                Err(_) => return out,
            }
        }
    }

    /// What the server sends before it closes the connection (within 5 s).
    async fn until_closed(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            let read = tokio::time::timeout(Duration::from_secs(5), self.io.read(&mut chunk));
            match read.await.expect("the server closes within 5 s") {
                Ok(0) | Err(_) => return out,
                Ok(n) => out.extend_from_slice(&chunk[..n]),
            }
        }
    }

    async fn connect(&mut self) {
        self.send(b"CONNECT\naccept-version:1.2\nhost:h\n\n\0")
            .await;
        let got = self.received().await;
        assert!(
            got.starts_with(b"CONNECTED\nversion:1.2\n"),
            "{}",
            text(&got)
        );
    }
}

/// A node serving STOMP on a port of its own until the test ends, with `config`; its address.
async fn serve(config: Config) -> SocketAddr {
    let tcp = listener::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = tcp.local_addr().unwrap();
    let node = Node::new(Config {
        stomp_listen: Some(addr),
        ..config
    })
    .unwrap();
    tokio::spawn(async move {
        let stomp =
            |node: &Arc<Node>| StompSession::new(Settings::of(&node.config), Framing::Stream);
        listener::serve_stream(tcp, node, stomp, std::future::pending()).await
    });
    addr
}

async fn node() -> SocketAddr {
    serve(Config::default()).await
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).replace('\0', "^@")
}

/// The frames in `bytes` (each ended by its NUL), as text with `^@` for NULs inside.
fn frames(bytes: &[u8]) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = bytes;
    while !rest.is_empty() {
        let head_end = rest.windows(2).position(|w| w == b"\n\n").unwrap() + 2;
        let head = std::str::from_utf8(&rest[..head_end]).unwrap();
        let len = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .map(|n| n.parse::<usize>().unwrap())
            .unwrap_or_else(|| rest[head_end..].iter().position(|b| *b == 0).unwrap());
        assert_eq!(rest[head_end + len], 0, "frame ends in NUL");
        out.push(text(&rest[..head_end + len]));
        rest = &rest[head_end + len + 1..];
    }
    out
}

#[tokio::test]
async fn a_frame_before_connect_is_an_error_then_the_close() {
    let addr = node().await;
    let mut c = Client::new(addr).await;
    c.send(b"SEND\ndestination:/topic/a\nreceipt:7\n\nhi\0")
        .await;
    let got = frames(&c.until_closed().await);
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(
        got[0].starts_with("ERROR\nmessage:SEND before CONNECT"),
        "{got:?}"
    );
    assert!(got[0].contains("receipt-id:7\n"), "{got:?}");
}

#[tokio::test]
async fn connect_negotiates_version_and_heart_beats() {
    let addr = node().await;
    let mut c = Client::new(addr).await;
    c.send(b"STOMP\naccept-version:1.0,1.1\nheart-beat:1000,60000\n\n\0")
        .await;
    let got = frames(&c.received().await);
    let ping = Config::default().limits.ping_interval_secs * 1000;
    assert!(
        got[0].starts_with(&format!(
            "CONNECTED\nversion:1.1\nheart-beat:{ping},{ping}\n"
        )),
        "{got:?}"
    );

    let mut refused = Client::new(addr).await;
    refused.send(b"CONNECT\naccept-version:2.0\n\n\0").await;
    let got = frames(&refused.until_closed().await);
    assert!(got[0].contains("version:1.0,1.1,1.2\n"), "{got:?}");
}

/// herald beats at the negotiated interval even while the client beats faster: the client
/// watches herald's beats, not its own.
#[tokio::test]
async fn herald_beats_while_the_client_beats_faster() {
    let mut config = Config::default();
    config.limits.ping_interval_secs = 1;
    let addr = serve(config).await;
    let mut c = Client::new(addr).await;
    c.send(b"CONNECT\naccept-version:1.2\nheart-beat:1000,1000\n\n\0")
        .await;
    let connected = c.received().await;
    assert!(
        connected.starts_with(b"CONNECTED\nversion:1.2\nheart-beat:1000,1000\n"),
        "{}",
        text(&connected)
    );
    let mut beats = 0;
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_millis(2600) {
        c.send(b"\n").await;
        beats += c.received().await.iter().filter(|b| **b == b'\n').count();
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    assert!(!c.ended, "a client that beats stays connected");
    assert!((2..=4).contains(&beats), "{beats} beats in 2.6 s at 1 s");
}

#[tokio::test]
async fn a_client_silent_past_its_heart_beat_is_closed() {
    let mut config = Config::default();
    config.limits.ping_interval_secs = 1;
    let addr = serve(config).await;
    let mut c = Client::new(addr).await;
    c.send(b"CONNECT\naccept-version:1.2\nheart-beat:1000,0\n\n\0")
        .await;
    let started = std::time::Instant::now();
    let got = c.until_closed().await;
    assert!(got.starts_with(b"CONNECTED\n"), "{}", text(&got));
    let after = started.elapsed();
    assert!(
        after >= Duration::from_millis(1900) && after < Duration::from_millis(3000),
        "closed after {after:?}, two of the client's 1 s intervals"
    );
}

#[tokio::test]
async fn a_send_reaches_every_matching_subscription_with_its_receipt() {
    let addr = node().await;
    let mut c = Client::new(addr).await;
    c.connect().await;
    c.send(b"SUBSCRIBE\nid:s1\ndestination:/topic/a/b\nreceipt:r1\n\n\0SUBSCRIBE\nid:s2\ndestination:/topic/a/*\n\n\0")
        .await;
    let got = frames(&c.received().await);
    assert!(
        got[0].starts_with("RECEIPT\nreceipt-id:r1\ncursor:"),
        "{got:?}"
    );
    assert_eq!(got.len(), 1, "{got:?}");

    let body = b"bin\0ary\xff";
    let mut send = b"SEND\ndestination:/topic/a/b\nreceipt:r2\ncontent-type:application/octet-stream\ncontent-length:8\n\n".to_vec();
    send.extend_from_slice(body);
    send.push(0);
    c.send(&send).await;
    let raw = c.received().await;
    let got = frames(&raw);
    assert_eq!(got.len(), 3, "{got:?}");
    for (frame, sub) in got.iter().zip(["s1", "s2"]) {
        assert!(
            frame.starts_with(&format!(
                "MESSAGE\nsubscription:{sub}\nmessage-id:1\ndestination:/topic/a/b\ncontent-type:application/octet-stream\ncontent-length:8\nseq:1\nepoch:"
            )),
            "{frame}"
        );
        assert!(frame.ends_with(&text(body)), "{frame}");
    }
    assert_eq!(got[2], "RECEIPT\nreceipt-id:r2\n\n");
}

#[tokio::test]
async fn client_acks_return_credit_and_nack_does_not_redeliver() {
    let addr = node().await;
    let mut c = Client::new(addr).await;
    c.connect().await;
    c.send(b"SUBSCRIBE\nid:s\ndestination:/topic/q\nack:client\nprefetch-count:2\n\n\0")
        .await;
    c.received().await;
    c.send(b"SEND\ndestination:/topic/q\n\none\0SEND\ndestination:/topic/q\n\ntwo\0")
        .await;
    let got = frames(&c.received().await);
    assert_eq!(got.len(), 2, "{got:?}");
    assert!(
        got[0].starts_with("MESSAGE\nsubscription:s\nack:s\\c1\nmessage-id:1\n"),
        "{got:?}"
    );
    // A cumulative ACK of the second message returns both credits.
    c.send(b"ACK\nid:s:2\nreceipt:a\n\n\0").await;
    assert_eq!(frames(&c.received().await), ["RECEIPT\nreceipt-id:a\n\n"]);
    c.send(b"NACK\nid:s:2\n\n\0ACK\nid:nosuch:1\n\n\0").await;
    let got = frames(&c.until_closed().await);
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(
        got[0].starts_with("ERROR\nmessage:no subscription with id \"nosuch\""),
        "{got:?}"
    );
}

#[tokio::test]
async fn refusals_name_the_frame_and_close() {
    let addr = node().await;
    for (frame, says) in [
        (
            &b"SUBSCRIBE\nid:1\ndestination:/queue/jobs\nreceipt:q\n\n\0"[..],
            "herald has topics only",
        ),
        (
            b"SEND\ndestination:/topic/a/*\nreceipt:q\n\nx\0",
            "destination",
        ),
        (
            b"SUBSCRIBE\nid:1\ndestination:/topic/a\nack:sometimes\nreceipt:q\n\n\0",
            "ack must be",
        ),
        (b"COMMIT\ntransaction:t\nreceipt:q\n\n\0", "no transaction"),
        (b"FROB\nreceipt:q\n\n\0", "unknown command"),
    ] {
        let mut c = Client::new(addr).await;
        c.connect().await;
        c.send(frame).await;
        let got = frames(&c.until_closed().await);
        assert!(got[0].starts_with("ERROR\n"), "{got:?}");
        assert!(got[0].contains(says), "{got:?}");
        if !frame.starts_with(b"FROB") {
            assert!(got[0].contains("receipt-id:q\n"), "{got:?}");
        }
    }
}

#[tokio::test]
async fn a_transaction_publishes_on_commit_and_nothing_on_abort() {
    let addr = node().await;
    let mut c = Client::new(addr).await;
    c.connect().await;
    c.send(b"SUBSCRIBE\nid:s\ndestination:/topic/t\n\n\0").await;
    c.received().await;
    c.send(b"BEGIN\ntransaction:x\n\n\0SEND\ndestination:/topic/t\ntransaction:x\n\nkept\0BEGIN\ntransaction:y\n\n\0SEND\ndestination:/topic/t\ntransaction:y\n\ngone\0")
        .await;
    assert!(c.received().await.is_empty());
    c.send(b"ABORT\ntransaction:y\n\n\0COMMIT\ntransaction:x\nreceipt:c\n\n\0")
        .await;
    let got = frames(&c.received().await);
    assert_eq!(got.len(), 2, "{got:?}");
    assert!(got[0].ends_with("\n\nkept"), "{got:?}");
    assert_eq!(got[1], "RECEIPT\nreceipt-id:c\n\n");
}

#[tokio::test]
async fn disconnect_answers_its_receipt_then_closes() {
    let addr = node().await;
    let mut c = Client::new(addr).await;
    c.connect().await;
    c.send(b"DISCONNECT\nreceipt:bye\n\n\0SEND\ndestination:/topic/t\n\nignored\0")
        .await;
    let got = c.until_closed().await;
    assert_eq!(frames(&got), ["RECEIPT\nreceipt-id:bye\n\n"]);
}
