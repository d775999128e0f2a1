//! [`Fencing`](super::service::Fencing)'s response future.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::Response;

use crate::error::Rejection;
use crate::proxy::ProxyBody;

type BoxedDecision = Pin<Box<dyn Future<Output = Result<Response<ProxyBody>, Rejection>> + Send>>;

/// Response future of [`super::Fencing`]: resolves once the upstream's response
/// head arrived (the key's turn has been passed on by then) or the request was
/// refused.
pub struct ResponseFuture {
    inner: BoxedDecision,
}

impl ResponseFuture {
    pub(super) fn new(inner: impl Future<Output = Result<Response<ProxyBody>, Rejection>> + Send + 'static) -> Self {
        ResponseFuture { inner: Box::pin(inner) }
    }
}

impl Future for ResponseFuture {
    type Output = Result<Response<ProxyBody>, Rejection>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

impl std::fmt::Debug for ResponseFuture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
