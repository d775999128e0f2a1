//! Upstream faults: what fencegate does when it cannot know whether a write
//! landed, and what it retries.
//!
//! - An ambiguous outcome (the upstream timed out, or the connection broke after
//!   the request was sent) keeps the key closed for the route's `settle` period,
//!   says so in the 502/504 problem (`settle_ms`), and counts it in
//!   `fencegate_settles_total`.
//! - A request that may have reached the upstream is never sent again.
//! - A connection that never came up is retried with backoff, body intact, and
//!   holds nothing: no byte was sent, so there is nothing to settle.
//!
//! The upstreams here are written for the faults they play. The common
//! recording upstream plays the late one: it holds a write past the route's
//! timeout until the test releases it, and then applies it although fencegate
//! gave up on it, as a real server that does not watch its clients would: that
//! late write is what a settle period is for.

use crate::common;

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

use common::process::*;
use common::*;

/// How long any wait for something that should happen soon may take.
const PATIENCE: Duration = Duration::from_secs(10);

/// Polls `done` until it holds; fails after [`PATIENCE`].
async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < PATIENCE, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A port bound on loopback with nothing listening: connecting to it is
/// refused until [`listen`](tokio::net::TcpSocket::listen) is called on it, and
/// no other socket can take the port in the meantime.
fn closed_port() -> (TcpSocket, SocketAddr) {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = socket.local_addr().unwrap();
    (socket, addr)
}

/// A `[[route]]` table named `name` on `prefix` to `upstream` (an address).
fn route_to(name: &str, prefix: &str, upstream: SocketAddr, extra: &str) -> String {
    format!("[[route]]\nname = \"{name}\"\nprefix = \"{prefix}\"\nupstream = \"http://{upstream}\"\n{extra}\n")
}

fn settles(route: &str) -> String {
    format!("fencegate_settles_total{{route=\"{route}\"}}")
}

/// `PUT url` with a token and `extra` headers.
async fn put_with(url: &str, token: u64, extra: &[(&str, &str)], body: impl Into<Bytes>) -> Reply {
    let token = token.to_string();
    let mut headers = vec![("x-fencing-token", token.as_str())];
    headers.extend_from_slice(extra);
    send("PUT", url, &headers, body).await
}

// ------------------------------------------------------------ the upstreams

fn reply(status: StatusCode) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::new()));
    *r.status_mut() = status;
    r
}

/// Where a [`HangUpUpstream`] closes the connection of a request it drops.
#[derive(Debug, Clone, Copy)]
enum HangUp {
    /// Right after the request head, leaving the body unread.
    AfterHead,
    /// After the whole body: the write may well have been applied.
    AfterBody,
}

/// A raw TCP upstream that drops the first `drop_first` requests without an
/// answer, and answers `200` with an empty body after that. It counts every
/// connection and every request head it reads.
#[derive(Clone)]
struct HangUpUpstream {
    addr: SocketAddr,
    connections: Arc<AtomicUsize>,
    /// Arrival instant and head of every request read.
    requests: Arc<Mutex<Vec<(Instant, String)>>>,
}

impl HangUpUpstream {
    async fn start(hang_up: HangUp, drop_first: usize) -> HangUpUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let up = HangUpUpstream {
            addr: listener.local_addr().unwrap(),
            connections: Arc::default(),
            requests: Arc::default(),
        };
        let serving = up.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                serving.connections.fetch_add(1, Ordering::SeqCst);
                let up = serving.clone();
                tokio::spawn(async move {
                    let _ = up.connection(stream, hang_up, drop_first).await;
                });
            }
        });
        up
    }

    fn requests(&self) -> usize {
        self.requests.lock().unwrap().len()
    }

    async fn connection(&self, mut stream: TcpStream, hang_up: HangUp, drop_first: usize) -> std::io::Result<()> {
        let mut buf = Vec::new();
        loop {
            let head_end = loop {
                if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    break i + 4;
                }
                let mut chunk = [0u8; 4096];
                let n = stream.read(&mut chunk).await?;
                if n == 0 {
                    return Ok(());
                }
                buf.extend_from_slice(&chunk[..n]);
            };
            let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
            let length = head
                .lines()
                .find_map(|l| {
                    let (name, value) = l.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length").then(|| value.trim().parse::<usize>().ok())?
                })
                .unwrap_or(0);
            let seen = {
                let mut requests = self.requests.lock().unwrap();
                requests.push((Instant::now(), head));
                requests.len()
            };
            let dropping = seen <= drop_first;
            if dropping && matches!(hang_up, HangUp::AfterHead) {
                return Ok(()); // Dropping the stream closes it, body unread.
            }
            while buf.len() < head_end + length {
                let mut chunk = [0u8; 4096];
                let n = stream.read(&mut chunk).await?;
                if n == 0 {
                    return Ok(());
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            buf.drain(..head_end + length);
            if dropping {
                return Ok(());
            }
            stream.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").await?;
        }
    }
}

// ---------------------------------------------------------- settle: timeout

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_an_upstream_timeout_the_key_is_held_for_the_settle_period() {
    let up = RecordingUpstream::start().await;
    let proxy = Proxy::start(&route("objects", "/objects/", &up, "timeout = \"200ms\"\nsettle = \"1s\"")).await;
    let url = proxy.url("/objects/k");

    // The upstream holds this one past the timeout and applies it when released:
    // long after the 504, within the settle period.
    let gate = up.hold("/objects/k");
    let r = put_with(&url, 1, &[], "one").await;
    let answered = Instant::now();
    let p = r.problem(504);
    assert_eq!(p["type"], "urn:fencegate:problem:upstream-timeout", "{p}");
    assert_eq!(p["settle_ms"], 1000, "{p}");
    assert_eq!(p["key"], "/objects/k", "{p}");
    assert_eq!(p["token"], 1, "{p}");
    let detail = p["detail"].as_str().unwrap();
    assert!(detail.contains("holds the key for 1s"), "the detail does not mention the settle period: {detail}");

    // The next owner writes at once; fencegate holds it until the settle period is over.
    let next = tokio::spawn({
        let url = url.clone();
        async move { put_with(&url, 2, &[], "two").await }
    });
    proxy.wait_metric("fencegate_waiting_requests", 1.0).await;
    assert_eq!(up.in_flight("/objects/k"), 1, "token 2 reached the upstream during the settle period");
    gate.release();
    let r = next.await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let arrived: Vec<_> =
        up.seen().into_iter().filter(|(m, ..)| m == "PUT").map(|(.., h)| h["x-fencing-token"].clone()).collect();
    assert_eq!(arrived, ["1", "2"]);
    // The settle period started before the 504 was answered; half of it is a
    // margin for the time the 504 took to arrive here.
    let applied = up.applied_for("/objects/k");
    let held = applied.last().expect("token 2 was applied").started.saturating_duration_since(answered);
    assert!(held >= Duration::from_millis(500), "token 2 reached the upstream {held:?} after the 504");

    // The late write landed first, the newer one after it.
    let tokens: Vec<_> = applied.iter().map(|a| a.token.clone().unwrap()).collect();
    assert_eq!(tokens, ["1", "2"], "the write that timed out landed after the newer one");
    assert_eq!(proxy.metric(&settles("objects")).await, Some(1.0));
    assert_eq!(
        proxy.metric("fencegate_requests_total{route=\"objects\",outcome=\"upstream_timeout\"}").await,
        Some(1.0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_settle_off_the_next_write_is_not_held_after_a_timeout() {
    let up = RecordingUpstream::start().await;
    let proxy = Proxy::start(&route("objects", "/objects/", &up, "timeout = \"200ms\"\nsettle = \"0s\"")).await;
    let url = proxy.url("/objects/k");

    let gate = up.hold("/objects/k");
    let r = put_with(&url, 1, &[], "one").await;
    let p = r.problem(504);
    assert!(p.get("settle_ms").is_none(), "settle is off, yet: {p}");
    assert!(!p["detail"].as_str().unwrap().contains("holds the key"), "{p}");

    let r = put_with(&url, 2, &[], "two").await;
    assert_eq!(r.status, 200, "{}", r.text());
    // Token 2 was applied while the upstream was still working on token 1:
    // exactly the hazard a settle period exists for.
    let tokens = || up.applied_for("/objects/k").into_iter().map(|a| a.token.unwrap()).collect::<Vec<_>>();
    assert_eq!(tokens(), ["2"], "token 2 waited for the late write");
    gate.release();
    wait_until("the late write is applied", || tokens().len() == 2).await;
    assert_eq!(tokens(), ["2", "1"]);
    assert_eq!(proxy.metric(&settles("objects")).await, Some(0.0));
}

// ------------------------------------------------ settle: connection lost

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_lost_after_sending_is_settled_and_never_retried() {
    for hang_up in [HangUp::AfterHead, HangUp::AfterBody] {
        let up = HangUpUpstream::start(hang_up, 1).await;
        // queue_timeout below settle: a write that waits for the held key gives up first.
        let proxy =
            Proxy::start(&route_to("objects", "/objects/", up.addr, "settle = \"1s\"\nqueue_timeout = \"300ms\""))
                .await;
        let url = proxy.url("/objects/k");

        let r = put_with(&url, 1, &[], vec![b'x'; 64 * 1024]).await;
        let answered = Instant::now();
        let p = r.problem(502);
        assert_eq!(p["type"], "urn:fencegate:problem:upstream-error", "{hang_up:?}: {p}");
        assert_eq!(p["settle_ms"], 1000, "{hang_up:?}: {p}");
        assert!(p["detail"].as_str().unwrap().contains("holds the key for 1s"), "{hang_up:?}: {p}");
        // Sent once, on one connection: never again, it may have been applied.
        assert_eq!(up.requests(), 1, "{hang_up:?}: the request was sent again");
        assert_eq!(up.connections.load(Ordering::SeqCst), 1, "{hang_up:?}");

        // The key is held: the next owner's write waits, and gives up at its queue_timeout.
        let r = put_with(&url, 2, &[], "two").await;
        let p = r.problem(503);
        assert_eq!(p["type"], "urn:fencegate:problem:queue-timeout", "{hang_up:?}: {p}");
        assert_eq!(up.requests(), 1, "{hang_up:?}: a write reached the upstream during the settle period");

        // Once the settle period is over, it goes through.
        let start = Instant::now();
        let r = loop {
            let r = put_with(&url, 2, &[], "two").await;
            if r.status != 503 {
                break r;
            }
            assert!(start.elapsed() < PATIENCE, "{hang_up:?}: the key stayed held");
        };
        assert_eq!(r.status, 200, "{hang_up:?}: {}", r.text());
        let requests = up.requests.lock().unwrap().clone();
        assert_eq!(requests.len(), 2, "{hang_up:?}");
        let held = requests[1].0.saturating_duration_since(answered);
        assert!(held >= Duration::from_millis(500), "{hang_up:?}: token 2 reached the upstream {held:?} after the 502");
        assert!(requests[1].1.contains("x-fencing-token: 2"), "{hang_up:?}: {}", requests[1].1);
        assert_eq!(proxy.metric(&settles("objects")).await, Some(1.0), "{hang_up:?}");
    }
}

// ---------------------------------------------- retry before sending

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_is_retried_with_the_body_intact() {
    let (socket, addr) = closed_port();
    // Debug logs from the proxy say when a connection attempt failed.
    let config = config_text(
        "",
        &format!("{MEMORY_STORE}[log]\nlevel = \"info,fencegate::proxy=debug\"\n"),
        &route_to("objects", "/objects/", addr, "settle = \"5s\""),
    );
    let mut fg = Running::start(&config).await;

    let body: Bytes = (0..256 * 1024u32).map(|i| (i % 251) as u8).collect::<Vec<u8>>().into();
    let writing = {
        let (url, body) = (fg.url("/objects/k"), body.clone());
        tokio::spawn(async move { put_with(&url, 1, &[], body).await })
    };
    // Nothing listens yet: the first attempt is refused. Start listening right
    // after fencegate says so; the backoff leaves it 175 ms for its last try.
    fg.wait_event("a refused connection", |e| e["message"] == "upstream connect failed; retrying").await;
    let listener = socket.listen(16).unwrap();
    let received: Arc<Mutex<Vec<Bytes>>> = Arc::default();
    let connections = Arc::new(AtomicUsize::new(0));
    {
        let (received, connections) = (received.clone(), connections.clone());
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                connections.fetch_add(1, Ordering::SeqCst);
                let received = received.clone();
                let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let received = received.clone();
                    async move {
                        let body = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
                        received.lock().unwrap().push(body);
                        Ok::<_, Infallible>(reply(StatusCode::OK))
                    }
                });
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service),
                );
            }
        });
    }

    let r = writing.await.unwrap();
    assert_eq!(r.status, 200, "{}\n{}", r.text(), fg.output());
    let received = received.lock().unwrap().clone();
    assert_eq!(received.len(), 1, "the upstream got {} requests", received.len());
    assert!(received[0] == body, "the body arrived damaged: {} of {} bytes", received[0].len(), body.len());
    assert_eq!(connections.load(Ordering::SeqCst), 1);
    // A connection that never came up sent nothing: no settle.
    let metrics = get(&fg.admin_url("/metrics")).await.text();
    assert!(metrics.contains(&format!("{} 0", settles("objects"))), "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_never_listens_is_a_502_without_settling() {
    // Bound, never listening: every connection attempt is refused.
    let (_socket, addr) = closed_port();
    // A settle would hold the key far beyond queue_timeout.
    let proxy =
        Proxy::start(&route_to("objects", "/objects/", addr, "settle = \"30s\"\nqueue_timeout = \"300ms\"")).await;
    let url = proxy.url("/objects/k");

    let mut statuses = HashMap::new();
    for token in 1..=3 {
        let r = put_with(&url, token, &[], "w").await;
        let p = r.problem(502);
        assert_eq!(p["type"], "urn:fencegate:problem:upstream-error", "{p}");
        assert_eq!(p["token"], token, "{p}");
        assert!(p.get("settle_ms").is_none(), "nothing was sent, yet: {p}");
        assert!(!p["detail"].as_str().unwrap().contains("holds the key"), "{p}");
        *statuses.entry(r.status.as_u16()).or_insert(0) += 1;
    }
    // Every write got its own 502: none waited out its queue_timeout behind a held key.
    assert_eq!(statuses, HashMap::from([(502, 3)]));
    assert_eq!(proxy.metric(&settles("objects")).await, Some(0.0));
    assert_eq!(proxy.metric("fencegate_requests_total{route=\"objects\",outcome=\"queue_timeout\"}").await, Some(0.0));
    // The mark still moved: the fence was passed before the upstream failed.
    put(&url, 2, "stale").await.problem(409);
}

// ------------------------------------------------------ crash mid-write

/// A write in flight when fencegate is killed is as ambiguous as one that timed
/// out: the upstream may still apply it. A fencegate started again on the same
/// store does not know which keys had one, so it holds fenced writes for the
/// settle period after start-up; otherwise a newer write would land before the
/// old one, which would then overwrite it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_crash_a_write_still_in_flight_is_not_overtaken() {
    let up = RecordingUpstream::start().await;
    let site = TempDir::new();
    let config = site.write(
        "fencegate.toml",
        &config_text(
            "",
            &file_store(&site.path().join("store"), ""),
            &route("objects", "/objects/", &up, "settle = \"2s\""),
        ),
    );
    let mut fg = Running::start_in(site.path(), &config).await;
    let url = fg.url("/objects/k");
    // Applied 1.5 s after it arrived: within the settle period, which starts
    // only when fencegate is up again. (Not a hold: no event tells this test
    // that token 2 is waiting inside the restarted process.)
    let first = tokio::spawn(async move {
        let token = "1".to_string();
        let req = Request::put(url)
            .header("x-fencing-token", token)
            .header("x-slow-ms", "1500")
            .body(Full::new(Bytes::from_static(b"one")))
            .unwrap();
        // The client's connection dies with the proxy.
        client().request(req).await.map(|r| r.status())
    });
    up.wait_in_flight("/objects/k").await;
    fg.kill();
    assert!(first.await.unwrap().is_err(), "the request outlived its proxy");

    let fg = Running::start_in(site.path(), &config).await;
    put(&fg.url("/objects/k"), 0, "stale").await.problem(409);
    let r = put(&fg.url("/objects/k"), 2, "two").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let tokens = || up.applied_for("/objects/k").into_iter().map(|a| a.token.unwrap()).collect::<Vec<_>>();
    wait_until("both writes are applied", || tokens().len() == 2).await;
    assert_eq!(tokens(), ["1", "2"], "the write in flight at the crash landed after the newer one");
}
