//! The layer that puts [`HeaderCount`] in a stack.

use tower::Layer;

use super::HeaderCount;

/// Refuses a request with more than `max` header fields (431); see the
/// [module docs](super).
#[derive(Debug, Clone, Copy)]
pub struct HeaderCountLayer {
    pub max: usize,
}

impl<S> Layer<S> for HeaderCountLayer {
    type Service = HeaderCount<S>;

    fn layer(&self, inner: S) -> HeaderCount<S> {
        HeaderCount::new(inner, self.max)
    }
}
