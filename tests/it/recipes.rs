//! The recipes of docs/recipes.md that run here: a token taken from the real
//! service (etcd's lock API through `etcdctl lock`, a Redis counter through
//! `redis-cli INCR`), carried in `X-Fencing-Token`, and an older holder's
//! late write refused by fencegate.

use crate::common;

use std::process::Command;

use common::etcd::*;
use common::process::*;
use common::redis::*;
use common::*;

const KEY: &str = "/objects/report";

/// A holder's token from `etcdctl lock NAME -- CMD`: the lock key's revision,
/// which etcdctl hands the command as `ETCD_LOCK_REV`; the lock is released
/// when the command ends.
fn etcd_lock_revision(endpoint: &str, lock: &str) -> u64 {
    let out = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args(["--endpoints", endpoint, "lock", lock, "--", "sh", "-c", "echo \"$ETCD_LOCK_REV\""])
        .output()
        .expect("run etcdctl (Debian package etcd-client)");
    assert!(out.status.success(), "etcdctl lock: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    text.trim().parse().unwrap_or_else(|_| panic!("etcdctl lock gave no revision: {text:?}"))
}

/// The token a newer holder got fences the older holder's late write, and
/// the newer holder's writes pass.
async fn older_holder_is_fenced(proxy: &Proxy, older: u64, newer: u64) {
    assert!(newer > older, "the service handed out {older} and then {newer}");
    assert_eq!(put(&proxy.url(KEY), older, "first").await.status, 200);
    assert_eq!(put(&proxy.url(KEY), newer, "second").await.status, 200);
    let p = put(&proxy.url(KEY), older, "late").await.problem(409);
    assert_eq!(p["type"], "urn:fencegate:problem:stale-token", "{p}");
    assert_eq!(p["current"], newer, "{p}");
}

#[tokio::test]
async fn an_etcd_lock_revision_is_a_token_fencegate_enforces() {
    let cluster = EtcdCluster::start(1).await;
    let up = RecordingUpstream::start().await;
    let proxy = start_in_process(&config_text("", MEMORY_STORE, &route("objects", "/objects/", &up, ""))).await;
    let endpoint = cluster.endpoint(0);
    let older = etcd_lock_revision(&endpoint, "locks/report");
    // Other writes to etcd move the revision on between holders.
    cluster.put("unrelated", "x").await;
    let newer = etcd_lock_revision(&endpoint, "locks/report");
    older_holder_is_fenced(&proxy, older, newer).await;
    assert_eq!(up.applied_for(KEY).len(), 2, "the late write never reached the upstream");
}

#[tokio::test]
async fn a_redis_counter_is_a_token_fencegate_enforces() {
    let redis = Redis::start();
    let up = RecordingUpstream::start().await;
    let proxy = start_in_process(&config_text("", MEMORY_STORE, &route("objects", "/objects/", &up, ""))).await;
    let counter = format!("fencing-token:{KEY}");
    let token = || redis.cli(&["INCR", &counter]).trim().parse::<u64>().expect("INCR answers a number");
    let older = token();
    let newer = token();
    older_holder_is_fenced(&proxy, older, newer).await;
    assert_eq!(up.applied_for(KEY).len(), 2, "the late write never reached the upstream");
}
