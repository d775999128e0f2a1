//! Holding writes at the recording upstream until the test releases them.
//!
//! Tests about ordering wait on these events ("the write has arrived and is
//! held", "now let it go") instead of on sleeps that are merely long enough.

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, Method};
use tokio::sync::watch;

/// How long a test waits for an event before it fails: only a bound on a
/// failing test, generous so a loaded machine never trips it.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// Which writes a hold catches: method, path, headers.
pub(crate) type Matcher = Box<dyn Fn(&Method, &str, &HeaderMap) -> bool + Send + Sync>;

/// One hold: catches up to `limit` matching writes and keeps them, body read
/// and counted in flight, until it is released.
pub(crate) struct Hold {
    pub(crate) what: String,
    pub(crate) matches: Matcher,
    pub(crate) limit: usize,
    /// Writes caught so far; taken under the upstream's state lock.
    pub(crate) claimed: AtomicUsize,
    /// Writes that have arrived whole and are being held.
    arrived: watch::Sender<usize>,
    released: watch::Sender<bool>,
}

impl Hold {
    pub(crate) fn new(limit: usize, what: String, matches: Matcher) -> Arc<Hold> {
        Arc::new(Hold {
            what,
            matches,
            limit,
            claimed: Default::default(),
            arrived: watch::Sender::new(0),
            released: watch::Sender::new(false),
        })
    }

    /// Called by the upstream once a caught write has arrived whole: signals
    /// the test and waits for the release.
    pub(crate) async fn arrive_and_wait(&self) {
        let mut released = self.released.subscribe();
        self.arrived.send_modify(|n| *n += 1);
        // The sender lives as long as `self`: this only returns on release.
        let _ = released.wait_for(|r| *r).await;
    }
}

/// A test's handle on a hold. Dropping it releases what it holds, so a failed
/// test never leaves a write stuck.
#[must_use = "dropping a Gate releases the writes it holds"]
pub struct Gate {
    pub(crate) hold: Arc<Hold>,
}

impl Gate {
    /// Waits until the first caught write has reached the upstream and is held
    /// there (counted in flight, body read, not yet applied).
    pub async fn wait_arrived(&self) {
        self.wait_arrivals(1).await;
    }

    /// Waits until `n` caught writes are held at the upstream.
    pub async fn wait_arrivals(&self, n: usize) {
        assert!(n <= self.hold.limit, "a hold on {} catches only {} writes", self.hold.what, self.hold.limit);
        let mut arrived = self.hold.arrived.subscribe();
        let waited = tokio::time::timeout(PATIENCE, arrived.wait_for(|a| *a >= n)).await;
        assert!(waited.is_ok(), "{n} {} never reached the upstream within {PATIENCE:?}", self.hold.what);
    }

    /// How many caught writes have arrived so far.
    pub fn arrived(&self) -> usize {
        *self.hold.arrived.borrow()
    }

    /// Lets every held write (and any still to be caught) go on and be applied.
    pub fn release(&self) {
        self.hold.released.send_replace(true);
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.release();
    }
}
