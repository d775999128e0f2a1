//! The real `fencegate` binary as a child process: CLI, `--check`, start-up
//! failures, logs, and graceful shutdown on SIGTERM/SIGINT.
//!
//! Every test listens on `127.0.0.1:0` and learns the bound addresses from the
//! JSON "fencegate listening" log line. A `Running` guard (`common::process`) kills the child when a
//! test fails, and prints what it logged.

use crate::common;

use std::io::{BufRead, BufReader};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::process::*;
use common::*;
use serde_json::Value;

/// A config on ephemeral loopback ports with one route `objects` to `upstream`.
fn serving_config(upstream: &RecordingUpstream) -> String {
    format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nshutdown_grace = \"30s\"\n\
         [admin]\nlisten = \"127.0.0.1:0\"\n\
         [fences]\nstore = \"memory\"\n\
         {}",
        route("objects", "/objects/", upstream, "")
    )
}

const VALID: &str = r#"
[server]
listen = "127.0.0.1:0"
[admin]
listen = "127.0.0.1:0"
[fences]
store = "memory"
[[route]]
name = "objects"
prefix = "/objects/"
upstream = "http://127.0.0.1:9000"
"#;

// ---------------------------------------------------------------- CLI, --check

#[test]
fn check_accepts_a_valid_config_and_says_ok() {
    let dir = TempDir::new();
    let path = dir.write("ok.toml", VALID);
    let out = run_to_exit(fencegate(dir.path()).arg("--config").arg(&path).arg("--check"));
    assert!(out.status.success(), "{:?}\nstderr: {}", out.status, text(&out.stderr));
    assert!(text(&out.stdout).contains("OK"), "stdout: {}", text(&out.stdout));
}

#[test]
fn check_names_every_field_with_a_problem() {
    let dir = TempDir::new();
    let path = dir.write(
        "bad.toml",
        r#"
[server]
listen = "localhost"
[[route]]
name = "a"
prefix = "/a/"
upstream = "htp://x"
timeout = "soon"
"#,
    );
    let out = run_to_exit(fencegate(dir.path()).arg("--config").arg(&path).arg("--check"));
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "a broken config passed --check; stdout: {}", text(&out.stdout));
    for field in ["server.listen", "route[0] 'a'.upstream", "route[0] 'a'.timeout"] {
        assert!(stderr.contains(field), "stderr does not name {field}:\n{stderr}");
    }
    assert!(stderr.contains("bad.toml"), "stderr does not name the file:\n{stderr}");
    assert!(!text(&out.stdout).contains("OK"), "stdout: {}", text(&out.stdout));
}

#[test]
fn check_names_an_unknown_field() {
    let dir = TempDir::new();
    // A typo in a route and an unknown server option: serde stops at the first.
    for (typo, config) in [
        ("fenced_method", format!("{VALID}fenced_method = [\"PUT\"]\n")),
        ("backlog", "[server]\nlisten = \"127.0.0.1:0\"\nbacklog = 5\n".to_string()),
    ] {
        let path = dir.write("typo.toml", &config);
        let out = run_to_exit(fencegate(dir.path()).arg("--config").arg(&path).arg("--check"));
        let stderr = text(&out.stderr);
        assert!(!out.status.success(), "unknown field {typo} passed --check");
        assert!(stderr.contains(typo), "stderr does not name {typo}:\n{stderr}");
    }
}

#[test]
fn a_missing_config_file_fails_and_names_the_file() {
    let dir = TempDir::new();
    let path = dir.path().join("no-such-file.toml");
    for check in [true, false] {
        let mut cmd = fencegate(dir.path());
        cmd.arg("--config").arg(&path);
        if check {
            cmd.arg("--check");
        }
        let out = run_to_exit(&mut cmd);
        let stderr = text(&out.stderr);
        assert!(!out.status.success(), "check={check}: a missing config file was accepted");
        assert!(stderr.contains("no-such-file.toml"), "check={check}: stderr does not name the file:\n{stderr}");
    }

    // Without --config or FENCEGATE_CONFIG the documented default is what is missing.
    let out = run_to_exit(fencegate(dir.path()).arg("--check"));
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("config/fencegate.toml"), "stderr: {}", text(&out.stderr));
}

#[test]
fn fencegate_config_env_is_used_when_config_is_absent() {
    let dir = TempDir::new();
    let path = dir.write("from-env.toml", VALID);
    let out = run_to_exit(fencegate(dir.path()).env("FENCEGATE_CONFIG", &path).arg("--check"));
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    assert!(text(&out.stdout).contains("from-env.toml"), "stdout: {}", text(&out.stdout));

    // The env var points at a broken file: it is really read.
    let broken = dir.write("broken.toml", "[server]\nlisten = \"nowhere\"\n");
    let out = run_to_exit(fencegate(dir.path()).env("FENCEGATE_CONFIG", &broken).arg("--check"));
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("server.listen"), "stderr: {}", text(&out.stderr));

    // --config wins over the env var.
    let out =
        run_to_exit(fencegate(dir.path()).env("FENCEGATE_CONFIG", &broken).arg("--config").arg(&path).arg("--check"));
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
}

#[test]
fn help_and_version_exit_zero() {
    let dir = TempDir::new();
    let out = run_to_exit(fencegate(dir.path()).arg("--help"));
    assert!(out.status.success(), "{:?}", out.status);
    let help = text(&out.stdout);
    for flag in ["--config", "--check", "--log-format", "FENCEGATE_CONFIG"] {
        assert!(help.contains(flag), "--help does not mention {flag}:\n{help}");
    }

    let out = run_to_exit(fencegate(dir.path()).arg("--version"));
    assert!(out.status.success(), "{:?}", out.status);
    assert!(text(&out.stdout).contains(env!("CARGO_PKG_VERSION")), "stdout: {}", text(&out.stdout));
}

#[test]
fn the_shipped_config_passes_check_from_the_repo_root() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    // Named explicitly, and found as the default path.
    for explicit in [true, false] {
        let mut cmd = fencegate(root);
        if explicit {
            cmd.args(["--config", "config/fencegate.toml"]);
        }
        let out = run_to_exit(cmd.arg("--check"));
        assert!(out.status.success(), "explicit={explicit}: {:?}\nstderr: {}", out.status, text(&out.stderr));
        assert!(text(&out.stdout).contains("OK"), "stdout: {}", text(&out.stdout));
    }
}

// ---------------------------------------------------------------- start-up

#[test]
fn a_listen_address_in_use_fails_start_up_and_names_the_address() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let dir = TempDir::new();
    for (section, config) in [
        ("server", format!("[server]\nlisten = \"{addr}\"\n[admin]\nlisten = \"127.0.0.1:0\"\n")),
        ("admin", format!("[server]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"{addr}\"\n")),
    ] {
        let config = format!(
            "{config}[fences]\nstore = \"memory\"\n[[route]]\nname = \"o\"\nprefix = \"/\"\nupstream = \"http://127.0.0.1:9\"\n"
        );
        let path = dir.write("in-use.toml", &config);
        let out = run_to_exit(fencegate(dir.path()).arg("--config").arg(&path));
        // The error is logged (stdout) in the configured format; look at both streams.
        let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
        assert!(!out.status.success(), "{section}: started although {addr} is taken:\n{all}");
        assert!(all.contains(&addr.to_string()), "{section}: the error does not name {addr}:\n{all}");
    }
    drop(taken);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_store_warns_loudly_that_fences_are_lost() {
    let up = RecordingUpstream::start().await;
    let mut fg = Running::start(&serving_config(&up)).await;
    let warning = fg
        .wait_event("the memory store warning", |e| {
            e["level"] == "WARN" && e["message"].as_str().is_some_and(|m| m.contains("memory") && m.contains("lost"))
        })
        .await;
    assert!(warning["message"].as_str().unwrap().contains("restart"), "{warning}");
    fg.signal("TERM");
    assert_eq!(fg.wait_exit().await.code(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_format_flag_overrides_the_config() {
    let up = RecordingUpstream::start().await;
    // The config asks for human lines; `--log-format json` (what Running passes) wins.
    let config = format!("[log]\nformat = \"human\"\n{}", serving_config(&up));
    let mut fg = Running::start(&config).await;
    assert!(!fg.events().is_empty());
    fg.signal("TERM");
    assert_eq!(fg.wait_exit().await.code(), Some(0));
}

// ---------------------------------------------------------------- access log

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_access_log_has_one_event_per_request_with_the_decision() {
    let up = RecordingUpstream::start().await;
    let mut fg = Running::start(&serving_config(&up)).await;
    assert_eq!(put(&fg.url("/objects/a"), 5, "v5").await.status, 200);
    put(&fg.url("/objects/a"), 4, "v4").await.problem(409);

    let is_access = |e: &Value| e["target"] == "fencegate::access";
    let stale = fg.wait_event("the stale access-log event", |e| is_access(e) && e["decision"] == "stale").await;
    let forwarded =
        fg.wait_event("the forwarded access-log event", |e| is_access(e) && e["decision"] == "forwarded").await;

    for (event, token, status) in [(&forwarded, 5, 200), (&stale, 4, 409)] {
        assert_eq!(event["route"], "objects", "{event}");
        assert_eq!(event["key"], "/objects/a", "{event}");
        assert_eq!(event["token"], token, "{event}");
        assert_eq!(event["status"], status, "{event}");
        assert!(event["latency_us"].is_u64(), "{event}");
        assert_eq!(event["client"], "127.0.0.1", "{event}");
        assert_eq!(event["level"], "INFO", "{event}");
    }
    assert_eq!(fg.events().iter().filter(|e| is_access(e)).count(), 2, "one access-log event per request");

    fg.signal("TERM");
    assert_eq!(fg.wait_exit().await.code(), Some(0));
    // Every line, to the last, is one JSON object (events() panics otherwise);
    // wait_exit has read the pipes to their end.
    assert!(!fg.events().is_empty());
}

// ---------------------------------------------------------------- shutdown

async fn metric(admin: &str, series: &str) -> Option<f64> {
    let text = get(admin).await.text();
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_in_flight_writes_then_exits_zero() {
    let up = RecordingUpstream::start().await;
    let mut fg = Running::start(&serving_config(&up)).await;
    assert_eq!(get(&fg.admin_url("/readyz")).await.status, 200);

    // A fenced write, held at the upstream when the signal arrives.
    let gate = up.hold("/objects/slow");
    let url = fg.url("/objects/slow");
    let held_put = tokio::spawn(async move { put(&url, 7, "drained").await });
    gate.wait_arrived().await;
    assert_eq!(metric(&fg.admin_url("/metrics"), "fencegate_active_keys").await, Some(1.0));

    fg.signal("TERM");

    // Draining: readiness turns 503 so load balancers stop sending.
    let start = Instant::now();
    loop {
        let r = get(&fg.admin_url("/readyz")).await;
        if r.status == 503 {
            r.problem(503);
            break;
        }
        assert!(start.elapsed() < DEADLINE, "/readyz never turned 503 after SIGTERM");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Health still answers: the process is alive, only draining.
    assert_eq!(get(&fg.admin_url("/healthz")).await.status, 200);

    // The proxy listener is closed: new connections are refused.
    let start = Instant::now();
    loop {
        match TcpStream::connect_timeout(&fg.proxy, Duration::from_secs(1)) {
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => break,
            other => {
                assert!(start.elapsed() < DEADLINE, "the proxy still accepts connections while draining: {other:?}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }

    // The in-flight write still completes and was applied.
    assert!(!held_put.is_finished(), "the held PUT was answered before the upstream let it go");
    gate.release();
    let reply = held_put.await.unwrap();
    assert_eq!(reply.status, 200, "body: {}", reply.text());
    let applied = up.applied_for("/objects/slow");
    assert_eq!(applied.len(), 1, "{applied:?}");
    assert_eq!(applied[0].token.as_deref(), Some("7"));
    assert_eq!(up.object("/objects/slow").unwrap(), "drained");

    let status = fg.wait_exit().await;
    assert_eq!(status.code(), Some(0), "{status}");
    fg.wait_event("the drained event", |e| e["message"] == "all connections drained").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_exits_zero() {
    let up = RecordingUpstream::start().await;
    let mut fg = Running::start(&serving_config(&up)).await;
    // Serving for real before the signal.
    assert_eq!(put(&fg.url("/objects/i"), 1, "x").await.status, 200);
    assert_eq!(get(&fg.admin_url("/healthz")).await.status, 200);

    fg.signal("INT");
    let status = fg.wait_exit().await;
    assert_eq!(status.code(), Some(0), "{status}");
    fg.wait_event("the SIGINT event", |e| e["message"] == "SIGINT received").await;
}

/// A supervisor (systemd, Kubernetes, a test) takes "fencegate listening" as
/// "up", and may stop the process right away. That stop must be graceful too.
#[test]
fn a_signal_right_after_listening_is_still_a_graceful_stop() {
    let dir = TempDir::new();
    let path = dir.write("fg.toml", VALID);
    let mut codes = Vec::new();
    for signal in ["TERM", "INT"].into_iter().cycle().take(20) {
        let mut child = ChildGuard(
            fencegate(dir.path())
                .arg("--config")
                .arg(&path)
                .args(["--log-format", "json"])
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
        let mut lines = BufReader::new(child.0.stdout.take().unwrap()).lines();
        let started = lines.by_ref().map_while(Result::ok).any(|l| l.contains("\"fencegate listening\""));
        assert!(started, "fencegate exited without logging \"fencegate listening\"");
        let pid = child.0.id().to_string();
        assert!(Command::new("kill").arg(format!("-{signal}")).arg(&pid).status().unwrap().success());
        let rest = std::thread::spawn(move || lines.map_while(Result::ok).count());
        let start = Instant::now();
        let status = loop {
            if let Some(status) = child.0.try_wait().unwrap() {
                break status;
            }
            assert!(start.elapsed() < DEADLINE, "fencegate did not exit after SIG{signal}");
            std::thread::sleep(Duration::from_millis(10));
        };
        let _ = rest.join();
        codes.push((signal, status));
    }
    // On unix a process killed by a signal has no exit code.
    let hard: Vec<_> = codes.iter().filter(|(_, s)| s.code() != Some(0)).collect();
    assert!(hard.is_empty(), "{} of {} stops were not graceful: {hard:?}", hard.len(), codes.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_serve_connections_on_threads_of_their_own() {
    let up = RecordingUpstream::start().await;
    let config = serving_config(&up).replacen("[server]\n", "[server]\nworkers = 3\n", 1);
    let mut fg = Running::start(&config).await;
    // The threads are named for their job (the kernel keeps 15 bytes of a name).
    let workers = || {
        std::fs::read_dir(format!("/proc/{}/task", fg.pid()))
            .unwrap()
            .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
            .filter(|name| name.starts_with("fencegate-work"))
            .count()
    };
    // The workers start beside the listeners: on a busy machine they may
    // not all be there the moment the proxy first answers.
    let deadline = Instant::now() + Duration::from_secs(10);
    while workers() < 3 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(workers(), 3, "one thread per configured worker");
    // Six client connections (one request each, then closed) are served,
    // whichever worker each lands on.
    for i in 0..6u64 {
        let reply =
            send("PUT", &fg.url(&format!("/objects/w{i}")), &[("x-fencing-token", "1"), ("connection", "close")], "v")
                .await;
        assert_eq!(reply.status, 200, "{}", reply.text());
    }
    assert_eq!(up.applied().len(), 6);
    fg.signal("TERM");
    assert_eq!(fg.wait_exit().await.code(), Some(0));
}
