//! Groups of subscriber clients, in this process or in worker processes.
//!
//! A process may hold at most 20,000 open files here, so past `max_conns_per_process`
//! (default 19,000) connections the bench spreads subscribers over worker processes: the same
//! binary run as `herald bench --worker`, driven over its stdin/stdout by JSON lines:
//!
//! * parent → worker: the [`ClientSpec`] (first line), then commands
//!   `{"cmd":"add","from":F,"to":T}`, `{"cmd":"window","start":US,"end":US}`,
//!   `{"cmd":"collect"}`, `{"cmd":"shutdown"}`;
//! * worker → parent: `{"progress":{…}}` four times a second, `{"snapshot":{…}}` per collect.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::load::{ClientSpec, Pool, Progress, Shared, Snapshot, SnapshotWire};
use crate::sys;

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "lowercase")]
enum WorkerCmd {
    Add { from: u64, to: u64 },
    Window { start: u64, end: u64 },
    Collect,
    Shutdown,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum WorkerMsg {
    Progress(Progress),
    Snapshot(Box<SnapshotWire>),
}

/// Subscribers in this process (a pool thread) or in a worker process.
pub enum Group {
    Local(Pool),
    Remote(Worker),
}

impl Group {
    pub fn shared(&self) -> &Arc<Shared> {
        match self {
            Group::Local(p) => &p.shared,
            Group::Remote(w) => &w.shared,
        }
    }

    pub fn add(&self, from: u64, to: u64) -> Result<()> {
        match self {
            Group::Local(p) => {
                p.add(from, to);
                Ok(())
            }
            Group::Remote(w) => w.send(&WorkerCmd::Add { from, to }),
        }
    }

    /// Sets the measuring window (wall-clock µs since the UNIX epoch).
    pub fn set_window(&self, start: u64, end: u64) -> Result<()> {
        match self {
            Group::Local(p) => {
                p.shared.win_start_us.store(start, Relaxed);
                p.shared.win_end_us.store(end, Relaxed);
                Ok(())
            }
            Group::Remote(w) => w.send(&WorkerCmd::Window { start, end }),
        }
    }

    pub fn collect(&self) -> Result<Snapshot> {
        match self {
            Group::Local(p) => p.collect(),
            Group::Remote(w) => w.request(&WorkerCmd::Collect),
        }
    }

    pub fn shutdown(self) -> Result<Snapshot> {
        match self {
            Group::Local(p) => p.shutdown(),
            Group::Remote(mut w) => {
                let s = w.request(&WorkerCmd::Shutdown);
                let _ = w.child.wait();
                s
            }
        }
    }
}

/// Sum of the live counters of several groups.
pub fn progress(groups: &[Group]) -> Progress {
    let mut p = Progress::default();
    for g in groups {
        p.add(&g.shared().progress());
    }
    p
}

/// Starts `n` groups of subscribers: threads of this process, or worker processes.
pub fn start_groups(spec: &ClientSpec, n: usize, processes: bool) -> Result<Vec<Group>> {
    (0..n.max(1))
        .map(|_| {
            Ok(if processes {
                Group::Remote(Worker::spawn(spec)?)
            } else {
                Group::Local(Pool::start(spec.clone(), Shared::new())?)
            })
        })
        .collect()
}

/// A worker process seen from the parent.
pub struct Worker {
    child: Child,
    stdin: Mutex<ChildStdin>,
    pub shared: Arc<Shared>,
    snapshots: Mutex<mpsc::Receiver<Result<Snapshot>>>,
}

impl Worker {
    fn spawn(spec: &ClientSpec) -> Result<Worker> {
        let exe = std::env::current_exe().context("cannot find the bench's own executable")?;
        let mut child = Command::new(&exe)
            .args(["bench", "--worker"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| {
                format!(
                    "cannot start a bench worker process ({} bench --worker)",
                    exe.display()
                )
            })?;
        let mut stdin = child.stdin.take().unwrap();
        writeln!(stdin, "{}", serde_json::to_string(spec)?)?;
        let stdout = child.stdout.take().unwrap();
        let shared = Shared::new();
        let (tx, rx) = mpsc::channel();
        let sh = shared.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                match serde_json::from_str::<WorkerMsg>(&line) {
                    Ok(WorkerMsg::Progress(p)) => sh.set_progress(&p),
                    Ok(WorkerMsg::Snapshot(s)) => {
                        let _ = tx.send(s.into_snapshot());
                    }
                    Err(e) => {
                        let _ = tx.send(Err(anyhow::anyhow!(
                            "bad line from bench worker: {e}: {line}"
                        )));
                    }
                }
            }
        });
        Ok(Worker {
            child,
            stdin: Mutex::new(stdin),
            shared,
            snapshots: Mutex::new(rx),
        })
    }

    fn send(&self, cmd: &WorkerCmd) -> Result<()> {
        let mut s = self.stdin.lock().unwrap();
        writeln!(s, "{}", serde_json::to_string(cmd)?).context("bench worker process has gone")?;
        s.flush()?;
        Ok(())
    }

    fn request(&self, cmd: &WorkerCmd) -> Result<Snapshot> {
        self.send(cmd)?;
        self.snapshots
            .lock()
            .unwrap()
            .recv_timeout(Duration::from_secs(120))
            .context("bench worker process did not answer")?
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The worker process's main loop (`herald bench --worker`).
pub fn worker_main() -> Result<()> {
    sys::raise_nofile();
    let mut first = String::new();
    // Stdin is buffered globally, so the reader thread below continues where this left off.
    std::io::stdin()
        .read_line(&mut first)
        .context("no spec on stdin")?;
    let spec: ClientSpec = serde_json::from_str(&first).context("bad spec on stdin")?;
    let (tx, rx) = mpsc::channel::<WorkerCmd>();
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        for line in stdin.lock().lines() {
            let Ok(line) = line else { break };
            match serde_json::from_str(&line) {
                Ok(cmd) => {
                    if tx.send(cmd).is_err() {
                        break;
                    }
                }
                Err(e) => eprintln!("bench worker: bad command {line:?}: {e}"),
            }
        }
        // Parent gone: shut down.
        let _ = tx.send(WorkerCmd::Shutdown);
    });
    let pool = Pool::start(spec, Shared::new())?;
    let out = std::io::stdout();
    let mut cpu = sys::cpu_seconds();
    let emit = |m: &WorkerMsg| -> Result<()> {
        let mut o = out.lock();
        writeln!(o, "{}", serde_json::to_string(m)?)?;
        o.flush()?;
        Ok(())
    };
    loop {
        match rx.recv_timeout(Duration::from_millis(250)) {
            Ok(WorkerCmd::Add { from, to }) => pool.add(from, to),
            Ok(WorkerCmd::Window { start, end }) => {
                pool.shared.win_start_us.store(start, Relaxed);
                pool.shared.win_end_us.store(end, Relaxed);
            }
            Ok(WorkerCmd::Collect) => {
                let mut s = pool.collect()?;
                let now = sys::cpu_seconds();
                s.cpu_s = now - cpu;
                cpu = now;
                emit(&WorkerMsg::Snapshot(Box::new(s.to_wire())))?;
            }
            Ok(WorkerCmd::Shutdown) => {
                let mut s = pool.shutdown()?;
                s.cpu_s = sys::cpu_seconds() - cpu;
                emit(&WorkerMsg::Snapshot(Box::new(s.to_wire())))?;
                return Ok(());
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => bail!("command channel closed"),
        }
        emit(&WorkerMsg::Progress(pool.shared.progress()))?;
    }
}
