//! The tower layer: the route's `max_body` for every request, and fenced
//! bodies read whole (within the route's timeout) before the request goes on.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use http::Response;
use hyper::body::Body;
use tower::{Layer, Service};

use super::budget::{BudgetFull, BufferBudget, Held};
use super::reader::{ReadError, Reader};
use super::request::{declared_length, RequestBody};
use crate::error::{ProxyError, Rejection};
use crate::fence::Checked;
use crate::proxy::ProxyBody;
use crate::server::connection::ClientBody;

/// Applies the route's body limit and reads fenced bodies whole; see the
/// [module docs](super).
#[derive(Debug, Clone)]
pub struct BodyLayer {
    budget: Arc<BufferBudget>,
    connection: Arc<BufferBudget>,
}

impl BodyLayer {
    /// For one client connection: `budget` is the process's, and the
    /// connection may hold at most `connection_share` bytes of it.
    pub fn new(budget: Arc<BufferBudget>, connection_share: u64) -> Self {
        BodyLayer { budget, connection: BufferBudget::new(connection_share) }
    }
}

impl<S> Layer<S> for BodyLayer {
    type Service = Bodies<S>;

    fn layer(&self, inner: S) -> Bodies<S> {
        Bodies { inner, budgets: Arc::new((self.budget.clone(), self.connection.clone())) }
    }
}

/// See [`BodyLayer`].
#[derive(Debug, Clone)]
pub struct Bodies<S> {
    inner: S,
    /// The process's budget and the connection's share, behind one count of
    /// the connection's own: cloned for every request, it touches no count
    /// the other worker threads write.
    budgets: Arc<(Arc<BufferBudget>, Arc<BufferBudget>)>,
}

impl<S> Service<Checked<ClientBody>> for Bodies<S>
where
    S: Service<Checked<RequestBody>, Response = Response<ProxyBody>, Error = Rejection> + Clone,
{
    type Response = Response<ProxyBody>;
    type Error = Rejection;
    type Future = BodyFuture<S, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Rejection>> {
        self.inner.poll_ready(cx)
    }

    /// Applies the route's `max_body` to the request, reading a fenced body
    /// whole (see the [module docs](super)). A refusal names the fence key and
    /// token.
    fn call(&mut self, checked: Checked<ClientBody>) -> Self::Future {
        let (checked, body) = checked.take_body();
        let route = &checked.routed.route;
        let limit = route.max_body;
        let declared = declared_length(checked.routed.request.headers());
        if declared.is_some_and(|len| len > limit) {
            let rejection = checked.rejection(ProxyError::BodyTooLarge { limit, partly_sent: false });
            return BodyFuture::Refused { rejection: Some(rejection) };
        }
        if checked.fence.is_none() || route.stream_body || body.is_end_stream() {
            return BodyFuture::Passed {
                inner: self.inner.call(checked.with_body(RequestBody::streaming(body, limit))),
            };
        }
        // A declared length is taken from the budget up front: a client cannot
        // start more such bodies than the budget holds.
        let mut held = Held::new(&self.budgets.0, &self.budgets.1);
        if let Some(len) = declared {
            if let Err(e) = held.take(len) {
                return BodyFuture::Refused { rejection: Some(checked.rejection(e.into())) };
            }
        }
        // Bounded in time too (the route's timeout): a client that stalls
        // mid-body must not hold its connection and the bytes buffered so far
        // forever.
        let timeout = route.timeout;
        // The service driven to readiness goes with the request; a fresh
        // clone stays behind.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        BodyFuture::Reading {
            reading: Some(Reading { reader: Reader::new(body, limit, declared, held), checked, inner }),
            deadline: tokio::time::sleep(timeout),
            timeout,
        }
    }
}

/// A fenced request whose body is being read, and the service it goes to next.
#[derive(Debug)]
pub(crate) struct Reading<S> {
    reader: Reader,
    checked: Checked<()>,
    inner: S,
}

pin_project_lite::pin_project! {
    /// [`Bodies`]' response future: the refusal, the body read whole within
    /// the route's timeout, then the request passed on. Polled in place,
    /// inside the request's own future: no allocation.
    #[project = BodyFutureProj]
    pub(crate) enum BodyFuture<S, F> {
        Refused { rejection: Option<Rejection> },
        Reading { reading: Option<Reading<S>>, #[pin] deadline: tokio::time::Sleep, timeout: Duration },
        Passed { #[pin] inner: F },
    }
}

impl<S> Future for BodyFuture<S, S::Future>
where
    S: Service<Checked<RequestBody>, Response = Response<ProxyBody>, Error = Rejection>,
{
    type Output = Result<Response<ProxyBody>, Rejection>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let next = match self.as_mut().project() {
            BodyFutureProj::Refused { rejection } => {
                return Poll::Ready(Err(rejection.take().expect("the body's future polled after it was done")))
            }
            BodyFutureProj::Passed { inner } => return inner.poll(cx),
            BodyFutureProj::Reading { reading, deadline, timeout } => {
                let read = reading.as_mut().expect("the body's future polled after it was done").reader.poll_read(cx);
                let result = match read {
                    Poll::Ready(result) => result.map_err(ProxyError::from),
                    Poll::Pending => {
                        ready!(deadline.poll(cx));
                        Err(ProxyError::BodyTimeout(*timeout))
                    }
                };
                let Reading { reader, checked, mut inner } = reading.take().expect("taken only here");
                if let Err(e) = result {
                    return Poll::Ready(Err(checked.rejection(e)));
                }
                inner.call(checked.with_body(reader.into_body()))
            }
        };
        self.set(BodyFuture::Passed { inner: next });
        self.project_passed().poll(cx)
    }
}

impl From<BudgetFull> for ProxyError {
    fn from(full: BudgetFull) -> Self {
        match full {
            BudgetFull::Process(limit) => ProxyError::BufferFull(limit),
            BudgetFull::Connection(limit) => ProxyError::ConnectionBufferFull(limit),
        }
    }
}

impl From<ReadError> for ProxyError {
    fn from(e: ReadError) -> Self {
        match e {
            // Read before the turn: nothing of the body went upstream.
            ReadError::TooLarge { limit } => ProxyError::BodyTooLarge { limit, partly_sent: false },
            ReadError::BufferFull(full) => full.into(),
            ReadError::Client(e) => ProxyError::ClientBody(e),
        }
    }
}

impl<S, F> BodyFuture<S, F> {
    fn project_passed(self: Pin<&mut Self>) -> Pin<&mut F> {
        match self.project() {
            BodyFutureProj::Passed { inner } => inner,
            _ => unreachable!("set to Passed just before"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reader's and the budget's errors answer as the request path's
    /// own did: 413 with nothing sent, 503 for either budget.
    #[test]
    fn a_failed_read_is_refused_as_before() {
        let too_large = ProxyError::from(ReadError::TooLarge { limit: 5 });
        assert!(matches!(too_large, ProxyError::BodyTooLarge { limit: 5, partly_sent: false }));
        let full = ProxyError::from(ReadError::BufferFull(BudgetFull::Process(9)));
        assert!(matches!(full, ProxyError::BufferFull(9)));
        assert!(matches!(ProxyError::from(BudgetFull::Connection(7)), ProxyError::ConnectionBufferFull(7)));
    }
}
