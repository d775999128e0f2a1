use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower::Service;

use super::store::{Advance, FenceStore};
use super::token::token_from_headers;
use super::{KeyGate, ResponseFuture};
use crate::error::{Decision, Outcome, ProxyBody, ProxyError, Rejection};
use crate::route::Route;

/// The fencing middleware; see the [module docs](super) for what it guarantees.
///
/// It reads the request's [`Route`] from the request extensions (the routing
/// layer puts it there) and refuses, with a 500, a request that has none, so a
/// mis-built stack fails closed rather than forwarding unchecked writes.
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

impl<S, St, B> Service<Request<B>> for Fencing<S, St>
where
    S: Service<Request<B>, Response = Response<ProxyBody>, Error = ProxyError> + Clone + Send + 'static,
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

    fn call(&mut self, req: Request<B>) -> Self::Future {
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
    req: Request<B>,
) -> Result<Response<ProxyBody>, Rejection>
where
    S: Service<Request<B>, Response = Response<ProxyBody>, Error = ProxyError>,
    St: FenceStore,
{
    let Some(route) = req.extensions().get::<Arc<Route>>().cloned() else {
        return Err(ProxyError::Internal("request reached the fence without a route".into()).into());
    };
    if !route.is_fenced(req.method()) {
        return forward_unfenced(inner, req).await;
    }
    let header = &route.token_header;
    let token = match token_from_headers(req.headers(), header) {
        Ok(Some(token)) => Ok(token),
        Ok(None) if route.allow_missing_token => return forward_unfenced(inner, req).await,
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

    // A token already below the mark can never win: refuse it without queueing.
    match store.get(&key).await {
        Ok(Some(current)) if token < current => {
            return Err(Rejection::new(ProxyError::StaleToken { token, current }, Some(key), Some(token)))
        }
        Ok(_) => {}
        Err(e) => return Err(Rejection::new(e.into(), Some(key), Some(token))),
    }

    let turn = match gate.acquire(&key, route.queue_timeout).await {
        Ok(turn) => turn,
        Err(_) => return Err(Rejection::new(ProxyError::QueueTimeout(route.queue_timeout), Some(key), Some(token))),
    };
    // The check that counts happens with the turn held: a newer token may have
    // won while this request waited.
    match store.advance(&key, token).await {
        Ok(Advance::Accepted { .. }) => {}
        Ok(Advance::Stale { current }) => {
            return Err(Rejection::new(ProxyError::StaleToken { token, current }, Some(key), Some(token)))
        }
        Err(e) => return Err(Rejection::new(e.into(), Some(key), Some(token))),
    }
    let result = inner.call(req).await;
    match result {
        Ok(mut response) => {
            // The upstream's response head arrived: the next fenced request for
            // this key may go.
            drop(turn);
            let decision = Decision { outcome: Outcome::Forwarded, key: Some(key), token: Some(token), settled: false };
            response.extensions_mut().insert(decision);
            Ok(response)
        }
        Err(e) if e.is_ambiguous() && !route.settle.is_zero() => {
            // The upstream may still apply this write. Keep the key closed for the
            // settle period, so a newer write cannot land and then be overwritten
            // by this one (the idea of Chubby's lock-delay).
            let settle = route.settle;
            tokio::spawn(async move {
                tokio::time::sleep(settle).await;
                drop(turn);
            });
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

async fn forward_unfenced<S, B>(mut inner: S, req: Request<B>) -> Result<Response<ProxyBody>, Rejection>
where
    S: Service<Request<B>, Response = Response<ProxyBody>, Error = ProxyError>,
{
    let mut response = inner.call(req).await?;
    response.extensions_mut().insert(Decision { outcome: Outcome::Unfenced, key: None, token: None, settled: false });
    Ok(response)
}
