//! A legacy HTTP key-value store with no fencing: the kind of upstream fencegate
//! protects.
//!
//! PUT or POST stores the request body at the path, GET (or HEAD) returns it,
//! DELETE removes it. The store never looks at tokens: it accepts every write it
//! receives, and prints each one with the `X-Fencing-Token` header it carried, so
//! a demo shows exactly which writes landed.
//!
//! ```text
//! cargo run --release --example legacy_store               # 127.0.0.1:9000
//! cargo run --release --example legacy_store 127.0.0.1:9100
//! ```

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::header::{HeaderValue, ALLOW, CONTENT_TYPE};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// Where the store listens unless the first argument names another address.
const DEFAULT_ADDR: &str = "127.0.0.1:9000";

/// Bodies larger than this are refused (413): the whole store lives in memory.
const MAX_BODY: usize = 16 * 1024 * 1024;

/// Objects by request path.
type Objects = Arc<Mutex<HashMap<String, Bytes>>>;

#[tokio::main]
async fn main() {
    let text = std::env::args().nth(1);
    let text = text.as_deref().unwrap_or(DEFAULT_ADDR);
    let addr: SocketAddr = match text.parse() {
        Ok(addr) => addr,
        Err(_) => {
            eprintln!("'{text}' is not an IP:port address (e.g. {DEFAULT_ADDR})");
            std::process::exit(2);
        }
    };
    let listener = match TcpListener::bind(addr).await {
        Ok(listener) => listener,
        Err(e) => {
            eprintln!("cannot listen on {addr}: {e}");
            std::process::exit(1);
        }
    };
    println!("legacy store listening on http://{addr} (no fencing: every write lands)");

    let objects = Objects::default();
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                eprintln!("accept failed: {e}");
                continue;
            }
        };
        let objects = objects.clone();
        let service = service_fn(move |req| handle(objects.clone(), req));
        tokio::spawn(async move {
            let io = TokioIo::new(stream);
            if let Err(e) = http1::Builder::new().serve_connection(io, service).await {
                eprintln!("connection ended with an error: {e}");
            }
        });
    }
}

async fn handle(objects: Objects, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let token = req.headers().get("x-fencing-token");
    let token = token.and_then(|v| v.to_str().ok()).unwrap_or("none").to_string();

    let response = match method {
        Method::GET | Method::HEAD => {
            let found = objects.lock().unwrap().get(&path).cloned();
            match found {
                Some(body) => Response::new(Full::new(body)),
                None => message(StatusCode::NOT_FOUND, "not found\n"),
            }
        }
        Method::PUT | Method::POST => {
            let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
                Ok(collected) => collected.to_bytes(),
                Err(e) => {
                    println!("{method} {path} token={token} -> refused: {e}");
                    let status = if e.is::<LengthLimitError>() {
                        StatusCode::PAYLOAD_TOO_LARGE
                    } else {
                        StatusCode::BAD_REQUEST
                    };
                    return Ok(message(status, &format!("{e}\n")));
                }
            };
            let len = body.len();
            objects.lock().unwrap().insert(path.clone(), body);
            println!("{method} {path} token={token} -> stored {len} bytes");
            message(StatusCode::OK, &format!("stored {len} bytes\n"))
        }
        Method::DELETE => {
            let removed = objects.lock().unwrap().remove(&path).is_some();
            println!("{method} {path} token={token} -> removed={removed}");
            if removed {
                message(StatusCode::OK, "deleted\n")
            } else {
                message(StatusCode::NOT_FOUND, "not found\n")
            }
        }
        _ => {
            let mut r = message(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
            let allow = HeaderValue::from_static("GET, HEAD, PUT, POST, DELETE");
            r.headers_mut().insert(ALLOW, allow);
            r
        }
    };
    Ok(response)
}

/// A short plain-text answer from the store itself.
fn message(status: StatusCode, text: &str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::copy_from_slice(text.as_bytes())));
    *r.status_mut() = status;
    let content_type = HeaderValue::from_static("text/plain; charset=utf-8");
    r.headers_mut().insert(CONTENT_TYPE, content_type);
    r
}
