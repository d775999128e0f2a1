//! What a fenced request's forward shares with its fence: how far its body
//! went, and the upstream connection to tear down if it does not go out.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use tokio::sync::Notify;

use crate::http::Teardown;

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
    connection: Mutex<Option<Teardown>>,
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
    pub(super) fn begin(&self) -> u64 {
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
    pub(super) fn end(&self, generation: u64, how: Delivery) {
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
    pub(crate) fn went_on(&self, connection: Teardown) {
        *self.connection.lock().unwrap_or_else(PoisonError::into_inner) = Some(connection);
    }

    /// The connection the body went out on, if it went out on one.
    pub fn connection(&self) -> Option<Teardown> {
        self.connection.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
}
