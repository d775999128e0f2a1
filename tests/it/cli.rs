//! The operator's CLI as a process: `fencegate fence --admin-url ...` against a
//! real fencegate child whose config the CLI never sees, the config-only path
//! that reads no secret but the admin token, the errors an operator meets, and
//! the completions and man pages.

use crate::common;

use std::path::Path;
use std::process::{Command, Output};

use common::process::*;
use common::*;

const SECRET: &str = "cli-admin-secret";

/// `fencegate` run from `cwd` with `args`, to its exit.
fn run(cwd: &Path, args: &[&str]) -> Output {
    run_to_exit(fencegate(cwd).args(args))
}

fn run_with(cmd: &mut Command, args: &[&str]) -> Output {
    run_to_exit(cmd.args(args))
}

/// Asserts `out` exited with `code`; returns its stdout.
fn exited(out: &Output, code: i32) -> String {
    assert_eq!(out.status.code(), Some(code), "stdout: {}\nstderr: {}", text(&out.stdout), text(&out.stderr));
    text(&out.stdout)
}

/// A fencegate child on the memory store whose config directory is gone once
/// it listens: whatever the CLI does, it cannot read that config.
async fn server_without_its_config(up: &RecordingUpstream) -> Running {
    let site = TempDir::new();
    let token_file = site.write("admin-token", &format!("{SECRET}\n"));
    let admin = format!("auth_token_file = {}", toml_string(&token_file.display().to_string()));
    let config =
        site.write("fencegate.toml", &config_text(&admin, MEMORY_STORE, &route("objects", "/objects/", up, "")));
    let fg = Running::start_in(site.path(), &config).await;
    drop(site);
    assert!(!config.exists(), "the server's config is still there");
    fg
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_with_an_admin_url_needs_no_config() {
    let up = RecordingUpstream::start().await;
    let fg = server_without_its_config(&up).await;
    let laptop = TempDir::new();
    let token = laptop.write("token", &format!("  {SECRET}\n"));
    let url = format!("http://{}", fg.admin);
    // A config path that does not exist: with --admin-url it is never opened.
    let flags = |args: &[&str]| -> Vec<String> {
        let mut all: Vec<String> = ["--config", "/nonexistent/fencegate.toml", "fence", "--admin-url", &url]
            .iter()
            .map(|s| s.to_string())
            .collect();
        all.extend(["--token-file".to_string(), token.display().to_string()]);
        all.extend(args.iter().map(|s| s.to_string()));
        all
    };
    let fence = |args: &[&str]| {
        let all = flags(args);
        run(laptop.path(), &all.iter().map(String::as_str).collect::<Vec<_>>())
    };

    let said = exited(&fence(&["set", "/objects/a", "5"]), 0);
    assert!(said.contains("/objects/a: fence raised to 5 (was none)"), "{said}");
    assert_eq!(exited(&fence(&["get", "/objects/a"]), 0).trim(), "5");
    assert_eq!(exited(&fence(&["get", "/objects/none"]), 0).trim(), "none");
    // The fence the CLI raised is the proxy's: an older owner is refused.
    put(&fg.url("/objects/a"), 4, "stale").await.problem(409);
    assert!(up.applied_for("/objects/a").is_empty());
    // A fence never goes back: exit 1, nothing changed.
    let out = fence(&["set", "/objects/a", "3"]);
    exited(&out, 1);
    assert!(text(&out.stderr).contains("already 5"), "{}", text(&out.stderr));
    assert_eq!(exited(&fence(&["list", "/objects/"]), 0), "5\t/objects/a\n");
    // The flags also go after the action.
    let out =
        run(laptop.path(), &["fence", "get", "/objects/a", "--admin-url", &fg.admin.to_string(), "--timeout", "5s"]);
    assert_eq!(exited(&out, 0).trim(), "5");

    // The same through the environment: FENCEGATE_ADMIN_URL and the token
    // itself, or a file naming it.
    let mut env = fencegate(laptop.path());
    env.env("FENCEGATE_ADMIN_URL", &url).env("FENCEGATE_ADMIN_TOKEN", SECRET);
    assert!(exited(&run_with(&mut env, &["fence", "set", "/objects/a", "6"]), 0).contains("raised to 6"));
    let mut env = fencegate(laptop.path());
    env.env("FENCEGATE_ADMIN_URL", &url).env("FENCEGATE_ADMIN_TOKEN_FILE", &token);
    assert!(exited(&run_with(&mut env, &["fence", "set", "/objects/a", "7"]), 0).contains("raised to 7"));
    let said = exited(&fence(&["delete", "--key", "/objects/a"]), 0);
    assert!(said.contains("fence 7 deleted"), "{said}");
    assert_eq!(exited(&fence(&["get", "/objects/a"]), 0).trim(), "none");
    assert_eq!(put(&fg.url("/objects/a"), 1, "new owner").await.status, 200);
}

/// Without --admin-url, a copy of the config gives the admin address and
/// token; the other secret files it names (a signing key, an upstream's CA)
/// are not on the operator's machine, and are not read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_from_a_config_reads_no_secret_but_the_admin_token() {
    let up = RecordingUpstream::start().await;
    let fg = server_without_its_config(&up).await;
    let laptop = TempDir::new();
    let token = laptop.write("token", SECRET);
    let copy = laptop.write(
        "fencegate.toml",
        &format!(
            "[admin]\nlisten = \"{}\"\nauth_token_file = {}\n\
             [fences]\nstore = \"redis\"\nurl = \"redis://user:password@127.0.0.1:1/0\"\n\
             [[route]]\nname = \"objects\"\nprefix = \"/objects/\"\nupstream = \"http://127.0.0.1:9\"\n\
             signing_key_file = \"/nonexistent/signing.key\"\n\
             [[route]]\nname = \"secure\"\nprefix = \"/secure/\"\nupstream = \"https://store.internal:443\"\n\
             ca_file = \"/nonexistent/ca.pem\"\n",
            fg.admin,
            toml_string(&token.display().to_string())
        ),
    );
    let config = copy.display().to_string();
    // The server could not start on it: its secrets are elsewhere.
    let out = run(laptop.path(), &["--config", &config, "--check"]);
    exited(&out, 2);
    assert!(text(&out.stderr).contains("signing_key_file"), "{}", text(&out.stderr));

    let said = exited(&run(laptop.path(), &["--config", &config, "fence", "set", "/objects/b", "9"]), 0);
    assert!(said.contains("raised to 9"), "{said}");
    assert_eq!(exited(&run(laptop.path(), &["--config", &config, "fence", "get", "/objects/b"]), 0).trim(), "9");
    // --token-file wins over the config's token.
    let wrong = laptop.write("wrong", "not-the-token");
    let out = run(
        laptop.path(),
        &["--config", &config, "fence", "--token-file", &wrong.display().to_string(), "set", "/objects/b", "10"],
    );
    exited(&out, 2);
    assert!(text(&out.stderr).contains("not the server's"), "{}", text(&out.stderr));

    // A config that does not validate is named, field and all, with the way around it.
    let broken = laptop.write("broken.toml", "[admin]\nlisten = \"nowhere\"\n");
    let out = run(laptop.path(), &["--config", &broken.display().to_string(), "fence", "get", "/objects/b"]);
    exited(&out, 2);
    let stderr = text(&out.stderr);
    assert!(stderr.contains("admin.listen") && stderr.contains("--admin-url"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_errors_say_what_to_do() {
    let up = RecordingUpstream::start().await;
    let fg = server_without_its_config(&up).await;
    let laptop = TempDir::new();
    let dir = laptop.path();
    let admin = fg.admin.to_string();
    let fails = |args: &[&str]| {
        let out = run(dir, args);
        exited(&out, 2);
        text(&out.stderr)
    };

    // Reads need no token; changes do, and the error says how to give it.
    assert_eq!(exited(&run(dir, &["fence", "--admin-url", &admin, "get", "/objects/a"]), 0).trim(), "none");
    let stderr = fails(&["fence", "--admin-url", &admin, "set", "/objects/a", "1"]);
    assert!(stderr.contains("401") && stderr.contains("no admin token was given"), "{stderr}");
    assert!(stderr.contains("--token-file") && stderr.contains("FENCEGATE_ADMIN_TOKEN"), "{stderr}");
    let wrong = laptop.write("wrong", "wrong-token");
    let stderr =
        fails(&["fence", "--admin-url", &admin, "--token-file", &wrong.display().to_string(), "set", "/a", "1"]);
    assert!(stderr.contains("not the server's"), "{stderr}");
    let stderr = fails(&["fence", "--admin-url", &admin, "--token-file", "/nonexistent/token", "get", "/a"]);
    assert!(stderr.starts_with("--token-file: cannot read '/nonexistent/token'"), "{stderr}");
    let empty = laptop.write("empty", " \n");
    let stderr = fails(&["fence", "--admin-url", &admin, "--token-file", &empty.display().to_string(), "get", "/a"]);
    assert!(stderr.contains("is empty"), "{stderr}");

    // Bad URLs are refused before anything is sent.
    let stderr = fails(&["fence", "--admin-url", &format!("https://{admin}"), "get", "/a"]);
    assert!(stderr.contains("plain HTTP"), "{stderr}");
    let stderr = fails(&["fence", "--admin-url", "http://not a url", "get", "/a"]);
    assert!(stderr.contains("is not a URL like http://127.0.0.1:9901"), "{stderr}");
    for with_secret in [format!("http://admin:{SECRET}@{admin}"), format!("https://admin:{SECRET}@{admin}")] {
        let stderr = fails(&["fence", "--admin-url", &with_secret, "get", "/a"]);
        assert!(stderr.contains("not in the URL") && !stderr.contains(SECRET), "{stderr}");
    }

    // The proxy listener is not the admin listener.
    let stderr = fails(&["fence", "--admin-url", &fg.proxy.to_string(), "get", "/a"]);
    assert!(stderr.contains("not its proxy listener"), "{stderr}");

    // Nothing listening: the address is named, with what to check.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let stderr = fails(&["fence", "--admin-url", &closed.to_string(), "get", "/a"]);
    assert!(stderr.contains(&format!("cannot reach the admin API at http://{closed}")), "{stderr}");
    assert!(stderr.contains("[admin] listen"), "{stderr}");

    // An admin listener that accepts and never answers: the timeout.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = silent.local_addr().unwrap().to_string();
    let stderr = fails(&["fence", "--admin-url", &addr, "--timeout", "300ms", "get", "/a"]);
    assert!(stderr.contains("did not answer within 300ms"), "{stderr}");
    drop(silent);
}

#[test]
fn completions_name_every_subcommand_and_flag() {
    let dir = TempDir::new();
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let script = exited(&run(dir.path(), &["completions", shell]), 0);
        for word in ["fence", "confirm-store", "admin-url", "token-file", "sign", "completions"] {
            assert!(script.contains(word), "{shell}: no '{word}' in the completions");
        }
    }
    let out = run(dir.path(), &["completions", "tcsh"]);
    exited(&out, 2);
    assert!(text(&out.stderr).contains("possible values"), "{}", text(&out.stderr));
}

/// A stdout that cannot be written (a full disk) is an error message and
/// exit 1, not a panic.
#[test]
fn a_full_stdout_is_an_error_not_a_panic() {
    let dir = TempDir::new();
    for args in [&["completions", "bash"][..], &["man"]] {
        let full = std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap();
        let out = fencegate(dir.path()).args(args).stdout(full).output().unwrap();
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains("cannot write") && !stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}

#[test]
fn the_man_page_documents_every_subcommand() {
    let dir = TempDir::new();
    let page = exited(&run(dir.path(), &["man"]), 0);
    assert!(page.contains(".TH fencegate 1"), "{page}");
    for word in ["fence", "sign", "completions", "FENCEGATE_CONFIG"] {
        assert!(page.contains(word), "no '{word}' in the man page");
    }

    let pages = TempDir::new();
    exited(&run(dir.path(), &["man", "--dir", &pages.path().display().to_string()]), 0);
    for name in ["fencegate.1", "fencegate-fence.1", "fencegate-fence-get.1", "fencegate-fence-confirm-store.1"] {
        assert!(pages.path().join(name).is_file(), "no {name}");
    }
    let fence = std::fs::read_to_string(pages.path().join("fencegate-fence.1")).unwrap();
    for word in ["admin\\-url", "FENCEGATE_ADMIN_URL", "token\\-file", "FENCEGATE_ADMIN_TOKEN_FILE"] {
        assert!(fence.contains(word), "no '{word}' in fencegate-fence.1:\n{fence}");
    }
    let out = run(dir.path(), &["man", "--dir", "/nonexistent/man1"]);
    exited(&out, 1);
    assert!(text(&out.stderr).contains("/nonexistent/man1"), "{}", text(&out.stderr));
}

/// `fence list | head` and a full disk end the command without a panic: a
/// reader that went away is no error (exit 0), a failed write is (exit 2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_output_to_a_closed_pipe_or_a_full_disk_is_no_panic() {
    let up = RecordingUpstream::start().await;
    let fg = server_without_its_config(&up).await;
    let laptop = TempDir::new();
    let token = laptop.write("token", SECRET);
    let admin = fg.admin.to_string();
    let token = token.display().to_string();
    exited(&run(laptop.path(), &["fence", "--admin-url", &admin, "--token-file", &token, "set", "/objects/a", "1"]), 0);

    // The reader is gone before the first line is written.
    let mut child = fencegate(laptop.path())
        .args(["fence", "--admin-url", &admin, "list"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");

    let full = std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap();
    let out = fencegate(laptop.path())
        .args(["fence", "--admin-url", &admin, "get", "/objects/a"])
        .stdout(full)
        .output()
        .unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.starts_with("cannot write to stdout"), "{stderr}");
}
