//! Per-key turn-taking: the requests of one key that may be in flight
//! together, and the order in which the others go.
//!
//! A [`KeyGate`] hands out [`Turn`]s. Invariant 2 of the design, per key:
//!
//! - Requests carrying the key's mark (the holder's own writes) **share** the
//!   key: any number of them may be in flight at once.
//! - A request that would **raise** the mark holds the key **alone**: it
//!   waits until every request in flight for the key has ended (dropped its
//!   turn: response head, failure, or the end of a settle period), then its
//!   mark is raised under the turn, and from then on requests with its token
//!   share the key with it ([`Turn::share`]).
//! - Requests of a `strict` route, and requests that write two keys (a WebDAV
//!   `Destination`), always hold their keys alone.
//! - A request whose token is below the mark the sharers carry is refused at
//!   once ([`NoTurn::Stale`]), and so is one whose token is below a token
//!   already waiting, or holding the key alone while it decides
//!   ([`NoTurn::Superseded`]): it would be stale by the time its turn came,
//!   and refusing it keeps a flow of the old holder's writes from starving
//!   the new holder.
//!
//! Waiters get their turns first in, first out. The gate does not know a
//! key's mark until a request has raised (or confirmed) it under a turn, so
//! the first request to arrive at an idle key holds it alone until its check
//! and advance are done; it then shares, and the requests that queued behind
//! it with the same token join it.
//!
//! A key's entry exists only while someone holds or waits for its turn, so a
//! million keys written once leave nothing behind.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;

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

/// How a request asks for a key's turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ask {
    /// It may share the key with requests carrying the same token, once that
    /// token is the key's mark.
    Share,
    /// It holds the key alone: a `strict` route, or a request writing two keys.
    Alone,
}

/// Why a request gets no turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoTurn {
    /// Waited `queue_timeout` without getting the key's turn.
    Timeout,
    /// The token is below the mark the requests in flight carry.
    Stale { current: u64 },
    /// The token is below one already waiting for the key: by its turn the
    /// mark would be at least `waiting`.
    Superseded { waiting: u64 },
}

/// The right to forward one fenced request for a key. Dropping it ends the
/// request's part: the next waiter may get the key.
#[derive(Debug)]
pub struct Turn {
    gate: Arc<KeyGate>,
    key: Arc<str>,
    token: u64,
    held: Held,
}

/// How a turn holds its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    /// Alone, until its check and advance are done: then it shares.
    Deciding,
    /// Alone, for as long as it is held.
    Alone,
    /// With the other requests carrying the key's mark.
    Shared,
}

/// One key's turns: who holds them and who waits.
#[derive(Debug, Default)]
struct KeyTurns {
    /// Requests holding a turn of the key now.
    holders: u32,
    /// When the holders share: the token they carry, the key's mark.
    shared: Option<u64>,
    /// When one request holds the key alone (deciding, or for good): its
    /// token. The mark will be at least this once it is done.
    alone: Option<u64>,
    /// First in, first out. Tokens never go down from front to back: a
    /// request below the last waiter's token is refused, not queued.
    queue: VecDeque<Waiter>,
}

#[derive(Debug)]
struct Waiter {
    id: u64,
    token: u64,
    ask: Ask,
    wake: oneshot::Sender<Turn>,
}

impl KeyTurns {
    /// A request arriving with `token`: a turn at once, `None` to wait, or
    /// refused.
    fn arrive(&mut self, token: u64, ask: Ask) -> Result<Option<Held>, NoTurn> {
        if let Some(mark) = self.shared {
            if token < mark {
                return Err(NoTurn::Stale { current: mark });
            }
        }
        if let Some(last) = self.queue.back() {
            if last.token > token {
                return Err(NoTurn::Superseded { waiting: last.token });
            }
            return Ok(None);
        }
        // Below a token that holds the key alone: as below one waiting (a
        // shared store's raise may hold it a while, waiting for the others).
        if let Some(alone) = self.alone.filter(|&t| self.holders > 0 && t > token) {
            return Err(NoTurn::Superseded { waiting: alone });
        }
        if self.holders == 0 {
            self.holders = 1;
            self.shared = None;
            self.alone = Some(token);
            return Ok(Some(match ask {
                Ask::Share => Held::Deciding,
                Ask::Alone => Held::Alone,
            }));
        }
        if ask == Ask::Share && self.shared == Some(token) {
            self.holders += 1;
            return Ok(Some(Held::Shared));
        }
        Ok(None)
    }

    /// Hands turns to the waiters at the front that may have one now: those
    /// that can share with the holders, or the first one once nobody holds
    /// the key. A wake-up whose waiter has gone comes back in `unclaimed`,
    /// to be dropped once the key's lock is released.
    fn wake(&mut self, gate: &Arc<KeyGate>, key: &Arc<str>, unclaimed: &mut Vec<Turn>) {
        loop {
            let held = match self.queue.front() {
                // A token below the mark joins too: its check refuses it.
                Some(w) if w.ask == Ask::Share && self.shared.is_some_and(|mark| w.token <= mark) => Held::Shared,
                Some(w) if self.holders == 0 => match w.ask {
                    Ask::Share => Held::Deciding,
                    Ask::Alone => Held::Alone,
                },
                _ => return,
            };
            let Some(waiter) = self.queue.pop_front() else { return };
            self.holders += 1;
            if held != Held::Shared {
                self.shared = None;
                self.alone = Some(waiter.token);
            }
            let turn = Turn { gate: gate.clone(), key: key.clone(), token: waiter.token, held };
            if let Err(turn) = waiter.wake.send(turn) {
                unclaimed.push(turn);
            }
            if held != Held::Shared {
                return;
            }
        }
    }

    fn is_idle(&self) -> bool {
        self.holders == 0 && self.queue.is_empty()
    }
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
    /// `timeout` for it (see the [module docs](self)).
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
            // A key without turns yet shares the request's key, not a copy.
            let mut turns = match self.keys.get_mut(&**key) {
                Some(turns) => turns,
                None => self.keys.entry(key.clone()).or_default(),
            };
            if let Some(held) = turns.arrive(token, ask)? {
                return Ok(Turn { gate: self.clone(), key: turns.key().clone(), token, held });
            }
            let (wake, woken) = oneshot::channel();
            let id = self.next_waiter.fetch_add(1, Ordering::Relaxed);
            turns.queue.push_back(Waiter { id, token, ask, wake });
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
    fn update(self: &Arc<Self>, key: &str, change: impl FnOnce(&mut KeyTurns)) {
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

impl Turn {
    /// The key's mark is now this turn's token (raised or confirmed under
    /// the turn): requests carrying it may share the key. A no-op for a turn
    /// that holds its key alone for good, or shares already.
    pub fn share(&mut self) {
        if self.held == Held::Deciding {
            self.held = Held::Shared;
            let token = self.token;
            self.gate.update(&self.key, |turns| {
                turns.shared = Some(token);
                turns.alone = None;
            });
        }
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.gate.update(&self.key, |turns| {
            turns.holders = turns.holders.saturating_sub(1);
            if turns.holders == 0 {
                turns.alone = None;
            }
        });
    }
}

/// A waiter in a key's queue; dropped before it has its turn (timed out, or
/// its request went away), it leaves the queue. A turn sent to it in the
/// meantime is dropped with the channel, which passes the turn on.
struct Queued<'a> {
    gate: &'a Arc<KeyGate>,
    key: &'a str,
    id: u64,
    /// Still in the queue, as far as this waiter knows.
    waiting: bool,
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        if self.waiting {
            let id = self.id;
            self.gate.update(self.key, |turns| turns.queue.retain(|w| w.id != id));
        }
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
    async fn waiters_get_the_turn_in_arrival_order() {
        let gate = Arc::new(KeyGate::default());
        let first = gate.acquire(&"k".into(), 1, Ask::Alone, LONG).await.unwrap();
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..5 {
            let (gate, order) = (gate.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let _turn = gate.acquire(&"k".into(), 1, Ask::Alone, LONG).await.unwrap();
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

    /// A task waiting for `key`'s turn with `token`; its result says whether
    /// it got one. It keeps the turn until `release` fires.
    fn waiter(
        gate: &Arc<KeyGate>,
        key: &'static str,
        token: u64,
        ask: Ask,
    ) -> (tokio::task::JoinHandle<Result<(), NoTurn>>, tokio::sync::oneshot::Sender<()>) {
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        let gate = gate.clone();
        let task = tokio::spawn(async move {
            let mut turn = gate.acquire(&key.into(), token, ask, LONG).await?;
            turn.share();
            let _ = released.await;
            Ok(())
        });
        (task, release)
    }

    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_holders_writes_share_the_key_once_its_mark_is_settled() {
        let gate = Arc::new(KeyGate::default());
        // The first request holds the key alone until it has raised the mark.
        let mut first = gate.acquire(&"k".into(), 5, Ask::Share, LONG).await.unwrap();
        let (second, release_second) = waiter(&gate, "k", 5, Ask::Share);
        settle().await;
        assert!(!second.is_finished());
        assert_eq!(gate.waiting(), 1);
        // Mark raised: the one that queued with the same token joins, and
        // later ones get the turn at once.
        first.share();
        settle().await;
        assert_eq!(gate.waiting(), 0);
        let third = gate.acquire(&"k".into(), 5, Ask::Share, Duration::ZERO).await.unwrap();
        // Below the mark: refused at once, not queued.
        assert_eq!(gate.acquire(&"k".into(), 4, Ask::Share, LONG).await.unwrap_err(), NoTurn::Stale { current: 5 });
        drop((first, third));
        release_second.send(()).unwrap();
        assert_eq!(second.await.unwrap(), Ok(()));
        assert_eq!(gate.active_keys(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_higher_token_waits_for_every_holder_and_is_not_starved() {
        let gate = Arc::new(KeyGate::default());
        let mut first = gate.acquire(&"k".into(), 5, Ask::Share, LONG).await.unwrap();
        first.share();
        let second = gate.acquire(&"k".into(), 5, Ask::Share, LONG).await.unwrap();
        // The new holder waits for both.
        let (raise, release_raise) = waiter(&gate, "k", 6, Ask::Share);
        settle().await;
        assert!(!raise.is_finished());
        // The old holder's writes that come now would be stale by their turn.
        assert_eq!(
            gate.acquire(&"k".into(), 5, Ask::Share, LONG).await.unwrap_err(),
            NoTurn::Superseded { waiting: 6 }
        );
        // The new holder's other writes queue behind it and share after it.
        let (with_raise, release_with_raise) = waiter(&gate, "k", 6, Ask::Share);
        drop(first);
        settle().await;
        assert!(!raise.is_finished(), "the higher token went while a holder was in flight");
        drop(second);
        settle().await;
        assert_eq!(gate.waiting(), 0, "both requests with token 6 hold the key");
        // A still higher token waits for both of them.
        let (higher, release_higher) = waiter(&gate, "k", 7, Ask::Share);
        settle().await;
        assert_eq!(gate.waiting(), 1);
        release_raise.send(()).unwrap();
        settle().await;
        assert!(!higher.is_finished());
        release_with_raise.send(()).unwrap();
        settle().await;
        assert_eq!(gate.waiting(), 0);
        release_higher.send(()).unwrap();
        for task in [raise, with_raise, higher] {
            assert_eq!(task.await.unwrap(), Ok(()));
        }
        assert_eq!(gate.active_keys(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn requests_that_ask_to_be_alone_never_share() {
        let gate = Arc::new(KeyGate::default());
        let mut first = gate.acquire(&"k".into(), 5, Ask::Alone, LONG).await.unwrap();
        // `share` does nothing for a turn held alone.
        first.share();
        assert_eq!(
            gate.acquire(&"k".into(), 5, Ask::Share, Duration::from_millis(10)).await.unwrap_err(),
            NoTurn::Timeout
        );
        assert_eq!(
            gate.acquire(&"k".into(), 5, Ask::Alone, Duration::from_millis(10)).await.unwrap_err(),
            NoTurn::Timeout
        );
        drop(first);
        // And one waiting to be alone is not joined by sharers.
        let mut sharing = gate.acquire(&"k".into(), 5, Ask::Share, LONG).await.unwrap();
        sharing.share();
        let (alone, release_alone) = waiter(&gate, "k", 5, Ask::Alone);
        settle().await;
        assert!(!alone.is_finished());
        assert_eq!(
            gate.acquire(&"k".into(), 5, Ask::Share, Duration::from_millis(10)).await.unwrap_err(),
            NoTurn::Timeout
        );
        drop(sharing);
        settle().await;
        assert_eq!(gate.waiting(), 0);
        assert_eq!(
            gate.acquire(&"k".into(), 5, Ask::Share, Duration::from_millis(10)).await.unwrap_err(),
            NoTurn::Timeout
        );
        release_alone.send(()).unwrap();
        assert_eq!(alone.await.unwrap(), Ok(()));
        assert_eq!(gate.active_keys(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_deciding_request_refused_passes_the_key_to_the_next_one_alone() {
        let gate = Arc::new(KeyGate::default());
        let arrive = |token| {
            let gate = gate.clone();
            tokio::spawn(async move { gate.acquire(&"k".into(), token, Ask::Share, LONG).await })
        };
        // The first to arrive decides; its check refuses it (the fence API
        // raised the mark meanwhile): it drops its turn without sharing.
        let deciding = gate.acquire(&"k".into(), 5, Ask::Share, LONG).await.unwrap();
        let (second, third) = (arrive(5), arrive(5));
        settle().await;
        assert_eq!(gate.waiting(), 2);
        drop(deciding);
        settle().await;
        // The second decides alone now, and the third waits for its
        // decision instead of sharing a mark nobody has confirmed.
        let mut second = second.await.unwrap().unwrap();
        assert_eq!(second.held, Held::Deciding);
        assert_eq!(gate.waiting(), 1);
        assert!(!third.is_finished());
        // The second raised the mark: the third joins it.
        second.share();
        let third = third.await.unwrap().unwrap();
        assert_eq!(third.held, Held::Shared);
        drop((second, third));
        assert_eq!(gate.active_keys(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lower_token_is_refused_while_a_higher_one_decides() {
        let gate = Arc::new(KeyGate::default());
        // A raise deciding (with a shared store, it may wait there for other
        // replicas' writes): a lower token would be stale by its turn.
        let deciding = gate.acquire(&"k".into(), 6, Ask::Share, LONG).await.unwrap();
        assert_eq!(
            gate.acquire(&"k".into(), 5, Ask::Share, LONG).await.unwrap_err(),
            NoTurn::Superseded { waiting: 6 }
        );
        assert_eq!(
            gate.acquire(&"k".into(), 5, Ask::Alone, LONG).await.unwrap_err(),
            NoTurn::Superseded { waiting: 6 }
        );
        // Its own token, or a higher one, waits for the decision.
        assert_eq!(
            gate.acquire(&"k".into(), 6, Ask::Share, Duration::from_millis(10)).await.unwrap_err(),
            NoTurn::Timeout
        );
        drop(deciding);
        // Once nobody holds the key, the lower token may decide.
        let lower = gate.acquire(&"k".into(), 5, Ask::Share, LONG).await.unwrap();
        assert_eq!(lower.held, Held::Deciding);
        drop(lower);
        // The same while a request holds the key alone for good.
        let alone = gate.acquire(&"k".into(), 8, Ask::Alone, LONG).await.unwrap();
        assert_eq!(
            gate.acquire(&"k".into(), 7, Ask::Share, LONG).await.unwrap_err(),
            NoTurn::Superseded { waiting: 8 }
        );
        drop(alone);
        assert_eq!(gate.active_keys(), 0);
    }

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
