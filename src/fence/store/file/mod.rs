//! The durable store: marks in a redb file on local disk, a journal in front of
//! it, a bounded cache in front of both, and group commit.
//!
//! - A raise is on disk (appended to the [journal](journal) and fsync'd)
//!   before `advance` returns `Accepted`, so a request is never forwarded on a
//!   mark that a crash could forget.
//! - A token equal to a durable mark touches no disk: the common case of one
//!   owner writing many times costs a map lookup.
//! - Raises from many requests are queued to one commit thread, which appends
//!   everything queued as one journal frame with one fsync: writers share the cost.
//! - A fold thread writes the journal into the B-tree in the background, one
//!   transaction for everything since the previous fold, then empties it. Until a
//!   raise is folded, its mark is also kept in memory ([`Unfolded`]), where cache
//!   misses and listings look before they read the B-tree.
//! - The cache holds at most about `cache_keys` marks. Marks that are on disk and
//!   were not used since the last sweep leave memory (never the disk); a miss
//!   reads the mark back before deciding.

// redb's error type is large; these results travel between the commit thread,
// blocking reads and start-up, never through the request hot path.
#![allow(clippy::result_large_err)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, TryRecvError};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError, Weak};
use std::time::{Duration, Instant};

use crate::fence::KeyMap;
use dashmap::mapref::entry::Entry;
use redb::{Database, DatabaseError, ReadableTable, ReadableTableMetadata, StorageError, TableDefinition};
use tokio::sync::Notify;

use super::{Advance, CommitStats, FenceStore, StoreError};
use journal::{Journal, JournalFile, Marks};
use relay::Relay;

pub mod journal;
mod relay;

const FENCES: TableDefinition<&str, u64> = TableDefinition::new("fences");
/// The store's own facts: [`CLEAN`].
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
/// 1 when the last process stopped cleanly with its journal folded, 0 while a
/// process has the store open. Missing in stores that never had a journal.
const CLEAN: &str = "clean";
/// The database file inside `[fences] path`.
pub const DB_FILE: &str = "fences.redb";
/// redb's own page cache. The mark cache in front of it does the heavy lifting.
const DISK_CACHE_BYTES: usize = 16 << 20;
/// Most cache misses reading the disk at once (each on a blocking thread).
const MAX_READERS: usize = 16;
/// Sweeps leave the cache this far below `cache_keys`, so they don't run on every miss.
const SWEEP_TARGET_PERCENT: usize = 90;

/// Room for a batch past `fold_bytes` in a journal file's first allocation.
const JOURNAL_SLACK_BYTES: u64 = 256 << 10;

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
    /// A journal with anything in it is folded after this long without raises,
    /// so a restart after a quiet spell has little to replay.
    idle_fold: Duration,
    /// When the previous commit held more than one raise, the next one waits
    /// this long before it takes what is queued. A commit costs the commit thread
    /// about 40 µs of CPU however few raises it holds (the write, the fsync's
    /// block I/O, the wake-ups), so under concurrent raises it pays to take more
    /// at once; a lone writer never waits.
    commit_delay: Duration,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            fold_bytes: 1 << 20,
            max_journal_bytes: 16 << 20,
            fold_wait: Duration::from_secs(5),
            idle_fold: Duration::from_secs(1),
            commit_delay: Duration::from_micros(150),
        }
    }
}

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
    #[error("cannot use the fence journal {path}: {source}")]
    Journal { path: PathBuf, source: std::io::Error },
    #[error(
        "fence journal {path} is missing, and {db} was not stopped cleanly, so marks raised since its last fold \
         are only in the journal: refusing to start without them. Restore the store directory as a whole; to \
         start from {db} alone, accepting that recent fences may be lost, create the missing file empty"
    )]
    JournalMissing { path: PathBuf, db: PathBuf },
}

/// Durable marks with a bounded cache; see the [module docs](self).
#[derive(Debug)]
pub struct FileStore {
    inner: Arc<Inner>,
    queue: Arc<Queue>,
    /// The store held fences when opened: a previous process wrote to it.
    reopened: bool,
    /// Disconnected once the commit and fold threads have both ended.
    threads_ended: Mutex<mpsc::Receiver<()>>,
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
    unfolded: Arc<Mutex<Unfolded>>,
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

/// Marks that are in the journal and not yet in the B-tree.
///
/// A reader looks here before it reads the B-tree, and the fold thread removes
/// marks from here only after its transaction is durable: whichever way a read
/// and a fold interleave, the read sees every journaled mark.
#[derive(Debug, Default)]
struct Unfolded {
    /// Appended since the journal last rotated.
    current: Marks,
    /// Handed to the fold thread and not folded yet.
    folding: Arc<Marks>,
}

impl Unfolded {
    fn mark(&self, key: &str) -> Option<u64> {
        self.current.get(key).max(self.folding.get(key)).copied()
    }

    /// Up to `limit` marks whose keys start with `prefix` and sort after `after`,
    /// in key order, each key once with its highest mark. Reads at most `limit`
    /// marks of each map (a range of each), so the commit thread, which takes
    /// this lock after every append, never waits for a listing to walk them all.
    fn list(&self, prefix: &str, after: Option<&str>, limit: usize) -> Vec<(String, u64)> {
        use std::ops::Bound;
        let from = match after {
            Some(after) if after >= prefix => Bound::Excluded(after),
            _ => Bound::Included(prefix),
        };
        let mut first = Marks::new();
        for marks in [&self.current, &*self.folding] {
            let range = marks.range::<str, _>((from, Bound::Unbounded));
            for (key, token) in range.take_while(|(key, _)| key.starts_with(prefix)).take(limit) {
                journal::raise(&mut first, key, *token);
            }
        }
        first.into_iter().take(limit).map(|(key, token)| (key.into(), token)).collect()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing under these locks can leave their data half-changed.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
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
    frame: journal::Frame,
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
    /// Waiters on runtimes without a [`Relay`] wait here.
    posted: Notify,
    /// The relays of the worker threads with waiters.
    relays: Mutex<Vec<Arc<Relay>>>,
}

impl Batch {
    async fn outcome(&self) -> Result<(), StoreError> {
        let Some(relay) = Relay::current() else {
            return self.outcome_without_relay().await;
        };
        {
            let mut relays = lock(&self.relays);
            if !relays.iter().any(|r| Arc::ptr_eq(r, &relay)) {
                relays.push(relay.clone());
            }
        }
        // Registered with the relay before looking (see `post`); the relay wakes
        // every waiter of this thread, for whichever commit, so look again.
        loop {
            let woken = relay.local().notified();
            if let Some(outcome) = self.outcome.get() {
                return outcome.clone();
            }
            woken.await;
        }
    }

    async fn outcome_without_relay(&self) -> Result<(), StoreError> {
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
        // A waiter that registers its relay after this lock looks at the
        // outcome after it, and finds it set.
        let relays = std::mem::take(&mut *lock(&self.relays));
        for relay in relays {
            relay.signal();
        }
    }
}

impl Queue {
    fn lock(&self) -> MutexGuard<'_, Pending> {
        lock(&self.pending)
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
        FileStore::open_tuned(dir, require_existing, cache_keys, Tuning::default())
    }

    fn open_tuned(
        dir: &Path,
        require_existing: bool,
        cache_keys: usize,
        tuning: Tuning,
    ) -> Result<FileStore, OpenError> {
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
        // Create the tables once, so readers never meet a missing table, and
        // read how the last process stopped.
        let was_clean = (|| -> Result<bool, redb::Error> {
            let txn = db.begin_write()?;
            txn.open_table(FENCES)?;
            let was_clean = txn.open_table(META)?.get(CLEAN)?.is_none_or(|v| v.value() == 1);
            txn.commit()?;
            Ok(was_clean)
        })()
        .map_err(|e| corrupt(e.to_string()))?;
        if !was_clean {
            for name in journal::FILES {
                let path = dir.join(name);
                if !path.exists() {
                    return Err(OpenError::JournalMissing { path, db: file });
                }
            }
        }
        // Holding the database's lock, bring the B-tree up to date with the journal.
        let replayed = recover_journal(&db, dir)?;
        let recovered = (|| -> Result<u64, redb::Error> { Ok(db.begin_read()?.open_table(FENCES)?.len()?) })()
            .map_err(|e| corrupt(e.to_string()))?;
        // Both files are folded now: empty them. Appends up to a fold's worth
        // (and a batch) land in blocks that are already written.
        let journal = Journal::open(dir, tuning.fold_bytes + JOURNAL_SLACK_BYTES)
            .map_err(|(path, source)| OpenError::Journal { path, source })?;
        // Only now, with both journal files in place and before the first
        // append: until a clean stop, the journal holds marks the B-tree may lack.
        if was_clean {
            set_clean(&db, false).map_err(|e| corrupt(e.to_string()))?;
        }
        tracing::info!(path = %file.display(), fences = recovered, replayed, "fence store opened");

        let db = Arc::new(db);
        let stats = Arc::new(CommitStats::default());
        let queue = Arc::new(Queue::default());
        let unfolded = Arc::new(Mutex::new(Unfolded::default()));
        let (jobs, job_rx) = mpsc::channel();
        let (done_tx, done) = mpsc::channel();
        let folder = Folder { db: db.clone(), queue: queue.clone(), stats: stats.clone(), unfolded: unfolded.clone() };
        let committer = Committer {
            queue: queue.clone(),
            stats: stats.clone(),
            unfolded: unfolded.clone(),
            journal,
            tuning,
            folding: false,
            concurrent: false,
            fold_stuck: false,
            jobs,
            done,
        };
        let (ended_tx, threads_ended) = mpsc::channel::<()>();
        let spawn = |name: &str, run: Box<dyn FnOnce() + Send>| {
            let ended = ended_tx.clone();
            std::thread::Builder::new()
                .name(name.into())
                .spawn(move || {
                    run();
                    drop(ended);
                })
                .map(drop)
                .map_err(|e| corrupt(format!("cannot start the {name} thread: {e}")))
        };
        spawn("fencegate-fold", Box::new(move || folder.run(job_rx, done_tx)))?;
        spawn("fencegate-commit", Box::new(move || committer.run()))?;
        drop(ended_tx);
        let inner = Arc::new(Inner {
            db,
            path: file,
            cache: KeyMap::default(),
            capacity: cache_keys.max(1),
            evictions: AtomicU64::new(0),
            tracked: Arc::new(AtomicU64::new(recovered)),
            stats,
            unfolded,
            sweep: Arc::new(Notify::new()),
            readers: tokio::sync::Semaphore::new(MAX_READERS),
        });
        tokio::spawn(run_sweeper(Arc::downgrade(&inner), inner.sweep.clone()));
        Ok(FileStore { inner, queue, reopened: recovered > 0, threads_ended: Mutex::new(threads_ended) })
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
                read_mark(inner.db.clone(), inner.unfolded.clone(), key.into()).await?
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
            pending.frame.push(key, token).map_err(|e| StoreError(format!("cannot journal the raise: {e}")))?;
            if pending.idle {
                pending.idle = false;
                self.queue.wake.notify_one();
            }
            pending.batch.clone()
        };
        batch.outcome().await
    }
}

/// How long dropping the store waits for its threads to finish.
const STOP_WAIT: Duration = Duration::from_secs(10);

impl Drop for FileStore {
    /// The commit thread writes what is queued and hands the journal to the fold
    /// thread, which folds it; this waits for both (up to [`STOP_WAIT`]), so a
    /// clean stop leaves the B-tree up to date and the journal empty. Nothing is
    /// lost if they take longer: the next start replays the journal.
    fn drop(&mut self) {
        self.queue.lock().closed = true;
        self.queue.wake.notify_one();
        let ended = self.threads_ended.get_mut().unwrap_or_else(PoisonError::into_inner);
        if let Err(RecvTimeoutError::Timeout) = ended.recv_timeout(STOP_WAIT) {
            tracing::warn!(
                wait = ?STOP_WAIT,
                "the fence store's threads are still writing; the next start replays the journal"
            );
        }
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
                // Still cached, unless a higher raise of the key made it durable
                // in the meantime (then there is nothing left to record).
                if let Some(mut e) = self.inner.cache.get_mut(key) {
                    if e.durable.is_none() {
                        self.inner.tracked.fetch_add(1, Ordering::Relaxed);
                    }
                    if e.durable < Some(token) {
                        e.durable = Some(token);
                    }
                }
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
            list_marks(&db, &prefix_owned, after_owned.as_deref(), limit).map(|folded| (journaled, folded))
        })
        .await
        .map_err(|e| StoreError(format!("list task failed: {e}")))??;
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

async fn read_mark(
    db: Arc<Database>,
    unfolded: Arc<Mutex<Unfolded>>,
    key: Box<str>,
) -> Result<Option<u64>, StoreError> {
    tokio::task::spawn_blocking(move || -> Result<Option<u64>, redb::Error> {
        // The journal's marks first: one whose fold ends after this look is in
        // the B-tree before the read below begins.
        let journaled = lock(&unfolded).mark(&key);
        let txn = db.begin_read()?;
        let table = txn.open_table(FENCES)?;
        Ok(table.get(&*key)?.map(|v| v.value()).max(journaled))
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

/// The commit thread: takes everything queued, appends it to the journal as one
/// frame (one fsync), posts the outcome to everyone in the batch, repeats; and
/// hands full journal files to the fold thread.
struct Committer {
    queue: Arc<Queue>,
    stats: Arc<CommitStats>,
    unfolded: Arc<Mutex<Unfolded>>,
    journal: Journal,
    tuning: Tuning,
    /// A journal file is with the fold thread, which says on `done` when it is empty again.
    folding: bool,
    /// The last batch held more than one raise.
    concurrent: bool,
    /// A wait for the fold in progress ran out; it has not ended since.
    fold_stuck: bool,
    jobs: mpsc::Sender<FoldJob>,
    done: mpsc::Receiver<()>,
}

impl Committer {
    fn run(mut self) {
        let queue = self.queue.clone();
        // However this thread ends, nobody is left waiting for it.
        let _closed = CloseOnExit(&queue);
        let mut frame = journal::Frame::default();
        while let Some(batch) = self.next_batch(&mut frame) {
            let started = Instant::now();
            let count = frame.records();
            let result = self.commit(&mut frame);
            match &result {
                Ok(()) => {
                    self.stats.commits.inc();
                    self.stats.raises.inc_by(count);
                    self.stats.commit_seconds.observe(started.elapsed().as_secs_f64());
                    self.stats.failing.store(false, Ordering::Relaxed);
                }
                Err(e) => {
                    self.stats.failures.inc();
                    self.stats.failing.store(true, Ordering::Relaxed);
                    tracing::error!(error = %e.0, raises = count, "fence store commit failed");
                }
            }
            batch.post(result);
            frame.clear();
            let fold_bytes = self.tuning.fold_bytes;
            self.fold_if(|len| len >= fold_bytes);
        }
        // Closing: fold what is left, so the next start has little to replay.
        if self.folding && self.done.recv_timeout(self.tuning.fold_wait).is_ok() {
            self.folding = false;
        }
        self.fold_if(|len| len > 0);
    }

    /// Waits for raises and swaps their frame with `frame` (empty, its buffer
    /// reused); `None` once the store is closed and nothing is queued.
    fn next_batch(&mut self, frame: &mut journal::Frame) -> Option<PostOnExit> {
        let queue = self.queue.clone();
        let mut pending = queue.lock();
        loop {
            if !pending.frame.is_empty() {
                if self.concurrent && !self.tuning.commit_delay.is_zero() {
                    // Writers are raising concurrently: give more of them the
                    // time to join this commit, so that each pays a smaller share.
                    drop(pending);
                    std::thread::sleep(self.tuning.commit_delay);
                    pending = queue.lock();
                }
                std::mem::swap(&mut pending.frame, frame);
                self.concurrent = frame.records() > 1;
                return Some(PostOnExit(Some(std::mem::take(&mut pending.batch))));
            }
            if pending.closed {
                return None;
            }
            pending.idle = true;
            let (next, waited) =
                queue.wake.wait_timeout(pending, self.tuning.idle_fold).unwrap_or_else(PoisonError::into_inner);
            pending = next;
            if waited.timed_out() && pending.frame.is_empty() {
                drop(pending);
                self.fold_if(|len| len > 0);
                pending = queue.lock();
            }
        }
    }

    /// Appends `frame` to the journal, durably, and keeps its marks in memory
    /// until they are folded.
    fn commit(&mut self, frame: &mut journal::Frame) -> Result<(), StoreError> {
        self.poll_fold();
        if self.folding && self.journal.frame_bytes() >= self.tuning.max_journal_bytes {
            // The fold thread has fallen behind: wait for it rather than let the
            // journal grow without bound, then start on the file it emptied.
            // Once a wait has run out, later batches fail at once until the fold
            // ends, so no raise waits more than `fold_wait`.
            let wait = if self.fold_stuck { Duration::ZERO } else { self.tuning.fold_wait };
            match self.done.recv_timeout(wait) {
                Ok(()) => {
                    self.folding = false;
                    self.fold_stuck = false;
                }
                Err(RecvTimeoutError::Timeout) => {
                    self.fold_stuck = true;
                    return Err(StoreError(
                        "the journal is full and folding it into the fence store is not finishing".into(),
                    ));
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(StoreError("the journal is full and the fold thread has stopped".into()))
                }
            }
            self.fold_if(|_| true);
        }
        self.journal.append(frame).map_err(|e| StoreError(format!("appending to the fence journal: {e}")))?;
        let mut unfolded = lock(&self.unfolded);
        for record in frame.marks() {
            let (key, token) = record.map_err(|e| StoreError(format!("reading back a journal frame: {e}")))?;
            journal::raise(&mut unfolded.current, key, token);
        }
        Ok(())
    }

    fn poll_fold(&mut self) {
        if self.folding {
            match self.done.try_recv() {
                Ok(()) => {
                    self.folding = false;
                    self.fold_stuck = false;
                }
                // A fold thread that is gone never empties its file again: stay
                // "folding", and appends fail once the journal is full.
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => {}
            }
        }
    }

    /// Hands the journal file to the fold thread when no fold is in progress and
    /// its length passes `due`; later appends go to the other file.
    fn fold_if(&mut self, due: impl Fn(u64) -> bool) {
        self.poll_fold();
        if self.folding || !due(self.journal.frame_bytes()) {
            return;
        }
        let file = self.journal.rotate();
        // Everything in the full file, and nothing else, is in `current`: both
        // change only on this thread.
        let marks = {
            let mut unfolded = lock(&self.unfolded);
            let marks = Arc::new(std::mem::take(&mut unfolded.current));
            unfolded.folding = marks.clone();
            marks
        };
        self.folding = true;
        let _ = self.jobs.send(FoldJob { marks, file });
    }
}

/// A full journal file and the marks in it.
struct FoldJob {
    marks: Arc<Marks>,
    file: Arc<JournalFile>,
}

/// The fold thread: writes a full journal file's marks into the B-tree in one
/// transaction (fsync'd), then forgets them and empties the file.
struct Folder {
    db: Arc<Database>,
    queue: Arc<Queue>,
    stats: Arc<CommitStats>,
    unfolded: Arc<Mutex<Unfolded>>,
}

impl Folder {
    fn run(self, jobs: mpsc::Receiver<FoldJob>, done: mpsc::Sender<()>) {
        self.fold_all(jobs, done);
        // The commit thread has ended. If everything it journaled is folded, the
        // B-tree alone holds every mark: say so, for the next start.
        let unfolded = lock(&self.unfolded);
        if unfolded.current.is_empty() && unfolded.folding.is_empty() {
            drop(unfolded);
            if let Err(e) = set_clean(&self.db, true) {
                tracing::warn!(error = %e, "cannot record the clean stop; the next start replays the journal");
            }
        }
    }

    fn fold_all(&self, jobs: mpsc::Receiver<FoldJob>, done: mpsc::Sender<()>) {
        for job in jobs {
            while let Err(e) = fold(&self.db, &job.marks) {
                // Nothing is lost: the journal file and the marks in memory stay
                // until a fold succeeds.
                self.stats.fold_failures.inc();
                tracing::error!(error = %e.0, marks = job.marks.len(), "folding the fence journal failed; retrying");
                if self.queue.lock().closed {
                    return;
                }
                std::thread::sleep(Duration::from_secs(1));
            }
            self.stats.folds.inc();
            lock(&self.unfolded).folding = Arc::default();
            if let Err(e) = job.file.empty() {
                // Harmless: its marks are folded, and replaying them again changes
                // nothing. Appends to it wait for the next successful emptying.
                tracing::warn!(error = %e, "cannot empty a folded journal file");
                while job.file.empty().is_err() {
                    if self.queue.lock().closed {
                        return;
                    }
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
            if done.send(()).is_err() {
                return;
            }
        }
    }
}

/// Records whether the B-tree alone holds every mark (a clean stop) or the
/// journal may hold more (a process has the store open).
fn set_clean(db: &Database, clean: bool) -> Result<(), redb::Error> {
    let txn = db.begin_write()?;
    txn.open_table(META)?.insert(CLEAN, u64::from(clean))?;
    txn.commit()?;
    Ok(())
}

/// Replays both journal files into the B-tree, at start-up. Returns how many
/// records were replayed.
fn recover_journal(db: &Database, dir: &Path) -> Result<u64, OpenError> {
    let mut marks = Marks::default();
    let mut records = 0;
    for name in journal::FILES {
        let path = dir.join(name);
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(source) => return Err(OpenError::Journal { path, source }),
        };
        let replayed =
            journal::replay(&bytes, &mut marks).map_err(|detail| OpenError::Corrupt { path: path.clone(), detail })?;
        tracing::debug!(path = %path.display(), records = replayed.records, end = replayed.end, "journal replayed");
        records += replayed.records;
    }
    // As at opening: a panic inside the store library is a damaged file, not a crash.
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| fold(db, &marks)))
        .unwrap_or_else(|_| Err(StoreError("the store library panicked while replaying the journal".into())))
        .map_err(|e| OpenError::Corrupt { path: dir.join(DB_FILE), detail: e.0 })?;
    Ok(records)
}

/// Writes each mark as `max(in the B-tree, mark)` in one transaction: a mark in
/// the B-tree never goes back, whatever order folds happen in.
fn fold(db: &Database, marks: &Marks) -> Result<(), StoreError> {
    let write = || -> Result<(), redb::Error> {
        let txn = db.begin_write()?;
        {
            let mut table = txn.open_table(FENCES)?;
            // In key order: each leaf page is visited once, in turn.
            for (key, token) in marks {
                // One lookup: insert, and put the old mark back in the rare case it was higher.
                let old = table.insert(&**key, *token)?.map(|v| v.value());
                if let Some(old) = old.filter(|old| old > token) {
                    table.insert(&**key, old)?;
                }
            }
        }
        txn.commit()?;
        Ok(())
    };
    write().map_err(|e| StoreError(format!("folding the journal into the fence store: {e}")))
}

/// A batch to answer: posts "stopped" if it is dropped unanswered (the commit panicked).
struct PostOnExit(Option<Arc<Batch>>);

impl PostOnExit {
    fn post(mut self, outcome: Result<(), StoreError>) {
        if let Some(batch) = self.0.take() {
            batch.post(outcome);
        }
    }
}

impl Drop for PostOnExit {
    fn drop(&mut self) {
        if let Some(batch) = self.0.take() {
            batch.post(Err(committer_stopped()));
        }
    }
}

/// Refuses new raises and answers the queued ones when the commit thread ends.
struct CloseOnExit<'a>(&'a Queue);

impl Drop for CloseOnExit<'_> {
    fn drop(&mut self) {
        let mut pending = self.0.lock();
        pending.closed = true;
        pending.frame.clear();
        pending.batch.post(Err(committer_stopped()));
    }
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
    use crate::fence::store::MAX_LIST_LIMIT;

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

    #[test]
    fn waiters_on_several_single_threaded_runtimes_are_all_answered() {
        let dir = temp_dir("relay");
        // The store's sweeper needs a runtime; the waiters run on runtimes of their own.
        let home = tokio::runtime::Runtime::new().unwrap();
        let store = Arc::new(home.block_on(async { FileStore::open(&dir, false, 10_000) }).unwrap());
        let workers: Vec<_> = (0..3)
            .map(|worker| {
                let store = store.clone();
                std::thread::spawn(move || {
                    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
                    rt.block_on(async move {
                        for round in 1..=20u64 {
                            let raises: Vec<_> = (0..16)
                                .map(|i| {
                                    let store = store.clone();
                                    tokio::spawn(async move { store.advance(&format!("w{worker}-k{i}"), round).await })
                                })
                                .collect();
                            for raise in raises {
                                let answered = tokio::time::timeout(Duration::from_secs(30), raise).await;
                                let advance = answered.expect("a waiter was never woken").unwrap().unwrap();
                                assert!(matches!(advance, Advance::Accepted { .. }), "{advance:?}");
                            }
                        }
                    })
                })
            })
            .collect();
        for worker in workers {
            worker.join().unwrap();
        }
        let stats = store.stats().unwrap();
        assert_eq!(stats.raises(), 3 * 16 * 20);
        assert!(stats.commits() < stats.raises(), "{} commits", stats.commits());
        drop(store);
        drop(home);
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

    fn marks(pairs: &[(&str, u64)]) -> Marks {
        pairs.iter().map(|(k, t)| ((*k).into(), *t)).collect()
    }

    fn in_tree(store: &FileStore) -> Vec<(String, u64)> {
        list_marks(&store.inner.db, "", None, MAX_LIST_LIMIT).unwrap()
    }

    #[test]
    fn unfolded_marks_list_each_key_once_with_its_highest_mark() {
        let unfolded = Unfolded {
            current: marks(&[("a", 2), ("b", 1), ("d", 4), ("x", 9)]),
            folding: Arc::new(marks(&[("a", 5), ("c", 3), ("b", 0)])),
        };
        let all = [("a", 5), ("b", 1), ("c", 3), ("d", 4)].map(|(k, t)| (k.to_string(), t));
        assert_eq!(unfolded.list("", None, 4), [&all[..], &[("x".to_string(), 9)]].concat()[..4]);
        assert_eq!(unfolded.list("", None, 2), all[..2]);
        assert_eq!(unfolded.list("", Some("a"), 2), all[1..3]);
        assert_eq!(unfolded.list("c", None, 10), all[2..3]);
        assert_eq!(unfolded.mark("a"), Some(5));
        assert_eq!(unfolded.mark("z"), None);
        // A cursor before the prefix starts at the prefix; one past it ends the list.
        assert_eq!(unfolded.list("c", Some("a"), 10), all[2..3]);
        assert_eq!(unfolded.list("b", Some("c"), 10), []);
        // Keys only in the folding map, after the first `limit` of the current one.
        let unfolded = Unfolded {
            current: marks(&[("p1", 1), ("p2", 1), ("p3", 1)]),
            folding: Arc::new(marks(&[("p0", 7), ("p2", 8), ("q", 1)])),
        };
        let page = |after, limit| unfolded.list("p", after, limit);
        assert_eq!(page(None, 2), [("p0".to_string(), 7), ("p1".to_string(), 1)]);
        assert_eq!(page(Some("p1"), 2), [("p2".to_string(), 8), ("p3".to_string(), 1)]);
        assert_eq!(page(Some("p3"), 2), []);
    }

    #[tokio::test]
    async fn a_lower_mark_folded_after_a_higher_one_never_lowers_the_tree() {
        let dir = temp_dir("order");
        let store = FileStore::open(&dir, false, 100).unwrap();
        let db = store.inner.db.clone();
        fold(&db, &marks(&[("k", 7)])).unwrap();
        fold(&db, &marks(&[("k", 6), ("j", 1)])).unwrap();
        assert_eq!(in_tree(&store), [("j".into(), 1), ("k".into(), 7)]);
        drop(store);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_journal_is_folded_into_the_tree_and_emptied() {
        let dir = temp_dir("fold");
        // Every append fills a journal file.
        let tuning = Tuning { fold_bytes: 1, ..Tuning::default() };
        let store = FileStore::open_tuned(&dir, false, 100, tuning).unwrap();
        for token in 1..=20 {
            store.advance("k", token).await.unwrap();
            store.advance(&format!("k{token}"), token).await.unwrap();
        }
        let stats = store.stats().unwrap();
        for _ in 0..500 {
            if in_tree(&store).len() == 21 && lock(&store.inner.unfolded).folding.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let tree = in_tree(&store);
        assert_eq!(tree.len(), 21, "{tree:?}");
        assert!(tree.contains(&("k".into(), 20)), "{tree:?}");
        assert!(stats.folds.get() >= 2, "{} folds", stats.folds.get());
        assert_eq!(store.tracked_keys(), 21);
        drop(store);
        // Closing folds what is left and empties both journal files.
        let journaled = || {
            let replay = |name| journal::replay(&std::fs::read(dir.join(name)).unwrap(), &mut Marks::default());
            journal::FILES.into_iter().map(|name| replay(name).unwrap().records).sum::<u64>()
        };
        // The fold thread finishes after the store is gone.
        let deadline = Instant::now() + Duration::from_secs(10);
        while journaled() > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(journaled(), 0);
        let store = reopen(&dir).await;
        assert_eq!(store.get("k").await.unwrap(), Some(20));
        assert_eq!(store.tracked_keys(), 21);
        drop(store);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn journaled_marks_may_leave_the_cache_but_marks_not_yet_durable_never_do() {
        let dir = temp_dir("inflight");
        // Capacity 1: a sweep evicts everything it may. Every append fills a
        // journal file, and a second full file waits for the fold of the first.
        let tuning =
            Tuning { fold_bytes: 1, max_journal_bytes: 1, fold_wait: Duration::from_secs(60), ..Tuning::default() };
        let store = Arc::new(FileStore::open_tuned(&dir, false, 1, tuning).unwrap());
        // Hold redb's single write transaction: no fold can finish.
        let blocker = store.inner.db.begin_write().unwrap();
        assert_eq!(store.advance("a", 3).await.unwrap(), Advance::Accepted { previous: None });
        assert_eq!(store.advance("b", 1).await.unwrap(), Advance::Accepted { previous: None });
        // Both are durable in the journal and not in the tree: they may leave the
        // cache, and a miss finds them in the journal's marks.
        sweep(&store.inner);
        sweep(&store.inner);
        assert_eq!(store.cached_keys(), 0);
        assert_eq!(store.advance("a", 2).await.unwrap(), Advance::Stale { current: 3 });
        assert_eq!(store.list("", None, 10).await.unwrap(), [("a".into(), 3), ("b".into(), 1)]);
        // The next append waits for the fold: its mark is not durable and must stay.
        let raising = tokio::spawn({
            let store = store.clone();
            async move { store.advance("k", 9).await }
        });
        while store.inner.cache.get("k").and_then(|e| e.mark) != Some(9) {
            tokio::task::yield_now().await;
        }
        sweep(&store.inner);
        sweep(&store.inner);
        assert!(store.inner.cache.contains_key("k"), "a mark not yet on disk left the cache");
        assert_eq!(store.advance("k", 5).await.unwrap(), Advance::Stale { current: 9 });
        assert!(!raising.is_finished());
        drop(blocker);
        assert_eq!(raising.await.unwrap().unwrap(), Advance::Accepted { previous: None });
        assert_eq!(store.list("", None, 10).await.unwrap(), [("a".into(), 3), ("b".into(), 1), ("k".into(), 9)]);
        drop(store);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[tokio::test]
    async fn a_torn_journal_tail_is_dropped_and_a_damaged_journal_refuses_to_open() {
        let dir = temp_dir("journal");
        drop(FileStore::open(&dir, false, 10).unwrap());
        let journal_file = dir.join(journal::FILES[1]);
        let (mut bytes, ends) = journal::tests::file_bytes(42, &[&[("a", 5)], &[("b", 6)]]);
        std::fs::write(&journal_file, &bytes[..ends[1] - 3]).unwrap();
        let store = reopen(&dir).await;
        assert_eq!(store.get("a").await.unwrap(), Some(5));
        assert_eq!(store.get("b").await.unwrap(), None, "a torn frame was replayed");
        drop(store);
        // Emptied: what it held is folded, and a restart finds no frames in it.
        let mut left = Marks::default();
        assert_eq!(journal::replay(&std::fs::read(&journal_file).unwrap(), &mut left).unwrap().records, 0);
        // The first frame damaged, the second whole: refuse, and change nothing.
        bytes[ends[0] - 1] ^= 0xFF;
        std::fs::write(&journal_file, &bytes).unwrap();
        let err = loop {
            match FileStore::open(&dir, true, 10) {
                Err(OpenError::InUse(_)) => tokio::time::sleep(Duration::from_millis(10)).await,
                other => break other.unwrap_err(),
            }
        };
        assert!(matches!(err, OpenError::Corrupt { .. }), "{err}");
        assert!(err.to_string().contains(journal::FILES[1]), "{err}");
        assert_eq!(std::fs::read(&journal_file).unwrap(), bytes);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[tokio::test]
    async fn a_start_that_fails_before_journaling_does_not_make_the_journal_required() {
        let dir = temp_dir("journal-open");
        drop(FileStore::open(&dir, false, 10).unwrap());
        // The second journal file can't be opened (a directory stands in its place).
        let second = dir.join(journal::FILES[1]);
        std::fs::remove_file(&second).unwrap();
        std::fs::create_dir(&second).unwrap();
        // Dropping the store waited for its threads: nothing holds the lock.
        let err = FileStore::open(&dir, true, 10).expect_err("opened with a directory for a journal file");
        assert!(matches!(err, OpenError::Journal { .. }), "{err}");
        // Nothing was journaled, so the store file still holds every mark: with
        // the directory gone, the store opens (and makes a new journal file).
        std::fs::remove_dir(&second).unwrap();
        drop(FileStore::open(&dir, true, 10).unwrap_or_else(|e| panic!("{e}")));
        std::fs::remove_dir_all(dir).unwrap();
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

    /// A fold that cannot finish (another write transaction holds the B-tree):
    /// the first append that needs the full journal waits `fold_wait` and
    /// fails, later ones fail at once, the refused mark is still enforced, and
    /// everything recovers once the fold ends.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stuck_fold_fails_appends_closed_then_recovers() {
        let dir = temp_dir("stuck");
        let fold_wait = Duration::from_secs(1);
        let tuning = Tuning { fold_bytes: 1, max_journal_bytes: 1, fold_wait, ..Tuning::default() };
        let store = Arc::new(FileStore::open_tuned(&dir, false, 100, tuning).unwrap());
        let blocker = store.inner.db.begin_write().unwrap();
        // The first fills one file and hands it to the fold, the second the other.
        assert_eq!(store.advance("a", 3).await.unwrap(), Advance::Accepted { previous: None });
        assert_eq!(store.advance("b", 1).await.unwrap(), Advance::Accepted { previous: None });
        let started = Instant::now();
        assert!(store.advance("k", 9).await.is_err(), "the journal is full and the fold stuck: 503");
        assert!(started.elapsed() >= fold_wait);
        let started = Instant::now();
        assert!(store.advance("j", 1).await.is_err());
        assert!(started.elapsed() < fold_wait, "later appends fail at once");
        assert!(store.stats().unwrap().is_failing());
        assert_eq!(store.advance("k", 5).await.unwrap(), Advance::Stale { current: 9 });
        drop(blocker);
        let mut tries = 0;
        while store.advance("k", 9).await.is_err() {
            tries += 1;
            assert!(tries < 500, "the journal never drained after the fold was let go");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(!store.stats().unwrap().is_failing());
        drop(store);
        let store = FileStore::open(&dir, true, 100).unwrap();
        assert_eq!((store.get("a").await.unwrap(), store.get("k").await.unwrap()), (Some(3), Some(9)));
        drop(store);
        let _ = std::fs::remove_dir_all(dir);
    }

    /// What a crash leaves while one journal file is being folded and the other
    /// takes appends: every acknowledged mark comes back from the two files.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_crash_with_one_journal_file_folding_and_the_other_in_use_loses_nothing() {
        let dir = temp_dir("midfold");
        let crashed = temp_dir("midfold-crashed");
        let tuning = Tuning { fold_bytes: 1, ..Tuning::default() };
        let store = FileStore::open_tuned(&dir, false, 100, tuning).unwrap();
        let blocker = store.inner.db.begin_write().unwrap();
        store.advance("a", 3).await.unwrap();
        store.advance("b", 4).await.unwrap();
        store.advance("a", 5).await.unwrap();
        // The files as they are on disk now: both journal files hold frames.
        std::fs::create_dir_all(&crashed).unwrap();
        for name in [DB_FILE, journal::FILES[0], journal::FILES[1]] {
            std::fs::copy(dir.join(name), crashed.join(name)).unwrap();
            if name != DB_FILE {
                let replayed = journal::replay(&std::fs::read(dir.join(name)).unwrap(), &mut Marks::new()).unwrap();
                assert!(replayed.records > 0, "{name} holds no frame");
            }
        }
        drop(blocker);
        drop(store);
        let store = FileStore::open(&crashed, true, 100).unwrap();
        assert_eq!((store.get("a").await.unwrap(), store.get("b").await.unwrap()), (Some(5), Some(4)));
        drop(store);
        let _ = std::fs::remove_dir_all(dir);
        let _ = std::fs::remove_dir_all(crashed);
    }
}
