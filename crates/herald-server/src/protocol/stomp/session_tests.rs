//! The STOMP session and codec on a real node and connection: frames in through
//! [`Protocol::input`], requests carried out by the engine, and the bytes the connection's
//! writer would send read back. (Transports are tested over real sockets in tests/.)

use super::codec::Framing;
use super::session::{Settings, StompSession};
use crate::auth::Access;
use crate::connection::{Connection, QueueLimits};
use crate::metrics::Disconnect;
use crate::node::Node;
use crate::session::{Context, Input, Protocol};
use crate::Config;
use bytes::Bytes;
use herald_core::engine::ConnId;
use std::sync::Arc;
use std::time::Duration;

struct Client {
    node: Arc<Node>,
    conn: Arc<Connection>,
    id: ConnId,
    access: Access,
    session: StompSession,
}

impl Client {
    fn new(node: &Arc<Node>) -> Client {
        let session = StompSession::new(Settings::of(&node.config), Framing::Stream);
        let conn = Connection::speaking(
            session.codec(),
            QueueLimits::both(1 << 20),
            node.metrics.clone(),
        );
        let id = node.engine.lock().connect(conn.clone());
        Client {
            node: node.clone(),
            conn,
            id,
            access: Access::new(None, Duration::from_secs(5)),
            session,
        }
    }

    /// Feeds `bytes` and carries out the requests they asked for, as the session would.
    fn send(&mut self, bytes: &[u8]) -> Result<(), Disconnect> {
        let mut cx = Context {
            node: &self.node,
            id: self.id,
            conn: &self.conn,
            access: &mut self.access,
            socket: None,
            requests: Vec::new(),
            now_us: 0,
        };
        let result = self
            .session
            .input(&mut cx, Input::Bytes(Bytes::copy_from_slice(bytes)));
        for request in std::mem::take(&mut cx.requests) {
            let _ = self.node.engine.lock().handle(self.id, request, 0);
        }
        result
    }

    /// Everything queued for the client so far.
    async fn received(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let mut batch = Vec::new();
        while let Ok(closed) =
            tokio::time::timeout(Duration::from_millis(20), self.conn.next_frames(&mut batch)).await
        {
            out.extend(batch.drain(..).flat_map(|f| f.to_vec()));
            if closed {
                break;
            }
        }
        out
    }

    async fn connect(&mut self) {
        self.send(b"CONNECT\naccept-version:1.2\nhost:h\n\n\0")
            .unwrap();
        let got = self.received().await;
        assert!(
            got.starts_with(b"CONNECTED\nversion:1.2\n"),
            "{}",
            text(&got)
        );
    }
}

fn node() -> Arc<Node> {
    Node::new(Config::default()).unwrap()
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
    let node = node();
    let mut c = Client::new(&node);
    let why = c
        .send(b"SEND\ndestination:/topic/a\nreceipt:7\n\nhi\0")
        .unwrap_err();
    assert_eq!(why, Disconnect::ProtocolError);
    let got = frames(&c.received().await);
    assert!(
        got[0].starts_with("ERROR\nmessage:SEND before CONNECT"),
        "{got:?}"
    );
    assert!(got[0].contains("receipt-id:7\n"), "{got:?}");
}

#[tokio::test]
async fn connect_negotiates_version_and_heart_beats() {
    let node = node();
    let mut c = Client::new(&node);
    c.send(b"STOMP\naccept-version:1.0,1.1\nheart-beat:1000,60000\n\n\0")
        .unwrap();
    let got = frames(&c.received().await);
    assert!(
        got[0].starts_with("CONNECTED\nversion:1.1\nheart-beat:"),
        "{got:?}"
    );
    let keepalive = c.session.keepalive();
    let ping = node.config.limits.ping_interval_secs * 1000;
    assert_eq!(
        keepalive.ping.map(|(every, _)| every),
        Some(Duration::from_millis(ping.max(60_000)))
    );
    assert_eq!(keepalive.idle, Duration::from_millis(2 * ping.max(1000)));

    let mut refused = Client::new(&node);
    refused
        .send(b"CONNECT\naccept-version:2.0\n\n\0")
        .unwrap_err();
    let got = frames(&refused.received().await);
    assert!(got[0].contains("version:1.0,1.1,1.2\n"), "{got:?}");
}

#[tokio::test]
async fn a_send_reaches_every_matching_subscription_with_its_receipt() {
    let node = node();
    let mut c = Client::new(&node);
    c.connect().await;
    c.send(b"SUBSCRIBE\nid:s1\ndestination:/topic/a/b\nreceipt:r1\n\n\0SUBSCRIBE\nid:s2\ndestination:/topic/a/*\n\n\0")
        .unwrap();
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
    c.send(&send).unwrap();
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
    let node = node();
    let mut c = Client::new(&node);
    c.connect().await;
    c.send(b"SUBSCRIBE\nid:s\ndestination:/topic/q\nack:client\nprefetch-count:2\n\n\0")
        .unwrap();
    c.received().await;
    c.send(b"SEND\ndestination:/topic/q\n\none\0SEND\ndestination:/topic/q\n\ntwo\0")
        .unwrap();
    let got = frames(&c.received().await);
    assert_eq!(got.len(), 2, "{got:?}");
    assert!(
        got[0].starts_with("MESSAGE\nsubscription:s\nack:s\\c1\nmessage-id:1\n"),
        "{got:?}"
    );
    // A cumulative ACK of the second message returns both credits.
    c.send(b"ACK\nid:s:2\nreceipt:a\n\n\0").unwrap();
    assert_eq!(frames(&c.received().await), ["RECEIPT\nreceipt-id:a\n\n"]);
    c.send(b"NACK\nid:s:2\n\n\0ACK\nid:nosuch:1\n\n\0")
        .unwrap_err();
    let got = frames(&c.received().await);
    assert!(
        got[0].starts_with("ERROR\nmessage:no subscription with id \"nosuch\""),
        "{got:?}"
    );
}

#[tokio::test]
async fn refusals_name_the_frame_and_close() {
    let node = node();
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
        let mut c = Client::new(&node);
        c.connect().await;
        assert_eq!(c.send(frame), Err(Disconnect::ProtocolError));
        let got = frames(&c.received().await);
        assert!(got[0].starts_with("ERROR\n"), "{got:?}");
        assert!(got[0].contains(says), "{got:?}");
        if !frame.starts_with(b"FROB") {
            assert!(got[0].contains("receipt-id:q\n"), "{got:?}");
        }
    }
}

#[tokio::test]
async fn a_transaction_publishes_on_commit_and_nothing_on_abort() {
    let node = node();
    let mut c = Client::new(&node);
    c.connect().await;
    c.send(b"SUBSCRIBE\nid:s\ndestination:/topic/t\n\n\0")
        .unwrap();
    c.received().await;
    c.send(b"BEGIN\ntransaction:x\n\n\0SEND\ndestination:/topic/t\ntransaction:x\n\nkept\0BEGIN\ntransaction:y\n\n\0SEND\ndestination:/topic/t\ntransaction:y\n\ngone\0")
        .unwrap();
    assert!(c.received().await.is_empty());
    c.send(b"ABORT\ntransaction:y\n\n\0COMMIT\ntransaction:x\nreceipt:c\n\n\0")
        .unwrap();
    let got = frames(&c.received().await);
    assert_eq!(got.len(), 2, "{got:?}");
    assert!(got[0].ends_with("\n\nkept"), "{got:?}");
    assert_eq!(got[1], "RECEIPT\nreceipt-id:c\n\n");
}

#[tokio::test]
async fn disconnect_answers_its_receipt_then_closes() {
    let node = node();
    let mut c = Client::new(&node);
    c.connect().await;
    c.send(b"DISCONNECT\nreceipt:bye\n\n\0SEND\ndestination:/topic/t\n\nignored\0")
        .unwrap();
    // What follows the RECEIPT is the transport's close (the driver's to frame).
    let got = c.received().await;
    assert!(
        got.starts_with(b"RECEIPT\nreceipt-id:bye\n\n\0"),
        "{}",
        text(&got)
    );
    assert!(!text(&got).contains("MESSAGE"), "{}", text(&got));
    assert_eq!(c.conn.close_reason(), Some(Disconnect::ClientClosed));
}
