//! TLS on the listener with a real TLS WebSocket client, and a certificate swap on SIGHUP that
//! keeps open connections.

mod common;

use common::*;
use herald_server::tls::TlsConfig;
use herald_server::Config;
use rustls_pki_types::{CertificateDer, ServerName};
use serde_json::json;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;
use tokio_tungstenite::WebSocketStream;

type TlsClient = WebSocketStream<TlsStream<TcpStream>>;

/// A fresh self-signed certificate for `localhost`, written to `dir`; returns its DER.
fn write_cert(dir: &std::path::Path) -> CertificateDer<'static> {
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    std::fs::write(dir.join("cert.pem"), certified.cert.pem()).unwrap();
    std::fs::write(dir.join("key.pem"), certified.key_pair.serialize_pem()).unwrap();
    certified.cert.der().clone()
}

/// Connects over TLS trusting only `root`, then speaks WebSocket.
async fn connect_tls(
    addr: std::net::SocketAddr,
    root: &CertificateDer<'static>,
) -> anyhow::Result<TlsClient> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(root.clone())?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = TcpStream::connect(addr).await?;
    let tls = TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost")?, tcp)
        .await?;
    let url = format!("wss://localhost:{}/ws", addr.port());
    let (ws, _) = tokio_tungstenite::client_async(url, tls).await?;
    Ok(ws)
}

async fn ping(client: &mut TlsClient) {
    use futures_util::{SinkExt, StreamExt};
    let ping = json!({"op": "ping", "id": 7}).to_string();
    client
        .send(tokio_tungstenite::tungstenite::Message::text(ping))
        .await
        .unwrap();
    let reply = tokio::time::timeout(WAIT, client.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(
        reply.into_text().unwrap().as_str(),
        r#"{"op":"pong","id":7}"#
    );
}

#[tokio::test]
async fn wss_works_and_sighup_swaps_the_certificate_without_dropping_connections() {
    let dir = std::env::temp_dir().join(format!("herald-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let first = write_cert(&dir);
    let config = Config {
        tls: TlsConfig {
            cert_file: Some(dir.join("cert.pem")),
            key_file: Some(dir.join("key.pem")),
        },
        ..Config::default()
    };
    let server = TestServer::start(config).await;
    let mut before = connect_tls(server.addr, &first).await.unwrap();
    ping(&mut before).await;
    // Plain WebSocket on a TLS port fails.
    assert!(tokio_tungstenite::connect_async(server.url())
        .await
        .is_err());

    let second = write_cert(&dir);
    // SAFETY: raising a signal this process handles (herald installed a SIGHUP handler).
    assert_eq!(unsafe { libc::raise(libc::SIGHUP) }, 0);
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut after = loop {
        match connect_tls(server.addr, &second).await {
            Ok(client) => break client,
            Err(e) => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "new certificate never served: {e}"
                );
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    };
    ping(&mut after).await;
    // The connection made under the old certificate is still up.
    ping(&mut before).await;
    // And the old certificate is no longer served.
    assert!(connect_tls(server.addr, &first).await.is_err());
    server.stop().await;
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn half_a_tls_config_is_refused() {
    let config = TlsConfig {
        cert_file: Some(PathBuf::from("cert.pem")),
        key_file: None,
    };
    let err = herald_server::tls::Tls::from_config(&config).err().unwrap();
    assert!(err.to_string().contains("together"), "{err}");
}
