//! Bounds: reconnects after abuse. A connection closed for abuse (a run of
//! refusals, HTTP/2's GOAWAY for rapid reset) strikes its client's address:
//! the address's next connections are held unread for a while, then served;
//! other addresses are not held. A flood that reconnects at once is slowed
//! to a few connections, and the client beside it is served throughout.

use super::attacks;

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

use crate::common::process::{config_text, start_in_process, MEMORY_STORE};
use crate::common::raw::RawRequest;
use crate::common::{get, put, Proxy, RecordingUpstream};

const RUN: usize = 64;

async fn start(penalty: &str, up: &RecordingUpstream) -> Proxy {
    let route = format!("[[route]]\nname = \"objects\"\nprefix = \"/objects/\"\nupstream = \"{}\"\n", up.url());
    let config = config_text("", MEMORY_STORE, &route).replacen(
        "[server]\n",
        &format!("[server]\nabuse_penalty = \"{penalty}\"\n"),
        1,
    );
    start_in_process(&config).await
}

/// `fencegate_abuse_total{what}`.
async fn abuse(proxy: &Proxy, what: &str) -> u64 {
    let text = get(&proxy.admin_url("/metrics")).await.text();
    let line = format!("fencegate_abuse_total{{what=\"{what}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&line))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {line} in\n{text}"))
}

/// Waits until `what` has counted `n`.
async fn counted(proxy: &Proxy, what: &str, n: u64) {
    let started = Instant::now();
    while abuse(proxy, what).await < n {
        assert!(started.elapsed() < Duration::from_secs(30), "{what} never reached {n}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// From the attacker's address: more malformed writes than a run of refusals
/// allows, on one connection, read until fencegate closes it. Returns the
/// refusals answered.
async fn refused_run(addr: SocketAddr) -> usize {
    let mut conn = attacks::attacker_connect(addr).await.unwrap();
    let bad = RawRequest::new("PUT", "/objects/k").header("x-fencing-token", "not-a-number").body("x").keep_alive();
    let flood: Vec<u8> = (0..RUN + 10).flat_map(|_| bad.bytes()).collect();
    // The close may come before every byte is written.
    let _ = conn.write_all(&flood).await;
    let mut answers = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(30), conn.read_to_end(&mut answers)).await;
    String::from_utf8_lossy(&answers).matches("HTTP/1.1 400").count()
}

/// One `GET` from the attacker's address on a new connection: its status.
async fn attacker_get(addr: SocketAddr) -> String {
    let mut conn = attacks::attacker_connect(addr).await.unwrap();
    conn.write_all(&RawRequest::new("GET", "/objects/after").bytes()).await.unwrap();
    let mut answer = Vec::new();
    conn.read_to_end(&mut answer).await.unwrap();
    String::from_utf8_lossy(&answer).split(' ').nth(1).unwrap_or("none").to_string()
}

/// Each strike holds the address's next connection longer; the connection is
/// served once its wait is over, and a client on another address is served
/// at once meanwhile.
#[tokio::test]
async fn an_address_struck_for_abuse_waits_before_its_next_connection_and_no_other_does() {
    let up = RecordingUpstream::start().await;
    let proxy = start("30s", &up).await;
    assert_eq!(abuse(&proxy, "strike").await, 0);

    // Four runs of refusals, each closing its connection: 250 ms, 500 ms,
    // 1 s, then 2 s of wait for the address's next connection. The second
    // to fourth connections were held themselves.
    for strike in 1..=4 {
        // The close may overtake the last answer.
        let answered = refused_run(proxy.addr).await;
        assert!((RUN - 1..=RUN).contains(&answered), "run {strike}: {answered} refusals answered");
        counted(&proxy, "strike", strike).await;
    }
    assert_eq!(abuse(&proxy, "held").await, 3);

    // Held, then served as any other (the upstream's 404 for a GET).
    let held = tokio::spawn(attacker_get(proxy.addr));
    counted(&proxy, "held", 4).await;
    // The normal client, on its own address, is served while it waits.
    assert_eq!(put(&proxy.url("/objects/normal"), 1, "x").await.status, 200);
    assert_eq!(get(&proxy.url("/objects/normal")).await.status, 200);
    assert!(!held.is_finished(), "the struck address's connection was served before its wait was over");
    assert_eq!(held.await.unwrap(), "404");
    assert_eq!(abuse(&proxy, "strike").await, 4, "a served connection is no strike");
}

/// A client that closes each connection itself just short of the run is
/// struck once its refusals add up to one.
#[tokio::test]
async fn refusals_spread_over_connections_the_client_closes_add_up_to_a_strike() {
    let up = RecordingUpstream::start().await;
    let proxy = start("30s", &up).await;
    let bad = RawRequest::new("PUT", "/objects/k").header("x-fencing-token", "not-a-number").body("x").keep_alive();
    for _ in 0..2 {
        let mut conn = attacks::attacker_connect(proxy.addr).await.unwrap();
        let mut answers = Vec::new();
        for sent in 1..=RUN / 2 {
            conn.write_all(&bad.bytes()).await.unwrap();
            while String::from_utf8_lossy(&answers).matches("HTTP/1.1 400").count() < sent {
                let mut chunk = [0u8; 4096];
                let n = conn.read(&mut chunk).await.unwrap();
                assert!(n > 0, "closed after {sent} requests");
                answers.extend_from_slice(&chunk[..n]);
            }
        }
        // Closed by the client, one run short of fencegate's close.
        drop(conn);
    }
    counted(&proxy, "strike", 1).await;
}

/// With `abuse_penalty = "0s"` a close for abuse is counted, and nothing
/// is held.
#[tokio::test]
async fn with_no_penalty_nothing_is_held() {
    let up = RecordingUpstream::start().await;
    let proxy = start("0s", &up).await;
    for strike in 1..=2 {
        let answered = refused_run(proxy.addr).await;
        assert!((RUN - 1..=RUN).contains(&answered), "run {strike}: {answered} refusals answered");
        counted(&proxy, "strike", strike).await;
    }
    assert_eq!(attacker_get(proxy.addr).await, "404");
    assert_eq!(abuse(&proxy, "held").await, 0);
}

/// Rapid reset: h2 ends each connection with GOAWAY (ENHANCE_YOUR_CALM), a
/// strike; the flood, which reconnects at once, gets a few connections in
/// two seconds instead of hundreds, and the client beside it is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rapid_reset_flood_is_held_to_a_few_connections() {
    let up = RecordingUpstream::start().await;
    let proxy = start("30s", &up).await;
    let deadline = Instant::now() + Duration::from_secs(2);
    let flood = tokio::spawn(attacks::rapid_reset(proxy.addr, "/objects/", 2, deadline));
    let mut token = 0;
    while Instant::now() < deadline {
        token += 1;
        assert_eq!(put(&proxy.url("/objects/normal"), token, "x").await.status, 200);
    }
    let seen = flood.await.unwrap();
    let strikes = abuse(&proxy, "strike").await;
    eprintln!("rapid reset: {seen}; {strikes} strikes, {} held", abuse(&proxy, "held").await);
    assert!(strikes >= 1, "no connection was closed for abuse: {seen}");
    // 2 connections at once: each strike doubles the wait from 250 ms, so
    // two seconds allow a handful.
    assert!(seen.connections <= 12, "{seen}");
}
