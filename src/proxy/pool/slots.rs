//! The cap on a route's open upstream connections, and its accounting.
//!
//! Every open upstream connection, busy or idle, holds one of its route's
//! [`UpstreamSlots`] until it closes, so HTTP/2 streams whose responses are
//! never read pin at most `max_upstream_connections` of them. Within it, one
//! HTTP/2 client connection holds at most its share of a route's slots (a
//! quarter of the cap, at least one), so the streams of one connection can't
//! take the whole route from every other client. (An HTTP/1.1 client has one
//! request in flight at a time, and the connections its requests open serve
//! the whole worker: they count in the route's cap only.) A request that
//! needs a new connection when none is free (of the route, or of its
//! connection's share) waits for a slot up to the route's `queue_timeout`;
//! then it is refused (503 `upstream-busy`) with nothing sent. While it
//! waits, every connection it could take a slot from closes as soon as it is
//! idle ([`Slot::wanted`], which the connections' drivers watch): the ones
//! idle when the wait begins, and the ones that finish their response during
//! it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::proxy::error::UpstreamError;

/// Slots for open upstream connections, with the requests waiting for one:
/// a route's, or one client connection's share of a route's.
pub(super) struct Slots {
    /// One permit per open upstream connection, busy or idle.
    pub(super) free: Arc<Semaphore>,
    pub(super) cap: usize,
    /// Requests waiting for a slot now. While there are any, a connection
    /// holding one of these slots closes as soon as it is idle.
    pub(super) waiting: AtomicUsize,
    /// Wakes the connections holding these slots when a request starts
    /// waiting, so the idle ones notice at once.
    pub(super) shed: Notify,
    /// Wakes the requests waiting while a stream of one of these slots'
    /// HTTP/2 connections ends (`h2/`).
    pub(super) freed: Notify,
}

impl Slots {
    fn new(cap: usize) -> Arc<Slots> {
        let cap = cap.clamp(1, Semaphore::MAX_PERMITS);
        Arc::new(Slots {
            free: Arc::new(Semaphore::new(cap)),
            cap,
            waiting: AtomicUsize::new(0),
            shed: Notify::new(),
            freed: Notify::new(),
        })
    }

    /// A slot: at once if one is free; otherwise the connections holding
    /// these slots close as they become idle, and the wait for one lasts
    /// until `deadline` at most.
    async fn acquire(&self, deadline: Instant) -> Option<OwnedSemaphorePermit> {
        if let Ok(slot) = self.free.clone().try_acquire_owned() {
            return Some(slot);
        }
        let _waiting = Waiting::enter(&self.waiting);
        self.shed.notify_waiters();
        tokio::time::timeout_at(deadline, self.free.clone().acquire_owned()).await.ok()?.ok()
    }

    /// Whether a request waits for one of these slots.
    pub(super) fn wanted(&self) -> bool {
        self.waiting.load(Ordering::Acquire) > 0
    }
}

/// One request counted in [`Slots::waiting`] while it lives.
pub(super) struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    pub(super) fn enter(count: &'a AtomicUsize) -> Waiting<'a> {
        count.fetch_add(1, Ordering::AcqRel);
        Waiting(count)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One route's cap on open upstream connections, shared by every client
/// connection and HTTP/2 stream. Clones share the cap.
#[derive(Clone)]
pub struct UpstreamSlots {
    inner: Arc<Slots>,
    /// How long an upstream connection of the route may sit idle before it
    /// is closed.
    idle_timeout: Duration,
}

impl std::fmt::Debug for UpstreamSlots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamSlots")
            .field("cap", &self.inner.cap)
            .field("idle_timeout", &self.idle_timeout)
            .finish_non_exhaustive()
    }
}

impl UpstreamSlots {
    /// At most `cap` upstream connections open at once (at least one), each
    /// closed once it has been idle for `idle_timeout`.
    pub fn new(cap: usize, idle_timeout: Duration) -> UpstreamSlots {
        UpstreamSlots { inner: Slots::new(cap), idle_timeout }
    }

    pub fn cap(&self) -> usize {
        self.inner.cap
    }

    /// Whether the two count the same connections (a reload kept them).
    pub fn shared_with(&self, other: &UpstreamSlots) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// The slots one client connection may hold at once: a quarter of the
    /// cap, at least one.
    pub fn share(&self) -> usize {
        (self.inner.cap / 4).max(1)
    }

    /// The route's slots and the requests waiting for one.
    pub(super) fn route(&self) -> &Arc<Slots> {
        &self.inner
    }

    /// Upstream connections open now.
    pub fn open(&self) -> usize {
        self.inner.cap - self.inner.free.available_permits()
    }

    #[cfg(test)]
    pub(super) async fn acquire(&self, wait: Duration) -> Option<OwnedSemaphorePermit> {
        self.inner.acquire(Instant::now() + wait).await
    }
}

/// What an open upstream connection holds until it closes: a slot of its
/// route's and, if an HTTP/2 client opened it, one of that client
/// connection's share.
pub(super) struct Slot {
    pub(super) route: Arc<Slots>,
    pub(super) share: Option<Arc<Slots>>,
    pub(super) idle_timeout: Duration,
    _route_slot: OwnedSemaphorePermit,
    _share_slot: Option<OwnedSemaphorePermit>,
}

impl Slot {
    /// The route's slot `permit` of `slots`, counted in no share.
    pub(super) fn of_route(slots: &UpstreamSlots, permit: OwnedSemaphorePermit) -> Slot {
        let route = slots.inner.clone();
        Slot { route, share: None, idle_timeout: slots.idle_timeout, _route_slot: permit, _share_slot: None }
    }

    /// A slot of the route of `slots` by `deadline`, after one of `share`
    /// (a client connection's share of the route) if given: refused by the
    /// share, the request has not touched the route's slots.
    pub(super) async fn acquire(
        slots: &UpstreamSlots,
        share: Option<Arc<Slots>>,
        deadline: Instant,
    ) -> Result<Slot, UpstreamError> {
        let started = Instant::now();
        let share_slot = match &share {
            None => None,
            Some(share) => match share.acquire(deadline).await {
                Some(slot) => Some(slot),
                None => return Err(UpstreamError::busy_share(share.cap, started.elapsed())),
            },
        };
        let route = slots.inner.clone();
        let Some(route_slot) = route.acquire(deadline).await else {
            return Err(UpstreamError::busy(route.cap, started.elapsed()));
        };
        Ok(Slot { route, share, idle_timeout: slots.idle_timeout, _route_slot: route_slot, _share_slot: share_slot })
    }

    /// Whether a request waits for a slot this connection could give back.
    pub(super) fn wanted(&self) -> bool {
        wanted(&self.route, self.share.as_deref())
    }
}

/// Whether a request waits for a slot of `route`, or of `share` (a client
/// connection's share of it): then a connection holding one of each should
/// close once idle.
pub(super) fn wanted(route: &Slots, share: Option<&Slots>) -> bool {
    route.wanted() || share.is_some_and(Slots::wanted)
}

/// The share of each route one client connection has used, found by the
/// route's slots (a client connection uses few routes).
#[derive(Default)]
pub(super) struct Shares(Mutex<Vec<Share>>);

/// A route's slots, and this client connection's share of them.
type Share = (Arc<Slots>, Arc<Slots>);

impl Shares {
    /// This client connection's share of the route of `slots`.
    pub(super) fn of(&self, slots: &UpstreamSlots) -> Arc<Slots> {
        let mut shares = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, share)) = shares.iter().find(|(route, _)| Arc::ptr_eq(route, &slots.inner)) {
            return share.clone();
        }
        let share = Slots::new(slots.share());
        shares.push((slots.inner.clone(), share.clone()));
        share
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn at_the_cap_a_slot_is_waited_for_then_refused() {
        let slots = UpstreamSlots::new(2, Duration::from_secs(60));
        let a = slots.acquire(Duration::ZERO).await.unwrap();
        let _b = slots.acquire(Duration::ZERO).await.unwrap();
        assert_eq!(slots.open(), 2);
        assert!(slots.acquire(Duration::from_secs(1)).await.is_none());
        let waiting = tokio::spawn({
            let slots = slots.clone();
            async move { slots.acquire(Duration::from_secs(5)).await.is_some() }
        });
        tokio::task::yield_now().await;
        drop(a);
        assert!(waiting.await.unwrap(), "a slot given back goes to the request waiting for one");
    }

    /// A client connection's share is a quarter of its route's cap (at
    /// least one), one per route, and refuses before the route's slots are
    /// touched.
    #[tokio::test(start_paused = true)]
    async fn a_client_connections_share_is_its_own_per_route_and_refuses_first() {
        let (route, other) =
            (UpstreamSlots::new(8, Duration::from_secs(60)), UpstreamSlots::new(2, Duration::from_secs(60)));
        let shares = Shares::default();
        let share = shares.of(&route);
        assert!(Arc::ptr_eq(&share, &shares.of(&route)), "one share per route");
        assert_eq!((share.cap, shares.of(&other).cap), (2, 1));
        assert!(!Arc::ptr_eq(&share, &Shares::default().of(&route)), "each client connection has its own");

        let deadline = || Instant::now() + Duration::from_secs(1);
        let held = [
            Slot::acquire(&route, Some(share.clone()), deadline()).await.unwrap(),
            Slot::acquire(&route, Some(share.clone()), deadline()).await.unwrap(),
        ];
        let Err(refused) = Slot::acquire(&route, Some(share.clone()), deadline()).await else {
            panic!("a slot past the client connection's share");
        };
        assert!(refused.is_busy() && !refused.may_have_sent(), "{refused}");
        assert!(refused.to_string().contains("one client connection may hold"), "{refused}");
        assert_eq!(route.open(), 2, "the refused request took none of the route's");
        let unshared = Slot::acquire(&route, None, deadline()).await.expect("a request counted in no share");
        drop((held, unshared));
        assert_eq!((route.open(), share.free.available_permits()), (0, 2), "dropped slots are given back");
    }

    /// While a request waits for one of a route's slots, or of a share's,
    /// every connection holding one is wanted: its driver closes it once idle.
    #[tokio::test(start_paused = true)]
    async fn a_slot_is_wanted_while_a_request_waits_for_its_route_or_share() {
        let route = UpstreamSlots::new(4, Duration::from_secs(60));
        let share = Shares::default().of(&route);
        let deadline = Instant::now() + Duration::from_secs(1);
        let shared = Slot::acquire(&route, Some(share.clone()), deadline).await.unwrap();
        let unshared = Slot::acquire(&route, None, deadline).await.unwrap();
        assert!(!shared.wanted() && !unshared.wanted());

        let waiting = tokio::spawn({
            let (route, share) = (route.clone(), share.clone());
            async move { Slot::acquire(&route, Some(share), deadline).await.map(drop) }
        });
        tokio::task::yield_now().await;
        assert!(shared.wanted() && !unshared.wanted(), "a request waits for the share only");
        assert!(waiting.await.unwrap().is_err());
        assert!(!shared.wanted(), "the wait ended");

        let _rest = [route.acquire(Duration::ZERO).await.unwrap(), route.acquire(Duration::ZERO).await.unwrap()];
        let waiting = tokio::spawn({
            let route = route.clone();
            async move { route.acquire(Duration::from_secs(1)).await.is_some() }
        });
        tokio::task::yield_now().await;
        assert!(shared.wanted() && unshared.wanted(), "a request waits for the route");
        drop(unshared);
        assert!(waiting.await.unwrap(), "a slot given back goes to the request waiting for one");
    }
}
