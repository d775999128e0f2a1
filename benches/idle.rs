//! Idle keep-alive client connections: the resident memory each costs a
//! proxy, and the connections the proxy opens to its upstream for them.
//!
//! `cargo bench --bench idle`. For each contender in turn, a child process in
//! front of an upstream in this process (hyper HTTP/1.1, keep-alive, 200 with a
//! 3-byte body to everything, counting the connections it has accepted and the
//! ones open now, afresh for each contender):
//!
//! - `nginx`: nginx as a plain reverse proxy, `benches/load/proxy-nginx.conf.in`
//!   rendered with `keepalive 128` (2 workers);
//! - `fencegate`: the release binary as shipped (memory store, 2 workers, every
//!   limit at its default: `max_connections` 10000, `max_upstream_connections` 256).
//!
//! Once the contender answers (a `GET /objects/ready` through it) and
//! `IDLE_SETTLE_MS` have passed, its RSS is read (`VmRSS`, summed over the
//! process and its children: nginx's workers). Then `IDLE_CONNECTIONS` client
//! connections are opened, `IDLE_BATCH` at a time, with plain TCP streams (no
//! client library: the bench's own overhead stays out of the way); each sends
//! one fenced `PUT /objects/k{i}` (token 1, 2-byte body), reads the whole answer
//! and is kept open. After `IDLE_SETTLE_MS` more, the RSS is read again: (RSS
//! after − RSS before) / connections is the figure, with the upstream's
//! connections open now and accepted since the first reading beside it. A
//! connection that failed, was answered other than 2xx, or was closed by the
//! contender before the second reading makes the figure invalid (counted and
//! reported). Results go to stderr.
//!
//! Targets (the issue): ≤ 16 KB per idle client connection (goal ≤ 4 KB), and
//! upstream connections bounded per route.
//!
//! This process raises its open-file soft limit to the hard limit (the
//! contender inherits it) and says so when that is below 2 × connections + 100.
//!
//! Environment:
//! - `IDLE_CONTENDERS` (nginx fencegate): which, in order (spaces or commas);
//!   nginx is skipped with a note when it is not installed.
//! - `IDLE_CONNECTIONS` (2000): client connections held open.
//! - `IDLE_BATCH` (100): connections opened (and their `PUT`s sent) at once.
//! - `IDLE_SETTLE_MS` (3000): the wait before each RSS reading, for the
//!   contender's idle-time work (fencegate rests a connection after a second
//!   idle, and gives the freed memory back 200 ms later).
//! - `IDLE_ROUTE` (empty): more lines for fencegate's route, e.g.
//!   `upstream_idle_timeout = "1s"` with `IDLE_SETTLE_MS=3000` to see what the
//!   idle client connections hold once their upstream connections have closed.
//! - `HYPER_FLOOR_BIN`: the build of `examples/hyper_floor.rs` for the
//!   `hyper-floor` contender (`cargo build --release --example hyper_floor`),
//!   which runs only when named in `IDLE_CONTENDERS`: hyper alone, one
//!   upstream connection per client connection.
//! - `FENCEGATE_BIN`: the binary (default: the release one cargo built for this bench).
//! - `NGINX_BIN`: nginx (default: `nginx` on the PATH, else the usual sbin directories).

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// nginx's contender config, the one the load bench runs.
const NGINX_TEMPLATE: &str = include_str!("load/proxy-nginx.conf.in");
/// nginx's idle upstream connections cached per worker (`@KEEPALIVE@`).
const NGINX_KEEPALIVE: u32 = 128;
/// How long one connection's connect, `PUT` and answer may take.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(10);

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(v) => v.trim().parse().unwrap_or_else(|_| panic!("{name}={v:?} is not a valid value")),
        Err(_) => default,
    }
}

/// The upstream's connections: accepted in total, and open now.
#[derive(Default)]
struct Counts {
    accepted: AtomicU64,
    open: AtomicU64,
}

/// One open upstream connection; counted out when its task ends, however it ends.
struct Held(Arc<Counts>);

impl Drop for Held {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Starts an upstream on 127.0.0.1: HTTP/1.1, keep-alive, every request's body
/// read and answered 200 `ok\n`. Aborting the returned task stops accepting.
async fn upstream(counts: Arc<Counts>) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("the upstream binds");
    let addr = listener.local_addr().expect("the upstream's address");
    let accepting = tokio::spawn(async move {
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(e) => {
                    eprintln!("upstream accept: {e}");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            };
            counts.accepted.fetch_add(1, Ordering::Relaxed);
            counts.open.fetch_add(1, Ordering::Relaxed);
            let held = Held(counts.clone());
            tokio::spawn(async move {
                let _held = held;
                let service = hyper::service::service_fn(|req: Request<Incoming>| async move {
                    let _ = req.into_body().collect().await;
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok\n"))))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .keep_alive(true)
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, accepting)
}

/// A port free on 127.0.0.1 now (bound and let go).
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    listener.local_addr().expect("its address").port()
}

/// The nginx binary: `NGINX_BIN`, else `nginx` on the PATH, else the usual
/// sbin directories (nginx is often installed off a user's PATH).
fn find_nginx() -> Option<PathBuf> {
    if let Some(bin) = std::env::var_os("NGINX_BIN") {
        return Some(PathBuf::from(bin));
    }
    let on_path = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).map(|d| d.join("nginx")).collect::<Vec<_>>())
        .unwrap_or_default();
    let usual = ["/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/local/nginx/sbin/nginx"].map(PathBuf::from);
    on_path.into_iter().chain(usual).find(|p| p.is_file())
}

/// A contender's process; stopped on drop.
struct Contender {
    child: Child,
    proxy: SocketAddr,
    /// Where its output goes, shown when it fails.
    log: PathBuf,
}

impl Contender {
    /// SIGTERM, then SIGKILL if it has not exited after 5 s.
    fn stop(&mut self) {
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
        }
        // SAFETY: kill takes two integers and touches no memory of ours.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if !matches!(self.child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!("  (did not exit within 5 s of SIGTERM: killed)");
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Contender {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Runs `command` (a config check) and panics with its output unless it succeeds.
fn check_config(mut command: Command, what: &str) {
    let checked = command.output().unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    assert!(
        checked.status.success(),
        "{what} rejects its config:\n{}{}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );
}

/// Starts `command` with stdout and stderr to the file `log`, stdin closed.
fn spawn_logged(mut command: Command, log: &Path) -> Child {
    let out = std::fs::File::create(log).expect("the log file can be created");
    command
        .stdin(Stdio::null())
        .stdout(out.try_clone().expect("the log file"))
        .stderr(out)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", command.get_program().to_string_lossy()))
}

fn start_nginx(bin: &Path, dir: &Path, upstream: SocketAddr) -> Contender {
    let port = free_port();
    // SAFETY: geteuid has no arguments and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let user_line = if root {
        "user root;  # root: keep workers able to use the 0700 temp dir"
    } else {
        "# (not root: workers run as this user)"
    };
    let conf = NGINX_TEMPLATE
        .replace("@DIR@", &dir.display().to_string())
        .replace("@PORT@", &port.to_string())
        .replace("@UPSTREAM_PORT@", &upstream.port().to_string())
        .replace("@KEEPALIVE@", &NGINX_KEEPALIVE.to_string())
        .replace("@USER_LINE@", user_line)
        // Idle connections log nothing after their one request: no log.
        .replace("@ACCESS_LOG_LINE@", "access_log off;");
    // Any `@NAME@` left: a placeholder the template gained and this does not fill.
    let unfilled = conf
        .split('@')
        .skip(1)
        .step_by(2)
        .find(|name| !name.is_empty() && name.bytes().all(|b| b.is_ascii_uppercase() || b == b'_'));
    assert!(unfilled.is_none(), "an unfilled placeholder in the nginx template: @{}@", unfilled.unwrap_or_default());
    let path = dir.join("nginx.conf");
    std::fs::write(&path, conf).expect("the nginx config can be written");
    let prefix = format!("{}/", dir.display());
    let error_log = dir.join("error.log");
    let args = |c: &mut Command| {
        c.arg("-p").arg(&prefix).arg("-c").arg(&path).arg("-e").arg(&error_log);
    };
    let mut check = Command::new(bin);
    check.args(["-t", "-q"]);
    args(&mut check);
    check_config(check, "nginx");
    let mut run = Command::new(bin);
    args(&mut run);
    let child = spawn_logged(run, &dir.join("stdout.log"));
    Contender { child, proxy: ([127, 0, 0, 1], port).into(), log: error_log }
}

/// `examples/hyper_floor.rs`: hyper alone, one upstream connection per
/// client connection, 2 workers.
fn start_hyper_floor(bin: &Path, dir: &Path, upstream: SocketAddr) -> Contender {
    let port = free_port();
    let log = dir.join("hyper-floor.log");
    let mut run = Command::new(bin);
    run.args([format!("127.0.0.1:{port}"), upstream.to_string(), "2".to_string()]);
    let child = spawn_logged(run, &log);
    Contender { child, proxy: ([127, 0, 0, 1], port).into(), log }
}

fn start_fencegate(bin: &Path, dir: &Path, upstream: SocketAddr) -> Contender {
    let (port, admin) = (free_port(), free_port());
    let config = format!(
        "[server]\nlisten = \"127.0.0.1:{port}\"\nworkers = 2\n\
         [admin]\nlisten = \"127.0.0.1:{admin}\"\n\
         [fences]\nstore = \"memory\"\n\
         [log]\nlevel = \"warn\"\n\
         [[route]]\nname = \"objects\"\nprefix = \"/objects/\"\nupstream = \"http://{upstream}\"\n{}\n",
        std::env::var("IDLE_ROUTE").unwrap_or_default()
    );
    let path = dir.join("fencegate.toml");
    std::fs::write(&path, config).expect("the config can be written");
    let mut check = Command::new(bin);
    check.arg("--config").arg(&path).arg("--check").env_remove("FENCEGATE_CONFIG");
    check_config(check, "fencegate --check");
    let log = dir.join("fencegate.log");
    let mut run = Command::new(bin);
    run.current_dir(dir).arg("--config").arg(&path).env_remove("RUST_LOG").env_remove("FENCEGATE_CONFIG");
    let child = spawn_logged(run, &log);
    Contender { child, proxy: ([127, 0, 0, 1], port).into(), log }
}

/// What one answer said.
struct Answer {
    status: u16,
    /// `Connection: close`: the contender will not keep the connection.
    closes: bool,
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Writes `request` on `stream` and reads one whole answer: the head, then a
/// body of `Content-Length` bytes or a chunked one (up to its last chunk).
async fn exchange(stream: &mut TcpStream, request: &[u8]) -> Result<Answer, String> {
    stream.write_all(request).await.map_err(|e| format!("write: {e}"))?;
    let mut buf = Vec::with_capacity(512);
    let mut chunk = [0u8; 2048];
    let head_end = loop {
        if let Some(i) = find(&buf, b"\r\n\r\n") {
            break i + 4;
        }
        if buf.len() > 64 * 1024 {
            return Err("an answer head over 64 KiB".into());
        }
        match stream.read(&mut chunk).await {
            Ok(0) => return Err("closed before the answer's head".into()),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) => return Err(format!("read: {e}")),
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or_else(|| format!("not an HTTP status line: {:?}", head.lines().next().unwrap_or("")))?;
    let (mut length, mut chunked, mut closes) = (None, false, false);
    for line in lines {
        let Some((name, value)) = line.split_once(':') else { continue };
        let value = value.trim().to_ascii_lowercase();
        match name.trim().to_ascii_lowercase().as_str() {
            "content-length" => length = value.parse::<usize>().ok(),
            "transfer-encoding" => chunked = value.contains("chunked"),
            "connection" => closes = value.contains("close"),
            _ => {}
        }
    }
    let mut body = buf.split_off(head_end);
    loop {
        let done = if status == 204 || status == 304 {
            true
        } else if chunked {
            body.ends_with(b"0\r\n\r\n")
        } else if let Some(length) = length {
            body.len() >= length
        } else {
            return Err(format!("status {status} without Content-Length, not chunked"));
        };
        if done {
            return Ok(Answer { status, closes });
        }
        match stream.read(&mut chunk).await {
            Ok(0) => return Err("closed in the answer's body".into()),
            Ok(n) => body.extend_from_slice(&chunk[..n]),
            Err(e) => return Err(format!("read: {e}")),
        }
    }
}

/// Connects, sends one fenced `PUT /objects/k{i}`, reads the answer, and hands
/// back the stream, kept open, if it was 2xx and keeps the connection.
async fn open_one(proxy: SocketAddr, i: usize) -> Result<TcpStream, String> {
    let work = async {
        let mut stream = TcpStream::connect(proxy).await.map_err(|e| format!("connect: {e}"))?;
        let request =
            format!("PUT /objects/k{i} HTTP/1.1\r\nHost: bench\r\nX-Fencing-Token: 1\r\nContent-Length: 2\r\n\r\nok");
        let answer = exchange(&mut stream, request.as_bytes()).await?;
        if !(200..300).contains(&answer.status) {
            return Err(format!("status {}", answer.status));
        }
        if answer.closes {
            return Err("answered with Connection: close".into());
        }
        Ok(stream)
    };
    tokio::time::timeout(EXCHANGE_TIMEOUT, work).await.map_err(|_| "timed out".to_string())?
}

/// Waits until the contender answers `GET /objects/ready` with any HTTP answer.
async fn wait_ready(contender: &mut Contender) {
    let started = Instant::now();
    loop {
        let probe = async {
            let mut stream = TcpStream::connect(contender.proxy).await.map_err(|e| e.to_string())?;
            let request = b"GET /objects/ready HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n";
            exchange(&mut stream, request).await
        };
        if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(2), probe).await {
            return;
        }
        let log = || std::fs::read_to_string(&contender.log).unwrap_or_default();
        if let Ok(Some(status)) = contender.child.try_wait() {
            panic!("the contender exited ({status}) instead of answering:\n{}", log());
        }
        assert!(started.elapsed() < Duration::from_secs(30), "no answer within 30 s:\n{}", log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `pid` and its descendants, from the parent pids in `/proc/*/stat`.
fn process_tree(pid: u32) -> std::io::Result<Vec<u32>> {
    let mut parents = Vec::new();
    for entry in std::fs::read_dir("/proc")?.flatten() {
        let Some(child) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
        // "pid (comm) state ppid ...": comm may hold spaces and parentheses.
        let ppid = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok());
        if let Some(ppid) = ppid {
            parents.push((child, ppid));
        }
    }
    let mut tree = vec![pid];
    let mut i = 0;
    while i < tree.len() {
        let p = tree[i];
        tree.extend(parents.iter().filter(|(_, ppid)| *ppid == p).map(|(child, _)| *child));
        i += 1;
    }
    Ok(tree)
}

/// `VmRSS` in KiB, summed over `pid` and its descendants, and how many
/// processes that is; an error when `/proc` can't be read (this process out
/// of descriptors) or `pid` has no `VmRSS` (it has exited).
fn tree_rss_kib(pid: u32) -> Result<(u64, usize), String> {
    let rss = |p: u32| -> Result<u64, String> {
        let status =
            std::fs::read_to_string(format!("/proc/{p}/status")).map_err(|e| format!("/proc/{p}/status: {e}"))?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
            .ok_or_else(|| format!("no VmRSS for process {p}"))
    };
    let tree = process_tree(pid).map_err(|e| format!("/proc: {e}"))?;
    let mut sum = rss(pid)?;
    // A child may exit between the listing and the reading.
    sum += tree[1..].iter().filter_map(|&p| rss(p).ok()).sum::<u64>();
    Ok((sum, tree.len()))
}

/// Raises this process's open-file soft limit to the hard one (children
/// inherit it) and says whether it holds `needed` descriptors.
fn raise_open_files(needed: u64) {
    let (soft, hard) = match rlimit::getrlimit(rlimit::Resource::NOFILE) {
        Ok(limits) => limits,
        Err(e) => {
            eprintln!("cannot read the open-file limit (RLIMIT_NOFILE): {e}; {needed} descriptors are needed");
            return;
        }
    };
    if soft < hard {
        if let Err(e) = rlimit::setrlimit(rlimit::Resource::NOFILE, hard, hard) {
            eprintln!("cannot raise the open-file limit from {soft} to {hard}: {e}");
        }
    }
    let soft = rlimit::getrlimit(rlimit::Resource::NOFILE).map_or(soft, |(soft, _)| soft);
    if soft < needed {
        eprintln!(
            "\n*** THE OPEN-FILE LIMIT IS TOO LOW: {soft} (hard {hard}), and 2 x connections + 100 = {needed} \
             are needed. Connections will fail and the figures will be invalid: raise it (ulimit -n, as root \
             the hard limit too) or lower IDLE_CONNECTIONS. ***\n"
        );
    } else {
        eprintln!("open-file limit {soft} (hard {hard}): at least the {needed} needed");
    }
}

/// One contender's figures.
struct Row {
    name: String,
    connections: usize,
    rss_before_kib: u64,
    rss_after_kib: u64,
    processes: usize,
    upstream_open: u64,
    upstream_accepted: u64,
    failed: usize,
    closed: usize,
    /// Why the figure is not to be trusted, beyond failed and closed
    /// connections: the contender gone, its RSS unreadable.
    trouble: Vec<String>,
    open_secs: f64,
}

impl Row {
    fn kib_per_connection(&self) -> f64 {
        (self.rss_after_kib as f64 - self.rss_before_kib as f64) / self.connections.max(1) as f64
    }

    fn valid(&self) -> bool {
        self.failed == 0 && self.closed == 0 && self.trouble.is_empty()
    }
}

async fn measure(name: &str, connections: usize, batch: usize, settle: Duration) -> Option<Row> {
    let fencegate_bin =
        std::env::var_os("FENCEGATE_BIN").map(PathBuf::from).unwrap_or(env!("CARGO_BIN_EXE_fencegate").into());
    let dir = tempfile::Builder::new().prefix("fencegate-idle-").tempdir().expect("a temp dir");
    let counts = Arc::new(Counts::default());
    let (upstream_addr, accepting) = upstream(counts.clone()).await;
    let mut contender = match name {
        "nginx" => {
            let Some(bin) = find_nginx() else {
                eprintln!("\n== nginx: not installed (nor NGINX_BIN set): skipped");
                return None;
            };
            let version = Command::new(&bin).arg("-v").output().map(|o| o.stderr).unwrap_or_default();
            eprintln!("\n== nginx ({}, keepalive {NGINX_KEEPALIVE})", String::from_utf8_lossy(&version).trim());
            start_nginx(&bin, dir.path(), upstream_addr)
        }
        "fencegate" => {
            let version = Command::new(&fencegate_bin).arg("--version").output().map(|o| o.stdout).unwrap_or_default();
            eprintln!("\n== fencegate ({}, {})", String::from_utf8_lossy(&version).trim(), fencegate_bin.display());
            start_fencegate(&fencegate_bin, dir.path(), upstream_addr)
        }
        "hyper-floor" => {
            let Some(bin) = std::env::var_os("HYPER_FLOOR_BIN").map(PathBuf::from) else {
                eprintln!("\n== hyper-floor: HYPER_FLOOR_BIN not set: skipped");
                return None;
            };
            eprintln!("\n== hyper-floor ({})", bin.display());
            start_hyper_floor(&bin, dir.path(), upstream_addr)
        }
        other => panic!("IDLE_CONTENDERS: unknown contender {other:?} (known: nginx fencegate hyper-floor)"),
    };
    wait_ready(&mut contender).await;
    tokio::time::sleep(settle).await;
    let mut trouble = Vec::new();
    let rss_before_kib = tree_rss_kib(contender.pid()).map(|(kib, _)| kib).unwrap_or_else(|e| {
        trouble.push(format!("RSS before unreadable: {e}"));
        0
    });
    let accepted_before = counts.accepted.load(Ordering::Relaxed);

    let started = Instant::now();
    let mut streams = Vec::with_capacity(connections);
    let mut failures: BTreeMap<String, usize> = BTreeMap::new();
    for first in (0..connections).step_by(batch.max(1)) {
        let mut opening = tokio::task::JoinSet::new();
        for i in first..(first + batch.max(1)).min(connections) {
            opening.spawn(open_one(contender.proxy, i));
        }
        while let Some(opened) = opening.join_next().await {
            match opened {
                Ok(Ok(stream)) => streams.push(stream),
                Ok(Err(e)) => *failures.entry(e).or_default() += 1,
                Err(e) => *failures.entry(format!("task: {e}")).or_default() += 1,
            }
        }
    }
    let open_secs = started.elapsed().as_secs_f64();

    tokio::time::sleep(settle).await;
    let exited = contender.child.try_wait().ok().flatten();
    let (rss_after_kib, processes) = tree_rss_kib(contender.pid()).unwrap_or_else(|e| {
        trouble.push(format!("RSS after unreadable: {e}"));
        (0, 0)
    });
    if let Some(status) = exited {
        trouble.push(format!("the contender exited ({status}) before the second reading"));
    }
    let upstream_open = counts.open.load(Ordering::Relaxed);
    let upstream_accepted = counts.accepted.load(Ordering::Relaxed) - accepted_before;
    // Still open: nothing to read yet. End of stream (or an error): closed by the contender.
    let mut one = [0u8; 1];
    let closed = streams
        .iter()
        .filter(|s| !matches!(s.try_read(&mut one), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock))
        .count();

    let row = Row {
        name: name.to_string(),
        connections,
        rss_before_kib,
        rss_after_kib,
        processes,
        upstream_open,
        upstream_accepted,
        failed: failures.values().sum(),
        closed,
        trouble,
        open_secs,
    };
    let mib = |kib: u64| kib as f64 / 1024.0;
    eprintln!(
        "  {connections} connections opened in {open_secs:.2} s, {} failed, {closed} closed by the contender",
        row.failed
    );
    for (e, n) in &failures {
        eprintln!("    {n} x {e}");
    }
    for t in &row.trouble {
        eprintln!("  INVALID: {t}");
    }
    if let Some(status) = exited {
        let log = std::fs::read_to_string(&contender.log).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(10).collect();
        eprintln!("  the contender exited ({status}); the end of its log:");
        for line in tail.iter().rev() {
            eprintln!("    {line}");
        }
    }
    eprintln!(
        "  RSS ({processes} process{}): {:.1} MiB before, {:.1} MiB after: {:.2} KB per idle connection{}",
        if processes == 1 { "" } else { "es" },
        mib(rss_before_kib),
        mib(rss_after_kib),
        row.kib_per_connection(),
        if row.valid() { "" } else { " (INVALID: see above)" }
    );
    eprintln!("  upstream connections: {upstream_open} open now, {upstream_accepted} accepted since the RSS before");

    drop(streams);
    contender.stop();
    accepting.abort();
    Some(row)
}

fn ratio(a: f64, b: f64) -> String {
    if a >= 0.0 && b > 0.0 {
        format!("x{:.2}", a / b)
    } else {
        "-".into()
    }
}

fn main() {
    let contenders: Vec<String> = env_or("IDLE_CONTENDERS", "nginx fencegate".to_string())
        .split([' ', ','])
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect();
    let connections: usize = env_or("IDLE_CONNECTIONS", 2000);
    let batch: usize = env_or("IDLE_BATCH", 100);
    let settle = Duration::from_millis(env_or("IDLE_SETTLE_MS", 3000));
    eprintln!(
        "idle: {connections} idle keep-alive client connections, each after one fenced PUT, {batch} opened at once, \
         {} ms settle; contenders: {}",
        settle.as_millis(),
        contenders.join(" ")
    );
    raise_open_files(2 * connections as u64 + 100);

    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("a runtime");
    let rows: Vec<Row> =
        contenders.iter().filter_map(|name| runtime.block_on(measure(name, connections, batch, settle))).collect();

    eprintln!("\n| contender | processes | connections | RSS before MiB | RSS after MiB | KB per idle conn | upstream open | upstream accepted | failed | closed | open s |");
    eprintln!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        eprintln!(
            "| {} | {} | {} | {:.1} | {:.1} | {:.2}{} | {} | {} | {} | {} | {:.2} |",
            r.name,
            r.processes,
            r.connections,
            r.rss_before_kib as f64 / 1024.0,
            r.rss_after_kib as f64 / 1024.0,
            r.kib_per_connection(),
            if r.valid() { "" } else { " (invalid)" },
            r.upstream_open,
            r.upstream_accepted,
            r.failed,
            r.closed,
            r.open_secs,
        );
    }
    let by_name = |n: &str| rows.iter().find(|r| r.name == n);
    if let (Some(fg), Some(nginx)) = (by_name("fencegate"), by_name("nginx")) {
        eprintln!("\n| fencegate / nginx | KB per idle conn | upstream open | upstream accepted |");
        eprintln!("|---|---:|---:|---:|");
        eprintln!(
            "| ratio | {} | {} | {} |",
            ratio(fg.kib_per_connection(), nginx.kib_per_connection()),
            ratio(fg.upstream_open as f64, nginx.upstream_open as f64),
            ratio(fg.upstream_accepted as f64, nginx.upstream_accepted as f64),
        );
        if !(fg.valid() && nginx.valid()) {
            eprintln!("(a contender's figure is invalid: see its failures above)");
        }
    }
    if let Some(fg) = by_name("fencegate") {
        let kib = fg.kib_per_connection();
        let verdict = if kib <= 4.0 {
            "goal met"
        } else if kib <= 16.0 {
            "target met, goal not"
        } else {
            "target not met"
        };
        eprintln!(
            "\nfencegate: {kib:.2} KB per idle client connection (target <= 16, goal <= 4): {verdict}; \
             {} upstream connections for {} client connections",
            fg.upstream_open, fg.connections
        );
    }
}
