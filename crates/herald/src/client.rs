//! The native-protocol client shared by `pub` and `sub`, on tokio-tungstenite.

use anyhow::{anyhow, bail, Context};
use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

pub type Socket = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// What the server sent, decoded.
pub enum Incoming {
    /// A delivered message: its JSON header (or whole JSON, for text) and payload bytes.
    Message {
        header: Value,
        payload: Vec<u8>,
        binary: bool,
    },
    /// Any other server object (replies, errors, drop notices).
    Control(Value),
    /// The server closed the connection.
    Closed(String),
}

/// Connects, presenting `token` (if any) as `Authorization: Bearer`.
pub async fn connect(url: &str, token: Option<&str>) -> anyhow::Result<Socket> {
    let mut request = url
        .into_client_request()
        .with_context(|| format!("{url} is not a WebSocket URL (ws://host:port/ws)"))?;
    if let Some(token) = token {
        let value = format!("Bearer {token}")
            .parse()
            .context("the token is not valid in an HTTP header")?;
        request.headers_mut().insert("authorization", value);
    }
    let mut config = WebSocketConfig::default();
    // Images may be large: let the server's own limit decide.
    config.max_message_size = Some(1 << 30);
    config.max_frame_size = Some(1 << 30);
    let (socket, _) = tokio_tungstenite::connect_async_with_config(request, Some(config), true)
        .await
        .with_context(|| {
            format!("cannot connect to {url}; is herald running there? (set --url or HERALD_URL)")
        })?;
    Ok(socket)
}

pub async fn send_json(socket: &mut Socket, value: &Value) -> anyhow::Result<()> {
    socket
        .send(Message::text(value.to_string()))
        .await
        .context("connection lost while sending")
}

/// The next thing the server says.
pub async fn next(socket: &mut Socket) -> anyhow::Result<Incoming> {
    loop {
        let Some(frame) = socket.next().await else {
            return Ok(Incoming::Closed("connection ended".into()));
        };
        match frame.context("connection failed")? {
            Message::Text(text) => {
                let value: Value =
                    serde_json::from_str(&text).context("server sent invalid JSON")?;
                if value["op"] == "msg" {
                    let data = value["data"]
                        .as_str()
                        .unwrap_or_default()
                        .as_bytes()
                        .to_vec();
                    return Ok(Incoming::Message {
                        header: value,
                        payload: data,
                        binary: false,
                    });
                }
                return Ok(Incoming::Control(value));
            }
            Message::Binary(bytes) => {
                let (head, at) = herald_core::wire::split_binary(&bytes)
                    .map_err(|e| anyhow!("{}", e.message))?;
                let header: Value =
                    serde_json::from_str(head).context("server sent an invalid binary header")?;
                return Ok(Incoming::Message {
                    header,
                    payload: bytes[at..].to_vec(),
                    binary: true,
                });
            }
            Message::Close(frame) => {
                let why = frame.map_or("no reason given".into(), |f| {
                    format!("code {}: {}", u16::from(f.code), f.reason)
                });
                return Ok(Incoming::Closed(why));
            }
            _ => continue,
        }
    }
}

/// Fails with the server's own words when `reply` is an error.
pub fn check(reply: &Value) -> anyhow::Result<()> {
    if reply["op"] == "error" {
        bail!(
            "the server refused: {}: {}",
            reply["code"].as_str().unwrap_or("?"),
            reply["message"].as_str().unwrap_or("(no message)")
        );
    }
    Ok(())
}
