//! The routing service: routes each request, and tags every response and
//! refusal below it with the route.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower::util::Oneshot;
use tower::{Service, ServiceExt};

use super::{route_request, Routed};
use crate::error::Rejection;
use crate::outcome::Decision;
use crate::proxy::ProxyBody;
use crate::route::{RouteTable, RouteTag};

/// Canonicalizes a request's target and finds its route; see the [module docs](super).
/// Every response below, and every refusal, is tagged with the route.
#[derive(Debug, Clone)]
pub struct Routing<S> {
    inner: S,
    routes: Arc<RouteTable>,
}

impl<S> Routing<S> {
    pub(super) fn new(inner: S, routes: Arc<RouteTable>) -> Self {
        Routing { inner, routes }
    }
}

impl<S, B> Service<Request<B>> for Routing<S>
where
    S: Service<Routed<B>, Response = Response<ProxyBody>, Error = Rejection> + Clone + Send + 'static,
    S::Future: Send,
    B: Send + 'static,
{
    type Response = Response<ProxyBody>;
    type Error = Rejection;
    // Boxed: inlined, it makes the future of every request (an HTTP/2
    // stream's task) larger, and after an HTTP/2 flood more of the memory
    // stayed with the allocator: +6-10.5 MiB instead of +4-7 MiB in
    // tests/bounds/memory.rs, past its 8 MiB bound in 3 runs of 7.
    type Future = Pin<Box<RoutingFuture<Oneshot<S, Routed<B>>>>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Rejection>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        match route_request(&self.routes, request) {
            Ok((routed, tag)) => {
                Box::pin(RoutingFuture::Routed { inner: self.inner.clone().oneshot(routed), tag: Some(tag) })
            }
            Err((error, tag)) => {
                let mut rejection = Rejection::from(error);
                rejection.route = tag;
                Box::pin(RoutingFuture::Refused { rejection: Some(rejection) })
            }
        }
    }
}

pin_project_lite::pin_project! {
    /// [`Routing`]'s response future: the routed request's, tagged with its
    /// route when it ends, or the refusal of one that found none.
    #[project = RoutingProj]
    pub enum RoutingFuture<F> {
        Routed { #[pin] inner: F, tag: Option<RouteTag> },
        Refused { rejection: Option<Rejection> },
    }
}

impl<F> Future for RoutingFuture<F>
where
    F: Future<Output = Result<Response<ProxyBody>, Rejection>>,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        match self.project() {
            RoutingProj::Routed { inner, tag } => {
                let result = std::task::ready!(inner.poll(cx));
                let tag = tag.take().expect("RoutingFuture polled after it was done");
                Poll::Ready(match result {
                    Ok(mut response) => {
                        // Into the decision when there is one: one extension.
                        match response.extensions_mut().get_mut::<Decision>() {
                            Some(decision) => decision.route = Some(tag),
                            None => {
                                response.extensions_mut().insert(tag);
                            }
                        }
                        Ok(response)
                    }
                    Err(mut rejection) => {
                        rejection.route = Some(tag);
                        Err(rejection)
                    }
                })
            }
            RoutingProj::Refused { rejection } => {
                Poll::Ready(Err(rejection.take().expect("RoutingFuture polled after it was done")))
            }
        }
    }
}
