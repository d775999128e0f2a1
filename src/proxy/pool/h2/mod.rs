//! Upstream HTTP/2 connections (route `upstream_http2 = true`): many requests
//! at once on one connection, shared by every client connection, HTTP/1.1
//! and HTTP/2 clients alike. Each is run by the worker thread that opened it;
//! a request looks at its own worker's first, then opens one if the route's
//! cap allows, and only then takes a stream on another worker's (whose
//! exchange wakes that worker's thread): a cap below the number of workers
//! starves none.
//!
//! A request takes a *stream* on the newest connection of its route (to the
//! same upstream) that has one free: fewer than the upstream allows at once
//! (its `SETTINGS_MAX_CONCURRENT_STREAMS`, 100 until it says) and never more
//! than [`MAX_STREAMS`]. A stream is counted from then until the response
//! body has ended or been dropped, or the request failed: what the upstream
//! counts too, so no request waits unsent inside hyper for a stream.
//! Requests that find a connection still being opened take their stream on
//! it and wait for it: a burst opens one connection, not one per request.
//! When no connection has a stream free, the request opens another within the
//! route's `max_upstream_connections` (each connection holds one slot until
//! it closes, as an HTTP/1.1 one does); at the cap it waits up to
//! `queue_timeout` for a stream to end or a slot to free, then is refused
//! (503 `upstream-busy`) with nothing sent. Connections without a stream
//! close after `upstream_idle_timeout`, or at once while a request waits for
//! their slot. A connection is opened by a task of its own, which then runs
//! it: a request that gives up while it opens takes no one else's way with
//! it. One whose request went past the route's timeout takes no new stream
//! (the upstream may be gone) and closes once its streams end.
//!
//! There are no per-client-connection shares here (see upstream.rs for
//! HTTP/1.1 upstreams): a client connection holds at most as many streams as
//! it has requests in flight (one over HTTP/1.1, `max_concurrent_streams`
//! over HTTP/2), never a whole connection. Flow control keeps a stream whose
//! client does not read its response from stalling the others: each stream
//! may have [`STREAM_WINDOW`] bytes unread here, and the connection's window
//! is every stream's at once.
//!
//! What reached the upstream:
//! - a request the connection hands back unsent (it was closing) goes out
//!   again, once;
//! - a stream the upstream refused (`RST_STREAM` with `REFUSED_STREAM`), or
//!   one above the last stream a `GOAWAY` says it processed, was not
//!   processed (RFC 9113 §8.7): it goes out again, once, if its body can be
//!   sent again; otherwise 502, and a fenced write's key is not held;
//! - any other failure after sending leaves the outcome unknown, as on
//!   HTTP/1.1.
//!
//! Protocol upgrades are not carried to an HTTP/2 upstream: the forward drops
//! `Upgrade` (mod.rs).

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::Poll;
use std::time::Duration;

use http::uri::Authority;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::connect::open_with_retries;
use super::slots::{Pool, Slot, UpstreamSlots, Waiting};
use crate::body::{Handover, RequestBody};
use crate::proxy::error::UpstreamError;
use crate::proxy::teardown::{Resettable, Teardown};
use crate::proxy::tls::UpstreamTls;
use crate::server::connection::WokenOnly;

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

/// Every upstream HTTP/2 connection, newest last. A request looks at its own
/// worker thread's first (their tasks run there: no wake crosses threads),
/// then at the others': a route's cap may be below the number of workers.
static SHARED: Mutex<Vec<Arc<Multiplexed>>> = Mutex::new(Vec::new());

/// One upstream HTTP/2 connection, run by the worker thread that opened it.
pub(super) struct Multiplexed {
    authority: Authority,
    route: Arc<Pool>,
    worker: std::thread::ThreadId,
    /// Takes no new stream: one of its requests went past the route's
    /// timeout, so the upstream may be gone; it closes once its streams end.
    retired: std::sync::atomic::AtomicBool,
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
    teardown: Teardown,
}

impl Multiplexed {
    fn is_closed(&self) -> bool {
        self.open.load(Ordering::Acquire) == CLOSED
            || self.sender.lock().unwrap_or_else(PoisonError::into_inner).as_ref().is_some_and(Sender::is_closed)
    }

    /// A stream on this connection, if it has one free.
    fn enter(self: &Arc<Self>) -> Option<Stream> {
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
pub struct StreamHeld(#[allow(dead_code)] Arc<Stream>);

impl std::fmt::Debug for StreamHeld {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StreamHeld")
    }
}

pub(super) struct Stream(Arc<Multiplexed>);

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

/// How a request reaches an HTTP/2 upstream.
pub(super) enum Way {
    /// A stream on a connection that is open or being opened.
    Stream(Arc<Multiplexed>, Stream),
    /// A slot for a new connection.
    New(Slot),
}

/// A stream on a connection of the route of `slots` to `authority`, or a
/// slot for a new one; at the cap, waits up to `wait` for either. Nothing is
/// sent yet, so a refusal here leaves the upstream untouched.
pub(super) async fn checkout(
    authority: &Authority,
    slots: &UpstreamSlots,
    wait: Duration,
) -> Result<Way, UpstreamError> {
    let route = slots.pool();
    // This worker's connections, then a new one, then another worker's: a
    // connection of this worker's keeps the exchange on this thread.
    if let Some((mux, stream)) = take(route, authority, Workers::This) {
        return Ok(Way::Stream(mux, stream));
    }
    let started = Instant::now();
    let deadline = started + wait;
    loop {
        if let Ok(permit) = route.free.clone().try_acquire_owned() {
            return Ok(Way::New(Slot::of_route(slots, permit)));
        }
        if let Some((mux, stream)) = take(route, authority, Workers::Any) {
            return Ok(Way::Stream(mux, stream));
        }
        let _waiting = Waiting::enter(&route.waiting);
        route.shed.notify_waiters();
        let mut freed = pin!(route.freed.notified());
        freed.as_mut().enable();
        if let Some((mux, stream)) = take(route, authority, Workers::Any) {
            return Ok(Way::Stream(mux, stream));
        }
        tokio::select! {
            permit = route.free.clone().acquire_owned() => {
                let permit = permit.map_err(|_| UpstreamError::busy(route.cap, started.elapsed()))?;
                return Ok(Way::New(Slot::of_route(slots, permit)));
            }
            () = freed => {
                if let Some((mux, stream)) = take(route, authority, Workers::Any) {
                    return Ok(Way::Stream(mux, stream));
                }
            }
            () = tokio::time::sleep_until(deadline) => return Err(UpstreamError::busy(route.cap, started.elapsed())),
        }
    }
}

/// Whose connections [`take`] looks at.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Workers {
    /// This worker thread's.
    This,
    /// Any worker's, this one's first.
    Any,
}

/// A stream on the newest connection of `route` to `authority` with one
/// free, among `workers`' connections; closed connections met on the way are
/// dropped.
fn take(route: &Arc<Pool>, authority: &Authority, workers: Workers) -> Option<(Arc<Multiplexed>, Stream)> {
    let here = std::thread::current().id();
    let mut shared = SHARED.lock().unwrap_or_else(PoisonError::into_inner);
    shared.retain(|mux| !mux.is_closed());
    let mut ours = shared
        .iter()
        .rev()
        .filter(|mux| Arc::ptr_eq(&mux.route, route) && mux.authority.as_str() == authority.as_str());
    let found = ours.clone().filter(|mux| mux.worker == here).find_map(|mux| mux.enter().map(|s| (mux.clone(), s)));
    match workers {
        Workers::This => found,
        Workers::Any => found.or_else(|| ours.find_map(|mux| mux.enter().map(|s| (mux.clone(), s)))),
    }
}

/// Sends `req` the way `checkout` gave; the response carries its stream
/// ([`StreamHeld`] in its extensions) until its body is done.
///
/// A request the upstream did not take is sent again on another connection
/// (or a new one, if a slot is free now: this request's timeout is running,
/// so it does not wait; a connection that refused a stream takes no new
/// one): once if the connection handed it back unsent (it was closing), and
/// once if the upstream refused it unprocessed and its body can be sent
/// again (read whole, or empty), then on a new connection first. An upstream that closes
/// a connection after so many requests (nginx's `keepalive_requests`) refuses
/// the streams above the last it took; those go out again.
pub(super) async fn send(
    way: Way,
    authority: &Authority,
    tls: Option<&UpstreamTls>,
    slots: &UpstreamSlots,
    mut req: Request<RequestBody>,
    handover: Option<&Arc<Handover>>,
) -> Result<Response<Incoming>, UpstreamError> {
    let (mut mux, mut stream) = match way {
        Way::Stream(mux, stream) => (mux, stream),
        Way::New(slot) => open(authority, tls, slot),
    };
    let overran = req.body_mut().watch_overrun();
    let (mut unsent_again, mut refused_again) = (true, true);
    // Why the request is being sent again, if the upstream refused it.
    let mut refusal = None;
    loop {
        let again = twin(&mut req);
        if let Some(handover) = handover {
            // Each try is a body of its own: the end of one refused counts for nothing.
            req.body_mut().report_to(handover);
            handover.went_on(mux.teardown.clone());
        }
        let sent = exchange(&mux, stream, req).await;
        if sent.as_ref().is_err_and(UpstreamError::is_refused) {
            mux.retired.store(true, Ordering::Release);
        }
        req = match sent {
            Ok(Exchanged::Answered(response)) => return Ok(response),
            Ok(Exchanged::Unsent(unsent)) if unsent_again => {
                tracing::debug!("upstream HTTP/2 connection was closing; sending on another");
                unsent_again = false;
                // The twin holds the body's budget share, if it was made.
                again.unwrap_or(*unsent)
            }
            Ok(Exchanged::Unsent(_)) => {
                return Err(UpstreamError::connect("the upstream closed its connections before the request was sent"));
            }
            // The connection that refused it is going away (GOAWAY) or
            // refusing work: it takes no new stream, so the request goes
            // elsewhere.
            Err(e) if e.is_refused() && refused_again => match again {
                Some(again) => {
                    tracing::debug!(error = %e, "the upstream refused a stream unprocessed; sending it again");
                    refused_again = false;
                    refusal = Some(e);
                    again
                }
                None => return Err(e),
            },
            Err(_) if overran.as_ref().is_some_and(|o| o.load(Ordering::Acquire)) => {
                return Err(UpstreamError::exchange(crate::body::Overran));
            }
            Err(e) => return Err(e),
        };
        let fresh = || {
            let permit = slots.pool().free.clone().try_acquire_owned().ok()?;
            Some(open(authority, tls, Slot::of_route(slots, permit)))
        };
        let next = if refusal.is_some() {
            // A refused stream goes out as the first stream of a new
            // connection when a slot is free: no limit on a connection's
            // streams (nginx's `keepalive_requests`) refuses it again there,
            // as one on another old connection might.
            fresh().or_else(|| take(slots.pool(), authority, Workers::Any))
        } else {
            take(slots.pool(), authority, Workers::Any).or_else(fresh)
        };
        (mux, stream) = match next {
            Some(next) => next,
            // No connection for it now: the upstream's refusal stands, if it
            // refused it (it reached the upstream, unprocessed).
            None => return Err(refusal.unwrap_or_else(|| UpstreamError::busy(slots.cap(), Duration::ZERO))),
        };
    }
}

/// `req` once more, if its body can be sent again.
fn twin(req: &mut Request<RequestBody>) -> Option<Request<RequestBody>> {
    let body = req.body_mut().twin()?;
    let mut again = Request::new(body);
    *again.method_mut() = req.method().clone();
    *again.uri_mut() = req.uri().clone();
    *again.version_mut() = req.version();
    *again.headers_mut() = req.headers().clone();
    Some(again)
}

enum Exchanged {
    Answered(Response<Incoming>),
    Unsent(Box<Request<RequestBody>>),
}

/// One request on `stream` of `mux`. If it is dropped before its answer
/// (the route's timeout ran out), the connection takes no new stream: the
/// upstream may be gone, and the next requests should not wait on it too.
async fn exchange(mux: &Multiplexed, stream: Stream, req: Request<RequestBody>) -> Result<Exchanged, UpstreamError> {
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

/// Opens a connection in `slot`, listed at once so the requests that come
/// meanwhile take a stream on it; the first stream is the caller's. It is
/// opened and then run by a task of its own, which holds the slot: a request
/// that gives up while it opens takes no one else's way with it.
fn open(authority: &Authority, tls: Option<&UpstreamTls>, slot: Slot) -> (Arc<Multiplexed>, Stream) {
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
    SHARED.lock().unwrap_or_else(PoisonError::into_inner).push(mux.clone());
    let (authority, tls, opening) = (authority.clone(), tls.cloned(), mux.clone());
    tokio::spawn(async move {
        match connect(&authority, tls.as_ref(), &opening.teardown).await {
            Ok((sender, conn)) => {
                *opening.sender.lock().unwrap_or_else(PoisonError::into_inner) = Some(sender);
                opening.opened.notify_waiters();
                drive(conn, slot, opening).await;
            }
            Err(e) => opening.close(Some(e.to_string())),
        }
    });
    (mux, stream)
}

/// TCP (and TLS, which must select `h2` by ALPN), then HTTP/2's handshake.
async fn connect(
    authority: &Authority,
    tls: Option<&UpstreamTls>,
    teardown: &Teardown,
) -> Result<(Sender, Connection), UpstreamError> {
    let stream = open_with_retries(authority, tls).await?;
    if let crate::stream::TcpOrTls::Tls(tls_stream) = &stream {
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
