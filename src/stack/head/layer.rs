//! The layer that puts [`HeadChecks`] in a stack, with the store every
//! connection shares.

use std::sync::Arc;

use tower::Layer;

use super::service::HeadChecks;

/// Applies [`HeadChecks`]; see the module docs.
#[derive(Debug)]
pub(crate) struct HeadChecksLayer<St> {
    store: Arc<St>,
}

impl<St> HeadChecksLayer<St> {
    pub fn new(store: Arc<St>) -> Self {
        HeadChecksLayer { store }
    }
}

impl<St> Clone for HeadChecksLayer<St> {
    fn clone(&self) -> Self {
        HeadChecksLayer { store: self.store.clone() }
    }
}

impl<S, St> Layer<S> for HeadChecksLayer<St> {
    type Service = HeadChecks<S, St>;

    fn layer(&self, inner: S) -> Self::Service {
        HeadChecks::new(inner, self.store.clone())
    }
}
