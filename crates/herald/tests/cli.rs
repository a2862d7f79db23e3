//! The `herald` binary as a user runs it: serve, pub, sub, exit codes, SIGTERM.

use std::io::{BufRead, BufReader, Read};
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const HERALD: &str = env!("CARGO_BIN_EXE_herald");

/// `herald serve` on a free loopback port; SIGTERMed (and checked to exit 0) by `stop`.
struct Serve {
    child: Child,
    port: u16,
    /// The admin API key `/metrics` needs when auth is on.
    admin_key: Option<String>,
    /// With TLS on: the CA file clients trust (URLs become wss:// and https://).
    ca: Option<PathBuf>,
}

impl Serve {
    fn start() -> Serve {
        Serve::start_with(&[], None)
    }

    /// `herald serve` with extra arguments; `admin_key` is the key those arguments configure.
    fn start_with(extra: &[&str], admin_key: Option<&str>) -> Serve {
        Serve::start_custom(extra, admin_key, |_| {})
    }

    /// [`Serve::start_with`], the command first given to `customize` (environment, pre-exec).
    fn start_custom(
        extra: &[&str],
        admin_key: Option<&str>,
        customize: impl FnOnce(&mut Command),
    ) -> Serve {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut command = Command::new(HERALD);
        command
            .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .args(extra)
            .stderr(Stdio::piped());
        customize(&mut command);
        let child = command.spawn().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "herald serve did not start listening"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Serve {
            child,
            port,
            admin_key: admin_key.map(str::to_owned),
            ca: None,
        }
    }

    /// `herald serve` speaking TLS with `ca`'s server certificate; `herald` commands trust `ca`.
    fn start_tls(ca: &PrivateCa) -> Serve {
        let mut serve = Serve::start_with(
            &[
                "--tls-cert-file",
                ca.cert.to_str().unwrap(),
                "--tls-key-file",
                ca.key.to_str().unwrap(),
            ],
            None,
        );
        serve.ca = Some(ca.ca.clone());
        serve
    }

    fn url(&self) -> String {
        let scheme = if self.ca.is_some() { "wss" } else { "ws" };
        format!("{scheme}://127.0.0.1:{}/ws", self.port)
    }

    fn http(&self) -> String {
        let scheme = if self.ca.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    fn herald(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(HERALD);
        cmd.args(args).env("HERALD_URL", self.url());
        if let Some(ca) = &self.ca {
            cmd.env("HERALD_CA_FILE", ca);
        }
        cmd
    }

    fn stop(mut self) -> String {
        // SAFETY: kill(2) on the child this test started.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "herald serve did not exit after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut logs = String::new();
        self.child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut logs)
            .unwrap();
        assert!(status.success(), "serve exited with {status}: {logs}");
        logs
    }
}

/// Runs `cmd`, which must succeed (its stderr is shown if not).
fn succeed(cmd: &mut Command) -> std::process::Output {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A test that fails before `stop` must not leave the server running (it would also hold the
/// test harness's output pipes open).
impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `herald sub`, waits until its subscription is active (the server counts it), and
/// returns the child with its stdout.
fn start_sub(serve: &Serve, args: &[&str]) -> (Child, BufReader<std::process::ChildStdout>) {
    let before = subscriptions(serve);
    let mut child = serve
        .herald(&[&["sub"], args].concat())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let deadline = Instant::now() + Duration::from_secs(10);
    while subscriptions(serve) <= before {
        assert!(Instant::now() < deadline, "herald sub never subscribed");
        std::thread::sleep(Duration::from_millis(20));
    }
    (child, stdout)
}

fn subscriptions(serve: &Serve) -> u64 {
    let mut curl = Command::new("curl");
    curl.args(["-s", &format!("{}/metrics", serve.http())]);
    if let Some(ca) = &serve.ca {
        curl.arg("--cacert").arg(ca);
    }
    if let Some(key) = &serve.admin_key {
        curl.args(["-H", &format!("Authorization: Bearer {key}")]);
    }
    let out = curl.output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("herald_subscriptions "))
        .map_or(0, |v| v.parse().unwrap())
}

#[test]
fn sub_prints_what_pub_publishes_and_exits_after_count() {
    let serve = Serve::start();
    let (mut sub, stdout) = start_sub(&serve, &["quotes/*/EURUSD", "--count", "2"]);
    for price in ["1.0842", "1.0843"] {
        let status = serve
            .herald(&["pub", "quotes/fx/EURUSD", price])
            .status()
            .unwrap();
        assert!(status.success());
    }
    let lines: Vec<String> = stdout.lines().map(Result::unwrap).collect();
    assert_eq!(lines, ["1.0842", "1.0843"]);
    assert!(sub.wait().unwrap().success());
    serve.stop();
}

#[test]
fn sub_json_and_pub_file_count_rate() {
    let serve = Serve::start();
    let (mut sub, stdout) = start_sub(&serve, &["cam/>", "--json", "--count", "3"]);
    let file = std::env::temp_dir().join(format!("herald-cli-{}.bin", std::process::id()));
    std::fs::write(&file, [0u8, 1, 2, 255]).unwrap();
    let started = Instant::now();
    let status = serve
        .herald(&[
            "pub",
            "cam/1",
            "--file",
            file.to_str().unwrap(),
            "--ct",
            "image/x",
            "--count",
            "3",
            "--rate",
            "20",
        ])
        .status()
        .unwrap();
    assert!(status.success());
    assert!(
        started.elapsed() >= Duration::from_millis(90),
        "3 messages at 20/s take at least 100 ms"
    );
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(&l.unwrap()).unwrap())
        .collect();
    assert_eq!(lines.len(), 3);
    for (i, line) in lines.iter().enumerate() {
        assert_eq!(line["topic"], "cam/1");
        assert_eq!(line["seq"], i as u64 + 1);
        assert_eq!(line["ct"], "image/x");
        assert_eq!(line["data_base64"], "AAEC/w==");
    }
    assert!(sub.wait().unwrap().success());
    std::fs::remove_file(file).unwrap();
    serve.stop();
}

#[test]
fn refusals_print_the_server_error_and_exit_non_zero() {
    let serve = Serve::start();
    let out = serve
        .herald(&["pub", "quotes/*/EURUSD", "1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("publish_to_pattern") && err.contains("quotes/*/EURUSD"),
        "{err}"
    );
    let out = serve
        .herald(&["sub", "a//b", "--count", "1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid_topic"));
    serve.stop();
}

#[test]
fn tokens_from_herald_token_open_exactly_what_they_grant() {
    let dir = std::env::temp_dir().join(format!("herald-cli-auth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let secret = dir.join("secret");
    std::fs::write(&secret, "0123456789abcdef0123456789abcdef\n").unwrap();
    std::fs::write(dir.join("admin"), "cli-admin-key").unwrap();
    let config = dir.join("herald.toml");
    let admin = dir.join("admin");
    std::fs::write(
        &config,
        format!(
            "[auth]\nadmin_api_key_file = {:?}\n",
            admin.to_str().unwrap()
        ),
    )
    .unwrap();
    let serve = Serve::start_with(
        &[
            "--config",
            config.to_str().unwrap(),
            "--auth-hs256-secret-file",
            secret.to_str().unwrap(),
        ],
        Some("cli-admin-key"),
    );
    let mint = |grants: &[&str]| {
        let out = succeed(
            Command::new(HERALD)
                .args([
                    "token",
                    "--secret-file",
                    secret.to_str().unwrap(),
                    "--ttl",
                    "60",
                ])
                .args(grants),
        );
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    };
    let reader = mint(&["--sub", "quotes/fx/>", "news/*"]);
    let writer = mint(&["--pub", "quotes/fx/>"]);

    let (mut sub, stdout) = start_sub(&serve, &["quotes/fx/EURUSD", "-n", "1", "--token", &reader]);
    let status = serve
        .herald(&["pub", "quotes/fx/EURUSD", "1.09"])
        .env("HERALD_TOKEN", &writer)
        .status()
        .unwrap();
    assert!(status.success());
    assert_eq!(stdout.lines().next().unwrap().unwrap(), "1.09");
    assert!(sub.wait().unwrap().success());

    let refused = |args: &[&str], token: Option<&str>, expect: &str| {
        let mut cmd = serve.herald(args);
        if let Some(token) = token {
            cmd.env("HERALD_TOKEN", token);
        }
        let out = cmd.output().unwrap();
        assert!(!out.status.success(), "{args:?} should fail");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(expect), "{args:?}: {err}");
    };
    refused(&["sub", "quotes/>", "-n", "1"], Some(&reader), "forbidden");
    refused(&["pub", "quotes/eq/X", "1"], Some(&writer), "forbidden");
    refused(&["pub", "quotes/fx/X", "1"], Some(&reader), "forbidden");
    refused(&["sub", "quotes/fx/X", "-n", "1"], None, "unauthorized");
    refused(
        &["sub", "quotes/fx/X", "-n", "1"],
        Some("not.a.token"),
        "unauthorized",
    );
    let logs = serve.stop();
    assert!(!logs.contains("authentication is OFF"), "{logs}");
    std::fs::remove_dir_all(dir).unwrap();
}

/// A private CA made with the openssl CLI and a server certificate it issued for 127.0.0.1 and
/// localhost, in a fresh directory (removed on drop).
struct PrivateCa {
    dir: PathBuf,
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

impl PrivateCa {
    fn new(name: &str) -> PrivateCa {
        let dir = std::env::temp_dir().join(format!("herald-cli-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let openssl = |args: &[&str]| {
            succeed(Command::new("openssl").current_dir(&dir).args(args));
        };
        let new_key = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
        ];
        let ca_ext = ["-addext", "basicConstraints=critical,CA:TRUE", "-days", "1"];
        let ca_out = ["-keyout", "ca.key", "-out", "ca.pem"];
        openssl(
            &[
                &["req", "-x509", "-subj", "/CN=herald test CA"],
                &new_key[..],
                &ca_ext,
                &ca_out,
            ]
            .concat(),
        );
        let csr_out = ["-keyout", "server.key", "-out", "server.csr"];
        openssl(&[&["req", "-subj", "/CN=localhost"], &new_key[..], &csr_out].concat());
        std::fs::write(
            dir.join("server.ext"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
        )
        .unwrap();
        openssl(&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-extfile",
            "server.ext",
            "-days",
            "1",
            "-out",
            "server.pem",
        ]);
        PrivateCa {
            ca: dir.join("ca.pem"),
            cert: dir.join("server.pem"),
            key: dir.join("server.key"),
            dir,
        }
    }
}

impl Drop for PrivateCa {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn serve_speaks_tls_with_the_tls_flags() {
    let ca = PrivateCa::new("tls");
    let serve = Serve::start_tls(&ca);
    let out = Command::new("curl")
        .args(["-s", "--cacert", ca.ca.to_str().unwrap()])
        .args(["--resolve", &format!("localhost:{}:127.0.0.1", serve.port)])
        .arg(format!("https://localhost:{}/healthz", serve.port))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ok\n");
    serve.stop();
}

#[test]
fn pub_and_sub_speak_wss_trusting_a_private_ca() {
    let ca = PrivateCa::new("wss");
    let serve = Serve::start_tls(&ca);
    // `sub` trusts the CA through HERALD_CA_FILE (set by `serve.herald`), `pub` through the flag.
    let (mut sub, mut stdout) = start_sub(&serve, &["tls/demo", "-n", "1"]);
    succeed(
        serve
            .herald(&["pub", "tls/demo", "over wss", "--ca-file"])
            .arg(&ca.ca)
            .env_remove("HERALD_CA_FILE"),
    );
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line, "over wss\n");
    assert!(sub.wait().unwrap().success());

    // Without the CA the public roots apply, and they do not vouch for this server.
    let out = serve
        .herald(&["pub", "tls/demo", "x"])
        .env_remove("HERALD_CA_FILE")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("invalid peer certificate"), "{err}");
    assert!(err.contains("--ca-file or HERALD_CA_FILE"), "{err}");

    // A CA file that is not PEM is refused before connecting.
    let out = serve
        .herald(&["pub", "tls/demo", "x", "--ca-file"])
        .arg(ca.ca.with_file_name("server.ext"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("holds no PEM certificate"), "{err}");
    serve.stop();
}

#[test]
fn serve_warns_that_auth_is_off_by_default() {
    let logs = Serve::start().stop();
    assert!(logs.contains("authentication is OFF"), "{logs}");
}

#[test]
fn unreachable_server_is_a_clear_error() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let out = Command::new(HERALD)
        .args([
            "pub",
            "a",
            "1",
            "--url",
            &format!("ws://127.0.0.1:{port}/ws"),
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("is herald running"));
}

#[test]
fn serve_refuses_a_bad_config_and_a_busy_port() {
    let dir = std::env::temp_dir().join(format!("herald-cfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "max_conections = 3\n").unwrap();
    let out = Command::new(HERALD)
        .args(["serve", "--config", bad.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("max_conections"));

    let busy = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap().to_string();
    let out = Command::new(HERALD)
        .args(["serve", "--listen", &addr])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot listen"));

    // --nats-jetstream fills in [nats] only with `jetstream`: without a url it is explained.
    let out = Command::new(HERALD)
        .args(["serve", "--nats-jetstream"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("[nats] needs a url"));
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn every_command_has_help() {
    for cmd in [
        &["--help"][..],
        &["serve", "--help"],
        &["pub", "--help"],
        &["sub", "--help"],
        &["bench", "--help"],
        &["token", "--help"],
    ] {
        let out = Command::new(HERALD).args(cmd).output().unwrap();
        assert!(out.status.success(), "{cmd:?}");
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("Usage"),
            "{cmd:?}"
        );
    }
}

#[test]
fn sigterm_logs_and_exits_zero() {
    let logs = Serve::start().stop();
    assert!(logs.contains("herald stopped"), "{logs}");
}

/// How many of process `pid`'s threads carry the name tokio gives its pool's threads (workers,
/// and blocking threads if any were started).
fn worker_threads(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter(|t| {
            let comm = t.as_ref().unwrap().path().join("comm");
            std::fs::read_to_string(comm).is_ok_and(|c| c.trim() == "tokio-rt-worker")
        })
        .count()
}

/// `workers` threads serve connections, and one worker is the serving thread itself (tokio's
/// single-threaded scheduler), with no pool beside it; either way messages flow.
#[test]
fn serve_runs_on_the_workers_configured() {
    for (workers, pool) in [("1", 0), ("2", 2)] {
        let serve = Serve::start_with(&["--workers", workers], None);
        let (mut sub, stdout) = start_sub(&serve, &["cores/>", "--count", "1"]);
        let status = serve
            .herald(&["pub", "cores/one", "hello"])
            .status()
            .unwrap();
        assert!(status.success());
        let lines: Vec<String> = stdout.lines().map(Result::unwrap).collect();
        assert_eq!(lines, ["hello"], "--workers {workers}");
        assert!(sub.wait().unwrap().success());
        assert_eq!(
            worker_threads(serve.child.id()),
            pool,
            "--workers {workers}"
        );
        let logs = serve.stop();
        assert!(logs.contains(&format!("workers={workers}")), "{logs}");
    }
}

/// A line of `/proc/PID/status`, after its `key:`.
fn proc_status(pid: u32, key: &str) -> Option<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .map(|v| v.trim().to_owned())
}

#[test]
fn serve_takes_no_transparent_huge_pages_unless_configured_to() {
    let serve = Serve::start();
    let thp = proc_status(serve.child.id(), "THP_enabled");
    serve.stop();
    assert_eq!(thp.as_deref(), Some("0"), "the default: off");

    // Configured on, under a parent that had turned them off (children inherit that): on again.
    let serve = Serve::start_custom(&[], None, |command| {
        command.env("HERALD_TRANSPARENT_HUGE_PAGES", "true");
        // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
        unsafe {
            command.pre_exec(|| match libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) {
                0 => Ok(()),
                _ => Err(std::io::Error::last_os_error()),
            });
        }
    });
    let thp = proc_status(serve.child.id(), "THP_enabled");
    serve.stop();
    assert_eq!(thp.as_deref(), Some("1"), "configured on");
}

/// The server's resident memory now (`VmRSS`, bytes).
fn rss_bytes(pid: u32) -> u64 {
    proc_status(pid, "VmRSS")
        .and_then(|v| v.trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Samples a process's RSS every 10 ms on a thread of its own; `stop` returns the peak.
struct PeakRss {
    sampling: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<u64>,
}

impl PeakRss {
    fn start(pid: u32) -> PeakRss {
        let sampling = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let on = sampling.clone();
        let thread = std::thread::spawn(move || {
            let mut peak = 0;
            while on.load(std::sync::atomic::Ordering::Relaxed) {
                peak = peak.max(rss_bytes(pid));
                std::thread::sleep(Duration::from_millis(10));
            }
            peak
        });
        PeakRss { sampling, thread }
    }

    fn stop(self) -> u64 {
        self.sampling
            .store(false, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().unwrap()
    }
}

/// A 2048² × 2-byte image whose every byte depends on its index, so corruption shows.
fn image(index: u32) -> Vec<u8> {
    (0..2048 * 2048 * 2u32)
        .map(|i| (i.wrapping_mul(31) ^ index.wrapping_mul(0x9E37)) as u8)
        .collect()
}

/// POSTs one body to `/api/publish/{topic}` and returns the status line.
fn http_publish(port: u16, topic: &str, body: &[u8]) -> String {
    use std::io::Write;
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let head = format!(
        "POST /api/publish/{topic} HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    reply.lines().next().unwrap_or_default().to_owned()
}

/// Images published over HTTP as fast as possible on a `drop` and on a `conflate` topic: a
/// subscriber that reads at full speed gets every image; one that reads 4 images/s gets only
/// whole, uncorrupted images, with every skipped one counted; the server's memory stays bounded.
/// The fast subscriber is `lossless` (window 4): "as fast as possible" is then the fastest pace
/// at which it can take every image, and the slow one must not slow that pace.
#[test]
fn bulk_images_reach_a_fast_subscriber_whole_while_a_slow_one_skips() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    const IMAGES: u32 = 40;
    let limit: u64 = 48 << 20;
    let config = std::env::temp_dir().join(format!("herald-bulk-{}.toml", std::process::id()));
    std::fs::write(
        &config,
        format!(
            "max_outbound_bytes = {limit}\n[[history]]\npattern = \">\"\nmax_messages = 1\n\
             [[policy]]\npattern = \"cam/drop\"\npolicy = \"drop\"\n\
             [[policy]]\npattern = \"cam/conflate\"\npolicy = \"conflate\"\n"
        ),
    )
    .unwrap();
    let serve = Serve::start_with(&["--config", config.to_str().unwrap()], None);
    let pid = serve.child.id();
    let images: std::sync::Arc<Vec<Vec<u8>>> =
        std::sync::Arc::new((0..IMAGES).map(image).collect());
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let mut peak = 0u64;
    for topic in ["cam/drop", "cam/conflate"] {
        let url = serve.url();
        let (fast, slow) = runtime.block_on(async {
            let mut fast = tokio_tungstenite::connect_async(&url).await.unwrap().0;
            let mut slow = tokio_tungstenite::connect_async(&url).await.unwrap().0;
            let lossless =
                serde_json::json!({"op": "sub", "topic": topic, "policy": "lossless", "window": 4});
            let default = serde_json::json!({"op": "sub", "topic": topic});
            for (ws, sub) in [(&mut fast, lossless), (&mut slow, default)] {
                let sub = sub.to_string();
                ws.send(Message::text(sub)).await.unwrap();
                let reply = ws.next().await.unwrap().unwrap();
                assert!(reply.to_text().unwrap().contains("subscribed"));
            }
            (fast, slow)
        });
        // Each reader returns, per image received, (seq, payload intact), and the dropped count.
        let read = |mut ws: tokio_tungstenite::WebSocketStream<_>, pause: Duration| {
            let images = images.clone();
            async move {
                let (mut got, mut dropped) = (Vec::new(), 0u64);
                let mut last_seq = 0;
                while last_seq < IMAGES as u64 {
                    let frame = tokio::time::timeout(Duration::from_secs(60), ws.next())
                        .await
                        .expect("a frame within a minute")
                        .unwrap()
                        .unwrap();
                    match frame {
                        Message::Binary(b) => {
                            let n = u32::from_be_bytes(b[..4].try_into().unwrap()) as usize;
                            let head: serde_json::Value =
                                serde_json::from_slice(&b[4..4 + n]).unwrap();
                            last_seq = head["seq"].as_u64().unwrap();
                            let index = (last_seq - 1) as u32;
                            got.push((last_seq, b[4 + n..] == images[index as usize][..]));
                            tokio::time::sleep(pause).await;
                            if pause.is_zero() {
                                // The fast (lossless) reader grants one more image per image read.
                                let credit =
                                    serde_json::json!({"op": "credit", "topic": topic, "n": 1});
                                ws.send(Message::text(credit.to_string())).await.unwrap();
                            }
                        }
                        Message::Text(t) => {
                            let v: serde_json::Value = serde_json::from_str(&t).unwrap();
                            assert_eq!(v["op"], "dropped", "{v}");
                            dropped += v["count"].as_u64().unwrap();
                        }
                        other => panic!("{other:?}"),
                    }
                }
                (got, dropped)
            }
        };
        let fast = runtime.spawn(read(fast, Duration::ZERO));
        let slow = runtime.spawn(read(slow, Duration::from_millis(250)));
        let started = Instant::now();
        let sampler = PeakRss::start(pid);
        for img in images.iter() {
            assert!(http_publish(serve.port, topic, img).contains("200"));
        }
        let publish_secs = started.elapsed().as_secs_f64();
        let (fast, fast_dropped) = runtime.block_on(fast).unwrap();
        let fast_secs = started.elapsed().as_secs_f64();
        let (slow, slow_dropped) = runtime.block_on(slow).unwrap();
        peak = peak.max(sampler.stop());
        let expected: Vec<(u64, bool)> = (1..=IMAGES as u64).map(|s| (s, true)).collect();
        assert_eq!(
            (fast, fast_dropped),
            (expected, 0),
            "{topic}: fast gets every image"
        );
        assert!(
            slow.iter().all(|(_, whole)| *whole),
            "{topic}: slow gets whole images"
        );
        assert!(
            slow_dropped > 0,
            "{topic}: the slow subscriber skipped images"
        );
        assert_eq!(slow.len() as u64 + slow_dropped, IMAGES as u64, "{topic}");
        eprintln!(
            "{topic}: {IMAGES} images of 8 MiB published in {publish_secs:.2} s ({:.1} images/s), fast subscriber done at {fast_secs:.2} s, slow got {} and skipped {slow_dropped}; server peak RSS {} MiB",
            IMAGES as f64 / publish_secs,
            slow.len(),
            peak >> 20
        );
    }
    // Bound: two subscribers' queues (shared frames) plus the image being received and those in
    // flight, plus a fixed overhead.
    assert!(peak < 2 * limit + (64 << 20), "peak RSS {} MiB", peak >> 20);
    serve.stop();
    let _ = std::fs::remove_file(config);
}

/// `sub --save-dir --exec`: each message becomes a file named by topic and seq with an extension
/// from its content type, and the command runs once per file, in order, with its path.
#[test]
fn sub_save_dir_writes_files_and_exec_runs_per_message() {
    let serve = Serve::start();
    let dir = std::env::temp_dir().join(format!("herald-save-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let log = dir.with_extension("log");
    let command = format!(
        "sh -c 'wc -c < \"$0\" | tr -d \" \" >> {}; echo \"$HERALD_TOPIC $0\" >> {}'",
        log.display(),
        log.display()
    );
    let (mut sub, stdout) = start_sub(
        &serve,
        &[
            "cam/>",
            "--count",
            "3",
            "--policy",
            "lossless",
            "--window",
            "1",
            "--save-dir",
            dir.to_str().unwrap(),
            "--exec",
            &command,
        ],
    );
    let image = std::env::temp_dir().join(format!("herald-save-{}.fits", std::process::id()));
    std::fs::write(&image, vec![7u8; 5000]).unwrap();
    for (topic, ct) in [
        ("cam/1/raw", "image/fits"),
        ("cam/1/raw", "image/fits"),
        ("cam/2", "application/json"),
    ] {
        let mut args = vec!["pub", topic, "--ct", ct];
        if ct == "image/fits" {
            args.extend(["--file", image.to_str().unwrap()]);
        } else {
            args.push("{\"ok\":true}");
        }
        assert!(serve.herald(&args).status().unwrap().success());
    }
    assert!(sub.wait().unwrap().success());
    let printed: Vec<String> = stdout.lines().map(Result::unwrap).collect();
    let names = ["cam_1_raw-1.fits", "cam_1_raw-2.fits", "cam_2-1.json"];
    let expected: Vec<String> = names
        .iter()
        .map(|n| dir.join(n).display().to_string())
        .collect();
    assert_eq!(printed, expected);
    assert_eq!(std::fs::read(dir.join(names[0])).unwrap(), vec![7u8; 5000]);
    assert_eq!(
        std::fs::read_to_string(dir.join(names[2])).unwrap(),
        "{\"ok\":true}"
    );
    let ran: Vec<String> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(
        ran,
        [
            "5000".to_owned(),
            format!("cam/1/raw {}", expected[0]),
            "5000".to_owned(),
            format!("cam/1/raw {}", expected[1]),
            "11".to_owned(),
            format!("cam/2 {}", expected[2]),
        ]
    );
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_file(&log);
    let _ = std::fs::remove_file(&image);
    serve.stop();
}

/// A ping round trip: herald has handled every request sent before it once the pong is here.
async fn round_trip(
    ws: &mut tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >,
) {
    use futures_util::{SinkExt, StreamExt};
    let ping = serde_json::json!({"op": "ping", "id": 1}).to_string();
    ws.send(tokio_tungstenite::tungstenite::Message::text(ping))
        .await
        .unwrap();
    while !ws
        .next()
        .await
        .unwrap()
        .unwrap()
        .to_text()
        .unwrap_or("")
        .contains("pong")
    {}
}

/// Memory bound: subscribers that never read, one `drop` and one `conflate`, while a publisher
/// sends 40 times the outbound limit. The server's RSS must stay under a fixed overhead plus
/// twice `max_outbound_bytes` per stuck subscriber: the queue is bounded by the limit, and the
/// batch its writer already took from it (stuck in a write to the full socket) by the limit too
/// (docs/semantics.md). An unbounded queue would hold everything published (320 MiB here).
/// Then the subscribers read: the `drop` one gets whole messages plus notices whose counts make
/// up exactly what was published; the `conflate` one ends on every topic's newest value.
#[test]
fn memory_stays_bounded_under_subscribers_that_never_read() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    const LIMIT: u64 = 8 << 20;
    const SIZE: usize = 256 << 10;
    const MESSAGES: u64 = 640; // per policy: 160 MiB each, 20 × the limit
    const TOPICS: u64 = 16; // conflate topics: 16 × 256 KiB waiting fit in the limit
                            // The subscribers send nothing for the whole test: no idle timeout (a slow CI run could
                            // reach it), and no rate limits for the publisher.
    let config = std::env::temp_dir().join(format!("herald-mem-{}.toml", std::process::id()));
    std::fs::write(
        &config,
        format!(
            "max_outbound_bytes = {LIMIT}\n[[history]]\npattern = \">\"\nmax_messages = 1\n\
             [[policy]]\npattern = \"mem/drop/>\"\npolicy = \"drop\"\n\
             [[policy]]\npattern = \"mem/conflate/>\"\npolicy = \"conflate\"\n\
             [limits]\nmax_bytes_per_sec = 0\nmax_messages_per_sec = 0\nidle_timeout_secs = 0\n"
        ),
    )
    .unwrap();
    let serve = Serve::start_with(&["--config", config.to_str().unwrap()], None);
    let pid = serve.child.id();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let url = serve.url();
    let (peak, baseline, drop_sub, conflate_sub) = runtime.block_on(async {
        let connect = || tokio_tungstenite::connect_async(url.clone());
        let mut publisher = connect().await.unwrap().0;
        let mut subs = vec![];
        for pattern in ["mem/drop/>", "mem/conflate/>"] {
            let mut ws = connect().await.unwrap().0;
            let req = serde_json::json!({"op": "sub", "topic": pattern}).to_string();
            ws.send(Message::text(req)).await.unwrap();
            let reply = ws.next().await.unwrap().unwrap();
            assert!(reply.to_text().unwrap().contains("subscribed"), "{reply}");
            subs.push(ws);
        }
        let frame = |topic: &str, i: u64| {
            let head = serde_json::json!({"op": "pub", "topic": topic}).to_string();
            let mut f = (head.len() as u32).to_be_bytes().to_vec();
            f.extend_from_slice(head.as_bytes());
            f.extend_from_slice(&i.to_be_bytes());
            f.resize(4 + head.len() + SIZE, (i % 251) as u8);
            Message::binary(f)
        };
        // Warm up the allocator and every topic once, then take the baseline.
        publisher.send(frame("mem/drop/a", 0)).await.unwrap();
        for t in 0..TOPICS {
            publisher
                .send(frame(&format!("mem/conflate/{t}"), 0))
                .await
                .unwrap();
        }
        round_trip(&mut publisher).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        let baseline = rss_bytes(pid);
        let sampler = PeakRss::start(pid);
        for i in 1..=MESSAGES {
            publisher.send(frame("mem/drop/a", i)).await.unwrap();
            let topic = format!("mem/conflate/{}", i % TOPICS);
            publisher.send(frame(&topic, i)).await.unwrap();
            if i % 32 == 0 {
                round_trip(&mut publisher).await;
            }
        }
        round_trip(&mut publisher).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        let peak = sampler.stop();
        let conflate_sub = subs.pop().unwrap();
        (peak, baseline, subs.pop().unwrap(), conflate_sub)
    });
    let grew = peak.saturating_sub(baseline);
    eprintln!(
        "never-reading drop + conflate subscribers, limit {} MiB, {} MiB published: server RSS {} MiB at rest, peak {} MiB (+{} MiB)",
        LIMIT >> 20,
        (2 * MESSAGES * SIZE as u64) >> 20,
        baseline >> 20,
        peak >> 20,
        grew >> 20
    );
    assert!(
        grew < 2 * 2 * LIMIT + (16 << 20),
        "RSS grew by {} MiB with two stuck subscribers and a {} MiB limit",
        grew >> 20,
        LIMIT >> 20
    );
    // Now they read. Every message of the drop topic is either received whole or announced.
    let (received, dropped, whole) = runtime.block_on(async move {
        let mut ws = drop_sub;
        let (mut received, mut dropped, mut whole) = (0u64, 0u64, true);
        while let Ok(Some(Ok(m))) = tokio::time::timeout(Duration::from_secs(1), ws.next()).await {
            match m {
                Message::Binary(b) => {
                    let n = u32::from_be_bytes(b[..4].try_into().unwrap()) as usize;
                    let i = u64::from_be_bytes(b[4 + n..12 + n].try_into().unwrap());
                    whole &= b.len() == 4 + n + SIZE && b[b.len() - 1] == (i % 251) as u8;
                    received += 1;
                }
                Message::Text(t) => {
                    let v: serde_json::Value = serde_json::from_str(&t).unwrap();
                    assert_eq!(v["op"], "dropped", "{v}");
                    dropped += v["count"].as_u64().unwrap();
                }
                // herald pings a connection that has been quiet for a while.
                Message::Ping(_) | Message::Pong(_) => {}
                other => panic!("{other:?}"),
            }
        }
        (received, dropped, whole)
    });
    assert!(whole, "drop: every message whole");
    assert!(dropped > 0, "drop: messages were dropped");
    // (The warm-up message, then MESSAGES.)
    assert_eq!(
        received + dropped,
        MESSAGES + 1,
        "drop: received + announced = published"
    );
    let last = runtime.block_on(async move {
        let mut ws = conflate_sub;
        let mut last = std::collections::HashMap::new();
        while let Ok(Some(Ok(m))) = tokio::time::timeout(Duration::from_secs(1), ws.next()).await {
            if let Message::Binary(b) = m {
                let n = u32::from_be_bytes(b[..4].try_into().unwrap()) as usize;
                let head: serde_json::Value = serde_json::from_slice(&b[4..4 + n]).unwrap();
                let seq = head["seq"].as_u64().unwrap();
                let old = last.insert(head["topic"].as_str().unwrap().to_owned(), seq);
                assert!(old.is_none_or(|o| o < seq), "conflate: never a stale value");
            }
        }
        last
    });
    for t in 0..TOPICS {
        // Topic t got the warm-up message (seq 1) and every i ≡ t (mod TOPICS).
        let newest = 1 + (1..=MESSAGES).filter(|i| i % TOPICS == t).count() as u64;
        assert_eq!(
            last.get(&format!("mem/conflate/{t}")),
            Some(&newest),
            "conflate: topic {t} ends on its newest value"
        );
    }
    let logs = serve.stop();
    assert!(!logs.contains("slow consumer"), "{logs}");
    let _ = std::fs::remove_file(config);
}
