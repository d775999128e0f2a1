//! Requests in flight, counted for a connection's [`Activity`]: a request
//! counts from the moment hyper hands it over until its response body is sent
//! or dropped, so no guard closes a connection that is still working. Its
//! body counts until it is read to its end, so no connection rests while hyper
//! still reads one.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper::body::{Body, Frame, Incoming, SizeHint};
use tower::{Layer, Service};

use super::activity::Activity;
use crate::proxy::{refuses_heads_with, UpstreamAnswer};

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

impl<S, B> Service<http::Request<Incoming>> for TrackRequests<S>
where
    S: Service<http::Request<ClientBody>, Response = http::Response<B>>,
{
    type Response = http::Response<TrackedBody<B>>;
    type Error = S::Error;
    type Future = TrackedFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<Incoming>) -> Self::Future {
        self.activity.request_started();
        let req = req.map(|body| ClientBody::new(body, &self.activity));
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
            activity.answered(refuses_the_head(&response));
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

pin_project_lite::pin_project! {
    /// A request body as hyper hands it over, counted in its connection's
    /// [`Activity`] until it is read to its end.
    pub struct ClientBody {
        #[pin]
        inner: Incoming,
        open: Option<Arc<Activity>>,
    }
}

impl ClientBody {
    fn new(inner: Incoming, activity: &Arc<Activity>) -> ClientBody {
        let open = (!inner.is_end_stream()).then(|| {
            activity.body_started();
            activity.clone()
        });
        ClientBody { inner, open }
    }
}

impl std::fmt::Debug for ClientBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

impl Body for ClientBody {
    type Data = bytes::Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<bytes::Bytes>, hyper::Error>>> {
        let mut this = self.project();
        let frame = std::task::ready!(this.inner.as_mut().poll_frame(cx));
        // The end: no more frames, or (with a declared length) the last byte
        // of it. hyper has left the body behind by then: it marks its reading
        // done before it hands over the last chunk. A reader that stops at
        // the declared length (hyper's client does) never asks again.
        if frame.is_none() || this.inner.is_end_stream() {
            if let Some(activity) = this.open.take() {
                activity.body_ended();
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Whether fencegate itself refused the request for what its head is
/// ([`refuses_heads_with`]). The upstream's answers (forwarded, fenced or
/// not) never are, whatever their status: an upstream that rate-limits a
/// client with 429s is its business. The status first: most answers stop there.
fn refuses_the_head<B>(response: &http::Response<B>) -> bool {
    refuses_heads_with(response.status()) && response.extensions().get::<UpstreamAnswer>().is_none()
}

/// Counts one request in flight until dropped.
pub(crate) struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.request_finished();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outcome::{Decision, Outcome};
    use crate::proxy::{decide, ProxyBody};

    fn answer(status: u16, outcome: Option<Outcome>) -> http::Response<ProxyBody> {
        let mut response = http::Response::builder().status(status).body(ProxyBody::default()).unwrap();
        if let Some(outcome) = outcome {
            decide(&mut response, Decision { outcome, key: None, token: None, settled: false, route: None });
        }
        response
    }

    #[test]
    fn only_fencegate_refusing_a_head_counts() {
        for status in [400, 429, 431] {
            assert!(refuses_the_head(&answer(status, None)), "{status}");
            assert!(refuses_the_head(&answer(status, Some(Outcome::RateLimited))), "{status}");
            // The upstream's answers never count, whatever their status.
            assert!(!refuses_the_head(&answer(status, Some(Outcome::Forwarded))), "{status}");
            assert!(!refuses_the_head(&answer(status, Some(Outcome::Unfenced))), "{status}");
        }
        for status in [200, 404, 409, 413, 503] {
            assert!(!refuses_the_head(&answer(status, None)), "{status}");
        }
    }
}
