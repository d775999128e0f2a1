//! The store chosen by config: one enum that forwards every call of the
//! trait to its store, so the stores of one process are called directly
//! (no box, no vtable) on the request path.

use std::time::Duration;

use super::{
    Advance, AtHand, CallStats, CommitStats, Confirmed, Deleted, Entered, EtcdStore, FenceStore, FileStore,
    LeaseRecord, MemoryStore, RedisStore, Selection, StoreError,
};
use crate::fence::gate::Ask;

/// The store chosen by config, dispatched without boxing.
///
/// The Redis store's futures are boxed: a round trip (and a retry's sleep)
/// would otherwise size every fenced request's future, whatever its store.
#[derive(Debug)]
pub enum AnyStore {
    Memory(MemoryStore),
    File(FileStore),
    Redis(RedisStore),
    Etcd(EtcdStore),
}

impl FenceStore for AnyStore {
    async fn get(&self, key: &str) -> Result<Option<u64>, StoreError> {
        match self {
            AnyStore::Memory(s) => s.get(key).await,
            AnyStore::File(s) => s.get(key).await,
            AnyStore::Redis(s) => Box::pin(s.get(key)).await,
            AnyStore::Etcd(s) => Box::pin(s.get(key)).await,
        }
    }

    fn peek(&self, key: &str) -> Option<Option<u64>> {
        match self {
            AnyStore::Memory(s) => s.peek(key),
            AnyStore::File(s) => s.peek(key),
            AnyStore::Redis(s) => s.peek(key),
            AnyStore::Etcd(s) => s.peek(key),
        }
    }

    fn at_hand(&self, key: &str) -> AtHand {
        match self {
            AnyStore::Memory(s) => s.at_hand(key),
            AnyStore::File(s) => s.at_hand(key),
            AnyStore::Redis(s) => s.at_hand(key),
            AnyStore::Etcd(s) => s.at_hand(key),
        }
    }

    async fn advance(&self, key: &str, token: u64) -> Result<Advance, StoreError> {
        match self {
            AnyStore::Memory(s) => s.advance(key, token).await,
            AnyStore::File(s) => s.advance(key, token).await,
            AnyStore::Redis(s) => Box::pin(s.advance(key, token)).await,
            AnyStore::Etcd(s) => Box::pin(s.advance(key, token)).await,
        }
    }

    async fn enter(
        &self,
        key: &str,
        token: u64,
        ask: Ask,
        lease: Duration,
        wait: Duration,
    ) -> Result<Entered, StoreError> {
        match self {
            AnyStore::Memory(s) => s.enter(key, token, ask, lease, wait).await,
            AnyStore::File(s) => s.enter(key, token, ask, lease, wait).await,
            AnyStore::Redis(s) => Box::pin(s.enter(key, token, ask, lease, wait)).await,
            AnyStore::Etcd(s) => Box::pin(s.enter(key, token, ask, lease, wait)).await,
        }
    }

    async fn list(&self, prefix: &str, after: Option<&str>, limit: usize) -> Result<Vec<(String, u64)>, StoreError> {
        match self {
            AnyStore::Memory(s) => s.list(prefix, after, limit).await,
            AnyStore::File(s) => s.list(prefix, after, limit).await,
            AnyStore::Redis(s) => Box::pin(s.list(prefix, after, limit)).await,
            AnyStore::Etcd(s) => Box::pin(s.list(prefix, after, limit)).await,
        }
    }

    async fn delete(&self, which: &Selection) -> Result<Deleted, StoreError> {
        match self {
            AnyStore::Memory(s) => s.delete(which).await,
            AnyStore::File(s) => s.delete(which).await,
            AnyStore::Redis(s) => Box::pin(s.delete(which)).await,
            AnyStore::Etcd(s) => Box::pin(s.delete(which)).await,
        }
    }

    async fn lease(&self, key: &str) -> Result<Option<LeaseRecord>, StoreError> {
        match self {
            AnyStore::Memory(s) => s.lease(key).await,
            AnyStore::File(s) => s.lease(key).await,
            AnyStore::Redis(s) => Box::pin(s.lease(key)).await,
            AnyStore::Etcd(s) => Box::pin(s.lease(key)).await,
        }
    }

    async fn swap_lease(
        &self,
        key: &str,
        expected: Option<&LeaseRecord>,
        new: Option<&LeaseRecord>,
    ) -> Result<bool, StoreError> {
        match self {
            AnyStore::Memory(s) => s.swap_lease(key, expected, new).await,
            AnyStore::File(s) => s.swap_lease(key, expected, new).await,
            AnyStore::Redis(s) => Box::pin(s.swap_lease(key, expected, new)).await,
            AnyStore::Etcd(s) => Box::pin(s.swap_lease(key, expected, new)).await,
        }
    }

    async fn confirm(&self) -> Result<Option<Confirmed>, StoreError> {
        match self {
            AnyStore::Memory(s) => s.confirm().await,
            AnyStore::File(s) => s.confirm().await,
            AnyStore::Redis(s) => Box::pin(s.confirm()).await,
            AnyStore::Etcd(s) => Box::pin(s.confirm()).await,
        }
    }

    fn set_write_lease(&self, longest: Duration) {
        match self {
            AnyStore::Memory(s) => s.set_write_lease(longest),
            AnyStore::File(s) => s.set_write_lease(longest),
            AnyStore::Redis(s) => s.set_write_lease(longest),
            AnyStore::Etcd(s) => s.set_write_lease(longest),
        }
    }

    fn unready(&self) -> Option<String> {
        match self {
            AnyStore::Memory(s) => s.unready(),
            AnyStore::File(s) => s.unready(),
            AnyStore::Redis(s) => s.unready(),
            AnyStore::Etcd(s) => s.unready(),
        }
    }

    fn disk_bytes(&self) -> Option<u64> {
        match self {
            AnyStore::Memory(s) => s.disk_bytes(),
            AnyStore::File(s) => s.disk_bytes(),
            AnyStore::Redis(s) => s.disk_bytes(),
            AnyStore::Etcd(s) => s.disk_bytes(),
        }
    }

    fn tracked_keys(&self) -> usize {
        match self {
            AnyStore::Memory(s) => s.tracked_keys(),
            AnyStore::File(s) => s.tracked_keys(),
            AnyStore::Redis(s) => s.tracked_keys(),
            AnyStore::Etcd(s) => s.tracked_keys(),
        }
    }

    fn cached_keys(&self) -> usize {
        match self {
            AnyStore::Memory(s) => s.cached_keys(),
            AnyStore::File(s) => s.cached_keys(),
            AnyStore::Redis(s) => s.cached_keys(),
            AnyStore::Etcd(s) => s.cached_keys(),
        }
    }

    fn stats(&self) -> Option<&CommitStats> {
        match self {
            AnyStore::Memory(s) => s.stats(),
            AnyStore::File(s) => s.stats(),
            AnyStore::Redis(s) => s.stats(),
            AnyStore::Etcd(s) => s.stats(),
        }
    }

    fn call_stats(&self) -> Option<&CallStats> {
        match self {
            AnyStore::Memory(s) => s.call_stats(),
            AnyStore::File(s) => s.call_stats(),
            AnyStore::Redis(s) => s.call_stats(),
            AnyStore::Etcd(s) => s.call_stats(),
        }
    }

    async fn close(&self) {
        match self {
            AnyStore::Memory(s) => s.close().await,
            AnyStore::File(s) => FenceStore::close(s).await,
            AnyStore::Redis(s) => s.close().await,
            AnyStore::Etcd(s) => s.close().await,
        }
    }
}
