//! Fenced write throughput, end to end through fencegate: the durable file store,
//! the Redis store and the etcd store against the memory store, side by side in
//! one run.
//!
//! `cargo bench --bench store`. One process, one tokio multi-thread runtime with
//! 2 workers, holding a minimal upstream (hyper http1, 200 to everything), one
//! in-process fencegate per store (store = "memory"; store = "file" in a fresh
//! temp dir; store = "redis" on a `redis-server` this bench starts as a child
//! process on a free loopback port, its dir in the same temp dir, killed at the
//! end; store = "etcd" on a one-member `etcd` started the same way) and the load
//! generator. With `BENCH_TOKENS=raise` (the default) every `PUT /objects/k{i}`
//! carries a token one higher than the previous one for its key, so every
//! request raises a mark and, with the file store, needs a commit, with the
//! Redis store runs the `enter` script (and a `ZREM` when its turn ends), and
//! with etcd commits a transaction. With `BENCH_TOKENS=equal` every request
//! carries token 1, the mark after the first: the lock holder's own writes,
//! which share their key. Rounds are interleaved (memory, file, redis, etcd,
//! memory, ...) so drift of a noisy machine hits all alike. Redis and etcd
//! share the two cores: their own CPU per request (from `/proc/<pid>/stat`) is
//! reported beside the bench process's.
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
//! - `BENCH_STORES` (memory,file,redis,etcd; redis and etcd only when
//!   `redis-server` and `etcd` are on the PATH): which stores, in round order,
//!   any of the four in any order; one alone is handy under a profiler.
//! - `BENCH_TOKENS` (raise): `raise` (every write raises its key's mark) or
//!   `equal` (every write carries the mark: the holder's writes).
//! - `BENCH_REDIS_AOF` (off): `always`, `everysec` or `no` runs Redis with
//!   `appendonly yes` and that `appendfsync` policy (production's advice is an
//!   AOF); `off` is `--appendonly no`. RDB snapshots are off either way.
//! - `BENCH_DIR`: where the file store's, Redis's and etcd's dirs go (default:
//!   the system temp dir).
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
use fencegate::fence::gate::Ask;
use fencegate::fence::store::{Advance, AnyStore, Entered, FenceStore, FileStore, MemoryStore, RedisStore};
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
    /// Which fencegates to run, in round order: "memory", "file", "redis", "etcd".
    stores: Vec<&'static str>,
    /// Every write carries its key's mark instead of raising it.
    equal: bool,
    /// `appendfsync` policy of Redis's AOF; `None`: no AOF.
    redis_aof: Option<&'static str>,
}

const STORES: [&str; 4] = ["memory", "file", "redis", "etcd"];

/// The program a store's server runs as, for the stores that have one.
fn server_program(store: &str) -> Option<&'static str> {
    match store {
        "redis" => Some("redis-server"),
        "etcd" => Some("etcd"),
        _ => None,
    }
}

/// Whether `program` is a file on the PATH.
fn installed(program: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(program).is_file()))
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
        stores: match std::env::var("BENCH_STORES") {
            Err(_) => STORES
                .into_iter()
                .filter(|store| match server_program(store) {
                    Some(program) if !installed(program) => {
                        println!("{store} store skipped: no {program} on the PATH");
                        false
                    }
                    _ => true,
                })
                .collect(),
            Ok(list) => {
                let mut stores = Vec::new();
                for name in list.split(',').map(str::trim) {
                    let Some(&known) = STORES.iter().find(|s| **s == name) else {
                        panic!("BENCH_STORES={list:?}: {name:?} is not memory, file, redis or etcd")
                    };
                    assert!(!stores.contains(&known), "BENCH_STORES={list:?} names {name} twice");
                    if let Some(program) = server_program(known) {
                        assert!(
                            installed(program),
                            "BENCH_STORES={list:?} asks for {name}, and no {program} is on the PATH"
                        );
                    }
                    stores.push(known);
                }
                stores
            }
        },
        equal: match std::env::var("BENCH_TOKENS").as_deref() {
            Err(_) | Ok("raise") => false,
            Ok("equal") => true,
            Ok(other) => panic!("BENCH_TOKENS={other:?}: expected raise (default) or equal"),
        },
        redis_aof: match std::env::var("BENCH_REDIS_AOF").as_deref() {
            Err(_) | Ok("off") => None,
            Ok("always") => Some("always"),
            Ok("everysec") => Some("everysec"),
            Ok("no") => Some("no"),
            Ok(other) => panic!("BENCH_REDIS_AOF={other:?}: expected off (default), always, everysec or no"),
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
    /// CPU of the store's server process (`redis-server`, `etcd`) per request.
    server_cpu_us_per_req: Option<f64>,
    commits: Option<u64>,
    raises: Option<u64>,
    commit_seconds: Option<f64>,
}

async fn run(s: Settings, dir: &Path) -> u64 {
    let redis = s.stores.contains(&"redis").then(|| RedisServer::start(&dir.join("redis"), s.redis_aof));
    let etcd = s.stores.contains(&"etcd").then(|| EtcdServer::start(&dir.join("etcd")));
    println!(
        "fencegate store bench: {} round(s) x {}s per store (+{}s warm-up), {} connections, {} keys, every PUT \
         {}; tokio multi-thread runtime, 2 workers, {} CPUs",
        s.rounds,
        s.seconds,
        s.warmup,
        s.conns,
        s.keys,
        if s.equal { "carries its key's mark (BENCH_TOKENS=equal)" } else { "raises its key's token" },
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0)
    );
    let upstream = start_upstream().await;
    let file_dir = dir.join("fences");
    let mut targets = Vec::new();
    for kind in s.stores.iter().copied() {
        targets.push(match (kind, &redis, &etcd) {
            ("memory", _, _) => start_fencegate("memory", "store = \"memory\"", upstream, s.keys).await,
            ("redis", Some(redis), _) => {
                let fences = format!("store = \"redis\"\nurl = \"{}\"", redis.url());
                start_fencegate("redis", &fences, upstream, s.keys).await
            }
            ("etcd", _, Some(etcd)) => {
                let fences = format!("store = \"etcd\"\nendpoints = [\"{}\"]", etcd.url());
                start_fencegate("etcd", &fences, upstream, s.keys).await
            }
            _ => {
                let fences =
                    format!("store = \"file\"\npath = {:?}\ncache_keys = 1000000", file_dir.display().to_string());
                start_fencegate("file", &fences, upstream, s.keys).await
            }
        });
    }
    println!("upstream {upstream}, file store in {}", file_dir.display());
    if let Some(redis) = &redis {
        println!("{redis}");
    }
    if let Some(etcd) = &etcd {
        println!("{etcd}");
    }
    let client: HttpClient = {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        Client::builder(TokioExecutor::new()).pool_max_idle_per_host(s.conns * 2).build(connector)
    };

    let mut failed = 0;
    if s.warmup > 0.0 {
        for t in &targets {
            let r = drive(&client, t, s.conns, Duration::from_secs_f64(s.warmup), s.equal).await;
            failed += r.failed;
            println!("warm-up  {:<6} {:>8.0} req/s", t.name, r.done as f64 / r.elapsed.as_secs_f64());
        }
    }
    for round in 1..=s.rounds {
        for t in targets.iter_mut() {
            let before = scrape(&client, t.admin).await;
            let server = match t.name {
                "redis" => redis.as_ref().map(|r| r.child.id()),
                "etcd" => etcd.as_ref().map(|e| e.child.id()),
                _ => None,
            };
            let server0 = server.map(cpu_ns_of);
            let cpu0 = process_cpu_ns();
            let r = drive(&client, t, s.conns, Duration::from_secs_f64(s.seconds), s.equal).await;
            let cpu1 = process_cpu_ns();
            let server1 = server.map(cpu_ns_of);
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
                server_cpu_us_per_req: server0
                    .zip(server1)
                    .map(|(a, b)| b.saturating_sub(a) as f64 / 1e3 / r.done.max(1) as f64),
                commits: delta("fencegate_store_commits_total").map(|v| v as u64),
                raises: delta("fencegate_store_raises_total").map(|v| v as u64),
                commit_seconds: delta("fencegate_store_commit_duration_seconds_sum"),
            };
            println!(
                "round {round} {:<6} {:>8.0} req/s  p50 {:>6} us  p99 {:>6} us  {:>5.1} us CPU/req{}{}{}{}",
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
                match rr.server_cpu_us_per_req {
                    Some(c) => format!(" + {} {c:.1} = {:.1}", t.name, rr.cpu_us_per_req + c),
                    None => String::new(),
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
        direct(&s, &dir.join("direct"), redis.as_ref()).await;
        fsync_probe(dir);
    }
    drop(redis);
    drop(etcd);
    failed
}

fn report(targets: &[Target], s: &Settings) {
    struct Summary {
        best: f64,
        median: f64,
        // Latency and CPU of the best round.
        p50: u64,
        p99: u64,
        cpu: f64,
        server_cpu: Option<f64>,
    }
    let summary = |t: &Target| {
        let mut rps: Vec<f64> = t.rounds.iter().map(|r| r.rps).collect();
        rps.sort_by(f64::total_cmp);
        let b = t.rounds.iter().max_by(|a, b| a.rps.total_cmp(&b.rps)).expect("at least one round");
        Summary {
            best: rps.last().copied().unwrap_or(0.0),
            median: rps.get(rps.len() / 2).copied().unwrap_or(0.0),
            p50: b.p50_us,
            p99: b.p99_us,
            cpu: b.cpu_us_per_req,
            server_cpu: b.server_cpu_us_per_req,
        }
    };
    let with_redis = targets.iter().any(|t| server_program(t.name).is_some());
    println!();
    println!(
        "| store | best req/s | median req/s | p50 (best round) | p99 (best round) | CPU/req (best round){} |",
        if with_redis { " | store server CPU/req (best round)" } else { "" }
    );
    println!("|---|---:|---:|---:|---:|---:|{}", if with_redis { "---:|" } else { "" });
    for t in targets {
        let x = summary(t);
        let redis_cell = match (with_redis, x.server_cpu) {
            (false, _) => String::new(),
            (true, None) => " – |".into(),
            (true, Some(c)) => format!(" {c:.1} µs (total {:.1} µs) |", x.cpu + c),
        };
        println!(
            "| {} | {:.0} | {:.0} | {} µs | {} µs | {:.1} µs |{redis_cell}",
            t.name, x.best, x.median, x.p50, x.p99, x.cpu
        );
    }
    let by_name = |name: &str| targets.iter().find(|t| t.name == name);
    let Some(mt) = by_name("memory") else { return };
    let m = summary(mt);
    let mut verdicts = Vec::new();
    // The targets the project set for each store against the memory store.
    // etcd: ×0.5 for the holder's writes (they need not pay a consensus round
    // each), ×0.2 for raises (each is one).
    let etcd_target = if s.equal { 0.5 } else { 0.2 };
    for (name, target) in [("file", 0.8), ("redis", 0.5), ("etcd", etcd_target)] {
        let Some(xt) = by_name(name) else { continue };
        let x = summary(xt);
        let redis_cell = match (with_redis, x.server_cpu) {
            (false, _) => String::new(),
            (true, None) => " – |".into(),
            (true, Some(c)) => format!(" total ×{:.2} |", (x.cpu + c) / m.cpu),
        };
        println!(
            "| **{name} / memory** | **×{:.2}** | **×{:.2}** | ×{:.2} | ×{:.2} | ×{:.2} |{redis_cell}",
            x.best / m.best,
            x.median / m.median,
            x.p50 as f64 / m.p50.max(1) as f64,
            x.p99 as f64 / m.p99.max(1) as f64,
            x.cpu / m.cpu,
        );
        // Each round against the memory round of the same round number, next
        // to it in time: the machine's drift hits both sides of one pair alike.
        let mut paired: Vec<f64> = mt.rounds.iter().zip(&xt.rounds).map(|(m, x)| x.rps / m.rps).collect();
        paired.sort_by(f64::total_cmp);
        let ratio = x.best / m.best;
        verdicts.push(format!(
            "{name}/memory: best rounds ×{ratio:.2}, per round pair {} (median ×{:.2}); target ≥ ×{target:.2}: {}",
            paired.iter().map(|r| format!("×{r:.2}")).collect::<Vec<_>>().join(" "),
            paired[paired.len() / 2],
            match (ratio >= target, paired[paired.len() / 2] >= target) {
                (true, true) => "MET",
                (true, false) => "MET by the best rounds, not by the median round pair",
                (false, true) => "MISSED by the best rounds, met by the median round pair",
                (false, false) => "MISSED",
            }
        ));
    }
    println!();
    for v in verdicts {
        println!("{v}");
    }
    for rt in ["redis", "etcd"].into_iter().filter_map(by_name) {
        let program = server_program(rt.name).unwrap_or(rt.name);
        let mut cpu: Vec<f64> = rt.rounds.iter().filter_map(|r| r.server_cpu_us_per_req).collect();
        cpu.sort_by(f64::total_cmp);
        let mut own: Vec<f64> = rt.rounds.iter().map(|r| r.cpu_us_per_req).collect();
        own.sort_by(f64::total_cmp);
        let mut mem: Vec<f64> = mt.rounds.iter().map(|r| r.cpu_us_per_req).collect();
        mem.sort_by(f64::total_cmp);
        if let (Some(&c), Some(&o), Some(&mm)) =
            (cpu.get(cpu.len() / 2), own.get(own.len() / 2), mem.get(mem.len() / 2))
        {
            println!(
                "{program} CPU per request (median round): {c:.1} µs ({}); this process {o:.1} µs, together \
                 {:.1} µs against the memory store's {mm:.1} µs (×{:.2})",
                cpu.iter().map(|c| format!("{c:.1}")).collect::<Vec<_>>().join(", "),
                c + o,
                (c + o) / mm
            );
        }
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
async fn drive(client: &HttpClient, t: &Target, conns: usize, length: Duration, equal: bool) -> DriveResult {
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
                    // The holder's writes carry the mark its first write set.
                    let token = if equal { 1 } else { tokens[key].fetch_add(1, Ordering::Relaxed) + 1 };
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

/// A `redis-server` of the bench's own: a child process on a free loopback
/// port, its files in `dir`; killed when dropped.
struct RedisServer {
    child: std::process::Child,
    port: u16,
    aof: Option<&'static str>,
    version: String,
}

impl RedisServer {
    fn start(dir: &Path, aof: Option<&'static str>) -> RedisServer {
        std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        // A port nothing listens on now (bound, learned, released).
        let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
        let log = dir.join("redis.log");
        let mut cmd = std::process::Command::new("redis-server");
        cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--daemonize", "no"])
            .arg("--dir")
            .arg(dir)
            .arg("--logfile")
            .arg(&log);
        match aof {
            Some(fsync) => cmd.args(["--appendonly", "yes", "--appendfsync", fsync]),
            None => cmd.args(["--appendonly", "no"]),
        };
        let child = cmd
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start redis-server: {e}"));
        let mut child = child;
        let info = wait_until_up(&mut child, "redis-server", &log, Duration::from_secs(10), || {
            RedisServer::call_on(port, "INFO server")
        });
        let version = info.lines().find_map(|l| l.strip_prefix("redis_version:")).unwrap_or("?").trim().to_owned();
        RedisServer { child, port, aof, version }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// One inline command on a connection of its own; the reply as text
    /// (the first reply's bytes, enough for `INFO`).
    fn call_on(port: u16, command: &str) -> Option<String> {
        use std::io::{Read, Write};
        let mut con = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
        con.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        con.write_all(format!("{command}\r\n").as_bytes()).ok()?;
        let mut buf = vec![0u8; 64 * 1024];
        let n = con.read(&mut buf).ok()?;
        let text = String::from_utf8_lossy(&buf[..n]).into_owned();
        (n > 0 && !text.starts_with('-')).then_some(text)
    }
}

/// Asks `answers` every 10 ms until it answers, while `child` (a server the
/// bench started, `what`) runs, for at most `limit`; panics with its log
/// otherwise.
fn wait_until_up<T>(
    child: &mut std::process::Child,
    what: &str,
    log: &Path,
    limit: Duration,
    mut answers: impl FnMut() -> Option<T>,
) -> T {
    let started = Instant::now();
    loop {
        if let Some(answer) = answers() {
            return answer;
        }
        let exited = child.try_wait().ok().flatten();
        if exited.is_some() || started.elapsed() > limit {
            let log = std::fs::read_to_string(log).unwrap_or_default();
            panic!("{what} did not answer ({exited:?}); its log:\n{log}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// CPU time so far of the whole process `pid` (all its threads), user +
/// system from `/proc/<pid>/stat`, in ns (clock-tick resolution).
fn cpu_ns_of(pid: u32) -> u64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return 0 };
    // After "pid (comm) ": state is field 3, utime 14, stime 15.
    let fields: Vec<&str> = stat.rsplit_once(')').map_or("", |(_, rest)| rest).split_whitespace().collect();
    let ticks: u64 = fields.get(11..13).map_or(0, |f| f.iter().filter_map(|v| v.parse::<u64>().ok()).sum());
    // SAFETY: sysconf reads a constant of the system, touching no memory of ours.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    ticks * 1_000_000_000 / per_second
}

/// A one-member etcd cluster on free loopback ports, its data in `dir`:
/// every transaction is synced to its disk before it is answered, as on a
/// cluster's members.
struct EtcdServer {
    child: std::process::Child,
    port: u16,
    version: String,
}

impl EtcdServer {
    fn start(dir: &Path) -> EtcdServer {
        std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        let free =
            || std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
        let (port, peer) = (free(), free());
        let (client_url, peer_url) = (format!("http://127.0.0.1:{port}"), format!("http://127.0.0.1:{peer}"));
        let log = dir.join("etcd.log");
        let out = std::fs::File::create(&log).expect("etcd's log file");
        let child = std::process::Command::new("etcd")
            .args(["--name", "bench", "--data-dir"])
            .arg(dir.join("data"))
            .args(["--listen-client-urls", &client_url, "--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &peer_url, "--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("bench={peer_url}")])
            .stdin(std::process::Stdio::null())
            .stdout(out.try_clone().expect("etcd's log file"))
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start etcd: {e}"));
        let mut child = child;
        wait_until_up(&mut child, "etcd", &log, Duration::from_secs(20), || {
            EtcdServer::get_on(port, "/health").filter(|h| h.contains("\"health\":\"true\""))
        });
        let version = EtcdServer::get_on(port, "/version").unwrap_or_default();
        EtcdServer { child, port, version }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The body of `GET path` on the client port, if it answered 200.
    fn get_on(port: u16, path: &str) -> Option<String> {
        use std::io::{Read, Write};
        let mut con = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
        con.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        con.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes()).ok()?;
        let mut text = String::new();
        con.read_to_string(&mut text).ok()?;
        let (head, body) = text.split_once("\r\n\r\n")?;
        head.split(' ').nth(1).is_some_and(|status| status == "200").then(|| body.trim().to_owned())
    }
}

impl std::fmt::Display for EtcdServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "etcd {} (pid {}) on 127.0.0.1:{}, one member", self.version, self.child.id(), self.port)
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl std::fmt::Display for RedisServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "redis-server {} (pid {}) on 127.0.0.1:{}, {}",
            self.version,
            self.child.id(),
            self.port,
            match self.aof {
                Some(fsync) => format!("appendonly yes, appendfsync {fsync} (BENCH_REDIS_AOF)"),
                None => "no persistence (BENCH_REDIS_AOF=always|everysec|no for an AOF)".to_owned(),
            }
        )
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
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
/// `FenceStore::advance`, to separate the store's cost from the proxy's. For
/// Redis also through `FenceStore::enter`, the fenced path: its script records
/// the write in flight, and dropping the record sends a `ZREM`.
async fn direct(s: &Settings, dir: &Path, redis: Option<&RedisServer>) {
    let keys: Arc<Vec<String>> = Arc::new((0..s.keys).map(|i| format!("/objects/k{i}")).collect());
    let length = Duration::from_secs_f64(s.seconds);
    println!("\nstores driven directly through FenceStore::advance (no HTTP), {} keys, {}s each:", s.keys, s.seconds);
    let memory = Arc::new(MemoryStore::default());
    let (n, secs) = advance_for(&memory, &keys, s.conns, length, Op::Advance).await;
    let memory_rate = n as f64 / secs;
    println!("  memory, {:>5} tasks {memory_rate:>10.0} advances/s", s.conns);
    let file = Arc::new(FileStore::open(dir, false, 1_000_000).expect("open the file store"));
    // First raise of every key (inserts), unmeasured; then measured runs of updates.
    advance_for(&file, &keys, s.conns, Duration::from_secs_f64(s.warmup.max(0.5)), Op::Advance).await;
    let stats = file.stats().expect("the file store has commit stats");
    for &tasks in &s.direct_tasks {
        let (c0, r0, sum0) = (stats.commits(), stats.raises(), histogram_sum(&stats.commit_seconds));
        let cpu0 = process_cpu_ns();
        let (n, secs) = advance_for(&file, &keys, tasks, length, Op::Advance).await;
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
    let Some(redis) = redis else { return };
    // A prefix of its own: its own identity and marks, apart from the
    // fencegate's. The rest as that fencegate has it: `[fences]` defaults.
    let config = fencegate::Config::from_toml_str(&format!(
        "[fences]\nstore = \"redis\"\nurl = \"{}\"\nkey_prefix = \"fencegate-bench-direct:\"\n\
         [[route]]\nname = \"objects\"\nprefix = \"/objects/\"\nupstream = \"http://127.0.0.1:9\"\n",
        redis.url()
    ))
    .expect("a Redis store config");
    let fencegate::config::StoreKind::Redis(config) = &config.fences.store else { unreachable!("store = redis") };
    let store = Arc::new(AnyStore::Redis(RedisStore::open(config).expect("open the Redis store")));
    // First raise of every key (inserts: the index too), unmeasured.
    advance_for(&store, &keys, s.conns, Duration::from_secs_f64(s.warmup.max(0.5)), Op::Advance).await;
    for op in [Op::Advance, Op::Enter] {
        let (cpu0, redis0) = (process_cpu_ns(), cpu_ns_of(redis.child.id()));
        let (n, secs) = advance_for(&store, &keys, s.conns, length, op).await;
        let (cpu1, redis1) = (process_cpu_ns(), cpu_ns_of(redis.child.id()));
        let per = |ns: u64| ns as f64 / 1e3 / n.max(1) as f64;
        let (own, theirs) = (per(cpu1.0 - cpu0.0), per(redis1.saturating_sub(redis0)));
        println!(
            "  redis,  {:>5} tasks {:>10.0} {}/s (×{:.3} of memory's advances); CPU per call {own:.1} us here + \
             {theirs:.1} us redis-server = {:.1} us",
            s.conns,
            n as f64 / secs,
            if op == Op::Enter { "enters (+ ZREM)" } else { "advances" },
            n as f64 / secs / memory_rate,
            own + theirs
        );
    }
}

/// What [`advance_for`] calls.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    /// `FenceStore::advance`: the fence API's compare-and-raise.
    Advance,
    /// `FenceStore::enter` as a fenced write takes its turn (sharing its key),
    /// its record of the write in flight dropped at once.
    Enter,
}

/// `tasks` tasks raising their own keys' tokens through `advance` (or
/// `enter`) for `length`. Returns how many calls were done and in how many
/// seconds.
async fn advance_for<S: FenceStore>(
    store: &Arc<S>,
    keys: &Arc<Vec<String>>,
    tasks: usize,
    length: Duration,
    op: Op,
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
                    if op == Op::Enter {
                        // The lease (timeout + settle) and wait (queue_timeout)
                        // a route's defaults give.
                        let (lease, wait) = (Duration::from_secs(32), Duration::from_secs(10));
                        match store.enter(&keys[key], token, Ask::Share, lease, wait).await {
                            Ok(Entered::Accepted { in_flight, .. }) => drop(in_flight),
                            other => panic!("enter {} {token}: {other:?}", keys[key]),
                        }
                    } else {
                        match store.advance(&keys[key], token).await {
                            Ok(Advance::Accepted { .. }) => {}
                            other => panic!("advance {} {token}: {other:?}", keys[key]),
                        }
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
