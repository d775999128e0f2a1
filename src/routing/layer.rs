//! The layer that puts [`Routing`] in a stack.

use std::sync::Arc;

use tower::Layer;

use super::Routing;
use crate::route::LiveRoutes;

/// Applies [`Routing`].
#[derive(Debug, Clone)]
pub struct RoutingLayer {
    routes: Arc<LiveRoutes>,
}

impl RoutingLayer {
    /// Routes each request by the table `routes` holds when it arrives.
    pub fn new(routes: Arc<LiveRoutes>) -> Self {
        RoutingLayer { routes }
    }
}

impl<S> Layer<S> for RoutingLayer {
    type Service = Routing<S>;

    fn layer(&self, inner: S) -> Routing<S> {
        Routing::new(inner, self.routes.clone())
    }
}
