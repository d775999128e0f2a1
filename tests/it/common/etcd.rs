//! A real etcd cluster per test: 1 or 3 `etcd` members as child processes on
//! free loopback ports, each with its data directory and log file in a temp
//! dir of the cluster's own. Members are killed with -9 and started again on
//! the same data, frozen with SIGSTOP and thawed with SIGCONT; the whole
//! cluster can be replaced by a brand-new one on the same client URLs (a
//! different cluster id, revisions starting over), as after a restore.
//!
//! The tests look inside etcd with `etcd_client` (`etcdctl` only restores a
//! snapshot).
//! Timing is fast for tests: heartbeats every 50 ms, elections after 500 ms.
//! The data lives on tmpfs (`/dev/shm`) when there is one: an fsync there
//! costs nothing on a loaded machine, and a member killed with -9 loses
//! nothing it wrote (the page cache outlives the process).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use etcd_client::{Client, ConnectOptions, GetOptions};

use super::process::{toml_string, ChildGuard, DEADLINE};
use super::redis::free_port;

/// A key outside any store's prefix, written to see the cluster take writes.
pub const PROBE_KEY: &str = "etcd-harness/probe";

/// One member: its ports, its directory (data and log), its process.
struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    dir: PathBuf,
    child: Option<ChildGuard>,
    stopped: bool,
}

impl Member {
    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    fn peer_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.peer_port)
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join("etcd.log")
    }

    fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.0.id())
    }

    /// Whether it runs and is not frozen.
    fn live(&self) -> bool {
        self.child.is_some() && !self.stopped
    }
}

/// A cluster of `etcd` members on loopback; dropping it kills every member.
pub struct EtcdCluster {
    members: Vec<Member>,
    /// `--initial-cluster-token`: unique per cluster (and per replacement).
    token: String,
    /// How many times the cluster was replaced by a new one.
    generation: usize,
    dir: tempfile::TempDir,
}

/// A temp dir on tmpfs when there is one, else under the system temp dir.
fn cluster_dir() -> tempfile::TempDir {
    let mut builder = tempfile::Builder::new();
    builder.prefix("fencegate-etcd-");
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        if let Ok(dir) = builder.tempdir_in(shm) {
            return dir;
        }
    }
    builder.tempdir().expect("a temp dir can be created")
}

fn new_token() -> String {
    format!("fencegate-test-{:016x}", rand::random::<u64>())
}

/// Options for a test client: short connection and request timeouts, so a
/// dead or frozen member fails a call instead of hanging the test.
fn options() -> ConnectOptions {
    ConnectOptions::new().with_connect_timeout(Duration::from_secs(2)).with_timeout(Duration::from_secs(3))
}

impl EtcdCluster {
    /// Starts `members` (1 or 3) members and returns once the cluster answers
    /// a write (put and get of [`PROBE_KEY`]), within [`DEADLINE`].
    pub async fn start(members: usize) -> EtcdCluster {
        assert!(members == 1 || members == 3, "a test cluster has 1 or 3 members, not {members}");
        // A port learned free may be taken by another test before etcd
        // binds it: a member that exits at once is started again, on other
        // ports (a later exit is the test's business).
        for attempt in 1.. {
            let dir = cluster_dir();
            let mut cluster = EtcdCluster { members: Vec::new(), token: new_token(), generation: 0, dir };
            for i in 0..members {
                let member = Member {
                    name: format!("m{i}"),
                    client_port: free_port(),
                    peer_port: free_port(),
                    dir: cluster.member_dir(i),
                    child: None,
                    stopped: false,
                };
                std::fs::create_dir_all(&member.dir).unwrap();
                cluster.members.push(member);
            }
            for i in 0..members {
                cluster.spawn(i, "new");
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
            let exited = (0..members)
                .find(|&i| cluster.members[i].child.as_mut().is_some_and(|c| c.0.try_wait().ok().flatten().is_some()));
            match exited {
                Some(i) if attempt < 3 => {
                    eprintln!(
                        "etcd member {i} exited at start (attempt {attempt}); again on other ports\n{}",
                        cluster.log(i)
                    );
                    continue;
                }
                _ => {}
            }
            cluster.wait_writable().await;
            return cluster;
        }
        unreachable!("the loop returns")
    }

    fn member_dir(&self, i: usize) -> PathBuf {
        self.dir.path().join(format!("g{}", self.generation)).join(format!("m{i}"))
    }

    fn initial_cluster(&self) -> String {
        self.members.iter().map(|m| format!("{}={}", m.name, m.peer_url())).collect::<Vec<_>>().join(",")
    }

    /// Starts member `i`'s process (`state`: `new` or `existing`).
    fn spawn(&mut self, i: usize, state: &str) {
        let initial = self.initial_cluster();
        let m = &self.members[i];
        assert!(m.child.is_none(), "member {i} already runs");
        let log = File::options().create(true).append(true).open(m.log_path()).unwrap();
        let mut cmd = Command::new("etcd");
        cmd.arg("--name")
            .arg(&m.name)
            .arg("--data-dir")
            .arg(m.data_dir())
            .arg("--listen-client-urls")
            .arg(m.endpoint())
            .arg("--advertise-client-urls")
            .arg(m.endpoint())
            .arg("--listen-peer-urls")
            .arg(m.peer_url())
            .arg("--initial-advertise-peer-urls")
            .arg(m.peer_url())
            .arg("--initial-cluster")
            .arg(&initial)
            .arg("--initial-cluster-state")
            .arg(state)
            .arg("--initial-cluster-token")
            .arg(&self.token)
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            .args(["--logger", "zap", "--log-outputs", "stderr"]);
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start etcd ({e}): install etcd 3.4 or later on PATH"));
        let m = &mut self.members[i];
        m.child = Some(ChildGuard(child));
        m.stopped = false;
    }

    /// Fails, with the members' logs, if a member that should run has exited.
    fn assert_running(&mut self) {
        for i in 0..self.members.len() {
            let exited = match self.members[i].child.as_mut() {
                Some(child) => child.0.try_wait().unwrap(),
                None => None,
            };
            if let Some(status) = exited {
                panic!("etcd member {i} exited ({status}):\n{}", self.log(i));
            }
        }
    }

    /// Waits until a put and a get of [`PROBE_KEY`] through the live members succeed.
    async fn wait_writable(&mut self) {
        let start = Instant::now();
        loop {
            self.assert_running();
            let value = format!("{:?}", start.elapsed());
            let last = match self.try_client().await {
                Ok(mut client) => match client.put(PROBE_KEY, value.clone(), None).await {
                    Ok(_) => match client.get(PROBE_KEY, None).await {
                        Ok(r) if r.kvs().first().map(|kv| kv.value()) == Some(value.as_bytes()) => return,
                        Ok(r) => format!("the probe read back {:?}", r.kvs()),
                        Err(e) => e.to_string(),
                    },
                    Err(e) => e.to_string(),
                },
                Err(e) => e.to_string(),
            };
            assert!(
                start.elapsed() < DEADLINE,
                "the etcd cluster took no write within {DEADLINE:?} (last: {last})\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `http://127.0.0.1:<client port>` of every member, live or not.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(Member::endpoint).collect()
    }

    /// Member `i`'s client URL.
    pub fn endpoint(&self, i: usize) -> String {
        self.members[i].endpoint()
    }

    /// The endpoints as a TOML array: `["http://127.0.0.1:1", ...]`.
    pub fn toml_endpoints(&self) -> String {
        toml_endpoints(&self.endpoints())
    }

    /// How many members the cluster has.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// The process id of member `i`, while it runs.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.members[i].pid()
    }

    /// `kill -9` of member `i`; returns once the process is gone.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].child.take() {
            child.0.kill().unwrap();
            child.0.wait().unwrap();
        }
        self.members[i].stopped = false;
    }

    /// Starts member `i` again on the same data dir and ports
    /// (`--initial-cluster-state existing`); returns once it answers a
    /// status call (it may not have a leader yet: see [`Self::wait_rejoined`]).
    pub async fn restart(&mut self, i: usize) {
        self.kill(i);
        self.spawn(i, "existing");
        let start = Instant::now();
        loop {
            self.assert_running();
            if self.status(i).await.is_ok() {
                return;
            }
            assert!(
                start.elapsed() < DEADLINE,
                "restarted member {i} did not answer within {DEADLINE:?}\n{}",
                self.log(i)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until member `i` serves a linearizable read of [`PROBE_KEY`]
    /// through its own endpoint alone: it has a leader and caught up.
    pub async fn wait_rejoined(&mut self, i: usize) {
        let start = Instant::now();
        loop {
            self.assert_running();
            let last = match Client::connect([self.endpoint(i)], Some(options())).await {
                Ok(mut client) => match client.get(PROBE_KEY, None).await {
                    Ok(_) => return,
                    Err(e) => e.to_string(),
                },
                Err(e) => e.to_string(),
            };
            assert!(
                start.elapsed() < DEADLINE,
                "member {i} did not serve a linearizable read within {DEADLINE:?} (last: {last})\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until the cluster takes a write again (after a quorum came back).
    pub async fn wait_quorum(&mut self) {
        self.wait_writable().await;
    }

    /// Sends `signal` to member `i` with the `kill` command (no libc in the tests).
    fn signal(&self, i: usize, signal: &str) {
        let pid = self.members[i].pid().unwrap_or_else(|| panic!("member {i} does not run"));
        let status = Command::new("kill").arg(format!("-{signal}")).arg(pid.to_string()).status().unwrap();
        assert!(status.success(), "kill -{signal} {pid} failed: {status}");
    }

    /// SIGSTOP: member `i` freezes (its sockets stay open, it answers nothing).
    pub fn stop(&mut self, i: usize) {
        self.signal(i, "STOP");
        self.members[i].stopped = true;
    }

    /// SIGCONT: member `i` goes on.
    pub fn cont(&mut self, i: usize) {
        self.signal(i, "CONT");
        self.members[i].stopped = false;
    }

    /// Whether member `i` runs and is not frozen.
    pub fn is_live(&self, i: usize) -> bool {
        self.members[i].live()
    }

    /// Member `i`'s status, asked through its own endpoint alone.
    pub async fn status(&self, i: usize) -> Result<etcd_client::StatusResponse, etcd_client::Error> {
        let mut client = Client::connect([self.endpoint(i)], Some(options())).await?;
        client.status().await
    }

    /// Which member leads now, as the live members see it: a member whose
    /// status names itself as leader. Waits up to [`DEADLINE`] for one.
    pub async fn leader(&self) -> usize {
        self.wait_leader(None, DEADLINE).await
    }

    /// Waits up to `within` for a leader other than `not` (any when `None`); returns it.
    pub async fn wait_leader(&self, not: Option<usize>, within: Duration) -> usize {
        let start = Instant::now();
        loop {
            if let Some(leader) = self.current_leader().await {
                if Some(leader) != not {
                    return leader;
                }
            }
            assert!(start.elapsed() < within, "no etcd leader (other than {not:?}) within {within:?}\n{}", self.logs());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The live member that says it leads, if one does now.
    pub async fn current_leader(&self) -> Option<usize> {
        for i in 0..self.members.len() {
            if !self.is_live(i) {
                continue;
            }
            let Ok(status) = self.status(i).await else { continue };
            let id = status.header().map(|h| h.member_id()).unwrap_or_default();
            if id != 0 && status.leader() == id {
                return Some(i);
            }
        }
        None
    }

    /// The cluster id the live members answer with (from any of them).
    pub async fn cluster_id(&self) -> u64 {
        for i in 0..self.members.len() {
            if self.is_live(i) {
                if let Ok(status) = self.status(i).await {
                    if let Some(h) = status.header() {
                        return h.cluster_id();
                    }
                }
            }
        }
        panic!("no live etcd member answered its status\n{}", self.logs())
    }

    /// A client of every live member's endpoint.
    pub async fn try_client(&self) -> Result<Client, etcd_client::Error> {
        let live: Vec<String> =
            (0..self.members.len()).filter(|&i| self.is_live(i)).map(|i| self.endpoint(i)).collect();
        Client::connect(live, Some(options())).await
    }

    /// A client of every live member's endpoint; panics if none connects.
    pub async fn client(&self) -> Client {
        self.try_client().await.unwrap_or_else(|e| panic!("cannot connect to etcd: {e}\n{}", self.logs()))
    }

    /// Runs `call` with a fresh client until it succeeds; fails after [`DEADLINE`].
    async fn retrying<T, F, Fut>(&self, what: &str, mut call: F) -> T
    where
        F: FnMut(Client) -> Fut,
        Fut: std::future::Future<Output = Result<T, etcd_client::Error>>,
    {
        let start = Instant::now();
        loop {
            let last = match self.try_client().await {
                Ok(client) => match call(client).await {
                    Ok(v) => return v,
                    Err(e) => e.to_string(),
                },
                Err(e) => e.to_string(),
            };
            assert!(start.elapsed() < DEADLINE, "{what} failed for {DEADLINE:?} (last: {last})\n{}", self.logs());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The value of `key` (a linearizable read), if it exists.
    pub async fn get(&self, key: &str) -> Option<String> {
        let key = key.to_string();
        self.retrying(&format!("reading {key}"), |mut c| {
            let key = key.clone();
            async move {
                let r = c.get(key, None).await?;
                Ok(r.kvs().first().map(|kv| String::from_utf8_lossy(kv.value()).into_owned()))
            }
        })
        .await
    }

    /// The cluster's revision now: the header of a linearizable read. It
    /// moves by one per transaction that writes (a put, a delete, a
    /// transaction of several), and not for reads, leases or keep-alives.
    pub async fn revision(&self) -> i64 {
        self.retrying("reading the revision", |mut c| async move {
            let r = c.get(PROBE_KEY, None).await?;
            Ok(r.header().map(|h| h.revision()).expect("etcd answers a read with a header"))
        })
        .await
    }

    /// The lease `key` is attached to (0: none), if the key exists.
    pub async fn lease_of(&self, key: &str) -> Option<i64> {
        let key = key.to_string();
        self.retrying(&format!("reading {key}"), |mut c| {
            let key = key.clone();
            async move { Ok(c.get(key, None).await?.kvs().first().map(|kv| kv.lease())) }
        })
        .await
    }

    /// The TTL lease `id` was granted with, in seconds (-1: no such lease).
    pub async fn lease_granted_ttl(&self, id: i64) -> i64 {
        self.retrying(&format!("reading lease {id:x}"), |mut c| async move {
            Ok(c.lease_time_to_live(id, None).await?.granted_ttl())
        })
        .await
    }

    /// How many keys start with `prefix`.
    pub async fn count_prefix(&self, prefix: &str) -> usize {
        let prefix = prefix.to_string();
        self.retrying(&format!("counting {prefix}"), |mut c| {
            let prefix = prefix.clone();
            async move {
                let r = c.get(prefix, Some(GetOptions::new().with_prefix().with_count_only())).await?;
                Ok(usize::try_from(r.count()).unwrap())
            }
        })
        .await
    }

    /// The keys that start with `prefix`, in byte order.
    pub async fn keys_with_prefix(&self, prefix: &str) -> Vec<String> {
        let prefix = prefix.to_string();
        self.retrying(&format!("listing {prefix}"), |mut c| {
            let prefix = prefix.clone();
            async move {
                let r = c.get(prefix, Some(GetOptions::new().with_prefix().with_keys_only())).await?;
                Ok(r.kvs().iter().map(|kv| String::from_utf8_lossy(kv.key()).into_owned()).collect())
            }
        })
        .await
    }

    /// Puts `key` = `value` (what an operator, or a bad restore, could do).
    pub async fn put(&self, key: &str, value: &str) {
        let (key, value) = (key.to_string(), value.to_string());
        self.retrying(&format!("writing {key}"), |mut c| {
            let (key, value) = (key.clone(), value.clone());
            async move { c.put(key, value, None).await.map(|_| ()) }
        })
        .await
    }

    /// Saves a snapshot of the cluster's data to `path` (maintenance snapshot).
    pub async fn snapshot_save(&self, path: &Path) {
        use std::io::Write;
        let mut client = self.client().await;
        let mut stream = client.snapshot().await.unwrap_or_else(|e| panic!("snapshot: {e}"));
        let mut file = File::create(path).unwrap();
        while let Some(part) = stream.message().await.unwrap_or_else(|e| panic!("snapshot: {e}")) {
            file.write_all(part.blob()).unwrap();
        }
        file.sync_all().unwrap();
    }

    /// Kills every member, then starts a brand-new empty cluster (new data
    /// dirs, a new `--initial-cluster-token`, so a new cluster id) on the
    /// same client and peer ports: clients of the old one reconnect to a
    /// different cluster whose revisions start over. Returns once it takes writes.
    pub async fn replace_with_new_cluster(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
        self.generation += 1;
        self.token = new_token();
        for i in 0..self.members.len() {
            let dir = self.member_dir(i);
            std::fs::create_dir_all(&dir).unwrap();
            self.members[i].dir = dir;
        }
        for i in 0..self.members.len() {
            self.spawn(i, "new");
        }
        self.wait_writable().await;
    }

    /// Kills every member, then restores each from `snapshot` (taken with
    /// [`Self::snapshot_save`]) with `etcdctl snapshot restore`, as an
    /// operator restores a lost cluster: same member names, URLs and
    /// `--initial-cluster-token`, so the same cluster id, at the snapshot's
    /// revision (below what the replicas saw since). Returns once it takes
    /// writes. `.ci/run` installs `etcdctl` (Debian's `etcd-client`).
    pub async fn restore_from_snapshot(&mut self, snapshot: &Path) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
        self.generation += 1;
        let initial = self.initial_cluster();
        for i in 0..self.members.len() {
            let dir = self.member_dir(i);
            std::fs::create_dir_all(&dir).unwrap();
            self.members[i].dir = dir;
            let m = &self.members[i];
            let out = Command::new("etcdctl")
                .env("ETCDCTL_API", "3")
                .arg("snapshot")
                .arg("restore")
                .arg(snapshot)
                .args(["--name", &m.name, "--initial-cluster", &initial])
                .args(["--initial-cluster-token", &self.token, "--initial-advertise-peer-urls", &m.peer_url()])
                .arg("--data-dir")
                .arg(m.data_dir())
                .output()
                .unwrap_or_else(|e| panic!("cannot run etcdctl ({e}): install Debian's etcd-client"));
            assert!(out.status.success(), "etcdctl snapshot restore: {}", String::from_utf8_lossy(&out.stderr));
        }
        for i in 0..self.members.len() {
            self.spawn(i, "new");
        }
        self.wait_writable().await;
    }

    /// Member `i`'s log (of its current data generation), at most its last 60 lines.
    pub fn log(&self, i: usize) -> String {
        let text = std::fs::read_to_string(self.members[i].log_path()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let from = lines.len().saturating_sub(60);
        format!("--- etcd member {i} ({}) log, last lines ---\n{}", self.endpoint(i), lines[from..].join("\n"))
    }

    /// Every member's [`log`](Self::log).
    pub fn logs(&self) -> String {
        (0..self.members.len()).map(|i| self.log(i)).collect::<Vec<_>>().join("\n")
    }

    /// Lines of member `i`'s log that contain `needle`.
    pub fn log_lines(&self, i: usize, needle: &str) -> Vec<String> {
        let text = std::fs::read_to_string(self.members[i].log_path()).unwrap_or_default();
        text.lines().filter(|l| l.contains(needle)).map(str::to_string).collect()
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", self.logs());
        }
        for m in &mut self.members {
            // A frozen member dies of SIGKILL all the same.
            if let Some(mut child) = m.child.take() {
                let _ = child.0.kill();
                let _ = child.0.wait();
            }
        }
    }
}

/// `endpoints` as a TOML array of strings.
pub fn toml_endpoints(endpoints: &[String]) -> String {
    format!("[{}]", endpoints.iter().map(|e| toml_string(e)).collect::<Vec<_>>().join(", "))
}

/// `[fences]` for the etcd store on `cluster`, plus `extra` lines.
pub fn etcd_store(cluster: &EtcdCluster, extra: &str) -> String {
    etcd_store_at(&cluster.endpoints(), extra)
}

/// `[fences]` for the etcd store on `endpoints` (in that order), plus `extra` lines.
pub fn etcd_store_at(endpoints: &[String], extra: &str) -> String {
    format!("[fences]\nstore = \"etcd\"\nendpoints = {}\n{extra}\n", toml_endpoints(endpoints))
}
