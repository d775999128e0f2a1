//! The atomicity invariant, end to end: for one key, fenced requests reach the
//! upstream in non-decreasing token order; the holder's own writes (the key's
//! mark) may be in flight together, a higher token waits until every one of
//! them has ended, and old-mark writes arriving behind a waiting raise are
//! refused; different keys never wait on each other; stale tokens are refused
//! without queueing.
//!
//! The recording upstream is the witness: it records what it applied, in which
//! order, and whether writes with different tokens to one key were ever in
//! flight together. The
//! tests hold a write there while they look at what happens meanwhile, then
//! release it: they wait on events, never on a sleep being long enough.
//!
//! The randomized test logs its seed; `FENCEGATE_TEST_SEED=<seed>` replays the
//! same random choices (the interleaving of the writers still varies).

use crate::common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::process::*;
use common::*;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

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
    let up = RecordingUpstream::start().await;
    let auth = "auth_token = \"queue-secret\"";
    let proxy = start_in_process(&config_text(auth, MEMORY_STORE, &route("objects", "/objects/", &up, ""))).await;
    let gate = up.hold("/objects/k");
    let first = spawn_put(proxy.url("/objects/k"), 1);
    gate.wait_arrived().await;
    // Token 2 passes the early check (the mark is 1) and waits for token 1.
    let two = spawn_put(proxy.url("/objects/k"), 2);
    proxy.wait_metric("fencegate_waiting_requests", 1.0).await;
    // Meanwhile the lock service's next holder fences the key through the API.
    let raise = send(
        "PUT",
        &proxy.admin_url(&format!("/fences?key={}", enc("/objects/k"))),
        &[("authorization", "Bearer queue-secret")],
        "{\"token\": 3}",
    )
    .await;
    assert_eq!(raise.status, 200, "{}", raise.text());

    // When its turn comes the mark is 3: token 2 must lose.
    gate.release();
    assert_eq!(first.await.unwrap().status, 200);
    let r = two.await.unwrap();
    let p = r.problem(409);
    assert_eq!(p["current"], 3);
    let tokens: Vec<_> = up.applied_for("/objects/k").into_iter().map(|a| a.token.unwrap()).collect();
    assert_eq!(tokens, ["1"]);
}

/// `PUT url` with `token` until it reaches the upstream, in a task of its own.
async fn spawn_held(up: &RecordingUpstream, url: String, token: u64) -> tokio::task::JoinHandle<Reply> {
    let key = url.rsplit_once("/objects/").map(|(_, k)| format!("/objects/{k}")).unwrap();
    let before = up.in_flight(&key);
    let task = spawn_put(url, token);
    // Two seconds: far more than a write that may go at once needs; one
    // held back by the gate would wait its queue_timeout (10 s).
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    while up.in_flight(&key) == before {
        assert!(!task.is_finished(), "the write was answered without reaching the upstream");
        assert!(std::time::Instant::now() < deadline, "token {token} did not reach the upstream: held back?");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    task
}

#[tokio::test]
async fn the_holders_writes_are_in_flight_together() {
    let (up, proxy) = setup().await;
    let url = proxy.url("/objects/k");
    assert_eq!(put(&url, 1, "").await.status, 200);
    let gate = up.hold_next("/objects/k", 3);
    let mut writes = Vec::new();
    for _ in 0..3 {
        writes.push(spawn_held(&up, url.clone(), 1).await);
    }
    assert_eq!(up.in_flight("/objects/k"), 3);
    assert_eq!(up.together("/objects/k"), 2);
    assert_eq!(proxy.metric("fencegate_active_keys").await, Some(1.0));
    assert_eq!(proxy.metric("fencegate_waiting_requests").await, Some(0.0));
    gate.release();
    for w in writes {
        assert_eq!(w.await.unwrap().status, 200);
    }
    assert_eq!(up.applied_for("/objects/k").len(), 4);
    assert!(up.overlaps().is_empty());
    assert_eq!(proxy.metric("fencegate_active_keys").await, Some(0.0));
}

#[tokio::test]
async fn a_raise_waits_for_every_write_of_the_old_mark_and_old_writes_behind_it_are_refused() {
    let (up, proxy) = setup().await;
    let url = proxy.url("/objects/k");
    assert_eq!(put(&url, 1, "").await.status, 200);
    // Two writes of the holder of token 1, held at the upstream one by one.
    let (first_gate, second_gate) = (up.hold("/objects/k"), up.hold("/objects/k"));
    let first = spawn_held(&up, url.clone(), 1).await;
    let second = spawn_held(&up, url.clone(), 1).await;

    // The next holder waits for both.
    let raise = spawn_put(url.clone(), 2);
    proxy.wait_metric("fencegate_waiting_requests", 1.0).await;
    // The old holder writes again: it would be stale by its turn, so it is
    // refused now, and does not hold the new holder up.
    let r = put(&url, 1, "").await;
    let p = r.problem(409);
    assert_eq!(p["type"], "urn:fencegate:problem:stale-token", "{p}");
    assert_eq!(p["waiting"], 2, "{p}");
    assert_eq!(p["token"], 1, "{p}");
    assert!(r.header("x-fencing-token-current").is_none(), "the mark is still 1: {p}");
    assert!(p.get("current").is_none(), "no mark to cite: {p}");
    // A token below the mark is stale at once, as ever.
    put(&url, 0, "").await.problem(409);

    first_gate.release();
    assert_eq!(first.await.unwrap().status, 200);
    assert_eq!(up.in_flight("/objects/k"), 1, "token 2 went while a write of token 1 was in flight");
    assert_eq!(proxy.metric("fencegate_waiting_requests").await, Some(1.0));
    second_gate.release();
    assert_eq!(second.await.unwrap().status, 200);
    assert_eq!(raise.await.unwrap().status, 200);

    let applied = up.applied_for("/objects/k");
    let tokens: Vec<_> = applied.iter().map(|a| a.token.clone().unwrap()).collect();
    assert_eq!(tokens, ["1", "1", "1", "2"]);
    assert!(applied[3].started >= applied[2].ended, "token 2 reached the upstream before token 1 was done");
    assert!(up.overlaps().is_empty(), "{:?}", up.overlaps());
    // Now token 1 is stale, and says so with the mark.
    assert_eq!(put(&url, 1, "").await.header("x-fencing-token-current"), Some("2"));
}

#[tokio::test]
async fn a_settling_write_holds_the_key_against_a_raise_but_not_its_holder() {
    let up = RecordingUpstream::start().await;
    let proxy = Proxy::start(&route("objects", "/objects/", &up, "timeout = \"200ms\"\nsettle = \"1s\"")).await;
    let url = proxy.url("/objects/k");
    // Held past the timeout: 504, outcome unknown, the key settles for 1 s.
    let gate = up.hold("/objects/k");
    let answered = {
        let r = put(&url, 1, "").await;
        r.problem(504);
        std::time::Instant::now()
    };
    // The holder's next write shares the key with the settling one.
    assert_eq!(put(&url, 1, "").await.status, 200);
    // A raise waits for the settle period.
    let raise = spawn_put(url.clone(), 2);
    proxy.wait_metric("fencegate_waiting_requests", 1.0).await;
    gate.release();
    assert_eq!(raise.await.unwrap().status, 200);
    let applied = up.applied_for("/objects/k");
    let raised = applied.iter().find(|a| a.token.as_deref() == Some("2")).expect("token 2 was applied");
    // The settle period began before the 504 was answered: half of it is margin.
    let held = raised.started.saturating_duration_since(answered);
    assert!(held >= Duration::from_millis(500), "token 2 reached the upstream {held:?} after the 504");
    assert!(up.overlaps().is_empty(), "{:?}", up.overlaps());
}

#[tokio::test]
async fn a_strict_key_keeps_one_write_in_flight() {
    let up = RecordingUpstream::start().await;
    let proxy = Proxy::start(&route("once", "/objects/", &up, "strict = true")).await;
    let url = proxy.url("/objects/k");
    let gate = up.hold("/objects/k");
    let first = spawn_held(&up, url.clone(), 1).await;
    // Token 2 waits for token 1: on a strict route every write raises the mark.
    let second = spawn_put(url.clone(), 2);
    proxy.wait_metric("fencegate_waiting_requests", 1.0).await;
    assert_eq!(up.in_flight("/objects/k"), 1);
    gate.release();
    assert_eq!(first.await.unwrap().status, 200);
    assert_eq!(second.await.unwrap().status, 200);
    assert!(up.overlaps().is_empty());
    assert_eq!(up.together("/objects/k"), 0);
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
    /// A 409's `waiting` member: a higher token was waiting for the key.
    waiting: Option<u64>,
}

/// Many keys, many concurrent writers, lock holders that pause and come back
/// with old tokens, and write from several tasks at once now and then.
/// Whatever the interleaving, the upstream's history must show per key
/// non-decreasing tokens and no writes with different tokens in flight
/// together, and every 409 must have been really stale.
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
                let (key, token, slow, pause, together) = {
                    // Mostly take the lock anew; sometimes keep writing with the
                    // token held since before a pause, which may be stale by now.
                    let (key, token) = match held {
                        Some(h) if rng.random_bool(0.4) => h,
                        _ => {
                            let key = rng.random_range(0..KEYS);
                            (key, epochs[key].fetch_add(1, Ordering::SeqCst) + 1)
                        }
                    };
                    // Now and then the holder writes from several tasks at once.
                    let together = if rng.random_bool(0.25) { rng.random_range(2..=3) } else { 1 };
                    (key, token, rng.random_range(0..4u64), rng.random_range(0..6u64), together)
                };
                held = Some((key, token));
                tokio::time::sleep(Duration::from_millis(pause)).await;
                let path = format!("{base}k{key}");
                let sends = (0..together).map(|_| {
                    let path = path.clone();
                    tokio::spawn(async move {
                        let headers = [("x-fencing-token", token.to_string()), ("x-slow-ms", slow.to_string())];
                        send("PUT", &path, &headers.each_ref().map(|(n, v)| (*n, v.as_str())), "w").await
                    })
                });
                for r in sends.collect::<Vec<_>>() {
                    let r = r.await.unwrap();
                    let current = r.header("x-fencing-token-current").map(|c| c.parse().unwrap());
                    let waiting = (r.status == 409).then(|| r.json()["waiting"].as_u64()).flatten();
                    let status = r.status.as_u16();
                    seen.push(Outcome { key: format!("/objects/k{key}"), token, status, current, waiting });
                }
            }
            seen
        }));
    }
    let mut outcomes = Vec::new();
    for w in writers {
        outcomes.extend(w.await.unwrap());
    }

    assert!(up.overlaps().is_empty(), "two tokens of one key were in flight together: {:?}", up.overlaps());
    let together: usize = (0..KEYS).map(|k| up.together(&format!("/objects/k{k}"))).sum();
    assert!(together > 0, "no holder's writes were ever in flight together");
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
        if let (None, Some(waiting)) = (o.current, o.waiting) {
            // Refused behind a higher token waiting for the key: some writer sent it.
            assert!(waiting > o.token, "409 for {} with token {} behind waiting {waiting}", o.key, o.token);
            assert!(outcomes.iter().any(|w| w.key == o.key && w.token == waiting), "{o:?} cites a token nobody sent");
            continue;
        }
        let current = o.current.expect("409 without X-Fencing-Token-Current or waiting");
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
    client_leaves_then_the_next_write_waits("1s", std::time::Duration::ZERO).await;
}

/// The write whose client went away is finished, not merely waited out: with
/// a settle period far shorter than the upstream takes, the next write for
/// the key still waits until the first one's response, however long that is.
/// (Were the first write dropped with its client, or its turn passed on once
/// the settle period ran out, token 2 would reach the upstream while token 1
/// is still there.)
#[tokio::test]
async fn a_write_whose_client_went_away_holds_its_key_until_its_real_end_not_its_settle() {
    // Ten settle periods: time enough for a broken build to let token 2 go.
    client_leaves_then_the_next_write_waits("20ms", std::time::Duration::from_millis(200)).await;
}

/// Token 1's client leaves once its write is held at the upstream; token 2
/// for the key must still be waiting `linger` later, reach the upstream only
/// after token 1's response, and each be applied once, in order.
async fn client_leaves_then_the_next_write_waits(settle: &str, linger: std::time::Duration) {
    let up = RecordingUpstream::start().await;
    let proxy = Proxy::start(&route("objects", "/objects/", &up, &format!("settle = \"{settle}\""))).await;
    let gate = up.hold("/objects/k");
    let first = spawn_put(proxy.url("/objects/k"), 1);
    gate.wait_arrived().await;
    first.abort();
    let _ = first.await;
    let second = spawn_put(proxy.url("/objects/k"), 2);
    proxy.wait_metric("fencegate_waiting_requests", 1.0).await;
    tokio::time::sleep(linger).await;
    assert_eq!(up.in_flight("/objects/k"), 1, "token 2 reached the upstream while token 1 was held");
    gate.release();
    assert_eq!(second.await.unwrap().status, 200);
    assert!(up.overlaps().is_empty(), "token 2 reached the upstream while token 1 was still there");
    let tokens: Vec<_> = up.applied_for("/objects/k").iter().map(|w| w.token.clone()).collect();
    assert_eq!(tokens, [Some("1".to_string()), Some("2".to_string())], "each write applied once, in order");
}
