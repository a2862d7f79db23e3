//! The native-protocol client shared by `pub` and `sub`, on tokio-tungstenite.

use anyhow::{anyhow, bail, Context};
use futures_util::{SinkExt, StreamExt};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use rustls::{ClientConfig, RootCertStore};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{Connector, MaybeTlsStream, WebSocketStream};

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

/// Where `pub` and `sub` connect, and with which credentials.
#[derive(clap::Args, Debug)]
pub struct ServerArgs {
    /// herald's WebSocket URL (wss:// when herald serves TLS)
    #[arg(long, env = "HERALD_URL", default_value = "ws://127.0.0.1:8080/ws")]
    url: String,
    /// Token to present when herald has authentication on (see `herald token`)
    #[arg(long, env = "HERALD_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// PEM file of the CA certificate(s) to trust for wss:// instead of the public web roots
    /// (for a herald whose certificate a private CA issued)
    #[arg(long, env = "HERALD_CA_FILE", value_name = "PEM")]
    ca_file: Option<PathBuf>,
}

impl ServerArgs {
    /// Connects, presenting the token (if any) as `Authorization: Bearer`.
    pub async fn connect(&self) -> anyhow::Result<Socket> {
        let url = &self.url;
        let mut request = url
            .as_str()
            .into_client_request()
            .with_context(|| format!("{url} is not a WebSocket URL (ws://host:port/ws)"))?;
        if let Some(token) = &self.token {
            let value = format!("Bearer {token}")
                .parse()
                .context("the token is not valid in an HTTP header")?;
            request.headers_mut().insert("authorization", value);
        }
        // Only a wss:// URL needs roots; reading them for ws:// would only add failure modes.
        let (connector, hint) = match request.uri().scheme_str() {
            Some("wss") => (
                Some(Connector::Rustls(tls_config(self.ca_file.as_deref())?)),
                "is herald running there, with a certificate from a CA you trust? \
                 (set --url or HERALD_URL, --ca-file or HERALD_CA_FILE)",
            ),
            _ => (None, "is herald running there? (set --url or HERALD_URL)"),
        };
        let mut config = WebSocketConfig::default();
        // Images may be large: let the server's own limit decide.
        config.max_message_size = Some(1 << 30);
        config.max_frame_size = Some(1 << 30);
        let (socket, _) = tokio_tungstenite::connect_async_tls_with_config(
            request,
            Some(config),
            true,
            connector,
        )
        .await
        .with_context(|| format!("cannot connect to {url}; {hint}"))?;
        Ok(socket)
    }
}

/// The TLS client configuration for wss://: the certificates in `ca_file` when given (like
/// curl's `--cacert`, they replace the public roots, so a private CA vouches only for its own
/// servers), else the Mozilla roots compiled in by webpki-roots (the same on every machine,
/// nothing to install). rustls with ring, as herald's own listener uses.
fn tls_config(ca_file: Option<&Path>) -> anyhow::Result<Arc<ClientConfig>> {
    let mut roots = RootCertStore::empty();
    match ca_file {
        Some(path) => {
            let certs = CertificateDer::pem_file_iter(path)
                .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
                .with_context(|| format!("cannot read CA certificates from {}", path.display()))?;
            if certs.is_empty() {
                bail!("{} holds no PEM certificate", path.display());
            }
            for cert in certs {
                roots.add(cert).with_context(|| {
                    format!("{} holds an invalid CA certificate", path.display())
                })?;
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("the TLS provider supports no safe protocol version")?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
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
