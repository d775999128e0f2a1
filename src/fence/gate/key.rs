//! One key's turns: who holds the key, who waits for it, and the rules of
//! invariant 2 that decide who goes next.

use std::collections::VecDeque;
use std::sync::Arc;

use tokio::sync::oneshot;

use super::map::KeyGate;
use super::turn::Turn;

/// How a request asks for a key's turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ask {
    /// It may share the key with requests carrying the same token, once that
    /// token is the key's mark.
    Share,
    /// It holds the key alone: a `strict` route, or a request writing two keys.
    Alone,
    /// As [`Share`](Ask::Share), for a request whose token the store had at
    /// hand as the key's mark, exactly: at an idle key it shares at once. Its
    /// advance changes nothing, so there is nothing to decide alone first
    /// (should the mark have moved since, its own advance refuses it, and so
    /// does every sharer's).
    ShareAtMark,
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

/// How a turn holds its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Held {
    /// Alone, until its check and advance are done: then it shares.
    Deciding,
    /// Alone, for as long as it is held.
    Alone,
    /// With the other requests carrying the key's mark.
    Shared,
}

/// One key's turns: who holds them and who waits.
#[derive(Debug, Default)]
pub(super) struct KeyTurns {
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
    pub(super) fn arrive(&mut self, token: u64, ask: Ask) -> Result<Option<Held>, NoTurn> {
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
            let held = match ask {
                Ask::Share => Held::Deciding,
                Ask::Alone => Held::Alone,
                Ask::ShareAtMark => Held::Shared,
            };
            (self.shared, self.alone) = match held {
                Held::Shared => (Some(token), None),
                _ => (None, Some(token)),
            };
            return Ok(Some(held));
        }
        if ask != Ask::Alone && self.shared == Some(token) {
            self.holders += 1;
            return Ok(Some(Held::Shared));
        }
        Ok(None)
    }

    /// Hands turns to the waiters at the front that may have one now: those
    /// that can share with the holders, or the first one once nobody holds
    /// the key. A wake-up whose waiter has gone comes back in `unclaimed`,
    /// to be dropped once the key's lock is released.
    pub(super) fn wake(&mut self, gate: &Arc<KeyGate>, key: &Arc<str>, unclaimed: &mut Vec<Turn>) {
        loop {
            let held = match self.queue.front() {
                // A token below the mark joins too: its check refuses it.
                Some(w) if w.ask != Ask::Alone && self.shared.is_some_and(|mark| w.token <= mark) => Held::Shared,
                // The mark a waiter had at hand may have moved while it
                // waited: it decides, as any other.
                Some(w) if self.holders == 0 => match w.ask {
                    Ask::Share | Ask::ShareAtMark => Held::Deciding,
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
            let turn = Turn::new(gate.clone(), key.clone(), waiter.token, held);
            if let Err(turn) = waiter.wake.send(turn) {
                unclaimed.push(turn);
            }
            if held != Held::Shared {
                return;
            }
        }
    }

    /// Queues a request that may not go yet (`arrive` said so).
    pub(super) fn join_queue(&mut self, id: u64, token: u64, ask: Ask, wake: oneshot::Sender<Turn>) {
        self.queue.push_back(Waiter { id, token, ask, wake });
    }

    /// A waiter gave up before it had its turn.
    pub(super) fn leave_queue(&mut self, id: u64) {
        self.queue.retain(|w| w.id != id);
    }

    /// The key's mark is now `token`: requests carrying it share the key.
    pub(super) fn share(&mut self, token: u64) {
        self.shared = Some(token);
        self.alone = None;
    }

    /// A holder dropped its turn.
    pub(super) fn leave(&mut self) {
        self.holders = self.holders.saturating_sub(1);
        if self.holders == 0 {
            self.alone = None;
        }
    }

    pub(super) fn is_idle(&self) -> bool {
        self.holders == 0 && self.queue.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::super::testing::{settle, waiter, LONG};
    use super::super::{Ask, KeyGate, NoTurn};
    use super::Held;

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

    /// A request the store had at hand at the key's mark shares an idle key
    /// at once; the rules for everyone else are the same as after a share.
    #[tokio::test(start_paused = true)]
    async fn a_token_at_the_mark_at_hand_shares_an_idle_key_at_once() {
        let gate = Arc::new(KeyGate::default());
        let first = gate.acquire(&"k".into(), 5, Ask::ShareAtMark, LONG).await.unwrap();
        assert_eq!(first.held(), Held::Shared);
        // Its token's other writes join without waiting, however they ask.
        let second = gate.acquire(&"k".into(), 5, Ask::Share, Duration::ZERO).await.unwrap();
        let third = gate.acquire(&"k".into(), 5, Ask::ShareAtMark, Duration::ZERO).await.unwrap();
        assert_eq!(third.held(), Held::Shared);
        // Below it: refused at once. Above it: a raise, which waits for all three.
        assert_eq!(
            gate.acquire(&"k".into(), 4, Ask::ShareAtMark, LONG).await.unwrap_err(),
            NoTurn::Stale { current: 5 }
        );
        let (raise, release_raise) = waiter(&gate, "k", 6, Ask::ShareAtMark);
        settle().await;
        assert!(!raise.is_finished());
        drop((first, second));
        settle().await;
        assert!(!raise.is_finished(), "a raise went while a write of the old mark was in flight");
        assert_eq!(gate.waiting(), 1);
        drop(third);
        settle().await;
        assert_eq!(gate.waiting(), 0, "the raise has its turn once the last write of the old mark ended");
        release_raise.send(()).unwrap();
        assert_eq!(raise.await.unwrap(), Ok(()));
        // Alone asks are never shared.
        let alone = gate.acquire(&"k".into(), 7, Ask::Alone, LONG).await.unwrap();
        assert_eq!(alone.held(), Held::Alone);
        assert_eq!(
            gate.acquire(&"k".into(), 7, Ask::ShareAtMark, Duration::from_millis(10)).await.unwrap_err(),
            NoTurn::Timeout
        );
        drop(alone);
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
        assert_eq!(second.held(), Held::Deciding);
        assert_eq!(gate.waiting(), 1);
        assert!(!third.is_finished());
        // The second raised the mark: the third joins it.
        second.share();
        let third = third.await.unwrap().unwrap();
        assert_eq!(third.held(), Held::Shared);
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
        assert_eq!(lower.held(), Held::Deciding);
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
}
