//! What `/readyz` promises: 200 while fencegate serves, 503 only while it
//! drains. A fence store that refuses writes keeps the replica in service
//! (reads flow, each fenced write gets 503) and shows in `/readyz?verbose`
//! and `fencegate_store_writable`. Real `redis-server` and fencegate processes.

use crate::common;

use std::time::{Duration, Instant};

use common::process::*;
use common::redis::*;
use common::*;

const KEY: &str = "/objects/a";

async fn metric(fg: &Running, series: &str) -> Option<f64> {
    let text = get(&fg.admin_url("/metrics")).await.text();
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

fn assert_store_unavailable(r: &Reply) {
    let p = r.problem(503);
    assert!(p["type"].as_str().unwrap().ends_with("store-unavailable"), "{p}");
    assert!(r.header("retry-after").is_some(), "a 503 without Retry-After: {:?}", r.headers);
}

/// Redis stopped under a running replica: reads still pass through the
/// proxy, `/readyz` stays 200, the verbose body and the gauge say the store
/// refuses writes, fenced writes get 503. Redis back: all turns back.
/// Draining while Redis is down still makes `/readyz` 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_stopped_the_replica_serves_reads_and_stays_ready() {
    let mut redis = Redis::start_durable();
    let up = RecordingUpstream::start().await;
    // An upstream that takes connections and never answers: a read of it
    // stays in flight, so the replica drains for a while after SIGTERM.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let routes = format!(
        "{}[[route]]\nname = \"silent\"\nprefix = \"/silent/\"\nupstream = \"http://{}\"\ntimeout = \"20s\"\n",
        route("objects", "/objects/", &up, ""),
        silent.local_addr().unwrap()
    );
    let config = config_text("", &redis_store(&redis, "timeout = \"500ms\""), &routes);
    let mut fg = Running::start(&config).await;
    fg.wait_writable(true, Duration::from_secs(5)).await;
    assert_eq!(put(&fg.url(KEY), 5, "five").await.status, 200);
    let verbose = get(&fg.admin_url("/readyz?verbose")).await;
    assert_eq!((verbose.status.as_u16(), verbose.text()), (200, "[+]serving ok\n[+]store-writable ok\nready\n".into()));

    redis.kill();
    fg.wait_writable(false, Duration::from_secs(5)).await;
    assert_eq!(metric(&fg, "fencegate_store_writable").await, Some(0.0));
    let ready = get(&fg.admin_url("/readyz")).await;
    assert_eq!((ready.status.as_u16(), ready.text()), (200, "ready\n".into()));
    let verbose = get(&fg.admin_url("/readyz?verbose")).await;
    let body = verbose.text();
    assert_eq!(verbose.status, 200, "{body}");
    assert!(body.starts_with("[+]serving ok\n[-]store-writable failed: "), "{body}");
    assert!(body.contains("unreachable"), "{body}");
    assert!(body.contains("reads are served; fenced writes get 503"), "{body}");

    // Reads pass through the proxy; fenced writes are refused, nothing forwarded.
    let r = get(&fg.url(KEY)).await;
    assert_eq!((r.status.as_u16(), r.text()), (200, "five".to_string()));
    assert_store_unavailable(&put(&fg.url(KEY), 6, "six").await);
    assert_store_unavailable(&put(&fg.url("/objects/new"), 1, "new key").await);
    assert_eq!(up.applied().len(), 1, "a write reached the upstream while Redis was down");

    redis.restart();
    fg.wait_writable(true, Duration::from_secs(5)).await;
    assert!(get(&fg.admin_url("/readyz?verbose")).await.text().contains("[+]store-writable ok"));
    assert_eq!(put(&fg.url(KEY), 6, "six").await.status, 200);

    // Redis down again, then SIGTERM with a read in flight: the replica
    // drains, and only that takes it out of service.
    redis.kill();
    fg.wait_writable(false, Duration::from_secs(5)).await;
    let url = fg.url("/silent/slow");
    let read = tokio::spawn(async move { get(&url).await });
    // Accepted within a deadline: a blocking accept that never returns
    // would hang every test group of the binary.
    silent.set_nonblocking(true).unwrap();
    let accepted = Instant::now();
    let (sent, _) = loop {
        match silent.accept() {
            Ok(pair) => break pair,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                assert!(accepted.elapsed() < DEADLINE, "the read never reached the upstream");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => panic!("accept: {e}"),
        }
    };
    sent.set_nonblocking(false).unwrap();
    fg.signal("TERM");
    let start = Instant::now();
    let draining = loop {
        let r = get(&fg.admin_url("/readyz")).await;
        if r.status == 503 {
            break r;
        }
        assert!(start.elapsed() < DEADLINE, "/readyz never turned 503 after SIGTERM");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(draining.problem(503)["detail"].as_str().unwrap().contains("shutting down"));
    let verbose = get(&fg.admin_url("/readyz?verbose")).await;
    let body = verbose.text();
    assert_eq!(verbose.status, 503, "{body}");
    assert!(body.starts_with("[-]serving failed: fencegate is shutting down\n[-]store-writable failed: "), "{body}");
    assert!(body.ends_with("not ready: draining\n"), "{body}");
    // The read is cut at the end of the grace (or answered 502 when the
    // upstream closes); then the process exits cleanly.
    drop((sent, silent));
    let _ = read.await;
    assert_eq!(fg.wait_exit().await.code(), Some(0));
}

/// A replica that starts while Redis is unreachable serves reads from the
/// start: it is ready, its store is not writable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_started_without_its_redis_is_ready_and_not_writable() {
    let mut redis = Redis::start();
    redis.kill();
    let up = RecordingUpstream::start().await;
    let config = config_text("", &redis_store(&redis, "timeout = \"500ms\""), &route("objects", "/objects/", &up, ""));
    let fg = Running::start(&config).await;
    fg.wait_ready(true, Duration::from_secs(5)).await;
    fg.wait_writable(false, Duration::from_secs(5)).await;
    assert_eq!(get(&fg.url(KEY)).await.status, 404, "a read did not reach the upstream");
    assert_store_unavailable(&put(&fg.url(KEY), 1, "one").await);
    assert!(up.applied().is_empty());
    let body = get(&fg.admin_url("/readyz?verbose")).await.text();
    assert!(body.contains("[-]store-writable failed:"), "{body}");
}
