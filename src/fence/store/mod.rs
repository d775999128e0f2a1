//! Fence stores: where the highest accepted token of each key ("the mark") lives.
//!
//! [`FenceStore::advance`] is the one primitive the fence needs: an atomic
//! compare-and-raise. Every store must make it indivisible per key: two advances
//! of the same key can never both read the old mark and both win, and a mark
//! never goes back.

mod file;
mod memory;
pub mod redis;

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};

pub use file::{journal, CacheBounds, FileStore, OpenError};
pub use memory::MemoryStore;
pub use redis::{Confirmed, RedisStore};

use crate::fence::gate::Ask;

/// The result of an [`FenceStore::advance`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Advance {
    /// `token >= mark`: the mark is now `token`. `previous` is the mark before.
    Accepted { previous: Option<u64> },
    /// `token < mark`: nothing changed.
    Stale { current: u64 },
}

/// The result of [`FenceStore::enter`]: a fenced write's turn as the store
/// sees it.
#[derive(Debug)]
pub enum Entered {
    /// `token >= mark` (on a turn held alone, also with no write of the key
    /// in flight anywhere): the mark is `token` now, `previous` before.
    /// `in_flight` records the write for stores replicas share; dropping it
    /// ends the record.
    Accepted { previous: Option<u64>, in_flight: InFlight },
    /// `token < mark`: nothing changed.
    Stale { current: u64 },
    /// A higher token waits for the key on another replica.
    Superseded { waiting: u64 },
    /// Writes of the key stayed in flight on other replicas for the whole wait.
    TimedOut,
}

impl Entered {
    /// The outcome of a store of one process's advance.
    fn local(advance: Advance) -> Entered {
        match advance {
            Advance::Accepted { previous } => Entered::Accepted { previous, in_flight: InFlight::default() },
            Advance::Stale { current } => Entered::Stale { current },
        }
    }
}

/// A fenced write in flight, as a store replicas share records it (nothing
/// for a store of one process, whose turns are all in its gate). Dropped
/// when the request's turn ends: response head, failure, or the end of its
/// settle period.
#[derive(Debug, Default)]
pub struct InFlight(Option<redis::Flight>);

impl InFlight {
    fn redis(flight: redis::Flight) -> InFlight {
        InFlight(Some(flight))
    }

    /// Records nothing (a store of one process).
    pub fn is_empty(&self) -> bool {
        self.0.is_none()
    }
}

/// What a head check may compare a token with before the request's turn
/// ([`FenceStore::at_hand`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtHand {
    /// The mark, exactly (`None`: the key has none).
    Mark(Option<u64>),
    /// A mark the key is known to have reached: a token below it is stale;
    /// any other is decided under the turn.
    Floor(Option<u64>),
    /// Only a read of the store can tell.
    Read,
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
    /// Redis refused or failed a call, or the connection to it is down.
    #[error("fence store unavailable: {context}: {message}")]
    Redis { context: &'static str, message: String },
    /// Redis did not answer within `[fences] timeout`.
    #[error("fence store unavailable: {context}: Redis did not answer within {after:?}")]
    RedisTimeout { context: &'static str, after: std::time::Duration },
    /// Fewer Redis replicas than `[fences] min_replicas` acknowledged the decision.
    #[error(
        "fence store unavailable: {acked} Redis replica(s) acknowledged the decision within {within:?}, \
         {wanted} required (min_replicas); nothing was forwarded"
    )]
    Replicas { acked: i64, wanted: u32, within: std::time::Duration },
    /// The store lost marks, or is not the store this replica used: not
    /// trusted until an operator confirms it.
    #[error("fence store unavailable: {0}; an operator must confirm the store (fencegate fence confirm-store)")]
    Distrusted(String),
    /// An operator confirmed the shared store after it lost its data:
    /// writes admitted before the loss may still be in flight, with no
    /// record left, so fenced writes wait until their leases have run out.
    #[error(
        "fence store unavailable: fenced writes are held for {} more: an operator confirmed the Redis fence store \
         after it lost its data, and writes admitted before that may still be in flight",
        humantime::format_duration(std::time::Duration::from_secs(.0.as_secs() + u64::from(.0.subsec_nanos() > 0)))
    )]
    Held(std::time::Duration),
    /// Redis answered something fencegate does not understand.
    #[error("fence store unavailable: the Redis fence store answered {0}")]
    Unexpected(String),
    /// A blocking read of the store panicked or was cancelled.
    #[error("fence store unavailable: {context} failed: {source}")]
    Task {
        context: &'static str,
        #[source]
        source: Arc<tokio::task::JoinError>,
    },
}

impl StoreError {
    fn redis(context: &'static str, e: &::redis::RedisError) -> StoreError {
        StoreError::Redis { context, message: e.to_string() }
    }

    fn unexpected(what: &str) -> StoreError {
        StoreError::Unexpected(what.to_owned())
    }

    /// When the same write may succeed, when the store knows: the
    /// `Retry-After` of its refusal (otherwise one second).
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            StoreError::Held(left) => Some(*left),
            _ => None,
        }
    }
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

    /// What the head checks compare a token with before its turn; by default
    /// what [`peek`](Self::peek) has.
    fn at_hand(&self, key: &str) -> AtHand {
        match self.peek(key) {
            Some(mark) => AtHand::Mark(mark),
            None => AtHand::Read,
        }
    }

    /// Atomically raises the mark of `key` to `token` when `token >= mark`.
    /// When this returns `Accepted`, the raise is as durable as the store promises.
    fn advance(&self, key: &str, token: u64) -> impl Future<Output = Result<Advance, StoreError>> + Send;

    /// [`advance`](Self::advance) for a fenced write that holds its key's
    /// turn in this process: a store replicas share also takes the key's
    /// turn among them (waiting up to `wait` for their writes of it to end)
    /// and records this write in flight for at most `lease`.
    fn enter(
        &self,
        key: &str,
        token: u64,
        _ask: Ask,
        _lease: std::time::Duration,
        _wait: std::time::Duration,
    ) -> impl Future<Output = Result<Entered, StoreError>> + Send {
        async move { self.advance(key, token).await.map(Entered::local) }
    }

    /// Why fenced writes are refused now, when they are: `/readyz` answers
    /// 503 with it.
    fn unready(&self) -> Option<String> {
        self.stats()
            .filter(|s| s.is_failing())
            .map(|_| "the last fence store commit failed; fenced writes are refused until one succeeds".to_owned())
    }

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
    Redis(RedisStore),
}

impl AnyStore {
    /// Stops the store's threads once their work is on disk (see
    /// [`FileStore::close`]); lets the Redis store end its writes' records.
    pub async fn close(&self) {
        match self {
            AnyStore::Memory(_) => {}
            AnyStore::File(s) => s.close().await,
            AnyStore::Redis(s) => s.close().await,
        }
    }
}

impl FenceStore for AnyStore {
    async fn get(&self, key: &str) -> Result<Option<u64>, StoreError> {
        match self {
            AnyStore::Memory(s) => s.get(key).await,
            AnyStore::File(s) => s.get(key).await,
            AnyStore::Redis(s) => Box::pin(s.get(key)).await,
        }
    }

    fn peek(&self, key: &str) -> Option<Option<u64>> {
        match self {
            AnyStore::Memory(s) => s.peek(key),
            AnyStore::File(s) => s.peek(key),
            AnyStore::Redis(_) => None,
        }
    }

    fn at_hand(&self, key: &str) -> AtHand {
        match self {
            AnyStore::Memory(s) => s.at_hand(key),
            AnyStore::File(s) => s.at_hand(key),
            AnyStore::Redis(s) => AtHand::Floor(s.seen(key)),
        }
    }

    async fn enter(
        &self,
        key: &str,
        token: u64,
        ask: Ask,
        lease: std::time::Duration,
        wait: std::time::Duration,
    ) -> Result<Entered, StoreError> {
        // The stores of one process take no turn of their own: their advance
        // is the whole step.
        let advanced = match self {
            AnyStore::Memory(s) => s.advance(key, token).await,
            AnyStore::File(s) => s.advance(key, token).await,
            // Boxed: its future (a round trip, a retry's sleep) would size
            // every fenced request's future, whatever its store.
            AnyStore::Redis(s) => return Box::pin(s.enter(key, token, ask, lease, wait)).await,
        };
        advanced.map(Entered::local)
    }

    fn unready(&self) -> Option<String> {
        match self {
            AnyStore::Memory(s) => s.unready(),
            AnyStore::File(s) => s.unready(),
            AnyStore::Redis(s) => s.unready(),
        }
    }

    async fn advance(&self, key: &str, token: u64) -> Result<Advance, StoreError> {
        match self {
            AnyStore::Memory(s) => s.advance(key, token).await,
            AnyStore::File(s) => s.advance(key, token).await,
            AnyStore::Redis(s) => Box::pin(s.advance(key, token)).await,
        }
    }

    async fn list(&self, prefix: &str, after: Option<&str>, limit: usize) -> Result<Vec<(String, u64)>, StoreError> {
        match self {
            AnyStore::Memory(s) => s.list(prefix, after, limit).await,
            AnyStore::File(s) => s.list(prefix, after, limit).await,
            AnyStore::Redis(s) => Box::pin(s.list(prefix, after, limit)).await,
        }
    }

    async fn delete(&self, which: &Selection) -> Result<Deleted, StoreError> {
        match self {
            AnyStore::Memory(s) => s.delete(which).await,
            AnyStore::File(s) => s.delete(which).await,
            AnyStore::Redis(s) => Box::pin(s.delete(which)).await,
        }
    }

    fn disk_bytes(&self) -> Option<u64> {
        match self {
            AnyStore::Memory(s) => s.disk_bytes(),
            AnyStore::File(s) => s.disk_bytes(),
            AnyStore::Redis(_) => None,
        }
    }

    fn tracked_keys(&self) -> usize {
        match self {
            AnyStore::Memory(s) => s.tracked_keys(),
            AnyStore::File(s) => s.tracked_keys(),
            AnyStore::Redis(s) => s.tracked_keys(),
        }
    }

    fn cached_keys(&self) -> usize {
        match self {
            AnyStore::Memory(s) => s.cached_keys(),
            AnyStore::File(s) => s.cached_keys(),
            AnyStore::Redis(s) => s.cached_keys(),
        }
    }

    fn stats(&self) -> Option<&CommitStats> {
        match self {
            AnyStore::Memory(s) => s.stats(),
            AnyStore::File(s) => s.stats(),
            AnyStore::Redis(_) => None,
        }
    }
}
