//! Heap allocations per fenced `PUT`, counted in the proxy's own process.
//!
//! `cargo bench --bench allocs`. This process runs fencegate in-process (the
//! shipped allocator, mimalloc, behind a counter), with the access log on and
//! written as deployed (stdout, here sent to `/dev/null`). The upstream and the
//! client run in a child process (this binary again, `ALLOCS_ROLE=peer`), so
//! their allocations are not counted. The child's client writes fenced `PUT`s
//! on kept-alive connections, each raising its key's mark; after a warm-up it
//! says `start`, sends `ALLOCS_REQUESTS` more and says `done`. Allocations
//! counted between the two, divided by the requests, is the figure (every
//! `alloc`, `alloc_zeroed` and `realloc` call, in any thread of the proxy).
//!
//! Environment:
//! - `ALLOCS_REQUESTS` (20000): requests counted; `ALLOCS_WARMUP` (2000).
//! - `ALLOCS_CONNECTIONS` (8): client connections, one task each.
//! - `ALLOCS_LOG` (info): the `[log] level`; `warn` turns the access log off.
//! - `ALLOCS_SAME_TOKEN` (0): 1 sends token 1 on every request (the holder
//!   writing again: no mark moves) instead of raising each key's mark.
//! - `ALLOCS_SITES` (0): N > 0 also captures the call stack of every Nth
//!   counted allocation and prints the sites that allocate most, per request
//!   (slow: use a few thousand requests).
//! - `ALLOCS_IDLE` (0): N > 0 measures idle connections instead: the peer
//!   opens N keep-alive connections, sends one fenced `PUT` on each and
//!   keeps them open; the figure is the proxy's live heap bytes (allocated
//!   and not freed) per connection, with `ALLOCS_SITES` the sites holding them,
//!   read `ALLOCS_SETTLE_MS` (3000) after the last `PUT`: time for an idle
//!   connection to rest.

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Mutex;

// What fencegate ships with (src/main.rs), behind the counter.
#[path = "../src/allocator.rs"]
mod allocator;

/// mimalloc with a count of allocation calls.
struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
/// Every how many allocations a call stack is captured; 0: none.
static SAMPLE_EVERY: AtomicU64 = AtomicU64::new(0);
static SAMPLES: Mutex<Vec<std::backtrace::Backtrace>> = Mutex::new(Vec::new());
/// Bytes allocated and not yet freed.
static LIVE_BYTES: AtomicI64 = AtomicI64::new(0);
/// Sampled allocations not freed yet, by address (`ALLOCS_IDLE` with `ALLOCS_SITES`).
static LIVE: Mutex<Option<HashMap<usize, (usize, std::backtrace::Backtrace)>>> = Mutex::new(None);
static TRACK_LIVE: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// Set while this thread captures a stack: its own allocations are not sampled.
    static CAPTURING: Cell<bool> = const { Cell::new(false) };
}

/// Counts an allocation of `size` bytes at `ptr`, and samples it.
fn counted(ptr: *mut u8, size: usize) {
    let every = SAMPLE_EVERY.load(Ordering::Relaxed);
    if every > 0 && CAPTURING.with(Cell::get) {
        return; // the capture's own
    }
    LIVE_BYTES.fetch_add(size as i64, Ordering::Relaxed);
    let n = ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    if every == 0 || !n.is_multiple_of(every) {
        return;
    }
    CAPTURING.with(|c| c.set(true));
    let trace = std::backtrace::Backtrace::force_capture();
    if TRACK_LIVE.load(Ordering::Relaxed) {
        if let Some(live) = LIVE.lock().ok().as_mut().and_then(|l| l.as_mut()) {
            live.insert(ptr as usize, (size, trace));
        }
    } else if let Ok(mut samples) = SAMPLES.lock() {
        samples.push(trace);
    }
    CAPTURING.with(|c| c.set(false));
}

/// Counts the freeing of `size` bytes at `ptr`; `None` when a sampled
/// allocation was freed.
fn freed(ptr: *mut u8, size: usize) -> Option<(usize, std::backtrace::Backtrace)> {
    if CAPTURING.with(Cell::get) {
        return None;
    }
    LIVE_BYTES.fetch_sub(size as i64, Ordering::Relaxed);
    if !TRACK_LIVE.load(Ordering::Relaxed) {
        return None;
    }
    CAPTURING.with(|c| c.set(true));
    let sample = LIVE.lock().ok().as_mut().and_then(|l| l.as_mut()).and_then(|l| l.remove(&(ptr as usize)));
    CAPTURING.with(|c| c.set(false));
    sample
}

/// The sampled stacks by site: the first source lines outside the
/// allocator, the standard library and this bench, as `per-request site`
/// lines, most first.
fn sites(samples: Vec<std::backtrace::Backtrace>, every: u64, requests: u64) -> String {
    let mut by_site: HashMap<String, u64> = HashMap::new();
    for trace in samples {
        *by_site.entry(site(&trace)).or_default() += every;
    }
    let mut sorted: Vec<_> = by_site.into_iter().collect();
    sorted.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
    sorted.iter().map(|(site, n)| format!("{:6.2} {site}\n", *n as f64 / requests as f64)).collect()
}

/// Where a stack allocated: its first source lines outside the allocator,
/// the standard library and this bench.
fn site(trace: &std::backtrace::Backtrace) -> String {
    const PLUMBING: [&str; 4] = ["/rustc/", "/library/", "mimalloc", "benches/allocs.rs"];
    let text = trace.to_string();
    let frames: Vec<String> = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("at "))
        .filter(|at| !PLUMBING.iter().any(|p| at.contains(p)))
        .map(|at| at.rsplit_once(":").map_or(at, |(file_line, _column)| file_line))
        // `<crate>/<path in its src>`, for this crate and its dependencies alike.
        .map(|at| match at.rsplit_once("/src/") {
            Some((krate, path)) => format!("{}/{path}", krate.rsplit('/').next().unwrap_or(krate)),
            None => at.to_string(),
        })
        .take(3)
        .collect();
    frames.join(" < ")
}

// SAFETY: every call is passed to mimalloc unchanged; the counter has no
// effect on the memory handed out.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let ptr = unsafe { allocator::Mimalloc.alloc(layout) };
        counted(ptr, layout.size());
        ptr
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let ptr = unsafe { allocator::Mimalloc.alloc_zeroed(layout) };
        counted(ptr, layout.size());
        ptr
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        freed(ptr, layout.size());
        let new = unsafe { allocator::Mimalloc.realloc(ptr, layout, new_size) };
        counted(new, new_size);
        new
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let sample = freed(ptr, layout.size());
        unsafe { allocator::Mimalloc.dealloc(ptr, layout) }
        // Outside the map's lock: dropping a backtrace frees memory too.
        if sample.is_some() {
            CAPTURING.with(|c| c.set(true));
            drop(sample);
            CAPTURING.with(|c| c.set(false));
        }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(v) => v.trim().parse().unwrap_or_else(|_| panic!("{name}={v:?} is not a valid value")),
        Err(_) => default,
    }
}

fn main() {
    if std::env::var("ALLOCS_ROLE").as_deref() == Ok("peer") {
        peer::run();
        return;
    }
    let requests: u64 = env_or("ALLOCS_REQUESTS", 20_000);
    let level: String = env_or("ALLOCS_LOG", "info".to_string());

    let mut child = Command::new(std::env::current_exe().expect("this binary's path"))
        .env("ALLOCS_ROLE", "peer")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the peer process starts");
    let mut lines = BufReader::new(child.stdout.take().expect("the peer's stdout"));
    let mut line = String::new();
    let mut next = |what: &str| {
        line.clear();
        lines.read_line(&mut line).expect("a line from the peer");
        let text = line.trim().to_string();
        assert!(text.starts_with(what), "expected {what:?} from the peer, got {text:?}");
        text
    };
    let upstream = next("upstream ").trim_start_matches("upstream ").to_string();

    let config = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nworkers = 2\n[admin]\nlisten = \"127.0.0.1:0\"\n\
         [fences]\nstore = \"memory\"\n[log]\nlevel = \"{level}\"\n\
         [[route]]\nname = \"objects\"\nprefix = \"/objects/\"\nupstream = \"http://{upstream}\"\n"
    );
    let config = fencegate::Config::from_toml_str(&config).and_then(|c| c.read_secrets()).expect("a valid config");
    // The access log goes where it goes when deployed: stdout, here /dev/null.
    silence_stdout();
    let _log = fencegate::telemetry::init(fencegate::config::LogFormat::Human, &level, &config.tracing);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    let server = runtime.block_on(fencegate::Fencegate::bind(config)).expect("fencegate starts");
    let proxy = server.proxy_addr();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = std::thread::spawn(move || {
        runtime.block_on(server.run(async {
            let _ = stopped.await;
        }))
    });

    let mut to_peer = child.stdin.take().expect("the peer's stdin");
    writeln!(to_peer, "{proxy}").expect("the peer reads the proxy's address");
    let every: u64 = env_or("ALLOCS_SITES", 0);
    let idle: u64 = env_or("ALLOCS_IDLE", 0);
    if idle > 0 {
        *LIVE.lock().unwrap() = Some(HashMap::new());
        next("start");
        let before = LIVE_BYTES.load(Ordering::Relaxed);
        TRACK_LIVE.store(every > 0, Ordering::Relaxed);
        SAMPLE_EVERY.store(every, Ordering::Relaxed);
        let summary = next("held");
        // The connections' requests are done; give them time to rest.
        std::thread::sleep(std::time::Duration::from_millis(env_or("ALLOCS_SETTLE_MS", 3000)));
        SAMPLE_EVERY.store(0, Ordering::Relaxed);
        let live = LIVE_BYTES.load(Ordering::Relaxed) - before;
        TRACK_LIVE.store(false, Ordering::Relaxed);
        let samples = LIVE.lock().unwrap().take().unwrap_or_default();
        eprintln!(
            "{idle} idle connections, each after one fenced PUT: {:.2} KB of live heap per connection ({live} B; peer: {})",
            live as f64 / idle as f64 / 1024.0,
            summary.trim_start_matches("held").trim()
        );
        if every > 0 {
            let traces: Vec<(u64, std::backtrace::Backtrace)> =
                samples.into_values().map(|(size, trace)| (size as u64, trace)).collect();
            eprintln!(
                "live bytes per connection by site (every {every}th allocation sampled):\n{}",
                live_sites(traces, every, idle)
            );
        }
        drop(to_peer);
        let _ = stop.send(());
        let _ = serving.join();
        let _ = child.wait();
        return;
    }
    next("start");
    SAMPLE_EVERY.store(every, Ordering::Relaxed);
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    let summary = next("done");
    let counted = ALLOCATIONS.load(Ordering::Relaxed) - before;
    SAMPLE_EVERY.store(0, Ordering::Relaxed);
    let _ = stop.send(());
    let _ = serving.join();
    let _ = child.wait();
    let tokens = if env_or::<u8>("ALLOCS_SAME_TOKEN", 0) != 0 { "same token" } else { "each raising its key" };
    eprintln!(
        "fenced PUT ({tokens}), log level {level}: {:.1} allocations per request ({counted} for {requests} requests; peer: {})",
        counted as f64 / requests as f64,
        summary.trim_start_matches("done").trim()
    );
    if every > 0 {
        let samples = std::mem::take(&mut *SAMPLES.lock().unwrap());
        eprintln!("allocations per request by site (every {every}th sampled):\n{}", sites(samples, every, requests));
    }
}

/// Sampled live allocations by site, as bytes per connection.
fn live_sites(samples: Vec<(u64, std::backtrace::Backtrace)>, every: u64, connections: u64) -> String {
    let mut by_site: HashMap<String, u64> = HashMap::new();
    for (size, trace) in samples {
        *by_site.entry(site(&trace)).or_default() += size * every;
    }
    let mut sorted: Vec<_> = by_site.into_iter().collect();
    sorted.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
    sorted.iter().take(25).map(|(site, n)| format!("{:8.0} B {site}\n", *n as f64 / connections as f64)).collect()
}

/// Points fd 1 at /dev/null (results go to stderr).
fn silence_stdout() {
    let null = std::fs::OpenOptions::new().write(true).open("/dev/null").expect("/dev/null opens");
    // SAFETY: dup2 on two open descriptors; fd 1 is replaced, nothing else.
    let rc = unsafe { libc::dup2(std::os::fd::AsRawFd::as_raw_fd(&null), 1) };
    assert!(rc >= 0, "dup2: {}", std::io::Error::last_os_error());
}

/// The child: an upstream answering every request 204, and the client.
mod peer {
    use std::convert::Infallible;
    use std::io::BufRead;
    use std::net::SocketAddr;

    use bytes::Bytes;
    use http_body_util::{BodyExt, Empty, Full};
    use hyper::server::conn::http1;
    use hyper::service::service_fn;
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::{TokioExecutor, TokioIo};

    use super::env_or;

    pub fn run() {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        runtime.block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            println!("upstream {}", listener.local_addr().unwrap());
            tokio::spawn(async move {
                loop {
                    let Ok((stream, _)) = listener.accept().await else { continue };
                    tokio::spawn(async move {
                        let service = service_fn(|req: http::Request<hyper::body::Incoming>| async move {
                            let _ = req.into_body().collect().await;
                            Ok::<_, Infallible>(
                                http::Response::builder().status(204).body(Empty::<Bytes>::new()).unwrap(),
                            )
                        });
                        let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
                    });
                }
            });
            let mut line = String::new();
            std::io::stdin().lock().read_line(&mut line).unwrap();
            let proxy: SocketAddr = line.trim().parse().unwrap();
            match env_or::<usize>("ALLOCS_IDLE", 0) {
                0 => load(proxy).await,
                n => hold_idle(proxy, n).await,
            }
        });
    }

    /// Opens `n` connections, one fenced `PUT` on each (its answer read
    /// whole), and keeps them open until the proxy's side closes stdin.
    async fn hold_idle(proxy: SocketAddr, n: usize) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        println!("start");
        let mut held = Vec::with_capacity(n);
        let mut failed = 0;
        for i in 0..n {
            let mut stream = tokio::net::TcpStream::connect(proxy).await.unwrap();
            let request = format!(
                "PUT /objects/idle-{i} HTTP/1.1\r\nhost: bench\r\nx-fencing-token: 1\r\ncontent-length: 2\r\n\r\nok"
            );
            stream.write_all(request.as_bytes()).await.unwrap();
            // 204 with no body: the head is the whole answer.
            let mut answer = Vec::new();
            let mut buf = [0u8; 512];
            while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(k) => answer.extend_from_slice(&buf[..k]),
                }
            }
            if !answer.starts_with(b"HTTP/1.1 2") {
                failed += 1;
            }
            held.push(stream);
        }
        println!("held {failed} of {n} failed");
        // Until the proxy's process is done measuring.
        let _ = tokio::task::spawn_blocking(|| std::io::stdin().lock().read_line(&mut String::new())).await;
        drop(held);
    }

    async fn load(proxy: SocketAddr) {
        let requests: u64 = env_or("ALLOCS_REQUESTS", 20_000);
        let warmup: u64 = env_or("ALLOCS_WARMUP", 2_000);
        let connections: u64 = env_or("ALLOCS_CONNECTIONS", 8);
        let same_token = env_or::<u8>("ALLOCS_SAME_TOKEN", 0) != 0;
        let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
        // Each task its own keys, each request one token above its key's last.
        let phase = |count: u64, first: u64| {
            let tasks: Vec<_> = (0..connections)
                .map(|t| {
                    let client = client.clone();
                    tokio::spawn(async move {
                        let mut failed = 0u64;
                        for i in (t..count).step_by(connections as usize) {
                            let n = first + i / connections;
                            let req = http::Request::put(format!("http://{proxy}/objects/t{t}-{}", n % 128))
                                .header("x-fencing-token", if same_token { 1 } else { n + 1 }.to_string())
                                .body(Full::new(Bytes::from_static(b"payload")))
                                .unwrap();
                            match client.request(req).await {
                                Ok(resp) if resp.status().is_success() => {
                                    let _ = resp.into_body().collect().await;
                                }
                                _ => failed += 1,
                            }
                        }
                        failed
                    })
                })
                .collect();
            async move {
                let mut failed = 0;
                for task in tasks {
                    failed += task.await.unwrap();
                }
                failed
            }
        };
        let warm_failed = phase(warmup, 0).await;
        println!("start");
        let failed = phase(requests, warmup).await;
        println!("done {failed} of {requests} failed (warm-up: {warm_failed} failed)");
    }
}
