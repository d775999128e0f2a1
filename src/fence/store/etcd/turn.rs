//! A key's turn across replicas in etcd: the decision read at one
//! revision, committed by one transaction that compares what it was made
//! on, made again when something moved; the wait a raise puts while writes
//! are in flight; and the records a transaction in flight may write.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
use tokio::time::Instant;

use super::names::{mark_value, Record};
use super::{lease, unchanged, unexpected, Inner, STORE};
use crate::fence::store::{Entered, Found, InFlight, StoreError};

/// A record a transaction in flight may write: ended if the transaction's
/// answer is lost or the future is dropped before it comes. etcd may still
/// apply such a transaction after the delete (a member that took it was
/// frozen, and resumes): the delete is made again [`AGAIN_AFTER`] later,
/// so a record written late does not stand for the replica's whole life.
struct Pending<'a>(Option<String>, &'a Arc<Inner>);

/// When an uncertain record is deleted again.
const AGAIN_AFTER: [Duration; 2] = [Duration::from_secs(10), Duration::from_secs(120)];

impl Pending<'_> {
    fn take(mut self) -> String {
        self.0.take().unwrap_or_default()
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        let Some(record) = self.0.take() else { return };
        self.1.end_record(record.clone());
        let inner = Arc::downgrade(self.1);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                for after in AGAIN_AFTER {
                    tokio::time::sleep(after).await;
                    let Some(inner) = inner.upgrade() else { return };
                    inner.end_record(record.clone());
                }
            });
        }
    }
}

/// What takes a key's turn in [`Inner::turn`].
#[derive(Debug, Clone, Copy)]
pub(super) enum Turn {
    /// A fenced write, recorded in flight under the replica's lease
    /// `lease_id` for at most `lease`; `alone`: it holds the key alone.
    Write { alone: bool, lease: Duration, lease_id: i64 },
    /// The fence API's raise: recorded nowhere, it waits until no share of
    /// the key takes writes of the old token.
    Raise,
}

impl Inner {
    /// The longest write lease of the routes now.
    pub(super) fn longest(&self) -> Duration {
        *self.longest.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `key`'s turn for `token` across replicas, waiting up to `wait` while
    /// other writes of the key are in flight: the decision read at one
    /// revision, then committed by one transaction that compares what it was
    /// made on, made again when something moved.
    pub(super) async fn turn(
        self: &Arc<Self>,
        key: &str,
        token: u64,
        turn: Turn,
        wait: Duration,
    ) -> Result<Entered, StoreError> {
        let deadline = Instant::now() + wait;
        let alone = !matches!(turn, Turn::Write { alone: false, .. });
        let (mark_key, wait_key) = (self.names.mark(key), self.names.wait(key));
        let mut pause = Duration::from_millis(1);
        let mut waiting = Waiting::default();
        let mut tries = 0u32;
        loop {
            tries += 1;
            let before = self.knowledge.before(key);
            let state = self.read(key, "reading a key's turn").await?;
            let mark = state.mark()?;
            self.observe(key, mark, before, state.deletions)?;
            if let Some(current) = mark.filter(|m| token < *m) {
                self.knowledge.remember(key, current, state.deletions);
                return Ok(Entered::Stale { current });
            }
            if let Some(held) = &state.held {
                let left = self.held_left(held).await?;
                return Err(StoreError::Held { store: STORE, left });
            }
            if matches!(turn, Turn::Raise) && mark == Some(token) {
                return Ok(Entered::Accepted { previous: mark, in_flight: InFlight::default() });
            }
            let waiting_token = state.wait()?;
            // A write below a waiting raise is refused; the fence API's raise
            // is not (the mark may go to it; the higher one still waits).
            if let Some(higher) = waiting_token.filter(|w| *w > token && !matches!(turn, Turn::Raise)) {
                return Ok(Entered::Superseded { waiting: higher });
            }
            let records = state.flights.iter().map(|kv| Record::parse(kv.value())).collect::<Option<Vec<_>>>();
            let records =
                records.ok_or_else(|| unexpected(Found::Verdict("a record of a write that is not one".into())))?;
            let joins =
                !alone && mark == Some(token) && records.iter().all(|r| !r.alone && !r.draining && r.token == token);
            // A write goes when no other is in flight (or it joins them). The
            // fence API's raise goes once no replica's share takes writes of
            // the old token any more: writes in flight may end after it, as
            // on Redis, and the new token's writes wait for them.
            let free = match turn {
                Turn::Raise => records.iter().all(|r| r.alone || r.draining),
                Turn::Write { .. } => records.is_empty(),
            };
            if free || joins {
                // A decision made again past the deadline (the key kept
                // moving) is a wait that ran out.
                if tries > 1 && Instant::now() >= deadline {
                    waiting.end(self, &wait_key, token).await;
                    return Ok(Entered::TimedOut);
                }
                let record = match turn {
                    Turn::Write { lease_id, .. } => Some((self.record_key(key), lease_id)),
                    Turn::Raise => None,
                };
                let mut then = Vec::new();
                if let Some((record, lease_id)) = &record {
                    let value = Record { token, alone, draining: false }.value();
                    then.push(TxnOp::put(record.as_str(), value, Some(PutOptions::new().with_lease(*lease_id))));
                }
                if mark != Some(token) {
                    then.push(TxnOp::put(mark_key.as_str(), mark_value(token), None));
                }
                if waiting_token.is_some_and(|w| w <= token) {
                    // Ours, or a lower or equal one: this raise decides them.
                    then.push(TxnOp::delete(wait_key.as_str(), None));
                }
                let txn = Txn::new()
                    .when([
                        unchanged(&mark_key, state.mark.as_ref()),
                        unchanged(&wait_key, state.wait.as_ref()),
                        unchanged(&self.names.held(), None),
                        // No write of the key recorded since the read (an
                        // empty range passes).
                        Compare::create_revision(self.names.flights(key), CompareOp::Less, state.revision + 1)
                            .with_prefix(),
                    ])
                    .and_then(then);
                // Whatever happens from here, the record (if the
                // transaction wrote it before its answer was lost) ends.
                let pending = Pending(record.as_ref().map(|(r, _)| r.clone()), self);
                let (entered, _, _) = self.txn("raising a mark and recording the write", txn).await?;
                if !entered {
                    // Something moved since the read (nothing was written):
                    // decide again.
                    let _ = pending.take();
                    continue;
                }
                if waiting_token.is_some_and(|w| w <= token) {
                    waiting.deleted();
                }
                self.knowledge.remember(key, token, state.deletions);
                let Turn::Write { lease, lease_id, .. } = turn else {
                    return Ok(Entered::Accepted { previous: mark, in_flight: InFlight::default() });
                };
                // The lease must still outlive the write, counted from now
                // (the commit may have taken its time): else the record
                // could go while the write runs.
                if !self.lease.covers(lease_id, lease) {
                    drop(pending);
                    return Err(self.lease_lapsed());
                }
                let record = pending.take();
                let in_flight = if alone {
                    self.ending.fetch_add(1, Ordering::AcqRel);
                    lease::recorded(&self.ended, record)
                } else {
                    self.share(key, token, record, lease_id)
                };
                return Ok(Entered::Accepted { previous: mark, in_flight });
            }
            let now = Instant::now();
            if now >= deadline {
                waiting.end(self, &wait_key, token).await;
                return Ok(Entered::TimedOut);
            }
            // Other writes are in flight: wait for them, the token under
            // `wait/` (on a lease of its own, as long as the wait) so writes
            // of the old mark that come meanwhile are refused, and every
            // replica's share of the key ends.
            if waiting_token.is_none_or(|w| w < token) {
                let lease_id = waiting.lease(self, deadline - now).await?;
                let txn = Txn::new().when([unchanged(&wait_key, state.wait.as_ref())]).and_then([TxnOp::put(
                    wait_key.as_str(),
                    mark_value(token),
                    Some(PutOptions::new().with_lease(lease_id)),
                )]);
                self.txn("waiting for a key's turn", txn).await?;
            }
            tokio::time::sleep(pause.min(deadline - now)).await;
            pause = (pause * 2).min(Duration::from_millis(20));
        }
    }
}

/// A wait's own lease, granted when the wait is first put: a wait left
/// behind (its request gone, an answer lost) ends with it.
#[derive(Debug, Default)]
struct Waiting {
    lease: Option<i64>,
}

impl Waiting {
    async fn lease(&mut self, inner: &Inner, left: Duration) -> Result<i64, StoreError> {
        if let Some(id) = self.lease {
            return Ok(id);
        }
        let ttl = left.as_secs() as i64 + 1 + i64::from(left.subsec_nanos() > 0);
        let granted =
            inner.call("granting a wait's etcd lease", |mut c| async move { c.lease_grant(ttl, None).await }).await?;
        self.lease = Some(granted.id());
        Ok(granted.id())
    }

    /// The raise deleted the wait.
    fn deleted(&mut self) {
        self.lease = None;
    }

    /// Ends the wait this turn put, if it did: its lease revoked, which
    /// deletes it.
    async fn end(&mut self, inner: &Inner, wait_key: &str, token: u64) {
        if let Some(id) = self.lease.take() {
            let revoked = inner.call("ending a wait", |mut c| async move { c.lease_revoke(id).await });
            if let Err(e) = revoked.await {
                tracing::debug!(error = %e, "ending a wait in etcd (it ends with its lease)");
                inner.stop_waiting(wait_key, token).await;
            }
        }
    }
}
