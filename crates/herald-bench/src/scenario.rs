//! Scenarios: a TOML file (or flags alone) describing one kind of load, its parameters and
//! the sweeps to run, plus the overrides a command line applies on top.
//!
//! ```toml
//! name = "solace-3.1.1-high"
//! kind = "fanout"                 # fanout | filtering | proxy-latency | stock-exchange | images | conflation
//! seed = "003 §3.1.1, Figure 3-1"
//! description = "…"
//! server_args = []                # extra `herald serve` arguments when --spawn is used
//! server_config = ""              # TOML for the spawned server's --config (e.g. [limits])
//!
//! [params]                        # every field of `Params`; unnamed ones keep their default
//! topics = 10000
//! rate = 5000
//!
//! [[sweep]]                       # zero or more; several form a product (the first is outer)
//! param = "clients"
//! values = [1000, 2000, 3000]
//! single = 1000                   # the value used when the sweep is collapsed (optional)
//! ```
//!
//! Any parameter can be overridden with `--set name=value`; `--clients N` and `--duration SECS`
//! (and overriding a swept parameter) collapse the sweeps into one step.

use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::protocol::Protocol;

/// What a scenario does; each kind has its own runner and table.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// P publishers at a total rate R over T topics; C subscribers with S subscriptions each.
    #[default]
    Fanout,
    /// Fan-out plus extra publish load on topics nobody subscribes to (seed 003 §3.2).
    Filtering,
    /// One publisher, one subscriber, N trials of M messages at an interval or in a burst; the two
    /// legs publish→server and server→subscriber reported separately (seeds 000/002).
    ProxyLatency,
    /// Clients each subscribed to one share; a fraction of them publish an order every interval;
    /// clients added step by step (seed 004).
    StockExchange,
    /// Large binary messages published back to back, each after every subscriber has the
    /// previous one (seed 001, VBDS); optionally with slow subscribers beside.
    Images,
    /// P publishers at a total rate R over T topics; `clients` policy subscribers on the
    /// wildcard with `policy`/`max_rate` (conflation at a bounded rate).
    Conflation,
}

impl Kind {
    pub fn as_str(&self) -> &'static str {
        match self {
            Kind::Fanout => "fanout",
            Kind::Filtering => "filtering",
            Kind::ProxyLatency => "proxy-latency",
            Kind::StockExchange => "stock-exchange",
            Kind::Images => "images",
            Kind::Conflation => "conflation",
        }
    }
}

/// Every parameter of every kind; each kind reads the ones it needs (see docs/bench.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Params {
    /// Subscriber connections (stock exchange: all clients, traders included).
    pub clients: u64,
    /// Topics published to (and subscribed from).
    pub topics: u64,
    /// Subscriptions per subscriber connection.
    pub subs_per_client: u64,
    /// Publisher connections sharing the rate.
    pub publishers: u64,
    /// Total publish rate, msg/s (fan-out and filtering).
    pub rate: f64,
    /// Payload bytes per message (the timestamp and counter are inside it).
    pub payload: u64,
    /// Publish binary frames instead of JSON text.
    pub binary: bool,
    /// Ask herald to stamp its receive time, to split latency into two legs.
    pub stamp: bool,
    /// Topics are `{topic_prefix}/{n}` (or `{topic_prefix}/{topic_names[n]}`).
    pub topic_prefix: String,
    pub topic_names: Vec<String>,
    /// Seconds of load before measuring.
    pub warmup: f64,
    /// Seconds measured.
    pub duration: f64,
    /// New connections per second while connecting.
    pub connect_rate: f64,
    /// Seconds, beyond the time `connect_rate` takes, to wait for every subscriber to be
    /// subscribed; then the step cannot run and the sweep stops there.
    pub ready_timeout: f64,
    /// Longest wait, seconds, for in-flight messages after publishers stop.
    pub drain: f64,
    /// Filtering: extra msg/s on topics nobody subscribes to.
    pub discard_rate: f64,
    /// Filtering: how many such topics (`{discard_prefix}/{n}`).
    pub discard_topics: u64,
    pub discard_prefix: String,
    /// Filtering: publisher connections for the discard load.
    pub discard_publishers: u64,
    /// Filtering: stop the sweep once mean latency exceeds the first step's by this fraction.
    pub max_latency_increase: f64,
    /// Proxy latency / images: messages per trial (per image size).
    pub messages: u64,
    /// Proxy latency: ms between messages; 0 = burst (a send loop).
    pub interval_ms: f64,
    /// Proxy latency: trials per setting.
    pub trials: u64,
    /// Proxy latency: the text each message carries (after the timestamp).
    pub text: String,
    /// Proxy latency: seconds to wait for the last messages of a trial.
    pub trial_timeout: f64,
    /// Stock exchange: fraction of clients that trade.
    pub trader_fraction: f64,
    /// Stock exchange: ms between one trader's orders.
    pub order_interval_ms: f64,
    /// Stock exchange: seconds between log lines.
    pub report_every: f64,
    /// Images: image side in pixels (the image is side² × bytes_per_pixel bytes).
    pub image_side: u64,
    pub bytes_per_pixel: u64,
    /// Images: slow subscribers beside the fast ones, each on a thread of its own, reading at
    /// most `read_rate` images per second with `policy` (herald skips images for them).
    pub slow_clients: u64,
    pub read_rate: f64,
    /// The policy subscribers' `policy` (images' slow subscribers, conflation's subscribers);
    /// empty: the topic's configured default.
    pub policy: String,
    /// Their `max_rate` (`conflate`: messages per second per topic; 0: none).
    pub max_rate: f64,
    /// Connections per bench process before it spreads subscribers over worker processes.
    pub max_conns_per_process: u64,
    /// Event-loop threads per bench process for subscribers (1 = one core).
    pub bench_threads: u64,
    /// The protocol the clients speak: `native`, `mqtt` or `stomp` (fan-out, filtering and
    /// proxy latency; the other kinds use herald's own features and speak native).
    pub protocol: Protocol,
    /// The publishers' protocol when it differs from the subscribers'; empty: `protocol`.
    pub pub_protocol: String,
    /// MQTT: the QoS of publishes and subscriptions, 0 or 1.
    pub mqtt_qos: u8,
}

impl Default for Params {
    fn default() -> Params {
        Params {
            clients: 100,
            topics: 1000,
            subs_per_client: 10,
            publishers: 1,
            rate: 1000.0,
            payload: 50,
            binary: false,
            stamp: true,
            topic_prefix: "t".into(),
            topic_names: vec![],
            warmup: 2.0,
            duration: 10.0,
            connect_rate: 2000.0,
            ready_timeout: 30.0,
            drain: 3.0,
            discard_rate: 0.0,
            discard_topics: 100_000,
            discard_prefix: "nobody".into(),
            discard_publishers: 1,
            max_latency_increase: 0.2,
            messages: 1000,
            interval_ms: 10.0,
            trials: 60,
            text: "Hello World!".into(),
            trial_timeout: 5.0,
            trader_fraction: 0.1,
            order_interval_ms: 1.0,
            report_every: 2.0,
            image_side: 1024,
            bytes_per_pixel: 2,
            slow_clients: 0,
            read_rate: 4.0,
            policy: String::new(),
            max_rate: 0.0,
            max_conns_per_process: 19_000,
            bench_threads: 1,
            protocol: Protocol::Native,
            pub_protocol: String::new(),
            mqtt_qos: 0,
        }
    }
}

impl Params {
    /// Sets one parameter by name from a TOML value (how sweeps and `--set` work).
    pub fn set(&mut self, name: &str, value: toml::Value) -> Result<()> {
        let mut table = toml::Value::try_from(&*self)?;
        let t = table.as_table_mut().expect("params serialise to a table");
        let Some(old) = t.get(name) else {
            bail!(
                "unknown parameter {name:?}; known parameters: {}",
                t.keys().cloned().collect::<Vec<_>>().join(", ")
            );
        };
        // Let integers stand for floats (rate = 5000) and vice versa when whole (clients = 1e3).
        let value = match (old, value) {
            (toml::Value::Float(_), toml::Value::Integer(i)) => toml::Value::Float(i as f64),
            (toml::Value::Integer(_), toml::Value::Float(f)) if f.fract() == 0.0 => {
                toml::Value::Integer(f as i64)
            }
            (_, v) => v,
        };
        t.insert(name.to_string(), value.clone());
        *self = table
            .try_into()
            .with_context(|| format!("parameter {name} cannot be {value}"))?;
        Ok(())
    }

    /// The name of topic `n`.
    pub fn topic(&self, n: u64) -> String {
        match self.topic_names.get(n as usize) {
            Some(name) => format!("{}/{}", self.topic_prefix, name),
            None => format!("{}/{}", self.topic_prefix, n),
        }
    }

    /// Number of topics actually used (the names list wins when given).
    pub fn topic_count(&self) -> u64 {
        if self.topic_names.is_empty() {
            self.topics.max(1)
        } else {
            self.topic_names.len() as u64
        }
    }

    /// The publishers' protocol: `pub_protocol`, or `protocol` when that is empty.
    pub fn publisher_protocol(&self) -> Result<Protocol> {
        match self.pub_protocol.as_str() {
            "" => Ok(self.protocol),
            p => p.parse().context("pub_protocol"),
        }
    }

    pub fn image_bytes(&self) -> u64 {
        self.image_side * self.image_side * self.bytes_per_pixel
    }

    pub fn validate(&self, kind: Kind) -> Result<()> {
        if self.duration <= 0.0 && !matches!(kind, Kind::ProxyLatency | Kind::Images) {
            bail!("duration must be > 0 seconds (got {})", self.duration);
        }
        if matches!(kind, Kind::Fanout | Kind::Filtering | Kind::Conflation) && self.rate <= 0.0 {
            bail!("rate must be > 0 msg/s (got {})", self.rate);
        }
        if self.connect_rate <= 0.0 {
            bail!("connect_rate must be > 0 connections/s");
        }
        if self.ready_timeout.is_nan() || self.ready_timeout < 0.0 {
            bail!("ready_timeout must be ≥ 0 seconds");
        }
        if self.publishers == 0 {
            bail!("publishers must be at least 1");
        }
        let publishers = self.publisher_protocol()?;
        let native = Protocol::Native;
        let protocols = [self.protocol, publishers];
        if protocols != [native; 2]
            && !matches!(kind, Kind::Fanout | Kind::Filtering | Kind::ProxyLatency)
        {
            bail!(
                "{} scenarios speak herald's native protocol only (protocol {}, pub_protocol {})",
                kind.as_str(),
                self.protocol.as_str(),
                publishers.as_str()
            );
        }
        if self.binary && protocols != [native; 2] {
            bail!("binary applies to native clients only: MQTT and STOMP carry the text payload");
        }
        if self.mqtt_qos > 1 {
            bail!("mqtt_qos must be 0 or 1 (got {})", self.mqtt_qos);
        }
        Ok(())
    }
}

/// One swept parameter.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sweep {
    pub param: String,
    pub values: Vec<toml::Value>,
    /// The value used when the sweep is collapsed to one step (default: the first value).
    #[serde(default)]
    pub single: Option<toml::Value>,
}

/// A scenario file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    #[serde(default = "default_name")]
    pub name: String,
    pub kind: Kind,
    /// Which seed table it reproduces.
    #[serde(default)]
    pub seed: String,
    #[serde(default)]
    pub description: String,
    /// Extra arguments for `herald serve` when the bench spawns the server.
    #[serde(default)]
    pub server_args: Vec<String>,
    /// A configuration file's text for the spawned server (`--config`), for what has no flag:
    /// e.g. `[limits]`, whose per-connection rates a benchmark's publisher exceeds on purpose.
    #[serde(default)]
    pub server_config: String,
    #[serde(default)]
    pub params: Params,
    #[serde(default)]
    pub sweep: Vec<Sweep>,
}

fn default_name() -> String {
    "adhoc".into()
}

impl Scenario {
    pub fn load(path: &Path) -> Result<Scenario> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read scenario file {}", path.display()))?;
        Scenario::parse(&text).with_context(|| format!("in scenario file {}", path.display()))
    }

    pub fn parse(text: &str) -> Result<Scenario> {
        let s: Scenario = toml::from_str(text)?;
        for sw in &s.sweep {
            if sw.values.is_empty() {
                bail!("sweep over {:?} has no values", sw.param);
            }
            // Fail early on a misspelt parameter or a value of the wrong type.
            let mut p = s.params.clone();
            for v in &sw.values {
                p.set(&sw.param, v.clone())?;
            }
        }
        Ok(s)
    }

    /// A scenario from flags alone.
    pub fn adhoc(kind: Kind) -> Scenario {
        Scenario {
            name: format!("adhoc-{}", kind.as_str()),
            kind,
            seed: String::new(),
            description: "built from command-line flags".into(),
            server_args: vec![],
            server_config: String::new(),
            params: Params::default(),
            sweep: vec![],
        }
    }

    /// Expands the sweeps into steps, applying `overrides` to every step. When `collapse` is set,
    /// or an override names a swept parameter, the sweeps become one step.
    pub fn steps(&self, overrides: &[(String, toml::Value)], collapse: bool) -> Result<Vec<Step>> {
        let collapse = collapse
            || self
                .sweep
                .iter()
                .any(|s| overrides.iter().any(|(k, _)| *k == s.param));
        let mut combos: Vec<Vec<(String, toml::Value)>> = vec![vec![]];
        for sw in &self.sweep {
            let values: Vec<toml::Value> = if collapse {
                vec![sw.single.clone().unwrap_or_else(|| sw.values[0].clone())]
            } else {
                sw.values.clone()
            };
            combos = combos
                .into_iter()
                .flat_map(|c| {
                    values.iter().map(move |v| {
                        let mut c = c.clone();
                        c.push((sw.param.clone(), v.clone()));
                        c
                    })
                })
                .collect();
        }
        combos
            .into_iter()
            .map(|combo| {
                let mut p = self.params.clone();
                for (k, v) in &combo {
                    p.set(k, v.clone())?;
                }
                for (k, v) in overrides {
                    p.set(k, v.clone())?;
                }
                p.validate(self.kind)?;
                let swept = combo
                    .iter()
                    .map(|(k, _)| {
                        let v = toml::Value::try_from(&p)
                            .ok()
                            .and_then(|t| t.get(k).cloned());
                        (
                            k.clone(),
                            v.map(toml_to_json).unwrap_or(serde_json::Value::Null),
                        )
                    })
                    .collect();
                Ok(Step { params: p, swept })
            })
            .collect()
    }
}

/// One step of a run: the parameters, and the swept ones by name (for the report).
#[derive(Debug, Clone)]
pub struct Step {
    pub params: Params,
    pub swept: Vec<(String, serde_json::Value)>,
}

pub fn toml_to_json(v: toml::Value) -> serde_json::Value {
    serde_json::to_value(v).unwrap_or(serde_json::Value::Null)
}

/// Parses `name=value` (`--set`): the value as a TOML literal, else as a string.
pub fn parse_assignment(s: &str) -> Result<(String, toml::Value)> {
    let (k, v) = s
        .split_once('=')
        .with_context(|| format!("expected name=value, got {s:?}"))?;
    Ok((k.trim().to_string(), parse_value(v.trim())))
}

/// A TOML literal (`5000`, `1.5`, `true`, `["a","b"]`), else a plain string.
pub fn parse_value(v: &str) -> toml::Value {
    #[derive(Deserialize)]
    struct W {
        v: toml::Value,
    }
    match toml::from_str::<W>(&format!("v = {v}")) {
        Ok(w) => w.v,
        Err(_) => toml::Value::String(v.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"
name = "t"
kind = "fanout"
[params]
topics = 10000
rate = 5000
[[sweep]]
param = "payload"
values = [1024, 2048]
[[sweep]]
param = "clients"
values = [1000, 2000, 3000]
"#;

    #[test]
    fn sweeps_form_a_product_outer_first() {
        let s = Scenario::parse(FILE).unwrap();
        let steps = s.steps(&[], false).unwrap();
        assert_eq!(steps.len(), 6);
        assert_eq!(steps[0].params.payload, 1024);
        assert_eq!(steps[2].params.clients, 3000);
        assert_eq!(steps[3].params.payload, 2048);
        assert_eq!(steps[3].params.clients, 1000);
        assert_eq!(steps[4].swept[1].0, "clients");
        assert_eq!(steps[4].swept[1].1, serde_json::json!(2000));
        assert_eq!(steps[0].params.rate, 5000.0);
    }

    #[test]
    fn clients_override_collapses_to_one_step() {
        let s = Scenario::parse(FILE).unwrap();
        let ov = vec![("clients".to_string(), toml::Value::Integer(10))];
        let steps = s.steps(&ov, false).unwrap();
        assert_eq!(steps.len(), 1);
        assert_eq!(steps[0].params.clients, 10);
        assert_eq!(steps[0].params.payload, 1024);
        let steps = s
            .steps(&[parse_assignment("duration=2").unwrap()], true)
            .unwrap();
        assert_eq!(steps.len(), 1);
        assert_eq!(steps[0].params.duration, 2.0);
    }

    #[test]
    fn set_checks_names_and_types() {
        let mut p = Params::default();
        p.set("rate", toml::Value::Integer(20000)).unwrap();
        assert_eq!(p.rate, 20000.0);
        p.set("clients", toml::Value::Float(3000.0)).unwrap();
        assert_eq!(p.clients, 3000);
        assert!(p.set("rat", toml::Value::Integer(1)).is_err());
        assert!(p.set("binary", toml::Value::Integer(1)).is_err());
        assert_eq!(parse_value("true"), toml::Value::Boolean(true));
        assert_eq!(parse_value("abc"), toml::Value::String("abc".into()));
        assert!(
            Scenario::parse("kind = \"fanout\"\n[[sweep]]\nparam = \"nope\"\nvalues = [1]")
                .is_err()
        );
    }

    #[test]
    fn protocols_are_checked() {
        let mut p = Params::default();
        assert_eq!(p.publisher_protocol().unwrap(), Protocol::Native);
        p.set("protocol", parse_value("mqtt")).unwrap();
        assert_eq!(p.publisher_protocol().unwrap(), Protocol::Mqtt);
        p.set("pub_protocol", parse_value("native")).unwrap();
        assert_eq!(p.publisher_protocol().unwrap(), Protocol::Native);
        p.validate(Kind::Fanout).unwrap();
        assert!(
            p.validate(Kind::Images).is_err(),
            "images speak native only"
        );
        assert!(p.set("protocol", parse_value("amqp")).is_err());
        p.set("pub_protocol", parse_value("amqp")).unwrap();
        assert!(p.validate(Kind::Fanout).is_err());
        p.set("pub_protocol", parse_value("native")).unwrap();
        p.binary = true;
        assert!(p.validate(Kind::Fanout).is_err(), "binary is native's");
        p.binary = false;
        p.set("mqtt_qos", parse_value("2")).unwrap();
        assert!(p.validate(Kind::Fanout).is_err(), "QoS 2 is not offered");
    }

    #[test]
    fn topic_names() {
        let mut p = Params::default();
        assert_eq!(p.topic(7), "t/7");
        p.topic_prefix = "shares".into();
        p.topic_names = vec!["NFLX".into(), "TSLA".into()];
        assert_eq!(p.topic(1), "shares/TSLA");
        assert_eq!(p.topic_count(), 2);
    }

    #[test]
    fn shipped_scenarios_parse() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/scenarios");
        let mut n = 0;
        for e in std::fs::read_dir(&dir).unwrap() {
            let path = e.unwrap().path();
            if path.extension().is_some_and(|x| x == "toml") {
                let s = Scenario::load(&path).unwrap();
                assert!(!s.seed.is_empty(), "{} names no seed table", path.display());
                assert!(!s.steps(&[], false).unwrap().is_empty());
                n += 1;
            }
        }
        assert!(
            n >= 9,
            "expected the 7 seed scenarios and the 2 slow-consumer ones, found {n}"
        );
    }
}
