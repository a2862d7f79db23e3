//! A herald server on an ephemeral loopback port, and a WebSocket client to talk to it.
#![allow(dead_code)] // each test file uses its own subset

use futures_util::{SinkExt, StreamExt};
use herald_server::{Config, Server};
use serde_json::Value;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

pub mod stall;

pub type Client = WebSocketStream<MaybeTlsStream<TcpStream>>;

pub const WAIT: Duration = Duration::from_secs(5);

pub struct TestServer {
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<anyhow::Result<()>>,
}

impl TestServer {
    pub async fn start(config: Config) -> TestServer {
        let config = Config {
            listen: "127.0.0.1:0".parse().unwrap(),
            ..config
        };
        let server = Server::bind(config).await.expect("bind");
        let addr = server.local_addr();
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(server.run(async {
            let _ = stopped.await;
        }));
        TestServer {
            addr,
            stop: Some(stop),
            task,
        }
    }

    pub fn url(&self) -> String {
        format!("ws://{}/ws", self.addr)
    }

    pub fn http(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub async fn connect(&self) -> Client {
        let (client, _) = tokio_tungstenite::connect_async(self.url())
            .await
            .expect("connect");
        client
    }

    /// Stops the server as SIGTERM would, and waits for it to finish.
    pub async fn stop(mut self) {
        self.stop.take().unwrap().send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("server stops")
            .unwrap()
            .unwrap();
    }

    /// The value of one metric series in `/metrics` (0 when absent).
    pub async fn metric(&self, series: &str) -> f64 {
        let text = http_get(self.addr, "/metrics").await;
        text.lines()
            .find_map(|l| {
                l.strip_prefix(series)
                    .and_then(|rest| rest.strip_prefix(' '))
            })
            .map_or(0.0, |v| v.parse().unwrap())
    }
}

/// A minimal HTTP/1.1 GET over a raw socket (keeps the test dependencies to the WebSocket client).
pub async fn http_get(addr: SocketAddr, path: &str) -> String {
    http(addr, "GET", path, &[], &[]).await.1
}

/// One series of `/metrics`, fetched with `admin_key` (0 when absent).
pub async fn metric(addr: SocketAddr, admin_key: &str, series: &str) -> f64 {
    let admin = format!("Bearer {admin_key}");
    let (_, text) = http(addr, "GET", "/metrics", &[("Authorization", &admin)], &[]).await;
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map_or(0.0, |v| v.parse().unwrap())
}

/// Sends one HTTP/1.1 request; returns (status, body).
pub async fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req += &format!("{k}: {v}\r\n");
    }
    req += "\r\n";
    s.write_all(req.as_bytes()).await.unwrap();
    let _ = s.write_all(body).await; // the server may answer (413) before reading it all
    let mut out = Vec::new();
    tokio::time::timeout(WAIT, s.read_to_end(&mut out))
        .await
        .expect("HTTP reply")
        .ok();
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map_or(String::new(), |(_, b)| b.to_owned());
    (status, body)
}

pub async fn send(client: &mut Client, json: Value) {
    client.send(Message::text(json.to_string())).await.unwrap();
}

/// The next frame, which must arrive within `WAIT`.
pub async fn next(client: &mut Client) -> Message {
    tokio::time::timeout(WAIT, client.next())
        .await
        .expect("a frame within the wait")
        .expect("stream open")
        .expect("valid frame")
}

/// The next text frame as JSON.
pub async fn recv_json(client: &mut Client) -> Value {
    match next(client).await {
        Message::Text(t) => serde_json::from_str(&t).unwrap(),
        other => panic!("expected a text frame, got {other:?}"),
    }
}

/// Subscribes and waits for the `subscribed` reply.
pub async fn subscribe(client: &mut Client, pattern: &str) {
    send(
        client,
        serde_json::json!({"op": "sub", "id": 0, "topic": pattern}),
    )
    .await;
    let reply = recv_json(client).await;
    assert_eq!(reply["op"], "subscribed", "{reply}");
}

/// Reads until the server closes; returns its close frame.
pub async fn close_frame(client: &mut Client) -> Option<CloseFrame> {
    loop {
        match tokio::time::timeout(WAIT, client.next())
            .await
            .expect("close within the wait")
        {
            Some(Ok(Message::Close(frame))) => return frame,
            Some(Ok(_)) => continue,
            Some(Err(e)) => panic!("connection failed before a close frame: {e}"),
            None => return None,
        }
    }
}

/// A binary publish frame: header length, JSON header, payload.
pub fn binary_publish(header: Value, payload: &[u8]) -> Message {
    let head = header.to_string();
    let mut frame = (head.len() as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(head.as_bytes());
    frame.extend_from_slice(payload);
    Message::binary(frame)
}

/// Splits a delivered binary frame into its JSON header and payload.
pub fn split_binary(frame: &[u8]) -> (Value, Vec<u8>) {
    let (head, at) = herald_core::wire::split_binary(frame).unwrap();
    (serde_json::from_str(head).unwrap(), frame[at..].to_vec())
}
