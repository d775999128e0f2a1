//! The pipeline's steps together: what reaches the forward, and what is
//! refused where.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use http::{Request, Response};
use tower::ServiceExt;

use super::*;
use crate::fence::store::{Advance, Deleted, MemoryStore, Selection, StoreError};
use crate::route::{test_route, RouteTable};
use crate::stack::error::ProxyError;
use crate::stack::router::Routed;

/// A memory store whose marks are never at hand: each must be read.
#[derive(Default)]
struct Cold(MemoryStore);

impl FenceStore for Cold {
    async fn get(&self, key: &str) -> Result<Option<u64>, StoreError> {
        self.0.get(key).await
    }
    async fn advance(&self, key: &str, token: u64) -> Result<Advance, StoreError> {
        self.0.advance(key, token).await
    }
    async fn list(&self, prefix: &str, after: Option<&str>, limit: usize) -> Result<Vec<(String, u64)>, StoreError> {
        self.0.list(prefix, after, limit).await
    }
    async fn delete(&self, which: &Selection) -> Result<Deleted, StoreError> {
        self.0.delete(which).await
    }
    fn tracked_keys(&self) -> usize {
        self.0.tracked_keys()
    }
    fn cached_keys(&self) -> usize {
        self.0.cached_keys()
    }
}

/// The open bodies of the test's one connection: none to count or drain.
struct Bodies;

impl crate::http::OpenBodies for Bodies {
    fn body_started(&self) {}
    fn body_ended(&self) {}
    fn dropped_early(self: Arc<Self>, _rest: hyper::body::Incoming, _http1: bool) {}
}

/// Sends one `PUT /objects/a` with `token` and a one-byte body through a
/// connection's pipeline over `store`, served by hyper on a real socket;
/// returns the status and whether the forward was reached.
async fn put_through<St: FenceStore>(store: Arc<St>, token: u64) -> (u16, bool) {
    put_through_at(store, token, 1 << 20, 1 << 16).await
}

/// [`put_through`] on a connection whose heads may reach the upstream at
/// `header_rate` bytes a second, starting with `header_start`.
async fn put_through_at<St: FenceStore>(
    store: Arc<St>,
    token: u64,
    header_rate: u64,
    header_start: u64,
) -> (u16, bool) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let reached = Arc::new(AtomicBool::new(false));
    let forward = {
        let reached = reached.clone();
        tower::service_fn(move |_: Routed<RequestBody>| {
            reached.store(true, Ordering::SeqCst);
            async { Ok::<_, ProxyError>(Response::new(ProxyBody::default())) }
        })
    };
    let fences = Fences {
        routes: Arc::new(LiveRoutes::new(RouteTable::new([test_route("objects", "/objects/")]))),
        store,
        gate: Arc::new(KeyGate::default()),
        buffers: BufferBudget::new(1 << 20),
    };
    let limits = ConnectionLimits {
        buffer_share: 1 << 20,
        max_headers: 100,
        header_rate,
        header_start,
        refusal_drain: crate::config::RefusalDrain {
            bytes: 0,
            time: std::time::Duration::ZERO,
            silence: std::time::Duration::ZERO,
        },
    };
    let pipeline = Pipeline::new(forward, fences, &limits, false);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (stream, _) = listener.accept().await.unwrap();
        let bodies: Arc<dyn crate::http::OpenBodies> = Arc::new(Bodies);
        let service = hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
            let request = request.map(|body| ClientBody::new(body, &bodies, true, false));
            let pipeline = pipeline.clone();
            async move {
                let response = pipeline.oneshot(request).await.unwrap_or_else(Rejection::into_response);
                Ok::<_, std::convert::Infallible>(response)
            }
        });
        let io = hyper_util::rt::TokioIo::new(stream);
        let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await;
    });
    let mut client = tokio::net::TcpStream::connect(address).await.unwrap();
    let head = format!(
        "PUT /objects/a HTTP/1.1\r\nhost: fencegate.test\r\nx-fencing-token: {token}\r\ncontent-length: 1\r\nconnection: close\r\n\r\nv"
    );
    client.write_all(head.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    client.read_to_end(&mut answer).await.unwrap();
    let status = std::str::from_utf8(&answer[9..12]).unwrap().parse().unwrap();
    (status, reached.load(Ordering::SeqCst))
}

/// A stale token is refused from the head, before the body, whether the
/// store has the mark at hand or must read it first.
#[tokio::test]
async fn a_stale_token_is_refused_from_the_head_whether_the_mark_is_at_hand_or_read() {
    let hot = Arc::new(MemoryStore::default());
    let cold = Arc::new(Cold::default());
    hot.advance("/objects/a", 7).await.unwrap();
    cold.advance("/objects/a", 7).await.unwrap();
    assert_eq!(hot.peek("/objects/a"), Some(Some(7)));
    assert_eq!(cold.peek("/objects/a"), None);
    assert_eq!(put_through(hot.clone(), 6).await, (409, false));
    assert_eq!(put_through(cold.clone(), 6).await, (409, false));
    assert_eq!(put_through(hot.clone(), 7).await, (200, true));
    assert_eq!(put_through(cold.clone(), 8).await, (200, true));
    assert_eq!(hot.get("/objects/a").await.unwrap(), Some(7));
    assert_eq!(cold.get("/objects/a").await.unwrap(), Some(8));
}

/// A head refused for the connection's header rate (after routing, before
/// the head checks) reaches nothing: no forward, no mark raised.
#[tokio::test]
async fn a_head_over_the_header_rate_raises_no_mark_and_reaches_nothing() {
    let store = Arc::new(MemoryStore::default());
    store.advance("/objects/a", 7).await.unwrap();
    assert_eq!(put_through_at(store.clone(), 9, 1_000, 0).await, (429, false));
    assert_eq!(store.get("/objects/a").await.unwrap(), Some(7));
    assert_eq!(put_through_at(store.clone(), 9, 1 << 20, 1 << 16).await, (200, true));
    assert_eq!(store.get("/objects/a").await.unwrap(), Some(9));
}
