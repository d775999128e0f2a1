//! The atomicity invariant, end to end: for one key, fenced requests reach the
//! upstream one at a time in non-decreasing token order; different keys never
//! wait on each other; stale tokens are refused without queueing.
//!
//! The recording upstream is the witness: it records what it applied, in which
//! order, and whether two writes to one key were ever in flight together. The
//! tests hold a write there while they look at what happens meanwhile, then
//! release it: they wait on events, never on a sleep being long enough.
//!
//! The randomized test logs its seed; `FENCEGATE_TEST_SEED=<seed>` replays the
//! same random choices (the interleaving of the writers still varies).

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

async fn setup() -> (RecordingUpstream, Proxy) {
    let up = RecordingUpstream::start().await;
    let proxy = Proxy::start(&route("objects", "/objects/", &up, "")).await;
    (up, proxy)
}

/// `PUT url` with `token`, in a task of its own.
fn spawn_put(url: String, token: u64) -> tokio::task::JoinHandle<Reply> {
    tokio::spawn(async move { put(&url, token, "x").await })
}

#[tokio::test]
async fn a_held_write_is_not_overtaken_and_other_keys_are_not_delayed() {
    let (up, proxy) = setup().await;
    let gate = up.hold("/objects/k");
    let first = spawn_put(proxy.url("/objects/k"), 1);
    gate.wait_arrived().await;

    // Token 2 for the same key must wait for token 1's response.
    let second = spawn_put(proxy.url("/objects/k"), 2);
    proxy.wait_metric("fencegate_waiting_requests", 1.0).await;

    // Another key goes straight through while "k" is busy.
    assert_eq!(put(&proxy.url("/objects/other"), 1, "o").await.status, 200);
    assert!(up.applied_for("/objects/k").is_empty(), "the held write was applied before its release");
    assert_eq!(up.in_flight("/objects/k"), 1, "token 2 reached the upstream while token 1 was held");

    gate.release();
    assert_eq!(first.await.unwrap().status, 200);
    assert_eq!(second.await.unwrap().status, 200);
    let k = up.applied_for("/objects/k");
    assert_eq!(k.iter().map(|a| a.token.clone().unwrap()).collect::<Vec<_>>(), ["1", "2"]);
    assert!(k[1].started >= k[0].ended, "token 2 reached the upstream before token 1 was done");
    let other = &up.applied_for("/objects/other")[0];
    assert!(other.ended < k[0].ended, "the other key waited for the slow one");
    assert!(up.overlaps().is_empty());
}

#[tokio::test]
async fn a_stale_token_is_refused_at_once_without_queueing() {
    let (up, proxy) = setup().await;
    assert_eq!(put(&proxy.url("/objects/k"), 5, "").await.status, 200);
    let gate = up.hold("/objects/k");
    let held = spawn_put(proxy.url("/objects/k"), 6);
    gate.wait_arrived().await;

    let r = put(&proxy.url("/objects/k"), 4, "").await;
    r.problem(409);
    // Answered while the held write was still in flight: it never queued.
    assert_eq!(up.in_flight("/objects/k"), 1);
    assert_eq!(up.applied_for("/objects/k").len(), 1);
    gate.release();
    assert_eq!(held.await.unwrap().status, 200);
}

#[tokio::test]
async fn a_queued_token_is_checked_again_when_its_turn_comes() {
    let (up, proxy) = setup().await;
    let gate = up.hold("/objects/k");
    let first = spawn_put(proxy.url("/objects/k"), 1);
    gate.wait_arrived().await;
    // Token 3 queues first; token 2 passes the early check (mark is 1) and
    // queues behind it. When its turn comes the mark is 3: it must lose.
    let three = spawn_put(proxy.url("/objects/k"), 3);
    proxy.wait_metric("fencegate_waiting_requests", 1.0).await;
    let two = spawn_put(proxy.url("/objects/k"), 2);
    proxy.wait_metric("fencegate_waiting_requests", 2.0).await;

    gate.release();
    assert_eq!(first.await.unwrap().status, 200);
    assert_eq!(three.await.unwrap().status, 200);
    let r = two.await.unwrap();
    let p = r.problem(409);
    assert_eq!(p["current"], 3);
    let tokens: Vec<_> = up.applied_for("/objects/k").into_iter().map(|a| a.token.unwrap()).collect();
    assert_eq!(tokens, ["1", "3"]);
}

#[tokio::test]
async fn keys_written_once_leave_no_queue_behind() {
    let (_up, proxy) = setup().await;
    let mut tasks = Vec::new();
    for w in 0..8 {
        let base = proxy.url("/objects/");
        tasks.push(tokio::spawn(async move {
            for i in 0..250 {
                assert_eq!(put(&format!("{base}w{w}-{i}"), 1, "").await.status, 200);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(proxy.metric("fencegate_tracked_keys").await, Some(2000.0));
    assert_eq!(proxy.metric("fencegate_active_keys").await, Some(0.0));
    assert_eq!(proxy.metric("fencegate_waiting_requests").await, Some(0.0));
}

/// What one client saw.
#[derive(Debug)]
struct Outcome {
    key: String,
    token: u64,
    status: u16,
    current: Option<u64>,
}

/// Many keys, many concurrent writers, lock holders that pause and come back
/// with old tokens. Whatever the interleaving, the upstream's history must show
/// per key non-decreasing tokens and no overlapping writes, and every 409 must
/// have been really stale.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn randomized_writers_never_break_the_invariants() {
    const KEYS: usize = 6;
    const WRITERS: usize = 24;
    const ROUNDS: usize = 40;
    let seed = test_seed();
    let (up, proxy) = setup().await;
    // The lock service: each key's token grows with every new owner.
    let epochs: Arc<Vec<AtomicU64>> = Arc::new((0..KEYS).map(|_| AtomicU64::new(0)).collect());

    let mut writers = Vec::new();
    for writer in 0..WRITERS {
        let (epochs, base) = (epochs.clone(), proxy.url("/objects/"));
        // One generator per writer, so each writer's choices replay from the seed.
        let mut rng = StdRng::seed_from_u64(seed.wrapping_add(writer as u64));
        writers.push(tokio::spawn(async move {
            let mut seen = Vec::new();
            let mut held: Option<(usize, u64)> = None;
            for _ in 0..ROUNDS {
                let (key, token, slow, pause) = {
                    // Mostly take the lock anew; sometimes keep writing with the
                    // token held since before a pause, which may be stale by now.
                    let (key, token) = match held {
                        Some(h) if rng.gen_bool(0.4) => h,
                        _ => {
                            let key = rng.gen_range(0..KEYS);
                            (key, epochs[key].fetch_add(1, Ordering::SeqCst) + 1)
                        }
                    };
                    (key, token, rng.gen_range(0..4u64), rng.gen_range(0..6u64))
                };
                held = Some((key, token));
                tokio::time::sleep(Duration::from_millis(pause)).await;
                let path = format!("{base}k{key}");
                let r = send(
                    "PUT",
                    &path,
                    &[("x-fencing-token", &token.to_string()), ("x-slow-ms", &slow.to_string())],
                    "w",
                )
                .await;
                let current = r.header("x-fencing-token-current").map(|c| c.parse().unwrap());
                seen.push(Outcome { key: format!("/objects/k{key}"), token, status: r.status.as_u16(), current });
            }
            seen
        }));
    }
    let mut outcomes = Vec::new();
    for w in writers {
        outcomes.extend(w.await.unwrap());
    }

    assert!(up.overlaps().is_empty(), "two writes to one key were in flight together: {:?}", up.overlaps());
    let mut applied: HashMap<String, Vec<u64>> = HashMap::new();
    for a in up.applied() {
        applied.entry(a.key).or_default().push(a.token.unwrap().parse().unwrap());
    }
    for (key, tokens) in &applied {
        assert!(tokens.windows(2).all(|w| w[0] <= w[1]), "{key} applied tokens out of order: {tokens:?}");
    }
    let accepted = outcomes.iter().filter(|o| o.status == 200).count();
    let stale = outcomes.iter().filter(|o| o.status == 409).count();
    assert_eq!(accepted + stale, outcomes.len(), "unexpected statuses: {outcomes:?}");
    assert_eq!(accepted, up.applied().len(), "every accepted write was applied, and nothing else");
    assert!(stale > 0 && accepted > 0, "the run should exercise both paths ({accepted} accepted, {stale} stale)");
    for o in outcomes.iter().filter(|o| o.status == 409) {
        let current = o.current.expect("409 without X-Fencing-Token-Current");
        assert!(current > o.token, "409 for {} with token {} but current {current}", o.key, o.token);
        assert!(
            applied[&o.key].contains(&current),
            "409 cited {current} for {}, a token the upstream never applied",
            o.key
        );
    }
    // The fence ends at the highest applied token of each key.
    for (key, tokens) in &applied {
        let max = *tokens.iter().max().unwrap();
        if max > 0 {
            let r = put(&proxy.url(key), max - 1, "").await;
            assert_eq!(r.header("x-fencing-token-current"), Some(max.to_string().as_str()));
        }
    }
}

/// A client that disconnects while its fenced write is at the upstream leaves
/// the outcome unknown: the upstream may still apply it. The next write for the
/// key must not overtake it.
#[tokio::test]
async fn a_write_whose_client_went_away_is_not_overtaken() {
    let up = RecordingUpstream::start().await;
    let proxy = Proxy::start(&route("objects", "/objects/", &up, "settle = \"1s\"")).await;
    let gate = up.hold("/objects/k");
    let first = spawn_put(proxy.url("/objects/k"), 1);
    gate.wait_arrived().await;
    first.abort();
    let _ = first.await;
    let second = spawn_put(proxy.url("/objects/k"), 2);
    proxy.wait_metric("fencegate_waiting_requests", 1.0).await;
    assert_eq!(up.in_flight("/objects/k"), 1, "token 2 reached the upstream while token 1 was held");
    gate.release();
    assert_eq!(second.await.unwrap().status, 200);
    assert!(up.overlaps().is_empty(), "token 2 reached the upstream while token 1 was still there");
    let k = up.applied_for("/objects/k");
    let last = k.last().expect("token 2 was applied");
    assert_eq!(last.token.as_deref(), Some("2"), "token 1 landed after token 2: {k:?}");
}
