//! TLS termination (`[server.tls]`): HTTP/1.1 and HTTP/2 chosen by ALPN,
//! client certificates, and certificates rotated while fencegate runs, the
//! way Kubernetes rotates a mounted Secret. Certificates are made at test
//! time (rcgen); clients are rustls over real sockets on 127.0.0.1.

use crate::common;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, StatusCode, Version};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use common::certs::{Ca, Identity};
use common::process::start_in_process;
use common::*;

/// A client that trusts `ca`, offers `alpn`, and presents `identity` if given.
fn client_config(ca: &Ca, alpn: &[&[u8]], identity: Option<&Identity>) -> Arc<ClientConfig> {
    let mut roots = RootCertStore::empty();
    roots.add(CertificateDer::from_pem_slice(ca.pem().as_bytes()).unwrap()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let mut config = match identity {
        None => builder.with_no_client_auth(),
        Some(id) => builder
            .with_client_auth_cert(
                vec![CertificateDer::from_pem_slice(id.cert.as_bytes()).unwrap()],
                PrivateKeyDer::from_pem_slice(id.key.as_bytes()).unwrap(),
            )
            .unwrap(),
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(config)
}

async fn connect(addr: SocketAddr, config: Arc<ClientConfig>) -> std::io::Result<TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    TlsConnector::from(config).connect(ServerName::try_from("localhost").unwrap(), tcp).await
}

/// The certificate the server showed on `stream`.
fn served(stream: &TlsStream<TcpStream>) -> Vec<u8> {
    stream.get_ref().1.peer_certificates().expect("the server shows a certificate")[0].to_vec()
}

/// One request over HTTP/1.1 on `stream`.
async fn http1(stream: TlsStream<TcpStream>, req: Request<Full<Bytes>>) -> hyper::Result<Reply> {
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    reply(send.send_request(req).await?).await
}

async fn reply(resp: http::Response<hyper::body::Incoming>) -> hyper::Result<Reply> {
    let (parts, body) = resp.into_parts();
    let body = body.collect().await?.to_bytes();
    Ok(Reply { status: parts.status, headers: parts.headers, body })
}

fn put_req(path: &str, token: u64) -> Request<Full<Bytes>> {
    Request::put(path)
        .header("host", "localhost")
        .header("x-fencing-token", token.to_string())
        .body(Full::new(Bytes::from_static(b"data")))
        .unwrap()
}

/// The `[server.tls]` section for files in `dir`.
fn tls_section(dir: &Path, client_ca: bool) -> String {
    let mut text = format!("[server.tls]\ncert = '{0}/tls.crt'\nkey = '{0}/tls.key'\n", dir.display());
    if client_ca {
        text.push_str(&format!("client_ca = '{}/ca.crt'\n", dir.display()));
    }
    text
}

/// A directory laid out as Kubernetes mounts a Secret: the visible names are
/// symlinks through `..data`, which points at a hidden directory per version.
struct SecretVolume {
    dir: tempfile::TempDir,
    version: usize,
}

impl SecretVolume {
    fn new(files: &[(&str, &str)]) -> SecretVolume {
        let mut volume = SecretVolume { dir: tempfile::tempdir().unwrap(), version: 0 };
        volume.update(files);
        for (name, _) in files {
            std::os::unix::fs::symlink(format!("..data/{name}"), volume.path().join(name)).unwrap();
        }
        volume
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// What the kubelet does: write a new version, point `..data_tmp` at it,
    /// rename it over `..data`, remove the old version.
    fn update(&mut self, files: &[(&str, &str)]) {
        self.version += 1;
        let version = format!("..v{}", self.version);
        std::fs::create_dir(self.path().join(&version)).unwrap();
        for (name, text) in files {
            std::fs::write(self.path().join(&version).join(name), text).unwrap();
        }
        std::os::unix::fs::symlink(&version, self.path().join("..data_tmp")).unwrap();
        std::fs::rename(self.path().join("..data_tmp"), self.path().join("..data")).unwrap();
        if self.version > 1 {
            std::fs::remove_dir_all(self.path().join(format!("..v{}", self.version - 1))).unwrap();
        }
    }
}

/// fencegate serving TLS from `volume`, with `server` as extra `[server]` lines.
async fn setup(volume: &SecretVolume, client_ca: bool, server: &str) -> (RecordingUpstream, Proxy) {
    let up = RecordingUpstream::start().await;
    let proxy = start_in_process(&format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nshutdown_grace = \"5s\"\n{server}\n{}\
         [admin]\nlisten = \"127.0.0.1:0\"\n[fences]\nstore = \"memory\"\n{}",
        tls_section(volume.path(), client_ca),
        route("objects", "/objects/", &up, "")
    ))
    .await;
    (up, proxy)
}

#[tokio::test]
async fn fenced_writes_over_tls_with_http1_are_fenced_and_marked_https() {
    let ca = Ca::new("test CA");
    let id = ca.issue("first");
    let volume = SecretVolume::new(&[("tls.crt", &id.cert), ("tls.key", &id.key)]);
    let (up, proxy) = setup(&volume, false, "").await;
    let config = client_config(&ca, &[b"http/1.1"], None);

    let stream = connect(proxy.addr, config.clone()).await.unwrap();
    assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    assert_eq!(served(&stream), id.der);
    let ok = http1(stream, put_req("/objects/a", 7)).await.unwrap();
    assert_eq!(ok.status, StatusCode::OK, "{}", ok.text());
    let stream = connect(proxy.addr, config).await.unwrap();
    http1(stream, put_req("/objects/a", 6)).await.unwrap().problem(409);

    assert_eq!(up.applied_for("/objects/a").len(), 1, "only the fresh write reached the upstream");
    let seen = up.seen();
    let (_, _, headers) = seen.iter().find(|(m, _, _)| m == "PUT").unwrap();
    assert_eq!(headers["x-forwarded-proto"], "https");
}

#[tokio::test]
async fn alpn_h2_serves_http2_over_tls() {
    let ca = Ca::new("test CA");
    let id = ca.issue("first");
    let volume = SecretVolume::new(&[("tls.crt", &id.cert), ("tls.key", &id.key)]);
    let (up, proxy) = setup(&volume, false, "").await;

    let stream = connect(proxy.addr, client_config(&ca, &[b"h2", b"http/1.1"], None)).await.unwrap();
    assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"h2"[..]), "h2 is offered and preferred");
    let (mut send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream)).await.unwrap();
    tokio::spawn(conn);
    // Two streams on one connection: the second, stale, is refused.
    let ok = reply(send.send_request(put_req("https://localhost/objects/h2", 3)).await.unwrap()).await.unwrap();
    assert_eq!(ok.status, StatusCode::OK, "{}", ok.text());
    let stale = send.send_request(put_req("https://localhost/objects/h2", 2)).await.unwrap();
    assert_eq!(stale.version(), Version::HTTP_2);
    reply(stale).await.unwrap().problem(409);
    assert_eq!(up.applied_for("/objects/h2").len(), 1);
}

#[tokio::test]
async fn plain_http_and_stalled_handshakes_are_closed_and_counted() {
    let ca = Ca::new("test CA");
    let id = ca.issue("first");
    let volume = SecretVolume::new(&[("tls.crt", &id.cert), ("tls.key", &id.key)]);
    let (up, proxy) = setup(&volume, false, "header_read_timeout = \"1s\"").await;

    // Plain HTTP to the TLS port: no HTTP answer, nothing forwarded.
    let mut plain = TcpStream::connect(proxy.addr).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(
        &mut plain,
        b"PUT /objects/p HTTP/1.1\r\nHost: x\r\nX-Fencing-Token: 1\r\nContent-Length: 0\r\n\r\n",
    )
    .await
    .unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), plain.read_to_end(&mut answer)).await.expect("closed");
    assert!(!answer.starts_with(b"HTTP/"), "{:?}", String::from_utf8_lossy(&answer));

    // A client that opens and says nothing is closed after header_read_timeout.
    let started = Instant::now();
    let mut silent = TcpStream::connect(proxy.addr).await.unwrap();
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(Duration::from_secs(5), silent.read(&mut buf)).await;
    assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "{read:?}");
    assert!(started.elapsed() >= Duration::from_millis(900), "closed after {:?}", started.elapsed());

    proxy.wait_metric("fencegate_tls_handshake_failures_total", 2.0).await;
    assert!(up.applied().is_empty());
}

#[tokio::test]
async fn a_client_ca_requires_a_client_certificate_it_signed() {
    let ca = Ca::new("server CA");
    let clients = Ca::new("client CA");
    let other = Ca::new("another CA");
    let id = ca.issue("server");
    let volume = SecretVolume::new(&[("tls.crt", &id.cert), ("tls.key", &id.key), ("ca.crt", &clients.pem())]);
    let (up, proxy) = setup(&volume, true, "").await;

    let good = clients.issue("a client");
    let stream = connect(proxy.addr, client_config(&ca, &[b"http/1.1"], Some(&good))).await.unwrap();
    let ok = http1(stream, put_req("/objects/c", 1)).await.unwrap();
    assert_eq!(ok.status, StatusCode::OK, "{}", ok.text());

    // Without a certificate, or with another CA's: refused in the handshake
    // (under TLS 1.3 the client may learn it on its first read).
    for identity in [None, Some(other.issue("a stranger"))] {
        let refused = match connect(proxy.addr, client_config(&ca, &[b"http/1.1"], identity.as_ref())).await {
            Err(_) => true,
            Ok(stream) => http1(stream, put_req("/objects/c", 2)).await.is_err(),
        };
        assert!(refused, "a client with {:?} was served", identity.as_ref().map(|_| "another CA's certificate"));
    }
    proxy.wait_metric("fencegate_tls_handshake_failures_total", 2.0).await;
    assert_eq!(up.applied_for("/objects/c").len(), 1);
}

const APPLIED: &str = "fencegate_tls_reloads_total{outcome=\"applied\"}";
const REFUSED: &str = "fencegate_tls_reloads_total{outcome=\"refused\"}";

/// Connects until the server shows `want`, for up to 10 s.
async fn wait_for_certificate(addr: SocketAddr, config: &Arc<ClientConfig>, want: &[u8]) {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let stream = connect(addr, config.clone()).await.unwrap();
        if served(&stream) == want {
            return;
        }
        assert!(Instant::now() < until, "the rotated certificate was not served within 10 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_certificate_rotated_the_secret_volume_way_serves_new_connections_and_a_broken_one_is_not_used() {
    let ca = Ca::new("test CA");
    let first = ca.issue("first");
    let mut volume = SecretVolume::new(&[("tls.crt", &first.cert), ("tls.key", &first.key)]);
    let (up, proxy) = setup(&volume, false, "").await;
    let config = client_config(&ca, &[b"http/1.1"], None);

    // A connection opened before the rotation keeps working after it.
    let before = connect(proxy.addr, config.clone()).await.unwrap();
    assert_eq!(served(&before), first.der);
    let (mut kept, conn) = hyper::client::conn::http1::handshake(TokioIo::new(before)).await.unwrap();
    tokio::spawn(conn);

    let second = ca.issue("second");
    volume.update(&[("tls.crt", &second.cert), ("tls.key", &second.key)]);
    proxy.wait_metric(APPLIED, 1.0).await;
    wait_for_certificate(proxy.addr, &config, &second.der).await;
    let ok = reply(kept.send_request(put_req("/objects/r", 1)).await.unwrap()).await.unwrap();
    assert_eq!(ok.status, StatusCode::OK, "the connection from before the rotation: {}", ok.text());

    // A broken rotation: the third certificate with the second's key.
    let third = ca.issue("third");
    volume.update(&[("tls.crt", &third.cert), ("tls.key", &second.key)]);
    proxy.wait_metric(REFUSED, 1.0).await;
    for token in [2, 3] {
        let stream = connect(proxy.addr, config.clone()).await.unwrap();
        assert_eq!(served(&stream), second.der, "the last good pair keeps serving");
        let ok = http1(stream, put_req("/objects/r", token)).await.unwrap();
        assert_eq!(ok.status, StatusCode::OK);
    }
    // Repaired: served.
    volume.update(&[("tls.crt", &third.cert), ("tls.key", &third.key)]);
    proxy.wait_metric(APPLIED, 2.0).await;
    wait_for_certificate(proxy.addr, &config, &third.der).await;
    assert_eq!(up.applied_for("/objects/r").len(), 3);
    assert_eq!(proxy.metric(REFUSED).await, Some(1.0));
}
