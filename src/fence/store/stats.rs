//! What a durable store's committer did, and what a shared store's calls
//! did, for `/metrics` and `/readyz`.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

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

/// What a shared store's calls (Redis, etcd) did: exported as
/// `fencegate_store_roundtrip_seconds`, `fencegate_store_reconnects_total`
/// and `fencegate_store_trusted`, labelled with [`store`](Self::store).
#[derive(Debug)]
pub struct CallStats {
    /// The `store` label: `redis` or `etcd`.
    pub store: &'static str,
    /// Time from a call sent to its answer, for calls answered without
    /// error (one that timed out or failed tells of no round trip).
    pub roundtrip_seconds: Histogram,
    /// Times the store answered again after calls to it had failed: the
    /// client connected again (the first contact is no reconnect).
    pub reconnects: Counter,
    /// 1 while this replica trusts the store, 0 from the moment it finds the
    /// store lost what it acknowledged until an operator confirms it.
    pub trusted: Gauge<i64, AtomicI64>,
    /// Calls failed since the last answer: the next answer is a reconnect.
    lost: AtomicBool,
}

impl CallStats {
    pub fn new(store: &'static str) -> CallStats {
        let trusted = Gauge::default();
        trusted.set(1);
        CallStats {
            store,
            // 100 µs .. ~3.3 s: a round trip on a LAN up to past any sane `timeout`.
            roundtrip_seconds: Histogram::new(exponential_buckets(0.0001, 2.0, 16)),
            reconnects: Counter::default(),
            trusted,
            lost: AtomicBool::new(false),
        }
    }

    /// A call answered after `took`.
    pub fn answered(&self, took: Duration) {
        self.roundtrip_seconds.observe(took.as_secs_f64());
    }

    /// Whether the store answers, as a store notes it when that changes: an
    /// answer after a failure counts a reconnect.
    pub fn reachable(&self, answers: bool) {
        if !answers {
            self.lost.store(true, Ordering::Relaxed);
        } else if self.lost.swap(false, Ordering::Relaxed) {
            self.reconnects.inc();
        }
    }

    /// Whether this replica trusts the store now.
    pub fn trusts(&self, trusted: bool) {
        self.trusted.set(i64::from(trusted));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_after_a_failure_is_a_reconnect_and_the_first_contact_is_not() {
        let stats = CallStats::new("redis");
        stats.reachable(true);
        assert_eq!(stats.reconnects.get(), 0, "the first contact");
        stats.reachable(false);
        stats.reachable(false);
        stats.reachable(true);
        stats.reachable(true);
        assert_eq!(stats.reconnects.get(), 1);
        assert_eq!(stats.trusted.get(), 1, "trusted until a doubt");
        stats.trusts(false);
        assert_eq!(stats.trusted.get(), 0);
    }
}
