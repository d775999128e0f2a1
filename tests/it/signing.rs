//! Signed tokens and the token-jump guard, over real sockets.
//!
//! A route with `signing_key_file` forwards a fenced write only when its
//! `X-Fencing-Signature` is the HMAC of its fence key and token; anything else is
//! a 403 before the mark is read, so an unsigned token can never fence a key. A
//! route with `max_token_jump` refuses a token too far above the key's mark.

use crate::common;

use std::path::PathBuf;

use common::process::{fencegate, run_to_exit, text, toml_string, TempDir};
use common::{get, route, send, Proxy, RecordingUpstream, Reply};
use fencegate::fence::signature::sign;
use serde_json::Value;

const SECRET: &str = "signing-test-secret-0123456789";

/// A proxy with route "objects" (signed), "open" (unsigned) and "both" (signed,
/// `max_token_jump = 5`), all to one recording upstream.
struct Signed {
    _dir: TempDir,
    key_file: PathBuf,
    upstream: RecordingUpstream,
    proxy: Proxy,
}

async fn signed() -> Signed {
    let dir = TempDir::new();
    // A trailing newline, as editors and `echo` leave it: not part of the key.
    let key_file = dir.write("fence.key", &format!("{SECRET}\n"));
    let upstream = RecordingUpstream::start().await;
    let signing = format!("signing_key_file = {}", toml_string(&key_file.display().to_string()));
    let routes = [
        route("objects", "/objects/", &upstream, &signing),
        route("open", "/open/", &upstream, ""),
        route("both", "/both/", &upstream, &format!("{signing}\nmax_token_jump = 5")),
    ]
    .concat();
    let proxy = Proxy::start(&routes).await;
    Signed { _dir: dir, key_file, upstream, proxy }
}

fn sig(key: &str, token: u64) -> String {
    sign(SECRET.as_bytes(), key, token)
}

/// `PUT` with a token header and the given signature headers (none, one or more).
async fn put_signed(proxy: &Proxy, path: &str, token: &str, signatures: &[&str]) -> Reply {
    let mut headers = vec![("x-fencing-token", token)];
    headers.extend(signatures.iter().map(|s| ("x-fencing-signature", *s)));
    send("PUT", &proxy.url(path), &headers, "body").await
}

/// The mark of `key` from the fence API (`null` when none).
async fn mark(proxy: &Proxy, key: &str) -> Value {
    let r = get(&proxy.admin_url(&format!("/fences?key={key}"))).await;
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["token"].clone()
}

/// `PUT` with `token`, signed correctly or not signed at all.
async fn put_token(proxy: &Proxy, path: &str, token: u64, signed: bool) -> Reply {
    let signature = sig(path, token);
    let signatures: &[&str] = if signed { &[&signature] } else { &[] };
    put_signed(proxy, path, &token.to_string(), signatures).await
}

async fn put_unsigned(proxy: &Proxy, path: &str, token: u64) -> Reply {
    common::put(&proxy.url(path), token, "x").await
}

fn outcome(route: &str, outcome: &str) -> String {
    format!(r#"fencegate_requests_total{{route="{route}",outcome="{outcome}"}}"#)
}

#[tokio::test]
async fn a_valid_signature_is_forwarded_with_both_headers_unchanged() {
    let s = signed().await;
    let signature = sig("/objects/a", 42);
    let r = put_signed(&s.proxy, "/objects/a", "42", &[&signature]).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let (_, path, headers) = s.upstream.seen().pop().expect("forwarded");
    assert_eq!(path, "/objects/a");
    assert_eq!(headers["x-fencing-token"], "42");
    assert_eq!(headers["x-fencing-signature"], signature.as_str());
    assert_eq!(mark(&s.proxy, "/objects/a").await, 42);

    // The token is signed in canonical form: "0043" carries the signature of 43,
    // and is forwarded as sent.
    let r = put_signed(&s.proxy, "/objects/a", "0043", &[&sig("/objects/a", 43)]).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(s.upstream.seen().pop().unwrap().2["x-fencing-token"], "0043");

    // The padded base64url form is accepted too.
    let r = put_signed(&s.proxy, "/objects/a", "44", &[&format!("{}=", sig("/objects/a", 44))]).await;
    assert_eq!(r.status, 200, "{}", r.text());

    // The fence key is the path as sent, percent-encoding and all, without the query.
    let r = put_signed(&s.proxy, "/objects/a%20b?v=1", "1", &[&sig("/objects/a%20b", 1)]).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(s.upstream.applied().len(), 4);
}

#[tokio::test]
async fn missing_wrong_repeated_or_garbage_signatures_are_refused_before_anything_else() {
    let s = signed().await;
    let right = sig("/objects/a", 100);
    let other_secret = sign(b"another-secret-0123456789", "/objects/a", 100);
    let other_key = sig("/objects/b", 100);
    let other_token = sig("/objects/a", 99);
    let garbage_hex = "aef0b37a128d263b847de92c646cedf41c78b13e47594f668bc521f305a4684d";
    let cases: [(&str, &[&str], &str); 9] = [
        ("18446744073709551615", &[], "missing"),
        ("100", &[], "missing"),
        ("100", &[&right, &right], "repeated"),
        ("100", &[&other_secret], "wrong"),
        ("100", &[&other_key], "wrong"),
        ("100", &[&other_token], "wrong"),
        ("100", &["not a signature"], "wrong"),
        ("100", &[garbage_hex], "wrong"),
        ("100", &[""], "wrong"),
    ];
    for (token, signatures, why) in cases {
        let r = put_signed(&s.proxy, "/objects/a", token, signatures).await;
        let p = r.problem(403);
        assert_eq!(p["type"], "urn:fencegate:problem:bad-signature", "{signatures:?}: {p}");
        assert!(p["detail"].as_str().unwrap().contains(why), "{signatures:?}: {p}");
        assert_eq!(p["key"], "/objects/a");
        assert_eq!(p["token"].to_string(), token);
    }
    // Nothing reached the upstream and the mark never moved...
    assert!(s.upstream.seen().is_empty(), "{:?}", s.upstream.seen());
    assert_eq!(mark(&s.proxy, "/objects/a").await, Value::Null);
    assert_eq!(s.proxy.metric(&outcome("objects", "bad_signature")).await, Some(cases.len() as f64));
    // ...so a signed token far below the refused ones still passes.
    let r = put_signed(&s.proxy, "/objects/a", "5", &[&sig("/objects/a", 5)]).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(mark(&s.proxy, "/objects/a").await, 5);
    assert_eq!(s.upstream.applied_for("/objects/a").len(), 1);
}

#[tokio::test]
async fn a_route_without_a_signing_key_ignores_the_signature_header() {
    let s = signed().await;
    let r = put_signed(&s.proxy, "/open/a", "7", &["whatever"]).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = put_signed(&s.proxy, "/open/a", "8", &[]).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(s.upstream.applied_for("/open/a").len(), 2);
    // Reads are never fenced, so never need a signature.
    assert_eq!(get(&s.proxy.url("/objects/a")).await.status, 404);
}

#[tokio::test]
async fn a_token_too_far_above_the_mark_is_refused() {
    let upstream = RecordingUpstream::start().await;
    let proxy = Proxy::start(&route("jumpy", "/jumpy/", &upstream, "max_token_jump = 5")).await;
    let put = |path, token| put_unsigned(&proxy, path, token);

    // A key with no mark has nothing to measure a jump from.
    assert_eq!(put("/jumpy/fresh", 1_000_000).await.status, 200);
    assert_eq!(put("/jumpy/a", 10).await.status, 200);

    for (token, current) in [(16, 10), (u64::MAX, 10)] {
        let r = put("/jumpy/a", token).await;
        let p = r.problem(403);
        assert_eq!(p["type"], "urn:fencegate:problem:token-jump", "{p}");
        assert_eq!(
            (p["key"].as_str(), p["token"].as_u64(), p["current"].as_u64()),
            (Some("/jumpy/a"), Some(token), Some(current))
        );
    }
    assert_eq!(mark(&proxy, "/jumpy/a").await, 10);
    assert_eq!(put("/jumpy/a", 15).await.status, 200, "exactly max_token_jump above is allowed");
    assert_eq!(put("/jumpy/a", 21).await.problem(403)["current"], 15);
    assert_eq!(put("/jumpy/a", 20).await.status, 200);
    // A stale token is still a 409, not a jump.
    assert_eq!(put("/jumpy/a", 3).await.status, 409);

    let tokens: Vec<_> = upstream.applied_for("/jumpy/a").into_iter().map(|a| a.token.unwrap()).collect();
    assert_eq!(tokens, ["10", "15", "20"]);
    assert_eq!(proxy.metric(&outcome("jumpy", "token_jump")).await, Some(3.0));

    // Near the top, current + max_token_jump saturates instead of wrapping.
    assert_eq!(put("/jumpy/top", u64::MAX - 2).await.status, 200);
    assert_eq!(put("/jumpy/top", u64::MAX).await.status, 200);
}

#[tokio::test]
async fn the_signature_is_checked_before_the_jump() {
    let s = signed().await;
    let put = |token, signed| put_token(&s.proxy, "/both/a", token, signed);
    assert_eq!(put(10, true).await.status, 200);
    // Unsigned and far ahead: the signature is what fails.
    assert_eq!(put(1000, false).await.problem(403)["type"], "urn:fencegate:problem:bad-signature");
    // Signed and far ahead: even a signer that misbehaves cannot jump far.
    let p = put(1000, true).await.problem(403);
    assert_eq!(p["type"], "urn:fencegate:problem:token-jump");
    assert_eq!(p["current"], 10);
    assert_eq!(put(15, true).await.status, 200);
    assert_eq!(mark(&s.proxy, "/both/a").await, 15);
}

#[tokio::test]
async fn fencegate_sign_prints_what_the_server_accepts() {
    let s = signed().await;
    // The same key file the route reads, trailing newline included; no config needed.
    let cwd = TempDir::new();
    let out = run_to_exit(fencegate(cwd.path()).args(["sign", "/objects/cli", "77", "--key-file"]).arg(&s.key_file));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let printed = text(&out.stdout);
    assert_eq!(printed, format!("{}\n", sig("/objects/cli", 77)));
    let r = put_signed(&s.proxy, "/objects/cli", "77", &[printed.trim_end()]).await;
    assert_eq!(r.status, 200, "{}", r.text());

    // A key file the server would refuse is refused here too, with the same words.
    let short = cwd.write("short.key", "too-short\n");
    let out = run_to_exit(fencegate(cwd.path()).args(["sign", "/objects/cli", "77", "--key-file"]).arg(&short));
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("holds 9 bytes; use a key of at least 16"), "{}", text(&out.stderr));
    assert!(out.stdout.is_empty());
}

/// A config whose key file was named but never read (its secrets step
/// skipped) must not run a signing route open: fencegate refuses to start.
#[tokio::test]
async fn a_signing_key_never_read_keeps_fencegate_from_starting() {
    let dir = TempDir::new();
    let key_file = dir.write("fence.key", SECRET);
    let upstream = RecordingUpstream::start().await;
    let signing = format!("signing_key_file = {}", toml_string(&key_file.display().to_string()));
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n{}",
        route("objects", "/objects/", &upstream, &signing)
    );
    let validated = fencegate::Config::from_toml_str(&text).unwrap();
    let unread: fencegate::Config = (*validated).clone();
    let Err(err) = fencegate::Fencegate::bind(unread).await else { panic!("started with an unread signing key") };
    assert!(err.to_string().contains("route 'objects' names a signing key file that was never read"), "{err}");
    // Read, the same config starts.
    let config = validated.read_secrets().unwrap();
    assert_eq!(config.routes[0].signing_key.as_ref().and_then(|k| k.bytes()), Some(SECRET.as_bytes()));
    assert!(fencegate::Fencegate::bind(config).await.is_ok());
}
