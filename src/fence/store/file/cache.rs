//! The mark cache in front of the disk: misses read the mark back (journal
//! first, then B-tree), and a sweep thread keeps the cache near `cache_keys`
//! and `cache_bytes`.
//!
//! The cache is what the fence enforces, so an entry leaves it only when its
//! mark is on disk and a later miss can read it back.

// redb's error type is large; these results travel between blocking threads,
// never through the request hot path.
#![allow(clippy::result_large_err)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::Duration;

use dashmap::mapref::entry::Entry;
use redb::{Database, ReadableDatabase, ReadableTable};

use super::fold::Unfolded;
use super::{lock, FileStore, Inner, FENCES};
use crate::fence::store::StoreError;

/// Most cache misses reading the disk at once (each on a blocking thread).
pub(super) const MAX_READERS: usize = 16;
/// Sweeps leave the cache this far below `cache_keys`, so they don't run on every miss.
const SWEEP_TARGET_PERCENT: usize = 90;
/// The sweep thread looks at the cache at least this often.
const SWEEP_EVERY: Duration = Duration::from_secs(1);
/// What a cached mark costs besides its key's bytes: the key's pointer and
/// length and the [`Cached`] value in the map's table (about 56 bytes), the
/// table's control byte and the room its load factor keeps free, and the
/// allocator's rounding of the key's own allocation. An estimate on the
/// generous side, so the bound holds for what the process really uses.
pub(super) const ENTRY_OVERHEAD: u64 = 96;

/// What the mark of `key` counts against `cache_bytes`.
pub(super) fn charge(key: &str) -> u64 {
    key.len() as u64 + ENTRY_OVERHEAD
}

#[derive(Debug)]
pub(super) struct Cached {
    /// The mark fencegate enforces. Never below `durable`.
    pub(super) mark: Option<u64>,
    /// The highest mark known to be on disk.
    pub(super) durable: Option<u64>,
    /// Used since the last sweep (second-chance eviction).
    pub(super) referenced: AtomicBool,
    /// Raises of the key made in memory and not yet settled (see [`raise`](super::raise)).
    pub(super) raising: u32,
}

impl Cached {
    /// With no raise on its way, everything a request was forwarded on is on
    /// disk. A mark above `durable` then is a raise that failed: nothing was
    /// forwarded on it, so it may go too, or a failing disk would fill the
    /// cache with them; the disk's mark is what a miss then enforces.
    fn evictable(&mut self) -> bool {
        self.raising == 0 && !self.referenced.swap(false, Ordering::Relaxed)
    }
}

impl FileStore {
    /// Reads `key` from disk into the cache unless it is there already.
    pub(super) async fn load(&self, key: &str) -> Result<(), StoreError> {
        let inner = &self.inner;
        // A delete waits for this read, and this read for a delete: a mark
        // read from disk before a delete never enters the cache after it.
        let _turn = inner.turn().await?;
        loop {
            let seen_evictions = inner.evictions.load(Ordering::SeqCst);
            let disk = {
                let _reader = inner.readers.acquire().await.map_err(|_| StoreError::Closing)?;
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
                    inner.cached_bytes.fetch_add(charge(key), Ordering::Relaxed);
                    slot.insert(Cached { mark: disk, durable: disk, referenced: AtomicBool::new(true), raising: 0 });
                }
            }
            if inner.over_bounds() {
                inner.sweeper.wake();
            }
            return Ok(());
        }
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
        let mark = table.get(&*key)?.map(|v| v.value());
        Ok(mark.max(journaled))
    })
    .await
    .map_err(|e| StoreError::Task { context: "read task", source: Arc::new(e) })?
    .map_err(|e| StoreError::Database { context: "reading the fence store", source: Arc::new(e) })
}

/// Up to `limit` marks in the B-tree whose keys start with `prefix` and sort
/// after `after`, in key order.
pub(super) fn list_marks(
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
        for item in table.range(start..)? {
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
    read().map_err(|e| StoreError::Database { context: "listing the fence store", source: Arc::new(e) })
}

/// How the store talks to its sweep thread: wake it when a miss pushes the
/// cache over capacity, stop it when the store closes.
#[derive(Debug, Default)]
pub(super) struct Sweeper {
    state: Mutex<SweepState>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct SweepState {
    woken: bool,
    stopped: bool,
}

impl Sweeper {
    pub(super) fn wake(&self) {
        lock(&self.state).woken = true;
        self.changed.notify_one();
    }

    pub(super) fn stop(&self) {
        lock(&self.state).stopped = true;
        self.changed.notify_one();
    }

    /// Waits until woken or `SWEEP_EVERY` has passed; `false` once stopped.
    fn wait(&self) -> bool {
        let state = lock(&self.state);
        let (mut state, _) = self
            .changed
            .wait_timeout_while(state, SWEEP_EVERY, |s| !s.woken && !s.stopped)
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        state.woken = false;
        !state.stopped
    }

    /// The sweep thread: keeps the cache near its capacity until stopped. It
    /// holds the store only while sweeping, so it also ends soon after the
    /// store is dropped.
    pub(super) fn run(&self, inner: Weak<Inner>) {
        loop {
            {
                let Some(store) = inner.upgrade() else { return };
                if store.over_bounds() {
                    sweep(&store);
                }
            }
            if !self.wait() {
                return;
            }
        }
    }
}

impl Inner {
    /// Whether the cache holds more marks or bytes than its bounds.
    pub(super) fn over_bounds(&self) -> bool {
        self.cache.len() > self.capacity || self.cached_bytes.load(Ordering::Relaxed) > self.max_cached_bytes
    }

    /// Accounts for `key`'s entry leaving the cache. Called under its shard
    /// lock, before the entry is gone: see `load`.
    pub(super) fn evicting(&self, key: &str) {
        self.evictions.fetch_add(1, Ordering::SeqCst);
        self.cached_bytes.fetch_sub(charge(key), Ordering::Relaxed);
    }
}

/// Second-chance eviction: marks that are on disk and were not used since the
/// previous pass leave the cache until it is under both targets. A mark still
/// on its way to disk never leaves.
pub(super) fn sweep(store: &Inner) {
    let target_keys = store.capacity / 100 * SWEEP_TARGET_PERCENT;
    let target_bytes = store.max_cached_bytes / 100 * SWEEP_TARGET_PERCENT as u64;
    // `len` locks every shard, so it can't be asked inside `retain`: count.
    let excess = store.cache.len().saturating_sub(target_keys);
    let mut evicted = 0;
    let over = |evicted: usize| evicted < excess || store.cached_bytes.load(Ordering::Relaxed) > target_bytes;
    for _pass in 0..2 {
        store.cache.retain(|key, cached| {
            if !over(evicted) || !cached.evictable() {
                return true;
            }
            evicted += 1;
            store.evicting(key);
            false
        });
        if !over(evicted) {
            break;
        }
    }
    tracing::debug!(
        evicted,
        cached = store.cache.len(),
        bytes = store.cached_bytes.load(Ordering::Relaxed),
        "fence cache swept"
    );
}
