//! herald's network layer: the only crate that touches sockets.
//!
//! - [`config`]: layered configuration (defaults, TOML, `HERALD_*`, flags).
//! - [`http`]: the routes — `/ws`, `POST /api/publish/{topic}`, `/healthz`, `/metrics`, `/`.
//! - [`ws`]: a WebSocket session: handshake, reading requests, running the writer.
//! - [`connection`]: a connection's outbound queue and its batching writer.
//! - [`node`]: what the sessions share: the engine, metrics, the session tracker.
//! - [`metrics`]: Prometheus metrics.
//! - [`upload`]: reading a large HTTP body into one buffer, once.
//! - [`vbds`]: the VBDS API (streams, multipart transfer, chunked WebSocket access).
//!
//! [`Server::bind`] then [`Server::run`] serves until the shutdown future completes, then closes
//! every WebSocket with 1001 and waits (bounded) for the close frames to go out.

pub mod config;
pub mod connection;
pub mod http;
pub mod metrics;
pub mod node;
pub mod upload;
pub mod vbds;
pub mod ws;

pub use config::Config;

use anyhow::Context;
use node::Node;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

pub struct Server {
    listener: TcpListener,
    node: Arc<Node>,
}

impl Server {
    pub async fn bind(config: Config) -> anyhow::Result<Server> {
        let listener = TcpListener::bind(config.listen).await.with_context(|| {
            format!(
                "cannot listen on {}; is another process using it? (change it with --listen)",
                config.listen
            )
        })?;
        Ok(Server {
            listener,
            node: Node::new(config),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound listener has an address")
    }

    pub fn node(&self) -> &Arc<Node> {
        &self.node
    }

    /// Serves until `shutdown` completes, then closes every client with 1001 and returns.
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let node = self.node;
        tracing::info!(listen = %self.listener.local_addr()?, "herald serving");
        let closing = node.clone();
        // No Nagle: a small message must leave now, not wait for the previous one's ACK.
        let listener = axum::serve::ListenerExt::tap_io(self.listener, |tcp| {
            if let Err(e) = tcp.set_nodelay(true) {
                tracing::debug!(error = %e, "cannot set TCP_NODELAY");
            }
        });
        axum::serve(listener, http::router(node.clone()))
            .with_graceful_shutdown(async move {
                shutdown.await;
                tracing::info!("shutting down: closing connections");
                closing.close_all();
            })
            .await
            .context("HTTP server failed")?;
        node.sessions.close();
        let grace = Duration::from_secs(node.config.shutdown_grace_secs + 1);
        if tokio::time::timeout(grace, node.sessions.wait())
            .await
            .is_err()
        {
            tracing::warn!("some connections did not close within the grace period");
        }
        tracing::info!("herald stopped");
        Ok(())
    }
}

/// Raises this process's open-file limit to its hard maximum: every connection is a file.
pub fn raise_open_file_limit() {
    // SAFETY: getrlimit/setrlimit only read and write the struct passed to them.
    unsafe {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max
        {
            limit.rlim_cur = limit.rlim_max;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                tracing::warn!("could not raise the open-file limit");
            }
        }
    }
}
