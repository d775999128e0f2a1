//! The Redis store over TLS (`rediss://`) with a user and password: a real
//! `redis-server` that speaks only TLS with a certificate from a CA of the
//! test's own, and whose default user is off.

use crate::common;

use common::certs::Ca;
use common::process::*;
use common::redis::Redis;
use common::*;

const USER: &str = "fencegate";
const PASSWORD: &str = "s3cret-pass";

/// A TLS-only Redis with a certificate for 127.0.0.1 from `ca`, the site
/// directory holding `ca.pem`, and the Redis.
fn tls_redis(ca: &Ca) -> (TempDir, Redis) {
    let site = TempDir::new();
    let server = ca.issue("redis");
    let cert = site.write("redis.crt", &server.cert);
    let key = site.write("redis.key", &server.key);
    let ca_file = site.write("ca.pem", &ca.pem());
    let redis = Redis::start_tls(&cert, &key, &ca_file, USER, PASSWORD);
    (site, redis)
}

fn fences(redis: &Redis, password: &str, ca_file: Option<&std::path::Path>) -> String {
    let ca = ca_file.map(|p| format!("ca_file = {}\n", toml_string(&p.display().to_string()))).unwrap_or_default();
    format!(
        "[fences]\nstore = \"redis\"\nurl = \"rediss://{USER}:{password}@127.0.0.1:{}/0\"\ntimeout = \"1s\"\n{ca}",
        redis.port
    )
}

#[tokio::test]
async fn rediss_with_a_private_ca_and_a_password_fences_writes() {
    let ca = Ca::new("test redis ca");
    let (site, redis) = tls_redis(&ca);
    let up = RecordingUpstream::start().await;
    let config = config_text(
        "",
        &fences(&redis, PASSWORD, Some(&site.path().join("ca.pem"))),
        &route("objects", "/objects/", &up, ""),
    );
    let fg = Running::start(&config).await;
    fg.wait_writable(true, DEADLINE).await;

    assert_eq!(put(&fg.url("/objects/a"), 5, "five").await.status, 200);
    put(&fg.url("/objects/a"), 4, "four").await.problem(409);
    // The mark is in Redis, over the TLS connection the test's redis-cli uses too.
    assert_eq!(redis.cli(&["GET", "fencegate:mark:/objects/a"]), "5");
    let applied: Vec<_> = up.applied_for("/objects/a").into_iter().map(|a| a.token.unwrap_or_default()).collect();
    assert_eq!(applied, ["5"]);
}

#[tokio::test]
async fn a_wrong_password_or_an_unknown_ca_fails_closed() {
    let ca = Ca::new("test redis ca");
    let (site, redis) = tls_redis(&ca);
    let up = RecordingUpstream::start().await;
    let routes = route("objects", "/objects/", &up, "");
    let ca_file = site.path().join("ca.pem");
    // A wrong password, and the system's roots, which do not know the test's CA.
    for fences in [fences(&redis, "wrong-password", Some(&ca_file)), fences(&redis, PASSWORD, None)] {
        let fg = Running::start(&config_text("", &fences, &routes)).await;
        fg.wait_writable(false, DEADLINE).await;
        let refused = put(&fg.url("/objects/a"), 5, "five").await;
        let problem = refused.problem(503);
        assert!(problem["type"].as_str().unwrap().ends_with("store-unavailable"), "{problem}");
        assert!(refused.header("retry-after").is_some(), "{:?}", refused.headers);
        // Reads never touch the store.
        assert_eq!(get(&fg.url("/objects/a")).await.status, 404);
    }
    assert!(up.applied().is_empty(), "a write went through without the store: {:?}", up.applied());
}
