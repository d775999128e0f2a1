//! Bounds: descriptors. A fencegate child under a low `ulimit -n`: HTTP/2
//! streams whose responses are never read pin at most their route's
//! `max_upstream_connections`, one client connection's at most its share of
//! them, and a process out of descriptors answers new connections with 503
//! instead of spinning on accept or filling its log.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, StatusCode};
use tokio::net::TcpStream;

use crate::common::process::{config_text, Running, TempDir, BIN, DEADLINE, MEMORY_STORE};
use crate::common::raw::RawRequest;
use crate::common::{get, route, send, Proxy, RecordingUpstream};

/// `fencegate --config <config>` started by a shell that first lowers the
/// open-file limit (soft and hard) to `nofile`, in a clean environment.
pub fn limited(nofile: u32, dir: &Path, config: &Path) -> Command {
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(format!("ulimit -n {nofile} && exec \"$0\" \"$@\""))
        .arg(BIN)
        .arg("--config")
        .arg(config)
        .current_dir(dir)
        .env_remove("FENCEGATE_CONFIG")
        .env_remove("RUST_LOG")
        .env_remove("FENCEGATE_ADMIN_TOKEN");
    cmd
}

/// Descriptors the process holds now.
pub fn open_descriptors(fg: &Running) -> usize {
    std::fs::read_dir(format!("/proc/{}/fd", fg.pid())).map(|d| d.count()).unwrap_or(0)
}

/// Established TCP connections (IPv4, this network namespace) whose far end
/// is `to`: fencegate's connections to an upstream in this process.
fn connections_to(to: SocketAddr) -> usize {
    let port = format!(":{:04X}", to.port());
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    table
        .lines()
        .skip(1)
        .filter(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            fields.len() > 3 && fields[2].ends_with(&port) && fields[3] == "01"
        })
        .count()
}

#[tokio::test]
async fn unread_http2_streams_pin_at_most_the_route_cap() {
    const CAP: usize = 4;
    const STREAMS: usize = 24;
    let upstream = RecordingUpstream::start().await;
    // Large enough that its response can't be written while nobody reads it.
    let big = vec![b'x'; 512 * 1024];
    assert_eq!(send("PUT", &format!("{}/objects/big", upstream.url()), &[], big).await.status, 200);
    let routes = route(
        "objects",
        "/objects/",
        &upstream,
        &format!("max_upstream_connections = {CAP}\nqueue_timeout = \"300ms\"\n"),
    );
    let text = config_text("max_connections = 8", MEMORY_STORE, &routes)
        .replace("[server]\n", "[server]\nworkers = 2\nmax_connections = 64\n");
    let dir = TempDir::new();
    let path = dir.write("fencegate.toml", &text);
    let fg = Running::start_cmd(&mut limited(256, dir.path(), &path)).await;

    // One h2c connection that never opens its streams' receive windows.
    let tcp = TcpStream::connect(fg.proxy).await.unwrap();
    let (mut h2, conn) = h2::client::Builder::new().initial_window_size(0).handshake::<_, Bytes>(tcp).await.unwrap();
    let driver = tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut pending = Vec::new();
    for _ in 0..STREAMS {
        h2 = h2.ready().await.unwrap();
        let req = Request::get(format!("http://{}/objects/big", fg.proxy)).body(()).unwrap();
        let (response, _) = h2.send_request(req, true).unwrap();
        pending.push(response);
    }
    let (mut served, mut busy, mut held) = (0, 0, Vec::new());
    for response in pending {
        let response = tokio::time::timeout(DEADLINE, response).await.expect("a stream got no response head").unwrap();
        match response.status() {
            StatusCode::OK => served += 1,
            StatusCode::SERVICE_UNAVAILABLE => {
                assert_eq!(response.headers()["content-type"], "application/problem+json");
                assert_eq!(response.headers()["retry-after"], "1");
                busy += 1;
            }
            other => panic!("unexpected {other}"),
        }
        held.push(response);
    }
    eprintln!(
        "measured: {served} streams served, {busy} refused busy, {} upstream connections, {} descriptors",
        connections_to(upstream.addr),
        open_descriptors(&fg)
    );
    assert!(served <= CAP, "{served} streams were given an upstream connection; the cap is {CAP}");
    assert_eq!(served + busy, STREAMS);
    assert!(connections_to(upstream.addr) <= CAP, "{} upstream connections open", connections_to(upstream.addr));

    // A normal client beside the attack gets an answer, never a timeout: the
    // route's connections are all pinned, so it is refused with nothing sent.
    let started = Instant::now();
    let reply =
        tokio::time::timeout(DEADLINE, get(&fg.url("/objects/big"))).await.expect("the normal client timed out");
    if reply.status != 200 {
        let problem = reply.problem(503);
        assert_eq!(problem["type"], "urn:fencegate:problem:upstream-busy", "{problem}");
        assert_eq!(reply.header("retry-after"), Some("1"));
    }
    assert!(started.elapsed() < DEADLINE);
    // Every descriptor within the account: 64 + 8 + 4 + reserve.
    assert!(open_descriptors(&fg) <= 64 + 8 + CAP + 16 + 2 * 4, "{} descriptors", open_descriptors(&fg));

    // The attacker leaves: its upstream connections close, their slots free.
    drop((held, h2));
    driver.abort();
    let deadline = Instant::now() + DEADLINE;
    loop {
        let reply = get(&fg.url("/objects/big")).await;
        if reply.status == 200 {
            assert_eq!(reply.body.len(), 512 * 1024);
            break;
        }
        assert!(Instant::now() < deadline, "the route's slots were never given back: {}", reply.text());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `streams` requests for `/objects/big` on one h2c connection that never
/// opens its streams' receive windows: how many were served and refused
/// busy, and the connection (its responses held, so their upstream
/// connections stay busy).
async fn unread_streams(proxy: SocketAddr, streams: usize) -> (usize, usize, impl Drop) {
    let tcp = TcpStream::connect(proxy).await.unwrap();
    let (mut h2, conn) = h2::client::Builder::new().initial_window_size(0).handshake::<_, Bytes>(tcp).await.unwrap();
    let driver = tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut pending = Vec::new();
    for _ in 0..streams {
        h2 = h2.ready().await.unwrap();
        let req = Request::get(format!("http://{proxy}/objects/big")).body(()).unwrap();
        pending.push(h2.send_request(req, true).unwrap().0);
    }
    let (mut served, mut refused, mut held) = (0, 0, Vec::new());
    for response in pending {
        let response = tokio::time::timeout(DEADLINE, response).await.expect("a stream got no response head").unwrap();
        match response.status() {
            StatusCode::OK => served += 1,
            // The problem body can't arrive through a zero window: the head
            // says what it is (the unit tests read the detail).
            StatusCode::SERVICE_UNAVAILABLE => {
                assert_eq!(response.headers()["content-type"], "application/problem+json");
                assert_eq!(response.headers()["retry-after"], "1");
                refused += 1;
                continue;
            }
            other => panic!("unexpected {other}"),
        }
        held.push(response);
    }
    struct Attacker {
        driver: tokio::task::JoinHandle<()>,
        _held: Vec<http::Response<h2::RecvStream>>,
    }
    impl Drop for Attacker {
        fn drop(&mut self) {
            self.driver.abort();
        }
    }
    (served, refused, Attacker { driver, _held: held })
}

#[tokio::test]
async fn one_connections_unread_streams_pin_only_its_share_and_a_normal_client_is_served() {
    const CAP: usize = 8;
    const SHARE: usize = CAP / 4;
    let upstream = RecordingUpstream::start().await;
    let big = vec![b'x'; 512 * 1024];
    assert_eq!(send("PUT", &format!("{}/objects/big", upstream.url()), &[], big).await.status, 200);
    let extra = format!("max_upstream_connections = {CAP}\nqueue_timeout = \"300ms\"\n");
    let fg = Proxy::start(&route("objects", "/objects/", &upstream, &extra)).await;

    // Far more streams than the share: each past it waits its queue_timeout
    // for one of the connection's own slots, then is refused.
    let (served, refused, attacker) = unread_streams(fg.addr, 3 * SHARE).await;
    eprintln!("measured: {served} streams served, {refused} refused busy");
    assert_eq!(served, SHARE, "one client connection holds its share of the route's slots");
    assert_eq!(refused, 2 * SHARE);

    // A normal client on another connection is served, in full, while the
    // attacker still pins its share.
    let reply =
        tokio::time::timeout(DEADLINE, get(&fg.url("/objects/big"))).await.expect("the normal client timed out");
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.body.len(), 512 * 1024);
    drop(attacker);
}

#[tokio::test]
async fn out_of_descriptors_a_new_connection_is_answered_503_and_logged_once() {
    let upstream = RecordingUpstream::start().await;
    let routes = route("objects", "/objects/", &upstream, "");
    // Far more connections than 64 descriptors hold: the account does not fit.
    let text = config_text("max_connections = 4", MEMORY_STORE, &routes)
        .replace("[server]\n", "[server]\nworkers = 1\nmax_connections = 500\nidle_timeout = \"60s\"\n");
    let dir = TempDir::new();
    let path = dir.write("fencegate.toml", &text);
    let mut fg = Running::start_cmd(&mut limited(64, dir.path(), &path)).await;
    let warning = fg
        .wait_event("the account warning", |e| e["message"].as_str().is_some_and(|m| m.contains("does not fit")))
        .await;
    assert_eq!(warning["limit"], 64, "{warning}");
    assert!(warning["needed"].as_u64().unwrap() > 500, "{warning}");
    assert_eq!(warning["level"], "WARN");

    // Idle connections until the process is out of descriptors.
    let mut idle = Vec::new();
    for _ in 0..80 {
        idle.push(TcpStream::connect(fg.proxy).await.unwrap());
    }
    let deadline = Instant::now() + DEADLINE;
    while open_descriptors(&fg) < 63 {
        assert!(Instant::now() < deadline, "fencegate holds only {} descriptors", open_descriptors(&fg));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    eprintln!("measured: {} descriptors at exhaustion (ulimit -n 64)", open_descriptors(&fg));
    // A new connection gets an answer, not a hang.
    for _ in 0..5 {
        let reply = RawRequest::new("GET", "/objects/a").send(fg.proxy).await;
        assert_eq!(reply.status, 503, "{}", reply.text());
        assert_eq!(reply.problem_type().as_deref(), Some("urn:fencegate:problem:descriptors-exhausted"));
        assert_eq!(reply.header("retry-after"), Some("1"));
    }
    // One warning for the whole spell, and no accept loop in the log.
    let events = fg.events();
    let warnings =
        |text: &str| events.iter().filter(|e| e["message"].as_str().is_some_and(|m| m.contains(text))).count();
    assert_eq!(warnings("out of file descriptors"), 1, "{}", fg.output());
    assert_eq!(warnings("accept failed"), 0, "{}", fg.output());
    assert!(events.len() < 20, "{} log lines:\n{}", events.len(), fg.output());
    eprintln!("measured: {} log lines in all after the refusals", events.len());

    // The attacker leaves: the normal client is served again.
    drop(idle);
    let deadline = Instant::now() + DEADLINE;
    loop {
        let reply = RawRequest::new("GET", "/objects/a").try_send(fg.proxy).await;
        if reply.as_ref().is_ok_and(|r| r.status == 404) {
            break;
        }
        assert!(Instant::now() < deadline, "never served again: {reply:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    fg.wait_event("the end of the spell", |e| e["message"] == "file descriptors are available again").await;
}

#[tokio::test]
async fn a_stream_reset_while_its_write_waits_for_an_upstream_slot_lets_the_key_go() {
    let upstream = RecordingUpstream::start().await;
    let keyed = "key = \"{header.x-k}\"\nqueue_timeout = \"30s\"\n";
    let routes = route("objects", "/objects/", &upstream, &format!("{keyed}max_upstream_connections = 1\n"))
        + &route("other", "/other/", &upstream, keyed);
    let fg = Proxy::start(&routes).await;
    // The route's one upstream connection is busy with a held write.
    let pin = upstream.hold("/objects/pin");
    let pinning = tokio::spawn({
        let url = fg.url("/objects/pin");
        async move { send("PUT", &url, &[("x-k", "pin"), ("x-fencing-token", "1")], "p").await }
    });
    pin.wait_arrived().await;

    // A fenced write for key k on an HTTP/2 stream: its mark is raised, then
    // it waits for the route's slot, holding the key's turn.
    let tcp = TcpStream::connect(fg.addr).await.unwrap();
    let (h2, conn) = h2::client::handshake(tcp).await.unwrap();
    let driver = tokio::spawn(async move {
        let _ = conn.await;
    });
    let req = Request::put(fg.url("/objects/a")).header("x-k", "k").header("x-fencing-token", "5").body(()).unwrap();
    let (response, mut stream) = h2.ready().await.unwrap().send_request(req, false).unwrap();
    stream.send_data(Bytes::from_static(b"a"), true).unwrap();
    let deadline = Instant::now() + DEADLINE;
    while get(&fg.admin_url("/fences?key=k")).await.json()["token"] != 5 {
        assert!(Instant::now() < deadline, "the write's mark was never raised");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // The client resets the stream: the write gives up its wait, and with it
    // the key's turn, so a newer write for k (on a route with free slots)
    // goes through at once instead of waiting out a 30 s queue_timeout.
    stream.send_reset(h2::Reason::CANCEL);
    let newer = send("PUT", &fg.url("/other/b"), &[("x-k", "k"), ("x-fencing-token", "6")], "b").await;
    assert_eq!(newer.status, 200, "{}", newer.text());

    pin.release();
    assert_eq!(pinning.await.unwrap().status, 200);
    assert!(upstream.applied_for("/objects/a").is_empty(), "the reset write reached the upstream");
    drop(response);
    driver.abort();
}
