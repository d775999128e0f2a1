//! The rescue service: a panic in `call` below is caught here, and every
//! answer from below goes through [`RescueFuture`].

use std::convert::Infallible;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::task::{Context, Poll};

use http::{Request, Response};
use tower::Service;

use super::{panic_response, RescueFuture};
use crate::http::{ProxyBody, REQUEST_ID_HEADER};
use crate::stack::error::Rejection;

/// See [`RescueLayer`](super::RescueLayer).
#[derive(Debug, Clone)]
pub struct Rescue<S> {
    inner: S,
}

impl<S> Rescue<S> {
    pub(super) fn new(inner: S) -> Self {
        Rescue { inner }
    }
}

impl<S, B> Service<Request<B>> for Rescue<S>
where
    S: Service<Request<B>, Response = Response<ProxyBody>, Error = Rejection>,
    S::Future: Send + 'static,
{
    type Response = Response<ProxyBody>;
    type Error = Infallible;
    type Future = RescueFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // The layers below are always ready; were one not, its refusal is
        // answered with the request's response, not by closing the connection.
        match self.inner.poll_ready(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(_) => Poll::Ready(Ok(())),
        }
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        // Kept for the problem of a refusal: the request is gone by then.
        let request_id = req.headers().get(REQUEST_ID_HEADER).cloned();
        match catch_unwind(AssertUnwindSafe(|| self.inner.call(req))) {
            Ok(inner) => RescueFuture::Running { inner, request_id },
            Err(panic) => {
                RescueFuture::Panicked { response: Some(Box::new(panic_response(panic, request_id.as_ref()))) }
            }
        }
    }
}
