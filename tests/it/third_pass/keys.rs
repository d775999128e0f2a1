//! Keys: escapes that are not UTF-8, and key templates whose parts could run
//! together. The upstream is the legacy store (`tests/upstreams/store.py`),
//! which reads paths and query values as Werkzeug does: percent-decoded, then
//! UTF-8 with every invalid sequence replaced by U+FFFD. Its log of applied
//! writes is the witness.
//!
//! - A path or a keyed query value whose escapes are not UTF-8 (`%FF`, `%FE`)
//!   is refused (400), not keyed: the store reads both as U+FFFD, so they
//!   would be two keys for one resource. Control bytes in a keyed query value
//!   are refused as in a path.
//! - A key template's values are escaped where they hold the template's own
//!   separators, so two resources never share a key: the second one's first
//!   write is not refused as stale, and a signature made for one resource is
//!   refused for the other.

use crate::common::process::{config_text, start_in_process, toml_string, TempDir, MEMORY_STORE};
use crate::common::raw::{RawReply, RawRequest};
use crate::common::realistic::{LegacyStore, Write};
use crate::common::Proxy;
use fencegate::fence::signature::sign;

const SECRET: &str = "keys-test-secret-0123456789";

fn route(name: &str, prefix: &str, store: &LegacyStore, extra: &str) -> String {
    format!("[[route]]\nname = \"{name}\"\nprefix = \"{prefix}\"\nupstream = \"{}\"\n{extra}\n", store.url())
}

async fn start(routes: &str) -> Proxy {
    start_in_process(&config_text("", MEMORY_STORE, routes)).await
}

/// `PUT target` with `token` and the given headers.
async fn put(proxy: &Proxy, target: &str, token: u64, headers: &[(&str, &str)]) -> RawReply {
    let mut req = RawRequest::new("PUT", target).token(token).body(format!("token-{token}"));
    for (name, value) in headers {
        req = req.header(name, value);
    }
    req.send(proxy.addr).await
}

fn assert_refused(reply: &RawReply, status: u16, problem: &str, what: &str) {
    assert_eq!(reply.status, status, "{what}: {} {}", reply.status, reply.text());
    assert_eq!(reply.problem_type().as_deref(), Some(problem), "{what}: {}", reply.text());
}

fn assert_landed(reply: &RawReply, what: &str) {
    assert!((200..300).contains(&reply.status), "{what}: {} {}", reply.status, reply.text());
}

/// The writes the store applied, as (tenant, resource, target).
async fn applied(store: &LegacyStore) -> Vec<(String, String, String)> {
    store.log().await.into_iter().map(|w: Write| (w.tenant, w.resource, w.target)).collect()
}

/// `/objects/%FF` and `/objects/%FE` are one resource to the store
/// (`/objects/\u{FFFD}`); keyed as two, a stale write to the second landed
/// after a fresh one to the first. Both are refused now, as are runs of
/// escaped and raw bytes that are not UTF-8 together; UTF-8 escapes pass.
#[tokio::test]
async fn path_escapes_that_are_not_utf8_are_refused_not_keyed_twice() {
    let store = LegacyStore::start();
    let routes = route("objects", "/objects/", &store, "") + &route("raw", "/raw/", &store, "non_utf8 = \"raw\"");
    let proxy = start(&routes).await;

    for (target, token) in [
        ("/objects/%FF", 5),
        ("/objects/%FE", 3),
        ("/objects/%ff", 4),
        ("/objects/%C3", 2),
        ("/objects/%C0%AF", 2),
        ("/objects/%ED%A0%80", 2),
        ("/objects/%C3%25%A9", 2),
    ] {
        assert_refused(&put(&proxy, target, token, &[]).await, 400, "urn:fencegate:problem:bad-path", target);
    }
    assert_eq!(applied(&store).await, [], "no write reached the store");

    // UTF-8 text, escaped in either case, is one resource under one key.
    assert_landed(&put(&proxy, "/objects/%C3%A9", 5, &[]).await, "é");
    let stale = put(&proxy, "/objects/%c3%a9", 3, &[]).await;
    assert_refused(&stale, 409, "urn:fencegate:problem:stale-token", "é, stale");

    // `non_utf8 = "raw"` keys the bytes exactly: one spelling, one key.
    assert_landed(&put(&proxy, "/raw/%FF", 5, &[]).await, "raw %FF");
    assert_refused(&put(&proxy, "/raw/%ff", 3, &[]).await, 409, "urn:fencegate:problem:stale-token", "raw %ff");
    let resources: Vec<String> = applied(&store).await.into_iter().map(|(_, r, _)| r).collect();
    assert_eq!(resources, ["/objects/é", "/raw/\u{FFFD}"]);
}

/// A `{query.id}` key read `id=%FF` and `id=%FE` as U+FFFD; such values, a
/// name that is not UTF-8, and control bytes in the value are refused now.
#[tokio::test]
async fn keyed_query_values_must_be_utf8_text_without_control_bytes() {
    let store = LegacyStore::start();
    let proxy = start(&route("items", "/items", &store, "key = \"item:{query.id}\"")).await;

    for (target, token) in [
        ("/items?id=%FF", 5),
        ("/items?id=%FE", 3),
        ("/items?id=a%C3", 3),
        ("/items?id=a%00b", 3),
        ("/items?id=a%0Ab", 3),
        ("/items?id=%7F", 3),
        ("/items?i%FFd=1&id=7", 3),
    ] {
        assert_refused(&put(&proxy, target, token, &[]).await, 400, "urn:fencegate:problem:bad-key", target);
    }
    assert_eq!(applied(&store).await, [], "no write reached the store");

    assert_landed(&put(&proxy, "/items?id=%C3%A9", 5, &[]).await, "id=é");
    assert_refused(&put(&proxy, "/items?id=%c3%a9", 3, &[]).await, 409, "urn:fencegate:problem:stale-token", "é");
    let resources: Vec<String> = applied(&store).await.into_iter().map(|(_, r, _)| r).collect();
    assert_eq!(resources, ["/items?id=é"]);
}

/// The reference config's template, `{header.x-tenant}:{path}`: tenant
/// `a:/t/x` writing `/t/y`, and tenant `a` writing `/t/x:/t/y`, are two
/// resources in the store, but both rendered `a:/t/x:/t/y`, so the second
/// one's first write was refused as stale. The tenant's `:` is escaped now.
#[tokio::test]
async fn tenants_and_paths_that_run_together_get_two_keys() {
    let store = LegacyStore::start();
    let proxy = start(&route("tenants", "/t/", &store, "key = \"{header.x-tenant}:{path}\"")).await;

    assert_landed(&put(&proxy, "/t/y", 5, &[("x-tenant", "a:/t/x")]).await, "tenant a:/t/x");
    assert_landed(&put(&proxy, "/t/x:/t/y", 3, &[("x-tenant", "a")]).await, "tenant a, a resource of its own");
    // Each is still fenced on its own key.
    let stale = put(&proxy, "/t/x:/t/y", 2, &[("x-tenant", "a")]).await;
    assert_refused(&stale, 409, "urn:fencegate:problem:stale-token", "tenant a, stale");
    let stale = put(&proxy, "/t/y", 4, &[("x-tenant", "a:/t/x")]).await;
    assert_refused(&stale, 409, "urn:fencegate:problem:stale-token", "tenant a:/t/x, stale");
    let got: Vec<(String, String)> = applied(&store).await.into_iter().map(|(t, r, _)| (t, r)).collect();
    assert_eq!(got, [("a:/t/x".into(), "/t/y".into()), ("a".into(), "/t/x:/t/y".into())]);
}

/// `{query.a}/{query.b}`: `a=x/y&b=z` and `a=x&b=y/z` are two requests a
/// handler reads differently (the store logs both); they rendered one key.
#[tokio::test]
async fn query_values_that_run_together_get_two_keys() {
    let store = LegacyStore::start();
    let proxy = start(&route("pairs", "/pairs", &store, "key = \"{query.a}/{query.b}\"")).await;

    assert_landed(&put(&proxy, "/pairs?a=x/y&b=z", 5, &[]).await, "a=x/y&b=z");
    assert_landed(&put(&proxy, "/pairs?a=x&b=y/z", 3, &[]).await, "a=x&b=y/z");
    // A '%' in a value is escaped too, so its escape cannot pass for a '/'.
    assert_landed(&put(&proxy, "/pairs?a=x%252Fy&b=z", 1, &[]).await, "a=x%2Fy&b=z");
    assert_refused(&put(&proxy, "/pairs?b=z&a=x%2Fy", 4, &[]).await, 409, "urn:fencegate:problem:stale-token", "a=x/y");
    let targets: Vec<String> = applied(&store).await.into_iter().map(|(_, _, t)| t).collect();
    assert_eq!(targets, ["/pairs?a=x/y&b=z", "/pairs?a=x&b=y/z", "/pairs?a=x%252Fy&b=z"]);
}

/// On a signed route, a signature is made over the fence key: the lock
/// service signed tenant `a`'s `/signed/x:/signed/y`, and the same signature
/// was accepted for tenant `a:/signed/x`'s `/signed/y`. Now it is refused
/// there, and each resource takes the signature of its own key.
#[tokio::test]
async fn a_signature_for_one_resource_is_refused_for_the_other() {
    let dir = TempDir::new();
    let file = dir.write("fence.key", &format!("{SECRET}\n"));
    let signing = format!(
        "key = \"{{header.x-tenant}}:{{path}}\"\nsigning_key_file = {}",
        toml_string(&file.display().to_string())
    );
    let store = LegacyStore::start();
    let proxy = start(&route("signed", "/signed/", &store, &signing)).await;

    let key_of_a = "a:/signed/x:/signed/y";
    let signature = sign(SECRET.as_bytes(), key_of_a, 7);
    let other = put(&proxy, "/signed/y", 7, &[("x-tenant", "a:/signed/x"), ("x-fencing-signature", &signature)]).await;
    assert_refused(&other, 403, "urn:fencegate:problem:bad-signature", "tenant a's signature, another resource");
    assert_eq!(applied(&store).await, [], "nothing reached the store");

    let own = put(&proxy, "/signed/x:/signed/y", 7, &[("x-tenant", "a"), ("x-fencing-signature", &signature)]).await;
    assert_landed(&own, "tenant a, its own signature");
    // The other resource's key is the escaped one, and its own signature passes.
    let signature = sign(SECRET.as_bytes(), "a%3A/signed/x:/signed/y", 7);
    let own = put(&proxy, "/signed/y", 7, &[("x-tenant", "a:/signed/x"), ("x-fencing-signature", &signature)]).await;
    assert_landed(&own, "tenant a:/signed/x, its own signature");
    let got: Vec<(String, String)> = applied(&store).await.into_iter().map(|(t, r, _)| (t, r)).collect();
    assert_eq!(got, [("a".into(), "/signed/x:/signed/y".into()), ("a:/signed/x".into(), "/signed/y".into())]);
}
