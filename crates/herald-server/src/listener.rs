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
    F: Fn(&Arc<Node>) -> P,
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
    use super::*;
    use crate::connection::Codec;
    use crate::session::{Context, Input, Keepalive};
    use crate::{Config, Server};
    use bytes::Bytes;
    use herald_core::codec::{Encode, Frame};
    use herald_core::message::Message;
    use herald_core::reply::{DropReason, Reply};
    use herald_core::request::{PayloadKind, Publish, Request, Subscribe};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A codec that sends a message's payload as it is, cached in the message, and counts how
    /// often it encodes one.
    struct Counting(Arc<AtomicUsize>);

    impl Encode for Counting {
        fn message(&self, message: &Message, out: &mut Vec<Frame>) {
            out.push(
                message
                    .encoded(1, |m| {
                        self.0.fetch_add(1, Ordering::Relaxed);
                        Frame {
                            head: Bytes::new(),
                            body: m.payload().clone(),
                        }
                    })
                    .clone(),
            );
        }
        fn reply(&self, _: &Reply) -> Frame {
            Frame::default()
        }
        fn dropped(&self, _: &str, _: u64, _: DropReason) -> Frame {
            Frame::default()
        }
    }

    /// A protocol of single bytes: `s` subscribes to `t`, `p` is answered `pong`, `q` ends
    /// the connection.
    struct Bytewise(Arc<AtomicUsize>);

    impl Protocol for Bytewise {
        fn codec(&self) -> Codec {
            Arc::new(Counting(self.0.clone()))
        }
        fn keepalive(&self) -> Keepalive {
            Keepalive::default()
        }
        fn input(&mut self, cx: &mut Context<'_>, input: Input) -> Result<(), Disconnect> {
            let Input::Bytes(bytes) = input else {
                panic!("a stream delivers bytes");
            };
            for byte in bytes {
                match byte {
                    b's' => cx.request(Request::Subscribe(Subscribe {
                        topic: "t".into(),
                        ..Subscribe::default()
                    })),
                    b'p' => {
                        cx.send(Frame {
                            head: Bytes::from_static(b"pong"),
                            body: Bytes::new(),
                        });
                    }
                    b'q' => return Err(Disconnect::ProtocolError),
                    _ => {}
                }
            }
            Ok(())
        }
    }

    /// A node serving [`Bytewise`] on a TCP port of its own; its codec's count of encodings.
    async fn bytewise(config: Config) -> (Arc<Node>, SocketAddr, Arc<AtomicUsize>) {
        let node = Node::new(config).unwrap();
        let listener = bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = listener.local_addr().unwrap();
        let encodes = Arc::new(AtomicUsize::new(0));
        let counter = encodes.clone();
        tokio::spawn(serve_stream(
            listener,
            node.clone(),
            move |_: &Arc<Node>| Bytewise(counter.clone()),
            std::future::pending(),
        ));
        (node, addr, encodes)
    }

    async fn read_exactly(client: &mut TcpStream, n: usize) -> Vec<u8> {
        let mut got = vec![0; n];
        tokio::time::timeout(Duration::from_secs(10), client.read_exact(&mut got))
            .await
            .expect("in time")
            .expect("read");
        got
    }

    /// Subscribes (`s`), and returns once the subscription is made: a `p` after it is
    /// answered only once the `s` is carried out.
    async fn subscribed(addr: SocketAddr) -> TcpStream {
        let mut client = TcpStream::connect(addr).await.unwrap();
        client.write_all(b"sp").await.unwrap();
        assert_eq!(read_exactly(&mut client, 4).await, b"pong");
        client
    }

    async fn publish(node: &Node, payload: &'static [u8]) {
        let publish = Publish {
            id: None,
            topic: "t".into(),
            payload: Bytes::from_static(payload),
            kind: PayloadKind::Binary,
            content_type: None,
            stamp: false,
            extras: None,
        };
        node.publish_http(&publish, 0).await.unwrap();
    }

    /// A protocol on its own port speaks plain bytes both ways: its answers, the messages of
    /// its subscriptions, and at the end no WebSocket close frame, the stream just ends.
    #[tokio::test]
    async fn a_stream_protocol_speaks_plain_bytes_over_tcp() {
        let (node, addr, _) = bytewise(Config::default()).await;
        let mut client = subscribed(addr).await;
        publish(&node, b"hello").await;
        assert_eq!(read_exactly(&mut client, 5).await, b"hello");
        client.write_all(b"q").await.unwrap();
        let mut rest = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), client.read_to_end(&mut rest))
            .await
            .expect("closed in time")
            .expect("read");
        assert_eq!(rest, b"", "nothing after the last message, no close frame");
    }

    /// A message sent to several connections of one protocol is encoded once: the server's
    /// path from the engine to each socket shares the codec's bytes.
    #[tokio::test]
    async fn a_message_is_encoded_once_for_every_connection_of_a_protocol() {
        let (node, addr, encodes) = bytewise(Config::default()).await;
        let mut clients = Vec::new();
        for _ in 0..3 {
            clients.push(subscribed(addr).await);
        }
        publish(&node, b"once").await;
        for client in &mut clients {
            assert_eq!(read_exactly(client, 4).await, b"once");
        }
        assert_eq!(encodes.load(Ordering::Relaxed), 1);
    }

    /// A stream listener's sockets count against `max_connections` like the HTTP port's.
    #[tokio::test]
    async fn a_stream_listener_counts_against_max_connections() {
        let config = Config {
            max_connections: 1,
            ..Config::default()
        };
        let (_node, addr, _) = bytewise(config).await;
        let _first = subscribed(addr).await;
        let mut second = TcpStream::connect(addr).await.unwrap();
        let mut rest = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(10), second.read_to_end(&mut rest));
        assert!(read.await.expect("closed in time").is_ok_and(|n| n == 0));
    }

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
