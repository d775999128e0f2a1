//! The in-memory store: a sharded map with compare-and-raise under the shard lock.

use crate::fence::KeyMap;
use dashmap::mapref::entry::Entry;

use super::{Advance, FenceStore, StoreError};

/// Marks in a [`DashMap`](dashmap::DashMap): fast, and every fence dies with the process.
///
/// `advance` holds the key's shard lock for the compare and the raise together
/// and never across an `.await`, so concurrent advances of one key serialize and
/// different shards never wait on each other.
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
                e.insert(token);
                Advance::Accepted { previous: None }
            }
        }
    }
}

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

    async fn advance(&self, key: &str, token: u64) -> Result<Advance, StoreError> {
        Ok(self.advance_now(key, token))
    }

    async fn list(&self, prefix: &str, after: Option<&str>, limit: usize) -> Result<Vec<(String, u64)>, StoreError> {
        // A full scan: the memory store has no order. Fine for an admin call.
        let mut found: Vec<(String, u64)> = self
            .marks
            .iter()
            .filter(|e| e.key().starts_with(prefix) && after.is_none_or(|a| &**e.key() > a))
            .map(|e| (e.key().to_string(), *e.value()))
            .collect();
        found.sort_unstable();
        found.truncate(limit);
        Ok(found)
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
}
