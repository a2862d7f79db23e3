//! What a run reports: one [`StepResult`] per step, the live progress line, the final Markdown
//! table (in the seed's columns for each kind), the JSON file and the SVG plot.

use std::fmt::Write as _;
use std::io::IsTerminal;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::arrivals::ArrivalLegs;
use crate::fairness::Fairness;
use crate::loopback;
use crate::protocol::Protocol;
use crate::scenario::Kind;
use crate::stats::Summary;
use crate::sys::Contention;

/// The result of one step. The first fields are the contract scripts rely on (docs/bench.md).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct StepResult {
    /// Subscriber connections (stock exchange: all clients).
    pub clients: u64,
    /// Deliveries per second expected from the offered publish rate and the fan-out.
    pub egress_expected: f64,
    /// Deliveries per second received in the measuring window.
    pub egress_achieved: f64,
    /// Publish rate achieved in the window, msg/s (all publishers, discard load excluded).
    pub publish_rate: f64,
    pub lost: u64,
    pub duplicates: u64,
    pub out_of_order: u64,
    pub discard_notices: u64,
    /// The bench used > 90% of the cores it runs on: figures show the bench's limit.
    pub bench_cpu_saturated: bool,
    /// Send → receive, µs.
    pub latency_us: Summary,
    /// The swept parameters of this step, by name.
    pub swept: serde_json::Map<String, serde_json::Value>,
    pub publishers: u64,
    pub topics: u64,
    pub subs_per_client: u64,
    pub payload: u64,
    /// Publish rate asked for, msg/s.
    pub publish_expected: f64,
    /// Length of the measuring window, s.
    pub window_s: f64,
    /// Deliveries received in the window.
    pub received: u64,
    /// Payload bandwidth to subscribers, Mbit/s.
    pub egress_mbps: f64,
    /// Messages that drop notices announced.
    pub discarded: u64,
    pub connect_failures: u64,
    /// Connections closed by the server or the network before the end.
    pub disconnects: u64,
    /// CPU the bench used in the window, in cores (1.0 = one core busy).
    pub bench_cpu_cores: f64,
    /// Cores the bench may run on.
    pub bench_cores: usize,
    /// CPU the server used in the window, in cores (a spawned herald, or `--server-pid`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_cpu_cores: Option<f64>,
    /// The server's CPU per delivery received in the window, µs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_cpu_us_per_delivery: Option<f64>,
    /// The protocol the subscribers spoke.
    #[serde(default)]
    pub protocol: Protocol,
    /// The protocol the publishers spoke.
    #[serde(default)]
    pub pub_protocol: Protocol,
    /// MQTT: the QoS of publishes and subscriptions.
    #[serde(default)]
    pub mqtt_qos: u8,
    /// Publish → herald (herald's `ts` − send), µs, when stamping.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pub_to_server_us: Option<Summary>,
    /// herald → subscriber (receive − `ts`), µs, when stamping.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_to_sub_us: Option<Summary>,
    /// herald → subscriber split at the bench's kernel (fan-out and filtering steps run with
    /// `--samples`; see [`crate::arrivals`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arrival_legs: Option<ArrivalLegs>,
    /// The spread of the subscribers' own p99s (fan-out and filtering steps, when at least one
    /// subscriber had enough samples).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fairness: Option<Fairness>,
    /// What else took the cores in the window (fan-out and filtering steps): the spawned
    /// server kept from its core, the host's steal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub contention: Option<Contention>,
    /// Kind-specific figures (discard rate, images/s, tx/s, per-trial leg tables …).
    pub extra: serde_json::Map<String, serde_json::Value>,
    /// The first distinct errors seen.
    pub errors: Vec<String>,
}

/// The whole run, as `--json` writes it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunReport {
    pub scenario: String,
    pub kind: Kind,
    pub seed: String,
    pub description: String,
    pub command: Vec<String>,
    /// Start time, seconds since the UNIX epoch.
    pub started_unix: u64,
    pub target: String,
    pub spawned: bool,
    pub machine: Machine,
    pub steps: Vec<StepResult>,
    /// Kind-level conclusions (e.g. `max_discard_rate_held` for filtering).
    pub summary: serde_json::Map<String, serde_json::Value>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Machine {
    pub cores: usize,
    pub mem_gib: u64,
    pub bench_cores: usize,
    /// Server on core 0, bench on core 1.
    pub pinned: bool,
    /// CPU µs one small loopback write cost its writer just before the run (see
    /// [`crate::loopback`]): the host's speed at what a server mostly does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loopback_write_us: Option<f64>,
}

/// The live progress line (a spinner on a terminal; a plain line every few seconds otherwise).
pub struct Progress {
    bar: Option<indicatif::ProgressBar>,
    quiet: bool,
    last_plain: Instant,
}

impl Progress {
    pub fn new(quiet: bool) -> Progress {
        let bar = (!quiet && std::io::stderr().is_terminal()).then(|| {
            let b = indicatif::ProgressBar::new_spinner();
            b.enable_steady_tick(Duration::from_millis(200));
            b
        });
        Progress {
            bar,
            quiet,
            last_plain: Instant::now() - Duration::from_secs(60),
        }
    }

    pub fn set(&mut self, msg: String) {
        match &self.bar {
            Some(b) => b.set_message(msg),
            None if !self.quiet && self.last_plain.elapsed() >= Duration::from_secs(5) => {
                self.last_plain = Instant::now();
                eprintln!("{msg}");
            }
            None => {}
        }
    }

    /// A line that stays (a step's summary, the stock exchange's log).
    pub fn line(&self, msg: &str) {
        match &self.bar {
            Some(b) => b.println(msg),
            None if !self.quiet => eprintln!("{msg}"),
            None => {}
        }
    }

    pub fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

fn fmt_int(x: f64) -> String {
    let n = x.round() as i64;
    let s = n.abs().to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 {
        format!("-{out}")
    } else {
        out
    }
}

fn fmt_us(x: f64) -> String {
    if x >= 100.0 {
        fmt_int(x)
    } else {
        format!("{x:.1}")
    }
}

fn value_str(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::Number(n) => n.as_f64().map(fmt_int).unwrap_or_else(|| n.to_string()),
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Steps grouped by the outer swept parameters (every swept parameter but the last).
fn groups(steps: &[StepResult]) -> Vec<(String, Vec<&StepResult>)> {
    let mut out: Vec<(String, Vec<&StepResult>)> = vec![];
    for s in steps {
        let n = s.swept.len();
        let label = s
            .swept
            .iter()
            .take(n.saturating_sub(1))
            .map(|(k, v)| format!("{k} = {}", value_str(v)))
            .collect::<Vec<_>>()
            .join(", ");
        match out.last_mut() {
            Some((l, v)) if *l == label => v.push(s),
            _ => out.push((label, vec![s])),
        }
    }
    out
}

fn flags(s: &StepResult) -> String {
    let mut f = vec![];
    if s.bench_cpu_saturated {
        f.push("bench saturated".to_string());
    }
    if s.connect_failures > 0 {
        f.push(format!("{} connect failures", s.connect_failures));
    }
    if s.disconnects > 0 {
        f.push(format!("{} disconnects", s.disconnects));
    }
    f.join("; ")
}

fn server_cpu(s: &StepResult) -> String {
    s.server_cpu_cores
        .map(|c| format!("{:.0}%", c * 100.0))
        .unwrap_or_else(|| "-".into())
}

/// "publishers → subscribers" protocols of a step, with MQTT's QoS.
fn protocols_cell(s: &StepResult) -> String {
    let qos = if [s.protocol, s.pub_protocol].contains(&Protocol::Mqtt) {
        format!(" (MQTT QoS {})", s.mqtt_qos)
    } else {
        String::new()
    };
    format!("{} → {}{qos}", s.pub_protocol.as_str(), s.protocol.as_str())
}

fn lat_cells(l: &Summary) -> String {
    format!(
        "{} | {} | {} | {} | {} | {}",
        fmt_us(l.mean),
        fmt_us(l.p50),
        fmt_us(l.p99),
        fmt_us(l.p999),
        fmt_us(l.stdev),
        fmt_us(l.max)
    )
}

/// The final Markdown report.
pub fn markdown(r: &RunReport) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "### {} ({})", r.scenario, r.kind.as_str());
    if !r.seed.is_empty() {
        let _ = writeln!(o, "Reproduces seed {}.", r.seed);
    }
    let _ = writeln!(
        o,
        "Machine: {} cores, {} GiB; bench on {} core(s){}{}; target {}{}.\n",
        r.machine.cores,
        r.machine.mem_gib,
        r.machine.bench_cores,
        if r.machine.pinned {
            ", server pinned to core 0, bench to core 1"
        } else {
            ""
        },
        r.machine
            .loopback_write_us
            .map(|us| format!(
                "; a {}-byte loopback write costs its writer {us:.1} µs of CPU now",
                loopback::FRAME
            ))
            .unwrap_or_default(),
        r.target,
        if r.spawned { " (spawned)" } else { "" }
    );
    let mut protocols: Vec<String> = r.steps.iter().map(protocols_cell).collect();
    protocols.dedup();
    if protocols
        .iter()
        .any(|p| p != &protocols_cell(&StepResult::default()))
    {
        let _ = writeln!(
            o,
            "Protocols (publishers → subscribers): {}.\n",
            protocols.join("; ")
        );
    }
    match r.kind {
        Kind::Fanout | Kind::Filtering => fanout_tables(&mut o, r),
        Kind::ProxyLatency => proxy_tables(&mut o, r),
        Kind::StockExchange => stock_table(&mut o, r),
        Kind::Images => images_table(&mut o, r),
        Kind::Conflation => conflation_table(&mut o, r),
    }
    for (k, v) in &r.summary {
        let _ = writeln!(o, "- {k}: {}", value_str(v));
    }
    let sat = r.steps.iter().filter(|s| s.bench_cpu_saturated).count();
    if sat > 0 {
        let _ = writeln!(
            o,
            "\n**Warning:** the load generator was CPU-saturated in {sat} step(s): those figures are the bench's limit, not herald's."
        );
    }
    let errs: Vec<&String> = r.steps.iter().flat_map(|s| &s.errors).collect();
    if !errs.is_empty() {
        let _ = writeln!(o, "\nErrors seen:");
        for e in errs.iter().take(10) {
            let _ = writeln!(o, "- {e}");
        }
    }
    o
}

fn fanout_tables(o: &mut String, r: &RunReport) {
    let big = r.steps.iter().any(|s| s.payload >= 512);
    for (label, steps) in groups(&r.steps) {
        if !label.is_empty() {
            let _ = writeln!(o, "**{label}**\n");
        }
        let filtering = r.kind == Kind::Filtering;
        let first = if filtering {
            "Discard Msg Rate (achieved)"
        } else {
            "#clients"
        };
        let _ = write!(
            o,
            "| {first} | Total Egress Msg Rate (expected) | Egress achieved |"
        );
        if big {
            let _ = write!(o, " Egress User BW (Mbps) |");
        }
        let _ = writeln!(
            o,
            " Avg (µs) | Median (µs) | 99th (µs) | 99.9th (µs) | Std Dev (µs) | Max (µs) | lost | dup | ooo | discard | bench CPU | server CPU | notes |"
        );
        let cols = 16 + big as usize;
        let _ = writeln!(o, "|{}", "---:|".repeat(cols - 1) + "---|");
        for s in &steps {
            let first = if filtering {
                let asked = s
                    .extra
                    .get("discard_rate")
                    .and_then(|v| v.as_f64())
                    .unwrap_or(0.0);
                let got = s
                    .extra
                    .get("discard_rate_achieved")
                    .and_then(|v| v.as_f64())
                    .unwrap_or(0.0);
                format!("{} ({})", fmt_int(asked), fmt_int(got))
            } else {
                fmt_int(s.clients as f64)
            };
            let _ = write!(
                o,
                "| {first} | {} | {} |",
                fmt_int(s.egress_expected),
                fmt_int(s.egress_achieved)
            );
            if big {
                let _ = write!(o, " {} |", fmt_int(s.egress_mbps));
            }
            let _ = writeln!(
                o,
                " {} | {} | {} | {} | {} | {:.0}% | {} | {} |",
                lat_cells(&s.latency_us),
                s.lost,
                s.duplicates,
                s.out_of_order,
                s.discard_notices,
                s.bench_cpu_cores * 100.0,
                server_cpu(s),
                flags(s)
            );
        }
        let _ = writeln!(o);
        per_step_line(
            o,
            "Legs (µs, mean / p99): publish → herald, herald → subscriber",
            &steps,
            |s| {
                Some(format!(
                    "{} / {}, {} / {}",
                    fmt_us(s.pub_to_server_us.as_ref()?.mean),
                    fmt_us(s.pub_to_server_us.as_ref()?.p99),
                    fmt_us(s.server_to_sub_us.as_ref()?.mean),
                    fmt_us(s.server_to_sub_us.as_ref()?.p99)
                ))
            },
        );
        per_step_line(o, "Server CPU per delivery (µs)", &steps, |s| {
            s.server_cpu_us_per_delivery.map(|us| format!("{us:.2}"))
        });
        per_step_line(
            o,
            "herald → subscriber split at the bench's kernel (µs, mean / p99: herald → kernel, kernel → bench; the slowest 0.1%'s medians: publish → herald, herald → kernel, kernel → bench)",
            &steps,
            |s| {
                let a = s.arrival_legs.as_ref()?;
                Some(format!(
                    "{} / {}, {} / {}; {}, {}, {}",
                    fmt_us(a.herald_to_kernel_us.mean),
                    fmt_us(a.herald_to_kernel_us.p99),
                    fmt_us(a.kernel_to_bench_us.mean),
                    fmt_us(a.kernel_to_bench_us.p99),
                    fmt_us(a.slowest.publish_to_herald_us),
                    fmt_us(a.slowest.herald_to_kernel_us),
                    fmt_us(a.slowest.kernel_to_bench_us)
                ))
            },
        );
        per_step_line(
            o,
            "Others on the cores (ms in the window: herald runnable while another task held its core, ksoftirqd included; the host's steal, per core)",
            &steps,
            |s| {
                let c = s.contention.as_ref()?;
                let steal: Vec<String> = c.steal_ms.iter().map(|ms| format!("{ms:.0}")).collect();
                Some(format!(
                    "{}, steal {}",
                    c.server_waited_ms
                        .map_or("–".into(), |ms| format!("{ms:.1}")),
                    steal.join(" / ")
                ))
            },
        );
        if per_step_line(
            o,
            "Fairness (each subscriber's p99, µs: best / median / worst, worst ÷ best, subscribers; worst ÷ best by chance alone)",
            &steps,
            |s| s.fairness.as_ref().map(fairness_cells),
        ) {
            // Where chance alone spreads the p99s past the 1.5× fairness bar, the
            // measured spread cannot show fairness either way: say so, and what helps.
            let noisy = steps
                .iter()
                .filter_map(|s| s.fairness.as_ref()?.spread_by_chance)
                .fold(0.0, f64::max);
            if noisy > CHANCE_TOO_WIDE {
                let _ = writeln!(
                    o,
                    "Note: chance alone spreads these subscribers' p99s by up to {noisy:.2}×: each rests on too few samples to judge fairness by. A longer window (`--duration`) gives each subscriber more.\n"
                );
            }
        }
    }
}

/// Writes "HEADING: cells; cells; …" over the steps that have cells, and a blank line; nothing
/// (and false) when none has.
fn per_step_line(
    o: &mut String,
    heading: &str,
    steps: &[&StepResult],
    cells: impl Fn(&StepResult) -> Option<String>,
) -> bool {
    let cells: Vec<String> = steps.iter().filter_map(|s| cells(s)).collect();
    if cells.is_empty() {
        return false;
    }
    let _ = writeln!(o, "{heading}: {}\n", cells.join("; "));
    true
}

/// Above this spread by chance alone, the report notes that the window is too short for the
/// fairness figure to mean much (the bar is a spread of at most 1.5×).
const CHANCE_TOO_WIDE: f64 = 1.5;

/// One step's fairness figures, as the report and the progress line print them.
pub fn fairness_cells(f: &Fairness) -> String {
    format!(
        "{} / {} / {}, {:.2}×, {}{}",
        fmt_us(f.best_p99_us),
        fmt_us(f.median_p99_us),
        fmt_us(f.worst_p99_us),
        f.spread,
        f.subscribers,
        f.spread_by_chance
            .map(|c| format!(" (by chance {c:.2}×)"))
            .unwrap_or_default()
    )
}

fn proxy_tables(o: &mut String, r: &RunReport) {
    // Steps of several protocols (a sweep over `protocol`) say which each row is.
    let mixed = r
        .steps
        .iter()
        .any(|s| protocols_cell(s) != protocols_cell(&r.steps[0]));
    for (title, key) in [
        (
            "Time between publisher and herald (publish → server), mean over trials",
            "pub_to_server_trials",
        ),
        (
            "Time between herald and subscriber (server → subscriber), mean over trials",
            "server_to_sub_trials",
        ),
        (
            "End to end (publish → subscriber), mean over trials",
            "end_to_end_trials",
        ),
    ] {
        let _ = writeln!(o, "**{title}**\n");
        let stamped = |s: &&StepResult| {
            s.extra
                .get(key)
                .and_then(|v| v.get("count"))
                .and_then(|c| c.as_u64())
                .is_some_and(|c| c > 0)
        };
        if key != "end_to_end_trials" && !r.steps.iter().any(|s| stamped(&s)) {
            let _ = writeln!(
                o,
                "No delivery carried herald's receive stamp (`ts`): no split into legs.\n"
            );
            continue;
        }
        let _ = writeln!(
            o,
            "| Interval (ms) | trials | min (µs) | max (µs) | mode (µs) | median (µs) | mean (µs) | stdev (µs) | missing |"
        );
        let _ = writeln!(o, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
        for s in &r.steps {
            let interval = s
                .extra
                .get("interval_ms")
                .and_then(|v| v.as_f64())
                .unwrap_or(0.0);
            let mut label = if interval <= 0.0 {
                "burst (0)".to_string()
            } else {
                format!("{interval}")
            };
            if mixed {
                label = format!("{}: {label}", protocols_cell(s));
            }
            let sum: Summary = s
                .extra
                .get(key)
                .and_then(|v| serde_json::from_value(v.clone()).ok())
                .unwrap_or_default();
            let missing = s
                .extra
                .get("missing_per_trial")
                .and_then(|v| v.as_f64())
                .unwrap_or(0.0);
            let trials = s.extra.get("trials").and_then(|v| v.as_u64()).unwrap_or(0);
            let _ = writeln!(
                o,
                "| {label} | {trials} | {} | {} | {} | {} | {} | {} | {missing} |",
                fmt_us(sum.min),
                fmt_us(sum.max),
                fmt_us(sum.mode),
                fmt_us(sum.p50),
                fmt_us(sum.mean),
                fmt_us(sum.stdev)
            );
        }
        let _ = writeln!(o);
    }
}

fn stock_table(o: &mut String, r: &RunReport) {
    let _ = writeln!(
        o,
        "| clients | traders | tx/s (orders offered) | tx/s achieved | deliveries/s expected | deliveries/s achieved | mean herald → client (µs) | mean end to end (µs) | p99 end to end (µs) | lost | bench CPU | server CPU | notes |"
    );
    let _ = writeln!(
        o,
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
    );
    for s in &r.steps {
        let traders = s.extra.get("traders").and_then(|v| v.as_u64()).unwrap_or(0);
        let _ = writeln!(
            o,
            "| {} | {traders} | {} | {} | {} | {} | {} | {} | {} | {} | {:.0}% | {} | {} |",
            fmt_int(s.clients as f64),
            fmt_int(s.publish_expected),
            fmt_int(s.publish_rate),
            fmt_int(s.egress_expected),
            fmt_int(s.egress_achieved),
            s.server_to_sub_us
                .as_ref()
                .map(|l| fmt_us(l.mean))
                .unwrap_or_else(|| "-".into()),
            fmt_us(s.latency_us.mean),
            fmt_us(s.latency_us.p99),
            s.lost,
            s.bench_cpu_cores * 100.0,
            server_cpu(s),
            flags(s)
        );
    }
    let _ = writeln!(o);
}

fn images_table(o: &mut String, r: &RunReport) {
    let slow = r.steps.iter().any(|s| s.extra.contains_key("slow_clients"));
    let _ = write!(
        o,
        "| Image Size | subscribers | images | Images/Sec (hz) | MB/s (to each subscriber) | Min (ms) | Max (ms) | Average (ms) | lost |"
    );
    if slow {
        let _ = write!(
            o,
            " slow subscribers | slow: images/s each | slow: dropped (announced) | slow: lost / unaccounted / stale / cut |"
        );
    }
    let _ = writeln!(o, " notes |");
    let _ = writeln!(
        o,
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|{}---|",
        if slow { "---:|---:|---:|---|" } else { "" }
    );
    for s in &r.steps {
        let side = s
            .extra
            .get("image_side")
            .and_then(|v| v.as_u64())
            .unwrap_or(0);
        let bpp = s
            .extra
            .get("bytes_per_pixel")
            .and_then(|v| v.as_u64())
            .unwrap_or(2);
        let n = s.extra.get("images").and_then(|v| v.as_u64()).unwrap_or(0);
        let ips = s
            .extra
            .get("images_per_s")
            .and_then(|v| v.as_f64())
            .unwrap_or(0.0);
        let mbps = s
            .extra
            .get("mb_per_s")
            .and_then(|v| v.as_f64())
            .unwrap_or(0.0);
        let l = &s.latency_us;
        let _ = write!(
            o,
            "| {side} x {side} x {bpp} | {} | {n} | {ips:.1} | {mbps:.1} | {:.3} | {:.3} | {:.3} | {} |",
            s.clients,
            l.min / 1000.0,
            l.max / 1000.0,
            l.mean / 1000.0,
            s.lost,
        );
        if slow {
            let x = |k: &str| s.extra.get(k).map(value_str).unwrap_or_else(|| "0".into());
            let _ = write!(
                o,
                " {} | {:.1} | {} | {} / {} / {} / {} |",
                x("slow_clients"),
                s.extra
                    .get("slow_images_per_s")
                    .and_then(|v| v.as_f64())
                    .unwrap_or(0.0),
                x("slow_dropped"),
                x("slow_lost"),
                x("slow_unaccounted"),
                x("slow_stale"),
                x("slow_wrong_size"),
            );
        }
        let _ = writeln!(o, " {} |", flags(s));
    }
    let _ = writeln!(o);
}

/// Issue 5's conflation run: what the policy subscribers receive per topic, and what it costs.
fn conflation_table(o: &mut String, r: &RunReport) {
    let _ = writeln!(
        o,
        "| subscribers | topics | publishers | publish rate (target) | per topic | policy, max_rate | received msg/s per topic | stale | topics ending on their newest value | lost | announced superseded | server CPU | bench CPU | notes |"
    );
    let _ = writeln!(
        o,
        "|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---|"
    );
    for s in &r.steps {
        let f = |k: &str| s.extra.get(k).and_then(|v| v.as_f64()).unwrap_or(0.0);
        let policy = s
            .extra
            .get("policy")
            .and_then(|v| v.as_str())
            .unwrap_or_default();
        let subscribed = s.clients > 0;
        let _ = writeln!(
            o,
            "| {} | {} | {} | {:.0} ({:.0}) | {:.0} | {}, {} | {} | {} | {} | {} | {} | {} | {:.0}% | {} |",
            s.clients,
            s.topics,
            s.publishers,
            s.publish_rate,
            s.publish_expected,
            s.publish_rate / s.topics.max(1) as f64,
            if policy.is_empty() { "default" } else { policy },
            f("max_rate"),
            if subscribed { format!("{:.2}", f("per_topic_per_s")) } else { "-".into() },
            if subscribed { format!("{}", f("stale")) } else { "-".into() },
            if subscribed {
                format!("{} of {}", f("topics_newest_last"), s.topics)
            } else {
                "-".into()
            },
            s.lost,
            s.discarded,
            server_cpu(s),
            s.bench_cpu_cores * 100.0,
            flags(s)
        );
    }
    let _ = writeln!(o);
}

/// The x value of a step for the plot: the last swept parameter (clients when nothing is swept).
fn x_of(s: &StepResult) -> (String, f64) {
    match s.swept.iter().next_back() {
        Some((k, v)) => (k.clone(), v.as_f64().unwrap_or(0.0)),
        None => ("clients".into(), s.clients as f64),
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A round axis step (1, 2 or 5 × 10^k) at least `raw`.
fn nice_step(raw: f64) -> f64 {
    let p = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * p)
        .find(|&s| s >= raw)
        .unwrap_or(10.0 * p)
}

/// A plotted statistic: name, colour, and how to read it from a summary.
type Series = (&'static str, &'static str, fn(&Summary) -> f64);

/// Latency percentiles against the swept parameter, as a standalone SVG.
pub fn svg(r: &RunReport) -> String {
    let (w, h) = (860.0f64, 520.0f64);
    let (ml, mr, mt, mb) = (80.0, 180.0, 50.0, 60.0);
    let (pw, ph) = (w - ml - mr, h - mt - mb);
    let series_def: [Series; 5] = [
        ("mean", "#1f77b4", |s| s.mean),
        ("median", "#2ca02c", |s| s.p50),
        ("p99", "#ff7f0e", |s| s.p99),
        ("p99.9", "#d62728", |s| s.p999),
        ("max", "#7f7f7f", |s| s.max),
    ];
    let dashes = ["", "6,4", "2,3", "10,3,2,3"];
    let gs = groups(&r.steps);
    let xname = r
        .steps
        .first()
        .map(|s| x_of(s).0)
        .unwrap_or_else(|| "step".into());
    let pts: Vec<(f64, f64)> = r
        .steps
        .iter()
        .flat_map(|s| {
            series_def
                .iter()
                .map(move |(_, _, f)| (x_of(s).1, f(&s.latency_us)))
        })
        .collect();
    let xmin = pts.iter().map(|p| p.0).fold(f64::INFINITY, f64::min);
    let xmax = pts.iter().map(|p| p.0).fold(f64::NEG_INFINITY, f64::max);
    let ymin_raw = pts
        .iter()
        .map(|p| p.1)
        .filter(|&y| y > 0.0)
        .fold(f64::INFINITY, f64::min);
    let ymax_raw = pts.iter().map(|p| p.1).fold(0.0f64, f64::max);
    let (xmin, xmax) = if !xmin.is_finite() || xmax <= xmin {
        (xmin.min(0.0).min(xmax), xmin.max(0.0) + 1.0)
    } else {
        (xmin, xmax)
    };
    let log = ymin_raw.is_finite() && ymax_raw / ymin_raw > 20.0;
    let step = nice_step(ymax_raw.max(1.0) / 5.0);
    let (ylo, yhi) = if log {
        (
            10f64.powf(ymin_raw.log10().floor()),
            10f64.powf(ymax_raw.log10().ceil()),
        )
    } else {
        (0.0, (ymax_raw / step).ceil().max(1.0) * step)
    };
    let sx = |x: f64| ml + (x - xmin) / (xmax - xmin) * pw;
    let sy = |y: f64| {
        if log {
            let y = y.max(ylo);
            mt + ph - (y.log10() - ylo.log10()) / (yhi.log10() - ylo.log10()) * ph
        } else {
            mt + ph - (y - ylo) / (yhi - ylo) * ph
        }
    };
    let mut o = String::new();
    let _ = writeln!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(o, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        o,
        r#"<text x="{}" y="24" font-size="15" text-anchor="middle">{} — latency vs {}</text>"#,
        ml + pw / 2.0,
        esc(&r.scenario),
        esc(&xname)
    );
    // axes and grid
    let yticks: Vec<f64> = if log {
        let mut v = vec![];
        let mut t = ylo;
        while t <= yhi * 1.0001 {
            v.push(t);
            t *= 10.0;
        }
        v
    } else {
        let n = ((yhi - ylo) / step).round() as usize;
        (0..=n).map(|i| ylo + step * i as f64).collect()
    };
    for t in &yticks {
        let y = sy(*t);
        let _ = writeln!(
            o,
            r##"<line x1="{ml}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
            ml + pw,
            ml - 6.0,
            y + 4.0,
            fmt_us(*t)
        );
    }
    let mut xs: Vec<f64> = r.steps.iter().map(|s| x_of(s).1).collect();
    xs.sort_by(|a, b| a.total_cmp(b));
    xs.dedup();
    // Label a tick only when it is far enough from the previous label to be read.
    let mut last_label = f64::NEG_INFINITY;
    for x in &xs {
        let px = sx(*x);
        if px - last_label < 40.0 {
            continue;
        }
        last_label = px;
        let _ = writeln!(
            o,
            r##"<line x1="{px:.1}" x2="{px:.1}" y1="{mt}" y2="{}" stroke="#eee"/><text x="{px:.1}" y="{}" text-anchor="middle">{}</text>"##,
            mt + ph,
            mt + ph + 16.0,
            fmt_int(*x)
        );
    }
    let _ = writeln!(
        o,
        r##"<rect x="{ml}" y="{mt}" width="{pw}" height="{ph}" fill="none" stroke="#333"/>"##
    );
    let _ = writeln!(
        o,
        r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
        ml + pw / 2.0,
        h - 18.0,
        esc(&xname)
    );
    let _ = writeln!(
        o,
        r#"<text transform="translate(18,{}) rotate(-90)" text-anchor="middle">latency (µs{})</text>"#,
        mt + ph / 2.0,
        if log { ", log scale" } else { "" }
    );
    // series
    let mut legend_y = mt;
    for (gi, (label, steps)) in gs.iter().enumerate() {
        let dash = dashes[gi % dashes.len()];
        for (name, color, f) in series_def.iter() {
            let mut path = String::new();
            for (i, s) in steps.iter().enumerate() {
                let (x, y) = (sx(x_of(s).1), sy(f(&s.latency_us)));
                let _ = write!(path, "{}{x:.1},{y:.1} ", if i == 0 { "M" } else { "L" });
                let _ = write!(
                    o,
                    r#"<circle cx="{x:.1}" cy="{y:.1}" r="2.5" fill="{color}"/>"#
                );
            }
            let _ = writeln!(
                o,
                r#"<path d="{path}" fill="none" stroke="{color}" stroke-width="2" stroke-dasharray="{dash}"/>"#
            );
            let text = if label.is_empty() {
                name.to_string()
            } else {
                format!("{name} ({label})")
            };
            let lx = ml + pw + 12.0;
            let _ = writeln!(
                o,
                r#"<line x1="{lx}" x2="{}" y1="{legend_y}" y2="{legend_y}" stroke="{color}" stroke-width="2" stroke-dasharray="{dash}"/><text x="{}" y="{}">{}</text>"#,
                lx + 24.0,
                lx + 30.0,
                legend_y + 4.0,
                esc(&text)
            );
            legend_y += 16.0;
        }
        legend_y += 6.0;
    }
    // Steps where the bench was saturated: a red mark on the top axis, explained once.
    let sat: Vec<f64> = r
        .steps
        .iter()
        .filter(|s| s.bench_cpu_saturated)
        .map(|s| x_of(s).1)
        .collect();
    for x in &sat {
        let _ = writeln!(
            o,
            r##"<path d="M{:.1},{mt} l-5,-9 h10 z" fill="#d62728"/>"##,
            sx(*x)
        );
    }
    if !sat.is_empty() {
        let (lx, ly) = (ml + pw + 12.0, legend_y + 4.0);
        let _ = writeln!(
            o,
            r##"<path d="M{:.1},{:.1} l-5,-9 h10 z" fill="#d62728"/><text x="{:.1}" y="{ly:.1}" fill="#d62728">bench saturated</text>"##,
            lx + 12.0,
            ly + 4.0,
            lx + 30.0
        );
    }
    let _ = writeln!(o, "</svg>");
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fairness::SubscriberP99;

    fn report(kind: Kind) -> RunReport {
        let mut steps = vec![];
        for (i, c) in [1000u64, 2000, 3000].iter().enumerate() {
            let mut s = StepResult {
                clients: *c,
                egress_expected: *c as f64 * 50.0,
                egress_achieved: *c as f64 * 49.9,
                latency_us: Summary::from_values(&[30 + i as i64, 40, 50, 400]),
                payload: 50,
                ..Default::default()
            };
            s.swept.insert("clients".into(), serde_json::json!(c));
            steps.push(s);
        }
        steps[2].bench_cpu_saturated = true;
        RunReport {
            scenario: "x".into(),
            kind,
            seed: "003".into(),
            description: String::new(),
            command: vec![],
            started_unix: 0,
            target: "ws://127.0.0.1:1/ws".into(),
            spawned: false,
            machine: Machine {
                cores: 2,
                mem_gib: 24,
                bench_cores: 1,
                pinned: true,
                loopback_write_us: Some(7.9),
            },
            steps,
            summary: Default::default(),
        }
    }

    #[test]
    fn markdown_has_seed_columns_and_the_warning() {
        let md = markdown(&report(Kind::Fanout));
        assert!(
            md.contains("| #clients | Total Egress Msg Rate (expected)"),
            "{md}"
        );
        assert!(md.contains("| 2,000 | 100,000 | 99,800 |"), "{md}");
        assert!(md.contains("bench's limit"));
        assert!(
            md.contains("a 96-byte loopback write costs its writer 7.9 µs of CPU now"),
            "{md}"
        );
        for k in [
            Kind::Filtering,
            Kind::ProxyLatency,
            Kind::StockExchange,
            Kind::Images,
            Kind::Conflation,
        ] {
            assert!(!markdown(&report(k)).is_empty());
        }
    }

    #[test]
    fn protocols_and_cpu_per_delivery_are_reported() {
        let mut r = report(Kind::Fanout);
        let md = markdown(&r);
        assert!(!md.contains("Protocols"), "all native: no line\n{md}");
        r.steps[0].server_cpu_us_per_delivery = Some(3.25);
        for s in &mut r.steps {
            s.protocol = Protocol::Mqtt;
            s.pub_protocol = Protocol::Mqtt;
            s.mqtt_qos = 1;
        }
        let md = markdown(&r);
        assert!(
            md.contains("Protocols (publishers → subscribers): mqtt → mqtt (MQTT QoS 1).\n"),
            "{md}"
        );
        assert!(md.contains("Server CPU per delivery (µs): 3.25\n"), "{md}");
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["steps"][0]["protocol"], "mqtt");
        assert_eq!(v["steps"][0]["server_cpu_us_per_delivery"], 3.25);
        // Proxy rows of several protocols say which each is; without stamps, no legs.
        let mut r = report(Kind::ProxyLatency);
        r.steps[1].protocol = Protocol::Stomp;
        r.steps[1].pub_protocol = Protocol::Stomp;
        let md = markdown(&r);
        assert!(md.contains("| stomp → stomp: burst (0) |"), "{md}");
        assert!(md.contains("| native → native: burst (0) |"), "{md}");
        assert!(md.contains("no split into legs"), "{md}");
    }

    #[test]
    fn json_carries_the_contract_fields() {
        let v = serde_json::to_value(report(Kind::Fanout)).unwrap();
        let s = &v["steps"][0];
        for k in [
            "clients",
            "egress_expected",
            "egress_achieved",
            "publish_rate",
            "lost",
            "duplicates",
            "out_of_order",
            "discard_notices",
            "bench_cpu_saturated",
        ] {
            assert!(s.get(k).is_some(), "missing {k}");
        }
        for k in ["min", "mean", "p50", "p99", "p999", "max", "stdev"] {
            assert!(s["latency_us"].get(k).is_some(), "missing latency_us.{k}");
        }
    }

    #[test]
    fn fairness_line_and_json_fields() {
        let mut r = report(Kind::Fanout);
        assert!(
            !markdown(&r).contains("Fairness"),
            "no line without figures"
        );
        let subs = |p99s: &[u64]| {
            p99s.iter()
                .map(|&p99_us| SubscriberP99 {
                    p99_us,
                    samples: 500,
                })
                .collect::<Vec<_>>()
        };
        r.steps[0].fairness = Fairness::of(
            &subs(&[900, 400, 600, 500, 800]),
            &crate::stats::new_histogram(),
        );
        let mut pooled = crate::stats::new_histogram();
        pooled.record_n(700, 10).unwrap();
        r.steps[1].fairness = Fairness::of(&subs(&[1200, 1000]), &pooled);
        let md = markdown(&r);
        assert!(
            md.contains(
                ": 400 / 600 / 900, 2.25×, 5; 1,000 / 1,000 / 1,200, 1.20×, 2 (by chance 1.00×)\n"
            ),
            "{md}"
        );
        assert!(!md.contains("chance alone spreads"), "{md}");
        // A tail of 1% and 500 samples each: a subscriber's p99 is in the tail when 6 or more
        // of its draws are (≈ 38%), so among 20 chance alone spreads them widely.
        let mut rare_tail = crate::stats::new_histogram();
        rare_tail.record_n(700, 990).unwrap();
        rare_tail.record_n(50_000, 10).unwrap();
        let step1 = r.steps[1].fairness.take();
        r.steps[1].fairness = Fairness::of(&subs(&[1000; 20]), &rare_tail);
        let chance = r.steps[1]
            .fairness
            .as_ref()
            .unwrap()
            .spread_by_chance
            .unwrap();
        assert!(chance > CHANCE_TOO_WIDE, "{chance}");
        let md = markdown(&r);
        assert!(
            md.contains(&format!(
                "Note: chance alone spreads these subscribers' p99s by up to {chance:.2}×"
            )),
            "{md}"
        );
        r.steps[1].fairness = step1;
        let v = serde_json::to_value(&r).unwrap();
        let f = &v["steps"][0]["fairness"];
        assert_eq!(f["subscribers"], 5);
        assert_eq!(f["best_p99_us"], 400.0);
        assert_eq!(f["median_p99_us"], 600.0);
        assert_eq!(f["worst_p99_us"], 900.0);
        assert_eq!(f["spread"], 2.25);
        assert!(f.get("spread_by_chance").is_none());
        assert_eq!(v["steps"][1]["fairness"]["spread_by_chance"], 1.0);
        assert!(v["steps"][2].get("fairness").is_none());
        let back: RunReport = serde_json::from_value(v).unwrap();
        assert_eq!(back.steps[0].fairness, r.steps[0].fairness);
    }

    #[test]
    fn svg_is_well_formed_enough() {
        let s = svg(&report(Kind::Fanout));
        assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"));
        assert!(s.contains("p99.9") && s.contains("bench saturated"));
        assert!(!s.contains("NaN") && !s.contains("inf"));
    }

    #[test]
    fn numbers_read_like_the_seed() {
        assert_eq!(fmt_int(900000.0), "900,000");
        assert_eq!(fmt_int(48.4), "48");
        assert_eq!(fmt_us(4.74), "4.7");
        assert_eq!(fmt_us(17523.0), "17,523");
    }
}
