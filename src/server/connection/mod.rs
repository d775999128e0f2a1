//! Serving one client connection, from its first byte to its close, with the
//! guards against clients that hold a slot without making progress: a request
//! head that never completes (slowloris), a keep-alive connection that sits
//! idle, and a client that does not let an idle connection close.
//!
//! [`Activity`] is fed from two sides: [`ActivityIo`] (io.rs) sees bytes
//! arrive, and [`TrackRequestsLayer`] (requests.rs) sees requests start and
//! finish. [`Activity::expired`] resolves when either guard trips; [`serve`]
//! then closes the connection (at once for a stuck head, gracefully for an
//! idle one), and [`Activity::overstayed`] tells it when a graceful close has
//! taken too long.
//!
//! # What must arrive in time
//!
//! Every connection, whatever it starts with, is timed from its first byte:
//! until what is arriving is complete, `header_read_timeout` runs. On an HTTP/1
//! connection that is the request head (its end is the request starting). A
//! connection whose first bytes are a prefix of the HTTP/2 connection preface
//! is timed the same way, and turns into an HTTP/1 connection, clock running,
//! at the first byte that departs from it. After the full preface,
//! [`ActivityIo`] follows the HTTP/2 frame boundaries (frames.rs) and times,
//! while no request is in flight, each *unit* from its first byte to its last:
//!
//! - a **head**: the preface with the client's first frame (its SETTINGS), or
//!   a header block (HEADERS or PUSH_PROMISE up to the frame with END_HEADERS).
//!   Like an HTTP/1 head it is the start of work: while it arrives the
//!   connection is not idle, and its end restarts the idle clock;
//! - any other **frame** (PING, WINDOW_UPDATE, SETTINGS, ...): it must arrive
//!   whole within `header_read_timeout` too, but it is not work: the idle
//!   clock keeps running, so a client that trickles frames is still closed
//!   after `idle_timeout`. Complete frames between requests cost nothing.
//!
//! With a request in flight nothing is timed here (the route's timeouts
//! govern), and a unit left incomplete when the last request finishes is timed
//! from that moment. How one timer keeps every deadline without being touched
//! per request is in activity.rs.
//!
//! # Closing
//!
//! A connection whose last [`REFUSALS_IN_A_ROW`](activity::REFUSALS_IN_A_ROW)
//! answers all refused a request for its head (400, 429, 431) closes at once:
//! see [`Activity::answered`]. So does an HTTP/1 connection whose refused
//! request body was drained past the drain's bounds (drain.rs); bytes of a
//! body being drained are not a request head. An idle HTTP/1 connection closes at once. An idle HTTP/2 connection gets
//! GOAWAY and a PING, and closes once the client has answered the PING; a
//! client that never answers would keep it open for ever. So a connection
//! asked to close gracefully (idle, or at shutdown) that has not ended
//! [`Activity::close_grace`] after that, with no request in flight, is closed
//! at once. A request in flight is never cut by this: it finishes first, and
//! only the end of the shutdown grace cuts it.
//!
//! # Resting
//!
//! An idle HTTP/1.1 keep-alive connection costs what hyper keeps for it
//! between requests: a read buffer and a write buffer (8 to 16 KiB each) and
//! its state machine. Once a proxy connection has been idle for
//! [`REST_AFTER`](activity::REST_AFTER) (at most `header_read_timeout` later:
//! the timer is lazy), it rests (resting.rs): hyper's connection is taken
//! apart, its buffers freed, and the socket waits bare for the client's next
//! bytes, which start a new hyper connection with the same service (and so
//! the same per-connection limits). A connection only rests when hyper holds
//! nothing but its idle state: no request in flight, every request body read
//! to its end (a body hyper still reads or discards would otherwise be read
//! as a new request), every response byte flushed (a client that does not
//! read its response keeps hyper's state), no head arriving. Bytes hyper had
//! read and not parsed are read again first. HTTP/2 connections, TLS
//! connections (rustls keeps its state, and may hold decrypted bytes a wait
//! on the bare socket would miss) and the admin listener's do not rest. A
//! resting connection is still timed by
//! `idle_timeout` and closed at its end.
//!
//! `activity` and `frames` use each other: the frame reader tells the
//! activity what it read, in the units the activity counts.

mod activity;
mod drain;
mod frames;
mod io;
mod requests;
mod resting;
mod stream;
#[cfg(test)]
mod testing;

use std::fmt::Display;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper_util::server::graceful::GracefulConnection;
use tokio::time::Instant;
use tracing::debug;

use activity::Expiry;
pub(crate) use activity::{Activity, REFUSALS_IN_A_ROW};
pub(crate) use io::ActivityIo;
pub(crate) use requests::TrackRequestsLayer;
pub use resting::give_back_memory_with;
pub(crate) use resting::{Protocols, ProxyConnection};
pub(crate) use stream::ClientStream;

use super::guard::Admission;
use crate::http::WokenOnly;

/// A client connection as [`serve`] drives it.
pub(crate) trait ClientConnection: Future<Output = Result<(), Self::Error>> {
    type Error: Display;

    /// Close once the requests in flight are done.
    fn graceful_shutdown(self: Pin<&mut Self>);

    /// Whether the connection ended with `error` because the client abused
    /// it (HTTP/2's GOAWAY for too many resets or refused streams).
    fn abused(_error: &Self::Error) -> bool {
        false
    }

    /// The connection has been idle for [`REST_AFTER`](activity::REST_AFTER):
    /// give back what it holds between requests, if it can (see
    /// [Resting](self#resting)).
    fn rest(self: Pin<&mut Self>) {}
}

pin_project_lite::pin_project! {
    /// A hyper-util connection (the admin listener's): it never rests.
    pub(crate) struct Graceful<C> {
        #[pin]
        inner: C,
    }
}

impl<C> Graceful<C> {
    pub(crate) fn new(inner: C) -> Graceful<C> {
        Graceful { inner }
    }
}

impl<C: GracefulConnection> Future for Graceful<C> {
    type Output = Result<(), C::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.project().inner.poll(cx)
    }
}

impl<C: GracefulConnection> ClientConnection for Graceful<C>
where
    C::Error: Display,
{
    type Error = C::Error;

    fn graceful_shutdown(self: Pin<&mut Self>) {
        self.project().inner.graceful_shutdown();
    }
}

/// Serves one client connection until it ends, closing it when a guard trips
/// (a stuck request head or a run of refusals at once, an idle connection
/// gracefully) or when
/// shutdown begins (gracefully: the request in flight finishes first). A
/// graceful close the client does not let happen (an HTTP/2 client that never
/// answers the closing PING) becomes an abrupt one once the connection has no
/// request in flight and its close grace has passed; requests in flight are
/// cut only when the shutdown grace runs out. The connection's slot is given
/// back when this returns, with how it ended.
pub(crate) async fn serve<C>(conn: C, activity: Arc<Activity>, admission: Admission, peer: SocketAddr) -> Ended
where
    C: ClientConnection,
{
    tokio::pin!(conn);
    // When the graceful close began.
    let mut closing: Option<Instant> = None;
    let mut ended = None;
    loop {
        // What the connection's guards and shutdown say, looked at only when
        // one of them woke the task (http/woken.rs): the connection wakes it
        // several times a request.
        let watchers = WokenOnly::new(async {
            tokio::select! {
                // In this order when several are ready at once, as before.
                biased;
                expiry = activity.expired(), if closing.is_none() => Watched::Expired(expiry),
                // Refused again and again: whatever the connection is doing,
                // nothing it sends is worth reading (see Activity::answered).
                () = activity.refusing() => Watched::Refusing,
                // A refused HTTP/1 body went past the drain's bounds: hyper
                // would wait for its next bytes (drain.rs).
                () = activity.drained_past_bounds() => Watched::DrainStopped,
                () = admission.closing(), if closing.is_none() => Watched::Closing,
                // Shutdown always asks for a graceful close first, so only a
                // closing connection needs to listen for the cut.
                () = admission.cut(), if closing.is_some() => Watched::Cut,
                () = activity.overstayed(closing.unwrap_or_else(Instant::now)), if closing.is_some() => Watched::Overstayed,
            }
        });
        let watched = tokio::select! {
            // The connection first: it is what wakes this task on every request.
            biased;
            result = conn.as_mut() => {
                if let Err(e) = result {
                    debug!(%peer, error = %e, "client connection ended with an error");
                    if C::abused(&e) {
                        ended = Some(Ended::Abused);
                    }
                }
                break;
            }
            watched = watchers => watched,
        };
        match watched {
            Watched::Expired(Expiry::SlowHead) => {
                debug!(%peer, "closing a connection whose request head did not arrive in time");
                break;
            }
            Watched::Expired(Expiry::Idle) | Watched::Closing => {
                conn.as_mut().graceful_shutdown();
                closing = Some(Instant::now());
            }
            Watched::Expired(Expiry::Rest) => conn.as_mut().rest(),
            Watched::Refusing => {
                debug!(%peer, "closing a connection whose requests keep being refused");
                ended = Some(Ended::Abused);
                break;
            }
            Watched::DrainStopped => {
                debug!(%peer, "closing a connection whose refused request body went past the drain's bounds");
                break;
            }
            Watched::Cut => {
                debug!(%peer, "closing a connection still busy when the shutdown grace ran out");
                break;
            }
            Watched::Overstayed => {
                debug!(%peer, "closing a connection whose client did not let it close gracefully");
                break;
            }
        }
    }
    drop(admission);
    // What the connection held is freed now: have it returned to the system
    // (after an HTTP/2 flood, tens of MiB), as a rest's is.
    resting::give_back_soon();
    ended.unwrap_or(Ended::Closed { refusals: activity.refusal_run() })
}

/// What woke [`serve`] besides its connection.
enum Watched {
    Expired(Expiry),
    Refusing,
    DrainStopped,
    Closing,
    Cut,
    Overstayed,
}

/// How a client connection ended, as far as its address's record cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// Closed by either side for any reason but abuse, its last `refusals`
    /// answers refusing its requests (a client that closes just short of
    /// [`REFUSALS_IN_A_ROW`] is counted across its connections).
    Closed { refusals: u32 },
    /// Closed because its requests kept being refused, or by HTTP/2 for
    /// too many resets or refused streams.
    Abused,
}
