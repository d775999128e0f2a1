//! The lease API (`/leases` on the admin listener): every call on every
//! store, scoped bearer tokens, two replicas on one shared store, a kill -9
//! during acquisitions, and the lease as advice with the fence as the
//! guarantee.

use crate::common;

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{json, Value};

use common::etcd::*;
use common::process::*;
use common::redis::*;
use common::*;

const SECRET: &str = "lease-admin-secret";
const SCOPED: &str = "jobs-only-token";
const KEY: &str = "/objects/a";

fn admin() -> String {
    format!(
        "auth_token = {}\n[[admin.lease_tokens]]\ntoken = {}\nprefixes = [\"/objects/jobs/\"]\n",
        toml_string(SECRET),
        toml_string(SCOPED)
    )
}

fn objects(up: &RecordingUpstream) -> String {
    route("objects", "/objects/", up, "")
}

fn leases_url(admin_base: &str, key: &str) -> String {
    format!("{admin_base}/leases?key={}", enc(key))
}

async fn call(method: &str, url: &str, token: &str, body: Value) -> Reply {
    let auth = format!("Bearer {token}");
    send(method, url, &[("authorization", &auth), ("content-type", "application/json")], body.to_string()).await
}

async fn acquire(url: &str, holder: &str, ttl: &str) -> Reply {
    call("POST", url, SECRET, json!({ "holder": holder, "ttl": ttl })).await
}

/// The token of a granted lease, checked for its shape.
fn granted(r: &Reply, key: &str, holder: &str) -> u64 {
    assert_eq!(r.status, 200, "{}", r.text());
    let body = r.json();
    assert_eq!((body["key"].as_str(), body["holder"].as_str()), (Some(key), Some(holder)), "{body}");
    assert!(body["expires_in_ms"].as_u64().unwrap() > 0, "{body}");
    assert!(body["expires_at_ms"].as_u64().unwrap() > 1_600_000_000_000, "{body}");
    body["token"].as_u64().unwrap()
}

/// Every lease call, its refusals, and the fence they raise, through
/// `admin_base` and the proxy at `proxy`.
async fn contract(admin_base: &str, proxy: &dyn Fn(&str) -> String, up: &RecordingUpstream) {
    let url = leases_url(admin_base, KEY);
    // A write with a token of its own came first: the lease goes above it.
    assert_eq!(put(&proxy(KEY), 40, "v40").await.status, 200);
    let shown = get(&url).await;
    assert_eq!(shown.json(), json!({ "key": KEY, "lease": null, "mark": 40 }));

    let a = granted(&acquire(&url, "worker-a", "30s").await, KEY, "worker-a");
    assert_eq!(a, 41);
    let shown = get(&url).await.json();
    assert_eq!((shown["lease"]["holder"].as_str(), shown["lease"]["token"].as_u64()), (Some("worker-a"), Some(41)));
    assert_eq!(shown["mark"], 41, "the mark is the holder's token before its first write");
    // The old writer is fenced before the holder wrote anything.
    assert_stale(&put(&proxy(KEY), 40, "late").await);

    // Held: 423 with who holds it and until when, whoever asks.
    for holder in ["worker-b", "worker-a"] {
        let r = acquire(&url, holder, "30s").await;
        let p = r.problem(423);
        assert_eq!(p["type"], "urn:fencegate:problem:lease-held", "{p}");
        assert_eq!((p["holder"].as_str(), p["token"].as_u64()), (Some("worker-a"), Some(41)), "{p}");
        assert!(p["expires_in_ms"].as_u64().unwrap() > 25_000, "{p}");
        let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
        assert!((26..=30).contains(&retry), "Retry-After {retry}");
    }

    // The holder writes with its token.
    assert_eq!(put(&proxy(KEY), a, "by-a").await.status, 200);

    // Renewal: the holder's token only.
    let r = call("PUT", &url, SECRET, json!({ "token": a, "ttl": "60s" })).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.json()["expires_in_ms"].as_u64().unwrap() > 55_000);
    let p = call("PUT", &url, SECRET, json!({ "token": a + 1, "ttl": "60s" })).await.problem(409);
    assert_eq!(p["type"], "urn:fencegate:problem:lease-lost", "{p}");
    assert_eq!(p["lease"]["holder"], "worker-a", "{p}");
    let p = call("DELETE", &url, SECRET, json!({ "token": a - 1 })).await.problem(409);
    assert_eq!(p["type"], "urn:fencegate:problem:lease-lost", "{p}");

    // Release: the mark stays; the next lease goes above it.
    let r = call("DELETE", &url, SECRET, json!({ "token": a })).await;
    assert_eq!(r.json(), json!({ "key": KEY, "released": true, "token": a }), "{}", r.text());
    assert_eq!(get(&url).await.json(), json!({ "key": KEY, "lease": null, "mark": a }));
    let p = call("PUT", &url, SECRET, json!({ "token": a, "ttl": "10s" })).await.problem(409);
    assert!(p["detail"].as_str().unwrap().contains("ran out or was released"), "{p}");
    let b = granted(&acquire(&url, "worker-b", "30s").await, KEY, "worker-b");
    assert_eq!(b, a + 1);
    assert_stale(&put(&proxy(KEY), a, "late-a").await);
    assert_eq!(put(&proxy(KEY), b, "by-b").await.status, 200);
    assert_eq!(applied_tokens(up), [40, a, b]);

    // Bad bodies name what was expected.
    for (method, body, needle) in [
        ("POST", json!({ "holder": "x" }), "ttl"),
        ("POST", json!({ "holder": "x", "ttl": "1ms" }), "outside"),
        ("POST", json!({ "holder": "x", "ttl": "2h" }), "outside"),
        ("POST", json!({ "holder": "", "ttl": "1s" }), "holder"),
        ("POST", json!({ "holder": "x", "ttl": "1s", "wait": "5m" }), "wait"),
        ("POST", json!({ "holder": "x", "ttl": "1s", "token": 3 }), "unknown field"),
        ("PUT", json!({ "token": 1 }), "ttl"),
        ("DELETE", json!({ "token": "1" }), "token"),
    ] {
        let r = call(method, &url, SECRET, body.clone()).await;
        let p = r.problem(400);
        assert!(p["detail"].as_str().unwrap().contains(needle), "{method} {body}: {p}");
    }
    let p = get(&format!("{admin_base}/leases?key={}&prefix=/", enc(KEY))).await.problem(400);
    assert!(p["detail"].as_str().unwrap().contains("exactly one parameter"), "{p}");
}

/// The tokens of the writes the upstream applied to [`KEY`], in order.
fn applied_tokens(up: &RecordingUpstream) -> Vec<u64> {
    up.applied_for(KEY).iter().map(|w| w.token.as_deref().unwrap_or_default().parse().unwrap()).collect()
}

fn assert_stale(r: &Reply) {
    let p = r.problem(409);
    assert_eq!(p["type"], "urn:fencegate:problem:stale-token", "{p}");
}

#[tokio::test]
async fn every_lease_call_on_the_memory_store() {
    let up = RecordingUpstream::start().await;
    let proxy = start_in_process(&config_text(&admin(), MEMORY_STORE, &objects(&up))).await;
    contract(&proxy.admin_url(""), &|p| proxy.url(p), &up).await;
}

#[tokio::test]
async fn every_lease_call_on_the_file_store() {
    let up = RecordingUpstream::start().await;
    let dir = TempDir::new();
    let fg = Running::start(&config_text(&admin(), &file_store(&dir.path().join("fences"), ""), &objects(&up))).await;
    contract(&fg.admin_url(""), &|p| fg.url(p), &up).await;
}

#[tokio::test]
async fn every_lease_call_on_redis() {
    let redis = Redis::start();
    let up = RecordingUpstream::start().await;
    let fg = Running::start(&config_text(&admin(), &redis_store(&redis, ""), &objects(&up))).await;
    contract(&fg.admin_url(""), &|p| fg.url(p), &up).await;
}

#[tokio::test]
async fn every_lease_call_on_etcd() {
    let cluster = EtcdCluster::start(1).await;
    let up = RecordingUpstream::start().await;
    let fg = Running::start(&config_text(&admin(), &etcd_store(&cluster, ""), &objects(&up))).await;
    contract(&fg.admin_url(""), &|p| fg.url(p), &up).await;
}

/// The lease is advice, the fence the guarantee: a holder paused past its
/// lease still sends its write, after a new holder took the lease and wrote.
#[tokio::test]
async fn a_holder_paused_past_its_lease_is_refused_once_the_next_holder_has_the_key() {
    let up = RecordingUpstream::start().await;
    let proxy = start_in_process(&config_text(&admin(), MEMORY_STORE, &objects(&up))).await;
    let url = leases_url(&proxy.admin_url(""), KEY);
    let old = granted(&acquire(&url, "paused", "300ms").await, KEY, "paused");
    // The pause (a GC, a stopped VM): longer than the lease.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let new = granted(&acquire(&url, "next", "30s").await, KEY, "next");
    assert!(new > old);
    assert_eq!(put(&proxy.url(KEY), new, "new-holder").await.status, 200);
    // The paused holder wakes and writes as if it still held the lease.
    assert_stale(&put(&proxy.url(KEY), old, "paused-holder").await);
    let p = call("PUT", &url, SECRET, json!({ "token": old, "ttl": "30s" })).await.problem(409);
    assert_eq!(p["lease"]["holder"], "next", "{p}");
    assert_eq!(applied_tokens(&up), [new]);
}

#[tokio::test]
async fn a_scoped_token_takes_leases_only_under_its_prefixes() {
    let up = RecordingUpstream::start().await;
    let proxy = start_in_process(&config_text(&admin(), MEMORY_STORE, &objects(&up))).await;
    let base = proxy.admin_url("");
    let body = json!({ "holder": "job", "ttl": "10s" });
    let r = call("POST", &leases_url(&base, "/objects/jobs/1"), SCOPED, body.clone()).await;
    assert_eq!(r.status, 200, "{}", r.text());
    // Made canonical first: a dot segment does not lead out of the prefix.
    for outside in [KEY, "/objects/jobs/../a", "/objects/jobsX"] {
        let p = call("POST", &leases_url(&base, outside), SCOPED, body.clone()).await.problem(403);
        assert!(p["detail"].as_str().unwrap().contains("prefixes"), "{outside}: {p}");
    }
    let r = call("POST", &leases_url(&base, KEY), "wrong", body.clone()).await;
    r.problem(401);
    assert_eq!(r.header("www-authenticate"), Some("Bearer"));
    let r = send("POST", &leases_url(&base, KEY), &[], body.to_string()).await;
    r.problem(401);
    // The admin token covers every key; reads need no token.
    assert_eq!(call("POST", &leases_url(&base, KEY), SECRET, body.clone()).await.status, 200);
    assert_eq!(get(&leases_url(&base, KEY)).await.status, 200);
    // The scoped token is no admin token: the fence API refuses it.
    let r = call("PUT", &format!("{base}/fences?key={}", enc(KEY)), SCOPED, json!({ "token": 99 })).await;
    r.problem(401);

    // Without any token configured, changes are refused (403).
    let plain = start_in_process(&config_text("", MEMORY_STORE, &objects(&up))).await;
    let p = call("POST", &leases_url(&plain.admin_url(""), KEY), SECRET, body).await.problem(403);
    assert!(p["detail"].as_str().unwrap().contains("read-only"), "{p}");
}

/// Acquisitions through both replicas at once, each lease released at once:
/// every token granted is granted once, on Redis and on etcd.
async fn two_replicas_never_issue_one_token_twice(a: &Running, b: &Running) {
    let mut tasks = Vec::new();
    for (i, replica) in [a, b].into_iter().enumerate() {
        for w in 0..4 {
            let url = leases_url(&replica.admin_url(""), KEY);
            tasks.push(tokio::spawn(async move {
                let holder = format!("r{i}-w{w}");
                let mut tokens = Vec::new();
                for _ in 0..8 {
                    let r = call("POST", &url, SECRET, json!({ "holder": holder, "ttl": "10s", "wait": "30s" })).await;
                    let token = granted(&r, KEY, &holder);
                    let r = call("DELETE", &url, SECRET, json!({ "token": token })).await;
                    assert_eq!(r.status, 200, "{}", r.text());
                    tokens.push(token);
                }
                tokens
            }));
        }
    }
    let mut all = Vec::new();
    for t in tasks {
        let tokens = t.await.unwrap();
        assert!(tokens.windows(2).all(|w| w[0] < w[1]), "one worker's tokens go up: {tokens:?}");
        all.extend(tokens);
    }
    let unique: BTreeSet<u64> = all.iter().copied().collect();
    assert_eq!(unique.len(), all.len(), "a token was issued twice: {all:?}");
    let mark = get(&leases_url(&a.admin_url(""), KEY)).await.json()["mark"].as_u64().unwrap();
    assert_eq!(mark, *unique.last().unwrap(), "the mark is the last token issued");
}

#[tokio::test]
async fn two_replicas_on_redis_never_issue_one_token_twice() {
    let redis = Redis::start();
    let up = RecordingUpstream::start().await;
    let config = config_text(&admin(), &redis_store(&redis, ""), &objects(&up));
    let (a, b) = (Running::start(&config).await, Running::start(&config).await);
    two_replicas_never_issue_one_token_twice(&a, &b).await;
}

#[tokio::test]
async fn two_replicas_on_etcd_never_issue_one_token_twice() {
    let cluster = EtcdCluster::start(1).await;
    let up = RecordingUpstream::start().await;
    let config = config_text(&admin(), &etcd_store(&cluster, ""), &objects(&up));
    let (a, b) = (Running::start(&config).await, Running::start(&config).await);
    two_replicas_never_issue_one_token_twice(&a, &b).await;
}

/// kill -9 while acquisitions are under way on the file store: after the
/// restart, the next token is above every token answered before the kill.
#[tokio::test]
async fn a_kill_during_acquisitions_never_lets_a_token_go_back() {
    let up = RecordingUpstream::start().await;
    let site = TempDir::new();
    let config =
        site.write("fencegate.toml", &config_text(&admin(), &file_store(&site.path().join("f"), ""), &objects(&up)));
    for round in 0..3 {
        let mut fg = Running::start_in(site.path(), &config).await;
        let url = leases_url(&fg.admin_url(""), KEY);
        let answered = std::sync::Arc::new(std::sync::Mutex::new(Vec::<u64>::new()));
        let mut tasks = Vec::new();
        for w in 0..4 {
            let (url, answered) = (url.clone(), answered.clone());
            tasks.push(tokio::spawn(async move {
                loop {
                    let body = json!({ "holder": format!("w{w}"), "ttl": "100ms", "wait": "5s" });
                    let r = call("POST", &url, SECRET, body).await;
                    if r.status != 200 {
                        return;
                    }
                    answered.lock().unwrap().push(r.json()["token"].as_u64().unwrap());
                }
            }));
        }
        tokio::time::sleep(Duration::from_millis(300 + 200 * round)).await;
        fg.kill();
        for t in tasks {
            let _ = t.await;
        }
        let highest = answered.lock().unwrap().iter().copied().max().expect("no token was answered before the kill");
        let fg = Running::start_in(site.path(), &config).await;
        let url = leases_url(&fg.admin_url(""), KEY);
        let next = granted(&acquire(&url, "after", "1s").await, KEY, "after");
        assert!(next > highest, "round {round}: token {next} after the restart, {highest} answered before the kill");
        drop(fg);
    }
}

/// `examples/lease_client.rs`, built by `cargo test` beside the binary.
fn lease_client() -> std::path::PathBuf {
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_fencegate"));
    bin.parent().unwrap().join("examples").join("lease_client")
}

/// The example worker's lease is taken from it mid-run (released with its
/// token, which is no secret, and acquired by another who writes): its next
/// write is refused, or its renewal fails, and it takes a new lease and reads
/// again. Nothing it computed before the theft lands after it.
#[tokio::test]
async fn the_example_worker_that_loses_its_lease_reads_again_and_loses_no_write() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let store = listener.local_addr().unwrap();
    tokio::spawn(fencegate::demo::Store::default().serve(listener));
    let routes = format!("[[route]]\nname = \"objects\"\nprefix = \"/objects/\"\nupstream = \"http://{store}\"\n");
    let proxy = start_in_process(&config_text(&admin(), MEMORY_STORE, &routes)).await;
    let key = "/objects/counter";
    let child = std::process::Command::new(lease_client())
        .args([key, "worker", "20"])
        .env("FENCEGATE_PROXY", proxy.url(""))
        .env("FENCEGATE_ADMIN_URL", proxy.admin_url(""))
        .env("FENCEGATE_ADMIN_TOKEN", SECRET)
        .env("LEASE_TTL", "3s")
        .env("WORK", "40ms")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run examples/lease_client (built by cargo test)");
    let worker = tokio::task::spawn_blocking(move || child.wait_with_output());
    // Mid-run: the lease changes hands, and the new holder sets the counter.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let url = leases_url(&proxy.admin_url(""), key);
    let held = get(&url).await.json()["lease"]["token"].as_u64().expect("the worker holds the lease");
    assert_eq!(call("DELETE", &url, SECRET, json!({ "token": held })).await.status, 200);
    let thief = granted(&acquire(&url, "thief", "30s").await, key, "thief");
    assert_eq!(put(&proxy.url(key), thief, "1000").await.status, 200);
    assert_eq!(call("DELETE", &url, SECRET, json!({ "token": thief })).await.status, 200);

    let out = tokio::time::timeout(Duration::from_secs(60), worker).await.expect("the worker hung").unwrap().unwrap();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("take a new lease"), "the worker never noticed: {stderr}");
    let values: Vec<u64> = stdout.lines().map(|l| l.split_once(' ').unwrap().1.parse().unwrap()).collect();
    assert_eq!(values.len(), 20, "{stdout}");
    let after = values.iter().position(|v| *v > 1000).expect("no write after the theft");
    assert_eq!(values[after], 1001, "the first write after the theft read the thief's value: {values:?}");
    assert!(
        values[..after].iter().all(|v| *v < 1000) && values[after..].windows(2).all(|w| w[1] == w[0] + 1),
        "{values:?}"
    );
    let last = *values.last().unwrap();
    assert_eq!(
        get(&proxy.url(key)).await.text().trim(),
        last.to_string(),
        "a write computed before the theft landed after it"
    );
}

/// Two copies of the example worker add to one counter at once, in front of
/// the demo's legacy store: every write lands on the value the one before
/// left, so the counter ends at the sum of their writes, and each worker's
/// tokens only go up.
#[tokio::test]
async fn the_example_workers_share_a_counter_and_lose_no_write() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let store = listener.local_addr().unwrap();
    tokio::spawn(fencegate::demo::Store::default().serve(listener));
    let routes = format!("[[route]]\nname = \"objects\"\nprefix = \"/objects/\"\nupstream = \"http://{store}\"\n");
    let proxy = start_in_process(&config_text(&admin(), MEMORY_STORE, &routes)).await;
    let workers: Vec<_> = ["w1", "w2"]
        .into_iter()
        .map(|holder| {
            let child = std::process::Command::new(lease_client())
                .args(["/objects/counter", holder, "15"])
                .env("FENCEGATE_PROXY", proxy.url(""))
                .env("FENCEGATE_ADMIN_URL", proxy.admin_url(""))
                .env("FENCEGATE_ADMIN_TOKEN", SECRET)
                .env("LEASE_TTL", "2s")
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("run examples/lease_client (built by cargo test)");
            tokio::task::spawn_blocking(move || child.wait_with_output())
        })
        .collect();
    let mut values = Vec::new();
    for worker in workers {
        let out = tokio::time::timeout(Duration::from_secs(60), worker).await.expect("a worker hung").unwrap().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let lines = String::from_utf8(out.stdout).unwrap();
        let writes: Vec<(u64, u64)> = lines
            .lines()
            .map(|l| {
                let (token, value) = l.split_once(' ').unwrap();
                (token.parse().unwrap(), value.parse().unwrap())
            })
            .collect();
        assert_eq!(writes.len(), 15, "{lines}");
        assert!(writes.windows(2).all(|w| w[0].0 <= w[1].0 && w[0].1 < w[1].1), "{writes:?}");
        values.extend(writes.into_iter().map(|(_, v)| v));
    }
    values.sort_unstable();
    assert_eq!(values, (1..=30).collect::<Vec<_>>(), "every write built on the one before it");
    let r = get(&proxy.url("/objects/counter")).await;
    assert_eq!(r.text().trim(), "30");
}

/// `fencegate lease ...` as a shell script uses it: `acquire` prints the
/// token alone, the proxy takes it, and a refusal is exit 1 with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_cli_prints_a_token_a_script_can_send() {
    let up = RecordingUpstream::start().await;
    let fg = Running::start(&config_text(&admin(), MEMORY_STORE, &objects(&up))).await;
    let dir = TempDir::new();
    let url = format!("http://{}", fg.admin);
    let lease = |token: &str, args: &[&str]| {
        let mut cmd = fencegate(dir.path());
        cmd.env("FENCEGATE_ADMIN_URL", &url).env("FENCEGATE_ADMIN_TOKEN", token).arg("lease").args(args);
        run_to_exit(&mut cmd)
    };
    let exited = |out: &std::process::Output, code: i32| {
        assert_eq!(out.status.code(), Some(code), "stdout: {}\nstderr: {}", text(&out.stdout), text(&out.stderr));
        (text(&out.stdout), text(&out.stderr))
    };
    assert_eq!(put(&fg.url(KEY), 9, "before").await.status, 200);
    let (token, _) = exited(&lease(SECRET, &["acquire", KEY, "--holder", "script", "--ttl", "30s"]), 0);
    assert_eq!(token, "10\n");
    assert_eq!(put(&fg.url(KEY), 10, "with-the-lease").await.status, 200);
    let (shown, _) = exited(&lease(SECRET, &["show", KEY]), 0);
    assert!(shown.starts_with("script\t10\t"), "{shown}");
    // Held: exit 1, who holds it on stderr; a wait that ends first, too.
    let (_, why) = exited(&lease(SECRET, &["acquire", KEY, "--holder", "other", "--ttl", "5s", "--wait", "200ms"]), 1);
    assert!(why.contains("'script' holds the lease"), "{why}");
    let (said, _) = exited(&lease(SECRET, &["renew", KEY, "10", "--ttl", "40s"]), 0);
    assert!(said.contains("lease 10 renewed"), "{said}");
    let (_, why) = exited(&lease(SECRET, &["release", KEY, "9"]), 1);
    assert!(why.contains("held by 'script' with token 10, not 9"), "{why}");
    exited(&lease(SECRET, &["release", KEY, "10"]), 0);
    assert_eq!(exited(&lease(SECRET, &["show", KEY]), 0).0, "none\n");
    // A scoped token outside its prefixes: exit 2, the server's reason.
    let (_, why) = exited(&lease(SCOPED, &["acquire", KEY, "--holder", "x", "--ttl", "1s"]), 2);
    assert!(why.contains("403") && why.contains("prefixes"), "{why}");
    let (token, _) = exited(&lease(SCOPED, &["acquire", "/objects/jobs/7", "--holder", "x", "--ttl", "1s"]), 0);
    assert_eq!(token, "1\n");
}

/// On a `strict` route a token equal to the mark is refused: a lease taken
/// with `"strict": true` leaves the mark one below its token, so the holder's
/// write passes; one taken without it has no write to make.
#[tokio::test]
async fn a_strict_lease_lets_its_holder_write_through_a_strict_route() {
    let up = RecordingUpstream::start().await;
    let strict = route("objects", "/objects/", &up, "strict = true");
    let proxy = start_in_process(&config_text(&admin(), MEMORY_STORE, &strict)).await;
    let url = leases_url(&proxy.admin_url(""), KEY);
    let plain = granted(&acquire(&url, "plain", "1s").await, KEY, "plain");
    assert_stale(&put(&proxy.url(KEY), plain, "equal to the mark").await);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let r = call("POST", &url, SECRET, json!({ "holder": "strict", "ttl": "30s", "strict": true })).await;
    let token = granted(&r, KEY, "strict");
    assert_eq!(token, plain + 2);
    assert_eq!(get(&url).await.json()["mark"], plain + 1);
    assert_eq!(put(&proxy.url(KEY), token, "above the mark").await.status, 200);
    assert_stale(&put(&proxy.url(KEY), token, "once per token").await);
    assert_stale(&put(&proxy.url(KEY), plain, "the old holder").await);
    assert_eq!(applied_tokens(&up), [token]);
}
