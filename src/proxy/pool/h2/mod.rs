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
//! than [`MAX_STREAMS`](connection::MAX_STREAMS). A stream is counted from then until the response
//! body has ended or been dropped, or the request failed: what the upstream
//! counts too, so no request waits unsent inside hyper for a stream.
//! Requests that find a connection still being opened take their stream on
//! it and wait for it: a burst opens one connection, not one per request.
//! When no connection has a stream free, the request opens another within the
//! route's `max_upstream_connections` (each connection holds one slot until
//! it closes, as an HTTP/1.1 one does); at the cap it waits up to
//! `queue_timeout` for a stream to end or a slot to free, then is refused
//! (503 `upstream-busy`) with nothing sent. The connections themselves, their
//! flow control and when they close: `connection.rs`.
//!
//! There are no per-client-connection shares here (see `slots.rs` for
//! HTTP/1.1 upstreams): a client connection holds at most as many streams as
//! it has requests in flight (one over HTTP/1.1, `max_concurrent_streams`
//! over HTTP/2), never a whole connection.
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
//! `Upgrade` (`stack/forward/prepare.rs`).

mod connection;

use std::pin::pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use http::uri::Authority;
use http::{Request, Response};
use hyper::body::Incoming;
use tokio::time::Instant;

use super::slots::{Slot, Slots, UpstreamSlots, Waiting};
use crate::config::UpstreamTls;
use crate::http::{Handover, RequestBody};
use crate::proxy::error::UpstreamError;
pub use connection::StreamHeld;
use connection::{exchange, Exchanged, Multiplexed, Stream};

/// Every upstream HTTP/2 connection, newest last. A request looks at its own
/// worker thread's first (their tasks run there: no wake crosses threads),
/// then at the others': a route's cap may be below the number of workers.
static SHARED: Mutex<Vec<Arc<Multiplexed>>> = Mutex::new(Vec::new());

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
    let route = slots.route();
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
fn take(route: &Arc<Slots>, authority: &Authority, workers: Workers) -> Option<(Arc<Multiplexed>, Stream)> {
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
/// so it does not wait). A connection that hands a request back unsent, or
/// refuses a stream, takes no new one. A request handed back unsent (its
/// connection was closing) never left: it goes out again up to
/// [`UNSENT_TRIES`] times in all, since several connections may be closing at
/// once. One the upstream refused unprocessed goes out once more if its body
/// can be sent again (read whole, or empty), on a new connection first. An
/// upstream that closes a connection after so many requests (nginx's
/// `keepalive_requests`) refuses the streams above the last it took; those
/// go out again.
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
    let (mut unsent_tries, mut refused_again) = (1, true);
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
        if matches!(sent, Ok(Exchanged::Unsent(_))) || sent.as_ref().is_err_and(UpstreamError::is_refused) {
            mux.retired.store(true, Ordering::Release);
        }
        req = match sent {
            Ok(Exchanged::Answered(response)) => return Ok(response),
            Ok(Exchanged::Unsent(unsent)) if unsent_tries < UNSENT_TRIES => {
                tracing::debug!("upstream HTTP/2 connection was closing; sending on another");
                unsent_tries += 1;
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
                return Err(UpstreamError::exchange(crate::http::Overran));
            }
            Err(e) => return Err(e),
        };
        let fresh = || {
            let permit = slots.route().free.clone().try_acquire_owned().ok()?;
            Some(open(authority, tls, Slot::of_route(slots, permit)))
        };
        let next = if refusal.is_some() {
            // A refused stream goes out as the first stream of a new
            // connection when a slot is free: no limit on a connection's
            // streams (nginx's `keepalive_requests`) refuses it again there,
            // as one on another old connection might.
            fresh().or_else(|| take(slots.route(), authority, Workers::Any))
        } else {
            take(slots.route(), authority, Workers::Any).or_else(fresh)
        };
        (mux, stream) = match next {
            Some(next) => next,
            // No connection for it now: the upstream's refusal stands, if it
            // refused it (it reached the upstream, unprocessed).
            None => return Err(refusal.unwrap_or_else(|| UpstreamError::busy(slots.cap(), Duration::ZERO))),
        };
    }
}

/// Most times one request is handed to a connection that hands it back
/// unsent because it was closing: each such connection takes no new stream,
/// so a few tries find one that is open or open a new one.
const UNSENT_TRIES: u32 = 4;

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

/// Opens a connection in `slot`, listed at once so the requests that come
/// meanwhile take a stream on it; the first stream is the caller's.
fn open(authority: &Authority, tls: Option<&UpstreamTls>, slot: Slot) -> (Arc<Multiplexed>, Stream) {
    let (mux, stream) = Multiplexed::new(authority, &slot);
    SHARED.lock().unwrap_or_else(PoisonError::into_inner).push(mux.clone());
    connection::start(mux.clone(), tls, slot);
    (mux, stream)
}
