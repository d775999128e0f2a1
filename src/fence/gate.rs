//! Per-key turn-taking: one fenced request per key in flight.
//!
//! A [`KeyGate`] hands out [`Turn`]s. While a request holds the turn of its key,
//! no other fenced request for that key is forwarded; the next waiter (first in,
//! first out) gets the turn when the holder drops it. A key's queue exists only
//! while someone holds or waits for its turn, so a million keys written once leave
//! nothing behind.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::KeyMap;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The per-key queues. Cheap to share: clone the `Arc`.
#[derive(Debug, Default)]
pub struct KeyGate {
    queues: KeyMap<Arc<Semaphore>>,
    waiting: AtomicI64,
    /// Set when fencegate restarted on fences a previous process left: writes
    /// that process sent may still be in flight, so every key starts closed
    /// for its route's settle period from this instant.
    reopened_at: Option<tokio::time::Instant>,
}

/// Waited `queue_timeout` without getting the key's turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TurnTimeout;

/// The right to forward one fenced request for a key. Dropping it passes the turn on.
#[derive(Debug)]
pub struct Turn {
    gate: Arc<KeyGate>,
    key: Box<str>,
    // Field order matters: the permit is released before `queue` is dropped, so
    // `Drop` sees an accurate reference count.
    permit: Option<OwnedSemaphorePermit>,
    queue: Option<Arc<Semaphore>>,
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

    /// Waits up to `timeout` for the turn of `key`.
    ///
    /// Cancel-safe: dropping the returned future while it waits leaves the queue
    /// as if this caller never came.
    pub async fn acquire(self: &Arc<Self>, key: &str, timeout: Duration) -> Result<Turn, TurnTimeout> {
        let queue = match self.queues.get(key) {
            Some(q) => q.clone(),
            None => self.queues.entry(key.into()).or_insert_with(|| Arc::new(Semaphore::new(1))).clone(),
        };
        // From here on `turn` owns the only reference to the queue outside the
        // map (besides short-lived clones dropped before `turn` is), and its
        // `Drop` removes the queue once nobody else holds or waits on it.
        let mut turn = Turn { gate: self.clone(), key: key.into(), permit: None, queue: Some(queue) };
        if let Ok(permit) = turn.queue().try_acquire_owned() {
            turn.permit = Some(permit);
            return Ok(turn);
        }
        // A statement of its own, so the waiting future (and its clone of the
        // queue) is gone before `turn` can be dropped on the error path.
        let acquired = {
            let _waiting = WaitingGuard::new(&self.waiting);
            tokio::time::timeout(timeout, turn.queue().acquire_owned()).await
        };
        match acquired {
            Ok(Ok(permit)) => {
                turn.permit = Some(permit);
                Ok(turn)
            }
            // The semaphore is never closed; treat that like a timeout all the same.
            Ok(Err(_)) | Err(_) => Err(TurnTimeout),
        }
    }

    /// Keys that have a queue now (someone holds or waits for their turn).
    pub fn active_keys(&self) -> usize {
        self.queues.len()
    }

    /// Requests waiting for a key's turn now.
    pub fn waiting(&self) -> i64 {
        self.waiting.load(Ordering::Relaxed)
    }
}

impl Turn {
    fn queue(&self) -> Arc<Semaphore> {
        self.queue.clone().expect("queue is set until drop")
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        drop(self.permit.take());
        drop(self.queue.take());
        // Under the shard lock: if only the map still holds the queue, nobody
        // holds or waits for this key's turn, and nobody can clone the queue
        // without this lock.
        self.gate.queues.remove_if(&*self.key, |_, q| Arc::strong_count(q) == 1);
    }
}

struct WaitingGuard<'a>(&'a AtomicI64);

impl<'a> WaitingGuard<'a> {
    fn new(counter: &'a AtomicI64) -> Self {
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
    use super::*;

    const LONG: Duration = Duration::from_secs(3600);

    #[tokio::test(start_paused = true)]
    async fn one_turn_per_key_and_keys_are_independent() {
        let gate = Arc::new(KeyGate::default());
        let a = gate.acquire("a", LONG).await.unwrap();
        // Another key is not held up by "a".
        let b = gate.acquire("b", LONG).await.unwrap();
        // A second turn for "a" waits until the first is dropped.
        assert_eq!(gate.acquire("a", Duration::from_millis(50)).await.unwrap_err(), TurnTimeout);
        let waiter = tokio::spawn({
            let gate = gate.clone();
            async move { gate.acquire("a", LONG).await.map(|_| ()) }
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
    async fn waiters_get_the_turn_in_arrival_order() {
        let gate = Arc::new(KeyGate::default());
        let first = gate.acquire("k", LONG).await.unwrap();
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..5 {
            let (gate, order) = (gate.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let _turn = gate.acquire("k", LONG).await.unwrap();
                order.lock().unwrap().push(i);
                tokio::time::sleep(Duration::from_millis(1)).await;
            }));
            // Let each waiter enqueue before the next one starts.
            tokio::task::yield_now().await;
        }
        drop(first);
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3, 4]);
        assert_eq!(gate.active_keys(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn idle_queues_do_not_leak() {
        let gate = Arc::new(KeyGate::default());
        // A million keys written once leave no queue behind.
        for i in 0..1_000_000 {
            let turn = gate.acquire(&format!("key-{i}"), LONG).await.unwrap();
            drop(turn);
        }
        // Timed-out and cancelled waiters clean up too.
        let held = gate.acquire("held", LONG).await.unwrap();
        assert!(gate.acquire("held", Duration::from_millis(1)).await.is_err());
        let cancelled = tokio::spawn({
            let gate = gate.clone();
            async move { gate.acquire("held", LONG).await.map(|_| ()) }
        });
        tokio::task::yield_now().await;
        cancelled.abort();
        let _ = cancelled.await;
        drop(held);
        assert_eq!(gate.active_keys(), 0);
        assert_eq!(gate.waiting(), 0);
    }
}
