//! Bounds: headers. HPACK lets an HTTP/2 client name a header field once and
//! then refer to it by index: a few bytes on the wire decode into a large
//! head. Such heads are refused by the count of their fields
//! (`max_headers`, 431 `too-many-headers`) and by their decoded size
//! (`max_header_bytes`, a plain 431 from the HTTP/2 layer, as over HTTP/1.1);
//! and one connection may have at most `max_upstream_header_rate` bytes of
//! heads a second sent upstream (429 `header-rate`), so the upstream's load
//! stays bounded whatever a connection sends. A new connection starts with
//! one head's worth of that, so reconnecting buys no fresh burst.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http::{HeaderValue, Request, StatusCode};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

use crate::common::process::{config_text, start_in_process, MEMORY_STORE};
use crate::common::raw::{Conn, RawRequest};
use crate::common::{get, put, Proxy, RecordingUpstream};

/// A TCP stream that counts the bytes written to it.
struct Counted {
    inner: TcpStream,
    written: Arc<AtomicU64>,
}

impl AsyncRead for Counted {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Counted {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        let written = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = written {
            self.written.fetch_add(n as u64, Ordering::Relaxed);
        }
        written
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// An h2c connection whose written bytes are counted.
async fn h2c(addr: SocketAddr) -> (h2::client::SendRequest<Bytes>, Arc<AtomicU64>) {
    let written = Arc::new(AtomicU64::new(0));
    let tcp = Counted { inner: TcpStream::connect(addr).await.unwrap(), written: written.clone() };
    let (client, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(async move {
        let _ = connection.await;
    });
    (client, written)
}

/// What came back for one HTTP/2 request: the status and body, or the
/// stream's error.
fn exchange(
    client: &h2::client::SendRequest<Bytes>,
    request: Request<()>,
) -> impl std::future::Future<Output = Result<(StatusCode, http::HeaderMap, Bytes), h2::Error>> + Send + 'static {
    let client = client.clone();
    async move {
        let mut client = client.ready().await?;
        let (response, _) = client.send_request(request, true)?;
        let (parts, mut body) = response.await?.into_parts();
        let mut bytes = Vec::new();
        while let Some(chunk) = body.data().await {
            let chunk = chunk?;
            let _ = body.flow_control().release_capacity(chunk.len());
            bytes.extend_from_slice(&chunk);
        }
        Ok((parts.status, parts.headers, Bytes::from(bytes)))
    }
}

/// fencegate with `server` lines in `[server]` and one route to `up`.
async fn start(server: &str, up: &RecordingUpstream) -> Proxy {
    let route = format!("[[route]]\nname = \"objects\"\nprefix = \"/objects/\"\nupstream = \"{}\"\n", up.url());
    let config = config_text("", MEMORY_STORE, &route).replacen("[server]\n", &format!("[server]\n{server}\n"), 1);
    start_in_process(&config).await
}

/// An HPACK integer (RFC 7541 §5.1): `flags` in the bits above the
/// `prefix`-bit start.
fn int(value: usize, prefix: u8, flags: u8) -> Vec<u8> {
    let max = (1usize << prefix) - 1;
    if value < max {
        return vec![flags | value as u8];
    }
    let (mut out, mut rest) = (vec![flags | max as u8], value - max);
    while rest >= 128 {
        out.push((rest % 128) as u8 | 0x80);
        rest /= 128;
    }
    out.push(rest as u8);
    out
}

/// An HPACK string literal, not Huffman-coded.
fn string(text: &str) -> Vec<u8> {
    [int(text.len(), 7, 0), text.as_bytes().to_vec()].concat()
}

/// A header block for `PUT http://a.example{path}` with token 1, then
/// `name: value` added to the dynamic table once and referred to by its
/// index (62, the newest entry) `times - 1` times more: `times` fields
/// decoded from one literal and a byte each.
fn amplified_block(path: &str, name: &str, value: &str, times: usize) -> Vec<u8> {
    let mut block = Vec::new();
    // `:method` (static name 2) as a literal without indexing, `:scheme:
    // http` (static 6), `:path` (4), `:authority` (1), the token.
    block.extend([&[0x02][..], &string("PUT")].concat());
    block.push(0x86);
    block.extend([&[0x04][..], &string(path)].concat());
    block.extend([&[0x01][..], &string("a.example")].concat());
    block.extend([&[0x00][..], &string("x-fencing-token"), &string("1")].concat());
    // Literal with incremental indexing, new name: it becomes entry 62.
    block.extend([&[0x40][..], &string(name), &string(value)].concat());
    block.extend(std::iter::repeat_n(0x80 | 62, times - 1));
    block
}

/// An HTTP/2 frame (RFC 9113 §4.1).
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = (payload.len() as u32).to_be_bytes();
    [&[len[1], len[2], len[3], kind, flags][..], &stream.to_be_bytes(), payload].concat()
}

const HEADERS: u8 = 0x1;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;

/// A raw h2c connection: the preface and an empty SETTINGS sent.
async fn raw_h2c(addr: SocketAddr) -> Conn {
    let mut conn = Conn::open(addr).await;
    conn.send(&[&b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"[..], &frame(0x4, 0, 0, &[])].concat()).await;
    conn
}

/// Sends `block` as one HEADERS frame ending `stream`, and reads frames
/// until the response on it ends: its `:status` and body.
async fn raw_exchange(conn: &mut Conn, stream: u32, block: &[u8]) -> (u16, Vec<u8>) {
    match try_raw_exchange(conn, stream, block).await {
        Some((Some(status), body)) => (status, body),
        Some((None, _)) => panic!("no :status this test reads on stream {stream}"),
        None => panic!("closed before the response on stream {stream}"),
    }
}

/// [`raw_exchange`], or `None` if the connection ends (closed or reset)
/// before the response does. The status is `None` if it is not one
/// [`status_of`] reads (one the proxy's encoder indexed before).
async fn try_raw_exchange(conn: &mut Conn, stream: u32, block: &[u8]) -> Option<(Option<u16>, Vec<u8>)> {
    conn.stream.write_all(&frame(HEADERS, END_HEADERS | END_STREAM, stream, block)).await.ok()?;
    let (mut status, mut body) = (None, Vec::new());
    loop {
        while conn.buf.len() < 9
            || conn.buf.len() < 9 + u32::from_be_bytes([0, conn.buf[0], conn.buf[1], conn.buf[2]]) as usize
        {
            if conn.fill().await.unwrap_or(0) == 0 {
                return None;
            }
        }
        let len = u32::from_be_bytes([0, conn.buf[0], conn.buf[1], conn.buf[2]]) as usize;
        let f: Vec<u8> = conn.buf.drain(..9 + len).collect();
        let (kind, flags, id, payload) =
            (f[3], f[4], u32::from_be_bytes([f[5], f[6], f[7], f[8]]) & 0x7fff_ffff, &f[9..]);
        if id != stream {
            continue;
        }
        if kind == HEADERS && status.is_none() {
            status = Some(status_of(payload));
        }
        if kind == 0x0 {
            body.extend_from_slice(payload);
        }
        if matches!(kind, HEADERS | 0x0) && flags & END_STREAM != 0 {
            return Some((status.expect("a response ended before its head"), body));
        }
    }
}

/// `:status` from the start of a response's header block, as h2 writes it:
/// indexed from the static table (200), or a literal with the static name
/// 8 and three digits, raw or Huffman-coded (RFC 7541 Appendix B).
fn status_of(block: &[u8]) -> Option<u16> {
    if block.first() == Some(&0x88) {
        return Some(200);
    }
    if !matches!(block.first()?, 0x48 | 0x08 | 0x18) {
        return None;
    }
    let (huffman, len) = (block.get(1)? & 0x80 != 0, (block.get(1)? & 0x7f) as usize);
    let value = block.get(2..2 + len)?;
    if !huffman {
        return std::str::from_utf8(value).ok()?.parse().ok();
    }
    // The digits' codes: '0'..'2' in 5 bits, '3'..'9' in 6.
    let codes = [
        (0b00000, 5),
        (0b00001, 5),
        (0b00010, 5),
        (0b011001, 6),
        (0b011010, 6),
        (0b011011, 6),
        (0b011100, 6),
        (0b011101, 6),
        (0b011110, 6),
        (0b011111, 6),
    ];
    let bits: Vec<u8> = value.iter().flat_map(|b| (0..8).rev().map(move |i| (b >> i) & 1)).collect();
    let (mut at, mut digits) = (0, 0u16);
    for _ in 0..3 {
        let read = |n: usize| bits.get(at..at + n).map(|b| b.iter().fold(0u32, |v, bit| v << 1 | *bit as u32));
        let digit = codes.iter().position(|(code, n)| read(*n) == Some(*code))?;
        at += codes[digit].1;
        digits = digits * 10 + digit as u16;
    }
    Some(digits)
}

#[tokio::test]
async fn hpack_amplified_heads_are_refused_by_their_field_count_and_decoded_size() {
    let up = RecordingUpstream::start().await;
    let proxy = start("max_header_bytes = \"8KiB\"", &up).await;
    let mut conn = raw_h2c(proxy.addr).await;

    // 150 fields from one entry, about 5.7 KiB as HTTP/2 counts a header
    // list: under max_header_bytes, over max_headers (100).
    let block = amplified_block("/objects/counted", "x-pad", "abc", 150);
    let (status, body) = raw_exchange(&mut conn, 1, &block).await;
    assert_eq!(status, 431, "{}", String::from_utf8_lossy(&body));
    let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(problem["type"], "urn:fencegate:problem:too-many-headers");
    assert_eq!(problem["status"], 431);

    // 16 fields of 1000 bytes from one entry: a frame of about 1 KiB that
    // decodes into 16.5 KiB, over max_header_bytes. h2 answers 431 without
    // a body (and refuses the stream). A fresh connection: h2's answer
    // starts with a literal `:status`, not one its encoder indexed before.
    let mut conn = raw_h2c(proxy.addr).await;
    let block = amplified_block("/objects/big", "x-big", &"v".repeat(1000), 16);
    assert!(block.len() < 1100, "{} bytes", block.len());
    let (status, body) = raw_exchange(&mut conn, 1, &block).await;
    assert_eq!((status, body.len()), (431, 0));

    // The connection is still good for a head within bounds, and nothing
    // refused reached the upstream or raised a mark.
    let (status, _) = raw_exchange(&mut conn, 3, &amplified_block("/objects/fine", "x-pad", "abc", 10)).await;
    assert_eq!(status, 200);
    let paths: Vec<String> = up.seen().into_iter().map(|(_, path, _)| path).collect();
    assert_eq!(paths, ["/objects/fine"]);
    for key in ["/objects/counted", "/objects/big"] {
        let fence = get(&proxy.admin_url(&format!("/fences?key={key}"))).await.json();
        assert_eq!(fence["token"], serde_json::Value::Null, "{key}");
    }

    // HTTP/1.1 has the same bounds, from hyper's parser: 431, no body.
    assert_eq!(head_with_fields(101).send(proxy.addr).await.status, 431);
    // A normal client on another connection is served.
    assert_eq!(put(&proxy.url("/objects/normal"), 1, "x").await.status, 200);
}

/// `GET /objects/fine` with `fields` header fields, `Host` and
/// `Connection: close` among them.
fn head_with_fields(fields: usize) -> RawRequest {
    (2..fields).fold(RawRequest::new("GET", "/objects/fine"), |r, i| r.header(&format!("x-pad-{i}"), "abc"))
}

/// Over HTTP/1.1, a head with more than `max_headers` fields gets 431 and
/// goes nowhere, at the default (hyper's own limit, which fencegate leaves
/// unset) and set; one within the limit is forwarded. (The recording
/// upstream allows 100 fields, and fencegate adds three, `X-Forwarded-For`,
/// `X-Forwarded-Proto` and `X-Request-Id`: heads near 100 can't
/// be told apart from its own refusals, so those sizes are not sent.)
#[tokio::test]
async fn an_http1_head_over_max_headers_fields_is_refused_and_one_within_is_forwarded() {
    let up = RecordingUpstream::start().await;
    for (server, max, within) in [("", 100, 97), ("max_headers = 100", 100, 97), ("max_headers = 40", 40, 40)] {
        let proxy = start(server, &up).await;
        let seen = up.seen().len();
        assert_eq!(head_with_fields(max + 1).send(proxy.addr).await.status, 431, "{server:?}");
        assert_eq!(up.seen().len(), seen, "{server:?}: a refused head was forwarded");
        assert_eq!(head_with_fields(within).send(proxy.addr).await.status, 404, "{server:?}");
        assert_eq!(up.seen().len(), seen + 1, "{server:?}: a head within the limit was not forwarded");
    }
}

#[tokio::test]
async fn a_flood_of_heads_on_one_connection_is_rate_limited_and_the_upstream_gets_a_bounded_share() {
    const RATE: u64 = 64 * 1024;
    const HEAD: u64 = 8 * 1024;
    let up = RecordingUpstream::start().await;
    let proxy = start(&format!("max_header_bytes = {HEAD}\nmax_upstream_header_rate = {RATE}"), &up).await;
    let (mut client, written) = h2c(proxy.addr).await;
    let mut written = vec![written];

    // Heads of about 3 KiB, sent a few bytes each: one field indexed once.
    // A run of 64 refusals closes the connection (the test above): the
    // flood then reconnects, and each new connection may send one head
    // (`max_header_bytes`) beyond the rate.
    let field = "f".repeat(3000);
    let start = Instant::now();
    let mut statuses = Vec::new();
    let mut refusal = None;
    for round in 0..10 {
        let requests = (0..50).map(|i| {
            let mut request = Request::get(format!("http://{}/objects/r{round}-{i}", proxy.addr)).body(()).unwrap();
            request.headers_mut().insert("x-big", HeaderValue::from_str(&field).unwrap());
            exchange(&client, request)
        });
        let mut closed = false;
        for result in futures_join(requests).await {
            let Ok((status, headers, body)) = result else {
                closed = true;
                continue;
            };
            if status == 429 && refusal.is_none() {
                refusal = Some((headers, body));
            }
            statuses.push(status.as_u16());
        }
        if closed {
            let (fresh, counted) = h2c(proxy.addr).await;
            (client, written) = (fresh, [written, vec![counted]].concat());
        }
        // A normal client on another connection is served throughout.
        assert_eq!(put(&proxy.url("/objects/normal"), round + 1, "x").await.status, 200);
    }
    let elapsed = start.elapsed();
    let connections = written.len() as u64;
    let (headers, body) = refusal.expect("the flood was never refused");
    assert_eq!(headers["content-type"], "application/problem+json");
    assert_eq!(headers["retry-after"], "1");
    let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(problem["type"], "urn:fencegate:problem:header-rate");
    assert_eq!(problem["status"], 429);
    assert!(statuses.iter().all(|s| *s == 429 || *s == 404), "{statuses:?}");

    // What reached the upstream from the flood: at most one second's burst
    // plus the rate over the time it lasted (and the X-Forwarded-* fields
    // fencegate adds, a few percent here).
    let flood = head_bytes_upstream(&up, "/objects/r");
    let bound = (RATE as f64 * (1.0 + elapsed.as_secs_f64()) + (connections * HEAD) as f64) * 1.1;
    eprintln!(
        "sent {} KiB on the wire over {connections} connections, {} KiB of heads upstream in {elapsed:?} \
         (bound {} KiB), {} of {} refused",
        written.iter().map(|w| w.load(Ordering::Relaxed)).sum::<u64>() / 1024,
        flood / 1024,
        bound as u64 / 1024,
        statuses.iter().filter(|s| **s == 429).count(),
        statuses.len()
    );
    assert!((flood as f64) <= bound, "{flood} bytes of heads upstream in {elapsed:?}");

    // A fenced write refused for its rate reads and raises no mark.
    let (client, _) = h2c(proxy.addr).await;
    let mut refused_put = None;
    for i in 0..200 {
        let mut request = Request::put(format!("http://{}/objects/fenced", proxy.addr))
            .header("x-fencing-token", (100 + i).to_string())
            .body(())
            .unwrap();
        request.headers_mut().insert("x-big", HeaderValue::from_str(&field).unwrap());
        let (status, _, _) = exchange(&client, request).await.unwrap();
        if status == 429 {
            refused_put = Some(100 + i);
            break;
        }
    }
    let token = refused_put.expect("a fenced write was refused for its rate");
    let mark = get(&proxy.admin_url("/fences?key=/objects/fenced")).await.json()["token"].clone();
    assert!(mark.is_null() || mark.as_u64() < Some(token), "mark {mark} after a refused token {token}");
}

#[tokio::test]
async fn a_client_that_reconnects_after_each_refusal_gets_one_head_per_connection_plus_the_rate() {
    const HEAD: u64 = 8 * 1024;
    const RATE: u64 = 1024 * 1024;
    let up = RecordingUpstream::start().await;
    let proxy = start(&format!("max_header_bytes = {HEAD}\nmax_upstream_header_rate = {RATE}"), &up).await;
    let field = HeaderValue::from_str(&"f".repeat(3000)).unwrap();
    let head = |path: String| {
        let mut request = Request::get(format!("http://{}{path}", proxy.addr)).body(()).unwrap();
        request.headers_mut().insert("x-big", field.clone());
        request
    };

    // Each connection: one head alone, then heads twenty at a time until one
    // is refused; then a new connection. What each may have had upstream is
    // one head's worth (`max_header_bytes`) plus the rate for as long as it
    // was open, measured here from before the connect to after the refusal.
    let mut allowance = 0.0;
    for conn in 0..20 {
        let opened = Instant::now();
        let (client, _) = h2c(proxy.addr).await;
        // A new connection's first head always fits: it is served.
        let (status, _, _) = exchange(&client, head(format!("/objects/c{conn}-first"))).await.unwrap();
        assert_eq!(status, 404, "the first head on connection {conn} reached the upstream");
        let mut refused = false;
        for round in 0.. {
            assert!(round < 1000, "connection {conn} was never refused");
            let requests = (0..20).map(|i| exchange(&client, head(format!("/objects/c{conn}-{round}-{i}"))));
            for result in futures_join(requests).await {
                let (status, _, _) = result.unwrap();
                assert!(status == 404 || status == 429, "{status}");
                refused |= status == 429;
            }
            if refused {
                break;
            }
        }
        drop(client);
        allowance += HEAD as f64 + RATE as f64 * opened.elapsed().as_secs_f64();
    }

    // Reconnecting bought no second of burst: the upstream got no more than
    // the allowance (and the X-Forwarded-* fields fencegate adds, a few
    // percent here).
    let flood = head_bytes_upstream(&up, "/objects/c");
    eprintln!(
        "20 connections: {} KiB of heads upstream, allowance {} KiB (a second of burst each would be {} KiB)",
        flood / 1024,
        allowance as u64 / 1024,
        20 * RATE / 1024
    );
    assert!(flood as f64 <= allowance * 1.1, "{flood} bytes of heads upstream, allowance {allowance}");
}

/// A connection whose requests keep being refused for their heads is closed
/// after 64 refusals in a row (400, 429 or 431), over HTTP/1.1 and HTTP/2; an
/// answer of another kind breaks the run, and a normal client is served
/// throughout. A flood then pays a handshake per 64 requests.
#[tokio::test]
async fn a_connection_whose_requests_keep_being_refused_is_closed() {
    const RUN: usize = 64;
    let up = RecordingUpstream::start().await;
    let proxy = start("", &up).await;

    // HTTP/1.1, kept alive: malformed tokens get 400, one by one. A request
    // served in the middle (the upstream's 404) starts the run again.
    let mut conn = Conn::open(proxy.addr).await;
    let bad = RawRequest::new("PUT", "/objects/k").header("x-fencing-token", "not-a-number").body("x").keep_alive();
    for i in 0..RUN - 1 {
        conn.send(&bad.bytes()).await;
        assert_eq!(conn.response().await.status, 400, "request {i}");
    }
    conn.send(&RawRequest::new("GET", "/objects/served").keep_alive().bytes()).await;
    assert_eq!(conn.response().await.status, 404);
    let mut answered = 0;
    for _ in 0..RUN + 10 {
        if conn.stream.write_all(&bad.bytes()).await.is_err() {
            break;
        }
        match conn.try_response_to("PUT").await {
            Ok(reply) => {
                assert_eq!(reply.status, 400);
                answered += 1;
            }
            Err(_) => break,
        }
    }
    // The close may overtake the last answer.
    assert!((RUN - 1..=RUN).contains(&answered), "{answered} refusals answered after the served request");
    assert_eq!(put(&proxy.url("/objects/normal"), 1, "x").await.status, 200);

    // HTTP/2: heads with too many fields get 431 from the stack, one stream
    // after another, until the connection ends.
    let mut conn = raw_h2c(proxy.addr).await;
    let block = amplified_block("/objects/counted", "x-pad", "abc", 150);
    let mut answered = 0;
    for stream in (1..).step_by(2).take(RUN + 10) {
        match try_raw_exchange(&mut conn, stream, &block).await {
            // The problem's own status: h2 indexes `:status` after the first.
            Some((_, body)) => {
                let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
                assert_eq!(problem["status"], 431, "{problem}");
                answered += 1;
            }
            None => break,
        }
    }
    assert!((RUN - 1..=RUN).contains(&answered), "{answered} refusals answered over HTTP/2");
    assert_eq!(put(&proxy.url("/objects/normal"), 2, "x").await.status, 200);
    assert!(up.seen().iter().all(|(_, path, _)| path != "/objects/counted" && path != "/objects/k"));
}

/// The upstream's own refusals are its business: a client it answers 429 (or
/// 400) a hundred times in a row keeps its connection.
#[tokio::test]
async fn an_upstream_that_keeps_refusing_a_client_does_not_close_its_connection() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            tokio::spawn(async move {
                let service = hyper::service::service_fn(|_req: Request<hyper::body::Incoming>| async {
                    let status = 429;
                    Ok::<_, std::convert::Infallible>(
                        http::Response::builder()
                            .status(status)
                            .body(http_body_util::Full::new(Bytes::from_static(b"slow down")))
                            .unwrap(),
                    )
                });
                let io = hyper_util::rt::TokioIo::new(stream);
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await;
            });
        }
    });
    let route = format!("[[route]]\nname = \"objects\"\nprefix = \"/objects/\"\nupstream = \"http://{upstream}\"\n");
    let proxy = start_in_process(&config_text("", MEMORY_STORE, &route)).await;
    let mut conn = Conn::open(proxy.addr).await;
    for (i, token) in (1..=100).enumerate() {
        // Unfenced reads and fenced writes alike: forwarded, answered 429 upstream.
        let request = if i % 2 == 0 {
            RawRequest::new("GET", "/objects/polled").keep_alive()
        } else {
            RawRequest::new("PUT", "/objects/polled").token(token).body("x").keep_alive()
        };
        conn.send(&request.bytes()).await;
        let reply = conn.response().await;
        assert_eq!(reply.status, 429, "request {i}");
        assert_eq!(reply.text(), "slow down");
    }
}

/// The bytes of the heads the upstream saw for paths starting with `prefix`,
/// counted as fencegate counts them (request line and fields as HTTP/1.1).
fn head_bytes_upstream(up: &RecordingUpstream, prefix: &str) -> u64 {
    up.seen()
        .iter()
        .filter(|(_, path, _)| path.starts_with(prefix))
        .map(|(method, path, headers)| {
            let fields: usize = headers.iter().map(|(n, v)| n.as_str().len() + v.len() + 4).sum();
            (method.as_str().len() + path.len() + 13 + fields + 2) as u64
        })
        .sum()
}

/// Runs the exchanges at once on the one connection; their results in order.
async fn futures_join<F>(
    exchanges: impl Iterator<Item = F>,
) -> Vec<Result<(StatusCode, http::HeaderMap, Bytes), h2::Error>>
where
    F: std::future::Future<Output = Result<(StatusCode, http::HeaderMap, Bytes), h2::Error>> + Send + 'static,
{
    let tasks: Vec<_> = exchanges.map(tokio::spawn).collect();
    let mut results = Vec::new();
    for task in tasks {
        results.push(task.await.unwrap());
    }
    results
}
