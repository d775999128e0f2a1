//! A raise on its way to disk, and what it leaves in the cache.
//!
//! `advance` raises a mark in memory first (so a lower token is refused at
//! once), then waits for the store's turn and for the commit. Each such raise
//! is counted on its cache entry (`Cached::raising`) until it is settled,
//! exactly once, whatever happens to its caller:
//!
//! - committed: the mark is durable, and a key new to the disk is counted in
//!   `fencegate_tracked_keys`;
//! - failed (disk error, closing, a delete holding the turns too long): the
//!   request was refused and nothing was forwarded; the mark stays enforced
//!   (fail closed) until the sweep needs the room;
//! - cancelled (its caller went away) once queued: a task waits for the
//!   commit's outcome and settles it then, holding the turn until it has, so
//!   no delete comes between the commit and the count.
//!
//! An entry with a raise unsettled never leaves the cache: its mark may be on
//! the disk before the entry says so.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::sync::OwnedRwLockReadGuard;

use super::commit::Batch;
use super::{FileStore, Inner};
use crate::fence::store::StoreError;

impl Inner {
    /// A turn for a raise or a miss: a delete holds the turns, and this waits
    /// for it at most `turn_wait`.
    pub(super) async fn turn(&self) -> Result<OwnedRwLockReadGuard<()>, StoreError> {
        tokio::time::timeout(self.turn_wait, self.turns.clone().read_owned())
            .await
            .map_err(|_| StoreError::Deleting(self.turn_wait))
    }
}

impl FileStore {
    /// Makes durable the raise of `key` to `token` that `advance` made in
    /// memory (and counted on the entry), and settles it.
    pub(super) async fn persist_raised(&self, key: &str, token: u64) -> Result<(), StoreError> {
        let mut raising = Raising { inner: &self.inner, key, token, turn: None, batch: None, settled: false };
        let outcome = async {
            raising.turn = Some(self.inner.turn().await?);
            let batch = self.queue_raise(key, token)?;
            raising.batch = Some(batch.clone());
            batch.outcome().await
        }
        .await;
        raising.settled = true;
        settle(&self.inner, key, token, outcome.is_ok());
        outcome
    }
}

/// One raise between `advance` and its settling; settles it when dropped early.
struct Raising<'a> {
    inner: &'a Arc<Inner>,
    key: &'a str,
    token: u64,
    turn: Option<OwnedRwLockReadGuard<()>>,
    /// The commit it is in, once queued.
    batch: Option<Arc<Batch>>,
    settled: bool,
}

impl Drop for Raising<'_> {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        let Some(batch) = self.batch.take() else {
            // Never queued: nothing of it can reach the disk.
            settle(self.inner, self.key, self.token, false);
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // No runtime left to wait on (it is ending): the entry keeps its
            // mark, enforced, until fencegate exits.
            return;
        };
        let (inner, key, token, turn) = (self.inner.clone(), self.key.to_owned(), self.token, self.turn.take());
        runtime.spawn(async move {
            let committed = batch.outcome().await.is_ok();
            settle(&inner, &key, token, committed);
            drop(turn);
        });
    }
}

/// Settles one raise of `key` to `token`: see the module docs.
fn settle(inner: &Inner, key: &str, token: u64, committed: bool) {
    // An entry with a raise unsettled is neither swept nor forgotten by a
    // delete (which resets it instead), so it is still here.
    let Some(mut e) = inner.cache.get_mut(key) else { return };
    e.raising = e.raising.saturating_sub(1);
    if committed {
        if e.durable.is_none() {
            inner.tracked.fetch_add(1, Ordering::Relaxed);
        }
        e.durable = e.durable.max(Some(token));
        e.mark = e.mark.max(Some(token));
    }
}
