//! Waking the requests of a commit: one cross-thread wake per worker thread.
//!
//! Waking a task of a tokio current-thread runtime from another thread costs a
//! syscall every time (the runtime's driver is unparked for each task). A commit
//! answers a dozen or more requests at once, spread over a few worker threads,
//! and those syscalls cost the commit thread more than its write and fsync. So
//! each worker thread that waits for commits gets a relay: a task on its own
//! runtime that the commit thread wakes once per commit, and that wakes the
//! thread's waiters from there, where waking is a push onto a local queue.

use std::cell::RefCell;
use std::sync::Arc;

use tokio::runtime::{Handle, Id, RuntimeFlavor};
use tokio::sync::Notify;

/// The relay of one current-thread runtime.
#[derive(Debug, Default)]
pub struct Relay {
    /// The relay task waits here; posting a commit wakes it (the one remote wake).
    signal: Notify,
    /// The runtime's waiters wait here; the relay task wakes them all, and each
    /// looks whether its own commit is answered.
    local: Notify,
}

thread_local! {
    static RELAY: RefCell<Option<(Id, Arc<Relay>)>> = const { RefCell::new(None) };
}

impl Relay {
    /// The relay of the runtime running on this thread, started on first use;
    /// `None` on a multi-thread runtime, whose tasks may run on any thread.
    ///
    /// The relay is a task of that runtime, so a waiter is answered only while
    /// the runtime is being driven (`Runtime::block_on`, as fencegate's workers
    /// do); a future awaited under a mere `Handle::enter` on a current-thread
    /// runtime nobody drives would wait forever.
    pub fn current() -> Option<Arc<Relay>> {
        let handle = Handle::try_current().ok()?;
        if handle.runtime_flavor() != RuntimeFlavor::CurrentThread {
            return None;
        }
        let id = handle.id();
        RELAY.with(|slot| {
            let mut slot = slot.borrow_mut();
            if let Some((owner, relay)) = &*slot {
                if *owner == id {
                    return Some(relay.clone());
                }
            }
            let relay = Arc::new(Relay::default());
            handle.spawn(relay.clone().run());
            *slot = Some((id, relay.clone()));
            Some(relay)
        })
    }

    /// Wakes the relay task (from any thread).
    pub fn signal(&self) {
        self.signal.notify_one();
    }

    /// What this runtime's waiters wait on.
    pub fn local(&self) -> &Notify {
        &self.local
    }

    async fn run(self: Arc<Self>) {
        loop {
            // A signal sent while this task is busy is kept as a permit.
            self.signal.notified().await;
            self.local.notify_waiters();
        }
    }
}
