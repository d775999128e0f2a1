//! Live configuration: a change of the config file (or SIGHUP) puts new
//! routes in service while requests in flight finish on theirs, fences stay
//! as they were, and a config that does not validate, or changes what only a
//! restart can, leaves the running one serving.

use crate::common;

use std::path::Path;
use std::time::Duration;

use fencegate::fence::signature::sign;

use common::process::{config_text, start_reloading, toml_string, Running, TempDir, MEMORY_STORE};
use common::*;

const APPLIED: &str = "fencegate_config_reloads_total{outcome=\"applied\"}";
const INVALID: &str = "fencegate_config_reloads_total{outcome=\"invalid\"}";
const RESTART_NEEDED: &str = "fencegate_config_reloads_total{outcome=\"restart_needed\"}";

/// Replaces the file at `path` whole, as editors and Kubernetes do (a new
/// file renamed over it: never seen half-written).
fn replace(path: &Path, text: &str) {
    let next = path.with_extension("next");
    std::fs::write(&next, text).unwrap();
    std::fs::rename(&next, path).unwrap();
}

/// Replaces the config, then waits for fencegate to count it under
/// `outcome` (`n` in all).
async fn rewrite(proxy: &Proxy, path: &Path, text: &str, outcome: &str, n: f64) {
    replace(path, text);
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

    // Traces turned on beside the same new route: [tracing] takes a restart
    // (the exporter starts once, with the log), so this is refused whole too.
    let traced = format!(
        "{}\n[tracing]\notlp_endpoint = \"http://127.0.0.1:4318\"\n",
        config_text("", MEMORY_STORE, &with_blobs)
    );
    rewrite(&proxy, &path, &traced, RESTART_NEEDED, 2.0).await;
    put(&proxy.url("/blobs/x"), 1, "x").await.problem(404);

    // The same routes without the [admin] or [tracing] change: applied.
    rewrite(&proxy, &path, &config_text("", MEMORY_STORE, &with_blobs), APPLIED, 1.0).await;
    assert_eq!(put(&proxy.url("/blobs/x"), 1, "x").await.status, 200);
}

#[tokio::test]
async fn a_route_edit_that_raises_the_derived_buffer_share_needs_a_restart_and_one_that_lowers_it_does_not() {
    let up = RecordingUpstream::start().await;
    let dir = TempDir::new();
    // max_connection_buffered_bytes unset: a quarter of 4MiB, raised to the
    // largest max_body of a route that reads bodies whole.
    let with_body = |max_body: &str| {
        let server = "[server]
listen = \"127.0.0.1:0\"
shutdown_grace = \"5s\"
max_buffered_bytes = \"4MiB\"
";
        let routes = route("objects", "/objects/", &up, &format!("max_body = \"{max_body}\""));
        format!("{server}[admin]\nlisten = \"127.0.0.1:0\"\n{MEMORY_STORE}{routes}")
    };
    let path = dir.write("fencegate.toml", &with_body("1MiB"));
    let proxy = start_reloading(&path).await;
    rewrite(&proxy, &path, &with_body("2MiB"), RESTART_NEEDED, 1.0).await;
    rewrite(&proxy, &path, &with_body("512KiB"), APPLIED, 1.0).await;
    let big = "x".repeat(600 << 10);
    let r = send("PUT", &proxy.url("/objects/b"), &[("x-fencing-token", "1")], big).await;
    r.problem(413);
}

#[tokio::test]
async fn a_rotated_signing_key_or_admin_token_is_read_again_when_its_file_changes() {
    const OLD: &str = "an old shared secret, long enough";
    const NEW: &str = "a new shared secret, also long enough";
    let up = RecordingUpstream::start().await;
    let dir = TempDir::new();
    let key_file = dir.write("secrets/fence.key", OLD);
    let token_file = dir.write("secrets/admin-token", "old-admin-token");
    let signing = format!("signing_key_file = {}", toml_string(&key_file.display().to_string()));
    let admin = format!("auth_token_file = {}", toml_string(&token_file.display().to_string()));
    let path =
        dir.write("fencegate.toml", &config_text(&admin, MEMORY_STORE, &route("objects", "/objects/", &up, &signing)));
    let proxy = start_reloading(&path).await;
    let url = proxy.url("/objects/s");
    let signed_put = |secret: &'static str, token: u64| {
        let url = url.clone();
        async move {
            let signature = sign(secret.as_bytes(), "/objects/s", token);
            send("PUT", &url, &[("x-fencing-token", &token.to_string()), ("x-fencing-signature", &signature)], "s")
                .await
        }
    };
    let fence_set = |bearer: &'static str, token: u64| {
        let url = proxy.admin_url("/fences?key=%2Fobjects%2Ft");
        async move {
            send("PUT", &url, &[("authorization", &format!("Bearer {bearer}"))], format!("{{\"token\": {token}}}"))
                .await
        }
    };
    assert_eq!(signed_put(OLD, 1).await.status, 200);
    assert_eq!(fence_set("old-admin-token", 1).await.status, 200);

    // The Secret rotates; the config's text does not change.
    replace(&key_file, NEW);
    replace(&token_file, "new-admin-token");
    // The token, written last, is in service once a reload read both.
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while fence_set("new-admin-token", 2).await.status != 200 {
        assert!(std::time::Instant::now() < until, "the new admin token was not read within 10 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(proxy.metric(APPLIED).await.unwrap() >= 1.0);
    assert_eq!(signed_put(NEW, 2).await.status, 200, "the new key signs");
    signed_put(OLD, 3).await.problem(403);
    fence_set("old-admin-token", 3).await.problem(401);
    assert_eq!(up.applied_for("/objects/s").len(), 2);
}

#[tokio::test]
async fn sighup_reloads_the_config_and_does_not_stop_fencegate() {
    let up = RecordingUpstream::start().await;
    let dir = TempDir::new();
    let config = dir.write("fencegate.toml", &config_text("", MEMORY_STORE, &route("objects", "/objects/", &up, "")));
    let mut running = Running::start_in(dir.path(), &config).await;
    assert_eq!(put(&running.url("/objects/h"), 1, "h").await.status, 200);

    running.signal("HUP");
    running.wait_event("the reload", |e| e["message"].as_str().is_some_and(|m| m.starts_with("config reloaded"))).await;
    let metrics = get(&running.admin_url("/metrics")).await.text();
    assert!(metrics.contains(&format!("{APPLIED} 1")), "{metrics}");
    assert_eq!(put(&running.url("/objects/h"), 2, "h").await.status, 200, "still serving");
    put(&running.url("/objects/h"), 1, "h").await.problem(409);
}

#[tokio::test]
async fn a_config_whose_secrets_were_never_read_is_refused_as_at_start() {
    let up = RecordingUpstream::start().await;
    let plain = config_text("", MEMORY_STORE, &route("objects", "/objects/", &up, ""));
    let config = fencegate::Config::from_toml_str(&plain).unwrap().read_secrets_with(None).unwrap();
    let server = fencegate::Fencegate::bind(config).await.unwrap();
    // Validated, its signing key and upstream TLS named but never read.
    for extra in ["signing_key_file = '/nonexistent/fence.key'", "ca_file = '/nonexistent/ca.crt'"] {
        let upstream = if extra.starts_with("ca_file") { "https://127.0.0.1:1" } else { "http://127.0.0.1:1" };
        let text = config_text(
            "",
            MEMORY_STORE,
            &format!("[[route]]\nname = \"objects\"\nprefix = \"/objects/\"\nupstream = \"{upstream}\"\n{extra}\n"),
        );
        let unread = (*fencegate::Config::from_toml_str(&text).unwrap()).clone();
        let reloaded = server.reloader().apply(unread);
        assert!(matches!(reloaded, fencegate::Reloaded::Invalid(_)), "{extra}: {reloaded:?}");
    }
}
