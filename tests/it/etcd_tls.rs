//! The etcd store over TLS with a client certificate (mTLS) and etcd's own
//! authentication: a real one-member `etcd` that serves only `https://`
//! with a certificate from a CA of the test's own, requires a client
//! certificate from that CA, and has auth enabled with a user limited to
//! fencegate's prefix.

use crate::common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use etcd_client::{Certificate, Client, ConnectOptions, Identity, Permission, TlsOptions};

use common::certs::Ca;
use common::process::*;
use common::redis::free_port;
use common::*;

const USER: &str = "fencegate";
const PASSWORD: &str = "s3cret-pass";

/// A TLS-only, auth-enabled etcd and what a client needs to reach it.
struct TlsEtcd {
    _child: ChildGuard,
    _dir: TempDir,
    url: String,
    /// The CA's certificate, and a client certificate and key it issued.
    ca_file: std::path::PathBuf,
    cert_file: std::path::PathBuf,
    key_file: std::path::PathBuf,
}

impl TlsEtcd {
    async fn start(ca: &Ca) -> TlsEtcd {
        let dir = TempDir::new();
        let server = ca.issue("etcd");
        let client = ca.issue("fencegate-client");
        let (cert, key) = (dir.write("etcd.crt", &server.cert), dir.write("etcd.key", &server.key));
        let ca_file = dir.write("ca.pem", &ca.pem());
        let (cert_file, key_file) = (dir.write("client.crt", &client.cert), dir.write("client.key", &client.key));
        let (port, peer) = (free_port(), free_port());
        let url = format!("https://127.0.0.1:{port}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let log = std::fs::File::create(dir.path().join("etcd.log")).unwrap();
        let path = |p: &Path| p.display().to_string();
        let child = Command::new("etcd")
            .args(["--name", "tls", "--data-dir", &path(&dir.path().join("data"))])
            .args(["--listen-client-urls", &url, "--advertise-client-urls", &url])
            .args(["--listen-peer-urls", &peer_url, "--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("tls={peer_url}")])
            .args(["--cert-file", &path(&cert), "--key-file", &path(&key)])
            .args(["--client-cert-auth", "--trusted-ca-file", &path(&ca_file)])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("etcd on PATH");
        let etcd = TlsEtcd { _child: ChildGuard(child), _dir: dir, url, ca_file, cert_file, key_file };
        etcd.enable_auth().await;
        etcd
    }

    /// A client over mTLS, as `user` when given.
    async fn client(&self, user: Option<(&str, &str)>) -> Result<Client, etcd_client::Error> {
        let read = |p: &Path| std::fs::read(p).unwrap();
        let tls = TlsOptions::new()
            .ca_certificate(Certificate::from_pem(read(&self.ca_file)))
            .identity(Identity::from_pem(read(&self.cert_file), read(&self.key_file)));
        let mut options = ConnectOptions::new().with_tls(tls).with_timeout(Duration::from_secs(3));
        if let Some((user, password)) = user {
            options = options.with_user(user, password);
        }
        Client::connect([self.url.as_str()], Some(options)).await
    }

    /// Root and a user that may read and write `fencegate/` only; auth on.
    async fn enable_auth(&self) {
        let start = Instant::now();
        let mut client = loop {
            let error = match self.client(None).await {
                Ok(mut client) => match client.status().await {
                    Ok(_) => break client,
                    Err(e) => e,
                },
                Err(e) => e,
            };
            assert!(start.elapsed() < DEADLINE, "etcd over TLS never answered: {error}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        client.user_add("root", "root-pass", None).await.unwrap();
        client.user_grant_role("root", "root").await.unwrap();
        client.role_add("fencegate").await.unwrap();
        let prefix = Permission::read_write("fencegate/").with_range_end("fencegate0");
        client.role_grant_permission("fencegate", prefix).await.unwrap();
        client.user_add(USER, PASSWORD, None).await.unwrap();
        client.user_grant_role(USER, "fencegate").await.unwrap();
        client.auth_enable().await.unwrap();
    }

    fn fences(&self, password: &str, with_ca: bool, with_identity: bool) -> String {
        let file = |name: &str, p: &Path| format!("{name} = {}\n", toml_string(&p.display().to_string()));
        format!(
            "[fences]\nstore = \"etcd\"\nendpoints = [{}]\ntimeout = \"2s\"\nuser = \"{USER}\"\npassword = \"{password}\"\n{}{}{}",
            toml_string(&self.url),
            if with_ca { file("ca_file", &self.ca_file) } else { String::new() },
            if with_identity { file("cert_file", &self.cert_file) } else { String::new() },
            if with_identity { file("key_file", &self.key_file) } else { String::new() },
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_over_mtls_with_a_user_fences_writes() {
    let ca = Ca::new("test etcd ca");
    let etcd = TlsEtcd::start(&ca).await;
    let up = RecordingUpstream::start().await;
    let config = config_text("", &etcd.fences(PASSWORD, true, true), &route("objects", "/objects/", &up, ""));
    let fg = Running::start(&config).await;
    fg.wait_writable(true, DEADLINE).await;

    assert_eq!(put(&fg.url("/objects/a"), 5, "five").await.status, 200);
    put(&fg.url("/objects/a"), 4, "four").await.problem(409);
    // The mark is in etcd, read back as the user over the same TLS.
    let mut client = etcd.client(Some((USER, PASSWORD))).await.unwrap();
    let mark = client.get("fencegate/mark//objects/a", None).await.unwrap();
    assert_eq!(mark.kvs().first().map(|kv| kv.value().to_vec()), Some(b"00000000000000000005".to_vec()));
    let applied: Vec<_> = up.applied_for("/objects/a").into_iter().map(|a| a.token.unwrap_or_default()).collect();
    assert_eq!(applied, ["5"]);
}

/// A wrong password, a CA the server's certificate is not from, or no
/// client certificate: fencegate starts, refuses fenced writes (503, nothing
/// forwarded) and says why on `/readyz?verbose`; reads flow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_an_unknown_ca_or_no_client_certificate_fails_closed() {
    let ca = Ca::new("test etcd ca");
    let etcd = TlsEtcd::start(&ca).await;
    let up = RecordingUpstream::start().await;
    for (what, fences) in [
        ("a wrong password", etcd.fences("wrong", true, true)),
        ("the platform's roots only", etcd.fences(PASSWORD, false, true)),
        ("no client certificate", etcd.fences(PASSWORD, true, false)),
    ] {
        let config = config_text("", &fences, &route("objects", "/objects/", &up, ""));
        let fg = Running::start(&config).await;
        let r = put(&fg.url("/objects/a"), 5, "five").await;
        let p = r.problem(503);
        assert_eq!(p["type"], "urn:fencegate:problem:store-unavailable", "{what}: {p}");
        assert!(r.header("retry-after").is_some(), "{what}: a 503 without Retry-After");
        fg.wait_writable(false, DEADLINE).await;
        let why = common::shared_fences::refusing(&fg).await;
        assert!(why.as_deref().is_some_and(|w| w.contains("etcd")), "{what}: /readyz?verbose says {why:?}");
        // The upstream has no /objects/a: its own 404 is a read that flowed.
        assert_eq!(get(&fg.url("/objects/a")).await.status, 404, "{what}: a read did not flow");
        assert_eq!(common::shared_fences::seen_writes(&up, "/objects/a"), 0, "{what}: a write reached the upstream");
    }
}

/// A `ca_file` that does not exist stops fencegate at start, naming the field.
#[test]
fn a_missing_ca_file_stops_the_start_naming_it() {
    let dir = TempDir::new();
    let fences = "[fences]\nstore = \"etcd\"\nendpoints = [\"https://127.0.0.1:2379\"]\nca_file = \"missing-ca.pem\"\n";
    let config = dir.write(
        "fencegate.toml",
        &config_text(
            "",
            fences,
            "[[route]]\nname = \"objects\"\nprefix = \"/objects/\"\nupstream = \"http://127.0.0.1:9\"\n",
        ),
    );
    let out = run_to_exit(fencegate(dir.path()).arg("--config").arg(&config));
    // The error is logged (stdout) as it stops.
    let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(!out.status.success(), "started with a missing ca_file");
    assert!(said.contains("[fences] ca_file") && said.contains("missing-ca.pem"), "{said}");
}
