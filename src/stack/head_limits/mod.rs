//! Per client connection, what request heads may cost: how many header
//! fields one head may carry (431 `too-many-headers`), and how many bytes of
//! heads one connection may have fencegate send upstream per second (429
//! `header-rate`).
//!
//! Both answer an HTTP/2 amplification: HPACK lets a few bytes on the wire
//! name a large header field again and again, so a small HEADERS frame can
//! decode into a head of `max_header_bytes`, and a connection sending a few
//! MiB can make fencegate write GiB to the upstream. HTTP/1.1 heads are
//! counted by hyper's parser (`max_headers`); HTTP/2 heads arrive decoded, so
//! [`HeaderCount`] counts them before anything else acts on the request. The
//! rate is a token bucket per connection holding at most one second of bytes,
//! checked after routing and before the head checks, so a refused request
//! never reads or raises a mark and nothing of it is forwarded.
//!
//! A new connection's bucket starts with one head's worth (`max_header_bytes`,
//! so its first request always fits), not with the second of burst: the burst
//! accrues at the rate while the connection lives. A client that reconnects
//! whenever it is refused gets that one head per handshake, plus the rate
//! for as long as each connection lasts, never a fresh second of burst.

use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use tokio::time::Instant;
use tower::{Layer, Service};

use crate::http::ProxyBody;
use crate::stack::error::RefusedOr;
use crate::stack::error::{ProxyError, Rejection};
use crate::stack::router::Routed;

/// Refuses a request with more than `max` header fields (431); see the
/// [module docs](self).
#[derive(Debug, Clone, Copy)]
pub struct HeaderCountLayer {
    pub max: usize,
}

impl<S> Layer<S> for HeaderCountLayer {
    type Service = HeaderCount<S>;

    fn layer(&self, inner: S) -> HeaderCount<S> {
        HeaderCount { inner, max: self.max }
    }
}

/// See [`HeaderCountLayer`].
#[derive(Debug, Clone)]
pub struct HeaderCount<S> {
    inner: S,
    max: usize,
}

impl<S, B> Service<Request<B>> for HeaderCount<S>
where
    S: Service<Request<B>, Response = Response<ProxyBody>, Error = Rejection>,
    S::Future: Send + 'static,
{
    type Response = Response<ProxyBody>;
    type Error = Rejection;
    type Future = RefusedOr<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Rejection>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // `len` counts every field line, a repeated name once per value, as
        // hyper's HTTP/1.1 parser does; pseudo-headers are not in the map.
        let count = request.headers().len();
        if count > self.max {
            return RefusedOr::refused(ProxyError::TooManyHeaders { count, max: self.max });
        }
        RefusedOr::Passed { inner: self.inner.call(request) }
    }
}

/// A token bucket of head bytes: `rate` a second, at most one second's worth
/// saved up.
#[derive(Debug)]
struct Bucket {
    rate: u64,
    tokens: f64,
    at: Instant,
}

impl Bucket {
    /// A bucket holding `start` bytes (at most `rate`), filling from now.
    fn new(rate: u64, start: u64) -> Self {
        Bucket { rate, tokens: start.min(rate) as f64, at: Instant::now() }
    }

    /// Spends `bytes` if the bucket holds them; if not, says how long until
    /// it would (a second at most: it never holds more).
    fn spend(&mut self, bytes: u64) -> Result<(), Duration> {
        let now = Instant::now();
        let refill = now.duration_since(self.at).as_secs_f64() * self.rate as f64;
        self.tokens = (self.tokens + refill).min(self.rate as f64);
        self.at = now;
        let missing = bytes as f64 - self.tokens;
        if missing > 0.0 {
            return Err(Duration::from_secs_f64((missing / self.rate as f64).min(1.0)));
        }
        self.tokens -= bytes as f64;
        Ok(())
    }
}

/// Bounds the bytes of request heads one connection sends upstream per
/// second (429 past it); see the [module docs](self). One layer, one bucket:
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
        HeaderRate { inner, bucket: self.bucket.clone() }
    }
}

/// See [`HeaderRateLayer`].
#[derive(Debug, Clone)]
pub struct HeaderRate<S> {
    inner: S,
    bucket: Arc<Mutex<Bucket>>,
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
    use super::*;
    use tower::ServiceExt;

    #[test]
    fn a_head_costs_its_request_line_and_fields() {
        let request = Request::put("/objects/a?x=1").header("x-fencing-token", "7").body(()).unwrap();
        // "PUT /objects/a?x=1 HTTP/1.1\r\n" + "x-fencing-token: 7\r\n" + "\r\n"
        assert_eq!(head_bytes(&request), 29 + 20 + 2);
    }

    #[tokio::test(start_paused = true)]
    async fn the_bucket_starts_with_one_head_and_the_burst_accrues() {
        let mut bucket = Bucket::new(1000, 100);
        assert!(bucket.spend(101).is_err(), "a new bucket holds only its start");
        assert!(bucket.spend(100).is_ok());
        assert!(bucket.spend(1).is_err());
        // The rest of the second's burst comes with time.
        tokio::time::advance(Duration::from_millis(900)).await;
        assert!(bucket.spend(900).is_ok());
        assert!(bucket.spend(1).is_err());
        // A start above the rate is held to one second.
        let mut bucket = Bucket::new(1000, 5000);
        assert!(bucket.spend(1000).is_ok());
        assert!(bucket.spend(1).is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn the_bucket_holds_one_second_and_refills_at_the_rate() {
        let mut bucket = Bucket::new(1000, 0);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(bucket.spend(600).is_ok());
        assert!(bucket.spend(600).is_err(), "only 400 left");
        assert!(bucket.spend(400).is_ok());
        tokio::time::advance(Duration::from_millis(500)).await;
        assert!(bucket.spend(500).is_ok());
        assert!(bucket.spend(1).is_err());
        // Idle for long: never more than one second saved up.
        tokio::time::advance(Duration::from_secs(60)).await;
        assert!(bucket.spend(1000).is_ok());
        assert!(bucket.spend(1).is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn a_refusal_says_when_the_bucket_would_hold_the_head() {
        let mut bucket = Bucket::new(1000, 0);
        assert_eq!(bucket.spend(250), Err(Duration::from_millis(250)));
        tokio::time::advance(Duration::from_millis(100)).await;
        assert_eq!(bucket.spend(250), Err(Duration::from_millis(150)));
        // A head larger than a second's worth never fits: a second at most.
        assert_eq!(bucket.spend(5000), Err(Duration::from_secs(1)));
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
