//! The durable store: marks in a redb file on local disk, a bounded cache in
//! front of it, and group commit.
//!
//! - A raise is committed (fsync'd) before `advance` returns `Accepted`, so a
//!   request is never forwarded on a mark that a crash could forget.
//! - A token equal to a durable mark touches no disk: the common case of one
//!   owner writing many times costs a map lookup.
//! - Raises from many requests are queued to one committer thread, which writes
//!   everything queued in one transaction with one fsync: writers share the cost.
//! - The cache holds at most about `cache_keys` marks. Marks that are on disk and
//!   were not used since the last sweep leave memory (never the disk); a miss
//!   reads the mark back before deciding.

// redb's error type is large; these results travel between the commit thread,
// blocking reads and start-up, never through the request hot path.
#![allow(clippy::result_large_err)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError, Weak};
use std::time::{Duration, Instant};

use crate::fence::KeyMap;
use dashmap::mapref::entry::Entry;
use redb::{Database, DatabaseError, ReadableTableMetadata, StorageError, TableDefinition};
use tokio::sync::Notify;

use super::{Advance, CommitStats, FenceStore, StoreError};

const FENCES: TableDefinition<&str, u64> = TableDefinition::new("fences");
/// The database file inside `[fences] path`.
pub const DB_FILE: &str = "fences.redb";
/// redb's own page cache. The mark cache in front of it does the heavy lifting.
const DISK_CACHE_BYTES: usize = 16 << 20;
/// Most cache misses reading the disk at once (each on a blocking thread).
const MAX_READERS: usize = 16;
/// Sweeps leave the cache this far below `cache_keys`, so they don't run on every miss.
const SWEEP_TARGET_PERCENT: usize = 90;

/// Why the store could not be opened; fencegate refuses to start.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(
        "fence store {0} does not exist and [fences] require_existing = true: refusing to start without fences \
         (mount the volume that holds it, or set require_existing = false to start empty on purpose)"
    )]
    Missing(PathBuf),
    #[error("cannot create the fence store directory {path}: {source}")]
    CreateDir { path: PathBuf, source: std::io::Error },
    #[error("fence store {0} is open in another process (is another fencegate running on the same path?)")]
    InUse(PathBuf),
    #[error(
        "fence store {path} is unreadable or corrupt ({detail}): refusing to start without its fences. \
         Restore it from a backup; only move it away if starting with no fences is really what you want"
    )]
    Corrupt { path: PathBuf, detail: String },
}

/// Durable marks with a bounded cache; see the [module docs](self).
#[derive(Debug)]
pub struct FileStore {
    inner: Arc<Inner>,
    queue: Arc<Queue>,
    /// The store held fences when opened: a previous process wrote to it.
    reopened: bool,
}

#[derive(Debug)]
struct Inner {
    db: Arc<Database>,
    path: PathBuf,
    cache: KeyMap<Cached>,
    capacity: usize,
    /// Bumped on every eviction: a miss that read the disk before an eviction
    /// it did not see reads again, so a stale read can never re-enter the cache.
    evictions: AtomicU64,
    tracked: Arc<AtomicU64>,
    stats: Arc<CommitStats>,
    sweep: Arc<Notify>,
    /// Cache misses read the disk on blocking threads, at most this many at once:
    /// a burst of new keys must not fill tokio's blocking pool (512 threads, each
    /// with its own allocator heap) or starve other blocking work.
    readers: tokio::sync::Semaphore,
}

#[derive(Debug)]
struct Cached {
    /// The mark fencegate enforces. Never below `durable`.
    mark: Option<u64>,
    /// The highest mark known to be on disk.
    durable: Option<u64>,
    /// Used since the last sweep (second-chance eviction).
    referenced: AtomicBool,
}

impl Cached {
    fn evictable(&mut self) -> bool {
        self.mark == self.durable && !self.referenced.swap(false, Ordering::Relaxed)
    }
}

/// Raises on their way to the commit thread.
///
/// Handing a raise over costs a push under a mutex; the commit thread is woken
/// only when it was idle, and it answers a whole batch at once: everyone in a
/// batch waits on the same [`Batch`], not on a channel of their own.
#[derive(Debug, Default)]
struct Queue {
    pending: Mutex<Pending>,
    wake: Condvar,
}

#[derive(Debug, Default)]
struct Pending {
    /// Keys and tokens for the next commit.
    raises: Vec<(Box<str>, u64)>,
    /// Where the next commit's outcome will be posted.
    batch: Arc<Batch>,
    /// The commit thread is waiting for work.
    idle: bool,
    /// The store was dropped, or the commit thread stopped.
    closed: bool,
}

/// The outcome of one commit, posted once for every raise in it.
#[derive(Debug, Default)]
struct Batch {
    outcome: OnceLock<Result<(), StoreError>>,
    posted: Notify,
}

impl Batch {
    async fn outcome(&self) -> Result<(), StoreError> {
        let posted = self.posted.notified();
        tokio::pin!(posted);
        // Registered before looking, so a post in between still wakes us.
        posted.as_mut().enable();
        if let Some(outcome) = self.outcome.get() {
            return outcome.clone();
        }
        posted.await;
        self.outcome.get().cloned().unwrap_or_else(|| Err(committer_stopped()))
    }

    fn post(&self, outcome: Result<(), StoreError>) {
        let _ = self.outcome.set(outcome);
        self.posted.notify_waiters();
    }
}

impl Queue {
    fn lock(&self) -> MutexGuard<'_, Pending> {
        // Nothing under this lock can leave the queue half-changed.
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn committer_stopped() -> StoreError {
    StoreError("the commit thread has stopped".into())
}

enum Step {
    Stale(u64),
    Accepted(Option<u64>),
    Persist(Option<u64>),
}

impl FileStore {
    /// Opens (or, unless `require_existing`, creates) the store in directory `dir`.
    /// Must be called inside a tokio runtime (the cache sweeper is a task).
    pub fn open(dir: &Path, require_existing: bool, cache_keys: usize) -> Result<FileStore, OpenError> {
        let file = dir.join(DB_FILE);
        // An empty file is no store: a first start that crashed before its first
        // commit leaves one, and so does a copy that went wrong.
        let exists = std::fs::metadata(&file).map(|m| m.len() > 0).unwrap_or(false);
        if !exists {
            if require_existing {
                return Err(OpenError::Missing(file));
            }
            std::fs::create_dir_all(dir).map_err(|source| OpenError::CreateDir { path: dir.to_path_buf(), source })?;
        }
        let corrupt = |detail: String| OpenError::Corrupt { path: file.clone(), detail };
        // redb panics instead of returning an error on some damaged files (one
        // shorter or longer than its header says): report those as corrupt too.
        let opened = std::panic::catch_unwind(|| Database::builder().set_cache_size(DISK_CACHE_BYTES).create(&file))
            .map_err(|panic| {
                let detail = panic
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| panic.downcast_ref::<&str>().copied())
                    .unwrap_or("the store library panicked while opening it");
                corrupt(detail.to_string())
            })?;
        let db = opened.map_err(|e| match e {
            DatabaseError::DatabaseAlreadyOpen => OpenError::InUse(file.clone()),
            DatabaseError::Storage(StorageError::Io(io)) if io.kind() == std::io::ErrorKind::WouldBlock => {
                OpenError::InUse(file.clone())
            }
            other => corrupt(other.to_string()),
        })?;
        // Create the table once, so readers never meet a missing table, and count
        // what was recovered.
        let recovered = (|| -> Result<u64, redb::Error> {
            let txn = db.begin_write()?;
            let len = txn.open_table(FENCES)?.len()?;
            txn.commit()?;
            Ok(len)
        })()
        .map_err(|e| corrupt(e.to_string()))?;
        tracing::info!(path = %file.display(), fences = recovered, "fence store opened");

        let db = Arc::new(db);
        let stats = Arc::new(CommitStats::default());
        let tracked = Arc::new(AtomicU64::new(recovered));
        let queue = Arc::new(Queue::default());
        {
            let (db, queue, stats, tracked) = (db.clone(), queue.clone(), stats.clone(), tracked.clone());
            std::thread::Builder::new()
                .name("fencegate-commit".into())
                .spawn(move || run_committer(&db, &queue, &stats, &tracked))
                .map_err(|e| corrupt(format!("cannot start the commit thread: {e}")))?;
        }
        let inner = Arc::new(Inner {
            db,
            path: file,
            cache: KeyMap::default(),
            capacity: cache_keys.max(1),
            evictions: AtomicU64::new(0),
            tracked,
            stats,
            sweep: Arc::new(Notify::new()),
            readers: tokio::sync::Semaphore::new(MAX_READERS),
        });
        tokio::spawn(run_sweeper(Arc::downgrade(&inner), inner.sweep.clone()));
        Ok(FileStore { inner, queue, reopened: recovered > 0 })
    }

    /// Whether the store held fences when it was opened, i.e. this is a restart.
    pub fn reopened(&self) -> bool {
        self.reopened
    }

    /// Where the database file is.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Reads `key` from disk into the cache unless it is there already.
    async fn load(&self, key: &str) -> Result<(), StoreError> {
        let inner = &self.inner;
        loop {
            let seen_evictions = inner.evictions.load(Ordering::SeqCst);
            let disk = {
                let _reader = inner.readers.acquire().await.map_err(|_| StoreError("the store is closing".into()))?;
                read_mark(inner.db.clone(), key.into()).await?
            };
            match inner.cache.entry(key.into()) {
                Entry::Occupied(_) => return Ok(()),
                Entry::Vacant(slot) => {
                    // Under the shard lock: an eviction since the read may have
                    // removed a newer mark than the one read; read again.
                    if inner.evictions.load(Ordering::SeqCst) != seen_evictions {
                        continue;
                    }
                    slot.insert(Cached { mark: disk, durable: disk, referenced: AtomicBool::new(true) });
                }
            }
            if inner.cache.len() > inner.capacity {
                inner.sweep.notify_one();
            }
            return Ok(());
        }
    }

    /// Queues a raise for the committer and waits until it is on disk.
    async fn persist(&self, key: &str, token: u64) -> Result<(), StoreError> {
        let batch = {
            let mut pending = self.queue.lock();
            if pending.closed {
                return Err(committer_stopped());
            }
            pending.raises.push((key.into(), token));
            if pending.idle {
                pending.idle = false;
                self.queue.wake.notify_one();
            }
            pending.batch.clone()
        };
        batch.outcome().await
    }
}

impl Drop for FileStore {
    /// The commit thread writes what is queued, then exits and closes the file.
    fn drop(&mut self) {
        self.queue.lock().closed = true;
        self.queue.wake.notify_one();
    }
}

impl FenceStore for FileStore {
    async fn get(&self, key: &str) -> Result<Option<u64>, StoreError> {
        loop {
            if let Some(e) = self.inner.cache.get(key) {
                e.referenced.store(true, Ordering::Relaxed);
                return Ok(e.mark);
            }
            self.load(key).await?;
        }
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
                self.persist(key, token).await?;
                if let Some(mut e) = self.inner.cache.get_mut(key) {
                    if e.durable < Some(token) {
                        e.durable = Some(token);
                    }
                }
                Ok(Advance::Accepted { previous })
            }
        }
    }

    async fn list(&self, prefix: &str, after: Option<&str>, limit: usize) -> Result<Vec<(String, u64)>, StoreError> {
        let (db, prefix_owned, after_owned) = (self.inner.db.clone(), prefix.to_string(), after.map(str::to_string));
        let mut found =
            tokio::task::spawn_blocking(move || list_marks(&db, &prefix_owned, after_owned.as_deref(), limit))
                .await
                .map_err(|e| StoreError(format!("list task failed: {e}")))??;
        // A raise on its way to disk is already enforced: show it.
        for (key, token) in &mut found {
            if let Some(Some(mark)) = self.inner.cache.get(key.as_str()).map(|e| e.mark) {
                *token = (*token).max(mark);
            }
        }
        Ok(found)
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
}

async fn read_mark(db: Arc<Database>, key: Box<str>) -> Result<Option<u64>, StoreError> {
    tokio::task::spawn_blocking(move || -> Result<Option<u64>, redb::Error> {
        let txn = db.begin_read()?;
        let table = txn.open_table(FENCES)?;
        Ok(table.get(&*key)?.map(|v| v.value()))
    })
    .await
    .map_err(|e| StoreError(format!("read task failed: {e}")))?
    .map_err(|e| StoreError(format!("reading the fence store: {e}")))
}

fn list_marks(
    db: &Database,
    prefix: &str,
    after: Option<&str>,
    limit: usize,
) -> Result<Vec<(String, u64)>, StoreError> {
    let read = || -> Result<Vec<(String, u64)>, redb::Error> {
        let txn = db.begin_read()?;
        let table = txn.open_table(FENCES)?;
        let start = match after {
            Some(a) if a > prefix => a,
            _ => prefix,
        };
        let mut out = Vec::new();
        for item in table.range::<&str>(start..)? {
            let (k, v) = item?;
            let key = k.value();
            if !key.starts_with(prefix) || out.len() == limit {
                break;
            }
            if Some(key) != after {
                out.push((key.to_string(), v.value()));
            }
        }
        Ok(out)
    };
    read().map_err(|e| StoreError(format!("listing the fence store: {e}")))
}

/// The commit thread: takes everything queued, writes it in one transaction
/// (one fsync), posts the outcome to everyone in the batch, repeats.
fn run_committer(db: &Database, queue: &Queue, stats: &CommitStats, tracked: &AtomicU64) {
    // However this thread ends, nobody is left waiting for it.
    let _closed = CloseOnExit(queue);
    let mut raises = Vec::new();
    loop {
        let batch = {
            let mut pending = queue.lock();
            while pending.raises.is_empty() {
                if pending.closed {
                    return;
                }
                pending.idle = true;
                pending = queue.wake.wait(pending).unwrap_or_else(PoisonError::into_inner);
            }
            std::mem::swap(&mut pending.raises, &mut raises);
            PostOnExit(std::mem::take(&mut pending.batch))
        };
        let started = Instant::now();
        let result = commit(db, &raises);
        match &result {
            Ok(new_keys) => {
                stats.commits.inc();
                stats.raises.inc_by(raises.len() as u64);
                stats.commit_seconds.observe(started.elapsed().as_secs_f64());
                stats.failing.store(false, Ordering::Relaxed);
                tracked.fetch_add(*new_keys, Ordering::Relaxed);
            }
            Err(e) => {
                stats.failures.inc();
                stats.failing.store(true, Ordering::Relaxed);
                tracing::error!(error = %e.0, raises = raises.len(), "fence store commit failed");
            }
        }
        batch.0.post(result.map(|_| ()));
        raises.clear();
    }
}

/// Posts "stopped" to a batch nobody answered (the commit panicked).
struct PostOnExit(Arc<Batch>);

impl Drop for PostOnExit {
    fn drop(&mut self) {
        self.0.post(Err(committer_stopped()));
    }
}

/// Refuses new raises and answers the queued ones when the commit thread ends.
struct CloseOnExit<'a>(&'a Queue);

impl Drop for CloseOnExit<'_> {
    fn drop(&mut self) {
        let mut pending = self.0.lock();
        pending.closed = true;
        pending.raises.clear();
        pending.batch.post(Err(committer_stopped()));
    }
}

/// Writes each raise as `max(on disk, token)`: a mark on disk never goes back,
/// whatever order raises arrive in. Returns how many keys are new.
fn commit(db: &Database, raises: &[(Box<str>, u64)]) -> Result<u64, StoreError> {
    let write = || -> Result<u64, redb::Error> {
        let txn = db.begin_write()?;
        let mut new_keys = 0;
        {
            let mut table = txn.open_table(FENCES)?;
            for (key, token) in raises {
                // One lookup: insert, and put the old mark back in the rare case
                // it was higher (raises for one key can queue out of order).
                let old = table.insert(&**key, *token)?.map(|v| v.value());
                match old {
                    None => new_keys += 1,
                    Some(mark) if mark > *token => {
                        table.insert(&**key, mark)?;
                    }
                    Some(_) => {}
                }
            }
        }
        txn.commit()?;
        Ok(new_keys)
    };
    write().map_err(|e| StoreError(format!("committing to the fence store: {e}")))
}

/// Keeps the cache near `capacity`: wakes when a miss pushes it over, or once a
/// second, and sweeps. It holds the store only while sweeping, so it ends soon
/// after the store is dropped.
async fn run_sweeper(inner: Weak<Inner>, wake: Arc<Notify>) {
    loop {
        {
            let Some(store) = inner.upgrade() else { return };
            if store.cache.len() > store.capacity {
                // A sweep walks the whole cache: keep it off the async workers.
                let _ = tokio::task::spawn_blocking(move || sweep(&store)).await;
            }
        }
        tokio::select! {
            _ = wake.notified() => {}
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

/// Second-chance eviction: marks that are on disk and were not used since the
/// previous pass leave the cache until it is under the target. A mark still on
/// its way to disk never leaves.
fn sweep(store: &Inner) {
    let target = store.capacity / 100 * SWEEP_TARGET_PERCENT;
    let excess = store.cache.len().saturating_sub(target);
    let mut evicted = 0;
    for _pass in 0..2 {
        store.cache.retain(|_, cached| {
            if evicted >= excess || !cached.evictable() {
                return true;
            }
            evicted += 1;
            // Under the shard lock, before the entry is gone (see `load`).
            store.evictions.fetch_add(1, Ordering::SeqCst);
            false
        });
        if evicted >= excess {
            break;
        }
    }
    tracing::debug!(evicted, cached = store.cache.len(), "fence cache swept");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("fencegate-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[tokio::test]
    async fn marks_survive_reopening_and_equal_tokens_touch_no_disk() {
        let dir = temp_dir("reopen");
        {
            let store = FileStore::open(&dir, false, 100).unwrap();
            assert_eq!(store.advance("k", 5).await.unwrap(), Advance::Accepted { previous: None });
            assert_eq!(store.advance("k", 7).await.unwrap(), Advance::Accepted { previous: Some(5) });
            let commits = store.stats().unwrap().commits();
            assert_eq!(commits, 2);
            for _ in 0..10 {
                assert_eq!(store.advance("k", 7).await.unwrap(), Advance::Accepted { previous: Some(7) });
            }
            assert_eq!(store.stats().unwrap().commits(), commits, "an equal token committed");
            assert_eq!(store.advance("k", 6).await.unwrap(), Advance::Stale { current: 7 });
        }
        // The commit thread exits when the store is dropped; wait for its lock.
        let store = reopen(&dir).await;
        assert_eq!(store.get("k").await.unwrap(), Some(7));
        assert_eq!(store.advance("k", 6).await.unwrap(), Advance::Stale { current: 7 });
        assert_eq!(store.tracked_keys(), 1);
        drop(store);
        std::fs::remove_dir_all(dir).unwrap();
    }

    async fn reopen(dir: &Path) -> FileStore {
        for _ in 0..200 {
            match FileStore::open(dir, true, 100) {
                Ok(s) => return s,
                Err(OpenError::InUse(_)) => tokio::time::sleep(Duration::from_millis(10)).await,
                Err(e) => panic!("{e}"),
            }
        }
        panic!("store still in use");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_raises_share_commits() {
        let dir = temp_dir("group");
        let store = Arc::new(FileStore::open(&dir, false, 10_000).unwrap());
        let tasks: Vec<_> = (0..256)
            .map(|i| {
                let store = store.clone();
                tokio::spawn(async move { store.advance(&format!("key-{i}"), 1).await.unwrap() })
            })
            .collect();
        for t in tasks {
            assert_eq!(t.await.unwrap(), Advance::Accepted { previous: None });
        }
        let stats = store.stats().unwrap();
        assert_eq!(stats.raises(), 256);
        assert!(stats.commits() < stats.raises(), "{} commits for {} raises", stats.commits(), stats.raises());
        assert_eq!(store.tracked_keys(), 256);
        drop(store);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[tokio::test]
    async fn evicted_marks_come_back_from_disk() {
        let dir = temp_dir("evict");
        let store = FileStore::open(&dir, false, 100).unwrap();
        for i in 0..1000u64 {
            store.advance(&format!("k{i}"), i).await.unwrap();
        }
        sweep(&store.inner);
        sweep(&store.inner);
        assert!(store.cached_keys() <= 100, "{} cached", store.cached_keys());
        for i in (0..1000u64).step_by(37) {
            assert_eq!(store.get(&format!("k{i}")).await.unwrap(), Some(i));
            if i > 0 {
                assert_eq!(store.advance(&format!("k{i}"), i - 1).await.unwrap(), Advance::Stale { current: i });
            }
        }
        let page = store.list("k1", None, 5).await.unwrap();
        assert_eq!(
            page,
            [("k1".into(), 1), ("k10".into(), 10), ("k100".into(), 100), ("k101".into(), 101), ("k102".into(), 102)]
        );
        let next = store.list("k1", Some("k102"), 2).await.unwrap();
        assert_eq!(next, [("k103".into(), 103), ("k104".into(), 104)]);
        drop(store);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[tokio::test]
    async fn a_lower_raise_committed_after_a_higher_one_never_lowers_the_disk() {
        let dir = temp_dir("order");
        let store = FileStore::open(&dir, false, 100).unwrap();
        let db = store.inner.db.clone();
        // One batch with the raises for a key out of order, then a later lower batch.
        commit(&db, &[("k".into(), 7), ("k".into(), 5)]).unwrap();
        assert_eq!(read_mark(db.clone(), "k".into()).await.unwrap(), Some(7));
        commit(&db, &[("k".into(), 6)]).unwrap();
        assert_eq!(read_mark(db.clone(), "k".into()).await.unwrap(), Some(7));
        drop(store);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_mark_on_its_way_to_disk_is_never_evicted() {
        let dir = temp_dir("inflight");
        // Capacity 1: a sweep evicts everything it may.
        let store = Arc::new(FileStore::open(&dir, false, 1).unwrap());
        store.advance("k", 3).await.unwrap();
        // Hold redb's single write transaction: the commit thread cannot finish the next raise.
        let blocker = store.inner.db.begin_write().unwrap();
        let raising = tokio::spawn({
            let store = store.clone();
            async move { store.advance("k", 9).await }
        });
        while store.inner.cache.get("k").and_then(|e| e.mark) != Some(9) {
            tokio::task::yield_now().await;
        }
        sweep(&store.inner);
        sweep(&store.inner);
        assert_eq!(store.get("k").await.unwrap(), Some(9), "an undurable mark left the cache and came back lower");
        drop(blocker);
        assert_eq!(raising.await.unwrap().unwrap(), Advance::Accepted { previous: Some(3) });
        assert_eq!(store.advance("k", 5).await.unwrap(), Advance::Stale { current: 9 });
        drop(store);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[tokio::test]
    async fn a_corrupt_file_refuses_to_open_and_a_missing_one_can_be_required() {
        let dir = temp_dir("corrupt");
        assert!(matches!(FileStore::open(&dir, true, 10), Err(OpenError::Missing(_))));
        std::fs::create_dir_all(&dir).unwrap();
        // An empty file is no store either.
        std::fs::write(dir.join(DB_FILE), b"").unwrap();
        assert!(matches!(FileStore::open(&dir, true, 10), Err(OpenError::Missing(_))));
        std::fs::write(dir.join(DB_FILE), vec![0xA5u8; 64 * 1024]).unwrap();
        let err = FileStore::open(&dir, false, 10).unwrap_err();
        assert!(matches!(err, OpenError::Corrupt { .. }), "{err}");
        assert!(err.to_string().contains("refusing to start"), "{err}");
        // Nothing was written over the corrupt file.
        assert_eq!(std::fs::read(dir.join(DB_FILE)).unwrap(), vec![0xA5u8; 64 * 1024]);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
