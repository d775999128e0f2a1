//! Requests in flight, counted for a connection's [`Activity`]: a request
//! counts from the moment hyper hands it over until its response body is sent
//! or dropped, so no guard closes a connection that is still working.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper::body::{Body, Frame, SizeHint};
use tower::{Layer, Service};

use super::activity::Activity;
use crate::outcome::{Decision, Outcome};

/// Counts a connection's requests in flight for its [`Activity`].
#[derive(Clone)]
pub(crate) struct TrackRequestsLayer(pub(crate) Arc<Activity>);

impl<S> Layer<S> for TrackRequestsLayer {
    type Service = TrackRequests<S>;

    fn layer(&self, inner: S) -> TrackRequests<S> {
        TrackRequests { inner, activity: self.0.clone() }
    }
}

/// See [`TrackRequestsLayer`].
#[derive(Clone)]
pub(crate) struct TrackRequests<S> {
    inner: S,
    activity: Arc<Activity>,
}

impl<S, R, B> Service<R> for TrackRequests<S>
where
    S: Service<R, Response = http::Response<B>>,
{
    type Response = http::Response<TrackedBody<B>>;
    type Error = S::Error;
    type Future = TrackedFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: R) -> Self::Future {
        self.activity.request_started();
        // The guard travels with the response body: a request counts until its
        // body is sent (or dropped), including one whose future is dropped early.
        let guard = Some(InFlight(self.activity.clone()));
        TrackedFuture { inner: self.inner.call(req), guard }
    }
}

pin_project_lite::pin_project! {
    /// [`TrackRequests`]' response future: hands the request's guard to the body.
    pub(crate) struct TrackedFuture<F> {
        #[pin]
        inner: F,
        guard: Option<InFlight>,
    }
}

impl<F, B, E> Future for TrackedFuture<F>
where
    F: Future<Output = Result<http::Response<B>, E>>,
{
    type Output = Result<http::Response<TrackedBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let response = std::task::ready!(this.inner.poll(cx))?;
        let guard = this.guard.take();
        if let Some(InFlight(activity)) = &guard {
            // The upstream's own answers (forwarded, fenced or not) are not
            // fencegate refusing the client, whatever their status.
            let upstream = response
                .extensions()
                .get::<Decision>()
                .is_some_and(|d| matches!(d.outcome, Outcome::Forwarded | Outcome::Unfenced));
            activity.answered(response.status(), upstream);
        }
        Poll::Ready(Ok(response.map(|body| TrackedBody { inner: body, _guard: guard })))
    }
}

pin_project_lite::pin_project! {
    /// A response body that keeps its request counted until it is done.
    pub(crate) struct TrackedBody<B> {
        #[pin]
        inner: B,
        _guard: Option<InFlight>,
    }
}

impl<B: Body> Body for TrackedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        self.project().inner.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Counts one request in flight until dropped.
pub(crate) struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.request_finished();
    }
}
