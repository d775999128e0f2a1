//! Micro-benchmarks of the fence decision and its building blocks.
//!
//! `cargo bench --bench fence`. A *decision* is what a fenced request costs the
//! store: parse the token header's value, then compare-and-raise the key's mark
//! (the memory store's `advance_now`, the same code the proxy runs). Numbers are
//! only comparable within one run on one machine; see benches/README.md.
//!
//! - `decision/uncontended_one_key`: one thread, one key, equal token (the
//!   common case: one lock holder writing many times). Target: ≥ 20M/s.
//! - `decision/uncontended_1m_keys`: one thread, keys spread over 1M marks, so
//!   most lookups miss the CPU caches.
//! - `decision/contended_one_key/N`: N threads deciding on the same key at once;
//!   throughput is for all threads together.
//! - `token/parse_*`: parsing alone; `token/plain_*`: the plainest strict parser
//!   (a digit check, then `u64::from_str`), run beside it to show whether the
//!   eight-digits-at-a-time parser still pays for its code.
//! - `key_gate/*`: a key's turn (acquire + release).

use std::hint::black_box;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use fencegate::fence::gate::Ask;
use fencegate::fence::store::{Advance, MemoryStore};
use fencegate::fence::token::parse_token;
use fencegate::fence::KeyGate;

/// One fence decision: parse, then compare-and-raise.
fn decide(store: &MemoryStore, key: &str, token: &[u8]) -> Advance {
    match parse_token(token) {
        Ok(token) => store.advance_now(key, token),
        Err(_) => unreachable!("the benchmarks send valid tokens"),
    }
}

/// The plainest strict parser, to weigh `parse_token` against: a digit check,
/// then the standard library.
fn parse_plain(value: &[u8]) -> Option<u64> {
    if value.is_empty() || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(value).ok()?.parse().ok()
}

fn token_parsing(c: &mut Criterion) {
    let mut g = c.benchmark_group("token");
    g.throughput(Throughput::Elements(1));
    for (name, value) in
        [("20_digits", &b"18446744073709551615"[..]), ("13_digits", b"1732957200123"), ("3_digits", b"734")]
    {
        g.bench_function(format!("parse_{name}"), |b| b.iter(|| parse_token(black_box(value))));
        g.bench_function(format!("plain_{name}"), |b| b.iter(|| parse_plain(black_box(value))));
    }
    g.finish();
}

fn decisions(c: &mut Criterion) {
    let mut g = c.benchmark_group("decision");
    g.throughput(Throughput::Elements(1));

    let store = MemoryStore::default();
    g.bench_function("uncontended_one_key", |b| {
        b.iter(|| decide(&store, black_box("/objects/invoice-2026-0001"), black_box(b"1732957200123")))
    });

    let keys: Vec<String> = (0..1_000_000).map(|i| format!("/objects/{i}")).collect();
    for k in &keys {
        store.advance_now(k, 1);
    }
    let mut i = 0usize;
    g.bench_function("uncontended_1m_keys", |b| {
        b.iter(|| {
            // A stride co-prime with 1M walks every key in a cache-hostile order.
            i = (i + 7919) % keys.len();
            decide(&store, black_box(&keys[i]), black_box(b"1"))
        })
    });

    let store = Arc::new(MemoryStore::default());
    for threads in [2, 4] {
        g.bench_with_input(BenchmarkId::new("contended_one_key", threads), &threads, |b, &threads| {
            b.iter_custom(|iters| contended(&store, threads, iters))
        });
    }
    g.finish();
}

/// `iters` decisions on one key split over `threads` threads started together;
/// the time is from the common start until the last thread is done.
fn contended(store: &Arc<MemoryStore>, threads: u64, iters: u64) -> Duration {
    let start = Arc::new(Barrier::new(threads as usize + 1));
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let (store, start) = (store.clone(), start.clone());
            let n = iters / threads + u64::from(t < iters % threads);
            std::thread::spawn(move || {
                start.wait();
                for _ in 0..n {
                    black_box(decide(&store, black_box("/objects/hot"), black_box(b"7")));
                }
            })
        })
        .collect();
    start.wait();
    let began = Instant::now();
    for w in workers {
        w.join().expect("bench thread");
    }
    began.elapsed()
}

fn gate_turn(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    let gate = Arc::new(KeyGate::default());
    // A request's key, made once (by the head checks) and shared by its turn.
    let (key, shared): (Arc<str>, Arc<str>) = ("/objects/a".into(), "/objects/shared".into());
    let mut g = c.benchmark_group("key_gate");
    g.throughput(Throughput::Elements(1));
    g.bench_function("acquire_release_uncontended", |b| {
        b.iter(|| {
            rt.block_on(async {
                let mut turn = gate.acquire(black_box(&key), 7, Ask::Share, Duration::from_secs(1)).await;
                if let Ok(turn) = &mut turn {
                    turn.share();
                }
                drop(turn)
            })
        })
    });
    // The holder's writes sharing a key held by another of them: no wait, no decision.
    let mut holder = rt.block_on(gate.acquire(&shared, 7, Ask::Share, Duration::from_secs(1))).unwrap();
    holder.share();
    g.bench_function("acquire_release_shared", |b| {
        b.iter(|| {
            rt.block_on(async { drop(gate.acquire(black_box(&shared), 7, Ask::Share, Duration::from_secs(1)).await) })
        })
    });
    drop(holder);
    g.finish();
}

criterion_group!(benches, token_parsing, decisions, gate_turn);
criterion_main!(benches);
