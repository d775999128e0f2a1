//! Shared fences on etcd (`[fences] store = "etcd"`): real 3-member `etcd`
//! clusters, real fencegate processes as replicas in front of one recording
//! upstream, which is the witness of what was really written.
//!
//! Each test has its own cluster, its own replicas and its own upstream. The
//! tests look inside etcd with `etcd_client`: under the prefix P
//! (`fencegate/` by default), `P mark/<key>` is the mark as 20 zero-padded
//! digits, `P flight/<len>:<key>/<replica>/<n>` a write in flight (on its
//! replica's lease; the key's length keeps the records of `/a/b` out of the
//! range of `/a`'s), `P wait/<key>` the highest token waiting to raise, and
//! `P identity` the store's identity. docs/etcd.md has the layout.

use crate::common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use common::etcd::*;
use common::process::*;
use common::shared_fences::*;
use common::*;

const SECRET: &str = "etcd-admin-secret";
const KEY: &str = "/objects/a";
const PREFIX: &str = "fencegate/";

fn admin() -> String {
    format!("auth_token = {}", toml_string(SECRET))
}

fn bearer() -> String {
    format!("Bearer {SECRET}")
}

fn objects(up: &RecordingUpstream, extra: &str) -> String {
    route("objects", "/objects/", up, extra)
}

/// A replica of fencegate on `cluster` in front of `up`.
async fn replica(cluster: &EtcdCluster, fences_extra: &str, up: &RecordingUpstream, route_extra: &str) -> Running {
    Running::start(&config_text(&admin(), &etcd_store(cluster, fences_extra), &objects(up, route_extra))).await
}

/// A replica whose `endpoints` are `endpoints`, in that order.
async fn replica_at(endpoints: &[String], up: &RecordingUpstream, route_extra: &str) -> Running {
    Running::start(&config_text(&admin(), &etcd_store_at(endpoints, ""), &objects(up, route_extra))).await
}

/// Two replicas with the same config.
async fn replicas(
    cluster: &EtcdCluster,
    fences_extra: &str,
    up: &RecordingUpstream,
    route_extra: &str,
) -> (Running, Running) {
    let a = replica(cluster, fences_extra, up, route_extra).await;
    let b = replica(cluster, fences_extra, up, route_extra).await;
    (a, b)
}

/// The etcd key of `key`'s mark under the default prefix.
fn mark_key(key: &str) -> String {
    format!("{PREFIX}mark/{key}")
}

/// The etcd keys of `key`'s records of writes in flight, under the default
/// prefix: `P flight/<len>:<key>/<replica>/<n>`.
async fn flight_records(cluster: &EtcdCluster, key: &str) -> Vec<String> {
    let records = format!("{PREFIX}flight/{}:{key}/", key.len());
    let found = cluster.keys_with_prefix(&records).await;
    found.into_iter().filter(|r| r[records.len()..].split('/').count() == 2).collect()
}

/// How many records of writes in flight `key` has in etcd.
async fn in_flight(cluster: &EtcdCluster, key: &str) -> usize {
    flight_records(cluster, key).await.len()
}

/// Waits until `fg`'s `fencegate_store_writable` is `writable`; fails after
/// `within` with what its `/readyz?verbose` says.
async fn wait_writable(fg: &Running, writable: bool, within: Duration) {
    let want = format!("\nfencegate_store_writable {}\n", u8::from(writable));
    let start = Instant::now();
    while !get(&fg.admin_url("/metrics")).await.text().contains(&want) {
        if start.elapsed() > within {
            panic!(
                "fencegate_store_writable of {} not turning {writable} within {within:?}; /readyz?verbose: {:?}",
                fg.pid(),
                refusing(fg).await
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until every replica in `fgs` takes fenced writes again after a
/// confirmation, and the hold is gone from etcd: readiness reads the hold's
/// lease in whole seconds and etcd ends an expired lease a moment late, so
/// a write sent at once could still meet the hold (503, `Retry-After`).
async fn wait_confirmed(cluster: &EtcdCluster, fgs: &[&Running]) {
    for fg in fgs {
        wait_writable(fg, true, Duration::from_secs(30)).await;
    }
    let held = format!("{PREFIX}held");
    eventually("the hold to leave etcd", Duration::from_secs(5), || async { cluster.get(&held).await.is_none() }).await;
}

/// A mark as etcd holds it: 20 zero-padded decimal digits.
fn padded(token: u64) -> String {
    format!("{token:020}")
}

/// The tokens the upstream applied to `key`, in order, as numbers.
fn numeric_tokens(up: &RecordingUpstream, key: &str) -> Vec<u64> {
    tokens(up, key).iter().map(|t| t.parse().unwrap_or_else(|_| panic!("token {t:?} applied to {key}"))).collect()
}

/// Asserts that the tokens applied to `key` never went down.
fn assert_never_down(up: &RecordingUpstream, key: &str) {
    let applied = numeric_tokens(up, key);
    for pair in applied.windows(2) {
        assert!(
            pair[1] >= pair[0],
            "a stale write reached the upstream on {key}: {} after {}: {applied:?}",
            pair[1],
            pair[0]
        );
    }
}

/// `put` on a task of its own, to a replica that may die meanwhile: the
/// status, or `None` when the connection broke.
fn spawn_put_may_break(url: String, token: u64) -> tokio::task::JoinHandle<Option<http::StatusCode>> {
    tokio::spawn(async move {
        let req = http::Request::put(url)
            .header("x-fencing-token", token.to_string())
            .body(http_body_util::Full::new(bytes::Bytes::from_static(b"write")))
            .unwrap();
        client().request(req).await.ok().map(|r| r.status())
    })
}

/// `put`, failing the test if fencegate does not answer within 30 s (a
/// fenced write waits at most its route's `queue_timeout` and the store's
/// `timeout` per call: never that long).
async fn put_answered(url: &str, token: u64, body: &'static str) -> Reply {
    tokio::time::timeout(Duration::from_secs(30), put(url, token, body))
        .await
        .unwrap_or_else(|_| panic!("PUT {url} with token {token} was not answered within 30 s"))
}

/// What a fenced write was answered during a fault: 200, 409 stale-token,
/// or 503 (store-unavailable or queue-timeout); anything else fails.
fn outcome(r: &Reply) -> &'static str {
    match r.status.as_u16() {
        200 => "ok",
        409 => {
            assert_eq!(r.problem(409)["type"], "urn:fencegate:problem:stale-token", "{}", r.text());
            "stale"
        }
        503 => {
            let p = r.problem(503);
            let kind = p["type"].as_str().unwrap();
            assert!(r.header("retry-after").is_some(), "a 503 without Retry-After: {p}");
            if kind.ends_with("store-unavailable") {
                "store-unavailable"
            } else if kind == "urn:fencegate:problem:queue-timeout" {
                "queue-timeout"
            } else {
                panic!("a 503 of an unexpected kind during an etcd fault: {p}")
            }
        }
        other => panic!("a fenced write answered {other} during an etcd fault: {}", r.text()),
    }
}

/// Route limits that keep a write's lease short (2 × 1s + 2 × 2s + 0s = 6 s;
/// the replica's etcd lease 7 s): a record left by a write refused after its
/// raise committed ends soon.
const FAULT_ROUTE: &str = "timeout = \"2s\"\nqueue_timeout = \"1s\"\nsettle = \"0s\"";

// ---------------------------------------------------------------- the harness

/// The harness itself: three members start; a put through one endpoint is
/// read through another; the leader killed, another is elected within 10 s;
/// the killed member restarted rejoins (it serves the write it missed and
/// follows the new leader).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_harness_runs_a_three_member_cluster() {
    let mut cluster = EtcdCluster::start(3).await;
    assert_eq!(cluster.endpoints().len(), 3);
    assert_eq!(
        cluster.toml_endpoints(),
        format!("[\"{}\", \"{}\", \"{}\"]", cluster.endpoint(0), cluster.endpoint(1), cluster.endpoint(2))
    );
    let connect = |endpoint: String| async move { etcd_client::Client::connect([endpoint], None).await.unwrap() };
    let mut c0 = connect(cluster.endpoint(0)).await;
    c0.put("harness/a", "one", None).await.unwrap();
    let mut c2 = connect(cluster.endpoint(2)).await;
    let r = c2.get("harness/a", None).await.unwrap();
    assert_eq!(r.kvs().first().map(|kv| kv.value()), Some(&b"one"[..]));
    assert_eq!(cluster.get("harness/a").await.as_deref(), Some("one"));
    assert_eq!(cluster.count_prefix("harness/").await, 1);
    assert_eq!(cluster.keys_with_prefix("harness/").await, ["harness/a"]);
    let id = cluster.cluster_id().await;

    let old = cluster.leader().await;
    let killed = Instant::now();
    cluster.kill(old);
    let new = cluster.wait_leader(Some(old), Duration::from_secs(10)).await;
    assert_ne!(new, old);
    eprintln!("member {new} leads {:?} after member {old}, the leader, was killed", killed.elapsed());
    // The two left take writes.
    cluster.put("harness/b", "two").await;

    cluster.restart(old).await;
    cluster.wait_rejoined(old).await;
    let mut back = connect(cluster.endpoint(old)).await;
    let r = back.get("harness/b", None).await.unwrap();
    assert_eq!(r.kvs().first().map(|kv| kv.value()), Some(&b"two"[..]), "the restarted member misses a write");
    let leader_id = cluster.status(new).await.unwrap().header().unwrap().member_id();
    eventually("the restarted member following the leader", Duration::from_secs(10), || async {
        cluster.status(old).await.is_ok_and(|s| s.leader() == leader_id)
    })
    .await;
    assert_eq!(cluster.cluster_id().await, id);

    // Freezing and thawing a member; a snapshot; a new cluster on the same URLs.
    cluster.stop(old);
    assert!(!cluster.is_live(old));
    cluster.put("harness/c", "three").await;
    cluster.cont(old);
    cluster.wait_rejoined(old).await;
    let dir = TempDir::new();
    let snapshot = dir.path().join("snapshot.db");
    cluster.snapshot_save(&snapshot).await;
    assert!(std::fs::metadata(&snapshot).unwrap().len() > 0);
    cluster.replace_with_new_cluster().await;
    assert_ne!(cluster.cluster_id().await, id, "the new cluster has the old one's id");
    assert_eq!(cluster.get("harness/a").await, None, "the new cluster is not empty");
}

// ---------------------------------------------------------------- config

/// `--check` names the field that is wrong for the etcd store (exit 2), and
/// takes a right one.
#[test]
fn config_checks_name_the_fields_of_the_etcd_store() {
    let dir = TempDir::new();
    let ca = certs::Ca::new("etcd test CA");
    let id = ca.issue("fencegate");
    let ca_file = toml_string(&dir.write("ca.pem", &ca.pem()).display().to_string());
    let cert_file = toml_string(&dir.write("client.pem", &id.cert).display().to_string());
    let key_file = toml_string(&dir.write("client.key", &id.key).display().to_string());
    let route = "[[route]]\nname = \"o\"\nprefix = \"/\"\nupstream = \"http://127.0.0.1:9\"\n";
    let etcd = "[fences]\nstore = \"etcd\"\nendpoints = [\"http://127.0.0.1:2379\"]\n";
    let tls = "[fences]\nstore = \"etcd\"\nendpoints = [\"https://127.0.0.1:2379\", \"https://127.0.0.2:2379\"]\n";
    let cases: Vec<(String, Option<&[&str]>)> = vec![
        (etcd.to_string(), None),
        (
            "[fences]\nstore = \"etcd\"\n\
             endpoints = [\"http://127.0.0.1:2379\", \"http://127.0.0.1:22379\", \"http://localhost:32379\"]\n\
             key_prefix = \"x/\"\ntimeout = \"2s\"\ncache_keys = 10\nuser = \"fencegate\"\npassword = \"secret\"\n"
                .to_string(),
            None,
        ),
        (format!("{tls}ca_file = {ca_file}\n"), None),
        (format!("{tls}ca_file = {ca_file}\ncert_file = {cert_file}\nkey_file = {key_file}\n"), None),
        ("[fences]\nstore = \"etcd\"\n".to_string(), Some(&["fences.endpoints"])),
        ("[fences]\nstore = \"etcd\"\nendpoints = []\n".to_string(), Some(&["fences.endpoints"])),
        ("[fences]\nstore = \"etcd\"\nendpoints = [\"127.0.0.1:2379\"]\n".to_string(), Some(&["fences.endpoints"])),
        ("[fences]\nstore = \"etcd\"\nendpoints = [\"redis://127.0.0.1:2379\"]\n".to_string(), Some(&["fences.endpoints"])),
        (
            "[fences]\nstore = \"etcd\"\nendpoints = [\"http://127.0.0.1:2379\", \"https://127.0.0.1:2380\"]\n".to_string(),
            Some(&["fences.endpoints"]),
        ),
        // A type error is the TOML parser's, which shows the line rather than the field's path.
        ("[fences]\nstore = \"etcd\"\nendpoints = \"http://127.0.0.1:2379\"\n".to_string(), Some(&["endpoints ="])),
        (format!("{etcd}timeout = \"soon\"\n"), Some(&["fences.timeout"])),
        (format!("{etcd}ca_file = {ca_file}\n"), Some(&["fences.ca_file"])),
        (format!("{etcd}cert_file = {cert_file}\nkey_file = {key_file}\n"), Some(&["fences.cert_file", "fences.key_file"])),
        (format!("{tls}cert_file = {cert_file}\n"), Some(&["fences.cert_file", "fences.key_file"])),
        (format!("{tls}key_file = {key_file}\n"), Some(&["fences.cert_file", "fences.key_file"])),
        (format!("{etcd}user = \"fencegate\"\n"), Some(&["fences.user", "fences.password"])),
        (format!("{etcd}password = \"secret\"\n"), Some(&["fences.user", "fences.password"])),
        (format!("{etcd}url = \"redis://127.0.0.1:6379/0\"\n"), Some(&["fences.url"])),
        (format!("{etcd}path = \"f\"\n"), Some(&["fences.path"])),
        (format!("{etcd}min_replicas = 1\n"), Some(&["fences.min_replicas"])),
        (format!("{etcd}replica_timeout = \"1s\"\n"), Some(&["fences.replica_timeout"])),
        (
            "[fences]\nstore = \"redis\"\nurl = \"redis://127.0.0.1:6379/0\"\nendpoints = [\"http://127.0.0.1:2379\"]\n"
                .to_string(),
            Some(&["fences.endpoints"]),
        ),
        ("[fences]\nstore = \"redis\"\nurl = \"redis://127.0.0.1:6379/0\"\nuser = \"u\"\n".to_string(), Some(&["fences.user"])),
        ("[fences]\nstore = \"memory\"\nendpoints = [\"http://127.0.0.1:2379\"]\n".to_string(), Some(&["fences.endpoints"])),
        (
            "[fences]\nstore = \"file\"\npath = \"f\"\nendpoints = [\"http://127.0.0.1:2379\"]\n".to_string(),
            Some(&["fences.endpoints"]),
        ),
    ];
    for (i, (fences, fields)) in cases.iter().enumerate() {
        let path = dir.write(&format!("c{i}.toml"), &config_text("", fences, route));
        let out = run_to_exit(fencegate(dir.path()).arg("--config").arg(&path).arg("--check"));
        let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
        match fields {
            None => assert!(out.status.success(), "{fences}\nfailed --check: {said}"),
            Some(fields) => {
                assert_eq!(out.status.code(), Some(2), "{fences}\n--check did not exit 2: {said}");
                let stderr = text(&out.stderr);
                assert!(
                    fields.iter().any(|f| stderr.contains(f)),
                    "{fences}\n--check's stderr names none of {fields:?}: {said}"
                );
            }
        }
    }
}

// ---------------------------------------------------------------- sharing

/// A token seen through replica A fences replicas B and C; the mark lives
/// in etcd under the default prefix, padded; no write is left in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_seen_through_one_replica_fences_the_others() {
    let cluster = EtcdCluster::start(3).await;
    let up = RecordingUpstream::start().await;
    let (a, b) = replicas(&cluster, "", &up, "").await;
    let c = replica(&cluster, "", &up, "").await;

    assert_eq!(put(&a.url(KEY), 5, "five").await.status, 200);
    assert_stale(&put(&b.url(KEY), 4, "four").await, 5);
    assert_stale(&put(&c.url(KEY), 4, "four").await, 5);
    assert_eq!(tokens(&up, KEY), ["5"], "a stale write through B or C reached the upstream");
    assert_eq!(seen_writes(&up, KEY), 1);
    assert_eq!(cluster.get(&mark_key(KEY)).await, Some(padded(5)));

    // The equal token shares the key; a higher one raises it, through any.
    assert_eq!(put(&b.url(KEY), 5, "five again").await.status, 200);
    assert_eq!(put(&c.url(KEY), 6, "six").await.status, 200);
    assert_stale(&put(&a.url(KEY), 5, "five late").await, 6);
    assert_stale(&put(&b.url(KEY), 5, "five late").await, 6);
    assert_eq!(tokens(&up, KEY), ["5", "5", "6"]);

    assert_eq!(cluster.get(&mark_key(KEY)).await, Some(padded(6)));
    assert!(cluster.get(&format!("{PREFIX}identity")).await.is_some(), "no store identity in etcd");
    eventually("the write records to end", Duration::from_secs(10), || async { in_flight(&cluster, KEY).await == 0 })
        .await;
    assert_eq!(cluster.keys_with_prefix(&format!("{PREFIX}mark/")).await, [mark_key(KEY)]);
}

/// Invariant 2 across replicas: a raise through B waits for A's write in
/// flight (its token under `wait/`); meanwhile the old mark is refused
/// through either replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raise_through_one_replica_waits_for_the_others_write_in_flight() {
    let cluster = EtcdCluster::start(3).await;
    let up = RecordingUpstream::start().await;
    let (a, b) = replicas(&cluster, "", &up, "").await;

    let gate = up.hold(KEY);
    let five = spawn_put(a.url(KEY), 5, "five");
    gate.wait_arrived().await;
    // A's write is recorded in flight, on A's lease.
    let records = flight_records(&cluster, KEY).await;
    assert_eq!(records.len(), 1, "records of the write in flight: {records:?}");
    assert_ne!(cluster.lease_of(&records[0]).await, Some(0), "the record {} is on no lease", records[0]);

    let six = spawn_put(b.url(KEY), 6, "six");
    let wait_key = format!("{PREFIX}wait/{KEY}");
    eventually("token 6 waiting in etcd", Duration::from_secs(10), || async {
        cluster.get(&wait_key).await.and_then(|v| v.trim().parse::<u64>().ok()) == Some(6)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!six.is_finished(), "token 6 was answered while 5 was in flight: {:?}", six.await);
    assert_eq!(seen_writes(&up, KEY), 1, "token 6 reached the upstream while 5 was held there");

    for (via, url) in [("A", a.url(KEY)), ("B", b.url(KEY))] {
        let r = tokio::time::timeout(Duration::from_secs(5), put(&url, 5, "five again"))
            .await
            .unwrap_or_else(|_| panic!("token 5 through {via} was not answered while 6 waited"));
        let p = r.problem(409);
        assert_eq!(p["type"], "urn:fencegate:problem:stale-token", "via {via}: {p}");
        assert_eq!(p["waiting"], 6, "via {via}: {p}");
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
    assert_eq!(cluster.get(&mark_key(KEY)).await, Some(padded(6)));
}

/// Pre-fencing through the fence API while the old holder's write is in
/// flight on another replica: the new holder's first write waits for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefenced_token_waits_for_the_old_holders_write_on_another_replica() {
    let cluster = EtcdCluster::start(3).await;
    let up = RecordingUpstream::start().await;
    let (a, b) = replicas(&cluster, "", &up, "").await;
    a_prefenced_token_waits_for_the_old_holders_write(&a, &b, &up, KEY, &bearer()).await;
}

/// Requests carrying the key's mark share it across replicas: both in flight at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_holders_writes_share_the_key_across_replicas() {
    let cluster = EtcdCluster::start(3).await;
    let up = RecordingUpstream::start().await;
    let (a, b) = replicas(&cluster, "", &up, "").await;
    assert_eq!(put(&a.url(KEY), 5, "five").await.status, 200);

    let gate = up.hold_next(KEY, 2);
    let via_a = spawn_put(a.url(KEY), 5, "five a");
    let via_b = spawn_put(b.url(KEY), 5, "five b");
    gate.wait_arrivals(2).await;
    assert_eq!(up.in_flight(KEY), 2);
    assert_eq!(in_flight(&cluster, KEY).await, 2, "one record per replica's share in flight");
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
    let cluster = EtcdCluster::start(3).await;
    let up = RecordingUpstream::start().await;
    let (a, b) = replicas(&cluster, "", &up, "queue_timeout = \"1s\"").await;

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
    let r = put(&b.url(KEY), 6, "six").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(tokens(&up, KEY), ["5", "6"]);
    assert!(up.overlaps().is_empty());
}

/// A strict route on etcd: one write per token, across replicas; and a
/// `key_prefix` of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_strict_route_takes_one_write_per_token_across_replicas() {
    let cluster = EtcdCluster::start(3).await;
    let up = RecordingUpstream::start().await;
    let (a, b) = replicas(&cluster, "key_prefix = \"strict-test/\"", &up, "strict = true").await;

    assert_eq!(put(&a.url(KEY), 5, "five").await.status, 200);
    // B never saw 5: the store refuses the equal token.
    assert_stale(&put(&b.url(KEY), 5, "five via B").await, 5);
    assert_stale(&put(&a.url(KEY), 5, "five again").await, 5);
    assert_stale(&put(&b.url(KEY), 4, "four").await, 5);
    assert_eq!(put(&b.url(KEY), 6, "six").await.status, 200);
    assert_stale(&put(&a.url(KEY), 6, "six via A").await, 6);
    assert_eq!(tokens(&up, KEY), ["5", "6"]);
    assert_eq!(cluster.get(&format!("strict-test/mark/{KEY}")).await, Some(padded(6)));
    assert_eq!(cluster.count_prefix(PREFIX).await, 0, "keys under the default prefix");
}

/// A request that writes two keys (a COPY with a `Destination`) holds both
/// alone on every replica: a write of the same token to its destination
/// through another replica waits for it instead of joining it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_holds_its_destination_alone_across_replicas() {
    let cluster = EtcdCluster::start(3).await;
    let up = RecordingUpstream::start().await;
    let (a, b) = replicas(&cluster, "", &up, "").await;
    a_copy_holds_its_destination_alone(&a, &b, &up, KEY).await;
}

// ---------------------------------------------------------------- the holder's share

/// The holder's sequential writes of one token through one replica share
/// one record: the first write's transaction enters it through etcd, and
/// leaves it standing as the replica's share of the key; the next 19, each
/// within the share's linger (1 s) of the one before, join it with no
/// call to etcd. The cluster's revision (one per transaction that writes)
/// moves by the first write's transaction and the record's end, not by 20.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_holders_sequential_writes_through_one_replica_make_no_new_record() {
    const WRITES: usize = 20;
    let cluster = EtcdCluster::start(3).await;
    let up = RecordingUpstream::start().await;
    let a = replica(&cluster, "", &up, "").await;
    // The store adopted (its identity written): nothing else moves the revision.
    wait_writable(&a, true, Duration::from_secs(10)).await;

    let before = cluster.revision().await;
    let mut gaps = Vec::new();
    let mut last_answer: Option<Instant> = None;
    for i in 0..WRITES {
        if let Some(last) = last_answer {
            gaps.push(last.elapsed());
        }
        let r = put_answered(&a.url(KEY), 5, "five").await;
        assert_eq!(r.status, 200, "write {i} of token 5: {}", r.text());
        last_answer = Some(Instant::now());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let records = flight_records(&cluster, KEY).await;
    assert!(records.len() <= 1, "the holder's sequential writes left more than one record: {records:?}");
    // The share ends LINGER after its last write: its record goes.
    eventually("the share's record to end", Duration::from_secs(10), || async { in_flight(&cluster, KEY).await == 0 })
        .await;
    let after = cluster.revision().await;
    eprintln!("{WRITES} writes of token 5 through one replica: the revision went {before} -> {after}; gaps {gaps:?}");
    assert!(
        gaps.iter().all(|g| *g < Duration::from_millis(700)),
        "too slow a machine to tell: a gap between writes reached 700 ms (the share lingers 1 s): {gaps:?}"
    );
    assert!(
        after - before < 5,
        "{WRITES} sequential writes of one token through one replica moved etcd's revision by {} (from {before} \
         to {after}): they did not share one record",
        after - before
    );
    assert_eq!(tokens(&up, KEY), vec!["5"; WRITES]);
    assert_eq!(cluster.get(&mark_key(KEY)).await, Some(padded(5)));
}

/// A replica's raises of a key it holds take one etcd transaction each: the
/// decision is made on the mark the replica saw last and compared in the
/// transaction that commits it (no read first), and the replica's own idle
/// share of the key is taken over by the raise's record in that transaction
/// (no wait for it, no second record). 20 sequential raises through one
/// replica move etcd's revision by about one each (a read, a wait and the
/// share's delete would make three or more), and leave one record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replicas_raises_of_a_key_it_holds_take_one_transaction_each() {
    const RAISES: u64 = 20;
    let cluster = EtcdCluster::start(3).await;
    let up = RecordingUpstream::start().await;
    let a = replica(&cluster, "", &up, "").await;
    wait_writable(&a, true, Duration::from_secs(10)).await;
    // The first write reads the key: the replica has seen no mark of it.
    assert_eq!(put(&a.url(KEY), 1, "one").await.status, 200);

    let before = cluster.revision().await;
    for token in 2..=RAISES + 1 {
        let r = put_answered(&a.url(KEY), token, "raise").await;
        assert_eq!(r.status, 200, "raise to {token}: {}", r.text());
    }
    let after = cluster.revision().await;
    let records = flight_records(&cluster, KEY).await;
    eprintln!("{RAISES} raises through one replica: the revision went {before} -> {after}; records {records:?}");
    assert!(records.len() <= 1, "the replica's raises left more than one record: {records:?}");
    // Slack for a share that ended between two raises (a slow machine).
    assert!(
        after - before <= RAISES as i64 + 3,
        "{RAISES} sequential raises through one replica moved etcd's revision by {} (from {before} to {after}): \
         more than one transaction each",
        after - before
    );
    let sent: Vec<String> = (1..=RAISES + 1).map(|t| t.to_string()).collect();
    assert_eq!(tokens(&up, KEY), sent);
    assert_eq!(cluster.get(&mark_key(KEY)).await, Some(padded(RAISES + 1)));
}

/// Raises of many keys that come together through one replica are
/// committed together: one etcd transaction, each raise a nested
/// transaction of it, compared on its own. 64 writers each raise their own
/// key 4 times: the 256 raises move etcd's revision (one per transaction)
/// by far fewer than 256, every raise reaches the upstream in order, and
/// every mark is in etcd.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raises_that_come_together_through_one_replica_are_committed_in_batches() {
    const WRITERS: u64 = 64;
    const RAISES: u64 = 4;
    let cluster = EtcdCluster::start(3).await;
    let up = RecordingUpstream::start().await;
    let a = replica(&cluster, "", &up, "").await;
    wait_writable(&a, true, Duration::from_secs(10)).await;
    let key = |i: u64| format!("/objects/batch{i}");
    for i in 0..WRITERS {
        assert_eq!(put(&a.url(&key(i)), 1, "one").await.status, 200);
    }

    let before = cluster.revision().await;
    let writers: Vec<_> = (0..WRITERS)
        .map(|i| {
            let url = a.url(&key(i));
            tokio::spawn(async move {
                for token in 2..=RAISES + 1 {
                    let r = put_answered(&url, token, "raise").await;
                    assert_eq!(r.status, 200, "{url} raise to {token}: {}", r.text());
                }
            })
        })
        .collect();
    for writer in writers {
        writer.await.expect("a writer panicked");
    }
    let after = cluster.revision().await;
    let raises = (WRITERS * RAISES) as i64;
    eprintln!("{raises} raises of {WRITERS} keys through one replica: the revision went {before} -> {after}");
    assert!(
        after - before < raises / 2,
        "{raises} raises that came together moved etcd's revision by {} (from {before} to {after}): they were not \
         committed in batches",
        after - before
    );
    let sent: Vec<String> = (1..=RAISES + 1).map(|t| t.to_string()).collect();
    for i in 0..WRITERS {
        assert_eq!(tokens(&up, &key(i)), sent, "{}", key(i));
        assert_eq!(cluster.get(&mark_key(&key(i))).await, Some(padded(RAISES + 1)), "{}", key(i));
    }
}

/// One of the holder's writes of a stream, as its client saw it.
#[derive(Debug)]
struct Streamed {
    sent: Instant,
    done: Instant,
    status: u16,
    /// `X-Fencing-Token-Current`.
    current: Option<u64>,
    /// The problem's `waiting`.
    waiting: Option<u64>,
}

/// The holder streaming writes of `token` through `url` back to back, one
/// at a time, until `stop`: each write's answer, in `journal`.
fn stream_writes(
    url: String,
    token: u64,
    stop: Arc<AtomicBool>,
    journal: Arc<Mutex<Vec<Streamed>>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while !stop.load(Ordering::SeqCst) {
            let sent = Instant::now();
            let r = put_answered(&url, token, "streamed").await;
            let done = Instant::now();
            let status = r.status.as_u16();
            let (current, waiting) = if status == 200 {
                (None, None)
            } else {
                let p: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
                (r.header("x-fencing-token-current").and_then(|c| c.parse().ok()), p["waiting"].as_u64())
            };
            journal.lock().unwrap().push(Streamed { sent, done, status, current, waiting });
        }
    })
}

/// Replica A's holder streams token 5 back to back while a raise to 6 comes
/// through `raise_via_a` (A, the replica holding the share) or B: the raise
/// waits under `wait/`, every replica's watch sees it, A's share takes no
/// more writes and ends once its write in flight has ended, and the raise
/// goes well within its route's `queue_timeout` (5 s). The 5s sent after it
/// are refused (409, current 6); the upstream applied every 5 before the 6.
async fn a_raise_is_not_starved_by_a_streaming_holder(raise_via_a: bool) {
    let cluster = EtcdCluster::start(3).await;
    let up = RecordingUpstream::start().await;
    let (a, b) = replicas(&cluster, "", &up, "queue_timeout = \"5s\"").await;
    wait_writable(&a, true, Duration::from_secs(10)).await;
    wait_writable(&b, true, Duration::from_secs(10)).await;
    assert_eq!(put(&a.url(KEY), 5, "five").await.status, 200);

    let stop = Arc::new(AtomicBool::new(false));
    let journal: Arc<Mutex<Vec<Streamed>>> = Arc::default();
    let streamer = stream_writes(a.url(KEY), 5, stop.clone(), journal.clone());
    let ok = |journal: &Arc<Mutex<Vec<Streamed>>>| journal.lock().unwrap().iter().filter(|s| s.status == 200).count();
    eventually("the holder's stream to have 10 writes answered 200", Duration::from_secs(30), || async {
        ok(&journal) >= 10
    })
    .await;
    let streamed_before = ok(&journal);

    let (via, raiser) = if raise_via_a { ("A", &a) } else { ("B", &b) };
    let sent = Instant::now();
    let r = put_answered(&raiser.url(KEY), 6, "six").await;
    let six_done = Instant::now();
    let took = six_done - sent;
    eprintln!(
        "the raise to 6 through {via} was answered {} after {took:?}, the holder streaming 5 through A \
         ({streamed_before} writes of 5 answered 200 before it)",
        r.status
    );
    assert_eq!(
        r.status,
        200,
        "the raise to 6 through {via} was not let through after {took:?} while A's holder streamed 5: {}",
        r.text()
    );
    // The stream goes on a little: its next writes must be refused.
    let answered_at_six = journal.lock().unwrap().len();
    eventually("the holder's stream to have 5 writes answered after the raise", Duration::from_secs(30), || async {
        journal.lock().unwrap().iter().filter(|s| s.sent > six_done).count() >= 5
    })
    .await;
    stop.store(true, Ordering::SeqCst);
    streamer.await.unwrap();

    let journal = std::mem::take(&mut *journal.lock().unwrap());
    for s in &journal {
        match (s.status, s.current, s.waiting) {
            // The holder's share, or etcd, let it through.
            (200, ..) => assert!(s.sent < six_done, "a write of 5 sent after 6 was answered got 200: {s:?}"),
            // Refused while 6 waited, or after it raised the mark.
            (409, None, Some(6)) | (409, Some(6), None) => {}
            _ => panic!("a write of 5 in the stream was answered otherwise than 200 or 409 for 6: {s:?}"),
        }
        if s.sent > six_done {
            assert_eq!((s.status, s.current), (409, Some(6)), "a write of 5 sent after the raise to 6: {s:?}");
        }
    }
    let refused = journal.iter().filter(|s| s.status == 409).count();
    eprintln!(
        "the stream: {} writes, {} answered 200, {refused} refused; {answered_at_six} answered when 6 was",
        journal.len(),
        journal.len() - refused
    );
    assert_stale(&put(&a.url(KEY), 5, "five late").await, 6);

    // The upstream: every 5 (the first write, then the stream's 200s) before the 6.
    let applied = numeric_tokens(&up, KEY);
    let fives = 1 + journal.iter().filter(|s| s.status == 200).count();
    let mut expected = vec![5; fives];
    expected.push(6);
    assert_eq!(applied, expected, "the upstream applied other than every 5 answered 200, then the 6");
    assert_never_down(&up, KEY);
    assert!(up.overlaps().is_empty(), "writes of different tokens overlapped: {:?}", up.overlaps());
    let last_five = journal.iter().filter(|s| s.status == 200).map(|s| s.done).max();
    eprintln!("the last 5 was answered {:?} before 6 was", last_five.map(|t| six_done.saturating_duration_since(t)));
    eventually("the records to end", Duration::from_secs(10), || async { in_flight(&cluster, KEY).await == 0 }).await;
    assert_eq!(cluster.get(&mark_key(KEY)).await, Some(padded(6)));
}

/// A raise through replica B is not starved by replica A's holder streaming
/// the old token back to back (each write joining A's share of the key).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raise_through_another_replica_is_not_starved_by_the_holders_share() {
    a_raise_is_not_starved_by_a_streaming_holder(false).await;
}

/// The same with the raise through A itself, the replica whose share the
/// holder's stream joins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raise_through_the_sharing_replica_is_not_starved_by_its_own_share() {
    a_raise_is_not_starved_by_a_streaming_holder(true).await;
}

/// A write that holds its key alone through replica A while A holds a share
/// of the key goes only after the share's writes have ended: a COPY whose
/// destination is the key, with the share's own token (it must not join
/// the share), and a raise on a strict route whose fence key is the same
/// (two routes, one key per object). Neither overlaps the share's writes at
/// the upstream, nor do the share's next writes join them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_holding_the_key_alone_waits_for_the_sharing_replicas_writes() {
    let cluster = EtcdCluster::start(3).await;
    let up = RecordingUpstream::start().await;
    let routes = format!(
        "{}{}",
        route("objects", "/objects/", &up, "pattern = \"/objects/{name*}\"\nkey = \"{name}\""),
        route("strict", "/strict/", &up, "pattern = \"/strict/{name*}\"\nkey = \"{name}\"\nstrict = true"),
    );
    let a = Running::start(&config_text(&admin(), &etcd_store(&cluster, ""), &routes)).await;
    wait_writable(&a, true, Duration::from_secs(10)).await;
    let flights = format!("{PREFIX}flight/");
    let (object, strict) = ("/objects/a", "/strict/a");
    let applied = |path: &str| up.applied_for(path);

    // A's holder of 10: the first write leaves A's share of key "a"; two more
    // join it and are held at the upstream, under that one record.
    assert_eq!(put(&a.url(object), 10, "ten").await.status, 200);
    let gate = up.hold_next(object, 2);
    let tens: Vec<_> = (0..2).map(|_| spawn_put(a.url(object), 10, "ten again")).collect();
    gate.wait_arrivals(2).await;
    let records = cluster.keys_with_prefix(&flights).await;
    assert_eq!(records.len(), 1, "the holder's two writes through A did not join its share: {records:?}");

    // A COPY of the same token into the key holds it alone: it must not join.
    let copy_url = a.url("/objects/src");
    let copy = tokio::spawn(async move {
        send("COPY", &copy_url, &[("x-fencing-token", "10"), ("destination", object)], "").await
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!copy.is_finished(), "the COPY was answered while the share's writes were in flight: {:?}", copy.await);
    assert_eq!(
        seen_writes(&up, "/objects/src"),
        0,
        "the COPY reached the upstream while the share's writes were in flight"
    );
    gate.release();
    for ten in tens {
        assert_eq!(ten.await.unwrap().status, 200);
    }
    let copied = tokio::time::timeout(Duration::from_secs(30), copy).await.expect("the COPY was answered").unwrap();
    assert!(copied.status.is_success(), "{} {}", copied.status, copied.text());
    let shared_ended = applied(object).iter().map(|w| w.ended).max().unwrap();
    let copy_started = applied("/objects/src")[0].started;
    assert!(
        copy_started >= shared_ended,
        "the COPY reached the upstream {:?} before the share's last write ended",
        shared_ended - copy_started
    );

    // Again A's share of 10, one write held; a raise to 11 on the strict
    // route, same key, through A.
    assert_eq!(put(&a.url(object), 10, "ten").await.status, 200);
    let gate = up.hold(object);
    let ten = spawn_put(a.url(object), 10, "ten held");
    gate.wait_arrived().await;
    let eleven = spawn_put(a.url(strict), 11, "eleven");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !eleven.is_finished(),
        "the strict raise was answered while the share's write was in flight: {:?}",
        eleven.await
    );
    assert_eq!(
        seen_writes(&up, strict),
        0,
        "the strict raise reached the upstream while the share's write was in flight"
    );
    gate.release();
    assert_eq!(ten.await.unwrap().status, 200);
    let r =
        tokio::time::timeout(Duration::from_secs(30), eleven).await.expect("the strict raise was answered").unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let shared_ended = applied(object).iter().map(|w| w.ended).max().unwrap();
    let strict_started = applied(strict)[0].started;
    assert!(
        strict_started >= shared_ended,
        "the strict raise reached the upstream {:?} before the share's last write ended",
        shared_ended - strict_started
    );
    // The share is over: the holder of 10 is refused.
    assert_stale(&put(&a.url(object), 10, "ten late").await, 11);
    assert_eq!(tokens(&up, object), ["10", "10", "10", "10", "10"]);
    assert_eq!(tokens(&up, strict), ["11"]);
    assert!(up.overlaps().is_empty(), "writes of different tokens overlapped: {:?}", up.overlaps());
    eventually("the records to end", Duration::from_secs(10), || async { cluster.count_prefix(&flights).await == 0 })
        .await;
}

/// A raise through the fence API of replica B (pre-fencing, at lock
/// acquisition) while replica A holds a share of the key: A's holder's next write
/// of the old token must be refused (fence-api.md: "every later write below
/// it gets 409"), not join A's share of the old token. (A raise that only
/// compared and put the mark, with the shares watching `wait/` alone, let
/// it through: the stale-write checker on etcd found it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raise_through_the_fence_api_of_another_replica_ends_the_holders_share() {
    let cluster = EtcdCluster::start(3).await;
    let up = RecordingUpstream::start().await;
    let (a, b) = replicas(&cluster, "", &up, "").await;
    wait_writable(&a, true, Duration::from_secs(10)).await;
    let auth = bearer();
    let auth = [("authorization", auth.as_str())];

    // A's share of the key, token 5, stands for 1 s after each write.
    assert_eq!(put(&a.url(KEY), 5, "five").await.status, 200);
    assert_eq!(put(&a.url(KEY), 5, "five again").await.status, 200);
    let r = send("PUT", &fences_url(&b, KEY), &auth, json!({ "token": 6 }).to_string()).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(cluster.get(&mark_key(KEY)).await, Some(padded(6)));
    // The raise is acknowledged: the old holder's next write, through A, is stale.
    let r = put(&a.url(KEY), 5, "five after the raise").await;
    assert_eq!(
        r.status,
        409,
        "token 5 through A was answered {} after the fence API of B raised the key to 6 (the upstream applied {:?})",
        r.status,
        tokens(&up, KEY)
    );
    assert_stale(&r, 6);
    assert_eq!(tokens(&up, KEY), ["5", "5"]);
}

// ---------------------------------------------------------------- etcd faults

/// What a burst of writers saw: per request, when it was sent, its key, its
/// token and its outcome.
/// The problem's `detail` of a refusal (empty for a success) is kept too.
type Journal = Arc<Mutex<Vec<(Instant, usize, u64, &'static str, String)>>>;

/// Writers with increasing tokens per key through each of `urls` (one per
/// replica and key), until `stop`.
fn writers(
    bases: Vec<String>,
    keys: &'static [&'static str],
    stop: Arc<AtomicBool>,
    journal: Journal,
) -> Vec<tokio::task::JoinHandle<()>> {
    let counters: Arc<Vec<AtomicU64>> = Arc::new(keys.iter().map(|_| AtomicU64::new(1)).collect());
    let mut tasks = Vec::new();
    for base in bases {
        for (k, key) in keys.iter().enumerate() {
            let (url, stop, journal, counters) =
                (format!("{base}{key}"), stop.clone(), journal.clone(), counters.clone());
            tasks.push(tokio::spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    let token = counters[k].fetch_add(1, Ordering::SeqCst);
                    let sent = Instant::now();
                    let r = put_answered(&url, token, "burst").await;
                    let what = outcome(&r);
                    let detail = if what == "ok" {
                        String::new()
                    } else {
                        r.json()["detail"].as_str().unwrap_or("").to_string()
                    };
                    journal.lock().unwrap().push((sent, k, token, what, detail));
                    if what != "ok" {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }));
        }
    }
    tasks
}

/// Counts of outcomes in `journal` among requests sent from `since` to before `until`.
fn tally(journal: &Journal, since: Instant, until: Instant) -> HashMap<&'static str, usize> {
    let mut counts = HashMap::new();
    for (sent, _, _, what, _) in journal.lock().unwrap().iter() {
        if *sent >= since && *sent < until {
            *counts.entry(*what).or_default() += 1;
        }
    }
    counts
}

/// Waits until `journal` has `n` successes among requests sent after `since`;
/// fails after `within`.
async fn wait_successes(journal: &Journal, since: Instant, n: usize, within: Duration, what: &str) {
    let start = Instant::now();
    loop {
        let counts = tally(journal, since, Instant::now() + Duration::from_secs(3600));
        if counts.get("ok").copied().unwrap_or_default() >= n {
            return;
        }
        assert!(start.elapsed() < within, "{what}: fewer than {n} writes succeeded within {within:?}: {counts:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The etcd leader killed with -9 while writers with increasing tokens write
/// through two replicas: no stale write applied (the tokens applied per key
/// never go down, no two tokens overlap), every write answered 200, 409 or
/// 503, and writes succeed again once another member leads; from 5 s after
/// the election on, no write is refused for a call to the dead member.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_etcd_leader_killed_mid_burst_lets_no_stale_write_through() {
    const KEYS: &[&str] = &["/objects/k0", "/objects/k1"];
    let mut cluster = EtcdCluster::start(3).await;
    let up = RecordingUpstream::start().await;
    let (a, b) = replicas(&cluster, "", &up, FAULT_ROUTE).await;
    let stop = Arc::new(AtomicBool::new(false));
    let journal: Journal = Arc::default();
    let tasks = writers(vec![a.url(""), b.url("")], KEYS, stop.clone(), journal.clone());

    let began = Instant::now();
    wait_successes(&journal, began, 20, Duration::from_secs(30), "before the kill").await;
    let leader = cluster.leader().await;
    let killed = Instant::now();
    cluster.kill(leader);
    let new = cluster.wait_leader(Some(leader), Duration::from_secs(10)).await;
    let elected = Instant::now();
    eprintln!("member {new} leads {:?} after member {leader}, the leader, was killed", elected - killed);
    wait_successes(&journal, elected, 10, Duration::from_secs(30), "after the election").await;
    // Writes go on for 8 s after the election: the last 3 s tell whether the
    // store still calls the dead member.
    tokio::time::sleep((elected + Duration::from_secs(8)).saturating_duration_since(Instant::now())).await;
    stop.store(true, Ordering::SeqCst);
    for task in tasks {
        task.await.unwrap();
    }

    let settled = elected + Duration::from_secs(5);
    eprintln!("before the kill: {:?}", tally(&journal, began, killed));
    eprintln!("from the kill to the election: {:?}", tally(&journal, killed, elected));
    eprintln!("the first 5 s after the election: {:?}", tally(&journal, elected, settled));
    eprintln!("later: {:?}", tally(&journal, settled, Instant::now()));
    let phase = |sent: Instant| match sent {
        s if s < killed => "before the kill",
        s if s < elected => "before the election",
        s if s < settled => "in the 5 s after the election",
        _ => "later",
    };
    let mut refusals: HashMap<(&'static str, &'static str, String), usize> = HashMap::new();
    for (sent, _, _, what, detail) in journal.lock().unwrap().iter() {
        if *what != "ok" {
            *refusals.entry((phase(*sent), *what, detail.clone())).or_default() += 1;
        }
    }
    for ((when, what, detail), n) in &refusals {
        eprintln!("{n} × {what} {when}: {detail}");
    }
    for (k, key) in KEYS.iter().enumerate() {
        assert_never_down(&up, key);
        // What was forwarded is exactly what was answered 200.
        let mut ok: Vec<u64> = journal
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, key, _, what, _)| *key == k && *what == "ok")
            .map(|(_, _, token, _, _)| *token)
            .collect();
        ok.sort_unstable();
        let mut applied = numeric_tokens(&up, key);
        applied.sort_unstable();
        assert_eq!(applied, ok, "on {key}, the writes applied are not the writes answered 200");
    }
    assert!(up.overlaps().is_empty(), "writes of different tokens overlapped: {:?}", up.overlaps());
    // 5 s after the election, the two members left answer every call: no
    // write is refused for the store (a call sent to the dead member is
    // made again with the next).
    let late: Vec<_> =
        refusals.iter().filter(|((when, what, _), _)| *when == "later" && *what == "store-unavailable").collect();
    assert!(
        late.is_empty(),
        "more than 5 s after the election of member {new}, writes were still refused for the store: {late:?}"
    );
}

/// One writer with ever higher tokens through `fg` while member `frozen` is
/// frozen: every write is 200 or 503 (never stale: each token is above every
/// one before), a write succeeds within 20 s while the member is frozen (the
/// store's client fails over), then at least 8 of the next 10 (the member
/// still frozen), and one within 20 s after it is thawed.
async fn writes_go_on_while_a_member_is_frozen(
    cluster: &mut EtcdCluster,
    frozen: usize,
    fg: &Running,
    up: &RecordingUpstream,
) {
    let url = fg.url(KEY);
    let mut token = 1;
    let mut outcomes: Vec<(Duration, u64, &'static str)> = Vec::new();
    let write = |token: u64| {
        let url = url.clone();
        async move { outcome(&put_answered(&url, token, "write").await) }
    };
    assert_eq!(write(token).await, "ok");

    cluster.stop(frozen);
    let froze = Instant::now();
    // Writes while frozen: at least one succeeds within 20 s; then more for 2 s.
    let mut first_ok = None;
    while first_ok.is_none_or(|t: Duration| froze.elapsed() < t + Duration::from_secs(2)) {
        token += 1;
        let what = write(token).await;
        outcomes.push((froze.elapsed(), token, what));
        assert_ne!(what, "stale", "token {token}, above every token before, was refused as stale: {outcomes:?}");
        if what == "ok" && first_ok.is_none() {
            first_ok = Some(froze.elapsed());
        }
        assert!(
            first_ok.is_some() || froze.elapsed() < Duration::from_secs(20),
            "no write succeeded within 20 s of member {frozen} freezing: {outcomes:?}\n{}",
            fg.output()
        );
        if what != "ok" {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    eprintln!("member {frozen} frozen: the first write succeeded after {first_ok:?}; {outcomes:?}");
    // Failed over: the next 10 writes, the member still frozen, nearly all
    // succeed (2 refusals allowed for a loaded machine). A client that still
    // sends a share of its calls to the frozen member fails about half.
    let mut failed_over = Vec::new();
    for _ in 0..10 {
        token += 1;
        let what = write(token).await;
        assert_ne!(what, "stale", "token {token}, above every token before, was refused as stale");
        failed_over.push((froze.elapsed(), token, what));
    }
    let ok = failed_over.iter().filter(|(_, _, what)| *what == "ok").count();
    eprintln!("member {frozen} frozen, after the fail-over: {failed_over:?}");

    // The tokens answered 200: exactly what reaches the upstream.
    let mut answered_ok: Vec<u64> = std::iter::once(1)
        .chain(outcomes.iter().chain(&failed_over).filter(|(_, _, what)| *what == "ok").map(|(_, t, _)| *t))
        .collect();
    cluster.cont(frozen);
    let thawed = Instant::now();
    outcomes.clear();
    loop {
        token += 1;
        let what = write(token).await;
        outcomes.push((thawed.elapsed(), token, what));
        assert_ne!(what, "stale", "token {token} was refused as stale after the thaw: {outcomes:?}");
        if what == "ok" {
            answered_ok.push(token);
            break;
        }
        assert!(
            thawed.elapsed() < Duration::from_secs(20),
            "no write succeeded within 20 s of member {frozen} thawing: {outcomes:?}\n{}",
            fg.output()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_never_down(up, KEY);
    assert_eq!(numeric_tokens(up, KEY), answered_ok, "the writes applied are not the writes answered 200");
    assert!(up.overlaps().is_empty(), "writes of different tokens overlapped: {:?}", up.overlaps());
    assert!(
        ok >= 8,
        "member {frozen} frozen: only {ok} of 10 writes succeeded after the store's first success \
         {first_ok:?} after the freeze: {failed_over:?}\n{}",
        fg.output()
    );
}

/// The leader frozen with SIGSTOP (a pause, not a crash: its sockets stay
/// open): writes go on once another member leads, never stale.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_etcd_leader_lets_writes_go_on_after_the_election() {
    let mut cluster = EtcdCluster::start(3).await;
    let up = RecordingUpstream::start().await;
    let a = replica(&cluster, "", &up, FAULT_ROUTE).await;
    let leader = cluster.leader().await;
    writes_go_on_while_a_member_is_frozen(&mut cluster, leader, &a, &up).await;
}

/// A follower frozen that is the replica's first endpoint: the replica's
/// client fails over to the others, never stale.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_follower_first_in_the_endpoints_is_failed_over() {
    let mut cluster = EtcdCluster::start(3).await;
    let up = RecordingUpstream::start().await;
    let leader = cluster.leader().await;
    let follower = (leader + 1) % 3;
    let mut endpoints = vec![cluster.endpoint(follower)];
    endpoints.extend((0..3).filter(|&i| i != follower).map(|i| cluster.endpoint(i)));
    let a = replica_at(&endpoints, &up, FAULT_ROUTE).await;
    writes_go_on_while_a_member_is_frozen(&mut cluster, follower, &a, &up).await;
}

/// Two of three members killed (the leader among them): fenced writes 503
/// store-unavailable at once, nothing forwarded; a token below a mark the
/// replica saw is still 409; reads flow; `/readyz` 200 and its verbose body
/// names the store refusing writes. The members restarted: writes resume
/// without restarting fencegate, the mark intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_lost_fails_closed_and_quorum_back_resumes() {
    quorum_lost_for(Duration::ZERO).await;
}

/// The same with the quorum lost for longer than the replicas' etcd lease
/// TTL (7 s with these routes): the cluster keeps its leases through the
/// outage (a new leader renews them), and the replicas take writes again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_lost_longer_than_the_lease_ttl_resumes() {
    quorum_lost_for(Duration::from_secs(10)).await;
}

/// Two members of three killed; `outage` later (at least the checks' time)
/// restarted.
async fn quorum_lost_for(outage: Duration) {
    let mut cluster = EtcdCluster::start(3).await;
    let up = RecordingUpstream::start().await;
    let (a, b) = replicas(&cluster, "", &up, FAULT_ROUTE).await;
    wait_writable(&a, true, Duration::from_secs(10)).await;
    wait_writable(&b, true, Duration::from_secs(10)).await;
    assert_eq!(put(&a.url(KEY), 5, "five").await.status, 200);
    eventually("the write's record to end", Duration::from_secs(10), || async { in_flight(&cluster, KEY).await == 0 })
        .await;

    let leader = cluster.leader().await;
    let follower = (leader + 1) % 3;
    cluster.kill(leader);
    cluster.kill(follower);
    let lost = Instant::now();

    for fg in [&a, &b] {
        let start = Instant::now();
        let r = put_answered(&fg.url(KEY), 6, "six").await;
        let took = start.elapsed();
        assert_store_unavailable(&r);
        assert!(took < Duration::from_secs(10), "the refusal took {took:?} (the store's timeout is 1s)");
    }
    wait_writable(&a, false, Duration::from_secs(10)).await;
    wait_writable(&b, false, Duration::from_secs(10)).await;
    eprintln!("fencegate_store_writable 0 on both {:?} after the quorum was lost", lost.elapsed());
    assert_eq!(get(&a.admin_url("/readyz")).await.status, 200, "no quorum took the replica out of service");
    let why = refusing(&a).await.expect("/readyz?verbose names the store refusing writes");
    eprintln!("A refuses writes: {why}");
    assert!(refusing(&b).await.is_some(), "B's /readyz?verbose does not name the store refusing writes");

    // B never saw the mark: it cannot tell, so it fails closed.
    assert_store_unavailable(&put_answered(&b.url(KEY), 4, "four").await);
    // A saw 5: below it is stale without asking etcd.
    assert_stale(&put_answered(&a.url(KEY), 4, "four").await, 5);
    assert_store_unavailable(&put_answered(&a.url("/objects/other"), 1, "other").await);
    assert_eq!(seen_writes(&up, KEY), 1, "a write reached the upstream without a quorum");
    assert_eq!(seen_writes(&up, "/objects/other"), 0, "a write reached the upstream without a quorum");
    // Safe methods pass.
    let r = get(&b.url(KEY)).await;
    assert_eq!((r.status.as_u16(), r.text()), (200, "five".to_string()));

    tokio::time::sleep(outage.saturating_sub(lost.elapsed())).await;
    cluster.restart(leader).await;
    cluster.restart(follower).await;
    cluster.wait_quorum().await;
    wait_writable(&a, true, Duration::from_secs(30)).await;
    wait_writable(&b, true, Duration::from_secs(30)).await;
    // The mark is intact: B, which never saw it, refuses below it. (A refused
    // 6 may have raised it, nothing forwarded.)
    let r = put_answered(&b.url(KEY), 4, "four").await;
    r.problem(409);
    let current: u64 = r.header("x-fencing-token-current").unwrap().parse().unwrap();
    assert!((5..=6).contains(&current), "mark {current} after the quorum came back: A saw 5, and 6 was refused");
    let start = Instant::now();
    let r = loop {
        let r = put_answered(&b.url(KEY), 7, "seven").await;
        if r.status != 503 || start.elapsed() > Duration::from_secs(30) {
            break r;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(r.status, 200, "{}", r.text());
    assert_stale(&put_answered(&a.url(KEY), 6, "six").await, 7);
    assert_eq!(tokens(&up, KEY), ["5", "7"]);
}

// ---------------------------------------------------------------- a replica that dies

/// A replica killed with -9 mid-write leaves its record in etcd, on its
/// lease; other replicas' raises of the key wait for it (503 past their
/// queue_timeout) at least the write's lease (2 × 1s + 2 × 1s + 500ms =
/// 4.5 s after it was sent), and at most about the replica's lease TTL
/// (4.5 s rounded up, + 1 s = 6 s) + 2 s after the replica died.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_replicas_write_holds_the_key_until_its_lease_ends() {
    const TTL: Duration = Duration::from_secs(6);
    let cluster = EtcdCluster::start(3).await;
    let up = RecordingUpstream::start().await;
    let limits = "timeout = \"1s\"\nsettle = \"500ms\"\nqueue_timeout = \"1s\"";
    let mut a = replica(&cluster, "", &up, limits).await;
    let b = replica(&cluster, "", &up, limits).await;

    let gate = up.hold(KEY);
    let sent = Instant::now();
    let five = spawn_put_may_break(a.url(KEY), 5);
    gate.wait_arrived().await;
    a.kill();
    let died = Instant::now();
    let _ = five.await;
    // The write A forwarded lands after A died.
    gate.release();
    eventually("5 applied", Duration::from_secs(5), || async { tokens(&up, KEY) == ["5"] }).await;
    // B's queue_timeout (1s) is shorter than what is left of the lease.
    let r = put(&b.url(KEY), 6, "six").await;
    assert!(sent.elapsed() < Duration::from_millis(4400), "too slow a machine to tell: {:?}", sent.elapsed());
    assert_eq!(r.problem(503)["type"], "urn:fencegate:problem:queue-timeout");
    assert_eq!(seen_writes(&up, KEY), 1, "token 6 went while A's record stood");
    let records = flight_records(&cluster, KEY).await;
    assert_eq!(records.len(), 1, "A's record is not in etcd: {records:?}");
    let lease = cluster.lease_of(&records[0]).await.unwrap_or_default();
    assert_ne!(lease, 0, "A's record {} is on no lease", records[0]);
    assert_eq!(cluster.lease_granted_ttl(lease).await, TTL.as_secs() as i64, "the TTL of A's lease {lease:x}");

    let mut refused = 1;
    loop {
        let r = put_answered(&b.url(KEY), 6, "six").await;
        if r.status == 200 {
            break;
        }
        assert_eq!(r.problem(503)["type"], "urn:fencegate:problem:queue-timeout");
        refused += 1;
        assert!(refused < 20, "token 6 never went after A's lease (the record: {records:?})");
    }
    let six = &up.applied_for(KEY)[1];
    let after_sent = six.started.duration_since(sent);
    let after_death = six.started.duration_since(died);
    eprintln!("token 6 reached the upstream {after_sent:?} after A's write was sent, {after_death:?} after A died");
    assert!(
        after_sent >= Duration::from_millis(4400),
        "token 6 reached the upstream {after_sent:?} after A's write, before its lease (4.5 s) ended"
    );
    assert!(
        after_death < TTL + Duration::from_secs(3),
        "token 6 went only {after_death:?} after A died (A's lease TTL is {TTL:?}, + 2 s, + 1 s for B's wait)"
    );
    // B's own write of 6 may still stand as its share of the key; A's record is gone.
    let left = flight_records(&cluster, KEY).await;
    assert!(!left.contains(&records[0]), "A's record outlived its lease: {left:?}");
    assert_eq!(put(&b.url(KEY), 7, "seven").await.status, 200);
    assert_eq!(tokens(&up, KEY), ["5", "6", "7"]);
    assert!(up.overlaps().is_empty());
}

// ---------------------------------------------------------------- a cluster replaced

/// Route limits that keep a write's lease short: a confirm holds fenced
/// writes for the longest lease and a second (2 × 500ms + 2 × 2s + 2s of
/// settle + 1s: 8s).
const SHORT_LEASE: &str = "timeout = \"2s\"\nqueue_timeout = \"500ms\"";

/// The cluster restored from a snapshot taken before a raise (same cluster
/// id, an older revision, the raise gone): every replica distrusts it (no
/// write below the lost mark forwarded; `/readyz?verbose` names it) until
/// an operator confirms; then the mark the replica remembers is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_restored_from_an_older_snapshot_is_refused_until_confirmed() {
    let mut cluster = EtcdCluster::start(3).await;
    let up = RecordingUpstream::start().await;
    let (a, b) = replicas(&cluster, "", &up, SHORT_LEASE).await;
    assert_eq!(put(&a.url(KEY), 5, "five").await.status, 200);
    let dir = TempDir::new();
    let snapshot = dir.path().join("before.db");
    cluster.snapshot_save(&snapshot).await;
    // After the snapshot: the mark goes to 7, and other keys move the revision on.
    assert_eq!(put(&a.url(KEY), 7, "seven").await.status, 200);
    for i in 0..5 {
        assert_eq!(put(&b.url(&format!("/objects/more{i}")), 1, "one").await.status, 200);
    }
    let old_id = cluster.cluster_id().await;

    cluster.restore_from_snapshot(&snapshot).await;
    assert_eq!(cluster.cluster_id().await, old_id, "a restore with the same token keeps the cluster id");
    assert_eq!(cluster.get(&mark_key(KEY)).await, Some(padded(5)), "the snapshot has the older mark");
    // Token 6 is stale (A applied 7) but above the restored mark: never forwarded.
    // A saw 7: it refuses 6 itself. B never saw 7: etcd has 5, so B is
    // refused by the store (the restored cluster answers below B's
    // revisions, or the restored record of A's write 5 holds the key).
    assert_stale(&put_answered(&a.url(KEY), 6, "six").await, 7);
    let r = put_answered(&b.url(KEY), 6, "six").await;
    assert_eq!(r.status.as_u16(), 503, "{}", r.text());
    assert_eq!(tokens(&up, KEY), ["5", "7"], "a token below the lost mark reached the upstream");
    for fg in [&a, &b] {
        wait_writable(fg, false, Duration::from_secs(10)).await;
        let why = refusing(fg).await.unwrap_or_default();
        assert!(
            ["revision", "mark", "deletions", "lease", "identity"].iter().any(|w| why.contains(w)),
            "/readyz?verbose does not name the restored store: {why:?}"
        );
    }

    let auth = bearer();
    let r = confirm(&a, Some(&auth)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    wait_confirmed(&cluster, &[&a, &b]).await;
    // A remembered 7: it is back in etcd, and 6 stays stale.
    assert_eq!(cluster.get(&mark_key(KEY)).await, Some(padded(7)));
    assert_stale(&put(&b.url(KEY), 6, "six").await, 7);
    let r = put(&b.url(KEY), 8, "eight").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(tokens(&up, KEY), ["5", "7", "8"]);
}

/// The cluster replaced by a brand-new one on the same URLs (another cluster
/// id, revisions starting over, no marks): every replica distrusts it (no
/// write forwarded, a token below a mark seen included; `/readyz?verbose`
/// naming it) until an operator confirms; then the marks the replicas
/// remember are back in etcd and writes flow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_cluster_is_refused_until_an_operator_confirms_it() {
    let mut cluster = EtcdCluster::start(3).await;
    let up = RecordingUpstream::start().await;
    let (a, b) = replicas(&cluster, "", &up, SHORT_LEASE).await;
    // A remembers /objects/a at 5, B remembers /objects/b at 3.
    assert_eq!(put(&a.url(KEY), 5, "five").await.status, 200);
    assert_eq!(put(&b.url("/objects/b"), 3, "three").await.status, 200);
    let old_id = cluster.cluster_id().await;

    cluster.replace_with_new_cluster().await;
    assert_ne!(cluster.cluster_id().await, old_id);
    // At once: B never saw /objects/a's mark, and the new cluster has none:
    // a stale token must not go through B.
    let r = put_answered(&b.url(KEY), 4, "stale via B").await;
    assert!(
        !tokens(&up, KEY).contains(&"4".to_string()),
        "token 4 reached the upstream through B after A applied 5 ({} {}); B refusing: {:?}",
        r.status,
        r.text(),
        refusing(&b).await
    );
    assert_store_unavailable(&r);
    // A saw 5: it refuses 4 itself.
    assert_stale(&put_answered(&a.url(KEY), 4, "stale via A").await, 5);

    for fg in [&a, &b] {
        wait_writable(fg, false, Duration::from_secs(10)).await;
        let why = refusing(fg).await.unwrap_or_default();
        eprintln!("{} refuses writes: {why}", fg.pid());
        assert!(
            // The identity gone, another cluster id, or the replica's lease unknown to it.
            ["cluster", "identity", "revision", "lease"].iter().any(|w| why.contains(w)),
            "/readyz?verbose does not name the replaced cluster: {why:?}"
        );
    }
    for fg in [&a, &b] {
        assert_store_unavailable(&put_answered(&fg.url(KEY), 6, "six").await);
        assert_store_unavailable(&put_answered(&fg.url("/objects/b"), 4, "four").await);
        assert_store_unavailable(&put_answered(&fg.url("/objects/c"), 1, "new key").await);
    }
    assert_eq!(seen_writes(&up, KEY), 1, "a write reached the upstream through a replaced cluster");
    assert_eq!(seen_writes(&up, "/objects/b"), 1);
    assert_eq!(seen_writes(&up, "/objects/c"), 0);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(refusing(&a).await.is_some(), "A trusted the replaced cluster again on its own");
    // Reads flow.
    assert_eq!(get(&b.url(KEY)).await.status, 200);

    // Confirming needs the admin token.
    assert_eq!(confirm(&a, None).await.status, 401);
    assert_eq!(confirm(&a, Some("Bearer wrong")).await.status, 401);
    assert_store_unavailable(&put_answered(&a.url(KEY), 6, "six").await);

    let r = confirm(&a, Some(&bearer())).await;
    assert_eq!(r.status, 200, "{}", r.text());
    eprintln!("confirmed: {}", r.text());
    // B adopts the confirmed store after raising its own remembered marks.
    wait_confirmed(&cluster, &[&a, &b]).await;
    assert!(cluster.get(&format!("{PREFIX}identity")).await.is_some(), "no identity in the confirmed cluster");
    assert_eq!(cluster.get(&mark_key(KEY)).await, Some(padded(5)), "A did not restore its mark");
    assert_eq!(cluster.get(&mark_key("/objects/b")).await, Some(padded(3)), "B did not restore its mark");

    // The old marks are back: B never saw /objects/a, A never saw /objects/b.
    assert_stale(&put(&b.url(KEY), 4, "four").await, 5);
    assert_stale(&put(&a.url("/objects/b"), 2, "two").await, 3);
    assert_eq!(put(&a.url(KEY), 6, "six").await.status, 200);
    assert_eq!(put(&b.url(KEY), 7, "seven").await.status, 200);
    assert_eq!(put(&b.url("/objects/c"), 1, "one").await.status, 200);
    assert_eq!(tokens(&up, KEY), ["5", "6", "7"]);
    assert_eq!(tokens(&up, "/objects/b"), ["3"]);
}

/// The same on a one-member cluster, confirmed with the CLI
/// (`fencegate fence confirm-store`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_cluster_is_confirmed_with_the_cli() {
    let mut cluster = EtcdCluster::start(1).await;
    let up = RecordingUpstream::start().await;
    let (a, b) = replicas(&cluster, "", &up, SHORT_LEASE).await;
    assert_eq!(put(&a.url(KEY), 5, "five").await.status, 200);
    assert_eq!(put(&b.url("/objects/b"), 1, "one").await.status, 200);

    cluster.replace_with_new_cluster().await;
    // B's next write tells it, if its check has not yet: another cluster id.
    assert_store_unavailable(&put_answered(&b.url("/objects/b"), 2, "two").await);
    wait_writable(&a, false, Duration::from_secs(10)).await;
    wait_writable(&b, false, Duration::from_secs(10)).await;
    assert_store_unavailable(&put_answered(&b.url(KEY), 6, "six").await);
    assert_store_unavailable(&put_answered(&b.url(KEY), 4, "four").await);
    assert_eq!(seen_writes(&up, KEY), 1);

    let dir = TempDir::new();
    let cli_config = dir.write(
        "cli.toml",
        &format!(
            "[admin]\nlisten = \"{}\"\n{}\n{}[[route]]\nname = \"o\"\nprefix = \"/\"\nupstream = \"http://127.0.0.1:9\"\n",
            a.admin,
            admin(),
            etcd_store(&cluster, "")
        ),
    );
    let out = run_to_exit(fencegate(dir.path()).arg("--config").arg(&cli_config).args(["fence", "confirm-store"]));
    assert!(out.status.success(), "confirm-store failed: {}{}", text(&out.stdout), text(&out.stderr));
    assert!(text(&out.stdout).contains("confirmed"), "{}", text(&out.stdout));

    wait_confirmed(&cluster, &[&a, &b]).await;
    assert_stale(&put(&b.url(KEY), 4, "four").await, 5);
    assert_eq!(put(&b.url(KEY), 6, "six").await.status, 200);
    assert_eq!(tokens(&up, KEY), ["5", "6"]);
}

/// The cluster answering a mark below one this replica saw (an operator's
/// put, as a bad restore would): the replica distrusts it until confirmed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mark_below_one_seen_makes_the_replica_distrust_the_cluster() {
    let cluster = EtcdCluster::start(3).await;
    let up = RecordingUpstream::start().await;
    let (a, b) = replicas(&cluster, "", &up, SHORT_LEASE).await;
    assert_eq!(put(&a.url(KEY), 5, "five").await.status, 200);

    cluster.put(&mark_key(KEY), &padded(1)).await;
    assert_store_unavailable(&put_answered(&a.url(KEY), 6, "six").await);
    assert!(refusing(&a).await.is_some(), "A trusts a store that lost a mark");
    assert_store_unavailable(&put_answered(&a.url("/objects/other"), 1, "other").await);
    assert_eq!(seen_writes(&up, KEY), 1, "a write went through a store that lost marks");

    let r = confirm(&a, Some(&bearer())).await;
    assert_eq!(r.status, 200, "{}", r.text());
    wait_confirmed(&cluster, &[&a, &b]).await;
    let r = put(&b.url(KEY), 4, "four").await;
    r.problem(409);
    let current: u64 = r.header("x-fencing-token-current").unwrap().parse().unwrap();
    assert!((5..=6).contains(&current), "mark {current} after the confirm: A saw 5, and was refused 6");
    assert_eq!(put(&a.url(KEY), 6, "six").await.status, 200);
    assert_eq!(tokens(&up, KEY), ["5", "6"]);
}

// ---------------------------------------------------------------- fence API

/// The fence API reads and changes the shared marks, through any replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fence_api_works_on_the_etcd_store() {
    let cluster = EtcdCluster::start(3).await;
    let up = RecordingUpstream::start().await;
    let (a, b) = replicas(&cluster, "", &up, "").await;
    let auth = bearer();
    let auth = [("authorization", auth.as_str())];

    let r = send("PUT", &fences_url(&a, KEY), &auth, json!({ "token": 7 }).to_string()).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(cluster.get(&mark_key(KEY)).await, Some(padded(7)));
    let r = get(&fences_url(&b, KEY)).await;
    assert_eq!(r.json(), json!({ "key": KEY, "token": 7 }));
    assert_stale(&put(&b.url(KEY), 6, "six").await, 7);
    assert_eq!(seen_writes(&up, KEY), 0);
    // A lower raise changes nothing.
    let r = send("PUT", &fences_url(&b, KEY), &auth, json!({ "token": 3 }).to_string()).await;
    assert_eq!(r.status, 409, "{}", r.text());
    assert_eq!(cluster.get(&mark_key(KEY)).await, Some(padded(7)));
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
    assert_eq!(cluster.get(&mark_key(KEY)).await, None, "the mark is still in etcd");
    assert_eq!(get(&fences_url(&b, KEY)).await.json()["token"], Value::Null);
    assert_eq!(put(&a.url(KEY), 1, "one").await.status, 200);
    // B remembered 8: it forgets once it sees the deletion.
    eventually("B to accept token 1 after the delete", Duration::from_secs(5), || async {
        let r = put(&b.url(KEY), 1, "one via B").await;
        assert!([200, 409].contains(&r.status.as_u16()), "{}", r.text());
        r.status == 200
    })
    .await;
    assert_eq!(tokens(&up, KEY), ["8", "1", "1"]);
    assert_eq!(get(&fences_url(&a, "/objects/z")).await.json()["token"], 2);
}

/// After a confirmation, each replica that takes the confirmed store
/// lengthens the hold to its own longest write lease when the hold in the
/// store ends sooner (as on Redis), and raises back every mark it remembers,
/// many to a transaction. A confirms with 2 s routes; B, with 9 s routes and
/// 150 marks remembered, lengthens the hold's lease past 10 s and brings its
/// marks back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_with_longer_leases_lengthens_the_hold_after_a_confirmation() {
    const KEYS: u64 = 150;
    let mut cluster = EtcdCluster::start(1).await;
    let up = RecordingUpstream::start().await;
    let a = replica(&cluster, "", &up, SHORT_LEASE).await;
    let b = replica(&cluster, "", &up, "timeout = \"9s\"\nqueue_timeout = \"500ms\"").await;
    assert_eq!(put(&a.url(KEY), 5, "five").await.status, 200);
    let key = |i: u64| format!("/objects/many{i}");
    for i in 0..KEYS {
        assert_eq!(put(&b.url(&key(i)), i + 1, "one").await.status, 200);
    }
    cluster.replace_with_new_cluster().await;
    for fg in [&a, &b] {
        wait_writable(fg, false, Duration::from_secs(10)).await;
    }
    let r = confirm(&a, Some(&bearer())).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let held = format!("{PREFIX}held");
    let lease = cluster.lease_of(&held).await.expect("the confirmation holds writes");
    let confirmers = cluster.lease_granted_ttl(lease).await;
    assert!(confirmers < 10, "A's hold ({confirmers} s) is already as long as B's routes: the test tells nothing");
    eventually("B to lengthen the hold to its own leases", Duration::from_secs(10), || async {
        match cluster.lease_of(&held).await {
            Some(lease) if lease != 0 => cluster.lease_granted_ttl(lease).await >= 10,
            _ => false,
        }
    })
    .await;
    wait_confirmed(&cluster, &[&a, &b]).await;
    for i in 0..KEYS {
        assert_eq!(cluster.get(&mark_key(&key(i))).await, Some(padded(i + 1)), "B did not restore {}", key(i));
    }
    assert_stale(&put(&a.url(&key(7)), 1, "stale").await, 8);
    assert_eq!(cluster.get(&mark_key(KEY)).await, Some(padded(5)));
}

/// Two replicas each hold an idle share of the old token when the new
/// holder's first writes come through both at once: each takes its own
/// share for the raise, and finds the other's record. Neither keeps its
/// share while it waits (kept, each would wait for the other's until the
/// queue timeout): both writes go, the mark is the new token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raises_through_two_replicas_that_both_hold_a_share_do_not_wait_on_each_other() {
    let cluster = EtcdCluster::start(3).await;
    let up = RecordingUpstream::start().await;
    let (a, b) = replicas(&cluster, "", &up, "timeout = \"5s\"\nqueue_timeout = \"3s\"").await;
    for round in 0..3u64 {
        let old = 5 + 2 * round;
        // Both shares stand (each lingers 1 s: written again until both do).
        for _ in 0..10 {
            assert_eq!(put(&a.url(KEY), old, "old").await.status, 200);
            assert_eq!(put(&b.url(KEY), old, "old").await.status, 200);
            if flight_records(&cluster, KEY).await.len() == 2 {
                break;
            }
        }
        assert_eq!(flight_records(&cluster, KEY).await.len(), 2, "both replicas hold a share of {old}");
        let (ua, ub) = (a.url(KEY), b.url(KEY));
        let (ra, rb) = tokio::join!(put_answered(&ua, old + 1, "new"), put_answered(&ub, old + 1, "new"));
        // Kept shares would wait for each other until the queue timeout (3 s): 503.
        assert_eq!((ra.status.as_u16(), rb.status.as_u16()), (200, 200), "{} / {}", ra.text(), rb.text());
        assert_eq!(cluster.get(&mark_key(KEY)).await, Some(padded(old + 1)));
        assert!(up.overlaps().is_empty(), "writes of different tokens overlapped: {:?}", up.overlaps());
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }
    assert_never_down(&up, KEY);
}
