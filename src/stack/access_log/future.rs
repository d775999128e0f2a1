//! The access log's response future, which counts the response when its
//! head comes and puts the request ID on it, and the response body, polled
//! in the request's span, which counts its bytes and writes the line when
//! it is done.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http::Response;
use hyper::body::{Body, Frame, SizeHint};
use tracing::Span;

use super::on_response::{Answered, Started};
use crate::http::{Outcome, ProxyBody, REQUEST_ID};
use crate::metrics::NO_ROUTE_LABEL;
use crate::stack::error::Rejection;
use crate::telemetry::traces;

pin_project_lite::pin_project! {
    /// [`AccessLogService`](super::service::AccessLogService)'s future: the
    /// inner future, polled in the request's span; its response is counted
    /// once, with the time since the request was handed over, and carries
    /// the request's ID.
    pub struct AccessLogFuture<F> {
        #[pin]
        inner: F,
        span: Span,
        start: Instant,
        // `None` once the response has come.
        started: Option<Started>,
    }
}

impl<F> AccessLogFuture<F> {
    pub(super) fn new(inner: F, span: Span, start: Instant, started: Started) -> Self {
        AccessLogFuture { inner, span, start, started: Some(started) }
    }
}

impl<F> Future for AccessLogFuture<F>
where
    F: Future<Output = Result<Response<ProxyBody>, Rejection>>,
{
    type Output = Result<Response<AccessLogBody>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let response = {
            let _entered = this.span.enter();
            ready!(this.inner.poll(cx))
        };
        let latency = this.start.elapsed();
        let started = this.started.take().expect("AccessLogFuture polled after it was done");
        // A refusal is answered here, where the request's ID is at hand for
        // its problem.
        let mut response = response.unwrap_or_else(|refusal| refusal.into_response_for(Some(&started.id)));
        started.log.on_response(&response, latency);
        record_decision(this.span, &response);
        // The upstream's own ID, if it sent one, is the request's already
        // (it got it) or not this request's: the response carries ours.
        response.headers_mut().insert(&REQUEST_ID, started.id.clone());
        let answered = Answered {
            status: response.status().as_u16(),
            upstream: response.body().is_upstream(),
            latency_us: latency.as_micros() as u64,
            started,
        };
        // The body keeps the span: it closes when the body is done.
        let span = std::mem::replace(this.span, Span::none());
        Poll::Ready(Ok(response.map(|inner| AccessLogBody { inner, span, answered, sent: 0 })))
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
    /// A response body polled in its request's span; the request's line is
    /// written when it is dropped (sent to its end, or cut off), with the
    /// bytes sent of it.
    pub struct AccessLogBody {
        #[pin]
        inner: ProxyBody,
        span: Span,
        answered: Answered,
        sent: u64,
    }

    impl PinnedDrop for AccessLogBody {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            this.answered.write(&this.inner, *this.sent, this.span);
        }
    }
}

impl Body for AccessLogBody {
    type Data = Bytes;
    type Error = <ProxyBody as Body>::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.project();
        let _entered = this.span.enter();
        let polled = this.inner.poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled {
            if let Some(data) = frame.data_ref() {
                *this.sent += data.len() as u64;
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
