//! The layer that puts [`Routing`] in a stack.

use std::sync::Arc;

use tower::Layer;

use super::Routing;
use crate::route::LiveRoutes;

/// Applies [`Routing`].
#[derive(Debug, Clone)]
pub struct RoutingLayer {
    routes: Arc<LiveRoutes>,
    over_tls: bool,
}

impl RoutingLayer {
    /// Routes each request by the table `routes` holds when it arrives, for
    /// a connection that speaks TLS (`over_tls`) or not.
    pub fn new(routes: Arc<LiveRoutes>, over_tls: bool) -> Self {
        RoutingLayer { routes, over_tls }
    }
}

impl<S> Layer<S> for RoutingLayer {
    type Service = Routing<S>;

    fn layer(&self, inner: S) -> Routing<S> {
        Routing::new(inner, self.routes.clone(), self.over_tls)
    }
}
