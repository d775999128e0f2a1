//! The access log's service: times each request from the moment it is
//! handed over, in its span.

use std::task::{Context, Poll};
use std::time::Instant;

use http::{Request, Response};
use tower::Service;

use super::future::{AccessLogBody, AccessLogFuture};
use super::layer::request_span;
use super::AccessLog;
use crate::http::ProxyBody;
use crate::telemetry::traces;

/// See [`AccessLogLayer`](super::layer::AccessLogLayer).
#[derive(Clone)]
pub struct AccessLogService<S> {
    inner: S,
    log: AccessLog,
}

impl<S> AccessLogService<S> {
    pub(super) fn new(inner: S, log: AccessLog) -> Self {
        AccessLogService { inner, log }
    }
}

impl<S, B> Service<Request<B>> for AccessLogService<S>
where
    S: Service<Request<B>, Response = Response<ProxyBody>>,
{
    type Response = Response<AccessLogBody>;
    type Error = S::Error;
    type Future = AccessLogFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let start = Instant::now();
        let span = request_span(&req);
        // Behind a trusted proxy, the client is the one X-Forwarded-For
        // names, read before the request is handed on (and changed); for
        // any other connection, one branch.
        let behind = self.log.client().behind_proxy(req.headers());
        traces::continue_from(&span, req.headers());
        let inner = {
            let _entered = span.enter();
            self.inner.call(req)
        };
        AccessLogFuture::new(inner, span, start, self.log.clone(), behind)
    }
}
