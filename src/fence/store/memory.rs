//! The in-memory store: a sharded map with compare-and-raise under the shard
//! lock, and an ordered index of its keys for listings and prefix deletes.

use std::collections::BTreeSet;
use std::ops::Bound;
use std::sync::{Mutex, MutexGuard, PoisonError};

use dashmap::mapref::entry::Entry;

use crate::fence::KeyMap;

use super::{Advance, Deleted, FenceStore, LeaseRecord, LocalLeases, Selection, StoreError};

/// Marks in a [`DashMap`](dashmap::DashMap): fast, and every fence dies with the process.
///
/// `advance` holds the key's shard lock for the compare and the raise together
/// and never across an `.await`, so concurrent advances of one key serialize and
/// different shards never wait on each other.
///
/// It keeps every mark until the process ends (or an operator deletes it):
/// nothing can be read back from anywhere, so nothing may leave. Each mark
/// costs its key twice (map and index; at most `[fences] max_key_bytes`
/// each) plus a fixed overhead.
///
/// ```
/// use fencegate::fence::store::{Advance, FenceStore, MemoryStore};
/// # tokio_test_block_on(async {
/// let store = MemoryStore::default();
/// assert_eq!(store.advance("k", 5).await.unwrap(), Advance::Accepted { previous: None });
/// assert_eq!(store.advance("k", 4).await.unwrap(), Advance::Stale { current: 5 });
/// assert_eq!(store.advance("k", 5).await.unwrap(), Advance::Accepted { previous: Some(5) });
/// # });
/// # fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
/// #     tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
/// # }
/// ```
#[derive(Debug, Default)]
pub struct MemoryStore {
    marks: KeyMap<u64>,
    /// Every key of `marks`, in order: a listing reads a range of it instead
    /// of every key. Changed only when a key is created or deleted, always
    /// under that key's shard lock (shard, then index), so a raise of an
    /// existing key never touches it. A copy of each key rather than a shared
    /// one, so the map's keys, and the hot path's lookups, stay as they were.
    order: Mutex<BTreeSet<Box<str>>>,
    /// Lease records, which die with the process as the marks do.
    leases: LocalLeases,
}

impl MemoryStore {
    /// The compare-and-raise itself, synchronous: it never waits on anything but
    /// the shard lock.
    pub fn advance_now(&self, key: &str, token: u64) -> Advance {
        // Fast path for keys already present: no allocation for the key.
        if let Some(mut mark) = self.marks.get_mut(key) {
            return raise(&mut mark, token);
        }
        match self.marks.entry(key.into()) {
            Entry::Occupied(mut e) => raise(e.get_mut(), token),
            Entry::Vacant(e) => {
                self.order().insert(e.key().clone());
                e.insert(token);
                Advance::Accepted { previous: None }
            }
        }
    }

    fn order(&self) -> MutexGuard<'_, BTreeSet<Box<str>>> {
        // Nothing under this lock can leave the set half-changed.
        self.order.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Up to `limit` keys that start with `prefix` and sort after `after`, in order.
    fn keys(&self, prefix: &str, after: Option<&str>, limit: usize) -> Vec<Box<str>> {
        let from = match after {
            Some(after) if after >= prefix => Bound::Excluded(after),
            _ => Bound::Included(prefix),
        };
        let order = self.order();
        order
            .range::<str, _>((from, Bound::Unbounded))
            .take_while(|key| key.starts_with(prefix))
            .take(limit)
            .cloned()
            .collect()
    }

    /// Removes `key`'s mark and its index entry together, under its shard lock.
    fn remove(&self, key: &str) -> Option<u64> {
        self.marks
            .remove_if(key, |key, _| {
                self.order().remove(key);
                true
            })
            .map(|(_, mark)| mark)
    }
}

/// Keys a prefix delete takes from the index at a time.
const DELETE_PAGE: usize = 1024;

fn raise(mark: &mut u64, token: u64) -> Advance {
    if token < *mark {
        Advance::Stale { current: *mark }
    } else {
        let previous = *mark;
        *mark = token;
        Advance::Accepted { previous: Some(previous) }
    }
}

impl FenceStore for MemoryStore {
    async fn get(&self, key: &str) -> Result<Option<u64>, StoreError> {
        Ok(self.marks.get(key).map(|m| *m))
    }

    /// Every mark is in memory.
    fn peek(&self, key: &str) -> Option<Option<u64>> {
        Some(self.marks.get(key).map(|m| *m))
    }

    async fn advance(&self, key: &str, token: u64) -> Result<Advance, StoreError> {
        Ok(self.advance_now(key, token))
    }

    async fn list(&self, prefix: &str, after: Option<&str>, limit: usize) -> Result<Vec<(String, u64)>, StoreError> {
        // The index lock is let go before any shard lock is taken: writers
        // take them the other way round. A key deleted in between is left out.
        let keys = self.keys(prefix, after, limit);
        Ok(keys.into_iter().filter_map(|key| self.marks.get(&*key).map(|m| (key.into_string(), *m))).collect())
    }

    async fn delete(&self, which: &Selection) -> Result<Deleted, StoreError> {
        match which {
            Selection::Key(key) => {
                let token = self.remove(key);
                Ok(Deleted { count: u64::from(token.is_some()), token })
            }
            Selection::Prefix(prefix) => {
                // In pages, so the index lock is never held long; a key created
                // under the prefix while this runs may stay.
                let mut count = 0;
                let mut after: Option<Box<str>> = None;
                loop {
                    let page = self.keys(prefix, after.as_deref(), DELETE_PAGE);
                    let Some(last) = page.last().cloned() else { break };
                    count += page.iter().filter(|key| self.remove(key).is_some()).count() as u64;
                    after = Some(last);
                }
                Ok(Deleted { count, token: None })
            }
        }
    }

    async fn lease(&self, key: &str) -> Result<Option<LeaseRecord>, StoreError> {
        Ok(self.leases.get(key))
    }

    async fn swap_lease(
        &self,
        key: &str,
        expected: Option<&LeaseRecord>,
        new: Option<&LeaseRecord>,
    ) -> Result<bool, StoreError> {
        Ok(self.leases.swap(key, expected, new))
    }

    fn tracked_keys(&self) -> usize {
        self.marks.len()
    }

    fn cached_keys(&self) -> usize {
        self.marks.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn concurrent_advances_of_one_key_never_both_win_over_a_higher_mark() {
        // Many threads race to raise one key with every token in 0..N. Each
        // accepted raise must see a previous mark <= its token, and the final
        // mark is the maximum: a lost update would show up as a lower mark or
        // as an accepted token below a mark that was already set.
        let store = Arc::new(MemoryStore::default());
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let store = store.clone();
                std::thread::spawn(move || {
                    let mut accepted = Vec::new();
                    for i in 0..20_000u64 {
                        let token = i * 4 + t;
                        if let Advance::Accepted { previous } = store.advance_now("k", token) {
                            assert!(previous.unwrap_or(0) <= token);
                            accepted.push(token);
                        }
                    }
                    accepted
                })
            })
            .collect();
        let mut all: Vec<u64> = threads.into_iter().flat_map(|t| t.join().unwrap()).collect();
        all.sort_unstable();
        assert_eq!(*store.marks.get("k").unwrap(), 79_999);
        assert_eq!(all.last(), Some(&79_999));
    }

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
    }

    #[test]
    fn listings_page_through_the_index_in_key_order() {
        let store = MemoryStore::default();
        for (i, key) in ["/b/2", "/a/1", "/b/1", "/c", "/b/3"].iter().enumerate() {
            store.advance_now(key, i as u64);
        }
        // Raising an existing key adds nothing to the index.
        store.advance_now("/b/1", 10);
        assert_eq!(store.order().len(), 5);
        let list = |prefix, after, limit| block_on(store.list(prefix, after, limit)).unwrap();
        let pairs = |p: &[(&str, u64)]| p.iter().map(|(k, t)| (k.to_string(), *t)).collect::<Vec<_>>();
        assert_eq!(list("/b/", None, 2), pairs(&[("/b/1", 10), ("/b/2", 0)]));
        assert_eq!(list("/b/", Some("/b/2"), 2), pairs(&[("/b/3", 4)]));
        assert_eq!(list("/b/", Some("/a"), 1), pairs(&[("/b/1", 10)]));
        assert_eq!(list("", None, 10).len(), 5);
    }

    #[test]
    fn deletes_drop_marks_and_index_entries_and_a_new_raise_starts_over() {
        let store = MemoryStore::default();
        for i in 0..3000u64 {
            store.advance_now(&format!("/dead/{i}"), i);
        }
        store.advance_now("/live", 7);
        store.advance_now("/deadline", 8);
        let deleted = block_on(store.delete(&Selection::Key("/live".into()))).unwrap();
        assert_eq!(deleted, Deleted { count: 1, token: Some(7) });
        assert_eq!(block_on(store.delete(&Selection::Key("/live".into()))).unwrap().count, 0);
        let deleted = block_on(store.delete(&Selection::Prefix("/dead/".into()))).unwrap();
        assert_eq!(deleted, Deleted { count: 3000, token: None });
        assert_eq!(store.tracked_keys(), 1);
        assert_eq!(store.order().len(), 1);
        assert_eq!(block_on(store.get("/deadline")).unwrap(), Some(8));
        // A deleted key takes any token again, its old mark forgotten.
        assert_eq!(store.advance_now("/live", 1), Advance::Accepted { previous: None });
    }
}
