//! Who the client is, against the real binary: the source a PROXY protocol
//! header names (`[server] proxy_protocol`), the address a trusted proxy's
//! `X-Forwarded-For` names (`[server] trusted_proxies`), and nobody else's
//! word for it. The upstream sees the connection's address appended to
//! `X-Forwarded-For`; the access log's `client` and the abuse penalty use
//! the real client. Loopback addresses other than 127.0.0.1 (bound by the
//! client socket) stand for distinct peers.

use crate::common;

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use common::process::{config_text, Running, MEMORY_STORE};
use common::raw::RawRequest;
use common::*;

/// fencegate as a child, with `server` lines added to `[server]`, one route to `up`.
async fn start(server: &str, up: &RecordingUpstream) -> Running {
    let route = route("objects", "/objects/", up, "");
    let config = config_text("", MEMORY_STORE, &route).replacen("[server]\n", &format!("[server]\n{server}\n"), 1);
    Running::start(&config).await
}

/// A connection to `to` from the loopback address `from`.
async fn connect_from(from: &str, to: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(from.parse().unwrap(), 0)).unwrap();
    socket.connect(to).await.unwrap()
}

/// Sends `bytes` on a new connection from `from`, and reads until the
/// close: what came back.
async fn exchange(from: &str, to: SocketAddr, bytes: &[u8]) -> String {
    let mut conn = connect_from(from, to).await;
    // The close may come before every byte is written.
    let _ = conn.write_all(bytes).await;
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(20), conn.read_to_end(&mut answer)).await;
    String::from_utf8_lossy(&answer).into_owned()
}

/// A fenced `PUT` of `path` with token 1 (its access line names its key,
/// the path), with `headers`, closing the connection after.
fn put_bytes(path: &str, headers: &[(&str, &str)]) -> Vec<u8> {
    headers
        .iter()
        .fold(RawRequest::new("PUT", path), |r, (name, value)| r.header(name, value))
        .token(1)
        .body("x")
        .bytes()
}

/// A v2 header (PROXY command, TCP) from `source` to `destination`.
fn v2(source: SocketAddr, destination: SocketAddr) -> Vec<u8> {
    use ppp::v2::{Addresses, Builder, Command, IPv4, IPv6, Protocol, Version};
    let addresses = match (source, destination) {
        (SocketAddr::V4(s), SocketAddr::V4(d)) => Addresses::IPv4(IPv4::new(*s.ip(), *d.ip(), s.port(), d.port())),
        (SocketAddr::V6(s), SocketAddr::V6(d)) => Addresses::IPv6(IPv6::new(*s.ip(), *d.ip(), s.port(), d.port())),
        _ => unreachable!("one family"),
    };
    Builder::with_addresses(Version::Two | Command::Proxy, Protocol::Stream, addresses).build().unwrap()
}

/// The `X-Forwarded-For` the upstream saw on its request for `path`.
fn forwarded_for(up: &RecordingUpstream, path: &str) -> String {
    let seen = up.seen();
    let (_, _, headers) = seen.iter().rev().find(|(_, p, _)| p == path).unwrap_or_else(|| panic!("{path} not seen"));
    headers.get_all("x-forwarded-for").iter().map(|v| v.to_str().unwrap()).collect::<Vec<_>>().join(", ")
}

/// Waits for the access line of `path` and returns its `client`.
async fn logged_client(running: &mut Running, path: &str) -> String {
    let key = path.to_string();
    let line = running
        .wait_event("the access line", move |e| e["target"] == "fencegate::access" && e["key"] == key.as_str())
        .await;
    line["client"].as_str().unwrap_or_else(|| panic!("no client in {line}")).to_string()
}

#[tokio::test]
async fn a_v1_header_names_the_client_upstream_and_in_the_access_log() {
    let up = RecordingUpstream::start().await;
    let mut fg = start("proxy_protocol = \"v1\"", &up).await;
    let mut sent = b"PROXY TCP4 192.0.2.7 198.51.100.1 40000 8080\r\n".to_vec();
    sent.extend(put_bytes("/objects/v1", &[]));
    let answer = exchange("127.0.0.1", fg.proxy, &sent).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert_eq!(forwarded_for(&up, "/objects/v1"), "192.0.2.7");
    assert_eq!(logged_client(&mut fg, "/objects/v1").await, "192.0.2.7");
}

#[tokio::test]
async fn a_v2_header_names_the_client_over_ipv4_and_ipv6() {
    let up = RecordingUpstream::start().await;
    let mut fg = start("proxy_protocol = \"any\"", &up).await;
    for (path, source, destination) in [
        ("/objects/v2-ipv4", "192.0.2.8:40000", "198.51.100.1:8080"),
        ("/objects/v2-ipv6", "[2001:db8::8]:40000", "[2001:db8::1]:8080"),
    ] {
        let mut sent = v2(source.parse().unwrap(), destination.parse().unwrap());
        sent.extend(put_bytes(path, &[]));
        let answer = exchange("127.0.0.1", fg.proxy, &sent).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{path}: {answer}");
        let client: SocketAddr = source.parse().unwrap();
        assert_eq!(forwarded_for(&up, path), client.ip().to_string());
        assert_eq!(logged_client(&mut fg, path).await, client.ip().to_string());
    }
    // v1 is taken too with "any"; the client's own X-Forwarded-For is kept
    // in front, unbelieved.
    let mut sent = b"PROXY TCP4 192.0.2.9 198.51.100.1 1 2\r\n".to_vec();
    sent.extend(put_bytes("/objects/any-v1", &[("X-Forwarded-For", "6.6.6.6")]));
    assert!(exchange("127.0.0.1", fg.proxy, &sent).await.starts_with("HTTP/1.1 200"));
    assert_eq!(forwarded_for(&up, "/objects/any-v1"), "6.6.6.6, 192.0.2.9");
    assert_eq!(logged_client(&mut fg, "/objects/any-v1").await, "192.0.2.9");
}

/// Without the header, with one of the other version, a malformed one or one
/// too long, the connection is closed with no answer and nothing is forwarded.
#[tokio::test]
async fn a_connection_without_a_good_header_is_closed_unanswered() {
    let up = RecordingUpstream::start().await;
    let fg = start("proxy_protocol = \"v2\"", &up).await;
    let mut too_long = v2("192.0.2.7:1".parse().unwrap(), "198.51.100.1:2".parse().unwrap());
    too_long[14..16].copy_from_slice(&4000u16.to_be_bytes());
    too_long.extend(vec![0u8; 4000]);
    let mut malformed = v2("192.0.2.7:1".parse().unwrap(), "198.51.100.1:2".parse().unwrap());
    malformed[12] = 0x31; // version 3
    let cases: [(&str, Vec<u8>); 4] = [
        ("no header", vec![]),
        ("a v1 header", b"PROXY TCP4 192.0.2.7 198.51.100.1 1 2\r\n".to_vec()),
        ("a malformed header", malformed),
        ("a header past 1 KiB", too_long),
    ];
    for (what, header) in cases {
        let mut sent = header;
        sent.extend(put_bytes("/objects/refused", &[]));
        let answer = exchange("127.0.0.1", fg.proxy, &sent).await;
        assert_eq!(answer, "", "{what}: answered");
    }
    assert!(up.seen().is_empty(), "forwarded: {:?}", up.seen());
    // With a good header, the same request is served.
    let mut sent = v2("192.0.2.7:1".parse().unwrap(), "198.51.100.1:2".parse().unwrap());
    sent.extend(put_bytes("/objects/refused", &[]));
    assert!(exchange("127.0.0.1", fg.proxy, &sent).await.starts_with("HTTP/1.1 200"));

    // A malformed v1 header, on a listener that takes v1.
    let fg = start("proxy_protocol = \"v1\"", &up).await;
    let mut sent = b"PROXY TCP4 192.0.2.300 198.51.100.1 1 2\r\n".to_vec();
    sent.extend(put_bytes("/objects/refused-v1", &[]));
    assert_eq!(exchange("127.0.0.1", fg.proxy, &sent).await, "");
    let long = [&b"PROXY TCP4 "[..], &[b'1'; 150][..], b"\r\n"].concat();
    assert_eq!(exchange("127.0.0.1", fg.proxy, &long).await, "");
    assert!(up.seen().iter().all(|(_, p, _)| p != "/objects/refused-v1"));
}

/// A trusted proxy's X-Forwarded-For names the client; anyone else's is not
/// believed, and what goes upstream is the chain received with the peer
/// appended either way.
#[tokio::test]
async fn only_a_trusted_proxy_is_believed() {
    let up = RecordingUpstream::start().await;
    let mut fg = start("trusted_proxies = [\"127.0.0.2/32\", \"10.0.0.0/8\"]", &up).await;

    let chain = [("X-Forwarded-For", "6.6.6.6, 1.2.3.4, 10.1.1.1")];
    let answer = exchange("127.0.0.2", fg.proxy, &put_bytes("/objects/trusted", &chain)).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert_eq!(forwarded_for(&up, "/objects/trusted"), "6.6.6.6, 1.2.3.4, 10.1.1.1, 127.0.0.2");
    assert_eq!(logged_client(&mut fg, "/objects/trusted").await, "1.2.3.4");

    // The spoof: 127.0.0.1 is no trusted proxy.
    let spoof = [("X-Forwarded-For", "1.2.3.4")];
    let answer = exchange("127.0.0.1", fg.proxy, &put_bytes("/objects/spoofed", &spoof)).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert_eq!(forwarded_for(&up, "/objects/spoofed"), "1.2.3.4, 127.0.0.1");
    assert_eq!(logged_client(&mut fg, "/objects/spoofed").await, "127.0.0.1");

    // From a trusted proxy without X-Forwarded-For, the proxy is the client.
    let answer = exchange("127.0.0.2", fg.proxy, &put_bytes("/objects/bare", &[])).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert_eq!(logged_client(&mut fg, "/objects/bare").await, "127.0.0.2");
}

/// With both, the PROXY header's source is what is trusted or not.
#[tokio::test]
async fn a_proxy_header_source_is_what_trust_is_decided_on() {
    let up = RecordingUpstream::start().await;
    let mut fg = start("proxy_protocol = \"v1\"\ntrusted_proxies = [\"10.0.0.0/8\"]", &up).await;
    let xff = [("X-Forwarded-For", "1.2.3.4")];
    for (source, path, client) in
        [("10.0.0.5", "/objects/via-trusted", "1.2.3.4"), ("192.0.2.7", "/objects/via-untrusted", "192.0.2.7")]
    {
        let mut sent = format!("PROXY TCP4 {source} 198.51.100.1 1 2\r\n").into_bytes();
        sent.extend(put_bytes(path, &xff));
        assert!(exchange("127.0.0.1", fg.proxy, &sent).await.starts_with("HTTP/1.1 200"));
        assert_eq!(forwarded_for(&up, path), format!("1.2.3.4, {source}"));
        assert_eq!(logged_client(&mut fg, path).await, client);
    }
}

/// `fencegate_abuse_total{what}` of a running child.
async fn abuse(fg: &Running, what: &str) -> u64 {
    let text = get(&fg.admin_url("/metrics")).await.text();
    let line = format!("fencegate_abuse_total{{what=\"{what}\"}} ");
    text.lines().find_map(|l| l.strip_prefix(&line)).and_then(|v| v.trim().parse().ok()).unwrap_or(0)
}

async fn counted(fg: &Running, what: &str, n: u64) {
    eventually(&format!("{what} to reach {n}"), Duration::from_secs(30), || async { abuse(fg, what).await >= n }).await;
}

/// A run of 64 refused requests and more on one connection that starts with
/// `header`, from `from`: fencegate closes it for abuse.
async fn refused_run(from: &str, to: SocketAddr, header: &[u8], xff: &[(&str, &str)]) {
    let bad = xff
        .iter()
        .fold(RawRequest::new("PUT", "/objects/k"), |r, (n, v)| r.header(n, v))
        .header("x-fencing-token", "not-a-number")
        .body("x")
        .keep_alive();
    let mut sent = header.to_vec();
    sent.extend((0..80).flat_map(|_| bad.bytes()));
    let answers = exchange(from, to, &sent).await;
    assert!(answers.matches("HTTP/1.1 400").count() >= 63, "not closed for abuse: {answers}");
}

/// Two clients behind one balancer address (PROXY header sources on one
/// peer): the one that abused its connection waits, the other does not.
#[tokio::test]
async fn the_penalty_falls_on_the_real_client_alone() {
    let up = RecordingUpstream::start().await;
    let fg = start("proxy_protocol = \"v1\"\nabuse_penalty = \"30s\"", &up).await;
    let abuser = b"PROXY TCP4 192.0.2.66 198.51.100.1 1 2\r\n";
    refused_run("127.0.0.1", fg.proxy, abuser, &[]).await;
    counted(&fg, "strike", 1).await;
    refused_run("127.0.0.1", fg.proxy, abuser, &[]).await;
    counted(&fg, "strike", 2).await;
    assert_eq!(abuse(&fg, "held").await, 1, "the abuser's second connection was held");

    // The other client, through the same balancer address, is not held.
    let mut sent = b"PROXY TCP4 192.0.2.67 198.51.100.1 1 2\r\n".to_vec();
    sent.extend(put_bytes("/objects/neighbour", &[]));
    assert!(exchange("127.0.0.1", fg.proxy, &sent).await.starts_with("HTTP/1.1 200"));
    assert_eq!(abuse(&fg, "held").await, 1, "the neighbour was held");
    // The abuser's next connection is, then served.
    let mut sent = abuser.to_vec();
    sent.extend(put_bytes("/objects/abuser", &[]));
    assert!(exchange("127.0.0.1", fg.proxy, &sent).await.starts_with("HTTP/1.1 200"));
    assert_eq!(abuse(&fg, "held").await, 2);
}

/// Behind a trusted proxy the strike falls on the client X-Forwarded-For
/// names, never on the proxy: the proxy's next connection is not held, and
/// the client's own (here through a PROXY header naming it) is.
#[tokio::test]
async fn a_trusted_proxy_is_never_struck_its_client_is() {
    let up = RecordingUpstream::start().await;
    let fg = start("proxy_protocol = \"v1\"\ntrusted_proxies = [\"10.0.0.1\"]\nabuse_penalty = \"30s\"", &up).await;
    let proxy = b"PROXY TCP4 10.0.0.1 198.51.100.1 1 2\r\n";
    refused_run("127.0.0.1", fg.proxy, proxy, &[("X-Forwarded-For", "192.0.2.66")]).await;
    counted(&fg, "strike", 1).await;
    let mut sent = proxy.to_vec();
    sent.extend(put_bytes("/objects/through-the-proxy", &[("X-Forwarded-For", "192.0.2.67")]));
    assert!(exchange("127.0.0.1", fg.proxy, &sent).await.starts_with("HTTP/1.1 200"));
    assert_eq!(abuse(&fg, "held").await, 0, "the trusted proxy's connection was held");
    let mut sent = b"PROXY TCP4 192.0.2.66 198.51.100.1 1 2\r\n".to_vec();
    sent.extend(put_bytes("/objects/the-client-itself", &[]));
    assert!(exchange("127.0.0.1", fg.proxy, &sent).await.starts_with("HTTP/1.1 200"));
    assert_eq!(abuse(&fg, "held").await, 1, "the struck client's connection was not held");
}

/// The fields are checked, and only a restart changes them.
#[tokio::test]
async fn bad_values_are_refused_naming_the_field() {
    let up = RecordingUpstream::start().await;
    let route = route("objects", "/objects/", &up, "");
    let config = config_text("", MEMORY_STORE, &route).replacen(
        "[server]\n",
        "[server]\nproxy_protocol = \"v3\"\ntrusted_proxies = [\"10.0.0.0/33\", \"nope\"]\n",
        1,
    );
    let dir = common::process::TempDir::new();
    let path = dir.write("fencegate.toml", &config);
    let out =
        common::process::run_to_exit(common::process::fencegate(dir.path()).arg("--config").arg(&path).arg("--check"));
    let stderr = common::process::text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("server.proxy_protocol: 'v3' is not"), "{stderr}");
    assert!(stderr.contains("server.trusted_proxies: '10.0.0.0/33' is not a CIDR"), "{stderr}");
    assert!(stderr.contains("server.trusted_proxies: 'nope' is not a CIDR"), "{stderr}");
}
