//! The header-count service: counts a request's fields, refuses past the
//! limit.

use std::task::{Context, Poll};

use http::{Request, Response};
use tower::Service;

use crate::http::ProxyBody;
use crate::stack::error::RefusedOr;
use crate::stack::error::{ProxyError, Rejection};

/// See [`HeaderCountLayer`](super::HeaderCountLayer).
#[derive(Debug, Clone)]
pub struct HeaderCount<S> {
    inner: S,
    max: usize,
}

impl<S> HeaderCount<S> {
    pub(super) fn new(inner: S, max: usize) -> Self {
        HeaderCount { inner, max }
    }
}

impl<S, B> Service<Request<B>> for HeaderCount<S>
where
    S: Service<Request<B>, Response = Response<ProxyBody>, Error = Rejection>,
    S::Future: Send + 'static,
{
    type Response = Response<ProxyBody>;
    type Error = Rejection;
    type Future = RefusedOr<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Rejection>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // `len` counts every field line, a repeated name once per value, as
        // hyper's HTTP/1.1 parser does; pseudo-headers are not in the map.
        let count = request.headers().len();
        if count > self.max {
            return RefusedOr::refused(ProxyError::TooManyHeaders { count, max: self.max });
        }
        RefusedOr::Passed { inner: self.inner.call(request) }
    }
}
