//! herald's load generator: `herald bench SCENARIO.toml [overrides…]` (an sdkperf-class tool).
//!
//! Map of the crate (data flows top to bottom):
//! - [`scenario`] — the TOML scenario, its sweeps, and command-line overrides → steps.
//! - [`runner`]   — runs the steps of each kind (fan-out, filtering, proxy latency, stock
//!   exchange, images): connect, subscribe, publish, warm up, measure, drain, collect.
//! - [`schedule`] — pacing (when each message is due), the spread topic order, and which topics
//!   each subscriber holds. Pure arithmetic.
//! - [`publish`]  — publisher connections: one thread each, blocking client, precise pacing.
//! - [`load`]     — subscriber connections: a pool of WebSocket clients on one event-loop thread.
//! - [`policy_sub`] — subscribers with a slow-consumer policy, one thread each (slow image
//!   readers, conflating wildcard subscribers), checking what the policy promises.
//! - [`group`]    — pools in this process or in worker processes (past ~19,000 connections).
//! - [`wire`]     — the native protocol's frames, and cheap parsing of deliveries.
//! - [`integrity`] — lost / duplicate / out-of-order / discard accounting per subscriber+topic.
//! - [`arrivals`] — with `--samples`: how much of herald → subscriber was herald's and how much
//!   the bench's, from the kernel's receive stamps.
//! - [`fairness`] — each subscriber's own p99, and their spread (best, median, worst).
//! - [`stats`]    — histograms and the seeds' statistics (mean, median, mode, p99, p99.9, …).
//! - [`report`]   — progress line, Markdown table, JSON, SVG plot.
//! - [`spawn`]    — `--spawn`: a `herald serve` child, pinned apart from the bench.
//! - [`sys`]      — CPU time, CPU affinity, open-file limit.
//! - [`loopback`] — what a small loopback write costs on this machine now (in every report).
//!
//! The CLI wires it as `Command::Bench(herald_bench::BenchArgs) => herald_bench::run(args)`.
//! See docs/bench.md for the flags, the scenario format and the JSON schema.

pub mod arrivals;
pub mod fairness;
pub mod group;
pub mod integrity;
pub mod load;
pub mod loopback;
pub mod mqtt;
pub mod policy_sub;
pub mod protocol;
pub mod publish;
pub mod report;
pub mod runner;
pub mod scenario;
pub mod schedule;
pub mod spawn;
pub mod stats;
pub mod stomp;
pub mod sys;
pub mod wire;
pub mod ws_client;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;

use anyhow::{Context, Result};

use crate::report::{Machine, Progress, RunReport};
use crate::scenario::{parse_assignment, parse_value, Kind, Scenario, Sweep};

/// Run a load scenario against herald and report throughput, latency and integrity.
#[derive(Debug, Clone, Default, clap::Args)]
#[command(
    after_help = "Examples:\n  herald bench bench/scenarios/solace-3.1.1-high.toml --spawn --json out.json --plot out.svg\n  herald bench bench/scenarios/solace-3.1.2-very-high.toml --url ws://127.0.0.1:8080/ws --clients 500 --duration 10\n  herald bench --kind fanout --clients 200 --topics 1000 --subs 10 --rate 2000 --spawn\n  herald bench bench/scenarios/solace-3.1.2-very-high.toml --spawn --clients 1000 --set protocol=mqtt\n  herald bench bench/scenarios/proxy-latency-stomp.toml --spawn\nSee docs/bench.md for the scenario format and the JSON report."
)]
pub struct BenchArgs {
    /// Scenario file (TOML). Without one, the scenario is built from --kind and the flags.
    pub scenario: Option<PathBuf>,

    /// Kind of load when no scenario file is given.
    #[arg(long, value_enum, default_value_t = Kind::Fanout)]
    pub kind: Kind,

    /// WebSocket URL of a running herald (ignored with --spawn).
    #[arg(long, default_value = "ws://127.0.0.1:8080/ws")]
    pub url: String,

    /// Connect subscribers to these URLs instead, round-robin (repeatable): e.g. the nodes of
    /// a cluster, with the publishers on --url.
    #[arg(long = "sub-url", value_name = "URL")]
    pub sub_urls: Vec<String>,

    /// Start a herald server (`herald serve`) as a child process for the run, pinned to core 0
    /// with the bench on core 1 when there are two cores or more.
    #[arg(long)]
    pub spawn: bool,

    /// The herald binary to spawn (implies --spawn; default: this executable).
    #[arg(long, value_name = "PATH")]
    pub spawn_bin: Option<PathBuf>,

    /// Extra argument for the spawned `herald serve` (repeatable), after the scenario's own.
    #[arg(long = "server-arg", value_name = "ARG", allow_hyphen_values = true)]
    pub server_args: Vec<String>,

    /// Do not pin the spawned server and the bench to separate cores, nor the threads of the
    /// loopback probe (`machine.loopback_write_us`) to cores 0 and 1.
    #[arg(long)]
    pub no_pin: bool,

    /// The process id of the server at --url (not spawned): its CPU use is reported as a
    /// spawned server's is (e.g. a Mosquitto started by bench/mqtt-vs-mosquitto.sh).
    #[arg(long, value_name = "PID", conflicts_with_all = ["spawn", "spawn_bin"])]
    pub server_pid: Option<u32>,

    /// Subscriber connections; replaces any sweep with this one step.
    #[arg(long, value_name = "N")]
    pub clients: Option<u64>,

    /// Seconds measured per step; replaces any sweep with one step.
    #[arg(long, value_name = "SECS")]
    pub duration: Option<f64>,

    /// Seconds of load before measuring.
    #[arg(long, value_name = "SECS")]
    pub warmup: Option<f64>,

    /// Total publish rate, msg/s.
    #[arg(long, value_name = "MSG_PER_S")]
    pub rate: Option<f64>,

    /// Number of topics.
    #[arg(long, value_name = "T")]
    pub topics: Option<u64>,

    /// Subscriptions per subscriber connection.
    #[arg(long = "subs", value_name = "S")]
    pub subs_per_client: Option<u64>,

    /// Publisher connections sharing the rate.
    #[arg(long, value_name = "P")]
    pub publishers: Option<u64>,

    /// Payload size in bytes.
    #[arg(long, value_name = "BYTES")]
    pub payload: Option<u64>,

    /// Publish binary frames instead of JSON text.
    #[arg(long)]
    pub binary: bool,

    /// Do not ask herald to stamp messages (no publish→server / server→subscriber split).
    #[arg(long)]
    pub no_stamp: bool,

    /// Proxy latency: trials per setting.
    #[arg(long, value_name = "N")]
    pub trials: Option<u64>,

    /// Set any scenario parameter, e.g. `--set discard_rate=500000` (repeatable; see docs/bench.md).
    #[arg(long = "set", value_name = "NAME=VALUE")]
    pub set: Vec<String>,

    /// Replace the scenario's sweeps with one: `--sweep clients=1000,2000,4000`.
    #[arg(long, value_name = "NAME=V1,V2,…")]
    pub sweep: Option<String>,

    /// Write the full report as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,

    /// Write every delivery measured in a fan-out or filtering step's window to FILE, a line
    /// each: send time, herald's stamp (0 without one), receive time, and when the bytes
    /// reached the bench's socket (the kernel's stamp; 0 without one), µs since the UNIX
    /// epoch; the report then splits herald → subscriber at that stamp. To find where a tail
    /// comes from; ~68 bytes a delivery on disk, 32 in memory until the step ends.
    #[arg(long, value_name = "FILE")]
    pub samples: Option<PathBuf>,

    /// Write latency percentiles against the swept parameter as an SVG plot to FILE.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,

    /// Also write the Markdown table to FILE (it is always printed on stdout).
    #[arg(long, value_name = "FILE")]
    pub markdown: Option<PathBuf>,

    /// No progress output on stderr (the table is still printed).
    #[arg(long, short)]
    pub quiet: bool,

    /// Internal: run as a subscriber worker process driven over stdin/stdout.
    #[arg(long, hide = true)]
    pub worker: bool,
}

impl BenchArgs {
    /// The overrides the flags make, as (parameter, value).
    fn overrides(&self) -> Result<Vec<(String, toml::Value)>> {
        let mut o: Vec<(String, toml::Value)> = vec![];
        let mut f = |k: &str, v: toml::Value| o.push((k.to_string(), v));
        if let Some(v) = self.clients {
            f("clients", toml::Value::Integer(v as i64));
        }
        if let Some(v) = self.duration {
            f("duration", toml::Value::Float(v));
        }
        if let Some(v) = self.warmup {
            f("warmup", toml::Value::Float(v));
        }
        if let Some(v) = self.rate {
            f("rate", toml::Value::Float(v));
        }
        if let Some(v) = self.topics {
            f("topics", toml::Value::Integer(v as i64));
        }
        if let Some(v) = self.subs_per_client {
            f("subs_per_client", toml::Value::Integer(v as i64));
        }
        if let Some(v) = self.publishers {
            f("publishers", toml::Value::Integer(v as i64));
        }
        if let Some(v) = self.payload {
            f("payload", toml::Value::Integer(v as i64));
        }
        if self.binary {
            f("binary", toml::Value::Boolean(true));
        }
        if self.no_stamp {
            f("stamp", toml::Value::Boolean(false));
        }
        if let Some(v) = self.trials {
            f("trials", toml::Value::Integer(v as i64));
        }
        for s in &self.set {
            o.push(parse_assignment(s)?);
        }
        Ok(o)
    }
}

/// Runs `herald bench`.
pub async fn run(args: BenchArgs) -> Result<()> {
    if args.worker {
        return tokio::task::spawn_blocking(group::worker_main).await?;
    }
    sys::raise_nofile();
    let mut scenario = match &args.scenario {
        Some(p) => Scenario::load(p)?,
        None => Scenario::adhoc(args.kind),
    };
    if let Some(sw) = &args.sweep {
        let (param, values) = sw
            .split_once('=')
            .with_context(|| format!("--sweep expects NAME=V1,V2,…, got {sw:?}"))?;
        scenario.sweep = vec![Sweep {
            param: param.trim().to_string(),
            values: values.split(',').map(|v| parse_value(v.trim())).collect(),
            single: None,
        }];
    }
    let overrides = args.overrides()?;
    let collapse = args.clients.is_some() || args.duration.is_some();
    let steps = scenario.steps(&overrides, collapse)?;
    let steps_asked = steps.len();

    if args.samples.is_some() && !matches!(scenario.kind, Kind::Fanout | Kind::Filtering) {
        anyhow::bail!(
            "--samples applies to fan-out and filtering scenarios, not {}",
            scenario.kind.as_str()
        );
    }
    // Created first, so that a path that cannot be written fails before any load runs.
    let samples = match &args.samples {
        Some(path) => Some(std::io::BufWriter::new(
            std::fs::File::create(path)
                .with_context(|| format!("cannot create {}", path.display()))?,
        )),
        None => None,
    };
    let spawn = args.spawn || args.spawn_bin.is_some();
    let config_file = (spawn && !scenario.server_config.is_empty())
        .then(|| std::env::temp_dir().join(format!("herald-bench-{}.toml", std::process::id())));
    if let Some(path) = &config_file {
        std::fs::write(path, &scenario.server_config)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    // Before the server starts, so that its core is idle: the writer stands where herald will.
    // Pinned apart against a server the bench did not start too (by convention on core 0), so
    // that every report's figure is the same measure: with both ends on the bench's core a
    // write costs a fraction of one across cores.
    let pin = spawn::pins(!args.no_pin);
    let loopback_write_us =
        tokio::task::spawn_blocking(move || loopback::write_cost_us(pin)).await?;
    let server = if spawn {
        let bin = args.spawn_bin.clone();
        let mut sargs = scenario.server_args.clone();
        if let Some(path) = &config_file {
            sargs.extend(["--config".into(), path.display().to_string()]);
        }
        sargs.extend(args.server_args.iter().cloned());
        let pin = !args.no_pin;
        Some(tokio::task::spawn_blocking(move || spawn::Server::start(bin, &sargs, pin)).await??)
    } else {
        None
    };
    let url = server
        .as_ref()
        .map(|s| s.url())
        .unwrap_or_else(|| args.url.clone());
    let pinned = server.as_ref().is_some_and(|s| s.pinned);
    if let Some(pid) = args.server_pid {
        if sys::process_cpu_seconds(pid).is_none() {
            anyhow::bail!("--server-pid {pid}: no such process whose CPU time can be read");
        }
    }
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);

    let stop = Arc::new(AtomicBool::new(false));
    let mut ctx = runner::Ctx {
        url: url.clone(),
        sub_urls: args.sub_urls.clone(),
        progress: Progress::new(args.quiet),
        stop: stop.clone(),
        bench_cores: sys::allowed_cores(),
        server_pid: server.as_ref().map(|s| s.pid()).or(args.server_pid),
        samples,
    };
    if !args.quiet {
        eprintln!(
            "herald bench: {} ({}), {} step(s) against {url}{}",
            scenario.name,
            scenario.kind.as_str(),
            steps.len(),
            if pinned {
                " (server on core 0, bench on core 1)"
            } else {
                ""
            }
        );
    }
    let kind = scenario.kind;
    let mut job = tokio::task::spawn_blocking(move || {
        let r = runner::run_all(&mut ctx, kind, &steps);
        ctx.progress.finish();
        (r, ctx.bench_cores)
    });
    let (result, bench_cores) = tokio::select! {
        r = &mut job => r?,
        _ = tokio::signal::ctrl_c() => {
            stop.store(true, Relaxed);
            let _ = tokio::time::timeout(std::time::Duration::from_secs(10), job).await;
            drop(server);
            if let Some(path) = &config_file {
                let _ = std::fs::remove_file(path);
            }
            anyhow::bail!("interrupted (Ctrl-C); the spawned server, if any, was stopped");
        }
    };
    drop(server);
    if let Some(path) = &config_file {
        let _ = std::fs::remove_file(path);
    }
    let runner::Ran {
        results: steps,
        summary,
        stopped,
    } = result?;

    let report = RunReport {
        scenario: scenario.name.clone(),
        kind: scenario.kind,
        seed: scenario.seed.clone(),
        description: scenario.description.clone(),
        command: std::env::args().collect(),
        started_unix: started,
        target: url,
        spawned: spawn,
        machine: Machine {
            cores: sys::machine_cores(),
            mem_gib: sys::machine_mem_gib(),
            bench_cores,
            pinned,
            loopback_write_us,
        },
        steps,
        summary,
    };
    let md = report::markdown(&report);
    println!("{md}");
    if let Some(p) = &args.markdown {
        std::fs::write(p, &md).with_context(|| format!("cannot write {}", p.display()))?;
    }
    if let Some(p) = &args.json {
        std::fs::write(p, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("cannot write {}", p.display()))?;
    }
    if let Some(p) = &args.plot {
        std::fs::write(p, report::svg(&report))
            .with_context(|| format!("cannot write {}", p.display()))?;
    }
    match stopped {
        // The steps that ran are reported above; the exit status says the sweep is incomplete.
        Some(e) => Err(e.context(format!(
            "the sweep stopped at step {} of {}; the steps before it are reported above",
            report.steps.len() + 1,
            steps_asked
        ))),
        None => Ok(()),
    }
}
