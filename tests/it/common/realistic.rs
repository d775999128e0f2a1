//! A realistic upstream and the clients to attack fencegate with.
//!
//! [`LegacyStore`] runs `tests/upstreams/store.py` as a child process: a store on
//! Python's `http.server` that resolves requests the way Werkzeug, nginx and
//! `http.server` do (upper-cased methods, method overrides, percent-decoded and
//! dot-resolved paths, virtual hosts, stripped header values, a GET's body read as
//! the next request, WebDAV `Destination`). Its log of applied writes is the
//! witness: a test reads it straight from the store, never through fencegate.
//!
//! [`Nginx`] runs a real nginx with WebDAV (`tests/upstreams/nginx.conf`) on a
//! temp dir: the files it wrote are the witness there.
//!
//! [`H2`] is an h2c connection with hyper's client; the raw HTTP/1.1 client that
//! sends exact bytes is in [`raw`](super::raw).

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde::Deserialize;
use tokio::net::TcpStream;

use super::process::{ChildGuard, TempDir};
use super::raw::RawRequest;
use super::Reply;

pub use super::raw::DEADLINE;

/// One write the store applied, as `GET /__log` lists it.
#[derive(Debug, Clone, Deserialize)]
pub struct Write {
    /// Its place in the log (absent while it is pending).
    #[serde(default)]
    pub seq: u64,
    /// The virtual host it picked: lower-cased, no port, no trailing dot.
    pub vhost: String,
    /// `X-Tenant`, stripped; empty without one.
    pub tenant: String,
    /// The resolved path (plus `?id=<value>` when the query names an item).
    pub resource: String,
    /// The method it ran: upper-cased, overrides applied.
    pub method: String,
    /// The method as it arrived on the wire.
    pub sent_method: String,
    /// The request target as it arrived on the wire.
    pub target: String,
    /// The `Host` header as it arrived, if any.
    pub host: Option<String>,
    /// The `Destination` header as it arrived, if any.
    pub destination: Option<String>,
    /// `X-Fencing-Token`, stripped, if any.
    pub token: Option<String>,
    /// The body applied (latin-1).
    pub body: String,
    pub body_len: usize,
}

/// One object the store holds.
#[derive(Debug, Clone, Deserialize)]
pub struct Object {
    pub vhost: String,
    pub tenant: String,
    pub resource: String,
    pub body: String,
}

/// What the store is doing right now.
#[derive(Debug, Clone, Deserialize)]
pub struct StoreState {
    /// Requests being handled (the one asking excluded).
    pub active: usize,
    /// Writes whose body was read and that are not applied yet.
    pub pending: Vec<Write>,
}

/// Runs `tests/upstreams/{script}` with python3, which serves on
/// `127.0.0.1:0` and prints its port as its first line; killed on drop.
pub fn start_python_upstream(script: &str) -> (SocketAddr, ChildGuard) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/upstreams").join(script);
    let child = Command::new("python3")
        .arg(&script)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start python3 {}: {e}", script.display()));
    let mut child = ChildGuard(child);
    let stdout = child.0.stdout.take().expect("piped stdout");
    // The first line is the port; read it on a thread so a silent upstream
    // fails the test instead of hanging it.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx.recv_timeout(DEADLINE).unwrap_or_else(|_| panic!("{} printed no port", script.display()));
    let port: u16 = line.trim().parse().unwrap_or_else(|_| panic!("{} printed {line:?}, not a port", script.display()));
    (SocketAddr::from(([127, 0, 0, 1], port)), child)
}

/// `tests/upstreams/store.py` as a child process; killed on drop.
pub struct LegacyStore {
    pub addr: SocketAddr,
    _child: ChildGuard,
}

impl LegacyStore {
    /// Starts the store on `127.0.0.1:0` and learns its port from its first line.
    pub fn start() -> LegacyStore {
        let (addr, child) = start_python_upstream("store.py");
        LegacyStore { addr, _child: child }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    async fn read<T: for<'de> Deserialize<'de>>(&self, path: &str) -> T {
        let reply = RawRequest::new("GET", path).host(&self.addr.to_string()).send(self.addr).await;
        assert_eq!(reply.status, 200, "store {path}: {reply:?}");
        serde_json::from_slice(&reply.body).unwrap_or_else(|e| panic!("store {path} is not JSON ({e}): {reply:?}"))
    }

    /// Every write applied so far, in the order applied.
    pub async fn log(&self) -> Vec<Write> {
        self.read("/__log").await
    }

    /// The writes applied to one resource of one virtual host (no tenant).
    pub async fn writes_to(&self, vhost: &str, resource: &str) -> Vec<Write> {
        self.log()
            .await
            .into_iter()
            .filter(|w| w.vhost == vhost && w.tenant.is_empty() && w.resource == resource)
            .collect()
    }

    pub async fn objects(&self) -> Vec<Object> {
        self.read("/__objects").await
    }

    /// The stored object of `resource` on `vhost` (no tenant).
    pub async fn object(&self, vhost: &str, resource: &str) -> Option<String> {
        self.object_of(vhost, "", resource).await
    }

    pub async fn object_of(&self, vhost: &str, tenant: &str, resource: &str) -> Option<String> {
        self.objects()
            .await
            .into_iter()
            .find(|o| o.vhost == vhost && o.tenant == tenant && o.resource == resource)
            .map(|o| o.body)
    }

    pub async fn state(&self) -> StoreState {
        self.read("/__state").await
    }

    /// Waits until a write to `resource` has its body read and waits to be applied.
    pub async fn wait_pending(&self, resource: &str) {
        let start = Instant::now();
        while !self.state().await.pending.iter().any(|w| w.resource == resource) {
            assert!(start.elapsed() < DEADLINE, "no write to {resource} reached the store");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits until the store handles no request and applies no write.
    pub async fn wait_idle(&self) {
        let start = Instant::now();
        loop {
            let state = self.state().await;
            if state.active == 0 && state.pending.is_empty() {
                return;
            }
            assert!(start.elapsed() < DEADLINE, "the store is still busy: {state:?}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits until the store has applied `n` writes to `resource` on `vhost`.
    pub async fn wait_writes(&self, vhost: &str, resource: &str, n: usize) -> Vec<Write> {
        let start = Instant::now();
        loop {
            let writes = self.writes_to(vhost, resource).await;
            if writes.len() >= n {
                return writes;
            }
            assert!(start.elapsed() < DEADLINE, "{n} writes to {vhost}{resource} never landed: {writes:#?}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// nginx with WebDAV on a temp dir, as a child process; killed on drop.
///
/// There is no skipping: without an `nginx` binary (the CI script installs it)
/// starting fails the test.
pub struct Nginx {
    pub addr: SocketAddr,
    dir: TempDir,
    _child: ChildGuard,
}

impl Nginx {
    pub fn start() -> Nginx {
        Nginx::start_with("", 1000)
    }

    /// The same store speaking HTTP/2 with prior knowledge (h2c), closing each
    /// connection after `keepalive_requests` streams with a GOAWAY.
    pub fn start_h2c(keepalive_requests: u32) -> Nginx {
        Nginx::start_with(" http2", keepalive_requests)
    }

    fn start_with(http2: &str, keepalive_requests: u32) -> Nginx {
        let dir = TempDir::new();
        for sub in ["a", "default", "tmp"] {
            std::fs::create_dir_all(dir.path().join(sub)).unwrap();
        }
        // nginx cannot report a port it chose: take a free one and hand it over.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let template = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/upstreams/nginx.conf");
        let conf = std::fs::read_to_string(&template)
            .unwrap()
            .replace("@DIR@", &dir.path().display().to_string())
            .replace("@PORT@", &port.to_string())
            .replace("@HTTP2@", http2)
            .replace("@KEEPALIVE_REQUESTS@", &keepalive_requests.to_string());
        let conf_path = dir.write("nginx.conf", &conf);
        let binary = ["nginx", "/usr/sbin/nginx"]
            .into_iter()
            .find(|b| Command::new(b).arg("-v").stderr(Stdio::null()).status().is_ok())
            .unwrap_or_else(|| panic!("no nginx binary: install nginx (with its WebDAV module) to run this test"));
        let child = Command::new(binary)
            .arg("-p")
            .arg(dir.path())
            .arg("-c")
            .arg(&conf_path)
            .arg("-e")
            .arg(dir.path().join("error.log"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {binary}: {e}"));
        let mut child = ChildGuard(child);
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let start = Instant::now();
        while std::net::TcpStream::connect(addr).is_err() {
            if let Some(status) = child.0.try_wait().unwrap() {
                let log = std::fs::read_to_string(dir.path().join("error.log")).unwrap_or_default();
                panic!("nginx exited ({status}) instead of listening on {addr}:\n{log}");
            }
            assert!(start.elapsed() < DEADLINE, "nginx did not listen on {addr} within {DEADLINE:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
        Nginx { addr, dir, _child: child }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every file under the roots, as (`a/...` or `default/...`, contents), sorted.
    pub fn files(&self) -> Vec<(String, String)> {
        fn walk(base: &Path, dir: &Path, out: &mut Vec<(String, String)>) {
            let Ok(entries) = std::fs::read_dir(dir) else { return };
            for entry in entries.flatten() {
                let path = entry.path();
                if path.is_dir() {
                    walk(base, &path, out);
                } else {
                    let name = path.strip_prefix(base).unwrap().to_string_lossy().into_owned();
                    let text = String::from_utf8_lossy(&std::fs::read(&path).unwrap_or_default()).into_owned();
                    out.push((name, text));
                }
            }
        }
        let mut out = Vec::new();
        for root in ["a", "default"] {
            walk(self.dir.path(), &self.dir.path().join(root), &mut out);
        }
        out.sort();
        out
    }

    /// The contents of `path` under the roots (`a/objects/x`), if it is a file.
    pub fn file(&self, path: &str) -> Option<String> {
        std::fs::read(self.dir.path().join(path)).ok().map(|b| String::from_utf8_lossy(&b).into_owned())
    }

    /// What nginx logged (errors and warnings).
    pub fn error_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("error.log")).unwrap_or_default()
    }
}

/// An h2c (prior knowledge) connection with hyper's client.
pub struct H2 {
    sender: hyper::client::conn::http2::SendRequest<Full<Bytes>>,
    authority: String,
}

impl H2 {
    pub async fn connect(addr: SocketAddr) -> H2 {
        let stream = TcpStream::connect(addr).await.unwrap();
        let (sender, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
            .handshake(TokioIo::new(stream))
            .await
            .unwrap_or_else(|e| panic!("h2c handshake with {addr}: {e}"));
        tokio::spawn(conn);
        H2 { sender, authority: addr.to_string() }
    }

    /// A request to `path` on this connection's address; `authority` overrides
    /// the `:authority` sent. Header values are sent exactly as given.
    pub fn request(
        &self,
        method: &str,
        authority: Option<&str>,
        path: &str,
        headers: &[(&str, &[u8])],
        body: impl Into<Bytes>,
    ) -> Request<Full<Bytes>> {
        let uri = format!("http://{}{path}", authority.unwrap_or(&self.authority));
        let method = Method::from_bytes(method.as_bytes()).unwrap();
        let mut req = Request::builder().method(method).uri(uri);
        for (k, v) in headers {
            req = req.header(HeaderName::from_bytes(k.as_bytes()).unwrap(), HeaderValue::from_bytes(v).unwrap());
        }
        req.body(Full::new(body.into())).unwrap()
    }

    /// Sends `req` and reads the whole response; `Err` when the stream failed.
    pub async fn send(&self, req: Request<Full<Bytes>>) -> Result<Reply, String> {
        let what = format!("{} {}", req.method(), req.uri());
        let mut sender = self.sender.clone();
        let exchange = async {
            sender.ready().await.map_err(|e| format!("{what}: connection: {e}"))?;
            let resp = sender.send_request(req).await.map_err(|e| format!("{what}: {e}"))?;
            let (parts, body) = resp.into_parts();
            let body = body.collect().await.map_err(|e| format!("{what}: body: {e}"))?.to_bytes();
            Ok(Reply { status: parts.status, headers: parts.headers, body })
        };
        tokio::time::timeout(DEADLINE, exchange).await.unwrap_or_else(|_| Err(format!("{what}: no response")))
    }

    /// Starts `req` and returns the pending response; dropping it resets the stream.
    pub fn start(
        &self,
        req: Request<Full<Bytes>>,
    ) -> impl std::future::Future<Output = Result<http::Response<hyper::body::Incoming>, hyper::Error>> {
        self.sender.clone().send_request(req)
    }
}
