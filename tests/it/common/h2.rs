//! HTTP/2 upstreams for the `upstream_http2` tests.
//!
//! - [`H2Upstream`]: the recording store ([`RecordingUpstream`], reached
//!   through `Deref`: holds, `applied`, `seen`, `connections`, `handshakes`)
//!   served by hyper's automatic HTTP/1.1-or-HTTP/2 server, in clear (HTTP/2
//!   by prior knowledge) or behind TLS. It also records each request's
//!   version, full URI (HTTP/2 `:scheme` and `:authority` included) and
//!   headers, so a test can tell that fencegate spoke HTTP/2, and a request
//!   sent as HTTP/1.1 by mistake is recorded as such instead of failing
//!   at the connection preface with a less telling error.
//! - [`RawH2Upstream`]: a hand-written HTTP/2 server that plays one fault:
//!   refusing streams (`RST_STREAM(REFUSED_STREAM)`), `GOAWAY` before
//!   processing anything, or a stream reset after the request was read whole.
//!
//! Both listen on `127.0.0.1:0`.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::ops::Deref;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{HeaderMap, Method, Uri, Version};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::certs::Identity;
use super::{RecordingUpstream, UpstreamState};

/// A TLS server config that shows `id` and offers the ALPN protocols `alpn`
/// (none: the server selects no protocol whatever the client offers).
pub fn tls_server_config(id: &Identity, alpn: &[&[u8]]) -> Arc<rustls::ServerConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from_pem_slice(id.cert.as_bytes()).unwrap()],
            PrivateKeyDer::from_pem_slice(id.key.as_bytes()).unwrap(),
        )
        .unwrap();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(config)
}

/// One request as the upstream's HTTP layer received it.
#[derive(Debug, Clone)]
pub struct SeenRequest {
    pub version: Version,
    pub method: Method,
    /// Over HTTP/2, absolute: `:scheme://:authority:path`.
    pub uri: Uri,
    pub headers: HeaderMap,
}

impl SeenRequest {
    /// The `:authority` (HTTP/2) or absolute-form authority the request named.
    pub fn authority(&self) -> Option<String> {
        self.uri.authority().map(|a| a.to_string())
    }

    /// The single value of `name`, if sent once.
    pub fn header(&self, name: &str) -> Option<String> {
        let mut values = self.headers.get_all(name).iter();
        let first = values.next()?.to_str().unwrap_or("<not text>").to_string();
        assert!(values.next().is_none(), "{name} sent more than once: {:?}", self.headers);
        Some(first)
    }
}

/// The recording store speaking HTTP/2 (and HTTP/1.1, recorded as such).
#[derive(Clone)]
pub struct H2Upstream {
    pub inner: RecordingUpstream,
    requests: Arc<Mutex<Vec<SeenRequest>>>,
    /// Its `SETTINGS_MAX_CONCURRENT_STREAMS`, if it sets one.
    max_streams: Option<u32>,
}

impl Deref for H2Upstream {
    type Target = RecordingUpstream;

    fn deref(&self) -> &RecordingUpstream {
        &self.inner
    }
}

impl H2Upstream {
    /// In clear: HTTP/2 with prior knowledge (h2c), or HTTP/1.1.
    pub async fn start() -> H2Upstream {
        Self::start_with(None, None).await
    }

    /// In clear, allowing at most `streams` streams at once on a connection
    /// (`SETTINGS_MAX_CONCURRENT_STREAMS`).
    pub async fn start_limited(streams: u32) -> H2Upstream {
        Self::start_with(None, Some(streams)).await
    }

    /// Behind TLS with `config` (see [`tls_server_config`] for its ALPN): the
    /// handshakes it accepts are recorded ([`RecordingUpstream::handshakes`]),
    /// the ones that fail counted ([`RecordingUpstream::failed_handshakes`]).
    pub async fn start_tls(config: Arc<rustls::ServerConfig>) -> H2Upstream {
        Self::start_with(Some(tokio_rustls::TlsAcceptor::from(config)), None).await
    }

    async fn start_with(tls: Option<tokio_rustls::TlsAcceptor>, max_streams: Option<u32>) -> H2Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let inner = RecordingUpstream { addr, state: Arc::new(Mutex::new(UpstreamState::default())) };
        let upstream = H2Upstream { inner, requests: Arc::default(), max_streams };
        let serving = upstream.clone();
        super::accept_for_ever(listener, tls, upstream.inner.state.clone(), move |stream| {
            serving.clone().serve(stream)
        });
        upstream
    }

    async fn serve<S>(self, stream: S)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let service = hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
            self.requests.lock().unwrap().push(SeenRequest {
                version: req.version(),
                method: req.method().clone(),
                uri: req.uri().clone(),
                headers: req.headers().clone(),
            });
            self.inner.clone().handle(req)
        });
        let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
        builder.http2().max_concurrent_streams(self.max_streams);
        let _ = builder.serve_connection(TokioIo::new(stream), service).await;
    }

    /// Every request the HTTP layer received, in arrival order.
    pub fn requests(&self) -> Vec<SeenRequest> {
        self.requests.lock().unwrap().clone()
    }
}

// ------------------------------------------------------------ raw HTTP/2

/// The client connection preface (RFC 9113 §3.4).
pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Frame types (RFC 9113 §6).
pub const DATA: u8 = 0x0;
pub const HEADERS: u8 = 0x1;
pub const RST_STREAM: u8 = 0x3;
pub const SETTINGS: u8 = 0x4;
pub const PING: u8 = 0x6;
pub const GOAWAY: u8 = 0x7;
pub const WINDOW_UPDATE: u8 = 0x8;
pub const CONTINUATION: u8 = 0x9;

/// Frame flags.
pub const END_STREAM: u8 = 0x1;
pub const ACK: u8 = 0x1;
pub const END_HEADERS: u8 = 0x4;

/// RFC 9113 §7 error codes.
pub const NO_ERROR: u32 = 0x0;
pub const INTERNAL_ERROR: u32 = 0x2;
pub const REFUSED_STREAM: u32 = 0x7;

/// The fault a [`RawH2Upstream`] plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Every request's HEADERS is answered with `RST_STREAM(REFUSED_STREAM)`:
    /// not processed, safe to send again (RFC 9113 §8.7).
    RefuseStreams,
    /// The first HEADERS on each connection is answered with
    /// `GOAWAY(last_stream_id = 0, NO_ERROR)`, and the connection closed:
    /// no stream was processed.
    GoAwayBeforeAny,
    /// Each request is read whole (to `END_STREAM`), then its stream is reset
    /// with `RST_STREAM(INTERNAL_ERROR)`: the upstream may have acted on it.
    ResetAfterBody,
    /// The first connection plays [`Fault::GoAwayBeforeAny`] (as nginx
    /// closing a connection after `keepalive_requests`); on every later one,
    /// each request is read whole and answered `200` with no body.
    GoAwayOnFirstConnection,
}

#[derive(Default)]
struct RawState {
    connections: usize,
    /// Connections that opened with the HTTP/2 preface.
    prefaces: usize,
    /// The first bytes of connections that did not.
    bad_prefaces: Vec<String>,
    /// Requests begun: HEADERS opening a stream.
    requests: usize,
    /// Requests read whole (`END_STREAM`), and their body sizes.
    bodies: Vec<usize>,
}

/// A hand-written HTTP/2 server that plays one [`Fault`]. It sends its
/// SETTINGS after the client preface, acknowledges the client's SETTINGS
/// and PINGs, decodes no header block (HPACK), and never sends a response.
/// Request bodies up to 64 KiB (the initial flow-control window: it sends
/// no WINDOW_UPDATE).
#[derive(Clone)]
pub struct RawH2Upstream {
    pub addr: SocketAddr,
    pub fault: Fault,
    state: Arc<Mutex<RawState>>,
}

impl RawH2Upstream {
    pub async fn start(fault: Fault) -> RawH2Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let up = RawH2Upstream { addr: listener.local_addr().unwrap(), fault, state: Arc::default() };
        let serving = up.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let first = {
                    let mut state = serving.state.lock().unwrap();
                    state.connections += 1;
                    state.connections == 1
                };
                let up = serving.clone();
                tokio::spawn(async move {
                    let _ = up.connection(stream, first).await;
                });
            }
        });
        up
    }

    /// `http://127.0.0.1:port`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn connections(&self) -> usize {
        self.state.lock().unwrap().connections
    }

    /// Connections that opened with the HTTP/2 preface.
    pub fn prefaces(&self) -> usize {
        self.state.lock().unwrap().prefaces
    }

    /// The first bytes (as text) of connections that did not open with the
    /// HTTP/2 preface: an HTTP/1.1 request line, say.
    pub fn bad_prefaces(&self) -> Vec<String> {
        self.state.lock().unwrap().bad_prefaces.clone()
    }

    /// Requests begun (streams opened by HEADERS), on all connections.
    pub fn requests(&self) -> usize {
        self.state.lock().unwrap().requests
    }

    /// The body sizes of the requests read whole.
    pub fn bodies(&self) -> Vec<usize> {
        self.state.lock().unwrap().bodies.clone()
    }

    /// What the upstream saw, for failure messages.
    pub fn describe(&self) -> String {
        let st = self.state.lock().unwrap();
        format!(
            "{:?} upstream: {} connections, {} with the HTTP/2 preface, {} requests begun, bodies read whole {:?}, \
             connections without the preface began with {:?}",
            self.fault, st.connections, st.prefaces, st.requests, st.bodies, st.bad_prefaces
        )
    }

    async fn connection(&self, mut stream: TcpStream, first: bool) -> std::io::Result<()> {
        stream.set_nodelay(true)?;
        let mut preface = Vec::with_capacity(PREFACE.len());
        while preface.len() < PREFACE.len() {
            let mut chunk = vec![0u8; PREFACE.len() - preface.len()];
            let n = stream.read(&mut chunk).await.unwrap_or(0);
            if n == 0 {
                break;
            }
            preface.extend_from_slice(&chunk[..n]);
            if !PREFACE.starts_with(&preface) {
                break;
            }
        }
        if preface != PREFACE {
            let text = String::from_utf8_lossy(&preface).into_owned();
            self.state.lock().unwrap().bad_prefaces.push(text);
            return Ok(());
        }
        self.state.lock().unwrap().prefaces += 1;
        stream.write_all(&frame(SETTINGS, 0, 0, &[])).await?;

        // A header block still waiting for its CONTINUATION: stream, END_STREAM.
        let mut block: Option<(u32, bool)> = None;
        // Streams whose request is being read, for ResetAfterBody: bytes so far.
        let mut open: HashMap<u32, usize> = HashMap::new();
        let mut begun: HashSet<u32> = HashSet::new();
        loop {
            let Some((kind, flags, id, payload)) = read_frame(&mut stream).await? else {
                return Ok(());
            };
            match kind {
                SETTINGS if flags & ACK == 0 => stream.write_all(&frame(SETTINGS, ACK, 0, &[])).await?,
                PING if flags & ACK == 0 => stream.write_all(&frame(PING, ACK, 0, &payload)).await?,
                HEADERS | CONTINUATION => {
                    let end_stream = match kind {
                        HEADERS => flags & END_STREAM != 0,
                        _ => block.is_some_and(|(_, end)| end),
                    };
                    if flags & END_HEADERS == 0 {
                        block = Some((id, end_stream));
                        continue;
                    }
                    block = None;
                    if !begun.insert(id) {
                        // Trailers on a stream already begun.
                        if end_stream {
                            if let Some(len) = open.remove(&id) {
                                self.read_whole(&mut stream, id, len).await?;
                            }
                        }
                        continue;
                    }
                    self.state.lock().unwrap().requests += 1;
                    let answers = self.fault == Fault::GoAwayOnFirstConnection && !first;
                    match self.fault {
                        Fault::RefuseStreams => stream.write_all(&rst_stream(id, REFUSED_STREAM)).await?,
                        Fault::GoAwayBeforeAny | Fault::GoAwayOnFirstConnection if !answers => {
                            stream.write_all(&goaway(0, NO_ERROR)).await?;
                            stream.flush().await?;
                            // Close our side, and read until the client closes
                            // its side, so no unread byte turns the close into
                            // a reset that could overtake the GOAWAY.
                            stream.shutdown().await?;
                            let mut sink = [0u8; 4096];
                            let drain = async { while matches!(stream.read(&mut sink).await, Ok(n) if n > 0) {} };
                            let _ = tokio::time::timeout(Duration::from_secs(5), drain).await;
                            return Ok(());
                        }
                        _ if end_stream => self.read_whole(&mut stream, id, 0).await?,
                        _ => {
                            open.insert(id, 0);
                        }
                    }
                }
                DATA => {
                    if let Some(len) = open.get_mut(&id) {
                        *len += payload.len();
                        if flags & END_STREAM != 0 {
                            let len = open.remove(&id).unwrap();
                            self.read_whole(&mut stream, id, len).await?;
                        }
                    }
                }
                _ => {}
            }
        }
    }

    /// A request read to its end: recorded, then its stream reset
    /// (ResetAfterBody) or answered 200 (GoAwayOnFirstConnection).
    async fn read_whole(&self, stream: &mut TcpStream, id: u32, len: usize) -> std::io::Result<()> {
        self.state.lock().unwrap().bodies.push(len);
        match self.fault {
            // `:status: 200` is entry 8 of HPACK's static table.
            Fault::GoAwayOnFirstConnection => {
                stream.write_all(&frame(HEADERS, END_STREAM | END_HEADERS, id, &[0x88])).await
            }
            _ => stream.write_all(&rst_stream(id, INTERNAL_ERROR)).await,
        }
    }
}

/// Reads one frame: type, flags, stream id, payload; `None` at the end of the stream.
async fn read_frame(stream: &mut TcpStream) -> std::io::Result<Option<(u8, u8, u32, Vec<u8>)>> {
    let mut head = [0u8; 9];
    match stream.read_exact(&mut head).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    let id = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
    let mut payload = vec![0u8; len];
    stream.read_exact(&mut payload).await?;
    Ok(Some((head[3], head[4], id, payload)))
}

/// One frame on the wire (RFC 9113 §4.1).
pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = (payload.len() as u32).to_be_bytes();
    let mut out = vec![len[1], len[2], len[3], kind, flags];
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

fn rst_stream(stream: u32, code: u32) -> Vec<u8> {
    frame(RST_STREAM, 0, stream, &code.to_be_bytes())
}

fn goaway(last_stream_id: u32, code: u32) -> Vec<u8> {
    let mut payload = last_stream_id.to_be_bytes().to_vec();
    payload.extend_from_slice(&code.to_be_bytes());
    frame(GOAWAY, 0, 0, &payload)
}
