//! [`Routing`](super::Routing)'s response future.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use http::Response;

use crate::error::Rejection;
use crate::proxy::ProxyBody;
use crate::route::RouteTag;

pin_project_lite::pin_project! {
    /// Resolves to the response or refusal from below, tagged with the
    /// request's route; or to the refusal routing made itself. Polled in
    /// place, inside the request's own future: no allocation.
    #[project = ResponseFutureProj]
    pub enum ResponseFuture<F> {
        Refused { rejection: Option<Rejection> },
        Routed { #[pin] inner: F, tag: Option<RouteTag> },
    }
}

impl<F> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Response<ProxyBody>, Rejection>>,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        match self.project() {
            ResponseFutureProj::Refused { rejection } => {
                Poll::Ready(Err(rejection.take().expect("routing's future polled after it was done")))
            }
            ResponseFutureProj::Routed { inner, tag } => {
                let result = ready!(inner.poll(cx));
                let tag = tag.take().expect("routing's future polled after it was done");
                Poll::Ready(match result {
                    Ok(mut response) => {
                        // Every response from below carries its decision (the
                        // fence inserts one for each request it lets through):
                        // the route rides in it, for the access log.
                        if let Some(decision) = response.body_mut().decision_mut() {
                            decision.route = Some(tag);
                        }
                        Ok(response)
                    }
                    Err(mut rejection) => {
                        rejection.route = Some(tag);
                        Err(rejection)
                    }
                })
            }
        }
    }
}
