//! Live configuration: a change of the config file (or SIGHUP) puts new
//! routes in service while requests in flight finish on theirs, fences stay
//! as they were, and a config that does not validate, or changes what only a
//! restart can, leaves the running one serving.

mod common;

use std::path::Path;
use std::time::Duration;

use fencegate::fence::signature::sign;

use common::process::{config_text, start_reloading, toml_string, Running, TempDir, MEMORY_STORE};
use common::*;

const APPLIED: &str = "fencegate_config_reloads_total{outcome=\"applied\"}";
const INVALID: &str = "fencegate_config_reloads_total{outcome=\"invalid\"}";
/// How long the config's directory must be quiet before fencegate reads it.
const QUIET: Duration = Duration::from_millis(250);
const RESTART_NEEDED: &str = "fencegate_config_reloads_total{outcome=\"restart_needed\"}";

/// Writes the config as an editor that saves in place would, then waits for
/// fencegate to count it under `outcome` (`n` in all).
async fn rewrite(proxy: &Proxy, path: &Path, text: &str, outcome: &str, n: f64) {
    std::fs::write(path, text).unwrap();
    proxy.wait_metric(outcome, n).await;
}

#[tokio::test]
async fn a_route_added_by_a_reload_serves_while_a_long_request_finishes_and_fences_stay() {
    let (a, b) = (RecordingUpstream::start().await, RecordingUpstream::start().await);
    let dir = TempDir::new();
    let objects = route("objects", "/objects/", &a, "");
    let path = dir.write("fencegate.toml", &config_text("", MEMORY_STORE, &objects));
    let proxy = start_reloading(&path).await;
    assert_eq!(put(&proxy.url("/objects/k"), 5, "v5").await.status, 200);

    // A long request in flight across the reload.
    let gate = a.hold("/objects/slow");
    let url = proxy.url("/objects/slow");
    let slow = tokio::spawn(async move { put(&url, 1, "slow").await });
    a.wait_in_flight("/objects/slow").await;

    assert_eq!(put(&proxy.url("/blobs/x"), 1, "x").await.problem(404)["type"], "urn:fencegate:problem:no-route");
    let both = format!("{objects}{}", route("blobs", "/blobs/", &b, ""));
    rewrite(&proxy, &path, &config_text("", MEMORY_STORE, &both), APPLIED, 1.0).await;
    assert_eq!(put(&proxy.url("/blobs/x"), 1, "x").await.status, 200);
    assert_eq!(b.applied_for("/blobs/x").len(), 1);

    gate.release();
    assert_eq!(slow.await.unwrap().status, 200, "the request in flight finished");
    // The mark set before the reload still holds.
    put(&proxy.url("/objects/k"), 4, "v4").await.problem(409);
    assert_eq!(a.object("/objects/k").as_deref(), Some(&b"v5"[..]));
    assert_eq!(proxy.metric(INVALID).await, Some(0.0));
}

#[tokio::test]
async fn a_request_in_flight_finishes_on_the_upstream_it_was_routed_to() {
    let (a, b) = (RecordingUpstream::start().await, RecordingUpstream::start().await);
    let dir = TempDir::new();
    let path = dir.write("fencegate.toml", &config_text("", MEMORY_STORE, &route("objects", "/objects/", &a, "")));
    let proxy = start_reloading(&path).await;

    let gate = a.hold("/objects/old");
    let url = proxy.url("/objects/old");
    let old = tokio::spawn(async move { put(&url, 1, "old").await });
    a.wait_in_flight("/objects/old").await;
    let moved = config_text("", MEMORY_STORE, &route("objects", "/objects/", &b, ""));
    rewrite(&proxy, &path, &moved, APPLIED, 1.0).await;

    assert_eq!(put(&proxy.url("/objects/new"), 1, "new").await.status, 200);
    assert_eq!(b.applied_for("/objects/new").len(), 1, "routed by the new config");
    gate.release();
    assert_eq!(old.await.unwrap().status, 200);
    assert_eq!(a.applied_for("/objects/old").len(), 1, "finished where it started");
    assert!(b.applied_for("/objects/old").is_empty());
    assert!(a.applied_for("/objects/new").is_empty());
}

#[tokio::test]
async fn a_config_that_does_not_validate_or_needs_a_restart_changes_nothing() {
    let (a, b) = (RecordingUpstream::start().await, RecordingUpstream::start().await);
    let dir = TempDir::new();
    let objects = route("objects", "/objects/", &a, "");
    let path = dir.write("fencegate.toml", &config_text("", MEMORY_STORE, &objects));
    let proxy = start_reloading(&path).await;

    // A bad value in a new route: refused whole.
    let broken = format!("{objects}{}", route("blobs", "/blobs/", &b, "timeout = \"soon\""));
    rewrite(&proxy, &path, &config_text("", MEMORY_STORE, &broken), INVALID, 1.0).await;
    put(&proxy.url("/blobs/x"), 1, "x").await.problem(404);
    assert_eq!(put(&proxy.url("/objects/a"), 1, "a").await.status, 200);

    // A valid new route beside a change of [admin]: refused whole, too.
    let with_blobs = format!("{objects}{}", route("blobs", "/blobs/", &b, ""));
    let admin_changed = config_text("max_connections = 7", MEMORY_STORE, &with_blobs);
    rewrite(&proxy, &path, &admin_changed, RESTART_NEEDED, 1.0).await;
    put(&proxy.url("/blobs/x"), 1, "x").await.problem(404);
    assert_eq!(put(&proxy.url("/objects/a"), 2, "a").await.status, 200);
    assert!(b.applied().is_empty());

    // The same routes without the [admin] change: applied.
    rewrite(&proxy, &path, &config_text("", MEMORY_STORE, &with_blobs), APPLIED, 1.0).await;
    assert_eq!(put(&proxy.url("/blobs/x"), 1, "x").await.status, 200);
}

#[tokio::test]
async fn sighup_reads_the_signing_key_again_and_a_file_change_alone_does_not() {
    const OLD: &str = "an old shared secret, long enough";
    const NEW: &str = "a new shared secret, also long enough";
    let up = RecordingUpstream::start().await;
    let dir = TempDir::new();
    let key_file = dir.write("fence.key", OLD);
    let signing = format!("signing_key_file = {}", toml_string(&key_file.display().to_string()));
    let config =
        dir.write("fencegate.toml", &config_text("", MEMORY_STORE, &route("objects", "/objects/", &up, &signing)));
    let mut running = Running::start_in(dir.path(), &config).await;
    let url = running.url("/objects/s");
    let signed_put = |secret: &'static str, token: u64| {
        let url = url.clone();
        async move {
            let signature = sign(secret.as_bytes(), "/objects/s", token);
            send("PUT", &url, &[("x-fencing-token", &token.to_string()), ("x-fencing-signature", &signature)], "s")
                .await
        }
    };
    assert_eq!(signed_put(OLD, 1).await.status, 200);

    // The key file changes beside the config: the config's text did not, so
    // nothing is reloaded and the old key still signs.
    std::fs::write(&key_file, NEW).unwrap();
    tokio::time::sleep(QUIET * 4).await;
    signed_put(NEW, 2).await.problem(403);
    assert_eq!(signed_put(OLD, 2).await.status, 200);

    running.signal("HUP");
    running.wait_event("the reload", |e| e["message"].as_str().is_some_and(|m| m.starts_with("config reloaded"))).await;
    assert_eq!(signed_put(NEW, 3).await.status, 200, "the new key signs after SIGHUP");
    signed_put(OLD, 4).await.problem(403);
    assert_eq!(up.applied_for("/objects/s").len(), 3);
}
