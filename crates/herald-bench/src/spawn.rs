//! `--spawn`: run a herald server as a child process for the length of the bench.
//!
//! The child is `herald serve --listen 127.0.0.1:PORT` (this very executable, or `--spawn-bin`),
//! on a free port. With two cores or more it is pinned to core 0 and the bench to core 1, so the
//! load generator and the server do not compete for one core (as `taskset` would do). The bench
//! waits for `GET /healthz` to answer 200, and kills the child when the [`Server`] is dropped:
//! at the end, on an error, or on Ctrl-C (the caller returns, and drops it).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::sys;

pub struct Server {
    child: Child,
    pub addr: SocketAddr,
    pub log: PathBuf,
    pub pinned: bool,
}

/// Whether a spawned server and the bench, and the loopback probe's two ends, are pinned apart
/// when `asked`: only with two cores or more (the server's side on core 0, the bench's on
/// core 1).
pub fn pins(asked: bool) -> bool {
    asked && sys::machine_cores() >= 2
}

impl Server {
    pub fn url(&self) -> String {
        format!("ws://{}/ws", self.addr)
    }

    /// Starts the server and waits until it is healthy.
    pub fn start(bin: Option<PathBuf>, extra_args: &[String], pin: bool) -> Result<Server> {
        let bin = match bin {
            Some(b) => b,
            None => {
                std::env::current_exe().context("cannot find the herald executable to spawn")?
            }
        };
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let log = std::env::temp_dir().join(format!("herald-bench-serve-{port}.log"));
        let logf = std::fs::File::create(&log)
            .with_context(|| format!("cannot create {}", log.display()))?;
        let mut cmd = Command::new(&bin);
        cmd.arg("serve")
            .arg("--listen")
            .arg(addr.to_string())
            .args(extra_args)
            .stdin(Stdio::null())
            .stdout(logf.try_clone()?)
            .stderr(logf);
        let pinned = pins(pin);
        if pinned {
            // SAFETY: the hook only calls sched_setaffinity, which is async-signal-safe.
            unsafe {
                cmd.pre_exec(|| sys::pin_current_thread(0));
            }
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("cannot start {} serve", bin.display()))?;
        let mut server = Server {
            child,
            addr,
            log,
            pinned,
        };
        if pinned {
            sys::pin_process(1).context("cannot pin the bench to core 1")?;
        }
        server.wait_healthy(Duration::from_secs(20))?;
        Ok(server)
    }

    fn wait_healthy(&mut self, timeout: Duration) -> Result<()> {
        let t0 = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait()? {
                let tail = std::fs::read_to_string(&self.log).unwrap_or_default();
                let tail: String = tail
                    .lines()
                    .rev()
                    .take(20)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect::<Vec<_>>()
                    .join("\n");
                bail!("the spawned herald server exited ({status}) before it was healthy; its log ({}):\n{tail}", self.log.display());
            }
            if healthz(self.addr).unwrap_or(false) {
                return Ok(());
            }
            if t0.elapsed() > timeout {
                bail!(
                    "the spawned herald server did not answer GET /healthz with 200 within {}s (log: {})",
                    timeout.as_secs(),
                    self.log.display()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// True while the child is running.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            // SIGTERM first (a clean shutdown), SIGKILL if it lingers.
            // SAFETY: kill on our own child's pid.
            unsafe {
                libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM);
            }
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_secs(3) {
                if let Ok(Some(_)) = self.child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `GET /healthz` → true on a 200.
pub fn healthz(addr: SocketAddr) -> Result<bool> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(500))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    write!(
        s,
        "GET /healthz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut buf = [0u8; 64];
    let n = s.read(&mut buf)?;
    let head = String::from_utf8_lossy(&buf[..n]);
    Ok(head.starts_with("HTTP/1.1 200") || head.starts_with("HTTP/1.0 200"))
}
