//! What the hostile benchmark runs the attacks against: the fencegate binary
//! as a child process with its log in a file, a sampler of its memory and
//! descriptors from /proc, and an upstream that answers everything.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;

/// The fencegate child; killed on drop.
pub struct Fencegate {
    child: Child,
    pub proxy: SocketAddr,
    pub admin: SocketAddr,
    log: PathBuf,
}

impl Fencegate {
    /// Starts `bin` on `config` in `dir`, logging JSON lines to `dir/fencegate.log`,
    /// and waits for its "fencegate listening" line.
    pub fn start(bin: &Path, dir: &Path, config: &str) -> Fencegate {
        let path = dir.join("fencegate.toml");
        std::fs::write(&path, config).expect("the config can be written");
        let log = dir.join("fencegate.log");
        let out = std::fs::File::create(&log).expect("the log file can be created");
        let child = Command::new(bin)
            .current_dir(dir)
            .arg("--config")
            .arg(&path)
            .args(["--log-format", "json"])
            .env_remove("RUST_LOG")
            .env_remove("FENCEGATE_CONFIG")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
        let mut fencegate = Fencegate { child, proxy: ([0, 0, 0, 0], 0).into(), admin: ([0, 0, 0, 0], 0).into(), log };
        let started = Instant::now();
        loop {
            let text = std::fs::read_to_string(&fencegate.log).unwrap_or_default();
            let listening = text
                .lines()
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .find(|e| e["message"] == "fencegate listening");
            if let Some(e) = listening {
                let addr = |f: &str| e[f].as_str().and_then(|a| a.parse().ok()).expect("a listening address");
                fencegate.proxy = addr("proxy");
                fencegate.admin = addr("admin");
                return fencegate;
            }
            if let Ok(Some(status)) = fencegate.child.try_wait() {
                panic!("fencegate exited ({status}) instead of listening:\n{text}");
            }
            assert!(started.elapsed() < Duration::from_secs(30), "fencegate did not listen within 30 s:\n{text}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The lines logged so far, and how many of them at WARN or ERROR.
    pub fn lines(&self) -> (usize, usize) {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let loud = text.lines().filter(|l| l.contains(r#""level":"WARN""#) || l.contains(r#""level":"ERROR""#)).count();
        (text.lines().count(), loud)
    }

    /// Whether the process is still running (an attack may have killed it).
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Fencegate {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One reading of the process: resident and peak-resident memory, open descriptors.
#[derive(Debug, Default, Clone, Copy)]
pub struct Reading {
    pub rss_kib: u64,
    pub hwm_kib: u64,
    pub fds: u64,
}

pub fn read(pid: u32) -> Reading {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count() as u64).unwrap_or(0);
    Reading { rss_kib: field("VmRSS:"), hwm_kib: field("VmHWM:"), fds }
}

/// Samples the process every 50 ms and keeps the peaks since the last [`take`](Self::take).
pub struct Sampler {
    peak: Arc<Mutex<Reading>>,
    stop: Arc<AtomicBool>,
}

impl Sampler {
    pub fn start(pid: u32) -> Sampler {
        let peak = Arc::new(Mutex::new(Reading::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let (p, s) = (peak.clone(), stop.clone());
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let now = read(pid);
                if let Ok(mut peak) = p.lock() {
                    peak.rss_kib = peak.rss_kib.max(now.rss_kib);
                    peak.hwm_kib = peak.hwm_kib.max(now.hwm_kib);
                    peak.fds = peak.fds.max(now.fds);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        Sampler { peak, stop }
    }

    /// The peaks since the last call, and a fresh start.
    pub fn take(&self) -> Reading {
        self.peak.lock().map(|mut p| std::mem::take(&mut *p)).unwrap_or_default()
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// An upstream on its own thread and runtime: a GET gets `get_body` bytes, a
/// write has its body read and gets 204. HTTP/1.1 and h2c.
pub fn upstream(get_body: usize) -> SocketAddr {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build();
        let Ok(runtime) = runtime else { return };
        runtime.block_on(async move {
            let Ok(listener) = TcpListener::bind("127.0.0.1:0").await else { return };
            let _ = tx.send(listener.local_addr());
            let body = Bytes::from(vec![b'u'; get_body]);
            loop {
                let Ok((stream, _)) = listener.accept().await else { continue };
                let body = body.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                        let body = body.clone();
                        async move {
                            let reply = if req.method() == Method::GET {
                                Response::new(Full::new(body))
                            } else {
                                let _ = req.into_body().collect().await;
                                let mut r = Response::new(Full::new(Bytes::new()));
                                *r.status_mut() = http::StatusCode::NO_CONTENT;
                                r
                            };
                            Ok::<_, Infallible>(reply)
                        }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
    });
    rx.recv().expect("the upstream thread starts").expect("the upstream binds")
}
