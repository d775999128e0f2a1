//! A real `redis-server` per test, on a free loopback port, as a child
//! process: started, killed with -9, started again on the same data, flushed,
//! made a replica of another. `.ci/run` installs Redis when it is missing.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::process::{ChildGuard, TempDir, DEADLINE};

/// One `redis-server`, its data in a temp dir of its own.
pub struct Redis {
    child: Option<ChildGuard>,
    pub port: u16,
    dir: TempDir,
    /// `appendonly yes` with `appendfsync always`: a restart keeps every write.
    durable: bool,
    /// `--replicaof` this port.
    replica_of: Option<u16>,
    /// More server arguments (TLS, users), and what redis-cli then needs.
    extra: Vec<String>,
    cli_extra: Vec<String>,
}

/// A port nothing listens on now (bound, learned, released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

impl Redis {
    /// A Redis that keeps nothing on disk: a restart starts it empty.
    pub fn start() -> Redis {
        Redis::launch(false, None)
    }

    /// A Redis with an append-only file fsynced on every write: a restart
    /// (even after -9) keeps every write it acknowledged.
    pub fn start_durable() -> Redis {
        Redis::launch(true, None)
    }

    /// A Redis replicating `primary`; returns once it is in sync.
    pub fn start_replica_of(primary: &Redis) -> Redis {
        let replica = Redis::launch(false, Some(primary.port));
        let start = Instant::now();
        while !replica.cli(&["INFO", "replication"]).contains("master_link_status:up") {
            assert!(start.elapsed() < DEADLINE, "the replica did not sync within {DEADLINE:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
        replica
    }

    /// A Redis that speaks only TLS (`rediss://`) with the certificate and
    /// key files given, and whose only user is `user` with `password` (the
    /// default user is off).
    pub fn start_tls(cert: &Path, key: &Path, ca: &Path, user: &str, password: &str) -> Redis {
        let path = |p: &Path| p.display().to_string();
        let extra = vec![
            "--tls-cert-file".into(),
            path(cert),
            "--tls-key-file".into(),
            path(key),
            "--tls-ca-cert-file".into(),
            path(ca),
            "--tls-auth-clients".into(),
            "no".into(),
            "--user".into(),
            "default".into(),
            "off".into(),
            "--user".into(),
            user.into(),
            "on".into(),
            format!(">{password}"),
            "~*".into(),
            "+@all".into(),
        ];
        let cli_extra = vec![
            "--tls".into(),
            "--cacert".into(),
            path(ca),
            "--user".into(),
            user.into(),
            "--pass".into(),
            password.into(),
            "--no-auth-warning".into(),
        ];
        let mut redis = Redis {
            child: None,
            port: free_port(),
            dir: TempDir::new(),
            durable: false,
            replica_of: None,
            extra,
            cli_extra,
        };
        redis.run();
        redis
    }

    fn launch(durable: bool, replica_of: Option<u16>) -> Redis {
        let mut redis = Redis {
            child: None,
            port: free_port(),
            dir: TempDir::new(),
            durable,
            replica_of,
            extra: vec![],
            cli_extra: vec![],
        };
        redis.run();
        redis
    }

    fn run(&mut self) {
        let mut cmd = Command::new("redis-server");
        let tls = !self.extra.is_empty();
        let (port, tls_port) = if tls { (0, self.port) } else { (self.port, 0) };
        cmd.arg("--port")
            .arg(port.to_string())
            .arg("--tls-port")
            .arg(tls_port.to_string())
            .args(&self.extra)
            .arg("--bind")
            .arg("127.0.0.1")
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--save")
            .arg("")
            .arg("--daemonize")
            .arg("no");
        if self.durable {
            cmd.args(["--appendonly", "yes", "--appendfsync", "always"]);
        } else {
            cmd.args(["--appendonly", "no"]);
        }
        if let Some(primary) = self.replica_of {
            cmd.arg("--replicaof").arg("127.0.0.1").arg(primary.to_string());
        }
        let child = cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap_or_else(|e| {
            panic!("cannot start redis-server ({e}): install Redis (.ci/run does: apt-get install -y redis-server)")
        });
        self.child = Some(ChildGuard(child));
        let start = Instant::now();
        while self.try_cli(&["PING"]).as_deref() != Some("PONG") {
            assert!(start.elapsed() < DEADLINE, "redis-server did not answer PING within {DEADLINE:?}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// `redis://127.0.0.1:<port>/0`
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// The data directory (the append-only file, when durable).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// `redis-cli` with `args`; its output, trimmed. Panics when it fails.
    pub fn cli(&self, args: &[&str]) -> String {
        self.try_cli(args).unwrap_or_else(|| panic!("redis-cli {args:?} failed"))
    }

    fn try_cli(&self, args: &[&str]) -> Option<String> {
        let out = Command::new("redis-cli")
            .arg("-p")
            .arg(self.port.to_string())
            .args(&self.cli_extra)
            .args(args)
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
        (out.status.success() && !text.starts_with("Could not connect") && !text.starts_with("ERR")).then_some(text)
    }

    /// `kill -9`: returns once the process is gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.0.kill().unwrap();
            child.0.wait().unwrap();
        }
    }

    /// Starts the server again on the same port and data directory.
    pub fn restart(&mut self) {
        self.kill();
        self.run();
    }

    /// `FLUSHALL`: every key gone, as after a restart without persistence.
    pub fn flush(&self) {
        assert_eq!(self.cli(&["FLUSHALL"]), "OK");
    }
}

/// `[fences]` for the Redis store at `redis`, plus `extra` lines.
pub fn redis_store(redis: &Redis, extra: &str) -> String {
    format!("[fences]\nstore = \"redis\"\nurl = \"{}\"\n{extra}\n", redis.url())
}
