//! One upstream HTTP/2 connection: the streams in use on it, opening it,
//! one exchange on one of its streams, and the task that runs it. A
//! connection is opened by a task of its own, which then runs it: a request
//! that gives up while it opens takes no one else's way with it. Connections
//! without a stream close after `upstream_idle_timeout`, or at once while a
//! request waits for their slot. One whose request went past the route's
//! timeout takes no new stream (the upstream may be gone) and closes once
//! its streams end.
//!
//! Flow control keeps a stream whose client does not read its response from
//! stalling the others: each stream may have [`STREAM_WINDOW`] bytes unread
//! here, and the connection's window is every stream's at once.

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::Poll;

use http::uri::Authority;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::config::UpstreamTls;
use crate::http::teardown::{Resettable, Teardown};
use crate::http::RequestBody;
use crate::http::WokenOnly;
use crate::proxy::error::UpstreamError;
use crate::proxy::pool::connect::open_with_retries;
use crate::proxy::pool::slots::{Slot, Slots};

/// Most streams fencegate runs at once on one upstream connection, whatever
/// the upstream allows: the common servers' default or below it (nginx 128,
/// Apache 100, Go 250).
pub const MAX_STREAMS: usize = 100;
/// Response bytes one stream may have unread here before the upstream must
/// wait (HTTP/2's default window).
pub const STREAM_WINDOW: u32 = 65_535;
/// The connection's window: every stream's at once, so streams whose
/// responses are not read can't use up what the others need.
const CONNECTION_WINDOW: u32 = STREAM_WINDOW * MAX_STREAMS as u32;

/// [`Multiplexed::open`] once the connection takes no new stream.
const CLOSED: usize = usize::MAX;

type Sender = http2::SendRequest<RequestBody>;
type Connection = http2::Connection<TokioIo<Resettable>, RequestBody, TokioExecutor>;

/// One upstream HTTP/2 connection, run by the worker thread that opened it.
pub(in crate::proxy::pool) struct Multiplexed {
    pub(super) authority: Authority,
    pub(super) route: Arc<Slots>,
    pub(super) worker: std::thread::ThreadId,
    /// Takes no new stream: one of its requests went past the route's
    /// timeout, so the upstream may be gone; it closes once its streams end.
    pub(super) retired: std::sync::atomic::AtomicBool,
    /// `None` while the connection is being opened, and again once it closes.
    sender: Mutex<Option<Sender>>,
    /// Why opening it failed, for the requests that waited for it.
    failed: Mutex<Option<String>>,
    /// Streams in use, or [`CLOSED`].
    open: AtomicUsize,
    /// Streams the upstream allows at once, as last seen (at most [`MAX_STREAMS`]).
    limit: AtomicUsize,
    /// When the last stream ended.
    idle_since: Mutex<Instant>,
    /// Wakes the requests waiting for the connection to be opened.
    opened: Notify,
    /// Wakes the driver when the last stream ends.
    idle: Notify,
    /// Tears the connection down, every stream on it, for a request whose
    /// body did not go out within its route's timeout after its answer.
    pub(super) teardown: Teardown,
}

impl Multiplexed {
    /// A connection to `authority` in `slot`, still to be opened
    /// ([`start`]), with its first stream.
    pub(super) fn new(authority: &Authority, slot: &Slot) -> (Arc<Multiplexed>, Stream) {
        let mux = Arc::new(Multiplexed {
            authority: authority.clone(),
            route: slot.route.clone(),
            worker: std::thread::current().id(),
            retired: Default::default(),
            sender: Mutex::new(None),
            failed: Mutex::new(None),
            open: AtomicUsize::new(1),
            limit: AtomicUsize::new(MAX_STREAMS),
            idle_since: Mutex::new(Instant::now()),
            opened: Notify::new(),
            idle: Notify::new(),
            teardown: Teardown::new(true),
        });
        let stream = Stream(mux.clone());
        (mux, stream)
    }

    pub(super) fn is_closed(&self) -> bool {
        self.open.load(Ordering::Acquire) == CLOSED
            || self.sender.lock().unwrap_or_else(PoisonError::into_inner).as_ref().is_some_and(Sender::is_closed)
    }

    /// A stream on this connection, if it has one free.
    pub(super) fn enter(self: &Arc<Self>) -> Option<Stream> {
        if self.retired.load(Ordering::Acquire) {
            return None;
        }
        let limit = self.limit.load(Ordering::Acquire);
        self.open.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < limit).then_some(n + 1)).ok()?;
        Some(Stream(self.clone()))
    }

    /// Takes no new stream from now on, if none is in use.
    fn close_if_idle(&self) -> bool {
        if self.open.compare_exchange(0, CLOSED, Ordering::AcqRel, Ordering::Acquire).is_err() {
            return false;
        }
        self.sender.lock().unwrap_or_else(PoisonError::into_inner).take();
        true
    }

    /// Takes no new stream from now on, streams in use or not.
    fn close(&self, failed: Option<String>) {
        self.open.store(CLOSED, Ordering::Release);
        self.sender.lock().unwrap_or_else(PoisonError::into_inner).take();
        if failed.is_some() {
            *self.failed.lock().unwrap_or_else(PoisonError::into_inner) = failed;
        }
        self.opened.notify_waiters();
    }

    /// The connection's sender, once it is open.
    async fn sender(&self) -> Result<Sender, UpstreamError> {
        loop {
            let mut opened = pin!(self.opened.notified());
            opened.as_mut().enable();
            if let Some(sender) = self.sender.lock().unwrap_or_else(PoisonError::into_inner).clone() {
                return Ok(sender);
            }
            if self.open.load(Ordering::Acquire) == CLOSED {
                let failed = self.failed.lock().unwrap_or_else(PoisonError::into_inner).clone();
                let why = failed.unwrap_or_else(|| "the upstream connection closed before the request was sent".into());
                return Err(UpstreamError::connect(why));
            }
            opened.await;
        }
    }
}

/// One stream in use on an upstream HTTP/2 connection, until dropped: with
/// the response body, or with the request that failed.
#[derive(Clone)]
pub struct StreamHeld(Arc<Stream>);

impl StreamHeld {
    /// What a response body keeps until it is dropped.
    pub fn into_guard(self) -> crate::http::Guard {
        self.0
    }
}

impl std::fmt::Debug for StreamHeld {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StreamHeld")
    }
}

pub(in crate::proxy::pool) struct Stream(Arc<Multiplexed>);

impl Drop for Stream {
    fn drop(&mut self) {
        let mux = &self.0;
        let before = mux.open.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n != CLOSED).then(|| n - 1));
        if before == Ok(1) {
            *mux.idle_since.lock().unwrap_or_else(PoisonError::into_inner) = Instant::now();
            mux.idle.notify_one();
        }
        if mux.route.wanted() {
            mux.route.freed.notify_waiters();
        }
    }
}

/// Opens `mux` over `tls` and then runs it, on a task of its own which
/// holds `slot`: a request that gives up while it opens takes no one else's
/// way with it.
pub(super) fn start(mux: Arc<Multiplexed>, tls: Option<&UpstreamTls>, slot: Slot) {
    let tls = tls.cloned();
    tokio::spawn(async move {
        match connect(&mux.authority, tls.as_ref(), &mux.teardown).await {
            Ok((sender, conn)) => {
                *mux.sender.lock().unwrap_or_else(PoisonError::into_inner) = Some(sender);
                mux.opened.notify_waiters();
                drive(conn, slot, mux).await;
            }
            Err(e) => mux.close(Some(e.to_string())),
        }
    });
}

/// How one exchange on a stream ended, short of a failure.
pub(super) enum Exchanged {
    Answered(Response<Incoming>),
    Unsent(Box<Request<RequestBody>>),
}

/// One request on `stream` of `mux`. If it is dropped before its answer
/// (the route's timeout ran out), the connection takes no new stream: the
/// upstream may be gone, and the next requests should not wait on it too.
pub(super) async fn exchange(
    mux: &Multiplexed,
    stream: Stream,
    req: Request<RequestBody>,
) -> Result<Exchanged, UpstreamError> {
    let mut sender = mux.sender().await?;
    let waiting = Retire(&mux.retired);
    let sent = sender.try_send_request(req).await;
    std::mem::forget(waiting);
    match sent {
        Ok(mut response) => {
            response.extensions_mut().insert(StreamHeld(Arc::new(stream)));
            Ok(Exchanged::Answered(response))
        }
        Err(mut e) => match e.take_message() {
            Some(unsent) => Ok(Exchanged::Unsent(Box::new(unsent))),
            None => {
                let e = e.into_error();
                if refused_unprocessed(&e) {
                    Err(UpstreamError::refused(e))
                } else {
                    Err(UpstreamError::exchange(e))
                }
            }
        },
    }
}

/// Retires its connection if dropped (see [`exchange`]).
struct Retire<'a>(&'a std::sync::atomic::AtomicBool);

impl Drop for Retire<'_> {
    fn drop(&mut self) {
        tracing::debug!("an upstream HTTP/2 exchange was given up; its connection takes no new stream");
        self.0.store(true, Ordering::Release);
    }
}

/// Whether the upstream said it did not process the stream: `RST_STREAM`
/// with `REFUSED_STREAM`, or a `GOAWAY` whose last processed stream is below
/// it (h2 gives such streams the `GOAWAY`'s error; streams the upstream may
/// have processed end otherwise).
fn refused_unprocessed(e: &hyper::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if let Some(h2) = s.downcast_ref::<h2::Error>() {
            return h2.is_remote() && (h2.is_go_away() || h2.reason() == Some(h2::Reason::REFUSED_STREAM));
        }
        source = s.source();
    }
    false
}

/// TCP (and TLS, which must select `h2` by ALPN), then HTTP/2's handshake.
async fn connect(
    authority: &Authority,
    tls: Option<&UpstreamTls>,
    teardown: &Teardown,
) -> Result<(Sender, Connection), UpstreamError> {
    let stream = open_with_retries(authority, tls).await?;
    if let crate::http::stream::TcpOrTls::Tls(tls_stream) = &stream {
        let alpn = tls_stream.get_ref().1.alpn_protocol();
        if alpn != Some(b"h2".as_slice()) {
            let offered = alpn.map(String::from_utf8_lossy).unwrap_or_else(|| "nothing".into());
            crate::telemetry::warn_limited!(
                upstream = %authority, selected = %offered,
                "the upstream did not agree to HTTP/2 in the TLS handshake (ALPN); answering 502"
            );
            return Err(UpstreamError::connect(format!(
                "the upstream did not agree to HTTP/2 in the TLS handshake (ALPN: it selected {offered}, not h2)"
            )));
        }
    }
    http2::Builder::new(TokioExecutor::new())
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .handshake(TokioIo::new(Resettable::new(stream, teardown)))
        .await
        .map_err(UpstreamError::connect)
}

/// What woke a connection's driver.
enum Woken {
    Ended,
    /// A request asked for the connection to be torn down.
    TornDown,
    /// The last stream ended, or a request started waiting for a slot.
    Look,
    IdleCheck,
}

/// Runs one upstream connection until it ends, holding its slot; closes it
/// once it has no stream while a request waits for that slot, or once it has
/// had none for the route's `upstream_idle_timeout`.
async fn drive(conn: Connection, slot: Slot, mux: Arc<Multiplexed>) {
    let mut conn = pin!(conn);
    let mut idle_check = pin!(tokio::time::sleep(slot.idle_timeout));
    let teardown = mux.teardown.clone();
    let mut torn_down = pin!(teardown.asked());
    loop {
        let mut idle = pin!(mux.idle.notified());
        let mut asks = pin!(slot.route.shed.notified());
        let mut watchers = pin!(WokenOnly::new(std::future::poll_fn(|cx| {
            if torn_down.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Woken::TornDown);
            }
            if idle_check.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Woken::IdleCheck);
            }
            if idle.as_mut().poll(cx).is_ready() | asks.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Woken::Look);
            }
            Poll::Pending
        })));
        let woken = std::future::poll_fn(|cx| {
            if let Poll::Ready(ended) = conn.as_mut().poll(cx) {
                if let Err(e) = ended {
                    tracing::debug!(error = %e, "upstream HTTP/2 connection ended with an error");
                }
                return Poll::Ready(Woken::Ended);
            }
            let limit = conn.current_max_send_streams().clamp(1, MAX_STREAMS);
            mux.limit.store(limit, Ordering::Release);
            watchers.as_mut().poll(cx)
        })
        .await;
        match woken {
            Woken::Ended => {
                mux.close(None);
                return;
            }
            // Dropping the connection closes its socket with a reset
            // (`Resettable`); its other streams fail, their outcome unknown.
            Woken::TornDown => {
                tracing::debug!(
                    "tearing an upstream HTTP/2 connection down: a request body on it was not sent in time"
                );
                mux.close(Some("the upstream connection was torn down".into()));
                return;
            }
            Woken::Look => {
                if (slot.wanted() || mux.retired.load(Ordering::Acquire)) && mux.close_if_idle() {
                    tracing::debug!("closing an idle upstream HTTP/2 connection: a request waits for its slot");
                    return;
                }
            }
            Woken::IdleCheck => {
                let now = Instant::now();
                let since = *mux.idle_since.lock().unwrap_or_else(PoisonError::into_inner);
                let idle_for = slot.idle_timeout;
                if now >= since + idle_for && mux.close_if_idle() {
                    tracing::debug!("closing an upstream HTTP/2 connection idle for upstream_idle_timeout");
                    return;
                }
                // Busy, or idle since less than the timeout.
                idle_check.as_mut().reset(if now >= since + idle_for { now + idle_for } else { since + idle_for });
            }
        }
    }
}
