//! [`Rescue`](super::Rescue)'s response future: the answer from below, or a
//! panic while polling as an internal error's refusal.

use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::task::{Context, Poll};

use http::Response;

use super::panic_rejection;
use crate::http::ProxyBody;
use crate::stack::error::Rejection;

pin_project_lite::pin_project! {
    /// [`Rescue`]'s response future. (The rare refusal of a panic in `call`
    /// is boxed: every layer above moves this future.)
    #[project = RescueProj]
    pub enum RescueFuture<F> {
        Running { #[pin] inner: F },
        Panicked { rejection: Option<Box<Rejection>> },
    }
}

impl<F> Future for RescueFuture<F>
where
    F: Future<Output = Result<Response<ProxyBody>, Rejection>>,
{
    type Output = Result<Response<ProxyBody>, Rejection>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            // A future that panicked is not polled again: the 500 is its
            // answer, and dropping it runs what its drops run (a key's turn
            // passed on or held for its settle period).
            RescueProj::Running { inner } => match catch_unwind(AssertUnwindSafe(|| inner.poll(cx))) {
                Ok(poll) => poll,
                Err(panic) => Poll::Ready(Err(panic_rejection(panic))),
            },
            RescueProj::Panicked { rejection } => {
                Poll::Ready(Err(*rejection.take().expect("RescueFuture polled after it was done")))
            }
        }
    }
}
