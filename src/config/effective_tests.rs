use super::*;
use crate::config::tests::MINIMAL;

/// The fields serde knows in the table at `header` (e.g. `[server]`), as
/// the parser lists them when it meets one it does not know.
fn fields_of(header: &str, before: &str) -> Vec<String> {
    let text = format!("{before}{header}\nnot_a_field_at_all = 1\n");
    let err = toml::from_str::<FileConfig>(&text).unwrap_err().to_string();
    let list = err.split("expected ").nth(1).unwrap_or_else(|| panic!("{header}: {err}"));
    let list = list.strip_prefix("one of ").unwrap_or(list).replace(" or ", ", ");
    list.split(", ").map(|f| f.trim().trim_matches(|c: char| c == '`' || c.is_whitespace()).to_string()).collect()
}

#[test]
fn every_field_of_the_file_is_known_secret_or_public() {
    let tables = [
        ("server", "[server]", ""),
        ("server.tls", "[server.tls]", ""),
        ("admin", "[admin]", ""),
        ("admin.lease_tokens", "[[admin.lease_tokens]]", ""),
        ("fences", "[fences]", ""),
        ("log", "[log]", ""),
        ("tracing", "[tracing]", ""),
        ("route", "[[route]]", ""),
    ];
    let mut seen = 0;
    for (section, header, before) in tables {
        for field in fields_of(header, before) {
            let name = format!("{section}.{field}");
            let secret = SECRET_FIELDS.contains(&name.as_str());
            let public = PUBLIC_FIELDS.contains(&name.as_str());
            assert!(
                secret != public,
                "{name}: list it in SECRET_FIELDS (its value is redacted by Config::effective) or in \
                 PUBLIC_FIELDS (shown as is), once"
            );
            seen += 1;
        }
    }
    assert!(seen > 60, "the parser's lists of fields were not read: {seen}");
}

/// A config with a secret in every field that holds one.
const SECRETS: &str = r#"
    [admin]
    auth_token = "hunter2-admin"
    [[admin.lease_tokens]]
    token = "hunter2-lease-a"
    prefixes = ["/a/"]
    [[admin.lease_tokens]]
    token = "hunter2-lease-b"
    prefixes = ["/b/"]
    [fences]
    store = "etcd"
    endpoints = ["http://127.0.0.1:2379"]
    user = "fencegate"
    password = "hunter2-etcd"
"#;

fn effective_of(text: &str) -> Config {
    Config::from_toml_str(text).unwrap_or_else(|e| panic!("{e}")).read_secrets_with(None).unwrap()
}

#[test]
fn secrets_are_redacted_in_toml_and_json() {
    let redis = "[fences]\nstore = \"redis\"\nurl = \"redis://fg:hunter2-redis@127.0.0.1:6379/0\"\n";
    for text in [format!("{SECRETS}{MINIMAL}"), format!("{redis}{MINIMAL}")] {
        let config = effective_of(&text);
        let (toml, json) = (config.effective_toml(), config.effective_json().to_string());
        for shown in [&toml, &json] {
            assert!(!shown.contains("hunter2"), "a secret is shown:\n{shown}");
            assert!(shown.contains(REDACTED), "{shown}");
        }
    }
    let json = effective_of(&format!("{redis}{MINIMAL}")).effective_json();
    assert_eq!(json["fences"]["url"], "redis://fg:<redacted>@127.0.0.1:6379/0");
    let json = effective_of(&format!("{SECRETS}{MINIMAL}")).effective_json();
    assert_eq!(json["admin"]["auth_token"], REDACTED);
    assert_eq!(json["admin"]["lease_tokens"][1]["token"], REDACTED);
    assert_eq!(json["admin"]["lease_tokens"][1]["prefixes"][0], "/b/");
    assert_eq!(json["fences"]["password"], REDACTED);
    assert_eq!(json["fences"]["user"], "fencegate");
}

#[test]
fn only_a_url_password_is_redacted() {
    assert_eq!(redact_password("redis://127.0.0.1:6379/0"), "redis://127.0.0.1:6379/0");
    assert_eq!(redact_password("rediss://u:p@h:1/0"), "rediss://u:<redacted>@h:1/0");
    assert_eq!(redact_password("redis://:p@h/0"), "redis://:<redacted>@h/0");
    assert_eq!(redact_password("redis://u@h/0"), "redis://u@h/0");
    assert_eq!(redact_password("redis://u:p:q@h/a@b"), "redis://u:<redacted>@h/a@b");
}

/// Every field is shown, defaults filled in as the process uses them.
#[test]
fn defaults_are_filled_in() {
    let json = effective_of(MINIMAL).effective_json();
    let server = json["server"].as_object().unwrap();
    for (field, value) in server {
        assert!(field == "tls" || !value.is_null(), "server.{field} is not filled in: {json}");
    }
    assert_eq!(json["server"]["listen"], "0.0.0.0:8080");
    assert_eq!(json["server"]["workers"], super::super::defaults::default_workers() as u64);
    assert_eq!(json["server"]["proxy_protocol"], "off");
    assert_eq!(json["server"]["trusted_proxies"], serde_json::json!([]));
    assert_eq!(json["fences"]["store"], "file");
    assert_eq!(json["fences"]["path"], "data/fences");
    assert_eq!(json["log"]["level"], "info");
    assert!(json["tracing"]["otlp_endpoint"].is_null(), "traces are off: {json}");
    assert_eq!(json["tracing"]["sample_ratio"], 1.0);
    assert_eq!(json["tracing"]["service_name"], "fencegate");
    let route = &json["route"][0];
    assert_eq!(route["key"], "{path}");
    assert_eq!(route["timeout"], "30s");
    assert_eq!(route["safe_methods"], serde_json::json!(["GET", "HEAD", "OPTIONS"]));
    assert_eq!(route["max_body"], 16 << 20);
    assert!(route.get("fenced_methods").is_none(), "{route}");
    for field in ["strict", "stream_body", "settle", "key_case", "non_utf8", "escaped_slashes", "upstream"] {
        assert!(!route[field].is_null(), "route.{field}: {route}");
    }
}

/// The TOML printed parses back as a config, and that config (its redacted
/// secrets put back) is in force the same: printing it again gives the same text.
#[test]
fn the_printed_toml_parses_back_to_the_same_config() {
    let extra = r#"
        [server]
        workers = 3
        max_header_bytes = "32KiB"
        abuse_penalty = "45s"
        proxy_protocol = "v2"
        trusted_proxies = ["10.1.2.3/8", "192.168.0.7"]
        [log]
        format = "json"
        [tracing]
        otlp_endpoint = "http://127.0.0.1:4318"
        sample_ratio = 0.25
    "#;
    let route = "pattern = \"/objects/{bucket}/{object*}\"\nkey = \"{bucket}|{object}\"\nstrict = true\n\
                 settle = \"0s\"\ntimeout = \"1m 30s\"\nmax_token_jump = 1000\n";
    let text = format!("{SECRETS}{extra}{MINIMAL}{route}");
    let printed = effective_of(&text).effective_toml();
    let mut n = 0;
    let restored = printed
        .split(REDACTED)
        .enumerate()
        .map(|(i, part)| {
            n = i;
            if i == 0 {
                part.to_string()
            } else {
                format!("secret-{i}{part}")
            }
        })
        .collect::<String>();
    assert_eq!(n, 4, "four secrets redacted:\n{printed}");
    let again = effective_of(&restored);
    assert_eq!(again.effective_toml(), printed);
    assert_eq!(again.server.trusted_proxies.len(), 2);
    assert!(printed.contains("trusted_proxies = [\"10.0.0.0/8\", \"192.168.0.7/32\"]"), "{printed}");
    assert!(printed.contains("timeout = \"1m 30s\""), "{printed}");
    assert!(printed.contains("otlp_endpoint = \"http://127.0.0.1:4318/v1/traces\""), "{printed}");
    assert_eq!(again.tracing.sample_ratio, 0.25);
    assert!(printed.contains("max_header_bytes = 32768"), "{printed}");
    assert!(printed.contains("pattern = \"/objects/{bucket}/{object*}\""), "{printed}");
}

/// A token read from a file shows as its path, never its content.
#[test]
fn an_admin_token_file_shows_as_its_path() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("token");
    std::fs::write(&file, "hunter2-from-file\n").unwrap();
    let text = format!("[admin]\nauth_token_file = '{}'\n{MINIMAL}", file.display());
    let config = effective_of(&text);
    assert_eq!(config.admin.auth_token.as_deref(), Some("hunter2-from-file"));
    let json = config.effective_json();
    assert_eq!(json["admin"]["auth_token_file"], file.display().to_string());
    assert!(json["admin"]["auth_token"].is_null(), "{json}");
    assert!(!config.effective_toml().contains("hunter2"));
}
