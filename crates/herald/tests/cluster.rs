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
    unsafe { libc_kill(child.id() as i32, sig) };
}

extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}

/// A `nats-server` with JetStream in a temporary directory; restartable on the same port.
struct Nats {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Nats {
    fn start() -> Nats {
        let dir = std::env::temp_dir().join(format!("herald-nats-{}", free_port()));
        let mut nats = Nats {
            child: Command::new("true").spawn().unwrap(),
            port: free_port(),
            dir,
        };
        nats.restart();
        nats
    }

    fn restart(&mut self) {
        self.child = Command::new(nats_server())
            .args([
                "-a",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-js",
                "-sd",
            ])
            .arg(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nats-server is installed (apt-get install nats-server)");
        let port = self.port;
        wait_for("nats-server to listen", 10, || {
            TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
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
    port: u16,
}

impl Node {
    fn start(nats: &Nats, extra: &[&str]) -> Node {
        let port = free_port();
        let child = Command::new(HERALD)
            .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .args(["--nats", &nats.url()])
            .args(extra)
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        wait_for("herald to listen", 10, || {
            TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        let node = Node { child, port };
        wait_for("herald to join NATS", 10, || {
            node.metric("herald_cluster_nats_connected") == 1
        });
        node
    }

    fn url(&self) -> String {
        format!("ws://127.0.0.1:{}/ws", self.port)
    }

    fn http(&self, request: &[u8]) -> String {
        let mut tcp = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
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
    let lines = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
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
    wait_for("B to subscribe on NATS", 10, || {
        b.metric("herald_cluster_remote_interest") == 1
    });
    wait_for("A to subscribe on NATS", 10, || {
        a.metric("herald_cluster_remote_interest") == 1
    });
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

    // No local subscriber left: no NATS subscription either, and nothing travels to B.
    wait_for("B to unsubscribe on NATS", 10, || {
        b.metric("herald_cluster_remote_interest") == 0
    });
    a.publish("img/small", b"y");
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(b.metric("herald_cluster_messages_in_total"), 2);
}

#[test]
fn a_nats_restart_never_stops_local_delivery_and_remote_subscribers_learn_the_gap() {
    let mut nats = Nats::start();
    // A tiny outgoing buffer, so that what A publishes while NATS is away is not carried.
    let config = std::env::temp_dir().join(format!("herald-small-{}.toml", free_port()));
    std::fs::write(&config, "[nats]\nmax_pending_bytes = 64\n").unwrap();
    let a = Node::start(&nats, &["--config", config.to_str().unwrap()]);
    let b = Node::start(&nats, &[]);
    let on_a = a.sub("t", 22);
    let on_b = b.sub("t", 22);
    wait_for("B to subscribe on NATS", 10, || {
        b.metric("herald_cluster_remote_interest") == 1
    });
    a.publish("t", b"before");
    wait_for("B to receive", 10, || {
        b.metric("herald_cluster_messages_in_total") == 1
    });

    nats.stop();
    wait_for("A to notice", 10, || {
        a.metric("herald_cluster_nats_connected") == 0
    });
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
    assert!(
        err.contains(&format!("dropped {missed} message(s) on \"t\"")),
        "B's subscriber is told how many it missed: {err}"
    );
    assert_eq!(b.metric("herald_cluster_missed_total"), missed as i64);
    let _ = std::fs::remove_file(config);
}

#[test]
fn a_stalled_nats_keeps_memory_bounded() {
    let nats = Nats::start();
    let config = std::env::temp_dir().join(format!("herald-stall-{}.toml", free_port()));
    std::fs::write(&config, "[nats]\nmax_pending_bytes = 4194304\n").unwrap();
    let a = Node::start(&nats, &["--config", config.to_str().unwrap()]);
    let b = Node::start(&nats, &[]);
    let on_b = b.sub("bulk", 1_000_000);
    wait_for("B to subscribe on NATS", 10, || {
        b.metric("herald_cluster_remote_interest") == 1
    });
    signal(&nats.child, 19); // SIGSTOP: the connection stays open, nothing moves.
    let payload = noise(256 << 10, 3);
    for _ in 0..200 {
        a.publish("bulk", &payload); // 50 MiB offered
    }
    let pending = a.metric("herald_cluster_pending_bytes");
    assert!(pending <= 4 << 20, "pending {pending} within the bound");
    assert!(a.metric("herald_cluster_not_carried_total") > 0);
    signal(&nats.child, 18); // SIGCONT
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

/// A client of a node that dies reconnects to another node and resumes with `since`: the
/// topic's numbers are the publishing node's everywhere.
#[tokio::test]
async fn a_client_of_a_killed_node_recovers_on_another() {
    let nats = Nats::start();
    let (a, mut b) = (Node::start(&nats, &[]), Node::start(&nats, &[]));
    let on_b = b.sub("feed/>", 2);
    wait_for("interest on B", 10, || {
        b.metric("herald_cluster_remote_interest") == 1
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

    let (mut ws, _) = tokio_tungstenite::connect_async(a.url()).await.unwrap();
    let since = json!({"op":"sub","id":1,"topic":"feed/>",
        "since":{"feed/x":{"seq":2,"epoch":epoch}}});
    ws.send(Message::text(since.to_string())).await.unwrap();
    let mut got = Vec::new();
    while got.len() < 3 {
        let m = tokio::time::timeout(Duration::from_secs(10), ws.next())
            .await
            .expect("reply in time")
            .unwrap()
            .unwrap();
        let text = match m {
            Message::Text(t) => t.to_string(),
            Message::Binary(b) => {
                let (head, _) = herald_core::wire::split_binary(&b).unwrap();
                head.to_owned()
            }
            _ => continue,
        };
        got.push(serde_json::from_str::<Value>(&text).unwrap());
    }
    assert_eq!(got[0]["op"], "subscribed");
    assert_eq!(got[0]["recovered"], true, "{got:?}");
    assert_eq!(got[1]["seq"], 3);
    assert_eq!(got[2]["seq"], 4);
    assert_eq!(got[2]["epoch"], epoch.as_str());
}
