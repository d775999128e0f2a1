//! Request bodies: the route's `max_body` (413 past it), and fenced bodies
//! read whole before they may take their key's turn.
//!
//! A declared `Content-Length` above the limit is refused before anything is
//! read. A fenced body is read in full, up to the limit, before it may take
//! its key's turn (unless its route sets `stream_body`): a client that dies or
//! stalls mid-body, or a body that turns out too large, is refused with
//! nothing forwarded, so the upstream never sees part of a fenced write. The
//! bytes held that way count against one budget for the whole process
//! (`[server] max_buffered_bytes`) and against the share of it one client
//! connection may hold over all its HTTP/2 streams
//! (`[server] max_connection_buffered_bytes`): a request that would overrun
//! either gets 503 with `Retry-After`, and its bytes are handed back as soon
//! as its body is dropped. Other bodies stream, and one that overruns the
//! limit is cut off.
//!
//! The budget counts what is allocated, not what arrived: a declared length
//! is one allocation of exactly that size, and other bodies are copied into
//! blocks whose whole capacity is taken before a byte goes in. Nothing keeps
//! a reference into hyper's read buffers, which a small chunk would otherwise
//! pin whole. Blocks of 16 KiB and more are memory mapped for themselves, so
//! what a body held goes back to the system the moment it is dropped.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use std::collections::VecDeque;

use bytes::{BufMut, Bytes, BytesMut};
use http::header::CONTENT_LENGTH;
use http::{HeaderMap, Response};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::{Body, Frame, SizeHint};
use memmap2::MmapMut;
use tower::{Layer, Service, ServiceExt};

use crate::error::{ProxyError, Rejection};
use crate::fence::Checked;
use crate::proxy::{BoxError, ProxyBody};
use crate::server::connection::ClientBody;

/// A request body on its way upstream: streamed under the route's limit, or
/// read in full already (with the share of the budget it holds).
#[derive(Debug)]
pub enum RequestBody {
    Streaming(Limited<ClientBody>),
    Buffered { blocks: Blocks, _held: Option<Held> },
}

/// A buffered body's blocks, in order. The first is held apart, so a body of
/// one block (most of them) needs no list.
#[derive(Debug, Default)]
pub struct Blocks {
    first: Option<Bytes>,
    rest: VecDeque<Bytes>,
}

impl Blocks {
    fn push(&mut self, block: Bytes) {
        if self.is_empty() {
            self.first = Some(block);
        } else {
            self.rest.push_back(block);
        }
    }

    fn pop(&mut self) -> Option<Bytes> {
        self.first.take().or_else(|| self.rest.pop_front())
    }

    fn is_empty(&self) -> bool {
        self.first.is_none() && self.rest.is_empty()
    }

    fn len(&self) -> u64 {
        self.first.iter().chain(&self.rest).map(|b| b.len() as u64).sum()
    }
}

impl RequestBody {
    /// `body`, streamed, failing once more than `limit` bytes have come.
    fn streaming(body: ClientBody, limit: u64) -> Self {
        RequestBody::Streaming(Limited::new(body, usize::try_from(limit).unwrap_or(usize::MAX)))
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            RequestBody::Buffered { blocks, .. } => Poll::Ready(blocks.pop().map(|b| Ok(Frame::data(b)))),
            RequestBody::Streaming(inner) => Pin::new(inner).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            RequestBody::Buffered { blocks, .. } => blocks.is_empty(),
            RequestBody::Streaming(inner) => inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            RequestBody::Buffered { blocks, .. } => SizeHint::with_exact(blocks.len()),
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

/// A budget for buffered fenced bodies, in bytes: the process-wide one, or
/// one connection's share of it.
#[derive(Debug)]
pub struct BufferBudget {
    used: AtomicU64,
    limit: u64,
}

impl BufferBudget {
    pub fn new(limit: u64) -> Arc<Self> {
        Arc::new(BufferBudget { used: AtomicU64::new(0), limit })
    }

    /// Bytes held now.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// Takes `bytes`, or says the budget (its limit) is spent.
    fn reserve(&self, bytes: u64) -> Result<(), u64> {
        let mut used = self.used.load(Ordering::Relaxed);
        loop {
            let next = used.checked_add(bytes).filter(|n| *n <= self.limit).ok_or(self.limit)?;
            match self.used.compare_exchange_weak(used, next, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return Ok(()),
                Err(now) => used = now,
            }
        }
    }

    fn release(&self, bytes: u64) {
        self.used.fetch_sub(bytes, Ordering::AcqRel);
    }
}

/// Bytes one body took from its connection's share and from the process's
/// budget; handed back to both when dropped.
#[derive(Debug)]
pub struct Held {
    global: Arc<BufferBudget>,
    connection: Arc<BufferBudget>,
    bytes: u64,
}

impl Held {
    fn new(global: &Arc<BufferBudget>, connection: &Arc<BufferBudget>) -> Self {
        Held { global: global.clone(), connection: connection.clone(), bytes: 0 }
    }

    /// Takes `bytes` more from both budgets, or from neither. The
    /// connection's share is asked first, so one connection at its share
    /// never touches the budget the others share.
    fn take(&mut self, bytes: u64) -> Result<(), ProxyError> {
        self.connection.reserve(bytes).map_err(ProxyError::ConnectionBufferFull)?;
        if let Err(limit) = self.global.reserve(bytes) {
            self.connection.release(bytes);
            return Err(ProxyError::BufferFull(limit));
        }
        self.bytes += bytes;
        Ok(())
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.global.release(self.bytes);
        self.connection.release(self.bytes);
    }
}

/// Applies the route's body limit and reads fenced bodies whole; see the
/// [module docs](self).
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

/// See [`BodyLayer`].
#[derive(Debug, Clone)]
pub struct Bodies<S> {
    inner: S,
    /// The process's budget and the connection's share, behind one count of
    /// the connection's own: cloned for every request, it touches no count
    /// the other worker threads write.
    budgets: Arc<(Arc<BufferBudget>, Arc<BufferBudget>)>,
}

impl<S> Service<Checked<ClientBody>> for Bodies<S>
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

    fn call(&mut self, checked: Checked<ClientBody>) -> Self::Future {
        let (inner, budgets) = (self.inner.clone(), self.budgets.clone());
        Box::pin(async move {
            let held = Held::new(&budgets.0, &budgets.1);
            let checked = limit_body(checked, held).await?;
            inner.oneshot(checked).await
        })
    }
}

/// Applies the route's `max_body` to the request, reading a fenced body whole
/// (see the [module docs](self)). A refusal names the fence key and token.
async fn limit_body(checked: Checked<ClientBody>, mut held: Held) -> Result<Checked<RequestBody>, Rejection> {
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
    // A declared length is taken from the budget up front: a client cannot
    // start more such bodies than the budget holds.
    if let Some(len) = declared {
        if let Err(e) = held.take(len) {
            return Err(checked.rejection(e));
        }
    }
    // Bounded in time too (the route's timeout): a client that stalls mid-body
    // must not hold its connection and the bytes buffered so far forever.
    let timeout = route.timeout;
    match tokio::time::timeout(timeout, read(body, limit, declared, &mut held)).await {
        Ok(Ok(blocks)) => Ok(checked.with_body(RequestBody::Buffered { blocks, _held: Some(held) })),
        Ok(Err(e)) => Err(checked.rejection(e)),
        Err(_) => Err(checked.rejection(ProxyError::BodyTimeout(timeout))),
    }
}

/// The first block of a body without a declared length, and the least any
/// block is: small bodies take little of the budget.
const MIN_BLOCK: u64 = 1024;
/// The largest block: a body's last block wastes at most this much of the
/// budget, and a block never needs a reallocation to grow.
const MAX_BLOCK: u64 = 64 * 1024;
/// Blocks from this size on are anonymous mappings of their own, unmapped
/// (handed back to the system) as soon as the body is sent or refused. The
/// allocator would keep freed memory resident until it next works, so an
/// idle proxy would keep what an attack made it hold. Smaller blocks, the
/// first 16 KiB of any body, come from the allocator: a mapping costs two
/// system calls, which small bodies should not pay.
const MAP_FROM: usize = 16 * 1024;

/// Where a buffered body's bytes are written, `capacity` taken up front.
enum Block {
    Heap(BytesMut),
    Mapped { map: MmapMut, len: usize },
}

impl Block {
    fn new(capacity: usize) -> Block {
        if capacity >= MAP_FROM {
            // Past the process's mappings (vm.max_map_count) or address
            // space, the allocator holds the block instead.
            if let Ok(map) = MmapMut::map_anon(capacity) {
                return Block::Mapped { map, len: 0 };
            }
        }
        Block::Heap(BytesMut::with_capacity(capacity))
    }

    fn is_full(&self) -> bool {
        match self {
            Block::Heap(bytes) => bytes.len() == bytes.capacity(),
            Block::Mapped { map, len } => *len == map.len(),
        }
    }

    fn is_empty(&self) -> bool {
        match self {
            Block::Heap(bytes) => bytes.is_empty(),
            Block::Mapped { len, .. } => *len == 0,
        }
    }

    /// Copies in as much of `data` as fits, and advances it past that.
    fn fill(&mut self, data: &mut Bytes) {
        match self {
            Block::Heap(bytes) => {
                let n = data.len().min(bytes.capacity() - bytes.len());
                bytes.put_slice(&data.split_to(n));
            }
            Block::Mapped { map, len } => {
                let n = data.len().min(map.len() - *len);
                map[*len..*len + n].copy_from_slice(&data.split_to(n));
                *len += n;
            }
        }
    }

    fn freeze(self) -> Bytes {
        match self {
            Block::Heap(bytes) => bytes.freeze(),
            Block::Mapped { map, len } => Bytes::from_owner(map).slice(..len),
        }
    }
}

/// Reads `body` whole, up to `limit` bytes, into blocks whose capacity
/// `held` has taken from the budgets first: one of exactly the declared
/// length, if there is one (already taken), else blocks that grow with the
/// body, from [`MIN_BLOCK`] to [`MAX_BLOCK`].
async fn read(mut body: ClientBody, limit: u64, declared: Option<u64>, held: &mut Held) -> Result<Blocks, ProxyError> {
    let mut blocks = Blocks::default();
    let mut block = Block::new(usize::try_from(declared.unwrap_or(0)).unwrap_or(0));
    let mut seen = 0u64;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(ProxyError::ClientBody)?;
        let Ok(mut data) = frame.into_data() else { continue };
        seen += data.len() as u64;
        if seen > limit {
            return Err(ProxyError::BodyTooLarge { limit, partly_sent: false });
        }
        while !data.is_empty() {
            if block.is_full() {
                // A new block, its whole capacity taken first, sized like
                // what came so far but never past the limit.
                let so_far = seen - data.len() as u64;
                let size = so_far.clamp(MIN_BLOCK, MAX_BLOCK).min(limit - so_far).max(1);
                held.take(size)?;
                let full = std::mem::replace(&mut block, Block::new(size as usize));
                if !full.is_empty() {
                    blocks.push(full.freeze());
                }
            }
            block.fill(&mut data);
        }
    }
    if !block.is_empty() {
        blocks.push(block.freeze());
    }
    Ok(blocks)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_come_out_in_the_order_they_went_in() {
        let mut blocks = Blocks::default();
        assert!(blocks.is_empty());
        for text in ["a", "bb", "ccc"] {
            blocks.push(Bytes::from(text));
        }
        assert_eq!(blocks.len(), 6);
        assert_eq!(blocks.pop().as_deref(), Some(&b"a"[..]));
        blocks.push(Bytes::from("dddd"));
        let rest: Vec<_> = std::iter::from_fn(|| blocks.pop()).collect();
        assert_eq!(rest, ["bb", "ccc", "dddd"]);
        assert!(blocks.is_empty());
    }

    #[test]
    fn a_body_takes_from_its_connection_share_and_the_budget_or_from_neither() {
        let budget = BufferBudget::new(100);
        let (one, other) = (BufferBudget::new(60), BufferBudget::new(60));
        let mut a = Held::new(&budget, &one);
        a.take(50).unwrap();
        // The connection's share runs out first, and the budget is untouched.
        let mut b = Held::new(&budget, &one);
        assert!(matches!(b.take(20), Err(ProxyError::ConnectionBufferFull(60))));
        assert_eq!((budget.used(), one.used()), (50, 50));
        // Another connection has a share of its own, but the budget is shared:
        // a refusal there hands the share back.
        let mut c = Held::new(&budget, &other);
        c.take(50).unwrap();
        let mut d = Held::new(&budget, &other);
        assert!(matches!(d.take(5), Err(ProxyError::BufferFull(100))));
        assert_eq!((budget.used(), other.used()), (100, 50));
        drop((a, b, c, d));
        assert_eq!((budget.used(), one.used(), other.used()), (0, 0, 0));
    }
}
