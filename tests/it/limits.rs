//! Limits against hostile or broken clients, each exercised over a raw TCP
//! socket: a request head that never completes (slowloris), connections that
//! sit idle, an oversized head (431), oversized bodies (413) and the
//! `max_connections` cap. The last tests are regressions for bugs these tests
//! found: a stalled fenced upload held its connection forever, and the
//! slow-head guard missed heads that began on a quiet connection and cut
//! HTTP/2 connections (those use hyper's HTTP/2 client, not raw bytes).
//!
//! Timeouts here are short (300 ms) so the file stays fast; every wait for
//! something that should happen has a generous deadline, and nothing asserts
//! how fast it happened. Waits that assert an absence (no response yet) and
//! pauses that let a connection go quiet are the only fixed sleeps.

use crate::common;

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use common::process::{start_in_process, MEMORY_STORE};
use common::raw::{chunked, pattern, request, send_parts, Conn};
use common::*;

/// Longest wait for something that should happen: generous, it only matters
/// when a test fails.
const DEADLINE: Duration = Duration::from_secs(10);

/// Starts fencegate on ephemeral ports with `server` as extra `[server]` lines.
async fn start(server: &str, routes: &str) -> Proxy {
    start_in_process(&format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nshutdown_grace = \"5s\"\n{server}\n\
         [admin]\nlisten = \"127.0.0.1:0\"\n\
         {MEMORY_STORE}\n{routes}"
    ))
    .await
}

/// The key's mark according to the fence API (`None`: no mark).
async fn mark(proxy: &Proxy, key: &str) -> Option<u64> {
    let key: String = form_urlencoded::byte_serialize(key.as_bytes()).collect();
    let reply = get(&proxy.admin_url(&format!("/fences?key={key}"))).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    reply.json()["token"].as_u64()
}

// --- Request heads: header_read_timeout ---------------------------------------

/// A short `header_read_timeout`, and an `idle_timeout` far beyond the test's
/// deadline: only the slow-head guard can close the connection in time, and it
/// closes abruptly, with no response.
const SLOW_HEAD: &str = "header_read_timeout = \"300ms\"\nidle_timeout = \"60s\"";

#[tokio::test]
async fn a_request_head_that_never_completes_is_closed_without_a_response() {
    let up = RecordingUpstream::start().await;
    let proxy = start(SLOW_HEAD, &route("objects", "/objects/", &up, "")).await;

    let mut slow = Conn::open(proxy.addr).await;
    slow.send(b"PUT /objects/a HTTP/1.1\r\nHost: x\r\n").await;
    slow.assert_closed_silently().await;
    assert!(up.seen().is_empty(), "a half head reached the upstream: {:?}", up.seen());

    // The server is fine: a complete request on a fresh connection goes through.
    let mut conn = Conn::open(proxy.addr).await;
    conn.send(&request("PUT", "/objects/a", &[("X-Fencing-Token", "1")], b"ok")).await;
    let resp = conn.response().await;
    assert_eq!(resp.status, 200, "{resp:?}");
    assert_eq!(up.object("/objects/a").as_deref(), Some(&b"ok"[..]));
}

#[tokio::test]
async fn a_head_trickled_byte_by_byte_is_closed_too() {
    let up = RecordingUpstream::start().await;
    let proxy = start(SLOW_HEAD, &route("objects", "/objects/", &up, "")).await;

    // Every byte is progress, but the head as a whole must arrive in time: the
    // timer starts at its first byte and is not reset by later ones.
    let stream = TcpStream::connect(proxy.addr).await.unwrap();
    stream.set_nodelay(true).unwrap();
    let (mut read, mut write) = stream.into_split();
    let trickle = tokio::spawn(async move {
        let head = b"PUT /objects/a HTTP/1.1\r\nHost: x\r\nX-Padding: ".iter().chain([b'a'; 10_000].iter());
        for byte in head {
            if write.write_all(&[*byte]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    let mut got = Vec::new();
    let closed = tokio::time::timeout(DEADLINE, read.read_to_end(&mut got)).await;
    trickle.abort();
    let closed = closed.unwrap_or_else(|_| panic!("a trickled head kept its connection for {DEADLINE:?}"));
    if let Err(e) = closed {
        assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}");
    }
    assert!(got.is_empty(), "expected no response, got {:?}", String::from_utf8_lossy(&got));
    assert!(up.seen().is_empty());
}

#[tokio::test]
async fn a_head_started_on_a_quiet_connection_is_closed_after_header_read_timeout() {
    let up = RecordingUpstream::start().await;
    // idle_timeout is far beyond the deadline: only header_read_timeout can close in time.
    let proxy =
        start("header_read_timeout = \"300ms\"\nidle_timeout = \"60s\"", &route("objects", "/objects/", &up, "")).await;

    // A fresh connection that stays quiet a moment (as any real client's first
    // bytes take a network round trip), then starts a head and stalls.
    let mut fresh = Conn::open(proxy.addr).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    fresh.send(b"PUT /objects/a HTTP/1.1\r\nHost: x\r\n").await;
    fresh.assert_closed_silently().await;

    // A keep-alive connection: one request served, a pause, then a stalled head.
    let mut reused = Conn::open(proxy.addr).await;
    reused.send(&request("PUT", "/objects/a", &[("X-Fencing-Token", "1")], b"ok")).await;
    assert_eq!(reused.response().await.status, 200);
    tokio::time::sleep(Duration::from_millis(500)).await;
    reused.send(b"PUT /objects/a HTTP/1.1\r\nHost: x\r\n").await;
    reused.assert_closed_silently().await;
}

// --- Idle connections: idle_timeout -------------------------------------------

#[tokio::test]
async fn a_connection_that_sends_nothing_is_closed_when_idle() {
    let up = RecordingUpstream::start().await;
    // header_read_timeout is far beyond the deadline: only idle_timeout can close it.
    let proxy =
        start("idle_timeout = \"300ms\"\nheader_read_timeout = \"60s\"", &route("objects", "/objects/", &up, "")).await;

    let mut conn = Conn::open(proxy.addr).await;
    conn.assert_closed_silently().await;
}

#[tokio::test]
async fn a_keep_alive_connection_is_closed_after_idle_timeout() {
    let up = RecordingUpstream::start().await;
    let proxy =
        start("idle_timeout = \"300ms\"\nheader_read_timeout = \"60s\"", &route("objects", "/objects/", &up, "")).await;

    let mut conn = Conn::open(proxy.addr).await;
    conn.send(&request("PUT", "/objects/k", &[("X-Fencing-Token", "1")], b"v")).await;
    let resp = conn.response().await;
    assert_eq!(resp.status, 200, "{resp:?}");
    // Keep-alive: a second request on the same connection is still served...
    conn.send(&request("GET", "/objects/k", &[], b"")).await;
    let resp = conn.response().await;
    assert_eq!((resp.status, &resp.body[..]), (200, &b"v"[..]), "{resp:?}");
    assert_ne!(resp.header("connection"), Some("close"));
    // ...then the connection sits idle and is closed.
    conn.assert_closed_silently().await;
}

#[tokio::test]
async fn a_request_in_flight_outlives_both_timeouts() {
    let up = RecordingUpstream::start().await;
    let proxy =
        start("idle_timeout = \"300ms\"\nheader_read_timeout = \"300ms\"", &route("objects", "/objects/", &up, ""))
            .await;

    // The upstream takes 1 s, longer than either timeout: the connection is
    // serving a request, so neither guard may close it.
    let mut conn = Conn::open(proxy.addr).await;
    conn.send(&request("PUT", "/objects/slow", &[("X-Fencing-Token", "1"), ("x-slow-ms", "1000")], b"late")).await;
    let resp = conn.response().await;
    assert_eq!(resp.status, 200, "{resp:?}");
    assert_eq!(up.object("/objects/slow").as_deref(), Some(&b"late"[..]));
    // Afterwards it is an idle connection like any other.
    conn.assert_closed_silently().await;
}

// --- Request head size: max_header_bytes --------------------------------------

#[tokio::test]
async fn an_oversized_request_head_gets_431_and_reaches_nothing() {
    let up = RecordingUpstream::start().await;
    let proxy = start("max_header_bytes = \"8KiB\"", &route("objects", "/objects/", &up, "")).await;

    let big = "a".repeat(20 * 1024);
    let mut conn = Conn::open(proxy.addr).await;
    // fencegate may stop reading (and close) before all of it is written.
    let _ =
        conn.stream.write_all(&request("PUT", "/objects/h", &[("X-Fencing-Token", "1"), ("X-Big", &big)], b"")).await;
    let resp = conn.response().await;
    assert_eq!(resp.status, 431, "{resp:?}");
    // HTTP/1.1 cannot go on after a head it did not read: the connection closes.
    conn.assert_closed_silently().await;
    assert!(up.seen().is_empty(), "an oversized head reached the upstream");
    assert_eq!(mark(&proxy, "/objects/h").await, None);

    // A head under the limit is fine.
    let fits = "a".repeat(4 * 1024);
    let mut conn = Conn::open(proxy.addr).await;
    conn.send(&request("PUT", "/objects/h", &[("X-Fencing-Token", "1"), ("X-Big", &fits)], b"")).await;
    let resp = conn.response().await;
    assert_eq!(resp.status, 200, "{resp:?}");
}

// --- Request bodies: route max_body -------------------------------------------

const ONE_KIB_ROUTE: &str = "max_body = \"1KiB\"";
/// Route lines that make POST an unfenced method allowed a body.
const POST_UNFENCED: &str = "safe_methods = [\"GET\", \"POST\"]\nallow_safe_body = true";

#[tokio::test]
async fn a_declared_oversized_body_gets_413_before_it_is_read() {
    let up = RecordingUpstream::start().await;
    let proxy = start("", &route("objects", "/objects/", &up, ONE_KIB_ROUTE)).await;

    let mut conn = Conn::open(proxy.addr).await;
    let _ = conn.stream.write_all(&request("PUT", "/objects/a", &[("X-Fencing-Token", "5")], &pattern(2048))).await;
    conn.response().await.assert_body_too_large();
    assert!(up.seen().is_empty(), "a refused body reached the upstream");
    // The head decides first: a request it condemns (here, no token) gets its
    // answer (428) whatever its body, which is never read.
    let mut conn = Conn::open(proxy.addr).await;
    let _ = conn.stream.write_all(&request("PUT", "/objects/a", &[], &pattern(2048))).await;
    assert_eq!(conn.response().await.status, 428);
    assert!(up.seen().is_empty(), "a refused body reached the upstream");

    // Refused on its declared length alone: a head whose body never comes
    // gets its 413 at once, not after the route's timeout.
    let mut conn = Conn::open(proxy.addr).await;
    let head = "PUT /objects/a HTTP/1.1\r\nHost: x\r\nX-Fencing-Token: 5\r\nContent-Length: 2048\r\n\r\n";
    let _ = conn.stream.write_all(head.as_bytes()).await;
    let answered = tokio::time::timeout(std::time::Duration::from_secs(2), conn.response()).await;
    answered.expect("no answer to a declared oversized body before it came").assert_body_too_large();
    assert!(up.seen().is_empty(), "a refused body reached the upstream");

    // The mark did not move: a lower token still passes.
    assert_eq!(mark(&proxy, "/objects/a").await, None);
    let reply = put(&proxy.url("/objects/a"), 3, "small").await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(mark(&proxy, "/objects/a").await, Some(3));

    // Exactly the limit is allowed.
    let mut conn = Conn::open(proxy.addr).await;
    conn.send(&request("PUT", "/objects/a", &[("X-Fencing-Token", "3")], &pattern(1024))).await;
    let resp = conn.response().await;
    assert_eq!(resp.status, 200, "{resp:?}");
    assert_eq!(up.object("/objects/a").map(|b| b.len()), Some(1024));
    assert_eq!(proxy.metric(r#"fencegate_requests_total{route="objects",outcome="body_too_large"}"#).await, Some(2.0));
    assert_eq!(proxy.metric(r#"fencegate_requests_total{route="objects",outcome="missing_token"}"#).await, Some(1.0));
}

#[tokio::test]
async fn an_oversized_chunked_fenced_body_gets_413_and_nothing_is_forwarded() {
    let up = RecordingUpstream::start().await;
    let proxy = start("", &route("objects", "/objects/", &up, ONE_KIB_ROUTE)).await;

    // 2 KiB in eight chunks, no Content-Length: the size is only known by reading.
    let body = pattern(2048);
    let chunks: Vec<&[u8]> = body.chunks(256).collect();
    let mut conn = Conn::open(proxy.addr).await;
    send_parts(&mut conn, &chunked("PUT", "/objects/c", &[("X-Fencing-Token", "7")], &chunks)).await;
    conn.response().await.assert_body_too_large();

    // No partial write: the upstream saw nothing at all, and the mark is unchanged.
    assert!(up.seen().is_empty(), "part of a refused fenced body reached the upstream: {:?}", up.seen());
    assert_eq!(up.object("/objects/c"), None);
    assert_eq!(mark(&proxy, "/objects/c").await, None);
    let reply = put(&proxy.url("/objects/c"), 1, "small").await;
    assert_eq!(reply.status, 200, "{}", reply.text());
}

#[tokio::test]
async fn a_chunked_fenced_body_under_the_limit_is_forwarded_whole() {
    let up = RecordingUpstream::start().await;
    let proxy = start("", &route("objects", "/objects/", &up, ONE_KIB_ROUTE)).await;

    for (key, len, chunk) in [("/objects/d", 900, 100), ("/objects/exact", 1024, 300)] {
        let body = pattern(len);
        let chunks: Vec<&[u8]> = body.chunks(chunk).collect();
        let mut conn = Conn::open(proxy.addr).await;
        send_parts(&mut conn, &chunked("PUT", key, &[("X-Fencing-Token", "2")], &chunks)).await;
        let resp = conn.response().await;
        assert_eq!(resp.status, 200, "{key}: {resp:?}");
        assert_eq!(resp.json()["len"], len, "{key}");
        assert_eq!(up.object(key).as_deref(), Some(&body[..]), "{key}: the upstream did not get the body intact");
        let applied = up.applied_for(key);
        assert_eq!(applied.len(), 1, "{key}: {applied:?}");
        assert_eq!(applied[0].body_len, len);
        assert_eq!(mark(&proxy, key).await, Some(2));
    }
}

#[tokio::test]
async fn an_unfenced_chunked_body_over_the_limit_is_cut_off_with_413() {
    let up = RecordingUpstream::start().await;
    let proxy = start("", &route("objects", "/objects/", &up, &format!("{ONE_KIB_ROUTE}\n{POST_UNFENCED}"))).await;

    // Unfenced bodies stream to the upstream as they arrive; past the limit the
    // upstream request is aborted, and the client gets 413 (the response can still
    // be sent: the client's connection is intact).
    let body = pattern(4096);
    let chunks: Vec<&[u8]> = body.chunks(512).collect();
    let mut conn = Conn::open(proxy.addr).await;
    send_parts(&mut conn, &chunked("POST", "/objects/u", &[], &chunks)).await;
    conn.response().await.assert_body_too_large();

    // The upstream may have seen the start of the request, but never applied it.
    assert!(up.applied().is_empty(), "{:?}", up.applied());
    assert_eq!(up.object("/objects/u"), None);
    // Under the limit, the same request goes through.
    let small = pattern(1000);
    let chunks: Vec<&[u8]> = small.chunks(250).collect();
    let mut conn = Conn::open(proxy.addr).await;
    send_parts(&mut conn, &chunked("POST", "/objects/u", &[], &chunks)).await;
    let resp = conn.response().await;
    assert_eq!(resp.status, 200, "{resp:?}");
    assert_eq!(up.object("/objects/u").as_deref(), Some(&small[..]));
}

// --- Connections: max_connections ---------------------------------------------

#[tokio::test]
async fn at_max_connections_a_new_connection_waits_in_the_backlog() {
    let up = RecordingUpstream::start().await;
    let proxy = start(
        "max_connections = 2\nidle_timeout = \"60s\"\nheader_read_timeout = \"60s\"",
        &route("objects", "/objects/", &up, ""),
    )
    .await;

    // Two connections, each served once and then held open, idle.
    let mut held = Vec::new();
    for key in ["/objects/one", "/objects/two"] {
        let mut conn = Conn::open(proxy.addr).await;
        conn.send(&request("PUT", key, &[("X-Fencing-Token", "1")], b"held")).await;
        let resp = conn.response().await;
        assert_eq!(resp.status, 200, "{resp:?}");
        held.push(conn);
    }

    // A third connects (the kernel's backlog takes it) but is not served.
    let mut third = Conn::open(proxy.addr).await;
    third.send(&request("PUT", "/objects/three", &[("X-Fencing-Token", "1")], b"waited")).await;
    third.assert_silent_for(Duration::from_millis(300)).await;
    assert!(up.object("/objects/three").is_none());

    // Closing one of the two frees a slot, and the third is served.
    drop(held.remove(0));
    let resp = third.response().await;
    assert_eq!(resp.status, 200, "{resp:?}");
    assert_eq!(up.object("/objects/three").as_deref(), Some(&b"waited"[..]));

    // The other held connection was never disturbed.
    held[0].send(&request("GET", "/objects/two", &[], b"")).await;
    let resp = held[0].response().await;
    assert_eq!((resp.status, &resp.body[..]), (200, &b"held"[..]), "{resp:?}");
}

#[tokio::test]
async fn an_upgraded_connection_leaves_the_count_and_the_guards() {
    let up = RecordingUpstream::start().await;
    let proxy = start(
        "max_connections = 1\nidle_timeout = \"300ms\"\nheader_read_timeout = \"300ms\"",
        &route("objects", "/objects/", &up, "unfenced_tunnels = true"),
    )
    .await;

    // The only connection slot switches protocols (the upstream echoes bytes).
    let mut upgraded = Conn::open(proxy.addr).await;
    upgraded.send(b"GET /objects/ws HTTP/1.1\r\nHost: x\r\nConnection: upgrade\r\nUpgrade: echo\r\n\r\n").await;
    assert_eq!(upgraded.response().await.status, 101);
    upgraded.send(b"ping").await;
    upgraded.fill_to(4).await.unwrap();
    assert_eq!(upgraded.take(4), b"ping");

    // It no longer counts: another connection is served while it is open.
    let mut other = Conn::open(proxy.addr).await;
    other.send(&request("GET", "/objects/none", &[], b"")).await;
    assert_eq!(other.response().await.status, 404);

    // Nor is it idle-closed: it is the two ends' business now.
    tokio::time::sleep(Duration::from_millis(800)).await;
    upgraded.send(b"pong").await;
    upgraded.fill_to(4).await.unwrap();
    assert_eq!(upgraded.take(4), b"pong");
}

// --- Bugs these tests found, kept as regressions ------------------------------

#[tokio::test]
async fn a_stalled_fenced_chunked_body_does_not_hold_its_connection_forever() {
    let up = RecordingUpstream::start().await;
    // Every timeout fencegate has is short, and the deadline is far beyond them.
    let proxy = start(
        "idle_timeout = \"300ms\"\nheader_read_timeout = \"300ms\"",
        &route("objects", "/objects/", &up, "timeout = \"500ms\"\nqueue_timeout = \"500ms\""),
    )
    .await;

    let mut conn = Conn::open(proxy.addr).await;
    let parts = chunked("PUT", "/objects/stalled", &[("X-Fencing-Token", "1")], &[b"first chunk"]);
    // The head and one chunk, then nothing: no more chunks, no final chunk.
    send_parts(&mut conn, &parts[..2]).await;
    // The route's timeout bounds the upload: 408, instead of waiting forever.
    let resp = conn.response().await;
    assert_eq!(resp.status, 408, "{resp:?}");
    assert_eq!(resp.header("content-type"), Some("application/problem+json"));
    assert_eq!(resp.json()["type"], "urn:fencegate:problem:body-timeout", "{resp:?}");
    assert!(up.seen().is_empty(), "part of a stalled fenced body reached the upstream");
    assert_eq!(mark(&proxy, "/objects/stalled").await, None);
}

/// A fenced body that keeps trickling in (a byte every 100 ms) is bounded
/// by the route's timeout from the read's first wait, not from its last
/// byte: the 408 comes while the client is still sending.
#[tokio::test]
async fn a_trickling_fenced_body_is_refused_at_the_route_timeout() {
    let up = RecordingUpstream::start().await;
    let proxy = start(
        "idle_timeout = \"30s\"\nheader_read_timeout = \"30s\"",
        &route("objects", "/objects/", &up, "timeout = \"500ms\"\nqueue_timeout = \"500ms\""),
    )
    .await;
    let stream = TcpStream::connect(proxy.addr).await.unwrap();
    let (mut read, mut write) = stream.into_split();
    let head =
        "PUT /objects/trickle HTTP/1.1\r\nHost: store\r\nX-Fencing-Token: 1\r\nTransfer-Encoding: chunked\r\n\r\n";
    write.write_all(head.as_bytes()).await.unwrap();
    // Six seconds of one-byte chunks: twelve times the route's timeout.
    let trickle = tokio::spawn(async move {
        for _ in 0..60 {
            if write.write_all(b"1\r\nx\r\n").await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = read.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed without an answer");
        answer.extend_from_slice(&buf[..n]);
    }
    assert!(!trickle.is_finished(), "the answer waited for the trickle to end");
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(up.seen().is_empty(), "part of a trickling fenced body reached the upstream");
    assert_eq!(mark(&proxy, "/objects/trickle").await, None);
    trickle.abort();
}

/// An HTTP/2 (h2c) connection to `addr` with hyper's client, its driver spawned.
async fn h2_connect(
    addr: SocketAddr,
    pings: bool,
) -> (
    hyper::client::conn::http2::SendRequest<http_body_util::Empty<bytes::Bytes>>,
    tokio::task::JoinHandle<Result<(), hyper::Error>>,
) {
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    let stream = TcpStream::connect(addr).await.unwrap();
    let mut builder = hyper::client::conn::http2::Builder::new(TokioExecutor::new());
    builder.timer(TokioTimer::new());
    if pings {
        builder.keep_alive_interval(Duration::from_millis(100)).keep_alive_while_idle(true);
    }
    let (sender, conn) = builder.handshake(TokioIo::new(stream)).await.unwrap();
    (sender, tokio::spawn(conn))
}

fn h2_get(proxy: &Proxy, path: &str) -> http::Request<http_body_util::Empty<bytes::Bytes>> {
    http::Request::get(proxy.url(path)).body(http_body_util::Empty::new()).unwrap()
}

#[tokio::test]
async fn an_http2_download_outlasting_both_timeouts_completes() {
    use http_body_util::BodyExt;
    let up = RecordingUpstream::start().await;
    let proxy = start(
        "header_read_timeout = \"300ms\"\nidle_timeout = \"1s\"",
        &route("objects", "/objects/", &up, "max_body = \"64MiB\""),
    )
    .await;
    let big = pattern(4 << 20);
    let mut conn = Conn::open(proxy.addr).await;
    conn.send(&request("PUT", "/objects/big", &[("X-Fencing-Token", "1")], &big)).await;
    assert_eq!(conn.response().await.status, 200);

    // Read the 4 MiB slowly: it takes longer than either timeout. A response
    // being sent is the connection's work, like a request being read.
    let (mut sender, _conn) = h2_connect(proxy.addr, false).await;
    let resp = sender.send_request(h2_get(&proxy, "/objects/big")).await.unwrap();
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let mut got = 0;
    while let Some(frame) = tokio::time::timeout(DEADLINE, body.frame()).await.expect("body stalled") {
        let frame = frame.unwrap_or_else(|e| panic!("download cut after {got} bytes: {e:?}"));
        got += frame.data_ref().map_or(0, |d| d.len());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(got, big.len());
}

#[tokio::test]
async fn an_idle_http2_connection_is_not_dropped_by_the_slow_head_guard() {
    let up = RecordingUpstream::start().await;
    let proxy =
        start("header_read_timeout = \"300ms\"\nidle_timeout = \"1s\"", &route("objects", "/objects/", &up, "")).await;
    let (mut sender, conn) = h2_connect(proxy.addr, true).await;
    let resp = sender.send_request(h2_get(&proxy, "/objects/none")).await.unwrap();
    assert_eq!(resp.status(), 404);
    // Past idle_timeout the connection may close, but gracefully (GOAWAY, then a
    // clean end): never dropped with an I/O error.
    match tokio::time::timeout(Duration::from_secs(3), conn).await {
        Err(_) => {}         // still open
        Ok(Ok(Ok(()))) => {} // closed gracefully
        Ok(Ok(Err(e))) => panic!("the idle HTTP/2 connection was dropped: {e:?}"),
        Ok(Err(e)) => panic!("{e}"),
    }
}

// --- Fenced bodies: max_buffered_bytes and stream_body -------------------------

/// A budget of 8 KiB for every fenced body held at once, and bodies up to it.
const SMALL_BUDGET: &str = "max_buffered_bytes = \"8KiB\"";
const EIGHT_KIB_ROUTE: &str = "max_body = \"8KiB\"\ntimeout = \"30s\"";

#[tokio::test]
async fn fenced_bodies_held_at_once_are_bounded_by_max_buffered_bytes() {
    let up = RecordingUpstream::start().await;
    let proxy = start(SMALL_BUDGET, &route("objects", "/objects/", &up, EIGHT_KIB_ROUTE)).await;

    // A declared 6 KiB body takes 6 KiB of the budget as soon as its head
    // passes: the client sends the head alone, not a byte of the body.
    let body = pattern(6 * 1024);
    let mut holder = Conn::open(proxy.addr).await;
    let whole = request("PUT", "/objects/held", &[("X-Fencing-Token", "1")], &body);
    let head_len = whole.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    holder.stream.write_all(&whole[..head_len]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;

    // Another 4 KiB, declared or chunked, would go over: 503 with Retry-After,
    // nothing forwarded, and the mark untouched.
    let mut conn = Conn::open(proxy.addr).await;
    conn.send(&request("PUT", "/objects/other", &[("X-Fencing-Token", "1")], &pattern(4096))).await;
    let refused = conn.response().await;
    assert_eq!(refused.status, 503, "{refused:?}");
    assert_eq!(refused.json()["type"], "urn:fencegate:problem:buffer-full");
    assert_eq!(refused.header("retry-after"), Some("1"));
    let chunks = pattern(4096);
    let chunks: Vec<&[u8]> = chunks.chunks(1024).collect();
    let mut conn = Conn::open(proxy.addr).await;
    send_parts(&mut conn, &chunked("PUT", "/objects/other", &[("X-Fencing-Token", "1")], &chunks)).await;
    let refused = conn.response().await;
    assert_eq!(refused.status, 503, "{refused:?}");
    assert!(up.seen().is_empty(), "{:?}", up.seen());
    assert_eq!(mark(&proxy, "/objects/other").await, None);

    // The holder finishes: its write goes whole, and its share comes back.
    holder.stream.write_all(&whole[head_len..]).await.unwrap();
    let done = holder.response().await;
    assert_eq!(done.status, 200, "{done:?}");
    assert_eq!(up.object("/objects/held").as_deref(), Some(&body[..]));
    let reply = put(&proxy.url("/objects/other"), 1, "now there is room").await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let metric = r#"fencegate_requests_total{route="objects",outcome="buffer_full"}"#;
    assert_eq!(proxy.metric(metric).await, Some(2.0));
}

#[tokio::test]
async fn a_fenced_body_cut_short_reaches_nothing_unless_the_route_streams() {
    let up = RecordingUpstream::start().await;
    let routes = format!(
        "{}{}",
        route("objects", "/objects/", &up, EIGHT_KIB_ROUTE),
        route("streamed", "/streamed/", &up, &format!("{EIGHT_KIB_ROUTE}\nstream_body = true"))
    );
    let proxy = start("", &routes).await;
    for path in ["/objects/cut", "/streamed/cut"] {
        let whole = request("PUT", path, &[("X-Fencing-Token", "1")], &pattern(4096));
        let mut conn = Conn::open(proxy.addr).await;
        conn.stream.write_all(&whole[..whole.len() - 2048]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        drop(conn);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Read whole first: the upstream never heard of the cut write.
    assert!(up.seen().iter().all(|(_, path, _)| path != "/objects/cut"), "{:?}", up.seen());
    // Streamed: the upstream saw the request start, and never got it whole.
    assert!(up.seen().iter().any(|(_, path, _)| path == "/streamed/cut"), "{:?}", up.seen());
    assert!(up.applied().is_empty(), "{:?}", up.applied());
    assert_eq!(up.object("/streamed/cut"), None);
}
