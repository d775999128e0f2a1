//! Slow and silent connections, over raw TCP sockets: whatever a connection
//! starts with, it must complete its first request head (or the HTTP/2
//! preface and its SETTINGS) within `header_read_timeout`, and is bound by
//! `idle_timeout` after; an HTTP/2 frame or header block left incomplete
//! between requests is a slow head too; and a client that ignores the
//! graceful close (GOAWAY and its PING) is closed after a short grace. HTTP/2
//! frames are written and read by hand here: a 9-byte header and a payload.
//!
//! Timeouts are short (300 ms) so the file stays fast; every wait for
//! something that should happen has a generous deadline, and nothing asserts
//! how fast it happened. The only fixed waits are the ones that let a polite
//! client show it is kept.

use crate::common;

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::AsyncWriteExt;

use common::h2::{
    frame, ACK, CONTINUATION, DATA, END_HEADERS, END_STREAM, GOAWAY, HEADERS, PING, PREFACE, SETTINGS, WINDOW_UPDATE,
};
use common::process::{start_in_process, MEMORY_STORE};
use common::raw::Conn;
use common::*;

/// Longest wait for something that should happen: generous, it only matters
/// when a test fails.
const DEADLINE: Duration = Duration::from_secs(10);

/// A short `header_read_timeout`, and an `idle_timeout` far beyond the test's
/// deadline: only the slow-head guard can close a connection in time.
const SLOW_HEAD: &str = "header_read_timeout = \"300ms\"\nidle_timeout = \"60s\"";

/// Both timeouts short: the idle guard closes connections too.
const SHORT_IDLE: &str = "header_read_timeout = \"300ms\"\nidle_timeout = \"500ms\"";

/// Starts fencegate on ephemeral ports with `server` as extra `[server]` lines
/// (`shutdown_grace` is 5 s unless they say otherwise).
async fn start(server: &str, routes: &str) -> Proxy {
    let grace = if server.contains("shutdown_grace") { "" } else { "shutdown_grace = \"5s\"" };
    start_in_process(&format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n{grace}\n{server}\n\
         [admin]\nlisten = \"127.0.0.1:0\"\n\
         {MEMORY_STORE}\n{routes}"
    ))
    .await
}

// --- HTTP/2 by hand ------------------------------------------------------------

/// The client's opening: the preface and an empty SETTINGS frame.
fn opening() -> Vec<u8> {
    [PREFACE.as_slice(), &frame(SETTINGS, 0, 0, &[])].concat()
}

/// An HPACK header field, literal without indexing, its name from the static
/// table (RFC 7541 §6.2.2, Appendix A); values under 127 bytes.
fn field(name_index: u8, value: &str) -> Vec<u8> {
    [&[name_index, value.len() as u8][..], value.as_bytes()].concat()
}

/// An HPACK header field with a name of its own, literal without indexing.
fn named_field(name: &str, value: &str) -> Vec<u8> {
    [&[0, name.len() as u8][..], name.as_bytes(), &[value.len() as u8], value.as_bytes()].concat()
}

/// The header block of `GET http://x{path}`.
fn get_block(path: &str) -> Vec<u8> {
    // Static table: 2 is `:method: GET`, 6 is `:scheme: http`, 4 is `:path`, 1 is `:authority`.
    [&[0x82, 0x86][..], &field(4, path), &field(1, "x")].concat()
}

/// `:status` from a response's header block, as an HPACK encoder writes it:
/// indexed from the static table, or a literal with the static name.
fn status(block: &[u8]) -> Option<u16> {
    match block.first()? {
        0x88 => Some(200),
        0x89 => Some(204),
        0x8a => Some(206),
        0x8b => Some(304),
        0x8c => Some(400),
        0x8d => Some(404),
        0x8e => Some(500),
        // Literal (incremental, without or never indexing) with name index 8.
        0x48 | 0x08 | 0x18 if block.get(1) == Some(&3) => std::str::from_utf8(block.get(2..5)?).ok()?.parse().ok(),
        _ => None,
    }
}

/// One frame as read.
#[derive(Debug)]
struct Frame {
    kind: u8,
    flags: u8,
    stream: u32,
    payload: Vec<u8>,
}

/// A raw HTTP/2 client. A polite one acknowledges the server's SETTINGS and
/// PINGs as they arrive; a rogue one never acknowledges anything.
struct H2 {
    conn: Conn,
    polite: bool,
    goaway: bool,
    pings: usize,
    ping_acks: usize,
}

impl H2 {
    /// Connects and sends the opening.
    async fn open(addr: SocketAddr, polite: bool) -> H2 {
        let mut conn = Conn::open(addr).await;
        conn.send(&opening()).await;
        H2 { conn, polite, goaway: false, pings: 0, ping_acks: 0 }
    }

    /// Sends bytes; fails the test if the connection is gone.
    async fn send(&mut self, bytes: &[u8]) {
        self.conn.send(bytes).await;
    }

    /// The next frame, or `None` once the server has closed the connection.
    async fn next(&mut self) -> Option<Frame> {
        let read = tokio::time::timeout(DEADLINE, async {
            loop {
                if self.conn.buf.len() >= 9 {
                    let len = u32::from_be_bytes([0, self.conn.buf[0], self.conn.buf[1], self.conn.buf[2]]) as usize;
                    if self.conn.buf.len() >= 9 + len {
                        let bytes: Vec<u8> = self.conn.buf.drain(..9 + len).collect();
                        let stream = u32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]) & 0x7fff_ffff;
                        return Some(Frame { kind: bytes[3], flags: bytes[4], stream, payload: bytes[9..].to_vec() });
                    }
                }
                match self.conn.fill().await {
                    Ok(0) | Err(_) => return None,
                    Ok(_) => {}
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("no frame and no close within {DEADLINE:?}"))?;
        match (read.kind, read.flags & ACK) {
            (GOAWAY, _) => self.goaway = true,
            (PING, 0) => {
                self.pings += 1;
                if self.polite {
                    let ack = frame(PING, ACK, 0, &read.payload);
                    let _ = self.conn.stream.write_all(&ack).await;
                }
            }
            (PING, _) => self.ping_acks += 1,
            (SETTINGS, 0) if self.polite => {
                let _ = self.conn.stream.write_all(&frame(SETTINGS, ACK, 0, &[])).await;
            }
            _ => {}
        }
        Some(read)
    }

    /// Sends a GET on `stream` and returns its response status once the
    /// response has ended.
    async fn get(&mut self, stream: u32, path: &str) -> u16 {
        self.send(&frame(HEADERS, END_HEADERS | END_STREAM, stream, &get_block(path))).await;
        self.response(stream).await
    }

    /// Reads frames until the response on `stream` ends; returns its status.
    async fn response(&mut self, stream: u32) -> u16 {
        let mut got = None;
        loop {
            let f = self.next().await.unwrap_or_else(|| panic!("closed before the response on stream {stream} ended"));
            if f.stream != stream {
                continue;
            }
            if f.kind == HEADERS && got.is_none() {
                got = Some(status(&f.payload).unwrap_or_else(|| panic!("no status in {:?}", f.payload)));
            }
            if matches!(f.kind, HEADERS | DATA) && f.flags & END_STREAM != 0 {
                return got.expect("a response ended before its head");
            }
        }
    }

    /// Reads (and, if polite, answers) frames until the server closes the
    /// connection, within [`DEADLINE`].
    async fn until_closed(&mut self) {
        let closed = tokio::time::timeout(DEADLINE, async { while self.next().await.is_some() {} }).await;
        assert!(closed.is_ok(), "the connection was still open after {DEADLINE:?}");
    }
}

// --- The first head, whatever the connection starts with -----------------------

#[tokio::test]
async fn a_connection_that_starts_like_the_http2_preface_and_stalls_is_closed_after_header_read_timeout() {
    let up = RecordingUpstream::start().await;
    let proxy = start(SLOW_HEAD, &route("objects", "/objects/", &up, "")).await;

    for opening in [
        // HTTP/1 after "PRI ": the reported way around the guard.
        &b"PRI "[..],
        b"PRI / HTTP/1.1\r\nHost: x\r\n",
        b"PRI * HTTP/1.1\r\nHost: x\r\n",
        // Part of the preface, then nothing.
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n",
    ] {
        let mut conn = Conn::open(proxy.addr).await;
        conn.send(opening).await;
        conn.assert_closed_silently().await;
    }
    assert!(up.seen().is_empty(), "a half head reached the upstream: {:?}", up.seen());

    // A complete request on a fresh connection is served as ever.
    let mut conn = Conn::open(proxy.addr).await;
    conn.send(b"GET /objects/none HTTP/1.1\r\nHost: x\r\n\r\n").await;
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        assert!(conn.fill().await.expect("read failed") > 0, "closed before a response");
        head = conn.buf.clone();
    }
    assert!(head.starts_with(b"HTTP/1.1 404"), "{:?}", String::from_utf8_lossy(&head));
}

#[tokio::test]
async fn an_http2_opening_that_stalls_is_closed_after_header_read_timeout() {
    let up = RecordingUpstream::start().await;
    let proxy = start(SLOW_HEAD, &route("objects", "/objects/", &up, "")).await;

    let settings = frame(SETTINGS, 0, 0, &[0, 0x3, 0, 0, 0, 100]);
    for opening in [
        // The preface and no SETTINGS.
        PREFACE.to_vec(),
        // Part of the SETTINGS frame's header.
        [PREFACE.as_slice(), &settings[..4]].concat(),
        // Its header, and part of its payload.
        [PREFACE.as_slice(), &settings[..12]].concat(),
    ] {
        let mut conn = Conn::open(proxy.addr).await;
        conn.send(&opening).await;
        // The server's own SETTINGS may come first; then the close.
        conn.until_closed().await;
    }
}

// --- Between requests: incomplete frames and header blocks ---------------------

#[tokio::test]
async fn an_http2_header_block_or_frame_left_incomplete_is_closed_after_header_read_timeout() {
    let up = RecordingUpstream::start().await;
    let proxy = start(SLOW_HEAD, &route("objects", "/objects/", &up, "")).await;

    let headers = frame(HEADERS, END_STREAM, 3, &get_block("/objects/none"));
    let continuation = frame(CONTINUATION, 0, 3, &[]);
    let ping = frame(PING, 0, 0, &[7; 8]);
    for (served_first, stall) in [
        // HEADERS without END_HEADERS, and no CONTINUATION ever.
        (false, headers.clone()),
        (true, headers.clone()),
        // A CONTINUATION that does not end the block either.
        (true, [&headers[..], &continuation].concat()),
        // A PING whose header arrived but not all its payload.
        (true, ping[..12].to_vec()),
        // Part of a frame header.
        (true, ping[..4].to_vec()),
    ] {
        // Rogue: after the stall it must send nothing, not even a SETTINGS ack.
        let mut h2 = H2::open(proxy.addr, false).await;
        if served_first {
            assert_eq!(h2.get(1, "/objects/none").await, 404);
        }
        h2.send(&stall).await;
        h2.until_closed().await;
        // Closed by the slow-head guard: at once, without a GOAWAY.
        assert!(!h2.goaway, "closed gracefully, not as a slow head");
    }
}

// --- Idle connections: the graceful close and its grace ------------------------

#[tokio::test]
async fn an_http2_client_that_ignores_goaway_and_ping_is_closed_after_the_grace() {
    let up = RecordingUpstream::start().await;
    let proxy = start(SHORT_IDLE, &route("objects", "/objects/", &up, "")).await;

    // It acknowledges nothing: not the SETTINGS, not the GOAWAY's PING.
    let mut rogue = H2::open(proxy.addr, false).await;
    assert_eq!(rogue.get(1, "/objects/none").await, 404);
    rogue.until_closed().await;
    assert!(rogue.goaway, "closed without a GOAWAY");
    assert!(rogue.pings > 0, "the graceful close sent no PING");

    // Same for one that never sent a request.
    let mut silent = H2::open(proxy.addr, false).await;
    silent.until_closed().await;
    assert!(silent.goaway, "closed without a GOAWAY");
}

#[tokio::test]
async fn a_polite_idle_http2_client_is_kept_until_idle_timeout() {
    let up = RecordingUpstream::start().await;
    let proxy =
        start("header_read_timeout = \"300ms\"\nidle_timeout = \"3s\"", &route("objects", "/objects/", &up, "")).await;

    let mut h2 = H2::open(proxy.addr, true).await;
    assert_eq!(h2.get(1, "/objects/none").await, 404);
    // Between requests, PINGs and WINDOW_UPDATEs for four times
    // header_read_timeout: each PING is answered, and nothing closes.
    let started = std::time::Instant::now();
    let mut sent = 0;
    while started.elapsed() < Duration::from_millis(1200) {
        h2.send(&[frame(PING, 0, 0, &[1; 8]), frame(WINDOW_UPDATE, 0, 0, &[0, 0, 0, 1])].concat()).await;
        sent += 1;
        while h2.ping_acks < sent {
            h2.next().await.expect("closed while the client was pinging");
        }
        assert!(!h2.goaway, "GOAWAY while the client was pinging");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Still a working connection.
    assert_eq!(h2.get(3, "/objects/none").await, 404);
    assert!(!h2.goaway);

    // Left idle, it gets GOAWAY, answers its PING, and the connection ends.
    h2.until_closed().await;
    assert!(h2.goaway, "closed without a GOAWAY");
}

// --- Slots -------------------------------------------------------------------------

#[tokio::test]
async fn slots_held_by_slow_or_silent_connections_are_freed() {
    let up = RecordingUpstream::start().await;
    let proxy = start(&format!("max_connections = 10\n{SHORT_IDLE}"), &route("objects", "/objects/", &up, "")).await;

    // Every slot taken by a connection that makes no progress, two of each kind.
    let mut raw = Vec::new();
    let mut h2s = Vec::new();
    for _ in 0..2 {
        for opening in [&b"PRI / HTTP/1.1\r\nHost: x\r\n"[..], PREFACE.as_slice()] {
            let mut conn = Conn::open(proxy.addr).await;
            conn.send(opening).await;
            raw.push(conn);
        }
        let mut partial_settings = Conn::open(proxy.addr).await;
        partial_settings.send(&[PREFACE.as_slice(), &frame(SETTINGS, 0, 0, &[0; 6])[..12]].concat()).await;
        raw.push(partial_settings);
        let mut open_block = H2::open(proxy.addr, false).await;
        open_block.send(&frame(HEADERS, END_STREAM, 1, &get_block("/objects/none"))).await;
        h2s.push(open_block);
        h2s.push(H2::open(proxy.addr, false).await);
    }

    // An eleventh connection waits for a slot, and is served once one frees.
    let mut next = H2::open(proxy.addr, true).await;
    assert_eq!(next.get(1, "/objects/none").await, 404);

    for conn in &mut raw {
        conn.until_closed().await;
    }
    for h2 in &mut h2s {
        h2.until_closed().await;
    }
}

// --- Shutdown ----------------------------------------------------------------------

#[tokio::test]
async fn at_shutdown_a_client_that_ignores_goaway_is_closed_once_its_request_is_answered() {
    let up = RecordingUpstream::start().await;
    // shutdown_grace far beyond the deadline: only the close grace can end
    // the rogue connections in time.
    let mut proxy = start(
        "header_read_timeout = \"300ms\"\nidle_timeout = \"60s\"\nshutdown_grace = \"60s\"",
        &route("objects", "/objects/", &up, ""),
    )
    .await;

    let mut idle = H2::open(proxy.addr, false).await;
    assert_eq!(idle.get(1, "/objects/none").await, 404);

    // A write the upstream takes 1.5 s over, longer than the close grace.
    let mut busy = H2::open(proxy.addr, false).await;
    let block = [
        &field(2, "PUT")[..],
        &[0x86],
        &field(4, "/objects/slow"),
        &field(1, "x"),
        &named_field("x-fencing-token", "1"),
        &named_field("x-slow-ms", "1500"),
        &named_field("content-length", "4"),
    ]
    .concat();
    busy.send(&[frame(HEADERS, END_HEADERS, 1, &block), frame(DATA, END_STREAM, 1, b"late")].concat()).await;
    let wait = tokio::time::timeout(DEADLINE, up.wait_in_flight("/objects/slow")).await;
    assert!(wait.is_ok(), "the write never reached the upstream");

    let stopped = proxy.shutdown();
    idle.until_closed().await;
    assert!(idle.goaway);
    // The request in flight is answered in full before its connection closes.
    assert_eq!(busy.response(1).await, 200);
    busy.until_closed().await;
    assert_eq!(up.object("/objects/slow").as_deref(), Some(&b"late"[..]));
    tokio::time::timeout(DEADLINE, stopped)
        .await
        .expect("shutdown still waiting for connections that ignore GOAWAY")
        .unwrap();
}

#[tokio::test]
async fn at_shutdown_a_request_that_outlasts_the_grace_is_cut() {
    let up = RecordingUpstream::start().await;
    let mut proxy = start("shutdown_grace = \"300ms\"", &route("objects", "/objects/", &up, "")).await;

    // A write the upstream would take a minute over.
    let mut conn = Conn::open(proxy.addr).await;
    conn.send(&common::raw::request("PUT", "/objects/slow", &[("x-fencing-token", "1"), ("x-slow-ms", "60000")], b"x"))
        .await;
    let wait = tokio::time::timeout(DEADLINE, up.wait_in_flight("/objects/slow")).await;
    assert!(wait.is_ok(), "the write never reached the upstream");

    let stopped = proxy.shutdown();
    conn.assert_closed_silently().await;
    tokio::time::timeout(DEADLINE, stopped).await.expect("shutdown waited past its grace").unwrap();
}

// --- The admin listener: the same bounds and drain -------------------------------

const ADMIN_TOKEN: &str = "admin-token-for-the-drain-test";

/// Like [`start`], with `[admin] auth_token` set to [`ADMIN_TOKEN`].
async fn start_with_admin_token(server: &str) -> Proxy {
    start_in_process(&format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nshutdown_grace = \"5s\"\n{server}\n\
         [admin]\nlisten = \"127.0.0.1:0\"\nauth_token = \"{ADMIN_TOKEN}\"\n\
         {MEMORY_STORE}\n[[route]]\nname = \"objects\"\nprefix = \"/objects/\"\nupstream = \"http://127.0.0.1:9\"\n"
    ))
    .await
}

#[tokio::test]
async fn the_admin_listener_closes_slow_heads_and_idle_connections() {
    let up = RecordingUpstream::start().await;
    let proxy = start(SHORT_IDLE, &route("objects", "/objects/", &up, "")).await;

    // A head that stops halfway: closed after header_read_timeout.
    let mut slow = Conn::open(proxy.admin).await;
    slow.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\n").await;
    // A connection that never sends a byte: closed after idle_timeout.
    let mut silent = Conn::open(proxy.admin).await;
    // One kept alive after a request: closed after idle_timeout too.
    let mut kept = Conn::open(proxy.admin).await;
    kept.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert_eq!(kept.response().await.status, 200);

    slow.assert_closed_silently().await;
    silent.assert_closed_silently().await;
    kept.assert_closed_silently().await;
}

#[tokio::test]
async fn the_admin_listener_refuses_an_oversized_head_with_431() {
    let up = RecordingUpstream::start().await;
    let proxy = start("max_header_bytes = \"8KiB\"", &route("objects", "/objects/", &up, "")).await;
    let mut conn = Conn::open(proxy.admin).await;
    conn.send(format!("GET /healthz HTTP/1.1\r\nHost: x\r\nx-padding: {}\r\n\r\n", "p".repeat(10_000)).as_bytes())
        .await;
    assert_eq!(conn.response().await.status, 431);
}

#[tokio::test]
async fn the_admin_listener_has_a_connection_limit_of_its_own() {
    let up = RecordingUpstream::start().await;
    // idle_timeout far beyond the deadline: silent connections keep their
    // slots. Two slots on each listener, each its own field.
    let proxy = start_in_process(&format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nshutdown_grace = \"5s\"\nmax_connections = 2\n{SLOW_HEAD}\n\
         [admin]\nlisten = \"127.0.0.1:0\"\nmax_connections = 2\n\
         {MEMORY_STORE}\n{}",
        route("objects", "/objects/", &up, "")
    ))
    .await;
    let healthz = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";

    // The proxy's slots taken: the admin listener still answers.
    let proxy_held = [Conn::open(proxy.addr).await, Conn::open(proxy.addr).await];
    let mut probe = Conn::open(proxy.admin).await;
    probe.send(healthz).await;
    assert_eq!(probe.response().await.status, 200);
    drop(probe);
    drop(proxy_held);

    // The admin listener's slots taken: the next admin connection waits in
    // the backlog, unanswered, and is served once a slot frees.
    let mut admin_held = vec![Conn::open(proxy.admin).await, Conn::open(proxy.admin).await];
    let mut waiting = Conn::open(proxy.admin).await;
    waiting.send(healthz).await;
    waiting.assert_silent_for(Duration::from_millis(500)).await;
    // Meanwhile the proxy listener has slots of its own.
    let mut conn = Conn::open(proxy.addr).await;
    conn.send(b"GET /objects/none HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert_eq!(conn.response().await.status, 404);

    admin_held.pop();
    assert_eq!(waiting.response().await.status, 200);
}

#[tokio::test]
async fn at_shutdown_an_admin_request_in_flight_finishes() {
    let mut proxy = start_with_admin_token("").await;

    // A fence change whose body is still on its way; the 100 Continue says
    // the admin API has started reading it.
    let mut conn = Conn::open(proxy.admin).await;
    conn.send(
        format!(
            "PUT /fences?key=/objects/a HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ADMIN_TOKEN}\r\n\
             Content-Type: application/json\r\nContent-Length: 13\r\nExpect: 100-continue\r\n\r\n"
        )
        .as_bytes(),
    )
    .await;
    let continued = conn.fill_until(b"\r\n\r\n").await.expect("no 100 Continue");
    assert!(conn.take(continued).starts_with(b"HTTP/1.1 100"));
    conn.send(b"{\"token\": ").await;

    let mut stopped = proxy.shutdown();
    // The admin listener closes once the proxy has drained...
    let started = std::time::Instant::now();
    while tokio::net::TcpStream::connect(proxy.admin).await.is_ok() {
        assert!(started.elapsed() < DEADLINE, "the admin listener still accepts after shutdown");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // ...and shutdown waits for the request in flight.
    let early = tokio::time::timeout(Duration::from_millis(300), &mut stopped).await;
    assert!(early.is_err(), "shutdown ended with an admin request in flight");

    conn.send(b"42}").await;
    let reply = conn.response().await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    conn.until_closed().await;
    tokio::time::timeout(DEADLINE, stopped).await.expect("shutdown did not end after the admin request").unwrap();
}

// --- Resting -------------------------------------------------------------------

/// One worker, so every client connection shares its spare upstream
/// connections; both timeouts long enough that no guard closes anything.
const ONE_WORKER: &str = "workers = 1\nheader_read_timeout = \"10s\"\nidle_timeout = \"60s\"";

fn put(path: &str, token: u64, body: &str) -> Vec<u8> {
    common::raw::RawRequest::new("PUT", path).token(token).body(body).keep_alive().bytes()
}

/// An idle HTTP/1.1 connection rests (hyper's buffers freed, its upstream
/// connection handed to the worker), and its next request starts it again:
/// the same upstream connection serves it.
#[tokio::test]
async fn an_idle_http1_connection_rests_and_serves_its_next_request() {
    let upstream = RecordingUpstream::start().await;
    let proxy = start(ONE_WORKER, &route("objects", "/", &upstream, "")).await;
    let mut conn = Conn::open(proxy.addr).await;
    conn.send(&put("/a", 1, "one")).await;
    assert_eq!(conn.response().await.status, 200);
    proxy.wait_metric("fencegate_resting_connections", 1.0).await;

    conn.send(&put("/a", 2, "two")).await;
    assert_eq!(conn.response().await.status, 200);
    assert_eq!(proxy.metric("fencegate_resting_connections").await, Some(0.0));
    assert_eq!(upstream.object("/a").as_deref(), Some(&b"two"[..]));
    assert_eq!(upstream.connections(), 1, "the rested upstream connection served the next request");

    // It rests again after each idle spell.
    proxy.wait_metric("fencegate_resting_connections", 1.0).await;
    conn.send(&put("/a", 3, "three")).await;
    assert_eq!(conn.response().await.status, 200);
    assert_eq!(upstream.object("/a").as_deref(), Some(&b"three"[..]));
}

/// Clients that come one after another don't each cost the upstream a
/// connection: an HTTP/1.1 client's upstream connection goes back to its
/// worker when the response ends, for any client of that worker.
#[tokio::test]
async fn clients_one_after_another_share_the_upstream_connection() {
    let upstream = RecordingUpstream::start().await;
    let proxy = start(ONE_WORKER, &route("objects", "/", &upstream, "")).await;
    let mut clients = Vec::new();
    for path in ["/a", "/b", "/c"] {
        let mut conn = Conn::open(proxy.addr).await;
        conn.send(&put(path, 1, "x")).await;
        assert_eq!(conn.response().await.status, 200);
        // Still connected, not resting yet.
        clients.push(conn);
    }
    assert_eq!(upstream.connections(), 1);
    // So do clients that have rested.
    proxy.wait_metric("fencegate_resting_connections", 3.0).await;
    for (conn, path) in clients.iter_mut().zip(["/a", "/b", "/c"]) {
        conn.send(&put(path, 2, "y")).await;
        assert_eq!(conn.response().await.status, 200);
    }
    assert_eq!(upstream.connections(), 1);
}

/// A pipelined request whose head was half read when the connection rested
/// is read again from its first byte, whole.
#[tokio::test]
async fn a_head_half_read_when_the_connection_rests_is_read_whole() {
    let upstream = RecordingUpstream::start().await;
    let proxy = start(ONE_WORKER, &route("objects", "/", &upstream, "")).await;
    let mut conn = Conn::open(proxy.addr).await;
    let second = put("/b", 1, "second");
    let (early, late) = second.split_at(20);
    let mut first = put("/a", 1, "first");
    first.extend_from_slice(early);
    conn.send(&first).await;
    assert_eq!(conn.response().await.status, 200);
    // Long enough for the rest (REST_AFTER, 1 s); the half head keeps the
    // connection from waiting bare, so the gauge can't tell.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    conn.send(late).await;
    assert_eq!(conn.response().await.status, 200);
    assert_eq!(upstream.object("/b").as_deref(), Some(&b"second"[..]));
}

/// HTTP/2 connections don't rest: they have no idle state to give back that
/// hyper would let go of, and keep serving.
#[tokio::test]
async fn an_idle_http2_connection_keeps_serving_without_resting() {
    let upstream = RecordingUpstream::start().await;
    let proxy = start(ONE_WORKER, &route("objects", "/", &upstream, "")).await;
    let mut h2 = H2::open(proxy.addr, true).await;
    assert_eq!(h2.get(1, "/echo").await, 200);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(proxy.metric("fencegate_resting_connections").await, Some(0.0));
    assert_eq!(h2.get(3, "/echo").await, 200);
}

/// Once connections rest, their worker asks the allocator to give back what
/// they freed (the binary sets mimalloc's collection here).
#[tokio::test]
async fn a_worker_gives_memory_back_after_its_connections_rest() {
    static GIVEN_BACK: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    fencegate::give_back_memory_with(|| {
        GIVEN_BACK.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    });
    let upstream = RecordingUpstream::start().await;
    let proxy = start(ONE_WORKER, &route("objects", "/", &upstream, "")).await;
    let before = GIVEN_BACK.load(std::sync::atomic::Ordering::SeqCst);
    let mut conn = Conn::open(proxy.addr).await;
    conn.send(&put("/a", 1, "one")).await;
    assert_eq!(conn.response().await.status, 200);
    proxy.wait_metric("fencegate_resting_connections", 1.0).await;
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while GIVEN_BACK.load(std::sync::atomic::Ordering::SeqCst) == before {
        assert!(tokio::time::Instant::now() < deadline, "no give-back within {DEADLINE:?} of the rest");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A request body streamed to the upstream (here an unfenced write on a route
/// that allows a missing token) ends at its declared length: the upstream
/// reads no further, and the connection still rests after it.
#[tokio::test]
async fn a_connection_rests_after_a_body_streamed_with_its_length() {
    let upstream = RecordingUpstream::start().await;
    let proxy = start(ONE_WORKER, &route("open", "/", &upstream, "missing_token = \"allow\"")).await;
    let mut conn = Conn::open(proxy.addr).await;
    let request = common::raw::RawRequest::new("PUT", "/a").body("streamed").keep_alive();
    conn.send(&request.bytes()).await;
    assert_eq!(conn.response().await.status, 200);
    assert_eq!(upstream.object("/a").as_deref(), Some(&b"streamed"[..]));
    proxy.wait_metric("fencegate_resting_connections", 1.0).await;
}

/// A connection that sends the start of the HTTP/2 preface and stops
/// sending is read as the HTTP/1 request it can only be: 400, as hyper
/// answers a head cut short.
#[tokio::test]
async fn the_start_of_the_preface_then_the_end_of_input_gets_400() {
    let upstream = RecordingUpstream::start().await;
    let proxy = start(ONE_WORKER, &route("objects", "/", &upstream, "")).await;
    let mut conn = Conn::open(proxy.addr).await;
    conn.send(&PREFACE[..18]).await;
    conn.stream.shutdown().await.unwrap();
    assert_eq!(conn.response().await.status, 400);
}
