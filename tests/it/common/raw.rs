//! A raw-socket HTTP/1.1 client: exact bytes out, responses parsed by hand.
//!
//! [`RawRequest`] builds a request byte for byte (odd method spellings,
//! absolute-form targets, odd `Host` values, bodies a well-behaved client would
//! never send); [`request`] and [`chunked`] build plainer ones. [`Conn`] is one
//! connection: it writes whatever it is given, reads responses as [`RawReply`],
//! and can tell a silent close from an answer.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Longest wait for something that should happen: generous, it only matters when
/// a test fails.
pub const DEADLINE: Duration = Duration::from_secs(20);

/// A request written byte for byte as built: nothing is normalized.
#[derive(Debug, Clone)]
pub struct RawRequest {
    method: String,
    target: String,
    host: Option<String>,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    chunked: bool,
    keep_alive: bool,
    /// A declared Content-Length that differs from the body sent.
    declared_len: Option<usize>,
}

impl RawRequest {
    /// `method target HTTP/1.1` with `Host: a.example`, `Connection: close`.
    pub fn new(method: &str, target: &str) -> RawRequest {
        RawRequest {
            method: method.to_string(),
            target: target.to_string(),
            host: Some("a.example".to_string()),
            headers: Vec::new(),
            body: Vec::new(),
            chunked: false,
            keep_alive: false,
            declared_len: None,
        }
    }

    pub fn host(mut self, host: &str) -> Self {
        self.host = Some(host.to_string());
        self
    }

    pub fn no_host(mut self) -> Self {
        self.host = None;
        self
    }

    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_string(), value.to_string()));
        self
    }

    /// `X-Fencing-Token: token`.
    pub fn token(self, token: u64) -> Self {
        self.header("X-Fencing-Token", &token.to_string())
    }

    /// The body, sent with its Content-Length (or chunked, see [`chunked`](Self::chunked)).
    pub fn body(mut self, body: impl AsRef<[u8]>) -> Self {
        self.body = body.as_ref().to_vec();
        self
    }

    /// `Transfer-Encoding: chunked`: the body as one chunk, then the last chunk.
    pub fn chunked(mut self) -> Self {
        self.chunked = true;
        self
    }

    /// `Content-Length: len` whatever the body holds.
    pub fn declare_len(mut self, len: usize) -> Self {
        self.declared_len = Some(len);
        self
    }

    /// No `Connection: close`.
    pub fn keep_alive(mut self) -> Self {
        self.keep_alive = true;
        self
    }

    /// The head: request line, headers, blank line.
    pub fn head(&self) -> Vec<u8> {
        let mut out = format!("{} {} HTTP/1.1\r\n", self.method, self.target);
        if let Some(host) = &self.host {
            out.push_str(&format!("Host: {host}\r\n"));
        }
        for (k, v) in &self.headers {
            out.push_str(&format!("{k}: {v}\r\n"));
        }
        if self.chunked {
            out.push_str("Transfer-Encoding: chunked\r\n");
        } else if let Some(len) = self.declared_len {
            out.push_str(&format!("Content-Length: {len}\r\n"));
        } else if !self.body.is_empty() {
            out.push_str(&format!("Content-Length: {}\r\n", self.body.len()));
        }
        if !self.keep_alive {
            out.push_str("Connection: close\r\n");
        }
        out.push_str("\r\n");
        out.into_bytes()
    }

    /// The body as it goes on the wire (chunk framing included).
    pub fn wire_body(&self) -> Vec<u8> {
        if !self.chunked {
            return self.body.clone();
        }
        let mut out = Vec::new();
        if !self.body.is_empty() {
            out.extend(format!("{:X}\r\n", self.body.len()).into_bytes());
            out.extend(&self.body);
            out.extend(b"\r\n");
        }
        out.extend(b"0\r\n\r\n");
        out
    }

    /// Head and body.
    pub fn bytes(&self) -> Vec<u8> {
        let mut out = self.head();
        out.extend(self.wire_body());
        out
    }

    /// Sends the request on a fresh connection and reads one response.
    pub async fn send(&self, addr: SocketAddr) -> RawReply {
        self.try_send(addr).await.unwrap_or_else(|e| panic!("{}: {e}", self.describe()))
    }

    /// Like [`send`](Self::send), but a connection closed without a response
    /// (or none within [`DEADLINE`]) is an `Err` saying what arrived.
    pub async fn try_send(&self, addr: SocketAddr) -> Result<RawReply, String> {
        let mut conn = Conn::open(addr).await;
        conn.stream.write_all(&self.bytes()).await.map_err(|e| format!("write: {e}"))?;
        conn.try_response_to(&self.method).await
    }

    /// What this request is, for a failure message.
    pub fn describe(&self) -> String {
        let headers: Vec<String> = self.headers.iter().map(|(k, v)| format!("{k}: {v:?}")).collect();
        format!(
            "{} {} (Host: {:?}; {}{})",
            self.method,
            self.target,
            self.host,
            headers.join("; "),
            if self.chunked { "; chunked" } else { "" }
        )
    }
}

/// A response read off a raw socket.
#[derive(Debug)]
pub struct RawReply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl RawReply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON; fails the test if it is not.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    /// The problem document, if the response is one.
    pub fn problem(&self) -> Option<serde_json::Value> {
        if self.header("content-type") != Some("application/problem+json") {
            return None;
        }
        serde_json::from_slice(&self.body).ok()
    }

    /// The problem `type`, if the response is a problem document.
    pub fn problem_type(&self) -> Option<String> {
        self.problem().and_then(|p| p["type"].as_str().map(str::to_string))
    }

    /// Asserts a 413 `body-too-large` problem.
    pub fn assert_body_too_large(&self) {
        assert_eq!(self.status, 413, "{self:?}");
        assert_eq!(self.header("content-type"), Some("application/problem+json"));
        let p = self.json();
        assert_eq!(p["type"], "urn:fencegate:problem:body-too-large", "{p}");
        assert_eq!(p["status"], 413);
    }
}

/// A client connection over a raw socket, with what it has read but not yet parsed.
pub struct Conn {
    pub stream: TcpStream,
    pub buf: Vec<u8>,
}

impl Conn {
    pub async fn open(addr: SocketAddr) -> Conn {
        let stream = tokio::time::timeout(DEADLINE, TcpStream::connect(addr))
            .await
            .expect("connect timed out")
            .unwrap_or_else(|e| panic!("connect to {addr}: {e}"));
        stream.set_nodelay(true).unwrap();
        Conn { stream, buf: Vec::new() }
    }

    pub async fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.expect("write failed");
    }

    /// Reads more bytes into the buffer: `Ok(0)` at the end of the stream.
    pub async fn fill(&mut self) -> std::io::Result<usize> {
        let mut chunk = [0u8; 16 * 1024];
        let n = self.stream.read(&mut chunk).await?;
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(n)
    }

    /// Reads until the buffer holds `n` bytes.
    pub async fn fill_to(&mut self, n: usize) -> Result<(), String> {
        while self.buf.len() < n {
            match self.fill().await {
                Ok(0) => return Err(format!("closed after {} bytes: {:?}", self.buf.len(), self.text())),
                Ok(_) => {}
                Err(e) => return Err(format!("{e} after {} bytes: {:?}", self.buf.len(), self.text())),
            }
        }
        Ok(())
    }

    /// Reads until the buffer holds `needle`; returns the index just past it.
    pub async fn fill_until(&mut self, needle: &[u8]) -> Result<usize, String> {
        loop {
            if let Some(i) = self.buf.windows(needle.len()).position(|w| w == needle) {
                return Ok(i + needle.len());
            }
            let want = self.buf.len() + 1;
            self.fill_to(want).await?;
        }
    }

    /// What is buffered, as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.buf).into_owned()
    }

    /// Takes the first `n` buffered bytes.
    pub fn take(&mut self, n: usize) -> Vec<u8> {
        self.buf.drain(..n).collect()
    }

    /// The next response to a request with `method` (a `HEAD` response has no
    /// body), or why there was none within [`DEADLINE`].
    pub async fn try_response_to(&mut self, method: &str) -> Result<RawReply, String> {
        self.try_response_within(method, DEADLINE).await
    }

    /// Like [`try_response_to`](Self::try_response_to) with a wait of `limit`.
    pub async fn try_response_within(&mut self, method: &str, limit: Duration) -> Result<RawReply, String> {
        match tokio::time::timeout(limit, self.parse_response(method == "HEAD")).await {
            Ok(result) => result,
            Err(_) => Err(format!("no response within {limit:?}; read so far: {:?}", self.text())),
        }
    }

    /// The next response to a request with `method`; fails the test if none.
    pub async fn response_to(&mut self, method: &str) -> RawReply {
        self.try_response_to(method).await.unwrap_or_else(|e| panic!("no response: {e}"))
    }

    /// The next response to a request that is not `HEAD`; fails the test if none.
    pub async fn response(&mut self) -> RawReply {
        self.response_to("GET").await
    }

    async fn parse_response(&mut self, head_only: bool) -> Result<RawReply, String> {
        let end = self.fill_until(b"\r\n\r\n").await?;
        let head = String::from_utf8_lossy(&self.take(end)).into_owned();
        let mut lines = head.trim_end().split("\r\n");
        let status_line = lines.next().unwrap_or_default();
        let status = status_line
            .strip_prefix("HTTP/1.1 ")
            .or_else(|| status_line.strip_prefix("HTTP/1.0 "))
            .and_then(|rest| rest.get(..3))
            .and_then(|code| code.parse().ok())
            .ok_or_else(|| format!("bad status line {status_line:?}"))?;
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        let get = |name: &str| headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
        let body = if head_only || status == 304 || status == 204 || (100..200).contains(&status) {
            Vec::new()
        } else if get("transfer-encoding").is_some_and(|te| te.eq_ignore_ascii_case("chunked")) {
            let mut body = Vec::new();
            loop {
                let line_end = self.fill_until(b"\r\n").await?;
                let line = String::from_utf8_lossy(&self.take(line_end)).trim().to_string();
                let size = usize::from_str_radix(line.split(';').next().unwrap_or_default(), 16)
                    .map_err(|e| format!("bad chunk size {line:?}: {e}"))?;
                if size == 0 {
                    let end = self.fill_until(b"\r\n").await?;
                    self.take(end);
                    break;
                }
                self.fill_to(size + 2).await?;
                body.extend(self.take(size));
                self.take(2);
            }
            body
        } else if let Some(len) = get("content-length") {
            let len: usize = len.parse().map_err(|e| format!("bad content-length {len:?}: {e}"))?;
            self.fill_to(len).await?;
            self.take(len)
        } else {
            // Delimited by the close.
            while self.fill().await.map_err(|e| e.to_string())? > 0 {}
            std::mem::take(&mut self.buf)
        };
        Ok(RawReply { status, headers, body })
    }

    /// Reads until the server closes the connection (end of stream or a
    /// reset), within [`DEADLINE`]; returns what arrived before, and what was
    /// buffered and unread.
    pub async fn until_closed(&mut self) -> Vec<u8> {
        let closed = tokio::time::timeout(DEADLINE, async {
            loop {
                match self.fill().await {
                    Ok(0) => return,
                    Ok(_) => {}
                    Err(e) => {
                        assert!(
                            matches!(
                                e.kind(),
                                std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::ConnectionAborted
                            ),
                            "expected a close, got {e}"
                        );
                        return;
                    }
                }
            }
        })
        .await;
        assert!(closed.is_ok(), "the connection was still open after {DEADLINE:?}; read {} bytes", self.buf.len());
        std::mem::take(&mut self.buf)
    }

    /// Asserts that the server closes the connection (end of stream or a reset)
    /// within [`DEADLINE`] without sending a single byte, nor having sent one
    /// that is still unread.
    pub async fn assert_closed_silently(&mut self) {
        let got = self.until_closed().await;
        assert!(got.is_empty(), "expected a silent close, got {:?}", String::from_utf8_lossy(&got));
    }

    /// Asserts that nothing arrives, and the connection stays open, for `wait`.
    pub async fn assert_silent_for(&mut self, wait: Duration) {
        if let Ok(read) = tokio::time::timeout(wait, self.fill()).await {
            panic!("expected silence for {wait:?}, got {read:?}: {:?}", self.text());
        }
    }
}

/// A request head with `Host: x` and `Content-Length`, and the body after it.
pub fn request(method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut out = format!("{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n", body.len());
    for (k, v) in headers {
        out.push_str(&format!("{k}: {v}\r\n"));
    }
    out.push_str("\r\n");
    let mut out = out.into_bytes();
    out.extend_from_slice(body);
    out
}

/// A chunked request (`Host: x`): the head and each of `chunks`, framed, with the final
/// zero chunk.
pub fn chunked(method: &str, path: &str, headers: &[(&str, &str)], chunks: &[&[u8]]) -> Vec<Vec<u8>> {
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let mut parts = vec![head.into_bytes()];
    for chunk in chunks {
        let mut framed = format!("{:x}\r\n", chunk.len()).into_bytes();
        framed.extend_from_slice(chunk);
        framed.extend_from_slice(b"\r\n");
        parts.push(framed);
    }
    parts.push(b"0\r\n\r\n".to_vec());
    parts
}

/// Sends a chunked request's parts one write at a time, as a streaming client
/// would. Write errors are ignored: fencegate may answer and close before the
/// last chunk, and the response is what the test reads next.
pub async fn send_parts(conn: &mut Conn, parts: &[Vec<u8>]) {
    for part in parts {
        if conn.stream.write_all(part).await.is_err() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// `len` bytes of a recognisable pattern.
pub fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| b"0123456789abcdefghijklmnopqrstuvwxyz"[i % 36]).collect()
}
