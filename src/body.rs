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
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use std::collections::VecDeque;

use bytes::{BufMut, Bytes, BytesMut};
use http::header::CONTENT_LENGTH;
use http::{HeaderMap, Response};
use http_body_util::{LengthLimitError, Limited};
use hyper::body::{Body, Frame, SizeHint};
use memmap2::MmapMut;
use tokio::sync::Notify;
use tower::{Layer, Service};

use crate::error::{ProxyError, Rejection};
use crate::fence::Checked;
use crate::proxy::{BoxError, ProxyBody};
use crate::server::connection::ClientBody;

/// A request body on its way upstream: streamed under the route's limit, or
/// read in full already (with the share of the budget it holds). A fenced
/// request's body tells its [`Handover`] when hyper has taken its last frame,
/// or dropped it unfinished.
#[derive(Debug)]
pub struct RequestBody {
    kind: Kind,
    /// Where to tell how far the body went, and the generation it was
    /// handed out in ([`RequestBody::report_to`]).
    report: Option<(Arc<Handover>, u64)>,
}

#[derive(Debug)]
enum Kind {
    Streaming(Limited<ClientBody>),
    /// Streaming, and telling `overran` when it goes past its limit: for an
    /// HTTP/2 upstream, whose layer resets the stream on a body error
    /// instead of handing the error back (see [`RequestBody::watch_overrun`]).
    Watched {
        inner: Limited<ClientBody>,
        overran: Arc<AtomicBool>,
    },
    Buffered {
        blocks: Blocks,
        _held: Option<Held>,
    },
}

/// The most of a buffered body hyper is handed at once. A body read whole
/// may be one block of megabytes; handed over in one frame, hyper would take
/// it all at once into its own write queue, and "the last frame was handed
/// over" would say nothing of what left. In frames of this size (HTTP/2's
/// default frame), what hyper holds unwritten stays small: its HTTP/1.1
/// write queue holds a few hundred KiB at most, and over HTTP/2 one frame
/// waits for the upstream's flow-control window while another is queued.
const MAX_FRAME: usize = 16 * 1024;

/// A buffered body's blocks, in order. The first is held apart, so a body of
/// one block (most of them) needs no list.
#[derive(Debug, Default, Clone)]
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

    /// The next frame to hand over: at most [`MAX_FRAME`] bytes of the next
    /// block (the rest of it stays first; no copy).
    fn pop_frame(&mut self) -> Option<Bytes> {
        let mut block = self.pop()?;
        if block.len() > MAX_FRAME {
            let frame = block.split_to(MAX_FRAME);
            self.first = Some(block);
            return Some(frame);
        }
        Some(block)
    }

    fn is_empty(&self) -> bool {
        self.first.is_none() && self.rest.is_empty()
    }

    fn len(&self) -> u64 {
        self.first.iter().chain(&self.rest).map(|b| b.len() as u64).sum()
    }
}

impl RequestBody {
    fn of(kind: Kind) -> Self {
        RequestBody { kind, report: None }
    }

    /// An empty body.
    pub fn empty() -> Self {
        RequestBody::of(Kind::Buffered { blocks: Blocks::default(), _held: None })
    }

    /// `body`, streamed, failing once more than `limit` bytes have come.
    fn streaming(body: ClientBody, limit: u64) -> Self {
        RequestBody::of(Kind::Streaming(Limited::new(body, usize::try_from(limit).unwrap_or(usize::MAX))))
    }

    /// The same body again, to send once more if this one is refused
    /// unprocessed: a buffered body (which then holds its budget share, so
    /// the bytes stay counted while either lives) or an empty one; `None`
    /// for a body still streaming from the client. The twin reports to no
    /// [`Handover`] until it is handed out ([`RequestBody::report_to`]).
    pub fn twin(&mut self) -> Option<RequestBody> {
        match &mut self.kind {
            Kind::Buffered { blocks, _held } => {
                Some(RequestBody::of(Kind::Buffered { blocks: blocks.clone(), _held: _held.take() }))
            }
            Kind::Streaming(inner) | Kind::Watched { inner, .. } if inner.is_end_stream() => Some(RequestBody::empty()),
            Kind::Streaming(_) | Kind::Watched { .. } => None,
        }
    }

    /// For a body still streaming from the client: a flag set if it goes
    /// past the route's limit. The HTTP/2 layer does not hand that error
    /// back (it resets the stream), so the forward asks the flag to answer
    /// 413 rather than 502.
    pub fn watch_overrun(&mut self) -> Option<Arc<AtomicBool>> {
        let kind = std::mem::replace(&mut self.kind, Kind::Buffered { blocks: Blocks::default(), _held: None });
        match kind {
            Kind::Streaming(inner) => {
                let overran = Arc::new(AtomicBool::new(false));
                self.kind = Kind::Watched { inner, overran: overran.clone() };
                Some(overran)
            }
            other => {
                self.kind = other;
                None
            }
        }
    }

    /// From now on, tells `handover` when hyper has taken this body's last
    /// frame, or dropped it before. A body with nothing left to send tells
    /// nothing: there is nothing to wait for.
    pub(crate) fn report_to(&mut self, handover: &Arc<Handover>) {
        if self.kind_is_end_stream() {
            return;
        }
        if let Some((old, generation)) = self.report.take() {
            old.end(generation, Delivery::Cut);
        }
        self.report = Some((handover.clone(), handover.begin()));
    }

    /// Tells the handover, once, how the body ended.
    fn ended(&mut self, how: Delivery) {
        if let Some((handover, generation)) = self.report.take() {
            handover.end(generation, how);
        }
    }

    fn kind_is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Buffered { blocks, .. } => blocks.is_empty(),
            Kind::Streaming(inner) | Kind::Watched { inner, .. } => inner.is_end_stream(),
        }
    }
}

impl Drop for RequestBody {
    fn drop(&mut self) {
        // Dropped with frames left: by hyper when the exchange failed or its
        // connection closed, or unsent. What of it was written may still
        // be in the sockets' buffers.
        self.ended(Delivery::Cut);
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let polled = match &mut this.kind {
            Kind::Buffered { blocks, .. } => Poll::Ready(blocks.pop_frame().map(|b| Ok(Frame::data(b)))),
            Kind::Streaming(inner) => Pin::new(inner).poll_frame(cx),
            Kind::Watched { inner, overran } => {
                let polled = Pin::new(inner).poll_frame(cx);
                if let Poll::Ready(Some(Err(e))) = &polled {
                    if overran_limit(&**e) {
                        overran.store(true, Ordering::Release);
                    }
                }
                polled
            }
        };
        if this.report.is_some() {
            // The last frame is out once it is handed over: hyper may stop
            // polling a body whose `is_end_stream` says so.
            match &polled {
                Poll::Ready(None) => this.ended(Delivery::Whole),
                Poll::Ready(Some(Ok(_))) if this.kind_is_end_stream() => this.ended(Delivery::Whole),
                Poll::Ready(Some(Err(_))) => this.ended(Delivery::Cut),
                _ => {}
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.kind_is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Buffered { blocks, .. } => SizeHint::with_exact(blocks.len()),
            Kind::Streaming(inner) | Kind::Watched { inner, .. } => inner.size_hint(),
        }
    }
}

/// How far a request body went to the upstream connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// No body is on its way (none, or an empty one).
    Nothing,
    /// Hyper is still taking its frames.
    Sending,
    /// Hyper took its last frame.
    Whole,
    /// Dropped with frames left (the exchange failed, its connection
    /// closed), or it errored.
    Cut,
}

impl Delivery {
    fn bits(self) -> u64 {
        match self {
            Delivery::Nothing => 0,
            Delivery::Sending => 1,
            Delivery::Whole => 2,
            Delivery::Cut => 3,
        }
    }

    fn of(bits: u64) -> Delivery {
        match bits & 3 {
            0 => Delivery::Nothing,
            1 => Delivery::Sending,
            2 => Delivery::Whole,
            _ => Delivery::Cut,
        }
    }
}

/// What a fenced request's forward shares with its fence: whether it may
/// have sent something yet, how far its body went to the upstream
/// connection (told by the body as hyper takes its frames), and that
/// connection, to tear down if the body does not go out in time.
///
/// An upstream may answer before it has read a body: its answer then says
/// nothing about when the rest of the write arrives. So the fence passes a
/// key's turn only once the body has been handed over whole too, or its
/// connection was torn down (see `docs/behaviour.md`).
///
/// An HTTP/1.1 client connection's fenced requests, one at a time, reuse
/// one (no allocation per request).
#[derive(Debug, Default)]
pub struct Handover {
    taken: AtomicBool,
    /// `generation << 2 | delivery`: a body handed out again (an HTTP/2
    /// request sent once more) starts a new generation, so the end of the
    /// one before it tells nothing.
    progress: AtomicU64,
    changed: Notify,
    connection: Mutex<Option<crate::proxy::Teardown>>,
}

impl Handover {
    /// Marks that the forward may send something from now on.
    pub(crate) fn mark_taken(&self) {
        self.taken.store(true, Ordering::Release);
    }

    /// Whether the forward may have sent something.
    pub(crate) fn is_taken(&self) -> bool {
        self.taken.load(Ordering::Acquire)
    }

    /// Cleared for a new request, unless a body is still going out on it:
    /// then `false`, and the new request needs one of its own.
    pub(crate) fn renew(&self) -> bool {
        let progress = self.progress.load(Ordering::Acquire);
        if Delivery::of(progress) == Delivery::Sending {
            return false;
        }
        self.taken.store(false, Ordering::Release);
        self.progress.store(((progress >> 2) + 1) << 2, Ordering::Release);
        *self.connection.lock().unwrap_or_else(PoisonError::into_inner) = None;
        true
    }

    /// A body starts going out: its generation.
    fn begin(&self) -> u64 {
        let mut progress = self.progress.load(Ordering::Acquire);
        loop {
            let generation = (progress >> 2) + 1;
            let next = (generation << 2) | Delivery::Sending.bits();
            match self.progress.compare_exchange_weak(progress, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return generation,
                Err(now) => progress = now,
            }
        }
    }

    /// The body of `generation` ended `how`, if it is still the one going out.
    fn end(&self, generation: u64, how: Delivery) {
        let sending = (generation << 2) | Delivery::Sending.bits();
        let ended = (generation << 2) | how.bits();
        if self.progress.compare_exchange(sending, ended, Ordering::AcqRel, Ordering::Acquire).is_ok() {
            // One waiter at most (the fence); a permit left over from an
            // earlier request only makes it look again.
            self.changed.notify_one();
        }
    }

    /// How far the body went, and its generation.
    pub fn delivery(&self) -> (Delivery, u64) {
        let progress = self.progress.load(Ordering::Acquire);
        (Delivery::of(progress), progress >> 2)
    }

    /// Waits until the body of `generation` is no longer going out.
    pub async fn delivered(&self, generation: u64) {
        loop {
            let changed = self.changed.notified();
            let (delivery, now) = self.delivery();
            if delivery != Delivery::Sending || now != generation {
                return;
            }
            changed.await;
        }
    }

    /// The body goes out on `connection`.
    pub(crate) fn went_on(&self, connection: crate::proxy::Teardown) {
        *self.connection.lock().unwrap_or_else(PoisonError::into_inner) = Some(connection);
    }

    /// The connection the body went out on, if it went out on one.
    pub fn connection(&self) -> Option<crate::proxy::Teardown> {
        self.connection.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

/// Whether an upstream exchange failed because a streamed body overran its
/// route's limit (the client's fault, not the upstream's).
pub fn overran_limit(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut current = Some(e);
    while let Some(err) = current {
        if err.is::<LengthLimitError>() || err.is::<Overran>() {
            return true;
        }
        current = err.source();
    }
    false
}

/// A streamed body went past the route's limit, as a watched body's flag
/// says ([`RequestBody::watch_overrun`]).
#[derive(Debug)]
pub struct Overran;

impl std::fmt::Display for Overran {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the request body went past the route's max_body")
    }
}

impl std::error::Error for Overran {}

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

/// A budget had no room for a body's next bytes: which one, and its limit.
/// Kept apart from the request path's errors so the budget depends on none
/// of them; the layer turns it into a 503.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BudgetFull {
    /// The process's budget, shared by every connection.
    #[error("the process's budget of {0} bytes for buffered bodies is spent")]
    Process(u64),
    /// The share of it one client connection may hold.
    #[error("the connection's share of {0} bytes for buffered bodies is spent")]
    Connection(u64),
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
    fn take(&mut self, bytes: u64) -> Result<(), BudgetFull> {
        self.connection.reserve(bytes).map_err(BudgetFull::Connection)?;
        if let Err(limit) = self.global.reserve(bytes) {
            self.connection.release(bytes);
            return Err(BudgetFull::Process(limit));
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
    S: Service<Checked<RequestBody>, Response = Response<ProxyBody>, Error = Rejection> + Clone,
{
    type Response = Response<ProxyBody>;
    type Error = Rejection;
    type Future = BodyFuture<S, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Rejection>> {
        self.inner.poll_ready(cx)
    }

    /// Applies the route's `max_body` to the request, reading a fenced body
    /// whole (see the [module docs](self)). A refusal names the fence key and
    /// token.
    fn call(&mut self, checked: Checked<ClientBody>) -> Self::Future {
        let (checked, body) = checked.take_body();
        let route = &checked.routed.route;
        let limit = route.max_body;
        let declared = declared_length(checked.routed.request.headers());
        if declared.is_some_and(|len| len > limit) {
            let rejection = checked.rejection(ProxyError::BodyTooLarge { limit, partly_sent: false });
            return BodyFuture::Refused { rejection: Some(rejection) };
        }
        if checked.fence.is_none() || route.stream_body || body.is_end_stream() {
            return BodyFuture::Passed {
                inner: self.inner.call(checked.with_body(RequestBody::streaming(body, limit))),
            };
        }
        // A declared length is taken from the budget up front: a client cannot
        // start more such bodies than the budget holds.
        let mut held = Held::new(&self.budgets.0, &self.budgets.1);
        if let Some(len) = declared {
            if let Err(e) = held.take(len) {
                return BodyFuture::Refused { rejection: Some(checked.rejection(e.into())) };
            }
        }
        // Bounded in time too (the route's timeout): a client that stalls
        // mid-body must not hold its connection and the bytes buffered so far
        // forever.
        let timeout = route.timeout;
        // The service driven to readiness goes with the request; a fresh
        // clone stays behind.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        BodyFuture::Reading {
            reading: Some(Reading { reader: Reader::new(body, limit, declared, held), checked, inner }),
            deadline: tokio::time::sleep(timeout),
            timeout,
        }
    }
}

/// A fenced request whose body is being read, and the service it goes to next.
#[derive(Debug)]
pub(crate) struct Reading<S> {
    reader: Reader,
    checked: Checked<()>,
    inner: S,
}

pin_project_lite::pin_project! {
    /// [`Bodies`]' response future: the refusal, the body read whole within
    /// the route's timeout, then the request passed on. Polled in place,
    /// inside the request's own future: no allocation.
    #[project = BodyFutureProj]
    pub(crate) enum BodyFuture<S, F> {
        Refused { rejection: Option<Rejection> },
        Reading { reading: Option<Reading<S>>, #[pin] deadline: tokio::time::Sleep, timeout: Duration },
        Passed { #[pin] inner: F },
    }
}

impl<S> Future for BodyFuture<S, S::Future>
where
    S: Service<Checked<RequestBody>, Response = Response<ProxyBody>, Error = Rejection>,
{
    type Output = Result<Response<ProxyBody>, Rejection>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let next = match self.as_mut().project() {
            BodyFutureProj::Refused { rejection } => {
                return Poll::Ready(Err(rejection.take().expect("the body's future polled after it was done")))
            }
            BodyFutureProj::Passed { inner } => return inner.poll(cx),
            BodyFutureProj::Reading { reading, deadline, timeout } => {
                let read = reading.as_mut().expect("the body's future polled after it was done").reader.poll_read(cx);
                let result = match read {
                    Poll::Ready(result) => result.map_err(ProxyError::from),
                    Poll::Pending => {
                        ready!(deadline.poll(cx));
                        Err(ProxyError::BodyTimeout(*timeout))
                    }
                };
                let Reading { reader, checked, mut inner } = reading.take().expect("taken only here");
                if let Err(e) = result {
                    return Poll::Ready(Err(checked.rejection(e)));
                }
                inner.call(checked.with_body(reader.into_body()))
            }
        };
        self.set(BodyFuture::Passed { inner: next });
        self.project_passed().poll(cx)
    }
}

impl From<BudgetFull> for ProxyError {
    fn from(full: BudgetFull) -> Self {
        match full {
            BudgetFull::Process(limit) => ProxyError::BufferFull(limit),
            BudgetFull::Connection(limit) => ProxyError::ConnectionBufferFull(limit),
        }
    }
}

impl From<ReadError> for ProxyError {
    fn from(e: ReadError) -> Self {
        match e {
            // Read before the turn: nothing of the body went upstream.
            ReadError::TooLarge { limit } => ProxyError::BodyTooLarge { limit, partly_sent: false },
            ReadError::BufferFull(full) => full.into(),
            ReadError::Client(e) => ProxyError::ClientBody(e),
        }
    }
}

impl<S, F> BodyFuture<S, F> {
    fn project_passed(self: Pin<&mut Self>) -> Pin<&mut F> {
        match self.project() {
            BodyFutureProj::Passed { inner } => inner,
            _ => unreachable!("set to Passed just before"),
        }
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
#[derive(Debug)]
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

/// Why a fenced body could not be read whole. The reader's own, so it needs
/// nothing of the request path; the layer maps each to the refusal it
/// answers with.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReadError {
    /// More than the route's `max_body` came (nothing of it went upstream).
    #[error("the request body is larger than the limit of {limit} bytes")]
    TooLarge { limit: u64 },
    /// A budget had no room for the next block.
    #[error(transparent)]
    BufferFull(#[from] BudgetFull),
    /// The client's body failed: its connection broke, or sent garbage.
    #[error("the client's request body failed: {0}")]
    Client(#[source] hyper::Error),
}

/// Reads a body whole, up to `limit` bytes, into blocks whose capacity
/// `held` has taken from the budgets first: one of exactly the declared
/// length, if there is one (already taken), else blocks that grow with the
/// body, from [`MIN_BLOCK`] to [`MAX_BLOCK`].
#[derive(Debug)]
pub(crate) struct Reader {
    body: ClientBody,
    limit: u64,
    held: Held,
    blocks: Blocks,
    block: Block,
    seen: u64,
}

impl Reader {
    fn new(body: ClientBody, limit: u64, declared: Option<u64>, held: Held) -> Reader {
        let block = Block::new(usize::try_from(declared.unwrap_or(0)).unwrap_or(0));
        Reader { body, limit, held, blocks: Blocks::default(), block, seen: 0 }
    }

    /// Reads on until the body ends (`Ok`) or fails its limits.
    fn poll_read(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ReadError>> {
        while let Some(frame) = ready!(Pin::new(&mut self.body).poll_frame(cx)) {
            let frame = frame.map_err(ReadError::Client)?;
            let Ok(data) = frame.into_data() else { continue };
            self.push(data)?;
        }
        let last = std::mem::replace(&mut self.block, Block::Heap(BytesMut::new()));
        if !last.is_empty() {
            self.blocks.push(last.freeze());
        }
        Poll::Ready(Ok(()))
    }

    fn push(&mut self, mut data: Bytes) -> Result<(), ReadError> {
        let limit = self.limit;
        self.seen += data.len() as u64;
        if self.seen > limit {
            return Err(ReadError::TooLarge { limit });
        }
        while !data.is_empty() {
            if self.block.is_full() {
                // A new block, its whole capacity taken first, sized like
                // what came so far but never past the limit.
                let so_far = self.seen - data.len() as u64;
                let size = so_far.clamp(MIN_BLOCK, MAX_BLOCK).min(limit - so_far).max(1);
                self.held.take(size)?;
                let full = std::mem::replace(&mut self.block, Block::new(size as usize));
                if !full.is_empty() {
                    self.blocks.push(full.freeze());
                }
            }
            self.block.fill(&mut data);
        }
        Ok(())
    }

    /// The body read whole, holding its share of the budgets.
    fn into_body(self) -> RequestBody {
        RequestBody::of(Kind::Buffered { blocks: self.blocks, _held: Some(self.held) })
    }
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

    fn buffered(len: usize) -> RequestBody {
        let mut blocks = Blocks::default();
        blocks.push(Bytes::from(vec![b'x'; len]));
        RequestBody::of(Kind::Buffered { blocks, _held: None })
    }

    /// A body tells its handover "whole" when hyper takes its last frame
    /// (in frames of at most MAX_FRAME), "cut" when dropped before; a body
    /// handed out again starts a generation the old one's end cannot touch.
    #[tokio::test]
    async fn a_body_tells_when_its_last_frame_is_taken_or_it_is_dropped_unfinished() {
        use http_body_util::BodyExt;
        let handover = Arc::new(Handover::default());
        let mut body = buffered(2 * MAX_FRAME + 1);
        body.report_to(&handover);
        let (_, generation) = handover.delivery();
        let mut sizes = Vec::new();
        while !body.is_end_stream() {
            assert_eq!(handover.delivery().0, Delivery::Sending, "whole before the last frame");
            let frame = body.frame().await.unwrap().unwrap();
            sizes.push(frame.into_data().unwrap().len());
        }
        assert_eq!(sizes, [MAX_FRAME, MAX_FRAME, 1]);
        assert_eq!(handover.delivery(), (Delivery::Whole, generation));
        handover.delivered(generation).await;
        drop(body);
        assert_eq!(handover.delivery().0, Delivery::Whole, "a body sent whole is not cut by its drop");

        assert!(handover.renew());
        let mut first = buffered(3 * MAX_FRAME);
        first.report_to(&handover);
        first.frame().await.unwrap().unwrap();
        assert!(!handover.renew(), "a body still going out keeps its handover");
        let mut again = first.twin().unwrap();
        again.report_to(&handover);
        let (_, second) = handover.delivery();
        drop(first);
        assert_eq!(handover.delivery(), (Delivery::Sending, second), "the old try's end counts for nothing");
        drop(again);
        assert_eq!(handover.delivery(), (Delivery::Cut, second));
        RequestBody::empty().report_to(&handover);
        assert_eq!(handover.delivery(), (Delivery::Cut, second), "an empty body has nothing to tell");
    }

    #[test]
    fn a_body_takes_from_its_connection_share_and_the_budget_or_from_neither() {
        let budget = BufferBudget::new(100);
        let (one, other) = (BufferBudget::new(60), BufferBudget::new(60));
        let mut a = Held::new(&budget, &one);
        a.take(50).unwrap();
        // The connection's share runs out first, and the budget is untouched.
        let mut b = Held::new(&budget, &one);
        assert_eq!(b.take(20), Err(BudgetFull::Connection(60)));
        assert_eq!((budget.used(), one.used()), (50, 50));
        // Another connection has a share of its own, but the budget is shared:
        // a refusal there hands the share back.
        let mut c = Held::new(&budget, &other);
        c.take(50).unwrap();
        let mut d = Held::new(&budget, &other);
        assert_eq!(d.take(5), Err(BudgetFull::Process(100)));
        assert_eq!((budget.used(), other.used()), (100, 50));
        drop((a, b, c, d));
        assert_eq!((budget.used(), one.used(), other.used()), (0, 0, 0));
    }

    /// The reader's and the budget's errors answer as the request path's
    /// own did: 413 with nothing sent, 503 for either budget.
    #[test]
    fn a_failed_read_is_refused_as_before() {
        let too_large = ProxyError::from(ReadError::TooLarge { limit: 5 });
        assert!(matches!(too_large, ProxyError::BodyTooLarge { limit: 5, partly_sent: false }));
        let full = ProxyError::from(ReadError::BufferFull(BudgetFull::Process(9)));
        assert!(matches!(full, ProxyError::BufferFull(9)));
        assert!(matches!(ProxyError::from(BudgetFull::Connection(7)), ProxyError::ConnectionBufferFull(7)));
    }
}
