//! Raising-token write throughput, end to end through fencegate: the durable file
//! store against the memory store, side by side in one run.
//!
//! `cargo bench --bench store`. One process, one tokio multi-thread runtime with
//! 2 workers, holding a minimal upstream (hyper http1, 200 to everything), two
//! in-process fencegates (store = "memory" and store = "file" in a fresh temp
//! dir) and the load generator. Every `PUT /objects/k{i}` carries a token one
//! higher than the previous one for its key, so every request raises a mark and,
//! with the file store, needs a commit. Rounds are interleaved (memory, file,
//! memory, file, ...) so drift of a noisy machine hits both alike.
//!
//! Environment:
//! - `BENCH_SECONDS` (3): length of one round.
//! - `BENCH_ROUNDS` (3): rounds per store.
//! - `BENCH_WARMUP` (1): seconds of unmeasured load per store first.
//! - `BENCH_CONNS` (64): concurrent client tasks (= keep-alive connections).
//! - `BENCH_KEYS` (10000): distinct keys.
//! - `BENCH_DIRECT` (1): also drive the stores directly (no HTTP) for the same
//!   time, and time bare fsyncs, to explain the end-to-end numbers. 0 skips.
//! - `BENCH_DIRECT_TASKS` (64,1024): concurrent tasks for the direct file store
//!   runs; more tasks make bigger commit batches.
//! - `BENCH_STORES` (memory,file): which stores, in round order; one alone is
//!   handy under a profiler.
//! - `BENCH_DIR`: where the file store goes (default: the system temp dir).
//!
//! See benches/README.md for results and how to read them.

// What fencegate ships with (src/main.rs).
#[path = "../src/allocator.rs"]
mod allocator;

/// The allocator the fencegate binary ships with, so the numbers are its numbers.
#[global_allocator]
static ALLOCATOR: allocator::Mimalloc = allocator::Mimalloc;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use fencegate::fence::store::{Advance, FenceStore, FileStore, MemoryStore};
use http::{HeaderValue, Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;

type HttpClient = Client<HttpConnector, Full<Bytes>>;

#[derive(Clone, Debug)]
struct Settings {
    seconds: f64,
    rounds: usize,
    warmup: f64,
    conns: usize,
    keys: usize,
    direct: bool,
    /// Concurrent tasks for the direct runs of the file store.
    direct_tasks: Vec<usize>,
    /// Which fencegates to run, in round order: "memory", "file" or both.
    stores: &'static [&'static str],
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(v) => v.trim().parse().unwrap_or_else(|_| panic!("{name}={v:?} is not a valid value")),
        Err(_) => default,
    }
}

fn main() {
    let s = Settings {
        seconds: env_or("BENCH_SECONDS", 3.0),
        rounds: env_or("BENCH_ROUNDS", 3),
        warmup: env_or("BENCH_WARMUP", 1.0),
        conns: env_or("BENCH_CONNS", 64),
        keys: env_or("BENCH_KEYS", 10_000),
        direct: env_or("BENCH_DIRECT", 1u8) != 0,
        direct_tasks: std::env::var("BENCH_DIRECT_TASKS")
            .unwrap_or_else(|_| "64,1024".into())
            .split(',')
            .map(|n| n.trim().parse().expect("BENCH_DIRECT_TASKS: a list of numbers"))
            .collect(),
        stores: match std::env::var("BENCH_STORES").as_deref() {
            Err(_) | Ok("memory,file") => &["memory", "file"],
            Ok("file,memory") => &["file", "memory"],
            Ok("memory") => &["memory"],
            Ok("file") => &["file"],
            Ok(other) => panic!("BENCH_STORES={other:?}: expected memory,file (default), file,memory, memory or file"),
        },
    };
    assert!(s.conns > 0 && s.keys >= s.conns, "need BENCH_KEYS >= BENCH_CONNS > 0 (each task owns its keys)");
    let base = std::env::var_os("BENCH_DIR").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
    let dir = base.join(format!("fencegate-bench-store-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);

    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let failed = rt.block_on(run(s, &dir));
    drop(rt);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(failed, 0, "{failed} requests did not answer 200");
}

/// One fencegate under test and the per-key token table of its keys.
struct Target {
    name: &'static str,
    admin: SocketAddr,
    uris: Vec<Uri>,
    /// The last token sent per key. Key `i` is only ever used by task `i % conns`,
    /// one request at a time, so tokens reach fencegate in increasing order.
    tokens: Arc<Vec<AtomicU64>>,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
    rounds: Vec<RoundResult>,
}

struct RoundResult {
    rps: f64,
    p50_us: u64,
    p99_us: u64,
    cpu_us_per_req: f64,
    committer_cpu_us_per_req: f64,
    commits: Option<u64>,
    raises: Option<u64>,
    commit_seconds: Option<f64>,
}

async fn run(s: Settings, dir: &Path) -> u64 {
    println!(
        "fencegate store bench: {} round(s) x {}s per store (+{}s warm-up), {} connections, {} keys, every PUT \
         raises its key's token; tokio multi-thread runtime, 2 workers, {} CPUs",
        s.rounds,
        s.seconds,
        s.warmup,
        s.conns,
        s.keys,
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0)
    );
    let upstream = start_upstream().await;
    let file_dir = dir.join("fences");
    let mut targets = Vec::new();
    for kind in s.stores.iter().copied() {
        targets.push(match kind {
            "memory" => start_fencegate("memory", "store = \"memory\"", upstream, s.keys).await,
            _ => {
                let fences =
                    format!("store = \"file\"\npath = {:?}\ncache_keys = 1000000", file_dir.display().to_string());
                start_fencegate("file", &fences, upstream, s.keys).await
            }
        });
    }
    println!("upstream {upstream}, file store in {}", file_dir.display());
    let client: HttpClient = {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        Client::builder(TokioExecutor::new()).pool_max_idle_per_host(s.conns * 2).build(connector)
    };

    let mut failed = 0;
    if s.warmup > 0.0 {
        for t in &targets {
            let r = drive(&client, t, s.conns, Duration::from_secs_f64(s.warmup)).await;
            failed += r.failed;
            println!("warm-up  {:<6} {:>8.0} req/s", t.name, r.done as f64 / r.elapsed.as_secs_f64());
        }
    }
    for round in 1..=s.rounds {
        for t in targets.iter_mut() {
            let before = scrape(&client, t.admin).await;
            let cpu0 = process_cpu_ns();
            let r = drive(&client, t, s.conns, Duration::from_secs_f64(s.seconds)).await;
            let cpu1 = process_cpu_ns();
            let (cpu, committer_cpu) = (cpu1.0.saturating_sub(cpu0.0), cpu1.1.saturating_sub(cpu0.1));
            let after = scrape(&client, t.admin).await;
            failed += r.failed;
            let delta = |name: &str| Some(metric(&after, name)? - metric(&before, name).unwrap_or(0.0));
            let mut lat = r.latencies_us;
            lat.sort_unstable();
            let rr = RoundResult {
                rps: r.done as f64 / r.elapsed.as_secs_f64(),
                p50_us: percentile(&lat, 0.50),
                p99_us: percentile(&lat, 0.99),
                cpu_us_per_req: cpu as f64 / 1e3 / r.done.max(1) as f64,
                committer_cpu_us_per_req: committer_cpu as f64 / 1e3 / r.done.max(1) as f64,
                commits: delta("fencegate_store_commits_total").map(|v| v as u64),
                raises: delta("fencegate_store_raises_total").map(|v| v as u64),
                commit_seconds: delta("fencegate_store_commit_duration_seconds_sum"),
            };
            println!(
                "round {round} {:<6} {:>8.0} req/s  p50 {:>6} us  p99 {:>6} us  {:>5.1} us CPU/req{}{}{}",
                t.name,
                rr.rps,
                rr.p50_us,
                rr.p99_us,
                rr.cpu_us_per_req,
                if rr.committer_cpu_us_per_req > 0.0 {
                    format!(" (committer thread {:.1})", rr.committer_cpu_us_per_req)
                } else {
                    String::new()
                },
                match (rr.commits, rr.raises) {
                    (Some(c), Some(r)) if c > 0 =>
                        format!("  commits {c}, raises {r} ({:.1} raises/commit)", r as f64 / c as f64),
                    _ => String::new(),
                },
                if r.failed > 0 { format!("  {} NOT 200", r.failed) } else { String::new() },
            );
            t.rounds.push(rr);
        }
    }

    if s.rounds > 0 {
        report(&targets, &s);
    }
    for t in targets {
        let _ = t.stop.send(());
        let _ = t.task.await;
    }
    if s.direct {
        direct(&s, &dir.join("direct")).await;
        fsync_probe(dir);
    }
    failed
}

fn report(targets: &[Target], s: &Settings) {
    let summary = |t: &Target| {
        let mut rps: Vec<f64> = t.rounds.iter().map(|r| r.rps).collect();
        rps.sort_by(f64::total_cmp);
        let best = rps.last().copied().unwrap_or(0.0);
        let median = rps.get(rps.len() / 2).copied().unwrap_or(0.0);
        // Latency and CPU of the best round.
        let b = t.rounds.iter().max_by(|a, b| a.rps.total_cmp(&b.rps)).expect("at least one round");
        (best, median, b.p50_us, b.p99_us, b.cpu_us_per_req)
    };
    println!();
    println!("| store | best req/s | median req/s | p50 (best round) | p99 (best round) | CPU/req (best round) |");
    println!("|---|---:|---:|---:|---:|---:|");
    for t in targets {
        let (best, median, p50, p99, cpu) = summary(t);
        println!("| {} | {best:.0} | {median:.0} | {p50} µs | {p99} µs | {cpu:.1} µs |", t.name);
    }
    let by_name = |name: &str| targets.iter().find(|t| t.name == name);
    if let (Some(mt), Some(ft)) = (by_name("memory"), by_name("file")) {
        let (m, f) = (summary(mt), summary(ft));
        println!(
            "| **file / memory** | **×{:.2}** | **×{:.2}** | ×{:.2} | ×{:.2} | ×{:.2} |",
            f.0 / m.0,
            f.1 / m.1,
            f.2 as f64 / m.2.max(1) as f64,
            f.3 as f64 / m.3.max(1) as f64,
            f.4 / m.4
        );
        // Each file round against the memory round next to it in time: the
        // machine's drift hits both sides of one pair alike.
        let mut paired: Vec<f64> = mt.rounds.iter().zip(&ft.rounds).map(|(m, f)| f.rps / m.rps).collect();
        paired.sort_by(f64::total_cmp);
        let ratio = f.0 / m.0;
        println!(
            "\nfile/memory: best rounds ×{ratio:.2}, per round pair {} (median ×{:.2}); target ≥ ×0.80: {}",
            paired.iter().map(|r| format!("×{r:.2}")).collect::<Vec<_>>().join(" "),
            paired[paired.len() / 2],
            if ratio >= 0.8 { "MET" } else { "MISSED" }
        );
    }
    let Some(file) = targets.iter().find(|t| t.name == "file") else { return };
    let (c, r, secs) = file.rounds.iter().fold((0u64, 0u64, 0f64), |(c, r, sec), x| {
        (c + x.commits.unwrap_or(0), r + x.raises.unwrap_or(0), sec + x.commit_seconds.unwrap_or(0.0))
    });
    if file.rounds.iter().any(|x| x.commits.is_some()) && c > 0 {
        println!(
            "file store over {} measured rounds: {c} commits, {r} raises = {:.1} raises per commit (group commit), \
             mean commit {:.2} ms (fsync included), committer busy {:.0}% of the time",
            file.rounds.len(),
            r as f64 / c as f64,
            secs * 1e3 / c as f64,
            secs / (file.rounds.len() as f64 * s.seconds) * 100.0
        );
    } else {
        println!("file store commits/raises: not exported on /metrics by this build (fencegate_store_*); skipped");
    }
}

struct DriveResult {
    done: u64,
    failed: u64,
    elapsed: Duration,
    latencies_us: Vec<u32>,
}

/// `conns` tasks, each sending PUTs to its own keys in turn until `length` is up.
async fn drive(client: &HttpClient, t: &Target, conns: usize, length: Duration) -> DriveResult {
    let started = Instant::now();
    let deadline = started + length;
    let tasks: Vec<_> = (0..conns)
        .map(|task| {
            let (client, uris, tokens) = (client.clone(), t.uris.clone(), t.tokens.clone());
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(1 << 16);
                let (mut done, mut failed) = (0u64, 0u64);
                let mut key = task;
                while Instant::now() < deadline {
                    let token = tokens[key].fetch_add(1, Ordering::Relaxed) + 1;
                    let req = Request::put(uris[key].clone())
                        .header("x-fencing-token", HeaderValue::from(token))
                        .body(Full::new(Bytes::from_static(b"x")))
                        .expect("valid request");
                    let sent = Instant::now();
                    let ok = match client.request(req).await {
                        Ok(resp) => {
                            let status = resp.status();
                            let body = resp.into_body().collect().await;
                            if status != StatusCode::OK && failed < 3 {
                                let text = body.map(|b| b.to_bytes()).unwrap_or_default();
                                eprintln!(
                                    "PUT {} token {token}: {status} {}",
                                    uris[key],
                                    String::from_utf8_lossy(&text)
                                );
                            }
                            status == StatusCode::OK
                        }
                        Err(e) => {
                            if failed < 3 {
                                eprintln!("PUT {} token {token}: {e:?}", uris[key]);
                            }
                            false
                        }
                    };
                    latencies.push(sent.elapsed().as_micros().min(u32::MAX as u128) as u32);
                    done += 1;
                    failed += u64::from(!ok);
                    key += conns;
                    if key >= uris.len() {
                        key = task;
                    }
                }
                (done, failed, latencies)
            })
        })
        .collect();
    let mut r = DriveResult { done: 0, failed: 0, elapsed: Duration::ZERO, latencies_us: Vec::new() };
    for task in tasks {
        let (done, failed, latencies) = task.await.expect("client task panicked");
        r.done += done;
        r.failed += failed;
        r.latencies_us.extend(latencies);
    }
    r.elapsed = started.elapsed();
    r
}

fn percentile(sorted: &[u32], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1;
    u64::from(sorted[i])
}

/// CPU time so far of every thread of this process (load generator, upstream,
/// fencegate and the file store's committer alike) and of the committer thread
/// alone, in ns. Threads that have exited are not counted.
fn process_cpu_ns() -> (u64, u64) {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return (0, 0) };
    let (mut all, mut committer) = (0, 0);
    for task in tasks.filter_map(Result::ok) {
        let path = task.path();
        let Some(ns) = std::fs::read_to_string(path.join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        else {
            continue;
        };
        all += ns;
        if std::fs::read_to_string(path.join("comm")).is_ok_and(|c| c.starts_with("fencegate-comm")) {
            committer += ns;
        }
    }
    (all, committer)
}

/// A minimal upstream: HTTP/1.1 with keep-alive, reads the body, answers 200.
async fn start_upstream() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            let _ = stream.set_nodelay(true);
            tokio::spawn(async move {
                let service = hyper::service::service_fn(|req: Request<Incoming>| async move {
                    let _ = req.into_body().collect().await;
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
                });
                let _ =
                    hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
            });
        }
    });
    addr
}

async fn start_fencegate(name: &'static str, fences: &str, upstream: SocketAddr, keys: usize) -> Target {
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nshutdown_grace = \"2s\"\n[admin]\nlisten = \"127.0.0.1:0\"\n\
         [fences]\n{fences}\n[[route]]\nname = \"objects\"\nprefix = \"/objects/\"\nupstream = \"http://{upstream}\"\n"
    );
    let config = fencegate::Config::from_toml_str(&text)
        .and_then(|c| c.read_secrets())
        .unwrap_or_else(|e| panic!("{e}\n---\n{text}"));
    let server = fencegate::Fencegate::bind(config).await.unwrap_or_else(|e| panic!("{name}: {e}"));
    let (addr, admin) = (server.proxy_addr(), server.admin_addr());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(server.run(async move {
        let _ = stopped.await;
    }));
    let uris = (0..keys).map(|i| format!("http://{addr}/objects/k{i}").parse().unwrap()).collect();
    let tokens = Arc::new((0..keys).map(|_| AtomicU64::new(0)).collect());
    Target { name, admin, uris, tokens, stop, task, rounds: Vec::new() }
}

async fn scrape(client: &HttpClient, admin: SocketAddr) -> String {
    let uri: Uri = format!("http://{admin}/metrics").parse().unwrap();
    let req = Request::get(uri).body(Full::new(Bytes::new())).unwrap();
    match client.request(req).await {
        Ok(resp) => match resp.into_body().collect().await {
            Ok(body) => String::from_utf8_lossy(&body.to_bytes()).into_owned(),
            Err(_) => String::new(),
        },
        Err(_) => String::new(),
    }
}

/// The sum over all label sets of series `name` in a text exposition, or `None`
/// when the series is not there.
fn metric(text: &str, name: &str) -> Option<f64> {
    let mut found = None;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some(rest) = line.strip_prefix(name) else { continue };
        let value = match rest.as_bytes().first() {
            Some(b' ') => rest.trim(),
            Some(b'{') => rest.rsplit_once('}').map_or("", |(_, v)| v.trim()),
            _ => continue,
        };
        if let Some(v) = value.split_whitespace().next().and_then(|v| v.parse::<f64>().ok()) {
            *found.get_or_insert(0.0) += v;
        }
    }
    found
}

/// The stores alone, no HTTP: the same raising workload through
/// `FenceStore::advance`, to separate the store's cost from the proxy's.
async fn direct(s: &Settings, dir: &Path) {
    let keys: Arc<Vec<String>> = Arc::new((0..s.keys).map(|i| format!("/objects/k{i}")).collect());
    let length = Duration::from_secs_f64(s.seconds);
    println!("\nstores driven directly through FenceStore::advance (no HTTP), {} keys, {}s each:", s.keys, s.seconds);
    let memory = Arc::new(MemoryStore::default());
    let (n, secs) = advance_for(&memory, &keys, s.conns, length).await;
    let memory_rate = n as f64 / secs;
    println!("  memory, {:>5} tasks {memory_rate:>10.0} advances/s", s.conns);
    let file = Arc::new(FileStore::open(dir, false, 1_000_000).expect("open the file store"));
    // First raise of every key (inserts), unmeasured; then measured runs of updates.
    advance_for(&file, &keys, s.conns, Duration::from_secs_f64(s.warmup.max(0.5))).await;
    let stats = file.stats().expect("the file store has commit stats");
    for &tasks in &s.direct_tasks {
        let (c0, r0, sum0) = (stats.commits(), stats.raises(), histogram_sum(&stats.commit_seconds));
        let cpu0 = process_cpu_ns();
        let (n, secs) = advance_for(&file, &keys, tasks, length).await;
        let cpu1 = process_cpu_ns();
        let (c, r) = (stats.commits() - c0, stats.raises() - r0);
        let sum = histogram_sum(&stats.commit_seconds) - sum0;
        println!(
            "  file,   {tasks:>5} tasks {:>10.0} advances/s; {c} commits, {r} raises = {:>5.1} raises/commit, mean \
             commit {:.2} ms, committer busy {:>3.0}%, CPU per advance {:.1} us (committer thread {:.1} us)",
            n as f64 / secs,
            r as f64 / c.max(1) as f64,
            sum * 1e3 / c.max(1) as f64,
            sum / secs * 100.0,
            (cpu1.0 - cpu0.0) as f64 / 1e3 / n.max(1) as f64,
            (cpu1.1 - cpu0.1) as f64 / 1e3 / n.max(1) as f64,
        );
    }
    file.close().await;
}

/// `tasks` tasks raising their own keys' tokens through `advance` for `length`.
/// Returns how many advances were done and in how many seconds.
async fn advance_for<S: FenceStore>(
    store: &Arc<S>,
    keys: &Arc<Vec<String>>,
    tasks: usize,
    length: Duration,
) -> (u64, f64) {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let epoch = *EPOCH.get_or_init(Instant::now);
    let started = Instant::now();
    let deadline = started + length;
    let handles: Vec<_> = (0..tasks)
        .map(|task| {
            let (store, keys) = (store.clone(), keys.clone());
            tokio::spawn(async move {
                let mut tokens = vec![0u64; keys.len().div_ceil(tasks)];
                let mut n = 0u64;
                let mut slot = 0;
                while Instant::now() < deadline {
                    let key = task + slot * tasks;
                    if key >= keys.len() {
                        slot = 0;
                        continue;
                    }
                    // Nanoseconds since the first call: above anything an earlier
                    // call sent for this key, and one more than the last at least.
                    let token = (epoch.elapsed().as_nanos() as u64).max(tokens[slot] + 1);
                    tokens[slot] = token;
                    match store.advance(&keys[key], token).await {
                        Ok(Advance::Accepted { .. }) => {}
                        other => panic!("advance {} {token}: {other:?}", keys[key]),
                    }
                    n += 1;
                    slot += 1;
                }
                n
            })
        })
        .collect();
    let mut n = 0;
    for h in handles {
        n += h.await.expect("advance task panicked");
    }
    (n, started.elapsed().as_secs_f64())
}

fn histogram_sum(h: &prometheus_client::metrics::histogram::Histogram) -> f64 {
    let mut registry = prometheus_client::registry::Registry::default();
    registry.register("h", "", h.clone());
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode a histogram");
    metric(&text, "h_sum").unwrap_or(0.0)
}

/// What one fsync costs on the disk under the store: 4 KiB overwrites, each
/// followed by `sync_data`, like a commit's last step.
fn fsync_probe(dir: &Path) {
    use std::io::{Seek, SeekFrom, Write};
    let _ = std::fs::create_dir_all(dir);
    let path = dir.join("fsync-probe");
    let Ok(mut f) = std::fs::OpenOptions::new().create(true).truncate(true).read(true).write(true).open(&path) else {
        return;
    };
    let page = [0x5au8; 4096];
    let mut times = Vec::new();
    for i in 0..200u64 {
        let t = Instant::now();
        if f.seek(SeekFrom::Start((i % 16) * 4096))
            .and_then(|_| f.write_all(&page))
            .and_then(|_| f.sync_data())
            .is_err()
        {
            return;
        }
        times.push(t.elapsed().as_micros() as u32);
    }
    times.sort_unstable();
    println!(
        "  disk    write 4 KiB + fdatasync: p50 {} us, p99 {} us ({} samples, {})",
        percentile(&times, 0.5),
        percentile(&times, 0.99),
        times.len(),
        dir.display()
    );
    let _ = std::fs::remove_file(path);
}
