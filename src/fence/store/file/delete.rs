//! Deleting marks, for operators who know their keys are dead, and the
//! store's size on disk.
//!
//! A delete must never be undone by a restart, and must never take a mark it
//! was not asked for. Every record in the journal says "this key's mark is at
//! least this token", and replaying takes maxima, so a deleted key's old
//! records would bring it back. So the delete runs on the commit thread,
//! between commits: it first has the fold thread write every journaled mark
//! into the B-tree and empty both journal files, then removes the marks from
//! the B-tree (fsync'd): a key in one transaction, a prefix in batches of
//! bounded size. A crash before a commit leaves every mark it would remove;
//! after the last, nothing on disk holds the deleted ones. A prefix delete cut
//! short by a crash has removed some of its marks: asking again finishes it.
//!
//! Raises and misses take the store's turns (`Inner::turns`) for reading; a
//! delete takes them for writing. So no raise is on its way to disk while a
//! delete runs: each raise is wholly before the delete (and deleted) or wholly
//! after it (and kept, as a new mark). No miss reads the disk while it runs
//! either, so a mark read before the delete never enters the cache after it.
//! They wait for it at most `turn_wait` (5 s), then fail with 503.

// redb's error type is large; these results travel between blocking threads,
// never through the request hot path.
#![allow(clippy::result_large_err)]

use std::os::unix::fs::MetadataExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use redb::{Database, ReadableTable};
use tokio::sync::oneshot;

use super::cache::Cached;
use super::commit::{Committer, Queue};
use super::{journal, FileStore, Inner, DB_FILE, FENCES};
use crate::fence::store::{Deleted, Selection, StoreError};

/// A delete on its way to the commit thread.
pub(super) struct DeleteJob {
    pub(super) which: Selection,
    pub(super) reply: oneshot::Sender<Result<Deleted, StoreError>>,
}

impl std::fmt::Debug for DeleteJob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeleteJob").field("which", &self.which).finish_non_exhaustive()
    }
}

impl FileStore {
    /// See [`FenceStore::delete`](crate::fence::store::FenceStore::delete) and the module docs.
    ///
    /// The delete runs on a task of its own, which the caller only awaits:
    /// dropping the caller (a client that goes away, a listener's drain) must
    /// not release the turns while the job still waits on the commit thread,
    /// or a raise could reach the disk before the delete and be wiped by it
    /// while the cache keeps enforcing it.
    pub(super) async fn delete_marks(&self, which: &Selection) -> Result<Deleted, StoreError> {
        let (inner, queue, which) = (self.inner.clone(), self.queue.clone(), which.clone());
        tokio::spawn(async move { inner.delete_whole(&queue, &which).await })
            .await
            .map_err(|e| StoreError::Task { context: "delete task", source: Arc::new(e) })?
    }

    /// Bytes the B-tree file and the journal files take on disk (allocated
    /// blocks, as `du` counts them): three `stat` calls.
    pub(super) fn size_on_disk(&self) -> u64 {
        let Some(dir) = self.inner.path.parent() else { return 0 };
        std::iter::once(DB_FILE)
            .chain(journal::FILES)
            .filter_map(|name| std::fs::metadata(dir.join(name)).ok())
            .map(|meta| meta.blocks() * 512)
            .sum()
    }
}

impl Inner {
    /// The delete, from taking the turns to forgetting the cached marks.
    async fn delete_whole(&self, queue: &Queue, which: &Selection) -> Result<Deleted, StoreError> {
        let _all = self.turns.write().await;
        let (reply, answer) = oneshot::channel();
        {
            let mut pending = queue.lock();
            if let Some(refusal) = pending.refusal() {
                return Err(refusal);
            }
            pending.deletes.push(DeleteJob { which: which.clone(), reply });
        }
        queue.wake();
        let deleted = answer.await.map_err(|_| StoreError::CommitterStopped)??;
        // Only now that the disk no longer holds them, or a miss could read
        // them back.
        self.forget(which);
        let _ =
            self.tracked.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| Some(n.saturating_sub(deleted.count)));
        Ok(deleted)
    }

    /// Drops the cached marks `which` selects.
    ///
    /// An entry with a raise waiting for the turns stays: that raise comes
    /// after the delete and keeps its mark in memory, but nothing of the key
    /// is on disk any more, so the raise counts the key as new when it lands.
    fn forget(&self, which: &Selection) {
        let forget_one = |key: &str, e: &mut Cached| {
            if e.raising > 0 {
                e.durable = None;
                return true;
            }
            self.evicting(key);
            false
        };
        match which {
            Selection::Key(key) => {
                self.cache.remove_if_mut(key.as_str(), |key, e| !forget_one(key, e));
            }
            // A walk over the cache (bounded by `cache_keys`), for a rare
            // operator's call: cheaper than keeping the cache in order.
            Selection::Prefix(prefix) => {
                self.cache.retain(|key, e| !key.starts_with(prefix.as_str()) || forget_one(key, e))
            }
        }
    }
}

impl Committer {
    /// Runs one delete on the commit thread: folds the whole journal, then
    /// removes the marks from the B-tree.
    pub(super) fn delete(&mut self, which: &Selection) -> Result<Deleted, StoreError> {
        self.fold_everything()?;
        remove_from_tree(&self.db, which)
            .map_err(|e| StoreError::Database { context: "deleting from the fence store", source: Arc::new(e) })
    }
}

/// Most marks one transaction of a prefix delete removes.
const BATCH_KEYS: usize = 4096;
/// Most key bytes one transaction of a prefix delete holds in memory.
const BATCH_KEY_BYTES: usize = 1 << 20;

/// Removes the marks `which` selects from the B-tree: one key in one
/// transaction; a prefix in transactions of at most [`BATCH_KEYS`] keys and
/// [`BATCH_KEY_BYTES`] bytes of keys each, so memory stays bounded whatever
/// the prefix matches.
fn remove_from_tree(db: &Database, which: &Selection) -> Result<Deleted, redb::Error> {
    let prefix = match which {
        Selection::Key(key) => {
            let txn = db.begin_write()?;
            let token = txn.open_table(FENCES)?.remove(key.as_str())?.map(|v| v.value());
            txn.commit()?;
            return Ok(Deleted { count: u64::from(token.is_some()), token });
        }
        Selection::Prefix(prefix) => prefix.as_str(),
    };
    let mut count = 0;
    loop {
        let txn = db.begin_write()?;
        let (removed, more) = {
            let mut table = txn.open_table(FENCES)?;
            // redb's range borrows the table: the keys are read first, then removed.
            let (mut keys, mut bytes, mut more) = (Vec::new(), 0, false);
            for item in table.range(prefix..)? {
                let (key, _) = item?;
                let key = key.value();
                if !key.starts_with(prefix) {
                    break;
                }
                if keys.len() == BATCH_KEYS || bytes >= BATCH_KEY_BYTES {
                    more = true;
                    break;
                }
                bytes += key.len();
                keys.push(key.to_string());
            }
            for key in &keys {
                table.remove(key.as_str())?;
            }
            (keys.len() as u64, more)
        };
        txn.commit()?;
        count += removed;
        if !more {
            return Ok(Deleted { count, token: None });
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::super::tests::{poll_once_and_drop, wait_until};
    use super::super::{CacheBounds, Tuning};
    use super::*;
    use crate::fence::store::{Advance, FenceStore};

    async fn raise_all(store: &FileStore, keys: &[(&str, u64)]) {
        for (key, token) in keys {
            assert!(matches!(store.advance(key, *token).await.unwrap(), Advance::Accepted { .. }), "{key}");
        }
    }

    #[tokio::test]
    async fn deleted_marks_stay_deleted_across_a_clean_and_an_unclean_restart() {
        let dir = tempfile::tempdir().unwrap();
        // Folding after every append: some marks are in the tree, some only in the journal.
        let tuning = Tuning { fold_bytes: 64, ..Tuning::default() };
        let store = FileStore::open_tuned_with(dir.path(), false, CacheBounds::keys(100), tuning).unwrap();
        raise_all(&store, &[("/a", 5), ("/b", 6), ("/p/1", 7), ("/p/2", 8), ("/pq", 9), ("/a", 10)]).await;
        assert_eq!(store.tracked_keys(), 5);
        let deleted = store.delete(&Selection::Key("/a".into())).await.unwrap();
        assert_eq!(deleted, Deleted { count: 1, token: Some(10) });
        assert_eq!(store.delete(&Selection::Key("/a".into())).await.unwrap(), Deleted { count: 0, token: None });
        let deleted = store.delete(&Selection::Prefix("/p/".into())).await.unwrap();
        assert_eq!(deleted, Deleted { count: 2, token: None });
        assert_eq!(store.tracked_keys(), 2);
        assert_eq!(store.get("/a").await.unwrap(), None);
        assert_eq!(store.list("", None, 10).await.unwrap(), [("/b".into(), 6), ("/pq".into(), 9)]);
        // A raise after the delete starts over, and is durable as any raise.
        raise_all(&store, &[("/p/1", 1)]).await;
        // Dropped without closing: the threads stop where they are and the
        // next start replays the journal, as after a crash.
        drop(store);
        let store = loop {
            match FileStore::open(dir.path(), true, 100) {
                Ok(store) => break store,
                Err(super::super::OpenError::InUse(_)) => tokio::time::sleep(Duration::from_millis(10)).await,
                Err(e) => panic!("{e}"),
            }
        };
        let marks = store.list("", None, 10).await.unwrap();
        assert_eq!(marks, [("/b".into(), 6), ("/p/1".into(), 1), ("/pq".into(), 9)]);
        store.close().await;
        drop(store);
        let store = FileStore::open(dir.path(), true, 100).unwrap();
        assert_eq!(store.get("/a").await.unwrap(), None);
        assert_eq!(store.get("/p/2").await.unwrap(), None);
        store.close().await;
    }

    #[tokio::test]
    async fn a_delete_whose_caller_went_away_never_wipes_a_later_raise() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(FileStore::open(dir.path(), false, 100).unwrap());
        raise_all(&store, &[("/k", 5)]).await;
        // Folds the journal: the deletes below go straight to the B-tree.
        store.delete(&Selection::Key("/none".into())).await.unwrap();
        let taken = || store.queue.deletes_taken.load(Ordering::SeqCst);
        assert_eq!(taken(), 1);
        // A write transaction of the test's own holds the commit thread in the
        // next delete's removal, with the delete for /k queued behind it.
        let held = store.inner.db.begin_write().unwrap();
        poll_once_and_drop(store.delete(&Selection::Key("/other".into()))).await;
        wait_until("the commit thread to take the first delete", || taken() == 2).await;
        poll_once_and_drop(store.delete(&Selection::Key("/k".into()))).await;
        // A raise of /k asked after the delete was: it must land after it.
        let raise = tokio::spawn({
            let store = store.clone();
            async move { store.advance("/k", 12).await }
        });
        wait_until("the raise to be queued, or to wait for the delete", || {
            let raised = store.inner.cache.get("/k").is_some_and(|e| e.mark == Some(12));
            store.queue.lock().has_raises() || (raised && store.inner.turns.try_read().is_err())
        })
        .await;
        drop(held);
        assert!(matches!(raise.await.unwrap().unwrap(), Advance::Accepted { .. }));
        let enforced = store.get("/k").await.unwrap();
        assert_eq!(enforced, Some(12), "a raise after a delete is kept");
        // What the disk holds once the queued work is done is what was enforced.
        store.close().await;
        drop(store);
        let reopened = FileStore::open(dir.path(), true, 100).unwrap();
        assert_eq!(reopened.get("/k").await.unwrap(), enforced);
        reopened.close().await;
    }

    #[tokio::test]
    async fn a_raise_that_waited_for_a_delete_is_counted_as_a_new_key() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(FileStore::open(dir.path(), false, 100).unwrap());
        raise_all(&store, &[("/k", 5), ("/j", 1)]).await;
        store.delete(&Selection::Key("/none".into())).await.unwrap();
        assert_eq!(store.tracked_keys(), 2);
        // The delete of /k is held on the commit thread while a raise of /k
        // waits for it.
        let held = store.inner.db.begin_write().unwrap();
        let delete = tokio::spawn({
            let store = store.clone();
            async move { store.delete(&Selection::Key("/k".into())).await }
        });
        wait_until("the commit thread to take the delete", || store.queue.deletes_taken.load(Ordering::SeqCst) == 2)
            .await;
        let raise = tokio::spawn({
            let store = store.clone();
            async move { store.advance("/k", 12).await }
        });
        wait_until("the raise to wait for the delete", || {
            store.inner.cache.get("/k").is_some_and(|e| e.mark == Some(12))
        })
        .await;
        drop(held);
        assert_eq!(delete.await.unwrap().unwrap(), Deleted { count: 1, token: Some(5) });
        assert_eq!(raise.await.unwrap().unwrap(), Advance::Accepted { previous: Some(5) });
        assert_eq!(store.get("/k").await.unwrap(), Some(12));
        // /j and /k, as a restart counts them.
        assert_eq!(store.tracked_keys(), 2);
        store.close().await;
        drop(store);
        let reopened = FileStore::open(dir.path(), true, 100).unwrap();
        assert_eq!(reopened.tracked_keys(), 2);
        reopened.close().await;
    }

    #[tokio::test]
    async fn a_prefix_delete_removes_more_marks_than_one_batch_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::open(dir.path(), false, 100).unwrap();
        let many = BATCH_KEYS * 2 + 5;
        let txn = store.inner.db.begin_write().unwrap();
        {
            let mut table = txn.open_table(FENCES).unwrap();
            for i in 0..many {
                table.insert(format!("/p/{i}").as_str(), 1).unwrap();
            }
            table.insert("/q", 2).unwrap();
            table.insert("/o", 3).unwrap();
        }
        txn.commit().unwrap();
        let deleted = store.delete(&Selection::Prefix("/p/".into())).await.unwrap();
        assert_eq!(deleted, Deleted { count: many as u64, token: None });
        assert_eq!(store.list("", None, 10).await.unwrap(), [("/o".into(), 3), ("/q".into(), 2)]);
        store.close().await;
    }

    #[tokio::test]
    async fn raises_and_misses_wait_for_a_delete_at_most_turn_wait() {
        let dir = tempfile::tempdir().unwrap();
        let tuning = Tuning { turn_wait: Duration::from_millis(50), ..Tuning::default() };
        let store = Arc::new(FileStore::open_tuned_with(dir.path(), false, CacheBounds::keys(100), tuning).unwrap());
        raise_all(&store, &[("/k", 5)]).await;
        store.delete(&Selection::Key("/none".into())).await.unwrap();
        // The delete is held on the commit thread, with the turns.
        let held = store.inner.db.begin_write().unwrap();
        let delete = tokio::spawn({
            let store = store.clone();
            async move { store.delete(&Selection::Key("/k".into())).await }
        });
        wait_until("the commit thread to take the delete", || store.queue.deletes_taken.load(Ordering::SeqCst) == 2)
            .await;
        assert!(matches!(store.advance("/k", 6).await, Err(StoreError::Deleting(_))));
        assert!(matches!(store.get("/uncached").await, Err(StoreError::Deleting(_))));
        drop(held);
        assert_eq!(delete.await.unwrap().unwrap(), Deleted { count: 1, token: Some(5) });
        assert_eq!(store.advance("/k", 1).await.unwrap(), Advance::Accepted { previous: None });
        store.close().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn raises_racing_a_delete_are_wholly_before_or_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(FileStore::open(dir.path(), false, 1000).unwrap());
        let raisers: Vec<_> = (0..4u64)
            .map(|t| {
                let store = store.clone();
                tokio::spawn(async move {
                    for i in 0..50u64 {
                        store.advance("/k", i * 4 + t).await.ok();
                    }
                })
            })
            .collect();
        for _ in 0..5 {
            store.delete(&Selection::Key("/k".into())).await.unwrap();
        }
        for raiser in raisers {
            raiser.await.unwrap();
        }
        // Whatever the interleaving, what the cache enforces is what the disk holds.
        let enforced = store.get("/k").await.unwrap();
        store.close().await;
        let path = store.path().parent().unwrap().to_path_buf();
        drop(store);
        let reopened = FileStore::open(&path, true, 1000).unwrap();
        assert_eq!(reopened.get("/k").await.unwrap(), enforced);
        reopened.close().await;
    }

    #[tokio::test]
    async fn the_cache_stays_within_its_bytes_and_every_mark_stays_enforced() {
        let dir = tempfile::tempdir().unwrap();
        let bytes = 64 * 1024;
        let store = FileStore::open_with(dir.path(), false, CacheBounds { keys: 1_000_000, bytes }).unwrap();
        let long = "x".repeat(900);
        for i in 0..400u64 {
            raise_all(&store, &[(&format!("/{i}/{long}"), i + 1)]).await;
            super::super::cache::sweep(&store.inner);
        }
        let cached = store.inner.cached_bytes.load(Ordering::Relaxed);
        assert!(cached <= bytes, "{cached} bytes cached, bound {bytes}");
        assert!(store.cached_keys() < 100, "{} marks cached", store.cached_keys());
        for i in 0..400u64 {
            let key = format!("/{i}/{long}");
            assert_eq!(store.advance(&key, i).await.unwrap(), Advance::Stale { current: i + 1 }, "{i}");
        }
        assert!(store.size_on_disk() > 400 * 900);
        store.close().await;
    }
}
