//! Bounds: fences. Keys bounded in bytes, the file store's cache bounded in
//! bytes while every mark stays enforced, the store's size on disk exported,
//! marks deletable by an operator (and staying deleted across `kill -9`), and
//! listings that page correctly through 100k keys.

use std::time::Duration;

use bytes::Bytes;
use fencegate::fence::store::{FenceStore, MemoryStore};
use serde_json::Value;

use crate::common::process::{config_text, fencegate, file_store, run_to_exit, start_in_process, text};
use crate::common::process::{Running, TempDir, MEMORY_STORE};
use crate::common::{enc, get, put, route, send, RecordingUpstream};

const TOKEN: &str = "s3cret-admin-token";

/// The value of an unlabelled metric of the child at `admin`.
async fn metric(running: &Running, name: &str) -> Option<f64> {
    let text = get(&running.admin_url("/metrics")).await.text();
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// The child's resident set, from `/proc/<pid>/status`.
fn rss_bytes(pid: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

async fn admin_delete(url: &str, token: Option<&str>) -> crate::common::Reply {
    let auth = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("authorization", a.as_str())).collect();
    send("DELETE", url, &headers, Bytes::new()).await
}

#[tokio::test]
async fn a_key_past_max_key_bytes_is_refused_before_it_reads_raises_or_forwards_anything() {
    let upstream = RecordingUpstream::start().await;
    let routes = route("objects", "/objects/", &upstream, "");
    let fences = format!("{MEMORY_STORE}max_key_bytes = 64\n");
    let proxy = start_in_process(&config_text(&format!("auth_token = \"{TOKEN}\""), &fences, &routes)).await;
    let long = format!("/objects/{}", "k".repeat(60));
    assert!(long.len() > 64);

    let refused = put(&proxy.url(&long), 7, "payload").await;
    let problem = refused.problem(400);
    assert_eq!(problem["type"], "urn:fencegate:problem:bad-key", "{problem}");
    assert!(problem["detail"].as_str().unwrap().contains("max_key_bytes"), "{problem}");
    // A WebDAV destination's key is bounded the same way.
    let copy =
        send("COPY", &proxy.url("/objects/short"), &[("x-fencing-token", "7"), ("destination", &long)], Bytes::new())
            .await;
    assert_eq!(copy.problem(400)["type"], "urn:fencegate:problem:bad-key");
    assert!(upstream.applied().is_empty(), "a refused write reached the upstream");
    let listed = get(&proxy.admin_url("/fences?prefix=/objects/")).await.json();
    assert_eq!(listed["fences"], serde_json::json!([]), "a refused key left a mark");

    // The fence API takes no such key either, to read or to raise.
    let read = get(&proxy.admin_url(&format!("/fences?key={}", enc(&long)))).await;
    assert_eq!(read.problem(400)["type"], "urn:fencegate:problem:bad-key");
    let raise = send(
        "PUT",
        &proxy.admin_url(&format!("/fences?key={}", enc(&long))),
        &[("authorization", &format!("Bearer {TOKEN}"))],
        r#"{"token": 9}"#,
    )
    .await;
    assert_eq!(raise.problem(400)["type"], "urn:fencegate:problem:bad-key");

    // A normal client beside it is served, and its mark kept.
    assert_eq!(put(&proxy.url("/objects/short"), 7, "payload").await.status, 200);
    assert_eq!(get(&proxy.admin_url("/fences?key=/objects/short")).await.json()["token"], 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_long_keys_under_a_small_cache_bytes_keep_memory_bounded_and_every_mark_enforced() {
    const KEYS: u64 = 16_000;
    const KEY_BYTES: usize = 3900;
    const CACHE_BYTES: u64 = 1 << 20;
    const FIXED_OVERHEAD: u64 = 40 << 20;
    let upstream = RecordingUpstream::start().await;
    let dir = TempDir::new();
    let fences = file_store(&dir.path().join("fences"), &format!("cache_bytes = {CACHE_BYTES}\nmax_key_bytes = 4096"));
    let config = dir.write("fencegate.toml", &config_text("", &fences, &route("objects", "/objects/", &upstream, "")));
    let running = Running::start_in(dir.path(), &config).await;
    let disk_before = metric(&running, "fencegate_store_disk_bytes").await.expect("the disk metric is exported");
    // Warm up the allocator and the upstream connections with short keys first.
    for i in 0..200 {
        assert_eq!(put(&running.url(&format!("/objects/warm/{i}")), 1, "x").await.status, 200);
    }
    let rss_before = rss_bytes(&running.pid());

    // The attack: thousands of distinct, long keys, from a few connections.
    let key = |i: u64| format!("/objects/{i:06}/{}", "p".repeat(KEY_BYTES - 20));
    let writers: Vec<_> = (0..16)
        .map(|w| {
            let url = running.url("");
            tokio::spawn(async move {
                for i in (w..KEYS).step_by(16) {
                    let reply = put(&format!("{url}{}", key(i)), i + 10, "x").await;
                    assert_eq!(reply.status, 200, "{}", reply.text());
                }
            })
        })
        .collect();
    for writer in writers {
        writer.await.unwrap();
    }
    let keys_sent = KEYS * KEY_BYTES as u64;
    // Let the sweep run (it runs at least every second) before measuring. The
    // 200 short warm-up keys may stay cached (they cost ~120 bytes each, and
    // the sweep stops once the bytes are under the bound, whichever marks it
    // kept): what may stay is them and cache_bytes' worth of long keys.
    let most = 200.0 + (CACHE_BYTES / KEY_BYTES as u64) as f64;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while metric(&running, "fencegate_cached_keys").await.unwrap() > most {
        assert!(std::time::Instant::now() < deadline, "the cache never came down to cache_bytes");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The highest of a few readings, the idle fold's included.
    let mut grown = 0;
    for _ in 0..3 {
        grown = grown.max(rss_bytes(&running.pid()).saturating_sub(rss_before));
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    // The keys alone are ~60 MiB. What may stay is the cache, and a fixed
    // overhead: redb's page cache (16 MiB), the journal's marks not yet
    // folded, and allocator slack.
    let bound = CACHE_BYTES + FIXED_OVERHEAD;
    assert!(grown < bound, "RSS grew by {grown} bytes after {keys_sent} bytes of keys; bound {bound}");

    // Every mark is still enforced, evicted or not.
    for i in (0..KEYS).step_by(97) {
        let reply = put(&running.url(&key(i)), i + 9, "x").await;
        assert_eq!(reply.problem(409)["current"], i + 10, "key {i}");
    }
    let disk_after = metric(&running, "fencegate_store_disk_bytes").await.unwrap();
    assert!(disk_after > disk_before + keys_sent as f64 / 2.0, "disk {disk_before} -> {disk_after}");
    // A normal client is still served.
    assert_eq!(put(&running.url("/objects/normal"), 1, "x").await.status, 200);
    eprintln!("keys sent {keys_sent}, RSS grew {grown}, disk {disk_before} -> {disk_after}");
}

#[tokio::test]
async fn deletes_need_the_bearer_token_and_are_refused_without_one_configured() {
    let upstream = RecordingUpstream::start().await;
    let routes = route("objects", "/objects/", &upstream, "");
    let proxy = start_in_process(&config_text("", MEMORY_STORE, &routes)).await;
    assert_eq!(put(&proxy.url("/objects/a"), 5, "x").await.status, 200);
    let refused = admin_delete(&proxy.admin_url("/fences?key=/objects/a"), Some(TOKEN)).await;
    refused.problem(403);
    assert_eq!(get(&proxy.admin_url("/fences?key=/objects/a")).await.json()["token"], 5);

    let proxy = start_in_process(&config_text(&format!("auth_token = \"{TOKEN}\""), MEMORY_STORE, &routes)).await;
    assert_eq!(put(&proxy.url("/objects/a"), 5, "x").await.status, 200);
    for token in [None, Some("wrong")] {
        let refused = admin_delete(&proxy.admin_url("/fences?key=/objects/a"), token).await;
        refused.problem(401);
    }
    // A prefix matching every key takes an explicit all=true.
    for prefix in ["", "/"] {
        let refused = admin_delete(&proxy.admin_url(&format!("/fences?prefix={prefix}")), Some(TOKEN)).await;
        assert!(refused.problem(400)["detail"].as_str().unwrap().contains("all=true"));
    }
    assert_eq!(get(&proxy.admin_url("/fences?key=/objects/a")).await.json()["token"], 5);
    let deleted = admin_delete(&proxy.admin_url("/fences?key=/objects/a"), Some(TOKEN)).await;
    assert_eq!(deleted.json(), serde_json::json!({"key": "/objects/a", "deleted": 1, "token": 5}));
    // The key takes any token again.
    assert_eq!(put(&proxy.url("/objects/a"), 1, "x").await.status, 200);
    let all = admin_delete(&proxy.admin_url("/fences?prefix=/&all=true"), Some(TOKEN)).await;
    assert_eq!(all.json(), serde_json::json!({"prefix": "/", "deleted": 1}));
}

#[tokio::test]
async fn a_delete_prefix_with_dot_segments_or_doubled_slashes_is_refused_not_widened() {
    let upstream = RecordingUpstream::start().await;
    let routes = route("objects", "/objects/", &upstream, "");
    let proxy = start_in_process(&config_text(&format!("auth_token = \"{TOKEN}\""), MEMORY_STORE, &routes)).await;
    assert_eq!(put(&proxy.url("/objects/a"), 5, "x").await.status, 200);
    assert_eq!(put(&proxy.url("/objects/tenant/b"), 6, "x").await.status, 200);
    // Each would be `/objects/` once canonical: every mark under it.
    for prefix in ["/objects/tenant/..", "/objects/.", "/objects/tenant/%2e%2E", "/objects//"] {
        let url = proxy.admin_url(&format!("/fences?prefix={}", enc(prefix)));
        let refused = admin_delete(&url, Some(TOKEN)).await;
        assert!(refused.problem(400)["detail"].as_str().unwrap().contains("canonical"), "{prefix}");
    }
    assert_eq!(get(&proxy.admin_url("/fences?key=/objects/a")).await.json()["token"], 5);
    let deleted = admin_delete(&proxy.admin_url("/fences?prefix=/objects/tenant/"), Some(TOKEN)).await;
    assert_eq!(deleted.json(), serde_json::json!({"prefix": "/objects/tenant/", "deleted": 1}));
    assert_eq!(get(&proxy.admin_url("/fences?key=/objects/a")).await.json()["token"], 5);
}

fn audit_events(running: &Running, message: &str) -> Vec<Value> {
    running.events().into_iter().filter(|e| e["target"] == "fencegate::audit" && e["message"] == message).collect()
}

#[tokio::test]
async fn deleted_marks_stay_deleted_across_kill_9_and_every_other_mark_survives() {
    let upstream = RecordingUpstream::start().await;
    let dir = TempDir::new();
    let fences = file_store(&dir.path().join("fences"), "");
    let routes = route("objects", "/objects/", &upstream, "");
    let config = dir.write("fencegate.toml", &config_text(&format!("auth_token = \"{TOKEN}\""), &fences, &routes));
    let mut running = Running::start_in(dir.path(), &config).await;
    let marks = [("/objects/a", 5), ("/objects/dead/1", 6), ("/objects/dead/2", 7), ("/objects/live", 8)];
    for (key, token) in marks {
        assert_eq!(put(&running.url(key), token, "x").await.status, 200);
    }

    let deleted = admin_delete(&running.admin_url("/fences?key=/objects/a"), Some(TOKEN)).await;
    assert_eq!(deleted.json(), serde_json::json!({"key": "/objects/a", "deleted": 1, "token": 5}));
    // Through the CLI, on a config naming the running admin listener.
    let cli_config = dir.write(
        "cli.toml",
        &format!(
            "[admin]\nlisten = \"{}\"\nauth_token = \"{TOKEN}\"\n{}",
            running.admin,
            route("objects", "/objects/", &upstream, "")
        ),
    );
    let out = run_to_exit(
        fencegate(dir.path())
            .args(["--config"])
            .arg(&cli_config)
            .args(["fence", "delete", "--prefix"])
            .arg("/objects/dead/"),
    );
    assert!(out.status.success(), "{}\n{}", text(&out.stdout), text(&out.stderr));
    assert!(text(&out.stdout).contains("2 fences deleted"), "{}", text(&out.stdout));
    let key_events = audit_events(&running, "fence deleted");
    assert_eq!(key_events.len(), 1, "{key_events:?}");
    assert_eq!(key_events[0]["key"], "/objects/a");
    assert!(key_events[0]["caller"].is_string());
    let prefix_event = running
        .wait_event("the prefix delete's audit line", |e| {
            e["target"] == "fencegate::audit" && e["message"] == "fences deleted by prefix"
        })
        .await;
    assert_eq!(prefix_event["prefix"], "/objects/dead/");
    assert_eq!(prefix_event["deleted"], 2);

    // kill -9 right after the 200s: nothing was stopped cleanly.
    running.kill();
    let running = Running::start_in(dir.path(), &config).await;
    for key in ["/objects/a", "/objects/dead/1", "/objects/dead/2"] {
        let mark = get(&running.admin_url(&format!("/fences?key={key}"))).await.json();
        assert_eq!(mark["token"], Value::Null, "{key} came back: {mark}");
    }
    assert_eq!(get(&running.admin_url("/fences?key=/objects/live")).await.json()["token"], 8);
    assert_eq!(put(&running.url("/objects/live"), 7, "x").await.problem(409)["current"], 8);
    // A deleted key starts over: the first token forwarded, whatever it is.
    let before = upstream.applied_for("/objects/a").len();
    assert_eq!(put(&running.url("/objects/a"), 1, "x").await.status, 200);
    assert_eq!(upstream.applied_for("/objects/a").len(), before + 1);
}

#[tokio::test]
async fn listings_page_correctly_through_100k_keys() {
    let store = MemoryStore::default();
    let keys: Vec<String> =
        (0..100_000u64).map(|i| format!("/objects/{:05}/{}", (i * 7919) % 100_000, i % 3)).collect();
    for (i, key) in keys.iter().enumerate() {
        store.advance(key, i as u64).await.unwrap();
    }
    let mut expected: Vec<&String> = keys.iter().collect();
    expected.sort();
    // Page through everything, 1000 at a time.
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = store.list("/objects/", after.as_deref(), 1000).await.unwrap();
        let Some((last, _)) = page.last() else { break };
        after = Some(last.clone());
        seen.extend(page.into_iter().map(|(k, _)| k));
    }
    assert_eq!(seen.len(), 100_000);
    assert!(seen.iter().zip(&expected).all(|(a, b)| a == *b));
    // A narrow prefix, a cursor inside it, and limit = 1.
    let page = store.list("/objects/0420", Some("/objects/04200/1"), 3).await.unwrap();
    let want: Vec<&String> = expected
        .iter()
        .copied()
        .filter(|k| k.starts_with("/objects/0420") && k.as_str() > "/objects/04200/1")
        .take(3)
        .collect();
    assert_eq!(page.iter().map(|(k, _)| k).collect::<Vec<_>>(), want);
    let first = store.list("", None, 1).await.unwrap();
    assert_eq!(&first[0].0, expected[0]);
    assert_eq!(store.list("/nothing/", None, 10).await.unwrap(), []);
}
