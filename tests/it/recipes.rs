//! The recipes of docs/recipes.md that run here: a token taken from the real
//! service (etcd's lock API through `etcdctl lock`, a Redis counter through
//! `redis-cli INCR`, a PostgreSQL sequence through `psql` under an advisory
//! lock), carried in `X-Fencing-Token`, and an older holder's late write
//! refused by fencegate.

use crate::common;

use std::path::{Path, PathBuf};
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

/// A PostgreSQL server of its own (Debian's `postgresql` package), in a temp
/// dir, on a Unix socket there and no TCP; stopped when dropped. PostgreSQL
/// refuses to run as root: as root, it runs as the package's `postgres` user.
struct Postgres {
    dir: TempDir,
    port: u16,
}

impl Postgres {
    fn bin(name: &str) -> PathBuf {
        let versions = std::fs::read_dir("/usr/lib/postgresql")
            .expect("PostgreSQL is installed (Debian package postgresql: .ci/run installs it)");
        let mut found: Vec<PathBuf> = versions.flatten().map(|v| v.path().join("bin").join(name)).collect();
        found.sort();
        found.pop().expect("a PostgreSQL version under /usr/lib/postgresql")
    }

    fn as_root() -> bool {
        Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout.starts_with(b"0\n"))
    }

    /// `program args` as the user PostgreSQL runs as.
    fn command(program: &Path) -> Command {
        if !Postgres::as_root() {
            return Command::new(program);
        }
        let mut cmd = Command::new("runuser");
        cmd.args(["-u", "postgres", "--"]).arg(program);
        cmd
    }

    fn run(cmd: &mut Command, what: &str) -> String {
        let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(out.status.success(), "{what}: {}{}", text(&out.stdout), text(&out.stderr));
        text(&out.stdout)
    }

    fn start() -> Postgres {
        let dir = TempDir::new();
        if Postgres::as_root() {
            Postgres::run(Command::new("chown").args(["postgres"]).arg(dir.path()), "chown postgres");
        }
        let data = dir.path().join("data");
        let initdb = Postgres::bin("initdb");
        Postgres::run(Postgres::command(&initdb).args(["-A", "trust", "-U", "postgres", "-D"]).arg(&data), "initdb");
        let port = free_port();
        let options = format!("-p {port} -k {} -c listen_addresses=''", dir.path().display());
        let pg_ctl = Postgres::bin("pg_ctl");
        let log = dir.path().join("log");
        Postgres::run(
            Postgres::command(&pg_ctl)
                .args(["-w", "-D"])
                .arg(&data)
                .args(["-l"])
                .arg(&log)
                .args(["-o", &options, "start"]),
            "pg_ctl start",
        );
        Postgres { dir, port }
    }

    /// `sql`, one statement per `-c`, in one session; the last line printed.
    fn session(&self, sql: &[&str]) -> String {
        let mut cmd = Postgres::command(Path::new("psql"));
        cmd.args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-U", "postgres", "-d", "postgres", "-h"])
            .arg(self.dir.path())
            .args(["-p", &self.port.to_string()]);
        for statement in sql {
            cmd.args(["-c", statement]);
        }
        let out = Postgres::run(&mut cmd, "psql");
        out.lines().last().unwrap_or_default().to_string()
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let pg_ctl = Postgres::bin("pg_ctl");
        let _ = Postgres::command(&pg_ctl)
            .args(["-m", "immediate", "-D"])
            .arg(self.dir.path().join("data"))
            .arg("stop")
            .output();
    }
}

#[tokio::test]
async fn a_postgresql_sequence_is_a_token_fencegate_enforces() {
    let pg = Postgres::start();
    let up = RecordingUpstream::start().await;
    let proxy = start_in_process(&config_text("", MEMORY_STORE, &route("objects", "/objects/", &up, ""))).await;
    // The recipe: the lock, then the token, in one session.
    let take = || {
        let token = pg.session(&[
            "CREATE SEQUENCE IF NOT EXISTS fencing_tokens",
            "SELECT pg_advisory_lock(hashtext('/objects/report'))",
            "SELECT nextval('fencing_tokens')",
        ]);
        token.trim().parse::<u64>().unwrap_or_else(|_| panic!("nextval gave {token:?}"))
    };
    let older = take();
    let newer = take();
    older_holder_is_fenced(&proxy, older, newer).await;
    assert_eq!(up.applied_for(KEY).len(), 2, "the late write never reached the upstream");
}
