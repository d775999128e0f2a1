//! The demo's store: a naive in-memory HTTP object store with no fencing of
//! its own, the kind of upstream fencegate stands in front of.
//!
//! `PUT` or `POST` stores the body at the path, `GET` or `HEAD` returns it,
//! `DELETE` removes it. It never looks at tokens and accepts every write it
//! receives; it prints each request it receives, with the token header it
//! carried, so the demo shows exactly what reached it.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
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

/// Bodies larger than this are refused (413): the whole store lives in memory.
const MAX_BODY: usize = 16 * 1024 * 1024;

/// The store's objects and how many requests reached it, shared by its
/// connections and the story that reads them back.
#[derive(Clone, Default)]
pub struct Store {
    objects: Arc<Mutex<BTreeMap<String, Bytes>>>,
    received: Arc<AtomicU64>,
}

impl Store {
    /// Requests that reached the store so far.
    pub(super) fn received(&self) -> u64 {
        self.received.load(Ordering::SeqCst)
    }

    /// The object stored at `path`, read from the store itself.
    pub(super) fn object(&self, path: &str) -> Option<Bytes> {
        self.objects.lock().unwrap_or_else(|e| e.into_inner()).get(path).cloned()
    }

    /// Serves `listener` until the process ends.
    pub async fn serve(self, listener: TcpListener) {
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(e) => {
                    println!("store  cannot accept a connection: {e}");
                    // Out of descriptors, say: give the others time to close.
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            };
            let store = self.clone();
            let service = service_fn(move |req| store.clone().handle(req));
            tokio::spawn(async move {
                // A client that goes away mid-request is no news for a demo.
                let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
            });
        }
    }

    async fn handle(self, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
        self.received.fetch_add(1, Ordering::SeqCst);
        let method = req.method().clone();
        let path = req.uri().path().to_string();
        let token = match req.headers().get("x-fencing-token").map(HeaderValue::to_str) {
            Some(Ok(token)) => format!("X-Fencing-Token: {token}"),
            Some(Err(_)) => "X-Fencing-Token: (not text)".to_string(),
            None => "(no token)".to_string(),
        };
        let seen = |what: &str| println!("   store  <- {method} {path}  {token}  {what}");
        let response = match method {
            Method::GET | Method::HEAD => match self.object(&path) {
                Some(body) => {
                    seen(&format!("200, {} bytes", body.len()));
                    Response::new(Full::new(if method == Method::HEAD { Bytes::new() } else { body }))
                }
                None => {
                    seen("404, nothing there");
                    message(StatusCode::NOT_FOUND, "not found\n")
                }
            },
            Method::PUT | Method::POST => {
                let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
                    Ok(collected) => collected.to_bytes(),
                    Err(e) => {
                        seen(&format!("refused: {e}"));
                        let status = if e.is::<LengthLimitError>() {
                            StatusCode::PAYLOAD_TOO_LARGE
                        } else {
                            StatusCode::BAD_REQUEST
                        };
                        return Ok(message(status, &format!("{e}\n")));
                    }
                };
                let len = body.len();
                self.objects.lock().unwrap_or_else(|e| e.into_inner()).insert(path.clone(), body);
                seen(&format!("stored {len} bytes"));
                message(StatusCode::OK, &format!("stored {len} bytes\n"))
            }
            Method::DELETE => {
                let removed = self.objects.lock().unwrap_or_else(|e| e.into_inner()).remove(&path).is_some();
                if removed {
                    seen("deleted");
                    message(StatusCode::OK, "deleted\n")
                } else {
                    seen("404, nothing there");
                    message(StatusCode::NOT_FOUND, "not found\n")
                }
            }
            _ => {
                seen("405, not a method this store knows");
                let mut r = message(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
                r.headers_mut().insert(ALLOW, HeaderValue::from_static("GET, HEAD, PUT, POST, DELETE"));
                r
            }
        };
        Ok(response)
    }
}

/// A short plain-text answer from the store itself.
fn message(status: StatusCode, text: &str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::copy_from_slice(text.as_bytes())));
    *r.status_mut() = status;
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    r
}
