//! The keys' turns a request holds, and how they pass on: at once, after
//! the settle period when the outcome is unknown, or once a body answered
//! early has left.

use std::time::Duration;

use crate::fence::gate::Turn;
use crate::fence::store::InFlight;
use crate::http::Delivery;
use crate::stack::forward::SlotTaken;

/// The turns one request holds: its key's, and its `Destination`'s; and,
/// with a store replicas share, their records of the write in flight.
#[derive(Default)]
pub(super) struct Turns([Option<Turn>; 2], [InFlight; 2]);

impl Turns {
    pub(super) fn push(&mut self, turn: Turn) {
        let free = self.0.iter_mut().find(|t| t.is_none()).expect("a request holds at most two keys' turns");
        *free = Some(turn);
    }

    pub(super) fn record(&mut self, in_flight: InFlight) {
        let free = self.1.iter_mut().find(|f| f.is_empty()).expect("a request writes at most two keys");
        *free = in_flight;
    }

    /// See [`Turn::share`].
    pub(super) fn share(&mut self) {
        self.0.iter_mut().flatten().for_each(Turn::share);
    }

    fn is_empty(&self) -> bool {
        self.0.iter().all(Option::is_none)
    }
}

/// Keeps keys closed for `settle` before passing their turns on.
pub(super) fn hold_for(turns: Turns, settle: Duration) {
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            runtime.spawn(async move {
                tokio::time::sleep(settle).await;
                drop(turns);
            });
        }
        // No runtime left (the process is stopping): nothing else will forward.
        Err(_) => drop(turns),
    }
}

/// Whether the request's body (if any) has been handed to the upstream
/// connection whole: hyper has taken its last frame.
pub(super) fn sent_whole(taken: &SlotTaken) -> bool {
    matches!(taken.handover().delivery().0, Delivery::Nothing | Delivery::Whole)
}

/// Passes the keys' turns on once the request's body has left: the upstream
/// answered before it was handed over whole.
///
/// Handed over is not arrived: what hyper took may still sit in the
/// sockets' buffers on either side (megabytes), and the upstream, which has
/// already answered, reads it when it will. So the keys settle from the
/// moment the body was handed over whole, as after an unknown outcome. A
/// body not handed over whole within the route's `timeout` (the upstream
/// stopped reading) has its connection torn down (a reset: nothing it still
/// held is written), and the keys settle from then.
///
/// A task of its own: the rare path (most upstreams read the body before
/// they answer).
pub(super) fn pass_when_sent(turns: Turns, taken: SlotTaken, settle: Duration, timeout: Duration) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        // No runtime left (the process is stopping): nothing else will forward.
        return drop(turns);
    };
    // Read now, not later: once the body is out, the next request of an
    // HTTP/1.1 client connection reuses the handover.
    let (_, generation) = taken.handover().delivery();
    let connection = taken.handover().connection();
    runtime.spawn(async move {
        let handover = taken.handover();
        if tokio::time::timeout(timeout, handover.delivered(generation)).await.is_err() {
            if let Some(connection) = connection {
                connection.tear_down().await;
            }
        }
        drop(taken);
        tokio::time::sleep(settle).await;
        drop(turns);
    });
}

/// Keys' turns while their request is with the upstream. Dropped without
/// [`disarm`](Self::disarm) once the forward has its way to the upstream (it
/// panicked, or its task was cancelled: the runtime is stopping), the
/// outcome is unknown, so the keys settle like after a timeout (with no
/// runtime left, nothing else forwards and they go at once); before, nothing
/// was sent and the turns pass on.
pub(super) struct SettlingTurns {
    pub turns: Turns,
    pub settle: Duration,
    pub taken: SlotTaken,
}

impl SettlingTurns {
    pub(super) fn disarm(mut self) -> (Turns, SlotTaken) {
        (std::mem::take(&mut self.turns), self.taken.clone())
    }
}

impl Drop for SettlingTurns {
    fn drop(&mut self) {
        let turns = std::mem::take(&mut self.turns);
        if !turns.is_empty() && !self.settle.is_zero() && self.taken.is_taken() {
            hold_for(turns, self.settle);
        }
    }
}
