//! What the proxy does to a request on its way to the upstream and to the response
//! on its way back: header rewriting, URI rewriting, bodies of any size and shape,
//! HTTP/2 clients and protocol upgrades. Real sockets on 127.0.0.1 throughout.

use crate::common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, Version};
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Frame};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};

use common::*;

async fn setup(prefix: &str, extra: &str) -> (RecordingUpstream, Proxy) {
    let up = RecordingUpstream::start().await;
    let proxy = Proxy::start(&route("r", prefix, &up, extra)).await;
    (up, proxy)
}

/// `GET url` against the upstream's `/echo` endpoint: the headers it saw, by name.
async fn echoed_headers(url: &str, headers: &[(&str, &str)]) -> serde_json::Map<String, serde_json::Value> {
    let reply = send("GET", url, headers, Bytes::new()).await;
    assert_eq!(reply.status, 200, "body: {}", reply.text());
    reply.json()["headers"].as_object().cloned().expect("echo has a headers object")
}

/// Every value the upstream saw for `name`, one per header line.
fn values(headers: &serde_json::Map<String, serde_json::Value>, name: &str) -> Vec<String> {
    headers
        .get(name)
        .and_then(|v| v.as_array())
        .map_or_else(Vec::new, |values| values.iter().map(|v| v.as_str().unwrap().to_string()).collect())
}

/// `len` random bytes from the logged test seed (`FENCEGATE_TEST_SEED` replays them).
fn random_bytes(len: usize) -> Bytes {
    let mut data = vec![0u8; len];
    StdRng::seed_from_u64(test_seed()).fill(&mut data[..]);
    Bytes::from(data)
}

/// A guard against a hung socket: fails the test instead of blocking CI forever.
async fn within<T>(what: &str, fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), fut).await.unwrap_or_else(|_| panic!("{what} never finished"))
}

/// A request body fed frame by frame from a channel, with no length known up
/// front, so HTTP/1.1 clients send it chunked.
struct ChannelBody {
    rx: mpsc::Receiver<Bytes>,
}

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.rx.poll_recv(cx).map(|chunk| chunk.map(|data| Ok(Frame::data(data))))
    }
}

/// Sends `request` with `client` and reads the whole response.
async fn exchange<B>(
    client: &Client<hyper_util::client::legacy::connect::HttpConnector, B>,
    request: Request<B>,
) -> Reply
where
    B: Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let what = format!("{} {}", request.method(), request.uri());
    let response = within(&what, client.request(request)).await.unwrap_or_else(|e| panic!("{what}: {e:?}"));
    let (parts, body) = response.into_parts();
    let body = within(&what, body.collect()).await.unwrap().to_bytes();
    Reply { status: parts.status, headers: parts.headers, body }
}

/// Writes raw HTTP/1.1 bytes and reads the response head (up to the blank line).
async fn raw_exchange(addr: SocketAddr, request: &str) -> (TcpStream, String) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    // Byte by byte so that nothing after the head is consumed here.
    while !head.ends_with(b"\r\n\r\n") {
        let n = within("reading a response head", stream.read(&mut byte)).await.unwrap();
        assert_eq!(n, 1, "connection closed after {:?}", String::from_utf8_lossy(&head));
        head.push(byte[0]);
    }
    (stream, String::from_utf8(head).unwrap())
}

/// An upstream that answers every request with the response `respond` makes.
async fn canned_upstream(respond: fn() -> Response<Full<Bytes>>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let service = hyper::service::service_fn(move |_req| async move { Ok::<_, Infallible>(respond()) });
            tokio::spawn(hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service));
        }
    });
    addr
}

#[tokio::test]
async fn hop_by_hop_headers_stay_behind_and_end_to_end_headers_arrive() {
    let (up, proxy) = setup("/echo", "").await;
    let sent = [
        ("connection", "keep-alive, x-secret"),
        ("keep-alive", "timeout=5"),
        ("te", "trailers"),
        ("trailer", "x-checksum"),
        ("proxy-authorization", "Basic cHJveHk6c2VjcmV0"),
        ("proxy-connection", "keep-alive"),
        ("x-secret", "for the first hop only"),
        ("content-type", "text/plain"),
        ("x-custom", "kept"),
        ("authorization", "Bearer end-to-end"),
        ("x-fencing-token", "42"),
    ];
    let hop_by_hop =
        ["connection", "keep-alive", "te", "trailer", "proxy-authorization", "proxy-connection", "x-secret"];

    // Control: straight to the upstream, the client really sends every one of them.
    let direct = echoed_headers(&format!("{}/echo/h", up.url()), &sent).await;
    for name in hop_by_hop {
        assert!(direct.contains_key(name), "the test client did not send {name}: {direct:?}");
    }

    let headers = echoed_headers(&proxy.url("/echo/h"), &sent).await;
    for gone in hop_by_hop {
        assert!(!headers.contains_key(gone), "{gone} reached the upstream: {headers:?}");
    }
    assert_eq!(values(&headers, "content-type"), ["text/plain"]);
    assert_eq!(values(&headers, "x-custom"), ["kept"]);
    assert_eq!(values(&headers, "authorization"), ["Bearer end-to-end"]);
    assert_eq!(values(&headers, "x-fencing-token"), ["42"]);
}

#[tokio::test]
async fn x_forwarded_headers_name_the_client_the_scheme_and_the_requested_host() {
    let (_up, proxy) = setup("/echo", "").await;

    // A client behind other proxies: fencegate appends itself to the chain.
    let headers = echoed_headers(
        &proxy.url("/echo/chain"),
        &[("host", "store.example:8443"), ("x-forwarded-for", "203.0.113.7, 198.51.100.2")],
    )
    .await;
    assert_eq!(values(&headers, "x-forwarded-for"), ["203.0.113.7, 198.51.100.2, 127.0.0.1"]);
    assert_eq!(values(&headers, "x-forwarded-proto"), ["http"]);
    assert_eq!(values(&headers, "x-forwarded-host"), ["store.example:8443"]);

    // A direct client starts the chain.
    let headers = echoed_headers(&proxy.url("/echo/direct"), &[]).await;
    assert_eq!(values(&headers, "x-forwarded-for"), ["127.0.0.1"]);
    assert_eq!(values(&headers, "x-forwarded-host"), [proxy.addr.to_string()]);
}

#[tokio::test]
async fn x_forwarded_for_keeps_every_hop_when_the_chain_spans_several_header_lines() {
    let (_up, proxy) = setup("/echo", "").await;
    let headers = echoed_headers(
        &proxy.url("/echo/lines"),
        &[("x-forwarded-for", "203.0.113.7"), ("x-forwarded-for", "198.51.100.2")],
    )
    .await;
    // RFC 9110 §5.3: several field lines mean the same as one comma-joined line.
    assert_eq!(values(&headers, "x-forwarded-for").join(", "), "203.0.113.7, 198.51.100.2, 127.0.0.1");
}

#[tokio::test]
async fn host_is_the_upstream_authority_unless_the_route_preserves_it() {
    let up = RecordingUpstream::start().await;
    let routes = format!(
        "{}{}",
        route("rewritten", "/echo/rewritten", &up, ""),
        route("preserved", "/echo/preserved", &up, "preserve_host = true")
    );
    let proxy = Proxy::start(&routes).await;
    let client_host = [("host", "store.example")];

    let headers = echoed_headers(&proxy.url("/echo/rewritten"), &client_host).await;
    assert_eq!(values(&headers, "host"), [up.addr.to_string()]);

    let headers = echoed_headers(&proxy.url("/echo/preserved"), &client_host).await;
    assert_eq!(values(&headers, "host"), ["store.example"]);
}

#[tokio::test]
async fn an_upstream_base_path_is_prepended_to_the_full_path_and_query() {
    let up = RecordingUpstream::start().await;
    let routes = format!(
        "[[route]]\nname = \"files\"\nprefix = \"/files/\"\nupstream = \"http://{0}/base\"\n\
         [[route]]\nname = \"docs\"\nprefix = \"/docs/\"\nupstream = \"http://{0}/nested/base/\"\n",
        up.addr
    );
    let proxy = Proxy::start(&routes).await;

    assert_eq!(get(&proxy.url("/files/a%20b/c.txt?version=3&flag")).await.status, 404);
    assert_eq!(get(&proxy.url("/docs/readme?lang=en")).await.status, 404);
    assert_eq!(put(&proxy.url("/files/report"), 4, "r").await.status, 200);
    let seen: Vec<String> = up.seen().into_iter().map(|(_, path_and_query, _)| path_and_query).collect();
    assert_eq!(
        seen,
        ["/base/files/a%20b/c.txt?version=3&flag", "/nested/base/docs/readme?lang=en", "/base/files/report"]
    );

    // The fence key is still the client's path, not the upstream's.
    let p = put(&proxy.url("/files/report"), 3, "old").await.problem(409);
    assert_eq!(p["key"], "/files/report");
    assert_eq!(up.object("/base/files/report").unwrap(), "r");
}

#[tokio::test]
async fn a_4_mib_body_is_written_and_read_back_byte_for_byte() {
    let (up, proxy) = setup("/objects/", "").await;
    let url = proxy.url("/objects/big");
    let data = random_bytes(4 << 20);

    let written = send("PUT", &url, &[("x-fencing-token", "1")], data.clone()).await;
    assert_eq!(written.status, 200, "body: {}", written.text());
    assert_eq!(written.json()["len"], data.len());
    assert!(up.object("/objects/big").unwrap() == data, "the upstream stored different bytes");

    let read = get(&url).await;
    assert_eq!(read.status, 200);
    assert_eq!(read.body.len(), data.len());
    assert!(read.body == data, "the body read back through fencegate differs from the one written");
}

#[tokio::test]
async fn a_chunked_upload_of_many_frames_arrives_intact() {
    let (up, proxy) = setup("/objects/", "").await;
    let chunks: Vec<Bytes> = (0..64).map(|i| random_bytes(1000 + i * 517)).collect();
    let expected: Vec<u8> = chunks.iter().flat_map(|c| c.iter().copied()).collect();

    let (tx, rx) = mpsc::channel(4);
    let producer = tokio::spawn(async move {
        for chunk in chunks {
            tx.send(chunk).await.unwrap();
        }
    });
    let client = Client::builder(TokioExecutor::new()).build_http::<ChannelBody>();
    let request = Request::builder()
        .method(Method::PUT)
        .uri(proxy.url("/objects/streamed"))
        .header("x-fencing-token", "3")
        .body(ChannelBody { rx })
        .unwrap();
    let reply = exchange(&client, request).await;
    producer.await.unwrap();

    assert_eq!(reply.status, 200, "body: {}", reply.text());
    let applied = up.applied_for("/objects/streamed");
    assert_eq!(applied.len(), 1);
    assert_eq!(applied[0].token.as_deref(), Some("3"));
    assert!(up.object("/objects/streamed").unwrap() == expected, "the upstream stored different bytes");
}

#[tokio::test]
async fn http2_cleartext_clients_are_fenced_and_served() {
    let (up, proxy) = setup("/objects/", "").await;
    let client = Client::builder(TokioExecutor::new()).http2_only(true).build_http::<Full<Bytes>>();
    let url = proxy.url("/objects/h2");
    let data = random_bytes(1 << 20);
    let request = |method: Method, token: Option<&str>, body: Bytes| {
        let mut req = Request::builder().method(method).uri(&url).version(Version::HTTP_2);
        if let Some(token) = token {
            req = req.header("x-fencing-token", token);
        }
        req.body(Full::new(body)).unwrap()
    };

    let written = exchange(&client, request(Method::PUT, Some("5"), data.clone())).await;
    assert_eq!(written.status, 200, "body: {}", written.text());
    assert_eq!(written.json()["len"], data.len());

    let stale = exchange(&client, request(Method::PUT, Some("4"), Bytes::from_static(b"old"))).await;
    stale.problem(409);
    assert_eq!(stale.header("x-fencing-token-current"), Some("5"));

    let read = exchange(&client, request(Method::GET, None, Bytes::new())).await;
    assert_eq!(read.status, 200);
    assert!(read.body == data, "the body read back over HTTP/2 differs from the one written");

    let tokens: Vec<_> = up.applied_for("/objects/h2").into_iter().map(|a| a.token.unwrap()).collect();
    assert_eq!(tokens, ["5"]);
    // The upstream speaks HTTP/1.1 and needs a Host; an HTTP/2 request only has :authority.
    let (_, _, headers) = up.seen().into_iter().next().unwrap();
    assert_eq!(headers["host"], up.addr.to_string());
    assert_eq!(headers["x-forwarded-host"], proxy.addr.to_string());
}

#[tokio::test]
async fn an_unfenced_upgrade_switches_protocols_end_to_end() {
    // Only where the route says its tunnels need no fence.
    let (up, proxy) = setup("/objects/", "unfenced_tunnels = true").await;
    let (mut stream, head) =
        raw_exchange(proxy.addr, "GET /objects/ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
            .await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    assert!(head.to_ascii_lowercase().contains("\r\nupgrade: echo\r\n"), "{head}");

    for message in [&b"hello through fencegate"[..], &[0u8, 1, 2, 255, 254, 13, 10][..]] {
        stream.write_all(message).await.unwrap();
        let mut echoed = vec![0u8; message.len()];
        within("reading the echo", stream.read_exact(&mut echoed)).await.unwrap();
        assert_eq!(echoed, message);
    }
    let (_, _, headers) = up.seen().into_iter().next().unwrap();
    assert_eq!(headers["upgrade"], "echo");
}

#[tokio::test]
async fn a_fenced_write_never_switches_protocols() {
    // Not even on a route that lets unfenced requests switch.
    let (up, proxy) = setup("/objects/", "unfenced_tunnels = true").await;
    let (_stream, head) = raw_exchange(
        proxy.addr,
        "POST /objects/ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\
         X-Fencing-Token: 1\r\nContent-Length: 5\r\n\r\nhello",
    )
    .await;
    // The upstream was never asked to switch, so it took the request as a plain write.
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let applied = up.applied_for("/objects/ws");
    assert_eq!(applied.len(), 1);
    assert_eq!((applied[0].method.as_str(), applied[0].token.as_deref()), ("POST", Some("1")));
    assert_eq!(up.object("/objects/ws").unwrap(), "hello");
    let (_, _, headers) = up.seen().into_iter().next().unwrap();
    assert!(headers.get("upgrade").is_none(), "{headers:?}");

    // The key's turn was passed on: the next write goes through.
    assert_eq!(put(&proxy.url("/objects/ws"), 1, "again").await.status, 200);
}

#[tokio::test]
async fn an_upstream_404_reaches_the_client_as_the_upstream_sent_it() {
    let (_up, proxy) = setup("/objects/", "").await;
    let missing = get(&proxy.url("/objects/never-written")).await;
    assert_eq!(missing.status, 404);
    // Not fencegate's own no-route problem: the route matched and the upstream answered.
    assert_ne!(missing.header("content-type"), Some("application/problem+json"));
    assert!(missing.body.is_empty(), "body: {}", missing.text());
}

#[tokio::test]
async fn upstream_status_and_end_to_end_response_headers_pass_through() {
    let upstream = canned_upstream(|| {
        Response::builder()
            .status(StatusCode::CREATED)
            .header("location", "/objects/new/v2")
            .header("etag", "\"v2\"")
            .header("set-cookie", "a=1")
            .header("set-cookie", "b=2")
            .header("connection", "x-upstream-private")
            .header("x-upstream-private", "for fencegate only")
            .header("keep-alive", "timeout=5")
            .body(Full::new(Bytes::from_static(b"created")))
            .unwrap()
    })
    .await;
    let proxy =
        Proxy::start(&format!("[[route]]\nname = \"c\"\nprefix = \"/\"\nupstream = \"http://{upstream}\"\n")).await;

    // Control: straight from the upstream, the per-connection headers are there.
    let direct = put(&format!("http://{upstream}/objects/new"), 1, "x").await;
    for name in ["x-upstream-private", "keep-alive"] {
        assert!(direct.headers.get(name).is_some(), "the upstream did not send {name}: {:?}", direct.headers);
    }

    let reply = put(&proxy.url("/objects/new"), 1, "x").await;
    assert_eq!(reply.status, StatusCode::CREATED);
    assert_eq!(reply.header("location"), Some("/objects/new/v2"));
    assert_eq!(reply.header("etag"), Some("\"v2\""));
    let cookies: Vec<_> = reply.headers.get_all("set-cookie").iter().map(|v| v.to_str().unwrap()).collect();
    assert_eq!(cookies, ["a=1", "b=2"]);
    assert_eq!(reply.text(), "created");
    for gone in ["x-upstream-private", "keep-alive"] {
        assert!(reply.headers.get(gone).is_none(), "{gone} reached the client: {:?}", reply.headers);
    }
}

#[tokio::test]
async fn safe_methods_such_as_options_pass_untouched() {
    // PROPFIND only reads, and this route lists it as safe.
    let (up, proxy) = setup("/objects/", "safe_methods = [\"GET\", \"HEAD\", \"OPTIONS\", \"PROPFIND\"]").await;
    assert_eq!(put(&proxy.url("/objects/o"), 10, "v10").await.status, 200);

    let options = send("OPTIONS", &proxy.url("/objects/o"), &[("x-fencing-token", "1")], "").await;
    assert_eq!(options.status, 200, "body: {}", options.text());
    let propfind = send("PROPFIND", &proxy.url("/objects/o"), &[("x-fencing-token", "junk")], "").await;
    assert_eq!(propfind.status, 200, "body: {}", propfind.text());
    let no_token = send("OPTIONS", &proxy.url("/objects/o"), &[], "").await;
    assert_eq!(no_token.status, 200, "body: {}", no_token.text());

    let seen: Vec<(String, Option<String>)> = up
        .seen()
        .into_iter()
        .map(|(method, _, headers)| {
            (method.to_string(), headers.get("x-fencing-token").map(|v| v.to_str().unwrap().to_string()))
        })
        .collect();
    let expect = |m: &str, t: Option<&str>| (m.to_string(), t.map(str::to_string));
    assert_eq!(
        seen,
        [
            expect("PUT", Some("10")),
            expect("OPTIONS", Some("1")),
            expect("PROPFIND", Some("junk")),
            expect("OPTIONS", None)
        ]
    );
    // None of them moved the fence: 10 is still the mark.
    put(&proxy.url("/objects/o"), 9, "").await.problem(409);
    assert_eq!(put(&proxy.url("/objects/o"), 10, "").await.status, 200);
}

/// An upstream that counts the connections it accepts, the requests it
/// answers and the connections it has closed, and closes a keep-alive
/// connection idle for `idle`.
/// `PUT url` with body "v" and fencing token `token`.
fn fenced_put(url: &str, token: u64) -> Request<Full<Bytes>> {
    Request::put(url).header("x-fencing-token", token.to_string()).body(Full::new(Bytes::from_static(b"v"))).unwrap()
}

/// One route, `/` to `upstream`, keyed by the request path, plus `extra` lines.
fn path_keyed_route(upstream: SocketAddr, extra: &str) -> String {
    format!("[[route]]\nname = \"k\"\nprefix = \"/\"\nupstream = \"http://{upstream}\"\nkey = \"{{path}}\"\n{extra}\n")
}

async fn counting_upstream(idle: Duration) -> (SocketAddr, Arc<AtomicUsize>, Arc<AtomicUsize>, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let counter = || Arc::new(AtomicUsize::new(0));
    let (connections, requests, closed) = (counter(), counter(), counter());
    let (conns, reqs, ended) = (connections.clone(), requests.clone(), closed.clone());
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            conns.fetch_add(1, Ordering::SeqCst);
            let reqs = reqs.clone();
            let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let reqs = reqs.clone();
                async move {
                    let _ = req.into_body().collect().await;
                    reqs.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
                }
            });
            // hyper's head timer also runs while a kept connection waits for
            // its next request: an idle timeout, as upstream servers have.
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(idle)
                .serve_connection(TokioIo::new(stream), service);
            let ended = ended.clone();
            tokio::spawn(async move {
                let _ = conn.await;
                ended.fetch_add(1, Ordering::SeqCst);
            });
        }
    });
    (addr, connections, requests, closed)
}

#[tokio::test]
async fn a_client_connection_keeps_one_upstream_connection_and_outlives_its_idle_close() {
    let (upstream, connections, requests, closed) = counting_upstream(Duration::from_millis(300)).await;
    let proxy = Proxy::start(&path_keyed_route(upstream, "")).await;
    // One client connection (a pool of one), many requests in a row.
    let client = Client::builder(TokioExecutor::new()).pool_max_idle_per_host(1).build_http::<Full<Bytes>>();
    let put = |token: u64| fenced_put(&proxy.url("/objects/a"), token);
    for token in 1..=20 {
        assert_eq!(exchange(&client, put(token)).await.status, StatusCode::OK);
    }
    assert_eq!(requests.load(Ordering::SeqCst), 20);
    assert_eq!(
        connections.load(Ordering::SeqCst),
        1,
        "the client connection's requests shared one upstream connection"
    );

    // The upstream closes the idle connection; the next request from the same
    // client connection goes out once, on a fresh upstream connection.
    within("the upstream's idle close", async {
        while closed.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert_eq!(exchange(&client, put(21)).await.status, StatusCode::OK);
    assert_eq!(requests.load(Ordering::SeqCst), 21, "a request was lost or sent twice");
    assert_eq!(connections.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn an_http2_client_uses_as_many_upstream_connections_as_it_has_requests_in_flight() {
    let (upstream, connections, requests, _) = counting_upstream(Duration::from_secs(30)).await;
    let proxy = Proxy::start(&path_keyed_route(upstream, "")).await;
    // One HTTP/2 client connection.
    let client = Client::builder(TokioExecutor::new()).http2_only(true).build_http::<Full<Bytes>>();
    let put = |key: u64| {
        Request::put(proxy.url(&format!("/objects/{key}")))
            .version(Version::HTTP_2)
            .header("x-fencing-token", "1")
            .body(Full::new(Bytes::from_static(b"v")))
            .unwrap()
    };
    // Eight at once, different keys: nothing makes them wait for each other.
    let burst: Vec<_> = (0..8)
        .map(|key| {
            let (client, request) = (client.clone(), put(key));
            tokio::spawn(async move { exchange(&client, request).await })
        })
        .collect();
    for reply in burst {
        let reply = reply.await.unwrap();
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    }
    let opened = connections.load(Ordering::SeqCst);
    assert!((1..=8).contains(&opened), "{opened} upstream connections for 8 requests");
    // One at a time afterwards: the idle connections are reused, none opened.
    for key in 8..16 {
        assert_eq!(exchange(&client, put(key)).await.status, StatusCode::OK);
    }
    assert_eq!(requests.load(Ordering::SeqCst), 16, "a request was lost or sent twice");
    assert_eq!(connections.load(Ordering::SeqCst), opened, "sequential requests opened new upstream connections");
}

/// What a [`scripted_upstream`] connection does with one request, read whole.
#[derive(Clone, Copy)]
enum Step {
    /// Answers 200 at once.
    Answer,
    /// Sends the head and half the body at once, the rest once the test
    /// releases the upstream's held tails.
    AnswerSlowly,
    /// Closes the connection without answering: the request may have been applied.
    Vanish,
}

/// An upstream whose connections follow `script`, one step per request (and
/// [`Step::Answer`] after it). Counts connections and requests read; sending
/// `true` on the returned channel releases every [`Step::AnswerSlowly`] tail.
async fn scripted_upstream(
    script: &'static [Step],
) -> (SocketAddr, Arc<AtomicUsize>, Arc<AtomicUsize>, watch::Sender<bool>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (connections, requests) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (tails, released) = watch::channel(false);
    let (conns, reqs) = (connections.clone(), requests.clone());
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            conns.fetch_add(1, Ordering::SeqCst);
            let (reqs, mut released) = (reqs.clone(), released.clone());
            tokio::spawn(async move {
                let mut buf = Vec::new();
                for n in 0.. {
                    // One request: its head, then as many body bytes as it declares.
                    let head_end = loop {
                        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            break at + 4;
                        }
                        let mut chunk = [0u8; 4096];
                        match stream.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(read) => buf.extend_from_slice(&chunk[..read]),
                        }
                    };
                    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
                    let length: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .map(|v| v.trim().parse().unwrap())
                        .unwrap_or(0);
                    while buf.len() < head_end + length {
                        let mut chunk = [0u8; 4096];
                        match stream.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(read) => buf.extend_from_slice(&chunk[..read]),
                        }
                    }
                    buf.drain(..head_end + length);
                    reqs.fetch_add(1, Ordering::SeqCst);
                    let sent = match script.get(n).copied().unwrap_or(Step::Answer) {
                        Step::Answer => stream.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await,
                        Step::AnswerSlowly => {
                            let head = stream.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n01234").await;
                            let _ = released.wait_for(|released| *released).await;
                            head.and(stream.write_all(b"56789").await)
                        }
                        Step::Vanish => return,
                    };
                    if sent.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, connections, requests, tails)
}

#[tokio::test]
async fn a_request_the_upstream_may_have_received_is_never_sent_again() {
    let (upstream, connections, requests, _) = scripted_upstream(&[Step::Answer, Step::Vanish]).await;
    let proxy = Proxy::start(&path_keyed_route(upstream, "settle = \"0s\"")).await;
    let client = Client::builder(TokioExecutor::new()).pool_max_idle_per_host(1).build_http::<Full<Bytes>>();
    let put = |token: u64| fenced_put(&proxy.url("/objects/a"), token);
    assert_eq!(exchange(&client, put(1)).await.status, StatusCode::OK);
    // The second request goes out on the same upstream connection, which closes
    // after reading it: whether it was applied is unknown, so it is not resent.
    let reply = exchange(&client, put(2)).await;
    assert_eq!(reply.status, StatusCode::BAD_GATEWAY, "{}", reply.text());
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(requests.load(Ordering::SeqCst), 2, "a request that may have been applied was sent again");
    assert_eq!(connections.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_request_handed_back_unsent_by_a_busy_upstream_connection_goes_out_on_a_fresh_one() {
    let (upstream, connections, requests, tails) = scripted_upstream(&[Step::AnswerSlowly]).await;
    let proxy = Proxy::start(&path_keyed_route(upstream, "")).await;
    // One HTTP/2 client connection, so a second request can start while the
    // first response's body is still arriving.
    let client = Client::builder(TokioExecutor::new()).http2_only(true).build_http::<Full<Bytes>>();
    let put = |key: &str| {
        Request::put(proxy.url(key))
            .version(Version::HTTP_2)
            .header("x-fencing-token", "1")
            .body(Full::new(Bytes::from_static(b"v")))
            .unwrap()
    };
    let slow = client.request(put("/objects/slow")).await.unwrap();
    assert_eq!(slow.status(), StatusCode::OK);
    // The upstream connection is back among the idle ones, busy with that body
    // until the test releases it: it hands the next request back unsent, which
    // goes out on a new one (answered slowly too, as every connection is).
    let next = tokio::time::timeout(Duration::from_secs(30), client.request(put("/objects/next")))
        .await
        .expect("the next request waited for the busy connection's body")
        .unwrap();
    assert_eq!(next.status(), StatusCode::OK);
    assert_eq!(connections.load(Ordering::SeqCst), 2, "the next request waited for the busy connection");
    tails.send_replace(true);
    assert_eq!(slow.into_body().collect().await.unwrap().to_bytes(), "0123456789");
    assert_eq!(next.into_body().collect().await.unwrap().to_bytes(), "0123456789");
    assert_eq!(requests.load(Ordering::SeqCst), 2, "a request was lost or sent twice");
    assert_eq!(connections.load(Ordering::SeqCst), 2);
}

/// An upstream connection kept idle for the route's `upstream_idle_timeout`
/// is closed while its client connection stays open; the client's next
/// request goes out on a new one.
#[tokio::test]
async fn an_upstream_connection_idle_for_upstream_idle_timeout_is_closed() {
    // An upstream that counts the connections it has open.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap();
    let (open_tx, mut open) = watch::channel(0usize);
    let open_tx = Arc::new(open_tx);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let open_tx = open_tx.clone();
            open_tx.send_modify(|n| *n += 1);
            tokio::spawn(async move {
                let service = hyper::service::service_fn(|_req| async {
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
                });
                let _ =
                    hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
                open_tx.send_modify(|n| *n -= 1);
            });
        }
    });
    let routes = format!(
        "[[route]]\nname = \"r\"\nprefix = \"/r/\"\nupstream = \"http://{upstream}\"\nupstream_idle_timeout = \"300ms\"\n"
    );
    let proxy = Proxy::start(&routes).await;

    // One client connection, kept open throughout. The upstream connection
    // turns idle after the request was sent: the timeout counts from then.
    let sent = tokio::time::Instant::now();
    let (mut client, head) = raw_exchange(proxy.addr, "GET /r/a HTTP/1.1\r\nhost: t\r\n\r\n").await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let mut body = [0u8; 2];
    client.read_exact(&mut body).await.unwrap();
    assert_eq!(*open.borrow(), 1);
    within("the idle upstream connection closing", open.wait_for(|n| *n == 0)).await.unwrap();
    assert!(sent.elapsed() >= Duration::from_millis(300), "closed {:?} after the request", sent.elapsed());

    // The client connection is still there, and its next request is served.
    client.write_all(b"GET /r/b HTTP/1.1\r\nhost: t\r\n\r\n").await.unwrap();
    let mut answer = vec![0u8; 512];
    let n = within("the second answer", client.read(&mut answer)).await.unwrap();
    let answer = String::from_utf8_lossy(&answer[..n]).to_string();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert_eq!(*open.borrow(), 1, "a new upstream connection for the next request");
}
