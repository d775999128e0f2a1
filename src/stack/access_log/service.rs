//! The access log's service: gives each request its ID, counts its body's
//! bytes, and times it from the moment it is handed over, in its span.

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::Instant;

use http::{Request, Response};
use tower::Service;

use super::future::{AccessLogBody, AccessLogFuture};
use super::layer::request_span;
use super::on_response::Started;
use super::AccessLog;
use crate::http::{request_id, ClientBody, ProxyBody};
use crate::stack::error::Rejection;
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

impl<S> Service<Request<ClientBody>> for AccessLogService<S>
where
    S: Service<Request<ClientBody>, Response = Response<ProxyBody>, Error = Rejection>,
{
    type Response = Response<AccessLogBody>;
    type Error = Infallible;
    type Future = AccessLogFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // The layers below are always ready; were one not, its refusal is
        // answered with the request's response, not by closing the connection.
        self.inner.poll_ready(cx).map(|_| Ok(()))
    }

    fn call(&mut self, mut req: Request<ClientBody>) -> Self::Future {
        let start = Instant::now();
        let span = request_span(&req);
        // Behind a trusted proxy, the client is the one X-Forwarded-For
        // names, read before the request is handed on (and changed); for
        // any other connection, one branch.
        let behind = self.log.client().behind_proxy(req.headers());
        traces::continue_from(&span, req.headers());
        // The ID goes upstream in the request's own head: the client's is
        // there already; a made one replaces whatever the client sent.
        let id = request_id(req.headers_mut());
        let (read, own) = self.log.read_count(req.version());
        let read_before = read.load(Ordering::Relaxed);
        req.body_mut().count_into(read);
        let started =
            Started { log: self.log.clone(), method: req.method().clone(), id, behind, read: own, read_before };
        let inner = {
            let _entered = span.enter();
            self.inner.call(req)
        };
        AccessLogFuture::new(inner, span, start, started)
    }
}
