//! The header-rate service: spends each head's bytes from the connection's
//! bucket, refuses when it does not hold them.

use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use http::{Request, Response};
use tower::Service;

use super::bucket::Bucket;
use crate::http::ProxyBody;
use crate::stack::error::RefusedOr;
use crate::stack::error::{ProxyError, Rejection};
use crate::stack::router::Routed;

/// See [`HeaderRateLayer`](super::HeaderRateLayer).
#[derive(Debug, Clone)]
pub struct HeaderRate<S> {
    inner: S,
    bucket: Arc<Mutex<Bucket>>,
}

impl<S> HeaderRate<S> {
    pub(super) fn new(inner: S, bucket: Arc<Mutex<Bucket>>) -> Self {
        HeaderRate { inner, bucket }
    }
}

impl<S, B> Service<Routed<B>> for HeaderRate<S>
where
    S: Service<Routed<B>, Response = Response<ProxyBody>, Error = Rejection>,
{
    type Response = Response<ProxyBody>;
    type Error = Rejection;
    type Future = RefusedOr<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Rejection>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, routed: Routed<B>) -> Self::Future {
        let cost = head_bytes(&routed.request);
        // A poisoned lock still holds a usable bucket: a panic elsewhere must
        // not open the limit or refuse every request.
        let mut bucket = self.bucket.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(wait) = bucket.spend(cost) {
            // Answered when the bucket would have held the head: a client
            // sending past the rate is slowed to it (one refused head at a
            // time on HTTP/1.1, `max_concurrent_streams` over HTTP/2), so
            // the heads fencegate reads and refuses are bounded too, not only
            // the ones it forwards. The head itself is dropped now.
            return RefusedOr::refused_after(ProxyError::HeaderRate(bucket.rate), wait);
        }
        drop(bucket);
        RefusedOr::Passed { inner: self.inner.call(routed) }
    }
}

/// About what the request's head takes on the wire to the upstream as
/// HTTP/1.1: the request line, and each field as `name: value\r\n`.
fn head_bytes<B>(request: &Request<B>) -> u64 {
    let target = request.uri().path_and_query().map_or(1, |pq| pq.as_str().len());
    let line = request.method().as_str().len() + 1 + target + " HTTP/1.1\r\n".len();
    let fields: usize = request.headers().iter().map(|(name, value)| name.as_str().len() + value.len() + 4).sum();
    (line + fields + 2) as u64
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::Instant;
    use tower::{Layer, ServiceExt};

    use super::*;
    use crate::stack::header_rate::HeaderRateLayer;

    #[test]
    fn a_head_costs_its_request_line_and_fields() {
        let request = Request::put("/objects/a?x=1").header("x-fencing-token", "7").body(()).unwrap();
        // "PUT /objects/a?x=1 HTTP/1.1\r\n" + "x-fencing-token: 7\r\n" + "\r\n"
        assert_eq!(head_bytes(&request), 29 + 20 + 2);
    }

    /// A head past the rate is refused only once the bucket would have held
    /// it, and nothing of it reaches the layers below.
    #[tokio::test(start_paused = true)]
    async fn a_head_past_the_rate_is_refused_when_the_bucket_would_hold_it() {
        let below =
            tower::service_fn(|_: Routed<()>| async { Ok::<_, Rejection>(Response::new(ProxyBody::default())) });
        let routed = || {
            let request = Request::put("/objects/a").header("x-fencing-token", "7").body(()).unwrap();
            let route = Arc::new(crate::route::test_route("objects", "/objects/"));
            Routed { route, request, fenced: true, destination: None, slot_taken: None }
        };
        let cost = head_bytes(&routed().request);
        // One head a second, and a bucket that starts empty.
        let layer = HeaderRateLayer::new(cost, 0);
        let started = Instant::now();
        let refused = layer.layer(below).oneshot(routed()).await.unwrap_err();
        assert!(matches!(refused.error, ProxyError::HeaderRate(rate) if rate == cost));
        assert_eq!(started.elapsed(), Duration::from_secs(1));
        // The bucket filled while the refusal waited: the next head passes at once.
        let started = Instant::now();
        assert!(layer.layer(below).oneshot(routed()).await.is_ok());
        assert_eq!(started.elapsed(), Duration::ZERO);
    }
}
