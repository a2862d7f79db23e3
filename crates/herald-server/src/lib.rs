//! herald's network layer: the only crate that touches sockets.
//!
//! - [`auth`]: tokens, grants, the admin key, allowed origins.
//! - [`config`]: layered configuration (defaults, TOML, `HERALD_*`, flags).
//! - [`http`]: the routes — `/ws`, `/mqtt`, `/stomp`, `POST /api/publish/{topic}`, `/healthz`,
//!   `/metrics`, `/`.
//! - [`refusal`]: how an HTTP route refuses a request; the admin check.
//! - [`session`]: what every connection needs whatever its protocol, and the [`session::Protocol`]
//!   trait a protocol implements.
//! - [`jwks`]: fetching a JWKS document for [`auth`].
//! - [`limits`]: per-IP and per-connection limits against abusive clients.
//! - [`listener`]: the accept loop (per-IP limits, header deadline, graceful shutdown).
//! - [`tls`]: TLS on the listener, reloaded on SIGHUP.
//! - [`ws`]: the WebSocket handshake (origin check, the token presented) before a session.
//! - [`socket`]: the stream under a session, split lock-free when it is plain TCP.
//! - [`frame_reader`]: a session's incoming frames, read with no buffer held while it is idle.
//! - [`connection`]: a connection's outbound queue and who writes it (direct or writer task).
//! - [`flush`]: direct writes: what a batch of publishes queued leaves from the publishing task.
//! - [`dashboard`]: the live dashboard at `/` (assets compiled in).
//! - [`introspect`]: `GET /api/stats` and `GET /api/topics` (JSON) for the dashboard.
//! - [`clock`]: the wall clock messages are stamped with.
//! - [`node`]: what the sessions share: the engine, metrics, the session tracker.
//! - [`metrics`]: Prometheus metrics.
//! - [`process`]: what `herald serve` sets for its whole process: open files, huge pages.
//! - [`cluster`]: the broker boundary joining nodes into a cluster, and the NATS broker behind
//!   it (when `[nats]` is configured), with durable history in NATS JetStream.
//! - [`protocol`]: the wire protocols: the native and VBDS sessions, the MQTT and STOMP codecs.
//! - [`upload`]: reading a large HTTP body into one buffer, once.
//! - [`vbds`]: the VBDS API's HTTP routes (streams, multipart transfer, the access socket).
//!
//! [`Server::bind`] then [`Server::run`] serves until the shutdown future completes, then closes
//! every WebSocket with 1001 and waits (bounded) for the close frames to go out.

pub mod auth;
pub mod clock;
pub mod cluster;
pub mod config;
pub mod connection;
pub mod dashboard;
pub mod flush;
pub mod frame_reader;
pub mod http;
pub mod introspect;
pub mod jwks;
pub mod limits;
pub mod listener;
pub mod metrics;
pub mod node;
pub mod process;
pub mod protocol;
pub mod refusal;
pub mod session;
pub mod socket;
pub mod tls;
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
    /// The plain MQTT listener, when `mqtt_listen` is set.
    mqtt: Option<TcpListener>,
    /// The plain STOMP listener, when `stomp_listen` is set.
    stomp: Option<TcpListener>,
    node: Arc<Node>,
}

impl Server {
    pub async fn bind(config: Config) -> anyhow::Result<Server> {
        let listener = listener::bind(config.listen).with_context(|| {
            format!(
                "cannot listen on {}; is another process using it? (change it with --listen)",
                config.listen
            )
        })?;
        let mqtt = match config.mqtt_listen {
            Some(addr) => Some(listener::bind(addr).with_context(|| {
                format!("cannot listen for MQTT on {addr}; is another process using it? (change it with --mqtt-listen)")
            })?),
            None => None,
        };
        let stomp = match config.stomp_listen {
            Some(addr) => Some(listener::bind(addr).with_context(|| {
                format!("cannot listen for STOMP on {addr}; is another process using it? (change it with --stomp-listen)")
            })?),
            None => None,
        };
        let node = Node::new(config)?;
        if let Some(auth) = &node.auth {
            // Start with the keys if the URL answers; the refresher retries if it does not.
            if let Err(e) = auth.refresh_jwks().await {
                tracing::error!(error = %format!("{e:#}"), "cannot fetch the JWKS; retrying every 10 s");
            }
            auth.spawn_jwks_refresh();
        }
        node.start_broker().await?;
        Ok(Server {
            listener,
            mqtt,
            stomp,
            node,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound listener has an address")
    }

    /// Where the plain MQTT listener listens, if it does.
    pub fn mqtt_addr(&self) -> Option<SocketAddr> {
        self.mqtt.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// Where the plain STOMP listener listens, if it does.
    pub fn stomp_addr(&self) -> Option<SocketAddr> {
        self.stomp.as_ref().and_then(|l| l.local_addr().ok())
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
        tracing::info!(
            listen = %self.listener.local_addr()?,
            workers = tokio::runtime::Handle::current().metrics().num_workers(),
            "herald serving"
        );
        if node.auth.is_none() {
            tracing::warn!("authentication is OFF: any client may subscribe and publish to any topic; set auth.hs256_secret_file (or another key) before exposing herald (docs/security.md)");
        }
        let sweeper = tokio::spawn(Node::sweep(Arc::downgrade(&node)));
        let snapshots = tokio::spawn(Node::serve_snapshots(Arc::downgrade(&node)));
        // Every listener stops accepting at shutdown.
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let mqtt = self.mqtt.map(|tcp| {
            tracing::info!(mqtt_listen = %tcp.local_addr().map(|a| a.to_string()).unwrap_or_default(), "herald serving MQTT");
            let mut stopped = stopped.clone();
            let mqtt = |node: &Arc<Node>| {
                protocol::mqtt::session::Mqtt::new(node, connection::Framing::Stream)
            };
            tokio::spawn(listener::serve_stream(tcp, node.clone(), mqtt, async move {
                let _ = stopped.wait_for(|stop| *stop).await;
            }))
        });
        let stomp = self.stomp.map(|tcp| {
            let addr = tcp.local_addr().map(|a| a.to_string()).unwrap_or_default();
            tracing::info!(stomp_listen = %addr, "herald serving STOMP");
            let mut stopped = stopped.clone();
            let stomp = |node: &Arc<Node>| {
                let settings = protocol::stomp::session::Settings::of(&node.config);
                protocol::stomp::session::StompSession::new(settings, connection::Framing::Stream)
            };
            tokio::spawn(listener::serve_stream(
                tcp,
                node.clone(),
                stomp,
                async move {
                    let _ = stopped.wait_for(|stop| *stop).await;
                },
            ))
        });
        let closing = node.clone();
        listener::serve(
            self.listener,
            node.clone(),
            http::router(node.clone()),
            async move {
                shutdown.await;
                tracing::info!("shutting down: closing connections");
                let _ = stop.send(true);
                closing.close_all();
            },
        )
        .await;
        sweeper.abort();
        snapshots.abort();
        if let Some(mqtt) = mqtt {
            let _ = mqtt.await;
        }
        if let Some(stomp) = stomp {
            let _ = stomp.await;
        }
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
