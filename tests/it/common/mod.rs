//! Test harness: a recording upstream, an in-process fencegate, and a small client.
//!
//! The recording upstream is the witness the tests trust: it applies writes,
//! records the order it applied them in with their start and end, the token
//! header it saw, and any moment two writes to one key were in flight at once.
//! A test can hold writes there ([`RecordingUpstream::hold`]) and release them
//! when it has seen what it wants to see meanwhile.

#![allow(dead_code)]

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;

pub use hold::{Gate, PATIENCE};
use hold::{Hold, Matcher};

/// One write the upstream applied.
#[derive(Debug, Clone)]
pub struct Applied {
    pub seq: usize,
    pub method: Method,
    pub key: String,
    pub token: Option<String>,
    pub started: Instant,
    pub ended: Instant,
    pub body_len: usize,
}

#[derive(Default)]
struct UpstreamState {
    applied: Vec<Applied>,
    /// Per key, the tokens of the writes in flight.
    in_flight: HashMap<String, Vec<Option<String>>>,
    overlaps: Vec<String>,
    /// Per key, writes that arrived while another with their token was in flight.
    together: HashMap<String, usize>,
    objects: HashMap<String, Bytes>,
    seen: Vec<(Method, String, HeaderMap)>,
    holds: Vec<Arc<Hold>>,
    /// Connections accepted.
    connections: usize,
    /// Over TLS: the handshakes that succeeded, and the ones that failed.
    handshakes: Vec<Handshake>,
    failed_handshakes: usize,
}

/// What a client asked for in a TLS handshake the upstream accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handshake {
    /// The SNI name, if one was sent (never for an IP address).
    pub server_name: Option<String>,
    /// The protocol ALPN agreed on.
    pub alpn: Option<Vec<u8>>,
    /// Whether the client presented a certificate.
    pub client_certificate: bool,
}

/// A recording HTTP store on `127.0.0.1:0`.
///
/// - `PUT`/`POST`/`PATCH`/`DELETE` apply a write to the path; the header
///   `x-slow-ms: N` makes it take at least N ms (the body is read first). A
///   write caught by a [`hold`](Self::hold) waits, body read, until released.
/// - `GET` returns the stored body (404 if none).
/// - `GET /echo...` answers a JSON document of the method, URI and headers seen.
/// - An `Upgrade: echo` request is switched to a raw byte echo.
#[derive(Clone)]
pub struct RecordingUpstream {
    pub addr: SocketAddr,
    state: Arc<Mutex<UpstreamState>>,
}

/// An accepted upstream connection: in clear, or over TLS.
type Accepted =
    tokio_util::either::Either<tokio::net::TcpStream, tokio_rustls::server::TlsStream<tokio::net::TcpStream>>;

/// Accepts on `listener` for ever, counting connections in `state` and, over
/// `tls`, recording each handshake (counting the ones that fail); `serve`
/// serves each connection on a task of its own.
fn accept_for_ever<F, Fut>(
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    state: Arc<Mutex<UpstreamState>>,
    serve: F,
) where
    F: Fn(Accepted) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let serve = Arc::new(serve);
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            state.lock().unwrap().connections += 1;
            let (serve, tls, state) = (serve.clone(), tls.clone(), state.clone());
            tokio::spawn(async move {
                let Some(tls) = tls else { return serve(tokio_util::either::Either::Left(stream)).await };
                match tls.accept(stream).await {
                    Ok(stream) => {
                        let (_, session) = stream.get_ref();
                        let handshake = Handshake {
                            server_name: session.server_name().map(str::to_string),
                            alpn: session.alpn_protocol().map(<[u8]>::to_vec),
                            client_certificate: session.peer_certificates().is_some_and(|c| !c.is_empty()),
                        };
                        state.lock().unwrap().handshakes.push(handshake);
                        serve(tokio_util::either::Either::Right(stream)).await
                    }
                    Err(_) => state.lock().unwrap().failed_handshakes += 1,
                }
            });
        }
    });
}

impl RecordingUpstream {
    pub async fn start() -> Self {
        Self::start_with(None).await
    }

    /// The same upstream behind TLS with `config` (HTTP/1.1): it records each
    /// handshake ([`Self::handshakes`]), and counts the ones that fail.
    pub async fn start_tls(config: Arc<rustls::ServerConfig>) -> Self {
        Self::start_with(Some(tokio_rustls::TlsAcceptor::from(config))).await
    }

    async fn start_with(tls: Option<tokio_rustls::TlsAcceptor>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(UpstreamState::default()));
        let upstream = RecordingUpstream { addr, state };
        let serving = upstream.clone();
        accept_for_ever(listener, tls, upstream.state.clone(), move |stream| serving.clone().serve(stream));
        upstream
    }

    async fn serve<S>(self, stream: S)
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let service = hyper::service::service_fn(move |req| self.clone().handle(req));
        let _ = hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(stream), service)
            .with_upgrades()
            .await;
    }

    /// The TLS handshakes the upstream accepted, in order.
    pub fn handshakes(&self) -> Vec<Handshake> {
        self.state.lock().unwrap().handshakes.clone()
    }

    /// TLS handshakes the upstream refused or that broke off.
    pub fn failed_handshakes(&self) -> usize {
        self.state.lock().unwrap().failed_handshakes
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Connections the upstream has accepted so far.
    pub fn connections(&self) -> usize {
        self.state.lock().unwrap().connections
    }

    pub fn applied(&self) -> Vec<Applied> {
        self.state.lock().unwrap().applied.clone()
    }

    pub fn applied_for(&self, key: &str) -> Vec<Applied> {
        self.applied().into_iter().filter(|a| a.key == key).collect()
    }

    /// Keys for which two writes with different tokens were ever in flight
    /// at the same time (a holder's own writes may be: see [`Self::together`]).
    pub fn overlaps(&self) -> Vec<String> {
        self.state.lock().unwrap().overlaps.clone()
    }

    /// Writes to `key` that arrived while another with their token was in flight.
    pub fn together(&self, key: &str) -> usize {
        self.state.lock().unwrap().together.get(key).copied().unwrap_or(0)
    }

    /// Writes to `key` in flight at the upstream right now.
    pub fn in_flight(&self, key: &str) -> usize {
        self.state.lock().unwrap().in_flight.get(key).map_or(0, Vec::len)
    }

    /// Waits until a write to `key` is in flight at the upstream.
    pub async fn wait_in_flight(&self, key: &str) {
        let deadline = Instant::now() + PATIENCE;
        while self.in_flight(key) == 0 {
            assert!(Instant::now() < deadline, "no write to {key} reached the upstream within {PATIENCE:?}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Holds the next write to `key` at the upstream (arrived, counted in
    /// flight, not applied) until the returned gate is released or dropped.
    pub fn hold(&self, key: &str) -> Gate {
        self.hold_next(key, 1)
    }

    /// Holds the next `n` writes to `key` until the gate is released or dropped.
    pub fn hold_next(&self, key: &str, n: usize) -> Gate {
        let key = key.to_string();
        self.hold_where(n, format!("write(s) to {key}"), move |_, path, _| path == key)
    }

    /// Holds the next `n` writes for which `matches(method, path, headers)` is
    /// true; `what` names them in failure messages.
    pub fn hold_where(
        &self,
        n: usize,
        what: impl Into<String>,
        matches: impl Fn(&Method, &str, &HeaderMap) -> bool + Send + Sync + 'static,
    ) -> Gate {
        let matcher: Matcher = Box::new(matches);
        let hold = Hold::new(n, what.into(), matcher);
        self.state.lock().unwrap().holds.push(hold.clone());
        Gate { hold }
    }

    pub fn object(&self, key: &str) -> Option<Bytes> {
        self.state.lock().unwrap().objects.get(key).cloned()
    }

    /// Every request the upstream saw: method, path and query, headers.
    pub fn seen(&self) -> Vec<(Method, String, HeaderMap)> {
        self.state.lock().unwrap().seen.clone()
    }

    async fn handle(self, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
        let method = req.method().clone();
        let key = req.uri().path().to_string();
        let pq = req.uri().path_and_query().map(|p| p.to_string()).unwrap_or_default();
        self.state.lock().unwrap().seen.push((method.clone(), pq.clone(), req.headers().clone()));

        if req.headers().get("upgrade").map(|v| v == "echo").unwrap_or(false) {
            let on_upgrade = hyper::upgrade::on(req);
            tokio::spawn(async move {
                if let Ok(upgraded) = on_upgrade.await {
                    let (mut r, mut w) = tokio::io::split(TokioIo::new(upgraded));
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                }
            });
            let mut resp = Response::new(Full::new(Bytes::new()));
            *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
            resp.headers_mut().insert("connection", HeaderValue::from_static("upgrade"));
            resp.headers_mut().insert("upgrade", HeaderValue::from_static("echo"));
            return Ok(resp);
        }

        if method == Method::GET || method == Method::HEAD {
            if key.starts_with("/echo") {
                let headers: serde_json::Map<String, serde_json::Value> = req
                    .headers()
                    .keys()
                    .map(|k| {
                        let values: Vec<_> = req
                            .headers()
                            .get_all(k)
                            .iter()
                            .map(|v| serde_json::Value::String(v.to_str().unwrap_or("").to_string()))
                            .collect();
                        (k.as_str().to_string(), serde_json::Value::Array(values))
                    })
                    .collect();
                let body = serde_json::json!({ "method": method.as_str(), "uri": pq, "headers": headers });
                return Ok(Response::new(Full::new(Bytes::from(body.to_string()))));
            }
            let found = self.state.lock().unwrap().objects.get(&key).cloned();
            return Ok(match found {
                Some(body) => Response::new(Full::new(body)),
                None => status(StatusCode::NOT_FOUND),
            });
        }

        // A write: mark it in flight, read the body, maybe dawdle, apply, record.
        let started = Instant::now();
        let token = req.headers().get("x-fencing-token").map(|v| v.to_str().unwrap_or("?").to_string());
        let held = {
            let mut st = self.state.lock().unwrap();
            let tokens = st.in_flight.entry(key.clone()).or_default();
            let (same, others) =
                tokens.iter().fold((0, 0), |(s, o), t| if *t == token { (s + 1, o) } else { (s, o + 1) });
            tokens.push(token.clone());
            if others > 0 {
                st.overlaps.push(key.clone());
            }
            if same > 0 {
                *st.together.entry(key.clone()).or_default() += 1;
            }
            // Claimed under the state lock, so no two writes take a hold's last slot.
            let hold = st
                .holds
                .iter()
                .find(|h| h.claimed.load(Ordering::SeqCst) < h.limit && (h.matches)(&method, &key, req.headers()));
            hold.inspect(|h| {
                h.claimed.fetch_add(1, Ordering::SeqCst);
            })
            .cloned()
        };
        // Counts the write out of flight however the handler ends.
        let in_flight = InFlight { state: self.state.clone(), key: key.clone(), token: token.clone() };
        let slow = req.headers().get("x-slow-ms").and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
        let body = match req.into_body().collect().await {
            Ok(b) => b.to_bytes(),
            Err(_) => return Ok(status(StatusCode::BAD_REQUEST)),
        };
        // Like a real store, a write whose body arrived is applied even if the
        // caller hangs up meanwhile: the rest runs in a task of its own.
        let state = self.state.clone();
        let applying = tokio::spawn(async move {
            if let Some(hold) = held {
                hold.arrive_and_wait().await;
            }
            if let Some(ms) = slow {
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            let body_len = body.len();
            let mut st = state.lock().unwrap();
            if method == Method::DELETE {
                st.objects.remove(&key);
            } else {
                st.objects.insert(key.clone(), body);
            }
            let seq = st.applied.len();
            st.applied.push(Applied { seq, method, key: key.clone(), token, started, ended: Instant::now(), body_len });
            drop(st);
            drop(in_flight);
            body_len
        });
        let body_len = applying.await.expect("the apply task does not panic");
        let mut resp = Response::new(Full::new(Bytes::from(format!("{{\"len\":{body_len}}}"))));
        resp.headers_mut().insert("content-type", HeaderValue::from_static("application/json"));
        Ok(resp)
    }
}

struct InFlight {
    state: Arc<Mutex<UpstreamState>>,
    key: String,
    token: Option<String>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(tokens) = st.in_flight.get_mut(&self.key) {
            if let Some(i) = tokens.iter().position(|t| *t == self.token) {
                tokens.swap_remove(i);
            }
        }
    }
}

fn status(code: StatusCode) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::new()));
    *r.status_mut() = code;
    r
}

/// An in-process fencegate; dropping it stops it.
pub struct Proxy {
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    pub task: Option<tokio::task::JoinHandle<()>>,
}

impl Proxy {
    /// Starts fencegate with `routes` (TOML `[[route]]` tables) on ephemeral ports.
    pub async fn start(routes: &str) -> Proxy {
        Self::start_with(routes, "").await
    }

    /// Like [`start`](Self::start) with extra top-level TOML (sections) prepended.
    pub async fn start_with(routes: &str, extra: &str) -> Proxy {
        let text = format!(
            "{extra}\n[server]\nlisten = \"127.0.0.1:0\"\nshutdown_grace = \"5s\"\n[admin]\nlisten = \"127.0.0.1:0\"\n[fences]\nstore = \"memory\"\n{routes}"
        );
        let config = fencegate::Config::from_toml_str(&text)
            .and_then(|c| c.read_secrets())
            .unwrap_or_else(|e| panic!("{e}\n---\n{text}"));
        let server = fencegate::Fencegate::bind(config).await.unwrap();
        let (addr, admin) = (server.proxy_addr(), server.admin_addr());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(server.run(async move {
            let _ = stopped.await;
        }));
        Proxy { addr, admin, stop: Some(stop), task: Some(task) }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    pub fn admin_url(&self, path: &str) -> String {
        format!("http://{}{}", self.admin, path)
    }

    /// Begins shutdown; returns the task so a test can await the drain.
    pub fn shutdown(&mut self) -> tokio::task::JoinHandle<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.task.take().expect("not shut down twice")
    }

    /// The value of an unlabelled or exactly-labelled metric line, e.g.
    /// `fencegate_requests_total{route="objects",outcome="stale"}`.
    pub async fn metric(&self, series: &str) -> Option<f64> {
        let text = get(&self.admin_url("/metrics")).await.text();
        text.lines().find_map(|l| {
            l.strip_prefix(series).and_then(|rest| rest.strip_prefix(' ')).map(|v| v.trim().parse().unwrap())
        })
    }
}

impl Proxy {
    /// Waits until a metric is `value`.
    pub async fn wait_metric(&self, series: &str, value: f64) {
        let deadline = Instant::now() + PATIENCE;
        while self.metric(series).await != Some(value) {
            assert!(Instant::now() < deadline, "{series} never reached {value} within {PATIENCE:?}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Waits until a counter is at least `value`; returns it.
    pub async fn wait_metric_at_least(&self, series: &str, value: f64) -> f64 {
        let deadline = Instant::now() + PATIENCE;
        loop {
            match self.metric(series).await {
                Some(now) if now >= value => return now,
                now => {
                    assert!(Instant::now() < deadline, "{series} stayed at {now:?}, below {value}, for {PATIENCE:?}")
                }
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// A route table entry pointing at `upstream`.
pub fn route(name: &str, prefix: &str, upstream: &RecordingUpstream, extra: &str) -> String {
    format!("[[route]]\nname = \"{name}\"\nprefix = \"{prefix}\"\nupstream = \"{}\"\n{extra}\n", upstream.url())
}

/// A finished response, body read.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }

    /// Asserts a problem+json response with this status and returns its body.
    pub fn problem(&self, status: u16) -> serde_json::Value {
        assert_eq!(self.status.as_u16(), status, "body: {}", self.text());
        assert_eq!(self.header("content-type"), Some("application/problem+json"));
        let p = self.json();
        assert_eq!(p["status"], status);
        for field in ["type", "title", "detail"] {
            assert!(p[field].is_string(), "problem without {field}: {p}");
        }
        p
    }
}

pub fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build(HttpConnector::new())
}

/// Sends one request and reads the whole response.
pub async fn send(method: &str, url: &str, headers: &[(&str, &str)], body: impl Into<Bytes>) -> Reply {
    let mut req = Request::builder().method(method).uri(url);
    for (k, v) in headers {
        req = req.header(HeaderName::from_bytes(k.as_bytes()).unwrap(), *v);
    }
    let req = req.body(Full::new(body.into())).unwrap();
    let resp = client().request(req).await.unwrap_or_else(|e| panic!("{method} {url}: {e:?}"));
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    Reply { status: parts.status, headers: parts.headers, body }
}

pub async fn get(url: &str) -> Reply {
    send("GET", url, &[], Bytes::new()).await
}

/// `PUT url` with `X-Fencing-Token: token`.
pub async fn put(url: &str, token: u64, body: &'static str) -> Reply {
    send("PUT", url, &[("x-fencing-token", &token.to_string())], body).await
}

/// Percent-encodes every byte but the unreserved ones (RFC 3986), as most HTTP
/// clients do for a query value (`?key=`).
pub fn enc(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The seed of a randomized test: `FENCEGATE_TEST_SEED` to replay a run, a
/// fresh one otherwise. Printed first, so a failure's output says how to repeat it.
pub fn test_seed() -> u64 {
    let seed = match std::env::var("FENCEGATE_TEST_SEED") {
        Ok(text) => text.parse().unwrap_or_else(|_| panic!("FENCEGATE_TEST_SEED={text:?} is not a u64")),
        Err(_) => rand::random(),
    };
    eprintln!("FENCEGATE_TEST_SEED={seed}");
    seed
}

/// Polls `check` every 50 ms until it is true; fails after `within`.
pub async fn eventually<F, Fut>(what: &str, within: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !check().await {
        assert!(start.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub mod certs;
pub mod etcd;
pub mod h2;
pub mod hold;
pub mod process;
pub mod raw;
pub mod realistic;
pub mod redis;
pub mod shared_fences;
