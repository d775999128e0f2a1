//! Fence stores: where the highest accepted token of each key ("the mark") lives.
//!
//! [`FenceStore::advance`] is the one primitive the fence needs: an atomic
//! compare-and-raise. Every store must make it indivisible per key: two advances
//! of the same key can never both read the old mark and both win, and a mark
//! never goes back.

mod file;
mod memory;

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};

pub use file::{journal, CacheBounds, FileStore, OpenError};
pub use memory::MemoryStore;

/// The result of an [`FenceStore::advance`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Advance {
    /// `token >= mark`: the mark is now `token`. `previous` is the mark before.
    Accepted { previous: Option<u64> },
    /// `token < mark`: nothing changed.
    Stale { current: u64 },
}

/// Why the store could not answer; the fence fails closed (503
/// `store-unavailable`, with this text as the problem's `detail`).
///
/// Cloneable because one commit's outcome answers every raise in it; the
/// sources are shared for that.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// fencegate is shutting down: the store takes no more raises.
    #[error("fence store unavailable: the store is closing")]
    Closing,
    /// The disk under the journal has no room for the raise.
    #[error("fence store unavailable: appending to the fence journal: {0}")]
    DiskFull(#[source] Arc<std::io::Error>),
    /// The journal is full and the fold that empties it is not finishing.
    #[error("fence store unavailable: the journal is full and folding it into the fence store is not finishing")]
    FoldStuck,
    /// The journal is full and the thread that folds it has stopped.
    #[error("fence store unavailable: the journal is full and the fold thread has stopped")]
    FoldStopped,
    /// A delete of marks held the store longer than a raise or a read waits.
    #[error("fence store unavailable: a delete of fences has held the store for {0:?}; try again")]
    Deleting(std::time::Duration),
    /// The thread that makes raises durable has stopped.
    #[error("fence store unavailable: the commit thread has stopped")]
    CommitterStopped,
    /// Reading or writing a store file failed.
    #[error("fence store unavailable: {context}: {source}")]
    Io {
        context: &'static str,
        #[source]
        source: Arc<std::io::Error>,
    },
    /// The B-tree file could not be read.
    #[error("fence store unavailable: {context}: {source}")]
    Database {
        context: &'static str,
        #[source]
        source: Arc<redb::Error>,
    },
    /// A blocking read of the store panicked or was cancelled.
    #[error("fence store unavailable: {context} failed: {source}")]
    Task {
        context: &'static str,
        #[source]
        source: Arc<tokio::task::JoinError>,
    },
}

/// Which marks [`FenceStore::delete`] drops.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selection {
    /// The mark of exactly this key.
    Key(String),
    /// Every mark whose key starts with this.
    Prefix(String),
}

/// What [`FenceStore::delete`] dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deleted {
    /// How many marks.
    pub count: u64,
    /// For [`Selection::Key`], the mark the key had, if it had one.
    pub token: Option<u64>,
}

/// Largest page [`FenceStore::list`] returns.
pub const MAX_LIST_LIMIT: usize = 1000;

/// A place that keeps one monotonic mark per key.
pub trait FenceStore: Send + Sync + 'static {
    /// The mark of `key`, or `None` when no token was ever accepted for it.
    fn get(&self, key: &str) -> impl Future<Output = Result<Option<u64>, StoreError>> + Send;

    /// What [`get`](Self::get) would answer, when the store has it at hand
    /// without waiting (held in memory); `None` when only `get` can tell.
    /// Lets a caller skip a future, never changes an answer.
    fn peek(&self, _key: &str) -> Option<Option<u64>> {
        None
    }

    /// Atomically raises the mark of `key` to `token` when `token >= mark`.
    /// When this returns `Accepted`, the raise is as durable as the store promises.
    fn advance(&self, key: &str, token: u64) -> impl Future<Output = Result<Advance, StoreError>> + Send;

    /// Up to `limit` marks whose keys start with `prefix` and sort after `after`,
    /// in key order.
    fn list(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<(String, u64)>, StoreError>> + Send;

    /// Drops the marks `which` selects, so their keys accept any token again:
    /// for operators removing marks of keys they know are dead. When this
    /// returns, no restart brings a dropped mark back. A raise that races it is
    /// ordered before it (and dropped) or after it (and kept), never half.
    fn delete(&self, which: &Selection) -> impl Future<Output = Result<Deleted, StoreError>> + Send;

    /// Bytes the store takes on disk, for stores that have a disk
    /// (`fencegate_store_disk_bytes`). Cheap: read at every scrape.
    fn disk_bytes(&self) -> Option<u64> {
        None
    }

    /// How many keys have a mark (the `fencegate_tracked_keys` gauge).
    fn tracked_keys(&self) -> usize;

    /// How many marks are held in memory now.
    fn cached_keys(&self) -> usize;

    /// Commit counters, for stores that commit.
    fn stats(&self) -> Option<&CommitStats> {
        None
    }
}

/// What a durable store's committer did: exported as `fencegate_store_*`.
#[derive(Debug)]
pub struct CommitStats {
    /// Batches made durable (each one journal append and one fsync).
    pub commits: Counter,
    /// Marks raised on disk; more raises than commits means group commit worked.
    pub raises: Counter,
    /// Commits that failed (the raises in them were refused with 503).
    pub failures: Counter,
    /// Commit latency, fsync included.
    pub commit_seconds: Histogram,
    /// Journal files folded into the B-tree (one transaction and fsync each).
    pub folds: Counter,
    /// Folds that failed and were retried (nothing is lost: the journal keeps the marks).
    pub fold_failures: Counter,
    /// Whether the most recent commit failed: readiness reports 503 until one succeeds.
    pub failing: AtomicBool,
    /// The store's size on disk, set from [`FenceStore::disk_bytes`] at each scrape.
    pub disk_bytes: Gauge<i64, AtomicI64>,
}

impl Default for CommitStats {
    fn default() -> Self {
        CommitStats {
            commits: Counter::default(),
            raises: Counter::default(),
            failures: Counter::default(),
            // 50 µs .. ~3 s
            commit_seconds: Histogram::new(exponential_buckets(0.00005, 2.0, 16)),
            folds: Counter::default(),
            fold_failures: Counter::default(),
            failing: AtomicBool::new(false),
            disk_bytes: Gauge::default(),
        }
    }
}

impl CommitStats {
    pub fn commits(&self) -> u64 {
        self.commits.get()
    }

    pub fn raises(&self) -> u64 {
        self.raises.get()
    }

    pub fn is_failing(&self) -> bool {
        self.failing.load(Ordering::Relaxed)
    }
}

/// The store chosen by config, dispatched without boxing.
#[derive(Debug)]
pub enum AnyStore {
    Memory(MemoryStore),
    File(FileStore),
}

impl AnyStore {
    /// Stops the store's threads once their work is on disk; see [`FileStore::close`].
    pub async fn close(&self) {
        match self {
            AnyStore::Memory(_) => {}
            AnyStore::File(s) => s.close().await,
        }
    }
}

impl FenceStore for AnyStore {
    async fn get(&self, key: &str) -> Result<Option<u64>, StoreError> {
        match self {
            AnyStore::Memory(s) => s.get(key).await,
            AnyStore::File(s) => s.get(key).await,
        }
    }

    fn peek(&self, key: &str) -> Option<Option<u64>> {
        match self {
            AnyStore::Memory(s) => s.peek(key),
            AnyStore::File(s) => s.peek(key),
        }
    }

    async fn advance(&self, key: &str, token: u64) -> Result<Advance, StoreError> {
        match self {
            AnyStore::Memory(s) => s.advance(key, token).await,
            AnyStore::File(s) => s.advance(key, token).await,
        }
    }

    async fn list(&self, prefix: &str, after: Option<&str>, limit: usize) -> Result<Vec<(String, u64)>, StoreError> {
        match self {
            AnyStore::Memory(s) => s.list(prefix, after, limit).await,
            AnyStore::File(s) => s.list(prefix, after, limit).await,
        }
    }

    async fn delete(&self, which: &Selection) -> Result<Deleted, StoreError> {
        match self {
            AnyStore::Memory(s) => s.delete(which).await,
            AnyStore::File(s) => s.delete(which).await,
        }
    }

    fn disk_bytes(&self) -> Option<u64> {
        match self {
            AnyStore::Memory(s) => s.disk_bytes(),
            AnyStore::File(s) => s.disk_bytes(),
        }
    }

    fn tracked_keys(&self) -> usize {
        match self {
            AnyStore::Memory(s) => s.tracked_keys(),
            AnyStore::File(s) => s.tracked_keys(),
        }
    }

    fn cached_keys(&self) -> usize {
        match self {
            AnyStore::Memory(s) => s.cached_keys(),
            AnyStore::File(s) => s.cached_keys(),
        }
    }

    fn stats(&self) -> Option<&CommitStats> {
        match self {
            AnyStore::Memory(s) => s.stats(),
            AnyStore::File(s) => s.stats(),
        }
    }
}
