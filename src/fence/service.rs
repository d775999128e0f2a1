use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Response;
use tower::Service;

use super::gate::Turn;
use super::signature::verify_headers;
use super::store::{Advance, FenceStore};
use super::token::token_from_headers;
use super::{KeyGate, ResponseFuture};
use crate::error::{Decision, Outcome, ProxyBody, ProxyError, Rejection};
use crate::route::Routed;

/// The fencing middleware; see the [module docs](super) for what it guarantees.
///
/// It takes [`Routed`] requests: the route says which methods are fenced and
/// how the key is made, and a stack that does not route before the fence does
/// not compile.
#[derive(Debug)]
pub struct Fencing<S, St> {
    inner: S,
    store: Arc<St>,
    gate: Arc<KeyGate>,
}

impl<S: Clone, St> Clone for Fencing<S, St> {
    fn clone(&self) -> Self {
        Fencing { inner: self.inner.clone(), store: self.store.clone(), gate: self.gate.clone() }
    }
}

impl<S, St> Fencing<S, St> {
    pub fn new(inner: S, store: Arc<St>, gate: Arc<KeyGate>) -> Self {
        Fencing { inner, store, gate }
    }
}

impl<S, St, B> Service<Routed<B>> for Fencing<S, St>
where
    S: Service<Routed<B>, Response = Response<ProxyBody>, Error = ProxyError> + Clone + Send + 'static,
    S::Future: Send,
    St: FenceStore,
    B: Send + 'static,
{
    type Response = Response<ProxyBody>;
    type Error = Rejection;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Rejection::from)
    }

    fn call(&mut self, req: Routed<B>) -> Self::Future {
        // Take the service that was driven to readiness; leave a fresh clone behind.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        ResponseFuture::new(decide_and_forward(inner, self.store.clone(), self.gate.clone(), req))
    }
}

async fn decide_and_forward<S, St, B>(
    mut inner: S,
    store: Arc<St>,
    gate: Arc<KeyGate>,
    routed: Routed<B>,
) -> Result<Response<ProxyBody>, Rejection>
where
    S: Service<Routed<B>, Response = Response<ProxyBody>, Error = ProxyError>,
    St: FenceStore,
{
    let Routed { route, request: req } = routed;
    if !route.is_fenced(req.method()) {
        return forward_unfenced(inner, Routed { route, request: req }).await;
    }
    let header = &route.token_header;
    let token = match token_from_headers(req.headers(), header) {
        Ok(Some(token)) => Ok(token),
        Ok(None) if route.allow_missing_token => return forward_unfenced(inner, Routed { route, request: req }).await,
        Ok(None) => Err(ProxyError::MissingToken { header: header.clone() }),
        Err(error) => Err(ProxyError::MalformedToken { header: header.clone(), error }),
    };
    let key = route.key.render(req.uri(), req.headers(), route.pattern.as_ref());
    // Token problems come first (428 / 400 malformed), with the key when it can be made.
    let (key, token) = match (key, token) {
        (Ok(key), Ok(token)) => (key, token),
        (key, Err(e)) => return Err(Rejection::new(e, key.ok(), None)),
        (Err(e), Ok(token)) => return Err(Rejection::new(e.into(), None, Some(token))),
    };

    // Before anything else: a token nobody with the key signed must not read the
    // mark, queue, or (above all) raise the mark, or any client could fence a key
    // forever with u64::MAX.
    if let Some(signing_key) = &route.signing_key {
        if let Err(e) = verify_headers(signing_key.bytes(), &key, token, req.headers()) {
            return Err(Rejection::new(ProxyError::BadSignature(e.as_str()), Some(key), Some(token)));
        }
    }

    // A token already below the mark can never win, and one too far above it
    // never will: refuse both without queueing.
    match store.get(&key).await {
        Ok(Some(current)) if token < current => {
            return Err(Rejection::new(ProxyError::StaleToken { token, current }, Some(key), Some(token)))
        }
        Ok(Some(current)) => {
            if let Err(e) = check_jump(route.max_token_jump, token, current) {
                return Err(Rejection::new(e, Some(key), Some(token)));
            }
        }
        Ok(None) => {}
        Err(e) => return Err(Rejection::new(e.into(), Some(key), Some(token))),
    }

    // After a restart on a store a previous process wrote to, that process may
    // have died with writes in flight: keys start closed for the settle period.
    if !gate.wait_reopened(route.settle, route.queue_timeout).await {
        return Err(Rejection::new(ProxyError::QueueTimeout(route.queue_timeout), Some(key), Some(token)));
    }
    let turn = match gate.acquire(&key, route.queue_timeout).await {
        Ok(turn) => turn,
        Err(_) => return Err(Rejection::new(ProxyError::QueueTimeout(route.queue_timeout), Some(key), Some(token))),
    };
    // The checks that count happen with the turn held: a newer token may have
    // won while this request waited. The jump is measured against the mark as it
    // is now; between this get and the advance only the fence API can move the
    // mark (fenced requests for this key wait for the turn), and raising it only
    // makes the jump smaller.
    if let Some(max_jump) = route.max_token_jump {
        match store.get(&key).await {
            Ok(Some(current)) => {
                if let Err(e) = check_jump(Some(max_jump), token, current) {
                    return Err(Rejection::new(e, Some(key), Some(token)));
                }
            }
            Ok(None) => {}
            Err(e) => return Err(Rejection::new(e.into(), Some(key), Some(token))),
        }
    }
    match store.advance(&key, token).await {
        Ok(Advance::Accepted { .. }) => {}
        Ok(Advance::Stale { current }) => {
            return Err(Rejection::new(ProxyError::StaleToken { token, current }, Some(key), Some(token)))
        }
        Err(e) => return Err(Rejection::new(e.into(), Some(key), Some(token))),
    }
    // If this future is dropped from here on (the client went away), the
    // request may already be at the upstream: the guard then settles the key.
    let settle = route.settle;
    let turn = SettlingTurn { turn: Some(turn), settle };
    let result = inner.call(Routed { route, request: req }).await;
    let turn = turn.disarm();
    match result {
        Ok(mut response) => {
            // The upstream's response head arrived: the next fenced request for
            // this key may go.
            drop(turn);
            let decision = Decision { outcome: Outcome::Forwarded, key: Some(key), token: Some(token), settled: false };
            response.extensions_mut().insert(decision);
            Ok(response)
        }
        Err(e) if e.is_ambiguous() && !settle.is_zero() => {
            // The upstream may still apply this write. Keep the key closed for the
            // settle period, so a newer write cannot land and then be overwritten
            // by this one (the idea of Chubby's lock-delay).
            hold_for(turn, settle);
            let mut rejection = Rejection::new(e, Some(key), Some(token));
            rejection.settle = Some(settle);
            Err(rejection)
        }
        Err(e) => {
            // Nothing reached the upstream, or settling is off: pass the turn on.
            drop(turn);
            Err(Rejection::new(e, Some(key), Some(token)))
        }
    }
}

/// Keeps a key closed for `settle` before passing its turn on.
fn hold_for(turn: Turn, settle: Duration) {
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            runtime.spawn(async move {
                tokio::time::sleep(settle).await;
                drop(turn);
            });
        }
        // No runtime left (the process is stopping): nothing else will forward.
        Err(_) => drop(turn),
    }
}

/// A key's turn while its request is with the upstream. Dropped without
/// [`disarm`](Self::disarm) (the client disconnected and the request future
/// was cancelled), the outcome is unknown, so the key settles like after a
/// timeout.
struct SettlingTurn {
    turn: Option<Turn>,
    settle: Duration,
}

impl SettlingTurn {
    fn disarm(mut self) -> Turn {
        self.turn.take().expect("armed until disarmed")
    }
}

impl Drop for SettlingTurn {
    fn drop(&mut self) {
        if let Some(turn) = self.turn.take() {
            if self.settle.is_zero() {
                drop(turn);
            } else {
                hold_for(turn, self.settle);
            }
        }
    }
}

/// Refuses a token more than `max_jump` above the mark `current`. Without a
/// limit, or when `current + max_jump` passes `u64::MAX`, every token is near enough.
fn check_jump(max_jump: Option<u64>, token: u64, current: u64) -> Result<(), ProxyError> {
    match max_jump {
        Some(max_jump) if token > current.saturating_add(max_jump) => {
            Err(ProxyError::TokenJump { token, current, max_jump })
        }
        _ => Ok(()),
    }
}

async fn forward_unfenced<S, B>(mut inner: S, req: Routed<B>) -> Result<Response<ProxyBody>, Rejection>
where
    S: Service<Routed<B>, Response = Response<ProxyBody>, Error = ProxyError>,
{
    let mut response = inner.call(req).await?;
    response.extensions_mut().insert(Decision { outcome: Outcome::Unfenced, key: None, token: None, settled: false });
    Ok(response)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use bytes::Bytes;
    use http::{Method, Request};
    use http_body_util::{Either, Full};

    use super::*;
    use crate::fence::signature::sign;
    use crate::fence::store::{MemoryStore, StoreError};
    use crate::route::{Route, SigningKey};

    const SECRET: &[u8] = b"service-test-secret-0123";

    fn route(signing_key: Option<&[u8]>, max_token_jump: Option<u64>) -> Arc<Route> {
        Arc::new(Route {
            signing_key: signing_key.map(SigningKey::new),
            max_token_jump,
            ..crate::route::test_route("objects", "/objects/")
        })
    }

    /// A memory store that counts reads, and whose first read answers what the
    /// mark was just before another request raised it to `raced_to`.
    #[derive(Default)]
    struct WitnessStore {
        inner: MemoryStore,
        gets: AtomicUsize,
        advances: AtomicUsize,
        raced_to: Option<u64>,
    }

    impl FenceStore for WitnessStore {
        async fn get(&self, key: &str) -> Result<Option<u64>, StoreError> {
            let first = self.gets.fetch_add(1, Ordering::SeqCst) == 0;
            let mark = self.inner.get(key).await;
            if let (true, Some(token)) = (first, self.raced_to) {
                self.inner.advance_now(key, token);
            }
            mark
        }
        async fn advance(&self, key: &str, token: u64) -> Result<Advance, StoreError> {
            self.advances.fetch_add(1, Ordering::SeqCst);
            self.inner.advance(key, token).await
        }
        async fn list(&self, _: &str, _: Option<&str>, _: usize) -> Result<Vec<(String, u64)>, StoreError> {
            Ok(Vec::new())
        }
        fn tracked_keys(&self) -> usize {
            0
        }
        fn cached_keys(&self) -> usize {
            0
        }
    }

    /// Runs one `PUT /objects/a` through the fence; returns the status and how
    /// many requests reached the inner service.
    async fn put(route: Arc<Route>, store: Arc<WitnessStore>, headers: &[(&str, &str)]) -> (u16, usize) {
        let forwarded = Arc::new(AtomicUsize::new(0));
        let seen = forwarded.clone();
        let inner = tower::service_fn(move |_req: Routed<()>| {
            seen.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, ProxyError>(Response::new(Either::Right(Full::new(Bytes::new())))) }
        });
        let mut req = Request::builder().method(Method::PUT).uri("/objects/a");
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        let req = Routed { route, request: req.body(()).unwrap() };
        let status = match decide_and_forward(inner, store, Arc::new(KeyGate::default()), req).await {
            Ok(response) => response.status().as_u16(),
            Err(rejection) => rejection.error.status().as_u16(),
        };
        (status, forwarded.load(Ordering::SeqCst))
    }

    #[tokio::test]
    async fn a_bad_signature_never_touches_the_store() {
        let route = route(Some(SECRET), Some(5));
        let wrong = sign(b"some-other-secret-012345", "/objects/a", 7);
        for headers in [
            vec![("x-fencing-token", "18446744073709551615")],
            vec![("x-fencing-token", "7"), ("x-fencing-signature", wrong.as_str())],
        ] {
            let store = Arc::new(WitnessStore::default());
            assert_eq!(put(route.clone(), store.clone(), &headers).await, (403, 0));
            assert_eq!(store.gets.load(Ordering::SeqCst), 0, "the mark was read");
            assert_eq!(store.advances.load(Ordering::SeqCst), 0, "the mark was raised");
        }
        let store = Arc::new(WitnessStore::default());
        let good = sign(SECRET, "/objects/a", 7);
        let headers = [("x-fencing-token", "7"), ("x-fencing-signature", good.as_str())];
        assert_eq!(put(route, store.clone(), &headers).await, (200, 1));
        assert_eq!(store.inner.get("/objects/a").await.unwrap(), Some(7));
    }

    #[tokio::test]
    async fn the_jump_is_checked_again_when_the_turn_comes() {
        // The early read sees a fresh key (no limit); by the time the turn comes
        // another request has made the mark 1. u64::MAX must not get through.
        let store = Arc::new(WitnessStore { raced_to: Some(1), ..Default::default() });
        let headers = [("x-fencing-token", "18446744073709551615")];
        assert_eq!(put(route(None, Some(5)), store.clone(), &headers).await, (403, 0));
        assert_eq!(store.advances.load(Ordering::SeqCst), 0);
        assert_eq!(store.inner.get("/objects/a").await.unwrap(), Some(1));
        // Without a limit the same race is just a higher token.
        let store = Arc::new(WitnessStore { raced_to: Some(1), ..Default::default() });
        assert_eq!(put(route(None, None), store.clone(), &headers).await, (200, 1));
    }

    #[test]
    fn jump_limit_is_inclusive_and_cannot_overflow() {
        assert!(check_jump(None, u64::MAX, 0).is_ok());
        assert!(check_jump(Some(5), 15, 10).is_ok());
        assert!(matches!(
            check_jump(Some(5), 16, 10),
            Err(ProxyError::TokenJump { token: 16, current: 10, max_jump: 5 })
        ));
        assert!(check_jump(Some(0), 10, 10).is_ok());
        assert!(check_jump(Some(0), 11, 10).is_err());
        assert!(check_jump(Some(u64::MAX), u64::MAX, 1).is_ok());
        assert!(check_jump(Some(10), u64::MAX, u64::MAX - 3).is_ok());
    }
}
