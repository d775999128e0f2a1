//! fencegate as a process: the real binary as a child (start, signal, `kill -9`,
//! restart on the same working directory and store), temp dirs and config files,
//! and an in-process server started from a complete config text.
//!
//! A child listens on `127.0.0.1:0` and the tests learn the bound addresses from
//! the JSON "fencegate listening" log line. A [`Running`] guard kills the child
//! when a test fails, and prints what it logged.

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::Proxy;

/// Generous: a loaded CI machine may take a while to start a process.
pub const DEADLINE: Duration = Duration::from_secs(30);
pub const BIN: &str = env!("CARGO_BIN_EXE_fencegate");

/// A pipe end that is not read while `held` is set.
struct Held<R> {
    inner: R,
    held: Arc<AtomicBool>,
}

impl<R: Read> Read for Held<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.held.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(5));
        }
        self.inner.read(buf)
    }
}

/// A fresh directory under the system temp dir, removed on drop, that writes
/// config and key files for a test.
pub struct TempDir(tempfile::TempDir);

impl TempDir {
    pub fn new() -> TempDir {
        TempDir(tempfile::Builder::new().prefix("fencegate-test-").tempdir().expect("a temp dir can be created"))
    }

    pub fn path(&self) -> &Path {
        self.0.path()
    }

    /// Writes `text` to `name` (parent directories created) and returns its path.
    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.path().join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).unwrap();
        }
        std::fs::write(&path, text).unwrap();
        path
    }
}

impl Default for TempDir {
    fn default() -> Self {
        Self::new()
    }
}

/// A config on ephemeral loopback ports: `admin` is extra lines for `[admin]`,
/// `fences` the whole `[fences]` section (empty for none: the default file store),
/// then the `[[route]]` tables.
pub fn config_text(admin: &str, fences: &str, routes: &str) -> String {
    format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nshutdown_grace = \"5s\"\n\
         [admin]\nlisten = \"127.0.0.1:0\"\n{admin}\n\
         {fences}\n\
         {routes}"
    )
}

/// `[fences]` for the volatile memory store.
pub const MEMORY_STORE: &str = "[fences]\nstore = \"memory\"\n";

/// `[fences]` for the file store in directory `path`, plus `extra` lines.
pub fn file_store(path: &Path, extra: &str) -> String {
    format!("[fences]\nstore = \"file\"\npath = {}\n{extra}\n", toml_string(&path.display().to_string()))
}

/// `text` as a TOML string literal.
pub fn toml_string(text: &str) -> String {
    toml::Value::String(text.to_string()).to_string()
}

/// Starts fencegate in this process from a complete config text (unlike
/// [`Proxy::start_with`], which fixes `[admin]` and `[fences]`).
pub async fn start_in_process(config: &str) -> Proxy {
    let parsed = fencegate::Config::from_toml_str(config)
        .and_then(|c| c.read_secrets())
        .unwrap_or_else(|e| panic!("{e}\n---\n{config}"));
    let server = fencegate::Fencegate::bind(parsed).await.unwrap_or_else(|e| panic!("{e}"));
    let (addr, admin) = (server.proxy_addr(), server.admin_addr());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(server.run(async move {
        let _ = stopped.await;
    }));
    Proxy { addr, admin, stop: Some(stop), task: Some(task) }
}

/// Starts fencegate in this process from the config file at `path`, reloading
/// it whenever the file's directory changes (as the binary does).
pub async fn start_reloading(path: &Path) -> Proxy {
    let config = fencegate::Config::load(path).unwrap_or_else(|e| panic!("{e}"));
    let server = fencegate::Fencegate::bind(config).await.unwrap_or_else(|e| panic!("{e}")).reload_from(path);
    let (addr, admin) = (server.proxy_addr(), server.admin_addr());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(server.run(async move {
        let _ = stopped.await;
    }));
    Proxy { addr, admin, stop: Some(stop), task: Some(task) }
}

/// `fencegate` with a clean environment: no inherited config path, log filter,
/// admin URL or admin token, and a working directory without a `config/` so no default file
/// is picked up.
pub fn fencegate(cwd: &Path) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.current_dir(cwd).env_remove("FENCEGATE_CONFIG").env_remove("RUST_LOG").env_remove("FENCEGATE_ADMIN_TOKEN");
    cmd.env_remove("FENCEGATE_ADMIN_URL").env_remove("FENCEGATE_ADMIN_TOKEN_FILE");
    cmd
}

/// Kills the child on drop (test failure included).
pub struct ChildGuard(pub Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs a command that should exit on its own; kills it and fails past [`DEADLINE`].
pub fn run_to_exit(cmd: &mut Command) -> Output {
    let mut child = ChildGuard(cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap());
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = r.read_to_end(&mut buf);
            buf
        })
    };
    let stdout = drain(Box::new(child.0.stdout.take().unwrap()));
    let stderr = drain(Box::new(child.0.stderr.take().unwrap()));
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > DEADLINE {
            drop(child);
            let (out, err) = (stdout.join().unwrap(), stderr.join().unwrap());
            panic!(
                "{cmd:?} did not exit within {DEADLINE:?}\nstdout: {}\nstderr: {}",
                String::from_utf8_lossy(&out),
                String::from_utf8_lossy(&err)
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Output { status, stdout: stdout.join().unwrap(), stderr: stderr.join().unwrap() }
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A fencegate child started with `--log-format json`.
pub struct Running {
    pub child: ChildGuard,
    stdout: Arc<Mutex<Vec<String>>>,
    stderr: Arc<Mutex<Vec<String>>>,
    readers: Vec<JoinHandle<()>>,
    /// While set, nobody reads the child's stdout: its pipe fills, as one
    /// behind a stalled log collector.
    stdout_held: Arc<AtomicBool>,
    pub proxy: SocketAddr,
    pub admin: SocketAddr,
    _dir: Option<TempDir>,
}

impl Running {
    /// Writes `config` to a fresh temp dir, starts the binary there on it and
    /// waits for the "fencegate listening" event.
    pub async fn start(config: &str) -> Running {
        let dir = TempDir::new();
        let path = dir.write("fencegate.toml", config);
        let mut running = Running::start_cmd(fencegate(dir.path()).arg("--config").arg(&path)).await;
        running._dir = Some(dir);
        running
    }

    /// Starts the binary in working directory `dir` on the config file `config`
    /// and waits until it listens. Starting again with the same arguments after a
    /// [`kill`](Self::kill) is a restart on the same store.
    pub async fn start_in(dir: &Path, config: &Path) -> Running {
        Running::start_cmd(fencegate(dir).arg("--config").arg(config)).await
    }

    /// Spawns `cmd` (made with [`fencegate`]) and waits until it listens.
    pub async fn start_cmd(cmd: &mut Command) -> Running {
        let mut running = Running::spawn(cmd);
        if let Err(status) = running.wait_start().await {
            panic!("fencegate exited ({status}) instead of listening:\n{}", running.output());
        }
        running
    }

    /// Spawns `cmd` (made with [`fencegate`]) with `--log-format json` and
    /// returns at once; see [`wait_start`](Self::wait_start).
    pub fn spawn(cmd: &mut Command) -> Running {
        let mut child = ChildGuard(
            cmd.args(["--log-format", "json"])
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
        );
        let collect = |r: Box<dyn Read + Send>| {
            let lines = Arc::new(Mutex::new(Vec::new()));
            let sink = lines.clone();
            let reader = std::thread::spawn(move || {
                for line in BufReader::new(r).lines() {
                    let Ok(line) = line else { break };
                    sink.lock().unwrap().push(line);
                }
            });
            (lines, reader)
        };
        let stdout_held = Arc::new(AtomicBool::new(false));
        let held = Held { inner: child.0.stdout.take().unwrap(), held: stdout_held.clone() };
        let (stdout, out_reader) = collect(Box::new(held));
        let (stderr, err_reader) = collect(Box::new(child.0.stderr.take().unwrap()));
        let unbound: SocketAddr = "0.0.0.0:0".parse().unwrap();
        Running {
            child,
            stdout,
            stderr,
            readers: vec![out_reader, err_reader],
            stdout_held,
            proxy: unbound,
            admin: unbound,
            _dir: None,
        }
    }

    /// Waits for the "fencegate listening" event and learns the addresses from
    /// it, or for the process to exit first (its status is the error).
    pub async fn wait_start(&mut self) -> Result<(), ExitStatus> {
        let is_listening = |e: &Value| e["message"] == "fencegate listening";
        let start = Instant::now();
        let listening = loop {
            if let Some(e) = self.events().into_iter().find(is_listening) {
                break e;
            }
            if let Some(status) = self.child.0.try_wait().unwrap() {
                self.join_readers();
                match self.events().into_iter().find(is_listening) {
                    Some(e) => break e,
                    None => return Err(status),
                }
            }
            assert!(start.elapsed() < DEADLINE, "fencegate neither listened nor exited within {DEADLINE:?}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        let addr = |field: &str| -> SocketAddr {
            listening[field]
                .as_str()
                .and_then(|a| a.parse().ok())
                .unwrap_or_else(|| panic!("no {field} address in {listening}"))
        };
        self.proxy = addr("proxy");
        self.admin = addr("admin");
        Ok(())
    }

    /// Stops reading the child's stdout (`true`) or reads on (`false`).
    pub fn hold_stdout(&self, hold: bool) {
        self.stdout_held.store(hold, Ordering::SeqCst);
    }

    pub fn pid(&self) -> String {
        self.child.0.id().to_string()
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.proxy)
    }

    pub fn admin_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.admin)
    }

    /// Polls the admin `/readyz` until it answers 200 (`ready`: serving) or
    /// 503 (draining); fails after `within`.
    pub async fn wait_ready(&self, ready: bool, within: Duration) {
        let want = if ready { 200 } else { 503 };
        let url = self.admin_url("/readyz");
        super::eventually(&format!("/readyz of {} answering {want}", self.pid()), within, || async {
            super::get(&url).await.status == want
        })
        .await;
    }

    /// Polls the admin `/metrics` until `fencegate_store_writable` is 1
    /// (`writable`: the store takes fenced writes) or 0; fails after `within`.
    /// `/readyz` stays 200 either way: only draining makes it 503.
    pub async fn wait_writable(&self, writable: bool, within: Duration) {
        let want = format!("\nfencegate_store_writable {}\n", u8::from(writable));
        let url = self.admin_url("/metrics");
        super::eventually(
            &format!("fencegate_store_writable of {} turning {writable}", self.pid()),
            within,
            || async { super::get(&url).await.text().contains(&want) },
        )
        .await;
    }

    /// Sends a signal with the `kill` command (no libc in the tests).
    pub fn signal(&self, name: &str) {
        let status = Command::new("kill").arg(format!("-{name}")).arg(self.pid()).status().unwrap();
        assert!(status.success(), "kill -{name} failed: {status}");
    }

    /// `kill -9`: no drain, no clean close of anything; returns once the process
    /// is gone (its listeners and file locks with it).
    pub fn kill(&mut self) {
        // std's Child::kill is SIGKILL on unix.
        self.child.0.kill().unwrap();
        let status = self.child.0.wait().unwrap();
        assert_eq!(status.code(), None, "fencegate was not killed by a signal: {status}");
        self.join_readers();
    }

    /// Every stdout line so far, each parsed as JSON (every line must be one).
    pub fn events(&self) -> Vec<Value> {
        let lines = self.stdout.lock().unwrap().clone();
        lines
            .iter()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("stdout line is not JSON ({e}): {l}")))
            .collect()
    }

    /// Everything logged so far, stdout then stderr.
    pub fn output(&self) -> String {
        format!("{}\n{}", self.stdout.lock().unwrap().join("\n"), self.stderr.lock().unwrap().join("\n"))
    }

    /// Waits for a log event matching `pred`; fails if the process exits first.
    pub async fn wait_event(&mut self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let start = Instant::now();
        loop {
            if let Some(e) = self.events().into_iter().find(&pred) {
                return e;
            }
            if let Some(status) = self.child.0.try_wait().unwrap() {
                self.join_readers();
                if let Some(e) = self.events().into_iter().find(&pred) {
                    return e;
                }
                panic!("fencegate exited ({status}) before logging {what}");
            }
            assert!(start.elapsed() < DEADLINE, "fencegate did not log {what} within {DEADLINE:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits for the process to exit on its own; everything it logged is in
    /// [`output`](Self::output) afterwards.
    pub async fn wait_exit(&mut self) -> ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.0.try_wait().unwrap() {
                self.join_readers();
                return status;
            }
            assert!(start.elapsed() < DEADLINE, "fencegate did not exit within {DEADLINE:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// After the process is gone: the readers reach the end of its pipes soon.
    fn join_readers(&mut self) {
        for reader in self.readers.drain(..) {
            let _ = reader.join();
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let _ = self.child.0.kill();
            let _ = self.child.0.wait();
            self.join_readers();
            eprintln!("--- fencegate stdout ---\n{}", self.stdout.lock().unwrap().join("\n"));
            eprintln!("--- fencegate stderr ---\n{}", self.stderr.lock().unwrap().join("\n"));
        }
    }
}
