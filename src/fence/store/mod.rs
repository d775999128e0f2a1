//! Fence stores: where the highest accepted token of each key ("the mark") lives.
//!
//! [`FenceStore::advance`] is the one primitive the fence needs: an atomic
//! compare-and-raise. Every store must make it indivisible per key: two advances
//! of the same key can never both read the old mark and both win.

mod memory;

use std::future::Future;

pub use memory::MemoryStore;

/// The result of an [`FenceStore::advance`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Advance {
    /// `token >= mark`: the mark is now `token`. `previous` is the mark before.
    Accepted { previous: Option<u64> },
    /// `token < mark`: nothing changed.
    Stale { current: u64 },
}

/// The store could not answer; the fence fails closed (503).
#[derive(Debug, Clone, thiserror::Error)]
#[error("fence store unavailable: {0}")]
pub struct StoreError(pub String);

/// A place that keeps one monotonic mark per key.
pub trait FenceStore: Send + Sync + 'static {
    /// The mark of `key`, or `None` when no token was ever accepted for it.
    fn get(&self, key: &str) -> impl Future<Output = Result<Option<u64>, StoreError>> + Send;

    /// Atomically raises the mark of `key` to `token` when `token >= mark`.
    /// When this returns `Accepted`, the raise is as durable as the store promises.
    fn advance(&self, key: &str, token: u64) -> impl Future<Output = Result<Advance, StoreError>> + Send;

    /// How many keys have a mark (the `fencegate_tracked_keys` gauge).
    fn tracked_keys(&self) -> usize;
}

/// The store chosen by config, dispatched without boxing.
#[derive(Debug)]
pub enum AnyStore {
    Memory(MemoryStore),
}

impl FenceStore for AnyStore {
    async fn get(&self, key: &str) -> Result<Option<u64>, StoreError> {
        match self {
            AnyStore::Memory(s) => s.get(key).await,
        }
    }

    async fn advance(&self, key: &str, token: u64) -> Result<Advance, StoreError> {
        match self {
            AnyStore::Memory(s) => s.advance(key, token).await,
        }
    }

    fn tracked_keys(&self) -> usize {
        match self {
            AnyStore::Memory(s) => s.tracked_keys(),
        }
    }
}
