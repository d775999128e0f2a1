//! Bounds: admin. The admin listener has a connection cap of its own and a
//! thread of its own: idle admin connections cannot take the proxy's
//! descriptors, and admin work beside proxy traffic stays correct.

use std::time::{Duration, Instant};

use tokio::net::TcpStream;

use super::descriptors::{limited, open_descriptors};
use crate::common::process::{config_text, Running, TempDir, DEADLINE, MEMORY_STORE};
use crate::common::{get, put, route, send, Proxy, RecordingUpstream};

#[tokio::test]
async fn idle_admin_connections_are_capped_and_the_proxy_keeps_serving() {
    const ADMIN_CAP: usize = 4;
    let upstream = RecordingUpstream::start().await;
    let routes = route("objects", "/objects/", &upstream, "max_upstream_connections = 4");
    let text = config_text(&format!("max_connections = {ADMIN_CAP}"), MEMORY_STORE, &routes)
        .replace("[server]\n", "[server]\nworkers = 1\nmax_connections = 16\nidle_timeout = \"60s\"\n");
    let dir = TempDir::new();
    let path = dir.write("fencegate.toml", &text);
    let mut fg = Running::start_cmd(&mut limited(64, dir.path(), &path)).await;
    fg.wait_event("the account check", |e| e["message"] == "descriptor account fits the open-file limit").await;
    assert_eq!(get(&fg.admin_url("/healthz")).await.status, 200);
    let before = open_descriptors(&fg);

    // More idle admin connections than the descriptor limit (and fewer than
    // the listen backlog holds): only the cap's worth are taken; the rest
    // wait in the kernel's backlog.
    let mut idle = Vec::new();
    for _ in 0..100 {
        idle.push(TcpStream::connect(fg.admin).await.unwrap());
    }
    let deadline = Instant::now() + DEADLINE;
    while open_descriptors(&fg) + 1 < before + ADMIN_CAP {
        assert!(
            Instant::now() < deadline,
            "the admin listener took only {} connections",
            open_descriptors(&fg) - before
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // The proxy keeps serving fresh connections, fenced writes included.
    for token in 1..=20u64 {
        assert_eq!(put(&fg.url("/objects/a"), token, "x").await.status, 200);
        assert_eq!(get(&fg.url("/objects/a")).await.status, 200);
    }
    // Proxy connections close with their requests; the admin holds its cap.
    let held = open_descriptors(&fg);
    eprintln!("measured: {held} descriptors with 100 idle admin connections, {before} before");
    assert!(held <= before + ADMIN_CAP + 4, "{held} descriptors, {before} before the attack");

    // The idle connections leave: the admin listener answers again.
    drop(idle);
    let reply = tokio::time::timeout(DEADLINE, get(&fg.admin_url("/healthz"))).await.expect("the admin never answered");
    assert_eq!(reply.status, 200);
}

#[tokio::test]
async fn admin_work_beside_proxy_traffic_stays_correct() {
    let upstream = RecordingUpstream::start().await;
    let proxy = Proxy::start(&route("objects", "/objects/", &upstream, "")).await;
    let writes = async {
        for i in 0..100u64 {
            let r = put(&proxy.url(&format!("/objects/k{i}")), i + 1, "x").await;
            assert_eq!(r.status, 200, "{}", r.text());
        }
    };
    let admin = async {
        for _ in 0..50 {
            let listing = get(&proxy.admin_url("/fences?prefix=/objects/&limit=1000")).await;
            assert_eq!(listing.status, 200, "{}", listing.text());
            let metrics = get(&proxy.admin_url("/metrics")).await;
            assert_eq!(metrics.status, 200);
            assert!(metrics.text().contains("fencegate_requests_total"));
        }
    };
    tokio::join!(writes, admin);
    let listing = get(&proxy.admin_url("/fences?prefix=/objects/&limit=1000")).await.json();
    assert_eq!(listing["fences"].as_array().map(Vec::len), Some(100), "{listing}");
    assert_eq!(upstream.applied().len(), 100);
    let mark = send("GET", &proxy.admin_url("/fences?key=/objects/k99"), &[], "").await.json();
    assert_eq!(mark["token"], 100);
}
