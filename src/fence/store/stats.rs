//! What a durable store's committer did, for `/metrics` and `/readyz`.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};

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
    /// Whether the most recent commit failed: `fencegate_store_writable` is 0 until one succeeds.
    pub failing: AtomicBool,
    /// The store's size on disk, set from [`FenceStore::disk_bytes`](super::FenceStore::disk_bytes) at each scrape.
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
