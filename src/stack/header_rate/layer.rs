//! The layer that puts [`HeaderRate`] in a stack, with its connection's bucket.

use std::sync::{Arc, Mutex};

use tower::Layer;

use super::bucket::Bucket;
use super::HeaderRate;

/// Bounds the bytes of request heads one connection sends upstream per
/// second (429 past it); see the [module docs](super). One layer, one bucket:
/// the stack is built per connection, so the bucket starts filling when the
/// connection is accepted.
#[derive(Debug, Clone)]
pub struct HeaderRateLayer {
    bucket: Arc<Mutex<Bucket>>,
}

impl HeaderRateLayer {
    /// A bucket of `rate` bytes a second for one connection, starting with
    /// `start` bytes (one largest head) rather than a full second: reconnecting
    /// must not buy a fresh burst.
    pub fn new(rate: u64, start: u64) -> Self {
        HeaderRateLayer { bucket: Arc::new(Mutex::new(Bucket::new(rate, start))) }
    }
}

impl<S> Layer<S> for HeaderRateLayer {
    type Service = HeaderRate<S>;

    fn layer(&self, inner: S) -> HeaderRate<S> {
        HeaderRate::new(inner, self.bucket.clone())
    }
}
