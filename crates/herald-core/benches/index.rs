//! The subscription index at the scale of a trading front end: 1,000 clients with
//! 100 subscriptions each over 20,000 topics, plus some `*` and `>` patterns.
//!
//! `cargo bench -p herald-core --bench index -- --warm-up-time 1 --measurement-time 3`

use criterion::{black_box, criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use herald_core::index::SubscriptionIndex;

const VENUES: u32 = 20;
const SYMBOLS: u32 = 1_000; // 20 venues × 1,000 symbols = 20,000 topics
const CLIENTS: u32 = 1_000;
const SUBS_PER_CLIENT: u32 = 100;
/// Topics probed per iteration; cycling through many keeps the bench from timing one hot path.
const PROBES: usize = 1_024;

/// A fixed-seed xorshift, so every run builds the same index without a `rand` dependency.
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u32) -> u32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % u64::from(n)) as u32
    }
}

fn topic(venue: u32, symbol: u32) -> String {
    format!("md/v{venue}/s{symbol}")
}

struct Fixture {
    index: SubscriptionIndex<u32>,
    entries: usize,
    subscribed: Vec<String>,
    unsubscribed: Vec<String>,
}

fn fixture() -> Fixture {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut index = SubscriptionIndex::new();
    let mut subscribed = Vec::new();
    for client in 0..CLIENTS {
        let mut n = 0;
        while n < SUBS_PER_CLIENT {
            let t = topic(rng.below(VENUES), rng.below(SYMBOLS));
            if index.insert(&t, client) {
                n += 1;
                if subscribed.len() < PROBES && rng.below(50) == 0 {
                    subscribed.push(t);
                }
            }
        }
    }
    // Wildcards: 100 clients follow one symbol on every venue; 20 follow a whole venue, but
    // only venues 0..10, so venues 10..20 have no `>` subscriber.
    for client in 0..100 {
        index.insert(&format!("md/*/s{}", rng.below(SYMBOLS)), client);
    }
    for client in 0..20 {
        index.insert(&format!("md/v{}/>", client % 10), client);
    }
    while subscribed.len() < PROBES {
        subscribed.push(subscribed[subscribed.len() % 64].clone());
    }
    // Topics nobody wants: half with an unknown first level (rejected at the root), half on a
    // known venue with an unknown symbol (walks the literal path and the `*` branch to the end).
    let unsubscribed = (0..PROBES as u32)
        .map(|i| {
            if i % 2 == 0 {
                format!("news/n{}/x{i}", i % 7)
            } else {
                format!("md/v{}/unknown{i}", 10 + i % 10)
            }
        })
        .collect();
    let entries = index.len();
    Fixture {
        index,
        entries,
        subscribed,
        unsubscribed,
    }
}

fn lookups(c: &mut Criterion) {
    let fx = fixture();
    let mut total = 0usize;
    for t in &fx.subscribed {
        fx.index.for_each_match(t, |_| total += 1);
    }
    for t in &fx.unsubscribed {
        fx.index
            .for_each_match(t, |_| panic!("{t} should match nothing"));
    }
    eprintln!(
        "index: {} entries; subscribed probes match {:.1} keys on average",
        fx.entries,
        total as f64 / fx.subscribed.len() as f64
    );

    let mut g = c.benchmark_group("for_each_match");
    g.throughput(Throughput::Elements(PROBES as u64));
    for (name, probes) in [
        ("subscribed", &fx.subscribed),
        ("unsubscribed", &fx.unsubscribed),
    ] {
        g.bench_function(name, |b| {
            b.iter(|| {
                let mut sum = 0u32;
                for t in probes {
                    fx.index
                        .for_each_match(black_box(t), |k| sum = sum.wrapping_add(k));
                }
                sum
            })
        });
    }
    g.finish();
}

fn updates(c: &mut Criterion) {
    let mut fx = fixture();
    // 1,000 distinct patterns: existing topics (the trie path is shared), new topics (a node
    // is created and pruned again), and wildcard patterns.
    let patterns: Vec<String> = (0..SYMBOLS)
        .map(|i| match i % 4 {
            0 | 1 => topic(i % VENUES, i),
            2 => format!("md/v{}/new{i}", i % VENUES),
            _ => format!("md/*/s{i}/>"),
        })
        .collect();
    let mut g = c.benchmark_group("update");
    g.throughput(Throughput::Elements(patterns.len() as u64));
    g.bench_function("insert_then_remove", |b| {
        b.iter(|| {
            for p in &patterns {
                assert!(fx.index.insert(black_box(p), CLIENTS + 1));
            }
            for p in &patterns {
                assert!(fx.index.remove(black_box(p), CLIENTS + 1));
            }
        })
    });
    g.finish();
    assert_eq!(fx.index.len(), fx.entries);

    let mut g = c.benchmark_group("build");
    g.sample_size(10);
    g.bench_function("100k_subscriptions", |b| {
        b.iter_batched(|| (), |()| fixture().index, BatchSize::PerIteration)
    });
    g.finish();
}

criterion_group!(benches, lookups, updates);
criterion_main!(benches);
