//! Turns: no byte of an older write reaches the upstream after a newer
//! write was forwarded. Judged by the order the upstream applied the writes
//! (a write is applied when its body has arrived whole), against upstreams
//! that answer before they have read a large body, and one that stops reading
//! past the route's timeout.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::Notify;

use crate::common::{send, Proxy, PATIENCE};

/// How the store treats the write carrying one token.
#[derive(Clone, Copy, Debug)]
enum Manner {
    /// Answers 200 as soon as it has the head, then reads the body slowly.
    AnswerFirst,
    /// Reads the head and the first KiB of the body, then stops reading
    /// until the test says resume; answers once the body is whole.
    StallAfterHead,
    /// Answers 200 as soon as it has the head, reads the first KiB of the
    /// body, then stops reading until the test says resume.
    AnswerThenStall,
}

impl Manner {
    fn answers_first(self) -> bool {
        matches!(self, Manner::AnswerFirst | Manner::AnswerThenStall)
    }

    fn stalls(self) -> bool {
        matches!(self, Manner::StallAfterHead | Manner::AnswerThenStall)
    }
}

/// How one write ended at the store.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Ended {
    /// The body arrived whole: applied.
    Applied,
    /// The connection ended first (a reset, or a close), `read` bytes in.
    Cut { read: usize, reset: bool },
}

#[derive(Default)]
struct StoreState {
    /// Tokens in the order their writes were applied.
    applied: Vec<String>,
    ended: HashMap<String, Ended>,
}

/// A store on `127.0.0.1:0` written on raw sockets: every write is applied
/// when its body has arrived whole, each token's as its [`Manner`] says
/// (others read whole, then answered). Its sockets take little at a time
/// (a small receive buffer), so a slow reader holds the sender back.
#[derive(Clone)]
struct SlowStore {
    addr: SocketAddr,
    state: Arc<Mutex<StoreState>>,
    resume: Arc<Notify>,
}

impl SlowStore {
    /// HTTP/1.1.
    async fn start(manners: &[(&str, Manner)]) -> SlowStore {
        let listener = small_buffer_listener();
        let store = SlowStore::new(listener.local_addr().unwrap());
        let manners: HashMap<String, Manner> = manners.iter().map(|(t, m)| (t.to_string(), *m)).collect();
        let serving = store.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serving.clone().serve_http1(stream, manners.clone()));
            }
        });
        store
    }

    /// HTTP/2 by prior knowledge (`AnswerFirst` and `AnswerThenStall`).
    async fn start_http2(manners: &[(&str, Manner)]) -> SlowStore {
        let listener = small_buffer_listener();
        let store = SlowStore::new(listener.local_addr().unwrap());
        let manners: HashMap<String, Manner> = manners.iter().map(|(t, m)| (t.to_string(), *m)).collect();
        let serving = store.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (store, manners) = (serving.clone(), manners.clone());
                tokio::spawn(async move {
                    // A connection window wide enough that a stream given no
                    // credit leaves the others room.
                    let mut builder = h2::server::Builder::new();
                    builder.initial_connection_window_size(16 << 20);
                    let Ok(mut connection) = builder.handshake(stream).await else { return };
                    while let Some(Ok((request, respond))) = connection.accept().await {
                        tokio::spawn(store.clone().serve_http2(request, respond, manners.clone()));
                    }
                });
            }
        });
        store
    }

    fn new(addr: SocketAddr) -> SlowStore {
        SlowStore { addr, state: Arc::default(), resume: Arc::new(Notify::new()) }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn applied(&self) -> Vec<String> {
        self.state.lock().unwrap().applied.clone()
    }

    fn ended(&self, token: &str) -> Option<Ended> {
        self.state.lock().unwrap().ended.get(token).cloned()
    }

    fn end(&self, token: &str, ended: Ended) {
        let mut state = self.state.lock().unwrap();
        if ended == Ended::Applied {
            state.applied.push(token.to_string());
        }
        state.ended.insert(token.to_string(), ended);
    }

    async fn wait_ended(&self, token: &str) -> Ended {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            if let Some(ended) = self.ended(token) {
                return ended;
            }
            assert!(tokio::time::Instant::now() < deadline, "the write of token {token} never ended at the store");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn serve_http1(self, mut stream: TcpStream, manners: HashMap<String, Manner>) {
        let mut buffered = Vec::new();
        loop {
            let Some((head, rest)) = read_head(&mut stream, std::mem::take(&mut buffered)).await else { return };
            let token = header(&head, "x-fencing-token").unwrap_or_default();
            let length: usize = header(&head, "content-length").and_then(|v| v.parse().ok()).unwrap_or(0);
            let manner = manners.get(&token).copied();
            let answers_first = manner.is_some_and(Manner::answers_first);
            if answers_first && !answer(&mut stream).await {
                return;
            }
            let (mut read, mut carried) = (rest.len().min(length), rest);
            buffered = carried.split_off(read);
            let mut stall_at = manner.is_some_and(Manner::stalls).then_some(1024);
            let mut buf = vec![0; 16 * 1024];
            while read < length {
                if stall_at.is_some_and(|at| read >= at) {
                    self.resume.notified().await;
                    stall_at = None;
                }
                let want = buf.len().min(length - read);
                match stream.read(&mut buf[..want]).await {
                    Ok(0) => return self.end(&token, Ended::Cut { read, reset: false }),
                    Ok(n) => read += n,
                    Err(e) => {
                        let reset = e.kind() == std::io::ErrorKind::ConnectionReset;
                        return self.end(&token, Ended::Cut { read, reset });
                    }
                }
                if matches!(manner, Some(Manner::AnswerFirst)) {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
            self.end(&token, Ended::Applied);
            if !answers_first && !answer(&mut stream).await {
                return;
            }
        }
    }

    async fn serve_http2(
        self,
        request: http::Request<h2::RecvStream>,
        mut respond: h2::server::SendResponse<bytes::Bytes>,
        manners: HashMap<String, Manner>,
    ) {
        let token = request.headers().get("x-fencing-token").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
        let manner = manners.get(&token).copied();
        let first = manner.is_some_and(Manner::answers_first);
        if first && respond.send_response(http::Response::new(()), true).is_err() {
            return;
        }
        let mut body = request.into_body();
        let mut read = 0;
        if manner.is_some_and(Manner::stalls) {
            // Nothing read, no flow-control credit given, until told.
            self.resume.notified().await;
        }
        while let Some(chunk) = body.data().await {
            let Ok(chunk) = chunk else { return self.end(&token, Ended::Cut { read, reset: true }) };
            read += chunk.len();
            if first {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            let _ = body.flow_control().release_capacity(chunk.len());
        }
        self.end(&token, Ended::Applied);
        if !first {
            let _ = respond.send_response(http::Response::new(()), true);
        }
    }
}

/// A listener whose connections take little at a time: the sender's
/// kernel, not the store's, holds what the store has not read.
fn small_buffer_listener() -> TcpListener {
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(16 * 1024).unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    socket.listen(64).unwrap()
}

/// Reads up to the end of a head; the head, and what came after it.
async fn read_head(stream: &mut TcpStream, mut buffered: Vec<u8>) -> Option<(String, Vec<u8>)> {
    let mut buf = [0; 4096];
    loop {
        if let Some(end) = buffered.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buffered.split_off(end + 4);
            return Some((String::from_utf8_lossy(&buffered).into_owned(), rest));
        }
        match stream.read(&mut buf).await {
            Ok(n @ 1..) => buffered.extend_from_slice(&buf[..n]),
            _ => return None,
        }
    }
}

fn header(head: &str, name: &str) -> Option<String> {
    head.lines().find_map(|line| {
        let (field, value) = line.split_once(':')?;
        field.trim().eq_ignore_ascii_case(name).then(|| value.trim().to_string())
    })
}

async fn answer(stream: &mut TcpStream) -> bool {
    stream.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await.is_ok()
}

fn routes(store: &SlowStore, extra: &str) -> String {
    format!(
        "[[route]]\nname = \"objects\"\nprefix = \"/objects/\"\nupstream = \"{}\"\nmax_body = \"16MiB\"\n{extra}",
        store.url()
    )
}

async fn put(proxy: &Proxy, token: u64, body: Vec<u8>) -> u16 {
    let url = proxy.url("/objects/a");
    send("PUT", &url, &[("x-fencing-token", &token.to_string())], body).await.status.as_u16()
}

/// Waits until the store has applied `n` writes; their tokens, in order.
async fn applied(store: &SlowStore, n: usize) -> Vec<String> {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let applied = store.applied();
        if applied.len() >= n {
            return applied;
        }
        assert!(tokio::time::Instant::now() < deadline, "the store applied only {applied:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// An HTTP/1.1 upstream answers token 5 on its head and reads its 6 MiB body
/// slowly: the client has its 200 at once, but token 6 is not forwarded
/// until the body has left and settled, so the store applies 5, then 6.
#[tokio::test]
async fn an_answer_before_the_body_is_read_holds_the_turn_until_the_body_has_left_http1() {
    let store = SlowStore::start(&[("5", Manner::AnswerFirst)]).await;
    let proxy = Proxy::start(&routes(&store, "settle = \"2s\"\ntimeout = \"20s\"\n")).await;

    assert_eq!(put(&proxy, 5, vec![b'5'; 6 << 20]).await, 200, "the client's answer is not held back");
    assert_eq!(put(&proxy, 6, b"six".to_vec()).await, 200);
    assert_eq!(applied(&store, 2).await, ["5", "6"], "the older write landed after the newer one");
}

/// The same over HTTP/2 to the upstream: token 5's 1 MiB body goes out as
/// the store gives flow-control credit, slowly; token 6, on another stream
/// of the same connection, waits for it.
#[tokio::test]
async fn an_answer_before_the_body_is_read_holds_the_turn_until_the_body_has_left_http2() {
    let store = SlowStore::start_http2(&[("5", Manner::AnswerFirst)]).await;
    let proxy = Proxy::start(&routes(&store, "upstream_http2 = true\nsettle = \"2s\"\ntimeout = \"20s\"\n")).await;

    assert_eq!(put(&proxy, 5, vec![b'5'; 1 << 20]).await, 200, "the client's answer is not held back");
    assert_eq!(put(&proxy, 6, b"six".to_vec()).await, 200);
    assert_eq!(applied(&store, 2).await, ["5", "6"], "the older write landed after the newer one");
}

/// An HTTP/1.1 upstream reads token 5's head and a little of its body, then
/// stops reading past the route's timeout, with the rest of the body (1 MiB)
/// queued in the proxy's socket. The client gets 504; token 6 goes after the
/// settle period and is applied; when the store reads on, the connection of
/// 5 has been reset: the rest of the old body never arrives, and 5 is never
/// applied after 6.
#[tokio::test]
async fn a_write_past_the_timeout_has_its_connection_reset_before_the_key_settles() {
    let store = SlowStore::start(&[("5", Manner::StallAfterHead)]).await;
    let proxy = Proxy::start(&routes(&store, "settle = \"300ms\"\ntimeout = \"500ms\"\n")).await;

    assert_eq!(put(&proxy, 5, vec![b'5'; 1 << 20]).await, 504);
    six_lands_and_five_arrives_cut(&store, &proxy).await;
}

/// An HTTP/1.1 upstream answers token 5 on its head, then stops reading its
/// 8 MiB body (more than the sockets' buffers hold). The body is not handed
/// over whole within the route's timeout: its connection is reset, the key
/// settles, and token 6 is applied; when the store reads on, the old body
/// never arrives whole.
#[tokio::test]
async fn a_body_answered_early_and_not_read_has_its_connection_reset_http1() {
    let store = SlowStore::start(&[("5", Manner::AnswerThenStall)]).await;
    let proxy = Proxy::start(&routes(&store, "settle = \"300ms\"\ntimeout = \"500ms\"\n")).await;

    assert_eq!(put(&proxy, 5, vec![b'5'; 8 << 20]).await, 200);
    six_lands_and_five_arrives_cut(&store, &proxy).await;
}

/// The same over HTTP/2: the store answers token 5 and gives its 1 MiB body
/// no flow-control credit. Past the route's timeout the upstream connection
/// is torn down (the stream cannot be reset from outside while hyper waits
/// for credit); token 6 goes on a new one.
#[tokio::test]
async fn a_body_answered_early_and_not_read_has_its_connection_reset_http2() {
    let store = SlowStore::start_http2(&[("5", Manner::AnswerThenStall)]).await;
    let extra = "upstream_http2 = true\nsettle = \"300ms\"\ntimeout = \"500ms\"\n";
    let proxy = Proxy::start(&routes(&store, extra)).await;

    assert_eq!(put(&proxy, 5, vec![b'5'; 1 << 20]).await, 200);
    six_lands_and_five_arrives_cut(&store, &proxy).await;
}

/// Token 6 is applied; when the store reads on, token 5's connection was
/// reset: its body never arrives whole, and 5 is never applied.
async fn six_lands_and_five_arrives_cut(store: &SlowStore, proxy: &Proxy) {
    assert_eq!(put(proxy, 6, b"six".to_vec()).await, 200);
    assert_eq!(store.wait_ended("6").await, Ended::Applied);
    store.resume.notify_one();
    let ended = store.wait_ended("5").await;
    assert!(matches!(ended, Ended::Cut { .. }), "the old write arrived whole after the newer one: {ended:?}");
    assert_eq!(store.applied(), ["6"]);
}
