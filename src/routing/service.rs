//! The routing service: routes each request, and tags every response and
//! refusal below it with the route.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower::{Service, ServiceExt};

use super::{route_request, Routed};
use crate::error::Rejection;
use crate::proxy::ProxyBody;
use crate::route::RouteTable;

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
    // Boxed, not a named future inlined into every request's: inlined, the
    // future of each request (an HTTP/2 stream's task) grew, and after an
    // HTTP/2 flood more of the memory stayed with the allocator: +6-10.5 MiB
    // instead of +4-7 MiB in tests/bounds/memory.rs, past its 8 MiB bound in
    // 3 runs of 7.
    type Future = Pin<Box<dyn Future<Output = Result<Response<ProxyBody>, Rejection>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Rejection>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let (routed, tag) = match route_request(&self.routes, request) {
            Ok(routed) => routed,
            Err((error, tag)) => {
                let mut rejection = Rejection::from(error);
                rejection.route = tag;
                return Box::pin(std::future::ready(Err(rejection)));
            }
        };
        let inner = self.inner.clone();
        Box::pin(async move {
            match inner.oneshot(routed).await {
                Ok(mut response) => {
                    // Every response from below carries its decision (the
                    // fence inserts one for each request it lets through):
                    // the route rides in it, one extension for the access log.
                    if let Some(decision) = response.body_mut().decision_mut() {
                        decision.route = Some(tag);
                    }
                    Ok(response)
                }
                Err(mut rejection) => {
                    rejection.route = Some(tag);
                    Err(rejection)
                }
            }
        })
    }
}
