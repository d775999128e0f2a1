//! What the tests of the stores replicas share (Redis, etcd) check the same
//! way: refusals, what reached the upstream, and the fence API's calls.

use serde_json::Value;

use super::process::Running;
use super::*;

/// Asserts a 409 stale-token refusal naming the current mark `current`.
pub fn assert_stale(r: &Reply, current: u64) {
    let p = r.problem(409);
    assert_eq!(p["type"], "urn:fencegate:problem:stale-token", "{p}");
    assert_eq!(r.header("x-fencing-token-current"), Some(current.to_string().as_str()), "{p}");
    assert_eq!(p["current"], current, "{p}");
}

/// Asserts a 503 store-unavailable refusal with `Retry-After`; returns the problem.
pub fn assert_store_unavailable(r: &Reply) -> Value {
    let p = r.problem(503);
    assert!(p["type"].as_str().unwrap().ends_with("store-unavailable"), "{p}");
    assert!(r.header("retry-after").is_some(), "a 503 without Retry-After: {:?}", r.headers);
    p
}

/// `put` on a task of its own.
pub fn spawn_put(url: String, token: u64, body: &'static str) -> tokio::task::JoinHandle<Reply> {
    tokio::spawn(async move { put(&url, token, body).await })
}

/// Why `fg`'s `/readyz?verbose` says its fence store refuses fenced writes,
/// if it does; `/readyz` stays 200 meanwhile (reads are served).
pub async fn refusing(fg: &Running) -> Option<String> {
    let r = get(&fg.admin_url("/readyz?verbose")).await;
    assert_eq!(r.status, 200, "a store refusing writes took the replica out of service: {}", r.text());
    r.text().lines().find_map(|l| l.strip_prefix("[-]store-writable failed: ").map(str::to_string))
}

pub fn fences_url(fg: &Running, key: &str) -> String {
    fg.admin_url(&format!("/fences?key={}", enc(key)))
}

pub async fn confirm(fg: &Running, auth: Option<&str>) -> Reply {
    let headers: Vec<(&str, &str)> = auth.map(|a| vec![("authorization", a)]).unwrap_or_default();
    send("POST", &fg.admin_url("/fences/store/confirm"), &headers, "").await
}

/// The tokens the upstream applied to `key`, in order.
pub fn tokens(up: &RecordingUpstream, key: &str) -> Vec<String> {
    up.applied_for(key).into_iter().map(|a| a.token.unwrap_or_default()).collect()
}

/// Writes to `key` the upstream ever saw (applied or not).
pub fn seen_writes(up: &RecordingUpstream, key: &str) -> usize {
    up.seen().iter().filter(|(m, p, _)| *m != http::Method::GET && p == key).count()
}
