//! What ships for operators: the Grafana dashboard (`config/grafana/`) and
//! the Prometheus alerts (`config/prometheus/`) query only metrics fencegate
//! exports; the alerts pass `promtool check rules` and their unit tests; and
//! a real Prometheus server scrapes fencegate and answers a query about it.
//! `promtool` and `prometheus` come with Debian's `prometheus` package, which
//! `.ci/run` installs: these tests fail without it, as the Redis tests do
//! without `redis-server`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::certs::Ca;
use crate::common::process::{config_text, file_store, run_to_exit, start_in_process, text, ChildGuard, TempDir};
use crate::common::redis::{free_port, redis_store, Redis};
use crate::common::{get, put, route, send, RecordingUpstream};

const DASHBOARD: &str = "config/grafana/fencegate.json";
const ALERTS: &str = "config/prometheus/alerts.yaml";
const ALERT_TESTS: &str = "config/prometheus/alerts.test.yaml";

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Every `fencegate_*` name in `text`: the metrics a dashboard or rules file
/// queries (alert names are CamelCase, so they are not among them).
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("fencegate_") {
        let after = &rest[at..];
        let end = after.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(after.len());
        // Not the end of a longer identifier (`xfencegate_...`).
        let starts_a_name = rest[..at].chars().next_back().is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_'));
        if starts_a_name {
            names.insert(after[..end].to_string());
        }
        rest = &after[end..];
    }
    names
}

/// The names of the samples in a Prometheus text exposition: `_total`,
/// `_bucket`, `_sum` and `_count` as written.
fn sample_names(exposition: &str) -> BTreeSet<String> {
    exposition
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_string)
        .collect()
}

/// A fenced write, its stale copy, a read and a request no route takes:
/// every decision series the dashboard groups by shows.
async fn drive(proxy: &crate::common::Proxy) {
    assert_eq!(put(&proxy.url("/objects/a"), 5, "v5").await.status, 200);
    assert_eq!(put(&proxy.url("/objects/a"), 4, "v4").await.status, 409);
    assert_eq!(get(&proxy.url("/objects/a")).await.status, 200);
    assert_eq!(send("GET", &proxy.url("/elsewhere"), &[], "").await.status, 404);
}

/// The dashboard and the alerts name only metrics fencegate exports: the
/// union of two fencegates' scrapes, one on the Redis store (its round trips,
/// reconnects and trust), one on the file store serving TLS with a client CA
/// and an https route with its own CA and client certificate (the commit
/// histogram and every certificate's expiry).
#[tokio::test]
async fn the_dashboard_and_the_alerts_query_only_metrics_fencegate_exports() {
    let upstream = RecordingUpstream::start().await;
    let redis = Redis::start();
    let routes = route("objects", "/objects/", &upstream, "");
    let shared = start_in_process(&config_text("", &redis_store(&redis, ""), &routes)).await;
    drive(&shared).await;

    let dir = TempDir::new();
    let ca = Ca::new("observability CA");
    let served = ca.issue("fencegate");
    let client = ca.issue("fencegate client");
    let path = |name: &str, pem: &str| dir.write(name, pem).display().to_string();
    let tls = format!(
        "[server.tls]\ncert = '{}'\nkey = '{}'\nclient_ca = '{}'\n",
        path("tls.crt", &served.cert),
        path("tls.key", &served.key),
        path("ca.crt", &ca.pem()),
    );
    // Never connected to: only its files are read.
    let https = format!(
        "[[route]]\nname = \"secure\"\nprefix = \"/secure/\"\nupstream = \"https://127.0.0.1:9\"\n\
         ca_file = '{}'\nclient_cert = '{}'\nclient_key = '{}'\n",
        path("upstream-ca.crt", &ca.pem()),
        path("client.crt", &client.cert),
        path("client.key", &client.key),
    );
    let config = config_text("", &file_store(&dir.path().join("fences"), ""), &https).replacen(
        "[admin]",
        &format!("{tls}[admin]"),
        1,
    );
    let local = start_in_process(&config).await;

    let mut exported = BTreeSet::new();
    for proxy in [&shared, &local] {
        exported.extend(sample_names(&get(&proxy.admin_url("/metrics")).await.text()));
    }
    for path in [DASHBOARD, ALERTS] {
        let queried = metric_names(&read(path));
        assert!(queried.len() >= 5, "{path} names only {queried:?}");
        let missing: Vec<_> = queried.difference(&exported).collect();
        assert!(
            missing.is_empty(),
            "{path} queries metrics fencegate does not export: {missing:?}\nexported: {exported:?}"
        );
    }
    for certificate in ["served", "client_ca", "upstream_ca", "upstream_client"] {
        let line = format!("fencegate_tls_certificate_expiry_timestamp_seconds{{certificate=\"{certificate}\"");
        let scraped = get(&local.admin_url("/metrics")).await.text();
        assert!(scraped.contains(&line), "no expiry of the {certificate} certificate:\n{scraped}");
    }
}

/// The dashboard is one Grafana imports: a Prometheus datasource variable
/// that every panel's queries use, and the rows the operators' issue asked for.
#[test]
fn the_dashboard_is_a_grafana_dashboard_on_a_datasource_variable() {
    let dashboard: serde_json::Value = serde_json::from_str(&read(DASHBOARD)).expect("the dashboard is JSON");
    assert!(dashboard["schemaVersion"].as_u64().is_some_and(|v| v >= 36), "{}", dashboard["schemaVersion"]);
    let variables = dashboard["templating"]["list"].as_array().expect("templating variables");
    assert!(
        variables.iter().any(|v| v["name"] == "datasource" && v["type"] == "datasource" && v["query"] == "prometheus"),
        "no Prometheus datasource variable"
    );
    let panels = dashboard["panels"].as_array().expect("panels");
    let rows: Vec<&str> = panels.iter().filter(|p| p["type"] == "row").filter_map(|p| p["title"].as_str()).collect();
    for row in ["Requests", "Latency", "Waits for a turn", "Fence store", "Connections", "Certificates"] {
        assert!(rows.contains(&row), "no row {row:?} in {rows:?}");
    }
    for panel in panels.iter().filter(|p| p["type"] != "row") {
        assert_eq!(panel["datasource"]["uid"], "${datasource}", "panel {}", panel["title"]);
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "panel {} queries nothing", panel["title"]);
        for target in targets {
            assert_eq!(target["datasource"]["uid"], "${datasource}", "panel {}", panel["title"]);
            assert!(target["expr"].as_str().is_some_and(|e| e.contains("fencegate_")), "panel {}", panel["title"]);
        }
    }
}

/// `promtool`, which fails the test with a clear message when it is missing.
fn promtool(args: &[&str]) -> (bool, String) {
    let mut cmd = Command::new("promtool");
    cmd.args(args).current_dir(repo(""));
    if let Err(e) = Command::new("promtool").arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status() {
        panic!("promtool cannot be run ({e}): install Debian's `prometheus` package, as .ci/run does");
    }
    let out = run_to_exit(&mut cmd);
    (out.status.success(), format!("{}{}", text(&out.stdout), text(&out.stderr)))
}

/// The rules load, and every alert's unit tests pass, each alert tested
/// both firing and not.
#[test]
fn the_alerts_pass_promtool_and_their_unit_tests() {
    let (ok, out) = promtool(&["check", "rules", ALERTS]);
    assert!(ok, "promtool check rules:\n{out}");
    let (ok, out) = promtool(&["test", "rules", ALERT_TESTS]);
    assert!(ok, "promtool test rules:\n{out}");

    let alerts: Vec<String> =
        read(ALERTS).lines().filter_map(|l| l.trim().strip_prefix("- alert:").map(|a| a.trim().to_string())).collect();
    assert!(alerts.len() >= 7, "{alerts:?}");
    // Each test case as (alertname, whether it expects an alert).
    let mut cases = Vec::new();
    let tests = read(ALERT_TESTS);
    let mut lines = tests.lines().map(str::trim).peekable();
    while let Some(line) = lines.next() {
        if let Some(name) = line.strip_prefix("alertname:") {
            let expected = lines.next().unwrap_or_default();
            cases.push((name.trim().to_string(), expected != "exp_alerts: []"));
        }
    }
    for alert in &alerts {
        assert!(cases.contains(&(alert.clone(), true)), "no test of {alert} firing");
        assert!(cases.contains(&(alert.clone(), false)), "no test of {alert} not firing");
    }
}

/// A real Prometheus scrapes fencegate's admin listener (with the alerts
/// loaded) and answers a query for `fencegate_build_info` with fencegate's version.
#[tokio::test]
async fn a_real_prometheus_scrapes_fencegate_and_answers_a_query() {
    let upstream = RecordingUpstream::start().await;
    let dir = TempDir::new();
    let routes = route("objects", "/objects/", &upstream, "");
    let proxy = start_in_process(&config_text("", &file_store(&dir.path().join("fences"), ""), &routes)).await;
    drive(&proxy).await;

    let port = free_port();
    let config = dir.write(
        "prometheus.yml",
        &format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             rule_files: ['{}']\n\
             scrape_configs:\n  - job_name: fencegate\n    static_configs:\n      - targets: ['{}']\n",
            repo(ALERTS).display(),
            proxy.admin,
        ),
    );
    let mut cmd = Command::new("prometheus");
    cmd.arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.tsdb.path={}", dir.path().join("tsdb").display()))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(std::fs::File::create(dir.path().join("prometheus.log")).unwrap()));
    let _prometheus = ChildGuard(cmd.spawn().unwrap_or_else(|e| {
        panic!("prometheus cannot be run ({e}): install Debian's `prometheus` package, as .ci/run does")
    }));

    let query = format!("http://127.0.0.1:{port}/api/v1/query?query=fencegate_build_info");
    let deadline = Instant::now() + Duration::from_secs(60);
    let answer = loop {
        let answer =
            match tokio::time::timeout(Duration::from_secs(5), crate::common::client().get(query.parse().unwrap()))
                .await
            {
                Ok(Ok(response)) if response.status() == 200 => {
                    use http_body_util::BodyExt;
                    let body = response.into_body().collect().await.unwrap().to_bytes();
                    serde_json::from_slice::<serde_json::Value>(&body).ok()
                }
                _ => None,
            };
        if let Some(answer) = answer.filter(|a| a["data"]["result"].as_array().is_some_and(|r| !r.is_empty())) {
            break answer;
        }
        let log = std::fs::read_to_string(dir.path().join("prometheus.log")).unwrap_or_default();
        assert!(Instant::now() < deadline, "Prometheus never had fencegate_build_info; its log:\n{log}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let series = &answer["data"]["result"][0];
    assert_eq!(series["metric"]["version"], env!("CARGO_PKG_VERSION"), "{answer}");
    assert_eq!(series["metric"]["job"], "fencegate", "{answer}");
    assert_eq!(series["metric"]["instance"], proxy.admin.to_string(), "{answer}");
    assert_eq!(series["value"][1], "1", "{answer}");
}
