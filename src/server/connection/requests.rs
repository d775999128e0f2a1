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
use crate::proxy::{refuses_heads_with, UpstreamAnswer};

/// Counts a connection's requests in flight for its [`Activity`], and drains
/// the bodies dropped before their end within `drain`.
#[derive(Clone)]
pub(crate) struct TrackRequestsLayer {
    activity: Arc<Activity>,
    drain: RefusalDrain,
}

impl TrackRequestsLayer {
    pub(crate) fn new(activity: Arc<Activity>, drain: RefusalDrain) -> TrackRequestsLayer {
        TrackRequestsLayer { activity, drain }
    }
}

impl<S> Layer<S> for TrackRequestsLayer {
    type Service = TrackRequests<S>;

    fn layer(&self, inner: S) -> TrackRequests<S> {
        TrackRequests { inner, activity: self.activity.clone(), drain: self.drain }
    }
}

/// See [`TrackRequestsLayer`].
#[derive(Clone)]
pub(crate) struct TrackRequests<S> {
    inner: S,
    activity: Arc<Activity>,
    drain: RefusalDrain,
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
        let drain = Drain {
            bounds: self.drain,
            http1: req.version() < http::Version::HTTP_2,
            awaits_continue: req
                .headers()
                .get(EXPECT)
                .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue")),
        };
        let req = req.map(|body| ClientBody::new(body, &self.activity, drain));
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

/// A request body as hyper hands it over, counted in its connection's
/// [`Activity`] until it is read to its end. Dropped before that, it is
/// drained (drain.rs).
pub struct ClientBody {
    /// `None` only once dropped.
    inner: Option<Incoming>,
    open: Option<Arc<Activity>>,
    drain: Drain,
}

/// What a [`ClientBody`] dropped before its end needs to know to drain.
#[derive(Debug, Clone, Copy)]
struct Drain {
    bounds: RefusalDrain,
    http1: bool,
    /// The client asked for `100 Continue` and nothing has polled the body
    /// yet: hyper has not sent it, so the client holds the body back, and a
    /// drain would send it (hyper does on the first poll of the body),
    /// inviting a body nobody wants. Dropped now, hyper reads what was sent
    /// anyway and closes the connection after the answer.
    awaits_continue: bool,
}

impl ClientBody {
    fn new(inner: Incoming, activity: &Arc<Activity>, drain: Drain) -> ClientBody {
        let open = (!inner.is_end_stream()).then(|| {
            activity.body_started();
            activity.clone()
        });
        ClientBody { inner: Some(inner), open, drain }
    }

    fn inner(&self) -> &Incoming {
        self.inner.as_ref().expect("a body's Incoming is taken only when it is dropped")
    }
}

impl Drop for ClientBody {
    /// A body dropped before its end is drained, unless its client still
    /// waits for `100 Continue`: see [`Drain::awaits_continue`].
    fn drop(&mut self) {
        let (Some(activity), Some(inner)) = (self.open.take(), self.inner.take()) else { return };
        if !self.drain.awaits_continue {
            drain::start(inner, self.drain.bounds, activity, self.drain.http1);
        }
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
        let this = self.get_mut();
        // Polled: hyper sends `100 Continue` now if it was asked for.
        this.drain.awaits_continue = false;
        let inner = this.inner.as_mut().expect("a body's Incoming is taken only when it is dropped");
        let frame = std::task::ready!(Pin::new(&mut *inner).poll_frame(cx));
        // The end: no more frames, or (with a declared length) the last byte
        // of it. hyper has left the body behind by then: it marks its reading
        // done before it hands over the last chunk. A reader that stops at
        // the declared length (hyper's client does) never asks again.
        if frame.is_none() || inner.is_end_stream() {
            if let Some(activity) = this.open.take() {
                activity.body_ended();
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner().is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner().size_hint()
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
