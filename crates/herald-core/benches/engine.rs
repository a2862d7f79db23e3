//! A publish on a topic nobody subscribes to (a discard): the topic found
//! (or made, the first time), its message kept as the last value, the previous one let go.
//! The topics keep no history, as the filtering scenario's unsubscribed topics
//! (bench/scenarios/solace-3.2-filtering.toml). Over 1,000 topics all of that stays in the
//! cache; over 100,000 (the filtering scenario's) each publish meets its topic's entry and
//! state cold, as herald does under that load. The difference between the two is what the
//! cache misses cost.
//!
//! `cargo bench -p herald-core --bench engine -- --warm-up-time 1 --measurement-time 3`

use bytes::Bytes;
use compact_str::CompactString;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use herald_core::engine::{Engine, EngineConfig, HistoryRule, Outbox};
use herald_core::message::Message;
use herald_core::outbox::Delivery;
use herald_core::reply::{DropReason, Reply};
use herald_core::request::{PayloadKind, Publish};

/// herald's allocator for the small blocks a publish makes (crates/herald/src/allocator.rs).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Nobody is subscribed: nothing is ever sent.
struct Nobody;

impl Outbox for Nobody {
    fn reply(&self, _: &Reply) {}
    fn dropped(&self, _: &str, _: u64, _: DropReason) {}
    fn deliver(&self, _: &Message, _: &Delivery) {}
    fn recovered(&self, _: &Message) {}
    fn snapshot(&self, _: &str, _: usize) {}
}

/// The payload's size in the Solace scenarios.
const PAYLOAD: usize = 50;
/// Payloads per shared buffer: in herald a publish's payload is a slice of the read that
/// brought it (16 KiB, a few hundred publishes), counted on that buffer while the publish is
/// handled; the engine keeps a copy, not the slice.
const PER_READ: usize = 256;

fn discards(c: &mut Criterion) {
    let mut g = c.benchmark_group("discard");
    g.throughput(Throughput::Elements(1));
    for topics in [1_000usize, 100_000] {
        let names: Vec<CompactString> = (0..topics)
            .map(|i| CompactString::from(format!("nobody/{i}")))
            .collect();
        let config = EngineConfig {
            history: vec![HistoryRule::last_value_only(">")],
            ..EngineConfig::default()
        };
        let mut engine = Engine::<Nobody>::new(config, 1);
        let mut read = Bytes::new();
        let mut n = 0usize;
        let mut publish = |engine: &mut Engine<Nobody>| {
            let k = n % PER_READ;
            if k == 0 {
                read = Bytes::from(vec![b'x'; PAYLOAD * PER_READ]);
            }
            let p = Publish {
                id: None,
                topic: names[n % topics].clone(),
                payload: read.slice(k * PAYLOAD..(k + 1) * PAYLOAD),
                kind: PayloadKind::Text,
                content_type: None,
                stamp: true,
                extras: None,
            };
            n += 1;
            engine.publish(&p, n as u64).expect("a valid publish");
        };
        // Every topic made and holding a last value before the clock starts.
        for _ in 0..topics {
            publish(&mut engine);
        }
        g.bench_function(format!("{topics}_topics"), |b| {
            b.iter(|| publish(&mut engine))
        });
    }
    g.finish();
}

criterion_group!(benches, discards);
criterion_main!(benches);
