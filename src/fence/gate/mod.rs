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
//! it with the same token join it. A request whose token the store had at
//! hand as the key's mark, exactly, asks [`Ask::ShareAtMark`]: at an idle key
//! it shares at once, since its advance has nothing to change (the holder's
//! writes, the common case, skip one update of the key's entry).
//!
//! A key's entry exists only while someone holds or waits for its turn, so a
//! million keys written once leave nothing behind.
//!
//! One concern a file: `map` (the gate: each key to its turns, and how a
//! request asks for one), `key` (one key's holders and queue, and the rules
//! of who goes next), `turn` (the right to forward, passed on when dropped),
//! `waiting` (a waiter that leaves its queue when it gives up, and the
//! count of waiters). `map`, `key` and `turn` use each other: a turn holds
//! the gate it came from, to pass the key on when it is dropped.

mod key;
mod map;
mod turn;
mod waiting;

pub use key::{Ask, NoTurn};
pub use map::KeyGate;
pub use turn::Turn;

/// What the tests of the files here share.
#[cfg(test)]
mod testing {
    use std::sync::Arc;
    use std::time::Duration;

    use super::{Ask, KeyGate, NoTurn};

    pub(super) const LONG: Duration = Duration::from_secs(3600);

    /// A task waiting for `key`'s turn with `token`; its result says whether
    /// it got one. It keeps the turn until `release` fires.
    pub(super) fn waiter(
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

    pub(super) async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }
}
