//! Request IDs and the access line, against the real binary: a client's
//! `X-Request-Id` kept within its bound or replaced by a made one, the same
//! ID upstream, on every response (refusals included, and in their problem
//! documents) and in the access line, whose every documented field is
//! checked for a forwarded write and a refused one.

use std::collections::HashSet;

use serde_json::Value;

use crate::common;
use common::process::*;
use common::realistic::Nginx;
use common::*;

/// A config on ephemeral loopback ports: the route `objects` to `upstream`.
fn config(upstream: &str) -> String {
    format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n[fences]\nstore = \"memory\"\n\
         [[route]]\nname = \"objects\"\nprefix = \"/objects/\"\nupstream = \"{upstream}\"\n"
    )
}

/// Whether `id` has the form of an ID fencegate makes:
/// `<12 hex digits>-<12 hex digits>`, lowercase.
fn is_made(id: &str) -> bool {
    let hex = |s: &str| s.len() == 12 && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    id.split_once('-').is_some_and(|(prefix, count)| hex(prefix) && hex(count))
}

/// The access line whose `request_id` is `id`.
async fn line_of(fg: &mut Running, id: &str) -> Value {
    let what = format!("the access line of request {id}");
    fg.wait_event(&what, |e| e["target"] == "fencegate::access" && e["request_id"] == id).await
}

/// The ID the upstream got on the last request it saw.
fn upstream_id(up: &RecordingUpstream) -> String {
    let seen = up.seen();
    let (_, _, headers) = seen.last().expect("the upstream saw a request");
    let ids: Vec<_> = headers.get_all("x-request-id").iter().map(|v| v.to_str().unwrap().to_string()).collect();
    assert_eq!(ids.len(), 1, "one X-Request-Id upstream: {ids:?}");
    ids[0].clone()
}

#[tokio::test]
async fn a_clients_id_goes_upstream_comes_back_and_is_logged() {
    let up = RecordingUpstream::start().await;
    let mut fg = Running::start(&config(&up.url())).await;
    let id = "Root=1-5759e988;Parent=53995c3f/0f9b7c1e-2d4a";
    let reply = send("PUT", &fg.url("/objects/a"), &[("x-fencing-token", "3"), ("x-request-id", id)], "v3").await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.header("x-request-id"), Some(id));
    assert_eq!(upstream_id(&up), id);
    assert_eq!(line_of(&mut fg, id).await["status"], 200);

    // Exactly at the bound, kept too.
    let long = "x".repeat(128);
    let reply = send("GET", &fg.url("/objects/a"), &[("x-request-id", &long)], "").await;
    assert_eq!(reply.header("x-request-id"), Some(&*long));
    assert_eq!(upstream_id(&up), long);
}

#[tokio::test]
async fn an_id_out_of_bounds_is_replaced_not_refused() {
    let up = RecordingUpstream::start().await;
    let mut fg = Running::start(&config(&up.url())).await;
    let long = "x".repeat(129);
    for bad in [&*long, "a\tb", "café", "two words", "a\"b", "a\\b", "a,b", ""] {
        let reply = send("GET", &fg.url("/objects/a"), &[("x-request-id", bad)], "").await;
        assert_eq!(reply.status, 404, "{bad:?}: the upstream's own 404 for a missing object");
        let id = reply.header("x-request-id").unwrap().to_string();
        assert!(is_made(&id), "{bad:?} replaced by {id}");
        assert_eq!(upstream_id(&up), id, "the upstream gets the made ID in place of {bad:?}");
        let line = line_of(&mut fg, &id).await;
        assert_eq!(line["upstream_status"], 404, "{line}");
    }
    // Two fields are not one ID: both replaced by one.
    let reply = send("GET", &fg.url("/objects/a"), &[("x-request-id", "one"), ("x-request-id", "two")], "").await;
    let id = reply.header("x-request-id").unwrap().to_string();
    assert!(is_made(&id), "{id}");
    assert_eq!(upstream_id(&up), id);
}

#[tokio::test]
async fn missing_ids_are_made_and_never_repeat() {
    let up = RecordingUpstream::start().await;
    let fg = Running::start(&config(&up.url())).await;
    let mut ids = HashSet::new();
    for i in 0..300 {
        let reply = if i % 2 == 0 { get(&fg.url("/objects/a")).await } else { get(&fg.url("/elsewhere")).await };
        let id = reply.header("x-request-id").unwrap().to_string();
        assert!(is_made(&id), "{id}");
        assert!(ids.insert(id.clone()), "{id} given twice");
    }
}

/// A request refused: its method, URL, headers and the status it gets.
type Refused<'a> = (&'a str, &'a str, Vec<(&'a str, &'a str)>, u16);

/// Every refusal carries the header, and its problem the same ID.
#[tokio::test]
async fn refusals_carry_the_id_in_the_header_and_the_problem() {
    let up = RecordingUpstream::start().await;
    let mut fg = Running::start(&config(&up.url())).await;
    assert_eq!(put(&fg.url("/objects/a"), 5, "v5").await.status, 200);
    let url = fg.url("/objects/a");
    let cases: [Refused; 4] = [
        ("PUT", &*url, vec![("x-fencing-token", "4")], 409),
        ("PUT", &*url, vec![], 428),
        ("PUT", &*url, vec![("x-fencing-token", "-1")], 400),
        ("GET", &*fg.url("/nowhere"), vec![], 404),
    ];
    for (method, url, headers, status) in cases {
        let chosen = format!("client-chosen-{status}");
        for client_id in [None, Some(&*chosen)] {
            let mut headers = headers.clone();
            headers.extend(client_id.map(|id| ("x-request-id", id)));
            let reply = send(method, url, &headers, "body").await;
            let problem = reply.problem(status);
            let id = reply.header("x-request-id").expect("a refusal carries X-Request-Id");
            assert_eq!(problem["request_id"], id, "{problem}");
            match client_id {
                Some(client_id) => assert_eq!(id, client_id),
                None => assert!(is_made(id), "{id}"),
            }
            let line = line_of(&mut fg, id).await;
            assert_eq!(line["status"], status, "{line}");
            assert!(line.get("upstream_status").is_none(), "fencegate answered itself: {line}");
        }
    }
}

/// Every documented field, for a forwarded write and a refused one.
#[tokio::test]
async fn the_access_line_has_every_documented_field() {
    let up = RecordingUpstream::start().await;
    let mut fg = Running::start(&config(&up.url())).await;
    let body = "x".repeat(10_000);
    let url = fg.url("/objects/doc");
    let reply = send("PUT", &url, &[("x-fencing-token", "7"), ("x-request-id", "w-7")], body.clone()).await;
    assert_eq!(reply.status, 200);
    let line = line_of(&mut fg, "w-7").await;
    let fields: HashSet<&str> = line.as_object().unwrap().keys().map(String::as_str).collect();
    let documented = HashSet::from([
        "timestamp",
        "level",
        "route",
        "method",
        "client",
        "key",
        "token",
        "decision",
        "status",
        "upstream_status",
        "bytes_in",
        "bytes_out",
        "latency_us",
        "request_id",
        "target",
    ]);
    assert_eq!(fields, documented, "{line}");
    assert_eq!(line["route"], "objects");
    assert_eq!(line["method"], "PUT");
    assert_eq!(line["client"], "127.0.0.1");
    assert_eq!(line["key"], "/objects/doc");
    assert_eq!(line["token"], 7);
    assert_eq!(line["decision"], "forwarded");
    assert_eq!(line["status"], 200);
    assert_eq!(line["upstream_status"], 200);
    assert_eq!(line["bytes_in"], 10_000);
    assert_eq!(line["bytes_out"], reply.body.len());
    assert!(line["latency_us"].is_u64(), "{line}");

    // The body comes back whole: its bytes out.
    let reply = send("GET", &url, &[("x-request-id", "r-7")], "").await;
    assert_eq!(reply.body.len(), 10_000);
    let line = line_of(&mut fg, "r-7").await;
    assert_eq!((line["method"].as_str(), line["decision"].as_str()), (Some("GET"), Some("unfenced")));
    assert_eq!((line["bytes_in"].as_u64(), line["bytes_out"].as_u64()), (Some(0), Some(10_000)));
    assert!(line.get("token").is_none(), "{line}");

    // Refused from its head: nothing read of its body, the problem sent.
    let reply = send("PUT", &url, &[("x-fencing-token", "6"), ("x-request-id", "s-6")], body).await;
    reply.problem(409);
    let line = line_of(&mut fg, "s-6").await;
    assert_eq!(line["decision"], "stale");
    assert_eq!(line["status"], 409);
    assert_eq!(line["token"], 6);
    assert_eq!(line["key"], "/objects/doc");
    assert!(line.get("upstream_status").is_none(), "{line}");
    assert_eq!(line["bytes_in"], 0);
    assert_eq!(line["bytes_out"], reply.body.len());
}

/// With nginx behind it: a real server's answers are counted as they are.
#[tokio::test]
async fn against_nginx_the_line_counts_what_went_through() {
    let nginx = Nginx::start();
    let mut fg = Running::start(&config(&nginx.url())).await;
    let body = "n".repeat(4_321);
    let url = fg.url("/objects/n");
    let reply = send("PUT", &url, &[("x-fencing-token", "1"), ("x-request-id", "nginx-put")], body).await;
    assert!(reply.status.is_success(), "{}", reply.status);
    assert_eq!(reply.header("x-request-id"), Some("nginx-put"));
    let line = line_of(&mut fg, "nginx-put").await;
    assert_eq!(line["bytes_in"], 4_321);
    assert_eq!(line["upstream_status"], reply.status.as_u16());
    assert_eq!(line["bytes_out"], reply.body.len());

    let reply = get(&url).await;
    assert_eq!(reply.body.len(), 4_321);
    let id = reply.header("x-request-id").unwrap();
    assert!(is_made(id), "{id}");
    let line = line_of(&mut fg, id).await;
    assert_eq!((line["status"].as_u64(), line["upstream_status"].as_u64()), (Some(200), Some(200)));
    assert_eq!(line["bytes_out"], 4_321);
}
