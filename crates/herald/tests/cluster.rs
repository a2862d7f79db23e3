//! Several herald nodes as one through a real `nats-server` (Debian package `nats-server`):
//! routing by interest, bulk payloads past NATS's max_payload, and failures (NATS restarts,
//! a stalled NATS, a node killed). Every process is started here on free loopback ports and
//! ended by PID.

use base64::Engine as _;
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::Message;

const HERALD: &str = env!("CARGO_BIN_EXE_herald");

/// Debian installs `nats-server` in /usr/sbin, which a user's PATH may lack.
fn nats_server() -> &'static str {
    const DEBIAN: &str = "/usr/sbin/nats-server";
    if std::path::Path::new(DEBIAN).exists() {
        DEBIAN
    } else {
        "nats-server"
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn wait_for(what: &str, secs: u64, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn signal(child: &Child, sig: i32) {
    // SAFETY: kill(2) on a child this test started.
    unsafe { libc::kill(child.id() as i32, sig) };
}

/// A `nats-server` with JetStream in a temporary directory; restartable on the same port.
struct Nats {
    child: Child,
    /// The address it listens on (127.0.0.1 unless a test needs another).
    host: String,
    port: u16,
    dir: PathBuf,
    jetstream: bool,
    /// A configuration file (`-c`): authorization, TLS.
    config: Option<PathBuf>,
}

impl Nats {
    fn start() -> Nats {
        Nats::start_with(true)
    }

    /// A `nats-server` with (`-js`) or without JetStream.
    fn start_with(jetstream: bool) -> Nats {
        Nats::start_on("127.0.0.1", jetstream)
    }

    fn start_on(host: &str, jetstream: bool) -> Nats {
        let dir = std::env::temp_dir().join(format!("herald-nats-{}", free_port()));
        let mut nats = Nats {
            child: Command::new("true").spawn().unwrap(),
            host: host.to_owned(),
            port: free_port(),
            dir,
            jetstream,
            config: None,
        };
        nats.restart();
        nats
    }

    /// A `nats-server` with this configuration file's text (`@DIR@` in it: the server's own
    /// temporary directory).
    fn start_configured(config: &str) -> Nats {
        let dir = std::env::temp_dir().join(format!("herald-nats-{}", free_port()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("nats.conf");
        std::fs::write(&file, config.replace("@DIR@", dir.to_str().unwrap())).unwrap();
        let mut nats = Nats {
            child: Command::new("true").spawn().unwrap(),
            host: "127.0.0.1".into(),
            port: free_port(),
            dir,
            jetstream: false,
            config: Some(file),
        };
        nats.restart();
        nats
    }

    fn restart(&mut self) {
        let mut command = Command::new(nats_server());
        command.args(["-a", &self.host, "-p", &self.port.to_string()]);
        if self.jetstream {
            command.arg("-js").arg("-sd").arg(&self.dir);
        }
        if let Some(config) = &self.config {
            command.arg("-c").arg(config);
        }
        self.child = command
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nats-server is installed (apt-get install nats-server)");
        let (host, port) = (self.host.clone(), self.port);
        wait_for("nats-server to listen", 10, || {
            TcpStream::connect((host.as_str(), port)).is_ok()
        });
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn url(&self) -> String {
        format!("nats://{}:{}", self.host, self.port)
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `herald serve --nats`.
struct Node {
    child: Child,
    /// Where it listens: 127.0.0.1, or its address in a network namespace.
    host: String,
    port: u16,
}

impl Node {
    fn start(nats: &Nats, extra: &[&str]) -> Node {
        Node::start_in(None, nats, extra)
    }

    /// `herald serve --nats` on the host, or inside `netns` (listening on its address there,
    /// reaching NATS through the namespace's own link).
    fn start_in(netns: Option<&Netns>, nats: &Nats, extra: &[&str]) -> Node {
        Node::launch(netns, nats, extra, &[])
    }

    /// `herald serve --nats` with these `HERALD_*` variables.
    fn start_env(nats: &Nats, env: &[(&str, &str)]) -> Node {
        Node::launch(None, nats, &[], env)
    }

    fn launch(netns: Option<&Netns>, nats: &Nats, extra: &[&str], env: &[(&str, &str)]) -> Node {
        let host = netns.map_or("127.0.0.1".to_owned(), |n| n.ip(Netns::HTTP, 2));
        let nats_url = netns.map_or(nats.url(), |n| {
            format!("nats://{}:{}", n.ip(Netns::NATS, 1), nats.port)
        });
        let port = free_port();
        let mut command = match netns {
            Some(n) => n.exec(HERALD),
            None => Command::new(HERALD),
        };
        let child = command
            .args(["serve", "--listen", &format!("{host}:{port}")])
            .args(["--nats", &nats_url])
            .args(extra)
            .envs(env.iter().copied())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        wait_for("herald to listen", 10, || {
            TcpStream::connect((host.as_str(), port)).is_ok()
        });
        let node = Node { child, host, port };
        wait_for("herald to join NATS", 10, || {
            node.metric("herald_cluster_nats_connected") == 1
        });
        node
    }

    fn url(&self) -> String {
        format!("ws://{}:{}/ws", self.host, self.port)
    }

    fn http(&self, request: &[u8]) -> String {
        let mut tcp = TcpStream::connect((self.host.as_str(), self.port)).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        tcp.write_all(request).unwrap();
        let mut response = String::new();
        tcp.read_to_string(&mut response).unwrap();
        response
    }

    fn metric(&self, name: &str) -> i64 {
        let text = self.http(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or(-1)
    }

    /// `POST /api/publish/{topic}` (`topic` percent-encoded); returns the seq.
    fn publish(&self, topic: &str, body: &[u8]) -> u64 {
        let mut request = format!(
            "POST /api/publish/{topic} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\
             Content-Type: application/octet-stream\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        request.extend_from_slice(body);
        let response = self.http(&request);
        let body = response.split("\r\n\r\n").nth(1).unwrap_or_default();
        let v: Value = serde_json::from_str(body).unwrap_or_else(|_| panic!("{response}"));
        v["seq"].as_u64().unwrap()
    }

    /// `herald sub --json` on this node, its output read as it comes (a full pipe would stall
    /// it).
    fn sub(&self, pattern: &str, count: usize) -> Sub {
        let mut child = Command::new(HERALD)
            .args([
                "sub",
                "--json",
                "-n",
                &count.to_string(),
                "--url",
                &self.url(),
            ])
            .arg(pattern)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut stderr = child.stderr.take().unwrap();
        Sub {
            child,
            out: std::thread::spawn(move || stdout.lines().map(Result::unwrap).collect()),
            err: std::thread::spawn(move || {
                let mut err = String::new();
                stderr.read_to_string(&mut err).unwrap();
                err
            }),
        }
    }
}

struct Sub {
    child: Child,
    out: std::thread::JoinHandle<Vec<String>>,
    err: std::thread::JoinHandle<String>,
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits (bounded) for a `herald sub` to end by itself, or kills it; returns (stdout lines,
/// stderr).
fn finish(mut sub: Sub, secs: u64) -> (Vec<Value>, String) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while sub.child.try_wait().unwrap().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = sub.child.kill();
    let _ = sub.child.wait();
    let lines = sub.out.join().unwrap();
    // Killed while writing, `herald sub` may leave a last line cut short.
    let lines = lines
        .iter()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    (lines, sub.err.join().unwrap())
}

fn data(m: &Value) -> Vec<u8> {
    match m["data"].as_str() {
        Some(text) => text.as_bytes().to_vec(),
        None => base64::engine::general_purpose::STANDARD
            .decode(m["data_base64"].as_str().unwrap())
            .unwrap(),
    }
}

fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[test]
fn nodes_route_by_interest_and_carry_multi_mib_binaries_whole() {
    let nats = Nats::start();
    let (a, b) = (Node::start(&nats, &[]), Node::start(&nats, &[]));
    wait_for("both nodes to see each other", 10, || {
        a.metric("herald_cluster_nodes_seen") == 2
    });
    let on_b = b.sub("img/>", 2);
    let on_a = a.sub("img/>", 3);
    // Counted once attached, which is after NATS has the node's subscription.
    wait_for("both subscribers", 10, || {
        b.metric("herald_subscriptions") == 1 && a.metric("herald_subscriptions") == 1
    });
    assert_eq!(b.metric("herald_cluster_remote_interest"), 1);
    // Levels NATS could not carry as they are: a dot, a space, non-ASCII.
    let image = noise(5 << 20, 7);
    assert_eq!(a.publish("img/cam.1%20%C3%A9", &image), 1);
    assert_eq!(a.publish("img/small", b"x"), 1);

    let (got, _) = finish(on_b, 20);
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(got[0]["topic"], "img/cam.1 é");
    assert_eq!(got[0]["seq"], 1);
    assert!(
        data(&got[0]) == image,
        "the 5 MiB image arrived byte for byte"
    );
    assert_eq!(data(&got[1]), b"x");

    // The publishing node delivers its own publication once (no echo back from NATS).
    let (got, _) = finish(on_a, 2);
    assert_eq!(got.len(), 2, "each message once on the publishing node");
    assert!(a.metric("herald_cluster_messages_in_total") == 0);
    assert!(b.metric("herald_cluster_messages_in_total") == 2);
    assert!(a.metric("herald_cluster_messages_out_total") == 2);
    // The same cluster state in /api/stats, for the dashboard.
    let stats = a.http(b"GET /api/stats HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let stats: Value = serde_json::from_str(stats.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    let cluster = &stats["cluster"];
    assert_eq!(cluster["nats_connected"], true, "{stats}");
    assert_eq!(cluster["nodes_seen"], 2);
    assert!(cluster["remote_interest"].is_i64());
    assert_eq!(cluster["messages_out"], 2);
    assert_eq!(cluster["messages_in"], 0);
    assert_eq!(cluster["bytes_out"], image.len() + 1);
    assert_eq!(cluster["jetstream"], false);

    // No local subscriber left: no NATS subscription either, and nothing travels to B.
    wait_for("B to unsubscribe on NATS", 10, || {
        b.metric("herald_cluster_remote_interest") == 0
    });
    a.publish("img/small", b"y");
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(b.metric("herald_cluster_messages_in_total"), 2);
}

/// Two nodes; A with a 64-byte outgoing buffer, so that what it publishes while NATS is away is
/// not carried. `topic` has subscribers on B (and on A when `on_a` says how many messages it
/// waits for); one message from A reached B; then NATS is stopped and A has noticed.
struct Outage {
    nats: Nats,
    a: Node,
    b: Node,
    on_a: Option<Sub>,
    on_b: Sub,
}

impl Outage {
    fn start(topic: &str, on_b: usize, on_a: Option<usize>) -> Outage {
        let nats = Nats::start();
        let config = std::env::temp_dir().join(format!("herald-small-{}.toml", free_port()));
        std::fs::write(&config, "[nats]\nmax_pending_bytes = 64\n").unwrap();
        let a = Node::start(&nats, &["--config", config.to_str().unwrap()]);
        let _ = std::fs::remove_file(config);
        let b = Node::start(&nats, &[]);
        let on_a = on_a.map(|n| a.sub(topic, n));
        let on_b = b.sub(topic, on_b);
        wait_for("the subscribers", 10, || {
            b.metric("herald_subscriptions") == 1
                && a.metric("herald_subscriptions") == i64::from(on_a.is_some())
        });
        a.publish(topic, b"before");
        wait_for("B to receive", 10, || {
            b.metric("herald_cluster_messages_in_total") == 1
        });
        let mut outage = Outage {
            nats,
            a,
            b,
            on_a,
            on_b,
        };
        outage.nats.stop();
        wait_for("A to notice", 10, || {
            outage.a.metric("herald_cluster_nats_connected") == 0
        });
        outage
    }
}

#[test]
fn a_nats_restart_never_stops_local_delivery_and_remote_subscribers_learn_the_gap() {
    let Outage {
        mut nats,
        a,
        b,
        on_a,
        on_b,
    } = Outage::start("t", 22, Some(22));
    let on_a = on_a.unwrap();
    for i in 0..20 {
        a.publish("t", format!("during {i}").as_bytes());
    }
    assert!(a.metric("herald_cluster_not_carried_total") > 0);
    nats.restart();
    wait_for("both to reconnect", 15, || {
        a.metric("herald_cluster_nats_connects_total") == 2
            && b.metric("herald_cluster_nats_connects_total") == 2
    });
    // The subscription is restored by the client; give the server a moment to have it.
    std::thread::sleep(Duration::from_millis(300));
    let last = a.publish("t", b"after");
    assert_eq!(last, 22);

    let (local, _) = finish(on_a, 10);
    assert_eq!(local.len(), 22, "local delivery never stopped");
    wait_for("B to find the hole", 10, || {
        b.metric("herald_cluster_missed_total") > 0
    });
    let (remote, err) = finish(on_b, 1);
    let seqs: Vec<_> = remote.iter().map(|m| m["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs.first(), Some(&1));
    assert_eq!(seqs.last(), Some(&22), "{remote:?}");
    let carried = seqs.len() as u64;
    let missed = 22 - carried;
    assert!(missed > 0);
    // One notice per hole: what the NATS client held while it reconnected may go out after
    // all, so the outage can leave more than one hole, each announced with its own count.
    let announced: u64 = err
        .lines()
        .filter_map(|line| line.split("dropped ").nth(1))
        .filter(|rest| rest.contains("message(s) on \"t\""))
        .map(|rest| rest.split(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(
        announced, missed,
        "B's subscriber is told how many it missed, in all: {err}"
    );
    assert_eq!(b.metric("herald_cluster_missed_total"), missed as i64);
}

#[test]
fn a_stalled_nats_keeps_memory_bounded() {
    let nats = Nats::start();
    let config = std::env::temp_dir().join(format!("herald-stall-{}.toml", free_port()));
    std::fs::write(&config, "[nats]\nmax_pending_bytes = 4194304\n").unwrap();
    let a = Node::start(&nats, &["--config", config.to_str().unwrap()]);
    let b = Node::start(&nats, &[]);
    let on_b = b.sub("bulk", 1_000_000);
    wait_for("B's subscriber", 10, || {
        b.metric("herald_subscriptions") == 1
    });
    signal(&nats.child, libc::SIGSTOP); // the connection stays open, nothing moves.
    let payload = noise(256 << 10, 3);
    for _ in 0..200 {
        a.publish("bulk", &payload); // 50 MiB offered
    }
    let pending = a.metric("herald_cluster_pending_bytes");
    assert!(pending <= 4 << 20, "pending {pending} within the bound");
    assert!(a.metric("herald_cluster_not_carried_total") > 0);
    signal(&nats.child, libc::SIGCONT);
    wait_for("A's queue to drain", 20, || {
        a.metric("herald_cluster_pending_bytes") == 0
    });
    a.publish("bulk", b"last");
    // B's subscriber is told (the notice itself is checked in the NATS restart test).
    wait_for("B to find the hole", 20, || {
        b.metric("herald_cluster_missed_total") > 0
    });
    finish(on_b, 0);
    let _ = std::fs::remove_file(config);
}

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Connects to `node` and sends `request`.
async fn ws_request(node: &Node, request: Value) -> Ws {
    let (mut ws, _) = tokio_tungstenite::connect_async(node.url()).await.unwrap();
    ws.send(Message::text(request.to_string())).await.unwrap();
    ws
}

/// The next `n` JSON objects from the server, each within 10 s. A binary message is its header
/// with its payload's length as `"bytes"`, its hash as `"payload_hash"`, and the payload itself
/// as `"data"` when it is UTF-8 (the HTTP publishes here are binary).
async fn next_json(ws: &mut Ws, n: usize) -> Vec<Value> {
    let mut got = Vec::new();
    while got.len() < n {
        let m = tokio::time::timeout(Duration::from_secs(10), ws.next())
            .await
            .unwrap_or_else(|_| panic!("no reply in time after {got:?}"))
            .unwrap()
            .unwrap();
        let v = match m {
            Message::Text(t) => serde_json::from_str::<Value>(&t).unwrap(),
            Message::Binary(b) => {
                let (head, at) = herald_core::wire::split_binary(&b).unwrap();
                let mut v: Value = serde_json::from_str(head).unwrap();
                let payload = &b[at..];
                v["bytes"] = json!(payload.len());
                v["payload_hash"] = json!(hash(payload));
                if let Ok(text) = std::str::from_utf8(payload) {
                    v["data"] = json!(text);
                }
                v
            }
            _ => continue,
        };
        got.push(v);
    }
    got
}

fn hash(bytes: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    bytes.hash(&mut h);
    h.finish()
}

/// Nothing more arrives within `ms`.
async fn silent(ws: &mut Ws, ms: u64) {
    if let Ok(Some(m)) = tokio::time::timeout(Duration::from_millis(ms), ws.next()).await {
        panic!("unexpected {m:?}");
    }
}

/// Subscribes to `feed/>` on `node` with `since` = (`seq`, `epoch`) for `feed/x`; returns the
/// connection, and the reply (checked: recovered) followed by `n` messages.
async fn resume_feed(node: &Node, seq: u64, epoch: &str, n: usize) -> (Ws, Vec<Value>) {
    let since = json!({"op":"sub","id":1,"topic":"feed/>",
        "since":{"feed/x":{"seq":seq,"epoch":epoch}}});
    let mut ws = ws_request(node, since).await;
    let got = next_json(&mut ws, 1 + n).await;
    assert_eq!(got[0]["op"], "subscribed");
    assert_eq!(got[0]["recovered"], true, "{got:?}");
    (ws, got)
}

/// A client of a node that dies reconnects to another node and resumes with `since`: the
/// topic's numbers are the publishing node's everywhere.
#[tokio::test]
async fn a_client_of_a_killed_node_recovers_on_another() {
    let nats = Nats::start();
    let (a, mut b) = (Node::start(&nats, &[]), Node::start(&nats, &[]));
    let on_b = b.sub("feed/>", 2);
    wait_for("B's subscriber", 10, || {
        b.metric("herald_subscriptions") == 1
    });
    // The publisher is on A; B's client sees 1 and 2, then B dies.
    a.publish("feed/x", b"1");
    a.publish("feed/x", b"2");
    let (seen, _) = finish(on_b, 10);
    assert_eq!(seen.len(), 2);
    let epoch = seen[1]["epoch"].as_str().unwrap().to_owned();
    b.child.kill().unwrap();
    b.child.wait().unwrap();
    a.publish("feed/x", b"3");
    a.publish("feed/x", b"4");

    let (_ws, got) = resume_feed(&a, 2, &epoch, 2).await;
    assert_eq!(got[1]["seq"], 3);
    assert_eq!(got[2]["seq"], 4);
    assert_eq!(got[2]["epoch"], epoch.as_str());
}

/// `herald serve --nats … --nats-jetstream` (and `extra`), once the stream is declared.
fn jetstream_node(nats: &Nats, extra: &[&str]) -> Node {
    let node = Node::start(nats, &[extra, &["--nats-jetstream"]].concat());
    wait_for("the JetStream stream", 10, || {
        node.metric("herald_cluster_jetstream_available") == 1
    });
    node
}

/// What a node published has been handed to NATS (and so captured by the stream).
fn carried(node: &Node, messages: i64) {
    wait_for("messages to reach NATS", 10, || {
        node.metric("herald_cluster_messages_out_total") == messages
            && node.metric("herald_cluster_pending_bytes") == 0
    });
    // JetStream stores what NATS received asynchronously; a moment is plenty.
    std::thread::sleep(Duration::from_millis(200));
}

/// Publishes `m<i>` on `topic` for each `i` (the node's only publications: `i` is also how
/// many it has handed to NATS at the end), and waits until they reached NATS.
fn publish_run(node: &Node, topic: &str, run: std::ops::RangeInclusive<i64>) {
    let last = *run.end();
    for i in run {
        node.publish(topic, format!("m{i}").as_bytes());
    }
    carried(node, last);
}

/// A client moves from node A to node B, which never followed the topic: B reads what it
/// missed from JetStream, under A's numbers, then attaches it live without gap or duplicate.
#[tokio::test]
async fn a_client_moving_to_a_node_that_never_followed_the_topic_recovers_from_jetstream() {
    let nats = Nats::start();
    let (a, b) = (jetstream_node(&nats, &[]), jetstream_node(&nats, &[]));
    let on_a = a.sub("feed/x", 3);
    wait_for("A's subscriber", 10, || {
        a.metric("herald_subscriptions") == 1
    });
    publish_run(&a, "feed/x", 1..=3);
    let (seen, _) = finish(on_a, 10);
    assert_eq!(seen.len(), 3);
    let epoch = seen[2]["epoch"].as_str().unwrap().to_owned();
    // Gone; meanwhile three more.
    publish_run(&a, "feed/x", 4..=6);

    let (mut ws, got) = resume_feed(&b, 3, &epoch, 3).await;
    assert_eq!(got[0]["replayed"], 3);
    let replayed: Vec<_> = got[1..]
        .iter()
        .map(|m| {
            (
                m["seq"].as_u64().unwrap(),
                m["epoch"].as_str().unwrap(),
                m["data"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        replayed,
        [
            (4, epoch.as_str(), "m4"),
            (5, epoch.as_str(), "m5"),
            (6, epoch.as_str(), "m6")
        ]
    );
    assert!(b.metric("herald_cluster_recalled_total") >= 3);
    // Then live, straight after: the next one, once.
    a.publish("feed/x", b"m7");
    let live = next_json(&mut ws, 1).await;
    assert_eq!(
        (live[0]["seq"].as_u64(), live[0]["data"].as_str()),
        (Some(7), Some("m7"))
    );
    silent(&mut ws, 300).await;

    // A position older than what JetStream keeps is reported, not skipped: the history rule
    // keeps 32 messages.
    publish_run(&a, "feed/x", 8..=40);
    let old = json!({"op":"sub","id":2,"topic":"feed/x",
        "since":{"feed/x":{"seq":1,"epoch":epoch}}});
    let mut ws2 = ws_request(&b, old).await;
    let got = next_json(&mut ws2, 1).await;
    assert_eq!(got[0]["recovered"], false, "{got:?}");
    assert_eq!(got[0]["gaps"][0]["reason"], "history_trimmed");
}

/// The last values of topics a node never followed come from JetStream, whole even when a
/// value travelled in chunks.
#[tokio::test]
async fn a_snapshot_on_a_node_that_never_followed_the_topics_comes_from_jetstream() {
    snapshot_from_jetstream(false).await;
}

/// The same with a cluster key: what JetStream stored is checked as it is read back, and a
/// forgery stored there is left out.
#[tokio::test]
async fn with_a_cluster_key_what_jetstream_gives_back_is_checked_too() {
    snapshot_from_jetstream(true).await;
}

async fn snapshot_from_jetstream(signed: bool) {
    let nats = Nats::start();
    let key = signed.then(|| file_in(&nats, "cluster.key", &"k".repeat(40)));
    let extra: Vec<&str> = match &key {
        Some(key) => vec!["--nats-cluster-key-file", key],
        None => vec![],
    };
    let (a, b) = (jetstream_node(&nats, &extra), jetstream_node(&nats, &extra));
    if signed {
        // Stored by JetStream like any message on herald's subjects; ordered before cfg/img.
        inject(
            &nats,
            "",
            "herald.t.cfg.forged",
            &forged("1", &[]),
            b"forged",
        );
    }
    a.publish("cfg/a", b"old");
    a.publish("cfg/a", b"new");
    let image = noise(5 << 19, 11); // 2.5 MiB: three chunks
    a.publish("cfg/img", &image);
    a.publish("other/x", b"not matched");
    carried(&a, 4);

    let mut ws = ws_request(
        &b,
        json!({"op":"sub","id":1,"topic":"cfg/>","snapshot":true}),
    )
    .await;
    let got = next_json(&mut ws, 3).await;
    assert_eq!(got[0]["op"], "subscribed", "{got:?}");
    assert_eq!(
        (got[1]["topic"].as_str(), got[1]["data"].as_str()),
        (Some("cfg/a"), Some("new"))
    );
    assert_eq!(got[1]["seq"], 2);
    assert_eq!(got[2]["topic"], "cfg/img");
    assert_eq!(got[2]["bytes"], image.len());
    assert_eq!(got[2]["payload_hash"], hash(&image));
    silent(&mut ws, 300).await;
    if signed {
        // Counted once per read (the last message, then the topic's whole history).
        assert!(b.metric("herald_cluster_rejected_total{reason=\"unsigned\"}") >= 1);
    }

    // One exact topic, on a fresh connection.
    let mut ws = ws_request(
        &b,
        json!({"op":"sub","id":2,"topic":"other/x","snapshot":true}),
    )
    .await;
    let got = next_json(&mut ws, 2).await;
    assert_eq!(got[1]["data"], "not matched");
}

/// With JetStream configured but not there, a recovery says plainly what it cannot do, at once.
#[tokio::test]
async fn without_jetstream_a_recovery_fails_explicitly_and_at_once() {
    let nats = Nats::start_with(false);
    let (a, b) = (
        Node::start(&nats, &["--nats-jetstream"]),
        Node::start(&nats, &["--nats-jetstream"]),
    );
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(b.metric("herald_cluster_jetstream_available"), 0);
    a.publish("t", b"1");
    // Gone through NATS before B subscribes: else, on a loaded machine, B's new subscription
    // could still catch it live, and B would answer from it (`epoch_changed`).
    carried(&a, 1);
    let started = Instant::now();
    let since = json!({"op":"sub","id":1,"topic":"t","since":{"t":{"seq":0,"epoch":"x"}}});
    let mut ws = ws_request(&b, since).await;
    let got = next_json(&mut ws, 1).await;
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(got[0]["recovered"], false);
    assert_eq!(got[0]["gaps"][0]["reason"], "unknown_topic");
    assert_eq!(b.metric("herald_cluster_recall_failures_total"), 1);
    // Live delivery is unaffected.
    a.publish("t", b"2");
    let live = next_json(&mut ws, 1).await;
    assert_eq!(live[0]["data"], "2");
}

/// The `subscribed` reply comes once NATS has this node's subscription: a message published on
/// another node right after the reply reaches the new subscriber, every time.
#[tokio::test]
async fn a_message_published_right_after_the_reply_reaches_a_new_pattern() {
    let nats = Nats::start();
    let (a, b) = (Node::start(&nats, &[]), Node::start(&nats, &[]));
    for round in 0..60 {
        let topic = format!("race/{round}");
        let mut ws = ws_request(&b, json!({"op":"sub","id":1,"topic":topic})).await;
        assert_eq!(next_json(&mut ws, 1).await[0]["op"], "subscribed");
        a.publish(&topic, b"x");
        let got = next_json(&mut ws, 1).await;
        assert_eq!(got[0]["topic"], topic.as_str(), "round {round}");
    }
}

/// After NATS comes back, a topic that stays quiet still tells its remote subscribers exactly
/// what they missed: the origin announces its position.
#[test]
fn a_quiet_topic_reports_the_gap_after_a_nats_restart() {
    let Outage {
        mut nats,
        a,
        b,
        on_b,
        ..
    } = Outage::start("quiet", 1_000, None);
    for _ in 0..3 {
        a.publish("quiet", &[b'x'; 100]); // each over max_pending_bytes: not carried
    }
    nats.restart();
    // Nothing more is published.
    wait_for("B to learn the hole", 15, || {
        b.metric("herald_cluster_missed_total") == 3
    });
    let (got, err) = finish(on_b, 1);
    assert_eq!(got.len(), 1);
    assert!(
        err.contains("dropped 3 message(s) on \"quiet\""),
        "B's subscriber is told: {err}"
    );
}

/// While A keeps publishing, a client resumes on B (which never followed the topic): what B
/// reads from JetStream and what reaches it live meanwhile join into one run — every message
/// after the client's position exactly once, in order.
#[tokio::test]
async fn a_recovery_from_jetstream_under_live_publishing_has_no_gap_or_duplicate() {
    let nats = Nats::start();
    // History long enough that the position is still held when the client comes back.
    let config = std::env::temp_dir().join(format!("herald-history-{}.toml", free_port()));
    std::fs::write(
        &config,
        "[[history]]\npattern = \">\"\nmax_messages = 1000\n",
    )
    .unwrap();
    let config_flag = ["--config", config.to_str().unwrap()];
    let (a, b) = (
        jetstream_node(&nats, &config_flag),
        jetstream_node(&nats, &config_flag),
    );
    let _ = std::fs::remove_file(&config);
    publish_run(&a, "feed/x", 1..=20);
    let port = a.port;
    let publisher = std::thread::spawn(move || {
        let a = Node {
            child: Command::new("true").spawn().unwrap(),
            host: "127.0.0.1".into(),
            port,
        };
        for i in 21..=300 {
            a.publish("feed/x", format!("m{i}").as_bytes());
            std::thread::sleep(Duration::from_millis(2));
        }
    });
    std::thread::sleep(Duration::from_millis(100));
    let epoch = {
        let mut ws = ws_request(&a, json!({"op":"sub","topic":"feed/x","snapshot":true})).await;
        next_json(&mut ws, 2).await[1]["epoch"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let (mut ws, got) = resume_feed(&b, 10, &epoch, 0).await;
    let mut seqs = Vec::new();
    while seqs.last() != Some(&300) {
        let m = next_json(&mut ws, 1).await.remove(0);
        assert_eq!(m["op"], "msg", "{m} after {got:?}");
        seqs.push(m["seq"].as_u64().unwrap());
    }
    publisher.join().unwrap();
    assert_eq!(
        seqs,
        (11..=300).collect::<Vec<_>>(),
        "replayed {}",
        got[0]["replayed"]
    );
}

/// A network namespace joined to the host by two veth links: `NATS` (the namespace's way to
/// nats-server, which a test cuts) and `HTTP` (the test's way to the node inside, which stays
/// up). Needs CAP_NET_ADMIN (root); deleted on drop, with the links.
struct Netns {
    name: String,
    /// Third octet of the links' /30 subnets (10.231.k.0 and 10.232.k.0), unique per process.
    k: u32,
}

impl Netns {
    const NATS: u32 = 231;
    const HTTP: u32 = 232;

    /// `None` when namespaces cannot be created here (not root).
    fn create() -> Option<Netns> {
        let k = std::process::id() % 250 + 1;
        let ns = Netns {
            name: format!("herald-{k}"),
            k,
        };
        if !run("ip", &["netns", "add", &ns.name]) {
            return None;
        }
        for link in [Netns::NATS, Netns::HTTP] {
            let (host_if, ns_if) = (ns.link(link, 'h'), ns.link(link, 'n'));
            let ok = run(
                "ip",
                &[
                    "link", "add", &host_if, "type", "veth", "peer", "name", &ns_if,
                ],
            ) && run("ip", &["link", "set", &ns_if, "netns", &ns.name])
                && run(
                    "ip",
                    &[
                        "addr",
                        "add",
                        &format!("{}/30", ns.ip(link, 1)),
                        "dev",
                        &host_if,
                    ],
                )
                && run("ip", &["link", "set", &host_if, "up"])
                && ns.ip_in(&[
                    "addr",
                    "add",
                    &format!("{}/30", ns.ip(link, 2)),
                    "dev",
                    &ns_if,
                ])
                && ns.ip_in(&["link", "set", &ns_if, "up"]);
            assert!(ok, "could not set up link {link} of {}", ns.name);
        }
        assert!(ns.ip_in(&["link", "set", "lo", "up"]));
        Some(ns)
    }

    fn link(&self, link: u32, side: char) -> String {
        format!("hr{}-{}{side}", self.k, link)
    }

    fn ip(&self, link: u32, host: u32) -> String {
        format!("10.{link}.{}.{host}", self.k)
    }

    fn exec(&self, program: &str) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.name, program]);
        command
    }

    fn ip_in(&self, args: &[&str]) -> bool {
        self.exec("ip")
            .args(args)
            .status()
            .is_ok_and(|s| s.success())
    }

    /// Cuts (or heals) the namespace's link to NATS on its side: packets go nowhere, and no
    /// connection is reset.
    fn cut(&self, cut: bool) {
        let state = if cut { "down" } else { "up" };
        assert!(self.ip_in(&["link", "set", &self.link(Netns::NATS, 'n'), state]));
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        run("ip", &["netns", "del", &self.name]);
    }
}

fn run(program: &str, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The next ten messages are `topic`'s seq 1 to 10.
async fn expect_first_ten(ws: &mut Ws, topic: &str) {
    let got: Vec<_> = next_json(ws, 10)
        .await
        .iter()
        .map(|m| {
            (
                m["topic"].as_str().unwrap().to_owned(),
                m["seq"].as_u64().unwrap(),
            )
        })
        .collect();
    let want: Vec<_> = (1..=10).map(|seq| (topic.to_owned(), seq)).collect();
    assert_eq!(got, want);
}

/// Node B is cut off from NATS (its link goes down: no reset, packets lost) for a few seconds
/// while both nodes publish: each node's own subscribers keep getting its messages, and once
/// the link heals, what each node published reaches the other's subscribers, all of it, in
/// order (TCP and NATS keep the backlog; nothing is reported missing).
#[tokio::test]
async fn a_network_cut_between_a_node_and_nats_stops_nothing_local_and_loses_nothing() {
    let Some(net) = Netns::create() else {
        eprintln!("skipped: `ip netns add` is not permitted here (needs root)");
        return;
    };
    let nats = Nats::start_on(&net.ip(Netns::NATS, 1), false);
    let a = Node::start(&nats, &[]);
    let b = Node::start_in(Some(&net), &nats, &[]);
    let sub = json!({"op":"sub","topic":"cut/>"});
    let (mut on_a, mut on_b) = (ws_request(&a, sub.clone()).await, ws_request(&b, sub).await);
    next_json(&mut on_a, 1).await;
    next_json(&mut on_b, 1).await;
    net.cut(true);
    for _ in 0..10 {
        a.publish("cut/a", b"from A");
        b.publish("cut/b", b"from B");
    }
    // Local delivery does not wait for NATS.
    expect_first_ten(&mut on_a, "cut/a").await;
    expect_first_ten(&mut on_b, "cut/b").await;
    std::thread::sleep(Duration::from_secs(2));
    silent(&mut on_b, 200).await;

    net.cut(false);
    // TCP retransmits what was lost on the link; everything arrives, in order, once.
    expect_first_ten(&mut on_a, "cut/b").await;
    expect_first_ten(&mut on_b, "cut/a").await;
    silent(&mut on_b, 300).await;
    assert_eq!(b.metric("herald_cluster_missed_total"), 0);
    assert_eq!(a.metric("herald_cluster_missed_total"), 0);
}

/// A plain NATS client (the text protocol over TCP, no herald code), as anyone allowed to
/// publish on the NATS account could run: publishes `payload` with `headers` on `subject`,
/// then waits for the server to have processed it. `connect` adds fields to `CONNECT` (e.g.
/// credentials).
fn inject(nats: &Nats, connect: &str, subject: &str, headers: &[(&str, &str)], payload: &[u8]) {
    let mut tcp = TcpStream::connect((nats.host.as_str(), nats.port)).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut reader = BufReader::new(tcp.try_clone().unwrap());
    let mut info = String::new();
    reader.read_line(&mut info).unwrap();
    assert!(info.starts_with("INFO "), "{info}");
    let mut head = String::from("NATS/1.0\r\n");
    for (name, value) in headers {
        head += &format!("{name}: {value}\r\n");
    }
    head += "\r\n";
    let mut out = format!(
        "CONNECT {{\"verbose\":false,\"pedantic\":false,\"headers\":true{connect}}}\r\n\
         HPUB {subject} {} {}\r\n{head}",
        head.len(),
        head.len() + payload.len()
    )
    .into_bytes();
    out.extend_from_slice(payload);
    out.extend_from_slice(b"\r\nPING\r\n");
    tcp.write_all(&out).unwrap();
    let mut reply = String::new();
    reader.read_line(&mut reply).unwrap();
    assert!(reply.starts_with("PONG"), "NATS answered {reply:?}");
}

/// Headers that make a NATS message look like one herald node's message to the others.
fn forged<'a>(seq: &'a str, extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut headers = vec![
        ("Herald-Origin", "f0f0f0f0f0f0f0f0"),
        ("Herald-Epoch", "0123456789ab"),
        ("Herald-Seq", seq),
    ];
    headers.extend_from_slice(extra);
    headers
}

/// Two nodes with a subscriber of `t/x` on B, and one message from A that reached it.
fn forgery_target(nats: &Nats, extra: &[&str], on_b: usize) -> (Node, Node, Sub) {
    let (a, b) = (Node::start(nats, extra), Node::start(nats, extra));
    let sub = b.sub("t/x", on_b);
    wait_for("B's subscriber", 10, || {
        b.metric("herald_subscriptions") == 1 && b.metric("herald_cluster_remote_interest") == 1
    });
    a.publish("t/x", b"before");
    wait_for("B to receive", 10, || {
        b.metric("herald_cluster_messages_in_total") == 1
    });
    (a, b, sub)
}

#[test]
fn a_forged_chunk_header_is_dropped_and_counted_and_the_node_keeps_delivering() {
    let nats = Nats::start_with(false);
    let (a, mut b, on_b) = forgery_target(&nats, &[], 2);
    // A 4 KiB first part of a message announced as 10^12 parts (4 PB): once sized with
    // `part * n` before any check, an abort (`memory allocation failed`).
    let huge = forged("2", &[("Herald-Chunk", "0/1000000000000")]);
    inject(&nats, "", "herald.t.t.x", &huge, &[7; 4096]);
    // `part * n` overflows usize.
    let overflow = forged("3", &[("Herald-Chunk", "0/18446744073709551615")]);
    inject(&nats, "", "herald.t.t.x", &overflow, &[7; 4096]);
    // A part index past the count; a count of zero; not numbers; a first part too small.
    for chunk in ["3/2", "0/0", "-1/2", "0/2/3", "0/+2"] {
        let headers = forged("3", &[("Herald-Chunk", chunk)]);
        inject(&nats, "", "herald.t.t.x", &headers, &[7; 4096]);
    }
    // Header values that are no number, and a position announcement carrying a payload.
    inject(&nats, "", "herald.t.t.x", &forged("-1", &[]), b"x");
    inject(&nats, "", "herald.t.t.x", &forged("0", &[]), b"x");
    let mark = forged("9", &[("Herald-Kind", "mark")]);
    inject(&nats, "", "herald.t.t.x", &mark, b"x");
    let stamp = forged("4", &[("Herald-Stamp", "soon")]);
    inject(&nats, "", "herald.t.t.x", &stamp, b"x");
    let small = forged("5", &[("Herald-Chunk", "0/2")]);
    inject(&nats, "", "herald.t.t.x", &small, &[7; 1024]);
    wait_for("the forged messages to be counted", 10, || {
        b.metric("herald_cluster_rejected_total{reason=\"too_large\"}") == 2
            && b.metric("herald_cluster_rejected_total{reason=\"chunk\"}") == 6
            && b.metric("herald_cluster_rejected_total{reason=\"malformed\"}") == 4
    });
    assert!(b.child.try_wait().unwrap().is_none(), "B is alive");
    a.publish("t/x", b"after");
    let (got, _) = finish(on_b, 10);
    let got: Vec<_> = got.iter().map(data).collect();
    assert_eq!(got, [b"before".to_vec(), b"after".to_vec()]);
    assert_eq!(b.metric("herald_cluster_messages_in_total"), 2);
}

/// `herald serve` with these arguments, expected to give up: its exit status and standard
/// error (bounded: killed after 15 s).
fn serve_refused(args: &[&str]) -> (std::process::ExitStatus, String) {
    let mut child = Command::new(HERALD)
        .args(["serve", "--listen", &format!("127.0.0.1:{}", free_port())])
        .args(args)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    while child.try_wait().unwrap().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let status = child.wait().unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    (status, err)
}

/// A file in `nats`'s directory holding `text`; its path.
fn file_in(nats: &Nats, name: &str, text: &str) -> String {
    std::fs::create_dir_all(&nats.dir).unwrap();
    let path = nats.dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

#[test]
fn herald_authenticates_to_nats_with_a_password_or_a_token_and_says_so_when_refused() {
    let nats =
        Nats::start_configured("authorization { user: herald, password: \"pw-right-5a1\" }\n");
    let url = nats.url();
    let right = file_in(&nats, "right", "pw-right-5a1\n");
    let wrong = file_in(&nats, "wrong", "pw-wrong-7c3\n");
    let a = Node::start(
        &nats,
        &["--nats-user", "herald", "--nats-password-file", &right],
    );
    // The same with the section from the environment, as in a container.
    let b = Node::start_env(
        &nats,
        &[
            ("HERALD_NATS_USER", "herald"),
            ("HERALD_NATS_PASSWORD_FILE", &right),
        ],
    );
    let on_b = b.sub("t", 1);
    wait_for("B's subscriber", 10, || {
        b.metric("herald_cluster_remote_interest") == 1
    });
    a.publish("t", b"authenticated");
    let (got, _) = finish(on_b, 10);
    assert_eq!(got.iter().map(data).collect::<Vec<_>>(), [b"authenticated"]);

    let (status, err) = serve_refused(&[
        "--nats",
        &url,
        "--nats-user",
        "herald",
        "--nats-password-file",
        &wrong,
    ]);
    assert!(!status.success(), "{err}");
    assert!(err.contains("refused herald's credentials"), "{err}");
    assert!(
        !err.contains("pw-wrong") && !err.contains("pw-right"),
        "{err}"
    );
    let (status, err) = serve_refused(&["--nats", &url]);
    assert!(
        !status.success() && err.contains("refused herald's credentials"),
        "{err}"
    );
    // Credentials in the URL work too, and are never shown.
    let in_url = format!("nats://herald:pw-wrong-7c3@127.0.0.1:{}", nats.port);
    let (status, err) = serve_refused(&["--nats", &in_url]);
    assert!(!status.success() && err.contains("***@127.0.0.1"), "{err}");
    assert!(!err.contains("pw-wrong"), "{err}");
    drop((a, b));

    let nats = Nats::start_configured("authorization { token: \"tok-right-9e2\" }\n");
    let token = file_in(&nats, "token", "tok-right-9e2\n");
    let wrong = file_in(&nats, "wrong", "tok-wrong-4d8");
    Node::start(&nats, &["--nats-token-file", &token]);
    let (status, err) = serve_refused(&["--nats", &nats.url(), "--nats-token-file", &wrong]);
    assert!(
        !status.success() && err.contains("refused herald's credentials"),
        "{err}"
    );
    assert!(!err.contains("tok-"), "{err}");
}

#[test]
fn herald_authenticates_to_nats_with_an_nkey() {
    let (user, stranger) = (nkeys::KeyPair::new_user(), nkeys::KeyPair::new_user());
    let nats = Nats::start_configured(&format!(
        "authorization {{ users: [ {{ nkey: \"{}\" }} ] }}\n",
        user.public_key()
    ));
    let seed = file_in(&nats, "seed", &format!("{}\n", user.seed().unwrap()));
    let node = Node::start(&nats, &["--nats-nkey-seed-file", &seed]);
    assert_eq!(node.metric("herald_cluster_nats_connected"), 1);
    let other = file_in(&nats, "other", &stranger.seed().unwrap());
    let (status, err) = serve_refused(&["--nats", &nats.url(), "--nats-nkey-seed-file", &other]);
    assert!(
        !status.success() && err.contains("refused herald's credentials"),
        "{err}"
    );
    assert!(!err.contains(&stranger.seed().unwrap()), "{err}");
}

/// Runs openssl; panics with its output when it fails.
fn openssl(dir: &std::path::Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl is installed");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A private CA in `dir` (`ca.pem`), and certificates it signed: `server.pem` for 127.0.0.1,
/// `client.pem` for a client (each with its `.key`).
fn private_ca(dir: &std::path::Path) {
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    openssl(
        dir,
        &[
            &["req", "-x509"],
            &ec[..],
            &[
                "-keyout",
                "ca.key",
                "-out",
                "ca.pem",
                "-days",
                "2",
                "-subj",
                "/CN=herald test CA",
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
            ],
        ]
        .concat(),
    );
    for (name, ext) in [
        (
            "server",
            "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
        ),
        (
            "client",
            "subjectAltName=DNS:herald-node\nextendedKeyUsage=clientAuth\n",
        ),
    ] {
        std::fs::write(dir.join(format!("{name}.ext")), ext).unwrap();
        let (key, csr, pem, extfile) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.pem"),
            format!("{name}.ext"),
        );
        openssl(
            dir,
            &[
                &["req"],
                &ec[..],
                &[
                    "-keyout",
                    &key,
                    "-out",
                    &csr,
                    "-subj",
                    &format!("/CN={name}"),
                ],
            ]
            .concat(),
        );
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-set_serial",
                "2",
                "-days",
                "2",
                "-out",
                &pem,
                "-extfile",
                &extfile,
            ],
        );
    }
}

#[test]
fn herald_reaches_nats_over_tls_with_a_private_ca_and_a_client_certificate() {
    let dir = std::env::temp_dir().join(format!("herald-nats-ca-{}", free_port()));
    std::fs::create_dir_all(&dir).unwrap();
    private_ca(&dir);
    let at = |f: &str| dir.join(f).display().to_string();
    let nats = Nats::start_configured(&format!(
        "tls {{ cert_file: \"{}\", key_file: \"{}\", ca_file: \"{}\", verify: true, timeout: 2 }}\n",
        at("server.pem"),
        at("server.key"),
        at("ca.pem")
    ));
    let tls = [
        "--nats-tls-ca-file",
        &at("ca.pem"),
        "--nats-tls-cert-file",
        &at("client.pem"),
        "--nats-tls-key-file",
        &at("client.key"),
    ];
    let (a, b) = (Node::start(&nats, &tls), Node::start(&nats, &tls));
    let on_b = b.sub("t", 1);
    wait_for("B's subscriber", 10, || {
        b.metric("herald_cluster_remote_interest") == 1
    });
    a.publish("t", b"over TLS");
    let (got, _) = finish(on_b, 10);
    assert_eq!(got.iter().map(data).collect::<Vec<_>>(), [b"over TLS"]);
    // Without the private CA, the server's certificate is not trusted: a clear error.
    let (status, err) = serve_refused(&["--nats", &nats.url(), "--nats-tls-required"]);
    assert!(!status.success() && err.contains("over TLS"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn with_a_cluster_key_only_what_nodes_signed_reaches_subscribers() {
    let nats = Nats::start_with(false);
    // Without a key, NATS is the trust boundary: whoever may publish on herald's subjects
    // reaches every node's subscribers as if a node had sent it.
    {
        let (_a, b, on_b) = forgery_target(&nats, &[], 2);
        inject(&nats, "", "herald.t.t.x", &forged("1", &[]), b"forged");
        let (got, _) = finish(on_b, 10);
        assert_eq!(
            got.iter().map(data).collect::<Vec<_>>(),
            [&b"before"[..], b"forged"]
        );
        assert_eq!(
            b.metric("herald_cluster_rejected_total{reason=\"unsigned\"}"),
            0
        );
    }
    let key = file_in(
        &nats,
        "cluster.key",
        "a-shared-secret-of-32-bytes-or-more\n",
    );
    let (a, b, on_b) = forgery_target(&nats, &["--nats-cluster-key-file", &key], 2);
    wait_for("B to hear A's signed heartbeats", 10, || {
        b.metric("herald_cluster_nodes_seen") == 2
    });
    inject(&nats, "", "herald.t.t.x", &forged("1", &[]), b"forged");
    let bad = [("Herald-Signature", "00".repeat(32))];
    let bad: Vec<_> = bad.iter().map(|(n, v)| (*n, v.as_str())).collect();
    inject(&nats, "", "herald.t.t.x", &forged("2", &bad), b"forged");
    // A forged heartbeat: it would make every node announce all its topics.
    inject(&nats, "", "herald.nodes", &[], b"f0f0f0f0f0f0f0f0 7");
    wait_for("the forgeries to be counted", 10, || {
        b.metric("herald_cluster_rejected_total{reason=\"unsigned\"}") == 2
            && b.metric("herald_cluster_rejected_total{reason=\"bad_signature\"}") == 1
    });
    // The forged node is not counted (the gauge is refreshed every second).
    std::thread::sleep(Duration::from_millis(1200));
    assert_eq!(b.metric("herald_cluster_nodes_seen"), 2);
    // A node with another key is not part of the cluster.
    let other = file_in(&nats, "other.key", "another-secret-of-32-bytes-or-more\n");
    let c = Node::start(&nats, &["--nats-cluster-key-file", &other]);
    c.publish("t/x", b"other cluster");
    wait_for("C's message to be refused", 10, || {
        b.metric("herald_cluster_rejected_total{reason=\"bad_signature\"}") >= 2
    });
    a.publish("t/x", b"after");
    let (got, _) = finish(on_b, 10);
    assert_eq!(
        got.iter().map(data).collect::<Vec<_>>(),
        [&b"before"[..], b"after"]
    );
    assert_eq!(b.metric("herald_cluster_messages_in_total"), 2);
}

#[test]
fn an_account_of_its_own_keeps_herald_subjects_to_herald_nodes() {
    // The lock-down docs/cluster.md gives: herald's user in an account of its own, with only
    // the permissions herald needs (JetStream included); everyone else in another account.
    let nats = Nats::start_configured(
        r#"
        accounts {
          HERALD: {
            jetstream: enabled
            users: [ { user: herald, password: "pw-herald-31"
                       permissions: { publish: ["herald.>", "$JS.API.>"]
                                      subscribe: ["herald.>", "_INBOX.>"] } } ]
          }
          APPS: { users: [ { user: app, password: "pw-app-72" } ] }
        }
        jetstream { store_dir: "@DIR@" }
        "#,
    );
    let password = file_in(&nats, "password", "pw-herald-31");
    let herald = [
        "--nats-user",
        "herald",
        "--nats-password-file",
        &password,
        "--nats-jetstream",
    ];
    let (a, b, on_b) = forgery_target(&nats, &herald, 2);
    wait_for("JetStream within herald's permissions", 10, || {
        a.metric("herald_cluster_jetstream_available") == 1
    });
    // Another NATS user publishes on herald's subject: it lands in its own account.
    let app = r#","user":"app","pass":"pw-app-72""#;
    inject(&nats, app, "herald.t.t.x", &forged("1", &[]), b"forged");
    a.publish("t/x", b"after");
    let (got, _) = finish(on_b, 10);
    assert_eq!(
        got.iter().map(data).collect::<Vec<_>>(),
        [&b"before"[..], b"after"]
    );
    assert_eq!(b.metric("herald_cluster_messages_in_total"), 2);
}

/// A VBDS subscriber's interest reaches NATS as soon as it connects, with no other request to
/// carry it: an image published on another node reaches it.
#[tokio::test]
async fn a_vbds_subscriber_receives_images_published_on_another_node() {
    let nats = Nats::start_with(false);
    let (a, b) = (Node::start(&nats, &[]), Node::start(&nats, &[]));
    let created =
        a.http(b"POST /vbds/admin/streams/cam HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 0\r\n\r\n");
    assert!(created.starts_with("HTTP/1.1 200"), "{created}");
    let url = format!("ws://{}:{}/vbds/access/streams/cam", a.host, a.port);
    let (mut ws, _) = tokio_tungstenite::connect_async(url).await.unwrap();
    // Published until the first chunk arrives: the subscription is made as the socket opens,
    // and reaches NATS a moment later.
    let deadline = Instant::now() + Duration::from_secs(10);
    let image = loop {
        assert!(Instant::now() < deadline, "no image within 10 s");
        b.publish("vbds/cam", b"image-bytes");
        match tokio::time::timeout(Duration::from_millis(300), ws.next()).await {
            Ok(Some(Ok(Message::Binary(chunk)))) => break chunk,
            Ok(other) => panic!("{other:?}"),
            Err(_) => {}
        }
    };
    assert_eq!(&image[..], b"image-bytes");
}
