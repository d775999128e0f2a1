//! [`Bodies`]: the limit, and the read of a fenced body started.

use std::sync::Arc;
use std::task::{Context, Poll};

use http::Response;
use hyper::body::Body;
use tower::Service;

use super::future::{BodyFuture, Reading};
use crate::http::{declared_length, BufferBudget, ClientBody, Held, ProxyBody, Reader, RequestBody};
use crate::stack::error::{ProxyError, Rejection};
use crate::stack::head::Checked;

/// See [`BodyLayer`].
#[derive(Debug, Clone)]
pub struct Bodies<S> {
    pub(super) inner: S,
    /// The process's budget and the connection's share, behind one count of
    /// the connection's own: cloned for every request, it touches no count
    /// the other worker threads write.
    pub(super) budgets: Arc<(Arc<BufferBudget>, Arc<BufferBudget>)>,
}

impl<S> Service<Checked<ClientBody>> for Bodies<S>
where
    S: Service<Checked<RequestBody>, Response = Response<ProxyBody>, Error = Rejection> + Clone,
{
    type Response = Response<ProxyBody>;
    type Error = Rejection;
    type Future = BodyFuture<S, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Rejection>> {
        self.inner.poll_ready(cx)
    }

    /// Applies the route's `max_body` to the request, reading a fenced body
    /// whole (see the [module docs](super)). A refusal names the fence key and
    /// token.
    fn call(&mut self, checked: Checked<ClientBody>) -> Self::Future {
        let (checked, body) = checked.take_body();
        let route = &checked.routed.route;
        let limit = route.max_body;
        let declared = declared_length(checked.routed.request.headers());
        if declared.is_some_and(|len| len > limit) {
            let rejection = checked.rejection(ProxyError::BodyTooLarge { limit, partly_sent: false });
            return BodyFuture::Refused { rejection: Some(rejection) };
        }
        if checked.fence.is_none() || route.stream_body || body.is_end_stream() {
            return BodyFuture::Passed {
                inner: self.inner.call(checked.with_body(RequestBody::streaming(body, limit))),
            };
        }
        // A declared length is taken from the budget up front: a client cannot
        // start more such bodies than the budget holds.
        let mut held = Held::new(&self.budgets.0, &self.budgets.1);
        if let Some(len) = declared {
            if let Err(e) = held.take(len) {
                return BodyFuture::Refused { rejection: Some(checked.rejection(e.into())) };
            }
        }
        // Bounded in time too (the route's timeout): a client that stalls
        // mid-body must not hold its connection and the bytes buffered so far
        // forever.
        let timeout = route.timeout;
        // The service driven to readiness goes with the request; a fresh
        // clone stays behind.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        BodyFuture::Reading {
            reading: Some(Reading { reader: Reader::new(body, limit, declared, held), checked, inner }),
            deadline: None,
            timeout,
        }
    }
}
