//! The attacks of issue 13 as reusable clients: each runs against a proxy
//! (or its admin listener) until a deadline and says what it saw. The hostile
//! benchmark runs them beside a normal client; the bounds tests can include
//! this file (`#[path]`) to run one in miniature.
//!
//! Every attack stops at its deadline and drops what it holds; none panics on
//! a refusal or a reset, which is what a bounded proxy answers.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{timeout_at, Instant};

#[path = "hpack.rs"]
mod hpack;
// Each includer uses the attacks it needs.
#[allow(unused_imports)]
pub use hpack::hpack_amplification;

/// What an attack saw: how many connections and requests it made, and the
/// statuses (or errors) that came back.
#[derive(Debug, Default)]
pub struct Seen {
    pub connections: u64,
    pub requests: u64,
    pub outcomes: BTreeMap<String, u64>,
}

impl Seen {
    fn count(&mut self, outcome: impl Into<String>) {
        *self.outcomes.entry(outcome.into()).or_default() += 1;
    }

    fn merge(&mut self, other: Seen) {
        self.connections += other.connections;
        self.requests += other.requests;
        for (k, v) in other.outcomes {
            *self.outcomes.entry(k).or_default() += v;
        }
    }
}

impl std::fmt::Display for Seen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} conns, {} reqs", self.connections, self.requests)?;
        for (k, v) in &self.outcomes {
            write!(f, ", {k}: {v}")?;
        }
        Ok(())
    }
}

/// The last byte of the attacker's loopback address, 127.0.0.N (2 unless
/// set): the hostile benchmark gives each attack an address of its own, so
/// what one attack earned from the proxy does not carry into the next.
pub static ATTACKER_HOST: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(2);

/// A connection to `addr` from an address of the attacker's own: on the
/// loopback, 127.0.0.[`ATTACKER_HOST`] (on Linux every 127/8 address is
/// local), so the proxy tells the attacker from the clients beside it (on
/// 127.0.0.1) by address, as it would machines of their own.
pub async fn attacker_connect(addr: SocketAddr) -> std::io::Result<TcpStream> {
    if !addr.ip().is_loopback() || !addr.is_ipv4() {
        return TcpStream::connect(addr).await;
    }
    let socket = tokio::net::TcpSocket::new_v4()?;
    let host = ATTACKER_HOST.load(std::sync::atomic::Ordering::Relaxed);
    socket.bind(SocketAddr::from(([127, 0, 0, host], 0)))?;
    socket.connect(addr).await
}

async fn h2_connect(addr: SocketAddr, builder: &h2::client::Builder) -> Result<h2::client::SendRequest<Bytes>, String> {
    let tcp = attacker_connect(addr).await.map_err(|e| format!("connect: {e}"))?;
    let (send, conn) = builder.handshake::<_, Bytes>(tcp).await.map_err(|e| format!("handshake: {e}"))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(send)
}

fn request(method: Method, addr: SocketAddr, path: &str, token: Option<u64>) -> Request<()> {
    let mut req = Request::builder().method(method).uri(format!("http://{addr}{path}"));
    if let Some(token) = token {
        req = req.header("x-fencing-token", token.to_string());
    }
    req.body(()).unwrap_or_else(|e| panic!("request for {path}: {e}"))
}

/// (1) One HTTP/2 connection per `connections`, each opening `streams` fenced
/// PUTs under `prefix` without a content-length and pushing `push` bytes into
/// each, never ending them; held until `deadline`.
pub async fn h2_unended_bodies(
    addr: SocketAddr,
    prefix: &str,
    connections: usize,
    streams: usize,
    push: usize,
    deadline: Instant,
) -> Seen {
    let mut tasks = Vec::new();
    for c in 0..connections {
        let prefix = prefix.to_string();
        tasks.push(tokio::spawn(async move {
            let mut seen = Seen::default();
            let mut builder = h2::client::Builder::new();
            builder.initial_window_size(1 << 20);
            let Ok(mut send) = h2_connect(addr, &builder).await else {
                seen.count("connect failed");
                return seen;
            };
            seen.connections += 1;
            let chunk = Bytes::from(vec![b'x'; push]);
            let mut held = Vec::new();
            for s in 0..streams {
                if Instant::now() >= deadline {
                    break;
                }
                let req = request(Method::PUT, addr, &format!("{prefix}body-{c}-{s}"), Some(1));
                let ready = match timeout_at(deadline, send.ready()).await {
                    Ok(Ok(ready)) => ready,
                    Ok(Err(e)) => {
                        seen.count(format!("h2: {e}"));
                        break;
                    }
                    Err(_) => break,
                };
                send = ready;
                match send.send_request(req, false) {
                    Ok((response, mut body)) => {
                        seen.requests += 1;
                        // h2 queues what the window does not take yet.
                        let _ = body.send_data(chunk.clone(), false);
                        held.push((response, body));
                    }
                    Err(e) => {
                        seen.count(format!("h2: {e}"));
                        break;
                    }
                }
            }
            // Whatever the proxy answers before the deadline (408, 413, 503...).
            for (response, _body) in &mut held {
                match timeout_at(deadline, response).await {
                    Ok(Ok(r)) => seen.count(r.status().as_str()),
                    Ok(Err(e)) => seen.count(format!("h2: {}", e.reason().map(|r| r.to_string()).unwrap_or_default())),
                    Err(_) => seen.count("no answer"),
                }
            }
            tokio::time::sleep_until(deadline).await;
            drop(held);
            seen
        }));
    }
    join(tasks).await
}

/// (2) Fenced PUTs to distinct keys of `key_bytes` bytes each, from
/// `connections` HTTP/1.1 connections, until `deadline`.
pub async fn long_keys(
    addr: SocketAddr,
    prefix: &str,
    connections: usize,
    key_bytes: usize,
    deadline: Instant,
) -> Seen {
    let mut tasks = Vec::new();
    for c in 0..connections {
        let prefix = prefix.to_string();
        let pad = "k".repeat(key_bytes.saturating_sub(prefix.len() + 24));
        let mut i = 0u64;
        tasks.push(tokio::spawn(http1_loop(addr, deadline, move || {
            i += 1;
            format!(
                "PUT {prefix}{c}-{i}-{pad} HTTP/1.1\r\nhost: bench\r\nx-fencing-token: 1\r\ncontent-length: 1\r\n\r\nx"
            )
        })));
    }
    join(tasks).await
}

/// Sends the requests `next` writes one after another on one HTTP/1.1
/// connection to `addr`, reconnecting whenever it closes, until `deadline`.
async fn http1_loop(addr: SocketAddr, deadline: Instant, mut next: impl FnMut() -> String) -> Seen {
    let mut seen = Seen::default();
    let mut stream: Option<TcpStream> = None;
    while Instant::now() < deadline {
        if stream.is_none() {
            stream = attacker_connect(addr).await.ok();
            seen.connections += 1;
        }
        let Some(conn) = stream.as_mut() else { continue };
        match timeout_at(deadline, http1_exchange(conn, next().as_bytes())).await {
            Ok(Ok((status, close))) => {
                seen.requests += 1;
                seen.count(status);
                if close {
                    stream = None;
                }
            }
            Ok(Err(e)) => {
                seen.count(e);
                stream = None;
            }
            Err(_) => break,
        }
    }
    seen
}

/// Writes one request and reads one response: its status, and whether the
/// server closes the connection after it.
async fn http1_exchange(conn: &mut TcpStream, request: &[u8]) -> Result<(String, bool), String> {
    conn.write_all(request).await.map_err(|e| format!("write: {e}"))?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let n = conn.read(&mut chunk).await.map_err(|e| format!("read: {e}"))?;
        if n == 0 {
            return Err("closed".into());
        }
        buf.extend_from_slice(&chunk[..n]);
        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else { continue };
        let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
        let status = head.split(' ').nth(1).unwrap_or("?").to_string();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        while buf.len() < end + 4 + length {
            let n = conn.read(&mut chunk).await.map_err(|e| format!("read: {e}"))?;
            if n == 0 {
                return Err("closed".into());
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        return Ok((status, head.contains("connection: close")));
    }
}

/// (3a) `count` idle TCP connections to `addr` (the admin listener), held
/// until `deadline`.
pub async fn idle_connections(addr: SocketAddr, count: usize, deadline: Instant) -> Seen {
    let mut seen = Seen::default();
    let mut held = Vec::new();
    for _ in 0..count {
        match timeout_at(deadline, attacker_connect(addr)).await {
            Ok(Ok(s)) => {
                seen.connections += 1;
                held.push(s);
            }
            Ok(Err(e)) => seen.count(format!("connect: {}", e.kind())),
            Err(_) => break,
        }
    }
    tokio::time::sleep_until(deadline).await;
    seen
}

/// (3b) HTTP/2 connections with a zero receive window, each with `streams`
/// GETs under `prefix` whose responses can never be read, pinning what the
/// proxy holds for them (upstream connections) until `deadline`.
pub async fn h2_zero_window(
    addr: SocketAddr,
    prefix: &str,
    connections: usize,
    streams: usize,
    deadline: Instant,
) -> Seen {
    let mut tasks = Vec::new();
    for c in 0..connections {
        let prefix = prefix.to_string();
        tasks.push(tokio::spawn(async move {
            let mut seen = Seen::default();
            let mut builder = h2::client::Builder::new();
            builder.initial_window_size(0).initial_connection_window_size(0);
            let Ok(mut send) = h2_connect(addr, &builder).await else {
                seen.count("connect failed");
                return seen;
            };
            seen.connections += 1;
            let mut held = Vec::new();
            for s in 0..streams {
                if Instant::now() >= deadline {
                    break;
                }
                send = match timeout_at(deadline, send.ready()).await {
                    Ok(Ok(ready)) => ready,
                    _ => break,
                };
                match send.send_request(request(Method::GET, addr, &format!("{prefix}zero-{c}-{s}"), None), true) {
                    Ok((response, _)) => {
                        seen.requests += 1;
                        held.push(response);
                    }
                    Err(e) => {
                        seen.count(format!("h2: {e}"));
                        break;
                    }
                }
            }
            tokio::time::sleep_until(deadline).await;
            for response in held {
                match tokio::time::timeout(Duration::from_millis(1), response).await {
                    Ok(Ok(r)) => seen.count(r.status().as_str()),
                    Ok(Err(_)) => seen.count("reset"),
                    Err(_) => seen.count("no head"),
                }
            }
            seen
        }));
    }
    join(tasks).await
}

/// (4) `loops` clients listing fences on the admin listener (`GET
/// /fences?prefix=/&limit=limit`) back to back until `deadline`.
pub async fn admin_listings(admin: SocketAddr, loops: usize, limit: usize, deadline: Instant) -> Seen {
    let mut tasks = Vec::new();
    for _ in 0..loops {
        let head = format!("GET /fences?prefix=%2F&limit={limit} HTTP/1.1\r\nhost: bench\r\n\r\n");
        tasks.push(tokio::spawn(http1_loop(admin, deadline, move || head.clone())));
    }
    join(tasks).await
}

/// (6) Rapid reset: on `connections` HTTP/2 connections at once, open GETs
/// under `prefix` and reset each at once, reconnecting whenever the proxy
/// closes a connection, until `deadline`.
pub async fn rapid_reset(addr: SocketAddr, prefix: &str, connections: usize, deadline: Instant) -> Seen {
    let mut tasks = Vec::new();
    for c in 0..connections {
        let prefix = prefix.to_string();
        tasks.push(tokio::spawn(async move {
            let mut seen = Seen::default();
            let builder = h2::client::Builder::new();
            let mut i = 0u64;
            'connections: while Instant::now() < deadline {
                let Ok(Ok(mut send)) = timeout_at(deadline, h2_connect(addr, &builder)).await else {
                    seen.count("connect failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                seen.connections += 1;
                // Checked here too: `ready` may never be pending, and then
                // the timeout around it never fires.
                while Instant::now() < deadline {
                    send = match timeout_at(deadline, send.ready()).await {
                        Ok(Ok(ready)) => ready,
                        Ok(Err(_)) => {
                            seen.count("connection closed");
                            continue 'connections;
                        }
                        Err(_) => break 'connections,
                    };
                    i += 1;
                    let req = request(Method::GET, addr, &format!("{prefix}reset-{c}-{i}"), None);
                    match send.send_request(req, true) {
                        Ok((_response, mut stream)) => {
                            seen.requests += 1;
                            stream.send_reset(h2::Reason::CANCEL);
                            if i.is_multiple_of(32) {
                                tokio::task::yield_now().await;
                            }
                        }
                        Err(_) => {
                            seen.count("connection closed");
                            continue 'connections;
                        }
                    }
                }
            }
            seen
        }));
    }
    join(tasks).await
}

async fn join(tasks: Vec<tokio::task::JoinHandle<Seen>>) -> Seen {
    let mut all = Seen::default();
    for task in tasks {
        match task.await {
            Ok(seen) => all.merge(seen),
            Err(e) => all.count(format!("attack task failed: {e}")),
        }
    }
    all
}
