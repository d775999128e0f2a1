//! Requests in flight, counted for a connection's [`Activity`]: a request
//! counts from the moment hyper hands it over until its response body is sent
//! or dropped, so no guard closes a connection that is still working. Its
//! body counts until it is read to its end, so no connection rests while hyper
//! still reads one. A body dropped before its end (its request refused, or
//! cut off) is drained within `[server] refusal_drain_*` (drain.rs), so the
//! client reads the answer.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::header::EXPECT;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use tower::{Layer, Service};

use super::activity::Activity;
use super::drain;
use crate::config::RefusalDrain;
use crate::http::{refuses_heads_with, ClientBody, OpenBodies, UpstreamAnswer};

/// Counts a connection's requests in flight for its [`Activity`], and drains
/// the bodies dropped before their end within `drain`.
#[derive(Clone)]
pub(crate) struct TrackRequestsLayer {
    activity: Arc<Activity>,
    bodies: Arc<dyn OpenBodies>,
}

impl TrackRequestsLayer {
    pub(crate) fn new(activity: Arc<Activity>, drain: RefusalDrain) -> TrackRequestsLayer {
        let bodies = Arc::new(ConnectionBodies { activity: activity.clone(), drain });
        TrackRequestsLayer { activity, bodies }
    }
}

impl<S> Layer<S> for TrackRequestsLayer {
    type Service = TrackRequests<S>;

    fn layer(&self, inner: S) -> TrackRequests<S> {
        TrackRequests { inner, activity: self.activity.clone(), bodies: self.bodies.clone() }
    }
}

/// See [`TrackRequestsLayer`].
#[derive(Clone)]
pub(crate) struct TrackRequests<S> {
    inner: S,
    activity: Arc<Activity>,
    bodies: Arc<dyn OpenBodies>,
}

/// A connection's request bodies: counted open in its [`Activity`], and
/// drained within `drain` when dropped before their end.
struct ConnectionBodies {
    activity: Arc<Activity>,
    drain: RefusalDrain,
}

impl OpenBodies for ConnectionBodies {
    fn body_started(&self) {
        self.activity.body_started();
    }

    fn body_ended(&self) {
        self.activity.body_ended();
    }

    fn dropped_early(self: Arc<Self>, rest: Incoming, http1: bool) {
        drain::start(rest, self.drain, self.activity.clone(), http1);
    }
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
        let http1 = req.version() < http::Version::HTTP_2;
        let awaits_continue =
            req.headers().get(EXPECT).is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
        let req = req.map(|body| ClientBody::new(body, &self.bodies, http1, awaits_continue));
        // The guard travels with the response body: a request counts until its
        // body is sent (or dropped), including one whose future is dropped early.
        let guard = Some(RequestInFlight(self.activity.clone()));
        TrackedFuture { inner: self.inner.call(req), guard }
    }
}

pin_project_lite::pin_project! {
    /// [`TrackRequests`]' response future: hands the request's guard to the body.
    pub(crate) struct TrackedFuture<F> {
        #[pin]
        inner: F,
        guard: Option<RequestInFlight>,
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
        if let Some(RequestInFlight(activity)) = &guard {
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
        _guard: Option<RequestInFlight>,
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

/// Whether fencegate itself refused the request for what its head is
/// ([`refuses_heads_with`]). The upstream's answers (forwarded, fenced or
/// not) never are, whatever their status: an upstream that rate-limits a
/// client with 429s is its business. The status first: most answers stop there.
fn refuses_the_head<B>(response: &http::Response<B>) -> bool {
    refuses_heads_with(response.status()) && response.extensions().get::<UpstreamAnswer>().is_none()
}

/// Counts one request in flight until dropped.
pub(crate) struct RequestInFlight(Arc<Activity>);

impl Drop for RequestInFlight {
    fn drop(&mut self) {
        self.0.request_finished();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::{decide, Decision, Outcome, ProxyBody};

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
