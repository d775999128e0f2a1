//! The response future of a layer that refuses some requests itself and
//! passes the rest on.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use http::Response;
use tokio::time::Sleep;

use super::ProxyBody;

/// A boxed response future, for the rare request that must wait before it is
/// passed on.
pub type Boxed<E> = Pin<Box<dyn Future<Output = Result<Response<ProxyBody>, E>> + Send>>;

pin_project_lite::pin_project! {
    /// The response future of a layer that either refuses a request or passes
    /// it on: polled in place, no allocation (but for a refusal held back a
    /// while, or a request that must wait on a boxed future before it is
    /// passed on).
    #[project = RefusedOrProj]
    pub enum RefusedOr<F, E> {
        Refused { rejection: Option<E>, after: Option<Pin<Box<Sleep>>> },
        Passed { #[pin] inner: F },
        Boxed { inner: Boxed<E> },
    }
}

impl<F, E> Future for RefusedOr<F, E>
where
    F: Future<Output = Result<Response<ProxyBody>, E>>,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        match self.project() {
            RefusedOrProj::Refused { rejection, after } => {
                if let Some(after) = after {
                    ready!(after.as_mut().poll(cx));
                }
                Poll::Ready(Err(rejection.take().expect("RefusedOr polled after it was done")))
            }
            RefusedOrProj::Passed { inner } => inner.poll(cx),
            RefusedOrProj::Boxed { inner } => inner.as_mut().poll(cx),
        }
    }
}

impl<F, E> RefusedOr<F, E> {
    pub fn refused(rejection: impl Into<E>) -> Self {
        RefusedOr::Refused { rejection: Some(rejection.into()), after: None }
    }

    /// Refused once `wait` has passed.
    pub fn refused_after(error: impl Into<E>, wait: Duration) -> Self {
        RefusedOr::Refused { rejection: Some(error.into()), after: Some(Box::pin(tokio::time::sleep(wait))) }
    }
}
