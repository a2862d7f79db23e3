//! The accept loop, wired by hand rather than through `axum::serve` so that herald decides what
//! happens between `accept()` and the first byte of HTTP: per-IP limits, every socket counted
//! against `max_connections` (unauthenticated ones shed oldest first to make room), TCP_NODELAY,
//! a deadline on the request headers (slowloris), and graceful shutdown of plain HTTP
//! connections. WebSocket connections leave hyper when upgraded; `Node::sessions` tracks those.
//!
//! A protocol on a TCP port of its own (MQTT, STOMP) is served by [`serve_stream`]: the same
//! admission (per-IP limits, the same `max_connections` count as the HTTP port's sockets),
//! then a session of the protocol on the plain or TLS byte stream, no HTTP before it.

use crate::connection::Framing;
use crate::limits::{IpGuard, Socket, SocketHandle};
use crate::metrics::{Disconnect, Reason};
use crate::node::Node;
use crate::session::{self, Protocol, Transport};
use crate::socket::{self, Guarded, Held};
use axum::Router;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::watch;
use tokio_util::task::TaskTracker;

/// Connections the kernel completes and queues for `accept()` (it caps the figure at
/// `net.core.somaxconn`, 4096 by default since Linux 5.4). `TcpListener::bind` asks for 128:
/// beyond that the kernel drops a client's SYN and the client retries 1, 3, 7, 15 s later, so
/// a burst of a thousand clients against a busy herald waited up to 25 s to connect.
const LISTEN_BACKLOG: u32 = 4096;

/// Binds a listening socket on `addr` with room for a burst of connections ([`LISTEN_BACKLOG`]).
pub fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    // As `TcpListener::bind` does: a restart may bind while old connections sit in TIME_WAIT.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// Serves `router` on `listener` until `shutdown` completes; then asks open HTTP connections to
/// finish (bounded by the shutdown grace).
pub async fn serve(
    listener: TcpListener,
    node: Arc<Node>,
    router: Router,
    shutdown: impl Future<Output = ()>,
) {
    if let Some(tls) = &node.tls {
        if let Err(e) = tls.reload_on_sighup() {
            tracing::warn!(error = %format!("{e:#}"), "TLS certificates will not reload on SIGHUP");
        }
    }
    let (stop, stopping) = watch::channel(false);
    let connections = TaskTracker::new();
    tokio::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            _ = &mut shutdown => break,
            accepted = next(&listener) => accepted,
        };
        let (guard, socket) = match admit(&node, &tcp, peer) {
            Ok(admitted) => admitted,
            Err(refusal) => {
                if refusal == "max_connections" && node.tls.is_none() {
                    // Best effort, without waiting: the socket closes either way.
                    let _ = tcp.try_write(FULL);
                }
                continue; // dropping the socket closes it
            }
        };
        let handle = socket.handle();
        let service = WithSocket {
            inner: TowerToHyperService::new(router.clone()),
            handle: handle.clone(),
        };
        let timeout = node.config.limits.handshake_timeout();
        let stopping = stopping.clone();
        let tls = node.tls.as_ref().map(|tls| tls.acceptor());
        let held = Held::new(guard, socket);
        connections.spawn(async move {
            let serve = async move {
                match tls {
                    None => serve_http(Guarded::new(tcp, held), service, timeout, stopping).await,
                    Some(acceptor) => {
                        match tokio::time::timeout(timeout, acceptor.accept(tcp)).await {
                            Ok(Ok(tls)) => {
                                let io = Guarded::new(tls, held);
                                serve_http(io, service, timeout, stopping).await
                            }
                            Ok(Err(e)) => tracing::debug!(error = %e, "TLS handshake failed"),
                            Err(_) => {} // slow TLS handshake: the same deadline as headers
                        }
                    }
                }
            };
            // Shed before an upgrade: the connection is dropped here. After an upgrade the
            // session watches for it.
            tokio::select! {
                () = serve => {}
                () = handle.shed() => {}
            }
        });
    }
    let _ = stop.send(true);
    connections.close();
    let grace = Duration::from_secs(node.config.shutdown_grace_secs);
    let _ = tokio::time::timeout(grace, connections.wait()).await;
}

/// The next connection `listener` accepts; a failure (out of file descriptors, typically)
/// backs off rather than spin.
async fn next(listener: &TcpListener) -> (TcpStream, SocketAddr) {
    loop {
        match listener.accept().await {
            Ok(accepted) => return accepted,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Admits an accepted socket, and sets TCP_NODELAY on it: its place in its IP's count and
/// among the server's sockets; or why not (the per-IP limits, `max_connections`), counted in
/// `connections_refused`.
fn admit(
    node: &Node,
    tcp: &TcpStream,
    peer: SocketAddr,
) -> Result<(IpGuard, Socket), &'static str> {
    let refused = |reason| {
        node.metrics
            .connections_refused
            .get_or_create(&Reason { reason })
            .inc();
    };
    let guard = match node.ip_limits.admit(peer.ip(), Instant::now()) {
        Ok(guard) => guard,
        Err(refusal) => {
            refused(refusal.label());
            return Err(refusal.label());
        }
    };
    let Ok(socket) = node
        .sockets
        .admit(peer.ip(), node.ip_limits.is_exempt(peer.ip()))
    else {
        refused("max_connections");
        return Err("max_connections");
    };
    // No Nagle: a small message must leave now, not wait for the previous one's ACK.
    if let Err(e) = tcp.set_nodelay(true) {
        tracing::debug!(error = %e, "cannot set TCP_NODELAY");
    }
    Ok((guard, socket))
}

/// Serves a protocol of its own port (MQTT, STOMP) on `listener` until `shutdown` completes:
/// each connection admitted as the HTTP port admits one (and counted with its sockets), over
/// TLS when the server has it, then a session of `protocol(&node)` on the byte stream. The
/// sessions are tracked in `Node::sessions`, so shutdown closes them and waits for them as
/// for WebSocket sessions.
pub async fn serve_stream<P, F>(
    listener: TcpListener,
    node: Arc<Node>,
    protocol: F,
    shutdown: impl Future<Output = ()>,
) where
    P: Protocol,
    F: Fn(&Node) -> P,
{
    tokio::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            _ = &mut shutdown => break,
            accepted = next(&listener) => accepted,
        };
        let Ok((guard, socket)) = admit(&node, &tcp, peer) else {
            continue; // dropping the socket closes it
        };
        let handle = socket.handle();
        let held = Held::new(guard, socket);
        let protocol = protocol(&node);
        let tls = node.tls.as_ref().map(|tls| tls.acceptor());
        node.metrics.connections.inc();
        node.metrics.connections_total.inc();
        let node = node.clone();
        node.clone().sessions.spawn(async move {
            let (read, write) = match tls {
                None => socket::split_tcp(tcp, held),
                Some(acceptor) => {
                    let timeout = node.config.limits.handshake_timeout();
                    match tokio::time::timeout(timeout, acceptor.accept(tcp)).await {
                        Ok(Ok(tls)) => socket::split_boxed(tls, held),
                        _ => {
                            tracing::debug!("TLS handshake failed or timed out");
                            node.metrics.disconnected(Disconnect::IoError);
                            return;
                        }
                    }
                }
            };
            let transport = Transport {
                read,
                write,
                framing: Framing::Stream,
            };
            session::run(node, transport, Some(handle), None, protocol).await
        });
    }
}

/// The answer to a socket refused at `max_connections`.
const FULL: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 73\r\n\r\nherald is at its limit of connections (max_connections); try again later\n";

/// The router, with each request told which socket it came on ([`SocketHandle`] in its
/// extensions).
struct WithSocket {
    inner: TowerToHyperService<Router>,
    handle: SocketHandle,
}

impl hyper::service::Service<hyper::Request<Incoming>> for WithSocket {
    type Response = <TowerToHyperService<Router> as hyper::service::Service<
        hyper::Request<Incoming>,
    >>::Response;
    type Error =
        <TowerToHyperService<Router> as hyper::service::Service<hyper::Request<Incoming>>>::Error;
    type Future =
        <TowerToHyperService<Router> as hyper::service::Service<hyper::Request<Incoming>>>::Future;

    fn call(&self, mut request: hyper::Request<Incoming>) -> Self::Future {
        request.extensions_mut().insert(self.handle.clone());
        self.inner.call(request)
    }
}

/// Serves HTTP/1 on one connection until it ends, is upgraded, or the server stops.
async fn serve_http<S>(
    io: Guarded<S>,
    service: WithSocket,
    timeout: Duration,
    mut stopping: watch::Receiver<bool>,
) where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(timeout);
    let conn = builder
        .serve_connection(TokioIo::new(io), service)
        .with_upgrades();
    tokio::pin!(conn);
    let result = tokio::select! {
        result = conn.as_mut() => result,
        _ = stopping.changed() => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = result {
        tracing::debug!(error = %e, "HTTP connection ended with an error");
    }
}

#[cfg(test)]
mod tests {
    use crate::{Config, Server};
    use std::time::Duration;
    use tokio::net::TcpStream;

    /// A burst of clients larger than tokio's default backlog (128) all connect while nothing
    /// accepts yet (a herald too busy to call `accept()`): the kernel queues them rather than
    /// dropping their SYNs, which would cost each one a retry a second or more later.
    #[tokio::test]
    async fn a_burst_of_connections_waits_in_the_backlog() {
        let server = Server::bind(Config {
            listen: "127.0.0.1:0".parse().unwrap(),
            ..Config::default()
        })
        .await
        .unwrap();
        let addr = server.local_addr();
        // The kernel caps the backlog at net.core.somaxconn (4096 on current kernels).
        let cap = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
            .ok()
            .and_then(|s| s.trim().parse::<usize>().ok())
            .unwrap_or(4096);
        let burst = cap.min(600);
        let connects = (0..burst)
            .map(|_| tokio::time::timeout(Duration::from_millis(900), TcpStream::connect(addr)));
        let results = futures_util::future::join_all(connects).await;
        let connected = results.iter().filter(|r| matches!(r, Ok(Ok(_)))).count();
        assert_eq!(connected, burst, "connected before the SYN retry");
    }
}
