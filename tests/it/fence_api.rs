//! The fence API on the admin listener (`GET`/`PUT /fences`) and the
//! `fencegate fence get|set|list` CLI that talks to it.

use crate::common;

use std::path::Path;

use serde_json::{json, Value};

use common::process::*;
use common::*;

const SECRET: &str = "admin-secret";

fn objects(up: &RecordingUpstream) -> String {
    route("objects", "/objects/", up, "")
}

fn with_token() -> String {
    format!("auth_token = {}", toml_string(SECRET))
}

/// fencegate in-process on the memory store with the admin token [`SECRET`].
async fn setup() -> (RecordingUpstream, Proxy) {
    let up = RecordingUpstream::start().await;
    let proxy = start_in_process(&config_text(&with_token(), MEMORY_STORE, &objects(&up))).await;
    (up, proxy)
}

fn fences_url(admin: &str, key: &str) -> String {
    format!("{admin}/fences?key={}", enc(key))
}

/// `PUT /fences?key=K` with `{"token": N}` and the right bearer token.
async fn set(admin: &str, key: &str, token: u64) -> Reply {
    let auth = format!("Bearer {SECRET}");
    send("PUT", &fences_url(admin, key), &[("authorization", &auth)], json!({ "token": token }).to_string()).await
}

/// The fence of `key` from `GET /fences?key=K`.
async fn fence(admin: &str, key: &str) -> Value {
    let r = get(&fences_url(admin, key)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("application/json"));
    let body = r.json();
    assert_eq!(body["key"], key, "{body}");
    body["token"].clone()
}

// ---------------------------------------------------------------- reading

#[tokio::test]
async fn get_is_null_for_an_unknown_key_and_follows_proxied_writes() {
    let (_up, proxy) = setup().await;
    let admin = proxy.admin_url("");
    let r = get(&fences_url(&admin, "/objects/a")).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json(), json!({ "key": "/objects/a", "token": null }));

    assert_eq!(put(&proxy.url("/objects/a"), 5, "v5").await.status, 200);
    assert_eq!(fence(&admin, "/objects/a").await, 5);
    // A stale write changes nothing.
    put(&proxy.url("/objects/a"), 4, "v4").await.problem(409);
    assert_eq!(fence(&admin, "/objects/a").await, 5);
    assert_eq!(fence(&admin, "/objects/b").await, Value::Null);
}

#[tokio::test]
async fn keys_with_reserved_and_unicode_characters_round_trip() {
    let (_up, proxy) = setup().await;
    let admin = proxy.admin_url("");
    // (as typed, the key it names): a key that is a path is made canonical
    // like a request path, so it names the fence that path's requests get;
    // other keys are taken as they are.
    let keys = [
        ("/objects/a b", "/objects/a%20b"),
        ("/objects/x&y=z", "/objects/x&y=z"),
        ("key=other&prefix=x", "key=other&prefix=x"),
        ("a+b", "a+b"),
        ("100%", "100%"),
        ("/objets/été/😀", "/objets/%C3%A9t%C3%A9/%F0%9F%98%80"),
        ("tab\there", "tab\there"),
        ("?#[]@!$'()*,;", "?#[]@!$'()*,;"),
    ];
    for (i, (typed, key)) in keys.iter().enumerate() {
        let token = 10 + i as u64;
        let r = set(&admin, typed, token).await;
        assert_eq!(r.status, 200, "{typed:?}: {}", r.text());
        assert_eq!(r.json()["key"], *key);
    }
    for (i, (typed, key)) in keys.iter().enumerate() {
        let r = get(&fences_url(&admin, typed)).await;
        assert_eq!(r.json(), json!({ "key": key, "token": 10 + i as u64 }), "{typed:?}");
        assert_eq!(fence(&admin, key).await, 10 + i as u64, "{key:?}");
    }
    // `+` is a plus sign, as in a path: not form encoding's space.
    let r = get(&format!("{admin}/fences?key=%2Fobjects%2Fa+b")).await;
    assert_eq!(r.json(), json!({ "key": "/objects/a+b", "token": null }));
    // The prefix is decoded and made canonical the same way.
    let r = get(&format!("{admin}/fences?prefix={}", enc("/objets/é"))).await;
    assert_eq!(r.json()["fences"], json!([{ "key": "/objets/%C3%A9t%C3%A9/%F0%9F%98%80", "token": 15 }]));

    // A route key is the canonical request path; the API names it alike,
    // whichever spelling is typed.
    assert_eq!(put(&proxy.url("/objects/c%20d"), 3, "x").await.status, 200);
    for typed in ["/objects/c%20d", "/objects/c d", "/objects/./c%20d", "/objects//c%20d"] {
        let r = get(&fences_url(&admin, typed)).await;
        assert_eq!(r.json(), json!({ "key": "/objects/c%20d", "token": 3 }), "{typed:?}");
    }
    // A key no request path can have is refused, as such a path would be.
    let r = get(&fences_url(&admin, "/../objects/a")).await;
    assert_eq!(r.problem(400)["type"], "urn:fencegate:problem:bad-path");
}

/// The raise body must be a JSON object with `token`; anything else changes nothing.
#[tokio::test]
async fn the_raise_body_must_be_an_object_with_a_token() {
    let (_up, proxy) = setup().await;
    let admin = proxy.admin_url("");
    let auth = format!("Bearer {SECRET}");
    for body in ["[45]", "45", "{\"token\": \"45\"}", "{\"token\": 45, \"extra\": 1}", "{}", "null"] {
        let r = send("PUT", &fences_url(&admin, "/objects/b"), &[("authorization", &auth)], body).await;
        assert_eq!(r.status, 400, "{body}: {}", r.text());
    }
    assert_eq!(fence(&admin, "/objects/b").await, Value::Null);
}

// ---------------------------------------------------------------- raising

#[tokio::test]
async fn put_raises_the_fence_and_older_writes_are_refused() {
    let (up, proxy) = setup().await;
    let admin = proxy.admin_url("");
    assert_eq!(put(&proxy.url("/objects/a"), 5, "v5").await.status, 200);

    let r = set(&admin, "/objects/a", 9).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json(), json!({ "key": "/objects/a", "token": 9, "previous": 5 }));

    let stale = put(&proxy.url("/objects/a"), 8, "v8").await;
    stale.problem(409);
    assert_eq!(stale.header("x-fencing-token-current"), Some("9"));
    assert_eq!(fence(&admin, "/objects/a").await, 9);
    assert_eq!(up.applied_for("/objects/a").len(), 1);
}

/// Pre-fencing: the new owner raises the fence when it takes the lock, so the
/// old owner is refused even before the new owner's first write.
#[tokio::test]
async fn pre_fencing_refuses_an_older_owner_before_the_new_owner_writes() {
    let (up, proxy) = setup().await;
    let admin = proxy.admin_url("");
    let key = "/objects/fresh";

    let r = set(&admin, key, 10).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json(), json!({ "key": key, "token": 10, "previous": null }));

    let old_owner = put(&proxy.url(key), 9, "old").await;
    let p = old_owner.problem(409);
    assert_eq!(old_owner.header("x-fencing-token-current"), Some("10"));
    assert_eq!(p["current"], 10);
    assert!(up.applied_for(key).is_empty(), "the old owner's write reached the upstream");
    assert!(up.seen().iter().all(|(_, path, _)| path != key), "the upstream saw the old owner's request");

    assert_eq!(put(&proxy.url(key), 10, "new").await.status, 200);
    let applied = up.applied_for(key);
    assert_eq!(applied.len(), 1);
    assert_eq!(applied[0].token.as_deref(), Some("10"));
    assert_eq!(up.object(key).unwrap(), "new");
}

#[tokio::test]
async fn a_lower_put_is_refused_and_changes_nothing_an_equal_put_is_accepted() {
    let (_up, proxy) = setup().await;
    let admin = proxy.admin_url("");
    assert_eq!(set(&admin, "/objects/a", 9).await.status, 200);

    let lower = set(&admin, "/objects/a", 8).await;
    let p = lower.problem(409);
    assert_eq!(lower.header("x-fencing-token-current"), Some("9"));
    assert_eq!((&p["key"], &p["token"], &p["current"]), (&json!("/objects/a"), &json!(8), &json!(9)), "{p}");
    assert_eq!(fence(&admin, "/objects/a").await, 9);
    put(&proxy.url("/objects/a"), 8, "v8").await.problem(409);

    let equal = set(&admin, "/objects/a", 9).await;
    assert_eq!(equal.status, 200, "{}", equal.text());
    assert_eq!(equal.json(), json!({ "key": "/objects/a", "token": 9, "previous": 9 }));
    assert_eq!(put(&proxy.url("/objects/a"), 9, "v9").await.status, 200);

    // The whole u64 range.
    assert_eq!(set(&admin, "/objects/max", u64::MAX).await.status, 200);
    assert_eq!(fence(&admin, "/objects/max").await, u64::MAX);
    assert_eq!(
        set(&admin, "/objects/max", u64::MAX - 1).await.header("x-fencing-token-current"),
        Some("18446744073709551615")
    );
}

// ---------------------------------------------------------------- auth

#[tokio::test]
async fn without_a_configured_token_changes_are_forbidden_and_reads_work() {
    let up = RecordingUpstream::start().await;
    let proxy = start_in_process(&config_text("", MEMORY_STORE, &objects(&up))).await;
    let admin = proxy.admin_url("");
    let body = json!({ "token": 5 }).to_string();
    for auth in [None, Some("Bearer "), Some("Bearer anything")] {
        let headers: Vec<_> = auth.iter().map(|a| ("authorization", *a)).collect();
        let r = send("PUT", &fences_url(&admin, "/objects/a"), &headers, body.clone()).await;
        r.problem(403);
    }
    assert_eq!(fence(&admin, "/objects/a").await, Value::Null);
}

#[tokio::test]
async fn a_missing_or_wrong_bearer_token_is_401_and_changes_nothing() {
    let (_up, proxy) = setup().await;
    let admin = proxy.admin_url("");
    let url = fences_url(&admin, "/objects/a");
    let body = json!({ "token": 5 }).to_string();
    let wrong = [
        None,
        Some("Bearer wrong".to_string()),
        Some("Bearer ".to_string()),
        Some(format!("Bearer {}", &SECRET[..SECRET.len() - 1])),
        Some(format!("Bearer {SECRET}x")),
        Some(format!("Basic {SECRET}")),
        Some(SECRET.to_string()),
    ];
    for auth in &wrong {
        let headers: Vec<_> = auth.iter().map(|a| ("authorization", a.as_str())).collect();
        let r = send("PUT", &url, &headers, body.clone()).await;
        r.problem(401);
        assert_eq!(r.header("www-authenticate"), Some("Bearer"), "{auth:?}");
    }
    assert_eq!(fence(&admin, "/objects/a").await, Value::Null);
    assert_eq!(set(&admin, "/objects/a", 5).await.status, 200);
}

/// Two `Authorization` headers, in any mix of right and wrong, are 400 and
/// change nothing: never answered as if only the first (or the last)
/// counted. On every endpoint that changes something.
///
/// Failed before: the first header alone was read, so a right token first
/// raised the fence whatever followed it.
#[tokio::test]
async fn two_authorization_headers_are_400_and_change_nothing() {
    let (_up, proxy) = setup().await;
    let admin = proxy.admin_url("");
    let url = fences_url(&admin, "/objects/a");
    let right = format!("Bearer {SECRET}");
    let pairs = [
        (right.as_str(), "Bearer wrong"),
        ("Bearer wrong", right.as_str()),
        (right.as_str(), right.as_str()),
        ("Bearer wrong", "Bearer wrong"),
        (right.as_str(), ""),
    ];
    for (first, second) in pairs {
        let headers = [("authorization", first), ("authorization", second)];
        let r = send("PUT", &url, &headers, json!({ "token": 5 }).to_string()).await;
        let p = r.problem(400);
        assert!(p["detail"].as_str().unwrap().contains("more than one Authorization"), "{first:?}, {second:?}: {p}");
        send("DELETE", &url, &headers, "").await.problem(400);
        send("POST", &format!("{admin}/fences/store/confirm"), &headers, "").await.problem(400);
    }
    assert_eq!(fence(&admin, "/objects/a").await, Value::Null);
    assert_eq!(set(&admin, "/objects/a", 5).await.status, 200);
    let headers = [("authorization", right.as_str()), ("authorization", right.as_str())];
    send("DELETE", &url, &headers, "").await.problem(400);
    assert_eq!(fence(&admin, "/objects/a").await, 5, "a delete with two credentials went through");
}

/// Only a store replicas share is confirmed: on a store of fencegate's own
/// the call is 409, with a problem that says so, and changes nothing.
#[tokio::test]
async fn confirming_a_store_of_its_own_is_409() {
    let (_up, proxy) = setup().await;
    let admin = proxy.admin_url("");
    assert_eq!(set(&admin, "/objects/a", 5).await.status, 200);
    let right = format!("Bearer {SECRET}");
    let p = send("POST", &format!("{admin}/fences/store/confirm"), &[("authorization", right.as_str())], "")
        .await
        .problem(409);
    assert_eq!(p["title"], "Not a shared store", "{p}");
    assert_eq!(fence(&admin, "/objects/a").await, 5);
}

#[tokio::test]
async fn the_token_can_come_from_auth_token_file() {
    let up = RecordingUpstream::start().await;
    let dir = TempDir::new();
    let file = dir.write("admin-token", "from-the-file\n");
    let admin_lines = format!("auth_token_file = {}", toml_string(&file.display().to_string()));
    let proxy = start_in_process(&config_text(&admin_lines, MEMORY_STORE, &objects(&up))).await;
    let url = fences_url(&proxy.admin_url(""), "/objects/a");
    let body = json!({ "token": 5 }).to_string();

    let r = send("PUT", &url, &[("authorization", "Bearer wrong")], body.clone()).await;
    r.problem(401);
    // The file's trailing newline is not part of the token.
    let r = send("PUT", &url, &[("authorization", "Bearer from-the-file")], body).await;
    assert_eq!(r.status, 200, "{}", r.text());
}

/// `FENCEGATE_ADMIN_TOKEN` is read by the binary; it is never set in the test
/// process, where tests run in parallel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_from_the_environment_wins_over_the_config() {
    let up = RecordingUpstream::start().await;
    let body = json!({ "token": 5 }).to_string();
    // With a token in the config too, and with none.
    for (admin_lines, from_config) in [("auth_token = \"from-config\"", Some("from-config")), ("", None)] {
        let dir = TempDir::new();
        let config = dir.write("fencegate.toml", &config_text(admin_lines, MEMORY_STORE, &objects(&up)));
        let fg = Running::start_cmd(
            fencegate(dir.path()).env("FENCEGATE_ADMIN_TOKEN", "from-env").arg("--config").arg(&config),
        )
        .await;
        let url = fences_url(&fg.admin_url(""), "/objects/env");
        if let Some(token) = from_config {
            let r = send("PUT", &url, &[("authorization", &format!("Bearer {token}"))], body.clone()).await;
            r.problem(401);
        }
        let r = send("PUT", &url, &[("authorization", "Bearer from-env")], body.clone()).await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
}

// ---------------------------------------------------------------- bad requests

#[tokio::test]
async fn bad_bodies_are_400_and_change_nothing() {
    let (_up, proxy) = setup().await;
    let admin = proxy.admin_url("");
    let auth = format!("Bearer {SECRET}");
    let big = "9".repeat(10_000);
    let too_big = format!("{{\"token\": {big}}}");
    let bad = [
        "",
        "not json",
        "5",
        "{}",
        "null",
        r#"{"token": -1}"#,
        r#"{"token": 1.5}"#,
        r#"{"token": 1e3}"#,
        r#"{"token": "5"}"#,
        r#"{"token": null}"#,
        r#"{"token": 18446744073709551616}"#,
        r#"{"token": 5, "owner": "me"}"#,
        r#"{"token": 5}{"token": 6}"#,
        // A repeated name: serde_json alone would take the last.
        r#"{"token": 5, "token": 9}"#,
        r#"{"token": 9, "token": 5}"#,
        r#"{"token": 5, "token": 5}"#,
        "[5]",
        too_big.as_str(),
    ];
    for body in bad {
        let r = send("PUT", &fences_url(&admin, "/objects/a"), &[("authorization", &auth)], body.to_string()).await;
        assert_eq!(r.status, 400, "{body:.40}: {}", r.text());
        r.problem(400);
    }
    assert_eq!(fence(&admin, "/objects/a").await, Value::Null);
}

#[tokio::test]
async fn bad_queries_are_400() {
    let (_up, proxy) = setup().await;
    let admin = proxy.admin_url("");
    for query in [
        "limit=0",
        "limit=1001",
        "limit=abc",
        "limit=-1",
        "limit=",
        "prefix=a&limit=5.0",
        "key=a&key=b",
        "prefix=a&prefix=b",
        "after=a&after=b",
        "owner=me",
        "key=a&limit=5",
        "key=a&prefix=a",
    ] {
        let r = get(&format!("{admin}/fences?{query}")).await;
        r.problem(400);
    }
    // The edges of limit are fine.
    for query in ["limit=1", "limit=1000", "prefix=x&after=y&limit=7", ""] {
        let r = get(&format!("{admin}/fences?{query}")).await;
        assert_eq!(r.status, 200, "{query}: {}", r.text());
        assert_eq!(r.json(), json!({ "fences": [], "next": null }), "{query}");
    }

    let auth = format!("Bearer {SECRET}");
    let body = json!({ "token": 5 }).to_string();
    for query in ["", "key=a&key=b", "key=a&limit=5", "prefix=a", "key=a&owner=me"] {
        let r = send("PUT", &format!("{admin}/fences?{query}"), &[("authorization", &auth)], body.clone()).await;
        r.problem(400);
    }
    assert_eq!(fence(&admin, "a").await, Value::Null);
}

// ---------------------------------------------------------------- paging

/// Creates 25 fences under a prefix, and neighbours that sort right before and
/// after them, then pages through the prefix with several page sizes.
async fn paging(proxy: &Proxy) {
    let admin = proxy.admin_url("");
    let prefix = "/objects/page/";
    let inside: Vec<(String, u64)> = (0..25).map(|i| (format!("{prefix}{:02}", (i * 7) % 25), 100 + i)).collect();
    for (key, token) in &inside {
        assert_eq!(set(&admin, key, *token).await.status, 200);
    }
    // Some through the proxy: a write raises a fence like the API does.
    assert_eq!(put(&proxy.url("/objects/page/25"), 125, "x").await.status, 200);
    for outside in ["/objects/page", "/objects/page0", "/objects/pagd/x", "/objects/pagf", "/objects/oage/1", "/zzz"] {
        assert_eq!(set(&admin, outside, 1).await.status, 200);
    }
    let mut expected: Vec<(String, u64)> = inside;
    expected.push(("/objects/page/25".into(), 125));
    expected.sort();

    for limit in [1, 5, 10, 26, 1000] {
        let mut seen: Vec<(String, u64)> = Vec::new();
        let mut after: Option<String> = None;
        for _page in 0..=expected.len() + 1 {
            let mut url = format!("{admin}/fences?prefix={}&limit={limit}", enc(prefix));
            if let Some(a) = &after {
                url.push_str(&format!("&after={}", enc(a)));
            }
            let r = get(&url).await;
            assert_eq!(r.status, 200, "{url}: {}", r.text());
            let body = r.json();
            let fences = body["fences"].as_array().unwrap();
            assert!(fences.len() <= limit, "{url}: {} fences", fences.len());
            for f in fences {
                seen.push((f["key"].as_str().unwrap().to_string(), f["token"].as_u64().unwrap()));
            }
            match body["next"].as_str() {
                Some(next) => {
                    assert_eq!(Some(next), fences.last().and_then(|f| f["key"].as_str()), "{body}");
                    after = Some(next.to_string());
                }
                None => break,
            }
        }
        assert_eq!(seen, expected, "limit {limit}");
    }

    // Without a limit: one page of up to 100.
    let r = get(&format!("{admin}/fences?prefix={}", enc(prefix))).await;
    assert_eq!(r.json()["fences"].as_array().unwrap().len(), expected.len());
    assert_eq!(r.json()["next"], Value::Null);
    // No prefix lists everything.
    let r = get(&format!("{admin}/fences?limit=1000")).await;
    assert_eq!(r.json()["fences"].as_array().unwrap().len(), expected.len() + 6);
}

#[tokio::test]
async fn paging_follows_next_through_every_fence_of_a_prefix_on_the_memory_store() {
    let (_up, proxy) = setup().await;
    paging(&proxy).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paging_follows_next_through_every_fence_of_a_prefix_on_the_file_store() {
    let up = RecordingUpstream::start().await;
    let dir = TempDir::new();
    let proxy = start_in_process(&config_text(&with_token(), &file_store(dir.path(), ""), &objects(&up))).await;
    paging(&proxy).await;
}

// ---------------------------------------------------------------- CLI

/// A config for the CLI: the admin address the server really bound, `admin_lines`
/// for the token. The CLI only connects; it binds nothing.
fn cli_config(dir: &TempDir, name: &str, admin: std::net::SocketAddr, admin_lines: &str) -> std::path::PathBuf {
    dir.write(
        name,
        &format!(
            "[admin]\nlisten = \"{admin}\"\n{admin_lines}\n{MEMORY_STORE}\
             [[route]]\nname = \"o\"\nprefix = \"/\"\nupstream = \"http://127.0.0.1:9\"\n"
        ),
    )
}

fn cli(dir: &Path, config: &Path, args: &[&str]) -> std::process::Output {
    run_to_exit(fencegate(dir).arg("--config").arg(config).arg("fence").args(args))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fence_cli_sets_gets_and_lists_fences() {
    let up = RecordingUpstream::start().await;
    let fg = Running::start(&config_text(&with_token(), MEMORY_STORE, &objects(&up))).await;
    let dir = TempDir::new();
    let config = cli_config(&dir, "cli.toml", fg.admin, &with_token());
    let run = |args: &[&str]| cli(dir.path(), &config, args);

    let out = run(&["set", "/objects/cli", "7"]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    let said = text(&out.stdout);
    assert!(said.contains("raised") && said.contains('7') && said.contains("/objects/cli"), "{said}");

    let out = run(&["get", "/objects/cli"]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "7");
    let out = run(&["get", "/objects/never"]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "none");

    // The CLI's fence is the proxy's fence.
    let r = put(&fg.url("/objects/cli"), 6, "old").await;
    r.problem(409);
    assert!(up.applied_for("/objects/cli").is_empty());

    let out = run(&["set", "/objects/cli", "3"]);
    assert_eq!(out.status.code(), Some(1), "stdout: {} stderr: {}", text(&out.stdout), text(&out.stderr));
    let said = text(&out.stderr);
    assert!(said.contains("refused") && said.contains('7'), "{said}");
    assert_eq!(text(&run(&["get", "/objects/cli"]).stdout).trim(), "7");

    // An equal token is not a refusal.
    assert_eq!(run(&["set", "/objects/cli", "7"]).status.code(), Some(0));

    // list: every fence under the prefix, "TOKEN<TAB>KEY", in key order.
    let admin = fg.admin_url("");
    let mut expected = Vec::new();
    for i in 0..12u64 {
        let key = format!("/objects/ls/{i:02} with space");
        assert_eq!(set(&admin, &key, 40 + i).await.status, 200);
        expected.push(format!("{}\t{}", 40 + i, key.replace(' ', "%20")));
    }
    assert_eq!(set(&admin, "/objects/ls", 1).await.status, 200);
    assert_eq!(set(&admin, "/objects/lt/0", 1).await.status, 200);
    let out = run(&["list", "/objects/ls/"]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    assert_eq!(text(&out.stdout).lines().collect::<Vec<_>>(), expected);
    let out = run(&["list"]);
    assert_eq!(text(&out.stdout).lines().count(), 12 + 3, "{}", text(&out.stdout));

    // The token may come from the environment instead of the config.
    let bare = cli_config(&dir, "bare.toml", fg.admin, "");
    let out =
        run_to_exit(fencegate(dir.path()).env("FENCEGATE_ADMIN_TOKEN", SECRET).arg("--config").arg(&bare).args([
            "fence",
            "set",
            "/objects/env",
            "2",
        ]));
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    // Without any token the server refuses: an error, exit 2, that says why.
    let out = cli(dir.path(), &bare, &["set", "/objects/env", "3"]);
    assert_eq!(out.status.code(), Some(2), "stdout: {}", text(&out.stdout));
    assert!(text(&out.stderr).contains("401"), "stderr: {}", text(&out.stderr));
    assert_eq!(text(&run(&["get", "/objects/env"]).stdout).trim(), "2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fence_cli_names_an_admin_address_it_cannot_reach() {
    let up = RecordingUpstream::start().await;
    let mut fg = Running::start(&config_text(&with_token(), MEMORY_STORE, &objects(&up))).await;
    let admin = fg.admin;
    fg.kill();

    let dir = TempDir::new();
    let config = cli_config(&dir, "cli.toml", admin, &with_token());
    for args in [&["get", "/objects/a"][..], &["set", "/objects/a", "1"], &["list"]] {
        let out = cli(dir.path(), &config, args);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: stderr: {stderr}");
        assert!(stderr.contains(&admin.to_string()), "{args:?}: stderr does not name {admin}: {stderr}");
    }
}
