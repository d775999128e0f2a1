//! Tunnels and header spellings: a request that would switch protocols is
//! refused on a fenced route (the tunnel would carry writes with no token and
//! outlive the token that opened it); an upstream's unrequested 101 is an
//! upstream error that settles; header names spelled with `_` never reach a
//! server that folds them into the names fencegate reads.
//!
//! The witnesses: [`TunnelUpstream`], which switches protocols whenever asked
//! (and, in one mode, when not asked) and then applies the raw HTTP/1.1
//! requests it reads in the tunnel; and `tests/upstreams/wsgi_override.py`, a
//! wsgiref server with Flask's method-override middleware.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::common::process::{config_text, start_in_process, MEMORY_STORE};
use crate::common::raw::{request, Conn, RawRequest};
use crate::common::realistic::start_python_upstream;
use crate::common::{get, send};

/// What [`TunnelUpstream`] does with a request that does not ask to switch.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Unasked {
    /// Reads its body, applies it, answers 200.
    Serve,
    /// Answers 101 at once, then applies the request a moment later: an
    /// upstream whose answer came before its work was done.
    SwitchAnyway,
}

/// An upstream that accepts protocol upgrades and then reads raw HTTP/1.1
/// requests inside the tunnel, applying each: what a websocket or h2c
/// endpoint in front of a writable store amounts to.
struct TunnelUpstream {
    addr: SocketAddr,
    /// `METHOD path token` of every request applied, in order; `tunnel:`
    /// before those read inside a tunnel.
    applied: Arc<Mutex<Vec<String>>>,
}

impl TunnelUpstream {
    async fn start(unasked: Unasked) -> TunnelUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let applied = Arc::new(Mutex::new(Vec::new()));
        let log = applied.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream, log.clone(), unasked));
            }
        });
        TunnelUpstream { addr, applied }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn applied(&self) -> Vec<String> {
        self.applied.lock().unwrap().clone()
    }
}

/// One request head and body read off `stream`, or `None` at its end.
async fn read_request(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Option<(String, Vec<(String, String)>, Vec<u8>)> {
    let end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let mut chunk = [0u8; 4096];
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    buf.drain(..end);
    let mut lines = head.trim_end().split("\r\n");
    let line = lines.next().unwrap_or_default().to_string();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let len: usize = headers.iter().find(|(k, _)| k == "content-length").and_then(|(_, v)| v.parse().ok()).unwrap_or(0);
    while buf.len() < len {
        let mut chunk = [0u8; 4096];
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let body = buf.drain(..len).collect();
    Some((line, headers, body))
}

fn entry(line: &str, headers: &[(String, String)]) -> String {
    let mut words = line.split(' ');
    let (method, path) = (words.next().unwrap_or_default(), words.next().unwrap_or_default());
    let token = headers.iter().find(|(k, _)| k == "x-fencing-token").map_or("-", |(_, v)| v.as_str());
    format!("{method} {path} {token}")
}

async fn serve(mut stream: TcpStream, log: Arc<Mutex<Vec<String>>>, unasked: Unasked) {
    let mut buf = Vec::new();
    while let Some((line, headers, _body)) = read_request(&mut stream, &mut buf).await {
        let asked = headers.iter().any(|(k, _)| k == "upgrade");
        if asked || unasked == Unasked::SwitchAnyway {
            let _ = stream
                .write_all(b"HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n")
                .await;
            if !asked {
                // The work the 101 did not wait for.
                tokio::time::sleep(Duration::from_millis(300)).await;
                log.lock().unwrap().push(entry(&line, &headers));
            }
            // The tunnel: raw requests, each applied and answered.
            while let Some((line, headers, _)) = read_request(&mut stream, &mut buf).await {
                log.lock().unwrap().push(format!("tunnel: {}", entry(&line, &headers)));
                let _ = stream.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await;
            }
            return;
        }
        log.lock().unwrap().push(entry(&line, &headers));
        if stream.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await.is_err() {
            return;
        }
    }
}

fn routes(upstream: &str, extra: &str) -> String {
    format!(
        "[[route]]\nname = \"objects\"\nprefix = \"/objects/\"\nupstream = \"{upstream}\"\nsettle = \"1s\"\n{extra}\n\
         [[route]]\nname = \"sockets\"\nprefix = \"/sockets/\"\nupstream = \"{upstream}\"\nunfenced_tunnels = true\n"
    )
}

fn problem_type(p: &Value) -> &str {
    p["type"].as_str().unwrap_or_default()
}

/// Every method, every spelling of a switch: refused with 400
/// `tunnel-refused`, and nothing the client sends afterwards on the
/// connection reaches the upstream unfenced.
#[tokio::test]
async fn a_request_to_switch_protocols_is_refused_on_a_fenced_route() {
    let up = TunnelUpstream::start(Unasked::Serve).await;
    let proxy = start_in_process(&memory_config(&routes(&up.url(), ""))).await;
    // The new holder wrote with 34.
    assert_eq!(send("PUT", &proxy.url("/objects/a"), &[("x-fencing-token", "34")], "fresh").await.status, 200);

    let mut wrong = Vec::new();
    for method in ["GET", "HEAD", "OPTIONS", "POST", "PUT"] {
        for (upgrade, connection) in [
            ("websocket", Some("Upgrade")),
            ("websocket", None),
            ("h2c", Some("Upgrade, HTTP2-Settings")),
            ("WebSocket/13", Some("keep-alive, upgrade")),
            ("foo, websocket", Some("upgrade")),
        ] {
            let mut conn = Conn::open(proxy.addr).await;
            let mut req = RawRequest::new(method, "/objects/a").header("Upgrade", upgrade).token(33);
            if let Some(c) = connection {
                req = req.header("Connection", c);
            }
            if upgrade == "h2c" {
                req = req.header("HTTP2-Settings", "AAMAAABkAARAAAAAAAIAAAAA");
            }
            conn.send(&req.bytes()).await;
            let reply = conn.response_to(method).await;
            let p = reply.problem();
            let got_type = p.as_ref().map(problem_type).unwrap_or_default().to_string();
            if reply.status != 400 || (method != "HEAD" && !got_type.ends_with("tunnel-refused")) {
                wrong.push(format!("{method} Upgrade: {upgrade}: {} {got_type}", reply.status));
            }
            // What a client would send once the tunnel were open.
            conn.send(&request("PUT", "/objects/a", &[("host", "x"), ("content-length", "5")], b"stale")).await;
            let _ = conn.try_response_within("PUT", Duration::from_millis(300)).await;
        }
    }
    let applied = up.applied();
    assert!(wrong.is_empty(), "wrong answers:\n{}\napplied: {applied:?}", wrong.join("\n"));
    assert_eq!(applied, ["PUT /objects/a 34"], "only the holder's write may be applied");
}

/// A route that says `unfenced_tunnels = true` passes websocket upgrades,
/// as documented, but never h2c, nor a CONNECT.
#[tokio::test]
async fn unfenced_tunnels_pass_where_a_route_allows_them_but_never_h2c() {
    let up = TunnelUpstream::start(Unasked::Serve).await;
    let proxy = start_in_process(&memory_config(&routes(&up.url(), ""))).await;

    let mut conn = Conn::open(proxy.addr).await;
    let req = RawRequest::new("GET", "/sockets/chat").header("Upgrade", "websocket").header("Connection", "Upgrade");
    conn.send(&req.bytes()).await;
    let reply = conn.response().await;
    assert_eq!(reply.status, 101, "{reply:?}");
    conn.send(&request("PUT", "/sockets/chat", &[("host", "x"), ("content-length", "2")], b"hi")).await;
    assert_eq!(conn.response().await.status, 200);
    assert_eq!(up.applied(), ["tunnel: PUT /sockets/chat -"], "the tunnel is open, and unfenced");

    for (method, target, upgrade) in [("GET", "/sockets/chat", "h2c"), ("CONNECT", "/sockets/chat", "")] {
        let mut conn = Conn::open(proxy.addr).await;
        let mut req = RawRequest::new(method, target);
        if !upgrade.is_empty() {
            req = req.header("Upgrade", upgrade).header("Connection", "Upgrade");
        }
        conn.send(&req.bytes()).await;
        let reply = conn.response().await;
        assert_eq!(reply.status, 400, "{method} {upgrade}: {reply:?}");
        assert!(reply.problem_type().unwrap_or_default().ends_with("tunnel-refused"), "{reply:?}");
    }
    assert_eq!(up.applied().len(), 1, "nothing more reached the upstream: {:?}", up.applied());
}

/// An upstream that answers a fenced write with an unrequested 101, then
/// applies it: a 502 whose write settles, so the next token's write lands
/// after it, never before.
#[tokio::test]
async fn an_unrequested_101_is_an_upstream_error_and_the_write_settles() {
    let up = TunnelUpstream::start(Unasked::SwitchAnyway).await;
    let proxy = start_in_process(&memory_config(&routes(&up.url(), ""))).await;

    let old = send("PUT", &proxy.url("/objects/a"), &[("x-fencing-token", "5")], "five").await;
    let p = old.problem(502);
    assert!(p["detail"].as_str().unwrap().contains("101"), "{p}");
    assert_eq!(p["settle_ms"], 1000, "{p}");
    let new = send("PUT", &proxy.url("/objects/a"), &[("x-fencing-token", "6")], "six").await;
    assert_eq!(new.status.as_u16(), 502, "the upstream switches every request: {}", new.text());
    // The old write was applied 300 ms after its 101; the new one only
    // after the settle period.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let applied = up.applied();
    let tokens: Vec<&str> = applied.iter().map(|e| e.rsplit(' ').next().unwrap()).collect();
    assert_eq!(tokens, ["5", "6"], "{applied:?}");
}

/// The WSGI upstream with Flask's method-override middleware, started fresh.
struct Wsgi {
    addr: SocketAddr,
    _child: crate::common::process::ChildGuard,
}

impl Wsgi {
    fn start() -> Wsgi {
        let (addr, child) = start_python_upstream("wsgi_override.py");
        Wsgi { addr, _child: child }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `(method, token, tenant)` of every request the application ran.
    async fn log(&self) -> Vec<(String, String, String)> {
        let reply = get(&format!("{}/__log", self.url())).await;
        let entries: Vec<Value> = serde_json::from_slice(&reply.body).unwrap();
        entries
            .iter()
            .map(|e| {
                let field = |f: &str| e[f].as_str().unwrap_or_default().to_string();
                (field("method"), field("token"), field("tenant"))
            })
            .collect()
    }
}

/// `X_HTTP_METHOD_OVERRIDE: DELETE` on a tokenless GET: the header is
/// dropped by default, so the application runs a GET; with
/// `underscores_in_headers = true` it passes, and fencegate reads it as the
/// override it is to the upstream: the GET is fenced (428).
#[tokio::test]
async fn override_headers_spelled_with_underscores_never_run_unfenced() {
    let wsgi = Wsgi::start();
    let route = format!("[[route]]\nname = \"objects\"\nprefix = \"/objects/\"\nupstream = \"{}\"\n", wsgi.url());

    let proxy = start_in_process(&memory_config(&route)).await;
    for name in ["X_HTTP_METHOD_OVERRIDE", "x_http_method_override", "X-HTTP_Method-Override"] {
        let r = send("GET", &proxy.url("/objects/a"), &[(name, "DELETE")], "").await;
        assert_eq!(r.status, 200, "{name}: {}", r.text());
    }
    let ran: Vec<String> = wsgi.log().await.into_iter().map(|(m, _, _)| m).collect();
    assert_eq!(ran, ["GET", "GET", "GET"], "an override spelled with '_' reached the application");
    drop(proxy);

    let passing = memory_config(&route).replace("[server]\n", "[server]\nunderscores_in_headers = true\n");
    let proxy = start_in_process(&passing).await;
    for name in ["X_HTTP_METHOD_OVERRIDE", "x-http_method-override"] {
        let r = send("GET", &proxy.url("/objects/a"), &[(name, "DELETE")], "").await;
        r.problem(428);
    }
    // Two spellings of one field: which the application reads is its choice.
    let r =
        send("PUT", &proxy.url("/objects/a"), &[("x-fencing-token", "1"), ("x-tenant", "a"), ("x_tenant", "b")], "")
            .await;
    assert!(r.problem(400)["detail"].as_str().unwrap().contains("x_tenant"), "{}", r.text());
    // One spelling passes, as the application reads it.
    let r = send("PUT", &proxy.url("/objects/a"), &[("x-fencing-token", "1"), ("x_tenant", "b")], "").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let log = wsgi.log().await;
    assert_eq!(log.len(), 4, "{log:?}");
    assert_eq!(log[3], ("PUT".to_string(), "1".to_string(), "b".to_string()));
}

fn memory_config(routes: &str) -> String {
    config_text("", MEMORY_STORE, routes)
}
