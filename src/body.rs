//! Request bodies: the route's `max_body` (413 past it), and fenced bodies
//! read whole before they may take their key's turn.
//!
//! A declared `Content-Length` above the limit is refused before anything is
//! read. A fenced body is read in full, up to the limit, before it may take
//! its key's turn (unless its route sets `stream_body`): a client that dies or
//! stalls mid-body, or a body that turns out too large, is refused with
//! nothing forwarded, so the upstream never sees part of a fenced write. The
//! bytes held that way count against one budget for the whole process
//! (`[server] max_buffered_bytes`): a request that would overrun it gets 503
//! with `Retry-After`, and its bytes are handed back as soon as its body is
//! dropped. Other bodies stream, and one that overruns the limit is cut off.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::header::CONTENT_LENGTH;
use http::{HeaderMap, Response};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use tower::{Layer, Service, ServiceExt};

use crate::error::{ProxyError, Rejection};
use crate::fence::Checked;
use crate::proxy::{BoxError, ProxyBody};

/// A request body on its way upstream: streamed under the route's limit, or
/// read in full already (with the share of the budget it holds).
#[derive(Debug)]
pub enum RequestBody {
    Streaming(Limited<Incoming>),
    Buffered { bytes: Option<Bytes>, _held: Option<Held> },
}

impl RequestBody {
    /// `body`, streamed, failing once more than `limit` bytes have come.
    fn streaming(body: Incoming, limit: u64) -> Self {
        RequestBody::Streaming(Limited::new(body, usize::try_from(limit).unwrap_or(usize::MAX)))
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            RequestBody::Buffered { bytes, .. } => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            RequestBody::Streaming(inner) => Pin::new(inner).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            RequestBody::Buffered { bytes, .. } => bytes.is_none(),
            RequestBody::Streaming(inner) => inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            RequestBody::Buffered { bytes: Some(bytes), .. } => SizeHint::with_exact(bytes.len() as u64),
            RequestBody::Buffered { bytes: None, .. } => SizeHint::with_exact(0),
            RequestBody::Streaming(inner) => inner.size_hint(),
        }
    }
}

/// Whether an upstream exchange failed because a streamed body overran its
/// route's limit (the client's fault, not the upstream's).
pub fn overran_limit(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut current = Some(e);
    while let Some(err) = current {
        if err.is::<LengthLimitError>() {
            return true;
        }
        current = err.source();
    }
    false
}

/// The body length a request declares in `Content-Length`, if it is one.
pub(crate) fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers.get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok())
}

/// The process-wide budget for buffered fenced bodies, in bytes.
#[derive(Debug)]
pub struct BufferBudget {
    used: AtomicU64,
    limit: u64,
}

/// Bytes taken from a [`BufferBudget`]; handed back when dropped.
#[derive(Debug)]
pub struct Held {
    budget: Arc<BufferBudget>,
    bytes: u64,
}

impl BufferBudget {
    pub fn new(limit: u64) -> Arc<Self> {
        Arc::new(BufferBudget { used: AtomicU64::new(0), limit })
    }

    /// Takes `bytes` more for `held`, or says the budget is spent.
    fn take(&self, held: &mut Held, bytes: u64) -> Result<(), ProxyError> {
        let mut used = self.used.load(Ordering::Relaxed);
        loop {
            let next =
                used.checked_add(bytes).filter(|n| *n <= self.limit).ok_or(ProxyError::BufferFull(self.limit))?;
            match self.used.compare_exchange_weak(used, next, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => {
                    held.bytes += bytes;
                    return Ok(());
                }
                Err(now) => used = now,
            }
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

/// Applies the route's body limit and reads fenced bodies whole; see the
/// [module docs](self).
#[derive(Debug, Clone)]
pub struct BodyLayer {
    budget: Arc<BufferBudget>,
}

impl BodyLayer {
    pub fn new(budget: Arc<BufferBudget>) -> Self {
        BodyLayer { budget }
    }
}

impl<S> Layer<S> for BodyLayer {
    type Service = Bodies<S>;

    fn layer(&self, inner: S) -> Bodies<S> {
        Bodies { inner, budget: self.budget.clone() }
    }
}

/// See [`BodyLayer`].
#[derive(Debug, Clone)]
pub struct Bodies<S> {
    inner: S,
    budget: Arc<BufferBudget>,
}

impl<S> Service<Checked<Incoming>> for Bodies<S>
where
    S: Service<Checked<RequestBody>, Response = Response<ProxyBody>, Error = Rejection> + Clone + Send + 'static,
    S::Future: Send,
{
    type Response = Response<ProxyBody>;
    type Error = Rejection;
    type Future = Pin<Box<dyn Future<Output = Result<Response<ProxyBody>, Rejection>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Rejection>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, checked: Checked<Incoming>) -> Self::Future {
        let (inner, budget) = (self.inner.clone(), self.budget.clone());
        Box::pin(async move {
            let checked = limit_body(checked, &budget).await?;
            inner.oneshot(checked).await
        })
    }
}

/// Applies the route's `max_body` to the request, reading a fenced body whole
/// (see the [module docs](self)). A refusal names the fence key and token.
async fn limit_body(checked: Checked<Incoming>, budget: &Arc<BufferBudget>) -> Result<Checked<RequestBody>, Rejection> {
    let (checked, body) = checked.take_body();
    let route = &checked.routed.route;
    let limit = route.max_body;
    let headers = checked.routed.request.headers();
    let declared = declared_length(headers);
    if declared.is_some_and(|len| len > limit) {
        return Err(checked.rejection(ProxyError::BodyTooLarge { limit, partly_sent: false }));
    }
    if checked.fence.is_none() || route.stream_body || body.is_end_stream() {
        return Ok(checked.with_body(RequestBody::streaming(body, limit)));
    }
    let mut held = Held { budget: budget.clone(), bytes: 0 };
    // A declared length is taken from the budget up front: a client cannot
    // start more such bodies than the budget holds.
    if let Some(len) = declared {
        if let Err(e) = budget.take(&mut held, len) {
            return Err(checked.rejection(e));
        }
    }
    // Bounded in time too (the route's timeout): a client that stalls mid-body
    // must not hold its connection and the bytes buffered so far forever.
    let timeout = route.timeout;
    match tokio::time::timeout(timeout, read(body, limit, budget, &mut held)).await {
        Ok(Ok(bytes)) => Ok(checked.with_body(RequestBody::Buffered { bytes: Some(bytes), _held: Some(held) })),
        Ok(Err(e)) => Err(checked.rejection(e)),
        Err(_) => Err(checked.rejection(ProxyError::BodyTimeout(timeout))),
    }
}

/// Reads `body` whole, up to `limit` bytes, taking from `budget` whatever a
/// declared length did not already cover.
async fn read(mut body: Incoming, limit: u64, budget: &BufferBudget, held: &mut Held) -> Result<Bytes, ProxyError> {
    let mut first: Option<Bytes> = None;
    let mut rest = BytesMut::new();
    let mut seen = 0u64;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(ProxyError::ClientBody)?;
        let Ok(data) = frame.into_data() else { continue };
        seen += data.len() as u64;
        if seen > limit {
            return Err(ProxyError::BodyTooLarge { limit, partly_sent: false });
        }
        if seen > held.bytes {
            budget.take(held, seen - held.bytes)?;
        }
        // One chunk (the common case) is kept as it came, without a copy.
        match first.take() {
            None if rest.is_empty() => first = Some(data),
            None => rest.extend_from_slice(&data),
            Some(earlier) => {
                rest.extend_from_slice(&earlier);
                rest.extend_from_slice(&data);
            }
        }
    }
    Ok(first.unwrap_or_else(|| rest.freeze()))
}
