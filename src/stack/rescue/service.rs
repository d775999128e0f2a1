//! The rescue service: a panic in `call` below is caught here, and every
//! answer from below goes through [`RescueFuture`].

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::task::{Context, Poll};

use http::{Request, Response};
use tower::Service;

use super::{panic_rejection, RescueFuture};
use crate::http::ProxyBody;
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
    type Error = Rejection;
    type Future = RescueFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Rejection>> {
        // The layers below are always ready; were one not, its refusal is
        // answered with the request's response, not by closing the connection.
        match self.inner.poll_ready(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(_) => Poll::Ready(Ok(())),
        }
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        match catch_unwind(AssertUnwindSafe(|| self.inner.call(req))) {
            Ok(inner) => RescueFuture::Running { inner },
            Err(panic) => RescueFuture::Panicked { rejection: Some(Box::new(panic_rejection(panic))) },
        }
    }
}
