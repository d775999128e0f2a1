//! Fenced writes in flight as a store replicas share sees them: the record
//! [`FenceStore::enter`](super::FenceStore::enter) makes, how it ends, and
//! how long its lease may be.

use std::time::Duration;

/// A fenced write in flight, as a store replicas share records it (nothing
/// for a store of one process, whose turns are all in its gate). Dropped
/// when the request's turn ends: response head, failure, or the end of its
/// settle period; dropping it ends the record ([`WriteRecord::end`]).
///
/// A store of one process hands out the empty one, which costs no
/// allocation and no call.
#[derive(Debug, Default)]
pub struct InFlight(Option<Box<dyn WriteRecord>>);

impl InFlight {
    /// The in-flight record `record`, ended when this is dropped.
    pub fn recorded(record: impl WriteRecord) -> InFlight {
        InFlight(Some(Box::new(record)))
    }

    /// Records nothing (a store of one process).
    pub fn is_empty(&self) -> bool {
        self.0.is_none()
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(record) = self.0.take() {
            record.end();
        }
    }
}

/// A shared store's record of one fenced write in flight: what other
/// replicas' raises of the key wait for. It ends when the write's turn
/// ends, or, should this process die first, when its lease runs out.
pub trait WriteRecord: Send + Sync + std::fmt::Debug + 'static {
    /// Ends the record. Called where a turn ends (often a task's drop), so
    /// it must not block or wait for the store: it hands the record to
    /// something that removes it, and a record that cannot be removed ends
    /// with its lease.
    fn end(self: Box<Self>);
}

/// What bounds the lease of a route's fenced write: the route's
/// `queue_timeout`, `timeout` and `settle`, as the fence takes them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriteBounds {
    pub queue_timeout: Duration,
    pub timeout: Duration,
    pub settle: Duration,
}

impl From<&crate::config::RouteConfig> for WriteBounds {
    fn from(route: &crate::config::RouteConfig) -> Self {
        WriteBounds { queue_timeout: route.queue_timeout, timeout: route.timeout, settle: route.settle }
    }
}

/// The longest lease a fenced write of these routes is given (see the fence
/// service: what is left of the wait for its turns, at most a
/// `queue_timeout`; a wait for an upstream connection, another; the
/// exchange, `timeout`; the wait for a body answered early to leave,
/// another `timeout`; and the settle period, at most the longest of any
/// route, since a COPY's destination may belong to another route). A store
/// adds its own margins.
pub fn longest_write_lease(routes: impl IntoIterator<Item = WriteBounds>) -> Duration {
    let (mut exchange, mut settle) = (Duration::ZERO, Duration::ZERO);
    for route in routes {
        // Saturating: config durations are bounded (config::MAX_DURATION),
        // but a lease that cannot be added up is "as long as can be", never a panic.
        let two = |d: Duration| d.saturating_mul(2);
        exchange = exchange.max(two(route.queue_timeout).saturating_add(two(route.timeout)));
        settle = settle.max(route.settle);
    }
    exchange.saturating_add(settle)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use super::*;

    /// The hold after a confirm covers the longest lease any route gives a
    /// write: two queue timeouts and two timeouts (the exchange, and the wait
    /// for a body answered early) of the same route, and the longest settle
    /// of any (a COPY's destination may settle longer).
    #[test]
    fn the_longest_write_lease_covers_every_route_and_the_longest_settle() {
        let s = Duration::from_secs;
        let slow = WriteBounds { timeout: s(30), queue_timeout: s(10), settle: s(0) };
        let settles = WriteBounds { timeout: s(2), queue_timeout: s(1), settle: s(5) };
        assert_eq!(longest_write_lease([slow, settles]), s(20 + 60 + 5));
        assert_eq!(longest_write_lease([settles]), s(2 + 4 + 5));
        assert_eq!(longest_write_lease([]), Duration::ZERO);
    }

    #[derive(Debug)]
    struct Counted(Arc<AtomicUsize>);

    impl WriteRecord for Counted {
        fn end(self: Box<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_record_ends_once_when_its_write_is_dropped_and_the_empty_one_records_nothing() {
        let ended = Arc::new(AtomicUsize::new(0));
        let in_flight = InFlight::recorded(Counted(ended.clone()));
        assert!(!in_flight.is_empty());
        assert_eq!(ended.load(Ordering::SeqCst), 0);
        drop(in_flight);
        assert_eq!(ended.load(Ordering::SeqCst), 1);
        assert!(InFlight::default().is_empty());
        // Two words, whatever a shared store keeps in its records: the
        // requests of a store of one process carry no more than that.
        assert_eq!(std::mem::size_of::<InFlight>(), 2 * std::mem::size_of::<usize>());
    }
}
