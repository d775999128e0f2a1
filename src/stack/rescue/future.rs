//! [`Rescue`](super::Rescue)'s response future: the answer from below, a
//! refusal as its problem, or a panic while polling as a 500 problem.

use std::convert::Infallible;
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::task::{Context, Poll};

use http::header::HeaderValue;
use http::Response;

use super::panic_response;
use crate::http::ProxyBody;
use crate::stack::error::Rejection;

pin_project_lite::pin_project! {
    /// [`Rescue`]'s response future. (The rare answer to a panic in `call`
    /// is boxed: every layer above moves this future.)
    #[project = RescueProj]
    pub enum RescueFuture<F> {
        Running { #[pin] inner: F, request_id: Option<HeaderValue> },
        Panicked { response: Option<Box<Response<ProxyBody>>> },
    }
}

impl<F> Future for RescueFuture<F>
where
    F: Future<Output = Result<Response<ProxyBody>, Rejection>>,
{
    type Output = Result<Response<ProxyBody>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            // A future that panicked is not polled again: the 500 is its
            // answer, and dropping it runs what its drops run (a key's turn
            // passed on or held for its settle period).
            RescueProj::Running { inner, request_id } => match catch_unwind(AssertUnwindSafe(|| inner.poll(cx))) {
                Ok(poll) => poll.map(|result| Ok(result.unwrap_or_else(|r| r.into_response_for(request_id.as_ref())))),
                Err(panic) => Poll::Ready(Ok(panic_response(panic, request_id.as_ref()))),
            },
            RescueProj::Panicked { response } => {
                Poll::Ready(Ok(*response.take().expect("RescueFuture polled after it was done")))
            }
        }
    }
}
