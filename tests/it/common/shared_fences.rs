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

/// Pre-fencing through the fence API of replica `a` (bearer `auth`) while
/// the old holder's write of `key` is in flight through `b`: the new
/// holder's first write waits for it, and the two never overlap.
pub async fn a_prefenced_token_waits_for_the_old_holders_write(
    a: &Running,
    b: &Running,
    up: &RecordingUpstream,
    key: &str,
    auth: &str,
) {
    let auth = [("authorization", auth)];
    let gate = up.hold(key);
    let twelve = spawn_put(b.url(key), 12, "twelve");
    gate.wait_arrived().await;
    let r = send("PUT", &fences_url(a, key), &auth, serde_json::json!({ "token": 13 }).to_string()).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let thirteen = spawn_put(a.url(key), 13, "thirteen");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(seen_writes(up, key), 1, "token 13 reached the upstream while 12 was in flight there");
    assert!(!thirteen.is_finished(), "token 13 was answered while 12 was in flight: {:?}", thirteen.await);

    gate.release();
    assert_eq!(twelve.await.unwrap().status, 200);
    assert_eq!(thirteen.await.unwrap().status, 200);
    assert_eq!(tokens(up, key), ["12", "13"]);
    assert!(up.overlaps().is_empty(), "writes of different tokens overlapped: {:?}", up.overlaps());
}

/// A COPY through `a` from `/objects/src` to `key` holds its destination
/// alone on every replica: a write of the same token to `key` through `b`
/// waits for it instead of joining it.
pub async fn a_copy_holds_its_destination_alone(a: &Running, b: &Running, up: &RecordingUpstream, key: &str) {
    assert_eq!(put(&a.url(key), 10, "ten").await.status, 200);
    let gate = up.hold("/objects/src");
    let copy_url = a.url("/objects/src");
    let destination = key.to_owned();
    let copy = tokio::spawn(async move {
        send("COPY", &copy_url, &[("x-fencing-token", "10"), ("destination", destination.as_str())], "").await
    });
    gate.wait_arrived().await;
    let ten = spawn_put(b.url(key), 10, "ten again");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(seen_writes(up, key), 1, "a write joined the COPY that holds its destination alone");
    assert!(!ten.is_finished(), "the write was answered while the COPY was in flight: {:?}", ten.await);
    gate.release();
    let copied = copy.await.unwrap();
    assert!(copied.status.is_success(), "{} {}", copied.status, copied.text());
    assert_eq!(ten.await.unwrap().status, 200);
    assert_eq!(seen_writes(up, key), 2);
}
