//! Waiting for a turn: a waiter that leaves its key's queue when it gives
//! up, and the count of requests waiting.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use super::map::KeyGate;

/// A waiter in a key's queue; dropped before it has its turn (timed out, or
/// its request went away), it leaves the queue. A turn sent to it in the
/// meantime is dropped with the channel, which passes the turn on.
pub(super) struct Queued<'a> {
    pub(super) gate: &'a Arc<KeyGate>,
    pub(super) key: &'a str,
    pub(super) id: u64,
    /// Still in the queue, as far as this waiter knows.
    pub(super) waiting: bool,
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        if self.waiting {
            let id = self.id;
            self.gate.update(self.key, |turns| turns.leave_queue(id));
        }
    }
}

/// Counts a request among those waiting for as long as it lives.
pub(super) struct WaitingGuard<'a>(&'a AtomicI64);

impl<'a> WaitingGuard<'a> {
    pub(super) fn new(counter: &'a AtomicI64) -> Self {
        counter.fetch_add(1, Ordering::Relaxed);
        WaitingGuard(counter)
    }
}

impl Drop for WaitingGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::super::testing::{settle, waiter, LONG};
    use super::super::{Ask, KeyGate, NoTurn};

    #[tokio::test(start_paused = true)]
    async fn a_waiter_that_gives_up_lets_the_key_go_on() {
        let gate = Arc::new(KeyGate::default());
        let mut holder = gate.acquire(&"k".into(), 5, Ask::Share, LONG).await.unwrap();
        holder.share();
        // A higher token gives up waiting; the holder's writes share again.
        assert_eq!(
            gate.acquire(&"k".into(), 6, Ask::Share, Duration::from_millis(10)).await.unwrap_err(),
            NoTurn::Timeout
        );
        let joined = gate.acquire(&"k".into(), 5, Ask::Share, Duration::ZERO).await.unwrap();
        // A waiter cancelled while it waits leaves the queue too.
        let (raise, _release) = waiter(&gate, "k", 6, Ask::Share);
        settle().await;
        raise.abort();
        let _ = raise.await;
        assert_eq!(gate.waiting(), 0);
        let again = gate.acquire(&"k".into(), 5, Ask::Share, Duration::ZERO).await.unwrap();
        drop((holder, joined, again));
        assert_eq!(gate.active_keys(), 0);
    }
}
