//! The holder's writes without a consensus round each: one record per key
//! and token, shared by this replica's writes.
//!
//! A write that shares its key (its token is the mark, and it does not hold
//! the key alone) and is entered through etcd leaves its record standing as
//! this replica's share of the key. While the share stands, this replica's
//! next writes of that key and token join it with no call to etcd: the
//! record, under the replica's lease, keeps every other write of the key
//! that would not join it waiting, on every replica, so the mark is still
//! their token. Each joining write still needs the lease to outlive it.
//!
//! A share ends (its record is deleted) when its last write has ended and
//! either a turn waits for the key or it has been idle [`LINGER`]: this
//! replica watches `wait/` in etcd, and a turn waiting for a key on any
//! replica (a raise, or a write that holds the key alone, at the share's
//! token or above) stops its share from taking writes, so writes of the old
//! token that come meanwhile go to etcd and are refused there (409) or wait
//! behind it, as on the other replicas. Until the watch is up, and whenever
//! it fails, no share takes writes. A share made while a turn waits is not
//! kept.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use etcd_client::{EventType, WatchOptions};
use tokio::time::Instant;

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};

use super::names::{parse_mark, Record};
use super::Inner;
use crate::fence::store::{InFlight, WriteRecord};

/// How long a share stands with no write before its record goes: the next
/// write of the holder within it needs no etcd call.
pub(super) const LINGER: Duration = Duration::from_secs(1);

/// This replica's share of one key.
#[derive(Debug)]
struct Share {
    token: u64,
    /// Its record in etcd, and the lease it lives under: the share takes
    /// writes only while that lease is the replica's current one, good for
    /// the write (a lease replaced is kept alive only as long as the writes
    /// entered under it may run).
    record: String,
    lease: i64,
    /// Takes no more writes (the store was distrusted): ends with its last.
    stopped: bool,
    /// Writes in flight under it.
    holders: usize,
    /// When its last write ended, if none is in flight.
    idle_since: Option<Instant>,
}

#[derive(Debug, Default)]
struct State {
    shares: HashMap<String, Share>,
    /// The token waiting to raise each key, as the watch last saw it.
    waiting: HashMap<String, u64>,
    /// Whether the watch of `wait/` is up: shares take writes only then.
    watching: bool,
}

/// This replica's shares.
#[derive(Debug, Default)]
pub(super) struct Shares(Mutex<State>);

impl Shares {
    fn state(&self) -> MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What a raise waiting for `key` does to its share: an idle share
    /// ends (its record goes); a busy one stops taking writes, and its
    /// record says so (`x`), for a raise through the fence API to see.
    fn end_for_raise(state: &mut State, key: &str) -> Option<Ended> {
        let share = state.shares.get_mut(key)?;
        if state.waiting.get(key).is_none_or(|w| *w < share.token) {
            return None;
        }
        if share.holders == 0 {
            return state.shares.remove(key).map(|s| Ended::Gone(s.record));
        }
        if share.stopped {
            return None;
        }
        share.stopped = true;
        Some(Ended::Draining { record: share.record.clone(), token: share.token, lease: share.lease })
    }

    /// Every share stops taking writes, and the idle ones end; the others
    /// end with their last write. `watch_down`: the watch failed (no share
    /// is made or joined until it is up again), else the store is not trusted.
    fn stop(state: &mut State, watch_down: bool) -> Vec<String> {
        if watch_down {
            state.watching = false;
            state.waiting.clear();
        }
        state.shares.values_mut().for_each(|share| share.stopped = true);
        let idle: Vec<String> = state.shares.iter().filter(|(_, s)| s.holders == 0).map(|(k, _)| k.clone()).collect();
        idle.into_iter().filter_map(|key| state.shares.remove(&key)).map(|s| s.record).collect()
    }
}

/// What becomes of a share's record when a raise waits for its key.
#[derive(Debug)]
enum Ended {
    /// Deleted: the share had no write.
    Gone(String),
    /// Marked as taking no more writes.
    Draining { record: String, token: u64, lease: i64 },
}

/// One write under a share: its end may end the share.
struct Holder {
    inner: Weak<Inner>,
    key: String,
}

impl std::fmt::Debug for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Holder").field("key", &self.key).finish()
    }
}

impl WriteRecord for Holder {
    fn end(self: Box<Self>) {
        let Some(inner) = self.inner.upgrade() else { return };
        let ended = {
            let mut state = inner.shares.state();
            let watching = state.watching;
            let Some(share) = state.shares.get_mut(&self.key) else { return };
            share.holders -= 1;
            if share.holders > 0 {
                return;
            }
            share.idle_since = Some(Instant::now());
            if watching && !share.stopped {
                // An idle share stands for LINGER, unless a raise waits.
                match Shares::end_for_raise(&mut state, &self.key) {
                    Some(Ended::Gone(record)) => Some(record),
                    _ => None,
                }
            } else {
                state.shares.remove(&self.key).map(|s| s.record)
            }
        };
        if let Some(record) = ended {
            inner.end_record(record);
        }
    }
}

impl Inner {
    /// A write of `key` with `token` joining this replica's share, if it has
    /// one for that token that takes writes, and the lease outlives `lease`.
    pub(super) fn join_share(self: &Arc<Self>, key: &str, token: u64, lease: Duration) -> Option<InFlight> {
        let mut state = self.shares.state();
        if !state.watching || state.waiting.get(key).is_some_and(|w| *w >= token) {
            return None;
        }
        let share = state.shares.get_mut(key).filter(|s| s.token == token && !s.stopped)?;
        if self.lease.good_for(lease)? != share.lease {
            return None;
        }
        share.holders += 1;
        share.idle_since = None;
        Some(InFlight::recorded(Holder { inner: Arc::downgrade(self), key: key.to_owned() }))
    }

    /// This replica's idle share of `key` below `token`, taken for the turn
    /// of `token` that ends it: no write joins it from now on, and the
    /// turn's transaction deletes its record or writes its own record there
    /// (the record is queued for deletion if the turn does not commit). A
    /// raise of the holder's key through this replica needs no wait for
    /// its own share.
    pub(super) fn claim_share(&self, key: &str, token: u64) -> Option<String> {
        let mut state = self.shares.state();
        let share = state.shares.get(key)?;
        if share.holders > 0 || share.stopped || share.token >= token {
            return None;
        }
        state.shares.remove(key).map(|s| s.record)
    }

    /// The write of `key` with `token` just entered through etcd with
    /// `record`: it becomes this replica's share of the key when it has
    /// none, the watch is up, and no higher token waits; else it stands alone.
    pub(super) fn share(self: &Arc<Self>, key: &str, token: u64, record: String, lease: i64) -> InFlight {
        {
            let mut state = self.shares.state();
            let free =
                state.watching && !state.shares.contains_key(key) && state.waiting.get(key).is_none_or(|w| *w < token);
            if free {
                let share = Share { token, record, lease, stopped: false, holders: 1, idle_since: None };
                state.shares.insert(key.to_owned(), share);
                return InFlight::recorded(Holder { inner: Arc::downgrade(self), key: key.to_owned() });
            }
        }
        self.ending.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        super::lease::recorded(&self.ended, record)
    }

    /// Queues `record` to be deleted.
    pub(super) fn end_record(&self, record: String) {
        self.ending.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        let _ = self.ended.send(record);
    }

    /// Every share stops taking writes (the store is not trusted, or
    /// `watch_down`: the watch of waits failed).
    pub(super) fn stop_shares(&self, watch_down: bool) {
        let ended = Shares::stop(&mut self.shares.state(), watch_down);
        ended.into_iter().for_each(|record| self.end_record(record));
    }

    /// Ends the shares idle for [`LINGER`].
    fn sweep_shares(&self) {
        let now = Instant::now();
        let ended: Vec<String> = {
            let mut state = self.shares.state();
            let idle: Vec<String> = state
                .shares
                .iter()
                .filter(|(_, s)| s.idle_since.is_some_and(|t| now.duration_since(t) >= LINGER))
                .map(|(k, _)| k.clone())
                .collect();
            idle.into_iter().filter_map(|key| state.shares.remove(&key)).map(|s| s.record).collect()
        };
        ended.into_iter().for_each(|record| self.end_record(record));
    }

    /// Notes the waits etcd has, or a change of them: a raise that waits
    /// stops the share of its key, which ends once its writes have ended.
    fn note_waits(self: &Arc<Self>, waits: impl IntoIterator<Item = (String, Option<u64>)>, up: bool) {
        let mut ended = Vec::new();
        {
            let mut state = self.shares.state();
            for (key, token) in waits {
                match token {
                    Some(token) => {
                        state.waiting.insert(key.clone(), token);
                        ended.extend(Shares::end_for_raise(&mut state, &key));
                    }
                    None => {
                        state.waiting.remove(&key);
                    }
                }
            }
            state.watching |= up;
        }
        for ended in ended {
            match ended {
                Ended::Gone(record) => self.end_record(record),
                Ended::Draining { record, token, lease } => self.mark_draining(record, token, lease),
            }
        }
    }

    /// Rewrites a stopped share's record as draining (`x`), if it still
    /// stands: a raise through the fence API waits for that.
    fn mark_draining(self: &Arc<Self>, record: String, token: u64, lease: i64) {
        let inner = Arc::downgrade(self);
        tokio::spawn(async move {
            let Some(store) = inner.upgrade() else { return };
            let value = Record { token, alone: false, draining: true }.value();
            let txn = Txn::new()
                .when([Compare::version(record.as_str(), CompareOp::Greater, 0)])
                .and_then([TxnOp::put(record.as_str(), value, Some(PutOptions::new().with_lease(lease)))]);
            let marked = store.call("marking a share as taking no more writes", |mut c| {
                let txn = txn.clone();
                async move { c.txn(txn).await }
            });
            if let Err(e) = marked.await {
                tracing::debug!(error = %e, "marking a share as draining in etcd (a raise waits for its writes)");
            }
        });
    }
}

/// Watches `wait/` until the watch fails: each raise that waits stops the
/// share of its key. Holds the store only while it notes what it saw.
async fn watch_waits(inner: &Weak<Inner>) -> Result<(), String> {
    let (mut client, prefix) = {
        let store = inner.upgrade().ok_or("the store is gone")?;
        (store.client().await.map_err(|e| e.to_string())?, store.names.waits())
    };
    let key_of = |key: &[u8]| String::from_utf8_lossy(key.get(prefix.len()..).unwrap_or_default()).into_owned();
    // The waits there now, then every change after them: the watch starts
    // at the revision after the read's, so no wait put in between is missed.
    let options = etcd_client::GetOptions::new().with_prefix();
    let now = client.get(prefix.as_bytes(), Some(options)).await.map_err(|e| e.to_string())?;
    let after = now.header().map_or(0, |h| h.revision()) + 1;
    let options = WatchOptions::new().with_prefix().with_start_revision(after);
    let mut stream = client.watch(prefix.as_bytes(), Some(options)).await;
    let stream = stream.as_mut().map_err(|e| e.to_string())?;
    let waits: Vec<_> = now.kvs().iter().map(|kv| (key_of(kv.key()), parse_mark(kv.value()))).collect();
    inner.upgrade().ok_or("the store is gone")?.note_waits(waits.into_iter().filter(|(_, t)| t.is_some()), true);
    while let Some(answer) = stream.message().await.map_err(|e| e.to_string())? {
        if answer.canceled() {
            return Err("the watch was canceled".into());
        }
        let changes: Vec<_> = answer
            .events()
            .iter()
            .filter_map(|event| {
                let kv = event.kv()?;
                Some(match event.event_type() {
                    EventType::Put => (key_of(kv.key()), Some(parse_mark(kv.value())?)),
                    EventType::Delete => (key_of(kv.key()), None),
                })
            })
            .collect();
        inner.upgrade().ok_or("the store is gone")?.note_waits(changes, false);
    }
    Err("the watch ended".into())
}

/// Keeps the watch of `wait/` up, and ends idle shares, while the store lives.
pub(super) async fn keep_shares(inner: Weak<Inner>) {
    let mut pause = Duration::from_millis(100);
    loop {
        let sweep = async {
            loop {
                tokio::time::sleep(LINGER / 2).await;
                let Some(store) = inner.upgrade() else { return };
                store.sweep_shares();
            }
        };
        let watched = tokio::select! {
            watched = watch_waits(&inner) => watched,
            () = sweep => return,
        };
        let Some(store) = inner.upgrade() else { return };
        if let Err(e) = watched {
            tracing::debug!(error = %e, "watching the etcd store's waits; the holder's writes go to etcd meanwhile");
        }
        store.stop_shares(true);
        drop(store);
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(2));
    }
}
