//! Fetching a JWKS document over HTTP/1.1 (plain `http://`), with a deadline and a size cap so
//! a slow or hostile key server cannot stall or bloat herald.

use anyhow::{bail, ensure, Context};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper::Uri;
use hyper_util::rt::TokioIo;
use std::time::Duration;
use tokio::net::TcpStream;

/// Largest JWKS document accepted.
const MAX_BYTES: usize = 1 << 20;
/// Deadline for connecting, sending and reading the whole reply.
const DEADLINE: Duration = Duration::from_secs(5);

pub async fn fetch(url: &str) -> anyhow::Result<Bytes> {
    tokio::time::timeout(DEADLINE, get(url))
        .await
        .with_context(|| format!("{url} did not answer within {DEADLINE:?}"))?
}

async fn get(url: &str) -> anyhow::Result<Bytes> {
    let uri: Uri = url
        .parse()
        .with_context(|| format!("{url:?} is not a URL"))?;
    if uri.scheme_str() != Some("http") {
        bail!(
            "auth.jwks_url must be http:// (fetch an https endpoint through a local proxy): {url}"
        );
    }
    let authority = uri.authority().context("the JWKS URL has no host")?.clone();
    let port = authority.port_u16().unwrap_or(80);
    let tcp = TcpStream::connect((authority.host(), port))
        .await
        .with_context(|| format!("cannot connect to {authority}"))?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
    tokio::spawn(connection);
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let request = hyper::Request::get(path)
        .header(hyper::header::HOST, authority.as_str())
        .header(hyper::header::ACCEPT, "application/json")
        .body(Empty::<Bytes>::new())?;
    let response = sender.send_request(request).await?;
    ensure!(
        response.status().is_success(),
        "{url} answered {}",
        response.status()
    );
    let body = Limited::new(response.into_body(), MAX_BYTES)
        .collect()
        .await
        .map_err(|e| anyhow::anyhow!("reading {url}: {e}"))?;
    Ok(body.to_bytes())
}
