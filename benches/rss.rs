//! Resident memory per tracked key: the file store with a bounded cache against
//! the memory store, which keeps every mark.
//!
//! `cargo bench --bench rss`. Each measurement runs in a child process of its
//! own (this binary again, with `RSS_PHASE` set), so memory one store freed but
//! the allocator kept can't flatter the next. In a child:
//!
//! 1. build a tokio multi-thread runtime (2 workers), open the store, read VmRSS;
//! 2. raise a mark for each of K new keys through `FenceStore::advance`, from
//!    many tasks at once so the file store's group commit batches them;
//! 3. file store: wait until the cache sweeper (wakes at least once a second) has
//!    brought the cache under `cache_keys`, and a little longer;
//! 4. read VmRSS again: (after - before) / K is the cost of a tracked key.
//!
//! For the file store, checkpoints accumulate in one store: 1M keys, then 9M
//! more for 10M in all.
//!
//! Environment:
//! - `RSS_KEYS` (1000000,10000000): file store checkpoints, cumulative key counts.
//! - `RSS_MEMORY_KEYS` (1000000): keys for the memory store; 0 skips it.
//! - `RSS_CACHE_KEYS` (1000000): the file store's `cache_keys`.
//! - `RSS_TASKS` (1024): concurrent tasks calling `advance`.
//! - `RSS_SETTLE` (3): seconds to wait after the cache is under capacity.
//! - `RSS_DIR`: where the file store goes (default: the system temp dir).

// What fencegate ships with (src/main.rs).
#[path = "../src/allocator.rs"]
mod allocator;

/// The allocator the fencegate binary ships with, so the numbers are its numbers.
#[global_allocator]
static ALLOCATOR: allocator::Mimalloc = allocator::Mimalloc;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fencegate::fence::store::{Advance, FenceStore, FileStore, MemoryStore};

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(v) => v.trim().parse().unwrap_or_else(|_| panic!("{name}={v:?} is not a valid value")),
        Err(_) => default,
    }
}

fn checkpoints() -> Vec<u64> {
    let text = std::env::var("RSS_KEYS").unwrap_or_else(|_| "1000000,10000000".into());
    let mut keys: Vec<u64> = text
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| s.trim().replace('_', "").parse().unwrap_or_else(|_| panic!("RSS_KEYS: {s:?} is not a number")))
        .collect();
    keys.sort_unstable();
    keys.dedup();
    keys
}

fn base_dir() -> PathBuf {
    std::env::var_os("RSS_DIR").map(PathBuf::from).unwrap_or_else(std::env::temp_dir)
}

fn main() {
    match std::env::var("RSS_PHASE").as_deref() {
        Ok("memory") => child_memory(),
        Ok("file") => child_file(),
        Ok(other) => panic!("RSS_PHASE={other:?}: expected memory or file"),
        Err(_) => parent(),
    }
}

/// One measurement a child reports: `RESULT store keys before_kib after_kib cached tracked db_bytes`.
struct Measured {
    store: String,
    keys: u64,
    before_kib: u64,
    after_kib: u64,
    hwm_kib: u64,
    cached: u64,
    db_bytes: u64,
}

fn parent() {
    let file_keys = checkpoints();
    let memory_keys: u64 = env_or("RSS_MEMORY_KEYS", 1_000_000);
    let cache_keys: u64 = env_or("RSS_CACHE_KEYS", 1_000_000);
    let base = base_dir();
    println!(
        "fencegate RSS bench: file store (cache_keys = {cache_keys}) at {file_keys:?} keys, memory store at \
         {memory_keys} keys; {} tasks calling advance; store in {}",
        env_or("RSS_TASKS", 1024u64),
        base.display()
    );
    // Disk first: a 10M-key store should take well under a few GB.
    match Command::new("df").arg("-h").arg(&base).output() {
        Ok(out) => print!("{}", String::from_utf8_lossy(&out.stdout)),
        Err(e) => println!("df -h {}: {e}", base.display()),
    }
    if let Some(avail) = Command::new("df")
        .args(["--output=avail", "-B1"])
        .arg(&base)
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).lines().nth(1)?.trim().parse::<u64>().ok())
    {
        let need = file_keys.last().copied().unwrap_or(0) * 400;
        assert!(avail > need, "{avail} bytes free in {}, want at least {need} (400 B per key)", base.display());
    }

    let exe = std::env::current_exe().expect("own path");
    let mut results = Vec::new();
    let mut phases = Vec::new();
    if memory_keys > 0 {
        phases.push("memory");
    }
    if !file_keys.is_empty() {
        phases.push("file");
    }
    for phase in phases {
        println!("\n== {phase} store (child process) ==");
        let mut child = Command::new(&exe)
            .env("RSS_PHASE", phase)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start a child");
        for line in BufReader::new(child.stdout.take().unwrap()).lines() {
            let line = line.expect("child output");
            match line.strip_prefix("RESULT ") {
                Some(rest) => {
                    let f: Vec<&str> = rest.split_whitespace().collect();
                    let n = |i: usize| f[i].parse::<u64>().unwrap();
                    results.push(Measured {
                        store: f[0].to_string(),
                        keys: n(1),
                        before_kib: n(2),
                        after_kib: n(3),
                        hwm_kib: n(4),
                        cached: n(5),
                        db_bytes: n(6),
                    });
                }
                None => println!("{line}"),
            }
        }
        let status = child.wait().expect("child ran");
        assert!(status.success(), "{phase} child failed: {status}");
    }

    println!();
    println!(
        "| store | tracked keys | cached marks | RSS before | RSS after | peak RSS | RSS per tracked key | db file |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for m in &results {
        let per_key = (m.after_kib.saturating_sub(m.before_kib)) as f64 * 1024.0 / m.keys as f64;
        println!(
            "| {} | {} | {} | {:.1} MiB | {:.1} MiB | {:.1} MiB | **{per_key:.1} B** | {} |",
            m.store,
            m.keys,
            m.cached,
            m.before_kib as f64 / 1024.0,
            m.after_kib as f64 / 1024.0,
            m.hwm_kib as f64 / 1024.0,
            if m.db_bytes > 0 { format!("{:.0} MiB", m.db_bytes as f64 / (1 << 20) as f64) } else { "-".into() },
        );
    }
    if let Some(m) = results.iter().filter(|m| m.store == "file").max_by_key(|m| m.keys) {
        let per_key = (m.after_kib.saturating_sub(m.before_kib)) as f64 * 1024.0 / m.keys as f64;
        println!(
            "\nfile store at {} keys: {per_key:.1} B of RSS per tracked key: target <= 100 B {}",
            m.keys,
            if per_key <= 100.0 { "MET" } else { "MISSED" }
        );
    }
}

/// `VmRSS`, `VmHWM` (peak), `RssAnon`, `RssFile` and `Threads` from /proc/self/status.
#[derive(Debug, Default, Clone, Copy)]
struct Status {
    rss_kib: u64,
    hwm_kib: u64,
    anon_kib: u64,
    file_kib: u64,
    threads: u64,
}

fn status() -> Status {
    let text = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let mut s = Status::default();
    for line in text.lines() {
        let Some((name, value)) = line.split_once(':') else { continue };
        let v = value.split_whitespace().next().and_then(|v| v.parse().ok()).unwrap_or(0);
        match name {
            "VmRSS" => s.rss_kib = v,
            "VmHWM" => s.hwm_kib = v,
            "RssAnon" => s.anon_kib = v,
            "RssFile" => s.file_kib = v,
            "Threads" => s.threads = v,
            _ => {}
        }
    }
    s
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        // As fencegate's worker runtimes.
        .max_blocking_threads(fencegate::MAX_BLOCKING_THREADS)
        .enable_all()
        .build()
        .unwrap()
}

/// The key of mark number `i`: what a `{path}` key template makes of `/objects/k{i}`.
fn key(i: u64) -> String {
    format!("/objects/k{i}")
}

/// Raises keys `from..to` to token 1 with `tasks` tasks, printing progress.
async fn raise<S: FenceStore>(store: &Arc<S>, from: u64, to: u64, tasks: usize, what: &str) {
    let next = Arc::new(AtomicU64::new(from));
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let workers: Vec<_> = (0..tasks)
        .map(|_| {
            let (store, next, done) = (store.clone(), next.clone(), done.clone());
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= to {
                        return;
                    }
                    match store.advance(&key(i), 1).await {
                        Ok(Advance::Accepted { previous: None }) => {}
                        other => panic!("advance {} 1: {other:?}", key(i)),
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let total = to - from;
    let mut last = (Instant::now(), 0u64);
    let progress = {
        let (store, done) = (store.clone(), done.clone());
        let what = what.to_string();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(5)).await;
                let n = done.load(Ordering::Relaxed);
                let now = Instant::now();
                let rate = (n - last.1) as f64 / now.duration_since(last.0).as_secs_f64();
                last = (now, n);
                let st = status();
                let commits = store.stats().map(|s| format!(", {} commits, {} raises", s.commits(), s.raises()));
                println!(
                    "  {what}: {n}/{total} ({:.0}%), {rate:.0}/s, cached {}, RSS {:.0} MiB (anon {:.0}, file {:.0}), \
                     {} threads{}",
                    n as f64 * 100.0 / total as f64,
                    store.cached_keys(),
                    mib(st.rss_kib),
                    mib(st.anon_kib),
                    mib(st.file_kib),
                    st.threads,
                    commits.unwrap_or_default()
                );
            }
        })
    };
    for w in workers {
        w.await.expect("raise task panicked");
    }
    progress.abort();
    let secs = started.elapsed().as_secs_f64();
    println!("  {what}: {total} keys raised in {secs:.1}s ({:.0}/s)", total as f64 / secs);
}

fn report(store: &str, keys: u64, before: Status, cached: usize, db_bytes: u64) {
    let after = status();
    let per_key = after.rss_kib.saturating_sub(before.rss_kib) as f64 * 1024.0 / keys as f64;
    println!(
        "  {store} at {keys} keys: RSS {:.1} -> {:.1} MiB (anon {:.1}, file {:.1}, peak {:.1}), {} threads, {cached} \
         cached: {per_key:.1} B per key",
        mib(before.rss_kib),
        mib(after.rss_kib),
        mib(after.anon_kib),
        mib(after.file_kib),
        mib(after.hwm_kib),
        after.threads,
    );
    println!("RESULT {store} {keys} {} {} {} {cached} {db_bytes}", before.rss_kib, after.rss_kib, after.hwm_kib);
}

fn child_memory() {
    let keys: u64 = env_or("RSS_MEMORY_KEYS", 1_000_000);
    let tasks: usize = env_or("RSS_TASKS", 1024);
    let rt = runtime();
    rt.block_on(async {
        let before = status();
        let store = Arc::new(MemoryStore::default());
        raise(&store, 0, keys, tasks, "memory").await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        report("memory", keys, before, store.cached_keys(), 0);
    });
}

fn child_file() {
    let checkpoints = checkpoints();
    let cache_keys: usize = env_or("RSS_CACHE_KEYS", 1_000_000);
    let tasks: usize = env_or("RSS_TASKS", 1024);
    let settle: f64 = env_or("RSS_SETTLE", 3.0);
    let dir = base_dir().join(format!("fencegate-bench-rss-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let rt = runtime();
    rt.block_on(async {
        // The store's fixed costs (redb's page cache, the committer thread) count
        // as "before" only once they exist: open first, then measure.
        let store = Arc::new(FileStore::open(&dir, false, cache_keys).expect("open the file store"));
        tokio::time::sleep(Duration::from_millis(200)).await;
        let before = status();
        println!("  file store opened in {}: RSS {:.1} MiB", dir.display(), mib(before.rss_kib));
        let mut from = 0;
        for &to in &checkpoints {
            raise(&store, from, to, tasks, "file").await;
            from = to;
            let waiting = Instant::now();
            while store.cached_keys() > cache_keys {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            println!(
                "  cache under capacity ({} <= {cache_keys}) after {:.1}s; settling {settle}s",
                store.cached_keys(),
                waiting.elapsed().as_secs_f64()
            );
            tokio::time::sleep(Duration::from_secs_f64(settle)).await;
            assert_eq!(store.tracked_keys() as u64, to, "tracked keys");
            let db_bytes = std::fs::metadata(store.path()).map(|m| m.len()).unwrap_or(0);
            let stats = store.stats().expect("file store stats");
            println!(
                "  {} commits for {} raises = {:.0} raises per commit",
                stats.commits(),
                stats.raises(),
                stats.raises() as f64 / stats.commits().max(1) as f64
            );
            report("file", to, before, store.cached_keys(), db_bytes);
        }
        drop(store);
    });
    drop(rt);
    remove_store(&dir);
}

fn remove_store(dir: &Path) {
    if let Err(e) = std::fs::remove_dir_all(dir) {
        eprintln!("cannot remove {}: {e}", dir.display());
    }
}
