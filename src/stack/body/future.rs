//! [`BodyFuture`]: a refusal, a fenced body read whole within the route's
//! timeout, then the request passed on.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use http::Response;
use tower::Service;

use crate::http::{ProxyBody, Reader, RequestBody};
use crate::stack::error::{ProxyError, Rejection};
use crate::stack::head::Checked;

/// A fenced request whose body is being read, and the service it goes to next.
#[derive(Debug)]
pub(crate) struct Reading<S> {
    pub(super) reader: Reader,
    pub(super) checked: Checked<()>,
    pub(super) inner: S,
}

pin_project_lite::pin_project! {
    /// [`Bodies`]' response future: the refusal, the body read whole within
    /// the route's timeout, then the request passed on. Polled in place,
    /// inside the request's own future: no allocation.
    #[project = BodyFutureProj]
    pub(crate) enum BodyFuture<S, F> {
        Refused { rejection: Option<Rejection> },
        // The deadline is set at the read's first wait: most fenced bodies
        // came with their head and are read whole at the first poll, right
        // after the call, so they never read the clock or make a timer for it.
        Reading { reading: Option<Reading<S>>, #[pin] deadline: Option<tokio::time::Sleep>, timeout: Duration },
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
            BodyFutureProj::Reading { reading, mut deadline, timeout } => {
                let read = reading.as_mut().expect("the body's future polled after it was done").reader.poll_read(cx);
                let result = match read {
                    Poll::Ready(result) => result.map_err(ProxyError::from),
                    Poll::Pending => {
                        if deadline.is_none() {
                            deadline.set(Some(tokio::time::sleep(*timeout)));
                        }
                        ready!(deadline.as_mut().as_pin_mut().expect("set just above").poll(cx));
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

impl<S, F> BodyFuture<S, F> {
    fn project_passed(self: Pin<&mut Self>) -> Pin<&mut F> {
        match self.project() {
            BodyFutureProj::Passed { inner } => inner,
            _ => unreachable!("set to Passed just before"),
        }
    }
}
