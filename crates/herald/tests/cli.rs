//! The `herald` binary as a user runs it: serve, pub, sub, exit codes, SIGTERM.

use std::io::{BufRead, BufReader, Read};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const HERALD: &str = env!("CARGO_BIN_EXE_herald");

/// `herald serve` on a free loopback port; SIGTERMed (and checked to exit 0) by `stop`.
struct Serve {
    child: Child,
    port: u16,
    /// The admin API key `/metrics` needs when auth is on.
    admin_key: Option<String>,
}

impl Serve {
    fn start() -> Serve {
        Serve::start_with(&[], None)
    }

    /// `herald serve` with extra arguments; `admin_key` is the key those arguments configure.
    fn start_with(extra: &[&str], admin_key: Option<&str>) -> Serve {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(HERALD)
            .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .args(extra)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
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
        }
    }

    fn url(&self) -> String {
        format!("ws://127.0.0.1:{}/ws", self.port)
    }

    fn herald(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(HERALD);
        cmd.args(args).env("HERALD_URL", self.url());
        cmd
    }

    fn stop(mut self) -> String {
        unsafe { libc_kill(self.child.id() as i32, 15) };
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

extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
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
    curl.args(["-s", &format!("http://127.0.0.1:{}/metrics", serve.port)]);
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

#[test]
fn serve_speaks_tls_with_the_tls_flags() {
    let dir = std::env::temp_dir().join(format!("herald-cli-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    succeed(
        Command::new("openssl")
            .args([
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
            ])
            .args(["-nodes", "-subj", "/CN=localhost", "-days", "1"])
            .args([
                "-keyout",
                key.to_str().unwrap(),
                "-out",
                cert.to_str().unwrap(),
            ]),
    );
    let serve = Serve::start_with(
        &[
            "--tls-cert-file",
            cert.to_str().unwrap(),
            "--tls-key-file",
            key.to_str().unwrap(),
        ],
        None,
    );
    let out = Command::new("curl")
        .args(["-s", "--cacert", cert.to_str().unwrap()])
        .args(["--resolve", &format!("localhost:{}:127.0.0.1", serve.port)])
        .arg(format!("https://localhost:{}/healthz", serve.port))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ok\n");
    serve.stop();
    std::fs::remove_dir_all(dir).unwrap();
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
