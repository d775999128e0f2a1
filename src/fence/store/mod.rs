//! Fence stores: where the highest accepted token of each key ("the mark") lives.
//!
//! One trait, [`FenceStore`], serves every store: the memory store (one
//! process, volatile), the file store (one process, durable), the Redis
//! store and the etcd store (replicas share them). Its types name no store: a store of one
//! process leaves the parts meant for shared stores at their defaults.
//!
//! [`FenceStore::advance`] is the one primitive the fence needs: an atomic
//! compare-and-raise. Every store must make it indivisible per key: two advances
//! of the same key can never both read the old mark and both win, and a mark
//! never goes back.
//!
//! Nothing here knows the layers above the fence: routes hand their bounds
//! in as plain values ([`WriteBounds`]).

mod any;
mod error;
mod etcd;
mod file;
mod in_flight;
mod knowledge;
mod leases;
mod memory;
pub mod redis;
mod stats;

use std::future::Future;
use std::time::Duration;

pub use any::AnyStore;
pub use error::{Distrust, Doubt, Found, StoreError, Unexpected};
pub use etcd::EtcdStore;
pub use file::{journal, CacheBounds, FileStore, OpenError};
pub use in_flight::{longest_write_lease, InFlight, WriteBounds, WriteRecord};
pub use leases::{LeaseRecord, LocalLeases};
pub use memory::MemoryStore;
pub use redis::RedisStore;
pub use stats::{CallStats, CommitStats};

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
    /// `in_flight` is the store's record of the write (empty for a store
    /// of one process); dropping it ends the record.
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

/// What an operator's [`FenceStore::confirm`] did.
#[derive(Debug, Clone)]
pub struct Confirmed {
    /// The store's identity from now on.
    pub identity: String,
    /// The identity it replaces (empty when it had none).
    pub previous: String,
    /// Marks this replica remembered and raised back into the store.
    pub restored: u64,
    /// How long every replica's fenced writes are held from the confirmation.
    pub held: Duration,
}

/// A place that keeps one monotonic mark per key.
///
/// Stores of one process implement the reads, `advance`, `list`, `delete`
/// and the counts; everything else has a default that fits them. A store
/// replicas share also takes each key's turn among the replicas in
/// [`enter`](Self::enter), records the write in flight ([`InFlight`]),
/// remembers what it saw ([`at_hand`](Self::at_hand)), and says when it
/// cannot be trusted ([`unready`](Self::unready), [`confirm`](Self::confirm)).
///
/// How the etcd store fits this trait as it is: docs/architecture.md
/// ("The etcd store, on the seam as it is").
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
    /// what [`peek`](Self::peek) has. A store replicas share answers the
    /// highest mark this replica saw, a floor of the mark.
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
    /// turn in this process (`ask`: shared with the writes carrying the
    /// mark, or alone). A store replicas share also takes the key's turn
    /// among them, waiting up to `wait` while their writes of the key are in
    /// flight, and records this write in flight ([`Entered::Accepted`]'s
    /// `in_flight`) for at most `lease`, should this process die before the
    /// record ends. A store of one process just advances.
    fn enter(
        &self,
        key: &str,
        token: u64,
        _ask: Ask,
        _lease: Duration,
        _wait: Duration,
    ) -> impl Future<Output = Result<Entered, StoreError>> + Send {
        async move { self.advance(key, token).await.map(Entered::local) }
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

    /// An operator's word that a store replicas share may be trusted as it
    /// is now, after it was not ([`Distrust`]): this replica's remembered
    /// marks are raised back into it first, and fenced writes are held
    /// while writes admitted before may still be in flight. `None`: the
    /// store keeps its fences in this process, and has nothing to confirm.
    fn confirm(&self) -> impl Future<Output = Result<Option<Confirmed>, StoreError>> + Send {
        async { Ok(None) }
    }

    /// The lease record of `key` (`fence/lease.rs` makes leases of it), held
    /// or run out, if it has one. Stores of one process keep records in a
    /// [`LocalLeases`]; a store replicas share keeps them beside the marks.
    fn lease(&self, _key: &str) -> impl Future<Output = Result<Option<LeaseRecord>, StoreError>> + Send {
        async { Err(no_leases()) }
    }

    /// Atomically puts `new` in place of `key`'s lease record (`None`:
    /// removes it) if the record is exactly `expected` now (`None`: it has
    /// none); says whether it did.
    fn swap_lease(
        &self,
        _key: &str,
        _expected: Option<&LeaseRecord>,
        _new: Option<&LeaseRecord>,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        async { Err(no_leases()) }
    }

    /// The longest lease the routes give a write now
    /// ([`longest_write_lease`]): how long a store that records writes in
    /// flight holds fenced writes after a [`confirm`](Self::confirm). Set at
    /// start and on every config reload.
    fn set_write_lease(&self, _longest: Duration) {}

    /// Why fenced writes are refused now, when they are: `/readyz?verbose`
    /// names it and `fencegate_store_writable` is 0 (reads are still served).
    fn unready(&self) -> Option<String> {
        self.stats()
            .filter(|s| s.is_failing())
            .map(|_| "the last fence store commit failed; fenced writes are refused until one succeeds".to_owned())
    }

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

    /// Call counters, for stores reached over the network (Redis, etcd).
    fn call_stats(&self) -> Option<&CallStats> {
        None
    }

    /// At shutdown, once no request is left: finishes the store's
    /// background work (raises on their way to disk, records of ended
    /// writes on their way out of a shared store), waiting a bounded time.
    fn close(&self) -> impl Future<Output = ()> + Send {
        async {}
    }
}

/// The refusal of a store that keeps no lease records (test stores).
fn no_leases() -> StoreError {
    StoreError::Failed { store: "this", context: "leases", message: "the store keeps no lease records".into() }
}
