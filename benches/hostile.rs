//! Each attack of issue 13 for a bounded time beside a normal client: what the
//! normal client sees (p50/p99 against its baseline) and what the proxy holds
//! (peak RSS and descriptors, RSS after the attack, lines logged).
//!
//! `cargo bench --bench hostile`. The release fencegate binary runs as a child
//! with small limits in a temp dir, before an in-process upstream. A normal
//! client (its own thread and runtime) writes fenced PUTs on a kept-alive
//! connection and reads GETs on a fresh connection each, alone first (the
//! baseline), then beside each attack in turn (benches/hostile/attacks.rs):
//!
//! 1. `bodies`: HTTP/2 streams of fenced PUTs without content-length, data
//!    pushed, never ended;
//! 2. `keys`: fenced PUTs to many distinct long keys;
//! 3. `idle`: idle connections to the admin listener; `zero-window`: HTTP/2
//!    streams with a zero receive window pinning upstream connections;
//! 4. `listings`: admin listing loops;
//! 5. `hpack`: one small HEADERS frame naming a big HPACK table entry many times;
//! 6. `reset`: HTTP/2 rapid reset.
//!
//! Target: the normal client's p99 within x3 of its baseline, and the RSS
//! within the configured budgets plus a fixed overhead.
//!
//! Environment:
//! - `FENCEGATE_BIN`: the binary (default: the one cargo built for this bench).
//! - `BENCH_ATTACKS` (bodies,keys,idle,zero-window,listings,hpack,reset): which, in order.
//! - `BENCH_SECONDS` (8): each attack's duration; `BENCH_BASELINE_SECONDS` (5).
//! - `BENCH_SETTLE` (3): seconds after an attack before "RSS after" is read.
//! - `BENCH_NEW_LIMITS` (1): set the config fields issue 13 adds (max_concurrent_streams,
//!   max_connection_buffered_bytes, max_headers, max_upstream_header_rate, max_key_bytes,
//!   cache_bytes, [admin] max_connections, max_upstream_connections); 0 for a binary
//!   that predates them.
//! - `BENCH_IDLE` (900): idle admin connections; `BENCH_KEY_BYTES` (16384).
//! - `BENCH_ATTACKER_NICE` (19): the niceness of the attacker's threads. An attacker
//!   runs on machines of its own; here it shares two cores with the proxy, the
//!   upstream and the normal client, and at the same priority part of the normal
//!   client's delay is the attacker's own CPU, not what the proxy spends on it.
//!   At 19 the attacker runs on what the others leave; 0 puts it level with them.

// What fencegate ships with (src/main.rs).
#[path = "../src/allocator.rs"]
mod allocator;

#[global_allocator]
static ALLOCATOR: allocator::Mimalloc = allocator::Mimalloc;

#[path = "hostile/attacks.rs"]
mod attacks;
#[path = "hostile/proxy.rs"]
mod proxy;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::time::Instant;

use attacks::Seen;
use proxy::{Fencegate, Sampler};

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(v) => v.trim().parse().unwrap_or_else(|_| panic!("{name}={v:?} is not a valid value")),
        Err(_) => default,
    }
}

const ALL: &str = "bodies,keys,idle,zero-window,listings,hpack,reset";

fn config(upstream: SocketAddr, dir: &std::path::Path, new_limits: bool) -> String {
    let store = toml::Value::String(dir.join("fences").display().to_string());
    let (server, admin, fences, route) = if new_limits {
        (
            "max_concurrent_streams = 32\nmax_connection_buffered_bytes = \"8MiB\"\nmax_headers = 100\n\
             max_upstream_header_rate = \"1MiB\"\n",
            "max_connections = 16\n",
            "max_key_bytes = 1024\ncache_bytes = \"16MiB\"\n",
            "max_upstream_connections = 32\n",
        )
    } else {
        ("", "", "", "")
    };
    format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nshutdown_grace = \"1s\"\nmax_connections = 64\n\
         max_buffered_bytes = \"32MiB\"\nmax_header_bytes = \"64KiB\"\nheader_read_timeout = \"5s\"\n\
         idle_timeout = \"30s\"\n{server}\
         [admin]\nlisten = \"127.0.0.1:0\"\nauth_token = \"bench-admin-token\"\n{admin}\
         [fences]\nstore = \"file\"\npath = {store}\ncache_keys = 10000\n{fences}\
         [log]\nlevel = \"info\"\n\
         [[route]]\nname = \"objects\"\nprefix = \"/objects/\"\nupstream = \"http://{upstream}\"\n\
         max_body = \"1MiB\"\ntimeout = \"5s\"\nqueue_timeout = \"2s\"\n{route}"
    )
}

/// The normal client's latencies (µs) and failures, per phase; the latencies
/// also per kind (0: the PUT on a kept-alive connection, 1: the GET on a fresh one).
#[derive(Default)]
struct Normal {
    latencies: Vec<Vec<u64>>,
    by_kind: Vec<[Vec<u64>; 2]>,
    failures: Vec<u64>,
}

/// Runs the normal client on a thread of its own until `stop`, recording into
/// the phase `phase` names.
fn normal_client(proxy: SocketAddr, phase: Arc<AtomicUsize>, stop: Arc<AtomicBool>, record: Arc<Mutex<Normal>>) {
    std::thread::spawn(move || {
        let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_all().build() else { return };
        runtime.block_on(async move {
            let kept = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
            let fresh = Client::builder(TokioExecutor::new()).pool_max_idle_per_host(0).build_http::<Full<Bytes>>();
            let mut token = 1u64;
            while !stop.load(Ordering::Relaxed) {
                token += 1;
                let key = token % 64;
                let put = http::Request::put(format!("http://{proxy}/objects/normal-{key}"))
                    .header("x-fencing-token", token.to_string())
                    .body(Full::new(Bytes::from_static(b"normal")));
                let get = http::Request::get(format!("http://{proxy}/objects/normal-{key}")).body(Full::default());
                for (kind, (client, req)) in [(&kept, put), (&fresh, get)].into_iter().enumerate() {
                    let Ok(req) = req else { continue };
                    // The phase it started in: a request an attack stalls counts there.
                    let i = phase.load(Ordering::Relaxed);
                    let started = Instant::now();
                    let answer = tokio::time::timeout(Duration::from_secs(5), async {
                        let resp = client.request(req).await.ok()?;
                        let ok = resp.status().is_success();
                        resp.into_body().collect().await.ok()?;
                        ok.then_some(())
                    })
                    .await;
                    let micros = started.elapsed().as_micros() as u64;
                    if let Ok(mut n) = record.lock() {
                        if n.latencies.len() <= i {
                            n.latencies.resize(i + 1, Vec::new());
                            n.by_kind.resize(i + 1, Default::default());
                            n.failures.resize(i + 1, 0);
                        }
                        match answer {
                            Ok(Some(())) => {
                                n.latencies[i].push(micros);
                                n.by_kind[i][kind].push(micros);
                            }
                            _ => n.failures[i] += 1,
                        }
                    }
                }
            }
        });
    });
}

/// Lowers the calling thread's priority to `nice` (on Linux, niceness is a
/// thread's own).
fn renice_this_thread(nice: i32) {
    // SAFETY: gettid and setpriority take plain integers and touch no memory.
    let failed = unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice) != 0
    };
    if failed {
        eprintln!("setpriority({nice}): {}", std::io::Error::last_os_error());
    }
}

/// Not an attack: one thread at the normal client's priority spinning until
/// `deadline`, which is what one core of any work beside it costs the normal
/// client on this machine. It tells a flood's refusals costing the proxy
/// CPU apart from the proxy serving its clients unfairly.
fn spin(deadline: Instant) -> Seen {
    let deadline = deadline.into_std();
    let spinner = std::thread::spawn(move || {
        let mut spins = 0u64;
        while std::time::Instant::now() < deadline {
            spins = std::hint::black_box(spins + 1);
        }
    });
    let _ = spinner.join();
    Seen::default()
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i] as f64 / 1000.0
}

async fn attack(name: &str, fg: &Fencegate, deadline: Instant, key_bytes: usize, idle: usize) -> Seen {
    match name {
        "bodies" => attacks::h2_unended_bodies(fg.proxy, "/objects/", 2, 200, 900 * 1024, deadline).await,
        "keys" => attacks::long_keys(fg.proxy, "/objects/", 8, key_bytes, deadline).await,
        "idle" => attacks::idle_connections(fg.admin, idle, deadline).await,
        "zero-window" => attacks::h2_zero_window(fg.proxy, "/objects/", 5, 200, deadline).await,
        "listings" => attacks::admin_listings(fg.admin, 2, 1000, deadline).await,
        "hpack" => attacks::hpack_amplification(fg.proxy, "/objects/amplified", 2, 3900, 16, deadline).await,
        "reset" => attacks::rapid_reset(fg.proxy, "/objects/", 4, deadline).await,
        "spin" => spin(deadline),
        other => panic!("BENCH_ATTACKS: unknown attack {other:?} (known: {ALL})"),
    }
}

fn main() {
    let bin = std::env::var_os("FENCEGATE_BIN").map(PathBuf::from).unwrap_or(env!("CARGO_BIN_EXE_fencegate").into());
    let names: Vec<String> =
        std::env::var("BENCH_ATTACKS").unwrap_or(ALL.into()).split(',').map(|s| s.trim().to_string()).collect();
    let seconds: u64 = env_or("BENCH_SECONDS", 8);
    let baseline: u64 = env_or("BENCH_BASELINE_SECONDS", 5);
    let settle: u64 = env_or("BENCH_SETTLE", 3);
    let new_limits = env_or::<u8>("BENCH_NEW_LIMITS", 1) != 0;
    let idle: usize = env_or("BENCH_IDLE", 900);
    let key_bytes: usize = env_or("BENCH_KEY_BYTES", 16384);

    let dir = tempfile::Builder::new().prefix("fencegate-hostile-").tempdir().expect("a temp dir");
    let upstream = proxy::upstream(16 * 1024);
    let mut fg = Fencegate::start(&bin, dir.path(), &config(upstream, dir.path(), new_limits));
    let sampler = Sampler::start(fg.pid());
    let nice: i32 = env_or("BENCH_ATTACKER_NICE", 19);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .on_thread_start(move || renice_this_thread(nice))
        .build()
        .expect("a runtime");

    let phase = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let record = Arc::new(Mutex::new(Normal::default()));
    println!("fencegate {} (new limits: {new_limits}), {seconds} s per attack, attacker at nice {nice}", bin.display());
    let start = proxy::read(fg.pid());
    normal_client(fg.proxy, phase.clone(), stop.clone(), record.clone());
    std::thread::sleep(Duration::from_secs(baseline));
    let base_peak = sampler.take();
    let (mut lines_before, _) = fg.lines();

    let mut rows = Vec::new();
    for (i, name) in names.iter().enumerate() {
        // Phases: 0 baseline, odd = attack, even = settling (not reported).
        phase.store(2 * i + 1, Ordering::Relaxed);
        let deadline = Instant::now() + Duration::from_secs(seconds);
        // Each attack from an address of its own (127.0.0.2, .3, ...): the
        // reconnects fencegate holds back after one must not slow the next.
        attacks::ATTACKER_HOST.store(2 + i as u8, Ordering::Relaxed);
        let seen = runtime.block_on(attack(name, &fg, deadline, key_bytes, idle));
        phase.store(2 * i + 2, Ordering::Relaxed);
        let peak = sampler.take();
        std::thread::sleep(Duration::from_secs(settle));
        let after = proxy::read(fg.pid());
        let (lines, loud) = fg.lines();
        rows.push((name.clone(), peak, after, lines - lines_before, loud, seen, fg.alive()));
        lines_before = lines;
        if !fg.alive() {
            println!("fencegate died during {name}");
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);

    let normal =
        record.lock().map(|n| (n.latencies.clone(), n.failures.clone(), n.by_kind.clone())).unwrap_or_default();
    let p99 = |l: Option<&Vec<u64>>| {
        let mut l = l.cloned().unwrap_or_default();
        l.sort_unstable();
        percentile(&l, 0.99)
    };
    let stats = |i: usize| {
        let mut l = normal.0.get(i).cloned().unwrap_or_default();
        l.sort_unstable();
        (percentile(&l, 0.5), percentile(&l, 0.99), l.len(), normal.1.get(i).copied().unwrap_or(0))
    };
    let kinds = |i: usize| {
        let k = normal.2.get(i);
        (p99(k.map(|k| &k[0])), p99(k.map(|k| &k[1])))
    };
    let (b50, b99, bn, bf) = stats(0);
    let (bk, bf99) = kinds(0);
    let mib = |kib: u64| kib as f64 / 1024.0;
    println!(
        "\nbaseline: p50 {b50:.2} ms, p99 {b99:.2} ms (kept-alive PUT {bk:.2}, fresh GET {bf99:.2}) \
         ({bn} requests, {bf} failed); RSS {:.1} MiB at start, peak {:.1} MiB; {} fds",
        mib(start.rss_kib),
        mib(base_peak.rss_kib),
        base_peak.fds
    );
    println!("\n| attack | normal p50 ms | p99 ms | p99 / base | p99 PUT / GET ms | ok / failed | peak RSS MiB | RSS after MiB | peak fds | lines (warn+) | attack saw |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for (i, (name, peak, after, lines, loud, seen, alive)) in rows.iter().enumerate() {
        let (p50, p99, n, failed) = stats(2 * i + 1);
        let (put99, get99) = kinds(2 * i + 1);
        println!(
            "| {name}{} | {p50:.2} | {p99:.2} | x{:.1} | {put99:.2} / {get99:.2} | {n} / {failed} | {:.1} | {:.1} | {} | {lines} ({loud}) | {seen} |",
            if *alive { "" } else { " (proxy died)" },
            p99 / b99,
            mib(peak.rss_kib),
            mib(after.rss_kib),
            peak.fds,
        );
    }
    println!("\nVmHWM (peak RSS over the whole run): {:.1} MiB", mib(proxy::read(fg.pid()).hwm_kib));
}
