//! CI smoke run: every shipped scenario at tiny scale (seconds) against a spawned herald, checking
//! the JSON report's fields, not timings.
//!
//! Needs a built herald binary: without HERALD_BIN each test says it was skipped and returns.
//!   HERALD_BIN=target/release/herald cargo test -p herald-bench --test smoke
//! The binary is used twice: as the bench (`$HERALD_BIN bench …`) and as the spawned server
//! (`--spawn-bin $HERALD_BIN`), so this also checks the CLI wiring of `herald bench`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

use serde_json::Value;

fn herald_bin() -> Option<PathBuf> {
    let p = PathBuf::from(std::env::var_os("HERALD_BIN")?);
    assert!(p.exists(), "HERALD_BIN={} does not exist", p.display());
    Some(p)
}

fn scenario(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../bench/scenarios")
        .join(format!("{name}.toml"))
}

/// The executable that runs `bench` (default: HERALD_BIN itself). HERALD_BENCH_BIN lets the
/// bench be checked against a real server before the CLI wires `herald bench`, e.g. with
/// HERALD_BENCH_BIN=target/release/examples/mock_herald.
fn bench_bin(herald: &Path) -> PathBuf {
    std::env::var_os("HERALD_BENCH_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| herald.to_path_buf())
}

/// One scenario at a time: each pins a server and a bench to the two cores.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Runs one scenario tiny and returns its JSON report (None: skipped, no HERALD_BIN).
fn run(name: &str, extra: &[&str]) -> Option<Value> {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("report.json");
    let svg = dir.path().join("plot.svg");
    let mut args: Vec<String> = ["--duration", "2", "--set", "warmup=0.5", "--json"]
        .map(String::from)
        .into();
    args.extend([json.display().to_string(), "--plot".into()]);
    args.push(svg.display().to_string());
    args.extend(extra.iter().map(|a| a.to_string()));
    let t0 = Instant::now();
    let out = run_raw(name, &args)?;
    assert!(
        out.status.success(),
        "herald bench {name} failed ({}):\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        t0.elapsed().as_secs() < 120,
        "{name} took {:?}",
        t0.elapsed()
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("| "),
        "{name}: no Markdown table on stdout:\n{stdout}"
    );
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    // What the JSON says about fairness, the Markdown prints too.
    if let Some(f) = v["steps"][0].get("fairness") {
        let cells = format!(
            "{:.2}×, {} (by chance {:.2}×)",
            f["spread"].as_f64().unwrap(),
            f["subscribers"],
            f["spread_by_chance"].as_f64().unwrap()
        );
        assert!(
            stdout.contains("Fairness (each subscriber's p99") && stdout.contains(&cells),
            "{name}: fairness {f} not in the report:\n{stdout}"
        );
    }
    Some(v)
}

/// Runs `herald bench` on scenario `name` against a spawned herald with `args` after
/// `--quiet`, however it ends (None: skipped, no HERALD_BIN).
fn run_raw(name: &str, args: &[String]) -> Option<std::process::Output> {
    let Some(bin) = herald_bin() else {
        eprintln!("skipped {name}: set HERALD_BIN to a built herald to run the bench smoke test");
        return None;
    };
    let _one_at_a_time = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let out = Command::new(bench_bin(&bin))
        .arg("bench")
        .arg(scenario(name))
        .arg("--spawn-bin")
        .arg(&bin)
        .arg("--quiet")
        .args(args)
        .output()
        .expect("run herald bench");
    Some(out)
}

/// `["--set", a, "--set", b, …]`.
fn sets(params: &[&str]) -> Vec<String> {
    params
        .iter()
        .flat_map(|p| ["--set".to_string(), p.to_string()])
        .collect()
}

/// The fields scripts rely on (docs/bench.md), on every step.
fn check(name: &str, v: &Value) {
    let steps = v["steps"]
        .as_array()
        .unwrap_or_else(|| panic!("{name}: no steps"));
    assert_eq!(
        steps.len(),
        1,
        "{name}: --duration collapses the sweep to one step"
    );
    for s in steps {
        for k in [
            "clients",
            "egress_expected",
            "egress_achieved",
            "publish_rate",
            "lost",
            "duplicates",
            "out_of_order",
            "discard_notices",
        ] {
            assert!(
                s[k].is_number(),
                "{name}: step field {k} missing or not a number: {s}"
            );
        }
        assert!(
            s["bench_cpu_saturated"].is_boolean(),
            "{name}: bench_cpu_saturated"
        );
        for k in ["min", "mean", "p50", "p99", "p999", "max", "stdev"] {
            assert!(
                s["latency_us"][k].is_number(),
                "{name}: latency_us.{k} missing: {s}"
            );
        }
        assert!(
            s["egress_achieved"].as_f64().unwrap() > 0.0,
            "{name}: nothing delivered: {s}"
        );
        assert!(
            s["latency_us"]["count"].as_u64().unwrap() > 0,
            "{name}: no latency sample"
        );
        // Integrity on an unloaded loopback: nothing lost, duplicated or reordered.
        for k in ["lost", "duplicates", "out_of_order"] {
            assert_eq!(s[k].as_u64(), Some(0), "{name}: {k} on a tiny run: {s}");
        }
    }
    assert!(v["machine"]["cores"].as_u64().unwrap() >= 1);
    let write_us = v["machine"]["loopback_write_us"].as_f64().unwrap();
    assert!(write_us > 0.0 && write_us < 1_000.0, "{write_us} µs");
}

#[test]
fn solace_high() {
    let Some(v) = run("solace-3.1.1-high", &["--clients", "20"]) else {
        return;
    };
    check("solace-3.1.1-high", &v);
    let s = &v["steps"][0];
    assert_eq!(s["clients"], 20);
    // 20 clients × 100 subscriptions / 10,000 topics × 5,000 msg/s = 1,000 msg/s
    assert_eq!(s["egress_expected"].as_f64(), Some(1000.0));
    assert!(
        s["pub_to_server_us"]["mean"].is_number(),
        "stamped legs reported"
    );
}

#[test]
fn solace_very_high() {
    let Some(v) = run("solace-3.1.2-very-high", &["--clients", "20"]) else {
        return;
    };
    check("solace-3.1.2-very-high", &v);
    // Each subscriber gets 100 msg/s: ~200 samples in the 2 s window, enough for its own p99.
    let f = &v["steps"][0]["fairness"];
    let n = f["subscribers"]
        .as_u64()
        .unwrap_or_else(|| panic!("no fairness: {v}"));
    assert!((1..=20).contains(&n), "fairness over {n} subscribers: {f}");
    let [best, median, worst, spread] = ["best_p99_us", "median_p99_us", "worst_p99_us", "spread"]
        .map(|k| {
            f[k].as_f64()
                .unwrap_or_else(|| panic!("fairness.{k} missing: {f}"))
        });
    assert!(
        0.0 < best && best <= median && median <= worst,
        "best ≤ median ≤ worst: {f}"
    );
    assert!(
        spread >= 1.0 && (spread - worst / best).abs() < 1e-9,
        "spread = worst ÷ best: {f}"
    );
    // The pooled p99 lies between the best and the worst subscriber's (within the histograms'
    // resolution: 2 significant digits per subscriber).
    let p99 = v["steps"][0]["latency_us"]["p99"].as_f64().unwrap();
    assert!(
        best * 0.98 <= p99 && p99 <= worst * 1.02,
        "pooled p99 {p99} outside [{best}, {worst}]"
    );
    // Chance alone, drawn from the same pooled latencies, spreads the p99s too: by at least
    // nothing, and by less than the whole range of the window's latencies.
    let by_chance = f["spread_by_chance"].as_f64().unwrap();
    let lat = &v["steps"][0]["latency_us"];
    let range = lat["max"].as_f64().unwrap() / lat["min"].as_f64().unwrap().max(1.0);
    assert!(
        (1.0..=range * 1.01).contains(&by_chance),
        "spread by chance {by_chance} outside [1, {range}]: {f}"
    );
}

/// `--samples` writes every delivery of the window, one line each, as many as the report's
/// `received`; each was received after it was sent and after herald stamped it (one clock,
/// one host; herald's stamp is the time its reader last waited, so it may precede the send),
/// and reached the bench's socket (the kernel's stamp) after herald's stamp and before the
/// bench read it. The report splits herald → subscriber at that stamp.
#[test]
fn samples_hold_every_delivery_of_the_window() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("samples.txt");
    let Some(v) = run(
        "solace-3.1.2-very-high",
        &["--clients", "20", "--samples", file.to_str().unwrap()],
    ) else {
        return;
    };
    let text = std::fs::read_to_string(&file).unwrap();
    let mut lines = text.lines();
    let head = lines.next().unwrap();
    assert!(head.starts_with("# step 1/1: clients 20,"), "{head}");
    let mut n = 0u64;
    for line in lines {
        let t: Vec<u64> = line.split(' ').map(|x| x.parse().unwrap()).collect();
        let [send, stamp, receive, arrived] = t[..] else {
            panic!("four fields: {line}")
        };
        assert!(send <= receive && stamp <= receive && stamp > 0, "{line}");
        assert!(stamp <= arrived && arrived <= receive, "{line}");
        n += 1;
    }
    assert!(n > 0);
    assert_eq!(n, v["steps"][0]["received"].as_u64().unwrap());
    let legs = &v["steps"][0]["arrival_legs"];
    for leg in ["herald_to_kernel_us", "kernel_to_bench_us"] {
        assert_eq!(legs[leg]["count"].as_u64(), Some(n), "{leg}: {legs}");
    }
    let slowest = legs["slowest"]["deliveries"].as_u64().unwrap();
    assert!((1..=n).contains(&slowest), "{legs}");
    // Other kinds have no such window: a clear error, not a file left empty.
    let out = run_raw(
        "proxy-latency",
        &["--samples".into(), file.display().to_string()],
    )
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("--samples applies to fan-out"),
        "{stderr}"
    );
}

#[test]
fn solace_filtering() {
    let Some(v) = run(
        "solace-3.2-filtering",
        &["--clients", "20", "--set", "discard_rate=20000"],
    ) else {
        return;
    };
    check("solace-3.2-filtering", &v);
    assert!(v["summary"]["max_discard_rate_held"].is_number());
    assert!(
        v["steps"][0]["extra"]["discard_rate_achieved"]
            .as_f64()
            .unwrap()
            > 0.0
    );
}

#[test]
fn solace_large() {
    let Some(v) = run("solace-3.3-large", &["--clients", "20"]) else {
        return;
    };
    check("solace-3.3-large", &v);
    assert_eq!(v["steps"][0]["payload"], 1024);
}

#[test]
fn proxy_latency() {
    let Some(v) = run("proxy-latency", &["--trials", "2"]) else {
        return;
    };
    check("proxy-latency", &v);
    let e = &v["steps"][0]["extra"];
    for k in ["pub_to_server_trials", "server_to_sub_trials"] {
        for f in ["min", "max", "mode", "p50", "mean", "stdev"] {
            assert!(e[k][f].is_number(), "proxy: {k}.{f}");
        }
    }
    assert!(e["missing_per_trial"].is_number());
}

/// herald's MQTT and STOMP paths run the fan-out scenario as its native path does: the same
/// payload stamp, the same integrity checks (here: nothing lost, duplicated or reordered). A
/// STOMP run is split into legs by herald's stamp (`stamp:true`); MQTT has no way to ask.
#[test]
fn solace_very_high_over_mqtt_and_stomp() {
    for protocol in ["mqtt", "stomp"] {
        let set = format!("protocol={protocol}");
        let Some(v) = run(
            "solace-3.1.2-very-high",
            &["--clients", "20", "--set", &set],
        ) else {
            return;
        };
        check(protocol, &v);
        let s = &v["steps"][0];
        assert_eq!(
            (s["protocol"].as_str(), s["pub_protocol"].as_str()),
            (Some(protocol), Some(protocol))
        );
        assert_eq!(s["egress_expected"].as_f64(), Some(2000.0));
        assert_eq!(
            s["pub_to_server_us"]["mean"].is_number(),
            protocol == "stomp",
            "{protocol}: legs only where herald stamps: {s}"
        );
        let us = s["server_cpu_us_per_delivery"].as_f64().unwrap();
        assert!(us > 0.0, "{protocol}: server CPU per delivery {us}");
    }
}

/// Publishers of one protocol reach subscribers of another, the payload read alike; MQTT
/// subscribers check each of three publishers' numbering apart.
#[test]
fn publishers_and_subscribers_of_different_protocols() {
    for (subs, publishers) in [("mqtt", "native"), ("native", "mqtt"), ("stomp", "mqtt")] {
        let sets = sets(&[
            &format!("protocol={subs}"),
            &format!("pub_protocol={publishers}"),
            "publishers=3",
        ]);
        let mut args = vec!["--clients", "20"];
        args.extend(sets.iter().map(String::as_str));
        let Some(v) = run("solace-3.1.2-very-high", &args) else {
            return;
        };
        check(&format!("{publishers} → {subs}"), &v);
        assert_eq!(v["steps"][0]["publishers"], 3);
    }
}

/// Seed 000's measurement with a STOMP publisher and subscriber: both legs, per trial.
#[test]
fn proxy_latency_over_stomp() {
    let Some(v) = run("proxy-latency-stomp", &["--trials", "2"]) else {
        return;
    };
    check("proxy-latency-stomp", &v);
    let s = &v["steps"][0];
    assert_eq!(s["protocol"], "stomp");
    for k in [
        "pub_to_server_trials",
        "server_to_sub_trials",
        "end_to_end_trials",
    ] {
        assert!(
            s["extra"][k]["count"].as_u64().unwrap() > 0,
            "stomp proxy: {k}: {s}"
        );
    }
}

/// bench/mqtt-vs-mosquitto.sh at tiny scale: herald native, herald MQTT and a Mosquitto it
/// starts and stops (the bench against an external server, its CPU by `--server-pid`), and
/// the table of medians and ratios. Skipped without Debian's mosquitto.
#[test]
fn mqtt_vs_mosquitto_script_runs_all_three() {
    if !Path::new("/usr/sbin/mosquitto").exists() {
        eprintln!("skipped: needs /usr/sbin/mosquitto");
        return;
    }
    rounds_script(
        "mqtt-vs-mosquitto.sh",
        &[],
        &["herald-native", "herald-mqtt", "mosquitto"],
        &[
            "herald-mqtt / herald-native: p99.9",
            "herald-mqtt / mosquitto: p99.9",
        ],
    );
}

/// bench/reference-pairs.sh at tiny scale: herald and the C reference it builds, starts and
/// stops, and the ratios between them.
#[test]
fn reference_pairs_script_runs_both() {
    rounds_script(
        "reference-pairs.sh",
        &[],
        &["herald", "reference"],
        &["herald / reference: p99.9"],
    );
}

/// bench/pooled.py pools the rounds of several sets: each round's ratio, their median, and
/// how many are at or below 1.0, from round directories or from a results file's matching sets.
#[test]
fn pooled_ratio_of_rounds_from_several_sets() {
    let dir = tempfile::tempdir().unwrap();
    // The p99.9 is twice the CPU figure, so its ratios are the same.
    let report = |cpu: f64| {
        serde_json::json!({"steps": [{
            "server_cpu_us_per_delivery": cpu,
            "latency_us": {"p999": 2.0 * cpu},
        }]})
    };
    // Two sets: ratios 0.9 and 1.2 in the first, 1.0 in the second; round 2 of the second
    // has no reference run and counts for nothing.
    let sets = [
        ("a", vec![(1, 9.0, Some(10.0)), (2, 6.0, Some(5.0))]),
        ("b", vec![(1, 7.0, Some(7.0)), (2, 1.0, None)]),
    ];
    let mut results = Vec::new();
    for (name, rounds) in &sets {
        let set = dir.path().join(name);
        std::fs::create_dir(&set).unwrap();
        let mut runs = Vec::new();
        for (round, herald, reference) in rounds {
            let mut servers = vec![("herald", *herald)];
            servers.extend(reference.map(|r| ("reference", r)));
            for (server, cpu) in servers {
                let path = set.join(format!("r{round}-{server}.json"));
                std::fs::write(path, report(cpu).to_string()).unwrap();
                runs.push(serde_json::json!({
                    "server": server, "round": round, "step": report(cpu)["steps"][0],
                }));
            }
        }
        results.push(serde_json::json!({"command": format!("set {name}"), "runs": runs}));
    }
    let results_file = dir.path().join("results.json");
    std::fs::write(
        &results_file,
        serde_json::json!({ "sets": results }).to_string(),
    )
    .unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/pooled.py");
    let pooled = |args: &[&std::ffi::OsStr]| {
        let out = Command::new("python3")
            .arg(&script)
            .args(args)
            .output()
            .expect("python3");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let both = pooled(&[
        dir.path().join("a").as_os_str(),
        dir.path().join("b").as_os_str(),
    ]);
    assert!(
        both.contains("median 1.000 over 3 rounds") && both.contains("2 of 3 at or below 1.0"),
        "{both}"
    );
    let first = pooled(&[
        "--results".as_ref(),
        results_file.as_os_str(),
        "--match".as_ref(),
        "set a$".as_ref(),
    ]);
    assert!(
        first.contains("median 1.050 over 2 rounds") && first.contains("1 of 2 at or below 1.0"),
        "{first}"
    );
    let tail = pooled(&[
        dir.path().join("a").as_os_str(),
        "--metric".as_ref(),
        "latency_us.p999".as_ref(),
    ]);
    assert!(
        tail.contains("latency_us.p999: median 1.050 over 2 rounds"),
        "{tail}"
    );
}

/// bench/reference-pairs.sh's `--herald-config` reaches herald: with last values only the
/// rounds run as before, and a key herald does not know stops herald's run (the reference's
/// still runs).
#[test]
fn reference_pairs_script_adds_a_herald_config() {
    let dir = tempfile::tempdir().unwrap();
    let last_values = dir.path().join("last-values.toml");
    std::fs::write(
        &last_values,
        "[[history]]\npattern = \">\"\nmax_messages = 0\n",
    )
    .unwrap();
    let last_values = last_values.to_string_lossy().into_owned();
    rounds_script(
        "reference-pairs.sh",
        &["--herald-config", &last_values],
        &["herald", "reference"],
        &["herald / reference: p99.9"],
    );
    let unknown = dir.path().join("unknown.toml");
    std::fs::write(&unknown, "no_such_key = 1\n").unwrap();
    let unknown = unknown.to_string_lossy().into_owned();
    let out = run_rounds_script(
        "reference-pairs.sh",
        &["--herald-config", &unknown],
        &dir.path().join("unknown"),
    );
    let Some(out) = out else {
        return;
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("herald failed in round 1"), "{stderr}");
}

/// bench/workers-pairs.sh at tiny scale: herald with one worker thread, with two on both
/// cores and with two on one core, each started and stopped by the script.
#[test]
fn workers_pairs_script_runs_all_three() {
    rounds_script(
        "workers-pairs.sh",
        &[],
        &["two-workers", "one-worker", "two-workers-core0"],
        &[
            "two-workers / one-worker: p99.9",
            "two-workers-core0 / one-worker: p99.9",
        ],
    );
}

/// bench/build-pairs.sh at tiny scale: two herald builds (here the same binary twice), each
/// spawned by the bench, and the ratios new / base.
#[test]
fn build_pairs_script_runs_both() {
    let Some(bin) = herald_bin() else {
        eprintln!("skipped: set HERALD_BIN to a built herald");
        return;
    };
    let bin = bin.to_string_lossy().into_owned();
    rounds_script(
        "build-pairs.sh",
        &["--base", &bin],
        &["new", "base"],
        &["new / base: p99.9"],
    );
}

/// Runs one of the interleaved-round scripts in bench/ for one round of 20 clients, with `args`
/// besides, its reports in `out`; `None` (skipped) without HERALD_BIN or two cores (a server
/// core and a bench core).
fn run_rounds_script(script: &str, args: &[&str], out: &Path) -> Option<Output> {
    let Some(bin) = herald_bin() else {
        eprintln!("skipped: set HERALD_BIN to a built herald");
        return None;
    };
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        eprintln!("skipped: needs two cores");
        return None;
    }
    let _one_at_a_time = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../bench")
        .join(script);
    let output = Command::new(&script)
        .args([
            "--clients",
            "20",
            "--duration",
            "2",
            "--warmup",
            "0.5",
            "--rounds",
            "1",
        ])
        .args(args)
        .arg("--bin")
        .arg(&bin)
        .arg("--out")
        .arg(out)
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", script.display()));
    Some(output)
}

/// [`run_rounds_script`], then checks that it succeeded, each run's report, that each server's
/// CPU was measured, and the table's rows and ratios.
fn rounds_script(script: &str, args: &[&str], names: &[&str], ratios: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let Some(out) = run_rounds_script(script, args, dir.path()) else {
        return;
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(!stderr.contains("failed"), "{stderr}");
    for name in names {
        let v: Value = serde_json::from_str(
            &std::fs::read_to_string(dir.path().join(format!("r1-{name}.json"))).unwrap(),
        )
        .unwrap();
        check(name, &v);
        let s = &v["steps"][0];
        assert!(s["server_cpu_cores"].as_f64().unwrap() > 0.0, "{name}: {s}");
        assert!(stdout.contains(&format!("| {name} | 1 |")), "{stdout}");
    }
    for ratio in ratios {
        assert!(stdout.contains(ratio), "{stdout}");
    }
}

#[test]
fn stock_exchange() {
    let Some(v) = run("stock-exchange", &["--clients", "20"]) else {
        return;
    };
    check("stock-exchange", &v);
    assert!(v["steps"][0]["extra"]["tx_per_s"].as_f64().unwrap() > 0.0);
}

#[test]
fn vbds_images() {
    let Some(v) = run("vbds-images", &["--clients", "2", "--set", "messages=50"]) else {
        return;
    };
    check("vbds-images", &v);
    let e = &v["steps"][0]["extra"];
    assert_eq!(e["images"], 50);
    assert!(e["images_per_s"].as_f64().unwrap() > 0.0);
    assert!(e["mb_per_s"].as_f64().unwrap() > 0.0);
}

/// A step that cannot run (here each subscriber asks for more subscriptions than herald allows,
/// so none is ever ready) ends the sweep: the steps before it are reported, the summary says
/// where and why, and the exit status says the sweep is incomplete.
#[test]
fn a_step_that_cannot_run_stops_the_sweep() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("report.json");
    let mut args = sets(&[
        "duration=1",
        "warmup=0.5",
        "clients=2",
        "topics=2000",
        "rate=2000",
        "ready_timeout=1",
    ]);
    args.extend(["--sweep".into(), "subs_per_client=10,1001".into()]);
    args.extend(["--json".into(), json.display().to_string()]);
    let Some(out) = run_raw("solace-3.1.1-high", &args) else {
        return;
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "an incomplete sweep must fail");
    assert!(
        stderr.contains("the sweep stopped at step 2 of 2")
            && stderr.contains("too_many_subscriptions"),
        "stderr says where and why:\n{stderr}"
    );
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let steps = v["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 1, "the step that ran is reported");
    assert_eq!(steps[0]["subs_per_client"], 10);
    assert!(steps[0]["egress_achieved"].as_f64().unwrap() > 0.0);
    assert_eq!(v["summary"]["stopped_at_step"], 2);
    let why = v["summary"]["stopped_because"].as_str().unwrap();
    assert!(why.contains("only 0 of 2 subscribers were ready"), "{why}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("- stopped_at_step: 2"), "{stdout}");
}

/// herald closing a publisher (here for going over a low per-connection rate limit) is
/// reported with herald's close code and reason, not as the write's broken pipe.
#[test]
fn a_publisher_closed_by_herald_is_reported_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("limits.toml");
    std::fs::write(&config, "[limits]\nmax_messages_per_sec = 500\n").unwrap();
    let mut args = sets(&["duration=2", "warmup=0.5", "clients=2"]);
    args.extend(sets(&["subs_per_client=10", "rate=2000"]));
    args.push("--server-arg=--config".into());
    args.push(format!("--server-arg={}", config.display()));
    let Some(out) = run_raw("solace-3.1.1-high", &args) else {
        return;
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("server closed the publisher connection: 1008 rate limit exceeded"),
        "the close is reported with its reason:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
