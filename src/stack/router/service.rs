//! The routing service: routes each request, and tags every response and
//! refusal below it with the route.

use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower::Service;

use super::future::Tagged;
use super::{route_request, Routed};
use crate::http::ProxyBody;
use crate::route::LiveRoutes;
use crate::stack::error::RefusedOr;
use crate::stack::error::Rejection;

/// Canonicalizes a request's target and finds its route; see the [module docs](super).
/// Every response below, and every refusal, is tagged with the route.
#[derive(Debug, Clone)]
pub struct Routing<S> {
    inner: S,
    routes: Arc<LiveRoutes>,
    /// The connection speaks TLS: a target without a scheme is `https`.
    over_tls: bool,
}

impl<S> Routing<S> {
    pub(super) fn new(inner: S, routes: Arc<LiveRoutes>, over_tls: bool) -> Self {
        Routing { inner, routes, over_tls }
    }
}

impl<S, B> Service<Request<B>> for Routing<S>
where
    S: Service<Routed<B>, Response = Response<ProxyBody>, Error = Rejection>,
{
    type Response = Response<ProxyBody>;
    type Error = Rejection;
    type Future = RefusedOr<Tagged<S::Future>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Rejection>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        match route_request(&self.routes.load(), request, self.over_tls) {
            Ok((routed, tag)) => RefusedOr::Passed { inner: Tagged::new(self.inner.call(routed), tag) },
            Err((error, tag)) => {
                let mut rejection = Rejection::from(error);
                rejection.route = tag;
                RefusedOr::refused(rejection)
            }
        }
    }
}
