//! The access log's response future, which writes the line when the
//! response head comes, and the response body, polled in the request's span.

use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http::Response;
use hyper::body::{Body, Frame, SizeHint};
use tracing::Span;

use super::AccessLog;
use crate::http::{Outcome, ProxyBody};
use crate::metrics::NO_ROUTE_LABEL;
use crate::telemetry::traces;

pin_project_lite::pin_project! {
    /// [`AccessLogService`](super::service::AccessLogService)'s future: the
    /// inner future, polled in the request's span; its response is counted
    /// and logged once, with the time since the request was handed over.
    pub struct AccessLogFuture<F> {
        #[pin]
        inner: F,
        span: Span,
        start: Instant,
        log: AccessLog,
        // The client a trusted proxy named, if the connection is one's.
        behind: Option<IpAddr>,
    }
}

impl<F> AccessLogFuture<F> {
    pub(super) fn new(inner: F, span: Span, start: Instant, log: AccessLog, behind: Option<IpAddr>) -> Self {
        AccessLogFuture { inner, span, start, log, behind }
    }
}

impl<F, E> Future for AccessLogFuture<F>
where
    F: Future<Output = Result<Response<ProxyBody>, E>>,
{
    type Output = Result<Response<AccessLogBody>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let response = {
            let _entered = this.span.enter();
            let response = ready!(this.inner.poll(cx))?;
            this.log.on_response(&response, this.start.elapsed(), this.span, *this.behind);
            record_decision(this.span, &response);
            response
        };
        // The body keeps the span: it closes when the body is done.
        let span = std::mem::replace(this.span, Span::none());
        Poll::Ready(Ok(response.map(|inner| AccessLogBody { inner, span })))
    }
}

/// The decision on the request's span, for traces (nothing on a disabled span).
fn record_decision(span: &Span, response: &Response<ProxyBody>) {
    if span.is_disabled() {
        return;
    }
    let decision = response.body().decision();
    let route = decision.and_then(|d| d.route.as_ref()).map_or(NO_ROUTE_LABEL, |r| r.0.name());
    let outcome = decision.map_or(Outcome::Internal, |d| d.outcome);
    let (key, token) = (decision.and_then(|d| d.key.as_deref()), decision.and_then(|d| d.token));
    traces::record_decision(span, outcome.as_str(), route, key, token);
}

pin_project_lite::pin_project! {
    /// A response body polled in its request's span.
    pub struct AccessLogBody {
        #[pin]
        inner: ProxyBody,
        span: Span,
    }
}

impl Body for AccessLogBody {
    type Data = Bytes;
    type Error = <ProxyBody as Body>::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.project();
        let _entered = this.span.enter();
        this.inner.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
