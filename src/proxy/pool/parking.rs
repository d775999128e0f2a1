//! Idle HTTP/1.1 upstream connections, parked for the next request under the
//! route they were opened for, from the moment their response head has come:
//! - for an HTTP/1.1 client, in its worker thread's spares: any HTTP/1.1
//!   client connection of that worker takes the most recently parked one that
//!   is free, before it opens one. A client that sends one request at a time
//!   usually gets its own connection back, and clients that come and go don't
//!   each cost the upstream a connection (as nginx's `keepalive` cache). The
//!   spares are a plain list on the worker's thread: no lock, no hash, and
//!   the upstream exchange stays on the thread that serves the client.
//! - for an HTTP/2 client, with the client connection, which needs as many as
//!   it has requests in flight at once; they close with it. They are not
//!   shared: the client connection's share of the route's slots (`slots.rs`)
//!   bounds the connections its streams can pin, so its streams must not run
//!   on connections counted in another client's share.
//!
//! A connection parked while a request waits for its slot closes instead.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use http::uri::Authority;
use hyper::client::conn::http1;
use tokio::time::Instant;

use super::slots::{Slot, Slots};
use crate::http::teardown::Teardown;
use crate::http::RequestBody;

/// Idle upstream connections one client connection keeps at most; an HTTP/2
/// burst beyond this opens connections that close after their request.
const MAX_IDLE: usize = 32;
/// Idle upstream connections one worker thread keeps for its HTTP/1.1
/// clients, over every route (each also counts in its route's cap, 256 by
/// default); one parked beyond this closes the oldest.
pub const MAX_SPARE: usize = 256;

thread_local! {
    /// This worker thread's spare upstream connections, newest last.
    static SPARE: std::cell::RefCell<Vec<Kept>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// What a request is handed to an HTTP/1.1 upstream connection by.
pub(super) type Sender = http1::SendRequest<RequestBody>;

/// An upstream connection's sender while no request uses it, and the route
/// it was opened for. The client connection owns the cell; the connection's
/// driver task only looks into it, to close the connection if it is idle
/// when a request waits for its slot.
pub(super) struct Parked {
    /// Where the connection goes: a clone of its route's upstream authority,
    /// made once, not at each park.
    authority: Authority,
    /// The sender while parked, and when it was last parked: one lock for
    /// both, taken once per park.
    cell: Mutex<Cell>,
    route: Arc<Slots>,
    share: Option<Arc<Slots>>,
    /// Tears the connection down, for a request that went past its route's
    /// timeout on it.
    teardown: Teardown,
}

impl Parked {
    /// The cell of a new connection to `authority` in `slot`, torn down by
    /// `teardown`; empty until its sender is first parked.
    pub(super) fn new(authority: &Authority, slot: &Slot, teardown: Teardown) -> Arc<Parked> {
        Arc::new(Parked {
            authority: authority.clone(),
            cell: Mutex::new(Cell { sender: None, parked_at: Instant::now() }),
            route: slot.route.clone(),
            share: slot.share.clone(),
            teardown,
        })
    }

    /// The connection's off switch.
    pub(super) fn teardown(&self) -> &Teardown {
        &self.teardown
    }

    fn cell(&self) -> MutexGuard<'_, Cell> {
        self.cell.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Since when the sender has been parked, if it is.
    pub(super) fn parked_since(&self) -> Option<Instant> {
        let cell = self.cell();
        cell.sender.is_some().then_some(cell.parked_at)
    }

    /// Takes the sender out if it is parked and has finished its last
    /// response: the connection may then close without cutting anything.
    pub(super) fn take_if_idle(&self) -> Option<Sender> {
        let mut cell = self.cell();
        if cell.sender.as_ref().is_some_and(Sender::is_ready) {
            cell.sender.take()
        } else {
            None
        }
    }
}

/// What [`Parked`] keeps under its lock.
struct Cell {
    sender: Option<Sender>,
    /// When the sender was last parked.
    parked_at: Instant,
}

/// Where a request's upstream connection is parked after its response.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Parking {
    /// The worker thread's spares: an HTTP/1.1 client's.
    Worker,
    /// The client connection's own: an HTTP/2 client's.
    Client,
    /// The worker thread's HTTP/2 connections, many requests on each: any
    /// client's on a route with `upstream_http2` (`h2/`).
    Multiplexed,
}

/// One client connection's own idle upstream connections (an HTTP/2
/// client's), newest last.
#[derive(Default)]
pub(super) struct Idle(Mutex<Vec<Kept>>);

/// A kept connection: the cell its sender is parked in (which knows where
/// it goes).
type Kept = Arc<Parked>;

impl Parking {
    /// An idle, still open connection to `authority` opened for `route`, that
    /// has finished its last response, from where this says (`own`: the
    /// client connection's); closed ones are dropped, and ones still sending
    /// a response body are left for later: at the cap a request then waits
    /// for a slot instead of being refused by a busy connection.
    pub(super) fn take(self, own: &Idle, route: &Arc<Slots>, authority: &Authority) -> Option<(Arc<Parked>, Sender)> {
        match self {
            Parking::Worker => SPARE.with(|spare| take_from(&mut spare.borrow_mut(), route, authority)),
            // h2/ keeps those.
            Parking::Multiplexed => None,
            Parking::Client => take_from(&mut own.0.lock().unwrap_or_else(PoisonError::into_inner), route, authority),
        }
    }

    /// Keeps `sender` for the next request, where this says (`own`: the
    /// client connection's). It may still be finishing this one's response
    /// body; a request that finds it busy gets the request back unsent and
    /// opens another.
    pub(super) fn put_back(self, own: &Idle, parked: Arc<Parked>, sender: Sender) {
        *parked.cell() = Cell { sender: Some(sender), parked_at: Instant::now() };
        // Its driver looks for waiters only when the connection turns idle; if
        // that happened before it was parked, look here.
        if super::slots::wanted(&parked.route, parked.share.as_deref()) && parked.take_if_idle().is_some() {
            return;
        }
        match self {
            Parking::Worker => SPARE.with(|spare| {
                let mut spare = spare.borrow_mut();
                if spare.len() >= MAX_SPARE {
                    // The oldest goes; dropping its cell closes the connection.
                    spare.remove(0);
                }
                spare.push(parked);
            }),
            Parking::Multiplexed => {}
            Parking::Client => {
                let mut idle = own.0.lock().unwrap_or_else(PoisonError::into_inner);
                if idle.len() < MAX_IDLE {
                    idle.push(parked);
                }
            }
        }
    }
}

/// From `kept`, the newest idle, still open connection to `authority` opened
/// for `route` that has finished its last response. Closed ones met on the
/// way are dropped; the search usually ends at the last one.
fn take_from(kept: &mut Vec<Kept>, route: &Arc<Slots>, authority: &Authority) -> Option<(Arc<Parked>, Sender)> {
    let mut at = kept.len();
    while at > 0 {
        at -= 1;
        let parked = &kept[at];
        let mut cell = parked.cell();
        match cell.sender.as_ref() {
            Some(s) if s.is_closed() => {}
            None => {}
            // The same route's, so the same upstream: its authority is a
            // clone of the route's, compared byte for byte (`==` on two
            // authorities ignores case: slower, see docs/perf-log.md).
            Some(s)
                if s.is_ready()
                    && Arc::ptr_eq(&parked.route, route)
                    && parked.authority.as_str() == authority.as_str() =>
            {
                let taken = cell.sender.take();
                drop(cell);
                let parked = kept.remove(at);
                return taken.map(|sender| (parked, sender));
            }
            // Busy (still sending its last response), or another route's.
            Some(_) => continue,
        }
        drop(cell);
        kept.remove(at);
    }
    None
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use hyper_util::rt::TokioIo;
    use tokio::io::DuplexStream;

    use super::super::testing::request;
    use super::*;
    use crate::proxy::UpstreamSlots;

    /// The sender of a new connection over an in-memory pipe, ready for a
    /// request, and the upstream's end of the pipe: dropping it closes the
    /// connection.
    async fn connection() -> (Sender, DuplexStream) {
        let (ours, theirs) = tokio::io::duplex(4096);
        let (mut sender, conn) = http1::handshake(TokioIo::new(ours)).await.unwrap();
        tokio::spawn(conn);
        sender.ready().await.unwrap();
        (sender, theirs)
    }

    /// A connection of the route of `slots`, in its own slot (held by the
    /// driver in the pool), with its cell.
    async fn parked(slots: &UpstreamSlots) -> (Arc<Parked>, Sender, Slot, DuplexStream) {
        let slot = Slot::of_route(slots, slots.route().free.clone().try_acquire_owned().unwrap());
        let (sender, theirs) = connection().await;
        (Parked::new(&Authority::from_static("upstream:80"), &slot, Teardown::new(false)), sender, slot, theirs)
    }

    /// A client connection's kept connections are taken newest first, only
    /// by their own route, only once their last response has ended; closed
    /// ones met on the way are dropped.
    #[tokio::test]
    async fn the_newest_idle_connection_of_the_route_is_taken_and_closed_ones_are_dropped() {
        let authority = Authority::from_static("upstream:80");
        let (route, other) =
            (UpstreamSlots::new(8, Duration::from_secs(60)), UpstreamSlots::new(8, Duration::from_secs(60)));
        let own = Idle::default();
        let (closed, closed_sender, _s0, closed_upstream) = parked(&route).await;
        let closed_cell = closed.clone();
        Parking::Client.put_back(&own, closed, closed_sender);
        let (newest_idle, idle_sender, _s1, _u1) = parked(&route).await;
        let newest_idle_cell = Arc::downgrade(&newest_idle);
        Parking::Client.put_back(&own, newest_idle, idle_sender);
        let (others, others_sender, _s2, _u2) = parked(&other).await;
        Parking::Client.put_back(&own, others, others_sender);
        let (busy, mut busy_sender, _s3, _u3) = parked(&route).await;
        // A request on it that is never answered: its response is still coming.
        let _answer = busy_sender.send_request(request());
        tokio::task::yield_now().await;
        Parking::Client.put_back(&own, busy, busy_sender);
        drop(closed_upstream);
        while !closed_cell.cell().sender.as_ref().is_some_and(Sender::is_closed) {
            tokio::task::yield_now().await;
        }
        drop(closed_cell);

        let (taken, _) =
            Parking::Client.take(&own, route.route(), &authority).expect("an idle connection of the route");
        assert!(std::ptr::eq(Arc::as_ptr(&taken), newest_idle_cell.as_ptr()), "the newest idle one, past the busy one");
        assert_eq!(own.0.lock().unwrap().len(), 3, "the others stay");
        assert!(Parking::Client.take(&own, route.route(), &authority).is_none(), "busy, another route's, or closed");
        assert_eq!(own.0.lock().unwrap().len(), 2, "the closed one was dropped, the busy and the other route's kept");
        assert!(Parking::Client.take(&own, other.route(), &Authority::from_static("elsewhere:80")).is_none());
        assert!(Parking::Client.take(&own, other.route(), &authority).is_some(), "the other route takes its own");
    }

    /// A connection that turns idle while a request waits for its route's
    /// slot is not parked: it closes, and its slot goes to the request.
    #[tokio::test(start_paused = true)]
    async fn a_connection_parked_while_a_request_waits_for_its_slot_is_closed_instead() {
        let route = UpstreamSlots::new(1, Duration::from_secs(60));
        let own = Idle::default();
        let (cell, sender, slot, _upstream) = parked(&route).await;
        let waiting = tokio::spawn({
            let route = route.clone();
            async move { route.acquire(Duration::from_secs(1)).await.is_some() }
        });
        while !route.route().wanted() {
            tokio::task::yield_now().await;
        }
        Parking::Client.put_back(&own, cell.clone(), sender);
        assert!(own.0.lock().unwrap().is_empty() && cell.parked_since().is_none(), "taken out to close");
        // (In the pool, the connection's driver drops the slot once its sender is gone.)
        drop(slot);
        assert!(waiting.await.unwrap());
    }

    /// A worker thread keeps at most [`MAX_SPARE`] spares: one parked
    /// beyond closes the oldest. A client connection keeps at most
    /// `MAX_IDLE` of its own: one beyond closes.
    #[tokio::test]
    async fn spares_and_a_client_connections_own_are_bounded() {
        let route = UpstreamSlots::new(MAX_SPARE + 1, Duration::from_secs(60));
        let mut cells = Vec::new();
        let mut upstreams = Vec::new();
        for _ in 0..=MAX_SPARE {
            let (cell, sender, slot, upstream) = parked(&route).await;
            cells.push(Arc::downgrade(&cell));
            upstreams.push((slot, upstream));
            Parking::Worker.put_back(&Idle::default(), cell, sender);
        }
        assert_eq!(SPARE.with(|spare| spare.borrow().len()), MAX_SPARE);
        assert!(cells[0].upgrade().is_none(), "the oldest was dropped");
        assert!(cells[1..].iter().all(|cell| cell.upgrade().is_some()));

        let route = UpstreamSlots::new(MAX_IDLE + 1, Duration::from_secs(60));
        let own = Idle::default();
        let mut cells = Vec::new();
        for _ in 0..=MAX_IDLE {
            let (cell, sender, slot, upstream) = parked(&route).await;
            cells.push(Arc::downgrade(&cell));
            upstreams.push((slot, upstream));
            Parking::Client.put_back(&own, cell, sender);
        }
        assert_eq!(own.0.lock().unwrap().len(), MAX_IDLE);
        assert!(cells[MAX_IDLE].upgrade().is_none(), "the one beyond was dropped");
        SPARE.with(|spare| spare.borrow_mut().clear());
    }
}
