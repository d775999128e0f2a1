//! [`HeaderRate`]: a connection's bucket, and what a request head costs it.

use std::sync::Mutex;
use std::time::Duration;

use http::Request;

use super::bucket::Bucket;
use crate::stack::error::ProxyError;

/// Bounds the bytes of request heads one connection sends upstream per
/// second (429 past it); see the [module docs](super). One per connection,
/// so the bucket starts filling when the connection is accepted.
#[derive(Debug)]
pub(crate) struct HeaderRate {
    bucket: Mutex<Bucket>,
}

impl HeaderRate {
    /// A bucket of `rate` bytes a second for one connection, starting with
    /// `start` bytes (one largest head) rather than a full second: reconnecting
    /// must not buy a fresh burst.
    pub(crate) fn new(rate: u64, start: u64) -> Self {
        HeaderRate { bucket: Mutex::new(Bucket::new(rate, start)) }
    }

    /// Spends what `request`'s head costs; refused (with how long until the
    /// bucket would hold it, the time the refusal waits before it is sent)
    /// when the bucket is short of it.
    pub(crate) fn spend<B>(&self, request: &Request<B>) -> Result<(), (ProxyError, Duration)> {
        let cost = head_bytes(request);
        let mut bucket = self.bucket.lock().unwrap_or_else(|e| e.into_inner());
        bucket.spend(cost).map_err(|wait| (ProxyError::HeaderRate(bucket.rate), wait))
    }
}

/// What a head costs: its size as written over HTTP/1.1 (request line, each
/// field as `name: value\r\n`, the blank line), whatever the client spoke.
fn head_bytes<B>(request: &Request<B>) -> u64 {
    let target = request.uri().path_and_query().map_or(1, |pq| pq.as_str().len());
    let line = request.method().as_str().len() + 1 + target + " HTTP/1.1\r\n".len();
    let fields: usize = request.headers().iter().map(|(name, value)| name.as_str().len() + value.len() + 4).sum();
    (line + fields + 2) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_costs_its_request_line_and_fields() {
        let request = Request::put("/objects/a?x=1").header("x-fencing-token", "7").body(()).unwrap();
        assert_eq!(head_bytes(&request), 29 + 20 + 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_head_past_the_rate_is_refused_with_the_wait_until_the_bucket_would_hold_it() {
        let request = Request::put("/objects/a").header("x-fencing-token", "7").body(()).unwrap();
        let cost = head_bytes(&request);
        let rate = HeaderRate::new(cost, 0);
        let (refused, wait) = rate.spend(&request).unwrap_err();
        assert!(matches!(refused, ProxyError::HeaderRate(r) if r == cost));
        assert_eq!(wait, Duration::from_secs(1));
        tokio::time::advance(wait).await;
        assert!(rate.spend(&request).is_ok());
    }
}
