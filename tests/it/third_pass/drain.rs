//! Every refusal reaches its client. A client that writes its whole body
//! before it reads a byte of the answer (Python's `http.client`, which
//! `requests` and many SDKs sit on) must read the 409 and its
//! `X-Fencing-Token-Current`, the 428 and the 413 that fencegate sends
//! before it has read the body: fencegate drains the rest of the body
//! within `[server] refusal_drain_*`, and the connection serves the next
//! request when the drain reached the body's end. An HTTP/2 client still
//! uploading when the refusal is sent finishes its upload and reads it. A
//! client that trickles past the drain's bounds has its connection closed.

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use serde_json::Value;

use crate::common::process::{config_text, start_in_process, MEMORY_STORE};
use crate::common::raw::Conn;
use crate::common::{put, route, Proxy, RecordingUpstream, PATIENCE};

/// The route's `max_body` in these tests.
const MAX_BODY: usize = 4 * 1024 * 1024;
/// Body sizes: past the socket buffers (where a client that writes first
/// breaks its pipe), past HTTP/2's stream window, and past `max_body`.
const SIZES: [usize; 3] = [200_000, 1_500_000, MAX_BODY + 1_000_000];

/// The mark every test raises first: a write with token 5.
const MARK: u64 = 5;

/// A fencegate with one fenced route, `max_body = MAX_BODY`, `server` extra
/// `[server]` lines; the mark of `/objects/a` raised to [`MARK`].
async fn fenced(server: &str) -> (RecordingUpstream, Proxy) {
    let upstream = RecordingUpstream::start().await;
    let routes = route("objects", "/objects/", &upstream, &format!("max_body = {MAX_BODY}"));
    let text = config_text("", MEMORY_STORE, &routes).replace("[server]\n", &format!("[server]\n{server}\n"));
    let proxy = start_in_process(&text).await;
    assert_eq!(put(&proxy.url("/objects/a"), MARK, "first").await.status, 200);
    (upstream, proxy)
}

/// Python's `http.client`: the request, head and whole body (`size` bytes,
/// chunked if asked), written before the response is read; then a `GET` on
/// the same connection. Prints what it read as JSON, or the error.
const WRITE_FIRST: &str = r#"
import http.client, json, sys
port, path, size, token, chunked = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5] == "chunked"
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
headers = {"Content-Type": "application/octet-stream"}
if token:
    headers["X-Fencing-Token"] = token
body = b"x" * size
out = {}
try:
    if chunked:
        chunks = (body[i:i + 65536] for i in range(0, size, 65536))
        conn.request("PUT", path, body=chunks, headers=headers, encode_chunked=True)
    else:
        conn.request("PUT", path, body=body, headers=headers)
    r = conn.getresponse()
    out = {"status": r.status, "current": r.getheader("X-Fencing-Token-Current"), "body": r.read().decode()}
    conn.request("GET", path)
    again = conn.getresponse()
    again.read()
    out["next"] = again.status
except Exception as e:
    out["error"] = repr(e)
print(json.dumps(out))
"#;

/// Runs [`WRITE_FIRST`] against `addr`.
async fn write_first(addr: SocketAddr, path: &str, size: usize, token: Option<u64>, chunked: bool) -> Value {
    let args = [
        addr.port().to_string(),
        path.to_string(),
        size.to_string(),
        token.map(|t| t.to_string()).unwrap_or_default(),
        if chunked { "chunked" } else { "length" }.to_string(),
    ];
    let output =
        tokio::task::spawn_blocking(move || Command::new("python3").arg("-c").arg(WRITE_FIRST).args(args).output())
            .await
            .unwrap()
            .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("{e}: {stdout}\n{}", String::from_utf8_lossy(&output.stderr)))
}

/// Whether `read` is the refusal `status` (with the current mark on a 409,
/// and a problem body), and the connection served the next request after it.
fn check_read(read: &Value, status: u64, what: &str) -> Result<(), String> {
    let problem: Value = serde_json::from_str(read["body"].as_str().unwrap_or_default()).unwrap_or_default();
    let current_ok = status != 409 || read["current"].as_str().and_then(|c| c.parse().ok()) == Some(MARK);
    // Drained to its end: the connection goes on.
    if read["status"] == status && problem["status"] == status && current_ok && read["next"] == 200 {
        Ok(())
    } else {
        Err(format!("{what}: {read}"))
    }
}

/// Every one of `checks` passed.
fn assert_all(checks: Vec<Result<(), String>>) {
    let failed: Vec<String> = checks.into_iter().filter_map(Result::err).collect();
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

#[tokio::test]
async fn a_client_that_writes_first_reads_its_409_and_the_current_mark() {
    let (upstream, proxy) = fenced("").await;
    let mut checks = Vec::new();
    for size in SIZES {
        let read = write_first(proxy.addr, "/objects/a", size, Some(MARK - 2), false).await;
        checks.push(check_read(&read, 409, &format!("a stale write of {size} bytes")));
    }
    assert_all(checks);
    assert_eq!(upstream.applied_for("/objects/a").len(), 1, "only the first write reached the upstream");
}

#[tokio::test]
async fn a_client_that_writes_first_reads_its_428() {
    let (upstream, proxy) = fenced("").await;
    let mut checks = Vec::new();
    for size in SIZES {
        let read = write_first(proxy.addr, "/objects/a", size, None, false).await;
        checks.push(check_read(&read, 428, &format!("a write of {size} bytes without a token")));
    }
    assert_all(checks);
    assert_eq!(upstream.applied_for("/objects/a").len(), 1, "only the first write reached the upstream");
}

/// Past `max_body`: refused on its declared length before a byte is read,
/// and, chunked, once the bytes read go past it.
#[tokio::test]
async fn a_client_that_writes_first_reads_its_413() {
    let (upstream, proxy) = fenced("").await;
    let size = MAX_BODY + 1_000_000;
    let mut checks = Vec::new();
    for chunked in [false, true] {
        let read = write_first(proxy.addr, "/objects/a", size, Some(MARK), chunked).await;
        checks.push(check_read(&read, 413, &format!("a body of {size} bytes, chunked: {chunked}")));
    }
    assert_all(checks);
    assert_eq!(upstream.applied_for("/objects/a").len(), 1, "only the first write reached the upstream");
}

/// An HTTP/2 client that sends its whole body (far past the stream's
/// flow-control window) before it looks at the response: the refusal comes
/// while it uploads, and it must be able to finish and read it.
#[tokio::test]
async fn an_http2_client_still_uploading_reads_its_refusal() {
    let (upstream, proxy) = fenced("").await;
    let mut checks = Vec::new();
    for (token, status) in [(Some(MARK - 2), 409), (None, 428), (Some(MARK), 413)] {
        let size = if status == 413 { MAX_BODY + 1_000_000 } else { 3_000_000 };
        let read = upload_then_read(proxy.addr, "/objects/a", token, size).await;
        let mark = (status == 409).then(|| MARK.to_string());
        checks.push(match read {
            Ok((got, current)) if got == status && current == mark => Ok(()),
            other => Err(format!("token {token:?}, {size} bytes: expected {status}, got {other:?}")),
        });
    }
    assert_all(checks);
    assert_eq!(upstream.applied_for("/objects/a").len(), 1, "only the first write reached the upstream");
}

/// An h2c client (the h2 crate) that sends a `PUT` of `size` bytes whole,
/// waiting for flow-control capacity as it goes, and only then awaits the
/// response: its status and `X-Fencing-Token-Current`, or where it broke.
async fn upload_then_read(
    addr: SocketAddr,
    path: &str,
    token: Option<u64>,
    size: usize,
) -> Result<(u16, Option<String>), String> {
    let tcp = tokio::net::TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let (client, connection) = h2::client::handshake(tcp).await.map_err(|e| format!("handshake: {e}"))?;
    tokio::spawn(connection);
    let mut client = client.ready().await.map_err(|e| format!("ready: {e}"))?;
    let mut request = Request::put(format!("http://{addr}{path}"));
    if let Some(token) = token {
        request = request.header("x-fencing-token", token);
    }
    let request = request.header("content-length", size).body(()).unwrap();
    let (response, mut upload) = client.send_request(request, false).map_err(|e| format!("send: {e}"))?;
    let chunk = Bytes::from(vec![b'x'; 16 * 1024]);
    let mut sent = 0;
    let uploading = async {
        while sent < size {
            upload.reserve_capacity(chunk.len().min(size - sent));
            let capacity = match std::future::poll_fn(|cx| upload.poll_capacity(cx)).await {
                Some(Ok(n)) => n,
                Some(Err(e)) => return Err(format!("the upload broke after {sent} of {size} bytes: {e}")),
                None => return Err(format!("the stream closed after {sent} of {size} bytes")),
            };
            let n = capacity.min(size - sent);
            if n == 0 {
                continue;
            }
            upload
                .send_data(chunk.slice(..n), sent + n == size)
                .map_err(|e| format!("the upload broke after {sent} of {size} bytes: {e}"))?;
            sent += n;
        }
        Ok(())
    };
    tokio::time::timeout(PATIENCE, uploading).await.map_err(|_| format!("the upload stalled after {sent} bytes"))??;
    let response = tokio::time::timeout(PATIENCE, response)
        .await
        .map_err(|_| "no response".to_string())?
        .map_err(|e| format!("response: {e}"))?;
    let current = response.headers().get("x-fencing-token-current").map(|v| v.to_str().unwrap().to_string());
    Ok((response.status().as_u16(), current))
}

/// The drain's bounds hold: a client refused mid-body that trickles its
/// body, a byte at a time, just within the silence, is closed once the
/// drain's whole time has passed, and one that falls silent once the
/// silence has; either reads its refusal first. Within the bounds, the
/// drained connection serves the next request.
#[tokio::test]
async fn a_client_cannot_hold_a_connection_past_the_drain_bounds() {
    let (_upstream, proxy) =
        fenced("refusal_drain_time = \"3s\"\nrefusal_drain_silence = \"1s\"\nidle_timeout = \"600s\"").await;
    let head = |len: usize| {
        format!("PUT /objects/a HTTP/1.1\r\nHost: x\r\nX-Fencing-Token: {}\r\nContent-Length: {len}\r\n\r\n", MARK - 1)
    };

    // Within the bounds: the rest of the body, then the next request.
    let mut conn = Conn::open(proxy.addr).await;
    conn.send(head(10).as_bytes()).await;
    assert_eq!(conn.response_to("PUT").await.status, 409);
    conn.send(b"0123456789").await;
    conn.send(b"GET /objects/a HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert_eq!(conn.response().await.status, 200, "the drained connection serves the next request");

    // A trickle: a byte every 300 ms, for ever.
    let mut conn = Conn::open(proxy.addr).await;
    conn.send(head(1_000_000).as_bytes()).await;
    assert_eq!(conn.response_to("PUT").await.status, 409);
    let (mut read, mut write) = conn.stream.into_split();
    let trickle = tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        while write.write_all(b"x").await.is_ok() {
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    });
    let closed = tokio::time::timeout(PATIENCE, async {
        use tokio::io::AsyncReadExt;
        let mut byte = [0u8; 1];
        // The end of the stream, or a reset.
        while matches!(read.read(&mut byte).await, Ok(1..)) {}
    })
    .await;
    assert!(closed.is_ok(), "a client trickling past the drain's time kept its connection for {PATIENCE:?}");
    trickle.abort();

    // Silence: the head, a few bytes, nothing more.
    let mut conn = Conn::open(proxy.addr).await;
    conn.send(head(1_000_000).as_bytes()).await;
    conn.send(b"xyz").await;
    assert_eq!(conn.response_to("PUT").await.status, 409);
    conn.until_closed().await;
}
