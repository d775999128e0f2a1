//! HTTP/2 to the upstream (route `upstream_http2 = true`): with prior knowledge
//! (h2c) to an `http://` upstream, chosen by ALPN with an `https://` one;
//! many requests in flight on one upstream connection; and the HTTP/2 ways
//! an upstream fails, each told apart by whether the request may have been
//! processed: a refused stream or a GOAWAY that does not cover it holds
//! nothing, a stream reset after the request was read settles the key.
//!
//! The upstreams are the recording store served by hyper's HTTP/1.1-or-HTTP/2
//! server ([`H2Upstream`], which records each request's version and
//! `:authority`), and a hand-written HTTP/2 server for the faults
//! ([`RawH2Upstream`]), on real sockets on 127.0.0.1.

use crate::common;

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Version};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use common::certs::Ca;
use common::h2::{tls_server_config, Fault, H2Upstream, RawH2Upstream, SeenRequest};
use common::process::{fencegate, run_to_exit, start_in_process, text, TempDir};
use common::raw::RawRequest;
use common::*;

/// A bound on any one exchange, so a hung socket fails the test instead of
/// blocking CI; passing tests finish far sooner.
const WITHIN: Duration = Duration::from_secs(15);

async fn within<T>(what: &str, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(WITHIN, fut).await.unwrap_or_else(|_| panic!("{what} did not finish within {WITHIN:?}"))
}

const H2: &str = "upstream_http2 = true\n";

/// The settles counter of `route`.
fn settles(route: &str) -> String {
    format!("fencegate_settles_total{{route=\"{route}\"}}")
}

/// A `[[route]]` to `upstream` (a URL, as written) with `extra` lines.
fn route_to(name: &str, prefix: &str, upstream: &str, extra: &str) -> String {
    format!("[[route]]\nname = \"{name}\"\nprefix = \"{prefix}\"\nupstream = \"{upstream}\"\n{extra}\n")
}

/// fencegate in this process with `workers` worker threads (the default is
/// one per CPU, so a test about connections pins it).
async fn start_with_workers(workers: usize, routes: &str) -> Proxy {
    start_in_process(&format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nshutdown_grace = \"5s\"\nworkers = {workers}\n\
         [admin]\nlisten = \"127.0.0.1:0\"\n[fences]\nstore = \"memory\"\n{routes}"
    ))
    .await
}

/// The versions of the requests, for failure messages and checks.
fn versions(requests: &[SeenRequest]) -> Vec<Version> {
    requests.iter().map(|r| r.version).collect()
}

/// Asserts every request reached the upstream over HTTP/2.
fn assert_all_http2(requests: &[SeenRequest]) {
    assert!(!requests.is_empty(), "no request reached the upstream");
    assert!(
        requests.iter().all(|r| r.version == Version::HTTP_2),
        "the upstream was not spoken to over HTTP/2: {:?}",
        versions(requests)
    );
}

/// Asserts `request` names `authority` as its `:authority`, and, if it also
/// carries a `Host`, the same one (RFC 9113 §8.3.1).
fn assert_authority(request: &SeenRequest, authority: &str) {
    assert_eq!(request.authority().as_deref(), Some(authority), "{} {}: {:?}", request.method, request.uri, request);
    if let Some(host) = request.header("host") {
        assert_eq!(host, authority, "Host and :authority disagree: {request:?}");
    }
}

/// An HTTP/2 (prior knowledge) client: one connection, many streams.
fn h2_client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).http2_only(true).build_http()
}

/// One request on `client`, response read whole.
async fn exchange(
    client: &Client<HttpConnector, Full<Bytes>>,
    method: Method,
    url: &str,
    headers: &[(&str, &str)],
    body: &'static str,
) -> Reply {
    let mut req = Request::builder().method(method.clone()).uri(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req.body(Full::new(Bytes::from_static(body.as_bytes()))).unwrap();
    let resp = within(&format!("{method} {url}"), client.request(req))
        .await
        .unwrap_or_else(|e| panic!("{method} {url}: {e:?}"));
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    Reply { status: parts.status, headers: parts.headers, body }
}

/// `PUT url` with `X-Fencing-Token: token` on a connection of its own, bounded.
async fn put_soon(url: &str, token: u64, body: &'static str) -> Reply {
    within(&format!("PUT {url} token {token}"), put(url, token, body)).await
}

/// Asserts `reply` is a 502 `upstream-error` that holds nothing: no `settle_ms`.
fn assert_unheld_502(reply: &Reply, why: &str) -> serde_json::Value {
    let p = reply.problem(502);
    let kind = p["type"].as_str().unwrap();
    assert!(kind.ends_with("upstream-error"), "{why}: {p}");
    assert!(p.get("settle_ms").is_none(), "{why}: the upstream did not process the request, yet it settles: {p}");
    assert!(!p["detail"].as_str().unwrap().contains("holds the key"), "{why}: {p}");
    p
}

/// After a first write that got [`assert_unheld_502`], the key is not held
/// (the route has `settle = "30s"` and `queue_timeout = "1s"`): a write with
/// the same token, and one with a higher token (which a held key would keep
/// waiting until its 503), are both answered 502 right away, and nothing
/// was counted as settled.
async fn assert_key_not_held(proxy: &Proxy, route_name: &str, url: &str, why: &str) {
    let again = put_soon(url, 1, "again").await;
    assert_unheld_502(&again, &format!("{why}, the same token again"));
    let next = put_soon(url, 2, "next").await;
    assert_ne!(
        next.status,
        503,
        "{why}: the key was held after a request the upstream never processed: {}",
        next.text()
    );
    assert_unheld_502(&next, &format!("{why}, a higher token"));
    assert_eq!(proxy.metric(&settles(route_name)).await, Some(0.0), "{why}");
}

// ------------------------------------------------------------------- h2c

#[tokio::test]
async fn a_fenced_put_and_a_get_reach_an_h2c_upstream_as_http2_with_its_authority_and_forwarded_headers() {
    let up = H2Upstream::start().await;
    let proxy = start_with_workers(1, &route("objects", "/objects/", &up, H2)).await;
    let url = proxy.url("/objects/a");

    let written = put_soon(&url, 5, "five").await;
    assert_eq!(written.status, 200, "{}", written.text());
    assert_eq!(written.json()["len"], 4);
    let stale = put_soon(&url, 3, "three").await;
    assert_eq!(stale.problem(409)["current"], 5);
    assert_eq!(stale.header("x-fencing-token-current"), Some("5"));
    let read = within("GET", get(&url)).await;
    assert_eq!((read.status.as_u16(), read.text().as_str()), (200, "five"));

    // The stale write never left: the upstream saw the PUT and the GET, over HTTP/2.
    let requests = up.requests();
    assert_all_http2(&requests);
    let methods: Vec<_> = requests.iter().map(|r| r.method.as_str()).collect();
    assert_eq!(methods, ["PUT", "GET"], "{requests:?}");
    let tokens: Vec<_> = up.applied_for("/objects/a").into_iter().map(|a| a.token.unwrap()).collect();
    assert_eq!(tokens, ["5"]);
    assert_eq!(up.object("/objects/a").as_deref(), Some(&b"five"[..]));

    let upstream_authority = up.addr.to_string();
    for request in &requests {
        assert_eq!(request.uri.scheme_str(), Some("http"), "{request:?}");
        assert_eq!(request.uri.path(), "/objects/a", "{request:?}");
        assert_authority(request, &upstream_authority);
        assert_eq!(request.header("x-forwarded-for").as_deref(), Some("127.0.0.1"), "{request:?}");
        assert_eq!(request.header("x-forwarded-proto").as_deref(), Some("http"), "{request:?}");
        assert_eq!(request.header("x-forwarded-host"), Some(proxy.addr.to_string()), "{request:?}");
    }
    assert_eq!(requests[0].header("x-fencing-token").as_deref(), Some("5"), "the token is forwarded unchanged");
    // Sequential requests from three client connections, one upstream connection.
    assert_eq!(up.connections(), 1, "versions seen: {:?}", versions(&requests));
}

#[tokio::test]
async fn with_preserve_host_the_authority_is_the_clients_host() {
    let up = H2Upstream::start().await;
    let proxy = Proxy::start(&route("objects", "/objects/", &up, &format!("{H2}preserve_host = true"))).await;
    let host = [("host", "store.example")];

    let written =
        within("PUT", send("PUT", &proxy.url("/objects/p"), &[host[0], ("x-fencing-token", "1")], "one")).await;
    assert_eq!(written.status, 200, "{}", written.text());
    let read = within("GET", send("GET", &proxy.url("/objects/p"), &host, Bytes::new())).await;
    assert_eq!((read.status.as_u16(), read.text().as_str()), (200, "one"));

    let requests = up.requests();
    assert_all_http2(&requests);
    assert_eq!(requests.len(), 2, "{requests:?}");
    for request in &requests {
        assert_authority(request, "store.example");
        assert_eq!(request.header("x-forwarded-host").as_deref(), Some("store.example"), "{request:?}");
    }
}

// ------------------------------------------------------- multiplexing

/// `n` fenced PUTs to keys `/objects/m{first_key}`..., each on a client
/// connection of its own, all held at the upstream at once: asserts the
/// upstream had at most `connections` connections (in all, since it started)
/// while all `n` were in flight, then releases them and asserts each got its 200.
async fn writes_in_flight_together(proxy: &Proxy, up: &H2Upstream, n: usize, first_key: usize, connections: usize) {
    let gate = up.hold_where(n, format!("{n} writes under /objects/m"), |m, path, _| {
        m == Method::PUT && path.starts_with("/objects/m")
    });
    let writes: Vec<_> = (first_key..first_key + n)
        .map(|i| {
            let url = proxy.url(&format!("/objects/m{i}"));
            tokio::spawn(async move { put(&url, 1, "m").await })
        })
        .collect();
    gate.wait_arrivals(n).await;
    assert!(
        up.connections() <= connections,
        "{n} writes in flight at once: {} upstream connections, more than {connections} (versions: {:?})",
        up.connections(),
        versions(&up.requests())
    );
    gate.release();
    for write in writes {
        let reply = within("a held write", write).await.unwrap();
        assert_eq!(reply.status, 200, "{}", reply.text());
    }
}

/// A first exchange (a GET of an object never written), so fencegate has
/// read the upstream's SETTINGS.
async fn warm_up(proxy: &Proxy) {
    let reply = within("GET", get(&proxy.url("/objects/warm"))).await;
    assert_eq!(reply.status, 404, "{}", reply.text());
}

/// Past the streams the upstream allows at once, a request opens another
/// connection instead of waiting unsent behind the limit: all 8 writes reach
/// an upstream that takes 5 at a time on a connection, over 2 connections.
#[tokio::test]
async fn past_the_upstreams_stream_limit_another_connection_opens() {
    let up = H2Upstream::start_limited(5).await;
    let proxy = start_with_workers(1, &route("objects", "/objects/", &up, H2)).await;
    warm_up(&proxy).await;
    writes_in_flight_together(&proxy, &up, 8, 0, 2).await;
    assert_eq!(up.connections(), 2, "8 streams at 5 a connection");
}

/// At the route's cap (one connection, 5 streams), the 3 writes past the
/// upstream's limit wait in fencegate, unsent, for a stream to end, and are
/// then served on the same connection.
#[tokio::test]
async fn at_the_cap_requests_wait_for_a_stream_to_end_then_go() {
    let up = H2Upstream::start_limited(5).await;
    let extra = format!("{H2}max_upstream_connections = 1\n");
    let proxy = start_with_workers(1, &route("objects", "/objects/", &up, &extra)).await;
    warm_up(&proxy).await;
    let gate = up.hold_where(5, "the first 5 writes", |m, path, _| m == Method::PUT && path.starts_with("/objects/w"));
    let writes: Vec<_> = (0..8)
        .map(|i| {
            let url = proxy.url(&format!("/objects/w{i}"));
            tokio::spawn(async move { put(&url, 1, "w").await })
        })
        .collect();
    gate.wait_arrivals(5).await;
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let puts = up.requests().iter().filter(|r| r.method == Method::PUT).count();
    assert_eq!(puts, 5, "writes past the upstream's 5 streams were sent instead of waiting");
    gate.release();
    for write in writes {
        let reply = within("a write", write).await.unwrap();
        assert_eq!(reply.status, 200, "{}", reply.text());
    }
    assert_eq!(up.connections(), 1, "the route's cap of one connection held");
}

/// At the cap with every stream in use for longer than `queue_timeout`: 503
/// `upstream-busy`, nothing sent.
#[tokio::test]
async fn at_the_cap_with_no_stream_free_a_write_gets_503_with_nothing_sent() {
    let up = H2Upstream::start_limited(1).await;
    let extra = format!("{H2}max_upstream_connections = 1\nqueue_timeout = \"300ms\"\n");
    let proxy = start_with_workers(1, &route("objects", "/objects/", &up, &extra)).await;
    warm_up(&proxy).await;
    let gate = up.hold("/objects/a");
    let held = tokio::spawn({
        let url = proxy.url("/objects/a");
        async move { put(&url, 1, "a").await }
    });
    gate.wait_arrived().await;
    let refused = within("the second write", put(&proxy.url("/objects/b"), 1, "b")).await;
    let p = refused.problem(503);
    assert_eq!(p["type"], "urn:fencegate:problem:upstream-busy", "{p}");
    assert!(up.requests().iter().all(|r| r.uri.path() != "/objects/b"), "the refused write was sent");
    gate.release();
    assert_eq!(within("the held write", held).await.unwrap().status, 200);
}

#[tokio::test]
async fn sequential_requests_from_one_client_connection_after_another_reuse_one_upstream_connection() {
    let up = H2Upstream::start().await;
    let proxy = start_with_workers(1, &route("objects", "/objects/", &up, H2)).await;

    // Two HTTP/1.1 clients, one after the other, each on one kept connection.
    for (who, client) in [("first", client()), ("second", client())] {
        for token in 1..=3u64 {
            let url = proxy.url(&format!("/objects/{who}"));
            let t = token.to_string();
            let reply = exchange(&client, Method::PUT, &url, &[("x-fencing-token", &t)], "w").await;
            assert_eq!(reply.status, 200, "{who} PUT {token}: {}", reply.text());
            let reply = exchange(&client, Method::GET, &url, &[], "").await;
            assert_eq!(reply.status, 200, "{who} GET: {}", reply.text());
        }
    }
    let requests = up.requests();
    assert_eq!(requests.len(), 12, "{requests:?}");
    assert_all_http2(&requests);
    assert_eq!(up.connections(), 1, "sequential requests did not reuse the upstream connection");
}

#[tokio::test]
async fn twenty_writes_in_flight_from_twenty_client_connections_share_one_upstream_connection() {
    let up = H2Upstream::start().await;
    let proxy = start_with_workers(1, &route("objects", "/objects/", &up, H2)).await;
    // No warm-up: the first upstream connection is opened while 20 requests want one.
    writes_in_flight_together(&proxy, &up, 20, 0, 1).await;
    // And again once it is up and idle.
    writes_in_flight_together(&proxy, &up, 20, 20, 1).await;
    let requests = up.requests();
    assert_eq!(requests.len(), 40);
    assert_all_http2(&requests);
    assert_eq!(up.connections(), 1);
}

#[tokio::test]
async fn twenty_streams_of_one_http2_client_share_one_upstream_connection() {
    let up = H2Upstream::start().await;
    let proxy = start_with_workers(1, &route("objects", "/objects/", &up, H2)).await;
    let gate = up
        .hold_where(20, "20 writes under /objects/s", |m, path, _| m == Method::PUT && path.starts_with("/objects/s"));
    let client = h2_client();
    let writes: Vec<_> = (0..20)
        .map(|i| {
            let (client, url) = (client.clone(), proxy.url(&format!("/objects/s{i}")));
            tokio::spawn(async move { exchange(&client, Method::PUT, &url, &[("x-fencing-token", "1")], "s").await })
        })
        .collect();
    gate.wait_arrivals(20).await;
    assert_eq!(up.connections(), 1, "versions: {:?}", versions(&up.requests()));
    gate.release();
    for write in writes {
        let reply = within("a held write", write).await.unwrap();
        assert_eq!(reply.status, 200, "{}", reply.text());
    }
    assert_all_http2(&up.requests());
    assert_eq!(up.connections(), 1);
}

/// The listener hands client connections to the workers in turn, and each
/// worker keeps the route's HTTP/2 connections for all the clients it serves
/// (docs/behaviour.md, "Streams"): with two workers, clients share at most
/// two upstream connections, however many they are and however many
/// requests they have in flight.
#[tokio::test]
async fn client_connections_on_two_workers_share_at_most_one_upstream_connection_each() {
    let up = H2Upstream::start().await;
    let proxy = start_with_workers(2, &route("objects", "/objects/", &up, H2)).await;
    for who in ["first", "second", "third", "fourth"] {
        let reply = put_soon(&proxy.url(&format!("/objects/{who}")), 1, "w").await;
        assert_eq!(reply.status, 200, "{who}: {}", reply.text());
    }
    assert!(up.connections() <= 2, "4 sequential clients on 2 workers: {} upstream connections", up.connections());
    writes_in_flight_together(&proxy, &up, 20, 0, 2).await;
    assert_all_http2(&up.requests());
    assert!(up.connections() <= 2, "{} upstream connections", up.connections());
}

/// A route's cap below the number of workers starves none: with one
/// connection allowed and a write held on it, writes from client connections
/// of either worker take a stream on that connection at once.
#[tokio::test]
async fn with_a_cap_of_one_every_worker_uses_the_one_connection() {
    let up = H2Upstream::start().await;
    let extra = format!("{H2}max_upstream_connections = 1\nqueue_timeout = \"300ms\"\n");
    let proxy = start_with_workers(2, &route("objects", "/objects/", &up, &extra)).await;
    let gate = up.hold("/objects/held");
    let held = tokio::spawn({
        let url = proxy.url("/objects/held");
        async move { put(&url, 1, "h").await }
    });
    gate.wait_arrived().await;
    // Each on a new client connection: the workers take them in turn.
    for i in 0..4 {
        let reply = within("a write beside the held one", put(&proxy.url(&format!("/objects/o{i}")), 1, "o")).await;
        assert_eq!(reply.status, 200, "write {i}: {}", reply.text());
    }
    assert_eq!(up.connections(), 1);
    gate.release();
    assert_eq!(within("the held write", held).await.unwrap().status, 200);
}

/// A connection one of whose requests went past the route's timeout takes
/// no new stream: the next request opens another connection instead of
/// waiting on an upstream that may be gone.
#[tokio::test]
async fn after_a_timeout_the_connection_takes_no_new_stream() {
    let up = H2Upstream::start().await;
    let extra = format!("{H2}timeout = \"300ms\"\nsettle = \"0s\"\n");
    let proxy = start_with_workers(1, &route("objects", "/objects/", &up, &extra)).await;
    let gate = up.hold("/objects/slow");
    let slow = within("the slow write", put(&proxy.url("/objects/slow"), 1, "s")).await;
    let p = slow.problem(504);
    assert_eq!(p["type"], "urn:fencegate:problem:upstream-timeout", "{p}");
    assert_eq!(up.connections(), 1);
    let next = within("the next write", put(&proxy.url("/objects/next"), 1, "n")).await;
    assert_eq!(next.status, 200, "{}", next.text());
    assert_eq!(up.connections(), 2, "the next write went to a new connection");
    gate.release();
}

// ------------------------------------------------------------------ TLS

/// A `[[route]]` `objects` to `https://localhost:{port}` trusting `ca` (file in `dir`).
fn https_route(dir: &TempDir, ca: &Ca, port: u16, extra: &str) -> String {
    https_route_named("objects", "/objects/", dir, ca, port, extra)
}

fn https_route_named(name: &str, prefix: &str, dir: &TempDir, ca: &Ca, port: u16, extra: &str) -> String {
    let ca_file = dir.write("ca.pem", &ca.pem());
    let upstream = format!("https://localhost:{port}");
    route_to(name, prefix, &upstream, &format!("ca_file = '{}'\n{extra}", ca_file.display()))
}

#[tokio::test]
async fn an_https_upstream_is_spoken_to_over_http2_chosen_by_alpn() {
    let ca = Ca::new("private CA");
    let up = H2Upstream::start_tls(tls_server_config(&ca.issue("store"), &[b"h2"])).await;
    let dir = TempDir::new();
    let proxy = start_with_workers(1, &https_route(&dir, &ca, up.addr.port(), H2)).await;
    let url = proxy.url("/objects/a");

    let written = put_soon(&url, 5, "five").await;
    assert_eq!(written.status, 200, "{}", written.text());
    put_soon(&url, 3, "three").await.problem(409);
    let read = within("GET", get(&url)).await;
    assert_eq!((read.status.as_u16(), read.text().as_str()), (200, "five"));

    let requests = up.requests();
    assert_eq!(requests.len(), 2, "{requests:?}");
    assert_all_http2(&requests);
    let authority = format!("localhost:{}", up.addr.port());
    for request in &requests {
        assert_eq!(request.uri.scheme_str(), Some("https"), "{request:?}");
        assert_authority(request, &authority);
    }
    let tokens: Vec<_> = up.applied_for("/objects/a").into_iter().map(|a| a.token.unwrap()).collect();
    assert_eq!(tokens, ["5"]);

    let handshakes = up.handshakes();
    assert_eq!(handshakes.len(), 1, "one connection, kept: {handshakes:?}");
    assert_eq!(up.connections(), 1);
    assert_eq!(handshakes[0].alpn.as_deref(), Some(&b"h2"[..]), "{handshakes:?}");
    assert_eq!(handshakes[0].server_name.as_deref(), Some("localhost"));
}

/// An https upstream whose TLS server selects no `h2` (`alpn` is what it offers).
async fn an_https_upstream_without_h2(alpn: &[&[u8]], why: &str) {
    let ca = Ca::new("private CA");
    let up = H2Upstream::start_tls(tls_server_config(&ca.issue("store"), alpn)).await;
    let dir = TempDir::new();
    let extra = format!("{H2}settle = \"30s\"\nqueue_timeout = \"1s\"\n");
    let proxy = Proxy::start(&https_route(&dir, &ca, up.addr.port(), &extra)).await;
    let url = proxy.url("/objects/k");

    let first = put_soon(&url, 1, "one").await;
    let p = assert_unheld_502(&first, why);
    eprintln!("{why}: {}", p["detail"]);
    assert_key_not_held(&proxy, "objects", &url, why).await;
    let requests = up.requests();
    assert!(requests.is_empty(), "{why}: a request reached the upstream's HTTP layer: {requests:?}");
    assert!(up.applied().is_empty(), "{why}");
    // Reads are refused the same way.
    let read = within("GET", get(&url)).await;
    assert_eq!(read.status, 502, "{why}: {}", read.text());
    assert!(up.requests().is_empty(), "{why}");
}

#[tokio::test]
async fn an_https_upstream_that_offers_only_http1_is_a_502_that_holds_nothing() {
    an_https_upstream_without_h2(&[b"http/1.1"], "ALPN http/1.1 only").await;
}

#[tokio::test]
async fn an_https_upstream_that_selects_no_alpn_protocol_is_a_502_that_holds_nothing() {
    an_https_upstream_without_h2(&[], "no ALPN").await;
}

// -------------------------------------------------------- HTTP/2 faults

/// fencegate with a route `objects` to `up` over HTTP/2, holding a key for
/// 30 s after an unknown outcome, and waiting at most 1 s for a key's turn.
async fn faulty(up: &RawH2Upstream) -> Proxy {
    let extra = format!("{H2}settle = \"30s\"\nqueue_timeout = \"1s\"\ntimeout = \"3s\"\n");
    Proxy::start(&route_to("objects", "/objects/", &up.url(), &extra)).await
}

#[tokio::test]
async fn a_refused_stream_is_a_502_that_holds_nothing() {
    let up = RawH2Upstream::start(Fault::RefuseStreams).await;
    let proxy = faulty(&up).await;
    let url = proxy.url("/objects/k");

    let first = put_soon(&url, 1, "one").await;
    assert!(up.requests() >= 1, "no HTTP/2 request reached the upstream: {}", up.describe());
    assert_unheld_502(&first, "REFUSED_STREAM");
    assert_key_not_held(&proxy, "objects", &url, "REFUSED_STREAM").await;
    assert!(up.bad_prefaces().is_empty(), "{}", up.describe());
}

#[tokio::test]
async fn a_goaway_that_does_not_cover_the_stream_is_a_502_that_holds_nothing() {
    let up = RawH2Upstream::start(Fault::GoAwayBeforeAny).await;
    let proxy = faulty(&up).await;
    let url = proxy.url("/objects/k");

    let first = put_soon(&url, 1, "one").await;
    assert!(up.requests() >= 1, "no HTTP/2 request reached the upstream: {}", up.describe());
    assert_unheld_502(&first, "GOAWAY(last_stream_id 0)");
    assert_key_not_held(&proxy, "objects", &url, "GOAWAY(last_stream_id 0)").await;
    assert!(up.bad_prefaces().is_empty(), "{}", up.describe());
}

#[tokio::test]
async fn a_stream_reset_after_the_request_was_read_settles_the_key() {
    let up = RawH2Upstream::start(Fault::ResetAfterBody).await;
    let proxy = faulty(&up).await;
    let url = proxy.url("/objects/k");

    let first = put_soon(&url, 1, "one").await;
    assert_eq!(up.bodies(), [3], "the upstream did not read the request whole: {}", up.describe());
    let p = first.problem(502);
    assert!(p["type"].as_str().unwrap().ends_with("upstream-error"), "{p}");
    assert_eq!(p["settle_ms"], 30_000, "the upstream read the request, so it may have acted on it: {p}");
    assert_eq!(p["key"], "/objects/k", "{p}");
    assert_eq!(proxy.metric(&settles("objects")).await, Some(1.0));
    // Sent once: it may have been processed, so it is never sent again.
    assert_eq!(up.requests(), 1, "{}", up.describe());

    // The key is held: the next owner's write waits, and gives up at its queue_timeout.
    let next = put_soon(&url, 2, "two").await;
    let p = next.problem(503);
    assert_eq!(p["type"], "urn:fencegate:problem:queue-timeout", "{p}");
    assert_eq!(up.requests(), 1, "a write reached the upstream during the settle period: {}", up.describe());
    assert_eq!(proxy.metric(&settles("objects")).await, Some(1.0));
}

/// A request the upstream did not process goes out again, once
/// (docs/behaviour.md, "What reached the upstream"): to an upstream that
/// refuses every stream, one fenced PUT (its body read whole) is sent twice.
#[tokio::test]
async fn a_request_refused_unprocessed_is_sent_again_once() {
    for fault in [Fault::RefuseStreams, Fault::GoAwayBeforeAny] {
        let up = RawH2Upstream::start(fault).await;
        let proxy = faulty(&up).await;
        let first = put_soon(&proxy.url("/objects/k"), 1, "one").await;
        assert_unheld_502(&first, &format!("{fault:?}"));
        let sent = up.requests();
        assert_eq!(sent, 2, "one PUT was sent {sent} times: {}", up.describe());
    }
}

/// nginx closes an HTTP/2 connection after `keepalive_requests` with a
/// GOAWAY naming the last stream it took: the streams above it go out again
/// on a new connection and are answered, a fenced write's key untouched by
/// settle; a GET (no body) too.
#[tokio::test]
async fn streams_above_a_goaway_go_out_again_on_a_new_connection_and_succeed() {
    let up = RawH2Upstream::start(Fault::GoAwayOnFirstConnection).await;
    let proxy = faulty(&up).await;
    let reply = put_soon(&proxy.url("/objects/k"), 1, "one").await;
    assert_eq!(reply.status, 200, "{}: {}", reply.text(), up.describe());
    assert_eq!(up.bodies(), [3], "the body went out whole on the second connection: {}", up.describe());
    assert_eq!((up.requests(), up.connections()), (2, 2), "{}", up.describe());
    assert_eq!(proxy.metric(&settles("objects")).await, Some(0.0));

    let up = RawH2Upstream::start(Fault::GoAwayOnFirstConnection).await;
    let proxy = faulty(&up).await;
    let reply = within("GET", get(&proxy.url("/objects/k"))).await;
    assert_eq!(reply.status, 200, "{}: {}", reply.text(), up.describe());
    assert_eq!((up.requests(), up.connections()), (2, 2), "{}", up.describe());
}

/// A body still streaming from the client (`stream_body`) can't be sent
/// again: a refused stream is a 502, sent once, and holds nothing.
#[tokio::test]
async fn a_streamed_body_refused_unprocessed_is_not_sent_again() {
    let up = RawH2Upstream::start(Fault::RefuseStreams).await;
    let extra = format!("{H2}stream_body = true\nsettle = \"30s\"\nqueue_timeout = \"1s\"\ntimeout = \"3s\"\n");
    let proxy = Proxy::start(&route_to("objects", "/objects/", &up.url(), &extra)).await;
    let url = proxy.url("/objects/k");
    let first = put_soon(&url, 1, "one").await;
    assert_unheld_502(&first, "REFUSED_STREAM, streamed body");
    assert_eq!(up.requests(), 1, "{}", up.describe());
    assert_key_not_held(&proxy, "objects", &url, "REFUSED_STREAM, streamed body").await;
}

// ---------------------------------------------------------------- config

#[test]
fn check_accepts_upstream_http2_and_refuses_one_that_is_not_a_bool() {
    let dir = TempDir::new();
    let config = |routes: &str| {
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n[fences]\nstore = \"memory\"\n{routes}"
        )
    };
    let ca = Ca::new("CA");
    let good = [
        route_to("objects", "/objects/", "http://127.0.0.1:9000", H2),
        https_route_named("secure", "/secure/", &dir, &ca, 9443, H2),
        route_to("plain", "/plain/", "http://127.0.0.1:9000", "upstream_http2 = false\n"),
    ]
    .concat();
    let path = dir.write("ok.toml", &config(&good));
    let out = run_to_exit(fencegate(dir.path()).arg("--config").arg(&path).arg("--check"));
    assert!(out.status.success(), "{:?}\nstderr: {}", out.status, text(&out.stderr));

    let bad = route_to("objects", "/objects/", "http://127.0.0.1:9000", "upstream_http2 = \"yes\"\n");
    let path = dir.write("bad.toml", &config(&bad));
    let out = run_to_exit(fencegate(dir.path()).arg("--config").arg(&path).arg("--check"));
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "upstream_http2 = \"yes\" passed --check; stderr: {stderr}");
    assert!(stderr.contains("upstream_http2"), "stderr does not name the field:\n{stderr}");
    assert!(!text(&out.stdout).contains("OK"), "stdout: {}", text(&out.stdout));
}

// -------------------------------------------------------------- upgrades

#[tokio::test]
async fn a_websocket_upgrade_on_an_http2_route_is_forwarded_without_upgrade() {
    let up = H2Upstream::start().await;
    let proxy = Proxy::start(&route("echo", "/echo/", &up, &format!("{H2}unfenced_tunnels = true\n"))).await;
    let request = RawRequest::new("GET", "/echo/ws")
        .header("Connection", "Upgrade")
        .header("Upgrade", "websocket")
        .header("Sec-WebSocket-Version", "13")
        .header("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
        .keep_alive();
    let reply = within("the upgrade request", request.send(proxy.addr)).await;
    assert_eq!(reply.status, 200, "{:?}: {}", reply.headers, reply.text());
    assert!(reply.problem().is_none(), "{}", reply.text());

    let requests = up.requests();
    assert_eq!(requests.len(), 1, "{requests:?}");
    assert_all_http2(&requests);
    assert_eq!(requests[0].method, Method::GET);
    assert_eq!(requests[0].uri.path(), "/echo/ws");
    for gone in ["upgrade", "connection"] {
        assert!(requests[0].headers.get(gone).is_none(), "{gone} reached the upstream: {:?}", requests[0].headers);
    }
    // The upstream's own answer, which echoes what it saw, agrees.
    let echoed = reply.json();
    assert!(echoed["headers"].get("upgrade").is_none(), "{echoed}");
}

// ---------------------------------------------------------- a real server

/// nginx (WebDAV) over h2c, closing each connection after 5 streams with a
/// GOAWAY that names the last stream it took, as its `keepalive_requests`
/// does: 24 fenced writes, 4 at a time from 4 client connections, all land,
/// none answered 502, no key settles, and each file holds its last write.
/// (With at most 4 streams in flight, a stream sent again is among the first
/// 4 of its new connection, so nginx never refuses it twice.)
#[tokio::test]
async fn nginx_over_h2c_closing_connections_every_5_streams_takes_every_write() {
    let nginx = common::realistic::Nginx::start_h2c(5);
    let proxy = Proxy::start(&route_to("objects", "/objects/", &nginx.url(), H2)).await;
    for round in 0..6u64 {
        let writes: Vec<_> = (0..4)
            .map(|i| {
                let url = proxy.url(&format!("/objects/n{i}"));
                let body: &'static str = ["one", "two", "three", "four", "five", "six"][round as usize];
                tokio::spawn(async move { put(&url, round + 1, body).await })
            })
            .collect();
        for write in writes {
            let reply = within("a write to nginx", write).await.unwrap();
            assert!(reply.status.is_success(), "{}: {}\n{}", reply.status, reply.text(), nginx.error_log());
        }
    }
    for i in 0..4 {
        assert_eq!(nginx.file(&format!("default/objects/n{i}")).as_deref(), Some("six"), "{:?}", nginx.files());
    }
    assert_eq!(proxy.metric(&settles("objects")).await, Some(0.0));
    assert_eq!(proxy.metric("fencegate_requests_total{route=\"objects\",outcome=\"forwarded\"}").await, Some(24.0));
}

// ---------------------------------------------------------- body limits

/// A fenced body streamed to the upstream (`stream_body`) that goes past
/// `max_body` with no `Content-Length` is answered 413, over HTTP/2 to the
/// upstream as over HTTP/1.1, although the HTTP/2 layer only resets the
/// stream: part of it was sent, so the key settles.
#[tokio::test]
async fn a_streamed_body_past_max_body_is_a_413_on_either_protocol() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    for http2 in [false, true] {
        let up = H2Upstream::start().await;
        let extra =
            format!("{}stream_body = true\nmax_body = \"1KiB\"\nsettle = \"5s\"\n", if http2 { H2 } else { "" });
        let proxy = start_with_workers(1, &route("objects", "/objects/", &up, &extra)).await;
        let addr = proxy.url("/").trim_start_matches("http://").trim_end_matches('/').to_string();
        let mut conn = tokio::net::TcpStream::connect(&addr).await.unwrap();
        let head = "PUT /objects/big HTTP/1.1\r\nHost: x\r\nX-Fencing-Token: 1\r\nTransfer-Encoding: chunked\r\n\r\n";
        conn.write_all(head.as_bytes()).await.unwrap();
        let chunk = format!("400\r\n{}\r\n", "a".repeat(1024));
        let mut answer = Vec::new();
        let read = async {
            for _ in 0..4 {
                if conn.write_all(chunk.as_bytes()).await.is_err() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let _ = conn.write_all(b"0\r\n\r\n").await;
            let mut buf = [0u8; 4096];
            while !String::from_utf8_lossy(&answer).contains("\r\n\r\n") {
                match conn.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => answer.extend_from_slice(&buf[..n]),
                }
            }
        };
        within("the answer", read).await;
        let answer = String::from_utf8_lossy(&answer).into_owned();
        assert!(answer.starts_with("HTTP/1.1 413"), "http2 = {http2}: {answer}");
        assert!(answer.contains("body-too-large"), "http2 = {http2}: {answer}");
        assert_eq!(proxy.metric(&settles("objects")).await, Some(1.0), "http2 = {http2}");
    }
}

/// A refused stream with no connection to send it again on (the route's one
/// slot is still held by the connection that refused it) is answered with
/// the refusal, 502, not as a busy route: it did reach the upstream.
#[tokio::test]
async fn a_refused_stream_with_no_connection_left_for_it_is_the_refusal() {
    let up = RawH2Upstream::start(Fault::RefuseStreams).await;
    let extra =
        format!("{H2}max_upstream_connections = 1\nsettle = \"30s\"\nqueue_timeout = \"1s\"\ntimeout = \"3s\"\n");
    let proxy = Proxy::start(&route_to("objects", "/objects/", &up.url(), &extra)).await;
    let reply = put_soon(&proxy.url("/objects/k"), 1, "one").await;
    let p = assert_unheld_502(&reply, "REFUSED_STREAM at the cap");
    assert_eq!(p["title"], "Upstream refused the request unprocessed", "{p}");
}
