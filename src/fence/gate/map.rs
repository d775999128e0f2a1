//! The gate: every key someone holds or waits for, mapped to its turns, and
//! how a request asks for one.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;

use super::key::{Ask, KeyTurns, NoTurn};
use super::turn::Turn;
use super::waiting::{Queued, WaitingGuard};

/// The per-key turns. Cheap to share: clone the `Arc`.
#[derive(Debug, Default)]
pub struct KeyGate {
    /// Keyed by a shared string: every turn of the key holds it too.
    keys: dashmap::DashMap<Arc<str>, KeyTurns, ahash::RandomState>,
    waiting: AtomicI64,
    /// Names waiters, so one that gives up can leave its queue.
    next_waiter: AtomicU64,
    /// Set when fencegate restarted on fences a previous process left: writes
    /// that process sent may still be in flight, so every key starts closed
    /// for its route's settle period from this instant.
    reopened_at: Option<tokio::time::Instant>,
}

impl KeyGate {
    /// A gate whose keys all start closed for their settle period: for a
    /// restart on a store that a previous process wrote to (and may have died
    /// with writes in flight).
    pub fn reopened() -> Self {
        KeyGate { reopened_at: Some(tokio::time::Instant::now()), ..KeyGate::default() }
    }

    /// Waits until keys are open after a restart (see [`KeyGate::reopened`]),
    /// at most `timeout`; `false` when the wait would outlast it.
    pub async fn wait_reopened(&self, settle: Duration, timeout: Duration) -> bool {
        let Some(reopened) = self.reopened_at else { return true };
        let open_at = reopened + settle;
        let now = tokio::time::Instant::now();
        if open_at <= now {
            return true;
        }
        if open_at - now > timeout {
            tokio::time::sleep(timeout).await;
            return false;
        }
        let _waiting = WaitingGuard::new(&self.waiting);
        tokio::time::sleep_until(open_at).await;
        true
    }

    /// A turn of `key` for a request carrying `token`, waiting up to
    /// `timeout` for it (see the [module docs](super)).
    ///
    /// Cancel-safe: dropping the returned future while it waits leaves the
    /// queue as if this caller never came.
    pub async fn acquire(
        self: &Arc<Self>,
        key: &Arc<str>,
        token: u64,
        ask: Ask,
        timeout: Duration,
    ) -> Result<Turn, NoTurn> {
        let (id, woken) = {
            // One lookup: a key without turns yet shares the request's key
            // (a count, not a copy); one that has them drops the count again.
            let mut turns = self.keys.entry(key.clone()).or_default();
            if let Some(held) = turns.arrive(token, ask)? {
                return Ok(Turn::new(self.clone(), turns.key().clone(), token, held));
            }
            let (wake, woken) = oneshot::channel();
            let id = self.next_waiter.fetch_add(1, Ordering::Relaxed);
            turns.join_queue(id, token, ask, wake);
            (id, woken)
        };
        let mut queued = Queued { gate: self, key, id, waiting: true };
        let _waiting = WaitingGuard::new(&self.waiting);
        match tokio::time::timeout(timeout, woken).await {
            Ok(Ok(turn)) => {
                queued.waiting = false;
                Ok(turn)
            }
            // A waiter's sender is only dropped by sending, or by `queued`.
            Ok(Err(_)) | Err(_) => Err(NoTurn::Timeout),
        }
    }

    /// Keys someone holds or waits for now.
    pub fn active_keys(&self) -> usize {
        self.keys.len()
    }

    /// Requests waiting for a key's turn now.
    pub fn waiting(&self) -> i64 {
        self.waiting.load(Ordering::Relaxed)
    }

    /// Runs `change` on `key`'s turns under its lock, wakes whoever may go
    /// now, and forgets the key once nobody holds or waits for it.
    pub(super) fn update(self: &Arc<Self>, key: &str, change: impl FnOnce(&mut KeyTurns)) {
        let mut unclaimed = Vec::new();
        // One lock for the change, the wake-ups and forgetting the key.
        let forgotten = self.keys.remove_if_mut(key, |key, turns| {
            change(turns);
            turns.wake(self, key, &mut unclaimed);
            turns.is_idle()
        });
        // Outside the key's lock: dropping a turn takes it.
        drop(forgotten);
        drop(unclaimed);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::super::testing::LONG;
    use super::super::{Ask, KeyGate, NoTurn};

    #[tokio::test(start_paused = true)]
    async fn one_turn_per_key_and_keys_are_independent() {
        let gate = Arc::new(KeyGate::default());
        let a = gate.acquire(&"a".into(), 1, Ask::Alone, LONG).await.unwrap();
        // Another key is not held up by "a".
        let b = gate.acquire(&"b".into(), 1, Ask::Alone, LONG).await.unwrap();
        // A second turn for "a" waits until the first is dropped.
        assert_eq!(
            gate.acquire(&"a".into(), 1, Ask::Alone, Duration::from_millis(50)).await.unwrap_err(),
            NoTurn::Timeout
        );
        let waiter = tokio::spawn({
            let gate = gate.clone();
            async move { gate.acquire(&"a".into(), 1, Ask::Alone, LONG).await.map(|_| ()) }
        });
        tokio::task::yield_now().await;
        assert_eq!(gate.waiting(), 1);
        assert!(!waiter.is_finished());
        drop(a);
        waiter.await.unwrap().unwrap();
        drop(b);
        assert_eq!(gate.active_keys(), 0);
        assert_eq!(gate.waiting(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_reopened_gate_holds_keys_for_the_settle_period() {
        let gate = KeyGate::reopened();
        let start = tokio::time::Instant::now();
        assert!(gate.wait_reopened(Duration::from_secs(2), LONG).await);
        assert_eq!(start.elapsed(), Duration::from_secs(2));
        // Open from then on.
        assert!(gate.wait_reopened(Duration::from_secs(2), LONG).await);
        assert_eq!(start.elapsed(), Duration::from_secs(2));
        // A wait past the queue timeout gives up at the timeout.
        let gate = KeyGate::reopened();
        let start = tokio::time::Instant::now();
        assert!(!gate.wait_reopened(Duration::from_secs(5), Duration::from_secs(1)).await);
        assert_eq!(start.elapsed(), Duration::from_secs(1));
        assert!(KeyGate::default().wait_reopened(Duration::from_secs(5), Duration::ZERO).await);
    }

    #[tokio::test(start_paused = true)]
    async fn idle_queues_do_not_leak() {
        let gate = Arc::new(KeyGate::default());
        // A million keys written once leave no queue behind.
        for i in 0..1_000_000 {
            let turn = gate.acquire(&format!("key-{i}").into(), 1, Ask::Alone, LONG).await.unwrap();
            drop(turn);
        }
        // Timed-out and cancelled waiters clean up too.
        let held = gate.acquire(&"held".into(), 1, Ask::Alone, LONG).await.unwrap();
        assert!(gate.acquire(&"held".into(), 1, Ask::Alone, Duration::from_millis(1)).await.is_err());
        let cancelled = tokio::spawn({
            let gate = gate.clone();
            async move { gate.acquire(&"held".into(), 1, Ask::Alone, LONG).await.map(|_| ()) }
        });
        tokio::task::yield_now().await;
        cancelled.abort();
        let _ = cancelled.await;
        drop(held);
        assert_eq!(gate.active_keys(), 0);
        assert_eq!(gate.waiting(), 0);
    }
}
