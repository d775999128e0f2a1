//! Shared fences on Redis (`[fences] store = "redis"`): real `redis-server`
//! processes, real fencegate processes as replicas in front of one recording
//! upstream, which is the witness of what was really written.
//!
//! Each test has its own Redis, its own replicas and its own upstream.

use crate::common;

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use common::process::*;
use common::redis::*;
use common::shared_fences::*;
use common::*;

const SECRET: &str = "redis-admin-secret";
const KEY: &str = "/objects/a";

fn admin() -> String {
    format!("auth_token = {}", toml_string(SECRET))
}

fn bearer() -> String {
    format!("Bearer {SECRET}")
}

fn objects(up: &RecordingUpstream, extra: &str) -> String {
    route("objects", "/objects/", up, extra)
}

/// A replica of fencegate on `redis` in front of `up`.
async fn replica(redis: &Redis, fences_extra: &str, up: &RecordingUpstream, route_extra: &str) -> Running {
    Running::start(&config_text(&admin(), &redis_store(redis, fences_extra), &objects(up, route_extra))).await
}

/// Two replicas with the same config.
async fn replicas(redis: &Redis, fences_extra: &str, up: &RecordingUpstream, route_extra: &str) -> (Running, Running) {
    let a = replica(redis, fences_extra, up, route_extra).await;
    let b = replica(redis, fences_extra, up, route_extra).await;
    (a, b)
}

fn identity(redis: &Redis, prefix: &str) -> String {
    redis.cli(&["HGET", &format!("{prefix}identity"), "id"])
}

// ---------------------------------------------------------------- config

/// `--check` names the field that is wrong for the store.
#[test]
fn config_checks_name_the_fields_of_the_redis_store() {
    let dir = TempDir::new();
    let route = "[[route]]\nname = \"o\"\nprefix = \"/\"\nupstream = \"http://127.0.0.1:9\"\n";
    let cases: &[(&str, Option<&str>)] = &[
        ("[fences]\nstore = \"redis\"\nurl = \"redis://127.0.0.1:6379/0\"\n", None),
        (
            "[fences]\nstore = \"redis\"\nurl = \"redis://127.0.0.1:6379/0\"\nkey_prefix = \"x:\"\ntimeout = \"1s\"\n\
             min_replicas = 1\nreplica_timeout = \"100ms\"\ncache_keys = 10\n",
            None,
        ),
        ("[fences]\nstore = \"redis\"\n", Some("fences.url")),
        ("[fences]\nstore = \"redis\"\nurl = \"redis://127.0.0.1:6379/0\"\npath = \"x\"\n", Some("fences.path")),
        (
            "[fences]\nstore = \"redis\"\nurl = \"redis://127.0.0.1:6379/0\"\nrequire_existing = true\n",
            Some("fences.require_existing"),
        ),
        (
            "[fences]\nstore = \"redis\"\nurl = \"redis://127.0.0.1:6379/0\"\ncache_bytes = \"1MiB\"\n",
            Some("fences.cache_bytes"),
        ),
        ("[fences]\nstore = \"memory\"\nurl = \"redis://127.0.0.1:6379/0\"\n", Some("fences.url")),
        ("[fences]\nstore = \"file\"\npath = \"f\"\nkey_prefix = \"x:\"\n", Some("fences.key_prefix")),
        ("[fences]\nstore = \"file\"\npath = \"f\"\ntimeout = \"1s\"\n", Some("fences.timeout")),
        ("[fences]\nstore = \"memory\"\nmin_replicas = 1\n", Some("fences.min_replicas")),
        ("[fences]\nstore = \"memory\"\nreplica_timeout = \"1s\"\n", Some("fences.replica_timeout")),
        ("[fences]\nstore = \"redis\"\nurl = \"http://127.0.0.1:6379/\"\n", Some("fences.url")),
    ];
    for (i, (fences, field)) in cases.iter().enumerate() {
        let path = dir.write(&format!("c{i}.toml"), &config_text("", fences, route));
        let out = run_to_exit(fencegate(dir.path()).arg("--config").arg(&path).arg("--check"));
        let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
        match field {
            None => assert!(out.status.success(), "{fences}\nfailed --check: {said}"),
            Some(field) => {
                assert!(!out.status.success(), "{fences}\npassed --check: {said}");
                assert!(said.contains(field), "{fences}\n--check does not name {field}: {said}");
            }
        }
    }
}

// ---------------------------------------------------------------- sharing

/// A token seen through replica A fences replica B; the marks live in Redis
/// under the default prefix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_seen_through_one_replica_fences_the_other() {
    let redis = Redis::start();
    let up = RecordingUpstream::start().await;
    let (a, b) = replicas(&redis, "", &up, "").await;

    assert_eq!(put(&a.url(KEY), 5, "five").await.status, 200);
    let r = put(&b.url(KEY), 4, "four").await;
    assert_stale(&r, 5);
    assert_eq!(tokens(&up, KEY), ["5"], "the stale write through B reached the upstream");
    assert_eq!(seen_writes(&up, KEY), 1);

    // The equal token shares the key; a higher one raises it, through either.
    assert_eq!(put(&b.url(KEY), 5, "five again").await.status, 200);
    assert_eq!(put(&b.url(KEY), 6, "six").await.status, 200);
    assert_stale(&put(&a.url(KEY), 5, "five late").await, 6);
    assert_eq!(tokens(&up, KEY), ["5", "5", "6"]);

    // What is in Redis: the mark, the index, the identity; no write left in flight.
    assert_eq!(redis.cli(&["GET", "fencegate:mark:/objects/a"]), "6");
    assert_eq!(redis.cli(&["ZRANGE", "fencegate:keys", "0", "-1"]), KEY);
    assert_eq!(identity(&redis, "fencegate:").len(), 32, "identity {:?}", identity(&redis, "fencegate:"));
    eventually("the write records to end", Duration::from_secs(5), || async {
        redis.cli(&["ZCARD", "fencegate:flight:/objects/a"]) == "0"
    })
    .await;
}

/// Invariant 2 across replicas: a raise through B waits for A's write in
/// flight; meanwhile the old mark is refused through either replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raise_through_one_replica_waits_for_the_others_write_in_flight() {
    let redis = Redis::start();
    let up = RecordingUpstream::start().await;
    let (a, b) = replicas(&redis, "", &up, "").await;

    let gate = up.hold(KEY);
    let five = spawn_put(a.url(KEY), 5, "five");
    gate.wait_arrived().await;
    let six = spawn_put(b.url(KEY), 6, "six");
    // 6 is waiting once it is the token waiting in Redis.
    eventually("token 6 waiting in Redis", Duration::from_secs(10), || async {
        redis.cli(&["GET", "fencegate:wait:/objects/a"]) == "6"
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!six.is_finished(), "token 6 was answered while 5 was in flight: {:?}", six.await);
    assert_eq!(seen_writes(&up, KEY), 1, "token 6 reached the upstream while 5 was held there");

    // The old mark is superseded, at once, through A (another replica's
    // raise waits) and through B (its own raise waits). fencegate answers a
    // superseded token as stale-token, with `waiting`. (Through B it waited
    // behind B's own deciding raise in the Redis store's first version.)
    for (via, url) in [("A", a.url(KEY)), ("B", b.url(KEY))] {
        let r = tokio::time::timeout(Duration::from_secs(3), put(&url, 5, "five again"))
            .await
            .unwrap_or_else(|_| panic!("token 5 through {via} was not answered while 6 waited"));
        let p = r.problem(409);
        assert_eq!(p["type"], "urn:fencegate:problem:stale-token", "via {via}: {p}");
        assert_eq!(p["waiting"], 6, "via {via}: {p}");
        assert!(p["detail"].as_str().unwrap().contains("waiting"), "via {via}: {p}");
    }
    assert_eq!(seen_writes(&up, KEY), 1, "a superseded write reached the upstream");

    gate.release();
    assert_eq!(five.await.unwrap().status, 200);
    assert_eq!(six.await.unwrap().status, 200);
    assert_eq!(tokens(&up, KEY), ["5", "6"]);
    let applied = up.applied_for(KEY);
    assert!(applied[1].started >= applied[0].ended, "6 started before 5 ended: {applied:?}");
    assert!(up.overlaps().is_empty(), "writes of different tokens overlapped: {:?}", up.overlaps());
    assert_stale(&put(&a.url(KEY), 5, "late").await, 6);
}

/// Pre-fencing through the fence API while the old holder's write is in
/// flight on another replica: the new holder's first write carries the mark
/// (the API raised it), yet it must wait for the old write to end, as a
/// raise does.
///
/// Failed before the store recorded which token the writes in flight carry:
/// the new holder's write joined them as a share, and the two tokens
/// overlapped at the upstream (found by the checker's two-replica mode).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefenced_token_waits_for_the_old_holders_write_on_another_replica() {
    let redis = Redis::start();
    let up = RecordingUpstream::start().await;
    let (a, b) = replicas(&redis, "", &up, "").await;
    a_prefenced_token_waits_for_the_old_holders_write(&a, &b, &up, KEY, &bearer()).await;
}

/// A request that writes two keys (a COPY with a `Destination`) holds both
/// alone on every replica: a write of the same token to its destination
/// through another replica waits for it instead of joining it.
///
/// Failed before a turn held alone stopped leaving its token for sharers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_holds_its_destination_alone_across_replicas() {
    let redis = Redis::start();
    let up = RecordingUpstream::start().await;
    let (a, b) = replicas(&redis, "", &up, "").await;
    a_copy_holds_its_destination_alone(&a, &b, &up, KEY).await;
}

/// Requests carrying the key's mark share it across replicas: both in flight at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_holders_writes_share_the_key_across_replicas() {
    let redis = Redis::start();
    let up = RecordingUpstream::start().await;
    let (a, b) = replicas(&redis, "", &up, "").await;
    assert_eq!(put(&a.url(KEY), 5, "five").await.status, 200);

    let gate = up.hold_next(KEY, 2);
    let via_a = spawn_put(a.url(KEY), 5, "five a");
    let via_b = spawn_put(b.url(KEY), 5, "five b");
    gate.wait_arrivals(2).await;
    assert_eq!(up.in_flight(KEY), 2);
    gate.release();
    assert_eq!(via_a.await.unwrap().status, 200);
    assert_eq!(via_b.await.unwrap().status, 200);
    assert_eq!(tokens(&up, KEY), ["5", "5", "5"]);
    assert!(up.overlaps().is_empty());
}

/// A raise through B that waits longer than `queue_timeout` for A's write in
/// flight gets 503 queue-timeout, and nothing is forwarded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raise_waiting_past_queue_timeout_gets_503() {
    let redis = Redis::start();
    let up = RecordingUpstream::start().await;
    let (a, b) = replicas(&redis, "", &up, "queue_timeout = \"1s\"").await;

    let gate = up.hold(KEY);
    let five = spawn_put(a.url(KEY), 5, "five");
    gate.wait_arrived().await;
    let start = Instant::now();
    let r = put(&b.url(KEY), 6, "six").await;
    let waited = start.elapsed();
    let p = r.problem(503);
    assert_eq!(p["type"], "urn:fencegate:problem:queue-timeout", "{p}");
    assert!(r.header("retry-after").is_some());
    assert!(waited >= Duration::from_millis(900), "gave up after {waited:?}, before queue_timeout");
    assert_eq!(seen_writes(&up, KEY), 1, "token 6 reached the upstream");

    gate.release();
    assert_eq!(five.await.unwrap().status, 200);
    // Once 5 is done, 6 goes.
    assert_eq!(put(&b.url(KEY), 6, "six").await.status, 200);
    assert_eq!(tokens(&up, KEY), ["5", "6"]);
    assert!(up.overlaps().is_empty());
}

/// A replica killed with -9 mid-write leaves its record in Redis; other
/// replicas' raises of the key wait for it (503 past their queue_timeout)
/// until it expires (route timeout + settle + 1 s), then go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_replicas_write_holds_the_key_until_its_lease_ends() {
    let redis = Redis::start();
    let up = RecordingUpstream::start().await;
    // Lease of A's writes: what is left of the turn's wait (the whole 1s:
    // the key is idle) + queue_timeout + timeout + settle + 1s = 4.5s.
    let mut a = replica(&redis, "", &up, "timeout = \"1s\"\nsettle = \"500ms\"\nqueue_timeout = \"1s\"").await;
    let b = replica(&redis, "", &up, "timeout = \"1s\"\nsettle = \"500ms\"\nqueue_timeout = \"1s\"").await;

    let gate = up.hold(KEY);
    let sent = Instant::now();
    let five = spawn_put(a.url(KEY), 5, "five");
    gate.wait_arrived().await;
    a.kill();
    let _ = five.await;
    // The write A forwarded lands after A died.
    gate.release();
    eventually("5 applied", Duration::from_secs(5), || async { tokens(&up, KEY) == ["5"] }).await;
    assert_eq!(redis.cli(&["ZCARD", "fencegate:flight:/objects/a"]), "1", "A's record is not in Redis");

    // B's queue_timeout (1s) is shorter than what is left of the lease.
    let r = put(&b.url(KEY), 6, "six").await;
    assert!(sent.elapsed() < Duration::from_millis(4400), "too slow a machine to tell: {:?}", sent.elapsed());
    assert_eq!(r.problem(503)["type"], "urn:fencegate:problem:queue-timeout");
    assert_eq!(seen_writes(&up, KEY), 1, "token 6 went while A's record stood");

    let mut refused = 1;
    let passed = loop {
        let r = put(&b.url(KEY), 6, "six").await;
        if r.status == 200 {
            break sent.elapsed();
        }
        assert_eq!(r.problem(503)["type"], "urn:fencegate:problem:queue-timeout");
        refused += 1;
        assert!(refused < 10, "token 6 never went after A's lease");
    };
    let six = &up.applied_for(KEY)[1];
    let after = six.started.duration_since(sent);
    assert!(
        after >= Duration::from_millis(4400),
        "token 6 reached the upstream {after:?} after A's write, before its lease ended"
    );
    assert!(passed < Duration::from_secs(9), "token 6 went only {passed:?} after A's write");
    assert_eq!(put(&b.url(KEY), 7, "seven").await.status, 200);
    assert_eq!(tokens(&up, KEY), ["5", "6", "7"]);
    assert!(up.overlaps().is_empty());
}

// ---------------------------------------------------------------- fail closed

/// Redis down: fenced writes 503 (nothing forwarded), a token below a mark
/// this replica saw still 409, reads pass, /readyz 200 (serving) with the
/// store refusing writes in its verbose body and `fencegate_store_writable`
/// 0. Redis back with its data: writes resume, marks intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_fails_closed_and_redis_back_with_its_data_resumes() {
    let mut redis = Redis::start_durable();
    let up = RecordingUpstream::start().await;
    let (a, b) = replicas(&redis, "", &up, "").await;
    a.wait_writable(true, Duration::from_secs(5)).await;
    b.wait_writable(true, Duration::from_secs(5)).await;
    assert_eq!(put(&a.url(KEY), 5, "five").await.status, 200);
    // Redis dies while the key is idle: the write's record is gone. (A record
    // whose end never reached Redis stays until its lease ends, by design:
    // raises of the key would wait that long after Redis is back.)
    eventually("the write's record to end", Duration::from_secs(5), || async {
        redis.cli(&["ZCARD", "fencegate:flight:/objects/a"]) == "0"
    })
    .await;

    redis.kill();
    let down = Instant::now();
    a.wait_writable(false, Duration::from_secs(3)).await;
    b.wait_writable(false, Duration::from_secs(3)).await;
    eprintln!("fencegate_store_writable 0 on both {:?} after Redis died", down.elapsed());
    assert_eq!(get(&a.admin_url("/readyz")).await.status, 200, "Redis down took the replica out of service");
    let why = refusing(&a).await.expect("/readyz?verbose names the store refusing writes");
    assert!(why.contains("unreachable"), "{why}");

    for fg in [&a, &b] {
        let r = put(&fg.url(KEY), 6, "six").await;
        assert_store_unavailable(&r);
    }
    // B never saw the mark: it cannot tell, so it fails closed.
    assert_store_unavailable(&put(&b.url(KEY), 4, "four").await);
    // A saw 5: below it is stale without asking Redis.
    assert_stale(&put(&a.url(KEY), 4, "four").await, 5);
    assert_eq!(seen_writes(&up, KEY), 1, "a write reached the upstream while Redis was down");
    // Safe methods pass.
    let r = get(&b.url(KEY)).await;
    assert_eq!((r.status.as_u16(), r.text()), (200, "five".to_string()));

    redis.restart();
    a.wait_writable(true, Duration::from_secs(5)).await;
    b.wait_writable(true, Duration::from_secs(5)).await;
    // The mark came back from disk: B, which never saw it, refuses below it.
    assert_stale(&put(&b.url(KEY), 4, "four").await, 5);
    let r = put(&b.url(KEY), 6, "six").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_stale(&put(&a.url(KEY), 5, "five").await, 6);
    assert_eq!(tokens(&up, KEY), ["5", "6"]);
}

/// A Redis call slower than `[fences] timeout` refuses the write (503) in
/// about that time; nothing is forwarded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_slower_than_timeout_refuses_the_write() {
    let redis = Redis::start();
    let up = RecordingUpstream::start().await;
    let a = replica(&redis, "timeout = \"250ms\"", &up, "").await;
    assert_eq!(put(&a.url(KEY), 5, "five").await.status, 200);

    assert_eq!(redis.cli(&["CLIENT", "PAUSE", "3000", "ALL"]), "OK");
    let start = Instant::now();
    let r = put(&a.url(KEY), 6, "six").await;
    let took = start.elapsed();
    assert_store_unavailable(&r);
    assert!(took < Duration::from_millis(1500), "the refusal took {took:?}, timeout is 250ms");
    assert_eq!(seen_writes(&up, KEY), 1);

    // After the pause, writes resume.
    eventually("writes to resume", Duration::from_secs(10), || async {
        put(&a.url(KEY), 6, "six").await.status == 200
    })
    .await;
    assert_eq!(tokens(&up, KEY), ["5", "6"]);
}

// ---------------------------------------------------------------- a Redis that forgets

/// FLUSHALL under the replicas: every replica distrusts the store (503,
/// /readyz?verbose naming the identity, an ERROR line) until an operator
/// confirms; then the marks the replicas remember are back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flushed_store_is_refused_until_an_operator_confirms_it() {
    let redis = Redis::start();
    let up = RecordingUpstream::start().await;
    let (mut a, mut b) = replicas(&redis, "", &up, SHORT_LEASE).await;
    // A remembers /objects/a at 5, B remembers /objects/b at 3.
    assert_eq!(put(&a.url(KEY), 5, "five").await.status, 200);
    assert_eq!(put(&b.url("/objects/b"), 3, "three").await.status, 200);
    let old = identity(&redis, "fencegate:");

    redis.flush();
    for fg in [&a, &b] {
        fg.wait_writable(false, Duration::from_secs(3)).await;
        let detail = refusing(fg).await.unwrap_or_default();
        assert!(detail.contains("identity"), "{detail}");
    }
    for fg in [&a, &b] {
        assert_store_unavailable(&put(&fg.url(KEY), 6, "six").await);
        assert_store_unavailable(&put(&fg.url("/objects/b"), 4, "four").await);
        assert_store_unavailable(&put(&fg.url("/objects/c"), 1, "new key").await);
        // Below the old mark: refused, one way or the other.
        let r = put(&fg.url(KEY), 4, "stale").await;
        assert!([409, 503].contains(&r.status.as_u16()), "{}", r.text());
    }
    assert_eq!(seen_writes(&up, KEY), 1, "a write reached the upstream through a flushed store");
    assert_eq!(seen_writes(&up, "/objects/b"), 1);
    assert_eq!(seen_writes(&up, "/objects/c"), 0);
    let loud = |e: &Value| e["level"] == "ERROR" && e["message"].as_str().is_some_and(|m| m.contains("identity"));
    a.wait_event("an ERROR about the store's identity", loud).await;
    b.wait_event("an ERROR about the store's identity", loud).await;

    // Confirming needs the admin token.
    assert_eq!(confirm(&a, None).await.status, 401);
    assert_eq!(confirm(&a, Some("Bearer wrong")).await.status, 401);
    assert_store_unavailable(&put(&a.url(KEY), 6, "six").await);

    let r = confirm(&a, Some(&bearer())).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let done = r.json();
    let new = done["identity"].as_str().unwrap().to_string();
    assert_ne!(new, old);
    assert_eq!(done["previous"], old, "{done}");
    assert_eq!(done["restored"], 1, "A remembers one mark: {done}");
    assert_eq!(identity(&redis, "fencegate:"), new);
    assert_eq!(redis.cli(&["HGET", "fencegate:identity", "previous"]), old);
    a.wait_writable(true, Duration::from_secs(10)).await;
    // B adopts the confirmed identity after raising its own remembered marks.
    b.wait_writable(true, Duration::from_secs(10)).await;
    assert_eq!(redis.cli(&["GET", "fencegate:mark:/objects/b"]), "3", "B did not restore its mark");
    assert_eq!(redis.cli(&["GET", "fencegate:mark:/objects/a"]), "5", "A did not restore its mark");

    // The old marks are back: B never saw /objects/a, A never saw /objects/b.
    assert_stale(&put(&b.url(KEY), 4, "four").await, 5);
    assert_stale(&put(&a.url("/objects/b"), 2, "two").await, 3);
    assert_eq!(put(&a.url(KEY), 6, "six").await.status, 200);
    assert_eq!(put(&b.url(KEY), 7, "seven").await.status, 200);
    assert_eq!(put(&b.url("/objects/c"), 1, "one").await.status, 200);
    assert_eq!(tokens(&up, KEY), ["5", "6", "7"]);
    assert_eq!(tokens(&up, "/objects/b"), ["3"]);
}

/// Route limits that keep a write's lease short: a confirm holds fenced
/// writes for the longest lease (2 × 500ms + 2s, and a second of margin).
const SHORT_LEASE: &str = "timeout = \"2s\"\nqueue_timeout = \"500ms\"";

/// Route limits under which a write held at the upstream outlives the
/// test's assertions: a lease of 2 × 1s + 15s and a second of margin.
const LONG_LEASE: &str = "timeout = \"15s\"\nqueue_timeout = \"1s\"";

/// Redis forgets (flushed) while A's write of token 5 is held at the
/// upstream: its record in flight is gone with the data. After an operator
/// confirms the store, B's write of 6 must not reach the upstream while 5
/// may still be there: it gets 503 `store-unavailable` with a `Retry-After`
/// naming the hold left, and goes once the hold is over.
///
/// Failed before the confirm held fenced writes: the confirm answered after
/// about a second, B then found no record of 5 and forwarded 6 while 5 was
/// still held at the upstream.
async fn writes_admitted_before_the_loss_hold_the_confirmed_store(confirm_through_writer: bool) {
    let redis = Redis::start();
    let up = RecordingUpstream::start().await;
    let (a, b) = replicas(&redis, "", &up, LONG_LEASE).await;
    let (gate, five) = five_held_while_redis_forgets(&redis, &up, &a, &b).await;
    let (confirmer, other) = if confirm_through_writer { (&a, &b) } else { (&b, &a) };
    let r = confirm(confirmer, Some(&bearer())).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let held_ms = r.json()["held_ms"].as_u64().unwrap_or_default();
    // A write of 6 through the confirming replica, at once. (Through A it
    // also waits for A's own turn of the key, held by 5: 503 either way.)
    let r = put(&confirmer.url(KEY), 6, "six").await;
    assert_eq!(seen_writes(&up, KEY), 1, "token 6 reached the upstream while 5 was held there: {}", r.text());
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(held_ms >= 17_000, "writes held {held_ms} ms, a write's lease is 18s");
    // The other replica adopts the confirmed identity (its check runs every second).
    eventually("the other replica adopting the confirmed identity", Duration::from_secs(5), || async {
        refusing(other).await.is_some_and(|d| d.contains("held"))
    })
    .await;

    // B's write is refused by the hold (A's would wait for its own turn first).
    let r = put(&b.url(KEY), 6, "six").await;
    let p = assert_store_unavailable(&r);
    assert!(p["detail"].as_str().unwrap().contains("held"), "{p}");
    let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!(retry > 1, "Retry-After {retry} while writes are held for {held_ms} ms");
    assert_store_unavailable(&put(&b.url("/objects/other"), 1, "another key").await);
    for (via, fg) in [("the confirming replica", confirmer), ("the other replica", other)] {
        let why = refusing(fg).await.unwrap_or_default();
        assert!(why.contains("held"), "via {via}: {why}");
    }
    // Reads flow meanwhile.
    assert_ne!(get(&b.url("/objects/other")).await.status, 503);
    assert_eq!(seen_writes(&up, KEY), 1, "token 6 reached the upstream while 5 was held there");
    assert!(up.overlaps().is_empty(), "writes of different tokens overlapped: {:?}", up.overlaps());

    gate.release();
    assert_eq!(five.await.unwrap().status, 200);
    // Once the hold is over, 6 goes.
    let mut six = put(&b.url(KEY), 6, "six").await;
    let deadline = Instant::now() + Duration::from_millis(held_ms) + Duration::from_secs(10);
    while six.status == 503 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        six = put(&b.url(KEY), 6, "six").await;
    }
    assert_eq!(six.status, 200, "{}", six.text());
    a.wait_writable(true, Duration::from_secs(3)).await;
    b.wait_writable(true, Duration::from_secs(3)).await;
    assert_eq!(tokens(&up, KEY), ["5", "6"]);
    assert!(up.overlaps().is_empty(), "writes of different tokens overlapped: {:?}", up.overlaps());
    assert_stale(&put(&a.url(KEY), 5, "late").await, 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirm_through_the_other_replica_holds_writes_past_the_writes_in_flight() {
    writes_admitted_before_the_loss_hold_the_confirmed_store(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirm_through_the_writing_replica_holds_writes_past_its_write_in_flight() {
    writes_admitted_before_the_loss_hold_the_confirmed_store(true).await;
}

/// Replicas whose routes give writes leases of different lengths: the
/// confirm goes through B, whose writes are short, while A's long write is
/// in flight. A, adopting the confirmed identity, lengthens the hold to its
/// own longest lease, so B's write still waits once B's own hold is over.
///
/// Failed before the confirm held fenced writes (B forwarded 6 a second
/// after the confirm, while 5 was held at the upstream).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_replica_with_the_longest_lease_lengthens_the_hold() {
    let redis = Redis::start();
    let up = RecordingUpstream::start().await;
    let a = replica(&redis, "", &up, LONG_LEASE).await;
    let b = replica(&redis, "", &up, SHORT_LEASE).await;
    let (gate, five) = five_held_while_redis_forgets(&redis, &up, &a, &b).await;
    let r = confirm(&b, Some(&bearer())).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let held_ms = r.json()["held_ms"].as_u64().unwrap_or_default();
    assert!(held_ms < 10_000, "B's own hold is its short lease: {held_ms} ms");
    // Past B's own hold (and A's adoption, a second at most).
    tokio::time::sleep(Duration::from_millis(held_ms) + Duration::from_secs(1)).await;
    let r = put(&b.url(KEY), 6, "six").await;
    let p = assert_store_unavailable(&r);
    assert!(p["detail"].as_str().unwrap().contains("held"), "{p}");
    assert_eq!(seen_writes(&up, KEY), 1, "token 6 reached the upstream while 5 was held there");

    gate.release();
    assert_eq!(five.await.unwrap().status, 200);
    assert!(up.overlaps().is_empty(), "writes of different tokens overlapped: {:?}", up.overlaps());
}

/// A's write of 5 held at the upstream while Redis is flushed, until both
/// replicas refuse the store they no longer trust.
async fn five_held_while_redis_forgets(
    redis: &Redis,
    up: &RecordingUpstream,
    a: &Running,
    b: &Running,
) -> (Gate, tokio::task::JoinHandle<Reply>) {
    let gate = up.hold(KEY);
    let five = spawn_put(a.url(KEY), 5, "five");
    gate.wait_arrived().await;
    redis.flush();
    a.wait_writable(false, Duration::from_secs(3)).await;
    b.wait_writable(false, Duration::from_secs(3)).await;
    (gate, five)
}

/// A Redis without persistence restarted: the same as a flush, confirmed
/// with the CLI this time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_empty_redis_is_confirmed_with_the_cli() {
    let mut redis = Redis::start();
    let up = RecordingUpstream::start().await;
    let (a, b) = replicas(&redis, "", &up, SHORT_LEASE).await;
    assert_eq!(put(&a.url(KEY), 5, "five").await.status, 200);
    // B has used the store too (so it knows the store's identity).
    assert_eq!(put(&b.url("/objects/b"), 1, "one").await.status, 200);

    redis.restart();
    a.wait_writable(false, Duration::from_secs(3)).await;
    b.wait_writable(false, Duration::from_secs(3)).await;
    assert_store_unavailable(&put(&b.url(KEY), 6, "six").await);
    // B never saw 5: without the store it cannot tell 4 is stale, and refuses it.
    assert_store_unavailable(&put(&b.url(KEY), 4, "four").await);
    assert_eq!(seen_writes(&up, KEY), 1);

    let dir = TempDir::new();
    let cli_config = dir.write(
        "cli.toml",
        &format!(
            "[admin]\nlisten = \"{}\"\n{}\n{}[[route]]\nname = \"o\"\nprefix = \"/\"\nupstream = \"http://127.0.0.1:9\"\n",
            a.admin,
            admin(),
            redis_store(&redis, "")
        ),
    );
    let out = run_to_exit(fencegate(dir.path()).arg("--config").arg(&cli_config).args(["fence", "confirm-store"]));
    assert!(out.status.success(), "confirm-store failed: {}{}", text(&out.stdout), text(&out.stderr));
    assert!(text(&out.stdout).contains("confirmed"), "{}", text(&out.stdout));
    assert!(text(&out.stdout).contains("1 mark"), "{}", text(&out.stdout));

    a.wait_writable(true, Duration::from_secs(10)).await;
    b.wait_writable(true, Duration::from_secs(10)).await;
    assert_stale(&put(&b.url(KEY), 4, "four").await, 5);
    assert_eq!(put(&b.url(KEY), 6, "six").await.status, 200);
    assert_eq!(tokens(&up, KEY), ["5", "6"]);
}

/// A replica that took no write yet when Redis forgets (SIGSTOP holds it
/// while A writes and Redis restarts empty) must not take the emptied Redis
/// for a new store: a token below the mark A saw must not reach the
/// upstream through it.
///
/// Failed with the Redis store's first version, where a replica learned the
/// identity at its first write: B wrote a new identity and forwarded the
/// stale token. A replica now adopts (or writes) the identity at its first
/// contact with Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_never_used_the_store_does_not_trust_it_once_emptied() {
    let mut redis = Redis::start();
    let up = RecordingUpstream::start().await;
    let (a, mut b) = replicas(&redis, "", &up, "").await;
    // B's first check reached Redis and took its identity, before any write.
    b.wait_event("B reaching Redis", |e| e["message"] == "the Redis fence store answers").await;
    eventually("an identity in Redis", Duration::from_secs(3), || async {
        redis.cli(&["EXISTS", "fencegate:identity"]) == "1"
    })
    .await;
    b.signal("STOP");
    assert_eq!(put(&a.url(KEY), 5, "five").await.status, 200);
    redis.restart();
    b.signal("CONT");
    a.wait_writable(false, Duration::from_secs(3)).await;

    // B reconnects to the restarted Redis (its old connection broke), then
    // looks at the store once more: a full health check period.
    let answers = |fg: &Running| fg.events().iter().filter(|e| e["message"] == "the Redis fence store answers").count();
    eventually("B reconnecting to Redis", Duration::from_secs(5), || async { answers(&b) >= 2 }).await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let r = put(&b.url(KEY), 4, "four, below the mark 5").await;
    assert!(
        !tokens(&up, KEY).contains(&"4".to_string()),
        "token 4 reached the upstream through B after it applied 5 ({} {}); B's store refusing: {:?}; Redis identity now {:?}",
        r.status,
        r.text(),
        refusing(&b).await,
        identity(&redis, "fencegate:")
    );
    assert!([409, 503].contains(&r.status.as_u16()), "{}", r.text());
    assert!(refusing(&b).await.is_some(), "B trusts the emptied store");
}

/// The store answering a mark below one this replica saw (a failover to a
/// replica that missed writes, simulated with SET): the replica distrusts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mark_below_one_seen_makes_the_replica_distrust_the_store() {
    let redis = Redis::start();
    let up = RecordingUpstream::start().await;
    let (a, b) = replicas(&redis, "", &up, SHORT_LEASE).await;
    assert_eq!(put(&a.url(KEY), 5, "five").await.status, 200);

    assert_eq!(redis.cli(&["SET", "fencegate:mark:/objects/a", "1"]), "OK");
    assert_store_unavailable(&put(&a.url(KEY), 6, "six").await);
    assert!(refusing(&a).await.is_some(), "A trusts a store that lost a mark");
    // Still refused: the store is distrusted, not just this key.
    assert_store_unavailable(&put(&a.url(KEY), 6, "six").await);
    assert_store_unavailable(&put(&a.url("/objects/other"), 1, "other").await);
    assert_eq!(seen_writes(&up, KEY), 1, "a write went through a store that lost marks");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(refusing(&a).await.is_some(), "A trusted the store again on its own");

    let r = confirm(&a, Some(&bearer())).await;
    assert_eq!(r.status, 200, "{}", r.text());
    a.wait_writable(true, Duration::from_secs(10)).await;
    b.wait_writable(true, Duration::from_secs(10)).await;
    // A's remembered 5 is back (the refused 6 had already raised the store's
    // mark to 6, nothing forwarded).
    let r = put(&b.url(KEY), 4, "four").await;
    r.problem(409);
    let current: u64 = r.header("x-fencing-token-current").unwrap().parse().unwrap();
    assert!(current >= 5, "mark {current} after the confirm, A saw 5");
    assert_eq!(put(&a.url(KEY), 6, "six").await.status, 200);
    assert_eq!(tokens(&up, KEY), ["5", "6"]);
}

/// Only a shared store is confirmed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirming_a_store_that_is_not_shared_is_409() {
    let up = RecordingUpstream::start().await;
    let fg = Running::start(&config_text(&admin(), MEMORY_STORE, &objects(&up, ""))).await;
    let r = confirm(&fg, Some(&bearer())).await;
    assert_eq!(r.status, 409, "{}", r.text());
}

// ---------------------------------------------------------------- Redis replicas

/// `min_replicas = 1`: a decision no Redis replica acknowledged is not acted on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_replicas_refuses_writes_no_redis_replica_acknowledged() {
    let primary = Redis::start();
    let mut copy = Redis::start_replica_of(&primary);
    let up = RecordingUpstream::start().await;
    let a = replica(&primary, "min_replicas = 1\nreplica_timeout = \"250ms\"", &up, "").await;
    assert_eq!(put(&a.url(KEY), 5, "five").await.status, 200);
    eventually("the mark on the Redis replica", Duration::from_secs(5), || async {
        copy.cli(&["GET", "fencegate:mark:/objects/a"]) == "5"
    })
    .await;

    copy.kill();
    let r = put(&a.url(KEY), 6, "six").await;
    let p = assert_store_unavailable(&r);
    assert!(p["detail"].as_str().unwrap().contains("replica"), "{p}");
    // The refused 6 raised the mark on the primary all the same (nothing was
    // forwarded): 5 is now refused as stale, or as unacknowledged.
    let r = put(&a.url(KEY), 5, "five").await;
    assert!([409, 503].contains(&r.status.as_u16()), "{}", r.text());
    assert_eq!(seen_writes(&up, KEY), 1, "a write no replica acknowledged was forwarded");
    let r = get(&a.url(KEY)).await;
    assert_eq!((r.status.as_u16(), r.text()), (200, "five".to_string()));
    // The fence API's raise, made to shut out an old holder, is refused
    // the same way: no Redis replica has it.
    let auth = bearer();
    let r =
        send("PUT", &fences_url(&a, KEY), &[("authorization", auth.as_str())], json!({ "token": 9 }).to_string()).await;
    assert!(r.problem(503)["detail"].as_str().unwrap().contains("replica"), "{}", r.text());
}

// ---------------------------------------------------------------- fence API, strict

/// The fence API reads and changes the shared marks, through any replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fence_api_works_on_the_shared_store() {
    let redis = Redis::start();
    let up = RecordingUpstream::start().await;
    let (a, b) = replicas(&redis, "", &up, "").await;
    let auth = bearer();
    let auth = [("authorization", auth.as_str())];

    let r = send("PUT", &fences_url(&a, KEY), &auth, json!({ "token": 7 }).to_string()).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = get(&fences_url(&b, KEY)).await;
    assert_eq!(r.json(), json!({ "key": KEY, "token": 7 }));
    assert_stale(&put(&b.url(KEY), 6, "six").await, 7);
    assert_eq!(seen_writes(&up, KEY), 0);
    // A lower raise changes nothing.
    let r = send("PUT", &fences_url(&b, KEY), &auth, json!({ "token": 3 }).to_string()).await;
    assert_eq!(r.status, 409, "{}", r.text());
    assert_eq!(put(&b.url(KEY), 8, "eight").await.status, 200);
    assert_eq!(put(&b.url("/objects/z"), 2, "two").await.status, 200);

    let r = get(&a.admin_url("/fences?prefix=/")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["fences"], json!([{ "key": KEY, "token": 8 }, { "key": "/objects/z", "token": 2 }]));

    // Deleting needs the token; then the key takes any token, on both replicas.
    assert_eq!(send("DELETE", &fences_url(&a, KEY), &[], "").await.status, 401);
    let r = send("DELETE", &fences_url(&a, KEY), &auth, "").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json(), json!({ "key": KEY, "deleted": 1, "token": 8 }));
    assert_eq!(get(&fences_url(&b, KEY)).await.json()["token"], Value::Null);
    assert_eq!(put(&a.url(KEY), 1, "one").await.status, 200);
    // B remembered 8: it forgets once it sees the deletion counted.
    eventually("B to accept token 1 after the delete", Duration::from_secs(3), || async {
        let r = put(&b.url(KEY), 1, "one via B").await;
        assert!([200, 409].contains(&r.status.as_u16()), "{}", r.text());
        r.status == 200
    })
    .await;
    assert_eq!(tokens(&up, KEY), ["8", "1", "1"]);
    assert_eq!(get(&fences_url(&a, "/objects/z")).await.json()["token"], 2);
}

/// A strict route on Redis: one write per token, across replicas; and a
/// `key_prefix` of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_strict_route_takes_one_write_per_token_across_replicas() {
    let redis = Redis::start();
    let up = RecordingUpstream::start().await;
    let (a, b) = replicas(&redis, "key_prefix = \"strict-test:\"", &up, "strict = true").await;

    assert_eq!(put(&a.url(KEY), 5, "five").await.status, 200);
    // B never saw 5: the store refuses the equal token.
    assert_stale(&put(&b.url(KEY), 5, "five via B").await, 5);
    assert_stale(&put(&a.url(KEY), 5, "five again").await, 5);
    assert_stale(&put(&b.url(KEY), 4, "four").await, 5);
    assert_eq!(put(&b.url(KEY), 6, "six").await.status, 200);
    assert_stale(&put(&a.url(KEY), 6, "six via A").await, 6);
    assert_eq!(tokens(&up, KEY), ["5", "6"]);
    assert_eq!(redis.cli(&["GET", "strict-test:mark:/objects/a"]), "6");
    assert_eq!(redis.cli(&["EXISTS", "fencegate:mark:/objects/a"]), "0");
}
