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
//! [`RawRequest`] and [`Conn`] send exact bytes over HTTP/1.1 (odd method
//! spellings, absolute-form targets, odd `Host` values, bodies a well-behaved client
//! would never send); [`H2`] is an h2c connection with hyper's client.

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
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::process::{ChildGuard, TempDir};
use super::Reply;

/// Longest wait for something that should happen: generous, it only matters when
/// a test fails.
pub const DEADLINE: Duration = Duration::from_secs(20);

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

/// `tests/upstreams/store.py` as a child process; killed on drop.
pub struct LegacyStore {
    pub addr: SocketAddr,
    _child: ChildGuard,
}

impl LegacyStore {
    /// Starts the store on `127.0.0.1:0` and learns its port from its first line.
    pub fn start() -> LegacyStore {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/upstreams/store.py");
        let child = Command::new("python3")
            .arg(&script)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start python3 {}: {e}", script.display()));
        let mut child = ChildGuard(child);
        let stdout = child.0.stdout.take().expect("piped stdout");
        // The first line is the port; read it on a thread so a silent store fails
        // the test instead of hanging it.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx.recv_timeout(DEADLINE).expect("the store printed no port");
        let port: u16 = line.trim().parse().unwrap_or_else(|_| panic!("the store printed {line:?}, not a port"));
        LegacyStore { addr: SocketAddr::from(([127, 0, 0, 1], port)), _child: child }
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
            .replace("@PORT@", &port.to_string());
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

/// A request written byte for byte as built: nothing is normalized.
#[derive(Debug, Clone)]
pub struct RawRequest {
    method: String,
    target: String,
    host: Option<String>,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    chunked: bool,
    keep_alive: bool,
    /// A declared Content-Length that differs from the body sent.
    declared_len: Option<usize>,
}

impl RawRequest {
    /// `method target HTTP/1.1` with `Host: a.example`, `Connection: close`.
    pub fn new(method: &str, target: &str) -> RawRequest {
        RawRequest {
            method: method.to_string(),
            target: target.to_string(),
            host: Some("a.example".to_string()),
            headers: Vec::new(),
            body: Vec::new(),
            chunked: false,
            keep_alive: false,
            declared_len: None,
        }
    }

    pub fn host(mut self, host: &str) -> Self {
        self.host = Some(host.to_string());
        self
    }

    pub fn no_host(mut self) -> Self {
        self.host = None;
        self
    }

    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_string(), value.to_string()));
        self
    }

    /// `X-Fencing-Token: token`.
    pub fn token(self, token: u64) -> Self {
        self.header("X-Fencing-Token", &token.to_string())
    }

    /// The body, sent with its Content-Length (or chunked, see [`chunked`](Self::chunked)).
    pub fn body(mut self, body: impl AsRef<[u8]>) -> Self {
        self.body = body.as_ref().to_vec();
        self
    }

    /// `Transfer-Encoding: chunked`: the body as one chunk, then the last chunk.
    pub fn chunked(mut self) -> Self {
        self.chunked = true;
        self
    }

    /// `Content-Length: len` whatever the body holds.
    pub fn declare_len(mut self, len: usize) -> Self {
        self.declared_len = Some(len);
        self
    }

    /// No `Connection: close`.
    pub fn keep_alive(mut self) -> Self {
        self.keep_alive = true;
        self
    }

    /// The head: request line, headers, blank line.
    pub fn head(&self) -> Vec<u8> {
        let mut out = format!("{} {} HTTP/1.1\r\n", self.method, self.target);
        if let Some(host) = &self.host {
            out.push_str(&format!("Host: {host}\r\n"));
        }
        for (k, v) in &self.headers {
            out.push_str(&format!("{k}: {v}\r\n"));
        }
        if self.chunked {
            out.push_str("Transfer-Encoding: chunked\r\n");
        } else if let Some(len) = self.declared_len {
            out.push_str(&format!("Content-Length: {len}\r\n"));
        } else if !self.body.is_empty() {
            out.push_str(&format!("Content-Length: {}\r\n", self.body.len()));
        }
        if !self.keep_alive {
            out.push_str("Connection: close\r\n");
        }
        out.push_str("\r\n");
        out.into_bytes()
    }

    /// The body as it goes on the wire (chunk framing included).
    pub fn wire_body(&self) -> Vec<u8> {
        if !self.chunked {
            return self.body.clone();
        }
        let mut out = Vec::new();
        if !self.body.is_empty() {
            out.extend(format!("{:X}\r\n", self.body.len()).into_bytes());
            out.extend(&self.body);
            out.extend(b"\r\n");
        }
        out.extend(b"0\r\n\r\n");
        out
    }

    /// Head and body.
    pub fn bytes(&self) -> Vec<u8> {
        let mut out = self.head();
        out.extend(self.wire_body());
        out
    }

    /// Sends the request on a fresh connection and reads one response.
    pub async fn send(&self, addr: SocketAddr) -> RawReply {
        self.try_send(addr).await.unwrap_or_else(|e| panic!("{}: {e}", self.describe()))
    }

    /// Like [`send`](Self::send), but a connection closed without a response
    /// (or none within [`DEADLINE`]) is an `Err` saying what arrived.
    pub async fn try_send(&self, addr: SocketAddr) -> Result<RawReply, String> {
        let mut conn = Conn::open(addr).await;
        conn.stream.write_all(&self.bytes()).await.map_err(|e| format!("write: {e}"))?;
        conn.try_response_to(&self.method).await
    }

    /// What this request is, for a failure message.
    pub fn describe(&self) -> String {
        let headers: Vec<String> = self.headers.iter().map(|(k, v)| format!("{k}: {v:?}")).collect();
        format!(
            "{} {} (Host: {:?}; {}{})",
            self.method,
            self.target,
            self.host,
            headers.join("; "),
            if self.chunked { "; chunked" } else { "" }
        )
    }
}

/// A response read off a raw socket.
#[derive(Debug)]
pub struct RawReply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl RawReply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The problem document, if the response is one.
    pub fn problem(&self) -> Option<serde_json::Value> {
        if self.header("content-type") != Some("application/problem+json") {
            return None;
        }
        serde_json::from_slice(&self.body).ok()
    }

    /// The problem `type`, if the response is a problem document.
    pub fn problem_type(&self) -> Option<String> {
        self.problem().and_then(|p| p["type"].as_str().map(str::to_string))
    }
}

/// A client connection over a raw socket, with what it has read but not parsed.
pub struct Conn {
    pub stream: TcpStream,
    buf: Vec<u8>,
}

impl Conn {
    pub async fn open(addr: SocketAddr) -> Conn {
        let stream = tokio::time::timeout(DEADLINE, TcpStream::connect(addr))
            .await
            .expect("connect timed out")
            .unwrap_or_else(|e| panic!("connect to {addr}: {e}"));
        stream.set_nodelay(true).unwrap();
        Conn { stream, buf: Vec::new() }
    }

    pub async fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.expect("write failed");
    }

    async fn fill(&mut self) -> std::io::Result<usize> {
        let mut chunk = [0u8; 16 * 1024];
        let n = self.stream.read(&mut chunk).await?;
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(n)
    }

    async fn fill_to(&mut self, n: usize) -> Result<(), String> {
        while self.buf.len() < n {
            match self.fill().await {
                Ok(0) => return Err(format!("closed after {} bytes: {:?}", self.buf.len(), self.text())),
                Ok(_) => {}
                Err(e) => return Err(format!("{e} after {} bytes: {:?}", self.buf.len(), self.text())),
            }
        }
        Ok(())
    }

    async fn fill_until(&mut self, needle: &[u8]) -> Result<usize, String> {
        loop {
            if let Some(i) = self.buf.windows(needle.len()).position(|w| w == needle) {
                return Ok(i + needle.len());
            }
            let want = self.buf.len() + 1;
            self.fill_to(want).await?;
        }
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.buf).into_owned()
    }

    fn take(&mut self, n: usize) -> Vec<u8> {
        self.buf.drain(..n).collect()
    }

    /// The next response to a request with `method` (a `HEAD` response has no
    /// body), or why there was none within [`DEADLINE`].
    pub async fn try_response_to(&mut self, method: &str) -> Result<RawReply, String> {
        self.try_response_within(method, DEADLINE).await
    }

    /// Like [`try_response_to`](Self::try_response_to) with a wait of `limit`.
    pub async fn try_response_within(&mut self, method: &str, limit: Duration) -> Result<RawReply, String> {
        match tokio::time::timeout(limit, self.parse_response(method == "HEAD")).await {
            Ok(result) => result,
            Err(_) => Err(format!("no response within {limit:?}; read so far: {:?}", self.text())),
        }
    }

    /// The next response to a request with `method`; fails the test if none.
    pub async fn response_to(&mut self, method: &str) -> RawReply {
        self.try_response_to(method).await.unwrap_or_else(|e| panic!("no response: {e}"))
    }

    async fn parse_response(&mut self, head_only: bool) -> Result<RawReply, String> {
        let end = self.fill_until(b"\r\n\r\n").await?;
        let head = String::from_utf8_lossy(&self.take(end)).into_owned();
        let mut lines = head.trim_end().split("\r\n");
        let status_line = lines.next().unwrap_or_default();
        let status = status_line
            .strip_prefix("HTTP/1.1 ")
            .or_else(|| status_line.strip_prefix("HTTP/1.0 "))
            .and_then(|rest| rest.get(..3))
            .and_then(|code| code.parse().ok())
            .ok_or_else(|| format!("bad status line {status_line:?}"))?;
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        let get = |name: &str| headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
        let body = if head_only || status == 304 || status == 204 || (100..200).contains(&status) {
            Vec::new()
        } else if get("transfer-encoding").is_some_and(|te| te.eq_ignore_ascii_case("chunked")) {
            let mut body = Vec::new();
            loop {
                let line_end = self.fill_until(b"\r\n").await?;
                let line = String::from_utf8_lossy(&self.take(line_end)).trim().to_string();
                let size = usize::from_str_radix(line.split(';').next().unwrap_or_default(), 16)
                    .map_err(|e| format!("bad chunk size {line:?}: {e}"))?;
                if size == 0 {
                    let end = self.fill_until(b"\r\n").await?;
                    self.take(end);
                    break;
                }
                self.fill_to(size + 2).await?;
                body.extend(self.take(size));
                self.take(2);
            }
            body
        } else if let Some(len) = get("content-length") {
            let len: usize = len.parse().map_err(|e| format!("bad content-length {len:?}: {e}"))?;
            self.fill_to(len).await?;
            self.take(len)
        } else {
            // Delimited by the close.
            while self.fill().await.map_err(|e| e.to_string())? > 0 {}
            std::mem::take(&mut self.buf)
        };
        Ok(RawReply { status, headers, body })
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
