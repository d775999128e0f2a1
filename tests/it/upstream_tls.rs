//! TLS to the upstream (`upstream = "https://..."`): an https upstream behind
//! a private CA (`ca_file`), the platform's roots that do not know it, a
//! certificate for another name, and an upstream that requires a client
//! certificate (`client_cert`, `client_key`). The upstream is the recording
//! store behind tokio-rustls, with certificates made at test time (rcgen),
//! on real sockets on 127.0.0.1.

use crate::common;

use std::path::PathBuf;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};

use common::certs::{Ca, Identity};
use common::process::{fencegate, run_to_exit, text, Running, TempDir};
use common::*;

/// A TLS server config that shows `id`, speaks HTTP/1.1, and with
/// `client_ca` requires a client certificate that CA signed.
fn server_config(id: &Identity, client_ca: Option<&Ca>) -> Arc<ServerConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone()).with_safe_default_protocol_versions().unwrap();
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            roots.add(CertificateDer::from_pem_slice(ca.pem().as_bytes()).unwrap()).unwrap();
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider).build().unwrap();
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(
            vec![CertificateDer::from_pem_slice(id.cert.as_bytes()).unwrap()],
            PrivateKeyDer::from_pem_slice(id.key.as_bytes()).unwrap(),
        )
        .unwrap();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(config)
}

/// A `[[route]]` to `https://{authority}` with `extra` lines.
fn https_route(name: &str, prefix: &str, authority: &str, extra: &str) -> String {
    format!("[[route]]\nname = \"{name}\"\nprefix = \"{prefix}\"\nupstream = \"https://{authority}\"\n{extra}\n")
}

/// `ca_file = '...'` for `ca`, written in `dir`.
fn ca_file(dir: &TempDir, ca: &Ca) -> String {
    format!("ca_file = '{}'\n", dir.write("ca.pem", &ca.pem()).display())
}

/// `client_cert` and `client_key` for `id`, written in `dir`.
fn client_files(dir: &TempDir, id: &Identity) -> String {
    let cert: PathBuf = dir.write("client.crt", &id.cert);
    let key: PathBuf = dir.write("client.key", &id.key);
    format!("client_cert = '{}'\nclient_key = '{}'\n", cert.display(), key.display())
}

/// A 502 `upstream-error` after which nothing may still land: no settle.
fn unreachable(reply: &Reply) -> String {
    let problem = reply.problem(502);
    assert_eq!(problem["type"], "urn:fencegate:problem:upstream-error", "{problem}");
    assert!(problem.get("settle_ms").is_none(), "nothing was sent, so nothing settles: {problem}");
    problem["detail"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn an_https_upstream_behind_a_private_ca_gets_fenced_writes_and_never_a_stale_one() {
    let ca = Ca::new("private CA");
    let upstream = RecordingUpstream::start_tls(server_config(&ca.issue("store"), None)).await;
    let dir = TempDir::new();
    let authority = format!("localhost:{}", upstream.addr.port());
    let proxy = Proxy::start(&https_route("objects", "/objects/", &authority, &ca_file(&dir, &ca))).await;

    let ok = put(&proxy.url("/objects/a"), 5, "five").await;
    assert_eq!(ok.status, 200, "{}", ok.text());
    let stale = put(&proxy.url("/objects/a"), 3, "three").await;
    assert_eq!(stale.problem(409)["current"], 5);
    let applied = upstream.applied_for("/objects/a");
    assert_eq!(applied.len(), 1, "the stale write never reached the upstream: {applied:?}");
    assert_eq!(applied[0].token.as_deref(), Some("5"));
    assert_eq!(get(&proxy.url("/objects/a")).await.text(), "five");

    // A WebDAV Destination is rewritten on the upstream's terms: its scheme too.
    let copy =
        send("COPY", &proxy.url("/objects/a"), &[("x-fencing-token", "6"), ("destination", "/objects/b")], "").await;
    assert_eq!(copy.status, 200, "{}", copy.text());
    let (_, _, headers) = upstream.seen().pop().unwrap();
    assert_eq!(headers["host"], authority.as_str());
    assert_eq!(headers["destination"], format!("https://{authority}/objects/b").as_str());

    // Every connection was TLS with the upstream's name as SNI and HTTP/1.1
    // by ALPN, and connections were kept between requests.
    let handshakes = upstream.handshakes();
    assert_eq!(handshakes.len(), upstream.connections(), "{handshakes:?}");
    assert!(handshakes.len() < 4, "4 requests, {} handshakes: no connection was kept", handshakes.len());
    for handshake in handshakes {
        assert_eq!(handshake.server_name.as_deref(), Some("localhost"));
        assert_eq!(handshake.alpn.as_deref(), Some(&b"http/1.1"[..]));
        assert!(!handshake.client_certificate);
    }
}

#[tokio::test]
async fn without_its_ca_file_a_route_refuses_a_private_cas_certificate() {
    let ca = Ca::new("private CA");
    let upstream = RecordingUpstream::start_tls(server_config(&ca.issue("store"), None)).await;
    let authority = format!("127.0.0.1:{}", upstream.addr.port());
    let proxy = Proxy::start(&https_route("objects", "/objects/", &authority, "")).await;

    let detail = unreachable(&put(&proxy.url("/objects/a"), 5, "five").await);
    assert!(detail.contains("TLS handshake") && detail.contains("UnknownIssuer"), "{detail}");
    assert!(unreachable(&get(&proxy.url("/objects/a")).await).contains("UnknownIssuer"));
    assert!(upstream.seen().is_empty(), "a request reached an upstream that was not verified");
    assert!(upstream.failed_handshakes() > 0);
    assert!(upstream.handshakes().is_empty());
}

#[tokio::test]
async fn a_certificate_for_another_name_is_refused() {
    let ca = Ca::new("private CA");
    let elsewhere = ca.issue_for("elsewhere", &["elsewhere.example"]);
    let upstream = RecordingUpstream::start_tls(server_config(&elsewhere, None)).await;
    let dir = TempDir::new();
    let authority = format!("127.0.0.1:{}", upstream.addr.port());
    let proxy = Proxy::start(&https_route("objects", "/objects/", &authority, &ca_file(&dir, &ca))).await;

    let detail = unreachable(&put(&proxy.url("/objects/a"), 5, "five").await);
    assert!(detail.contains("not valid for name"), "{detail}");
    assert!(upstream.seen().is_empty());
}

#[tokio::test]
async fn an_upstream_that_is_not_tls_is_unreachable() {
    let upstream = RecordingUpstream::start().await;
    let dir = TempDir::new();
    let authority = format!("127.0.0.1:{}", upstream.addr.port());
    let proxy = Proxy::start(&https_route("objects", "/objects/", &authority, &ca_file(&dir, &Ca::new("CA")))).await;
    let detail = unreachable(&put(&proxy.url("/objects/a"), 5, "five").await);
    assert!(detail.contains("TLS handshake"), "{detail}");
    assert!(upstream.applied().is_empty());
}

#[tokio::test]
async fn an_upstream_that_requires_a_client_certificate_gets_the_routes() {
    let (server_ca, client_ca, stranger_ca) = (Ca::new("server CA"), Ca::new("client CA"), Ca::new("stranger CA"));
    let upstream = RecordingUpstream::start_tls(server_config(&server_ca.issue("store"), Some(&client_ca))).await;
    let (dir, stranger_dir) = (TempDir::new(), TempDir::new());
    let authority = format!("127.0.0.1:{}", upstream.addr.port());
    let trust = ca_file(&dir, &server_ca);
    let routes = [
        https_route("bare", "/bare/", &authority, &trust),
        https_route(
            "stranger",
            "/stranger/",
            &authority,
            &(trust.clone() + &client_files(&stranger_dir, &stranger_ca.issue("x"))),
        ),
        https_route(
            "signed",
            "/signed/",
            &authority,
            &(trust.clone() + &client_files(&dir, &client_ca.issue("fencegate"))),
        ),
    ]
    .concat();
    let proxy = Proxy::start(&routes).await;

    // Refused: the upstream never read these requests, so the keys do not settle.
    let detail = unreachable(&put(&proxy.url("/bare/a"), 5, "five").await);
    assert!(detail.contains("client certificate"), "{detail}");
    let detail = unreachable(&put(&proxy.url("/stranger/a"), 5, "five").await);
    assert!(detail.contains("client certificate"), "{detail}");
    assert!(upstream.seen().is_empty(), "{:?}", upstream.seen());

    let ok = put(&proxy.url("/signed/a"), 5, "five").await;
    assert_eq!(ok.status, 200, "{}", ok.text());
    assert_eq!(upstream.object("/signed/a").as_deref(), Some(&b"five"[..]));
    assert!(upstream.handshakes().iter().all(|h| h.client_certificate));
}

// ------------------------------------------------------- the binary: --check, start

/// A whole config on ephemeral ports with `routes`.
fn config(routes: &str) -> String {
    format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n[fences]\nstore = \"memory\"\n{routes}"
    )
}

#[test]
fn check_reads_the_tls_files_and_names_a_missing_one() {
    let dir = TempDir::new();
    let ca = Ca::new("CA");
    let good = https_route("objects", "/objects/", "127.0.0.1:9443", &ca_file(&dir, &ca));
    let path = dir.write("ok.toml", &config(&good));
    let out = run_to_exit(fencegate(dir.path()).arg("--config").arg(&path).arg("--check"));
    assert!(out.status.success(), "{:?}\nstderr: {}", out.status, text(&out.stderr));

    let missing = https_route("objects", "/objects/", "127.0.0.1:9443", "ca_file = '/nonexistent/fencegate/ca.pem'\n");
    let only_cert = https_route("half", "/half/", "127.0.0.1:9443", &client_files(&dir, &ca.issue("x")))
        .replace("client_key", "# client_key");
    let plain = format!("{}{}", route_to("plain", "/plain/", "http://127.0.0.1:9000"), ca_file(&dir, &ca));
    let path = dir.write("bad.toml", &config(&[missing, only_cert, plain].concat()));
    let out = run_to_exit(fencegate(dir.path()).arg("--config").arg(&path).arg("--check"));
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stderr: {stderr}");
    for field in ["route[0] 'objects'.ca_file", "route[1] 'half'.client_key", "route[2] 'plain'.ca_file"] {
        assert!(stderr.contains(field), "stderr does not name {field}:\n{stderr}");
    }
    assert!(stderr.contains("/nonexistent/fencegate/ca.pem"), "{stderr}");
}

/// A `[[route]]` to `upstream`, as written.
fn route_to(name: &str, prefix: &str, upstream: &str) -> String {
    format!("[[route]]\nname = \"{name}\"\nprefix = \"{prefix}\"\nupstream = \"{upstream}\"\n")
}

/// A system with no CA certificates: the start says so, and each refused
/// handshake is logged with its reason.
#[tokio::test]
async fn with_no_platform_roots_the_start_warns_and_each_failure_is_logged() {
    let ca = Ca::new("private CA");
    let upstream = RecordingUpstream::start_tls(server_config(&ca.issue("store"), None)).await;
    let dir = TempDir::new();
    let authority = format!("127.0.0.1:{}", upstream.addr.port());
    let path = dir.write("fencegate.toml", &config(&https_route("objects", "/objects/", &authority, "")));
    // rustls-native-certs reads the bundle SSL_CERT_FILE names, here empty.
    let empty = dir.write("no-roots.pem", "");
    let mut fg = Running::start_cmd(
        fencegate(dir.path()).env("SSL_CERT_FILE", &empty).env_remove("SSL_CERT_DIR").arg("--config").arg(&path),
    )
    .await;
    let warning = fg
        .wait_event("the no-roots warning", |e| {
            e["level"] == "WARN" && e["message"].as_str().is_some_and(|m| m.contains("no root certificate"))
        })
        .await;
    assert_eq!(warning["route"], "objects", "{warning}");

    unreachable(&put(&fg.url("/objects/a"), 5, "five").await);
    let failure = fg
        .wait_event("the handshake failure", |e| {
            e["level"] == "WARN"
                && e["message"].as_str().is_some_and(|m| m.contains("TLS handshake with the upstream failed"))
        })
        .await;
    assert_eq!(failure["reason"], "unknown CA", "{failure}");
    assert!(failure["no_roots"].is_string(), "{failure}");
    assert!(upstream.seen().is_empty());
}
