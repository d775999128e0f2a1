//! The configuration in force, against the real binary: `fencegate --print`
//! (every field, defaults filled in, secrets redacted, itself a config once
//! its secrets are put back) and the admin `GET /config` (behind the admin
//! bearer token, showing a reload once it is applied and not one refused).

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::process::{config_text, fencegate, run_to_exit, text, Running, TempDir, MEMORY_STORE};
use common::*;

const ADMIN: &str = "auth_token = \"hunter2-admin-token\"\n\
    [[admin.lease_tokens]]\ntoken = \"hunter2-lease-token\"\nprefixes = [\"/objects/\"]\n";
const REDIS: &str = "[fences]\nstore = \"redis\"\nurl = \"redis://fencegate:hunter2-redis@127.0.0.1:6379/0\"\n";
const ROUTE: &str = "[[route]]\nname = \"objects\"\nprefix = \"/objects/\"\nupstream = \"http://127.0.0.1:9\"\n";

/// `fencegate --config PATH --print` in `dir`: (exit code, stdout, stderr).
fn print(dir: &Path, path: &Path) -> (Option<i32>, String, String) {
    let out = run_to_exit(fencegate(dir).arg("--config").arg(path).arg("--print"));
    (out.status.code(), text(&out.stdout), text(&out.stderr))
}

#[test]
fn print_shows_every_field_with_secrets_redacted_and_parses_back() {
    let dir = TempDir::new();
    let path = dir.write("fencegate.toml", &config_text(ADMIN, REDIS, ROUTE));
    let (code, printed, stderr) = print(dir.path(), &path);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(!printed.contains("hunter2"), "a secret is printed:\n{printed}");
    let value: toml::Table = toml::from_str(&printed).unwrap_or_else(|e| panic!("{e}\n{printed}"));
    assert_eq!(value["admin"]["auth_token"].as_str(), Some("<redacted>"));
    assert_eq!(value["admin"]["lease_tokens"][0]["token"].as_str(), Some("<redacted>"));
    assert_eq!(value["admin"]["lease_tokens"][0]["prefixes"][0].as_str(), Some("/objects/"));
    assert_eq!(value["fences"]["url"].as_str(), Some("redis://fencegate:<redacted>@127.0.0.1:6379/0"));
    // Defaults filled in, as the process uses them.
    assert_eq!(value["fences"]["timeout"].as_str(), Some("250ms"));
    assert_eq!(value["fences"]["key_prefix"].as_str(), Some("fencegate:"));
    assert_eq!(value["server"]["header_read_timeout"].as_str(), Some("10s"));
    assert_eq!(value["server"]["proxy_protocol"].as_str(), Some("off"));
    assert!(value["server"]["workers"].as_integer().is_some_and(|n| n >= 1));
    assert_eq!(value["route"][0]["key"].as_str(), Some("{path}"));
    assert_eq!(value["route"][0]["missing_token"].as_str(), Some("reject"));
    assert_eq!(value["log"]["format"].as_str(), Some("human"));

    // Its secrets put back, the output is a config that means the same.
    let restored = printed
        .replacen("<redacted>", "hunter2-admin-token", 1)
        .replacen("<redacted>", "hunter2-lease-token", 1)
        .replacen("<redacted>", "hunter2-redis", 1);
    let again = dir.write("printed.toml", &restored);
    let (code, reprinted, stderr) = print(dir.path(), &again);
    assert_eq!(code, Some(0), "{stderr}\n{restored}");
    let body = |text: &str| text.split_once('\n').map(|(_, rest)| rest.to_string()).unwrap_or_default();
    assert_eq!(body(&reprinted), body(&printed));
}

#[test]
fn print_fails_as_check_does_on_a_bad_config() {
    let dir = TempDir::new();
    let bad = config_text("", MEMORY_STORE, &format!("{ROUTE}timeout = \"soon\"\n"));
    let path = dir.write("fencegate.toml", &bad);
    let (code, printed, stderr) = print(dir.path(), &path);
    assert_eq!(code, Some(2), "{printed}");
    assert_eq!(printed, "", "printed for a bad config");
    assert!(stderr.contains("route[0] 'objects'.timeout"), "{stderr}");
}

/// `GET /config` with `token` as the bearer, if any.
async fn config(fg: &Running, token: Option<&str>) -> Reply {
    let bearer = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = bearer.iter().map(|b| ("authorization", b.as_str())).collect();
    send("GET", &fg.admin_url("/config"), &headers, "").await
}

#[tokio::test]
async fn get_config_needs_the_admin_token_and_redacts_secrets() {
    let fg = Running::start(&config_text(ADMIN, MEMORY_STORE, ROUTE)).await;
    for token in [None, Some("wrong")] {
        let reply = config(&fg, token).await;
        assert_eq!(reply.problem(401)["status"], 401, "{token:?}");
        assert_eq!(reply.header("www-authenticate"), Some("Bearer"));
    }
    let reply = config(&fg, Some("hunter2-lease-token")).await;
    assert_eq!(reply.problem(403)["status"], 403);

    let reply = config(&fg, Some("hunter2-admin-token")).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.header("content-type"), Some("application/json"));
    assert!(!reply.text().contains("hunter2"), "{}", reply.text());
    let json = reply.json();
    assert_eq!(json["admin"]["auth_token"], "<redacted>");
    assert_eq!(json["admin"]["lease_tokens"][0]["token"], "<redacted>");
    assert_eq!(json["fences"]["store"], "memory");
    assert_eq!(json["server"]["listen"], "127.0.0.1:0");
    assert_eq!(json["server"]["max_connections"], 10000);
    assert_eq!(json["route"][0]["timeout"], "30s");
    assert_eq!(json["route"][0]["safe_methods"], serde_json::json!(["GET", "HEAD", "OPTIONS"]));

    // With no admin token configured, nobody reads it.
    let open = Running::start(&config_text("", MEMORY_STORE, ROUTE)).await;
    assert_eq!(config(&open, Some("anything")).await.problem(403)["status"], 403);
}

#[tokio::test]
async fn get_config_shows_a_reload_once_applied_and_not_one_refused() {
    let dir = TempDir::new();
    let path = dir.write("fencegate.toml", &config_text(ADMIN, MEMORY_STORE, ROUTE));
    let mut fg = Running::start_in(dir.path(), &path).await;
    let token = Some("hunter2-admin-token");
    assert_eq!(config(&fg, token).await.json()["route"][0]["timeout"], "30s");

    // A new route timeout: applied.
    std::fs::write(&path, config_text(ADMIN, MEMORY_STORE, &format!("{ROUTE}timeout = \"7s\"\n"))).unwrap();
    fg.signal("HUP");
    let url = fg.admin_url("/config");
    eventually("the reload to show", Duration::from_secs(20), || async {
        let bearer = [("authorization", "Bearer hunter2-admin-token")];
        send("GET", &url, &bearer, "").await.json()["route"][0]["timeout"] == "7s"
    })
    .await;

    // trusted_proxies takes a restart: the reload is refused, the log names
    // [server], and /config still shows what is in force.
    let changed = config_text(ADMIN, MEMORY_STORE, &format!("{ROUTE}timeout = \"9s\"\n")).replacen(
        "[server]\n",
        "[server]\ntrusted_proxies = [\"10.0.0.0/8\"]\n",
        1,
    );
    std::fs::write(&path, changed).unwrap();
    fg.signal("HUP");
    fg.wait_event("the refused reload", |e| e["changed"].as_str().is_some_and(|c| c.contains("[server]"))).await;
    let json = config(&fg, token).await.json();
    assert_eq!(json["route"][0]["timeout"], "7s");
    assert_eq!(json["server"]["trusted_proxies"], serde_json::json!([]));
}
