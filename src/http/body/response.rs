//! The response body every layer returns, and the decision it carries up to
//! the access log.

use std::any::Any;
use std::error::Error;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::{Either, Full};

use crate::http::{Decision, Outcome};

/// Any error, boxed: what hyper's bodies and services hand back.
pub type BoxError = Box<dyn Error + Send + Sync>;

/// Something a response body keeps alive until it is dropped (an upstream
/// HTTP/2 stream counted in use): shared, so handing it over allocates nothing.
pub type Guard = Arc<dyn Any + Send + Sync>;

pin_project_lite::pin_project! {
    /// The body of every response fencegate sends: streamed from the upstream,
    /// or made here in one piece (a problem document). It carries the
    /// request's [`Decision`] up to the access log: in the body, not in the
    /// response's extensions, which cost three allocations a response.
    #[derive(Debug)]
    pub struct ProxyBody {
        #[pin]
        inner: Either<hyper::body::Incoming, Full<Bytes>>,
        decision: Option<Decision>,
        // What must live as long as the body: the upstream HTTP/2 stream it
        // comes on, counted in use until the body is dropped.
        guard: Option<Guard>,
    }
}

impl ProxyBody {
    /// A body streamed from the upstream.
    pub fn upstream(body: hyper::body::Incoming) -> Self {
        ProxyBody { inner: Either::Left(body), decision: None, guard: None }
    }

    /// A body made here.
    pub fn full(body: Full<Bytes>) -> Self {
        ProxyBody { inner: Either::Right(body), decision: None, guard: None }
    }

    /// This body, keeping `guard` until it is dropped.
    pub fn holding(self, guard: Option<Guard>) -> Self {
        ProxyBody { guard, ..self }
    }

    /// Whether the body is the upstream's, not one made here.
    pub fn is_upstream(&self) -> bool {
        matches!(self.inner, Either::Left(_))
    }

    /// The decision the layers below recorded, if any.
    pub fn decision(&self) -> Option<&Decision> {
        self.decision.as_ref()
    }

    pub fn decision_mut(&mut self) -> Option<&mut Decision> {
        self.decision.as_mut()
    }
}

impl Default for ProxyBody {
    fn default() -> Self {
        ProxyBody::full(Full::default())
    }
}

impl hyper::body::Body for ProxyBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, BoxError>>> {
        self.project().inner.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// The statuses fencegate refuses a request's head with (400: malformed, a
/// bad token or key; 429: over the header rate; 431: too many or too large
/// fields). A connection's count of refused heads counts only fencegate's.
pub fn refuses_heads_with(status: StatusCode) -> bool {
    matches!(status.as_u16(), 400 | 429 | 431)
}

/// Records `decision` in `response`. An upstream's answer whose status is
/// one fencegate refuses heads with ([`refuses_heads_with`]) is marked
/// [`UpstreamAnswer`] too, so the count of refused heads can tell them apart.
pub fn decide(response: &mut Response<ProxyBody>, decision: Decision) {
    if refuses_heads_with(response.status()) && matches!(decision.outcome, Outcome::Forwarded | Outcome::Unfenced) {
        response.extensions_mut().insert(UpstreamAnswer);
    }
    response.body_mut().decision = Some(decision);
}

/// Marks the upstream's answers whose status is one fencegate refuses heads
/// with (see [`decide`]).
#[derive(Debug, Clone, Copy)]
pub struct UpstreamAnswer;
