//! Criterion benches of the protocol core's hot paths; see the `tela-benches` crate docs.

use criterion::{black_box, criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion, Throughput};
use std::sync::Arc;
use std::time::Duration;
use tela_benches::{model_name, record, registry, registry_record};
use tela_core::harness::wire::{self, Builder};
use tela_core::{Identity, Lifecycle, Model, ModelSet, Record, Time, Verifier, MAX_DATAGRAM};

/// Nodes in the registry of the merge and lookup benches.
const NODES: u64 = 10_000;

fn merge(c: &mut Criterion) {
    let mut group = c.benchmark_group("merge");
    group.throughput(Throughput::Elements(1));

    // A heartbeat advance of one known node, round-robin over the registry so that every merge
    // moves a record forward (nothing is a duplicate) and touches a different slot.
    let mut replica = registry(NODES, 2);
    let base: Vec<Record> = (1..=NODES).map(|n| registry_record(n, 2)).collect();
    let mut next = 0u64;
    let advance = |next: &mut u64| {
        let i = (*next % NODES) as usize;
        let round = 1 + *next / NODES;
        *next += 1;
        let mut r = base[i].clone();
        r.heartbeat += round;
        Arc::new(r)
    };
    let mut now = Time(1);
    let first = replica.merge(now, advance(&mut next));
    assert!(first.changed && !first.new_node && first.routable.is_none());
    group.bench_function("replica_heartbeat_advance_10k", |b| {
        b.iter_batched(
            || advance(&mut next),
            |incoming| {
                now = Time(now.0 + 1);
                replica.merge(now, incoming)
            },
            BatchSize::SmallInput,
        )
    });

    // Two versions of one generation, so the join compares the owner's versions whole (the
    // higher heartbeat wins) rather than taking the newer generation.
    let mut a = record(42, &[&model_name(1), &model_name(2)]);
    let mut b = a.clone();
    a.heartbeat += 5;
    b.state = Lifecycle::Down;
    b.models = ModelSet::from_models(vec![Model::named(model_name(3))]).union(&a.models);
    group.bench_function("record_join_same_generation", |bench| bench.iter(|| black_box(&a).join(black_box(&b))));
    group.finish();
}

/// Fills a builder with items taken round-robin from `items` until the next one does not fit.
fn fill<T: wire::WireItem>(items: &[T]) -> Builder<T> {
    let mut builder = Builder::new(MAX_DATAGRAM);
    for item in items.iter().cycle() {
        if !builder.push(item) {
            break;
        }
    }
    builder
}

/// Items in, and length of, a full datagram of `items`; checks that it decodes.
fn full_datagram<T: wire::WireItem>(items: &[T]) -> (usize, usize) {
    let builder = fill(items);
    let count = builder.len();
    let datagram = builder.finish();
    assert!(count > 1 && datagram.len() <= MAX_DATAGRAM);
    assert!(wire::decode(&datagram).is_ok(), "a full datagram must decode");
    (count, datagram.len())
}

fn datagram(c: &mut Criterion) {
    let mut group = c.benchmark_group("datagram");

    let records: Vec<Record> = (1..=64).map(|n| record(n, &[&model_name(n), &model_name(n + 1)])).collect();
    let (count, bytes) = full_datagram(&records);
    group.throughput(Throughput::Bytes(bytes as u64));
    group.bench_function(BenchmarkId::new("records_encode_decode", format!("{count}x{bytes}B")), |b| {
        b.iter(|| {
            let datagram = fill(black_box(&records)).finish();
            wire::decode(&datagram)
        })
    });

    group.finish();
}

fn lookup(c: &mut Criterion) {
    let mut group = c.benchmark_group("lookup");
    group.throughput(Throughput::Elements(1));
    let replica = registry(NODES, 1);
    let hosted = model_name(7);
    let hosts = replica.serving(&hosted).len();
    assert!(hosts > 400, "only {hosts} hosts of {hosted}");
    group.bench_function(format!("serving_{hosts}_hosts_of_10k"), |b| {
        b.iter(|| replica.serving(black_box(&hosted)).len())
    });
    group.bench_function("serving_absent_model_10k", |b| {
        b.iter(|| replica.serving(black_box("org-99/absent-70b")).len())
    });
    group.finish();
}

/// What signing costs an owner on every change of its record, and checking costs a receiver on
/// every record that is news to it: a realistic record, a production (SHA-256-bound) key.
fn auth(c: &mut Criterion) {
    let mut group = c.benchmark_group("auth");
    let owner = Identity::from_secret(&[7; 32]);
    let mut r = record(42, &[&model_name(1), &model_name(2)]);
    r.id = owner.id();
    owner.seal(&mut r);
    group.bench_function("seal_record", |b| {
        b.iter_batched(|| r.clone(), |mut r| owner.seal(black_box(&mut r)), BatchSize::SmallInput)
    });
    let verifier = Verifier::strict();
    group.bench_function("check_record", |b| b.iter(|| verifier.check(black_box(&r))));
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(30)
        .warm_up_time(Duration::from_millis(700))
        .measurement_time(Duration::from_secs(2));
    targets = merge, datagram, lookup, auth
}
criterion_main!(benches);
