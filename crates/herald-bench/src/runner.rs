//! Running the steps of a scenario, one runner per kind. Synchronous code on its own thread:
//! subscribers live in [`Group`]s (event-loop threads or worker processes), publishers in
//! threads of their own, and this code sequences them: connect, subscribe, publish, warm up,
//! measure, stop, drain, collect.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use serde_json::json;

use crate::fairness::Fairness;
use crate::group::{self, Group};
use crate::load::{ClientSpec, Snapshot, TraderSpec};
use crate::policy_sub::{PolicyReport, PolicySpec, PolicySub};
use crate::publish::{PubSpec, Publisher, WaitFor};
use crate::report::{self, Progress, StepResult};
use crate::scenario::{Kind, Params, Step};
use crate::schedule::{Schedule, Spread};
use crate::stats::Summary;
use crate::sys::CpuMeter;
use crate::wire;

/// What every runner needs.
pub struct Ctx {
    pub url: String,
    /// Subscribers' URLs, round-robin (`--sub-url`); empty: subscribers use `url`.
    pub sub_urls: Vec<String>,
    pub progress: Progress,
    /// Set on Ctrl-C.
    pub stop: Arc<AtomicBool>,
    pub bench_cores: usize,
    /// The server's process (spawned, or `--server-pid`), whose CPU use is reported too.
    pub server_pid: Option<u32>,
    /// Where `--samples` writes every delivery of a fan-out step's window.
    pub samples: Option<std::io::BufWriter<std::fs::File>>,
}

impl Ctx {
    fn check_stop(&self) -> Result<()> {
        if self.stop.load(Relaxed) {
            bail!("interrupted");
        }
        Ok(())
    }

    /// Sleeps until `until`, updating the progress line.
    fn wait_until(
        &mut self,
        until: Instant,
        groups: &[Group],
        what: &dyn Fn(&crate::load::Progress, f64) -> String,
    ) -> Result<()> {
        let mut last = (Instant::now(), group::progress(groups).received);
        while Instant::now() < until {
            self.check_stop()?;
            std::thread::sleep((until - Instant::now()).min(Duration::from_millis(250)));
            let p = group::progress(groups);
            let dt = last.0.elapsed().as_secs_f64().max(1e-3);
            let rate = (p.received - last.1) as f64 / dt;
            last = (Instant::now(), p.received);
            self.progress.set(what(&p, rate));
        }
        Ok(())
    }
}

/// What a run gave: the steps that ran, the kind-level conclusions, and why the sweep ended
/// early if a step could not run.
pub struct Ran {
    pub results: Vec<StepResult>,
    pub summary: serde_json::Map<String, serde_json::Value>,
    /// The error of the step that could not run (its number is in the summary).
    pub stopped: Option<anyhow::Error>,
}

/// Runs every step of a scenario. A step that cannot run (its subscribers not ready in time,
/// say) ends the sweep: the steps before it stand and are reported, the summary says where and
/// why it stopped. Without a single completed step, the error is returned.
pub fn run_all(ctx: &mut Ctx, kind: Kind, steps: &[Step]) -> Result<Ran> {
    let mut results = vec![];
    let mut summary = serde_json::Map::new();
    let outcome = run_steps(ctx, kind, steps, &mut results, &mut summary);
    let stopped = match outcome {
        Ok(()) => None,
        Err(e) if results.is_empty() => return Err(e),
        Err(e) => {
            let at = results.len() + 1;
            ctx.progress
                .line(&format!("step {at}/{} could not run: {e:#}", steps.len()));
            summary.insert("stopped_at_step".into(), json!(at));
            summary.insert("stopped_because".into(), json!(format!("{e:#}")));
            Some(e)
        }
    };
    Ok(Ran {
        results,
        summary,
        stopped,
    })
}

fn run_steps(
    ctx: &mut Ctx,
    kind: Kind,
    steps: &[Step],
    results: &mut Vec<StepResult>,
    summary: &mut serde_json::Map<String, serde_json::Value>,
) -> Result<()> {
    match kind {
        Kind::Fanout => each_alone(ctx, steps, results, fanout_step)?,
        Kind::ProxyLatency => each_alone(ctx, steps, results, proxy_step)?,
        Kind::Images => each_alone(ctx, steps, results, images_step)?,
        Kind::Conflation => each_alone(ctx, steps, results, conflation_step)?,
        Kind::Filtering => {
            let mut baseline: Option<f64> = None;
            let mut held: Option<f64> = None;
            for (i, s) in steps.iter().enumerate() {
                let r = fanout_step(ctx, &s.params, &step_label(i, steps.len()))?;
                let mean = r.latency_us.mean;
                let achieved = r
                    .extra
                    .get("discard_rate_achieved")
                    .and_then(|v| v.as_f64())
                    .unwrap_or(0.0);
                let base = *baseline.get_or_insert(mean);
                let moved = if base > 0.0 { mean / base - 1.0 } else { 0.0 };
                let mut r = r;
                r.extra.insert("latency_increase".into(), json!(moved));
                let over = moved > s.params.max_latency_increase;
                results.push(finish(ctx, s, r));
                if over {
                    ctx.progress.line(&format!(
                        "mean latency moved {:.0}% over the first step (> {:.0}%): sweep stopped",
                        moved * 100.0,
                        s.params.max_latency_increase * 100.0
                    ));
                    summary.insert(
                        "stopped_at_discard_rate".into(),
                        json!(s.params.discard_rate),
                    );
                    break;
                }
                held = Some(held.map_or(achieved, |h: f64| h.max(achieved)));
            }
            summary.insert("max_discard_rate_held".into(), json!(held.unwrap_or(0.0)));
            summary.insert(
                "baseline_mean_latency_us".into(),
                json!(baseline.unwrap_or(0.0)),
            );
        }
        Kind::StockExchange => {
            let mut rs = vec![];
            let ramp = stock_ramp(ctx, steps, &mut rs);
            for (s, r) in steps.iter().zip(rs) {
                results.push(finish(ctx, s, r));
            }
            ramp?;
        }
    }
    Ok(())
}

/// Runs steps that stand alone, each finished and kept as it ends.
fn each_alone(
    ctx: &mut Ctx,
    steps: &[Step],
    results: &mut Vec<StepResult>,
    step: fn(&mut Ctx, &Params, &str) -> Result<StepResult>,
) -> Result<()> {
    for (i, s) in steps.iter().enumerate() {
        let r = step(ctx, &s.params, &step_label(i, steps.len()))?;
        results.push(finish(ctx, s, r));
    }
    Ok(())
}

fn step_label(i: usize, of: usize) -> String {
    format!("step {}/{of}", i + 1)
}

fn finish(ctx: &Ctx, step: &Step, mut r: StepResult) -> StepResult {
    for (k, v) in &step.swept {
        r.swept.insert(k.clone(), v.clone());
    }
    r.server_cpu_us_per_delivery = r
        .server_cpu_cores
        .filter(|_| r.egress_achieved > 0.0)
        .map(|cores| cores * 1e6 / r.egress_achieved);
    let l = &r.latency_us;
    ctx.progress.line(&format!(
        "{}clients {}: egress {:.0}/s of {:.0}/s expected, publish {:.0}/s, latency µs mean {:.1} p50 {:.0} p99 {:.0} p99.9 {:.0} max {:.0}{}; lost {} dup {} ooo {} discard {}; bench CPU {:.0}%{}",
        step.swept
            .iter()
            .filter(|(k, _)| k != "clients")
            .map(|(k, v)| format!("{k}={v} "))
            .collect::<String>(),
        r.clients,
        r.egress_achieved,
        r.egress_expected,
        r.publish_rate,
        l.mean,
        l.p50,
        l.p99,
        l.p999,
        l.max,
        r.fairness
            .as_ref()
            .map(|f| format!(
                "; subscriber p99 best / median / worst, spread, n: {}",
                report::fairness_cells(f)
            ))
            .unwrap_or_default(),
        r.lost,
        r.duplicates,
        r.out_of_order,
        r.discard_notices,
        r.bench_cpu_cores * 100.0,
        if r.bench_cpu_saturated { " (SATURATED)" } else { "" }
    ));
    r
}

fn client_spec(ctx: &Ctx, p: &Params, max_message: usize) -> ClientSpec {
    ClientSpec {
        url: ctx.url.clone(),
        sub_urls: ctx.sub_urls.clone(),
        topics: p.topic_count(),
        subs_per_client: p.subs_per_client,
        topic_prefix: p.topic_prefix.clone(),
        topic_names: p.topic_names.clone(),
        connect_rate: p.connect_rate,
        max_message,
        bind_sources: p.clients > 25_000,
        record_raw: false,
        stamp_arrivals: false,
        raw_reserve: 0,
        trader: None,
        protocol: p.protocol,
        qos: p.mqtt_qos,
        publishers: p.publishers,
    }
}

/// A range of client numbers, `from..to`.
type Range = (u64, u64);

/// Starts the groups for `clients` subscribers and spreads the client numbers over them.
fn start_groups(spec: &ClientSpec, p: &Params, clients: u64) -> Result<(Vec<Group>, Vec<Range>)> {
    let max = p.max_conns_per_process.max(1);
    let (n, processes) = if clients > max {
        (clients.div_ceil(max) as usize, true)
    } else {
        (p.bench_threads.clamp(1, clients.max(1)) as usize, false)
    };
    let groups = group::start_groups(spec, n, processes)?;
    let ranges = split(clients, n as u64);
    Ok((groups, ranges))
}

fn split(total: u64, parts: u64) -> Vec<(u64, u64)> {
    let parts = parts.max(1);
    (0..parts)
        .map(|i| (total * i / parts, total * (i + 1) / parts))
        .collect()
}

/// Waits until `target` clients are subscribed (or failed).
fn wait_ready(
    ctx: &mut Ctx,
    groups: &[Group],
    target: u64,
    params: &Params,
    label: &str,
) -> Result<()> {
    let timeout =
        Duration::from_secs_f64(target as f64 / params.connect_rate + params.ready_timeout);
    let t0 = Instant::now();
    loop {
        ctx.check_stop()?;
        let p = group::progress(groups);
        if p.ready + p.failed + p.closed >= target {
            if p.ready == 0 && target > 0 {
                bail!(
                    "no subscriber could connect and subscribe to {} ({} failed, {} closed){}",
                    ctx.url,
                    p.failed,
                    p.closed,
                    first_errors(groups)
                );
            }
            return Ok(());
        }
        if t0.elapsed() > timeout {
            bail!(
                "only {} of {target} subscribers were ready after {:.0}s ({} connected, {} failed){}",
                p.ready,
                timeout.as_secs_f64(),
                p.connected,
                p.failed,
                first_errors(groups)
            );
        }
        ctx.progress.set(format!(
            "{label}: connecting {}/{target} (subscribed {}, failed {})",
            p.connected, p.ready, p.failed
        ));
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The errors the groups saw so far, for a message: "; first errors: …", or nothing.
fn first_errors(groups: &[Group]) -> String {
    let errs: Vec<String> = groups
        .iter()
        .filter_map(|g| g.collect().ok())
        .flat_map(|s| s.errors)
        .collect();
    if errs.is_empty() {
        String::new()
    } else {
        format!("; first errors: {}", errs.join("; "))
    }
}

/// Waits until deliveries stop arriving (quiet for 300 ms) or `max` passed.
fn drain(groups: &[Group], max: f64) {
    let t0 = Instant::now();
    let mut last = group::progress(groups).received;
    let mut quiet = Instant::now();
    while t0.elapsed().as_secs_f64() < max {
        std::thread::sleep(Duration::from_millis(50));
        let now = group::progress(groups).received;
        if now != last {
            last = now;
            quiet = Instant::now();
        } else if quiet.elapsed() > Duration::from_millis(300) {
            break;
        }
    }
}

fn collect_all(groups: &[Group]) -> Result<Snapshot> {
    let mut s = Snapshot::empty();
    for g in groups {
        s.merge(g.collect()?);
    }
    Ok(s)
}

fn shutdown_all(groups: Vec<Group>) -> Result<Snapshot> {
    let mut s = Snapshot::empty();
    for g in groups {
        s.merge(g.shutdown()?);
    }
    Ok(s)
}

fn legs(s: &Snapshot) -> (Option<Summary>, Option<Summary>) {
    if s.pub_to_server.is_empty() {
        (None, None)
    } else {
        (
            Some(Summary::from_histogram(&s.pub_to_server)),
            Some(Summary::from_histogram(&s.server_to_sub)),
        )
    }
}

/// Common fields of a step result from the merged snapshot.
fn base_result(ctx: &Ctx, p: &Params, snap: &Snapshot, window: f64, cpu_s: f64) -> StepResult {
    let (l1, l2) = legs(snap);
    let cores = cpu_s / window.max(1e-9);
    let mut errors = snap.errors.clone();
    errors.truncate(10);
    StepResult {
        clients: p.clients,
        lost: snap.counts.lost,
        duplicates: snap.counts.duplicates,
        out_of_order: snap.counts.out_of_order,
        discard_notices: snap.counts.discard_notices,
        discarded: snap.counts.discarded,
        latency_us: Summary::from_histogram(&snap.latency),
        pub_to_server_us: l1,
        server_to_sub_us: l2,
        egress_achieved: snap.window_received as f64 / window.max(1e-9),
        egress_mbps: snap.window_bytes as f64 * 8.0 / window.max(1e-9) / 1e6,
        received: snap.window_received,
        window_s: window,
        bench_cpu_cores: cores,
        bench_cores: ctx.bench_cores,
        bench_cpu_saturated: cores > 0.9 * ctx.bench_cores as f64,
        publishers: p.publishers,
        topics: p.topic_count(),
        subs_per_client: p.subs_per_client.min(p.topic_count()),
        payload: p.payload,
        errors,
        protocol: p.protocol,
        pub_protocol: p.publisher_protocol().unwrap_or(p.protocol),
        mqtt_qos: p.mqtt_qos,
        ..Default::default()
    }
}

fn topic_names(prefix: &str, n: u64, p: &Params) -> Arc<Vec<String>> {
    if prefix == p.topic_prefix {
        Arc::new((0..n).map(|i| p.topic(i)).collect())
    } else {
        Arc::new((0..n).map(|i| format!("{prefix}/{i}")).collect())
    }
}

/// Fan-out (and filtering): C subscribers, P paced publishers, optional discard load.
fn fanout_step(ctx: &mut Ctx, p: &Params, label: &str) -> Result<StepResult> {
    let max_message = (p.payload as usize + 4096).max(1 << 20);
    let mut spec = client_spec(ctx, p, max_message);
    if ctx.samples.is_some() {
        spec.record_raw = true;
        spec.stamp_arrivals = true;
        spec.raw_reserve = (p.rate * spread_fanout(p) * p.duration * 1.05) as usize;
    }
    let (groups, ranges) = start_groups(&spec, p, p.clients)?;
    for (g, (a, b)) in groups.iter().zip(&ranges) {
        g.add(*a, *b)?;
    }
    wait_ready(ctx, &groups, p.clients, p, label)?;

    let t = p.topic_count();
    let topics = topic_names(&p.topic_prefix, t, p);
    let spread = Spread::new(t, p.subs_per_client);
    let go = Arc::new(AtomicBool::new(false));
    let pubs = paced_publishers(ctx, p, &topics, spread, max_message, &go)?;
    let mut discard = vec![];
    if p.discard_rate > 0.0 {
        let dp = p.discard_publishers.max(1);
        let dt = p.discard_topics.max(1);
        let dtopics = Arc::new(
            (0..dt)
                .map(|i| format!("{}/{i}", p.discard_prefix))
                .collect::<Vec<_>>(),
        );
        let dspread = Spread::new(dt, 1);
        for i in 0..dp {
            discard.push(Publisher::start(
                PubSpec {
                    url: ctx.url.clone(),
                    protocol: p.publisher_protocol()?,
                    qos: p.mqtt_qos,
                    numbered_from: 0,
                    topics: dtopics.clone(),
                    spread: dspread,
                    index: i,
                    stride: dp,
                    schedule: Schedule::new(p.discard_rate / dp as f64, None),
                    payload: p.payload as usize,
                    binary: p.binary,
                    stamp: false,
                    text: None,
                    max_message,
                    wait_for: None,
                },
                go.clone(),
            )?);
        }
    }
    go.store(true, Relaxed);
    let t_go = Instant::now();
    let win_start = t_go + Duration::from_secs_f64(p.warmup);
    let win_end = win_start + Duration::from_secs_f64(p.duration);
    let start_us = wire::now_us() + (p.warmup * 1e6) as u64;
    let end_us = start_us + (p.duration * 1e6) as u64;
    for g in &groups {
        g.set_window(start_us, end_us)?;
    }
    let clients = p.clients;
    let sent = |v: &Vec<Publisher>| v.iter().map(|x| x.sent()).sum::<u64>();
    let pubs_ref = &pubs;
    ctx.wait_until(win_start, &groups, &|_, rate| {
        format!(
            "{label}: clients {clients} warming up {:.1}s: published {}, receiving {rate:.0}/s",
            t_go.elapsed().as_secs_f64(),
            sent(pubs_ref)
        )
    })?;
    let _ = collect_all(&groups)?; // resets worker CPU baselines
    let cpu = CpuMeter::start_with(ctx.server_pid);
    let (s0, d0) = (sent(&pubs), sent(&discard));
    ctx.wait_until(win_end, &groups, &|pr, rate| {
        format!(
            "{label}: clients {clients} measuring {:.1}/{:.0}s: receiving {rate:.0}/s (expected {:.0}/s), received {}",
            (Instant::now() - win_start).as_secs_f64(),
            p.duration,
            p.rate * spread_fanout(p),
            pr.received
        )
    })?;
    let (my_cpu, wall) = cpu.read();
    let server_cores = cpu.server_cores();
    let contention = cpu.contention();
    let (s1, d1) = (sent(&pubs), sent(&discard));
    let mut snap = collect_all(&groups)?;
    let worker_cpu = snap.cpu_s;
    let mut errors = vec![];
    for x in pubs.into_iter().chain(discard) {
        errors.extend(x.stop()?);
    }
    drain(&groups, p.drain);
    let closed = group::progress(&groups).closed;
    let failed = group::progress(&groups).failed;
    snap.merge(shutdown_all(groups)?);
    if let Some(out) = ctx.samples.as_mut() {
        write_samples(out, label, p, &snap.raw).context("cannot write the --samples file")?;
    }
    let mut r = base_result(ctx, p, &snap, wall, my_cpu + worker_cpu);
    r.arrival_legs = crate::arrivals::split(&snap.raw);
    // One window, one collect: each subscriber's p99 covers the same time (the steps that
    // collect several times would list a subscriber once per collect).
    r.fairness = Fairness::of(&snap.sub_p99, &snap.latency);
    r.server_cpu_cores = server_cores;
    r.contention = Some(contention);
    r.publish_rate = (s1 - s0) as f64 / wall;
    r.publish_expected = p.rate;
    r.egress_expected = p.rate * spread_fanout(p);
    r.disconnects = closed;
    r.connect_failures = failed;
    r.errors.extend(errors);
    r.errors.extend(short_window(wall, p.duration));
    if p.discard_rate > 0.0 || r.extra.is_empty() {
        r.extra.insert("discard_rate".into(), json!(p.discard_rate));
        r.extra.insert(
            "discard_rate_achieved".into(),
            json!((d1 - d0) as f64 / wall),
        );
    }
    Ok(r)
}

/// An error for a fan-out step whose measuring window came out much shorter than asked: its
/// instants are fixed before the warm-up, so a subscriber pool that answers the collect at the
/// window's start late (a stalled worker process or thread) eats into it, and the table would
/// show rates and latencies over a sliver as if over the whole window.
fn short_window(measured_s: f64, asked_s: f64) -> Option<String> {
    (measured_s < 0.9 * asked_s).then(|| {
        format!(
            "the measuring window lasted {measured_s:.2} s of the {asked_s} s asked: \
             the subscriber pools answered late, so this step covers less than its window"
        )
    })
}

/// Appends a step's deliveries to the `--samples` file: a comment line naming the step, then
/// one line per delivery, "send stamp receive arrived" (µs since the UNIX epoch; stamp 0 when
/// the publisher did not ask herald for one; arrived, when the read that completed the message
/// reached the bench's socket by the kernel's stamp, 0 without one: see [`crate::arrivals`]),
/// in no particular order.
fn write_samples(
    out: &mut impl std::io::Write,
    label: &str,
    p: &Params,
    raw: &[crate::load::RawSample],
) -> Result<()> {
    writeln!(
        out,
        "# {label}: clients {}, rate {}, discard_rate {}, {} deliveries: send_us stamp_us receive_us arrived_us",
        p.clients,
        p.rate,
        p.discard_rate,
        raw.len()
    )?;
    for (send, stamp, receive, arrived) in raw {
        writeln!(out, "{send} {stamp} {receive} {arrived}")?;
    }
    out.flush()?;
    Ok(())
}

/// The `publishers` connections sharing `rate` over `topics` in `spread` order; they start
/// sending when `go` is set.
fn paced_publishers(
    ctx: &Ctx,
    p: &Params,
    topics: &Arc<Vec<String>>,
    spread: Spread,
    max_message: usize,
    go: &Arc<AtomicBool>,
) -> Result<Vec<Publisher>> {
    (0..p.publishers)
        .map(|i| {
            Publisher::start(
                PubSpec {
                    url: ctx.url.clone(),
                    protocol: p.publisher_protocol()?,
                    qos: p.mqtt_qos,
                    numbered_from: 0,
                    topics: topics.clone(),
                    spread,
                    index: i,
                    stride: p.publishers,
                    schedule: Schedule::new(p.rate / p.publishers as f64, None),
                    payload: p.payload as usize,
                    binary: p.binary,
                    stamp: p.stamp,
                    text: None,
                    max_message,
                    wait_for: None,
                },
                go.clone(),
            )
        })
        .collect()
}

fn spread_fanout(p: &Params) -> f64 {
    crate::schedule::Assignment::new(p.topic_count(), p.subs_per_client).mean_fanout(p.clients)
}

/// Seeds 000/002: `trials` × `messages` at `interval_ms` (0 = burst); both legs per trial.
fn proxy_step(ctx: &mut Ctx, p: &Params, label: &str) -> Result<StepResult> {
    let mut p = p.clone();
    p.topics = 1;
    p.subs_per_client = 1;
    p.topic_names = vec!["hello".into()];
    p.topic_prefix = "proxy".into();
    let interval = Duration::from_secs_f64(p.interval_ms.max(0.0) / 1000.0);
    // `duration` bounds the step: fewer trials, then fewer messages per trial.
    let trial_time = interval.as_secs_f64() * p.messages as f64;
    let mut trials = p.trials.max(1);
    let mut messages = p.messages.max(1);
    if trial_time > 0.0 {
        trials = trials.min(((p.duration / trial_time).floor() as u64).max(1));
        if trial_time > p.duration {
            messages = ((p.duration / interval.as_secs_f64()) as u64).clamp(1, messages);
        }
    }
    let mut spec = client_spec(ctx, &p, 1 << 20);
    spec.record_raw = true;
    let (groups, ranges) = start_groups(&spec, &p, p.clients)?;
    for (g, (a, b)) in groups.iter().zip(&ranges) {
        g.add(*a, *b)?;
    }
    wait_ready(ctx, &groups, p.clients, &p, label)?;
    for g in &groups {
        g.set_window(0, u64::MAX)?;
    }
    let topics = Arc::new(vec![p.topic(0)]);
    let mut per_trial: [Vec<Summary>; 3] = [vec![], vec![], vec![]];
    let mut all = Snapshot::empty();
    let mut missing_total = 0u64;
    let mut sent_total = 0u64;
    let mut send_time = 0.0;
    let mut errors = vec![];
    let cpu = CpuMeter::start_with(ctx.server_pid);
    let t_all = Instant::now();
    let expected_per_trial = messages * p.clients;
    for trial in 0..trials {
        ctx.check_stop()?;
        let base = group::progress(&groups).received;
        let go = Arc::new(AtomicBool::new(false));
        let publ = Publisher::start(
            PubSpec {
                url: ctx.url.clone(),
                protocol: p.publisher_protocol()?,
                qos: p.mqtt_qos,
                // Each trial's publisher numbers on from the previous trial's last message.
                numbered_from: trial * messages,
                topics: topics.clone(),
                spread: Spread::new(1, 1),
                index: 0,
                stride: 1,
                schedule: Schedule::every(interval, Some(messages)),
                payload: 0,
                binary: false,
                stamp: true,
                text: Some(p.text.clone()),
                max_message: 1 << 20,
                wait_for: None,
            },
            go.clone(),
        )?;
        go.store(true, Relaxed);
        let t0 = Instant::now();
        while !publ.is_finished() {
            ctx.check_stop()?;
            std::thread::sleep(Duration::from_millis(5));
            let got = group::progress(&groups).received - base;
            ctx.progress.set(format!(
                "{label}: interval {} ms, trial {}/{trials}: sent {}/{messages}, received {got}",
                p.interval_ms,
                trial + 1,
                publ.sent()
            ));
        }
        send_time += t0.elapsed().as_secs_f64();
        sent_total += publ.sent();
        errors.extend(publ.stop()?);
        let deadline = Instant::now() + Duration::from_secs_f64(p.trial_timeout);
        while group::progress(&groups).received - base < expected_per_trial
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(2));
        }
        let snap = collect_all(&groups)?;
        let n = snap.raw.len() as u64;
        missing_total += expected_per_trial.saturating_sub(n);
        // The legs of the deliveries herald stamped (all of them, unless the protocol has no
        // way to ask: then the trial has no legs, only end to end).
        let stamped = || snap.raw.iter().filter(|&&(_, ts, _, _)| ts > 0);
        let l1: Vec<i64> = stamped()
            .map(|&(s, ts, _, _)| ts as i64 - s as i64)
            .collect();
        let l2: Vec<i64> = stamped()
            .map(|&(_, ts, r, _)| r as i64 - ts as i64)
            .collect();
        let e2e: Vec<i64> = snap
            .raw
            .iter()
            .map(|&(s, _, r, _)| r as i64 - s as i64)
            .collect();
        per_trial[0].push(Summary::from_values(&l1));
        per_trial[1].push(Summary::from_values(&l2));
        per_trial[2].push(Summary::from_values(&e2e));
        all.merge(snap);
    }
    let (my_cpu, wall) = cpu.read();
    let _ = wall;
    let closed = group::progress(&groups).closed;
    all.merge(shutdown_all(groups)?);
    let elapsed = t_all.elapsed().as_secs_f64();
    // Window for rates = time spent sending (the trials), CPU over the whole step.
    let mut r = base_result(ctx, &p, &all, send_time.max(1e-9), 0.0);
    r.server_cpu_cores = cpu.server_cores();
    r.bench_cpu_cores = my_cpu / elapsed.max(1e-9);
    r.bench_cpu_saturated = r.bench_cpu_cores > 0.9 * ctx.bench_cores as f64;
    r.publish_rate = sent_total as f64 / send_time.max(1e-9);
    r.publish_expected = if interval.is_zero() {
        r.publish_rate
    } else {
        1.0 / interval.as_secs_f64()
    };
    r.egress_expected = r.publish_expected * p.clients as f64;
    r.lost = r.lost.max(missing_total);
    r.disconnects = closed;
    r.errors.extend(errors);
    r.extra.insert("interval_ms".into(), json!(p.interval_ms));
    r.extra.insert("trials".into(), json!(trials));
    r.extra.insert("messages_per_trial".into(), json!(messages));
    r.extra.insert(
        "missing_per_trial".into(),
        json!(missing_total as f64 / trials as f64),
    );
    r.extra.insert(
        "pub_to_server_trials".into(),
        serde_json::to_value(Summary::mean_of(&per_trial[0]))?,
    );
    r.extra.insert(
        "server_to_sub_trials".into(),
        serde_json::to_value(Summary::mean_of(&per_trial[1]))?,
    );
    r.extra.insert(
        "end_to_end_trials".into(),
        serde_json::to_value(Summary::mean_of(&per_trial[2]))?,
    );
    Ok(r)
}

/// Seed 004: clients added step by step; traders publish orders on their share.
fn stock_ramp(ctx: &mut Ctx, steps: &[Step], out: &mut Vec<StepResult>) -> Result<()> {
    let Some(first) = steps.first() else {
        return Ok(());
    };
    let p0 = &first.params;
    let max_clients = steps.iter().map(|s| s.params.clients).max().unwrap_or(0);
    let mut spec = client_spec(ctx, p0, 1 << 20);
    let every = if p0.trader_fraction > 0.0 {
        (1.0 / p0.trader_fraction).round().max(1.0) as u64
    } else {
        0
    };
    let trader = TraderSpec {
        every,
        block: p0.topic_count(),
        interval_us: (p0.order_interval_ms * 1000.0).round().max(1.0) as u64,
        payload: p0.payload as usize,
        stamp: p0.stamp,
    };
    spec.trader = Some(trader.clone());
    spec.bind_sources = max_clients > 25_000;
    let mut pmax = p0.clone();
    pmax.clients = max_clients;
    // Groups sized for the largest step; clients are added to them step by step.
    let (groups, _) = start_groups(&spec, &pmax, max_clients)?;
    let ramp = stock_steps(ctx, steps, &groups, &trader, out);
    // Final integrity (loss counted at the end) goes to the last step that ran.
    let fin = shutdown_all(groups)?;
    if let Some(last) = out.last_mut() {
        last.lost = fin.counts.lost;
        last.duplicates = fin.counts.duplicates;
        last.out_of_order = fin.counts.out_of_order;
        last.discard_notices = fin.counts.discard_notices;
    }
    ramp
}

/// The steps of [`stock_ramp`] on its groups: clients added, then warm-up and measurement.
fn stock_steps(
    ctx: &mut Ctx,
    steps: &[Step],
    groups: &[Group],
    trader: &TraderSpec,
    out: &mut Vec<StepResult>,
) -> Result<()> {
    let mut have = 0u64;
    for (si, step) in steps.iter().enumerate() {
        let p = &step.params;
        let label = step_label(si, steps.len());
        if p.clients > have {
            // Spread the new clients over the groups.
            for (g, (a, b)) in groups
                .iter()
                .zip(split(p.clients - have, groups.len() as u64))
            {
                if b > a {
                    g.add(have + a, have + b)?;
                }
            }
            have = p.clients;
        }
        wait_ready(ctx, groups, have, p, &label)?;
        let traders = (0..have).filter(|&c| trader.is_trader(c)).count() as u64;
        for g in groups {
            g.set_window(0, u64::MAX)?;
        }
        // Warm-up, then the measured stage, logging every `report_every` seconds like the seed.
        std::thread::sleep(Duration::from_secs_f64(p.warmup));
        ctx.check_stop()?;
        let _ = collect_all(groups)?;
        let cpu = CpuMeter::start_with(ctx.server_pid);
        let mut total = Snapshot::empty();
        let t0 = Instant::now();
        let mut last = (Instant::now(), group::progress(groups).orders);
        let end = t0 + Duration::from_secs_f64(p.duration);
        while Instant::now() < end {
            let next = (Instant::now() + Duration::from_secs_f64(p.report_every)).min(end);
            ctx.wait_until(next, groups, &|pr, rate| {
                format!(
                    "{label}: clients {have}: orders {}, receiving {rate:.0}/s",
                    pr.orders
                )
            })?;
            let snap = collect_all(groups)?;
            let orders = group::progress(groups).orders;
            let dt = last.0.elapsed().as_secs_f64();
            let tx = (orders - last.1) as f64 / dt.max(1e-9);
            last = (Instant::now(), orders);
            let mean_leg2 = if snap.server_to_sub.is_empty() {
                f64::NAN
            } else {
                snap.server_to_sub.mean()
            };
            ctx.progress.line(&format!(
                "clients: {have}, tx/second: {tx:.1}, deliveries/second: {:.1}, mean server→client latency: {:.3} ms, mean end-to-end: {:.3} ms",
                snap.window_received as f64 / dt.max(1e-9),
                mean_leg2 / 1000.0,
                snap.latency.mean() / 1000.0
            ));
            total.merge(snap);
        }
        let (my_cpu, wall) = cpu.read();
        let worker_cpu = total.cpu_s;
        let closed = group::progress(groups).closed;
        let failed = group::progress(groups).failed;
        // Integrity so far: counts are cumulative, the latest snapshot holds them.
        let mut r = base_result(ctx, p, &total, wall, my_cpu + worker_cpu);
        r.server_cpu_cores = cpu.server_cores();
        r.clients = have;
        r.subs_per_client = 1;
        let offered = traders as f64 * 1e6 / trader.interval_us as f64;
        r.publish_expected = offered;
        r.publish_rate = total.window_orders as f64 / wall;
        r.egress_expected = r.publish_rate * have as f64 / p.topic_count() as f64;
        r.disconnects = closed;
        r.connect_failures = failed;
        r.extra.insert("traders".into(), json!(traders));
        r.extra.insert("tx_per_s".into(), json!(r.publish_rate));
        r.extra.insert(
            "mean_server_to_client_ms".into(),
            json!(r.server_to_sub_us.as_ref().map(|s| s.mean / 1000.0)),
        );
        out.push(r);
    }
    Ok(())
}

/// Seed 001: images back to back, each once every subscriber has the previous one.
fn images_step(ctx: &mut Ctx, p: &Params, label: &str) -> Result<StepResult> {
    let mut p = p.clone();
    p.topics = 1;
    p.subs_per_client = 1;
    p.binary = true;
    p.payload = p.image_bytes();
    let bytes = p.image_bytes() as usize;
    let max_message = bytes + (1 << 20);
    let spec = client_spec(ctx, &p, max_message);
    let (groups, ranges) = start_groups(
        &spec,
        &Params {
            bench_threads: 1,
            ..p.clone()
        },
        p.clients,
    )?;
    for (g, (a, b)) in groups.iter().zip(&ranges) {
        g.add(*a, *b)?;
    }
    wait_ready(ctx, &groups, p.clients, &p, label)?;
    for g in &groups {
        g.set_window(0, u64::MAX)?;
    }
    let Group::Local(pool) = &groups[0] else {
        bail!("images run in one process")
    };
    // The slow subscribers, each on a thread of its own (not the fast pool's): the publisher
    // waits for the fast subscribers only.
    let slow = (0..p.slow_clients)
        .map(|_| {
            PolicySub::start(PolicySpec {
                url: ctx.url.clone(),
                pattern: p.topic(0),
                policy: p.policy.clone(),
                max_rate: p.max_rate,
                read_rate: p.read_rate,
                expect_len: Some(bytes.max(16)),
                max_message,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let go = Arc::new(AtomicBool::new(false));
    let publ = Publisher::start(
        PubSpec {
            url: ctx.url.clone(),
            protocol: crate::protocol::Protocol::Native,
            qos: 0,
            numbered_from: 0,
            topics: Arc::new(vec![p.topic(0)]),
            spread: Spread::new(1, 1),
            index: 0,
            stride: 1,
            schedule: Schedule::new(f64::INFINITY, Some(p.messages.max(1))),
            payload: bytes,
            binary: true,
            stamp: p.stamp,
            text: None,
            max_message,
            wait_for: Some(WaitFor {
                counter: pool.shared.clone(),
                per_message: p.clients,
                timeout: Duration::from_secs_f64(p.trial_timeout),
            }),
        },
        go.clone(),
    )?;
    let cpu = CpuMeter::start_with(ctx.server_pid);
    go.store(true, Relaxed);
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs_f64(p.duration);
    while !publ.is_finished() && Instant::now() < deadline {
        ctx.check_stop()?;
        std::thread::sleep(Duration::from_millis(20));
        let got = pool.shared.received.load(Relaxed);
        ctx.progress.set(format!(
            "{label}: {}² × {} images: sent {}/{}, delivered {got}, {:.1} images/s",
            p.image_side,
            p.bytes_per_pixel,
            publ.sent(),
            p.messages,
            got as f64 / p.clients.max(1) as f64 / t0.elapsed().as_secs_f64()
        ));
    }
    let timeouts = publ.stats.timeouts.load(Relaxed);
    let sent_images = publ.sent();
    let mut errors = publ.stop()?;
    // Wait for the last image to reach every subscriber.
    let wait = Instant::now() + Duration::from_secs_f64(p.trial_timeout);
    while Instant::now() < wait && pool.shared.received.load(Relaxed) < sent_images * p.clients {
        std::thread::sleep(Duration::from_millis(1));
    }
    let elapsed = t0.elapsed().as_secs_f64();
    let (my_cpu, _) = cpu.read();
    let server_cpu = cpu.server_cores();
    let delivered = pool.shared.received.load(Relaxed);
    // The slow subscribers now read the rest of their backlog at full speed, so every image is
    // either received or announced as dropped.
    let slow_in_run: u64 = slow.iter().map(|s| s.received.load(Relaxed)).sum();
    let slow: Vec<PolicyReport> = slow
        .into_iter()
        .map(|s| s.drain(Duration::from_millis(500), Duration::from_secs(10)))
        .collect();
    let closed = group::progress(&groups).closed;
    let snap = shutdown_all(groups)?;
    let mut r = base_result(ctx, &p, &snap, elapsed, my_cpu);
    r.server_cpu_cores = server_cpu;
    let full = delivered / p.clients.max(1);
    r.publish_rate = sent_images as f64 / elapsed;
    r.publish_expected = r.publish_rate;
    r.egress_expected = r.publish_rate * p.clients as f64;
    r.disconnects = closed;
    r.errors.append(&mut errors);
    r.extra.insert("image_side".into(), json!(p.image_side));
    r.extra
        .insert("bytes_per_pixel".into(), json!(p.bytes_per_pixel));
    r.extra.insert("image_bytes".into(), json!(bytes));
    r.extra.insert("images".into(), json!(full));
    r.extra
        .insert("images_per_s".into(), json!(full as f64 / elapsed));
    r.extra.insert(
        "mb_per_s".into(),
        json!(full as f64 * bytes as f64 / elapsed / 1e6),
    );
    r.extra.insert("wait_timeouts".into(), json!(timeouts));
    if !slow.is_empty() {
        let mut c = crate::integrity::Counts::default();
        for s in &slow {
            c.add(&s.counts);
            r.errors.extend(s.errors.iter().cloned());
        }
        let n = slow.len() as f64;
        r.extra.insert("slow_clients".into(), json!(slow.len()));
        r.extra.insert("slow_images".into(), json!(c.received));
        r.extra.insert(
            "slow_images_per_s".into(),
            json!(slow_in_run as f64 / n / elapsed),
        );
        r.extra.insert("slow_dropped".into(), json!(c.discarded));
        // Published images neither received nor announced (0 when the policy keeps its word).
        r.extra.insert(
            "slow_unaccounted".into(),
            json!((sent_images * slow.len() as u64).saturating_sub(c.received + c.discarded)),
        );
        r.extra.insert("slow_lost".into(), json!(c.lost));
        r.extra.insert(
            "slow_stale".into(),
            json!(slow.iter().map(|s| s.stale).sum::<u64>()),
        );
        r.extra.insert(
            "slow_cpu_cores".into(),
            json!(slow.iter().map(|s| s.cpu_s).sum::<f64>() / elapsed),
        );
        r.extra.insert(
            "slow_wrong_size".into(),
            json!(slow.iter().map(|s| s.wrong_size).sum::<u64>()),
        );
    }
    Ok(r)
}

/// Issue 5: `clients` policy subscribers on `{topic_prefix}/>` with `policy` and `max_rate`, P
/// publishers at a total `rate` round-robin over T topics. Reports what each subscriber gets
/// per topic per second, stale deliveries, whether every topic's last delivery was its newest
/// value (checked against herald's own last values), and herald's CPU.
fn conflation_step(ctx: &mut Ctx, p: &Params, label: &str) -> Result<StepResult> {
    let t = p.topic_count();
    let topics = topic_names(&p.topic_prefix, t, p);
    let pattern = format!("{}/>", p.topic_prefix);
    let max_message = 1 << 20;
    let subs = (0..p.clients)
        .map(|_| {
            PolicySub::start(PolicySpec {
                url: ctx.url.clone(),
                pattern: pattern.clone(),
                policy: p.policy.clone(),
                max_rate: p.max_rate,
                read_rate: 0.0,
                expect_len: None,
                max_message,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let go = Arc::new(AtomicBool::new(false));
    let pubs = paced_publishers(ctx, p, &topics, Spread::new(t, 1), max_message, &go)?;
    let sent = || pubs.iter().map(|x| x.sent()).sum::<u64>();
    let received = || subs.iter().map(|s| s.received.load(Relaxed)).sum::<u64>();
    go.store(true, Relaxed);
    let t_go = Instant::now();
    let win_start = t_go + Duration::from_secs_f64(p.warmup);
    let win_end = win_start + Duration::from_secs_f64(p.duration);
    let phase = |ctx: &mut Ctx, until: Instant, what: &str| -> Result<()> {
        while Instant::now() < until {
            ctx.check_stop()?;
            std::thread::sleep((until - Instant::now()).min(Duration::from_millis(250)));
            ctx.progress.set(format!(
                "{label}: {what} {:.1}s: published {}, subscribers received {}",
                t_go.elapsed().as_secs_f64(),
                sent(),
                received()
            ));
        }
        Ok(())
    };
    phase(ctx, win_start, "warming up")?;
    let cpu = CpuMeter::start_with(ctx.server_pid);
    let (s0, r0) = (sent(), received());
    phase(ctx, win_end, "measuring")?;
    let (s1, r1) = (sent(), received());
    let (my_cpu, window) = cpu.read();
    let server_cpu = cpu.server_cores();
    let mut errors = vec![];
    for x in pubs {
        errors.extend(x.stop()?);
    }
    let newest = if subs.is_empty() {
        HashMap::new()
    } else {
        // herald may still be reading what the publishers wrote before they stopped: wait until
        // its last values stop changing (at most `drain` s), then for the throttled topics'
        // last values to go out at their next slot.
        let mut newest = last_values(&ctx.url, &pattern, t)?;
        let settle = Instant::now();
        while settle.elapsed().as_secs_f64() < p.drain {
            std::thread::sleep(Duration::from_millis(300));
            let again = last_values(&ctx.url, &pattern, t)?;
            if again == newest {
                break;
            }
            newest = again;
        }
        let flush = if p.max_rate > 0.0 {
            1.0 / p.max_rate
        } else {
            0.0
        };
        std::thread::sleep(Duration::from_secs_f64(flush + 0.5));
        newest
    };
    let reports: Vec<PolicyReport> = subs.into_iter().map(PolicySub::stop).collect();
    let mut c = crate::integrity::Counts::default();
    let (mut stale, mut newest_ok) = (0u64, 0u64);
    for rep in &reports {
        c.add(&rep.counts);
        stale += rep.stale;
        newest_ok += newest
            .iter()
            .filter(|(topic, seq)| rep.last_seq.get(*topic) == Some(seq))
            .count() as u64;
        errors.extend(rep.errors.iter().cloned());
    }
    let publish_rate = (s1 - s0) as f64 / window;
    let per_sub = if p.max_rate > 0.0 {
        (t as f64 * p.max_rate).min(publish_rate)
    } else {
        publish_rate
    };
    let cores = my_cpu / window;
    errors.truncate(10);
    let mut r = StepResult {
        clients: p.clients,
        egress_expected: per_sub * p.clients as f64,
        egress_achieved: (r1 - r0) as f64 / window,
        publish_rate,
        publish_expected: p.rate,
        lost: c.lost,
        duplicates: c.duplicates,
        discard_notices: c.discard_notices,
        discarded: c.discarded,
        received: r1 - r0,
        window_s: window,
        bench_cpu_cores: cores,
        bench_cores: ctx.bench_cores,
        bench_cpu_saturated: cores > 0.9 * ctx.bench_cores as f64,
        server_cpu_cores: server_cpu,
        publishers: p.publishers,
        topics: t,
        subs_per_client: 1,
        payload: p.payload,
        errors,
        ..Default::default()
    };
    let per_topic = (r1 - r0) as f64 / window / t as f64 / p.clients.max(1) as f64;
    r.extra.insert("policy".into(), json!(p.policy));
    r.extra.insert("max_rate".into(), json!(p.max_rate));
    r.extra.insert("per_topic_per_s".into(), json!(per_topic));
    r.extra.insert("stale".into(), json!(stale));
    r.extra.insert(
        "topics_newest_last".into(),
        json!(newest_ok / p.clients.max(1)),
    );
    Ok(r)
}

/// herald's last value of every topic under `pattern`, as (topic, seq): a `snapshot`
/// subscription on a connection of its own (snapshots are never conflated or dropped).
fn last_values(url: &str, pattern: &str, topics: u64) -> Result<HashMap<String, u64>> {
    let mut ws = crate::publish::connect(url, 1 << 20)?;
    let req = json!({"op": "sub", "topic": pattern, "snapshot": true}).to_string();
    ws.send(tungstenite::Message::text(req))?;
    ws.get_mut()
        .set_read_timeout(Some(Duration::from_millis(500)))?;
    let mut out = HashMap::new();
    while (out.len() as u64) < topics {
        let m = match ws.read() {
            Ok(m) => m,
            // Quiet for 500 ms: herald sent every last value it holds.
            Err(tungstenite::Error::Io(_)) => break,
            Err(e) => return Err(e.into()),
        };
        let incoming = match &m {
            tungstenite::Message::Text(t) => wire::parse_text(t.as_bytes()),
            tungstenite::Message::Binary(b) => wire::parse_binary(b),
            _ => continue,
        };
        if let wire::Incoming::Msg(d) = incoming {
            out.insert(String::from_utf8_lossy(d.topic).into_owned(), d.seq);
        }
    }
    let _ = ws.close(None);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_much_shorter_than_asked_is_an_error() {
        assert_eq!(short_window(9.95, 10.0), None);
        let e = short_window(0.0001, 10.0).expect("a window cut to nothing");
        assert!(e.contains("0.00 s of the 10 s asked"), "{e}");
    }

    #[test]
    fn split_covers_everything_once() {
        assert_eq!(split(10, 3), vec![(0, 3), (3, 6), (6, 10)]);
        assert_eq!(split(5, 1), vec![(0, 5)]);
        let parts = split(45_000, 3);
        assert_eq!(parts.last().unwrap().1, 45_000);
    }
}
