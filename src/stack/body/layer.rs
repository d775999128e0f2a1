//! [`BodyLayer`]: one per client connection, with its share of the budget.

use std::sync::Arc;

use tower::Layer;

use super::service::Bodies;
use crate::http::BufferBudget;

/// Applies the route's body limit and reads fenced bodies whole; see the
/// [module docs](super).
#[derive(Debug, Clone)]
pub struct BodyLayer {
    budget: Arc<BufferBudget>,
    connection: Arc<BufferBudget>,
}

impl BodyLayer {
    /// For one client connection: `budget` is the process's, and the
    /// connection may hold at most `connection_share` bytes of it.
    pub fn new(budget: Arc<BufferBudget>, connection_share: u64) -> Self {
        BodyLayer { budget, connection: BufferBudget::new(connection_share) }
    }
}

impl<S> Layer<S> for BodyLayer {
    type Service = Bodies<S>;

    fn layer(&self, inner: S) -> Bodies<S> {
        Bodies { inner, budgets: Arc::new((self.budget.clone(), self.connection.clone())) }
    }
}
