//! The proxy's tower stack as hyper calls it.
//!
//! hyper-util's `TowerToHyperService` wraps each call in a `Oneshot`, which
//! holds the request until its first poll asks the service whether it is
//! ready and only then hands the request on: every request is moved twice
//! more, and its future carries the request and a clone of the stack beside
//! each other. The stack is always ready (none of its layers waits for
//! capacity: bounds refuse instead), so [`Calls`] asks once, at the call,
//! and hands the request straight on; a stack that is not ready then falls
//! back to the `Oneshot`'s way.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use tower::util::Oneshot;
use tower::{Service, ServiceExt};

/// A tower service `S` served by hyper: each request is called on a clone.
#[derive(Debug, Clone)]
pub(crate) struct Calls<S>(S);

impl<S> Calls<S> {
    pub(crate) fn new(service: S) -> Self {
        Calls(service)
    }
}

impl<S, R> hyper::service::Service<R> for Calls<S>
where
    S: Service<R> + Clone,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = CallFuture<S, R>;

    fn call(&self, request: R) -> CallFuture<S, R> {
        let mut service = self.0.clone();
        // No task waits on this readiness: a service not ready at once is
        // polled again, with the request's task's waker, by the `Oneshot`.
        let mut cx = Context::from_waker(Waker::noop());
        match service.poll_ready(&mut cx) {
            Poll::Ready(Ok(())) => CallFuture::Called { future: service.call(request) },
            _ => CallFuture::Waiting { oneshot: service.oneshot(request) },
        }
    }
}

pin_project_lite::pin_project! {
    /// The call's future, or the `Oneshot` of a service that was not ready.
    #[project = CallProj]
    pub(crate) enum CallFuture<S: Service<R>, R> {
        Called { #[pin] future: S::Future },
        Waiting { #[pin] oneshot: Oneshot<S, R> },
    }
}

impl<S: Service<R>, R> Future for CallFuture<S, R> {
    type Output = Result<S::Response, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            CallProj::Called { future } => future.poll(cx),
            CallProj::Waiting { oneshot } => oneshot.poll(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    use hyper::service::Service as _;

    use super::*;

    /// A service ready only from its second poll on, so the first call waits.
    #[derive(Clone)]
    struct Slow(Arc<AtomicBool>);

    impl Service<u32> for Slow {
        type Response = u32;
        type Error = std::convert::Infallible;
        type Future = std::future::Ready<Result<u32, Self::Error>>;

        fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            if self.0.swap(true, Ordering::SeqCst) {
                return Poll::Ready(Ok(()));
            }
            cx.waker().wake_by_ref();
            Poll::Pending
        }

        fn call(&mut self, request: u32) -> Self::Future {
            assert!(self.0.load(Ordering::SeqCst), "called before it was ready");
            std::future::ready(Ok(request + 1))
        }
    }

    #[tokio::test]
    async fn a_ready_service_is_called_at_once_and_one_not_ready_waits_for_it() {
        let calls = Calls::new(Slow(Arc::new(AtomicBool::new(false))));
        let waiting = calls.call(1);
        assert!(matches!(waiting, CallFuture::Waiting { .. }));
        assert_eq!(waiting.await.unwrap(), 2);
        let called = calls.call(2);
        assert!(matches!(called, CallFuture::Called { .. }));
        assert_eq!(called.await.unwrap(), 3);
    }
}
