//! Fences survive a crash: the real binary with the file store, killed with
//! SIGKILL (no drain, no clean close) and started again on the same store.
//!
//! The recording upstream lives in the test process, so it outlives every
//! restart of the proxy and is the witness of what was really written.

use crate::common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use common::process::*;
use common::*;

fn objects(up: &RecordingUpstream) -> String {
    route("objects", "/objects/", up, "")
}

/// Asserts that a write with `token` is refused because the fence is at least `at_least`;
/// returns the current fence.
async fn assert_stale(url: &str, token: u64, at_least: u64) -> u64 {
    let r = put(url, token, "stale").await;
    r.problem(409);
    let current: u64 = r
        .header("x-fencing-token-current")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("409 without a numeric X-Fencing-Token-Current: {:?}", r.headers));
    assert!(current >= at_least, "{url}: fence {current} after the restart, but the upstream applied {at_least}");
    current
}

/// The fence of `key` as the admin API reports it.
async fn fence(admin_url: &str, key: &str) -> Option<u64> {
    let query = form_urlencoded::Serializer::new(String::new()).append_pair("key", key).finish();
    let r = get(&format!("{admin_url}/fences?{query}")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let body = r.json();
    assert_eq!(body["key"], key, "{body}");
    body["token"].as_u64()
}

fn tokens(up: &RecordingUpstream, key: &str) -> Vec<String> {
    up.applied_for(key).into_iter().map(|a| a.token.unwrap_or_default()).collect()
}

/// Raises `/objects/a` to 7, kills the proxy with SIGKILL, starts it again in the
/// same place and checks that 6 is refused with the fence 7 and 7 still passes.
async fn raise_kill_restart(site: &TempDir, config: &std::path::Path, up: &RecordingUpstream) {
    let mut fg = Running::start_in(site.path(), config).await;
    assert_eq!(put(&fg.url("/objects/a"), 7, "seven").await.status, 200);
    fg.kill();

    let fg = Running::start_in(site.path(), config).await;
    // The store reports what it recovered.
    let opened = fg.events().into_iter().find(|e| e["message"] == "fence store opened");
    assert_eq!(opened.as_ref().map(|e| e["fences"].clone()), Some(1.into()), "{opened:?}");

    assert_eq!(assert_stale(&fg.url("/objects/a"), 6, 7).await, 7);
    assert_eq!(fence(&fg.admin_url(""), "/objects/a").await, Some(7));
    assert_eq!(put(&fg.url("/objects/a"), 7, "seven again").await.status, 200);
    assert_eq!(tokens(up, "/objects/a"), ["7", "7"], "the stale write reached the upstream");
    assert_eq!(up.object("/objects/a").unwrap(), "seven again");
}

/// A directory with a config for a file store at `<dir>/store` in front of `up`:
/// the directory, the store's path and the config's path.
fn file_store_site(up: &RecordingUpstream) -> (TempDir, std::path::PathBuf, std::path::PathBuf) {
    let site = TempDir::new();
    let store = site.path().join("store");
    let config = site.write("fencegate.toml", &config_text("", &file_store(&store, ""), &objects(up)));
    (site, store, config)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_survives_kill_9() {
    let up = RecordingUpstream::start().await;
    let (site, store, config) = file_store_site(&up);
    raise_kill_restart(&site, &config, &up).await;
    assert!(store.join("fences.redb").is_file());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_fences_section_the_default_file_store_survives_kill_9() {
    let up = RecordingUpstream::start().await;
    let site = TempDir::new();
    // No [fences] at all: store = "file" at data/fences under the working directory.
    let config = site.write("fencegate.toml", &config_text("", "", &objects(&up)));
    assert!(!std::fs::read_to_string(&config).unwrap().contains("[fences]"));
    raise_kill_restart(&site, &config, &up).await;
    let db = site.path().join("data/fences/fences.redb");
    assert!(db.is_file(), "{} does not exist", db.display());
}

/// The control experiment: without a durable store a restart forgets, so the
/// tests above do prove that the file store is what keeps the fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_store_forgets_fences_on_restart() {
    let up = RecordingUpstream::start().await;
    let site = TempDir::new();
    let config = site.write("fencegate.toml", &config_text("", MEMORY_STORE, &objects(&up)));
    let mut fg = Running::start_in(site.path(), &config).await;
    assert_eq!(put(&fg.url("/objects/a"), 7, "seven").await.status, 200);
    fg.kill();

    let fg = Running::start_in(site.path(), &config).await;
    assert_eq!(fence(&fg.admin_url(""), "/objects/a").await, None);
    assert_eq!(
        put(&fg.url("/objects/a"), 6, "six").await.status,
        200,
        "documented: memory fences die with the process"
    );
    assert_eq!(tokens(&up, "/objects/a"), ["7", "6"]);
    assert!(!site.path().join("data").exists(), "the memory store wrote to disk");
}

/// Many writers on many keys, SIGKILL in the middle: every token the upstream
/// applied before the crash is still fenced after the restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_applied_write_is_still_fenced_after_kill_9_mid_storm() {
    const KEYS: usize = 300;
    const WRITERS: usize = 32;
    const KILL_AFTER: usize = 1000;
    let key = |k: usize| format!("/objects/storm/{k:03}");

    let up = RecordingUpstream::start().await;
    let site = TempDir::new();
    let config =
        site.write("fencegate.toml", &config_text("", &file_store(&site.path().join("store"), ""), &objects(&up)));
    let mut fg = Running::start_in(site.path(), &config).await;

    // Per key, each request takes the next token; concurrent writers on one key
    // make some of them stale, which is fine.
    let next_token: Arc<Vec<AtomicU64>> = Arc::new((0..KEYS).map(|_| AtomicU64::new(0)).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let statuses = Arc::new(Mutex::new(HashMap::<u16, usize>::new()));
    let seed = test_seed();
    let writers: Vec<_> = (0..WRITERS)
        .map(|writer| {
            let (next_token, stop, statuses) = (next_token.clone(), stop.clone(), statuses.clone());
            let base = fg.url("");
            let mut rng = StdRng::seed_from_u64(seed.wrapping_add(writer as u64));
            tokio::spawn(async move {
                let client = client();
                while !stop.load(Ordering::Relaxed) {
                    let k = rng.random_range(0..KEYS);
                    let token = next_token[k].fetch_add(1, Ordering::Relaxed) + 1;
                    let req = Request::put(format!("{base}{}", key(k)))
                        .header("x-fencing-token", token)
                        .body(Full::new(Bytes::from_static(b"storm")))
                        .unwrap();
                    // After the kill requests fail; that is expected and ignored.
                    if let Ok(resp) = client.request(req).await {
                        let status = resp.status().as_u16();
                        if resp.into_body().collect().await.is_ok() {
                            *statuses.lock().unwrap().entry(status).or_default() += 1;
                        }
                    }
                }
            })
        })
        .collect();

    let start = Instant::now();
    while up.applied().len() < KILL_AFTER {
        assert!(start.elapsed() < DEADLINE, "the upstream applied only {} writes", up.applied().len());
        assert!(writers.iter().all(|w| !w.is_finished()), "a writer stopped before the kill");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    fg.kill();
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.await.unwrap();
    }
    // Writes forwarded just before the kill may still be landing.
    let start = Instant::now();
    while (0..KEYS).any(|k| up.in_flight(&key(k)) > 0) {
        assert!(start.elapsed() < DEADLINE, "writes stayed in flight at the upstream");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    let statuses = statuses.lock().unwrap().clone();
    assert!(statuses.keys().all(|s| *s == 200 || *s == 409), "statuses before the kill: {statuses:?}");
    let applied = up.applied();
    // T per key: the highest token the upstream applied; and per key the
    // upstream applied tokens in non-decreasing order.
    let mut highest: HashMap<String, u64> = HashMap::new();
    for a in &applied {
        let token: u64 = a.token.as_deref().unwrap().parse().unwrap();
        let t = highest.entry(a.key.clone()).or_default();
        assert!(token >= *t, "{}: token {token} applied after {t}", a.key);
        *t = token;
    }
    assert!(statuses.get(&200).copied().unwrap_or(0) <= applied.len());

    let fg = Running::start_in(site.path(), &config).await;
    let opened = fg.events().into_iter().find(|e| e["message"] == "fence store opened").expect("no store event");
    assert!(opened["fences"].as_u64().unwrap() >= highest.len() as u64, "{opened}");

    for k in 0..KEYS {
        let key = key(k);
        let Some(&t) = highest.get(&key) else { continue };
        if t >= 1 {
            assert_stale(&fg.url(&key), t - 1, t).await;
        }
        let mark = fence(&fg.admin_url(""), &key).await;
        assert!(mark >= Some(t), "{key}: the admin API reports {mark:?}, the upstream applied {t}");
    }
    assert_eq!(up.applied().len(), applied.len(), "a stale write reached the upstream after the restart");
    eprintln!(
        "storm: {} writes applied on {} keys before the kill, responses {statuses:?}",
        applied.len(),
        highest.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_store_file_stops_start_up_and_is_left_alone() {
    let site = TempDir::new();
    let store = site.path().join("store");
    std::fs::create_dir_all(&store).unwrap();
    let db = store.join("fences.redb");
    let garbage: Vec<u8> = (0..64 * 1024u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    std::fs::write(&db, &garbage).unwrap();
    let config = site.write(
        "fencegate.toml",
        &config_text(
            "",
            &file_store(&store, ""),
            "[[route]]\nname = \"o\"\nprefix = \"/\"\nupstream = \"http://127.0.0.1:9\"\n",
        ),
    );

    let mut fg = Running::spawn(fencegate(site.path()).arg("--config").arg(&config));
    let status = fg.wait_start().await.expect_err("fencegate started on a corrupt store");
    let output = fg.output();
    assert_eq!(status.code(), Some(1), "{status}\n{output}");
    assert!(output.contains(&db.display().to_string()), "the error does not name {}:\n{output}", db.display());
    assert!(output.contains("corrupt"), "the error does not say corrupt:\n{output}");
    assert!(output.contains("refusing"), "the error does not say it refuses:\n{output}");
    assert_eq!(std::fs::read(&db).unwrap(), garbage, "the corrupt file was changed");
    let entries: Vec<_> = std::fs::read_dir(&store).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(entries, ["fences.redb"], "files appeared next to the corrupt store");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_existing_refuses_a_missing_store_and_accepts_an_existing_one() {
    let up = RecordingUpstream::start().await;
    let site = TempDir::new();
    // As if the volume holding the store were not mounted.
    let store = site.path().join("volume/fences");
    let required =
        site.write("required.toml", &config_text("", &file_store(&store, "require_existing = true"), &objects(&up)));

    let mut fg = Running::spawn(fencegate(site.path()).arg("--config").arg(&required));
    let status = fg.wait_start().await.expect_err("fencegate started without its store");
    let output = fg.output();
    assert_eq!(status.code(), Some(1), "{status}\n{output}");
    assert!(output.contains(&store.display().to_string()), "the error does not name {}:\n{output}", store.display());
    assert!(output.contains("require_existing"), "{output}");
    assert!(!store.join("fences.redb").exists(), "an empty store was created anyway");

    // A first start that may create the store, then a stop.
    let creating = site.write("creating.toml", &config_text("", &file_store(&store, ""), &objects(&up)));
    let mut fg = Running::start_in(site.path(), &creating).await;
    assert_eq!(put(&fg.url("/objects/r"), 3, "three").await.status, 200);
    fg.kill();

    let fg = Running::start_in(site.path(), &required).await;
    assert_eq!(assert_stale(&fg.url("/objects/r"), 2, 3).await, 3);
}

/// Concurrent raises share fsyncs, and a token equal to the mark on disk costs none.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_raises_share_commits_and_equal_tokens_commit_nothing() {
    const WRITES: usize = 256;
    let up = RecordingUpstream::start().await;
    let site = TempDir::new();
    let proxy = start_in_process(&config_text("", &file_store(site.path(), ""), &objects(&up))).await;

    let burst = |token: u64| {
        let urls: Vec<_> = (0..WRITES).map(|i| proxy.url(&format!("/objects/burst/{i}"))).collect();
        async move {
            let writes: Vec<_> =
                urls.into_iter().map(|url| tokio::spawn(async move { put(&url, token, "b").await })).collect();
            for w in writes {
                let r = w.await.unwrap();
                assert_eq!(r.status, 200, "{}", r.text());
            }
        }
    };
    burst(1).await;
    let commits = proxy.metric("fencegate_store_commits_total").await.unwrap();
    let raises = proxy.metric("fencegate_store_raises_total").await.unwrap();
    assert_eq!(raises, WRITES as f64);
    assert!(commits >= 1.0 && commits < raises, "{commits} commits for {raises} raises: no group commit");

    // The same tokens again: every write is forwarded, nothing is committed.
    burst(1).await;
    assert_eq!(proxy.metric("fencegate_store_commits_total").await.unwrap(), commits);
    assert_eq!(proxy.metric("fencegate_store_raises_total").await.unwrap(), raises);
    assert_eq!(up.applied().len(), 2 * WRITES);
    // A second without raises: the journal is folded into the store file
    // (more than once when a slow machine left an idle second inside the bursts).
    proxy.wait_metric_at_least("fencegate_store_folds_total", 1.0).await;
    assert_eq!(proxy.metric("fencegate_store_fold_failures_total").await, Some(0.0));
}

/// Pre-fencing is durable too: a fence raised through the admin API is on disk
/// before the 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_raised_through_the_api_survives_kill_9() {
    let up = RecordingUpstream::start().await;
    let site = TempDir::new();
    let admin_lines = "auth_token = \"t\"";
    let config = site
        .write("fencegate.toml", &config_text(admin_lines, &file_store(&site.path().join("store"), ""), &objects(&up)));
    let mut fg = Running::start_in(site.path(), &config).await;
    let query = form_urlencoded::Serializer::new(String::new()).append_pair("key", "/objects/pre").finish();
    let r =
        send("PUT", &fg.admin_url(&format!("/fences?{query}")), &[("authorization", "Bearer t")], r#"{"token": 12}"#)
            .await;
    assert_eq!(r.status, 200, "{}", r.text());
    fg.kill();

    let fg = Running::start_in(site.path(), &config).await;
    assert_eq!(fence(&fg.admin_url(""), "/objects/pre").await, Some(12));
    assert_eq!(assert_stale(&fg.url("/objects/pre"), 11, 12).await, 12);
    assert!(up.applied().is_empty());
}

/// Two processes on one store would each enforce their own marks: the second refuses to start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_fencegate_on_the_same_store_refuses_to_start() {
    let up = RecordingUpstream::start().await;
    let (site, store, config) = file_store_site(&up);
    let first = Running::start_in(site.path(), &config).await;
    assert_eq!(put(&first.url("/objects/a"), 7, "seven").await.status, 200);

    let mut second = Running::spawn(fencegate(site.path()).arg("--config").arg(&config));
    let status = second.wait_start().await.expect_err("a second fencegate started on the same store");
    let output = second.output();
    assert_eq!(status.code(), Some(1), "{status}\n{output}");
    assert!(output.contains(&store.join("fences.redb").display().to_string()), "{output}");
    assert!(output.contains("another process"), "{output}");

    // The first one is unharmed.
    assert_eq!(assert_stale(&first.url("/objects/a"), 6, 7).await, 7);
    assert_eq!(put(&first.url("/objects/a"), 8, "eight").await.status, 200);
}

/// With a cache much smaller than the number of keys, marks leave memory and
/// come back from disk: every one is still enforced.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn marks_evicted_from_a_small_cache_are_still_enforced() {
    const KEYS: u64 = 300;
    const CACHE: f64 = 20.0;
    let up = RecordingUpstream::start().await;
    let site = TempDir::new();
    let proxy = start_in_process(&config_text("", &file_store(site.path(), "cache_keys = 20"), &objects(&up))).await;
    let key = |k: u64| format!("/objects/cached/{k:03}");
    for k in 0..KEYS {
        assert_eq!(put(&proxy.url(&key(k)), 10 + k, "x").await.status, 200);
    }
    let start = Instant::now();
    while proxy.metric("fencegate_cached_keys").await.unwrap() > CACHE {
        assert!(start.elapsed() < DEADLINE, "the cache never shrank to {CACHE} marks");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(proxy.metric("fencegate_tracked_keys").await, Some(KEYS as f64));

    for k in 0..KEYS {
        assert_eq!(assert_stale(&proxy.url(&key(k)), 9 + k, 10 + k).await, 10 + k);
        assert_eq!(fence(&proxy.admin_url(""), &key(k)).await, Some(10 + k));
    }
    // Equal tokens still pass after a trip through the disk.
    for k in (0..KEYS).step_by(7) {
        assert_eq!(put(&proxy.url(&key(k)), 10 + k, "y").await.status, 200);
    }
    assert_eq!(up.applied().len() as u64, KEYS + KEYS.div_ceil(7));
}

/// A real store cut short (a partial copy, a full disk) or padded (a copy tool)
/// never loses a fence silently: either start-up is refused with the corrupt
/// message (never a panic), or the store library recovered the file whole and
/// every fence in it is still enforced. Which of the two depends on where the
/// damage falls in the file's layout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_or_padded_store_file_stops_start_up_and_is_left_alone() {
    let up = RecordingUpstream::start().await;
    let site = TempDir::new();
    let store = site.path().join("store");
    let db = store.join("fences.redb");
    let config = site.write("fencegate.toml", &config_text("", &file_store(&store, ""), &objects(&up)));
    let mut fg = Running::start_in(site.path(), &config).await;
    for k in 0..50 {
        assert_eq!(put(&fg.url(&format!("/objects/t/{k}")), 5, "x").await.status, 200);
    }
    fg.signal("TERM");
    assert_eq!(fg.wait_exit().await.code(), Some(0));
    let whole = std::fs::read(&db).unwrap();

    for (what, damaged) in [
        ("cut to its first page", whole[..4096].to_vec()),
        ("missing its last page", whole[..whole.len() - 4096].to_vec()),
        ("padded with 100 zero bytes", [&whole[..], &[0u8; 100]].concat()),
    ] {
        std::fs::write(&db, &damaged).unwrap();
        let mut fg = Running::spawn(fencegate(site.path()).arg("--config").arg(&config));
        let status = match fg.wait_start().await {
            Err(status) => status,
            Ok(()) => {
                for k in 0..50 {
                    let r = put(&fg.url(&format!("/objects/t/{k}")), 4, "x").await;
                    assert_eq!(r.status, 409, "{what}: started, but the fence of key {k} is gone");
                }
                fg.kill();
                continue;
            }
        };
        let output = fg.output();
        assert_eq!(status.code(), Some(1), "{what}: {status}\n{output}");
        assert!(output.contains(&db.display().to_string()), "{what}: the error does not name the file:\n{output}");
        assert!(output.contains("corrupt"), "{what}: the error does not say corrupt:\n{output}");
    }
}

/// A clean stop folds the journal into the store file, so the file alone (what a
/// backup or an older fencegate reads) holds every mark.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_stop_leaves_every_mark_in_the_store_file() {
    let up = RecordingUpstream::start().await;
    let (site, store, config) = file_store_site(&up);
    let mut fg = Running::start_in(site.path(), &config).await;
    const KEYS: u64 = 2000;
    let writers: Vec<_> = (0..16u64)
        .map(|w| {
            let url = fg.url("/objects/clean/");
            tokio::spawn(async move {
                for k in (w..KEYS).step_by(16) {
                    assert_eq!(put(&format!("{url}{k}"), 10 + k, "x").await.status, 200);
                }
            })
        })
        .collect();
    for w in writers {
        w.await.unwrap();
    }
    // Well within the second after which an idle journal is folded anyway.
    fg.signal("TERM");
    assert_eq!(fg.wait_exit().await.code(), Some(0));

    use redb::{ReadableDatabase, ReadableTable};
    let db = redb::Database::open(store.join("fences.redb")).unwrap();
    let txn = db.begin_read().unwrap();
    let table = txn.open_table(redb::TableDefinition::<&str, u64>::new("fences")).unwrap();
    for k in 0..KEYS {
        let mark = table.get(format!("/objects/clean/{k}").as_str()).unwrap().map(|v| v.value());
        assert_eq!(mark, Some(10 + k), "key {k} is only in the journal after a clean stop");
    }
}

/// The journal holds marks the store file may lack until a clean stop: after a
/// crash, a store directory missing a journal file refuses to start, while after
/// a clean stop the store file alone is enough.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_journal_file_stops_start_up_after_a_crash_but_not_after_a_clean_stop() {
    let up = RecordingUpstream::start().await;
    let (site, store, config) = file_store_site(&up);
    let journals = ["fences.journal-0", "fences.journal-1"].map(|name| store.join(name));

    // A crash, then the journal files go missing (a copy of fences.redb alone).
    let mut fg = Running::start_in(site.path(), &config).await;
    assert_eq!(put(&fg.url("/objects/j/crash"), 7, "x").await.status, 200);
    fg.kill();
    for path in &journals {
        std::fs::remove_file(path).unwrap();
    }
    let mut refused = Running::spawn(fencegate(site.path()).arg("--config").arg(&config));
    let status = refused.wait_start().await.expect_err("started without the journal of a store that crashed");
    let output = refused.output();
    assert_eq!(status.code(), Some(1), "{output}");
    assert!(output.contains("fences.journal-0") && output.contains("missing"), "{output}");
    // The operator's way out: empty journal files, on purpose.
    for path in &journals {
        std::fs::write(path, b"").unwrap();
    }
    let mut fg = Running::start_in(site.path(), &config).await;

    // A clean stop folds the journal: the store file alone carries every mark.
    assert_eq!(put(&fg.url("/objects/j/clean"), 9, "x").await.status, 200);
    fg.signal("TERM");
    assert_eq!(fg.wait_exit().await.code(), Some(0));
    for path in &journals {
        std::fs::remove_file(path).unwrap();
    }
    let fg = Running::start_in(site.path(), &config).await;
    assert_eq!(assert_stale(&fg.url("/objects/j/clean"), 8, 9).await, 9);
}

/// A journal file found empty (zero bytes) after a crash: fencegate never
/// leaves one, so the store says at start-up what it means and what it does
/// with it (a WARN line), and starts from the store file and the other
/// journal file.
///
/// Failed before: the empty file was taken silently as a journal holding
/// nothing, with not a line in the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_journal_file_after_a_crash_is_warned_about() {
    let up = RecordingUpstream::start().await;
    let (site, store, config) = file_store_site(&up);
    let mut fg = Running::start_in(site.path(), &config).await;
    assert_eq!(put(&fg.url("/objects/e"), 3, "x").await.status, 200);
    fg.kill();
    let emptied = store.join("fences.journal-0");
    std::fs::write(&emptied, b"").unwrap();

    let mut fg = Running::start_in(site.path(), &config).await;
    let warned = |e: &serde_json::Value| {
        e["level"] == "WARN"
            && e["message"].as_str().is_some_and(|m| {
                m.contains("fences.journal-0")
                    && m.contains("empty (zero bytes)")
                    && m.contains("holds no marks")
                    && m.contains("not clean")
            })
    };
    let line = fg.wait_event("a WARN about the empty journal file", warned).await;
    assert_eq!(line["clean_stop"], false, "{line}");
    // It is written afresh, and the store serves.
    assert!(std::fs::metadata(&emptied).unwrap().len() > 0, "the empty journal file was not written afresh");
    assert_eq!(put(&fg.url("/objects/e"), 4, "y").await.status, 200);
}

/// A store fencegate 0.1 wrote (redb 2's file format v2, its two tables of
/// `&str` to `u64`) is upgraded at start, which the log says, and every
/// fence in it is enforced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_fencegate_0_1_wrote_is_upgraded_at_start_with_every_fence_kept() {
    let up = RecordingUpstream::start().await;
    let (site, store, config) = file_store_site(&up);
    std::fs::create_dir_all(&store).unwrap();
    {
        let db = redb2::Database::create(store.join("fences.redb")).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut fences = txn.open_table(redb2::TableDefinition::<&str, u64>::new("fences")).unwrap();
            for k in 0..500u64 {
                fences.insert(format!("/objects/{k}").as_str(), 1000 + k).unwrap();
            }
            txn.open_table(redb2::TableDefinition::<&str, u64>::new("meta")).unwrap().insert("clean", 1).unwrap();
        }
        txn.commit().unwrap();
    }

    let fg = Running::start_in(site.path(), &config).await;
    let upgraded = fg.events().into_iter().find(|e| {
        e["message"].as_str().is_some_and(|m| m.contains("upgraded to the current file format, every fence kept"))
    });
    assert_eq!(upgraded.map(|e| e["fences"].clone()), Some(500.into()), "{}", fg.output());
    for k in [0, 1, 250, 499] {
        let key = format!("/objects/{k}");
        assert_eq!(fence(&fg.admin_url(""), &key).await, Some(1000 + k));
        assert_eq!(assert_stale(&fg.url(&key), 999 + k, 1000 + k).await, 1000 + k);
    }
    assert!(up.applied().is_empty(), "a stale write reached the upstream");
    assert_eq!(put(&fg.url("/objects/7"), 2000, "newer").await.status, 200);
}
