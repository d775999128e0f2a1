//! [`Routing`](super::Routing)'s response future: the refusal routing made
//! itself ([`RefusedOr`](crate::stack::error::RefusedOr)), or the answer from
//! below tagged with the route ([`Tagged`]).

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use http::Response;

use crate::http::ProxyBody;
use crate::http::RouteTag;
use crate::stack::error::Rejection;

pin_project_lite::pin_project! {
    /// Resolves to the response or refusal from below, tagged with the
    /// request's route. Polled in place, inside the request's own future.
    pub struct Tagged<F> {
        #[pin]
        inner: F,
        tag: Option<RouteTag>,
    }
}

impl<F> Tagged<F> {
    pub(super) fn new(inner: F, tag: RouteTag) -> Self {
        Tagged { inner, tag: Some(tag) }
    }
}

impl<F> Future for Tagged<F>
where
    F: Future<Output = Result<Response<ProxyBody>, Rejection>>,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let result = ready!(this.inner.poll(cx));
        let tag = this.tag.take().expect("routing's future polled after it was done");
        Poll::Ready(match result {
            Ok(mut response) => {
                // Every response from below carries its decision (the fence
                // inserts one for each request it lets through): the route
                // rides in it, for the access log.
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
