//! The durable store: marks in a redb file on local disk, a journal in front of
//! it, a bounded cache in front of both, and group commit.
//!
//! - A raise is on disk (appended to the [journal](journal) and fsync'd)
//!   before `advance` returns `Accepted`, so a request is never forwarded on a
//!   mark that a crash could forget.
//! - A token equal to a durable mark touches no disk: the common case of one
//!   owner writing many times costs a map lookup.
//! - Raises from many requests are queued to one commit thread ([`commit`]),
//!   which appends everything queued as one journal frame with one fsync:
//!   writers share the cost.
//! - A fold thread ([`fold`]) writes the journal into the B-tree in the
//!   background, one transaction for everything since the previous fold, then
//!   empties it. Until a raise is folded, its mark is also kept in memory, where
//!   cache misses and listings look before they read the B-tree.
//! - The cache ([`cache`]) holds at most about `cache_keys` marks and
//!   `cache_bytes` bytes. Marks that are on disk and were not used since the
//!   last sweep leave memory (never the disk); a miss reads the mark back
//!   before deciding.
//! - An operator's delete ([`delete`]) runs on the commit thread, between
//!   commits, once the journal is folded: no replay can bring a deleted mark
//!   back.
//!
//! Lifecycle: [`FileStore::open`] starts the commit, fold and sweep threads and
//! needs no runtime; [`FileStore::close`] stops them once their work is on disk.

mod cache;
mod commit;
mod damage;
mod delete;
mod fold;
pub mod journal;
mod open;
mod raise;
mod relay;
#[cfg(test)]
mod tests;
mod upgrade;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use redb::{Database, TableDefinition};
use tokio::sync::Semaphore;

use super::{Advance, CommitStats, Deleted, FenceStore, LeaseRecord, LocalLeases, Selection, StoreError};
use crate::fence::KeyMap;
use cache::{Cached, Sweeper};
use commit::Queue;
use fold::Unfolded;

pub use open::OpenError;

const FENCES: TableDefinition<&str, u64> = TableDefinition::new("fences");
/// The store's own facts: [`CLEAN`].
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
/// 1 when the last process stopped cleanly with its journal folded, 0 while a
/// process has the store open. Missing in stores that never had a journal.
const CLEAN: &str = "clean";
/// The database file inside `[fences] path`.
const DB_FILE: &str = "fences.redb";
/// How long [`FileStore::close`] waits for the store's threads to finish.
const STOP_WAIT: Duration = Duration::from_secs(10);

/// When the journal is folded into the B-tree, and how far it may grow.
#[derive(Debug, Clone, Copy)]
struct Tuning {
    /// A journal file this long is handed to the fold thread.
    fold_bytes: u64,
    /// A journal file this long while the previous one is still being folded
    /// makes appends wait for the fold: the journal, and the marks kept in memory
    /// until they are folded, stay bounded when the B-tree can't keep up.
    max_journal_bytes: u64,
    /// How long an append waits for that fold before its batch fails (503).
    fold_wait: Duration,
    /// How long a raise or a cache miss waits for a delete that holds the
    /// store before it fails (503).
    turn_wait: Duration,
    /// A journal with anything in it is folded after this long without raises,
    /// so a restart after a quiet spell has little to replay.
    idle_fold: Duration,
    /// When the previous commit held more than one raise, the next one waits
    /// this long before it takes what is queued: a commit has a fixed CPU cost
    /// however few raises it holds, so under concurrent raises it pays to take
    /// more at once; a lone writer never waits.
    commit_delay: Duration,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            fold_bytes: 1 << 20,
            max_journal_bytes: 16 << 20,
            fold_wait: Duration::from_secs(5),
            turn_wait: Duration::from_secs(5),
            idle_fold: Duration::from_secs(1),
            commit_delay: Duration::from_micros(150),
        }
    }
}

/// How much the mark cache may hold: it is swept when either bound is passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheBounds {
    /// About this many marks (`[fences] cache_keys`).
    pub keys: usize,
    /// About this many bytes (`[fences] cache_bytes`): each mark counts its
    /// key's length plus a fixed overhead for its map entry and allocation.
    pub bytes: u64,
}

impl CacheBounds {
    /// Bounded in keys only.
    pub fn keys(keys: usize) -> CacheBounds {
        CacheBounds { keys, bytes: u64::MAX }
    }
}

/// Durable marks with a bounded cache; see the module docs.
///
/// Its async methods run on a tokio runtime: cache misses and listings read the
/// disk on its blocking pool. On a current-thread runtime, a raise waiting for
/// its commit is woken through a task spawned on that runtime the first time
/// (see `relay`), so such a runtime must be driven (`Runtime::block_on`).
///
/// Call [`close`](FileStore::close) before dropping it: dropping only tells the
/// threads to stop, and a start after an unclean stop replays the journal.
#[derive(Debug)]
pub struct FileStore {
    inner: Arc<Inner>,
    queue: Arc<Queue>,
    /// The store held fences when opened: a previous process wrote to it.
    reopened: bool,
    /// Holds no permits until the store's threads end: each gives one back as it ends.
    ended: Arc<Semaphore>,
}

#[derive(Debug)]
struct Inner {
    db: Arc<Database>,
    path: PathBuf,
    cache: KeyMap<Cached>,
    capacity: usize,
    /// `cache_bytes`, and what the cached marks count against it (see [`cache::charge`]).
    max_cached_bytes: u64,
    cached_bytes: AtomicU64,
    /// Read-held by every raise on its way to disk and every miss reading the
    /// disk; write-held by a delete, which so never races either (see [`delete`]).
    /// Hits of the cache, the hot path, never take it.
    turns: Arc<tokio::sync::RwLock<()>>,
    /// How long a raise or a miss waits for a delete (`Tuning::turn_wait`).
    turn_wait: Duration,
    /// Bumped on every eviction: a miss that read the disk before an eviction
    /// it did not see reads again, so a stale read can never re-enter the cache.
    evictions: AtomicU64,
    tracked: Arc<AtomicU64>,
    stats: Arc<CommitStats>,
    unfolded: Arc<Mutex<Unfolded>>,
    sweeper: Arc<Sweeper>,
    /// Cache misses read the disk on blocking threads, at most this many at once:
    /// a burst of new keys must not fill tokio's blocking pool (512 threads, each
    /// with its own allocator heap) or starve other blocking work.
    readers: Semaphore,
    /// Lease records, in memory: a restart ends every lease, and the marks
    /// on disk keep every token issued (fence/lease.rs).
    leases: LocalLeases,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing under these locks can leave their data half-changed.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What `advance` decided under the cache's shard lock.
enum Step {
    Stale(u64),
    Accepted(Option<u64>),
    Persist(Option<u64>),
}

impl FileStore {
    /// Whether the store held fences when it was opened, i.e. this is a restart.
    pub fn reopened(&self) -> bool {
        self.reopened
    }

    /// Where the database file is.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Stops taking raises (they fail with [`StoreError::Closing`]), lets the
    /// commit thread write what is queued and the fold thread fold the journal
    /// into the B-tree, and waits for the threads to end, at most ten seconds
    /// (`STOP_WAIT`): a clean stop leaves the B-tree complete and the journal
    /// empty. Nothing is lost if they take longer: the next start replays the
    /// journal. Reads keep working; calling it again waits again.
    pub async fn close(&self) {
        self.stop();
        let ended = self.ended.acquire_many(open::THREADS);
        if tokio::time::timeout(STOP_WAIT, ended).await.is_err() {
            tracing::warn!(
                wait = ?STOP_WAIT,
                "the fence store's threads are still writing; the next start replays the journal"
            );
        }
    }

    /// Tells the threads to stop, without waiting for them.
    fn stop(&self) {
        self.queue.close();
        self.inner.sweeper.stop();
    }
}

impl Drop for FileStore {
    /// The last resort when [`FileStore::close`] was not awaited: the threads
    /// are told to stop and finish on their own; nothing here waits, so a
    /// runtime thread is never blocked.
    fn drop(&mut self) {
        self.stop();
    }
}

impl FenceStore for FileStore {
    async fn get(&self, key: &str) -> Result<Option<u64>, StoreError> {
        loop {
            if let Some(mark) = self.peek(key) {
                return Ok(mark);
            }
            self.load(key).await?;
        }
    }

    /// A key in the cache (a key the cache holds no entry for may still have
    /// a mark on disk).
    fn peek(&self, key: &str) -> Option<Option<u64>> {
        let e = self.inner.cache.get(key)?;
        e.referenced.store(true, Ordering::Relaxed);
        Some(e.mark)
    }

    async fn advance(&self, key: &str, token: u64) -> Result<Advance, StoreError> {
        let step = loop {
            let step = self.inner.cache.get_mut(key).map(|mut e| {
                e.referenced.store(true, Ordering::Relaxed);
                match e.mark {
                    Some(mark) if token < mark => Step::Stale(mark),
                    Some(mark) if mark == token && e.durable == Some(token) => Step::Accepted(Some(mark)),
                    previous => {
                        // Raised in memory first: a lower token is refused from
                        // now on, while the raise is still on its way to disk.
                        e.mark = Some(token);
                        e.raising = e.raising.saturating_add(1);
                        Step::Persist(previous)
                    }
                }
            });
            match step {
                Some(step) => break step,
                None => self.load(key).await?,
            }
        };
        match step {
            Step::Stale(current) => Ok(Advance::Stale { current }),
            Step::Accepted(previous) => Ok(Advance::Accepted { previous }),
            Step::Persist(previous) => {
                // On failure the mark stays raised in memory and not durable:
                // fail closed, and the next request for the key tries again.
                self.persist_raised(key, token).await?;
                Ok(Advance::Accepted { previous })
            }
        }
    }

    async fn list(&self, prefix: &str, after: Option<&str>, limit: usize) -> Result<Vec<(String, u64)>, StoreError> {
        let (db, unfolded) = (self.inner.db.clone(), self.inner.unfolded.clone());
        let (prefix_owned, after_owned) = (prefix.to_string(), after.map(str::to_string));
        let (journaled, folded) = tokio::task::spawn_blocking(move || {
            // The journal's marks before the B-tree's, as in `read_mark`.
            let journaled = lock(&unfolded).list(&prefix_owned, after_owned.as_deref(), limit);
            cache::list_marks(&db, &prefix_owned, after_owned.as_deref(), limit).map(|folded| (journaled, folded))
        })
        .await
        .map_err(|e| StoreError::Task { context: "list task", source: Arc::new(e) })??;
        let mut merged = BTreeMap::<String, u64>::new();
        for (key, token) in folded.into_iter().chain(journaled) {
            let mark = merged.entry(key).or_insert(token);
            *mark = (*mark).max(token);
        }
        let mut found: Vec<(String, u64)> = merged.into_iter().take(limit).collect();
        // A raise on its way to disk is already enforced: show it.
        for (key, token) in &mut found {
            if let Some(Some(mark)) = self.inner.cache.get(key.as_str()).map(|e| e.mark) {
                *token = (*token).max(mark);
            }
        }
        Ok(found)
    }

    async fn delete(&self, which: &Selection) -> Result<Deleted, StoreError> {
        self.delete_marks(which).await
    }

    fn disk_bytes(&self) -> Option<u64> {
        Some(self.size_on_disk())
    }

    async fn lease(&self, key: &str) -> Result<Option<LeaseRecord>, StoreError> {
        Ok(self.inner.leases.get(key))
    }

    async fn swap_lease(
        &self,
        key: &str,
        expected: Option<&LeaseRecord>,
        new: Option<&LeaseRecord>,
    ) -> Result<bool, StoreError> {
        Ok(self.inner.leases.swap(key, expected, new))
    }

    fn tracked_keys(&self) -> usize {
        self.inner.tracked.load(Ordering::Relaxed) as usize
    }

    fn cached_keys(&self) -> usize {
        self.inner.cache.len()
    }

    fn stats(&self) -> Option<&CommitStats> {
        Some(&self.inner.stats)
    }

    /// The inherent [`FileStore::close`], which callers without the trait use.
    fn close(&self) -> impl std::future::Future<Output = ()> + Send {
        FileStore::close(self)
    }
}
