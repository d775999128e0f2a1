//! The layer that puts [`Rescue`] in a stack.

use tower::Layer;

use super::Rescue;

/// Turns a panic in the layers below (in their `call` or their future) into
/// a [`Rejection`](crate::stack::error::Rejection) for an internal error,
/// which the access log answers with a 500 problem.
/// (Caught here rather than by tower-http's catch-panic layer, which boxes
/// every response body to give its own answer a type.)
#[derive(Debug, Clone, Copy)]
pub struct RescueLayer;

impl<S> Layer<S> for RescueLayer {
    type Service = Rescue<S>;

    fn layer(&self, inner: S) -> Rescue<S> {
        Rescue::new(inner)
    }
}
