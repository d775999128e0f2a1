//! Micro-benchmarks of the fence decision's building blocks.
//!
//! `cargo bench --bench fence`. Numbers are only comparable within one run on
//! one machine; see benches/README.md.

use std::sync::Arc;
use std::time::Duration;

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use fencegate::fence::store::MemoryStore;
use fencegate::fence::token::parse_token;
use fencegate::fence::KeyGate;

fn token_parsing(c: &mut Criterion) {
    let mut g = c.benchmark_group("token");
    g.throughput(Throughput::Elements(1));
    g.bench_function("parse_20_digits", |b| b.iter(|| parse_token(black_box(b"18446744073709551615"))));
    g.bench_function("parse_3_digits", |b| b.iter(|| parse_token(black_box(b"734"))));
    g.finish();
}

fn store_advance(c: &mut Criterion) {
    let mut g = c.benchmark_group("memory_store");
    g.throughput(Throughput::Elements(1));
    let store = MemoryStore::default();
    g.bench_function("advance_equal_token_one_key", |b| b.iter(|| store.advance_now(black_box("/objects/a"), 7)));
    let keys: Vec<String> = (0..1_000_000).map(|i| format!("/objects/{i}")).collect();
    for k in &keys {
        store.advance_now(k, 1);
    }
    let mut i = 0usize;
    g.bench_function("advance_1m_keys", |b| {
        b.iter(|| {
            i = (i + 7919) % keys.len();
            store.advance_now(black_box(&keys[i]), 1)
        })
    });
    g.finish();
}

fn gate_turn(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    let gate = Arc::new(KeyGate::default());
    let mut g = c.benchmark_group("key_gate");
    g.throughput(Throughput::Elements(1));
    g.bench_function("acquire_release_uncontended", |b| {
        b.iter(|| rt.block_on(async { drop(gate.acquire(black_box("/objects/a"), Duration::from_secs(1)).await) }))
    });
    g.finish();
}

criterion_group!(benches, token_parsing, store_advance, gate_turn);
criterion_main!(benches);
