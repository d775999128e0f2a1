//! The replica's etcd lease, under which its records of writes in flight
//! (and its waits) live, and the end of those records.
//!
//! One lease per replica, kept alive every [`KEEP_ALIVE_EVERY`], with a TTL
//! of the longest lease a write of its routes gets, rounded up to whole
//! seconds, plus [`LEASE_MARGIN`]: a replica killed with -9 leaves records
//! that go when its lease ends, and not before. A write is entered only
//! while the lease is known to outlive it (`valid_for`): the replica
//! counts the lease as good until a TTL after the last keep-alive it *sent*
//! that etcd answered, which is never later than etcd's own count. A
//! replica cut off from etcd for longer refuses fenced writes (503) before
//! its records could go while its writes still run.
//!
//! A config reload that lengthens the longest lease gets a new lease at the
//! next write; the old one is kept alive as long as the writes entered
//! under it may run.

use std::sync::{Mutex, PoisonError, Weak};
use std::time::Duration;

use etcd_client::{Txn, TxnOp};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::{Inner, STORE};
use crate::fence::store::{InFlight, StoreError, WriteRecord};

/// How often the lease is kept alive.
pub(super) const KEEP_ALIVE_EVERY: Duration = Duration::from_millis(500);
/// Added to the longest write lease for the lease's TTL: keep-alives come
/// every [`KEEP_ALIVE_EVERY`], so a write entered just before one is still
/// covered.
pub(super) const LEASE_MARGIN: Duration = Duration::from_secs(1);

/// A lease granted to this replica.
#[derive(Debug, Clone, Copy)]
struct Granted {
    id: i64,
    ttl: Duration,
    /// Good at least until then, as far as this replica knows.
    until: Instant,
}

#[derive(Debug, Default)]
struct State {
    current: Option<Granted>,
    /// Leases replaced by a longer one, kept alive until the writes entered
    /// under them have ended.
    retiring: Vec<(Granted, Instant)>,
    /// The TTL the routes ask for now.
    wanted: Duration,
}

/// The replica's lease.
#[derive(Debug, Default)]
pub(super) struct Lease {
    state: Mutex<State>,
    /// One grant at a time.
    granting: tokio::sync::Mutex<()>,
}

/// The TTL that covers writes whose lease is at most `longest`.
pub(super) fn ttl_for(longest: Duration) -> Duration {
    let whole = Duration::from_secs(longest.as_secs() + u64::from(longest.subsec_nanos() > 0));
    whole + LEASE_MARGIN
}

impl Lease {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The routes' longest write lease now.
    pub fn configure(&self, longest: Duration) {
        self.state().wanted = ttl_for(longest);
    }

    /// The id of the lease a write whose lease is `lease` may be recorded
    /// under, if one is good long enough now.
    pub(super) fn good_for(&self, lease: Duration) -> Option<i64> {
        let state = self.state();
        let current = state.current?;
        let fits = current.ttl >= state.wanted && current.ttl >= lease + LEASE_MARGIN / 2;
        (fits && current.until >= Instant::now() + lease).then_some(current.id)
    }

    /// Whether lease `id` (the current one, or one retiring) is good for a
    /// write of `lease` from now.
    pub(super) fn covers(&self, id: i64, lease: Duration) -> bool {
        let state = self.state();
        let deadline = Instant::now() + lease;
        state.current.iter().chain(state.retiring.iter().map(|(g, _)| g)).any(|g| g.id == id && g.until >= deadline)
    }

    /// Every lease to keep alive now, and forgets retired ones whose writes
    /// have ended.
    fn alive(&self) -> Vec<i64> {
        let mut state = self.state();
        let now = Instant::now();
        state.retiring.retain(|(_, until)| *until > now);
        state.current.iter().chain(state.retiring.iter().map(|(g, _)| g)).map(|g| g.id).collect()
    }

    /// etcd answered a keep-alive of `id` sent at `sent` with `ttl` left
    /// (0: the lease is gone).
    fn kept(&self, id: i64, sent: Instant, ttl: i64) {
        let mut state = self.state();
        let State { current, retiring, .. } = &mut *state;
        for granted in current.iter_mut().chain(retiring.iter_mut().map(|(g, _)| g)) {
            if granted.id == id {
                granted.until = if ttl > 0 { sent + Duration::from_secs(ttl as u64) } else { sent };
            }
        }
        if ttl <= 0 && current.is_some_and(|g| g.id == id) {
            *current = None;
        }
    }

    /// Forgets the current lease once it may have ended (not kept alive
    /// in time, or gone: a store replaced): the next write is granted a new
    /// one. The writes entered under it have ended: each was entered only
    /// while the lease outlived it.
    fn forget_lapsed(&self) {
        let mut state = self.state();
        if state.current.is_some_and(|g| g.until < Instant::now()) {
            state.current = None;
        }
    }

    /// Forgets every lease (the next write is granted a new one), and
    /// returns their ids.
    pub(super) fn forget_all(&self) -> Vec<i64> {
        let mut state = self.state();
        let ids = state.current.iter().chain(state.retiring.iter().map(|(g, _)| g)).map(|g| g.id).collect();
        state.current = None;
        state.retiring.clear();
        ids
    }

    /// The ids of every lease this replica holds, for its close.
    pub fn all(&self) -> Vec<i64> {
        self.alive()
    }
}

impl Inner {
    /// The lease a write whose lease is `lease` is recorded under: the
    /// replica's, granted (or granted anew, longer) if need be.
    pub(super) async fn lease_for(&self, lease: Duration) -> Result<i64, StoreError> {
        if let Some(id) = self.lease.good_for(lease) {
            return Ok(id);
        }
        let _one = self.lease.granting.lock().await;
        if let Some(id) = self.lease.good_for(lease) {
            return Ok(id);
        }
        // None yet, too short for the routes now, or not kept alive (a new
        // one is then the surest way to know etcd's count).
        let ttl = self.lease.state().wanted.max(ttl_for(lease));
        let sent = Instant::now();
        let seconds = ttl.as_secs() as i64;
        let granted = self
            .call("granting this replica's etcd lease", |mut c| async move { c.lease_grant(seconds, None).await })
            .await?;
        let granted = Granted { id: granted.id(), ttl, until: sent + Duration::from_secs(granted.ttl().max(0) as u64) };
        {
            let mut state = self.lease.state();
            if let Some(old) = state.current.replace(granted) {
                // Its writes run at most its TTL from now.
                let until = Instant::now() + old.ttl;
                state.retiring.push((old, until));
            }
        }
        tracing::debug!(lease = granted.id, ttl = ?ttl, "granted this replica's etcd lease");
        self.lease.good_for(lease).ok_or_else(|| self.lease_lapsed())
    }

    /// etcd answered that lease `id` is gone: before it could have ended
    /// (as far as this replica counts), the store lost it, and the records
    /// of writes in flight under it: the store is not trusted.
    fn lease_gone(&self, id: i64, sent: Instant) {
        if self.lease.covers(id, Duration::ZERO) {
            self.distrust_lease(id);
        }
        self.lease.kept(id, sent, 0);
    }

    pub(super) fn lease_lapsed(&self) -> StoreError {
        StoreError::Failed {
            store: STORE,
            context: "recording the write in flight",
            message: "this replica's etcd lease does not cover the write's lease; try again".into(),
        }
    }

    /// One round of keep-alives.
    async fn keep_alive(&self) {
        for id in self.lease.alive() {
            let sent = Instant::now();
            let kept = self.call("keeping this replica's etcd lease alive", |mut c| async move {
                let (mut keeper, mut stream) = c.lease_keep_alive(id).await?;
                keeper.keep_alive().await?;
                stream.message().await
            });
            match kept.await {
                Ok(Some(answer)) if answer.ttl() <= 0 => self.lease_gone(id, sent),
                Ok(Some(answer)) => self.lease.kept(id, sent, answer.ttl()),
                Ok(None) => {}
                // etcd does not know it: a store replaced, or the lease ended.
                Err(e) if e.to_string().contains("lease not found") => self.lease_gone(id, sent),
                Err(e) => tracing::debug!(error = %e, lease = id, "keeping this replica's etcd lease alive"),
            }
        }
        self.lease.forget_lapsed();
    }
}

/// Keeps the replica's leases alive while the store lives.
pub(super) async fn keep_alive(inner: Weak<Inner>) {
    loop {
        tokio::time::sleep(KEEP_ALIVE_EVERY).await;
        let Some(inner) = inner.upgrade() else { return };
        inner.keep_alive().await;
    }
}

/// A write's record in etcd: deleted when the write ends, by the task that
/// ends records (dropping never waits for etcd).
pub(super) struct Flight {
    pub ended: mpsc::UnboundedSender<String>,
    pub key: String,
}

impl std::fmt::Debug for Flight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Flight").field("key", &self.key).finish()
    }
}

impl WriteRecord for Flight {
    fn end(self: Box<Self>) {
        let _ = self.ended.send(self.key);
    }
}

/// A record of a write in flight, ended when dropped.
pub(super) fn recorded(ended: &mpsc::UnboundedSender<String>, key: String) -> InFlight {
    InFlight::recorded(Flight { ended: ended.clone(), key })
}

/// Most records one transaction deletes (etcd's default `--max-txn-ops`
/// is 128).
const END_BATCH: usize = 128;

/// Deletes the records of writes that ended, those queued together in one
/// transaction, retrying until etcd takes them (or the replica's lease ends
/// and takes them with it).
pub(super) async fn end_records(inner: Weak<Inner>, mut ended: mpsc::UnboundedReceiver<String>) {
    let mut batch = Vec::with_capacity(END_BATCH);
    while ended.recv_many(&mut batch, END_BATCH).await > 0 {
        let mut pause = Duration::from_millis(10);
        loop {
            let Some(store) = inner.upgrade() else { return };
            let deletes: Vec<TxnOp> = batch.iter().map(|key| TxnOp::delete(key.as_bytes(), None)).collect();
            let txn = Txn::new().and_then(deletes);
            let deleted = store.call("ending writes' records", |mut c| {
                let txn = txn.clone();
                async move { c.txn(txn).await }
            });
            match deleted.await {
                Ok(_) => {
                    store.ending.fetch_sub(batch.len(), std::sync::atomic::Ordering::AcqRel);
                    batch.clear();
                    break;
                }
                Err(e) => {
                    tracing::debug!(error = %e, records = batch.len(), "ending writes' records in etcd; trying again");
                    drop(store);
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(1));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ttl_covers_the_longest_lease_in_whole_seconds_and_the_margin() {
        assert_eq!(ttl_for(Duration::from_millis(4500)), Duration::from_secs(6));
        assert_eq!(ttl_for(Duration::from_secs(4)), Duration::from_secs(5));
        assert_eq!(ttl_for(Duration::ZERO), Duration::from_secs(1));
    }

    #[test]
    fn a_lease_covers_a_write_only_while_it_outlives_it() {
        let lease = Lease::default();
        lease.configure(Duration::from_secs(4));
        assert_eq!(lease.good_for(Duration::from_secs(1)), None, "no lease granted yet");
        let now = Instant::now();
        lease.state().current =
            Some(Granted { id: 7, ttl: Duration::from_secs(5), until: now + Duration::from_secs(5) });
        assert_eq!(lease.good_for(Duration::from_secs(4)), Some(7));
        // Not kept alive: it covers less and less.
        lease.state().current.as_mut().unwrap().until = now + Duration::from_secs(2);
        assert_eq!(lease.good_for(Duration::from_secs(4)), None);
        assert_eq!(lease.good_for(Duration::from_secs(1)), Some(7));
        // A reload asks for more than its TTL: a new one is needed.
        lease.configure(Duration::from_secs(10));
        assert_eq!(lease.good_for(Duration::from_secs(1)), None);
    }

    #[test]
    fn a_keep_alive_answered_zero_forgets_the_lease() {
        let lease = Lease::default();
        let now = Instant::now();
        lease.state().current = Some(Granted { id: 7, ttl: Duration::from_secs(5), until: now });
        lease.kept(7, now, 5);
        assert!(lease.state().current.unwrap().until >= now + Duration::from_secs(5));
        lease.kept(7, now, 0);
        assert!(lease.state().current.is_none());
    }
}
