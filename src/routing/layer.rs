//! The layer that puts [`Routing`] in a stack.

use std::sync::Arc;

use tower::Layer;

use super::Routing;
use crate::route::RouteTable;

/// Applies [`Routing`].
#[derive(Debug, Clone)]
pub struct RoutingLayer {
    routes: Arc<RouteTable>,
}

impl RoutingLayer {
    /// Routes by `routes`, shared with whatever else reads the table.
    pub fn new(routes: Arc<RouteTable>) -> Self {
        RoutingLayer { routes }
    }
}

impl<S> Layer<S> for RoutingLayer {
    type Service = Routing<S>;

    fn layer(&self, inner: S) -> Routing<S> {
        Routing::new(inner, self.routes.clone())
    }
}
